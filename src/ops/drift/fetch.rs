//! The reads behind `check --drift`: pods, workload lists, Kube-OVN `IP` objects and Calico
//! IPAM blocks from the API server, turned into the plain data [`super::compare`] takes.
//! A CNI whose resources the API server does not serve (404) is reported as not installed.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, ObjectList};
use kube::{Api, Client, Resource};

use super::wanted::Wanted;
use super::{CniHold, PlainPod, block_holds, kube_ovn_holds, pod_lists};
use crate::cluster::index::calico::IpamBlockObject;
use crate::cluster::index::{RunningPod, kube_ovn_ips};
use crate::cluster::listed_pod::ListedPod;
use crate::cluster::virtual_machines::{virtual_machine_instances, virtual_machines};
use crate::decisions::kubevirt::LAUNCHER_LABEL;
use ip_webhook_ipam::ipset::IpSet;
use ip_webhook_ipam::pools::PoolCatalog;
use ip_webhook_ledger::Claim;
use std::collections::HashSet;

#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("listing {what} failed: {source}")]
    List {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// The cluster's side of the comparison.
pub(crate) struct Cluster {
    /// The pods that carry our or the CNIs' labels or annotations, cut down.
    pub(crate) pods: Vec<Pod>,
    /// The other pods that can change a finding ([`Wanted`]), as compact records.
    pub(crate) plain: Vec<PlainPod>,
    /// How many pods were read.
    pub(crate) pod_count: usize,
    /// Every app's list (pods' and workloads' `allocatable-ips`) and every FixedIPPool.
    pub(crate) listed: IpSet,
    /// The CNI's records that can change a finding: on a listed or claimed IP.
    pub(crate) cni: Vec<CniHold>,
    /// Kube-OVN `IP` objects read; `None` when not served.
    pub(crate) kube_ovn_ips: Option<usize>,
    /// Calico allocations naming a pod; `None` when `ipamhandles` is not served.
    pub(crate) calico_allocations: Option<usize>,
    /// Lists that could not be read but the comparison went on without (workloads).
    pub(crate) warnings: Vec<String>,
    /// The KubeVirt VirtualMachines and VirtualMachineInstances (namespace, name) that exist:
    /// a VM's claim is held by them, not by a pod. Empty where KubeVirt is not installed.
    pub(crate) vms: HashSet<(String, String)>,
}

/// Calico's IPAM handles: their presence says Calico IPAM runs here.
pub(crate) fn calico_ipam_handles() -> ApiResource {
    calico("IPAMHandle", "ipamhandles")
}

fn calico(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("crd.projectcalico.org", "v1", kind),
        plural,
    )
}

/// Every object of `api`, page by page ([`PAGE`] a page); `Ok(None)` when not served (404).
async fn list_all<K>(api: &Api<K>, what: &'static str) -> Result<Option<Vec<K>>, FetchError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let served = list_each(api, what, PAGE, |page| items.extend(page)).await?;
    Ok(served.then_some(items))
}

/// Whether `api` is served (a list of one object answers; 404: not served).
async fn served<K>(api: &Api<K>, what: &'static str) -> Result<bool, FetchError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(source) => Err(FetchError::List { what, source }),
    }
}

/// Objects a page, as the reconciler's lists ([`crate::cluster::list_pages`]).
const PAGE: u32 = 500;

/// Calico `IPAMBlock`s a page: a block holds up to 64 allocations (a /26), so a page of 500
/// blocks would carry 32,000, and read and parsed at once it set the command's peak (about
/// 25 MiB of it at 150,000 pods); 50 blocks carry about as many entries as a page of pods.
const BLOCK_PAGE: u32 = 50;

/// Hand each page of `api` (`page` objects) to `each` before reading the next, so that what
/// is kept of a kind is what `each` keeps; `Ok(false)` when not served (404).
async fn list_each<K>(
    api: &Api<K>,
    what: &'static str,
    page: u32,
    mut each: impl FnMut(Vec<K>),
) -> Result<bool, FetchError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut params = ListParams::default().limit(page);
    loop {
        match api.list(&params).await {
            Ok(page) => {
                each(page.items);
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(token) => params = params.continue_token(&token),
                    None => return Ok(true),
                }
            }
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(false),
            Err(source) => return Err(FetchError::List { what, source }),
        }
    }
}

/// Every pod of the cluster, page by page, each page read as [`ListedPod`]s (the fields the
/// comparison keeps) and handed to `each` as pods before the next is read.
async fn list_pods(client: &Client, mut each: impl FnMut(Vec<Pod>)) -> Result<(), FetchError> {
    let request = kube::core::Request::new(Pod::url_path(&(), None));
    crate::cluster::list_pages(
        |params: ListParams| {
            let built = request.list(&params);
            async move {
                let built = built.map_err(kube::Error::BuildRequest)?;
                client.request::<ObjectList<ListedPod>>(built).await
            }
        },
        |page| each(page.into_iter().map(|pod| pod.0).collect()),
    )
    .await
    .map_err(|source| FetchError::List {
        what: "pods",
        source,
    })
}

/// Whether a label or annotation key is ours, a CNI's or Multus's (a secondary network's IPs,
/// with `--network`): a pod with one is kept as an object. A secondary network's own keys are
/// under a subdomain of ours or Kube-OVN's (`storage.default.ip-webhook.io/allocatable-ips`).
fn marked_key(key: &str) -> bool {
    let Some((prefix, _)) = key.split_once('/') else {
        return false;
    };
    let under = |domain: &str| {
        prefix == domain
            || prefix
                .strip_suffix(domain)
                .is_some_and(|sub| sub.ends_with('.'))
    };
    under("ip-webhook.io")
        || under("ovn.kubernetes.io")
        || prefix == "cni.projectcalico.org"
        || prefix == "k8s.v1.cni.cncf.io"
}

/// A pod as the comparison keeps it.
#[derive(Debug)]
pub(crate) enum KeptPod {
    /// It carries our or the CNIs' labels or annotations: cut down ([`slim_pod`]).
    Marked(Box<Pod>),
    Plain(PlainPod),
}

/// `pod` as the comparison keeps it; `None` for a plain pod without a namespace, name or UID.
pub(crate) fn keep_pod(pod: Pod, app_label: &str) -> Option<KeptPod> {
    let meta = &pod.metadata;
    let marked = meta.labels.iter().flatten().any(|(key, _)| marked_key(key))
        || meta
            .annotations
            .iter()
            .flatten()
            .any(|(key, _)| marked_key(key));
    if marked {
        return Some(KeptPod::Marked(Box::new(slim_pod(pod, app_label))));
    }
    if let Some(slim) = RunningPod::from_pod(&pod) {
        return Some(KeptPod::Plain(PlainPod::Running(slim)));
    }
    Some(KeptPod::Plain(PlainPod::Idle {
        namespace: meta.namespace.as_deref()?.into(),
        name: meta.name.as_deref()?.into(),
        uid: meta.uid.as_deref()?.into(),
    }))
}

/// A pod as the comparison keeps it: read as a [`ListedPod`] (identity, owners, creation and
/// deletion, labels and annotations, node, host networking, phase, IPs, and nothing else),
/// with only our and the CNIs' labels (and `app_label`) and annotations left.
pub(crate) fn slim_pod(mut pod: Pod, app_label: &str) -> Pod {
    let metadata = &mut pod.metadata;
    if let Some(labels) = metadata.labels.as_mut() {
        // KubeVirt's launcher label, with the owners, says whose launcher pod it is
        labels.retain(|key, _| key == app_label || key == LAUNCHER_LABEL.0 || marked_key(key));
    }
    if let Some(annotations) = metadata.annotations.as_mut() {
        annotations.retain(|key, _| marked_key(key));
    }
    pod
}

/// Sort one page of pods (read as [`ListedPod`]s) into the marked ones, cut down, and the
/// plain ones `keep` keeps.
pub(crate) fn keep_pods(
    page: Vec<Pod>,
    app_label: &str,
    keep: impl Fn(&PlainPod) -> bool,
    marked: &mut Vec<Pod>,
    plain: &mut Vec<PlainPod>,
) {
    for kept in page.into_iter().filter_map(|pod| keep_pod(pod, app_label)) {
        match kept {
            KeptPod::Marked(pod) => marked.push(*pod),
            KeptPod::Plain(pod) if keep(&pod) => plain.push(pod),
            KeptPod::Plain(_) => {}
        }
    }
}

/// Read the cluster: every pod, the lists of pods and workloads, and the CNI's records. (All
/// namespaces even for `-n`: a claim's pod, or the pod an IP is claimed for, may be elsewhere.)
/// Of the plain pods and the CNI's records, only those that can change a finding about the
/// held `claims` are kept ([`Wanted`]); the others are counted.
///
/// The CNI's records are read before the pods: a pod exists before the CNI allocates its IP,
/// so a record read first never names a pod created after the pods were listed.
pub(crate) async fn read(
    client: &Client,
    pools: &PoolCatalog,
    app_label: &str,
    claims: &[Claim],
) -> Result<Cluster, FetchError> {
    let mut warnings = Vec::new();
    let listed = pools.iter().fold(
        workload_lists(client, app_label, &mut warnings).await,
        |set, pool| set.union(&pool.usable),
    );
    let mut wanted = Wanted::new(claims, &listed);
    let mut cni = Vec::new();
    let (kube_ovn_ips, calico_allocations) = read_cni(client, &mut wanted, &mut cni).await?;
    let (mut pods, mut plain, mut pod_count) = (Vec::new(), Vec::new(), 0);
    list_pods(client, |page| {
        pod_count += page.len();
        keep_pods(
            page,
            app_label,
            |pod| wanted.keeps(pod),
            &mut pods,
            &mut plain,
        )
    })
    .await?;
    let listed = listed.union(&pod_lists(&pods));
    let only_on_pods = listed.subtract(wanted.ips());
    if !only_on_pods.is_empty() {
        let again = Wanted::ips_only(only_on_pods);
        read_again(client, app_label, again, &pods, &mut plain, &mut cni).await?;
    }
    let vms = virtual_machines_and_instances(client, &mut warnings).await;
    Ok(Cluster {
        vms,
        pods,
        plain,
        pod_count,
        listed,
        cni,
        kube_ovn_ips,
        calico_allocations,
        warnings,
    })
}

/// Every workload's list (`allocatable-ips` on its pod template), page by page; a kind that
/// cannot be read is a warning and its lists are left out.
async fn workload_lists(client: &Client, app_label: &str, warnings: &mut Vec<String>) -> IpSet {
    let mut listed = IpSet::default();
    for (group, kind) in crate::decisions::workloads::KINDS {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, "v1", kind),
            &format!("{}s", kind.to_lowercase()),
        );
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let read = list_each(&api, "workloads", PAGE, |page| {
            for object in &page {
                if let Some(listing) =
                    crate::decisions::workloads::listing_of(kind, object, app_label)
                {
                    listed = listed.union(&listing.set);
                }
            }
        })
        .await;
        if let Err(error) = read {
            warnings.push(format!("{kind}s: {error}; their lists are left out"));
        }
    }
    listed
}

/// The CNI's records, page by page, into `cni` as far as `wanted` keeps them; how many
/// Kube-OVN `IP` objects and Calico allocations there were (`None`: not served).
async fn read_cni(
    client: &Client,
    wanted: &mut Wanted,
    cni: &mut Vec<CniHold>,
) -> Result<(Option<usize>, Option<usize>), FetchError> {
    let mut ovn_objects = 0;
    let ovn = list_each(
        &Api::<DynamicObject>::all_with(client.clone(), &kube_ovn_ips()),
        "Kube-OVN IP objects (ips.kubeovn.io)",
        PAGE,
        |page| {
            ovn_objects += page.len();
            let holds = page.iter().flat_map(kube_ovn_holds);
            cni.extend(holds.filter(|hold| wanted.keep_hold(hold)));
        },
    )
    .await?;
    let handles = served(
        &Api::<DynamicObject>::all_with(client.clone(), &calico_ipam_handles()),
        "Calico IPAM handles (ipamhandles.crd.projectcalico.org)",
    )
    .await?;
    let mut calico_allocations = None;
    if handles {
        // each block read as the fields its holds are made of
        let mut allocations = 0;
        list_each(
            &Api::<IpamBlockObject>::all(client.clone()),
            "Calico IPAM blocks (ipamblocks.crd.projectcalico.org)",
            BLOCK_PAGE,
            |page| {
                for block in &page {
                    let name = block.metadata.name.as_deref().unwrap_or("");
                    let holds = block_holds(name, &block.spec);
                    allocations += holds.len();
                    cni.extend(holds.into_iter().filter(|hold| wanted.keep_hold(hold)));
                }
            },
        )
        .await?;
        calico_allocations = Some(allocations);
    }
    Ok((ovn.then_some(ovn_objects), calico_allocations))
}

/// The plain pods and CNI records on the IPs `wanted` keeps, which only pods' own lists name
/// (a bare pod's, or one whose workload kind is not read): those lists are known once every
/// pod is read, so they take a second read. A pod kept already is not kept again.
async fn read_again(
    client: &Client,
    app_label: &str,
    mut wanted: Wanted,
    pods: &[Pod],
    plain: &mut Vec<PlainPod>,
    cni: &mut Vec<CniHold>,
) -> Result<(), FetchError> {
    read_cni(client, &mut wanted, cni).await?;
    let known: HashSet<(String, String)> = pods
        .iter()
        .filter_map(|pod| Some((pod.metadata.namespace.clone()?, pod.metadata.uid.clone()?)))
        .chain(plain.iter().map(|pod| {
            let (namespace, _, uid) = pod.identity();
            (namespace.to_string(), uid.to_string())
        }))
        .collect();
    let new = |pod: &PlainPod| {
        let (namespace, _, uid) = pod.identity();
        !known.contains(&(namespace.to_string(), uid.to_string()))
    };
    let mut marked = Vec::new();
    list_pods(client, |page| {
        // the marked pods were all kept by the first read
        keep_pods(
            page,
            app_label,
            |pod| wanted.keeps(pod) && new(pod),
            &mut marked,
            plain,
        );
        marked.clear();
    })
    .await
}

/// The KubeVirt VirtualMachines and VirtualMachineInstances that exist (namespace, name); a
/// list that cannot be read is a warning (none where KubeVirt is not installed).
async fn virtual_machines_and_instances(
    client: &Client,
    warnings: &mut Vec<String>,
) -> HashSet<(String, String)> {
    let mut vms = HashSet::new();
    for (resource, what) in [
        (virtual_machines(), "KubeVirt VirtualMachines"),
        (
            virtual_machine_instances(),
            "KubeVirt VirtualMachineInstances",
        ),
    ] {
        let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
        match list_all(&api, what).await {
            Ok(objects) => vms.extend(
                objects
                    .into_iter()
                    .flatten()
                    .filter_map(|object| Some((object.metadata.namespace?, object.metadata.name?))),
            ),
            Err(error) => warnings.push(format!(
                "{what}: {error}; the claims of stopped VMs are reported as without a pod"
            )),
        }
    }
    vms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_keys_the_cnis_multus_and_a_networks_own_are_marked() {
        for key in [
            "ip-webhook.io/claim",
            "storage.default.ip-webhook.io/allocatable-ips",
            "cni.projectcalico.org/ipAddrs",
            "ovn.kubernetes.io/ip_address",
            "storage.default.ovn.kubernetes.io/ip_address",
            "k8s.v1.cni.cncf.io/network-status",
        ] {
            assert!(marked_key(key), "{key}");
        }
        for key in [
            "app",
            "example.com/ip-webhook.io",
            "notip-webhook.io/claim",
            "x.cni.projectcalico.org/ipAddrs",
            "kubectl.kubernetes.io/restartedAt",
        ] {
            assert!(!marked_key(key), "{key}");
        }
    }

    /// `pod` as the list read gives it.
    fn listed(pod: &Pod) -> Pod {
        serde_json::from_value::<ListedPod>(serde_json::to_value(pod).unwrap())
            .unwrap()
            .0
    }

    #[test]
    fn a_slim_pod_keeps_what_the_comparison_reads() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "web-0", "namespace": "prod", "uid": "u1",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "deletionTimestamp": "2026-01-01T00:01:00Z",
                "labels": {"team": "x", "app": "web", "ip-webhook.io/allocated-ip": "10.0.0.7"},
                "annotations": {"big": "y", "cni.projectcalico.org/ipAddrs": "[\"10.0.0.7\"]",
                                "ovn.kubernetes.io/ip_address": "10.0.0.8",
                                "ip-webhook.io/allocatable-ips": "10.0.0.7-10.0.0.9"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "r", "controller": true}],
                "managedFields": [{"manager": "kubectl", "operation": "Update"}],
            },
            "spec": {"nodeName": "n1", "hostNetwork": false, "containers": [{"name": "main", "image": "x"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}],
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
        let slim = slim_pod(listed(&pod), "app");
        assert_eq!(
            RunningPod::from_pod(&slim),
            RunningPod::from_pod(&pod),
            "the pod-IP view is the same"
        );
        assert_eq!(
            pod_lists(std::slice::from_ref(&slim)),
            pod_lists(std::slice::from_ref(&pod))
        );
        let meta = &slim.metadata;
        assert_eq!(meta.managed_fields, None);
        assert_eq!(meta.labels.as_ref().unwrap().len(), 2);
        assert_eq!(meta.annotations.as_ref().unwrap().len(), 3);
        assert_eq!(meta.owner_references, pod.metadata.owner_references);
        assert_eq!(meta.deletion_timestamp, pod.metadata.deletion_timestamp);
        assert!(slim.spec.as_ref().unwrap().containers.is_empty());
        assert_eq!(slim.status.as_ref().unwrap().conditions, None);
    }

    #[test]
    fn a_pod_read_from_a_list_is_the_slim_pod_the_whole_one_makes() {
        let mut whole = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "web-0", "namespace": "prod", "uid": "u1", "generateName": "web-",
                "resourceVersion": "812", "generation": 1, "finalizers": ["x/y"],
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "deletionTimestamp": "2026-01-01T00:01:00Z", "deletionGracePeriodSeconds": 30,
                "labels": {"team": "x", "app": "web", "ip-webhook.io/allocated-ip": "10.0.0.7"},
                "annotations": {"big": "y", "ip-webhook.io/claim": "t"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "s", "controller": true}],
                "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:metadata": {}}}],
            },
            "spec": {"nodeName": "n1", "hostNetwork": false,
                     "containers": [{"name": "main", "image": "x", "env": [{"name": "A", "value": "b"}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.7",
                       "podIPs": [{"ip": "10.0.0.7"}, {"ip": "fd00::7"}],
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "main", "ready": true, "restartCount": 0, "image": "x", "imageID": "", "state": {"running": {}}}]},
        });
        let read = |value: &serde_json::Value| {
            let listed: ListedPod = serde_json::from_value(value.clone()).unwrap();
            let pod: Pod = serde_json::from_value(value.clone()).unwrap();
            (listed.0, pod)
        };
        let (listed, pod) = read(&whole);
        // everything the comparison reads of a pod, the same either way
        let read_fields = |pod: &Pod| {
            let meta = &pod.metadata;
            (
                RunningPod::from_pod(pod),
                crate::cluster::claiming_pod(meta, "app"),
                pod_lists(std::slice::from_ref(pod)),
                (meta.generate_name.clone(), meta.owner_references.clone()),
                (meta.labels.clone(), meta.annotations.clone()),
                (
                    meta.deletion_timestamp.clone(),
                    meta.deletion_grace_period_seconds,
                ),
            )
        };
        assert_eq!(
            read_fields(&slim_pod(listed.clone(), "app")),
            read_fields(&slim_pod(pod.clone(), "app"))
        );
        assert!(matches!(keep_pod(listed, "app"), Some(KeptPod::Marked(_))));
        // a plain pod: the same compact record either way
        whole["metadata"]["labels"] = serde_json::json!({"app": "web"});
        whole["metadata"]["annotations"] = serde_json::json!({});
        let (listed, pod) = read(&whole);
        let compact = |pod: Pod| match keep_pod(pod, "app") {
            Some(KeptPod::Plain(PlainPod::Running(slim))) => slim,
            other => panic!("not a running plain pod: {other:?}"),
        };
        assert_eq!(compact(listed), compact(pod));
    }
}
