//! The hook the webhook calls after refusing a Pod CREATE, so other parts can react without
//! the admission path knowing them: in-cluster, a Kubernetes Event on the pod's owner.
//!
//! The calls are synchronous and made on the admission path: an implementation must return
//! at once (queue the work, e.g. `tokio::spawn` or a channel), never wait on the network.

use crate::metrics::AllocationOutcome;
use ip_webhook_admission::OwnerRef;
use ip_webhook_ledger::PodRef;

/// A pod that was refused its IPs.
#[derive(Debug)]
pub(crate) struct Refused<'a> {
    pub(crate) pod: &'a PodRef,
    /// The pod's owner references (a ReplicaSet, StatefulSet, Job...), to put the Event on.
    pub(crate) owners: &'a [OwnerRef],
    /// `exhausted`, `conflict`, `refused` (bad annotation or pool rules) or `error` (ledger).
    pub(crate) outcome: AllocationOutcome,
    /// The denial message the API server shows.
    pub(crate) message: &'a str,
    pub(crate) dry_run: bool,
}

/// Receives admission refusals; the method defaults to doing nothing.
pub(crate) trait EventSink: Send + Sync + 'static {
    fn refused(&self, _refused: &Refused<'_>) {}
}

/// The default sink: does nothing.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NoEvents;

impl EventSink for NoEvents {}
