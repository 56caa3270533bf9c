//! The reads behind `check --drift`: pods, workload lists, Kube-OVN `IP` objects and Calico
//! IPAM blocks from the API server, turned into the plain data [`super::compare`] takes.
//! A CNI whose resources the API server does not serve (404) is reported as not installed.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client};

use super::{CniHold, calico_holds, kube_ovn_holds, pod_lists};
use crate::cluster::index::kube_ovn_ips;
use crate::ipam::ipset::IpSet;
use crate::ipam::pools::PoolCatalog;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("listing {what} failed: {source}")]
    List {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// The cluster's side of the comparison.
pub struct Cluster {
    pub pods: Vec<Pod>,
    /// Every app's list (pods' and workloads' `allocatable-ips`) and every FixedIPPool.
    pub listed: IpSet,
    pub cni: Vec<CniHold>,
    /// Kube-OVN `IP` objects read; `None` when not served.
    pub kube_ovn_ips: Option<usize>,
    /// Calico allocations naming a pod; `None` when `ipamhandles` is not served.
    pub calico_allocations: Option<usize>,
    /// Lists that could not be read but the comparison went on without (workloads).
    pub warnings: Vec<String>,
}

/// Calico's IPAM handles: their presence says Calico IPAM runs here.
pub fn calico_ipam_handles() -> ApiResource {
    calico("IPAMHandle", "ipamhandles")
}

/// Calico's IPAM blocks: which pod each allocated IP is for.
pub fn calico_ipam_blocks() -> ApiResource {
    calico("IPAMBlock", "ipamblocks")
}

fn calico(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("crd.projectcalico.org", "v1", kind),
        plural,
    )
}

/// Every object of `api`, page by page (500 a page); `Ok(None)` when not served (404).
async fn list_all<K>(api: &Api<K>, what: &'static str) -> Result<Option<Vec<K>>, FetchError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        match api.list(&params).await {
            Ok(page) => {
                items.extend(page.items);
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(token) => params = params.continue_token(&token),
                    None => return Ok(Some(items)),
                }
            }
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(None),
            Err(source) => return Err(FetchError::List { what, source }),
        }
    }
}

/// Read the cluster: every pod, the lists of pods and workloads, and the CNI's records. (All
/// namespaces even for `-n`: a claim's pod, or the pod an IP is claimed for, may be elsewhere.)
pub async fn read(
    client: &Client,
    pools: &PoolCatalog,
    app_label: &str,
) -> Result<Cluster, FetchError> {
    let pods_api: Api<Pod> = Api::all(client.clone());
    let pods = list_all(&pods_api, "pods").await?.unwrap_or_default();
    let mut listed = pools
        .iter()
        .fold(pod_lists(&pods), |set, pool| set.union(&pool.usable));
    let mut warnings = Vec::new();
    for (group, kind) in crate::webhook::workloads::KINDS {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, "v1", kind),
            &format!("{}s", kind.to_lowercase()),
        );
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        match list_all(&api, "workloads").await {
            Ok(objects) => {
                for object in objects.iter().flatten() {
                    if let Some(listing) =
                        crate::webhook::workloads::listing_of(kind, object, app_label)
                    {
                        listed = listed.union(&listing.set);
                    }
                }
            }
            Err(error) => warnings.push(format!("{kind}s: {error}")),
        }
    }
    let mut cni = Vec::new();
    let ovn = list_all(
        &Api::<DynamicObject>::all_with(client.clone(), &kube_ovn_ips()),
        "Kube-OVN IP objects (ips.kubeovn.io)",
    )
    .await?;
    if let Some(objects) = &ovn {
        cni.extend(objects.iter().flat_map(kube_ovn_holds));
    }
    let handles = list_all(
        &Api::<DynamicObject>::all_with(client.clone(), &calico_ipam_handles()),
        "Calico IPAM handles (ipamhandles.crd.projectcalico.org)",
    )
    .await?;
    let mut calico_allocations = None;
    if handles.is_some() {
        let blocks = list_all(
            &Api::<DynamicObject>::all_with(client.clone(), &calico_ipam_blocks()),
            "Calico IPAM blocks (ipamblocks.crd.projectcalico.org)",
        )
        .await?
        .unwrap_or_default();
        let holds: Vec<CniHold> = blocks.iter().flat_map(calico_holds).collect();
        calico_allocations = Some(holds.len());
        cni.extend(holds);
    }
    Ok(Cluster {
        pods,
        listed,
        cni,
        kube_ovn_ips: ovn.map(|o| o.len()),
        calico_allocations,
        warnings,
    })
}
