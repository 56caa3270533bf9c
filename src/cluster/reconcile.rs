//! The reconciler's decisions, as a pure function of what the caches hold and the time, so
//! every rule is testable without an API server; and the executor that carries them out.

use super::app_lists::AppLists;
use super::index::RunningPod;
#[cfg(test)]
use std::borrow::Cow;
use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

use super::lifecycle::{self, Age, Verdict};
use crate::metrics::AdoptReason;
use ip_webhook_ipam::pools::PoolCatalog;
use ip_webhook_ledger::Claim;
use ip_webhook_ledger::crd::{FixedIPPoolStatus, IPClaim};

pub(crate) use super::claiming_pod::FastSet;
pub(crate) use super::claiming_pod::{ClaimingPod, PodMap};
pub(crate) use super::sightings::Sightings;

pub(crate) use super::lifecycle::{DropReason, Rules};

#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// Tie the claim to this pod (its final name and UID); phase `Bound`.
    Bind {
        claim: Arc<IPClaim>,
        pod: ClaimingPod,
    },
    /// The StatefulSet pod is gone: keep the record, phase `Released`, for the sticky grace.
    Keep { claim: Arc<IPClaim> },
    /// Delete the record: the IP is free again.
    Drop {
        claim: Arc<IPClaim>,
        reason: DropReason,
    },
    /// A live pod that carries a claim token (so our webhooks admitted it) and an IP that has
    /// no record (its admission's record was lost), or a pod that runs (`status.podIPs`) on an
    /// IP of its own app's list and holds no claim (it started before the webhook was
    /// installed): record it. Never a pod on a bare label or another app's IP.
    Adopt {
        ip: IpAddr,
        pod: ClaimingPod,
        reason: AdoptReason,
    },
}

/// A pod that runs (`status.podIPs`, set by the kubelet and the CNI, never by the
/// pod's author) on an IP of its OWN app's list (same namespace and app label as a watched
/// workload whose template lists the IP, and no other app's list holds it), and that holds no
/// claim, gets one. A pod of another app on a list IP, a pod without an app label, a pod that
/// carries a claim token (adopted by [`plan`], if at all) and a pod that only carries a label
/// are never adopted here; another app's pod on a list IP stays a conflict that the pod-IP
/// index reports at admission. `running` is the pod-IP index; `pods` the reconciler's pod
/// cache (for creation time, termination and StatefulSet ownership when it knows the pod).
pub(crate) fn plan_list_adoptions(
    plan: &mut Plan,
    holdings: &dyn Holdings,
    pods: &PodMap,
    running: &[Arc<RunningPod>],
    lists: &dyn AppLists,
) {
    if running.is_empty() {
        return;
    }
    // what this plan already gives, beside what the claims hold
    let mut taken: FastSet<IpAddr> = FastSet::default();
    let mut with_claim: FastSet<&str> = FastSet::default();
    for action in &plan.actions {
        match action {
            Action::Adopt { ip, pod, .. } => {
                taken.insert(*ip);
                with_claim.insert(pod.uid.as_str());
            }
            Action::Bind { pod, .. } => {
                with_claim.insert(pod.uid.as_str());
            }
            _ => {}
        }
    }
    let mut candidates: Vec<ClaimingPod> = running
        .iter()
        .filter(|slim| {
            !slim.app.is_empty()
                && !holdings.names_pod(&slim.uid)
                && !with_claim.contains(&*slim.uid)
        })
        .map(|slim| {
            let known = pods.get(&*slim.uid);
            ClaimingPod {
                namespace: slim.namespace.to_string(),
                name: slim.name.to_string(),
                uid: slim.uid.to_string(),
                ips: slim.ips.to_vec(),
                created_at: known.map_or(0, |k| k.created_at),
                terminating: slim.deleting_at.is_some() || known.is_some_and(|k| k.terminating),
                stateful: known.is_some_and(|k| k.stateful),
                app: slim.app.to_string(),
                token: known.and_then(|k| k.token.clone()),
                vm: known.and_then(|k| k.vm.clone()),
            }
        })
        .filter(|pod| !pod.terminating && pod.token.is_none())
        .collect();
    candidates.sort_by(|a, b| (a.created_at, &a.uid).cmp(&(b.created_at, &b.uid)));
    for pod in candidates {
        let own = format!("{}/{}", pod.namespace, pod.app);
        for ip in &pod.ips {
            if holdings.holds_ip(ip)
                || taken.contains(ip)
                || lists.sole_app_listing(*ip).as_deref() != Some(own.as_str())
            {
                continue;
            }
            taken.insert(*ip);
            plan.actions.push(Action::Adopt {
                ip: *ip,
                pod: pod.clone(),
                reason: AdoptReason::AppList,
            });
        }
    }
}

/// What the claim objects hold, as list adoption asks it.
pub(crate) trait Holdings {
    /// Whether a claim object holds `ip` (its `spec.ip`, readable or not: an unreadable
    /// claim's IP stays held).
    fn holds_ip(&self, ip: &IpAddr) -> bool;
    /// Whether a claim object names the pod with this UID (`spec.podUid`).
    fn names_pod(&self, uid: &str) -> bool;
}

/// One IP carried by more than one live pod: never granted so by the webhook, but possible
/// after a refused deletion, a deleted IPClaim or a hand-written IP. Reported, not repaired:
/// the older pod keeps (or is adopted into) the claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Duplicate {
    pub(crate) ip: IpAddr,
    /// Oldest first (creation time, then UID).
    pub(crate) pods: Vec<ClaimingPod>,
}

/// The plan for one pass, and when the next time-driven change falls due (unix seconds).
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub(crate) actions: Vec<Action>,
    pub(crate) next_due: Option<u64>,
    /// IPs that two or more live pods carry.
    pub(crate) duplicates: Vec<Duplicate>,
}

/// Whether `carriers` of one IP are more than one holder: the launcher pods of one virtual
/// machine (a live migration's source and target) are one.
fn more_than_one_holder<'a>(carriers: impl IntoIterator<Item = &'a ClaimingPod>) -> bool {
    let mut carriers = carriers.into_iter();
    let Some(first) = carriers.next() else {
        return false;
    };
    carriers.any(|pod| pod.vm.is_none() || pod.vm != first.vm || pod.namespace != first.namespace)
}

/// Oldest first: by creation time, then UID (compared in place, not copied per comparison).
fn oldest_first(a: &ClaimingPod, b: &ClaimingPod) -> std::cmp::Ordering {
    (a.created_at, &a.uid).cmp(&(b.created_at, &b.uid))
}

/// Every IP that two or more live (not terminating) pods carry, by IP: one list of (IP, pod)
/// pairs sorted by IP, not a map of a list per IP (a pass makes one allocation, not one per
/// IP); only the carriers of a shared IP are then put oldest first.
pub(crate) fn duplicates(pods: &PodMap) -> Vec<Duplicate> {
    let carried = pods
        .values()
        .filter(|p| !p.terminating)
        .flat_map(|pod| pod.ips.iter().map(move |ip| (*ip, pod)))
        .collect();
    duplicates_among(carried)
}

/// The duplicates among `carried`, (IP, live pod) pairs in any order.
pub(crate) fn duplicates_among(mut carried: Vec<(IpAddr, &ClaimingPod)>) -> Vec<Duplicate> {
    carried.sort_unstable_by_key(|(ip, _)| *ip);
    carried
        .chunk_by(|a, b| a.0 == b.0)
        .filter(|carriers| more_than_one_holder(carriers.iter().map(|(_, pod)| *pod)))
        .map(|carriers| {
            let mut pods: Vec<ClaimingPod> =
                carriers.iter().map(|(_, pod)| (*pod).clone()).collect();
            pods.sort_by(oldest_first);
            Duplicate {
                ip: carriers[0].0,
                pods,
            }
        })
        .collect()
}

/// Add to `found` (what pods carry: our label and the CNI annotations) the IPs pods run on
/// (`status.podIPs`, from the pod-IP index, whoever assigned them): one entry per IP, each
/// pod once, oldest first. `known` (the reconciler's pods, by UID) says which are a VM's
/// launcher pods: a live migration's two pods on one IP are one holder, no duplicate.
pub(crate) fn add_running_duplicates(
    found: &mut Vec<Duplicate>,
    running: Vec<(IpAddr, Vec<Arc<RunningPod>>)>,
    known: &PodMap,
) {
    for (ip, pods) in running {
        let index = match found.iter().position(|d| d.ip == ip) {
            Some(index) => index,
            None => {
                found.push(Duplicate {
                    ip,
                    pods: Vec::new(),
                });
                found.len() - 1
            }
        };
        let duplicate = &mut found[index];
        for pod in pods {
            if !duplicate.pods.iter().any(|p| *p.uid == *pod.uid) {
                let mut info = ClaimingPod::running(&pod);
                info.vm = known.get(&*pod.uid).and_then(|k| k.vm.clone());
                duplicate.pods.push(info);
            }
        }
        duplicate.pods.sort_by(oldest_first);
    }
    found.retain(|d| more_than_one_holder(&d.pods));
    found.sort_by_key(|d| d.ip);
}

#[cfg(test)]
impl Plan {
    pub(crate) fn due(&mut self, at: u64) {
        self.next_due = Some(self.next_due.map_or(at, |due| due.min(at)));
    }

    /// Add what the rules said of one claim.
    pub(crate) fn add(&mut self, claim: ClaimPlan) {
        self.actions.extend(claim.action);
        if let Some(at) = claim.due {
            self.due(at);
        }
    }
}

/// What the rules say of one claim: what to do now, and when (unix seconds on the leader's
/// clock) they may say something else with nothing but time passing.
#[derive(Debug, Default)]
pub(crate) struct ClaimPlan {
    pub(crate) action: Option<Action>,
    pub(crate) due: Option<u64>,
}

impl ClaimPlan {
    fn act(action: Action) -> ClaimPlan {
        ClaimPlan {
            action: Some(action),
            due: None,
        }
    }

    fn wait_until(at: u64) -> ClaimPlan {
        ClaimPlan {
            action: None,
            due: Some(at),
        }
    }
}

/// Decide what to do about every claim and pod: the whole state's plan, which the leader's
/// incremental one (`super::leader_view::LeaderView::plan`) equals. `pods` is keyed by pod
/// UID; `now` is on the clock of `seen`.
#[cfg(test)]
pub(crate) fn plan(
    claims: &[Arc<IPClaim>],
    pods: &PodMap,
    seen: &Sightings,
    now: u64,
    rules: Rules,
) -> Plan {
    let mut plan = Plan::default();
    let parsed: Vec<(&Arc<IPClaim>, Cow<'_, Claim>)> = claims
        .iter()
        .filter_map(|resource| Some((resource, seen.claim(resource)?)))
        .collect();
    let recorded: FastSet<IpAddr> = parsed.iter().map(|(_, claim)| claim.ip).collect();
    let bound_uids: FastSet<&str> = parsed
        .iter()
        .filter_map(|(_, claim)| claim.pod.uid.as_deref())
        .collect();
    let bound = |uid: &str| bound_uids.contains(uid);
    for (resource, claim) in &parsed {
        plan.add(plan_claim(resource, claim, pods, seen, now, rules, &bound));
    }
    plan.duplicates = duplicates(pods);
    plan_token_adoptions(&mut plan, pods.values(), &|ip| recorded.contains(ip));
    plan
}

/// What the rules say of one readable claim ([`lifecycle::judge`], with its age as the
/// leader's sightings have it). `bound` tells whether a pod is the pod of some claim (a
/// reservation is never taken up by one).
pub(crate) fn plan_claim(
    resource: &Arc<IPClaim>,
    claim: &Claim,
    pods: &PodMap,
    seen: &Sightings,
    now: u64,
    rules: Rules,
    bound: &dyn Fn(&str) -> bool,
) -> ClaimPlan {
    let age = Age {
        since: seen.since(resource, now),
        pod_seen: seen.pod_seen(resource),
    };
    let claim_resource = Arc::clone(resource);
    match lifecycle::judge(claim, age, pods, now, rules, bound) {
        Verdict::Wait(Some(until)) => ClaimPlan::wait_until(until),
        Verdict::Wait(None) => ClaimPlan::default(),
        Verdict::Bind(pod) => ClaimPlan::act(Action::Bind {
            claim: claim_resource,
            pod: pod.clone(),
        }),
        Verdict::Keep => ClaimPlan::act(Action::Keep {
            claim: claim_resource,
        }),
        Verdict::Drop(reason) => ClaimPlan::act(Action::Drop {
            claim: claim_resource,
            reason,
        }),
    }
}

/// Adopt each IP a live pod carrying a claim token runs on that no claim records, oldest pod
/// first. `candidates` holds at least every such pod (any others adopt nothing).
pub(crate) fn plan_token_adoptions<'p>(
    plan: &mut Plan,
    candidates: impl Iterator<Item = &'p ClaimingPod>,
    recorded: &dyn Fn(&IpAddr) -> bool,
) {
    let mut adopted: HashSet<IpAddr> = HashSet::new();
    // Only a pod carrying a claim token was admitted by us: the webhooks see every pod with
    // one of our markers, and `/validate` refuses a token the ledger does not back. A bare
    // label or CNI annotation (a pod created while no webhook saw it) is never recorded: it
    // would hold an IP of any app or pool for whoever wrote it. A pod whose every IP is
    // recorded adopts nothing, so only the others are put oldest first.
    let mut live: Vec<&ClaimingPod> = candidates
        .filter(|p| adopts_by_token(p, recorded))
        .collect();
    live.sort_by(|a, b| oldest_first(a, b));
    for pod in live {
        for ip in &pod.ips {
            if !recorded(ip) && adopted.insert(*ip) {
                plan.actions.push(Action::Adopt {
                    ip: *ip,
                    pod: pod.clone(),
                    reason: AdoptReason::Token,
                });
            }
        }
    }
}

/// Whether `pod` is a live pod carrying a claim token that runs on an IP no claim records
/// ([`plan_token_adoptions`]).
pub(crate) fn adopts_by_token(pod: &ClaimingPod, recorded: &dyn Fn(&IpAddr) -> bool) -> bool {
    !pod.terminating && pod.token.is_some() && pod.ips.iter().any(|ip| !recorded(ip))
}

/// `FixedIPPool.status` from the records: IPs of the pool held by any record.
pub(crate) fn pool_statuses(
    catalog: &PoolCatalog,
    ips: impl Iterator<Item = IpAddr> + Clone,
) -> Vec<(String, FixedIPPoolStatus)> {
    let mut out = Vec::new();
    for name in catalog.names() {
        let Some(pool) = catalog.get(name) else {
            continue;
        };
        let total = u64::try_from(pool.usable.len()).unwrap_or(u64::MAX);
        let held = ips.clone().filter(|ip| pool.usable.contains(ip)).count() as u64;
        out.push((
            name.to_string(),
            FixedIPPoolStatus {
                total,
                held,
                free: total.saturating_sub(held),
            },
        ));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ip_webhook_ledger::crd::IPClaimStatus;
    use ip_webhook_ledger::kubernetes::rfc3339;
    use ip_webhook_ledger::kubernetes::to_resource;
    use ip_webhook_ledger::{Phase, PodRef, Source};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    const T0: u64 = 1_700_000_000;
    const TOKEN: &str = "0123456789abcdef0123456789abcdef";
    const OTHER_TOKEN: &str = "fedcba9876543210fedcba9876543210";
    const RULES: Rules = Rules {
        reservation_ttl: 120,
        sticky_grace: 300,
    };

    fn reserved(ip: &str, ns: &str, name: &str, generate_name: &str, at: u64) -> IPClaim {
        let mut resource = to_resource(&Claim {
            ip: ip.parse().unwrap(),
            app: "web".into(),
            pool: None,
            pod: PodRef {
                namespace: ns.into(),
                name: name.into(),
                generate_name: generate_name.into(),
                uid: None,
            },
            request_uid: format!("req-{ip}-{at}").into(),
            phase: Phase::Reserved,
            source: Source::Allocated,
            created_at: at,
            updated_at: at,
            list_size: None,
            token: TOKEN.into(),
            release_at: None,
            sticky: false,
            vm: None,
        });
        resource.metadata.creation_timestamp =
            Some(Time(Timestamp::from_second(at as i64).unwrap()));
        resource.metadata.uid = Some(format!("claim-{ip}-{at}"));
        resource.metadata.resource_version = Some("1".into());
        resource
    }

    fn bound(mut resource: IPClaim, pod: &ClaimingPod, at: u64) -> IPClaim {
        resource.spec.pod_uid = Some(pod.uid.clone());
        resource.spec.pod_name = pod.name.clone();
        resource.spec.sticky = pod.stateful;
        resource.status = Some(IPClaimStatus {
            phase: "Bound".into(),
            reserved_at: None,
            updated_at: Some(rfc3339(at)),
            release_at: None,
            request_uid: None,
        });
        resource
    }

    fn released(mut resource: IPClaim, at: u64) -> IPClaim {
        resource.status = Some(IPClaimStatus {
            phase: "Released".into(),
            reserved_at: None,
            updated_at: Some(rfc3339(at)),
            release_at: None,
            request_uid: None,
        });
        resource
    }

    fn pod(ns: &str, name: &str, uid: &str, ip: &str, at: u64) -> ClaimingPod {
        ClaimingPod {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
            ips: vec![ip.parse().unwrap()],
            created_at: at,
            terminating: false,
            stateful: false,
            app: "web".into(),
            token: None,
            vm: None,
        }
    }

    fn pods(list: &[ClaimingPod]) -> PodMap {
        list.iter().map(|p| (p.uid.clone(), p.clone())).collect()
    }

    fn arcs(list: Vec<IPClaim>) -> Vec<Arc<IPClaim>> {
        list.into_iter().map(Arc::new).collect()
    }

    /// Each claim as first seen when it was written (in these tests one clock writes and reads).
    fn as_written(claims: &[Arc<IPClaim>]) -> Sightings {
        Sightings::as_written(claims)
    }

    fn summary(plan: &Plan) -> Vec<String> {
        plan.actions
            .iter()
            .map(|a| match a {
                Action::Bind { claim, pod } => format!("bind {} {}", claim.spec.ip, pod.uid),
                Action::Keep { claim } => format!("keep {}", claim.spec.ip),
                Action::Drop { claim, reason } => format!("drop {} {reason:?}", claim.spec.ip),
                Action::Adopt {
                    ip,
                    pod,
                    reason: AdoptReason::Token,
                } => format!("adopt {ip} {}", pod.uid),
                Action::Adopt { ip, pod, reason } => {
                    format!("adopt {ip} {} {}", pod.uid, reason.label())
                }
            })
            .collect()
    }

    #[test]
    fn the_launcher_pods_of_one_vm_on_one_ip_are_no_duplicate() {
        let launcher = |name: &str, uid: &str, vm: &str| ClaimingPod {
            vm: Some(vm.into()),
            ..pod("default", name, uid, "10.0.0.5", 10)
        };
        let migration: PodMap = [
            launcher("virt-launcher-db-a", "u1", "db"),
            launcher("virt-launcher-db-b", "u2", "db"),
        ]
        .into_iter()
        .map(|p| (p.uid.clone(), p))
        .collect();
        assert!(duplicates(&migration).is_empty());
        // two VMs, or a VM's pod and another pod, on one IP are
        for other in [
            launcher("virt-launcher-cache-a", "u3", "cache"),
            pod("default", "web-x", "u3", "10.0.0.5", 11),
        ] {
            let mut pods = migration.clone();
            pods.insert(other.uid.clone(), other);
            assert_eq!(duplicates(&pods).len(), 1);
            assert_eq!(duplicates(&pods)[0].pods.len(), 3);
        }
        // the same two pods seen running on the IP (`status.podIPs`, the pod-IP index)
        let seen_running = |uids: &[&str]| {
            let pods = uids
                .iter()
                .map(|uid| {
                    super::list_adoption_tests::running("default", uid, uid, "10.0.0.5", "db")
                })
                .collect();
            let mut found = Vec::new();
            add_running_duplicates(
                &mut found,
                vec![("10.0.0.5".parse().unwrap(), pods)],
                &migration,
            );
            found
        };
        assert!(seen_running(&["u1", "u2"]).is_empty());
        assert_eq!(seen_running(&["u1", "u-unknown"]).len(), 1);
    }

    #[test]
    fn binds_a_generate_name_pod_once_it_appears() {
        let claims = arcs(vec![reserved("10.0.0.1", "default", "", "web-7d9f-", T0)]);
        let before = plan(&claims, &pods(&[]), &as_written(&claims), T0 + 5, RULES);
        assert!(before.actions.is_empty());
        assert_eq!(before.next_due, Some(T0 + 120), "wake up at expiry");

        // a pod of the same generateName carrying the IP but not the claim's token (the
        // final DELETE's pod, a squatter) is not the claim's pod
        let mut stranger = pod("default", "web-7d9f-zzzzz", "uid-0", "10.0.0.1", T0 + 1);
        stranger.token = Some("ffffffffffffffffffffffffffffffff".into());
        let without = pods(&[
            stranger.clone(),
            pod("default", "web-7d9f-yyyyy", "uid-2", "10.0.0.1", T0 + 1),
        ]);
        assert!(
            !summary(&plan(
                &claims,
                &without,
                &as_written(&claims),
                T0 + 5,
                RULES
            ))
            .iter()
            .any(|s| s.starts_with("bind")),
        );

        let mut appeared = pod("default", "web-7d9f-abcde", "uid-1", "10.0.0.1", T0 + 1);
        appeared.token = Some(TOKEN.into());
        assert_eq!(
            summary(&plan(
                &claims,
                &pods(&[stranger, appeared]),
                &as_written(&claims),
                T0 + 5,
                RULES
            )),
            ["bind 10.0.0.1 uid-1"]
        );
    }

    #[test]
    fn does_not_bind_a_pod_of_another_namespace_ip_or_an_older_pod() {
        let claims = arcs(vec![reserved("10.0.0.1", "default", "web-0", "", T0)]);
        let others = pods(&[
            pod("other", "web-0", "uid-ns", "10.0.0.1", T0 + 1),
            pod("default", "web-0", "uid-ip", "10.0.0.2", T0 + 1),
            // The old web-0 that still carries the IP: created before the reservation.
            pod("default", "web-0", "uid-old", "10.0.0.1", T0 - 600),
        ]);
        let result = plan(&claims, &others, &as_written(&claims), T0 + 5, RULES);
        assert!(
            !summary(&result).iter().any(|s| s.starts_with("bind")),
            "{:?}",
            summary(&result)
        );
    }

    #[test]
    fn releases_by_uid_and_a_same_name_recreate_is_not_the_old_pod() {
        let old = pod("default", "api-1", "uid-old", "10.0.0.7", T0);
        let claims = arcs(vec![bound(
            reserved("10.0.0.7", "default", "api-1", "", T0),
            &old,
            T0,
        )]);
        // Still there: nothing to do.
        assert!(
            plan(
                &claims,
                &pods(std::slice::from_ref(&old)),
                &as_written(&claims),
                T0 + 60,
                RULES
            )
            .actions
            .is_empty()
        );
        // A new pod of the same name (other UID) carrying the same IP label: the old one is
        // gone, and the claim is freed once the admission window since the bind has passed.
        let recreated = pod("default", "api-1", "uid-new", "10.0.0.7", T0 + 70);
        assert_eq!(
            summary(&plan(
                &claims,
                &pods(&[recreated]),
                &as_written(&claims),
                T0 + 120,
                RULES
            )),
            ["drop 10.0.0.7 PodGone"]
        );
    }

    /// The API server stores a pod only after every validating webhook has answered: the
    /// claim `/validate` bound is a promise, not a leak, until the window has passed since the
    /// leader first saw it bound, whatever the time the binding replica wrote.
    #[test]
    fn a_claim_bound_at_admission_is_kept_until_the_window_passes_since_it_was_seen() {
        let admitted = pod("default", "web-7d9f-abcde", "uid-new", "10.0.0.8", T0);
        let claims = arcs(vec![bound(
            reserved("10.0.0.8", "default", "", "web-7d9f-", T0 - 3_600),
            &admitted,
            // written by a replica whose clock runs an hour behind the leader's
            T0 - 3_600,
        )]);
        let mut seen = Sightings::default();
        seen.observe(&claims, &pods(&[]), T0);
        let early = plan(&claims, &pods(&[]), &seen, T0 + 1, RULES);
        assert!(early.actions.is_empty(), "{:?}", summary(&early));
        assert_eq!(early.next_due, Some(T0 + 120));
        assert!(
            plan(&claims, &pods(&[]), &seen, T0 + 119, RULES)
                .actions
                .is_empty()
        );
        assert_eq!(
            summary(&plan(&claims, &pods(&[]), &seen, T0 + 120, RULES)),
            ["drop 10.0.0.8 PodGone"]
        );
        // once the leader has seen the pod stored, its absence is a deletion: no window
        let mut stored = Sightings::default();
        stored.observe(&claims, &pods(std::slice::from_ref(&admitted)), T0);
        assert_eq!(
            summary(&plan(&claims, &pods(&[]), &stored, T0 + 1, RULES)),
            ["drop 10.0.0.8 PodGone"]
        );
        // a new leader starts its own count
        let mut fresh = Sightings::default();
        fresh.observe(&claims, &pods(&[]), T0 + 500);
        assert!(
            plan(&claims, &pods(&[]), &fresh, T0 + 500, RULES)
                .actions
                .is_empty()
        );
    }

    /// A change of the claim (bound to another UID, a phase change) restarts its age.
    #[test]
    fn a_changed_claim_is_seen_anew() {
        let first = pod("default", "db-0", "uid-1", "10.0.0.9", T0);
        let claim = bound(reserved("10.0.0.9", "default", "db-0", "", T0), &first, T0);
        let mut seen = Sightings::default();
        seen.observe(&arcs(vec![claim.clone()]), &pods(&[]), T0);
        let second = pod("default", "db-0", "uid-2", "10.0.0.9", T0);
        let rebound = arcs(vec![bound(claim, &second, T0 + 100)]);
        seen.observe(&rebound, &pods(&[]), T0 + 100);
        assert_eq!(seen.since(&rebound[0], T0 + 150), T0 + 100);
        assert!(
            plan(&rebound, &pods(&[]), &seen, T0 + 150, RULES)
                .actions
                .is_empty()
        );
        // a claim no longer listed is forgotten
        seen.observe(&[], &pods(&[]), T0 + 160);
        assert_eq!(seen.since(&rebound[0], T0 + 170), T0 + 170);
    }

    /// A pass reads a claim once: while the watch cache hands it the same object, the parse
    /// of the last pass stands; any other object of the same name (a new resourceVersion, a
    /// full resync's list) is read again, and a claim no longer listed leaves the cache.
    #[test]
    fn a_claim_is_parsed_again_only_when_its_object_changes() {
        let first = pod("default", "db-0", "uid-1", "10.0.0.9", T0);
        let claim = bound(reserved("10.0.0.9", "default", "db-0", "", T0), &first, T0);
        let other = Arc::new(reserved("10.0.0.8", "default", "", "web-", T0));
        let listed = vec![Arc::new(claim.clone()), Arc::clone(&other)];
        let mut seen = Sightings::default();
        seen.observe(&listed, &pods(&[]), T0);
        let read = seen.claim(&listed[0]).unwrap();
        assert!(
            matches!(read, Cow::Borrowed(_)),
            "the parse of observe is reused"
        );
        assert_eq!(read.pod.uid.as_deref(), Some("uid-1"));
        // the same object again: still the one parse, and the pod seen since is noted
        seen.observe(&listed, &pods(std::slice::from_ref(&first)), T0 + 10);
        assert!(matches!(seen.claim(&listed[0]), Some(Cow::Borrowed(_))));
        assert!(seen.pod_seen(&listed[0]));
        assert_eq!(seen.since(&listed[0], T0 + 20), T0);

        // a new object of the same name, bound to another pod, at a new resourceVersion
        let second = pod("default", "db-0", "uid-2", "10.0.0.9", T0 + 30);
        let mut rebound = bound(claim, &second, T0 + 30);
        rebound.metadata.resource_version = Some("2".into());
        let rebound = Arc::new(rebound);
        // not observed yet: read now, not taken from the cache of the old object
        let fresh = seen.claim(&rebound).unwrap();
        assert!(matches!(fresh, Cow::Owned(_)));
        assert_eq!(fresh.pod.uid.as_deref(), Some("uid-2"));
        seen.observe(&[Arc::clone(&rebound)], &pods(&[]), T0 + 40);
        let cached = seen.claim(&rebound).unwrap();
        assert!(matches!(cached, Cow::Borrowed(_)));
        assert_eq!(cached.pod.uid.as_deref(), Some("uid-2"));
        assert_eq!(
            seen.since(&rebound, T0 + 50),
            T0 + 40,
            "a changed claim is seen anew"
        );
        assert!(!seen.pod_seen(&rebound));
        // the old object, and the claim no longer listed, are let go
        assert!(
            seen.claim(&listed[0])
                .is_some_and(|c| matches!(c, Cow::Owned(_)))
        );
        assert_eq!(Arc::strong_count(&listed[0]), 1);
        assert_eq!(
            Arc::strong_count(&other),
            2,
            "held by `listed` and `other` only"
        );
        assert_eq!(seen.len(), 1);
        assert_eq!(seen.since(&other, T0 + 50), T0 + 50);
    }

    /// A claim that cannot be read is skipped on every pass, from the cache as when first read.
    #[test]
    fn an_unreadable_claim_is_skipped_on_every_pass() {
        let mut broken = reserved("10.0.0.7", "default", "", "web-", T0);
        broken.spec.ip = "not-an-ip".into();
        let claims = arcs(vec![broken]);
        let mut seen = Sightings::default();
        for at in [T0, T0 + 500] {
            seen.observe(&claims, &pods(&[]), at);
            assert!(seen.claim(&claims[0]).is_none());
            assert!(
                plan(&claims, &pods(&[]), &seen, at, RULES)
                    .actions
                    .is_empty()
            );
        }
    }

    /// A phase is what the record says, and the status subresource can be written by hand: a
    /// Released claim whose pod still runs is bound again, never freed.
    #[test]
    fn a_released_claim_whose_pod_runs_is_bound_again() {
        let web = pod("default", "web-1", "uid-w", "10.0.0.6", T0);
        let claims = arcs(vec![released(
            bound(reserved("10.0.0.6", "default", "web-1", "", T0), &web, T0),
            T0 + 1,
        )]);
        let seen = as_written(&claims);
        assert_eq!(
            summary(&plan(
                &claims,
                &pods(std::slice::from_ref(&web)),
                &seen,
                T0 + 2,
                RULES
            )),
            ["bind 10.0.0.6 uid-w"]
        );
        // once the pod is on its way out, the release stands
        let mut leaving = web;
        leaving.terminating = true;
        assert_eq!(
            summary(&plan(&claims, &pods(&[leaving]), &seen, T0 + 2, RULES)),
            ["drop 10.0.0.6 ReleaseDone"]
        );
    }

    #[test]
    fn reservations_expire_after_the_ttl() {
        let claims = arcs(vec![reserved("10.0.0.3", "default", "", "job-", T0)]);
        assert!(
            plan(&claims, &pods(&[]), &as_written(&claims), T0 + 119, RULES)
                .actions
                .is_empty()
        );
        assert_eq!(
            summary(&plan(
                &claims,
                &pods(&[]),
                &as_written(&claims),
                T0 + 120,
                RULES
            )),
            ["drop 10.0.0.3 ReservationExpired"]
        );
    }

    #[test]
    fn statefulset_claims_are_kept_for_the_grace_then_dropped() {
        let mut web0 = pod("default", "web-0", "uid-a", "10.0.0.9", T0);
        web0.stateful = true;
        let claim = bound(reserved("10.0.0.9", "default", "web-0", "", T0), &web0, T0);
        assert_eq!(
            summary(&plan(
                &arcs(vec![claim.clone()]),
                &pods(&[]),
                &as_written(&arcs(vec![claim.clone()])),
                T0 + 120,
                RULES
            )),
            ["keep 10.0.0.9"]
        );
        let kept = arcs(vec![released(claim, T0 + 120)]);
        let during = plan(&kept, &pods(&[]), &as_written(&kept), T0 + 419, RULES);
        assert!(during.actions.is_empty());
        assert_eq!(during.next_due, Some(T0 + 420));
        assert_eq!(
            summary(&plan(
                &kept,
                &pods(&[]),
                &as_written(&kept),
                T0 + 420,
                RULES
            )),
            ["drop 10.0.0.9 ReleaseDone"]
        );
    }

    #[test]
    fn a_released_claim_that_is_not_sticky_goes_at_once() {
        let claims = arcs(vec![released(
            reserved("10.0.0.4", "default", "x", "", T0),
            T0 + 1,
        )]);
        assert_eq!(
            summary(&plan(
                &claims,
                &pods(&[]),
                &as_written(&claims),
                T0 + 2,
                RULES
            )),
            ["drop 10.0.0.4 ReleaseDone"]
        );
    }

    #[test]
    fn a_pod_carrying_an_unrecorded_ip_is_adopted_once() {
        let mut a = pod("default", "a", "uid-a", "10.0.0.5", T0);
        a.token = Some(TOKEN.into());
        let mut b = pod("default", "b", "uid-b", "10.0.0.5", T0 + 1);
        b.token = Some(OTHER_TOKEN.into());
        let mut gone = pod("default", "c", "uid-c", "10.0.0.6", T0);
        gone.terminating = true;
        gone.token = Some(TOKEN.into());
        assert_eq!(
            summary(&plan(
                &[],
                &pods(&[b, a, gone]),
                &Sightings::default(),
                T0 + 2,
                RULES
            )),
            ["adopt 10.0.0.5 uid-a"]
        );
    }

    /// Finding 2: a pod created in `dev` with only `ip-webhook.io/allocated-ip: 10.97.9.5`
    /// (no webhook saw it) was adopted as a Bound claim, and `prod/db-0`, whose list is
    /// exactly that IP, was refused. A pod without a claim token is never adopted.
    #[test]
    fn a_bare_label_is_never_adopted() {
        let squat = pod("dev", "squat", "uid-s", "10.97.9.5", T0);
        assert_eq!(squat.token, None);
        assert!(
            summary(&plan(
                &[],
                &pods(std::slice::from_ref(&squat)),
                &Sightings::default(),
                T0 + 2,
                RULES
            ))
            .is_empty()
        );
        // the same pod with a token our webhooks admitted is recorded
        let mut admitted = squat;
        admitted.token = Some(TOKEN.into());
        assert_eq!(
            summary(&plan(
                &[],
                &pods(&[admitted]),
                &Sightings::default(),
                T0 + 2,
                RULES
            )),
            ["adopt 10.97.9.5 uid-s"]
        );
    }

    /// Finding 4: two live pods on one IP were never noticed. Each pass reports every IP
    /// that two or more live pods carry, oldest first; a terminating pod does not count.
    #[test]
    fn two_live_pods_on_one_ip_are_reported_oldest_first() {
        let mut older = pod("default", "a", "uid-a", "10.0.0.5", T0);
        older.token = Some(TOKEN.into());
        let newer = pod("prod", "b", "uid-b", "10.0.0.5", T0 + 3);
        let mut leaving = pod("default", "c", "uid-c", "10.0.0.6", T0);
        leaving.terminating = true;
        let other = pod("default", "d", "uid-d", "10.0.0.6", T0 + 1);
        let plan = plan(
            &[],
            &pods(&[newer.clone(), older.clone(), leaving, other]),
            &Sightings::default(),
            T0 + 5,
            RULES,
        );
        assert_eq!(
            plan.duplicates,
            vec![Duplicate {
                ip: "10.0.0.5".parse().unwrap(),
                pods: vec![older, newer],
            }]
        );
        // the claim goes to the older pod
        assert_eq!(summary(&plan), ["adopt 10.0.0.5 uid-a"]);
    }

    /// Each shared IP once, by IP, its carriers oldest first (then by UID); a pod on two
    /// shared IPs is in both, and an IP one live pod carries is none.
    #[test]
    fn duplicates_are_listed_by_ip_with_every_carrier() {
        let mut a = pod("default", "a", "uid-a", "10.0.0.9", T0 + 2);
        a.ips.push("10.0.0.2".parse().unwrap());
        let b = pod("default", "b", "uid-b", "10.0.0.9", T0);
        let c = pod("default", "c", "uid-c", "10.0.0.9", T0 + 2);
        let d = pod("default", "d", "uid-d", "10.0.0.2", T0 + 1);
        let alone = pod("default", "e", "uid-e", "10.0.0.1", T0);
        let found = duplicates(&pods(&[c.clone(), alone, a.clone(), d.clone(), b.clone()]));
        let listed: Vec<(String, Vec<&str>)> = found
            .iter()
            .map(|dup| {
                let uids = dup.pods.iter().map(|p| p.uid.as_str()).collect();
                (dup.ip.to_string(), uids)
            })
            .collect();
        assert_eq!(
            listed,
            [
                ("10.0.0.2".to_string(), vec!["uid-d", "uid-a"]),
                ("10.0.0.9".to_string(), vec!["uid-b", "uid-a", "uid-c"]),
            ]
        );
        assert_eq!(
            found[1].pods,
            [b, a, c],
            "whole ClaimingPods, not only their UIDs"
        );
    }
}

#[cfg(test)]
mod list_adoption_tests {
    use super::*;

    const T0: u64 = 1_700_000_000;

    /// `(ip, namespace/app)` pairs: which apps list which IPs.
    struct Lists(Vec<(&'static str, &'static str)>);

    impl AppLists for Lists {
        fn sole_app_listing(&self, ip: IpAddr) -> Option<String> {
            let apps: Vec<&str> = self
                .0
                .iter()
                .filter(|(listed, _)| listed.parse::<IpAddr>().unwrap() == ip)
                .map(|(_, app)| *app)
                .collect();
            (apps.len() == 1).then(|| apps[0].to_string())
        }
    }

    pub(super) fn running(ns: &str, name: &str, uid: &str, ip: &str, app: &str) -> Arc<RunningPod> {
        Arc::new(RunningPod {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
            node: "n1".into(),
            ips: vec![ip.parse().unwrap()].into(),
            app: app.into(),
            vm: None,
            deleting_at: None,
            deletion_grace: None,
            created_at: 0,
            controller: None,
        })
    }

    fn lists() -> Lists {
        Lists(vec![
            ("10.99.0.1", "legacy/web"),
            ("10.99.0.2", "legacy/web"),
            ("10.99.0.3", "legacy/web"),
            ("10.99.0.4", "legacy/web"),
            ("10.99.0.4", "legacy/db"),
        ])
    }

    /// What claim objects hold, read from them as a test writes them.
    pub(super) struct Held<'a>(pub(super) &'a [Arc<IPClaim>]);

    impl Holdings for Held<'_> {
        fn holds_ip(&self, ip: &IpAddr) -> bool {
            self.0.iter().any(|c| c.spec.ip.parse().ok() == Some(*ip))
        }

        fn names_pod(&self, uid: &str) -> bool {
            self.0
                .iter()
                .any(|c| c.spec.pod_uid.as_deref() == Some(uid))
        }
    }

    fn adoptions(
        claims: &[Arc<IPClaim>],
        pods: &PodMap,
        running: &[Arc<RunningPod>],
    ) -> Vec<String> {
        let mut plan = Plan::default();
        plan_list_adoptions(&mut plan, &Held(claims), pods, running, &lists());
        plan.actions
            .iter()
            .map(|a| match a {
                Action::Adopt { ip, pod, reason } => {
                    format!("adopt {ip} {} {}", pod.uid, reason.label())
                }
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_pod_running_on_its_own_apps_ip_without_a_claim_is_adopted() {
        let own = running("legacy", "web-abc", "uid-web", "10.99.0.2", "web");
        assert_eq!(
            adoptions(&[], &PodMap::default(), std::slice::from_ref(&own)),
            ["adopt 10.99.0.2 uid-web app_list"]
        );
        // what the reconciler's pod cache knows about it counts: a terminating pod, or one
        // carrying a claim token (the token rules decide about it), is left alone
        let mut known = ClaimingPod {
            namespace: "legacy".into(),
            name: "web-abc".into(),
            uid: "uid-web".into(),
            ips: vec!["10.99.0.2".parse().unwrap()],
            created_at: T0,
            terminating: true,
            stateful: false,
            app: "web".into(),
            token: None,
            vm: None,
        };
        let cache = |p: &ClaimingPod| PodMap::from_iter([(p.uid.clone(), p.clone())]);
        assert!(adoptions(&[], &cache(&known), std::slice::from_ref(&own)).is_empty());
        // the pod index alone knowing it is terminating is enough
        let mut deleting = (*own).clone();
        deleting.deleting_at = Some(T0);
        assert!(adoptions(&[], &PodMap::default(), &[Arc::new(deleting)]).is_empty());
        known.terminating = false;
        known.token = Some("0123456789abcdef0123456789abcdef".into());
        assert!(adoptions(&[], &cache(&known), std::slice::from_ref(&own)).is_empty());
    }

    #[test]
    fn another_apps_pod_or_a_shared_or_recorded_ip_is_never_adopted() {
        let pods = [
            // another app of the same namespace on the web list
            running("legacy", "other-x", "uid-other", "10.99.0.3", "other"),
            // the same app name in another namespace
            running("dev", "web-x", "uid-dev", "10.99.0.1", "web"),
            // no app label
            running("legacy", "bare", "uid-bare", "10.99.0.1", ""),
            // an IP two apps list: whose it is cannot be told
            running("legacy", "web-y", "uid-y", "10.99.0.4", "web"),
            // an IP of no list
            running("legacy", "web-z", "uid-z", "10.98.0.1", "web"),
        ];
        assert!(adoptions(&[], &PodMap::default(), &pods).is_empty());

        // an IP already recorded (whoever holds it), or a pod that already holds a claim
        let claim: IPClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "10.99.0.2"},
            "spec": {"ip": "10.99.0.2", "namespace": "legacy", "app": "web", "podName": "web-0",
                     "podUid": "uid-holder"},
        }))
        .unwrap();
        let claims = [Arc::new(claim)];
        let on_recorded = running("legacy", "web-a", "uid-a", "10.99.0.2", "web");
        let holder = running("legacy", "web-0", "uid-holder", "10.99.0.3", "web");
        assert!(adoptions(&claims, &PodMap::default(), &[on_recorded, holder]).is_empty());
    }

    /// For the list adoption too: a pod that only carries our label (no
    /// webhook saw it) is not running on the IP, so it is never adopted, even when the IP is
    /// on its own app's list.
    #[test]
    fn a_label_alone_is_not_running_on_an_ip() {
        let squat = ClaimingPod {
            namespace: "legacy".into(),
            name: "squat".into(),
            uid: "uid-s".into(),
            ips: vec!["10.99.0.1".parse().unwrap()],
            created_at: T0,
            terminating: false,
            stateful: false,
            app: "web".into(),
            token: None,
            vm: None,
        };
        let cache = PodMap::from_iter([(squat.uid.clone(), squat.clone())]);
        let mut plan = plan(&[], &cache, &Sightings::default(), T0 + 1, RULES);
        plan_list_adoptions(&mut plan, &Held(&[]), &cache, &[], &lists());
        assert!(plan.actions.is_empty(), "{:?}", plan.actions);
        // once the kubelet reports it running there, it is its app's IP
        let index = [running("legacy", "squat", "uid-s", "10.99.0.1", "web")];
        plan_list_adoptions(&mut plan, &Held(&[]), &cache, &index, &lists());
        assert_eq!(plan.actions.len(), 1);
    }

    const RULES: Rules = Rules {
        reservation_ttl: 120,
        sticky_grace: 300,
    };

    #[test]
    fn the_workload_registry_names_the_one_app_listing_an_ip() {
        use crate::decisions::workloads::{WorkloadId, WorkloadRegistry};
        let registry = WorkloadRegistry::default();
        let id = |name: &str| WorkloadId {
            kind: "Deployment".into(),
            namespace: "legacy".into(),
            name: name.into(),
        };
        let set = |text: &str| ip_webhook_ipam::ipset::parse_ip_spec(text).unwrap();
        registry.record(id("web"), "legacy/web".into(), &set("10.99.0.1-10.99.0.4"));
        registry.record(id("db"), "legacy/db".into(), &set("10.99.0.4"));
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        assert_eq!(
            registry.sole_app_listing(ip("10.99.0.2")).as_deref(),
            Some("legacy/web")
        );
        assert_eq!(registry.sole_app_listing(ip("10.99.0.4")), None);
        assert_eq!(registry.sole_app_listing(ip("10.99.0.9")), None);
    }
}
