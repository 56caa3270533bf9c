//! The one pod watch of every replica, feeding both the reconciler's cache of the pods that
//! carry our IPs and the cluster's IP index from the same events.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};

use super::super::Caches;
use super::super::listed_pod::ListedPod;
use super::super::watches::{Mirror, pod_cache_event};
use super::{ClusterIps, Relist, SlimOrGone, SlimPod, slim_event, touched};
use crate::metrics::{CacheKindLabels, Metrics};

/// The one pod watch: every pod, whole, since the decisions read `status.podIPs` and
/// `spec.nodeName`, which no metadata-only response carries; read as [`ListedPod`]s, so
/// that only those fields are built. Each event feeds two books: the cache of pods that carry
/// our IPs ([`pod_cache_event`], for the reconciler) and the cluster's IP index. Each pod is
/// slimmed as its event arrives and dropped at once.
pub async fn watch_pods(
    api: Api<ListedPod>,
    caches: Arc<Caches>,
    metrics: Arc<Metrics>,
    app_label: String,
) {
    let mut mirror = Mirror::new();
    let mut relist = Relist { pending: None };
    let gauge = metrics
        .cache_objects
        .get_or_create_owned(&CacheKindLabels { kind: "pod" });
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => {
                caches.health.ok("pods");
                let event = unwrapped(event);
                let cache_changed = pod_cache_event(&caches, &mut mirror, &event, &app_label);
                let index_wakes = index_pod_event(&caches.cluster_ips, &mut relist, event);
                gauge.set(caches.cluster_ips.pod_count() as i64);
                if cache_changed || index_wakes {
                    caches.mark_changed();
                }
            }
            Err(error) => {
                caches.health.failed("pods");
                tracing::warn!(%error, watch = "pods", "watch error; retrying with backoff")
            }
        }
    }
}

/// One pod event into the IP index; whether it concerns the reconciler: a relist, a pod of
/// an app with a list, or two pods coming to share an IP or ceasing to (a duplicate to
/// report). The rest of the cluster's churn costs each replica this update and nothing more.
fn index_pod_event(
    index: &ClusterIps,
    relist: &mut Relist<SlimPod>,
    event: watcher::Event<Pod>,
) -> bool {
    let Some(event) = slim_event(event, |pod: &Pod| {
        Some(SlimOrGone {
            key: pod.metadata.uid.as_deref()?.into(),
            value: SlimPod::from_pod_labelled(pod, index.app_label()),
        })
    }) else {
        return false;
    };
    let relisted = matches!(event, watcher::Event::InitDone);
    let concerns = match &event {
        watcher::Event::Apply(SlimOrGone {
            value: Some(pod), ..
        }) => index.concerns_lists(pod).then(|| pod.uid.clone()),
        _ => None,
    };
    let changed = touched(&event);
    let shared_before = index.shared_changes();
    relist.step(&index.pods, &index.pods_synced, event);
    if let Some((uid, pod)) = changed {
        index.note_terminating(&uid, pod.as_ref());
    }
    if relisted {
        index.rebuild_terminating();
        index.mark_all();
    }
    if let Some(uid) = &concerns {
        index.mark(uid);
    }
    relisted || concerns.is_some() || index.shared_changes() != shared_before
}

fn unwrapped(event: watcher::Event<ListedPod>) -> watcher::Event<Pod> {
    match event {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::InitApply(ListedPod(pod)) => watcher::Event::InitApply(pod),
        watcher::Event::Apply(ListedPod(pod)) => watcher::Event::Apply(pod),
        watcher::Event::Delete(ListedPod(pod)) => watcher::Event::Delete(pod),
    }
}
