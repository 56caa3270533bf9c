//! `ip-webhook ledger repair`: what a repair of a refused state dir keeps and loses, and the
//! repair itself. It mends what `serve` and every command refuse (`load::survey` finds it):
//! - a damaged journal or snapshot (damage with valid records after it, records lost before a
//!   journal's acknowledgement mark, a snapshot that is not whole, an unreadable header) is
//!   rewritten with every valid record and a new header; the original is kept beside it as
//!   `<name>.damaged-<unix seconds>`;
//! - a journal that is gone is written again, empty;
//! - a network's books that are gone are forgotten (removed from the marker);
//! - a damaged marker is written again from the files there.
//!
//! What only a backup brings back (the snapshot the journals follow, every file of the
//! ledger) it refuses with the message `serve` gives.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::load::{self, Fix};
use super::marker::{self, Marker};
use super::{JOURNAL, name, storage};
use crate::record::Named;
use crate::record::{FIXED_LEN, Header, Kind, Mark, Stretch, journal_head, scan_bytes};
use crate::{Found, LedgerError};

/// One damaged file and what its repair does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileRepair {
    pub(crate) path: PathBuf,
    /// What is wrong with it, and where.
    pub(crate) found: Found,
    pub(crate) offset: u64,
    /// Valid records kept: before the first damaged stretch, and after it.
    pub(crate) kept_before: usize,
    pub(crate) kept_after: usize,
    /// The damaged stretches dropped: `(offset, bytes)`.
    pub(crate) dropped: Vec<(u64, u64)>,
    /// Bytes after the last valid record that are no record (a torn write), dropped too.
    pub(crate) torn_tail: u64,
    /// Where the original is kept (set once applied).
    pub(crate) kept_as: Option<PathBuf>,
}

/// What a repair does besides rewriting a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mend {
    /// A journal that was gone, written again with no record.
    Journal(PathBuf),
    /// A network's books that were gone, no longer named by the marker.
    Forgotten(String),
    /// The marker, written again from the files there.
    Marker(PathBuf),
}

/// What a repair of a state dir does (or did).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    pub(crate) state_dir: PathBuf,
    pub(crate) files: Vec<FileRepair>,
    pub(crate) mends: Vec<Mend>,
    pub(crate) applied: bool,
}

/// The bytes of `bytes` a repair keeps: every valid record from `start`, in order.
fn kept_records(bytes: &[u8], start: u64, good: u64, damage: &[Stretch]) -> Vec<u8> {
    let mut kept = Vec::with_capacity(good as usize);
    let mut at = start as usize;
    for stretch in damage {
        kept.extend_from_slice(&bytes[at..stretch.offset as usize]);
        at = (stretch.offset + stretch.len) as usize;
    }
    kept.extend_from_slice(&bytes[at.min(good as usize)..good as usize]);
    kept
}

/// What a repair of `state_dir` would do; with `apply`, do it. Applying takes the ledger's
/// lock (no `serve` may run on the dir meanwhile). Only what is refused is touched.
pub fn repair(state_dir: &Path, apply: bool) -> Result<Repair, LedgerError> {
    if !state_dir.is_dir() {
        return Err(LedgerError::Storage(format!(
            "{} is not a directory (give the --state-dir of `ip-webhook serve`)",
            state_dir.display()
        )));
    }
    // as `serve` does: no server may write the dir while it is repaired
    let busy = "stop the ip-webhook that uses this --state-dir first";
    let _lock = if apply {
        Some(super::lock_state_dir(state_dir, busy)?)
    } else {
        None
    };
    let survey = load::survey(state_dir, |_, _| {})?;
    let mut repair = Repair {
        state_dir: state_dir.to_path_buf(),
        files: Vec::new(),
        mends: Vec::new(),
        applied: apply,
    };
    let mut done: Vec<Fix> = Vec::new();
    for problem in survey.problems {
        if done.contains(&problem.fix) {
            continue;
        }
        done.push(problem.fix.clone());
        match (problem.fix, problem.refusal) {
            (Fix::None, refusal) => return Err(refusal),
            (Fix::Rewrite { path, named }, LedgerError::Damaged(damage)) => {
                let found = (damage.found, damage.offset);
                repair
                    .files
                    .push(rewrite_file(state_dir, &path, named, found, apply)?)
            }
            (Fix::Rewrite { .. }, refusal) => return Err(refusal),
            (Fix::CreateJournal(generation), _) => {
                let path = state_dir.join(name(JOURNAL, generation));
                if apply {
                    let head = empty_journal(state_dir, generation, 0);
                    write_new(state_dir, &path, &head)?;
                }
                repair.mends.push(Mend::Journal(path));
            }
            (Fix::ForgetBooks(book), _) => {
                if apply {
                    let mut kept = marker::read(state_dir)?.unwrap_or_else(Marker::new);
                    kept.books.retain(|b| *b != book);
                    marker::write(state_dir, &kept)?;
                }
                repair.mends.push(Mend::Forgotten(book));
            }
            (Fix::WriteMarker, _) => {
                if apply {
                    let mut kept = Marker::new();
                    kept.books = marker::books_present(state_dir);
                    marker::write(state_dir, &kept)?;
                }
                repair
                    .mends
                    .push(Mend::Marker(state_dir.join(marker::MARKER)));
            }
        }
    }
    Ok(repair)
}

/// The first bytes of journal `generation` of `state_dir`, with `records` bytes of records to
/// follow: its mark names them all and, when journal `generation + 1` is there, that it follows.
fn empty_journal(state_dir: &Path, generation: u64, records: u64) -> Vec<u8> {
    let next = generation + 1;
    let sealed = state_dir.join(name(JOURNAL, next)).exists();
    journal_head(
        generation,
        Mark {
            seq: 1,
            acknowledged: Kind::Journal.records_start() + records,
            next: if sealed { next } else { 0 },
        },
    )
}

/// What rewriting the damaged file at `path` keeps and loses; with `apply`, the rewrite.
fn rewrite_file(
    state_dir: &Path,
    path: &Path,
    named: Named,
    (found, offset): (Found, u64),
    apply: bool,
) -> Result<FileRepair, LedgerError> {
    let bytes = std::fs::read(path)
        .map_err(|e| LedgerError::Storage(format!("cannot read {}: {e}", path.display())))?;
    let scan = scan_bytes(path, named, &bytes)?;
    let after = scan.records_after_damage();
    let torn_tail = if scan.torn {
        bytes[scan.good as usize..]
            .iter()
            .rposition(|&b| b != 0)
            .map_or(0, |last| last as u64 + 1)
    } else {
        0
    };
    let mut repair = FileRepair {
        path: path.to_path_buf(),
        found,
        offset,
        kept_before: scan.records - after,
        kept_after: after,
        dropped: scan.damage.iter().map(|d| (d.offset, d.len)).collect(),
        torn_tail,
        kept_as: None,
    };
    if apply {
        let start = named.kind.records_start();
        let records = kept_records(&bytes, start, scan.good, &scan.damage);
        let mut kept = match named.kind {
            Kind::Journal => empty_journal(state_dir, named.generation, records.len() as u64),
            Kind::Snapshot => Header {
                kind: Kind::Snapshot,
                generation: named.generation,
                records: scan.records as u64,
                end: FIXED_LEN + records.len() as u64,
            }
            .encode()
            .to_vec(),
        };
        kept.extend_from_slice(&records);
        repair.kept_as = Some(rewrite(state_dir, path, &bytes, &kept)?);
    }
    Ok(repair)
}

/// Create `path` with `bytes` (it must not exist), synced, and the directory synced.
fn write_new(state_dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), LedgerError> {
    let mut file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(path)
        .map_err(|e| LedgerError::Storage(format!("cannot create {}: {e}", path.display())))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| LedgerError::Storage(format!("cannot write {}: {e}", path.display())))?;
    File::open(state_dir)
        .and_then(|d| d.sync_all())
        .map_err(storage("sync state dir"))
}

/// Keep `original` as `<path>.damaged-<unix seconds>`, then replace `path` by `kept` (temp
/// file, fsync, rename, directory fsync): a crash leaves either file whole.
fn rewrite(
    state_dir: &Path,
    path: &Path,
    original: &[u8],
    kept: &[u8],
) -> Result<PathBuf, LedgerError> {
    let file_name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let copy = state_dir.join(format!("{file_name}.damaged-{}", crate::unix_now()));
    write_new(state_dir, &copy, original)?;
    let tmp = state_dir.join(format!("{file_name}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    write_new(state_dir, &tmp, kept)?;
    std::fs::rename(&tmp, path).map_err(storage("rename the repaired file"))?;
    File::open(state_dir)
        .and_then(|d| d.sync_all())
        .map_err(storage("sync state dir"))?;
    Ok(copy)
}

/// What a repair loses of a file, said in a line.
fn lost_line(file: &FileRepair) -> String {
    match &file.found {
        Found::Stretch { .. } => {
            let lost: u64 = file.dropped.iter().map(|(_, len)| len).sum();
            let stretches: Vec<String> = file
                .dropped
                .iter()
                .map(|(at, len)| format!("{len} byte(s) at byte {at}"))
                .collect();
            format!(
                "{lost} damaged byte(s) ({}); the records there cannot be read, so which IPs they recorded is unknown",
                stretches.join(", ")
            )
        }
        Found::Lost { acknowledged } => format!(
            "the answered records from byte {} to byte {acknowledged}, which are gone from the disk; which IPs they recorded is unknown",
            file.offset
        ),
        Found::Cut { end, records } => format!(
            "the snapshot's records after byte {} (its header says {records} record(s) up to byte {end}); which IPs they recorded is unknown",
            file.offset
        ),
        Found::Header(why) => format!(
            "its header ({why}); it is written again, and every valid record after it is kept"
        ),
    }
}

impl fmt::Display for Repair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.files.is_empty() && self.mends.is_empty() {
            return writeln!(
                f,
                "No damage found in the ledger of {}: nothing to repair.",
                self.state_dir.display()
            );
        }
        for file in &self.files {
            writeln!(f, "{}:", file.path.display())?;
            writeln!(
                f,
                "  kept: {} valid record(s) before the damage and {} after it",
                file.kept_before, file.kept_after
            )?;
            writeln!(f, "  lost: {}", lost_line(file))?;
            if file.torn_tail > 0 {
                writeln!(
                    f,
                    "  also dropped: {} byte(s) of a torn write after the last valid record (never answered)",
                    file.torn_tail
                )?;
            }
            if let Some(copy) = &file.kept_as {
                writeln!(f, "  the original is kept as {}", copy.display())?;
            }
        }
        for mend in &self.mends {
            match mend {
                Mend::Journal(path) => writeln!(
                    f,
                    "{}: gone; written again with no record (the records it held are lost)",
                    path.display()
                )?,
                Mend::Forgotten(book) => writeln!(
                    f,
                    "{}: the books of network {book} are gone; the marker no longer names them (their claims are lost)",
                    self.state_dir.join(marker::NETWORKS).join(book).display()
                )?,
                Mend::Marker(path) => writeln!(
                    f,
                    "{}: damaged; written again from the files there",
                    path.display()
                )?,
            }
        }
        if self.applied {
            writeln!(
                f,
                "Repaired. An IP whose last record was lost shows its previous record or none: compare the claims with the cluster (`ip-webhook check --drift --state-dir {}`) before admitting pods.",
                self.state_dir.display()
            )
        } else {
            writeln!(
                f,
                "Dry run: nothing was changed. Run again with --apply to repair (the originals are kept)."
            )
        }
    }
}
