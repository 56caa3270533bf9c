//! `ip-webhook ledger repair`: what a repair of a damaged journal or snapshot keeps and loses,
//! and the repair itself. A file is damaged when a stretch of it is no valid record and valid
//! records follow (`serve`, `status` and `review` refuse it, [`LedgerError::Damaged`]). A
//! repair keeps every valid record, before and after each damaged stretch, and drops the
//! stretches; the original file is kept beside it as `<name>.damaged-<unix seconds>`.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{JOURNAL, LOCK_FILE, SNAPSHOT, generations, name, storage, storage_at};
use crate::ledger::LedgerError;
use crate::ledger::record::{Stretch, scan_bytes};

/// One damaged file and what its repair does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRepair {
    pub path: PathBuf,
    /// Valid records kept: before the first damaged stretch, and after it.
    pub kept_before: usize,
    pub kept_after: usize,
    /// The damaged stretches dropped: `(offset, bytes)`.
    pub dropped: Vec<(u64, u64)>,
    /// Bytes after the last valid record that are no record (a torn write), dropped too.
    pub torn_tail: u64,
    /// Where the original is kept (set once applied).
    pub kept_as: Option<PathBuf>,
}

/// What a repair of a state dir does (or did).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    pub state_dir: PathBuf,
    pub files: Vec<FileRepair>,
    pub applied: bool,
}

/// The files the ledger reads: the newest snapshot and the journals from it on.
fn ledger_files(state_dir: &Path) -> Result<Vec<PathBuf>, LedgerError> {
    let snapshots = generations(state_dir, SNAPSHOT)?;
    let base = snapshots.last().copied().unwrap_or(0);
    let mut files: Vec<PathBuf> = snapshots
        .last()
        .map(|&g| state_dir.join(name(SNAPSHOT, g)))
        .into_iter()
        .collect();
    files.extend(
        generations(state_dir, JOURNAL)?
            .into_iter()
            .filter(|&g| g >= base)
            .map(|g| state_dir.join(name(JOURNAL, g))),
    );
    Ok(files)
}

/// The bytes of `bytes` a repair keeps: the magic and every valid record, in order.
fn kept_bytes(bytes: &[u8], good: u64, damage: &[Stretch]) -> Vec<u8> {
    let mut kept = Vec::with_capacity(good as usize);
    let mut at = 0usize;
    for stretch in damage {
        kept.extend_from_slice(&bytes[at..stretch.offset as usize]);
        at = (stretch.offset + stretch.len) as usize;
    }
    kept.extend_from_slice(&bytes[at..good as usize]);
    kept
}

/// What a repair of `state_dir` would do; with `apply`, do it. Applying takes the ledger's
/// lock (no `serve` may run on the dir meanwhile). Only damaged files are touched.
pub fn repair(state_dir: &Path, apply: bool) -> Result<Repair, LedgerError> {
    if !state_dir.is_dir() {
        return Err(LedgerError::Storage(format!(
            "{} is not a directory (give the --state-dir of `ip-webhook serve`)",
            state_dir.display()
        )));
    }
    let _lock = if apply {
        let path = state_dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(storage_at("open the lock file", &path))?;
        lock.try_lock().map_err(|e| {
            LedgerError::Storage(format!(
                "cannot lock {} (stop the ip-webhook that uses this --state-dir first): {e}",
                path.display()
            ))
        })?;
        Some(lock)
    } else {
        None
    };
    let mut files = Vec::new();
    for path in ledger_files(state_dir)? {
        let bytes = std::fs::read(&path)
            .map_err(|e| LedgerError::Storage(format!("cannot read {}: {e}", path.display())))?;
        let scan = scan_bytes(&path, &bytes)?;
        if scan.damage.is_empty() {
            continue;
        }
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
            path: path.clone(),
            kept_before: scan.records - after,
            kept_after: after,
            dropped: scan.damage.iter().map(|d| (d.offset, d.len)).collect(),
            torn_tail,
            kept_as: None,
        };
        if apply {
            repair.kept_as = Some(rewrite(
                state_dir,
                &path,
                &bytes,
                &kept_bytes(&bytes, scan.good, &scan.damage),
            )?);
        }
        files.push(repair);
    }
    Ok(Repair {
        state_dir: state_dir.to_path_buf(),
        files,
        applied: apply,
    })
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
    let copy = state_dir.join(format!("{file_name}.damaged-{}", crate::ledger::unix_now()));
    let write = |target: &Path, bytes: &[u8]| -> Result<(), LedgerError> {
        let mut file = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(target)
            .map_err(|e| {
                LedgerError::Storage(format!("cannot create {}: {e}", target.display()))
            })?;
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| LedgerError::Storage(format!("cannot write {}: {e}", target.display())))
    };
    write(&copy, original)?;
    let tmp = state_dir.join(format!("{file_name}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    write(&tmp, kept)?;
    std::fs::rename(&tmp, path).map_err(storage("rename the repaired file"))?;
    File::open(state_dir)
        .and_then(|d| d.sync_all())
        .map_err(storage("sync state dir"))?;
    Ok(copy)
}

impl fmt::Display for Repair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.files.is_empty() {
            return writeln!(
                f,
                "No damage found in the ledger of {}: nothing to repair.",
                self.state_dir.display()
            );
        }
        for file in &self.files {
            let lost: u64 = file.dropped.iter().map(|(_, len)| len).sum();
            writeln!(f, "{}:", file.path.display())?;
            writeln!(
                f,
                "  kept: {} valid record(s) before the damage and {} after it",
                file.kept_before, file.kept_after
            )?;
            let stretches: Vec<String> = file
                .dropped
                .iter()
                .map(|(at, len)| format!("{len} byte(s) at byte {at}"))
                .collect();
            writeln!(
                f,
                "  lost: {lost} damaged byte(s) ({}); the records there cannot be read, so which IPs they recorded is unknown",
                stretches.join(", ")
            )?;
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
