//! A secondary network (a Multus NetworkAttachmentDefinition) whose IPs ip-webhook gives out:
//! each has books of its own, apart from the primary interface's and from every other
//! network's, so the same address on two networks is two claims and on one network is never
//! held twice. Where each ledger keeps a network's books is [`Network`]'s to say.

use std::fmt;
use std::path::{Path, PathBuf};

/// The label an IPClaim of a secondary network carries: the attachment's name. The primary
/// interface's IPClaims carry none, and the primary books select on its absence.
pub(crate) const NETWORK_LABEL: &str = "ip-webhook.io/network";
/// The label with the attachment's namespace, beside [`NETWORK_LABEL`].
pub(crate) const NETWORK_NAMESPACE_LABEL: &str = "ip-webhook.io/network-namespace";

/// A NetworkAttachmentDefinition: `namespace/name`, both DNS-1123 labels (as Multus reads a
/// pod's networks annotation).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Network {
    pub namespace: String,
    pub name: String,
}

/// Where a claim's IP is used: the pod's primary interface, or one secondary network. Every
/// lifecycle rule holds on each, each with books of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interface<'a> {
    Primary,
    Network(&'a Network),
}

impl Interface<'_> {
    /// The network, for a secondary network's books.
    pub fn network(&self) -> Option<&Network> {
        match self {
            Interface::Primary => None,
            Interface::Network(network) => Some(network),
        }
    }
}

impl fmt::Display for Interface<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Interface::Primary => write!(f, "the primary interface"),
            Interface::Network(network) => write!(f, "network {network}"),
        }
    }
}

/// Why `--network` could not be read.
#[derive(Debug, thiserror::Error)]
#[error("network attachment {given:?}: {reason}")]
pub struct NetworkNameError {
    given: String,
    reason: String,
}

impl Network {
    /// `namespace/name`, as `--network` and the networks annotation name it.
    pub fn parse(given: &str) -> Result<Network, NetworkNameError> {
        let error = |reason: &str| NetworkNameError {
            given: given.to_string(),
            reason: reason.to_string(),
        };
        let (namespace, name) = given
            .split_once('/')
            .ok_or_else(|| error("give it as NAMESPACE/NAME"))?;
        for part in [namespace, name] {
            if !is_dns_label(part) {
                return Err(error(&format!(
                    "{part:?} is not a DNS-1123 label (at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit)"
                )));
            }
        }
        Ok(Network {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }

    /// `namespace.name`: the network's books in file names and keys (neither part has a dot).
    pub(crate) fn books(&self) -> String {
        format!("{}.{}", self.namespace, self.name)
    }

    /// The embedded ledger's state dir for this network inside the primary one's.
    pub(crate) fn state_dir(&self, primary: &Path) -> PathBuf {
        primary.join("networks").join(self.books())
    }

    /// The etcd prefix for this network beside the primary `prefix` (`/ip-webhook/`, read
    /// with any number of leading and trailing `/` as the etcd ledger reads it): never under
    /// it, so the primary books never list a network's keys. `None` for the prefix `/`, under
    /// which every key is.
    pub(crate) fn etcd_prefix(&self, prefix: &str) -> Option<String> {
        let primary = prefix.trim_matches('/');
        (!primary.is_empty())
            .then(|| format!("/{primary}.networks/{}/{}/", self.namespace, self.name))
    }

    /// What an IPClaim of this network is named after its IP's own name: `.name.namespace`.
    pub(crate) fn claim_suffix(&self) -> String {
        format!(".{}.{}", self.name, self.namespace)
    }

    /// The label selector of this network's IPClaims.
    pub fn selector(&self) -> String {
        format!(
            "{NETWORK_LABEL}={},{NETWORK_NAMESPACE_LABEL}={}",
            self.name, self.namespace
        )
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A DNS-1123 label: what Kubernetes allows as a namespace or a NetworkAttachmentDefinition's
/// name in the networks annotation (k8s.io/apimachinery `IsDNS1123Label`).
pub(crate) fn is_dns_label(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 63
        && part
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !part.starts_with('-')
        && !part.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_network_is_namespace_slash_name_of_dns_labels() {
        let net = Network::parse("default/storage-net").unwrap();
        assert_eq!(net.to_string(), "default/storage-net");
        assert_eq!(net.books(), "default.storage-net");
        for bad in [
            "storage-net",
            "default/",
            "/net",
            "Default/net",
            "a/b/c",
            "ns/-x",
            "ns/net.1",
        ] {
            let error = Network::parse(bad).expect_err(bad).to_string();
            assert!(error.contains(&format!("{bad:?}")), "{error}");
        }
    }

    #[test]
    fn a_networks_etcd_prefix_is_beside_the_primary_one_never_under_it() {
        let net = Network::parse("default/net1").unwrap();
        let prefix = net.etcd_prefix("/ip-webhook/").unwrap();
        assert_eq!(prefix, "/ip-webhook.networks/default/net1/");
        assert!(!prefix.starts_with("/ip-webhook/"));
        assert_eq!(
            net.etcd_prefix("ip-webhook").as_deref(),
            Some(prefix.as_str())
        );
        assert_eq!(net.etcd_prefix("/"), None, "every key is under /");
    }
}
