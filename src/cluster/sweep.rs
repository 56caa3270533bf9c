//! The leak sweeper: the leader applies the lifecycle rule ([`super::lifecycle::judge`]) to
//! the claims of every set of books the reconciler does not read (the etcd and embedded
//! ledgers' with an API server to ask, and every secondary network's), one sweeper per set.
//! It binds a reservation to the stored pod that carries its token, frees the claims no pod
//! holds any more (a pod deleted while no admission DELETE reached the webhook, a reservation
//! whose pod never came), keeps a StatefulSet pod's claim for its name, and frees a VM's
//! claim only once the API server says the VM is gone.
//!
//! A claim's pods are read in one metadata-only list of its namespace, each with the IPs it
//! carries on these books' interface ([`PodDirectory::info`]). A claim's age is counted on
//! this replica's own monotonic clock from when this sweeper first saw it as it is, never from
//! a time another replica wrote: clocks may disagree by minutes, and a claim made at admission
//! is a promise until its pod is stored. Each change is conditional on the record being the
//! one read, so a sweep racing an admission or another replica changes nothing it should not.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::metrics::Metrics;
use ip_webhook_ipam::allocator::Allocator;
use ip_webhook_ledger::{Claim, HexId, Phase, Text, claim};

use super::claiming_pod::{ClaimingPod, PodMap};
use super::lifecycle::{self, Age, DropReason, Rules, Verdict};
use super::pods::PodDirectory;

pub(crate) struct Sweeper {
    allocator: Arc<Allocator>,
    pods: PodDirectory,
    rules: Rules,
    period: Duration,
    metrics: Arc<Metrics>,
    /// What this sweeper has seen of the claim on each IP, as it is now.
    ages: HashMap<IpAddr, Sighting>,
    /// This replica's own clock for the ages.
    started: tokio::time::Instant,
    /// Releases that failed with an error (a timeout, say) but may have been written: counted
    /// when a later sweep finds the claim released.
    uncertain: HashSet<(IpAddr, HexId)>,
    /// Since when (on [`Sweeper::started`]) this replica's copy has shown each reservation, by
    /// its request.
    reserved: HashMap<IpAddr, (HexId, u64)>,
}

/// How often the leader looks for the stored pods of reservations between sweeps.
pub(crate) const RESERVATIONS_EVERY: Duration = Duration::from_secs(1);

/// A claim as it is (its grant, phase and pod), and its [`Age`].
struct Sighting {
    state: (HexId, Phase, Option<Text>),
    age: Age,
}

fn state_of(claim: &Claim) -> (HexId, Phase, Option<Text>) {
    (
        claim.request_uid.clone(),
        claim.phase,
        claim.pod.uid.clone(),
    )
}

impl Sweeper {
    pub(crate) fn new(
        allocator: Arc<Allocator>,
        pods: PodDirectory,
        rules: Rules,
        period: Duration,
        metrics: Arc<Metrics>,
    ) -> Sweeper {
        Sweeper {
            allocator,
            pods,
            rules,
            period,
            metrics,
            ages: HashMap::new(),
            started: tokio::time::Instant::now(),
            uncertain: HashSet::new(),
            reserved: HashMap::new(),
        }
    }

    /// Sweep every `period` while `leading` says this replica holds the Lease, and look for
    /// the stored pods of reservations every [`RESERVATIONS_EVERY`] in between.
    pub(crate) async fn run(mut self, mut leading: watch::Receiver<bool>) {
        let mut next_sweep = tokio::time::Instant::now();
        loop {
            if *leading.borrow_and_update() {
                let now = self.started.elapsed().as_secs();
                if tokio::time::Instant::now() >= next_sweep {
                    self.sweep(now).await;
                    next_sweep = tokio::time::Instant::now() + self.period;
                } else {
                    self.bind_reservations(now).await;
                }
            } else {
                // a new leader starts its own count of how long claims went unheld
                self.ages.clear();
                self.reserved.clear();
            }
            let wait = RESERVATIONS_EVERY.min(self.period);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                changed = leading.changed() => if changed.is_err() { return },
            }
        }
    }

    /// Bind each reservation this replica's copy has shown for [`RESERVATIONS_EVERY`] twice
    /// to the stored pod that carries its token, if one is there now: a pod stored while
    /// `/validate` was not reached (`failurePolicy: Ignore`) holds its IP by UID from then on,
    /// so a copy of it carrying its annotations is never taken for it. The rest is the sweep's.
    async fn bind_reservations(&mut self, now: u64) {
        let reserved: Vec<Claim> = self.allocator.with_claims(|claims| {
            claims
                .filter(|c| c.phase == Phase::Reserved && c.pod.uid.is_none())
                .cloned()
                .collect()
        });
        let mut seen = HashMap::with_capacity(reserved.len());
        let mut due: BTreeMap<String, Vec<Claim>> = BTreeMap::new();
        for claim in reserved {
            let since = match self.reserved.get(&claim.ip) {
                Some((request, since)) if *request == claim.request_uid => *since,
                _ => now,
            };
            if now >= since + 2 * RESERVATIONS_EVERY.as_secs() {
                due.entry(claim.pod.namespace.to_string())
                    .or_default()
                    .push(claim.clone());
            }
            seen.insert(claim.ip, (claim.request_uid, since));
        }
        self.reserved = seen;
        for (namespace, claims) in due {
            let Ok(pods) = self.pods_of(&namespace, &HashSet::new()).await else {
                continue;
            };
            let bound: HashSet<&str> = pods
                .keys()
                .filter(|uid| self.allocator.names_pod(uid))
                .map(String::as_str)
                .collect();
            let age = Age {
                since: now,
                pod_seen: false,
            };
            for claim in claims {
                let verdict =
                    lifecycle::judge(&claim, age, &pods, now, self.rules, &|u| bound.contains(u));
                if let Verdict::Bind(pod) = verdict {
                    self.bind(&claim, pod).await;
                }
            }
        }
    }

    /// One pass at `now` (seconds on this replica's own clock); the IPs freed.
    pub(crate) async fn sweep(&mut self, now: u64) -> Vec<IpAddr> {
        let claims = match self.allocator.ledger().load().await {
            Ok(claims) => claims,
            Err(error) => {
                tracing::warn!(%error, "leak sweep: cannot read the ledger; trying again next period");
                return Vec::new();
            }
        };
        let bound: HashSet<Text> = claims
            .iter()
            .filter(|c| c.locks_ip())
            .filter_map(|c| c.pod.uid.clone())
            .collect();
        let due = self.due_by_namespace(claims, now);
        let mut freed = Vec::new();
        for (namespace, claims) in due {
            let pods = match self.pods_of(&namespace, &bound).await {
                Ok(pods) => pods,
                Err(why) => {
                    tracing::warn!(%namespace, "leak sweep: {why}; its claims wait for the next period");
                    continue;
                }
            };
            for claim in claims {
                if self.act(&claim, &pods, &bound, now).await {
                    freed.push(claim.ip);
                }
            }
        }
        freed
    }

    /// The claims this sweeper saw in an earlier pass as they are now (a claim just made is
    /// looked at from the next pass on), by namespace; notes every claim's age and counts the
    /// uncertain releases of earlier passes the ledger shows done.
    fn due_by_namespace(&mut self, claims: Vec<Claim>, now: u64) -> BTreeMap<String, Vec<Claim>> {
        let released: HashSet<(IpAddr, HexId)> = claims
            .iter()
            .filter(|c| !c.locks_ip())
            .map(|c| (c.ip, c.request_uid.clone()))
            .collect();
        let reclaimed = self.uncertain.intersection(&released).count();
        self.metrics.leaks_reclaimed.inc_by(reclaimed as u64);
        self.uncertain.retain(|key| {
            claims
                .iter()
                .any(|c| c.ip == key.0 && c.request_uid == key.1 && c.locks_ip())
        });
        let mut due: BTreeMap<String, Vec<Claim>> = BTreeMap::new();
        let mut ages = HashMap::with_capacity(self.ages.len());
        for claim in claims.into_iter().filter(Claim::locks_ip) {
            let state = state_of(&claim);
            let sighting = match self.ages.remove(&claim.ip) {
                Some(seen) if seen.state == state => seen,
                // a phase change of the same pod's claim: that pod was still seen
                previous => Sighting {
                    age: Age {
                        since: now,
                        pod_seen: previous.is_some_and(|p| {
                            p.age.pod_seen && p.state.2.is_some() && p.state.2 == state.2
                        }),
                    },
                    state,
                },
            };
            if sighting.age.since < now {
                due.entry(claim.pod.namespace.to_string())
                    .or_default()
                    .push(claim.clone());
            }
            ages.insert(claim.ip, sighting);
        }
        self.ages = ages;
        due
    }

    /// The pods of `namespace` the rule reads: those that carry an IP on these books'
    /// interface, and those a claim names by UID (whatever they carry).
    async fn pods_of(&self, namespace: &str, bound: &HashSet<Text>) -> Result<PodMap, String> {
        let listed = self
            .pods
            .list_metadata(namespace)
            .await
            .map_err(|error| error.to_string())?;
        let mut pods = PodMap::default();
        for pod in &listed {
            let named = pod
                .metadata
                .uid
                .as_deref()
                .is_some_and(|uid| bound.contains(uid));
            let info = match named {
                true => self.pods.info_or_bare(&pod.metadata),
                false => self.pods.info(&pod.metadata),
            };
            if let Some(info) = info {
                pods.insert(info.uid.clone(), info);
            }
        }
        Ok(pods)
    }

    /// Apply the rule to `claim`; whether its IP was freed.
    async fn act(&mut self, claim: &Claim, pods: &PodMap, bound: &HashSet<Text>, now: u64) -> bool {
        let Some(sighting) = self.ages.get_mut(&claim.ip) else {
            return false;
        };
        if claim
            .pod
            .uid
            .as_deref()
            .is_some_and(|uid| pods.contains_key(uid))
        {
            sighting.age.pod_seen = true;
        }
        let bound = |uid: &str| bound.contains(uid);
        match lifecycle::judge(claim, sighting.age, pods, now, self.rules, &bound) {
            Verdict::Wait(_) => false,
            Verdict::Bind(pod) => {
                self.bind(claim, pod).await;
                false
            }
            Verdict::Keep => {
                self.release(claim, "kept the IP of a gone StatefulSet pod for its name")
                    .await;
                false
            }
            Verdict::Drop(reason) => self.drop_claim(claim, reason).await,
        }
    }

    /// Tie `claim` to `pod`, its final name and UID.
    async fn bind(&self, claim: &Claim, pod: &ClaimingPod) {
        let next = Claim {
            sticky: pod.stateful,
            ..claim::bound(claim, &pod.name, &pod.uid, ip_webhook_ledger::unix_now())
        };
        match self.allocator.transition(claim, &next).await {
            Ok(true) => {
                tracing::info!(ip = %claim.ip, pod = %format!("{}/{}", pod.namespace, pod.name), uid = %pod.uid, "claim bound to its stored pod")
            }
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(ip = %claim.ip, %error, "binding a claim to its pod failed; trying again");
            }
        }
    }

    /// Free `claim`; a VM's only once the API server says the VM no longer holds it.
    async fn drop_claim(&mut self, claim: &Claim, reason: DropReason) -> bool {
        if let Some(vm) = claim.vm.as_deref() {
            match self.pods.vm_holds_ip(&claim.pod.namespace, vm).await {
                Ok(false) => {}
                Ok(true) => return false,
                Err(why) => {
                    tracing::warn!(ip = %claim.ip, %why, "leak sweep: cannot tell whether a VM holds its IP; it stays held");
                    return false;
                }
            }
        }
        let what = match reason {
            DropReason::PodGone => {
                "freed an IP no pod holds (its pod is gone without an admission DELETE)"
            }
            DropReason::ReservationExpired => {
                "freed an IP reserved at admission that no pod took up"
            }
            DropReason::ReleaseDone => "freed the IP of a released claim",
        };
        let freed = self.release(claim, what).await;
        if freed {
            match reason {
                DropReason::PodGone => self.metrics.leaks_reclaimed.inc(),
                DropReason::ReservationExpired => self.metrics.reservations_expired.inc(),
                DropReason::ReleaseDone => 0,
            };
        }
        freed
    }

    async fn release(&mut self, claim: &Claim, what: &str) -> bool {
        match self.allocator.release_claim(claim).await {
            Ok(true) => {
                tracing::warn!(
                    ip = %claim.ip,
                    pod = %claim.pod.display(),
                    holder = %claim.named_holder(),
                    app = %claim.app_key(),
                    "{what}"
                );
                true
            }
            Ok(false) => false,
            Err(error) => {
                tracing::warn!(ip = %claim.ip, %error, "leak sweep: the release failed; trying again next period");
                self.uncertain.insert((claim.ip, claim.request_uid.clone()));
                false
            }
        }
    }
}
