//! The writes only a writer's open makes, after [`load::survey`] read the ledger as every
//! command reads it: the lock taken, files a crash left unfinished removed, the last journal's
//! torn tail cut (or its header written, when a crash cut its creation short), a journal a
//! crash left unsealed sealed, and the marker written. A reading command makes none of them.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::super::load::{self, Survey};
use super::super::marker::{self, MARKER, Marker};
use super::super::{JOURNAL, SNAPSHOT, name, storage, storage_at};
use super::sync_dir;
use crate::LedgerError;
use crate::record::{JOURNAL_START, Mark, new_journal};

/// The mark of a journal with no record yet.
pub(super) fn first_mark() -> Mark {
    Mark {
        seq: 1,
        acknowledged: JOURNAL_START,
        next: 0,
    }
}

/// Remove the ledger's `*.tmp` files from the state dir: a snapshot, a repaired journal or
/// snapshot, or a marker whose writing a crash interrupted (each is renamed into place only
/// once whole and synced). Other files' (the self-signed CA's) are not the ledger's to remove.
pub(super) fn remove_unfinished(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let ours = [JOURNAL, SNAPSHOT, MARKER];
    for entry in entries.flatten() {
        let is_tmp = entry.file_name().to_str().is_some_and(|n| {
            n.ends_with(".tmp") && ours.iter().any(|prefix| n.starts_with(prefix))
        });
        if is_tmp && entry.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Create journal `generation`, its header and marks written and synced, and the directory
/// synced; a file left by a failed attempt is removed.
pub(in crate::embedded) fn create_journal(
    dir: &Path,
    generation: u64,
) -> Result<File, LedgerError> {
    let path = dir.join(name(JOURNAL, generation));
    let mut file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)
        .map_err(storage_at("create the journal", &path))?;
    if let Err(error) = file
        .write_all(&new_journal(generation))
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

/// The journal the next records go to.
pub(super) struct Tail {
    pub(super) file: File,
    pub(super) generation: u64,
    /// Where its next record goes.
    pub(super) end: u64,
    pub(super) mark: Mark,
}

/// The last journal, opened after its last whole record: a torn tail cut off (a commit a crash
/// cut short, never answered: [`load::survey`] refused records lost before its mark), a header
/// a crash cut short written again, its predecessor sealed if a crash left it open. A new
/// journal when there is none.
pub(super) fn open_tail(dir: &Path, survey: &Survey) -> Result<Tail, LedgerError> {
    let Some(last) = survey.journals.last() else {
        let generation = survey.base.max(1);
        let file = create_journal(dir, generation)?;
        return Ok(Tail {
            file,
            generation,
            end: JOURNAL_START,
            mark: first_mark(),
        });
    };
    let path = dir.join(name(JOURNAL, last.generation));
    let file = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(storage_at("open the journal", &path))?;
    let mark = match last.mark {
        None => {
            tracing::warn!(path = %path.display(), "writing the header of a journal whose creation a crash cut short");
            file.set_len(0)
                .and_then(|()| file.write_all_at(&new_journal(last.generation), 0))
                .and_then(|()| file.sync_all())
                .map_err(storage_at("write the header of", &path))?;
            first_mark()
        }
        Some(mark) => {
            if last.torn {
                tracing::warn!(path = %path.display(), kept = last.good, "cutting a torn record off the journal");
                file.set_len(last.good)
                    .and_then(|()| file.sync_all())
                    .map_err(storage_at("cut the torn tail of", &path))?;
            }
            mark
        }
    };
    if let [.., previous, _] = &survey.journals[..] {
        seal_left_open(dir, previous, last.generation)?;
    }
    Ok(Tail {
        file,
        generation: last.generation,
        end: last.good.max(JOURNAL_START),
        mark,
    })
}

/// Seal `previous`, which journal `next` follows, when a crash left it open (its seal not
/// yet on the disk), so that `next` gone is noticed from now on.
fn seal_left_open(dir: &Path, previous: &load::JournalFile, next: u64) -> Result<(), LedgerError> {
    let Some(mark) = previous.mark.filter(|mark| mark.next == 0) else {
        return Ok(());
    };
    let path = dir.join(name(JOURNAL, previous.generation));
    let seal = Mark {
        seq: mark.seq + 1,
        acknowledged: previous.good,
        next,
    };
    OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|file| {
            file.write_all_at(&seal.encode(), seal.slot())?;
            file.sync_data()
        })
        .map_err(storage_at("seal the journal", &path))
}

/// Write the marker when it is not there, or when `networks/` holds books it does not name
/// (after the first journal exists: a crash in between leaves a journal and no marker, which
/// this mends). A marker that cannot be written is said (WARN); the ledger opens anyway.
pub(super) fn keep_marker(dir: &Path, found: Option<&Marker>) {
    let present = marker::books_present(dir);
    let mut kept = found.cloned().unwrap_or_else(Marker::new);
    let missing: Vec<String> = present
        .into_iter()
        .filter(|book| !kept.books.contains(book))
        .collect();
    if found.is_some() && missing.is_empty() {
        return;
    }
    kept.books.extend(missing);
    kept.books.sort();
    if let Err(error) = marker::write(dir, &kept) {
        tracing::warn!(%error, "cannot write the ledger's marker file; a lost journal would then not be noticed");
    }
}
