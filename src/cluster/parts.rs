//! What the cluster's tasks take from the webhook: handles the decisions share with them, taken
//! once when in-cluster mode starts ([`Parts::of`]) and handed to each task as the narrow
//! capability it uses (an allocator, a registry, the pool catalog), never the whole
//! [`Webhook`].

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::decisions::Webhook;
use crate::decisions::cni_pools::NetworkRegistry;
use crate::decisions::kubevirt::KubevirtSettings;
use crate::decisions::workloads::WorkloadRegistry;
use crate::metrics::Metrics;
use ip_webhook_ipam::allocator::Allocator;
use ip_webhook_ipam::ipset::IpSet;
use ip_webhook_ipam::pools::PoolCatalog;
use ip_webhook_ledger::network::{Interface, Network};

use super::app_lists::WorkloadLists;

/// The webhook's handles the cluster's tasks use, each shared with the decisions.
pub(crate) struct Parts {
    /// Each interface's allocator: the claim watches, the reconciler (the primary's),
    /// node-loss release and the leak sweepers.
    pub(crate) interfaces: Interfaces,
    /// The pool catalog the FixedIPPool watch rebuilds and admissions read.
    pub(crate) pools: Arc<ArcSwap<PoolCatalog>>,
    /// Which workload lists which IPs: filled by the workload watches.
    pub(crate) workloads: Arc<WorkloadRegistry>,
    /// The CNI's pools or subnets: filled by the CNI watches.
    pub(crate) networks: Arc<NetworkRegistry>,
    pub(crate) metrics: Arc<Metrics>,
    /// The decisions' app label: how the workload watches and the sweepers read an app.
    pub(crate) app_label: String,
    /// Which pods are launcher pods and when a VM's IP is freed: the VM watches and the
    /// sweepers' pod lookups.
    pub(crate) kubevirt: KubevirtSettings,
}

impl Parts {
    pub(crate) fn of(webhook: &Webhook) -> Parts {
        Parts {
            interfaces: Interfaces::of(webhook),
            pools: webhook.pools.clone(),
            workloads: webhook.workloads.clone(),
            networks: webhook.networks.clone(),
            metrics: webhook.metrics.clone(),
            app_label: webhook.settings.app_label.clone(),
            kubevirt: webhook.settings.kubevirt.clone(),
        }
    }

    /// The apps' lists as the pod index and the reconciler read them.
    pub(crate) fn app_lists(&self) -> Arc<WorkloadLists> {
        Arc::new(WorkloadLists {
            workloads: self.workloads.clone(),
            allocator: self.interfaces.primary().clone(),
        })
    }

    /// Every IP ip-webhook may hand out, as the CNI reservation keepers read it.
    pub(crate) fn offered(&self) -> Offered {
        Offered {
            pools: self.pools.clone(),
            workloads: self.workloads.clone(),
        }
    }
}

/// Each interface IPs are given out on, with its allocator, as [`Webhook::interfaces`] lists
/// them (the primary interface's first, then each secondary network's), held by the tasks.
#[derive(Clone)]
pub(crate) struct Interfaces {
    primary: Arc<Allocator>,
    secondary: Vec<(Network, Arc<Allocator>)>,
}

impl Interfaces {
    pub(crate) fn of(webhook: &Webhook) -> Interfaces {
        Interfaces {
            primary: webhook.allocator.clone(),
            secondary: webhook
                .secondary
                .iter()
                .map(|(network, allocator)| (network.clone(), allocator.clone()))
                .collect(),
        }
    }

    /// The primary interface's allocator (the `IPClaim` books the reconciler keeps).
    pub(crate) fn primary(&self) -> &Arc<Allocator> {
        &self.primary
    }

    /// Each secondary network with its allocator.
    pub(crate) fn secondary(&self) -> impl Iterator<Item = (&Network, &Arc<Allocator>)> {
        self.secondary
            .iter()
            .map(|(network, allocator)| (network, allocator))
    }

    /// Every interface with its allocator, the primary's first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Interface<'_>, &Arc<Allocator>)> {
        std::iter::once((Interface::Primary, &self.primary)).chain(
            self.secondary()
                .map(|(network, allocator)| (Interface::Network(network), allocator)),
        )
    }

    /// Every interface's allocator, the primary's first.
    pub(crate) fn allocators(&self) -> Vec<Arc<Allocator>> {
        self.iter()
            .map(|(_, allocator)| allocator.clone())
            .collect()
    }
}

/// Every IP ip-webhook may hand out: all FixedIPPools' usable IPs and every admitted workload's
/// list. The CNI reservations (Calico's `IPReservation`, Kube-OVN's `IPPool`s) keep the CNI's
/// own assignment away from them.
#[derive(Clone)]
pub(crate) struct Offered {
    pub(crate) pools: Arc<ArcSwap<PoolCatalog>>,
    pub(crate) workloads: Arc<WorkloadRegistry>,
}

impl Offered {
    /// The IPs offered now.
    pub(crate) fn ips(&self) -> IpSet {
        let pools = self.pools.load();
        pools.iter().fold(self.workloads.listed(), |union, pool| {
            union.union(&pool.usable)
        })
    }
}
