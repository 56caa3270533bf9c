//! Watch-fed indexes of what the cluster itself says is in use, the same on every replica:
//!
//! - the IPs pods actually run on (`status.podIPs`), kept as a [`RunningPod`] each (namespace,
//!   name, UID, node, IPs, deletion time, controller kind; everything else is dropped as the
//!   event arrives);
//! - Kube-OVN `IP` objects (`ips.kubeovn.io`) when that CRD is served;
//! - workloads whose pod template asks for fixed IPs (fed into the
//!   `crate::decisions::workloads::WorkloadRegistry`, see `workloads`).
//!
//! The allocator consults [`ForeignIps`] so that a static IP a live pod outside the ledger
//! uses is refused, and such an IP is skipped as an allocation candidate.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;

use super::Caches;
use crate::metrics::{CacheKindLabels, Metrics};
use ip_webhook_ipam::foreign::{ForeignIps, ForeignUse};
use ip_webhook_ledger::Shared;

pub(crate) mod calico;
mod changes;
mod pod_watch;
pub(crate) mod workloads;
use changes::{Marked, touched};
pub(crate) use pod_watch::watch_pod_ips;

/// A pod that runs on IPs of its own (`status.podIPs`), as the pod-IP index keeps every such
/// pod of the cluster: where it runs, and the little the index's readers ask of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningPod {
    /// Interned, as `node` and `app`: many pods carry each alike, and the index holds every
    /// running pod of the cluster.
    pub(crate) namespace: Shared,
    pub(crate) name: Box<str>,
    pub(crate) uid: Box<str>,
    pub(crate) node: Shared,
    pub(crate) ips: Box<[IpAddr]>,
    /// `metadata.deletionTimestamp` (unix seconds, the API server's clock): the pod is
    /// Terminating.
    pub(crate) deleting_at: Option<u64>,
    /// `metadata.deletionGracePeriodSeconds`: how long its containers may still run.
    pub(crate) deletion_grace: Option<u64>,
    /// `metadata.creationTimestamp` (unix seconds): of two pods on one IP, the older keeps it.
    pub(crate) created_at: u64,
    /// The kind of its controller owner, for node-loss release (`super::node_loss`).
    pub(crate) controller: Option<super::controller::ControllerKind>,
    /// The value of its app label (`--app-label`), empty if none: the reconciler adopts a
    /// pod's IP only into its own app's list.
    pub(crate) app: Shared,
    /// The KubeVirt VM it is a launcher pod of (`crate::decisions::kubevirt::launcher_vm`):
    /// the VM's launcher pods share its IP.
    pub(crate) vm: Option<Shared>,
}

impl RunningPod {
    /// The pod, when it runs on IPs of its own: not host-network, not finished,
    /// with `status.podIPs` (or `status.podIP`) set. `None` otherwise.
    pub fn from_pod(pod: &Pod) -> Option<RunningPod> {
        RunningPod::from_pod_labelled(pod, "app")
    }

    /// [`RunningPod::from_pod`], reading the app from the label `app_label`.
    pub(crate) fn from_pod_labelled(pod: &Pod, app_label: &str) -> Option<RunningPod> {
        let spec = pod.spec.as_ref();
        if spec.and_then(|s| s.host_network) == Some(true) {
            return None;
        }
        let status = pod.status.as_ref()?;
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            return None;
        }
        let mut ips: Vec<IpAddr> = status
            .pod_ips
            .iter()
            .flatten()
            .filter_map(|p| p.ip.parse().ok())
            .collect();
        if let Some(ip) = status.pod_ip.as_deref().and_then(|ip| ip.parse().ok())
            && !ips.contains(&ip)
        {
            ips.push(ip);
        }
        if ips.is_empty() {
            return None;
        }
        let meta = &pod.metadata;
        Some(RunningPod {
            namespace: meta.namespace.as_deref().unwrap_or("").into(),
            name: meta.name.as_deref().unwrap_or("").into(),
            uid: meta.uid.as_deref()?.into(),
            node: spec
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or("")
                .into(),
            ips: ips.into_boxed_slice(),
            deleting_at: meta
                .deletion_timestamp
                .as_ref()
                .and_then(|t| u64::try_from(t.0.as_second()).ok()),
            deletion_grace: meta
                .deletion_grace_period_seconds
                .and_then(|g| u64::try_from(g).ok()),
            created_at: meta
                .creation_timestamp
                .as_ref()
                .and_then(|t| u64::try_from(t.0.as_second()).ok())
                .unwrap_or(0),
            controller: super::controller::ControllerKind::of(meta.owner_references.as_deref()),
            app: meta
                .labels
                .as_ref()
                .and_then(|l| l.get(app_label))
                .map(|a| a.as_str())
                .unwrap_or("")
                .into(),
            vm: crate::decisions::kubevirt::launcher_vm_of_object(meta).map(Shared::from),
        })
    }
}

/// A Kube-OVN `IP` object as the index keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OvnIp {
    pub(crate) name: Box<str>,
    pub(crate) namespace: Box<str>,
    pub(crate) pod: Box<str>,
    pub(crate) ips: Box<[IpAddr]>,
}

impl OvnIp {
    /// From an `ips.kubeovn.io` object: `spec.ipAddress` (comma-separated when dual-stack),
    /// `spec.v4IpAddress`, `spec.v6IpAddress`; `spec.podName`, `spec.namespace`.
    pub(crate) fn from_object(object: &DynamicObject) -> Option<OvnIp> {
        let spec = object.data.get("spec")?;
        let text = |field: &str| spec.get(field).and_then(Value::as_str).unwrap_or("");
        let mut ips: Vec<IpAddr> = Vec::new();
        for field in ["ipAddress", "v4IpAddress", "v6IpAddress"] {
            for part in text(field).split(',') {
                if let Ok(ip) = part.trim().parse::<IpAddr>()
                    && !ips.contains(&ip)
                {
                    ips.push(ip);
                }
            }
        }
        if ips.is_empty() {
            return None;
        }
        Some(OvnIp {
            name: object.metadata.name.as_deref()?.into(),
            namespace: text("namespace").into(),
            pod: text("podName").into(),
            ips: ips.into_boxed_slice(),
        })
    }
}

/// B-trees, not hash maps: a hash map doubles all at once under the write lock, and
/// admissions read `by_ip` (docs/performance.md, "B-trees instead of hash maps").
///
/// Invariant: `by_ip` holds an entry for every IP some entry carries; when two or more carry
/// one IP, `shared` lists all of them (and `by_ip` points at one), so that one carrier going
/// never hides the others.
struct Books<T> {
    by_key: BTreeMap<Box<str>, Arc<T>>,
    by_ip: BTreeMap<IpAddr, Arc<T>>,
    shared: BTreeMap<IpAddr, Vec<Arc<T>>>,
    /// Bumped whenever `shared` changes.
    shared_changes: u64,
}

impl<T> Default for Books<T> {
    fn default() -> Self {
        Books {
            by_key: BTreeMap::new(),
            by_ip: BTreeMap::new(),
            shared: BTreeMap::new(),
            shared_changes: 0,
        }
    }
}

trait HasIps {
    fn ips(&self) -> &[IpAddr];
}

impl HasIps for RunningPod {
    fn ips(&self) -> &[IpAddr] {
        &self.ips
    }
}

impl HasIps for OvnIp {
    fn ips(&self) -> &[IpAddr] {
        &self.ips
    }
}

impl<T: HasIps> Books<T> {
    fn remove(&mut self, key: &str) {
        let Some(old) = self.by_key.remove(key) else {
            return;
        };
        for ip in old.ips() {
            if let Some(carriers) = self.shared.get_mut(ip) {
                self.shared_changes += 1;
                carriers.retain(|v| !Arc::ptr_eq(v, &old));
                let next = carriers[0].clone();
                if carriers.len() == 1 {
                    self.shared.remove(ip);
                }
                self.by_ip.insert(*ip, next);
            } else if self.by_ip.get(ip).is_some_and(|v| Arc::ptr_eq(v, &old)) {
                self.by_ip.remove(ip);
            }
        }
    }

    fn upsert(&mut self, key: Box<str>, value: T) {
        self.remove(&key);
        let value = Arc::new(value);
        for ip in value.ips() {
            match self.by_ip.get(ip) {
                None => {
                    self.by_ip.insert(*ip, value.clone());
                }
                // The same IP twice in one entry's list.
                Some(held) if Arc::ptr_eq(held, &value) => {}
                Some(held) => {
                    let held = held.clone();
                    let carriers = self.shared.entry(*ip).or_insert_with(|| vec![held]);
                    if !carriers.iter().any(|v| Arc::ptr_eq(v, &value)) {
                        carriers.push(value.clone());
                        self.shared_changes += 1;
                    }
                }
            }
        }
        self.by_key.insert(key, value);
    }

    /// Every entry that carries `ip`.
    fn carriers(&self, ip: &IpAddr) -> impl Iterator<Item = &Arc<T>> {
        let shared = self.shared.get(ip);
        let single = self.by_ip.get(ip).filter(|_| shared.is_none());
        shared.into_iter().flatten().chain(single)
    }

    fn replace(&mut self, all: Vec<(Box<str>, T)>) {
        self.by_key.clear();
        self.by_ip.clear();
        self.shared.clear();
        for (key, value) in all {
            self.upsert(key, value);
        }
    }
}

/// A pod's namespace and name.
type PodName = (Shared, Box<str>);

/// The pod, Kube-OVN IP and Calico IPAM indexes, and whether each has synced.
#[derive(Default)]
pub struct ClusterIps {
    /// Every pod running on IPs of its own; with [`Self::uses_calico_ipam`], only the pods
    /// carrying our label.
    pods: RwLock<Books<RunningPod>>,
    ovn: RwLock<Books<OvnIp>>,
    /// Calico's `IPAMBlock`s by name, when they are the source of other pods' IPs.
    calico: RwLock<Books<calico::IpamBlock>>,
    pods_synced: AtomicBool,
    ovn_synced: AtomicBool,
    calico_synced: AtomicBool,
    workloads_synced: AtomicBool,
    /// Set once, before the pod watch starts: other pods' IPs come from Calico's IPAM.
    calico_ipam: AtomicBool,
    /// Listed IPs a block newly gave a pod ([`Self::take_listed_calico_changes`]).
    listed_calico: std::sync::Mutex<calico::ListedChanges>,
    /// Pods on lost nodes whose claims were released ([`super::node_loss`]), by UID, with
    /// their namespace and name (what Calico's IPAM names them by): their IPs no longer count
    /// as used.
    lost: RwLock<BTreeMap<Box<str>, PodName>>,
    /// Indexed pods the API server says are gone while the pod watch has not shown it yet
    /// ([`ForeignIps::gone`]), by UID: their IPs no longer count as used.
    gone: RwLock<std::collections::BTreeSet<Box<str>>>,
    /// The label naming a pod's app (set before the pod watch starts; `app` if never set).
    app_label: std::sync::OnceLock<String>,
    /// The apps' lists, to tell which pod events concern the reconciler ([`Self::set_lists`]).
    lists: std::sync::OnceLock<Arc<dyn super::app_lists::AppLists>>,
    /// Running pods on an IP of their own app's list, changed since the leader last looked.
    marked: std::sync::Mutex<Marked>,
    /// The indexed pods that are Terminating, kept beside the index so that node-loss release
    /// (every second on the leader) does not visit every pod.
    terminating: RwLock<BTreeMap<Box<str>, Arc<RunningPod>>>,
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

impl ClusterIps {
    /// Whether the pod, Kube-OVN IP and workload indexes have each had their first list.
    pub(crate) fn synced(&self) -> bool {
        self.pods_synced.load(Ordering::SeqCst)
            && self.ovn_synced.load(Ordering::SeqCst)
            && self.calico_synced.load(Ordering::SeqCst)
            && self.workloads_synced.load(Ordering::SeqCst)
    }

    /// Other pods' IPs come from every pod, whole: no Calico IPAM index to wait for.
    pub(crate) fn without_calico_ipam(&self) {
        self.calico_synced.store(true, Ordering::SeqCst);
    }

    /// Other pods' IPs come from Calico's IPAM (set before the watches start).
    pub(crate) fn with_calico_ipam(&self) {
        self.calico_ipam.store(true, Ordering::SeqCst);
    }

    /// Mark the indexes that are not run (no Kube-OVN) as synced.
    pub(crate) fn without_ovn(&self) {
        self.ovn_synced.store(true, Ordering::SeqCst);
    }

    /// Use `label` as the app label of the pods indexed from now on.
    pub(crate) fn set_app_label(&self, label: &str) {
        let _ = self.app_label.set(label.to_string());
    }

    fn app_label(&self) -> &str {
        self.app_label.get().map_or("app", String::as_str)
    }

    /// Whether the pod index has had its first list.
    pub(crate) fn pods_synced(&self) -> bool {
        self.pods_synced.load(Ordering::SeqCst)
    }

    /// The indexed pod with this UID (running on IPs of its own, not finished).
    pub(crate) fn pod(&self, uid: &str) -> Option<Arc<RunningPod>> {
        read(&self.pods).by_key.get(uid).cloned()
    }

    /// The indexed pod running on `ip`, if one is.
    pub(crate) fn pod_on(&self, ip: &IpAddr) -> Option<Arc<RunningPod>> {
        read(&self.pods).by_ip.get(ip).cloned()
    }

    /// Every indexed pod.
    pub(crate) fn pods(&self) -> Vec<Arc<RunningPod>> {
        read(&self.pods).by_key.values().cloned().collect()
    }

    pub fn pod_count(&self) -> usize {
        read(&self.pods).by_key.len()
    }

    pub(crate) fn ovn_count(&self) -> usize {
        read(&self.ovn).by_key.len()
    }

    /// Every indexed pod that is Terminating (deletionTimestamp set).
    pub(crate) fn terminating_pods(&self) -> Vec<Arc<RunningPod>> {
        read(&self.terminating).values().cloned().collect()
    }

    /// The IPs of this pod (on a lost node, its claims released) stop counting as used.
    pub(crate) fn mark_lost(&self, uid: &str) {
        let name = read(&self.pods)
            .by_key
            .get(uid)
            .map(|p| (p.namespace.clone(), p.name.clone()))
            .unwrap_or_default();
        write(&self.lost).insert(uid.into(), name);
    }

    /// Forget lost pods that are no longer indexed (gone at last).
    pub(crate) fn prune_lost(&self) {
        let pods = read(&self.pods);
        write(&self.lost).retain(|uid, _| pods.by_key.contains_key(uid));
    }

    /// Apply one pod event (a pod without IPs of its own is removed).
    #[cfg(test)]
    pub(crate) fn pod_event(&self, event: watcher::Event<SlimOrGone>) {
        let touched = touched(&event);
        pod_step(&self.pods, &self.pods_synced, event);
        if let Some((uid, pod)) = touched {
            self.note_terminating(&uid, pod.as_ref());
        }
    }

    /// Build the pod index from a list in one go (benchmarks, tests).
    pub fn set_pods(&self, pods: Vec<RunningPod>) {
        let all = pods.into_iter().map(|p| (p.uid.clone(), p)).collect();
        write(&self.pods).replace(all);
        self.rebuild_terminating();
        self.pods_synced.store(true, Ordering::SeqCst);
    }
}

/// A watch event's object, already slimmed: the key, and the value when it still counts.
pub(crate) struct SlimOrGone<T = RunningPod> {
    pub(crate) key: Box<str>,
    pub(crate) value: Option<T>,
}

fn pod_step<T: HasIps>(
    books: &RwLock<Books<T>>,
    synced: &AtomicBool,
    event: watcher::Event<SlimOrGone<T>>,
) {
    // Init…InitDone of a (re)list is gathered by [`Relist`].
    let _ = synced;
    match event {
        watcher::Event::Apply(SlimOrGone { key, value }) => match value {
            Some(value) => write(books).upsert(key, value),
            None => write(books).remove(&key),
        },
        watcher::Event::Delete(SlimOrGone { key, .. }) => write(books).remove(&key),
        watcher::Event::Init | watcher::Event::InitApply(_) | watcher::Event::InitDone => {}
    }
}

impl ForeignIps for ClusterIps {
    fn gone(&self, ip: &IpAddr, user: &ForeignUse) {
        let pods = read(&self.pods);
        let mut gone = write(&self.gone);
        gone.retain(|uid| pods.by_key.contains_key(uid));
        gone.extend(
            pods.carriers(ip)
                .filter(|p| *p.namespace == *user.namespace && *p.name == *user.name)
                .map(|p| p.uid.clone()),
        );
    }

    fn user(&self, ip: &IpAddr) -> Option<ForeignUse> {
        let ovn = read(&self.ovn).by_ip.get(ip).cloned();
        let pod = {
            let (pods, lost) = (read(&self.pods), read(&self.lost));
            let gone = read(&self.gone);
            pods.carriers(ip)
                .find(|p| !lost.contains_key(&p.uid) && !gone.contains(&p.uid))
                .cloned()
        };
        match (pod, ovn) {
            (Some(pod), ovn) => Some(ForeignUse {
                namespace: pod.namespace.to_string(),
                name: pod.name.to_string(),
                ovn_ip: ovn
                    .filter(|o| *o.pod == *pod.name && *o.namespace == *pod.namespace)
                    .map(|o| o.name.to_string()),
                vm: pod.vm.as_deref().map(str::to_string),
            }),
            (None, Some(ovn)) => Some(ForeignUse {
                namespace: ovn.namespace.to_string(),
                name: ovn.pod.to_string(),
                ovn_ip: Some(ovn.name.to_string()),
                vm: None,
            }),
            (None, None) => self.calico_user(ip).map(|(namespace, name)| ForeignUse {
                namespace,
                name,
                ovn_ip: None,
                vm: None,
            }),
        }
    }
}

/// Keeps books in step with a watch of slimmed objects: a (re)list replaces them whole.
struct Relist<T> {
    pending: Option<Vec<(Box<str>, T)>>,
}

impl<T: HasIps> Relist<T> {
    fn step(
        &mut self,
        books: &RwLock<Books<T>>,
        synced: &AtomicBool,
        event: watcher::Event<SlimOrGone<T>>,
    ) {
        match event {
            watcher::Event::Init => self.pending = Some(Vec::new()),
            watcher::Event::InitApply(SlimOrGone { key, value }) => {
                if let (Some(pending), Some(value)) = (self.pending.as_mut(), value) {
                    pending.push((key, value));
                }
            }
            watcher::Event::InitDone => {
                write(books).replace(self.pending.take().unwrap_or_default());
                synced.store(true, Ordering::SeqCst);
            }
            other => pod_step(books, synced, other),
        }
    }
}

fn slim_event<K, T>(
    event: watcher::Event<K>,
    slim: impl Fn(&K) -> Option<SlimOrGone<T>>,
) -> Option<watcher::Event<SlimOrGone<T>>> {
    Some(match event {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(slim(&o)?),
        watcher::Event::Apply(o) => watcher::Event::Apply(slim(&o)?),
        watcher::Event::Delete(o) => watcher::Event::Delete(slim(&o)?),
    })
}

/// The HTTP status of a failed list or watch start, if the API server answered.
fn status_code(error: &watcher::Error) -> Option<u16> {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => Some(status.code),
        _ => None,
    }
}

/// Kube-OVN `IP` objects.
pub(crate) fn kube_ovn_ips() -> ApiResource {
    super::cni::api_resource(ip_webhook_admission::annotations::CniObject::KubeOvnIps)
}

/// Kube-OVN `IP` objects into `index`. While the CRD is not served (404) the index counts as
/// synced and empty, and the watch keeps retrying (with backoff), so installing Kube-OVN later
/// is picked up.
pub(crate) async fn watch_ovn_ips(
    api: Api<DynamicObject>,
    caches: Arc<Caches>,
    metrics: Arc<Metrics>,
) {
    let index = &caches.cluster_ips;
    let mut relist = Relist { pending: None };
    let gauge = metrics.cache_objects.get_or_create_owned(&CacheKindLabels {
        kind: "kube-ovn-ip",
    });
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        let mut relisted = false;
        match item {
            Ok(event) => {
                caches.health.ok("kube-ovn ips");
                relisted = matches!(event, watcher::Event::InitDone);
                let Some(event) = slim_event(event, |object: &DynamicObject| {
                    Some(SlimOrGone {
                        key: object.metadata.name.as_deref()?.into(),
                        value: OvnIp::from_object(object),
                    })
                }) else {
                    continue;
                };
                relist.step(&index.ovn, &index.ovn_synced, event);
            }
            Err(error) if status_code(&error) == Some(404) => {
                caches.health.ok("kube-ovn ips");
                tracing::debug!("ips.kubeovn.io not served; retrying later");
                write(&index.ovn).replace(Vec::new());
                relisted = !index.ovn_synced.swap(true, Ordering::SeqCst);
            }
            Err(error) => {
                caches.health.failed("kube-ovn ips");
                tracing::warn!(%error, watch = "kube-ovn ips", "watch error; retrying")
            }
        }
        gauge.set(index.ovn_count() as i64);
        if relisted {
            caches.mark_changed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn only_pods_running_on_ips_of_their_own_are_kept() {
        let running = pod(serde_json::json!({
            "metadata": {"name": "legacy-0", "namespace": "default", "uid": "u1", "labels": {"a": "b"}},
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"phase": "Running", "podIP": "10.98.0.5", "podIPs": [{"ip": "10.98.0.5"}, {"ip": "fd00::5"}]},
        }));
        let slim = RunningPod::from_pod(&running).unwrap();
        assert_eq!(&*slim.name, "legacy-0");
        assert_eq!(&*slim.node, "n1");
        assert_eq!(&*slim.app, "");
        let mut labelled = running.clone();
        labelled.metadata.labels = Some([("team".to_string(), "legacy".to_string())].into());
        assert_eq!(
            &*RunningPod::from_pod_labelled(&labelled, "team")
                .unwrap()
                .app,
            "legacy"
        );
        assert_eq!(&*slim.ips, &[ip("10.98.0.5"), ip("fd00::5")]);
        let host = pod(serde_json::json!({
            "metadata": {"name": "h", "namespace": "default", "uid": "u2"},
            "spec": {"hostNetwork": true, "containers": []},
            "status": {"podIP": "192.168.0.1"},
        }));
        assert_eq!(RunningPod::from_pod(&host), None);
        let done = pod(serde_json::json!({
            "metadata": {"name": "d", "namespace": "default", "uid": "u3"},
            "status": {"phase": "Succeeded", "podIP": "10.98.0.6"},
        }));
        assert_eq!(RunningPod::from_pod(&done), None);
        let pending = pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u4"},
            "status": {"phase": "Pending"},
        }));
        assert_eq!(RunningPod::from_pod(&pending), None);
    }

    #[test]
    fn a_pod_and_its_kube_ovn_ip_object_are_named_together() {
        let index = ClusterIps::default();
        index.set_pods(vec![RunningPod {
            namespace: "default".into(),
            name: "static-7584848b74-fw9dm".into(),
            uid: "u1".into(),
            node: "n1".into(),
            ips: vec![ip("10.98.2.7")].into(),
            deleting_at: None,
            deletion_grace: None,
            created_at: 0,
            controller: None,
            app: "static".into(),
            vm: None,
        }]);
        let object: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubeovn.io/v1", "kind": "IP",
            "metadata": {"name": "static-7584848b74-fw9dm.default"},
            "spec": {"podName": "static-7584848b74-fw9dm", "namespace": "default", "ipAddress": "10.98.2.7,fd00::7", "v4IpAddress": "10.98.2.7"},
        }))
        .unwrap();
        let ovn = OvnIp::from_object(&object).unwrap();
        assert_eq!(&*ovn.ips, &[ip("10.98.2.7"), ip("fd00::7")]);
        write(&index.ovn).upsert(ovn.name.clone(), ovn);
        assert_eq!(
            index.user(&ip("10.98.2.7")).unwrap().describe(),
            "pod default/static-7584848b74-fw9dm (Kube-OVN IP static-7584848b74-fw9dm.default)"
        );
        assert_eq!(
            index.user(&ip("fd00::7")).unwrap().describe(),
            "pod default/static-7584848b74-fw9dm (Kube-OVN IP static-7584848b74-fw9dm.default)"
        );
        assert_eq!(index.user(&ip("10.98.2.8")), None);
        // Pod gone, removed by UID: its IP is free again in the pod index.
        index.pod_event(watcher::Event::Delete(SlimOrGone {
            key: "u1".into(),
            value: None,
        }));
        assert_eq!(index.pod_count(), 0);
        assert_eq!(
            index.user(&ip("10.98.2.7")).unwrap().ovn_ip.as_deref(),
            Some("static-7584848b74-fw9dm.default")
        );
    }

    fn slim(uid: &str, app: &str, addr: &str, deleting: bool) -> RunningPod {
        RunningPod {
            namespace: "ns".into(),
            name: uid.into(),
            uid: uid.into(),
            node: "n1".into(),
            ips: vec![ip(addr)].into(),
            deleting_at: deleting.then_some(5),
            deletion_grace: None,
            created_at: 0,
            controller: None,
            app: app.into(),
            vm: None,
        }
    }

    struct OneList;

    impl super::super::app_lists::AppLists for OneList {
        fn sole_app_listing(&self, at: IpAddr) -> Option<String> {
            (at == ip("10.0.0.7")).then(|| "ns/web".to_string())
        }
    }

    #[test]
    fn only_pods_on_their_own_apps_list_concern_the_reconciler() {
        let index = ClusterIps::default();
        // without lists, any pod with an app might
        assert!(index.concerns_lists(&slim("a", "web", "10.9.0.1", false)));
        assert!(!index.concerns_lists(&slim("a", "", "10.0.0.7", false)));
        index.set_lists(Arc::new(OneList));
        assert!(index.concerns_lists(&slim("a", "web", "10.0.0.7", false)));
        assert!(!index.concerns_lists(&slim("b", "other", "10.0.0.7", false)));
        assert!(!index.concerns_lists(&slim("c", "web", "10.9.0.1", false)));
    }

    #[test]
    fn marks_are_taken_once_and_too_many_mean_look_at_everything() {
        let index = ClusterIps::default();
        assert_eq!(index.take_marked(), Some(vec![]));
        index.mark("a");
        index.mark("a");
        assert_eq!(index.take_marked(), Some(vec!["a".into()]));
        assert_eq!(index.take_marked(), Some(vec![]));
        for n in 0..=changes::MARK_CAP {
            index.mark(&n.to_string());
        }
        assert_eq!(index.take_marked(), None, "past the cap the count is lost");
        index.mark("b");
        index.mark_all();
        assert_eq!(
            index.take_marked(),
            None,
            "a relist: every pod needs a look"
        );
        assert_eq!(index.take_marked(), Some(vec![]));
    }

    #[test]
    fn terminating_pods_are_kept_beside_the_index() {
        let index = ClusterIps::default();
        index.set_pods(vec![
            slim("a", "web", "10.0.0.1", true),
            slim("b", "web", "10.0.0.2", false),
        ]);
        let uids = |index: &ClusterIps| -> Vec<String> {
            index
                .terminating_pods()
                .iter()
                .map(|p| p.uid.to_string())
                .collect()
        };
        assert_eq!(uids(&index), ["a"]);
        let apply = |pod: RunningPod| {
            watcher::Event::Apply(SlimOrGone {
                key: pod.uid.clone(),
                value: Some(pod),
            })
        };
        index.pod_event(apply(slim("b", "web", "10.0.0.2", true)));
        assert_eq!(uids(&index), ["a", "b"]);
        index.pod_event(watcher::Event::Delete(SlimOrGone {
            key: "a".into(),
            value: None,
        }));
        // finished: no longer running on IPs of its own
        index.pod_event(watcher::Event::Apply(SlimOrGone {
            key: "b".into(),
            value: None,
        }));
        assert!(uids(&index).is_empty());
        assert_eq!(index.pod_count(), 0);
    }

    #[test]
    fn a_relist_replaces_the_books_whole() {
        let index = ClusterIps::default();
        let mut relist = Relist { pending: None };
        let slim = |uid: &str, addr: &str| SlimOrGone {
            key: uid.into(),
            value: Some(RunningPod {
                namespace: "ns".into(),
                name: uid.into(),
                uid: uid.into(),
                node: "".into(),
                ips: vec![ip(addr)].into(),
                deleting_at: None,
                deletion_grace: None,
                created_at: 0,
                controller: None,
                app: "".into(),
                vm: None,
            }),
        };
        relist.step(&index.pods, &index.pods_synced, watcher::Event::Init);
        relist.step(
            &index.pods,
            &index.pods_synced,
            watcher::Event::InitApply(slim("a", "10.0.0.1")),
        );
        assert!(!index.pods_synced.load(Ordering::SeqCst));
        relist.step(&index.pods, &index.pods_synced, watcher::Event::InitDone);
        assert!(index.pods_synced.load(Ordering::SeqCst));
        assert!(index.user(&ip("10.0.0.1")).is_some());
        relist.step(&index.pods, &index.pods_synced, watcher::Event::Init);
        relist.step(
            &index.pods,
            &index.pods_synced,
            watcher::Event::InitApply(slim("b", "10.0.0.2")),
        );
        relist.step(&index.pods, &index.pods_synced, watcher::Event::InitDone);
        assert!(index.user(&ip("10.0.0.1")).is_none());
        assert_eq!(index.user(&ip("10.0.0.2")).unwrap().name, "b");
        // A pod that moved to another IP leaves nothing behind on the old one.
        relist.step(
            &index.pods,
            &index.pods_synced,
            watcher::Event::Apply(slim("b", "10.0.0.3")),
        );
        assert!(index.user(&ip("10.0.0.2")).is_none());
        assert_eq!(index.pod_count(), 1);
    }

    #[test]
    fn pods_sharing_an_ip_are_all_kept_and_one_going_leaves_the_others() {
        let index = ClusterIps::default();
        let at = |uid: &str, addr: &str, created_at: u64, deleting_at: Option<u64>| RunningPod {
            namespace: "default".into(),
            name: uid.into(),
            uid: uid.into(),
            node: "".into(),
            ips: vec![ip(addr), ip(addr)].into(),
            deleting_at,
            deletion_grace: None,
            created_at,
            controller: None,
            app: "".into(),
            vm: None,
        };
        let apply = |pod: RunningPod| {
            index.pod_event(watcher::Event::Apply(SlimOrGone {
                key: pod.uid.clone(),
                value: Some(pod),
            }))
        };
        let delete = |uid: &str| {
            index.pod_event(watcher::Event::Delete(SlimOrGone {
                key: uid.into(),
                value: None,
            }))
        };
        apply(at("old", "10.0.0.1", 10, None));
        // The same IP twice in one pod's list is not a second pod.
        assert!(index.shared_pod_ips().is_empty());
        apply(at("new", "10.0.0.1", 20, None));
        apply(at("third", "10.0.0.1", 15, None));
        let shared = index.shared_pod_ips();
        assert_eq!(shared.len(), 1);
        let order: Vec<&str> = shared[0].1.iter().map(|p| &*p.uid).collect();
        assert_eq!(order, ["old", "third", "new"], "oldest first");

        delete("old");
        delete("third");
        assert!(index.shared_pod_ips().is_empty());
        // The one left still counts as using the IP.
        assert_eq!(index.user(&ip("10.0.0.1")).unwrap().name, "new");
        apply(at("old", "10.0.0.1", 10, Some(30)));
        assert!(
            index.shared_pod_ips().is_empty(),
            "a Terminating pod is not a duplicate"
        );
        delete("new");
        assert_eq!(index.user(&ip("10.0.0.1")).unwrap().name, "old");
        delete("old");
        assert!(index.user(&ip("10.0.0.1")).is_none());
    }
}
