//! Leaks outside the IPClaim books. With the etcd (or embedded) ledger and an API server to
//! ask, the Lease holder frees the claims no pod holds any more: a pod deleted while no
//! admission DELETE reached the webhook, or a reservation whose pod never came. The in-cluster
//! reconciler does this for IPClaims; these ledgers do not bind claims to pod UIDs, so a claim's
//! pod is found as `release` finds it ([`super::pods::holder`]: a pod created after the claim
//! that carries its IP and matches its name or generateName), in a metadata-only pod list.
//!
//! A claim is only looked at once this replica has seen it for the reservation TTL (its age on
//! this replica's own monotonic clock, never the time another replica wrote: clocks may
//! disagree by minutes, and a claim made at admission is a promise until its pod is stored).
//! A claim made for a
//! fixed pod name (a StatefulSet's) is freed only after no pod held it for the sticky grace,
//! so a pod being recreated keeps its IP. Each release is conditional on the record being the
//! one read, so a sweep racing an admission or another replica frees nothing it should not.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::ipam::allocator::Allocator;
use crate::ledger::{Claim, ObservedChange};
use crate::metrics::Metrics;

use super::pods::PodDirectory;
use super::reconcile::Rules;

pub struct Sweeper {
    allocator: Arc<Allocator>,
    pods: PodDirectory,
    rules: Rules,
    period: Duration,
    metrics: Arc<Metrics>,
    /// Since when (seconds on [`Sweeper::started`]) this replica has seen the claim on an IP,
    /// by the claim's request.
    first_seen: HashMap<IpAddr, (String, u64)>,
    /// Since when no pod has held the claim on an IP, by the claim's request.
    unheld_since: HashMap<IpAddr, (String, u64)>,
    /// This replica's own clock for the ages above.
    started: tokio::time::Instant,
    /// Releases that failed with an error (a timeout, say) but may have been written: counted
    /// when a later sweep finds the claim released.
    uncertain: HashSet<(IpAddr, String)>,
}

impl Sweeper {
    pub fn new(
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
            first_seen: HashMap::new(),
            unheld_since: HashMap::new(),
            started: tokio::time::Instant::now(),
            uncertain: HashSet::new(),
        }
    }

    /// Sweep every `period` while `leading` says this replica holds the Lease.
    pub async fn run(mut self, mut leading: watch::Receiver<bool>) {
        loop {
            if *leading.borrow_and_update() {
                let now = self.started.elapsed().as_secs();
                self.sweep(now).await;
            } else {
                // a new leader starts its own count of how long claims went unheld
                self.first_seen.clear();
                self.unheld_since.clear();
            }
            tokio::select! {
                _ = tokio::time::sleep(self.period) => {}
                changed = leading.changed() => if changed.is_err() { return },
            }
        }
    }

    /// One pass at `now` (seconds on this replica's own clock); the IPs freed.
    pub async fn sweep(&mut self, now: u64) -> Vec<IpAddr> {
        let claims = match self.allocator.ledger().load().await {
            Ok(claims) => claims,
            Err(error) => {
                tracing::warn!(%error, "leak sweep: cannot read the ledger; trying again next period");
                return Vec::new();
            }
        };
        let due = self.due_by_namespace(claims, now);
        let mut looked_at: HashMap<IpAddr, String> = HashMap::new();
        let mut freed = Vec::new();
        for (namespace, claims) in due {
            let pods = match self.pods.list_metadata(&namespace).await {
                Ok(pods) => pods,
                Err(why) => {
                    tracing::warn!(%namespace, "leak sweep: {why}; its claims wait for the next period");
                    for claim in &claims {
                        looked_at.insert(claim.ip, claim.request_uid.to_string());
                    }
                    continue;
                }
            };
            for claim in claims {
                looked_at.insert(claim.ip, claim.request_uid.to_string());
                if self.pods.holder(&pods, &claim).is_some() {
                    self.unheld_since.remove(&claim.ip);
                    continue;
                }
                let since = match self.unheld_since.get(&claim.ip) {
                    Some((request, since)) if *request == claim.request_uid => *since,
                    _ => {
                        self.unheld_since
                            .insert(claim.ip, (claim.request_uid.to_string(), now));
                        now
                    }
                };
                let grace = if claim.pod.name.is_empty() {
                    0
                } else {
                    self.rules.sticky_grace
                };
                if now < since + grace {
                    continue;
                }
                if self.free(&claim).await {
                    self.unheld_since.remove(&claim.ip);
                    freed.push(claim.ip);
                }
            }
        }
        self.unheld_since
            .retain(|ip, (request, _)| looked_at.get(ip) == Some(request));
        freed
    }

    /// The held claims whose reservation TTL has passed since this sweeper first saw them,
    /// by namespace; counts the uncertain releases of earlier passes the ledger shows done.
    fn due_by_namespace(&mut self, claims: Vec<Claim>, now: u64) -> BTreeMap<String, Vec<Claim>> {
        let mut due: BTreeMap<String, Vec<Claim>> = BTreeMap::new();
        for claim in &claims {
            if !claim.is_held()
                && self
                    .uncertain
                    .remove(&(claim.ip, claim.request_uid.to_string()))
            {
                // an earlier release whose answer was lost did reach the ledger
                self.metrics.leaks_reclaimed.inc();
            }
        }
        self.uncertain.retain(|(ip, request)| {
            claims
                .iter()
                .any(|c| c.ip == *ip && c.request_uid == *request)
        });
        let mut first_seen = HashMap::with_capacity(self.first_seen.len());
        for claim in claims.into_iter().filter(Claim::is_held) {
            let seen_since = match self.first_seen.get(&claim.ip) {
                Some((request, since)) if *request == claim.request_uid => *since,
                _ => now,
            };
            first_seen.insert(claim.ip, (claim.request_uid.to_string(), seen_since));
            if now >= seen_since + self.rules.reservation_ttl {
                due.entry(claim.pod.namespace.to_string())
                    .or_default()
                    .push(claim);
            }
        }
        self.first_seen = first_seen;
        due
    }

    async fn free(&mut self, claim: &Claim) -> bool {
        match self.allocator.ledger().release(claim).await {
            Ok(true) => {
                self.allocator
                    .apply_observed(ObservedChange::Released(claim.clone()));
                self.metrics.leaks_reclaimed.inc();
                tracing::warn!(
                    ip = %claim.ip,
                    pod = %claim.pod.display(),
                    app = %claim.app_key(),
                    "freed an IP no pod holds (its pod is gone without an admission DELETE, or never came)"
                );
                true
            }
            Ok(false) => false,
            Err(error) => {
                tracing::warn!(ip = %claim.ip, %error, "leak sweep: the release failed; trying again next period");
                self.uncertain
                    .insert((claim.ip, claim.request_uid.to_string()));
                false
            }
        }
    }
}
