//! The Kube-OVN reservation keeper (`--kube-ovn-reservation`): the leader keeps one Kube-OVN
//! `IPPool` (`ippools.kubeovn.io`) per Subnet, named `ip-webhook-<subnet>`, over the IPs of our
//! lists and pools that lie in that Subnet. Kube-OVN's random allocation from a Subnet skips
//! every IPPool's range, while a static request (`ovn.kubernetes.io/ip_address`) for an IP in
//! an IPPool is still served (see docs/kube-ovn.md, "Reservation", for the sources). The pools
//! bind no namespace, so no pod draws from them at random either.
//!
//! IPs already in another (not ours) Kube-OVN IPPool are left out: Kube-OVN refuses IPPools of
//! one Subnet that overlap. A pool with nothing left to hold is deleted.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Api;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::lease::LeaderTicks;
use super::parts::Offered;
use super::watches::{Change, Mirror, drive};
use super::{Caches, lock};
use crate::decisions::cni_pools::{KUBE_OVN_GROUP, OvnSubnet};
use ip_webhook_ipam::ipset::{IpRange, IpSet, ip_key};

/// Our IPPools are named this plus the Subnet's name.
pub(crate) const POOL_PREFIX: &str = "ip-webhook-";
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "ip-webhook");

/// Kube-OVN `IPPool`s (`kubeovn.io/v1`, cluster-scoped).
pub(crate) fn kube_ovn_ippools() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(KUBE_OVN_GROUP, "v1", "IPPool"),
        "ippools",
    )
}

/// The name of our IPPool in `subnet`.
pub(crate) fn pool_name(subnet: &str) -> String {
    format!("{POOL_PREFIX}{subnet}")
}

/// A Kube-OVN IPPool as the keeper sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OvnPool {
    pub(crate) subnet: String,
    /// `spec.ips` as written.
    pub(crate) ips: Vec<String>,
    /// What `spec.ips` covers.
    pub(crate) set: IpSet,
    /// Ours: labelled managed-by ip-webhook and named `ip-webhook-<subnet>`.
    pub(crate) ours: bool,
}

impl OvnPool {
    pub(crate) fn from_object(object: &DynamicObject) -> Option<OvnPool> {
        let name = object.metadata.name.as_deref()?;
        let spec = object.data.get("spec").unwrap_or(&Value::Null);
        let subnet = spec.get("subnet").and_then(Value::as_str).unwrap_or("");
        let ips: Vec<String> = spec
            .get("ips")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        let ours = object
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(MANAGED_BY.0))
            .is_some_and(|v| v == MANAGED_BY.1)
            && name == pool_name(subnet);
        Some(OvnPool {
            subnet: subnet.to_string(),
            set: parse_entries(&ips),
            ips,
            ours,
        })
    }
}

/// Kube-OVN's IPPool entry formats: `IP`, `CIDR`, `IP1..IP2`. Junk is skipped.
fn parse_entries(entries: &[String]) -> IpSet {
    let mut ranges = Vec::new();
    for entry in entries {
        let entry = entry.trim();
        if let Some((a, b)) = entry.split_once("..") {
            if let (Ok(a), Ok(b)) = (a.trim().parse::<IpAddr>(), b.trim().parse::<IpAddr>()) {
                let ((family, start), (other, end)) = (ip_key(&a), ip_key(&b));
                if family == other && start <= end {
                    ranges.push(IpRange { family, start, end });
                }
            }
        } else if let Ok(net) = entry.parse::<ipnet::IpNet>() {
            ranges.push(IpRange::from_net_all(&net.trunc()));
        } else if let Ok(ip) = entry.parse() {
            ranges.push(IpRange::single(ip));
        }
    }
    IpSet::from_ranges(ranges)
}

/// `set` as Kube-OVN IPPool entries: `IP` or `IP1..IP2`, one per range.
pub(crate) fn entries(set: &IpSet) -> Vec<String> {
    set.ranges()
        .iter()
        .map(|r| {
            if r.first() == r.last() {
                r.first().to_string()
            } else {
                format!("{}..{}", r.first(), r.last())
            }
        })
        .collect()
}

fn intersect(a: &IpSet, b: &IpSet) -> IpSet {
    a.subtract(&a.subtract(b))
}

/// The IPPools we should have: per Subnet, the `wanted` IPs inside its CIDRs and outside
/// every IPPool that is not ours. Subnets with none get no pool.
pub(crate) fn desired_pools(
    wanted: &IpSet,
    subnets: &BTreeMap<String, OvnSubnet>,
    pools: &BTreeMap<String, OvnPool>,
) -> BTreeMap<String, (String, Vec<String>)> {
    let foreign = pools
        .values()
        .filter(|p| !p.ours)
        .fold(IpSet::default(), |union, p| union.union(&p.set));
    let mut out = BTreeMap::new();
    for (name, subnet) in subnets {
        let ips = intersect(wanted, &subnet.cidrs).subtract(&foreign);
        if !ips.is_empty() {
            out.insert(pool_name(name), (name.clone(), entries(&ips)));
        }
    }
    out
}

/// What the keeper's watches learned.
#[derive(Default)]
pub(crate) struct OvnReservationState {
    subnets: Mutex<BTreeMap<String, OvnSubnet>>,
    pools: Mutex<BTreeMap<String, OvnPool>>,
    subnets_synced: AtomicBool,
    pools_synced: AtomicBool,
}

impl OvnReservationState {
    pub(crate) fn synced(&self) -> bool {
        self.subnets_synced.load(Ordering::SeqCst) && self.pools_synced.load(Ordering::SeqCst)
    }
}

fn apply<T>(map: &Mutex<BTreeMap<String, T>>, synced: &AtomicBool, change: Change<T>) {
    let mut map = lock(map);
    match change {
        Change::Upsert(name, value) => {
            map.insert(name, value);
        }
        Change::Delete(name) => {
            map.remove(&name);
        }
        Change::Replace(all) => {
            *map = all.into_iter().collect();
            synced.store(true, Ordering::SeqCst);
        }
        Change::Nothing => {}
    }
}

/// Kube-OVN Subnets (their CIDRs) for the keeper.
pub(crate) async fn watch_subnets(api: Api<DynamicObject>, state: Arc<OvnReservationState>) {
    let mut mirror = Mirror::new();
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    drive(stream, "kube-ovn subnets (reservation)", None, |event| {
        let change = mirror.step(
            &event,
            |o: &DynamicObject| o.metadata.name.clone(),
            |o| {
                let spec = o.data.get("spec").unwrap_or(&Value::Null);
                OvnSubnet::from_json(o.metadata.name.as_deref()?, spec).ok()
            },
        );
        apply(&state.subnets, &state.subnets_synced, change);
    })
    .await
}

/// Kube-OVN IPPools, ours and others'.
pub(crate) async fn watch_pools(api: Api<DynamicObject>, state: Arc<OvnReservationState>) {
    let mut mirror = Mirror::new();
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    drive(stream, "kube-ovn ippools", None, |event| {
        let change = mirror.step(
            &event,
            |o: &DynamicObject| o.metadata.name.clone(),
            OvnPool::from_object,
        );
        apply(&state.pools, &state.pools_synced, change);
    })
    .await
}

/// The keeper's tasks: the watches of Kube-OVN Subnets and IPPools, and the leader's
/// `keep_pools` over them and `offered`, looking every `every`.
pub(crate) fn spawn(
    client: &kube::Client,
    offered: Offered,
    caches: Arc<Caches>,
    leading: &watch::Receiver<bool>,
    every: Duration,
) -> Vec<tokio::task::JoinHandle<()>> {
    let state = Arc::new(OvnReservationState::default());
    let pools = Api::all_with(client.clone(), &kube_ovn_ippools());
    vec![
        tokio::spawn(watch_subnets(
            Api::all_with(client.clone(), &super::cni::kube_ovn_subnets()),
            state.clone(),
        )),
        tokio::spawn(watch_pools(pools.clone(), state.clone())),
        tokio::spawn(keep_pools(
            pools,
            offered,
            caches,
            state,
            leading.clone(),
            every,
        )),
    ]
}

/// The leader keeps our IPPools equal to [`desired_pools`]: created, patched (grown or shrunk)
/// and deleted as our lists, pools and the Subnets change. Nothing happens until the Subnets,
/// the IPPools and our own caches have synced.
pub(crate) async fn keep_pools(
    api: Api<DynamicObject>,
    offered: Offered,
    caches: Arc<Caches>,
    state: Arc<OvnReservationState>,
    leading: watch::Receiver<bool>,
    every: Duration,
) {
    let mut ticks = LeaderTicks::new(every, leading);
    loop {
        ticks.next(|| state.synced() && caches.synced()).await;
        sync_once(&api, &offered, &state).await;
    }
}

async fn sync_once(api: &Api<DynamicObject>, offered: &Offered, state: &OvnReservationState) {
    let current = lock(&state.pools).clone();
    let desired = desired_pools(&offered.ips(), &lock(&state.subnets), &current);
    let mut keep: HashSet<&str> = HashSet::new();
    for (name, (subnet, ips)) in &desired {
        keep.insert(name);
        let result = match current.get(name) {
            Some(pool) if pool.ours && pool.subnet == *subnet && pool.ips == *ips => continue,
            Some(pool) if !pool.ours => {
                tracing::warn!(
                    pool = name,
                    "a Kube-OVN IPPool of this name exists and is not ip-webhook's; not touching it"
                );
                continue;
            }
            Some(_) => patch_pool(api, name, ips).await,
            None => create_pool(api, name, subnet, ips).await,
        };
        match result {
            Ok(()) => {
                tracing::info!(
                    pool = name,
                    subnet,
                    ranges = ips.len(),
                    "Kube-OVN IPPool updated"
                );
                lock(&state.pools).insert(
                    name.clone(),
                    OvnPool {
                        subnet: subnet.clone(),
                        set: parse_entries(ips),
                        ips: ips.clone(),
                        ours: true,
                    },
                );
            }
            Err(error) => tracing::warn!(%error, pool = name, "could not write Kube-OVN IPPool"),
        }
    }
    for (name, pool) in &current {
        if !pool.ours || keep.contains(name.as_str()) {
            continue;
        }
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(
                    pool = name,
                    "Kube-OVN IPPool deleted: nothing left to reserve"
                );
                lock(&state.pools).remove(name);
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                lock(&state.pools).remove(name);
            }
            Err(error) => tracing::warn!(%error, pool = name, "could not delete Kube-OVN IPPool"),
        }
    }
}

async fn patch_pool(
    api: &Api<DynamicObject>,
    name: &str,
    ips: &[String],
) -> Result<(), kube::Error> {
    let patch = json!({"spec": {"ips": ips}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
}

async fn create_pool(
    api: &Api<DynamicObject>,
    name: &str,
    subnet: &str,
    ips: &[String],
) -> Result<(), kube::Error> {
    let mut object = DynamicObject::new(name, &kube_ovn_ippools())
        .data(json!({"spec": {"subnet": subnet, "ips": ips}}));
    object.metadata.labels = Some([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())].into());
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        // Made meanwhile (by a previous leader): bring it in line.
        Err(kube::Error::Api(status)) if status.code == 409 => patch_pool(api, name, ips).await,
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ip_webhook_ipam::ipset::parse_ip_spec;

    fn set(spec: &str) -> IpSet {
        parse_ip_spec(spec).unwrap()
    }

    fn subnet(name: &str, cidr: &str) -> (String, OvnSubnet) {
        (
            name.to_string(),
            OvnSubnet::from_json(name, &json!({"cidrBlock": cidr})).unwrap(),
        )
    }

    fn pool(subnet: &str, ips: &[&str], ours: bool) -> OvnPool {
        let ips: Vec<String> = ips.iter().map(|s| s.to_string()).collect();
        OvnPool {
            subnet: subnet.into(),
            set: parse_entries(&ips),
            ips,
            ours,
        }
    }

    #[test]
    fn one_pool_per_subnet_over_our_ips_outside_foreign_pools() {
        let subnets: BTreeMap<_, _> = [
            subnet("ovn-default", "10.16.0.0/16"),
            subnet("net2", "10.17.0.0/24"),
            subnet("empty", "10.99.0.0/24"),
        ]
        .into();
        let pools: BTreeMap<String, OvnPool> = [
            (
                "theirs".to_string(),
                pool("ovn-default", &["10.16.0.12"], false),
            ),
            (
                "ip-webhook-ovn-default".to_string(),
                pool("ovn-default", &["10.16.0.200"], true),
            ),
        ]
        .into();
        let wanted = set("10.16.0.10-10.16.0.13,10.17.0.5,10.50.0.1");
        let desired = desired_pools(&wanted, &subnets, &pools);
        assert_eq!(
            desired,
            [
                (
                    "ip-webhook-net2".to_string(),
                    ("net2".to_string(), vec!["10.17.0.5".to_string()])
                ),
                (
                    "ip-webhook-ovn-default".to_string(),
                    (
                        "ovn-default".to_string(),
                        vec![
                            "10.16.0.10..10.16.0.11".to_string(),
                            "10.16.0.13".to_string()
                        ]
                    )
                ),
            ]
            .into()
        );
    }

    #[test]
    fn kube_ovn_entry_formats_are_read() {
        let entries: Vec<String> = [
            "10.16.0.201",
            "10.16.0.210/30",
            "10.16.0.220..10.16.0.222",
            "junk",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            parse_entries(&entries).to_string(),
            "10.16.0.201,10.16.0.208-10.16.0.211,10.16.0.220-10.16.0.222"
        );
    }

    #[test]
    fn ours_needs_the_label_and_the_name() {
        let object = |name: &str, labelled: bool| -> DynamicObject {
            let mut meta = json!({"name": name});
            if labelled {
                meta["labels"] = json!({"app.kubernetes.io/managed-by": "ip-webhook"});
            }
            serde_json::from_value(json!({
                "apiVersion": "kubeovn.io/v1", "kind": "IPPool", "metadata": meta,
                "spec": {"subnet": "net1", "ips": ["10.0.0.1"]},
            }))
            .unwrap()
        };
        assert!(
            OvnPool::from_object(&object("ip-webhook-net1", true))
                .unwrap()
                .ours
        );
        assert!(
            !OvnPool::from_object(&object("ip-webhook-net1", false))
                .unwrap()
                .ours
        );
        assert!(!OvnPool::from_object(&object("other", true)).unwrap().ours);
    }
}
