//! The allocator: chooses a free IP for a pod and records the claim through the ledger.
//!
//! It keeps an in-memory index of held IPs as maximal runs of consecutive addresses, so "the
//! lowest free IP of this list" costs one ordered-map lookup per range of the list, whatever
//! the list's size or how full it is. An IP is marked held in memory before the ledger write
//! starts, so two concurrent admissions in one process never choose the same IP; the ledger's
//! create-if-absent settles races between processes.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::foreign::{ForeignIps, ForeignUse};
use crate::held::{DEFAULT_STICKY_GRACE, State, StickyGrace, identity_keys};
use crate::ipset::{Family, ip_key};
use crate::messages::{conflict_message, foreign_message};
use crate::request::new_claim;
pub use crate::request::{AllocationRequest, Reason};
use ip_webhook_ledger::claim::{self, PodIdentity, held_by, may_take_over, same_admission};
use ip_webhook_ledger::{
    Claim, CreateOutcome, Ledger, LedgerError, ObservedChange, Phase, PodRef, Shared, Source,
    unix_now,
};

/// How many times one allocation may learn that its candidate was taken elsewhere.
const MAX_CONTENDED_ATTEMPTS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub ips: Vec<IpAddr>,
    pub reasons: Vec<Reason>,
    /// The token the pod must carry (`ip-webhook.io/claim`).
    pub token: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("{0}")]
    Exhausted(String),
    #[error("{0}")]
    Conflict(String),
    #[error(
        "gave up after {MAX_CONTENDED_ATTEMPTS} attempts: every candidate was taken by another replica first; retry"
    )]
    Contention,
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// The allocator: one per process, shared by every request.
pub struct Allocator {
    ledger: Arc<dyn Ledger>,
    state: Mutex<State>,
    /// What the cluster says is in use outside the ledger (in-cluster: watched pods' IPs and
    /// Kube-OVN IP objects).
    foreign: std::sync::OnceLock<Arc<dyn ForeignIps>>,
}

/// Whether `seen` is an older view of the grant `current` already has: the same request and
/// token, `Reserved` where `current` is past it. No rule takes a grant back to `Reserved`, so
/// such a view predates what this replica wrote or saw (the watch's event of the create, an
/// IPClaim's spec written before its status, a list taken between the two).
fn older_view(seen: &Claim, current: &Claim) -> bool {
    current.request_uid == seen.request_uid
        && current.token == seen.token
        && current.phase != Phase::Reserved
        && seen.phase == Phase::Reserved
}

impl Allocator {
    /// Build the index from what the ledger holds. No decision is made before this returns.
    pub async fn new(ledger: Arc<dyn Ledger>) -> Result<Allocator, LedgerError> {
        Allocator::keeping_sticky(ledger, DEFAULT_STICKY_GRACE).await
    }

    /// [`Allocator::new`], keeping a released StatefulSet pod's claim `sticky_grace` seconds
    /// for its name before the release timer frees it.
    pub async fn keeping_sticky(
        ledger: Arc<dyn Ledger>,
        sticky_grace: u64,
    ) -> Result<Allocator, LedgerError> {
        let mut state = State {
            sticky_grace: StickyGrace(sticky_grace),
            ..State::default()
        };
        let mut claims = ledger.load_shared().await?;
        claims.sort_by_key(|c| c.updated_at);
        let mut held = Vec::with_capacity(claims.len());
        for claim in claims {
            state.remember(&claim);
            if claim.locks_ip() {
                held.push(claim);
            }
        }
        state.index_all(held);
        Ok(Allocator {
            ledger,
            state: Mutex::new(state),
            foreign: std::sync::OnceLock::new(),
        })
    }

    /// Consult `foreign` from now on: a static IP it names is refused, an allocation skips it.
    pub fn set_foreign(&self, foreign: Arc<dyn ForeignIps>) {
        let _ = self.foreign.set(foreign);
    }

    fn foreign(&self) -> Option<&dyn ForeignIps> {
        self.foreign.get().map(|f| &**f)
    }

    /// The refusal for `pod` (a launcher pod of `vm`, if given) asking for `ip` that a pod
    /// outside the ledger uses, if one does.
    #[cfg(test)]
    pub(crate) fn foreign_conflict(
        &self,
        ip: &IpAddr,
        pod: &PodRef,
        vm: Option<&str>,
    ) -> Option<String> {
        let user = self.foreign_user(ip, pod, vm)?;
        Some(foreign_message(ip, pod, &user))
    }

    /// The API server says `user` no longer uses `ip`: stop counting it there
    /// ([`ForeignIps::gone`]).
    pub fn foreign_gone(&self, ip: &IpAddr, user: &ForeignUse) {
        if let Some(foreign) = self.foreign() {
            foreign.gone(ip, user);
        }
    }

    /// Who outside the ledger uses `ip`, as the cluster says, but `pod` (a launcher pod of
    /// `vm`) and the holder the ledger's claim names.
    pub fn foreign_user(&self, ip: &IpAddr, pod: &PodRef, vm: Option<&str>) -> Option<ForeignUse> {
        self.lock().used_elsewhere(ip, pod, vm, self.foreign())
    }

    pub fn ledger(&self) -> &Arc<dyn Ledger> {
        &self.ledger
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the index consistent (every mutation is a
        // single insert/remove), so a poisoned lock is still safe to use.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Bring the index up to date with a change made elsewhere in a shared ledger: by another
    /// replica or the reconciler, seen through the IPClaim watch (in-cluster) or the etcd
    /// watch. Safety never depends on this (the ledger's create-if-absent refuses a taken IP
    /// anyway); it keeps choices fresh and lets IPs released elsewhere be chosen here again.
    ///
    /// `Held` indexes the record as it now is (in-cluster, a record locks its IP for as long as
    /// it exists, whatever its phase), except a `Reserved` view of a grant the index already
    /// has past `Reserved`: no rule takes a grant back to `Reserved`, so that view is older
    /// than what this replica wrote (the watch's event of the create, or of an IPClaim's spec
    /// written before its status) and is skipped. `Released` frees the IP only when the
    /// record there was made by the same admission request, so a stale event cannot free a
    /// newer claim. Returns whether the index changed.
    pub fn apply_observed(&self, change: ObservedChange) -> bool {
        let mut state = self.lock();
        match change {
            ObservedChange::Held(claim) => {
                let unbinds = state
                    .claims
                    .get(&claim.ip)
                    .is_some_and(|current| older_view(&claim, current));
                if unbinds {
                    return false;
                }
                state.remember(&claim);
                state.hold(claim);
                true
            }
            ObservedChange::Released(claim) => {
                let current = match state.claims.get(&claim.ip) {
                    Some(current) if current.request_uid == claim.request_uid => current.clone(),
                    _ => return false,
                };
                state.remember(&current);
                state.unhold(&current)
            }
        }
    }

    /// In-cluster: rebuild the index from a complete list of records (watch start, resync).
    /// Name history is kept. Claims being recorded right now may drop out of the index until
    /// their watch event arrives; the shared store's create-if-absent still refuses doubles.
    /// A listed `Reserved` view of a grant the index has past `Reserved` is the older one, as
    /// in [`Allocator::apply_observed`] (a list taken between an IPClaim's spec and status
    /// writes): the index keeps what it has.
    pub fn replace_all(&self, claims: Vec<Claim>) {
        let mut state = self.lock();
        let history = std::mem::take(&mut state.history);
        let local_release = std::mem::take(&mut state.local_release);
        let before = std::mem::take(&mut state.claims);
        *state = State {
            history,
            local_release,
            sticky_grace: state.sticky_grace,
            ..State::default()
        };
        for claim in claims {
            match before
                .get(&claim.ip)
                .filter(|current| older_view(&claim, current))
            {
                Some(current) => {
                    state.remember(current);
                    state.hold(current.clone());
                }
                None => {
                    state.remember(&claim);
                    state.hold(claim);
                }
            }
        }
        // what no longer terminates has no release time to keep
        let State {
            claims,
            local_release,
            ..
        } = &mut *state;
        local_release.retain(|ip, _| {
            claims.get(ip).is_some_and(|c| {
                c.phase == Phase::Terminating || (c.phase == Phase::Released && c.sticky)
            })
        });
    }

    /// The claims that lock their IP last held under the fixed pod name `pod`
    /// (`namespace/name`) of `app`, in any phase: the name's pod, maybe gone or in its grace
    /// period, or a release kept for the name.
    pub fn held_under_name(&self, pod: &PodRef, app: &str) -> Vec<Claim> {
        let state = self.lock();
        let key = (pod.namespace.clone(), Shared::from(app), pod.name.clone());
        state
            .history
            .get(&key)
            .into_iter()
            .flatten()
            .filter_map(|ip| state.claims.get(ip))
            .filter(|c| c.locks_ip() && c.pod.namespace == pod.namespace && c.pod.name == pod.name)
            .map(|c| (**c).clone())
            .collect()
    }

    /// Bring this copy of a shared ledger in step with the records on `ips` as the ledger
    /// holds them now: a replica's copy may lag behind another replica's writes, and a decision
    /// a stale copy would get wrong reads them first. An in-process ledger's copy is exact.
    pub async fn refresh(&self, ips: &[IpAddr]) -> Result<(), LedgerError> {
        if !self.ledger.shared() {
            return Ok(());
        }
        for ip in ips {
            let record = self.ledger.get(*ip).await?;
            let mut state = self.lock();
            match record {
                Some(claim) if claim.locks_ip() => {
                    state.remember(&claim);
                    state.hold(claim);
                }
                _ => {
                    if let Some(current) = state.claims.get(ip).cloned() {
                        state.unhold(&current);
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether a claim this copy holds is bound to the pod with this UID.
    pub fn names_pod(&self, uid: &str) -> bool {
        let state = self.lock();
        let bound = state
            .by_key
            .claims(claim::uid_key(uid), &state.claims, |c| {
                c.pod.uid.as_deref() == Some(uid)
            });
        !bound.is_empty()
    }

    /// Who holds `ip`, if anyone.
    pub fn holder(&self, ip: &IpAddr) -> Option<Claim> {
        self.lock().claims.get(ip).map(|claim| (**claim).clone())
    }

    /// Every held claim (for status and tests).
    pub fn claims(&self) -> Vec<Claim> {
        let mut claims: Vec<Claim> = self
            .lock()
            .claims
            .values()
            .map(|claim| (**claim).clone())
            .collect();
        claims.sort_by_key(|c| ip_key(&c.ip));
        claims
    }

    /// Run `f` over every held claim without copying them (metrics scrapes, status).
    pub fn with_claims<R>(&self, f: impl FnOnce(&mut dyn Iterator<Item = &Claim>) -> R) -> R {
        let state = self.lock();
        f(&mut state.claims.values().map(|claim| &**claim))
    }

    /// How many IPs the app holds.
    pub fn held_by_app(&self, namespace: &str, app: &str) -> u64 {
        self.lock().held_per_app.get(namespace, app)
    }

    /// Choose one IP per family of the candidate list, and (unless dry run) record the claims.
    pub async fn allocate(
        &self,
        request: &AllocationRequest<'_>,
    ) -> Result<Allocation, AllocError> {
        if let Some(existing) = self.same_request(request) {
            return Ok(existing);
        }
        let mut allocation = Allocation {
            ips: Vec::new(),
            reasons: Vec::new(),
            token: request.token.to_string(),
        };
        let mut made: Vec<Arc<Claim>> = Vec::new();
        for family in request.candidates.families() {
            match self.allocate_one(request, family).await {
                Ok((claim, reason)) => {
                    allocation.ips.push(claim.ip);
                    allocation.reasons.push(reason);
                    if made.is_empty() {
                        allocation.token = claim.token.to_string();
                    }
                    made.push(claim);
                }
                Err(error) => {
                    for claim in &made {
                        self.give_back(claim).await;
                    }
                    return Err(error);
                }
            }
        }
        Ok(allocation)
    }

    /// What a retried admission (same request UID, same namespace) was given, dry run or not.
    fn same_request(&self, request: &AllocationRequest<'_>) -> Option<Allocation> {
        let state = self.lock();
        let claims = state.granted_to(request.request_uid);
        let same_pod = claims.iter().all(|c| {
            c.is_held() && c.pod.namespace == request.pod.namespace && c.pod.uid.is_none()
        });
        (same_pod && !claims.is_empty()).then(|| Allocation {
            ips: claims.iter().map(|c| c.ip).collect(),
            reasons: vec![Reason::SameRequest; claims.len()],
            token: claims[0].token.to_string(),
        })
    }

    async fn allocate_one(
        &self,
        request: &AllocationRequest<'_>,
        family: Family,
    ) -> Result<(Arc<Claim>, Reason), AllocError> {
        for _ in 0..MAX_CONTENDED_ATTEMPTS {
            let (claim, reason) = {
                let mut state = self.lock();
                let Some((ip, reason)) = state.choose(request, family, self.foreign()) else {
                    return Err(AllocError::Exhausted(state.exhausted_message(
                        request,
                        family,
                        self.foreign(),
                    )));
                };
                let claim = Arc::new(taking_over(
                    new_claim(ip, request, Source::Allocated),
                    request,
                    state.claims.get(&ip).map(|c| &**c),
                ));
                if request.dry_run {
                    return Ok((claim, reason));
                }
                // one copy, shared by this index and the ledger's
                state.hold(claim.clone());
                (claim, reason)
            };
            match self.record(&claim).await? {
                Recorded::Ours(claim) => return Ok((claim, reason)),
                Recorded::HeldBy(_) => {}
            }
        }
        Err(AllocError::Contention)
    }

    /// Make `claim` (already held in the index) durable. On a refusal the index learns the
    /// holder instead; on an error the claim is dropped from the index.
    async fn record(&self, claim: &Arc<Claim>) -> Result<Recorded, AllocError> {
        match self.ledger.create(claim.clone()).await {
            Ok(CreateOutcome::Created) => Ok(Recorded::Ours(claim.clone())),
            Ok(CreateOutcome::Existing(existing)) => {
                let existing = Arc::new(*existing);
                let mut state = self.lock();
                state.unhold(claim);
                state.hold(existing.clone());
                Ok(Recorded::Ours(existing))
            }
            Ok(CreateOutcome::AlreadyHeld(holder)) => {
                let mut state = self.lock();
                state.unhold(claim);
                state.hold((*holder).clone());
                Ok(Recorded::HeldBy(holder))
            }
            Err(error) => {
                self.lock().unhold(claim);
                Err(error.into())
            }
        }
    }

    /// Record IPs the user wrote on the pod by hand; refuse when another pod holds one.
    /// A retried admission gets its first attempt's claims back; a fixed-name pod takes over
    /// its own earlier claim ([`claim::may_take_over`]).
    pub async fn claim_static(
        &self,
        ips: &[IpAddr],
        request: &AllocationRequest<'_>,
    ) -> Result<Allocation, AllocError> {
        let mut allocation = Allocation {
            ips: ips.to_vec(),
            reasons: Vec::new(),
            token: request.token.to_string(),
        };
        let mut made = Vec::new();
        for ip in ips {
            let step = {
                let mut state = self.lock();
                let probe = Arc::new(taking_over(
                    new_claim(*ip, request, Source::Static),
                    request,
                    state.claims.get(ip).map(|c| &**c),
                ));
                let elsewhere = state
                    .used_elsewhere(ip, &request.pod, request.vm, self.foreign())
                    .map(|user| foreign_message(ip, &request.pod, &user));
                match (elsewhere, state.claims.get(ip)) {
                    (Some(message), _) => Some(Err(AllocError::Conflict(message))),
                    (None, Some(holder)) if holder.is_held() && same_admission(holder, &probe) => {
                        allocation.token = holder.token.to_string();
                        None
                    }
                    // At /validate (the pod has its UID) this copy may lag behind the ledger:
                    // the create below decides, and answers with the record it holds.
                    (None, Some(holder))
                        if holder.locks_ip()
                            && !may_take_over(holder, &probe)
                            && (request.dry_run || request.pod.uid.is_none()) =>
                    {
                        Some(Err(AllocError::Conflict(conflict_message(
                            ip,
                            &request.pod,
                            holder,
                        ))))
                    }
                    _ if request.dry_run => None,
                    _ => {
                        state.hold(probe.clone());
                        Some(Ok(probe))
                    }
                }
            };
            let failure = match step {
                None => continue,
                Some(Err(conflict)) => conflict,
                Some(Ok(claim)) => match self.record(&claim).await {
                    Ok(Recorded::Ours(claim)) => {
                        allocation.token = claim.token.to_string();
                        made.push(claim);
                        continue;
                    }
                    // The record itself, read after the write found it, not this replica's
                    // cache: a watch that lags behind another replica's /mutate has not
                    // shown this pod's own reservation yet.
                    Ok(Recorded::HeldBy(holder)) if held_by(&holder, &request.identity()) => {
                        allocation.token = holder.token.to_string();
                        continue;
                    }
                    Ok(Recorded::HeldBy(holder)) => {
                        AllocError::Conflict(conflict_message(ip, &request.pod, &holder))
                    }
                    Err(error) => error,
                },
            };
            for claim in &made {
                self.give_back(claim).await;
            }
            return Err(failure);
        }
        Ok(allocation)
    }

    /// The claims `pod` holds on `ips` ([`claim::held_by`]).
    pub fn held_by(&self, pod: &PodIdentity<'_>, ips: &[IpAddr]) -> Vec<Claim> {
        let state = self.lock();
        ips.iter()
            .filter_map(|ip| state.claims.get(ip))
            .filter(|c| c.is_held() && held_by(c, pod))
            .map(|c| (**c).clone())
            .collect()
    }

    /// Every claim `pod` holds, found by who it is (its UID, its claim token) rather than by
    /// the IPs it shows: a pod whose annotations or label were stripped still holds its
    /// claims. In every ledger mode the index holds every claim (embedded and memory: this
    /// process made them; kubernetes and etcd: the ledger's watch adds the other replicas').
    pub fn claims_of(&self, pod: &PodIdentity<'_>) -> Vec<Claim> {
        let state = self.lock();
        let mut found: Vec<Claim> = Vec::new();
        for key in identity_keys(pod) {
            for claim in state.by_key.claims(key, &state.claims, |c| {
                c.is_held() && held_by(c, pod) && !found.iter().any(|f| f.ip == c.ip)
            }) {
                found.push(claim.clone());
            }
        }
        found.sort_by_key(|c| ip_key(&c.ip));
        found
    }

    /// Step the claims on `ips` that `pod` holds to `next(claim)`'s phase, through the ledger
    /// ([`claim::may_step`] decides). Returns the claims changed, as they now are.
    pub(super) async fn step(
        &self,
        pod: &PodIdentity<'_>,
        ips: &[IpAddr],
        next: impl Fn(&Claim) -> Option<Claim>,
    ) -> Result<Vec<Claim>, LedgerError> {
        let mut changed = Vec::new();
        for current in self.held_by(pod, ips) {
            let Some(next) = next(&current) else { continue };
            if self.transition(&current, &next).await? {
                changed.push(next);
            }
        }
        Ok(changed)
    }

    /// Replace `current` by `next` (a phase change `claim::may_step` allows) through the
    /// ledger, and in the index once the ledger has. Returns whether the record changed.
    pub async fn transition(&self, current: &Claim, next: &Claim) -> Result<bool, LedgerError> {
        if !self.ledger.transition(current, next).await? {
            return Ok(false);
        }
        let mut state = self.lock();
        if state.unhold(current) {
            state.hold(next.clone());
        }
        Ok(true)
    }

    /// `/validate`: tie the pod's reservations to its final name and UID (phase `Bound`), so
    /// from now on only that UID holds them.
    pub async fn bind(
        &self,
        pod: &PodIdentity<'_>,
        ips: &[IpAddr],
        sticky: bool,
    ) -> Result<Vec<Claim>, LedgerError> {
        let Some(uid) = pod.uid else {
            return Ok(Vec::new());
        };
        let now = unix_now();
        self.step(pod, ips, |current| {
            (current.phase == Phase::Reserved).then(|| {
                let mut next = claim::bound(current, pod.name, uid, now);
                next.sticky = sticky;
                next
            })
        })
        .await
    }

    async fn give_back(&self, claim: &Claim) {
        if let Err(error) = self.ledger.release(claim).await {
            tracing::warn!(ip = %claim.ip, %error, "could not roll back a partial claim");
        }
        self.lock().unhold(claim);
    }
}

/// `claim`, made by `request` for an IP whose record is `existing`: a live migration's
/// target taking its VM's claim over remembers the source that still runs the VM there.
fn taking_over(
    mut claim: Claim,
    request: &AllocationRequest<'_>,
    existing: Option<&Claim>,
) -> Claim {
    if let (true, Some(existing), Some(vm)) = (request.migration, existing, &claim.vm)
        && claim::same_virtual_machine(existing, &claim)
    {
        claim.vm = Some(vm.with_sources(claim::migration_sources(existing)));
    }
    claim
}

/// What recording a claim came to.
enum Recorded {
    /// Ours: the claim as recorded (a retried admission's first record, maybe).
    Ours(Arc<Claim>),
    HeldBy(Box<Claim>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::foreign::ForeignUse;
    use crate::held::RunSet;
    use crate::ipset::IpSet;
    use crate::ipset::parse_ip_spec;
    use crate::messages::Scope;
    use ip_webhook_ledger::MemoryLedger;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn pod(name: &str) -> PodRef {
        PodRef {
            namespace: "default".into(),
            name: name.into(),
            ..Default::default()
        }
    }

    fn request<'a>(set: &'a IpSet, pod_ref: PodRef, uid: &'a str) -> AllocationRequest<'a> {
        AllocationRequest {
            scope: Scope::App {
                namespace: "default",
                app: "web",
            },
            app: "web",
            pool: None,
            pod: pod_ref,
            request_uid: uid,
            token: uid,
            candidates: set,
            ordinal: None,
            vm: None,
            migration: false,
            dry_run: false,
        }
    }

    fn identity<'a>(name: &'a str, token: &'a str) -> PodIdentity<'a> {
        PodIdentity {
            namespace: "default",
            name,
            uid: None,
            token: Some(token),
        }
    }

    async fn allocator() -> Allocator {
        Allocator::new(Arc::new(MemoryLedger::new())).await.unwrap()
    }

    /// A claim of app `web` for pod `default/{name}`, written by request `uid` (of another
    /// replica, as far as this allocator knows).
    fn external(ip: &str, name: &str, uid: &str, phase: Phase) -> Claim {
        crate::test_claims::builder(ip, "web", name)
            .request(uid)
            .phase(phase)
            .build()
    }

    #[tokio::test]
    async fn due_follows_phase_changes_in_release_order() {
        let allocator = allocator().await;
        // graces of 19, 29 and 89 s, from DELETEs written at time 1 by another replica's
        // clock: each counts from when this process learns the claim (at `start`, give or
        // take the second the test may cross)
        let start = unix_now();
        let terminating = |ip: &str, name: &str, at: u64| Claim {
            release_at: Some(ip_webhook_ledger::ReleaseAt::new(at)),
            ..external(ip, name, &format!("r-{name}"), Phase::Terminating)
        };
        for claim in [
            terminating("10.0.0.3", "c", 30),
            terminating("10.0.0.1", "a", 20),
            terminating("10.0.0.2", "b", 20),
            terminating("10.0.0.4", "d", 90),
            // a release time on a claim that is not terminating is never due
            Claim {
                release_at: Some(ip_webhook_ledger::ReleaseAt::new(5)),
                ..external("10.0.0.5", "e", "r-e", Phase::Bound)
            },
        ] {
            allocator.apply_observed(ObservedChange::Held(claim));
        }
        let due = |now| -> Vec<String> {
            allocator
                .due(now)
                .iter()
                .map(|c| c.ip.to_string())
                .collect()
        };
        assert!(due(start + 18).is_empty());
        assert_eq!(due(start + 31), ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        // 10.0.0.1 is bound again, 10.0.0.2 released: neither is due any more
        allocator.apply_observed(ObservedChange::Held(external(
            "10.0.0.1",
            "a",
            "r-a",
            Phase::Bound,
        )));
        assert!(
            allocator.apply_observed(ObservedChange::Released(terminating("10.0.0.2", "b", 20)))
        );
        assert_eq!(due(start + 100), ["10.0.0.3", "10.0.0.4"]);
        // learning the same claims again (a reload) does not count their grace anew
        allocator.replace_all(allocator.claims());
        assert_eq!(due(start + 100), ["10.0.0.3", "10.0.0.4"]);
    }

    /// A DELETE admitted by a replica whose clock runs 10 minutes behind this one's: its
    /// release time is long past by this clock, but the pod's 30 s grace counts from when
    /// this process learned the claim, so it is not freed while the pod may still run.
    #[tokio::test]
    async fn a_release_time_written_by_another_clock_counts_only_its_grace() {
        let allocator = allocator().await;
        let now = unix_now();
        let written = now - 600;
        allocator.apply_observed(ObservedChange::Held(Claim {
            updated_at: written,
            release_at: Some(ip_webhook_ledger::ReleaseAt::new(written + 30)),
            ..external("10.0.0.9", "db-0", "r-db", Phase::Terminating)
        }));
        assert!(allocator.due(now + 1).is_empty(), "not within the grace");
        assert_eq!(allocator.due(now + 32).len(), 1);
    }

    /// The watch's older views of a grant this replica bound (the create's event, an IPClaim's
    /// spec written before its status) arrive after the bind: they leave it as it is; a
    /// reservation of another grant on the IP is indexed as it is.
    #[tokio::test]
    async fn an_older_view_of_a_bound_grant_does_not_unbind_it() {
        let allocator = allocator().await;
        let ip: IpAddr = "10.0.0.5".parse().unwrap();
        let bound = external("10.0.0.5", "db-0", "r-db", Phase::Bound);
        allocator.apply_observed(ObservedChange::Held(bound.clone()));
        let older = Claim {
            phase: Phase::Reserved,
            ..bound.clone()
        };
        assert!(!allocator.apply_observed(ObservedChange::Held(older)));
        assert_eq!(allocator.holder(&ip).unwrap().phase, Phase::Bound);
        let terminating = Claim {
            phase: Phase::Terminating,
            ..bound.clone()
        };
        assert!(allocator.apply_observed(ObservedChange::Held(terminating)));
        assert_eq!(allocator.holder(&ip).unwrap().phase, Phase::Terminating);
        let reserved = Claim {
            phase: Phase::Reserved,
            ..bound.clone()
        };
        assert!(!allocator.apply_observed(ObservedChange::Held(reserved)));
        assert_eq!(allocator.holder(&ip).unwrap().phase, Phase::Terminating);
        let another = external("10.0.0.5", "db-0", "r-db-2", Phase::Reserved);
        assert!(allocator.apply_observed(ObservedChange::Held(another)));
        assert_eq!(allocator.holder(&ip).unwrap().request_uid, "r-db-2");
    }

    /// A resync's list taken between an IPClaim's spec and status writes shows the grant
    /// `Reserved` with its pod's UID: the index keeps the bound claim; another grant's
    /// reservation, and an IP the list no longer shows, are taken from the list.
    #[tokio::test]
    async fn a_list_older_than_a_bind_does_not_unbind_it() {
        let allocator = allocator().await;
        let ip: IpAddr = "10.0.0.5".parse().unwrap();
        let bound = external("10.0.0.5", "db-0", "r-db", Phase::Bound);
        allocator.apply_observed(ObservedChange::Held(bound.clone()));
        allocator.apply_observed(ObservedChange::Held(external(
            "10.0.0.6",
            "db-1",
            "r-db-1",
            Phase::Bound,
        )));
        let listed = Claim {
            phase: Phase::Reserved,
            ..bound.clone()
        };
        allocator.replace_all(vec![listed]);
        assert_eq!(allocator.holder(&ip).unwrap().phase, Phase::Bound);
        assert!(allocator.holder(&"10.0.0.6".parse().unwrap()).is_none());
        let another = external("10.0.0.5", "db-0", "r-db-2", Phase::Reserved);
        allocator.replace_all(vec![another]);
        assert_eq!(allocator.holder(&ip).unwrap().request_uid, "r-db-2");
        assert_eq!(allocator.holder(&ip).unwrap().phase, Phase::Reserved);
    }

    #[tokio::test]
    async fn external_records_lock_ips_and_only_their_own_delete_frees_them() {
        let allocator = allocator().await;
        let set = parse_ip_spec("10.0.0.1-10.0.0.3").unwrap();
        allocator.apply_observed(ObservedChange::Held(external(
            "10.0.0.1",
            "web-a",
            "r-a",
            Phase::Bound,
        )));
        let got = allocator
            .allocate(&request(&set, pod("web-b"), "r-b"))
            .await
            .unwrap();
        assert_eq!(got.ips, vec!["10.0.0.2".parse::<IpAddr>().unwrap()]);
        // A stale delete of an older record on 10.0.0.1 leaves the current one alone.
        assert!(!allocator.apply_observed(ObservedChange::Released(external(
            "10.0.0.1",
            "web-a",
            "r-old",
            Phase::Bound
        ))));
        assert!(allocator.holder(&"10.0.0.1".parse().unwrap()).is_some());
        assert!(allocator.apply_observed(ObservedChange::Released(external(
            "10.0.0.1",
            "web-a",
            "r-a",
            Phase::Bound
        ))));
        assert!(allocator.holder(&"10.0.0.1".parse().unwrap()).is_none());
    }

    #[tokio::test]
    async fn the_name_history_keeps_fixed_names_and_drops_generated_ones() {
        let alloc = allocator().await;
        let set = parse_ip_spec("10.0.0.1-10.0.0.9").unwrap();
        for (generate_name, name, uid) in [
            ("web-7d4b9c-", "web-7d4b9c-x2x9q", "u1"),
            ("", "web-fixed", "u2"),
        ] {
            let pod_ref = PodRef {
                namespace: "default".into(),
                // at mutation a generateName pod has no name yet
                name: if generate_name.is_empty() { name } else { "" }.into(),
                generate_name: generate_name.into(),
                uid: None,
            };
            let granted = alloc.allocate(&request(&set, pod_ref, uid)).await.unwrap();
            let pod = PodIdentity {
                namespace: "default",
                name,
                uid: Some(uid),
                token: Some(&granted.token),
            };
            assert_eq!(
                alloc.bind(&pod, &granted.ips, false).await.unwrap().len(),
                1
            );
            assert_eq!(
                alloc.release_held(&pod, &granted.ips).await.unwrap(),
                granted.ips
            );
        }
        let state = alloc.lock();
        let names: Vec<&str> = state
            .history
            .keys()
            .map(|(_, _, name)| name.as_str())
            .collect();
        assert_eq!(names, ["web-fixed"]);
    }

    #[tokio::test]
    async fn a_kept_released_record_is_free_only_for_the_same_pod_name() {
        let allocator = allocator().await;
        let set = parse_ip_spec("10.0.0.1-10.0.0.3").unwrap();
        allocator.replace_all(vec![
            external("10.0.0.1", "web-0", "r-0", Phase::Released),
            external("10.0.0.2", "web-9", "r-9", Phase::Bound),
        ]);
        let other = allocator
            .allocate(&request(&set, pod("web-1"), "r-1"))
            .await
            .unwrap();
        assert_eq!(other.ips, vec!["10.0.0.3".parse::<IpAddr>().unwrap()]);
        let same = allocator
            .allocate(&request(&set, pod("web-0"), "r-0b"))
            .await
            .unwrap();
        assert_eq!(same.ips, vec!["10.0.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(same.reasons, vec![Reason::PreviousHolder]);
    }

    #[tokio::test]
    async fn replace_all_drops_records_missing_from_the_list() {
        let allocator = allocator().await;
        allocator.apply_observed(ObservedChange::Held(external(
            "10.0.0.1",
            "a",
            "r-a",
            Phase::Bound,
        )));
        allocator.replace_all(vec![external("10.0.0.2", "b", "r-b", Phase::Reserved)]);
        let held: Vec<String> = allocator
            .claims()
            .iter()
            .map(|c| c.ip.to_string())
            .collect();
        assert_eq!(held, ["10.0.0.2"]);
        assert_eq!(allocator.held_by_app("default", "web"), 1);
    }

    #[test]
    fn runset_merges_and_splits() {
        let mut runs = RunSet::default();
        for v in [5, 7, 6, 1] {
            runs.insert(v);
        }
        assert_eq!(runs.run_count(), 2);
        assert_eq!(runs.first_free(5, 10), Some(8));
        assert_eq!(runs.first_free(5, 7), None);
        assert_eq!(runs.first_free(0, 10), Some(0));
        assert_eq!(runs.first_free(1, 10), Some(2));
        runs.remove(6);
        assert_eq!(runs.run_count(), 3);
        assert_eq!(runs.first_free(5, 10), Some(6));
        runs.insert(u128::MAX);
        assert_eq!(
            runs.first_free(u128::MAX - 1, u128::MAX),
            Some(u128::MAX - 1)
        );
        runs.insert(u128::MAX - 1);
        assert_eq!(runs.first_free(u128::MAX - 1, u128::MAX), None);
    }

    #[tokio::test]
    async fn lowest_free_then_exhaustion_names_holders() {
        let alloc = allocator().await;
        let set = parse_ip_spec("10.0.0.10,10.0.0.11").unwrap();
        let a = alloc
            .allocate(&request(&set, pod("web-abc12"), "u1"))
            .await
            .unwrap();
        let b = alloc
            .allocate(&request(&set, pod("web-def34"), "u2"))
            .await
            .unwrap();
        assert_eq!(a.ips, vec!["10.0.0.10".parse::<IpAddr>().unwrap()]);
        assert_eq!(b.ips, vec!["10.0.0.11".parse::<IpAddr>().unwrap()]);
        let err = alloc
            .allocate(&request(&set, pod("web-x"), "u3"))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "app default/web: all 2 allocatable IPs are held (10.0.0.10 by default/web-abc12, 10.0.0.11 by default/web-def34)"
        );
        assert_eq!(alloc.held_by_app("default", "web"), 2);
    }

    #[tokio::test]
    async fn retried_request_gets_the_same_ip() {
        let alloc = allocator().await;
        let set = parse_ip_spec("10.0.0.0/29").unwrap();
        let first = alloc
            .allocate(&request(&set, pod("p"), "same"))
            .await
            .unwrap();
        let again = alloc
            .allocate(&request(&set, pod("p"), "same"))
            .await
            .unwrap();
        assert_eq!(first.ips, again.ips);
        assert_eq!(again.reasons, vec![Reason::SameRequest]);
        assert_eq!(alloc.claims().len(), 1);
    }

    #[tokio::test]
    async fn a_vms_launcher_pods_take_its_ip_in_turn_and_others_never_do() {
        let alloc = allocator().await;
        let set = parse_ip_spec("10.0.0.10-10.0.0.14").unwrap();
        let launcher = |token: &'static str| AllocationRequest {
            vm: Some("db"),
            migration: false,
            ..request(&set, pod(""), token)
        };
        let first = alloc.allocate(&launcher("t1")).await.unwrap();
        let bound = PodIdentity {
            uid: Some("u1"),
            ..identity("virt-launcher-db-aaaaa", "t1")
        };
        assert_eq!(
            alloc.bind(&bound, &first.ips, false).await.unwrap().len(),
            1
        );
        // an ordinary pod of the app gets another IP
        let plain = alloc
            .allocate(&request(&set, pod(""), "t-plain"))
            .await
            .unwrap();
        assert_ne!(plain.ips, first.ips);
        // a migration target while the source's claim is Bound, then a restart after the
        // target's DELETE: each launcher pod gets the VM's IP, its previous one
        for token in ["t2", "t3"] {
            let next = alloc.allocate(&launcher(token)).await.unwrap();
            assert_eq!(next.ips, first.ips, "{token}");
            assert_eq!(next.reasons, vec![Reason::PreviousHolder]);
            let holder = alloc.holder(&first.ips[0]).unwrap();
            assert_eq!(holder.token, token);
            assert_eq!(holder.holder(), "vm default/db");
        }
        // the source's DELETE names a grant the claim no longer is: nothing changes
        let gone = alloc.terminate(&bound, &first.ips, 0).await.unwrap();
        assert!(gone.is_empty(), "{gone:?}");
        assert_eq!(alloc.holder(&first.ips[0]).unwrap().phase, Phase::Reserved);
        // another VM's launcher pod does not get it
        let other_vm = AllocationRequest {
            vm: Some("cache"),
            migration: false,
            ..request(&set, pod(""), "t-cache")
        };
        assert_ne!(alloc.allocate(&other_vm).await.unwrap().ips, first.ips);
    }

    #[tokio::test]
    async fn kube_ovns_record_of_a_vms_ip_under_the_vms_name_is_no_other_user() {
        let alloc = allocator().await;
        let set = parse_ip_spec("10.0.0.10-10.0.0.11").unwrap();
        // Kube-OVN's IP object names the VM, as it does with keep-vm-ip
        alloc.set_foreign(Arc::new(Foreign(vec![("10.0.0.10", "db")])));
        let launcher = |token: &'static str| AllocationRequest {
            vm: Some("db"),
            migration: false,
            ..request(&set, pod(""), token)
        };
        // the first start skips the IP (no claim says it is the VM's yet)...
        let first = alloc.allocate(&launcher("t1")).await.unwrap();
        assert_eq!(first.ips[0].to_string(), "10.0.0.11");
        // ...a VM whose claim is on the IP Kube-OVN records for it keeps it
        alloc
            .release_held(&identity("", "t1"), &first.ips)
            .await
            .unwrap();
        let held = Claim {
            vm: Some("db".into()),
            token: "t0".into(),
            ..external(
                "10.0.0.10",
                "virt-launcher-db-old",
                "r0",
                Phase::Terminating,
            )
        };
        alloc.apply_observed(ObservedChange::Held(held));
        let again = alloc.allocate(&launcher("t2")).await.unwrap();
        assert_eq!(again.ips[0].to_string(), "10.0.0.10");
        // another VM's launcher pod gets the other IP
        let other = AllocationRequest {
            vm: Some("cache"),
            migration: false,
            ..request(&set, pod(""), "t3")
        };
        assert_eq!(
            alloc.allocate(&other).await.unwrap().ips[0].to_string(),
            "10.0.0.11"
        );
    }

    #[tokio::test]
    async fn statefulset_ordinal_and_previous_holder_preferences() {
        let alloc = allocator().await;
        let set = parse_ip_spec("10.0.0.10-10.0.0.14").unwrap();
        let mut req = request(&set, pod("db-3"), "u1");
        req.ordinal = Some(3);
        let got = alloc.allocate(&req).await.unwrap();
        assert_eq!(got.ips[0].to_string(), "10.0.0.13");
        assert_eq!(got.reasons, vec![Reason::StatefulSetOrdinal]);

        let other = alloc
            .allocate(&request(&set, pod("cache"), "u2"))
            .await
            .unwrap();
        assert_eq!(other.ips[0].to_string(), "10.0.0.10");
        let released = alloc
            .release_held(&identity("cache", "u2"), &other.ips)
            .await
            .unwrap();
        assert_eq!(released, other.ips);
        // someone else takes the lowest; "cache" comes back to its previous IP? It was taken,
        // so the next-lowest is given instead.
        alloc
            .allocate(&request(&set, pod("other"), "u3"))
            .await
            .unwrap();
        let back = alloc
            .allocate(&request(&set, pod("cache"), "u4"))
            .await
            .unwrap();
        assert_eq!(back.ips[0].to_string(), "10.0.0.11");
        alloc
            .release_held(&identity("cache", "u4"), &back.ips)
            .await
            .unwrap();
        let again = alloc
            .allocate(&request(&set, pod("cache"), "u5"))
            .await
            .unwrap();
        assert_eq!(again.ips[0].to_string(), "10.0.0.11");
        assert_eq!(again.reasons, vec![Reason::PreviousHolder]);
    }

    /// IPs the cluster says pods outside the ledger use.
    struct Foreign(Vec<(&'static str, &'static str)>);

    impl ForeignIps for Foreign {
        fn user(&self, ip: &IpAddr) -> Option<ForeignUse> {
            self.0
                .iter()
                .find(|(used, _)| used.parse::<IpAddr>().ok() == Some(*ip))
                .map(|(_, name)| ForeignUse {
                    namespace: "default".into(),
                    name: name.to_string(),
                    ovn_ip: None,
                    vm: None,
                })
        }
    }

    #[tokio::test]
    async fn ips_foreign_pods_use_are_skipped_and_refused_but_not_for_their_own_pod() {
        let alloc = allocator().await;
        alloc.set_foreign(Arc::new(Foreign(vec![
            ("10.0.0.1", "legacy-0"),
            ("10.0.0.2", "legacy-1"),
            ("10.0.0.4", "web-a"),
        ])));
        let set = parse_ip_spec("10.0.0.1-10.0.0.4").unwrap();
        let first = alloc
            .allocate(&request(&set, pod("web-x"), "u1"))
            .await
            .unwrap();
        assert_eq!(first.ips[0].to_string(), "10.0.0.3");
        // 10.0.0.4 is web-a's own (it runs on it): web-a may be given it.
        let own = alloc
            .allocate(&request(&set, pod("web-a"), "u2"))
            .await
            .unwrap();
        assert_eq!(own.ips[0].to_string(), "10.0.0.4");
        let err = alloc
            .claim_static(
                &["10.0.0.2".parse().unwrap()],
                &request(&set, pod("x"), "u3"),
            )
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "static IP 10.0.0.2 requested by default/x is already used by pod default/legacy-1"
        );
        // The ledger's claim names web-a, the pod that runs on 10.0.0.4: the ledger judges.
        let err = alloc
            .claim_static(
                &["10.0.0.4".parse().unwrap()],
                &request(&set, pod("y"), "u4"),
            )
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("is already held by default/web-a"),
            "{err}"
        );
        assert_eq!(
            alloc.foreign_conflict(&"10.0.0.1".parse().unwrap(), &pod("legacy-0"), None),
            None
        );
        // Exhausted: the message names the foreign users too.
        let err = alloc
            .allocate(&request(&set, pod("web-z"), "u5"))
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("10.0.0.1 by pod default/legacy-0 outside ip-webhook"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn dual_stack_takes_one_per_family_and_dry_run_records_nothing() {
        let alloc = allocator().await;
        let set = parse_ip_spec("10.0.0.10,fd00::10-fd00::11").unwrap();
        let mut req = request(&set, pod("p"), "u1");
        req.dry_run = true;
        let dry = alloc.allocate(&req).await.unwrap();
        assert_eq!(dry.ips.len(), 2);
        assert!(alloc.claims().is_empty());
        req.dry_run = false;
        let real = alloc.allocate(&req).await.unwrap();
        assert_eq!(real.ips, dry.ips);
        // v4 exhausted: the v6 claim of the failed pod is rolled back
        let err = alloc
            .allocate(&request(&set, pod("q"), "u2"))
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("all 1 allocatable IPv4 IPs are held"),
            "{err}"
        );
        assert_eq!(alloc.claims().len(), 2);
    }

    #[tokio::test]
    async fn a_pods_own_claim_missing_from_the_index_is_still_its_own() {
        let alloc = allocator().await;
        let set = parse_ip_spec("10.16.0.16").unwrap();
        let ip: IpAddr = "10.16.0.16".parse().unwrap();
        let mut mutated = request(&set, pod(""), "m-1");
        mutated.token = "tok-a";
        alloc.claim_static(&[ip], &mutated).await.unwrap();
        // a shared ledger's relist that has not seen the claim yet
        alloc.replace_all(Vec::new());
        assert!(alloc.holder(&ip).is_none());
        let mut validated = request(&set, pod("web-a"), "v-1");
        validated.token = "tok-a";
        let own = alloc.claim_static(&[ip], &validated).await.unwrap();
        assert_eq!(own.token, "tok-a");
        assert_eq!(alloc.holder(&ip).unwrap().request_uid, "m-1");
        // another pod, another token: refused as before
        alloc.replace_all(Vec::new());
        let mut other = request(&set, pod("web-b"), "v-2");
        other.token = "tok-b";
        assert!(matches!(
            alloc.claim_static(&[ip], &other).await,
            Err(AllocError::Conflict(_))
        ));
    }

    /// This replica's copy still shows a holder the ledger has already released (another
    /// replica's DELETE): at /validate, where the pod has its UID, the ledger decides; at
    /// /mutate and in a dry run the copy's answer stands.
    #[tokio::test]
    async fn at_validate_a_stale_copy_of_a_holder_is_checked_against_the_ledger() {
        let alloc = allocator().await;
        let set = parse_ip_spec("10.16.0.17").unwrap();
        let ip: IpAddr = "10.16.0.17".parse().unwrap();
        alloc.apply_observed(ObservedChange::Held(external(
            "10.16.0.17",
            "gone",
            "r-gone",
            Phase::Bound,
        )));
        let mut at_mutate = request(&set, pod("db-0"), "m-2");
        at_mutate.token = "tok-d";
        assert!(matches!(
            alloc.claim_static(&[ip], &at_mutate).await,
            Err(AllocError::Conflict(_))
        ));
        let mut at_validate = request(&set, pod("db-0"), "v-2");
        at_validate.token = "tok-d";
        at_validate.pod.uid = Some("uid-d".into());
        at_validate.dry_run = true;
        assert!(matches!(
            alloc.claim_static(&[ip], &at_validate).await,
            Err(AllocError::Conflict(_))
        ));
        at_validate.dry_run = false;
        let granted = alloc.claim_static(&[ip], &at_validate).await.unwrap();
        assert_eq!(granted.token, "tok-d");
        assert_eq!(alloc.holder(&ip).unwrap().request_uid, "v-2");
        // a holder the ledger does have still refuses
        let mut another = request(&set, pod("db-1"), "v-3");
        another.token = "tok-e";
        another.pod.uid = Some("uid-e".into());
        assert!(matches!(
            alloc.claim_static(&[ip], &another).await,
            Err(AllocError::Conflict(_))
        ));
        assert_eq!(alloc.holder(&ip).unwrap().request_uid, "v-2");
    }

    #[tokio::test]
    async fn a_pods_claims_are_found_by_uid_and_token_and_its_delete_terminates_them() {
        let alloc = allocator().await;
        let set = parse_ip_spec("10.16.0.20-10.16.0.21,fd00::20").unwrap();
        let mut req = request(&set, pod(""), "m-1");
        req.token = "tok-a";
        let granted = alloc.allocate(&req).await.unwrap();
        assert_eq!(granted.ips.len(), 2);
        let by_token = identity("", "tok-a");
        assert_eq!(alloc.claims_of(&by_token).len(), 2);
        let bound = PodIdentity {
            uid: Some("uid-a"),
            ..identity("web-a", "tok-a")
        };
        assert_eq!(
            alloc.bind(&bound, &granted.ips, false).await.unwrap().len(),
            2
        );
        // the DELETE of the pod stripped of its annotations, label and token: found by UID
        let stripped = PodIdentity {
            uid: Some("uid-a"),
            token: None,
            ..identity("web-a", "")
        };
        assert_eq!(alloc.claims_of(&stripped).len(), 2);
        assert!(
            alloc
                .claims_of(&PodIdentity {
                    uid: Some("uid-b"),
                    ..stripped
                })
                .is_empty()
        );
        let terminating = alloc.terminate(&stripped, &[], 0).await.unwrap();
        assert_eq!(terminating.len(), 2);
        assert!(terminating.iter().all(|c| c.phase == Phase::Terminating));
        let released = alloc.release_due(unix_now(), None).await;
        assert_eq!(released.len(), 2);
        assert!(alloc.claims().is_empty());
        assert!(alloc.claims_of(&stripped).is_empty());
    }

    #[tokio::test]
    async fn static_conflicts_name_both_pods() {
        let alloc = allocator().await;
        let set = parse_ip_spec("10.16.0.15").unwrap();
        let ip: IpAddr = "10.16.0.15".parse().unwrap();
        alloc
            .claim_static(&[ip], &request(&set, pod("static-7584848b74-fw9dm"), "u1"))
            .await
            .unwrap();
        let err = alloc
            .claim_static(&[ip], &request(&set, pod("web-2"), "u2"))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "static IP 10.16.0.15 requested by default/web-2 is already held by default/static-7584848b74-fw9dm (app default/web)"
        );
        // the holder itself may repeat its claim
        alloc
            .claim_static(&[ip], &request(&set, pod("static-7584848b74-fw9dm"), "u3"))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn large_list_nearly_full_finds_the_gap() {
        let alloc = allocator().await;
        let set = parse_ip_spec("10.8.0.0/16").unwrap();
        {
            let mut state = alloc.lock();
            for ip in set.iter().filter(|ip| ip.to_string() != "10.8.200.7") {
                let claim = new_claim(ip, &request(&set, pod("x"), "bulk"), Source::Allocated);
                let (family, value) = ip_key(&claim.ip);
                state.held.entry(family).or_default().insert(value);
                state.claims.insert(claim.ip, claim.into());
            }
        }
        let got = alloc.allocate(&request(&set, pod("y"), "u")).await.unwrap();
        assert_eq!(got.ips[0].to_string(), "10.8.200.7");
    }

    #[tokio::test]
    async fn a_claim_learned_twice_keeps_its_request_index() {
        // regression: holding a record the index already had dropped its request from the
        // by-request index, so a retried admission of that request got a second IP
        let alloc = allocator().await;
        let set = parse_ip_spec("10.0.0.1-10.0.0.4").unwrap();
        let first = alloc
            .allocate(&request(&set, pod("a"), "u1"))
            .await
            .unwrap();
        let claim = alloc.holder(&first.ips[0]).unwrap();
        {
            let mut state = alloc.lock();
            state.hold(claim.clone());
            state.hold(claim);
        }
        assert_eq!(alloc.held_by_app("default", "web"), 1);
        let retried = alloc
            .allocate(&request(&set, pod("a"), "u1"))
            .await
            .unwrap();
        assert_eq!(retried.ips, first.ips);
        assert_eq!(retried.reasons, vec![Reason::SameRequest]);
        assert_eq!(alloc.claims().len(), 1);
    }

    #[tokio::test]
    async fn observed_claims_and_releases_update_the_index() {
        let alloc = allocator().await;
        let set = parse_ip_spec("10.0.0.1-10.0.0.2").unwrap();
        let elsewhere = new_claim(
            "10.0.0.1".parse().unwrap(),
            &request(&set, pod("other"), "x1"),
            Source::Allocated,
        );
        alloc.apply_observed(ObservedChange::Held(elsewhere.clone()));
        let got = alloc
            .allocate(&request(&set, pod("b"), "u1"))
            .await
            .unwrap();
        assert_eq!(
            got.ips[0].to_string(),
            "10.0.0.2",
            "the observed claim is skipped"
        );
        alloc.apply_observed(ObservedChange::Released(elsewhere));
        let again = alloc
            .allocate(&request(&set, pod("c"), "u2"))
            .await
            .unwrap();
        assert_eq!(
            again.ips[0].to_string(),
            "10.0.0.1",
            "the observed release frees the IP"
        );
        // a release of a claim the index does not hold as such changes nothing
        alloc.apply_observed(ObservedChange::Released(new_claim(
            "10.0.0.2".parse().unwrap(),
            &request(&set, pod("stranger"), "zz"),
            Source::Allocated,
        )));
        assert_eq!(alloc.claims().len(), 2);
    }

    proptest! {
        /// Any interleaving of allocate and release keeps one holder per IP, and released IPs
        /// become allocatable again.
        #[test]
        fn one_holder_per_ip(ops in proptest::collection::vec((0u8..3, 0usize..12), 1..80)) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            rt.block_on(async {
                let alloc = allocator().await;
                let set = parse_ip_spec("10.0.0.1-10.0.0.8").unwrap();
                let mut live: HashMap<String, (IpAddr, String)> = HashMap::new();
                for (step, (op, who)) in ops.into_iter().enumerate() {
                    let name = format!("p{who}");
                    let uid = format!("u{step}");
                    if op < 2 && !live.contains_key(&name) {
                        match alloc.allocate(&request(&set, pod(&name), &uid)).await {
                            Ok(a) => { live.insert(name, (a.ips[0], uid)); }
                            Err(AllocError::Exhausted(_)) => prop_assert_eq!(live.len(), 8),
                            Err(e) => panic!("{e}"),
                        }
                    } else if let Some((ip, token)) = live.remove(&name) {
                        let released = alloc.release_held(&identity(&name, &token), &[ip]).await.unwrap();
                        prop_assert_eq!(released, vec![ip]);
                    }
                    let mut seen = std::collections::HashSet::new();
                    for (ip, _) in live.values() { prop_assert!(seen.insert(*ip), "IP {} twice", ip); }
                    let claims = alloc.claims();
                    prop_assert_eq!(claims.len(), live.len());
                    for claim in claims {
                        prop_assert_eq!(live.get(claim.pod.name.as_str()).map(|(ip, _)| ip), Some(&claim.ip));
                    }
                }
                Ok(())
            })?;
        }
    }
}
