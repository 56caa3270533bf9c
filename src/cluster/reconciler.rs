//! The reconcile loop ([`Reconciler`]): every replica marks itself ready once synced and
//! resyncs its index; the leader also acts on the plan of [`super::reconcile`].

use crate::crd::{IPClaim, IPPool};
use crate::ipam::allocator::Allocator;
use crate::ledger::kubernetes::from_resource;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::watch;

use super::*;

/// The reconcile loop: every replica marks itself ready once synced and resyncs its index;
/// the leader also acts.
pub struct Reconciler {
    pub client: Client,
    pub caches: Arc<Caches>,
    pub allocator: Arc<Allocator>,
    pub executor: super::executor::Executor,
    pub options: ClusterOptions,
    /// The apps' lists the leader adopts running pods' IPs into ([`reconcile::plan_list_adoptions`]).
    pub lists: Option<Arc<dyn reconcile::AppLists>>,
    /// Since when the leader has seen each claim as it is, on [`Reconciler::clock`].
    pub sightings: std::sync::Mutex<reconcile::Sightings>,
    /// The leader's own clock for the ages of claims: monotonic, so neither another
    /// machine's clock nor a step of this one's wall clock can age a claim.
    pub started: tokio::time::Instant,
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
            lock(&self.sightings).clear();
            return None;
        }
        let now = self.clock();
        let mut plan = {
            let mut seen = lock(&self.sightings);
            seen.observe(&claims, &pods, now);
            reconcile::plan(&claims, &pods, &seen, now, self.options.rules)
        };
        if let Some(lists) = &self.lists {
            let running = self.caches.cluster_ips.pods();
            reconcile::plan_list_adoptions(&mut plan, &claims, &pods, &running, lists.as_ref());
        }
        if !plan.actions.is_empty() {
            let done = self.executor.run(&plan).await;
            tracing::debug!(planned = plan.actions.len(), done, "reconcile pass");
        }
        reconcile::add_running_duplicates(
            &mut plan.duplicates,
            self.caches.cluster_ips.shared_pod_ips(),
        );
        self.executor.report_duplicates(&plan.duplicates).await;
        let pools: Vec<IPPool> = lock(&self.caches.pools).values().cloned().collect();
        let catalog = tolerant_catalog(&lock(&self.caches.pools));
        let statuses = reconcile::pool_statuses(&catalog, &self.caches.claim_list());
        self.executor.write_pool_statuses(&pools, &statuses).await;
        plan.next_due.map(|at| {
            tokio::time::Instant::now() + Duration::from_secs(at.saturating_sub(now).max(1))
        })
    }

    /// Seconds on the leader's own monotonic clock.
    fn clock(&self) -> u64 {
        self.started.elapsed().as_secs()
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
