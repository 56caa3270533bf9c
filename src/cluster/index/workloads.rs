//! The workload watches: every workload kind's objects whose pod template lists IPs, fed into
//! the webhook's [`WorkloadRegistry`], which from then on answers from the watches only
//! (admissions no longer record into it).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use super::super::Caches;
use super::status_code;
use crate::decisions::workloads::{self, WORKLOAD_KINDS, WorkloadId, WorkloadRegistry};
use crate::metrics::{CacheKindLabels, Metrics};

/// What the watches of every workload kind share.
struct Target {
    registry: Arc<WorkloadRegistry>,
    metrics: Arc<Metrics>,
    /// The label naming a pod's app (the decisions' `--app-label`).
    app_label: String,
    caches: Arc<Caches>,
    /// Per kind of [`WORKLOAD_KINDS`]: whether its first list is in.
    synced: Vec<AtomicBool>,
}

/// Every workload kind into `registry`, which from then on answers from the watches only.
pub(crate) fn spawn_watches(
    client: &Client,
    registry: Arc<WorkloadRegistry>,
    metrics: Arc<Metrics>,
    app_label: String,
    caches: Arc<Caches>,
) -> Vec<tokio::task::JoinHandle<()>> {
    registry.set_watched();
    let target = Arc::new(Target {
        registry,
        metrics,
        app_label,
        caches,
        synced: WORKLOAD_KINDS
            .iter()
            .map(|_| AtomicBool::new(false))
            .collect(),
    });
    WORKLOAD_KINDS
        .iter()
        .enumerate()
        .map(|(i, workload)| {
            let resource = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(workload.group, workload.version, workload.kind),
                workload.plural,
            );
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            tokio::spawn(watch_workloads(api, workload.kind, target.clone(), i))
        })
        .collect()
}

/// One workload kind into the registry: `(id, app, list)` of each workload that lists IPs.
async fn watch_workloads(
    api: Api<DynamicObject>,
    kind: &'static str,
    target: Arc<Target>,
    slot: usize,
) {
    let Target {
        registry,
        metrics,
        app_label,
        caches,
        synced,
    } = &*target;
    let all_synced = || {
        synced[slot].store(true, Ordering::SeqCst);
        if synced.iter().all(|s| s.load(Ordering::SeqCst))
            && !caches
                .cluster_ips
                .workloads_synced
                .swap(true, Ordering::SeqCst)
        {
            caches.mark_changed();
        }
    };
    let gauge = metrics
        .cache_objects
        .get_or_create_owned(&CacheKindLabels { kind: "workload" });
    let id_of = |object: &DynamicObject| WorkloadId {
        kind: kind.to_string(),
        namespace: object.metadata.namespace.clone().unwrap_or_default(),
        name: object.metadata.name.clone().unwrap_or_default(),
    };
    let mut pending: Option<Vec<workloads::Listing>> = None;
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        // not served (404) is an answer: there is nothing of that kind to know
        match &item {
            Err(error) if status_code(error) != Some(404) => caches.health.failed(kind),
            _ => caches.health.ok(kind),
        }
        match item {
            Ok(watcher::Event::Init) => pending = Some(Vec::new()),
            Ok(watcher::Event::InitApply(object)) => {
                if let (Some(pending), Some(listing)) = (
                    pending.as_mut(),
                    workloads::listing_of(kind, &object, app_label),
                ) {
                    pending.push(listing);
                }
            }
            Ok(watcher::Event::InitDone) => {
                registry.replace_kind(kind, pending.take().unwrap_or_default());
                all_synced();
            }
            Ok(watcher::Event::Apply(object)) => {
                match workloads::listing_of(kind, &object, app_label) {
                    Some(listing) => {
                        registry.record(listing.id, listing.app, &listing.set);
                        // a list may now cover a running pod: the reconciler looks again
                        caches.mark_changed();
                    }
                    None => registry.forget(&id_of(&object)),
                }
            }
            Ok(watcher::Event::Delete(object)) => registry.forget(&id_of(&object)),
            Err(error) if status_code(&error) == Some(404) => {
                // Not served (an API server without this group): nothing to know.
                all_synced();
            }
            Err(error) => tracing::warn!(%error, watch = kind, "workload watch error; retrying"),
        }
        gauge.set(registry.len() as i64);
    }
}
