//! Calico's own records of which pod holds which IP (`IPAMBlock`s,
//! `ipamblocks.crd.projectcalico.org`), as the pod-IP index keeps them: with them, a replica
//! learns the IPs of every pod of the cluster without listing every pod, and watches whole
//! only the pods that carry our label ([`super::pod_watch::watch_pod_ips`]).
//!
//! Calico's data model (projectcalico/calico: `libcalico-go/lib/apis/internalapi/ipam_block.go`,
//! attribute keys in `libcalico-go/lib/backend/model/block.go`, the CRD in
//! `libcalico-go/config/crd/crd.projectcalico.org_ipamblocks.yaml`): `spec.allocations[i]` is,
//! for the block's i-th address (`spec.cidr` plus i), null when free, else an index into
//! `spec.attributes`; that attribute's `secondary` map holds `namespace`, `pod` and `node`,
//! which Calico's CNI plugin writes for every pod it gives an IP
//! (`cni-plugin/pkg/ipamplugin/ipam_plugin.go`), and `handle_id` names the `IPAMHandle`.
//! Allocations without both `namespace` and `pod` (tunnel addresses) and allocations in their
//! release cooldown (`releasedAt` set) hold no pod's IP.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use k8s_openapi::ClusterResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::Resource;
use kube::runtime::{WatchStreamExt, watcher};
use serde::Deserialize;

use super::super::Caches;
use super::super::app_lists::AppLists;
use super::{ClusterIps, HasIps, Relist, SlimOrGone, read, slim_event, status_code};
use crate::ipam::ipset::{ip_from_key, ip_key};
use crate::ledger::text::Shared;
use crate::metrics::{CacheKindLabels, Metrics};

/// One allocation of a block that names a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamHold {
    pub ip: IpAddr,
    pub namespace: String,
    pub pod: String,
    /// `handle_id`: `k8s-pod-network.<container ID>` for a pod.
    pub handle: String,
}

/// An `IPAMBlock` as read from lists and watches: only the fields the holds are made of.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct IpamBlockObject {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: BlockSpec,
}

/// `spec` of an `IPAMBlock`: what [`BlockSpec::holds`] reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct BlockSpec {
    #[serde(default)]
    cidr: String,
    #[serde(default)]
    allocations: Vec<Option<serde_json::Value>>,
    #[serde(default)]
    attributes: Vec<Attribute>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct Attribute {
    #[serde(default)]
    handle_id: Option<String>,
    #[serde(default)]
    secondary: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(default, rename = "releasedAt")]
    released_at: Option<serde::de::IgnoredAny>,
}

impl BlockSpec {
    /// The allocations that name a pod; junk (a bad CIDR, an index out of range, an entry that
    /// is not a number) gives nothing for that entry, never a panic.
    pub fn holds(&self) -> Vec<IpamHold> {
        let Ok(cidr) = self.cidr.parse::<ipnet::IpNet>() else {
            return Vec::new();
        };
        let (family, base) = ip_key(&cidr.network());
        let size: u128 = 1u128
            .checked_shl(cidr.max_prefix_len().saturating_sub(cidr.prefix_len()) as u32)
            .unwrap_or(u128::MAX);
        let mut holds = Vec::new();
        for (ordinal, entry) in self.allocations.iter().enumerate() {
            let Some(index) = entry.as_ref().and_then(serde_json::Value::as_u64) else {
                continue;
            };
            let Some(attribute) = self.attributes.get(index as usize) else {
                continue;
            };
            if attribute.released_at.is_some() || ordinal as u128 >= size {
                continue;
            }
            let owner = |key: &str| {
                attribute
                    .secondary
                    .as_ref()
                    .and_then(|s| s.get(key))
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("")
            };
            let (namespace, pod) = (owner("namespace"), owner("pod"));
            if namespace.is_empty() || pod.is_empty() {
                continue;
            }
            holds.push(IpamHold {
                ip: ip_from_key(family, base + ordinal as u128),
                namespace: namespace.to_string(),
                pod: pod.to_string(),
                handle: attribute.handle_id.clone().unwrap_or_else(|| "?".into()),
            });
        }
        holds
    }
}

impl Resource for IpamBlockObject {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "IPAMBlock".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "crd.projectcalico.org".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "ipamblocks".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A block as the index keeps it: its IPs that name a pod, and each one's pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamBlock {
    ips: Box<[IpAddr]>,
    /// `(namespace, pod)` of `ips[i]`; the namespace interned (many pods share one).
    owners: Box<[(Shared, Box<str>)]>,
}

impl IpamBlock {
    fn from_holds(holds: Vec<IpamHold>) -> IpamBlock {
        let ips = holds.iter().map(|h| h.ip).collect();
        let owners = holds
            .into_iter()
            .map(|h| (h.namespace.as_str().into(), h.pod.into_boxed_str()))
            .collect();
        IpamBlock { ips, owners }
    }

    /// The pod `ip` is allocated to in this block.
    fn owner(&self, ip: &IpAddr) -> Option<(&Shared, &str)> {
        let at = self.ips.iter().position(|held| held == ip)?;
        let (namespace, pod) = &self.owners[at];
        Some((namespace, pod))
    }
}

impl HasIps for IpamBlock {
    fn ips(&self) -> &[IpAddr] {
        &self.ips
    }
}

/// An IP Calico's IPAM gives a pod, and that pod.
pub struct CalicoHeld {
    pub ip: IpAddr,
    pub namespace: Shared,
    pub pod: Box<str>,
}

impl ClusterIps {
    /// Whether the IPs of pods not ours come from Calico's `IPAMBlock`s (only pods carrying
    /// our label are watched whole), rather than from every pod.
    pub fn uses_calico_ipam(&self) -> bool {
        self.calico_ipam.load(Ordering::SeqCst)
    }

    /// The pod Calico's IPAM allocated `ip` to, if any, and if that pod is not on a lost node
    /// with its claims released.
    pub(super) fn calico_user(&self, ip: &IpAddr) -> Option<(String, String)> {
        let blocks = read(&self.calico);
        let lost = read(&self.lost);
        blocks
            .carriers(ip)
            .filter_map(|block| block.owner(ip))
            .find(|&(namespace, pod)| {
                !lost
                    .values()
                    .any(|(ns, name)| ns.as_str() == namespace.as_str() && &**name == pod)
            })
            .map(|(namespace, pod)| (namespace.to_string(), pod.to_string()))
    }

    /// The IPs Calico gives pods that are on an app's list (`lists` names one app for them),
    /// are not in `claimed`, and on which no indexed pod runs: what the reconciler's list
    /// adoption reads the pods of, since those pods are not watched.
    pub fn listed_calico_holds(
        &self,
        lists: &dyn AppLists,
        claimed: &std::collections::HashSet<IpAddr>,
    ) -> Vec<CalicoHeld> {
        let blocks = read(&self.calico);
        let pods = read(&self.pods);
        let mut found = Vec::new();
        for block in blocks.by_key.values() {
            for (ip, (namespace, pod)) in block.ips.iter().zip(block.owners.iter()) {
                if claimed.contains(ip)
                    || pods.by_ip.contains_key(ip)
                    || lists.sole_app_listing(*ip).is_none()
                {
                    continue;
                }
                found.push(CalicoHeld {
                    ip: *ip,
                    namespace: namespace.clone(),
                    pod: pod.clone(),
                });
            }
        }
        found
    }

    /// Whether a block changed an IP that an app lists since the last call.
    pub fn take_listed_calico_change(&self) -> bool {
        self.listed_calico_change.swap(false, Ordering::SeqCst)
    }

    /// Look at the listed IPs Calico gives again on the next pass (a read failed).
    pub fn note_listed_calico_change(&self) {
        self.listed_calico_change.store(true, Ordering::SeqCst);
    }

    fn lists_any(&self, block: &IpamBlock) -> bool {
        let Some(lists) = self.lists.get() else {
            return true;
        };
        block
            .ips
            .iter()
            .any(|ip| lists.sole_app_listing(*ip).is_some())
    }
}

/// Calico's `IPAMBlock`s into the index. The first list marks the index synced.
pub async fn watch_ipam_blocks(
    api: Api<IpamBlockObject>,
    caches: Arc<Caches>,
    metrics: Arc<Metrics>,
) {
    let index = &caches.cluster_ips;
    let mut relist = Relist { pending: None };
    let gauge = metrics.cache_objects.get_or_create_owned(&CacheKindLabels {
        kind: "calico-ipam-block",
    });
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => {
                caches.health.ok("calico ipamblocks");
                let relisted = matches!(event, watcher::Event::InitDone);
                let Some(event) = slim_event(event, |object: &IpamBlockObject| {
                    Some(SlimOrGone {
                        key: object.metadata.name.as_deref()?.into(),
                        value: Some(IpamBlock::from_holds(object.spec.holds())),
                    })
                }) else {
                    continue;
                };
                let listed = match &event {
                    watcher::Event::Apply(SlimOrGone {
                        value: Some(block), ..
                    }) => index.lists_any(block),
                    watcher::Event::Delete(SlimOrGone { key, .. }) => read(&index.calico)
                        .by_key
                        .get(key)
                        .is_some_and(|block| index.lists_any(block)),
                    _ => false,
                };
                relist.step(&index.calico, &index.calico_synced, event);
                if listed {
                    index.listed_calico_change.store(true, Ordering::SeqCst);
                }
                if relisted || listed {
                    caches.mark_changed();
                }
            }
            Err(error) => {
                caches.health.failed("calico ipamblocks");
                match status_code(&error) {
                    Some(404) => tracing::warn!(
                        "ipamblocks.crd.projectcalico.org no longer served; the IPs of pods not ours stay as last seen"
                    ),
                    _ => {
                        tracing::warn!(%error, watch = "calico ipamblocks", "watch error; retrying")
                    }
                }
            }
        }
        gauge.set(read(&index.calico).by_key.len() as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(value: serde_json::Value) -> BlockSpec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_block_names_the_pod_of_each_allocation() {
        let block = spec(json!({
            "cidr": "10.0.0.0/30",
            "allocations": [null, 0, 1, 2],
            "unallocated": [0],
            "attributes": [
                {"handle_id": "k8s-pod-network.aaa", "secondary": {"namespace": "default", "pod": "web-a", "node": "n1", "timestamp": "2026-01-01 00:00:00.1 +0000 UTC"}},
                {"handle_id": "ipip-tunnel-addr-n1", "secondary": {"node": "n1", "type": "ipipTunnelAddress"}},
                {"handle_id": "k8s-pod-network.ccc", "secondary": {"namespace": "default", "pod": "web-c"}, "releasedAt": "2025-11-29T07:00:00Z"},
            ],
            "strictAffinity": false,
        }));
        assert_eq!(
            block.holds(),
            [IpamHold {
                ip: "10.0.0.1".parse().unwrap(),
                namespace: "default".into(),
                pod: "web-a".into(),
                handle: "k8s-pod-network.aaa".into(),
            }]
        );
        let v6 = spec(json!({"cidr": "fd00::/122", "allocations": [null, null, 0],
            "attributes": [{"handle_id": "h", "secondary": {"namespace": "ns", "pod": "p"}}]}));
        assert_eq!(v6.holds()[0].ip.to_string(), "fd00::2");
        let junk = spec(
            json!({"cidr": "10.0.0.0/31", "allocations": [5, "x", 0, 0, 0],
            "attributes": [{"secondary": {"namespace": "a", "pod": "b"}}]}),
        );
        let holds = junk.holds();
        assert_eq!(holds.len(), 1, "{holds:?}");
        assert_eq!(holds[0].ip.to_string(), "10.0.0.0");
        assert!(
            spec(json!({"cidr": "nonsense", "allocations": [0]}))
                .holds()
                .is_empty()
        );
    }

    #[test]
    fn an_ip_calico_gives_a_pod_is_used_unless_the_pod_was_lost() {
        use crate::ipam::foreign::ForeignIps;
        let index = ClusterIps::default();
        let block = spec(json!({"cidr": "10.1.0.0/26", "allocations": [0, null, 1],
        "attributes": [
            {"handle_id": "k8s-pod-network.a", "secondary": {"namespace": "prod", "pod": "db-0"}},
            {"handle_id": "k8s-pod-network.b", "secondary": {"namespace": "prod", "pod": "api-1"}},
        ]}));
        super::super::write(&index.calico)
            .upsert("10-1-0-0-26".into(), IpamBlock::from_holds(block.holds()));
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            index.user(&ip("10.1.0.0")).unwrap().describe(),
            "pod prod/db-0"
        );
        assert_eq!(index.user(&ip("10.1.0.1")), None);
        assert_eq!(index.user(&ip("10.1.0.2")).unwrap().name, "api-1");
        // prod/api-1 on a lost node, its claim released: its IP is free to hand out again
        super::super::write(&index.lost).insert("u-api".into(), ("prod".into(), "api-1".into()));
        assert_eq!(index.user(&ip("10.1.0.2")), None);
        assert!(index.user(&ip("10.1.0.0")).is_some());
    }
}
