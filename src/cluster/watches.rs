//! The watches of in-cluster mode: each keeps a map of [`super::Caches`] in step with the API
//! server ([`Mirror`]) and does its own work on each change (the allocator's index, the pool
//! catalog).
//!
//! Why not `kube_runtime::reflector`: its store keeps every object whole, while these keep
//! what the decisions read (a pod is a [`super::ClaimingPod`] of a few fields, and only pods that
//! carry an IP), and each change has to reach the allocator or the catalog as it happens,
//! which a store read after the fact would not give. The stream underneath is
//! `kube_runtime::watcher` with its backoff.

use crate::decisions::kubevirt::launcher_vm_of_object;
use crate::metrics::watch_health::WatchHealth;
use futures::{Stream, StreamExt};
use ip_webhook_admission::annotations::{CLAIM_TOKEN, carried_ips};
use ip_webhook_admission::networks::pod_network_ips;
use ip_webhook_ipam::allocator::Allocator;
use ip_webhook_ipam::pools::{Pool, PoolCatalog, PoolError};
use ip_webhook_ledger::claim::is_token;
use ip_webhook_ledger::crd::{FixedIPPool, IPClaim};
use ip_webhook_ledger::kubernetes::{PRIMARY_SELECTOR, from_resource};
use ip_webhook_ledger::network::Network;
use ip_webhook_ledger::{ObservedChange, unix_now};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::*;

pub(super) fn unix(time: Option<&Time>) -> u64 {
    time.and_then(|Time(t)| u64::try_from(t.as_second()).ok())
        .unwrap_or_else(unix_now)
}

/// The compact record of a pod, or `None` when the pod carries no IP we track.
pub(crate) fn claiming_pod(meta: &ObjectMeta, app_label: &str) -> Option<ClaimingPod> {
    let ips = carried_ips(meta.labels.as_ref(), meta.annotations.as_ref());
    claiming_pod_with(meta, app_label, ips)
}

/// The compact record of a pod as a secondary network's books see it: the IPs it carries on
/// `network` ([`ip_webhook_admission::networks::carried_on`], the reading admission and DELETE
/// use); `None` when it carries none.
pub(crate) fn network_claiming_pod(
    meta: &ObjectMeta,
    app_label: &str,
    network: &Network,
) -> Option<ClaimingPod> {
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let (_, ips) = pod_network_ips(meta.annotations.as_ref(), namespace, [network])?.pop()?;
    claiming_pod_with(meta, app_label, ips)
}

fn claiming_pod_with(meta: &ObjectMeta, app_label: &str, ips: Vec<IpAddr>) -> Option<ClaimingPod> {
    if ips.is_empty() {
        return None;
    }
    bare_claiming_pod(meta, app_label, ips)
}

/// The compact record of any pod, with `ips` as the IPs it carries (maybe none): what the
/// rules read of a pod a claim names by UID, whatever it carries now.
pub(super) fn bare_claiming_pod(
    meta: &ObjectMeta,
    app_label: &str,
    ips: Vec<IpAddr>,
) -> Option<ClaimingPod> {
    Some(ClaimingPod {
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
        vm: launcher_vm_of_object(meta).map(str::to_string),
    })
}

/// Keeps a map in step with a watch stream: the `Init` … `InitDone` of a (re)list replaces it
/// whole, so a delete missed while disconnected cannot linger.
pub(super) struct Mirror<T> {
    pending: Option<MirrorMap<T>>,
}

/// A (re)list's objects by key, hashed as the pod cache ([`PodMap`]) is, so that a relist of
/// pods becomes the cache as it is.
pub(super) type MirrorMap<T> = HashMap<String, T, foldhash::fast::RandomState>;

pub(super) enum Change<T> {
    Upsert(String, T),
    Delete(String),
    Replace(MirrorMap<T>),
    Nothing,
}

impl<T> Mirror<T> {
    pub(super) fn new() -> Mirror<T> {
        Mirror { pending: None }
    }

    pub(super) fn step<K>(
        &mut self,
        event: &watcher::Event<K>,
        key: impl Fn(&K) -> Option<String>,
        value: impl Fn(&K) -> Option<T>,
    ) -> Change<T> {
        match event {
            watcher::Event::Init => {
                self.pending = Some(MirrorMap::default());
                Change::Nothing
            }
            watcher::Event::InitApply(object) => {
                if let (Some(pending), Some(k), Some(v)) =
                    (self.pending.as_mut(), key(object), value(object))
                {
                    pending.insert(k, v);
                }
                Change::Nothing
            }
            watcher::Event::InitDone => Change::Replace(self.pending.take().unwrap_or_default()),
            watcher::Event::Apply(object) => match (key(object), value(object)) {
                (Some(k), Some(v)) => Change::Upsert(k, v),
                (Some(k), None) => Change::Delete(k),
                _ => Change::Nothing,
            },
            watcher::Event::Delete(object) => match key(object) {
                Some(k) => Change::Delete(k),
                None => Change::Nothing,
            },
        }
    }
}

/// Feed a watch's events to `on_event`; `health` (for the watches admission decisions read)
/// learns whether it is live.
pub(super) async fn drive<K, S, F>(
    stream: S,
    what: &'static str,
    health: Option<&WatchHealth>,
    mut on_event: F,
) where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    F: FnMut(watcher::Event<K>),
{
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => {
                if let Some(health) = health {
                    health.ok(what);
                }
                on_event(event)
            }
            Err(error) => {
                if let Some(health) = health {
                    health.failed(what);
                }
                tracing::warn!(%error, watch = what, "watch error; retrying with backoff")
            }
        }
    }
}

/// One pod event into the cache of pods that carry an IP ([`ClaimingPod`] keyed by UID, read
/// from the pod's metadata): whether it changed anything the reconciler acts on. The pod
/// watch itself is [`super::index::watch_pods`], which feeds the cluster's IP index from the
/// same events.
pub(super) fn pod_cache_event(
    caches: &Caches,
    mirror: &mut Mirror<ClaimingPod>,
    event: &watcher::Event<Pod>,
    app_label: &str,
) -> bool {
    let change = mirror.step(
        event,
        |pod: &Pod| pod.metadata.uid.clone(),
        |pod| claiming_pod(&pod.metadata, app_label),
    );
    let relisted = matches!(change, Change::Replace(_));
    let key = match &change {
        Change::Upsert(uid, _) | Change::Delete(uid) => Some(uid.clone()),
        Change::Replace(_) | Change::Nothing => None,
    };
    let mut pods = lock(&caches.pods);
    let changed = apply_pod_change(&mut pods, change);
    if changed {
        caches.note_pod_change(&pods, key.as_deref());
    }
    drop(pods);
    if relisted {
        *lock(&caches.pods_listed_at) = Some(tokio::time::Instant::now());
        caches.pods_synced.store(true, Ordering::SeqCst);
    }
    changed
}

/// Apply one change to the pod cache; whether it changed anything (a relist always counts).
/// The cache is shared with the pass that last read it ([`Caches::pod_map`]): it is copied
/// only when a change comes while a pass still holds it, never for a change that is none.
pub(super) fn apply_pod_change(pods: &mut Arc<PodMap>, change: Change<ClaimingPod>) -> bool {
    match change {
        Change::Upsert(uid, info) => {
            if pods.get(&uid) == Some(&info) {
                return false;
            }
            Arc::make_mut(pods).insert(uid, info);
            true
        }
        Change::Delete(uid) => {
            pods.contains_key(&uid) && Arc::make_mut(pods).remove(&uid).is_some()
        }
        Change::Replace(all) => {
            *pods = Arc::new(all);
            true
        }
        Change::Nothing => false,
    }
}

/// Keep a secondary network's allocator in step with that network's IPClaims, as the claim
/// watch does the primary interface's: another replica's claims and releases reach this
/// replica's copy as they happen, so its choices stay fresh and a release made elsewhere makes
/// the IP choosable here again. (Safety never depends on it: every write asks the ledger.)
pub(crate) async fn watch_network_claims(
    api: Api<IPClaim>,
    network: Network,
    allocator: Arc<Allocator>,
) {
    let mut mirror = Mirror::new();
    let config = watcher::Config::default().labels(&network.selector());
    let stream = watcher(api, config).default_backoff();
    drive(stream, "network ipclaims", None, |event| {
        if let watcher::Event::Delete(gone) = &event {
            if let Ok(claim) = from_resource(gone) {
                allocator.apply_observed(ObservedChange::Released(claim));
            }
            return;
        }
        let change = mirror.step(
            &event,
            |claim: &IPClaim| claim.metadata.name.clone(),
            |claim| from_resource(claim).ok(),
        );
        match change {
            // an IPClaim locks its IP for as long as it exists, whatever its phase
            Change::Upsert(_, claim) => {
                allocator.apply_observed(ObservedChange::Held(claim));
            }
            Change::Replace(all) => allocator.replace_all(all.into_values().collect()),
            Change::Delete(_) | Change::Nothing => {}
        }
    })
    .await
}

/// IPClaims, fed into the allocator's index as they change.
pub(crate) async fn watch_claims(
    api: Api<IPClaim>,
    caches: Arc<Caches>,
    allocator: Arc<Allocator>,
) {
    let mut mirror = Mirror::new();
    // the primary interface's claims; a secondary network's are its sweeper's
    let config = watcher::Config::default().labels(PRIMARY_SELECTOR);
    let stream = watcher(api, config).default_backoff();
    drive(stream, "ipclaims", Some(&caches.health), |event| {
        let change = mirror.step(
            &event,
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
                    Err(error) => ip_webhook_ledger::skip_corrupt(
                        &error,
                        "ignoring an IPClaim that cannot be read (its IP stays held)",
                    ),
                }
                caches.claim_list.note(&name);
                caches.note_claim_change(&claims, Some(&name));
                claims.insert(name, claim);
            }
            Change::Delete(name) => {
                caches.claim_list.note(&name);
                caches.note_claim_change(&claims, Some(&name));
                if let Some(gone) = claims.remove(&name)
                    && let Ok(parsed) = from_resource(&gone)
                {
                    allocator.apply_observed(ObservedChange::Released(parsed));
                }
            }
            Change::Replace(all) => {
                caches.claim_list.note_relist();
                caches.note_claim_change(&claims, None);
                allocator.replace_all(all.values().filter_map(|c| from_resource(c).ok()).collect());
                *claims = all.into_iter().collect();
                caches.claims_synced.store(true, Ordering::SeqCst);
            }
            Change::Nothing => return,
        }
        drop(claims);
        caches.mark_changed();
    })
    .await
}

/// Build a catalog from whatever pools are valid, oldest first; a pool that is invalid or
/// overlaps an older one is left out (and logged) rather than taking every pool down. Each
/// pool is checked against the pools accepted so far through the catalog's range index, once:
/// n log n in the pools.
pub(crate) fn tolerant_catalog(pools: &BTreeMap<String, FixedIPPool>) -> PoolCatalog {
    let mut ordered: Vec<&FixedIPPool> = pools.values().collect();
    ordered.sort_by_key(|p| {
        (
            p.metadata.creation_timestamp.as_ref().map(|Time(t)| *t),
            p.metadata.name.clone(),
        )
    });
    let mut catalog = PoolCatalog::default();
    for resource in ordered {
        let pool = match Pool::from_resource(resource) {
            Ok(pool) => pool,
            Err(error) => {
                tracing::warn!(%error, "FixedIPPool left out of the catalog");
                continue;
            }
        };
        if let Some(other) = catalog.overlapping(&pool) {
            let error = PoolError::Overlap {
                pool: pool.name.clone(),
                cidr: pool.cidr.to_string(),
                other: other.name.clone(),
                other_cidr: other.cidr.to_string(),
            };
            tracing::warn!(%error, "FixedIPPool left out of the catalog");
            continue;
        }
        catalog.insert(pool);
    }
    catalog
}

/// IPPools, rebuilt into the webhook's `catalog` on every change.
pub(crate) async fn watch_pools(
    api: Api<FixedIPPool>,
    caches: Arc<Caches>,
    catalog: Arc<arc_swap::ArcSwap<PoolCatalog>>,
) {
    let mut mirror = Mirror::new();
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    drive(stream, "ippools", Some(&caches.health), |event| {
        let change = mirror.step(
            &event,
            |pool: &FixedIPPool| pool.metadata.name.clone(),
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
        catalog.store(Arc::new(tolerant_catalog(&pools)));
        drop(pools);
        caches.mark_changed();
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{ClaimingPod, PodMap};
    use std::collections::BTreeMap;

    fn meta(value: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_claiming_pod_keeps_only_what_the_reconciler_needs() {
        let info = claiming_pod(
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
            ClaimingPod {
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
        assert_eq!(claiming_pod(&plain, "app"), None);
        let replicaset = meta(serde_json::json!({
            "name": "x", "namespace": "d", "uid": "u",
            "labels": {"ip-webhook.io/allocated-ip": "10.0.0.1"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "uid": "r", "controller": true}],
        }));
        assert!(!claiming_pod(&replicaset, "app").unwrap().stateful);
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
        let mut mirror = Mirror::new();
        let mut event = |event: Event<k8s_openapi::api::core::v1::Pod>| {
            pod_cache_event(&caches, &mut mirror, &event, "app")
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
        let info = |ip: &str| ClaimingPod {
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
