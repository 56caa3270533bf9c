#![forbid(unsafe_code)]
#![warn(unreachable_pub)]
//! ip-webhook: a Kubernetes admission webhook that gives an app's pods fixed IPs from a list
//! or pool, and refuses IP conflicts.
//!
//! Below this crate are the workspace's three library crates, each with its contract in its
//! `lib.rs`; the compiler keeps them from reaching up into this one:
//!
//! - [`ip_webhook_ledger`]: the claims and their rules, the custom resources (`IPClaim`,
//!   `FixedIPPool`), the `Ledger` contract and its adapters (memory, embedded journal,
//!   Kubernetes, etcd).
//! - [`ip_webhook_ipam`]: IP sets, pools, the allocator over the ledger.
//! - [`ip_webhook_admission`]: the AdmissionReview protocol: wire types, scanner, bounds,
//!   response and JSON patch, the pod annotations.
//!
//! This crate's folders, lowest layer first (a folder imports only from folders above it in
//! this list; `tests/layers.rs` checks it); ARCHITECTURE.md walks a request through them:
//!
//! - [`metrics`]: the Prometheus registry every layer records into.
//! - [`decisions`]: the decisions: dispatch, assess, mutate, validate, the IPClaim guard,
//!   workloads, events.
//! - [`cluster`]: in-cluster watches, indexes, reconciler, lease, sweeper, CNI objects.
//! - [`server`]: HTTP(S) serving, TLS, logging.
//! - `ops`: the operator commands' logic: status, explain, release, check, drift.
//! - [`app`]: the builder: plain configuration (`ServeConfig`, `WebhookConfig`) to a running
//!   process.
//! - [`cli`]: the command line: arguments to configuration, and each command.

pub mod app;
pub mod cli;
pub mod cluster;
pub mod decisions;
pub mod metrics;
pub(crate) mod ops;
pub mod server;

/// The claim every test starts from, shared with the integration tests (whence its `pub`s).
#[cfg(test)]
#[allow(unreachable_pub)]
#[path = "../tests/common/claims.rs"]
pub(crate) mod test_claims;
