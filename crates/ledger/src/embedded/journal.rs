//! The journal store: an append-only journal of checksummed records per generation, snapshots,
//! and the compaction that turns journals into a snapshot (module docs of [`super`]).

use std::collections::HashMap;
use std::fs::File;
use std::net::IpAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

mod room;
mod snapshot;
mod tail;

use room::Stalled;
pub(super) use snapshot::sync_dir;
use snapshot::{remove_before, write_snapshot};

use super::{Records, Reply, Request, apply, load};
use crate::ip_map::IpMap;
use crate::record::{JOURNAL_START, Mark, encode_record, record_size};
use crate::{Claim, LedgerError};

/// Compaction starts when the journals since the last snapshot exceed twice the live records
/// and at least this many bytes.
#[cfg(not(test))]
const COMPACT_MIN_BYTES: u64 = 8 << 20;
#[cfg(test)]
const COMPACT_MIN_BYTES: u64 = 16 << 10;

/// A journal grows by this many zero bytes at a time, written and synced before any record
/// goes there. A commit then overwrites bytes the file already has: its `fdatasync` writes the
/// data and flushes the disk, and the file system's own journal has no new size or extent to
/// commit (PostgreSQL pre-zeroes its WAL segments for the same reason): about a quarter less
/// CPU per commit on the benchmark's disk (docs/performance.md).
///
/// One step is one write and one `fdatasync`, made by the writer between two batches: the
/// next batch waits for it, so a step costs about one small commit. A step much larger (1 MiB:
/// 16 writes and a sync of the whole MiB) would be one long pause of the writer every ~9,000
/// claims, holding every admission that waits for the next batch; in 64 KiB steps the same
/// zeros are made one step after each of a few batches.
#[cfg(not(test))]
pub(super) const GROW_STEP: u64 = 64 << 10;
#[cfg(test)]
pub(super) const GROW_STEP: u64 = 1 << 10;

/// When less room than this is left after a commit, the writer grows the journal, by whole
/// [`GROW_STEP`]s, until at least this much is left, once the batch has its answers
/// ([`Journal::grow_ahead`]), so that no commit waits for the zeros and their `fdatasync` (a
/// batch that found the room full would pay the zeros and a second sync). A batch uses much
/// less than a step, so each growth is one step.
#[cfg(not(test))]
pub(super) const ROOM_LOW: u64 = 256 << 10;
#[cfg(test)]
pub(super) const ROOM_LOW: u64 = 4 << 10;

/// The zeros a journal grows by, written this many at a time. A static (read-only, never
/// touched) source: a fresh zeroed buffer per growth made the writer fault in and clear a
/// 2 MiB huge page each time. Writing in pieces gives the core back between them (the kernel
/// preempts no syscall on a `PREEMPT_NONE` kernel, and a 1 MiB write took milliseconds).
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

pub(super) struct Journal {
    dir: PathBuf,
    /// A B-tree, like the allocator's maps: no all-at-once rehash on the writer thread. The
    /// claims alone, not their record sizes: a replaced claim's size is found again by encoding
    /// it ([`record_size`]), so an entry is the claim's 8-byte pointer, not 16 bytes with its
    /// size (docs/performance.md, "The journal's map without record sizes").
    claims: IpMap<Arc<Claim>>,
    /// Sum of the record sizes of `claims`: what a snapshot of them takes, against which the
    /// journals' growth is weighed ([`Journal::maybe_compact`]). A record this encoder did not
    /// write (a length in more LEB128 bytes than it needs, which the decoder accepts) encodes
    /// again shorter: replacing its claim leaves the sum high by the difference until the next
    /// open, which can only delay a compaction.
    live_bytes: u64,
    /// Where [`record_size`] encodes a replaced claim.
    sizing: Vec<u8>,
    file: File,
    /// Where the next record of `file` goes: the end of its records.
    end: u64,
    /// The length of `file`: zeros from `end` on.
    allocated: u64,
    generation: u64,
    /// Bytes appended to journals since the last snapshot began.
    journal_bytes: u64,
    /// The newest acknowledgement mark written to `file` (`record/header.rs`).
    mark: Mark,
    compactor: Option<thread::JoinHandle<()>>,
    /// The room could not be grown (the disk is full): commits go on in the room made, and
    /// one that needs more fails at once until a retry, spaced by the backoff, succeeds.
    full: Option<Stalled>,
    /// A write or fsync of records failed: the bytes from `end` to `dirty_to` are unknown, so
    /// no record is written until zeros written over them are synced (retried with backoff).
    poisoned: Option<(Stalled, u64)>,
    /// The size of the last batch refused for lack of room, until a commit succeeds or the
    /// room grows to fit it (meanwhile a ping fails too, and `/readyz` says so).
    refusing: Option<u64>,
    /// `ip_webhook_ledger_disk_full`.
    pub(super) disk_full: prometheus_client::metrics::gauge::Gauge,
    /// A cap on the journal's length, as a full disk would set it (unit tests only).
    #[cfg(test)]
    pub(super) space: Option<u64>,
    buf: Vec<u8>,
    /// Each commit's [`JournalBatch::index`], cleared as the commit starts: one map for the
    /// writer's life, not one allocated and grown with every batch.
    index: BatchIndex,
    /// Kept open and locked: a second process on the same dir fails to open.
    _lock: File,
}

/// The records read on open, in file order, each with the size of its record.
#[derive(Default)]
struct Loaded {
    /// Each record's IP beside it: the sort reads no claim.
    records: Vec<(IpAddr, Arc<Claim>, u64)>,
}

impl Loaded {
    /// A record read in file order: a later record of an IP replaces the earlier one.
    fn install(&mut self, claim: Claim, size: u64) {
        self.records.push((claim.ip, Arc::new(claim), size));
    }

    /// The last record of each IP, and the bytes of those. The map is built from the sorted
    /// records at once, its nodes full: inserted one at a time in ascending order (as a
    /// snapshot is read) a B-tree keeps its nodes about half full, and rebuilding it later
    /// does not give the freed nodes' memory back (docs/performance.md, "Memory per held
    /// claim").
    fn finish(mut self) -> (IpMap<Arc<Claim>>, u64) {
        // stable: the records of one IP stay in file order
        self.records.sort_by_key(|(ip, _, _)| *ip);
        self.records.dedup_by(|later, earlier| {
            // `dedup_by` keeps the first of a run of equal keys: keep the later record in it
            let same = later.0 == earlier.0;
            if same {
                std::mem::swap(later, earlier);
            }
            same
        });
        let live_bytes = self.records.iter().map(|(_, _, size)| size).sum();
        let claims = self.records.into_iter().map(|(ip, claim, _)| (ip, claim));
        (claims.collect(), live_bytes)
    }
}

impl Journal {
    /// Open the ledger in `dir` for writing: lock it, read it as every command does
    /// ([`load::survey`], refusing what it refuses), then make the writes only a writer makes
    /// (`journal/tail.rs`).
    pub(super) fn open(dir: &Path) -> Result<Journal, LedgerError> {
        let lock = super::lock_state_dir(dir, "is another ip-webhook using this --state-dir?")?;
        tail::remove_unfinished(dir);
        let mut loaded = Loaded::default();
        let survey = load::survey(dir, |claim, size| loaded.install(claim, size))?.refusal()?;
        let opened = tail::open_tail(dir, &survey)?;
        let journal_bytes = survey
            .journals
            .iter()
            .map(|j| j.good.saturating_sub(crate::record::JOURNAL_START))
            .sum();
        tail::keep_marker(dir, survey.marker.as_ref());
        let (claims, live_bytes) = loaded.finish();
        Ok(Journal {
            dir: dir.to_path_buf(),
            claims,
            live_bytes,
            allocated: opened
                .file
                .metadata()
                .map_err(super::storage("stat journal"))?
                .len(),
            file: opened.file,
            end: opened.end,
            generation: opened.generation,
            journal_bytes,
            mark: opened.mark,
            compactor: None,
            full: None,
            poisoned: None,
            refusing: None,
            disk_full: Default::default(),
            #[cfg(test)]
            space: None,
            buf: Vec::with_capacity(64 << 10),
            sizing: Vec::new(),
            index: BatchIndex::default(),
            _lock: lock,
        })
    }

    pub(super) fn commit(
        &mut self,
        batch: &mut Vec<Request>,
        replies: &mut Vec<Reply>,
    ) -> Result<u64, LedgerError> {
        self.recover()?;
        self.buf.clear();
        self.index.clear();
        let mut records = JournalBatch {
            claims: &self.claims,
            pending: Vec::with_capacity(batch.len()),
            index: &mut self.index,
            buf: &mut self.buf,
        };
        let writes = apply(&mut records, batch, replies)?;
        if writes == 0 {
            return Ok(0);
        }
        let pending = records.pending;
        let len = self.buf.len() as u64;
        if self.end + len > self.allocated {
            // more than the room made ahead: grown now, or refused at once while the disk is full
            let grown = self.try_grow(len);
            if let Err(refused) = grown {
                self.refusing = Some(len);
                return Err(refused);
            }
        }
        let started = Instant::now();
        let mut wrote = started;
        if let Err(e) = self.file.write_all_at(&self.buf, self.end).and_then(|()| {
            wrote = Instant::now();
            self.file.sync_data()
        }) {
            tracing::error!(error = %e, "a journal write failed; no record is written until its bytes are known again");
            self.poisoned = Some((Stalled::new(&e), self.end + len));
            return Err(self.io_error("journal write", &e));
        }
        let synced = Instant::now();
        if synced.duration_since(started) >= super::SLOW {
            tracing::warn!(
                bytes = len,
                write_us = wrote.duration_since(started).as_micros() as u64,
                sync_us = synced.duration_since(wrote).as_micros() as u64,
                "slow journal commit: the write and fdatasync of one batch"
            );
        }
        self.refusing = None;
        self.end += len;
        self.journal_bytes += len;
        for (claim, size) in pending {
            if let Some(old) = self.claims.insert(claim.ip, claim) {
                let old_size = record_size(&old, &mut self.sizing);
                self.live_bytes = self.live_bytes.saturating_sub(old_size);
            }
            self.live_bytes += size;
        }
        self.maybe_compact();
        Ok(writes)
    }

    /// Start a snapshot in the background when the journals have grown enough; the writer
    /// goes on in a new journal meanwhile.
    fn maybe_compact(&mut self) {
        // a snapshot needs space a full disk does not have: postponed until the room grows
        if self.journal_bytes < COMPACT_MIN_BYTES.max(2 * self.live_bytes) || self.full.is_some() {
            return;
        }
        if let Some(compactor) = &self.compactor {
            if !compactor.is_finished() {
                return;
            }
            self.finish_compaction();
        }
        if let Some((generation, closed)) = self.rotate() {
            self.snapshot_in_background(generation, closed);
        }
    }

    /// Go on in a new journal, the current one closed for it ([`Journal::close_for`]): the
    /// new generation, and the closed journal to sync. `None` when it cannot be created.
    pub(super) fn rotate(&mut self) -> Option<(u64, Result<File, LedgerError>)> {
        let generation = self.generation + 1;
        let file = match tail::create_journal(&self.dir, generation) {
            Ok(file) => file,
            Err(error) => {
                tracing::error!(%error, "cannot start a new journal; compaction postponed");
                return None;
            }
        };
        let closed = self.close_for(generation);
        self.file = file;
        self.end = JOURNAL_START;
        self.allocated = self.end;
        self.mark = tail::first_mark();
        self.generation = generation;
        self.journal_bytes = 0;
        Some((generation, closed))
    }

    /// Write snapshot `generation` of every claim on a thread of its own (after syncing the
    /// journal `closed`), then remove the files it covers.
    pub(super) fn snapshot_in_background(
        &mut self,
        generation: u64,
        closed: Result<File, LedgerError>,
    ) {
        let claims: Vec<Arc<Claim>> = self.claims.values().cloned().collect();
        let dir = self.dir.clone();
        let spawned = thread::Builder::new()
            .name("ledger-compact".into())
            .spawn(move || {
                // the closed journal's seal made durable off the writer's thread
                let result = closed
                    .and_then(|file| file.sync_data().map_err(super::storage("sync journal")))
                    .and_then(|()| write_snapshot(&dir, generation, claims.iter().map(|c| &**c)))
                    .and_then(|()| remove_before(&dir, generation));
                match result {
                    Ok(()) => tracing::info!(generation, claims = claims.len(), "ledger compacted"),
                    Err(error) => {
                        tracing::error!(%error, "ledger compaction failed; the journals are kept")
                    }
                }
            });
        match spawned {
            Ok(handle) => self.compactor = Some(handle),
            Err(error) => tracing::error!(%error, "cannot start the compaction thread"),
        }
    }

    /// Close the journal written so far, which journal `next` follows: trimmed to its last
    /// record, its mark saying where its records end and that `next` follows (so that `next`
    /// gone is noticed). Neither is synced here: the compaction syncs it before it writes the
    /// snapshot; zeros that stay after a crash are read as room, and a journal a crash left
    /// unsealed is sealed by the next open. Returns a handle to it for that sync.
    fn close_for(&mut self, next: u64) -> Result<File, LedgerError> {
        if let Err(error) = self.file.set_len(self.end) {
            tracing::warn!(%error, "cannot trim the zeros after a closed journal's records");
        }
        let seal = Mark {
            seq: self.mark.seq + 1,
            acknowledged: self.end,
            next,
        };
        self.file
            .write_all_at(&seal.encode(), seal.slot())
            .map_err(super::storage("seal journal"))?;
        self.mark = seal;
        self.file
            .try_clone()
            .map_err(super::storage("seal journal"))
    }

    /// After a commit has its answers: the journal's mark names the records made durable so
    /// far (`record/header.rs`), so that losing them later is told from a torn write. Written
    /// and not synced: the next commit's `fdatasync` carries it to the disk, and the page
    /// cache keeps it when the process is killed. One `pwrite` of 32 bytes per commit.
    pub(super) fn mark_acknowledged(&mut self) {
        if self.end <= self.mark.acknowledged || self.poisoned.is_some() {
            return;
        }
        let mark = Mark {
            seq: self.mark.seq + 1,
            acknowledged: self.end,
            next: 0,
        };
        match self.file.write_all_at(&mark.encode(), mark.slot()) {
            Ok(()) => self.mark = mark,
            Err(error) => {
                tracing::warn!(%error, "cannot write the journal's acknowledgement mark")
            }
        }
    }

    /// The writer ends: the last mark written and synced.
    pub(super) fn close(&mut self) {
        self.finish_compaction();
        self.mark_acknowledged();
        if let Err(error) = self.file.sync_data() {
            tracing::warn!(%error, "cannot sync the journal's acknowledgement mark");
        }
    }

    /// Every claim recorded (held or released): the copies the journal keeps.
    pub(super) fn load(&self) -> Vec<Arc<Claim>> {
        self.claims.values().cloned().collect()
    }

    pub(super) fn finish_compaction(&mut self) {
        if let Some(handle) = self.compactor.take() {
            let _ = handle.join();
        }
    }
}

/// foldhash, seeded per process: the writer hashes each IP it writes.
type BatchIndex = HashMap<IpAddr, usize, foldhash::fast::RandomState>;

struct JournalBatch<'a> {
    claims: &'a IpMap<Arc<Claim>>,
    /// Writes of this batch in order (a later one of the same IP wins), with record sizes.
    pending: Vec<(Arc<Claim>, u64)>,
    /// The last write of each IP in `pending`.
    index: &'a mut BatchIndex,
    buf: &'a mut Vec<u8>,
}

impl Records for JournalBatch<'_> {
    fn read(&mut self, ip: IpAddr) -> Result<Option<Arc<Claim>>, LedgerError> {
        if let Some(&at) = self.index.get(&ip) {
            return Ok(Some(self.pending[at].0.clone()));
        }
        Ok(self.claims.get(&ip).cloned())
    }

    fn write(&mut self, claim: Arc<Claim>) -> Result<(), LedgerError> {
        let size = encode_record(self.buf, &claim)?;
        self.index.insert(claim.ip, self.pending.len());
        self.pending.push((claim, size));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Phase, unreadable_holder};

    #[test]
    fn the_last_record_of_each_ip_is_kept_and_counted_by_its_size() {
        let mut loaded = Loaded::default();
        let ip = |n: u8| IpAddr::from([10, 0, 0, n]);
        let record = |n: u8, phase: Phase| Claim {
            phase,
            ..unreadable_holder(ip(n), "r")
        };
        loaded.install(record(2, Phase::Reserved), 10);
        loaded.install(record(1, Phase::Reserved), 20);
        loaded.install(record(2, Phase::Bound), 30);
        loaded.install(record(2, Phase::Terminating), 40);
        loaded.install(record(3, Phase::Reserved), 50);
        let (claims, live_bytes) = loaded.finish();
        let kept: Vec<(IpAddr, Phase)> =
            claims.iter().map(|(ip, claim)| (ip, claim.phase)).collect();
        assert_eq!(
            kept,
            [
                (ip(1), Phase::Reserved),
                (ip(2), Phase::Terminating),
                (ip(3), Phase::Reserved)
            ]
        );
        assert_eq!(live_bytes, 20 + 40 + 50);
    }

    /// `live_bytes` follows the commits as claims are replaced, each replaced claim's size found
    /// again by encoding it: it equals what a fresh open sums from the records on disk.
    #[test]
    fn live_bytes_follow_replaced_claims_as_a_fresh_open_counts_them() {
        use super::super::writer::Request;
        use tokio::sync::oneshot;
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path()).unwrap();
        let claim = |n: u8, phase: Phase, uid: &str| {
            let ip = format!("10.0.0.{n}");
            let claim = crate::test_claims::builder(&ip, "web", &format!("web-{n}"))
                .request(&format!("r-{n}"))
                .token(&format!("t-{n}"))
                .phase(phase)
                .build();
            Claim {
                pod: crate::PodRef {
                    uid: (!uid.is_empty()).then(|| uid.into()),
                    ..claim.pod.clone()
                },
                // a Terminating record carries its release time: each step's record is longer
                release_at: (phase == Phase::Terminating).then(|| crate::ReleaseAt::new(1 << 31)),
                ..claim
            }
        };
        let mut batch: Vec<Request> = (1..=3)
            .map(|n| {
                Request::Create(
                    Arc::new(claim(n, Phase::Reserved, "")),
                    oneshot::channel().0,
                )
            })
            .collect();
        assert_eq!(journal.commit(&mut batch, &mut Vec::new()).unwrap(), 3);
        let uid = "0c9d4b1e-6a3f-4c1e-9b8a-2f7d5e1c3a90";
        for (from, from_uid, to) in [
            (Phase::Reserved, "", Phase::Bound),
            (Phase::Bound, uid, Phase::Terminating),
        ] {
            let mut batch: Vec<Request> = (1..=2)
                .map(|n| {
                    let pair = (claim(n, from, from_uid), claim(n, to, uid));
                    Request::Transition(Box::new(pair), oneshot::channel().0)
                })
                .collect();
            assert_eq!(journal.commit(&mut batch, &mut Vec::new()).unwrap(), 2);
        }
        let sizes: Vec<u64> = journal
            .claims
            .values()
            .map(|claim| record_size(claim, &mut Vec::new()))
            .collect();
        assert!(sizes[0] > sizes[2], "the records did not grow: {sizes:?}");
        assert_eq!(journal.live_bytes, sizes.iter().sum::<u64>());
        let live_bytes = journal.live_bytes;
        journal.close();
        drop(journal);
        let reopened = Journal::open(dir.path()).unwrap();
        assert_eq!(reopened.live_bytes, live_bytes);
        assert_eq!(reopened.claims.len(), 3);
    }
}
