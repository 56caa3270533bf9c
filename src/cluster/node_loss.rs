//! Node-loss release: a pod stuck Terminating on a node that stopped reporting keeps its IP
//! until someone force-deletes it, so a list sized to the replicas refuses the replacement.
//! The leader releases the claims of such a pod once
//!
//! - the pod is Terminating and its own grace (`deletionGracePeriodSeconds`) has passed since
//!   the leader first saw it Terminating;
//! - its node's `Ready` condition has been `False` or `Unknown`, as the leader has seen it
//!   without a break, for longer than `--node-lost-grace` (0 turns this off);
//! - its controller makes a replacement under a new name: ReplicaSet, Job or DaemonSet.
//!   StatefulSet pods and bare pods keep their IP (a StatefulSet's replacement has the same name
//!   and takes the claim over once the old pod object is gone), and so do KubeVirt launcher
//!   pods (the IP is the VM's, freed only once the VM is gone).
//!
//! Each release is logged (WARN), counted (`ip_webhook_node_lost_releases_total`) and told as
//! a Warning Event on the pod's owner. Nodes are watched slimmed to their `Ready` condition.
//!
//! Every duration is measured on the leader's own monotonic clock ([`LossClock`]): the
//! `deletionTimestamp` is the API server's clock and a node's `lastTransitionTime` the
//! kubelet's or the controller manager's, and comparing either with this machine's clock
//! would release a pod inside its grace whenever the clocks disagree. A new leader starts its
//! own count.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::Api;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

use super::controller::ControllerKind;
use super::index::{ClusterIps, RunningPod};
use super::lease::LeaderTicks;
use super::watches::{Change, Mirror, drive};
use crate::metrics::Metrics;
use ip_webhook_ipam::allocator::Allocator;
use ip_webhook_ledger::Claim;

/// A node's `Ready` condition: whether it is `True`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NodeReady {
    pub(crate) ready: bool,
}

impl NodeReady {
    /// The `Ready` condition of a node; `None` when it has none (never reported).
    pub(crate) fn of(node: &Node) -> Option<NodeReady> {
        let condition = node
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "Ready")?;
        Some(NodeReady {
            ready: condition.status == "True",
        })
    }
}

/// Nodes by name, each kept as its [`NodeReady`] only.
#[derive(Default)]
pub(crate) struct Nodes {
    ready: RwLock<HashMap<String, NodeReady>>,
    synced: AtomicBool,
}

impl Nodes {
    pub(crate) fn synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    pub(crate) fn get(&self, name: &str) -> Option<NodeReady> {
        self.ready
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .copied()
    }

    /// Forget every node until the next list (the watch stopped: this replica no longer
    /// leads).
    pub(crate) fn forget(&self) {
        self.synced.store(false, Ordering::SeqCst);
        self.ready
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    fn apply(&self, change: Change<NodeReady>) {
        let mut ready = self.ready.write().unwrap_or_else(|p| p.into_inner());
        match change {
            Change::Upsert(name, value) => {
                ready.insert(name, value);
            }
            Change::Delete(name) => {
                ready.remove(&name);
            }
            Change::Replace(all) => {
                *ready = all.into_iter().collect();
                self.synced.store(true, Ordering::SeqCst);
            }
            Change::Nothing => {}
        }
    }
}

/// Nodes into `nodes`, slimmed to the `Ready` condition as each event arrives (a node
/// without one is left out: it counts as not lost).
pub(crate) async fn watch_nodes(api: Api<Node>, nodes: Arc<Nodes>) {
    let mut mirror = Mirror::new();
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    drive(stream, "nodes", None, |event| {
        let change = mirror.step(
            &event,
            |node: &Node| node.metadata.name.clone(),
            NodeReady::of,
        );
        nodes.apply(change);
    })
    .await
}

/// The grace of a pod whose deletion names none: Kubernetes' default.
const DEFAULT_POD_GRACE: u64 = 30;

/// Since when (on the leader's clock) the leader has seen each Terminating pod and each node
/// that is not Ready.
#[derive(Debug, Default)]
pub(crate) struct LossClock {
    terminating: HashMap<Box<str>, u64>,
    down: HashMap<Box<str>, u64>,
}

impl LossClock {
    /// Note what a pass sees at `now`: the Terminating pods, and each one's node; forget the
    /// pods no longer Terminating and the nodes Ready again or no longer asked about.
    pub(crate) fn observe(&mut self, pods: &[Arc<RunningPod>], nodes: &Nodes, now: u64) {
        let mut terminating = HashMap::with_capacity(pods.len());
        let mut down = HashMap::new();
        for pod in pods.iter().filter(|p| p.deleting_at.is_some()) {
            let since = self.terminating.get(&pod.uid).copied().unwrap_or(now);
            terminating.insert(pod.uid.clone(), since);
            if nodes.get(pod.node.as_str()).is_some_and(|n| !n.ready)
                && !down.contains_key(pod.node.as_str())
            {
                let since = self.down.get(pod.node.as_str()).copied().unwrap_or(now);
                down.insert(pod.node.as_str().into(), since);
            }
        }
        self.terminating = terminating;
        self.down = down;
    }

    pub(crate) fn clear(&mut self) {
        self.terminating.clear();
        self.down.clear();
    }
}

/// Since when `pod`'s node has been seen lost, if `pod` may be released at `now` with `grace`
/// seconds of `--node-lost-grace` (0: never). `clock` has observed this pass.
pub(crate) fn lost_since(pod: &RunningPod, clock: &LossClock, now: u64, grace: u64) -> Option<u64> {
    if grace == 0 {
        return None;
    }
    if !pod
        .controller
        .is_some_and(ControllerKind::replaces_under_new_name)
    {
        return None;
    }
    pod.deleting_at?;
    let terminating = *clock.terminating.get(&pod.uid)?;
    let own_grace = pod.deletion_grace.unwrap_or(DEFAULT_POD_GRACE);
    if now < terminating.saturating_add(own_grace) {
        return None;
    }
    let down = *clock.down.get(pod.node.as_str())?;
    (now.saturating_sub(down) > grace).then_some(down)
}

/// The leader's node-loss releaser.
pub(crate) struct NodeLoss {
    /// The allocator of every interface: a pod's claims on each are released.
    pub(crate) allocators: Vec<Arc<Allocator>>,
    pub(crate) cluster_ips: Arc<ClusterIps>,
    pub(crate) nodes: Arc<Nodes>,
    /// To read a pod's owner references (for the Event) and confirm it before a release.
    pub(crate) pods: kube::Client,
    pub(crate) recorder: Recorder,
    pub(crate) metrics: Arc<Metrics>,
    /// `--node-lost-grace`, in seconds.
    pub(crate) grace: u64,
}

/// How often the leader looks for pods on lost nodes.
pub(crate) const PERIOD: Duration = Duration::from_secs(1);

impl NodeLoss {
    /// The leader's tasks: its watch of Nodes into [`NodeLoss::nodes`] (only the leader
    /// releases on node loss, so only the leader watches Nodes; forgotten when it stops
    /// leading), and this releaser, a pass every [`PERIOD`].
    pub(crate) fn spawn(self, leading: &watch::Receiver<bool>) -> Vec<tokio::task::JoinHandle<()>> {
        let (api, nodes): (Api<Node>, _) = (Api::all(self.pods.clone()), self.nodes.clone());
        let watch = tokio::spawn(super::lease::while_leading(
            leading.clone(),
            move || watch_nodes(api.clone(), nodes.clone()),
            {
                let nodes = self.nodes.clone();
                move || nodes.forget()
            },
        ));
        vec![watch, tokio::spawn(self.run(leading.clone(), PERIOD))]
    }

    /// Run until aborted: a pass every `every` while this replica leads and the node and
    /// pod indexes have synced.
    pub(crate) async fn run(self, leading: watch::Receiver<bool>, every: Duration) {
        let mut ticks = LeaderTicks::new(every, leading);
        let started = tokio::time::Instant::now();
        let mut clock = LossClock::default();
        let mut last_pass: Option<tokio::time::Instant> = None;
        loop {
            ticks
                .next(|| self.nodes.synced() && self.cluster_ips.pods_synced())
                .await;
            // passes skipped (not leading, not synced): what was seen before may have changed
            // unseen, so the count starts again
            if last_pass.is_some_and(|at| at.elapsed() > every * 3) {
                clock.clear();
            }
            last_pass = Some(tokio::time::Instant::now());
            self.pass(&mut clock, started.elapsed().as_secs()).await;
        }
    }

    /// One pass at `now` (seconds on `clock`'s clock); returns how many claims were released.
    pub(crate) async fn pass(&self, clock: &mut LossClock, now: u64) -> usize {
        self.cluster_ips.prune_lost();
        let terminating = self.cluster_ips.terminating_pods();
        clock.observe(&terminating, &self.nodes, now);
        let mut lost: HashMap<Box<str>, (Arc<RunningPod>, u64)> = HashMap::new();
        for pod in terminating {
            if let Some(since) = lost_since(&pod, clock, now, self.grace) {
                lost.insert(pod.uid.clone(), (pod, since));
            }
        }
        if lost.is_empty() {
            return 0;
        }
        let mut claims: Vec<(&Arc<Allocator>, Claim)> = Vec::new();
        for allocator in &self.allocators {
            allocator.with_claims(|held| {
                claims.extend(
                    held.filter(|c| c.is_held())
                        .filter(|c| c.pod.uid.as_deref().is_some_and(|u| lost.contains_key(u)))
                        .map(|c| (allocator, c.clone())),
                )
            });
        }
        let mut released = 0;
        let mut told: HashSet<Box<str>> = HashSet::new();
        for (allocator, claim) in claims {
            let Some((pod, since)) = claim.pod.uid.as_deref().and_then(|u| lost.get(u)) else {
                continue;
            };
            // Confirm with the API server: the same pod, still Terminating.
            let api: Api<Pod> = Api::namespaced(self.pods.clone(), &pod.namespace);
            let current = match api.get_opt(&pod.name).await {
                Ok(Some(current)) => current,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(%error, pod = %format!("{}/{}", pod.namespace, pod.name), "cannot confirm a pod on a lost node; trying again");
                    continue;
                }
            };
            if current.metadata.uid.as_deref() != Some(&*pod.uid)
                || current.metadata.deletion_timestamp.is_none()
            {
                continue;
            }
            match allocator.release_claim(&claim).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(error) => {
                    tracing::warn!(ip = %claim.ip, %error, "releasing the claim of a pod on a lost node failed; trying again");
                    continue;
                }
            }
            released += 1;
            self.metrics.node_lost_releases.inc();
            self.cluster_ips.mark_lost(&pod.uid);
            let down = now.saturating_sub(*since);
            tracing::warn!(
                ip = %claim.ip,
                pod = %format!("{}/{}", pod.namespace, pod.name),
                node = %pod.node,
                not_ready_seconds = down,
                "released the IP of a pod stuck Terminating on a lost node; its controller makes a replacement under a new name"
            );
            if told.insert(pod.uid.clone()) {
                self.tell_owner(&current, pod, &claim, down);
            }
        }
        released
    }

    /// A Warning Event on the pod's controller owner (or the pod, without one).
    fn tell_owner(&self, current: &Pod, pod: &RunningPod, claim: &Claim, down: u64) {
        let owner = current
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true));
        let reference = match owner {
            Some(owner) => ObjectReference {
                api_version: Some(owner.api_version.clone()),
                kind: Some(owner.kind.clone()),
                name: Some(owner.name.clone()),
                namespace: Some(pod.namespace.to_string()),
                uid: Some(owner.uid.clone()).filter(|u| !u.is_empty()),
                ..ObjectReference::default()
            },
            None => ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name.to_string()),
                namespace: Some(pod.namespace.to_string()),
                uid: Some(pod.uid.to_string()),
                ..ObjectReference::default()
            },
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "NodeLostIPReleased".into(),
            note: Some(format!(
                "released IP {} of pod {}/{}: it is stuck Terminating on node {}, NotReady for {down}s (longer than --node-lost-grace)",
                claim.ip, pod.namespace, pod.name, pod.node
            )),
            action: "ReleaseFixedIP".into(),
            secondary: None,
        };
        let recorder = self.recorder.clone();
        tokio::spawn(async move {
            if let Err(error) = recorder.publish(&event, &reference).await {
                tracing::warn!(%error, reason = event.reason, "could not publish an Event");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slim(controller: Option<ControllerKind>, deleting_at: Option<u64>) -> RunningPod {
        RunningPod {
            namespace: "prod".into(),
            name: "web-abc".into(),
            uid: "u1".into(),
            node: "n1".into(),
            ips: vec!["10.0.0.1".parse().unwrap()].into(),
            app: "web".into(),
            vm: None,
            deleting_at,
            deletion_grace: deleting_at.map(|_| 30),
            created_at: 0,
            controller,
        }
    }

    fn nodes(ready: bool) -> Nodes {
        let nodes = Nodes::default();
        nodes.apply(Change::Replace(
            [("n1".to_string(), NodeReady { ready })]
                .into_iter()
                .collect(),
        ));
        nodes
    }

    /// Seen at `t0` terminating on a node not Ready, then observed each second until `now`.
    fn watched(pod: &RunningPod, nodes: &Nodes, t0: u64, now: u64) -> LossClock {
        let mut clock = LossClock::default();
        let pods = [Arc::new(pod.clone())];
        for t in t0..=now {
            clock.observe(&pods, nodes, t);
        }
        clock
    }

    #[test]
    fn a_pod_is_lost_only_past_its_grace_on_a_node_notready_past_the_node_grace() {
        // the API server's deletionTimestamp and clock play no part: an hour off either way
        const T0: u64 = 10_000;
        let rs = Some(ControllerKind::ReplicaSet);
        let down = nodes(false);
        for written in [T0 - 3_600, T0 + 3_600] {
            let pod = slim(rs, Some(written));
            assert_eq!(
                lost_since(&pod, &watched(&pod, &down, T0, T0 + 301), T0 + 301, 300),
                Some(T0)
            );
            // node not seen down long enough (exactly the grace is not longer than it)
            assert_eq!(
                lost_since(&pod, &watched(&pod, &down, T0, T0 + 300), T0 + 300, 300),
                None
            );
        }
        // the pod's own grace (30 s) has not passed since it was seen Terminating
        let pod = slim(rs, Some(T0));
        let clock = watched(&pod, &down, T0, T0 + 29);
        assert_eq!(lost_since(&pod, &clock, T0 + 29, 10), None);
        assert_eq!(
            lost_since(&pod, &watched(&pod, &down, T0, T0 + 30), T0 + 30, 10),
            Some(T0)
        );
        // not terminating
        let running = slim(rs, None);
        assert_eq!(
            lost_since(
                &running,
                &watched(&running, &down, T0, T0 + 3600),
                T0 + 3600,
                300
            ),
            None
        );
        // a Ready node, an unknown node
        let ready = nodes(true);
        assert_eq!(
            lost_since(&pod, &watched(&pod, &ready, T0, T0 + 3600), T0 + 3600, 300),
            None
        );
        let unknown = Nodes::default();
        assert_eq!(
            lost_since(
                &pod,
                &watched(&pod, &unknown, T0, T0 + 3600),
                T0 + 3600,
                300
            ),
            None
        );
        // StatefulSet pods, KubeVirt launcher pods and bare pods keep their IP
        for controller in [
            Some(ControllerKind::StatefulSet),
            Some(ControllerKind::VirtualMachineInstance),
            None,
        ] {
            let kept = slim(controller, Some(T0));
            assert_eq!(
                lost_since(&kept, &watched(&kept, &down, T0, T0 + 3600), T0 + 3600, 300),
                None
            );
        }
        // --node-lost-grace 0 turns it off
        assert_eq!(
            lost_since(&pod, &watched(&pod, &down, T0, T0 + 3600), T0 + 3600, 0),
            None
        );
    }

    /// A NotReady blip: a node that was Ready again in between starts its count anew, and so
    /// does a node first seen down by this leader, whatever its lastTransitionTime says.
    #[test]
    fn a_node_seen_ready_again_starts_its_count_anew() {
        let pod = slim(Some(ControllerKind::ReplicaSet), Some(1));
        let pods = [Arc::new(pod.clone())];
        let (down, ready) = (nodes(false), nodes(true));
        let mut clock = LossClock::default();
        clock.observe(&pods, &down, 0);
        clock.observe(&pods, &ready, 100);
        clock.observe(&pods, &down, 200);
        assert_eq!(lost_since(&pod, &clock, 200, 60), None);
        clock.observe(&pods, &down, 261);
        assert_eq!(lost_since(&pod, &clock, 261, 60), Some(200));
    }

    #[test]
    fn a_released_lost_pods_ip_stops_counting_as_used_until_the_pod_goes() {
        use ip_webhook_ipam::foreign::ForeignIps;
        let index = ClusterIps::default();
        let ip = "10.0.0.1".parse().unwrap();
        index.set_pods(vec![slim(Some(ControllerKind::ReplicaSet), Some(1))]);
        assert!(index.user(&ip).is_some());
        assert_eq!(index.terminating_pods().len(), 1);
        index.mark_lost("u1");
        assert_eq!(index.user(&ip), None);
        index.prune_lost();
        assert_eq!(index.user(&ip), None, "still indexed: still lost");
        index.set_pods(Vec::new());
        index.prune_lost();
        // a pod of that UID again (a relist) counts as used once more: the mark went with it
        index.set_pods(vec![slim(None, None)]);
        assert!(index.user(&ip).is_some());
    }

    #[test]
    fn a_node_is_kept_as_its_ready_condition_only() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"},
            "status": {
                "conditions": [
                    {"type": "MemoryPressure", "status": "False", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                    {"type": "Ready", "status": "Unknown", "lastTransitionTime": "2026-01-01T00:00:10Z"},
                ],
                "images": [{"names": ["big"], "sizeBytes": 1}],
            },
        }))
        .unwrap();
        assert_eq!(NodeReady::of(&node), Some(NodeReady { ready: false }));
        let bare: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n2"}})).unwrap();
        assert_eq!(NodeReady::of(&bare), None);
    }
}
