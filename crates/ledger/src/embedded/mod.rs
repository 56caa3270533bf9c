//! The embedded ledger: the claims of this process, crash-safe in `--state-dir`.
//!
//! Writes go to one writer thread that takes every request waiting and commits them together
//! (group commit): under load, many admissions share one `fdatasync`, and no answer is sent
//! before the commit that holds its claim has returned.
//!
//! How a batch forms (`Inbox`): a request that finds the inbox empty opens a batch and yields
//! to the async runtime once before it seals it; every request that arrives meanwhile — every
//! admission task the runtime had ready to run, and all that come while the writer is busy
//! committing — joins the same batch. The writer wakes only for a sealed batch (one wake-up
//! per commit, not per request). Batching so depends neither on the writer's timing against
//! the request tasks nor on an extra task per request: with admissions that cost more CPU than
//! a commit (a debug build, a slow core) the requests the runtime had ready still share one
//! commit, and a lone request waits for one `yield_now` only.
//!
//! The store (`journal.rs`) is an append-only journal of checksummed records
//! (`journal.<generation>`; the format is in `super::record`), one `write` and one
//! `fdatasync` per batch, the claims held in memory (measured against the redb B-tree it
//! replaced: docs/performance.md, "The journal instead of redb"). The records go into zeros
//! the journal wrote and synced ahead of them, so a commit never grows the file and its
//! `fdatasync` has no size to record. The writer makes that room between batches, after one
//! has its answers and once less than 256 KiB is left, one 64 KiB step at a time (no batch
//! waits for it, and none waits behind more than one step). When the journals outgrow twice
//! the live records a background thread writes a `snapshot.<generation>` of every claim (temp
//! file synced every 2 MiB, rename, directory fsync) and deletes the journals it covers, each
//! shrunk a step at a time first (`journal/snapshot.rs`: neither stalls the writer's commits).
//! On open (`load.rs`, the one reading path of `serve` and every command): the newest
//! snapshot, then the journals after it; zeros after the last record are room; a torn record
//! at the end of a journal, after the records its acknowledgement mark names (a crash
//! mid-write, never answered), is cut off by a writer and skipped by a reader; records lost
//! before the mark, a stretch that is no valid record with valid records after it, a damaged
//! header, a snapshot that is not whole, a journal, snapshot or network's books gone: each
//! refuses to start, changing nothing (`ledger repair`, `repair`). A full disk refuses the
//! commits that do not fit in the room made and resumes by itself (`journal/room.rs`); a dir
//! that lost its journal refuses to start empty (`marker.rs`).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;

use async_trait::async_trait;
use tokio::sync::oneshot;

use super::{Claim, CreateOutcome, HexId, Ledger, LedgerError};

mod counters;
#[cfg(test)]
mod damage_table;
mod journal;
mod load;
mod marker;
pub mod repair;
mod writer;

pub use counters::{CommitCounters, StageLabels};
pub use writer::writer_batch_policy;

use counters::Stage;
use journal::Journal;
use writer::{Answer, Inbox, Msg, Records, Reply, Request, SLOW, Seal, apply, writer_loop};

const LOCK_FILE: &str = "ledger.lock";
const JOURNAL: &str = "journal.";
const SNAPSHOT: &str = "snapshot.";

/// The file `prefix<generation>` (`journal.`, `snapshot.`), the generation zero-padded so that
/// names sort as generations do.
pub(super) fn name(prefix: &str, generation: u64) -> String {
    format!("{prefix}{generation:020}")
}

/// The generations of the files named `prefix<generation>` in `dir` (others, such as a
/// `.tmp` file or a repair's `.damaged-` copy, are not the ledger's).
pub(super) fn generations(dir: &Path, prefix: &str) -> Result<Vec<u64>, LedgerError> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(storage_at("list the state dir", dir))? {
        let entry = entry.map_err(storage_at("list the state dir", dir))?;
        let file_name = entry.file_name();
        let generation = file_name
            .to_str()
            .and_then(|name| name.strip_prefix(prefix))
            .and_then(|generation| generation.parse::<u64>().ok());
        found.extend(generation);
    }
    found.sort_unstable();
    Ok(found)
}

/// Take the state dir's lock file (`flock`, released when the process ends), or say that
/// `busy` (who may hold it) when another process has it.
fn lock_state_dir(dir: &Path, busy: &str) -> Result<std::fs::File, LedgerError> {
    let lock_path = dir.join(LOCK_FILE);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(storage_at("open the lock file", &lock_path))?;
    lock.try_lock().map_err(|e| {
        LedgerError::Storage(format!("cannot lock {} ({busy}): {e}", lock_path.display()))
    })?;
    Ok(lock)
}

pub struct EmbeddedLedger {
    counters: CommitCounters,
    inbox: Arc<Inbox>,
    writer: Mutex<Option<thread::JoinHandle<()>>>,
}

fn storage<E: std::fmt::Display>(context: &str) -> impl FnOnce(E) -> LedgerError + '_ {
    move |e| LedgerError::Storage(format!("{context}: {e}"))
}

/// `cannot WHAT PATH: CAUSE`: a file system call that failed, naming the file (a permission
/// error without its path says nothing about which file to fix).
fn storage_at<'a, E: std::fmt::Display>(
    what: &'a str,
    path: &'a Path,
) -> impl FnOnce(E) -> LedgerError + 'a {
    move |e| LedgerError::Storage(format!("cannot {what} {}: {e}", path.display()))
}

impl EmbeddedLedger {
    /// Open (or create) the ledger in `state_dir`. Fails with a clear message when another
    /// process has it open, and refuses what every reading command refuses (`load.rs`).
    pub fn open(state_dir: &Path, counters: CommitCounters) -> Result<EmbeddedLedger, LedgerError> {
        std::fs::create_dir_all(state_dir).map_err(|e| {
            LedgerError::Storage(format!(
                "cannot create state dir {}: {e}",
                state_dir.display()
            ))
        })?;
        let mut journal = Journal::open(state_dir)?;
        journal.disk_full = counters.disk_full.clone();
        let backend = Box::new(journal);
        let inbox = Arc::new(Inbox::new());
        let writer_inbox = inbox.clone();
        let writer_counters = counters.clone();
        let writer = thread::Builder::new()
            .name("ledger-writer".into())
            .spawn(move || {
                if let Err(error) = writer_batch_policy() {
                    tracing::debug!(%error, "the ledger writer keeps the default scheduling policy");
                }
                writer_loop(backend, &writer_inbox, writer_counters)
            })
            .map_err(storage("spawn writer"))?;
        Ok(EmbeddedLedger {
            counters,
            inbox,
            writer: Mutex::new(Some(writer)),
        })
    }

    /// Queue `msg` for the writer; returns when it was queued. The request that opens a batch
    /// yields to the runtime once before sealing it, so that the admissions the runtime has
    /// ready reach their ledger call and join this batch (see the module docs).
    async fn send(&self, msg: Msg) -> Result<Instant, LedgerError> {
        let (opened, queued) = self.inbox.push(msg)?;
        if opened {
            let seal = Seal(&self.inbox);
            tokio::task::yield_now().await;
            drop(seal);
        }
        Ok(queued)
    }

    /// Send `request` (for admission request `uid`) and wait for its answer.
    async fn ask<T>(
        &self,
        uid: &HexId,
        request: impl FnOnce(Answer<T>) -> Request,
    ) -> Result<T, LedgerError> {
        let (tx, rx) = oneshot::channel();
        let asked = self.send(Msg::Op(request(tx))).await?;
        let (result, times) = rx
            .await
            .map_err(|_| LedgerError::Storage("ledger commit aborted".into()))?;
        let woken = Instant::now();
        self.counters.stage(
            Stage::Wakeup,
            woken.duration_since(times.answered).as_secs_f64(),
        );
        if woken.duration_since(asked) >= SLOW {
            let us =
                |from: Instant, to: Instant| to.saturating_duration_since(from).as_micros() as u64;
            tracing::warn!(
                request_uid = %uid,
                total_us = us(asked, woken),
                queue_us = us(asked, times.taken),
                commit_us = us(times.taken, times.answered),
                wakeup_us = us(times.answered, woken),
                "slow ledger answer"
            );
        }
        result
    }
}

/// Every claim of the ledger in `state_dir`, read as `serve` reads it on open ([`load::survey`],
/// refusing the same damage with the same message) and without creating or changing anything,
/// also while a server writes it. A file a compaction removed between listing and reading, or
/// a journal it closed meanwhile, is read again (twice, a short while apart: a read that
/// overlapped a large write can also see a later page of it before an earlier one).
pub(crate) fn read_claims(state_dir: &Path) -> Result<Vec<Claim>, LedgerError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut claims: std::collections::HashMap<std::net::IpAddr, Claim> = Default::default();
        let read = load::survey(state_dir, |claim, _| {
            claims.insert(claim.ip, claim);
        })
        .and_then(load::Survey::refusal);
        match read {
            Ok(_) => return Ok(claims.into_values().collect()),
            Err(LedgerError::Storage(why)) if attempt < 3 && why.contains("No such file") => {
                tracing::debug!(%why, "a file went away while reading; reading again");
            }
            Err(LedgerError::Missing(_) | LedgerError::Damaged(_)) if attempt < 3 => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(error) => return Err(error),
        }
    }
}

/// Whether `state_dir` holds an embedded ledger (journal, snapshot), or held one whose files
/// are gone (then `read_claims` says what is missing).
pub fn exists_in(state_dir: &Path) -> bool {
    generations(state_dir, SNAPSHOT).is_ok_and(|g| !g.is_empty())
        || generations(state_dir, JOURNAL).is_ok_and(|g| !g.is_empty())
        || !marker::signs(state_dir).is_empty()
}

/// Record in the marker of the primary `state_dir` that it keeps the books of a secondary
/// network (`networks/BOOK`), once they exist and before any of their claims is answered:
/// from then on those books gone are refused like a journal gone.
pub(crate) fn register_books(state_dir: &Path, book: &str) -> Result<(), LedgerError> {
    let mut kept = marker::read(state_dir)?.unwrap_or_else(marker::Marker::new);
    if kept.books.iter().any(|b| b == book) {
        return Ok(());
    }
    kept.books.push(book.to_string());
    kept.books.sort();
    marker::write(state_dir, &kept)
}

#[async_trait]
impl Ledger for EmbeddedLedger {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    async fn load(&self) -> Result<Vec<Claim>, LedgerError> {
        let shared = self.load_shared().await?;
        Ok(shared.into_iter().map(Arc::unwrap_or_clone).collect())
    }

    async fn load_shared(&self) -> Result<Vec<Arc<Claim>>, LedgerError> {
        let (tx, rx) = oneshot::channel();
        self.send(Msg::Load(tx)).await?;
        rx.await
            .map_err(|_| LedgerError::Storage("ledger load aborted".into()))?
    }

    async fn create(&self, claim: Arc<Claim>) -> Result<CreateOutcome, LedgerError> {
        // a second handle on the claim names its request in a slow answer's warning: no copy
        // of the UID per grant
        let named = claim.clone();
        self.ask(&named.request_uid, |tx| Request::Create(claim, tx))
            .await
    }

    async fn release(&self, claim: &Claim) -> Result<bool, LedgerError> {
        self.ask(&claim.request_uid, |tx| {
            Request::Release(Box::new(claim.clone()), tx)
        })
        .await
    }

    async fn transition(&self, current: &Claim, next: &Claim) -> Result<bool, LedgerError> {
        self.ask(&next.request_uid, |tx| {
            Request::Transition(Box::new((current.clone(), next.clone())), tx)
        })
        .await
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        let (tx, rx) = oneshot::channel();
        self.send(Msg::Ping(tx)).await?;
        rx.await
            .map_err(|_| LedgerError::Storage("ledger ping aborted".into()))?
    }

    async fn close(&self) {
        // The writer commits what it holds, then ends.
        self.inbox.close();
        let handle = self.writer.lock().ok().and_then(|mut w| w.take());
        if let Some(handle) = handle {
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
    }
}
impl Drop for EmbeddedLedger {
    fn drop(&mut self) {
        // without close(): the writer still commits what it holds and ends (not waited for)
        self.inbox.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Phase;
    use crate::record::{JOURNAL_START, encode_record, new_journal, parse_file};

    use std::fs::OpenOptions;
    use std::os::unix::fs::FileExt;
    use std::path::PathBuf;

    /// Fields of `/proc/thread-self/stat` by their number in proc(5).
    #[cfg(target_os = "linux")]
    fn own_stat(field: usize) -> i64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        after_name
            .split(' ')
            .nth(field - 3)
            .unwrap()
            .parse()
            .unwrap()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_writer_runs_as_sched_batch_at_niceness_zero() {
        const NICE: usize = 19;
        const POLICY: usize = 41;
        const SCHED_BATCH: i64 = 3;
        let before = std::thread::spawn(|| (own_stat(NICE), own_stat(POLICY)))
            .join()
            .unwrap();
        assert_eq!(before, (0, 0), "tests run as SCHED_OTHER at niceness 0");
        let after = std::thread::spawn(|| {
            writer_batch_policy().unwrap();
            (own_stat(NICE), own_stat(POLICY))
        })
        .join()
        .unwrap();
        assert_eq!(after, (0, SCHED_BATCH));
    }

    #[test]
    fn a_stage_observation_lands_in_its_labelled_series() {
        let counters = CommitCounters::default();
        counters.stage(Stage::Wakeup, 0.5);
        counters.stage(Stage::Wakeup, 0.25);
        counters.stage(Stage::Commit, 0.5);
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("stage", "test", counters.stage_seconds.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for (stage, count) in [("queue", 0), ("commit", 1), ("wakeup", 2)] {
            let line = format!("stage_count{{stage=\"{stage}\"}} {count}");
            assert!(text.contains(&line), "no {line:?} in\n{text}");
        }
    }

    /// A reservation of app `web` for pod `default/{pod}`, by request `uid-{pod}`.
    fn web_claim(ip: &str, pod: &str) -> Claim {
        crate::test_claims::builder(ip, "web", pod)
            .request(&format!("uid-{pod}"))
            .build()
    }

    #[tokio::test]
    async fn claims_survive_reopen_and_conflicts_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let counters = CommitCounters::default();
        let ledger = EmbeddedLedger::open(dir.path(), counters.clone()).unwrap();
        assert_eq!(
            ledger
                .create(web_claim("10.0.0.1", "a").into())
                .await
                .unwrap(),
            CreateOutcome::Created
        );
        match ledger
            .create(web_claim("10.0.0.1", "b").into())
            .await
            .unwrap()
        {
            CreateOutcome::AlreadyHeld(holder) => assert_eq!(holder.pod.name, "a"),
            other => panic!("expected AlreadyHeld, got {other:?}"),
        }
        // release only by the holder
        assert!(!ledger.release(&web_claim("10.0.0.1", "b")).await.unwrap());
        assert!(ledger.release(&web_claim("10.0.0.1", "a")).await.unwrap());
        assert_eq!(
            ledger
                .create(web_claim("10.0.0.1", "b").into())
                .await
                .unwrap(),
            CreateOutcome::Created
        );
        ledger.close().await;
        drop(ledger);

        let reopened = EmbeddedLedger::open(dir.path(), CommitCounters::default()).unwrap();
        let claims = reopened.load().await.unwrap();
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0].pod.name, "b");
        assert!(claims[0].is_held());
        assert_eq!(
            counters.commits.get(),
            3,
            "one commit per sequential write; refusals commit nothing"
        );
    }

    /// After a restart the allocator holds every claim for the life of the process: it must
    /// hold the journal's own copies, not a second set of every claim.
    #[tokio::test]
    async fn a_shared_load_hands_out_the_copies_the_journal_keeps() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = EmbeddedLedger::open(dir.path(), CommitCounters::default()).unwrap();
        for (ip, pod) in [("10.0.0.1", "a"), ("10.0.0.2", "b")] {
            ledger.create(web_claim(ip, pod).into()).await.unwrap();
        }
        ledger.close().await;
        let reopened: Arc<dyn Ledger> = crate::timed::TimedLedger::wrap(
            Arc::new(EmbeddedLedger::open(dir.path(), CommitCounters::default()).unwrap()),
            prometheus_client::metrics::family::Family::new_with_constructor(|| {
                prometheus_client::metrics::histogram::Histogram::new(counters::seconds_buckets())
            }),
        );
        let first = reopened.load_shared().await.unwrap();
        let again = reopened.load_shared().await.unwrap();
        assert_eq!(first.len(), 2);
        for (one, other) in first.iter().zip(&again) {
            assert!(Arc::ptr_eq(one, other), "{} was copied", one.ip);
        }
        let owned = reopened.load().await.unwrap();
        assert_eq!(
            owned,
            first.iter().map(|c| (**c).clone()).collect::<Vec<_>>()
        );
    }

    #[tokio::test]
    async fn concurrent_creates_share_commits() {
        let dir = tempfile::tempdir().unwrap();
        let counters = CommitCounters::default();
        let ledger =
            std::sync::Arc::new(EmbeddedLedger::open(dir.path(), counters.clone()).unwrap());
        let mut tasks = Vec::new();
        for i in 0..400u32 {
            let ledger = ledger.clone();
            tasks.push(tokio::spawn(async move {
                let ip = format!("10.1.{}.{}", i / 250, i % 250);
                ledger
                    .create(web_claim(&ip, &format!("p{i}")).into())
                    .await
                    .unwrap()
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), CreateOutcome::Created);
        }
        assert_eq!(counters.writes.get(), 400);
        assert!(
            counters.commits.get() < 400,
            "400 concurrent creates took {} commits",
            counters.commits.get()
        );
    }

    /// A batch is not whatever has reached the writer when it wakes: admissions that cost
    /// more CPU than a commit (a debug build, a slow core) would each find the writer idle and
    /// get a commit of their own. The request that opens a batch yields once before sealing
    /// it, so every admission the runtime has ready joins it, each still busy for longer than
    /// a commit takes, with no task per request.
    #[tokio::test(flavor = "current_thread")]
    async fn admissions_slower_than_a_commit_still_share_one() {
        let dir = tempfile::tempdir().unwrap();
        let counters = CommitCounters::default();
        let ledger = Arc::new(EmbeddedLedger::open(dir.path(), counters.clone()).unwrap());
        let mut tasks = Vec::new();
        for i in 0..20u32 {
            let ledger = ledger.clone();
            tasks.push(tokio::spawn(async move {
                // the admission's own work, holding the runtime's only thread
                std::thread::sleep(std::time::Duration::from_millis(3));
                let ip = format!("10.9.0.{i}");
                ledger
                    .create(web_claim(&ip, &format!("p{i}")).into())
                    .await
                    .unwrap()
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), CreateOutcome::Created);
        }
        assert_eq!(counters.writes.get(), 20);
        assert_eq!(
            counters.commits.get(),
            1,
            "20 admissions the runtime had ready took {} commits",
            counters.commits.get()
        );
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("batch", "requests per batch", counters.batch_size.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("batch_sum 20.0\n"), "{text}");
        assert!(text.contains("batch_count 1\n"), "{text}");
    }

    /// A request dropped after it opened a batch (its admission gave up) still seals it: the
    /// requests that joined it are committed, and its own write, already queued, lands.
    #[tokio::test(flavor = "current_thread")]
    async fn a_request_dropped_after_opening_a_batch_still_seals_it() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = EmbeddedLedger::open(dir.path(), CommitCounters::default()).unwrap();
        let first = web_claim("10.9.1.1", "a");
        let mut opened = Box::pin(ledger.create(first.clone().into()));
        assert!(
            futures::poll!(opened.as_mut()).is_pending(),
            "it yields once"
        );
        drop(opened);
        let joined = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            ledger.create(web_claim("10.9.1.2", "b").into()),
        )
        .await
        .expect("a request that joined the dropped one's batch is answered");
        assert_eq!(joined.unwrap(), CreateOutcome::Created);
        let mut held: Vec<_> = ledger.load().await.unwrap();
        held.sort_by_key(|c| c.ip);
        assert_eq!(held.len(), 2, "{held:?}");
        assert_eq!(held[0].pod.name, "a");
    }

    /// A reader beside a writer that compacts again and again (new journals, their seals,
    /// snapshots written and the files below them shrunk and removed) is never refused and
    /// always sees every claim created before its read began.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reader_beside_compactions_is_never_refused_and_misses_nothing() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let ledger = Arc::new(EmbeddedLedger::open(dir.path(), CommitCounters::default()).unwrap());
        let created = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let reader = {
            let (dir, created, stop) = (dir.path().to_path_buf(), created.clone(), stop.clone());
            let done = done.clone();
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(Ordering::Relaxed) {
                    let before = created.load(Ordering::SeqCst);
                    let claims = read_claims(&dir).unwrap_or_else(|e| panic!("read {reads}: {e}"));
                    let seen = claims
                        .iter()
                        .filter(|c| c.ip.to_string().starts_with("10.14."))
                        .count();
                    assert!(
                        seen >= before,
                        "read {reads}: {seen} claims, {before} created before"
                    );
                    reads += 1;
                    done.store(reads, Ordering::Relaxed);
                }
                reads
            })
        };
        let mut held: Vec<Claim> = Vec::new();
        for i in 0..40u32 {
            let claim = Claim {
                phase: Phase::Bound,
                ..web_claim(&format!("10.14.0.{i}"), &format!("p{i}"))
            };
            ledger.create(claim.clone().into()).await.unwrap();
            created.fetch_add(1, Ordering::SeqCst);
            held.push(claim);
        }
        // until four snapshots were written and the reader read 20 times meanwhile, however
        // long each takes
        let snapshot = |dir: &Path| generations(dir, SNAPSHOT).unwrap().last().copied();
        let mut round = 0u64;
        while snapshot(dir.path()).is_none_or(|generation| generation < 5)
            || done.load(Ordering::Relaxed) < 20
        {
            round += 1;
            assert!(
                round < 2000,
                "{round} rounds and {:?}: no compaction",
                snapshot(dir.path())
            );
            let steps = held.iter().map(|current| {
                let next = Claim {
                    phase: match current.phase {
                        Phase::Bound => Phase::Terminating,
                        _ => Phase::Bound,
                    },
                    updated_at: current.updated_at + 1,
                    ..current.clone()
                };
                let ledger = ledger.clone();
                let current = current.clone();
                tokio::spawn(async move {
                    assert!(
                        ledger.transition(&current, &next).await.unwrap(),
                        "round {round}"
                    );
                    next
                })
            });
            held = futures::future::join_all(steps)
                .await
                .into_iter()
                .map(|step| step.unwrap())
                .collect();
        }
        stop.store(true, Ordering::Relaxed);
        let reads = reader.join().unwrap();
        ledger.close().await;
        assert!(reads >= 20, "{reads} reads");
    }

    #[tokio::test]
    async fn a_reader_sees_the_commits_of_an_open_writer_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = EmbeddedLedger::open(dir.path(), CommitCounters::default()).unwrap();
        assert!(read_claims(dir.path()).unwrap().is_empty());
        ledger
            .create(web_claim("10.0.0.1", "a").into())
            .await
            .unwrap();
        let seen = read_claims(dir.path()).unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].pod.name, "a");
        ledger
            .create(web_claim("10.0.0.2", "b").into())
            .await
            .unwrap();
        assert_eq!(read_claims(dir.path()).unwrap().len(), 2);
        ledger.close().await;

        let missing = dir.path().join("nothing-here");
        let err = read_claims(&missing).unwrap_err().to_string();
        assert!(err.contains("nothing-here"), "{err}");
        assert!(!missing.exists(), "a read created {}", missing.display());
    }

    /// `serve` removes the temp files of the ledger's writes a crash interrupted; a reader
    /// leaves them, and nobody removes another file's temp file.
    #[tokio::test]
    async fn serve_removes_the_ledgers_unfinished_temp_files_only() {
        let dir = tempfile::tempdir().unwrap();
        recorded(dir.path(), &[web_claim("10.15.0.1", "a")]).await;
        let ours = ["snapshot.00000000000000000002.tmp", "ledger.id.tmp"];
        for name in ours.iter().chain(&["ca.key.tmp"]) {
            std::fs::write(dir.path().join(name), b"half").unwrap();
        }
        assert_eq!(read_claims(dir.path()).unwrap().len(), 1);
        assert!(ours.iter().all(|name| dir.path().join(name).exists()));
        let ledger = EmbeddedLedger::open(dir.path(), CommitCounters::default()).unwrap();
        assert!(ours.iter().all(|name| !dir.path().join(name).exists()));
        assert!(dir.path().join("ca.key.tmp").exists());
        ledger.close().await;
    }

    #[tokio::test]
    async fn second_open_of_same_dir_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let _first = EmbeddedLedger::open(dir.path(), CommitCounters::default()).unwrap();
        let err = EmbeddedLedger::open(dir.path(), CommitCounters::default())
            .err()
            .unwrap();
        assert!(err.to_string().contains("another ip-webhook"), "{err}");
    }

    /// Claims and a release survive a reopen.
    #[tokio::test]
    async fn claims_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = EmbeddedLedger::open(dir.path(), CommitCounters::default()).unwrap();
        for i in 0..20u32 {
            let ip = format!("10.2.0.{i}");
            assert_eq!(
                ledger
                    .create(web_claim(&ip, &format!("p{i}")).into())
                    .await
                    .unwrap(),
                CreateOutcome::Created
            );
        }
        assert!(ledger.release(&web_claim("10.2.0.3", "p3")).await.unwrap());
        ledger.close().await;
        drop(ledger);
        let reopened = EmbeddedLedger::open(dir.path(), CommitCounters::default()).unwrap();
        let claims = reopened.load().await.unwrap();
        assert_eq!(claims.len(), 20);
        let released: Vec<_> = claims.iter().filter(|c| !c.is_held()).collect();
        assert_eq!(released.len(), 1);
        assert_eq!(released[0].pod.name, "p3");
    }

    /// The open of `dir` refused as damage (`why` it must be): the error and the damage.
    fn damage_refusing(dir: &Path, why: &str) -> (LedgerError, crate::Damage) {
        let err = EmbeddedLedger::open(dir, CommitCounters::default())
            .err()
            .unwrap_or_else(|| panic!("opened: {why}"));
        match &err {
            LedgerError::Damaged(damage) => {
                let damage = (**damage).clone();
                (err, damage)
            }
            _ => panic!("{why}: {err}"),
        }
    }

    fn journal_path(dir: &Path) -> PathBuf {
        let generation = *generations(dir, JOURNAL).unwrap().last().unwrap();
        dir.join(name(JOURNAL, generation))
    }

    /// Open the ledger in `dir`, create `claims` in order and close it: the path of its last
    /// journal.
    async fn recorded(dir: &Path, claims: &[Claim]) -> PathBuf {
        let ledger = EmbeddedLedger::open(dir, CommitCounters::default()).unwrap();
        for claim in claims {
            ledger.create(claim.clone().into()).await.unwrap();
        }
        ledger.close().await;
        drop(ledger);
        journal_path(dir)
    }

    /// A crash in the middle of a write leaves a torn record at the end of the journal: it is
    /// cut off on open, every whole record before it is kept, and the journal takes new writes.
    #[tokio::test]
    async fn a_torn_tail_is_cut_and_whole_records_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = recorded(
            dir.path(),
            &[web_claim("10.3.0.1", "a"), web_claim("10.3.0.2", "b")],
        )
        .await;
        let whole = parse_file(&path).unwrap().scan.good;
        let mut record = Vec::new();
        encode_record(&mut record, &web_claim("10.3.0.3", "c")).unwrap();
        // where the writer puts its next record: into the zeros made room for
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&record[..record.len() - 5], whole)
            .unwrap();
        drop(file);

        let ledger = EmbeddedLedger::open(dir.path(), CommitCounters::default()).unwrap();
        // cut: only zeros follow the whole records (the writer may already have made room)
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() as u64 >= whole);
        assert!(
            bytes[whole as usize..].iter().all(|b| *b == 0),
            "torn bytes cut"
        );
        let mut names: Vec<_> = ledger
            .load()
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.pod.name)
            .collect();
        names.sort();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(
            ledger
                .create(web_claim("10.3.0.3", "c").into())
                .await
                .unwrap(),
            CreateOutcome::Created
        );
        ledger.close().await;
        drop(ledger);
        let ledger = EmbeddedLedger::open(dir.path(), CommitCounters::default()).unwrap();
        assert_eq!(ledger.load().await.unwrap().len(), 3);
    }

    /// The journal grows by synced zeros ahead of its records; a reopen writes after its last
    /// record, not after the zeros, and a growth past one step keeps every record.
    #[tokio::test]
    async fn the_journal_makes_room_ahead_and_reopens_at_its_last_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = recorded(dir.path(), &[web_claim("10.5.0.1", "a")]).await;
        let first = parse_file(&path).unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(
            len,
            (JOURNAL_START + journal::ROOM_LOW).next_multiple_of(journal::GROW_STEP),
            "room made ahead of the first record"
        );
        assert!(first.scan.good < len && !first.scan.torn);

        recorded(dir.path(), &[web_claim("10.5.0.2", "b")]).await;
        let second = parse_file(&path).unwrap();
        assert_eq!(
            second.claims.len(),
            2,
            "the second record follows the first"
        );
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len);

        // more records than one step of room holds
        let per_record = second.scan.good - first.scan.good;
        let more = journal::ROOM_LOW / per_record + 5;
        let claims: Vec<Claim> = (0..more)
            .map(|i| {
                web_claim(
                    &format!("10.6.{}.{}", i / 250, i % 250 + 1),
                    &format!("p{i}"),
                )
            })
            .collect();
        recorded(dir.path(), &claims).await;
        let paths: Vec<_> = generations(dir.path(), JOURNAL).unwrap();
        assert_eq!(paths.len(), 1, "no compaction in between: {paths:?}");
        let grown = parse_file(&path).unwrap();
        assert!(!grown.scan.torn);
        assert_eq!(grown.claims.len() as u64, 2 + more);
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(len % journal::GROW_STEP, 0, "room grows in whole steps");
        assert!(
            (grown.scan.good + journal::ROOM_LOW
                ..grown.scan.good + journal::ROOM_LOW + journal::GROW_STEP)
                .contains(&len),
            "room made ahead of the next commit: {len} bytes for records up to {}",
            grown.scan.good
        );
        let ledger = EmbeddedLedger::open(dir.path(), CommitCounters::default()).unwrap();
        assert_eq!(ledger.load().await.unwrap().len() as u64, 2 + more);
    }

    fn many(prefix: &str, n: u32) -> Vec<Claim> {
        (0..n)
            .map(|i| {
                web_claim(
                    &format!("{prefix}.{}.{}", i / 250, i % 250 + 1),
                    &format!("p{i}"),
                )
            })
            .collect()
    }

    /// A flipped byte, or a zeroed page, with valid records after it is damage, not a torn
    /// write: the ledger refuses to open (and a reader to read), naming the file, the offset
    /// and the records after it, and changes nothing on disk.
    #[tokio::test]
    async fn damage_with_valid_records_after_it_refuses_and_changes_nothing() {
        for (claims, page) in [(40, false), (200, true)] {
            let dir = tempfile::tempdir().unwrap();
            let path = recorded(dir.path(), &many("10.11", claims)).await;
            let mut bytes = std::fs::read(&path).unwrap();
            let good = parse_file(&path).unwrap().scan.good as usize;
            let at = if page {
                bytes[4096..8192].fill(0);
                4096
            } else {
                let start = JOURNAL_START as usize;
                let at = start + (good - start) * 3 / 10;
                bytes[at] ^= 0x40;
                at
            };
            assert!(good > 8192 || !page, "the page is inside the records");
            std::fs::write(&path, &bytes).unwrap();
            let listing = |dir: &Path| {
                let mut names: Vec<_> = std::fs::read_dir(dir)
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .collect();
                names.sort();
                names
            };
            let before = listing(dir.path());
            let (err, damage) = damage_refusing(dir.path(), "damage refuses to open");
            assert_eq!(damage.path, path);
            assert!(
                (at.saturating_sub(200) as u64..=at as u64).contains(&damage.offset),
                "damage at {at}, reported at {}",
                damage.offset
            );
            let crate::Found::Stretch {
                records_after: after,
                ..
            } = damage.found
            else {
                panic!("{err}")
            };
            assert!(
                after > 0 && after < claims as usize,
                "{after} records after"
            );
            let message = err.to_string();
            for part in [
                path.display().to_string(),
                format!("byte {}", damage.offset),
                format!("{after} valid record(s) follow"),
                "ledger repair".to_string(),
            ] {
                assert!(message.contains(&part), "{part:?} not in {message}");
            }
            assert_eq!(std::fs::read(&path).unwrap(), bytes, "the file was changed");
            assert_eq!(listing(dir.path()), before, "files were added or removed");
            let read = read_claims(dir.path()).unwrap_err();
            assert_eq!(read.to_string(), message);

            // the dry run changes nothing; --apply keeps the original and every valid record
            let plan = repair::repair(dir.path(), false).unwrap();
            assert_eq!(plan.files.len(), 1);
            assert_eq!(plan.files[0].kept_after, after);
            assert_eq!(std::fs::read(&path).unwrap(), bytes);
            let done = repair::repair(dir.path(), true).unwrap();
            let kept_as = done.files[0].kept_as.clone().unwrap();
            assert_eq!(std::fs::read(&kept_as).unwrap(), bytes, "original kept");
            assert!(done.to_string().contains(&kept_as.display().to_string()));
            let kept = done.files[0].kept_before + done.files[0].kept_after;
            let reopened = EmbeddedLedger::open(dir.path(), CommitCounters::default()).unwrap();
            assert_eq!(reopened.load().await.unwrap().len(), kept);
            // a page holds at most 4096 / (smallest record) records, and two cut at its edges
            let smallest = parse_file(&kept_as).unwrap().claims[0].1 as usize - 2;
            let most_lost = if page { 4096 / smallest + 2 } else { 1 };
            assert!(kept + most_lost >= claims as usize, "{kept} kept");
        }
    }

    /// The marker: written when the ledger is created (and on the first open of an older
    /// dir); a dir with it and no journal or snapshot refuses to start, naming what is gone.
    #[tokio::test]
    async fn a_state_dir_that_lost_its_journal_refuses_to_start_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = recorded(dir.path(), &[web_claim("10.12.0.1", "a")]).await;
        assert!(dir.path().join(marker::MARKER).is_file());
        std::fs::remove_file(&path).unwrap();
        let err = EmbeddedLedger::open(dir.path(), CommitCounters::default())
            .err()
            .expect("a lost journal refuses to open");
        let message = err.to_string();
        assert!(matches!(err, LedgerError::Missing(_)), "{message}");
        for part in [&dir.path().display().to_string(), "ledger.id", "journal.*"] {
            assert!(message.contains(part), "{part:?} not in {message}");
        }
        assert_eq!(read_claims(dir.path()).unwrap_err().to_string(), message);
        assert!(generations(dir.path(), JOURNAL).unwrap().is_empty());

        // a dir whose marker is gone (a crash between the first journal and the marker): it
        // gets one
        let unmarked = tempfile::tempdir().unwrap();
        recorded(unmarked.path(), &[web_claim("10.12.0.2", "b")]).await;
        std::fs::remove_file(unmarked.path().join(marker::MARKER)).unwrap();
        let ledger = EmbeddedLedger::open(unmarked.path(), CommitCounters::default()).unwrap();
        assert_eq!(ledger.load().await.unwrap().len(), 1);
        assert!(unmarked.path().join(marker::MARKER).is_file());
        ledger.close().await;

        // emptied, or cut inside its header, with the marker there: no crash leaves that (the
        // marker follows the journal's synced header), so it is refused, naming the file
        for len in [0, 4, 700] {
            let dir = tempfile::tempdir().unwrap();
            let path = recorded(dir.path(), &[web_claim("10.12.0.3", "c")]).await;
            let journal = std::fs::File::options().write(true).open(&path);
            journal.and_then(|file| file.set_len(len)).unwrap();
            let (err, damage) = damage_refusing(dir.path(), "an emptied journal refuses to open");
            assert_eq!(
                (damage.path.as_path(), damage.offset),
                (path.as_path(), len)
            );
            assert!(
                err.to_string().contains("inside the 1536-byte header"),
                "{err}"
            );
            assert_eq!(
                read_claims(dir.path()).unwrap_err().to_string(),
                err.to_string()
            );
            assert_eq!(std::fs::metadata(&path).unwrap().len(), len, "changed");
        }

        // the lock alone is no sign: a crash between taking it and the first journal
        let locked = tempfile::tempdir().unwrap();
        std::fs::write(locked.path().join(LOCK_FILE), b"").unwrap();
        let ledger = EmbeddedLedger::open(locked.path(), CommitCounters::default()).unwrap();
        assert!(ledger.load().await.unwrap().is_empty());
    }

    /// A full disk: commits go on in the room made, one that does not fit is refused at once
    /// with the state dir named, a ping says so, and once space returns the retry (backoff)
    /// grows the room with no reopen; nothing answered is lost.
    #[test]
    fn a_full_disk_refuses_only_what_does_not_fit_and_resumes_when_space_returns() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path()).unwrap();
        let space = JOURNAL_START + journal::ROOM_LOW + journal::GROW_STEP;
        journal.space = Some(space);
        journal.grow_ahead();
        let commit = |journal: &mut Journal, i: u32| {
            let (tx, _rx) = oneshot::channel();
            let ip = format!("10.13.{}.{}", i / 250, i % 250 + 1);
            let mut batch = vec![Request::Create(Arc::new(web_claim(&ip, "p")), tx)];
            journal.commit(&mut batch, &mut Vec::new())
        };
        let mut acknowledged = 0;
        let refusal = loop {
            match commit(&mut journal, acknowledged) {
                Ok(_) => acknowledged += 1,
                Err(error) => break error,
            }
            journal.grow_ahead();
            assert!(acknowledged < 1000);
        };
        assert_eq!(journal.disk_full.get(), 1);
        assert!(
            acknowledged as u64 > (space - journal::ROOM_LOW) / 100,
            "commits stopped with room left: {acknowledged}"
        );
        let message = refusal.to_string();
        assert!(matches!(refusal, LedgerError::DiskFull { .. }), "{message}");
        assert!(
            message.contains("disk is full") && message.contains(&dir.path().display().to_string()),
            "{message}"
        );
        let started = Instant::now();
        assert!(commit(&mut journal, acknowledged).is_err());
        assert!(started.elapsed() < std::time::Duration::from_millis(50));
        assert!(matches!(journal.ping(), Err(LedgerError::DiskFull { .. })));

        journal.space = None;
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while journal.ping().is_err() {
            assert!(Instant::now() < deadline, "no recovery");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(journal.disk_full.get(), 0);
        commit(&mut journal, acknowledged).unwrap();
        drop(journal);
        let path = journal_path(dir.path());
        assert_eq!(
            parse_file(&path).unwrap().claims.len(),
            acknowledged as usize + 1
        );
    }

    /// A commit writes into room made before it: it never grows the file (its `fdatasync` then
    /// has no size to record, and no batch waits for zeros). The writer grows the room after a
    /// batch has its answers, once less than `ROOM_LOW` is left, by one step: the writer
    /// never pauses for more than one step's write and sync between two batches.
    #[test]
    fn commits_write_into_room_made_ahead_and_never_grow_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path()).unwrap();
        let path = journal_path(dir.path());
        let len = || std::fs::metadata(&path).unwrap().len();
        journal.grow_ahead();
        assert_eq!(
            len(),
            (JOURNAL_START + journal::ROOM_LOW).next_multiple_of(journal::GROW_STEP),
            "room before the first commit"
        );
        let (mut grown, mut commits) = (0, 0);
        while grown < 3 {
            let i = commits;
            assert!(i < 1000, "the room was made {grown} times in {i} commits");
            let before = len();
            let (tx, _rx) = oneshot::channel();
            let ip = format!("10.8.{}.{}", i / 250, i % 250 + 1);
            let mut batch = vec![Request::Create(Arc::new(web_claim(&ip, "p")), tx)];
            let mut replies = Vec::new();
            assert_eq!(journal.commit(&mut batch, &mut replies).unwrap(), 1);
            assert_eq!(len(), before, "commit {i} grew the journal");
            let good = parse_file(&path).unwrap().scan.good;
            journal.grow_ahead();
            let after = len();
            if after != before {
                grown += 1;
                assert!(before - good < journal::ROOM_LOW, "grew with room to spare");
                assert_eq!(
                    after - before,
                    journal::GROW_STEP,
                    "a growth after a batch smaller than a step is one step"
                );
            }
            assert_eq!(after % journal::GROW_STEP, 0);
            assert!(
                after - good >= journal::ROOM_LOW,
                "room left after commit {i}"
            );
            commits += 1;
        }
        drop(journal);
        let reopened = parse_file(&path).unwrap();
        assert!(!reopened.scan.torn);
        assert_eq!(reopened.claims.len(), commits);
    }

    /// A bad record with whole records after it, in a journal that is not the last one, is
    /// not a torn write: the ledger refuses to start rather than lose answered claims.
    #[tokio::test]
    async fn a_bad_record_before_the_last_journal_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = recorded(dir.path(), &[web_claim("10.4.0.1", "a")]).await;
        let mut bytes = std::fs::read(&path).unwrap();
        let last = parse_file(&path).unwrap().scan.good as usize - 3;
        bytes[last] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        // a later journal makes this one not the last
        std::fs::write(dir.path().join(name(JOURNAL, 2)), new_journal(2)).unwrap();
        let (err, damage) = damage_refusing(dir.path(), "corruption refuses to open");
        // its acknowledgement mark names the record, which no crash takes back
        assert!(matches!(damage.found, crate::Found::Lost { .. }), "{err}");
        assert_eq!(
            (damage.path.as_path(), damage.offset),
            (path.as_path(), JOURNAL_START)
        );
    }

    /// A journal gone from between the snapshot (or the first journal) and the last one, or
    /// the snapshot the journals follow, is records lost: the ledger refuses to open (and to be
    /// read) rather than hand out their IPs again, naming the file.
    #[tokio::test]
    async fn a_journal_or_snapshot_gone_from_the_middle_refuses_to_open() {
        let refusal = |dir: &Path| {
            let err = EmbeddedLedger::open(dir, CommitCounters::default())
                .err()
                .expect("refuses to open");
            assert!(matches!(err, LedgerError::Missing(_)), "{err}");
            assert_eq!(read_claims(dir).unwrap_err().to_string(), err.to_string());
            err.to_string()
        };
        let gap = tempfile::tempdir().unwrap();
        recorded(gap.path(), &[web_claim("10.13.0.1", "a")]).await;
        std::fs::write(gap.path().join(name(JOURNAL, 3)), new_journal(3)).unwrap();
        let message = refusal(gap.path());
        let second = gap.path().join(name(JOURNAL, 2));
        assert!(
            message.contains(&format!("{} is gone", second.display()))
                && message.contains(&format!(
                    "`ip-webhook ledger repair --state-dir {} --apply` writes it again empty",
                    gap.path().display()
                )),
            "{message}"
        );
        // Written again empty on purpose, it opens with every record the other journals hold.
        let done = repair::repair(gap.path(), true).unwrap();
        assert_eq!(done.mends, [repair::Mend::Journal(second.clone())]);
        assert_eq!(parse_file(&second).unwrap().scan.records, 0);
        let ledger = EmbeddedLedger::open(gap.path(), CommitCounters::default()).unwrap();
        assert_eq!(ledger.load().await.unwrap().len(), 1);
        ledger.close().await;

        let lost = tempfile::tempdir().unwrap();
        let first = recorded(lost.path(), &[web_claim("10.13.0.2", "b")]).await;
        std::fs::rename(&first, lost.path().join(name(JOURNAL, 5))).unwrap();
        let message = refusal(lost.path());
        assert!(
            message.contains(&format!(
                "its journals start at {} and {}, the snapshot they follow, is gone",
                name(JOURNAL, 5),
                lost.path().join(name(SNAPSHOT, 5)).display()
            )),
            "{message}"
        );
    }

    /// Compaction writes a snapshot, deletes the journals it covers, and a reopen reads the
    /// snapshot plus the journal after it.
    #[tokio::test]
    async fn compaction_keeps_every_claim_and_drops_old_journals() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = EmbeddedLedger::open(dir.path(), CommitCounters::default()).unwrap();
        // rewrite 40 IPs until the journal passes the compaction threshold
        // each round writes 80 records of ~300 bytes, past twice the 40 live ones
        let mut round = 0u32;
        let rounds = 6u32;
        while round < rounds {
            for i in 0..40u32 {
                let ip = format!("10.5.0.{i}");
                let held = web_claim(&ip, &format!("p{i}-{round}"));
                assert_eq!(
                    ledger.create(held.clone().into()).await.unwrap(),
                    CreateOutcome::Created
                );
                assert!(ledger.release(&held).await.unwrap());
            }
            round += 1;
        }
        ledger
            .create(web_claim("10.5.1.1", "last").into())
            .await
            .unwrap();
        ledger.close().await;
        drop(ledger);
        let snapshots = generations(dir.path(), SNAPSHOT).unwrap();
        let journals = generations(dir.path(), JOURNAL).unwrap();
        assert_eq!(snapshots.len(), 1, "one snapshot left: {snapshots:?}");
        assert!(
            journals.iter().all(|g| *g >= snapshots[0]),
            "journals before the snapshot deleted: {journals:?} {snapshots:?}"
        );
        let reopened = EmbeddedLedger::open(dir.path(), CommitCounters::default()).unwrap();
        let claims = reopened.load().await.unwrap();
        assert_eq!(claims.len(), 41);
        let last_round = format!("-{}", rounds - 1);
        assert!(
            claims.iter().filter(|c| c.pod.name != "last").all(|c| c
                .pod
                .name
                .ends_with(&last_round)
                && !c.is_held()),
            "every IP shows its last write"
        );
        assert!(claims.iter().any(|c| c.pod.name == "last" && c.is_held()));
        reopened.close().await;
        drop(reopened);

        // The journal after the snapshot is gone: its records (10.5.1.1's claim) would be lost.
        let base = *generations(dir.path(), SNAPSHOT).unwrap().last().unwrap();
        let after = dir.path().join(name(JOURNAL, base));
        std::fs::remove_file(&after).unwrap();
        let err = EmbeddedLedger::open(dir.path(), CommitCounters::default())
            .err()
            .expect("refuses to open");
        assert!(
            err.to_string().contains(&format!(
                "{} is there, but {}, which holds the records written after it, is gone",
                name(SNAPSHOT, base),
                after.display()
            )),
            "{err}"
        );
    }
}
