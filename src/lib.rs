#![forbid(unsafe_code)]
//! ip-webhook: a Kubernetes admission webhook that gives an app's pods fixed IPs from a list
//! or pool, and refuses IP conflicts.
//!
//! Below this crate is [`ip_webhook_ledger`]: the claims, the custom resources (`IPClaim`,
//! `FixedIPPool`), the `Ledger` contract and its adapters (memory, embedded journal, Kubernetes,
//! etcd). The compiler keeps it from reaching up into this crate.
//!
//! This crate's folders, lowest layer first (a folder imports only from folders above it in
//! this list; `tests/layers.rs` checks it); ARCHITECTURE.md walks a request through them:
//!
//! - [`ipam`]: IP math, pools, the allocator over the ledger.
//! - [`admission`]: the AdmissionReview protocol: wire types, scanner, bounds, response and
//!   JSON patch, the pod annotations.
//! - [`metrics`]: the Prometheus registry every layer records into.
//! - [`webhook`]: the decisions: dispatch, assess, mutate, validate, the IPClaim guard,
//!   workloads, events.
//! - [`cluster`]: in-cluster watches, indexes, reconciler, lease, sweeper, CNI objects.
//! - [`server`]: HTTP(S) serving, TLS, logging.
//! - [`ops`]: the operator commands' logic: status, explain, release, check, drift.
//! - [`app`]: the builder: plain configuration (`ServeConfig`, `WebhookConfig`) to a running
//!   process.
//! - [`cli`]: the command line: arguments to configuration, and each command.

pub mod app;
pub mod cli;
pub mod cluster;
pub mod metrics;
pub mod ops;
pub mod server;
pub mod webhook;
