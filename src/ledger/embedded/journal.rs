//! The journal store: an append-only journal of checksummed records per generation, snapshots,
//! and the compaction that turns journals into a snapshot (module docs of [`super`]).

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

mod room;
mod snapshot;

use room::Stalled;
use snapshot::{remove_before, sync_dir, write_snapshot};

use super::marker;
use super::{
    JOURNAL, LOCK_FILE, REDB_FILE, Records, Reply, Request, SNAPSHOT, apply, generations, name,
    redb_store, storage, storage_at,
};
use crate::ledger::record::{Format, MAGIC, Scan, encode_record, scan_file};
use crate::ledger::{Claim, Damage, LedgerError};

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

struct Entry {
    claim: Arc<Claim>,
    /// Size of its record.
    size: u64,
}

pub(super) struct Journal {
    dir: PathBuf,
    /// A B-tree, like the allocator's maps: no all-at-once rehash on the writer thread.
    claims: BTreeMap<IpAddr, Entry>,
    /// Sum of the record sizes of `claims`.
    live_bytes: u64,
    file: File,
    /// Where the next record of `file` goes: the end of its records.
    end: u64,
    /// The length of `file`: zeros from `end` on.
    allocated: u64,
    generation: u64,
    /// Bytes appended to journals since the last snapshot began.
    journal_bytes: u64,
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
    /// Kept open and locked: a second process on the same dir fails to open.
    _lock: File,
}

/// The refusal for a file with damage that valid records follow.
pub(super) fn damaged(dir: &Path, path: &Path, scan: &Scan) -> LedgerError {
    LedgerError::Damaged(Box::new(Damage {
        path: path.to_path_buf(),
        state_dir: dir.to_path_buf(),
        offset: scan.damage.first().map_or(0, |d| d.offset),
        records_after: scan.records_after_damage(),
        stretches: scan.damage.len(),
        damaged_bytes: scan.damage.iter().map(|d| d.len).sum(),
    }))
}

/// The journal a ledger of snapshot `base` (0: none) and `journals` (from `base` on) lacks, if
/// one is gone. Journal `g` is made durable before snapshot `g` is written, and journals are
/// deleted only below a durable snapshot; the first journal of a dir is 1. So from the snapshot
/// (or 1) to the last journal every generation is there; a gap is records lost, not a crash.
/// The one exception: a redb ledger migrated to snapshot 1 before its first journal existed.
fn missing_generation(base: u64, journals: &[u64], migrated: bool) -> Option<u64> {
    if base == 1 && journals.is_empty() && migrated {
        return None;
    }
    let first = if base > 0 { base } else { 1 };
    let Some(&last) = journals.last() else {
        return (base > 0).then_some(base);
    };
    (first.min(journals[0])..=last).find(|g| journals.binary_search(g).is_err())
}

/// Refuse a ledger of snapshot `base` and `journals` (from `base` on) that lacks a file.
fn complete(dir: &Path, base: u64, journals: &[u64]) -> Result<(), LedgerError> {
    let migrated = dir.join(format!("{REDB_FILE}.migrated")).exists();
    match missing_generation(base, journals, migrated) {
        Some(gone) => Err(marker::journal_gone(
            dir,
            base,
            gone,
            journals.first().copied(),
        )),
        None => Ok(()),
    }
}

/// The records read on open, in file order, each with the size of its record.
#[derive(Default)]
struct Loaded {
    records: Vec<(IpAddr, Entry)>,
}

impl Loaded {
    /// A record read in file order: a later record of an IP replaces the earlier one.
    fn install(&mut self, claim: Claim, size: u64) {
        let entry = Entry {
            claim: Arc::new(claim),
            size,
        };
        self.records.push((entry.claim.ip, entry));
    }

    /// The last record of each IP, and the bytes of those. The map is built from the sorted
    /// records at once, its nodes full: inserted one at a time in ascending order (as a
    /// snapshot is read) a B-tree keeps its nodes about half full, and rebuilding it later
    /// does not give the freed nodes' memory back (docs/performance.md, "Memory per held
    /// claim").
    fn finish(mut self) -> (BTreeMap<IpAddr, Entry>, u64) {
        // stable: the records of one IP stay in file order
        self.records.sort_by_key(|(ip, _)| *ip);
        self.records.dedup_by(|later, earlier| {
            // `dedup_by` keeps the first of a run of equal keys: keep the later record in it
            let same = later.0 == earlier.0;
            if same {
                std::mem::swap(later, earlier);
            }
            same
        });
        let live_bytes = self.records.iter().map(|(_, entry)| entry.size).sum();
        (self.records.into_iter().collect(), live_bytes)
    }
}

/// What the journals after the snapshot held: their bytes, and the last one's format and end
/// of its last whole record.
struct Journals {
    bytes: u64,
    last_format: Option<Format>,
    last_good: u64,
}

/// Take the state dir's lock file (`flock`, released when the process ends); with whether the
/// lock file was there before.
fn lock_state_dir(dir: &Path) -> Result<(File, bool), LedgerError> {
    let lock_path = dir.join(LOCK_FILE);
    let lock_existed = lock_path.exists();
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(storage_at("open the lock file", &lock_path))?;
    lock.try_lock().map_err(|e| {
        LedgerError::Storage(format!(
            "cannot open {} (is another ip-webhook using this --state-dir?): {e}",
            lock_path.display()
        ))
    })?;
    Ok((lock, lock_existed))
}

/// A state dir of an older release, with only `ledger.redb`: every claim of it becomes
/// snapshot 1, and the file is kept as `ledger.redb.migrated`.
fn migrate_redb(dir: &Path) -> Result<(), LedgerError> {
    let redb = dir.join(REDB_FILE);
    let claims = redb_store::load(&redb_store::open_redb(&redb)?)?;
    write_snapshot(dir, 1, claims.iter())?;
    let kept = dir.join(format!("{REDB_FILE}.migrated"));
    std::fs::rename(&redb, &kept).map_err(storage("rename migrated redb file"))?;
    sync_dir(dir)?;
    tracing::info!(claims = claims.len(), kept = %kept.display(), "migrated the redb ledger to the journal");
    Ok(())
}

/// Read snapshot `base` into `loaded`: it must be whole (snapshots are renamed into place
/// once written and synced). A file with damage fails the open, so what it put in `loaded`
/// is never used.
fn load_snapshot(dir: &Path, base: u64, loaded: &mut Loaded) -> Result<(), LedgerError> {
    let path = dir.join(name(SNAPSHOT, base));
    let scan = scan_file(&path, |claim, size| loaded.install(claim, size))?;
    if !scan.damage.is_empty() {
        return Err(damaged(dir, &path, &scan));
    }
    if scan.torn || scan.good == 0 {
        return Err(LedgerError::Corrupt {
            ip: path.display().to_string(),
            reason: format!(
                "bad record at byte {} of a snapshot (snapshots are written whole, then renamed)",
                scan.good
            ),
        });
    }
    Ok(())
}

/// Read `journals` in order into `loaded`. Only the last one may end in a torn write (a commit
/// a crash cut short, never answered): it is cut off.
fn load_journals(
    dir: &Path,
    journals: &[u64],
    loaded: &mut Loaded,
) -> Result<Journals, LedgerError> {
    let mut read = Journals {
        bytes: 0,
        last_format: None,
        last_good: 0,
    };
    let last = journals.last().copied();
    for &generation in journals {
        let path = dir.join(name(JOURNAL, generation));
        let scan = scan_file(&path, |claim, size| loaded.install(claim, size))?;
        if !scan.damage.is_empty() {
            return Err(damaged(dir, &path, &scan));
        }
        read.last_format = scan.format;
        read.last_good = scan.good;
        if scan.torn {
            if Some(generation) != last {
                return Err(LedgerError::Corrupt {
                    ip: path.display().to_string(),
                    reason: format!(
                        "bad record at byte {} of a journal that a later one follows (only the last journal can end in a torn write)",
                        scan.good
                    ),
                });
            }
            tracing::warn!(path = %path.display(), kept = scan.good, "cutting a torn record off the journal");
            let file = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(storage_at("open the journal", &path))?;
            file.set_len(scan.good)
                .map_err(storage("truncate journal"))?;
            file.sync_all().map_err(storage("sync journal"))?;
        }
        read.bytes += scan.good;
    }
    Ok(read)
}

impl Journal {
    pub(super) fn open(dir: &Path) -> Result<Journal, LedgerError> {
        let (lock, lock_existed) = lock_state_dir(dir)?;
        let mut snapshots = generations(dir, SNAPSHOT)?;
        let mut journals = generations(dir, JOURNAL)?;
        if snapshots.is_empty() && journals.is_empty() && dir.join(REDB_FILE).exists() {
            migrate_redb(dir)?;
            snapshots = vec![1];
        }
        if snapshots.is_empty() && journals.is_empty() {
            let signs = marker::signs(dir, lock_existed);
            if !signs.is_empty() {
                return Err(marker::missing(dir, &signs));
            }
        }
        let base = snapshots.last().copied().unwrap_or(0);
        let mut loaded = Loaded::default();
        if base > 0 {
            load_snapshot(dir, base, &mut loaded)?;
        }
        journals.retain(|g| *g >= base);
        complete(dir, base, &journals)?;
        let read = load_journals(dir, &journals, &mut loaded)?;
        let (generation, file, end) =
            Journal::open_tail(dir, base, journals.last().copied(), &read)?;
        let allocated = file.metadata().map_err(storage("stat journal"))?.len();
        // after the first journal exists (a crash in between leaves a journal and no marker,
        // which the next open mends); a dir of an older release gets its marker here too
        if let Err(error) = marker::ensure(dir) {
            tracing::warn!(%error, "cannot write the ledger's marker file; a lost journal would then not be noticed");
        }
        let (claims, live_bytes) = loaded.finish();
        Ok(Journal {
            dir: dir.to_path_buf(),
            claims,
            live_bytes,
            file,
            end,
            allocated,
            generation,
            journal_bytes: read.bytes,
            compactor: None,
            full: None,
            poisoned: None,
            refusing: None,
            disk_full: Default::default(),
            #[cfg(test)]
            space: None,
            buf: Vec::with_capacity(64 << 10),
            _lock: lock,
        })
    }

    /// The journal the next records go to, with its generation and where they start: the last
    /// one, after its last whole record; a new one after a JSON-format journal (binary records
    /// are not appended to it) or when there is none.
    fn open_tail(
        dir: &Path,
        base: u64,
        last: Option<u64>,
        read: &Journals,
    ) -> Result<(u64, File, u64), LedgerError> {
        Ok(match last {
            Some(generation) if read.last_format == Some(Format::Json) => {
                let file = Journal::create_file(dir, generation + 1)?;
                (generation + 1, file, MAGIC.len() as u64)
            }
            Some(generation) => {
                let path = dir.join(name(JOURNAL, generation));
                let file = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(storage_at("open the journal", &path))?;
                if file.metadata().map_err(storage("stat journal"))?.len() == 0 {
                    file.write_all_at(MAGIC, 0)
                        .map_err(storage("write journal"))?;
                    file.sync_data().map_err(storage("sync journal"))?;
                }
                (generation, file, read.last_good.max(MAGIC.len() as u64))
            }
            None => {
                let generation = base.max(1);
                let file = Journal::create_file(dir, generation)?;
                (generation, file, MAGIC.len() as u64)
            }
        })
    }

    fn create_file(dir: &Path, generation: u64) -> Result<File, LedgerError> {
        let path = dir.join(name(JOURNAL, generation));
        let mut file = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)
            .map_err(storage_at("create the journal", &path))?;
        if let Err(error) = file
            .write_all(MAGIC)
            .and_then(|()| file.sync_all())
            .map_err(storage("write journal"))
            .and_then(|()| sync_dir(dir))
        {
            // not left behind: a later attempt creates it again
            let _ = std::fs::remove_file(&path);
            return Err(error);
        }
        Ok(file)
    }

    pub(super) fn commit(
        &mut self,
        batch: &mut Vec<Request>,
        replies: &mut Vec<Reply>,
    ) -> Result<u64, LedgerError> {
        self.recover()?;
        self.buf.clear();
        let mut records = JournalBatch {
            claims: &self.claims,
            pending: Vec::new(),
            index: HashMap::new(),
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
            let ip = claim.ip;
            if let Some(old) = self.claims.insert(ip, Entry { claim, size }) {
                self.live_bytes -= old.size;
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
        let generation = self.generation + 1;
        let file = match Journal::create_file(&self.dir, generation) {
            Ok(file) => file,
            Err(error) => {
                tracing::error!(%error, "cannot start a new journal; compaction postponed");
                return;
            }
        };
        // The room left in the journal it closes is not needed: a journal before the last one
        // then ends at its last record, as every release has read it. Not synced: zeros that
        // stay after a crash are read as room.
        if let Err(error) = self.file.set_len(self.end) {
            tracing::warn!(%error, "cannot trim the zeros after a closed journal's records");
        }
        self.file = file;
        self.end = MAGIC.len() as u64;
        self.allocated = self.end;
        self.generation = generation;
        self.journal_bytes = 0;
        let claims: Vec<Arc<Claim>> = self.claims.values().map(|e| e.claim.clone()).collect();
        let dir = self.dir.clone();
        let spawned = thread::Builder::new()
            .name("ledger-compact".into())
            .spawn(move || {
                let result = write_snapshot(&dir, generation, claims.iter().map(|c| &**c))
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

    /// Every claim recorded (held or released): the copies the journal keeps.
    pub(super) fn load(&self) -> Vec<Arc<Claim>> {
        self.claims
            .values()
            .map(|entry| entry.claim.clone())
            .collect()
    }

    pub(super) fn finish_compaction(&mut self) {
        if let Some(handle) = self.compactor.take() {
            let _ = handle.join();
        }
    }
}

struct JournalBatch<'a> {
    claims: &'a BTreeMap<IpAddr, Entry>,
    /// Writes of this batch in order (a later one of the same IP wins), with record sizes.
    pending: Vec<(Arc<Claim>, u64)>,
    /// The last write of each IP in `pending`.
    index: HashMap<IpAddr, usize>,
    buf: &'a mut Vec<u8>,
}

impl Records for JournalBatch<'_> {
    fn read(&mut self, ip: IpAddr) -> Result<Option<Arc<Claim>>, LedgerError> {
        if let Some(&at) = self.index.get(&ip) {
            return Ok(Some(self.pending[at].0.clone()));
        }
        Ok(self.claims.get(&ip).map(|e| e.claim.clone()))
    }

    fn write(&mut self, claim: Arc<Claim>) -> Result<(), LedgerError> {
        let size = encode_record(self.buf, &claim)?;
        self.index.insert(claim.ip, self.pending.len());
        self.pending.push((claim, size));
        Ok(())
    }
}

/// The journal store's claims, read without the lock and without cutting a torn tail (the
/// writer may be appending to it right now: a partial last record is simply not counted). A
/// file deleted by a compaction between listing and reading is retried once; damage is read
/// again twice, a short while apart, before it is reported (a read that overlapped a large
/// write can see a later page of it before an earlier one).
pub(super) fn read_journal(state_dir: &Path) -> Result<Vec<Claim>, LedgerError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match read_journal_once(state_dir) {
            Err(LedgerError::Storage(why)) if attempt == 1 && why.contains("No such file") => {
                tracing::debug!(%why, "a journal went away while reading; reading again");
            }
            // a compaction between listing the snapshots and the journals looks like a gap
            Err(LedgerError::Missing(why)) if attempt == 1 => {
                tracing::debug!(%why, "the files changed while listing them; reading again");
            }
            Err(LedgerError::Damaged(_)) if attempt < 3 => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            result => return result,
        }
    }
}

fn read_journal_once(state_dir: &Path) -> Result<Vec<Claim>, LedgerError> {
    let base = generations(state_dir, SNAPSHOT)?
        .last()
        .copied()
        .unwrap_or(0);
    let mut claims: HashMap<IpAddr, Claim> = HashMap::new();
    let mut read = |path: PathBuf| -> Result<(), LedgerError> {
        let scan = scan_file(&path, |claim, _| {
            claims.insert(claim.ip, claim);
        })?;
        if !scan.damage.is_empty() {
            return Err(damaged(state_dir, &path, &scan));
        }
        Ok(())
    };
    let mut journals = generations(state_dir, JOURNAL)?;
    journals.retain(|g| *g >= base);
    complete(state_dir, base, &journals)?;
    if base > 0 {
        read(state_dir.join(name(SNAPSHOT, base)))?;
    }
    for generation in journals {
        read(state_dir.join(name(JOURNAL, generation)))?;
    }
    Ok(claims.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Phase, unreadable_holder};

    #[test]
    fn the_last_record_of_each_ip_is_kept_with_its_size() {
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
        let kept: Vec<(IpAddr, Phase, u64)> = claims
            .iter()
            .map(|(ip, entry)| (*ip, entry.claim.phase, entry.size))
            .collect();
        assert_eq!(
            kept,
            [
                (ip(1), Phase::Reserved, 20),
                (ip(2), Phase::Terminating, 40),
                (ip(3), Phase::Reserved, 50)
            ]
        );
        assert_eq!(live_bytes, 110);
    }
}
