//! The `ip-webhook.io/v1alpha1` custom resources, defined once here: `IPPool` and `IPClaim`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "ip-webhook.io";
pub const VERSION: &str = "v1alpha1";

/// A pool of IPs that pods opt into with the `ip-webhook.io/ip-pool` annotation.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ip-webhook.io",
    version = "v1alpha1",
    kind = "IPPool",
    plural = "ippools",
    shortname = "ipp",
    status = "IPPoolStatus",
    printcolumn = r#"{"name":"CIDR","type":"string","jsonPath":".spec.cidr"}"#,
    printcolumn = r#"{"name":"Total","type":"integer","jsonPath":".status.total"}"#,
    printcolumn = r#"{"name":"Held","type":"integer","jsonPath":".status.held"}"#,
    printcolumn = r#"{"name":"Free","type":"integer","jsonPath":".status.free"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPPoolSpec {
    /// The pool's network, e.g. `10.20.0.0/24` or `fd00:20::/120`.
    pub cidr: String,
    /// The IPs to hand out (list, `a-b` ranges, CIDRs), a subset of `cidr`. Default: every
    /// usable address of `cidr` (IPv4 network and broadcast addresses left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ips: Option<Vec<String>>,
    /// IPs never to hand out.
    #[serde(
        default,
        rename = "excludeIPs",
        skip_serializing_if = "Option::is_none"
    )]
    pub exclude_ips: Option<Vec<String>>,
    /// Namespaces whose pods may draw from this pool; empty means all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Vec<String>>,
    /// Pods that may draw from this pool; absent means all. Pods still opt in by annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPPoolStatus {
    pub total: u64,
    pub held: u64,
    pub free: u64,
}

/// One IP in use. Named after the IP, so creating it is the lock.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ip-webhook.io",
    version = "v1alpha1",
    kind = "IPClaim",
    plural = "ipclaims",
    shortname = "ipc",
    status = "IPClaimStatus",
    printcolumn = r#"{"name":"IP","type":"string","jsonPath":".spec.ip"}"#,
    printcolumn = r#"{"name":"Namespace","type":"string","jsonPath":".spec.namespace"}"#,
    printcolumn = r#"{"name":"App","type":"string","jsonPath":".spec.app"}"#,
    printcolumn = r#"{"name":"Pod","type":"string","jsonPath":".spec.podName"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPClaimSpec {
    pub ip: String,
    pub namespace: String,
    #[serde(default)]
    pub app: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(default)]
    pub pod_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub generate_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(default)]
    pub request_uid: String,
    /// `Allocated` (chosen by ip-webhook) or `Static` (written on the pod by hand).
    #[serde(default)]
    pub source: String,
    /// Set when the claim is bound to a StatefulSet pod: once the pod is gone the claim stays
    /// (phase `Released`) for `--sticky-grace`, so the recreated pod of the same name gets the
    /// IP back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sticky: bool,
    /// The claim's identity, which its pod carries as the `ip-webhook.io/claim` annotation
    /// (absent in claims made before it existed).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPClaimStatus {
    /// `Reserved`, `Bound`, `Terminating` or `Released`. A claim without status is `Reserved`:
    /// the API server drops `status` on create, so admission creates the claim without one.
    pub phase: String,
    /// RFC 3339; `Terminating`: when the IP may be released (the pod's grace period plus
    /// `--release-delay` after its DELETE), once its pod is verified gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_at: Option<String>,
    /// RFC 3339; when admission reserved the IP (absent: `metadata.creationTimestamp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_at: Option<String>,
    /// RFC 3339; the last phase change (for `Released`: when the pod went).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
}

/// The CRDs as multi-document YAML, as `ip-webhook crds` prints them.
pub fn crds_yaml() -> String {
    use kube::CustomResourceExt;
    let mut out = String::new();
    for crd in [IPPool::crd(), IPClaim::crd()] {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd).expect("CRDs serialize"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crds_are_cluster_scoped_with_status() {
        let yaml = crds_yaml();
        assert_eq!(yaml.matches("scope: Cluster").count(), 2);
        assert!(yaml.contains("name: ippools.ip-webhook.io"));
        assert!(yaml.contains("name: ipclaims.ip-webhook.io"));
        assert_eq!(
            yaml.matches("status: {}").count(),
            2,
            "status subresource on both"
        );
    }
}
