//! The journal's room: the synced zeros records are written into, how it grows, and what a
//! full disk or a failed write does (commits go on in the room made; a commit that needs more
//! is refused at once; growth and the recovery of a failed write are retried with backoff,
//! also from the prober's ping, so the ledger resumes by itself once space returns).

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use super::{GROW_STEP, Journal, ROOM_LOW, ZEROS};
use crate::LedgerError;

impl Journal {
    /// The error of a failed write: [`LedgerError::DiskFull`] when it was for lack of space.
    pub(super) fn io_error(&self, context: &str, error: &std::io::Error) -> LedgerError {
        self.error_of(error.kind(), context, &error.to_string())
    }

    fn error_of(&self, kind: std::io::ErrorKind, context: &str, error: &str) -> LedgerError {
        if no_space_kind(kind) {
            LedgerError::DiskFull {
                dir: self.dir.display().to_string(),
                error: error.to_string(),
            }
        } else {
            LedgerError::Storage(format!("{context}: {error}; the journal retries by itself"))
        }
    }

    pub(super) fn full_error(&self) -> LedgerError {
        let error = self.full.as_ref().map_or_else(
            || "no room".to_string(),
            |full| {
                format!(
                    "{}; {} bytes of room left",
                    full.error,
                    self.allocated - self.end
                )
            },
        );
        LedgerError::DiskFull {
            dir: self.dir.display().to_string(),
            error,
        }
    }

    /// After a failed write: write zeros over the bytes it may have left and sync them, when
    /// the backoff allows; until that succeeds every commit fails at once.
    pub(super) fn recover(&mut self) -> Result<(), LedgerError> {
        let Some((stalled, dirty_to)) = &mut self.poisoned else {
            return Ok(());
        };
        let dirty_to = *dirty_to;
        if !stalled.may_retry() {
            let (kind, error) = (stalled.kind, stalled.error.clone());
            return Err(self.error_of(kind, "the journal stopped after a failed write", &error));
        }
        let mut at = self.end;
        let zeroed = (|| {
            while at < dirty_to {
                let piece = (dirty_to - at).min(ZEROS.len() as u64);
                self.file.write_all_at(&ZEROS[..piece as usize], at)?;
                at += piece;
            }
            self.file.sync_data()
        })();
        match zeroed {
            Ok(()) => {
                tracing::info!(dir = %self.dir.display(), "the journal's tail is known again; writes resume");
                self.poisoned = None;
                Ok(())
            }
            Err(e) => {
                if let Some((stalled, _)) = &mut self.poisoned {
                    stalled.failed_again(&e);
                }
                Err(self.io_error("the journal stopped after a failed write", &e))
            }
        }
    }

    /// Grow the room until `len` more bytes fit, unless the disk was found full less than a
    /// backoff ago; `Ok` once they fit, also when the disk filled up before the growth reached
    /// its [`GROW_STEP`] boundary. Notes a full disk (WARN, gauge) and its end (INFO).
    pub(super) fn try_grow(&mut self, len: u64) -> Result<(), LedgerError> {
        if self.full.as_ref().is_some_and(|full| !full.may_retry()) {
            return Err(self.full_error());
        }
        match self.make_room(len) {
            Ok(()) => {
                if self.full.take().is_some() {
                    self.disk_full.set(0);
                    tracing::info!(dir = %self.dir.display(), "the ledger's disk has room again; the journal grows again");
                }
                Ok(())
            }
            Err(e) => {
                match &mut self.full {
                    Some(full) => full.failed_again(&e),
                    None => {
                        tracing::warn!(
                            dir = %self.dir.display(),
                            error = %e,
                            room_left = self.allocated - self.end,
                            "the ledger cannot make room for new records (is its disk full?); commits go on in the room left, then are refused until space is freed"
                        );
                        if no_space(&e) {
                            self.disk_full.set(1);
                        }
                        self.full = Some(Stalled::new(&e));
                    }
                }
                if self.end + len <= self.allocated {
                    Ok(())
                } else {
                    Err(self.io_error("growing the journal", &e))
                }
            }
        }
    }

    /// Grow the file with synced zeros, up to a [`GROW_STEP`] boundary, until `len` more
    /// bytes fit after `end`. A commit calls it only for a batch larger than the room
    /// [`Journal::grow_ahead`] left. When the disk fills up on the way, the zeros written
    /// before are synced and kept as room.
    fn make_room(&mut self, len: u64) -> std::io::Result<()> {
        if self.end + len <= self.allocated {
            return Ok(());
        }
        let target = (self.end + len).next_multiple_of(GROW_STEP);
        let mut at = self.allocated;
        let written = (|| {
            while at < target {
                let piece = (target - at).min(ZEROS.len() as u64);
                #[cfg(test)]
                if self.space.is_some_and(|space| at + piece > space) {
                    return Err(std::io::Error::from(std::io::ErrorKind::StorageFull));
                }
                self.file.write_all_at(&ZEROS[..piece as usize], at)?;
                at += piece;
            }
            Ok(())
        })();
        let synced = if at > self.allocated {
            self.file.sync_data()
        } else {
            Ok(())
        };
        if synced.is_ok() {
            self.allocated = at;
        }
        written.and(synced)
    }

    /// After a commit has answered: when less than [`ROOM_LOW`] is left, make that much room
    /// now, while no batch waits on it: one [`GROW_STEP`] after a batch smaller than a step. A failure (a full disk) leaves the room as it is:
    /// commits go on in it.
    pub(in crate::embedded) fn grow_ahead(&mut self) {
        if self.poisoned.is_none() && self.end + ROOM_LOW > self.allocated {
            let (started, from) = (Instant::now(), self.allocated);
            let _ = self.try_grow(ROOM_LOW);
            if started.elapsed() >= crate::embedded::SLOW {
                tracing::warn!(
                    bytes = self.allocated - from,
                    took_us = started.elapsed().as_micros() as u64,
                    "slow journal growth: zeros written and synced ahead of the records"
                );
            }
        }
    }

    /// Whether the journal takes commits: after a failed write or a commit refused for lack
    /// of room, the retry is made here too (the prober pings every second), so the ledger
    /// resumes with no admission needed to find out.
    pub(in crate::embedded) fn ping(&mut self) -> Result<(), LedgerError> {
        self.recover()?;
        if let Some(len) = self.refusing {
            self.try_grow(len)?;
            self.refusing = None;
        }
        Ok(())
    }
}

/// Whether `error` says the file system (or the quota) has no space left.
fn no_space(error: &std::io::Error) -> bool {
    no_space_kind(error.kind())
}

fn no_space_kind(kind: std::io::ErrorKind) -> bool {
    matches!(
        kind,
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// A failure that is retried with backoff: 100 ms after the first, doubling up to 5 s.
pub(super) struct Stalled {
    kind: std::io::ErrorKind,
    error: String,
    next_try: Instant,
    backoff: Duration,
}

impl Stalled {
    const FIRST: Duration = Duration::from_millis(100);
    const MOST: Duration = Duration::from_secs(5);

    pub(super) fn new(error: &std::io::Error) -> Stalled {
        Stalled {
            kind: error.kind(),
            error: error.to_string(),
            next_try: Instant::now() + Stalled::FIRST,
            backoff: Stalled::FIRST,
        }
    }

    fn may_retry(&self) -> bool {
        Instant::now() >= self.next_try
    }

    fn failed_again(&mut self, error: &std::io::Error) {
        self.kind = error.kind();
        self.error = error.to_string();
        self.backoff = (self.backoff * 2).min(Stalled::MOST);
        self.next_try = Instant::now() + self.backoff;
    }
}
