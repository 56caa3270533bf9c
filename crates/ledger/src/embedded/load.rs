//! The one way a state dir's embedded ledger is read, and everything it checks. `serve` opens
//! the ledger through [`survey`] (and then makes the writes only a writer makes: a torn tail
//! cut, a journal a crash left without its header or its seal mended), every reading command
//! (`status`, `explain`, `check --drift`, `release` without `--apply`, `review --dry-run`)
//! reads it through [`survey`] and writes nothing, and `ledger repair` lists and mends what it
//! finds.
//! So each refuses the same damage, with the same message.
//!
//! What must hold, with why each holds after any crash (`docs/ledgers.md` has the table of
//! damage against what is done):
//! - the newest snapshot is whole: its header's record count and length match its records
//!   (it is written, synced, then renamed into place);
//! - every journal from the snapshot's generation (or 1) to the last one is there, and a
//!   journal whose mark says it was closed names the next one, which is there (journal `N+1`
//!   is created and synced before `N` is closed, and `N` before snapshot `N+1` is written);
//! - each journal's header is whole, and its records reach its acknowledgement mark (the mark
//!   is written only after the records it names are synced); only the last journal may end
//!   inside its header, when its predecessor was not closed yet (a crash while creating it),
//!   or when it is the first journal of a dir that has no marker yet;
//! - no journal or snapshot has damage with valid records after it;
//! - the marker is whole, and each network's books it names hold a ledger.

use std::path::{Path, PathBuf};

use super::marker::{self, Marker};
use super::{JOURNAL, SNAPSHOT, generations, name};
use crate::record::{Kind, Mark, Named, Scan, Stretch, scan_file};
use crate::{Claim, Damage, Found, LedgerError};

/// A problem [`survey`] found: the refusal `serve` and every reading command give, and what
/// `ledger repair --apply` does about it.
pub(super) struct Problem {
    pub(super) refusal: LedgerError,
    pub(super) fix: Fix,
}

/// What a repair does about a [`Problem`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fix {
    /// Rewrite the file with its valid records (its header and mark written again).
    Rewrite { path: PathBuf, named: Named },
    /// Write the journal of this generation again, empty.
    CreateJournal(u64),
    /// Remove this network's books from the marker.
    ForgetBooks(String),
    /// Write the marker again from the files there.
    WriteMarker,
    /// Nothing a repair can do: only a backup brings the records back.
    None,
}

/// A journal as [`survey`] found it.
#[derive(Debug, Clone)]
pub(super) struct JournalFile {
    pub(super) generation: u64,
    /// Where its valid records end.
    pub(super) good: u64,
    /// Bytes other than zeros follow its records (a write a crash cut short).
    pub(super) torn: bool,
    /// Its newest whole mark; `None` when it ends inside its header.
    pub(super) mark: Option<Mark>,
}

/// What [`survey`] found in a state dir.
pub(super) struct Survey {
    /// The newest snapshot's generation (0: none).
    pub(super) base: u64,
    /// The journals from `base` on, in order.
    pub(super) journals: Vec<JournalFile>,
    pub(super) problems: Vec<Problem>,
    /// The marker, when it is there and whole.
    pub(super) marker: Option<Marker>,
}

impl Survey {
    /// The first problem's refusal, if any.
    pub(super) fn refusal(self) -> Result<Survey, LedgerError> {
        match self.problems.into_iter().next() {
            Some(problem) => Err(problem.refusal),
            None => Ok(Survey {
                problems: Vec::new(),
                ..self
            }),
        }
    }
}

/// The file of `kind` and `generation`, and its name.
fn file_of(dir: &Path, kind: Kind, generation: u64) -> (PathBuf, Named) {
    let prefix = match kind {
        Kind::Journal => JOURNAL,
        Kind::Snapshot => SNAPSHOT,
    };
    (
        dir.join(name(prefix, generation)),
        Named { kind, generation },
    )
}

fn damaged(dir: &Path, path: &Path, named: Named, offset: u64, found: Found) -> Problem {
    Problem {
        refusal: LedgerError::Damaged(Box::new(Damage {
            path: path.to_path_buf(),
            state_dir: dir.to_path_buf(),
            offset,
            found,
        })),
        fix: Fix::Rewrite {
            path: path.to_path_buf(),
            named,
        },
    }
}

/// The problem of a file with damage that valid records follow.
fn stretches(dir: &Path, path: &Path, named: Named, scan: &Scan) -> Problem {
    let first: &Stretch = &scan.damage[0];
    damaged(
        dir,
        path,
        named,
        first.offset,
        Found::Stretch {
            records_after: scan.records_after_damage(),
            stretches: scan.damage.len(),
            damaged_bytes: scan.damage.iter().map(|d| d.len).sum(),
        },
    )
}

/// Read every file of the ledger in `dir`, handing each claim (with the size of its record) to
/// `each` in the order a reopen applies them, and check what must hold (module docs). Writes
/// nothing. An `Err` is a file that cannot be read at all (or a record whose checksum holds
/// and whose claim does not decode); what is damaged or gone is in [`Survey::problems`].
pub(super) fn survey(dir: &Path, mut each: impl FnMut(Claim, u64)) -> Result<Survey, LedgerError> {
    let snapshots = generations(dir, SNAPSHOT)?;
    let mut found = generations(dir, JOURNAL)?;
    let mut survey = Survey {
        base: snapshots.last().copied().unwrap_or(0),
        journals: Vec::new(),
        problems: Vec::new(),
        marker: None,
    };
    match marker::read(dir) {
        Ok(read) => survey.marker = read,
        Err(refusal) => survey.problems.push(Problem {
            refusal,
            fix: Fix::WriteMarker,
        }),
    }
    if snapshots.is_empty() && found.is_empty() {
        let signs = marker::signs(dir);
        if !signs.is_empty() {
            survey.problems.push(Problem {
                refusal: marker::missing(dir, &signs),
                fix: Fix::None,
            });
        }
        return Ok(survey);
    }
    found.retain(|g| *g >= survey.base);
    if let Some(problem) = gap(dir, survey.base, &found) {
        survey.problems.push(problem);
    }
    if survey.base > 0 {
        let (path, named) = file_of(dir, Kind::Snapshot, survey.base);
        let scan = scan_file(&path, named, &mut each)?;
        survey
            .problems
            .extend(check_snapshot(dir, &path, named, &scan));
    }
    for (i, &generation) in found.iter().enumerate() {
        let (path, named) = file_of(dir, Kind::Journal, generation);
        let scan = scan_file(&path, named, &mut each)?;
        let may_be_headless = i + 1 == found.len() && may_be_headless(&survey, generation);
        let (file, problem) = check_journal(dir, &path, named, &scan, may_be_headless);
        survey.problems.extend(problem);
        survey.journals.push(file);
    }
    survey
        .problems
        .extend(successors_gone(dir, &survey.journals));
    if let Some(marker) = &survey.marker {
        for book in &marker.books {
            if !super::exists_in(&dir.join(marker::NETWORKS).join(book)) {
                survey.problems.push(Problem {
                    refusal: marker::books_gone(dir, book),
                    fix: Fix::ForgetBooks(book.clone()),
                });
            }
        }
    }
    Ok(survey)
}

/// The journal a ledger of snapshot `base` (0: none) and `journals` (from `base` on) lacks, if
/// one is gone. Journal `g` is made durable before snapshot `g` is written, and journals are
/// deleted only below a durable snapshot; the first journal of a dir is 1. So from the snapshot
/// (or 1) to the last journal every generation is there; a gap is records lost, not a crash.
fn missing_generation(base: u64, journals: &[u64]) -> Option<u64> {
    let first = base.max(1);
    let Some(&last) = journals.last() else {
        return (base > 0).then_some(base);
    };
    (first.min(journals[0])..=last).find(|g| journals.binary_search(g).is_err())
}

fn gap(dir: &Path, base: u64, journals: &[u64]) -> Option<Problem> {
    let gone = missing_generation(base, journals)?;
    let first = journals.first().copied();
    let snapshot_gone = base == 0 && first.is_some_and(|first| first > gone);
    Some(Problem {
        refusal: marker::journal_gone(dir, base, gone, first),
        fix: if snapshot_gone {
            Fix::None
        } else {
            Fix::CreateJournal(gone)
        },
    })
}

/// Whether journal `generation`, the last one, may end inside its header: a crash while it
/// was created (its predecessor is there and not closed yet), or the first journal of a dir
/// that has no marker yet (a crash before the marker was written, which follows it).
fn may_be_headless(survey: &Survey, generation: u64) -> bool {
    if generation <= survey.base {
        return false;
    }
    match survey.journals.last() {
        Some(previous) => previous.mark.is_some_and(|mark| mark.next == 0),
        None => {
            generation == 1
                && survey.marker.is_none()
                && !survey.problems.iter().any(|p| p.fix == Fix::WriteMarker)
        }
    }
}

fn check_snapshot(dir: &Path, path: &Path, named: Named, scan: &Scan) -> Option<Problem> {
    let header = match &scan.header {
        Err(fault) => {
            let found = Found::Header(fault.reason.clone());
            return Some(damaged(dir, path, named, fault.offset, found));
        }
        Ok(header) => header,
    };
    if !scan.damage.is_empty() {
        return Some(stretches(dir, path, named, scan));
    }
    let cut = Found::Cut {
        end: header.end,
        records: header.records,
    };
    if scan.good < header.end {
        return Some(damaged(dir, path, named, scan.good, cut));
    }
    let whole = scan.len == header.end && scan.records as u64 == header.records;
    (!whole).then(|| damaged(dir, path, named, header.end, cut))
}

fn check_journal(
    dir: &Path,
    path: &Path,
    named: Named,
    scan: &Scan,
    may_be_headless: bool,
) -> (JournalFile, Option<Problem>) {
    let mut file = JournalFile {
        generation: named.generation,
        good: scan.good,
        torn: scan.torn,
        mark: None,
    };
    let problem = match (&scan.header, &scan.mark) {
        (Err(_), _) if may_be_headless && scan.len < Kind::Journal.records_start() => None,
        (Err(fault), _) | (Ok(_), Some(Err(fault))) => Some(damaged(
            dir,
            path,
            named,
            fault.offset,
            Found::Header(fault.reason.clone()),
        )),
        (Ok(_), Some(Ok(mark))) => {
            file.mark = Some(*mark);
            if !scan.damage.is_empty() {
                Some(stretches(dir, path, named, scan))
            } else if scan.good < mark.acknowledged {
                let lost = Found::Lost {
                    acknowledged: mark.acknowledged,
                };
                Some(damaged(dir, path, named, scan.good, lost))
            } else {
                None
            }
        }
        (Ok(_), None) => unreachable!("a journal's whole header holds its marks"),
    };
    (file, problem)
}

/// The journals that a closed journal names as its successor and that are gone (the last
/// journal, deleted: no gap shows it).
fn successors_gone(dir: &Path, journals: &[JournalFile]) -> Vec<Problem> {
    journals
        .iter()
        .filter_map(|file| file.mark.filter(|mark| mark.next != 0))
        .filter(|mark| !journals.iter().any(|j| j.generation == mark.next))
        .map(|mark| Problem {
            refusal: marker::journal_gone(dir, 0, mark.next, None),
            fix: Fix::CreateJournal(mark.next),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_between_the_snapshot_and_the_last_journal_is_found() {
        assert_eq!(missing_generation(0, &[1, 2, 3]), None);
        assert_eq!(missing_generation(0, &[1, 3]), Some(2));
        assert_eq!(missing_generation(0, &[2, 3]), Some(1));
        assert_eq!(missing_generation(4, &[4, 5]), None);
        assert_eq!(missing_generation(4, &[5]), Some(4));
        assert_eq!(missing_generation(4, &[]), Some(4));
        assert_eq!(missing_generation(0, &[]), None);
    }
}
