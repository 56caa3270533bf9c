//! The leader's view of the claims and pods from one pass to the next ([`LeaderView`]): each
//! claim's sighting, and indexes kept in step with what changed, so that an incremental pass
//! plans only the claims whose plan may have changed instead of every claim.
//!
//! A claim's plan ([`reconcile::plan_claim`]) reads the claim, its sighting, its pod (by UID),
//! and for a reservation every pod, and changes with time only at the moment it names. So a
//! pass plans again: the claims that changed, the claims whose pod changed, every reservation
//! not bound to a pod, every claim whose moment has come, and every claim acted on by the last
//! plan (until the watch shows the change); the plan of any other claim is still "nothing".
//! Duplicates and token adoptions come from indexes of the live pods by IP. The plan is the
//! one [`reconcile::plan`] makes of the whole state (a property test below checks it), at the
//! cost of what changed rather than of every claim: a pass over a few hundred claims touched
//! each of them, about a quarter of a millisecond of cache misses per admission.

use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Arc;

use super::reconcile::{
    self, ClaimingPod, FastSet, Holdings, Plan, PodMap, Rules, Sightings, adopts_by_token,
};
use ip_webhook_ledger::crd::IPClaim;

type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A claim the claim watch changed: its name, and its object now (`None`: gone).
pub(crate) type ClaimChange = (Box<str>, Option<Arc<IPClaim>>);

/// Keys, with how many claims hold each.
#[derive(Debug)]
struct Counts<K>(FastMap<K, u32>);

impl<K> Default for Counts<K> {
    fn default() -> Self {
        Counts(FastMap::default())
    }
}

impl<K: Hash + Eq> Counts<K> {
    /// One more holder of `key`; whether it had none before.
    fn add(&mut self, key: K) -> bool {
        let count = self.0.entry(key).or_insert(0);
        *count += 1;
        *count == 1
    }

    /// One holder of `key` fewer; whether it has none now.
    fn remove<Q: Hash + Eq + ?Sized>(&mut self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        match self.0.get_mut(key) {
            Some(count) if *count > 1 => {
                *count -= 1;
                false
            }
            Some(_) => {
                self.0.remove(key);
                true
            }
            None => false,
        }
    }

    fn contains<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.0.contains_key(key)
    }
}

/// Put the claim `name` under `key` in an index of claim names.
fn add_name(index: &mut FastMap<Box<str>, Vec<Box<str>>>, key: Box<str>, name: &str) {
    index.entry(key).or_default().push(name.into());
}

/// Take the claim `name` from under `key` in an index of claim names.
fn remove_name(index: &mut FastMap<Box<str>, Vec<Box<str>>>, key: &str, name: &str) {
    if let Some(names) = index.get_mut(key) {
        names.retain(|n| **n != *name);
        if names.is_empty() {
            index.remove(key);
        }
    }
}

/// What the indexes hold of one claim object, to take it out again when it changes.
#[derive(Debug, Default)]
struct Indexed {
    /// Its `spec.ip`, readable or not.
    claimed: Option<IpAddr>,
    /// Its `spec.podUid`.
    names_pod: Option<Box<str>>,
    /// Readable: the IP it records and the UID of its pod, if bound to one.
    recorded: Option<(IpAddr, Option<Box<str>>)>,
}

/// See the module's documentation.
#[derive(Debug)]
pub(crate) struct LeaderView {
    seen: Sightings,
    indexed: FastMap<Box<str>, Indexed>,
    /// IPs claim objects hold ([`Holdings::holds_ip`]).
    claimed: Counts<IpAddr>,
    /// Claim objects by the pod UID they name, readable or not ([`Holdings::names_pod`]):
    /// when that pod shows up, each of them has seen its pod, as a pass over every claim
    /// ([`Sightings::observe`]) would note.
    naming_pod: FastMap<Box<str>, Vec<Box<str>>>,
    /// IPs readable claims record (token adoption's "recorded").
    recorded: Counts<IpAddr>,
    /// Readable claims by the UID of their pod.
    by_pod: FastMap<Box<str>, Vec<Box<str>>>,
    /// Readable claims bound to no pod: any pod may take one up, so each pass plans them.
    unbound: BTreeSet<Box<str>>,
    /// When each claim's plan changes with time alone.
    dues: FastMap<Box<str>, u64>,
    /// Claims the last plan acted on.
    acted: Vec<Box<str>>,
    /// The IPs of each live (not Terminating) pod.
    live: FastMap<Box<str>, Vec<IpAddr>>,
    /// Live pods by IP.
    carriers: FastMap<IpAddr, Vec<Box<str>>>,
    /// IPs two or more live pods carry.
    shared: BTreeSet<IpAddr>,
    /// Live pods carrying a claim token on an IP no readable claim records.
    unrecorded: FastSet<Box<str>>,
    /// IPs no claim object holds any more since the last [`LeaderView::take_released`].
    released: Vec<IpAddr>,
    /// Claims to plan on the next pass.
    dirty: BTreeSet<Box<str>>,
    /// Not built from the caches (a new view, or one made from a fresh list): the next pass
    /// must rebuild it from them before it can apply their changes.
    stale: bool,
}

impl Default for LeaderView {
    fn default() -> Self {
        LeaderView {
            seen: Sightings::default(),
            indexed: FastMap::default(),
            claimed: Counts::default(),
            naming_pod: FastMap::default(),
            recorded: Counts::default(),
            by_pod: FastMap::default(),
            unbound: BTreeSet::new(),
            dues: FastMap::default(),
            acted: Vec::new(),
            live: FastMap::default(),
            carriers: FastMap::default(),
            shared: BTreeSet::new(),
            unrecorded: FastSet::default(),
            released: Vec::new(),
            dirty: BTreeSet::new(),
            stale: true,
        }
    }
}

impl Holdings for LeaderView {
    fn holds_ip(&self, ip: &IpAddr) -> bool {
        self.claimed.contains(ip)
    }

    fn names_pod(&self, uid: &str) -> bool {
        self.naming_pod.contains_key(uid)
    }
}

impl LeaderView {
    /// Whether the next pass must rebuild the view from the caches.
    pub(crate) fn is_stale(&self) -> bool {
        self.stale
    }

    /// Forget everything (a replica that no longer leads): a new leader counts claims' ages
    /// from when it sees them.
    pub(crate) fn clear(&mut self) {
        *self = LeaderView::default();
    }

    /// Rebuild from every claim and pod; `from_caches`: they are the watch caches' (else a
    /// fresh list, and the next pass rebuilds from the caches). Every claim is planned next.
    pub(crate) fn rebuild(
        &mut self,
        claims: &[Arc<IPClaim>],
        pods: &PodMap,
        now: u64,
        from_caches: bool,
    ) {
        let before: Vec<IpAddr> = self.claimed.0.keys().copied().collect();
        self.seen.observe(claims, pods, now);
        let seen = std::mem::take(&mut self.seen);
        let released = std::mem::take(&mut self.released);
        *self = LeaderView {
            seen,
            released,
            stale: !from_caches,
            ..LeaderView::default()
        };
        let mut flipped = Vec::new();
        for resource in claims {
            let name: Box<str> = resource.metadata.name.as_deref().unwrap_or_default().into();
            self.index_claim(&name, &mut flipped);
            self.dirty.insert(name);
        }
        for (uid, pod) in pods {
            self.add_live(uid, pod);
        }
        let uids: Vec<Box<str>> = self.live.keys().cloned().collect();
        for uid in &uids {
            self.recheck_token(uid, pods);
        }
        let gone = before.into_iter().filter(|ip| !self.claimed.contains(ip));
        self.released.extend(gone);
    }

    /// Apply what changed since the last pass: `claims`, each changed claim's name with its
    /// object as the claim cache holds it now (`None`: gone); `pod_uids`, the pods that
    /// changed, with `pods` the pod cache as of then.
    pub(crate) fn apply(
        &mut self,
        claims: Vec<ClaimChange>,
        pod_uids: &[Box<str>],
        pods: &PodMap,
        now: u64,
    ) {
        let mut flipped = Vec::new();
        let mut unclaimed = Vec::new();
        for (name, resource) in claims {
            if let Some(ip) = self.unindex_claim(&name, &mut flipped) {
                unclaimed.push(ip);
            }
            match &resource {
                Some(resource) => {
                    self.seen.observe_one(resource, pods, now);
                    self.index_claim(&name, &mut flipped);
                }
                None => self.seen.forget(&name),
            }
            self.dirty.insert(name);
        }
        for uid in pod_uids {
            self.remove_live(uid);
            if let Some(pod) = pods.get(&**uid) {
                self.add_live(uid, pod);
            }
            self.recheck_token(uid, pods);
            if pods.contains_key(&**uid) {
                for name in self.naming_pod.get(uid).into_iter().flatten() {
                    self.seen.note_pod_seen(name);
                }
            }
            let names = self.by_pod.get(uid).into_iter().flatten();
            self.dirty.extend(names.cloned());
        }
        // a pod whose IP a claim came to record, or ceased to, may adopt differently
        for ip in flipped {
            let uids = self.carriers.get(&ip).cloned().unwrap_or_default();
            for uid in &uids {
                self.recheck_token(uid, pods);
            }
        }
        let gone = unclaimed
            .into_iter()
            .filter(|ip| !self.claimed.contains(ip));
        self.released.extend(gone);
    }

    /// The plan of this pass (see the module's documentation); `pods` as given to the last
    /// [`LeaderView::apply`] or [`LeaderView::rebuild`].
    pub(crate) fn plan(&mut self, pods: &PodMap, now: u64, rules: Rules) -> Plan {
        let mut names = std::mem::take(&mut self.dirty);
        names.extend(self.unbound.iter().cloned());
        names.extend(self.acted.drain(..));
        let due = self.dues.iter().filter(|(_, at)| **at <= now);
        names.extend(due.map(|(name, _)| name.clone()));
        let mut plan = Plan::default();
        let by_pod = &self.by_pod;
        let bound = |uid: &str| by_pod.contains_key(uid);
        for name in names {
            let planned = self.seen.last_read(&name).and_then(|(resource, _)| {
                let claim = self.seen.claim(resource)?;
                let plan =
                    reconcile::plan_claim(resource, &claim, pods, &self.seen, now, rules, &bound);
                Some(plan)
            });
            let planned = planned.unwrap_or_default();
            match planned.due {
                Some(at) => self.dues.insert(name.clone(), at),
                None => self.dues.remove(&name),
            };
            if planned.action.is_some() {
                self.acted.push(name);
            }
            plan.actions.extend(planned.action);
        }
        plan.next_due = self.dues.values().min().copied();
        plan.duplicates = self.duplicates(pods);
        let candidates = self.unrecorded.iter().filter_map(|uid| pods.get(&**uid));
        let recorded = |ip: &IpAddr| self.recorded.contains(ip);
        reconcile::plan_token_adoptions(&mut plan, candidates, &recorded);
        plan
    }

    /// The IPs claim objects hold.
    pub(crate) fn claimed_ips(&self) -> impl Iterator<Item = IpAddr> + Clone + '_ {
        self.claimed.0.keys().copied()
    }

    /// The IPs no claim object has held since the last call.
    pub(crate) fn take_released(&mut self) -> Vec<IpAddr> {
        std::mem::take(&mut self.released)
    }

    /// Every IP two or more live pods carry, with those pods ([`reconcile::duplicates`]).
    fn duplicates(&self, pods: &PodMap) -> Vec<reconcile::Duplicate> {
        let carried = self
            .shared
            .iter()
            .flat_map(|ip| {
                let carriers = self.carriers.get(ip).map(Vec::as_slice).unwrap_or_default();
                carriers
                    .iter()
                    .filter_map(|uid| pods.get(&**uid))
                    .map(move |pod| (*ip, pod))
            })
            .collect();
        reconcile::duplicates_among(carried)
    }

    /// Put the claim `name`, as the sightings last read it, into the indexes; the IPs whose
    /// "recorded" it turned on go to `flipped`.
    fn index_claim(&mut self, name: &str, flipped: &mut Vec<IpAddr>) {
        let Some((resource, claim)) = self.seen.last_read(name) else {
            return;
        };
        let mut indexed = Indexed {
            claimed: resource.spec.ip.parse().ok(),
            names_pod: resource.spec.pod_uid.as_deref().map(Box::from),
            recorded: claim.map(|c| (c.ip, c.pod.uid.as_deref().map(Box::from))),
        };
        if let Some(ip) = indexed.claimed {
            self.claimed.add(ip);
        }
        if let Some(uid) = indexed.names_pod.clone() {
            add_name(&mut self.naming_pod, uid, name);
        }
        if let Some((ip, pod)) = &mut indexed.recorded {
            if self.recorded.add(*ip) {
                flipped.push(*ip);
            }
            match pod {
                Some(uid) => add_name(&mut self.by_pod, uid.clone(), name),
                None => {
                    self.unbound.insert(name.into());
                }
            }
        }
        self.indexed.insert(name.into(), indexed);
    }

    /// Take the claim `name` out of the indexes; the IPs whose "recorded" it turned off go to
    /// `flipped`. Returns the IP it held.
    fn unindex_claim(&mut self, name: &str, flipped: &mut Vec<IpAddr>) -> Option<IpAddr> {
        let indexed = self.indexed.remove(name)?;
        if let Some(ip) = indexed.claimed {
            self.claimed.remove(&ip);
        }
        if let Some(uid) = &indexed.names_pod {
            remove_name(&mut self.naming_pod, uid, name);
        }
        if let Some((ip, pod)) = indexed.recorded {
            if self.recorded.remove(&ip) {
                flipped.push(ip);
            }
            match pod {
                Some(uid) => remove_name(&mut self.by_pod, &uid, name),
                None => {
                    self.unbound.remove(name);
                }
            }
        }
        self.dues.remove(name);
        indexed.claimed
    }

    fn add_live(&mut self, uid: &str, pod: &ClaimingPod) {
        if pod.terminating {
            return;
        }
        for ip in &pod.ips {
            let carriers = self.carriers.entry(*ip).or_default();
            carriers.push(uid.into());
            if carriers.len() == 2 {
                self.shared.insert(*ip);
            }
        }
        self.live.insert(uid.into(), pod.ips.clone());
    }

    fn remove_live(&mut self, uid: &str) {
        let Some(ips) = self.live.remove(uid) else {
            return;
        };
        for ip in ips {
            let Some(carriers) = self.carriers.get_mut(&ip) else {
                continue;
            };
            carriers.retain(|c| **c != *uid);
            match carriers.len() {
                0 => {
                    self.carriers.remove(&ip);
                }
                1 => {
                    self.shared.remove(&ip);
                }
                _ => {}
            }
        }
    }

    /// Whether the pod `uid` is a token adoption's candidate, from `pods` and the recorded IPs.
    fn recheck_token(&mut self, uid: &str, pods: &PodMap) {
        let recorded = |ip: &IpAddr| self.recorded.contains(ip);
        if pods
            .get(uid)
            .is_some_and(|pod| adopts_by_token(pod, &recorded))
        {
            self.unrecorded.insert(uid.into());
        } else {
            self.unrecorded.remove(uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ip_webhook_ledger::kubernetes::to_resource;
    use ip_webhook_ledger::{Claim, Phase, PodRef, Source};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const T0: u64 = 1_700_000_000;
    const RULES: Rules = Rules {
        reservation_ttl: 120,
        sticky_grace: 300,
    };
    const TOKENS: [&str; 2] = [
        "0123456789abcdef0123456789abcdef",
        "fedcba9876543210fedcba9876543210",
    ];

    /// One change the watches can bring between two passes, or a pass alone.
    #[derive(Debug, Clone)]
    enum Step {
        /// The claim on 10.0.0.`ip` written: in `phase` (0 Reserved, 1 Bound, 2 Terminating,
        /// 3 Released), bound to pod `pod` or to none, with token `token`; `corrupt`: its
        /// `spec.ip` is not its name's (unreadable).
        Claim {
            ip: u8,
            phase: u8,
            pod: Option<u8>,
            token: Option<usize>,
            sticky: bool,
            vm: bool,
            corrupt: bool,
        },
        Unclaim {
            ip: u8,
        },
        /// Pod `uid` written, on IPs 10.0.0.`ips`.
        Pod {
            uid: u8,
            ips: Vec<u8>,
            terminating: bool,
            token: Option<usize>,
            born: u8,
            vm: bool,
        },
        Unpod {
            uid: u8,
        },
        Wait {
            seconds: u16,
        },
        /// The changes were lost (a relist, or too many): the view is rebuilt.
        Rebuild,
    }

    fn step() -> impl Strategy<Value = Step> {
        let ip = 1u8..6;
        prop_oneof![
            4 => (ip.clone(), 0u8..4, proptest::option::of(0u8..6), proptest::option::of(0usize..2),
                any::<bool>(), proptest::bool::weighted(0.2), proptest::bool::weighted(0.1))
                .prop_map(|(ip, phase, pod, token, sticky, vm, corrupt)| Step::Claim {
                    ip, phase, pod, token, sticky, vm, corrupt
                }),
            2 => ip.clone().prop_map(|ip| Step::Unclaim { ip }),
            4 => (0u8..6, proptest::collection::vec(1u8..6, 0..3), proptest::bool::weighted(0.2),
                proptest::option::of(0usize..2), 0u8..4, proptest::bool::weighted(0.2))
                .prop_map(|(uid, ips, terminating, token, born, vm)| Step::Pod {
                    uid, ips, terminating, token, born, vm
                }),
            2 => (0u8..6).prop_map(|uid| Step::Unpod { uid }),
            3 => prop_oneof![Just(0u16), 1u16..100, 100u16..400].prop_map(|seconds| Step::Wait { seconds }),
            1 => Just(Step::Rebuild),
        ]
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn claim(step: &Step, now: u64, written: u64) -> IPClaim {
        let Step::Claim {
            ip: last,
            phase,
            pod,
            token,
            sticky,
            vm,
            corrupt,
        } = *step
        else {
            unreachable!()
        };
        let phase = [
            Phase::Reserved,
            Phase::Bound,
            Phase::Terminating,
            Phase::Released,
        ][usize::from(phase)];
        let mut resource = to_resource(&Claim {
            ip: ip(last),
            app: "web".into(),
            pool: None,
            pod: PodRef {
                namespace: "default".into(),
                name: pod.map(|p| format!("p{p}")).unwrap_or_default().into(),
                generate_name: "p".into(),
                uid: pod.map(|p| format!("u{p}").into()),
            },
            request_uid: format!("req-{written}").into(),
            phase,
            source: Source::Allocated,
            created_at: now,
            updated_at: now,
            list_size: None,
            token: token.map(|t| TOKENS[t]).unwrap_or_default().into(),
            release_at: (phase == Phase::Terminating)
                .then(|| ip_webhook_ledger::ReleaseAt::new(now)),
            sticky,
            vm: vm.then(|| "vm".into()),
        });
        resource.metadata.uid = Some(format!("object-{written}"));
        if corrupt {
            resource.spec.ip = ip(last % 5 + 1).to_string();
        }
        resource
    }

    fn pod(step: &Step) -> ClaimingPod {
        let Step::Pod {
            uid,
            ref ips,
            terminating,
            token,
            born,
            vm,
        } = *step
        else {
            unreachable!()
        };
        ClaimingPod {
            namespace: "default".into(),
            name: format!("p{uid}"),
            uid: format!("u{uid}"),
            ips: ips.iter().map(|last| ip(*last)).collect(),
            created_at: T0 + u64::from(born),
            terminating,
            stateful: false,
            app: "web".into(),
            token: token.map(|t| TOKENS[t].to_string()),
            vm: vm.then(|| "vm".into()),
        }
    }

    /// A plan as text: its actions in order, when it is next due, its duplicates.
    fn text(plan: &Plan) -> String {
        format!(
            "{:?}\n{:?}\n{:?}",
            plan.actions, plan.next_due, plan.duplicates
        )
    }

    /// Replay `steps`, checking after each that the view's plan, which plans only what
    /// changed, is the plan of the whole state, and that it holds exactly the claimed IPs.
    fn replay(steps: &[Step]) -> Result<(), TestCaseError> {
        let mut claims: BTreeMap<Box<str>, Arc<IPClaim>> = BTreeMap::new();
        let mut pods = PodMap::default();
        let mut now = T0;
        let mut whole = Sightings::default();
        let mut view = LeaderView::default();
        view.rebuild(&[], &pods, now, true);
        for (written, step) in steps.iter().enumerate() {
            let mut changed_claims = Vec::new();
            let mut changed_pods: Vec<Box<str>> = Vec::new();
            match step {
                Step::Claim { ip: last, .. } => {
                    let name: Box<str> = ip(*last).to_string().into();
                    let resource = Arc::new(claim(step, now, written as u64));
                    claims.insert(name.clone(), Arc::clone(&resource));
                    changed_claims.push((name, Some(resource)));
                }
                Step::Unclaim { ip: last } => {
                    let name: Box<str> = ip(*last).to_string().into();
                    claims.remove(&name);
                    changed_claims.push((name, None));
                }
                Step::Pod { .. } => {
                    let pod = pod(step);
                    changed_pods.push(pod.uid.as_str().into());
                    pods.insert(pod.uid.clone(), pod);
                }
                Step::Unpod { uid } => {
                    let uid = format!("u{uid}");
                    pods.remove(&uid);
                    changed_pods.push(uid.into());
                }
                Step::Wait { seconds } => now += u64::from(*seconds),
                Step::Rebuild => {}
            }
            let all: Vec<Arc<IPClaim>> = claims.values().cloned().collect();
            match step {
                Step::Rebuild => view.rebuild(&all, &pods, now, true),
                _ => view.apply(changed_claims, &changed_pods, &pods, now),
            }
            let incremental = view.plan(&pods, now, RULES);
            whole.observe(&all, &pods, now);
            let expected = reconcile::plan(&all, &pods, &whole, now, RULES);
            prop_assert_eq!(text(&incremental), text(&expected), "after {:?}", step);
            for ip in (1..6).map(ip) {
                let held = all.iter().any(|c| c.spec.ip.parse().ok() == Some(ip));
                prop_assert_eq!(view.holds_ip(&ip), held);
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// After every change the watches bring (and after time alone), the view's plan,
        /// which plans only what changed, is the plan of the whole state.
        #[test]
        fn the_incremental_plan_is_the_plan_of_the_whole_state(
            steps in proptest::collection::vec(step(), 1..40),
        ) {
            replay(&steps)?;
        }
    }

    /// An unreadable claim saw its pod come and go; the readable claim that replaced it,
    /// for the same pod, inherits that sighting (its pod is gone, not yet to come), as a pass
    /// over every claim notes it.
    #[test]
    fn a_pod_seen_by_an_unreadable_claim_counts_for_its_readable_successor() {
        let claim = |corrupt| Step::Claim {
            ip: 1,
            phase: 0,
            pod: Some(0),
            token: None,
            sticky: false,
            vm: false,
            corrupt,
        };
        let steps = [
            claim(true),
            Step::Pod {
                uid: 0,
                ips: vec![],
                terminating: false,
                token: None,
                born: 0,
                vm: false,
            },
            Step::Unpod { uid: 0 },
            claim(false),
        ];
        replay(&steps).unwrap();
    }
}
