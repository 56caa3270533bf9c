//! The command line: `serve`, `review`, `crds`, and the operator's commands `status`,
//! `explain`, `release` and `check`.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::annotations::Cni;
use crate::app;
use crate::metrics::Endpoint;

#[derive(Debug, Parser)]
#[command(
    name = "ip-webhook",
    version,
    about = "Kubernetes admission webhook that gives an app's pods fixed IPs and refuses IP conflicts",
    long_about = None
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

// Parsed once per process; boxing the large variants would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve /mutate and /validate over HTTPS, and health and metrics over plain HTTP.
    Serve(ServeArgs),
    /// Run one AdmissionReview through the webhook offline and print the response review.
    Review(ReviewArgs),
    /// Print the IPPool and IPClaim CustomResourceDefinitions as YAML.
    Crds,
    /// Show who holds which IP, per IPPool and per app: size, held, reserved, free, holders.
    #[command(visible_alias = "pools")]
    Status(StatusArgs),
    /// Show which IP each replica of a Pod or workload would get and why, or why refused.
    ///
    /// Each replica's Pod CREATE runs through /mutate over an in-memory copy of the ledger:
    /// replica N sees replicas 0..N-1 holding their IPs, and nothing is recorded.
    Explain(ExplainArgs),
    /// Free the claim on an IP whose pod is gone (a leaked IP); refuses while the pod runs.
    Release(ReleaseArgs),
    /// Check a running install: reachability, certificate, readiness, capacity, leader.
    ///
    /// Verifies the served certificate against the caBundle and its expiry, posts a harmless
    /// dry-run review, reads /readyz and /metrics. Exits non-zero when a check fails.
    Check(CheckArgs),
}

/// How to print a result.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum OutputFormat {
    /// Text for people.
    Table,
    Json,
    Yaml,
}

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// Only this app (namespace/app) and its pool.
    #[arg(long, value_name = "NAMESPACE/APP")]
    pub app: Option<String>,
    /// Only this IPPool and the apps drawing from it.
    #[arg(long, value_name = "NAME")]
    pub pool: Option<String>,
    #[command(flatten)]
    pub webhook: WebhookArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ExplainArgs {
    /// YAML or JSON with Pods, Deployments, StatefulSets, ReplicaSets, DaemonSets, Jobs or
    /// CronJobs (several documents allowed), or - for standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE|-")]
    pub file: String,
    /// Namespace of objects that name none.
    #[arg(short, long, default_value = "default", value_name = "NAMESPACE")]
    pub namespace: String,
    /// Replicas to explain per workload, instead of spec.replicas (e.g. a DaemonSet's node count).
    #[arg(long, value_name = "N")]
    pub replicas: Option<u64>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    #[command(flatten)]
    pub webhook: WebhookArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ReleaseArgs {
    /// The IP to free.
    #[arg(value_name = "IP")]
    pub ip: std::net::IpAddr,
    /// Release even when the pod still runs or cannot be checked (off-cluster it never can).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub webhook: WebhookArgs,
}

#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// The webhook's HTTPS address, https://HOST:PORT (a path replaces /mutate).
    #[arg(long, value_name = "URL")]
    pub url: String,
    /// PEM file of the CA in the webhook configuration's caBundle.
    #[arg(long, value_name = "FILE", conflicts_with = "ca_bundle")]
    pub ca_file: Option<PathBuf>,
    /// The caBundle itself (base64 of PEM), as in the webhook configuration.
    #[arg(long, value_name = "BASE64")]
    pub ca_bundle: Option<String>,
    /// The admin address, http://HOST:PORT, for /readyz and /metrics.
    #[arg(long, value_name = "URL")]
    pub admin_url: Option<String>,
    /// PEM client certificate to present, when the webhook requires one (--client-ca-file).
    #[arg(long, value_name = "FILE", requires = "client_key_file")]
    pub client_cert_file: Option<PathBuf>,
    /// PEM private key of --client-cert-file.
    #[arg(long, value_name = "FILE", requires = "client_cert_file")]
    pub client_key_file: Option<PathBuf>,
    /// Fail when the certificate expires in fewer days than this (warn under 30).
    #[arg(long, default_value_t = 7, value_name = "DAYS")]
    pub min_days: i64,
    /// Warn about pools and apps with at least this share of their IPs held.
    #[arg(long, default_value_t = 0.9, value_name = "RATIO")]
    pub exhaustion_threshold: f64,
    /// Deadline for each connection and request.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Duration,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

/// Where claims are recorded.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LedgerKind {
    /// One crash-safe file in --state-dir (the default off-cluster).
    Embedded,
    /// IPClaim objects through the API server (the default in a pod or with --kubeconfig).
    Kubernetes,
    /// Keys in etcd under --etcd-prefix.
    Etcd,
}

/// What decides admissions: shared by `serve` and `review`.
#[derive(Debug, Clone, Args)]
pub struct WebhookArgs {
    /// Where claims are recorded; default: kubernetes in a pod or with --kubeconfig, else embedded.
    #[arg(long, value_enum, value_name = "KIND")]
    pub ledger: Option<LedgerKind>,
    /// Directory of the embedded ledger (and of the self-signed CA).
    #[arg(long, default_value = "./ip-webhook-state", value_name = "DIR")]
    pub state_dir: PathBuf,
    /// The pod label that names a pod's app (with its namespace).
    #[arg(long, default_value = "app", value_name = "KEY")]
    pub app_label: String,
    /// Which CNI annotation carries the IP.
    #[arg(long, value_enum, default_value_t = Cni::Calico)]
    pub cni: Cni,
    /// YAML list of IPPool objects that pods can name in ip-webhook.io/ip-pool.
    #[arg(long, value_name = "FILE")]
    pub pools_file: Option<PathBuf>,
    /// Refuse Kube-OVN Subnets (kubeovn.io) that overlap another Subnet of the same VPC.
    #[arg(long)]
    pub check_kube_ovn_subnets: bool,
    /// Refuse Calico IPPools (crd.projectcalico.org) that overlap another Calico IPPool.
    #[arg(long)]
    pub check_calico_ippools: bool,
    /// After a pod's DELETE, its IP stays held for its grace period plus this long; then it
    /// is released once the pod is verified gone (with an API server), or at once (without).
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub release_delay: Duration,
    /// Every ledger call of one admission ends by this long after the review arrived; later,
    /// the admission is denied (and a claim that lands anyway is rolled back). Keep it below
    /// the webhook's timeoutSeconds (the chart sets timeoutSeconds − 1 s).
    #[arg(long, default_value = "4s", value_parser = parse_duration, value_name = "DURATION")]
    pub admission_deadline: Duration,
    /// Talk to the API server described by this kubeconfig (selects --ledger kubernetes unless
    /// --ledger is given; with etcd or embedded, pods are looked up there to free leaked IPs).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    pub etcd: EtcdArgs,
}

impl WebhookArgs {
    /// The ledger to use: --ledger if given; else kubernetes in a pod (KUBERNETES_SERVICE_HOST
    /// set) or with --kubeconfig; else embedded.
    pub fn ledger_kind(&self) -> LedgerKind {
        choose_ledger(self.ledger, self.kubeconfig.is_some(), in_pod())
    }

    /// Whether there is an API server to ask about pods: in a pod, or given --kubeconfig.
    pub fn has_api_server(&self) -> bool {
        self.kubeconfig.is_some() || in_pod()
    }
}

fn in_pod() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|v| !v.is_empty())
}

pub fn choose_ledger(given: Option<LedgerKind>, kubeconfig: bool, in_pod: bool) -> LedgerKind {
    match given {
        Some(kind) => kind,
        None if kubeconfig || in_pod => LedgerKind::Kubernetes,
        None => LedgerKind::Embedded,
    }
}

/// In-cluster mode: the reconciler and its leader election.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Drop a Reserved IPClaim that no pod took up within this time.
    #[arg(long, default_value = "2m", value_parser = parse_duration, value_name = "DURATION")]
    pub reservation_ttl: Duration,
    /// Keep a gone StatefulSet pod's IP this long for the pod of the same name.
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub sticky_grace: Duration,
    /// Re-list IPClaims and pods from the API server this often (and on start).
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub resync_period: Duration,
    /// The coordination.k8s.io Lease that elects the reconciler.
    #[arg(long, default_value = "ip-webhook-reconciler", value_name = "NAME")]
    pub lease_name: String,
    /// Namespace of the Lease; default: POD_NAMESPACE, else the service account's namespace.
    #[arg(long, value_name = "NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// How long a leader's Lease lasts without renewal before another replica takes over.
    #[arg(long, default_value = "15s", value_parser = parse_duration, value_name = "DURATION")]
    pub lease_duration: Duration,
    /// How often the leader renews (and candidates check) the Lease.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub lease_renew_interval: Duration,
    /// With --cni calico: keep a Calico IPReservation (ip-webhook-fixed-ips) of every IP
    /// ip-webhook may hand out, so Calico's automatic assignment skips them.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub calico_reservation: bool,
}

/// How to reach etcd for `--ledger etcd`.
#[derive(Debug, Clone, Args)]
pub struct EtcdArgs {
    /// etcd client URLs, comma-separated (`https://10.0.0.1:2379,https://10.0.0.2:2379`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379",
        value_name = "URLS"
    )]
    pub etcd_endpoints: Vec<String>,
    /// Key prefix under which claims are kept, one key per IP.
    #[arg(long, default_value = "/ip-webhook/", value_name = "PREFIX")]
    pub etcd_prefix: String,
    /// PEM CA bundle that signed the etcd server certificates.
    #[arg(long, value_name = "FILE")]
    pub etcd_ca_file: Option<PathBuf>,
    /// PEM client certificate for etcd (with --etcd-key-file).
    #[arg(long, value_name = "FILE", requires = "etcd_key_file")]
    pub etcd_cert_file: Option<PathBuf>,
    /// PEM private key of --etcd-cert-file.
    #[arg(long, value_name = "FILE", requires = "etcd_cert_file")]
    pub etcd_key_file: Option<PathBuf>,
    /// Deadline of one etcd request, and of the retries of one ledger write.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub etcd_timeout: Duration,
    /// Reload every claim under the prefix this often and repair the index (also done after
    /// the watch lost history to compaction, and after it reconnected).
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub etcd_resync_period: Duration,
}

impl EtcdArgs {
    pub fn options(&self) -> crate::ledger::EtcdOptions {
        crate::ledger::EtcdOptions {
            endpoints: self.etcd_endpoints.clone(),
            prefix: self.etcd_prefix.clone(),
            ca_file: self.etcd_ca_file.clone(),
            cert_file: self.etcd_cert_file.clone(),
            key_file: self.etcd_key_file.clone(),
            timeout: self.etcd_timeout,
            resync_period: self.etcd_resync_period.max(Duration::from_secs(1)),
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// HTTPS address for POST /mutate and POST /validate.
    #[arg(long, default_value = "0.0.0.0:8443", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Plain-HTTP address for GET /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:8080", value_name = "ADDR")]
    pub admin_listen: SocketAddr,
    /// PEM certificate chain; reloaded when the file changes.
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_key_file",
        conflicts_with = "self_signed"
    )]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key for --tls-cert-file.
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// Generate a CA and serving certificate (the default when no certificate is given);
    /// writes ca.crt into --state-dir and prints its base64 for the webhook's caBundle.
    #[arg(long)]
    pub self_signed: bool,
    /// Extra DNS names for the self-signed certificate (repeatable).
    #[arg(long = "dns-name", value_name = "NAME")]
    pub dns_names: Vec<String>,
    /// How often to re-read the certificate files even without a file event.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub tls_reload_interval: Duration,
    /// Deadline for a client to send a request's head (after TLS: the first head or the
    /// HTTP/2 preface), and again its body.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub read_timeout: Duration,
    /// Close a connection with no request open for this long (HTTP/1 keep-alive, or HTTP/2
    /// without a stream).
    #[arg(long, default_value = "90s", value_parser = parse_duration, value_name = "DURATION")]
    pub idle_timeout: Duration,
    /// HTTPS connections served at once; more are closed as they are accepted.
    #[arg(long, default_value_t = crate::server::DEFAULT_MAX_CONNECTIONS, value_name = "N")]
    pub max_connections: usize,
    /// Request body bytes held at once (declared lengths count whole); past it, 503 before
    /// reading. At least 7Mi (one largest review). Suffixes Ki, Mi, Gi.
    #[arg(long, default_value = "64Mi", value_parser = parse_size, value_name = "BYTES")]
    pub max_inflight_bytes: usize,
    /// At most this many apps get per-app metrics series; the rest are counted in
    /// ip_webhook_metrics_app_series_overflow_total.
    #[arg(long, default_value_t = crate::metrics::DEFAULT_MAX_APPS, value_name = "N")]
    pub metrics_max_apps: usize,
    /// PEM CA bundle: HTTPS then requires a client certificate that chains to it (the API
    /// server's, see docs/security.md); reloaded when the file changes.
    #[arg(long, value_name = "FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// With --client-ca-file: the client certificate's CN or a DNS SAN must be one of these.
    #[arg(
        long,
        value_delimiter = ',',
        requires = "client_ca_file",
        value_name = "NAMES"
    )]
    pub client_allowed_names: Vec<String>,
    /// How long SIGTERM waits for in-flight admissions before exiting.
    #[arg(long, default_value = "25s", value_parser = parse_duration, value_name = "DURATION")]
    pub shutdown_grace: Duration,
    #[command(flatten)]
    pub webhook: WebhookArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ReviewArgs {
    /// Send the review to /validate instead of /mutate.
    #[arg(long)]
    pub validate: bool,
    /// Set request.dryRun: decide, but record nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The AdmissionReview JSON file, or - for standard input.
    #[arg(value_name = "FILE|-")]
    pub file: String,
    #[command(flatten)]
    pub webhook: WebhookArgs,
}

/// `65536`, `64Ki`, `64Mi`, `1Gi`.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: usize = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size like 65536, 64Ki, 64Mi or 1Gi"))?;
    let scale: usize = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => {
            return Err(format!(
                "{text:?} has unknown unit {unit:?}; use Ki, Mi or Gi"
            ));
        }
    };
    value
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// `500ms`, `10s`, `2m`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 500ms, 10s, 2m or 1h"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(value)),
        "s" | "" => Ok(Duration::from_secs(value)),
        "m" => Ok(Duration::from_secs(value * 60)),
        "h" => Ok(Duration::from_secs(value * 3600)),
        _ => Err(format!(
            "{text:?} has unknown unit {unit:?}; use ms, s, m or h"
        )),
    }
}

/// Run a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let _logs = crate::logging::init(cli.log_format);
    match cli.command {
        Command::Serve(args) => app::serve_until_signal(args).await,
        Command::Review(args) => review(args).await,
        Command::Crds => {
            std::io::stdout().write_all(crate::crd::crds_yaml().as_bytes())?;
            Ok(())
        }
        Command::Status(args) => crate::commands::status(args).await,
        Command::Explain(args) => crate::commands::explain(args).await,
        Command::Release(args) => crate::commands::release(args).await,
        Command::Check(args) => crate::commands::check(args).await,
    }
}

async fn review(args: ReviewArgs) -> anyhow::Result<()> {
    let mut body = Vec::new();
    if args.file == "-" {
        std::io::stdin()
            .read_to_end(&mut body)
            .context("reading standard input")?;
    } else {
        body = std::fs::read(&args.file).with_context(|| format!("reading {}", args.file))?;
    }
    if args.dry_run {
        let mut value: serde_json::Value =
            serde_json::from_slice(&body).context("the review is not JSON")?;
        match value.get_mut("request").and_then(|r| r.as_object_mut()) {
            Some(request) => {
                request.insert("dryRun".into(), serde_json::Value::Bool(true));
            }
            None => bail!("the review has no request object"),
        }
        body = serde_json::to_vec(&value)?;
    }
    let (webhook, ledger) = app::build_webhook(&args.webhook, Default::default()).await?;
    let endpoint = if args.validate {
        Endpoint::validate
    } else {
        Endpoint::mutate
    };
    let answer = webhook.review(endpoint, &body).await;
    ledger.close().await;
    let json = answer.map_err(|e| anyhow::anyhow!("HTTP 400: {e}"))?;
    let value: serde_json::Value = serde_json::from_slice(&json)?;
    println!("{}", serde_json::to_string_pretty(&value)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("2 weeks").is_err());
        assert!(parse_duration("5d").unwrap_err().contains("unknown unit"));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64Mi"), Ok(64 * 1024 * 1024));
        assert_eq!(parse_size("7340032"), Ok(7340032));
        assert_eq!(parse_size("1Gi"), Ok(1 << 30));
        assert!(parse_size("64MB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn ledger_selection() {
        use LedgerKind::*;
        assert_eq!(choose_ledger(None, false, false), Embedded);
        assert_eq!(choose_ledger(None, true, false), Kubernetes);
        assert_eq!(choose_ledger(None, false, true), Kubernetes);
        assert_eq!(choose_ledger(Some(Embedded), true, true), Embedded);
        assert_eq!(choose_ledger(Some(Kubernetes), false, false), Kubernetes);
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn every_command_and_flag_is_documented() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let mut undocumented = Vec::new();
        for command in cli.get_subcommands() {
            let about = command
                .get_about()
                .map(|a| a.to_string())
                .unwrap_or_default();
            if about.len() < 20 {
                undocumented.push(format!("{}: no about line", command.get_name()));
            }
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                if help.len() < 3 {
                    undocumented.push(format!("{} --{id}: no help", command.get_name()));
                }
            }
        }
        assert!(undocumented.is_empty(), "{undocumented:#?}");
        let names: Vec<&str> = cli.get_subcommands().map(|c| c.get_name()).collect();
        for wanted in [
            "serve", "review", "crds", "status", "explain", "release", "check",
        ] {
            assert!(names.contains(&wanted), "{wanted} missing from {names:?}");
        }
    }
}
