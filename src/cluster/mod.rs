//! In-cluster mode: watches that keep the allocator, the pool catalog and a compact pod cache in
//! step with the API server, readiness once they have synced, and the leader-elected
//! reconciler that keeps the `IPClaim` books true.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::decisions::Webhook;
use ip_webhook_admission::annotations::{Cni, CniObject};
use ip_webhook_ledger::network::Interface;

pub(crate) mod app_lists;
mod caches;
pub(crate) mod change_log;
pub(crate) mod claim_list;
pub(crate) mod claiming_pod;
pub(crate) mod cni;
pub(crate) mod controller;
pub(crate) mod events;
pub(crate) mod executor;
pub mod index;
#[cfg(test)]
mod kube_mock;
pub(crate) mod kube_ovn_reservation;
pub(crate) mod leader_view;
pub(crate) mod lease;
pub(crate) mod lifecycle;
pub(crate) mod listed_pod;
pub(crate) mod node_loss;
pub(crate) mod parts;
pub(crate) mod pods;
pub(crate) mod reconcile;
mod reconciler;
pub(crate) mod sightings;
pub(crate) mod sweep;
pub(crate) mod virtual_machines;
mod watches;

pub(crate) use caches::Caches;
pub(crate) use parts::Parts;
pub(crate) use reconciler::{Reconciler, list_pages};
pub(crate) use watches::{claiming_pod, tolerant_catalog, watch_claims, watch_pools};

pub(crate) use reconcile::{ClaimingPod, PodMap, Rules};

#[derive(Debug, thiserror::Error)]
pub(crate) enum ClusterError {
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
    pub(crate) fn api(what: &'static str, name: &str, source: kube::Error) -> ClusterError {
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
    pub(crate) rules: Rules,
    pub(crate) resync_period: Duration,
    pub(crate) lease: lease::LeaseSettings,
    pub(crate) app_label: String,
    /// Which CNI's objects to watch (Calico IPPools and IPReservations, or Kube-OVN Subnets).
    pub(crate) cni: Cni,
    /// With Calico: keep the IPReservation [`cni::RESERVATION_NAME`] (leader only).
    pub(crate) calico_reservation: bool,
    /// Release the claims of pods stuck Terminating on a node NotReady this long
    /// (`node_loss`); zero: off.
    pub(crate) node_lost_grace: Duration,
    /// With Kube-OVN: keep Kube-OVN IPPools over our IPs ([`kube_ovn_reservation`], leader only).
    pub(crate) kube_ovn_reservation: bool,
    /// Where the IPs of pods not ours come from (`index::watch_pod_ips`).
    pub(crate) pod_ips: PodIpSource,
}

/// Where a replica learns which IPs the cluster's pods run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum PodIpSource {
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
    pub(crate) async fn shutdown(&self) {
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

/// Start the watches, readiness, the lease and the reconciler. What they use of `webhook` is
/// taken here, once (`Parts::of`), and each task gets only its part.
pub(crate) fn start(
    client: Client,
    webhook: &Webhook,
    ready: Arc<AtomicBool>,
    options: ClusterOptions,
) -> ClusterHandle {
    let parts = Parts::of(webhook);
    let caches = Arc::new(Caches {
        health: parts.metrics.watch_health.clone(),
        ..Caches::default()
    });
    caches.cluster_ips.set_app_label(&options.app_label);
    webhook.claim_guard.watch_pods(caches.clone());
    let (leases, leading, mut tasks) = leadership(&client, &parts, &options);
    tasks.extend(watch_tasks(&client, &parts, &caches, &options));
    tasks.extend(cni_tasks(&client, &parts, &caches, &leading, &options));
    tasks.extend(node_loss_tasks(
        &client, &parts, &caches, &leading, &options,
    ));
    if options.cni == Cni::KubeOvn && options.kube_ovn_reservation {
        tasks.extend(kube_ovn_reservation::spawn(
            &client,
            parts.offered(),
            caches.clone(),
            &leading,
            RESERVATION_CHECK,
        ));
    }
    tasks.extend(sweepers(&client, &parts, &options, &leading, false));
    let vms = Arc::new(
        virtual_machines::VmDirectory::new(client.clone(), parts.kubevirt.release_on_stop)
            .remembering(options.resync_period),
    );
    // with KubeVirt launcher pods taken for VMs, the leader follows VM deletions
    if !parts.kubevirt.controllers.is_empty() {
        tasks.extend(virtual_machines::spawn_deletion_watches(
            &client,
            &vms,
            &caches,
            &leading,
            options.resync_period,
        ));
    }
    let lease = options.lease.clone();
    let reconciler = Reconciler::new(
        client,
        caches.clone(),
        parts.interfaces.primary().clone(),
        parts.app_lists(),
        parts.metrics.clone(),
        options,
        vms,
    );
    tasks.push(tokio::spawn(reconciler.run(leading.clone(), ready)));
    ClusterHandle {
        leading,
        leases,
        lease,
        tasks,
    }
}

/// The Lease election and the leadership gauge: the Leases' API, whether this replica leads,
/// and the two tasks.
fn leadership(
    client: &Client,
    parts: &Parts,
    options: &ClusterOptions,
) -> (Api<Lease>, watch::Receiver<bool>, Vec<JoinHandle<()>>) {
    let (leading_tx, leading) = watch::channel(false);
    let leases = Api::<Lease>::namespaced(client.clone(), &options.lease.namespace);
    let elector = lease::Elector::new(leases.clone(), options.lease.clone());
    let tasks = vec![
        tokio::spawn(lease::run(elector, leading_tx)),
        tokio::spawn(lease::export_leadership(
            leading.clone(),
            parts.metrics.clone(),
            options.lease.name.clone(),
        )),
    ];
    (leases, leading, tasks)
}

/// The watches every replica keeps: pods, claims and pools into `caches`, and the pods'
/// actual IPs and the workloads' lists into the cluster's IP index.
fn watch_tasks(
    client: &Client,
    parts: &Parts,
    caches: &Arc<Caches>,
    options: &ClusterOptions,
) -> Vec<JoinHandle<()>> {
    let allocator = parts.interfaces.primary();
    let mut tasks = vec![
        tokio::spawn(watch_claims(
            Api::all(client.clone()),
            caches.clone(),
            allocator.clone(),
        )),
        tokio::spawn(watch_pools(
            Api::all(client.clone()),
            caches.clone(),
            parts.pools.clone(),
        )),
    ];
    tasks.extend(parts.interfaces.secondary().map(|(network, allocator)| {
        tokio::spawn(watches::watch_network_claims(
            Api::all(client.clone()),
            network.clone(),
            allocator.clone(),
        ))
    }));
    allocator.set_foreign(caches.cluster_ips.clone());
    caches.cluster_ips.set_lists(parts.app_lists());
    tasks.push(tokio::spawn(index::watch_pod_ips(
        client.clone(),
        caches.clone(),
        parts.metrics.clone(),
        options.app_label.clone(),
        options.pod_ips,
        options.cni,
    )));
    tasks.extend(index::workloads::spawn_watches(
        client,
        parts.workloads.clone(),
        parts.metrics.clone(),
        parts.app_label.clone(),
        caches.clone(),
    ));
    tasks
}

/// The watches of the objects `options.cni`'s descriptor names (`CniDescriptor::watches`):
/// Kube-OVN IPs and Subnets, or Calico IPPools and IPReservations (and, leader only, keeping
/// our IPReservation).
fn cni_tasks(
    client: &Client,
    parts: &Parts,
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
        let networks = parts.networks.clone();
        match object {
            CniObject::KubeOvnIps => tasks.push(tokio::spawn(index::watch_ovn_ips(
                api,
                caches.clone(),
                parts.metrics.clone(),
            ))),
            CniObject::KubeOvnSubnets => {
                tasks.push(tokio::spawn(cni::watch_subnets(api, networks)))
            }
            CniObject::CalicoIpPools => {
                tasks.push(tokio::spawn(cni::watch_calico_pools(api, networks)))
            }
            // read by the pod-IP watch, which decides whether to (`index::watch_pod_ips`)
            CniObject::CalicoIpamBlocks => {}
            CniObject::CalicoIpReservations => {
                let state = Arc::new(cni::ReservationState::default());
                tasks.push(tokio::spawn(cni::watch_calico_reservations(
                    api.clone(),
                    networks,
                    state.clone(),
                )));
                if options.calico_reservation {
                    tasks.push(tokio::spawn(cni::keep_reservation(
                        api,
                        parts.offered(),
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

/// Node-loss release ([`node_loss`]) of every interface's claims, when `options` ask for it:
/// the leader's watch of Nodes and its releaser, over the pods `caches` index.
fn node_loss_tasks(
    client: &Client,
    parts: &Parts,
    caches: &Arc<Caches>,
    leading: &watch::Receiver<bool>,
    options: &ClusterOptions,
) -> Vec<JoinHandle<()>> {
    if options.node_lost_grace.is_zero() {
        return Vec::new();
    }
    let releaser = node_loss::NodeLoss {
        allocators: parts.interfaces.allocators(),
        cluster_ips: caches.cluster_ips.clone(),
        nodes: Default::default(),
        pods: client.clone(),
        recorder: events::recorder(client.clone(), Some(options.lease.identity.clone())),
        metrics: parts.metrics.clone(),
        grace: options.node_lost_grace.as_secs().max(1),
    };
    releaser.spawn(leading)
}

/// With a ledger other than IPClaims (etcd, embedded) and an API server: the Lease election,
/// the leak sweepers ([`sweep`]) of every interface's books and, when asked, node-loss
/// release over a watch of the pods' IPs; no other watch.
pub(crate) fn start_sweeper(
    client: Client,
    webhook: &Webhook,
    options: ClusterOptions,
) -> ClusterHandle {
    let parts = Parts::of(webhook);
    // its pod watch is node-loss release's alone: no admission reads it, so readiness does not
    // wait for it (its health is its own)
    let caches = Arc::new(Caches::default());
    let (leases, leading, mut tasks) = leadership(&client, &parts, &options);
    tasks.extend(sweepers(&client, &parts, &options, &leading, true));
    if !options.node_lost_grace.is_zero() {
        caches.cluster_ips.set_app_label(&options.app_label);
        tasks.push(tokio::spawn(index::watch_pod_ips(
            client.clone(),
            caches.clone(),
            parts.metrics.clone(),
            options.app_label.clone(),
            options.pod_ips,
            options.cni,
        )));
        tasks.extend(node_loss_tasks(
            &client, &parts, &caches, &leading, &options,
        ));
    }
    ClusterHandle {
        leading,
        leases,
        lease: options.lease,
        tasks,
    }
}

/// The leak sweepers the Lease holder runs ([`sweep`]): one per secondary network, whatever
/// the ledger, and one for the primary interface's books unless the reconciler keeps them
/// (`primary`: they are not IPClaims).
fn sweepers(
    client: &Client,
    parts: &Parts,
    options: &ClusterOptions,
    leading: &watch::Receiver<bool>,
    primary: bool,
) -> Vec<JoinHandle<()>> {
    parts
        .interfaces
        .iter()
        .filter(|(interface, _)| primary || *interface != Interface::Primary)
        .map(|(interface, allocator)| {
            let pods = pods::PodDirectory::of_interface(
                client.clone(),
                &parts.app_label,
                &parts.kubevirt,
                interface,
            );
            let sweeper = sweep::Sweeper::new(
                allocator.clone(),
                pods,
                options.rules,
                options.resync_period,
                parts.metrics.clone(),
            );
            tokio::spawn(sweeper.run(leading.clone()))
        })
        .collect()
}
