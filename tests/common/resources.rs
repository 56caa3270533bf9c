//! The API resources of the CNI objects the tests create and read, under the group, version
//! and plural the CNIs' own CRDs give them.

use ip_webhook_admission::annotations::CniObject;
use kube::api::{ApiResource, GroupVersionKind};

/// The Calico IPReservation ip-webhook keeps, by the name its docs give users.
pub const RESERVATION_NAME: &str = "ip-webhook-fixed-ips";

/// A CNI object kind a replica reads, by the group, version, kind and plural the webhook
/// watches it under.
pub fn resource(object: CniObject) -> ApiResource {
    let (group, version, kind, plural) = object.resource();
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

pub fn calico_ippools() -> ApiResource {
    resource(CniObject::CalicoIpPools)
}

pub fn calico_reservations() -> ApiResource {
    resource(CniObject::CalicoIpReservations)
}

pub fn kube_ovn_subnets() -> ApiResource {
    resource(CniObject::KubeOvnSubnets)
}

pub fn kube_ovn_ips() -> ApiResource {
    resource(CniObject::KubeOvnIps)
}

/// Kube-OVN `IPPool`s (`kubeovn.io/v1`, cluster-scoped): what the webhook writes with
/// `--kube-ovn-reservation`.
pub fn kube_ovn_ippools() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubeovn.io", "v1", "IPPool"),
        "ippools",
    )
}
