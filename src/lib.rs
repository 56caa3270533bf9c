#![forbid(unsafe_code)]
//! ip-webhook: a Kubernetes admission webhook that gives an app's pods fixed IPs from a list
//! or pool, and refuses IP conflicts.

pub mod admission;
pub mod allocator;
pub mod annotations;
pub mod app;
pub mod assess;
pub mod claim_guard;
pub mod cli;
pub mod cluster;
pub mod cni_pools;
pub mod commands;
pub mod crd;
pub mod dispatch;
pub mod doctor;
pub mod drift;
pub mod events;
pub mod explain;
pub mod ipset;
pub mod ledger;
pub mod logging;
pub mod metrics;
pub mod mutate;
pub mod overlap;
pub mod pools;
pub mod release;
pub mod release_timer;
pub mod server;
pub mod status;
pub mod tls;
pub mod validate;
pub mod webhook;
pub mod workloads;
