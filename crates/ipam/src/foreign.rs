//! What the cluster says about IPs outside the ledger ([`ForeignIps`]), as the allocator asks
//! it; in-cluster the webhook's `cluster::index::ClusterIps` answers.

use std::net::IpAddr;

/// Who uses an IP outside ip-webhook's ledger, as the cluster says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignUse {
    pub namespace: String,
    pub name: String,
    /// The Kube-OVN `IP` object recording it, if any.
    pub ovn_ip: Option<String>,
    /// The KubeVirt VM (in `namespace`) the pod is a launcher pod of, if it is one.
    pub vm: Option<String>,
}

impl ForeignUse {
    /// `pod default/x (Kube-OVN IP x.default)`; a launcher pod as its VM, `vm default/db (pod
    /// default/virt-launcher-db-x)`.
    pub fn describe(&self) -> String {
        let mut text = format!("pod {}/{}", self.namespace, self.name);
        if let Some(vm) = &self.vm {
            text = format!("vm {}/{vm} ({text})", self.namespace);
        }
        if let Some(ip) = &self.ovn_ip {
            text.push_str(&format!(" (Kube-OVN IP {ip})"));
        }
        text
    }

    pub(crate) fn is_pod(&self, namespace: &str, name: &str) -> bool {
        !name.is_empty() && self.namespace == namespace && self.name == name
    }

    /// Whether this is a launcher pod of the VM `namespace/vm`: one of the VM's carriers.
    pub(crate) fn runs_vm(&self, namespace: &str, vm: Option<&str>) -> bool {
        vm.is_some() && self.namespace == namespace && self.vm.as_deref() == vm
    }
}

/// What the cluster says is using an IP (live pods, Kube-OVN `IP` objects).
pub trait ForeignIps: Send + Sync {
    fn user(&self, ip: &IpAddr) -> Option<ForeignUse>;

    /// The API server says `user` no longer uses `ip` (it is gone): what is known of the
    /// cluster lags behind, and `user` is not counted on `ip` any more.
    fn gone(&self, ip: &IpAddr, user: &ForeignUse) {
        let _ = (ip, user);
    }
}
