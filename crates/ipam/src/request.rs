//! What one pod asks the allocator for, why an IP was chosen, and the claim a grant records:
//! the types the allocator (`allocator.rs`) and its held set (`held.rs`) both read.

use std::net::IpAddr;

use crate::ipset::IpSet;
use crate::messages::Scope;
use ip_webhook_ledger::claim::PodIdentity;
use ip_webhook_ledger::holder::VmRef;
use ip_webhook_ledger::{Claim, Phase, PodRef, Shared, Source, unix_now};

/// What one pod asks for.
#[derive(Debug, Clone)]
pub struct AllocationRequest<'a> {
    /// How the owner is named in messages.
    pub scope: Scope<'a>,
    pub app: &'a str,
    pub pool: Option<&'a str>,
    pub pod: PodRef,
    pub request_uid: &'a str,
    /// The claim token for this pod (a fresh one from [`ip_webhook_ledger::claim::new_token`]); a retried
    /// admission is answered with the token its first attempt recorded instead.
    pub token: &'a str,
    pub candidates: &'a IpSet,
    /// Ordinal of a StatefulSet pod (`web-3` → 3): prefers entry N of the list.
    pub ordinal: Option<u64>,
    /// The KubeVirt VM whose launcher pod this is: the claim is the VM's
    /// ([`ip_webhook_ledger::Claim::vm`]).
    pub vm: Option<&'a str>,
    /// The pod is a live migration's target launcher pod: it takes its VM's claim over while
    /// the source pod still runs the VM on the IP ([`ip_webhook_ledger::claim::migration_sources`]).
    pub migration: bool,
    pub dry_run: bool,
}

impl AllocationRequest<'_> {
    /// The pod asking, as the claim rules compare it with a record.
    pub fn identity(&self) -> PodIdentity<'_> {
        PodIdentity {
            namespace: &self.pod.namespace,
            name: &self.pod.name,
            uid: self.pod.uid.as_deref(),
            token: Some(self.token),
        }
    }
}

/// Why the IP was chosen (for logs and `explain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    StatefulSetOrdinal,
    PreviousHolder,
    LowestFree,
    /// A retried admission with the same request UID gets the claim it already made.
    SameRequest,
}

/// The `Reserved` claim `request` makes on `ip`.
pub(super) fn new_claim(ip: IpAddr, request: &AllocationRequest<'_>, source: Source) -> Claim {
    let now = unix_now();
    Claim {
        ip,
        app: request.app.into(),
        pool: request.pool.map(Shared::from),
        pod: request.pod.clone(),
        request_uid: request.request_uid.into(),
        phase: Phase::Reserved,
        source,
        created_at: now,
        updated_at: now,
        list_size: std::num::NonZeroU64::new(
            u64::try_from(request.candidates.len()).unwrap_or(u64::MAX),
        ),
        token: request.token.into(),
        release_at: None,
        sticky: false,
        vm: request.vm.map(VmRef::named),
    }
}
