//! The one pod watch of every replica, feeding both the reconciler's cache of the pods that
//! carry our IPs and the cluster's IP index from the same events; and where the IPs of the
//! other pods come from ([`watch_pod_ips`]).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use super::super::listed_pod::ListedPod;
use super::super::watches::{Mirror, pod_cache_event};
use super::super::{Caches, PodIpSource};
use super::calico::{IpamBlockObject, watch_ipam_blocks};
use super::{ClusterIps, Relist, RunningPod, SlimOrGone, slim_event, touched};
use crate::metrics::{CacheKindLabels, Metrics};
use ip_webhook_admission::annotations::{ALLOCATED_IP_LABEL, Cni};

/// Where other pods' IPs come from, decided once at start: with `--cni calico` and
/// [`PodIpSource::Auto`], Calico's `IPAMBlock`s if the API server serves them, and then only
/// the pods carrying our label ([`ALLOCATED_IP_LABEL`], which `/mutate` writes on every pod it
/// gives an IP and `/validate` keeps) are watched whole; otherwise every pod, whole. Measured at
/// 100,000 pods: the whole-pod list is 552 MB, the blocks about 25 MB
/// (docs/performance.md, "What the replica asks the API server for").
pub(crate) async fn watch_pod_ips(
    client: Client,
    caches: Arc<Caches>,
    metrics: Arc<Metrics>,
    app_label: String,
    source: PodIpSource,
    cni: Cni,
) {
    let index = &caches.cluster_ips;
    let blocks: Api<IpamBlockObject> = Api::all(client.clone());
    let from_calico = match (source, cni) {
        (PodIpSource::Auto, Cni::Calico) => calico_ipam_served(&blocks).await,
        (PodIpSource::Pods, _) => Err("--pod-ips-from pods"),
        (_, _) => Err("the CNI is not Calico"),
    };
    match from_calico {
        Ok(()) => {
            index.with_calico_ipam();
            tracing::info!(
                label = ALLOCATED_IP_LABEL,
                "other pods' IPs from Calico's IPAMBlocks; only pods carrying the label are watched whole"
            );
            let ours = watcher::Config::default().labels(ALLOCATED_IP_LABEL);
            let pods = watch_pods(
                Api::all(client),
                caches.clone(),
                metrics.clone(),
                app_label,
                ours,
            );
            futures::join!(pods, watch_ipam_blocks(blocks, caches.clone(), metrics));
        }
        Err(reason) => {
            index.without_calico_ipam();
            tracing::info!(reason, "pods' IPs from every pod, watched whole");
            let all = watcher::Config::default();
            watch_pods(Api::all(client), caches, metrics, app_label, all).await
        }
    }
}

/// Whether `ipamblocks.crd.projectcalico.org` is served, readable and in use: `Err` says why
/// not (absent: Calico's etcd datastore; forbidden: the RBAC rule is missing; no block at all:
/// Calico's IPAM gives no pod an IP here, another IPAM plugin may, and only every pod tells).
/// Any other failure (the API server not reachable yet) is asked again.
async fn calico_ipam_served(blocks: &Api<IpamBlockObject>) -> Result<(), &'static str> {
    let mut wait = Duration::from_millis(200);
    loop {
        match blocks.list(&ListParams::default().limit(1)).await {
            Ok(list) if list.items.is_empty() => {
                return Err("no Calico IPAMBlock exists (yet)");
            }
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => {
                return Err("ipamblocks.crd.projectcalico.org is not served");
            }
            Err(kube::Error::Api(status)) if status.code == 403 => {
                tracing::warn!(
                    "listing Calico IPAMBlocks is forbidden: grant the rule of deploy/rbac.yaml (chart: rbac.calico); every pod is watched whole instead"
                );
                return Err("listing ipamblocks.crd.projectcalico.org is forbidden");
            }
            Err(error) => {
                tracing::warn!(%error, "cannot tell whether Calico's IPAMBlocks are served; asking again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// The one pod watch: the pods `config` selects, whole, since the decisions read
/// `status.podIPs` and `spec.nodeName`, which no metadata-only response carries; read as
/// [`ListedPod`]s, so that only those fields are built. Each event feeds two books: the cache
/// of pods that carry our IPs ([`pod_cache_event`], for the reconciler) and the cluster's IP
/// index. Each pod is slimmed as its event arrives and dropped at once.
pub(crate) async fn watch_pods(
    api: Api<ListedPod>,
    caches: Arc<Caches>,
    metrics: Arc<Metrics>,
    app_label: String,
    config: watcher::Config,
) {
    let mut mirror = Mirror::new();
    let mut relist = Relist { pending: None };
    let gauge = metrics
        .cache_objects
        .get_or_create_owned(&CacheKindLabels { kind: "pod" });
    let stream = watcher(api, config).default_backoff();
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
    relist: &mut Relist<RunningPod>,
    event: watcher::Event<Pod>,
) -> bool {
    let Some(event) = slim_event(event, |pod: &Pod| {
        Some(SlimOrGone {
            key: pod.metadata.uid.as_deref()?.into(),
            value: RunningPod::from_pod_labelled(pod, index.app_label()),
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
