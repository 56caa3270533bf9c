//! The embedded ledger: one crash-safe redb file in `--state-dir`.
//!
//! Writes go to one writer thread that drains every request waiting and commits them in one
//! transaction (group commit): under load, many admissions share one fsync, and no answer is
//! sent before the commit that holds its claim has returned.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;

use async_trait::async_trait;
use prometheus_client::metrics::counter::Counter;
use redb::{ConcurrencyMode, Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

use super::claim::{CreateRule, create_rule, may_step, released, same_grant};
use super::{Claim, CreateOutcome, Ledger, LedgerError, unix_now};

const CLAIMS: TableDefinition<&str, &[u8]> = TableDefinition::new("claims");
const MAX_BATCH: usize = 4096;

/// Counters the writer bumps; the metrics registry holds clones of the same counters.
#[derive(Clone, Default, Debug)]
pub struct CommitCounters {
    /// Transactions committed (one fsync each).
    pub commits: Counter,
    /// Claim writes made durable.
    pub writes: Counter,
}

enum Op {
    Create(
        Box<Claim>,
        oneshot::Sender<Result<CreateOutcome, LedgerError>>,
    ),
    Release(Box<Claim>, oneshot::Sender<Result<bool, LedgerError>>),
    /// `(current, next)`: a phase change.
    Transition(
        Box<(Claim, Claim)>,
        oneshot::Sender<Result<bool, LedgerError>>,
    ),
}

pub struct EmbeddedLedger {
    path: PathBuf,
    db: std::sync::Arc<Database>,
    sender: std::sync::Mutex<Option<mpsc::Sender<Op>>>,
    writer: std::sync::Mutex<Option<thread::JoinHandle<()>>>,
}

fn storage<E: std::fmt::Display>(context: &str) -> impl FnOnce(E) -> LedgerError + '_ {
    move |e| LedgerError::Storage(format!("{context}: {e}"))
}

impl EmbeddedLedger {
    /// Open (or create) `state_dir/ledger.redb`. Fails with a clear message when another
    /// process has it open.
    pub fn open(state_dir: &Path, counters: CommitCounters) -> Result<EmbeddedLedger, LedgerError> {
        std::fs::create_dir_all(state_dir).map_err(|e| {
            LedgerError::Storage(format!(
                "cannot create state dir {}: {e}",
                state_dir.display()
            ))
        })?;
        let path = state_dir.join("ledger.redb");
        // SingleWriter: one writing process, and `status`, `explain` and `review --dry-run`
        // may read the file meanwhile ([`read_claims`]); a second writer is still refused.
        let db = Database::builder()
            .set_concurrency_mode(ConcurrencyMode::SingleWriter)
            .create(&path)
            .map_err(|e| {
                LedgerError::Storage(format!(
                    "cannot open {} (is another ip-webhook using this --state-dir?): {e}",
                    path.display()
                ))
            })?;
        {
            let txn = db.begin_write().map_err(storage("begin"))?;
            txn.open_table(CLAIMS).map_err(storage("open table"))?;
            txn.commit().map_err(storage("commit"))?;
        }
        let db = std::sync::Arc::new(db);
        let (sender, receiver) = mpsc::channel::<Op>();
        let writer_db = db.clone();
        let writer = thread::Builder::new()
            .name("ledger-writer".into())
            .spawn(move || writer_loop(&writer_db, receiver, counters))
            .map_err(storage("spawn writer"))?;
        Ok(EmbeddedLedger {
            path,
            db,
            sender: std::sync::Mutex::new(Some(sender)),
            writer: std::sync::Mutex::new(Some(writer)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn send(&self, op: Op) -> Result<(), LedgerError> {
        let guard = self.sender.lock().map_err(|_| LedgerError::Closed)?;
        let sender = guard.as_ref().ok_or(LedgerError::Closed)?;
        sender.send(op).map_err(|_| LedgerError::Closed)
    }
}

fn writer_loop(db: &Database, receiver: mpsc::Receiver<Op>, counters: CommitCounters) {
    while let Ok(first) = receiver.recv() {
        // Let the request threads run first: on a busy (or single) core, claims that are on
        // their way join this commit instead of waiting for the next fsync.
        thread::yield_now();
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        commit_batch(db, batch, &counters);
    }
}

enum Reply {
    Create(
        oneshot::Sender<Result<CreateOutcome, LedgerError>>,
        CreateOutcome,
    ),
    Changed(oneshot::Sender<Result<bool, LedgerError>>, bool),
}

fn commit_batch(db: &Database, batch: Vec<Op>, counters: &CommitCounters) {
    let mut replies = Vec::with_capacity(batch.len());
    let mut writes = 0u64;
    let result = (|| -> Result<(), LedgerError> {
        let txn = db.begin_write().map_err(storage("begin"))?;
        {
            let mut table = txn.open_table(CLAIMS).map_err(storage("open table"))?;
            for op in batch {
                match op {
                    Op::Create(claim, reply) => {
                        let key = claim.ip.to_string();
                        let existing = read(&table, &key)?;
                        let outcome = match create_rule(existing.as_ref(), &claim) {
                            CreateRule::Write => {
                                write(&mut table, &key, &claim)?;
                                writes += 1;
                                CreateOutcome::Created
                            }
                            CreateRule::Existing => CreateOutcome::for_existing(
                                existing.expect("a rule about an existing record"),
                                &claim,
                            ),
                            CreateRule::Held => CreateOutcome::AlreadyHeld(Box::new(
                                existing.expect("a rule about an existing record"),
                            )),
                        };
                        replies.push(Reply::Create(reply, outcome));
                    }
                    Op::Release(claim, reply) => {
                        let key = claim.ip.to_string();
                        let changed = match read(&table, &key)? {
                            Some(held) if held.is_held() && same_grant(&held, &claim) => {
                                write(&mut table, &key, &released(&held, unix_now()))?;
                                writes += 1;
                                true
                            }
                            _ => false,
                        };
                        replies.push(Reply::Changed(reply, changed));
                    }
                    Op::Transition(pair, reply) => {
                        let (current, next) = *pair;
                        let key = next.ip.to_string();
                        let changed = match read(&table, &key)? {
                            Some(record) if may_step(&record, &current, &next) => {
                                write(&mut table, &key, &next)?;
                                writes += 1;
                                true
                            }
                            _ => false,
                        };
                        replies.push(Reply::Changed(reply, changed));
                    }
                }
            }
        }
        if writes == 0 {
            // nothing changed: no fsync for a batch of refusals
            txn.abort().map_err(storage("abort"))?;
        } else {
            txn.commit().map_err(storage("commit"))?;
            counters.commits.inc();
        }
        Ok(())
    })();
    match result {
        Ok(()) => {
            counters.writes.inc_by(writes);
            for reply in replies {
                match reply {
                    Reply::Create(tx, outcome) => drop(tx.send(Ok(outcome))),
                    Reply::Changed(tx, changed) => drop(tx.send(Ok(changed))),
                }
            }
        }
        Err(error) => {
            // Nothing of this batch is durable: every waiter hears the error; ops not yet
            // reached in the batch were dropped, and their waiters see the channel close.
            let message = error.to_string();
            tracing::error!(%message, "ledger commit failed");
            for reply in replies {
                match reply {
                    Reply::Create(tx, _) => {
                        drop(tx.send(Err(LedgerError::Storage(message.clone()))))
                    }
                    Reply::Changed(tx, _) => {
                        drop(tx.send(Err(LedgerError::Storage(message.clone()))))
                    }
                }
            }
        }
    }
}

fn read(table: &redb::Table<&str, &[u8]>, key: &str) -> Result<Option<Claim>, LedgerError> {
    match table.get(key).map_err(storage("read"))? {
        Some(bytes) => decode(key, bytes.value()).map(Some),
        None => Ok(None),
    }
}

fn write(
    table: &mut redb::Table<&str, &[u8]>,
    key: &str,
    claim: &Claim,
) -> Result<(), LedgerError> {
    let bytes = serde_json::to_vec(claim).map_err(storage("encode"))?;
    table
        .insert(key, bytes.as_slice())
        .map_err(storage("write"))?;
    Ok(())
}

/// Every claim in `state_dir/ledger.redb`, read without creating or changing anything, also
/// while a server has the file open (it writes in SingleWriter mode, which admits readers).
pub fn read_claims(state_dir: &Path) -> Result<Vec<Claim>, LedgerError> {
    let path = state_dir.join("ledger.redb");
    let db = redb::Builder::new()
        .set_concurrency_mode(ConcurrencyMode::SingleWriter)
        .open_read_only(&path)
        .map_err(|e| {
            let what = match e {
                redb::DatabaseError::DatabaseAlreadyOpen => format!(
                    "{} is held by a process that does not share it (an older ip-webhook?); stop it and retry",
                    path.display()
                ),
                redb::DatabaseError::RepairAborted => format!(
                    "{} was not closed cleanly and needs a repair, which only a writer makes: start `ip-webhook serve --state-dir {}` once",
                    path.display(),
                    state_dir.display()
                ),
                other => format!("cannot read {}: {other}", path.display()),
            };
            LedgerError::Storage(what)
        })?;
    let txn = db.begin_read().map_err(storage("begin read"))?;
    let table = match txn.open_table(CLAIMS) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(storage("open table")(e)),
    };
    let mut claims = Vec::new();
    for entry in table.iter().map_err(storage("iterate"))? {
        let (key, value) = entry.map_err(storage("read"))?;
        claims.push(decode(key.value(), value.value())?);
    }
    Ok(claims)
}

fn decode(key: &str, bytes: &[u8]) -> Result<Claim, LedgerError> {
    serde_json::from_slice(bytes).map_err(|e| LedgerError::Corrupt {
        ip: key.to_string(),
        reason: e.to_string(),
    })
}

#[async_trait]
impl Ledger for EmbeddedLedger {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    async fn load(&self) -> Result<Vec<Claim>, LedgerError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_read().map_err(storage("begin read"))?;
            let table = txn.open_table(CLAIMS).map_err(storage("open table"))?;
            let mut claims = Vec::new();
            for entry in table.iter().map_err(storage("iterate"))? {
                let (key, value) = entry.map_err(storage("read"))?;
                claims.push(decode(key.value(), value.value())?);
            }
            Ok(claims)
        })
        .await
        .map_err(storage("load task"))?
    }

    async fn create(&self, claim: &Claim) -> Result<CreateOutcome, LedgerError> {
        let (tx, rx) = oneshot::channel();
        self.send(Op::Create(Box::new(claim.clone()), tx))?;
        rx.await
            .map_err(|_| LedgerError::Storage("ledger commit aborted".into()))?
    }

    async fn release(&self, claim: &Claim) -> Result<bool, LedgerError> {
        let (tx, rx) = oneshot::channel();
        self.send(Op::Release(Box::new(claim.clone()), tx))?;
        rx.await
            .map_err(|_| LedgerError::Storage("ledger commit aborted".into()))?
    }

    async fn transition(&self, current: &Claim, next: &Claim) -> Result<bool, LedgerError> {
        let (tx, rx) = oneshot::channel();
        self.send(Op::Transition(
            Box::new((current.clone(), next.clone())),
            tx,
        ))?;
        rx.await
            .map_err(|_| LedgerError::Storage("ledger commit aborted".into()))?
    }

    async fn close(&self) {
        // Dropping the sender ends the writer after it has committed what it holds.
        if let Ok(mut sender) = self.sender.lock() {
            sender.take();
        }
        let handle = self.writer.lock().ok().and_then(|mut w| w.take());
        if let Some(handle) = handle {
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Phase, PodRef, Source};

    fn claim(ip: &str, pod: &str) -> Claim {
        Claim {
            ip: ip.parse().unwrap(),
            app: "web".into(),
            pool: None,
            pod: PodRef {
                namespace: "default".into(),
                name: pod.into(),
                ..Default::default()
            },
            request_uid: format!("uid-{pod}"),
            phase: Phase::Reserved,
            source: Source::Allocated,
            created_at: 1,
            updated_at: 1,
            list_size: None,
            token: String::new(),
            release_at: None,
            sticky: false,
        }
    }

    #[tokio::test]
    async fn claims_survive_reopen_and_conflicts_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let counters = CommitCounters::default();
        let ledger = EmbeddedLedger::open(dir.path(), counters.clone()).unwrap();
        assert_eq!(
            ledger.create(&claim("10.0.0.1", "a")).await.unwrap(),
            CreateOutcome::Created
        );
        match ledger.create(&claim("10.0.0.1", "b")).await.unwrap() {
            CreateOutcome::AlreadyHeld(holder) => assert_eq!(holder.pod.name, "a"),
            other => panic!("expected AlreadyHeld, got {other:?}"),
        }
        // release only by the holder
        assert!(!ledger.release(&claim("10.0.0.1", "b")).await.unwrap());
        assert!(ledger.release(&claim("10.0.0.1", "a")).await.unwrap());
        assert_eq!(
            ledger.create(&claim("10.0.0.1", "b")).await.unwrap(),
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
                ledger.create(&claim(&ip, &format!("p{i}"))).await.unwrap()
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

    #[tokio::test]
    async fn a_reader_sees_the_commits_of_an_open_writer_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = EmbeddedLedger::open(dir.path(), CommitCounters::default()).unwrap();
        assert!(read_claims(dir.path()).unwrap().is_empty());
        ledger.create(&claim("10.0.0.1", "a")).await.unwrap();
        let seen = read_claims(dir.path()).unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].pod.name, "a");
        ledger.create(&claim("10.0.0.2", "b")).await.unwrap();
        assert_eq!(read_claims(dir.path()).unwrap().len(), 2);
        ledger.close().await;

        let missing = dir.path().join("nothing-here");
        let err = read_claims(&missing).unwrap_err().to_string();
        assert!(err.contains("nothing-here/ledger.redb"), "{err}");
        assert!(!missing.exists(), "a read created {}", missing.display());
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
}
