//! In-cluster mode: watches that keep the allocator, the pool catalog and a compact pod cache in
//! step with the API server, readiness once they have synced, and the leader-elected
//! reconciler that keeps the `IPClaim` books true.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::events::{Recorder, Reporter};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admission::annotations::{Cni, CniObject};
use crate::ledger::network::Interface;
use crate::metrics::{LeaseLabels, Metrics};
use crate::webhook::Webhook;

pub mod app_lists;
mod caches;
pub mod change_log;
pub mod claim_list;
pub mod cni;
pub mod controller;
pub mod events;
pub mod executor;
pub mod index;
pub mod kube_ovn_reservation;
pub mod leader_view;
pub mod lease;
pub mod lifecycle;
pub mod listed_pod;
pub mod node_loss;
pub mod pod_info;
pub mod pods;
pub mod reconcile;
mod reconciler;
pub mod sightings;
pub mod sweep;
pub mod virtual_machines;
mod watches;

pub use caches::Caches;
pub use reconciler::{Reconciler, list_pages};
pub use watches::{pod_info, tolerant_catalog, watch_claims, watch_pools};

pub use reconcile::{PodInfo, PodMap, Rules};

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{what} {name}: {source}")]
    Api {
        what: &'static str,
        name: String,
        source: kube::Error,
    },
    #[error("listing the pods of namespace {namespace:?} failed: {source}")]
    ListPods {
        namespace: String,
        source: kube::Error,
    },
    /// Whether a virtual machine still holds its IP could not be read.
    #[error("{0}")]
    VmLookup(String),
}

impl ClusterError {
    pub fn api(what: &'static str, name: &str, source: kube::Error) -> ClusterError {
        ClusterError::Api {
            what,
            name: name.to_string(),
            source,
        }
    }
}

/// In-cluster settings from the command line.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub rules: Rules,
    pub resync_period: Duration,
    pub lease: lease::LeaseSettings,
    pub app_label: String,
    /// Which CNI's objects to watch (Calico IPPools and IPReservations, or Kube-OVN Subnets).
    pub cni: Cni,
    /// With Calico: keep the IPReservation [`cni::RESERVATION_NAME`] (leader only).
    pub calico_reservation: bool,
    /// Release the claims of pods stuck Terminating on a node NotReady this long
    /// ([`node_loss`]); zero: off.
    pub node_lost_grace: Duration,
    /// With Kube-OVN: keep Kube-OVN IPPools over our IPs ([`kube_ovn_reservation`], leader only).
    pub kube_ovn_reservation: bool,
    /// Where the IPs of pods not ours come from ([`index::watch_pod_ips`]).
    pub pod_ips: PodIpSource,
}

/// Where a replica learns which IPs the cluster's pods run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PodIpSource {
    /// With Calico: its `IPAMBlock`s when the API server serves them, and only the pods
    /// carrying our label watched whole; otherwise every pod, whole.
    #[default]
    Auto,
    /// Every pod, whole (`status.podIPs`): for a Calico that does not use its own IPAM.
    Pods,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Every task of in-cluster mode (or of the leak sweeper); dropped or
/// [`ClusterHandle::stop`]ped, they end.
pub struct ClusterHandle {
    pub caches: Arc<Caches>,
    pub leading: watch::Receiver<bool>,
    leases: Api<Lease>,
    lease: lease::LeaseSettings,
    tasks: Vec<JoinHandle<()>>,
}

impl ClusterHandle {
    /// Stop every task at once (the Lease is left to expire).
    pub fn stop(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }

    /// Stop, and hand the Lease back if we lead so another replica takes over at once.
    pub async fn shutdown(&self) {
        self.stop();
        if !*self.leading.borrow() {
            return;
        }
        let release = lease::release(&self.leases, &self.lease);
        match tokio::time::timeout(Duration::from_secs(2), release).await {
            Ok(Ok(_)) => tracing::info!("lease released"),
            Ok(Err(error)) => tracing::warn!(%error, "could not release the lease"),
            Err(_) => tracing::warn!("releasing the lease timed out"),
        }
    }
}

impl Drop for ClusterHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How often the leader compares the Calico IPReservation with what it should hold.
const RESERVATION_CHECK: Duration = Duration::from_secs(1);

/// Start the watches, readiness, the lease and the reconciler.
pub fn start(
    client: Client,
    webhook: Arc<Webhook>,
    ready: Arc<AtomicBool>,
    options: ClusterOptions,
) -> ClusterHandle {
    let caches = Arc::new(Caches {
        health: webhook.metrics.watch_health.clone(),
        ..Caches::default()
    });
    caches.cluster_ips.set_app_label(&options.app_label);
    webhook.claim_guard.watch_pods(caches.clone());
    let (leading_tx, leading) = watch::channel(false);
    let mut tasks = watch_tasks(&client, &webhook, &caches, &options);
    tasks.extend(cni_tasks(&client, &webhook, &caches, &leading, &options));
    tasks.extend(edge_tasks(&client, &webhook, &caches, &leading, &options));
    let leases = Api::<Lease>::namespaced(client.clone(), &options.lease.namespace);
    let elector = lease::Elector::new(leases.clone(), options.lease.clone());
    tasks.push(tokio::spawn(lease::run(elector, leading_tx)));
    tasks.push(tokio::spawn(export_leadership(
        leading.clone(),
        webhook.metrics.clone(),
        options.lease.name.clone(),
    )));
    let lease = options.lease.clone();
    tasks.extend(sweepers(&client, &webhook, &options, &leading, false));
    let vms = Arc::new(
        virtual_machines::VmDirectory::new(
            client.clone(),
            webhook.settings.kubevirt.release_on_stop,
        )
        .remembering(options.resync_period),
    );
    tasks.extend(vm_watches(
        &client, &webhook, &caches, &leading, &options, &vms,
    ));
    let reconciler = reconciler(client, &webhook, &caches, options, vms);
    tasks.push(tokio::spawn(reconciler.run(leading.clone(), ready)));
    ClusterHandle {
        caches,
        leading,
        leases,
        lease,
        tasks,
    }
}

/// The watches every replica keeps: pods, claims and pools into `caches`, and the pods'
/// actual IPs and the workloads' lists into the cluster's IP index.
fn watch_tasks(
    client: &Client,
    webhook: &Arc<Webhook>,
    caches: &Arc<Caches>,
    options: &ClusterOptions,
) -> Vec<JoinHandle<()>> {
    let mut tasks = vec![
        tokio::spawn(watch_claims(
            Api::all(client.clone()),
            caches.clone(),
            webhook.allocator.clone(),
        )),
        tokio::spawn(watch_pools(
            Api::all(client.clone()),
            caches.clone(),
            webhook.clone(),
        )),
    ];
    tasks.extend(webhook.secondary.iter().map(|(network, allocator)| {
        tokio::spawn(watches::watch_network_claims(
            Api::all(client.clone()),
            network.clone(),
            allocator.clone(),
        ))
    }));
    webhook.allocator.set_foreign(caches.cluster_ips.clone());
    caches.cluster_ips.set_lists(webhook.clone());
    tasks.push(tokio::spawn(index::watch_pod_ips(
        client.clone(),
        caches.clone(),
        webhook.metrics.clone(),
        options.app_label.clone(),
        options.pod_ips,
        options.cni,
    )));
    tasks.extend(index::spawn_workload_watches(
        client,
        webhook.clone(),
        caches.clone(),
    ));
    tasks
}

/// The watches of the objects `options.cni`'s descriptor names (`CniDescriptor::watches`):
/// Kube-OVN IPs and Subnets, or Calico IPPools and IPReservations (and, leader only, keeping
/// our IPReservation).
fn cni_tasks(
    client: &Client,
    webhook: &Arc<Webhook>,
    caches: &Arc<Caches>,
    leading: &watch::Receiver<bool>,
    options: &ClusterOptions,
) -> Vec<JoinHandle<()>> {
    let watches = options.cni.descriptor().watches;
    if !watches.contains(&CniObject::KubeOvnIps) {
        caches.cluster_ips.without_ovn();
    }
    let mut tasks = Vec::new();
    for object in watches {
        let api = Api::all_with(client.clone(), &cni::api_resource(*object));
        match object {
            CniObject::KubeOvnIps => tasks.push(tokio::spawn(index::watch_ovn_ips(
                api,
                caches.clone(),
                webhook.metrics.clone(),
            ))),
            CniObject::KubeOvnSubnets => {
                tasks.push(tokio::spawn(cni::watch_subnets(api, webhook.clone())))
            }
            CniObject::CalicoIpPools => {
                tasks.push(tokio::spawn(cni::watch_calico_pools(api, webhook.clone())))
            }
            // read by the pod-IP watch, which decides whether to (`index::watch_pod_ips`)
            CniObject::CalicoIpamBlocks => {}
            CniObject::CalicoIpReservations => {
                let state = Arc::new(cni::ReservationState::default());
                tasks.push(tokio::spawn(cni::watch_calico_reservations(
                    api.clone(),
                    webhook.clone(),
                    state.clone(),
                )));
                if options.calico_reservation {
                    tasks.push(tokio::spawn(cni::keep_reservation(
                        api,
                        webhook.clone(),
                        caches.clone(),
                        state,
                        leading.clone(),
                        RESERVATION_CHECK,
                    )));
                }
            }
        }
    }
    tasks
}

/// The leader's reconciler over the watches' caches, its executor writing through `client`.
fn reconciler(
    client: Client,
    webhook: &Arc<Webhook>,
    caches: &Arc<Caches>,
    options: ClusterOptions,
    vms: Arc<virtual_machines::VmDirectory>,
) -> Reconciler {
    Reconciler {
        client: client.clone(),
        caches: caches.clone(),
        allocator: webhook.allocator.clone(),
        executor: executor::Executor {
            claims: Api::all(client.clone()),
            pools: Api::all(client.clone()),
            pods: Api::all(client.clone()),
            vms,
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: "ip-webhook".into(),
                    instance: Some(options.lease.identity.clone()),
                },
            ),
            metrics: webhook.metrics.clone(),
            reported_duplicates: Default::default(),
        },
        options,
        lists: Some(webhook.clone()),
        view: Default::default(),
        started: tokio::time::Instant::now(),
        listed_seen: Default::default(),
    }
}

/// Node-loss release and the Kube-OVN reservation keeper, as `options` ask.
fn edge_tasks(
    client: &Client,
    webhook: &Arc<Webhook>,
    caches: &Arc<Caches>,
    leading: &watch::Receiver<bool>,
    options: &ClusterOptions,
) -> Vec<JoinHandle<()>> {
    let mut tasks = node_loss_tasks(client, webhook, caches, leading, options);
    if options.cni == Cni::KubeOvn && options.kube_ovn_reservation {
        let state = Arc::new(kube_ovn_reservation::OvnReservationState::default());
        let pools = Api::all_with(client.clone(), &kube_ovn_reservation::kube_ovn_ippools());
        tasks.push(tokio::spawn(kube_ovn_reservation::watch_subnets(
            Api::all_with(client.clone(), &cni::kube_ovn_subnets()),
            state.clone(),
        )));
        tasks.push(tokio::spawn(kube_ovn_reservation::watch_pools(
            pools.clone(),
            state.clone(),
        )));
        tasks.push(tokio::spawn(kube_ovn_reservation::keep_pools(
            pools,
            webhook.clone(),
            caches.clone(),
            state,
            leading.clone(),
            RESERVATION_CHECK,
        )));
    }
    tasks
}

/// Node-loss release ([`node_loss`]) of every interface's claims, when `options` ask for it:
/// the leader's watch of Nodes and its releaser, over the pods `caches` index.
fn node_loss_tasks(
    client: &Client,
    webhook: &Arc<Webhook>,
    caches: &Arc<Caches>,
    leading: &watch::Receiver<bool>,
    options: &ClusterOptions,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    if !options.node_lost_grace.is_zero() {
        let nodes = Arc::new(node_loss::Nodes::default());
        // Only the leader releases on node loss, so only the leader watches Nodes.
        let (api, watched): (Api<k8s_openapi::api::core::v1::Node>, _) =
            (Api::all(client.clone()), nodes.clone());
        tasks.push(tokio::spawn(while_leading(
            leading.clone(),
            move || node_loss::watch_nodes(api.clone(), watched.clone()),
            {
                let nodes = nodes.clone();
                move || nodes.forget()
            },
        )));
        let releaser = node_loss::NodeLoss {
            allocators: webhook.interfaces().map(|(_, a)| a.clone()).collect(),
            cluster_ips: caches.cluster_ips.clone(),
            nodes,
            pods: client.clone(),
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: "ip-webhook".into(),
                    instance: Some(options.lease.identity.clone()),
                },
            ),
            metrics: webhook.metrics.clone(),
            grace: options.node_lost_grace.as_secs().max(1),
        };
        tasks.push(tokio::spawn(
            releaser.run(leading.clone(), node_loss::PERIOD),
        ));
    }
    tasks
}

/// Run `task` while this replica leads: started when it becomes the leader, dropped (and
/// `stopped` called) when it stops being one.
async fn while_leading<F, Fut>(mut leading: watch::Receiver<bool>, task: F, stopped: impl Fn())
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    loop {
        while !*leading.borrow_and_update() {
            if leading.changed().await.is_err() {
                return;
            }
        }
        let mut follower = leading.clone();
        tokio::select! {
            _ = task() => {}
            _ = async {
                while *follower.borrow_and_update() {
                    if follower.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            } => {}
        }
        stopped();
    }
}

/// With a ledger other than IPClaims (etcd, embedded) and an API server: the Lease election,
/// the leak sweepers ([`sweep`]) of every interface's books and, when asked, node-loss
/// release over a watch of the pods' IPs; no other watch.
pub fn start_sweeper(
    client: Client,
    webhook: Arc<Webhook>,
    options: ClusterOptions,
) -> ClusterHandle {
    // its pod watch is node-loss release's alone: no admission reads it, so readiness does not
    // wait for it (its health is its own)
    let caches = Arc::new(Caches::default());
    let (leading_tx, leading) = watch::channel(false);
    let leases = Api::<Lease>::namespaced(client.clone(), &options.lease.namespace);
    let elector = lease::Elector::new(leases.clone(), options.lease.clone());
    let mut tasks = vec![
        tokio::spawn(lease::run(elector, leading_tx)),
        tokio::spawn(export_leadership(
            leading.clone(),
            webhook.metrics.clone(),
            options.lease.name.clone(),
        )),
    ];
    tasks.extend(sweepers(&client, &webhook, &options, &leading, true));
    if !options.node_lost_grace.is_zero() {
        caches.cluster_ips.set_app_label(&options.app_label);
        tasks.push(tokio::spawn(index::watch_pod_ips(
            client.clone(),
            caches.clone(),
            webhook.metrics.clone(),
            options.app_label.clone(),
            options.pod_ips,
            options.cni,
        )));
        tasks.extend(node_loss_tasks(
            &client, &webhook, &caches, &leading, &options,
        ));
    }
    ClusterHandle {
        caches,
        leading,
        leases,
        lease: options.lease,
        tasks,
    }
}

/// With KubeVirt launcher pods taken for VMs: the leader follows deletions of VirtualMachines
/// and of VMIs (a stopped VM's, or one without a VM), so a VM's claim is dropped at its
/// deletion, not at the next resync.
fn vm_watches(
    client: &Client,
    webhook: &Webhook,
    caches: &Arc<Caches>,
    leading: &watch::Receiver<bool>,
    options: &ClusterOptions,
    vms: &Arc<virtual_machines::VmDirectory>,
) -> Vec<JoinHandle<()>> {
    let kubevirt = &webhook.settings.kubevirt;
    if kubevirt.controllers.is_empty() {
        return Vec::new();
    }
    // a VMI without a VM is a VM of its own: its deletion frees as a VM's does
    let resources = [
        virtual_machines::virtual_machines(),
        virtual_machines::virtual_machine_instances(),
    ];
    resources
        .into_iter()
        .map(|resource| {
            let (client, caches, vms) = (client.clone(), caches.clone(), vms.clone());
            let recheck = options.resync_period;
            tokio::spawn(while_leading(
                leading.clone(),
                move || {
                    virtual_machines::watch_deletions(
                        client.clone(),
                        resource.clone(),
                        vms.clone(),
                        caches.clone(),
                        recheck,
                    )
                },
                || {},
            ))
        })
        .collect()
}

/// The leak sweepers the Lease holder runs ([`sweep`]): one per secondary network, whatever
/// the ledger, and one for the primary interface's books unless the reconciler keeps them
/// (`primary`: they are not IPClaims).
fn sweepers(
    client: &Client,
    webhook: &Arc<Webhook>,
    options: &ClusterOptions,
    leading: &watch::Receiver<bool>,
    primary: bool,
) -> Vec<JoinHandle<()>> {
    webhook
        .interfaces()
        .filter(|(interface, _)| primary || *interface != Interface::Primary)
        .map(|(interface, allocator)| {
            let pods =
                pods::PodDirectory::of_interface(client.clone(), &webhook.settings, interface);
            let sweeper = sweep::Sweeper::new(
                allocator.clone(),
                pods,
                options.rules,
                options.resync_period,
                webhook.metrics.clone(),
            );
            tokio::spawn(sweeper.run(leading.clone()))
        })
        .collect()
}

/// Keep the `ip_webhook_leader{lease}` gauge equal to this replica's leadership.
async fn export_leadership(
    mut leading: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    lease: String,
) {
    let gauge = metrics.leader.get_or_create_owned(&LeaseLabels { lease });
    loop {
        gauge.set(i64::from(*leading.borrow_and_update()));
        if leading.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::FixedIPPool;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    fn meta(value: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn pod_info_keeps_only_what_the_reconciler_needs() {
        let info = pod_info(
            &meta(serde_json::json!({
                "name": "web-0", "namespace": "prod", "uid": "u-1",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"app": "web", "ip-webhook.io/allocated-ip": "fd00--a"},
                "annotations": {"cni.projectcalico.org/ipAddrs": "[\"10.0.0.7\",\"fd00::a\"]", "big": "x",
                                "ip-webhook.io/claim": "0123456789abcdef0123456789abcdef"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "s", "controller": true}],
                "managedFields": [{"manager": "kubectl", "operation": "Update"}],
            })),
            "app",
        )
        .unwrap();
        assert_eq!(
            info,
            PodInfo {
                namespace: "prod".into(),
                name: "web-0".into(),
                uid: "u-1".into(),
                ips: vec!["10.0.0.7".parse().unwrap(), "fd00::a".parse().unwrap()],
                created_at: 1_767_225_600,
                terminating: false,
                stateful: true,
                app: "web".into(),
                token: Some("0123456789abcdef0123456789abcdef".into()),
                vm: None,
            }
        );
    }

    #[test]
    fn pods_without_ips_are_not_cached() {
        let plain = meta(
            serde_json::json!({"name": "x", "namespace": "d", "uid": "u", "labels": {"app": "x"}}),
        );
        assert_eq!(pod_info(&plain, "app"), None);
        let replicaset = meta(serde_json::json!({
            "name": "x", "namespace": "d", "uid": "u",
            "labels": {"ip-webhook.io/allocated-ip": "10.0.0.1"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "uid": "r", "controller": true}],
        }));
        assert!(!pod_info(&replicaset, "app").unwrap().stateful);
    }

    /// The leader's incremental pass learns from this log which pods changed: each pod the
    /// cache changed, once; a relist, all of them.
    #[test]
    fn the_pod_watch_logs_each_pod_it_changes_and_a_relist_as_everything() {
        use kube::runtime::watcher::Event;
        let pod = |uid: &str, labels: serde_json::Value| -> k8s_openapi::api::core::v1::Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": uid, "namespace": "d", "uid": uid, "labels": labels},
            }))
            .unwrap()
        };
        let ours =
            |uid: &str, ip: &str| pod(uid, serde_json::json!({"ip-webhook.io/allocated-ip": ip}));
        let caches = Caches::default();
        let mut mirror = watches::Mirror::new();
        let mut event = |event: Event<k8s_openapi::api::core::v1::Pod>| {
            watches::pod_cache_event(&caches, &mut mirror, &event, "app")
        };
        event(Event::Init);
        event(Event::InitApply(ours("a", "10.0.0.1")));
        event(Event::InitDone);
        assert_eq!(caches.take_pod_changes().1, None, "a relist: every pod");
        assert_eq!(caches.take_pod_changes().1, Some(vec![]));
        assert!(!event(Event::Apply(ours("a", "10.0.0.1"))));
        event(Event::Apply(pod("plain", serde_json::json!({"app": "x"}))));
        assert_eq!(
            caches.take_pod_changes().1,
            Some(vec![]),
            "no change to the cache"
        );
        event(Event::Apply(ours("b", "10.0.0.2")));
        event(Event::Apply(ours("a", "10.0.0.3")));
        event(Event::Delete(ours("b", "10.0.0.2")));
        let (pods, changed) = caches.take_pod_changes();
        assert_eq!(changed, Some(vec!["a".into(), "b".into()]));
        assert_eq!(pods.keys().collect::<Vec<_>>(), ["a"]);
    }

    #[test]
    fn only_a_change_to_the_pod_cache_counts_as_one() {
        use watches::{Change, apply_pod_change};
        let info = |ip: &str| PodInfo {
            namespace: "prod".into(),
            name: "web-0".into(),
            uid: "u-1".into(),
            ips: vec![ip.parse().unwrap()],
            created_at: 1,
            terminating: false,
            stateful: false,
            app: "web".into(),
            token: None,
            vm: None,
        };
        let mut pods = Arc::new(PodMap::default());
        // a pod that carries none of our IPs: its events change nothing here
        assert!(!apply_pod_change(&mut pods, Change::Delete("other".into())));
        assert!(!apply_pod_change(&mut pods, Change::Nothing));
        assert!(apply_pod_change(
            &mut pods,
            Change::Upsert("u-1".into(), info("10.0.0.7"))
        ));
        // the same pod again (a status update, say): no change
        assert!(!apply_pod_change(
            &mut pods,
            Change::Upsert("u-1".into(), info("10.0.0.7"))
        ));
        assert!(apply_pod_change(
            &mut pods,
            Change::Upsert("u-1".into(), info("10.0.0.8"))
        ));
        assert_eq!(
            pods["u-1"].ips,
            vec!["10.0.0.8".parse::<std::net::IpAddr>().unwrap()]
        );
        // a pass holds the cache as it was: a change no-op keeps sharing it, a real one copies
        let pass = pods.clone();
        assert!(!apply_pod_change(
            &mut pods,
            Change::Upsert("u-1".into(), info("10.0.0.8"))
        ));
        assert!(Arc::ptr_eq(&pass, &pods), "nothing changed: nothing copied");
        assert!(apply_pod_change(&mut pods, Change::Delete("u-1".into())));
        assert!(pods.is_empty());
        assert_eq!(pass.len(), 1, "the pass's copy is the one it read");
        assert!(apply_pod_change(
            &mut pods,
            Change::Replace(PodMap::default())
        ));
    }

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

    #[test]
    fn a_bad_or_overlapping_pool_is_left_out_not_the_whole_catalog() {
        let pool = |name: &str, cidr: &str, created: &str| -> FixedIPPool {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "ip-webhook.io/v1alpha1", "kind": "FixedIPPool",
                "metadata": {"name": name, "creationTimestamp": created},
                "spec": {"cidr": cidr},
            }))
            .unwrap()
        };
        let pools: BTreeMap<String, FixedIPPool> = [
            pool("a-newer", "10.0.0.0/25", "2026-01-02T00:00:00Z"),
            pool("b-older", "10.0.0.0/24", "2026-01-01T00:00:00Z"),
            pool("c-broken", "10.1.0.7/24", "2026-01-01T00:00:00Z"),
            pool("d-fine", "10.2.0.0/28", "2026-01-03T00:00:00Z"),
        ]
        .into_iter()
        .map(|p| (p.metadata.name.clone().unwrap(), p))
        .collect();
        let catalog = tolerant_catalog(&pools);
        let mut names = catalog.names();
        names.sort();
        assert_eq!(names, ["b-older", "d-fine"]);
    }
}
