//! Whether the ledger can serve: `/readyz` turns 503 once its calls have failed for a while
//! (several in a row, or for longer than a few seconds), and 200 again after one success.
//! Calls are counted by [`super::TimedLedger`], which every admission and the prober use.
//!
//! Also the admission deadline: the ledger calls of one admission share one deadline, below
//! the API server's webhook timeout, so a slow or hanging ledger gets a clear denial in time.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Failures in a row after which the ledger counts as failing.
pub(crate) const FAILURES_IN_A_ROW: u32 = 3;
/// Time after the first of a run of failures after which the ledger counts as failing.
pub(crate) const FAILING_FOR: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
pub struct LedgerHealth {
    in_a_row: AtomicU32,
    /// When the current run of failures began.
    since: Mutex<Option<Instant>>,
    /// The ledger refuses writes because its disk is full: not ready at once, and the
    /// readiness answer says so (the message names the state dir, not the data).
    disk_full: Mutex<Option<String>>,
}

impl LedgerHealth {
    pub fn new() -> LedgerHealth {
        LedgerHealth::default()
    }

    pub(crate) fn success(&self) {
        let was = self.in_a_row.swap(0, Ordering::SeqCst);
        *self.since.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if self
            .disk_full
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .is_some()
        {
            tracing::info!("the ledger's disk has room again; ready");
        }
        if was >= FAILURES_IN_A_ROW {
            tracing::info!(failures = was, "the ledger answers again; ready");
        }
    }

    pub fn failure(&self, error: &str) {
        let in_a_row = self.in_a_row.fetch_add(1, Ordering::SeqCst) + 1;
        if in_a_row == FAILURES_IN_A_ROW {
            tracing::warn!(
                error,
                "the ledger failed {in_a_row} times in a row; /readyz answers 503 until it answers again"
            );
        }
        self.since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(Instant::now);
    }

    /// A refusal for lack of disk space (`message` is [`super::LedgerError::DiskFull`]'s): not
    /// ready until the next success.
    pub(crate) fn disk_full(&self, message: &str) {
        let mut full = self.disk_full.lock().unwrap_or_else(|p| p.into_inner());
        if full.is_none() {
            tracing::warn!(
                error = message,
                "the ledger refuses writes: its disk is full; /readyz answers 503 until it takes them again"
            );
        }
        *full = Some(message.to_string());
        drop(full);
        self.failure(message);
    }

    /// Why the ledger cannot serve now, if it cannot: a full disk and where, or counts and
    /// times only (the admin port is open to the cluster; other errors go to the log).
    pub fn failing(&self) -> Option<String> {
        self.failing_at(Instant::now())
    }

    fn failing_at(&self, now: Instant) -> Option<String> {
        if let Some(full) = &*self.disk_full.lock().unwrap_or_else(|p| p.into_inner()) {
            return Some(full.clone());
        }
        let in_a_row = self.in_a_row.load(Ordering::SeqCst);
        let since = self.since.lock().unwrap_or_else(|p| p.into_inner());
        let first = since.as_ref()?;
        let for_how_long = now.saturating_duration_since(*first);
        (in_a_row >= FAILURES_IN_A_ROW || for_how_long >= FAILING_FOR).then(|| {
            format!(
                "the ledger failed {in_a_row} times in a row over {:.1}s (the errors are in the log)",
                for_how_long.as_secs_f64()
            )
        })
    }
}

tokio::task_local! {
    static DEADLINE: Instant;
}

/// Run `future` (one admission) with every ledger call in it bounded by `deadline`.
///
/// A plain function, not an `async fn`: an `async fn` wrapper keeps its argument and the future
/// it builds from it side by side, so every wrapping level would double the admission's future
/// (kilobytes, copied on each move).
pub fn with_deadline<F: Future>(deadline: Instant, future: F) -> impl Future<Output = F::Output> {
    DEADLINE.scope(deadline, future)
}

/// The deadline of the admission being served, if any.
pub(crate) fn deadline() -> Option<Instant> {
    DEADLINE.try_with(|d| *d).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_after_three_in_a_row_or_five_seconds_and_recovers_on_success() {
        let health = LedgerHealth::new();
        assert_eq!(health.failing(), None);
        health.failure("boom 1");
        health.failure("boom 2");
        assert_eq!(health.failing(), None, "two failures are not enough");
        let later = Instant::now() + FAILING_FOR;
        let why = health.failing_at(later).expect("failing for 5 s");
        assert!(
            why.contains("2 times in a row") && !why.contains("boom"),
            "{why}"
        );
        health.failure("boom 3");
        let why = health.failing().expect("three in a row");
        assert!(why.contains("3 times in a row"), "{why}");
        health.success();
        assert_eq!(health.failing(), None);
        assert_eq!(health.failing_at(later), None);
    }

    #[tokio::test]
    async fn the_deadline_is_seen_inside_its_scope_only() {
        assert_eq!(deadline(), None);
        let at = Instant::now() + Duration::from_secs(3);
        let seen = with_deadline(at, async { deadline() }).await;
        assert_eq!(seen, Some(at));
    }
}
