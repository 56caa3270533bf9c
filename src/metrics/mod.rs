//! Prometheus metrics, registered once and encoded on `GET /metrics`.
//!
//! The webhook's own metrics are named `ip_webhook_*`; the process metrics keep their usual
//! names (`process_resident_memory_bytes`, ...). Labels that name a pod's namespace are called
//! `app_namespace`: Prometheus gives every target a `namespace` label of its own (the
//! webhook's), and would rename ours to `exported_namespace`.
//!
//! The contract, for every layer above: one [`Metrics`] per process, shared; each layer records
//! through its methods (never through the registry), and [`Metrics::encode`] is the text a
//! scrape gets. A metric's name and labels are part of the product (dashboards and alerts in
//! `deploy/monitoring` read them), and `tests/chart/monitoring.rs` checks that every metric and
//! label they query is one a running server exports.

mod capacity;
mod process;
pub(crate) mod watch_health;

#[cfg(test)]
use capacity::app_utilization;
use capacity::{CapacityCollector, CapacitySource};
pub(crate) use process::ProcessCollector;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use ip_webhook_ipam::allocator::Allocator;
use ip_webhook_ipam::pools::PoolCatalog;
use ip_webhook_ledger::LedgerLabels;
use ip_webhook_ledger::embedded::CommitCounters;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Endpoint {
    mutate,
    validate,
}

impl Endpoint {
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Endpoint::mutate => "mutate",
            Endpoint::validate => "validate",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum Outcome {
    allowed,
    denied,
    /// 4xx: not a review, wrong content type, too large, too slow.
    bad_request,
    /// 5xx: a panic or an internal error.
    error,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub(crate) webhook: Endpoint,
    pub(crate) outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WebhookLabels {
    pub(crate) webhook: Endpoint,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum AllocationOutcome {
    allocated,
    dry_run,
    reused,
    static_recorded,
    exhausted,
    conflict,
    refused,
    error,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct AllocationLabels {
    pub(crate) outcome: AllocationOutcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct AppLabels {
    /// The app's namespace (not `namespace`, which Prometheus sets to the webhook's).
    pub(crate) app_namespace: String,
    pub(crate) app: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ExhaustedLabels {
    pub(crate) app_namespace: String,
    pub(crate) app: String,
    /// Empty for an `allocatable-ips` list.
    pub(crate) pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    pub lease: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PoolLabels {
    pub(crate) pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BuildLabels {
    pub(crate) version: &'static str,
    pub(crate) commit: &'static str,
}

/// The commit the binary was built from (`build.rs`), or "unknown".
pub(crate) const COMMIT: &str = env!("IP_WEBHOOK_GIT_COMMIT");

/// `ip_webhook_cache_objects{kind}`: `pod`, `kube-ovn-ip`, `workload`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CacheKindLabels {
    pub(crate) kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// One endpoint's series of the request families, resolved once: every admission updates
/// them, and a family looks its labels up under a lock. (They are the families' own series,
/// so they are exported from the start, at zero.)
pub(crate) struct WebhookSeries {
    pub(crate) in_flight: Gauge,
    pub(crate) latency: Histogram,
    allowed: Counter,
    denied: Counter,
    bad_request: Counter,
    error: Counter,
}

impl WebhookSeries {
    fn new(
        requests: &Family<RequestLabels, Counter>,
        latency: &Family<WebhookLabels, Histogram>,
        in_flight: &Family<WebhookLabels, Gauge>,
        webhook: Endpoint,
    ) -> WebhookSeries {
        let labels = WebhookLabels {
            webhook: webhook.clone(),
        };
        let requests = |outcome| {
            requests
                .get_or_create(&RequestLabels {
                    webhook: webhook.clone(),
                    outcome,
                })
                .clone()
        };
        WebhookSeries {
            in_flight: in_flight.get_or_create(&labels).clone(),
            latency: latency.get_or_create(&labels).clone(),
            allowed: requests(Outcome::allowed),
            denied: requests(Outcome::denied),
            bad_request: requests(Outcome::bad_request),
            error: requests(Outcome::error),
        }
    }

    /// The count of requests answered with `outcome`.
    pub(crate) fn requests(&self, outcome: Outcome) -> &Counter {
        match outcome {
            Outcome::allowed => &self.allowed,
            Outcome::denied => &self.denied,
            Outcome::bad_request => &self.bad_request,
            Outcome::error => &self.error,
        }
    }
}

pub struct Metrics {
    pub(crate) registry: Registry,
    pub(crate) requests: Family<RequestLabels, Counter>,
    pub(crate) latency: Family<WebhookLabels, Histogram>,
    pub(crate) in_flight: Family<WebhookLabels, Gauge>,
    /// Each endpoint's series of the three families above, by [`Endpoint`] order.
    webhooks: [WebhookSeries; 2],
    pub(crate) panics: Counter,
    pub(crate) allocations: Family<AllocationLabels, Counter>,
    /// Pods refused because every IP of their list or pool was held.
    pub(crate) exhausted_refusals: Family<ExhaustedLabels, Counter>,
    /// Exhaustion refusals that got no per-app series: the app holds no IP (so the names
    /// came only from the request), or `--metrics-max-apps` series exist already.
    pub(crate) exhausted_unattributed: Counter,
    /// Exhaustion refusals of apps that hold IPs that got no series of their own because
    /// `--metrics-max-apps` series exist (the per-app gauges report what they leave out in
    /// `metrics_apps_left_out`).
    pub(crate) app_series_overflow: Counter,
    /// TLS handshakes refused for the client certificate, by reason.
    pub(crate) client_cert_refusals: Family<ReasonLabels, Counter>,
    /// Connections and requests refused by the connection and in-flight byte limits.
    pub(crate) load_refusals: Family<ReasonLabels, Counter>,
    /// Times the certificate files were read and compared (events and polls).
    pub tls_checks: Counter,
    pub releases: Counter,
    /// Admitted pod DELETEs whose pod still ran when its grace ended: the IP was kept.
    pub(crate) releases_refused: Counter,
    /// Claims of pods stuck Terminating on a lost node, released (`crate::cluster::node_loss`).
    pub(crate) node_lost_releases: Counter,
    /// Reservations no pod picked up, dropped by the reconciler.
    pub reservations_expired: Counter,
    /// Claims of pods that went without a release (missed DELETE), reclaimed by the reconciler;
    /// with etcd or embedded, every claim the leak sweeper frees.
    pub leaks_reclaimed: Counter,
    pub ledger: CommitCounters,
    /// IPs that two or more live pods carry, as the reconciler last saw (in-cluster).
    pub(crate) duplicate_ips: Gauge,
    /// Claims the reconciler recorded for pods that held none, by reason (`token`: a pod our
    /// webhooks admitted whose record was lost; `app_list`: a pod running on an IP of its own
    /// app's list, started before ip-webhook was installed).
    pub(crate) adoptions: Family<ReasonLabels, Counter>,
    /// Whether the ledger can serve (failures in a row, since when): `/readyz` reads it.
    pub(crate) ledger_health: Arc<ip_webhook_ledger::health::LedgerHealth>,
    /// Whether the in-cluster watches are live (`watch_health`).
    pub(crate) watch_health: Arc<watch_health::WatchHealth>,
    /// Time of each ledger call, by ledger and operation.
    pub(crate) ledger_latency: Family<LedgerLabels, Histogram>,
    pub tls_reloads: Family<ResultLabels, Counter>,
    /// notAfter of the certificate being served, unix seconds.
    pub(crate) certificate_expiry: Gauge,
    /// 1 while this replica holds the reconciler's Lease, else 0; absent off-cluster (the
    /// Lease code sets it: `leader.get_or_create(&LeaseLabels { lease }).set(1)`).
    pub leader: Family<LeaseLabels, Gauge>,
    /// Objects held by the watch-fed indexes (in-cluster), by kind.
    pub(crate) cache_objects: Family<CacheKindLabels, Gauge>,
    capacity: Arc<OnceLock<CapacitySource>>,
    /// At most this many apps get per-app series (`--metrics-max-apps`).
    max_apps: Arc<AtomicUsize>,
    /// Series in `exhausted_refusals`.
    exhausted_series: AtomicUsize,
}

/// Why the reconciler records a claim for a pod (`ip_webhook_adoptions_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AdoptReason {
    /// The pod carries a claim token our webhooks issued; its record was lost.
    Token,
    /// The pod runs on an IP (`status.podIPs`) that its own app's list holds (and no other
    /// app's), without any claim: it started before ip-webhook was installed.
    AppList,
}

impl AdoptReason {
    pub(crate) const ALL: [AdoptReason; 2] = [AdoptReason::Token, AdoptReason::AppList];

    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            AdoptReason::Token => "token",
            AdoptReason::AppList => "app_list",
        }
    }
}

/// The default of `--metrics-max-apps`.
pub(crate) const DEFAULT_MAX_APPS: usize = 10_000;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    pub(crate) reason: &'static str,
}

/// `ip_webhook_build_info`: the version and commit of the running binary.
fn register_build_info(registry: &mut Registry) {
    let build_info = Family::<BuildLabels, Gauge>::default();
    build_info
        .get_or_create(&BuildLabels {
            version: env!("CARGO_PKG_VERSION"),
            commit: COMMIT,
        })
        .set(1);
    registry.register(
        "build_info",
        "Always 1; the version and git commit of the running binary",
        build_info,
    );
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Every metric, registered: the process's, then each group of the webhook's own under
    /// `ip_webhook_` (one `register_*` per group, so a new metric goes beside its kind).
    pub fn new() -> Metrics {
        let mut metrics = Metrics::unregistered();
        let mut root = Registry::default();
        root.register_collector(Box::new(ProcessCollector));
        let registry = root.sub_registry_with_prefix("ip_webhook");
        register_build_info(registry);
        metrics.register_requests(registry);
        metrics.register_claims(registry);
        metrics.register_ledger(registry);
        metrics.register_cluster(registry);
        metrics.register_tls(registry);
        registry.register_collector(Box::new(CapacityCollector {
            source: metrics.capacity.clone(),
            max_apps: metrics.max_apps.clone(),
        }));
        metrics.registry = root;
        metrics
    }

    /// The metrics with their starting values, in an empty registry.
    fn unregistered() -> Metrics {
        let requests = Family::default();
        // 10 µs .. ~5 s
        let latency: Family<WebhookLabels, Histogram> =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.00001, 2.5, 15)));
        let in_flight = Family::default();
        let webhooks = [Endpoint::mutate, Endpoint::validate]
            .map(|endpoint| WebhookSeries::new(&requests, &latency, &in_flight, endpoint));
        Metrics {
            registry: Registry::default(),
            requests,
            latency,
            in_flight,
            webhooks,
            panics: Counter::default(),
            allocations: Family::default(),
            exhausted_refusals: Family::default(),
            exhausted_unattributed: Counter::default(),
            app_series_overflow: Counter::default(),
            client_cert_refusals: Family::default(),
            load_refusals: Family::default(),
            tls_checks: Counter::default(),
            releases: Counter::default(),
            releases_refused: Counter::default(),
            node_lost_releases: Counter::default(),
            reservations_expired: Counter::default(),
            leaks_reclaimed: Counter::default(),
            ledger: CommitCounters::default(),
            duplicate_ips: Gauge::default(),
            adoptions: Family::default(),
            ledger_health: Arc::new(ip_webhook_ledger::health::LedgerHealth::new()),
            watch_health: Default::default(),
            // 50 µs .. ~13 s
            ledger_latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.00005, 2.0, 19))
            }),
            tls_reloads: Family::default(),
            certificate_expiry: Gauge::default(),
            leader: Family::default(),
            cache_objects: Family::default(),
            capacity: Arc::new(OnceLock::new()),
            max_apps: Arc::new(AtomicUsize::new(DEFAULT_MAX_APPS)),
            exhausted_series: AtomicUsize::new(0),
        }
    }

    /// The series an admission to `endpoint` updates.
    pub(crate) fn webhook(&self, endpoint: &Endpoint) -> &WebhookSeries {
        &self.webhooks[match endpoint {
            Endpoint::mutate => 0,
            Endpoint::validate => 1,
        }]
    }

    /// Admission requests: how many, how long, and those refused by the load limits.
    fn register_requests(&self, registry: &mut Registry) {
        registry.register(
            "requests",
            "Admission requests by webhook and outcome",
            self.requests.clone(),
        );
        registry.register(
            "webhook_latency_seconds",
            "Time to answer an admission request",
            self.latency.clone(),
        );
        registry.register(
            "requests_in_flight",
            "Admission requests being answered",
            self.in_flight.clone(),
        );
        registry.register(
            "panics_recovered",
            "Handler panics caught and answered with 500",
            self.panics.clone(),
        );
        for reason in ["max_connections", "handshake_evicted", "max_inflight_bytes"] {
            drop(self.load_refusals.get_or_create(&ReasonLabels { reason }));
        }
        registry.register(
            "load_refusals",
            "Connections refused at accept (max_connections) or closed in their TLS handshake to make room (handshake_evicted), and requests refused (max_inflight_bytes), by the load limits",
            self.load_refusals.clone(),
        );
    }

    /// Claims: allocations, exhaustion, releases.
    fn register_claims(&self, registry: &mut Registry) {
        registry.register(
            "allocations",
            "IP allocation decisions by outcome",
            self.allocations.clone(),
        );
        registry.register(
            "exhausted_refusals",
            "Pods refused because every IP of their list or pool was held (apps that hold IPs)",
            self.exhausted_refusals.clone(),
        );
        registry.register(
            "exhausted_refusals_unattributed",
            "Exhaustion refusals of apps that hold no IP, or past --metrics-max-apps (no per-app series)",
            self.exhausted_unattributed.clone(),
        );
        registry.register(
            "metrics_app_series_overflow",
            "Per-app series not created because --metrics-max-apps apps have series",
            self.app_series_overflow.clone(),
        );
        registry.register(
            "releases",
            "Claims released (pod deleted)",
            self.releases.clone(),
        );
        registry.register(
            "releases_refused",
            "Pod DELETEs admitted whose pod still ran when its grace period ended: its IP was kept",
            self.releases_refused.clone(),
        );
    }

    /// The ledger: call latency, unreadable records, and the embedded writer's commits.
    fn register_ledger(&self, registry: &mut Registry) {
        registry.register(
            "ledger_corrupt_records",
            "Ledger records that could not be read (hand-edited or foreign), skipped; their IP stays held",
            ip_webhook_ledger::corrupt_records().clone(),
        );
        registry.register(
            "ledger_index_resyncs",
            "Times the index was reloaded whole from a shared ledger (etcd: compaction gap, reconnect, --resync-period)",
            ip_webhook_ledger::index_resyncs().clone(),
        );
        registry.register(
            "ledger_operation_seconds",
            "Time of each ledger call (create, release, load)",
            self.ledger_latency.clone(),
        );
        let ledger = &self.ledger;
        registry.register(
            "ledger_commits",
            "Ledger transactions committed (one fsync each)",
            ledger.commits.clone(),
        );
        registry.register(
            "ledger_writes",
            "Claim writes made durable",
            ledger.writes.clone(),
        );
        registry.register(
            "ledger_commit_seconds",
            "Time of each embedded-ledger commit that wrote something (apply, write, fdatasync)",
            ledger.commit_seconds.clone(),
        );
        registry.register(
            "ledger_batch_size",
            "Requests per embedded-ledger batch (group commit)",
            ledger.batch_size.clone(),
        );
        registry.register(
            "ledger_stage_seconds",
            "Stages of a durable embedded-ledger request: queue (until its batch starts), commit, wakeup (answer sent until the request task runs)",
            ledger.stage_seconds.clone(),
        );
        registry.register(
            "ledger_disk_full",
            "1 while the embedded ledger cannot make room for new records because its disk (the --state-dir's file system) is full",
            ledger.disk_full.clone(),
        );
    }

    /// In-cluster: the reconciler's work, the Lease, the watch-fed caches.
    fn register_cluster(&self, registry: &mut Registry) {
        registry.register(
            "reservations_expired",
            "Reservations no pod picked up within the TTL, dropped by the reconciler",
            self.reservations_expired.clone(),
        );
        registry.register(
            "leaks_reclaimed",
            "Claims of pods gone without a release, reclaimed by the reconciler (or the leak sweeper)",
            self.leaks_reclaimed.clone(),
        );
        registry.register(
            "duplicate_ips",
            "IPs that two or more live pods carry, as the reconciler's last pass saw (Warning Events DuplicateIP on the pods)",
            self.duplicate_ips.clone(),
        );
        for reason in AdoptReason::ALL {
            drop(self.adoptions.get_or_create(&ReasonLabels {
                reason: reason.label(),
            }));
        }
        registry.register(
            "adoptions",
            "Claims the reconciler recorded for pods that held none, by reason (token: admitted by ip-webhook, record lost; app_list: running on an IP of its own app's list before ip-webhook was installed)",
            self.adoptions.clone(),
        );
        registry.register(
            "node_lost_releases",
            "Claims released because their pod was stuck Terminating on a node NotReady for longer than --node-lost-grace",
            self.node_lost_releases.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the reconciler's Lease",
            self.leader.clone(),
        );
        registry.register(
            "cache_objects",
            "Objects held by the watch-fed indexes (pods with IPs, Kube-OVN IPs, workloads listing IPs)",
            self.cache_objects.clone(),
        );
    }

    /// TLS: client certificates refused, certificate reloads and expiry.
    fn register_tls(&self, registry: &mut Registry) {
        // every reason starts at 0, so alerts on increase() see the series from the start
        for reason in ["missing", "untrusted", "name"] {
            drop(
                self.client_cert_refusals
                    .get_or_create(&ReasonLabels { reason }),
            );
        }
        registry.register(
            "tls_client_refusals",
            "TLS handshakes refused for the client certificate (missing, untrusted, name)",
            self.client_cert_refusals.clone(),
        );
        registry.register(
            "tls_reload_checks",
            "Times the certificate files were read and compared (file events and polls)",
            self.tls_checks.clone(),
        );
        registry.register(
            "tls_certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate, unix seconds",
            self.certificate_expiry.clone(),
        );
        registry.register(
            "tls_reloads",
            "Serving certificate reloads by result",
            self.tls_reloads.clone(),
        );
    }

    /// At most `max` apps get per-app series (`--metrics-max-apps`).
    pub(crate) fn set_max_apps(&self, max: usize) {
        self.max_apps.store(max, Ordering::Relaxed);
    }

    /// Compute the pool and app gauges from this allocator and catalog at each scrape
    /// (the first call wins: one webhook per registry).
    pub(crate) fn watch_capacity(
        &self,
        allocator: Arc<Allocator>,
        pools: Arc<ArcSwap<PoolCatalog>>,
    ) {
        let _ = self.capacity.set(CapacitySource { allocator, pools });
    }

    /// Count a refusal for exhaustion. Its names come from the refused request, so they get
    /// a series only when the app already holds IPs (the names were admitted before) and
    /// fewer than `--metrics-max-apps` apps have one; otherwise one unlabelled counter.
    pub(crate) fn exhausted(&self, namespace: &str, app: &str, pool: Option<&str>) {
        let labels = ExhaustedLabels {
            app_namespace: namespace.to_string(),
            app: app.to_string(),
            pool: pool.unwrap_or("").to_string(),
        };
        let holds_ips = self
            .capacity
            .get()
            .is_some_and(|source| source.allocator.held_by_app(namespace, app) > 0);
        if !holds_ips {
            self.exhausted_unattributed.inc();
            return;
        }
        // an existing series is always counted; a new one only below the cap
        let known = {
            let existing = self.exhausted_refusals.get(&labels);
            existing.map(|counter| counter.inc()).is_some()
        };
        if known {
            return;
        }
        // two threads adding the same new series both count it: the cap errs low, never high
        if self.exhausted_series.fetch_add(1, Ordering::Relaxed)
            >= self.max_apps.load(Ordering::Relaxed)
        {
            self.exhausted_series.fetch_sub(1, Ordering::Relaxed);
            self.app_series_overflow.inc();
            self.exhausted_unattributed.inc();
            return;
        }
        self.exhausted_refusals.get_or_create(&labels).inc();
    }

    pub(crate) fn allocation(&self, outcome: AllocationOutcome) {
        self.allocations
            .get_or_create(&AllocationLabels { outcome })
            .inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ip_webhook_ipam::usage::AppStatus;

    /// The value of the one sample of `name` whose labels contain `labels`.
    fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(['{', ' ']) && rest.contains(labels))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }

    #[test]
    fn build_info_names_the_version_and_the_commit() {
        let text = Metrics::new().encode();
        let line = format!(
            "ip_webhook_build_info{{version=\"{}\",commit=\"{COMMIT}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&line), "no {line:?} in\n{text}");
        assert!(text.contains("# TYPE ip_webhook_build_info gauge"));
        // From build.rs: a short hex commit, or "unknown" outside a git checkout.
        assert!(
            COMMIT == "unknown"
                || (COMMIT.len() == 12 && COMMIT.bytes().all(|b| b.is_ascii_hexdigit())),
            "{COMMIT:?}"
        );
        let head = std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        if let Some(head) = head
            && std::env::var_os("IP_WEBHOOK_GIT_COMMIT").is_none()
        {
            assert!(
                head.starts_with(COMMIT),
                "built from {COMMIT}, HEAD is {head}"
            );
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn process_metrics_report_this_process() {
        // Burn a little CPU so the tick-granular counter has moved.
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(60) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let metrics = Metrics::new();
        let before = metrics.encode();
        let cpu = sample(&before, "process_cpu_seconds_total", "").expect("cpu counter");
        assert!(cpu > 0.0, "{cpu}");
        assert!(before.contains("# TYPE process_cpu_seconds counter"));
        let rss = sample(&before, "process_resident_memory_bytes", "").unwrap();
        let vsize = sample(&before, "process_virtual_memory_bytes", "").unwrap();
        assert!(
            rss > 1_000_000.0 && vsize >= rss,
            "rss {rss}, vsize {vsize}"
        );
        let fds = sample(&before, "process_open_fds", "").unwrap();
        let max = sample(&before, "process_max_fds", "").unwrap();
        assert!(fds >= 3.0 && fds < max, "{fds} of {max}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = sample(&before, "process_start_time_seconds", "").unwrap();
        assert!(
            start <= now + 1.0 && start > now - 86_400.0,
            "{start} vs {now}"
        );
        assert!(sample(&before, "process_threads", "").unwrap() >= 1.0);
        // Not prefixed: the usual names, which dashboards and alerts expect.
        assert!(!before.contains("ip_webhook_process_"));

        // Open files are counted (other tests of this process may close some meanwhile).
        let files: Vec<std::fs::File> = (0..200)
            .map(|_| std::fs::File::open(env!("CARGO_MANIFEST_DIR")).unwrap())
            .collect();
        let more = sample(&metrics.encode(), "process_open_fds", "").unwrap();
        assert!(more >= fds + 100.0, "{fds} then {more} with 200 more files");
        drop(files);
    }

    #[tokio::test]
    async fn app_metrics_label_the_apps_namespace_app_namespace() {
        use ip_webhook_ledger::{Claim, Ledger, MemoryLedger, Phase, PodRef, Source};
        // refusals get a series of their own only for apps that hold IPs
        let ledger = Arc::new(MemoryLedger::new());
        for (ip, namespace) in [("10.0.0.1", "prod"), ("10.0.0.2", "default")] {
            let claim = Claim {
                ip: ip.parse().unwrap(),
                app: "web".into(),
                pool: None,
                pod: PodRef {
                    namespace: namespace.into(),
                    name: "web-0".into(),
                    ..PodRef::default()
                },
                request_uid: format!("r-{ip}").into(),
                phase: Phase::Bound,
                source: Source::Allocated,
                created_at: 1,
                updated_at: 1,
                list_size: std::num::NonZeroU64::new(1),
                token: Default::default(),
                release_at: None,
                sticky: false,
                vm: None,
            };
            ledger.create(claim.clone().into()).await.unwrap();
        }
        let allocator = Arc::new(Allocator::new(ledger).await.unwrap());
        let metrics = Metrics::new();
        metrics.watch_capacity(
            allocator,
            Arc::new(ArcSwap::from_pointee(PoolCatalog::default())),
        );
        metrics.exhausted("prod", "web", Some("blue"));
        metrics.exhausted("default", "web", None);
        let text = metrics.encode();
        assert!(
            text.contains(
                "ip_webhook_exhausted_refusals_total{app_namespace=\"prod\",app=\"web\",pool=\"blue\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains(
            "ip_webhook_exhausted_refusals_total{app_namespace=\"default\",app=\"web\",pool=\"\"} 1"
        ));
        // No label of ours is called namespace: Prometheus would rename it.
        assert!(
            !text.contains("{namespace=") && !text.contains(",namespace="),
            "{text}"
        );
    }

    fn app(pool: Option<&str>, size: Option<u64>, held: u64, free: Option<u64>) -> AppStatus {
        AppStatus {
            namespace: "prod".into(),
            app: "web".into(),
            pool: pool.map(str::to_string),
            size,
            held,
            reserved: 0,
            free,
            holders: Vec::new(),
        }
    }

    #[test]
    fn app_utilization_covers_lists_and_pools() {
        // A list of 4 with 1 held.
        assert_eq!(app_utilization(&app(None, Some(4), 1, Some(3))), Some(0.25));
        // A pool of 10 IPs: this app holds 2, other apps 6 more; 2 are free.
        assert_eq!(
            app_utilization(&app(Some("blue"), Some(10), 2, Some(2))),
            Some(0.8)
        );
        // A full pool refuses this app's next pod, whoever holds the IPs.
        assert_eq!(
            app_utilization(&app(Some("blue"), Some(10), 1, Some(0))),
            Some(1.0)
        );
        // Unknown or empty sizes give no sample.
        assert_eq!(app_utilization(&app(None, None, 1, None)), None);
        assert_eq!(
            app_utilization(&app(Some("blue"), Some(0), 0, Some(0))),
            None
        );
    }
}
