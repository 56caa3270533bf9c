//! What the allocator holds in memory: the held IPs of each family as maximal runs
//! (`RunSet`), the claims by IP, by key (request UID, pod UID, token) and by app, and the
//! choice of a free IP.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use super::by_key::ByKey;
use super::foreign::{ForeignIps, ForeignUse};
use super::ipset::{Family, ip_from_key, ip_key};
use super::messages::{HOLDERS_NAMED, holder_list};
use super::request::{AllocationRequest, Reason, new_claim};
use ip_webhook_ledger::claim::{self, PodIdentity, may_take_over, same_grant};
use ip_webhook_ledger::ip_map::IpMap;
use ip_webhook_ledger::{Claim, HexId, Phase, PodRef, Shared, Source, Text, unix_now};

/// Held addresses of one family as maximal runs `start -> end` (inclusive).
#[derive(Debug, Default, Clone)]
pub(crate) struct RunSet {
    runs: BTreeMap<u128, u128>,
}

impl RunSet {
    pub(crate) fn contains(&self, value: u128) -> bool {
        self.runs
            .range(..=value)
            .next_back()
            .is_some_and(|(_, &end)| end >= value)
    }

    pub(crate) fn insert(&mut self, value: u128) {
        if self.contains(value) {
            return;
        }
        let mut start = value;
        let mut end = value;
        if let Some((&s, &e)) = self.runs.range(..value).next_back()
            && e.checked_add(1) == Some(value)
        {
            start = s;
        }
        if let Some(next) = value.checked_add(1)
            && let Some(e) = self.runs.remove(&next)
        {
            end = e;
        }
        self.runs.insert(start, end);
    }

    pub(crate) fn remove(&mut self, value: u128) {
        let Some((&start, &end)) = self.runs.range(..=value).next_back() else {
            return;
        };
        if end < value {
            return;
        }
        self.runs.remove(&start);
        if start < value {
            self.runs.insert(start, value - 1);
        }
        if value < end {
            self.runs.insert(value + 1, end);
        }
    }

    /// The lowest value in `start..=end` not held.
    pub(crate) fn first_free(&self, start: u128, end: u128) -> Option<u128> {
        let mut candidate = start;
        if let Some((_, &run_end)) = self.runs.range(..=candidate).next_back()
            && run_end >= candidate
        {
            if run_end >= end {
                return None;
            }
            candidate = run_end + 1;
        }
        Some(candidate)
    }

    #[cfg(test)]
    pub(crate) fn run_count(&self) -> usize {
        self.runs.len()
    }
}

/// The release time `claim` carries, if it is `Terminating` with one.
/// When a claim's IP may be freed, as its record says (on the writer's clock): a
/// `Terminating` claim's release time; a `Released` one kept for its pod name
/// ([`ip_webhook_ledger::claim::released`]), the sticky grace after its release.
fn release_time(claim: &Claim, sticky_grace: u64) -> Option<u64> {
    match claim.phase {
        Phase::Terminating => claim.release_at.map(ip_webhook_ledger::ReleaseAt::get),
        Phase::Released if claim.sticky => Some(claim.updated_at.saturating_add(sticky_grace)),
        _ => None,
    }
}

/// How long a released StatefulSet pod's claim is kept for its name unless told otherwise
/// (`--sticky-grace`'s default).
pub const DEFAULT_STICKY_GRACE: u64 = 300;

/// Seconds a released sticky claim is kept ([`release_time`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct StickyGrace(pub(super) u64);

impl Default for StickyGrace {
    fn default() -> Self {
        StickyGrace(DEFAULT_STICKY_GRACE)
    }
}

/// When this process frees a `Terminating` claim, on its own clock. The record's release time
/// was written by whichever replica admitted the DELETE, on that replica's clock; what carries
/// over between machines is the grace itself (the release time less the time of the DELETE,
/// both written by that one machine), counted from when this process first saw the claim
/// terminating. A replica whose clock runs ahead cannot free the IP while the pod is still in
/// its grace period.
#[derive(Debug, Clone)]
pub(super) struct LocalRelease {
    request_uid: HexId,
    /// The release time as the record carries it: a new DELETE writes a new one.
    written: u64,
    pub(super) due: u64,
}

impl LocalRelease {
    fn of(claim: &Claim, written: u64, now: u64) -> LocalRelease {
        let due = if claim.updated_at == 0 {
            // no time of the DELETE to measure the grace by
            written
        } else {
            now.saturating_add(written.saturating_sub(claim.updated_at))
        };
        LocalRelease {
            request_uid: claim.request_uid.clone(),
            written,
            due,
        }
    }

    fn is_for(&self, claim: &Claim, written: u64) -> bool {
        self.request_uid == claim.request_uid && self.written == written
    }
}

/// The keys [`State::by_key`] files a claim under: its request's UID, its pod's UID and its
/// token, and the UIDs and tokens of the migration sources a VM's claim remembers (those not
/// empty). A grant this process made has its request and its token under one key
/// ([`claim::new_token`]): that key is yielded once, so filing the grant walks to it once.
fn claim_keys(claim: &Claim) -> impl Iterator<Item = u64> {
    let sources = claim.vm.as_ref().map(|vm| vm.sources()).unwrap_or_default();
    let holders = [(
        claim.pod.uid.as_deref(),
        claim::held_token_key(&claim.token),
    )]
    .into_iter()
    .chain(sources.iter().map(|s| {
        let token = Some(s.token.as_str()).filter(|t| !t.is_empty());
        (s.uid.as_deref(), token.map(claim::token_key))
    }));
    let request =
        (!claim.request_uid.is_empty()).then(|| claim.request_uid.with_str(claim::uid_key));
    let others = holders.flat_map(|(uid, token)| {
        let uid = uid.filter(|uid| !uid.is_empty()).map(claim::uid_key);
        uid.into_iter().chain(token)
    });
    request
        .into_iter()
        .chain(others.filter(move |key| Some(*key) != request))
}

/// The keys a pod's claims are found under: its UID's and its token's ([`claim_keys`]).
pub(super) fn identity_keys(pod: &PodIdentity<'_>) -> impl Iterator<Item = u64> {
    let uid = pod.uid.map(claim::uid_key);
    uid.into_iter().chain(pod.token.map(claim::token_key))
}

/// The name the history remembers a claim's IPs under, if its holder can come back: a
/// virtual machine's name (as `vm/NAME`, which no pod name can be), or a pod name that
/// recurs ([`name_recurs`]).
fn recurring_name(pod: &PodRef, vm: Option<&str>) -> Option<Text> {
    match vm {
        Some(vm) => Some(vm_history_name(vm)),
        None => name_recurs(pod).then(|| pod.name.clone()),
    }
}

fn vm_history_name(vm: &str) -> Text {
    format!("vm/{vm}").into()
}

/// Whether a pod of this name can come back under the same name: a fixed name (a StatefulSet's
/// `db-0`, a bare pod created again) can; a name the API server made from `generateName` (a
/// Deployment's or a Job's pods: the prefix, cut to 58 characters, and five random ones) never
/// does, and keeping it would grow the name history with every pod such an app ever ran.
fn name_recurs(pod: &PodRef) -> bool {
    if pod.name.is_empty() {
        return false;
    }
    if pod.generate_name.is_empty() {
        return true;
    }
    let prefix = pod.generate_name.get(..58).unwrap_or(&pod.generate_name);
    !(pod.name.len() == prefix.len() + 5 && pod.name.starts_with(prefix))
}

/// How many IPs each app holds, by namespace then app: counting a claim in or out looks the
/// app up by reference, without building an owned key on every admission.
#[derive(Default)]
pub(super) struct AppCounts(FastMap<String, FastMap<String, u64>>);

/// foldhash, seeded per process: every grant looks up its namespace, its app and its family.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

impl AppCounts {
    pub(super) fn get(&self, namespace: &str, app: &str) -> u64 {
        self.0
            .get(namespace)
            .and_then(|apps| apps.get(app))
            .copied()
            .unwrap_or(0)
    }

    fn add(&mut self, namespace: &str, app: &str) {
        match self.0.get_mut(namespace).and_then(|apps| apps.get_mut(app)) {
            Some(count) => *count += 1,
            None => {
                self.0
                    .entry(namespace.to_string())
                    .or_default()
                    .insert(app.to_string(), 1);
            }
        }
    }

    fn remove(&mut self, namespace: &str, app: &str) {
        if let Some(count) = self.0.get_mut(namespace).and_then(|apps| apps.get_mut(app)) {
            *count = count.saturating_sub(1);
        }
    }
}

#[derive(Default)]
pub(super) struct State {
    pub(super) held: FastMap<Family, RunSet>,
    // No map that grows with every claim is one hash map: it doubles all at once, and at
    // 229,376 claims that one rehash held every admission for 200 ms (docs/performance.md,
    // "B-trees instead of hash maps"). The maps by IP are B-trees, which grow a node at a
    // time; the map by key is 256 hash tables, each doubling alone.
    /// Shared with the embedded ledger, which keeps the same copy of each claim it records.
    pub(super) claims: IpMap<Arc<Claim>>,
    /// Claims by their request's UID, their pod's UID and their token ([`claim_keys`]): a
    /// retried admission finds what it was granted, and a DELETE what its pod holds by who
    /// the pod is, not by the IPs it shows (which an update may have stripped). One map, not
    /// one per kind of key: a grant files its request and token under the one key its retry
    /// lookup has just read; two maps would cost a second lookup on a cold cache
    /// (docs/performance.md, "One index entry per grant").
    pub(super) by_key: ByKey,
    /// `Terminating` claims by their release time on this process's clock
    /// ([`LocalRelease`]), so the release timer's pass costs what is due, not a scan of every
    /// claim under the lock each second.
    pub(super) releasing: BTreeSet<(u64, IpAddr)>,
    /// The release time of each `Terminating` claim on this process's clock, kept while the
    /// claim is learned again (a reload, a resync) so its grace is not counted anew.
    pub(super) local_release: BTreeMap<IpAddr, LocalRelease>,
    /// Last IPs of a pod name of an app: `(namespace, app, pod name)`, for names that can come
    /// back ([`name_recurs`]).
    pub(super) history: BTreeMap<(Shared, Shared, Text), Vec<IpAddr>>,
    pub(super) held_per_app: AppCounts,
    pub(super) sticky_grace: StickyGrace,
}

impl State {
    /// The claims granted to admission request `uid`, in the order they were granted.
    pub(super) fn granted_to(&self, uid: &str) -> Vec<&Claim> {
        if uid.is_empty() {
            return Vec::new();
        }
        let key = claim::uid_key(uid);
        self.by_key
            .claims(key, &self.claims, |claim| claim.request_uid == uid)
    }

    pub(super) fn is_held(&self, ip: &IpAddr) -> bool {
        let (family, value) = ip_key(ip);
        self.held.get(&family).is_some_and(|r| r.contains(value))
    }

    pub(super) fn hold(&mut self, claim: impl Into<Arc<Claim>>) {
        let claim = claim.into();
        // forget what the IP's previous record indexed before indexing the new one: the two
        // may share a request (the same claim learned twice)
        if let Some(previous) = self.claims.insert(claim.ip, claim.clone()) {
            self.forget_indexes(&previous);
        }
        self.index_rest(&claim);
        self.remember(&claim);
    }

    /// Index `claims`, in this order, into an index that holds none: what [`State::hold`] of
    /// each would leave (a later claim on an IP replaces an earlier one), but for the name
    /// history, which the caller keeps ([`State::remember`]) in its own order.
    ///
    /// The map by IP is built at once from the sorted claims, its nodes full: filled one
    /// claim at a time in ascending order (as a ledger lists them) a B-tree keeps its nodes
    /// about half full, and rebuilding it afterwards does not give the freed nodes' memory
    /// back. Building it first, and the maps by key after it one claim at a time, lets their
    /// nodes reuse the memory the sort took (docs/performance.md, "Memory per held claim").
    pub(super) fn index_all(&mut self, claims: Vec<Arc<Claim>>) {
        debug_assert!(self.claims.is_empty(), "an index that holds no claim");
        let mut by_ip: Vec<(usize, Arc<Claim>)> = claims.into_iter().enumerate().collect();
        // stable: the claims on one IP stay in their order
        by_ip.sort_by_key(|(_, claim)| claim.ip);
        by_ip.dedup_by(|later, earlier| {
            // `dedup_by` keeps the first of a run of equal IPs: keep the later claim in it
            let same = later.1.ip == earlier.1.ip;
            if same {
                std::mem::swap(later, earlier);
            }
            same
        });
        self.claims = by_ip
            .iter()
            .map(|(_, claim)| (claim.ip, claim.clone()))
            .collect();
        by_ip.sort_by_key(|(order, _)| *order);
        for (_, claim) in by_ip {
            self.index_rest(&claim);
        }
    }

    /// What `hold` indexes besides the claim by IP: its keys, its IP among the held runs, its
    /// release time, its app's count.
    fn index_rest(&mut self, claim: &Claim) {
        for key in claim_keys(claim) {
            self.by_key.add(key, claim.ip);
        }
        let (family, value) = ip_key(&claim.ip);
        self.held.entry(family).or_default().insert(value);
        match release_time(claim, self.sticky_grace.0) {
            Some(written) => {
                let local = match self.local_release.get(&claim.ip) {
                    Some(seen) if seen.is_for(claim, written) => seen.clone(),
                    _ => LocalRelease::of(claim, written, unix_now()),
                };
                self.releasing.insert((local.due, claim.ip));
                self.local_release.insert(claim.ip, local);
            }
            None => {
                self.local_release.remove(&claim.ip);
            }
        }
        self.held_per_app.add(&claim.pod.namespace, &claim.app);
    }

    pub(super) fn forget_indexes(&mut self, claim: &Claim) {
        for key in claim_keys(claim) {
            self.by_key.remove(key, claim.ip);
        }
        if let Some(local) = self.local_release.get(&claim.ip) {
            self.releasing.remove(&(local.due, claim.ip));
        }
        self.held_per_app.remove(&claim.pod.namespace, &claim.app);
    }

    /// Drop the claim on `ip` if it is `claim`'s grant (same request and token).
    pub(super) fn unhold(&mut self, claim: &Claim) -> bool {
        match self.claims.get(&claim.ip) {
            Some(current) if same_grant(current, claim) => {}
            _ => return false,
        }
        let removed = self.claims.remove(&claim.ip).expect("checked above");
        self.forget_indexes(&removed);
        self.local_release.remove(&claim.ip);
        let (family, value) = ip_key(&claim.ip);
        if let Some(runs) = self.held.get_mut(&family) {
            runs.remove(value);
        }
        true
    }

    pub(super) fn remember(&mut self, claim: &Claim) {
        let Some(name) = recurring_name(&claim.pod, claim.vm.as_deref()) else {
            return;
        };
        let key = (claim.pod.namespace.clone(), claim.app.clone(), name);
        let ips = self.history.entry(key).or_default();
        ips.retain(|ip| Family::of(ip) != Family::of(&claim.ip));
        ips.push(claim.ip);
    }

    /// A record the same pod name of the same app may take over ([`claim::may_take_over`]):
    /// a reservation whose pod was never created, a terminating pod's claim, or a released
    /// one kept for the name; for a virtual machine's launcher pod, its VM's claim.
    pub(super) fn kept_for(&self, ip: &IpAddr, request: &AllocationRequest<'_>) -> bool {
        (request.vm.is_some() || !request.pod.name.is_empty())
            && self.claims.get(ip).is_some_and(|held| {
                may_take_over(held, &new_claim(*ip, request, Source::Allocated))
            })
    }

    /// Who outside the ledger uses `ip`, as the cluster says: not the requesting pod itself
    /// (nor, for a launcher pod, another launcher pod of its VM), nor the holder the ledger's
    /// claim on `ip` names, a pod or a VM through any of its launcher pods (that is the
    /// ledger's to judge).
    pub(super) fn used_elsewhere(
        &self,
        ip: &IpAddr,
        pod: &PodRef,
        vm: Option<&str>,
        foreign: Option<&dyn ForeignIps>,
    ) -> Option<ForeignUse> {
        let user = foreign?.user(ip)?;
        if user.is_pod(&pod.namespace, &pod.name) || user.runs_vm(&pod.namespace, vm) {
            return None;
        }
        match self.claims.get(ip) {
            Some(claim) if user.is_pod(&claim.pod.namespace, &claim.pod.name) => None,
            Some(claim) if user.runs_vm(&claim.pod.namespace, claim.vm.as_deref()) => None,
            // Kube-OVN records a KubeVirt VM's IP under the VM's name, not its launcher pod's
            // (kubeovn/kube-ovn pkg/controller/pod.go, getNameByPod, with keep-vm-ip)
            Some(claim)
                if claim
                    .vm
                    .as_deref()
                    .is_some_and(|vm| user.is_pod(&claim.pod.namespace, vm)) =>
            {
                None
            }
            _ => Some(user),
        }
    }

    pub(super) fn choose(
        &self,
        request: &AllocationRequest<'_>,
        family: Family,
        foreign: Option<&dyn ForeignIps>,
    ) -> Option<(IpAddr, Reason)> {
        let set = request.candidates;
        let elsewhere = |ip: &IpAddr| {
            self.used_elsewhere(ip, &request.pod, request.vm, foreign)
                .is_some()
        };
        let free = |ip: &IpAddr| {
            set.contains(ip) && (!self.is_held(ip) || self.kept_for(ip, request)) && !elsewhere(ip)
        };
        if let Some(ordinal) = request.ordinal
            && let Some(ip) = set.nth(family, ordinal as u128)
            && free(&ip)
        {
            return Some((ip, Reason::StatefulSetOrdinal));
        }
        let returning = match request.vm {
            Some(vm) => Some(vm_history_name(vm)),
            None => (!request.pod.name.is_empty()).then(|| request.pod.name.clone()),
        };
        if let Some(name) = returning {
            let key = (
                request.pod.namespace.clone(),
                Shared::from(request.app),
                name,
            );
            if let Some(ip) = self
                .history
                .get(&key)
                .and_then(|ips| ips.iter().find(|ip| Family::of(ip) == family))
                && free(ip)
            {
                return Some((*ip, Reason::PreviousHolder));
            }
        }
        let runs = self.held.get(&family);
        for range in set.family_ranges(family) {
            let mut start = range.start;
            loop {
                let value = match runs {
                    Some(runs) => runs.first_free(start, range.end),
                    None => Some(start),
                };
                let Some(value) = value else { break };
                let ip = ip_from_key(family, value);
                // A free IP a pod outside the ledger runs on is skipped.
                if !elsewhere(&ip) {
                    return Some((ip, Reason::LowestFree));
                }
                if value >= range.end {
                    break;
                }
                start = value + 1;
            }
        }
        None
    }

    pub(super) fn exhausted_message(
        &self,
        request: &AllocationRequest<'_>,
        family: Family,
        foreign: Option<&dyn ForeignIps>,
    ) -> String {
        let set = request.candidates;
        let dual = set.families().len() > 1;
        let total: u128 = set.family_ranges(family).map(|r| r.len()).sum();
        let mut holders = Vec::new();
        let mut named = 0usize;
        for ip in set.family_ranges(family).flat_map(|r| {
            (0..r.len().min(HOLDERS_NAMED as u128)).map(move |i| ip_from_key(family, r.start + i))
        }) {
            if named == HOLDERS_NAMED {
                break;
            }
            if let Some(claim) = self.claims.get(&ip) {
                holders.push(format!("{ip} by {}", claim.holder()));
                named += 1;
            } else if let Some(user) = self.used_elsewhere(&ip, &request.pod, request.vm, foreign) {
                holders.push(format!("{ip} by {} outside ip-webhook", user.describe()));
                named += 1;
            }
        }
        let list = holder_list(&holders, total);
        let family_word = if dual {
            format!("{} ", family.name())
        } else {
            String::new()
        };
        let noun = if request.pool.is_some() {
            ""
        } else {
            "allocatable "
        };
        format!(
            "{}: all {total} {noun}{family_word}IPs are held ({list})",
            request.scope
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reservation of app `web` by request `uid`, for no pod yet.
    fn reserved(ip: &str, uid: &str) -> Claim {
        Claim {
            pod: PodRef::default(),
            ..crate::test_claims::builder(ip, "web", "")
                .request(uid)
                .build()
        }
    }

    #[test]
    fn only_names_that_can_come_back_recur() {
        let pod = |name: &str, generate_name: &str| PodRef {
            namespace: "default".into(),
            name: name.into(),
            generate_name: generate_name.into(),
            uid: None,
        };
        assert!(name_recurs(&pod("db-0", "")));
        assert!(!name_recurs(&pod("", "web-7d4b9c-")), "not named yet");
        assert!(!name_recurs(&pod("web-7d4b9c-x2x9q", "web-7d4b9c-")));
        // both set: the API server keeps the name, which may come back
        assert!(name_recurs(&pod("web-main", "web-")));
        // a long prefix is cut to 58 characters before the random five
        let long = "a".repeat(70);
        assert!(!name_recurs(&pod(&format!("{}b2c3d", &long[..58]), &long)));
        assert!(name_recurs(&pod(&format!("{long}b2c3d"), &long)));
    }

    /// Everything a claim is indexed under, to compare two indexes by.
    fn indexed(state: &State) -> String {
        let claims: Vec<_> = state.claims.values().map(|c| (c.ip, c.phase)).collect();
        let by_key = state.by_key.entries();
        let local: Vec<_> = state
            .local_release
            .iter()
            .map(|(ip, l)| (ip, l.due))
            .collect();
        // `held` is a hash map: its order says nothing
        let mut runs: Vec<String> = state
            .held
            .values()
            .map(|r| format!("{:?}", r.runs))
            .collect();
        runs.sort();
        format!(
            "{claims:?} {by_key:?} {:?} {local:?} {runs:?} {}",
            state.releasing,
            state.held_per_app.get("", "web")
        )
    }

    #[test]
    fn indexing_all_at_once_leaves_what_holding_each_in_turn_does() {
        let terminating = |ip: &str, uid: &str, token: &str| Claim {
            phase: Phase::Terminating,
            release_at: Some(ip_webhook_ledger::ReleaseAt::new(100)),
            updated_at: 0,
            token: token.into(),
            pod: PodRef {
                uid: Some(format!("pod-{uid}").into()),
                ..PodRef::default()
            },
            ..reserved(ip, uid)
        };
        let claims: Vec<Arc<Claim>> = [
            reserved("10.0.0.3", "uid-a"),
            terminating("10.0.0.1", "uid-b", "t1"),
            // a dual-stack pod: two IPs under one request and one token
            terminating("fd00::1", "uid-c", "t2"),
            terminating("10.0.0.9", "uid-c", "t2"),
            reserved("10.0.0.2", "uid-d"),
            // a later claim on an IP replaces the earlier one
            reserved("10.0.0.3", "uid-e"),
        ]
        .into_iter()
        .map(Arc::new)
        .collect();
        let mut one_by_one = State::default();
        for claim in &claims {
            one_by_one.hold(claim.clone());
        }
        let mut at_once = State::default();
        at_once.index_all(claims);
        assert_eq!(indexed(&at_once), indexed(&one_by_one));
        assert_eq!(at_once.claims.len(), 5);
    }

    #[test]
    fn requests_sharing_a_key_keep_their_own_claims() {
        let mut state = State::default();
        for claim in [
            reserved("10.0.0.1", "uid-a"),
            reserved("10.0.0.2", "uid-b"),
            reserved("10.0.0.3", "uid-a"),
        ] {
            state.claims.insert(claim.ip, Arc::new(claim));
        }
        // a forced collision: every IP filed under uid-a's key
        let key_a = claim::uid_key("uid-a");
        for ip in state.claims.keys().collect::<Vec<_>>() {
            state.by_key.add(key_a, ip);
        }
        let ips = |state: &State, uid| -> Vec<String> {
            state
                .granted_to(uid)
                .iter()
                .map(|c| c.ip.to_string())
                .collect()
        };
        assert_eq!(ips(&state, "uid-a"), ["10.0.0.1", "10.0.0.3"]);
        state.by_key.remove(key_a, "10.0.0.1".parse().unwrap());
        assert_eq!(ips(&state, "uid-a"), ["10.0.0.3"]);
        // uid-b's claim was filed under another key: found only once filed under its own
        assert!(ips(&state, "uid-b").is_empty());
        state
            .by_key
            .add(claim::uid_key("uid-b"), "10.0.0.2".parse().unwrap());
        assert_eq!(ips(&state, "uid-b"), ["10.0.0.2"]);
        assert!(ips(&state, "").is_empty(), "no request has an empty UID");
    }

    /// A grant this process made files its request and its token under one key; a claim
    /// whose token another process issued, under two; either way `unhold` leaves no key.
    #[test]
    fn a_grant_files_its_request_and_token_under_one_key() {
        let ours = |ip: &str, uid: &str| Claim {
            token: claim::new_token(uid).into(),
            ..reserved(ip, uid)
        };
        let mut state = State::default();
        // dual-stack: two IPs of one request and one token
        state.hold(ours("10.0.0.1", "uid-a"));
        state.hold(ours("fd00::1", "uid-a"));
        let key = claim::uid_key("uid-a");
        assert_eq!(
            claim_keys(&ours("10.0.0.3", "uid-a")).collect::<Vec<_>>(),
            [key],
            "the request and its token are one key, yielded once"
        );
        assert_eq!(state.by_key.len(), 1);
        assert_eq!(
            state.by_key.ips(key),
            [
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                "fd00::1".parse().unwrap()
            ],
            "each IP once, in the order granted"
        );
        let token = state.claims.values().next().unwrap().token.to_string();
        let identity = PodIdentity {
            namespace: "",
            name: "",
            uid: None,
            token: Some(&token),
        };
        assert_eq!(identity_keys(&identity).collect::<Vec<_>>(), [key]);
        let mut theirs = reserved("10.0.0.2", "uid-b");
        theirs.token = "00000000000000010000000000000001".into();
        theirs.pod.uid = Some("pod-b".into());
        state.hold(theirs.clone());
        assert_eq!(state.by_key.len(), 4, "uid-b, its pod's UID and its token");
        for held in state
            .claims
            .values()
            .map(|c| (**c).clone())
            .collect::<Vec<_>>()
        {
            assert!(state.unhold(&held));
        }
        assert!(state.by_key.len() == 0, "{:?}", state.by_key.entries());
    }

    /// Tokens whose digits were chosen (a pod's own, a tool's) never crowd one key: each
    /// claim's IP is filed alone under its request's key and its token's.
    #[test]
    fn tokens_sharing_their_first_digits_do_not_share_a_key() {
        let mut state = State::default();
        for n in 0..1000u32 {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + n));
            state.hold(Claim {
                token: format!("{n:032x}").into(),
                ..reserved(&ip.to_string(), &format!("uid-{n}"))
            });
        }
        assert_eq!(state.by_key.len(), 2000);
        assert_eq!(state.by_key.v4_len(), 2000, "each key one IPv4 address");
    }
}
