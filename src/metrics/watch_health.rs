//! Whether the watches the decisions read are live: `/readyz` answers 503 while one of them
//! has kept failing for longer than [`FAILING_FOR`]. A replica whose pod watch has stopped
//! would not see a pod started outside ip-webhook on a listed IP, and would hand the IP out;
//! so it stops taking admissions until the watch is back.
//!
//! A watch that reconnects delivers nothing until an object changes (bookmarks stay inside
//! the watcher), so "back" is an event, or [`QUIET`] without an error: the watcher retries at
//! least that often while it fails.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a watch may keep failing before the replica is not ready. The watcher retries
/// with backoff; a 410 relist or a dropped connection heals well inside this.
pub(crate) const FAILING_FOR: Duration = Duration::from_secs(10);

/// A run of failures is over once no error came for this long: longer than the watcher's
/// longest backoff between retries (kube-runtime's `DefaultBackoff`: 30 s, with jitter below).
pub(crate) const QUIET: Duration = Duration::from_secs(35);

#[derive(Debug, Default)]
pub(crate) struct WatchHealth {
    /// Fast path for every event: whether any watch is in a run of failures.
    any_failing: AtomicBool,
    /// Each failing watch: since when, and its latest error (the errors themselves go to the
    /// log, not to `/readyz`: the admin port is open to the cluster).
    failing: Mutex<BTreeMap<&'static str, Run>>,
}

#[derive(Debug, Clone, Copy)]
struct Run {
    since: Instant,
    last: Instant,
}

impl WatchHealth {
    /// `watch` delivered an event: it is live.
    pub(crate) fn ok(&self, watch: &'static str) {
        if !self.any_failing.load(Ordering::Relaxed) {
            return;
        }
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        if failing.remove(watch).is_some() {
            tracing::info!(watch, "the watch is live again");
        }
        self.any_failing
            .store(!failing.is_empty(), Ordering::Relaxed);
    }

    /// `watch` failed (the watcher retries on its own).
    pub(crate) fn failed(&self, watch: &'static str) {
        self.failed_at(watch, Instant::now());
    }

    fn failed_at(&self, watch: &'static str, now: Instant) {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        let run = failing.entry(watch).or_insert(Run {
            since: now,
            last: now,
        });
        if now.saturating_duration_since(run.last) >= QUIET {
            run.since = now;
        }
        run.last = now;
        self.any_failing.store(true, Ordering::Relaxed);
    }

    /// The watches that have been failing too long, if any: why the replica is not ready.
    pub(crate) fn failing(&self) -> Option<String> {
        self.failing_at(Instant::now())
    }

    fn failing_at(&self, now: Instant) -> Option<String> {
        if !self.any_failing.load(Ordering::Relaxed) {
            return None;
        }
        let failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        let long: Vec<String> = failing
            .iter()
            .filter(|(_, run)| {
                now.saturating_duration_since(run.since) >= FAILING_FOR
                    && now.saturating_duration_since(run.last) < QUIET
            })
            .map(|(watch, run)| {
                format!(
                    "the {watch} watch has failed for {:.0}s",
                    now.saturating_duration_since(run.since).as_secs_f64()
                )
            })
            .collect();
        (!long.is_empty()).then(|| format!("{} (the errors are in the log)", long.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_failing_past_the_limit_is_named_until_it_is_back() {
        let health = WatchHealth::default();
        assert_eq!(health.failing(), None);
        let start = Instant::now();
        health.failed_at("pods", start);
        assert_eq!(
            health.failing_at(start),
            None,
            "a short failure is not enough"
        );
        let later = start + FAILING_FOR + Duration::from_secs(1);
        health.failed_at("pods", later);
        let why = health.failing_at(later).expect("failing too long");
        assert_eq!(
            why,
            "the pods watch has failed for 11s (the errors are in the log)"
        );
        health.ok("ipclaims");
        assert!(health.failing_at(later).is_some(), "another watch's event");
        health.ok("pods");
        assert_eq!(health.failing_at(later), None, "an event: back");
    }

    #[test]
    fn a_reconnect_that_brings_no_event_is_back_once_the_errors_stop() {
        let health = WatchHealth::default();
        let start = Instant::now();
        health.failed_at("pod ips", start);
        let last = start + Duration::from_secs(20);
        health.failed_at("pod ips", last);
        assert!(health.failing_at(last + Duration::from_secs(1)).is_some());
        assert_eq!(health.failing_at(last + QUIET), None);
        // a new error long after starts a new run, not ready only past the limit again
        let again = last + QUIET + Duration::from_secs(5);
        health.failed_at("pod ips", again);
        assert_eq!(health.failing_at(again), None);
        health.failed_at("pod ips", again + FAILING_FOR);
        assert!(health.failing_at(again + FAILING_FOR).is_some());
    }
}
