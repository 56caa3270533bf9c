//! The CNI's own objects in-cluster: Calico `IPPool`s and `IPReservation`s, or Kube-OVN
//! `Subnet`s, watched into the webhook's `NetworkRegistry`
//! when their CRDs exist; and, on the leader, the one Calico `IPReservation` that keeps
//! Calico's automatic assignment away from every IP ip-webhook may hand out.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::lease::LeaderTicks;
use super::parts::Offered;
use super::watches::{Change, Mirror};
use super::{Caches, lock};
use crate::decisions::cni_pools::{CalicoPool, NetworkRegistry, OvnSubnet};
use ip_webhook_admission::annotations::CniObject;
use ip_webhook_ipam::ipset::{IpRange, IpSet, parse_ip};

/// The IPReservation ip-webhook keeps (remove it by hand after uninstalling).
pub(crate) const RESERVATION_NAME: &str = "ip-webhook-fixed-ips";

/// The API resource of a CNI object kind a replica reads.
pub(crate) fn api_resource(object: CniObject) -> ApiResource {
    let (group, version, kind, plural) = object.resource();
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

pub(crate) fn calico_reservations() -> ApiResource {
    api_resource(CniObject::CalicoIpReservations)
}

pub(crate) fn kube_ovn_subnets() -> ApiResource {
    api_resource(CniObject::KubeOvnSubnets)
}

/// What the IPReservation watch learned that the reservation keeper needs.
#[derive(Default)]
pub(crate) struct ReservationState {
    /// `spec.reservedCIDRs` of ip-webhook's own IPReservation; `None` while it does not exist.
    ours: Mutex<Option<Vec<String>>>,
    /// The IPReservation list succeeded: the CRD is served and `ours` is known.
    served: AtomicBool,
}

impl ReservationState {
    pub(crate) fn served(&self) -> bool {
        self.served.load(Ordering::SeqCst)
    }

    pub(crate) fn ours(&self) -> Option<Vec<String>> {
        lock(&self.ours).clone()
    }
}

/// The HTTP status of a failed list or watch start, if the API server answered.
fn status_code(error: &watcher::Error) -> Option<u16> {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => Some(status.code),
        _ => None,
    }
}

/// Run a watch of `api`; a resource the API server does not serve (its CRD is absent) is
/// retried with backoff quietly, so the CRD may be installed later.
async fn watch_objects(
    api: Api<DynamicObject>,
    what: &'static str,
    mut on_event: impl FnMut(watcher::Event<DynamicObject>),
) {
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut told_forbidden = false;
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => on_event(event),
            Err(error) => match status_code(&error) {
                Some(404) => {
                    tracing::debug!(watch = what, "not served (CRD absent?); retrying later")
                }
                Some(403) if told_forbidden => {
                    tracing::debug!(%error, watch = what, "still forbidden; retrying later")
                }
                Some(403) => {
                    told_forbidden = true;
                    tracing::warn!(
                        %error,
                        watch = what,
                        "forbidden: grant the CNI rules of deploy/rbac.yaml (chart: rbac.calico / rbac.kubeOvn); the CNI checks stay off until then"
                    )
                }
                _ => tracing::warn!(%error, watch = what, "watch error; retrying with backoff"),
            },
        }
    }
}

fn name_of(object: &DynamicObject) -> Option<String> {
    object.metadata.name.clone()
}

fn spec_of(object: &DynamicObject) -> &Value {
    object.data.get("spec").unwrap_or(&Value::Null)
}

/// Keep a set of names in step with a [`Change`], calling `upsert`/`forget` on the registry.
fn apply_change<T>(
    known: &mut HashSet<String>,
    change: Change<T>,
    mut upsert: impl FnMut(T),
    mut forget: impl FnMut(&str),
) -> bool {
    match change {
        Change::Upsert(name, value) => {
            known.insert(name);
            upsert(value);
        }
        Change::Delete(name) => {
            known.remove(&name);
            forget(&name);
        }
        Change::Replace(all) => {
            for gone in known.iter().filter(|n| !all.contains_key(*n)) {
                forget(gone);
            }
            *known = all.keys().cloned().collect();
            all.into_values().for_each(upsert);
            return true;
        }
        Change::Nothing => {}
    }
    false
}

/// Calico IPPools into the registry; the Calico checks start once the first list is in.
pub(crate) async fn watch_calico_pools(api: Api<DynamicObject>, networks: Arc<NetworkRegistry>) {
    let mut mirror = Mirror::new();
    let mut known = HashSet::new();
    watch_objects(api, "calico ippools", |event| {
        let change = mirror.step(&event, name_of, |object| {
            let name = name_of(object)?;
            CalicoPool::from_json(&name, spec_of(object))
                .inspect_err(|error| tracing::warn!(%error, "ignoring a Calico IPPool"))
                .ok()
        });
        if apply_change(
            &mut known,
            change,
            |pool| networks.upsert_calico_pool(pool),
            |name| networks.forget_calico_pool(name),
        ) {
            networks.set_calico_synced(true);
        }
    })
    .await
}

/// `spec.reservedCIDRs` of an IPReservation: the raw list and the IPs it covers.
fn reserved_cidrs(object: &DynamicObject) -> (Vec<String>, IpSet) {
    let raw: Vec<String> = spec_of(object)
        .get("reservedCIDRs")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let mut ranges = Vec::new();
    for entry in &raw {
        if let Ok(net) = entry.parse::<ipnet::IpNet>() {
            ranges.push(IpRange::from_net_all(&net.trunc()));
        } else if let Ok(ip) = parse_ip(entry) {
            ranges.push(IpRange::single(ip));
        } else {
            tracing::warn!(
                reservation = object.metadata.name.as_deref().unwrap_or(""),
                entry,
                "ignoring a reservedCIDRs entry that is not a CIDR or IP"
            );
        }
    }
    (raw, IpSet::from_ranges(ranges))
}

/// Calico IPReservations: their union tells the Calico check which IPs automatic assignment
/// skips, and ip-webhook's own one is remembered for the keeper.
pub(crate) async fn watch_calico_reservations(
    api: Api<DynamicObject>,
    networks: Arc<NetworkRegistry>,
    state: Arc<ReservationState>,
) {
    let mut mirror = Mirror::new();
    let mut all: BTreeMap<String, (Vec<String>, IpSet)> = BTreeMap::new();
    watch_objects(api, "calico ipreservations", |event| {
        let change = mirror.step(&event, name_of, |object| Some(reserved_cidrs(object)));
        match change {
            Change::Upsert(name, value) => {
                all.insert(name, value);
            }
            Change::Delete(name) => {
                all.remove(&name);
            }
            Change::Replace(fresh) => {
                all = fresh.into_iter().collect();
                state.served.store(true, Ordering::SeqCst);
            }
            Change::Nothing => return,
        }
        *lock(&state.ours) = all.get(RESERVATION_NAME).map(|(raw, _)| raw.clone());
        networks.set_calico_reserved(
            all.values()
                .fold(IpSet::default(), |union, (_, set)| union.union(set)),
        );
    })
    .await
}

/// Kube-OVN Subnets into the registry; the Kube-OVN checks start once the first list is in.
pub(crate) async fn watch_subnets(api: Api<DynamicObject>, networks: Arc<NetworkRegistry>) {
    let mut mirror = Mirror::new();
    let mut known = HashSet::new();
    watch_objects(api, "kube-ovn subnets", |event| {
        let change = mirror.step(&event, name_of, |object| {
            let name = name_of(object)?;
            OvnSubnet::from_json(&name, spec_of(object))
                .inspect_err(|error| tracing::warn!(%error, "ignoring a Kube-OVN Subnet"))
                .ok()
        });
        if apply_change(
            &mut known,
            change,
            |subnet| networks.upsert_subnet(subnet),
            |name| networks.forget_subnet(name),
        ) {
            networks.set_ovn_synced(true);
        }
    })
    .await
}

/// Every IP ip-webhook may hand out ([`Offered`]) as the fewest CIDRs.
pub(crate) fn desired_reservation(offered: &Offered) -> Vec<String> {
    let all = offered.ips();
    all.to_cidrs().iter().map(ToString::to_string).collect()
}

/// The leader keeps [`RESERVATION_NAME`] equal to [`desired_reservation`]: created when there
/// is something to reserve, updated (grown or shrunk) as IPPools and workload lists change.
/// Nothing happens until the IPReservation CRD is known to be served and the IPPools synced.
pub(crate) async fn keep_reservation(
    api: Api<DynamicObject>,
    offered: Offered,
    caches: Arc<Caches>,
    state: Arc<ReservationState>,
    leading: watch::Receiver<bool>,
    every: Duration,
) {
    let mut ticks = LeaderTicks::new(every, leading);
    loop {
        ticks.next(|| state.served() && caches.synced()).await;
        let desired = desired_reservation(&offered);
        let current = state.ours();
        let result = match current {
            Some(current) if current == desired => continue,
            None if desired.is_empty() => continue,
            Some(_) => patch_reservation(&api, &desired).await,
            None => create_reservation(&api, &desired).await,
        };
        match result {
            Ok(()) => {
                tracing::info!(
                    cidrs = desired.len(),
                    "Calico IPReservation {RESERVATION_NAME} updated"
                );
                *lock(&state.ours) = Some(desired);
            }
            Err(error) => {
                tracing::warn!(%error, "could not write Calico IPReservation {RESERVATION_NAME}")
            }
        }
    }
}

async fn patch_reservation(api: &Api<DynamicObject>, cidrs: &[String]) -> Result<(), kube::Error> {
    let patch = json!({"spec": {"reservedCIDRs": cidrs}});
    api.patch(
        RESERVATION_NAME,
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map(drop)
}

async fn create_reservation(api: &Api<DynamicObject>, cidrs: &[String]) -> Result<(), kube::Error> {
    let mut object = DynamicObject::new(RESERVATION_NAME, &calico_reservations())
        .data(json!({"spec": {"reservedCIDRs": cidrs}}));
    object.metadata.labels = Some(
        [(
            "app.kubernetes.io/managed-by".to_string(),
            "ip-webhook".to_string(),
        )]
        .into(),
    );
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        // Made meanwhile (by a previous leader): bring it in line.
        Err(kube::Error::Api(status)) if status.code == 409 => patch_reservation(api, cidrs).await,
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_cidrs_accept_cidrs_and_plain_ips_and_skip_junk() {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "crd.projectcalico.org/v1", "kind": "IPReservation",
            "metadata": {"name": "r"},
            "spec": {"reservedCIDRs": ["10.0.0.0/30", "10.0.1.7", "fd00::/127", "nonsense"]},
        }))
        .unwrap();
        let (raw, set) = reserved_cidrs(&object);
        assert_eq!(raw.len(), 4);
        assert_eq!(set.to_string(), "10.0.0.0-10.0.0.3,10.0.1.7,fd00::-fd00::1");
    }

    #[test]
    fn a_relist_forgets_what_is_gone() {
        let mut known: HashSet<String> = ["a".to_string(), "b".to_string()].into();
        let mut upserted = Vec::new();
        let mut forgotten = Vec::new();
        let fresh: super::super::watches::MirrorMap<u8> =
            [("b".to_string(), 2), ("c".to_string(), 3)]
                .into_iter()
                .collect();
        let replaced = apply_change(
            &mut known,
            Change::Replace(fresh),
            |v| upserted.push(v),
            |n| forgotten.push(n.to_string()),
        );
        assert!(replaced);
        upserted.sort();
        assert_eq!(upserted, [2, 3]);
        assert_eq!(forgotten, ["a"]);
        assert_eq!(known, ["b".to_string(), "c".to_string()].into());
    }
}
