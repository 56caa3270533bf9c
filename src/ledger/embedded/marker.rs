//! Whether a state dir has held a ledger. The marker `ledger.id` is written once the first
//! journal of a dir exists (and on the first open of a dir whose ledger is older than the
//! marker); a dir that has it, or another file only a ledger leaves, and no journal or snapshot
//! lost its ledger: starting it empty would hand out again the IPs running pods hold.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use super::{LOCK_FILE, REDB_FILE, storage, storage_at};
use crate::ledger::LedgerError;

/// The marker's file name.
pub(super) const MARKER: &str = "ledger.id";

/// The files in `dir` that say a ledger was kept there: the marker, the lock file (when it was
/// there before this open: every release creates it when it opens a ledger), a migrated redb
/// file, the copies a repair keeps.
pub(super) fn signs(dir: &Path, lock_existed: bool) -> Vec<String> {
    let mut found = Vec::new();
    if dir.join(MARKER).exists() {
        found.push(MARKER.to_string());
    }
    if lock_existed {
        found.push(LOCK_FILE.to_string());
    }
    let migrated = format!("{REDB_FILE}.migrated");
    if dir.join(&migrated).exists() {
        found.push(migrated);
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        let mut copies: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|name| name.contains(".damaged-"))
            .collect();
        copies.sort();
        found.extend(copies);
    }
    found
}

/// The refusal for a dir that held a ledger and has no journal or snapshot.
pub(super) fn missing(dir: &Path, signs: &[String]) -> LedgerError {
    LedgerError::Missing(format!(
        "{} held a ledger ({} there) but has no journal (journal.*) or snapshot (snapshot.*) file: refusing to start an empty ledger, which would hand out again the IPs running pods hold. Restore the files from a backup; to start an empty ledger on purpose, remove {} first",
        dir.display(),
        signs.join(", "),
        signs.join(" and ")
    ))
}

/// Write the marker, unless it is there: temp file, fsync, rename, directory fsync.
pub(super) fn ensure(dir: &Path) -> Result<(), LedgerError> {
    let path = dir.join(MARKER);
    if path.exists() {
        return Ok(());
    }
    let tmp = dir.join(format!("{MARKER}.tmp"));
    let mut file = File::create(&tmp).map_err(storage_at("create", &tmp))?;
    let created = crate::ledger::unix_now();
    writeln!(
        file,
        "ip-webhook embedded ledger\ncreated {}\n",
        k8s_openapi::jiff::Timestamp::from_second(created as i64)
            .map(|t| t.to_string())
            .unwrap_or_else(|_| created.to_string())
    )
    .and_then(|()| file.sync_all())
    .map_err(storage("write ledger.id"))?;
    drop(file);
    std::fs::rename(&tmp, &path).map_err(storage("rename ledger.id"))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(storage("sync state dir"))
}

/// The refusal for a ledger one of whose journals (or the snapshot its journals follow) is
/// gone: the records in it are lost, and starting without them would hand out again the IPs
/// they recorded. `first` is the first journal there.
pub(super) fn journal_gone(dir: &Path, base: u64, gone: u64, first: Option<u64>) -> LedgerError {
    let journal = dir.join(super::name(super::JOURNAL, gone));
    let refusing = "Refusing to start without those records, which would hand out again the IPs running pods hold";
    let detail = match first {
        Some(first) if base == 0 && first > gone => format!(
            "its journals start at {} and the snapshot they follow (snapshot.*) is gone. {refusing}. Restore the snapshot from a backup",
            super::name(super::JOURNAL, first)
        ),
        _ => {
            let what = if base > 0 {
                format!(
                    "{} is there, but {}, which holds the records written after it, is gone",
                    super::name(super::SNAPSHOT, base),
                    journal.display()
                )
            } else {
                format!("{} is gone", journal.display())
            };
            format!(
                "{what}. {refusing}. Restore it from a backup; to go on without its records on purpose, create it empty (`touch {}`)",
                journal.display()
            )
        }
    };
    LedgerError::Missing(format!(
        "{} holds an incomplete ledger: {detail}",
        dir.display()
    ))
}
