//! The arguments of every command, as clap reads them. The layers below get plain values from
//! these (`Cni`, `LogFormat`, durations, addresses).

use super::*;

#[derive(Debug, Parser)]
#[command(
    name = "ip-webhook",
    version,
    about = "Kubernetes admission webhook that gives an app's pods fixed IPs and refuses IP conflicts",
    long_about = None,
    after_help = EXIT_CODES
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
    /// Log format, before the command: of `serve`'s logs (as `serve --log-format`) and of
    /// any command's -v lines: text (default) or json.
    #[arg(long, value_parser = log_format_parser(), value_name = "text|json")]
    pub(crate) log_format: Option<LogFormat>,
}

impl Cli {
    /// The log format: `serve --log-format`, else the one given before the command, else text.
    pub(crate) fn log_format(&self) -> LogFormat {
        match &self.command {
            Command::Serve(serve) => serve.log_format.or(self.log_format),
            _ => self.log_format,
        }
        .unwrap_or(LogFormat::Text)
    }
}

/// `--log-format`: the command line's names for [`LogFormat`] (the layers below know no clap).
fn log_format_parser() -> impl clap::builder::TypedValueParser<Value = LogFormat> {
    PossibleValuesParser::new(["text", "json"]).map(|name| match name.as_str() {
        "json" => LogFormat::Json,
        _ => LogFormat::Text,
    })
}

/// `--cni`: the names of [`ip_webhook_admission::annotations::CNIS`].
fn cni_parser() -> impl clap::builder::TypedValueParser<Value = Cni> {
    PossibleValuesParser::new(ip_webhook_admission::annotations::CNIS.map(|d| d.name))
        .try_map(|name| Cni::from_name(&name).ok_or_else(|| format!("no CNI is named {name:?}")))
}

// Parsed once per process; boxing the large variants would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
    /// --state-dir (or in ./ip-webhook-state, `serve`'s default, when it holds one and no
    /// cluster is named). Writes nothing.
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
    /// Work on the embedded ledger's files: `ledger repair`.
    #[command(subcommand)]
    Ledger(LedgerCommand),
    /// Install this binary as the kubectl plugin `kubectl ipw`: `plugin install`.
    #[command(subcommand)]
    Plugin(super::plugin::PluginCommand),
    /// Print a shell completion script: `source <(ip-webhook completion bash)`.
    ///
    /// bash: add that line to ~/.bashrc; zsh: `ip-webhook completion zsh >
    /// "${fpath[1]}/_ip-webhook"`; fish: `ip-webhook completion fish >
    /// ~/.config/fish/completions/ip-webhook.fish`; elvish: `eval (ip-webhook completion
    /// elvish | slurp)` in ~/.config/elvish/rc.elv; powershell: `ip-webhook completion
    /// powershell | Out-String | Invoke-Expression` in $PROFILE.
    Completion {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// `ip-webhook ledger …`.
#[derive(Debug, Subcommand)]
pub(crate) enum LedgerCommand {
    /// Show what a repair of a refused ledger keeps and loses; --apply does it.
    ///
    /// `serve` and every command refuse a state dir whose files are damaged (a stretch that
    /// is no valid record with valid records after it, answered records lost, a snapshot not
    /// whole, an unreadable header) or gone (a journal, a network's books). A repair rewrites
    /// a damaged file with every valid record, keeping the original beside it as
    /// `<file>.damaged-<unix seconds>`; writes a journal that is gone again, empty; forgets a
    /// network's books that are gone; writes a damaged ledger.id again. Applying needs the
    /// ledger to itself (stop `serve`).
    #[command(after_help = EXIT_CODES)]
    Repair(RepairArgs),
}

#[derive(Debug, Clone, Args)]
pub(crate) struct RepairArgs {
    /// The embedded ledger's directory (the --state-dir of `ip-webhook serve`).
    #[arg(long, value_name = "DIR")]
    pub(crate) state_dir: PathBuf,
    /// Repair (without it: a dry run that changes nothing).
    #[arg(long)]
    pub(crate) apply: bool,
    #[command(flatten)]
    pub(crate) verbosity: Verbosity,
}

/// How to print a result.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(crate) enum OutputFormat {
    /// Text for people.
    Table,
    /// The table with more columns (`status`: each holder's pool, pod UID, claim token and
    /// admission request).
    Wide,
    Json,
    Yaml,
}

/// `-v`: the log lines the command would otherwise keep to itself.
#[derive(Debug, Clone, Copy, Args, Default)]
pub(crate) struct Verbosity {
    /// Also print log lines on standard error: -v info (the admission decisions), -vv debug.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
}

/// How to reach the API server, found the way kubectl finds it.
#[derive(Debug, Clone, Args, Default)]
pub(crate) struct ClusterAccess {
    /// kubeconfig file; default: $KUBECONFIG, else ~/.kube/config, else the in-cluster
    /// service account.
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use; default: its current-context.
    #[arg(long, value_name = "NAME")]
    pub(crate) context: Option<String>,
}

/// Where the operator commands read (and `release` writes) claims.
#[derive(Debug, Clone, Args)]
pub(crate) struct LedgerArgs {
    /// Where claims are recorded; default: embedded with --state-dir, or in
    /// ./ip-webhook-state when it holds a ledger and no cluster is named (--kubeconfig,
    /// --context, $KUBECONFIG, a pod), as `serve` there uses it; else kubernetes (the IPClaims
    /// of the cluster found as kubectl finds it).
    #[arg(long, value_enum, value_name = "KIND")]
    pub(crate) ledger: Option<LedgerKind>,
    /// The embedded ledger in this directory (the --state-dir of `ip-webhook serve`); read
    /// while a server holds it.
    #[arg(long, value_name = "DIR")]
    pub(crate) state_dir: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) cluster: ClusterAccess,
    #[command(flatten)]
    pub(crate) etcd: EtcdArgs,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct StatusArgs {
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) output: OutputFormat,
    /// Only this app and its pool.
    #[arg(long, value_name = "NAMESPACE/APP", value_parser = parse_app)]
    pub(crate) app: Option<String>,
    /// Only this FixedIPPool and the apps drawing from it.
    #[arg(long, value_name = "NAME")]
    pub(crate) pool: Option<String>,
    /// Only the apps of this namespace (and the pools they draw from), as kubectl's -n.
    #[arg(short, long, value_name = "NAMESPACE")]
    pub(crate) namespace: Option<String>,
    /// The pod label that names a pod's app (to find the pods behind the claims).
    #[arg(long, default_value = "app", value_name = "KEY")]
    pub(crate) app_label: String,
    /// YAML list of FixedIPPool objects (off-cluster; in a cluster they are read from it).
    #[arg(long, value_name = "FILE")]
    pub(crate) pools_file: Option<PathBuf>,
    /// Show the claims of this secondary network (a `serve --network`) instead of the
    /// primary interface's.
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = ip_webhook_ledger::network::Network::parse)]
    pub(crate) network: Option<ip_webhook_ledger::network::Network>,
    #[command(flatten)]
    pub(crate) verbosity: Verbosity,
    // Last: it ends with the etcd flags under their own help heading.
    #[command(flatten)]
    pub(crate) source: LedgerArgs,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct ExplainArgs {
    /// YAML or JSON with Pods, Deployments, StatefulSets, ReplicaSets, DaemonSets, Jobs,
    /// CronJobs or KubeVirt VirtualMachines (several documents allowed), or - for standard
    /// input.
    #[arg(short = 'f', long = "filename", value_name = "FILE|-")]
    pub(crate) file: String,
    /// Namespace of objects that name none.
    #[arg(short, long, default_value = "default", value_name = "NAMESPACE")]
    pub(crate) namespace: String,
    /// Replicas to explain per workload, instead of spec.replicas (e.g. a DaemonSet's node count).
    #[arg(long, value_name = "N")]
    pub(crate) replicas: Option<u64>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) output: OutputFormat,
    /// The pod label that names a pod's app (with its namespace).
    #[arg(long, default_value = "app", value_name = "KEY")]
    pub(crate) app_label: String,
    /// Which CNI annotation carries the IP.
    #[arg(long, value_parser = cni_parser(), default_value = "calico")]
    pub(crate) cni: Cni,
    /// YAML list of FixedIPPool objects (off-cluster; in a cluster they are read from it).
    #[arg(long, value_name = "FILE")]
    pub(crate) pools_file: Option<PathBuf>,
    /// A Multus secondary network the server gives IPs on (as `serve --network`): each
    /// replica's IP on it is shown too. Repeat for several.
    #[arg(long = "network", value_name = "NAMESPACE/NAME", value_parser = ip_webhook_ledger::network::Network::parse)]
    pub(crate) networks: Vec<ip_webhook_ledger::network::Network>,
    /// Also exit 3 when an object gets a warning (a mistyped ip-webhook.io/ key, more replicas
    /// than IPs), so that a CI gate stops on it; without, warnings are printed and exit 0.
    #[arg(long)]
    pub(crate) strict: bool,
    #[command(flatten)]
    pub(crate) verbosity: Verbosity,
    // Last: it ends with the etcd flags under their own help heading.
    #[command(flatten)]
    pub(crate) source: LedgerArgs,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct ReleaseArgs {
    /// The IP to free.
    #[arg(value_name = "IP", required_unless_present = "from_report")]
    pub(crate) ip: Option<std::net::IpAddr>,
    /// Release even when the pod still runs or cannot be checked (off-cluster it never can).
    #[arg(long, conflicts_with = "from_report")]
    pub(crate) force: bool,
    /// Free the claims without a pod that `check --drift -o json` wrote to FILE (`-` reads
    /// standard input), each only if its claim is still that pod's and the pod is gone; shows
    /// what it would free unless --apply.
    #[arg(long, value_name = "FILE", conflicts_with = "ip")]
    pub(crate) from_report: Option<PathBuf>,
    /// With --from-report: free them (without, nothing is written).
    #[arg(long, requires = "from_report")]
    pub(crate) apply: bool,
    /// Release only if the claim's pod is in this namespace (kubectl's -n, as a guard: an IP
    /// names its claim cluster-wide).
    #[arg(short, long, value_name = "NAMESPACE")]
    pub(crate) namespace: Option<String>,
    /// The pod label that names a pod's app (to find the pod behind the claim).
    #[arg(long, default_value = "app", value_name = "KEY")]
    pub(crate) app_label: String,
    #[command(flatten)]
    pub(crate) verbosity: Verbosity,
    // Last: it ends with the etcd flags under their own help heading.
    #[command(flatten)]
    pub(crate) source: LedgerArgs,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct CheckArgs {
    /// The webhook's HTTPS address, https://HOST:PORT (a path replaces /mutate).
    #[arg(long, value_name = "URL", required_unless_present = "drift")]
    pub(crate) url: Option<String>,
    /// PEM file of the CA in the webhook configuration's caBundle.
    #[arg(long, value_name = "FILE", conflicts_with = "ca_bundle")]
    pub(crate) ca_file: Option<PathBuf>,
    /// The caBundle itself (base64 of PEM), as in the webhook configuration.
    #[arg(long, value_name = "BASE64")]
    pub(crate) ca_bundle: Option<String>,
    /// The name to verify the certificate for (and send as SNI), e.g.
    /// ip-webhook.ip-webhook-system.svc through a port-forward; default: the URL's host.
    #[arg(long, value_name = "NAME")]
    pub(crate) tls_server_name: Option<String>,
    /// The MutatingWebhookConfiguration and ValidatingWebhookConfiguration whose caBundles to
    /// read from the cluster (found as kubectl finds it; read with --kubeconfig or --context,
    /// or when neither --ca-file nor --ca-bundle is given).
    #[arg(long, value_name = "NAME", default_value = "ip-webhook")]
    pub(crate) webhook_configuration: String,
    /// The admin address, http://HOST:PORT, for /readyz and /metrics.
    #[arg(long, value_name = "URL")]
    pub(crate) admin_url: Option<String>,
    /// PEM client certificate to present, when the webhook requires one (--client-ca-file).
    #[arg(long, value_name = "FILE", requires = "client_key_file")]
    pub(crate) client_cert_file: Option<PathBuf>,
    /// PEM private key of --client-cert-file.
    #[arg(long, value_name = "FILE", requires = "client_cert_file")]
    pub(crate) client_key_file: Option<PathBuf>,
    /// Fail when the certificate expires in fewer days than this (warn under 30).
    #[arg(long, default_value_t = 7, value_name = "DAYS")]
    pub(crate) min_days: i64,
    /// Warn about pools and apps with at least this share of their IPs held.
    #[arg(long, default_value_t = 0.9, value_name = "RATIO")]
    pub(crate) exhaustion_threshold: f64,
    /// Deadline for each connection and request.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) timeout: Duration,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) output: OutputFormat,
    #[command(flatten)]
    pub(crate) verbosity: Verbosity,
    #[command(flatten)]
    pub(crate) drift: DriftArgs,
    // Last: it ends with the etcd flags under their own help heading. Without --drift only the
    // cluster access (--kubeconfig, --context) is used, for the caBundles.
    #[command(flatten)]
    pub(crate) source: LedgerArgs,
}

/// `check --drift`: the claims against the pods and the CNI's records.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Drift (--drift)")]
pub(crate) struct DriftArgs {
    /// Instead of checking the webhook, compare the claims with the pods' IPs, Kube-OVN IP
    /// objects and Calico's IPAM blocks (where installed); exit 3 when any drift is found.
    #[arg(id = "drift", long = "drift", conflicts_with_all = ["url", "ca_file", "ca_bundle", "admin_url"])]
    pub(crate) enabled: bool,
    /// With --drift: report only drift of pods in this namespace.
    #[arg(short, long, value_name = "NAMESPACE", conflicts_with = "url")]
    pub(crate) namespace: Option<String>,
    /// With --drift: the pod label that names a pod's app.
    #[arg(long, default_value = "app", value_name = "KEY")]
    pub(crate) app_label: String,
    /// With --drift: compare the claims of this secondary network (a `serve --network`) with
    /// the IPs Multus reports for it, instead of the primary interface's.
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = ip_webhook_ledger::network::Network::parse, conflicts_with = "url")]
    pub(crate) network: Option<ip_webhook_ledger::network::Network>,
}

/// Where claims are recorded.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(crate) enum LedgerKind {
    /// One crash-safe file in --state-dir (the default off-cluster).
    Embedded,
    /// IPClaim objects through the API server (the default in a pod or with --kubeconfig).
    Kubernetes,
    /// Keys in etcd under --etcd-prefix (builds with the `etcd` cargo feature).
    Etcd,
}

/// What decides admissions: shared by `serve` and `review`.
#[derive(Debug, Clone, Args)]
pub(crate) struct WebhookArgs {
    /// Where claims are recorded; default: kubernetes in a pod or with --kubeconfig, else embedded.
    #[arg(long, value_enum, value_name = "KIND")]
    pub(crate) ledger: Option<LedgerKind>,
    /// Directory of the embedded ledger (and of the self-signed CA and certificate).
    #[arg(long, default_value = "./ip-webhook-state", value_name = "DIR")]
    pub(crate) state_dir: PathBuf,
    /// The pod label that names a pod's app (with its namespace).
    #[arg(long, default_value = "app", value_name = "KEY")]
    pub(crate) app_label: String,
    /// Which CNI annotation carries the IP.
    #[arg(long, value_parser = cni_parser(), default_value = "calico")]
    pub(crate) cni: Cni,
    /// YAML list of FixedIPPool objects that pods can name in ip-webhook.io/ip-pool.
    #[arg(long, value_name = "FILE")]
    pub(crate) pools_file: Option<PathBuf>,
    /// Refuse Kube-OVN Subnets (kubeovn.io) that overlap another Subnet of the same VPC.
    #[arg(long)]
    pub(crate) check_kube_ovn_subnets: bool,
    /// Refuse Calico IPPools (crd.projectcalico.org) that overlap another Calico IPPool.
    #[arg(long)]
    pub(crate) check_calico_ippools: bool,
    /// After a pod's DELETE, its IP stays held for its grace period plus this long; then it
    /// is released once the pod is verified gone (with an API server), or at once (without).
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) release_delay: Duration,
    /// The longest grace period a pod's DELETE may hold its IP for: a larger
    /// `gracePeriodSeconds` (or `terminationGracePeriodSeconds`) counts as this much. Past it,
    /// the IP is released once the pod is verified gone (with an API server: a pod that still
    /// runs keeps its IP), or at once (without).
    #[arg(long, default_value = "24h", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) max_release_grace: Duration,
    /// Every ledger call of one admission ends by this long after the review arrived; later,
    /// the admission is denied (and a claim that lands anyway is rolled back). Keep it below
    /// the webhook's timeoutSeconds (the chart sets timeoutSeconds − 1 s).
    #[arg(long, default_value = "4s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) admission_deadline: Duration,
    /// A user whose IPClaim writes the IPClaim guard always admits (repeatable): the server's
    /// own. In a pod, its service account (read from the mounted token) is trusted anyway.
    #[arg(long, value_name = "USERNAME")]
    pub(crate) trusted_username: Vec<String>,
    /// A user whose pods are taken for KubeVirt launcher pods (repeatable; default: KubeVirt's
    /// controller in its default install): a launcher pod's IP is its virtual machine's,
    /// kept across restarts and shared by a live migration's target pod. `--kubevirt-controller
    /// ''` takes no pod for a VM's.
    #[arg(long, value_name = "USERNAME", default_values_t = [crate::decisions::kubevirt::DEFAULT_CONTROLLER.to_string()])]
    pub(crate) kubevirt_controller: Vec<String>,
    /// Free a virtual machine's IP once it is stopped (no VirtualMachineInstance), not only once
    /// the VirtualMachine is deleted.
    #[arg(long)]
    pub(crate) kubevirt_release_on_stop: bool,
    /// A Multus network attachment whose IPs ip-webhook gives out (repeatable): the
    /// NAMESPACE/NAME of its NetworkAttachmentDefinition. A pod names its list for it in
    /// `NAME.NAMESPACE.ip-webhook.io/allocatable-ips`; each network's claims are kept apart.
    #[arg(long = "network", value_name = "NAMESPACE/NAME", value_parser = ip_webhook_ledger::network::Network::parse)]
    pub(crate) networks: Vec<ip_webhook_ledger::network::Network>,
    /// Talk to the API server described by this kubeconfig (selects --ledger kubernetes unless
    /// --ledger is given; with etcd or embedded, pods are looked up there to free leaked IPs).
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// The context of --kubeconfig (or of $KUBECONFIG) to use; default: its current-context.
    #[arg(long, value_name = "NAME")]
    pub(crate) context: Option<String>,
    #[command(flatten)]
    pub(crate) etcd: EtcdArgs,
}

/// `serve`'s default --state-dir.
pub(crate) const DEFAULT_STATE_DIR: &str = "./ip-webhook-state";

/// In-cluster mode: the reconciler and its leader election.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "In-cluster: reconciler, leak sweeper and leader election")]
pub(crate) struct ClusterArgs {
    /// Drop a Reserved IPClaim that no pod took up within this time.
    #[arg(long, default_value = "2m", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) reservation_ttl: Duration,
    /// Keep a gone StatefulSet pod's IP this long for the pod of the same name.
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) sticky_grace: Duration,
    /// Re-list IPClaims and pods from the API server this often (and on start).
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) resync_period: Duration,
    /// The coordination.k8s.io Lease that elects the reconciler.
    #[arg(long, default_value = "ip-webhook-reconciler", value_name = "NAME")]
    pub(crate) lease_name: String,
    /// Namespace of the Lease; default: POD_NAMESPACE, else the service account's namespace.
    #[arg(long, value_name = "NAMESPACE")]
    pub(crate) lease_namespace: Option<String>,
    /// How long a leader's Lease lasts without renewal before another replica takes over.
    #[arg(long, default_value = "15s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) lease_duration: Duration,
    /// How often the leader renews (and candidates check) the Lease.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) lease_renew_interval: Duration,
    /// With --cni calico: keep a Calico IPReservation (ip-webhook-fixed-ips) of every IP
    /// ip-webhook may hand out, so Calico's automatic assignment skips them.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub(crate) calico_reservation: bool,
    /// Release the IP of a pod stuck Terminating (its grace over) on a node whose Ready
    /// condition has been False or Unknown this long; only pods of a ReplicaSet, Job or
    /// DaemonSet (StatefulSet and bare pods keep theirs). 0 turns it off.
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) node_lost_grace: Duration,
    /// With --cni kube-ovn: keep a Kube-OVN IPPool (ip-webhook-<subnet>) per Subnet over the
    /// IPs ip-webhook may hand out, so Kube-OVN's random allocation skips them.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub(crate) kube_ovn_reservation: bool,
    /// Where the IPs of pods not given one by ip-webhook come from. auto: with --cni calico,
    /// Calico's IPAMBlocks when served (only pods carrying our label are then watched whole),
    /// else every pod; pods: every pod, whole (a Calico that uses another IPAM plugin).
    #[arg(long, value_enum, default_value_t = PodIpsFrom::Auto, value_name = "SOURCE")]
    pub(crate) pod_ips_from: PodIpsFrom,
}

/// `--pod-ips-from`.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(crate) enum PodIpsFrom {
    Auto,
    Pods,
}

/// How to reach etcd for `--ledger etcd` (a build with the `etcd` cargo feature).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "etcd ledger (--ledger etcd)")]
pub(crate) struct EtcdArgs {
    /// etcd client URLs, comma-separated (`https://10.0.0.1:2379,https://10.0.0.2:2379`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379",
        value_name = "URLS"
    )]
    pub(crate) etcd_endpoints: Vec<String>,
    /// Key prefix under which claims are kept, one key per IP.
    #[arg(long, default_value = "/ip-webhook/", value_parser = parse_etcd_prefix, value_name = "PREFIX")]
    pub(crate) etcd_prefix: String,
    /// PEM CA bundle that signed the etcd server certificates.
    #[arg(long, value_name = "FILE")]
    pub(crate) etcd_ca_file: Option<PathBuf>,
    /// PEM client certificate for etcd (with --etcd-key-file).
    #[arg(long, value_name = "FILE", requires = "etcd_key_file")]
    pub(crate) etcd_cert_file: Option<PathBuf>,
    /// PEM private key of --etcd-cert-file.
    #[arg(long, value_name = "FILE", requires = "etcd_cert_file")]
    pub(crate) etcd_key_file: Option<PathBuf>,
    /// Deadline of one etcd request, and of the retries of one ledger write.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) etcd_timeout: Duration,
    /// Reload every claim under the prefix this often and repair the index (also done after
    /// the watch lost history to compaction, and after it reconnected).
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) etcd_resync_period: Duration,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct ServeArgs {
    /// HTTPS address for POST /mutate and POST /validate (`:8443` is every IPv4 address).
    #[arg(long, default_value = "0.0.0.0:8443", value_parser = parse_listen, value_name = "ADDR")]
    pub(crate) listen: SocketAddr,
    /// Plain-HTTP address for GET /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:8080", value_parser = parse_listen, value_name = "ADDR")]
    pub(crate) admin_listen: SocketAddr,
    /// PEM certificate chain; reloaded when the file changes.
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_key_file",
        conflicts_with = "self_signed"
    )]
    pub(crate) tls_cert_file: Option<PathBuf>,
    /// PEM private key for --tls-cert-file.
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    pub(crate) tls_key_file: Option<PathBuf>,
    /// Generate a CA and serving certificate (the default when no certificate is given); both
    /// are kept in --state-dir and reused on restart (the certificate until 30 days before it
    /// expires), and the CA's base64 is printed for the webhook's caBundle.
    #[arg(long)]
    pub(crate) self_signed: bool,
    /// Extra DNS names for the self-signed certificate (repeatable).
    #[arg(long = "dns-name", value_name = "NAME")]
    pub(crate) dns_names: Vec<String>,
    /// How often to re-read the certificate files even without a file event.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) tls_reload_interval: Duration,
    /// Deadline for a client to send a request's head (after TLS: the first head or the
    /// HTTP/2 preface), and again its body.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) read_timeout: Duration,
    /// Close a connection with no request open for this long (HTTP/1 keep-alive, or HTTP/2
    /// without a stream).
    #[arg(long, default_value = "90s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) idle_timeout: Duration,
    /// HTTPS connections served at once; more are closed as they are accepted.
    #[arg(long, default_value_t = crate::server::DEFAULT_MAX_CONNECTIONS, value_name = "N")]
    pub(crate) max_connections: usize,
    /// Of --max-connections, how many may be in their TLS handshake at once (default: a
    /// quarter); past it, or with every slot taken, the oldest handshaking connection is closed
    /// for the newcomer.
    #[arg(long, value_name = "N")]
    pub(crate) max_handshakes: Option<usize>,
    /// Deadline for a client to finish its TLS handshake from its connection's accept.
    #[arg(long, default_value = "3s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) handshake_timeout: Duration,
    /// Request body bytes held at once (declared lengths count whole); past it, 503 before
    /// reading. At least 7Mi (one largest review). Suffixes Ki, Mi, Gi.
    #[arg(long, default_value = "64Mi", value_parser = parse_size, value_name = "BYTES")]
    pub(crate) max_inflight_bytes: usize,
    /// At most this many apps get per-app metrics series; the rest are counted in
    /// ip_webhook_metrics_app_series_overflow_total.
    #[arg(long, default_value_t = crate::metrics::DEFAULT_MAX_APPS, value_name = "N")]
    pub(crate) metrics_max_apps: usize,
    /// PEM CA bundle: HTTPS then requires a client certificate that chains to it (the API
    /// server's, see docs/security.md); reloaded when the file changes.
    #[arg(long, value_name = "FILE")]
    pub(crate) client_ca_file: Option<PathBuf>,
    /// With --client-ca-file: the client certificate's CN or a DNS SAN must be one of these.
    #[arg(
        long,
        value_delimiter = ',',
        requires = "client_ca_file",
        value_name = "NAMES"
    )]
    pub(crate) client_allowed_names: Vec<String>,
    /// How long SIGTERM waits for in-flight admissions before exiting.
    #[arg(long, default_value = "25s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) shutdown_grace: Duration,
    /// Log format: text (default), or json for collectors (one object per line, fields at the
    /// top level, from the first line); the level comes from RUST_LOG (default info).
    #[arg(long, value_parser = log_format_parser(), value_name = "text|json")]
    pub(crate) log_format: Option<LogFormat>,
    #[command(flatten)]
    pub(crate) webhook: WebhookArgs,
    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct ReviewArgs {
    /// Send the review to /validate instead of /mutate.
    #[arg(long)]
    pub(crate) validate: bool,
    /// Set request.dryRun: decide, but record nothing (the ledger is opened read-only).
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// The AdmissionReview JSON file, or - for standard input.
    #[arg(value_name = "FILE|-")]
    pub(crate) file: String,
    #[command(flatten)]
    pub(crate) verbosity: Verbosity,
    #[command(flatten)]
    pub(crate) webhook: WebhookArgs,
}
