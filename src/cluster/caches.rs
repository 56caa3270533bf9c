//! What the in-cluster watches hold ([`Caches`]): the compact pod cache, the IPClaims, the
//! pools and the cluster's IPs, with the changes the leader's next pass reads.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::{PodMap, change_log, claim_list, index, leader_view, lock};
use crate::metrics::watch_health::WatchHealth;
use ip_webhook_ledger::crd::{FixedIPPool, IPClaim};

/// What the watches hold. Pods are kept as `ClaimingPod` only, and only pods that carry an IP.
#[derive(Default)]
pub(crate) struct Caches {
    pub(crate) pods: Mutex<Arc<PodMap>>,
    pub(crate) claims: Mutex<BTreeMap<String, Arc<IPClaim>>>,
    /// The claims the claim watch changed since the leader's pass last took them, noted under
    /// the lock of `claims` ([`Caches::take_claim_changes`]).
    pub(super) claim_changes: Mutex<CacheChanges>,
    /// The pods the pod watch changed in `pods` since then, noted under its lock
    /// ([`Caches::take_pod_changes`]).
    pub(super) pod_changes: Mutex<CacheChanges>,
    /// What the claim watch changed while a full pass's list of claims was read.
    pub(crate) claim_list: claim_list::ListWindow,
    pub(crate) pools: Mutex<BTreeMap<String, FixedIPPool>>,
    /// Pods' actual IPs, Kube-OVN IP objects, workloads' lists ([`index`]).
    pub(crate) cluster_ips: Arc<index::ClusterIps>,
    pub(super) pods_synced: AtomicBool,
    /// When the pod watch last (re)listed: a full pass takes its pods from a list this recent.
    pub(super) pods_listed_at: Mutex<Option<tokio::time::Instant>>,
    pub(super) claims_synced: AtomicBool,
    pub(super) pools_synced: AtomicBool,
    /// Something changed: the reconciler may have work ([`Caches::mark_changed`]).
    pub(super) changed: Notify,
    /// A change no pass has started from yet: the reconciler's wakeups that come after a
    /// pass already saw their change cost nothing.
    pub(super) unseen_change: AtomicBool,
    /// Whether the watches that admission decisions read are live (`/readyz`).
    pub(crate) health: Arc<WatchHealth>,
}

impl Caches {
    pub(crate) fn synced(&self) -> bool {
        self.pods_synced.load(Ordering::SeqCst)
            && self.claims_synced.load(Ordering::SeqCst)
            && self.pools_synced.load(Ordering::SeqCst)
            && self.cluster_ips.synced()
    }

    /// Tell the reconciler the caches changed.
    pub(crate) fn mark_changed(&self) {
        self.unseen_change.store(true, Ordering::SeqCst);
        self.changed.notify_one();
    }

    /// Wait for `Caches::mark_changed` (or a permit it left while no one waited).
    pub(crate) async fn changes(&self) {
        self.changed.notified().await
    }

    /// Whether a change came since the last call: a pass calls it as it starts, since it
    /// reads the caches as they are from then on.
    pub(crate) fn take_unseen_change(&self) -> bool {
        self.unseen_change.swap(false, Ordering::SeqCst)
    }

    /// The claims changed since the last call, each with its object now (`None`: gone); `None`
    /// when the changes were lost (a relist, or too many): then every claim needs a look.
    pub(crate) fn take_claim_changes(&self) -> Option<Vec<leader_view::ClaimChange>> {
        let claims = lock(&self.claims);
        let names = lock(&self.claim_changes).take()?;
        let now = |name: Box<str>| {
            let object = claims.get(&*name).cloned();
            (name, object)
        };
        Some(names.into_iter().map(now).collect())
    }

    /// Note under the claim cache's lock (`_claims`) that a claim changed (`None`: all may have).
    pub(crate) fn note_claim_change(
        &self,
        _claims: &BTreeMap<String, Arc<IPClaim>>,
        name: Option<&str>,
    ) {
        note(&self.claim_changes, name);
    }

    /// The pod cache now, and the UIDs of the pods changed in it since the last call (`None`:
    /// the changes were lost).
    pub(crate) fn take_pod_changes(&self) -> (Arc<PodMap>, Option<Vec<Box<str>>>) {
        let pods = lock(&self.pods);
        let uids = lock(&self.pod_changes).take();
        (Arc::clone(&pods), uids)
    }

    /// Note under the pod cache's lock (`_pods`) that a pod changed (`None`: all may have).
    pub(crate) fn note_pod_change(&self, _pods: &Arc<PodMap>, uid: Option<&str>) {
        note(&self.pod_changes, uid);
    }

    pub(crate) fn claim_list(&self) -> Vec<Arc<IPClaim>> {
        lock(&self.claims).values().cloned().collect()
    }

    /// The pods that carry our IPs, as of now: a shared copy, not a clone.
    pub(crate) fn pod_map(&self) -> Arc<PodMap> {
        lock(&self.pods).clone()
    }

    /// Whether the pod watch (re)listed within `period`.
    pub(crate) fn pods_listed_within(&self, period: Duration) -> bool {
        lock(&self.pods_listed_at).is_some_and(|at| at.elapsed() < period)
    }
}

/// The IPClaim guard asks the watches whether a claim's pod runs.
impl crate::decisions::claim_guard::LivePods for Caches {
    fn life(&self, uid: &str) -> crate::decisions::claim_guard::PodLife {
        if !self.synced() {
            return crate::decisions::claim_guard::PodLife::Unknown(
                "the webhook's pod caches have not synced yet",
            );
        }
        if let Some(pod) = self.pods.lock().unwrap_or_else(|p| p.into_inner()).get(uid) {
            return crate::decisions::claim_guard::PodLife::Runs(format!(
                "{}/{}",
                pod.namespace, pod.name
            ));
        }
        match self.cluster_ips.pod(uid) {
            Some(pod) => crate::decisions::claim_guard::PodLife::Runs(format!(
                "{}/{}",
                pod.namespace, pod.name
            )),
            None => crate::decisions::claim_guard::PodLife::Gone,
        }
    }
}

/// Changes to a cache between two leader passes; a replica that does not lead stops noting
/// past [`CHANGES_CAP`], and its first pass as the leader looks at everything anyway.
type CacheChanges = change_log::ChangeLog<Box<str>, CHANGES_CAP>;

const CHANGES_CAP: usize = 4096;

fn note(log: &Mutex<CacheChanges>, key: Option<&str>) {
    let mut log = lock(log);
    match key {
        Some(key) => log.note(key.into()),
        None => log.note_all(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wakeup_for_a_change_a_pass_already_saw_is_told_apart() {
        let caches = Caches::default();
        assert!(!caches.take_unseen_change());
        // a burst of changes: one permit, one unseen change
        caches.mark_changed();
        caches.mark_changed();
        // the pass starts (and so sees them) before the loop waits again
        assert!(caches.take_unseen_change());
        // the permit the burst left wakes the loop at once, with nothing new to see
        tokio::time::timeout(Duration::from_secs(1), caches.changes())
            .await
            .expect("the permit wakes the loop");
        assert!(!caches.take_unseen_change(), "no second pass for it");
        caches.mark_changed();
        assert!(caches.take_unseen_change(), "a later change is seen");
    }
}
