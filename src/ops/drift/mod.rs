//! `check --drift`: ip-webhook's claims against what the cluster and the CNI say.
//!
//! A pure comparison over plain data ([`Inputs`]), so every rule is unit-tested; the reads
//! from the API server are in [`fetch`]. Four kinds of drift ([`DriftKind`]):
//!
//! 1. **a claim without a pod**: a held claim no pod holds (matched as the reconciler matches
//!    them, [`crate::cluster::pods::holder`]: by UID once bound, by the claim token before);
//! 2. **a pod on a list IP without a claim**: a running pod whose `status.podIPs` has an IP of
//!    an app's list, a FixedIPPool, or a claim, with no claim of its own on it;
//! 3. **a pod whose IP differs from its claim**: the pod holding a claim runs on another IP of
//!    the same family (the CNI ignored the annotation);
//! 4. **an IP held by the CNI for a pod that is gone**: a Kube-OVN `IP` object or a Calico IPAM
//!    allocation names a pod (namespace and name) that does not exist, for an IP on a list, in a
//!    FixedIPPool or claimed. How each CNI names the pod is in [`kube_ovn_holds`] and
//!    [`calico_holds`].
//!
//! A snapshot of a moving cluster: claims changed within the last [`Inputs::settle`] seconds
//! (an admission whose pod is being created, a DELETE being processed) and Terminating claims
//! before their `release_at` are left out of kind 1.

pub(crate) mod fetch;
pub(crate) mod network;
pub(crate) mod wanted;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use kube::api::DynamicObject;
use serde::Serialize;
use serde_json::Value;

use crate::cluster::index::calico::BlockSpec;
use crate::cluster::index::{OvnIp, RunningPod};
use crate::cluster::pods::{holder, network_holder};
use crate::decisions::kubevirt::launcher_vm_of_object;
use ip_webhook_admission::annotations::{ALLOCATABLE_IPS, CLAIM_TOKEN};
use ip_webhook_ipam::ipset::{Family, IpSet, ip_key, parse_ip_spec};
use ip_webhook_ledger::Claim;
use ip_webhook_ledger::network::Network;

/// What kind of drift a finding is; the JSON names are stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum DriftKind {
    /// A held claim that no pod holds.
    ClaimWithoutPod,
    /// A running pod on a list (or pool, or claimed) IP without a claim of its own on it.
    PodWithoutClaim,
    /// The pod that holds a claim runs on another IP of the same family.
    PodIpDiffers,
    /// The CNI holds an IP for a pod that no longer exists.
    CniHoldsGonePod,
    /// A Terminating pod that holds no claim: its claim was released while it terminated
    /// (its node lost, or `release --force`). Reported, not drift: its IP is free by design.
    TerminatingWithoutClaim,
}

impl DriftKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            DriftKind::ClaimWithoutPod => "claim-without-pod",
            DriftKind::PodWithoutClaim => "pod-without-claim",
            DriftKind::PodIpDiffers => "pod-ip-differs",
            DriftKind::CniHoldsGonePod => "cni-holds-gone-pod",
            DriftKind::TerminatingWithoutClaim => "terminating-without-claim",
        }
    }

    /// Whether a finding of this kind is drift (counted, exit status 3) rather than a state
    /// ip-webhook chose and only reports.
    pub(crate) fn is_drift(self) -> bool {
        self != DriftKind::TerminatingWithoutClaim
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Drift {
    pub(crate) kind: DriftKind,
    /// The IP concerned: the claimed IP (kinds 1 and 3), the pod's IP (2), the CNI's IP (4).
    pub(crate) ip: IpAddr,
    /// `namespace/name` of the pod concerned (`namespace/generateName*` for a reservation).
    pub(crate) pod: String,
    /// The pod's actual IPs (kind 3).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) pod_ips: Vec<IpAddr>,
    /// What was seen, in a sentence.
    pub(crate) detail: String,
    /// The claim a `claim-without-pod` finding is about, which `release --from-report` frees
    /// only while it is still that very claim.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) claim: Option<crate::ops::release::FoundClaim>,
}

/// Who the CNI says an IP belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CniHold {
    pub(crate) ip: IpAddr,
    pub(crate) namespace: String,
    pub(crate) pod: String,
    /// The record, for the report: `Kube-OVN IP web-1.default`, `Calico IPAMBlock … (handle …)`.
    pub(crate) record: String,
}

/// A pod that carries none of our or the CNIs' labels and annotations, kept as the
/// comparison needs it: that it exists (a CNI record or a claim may name it), and the IPs it
/// runs on. The cluster's pods are mostly these: a compact record each instead of an object.
#[derive(Debug, Clone)]
pub(crate) enum PlainPod {
    /// Runs on IPs of its own.
    Running(RunningPod),
    /// Not (yet, or any more): host-network, finished, or no IP assigned.
    Idle {
        namespace: Box<str>,
        name: Box<str>,
        uid: Box<str>,
    },
}

impl PlainPod {
    /// Namespace, name, UID.
    fn identity(&self) -> (&str, &str, &str) {
        match self {
            PlainPod::Running(slim) => (&slim.namespace, &slim.name, &slim.uid),
            PlainPod::Idle {
                namespace,
                name,
                uid,
            } => (namespace, name, uid),
        }
    }
}

/// Everything the comparison looks at.
pub(crate) struct Inputs<'a> {
    pub(crate) claims: &'a [Claim],
    /// The pods of the cluster (or of the namespaces compared) that carry our or the CNIs'
    /// labels or annotations, cut down ([`fetch::slim_pod`]).
    pub(crate) pods: &'a [Pod],
    /// The other pods.
    pub(crate) plain: &'a [PlainPod],
    /// The IPs of every app's list and every FixedIPPool.
    pub(crate) listed: &'a IpSet,
    /// The CNI's own records (Kube-OVN `IP` objects, Calico IPAM allocations).
    pub(crate) cni: &'a [CniHold],
    /// The pod label that names a pod's app.
    pub(crate) app_label: &'a str,
    /// Unix seconds.
    pub(crate) now: u64,
    /// Claims changed this recently (seconds) are not reported as without a pod.
    pub(crate) settle: u64,
    /// The KubeVirt VMs and VMIs (namespace, name) that exist: a VM's claim with no launcher
    /// pod is held while its VM is.
    pub(crate) vms: &'a HashSet<(String, String)>,
    /// The secondary network whose claims these are (the pods projected onto it,
    /// [`network::project`]); `None`: the primary interface's.
    pub(crate) network: Option<&'a Network>,
}

/// The default of [`Inputs::settle`]: `serve`'s default reservation TTL.
pub(crate) const SETTLE_SECONDS: u64 = 120;

/// All drift, sorted by kind, then IP.
pub(crate) fn compare(inputs: &Inputs<'_>) -> Vec<Drift> {
    let mut found = Vec::new();
    let held: Vec<&Claim> = inputs.claims.iter().filter(|c| c.is_held()).collect();
    let pods = PodViews::of(inputs.pods, inputs.plain);
    let holding = claims_against_pods(inputs, &held, &pods, &mut found);
    let claimed: HashMap<IpAddr, &Claim> = held.iter().map(|c| (c.ip, *c)).collect();
    pods_without_claims(inputs, &pods, &holding, &claimed, &mut found);
    cni_holds_of_gone_pods(inputs, &pods, &claimed, &mut found);
    found.sort_by(|a, b| (a.kind, ip_key(&a.ip), &a.pod).cmp(&(b.kind, ip_key(&b.ip), &b.pod)));
    found.dedup();
    found
}

/// The cluster's pods as [`compare`] looks them up.
struct PodViews<'a> {
    /// Pods running on IPs of their own, by namespace and UID.
    running: HashMap<(&'a str, &'a str), RunningPod>,
    /// Every pod, by namespace and name.
    existing: HashSet<(&'a str, &'a str)>,
    /// Every pod, by namespace and UID (the object, for the pods that carry our marks): Bound
    /// claims find their pod here (as `holder` does, without a scan per claim); reservations,
    /// few and short-lived, through `holder`.
    by_uid: HashMap<(&'a str, &'a str), Option<&'a Pod>>,
}

impl<'a> PodViews<'a> {
    fn of(pods: &'a [Pod], plain: &'a [PlainPod]) -> PodViews<'a> {
        let mut views = PodViews {
            running: HashMap::new(),
            existing: HashSet::new(),
            by_uid: HashMap::new(),
        };
        for pod in pods {
            let meta = &pod.metadata;
            let (Some(namespace), Some(uid)) = (meta.namespace.as_deref(), meta.uid.as_deref())
            else {
                continue;
            };
            if let Some(name) = meta.name.as_deref() {
                views.existing.insert((namespace, name));
            }
            views.by_uid.insert((namespace, uid), Some(pod));
            if let Some(slim) = RunningPod::from_pod(pod) {
                views.running.insert((namespace, uid), slim);
            }
        }
        for pod in plain {
            let (namespace, name, uid) = pod.identity();
            views.existing.insert((namespace, name));
            views.by_uid.insert((namespace, uid), None);
            if let PlainPod::Running(slim) = pod {
                views.running.insert((namespace, uid), slim.clone());
            }
        }
        views
    }
}

/// Each held claim and the pod holding it: kinds 1 (no pod) and 3 (the pod runs on another
/// IP). Returns the claims each pod (namespace, UID) holds.
fn claims_against_pods<'a>(
    inputs: &Inputs<'a>,
    held: &[&'a Claim],
    pods: &PodViews<'a>,
    found: &mut Vec<Drift>,
) -> HashMap<(&'a str, &'a str), Vec<&'a Claim>> {
    let mut holding: HashMap<(&str, &str), Vec<&Claim>> = HashMap::new();
    for claim in held {
        let key = match claim.pod.uid.as_deref() {
            Some(uid) => pods
                .by_uid
                .get_key_value(&(claim.pod.namespace.as_str(), uid))
                .map(|(key, _)| *key),
            None => match inputs.network {
                None => holder(inputs.pods, claim, inputs.app_label),
                Some(network) => network_holder(inputs.pods, claim, inputs.app_label, network),
            }
            .and_then(|pod| {
                Some((
                    pod.metadata.namespace.as_deref()?,
                    pod.metadata.uid.as_deref()?,
                ))
            }),
        };
        let Some((namespace, uid)) = key else {
            if crate::ops::release::settled(claim, inputs.now, inputs.settle)
                && !vm_holds(inputs, claim)
            {
                found.push(Drift {
                    kind: DriftKind::ClaimWithoutPod,
                    ip: claim.ip,
                    pod: claim.holder(),
                    pod_ips: Vec::new(),
                    detail: format!(
                        "{:?} claim of {} has no pod (`{} release {}` frees it)",
                        claim.phase,
                        describe_app(claim),
                        crate::ops::invocation(),
                        claim.ip
                    ),
                    claim: Some(crate::ops::release::FoundClaim::of(claim)),
                });
            }
            continue;
        };
        holding.entry((namespace, uid)).or_default().push(claim);
        let Some(slim) = pods.running.get(&(namespace, uid)) else {
            continue; // not running on IPs of its own (yet, or any more)
        };
        let family = Family::of(&claim.ip);
        if !slim.ips.contains(&claim.ip) && slim.ips.iter().any(|ip| Family::of(ip) == family) {
            found.push(Drift {
                kind: DriftKind::PodIpDiffers,
                ip: claim.ip,
                pod: format!("{namespace}/{}", slim.name),
                pod_ips: slim.ips.to_vec(),
                detail: format!(
                    "claimed {} for {}, but the pod runs on {}",
                    claim.ip,
                    describe_app(claim),
                    join(&slim.ips)
                ),
                claim: None,
            });
        }
    }
    holding
}

/// Whether `claim` is a virtual machine's whose VirtualMachine or VMI exists: stopped, or
/// between launcher pods, it holds its IP with no pod.
fn vm_holds(inputs: &Inputs<'_>, claim: &Claim) -> bool {
    claim.vm.as_ref().is_some_and(|vm| {
        inputs
            .vms
            .contains(&(claim.pod.namespace.to_string(), vm.to_string()))
    })
}

/// Whether `pod` is a launcher pod of the VM whose claim is `claim`: a live migration's
/// source runs on the IP its target holds the claim for.
fn vms_launcher(pod: Option<&Pod>, claim: &Claim) -> bool {
    let Some(meta) = pod.map(|p| &p.metadata) else {
        return false;
    };
    let vm = launcher_vm_of_object(meta);
    vm.is_some()
        && vm == claim.vm.as_deref()
        && meta.namespace.as_deref() == Some(claim.pod.namespace.as_str())
}

/// Running pods on IPs that matter, without a claim of their own: kind 2 (and our own pods
/// left Terminating after their claim was released).
fn pods_without_claims(
    inputs: &Inputs<'_>,
    pods: &PodViews<'_>,
    holding: &HashMap<(&str, &str), Vec<&Claim>>,
    claimed: &HashMap<IpAddr, &Claim>,
    found: &mut Vec<Drift>,
) {
    let mut keys: Vec<&(&str, &str)> = pods.running.keys().collect();
    keys.sort();
    for key in keys {
        let slim = &pods.running[key];
        if holding.contains_key(key) {
            continue; // holds a claim: compared above (kind 3)
        }
        // One of ours (it carries a claim token), Terminating with its claim gone.
        let object = pods.by_uid.get(key).copied().flatten();
        let admitted = object
            .and_then(|pod| pod.metadata.annotations.as_ref())
            .is_some_and(|a| a.contains_key(CLAIM_TOKEN));
        if slim.deleting_at.is_some() && admitted {
            terminating_without_claim(slim, claimed, found);
            continue;
        }
        for ip in slim.ips.iter() {
            let detail = match claimed.get(ip) {
                Some(claim) if vms_launcher(object, claim) => continue,
                Some(claim) => format!(
                    "runs on {ip}, which is claimed for {} ({})",
                    claim.holder(),
                    describe_app(claim)
                ),
                None if inputs.listed.contains(ip) => {
                    format!("runs on {ip}, which is on a list or in a FixedIPPool, with no claim")
                }
                None => continue,
            };
            found.push(Drift {
                kind: DriftKind::PodWithoutClaim,
                ip: *ip,
                pod: format!("{}/{}", slim.namespace, slim.name),
                pod_ips: Vec::new(),
                detail,
                claim: None,
            });
        }
    }
}

/// One of our pods, Terminating with its claim released: each of its IPs, and who holds it now.
fn terminating_without_claim(
    slim: &RunningPod,
    claimed: &HashMap<IpAddr, &Claim>,
    found: &mut Vec<Drift>,
) {
    for ip in slim.ips.iter() {
        let now = match claimed.get(ip) {
            Some(claim) => format!("it is claimed for {} now", claim.holder()),
            None => "it is free".to_string(),
        };
        found.push(Drift {
            kind: DriftKind::TerminatingWithoutClaim,
            ip: *ip,
            pod: format!("{}/{}", slim.namespace, slim.name),
            pod_ips: Vec::new(),
            detail: format!(
                "Terminating on node {}, its claim on {ip} released (its node lost, or a forced release); {now}; the object goes once its node is deleted or the pod is force-deleted",
                if slim.node.is_empty() { "?" } else { &slim.node }
            ),
            claim: None,
        });
    }
}

/// The CNI's records for pods that are gone, on IPs that are listed or claimed: kind 4.
fn cni_holds_of_gone_pods(
    inputs: &Inputs<'_>,
    pods: &PodViews<'_>,
    claimed: &HashMap<IpAddr, &Claim>,
    found: &mut Vec<Drift>,
) {
    for hold in inputs.cni {
        if !(inputs.listed.contains(&hold.ip) || claimed.contains_key(&hold.ip)) {
            continue;
        }
        if pods
            .existing
            .contains(&(hold.namespace.as_str(), hold.pod.as_str()))
        {
            continue;
        }
        found.push(Drift {
            kind: DriftKind::CniHoldsGonePod,
            ip: hold.ip,
            pod: format!("{}/{}", hold.namespace, hold.pod),
            pod_ips: Vec::new(),
            detail: format!("{} holds it for a pod that is gone", hold.record),
            claim: None,
        });
    }
}

fn describe_app(claim: &Claim) -> String {
    if claim.app.is_empty() {
        "a static IP".to_string()
    } else {
        format!("app {}", claim.app_key())
    }
}

fn join(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `ip-webhook.io/allocatable-ips` lists written on `pods` (copied from their templates),
/// as one set; unreadable lists are skipped (admission refuses them anyway).
pub(crate) fn pod_lists(pods: &[Pod]) -> IpSet {
    let mut listed = IpSet::default();
    let mut seen = BTreeSet::new();
    for pod in pods {
        let Some(list) = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ALLOCATABLE_IPS))
        else {
            continue;
        };
        if seen.insert(list.as_str())
            && let Ok(set) = parse_ip_spec(list)
        {
            listed = listed.union(&set);
        }
    }
    listed
}

/// Who a Kube-OVN `IP` object (`ips.kubeovn.io`) says holds its IPs: the pod `spec.podName` in
/// `spec.namespace`. Only objects of plain pods count, as in Kube-OVN's own garbage collector
/// (kubeovn/kube-ovn `pkg/controller/gc.go`, `checkIPOwnerExists`): an empty `spec.podType`,
/// a namespace, and no owner references. Node IPs (no namespace), u2o and multicast IPs
/// (owned by a Node or Subnet), and the IPs Kube-OVN keeps on purpose for a StatefulSet or a
/// VirtualMachine (`podType`) are left out.
pub(crate) fn kube_ovn_holds(object: &DynamicObject) -> Vec<CniHold> {
    let spec = object.data.get("spec").unwrap_or(&Value::Null);
    let pod_type = spec.get("podType").and_then(Value::as_str).unwrap_or("");
    if !pod_type.is_empty()
        || object
            .metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| !o.is_empty())
    {
        return Vec::new();
    }
    let Some(ip) = OvnIp::from_object(object) else {
        return Vec::new();
    };
    if ip.namespace.is_empty() || ip.pod.is_empty() {
        return Vec::new();
    }
    ip.ips
        .iter()
        .map(|address| CniHold {
            ip: *address,
            namespace: ip.namespace.to_string(),
            pod: ip.pod.to_string(),
            record: format!("Kube-OVN IP {}", ip.name),
        })
        .collect()
}

/// Who a Calico `IPAMBlock` (`ipamblocks.crd.projectcalico.org`) says holds its IPs, read as
/// the in-cluster index reads it ([`crate::cluster::index::calico`], which cites Calico's data
/// model). An `IPAMHandle` holds only its handle ID and a count of addresses per block: it
/// cannot say which pod an IP is for, so the pod is read from the block, as Calico's own leak
/// detection does (`kube-controllers/pkg/controllers/node/ipam.go`, `allocationIsValid`: an
/// allocation with `namespace` and `pod` whose pod is not found is a leak).
#[cfg(test)]
pub(crate) fn calico_holds(object: &DynamicObject) -> Vec<CniHold> {
    let spec: BlockSpec = object
        .data
        .get("spec")
        .and_then(|spec| serde_json::from_value(spec.clone()).ok())
        .unwrap_or_default();
    block_holds(object.metadata.name.as_deref().unwrap_or(""), &spec)
}

/// [`calico_holds`] of the block named `block`, read as the in-cluster index reads it.
pub(crate) fn block_holds(block: &str, spec: &BlockSpec) -> Vec<CniHold> {
    spec.holds()
        .into_iter()
        .map(|hold| CniHold {
            ip: hold.ip,
            namespace: hold.namespace,
            pod: hold.pod,
            record: format!("Calico IPAMBlock {block} (handle {})", hold.handle),
        })
        .collect()
}

/// What was compared, for the report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Compared {
    pub(crate) claims: usize,
    pub(crate) pods: usize,
    /// Kube-OVN `IP` objects read; `None` when `ips.kubeovn.io` is not served.
    pub(crate) kube_ovn_ips: Option<usize>,
    /// Calico IPAM allocations naming a pod; `None` when `ipamhandles.crd.projectcalico.org`
    /// is not served.
    pub(crate) calico_allocations: Option<usize>,
    /// The namespace compared (`-n`), if only one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) namespace: Option<String>,
}

/// `check --drift`'s output (`-o json` prints it as is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Report {
    pub(crate) drift: Vec<Drift>,
    pub(crate) compared: Compared,
}

impl Report {
    /// Keep only the findings about pods of `namespace`.
    pub(crate) fn retain_namespace(&mut self, namespace: &str) {
        let prefix = format!("{namespace}/");
        self.drift.retain(|d| d.pod.starts_with(&prefix));
        self.compared.namespace = Some(namespace.to_string());
    }

    /// The table for people, with a line saying what was compared.
    pub(crate) fn to_table(&self) -> String {
        let source = |n: Option<usize>, what: &str| match n {
            Some(n) => format!("{n} {what}"),
            None => format!("no {what} (not installed)"),
        };
        let summary = format!(
            "compared {} claims, {} pods, {}, {}{}",
            self.compared.claims,
            self.compared.pods,
            source(self.compared.kube_ovn_ips, "Kube-OVN IP objects"),
            source(self.compared.calico_allocations, "Calico IPAM allocations"),
            self.compared
                .namespace
                .as_ref()
                .map(|n| format!(" (namespace {n})"))
                .unwrap_or_default(),
        );
        let count = self.drift_count();
        if self.drift.is_empty() {
            return format!("No drift: {summary}.\n");
        }
        let rows: Vec<Vec<String>> = self
            .drift
            .iter()
            .map(|d| {
                vec![
                    d.kind.name().to_string(),
                    d.ip.to_string(),
                    d.pod.clone(),
                    d.detail.clone(),
                ]
            })
            .collect();
        let mut out = crate::ops::status::table(&["KIND", "IP", "POD", "DETAIL"], &rows);
        let reported = self.drift.len() - count;
        let also = if reported > 0 {
            format!(" ({reported} Terminating pod(s) without a claim, not drift)")
        } else {
            String::new()
        };
        match count {
            0 => out.push_str(&format!("\nNo drift{also}: {summary}.\n")),
            n => out.push_str(&format!("\n{n} drift found{also}; {summary}.\n")),
        }
        out
    }

    /// The findings that are drift (what exit status 3 counts).
    pub(crate) fn drift_count(&self) -> usize {
        self.drift.iter().filter(|d| d.kind.is_drift()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_claims as claims;
    use ip_webhook_ledger::Phase;
    use serde_json::json;

    const NOW: u64 = 1_764_400_000;
    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    /// A claim of app `web` (generateName `web-`) from a list of 4, with a token, made at `at`.
    fn web_claim(ip: &str, name: &str, phase: Phase, at: u64) -> claims::ClaimBuilder {
        claims::builder(ip, "web", name)
            .generate_name("web-")
            .request(&format!("r-{ip}"))
            .phase(phase)
            .list_size(4)
            .token(TOKEN)
            .at(at)
    }

    fn pod(name: &str, uid: &str, label_ip: &str, pod_ips: &[&str]) -> Pod {
        let ips: Vec<Value> = pod_ips.iter().map(|ip| json!({"ip": ip})).collect();
        serde_json::from_value(json!({
            "metadata": {
                "namespace": "default", "name": name, "uid": uid,
                "creationTimestamp": "2025-11-29T07:00:00Z",
                "labels": {"app": "web", "ip-webhook.io/allocated-ip": label_ip},
                "annotations": {"ip-webhook.io/allocatable-ips": "10.0.0.10-10.0.0.13", "ip-webhook.io/claim": TOKEN},
            },
            "spec": {"containers": [], "nodeName": "n1"},
            "status": {"phase": "Running", "podIPs": ips},
        }))
        .unwrap()
    }

    fn foreign(name: &str, ip: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"namespace": "other", "name": name, "uid": format!("u-{name}")},
            "spec": {"containers": []},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
        }))
        .unwrap()
    }

    /// `pods` as `check --drift` keeps them: read as listed, the marked ones cut down, the
    /// rest plain.
    fn kept(pods: &[Pod]) -> (Vec<Pod>, Vec<PlainPod>) {
        let (mut marked, mut plain) = (Vec::new(), Vec::new());
        let listed = pods.iter().map(|pod| {
            let value = serde_json::to_value(pod).unwrap();
            serde_json::from_value::<crate::cluster::listed_pod::ListedPod>(value)
                .unwrap()
                .0
        });
        fetch::keep_pods(listed.collect(), "app", |_| true, &mut marked, &mut plain);
        (marked, plain)
    }

    fn run(claims: &[Claim], pods: &[Pod], cni: &[CniHold]) -> Vec<(DriftKind, String, String)> {
        run_with_vms(claims, pods, cni, &HashSet::new())
    }

    fn run_with_vms(
        claims: &[Claim],
        pods: &[Pod],
        cni: &[CniHold],
        vms: &HashSet<(String, String)>,
    ) -> Vec<(DriftKind, String, String)> {
        let listed = pod_lists(pods).union(&parse_ip_spec("10.0.0.10-10.0.0.13").unwrap());
        let (pods, plain) = kept(pods);
        let inputs = Inputs {
            claims,
            pods: &pods,
            plain: &plain,
            listed: &listed,
            cni,
            app_label: "app",
            now: NOW,
            settle: SETTLE_SECONDS,
            vms,
            network: None,
        };
        let found = compare(&inputs);
        // what `check --drift` keeps of the plain pods and the CNI's records finds the same
        let mut wanted = wanted::Wanted::new(claims, &listed);
        let cni: Vec<CniHold> = cni
            .iter()
            .filter(|h| wanted.keep_hold(h))
            .cloned()
            .collect();
        let few: Vec<PlainPod> = plain.iter().filter(|p| wanted.keeps(p)).cloned().collect();
        let kept = Inputs {
            plain: &few,
            cni: &cni,
            ..inputs
        };
        assert_eq!(compare(&kept), found, "with only what Wanted keeps");
        found
            .into_iter()
            .map(|d| (d.kind, d.ip.to_string(), d.pod))
            .collect()
    }

    fn old(ip: &str, name: &str, uid: &str) -> Claim {
        web_claim(ip, name, Phase::Bound, NOW - 3600)
            .uid(uid)
            .build()
    }

    #[test]
    fn a_vms_claim_is_held_by_the_vm_and_its_launcher_pods() {
        let vm_claim = |ip: &str, vm: &str, pod: &str, uid: &str| Claim {
            vm: Some(vm.into()),
            ..old(ip, pod, uid)
        };
        let launcher = |name: &str, uid: &str, vm: &str, ip: &str| {
            let mut pod = pod(name, uid, ip, &[ip]);
            let meta = &mut pod.metadata;
            meta.labels
                .as_mut()
                .unwrap()
                .insert("kubevirt.io".into(), "virt-launcher".into());
            meta.owner_references = Some(vec![
                serde_json::from_value(json!({
                    "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                    "name": vm, "uid": format!("vmi-{vm}"), "controller": true,
                }))
                .unwrap(),
            ]);
            pod
        };
        let claims = [
            // a live migration: the target holds the claim, the source still runs on the IP
            vm_claim("10.0.0.10", "db", "virt-launcher-db-dst", "u-dst"),
            // stopped: no launcher pod, the VirtualMachine exists
            vm_claim("10.0.0.11", "stopped", "virt-launcher-stopped-x", "u-gone"),
            // deleted: neither a VM nor a pod
            vm_claim(
                "10.0.0.12",
                "deleted",
                "virt-launcher-deleted-x",
                "u-gone-2",
            ),
            // another VM's pod on a VM's IP is still drift
            vm_claim("10.0.0.13", "cache", "virt-launcher-cache-a", "u-cache"),
        ];
        let pods = [
            launcher("virt-launcher-db-src", "u-src", "db", "10.0.0.10"),
            launcher("virt-launcher-db-dst", "u-dst", "db", "10.0.0.10"),
            launcher("virt-launcher-cache-a", "u-cache", "cache", "10.0.0.13"),
            launcher("virt-launcher-web-a", "u-web", "web", "10.0.0.13"),
        ];
        let vms: HashSet<(String, String)> = ["db", "stopped", "cache", "web"]
            .into_iter()
            .map(|vm| ("default".to_string(), vm.to_string()))
            .collect();
        let found = run_with_vms(&claims, &pods, &[], &vms);
        assert_eq!(
            found,
            [
                (
                    DriftKind::ClaimWithoutPod,
                    "10.0.0.12".into(),
                    "vm default/deleted".into()
                ),
                (
                    DriftKind::PodWithoutClaim,
                    "10.0.0.13".into(),
                    "default/virt-launcher-web-a".into()
                ),
            ]
        );
    }

    #[test]
    fn a_lost_nodes_terminating_pod_is_reported_as_such_not_as_drift() {
        let terminating = |name: &str, uid: &str, ip: &str| {
            let mut pod = pod(name, uid, ip, &[ip]);
            pod.metadata.deletion_timestamp =
                Some(serde_json::from_value(json!("2025-11-29T08:00:00Z")).unwrap());
            pod
        };
        // web-a's claim was released on node loss and its replacement web-b holds the IP.
        let claims = [old("10.0.0.10", "web-b", "ub")];
        let pods = [
            terminating("web-a", "ua", "10.0.0.10"),
            pod("web-b", "ub", "10.0.0.10", &["10.0.0.10"]),
            terminating("web-c", "uc", "10.0.0.11"),
        ];
        let listed = pod_lists(&pods).union(&parse_ip_spec("10.0.0.10-10.0.0.13").unwrap());
        let (pods, plain) = kept(&pods);
        let report = Report {
            drift: compare(&Inputs {
                claims: &claims,
                pods: &pods,
                plain: &plain,
                listed: &listed,
                cni: &[],
                app_label: "app",
                now: NOW,
                settle: SETTLE_SECONDS,
                vms: &HashSet::new(),
                network: None,
            }),
            compared: Compared::default(),
        };
        let found: Vec<(DriftKind, String, String)> = report
            .drift
            .iter()
            .map(|d| (d.kind, d.ip.to_string(), d.pod.clone()))
            .collect();
        assert_eq!(
            found,
            [
                (
                    DriftKind::TerminatingWithoutClaim,
                    "10.0.0.10".into(),
                    "default/web-a".into()
                ),
                (
                    DriftKind::TerminatingWithoutClaim,
                    "10.0.0.11".into(),
                    "default/web-c".into()
                ),
            ]
        );
        assert_eq!(report.drift_count(), 0);
        assert!(report.drift[0].detail.contains("Terminating on node n1, its claim on 10.0.0.10 released (its node lost, or a forced release); it is claimed for default/web-b now"), "{}", report.drift[0].detail);
        assert!(
            report.drift[1].detail.contains("; it is free;"),
            "{}",
            report.drift[1].detail
        );
        assert!(
            report
                .to_table()
                .contains("\nNo drift (2 Terminating pod(s) without a claim, not drift): compared"),
            "{}",
            report.to_table()
        );

        // A Terminating pod ip-webhook never admitted (no claim token) is still drift.
        let mut squatter = foreign("squat", "10.0.0.12");
        squatter.metadata.deletion_timestamp = pods[0].metadata.deletion_timestamp.clone();
        assert_eq!(
            run(&[], &[squatter], &[]),
            [(
                DriftKind::PodWithoutClaim,
                "10.0.0.12".into(),
                "other/squat".into()
            )]
        );
    }

    #[test]
    fn a_clean_cluster_has_no_drift() {
        // a reservation whose pod is not bound yet: found by its token
        let reserved = web_claim("10.0.0.12", "", Phase::Reserved, NOW - 3600).build();
        let claims = [
            old("10.0.0.10", "web-a", "ua"),
            old("10.0.0.11", "web-b", "ub"),
            reserved,
        ];
        let pods = [
            pod("web-a", "ua", "10.0.0.10", &["10.0.0.10"]),
            pod("web-b", "ub", "10.0.0.11", &[]), // not started yet
            pod("web-c", "uc", "10.0.0.12", &["10.0.0.12"]),
            foreign("db", "10.9.0.1"), // on no list
        ];
        assert_eq!(run(&claims, &pods, &[]), []);
        // without its pod, the old reservation is drift
        assert_eq!(
            run(&claims, &[pods[0].clone(), pods[1].clone()], &[]).len(),
            1
        );
    }

    #[test]
    fn a_claim_without_a_pod_is_found_once_settled() {
        let pods = [pod("web-a", "ua", "10.0.0.10", &["10.0.0.10"])];
        let gone = old("10.0.0.11", "web-gone", "ugone");
        let recreated = old("10.0.0.10", "web-a", "u-old-incarnation");
        assert_eq!(
            run(&[gone.clone(), recreated], &pods, &[]),
            [
                (
                    DriftKind::ClaimWithoutPod,
                    "10.0.0.10".into(),
                    "default/web-a".into()
                ),
                (
                    DriftKind::ClaimWithoutPod,
                    "10.0.0.11".into(),
                    "default/web-gone".into()
                ),
                // ... and runs on its IP without a claim of its own
                (
                    DriftKind::PodWithoutClaim,
                    "10.0.0.10".into(),
                    "default/web-a".into()
                ),
            ],
            "a pod of the same name but another UID does not hold a bound claim"
        );
        // Made a minute ago: an admission whose pod is still being created.
        let fresh = web_claim("10.0.0.12", "", Phase::Reserved, NOW - 60).build();
        assert_eq!(run(std::slice::from_ref(&fresh), &pods[..0], &[]), []);
        let stale = Claim {
            created_at: NOW - 600,
            updated_at: NOW - 600,
            ..fresh
        };
        assert_eq!(
            run(&[stale], &pods[..0], &[]),
            [(
                DriftKind::ClaimWithoutPod,
                "10.0.0.12".into(),
                "default/web-*".into()
            )]
        );
        // Terminating before its release_at: the IP waits by design.
        let waiting = Claim {
            phase: Phase::Terminating,
            release_at: Some(ip_webhook_ledger::ReleaseAt::new(NOW + 30)),
            ..gone.clone()
        };
        assert_eq!(run(std::slice::from_ref(&waiting), &[], &[]), []);
        let overdue = Claim {
            release_at: Some(ip_webhook_ledger::ReleaseAt::new(NOW - 30)),
            ..waiting
        };
        assert_eq!(run(&[overdue], &[], &[]).len(), 1);
        // Released history is not held.
        let released = Claim {
            phase: Phase::Released,
            ..gone
        };
        assert_eq!(run(&[released], &[], &[]), []);
    }

    #[test]
    fn a_pod_on_a_list_ip_without_a_claim_is_found() {
        let claims = [old("10.0.0.10", "web-a", "ua")];
        let pods = [
            pod("web-a", "ua", "10.0.0.10", &["10.0.0.10"]),
            foreign("squatter", "10.0.0.12"),
            foreign("twin", "10.0.0.10"),
            foreign("elsewhere", "10.9.0.1"),
        ];
        let found = run(&claims, &pods, &[]);
        assert_eq!(
            found,
            [
                (
                    DriftKind::PodWithoutClaim,
                    "10.0.0.10".into(),
                    "other/twin".into()
                ),
                (
                    DriftKind::PodWithoutClaim,
                    "10.0.0.12".into(),
                    "other/squatter".into()
                ),
            ]
        );
        // A finished pod runs on nothing.
        let mut done = foreign("done", "10.0.0.13");
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert_eq!(run(&claims, &[pods[0].clone(), done], &[]), []);
    }

    #[test]
    fn a_pod_whose_ip_differs_from_its_claim_is_found() {
        let claims = [old("10.0.0.10", "web-a", "ua")];
        let pods = [pod("web-a", "ua", "10.0.0.10", &["10.0.0.13", "fd00::1"])];
        let (pods, plain) = kept(&pods);
        let report = compare(&Inputs {
            claims: &claims,
            pods: &pods,
            plain: &plain,
            listed: &parse_ip_spec("10.0.0.10-10.0.0.13").unwrap(),
            cni: &[],
            app_label: "app",
            now: NOW,
            settle: SETTLE_SECONDS,
            vms: &HashSet::new(),
            network: None,
        });
        assert_eq!(report.len(), 1, "{report:?}");
        assert_eq!(report[0].kind, DriftKind::PodIpDiffers);
        assert_eq!(report[0].ip.to_string(), "10.0.0.10");
        assert_eq!(
            report[0].detail,
            "claimed 10.0.0.10 for app default/web, but the pod runs on 10.0.0.13, fd00::1"
        );
        // An IPv6 claim of a pod that runs on IPv4 only is not compared.
        let v6 = old("fd00::10", "web-a", "ua");
        let pods = [pod("web-a", "ua", "10.0.0.10", &["10.0.0.10"])];
        assert_eq!(run(&[claims[0].clone(), v6], &pods, &[]), []);
    }

    fn hold(ip: &str, namespace: &str, pod: &str) -> CniHold {
        CniHold {
            ip: ip.parse().unwrap(),
            namespace: namespace.into(),
            pod: pod.into(),
            record: "test".into(),
        }
    }

    #[test]
    fn a_cni_hold_for_a_gone_pod_on_a_list_ip_is_found() {
        let claims = [old("10.0.0.10", "web-a", "ua")];
        let pods = [pod("web-a", "ua", "10.0.0.10", &["10.0.0.10"])];
        let holds = [
            hold("10.0.0.10", "default", "web-a"),
            hold("10.0.0.11", "default", "web-gone"),
            hold("10.9.0.5", "default", "not-ours"),
        ];
        assert_eq!(
            run(&claims, &pods, &holds),
            [(
                DriftKind::CniHoldsGonePod,
                "10.0.0.11".into(),
                "default/web-gone".into()
            )]
        );
    }

    #[test]
    fn plain_pods_are_kept_compact_and_judged_as_whole_ones() {
        // a Bound claim whose pod carries none of our marks any more (labels edited away)
        let mut unmarked = pod("web-a", "ua", "10.0.0.10", &["10.0.0.11"]);
        unmarked.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        unmarked.metadata.annotations = None;
        let mut idle = foreign("sleeper", "10.0.0.12");
        idle.metadata.namespace = Some("default".into());
        idle.status = None;
        let pods = [unmarked, foreign("squatter", "10.0.0.13"), idle];
        let (marked, plain) = kept(&pods);
        assert!(marked.is_empty(), "{marked:?}");
        assert!(matches!(plain[0], PlainPod::Running(_)), "{plain:?}");
        assert!(matches!(plain[2], PlainPod::Idle { .. }), "{plain:?}");
        let claims = [old("10.0.0.10", "web-a", "ua")];
        let holds = [
            hold("10.0.0.12", "default", "sleeper"),
            hold("10.0.0.10", "default", "web-gone"),
        ];
        assert_eq!(
            run(&claims, &pods, &holds),
            [
                (
                    DriftKind::PodWithoutClaim,
                    "10.0.0.13".into(),
                    "other/squatter".into()
                ),
                // the claim's pod is found by UID among the plain pods, on another IP
                (
                    DriftKind::PodIpDiffers,
                    "10.0.0.10".into(),
                    "default/web-a".into()
                ),
                // the sleeper exists, so only web-gone's record is of a gone pod
                (
                    DriftKind::CniHoldsGonePod,
                    "10.0.0.10".into(),
                    "default/web-gone".into()
                ),
            ]
        );
    }

    #[test]
    fn only_the_plain_pods_and_records_a_finding_can_name_are_kept() {
        let listed = parse_ip_spec("10.0.0.10-10.0.0.13").unwrap();
        let claims = [
            old("10.0.0.20", "web-a", "ua"),
            // released: names no pod
            Claim {
                phase: Phase::Released,
                ..old("10.0.0.21", "web-b", "ub")
            },
        ];
        let mut wanted = wanted::Wanted::new(&claims, &listed);
        let holds = [
            hold("10.0.0.12", "other", "named"),
            hold("10.0.0.20", "other", "named-too"),
            hold("10.9.0.1", "other", "unlisted"),
        ];
        let records: Vec<bool> = holds.iter().map(|h| wanted.keep_hold(h)).collect();
        assert_eq!(records, [true, true, false]);
        let mut claimed = foreign("claimed", "10.9.0.9");
        claimed.metadata.namespace = Some("default".into());
        claimed.metadata.uid = Some("ua".into());
        let mut released = foreign("released", "10.9.0.8");
        released.metadata.namespace = Some("default".into());
        released.metadata.uid = Some("ub".into());
        let mut named = foreign("named", "10.9.0.7");
        named.status = None;
        let pods = [
            foreign("on-list", "10.0.0.13"),
            foreign("on-claim", "10.0.0.20"),
            claimed,
            named,
            foreign("named-too", "10.9.0.6"),
            foreign("elsewhere", "10.9.0.5"),
            released,
            foreign("unlisted", "10.9.0.1"),
        ];
        let (_, plain) = kept(&pods);
        let names: Vec<&str> = plain
            .iter()
            .filter(|p| wanted.keeps(p))
            .map(|p| p.identity().1)
            .collect();
        assert_eq!(
            names,
            ["on-list", "on-claim", "claimed", "named", "named-too"]
        );
    }

    fn dynamic(value: Value) -> DynamicObject {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn calico_blocks_name_the_pod_of_each_allocation() {
        let block = dynamic(json!({
            "apiVersion": "crd.projectcalico.org/v1", "kind": "IPAMBlock",
            "metadata": {"name": "10-0-0-0-30"},
            "spec": {
                "cidr": "10.0.0.0/30",
                "allocations": [null, 0, 1, 2],
                "unallocated": [0],
                "attributes": [
                    {"handle_id": "k8s-pod-network.aaa", "secondary": {"namespace": "default", "pod": "web-a", "node": "n1"}},
                    {"handle_id": "ipip-tunnel-addr-n1", "secondary": {"node": "n1", "type": "ipipTunnelAddress"}},
                    {"handle_id": "k8s-pod-network.ccc", "secondary": {"namespace": "default", "pod": "web-c"}, "releasedAt": "2025-11-29T07:00:00Z"},
                ],
                "strictAffinity": false,
            },
        }));
        assert_eq!(
            calico_holds(&block),
            [CniHold {
                ip: "10.0.0.1".parse().unwrap(),
                namespace: "default".into(),
                pod: "web-a".into(),
                record: "Calico IPAMBlock 10-0-0-0-30 (handle k8s-pod-network.aaa)".into(),
            }]
        );
        let v6 = dynamic(json!({
            "metadata": {"name": "fd00--122"},
            "spec": {"cidr": "fd00::/122", "allocations": [null, null, 0], "attributes": [
                {"handle_id": "h", "secondary": {"namespace": "ns", "pod": "p"}}]},
        }));
        assert_eq!(calico_holds(&v6)[0].ip.to_string(), "fd00::2");
        // Junk gives nothing, never a panic.
        for junk in [
            json!({"spec": {"cidr": "nonsense", "allocations": [0]}}),
            json!({"spec": {"cidr": "10.0.0.0/31", "allocations": [5, "x", 0, 0, 0], "attributes": [{"secondary": {"namespace": "a", "pod": "b"}}]}}),
            json!({}),
        ] {
            let mut object = junk;
            object["metadata"] = json!({"name": "b"});
            let holds = calico_holds(&dynamic(object));
            assert!(holds.len() <= 1, "{holds:?}");
            assert!(holds.iter().all(|h| h.ip.to_string() == "10.0.0.0"));
        }
    }

    #[test]
    fn kube_ovn_ip_objects_of_plain_pods_only() {
        let ip = |spec: Value, owners: Value| {
            dynamic(json!({
                "apiVersion": "kubeovn.io/v1", "kind": "IP",
                "metadata": {"name": "x", "ownerReferences": owners},
                "spec": spec,
            }))
        };
        let pod = ip(
            json!({"podName": "web-a", "namespace": "default", "ipAddress": "10.0.0.10,fd00::a", "podType": ""}),
            json!([]),
        );
        let holds = kube_ovn_holds(&pod);
        assert_eq!(holds.len(), 2);
        assert_eq!(
            (holds[0].namespace.as_str(), holds[0].pod.as_str()),
            ("default", "web-a")
        );
        assert_eq!(holds[0].record, "Kube-OVN IP x");
        for (spec, owners) in [
            (
                json!({"podName": "db-0", "namespace": "default", "ipAddress": "10.0.0.11", "podType": "StatefulSet"}),
                json!([]),
            ),
            (
                json!({"podName": "vm", "namespace": "default", "ipAddress": "10.0.0.12", "podType": "VirtualMachine"}),
                json!([]),
            ),
            (
                json!({"podName": "node1", "nodeName": "node1", "namespace": "", "ipAddress": "10.0.0.13"}),
                json!([]),
            ),
            (
                json!({"podName": "x", "namespace": "default", "ipAddress": "10.0.0.14"}),
                json!([{"apiVersion": "kubeovn.io/v1", "kind": "Subnet", "name": "s", "uid": "u"}]),
            ),
        ] {
            assert_eq!(kube_ovn_holds(&ip(spec.clone(), owners)), [], "{spec}");
        }
    }

    #[test]
    fn the_table_and_json_forms() {
        let pods = [foreign("squatter", "10.0.0.12")];
        let listed = parse_ip_spec("10.0.0.10-10.0.0.13").unwrap();
        let (pods, plain) = kept(&pods);
        let mut report = Report {
            drift: compare(&Inputs {
                claims: &[],
                pods: &pods,
                plain: &plain,
                listed: &listed,
                cni: &[],
                app_label: "app",
                now: NOW,
                settle: SETTLE_SECONDS,
                vms: &HashSet::new(),
                network: None,
            }),
            compared: Compared {
                claims: 0,
                pods: 1,
                kube_ovn_ips: None,
                calico_allocations: Some(3),
                namespace: None,
            },
        };
        assert_eq!(
            report.to_table(),
            "KIND                IP          POD              DETAIL\n\
             pod-without-claim   10.0.0.12   other/squatter   runs on 10.0.0.12, which is on a list or in a FixedIPPool, with no claim\n\
             \n1 drift found; compared 0 claims, 1 pods, no Kube-OVN IP objects (not installed), 3 Calico IPAM allocations.\n"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["drift"][0]["kind"], "pod-without-claim");
        assert_eq!(json["compared"]["kube_ovn_ips"], Value::Null);
        report.retain_namespace("default");
        assert!(report.to_table().starts_with("No drift: compared"));
        assert!(report.to_table().ends_with("(namespace default).\n"));
    }
}
