//! The command line: `serve`, `review`, `crds`, and the operator's commands `status`,
//! `explain`, `release` and `check`.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::annotations::Cni;
use crate::app;
use crate::ledger::{Ledger, MemoryLedger};
use crate::metrics::Endpoint;
use std::sync::Arc;

#[derive(Debug, Parser)]
#[command(
    name = "ip-webhook",
    version,
    about = "Kubernetes admission webhook that gives an app's pods fixed IPs and refuses IP conflicts",
    long_about = None,
    after_help = EXIT_CODES
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// What every command's exit status means (also in the README).
pub const EXIT_CODES: &str = "Exit status: 0 done; 1 error (one `Error: …` line on stderr); \
2 bad command line; 3 the command ran and the answer is no (a `check` failed, `check --drift` \
found drift, `release` freed nothing, a `status` filter matched nothing).";

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
    ///
    /// With --dry-run the ledger is only read (also while `serve` holds it); without, the
    /// claim is recorded, which needs the ledger to itself.
    Review(ReviewArgs),
    /// Print the FixedIPPool and IPClaim CustomResourceDefinitions as YAML.
    Crds,
    /// Show who holds which IP, per FixedIPPool and per app: size, held, reserved, free, holders.
    ///
    /// Reads the IPClaims of the cluster kubectl would talk to (--kubeconfig, $KUBECONFIG,
    /// ~/.kube/config, then the in-cluster service account), or the embedded ledger with
    /// --state-dir. Writes nothing.
    #[command(visible_alias = "pools", after_help = EXIT_CODES)]
    Status(StatusArgs),
    /// Show which IP each replica of a Pod or workload would get and why, or why refused.
    ///
    /// Each replica's Pod CREATE runs through /mutate over an in-memory copy of the ledger:
    /// replica N sees replicas 0..N-1 holding their IPs, and nothing is recorded. The ledger
    /// is found as for `status`.
    #[command(after_help = EXIT_CODES)]
    Explain(ExplainArgs),
    /// Free the claim on an IP whose pod is gone (a leaked IP); refuses while the pod runs.
    ///
    /// The ledger is found as for `status`.
    #[command(after_help = EXIT_CODES)]
    Release(ReleaseArgs),
    /// Check a running install (reachability, certificate, readiness, capacity, leader), or
    /// with --drift the claims against the cluster.
    ///
    /// Verifies the served certificate against the caBundle (--ca-file, --ca-bundle, or the
    /// webhook configurations read from the cluster) and its expiry, posts a harmless dry-run
    /// review, reads /readyz and /metrics. With --drift instead: compares the claims (found as
    /// for `status`) with the pods' IPs, Kube-OVN IP objects and Calico's IPAM blocks, and
    /// lists claims without a pod, pods on list IPs without a claim, pods on another IP than
    /// their claim, and IPs the CNI holds for gone pods.
    #[command(after_help = EXIT_CODES)]
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

/// `-v`: the log lines the command would otherwise keep to itself.
#[derive(Debug, Clone, Copy, Args, Default)]
pub struct Verbosity {
    /// Also print log lines on standard error: -v info (the admission decisions), -vv debug.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// How to reach the API server, found the way kubectl finds it.
#[derive(Debug, Clone, Args, Default)]
pub struct ClusterAccess {
    /// kubeconfig file; default: $KUBECONFIG, else ~/.kube/config, else the in-cluster
    /// service account.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use; default: its current-context.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

/// Where the operator commands read (and `release` writes) claims.
#[derive(Debug, Clone, Args)]
pub struct LedgerSource {
    /// Where claims are recorded; default: embedded with --state-dir, else kubernetes (the
    /// IPClaims of the cluster found as kubectl finds it).
    #[arg(long, value_enum, value_name = "KIND")]
    pub ledger: Option<LedgerKind>,
    /// The embedded ledger in this directory (the --state-dir of `ip-webhook serve`); read
    /// while a server holds it.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    #[command(flatten)]
    pub cluster: ClusterAccess,
    #[command(flatten)]
    pub etcd: EtcdArgs,
}

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// Only this app and its pool.
    #[arg(long, value_name = "NAMESPACE/APP", value_parser = parse_app)]
    pub app: Option<String>,
    /// Only this FixedIPPool and the apps drawing from it.
    #[arg(long, value_name = "NAME")]
    pub pool: Option<String>,
    /// Only the apps of this namespace (and the pools they draw from), as kubectl's -n.
    #[arg(short, long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// The pod label that names a pod's app (to find the pods behind the claims).
    #[arg(long, default_value = "app", value_name = "KEY")]
    pub app_label: String,
    /// YAML list of FixedIPPool objects (off-cluster; in a cluster they are read from it).
    #[arg(long, value_name = "FILE")]
    pub pools_file: Option<PathBuf>,
    #[command(flatten)]
    pub verbosity: Verbosity,
    // Last: it ends with the etcd flags under their own help heading.
    #[command(flatten)]
    pub source: LedgerSource,
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
    /// The pod label that names a pod's app (with its namespace).
    #[arg(long, default_value = "app", value_name = "KEY")]
    pub app_label: String,
    /// Which CNI annotation carries the IP.
    #[arg(long, value_enum, default_value_t = Cni::Calico)]
    pub cni: Cni,
    /// YAML list of FixedIPPool objects (off-cluster; in a cluster they are read from it).
    #[arg(long, value_name = "FILE")]
    pub pools_file: Option<PathBuf>,
    #[command(flatten)]
    pub verbosity: Verbosity,
    // Last: it ends with the etcd flags under their own help heading.
    #[command(flatten)]
    pub source: LedgerSource,
}

#[derive(Debug, Clone, Args)]
pub struct ReleaseArgs {
    /// The IP to free.
    #[arg(value_name = "IP")]
    pub ip: std::net::IpAddr,
    /// Release even when the pod still runs or cannot be checked (off-cluster it never can).
    #[arg(long)]
    pub force: bool,
    /// Release only if the claim's pod is in this namespace (kubectl's -n, as a guard: an IP
    /// names its claim cluster-wide).
    #[arg(short, long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// The pod label that names a pod's app (to find the pod behind the claim).
    #[arg(long, default_value = "app", value_name = "KEY")]
    pub app_label: String,
    #[command(flatten)]
    pub verbosity: Verbosity,
    // Last: it ends with the etcd flags under their own help heading.
    #[command(flatten)]
    pub source: LedgerSource,
}

#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// The webhook's HTTPS address, https://HOST:PORT (a path replaces /mutate).
    #[arg(long, value_name = "URL", required_unless_present = "drift")]
    pub url: Option<String>,
    /// PEM file of the CA in the webhook configuration's caBundle.
    #[arg(long, value_name = "FILE", conflicts_with = "ca_bundle")]
    pub ca_file: Option<PathBuf>,
    /// The caBundle itself (base64 of PEM), as in the webhook configuration.
    #[arg(long, value_name = "BASE64")]
    pub ca_bundle: Option<String>,
    /// The name to verify the certificate for (and send as SNI), e.g.
    /// ip-webhook.ip-webhook-system.svc through a port-forward; default: the URL's host.
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// The MutatingWebhookConfiguration and ValidatingWebhookConfiguration whose caBundles to
    /// read from the cluster (found as kubectl finds it; read with --kubeconfig or --context,
    /// or when neither --ca-file nor --ca-bundle is given).
    #[arg(long, value_name = "NAME", default_value = "ip-webhook")]
    pub webhook_configuration: String,
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
    #[command(flatten)]
    pub verbosity: Verbosity,
    #[command(flatten)]
    pub drift: DriftArgs,
    // Last: it ends with the etcd flags under their own help heading. Without --drift only the
    // cluster access (--kubeconfig, --context) is used, for the caBundles.
    #[command(flatten)]
    pub source: LedgerSource,
}

/// `check --drift` (issue 20): the claims against the pods and the CNI's records.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Drift (--drift)")]
pub struct DriftArgs {
    /// Instead of checking the webhook, compare the claims with the pods' IPs, Kube-OVN IP
    /// objects and Calico's IPAM blocks (where installed); exit 3 when any drift is found.
    #[arg(id = "drift", long = "drift", conflicts_with_all = ["url", "ca_file", "ca_bundle", "admin_url"])]
    pub enabled: bool,
    /// With --drift: report only drift of pods in this namespace.
    #[arg(short, long, value_name = "NAMESPACE", conflicts_with = "url")]
    pub namespace: Option<String>,
    /// With --drift: the pod label that names a pod's app.
    #[arg(long, default_value = "app", value_name = "KEY")]
    pub app_label: String,
}

/// The name the binary runs under as a kubectl plugin (`kubectl ipw …`).
pub const PLUGIN_FILE: &str = "kubectl-ipw";

/// Whether `argv0` (the program's path) names the kubectl plugin: a file `kubectl-ipw`, or
/// `kubectl-ipw.exe`.
pub fn is_plugin_name(argv0: &std::ffi::OsStr) -> bool {
    let Some(name) = Path::new(argv0).file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    let name = name.strip_suffix(".exe").unwrap_or(name);
    name == PLUGIN_FILE
}

static INVOCATION: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// How the user runs the operator commands, for messages: `kubectl ipw` or `ip-webhook`.
pub fn invocation() -> &'static str {
    INVOCATION.get().copied().unwrap_or("ip-webhook")
}

/// The clap command, named `kubectl ipw` in help, usage and errors when run as the plugin.
pub fn command(plugin: bool) -> clap::Command {
    use clap::CommandFactory;
    let command = Cli::command();
    if plugin {
        // The server's commands still run, but kubectl users are shown the operator's.
        ["serve", "review", "crds"]
            .into_iter()
            .fold(command, |c, name| c.mut_subcommand(name, |s| s.hide(true)))
            .name(PLUGIN_FILE)
            .bin_name("kubectl ipw")
            .display_name("kubectl ipw")
            .about("ip-webhook's fixed pod IPs from kubectl: who holds which IP (status), what a workload would get (explain), free a leaked IP (release), check the install or its drift from the CNI (check)")
    } else {
        command
    }
}

/// Parse the process's command line, as `kubectl ipw` when the program's file is
/// [`PLUGIN_FILE`]; a bad command line prints clap's message and exits 2.
pub fn parse_env() -> Cli {
    use clap::FromArgMatches;
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let plugin = args.first().is_some_and(|a| is_plugin_name(a));
    if plugin {
        let _ = INVOCATION.set("kubectl ipw");
    }
    let matches = command(plugin).get_matches_from(args);
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Where claims are recorded.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LedgerKind {
    /// One crash-safe file in --state-dir (the default off-cluster).
    Embedded,
    /// IPClaim objects through the API server (the default in a pod or with --kubeconfig).
    Kubernetes,
    /// Keys in etcd under --etcd-prefix (builds with the `etcd` cargo feature).
    Etcd,
}

/// What decides admissions: shared by `serve` and `review`.
#[derive(Debug, Clone, Args)]
pub struct WebhookArgs {
    /// Where claims are recorded; default: kubernetes in a pod or with --kubeconfig, else embedded.
    #[arg(long, value_enum, value_name = "KIND")]
    pub ledger: Option<LedgerKind>,
    /// Directory of the embedded ledger (and of the self-signed CA and certificate).
    #[arg(long, default_value = "./ip-webhook-state", value_name = "DIR")]
    pub state_dir: PathBuf,
    /// The pod label that names a pod's app (with its namespace).
    #[arg(long, default_value = "app", value_name = "KEY")]
    pub app_label: String,
    /// Which CNI annotation carries the IP.
    #[arg(long, value_enum, default_value_t = Cni::Calico)]
    pub cni: Cni,
    /// YAML list of FixedIPPool objects that pods can name in ip-webhook.io/ip-pool.
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
    /// A user whose IPClaim writes the IPClaim guard always admits (repeatable): the server's
    /// own. In a pod, its service account (read from the mounted token) is trusted anyway.
    #[arg(long, value_name = "USERNAME")]
    pub trusted_username: Vec<String>,
    /// Talk to the API server described by this kubeconfig (selects --ledger kubernetes unless
    /// --ledger is given; with etcd or embedded, pods are looked up there to free leaked IPs).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The context of --kubeconfig (or of $KUBECONFIG) to use; default: its current-context.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
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

/// `serve`'s default --state-dir.
pub const DEFAULT_STATE_DIR: &str = "./ip-webhook-state";

pub fn in_pod() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|v| !v.is_empty())
}

pub fn choose_ledger(given: Option<LedgerKind>, kubeconfig: bool, in_pod: bool) -> LedgerKind {
    match given {
        Some(kind) => kind,
        None if kubeconfig || in_pod => LedgerKind::Kubernetes,
        None => LedgerKind::Embedded,
    }
}

/// Where an operator command found the API server, in kubectl's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterSource {
    /// `--kubeconfig FILE`.
    Flag(PathBuf),
    /// `$KUBECONFIG` (one path, or several separated by `:`).
    Env(String),
    /// `~/.kube/config`, which exists.
    Home(PathBuf),
    /// The pod's service account (KUBERNETES_SERVICE_HOST is set).
    InCluster,
}

impl std::fmt::Display for ClusterSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterSource::Flag(path) => write!(f, "--kubeconfig {}", path.display()),
            ClusterSource::Env(value) => write!(f, "$KUBECONFIG ({value})"),
            ClusterSource::Home(path) => write!(f, "{}", path.display()),
            ClusterSource::InCluster => f.write_str("the in-cluster service account"),
        }
    }
}

/// Find the API server as kubectl does: --kubeconfig, else $KUBECONFIG, else ~/.kube/config,
/// else the in-cluster service account. `None` when there is none of these.
pub fn find_cluster(access: &ClusterAccess) -> Option<ClusterSource> {
    find_cluster_in(
        access.kubeconfig.as_deref(),
        std::env::var("KUBECONFIG").ok(),
        std::env::var_os("HOME").map(PathBuf::from),
        in_pod(),
    )
}

pub fn find_cluster_in(
    flag: Option<&Path>,
    env: Option<String>,
    home: Option<PathBuf>,
    in_pod: bool,
) -> Option<ClusterSource> {
    if let Some(path) = flag {
        return Some(ClusterSource::Flag(path.to_path_buf()));
    }
    if let Some(value) = env.filter(|v| !v.trim().is_empty()) {
        return Some(ClusterSource::Env(value));
    }
    if let Some(config) = home
        .map(|h| h.join(".kube").join("config"))
        .filter(|c| c.is_file())
    {
        return Some(ClusterSource::Home(config));
    }
    in_pod.then_some(ClusterSource::InCluster)
}

/// The ledger an operator command reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Books {
    Embedded(PathBuf),
    Kubernetes(ClusterSource),
    Etcd,
}

/// Choose the ledger of an operator command: `--ledger` if given; else `--state-dir` means
/// the embedded ledger; else the cluster kubectl would use; else an error saying where it
/// looked and what to pass.
pub fn choose_books(
    source: &LedgerSource,
    cluster: Option<ClusterSource>,
) -> Result<Books, String> {
    let state_dir = || {
        source
            .state_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR))
    };
    match (source.ledger, cluster) {
        (Some(LedgerKind::Embedded), _) => Ok(Books::Embedded(state_dir())),
        (Some(LedgerKind::Etcd), _) => Ok(Books::Etcd),
        (None, _) if source.state_dir.is_some() => Ok(Books::Embedded(state_dir())),
        (Some(LedgerKind::Kubernetes) | None, Some(cluster)) => Ok(Books::Kubernetes(cluster)),
        (Some(LedgerKind::Kubernetes) | None, None) => {
            let local = Path::new(DEFAULT_STATE_DIR).join("ledger.redb");
            let hint = if local.is_file() {
                format!(" ({DEFAULT_STATE_DIR} holds one)")
            } else {
                String::new()
            };
            Err(format!(
                "no cluster found: no --kubeconfig, $KUBECONFIG is unset, ~/.kube/config does \
                 not exist and this is not a pod; give --kubeconfig FILE, or --state-dir DIR to \
                 read the embedded ledger of `ip-webhook serve`{hint}"
            ))
        }
    }
}

/// In-cluster mode: the reconciler and its leader election.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "In-cluster: reconciler, leak sweeper and leader election")]
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
    /// Release the IP of a pod stuck Terminating (its grace over) on a node whose Ready
    /// condition has been False or Unknown this long; only pods of a ReplicaSet, Job or
    /// DaemonSet (StatefulSet and bare pods keep theirs). 0 turns it off.
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub node_lost_grace: Duration,
    /// With --cni kube-ovn: keep a Kube-OVN IPPool (ip-webhook-<subnet>) per Subnet over the
    /// IPs ip-webhook may hand out, so Kube-OVN's random allocation skips them.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub kube_ovn_reservation: bool,
}

/// How to reach etcd for `--ledger etcd` (a build with the `etcd` cargo feature).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "etcd ledger (--ledger etcd)")]
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

#[cfg(feature = "etcd")]
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
    /// HTTPS address for POST /mutate and POST /validate (`:8443` is every IPv4 address).
    #[arg(long, default_value = "0.0.0.0:8443", value_parser = parse_listen, value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Plain-HTTP address for GET /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:8080", value_parser = parse_listen, value_name = "ADDR")]
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
    /// Generate a CA and serving certificate (the default when no certificate is given); both
    /// are kept in --state-dir and reused on restart (the certificate until 30 days before it
    /// expires), and the CA's base64 is printed for the webhook's caBundle.
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
    /// Set request.dryRun: decide, but record nothing (the ledger is opened read-only).
    #[arg(long)]
    pub dry_run: bool,
    /// The AdmissionReview JSON file, or - for standard input.
    #[arg(value_name = "FILE|-")]
    pub file: String,
    #[command(flatten)]
    pub verbosity: Verbosity,
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

/// `--app`: `NAMESPACE/APP`.
pub fn parse_app(text: &str) -> Result<String, String> {
    match text.split_once('/') {
        Some((namespace, app))
            if !namespace.is_empty() && !app.is_empty() && !app.contains('/') =>
        {
            Ok(text.to_string())
        }
        _ => Err(format!(
            "{text:?} is not NAMESPACE/APP (an app is its namespace and its app label, e.g. default/{})",
            if text.is_empty() || text.contains('/') {
                "web"
            } else {
                text
            }
        )),
    }
}

/// A listen address: `HOST:PORT` with an IP address (IPv6 in brackets) or `localhost`, or
/// Go's `:PORT` for every IPv4 address.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    let bad = |why: &str| {
        format!("{text:?} is not a listen address like :8443, 0.0.0.0:8443 or [::]:8443 ({why})")
    };
    if let Some(port) = text.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| bad("bad port"))?;
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    if let Some(port) = text.strip_prefix("localhost:") {
        let port: u16 = port.parse().map_err(|_| bad("bad port"))?;
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse()
        .map_err(|_| bad("the host must be an IP address or localhost"))
}

/// A duration as Go writes them: `500ms`, `10s`, `1m30s`, `1.5s`, `2h45m`, units `ns`, `us`
/// (`µs`), `ms`, `s`, `m`, `h`; a bare whole number is seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let hint = "a duration like 500ms, 10s, 1m30s, 1.5s or 2h";
    if text.is_empty() {
        return Err(format!("an empty string is not {hint}"));
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| format!("{text:?} is too large for {hint}"));
    }
    let mut nanos: u128 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_end);
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        rest = after;
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(format!(
                "{text:?} is not {hint}: {number:?} is not a number"
            ));
        }
        let per_unit: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("{text:?} is not {hint}: {number} has no unit")),
            other => {
                return Err(format!(
                    "{text:?} is not {hint}: unknown unit {other:?} (use ns, us, ms, s, m or h)"
                ));
            }
        };
        let too_large = || format!("{text:?} is too large for {hint}");
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| too_large())?
        };
        // Go truncates a fraction finer than a nanosecond; so does this.
        let fraction = &fraction[..fraction.len().min(18)];
        let fraction_nanos = if fraction.is_empty() {
            0
        } else {
            let digits: u128 = fraction.parse().map_err(|_| too_large())?;
            digits * per_unit / 10u128.pow(fraction.len() as u32)
        };
        nanos = whole
            .checked_mul(per_unit)
            .and_then(|n| n.checked_add(fraction_nanos))
            .and_then(|n| n.checked_add(nanos))
            .filter(|n| *n <= u64::MAX as u128)
            .ok_or_else(too_large)?;
    }
    Ok(Duration::from_nanos(nanos as u64))
}

/// The command ran, and its answer is no: a `check` failed, `release` freed nothing, a
/// filter matched nothing. Exits 3 (an error exits 1).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct AnswerIsNo(pub String);

/// The exit status for an error: 3 when its answer is no ([`AnswerIsNo`]), else 1.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    if error.chain().any(|cause| cause.is::<AnswerIsNo>()) {
        3
    } else {
        1
    }
}

/// Write a command's output to stdout. A reader that went away (`| head`) ends the output
/// quietly, as for any Unix tool, instead of a panic.
pub fn emit(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// An error as one line: each cause after the last, `: `-separated, leaving out a cause whose
/// text the line already holds (client libraries often repeat their source in their message).
pub fn error_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        let text = text.trim();
        if text.is_empty() || line.contains(text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(text);
    }
    line.replace('\n', " ")
}

/// The log filter: `serve` logs at RUST_LOG (default info); the other commands print only
/// their own output unless -v is given.
fn log_filter(command: &Command) -> Option<&'static str> {
    let verbosity = match command {
        Command::Serve(_) => return None,
        Command::Crds => Verbosity::default(),
        Command::Review(args) => args.verbosity,
        Command::Status(args) => args.verbosity,
        Command::Explain(args) => args.verbosity,
        Command::Release(args) => args.verbosity,
        Command::Check(args) => args.verbosity,
    };
    // Without -v, only ip-webhook's own warnings: a client library's error log would repeat
    // the `Error:` line.
    Some(match verbosity.verbose {
        0 => "ip_webhook=warn",
        1 => "info",
        _ => "debug",
    })
}

/// Run a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let _logs = crate::logging::init(cli.log_format, log_filter(&cli.command));
    match cli.command {
        Command::Serve(args) => app::serve_until_signal(args).await,
        Command::Review(args) => review(args).await,
        Command::Crds => emit(&crate::crd::crds_yaml()),
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
    // A dry run only reads: the embedded ledger is copied into memory, read-only, so it
    // works while `serve` holds the file and creates nothing when there is none yet.
    let copy: Option<Arc<dyn Ledger>> =
        if args.dry_run && args.webhook.ledger_kind() == LedgerKind::Embedded {
            let state_dir = &args.webhook.state_dir;
            let claims = if state_dir.join("ledger.redb").is_file() {
                crate::ledger::embedded::read_claims(state_dir)?
            } else {
                Vec::new()
            };
            let memory = MemoryLedger::new();
            for claim in &claims {
                memory.create(claim).await?;
            }
            Some(Arc::new(memory))
        } else {
            None
        };
    let recording = copy.is_none() && args.webhook.ledger_kind() == LedgerKind::Embedded;
    let built = app::build_with(&args.webhook, Default::default(), copy)
        .await
        .with_context(|| {
            if recording {
                format!(
                    "opening the embedded ledger in {} to record the review's claim (with --dry-run it is only read, also while `serve` runs)",
                    args.webhook.state_dir.display()
                )
            } else {
                "opening the ledger".to_string()
            }
        })?;
    let (webhook, ledger) = (built.webhook, built.ledger);
    let endpoint = if args.validate {
        Endpoint::validate
    } else {
        Endpoint::mutate
    };
    let answer = webhook.review(endpoint, &body).await;
    ledger.close().await;
    let json = answer.map_err(|e| anyhow::anyhow!("HTTP 400: {e}"))?;
    let value: serde_json::Value = serde_json::from_slice(&json)?;
    emit(&(serde_json::to_string_pretty(&value)? + "\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert!(parse_duration("2 weeks").is_err());
        assert!(parse_duration("5d").unwrap_err().contains("unknown unit"));
    }

    /// The values Go's time.ParseDuration takes (and the chart's schema allows).
    #[test]
    fn go_durations() {
        let ok = |text: &str, nanos: u64| {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_nanos(nanos)),
                "{text}"
            )
        };
        ok("1m30s", 90_000_000_000);
        ok("1.5s", 1_500_000_000);
        ok("2h45m", 9_900_000_000_000);
        ok("1h1m1s1ms1us1ns", 3_661_001_001_001);
        ok("300µs", 300_000);
        ok("0.5m", 30_000_000_000);
        ok(".5s", 500_000_000);
        ok("1.0000000001s", 1_000_000_000);
        ok("0", 0);
        for bad in [
            "",
            "s",
            "1.2.3s",
            "1m30",
            "1x",
            "-1s",
            "1s 2s",
            "99999999999999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert!(
            parse_duration("1m30")
                .unwrap_err()
                .contains("30 has no unit")
        );
    }

    #[test]
    fn listen_addresses() {
        let addr = |text: &str| parse_listen(text).map(|a| a.to_string());
        assert_eq!(addr(":8443"), Ok("0.0.0.0:8443".into()));
        assert_eq!(addr("127.0.0.1:8443"), Ok("127.0.0.1:8443".into()));
        assert_eq!(addr("[::]:8443"), Ok("[::]:8443".into()));
        assert_eq!(addr("localhost:8080"), Ok("127.0.0.1:8080".into()));
        assert!(addr(":http").unwrap_err().contains("bad port"));
        assert!(
            addr("example.com:80")
                .unwrap_err()
                .contains("IP address or localhost")
        );
        assert!(addr("8443").is_err());
    }

    #[test]
    fn apps_are_namespace_slash_name() {
        assert_eq!(parse_app("prod/web"), Ok("prod/web".into()));
        assert!(parse_app("web").unwrap_err().contains("e.g. default/web"));
        for bad in ["/web", "prod/", "a/b/c", ""] {
            assert!(parse_app(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_cluster_is_found_in_kubectls_order() {
        let home = tempfile::tempdir().unwrap();
        let flag = Path::new("/etc/kc");
        let env = || Some("/env/kc".to_string());
        let h = || Some(home.path().to_path_buf());
        assert_eq!(
            find_cluster_in(Some(flag), env(), h(), true),
            Some(ClusterSource::Flag(flag.into()))
        );
        assert_eq!(
            find_cluster_in(None, env(), h(), true),
            Some(ClusterSource::Env("/env/kc".into()))
        );
        // no ~/.kube/config yet: the service account, else nothing
        assert_eq!(
            find_cluster_in(None, Some(String::new()), h(), true),
            Some(ClusterSource::InCluster)
        );
        assert_eq!(find_cluster_in(None, None, h(), false), None);
        let config = home.path().join(".kube/config");
        std::fs::create_dir_all(config.parent().unwrap()).unwrap();
        std::fs::write(&config, "apiVersion: v1\nkind: Config\n").unwrap();
        assert_eq!(
            find_cluster_in(None, None, h(), true),
            Some(ClusterSource::Home(config))
        );
    }

    #[test]
    fn operator_ledger_choice() {
        let source = |ledger: Option<LedgerKind>, state_dir: Option<&str>| {
            let mut args = vec!["ip-webhook", "status"];
            if let Some(dir) = state_dir {
                args.extend(["--state-dir", dir]);
            }
            let kind;
            if let Some(k) = ledger {
                kind = format!("{k:?}").to_lowercase();
                args.extend(["--ledger", kind.as_str()]);
            }
            match Cli::try_parse_from(args).unwrap().command {
                Command::Status(status) => status.source,
                _ => unreachable!(),
            }
        };
        let cluster = Some(ClusterSource::InCluster);
        assert_eq!(
            choose_books(&source(None, Some("s")), cluster.clone()),
            Ok(Books::Embedded("s".into()))
        );
        assert_eq!(
            choose_books(&source(None, None), cluster.clone()),
            Ok(Books::Kubernetes(ClusterSource::InCluster))
        );
        assert_eq!(
            choose_books(&source(Some(LedgerKind::Embedded), None), cluster.clone()),
            Ok(Books::Embedded(DEFAULT_STATE_DIR.into()))
        );
        assert_eq!(
            choose_books(&source(Some(LedgerKind::Etcd), None), None),
            Ok(Books::Etcd)
        );
        let error = choose_books(&source(None, None), None).unwrap_err();
        assert!(error.starts_with("no cluster found: no --kubeconfig, $KUBECONFIG is unset, ~/.kube/config does not exist"), "{error}");
        assert!(choose_books(&source(Some(LedgerKind::Kubernetes), None), None).is_err());
    }

    #[test]
    fn an_error_is_one_line_without_repeated_causes() {
        let root = std::io::Error::other("connection refused");
        let error = anyhow::Error::new(root)
            .context("client error (Connect): connection refused")
            .context("reading IPClaims");
        assert_eq!(
            error_line(&error),
            "reading IPClaims: client error (Connect): connection refused"
        );
        assert_eq!(exit_code(&error), 1);
        let no = anyhow::Error::new(AnswerIsNo("2 of 7 checks failed".into())).context("check");
        assert_eq!(exit_code(&no), 3);
        assert_eq!(error_line(&no), "check: 2 of 7 checks failed");
    }

    /// Each command's help lists its own flags: the serve-only ones stay out of the operator
    /// commands.
    #[test]
    fn each_command_lists_only_its_own_flags() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let flags = |name: &str| -> Vec<String> {
            cli.find_subcommand(name)
                .unwrap()
                .get_arguments()
                .filter_map(|a| a.get_long().map(str::to_string))
                .collect()
        };
        let serve_only = [
            "check-calico-ippools",
            "check-kube-ovn-subnets",
            "tls-cert-file",
            "self-signed",
            "reservation-ttl",
            "lease-name",
            "calico-reservation",
            "listen",
        ];
        for command in ["status", "explain", "release"] {
            let flags = flags(command);
            for flag in serve_only {
                assert!(!flags.iter().any(|f| f == flag), "{command} lists --{flag}");
            }
            for flag in [
                "kubeconfig",
                "context",
                "state-dir",
                "ledger",
                "verbose",
                "namespace",
            ] {
                assert!(flags.iter().any(|f| f == flag), "{command} lacks --{flag}");
            }
        }
        let release = flags("release");
        for flag in ["pools-file", "cni", "output"] {
            assert!(!release.iter().any(|f| f == flag), "release lists --{flag}");
        }
        let check = flags("check");
        for flag in ["pools-file", "cni"] {
            assert!(!check.iter().any(|f| f == flag), "check lists --{flag}");
        }
        // --drift reads the claims as status does (issue 20).
        for flag in [
            "tls-server-name",
            "kubeconfig",
            "context",
            "webhook-configuration",
            "drift",
            "state-dir",
            "ledger",
            "namespace",
        ] {
            assert!(check.iter().any(|f| f == flag), "check lacks --{flag}");
        }
        let serve = flags("serve");
        for flag in serve_only {
            assert!(serve.iter().any(|f| f == flag), "serve lacks --{flag}");
        }
    }

    #[test]
    fn the_plugin_is_known_by_its_file_name() {
        use std::ffi::OsStr;
        for yes in [
            "kubectl-ipw",
            "/usr/local/bin/kubectl-ipw",
            "kubectl-ipw.exe",
            "./bin/kubectl-ipw.exe",
        ] {
            assert!(is_plugin_name(OsStr::new(yes)), "{yes}");
        }
        for no in [
            "ip-webhook",
            "/usr/bin/kubectl-ipw2",
            "kubectl-ipw/ip-webhook",
            "kubectl",
            "",
        ] {
            assert!(!is_plugin_name(OsStr::new(no)), "{no}");
        }
    }

    #[test]
    fn the_plugin_says_kubectl_ipw_in_usage_and_errors() {
        let mut plugin = command(true);
        plugin.build();
        let help = plugin
            .find_subcommand_mut("status")
            .unwrap()
            .render_help()
            .to_string();
        assert!(
            help.contains("Usage: kubectl ipw status [OPTIONS]"),
            "{help}"
        );
        let error = command(true)
            .try_get_matches_from(["kubectl-ipw", "check", "--drift", "--url", "https://x"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("Usage: kubectl ipw check"), "{error}");
        let error = command(false)
            .try_get_matches_from(["ip-webhook", "release"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("Usage: ip-webhook release"), "{error}");
    }

    #[test]
    fn check_needs_a_url_unless_drift() {
        let error = Cli::try_parse_from(["ip-webhook", "check"]).unwrap_err();
        assert!(error.to_string().contains("--url"), "{error}");
        let cli = Cli::try_parse_from(["ip-webhook", "check", "--drift", "-n", "prod"]).unwrap();
        match cli.command {
            Command::Check(args) => {
                assert!(args.drift.enabled);
                assert_eq!(args.drift.namespace.as_deref(), Some("prod"));
                assert_eq!(args.url, None);
            }
            _ => unreachable!(),
        }
        assert!(
            Cli::try_parse_from(["ip-webhook", "check", "--url", "https://x", "-n", "p"]).is_err()
        );
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
