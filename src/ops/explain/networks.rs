//! `explain` on secondary networks: a sandbox allocator per network, and what a replica gets
//! or holds on each.

use std::net::IpAddr;
use std::sync::Arc;

use serde::Serialize;

use super::ExplainError;
use crate::decisions::Webhook;
use crate::decisions::secondary::SecondaryNetworks;
use ip_webhook_ipam::allocator::Allocator;
use ip_webhook_ledger::network::Network;
use ip_webhook_ledger::{Claim, Ledger, MemoryLedger};

/// A replica's IPs on one secondary network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct NetworkIps {
    /// `namespace/name` of the NetworkAttachmentDefinition.
    pub(crate) network: String,
    pub(crate) ips: Vec<IpAddr>,
}

/// An allocator over an in-memory copy of each secondary network's claims, for
/// [`Webhook::with_secondary`].
pub(crate) async fn network_sandboxes(
    networks: Vec<(Network, Vec<Claim>)>,
) -> Result<SecondaryNetworks, ExplainError> {
    let mut by_network = std::collections::BTreeMap::new();
    for (network, claims) in networks {
        let memory = MemoryLedger::new();
        for claim in claims {
            memory.create(claim.into()).await?;
        }
        by_network.insert(network, Arc::new(Allocator::new(Arc::new(memory)).await?));
    }
    Ok(SecondaryNetworks::new(by_network))
}

/// What the holder of `claim` holds on each secondary network: its claims there of the same
/// pod (by UID once bound, else by name) or VM.
pub(super) fn network_holdings(webhook: &Webhook, claim: &Claim) -> Vec<NetworkIps> {
    let same_holder = |other: &Claim| {
        other.locks_ip()
            && other.pod.namespace == claim.pod.namespace
            && match (&claim.vm, &claim.pod.uid) {
                (Some(vm), _) => other.vm.as_deref() == Some(&**vm),
                (None, Some(uid)) => other.pod.uid.as_ref() == Some(uid),
                (None, None) => !claim.pod.name.is_empty() && other.pod.name == claim.pod.name,
            }
    };
    webhook
        .secondary
        .iter()
        .map(|(network, allocator)| NetworkIps {
            network: network.to_string(),
            ips: allocator
                .claims()
                .into_iter()
                .filter(|other| same_holder(other))
                .map(|other| other.ip)
                .collect(),
        })
        .filter(|on| !on.ips.is_empty())
        .collect()
}
