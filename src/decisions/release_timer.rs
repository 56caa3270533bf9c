//! The release timer: frees `Terminating` claims once their pod's grace (plus
//! `--release-delay`) has passed and, with an API server to ask, the pod is verified gone. A
//! pod that still runs when its grace ends keeps its IP (logged, counted in
//! `ip_webhook_releases_refused_total`). Every replica runs it; each release is conditional on
//! the record being the one read, so two replicas never free one claim twice.

use std::sync::Arc;
use std::time::Duration;

use crate::metrics::Metrics;
use ip_webhook_ipam::allocator::Allocator;
use ip_webhook_ledger::claim::DueStep;
use ip_webhook_ledger::pod_lookup::PodLookup;
use ip_webhook_ledger::unix_now;

/// How often due claims are looked for.
pub(crate) const PERIOD: Duration = Duration::from_secs(1);

/// Run until the task is aborted. `pods`: `None` off-cluster without an API server, where
/// the timer alone decides.
pub(crate) async fn run(
    allocator: Arc<Allocator>,
    pods: Option<Arc<dyn PodLookup>>,
    metrics: Arc<Metrics>,
    period: Duration,
) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        tick(&allocator, pods.as_deref(), &metrics, unix_now()).await;
    }
}

/// One pass at `now`: release what is due, count what was kept.
pub(crate) async fn tick(
    allocator: &Allocator,
    pods: Option<&dyn PodLookup>,
    metrics: &Metrics,
    now: u64,
) {
    for (claim, step) in allocator.release_due(now, pods).await {
        match step {
            DueStep::Release => {
                metrics.releases.inc();
                tracing::info!(ip = %claim.ip, pod = %claim.pod.display(), "released: the pod's grace period is over and it is gone");
            }
            DueStep::KeepBound => {
                metrics.releases_refused.inc();
            }
            DueStep::Wait => {}
        }
    }
}
