//! In-cluster mode: watches that keep the allocator, the pool catalog and a compact pod cache in
//! step with the API server, readiness once they have synced, and the leader-elected
//! reconciler that keeps the `IPClaim` books true.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{ListParams, PartialObjectMeta};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::allocator::Allocator;
use crate::annotations::{CLAIM_TOKEN, Cni, carried_ips};
use crate::crd::{IPClaim, IPPool};
use crate::ledger::claim::is_token;
use crate::ledger::kubernetes::from_resource;
use crate::ledger::{ObservedChange, unix_now};
use crate::metrics::{LeaseLabels, Metrics};
use crate::pools::PoolCatalog;
use crate::webhook::Webhook;

pub mod cni;
pub mod events;
pub mod index;
pub mod kube_ovn_reservation;
pub mod lease;
pub mod node_loss;
pub mod pods;
pub mod reconcile;
pub mod sweep;

pub use reconcile::{PodInfo, Rules};

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{what} {name}: {source}")]
    Api {
        what: &'static str,
        name: String,
        source: kube::Error,
    },
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
}

/// What the watches hold. Pods are kept as [`PodInfo`] only, and only pods that carry an IP.
#[derive(Default)]
pub struct Caches {
    pub pods: Mutex<HashMap<String, PodInfo>>,
    pub claims: Mutex<BTreeMap<String, Arc<IPClaim>>>,
    pub pools: Mutex<BTreeMap<String, IPPool>>,
    /// Pods' actual IPs, Kube-OVN IP objects, workloads' lists ([`index`]).
    pub cluster_ips: Arc<index::ClusterIps>,
    pods_synced: AtomicBool,
    claims_synced: AtomicBool,
    pools_synced: AtomicBool,
    /// Something changed: the reconciler may have work.
    pub changed: Notify,
}

impl Caches {
    pub fn synced(&self) -> bool {
        self.pods_synced.load(Ordering::SeqCst)
            && self.claims_synced.load(Ordering::SeqCst)
            && self.pools_synced.load(Ordering::SeqCst)
            && self.cluster_ips.synced()
    }

    pub fn claim_list(&self) -> Vec<Arc<IPClaim>> {
        lock(&self.claims).values().cloned().collect()
    }

    pub fn pod_map(&self) -> HashMap<String, PodInfo> {
        lock(&self.pods).clone()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn unix(time: Option<&Time>) -> u64 {
    time.and_then(|Time(t)| u64::try_from(t.as_second()).ok())
        .unwrap_or_else(unix_now)
}

/// The compact record of a pod, or `None` when the pod carries no IP we track.
pub fn pod_info(meta: &ObjectMeta, app_label: &str) -> Option<PodInfo> {
    let ips = carried_ips(meta.labels.as_ref(), meta.annotations.as_ref());
    if ips.is_empty() {
        return None;
    }
    Some(PodInfo {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone()?,
        ips,
        created_at: unix(meta.creation_timestamp.as_ref()),
        terminating: meta.deletion_timestamp.is_some(),
        stateful: meta.owner_references.as_ref().is_some_and(|owners| {
            owners
                .iter()
                .any(|o| o.kind == "StatefulSet" && o.controller == Some(true))
        }),
        app: meta
            .labels
            .as_ref()
            .and_then(|l| l.get(app_label))
            .cloned()
            .unwrap_or_default(),
        token: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(CLAIM_TOKEN))
            .filter(|t| is_token(t))
            .cloned(),
    })
}

/// Keeps a map in step with a watch stream: the `Init` … `InitDone` of a (re)list replaces it
/// whole, so a delete missed while disconnected cannot linger.
struct Mirror<T> {
    pending: Option<HashMap<String, T>>,
}

enum Change<T> {
    Upsert(String, T),
    Delete(String),
    Replace(HashMap<String, T>),
    Nothing,
}

impl<T> Mirror<T> {
    fn new() -> Mirror<T> {
        Mirror { pending: None }
    }

    fn step<K>(
        &mut self,
        event: watcher::Event<K>,
        key: impl Fn(&K) -> Option<String>,
        value: impl Fn(&K) -> Option<T>,
    ) -> Change<T> {
        match event {
            watcher::Event::Init => {
                self.pending = Some(HashMap::new());
                Change::Nothing
            }
            watcher::Event::InitApply(object) => {
                if let (Some(pending), Some(k), Some(v)) =
                    (self.pending.as_mut(), key(&object), value(&object))
                {
                    pending.insert(k, v);
                }
                Change::Nothing
            }
            watcher::Event::InitDone => Change::Replace(self.pending.take().unwrap_or_default()),
            watcher::Event::Apply(object) => match (key(&object), value(&object)) {
                (Some(k), Some(v)) => Change::Upsert(k, v),
                (Some(k), None) => Change::Delete(k),
                _ => Change::Nothing,
            },
            watcher::Event::Delete(object) => match key(&object) {
                Some(k) => Change::Delete(k),
                None => Change::Nothing,
            },
        }
    }
}

async fn drive<K, S, F>(stream: S, what: &'static str, mut on_event: F)
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    F: FnMut(watcher::Event<K>),
{
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => on_event(event),
            Err(error) => {
                tracing::warn!(%error, watch = what, "watch error; retrying with backoff")
            }
        }
    }
}

/// Pods that carry an IP, as [`PodInfo`] keyed by UID.
pub async fn watch_pods(api: Api<PartialObjectMeta<Pod>>, caches: Arc<Caches>, app_label: String) {
    let mut mirror = Mirror::new();
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    drive(stream, "pods", |event| {
        let change = mirror.step(
            event,
            |pod: &PartialObjectMeta<Pod>| pod.metadata.uid.clone(),
            |pod| pod_info(&pod.metadata, &app_label),
        );
        let mut pods = lock(&caches.pods);
        match change {
            Change::Upsert(uid, info) => {
                pods.insert(uid, info);
            }
            Change::Delete(uid) => {
                pods.remove(&uid);
            }
            Change::Replace(all) => {
                *pods = all;
                caches.pods_synced.store(true, Ordering::SeqCst);
            }
            Change::Nothing => return,
        }
        drop(pods);
        caches.changed.notify_one();
    })
    .await
}

/// IPClaims, fed into the allocator's index as they change.
pub async fn watch_claims(api: Api<IPClaim>, caches: Arc<Caches>, allocator: Arc<Allocator>) {
    let mut mirror = Mirror::new();
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    drive(stream, "ipclaims", |event| {
        let change = mirror.step(
            event,
            |claim: &IPClaim| claim.metadata.name.clone(),
            |claim| Some(Arc::new(claim.clone())),
        );
        let mut claims = lock(&caches.claims);
        match change {
            Change::Upsert(name, claim) => {
                match from_resource(&claim) {
                    Ok(parsed) => {
                        allocator.apply_observed(ObservedChange::Held(parsed));
                    }
                    Err(error) => crate::ledger::skip_corrupt(
                        &error,
                        "ignoring an IPClaim that cannot be read (its IP stays held)",
                    ),
                }
                claims.insert(name, claim);
            }
            Change::Delete(name) => {
                if let Some(gone) = claims.remove(&name)
                    && let Ok(parsed) = from_resource(&gone)
                {
                    allocator.apply_observed(ObservedChange::Released(parsed));
                }
            }
            Change::Replace(all) => {
                allocator.replace_all(all.values().filter_map(|c| from_resource(c).ok()).collect());
                *claims = all.into_iter().collect();
                caches.claims_synced.store(true, Ordering::SeqCst);
            }
            Change::Nothing => return,
        }
        drop(claims);
        caches.changed.notify_one();
    })
    .await
}

/// Build a catalog from whatever pools are valid, oldest first; a pool that is invalid or
/// overlaps an older one is left out (and logged) rather than taking every pool down.
pub fn tolerant_catalog(pools: &BTreeMap<String, IPPool>) -> PoolCatalog {
    let mut ordered: Vec<&IPPool> = pools.values().collect();
    ordered.sort_by_key(|p| {
        (
            p.metadata.creation_timestamp.as_ref().map(|Time(t)| *t),
            p.metadata.name.clone(),
        )
    });
    let mut accepted: Vec<IPPool> = Vec::new();
    for pool in ordered {
        accepted.push(pool.clone());
        if let Err(error) = PoolCatalog::new(&accepted) {
            tracing::warn!(%error, "IPPool left out of the catalog");
            accepted.pop();
        }
    }
    PoolCatalog::new(&accepted).unwrap_or_default()
}

/// IPPools, rebuilt into the webhook's catalog on every change.
pub async fn watch_pools(api: Api<IPPool>, caches: Arc<Caches>, webhook: Arc<Webhook>) {
    let mut mirror = Mirror::new();
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    drive(stream, "ippools", |event| {
        let change = mirror.step(
            event,
            |pool: &IPPool| pool.metadata.name.clone(),
            |pool| Some(pool.clone()),
        );
        let mut pools = lock(&caches.pools);
        match change {
            Change::Upsert(name, pool) => {
                // A status write by the reconciler changes nothing the catalog uses.
                if pools.get(&name).is_some_and(|old| old.spec == pool.spec) {
                    pools.insert(name, pool);
                    return;
                }
                pools.insert(name, pool);
            }
            Change::Delete(name) => {
                pools.remove(&name);
            }
            Change::Replace(all) => {
                *pools = all.into_iter().collect();
                caches.pools_synced.store(true, Ordering::SeqCst);
            }
            Change::Nothing => return,
        }
        webhook.pools.store(Arc::new(tolerant_catalog(&pools)));
        drop(pools);
        caches.changed.notify_one();
    })
    .await
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
    let caches = Arc::new(Caches::default());
    caches.cluster_ips.set_app_label(&options.app_label);
    webhook.claim_guard.watch_pods(caches.clone());
    let (leading_tx, leading) = watch::channel(false);
    let mut tasks = vec![
        tokio::spawn(watch_pods(
            Api::all(client.clone()),
            caches.clone(),
            options.app_label.clone(),
        )),
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
    webhook.allocator.set_foreign(caches.cluster_ips.clone());
    tasks.push(tokio::spawn(index::watch_pod_ips(
        Api::all(client.clone()),
        caches.clone(),
        webhook.metrics.clone(),
    )));
    tasks.extend(index::spawn_workload_watches(
        &client,
        webhook.clone(),
        caches.clone(),
    ));
    match options.cni {
        Cni::KubeOvn => tasks.push(tokio::spawn(index::watch_ovn_ips(
            Api::all_with(client.clone(), &index::kube_ovn_ips()),
            caches.clone(),
            webhook.metrics.clone(),
        ))),
        Cni::Calico => caches.cluster_ips.without_ovn(),
    }
    match options.cni {
        Cni::Calico => {
            let reservations = Api::all_with(client.clone(), &cni::calico_reservations());
            let state = Arc::new(cni::ReservationState::default());
            tasks.push(tokio::spawn(cni::watch_calico_pools(
                Api::all_with(client.clone(), &cni::calico_ippools()),
                webhook.clone(),
            )));
            tasks.push(tokio::spawn(cni::watch_calico_reservations(
                reservations.clone(),
                webhook.clone(),
                state.clone(),
            )));
            if options.calico_reservation {
                tasks.push(tokio::spawn(cni::keep_reservation(
                    reservations,
                    webhook.clone(),
                    caches.clone(),
                    state,
                    leading.clone(),
                    RESERVATION_CHECK,
                )));
            }
        }
        Cni::KubeOvn => tasks.push(tokio::spawn(cni::watch_subnets(
            Api::all_with(client.clone(), &cni::kube_ovn_subnets()),
            webhook.clone(),
        ))),
    }
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
    let reconciler = Reconciler {
        client: client.clone(),
        caches: caches.clone(),
        allocator: webhook.allocator.clone(),
        executor: reconcile::Executor {
            claims: Api::all(client.clone()),
            pools: Api::all(client.clone()),
            pods: Api::all(client.clone()),
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
    };
    tasks.push(tokio::spawn(reconciler.run(leading.clone(), ready)));
    ClusterHandle {
        caches,
        leading,
        leases,
        lease,
        tasks,
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
    let mut tasks = Vec::new();
    if !options.node_lost_grace.is_zero() {
        let nodes = Arc::new(node_loss::Nodes::default());
        tasks.push(tokio::spawn(node_loss::watch_nodes(
            Api::all(client.clone()),
            nodes.clone(),
        )));
        let releaser = node_loss::NodeLoss {
            allocator: webhook.allocator.clone(),
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

/// With a ledger other than IPClaims (etcd, embedded) and an API server: the Lease election and
/// the leak sweeper ([`sweep`]). There are no watches: `caches` stays empty.
pub fn start_sweeper(
    client: Client,
    webhook: Arc<Webhook>,
    options: ClusterOptions,
) -> ClusterHandle {
    let (leading_tx, leading) = watch::channel(false);
    let leases = Api::<Lease>::namespaced(client.clone(), &options.lease.namespace);
    let elector = lease::Elector::new(leases.clone(), options.lease.clone());
    let sweeper = sweep::Sweeper::new(
        webhook.allocator.clone(),
        pods::PodDirectory::new(client, &options.app_label),
        options.rules,
        options.resync_period,
        webhook.metrics.clone(),
    );
    let tasks = vec![
        tokio::spawn(lease::run(elector, leading_tx)),
        tokio::spawn(export_leadership(
            leading.clone(),
            webhook.metrics.clone(),
            options.lease.name.clone(),
        )),
        tokio::spawn(sweeper.run(leading.clone())),
    ];
    ClusterHandle {
        caches: Arc::new(Caches::default()),
        leading,
        leases,
        lease: options.lease,
        tasks,
    }
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

/// The reconcile loop: every replica marks itself ready once synced and resyncs its index;
/// the leader also acts.
pub struct Reconciler {
    pub client: Client,
    pub caches: Arc<Caches>,
    pub allocator: Arc<Allocator>,
    pub executor: reconcile::Executor,
    pub options: ClusterOptions,
    /// The apps' lists the leader adopts running pods' IPs into ([`reconcile::plan_list_adoptions`]).
    pub lists: Option<Arc<dyn reconcile::AppLists>>,
}

/// How long the loop lets a burst of watch events settle before a pass.
const SETTLE: Duration = Duration::from_millis(200);

impl Reconciler {
    pub async fn run(self, mut leading: watch::Receiver<bool>, ready: Arc<AtomicBool>) {
        while !self.caches.synced() {
            self.caches.changed.notified().await;
        }
        ready.store(true, Ordering::SeqCst);
        tracing::info!("caches synced; ready");
        let mut resync = tokio::time::interval(self.options.resync_period);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut due: Option<tokio::time::Instant> = None;
        loop {
            let full = tokio::select! {
                _ = resync.tick() => true,
                changed = leading.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // A new leader starts from a full resync.
                    *leading.borrow()
                }
                _ = self.caches.changed.notified() => {
                    tokio::time::sleep(SETTLE).await;
                    false
                }
                _ = sleep_until(due) => false,
            };
            let is_leader = *leading.borrow();
            due = self.pass(full, is_leader).await;
        }
    }

    /// One pass. A full pass lists claims (and, for the leader, pods) from the API server
    /// rather than trusting the watches, and rebuilds the allocator's index from the list.
    pub async fn pass(&self, full: bool, is_leader: bool) -> Option<tokio::time::Instant> {
        let (claims, pods) = if full {
            match self.fresh_lists(is_leader).await {
                Ok(lists) => lists,
                Err(error) => {
                    tracing::warn!(%error, "full resync failed; using the watch caches");
                    (self.caches.claim_list(), self.caches.pod_map())
                }
            }
        } else {
            (self.caches.claim_list(), self.caches.pod_map())
        };
        if !is_leader {
            return None;
        }
        let now = unix_now();
        let mut plan = reconcile::plan(&claims, &pods, now, self.options.rules);
        if let Some(lists) = &self.lists {
            let running = self.caches.cluster_ips.pods();
            reconcile::plan_list_adoptions(&mut plan, &claims, &pods, &running, lists.as_ref());
        }
        if !plan.actions.is_empty() {
            let done = self.executor.run(&plan).await;
            tracing::debug!(planned = plan.actions.len(), done, "reconcile pass");
        }
        self.executor.report_duplicates(&plan.duplicates).await;
        let pools: Vec<IPPool> = lock(&self.caches.pools).values().cloned().collect();
        let catalog = tolerant_catalog(&lock(&self.caches.pools));
        let statuses = reconcile::pool_statuses(&catalog, &self.caches.claim_list());
        self.executor.write_pool_statuses(&pools, &statuses).await;
        plan.next_due.map(|at| {
            tokio::time::Instant::now() + Duration::from_secs(at.saturating_sub(now).max(1))
        })
    }

    async fn fresh_lists(
        &self,
        with_pods: bool,
    ) -> Result<(Vec<Arc<IPClaim>>, HashMap<String, PodInfo>), ClusterError> {
        let claims_api: Api<IPClaim> = Api::all(self.client.clone());
        let list = claims_api
            .list(&ListParams::default())
            .await
            .map_err(|e| ClusterError::api("listing", "IPClaims", e))?;
        let claims: Vec<Arc<IPClaim>> = list.items.into_iter().map(Arc::new).collect();
        self.allocator.replace_all(
            claims
                .iter()
                .filter_map(|c| from_resource(c).ok())
                .collect(),
        );
        let mut pods = HashMap::new();
        if with_pods {
            let pods_api: Api<Pod> = Api::all(self.client.clone());
            let list = pods_api
                .list_metadata(&ListParams::default())
                .await
                .map_err(|e| ClusterError::api("listing", "pods", e))?;
            for pod in list.items {
                if let Some(info) = pod_info(&pod.metadata, &self.options.app_label) {
                    pods.insert(info.uid.clone(), info);
                }
            }
        }
        Ok((claims, pods))
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_bad_or_overlapping_pool_is_left_out_not_the_whole_catalog() {
        let pool = |name: &str, cidr: &str, created: &str| -> IPPool {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "ip-webhook.io/v1alpha1", "kind": "IPPool",
                "metadata": {"name": name, "creationTimestamp": created},
                "spec": {"cidr": cidr},
            }))
            .unwrap()
        };
        let pools: BTreeMap<String, IPPool> = [
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
