#![forbid(unsafe_code)]
#![warn(unreachable_pub)]
//! IP address management: which IPs an app may have, and which one a pod gets.
//!
//! The contract, for the webhook and the cluster tasks above it:
//!
//! - [`ipset::parse_ip_spec`] is the one reading of an IP list (an annotation, a
//!   `FixedIPPool`, a CNI's pool): single IPs, `a-b` ranges and CIDRs (their usable
//!   addresses: an IPv4 CIDR shorter than /31 without its network and broadcast addresses),
//!   canonical (sorted, disjoint, adjacent ranges merged), and an entry that overlaps another
//!   is an error naming both. Kube-OVN's `a..b` ranges are [`ipset::parse_ip_spec_with`].
//! - [`allocator::Allocator`] is the one place IPs are chosen and freed. It keeps the held set
//!   in memory and makes every grant durable through the [`ip_webhook_ledger::Ledger`] before
//!   it answers: an IP it answers with is recorded, and an IP held in the ledger is never
//!   given to another pod.
//! - [`pools`] reads `FixedIPPool`s; [`foreign`] is the IPs the cluster uses outside the
//!   ledger, which the allocator skips; [`usage`] is the counts `status` and the metrics show.
//!
//! ```
//! use ip_webhook_ipam::ipset::parse_ip_spec;
//! let ips = parse_ip_spec("10.0.0.1-10.0.0.3, 10.0.0.9, 10.0.1.0/30").unwrap();
//! assert_eq!(ips.len(), 3 + 1 + 2); // the /30 without 10.0.1.0 and 10.0.1.3
//! assert!(!ips.contains(&"10.0.1.3".parse().unwrap()));
//! assert!(ips.contains(&"10.0.0.2".parse().unwrap()));
//! assert!(!ips.contains(&"10.0.0.4".parse().unwrap()));
//! // Overlapping entries: the error names both.
//! let overlap = parse_ip_spec("10.0.0.0/30, 10.0.0.2").unwrap_err().to_string();
//! assert!(overlap.contains("10.0.0.0/30") && overlap.contains("10.0.0.2"), "{overlap}");
//! ```

pub mod allocator;
pub(crate) mod by_key;
pub mod foreign;
pub mod held;
pub mod ipset;
pub mod messages;
pub mod overlap;
pub mod pools;
pub(crate) mod release;
pub(crate) mod request;
pub mod spec_cache;
pub mod usage;

/// The claim every test starts from, shared with the integration tests (whence its `pub`s).
#[cfg(test)]
#[allow(unreachable_pub)]
#[path = "../../../tests/common/claims.rs"]
pub(crate) mod test_claims;
