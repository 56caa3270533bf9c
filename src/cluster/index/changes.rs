//! What the pod-IP index tells the others as pods change: which running pods the reconciler's
//! list adoption should look at ([`ClusterIps::take_marked`]), and which pods are Terminating
//! ([`ClusterIps::terminating_pods`]), so that neither has to visit every pod.

use std::net::IpAddr;
use std::sync::Arc;

use kube::runtime::watcher;

use super::{ClusterIps, RunningPod, SlimOrGone, read, write};

/// UIDs marked for the reconciler's list adoption, at most [`MARK_CAP`]; past that (or after a
/// relist) only a visit of every pod is sure to see them all.
pub(super) type Marked = crate::cluster::change_log::ChangeLog<Box<str>, MARK_CAP>;

/// Marks kept between two leader passes; a replica that does not lead stops at this.
pub(super) const MARK_CAP: usize = 4096;

impl ClusterIps {
    /// Every IP that two or more live (not Terminating) indexed pods run on, with those pods,
    /// oldest first: what `status.podIPs` shows, whoever assigned the IPs.
    pub(crate) fn shared_pod_ips(&self) -> Vec<(IpAddr, Vec<Arc<RunningPod>>)> {
        read(&self.pods)
            .shared
            .iter()
            .filter_map(|(ip, carriers)| {
                let mut live: Vec<Arc<RunningPod>> = carriers
                    .iter()
                    .filter(|p| p.deleting_at.is_none())
                    .cloned()
                    .collect();
                live.sort_by(|a, b| (a.created_at, &a.uid).cmp(&(b.created_at, &b.uid)));
                (live.len() > 1).then_some((*ip, live))
            })
            .collect()
    }

    /// A count that changes whenever pods come to share an IP or cease to.
    pub(super) fn shared_changes(&self) -> u64 {
        read(&self.pods).shared_changes
    }

    /// Tell the pod watch which app lists hold which IPs, so that only the events of pods on
    /// an IP of their own app's list wake the reconciler.
    pub(crate) fn set_lists(&self, lists: Arc<dyn crate::cluster::app_lists::AppLists>) {
        let _ = self.lists.set(lists);
    }

    /// Whether the reconciler's list adoption cares about this pod: it has an app, and its
    /// app's list (and no other) holds one of its IPs. Without lists, any pod with an app.
    pub(crate) fn concerns_lists(&self, pod: &RunningPod) -> bool {
        if pod.app.is_empty() {
            return false;
        }
        let Some(lists) = self.lists.get() else {
            return true;
        };
        let own = format!("{}/{}", pod.namespace, pod.app);
        pod.ips
            .iter()
            .any(|ip| lists.sole_app_listing(*ip).as_deref() == Some(own.as_str()))
    }

    /// Mark a pod for the reconciler's next list adoption.
    pub(super) fn mark(&self, uid: &str) {
        self.marked_log().note(uid.into());
    }

    /// Everything must be looked at again (a relist).
    pub(super) fn mark_all(&self) {
        self.marked_log().note_all();
    }

    /// The pods marked since the last call; `None` when the count was lost (a relist, or more
    /// than [`MARK_CAP`]): then every pod needs a look.
    pub(crate) fn take_marked(&self) -> Option<Vec<Box<str>>> {
        self.marked_log().take()
    }

    fn marked_log(&self) -> std::sync::MutexGuard<'_, Marked> {
        self.marked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep [`Self::terminating_pods`] in step with one pod's change (`None`: gone or not
    /// running on IPs of its own).
    pub(super) fn note_terminating(&self, uid: &str, pod: Option<&RunningPod>) {
        match pod.filter(|p| p.deleting_at.is_some()) {
            Some(pod) => {
                write(&self.terminating).insert(uid.into(), Arc::new(pod.clone()));
            }
            None => {
                write(&self.terminating).remove(uid);
            }
        }
    }

    /// Rebuild [`Self::terminating_pods`] from the index (after a relist).
    pub(super) fn rebuild_terminating(&self) {
        let pods = read(&self.pods);
        *write(&self.terminating) = pods
            .by_key
            .iter()
            .filter(|(_, p)| p.deleting_at.is_some())
            .map(|(k, p)| (k.clone(), p.clone()))
            .collect();
    }
}

/// The pod an event changes outside a relist, and what it becomes.
pub(super) fn touched(
    event: &watcher::Event<SlimOrGone>,
) -> Option<(Box<str>, Option<RunningPod>)> {
    match event {
        watcher::Event::Apply(SlimOrGone { key, value }) => Some((key.clone(), value.clone())),
        watcher::Event::Delete(SlimOrGone { key, .. }) => Some((key.clone(), None)),
        _ => None,
    }
}
