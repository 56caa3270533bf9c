//! Hooks the webhook calls after a Pod CREATE decision, so other parts can react without the
//! admission path knowing them: in-cluster, a Kubernetes Event on the pod's owner when
//! allocation is refused; for `explain`, a record of which IP each pod got and why.
//!
//! The calls are synchronous and made on the admission path: an implementation must return
//! at once (queue the work, e.g. `tokio::spawn` or a channel), never wait on the network.

use std::net::IpAddr;

use ip_webhook_admission::OwnerRef;
use ip_webhook_ipam::allocator::Reason;
use ip_webhook_ledger::PodRef;
use ip_webhook_metrics::AllocationOutcome;

/// A pod that got its IPs.
#[derive(Debug)]
pub struct Assigned<'a> {
    pub request_uid: &'a str,
    pub pod: &'a PodRef,
    /// `namespace/app`.
    pub app: &'a str,
    pub ips: &'a [IpAddr],
    /// One per IP, in order; empty for static IPs (written on the pod by hand).
    pub reasons: &'a [Reason],
    pub dry_run: bool,
}

/// A pod that was refused its IPs.
#[derive(Debug)]
pub struct Refused<'a> {
    pub request_uid: &'a str,
    pub pod: &'a PodRef,
    /// `namespace/app`, or empty when the pod has no app label.
    pub app: &'a str,
    /// The pod's owner references (a ReplicaSet, StatefulSet, Job...), to put the Event on.
    pub owners: &'a [OwnerRef],
    /// `exhausted`, `conflict`, `refused` (bad annotation or pool rules) or `error` (ledger).
    pub outcome: AllocationOutcome,
    /// The denial message the API server shows.
    pub message: &'a str,
    pub dry_run: bool,
}

/// Receives admission outcomes. Both methods default to doing nothing.
pub trait EventSink: Send + Sync + 'static {
    fn assigned(&self, _assigned: &Assigned<'_>) {}
    fn refused(&self, _refused: &Refused<'_>) {}
}

/// The default sink: does nothing.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NoEvents;

impl EventSink for NoEvents {}
