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
use crate::metrics::{CacheKindLabels, Metrics};
use ip_webhook_ipam::ipset::{ip_from_key, ip_key};
use ip_webhook_ledger::Shared;

/// One allocation of a block that names a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IpamHold {
    pub(crate) ip: IpAddr,
    pub(crate) namespace: String,
    pub(crate) pod: String,
    /// `handle_id`: `k8s-pod-network.<container ID>` for a pod.
    pub(crate) handle: String,
}

/// An `IPAMBlock` as read from lists and watches: only the fields the holds are made of (of
/// the metadata, the name and the resource version the watcher resumes from; managed fields
/// and annotations are passed over unbuilt).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(from = "RawBlock")]
pub(crate) struct IpamBlockObject {
    pub(crate) metadata: ObjectMeta,
    pub(crate) spec: BlockSpec,
}

#[derive(Deserialize)]
struct RawBlock {
    #[serde(default)]
    metadata: BlockMeta,
    #[serde(default)]
    spec: BlockSpec,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockMeta {
    name: Option<String>,
    resource_version: Option<String>,
}

impl From<RawBlock> for IpamBlockObject {
    fn from(raw: RawBlock) -> IpamBlockObject {
        IpamBlockObject {
            metadata: ObjectMeta {
                name: raw.metadata.name,
                resource_version: raw.metadata.resource_version,
                ..ObjectMeta::default()
            },
            spec: raw.spec,
        }
    }
}

/// `spec` of an `IPAMBlock`: what [`BlockSpec::holds`] reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct BlockSpec {
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
    secondary: Option<Owner>,
    #[serde(default, rename = "releasedAt")]
    released_at: Option<serde::de::IgnoredAny>,
}

/// `secondary` (ActiveOwnerAttrs): the keys read; `node`, `timestamp` and the rest are
/// passed over.
#[derive(Clone, Debug, Default, Deserialize)]
struct Owner {
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    pod: Option<String>,
}

impl BlockSpec {
    /// The allocations that name a pod; junk (a bad CIDR, an index out of range, an entry that
    /// is not a number) gives nothing for that entry, never a panic.
    pub(crate) fn holds(&self) -> Vec<IpamHold> {
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
            let owner = attribute.secondary.as_ref();
            let namespace = owner.and_then(|o| o.namespace.as_deref()).unwrap_or("");
            let pod = owner.and_then(|o| o.pod.as_deref()).unwrap_or("");
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
pub(crate) struct IpamBlock {
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
pub(crate) struct CalicoHeld {
    pub(crate) ip: IpAddr,
    pub(crate) namespace: Shared,
    pub(crate) pod: Box<str>,
}

impl ClusterIps {
    /// Whether the IPs of pods not ours come from Calico's `IPAMBlock`s (only pods carrying
    /// our label are watched whole), rather than from every pod.
    pub(crate) fn uses_calico_ipam(&self) -> bool {
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
    /// adoption reads the pods of, since those pods are not watched. `only`: of these IPs
    /// (those [`Self::take_listed_calico_changes`] gave), else of every block.
    pub(crate) fn listed_calico_holds(
        &self,
        lists: &dyn AppLists,
        claimed: &dyn Fn(&IpAddr) -> bool,
        only: Option<&[IpAddr]>,
    ) -> Vec<CalicoHeld> {
        let blocks = read(&self.calico);
        let pods = read(&self.pods);
        let wanted = |ip: &IpAddr| {
            !claimed(ip) && !pods.by_ip.contains_key(ip) && lists.sole_app_listing(*ip).is_some()
        };
        let held = |ip: &IpAddr, (namespace, pod): (&Shared, &str)| CalicoHeld {
            ip: *ip,
            namespace: namespace.clone(),
            pod: pod.into(),
        };
        match only {
            Some(ips) => ips
                .iter()
                .filter(|ip| wanted(ip))
                .filter_map(|ip| {
                    let owner = blocks.carriers(ip).find_map(|b| b.owner(ip))?;
                    Some(held(ip, owner))
                })
                .collect(),
            None => blocks
                .by_key
                .values()
                .flat_map(|block| block.ips.iter().zip(block.owners.iter()))
                .filter(|(ip, _)| wanted(ip))
                .map(|(ip, (namespace, pod))| held(ip, (namespace, &**pod)))
                .collect(),
        }
    }

    /// The listed IPs blocks gave a pod since the last call; `None` when the count was lost
    /// (more than [`LISTED_CAP`]): then every block needs a look.
    pub(crate) fn take_listed_calico_changes(&self) -> Option<Vec<IpAddr>> {
        self.listed_calico
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Look at `ip` again on the next pass (reading its pod failed).
    pub(crate) fn note_listed_calico_change(&self, ip: IpAddr) {
        self.listed_calico
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .note(ip);
    }

    /// Note the IPs on an app's list that `block` gives a pod it did not give them before
    /// (`old`); whether there was one.
    fn note_listed(&self, old: Option<&IpamBlock>, block: &IpamBlock) -> bool {
        let Some(lists) = self.lists.get() else {
            return false;
        };
        let mut noted = false;
        for (ip, owner) in block.ips.iter().zip(block.owners.iter()) {
            let before = old.and_then(|o| o.owner(ip));
            // a pod we gave the IP (its claim names it) needs no adoption
            if before == Some((&owner.0, &*owner.1))
                || lists.sole_app_listing(*ip).is_none()
                || lists.claimed_for(*ip, &owner.0, &owner.1)
            {
                continue;
            }
            self.note_listed_calico_change(*ip);
            noted = true;
        }
        noted
    }
}

/// Listed IPs newly given a pod, kept between two leader passes, at most [`LISTED_CAP`].
pub(super) type ListedChanges = crate::cluster::change_log::ChangeLog<IpAddr, LISTED_CAP>;

/// Past this many, a pass looks at every block.
pub(super) const LISTED_CAP: usize = 4096;

/// Calico's `IPAMBlock`s into the index. The first list marks the index synced.
pub(crate) async fn watch_ipam_blocks(
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
                // a listed IP newly given a pod: its pod may need adoption
                let listed = match &event {
                    watcher::Event::Apply(SlimOrGone {
                        key,
                        value: Some(block),
                    }) => {
                        let old = read(&index.calico).by_key.get(key).cloned();
                        index.note_listed(old.as_deref(), block)
                    }
                    _ => false,
                };
                relist.step(&index.calico, &index.calico_synced, event);
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
        let junk = spec(json!({"cidr": "10.0.0.0/31", "allocations": [0, "x", 5, 0],
            "attributes": [{"secondary": {"namespace": "a", "pod": "b"}}]}));
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
        use ip_webhook_ipam::foreign::ForeignIps;
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

    #[test]
    fn only_listed_ips_newly_given_a_pod_are_noted_for_adoption() {
        struct Lists;
        impl AppLists for Lists {
            fn sole_app_listing(&self, ip: IpAddr) -> Option<String> {
                (ip.to_string() == "10.1.0.2").then(|| "prod/api".into())
            }
        }
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let index = ClusterIps::default();
        index.set_lists(Arc::new(Lists));
        let block = |owners: &[(usize, &str)]| {
            let attributes: Vec<_> = owners
                .iter()
                .map(|(_, pod)| json!({"secondary": {"namespace": "prod", "pod": pod}}))
                .collect();
            let mut allocations = vec![serde_json::Value::Null; 64];
            for (n, (ordinal, _)) in owners.iter().enumerate() {
                allocations[*ordinal] = json!(n);
            }
            IpamBlock::from_holds(
                spec(json!({"cidr": "10.1.0.0/26", "allocations": allocations, "attributes": attributes}))
                    .holds(),
            )
        };
        let first = block(&[(0, "db-0"), (2, "api-1")]);
        // the pod our claim on the IP names needs no adoption: no pass is woken for it
        struct Claimed;
        impl AppLists for Claimed {
            fn sole_app_listing(&self, ip: IpAddr) -> Option<String> {
                Lists.sole_app_listing(ip)
            }
            fn claimed_for(&self, ip: IpAddr, namespace: &str, pod: &str) -> bool {
                (ip.to_string(), namespace, pod) == ("10.1.0.2".into(), "prod", "api-1")
            }
        }
        let ours = ClusterIps::default();
        ours.set_lists(Arc::new(Claimed));
        assert!(!ours.note_listed(None, &first));
        assert!(
            ours.note_listed(None, &block(&[(2, "api-2")])),
            "another pod's"
        );
        assert!(index.note_listed(None, &first));
        assert_eq!(
            index.take_listed_calico_changes(),
            Some(vec![ip("10.1.0.2")])
        );
        // the block again with another allocation: nothing new on a listed IP
        let second = block(&[(0, "db-0"), (2, "api-1"), (3, "x-1")]);
        assert!(!index.note_listed(Some(&first), &second));
        assert_eq!(index.take_listed_calico_changes(), Some(vec![]));
        // the listed IP given to another pod is new again
        let third = block(&[(0, "db-0"), (2, "api-2")]);
        assert!(index.note_listed(Some(&second), &third));

        super::super::write(&index.calico).upsert("b".into(), third);
        let claimed = |_: &IpAddr| false;
        let holds = index.listed_calico_holds(&Lists, &claimed, None);
        let found: Vec<String> = holds
            .iter()
            .map(|h| format!("{} {}/{}", h.ip, h.namespace, h.pod))
            .collect();
        assert_eq!(found, ["10.1.0.2 prod/api-2"]);
        let only = [ip("10.1.0.0"), ip("10.1.0.2")];
        assert_eq!(
            index
                .listed_calico_holds(&Lists, &claimed, Some(&only))
                .len(),
            1
        );
        let claimed = |held: &IpAddr| *held == ip("10.1.0.2");
        assert!(
            index.listed_calico_holds(&Lists, &claimed, None).is_empty(),
            "claimed already"
        );
    }
}
