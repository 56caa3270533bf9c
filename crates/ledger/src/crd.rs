//! The `ip-webhook.io/v1alpha1` custom resources, defined once here: `FixedIPPool` and
//! `IPClaim`.
//!
//! Names: no kind, plural or short name of ours is one that Calico (`crd.projectcalico.org`,
//! `projectcalico.org`), Kube-OVN (`kubeovn.io`) or Spiderpool (`spiderpool.spidernet.io`)
//! uses, so `kubectl get fixedippools` (or `fipp`) is never ambiguous in the clusters we run
//! in (the test below lists theirs). In particular the pool kind is not `IPPool`: Calico's and
//! Kube-OVN's pools are `ippools`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "ip-webhook.io";

/// A pool of IPs that pods opt into with the `ip-webhook.io/ip-pool` annotation.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ip-webhook.io",
    version = "v1alpha1",
    kind = "FixedIPPool",
    plural = "fixedippools",
    shortname = "fipp",
    status = "FixedIPPoolStatus",
    printcolumn = r#"{"name":"CIDR","type":"string","jsonPath":".spec.cidr"}"#,
    printcolumn = r#"{"name":"Total","type":"integer","jsonPath":".status.total"}"#,
    printcolumn = r#"{"name":"Held","type":"integer","jsonPath":".status.held"}"#,
    printcolumn = r#"{"name":"Free","type":"integer","jsonPath":".status.free"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct FixedIPPoolSpec {
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
pub struct FixedIPPoolStatus {
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
    pub(crate) pool: Option<String>,
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
    pub(crate) source: String,
    /// Set when the claim is bound to a StatefulSet pod: once the pod is gone the claim stays
    /// (phase `Released`) for `--sticky-grace`, so the recreated pod of the same name gets the
    /// IP back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sticky: bool,
    /// The claim's identity, which its pod carries as the `ip-webhook.io/claim` annotation
    /// (absent in claims made before it existed).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
    /// How many IPs the app's list held when the claim was made: `status` shows it as the
    /// app's SIZE (the newest claim's), and FREE and USED from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) list_size: Option<u64>,
    /// The KubeVirt VirtualMachine (in `namespace`) the claim belongs to: its launcher pods
    /// hold the IP in turn, and it is released only once the VM is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm: Option<String>,
    /// While a live migration's target pod holds the claim: the VM's other launcher pods
    /// that may still run the VM on this IP (the migrations' sources, oldest first, at most
    /// 8). Deleting the target gives the claim back to the newest; deleting one of them
    /// leaves the claim to the others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) migration_sources: Vec<MigrationSource>,
}

/// A launcher pod that may run a VM on its claim's IP besides the claim's own pod.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MigrationSource {
    pub(crate) pod_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pod_uid: Option<String>,
    /// The claim token it carries.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) token: String,
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
    /// The grant (`spec.requestUid`) this status was written for. A claim another admission
    /// took over (its `spec` replaced in one write, the status left as it was) reads as
    /// `Reserved` until its status is written for the new grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_uid: Option<String>,
}

/// The CRDs as multi-document YAML, as `ip-webhook crds` prints them.
pub fn crds_yaml() -> String {
    use kube::CustomResourceExt;
    let mut out = String::new();
    for crd in [FixedIPPool::crd(), IPClaim::crd()] {
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
        assert!(yaml.contains("name: fixedippools.ip-webhook.io"));
        assert!(yaml.contains("name: ipclaims.ip-webhook.io"));
        assert_eq!(
            yaml.matches("status: {}").count(),
            2,
            "status subresource on both"
        );
    }

    /// Kinds, plurals and short names of the CNIs we run next to, from their CRDs:
    /// Calico `libcalico-go/config/crd` and `api/config/crd` (crd.projectcalico.org,
    /// projectcalico.org), Kube-OVN `charts/kube-ovn/templates/kube-ovn-crd.yaml`, Spiderpool
    /// `charts/spiderpool/crds` (read 2026-11-30).
    #[rustfmt::skip]
    const THEIRS: &[&str] = &[
        // Calico
        "BGPConfiguration", "bgpconfigurations", "bgpconfig", "bgpconfigs", "BGPFilter",
        "bgpfilters", "BGPPeer", "bgppeers", "BlockAffinity", "blockaffinities", "affinity",
        "affinities", "CalicoNodeStatus", "caliconodestatuses", "ClusterInformation",
        "clusterinformations", "clusterinfo", "clusterinfos", "FelixConfiguration",
        "felixconfigurations", "GlobalNetworkPolicy", "globalnetworkpolicies", "gnp", "cgnp",
        "GlobalNetworkSet", "globalnetworksets", "gns", "HostEndpoint", "hostendpoints", "hep",
        "heps", "IPAMBlock", "ipamblocks", "IPAMConfig", "ipamconfigs", "IPAMConfiguration",
        "ipamconfigurations", "ipamconfig", "IPAMHandle", "ipamhandles", "IPPool", "ippools",
        "IPReservation", "ipreservations", "KubeControllersConfiguration",
        "kubecontrollersconfigurations", "kcc", "kccs", "NetworkPolicy", "networkpolicies",
        "cnp", "caliconetworkpolicy", "NetworkSet", "networksets", "StagedGlobalNetworkPolicy",
        "stagedglobalnetworkpolicies", "sgnp", "StagedKubernetesNetworkPolicy",
        "stagedkubernetesnetworkpolicies", "sknp", "StagedNetworkPolicy",
        "stagednetworkpolicies", "scnp", "snp", "Tier", "tiers", "QoSPolicy", "qospolicies",
        // Kube-OVN
        "IP", "ips", "ip", "ippool", "Subnet", "subnets", "subnet", "Vpc", "vpcs", "vpc", "Vlan",
        "vlans", "vlan", "Vip", "vips", "vip", "ProviderNetwork", "provider-networks", "pn",
        "SecurityGroup", "security-groups", "sg", "QoSPolicy", "qos-policies", "qos",
        "IptablesEIP", "iptables-eips", "eip", "IptablesFIPRule", "iptables-fip-rules", "fip",
        "IptablesDnatRule", "iptables-dnat-rules", "dnat", "IptablesSnatRule",
        "iptables-snat-rules", "snat", "OvnEip", "ovn-eips", "oeip", "OvnFip", "ovn-fips",
        "ofip", "OvnSnatRule", "ovn-snat-rules", "osnat", "OvnDnatRule", "ovn-dnat-rules",
        "odnat", "SwitchLBRule", "switch-lb-rules", "slr", "RouterLBRule", "router-lb-rules",
        "rlr", "VpcDns", "vpc-dnses", "vpc-dns", "VpcNatGateway", "vpc-nat-gateways",
        "vpc-nat-gw", "VpcEgressGateway", "vpc-egress-gateways", "vpc-egress-gw", "veg",
        "DNSNameResolver", "dnsnameresolvers", "dnr", "BgpConf", "bgp-confs", "EvpnConf",
        "evpn-confs",
        // Spiderpool
        "SpiderIPPool", "spiderippools", "sp", "SpiderSubnet", "spidersubnets", "ss",
        "SpiderEndpoint", "spiderendpoints", "se", "SpiderReservedIP", "spiderreservedips", "sr",
        "SpiderMultusConfig", "spidermultusconfigs", "smc", "SpiderCoordinator",
        "spidercoordinators", "scc",
    ];

    #[test]
    fn no_kind_plural_or_short_name_is_a_cnis() {
        use kube::CustomResourceExt;
        for crd in [FixedIPPool::crd(), IPClaim::crd()] {
            let names = &crd.spec.names;
            let ours: Vec<&str> = [names.kind.as_str(), names.plural.as_str()]
                .into_iter()
                .chain(names.singular.as_deref())
                .chain(names.short_names.iter().flatten().map(String::as_str))
                .collect();
            assert!(ours.len() >= 4, "{ours:?}");
            for name in ours {
                assert!(
                    !THEIRS.iter().any(|t| t.eq_ignore_ascii_case(name)),
                    "{name} is also a Calico, Kube-OVN or Spiderpool name"
                );
            }
        }
        let pool = FixedIPPool::crd();
        assert_eq!(pool.spec.names.kind, "FixedIPPool");
        assert_eq!(pool.spec.names.plural, "fixedippools");
        assert_eq!(pool.spec.names.short_names, Some(vec!["fipp".to_string()]));
    }
}
