//! The reconcile loop ([`Reconciler`]): every replica marks itself ready once synced and
//! resyncs its index; the leader also acts on the plan of [`super::reconcile`].

use ip_webhook_ipam::allocator::Allocator;
use ip_webhook_ledger::crd::{FixedIPPool, IPClaim};
use ip_webhook_ledger::kubernetes::{PRIMARY_SELECTOR, from_resource};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::watch;

use super::leader_view::LeaderView;
use super::reconcile::Holdings;
use super::*;

/// The reconcile loop: every replica marks itself ready once synced and resyncs its index;
/// the leader also acts.
pub(crate) struct Reconciler {
    pub(crate) client: Client,
    pub(crate) caches: Arc<Caches>,
    pub(crate) allocator: Arc<Allocator>,
    pub(crate) executor: super::executor::Executor,
    pub(crate) options: ClusterOptions,
    /// The apps' lists the leader adopts running pods' IPs into (`reconcile::plan_list_adoptions`).
    pub(crate) lists: Option<Arc<dyn super::app_lists::AppLists>>,
    /// What the leader knows of the claims and pods between passes: since when it has seen
    /// each claim as it is (on `Reconciler::clock`), and what an incremental pass plans from.
    pub(crate) view: std::sync::Mutex<LeaderView>,
    /// The leader's own clock for the ages of claims: monotonic, so neither another
    /// machine's clock nor a step of this one's wall clock can age a claim.
    pub(crate) started: tokio::time::Instant,
    /// The apps' lists as the last pass saw them (`super::app_lists::AppLists::listed_version`).
    pub(crate) listed_seen: std::sync::Mutex<Option<u64>>,
}

/// How long the loop lets a burst of watch events settle before a pass.
const SETTLE: Duration = Duration::from_millis(200);

impl Reconciler {
    /// The leader's reconciler over the watches' `caches` and the primary interface's
    /// `allocator`, adopting running pods' IPs into `lists`; its executor writes through
    /// `client`, asks `vms` before a VM's claim is dropped and reports Events as this
    /// replica's Lease identity.
    pub(crate) fn new(
        client: Client,
        caches: Arc<Caches>,
        allocator: Arc<Allocator>,
        lists: Arc<dyn super::app_lists::AppLists>,
        metrics: Arc<crate::metrics::Metrics>,
        options: ClusterOptions,
        vms: Arc<super::virtual_machines::VmDirectory>,
    ) -> Reconciler {
        let identity = options.lease.identity.clone();
        Reconciler {
            client: client.clone(),
            caches,
            allocator,
            executor: super::executor::Executor {
                claims: Api::all(client.clone()),
                pools: Api::all(client.clone()),
                pods: Api::all(client.clone()),
                vms,
                recorder: super::events::recorder(client, Some(identity)),
                metrics,
                reported_duplicates: Default::default(),
            },
            options,
            lists: Some(lists),
            view: Default::default(),
            started: tokio::time::Instant::now(),
            listed_seen: Default::default(),
        }
    }

    pub(crate) async fn run(self, mut leading: watch::Receiver<bool>, ready: Arc<AtomicBool>) {
        while !self.caches.synced() {
            self.caches.changes().await;
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
                _ = self.caches.changes() => {
                    tokio::time::sleep(SETTLE).await;
                    if !self.caches.take_unseen_change() {
                        continue; // the last pass started after this change: it saw it
                    }
                    false
                }
                _ = sleep_until(due) => false,
            };
            let is_leader = *leading.borrow();
            self.caches.take_unseen_change();
            due = self.pass(full, is_leader).await;
        }
    }

    /// One pass. A full pass lists claims (and, for the leader, pods) from the API server
    /// rather than trusting the watches, and rebuilds the allocator's index from the list.
    ///
    /// A replica that does not lead keeps nothing: it only rebuilds its index on a full pass.
    /// The leader's incremental pass costs what changed (`LeaderView`): the claims and the
    /// pods that carry an IP of ours that the watches changed, and the running pods the
    /// pod-IP index marked as touching an app's list since the last pass; every claim and
    /// running pod is visited only on a full pass, or when the apps' lists changed.
    pub(crate) async fn pass(&self, full: bool, is_leader: bool) -> Option<tokio::time::Instant> {
        if !is_leader {
            lock(&self.view).clear();
            if full && let Err(error) = self.fresh_claims().await {
                tracing::warn!(%error, "full resync failed; using the watch caches");
            }
            return None;
        }
        let now = self.clock();
        let pods = self.update_view(full, now).await;
        let mut plan = lock(&self.view).plan(&pods, now, self.options.rules);
        if let Some(lists) = &self.lists {
            let running = self.adoption_candidates(full, lists.as_ref()).await;
            let view = lock(&self.view);
            reconcile::plan_list_adoptions(&mut plan, &*view, &pods, &running, lists.as_ref());
        }
        if !plan.actions.is_empty() {
            let done = self.executor.run(&plan).await;
            tracing::debug!(planned = plan.actions.len(), done, "reconcile pass");
        }
        reconcile::add_running_duplicates(
            &mut plan.duplicates,
            self.caches.cluster_ips.shared_pod_ips(),
            &pods,
        );
        self.executor.report_duplicates(&plan.duplicates).await;
        let pools: Vec<FixedIPPool> = lock(&self.caches.pools).values().cloned().collect();
        let catalog = tolerant_catalog(&lock(&self.caches.pools));
        let claimed: Vec<IpAddr> = lock(&self.view).claimed_ips().collect();
        let statuses = reconcile::pool_statuses(&catalog, claimed.iter().copied());
        self.executor.write_pool_statuses(&pools, &statuses).await;
        plan.next_due.map(|at| {
            tokio::time::Instant::now() + Duration::from_secs(at.saturating_sub(now).max(1))
        })
    }

    /// Bring the leader's view up to date and return the pods this pass plans with. A full
    /// pass rebuilds it from fresh lists (or, when listing fails, from the watch caches);
    /// otherwise it takes what the watches changed since the last pass, or is rebuilt from the
    /// caches when that was lost or the view was made from a list.
    async fn update_view(&self, full: bool, now: u64) -> Arc<PodMap> {
        if full {
            // what the watches change from here on is the next pass's
            drop(self.caches.take_claim_changes());
            drop(self.caches.take_pod_changes());
            // A pod list younger than the resync period (the watch's own, at start) is as fresh
            // as a full pass needs: a new leader does not read every pod twice.
            let listed = if self.caches.pods_listed_within(self.options.resync_period) {
                self.fresh_claims()
                    .await
                    .map(|claims| (claims, self.caches.pod_map()))
            } else {
                self.fresh_lists().await
            };
            let (claims, pods, from_caches) = match listed {
                Ok((claims, pods)) => (claims, pods, false),
                Err(error) => {
                    tracing::warn!(%error, "full resync failed; using the watch caches");
                    (self.caches.claim_list(), self.caches.pod_map(), true)
                }
            };
            lock(&self.view).rebuild(&claims, &pods, now, from_caches);
            return pods;
        }
        let claim_changes = self.caches.take_claim_changes();
        let (pods, pod_changes) = self.caches.take_pod_changes();
        let mut view = lock(&self.view);
        match (claim_changes, pod_changes) {
            (Some(claims), Some(uids)) if !view.is_stale() => {
                view.apply(claims, &uids, &pods, now);
            }
            _ => view.rebuild(&self.caches.claim_list(), &pods, now, true),
        }
        pods
    }

    /// The running pods list adoption looks at: all of them on a full pass, after the index
    /// lost count of what changed, or once the apps' lists changed (a list may now cover a
    /// pod that was running all along); otherwise those the pod-IP index marked, and those
    /// on the IPs of claims gone since the last pass (their pod may now need one). With
    /// Calico's IPAM as the source of other pods' IPs, also the pods behind Calico's listed
    /// IPs ([`Self::calico_candidates`]).
    async fn adoption_candidates(
        &self,
        full: bool,
        lists: &dyn super::app_lists::AppLists,
    ) -> Vec<Arc<super::index::RunningPod>> {
        let index = &self.caches.cluster_ips;
        let marked = index.take_marked();
        let released = lock(&self.view).take_released();
        let listed = lists.listed_version();
        let lists_changed = {
            let mut last = lock(&self.listed_seen);
            let changed = listed.is_none() || *last != listed;
            *last = listed;
            changed
        };
        let (mut pods, every) = match marked {
            Some(uids) if !full && !lists_changed => {
                let mut pods: Vec<Arc<super::index::RunningPod>> =
                    uids.iter().filter_map(|uid| index.pod(uid)).collect();
                pods.extend(released.iter().filter_map(|ip| index.pod_on(ip)));
                (pods, !released.is_empty())
            }
            _ => (index.pods(), true),
        };
        pods.extend(self.calico_candidates(every, lists).await);
        pods.sort_by(|a, b| a.uid.cmp(&b.uid));
        pods.dedup_by(|a, b| a.uid == b.uid);
        pods
    }

    /// With Calico's IPAM as the source of other pods' IPs, the pods Calico gave an IP on an
    /// app's list that no claim records: they carry no label of ours, so no watch has them,
    /// and each is read from the API server (at most [`CALICO_READS`] a pass). Looked for
    /// in every block when `every` (a full look), else at the listed IPs blocks gave a pod
    /// since the last pass.
    async fn calico_candidates(
        &self,
        every: bool,
        lists: &dyn super::app_lists::AppLists,
    ) -> Vec<Arc<super::index::RunningPod>> {
        let index = &self.caches.cluster_ips;
        let changed = index.take_listed_calico_changes();
        if !index.uses_calico_ipam() || changed.as_ref().is_some_and(|c| !every && c.is_empty()) {
            return Vec::new();
        }
        let only = changed.as_deref().filter(|_| !every);
        let holds = {
            let view = lock(&self.view);
            let claimed = |ip: &IpAddr| view.holds_ip(ip);
            index.listed_calico_holds(lists, &claimed, only)
        };
        let mut found = Vec::new();
        for held in holds.into_iter().take(CALICO_READS) {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &held.namespace);
            match api.get_opt(&held.pod).await {
                Ok(Some(pod)) => {
                    let slim =
                        super::index::RunningPod::from_pod_labelled(&pod, &self.options.app_label);
                    found.extend(slim.filter(|s| s.ips.contains(&held.ip)).map(Arc::new));
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(%error, ip = %held.ip, pod = %format!("{}/{}", held.namespace, held.pod), "cannot read the pod Calico gave a listed IP; looking again next pass");
                    index.note_listed_calico_change(held.ip);
                }
            }
        }
        found
    }

    /// Seconds on the leader's own monotonic clock.
    fn clock(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// Claims from the API server, page by page, into the allocator's index; a claim the
    /// watch changed while they were read keeps the watch's version ([`claim_list`]).
    async fn fresh_claims(&self) -> Result<Vec<Arc<IPClaim>>, ClusterError> {
        let claims_api: Api<IPClaim> = Api::all(self.client.clone());
        let mut claims: Vec<Arc<IPClaim>> = Vec::new();
        self.caches.claim_list.open();
        let listed = list_pages(
            |params| {
                let api = claims_api.clone();
                // the primary interface's claims; a secondary network's are its sweeper's
                let params = params.labels(PRIMARY_SELECTOR);
                async move { api.list(&params).await }
            },
            |page| claims.extend(page.into_iter().map(Arc::new)),
        )
        .await;
        if let Err(error) = listed {
            self.caches.claim_list.close();
            return Err(ClusterError::api("listing", "IPClaims", error));
        }
        // under the watch cache's lock: no watch event falls between the merge and the index
        let watched = lock(&self.caches.claims);
        let claims = self.caches.claim_list.close_and_merge(claims, &watched);
        self.allocator.replace_all(
            claims
                .iter()
                .filter_map(|c| from_resource(c).ok())
                .collect(),
        );
        drop(watched);
        Ok(claims)
    }

    /// Claims and the metadata of pods from the API server, page by page: each page of pods
    /// is reduced to the [`ClaimingPod`] of those that carry an IP before the next is read.
    async fn fresh_lists(&self) -> Result<(Vec<Arc<IPClaim>>, Arc<PodMap>), ClusterError> {
        let claims = self.fresh_claims().await?;
        let mut pods = PodMap::default();
        let pods_api: Api<Pod> = Api::all(self.client.clone());
        let app_label = &self.options.app_label;
        // the pod watch's own choice: with Calico's IPAM, only the pods carrying our label
        let ours = self.caches.cluster_ips.uses_calico_ipam();
        list_pages(
            |params| {
                let api = pods_api.clone();
                let params = if ours {
                    params.labels(ip_webhook_admission::annotations::ALLOCATED_IP_LABEL)
                } else {
                    params
                };
                async move { api.list_metadata(&params).await }
            },
            |page| {
                for pod in page {
                    if let Some(info) = claiming_pod(&pod.metadata, app_label) {
                        pods.insert(info.uid.clone(), info);
                    }
                }
            },
        )
        .await
        .map_err(|e| ClusterError::api("listing", "pods", e))?;
        Ok((claims, Arc::new(pods)))
    }
}

/// Pods read one by one per pass for list adoption under Calico's IPAM
/// ([`Reconciler::calico_candidates`]); more wait for the next full pass.
const CALICO_READS: usize = 64;

/// Objects per page of a full list: what client-go's reflector asks for (`pager.go`,
/// `defaultPageSize = 500`), so that no response holds the whole cluster.
pub(super) const PAGE: u32 = 500;

/// List page by page (`limit` and `continue`, one consistent snapshot on the API server),
/// handing each page to `each` before reading the next.
pub(crate) async fn list_pages<K, F, Fut>(
    mut list: F,
    mut each: impl FnMut(Vec<K>),
) -> Result<(), kube::Error>
where
    K: Clone,
    F: FnMut(ListParams) -> Fut,
    Fut: std::future::Future<Output = Result<kube::api::ObjectList<K>, kube::Error>>,
{
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(PAGE);
        if let Some(token) = token.take() {
            params = params.continue_token(&token);
        }
        let page = list(params).await?;
        let next = page.metadata.continue_.clone().filter(|t| !t.is_empty());
        each(page.items);
        match next {
            Some(next) => token = Some(next),
            None => return Ok(()),
        }
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
    use kube::api::ObjectList;

    fn page(items: Vec<u32>, next: Option<&str>) -> ObjectList<u32> {
        serde_json::from_value(serde_json::json!({
            "metadata": {"continue": next},
            "items": items,
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_list_is_read_page_by_page_with_the_continue_token() {
        let asked = std::sync::Mutex::new(Vec::new());
        let mut pages = vec![
            page(vec![1, 2], Some("t1")),
            page(vec![3], Some("t2")),
            page(vec![4], Some("")),
        ]
        .into_iter();
        let mut seen = Vec::new();
        list_pages(
            |params: ListParams| {
                asked
                    .lock()
                    .unwrap()
                    .push((params.limit, params.continue_token.clone()));
                let next = pages.next().unwrap();
                async move { Ok(next) }
            },
            |items: Vec<u32>| seen.push(items),
        )
        .await
        .unwrap();
        assert_eq!(seen, vec![vec![1, 2], vec![3], vec![4]]);
        assert_eq!(
            *asked.lock().unwrap(),
            vec![
                (Some(PAGE), None),
                (Some(PAGE), Some("t1".to_string())),
                (Some(PAGE), Some("t2".to_string())),
            ]
        );
    }
}
