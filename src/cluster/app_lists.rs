//! Which app lists an IP, as the pod index (which pod events concern the reconciler) and the
//! reconciler's plans (`reconcile.rs`, list adoptions) both ask it.

use std::net::IpAddr;
use std::sync::Arc;

use crate::decisions::workloads::WorkloadRegistry;
use ip_webhook_ipam::allocator::Allocator;

/// Which app (`namespace/app`) lists an IP: in-cluster, the watched workloads' pod templates
/// (the same on every replica).
pub(crate) trait AppLists: Send + Sync {
    /// The one app whose list holds `ip`; `None` when no app's does, or two apps' do.
    fn sole_app_listing(&self, ip: IpAddr) -> Option<String>;

    /// A value that changes whenever the listed IPs, or the app that lists one, do; `None`:
    /// unknown, so the reconciler visits every running pod each pass.
    fn listed_version(&self) -> Option<u64> {
        None
    }

    /// Whether a held claim on `ip` is for the pod `namespace/pod` (by name, or by the
    /// `generateName` of a reservation made before the pod had one): that pod needs no
    /// adoption.
    fn claimed_for(&self, _ip: IpAddr, _namespace: &str, _pod: &str) -> bool {
        false
    }
}

impl AppLists for WorkloadRegistry {
    fn sole_app_listing(&self, ip: IpAddr) -> Option<String> {
        let mut apps = self.apps_listing(ip);
        if apps.len() == 1 { apps.pop() } else { None }
    }

    fn listed_version(&self) -> Option<u64> {
        Some(self.generation())
    }
}

/// The apps' lists in-cluster: the watched workloads' lists, with the primary interface's
/// claims to tell a pod that already holds its listed IP.
pub(crate) struct WorkloadLists {
    pub(crate) workloads: Arc<WorkloadRegistry>,
    pub(crate) allocator: Arc<Allocator>,
}

impl AppLists for WorkloadLists {
    fn sole_app_listing(&self, ip: IpAddr) -> Option<String> {
        self.workloads.sole_app_listing(ip)
    }

    fn listed_version(&self) -> Option<u64> {
        self.workloads.listed_version()
    }

    fn claimed_for(&self, ip: IpAddr, namespace: &str, pod: &str) -> bool {
        self.allocator.holder(&ip).is_some_and(|claim| {
            let named = &claim.pod;
            claim.is_held()
                && *named.namespace == *namespace
                && (*named.name == *pod
                    || (named.name.is_empty()
                        && !named.generate_name.is_empty()
                        && pod.starts_with(&*named.generate_name)))
        })
    }
}
