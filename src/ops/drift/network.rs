//! `check --drift --network`: the cluster as one secondary network's books see it. A pod's IPs
//! on the network are the ones Multus reports in its `k8s.v1.cni.cncf.io/network-status`
//! annotation, and the network's lists are the pods' `NAME.NAMESPACE.ip-webhook.io/allocatable-ips`;
//! the comparison ([`super::compare`]) is then the primary interface's, kind by kind. The
//! CNI's own records are the primary interface's, so none is compared.

use k8s_openapi::api::core::v1::{PodIP, PodStatus};

use super::PlainPod;
use super::fetch::Cluster;
use crate::decisions::secondary::list_annotation;
use ip_webhook_admission::networks::{NETWORK_STATUS, status_ips};
use ip_webhook_ipam::ipset::{IpSet, parse_ip_spec};
use ip_webhook_ledger::network::Network;

/// `cluster` as the books of `network` see it: each pod runs on its IPs on the network (none
/// before Multus has reported them), the lists are the network's, and no CNI record applies.
pub(crate) fn project(mut cluster: Cluster, network: &Network) -> Cluster {
    let key = list_annotation(network);
    let mut listed = IpSet::default();
    for pod in &mut cluster.pods {
        let annotations = pod.metadata.annotations.as_ref();
        if let Some(list) = annotations.and_then(|a| a.get(&key))
            && let Ok(set) = parse_ip_spec(list)
        {
            listed = listed.union(&set);
        }
        let ips = annotations
            .and_then(|a| a.get(NETWORK_STATUS))
            .map(|value| status_ips(value, &network.namespace, &network.name))
            .unwrap_or_default();
        let status = pod.status.get_or_insert_with(PodStatus::default);
        status.pod_ip = None;
        status.pod_ips = Some(ips.iter().map(|ip| PodIP { ip: ip.to_string() }).collect());
    }
    // a pod that names no network of Multus's is on none
    for pod in &mut cluster.plain {
        if let PlainPod::Running(slim) = pod {
            *pod = PlainPod::Idle {
                namespace: slim.namespace.as_str().into(),
                name: slim.name.clone(),
                uid: slim.uid.clone(),
            };
        }
    }
    Cluster {
        listed,
        cni: Vec::new(),
        kube_ovn_ips: None,
        calico_allocations: None,
        ..cluster
    }
}
