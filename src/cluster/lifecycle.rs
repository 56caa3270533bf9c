//! The lifecycle rule of one claim, written once for every holder (a pod, or a KubeVirt VM
//! through its launcher pods) and every interface (the primary one, or a secondary network),
//! whatever the ledger: what the leader does about a claim given what it has seen of the
//! claim and of the pods. The reconciler applies it to the IPClaims of the primary interface
//! ([`super::reconcile::plan_claim`]); the leak sweeper to the claims of every other set of
//! books ([`super::sweep`]): etcd's, the embedded ledger's, each network's.
//!
//! The rule only says what to do; freeing a VM's claim also needs the VM verified gone, which
//! each executor asks the API server ([`super::virtual_machines::VmDirectory`]).

use super::claiming_pod::{ClaimingPod, PodMap};
use ip_webhook_ledger::claim::held_by;
use ip_webhook_ledger::{Claim, Phase};

/// The leader's timing rules.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// A claim made or bound at admission is a promise for this many seconds: the API server
    /// stores the pod only after every validating webhook has answered, and a create can
    /// still fail after ours (ResourceQuota, another webhook, AlreadyExists). A `Reserved`
    /// claim no pod took up, or a claim bound to a UID no pod has, is dropped only once this
    /// long has passed since the leader first saw it so. Keep it above the API server's
    /// request timeout (`--request-timeout`, 60 s by default).
    pub(crate) reservation_ttl: u64,
    /// A released StatefulSet claim is kept this many seconds for the same pod name.
    pub(crate) sticky_grace: u64,
}

/// Why a claim is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DropReason {
    /// Its pod (by UID) no longer exists and no admission DELETE released it: a leak.
    PodGone,
    /// Admitted but never picked up by a pod within the reservation TTL: a leak.
    ReservationExpired,
    /// Released, and the sticky grace is over (or it was never sticky); or a VM's claim
    /// whose VM is gone (checked before it is dropped).
    ReleaseDone,
}

impl DropReason {
    /// Whether this reclaims an IP that would otherwise have leaked (worth an Event).
    pub(crate) fn is_leak(self) -> bool {
        matches!(self, DropReason::PodGone | DropReason::ReservationExpired)
    }

    pub(crate) fn event_reason(self) -> &'static str {
        match self {
            DropReason::PodGone => "IPReclaimed",
            DropReason::ReservationExpired => "ReservationExpired",
            DropReason::ReleaseDone => "IPReleased",
        }
    }
}

/// What the leader has seen of a claim as it is now, on its own clock: since when (seconds),
/// and whether the pod the claim is bound to has been seen since. A claim's age is how long
/// this leader has watched it, never a time another machine wrote: clocks may disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Age {
    pub(crate) since: u64,
    pub(crate) pod_seen: bool,
}

/// What the rule says of one claim now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict<'p> {
    /// Nothing to do; `Some(at)`: time passing alone may change that at `at`.
    Wait(Option<u64>),
    /// Tie the claim to this pod (its final name and UID): phase `Bound`.
    Bind(&'p ClaimingPod),
    /// Its StatefulSet pod is gone: release it, kept for the pod's name for the sticky grace.
    Keep,
    /// Free the IP.
    Drop(DropReason),
}

/// Seconds a pod's creationTimestamp may precede its claim's: API server replicas' clocks
/// differ a little. For records written before claim tokens, an older pod of the same name
/// carrying the IP is not the claim's pod.
pub(crate) const CLOCK_SLACK: u64 = 5;

/// Whether `pod` is the one a not-yet-bound `claim` was made for: it carries the IP (on the
/// claim's interface) and the claim's token ([`held_by`]); a record without a token, its
/// exact name and a later birth.
pub(crate) fn takes_up(claim: &Claim, pod: &ClaimingPod) -> bool {
    pod.ips.contains(&claim.ip)
        && held_by(claim, &pod.identity())
        && (!claim.token.is_empty() || pod.created_at + CLOCK_SLACK >= claim.created_at)
}

/// The rule. `pods` are the pods that may hold a claim of these books (by UID; each with the
/// IPs it carries on the books' interface); `bound` says whether a pod UID is the pod of some
/// claim of these books (a reservation is never taken up by one).
pub(crate) fn judge<'p>(
    claim: &Claim,
    age: Age,
    pods: &'p PodMap,
    now: u64,
    rules: Rules,
    bound: &dyn Fn(&str) -> bool,
) -> Verdict<'p> {
    let promised_until = age.since + rules.reservation_ttl;
    match (claim.phase, claim.pod.uid.as_deref()) {
        // A phase is only what the record says (an IPClaim's status can be written by anyone
        // allowed to): a claim whose pod still runs is never freed for its phase.
        (Phase::Released, Some(uid)) if pods.get(uid).is_some_and(|pod| !pod.terminating) => {
            Verdict::Bind(&pods[uid])
        }
        (Phase::Released, _) => {
            let until = age.since + rules.sticky_grace;
            if claim.sticky && now < until {
                Verdict::Wait(Some(until))
            } else {
                Verdict::Drop(DropReason::ReleaseDone)
            }
        }
        (phase, Some(uid)) => judge_bound(claim, phase, pods.get(uid), age, now, promised_until),
        (_, None) => match taker(claim, pods, bound) {
            Some(pod) => Verdict::Bind(pod),
            None if now >= promised_until => Verdict::Drop(DropReason::ReservationExpired),
            None => Verdict::Wait(Some(promised_until)),
        },
    }
}

/// A held claim for the pod with its UID, `pod` as the caller sees it (`None`: not there).
fn judge_bound<'p>(
    claim: &Claim,
    phase: Phase,
    pod: Option<&'p ClaimingPod>,
    age: Age,
    now: u64,
    promised_until: u64,
) -> Verdict<'p> {
    match pod {
        Some(pod) if phase == Phase::Reserved => Verdict::Bind(pod),
        Some(_) => Verdict::Wait(None),
        // Bound at admission, the pod not stored yet (or never to be): a promise.
        None if phase != Phase::Terminating && !age.pod_seen && now < promised_until => {
            Verdict::Wait(Some(promised_until))
        }
        None if claim.sticky => Verdict::Keep,
        // its DELETE was admitted and the pod is gone: an ordinary release
        None if phase == Phase::Terminating => Verdict::Drop(DropReason::ReleaseDone),
        // A virtual machine's claim outlives its launcher pods: it is dropped only once the
        // VM is gone, and that is its ordinary release, not a leak.
        None if claim.vm.is_some() => Verdict::Drop(DropReason::ReleaseDone),
        None => Verdict::Drop(DropReason::PodGone),
    }
}

/// The pod a claim without a pod UID (a reservation) was made for: the oldest live pod that
/// takes it up ([`takes_up`]) and is not already the pod of another claim.
fn taker<'p>(
    claim: &Claim,
    pods: &'p PodMap,
    bound: &dyn Fn(&str) -> bool,
) -> Option<&'p ClaimingPod> {
    pods.values()
        .filter(|pod| !pod.terminating && !bound(pod.uid.as_str()) && takes_up(claim, pod))
        .min_by(|a, b| (a.created_at, &a.uid).cmp(&(b.created_at, &b.uid)))
}
