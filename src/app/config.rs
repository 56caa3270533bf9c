//! What a process is made of, as plain data: the command line fills these in (`cli/`), and
//! tests build them directly. Nothing here reads the environment or parses a flag.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::cluster::ClusterOptions;
use crate::decisions::Settings;
use crate::server::Limits;
use ip_webhook_ledger::{KubeAccess, LedgerConfig};

/// What decides admissions: shared by `serve` and `review`.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    pub ledger: LedgerConfig,
    pub settings: Settings,
    /// FixedIPPool objects from a file (off-cluster; with the kubernetes ledger they are the
    /// API server's).
    pub pools_file: Option<PathBuf>,
    /// Users whose IPClaim writes the IPClaim guard always admits, besides the server's own
    /// service account.
    pub(crate) trusted_usernames: Vec<String>,
    /// With the embedded or etcd ledger: the API server asked whether a claim's pod is gone
    /// (in a pod, or given `--kubeconfig`). The kubernetes ledger's API server is its own.
    pub(crate) pod_api_server: Option<KubeAccess>,
    /// The instance named as the source of Events (the pod's name).
    pub(crate) instance: Option<String>,
    /// The secondary networks (Multus attachments) whose IPs are given out, each with books
    /// of its own.
    pub networks: Vec<ip_webhook_ledger::network::Network>,
}

/// The serving certificate.
#[derive(Debug, Clone)]
pub enum TlsConfig {
    /// PEM files, reloaded when they change.
    Files { cert: PathBuf, key: PathBuf },
    /// A CA and certificate generated into (and kept in) the state dir, for these extra DNS
    /// names.
    SelfSigned { dns_names: Vec<String> },
}

/// Client certificates HTTPS requires: they chain to the CA bundle in `file` (reloaded when it
/// changes) and, when `allowed_names` is not empty, name one of them.
#[derive(Debug, Clone)]
pub struct ClientCaConfig {
    pub file: PathBuf,
    pub allowed_names: Vec<String>,
}

/// Everything `serve` runs: the decisions, the servers, and (with an API server) the cluster.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub webhook: WebhookConfig,
    /// The self-signed CA and certificate's directory (also the embedded ledger's).
    pub state_dir: PathBuf,
    /// HTTPS: /mutate and /validate.
    pub listen: SocketAddr,
    /// Plain HTTP: /healthz, /readyz and /metrics.
    pub admin_listen: SocketAddr,
    pub tls: TlsConfig,
    pub client_ca: Option<ClientCaConfig>,
    /// How often certificate files are read again even without a file event.
    pub tls_reload_interval: Duration,
    pub limits: Limits,
    /// Apps that get per-app metrics series.
    pub metrics_max_apps: usize,
    /// The reconciler, the Lease and the leak sweeper, when there is an API server. Its
    /// `app_label` and `cni` are taken from `webhook.settings`, so the two never disagree.
    pub cluster: ClusterOptions,
}
