//! Prometheus metrics, registered once and encoded on `GET /metrics`.

use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeGaugeValue, EncodeLabelSet, EncodeLabelValue, EncodeMetric,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::allocator::Allocator;
use crate::ledger::embedded::CommitCounters;
use crate::pools::PoolCatalog;
use crate::status::Report;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Endpoint {
    mutate,
    validate,
}

impl Endpoint {
    pub fn as_str(&self) -> &'static str {
        match self {
            Endpoint::mutate => "mutate",
            Endpoint::validate => "validate",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    allowed,
    denied,
    /// 4xx: not a review, wrong content type, too large, too slow.
    bad_request,
    /// 5xx: a panic or an internal error.
    error,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub webhook: Endpoint,
    pub outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    pub webhook: Endpoint,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum AllocationOutcome {
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
pub struct AllocationLabels {
    pub outcome: AllocationOutcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AppLabels {
    pub namespace: String,
    pub app: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExhaustedLabels {
    pub namespace: String,
    pub app: String,
    /// Empty for an `allocatable-ips` list.
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    pub lease: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LedgerLabels {
    /// `embedded`, `kubernetes`, `etcd`, `memory`.
    pub ledger: &'static str,
    /// `create`, `release`, `load`.
    pub operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

pub struct Metrics {
    pub registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub latency: Family<WebhookLabels, Histogram>,
    pub in_flight: Family<WebhookLabels, Gauge>,
    pub panics: Counter,
    pub allocations: Family<AllocationLabels, Counter>,
    /// Pods refused because every IP of their list or pool was held.
    pub exhausted_refusals: Family<ExhaustedLabels, Counter>,
    pub releases: Counter,
    /// Reservations no pod picked up, dropped by the reconciler.
    pub reservations_expired: Counter,
    /// Claims of pods that went without a release (missed DELETE), reclaimed by the reconciler;
    /// with etcd or embedded, every claim the leak sweeper frees.
    pub leaks_reclaimed: Counter,
    pub ledger: CommitCounters,
    /// Time of each ledger call, by ledger and operation.
    pub ledger_latency: Family<LedgerLabels, Histogram>,
    pub tls_reloads: Family<ResultLabels, Counter>,
    /// notAfter of the certificate being served, unix seconds.
    pub certificate_expiry: Gauge,
    /// 1 while this replica holds the reconciler's Lease, else 0; absent off-cluster (the
    /// Lease code sets it: `leader.get_or_create(&LeaseLabels { lease }).set(1)`).
    pub leader: Family<LeaseLabels, Gauge>,
    capacity: Arc<OnceLock<CapacitySource>>,
}

/// Where the per-pool and per-app gauges are computed from at each scrape.
struct CapacitySource {
    allocator: Arc<Allocator>,
    pools: Arc<ArcSwap<PoolCatalog>>,
}

#[derive(Clone)]
struct CapacityCollector(Arc<OnceLock<CapacitySource>>);

impl std::fmt::Debug for CapacityCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapacityCollector")
    }
}

impl Collector for CapacityCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(source) = self.0.get() else {
            return Ok(());
        };
        let pools = source.pools.load();
        let report = source
            .allocator
            .with_claims(|claims| Report::build(claims, &pools, false));
        let pool = |p: &crate::status::PoolStatus| {
            PoolOrApp::Pool(PoolLabels {
                pool: p.name.clone(),
            })
        };
        let app = |a: &crate::status::AppStatus| {
            PoolOrApp::App(AppLabels {
                namespace: a.namespace.clone(),
                app: a.app.clone(),
            })
        };
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let sized = |size: Option<u64>| size.map(count);
        let ratio =
            |held: u64, size: Option<u64>| size.filter(|s| *s > 0).map(|s| held as f64 / s as f64);
        let p = &report.pools;
        let a = &report.apps;
        encode_gauges(
            &mut encoder,
            "pool_size_ips",
            "Usable IPs of each FixedIPPool",
            p.iter()
                .filter_map(|x| Some((pool(x), sized(x.size)?)))
                .collect(),
        )?;
        encode_gauges(
            &mut encoder,
            "pool_held_ips",
            "IPs of each FixedIPPool held (reserved or bound)",
            p.iter().map(|x| (pool(x), count(x.held))).collect(),
        )?;
        encode_gauges(
            &mut encoder,
            "pool_reserved_ips",
            "IPs of each FixedIPPool reserved at admission, no pod seen yet",
            p.iter().map(|x| (pool(x), count(x.reserved))).collect(),
        )?;
        encode_gauges(
            &mut encoder,
            "pool_utilization_ratio",
            "Held / usable IPs of each FixedIPPool (1 = exhausted)",
            p.iter()
                .filter_map(|x| Some((pool(x), ratio(x.held, x.size)?)))
                .collect(),
        )?;
        encode_gauges(
            &mut encoder,
            "app_size_ips",
            "IPs of each app's list (or its pool's)",
            a.iter()
                .filter_map(|x| Some((app(x), sized(x.size)?)))
                .collect(),
        )?;
        encode_gauges(
            &mut encoder,
            "app_held_ips",
            "IPs held per app",
            a.iter().map(|x| (app(x), count(x.held))).collect(),
        )?;
        encode_gauges(
            &mut encoder,
            "app_free_ips",
            "IPs each app could still get",
            a.iter()
                .filter_map(|x| Some((app(x), sized(x.free)?)))
                .collect(),
        )?;
        encode_gauges(
            &mut encoder,
            "app_utilization_ratio",
            "Held / size of each app's list (1 = the next pod is refused)",
            a.iter()
                .filter(|x| x.pool.is_none())
                .filter_map(|x| Some((app(x), ratio(x.held, x.size)?)))
                .collect(),
        )?;
        Ok(())
    }
}

enum PoolOrApp {
    Pool(PoolLabels),
    App(AppLabels),
}

/// One gauge family with a sample per row (nothing when there are no rows).
fn encode_gauges<N: EncodeGaugeValue + Copy>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: Vec<(PoolOrApp, N)>,
) -> Result<(), std::fmt::Error> {
    let Some((_, first)) = rows.first() else {
        return Ok(());
    };
    let metric_type = ConstGauge::new(*first).metric_type();
    let mut family = encoder.encode_descriptor(name, help, None, metric_type)?;
    for (labels, value) in rows {
        let metric = ConstGauge::new(value);
        match labels {
            PoolOrApp::Pool(l) => metric.encode(family.encode_family(&l)?)?,
            PoolOrApp::App(l) => metric.encode(family.encode_family(&l)?)?,
        }
    }
    Ok(())
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("ip_webhook");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "Admission requests by webhook and outcome",
            requests.clone(),
        );
        // 10 µs .. ~5 s
        let latency = Family::<WebhookLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.00001, 2.5, 15))
        });
        registry.register(
            "webhook_latency_seconds",
            "Time to answer an admission request",
            latency.clone(),
        );
        let in_flight = Family::<WebhookLabels, Gauge>::default();
        registry.register(
            "requests_in_flight",
            "Admission requests being answered",
            in_flight.clone(),
        );
        let panics = Counter::default();
        registry.register(
            "panics_recovered",
            "Handler panics caught and answered with 500",
            panics.clone(),
        );
        let allocations = Family::<AllocationLabels, Counter>::default();
        registry.register(
            "allocations",
            "IP allocation decisions by outcome",
            allocations.clone(),
        );
        let exhausted_refusals = Family::<ExhaustedLabels, Counter>::default();
        registry.register(
            "exhausted_refusals",
            "Pods refused because every IP of their list or pool was held",
            exhausted_refusals.clone(),
        );
        let reservations_expired = Counter::default();
        registry.register(
            "reservations_expired",
            "Reservations no pod picked up within the TTL, dropped by the reconciler",
            reservations_expired.clone(),
        );
        let leaks_reclaimed = Counter::default();
        registry.register(
            "leaks_reclaimed",
            "Claims of pods gone without a release, reclaimed by the reconciler (or the leak sweeper)",
            leaks_reclaimed.clone(),
        );
        // 50 µs .. ~13 s
        let ledger_latency = Family::<LedgerLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.00005, 2.0, 19))
        });
        registry.register(
            "ledger_operation_seconds",
            "Time of each ledger call (create, release, load)",
            ledger_latency.clone(),
        );
        let certificate_expiry = Gauge::default();
        registry.register(
            "tls_certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate, unix seconds",
            certificate_expiry.clone(),
        );
        let leader = Family::<LeaseLabels, Gauge>::default();
        registry.register(
            "leader",
            "1 while this replica holds the reconciler's Lease",
            leader.clone(),
        );
        let capacity = Arc::new(OnceLock::new());
        registry.register_collector(Box::new(CapacityCollector(capacity.clone())));
        let releases = Counter::default();
        registry.register(
            "releases",
            "Claims released (pod deleted)",
            releases.clone(),
        );
        let ledger = CommitCounters::default();
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
        let tls_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "tls_reloads",
            "Serving certificate reloads by result",
            tls_reloads.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            in_flight,
            panics,
            allocations,
            exhausted_refusals,
            releases,
            reservations_expired,
            leaks_reclaimed,
            ledger,
            ledger_latency,
            tls_reloads,
            certificate_expiry,
            leader,
            capacity,
        }
    }

    /// Compute the pool and app gauges from this allocator and catalog at each scrape
    /// (the first call wins: one webhook per registry).
    pub fn watch_capacity(&self, allocator: Arc<Allocator>, pools: Arc<ArcSwap<PoolCatalog>>) {
        let _ = self.capacity.set(CapacitySource { allocator, pools });
    }

    pub fn exhausted(&self, namespace: &str, app: &str, pool: Option<&str>) {
        self.exhausted_refusals
            .get_or_create(&ExhaustedLabels {
                namespace: namespace.to_string(),
                app: app.to_string(),
                pool: pool.unwrap_or("").to_string(),
            })
            .inc();
    }

    /// Record the notAfter of the certificate now served (DER of the leaf).
    pub fn served_certificate(&self, leaf_der: &[u8]) {
        match crate::tls::not_after(leaf_der) {
            Some(not_after) => {
                self.certificate_expiry.set(not_after);
            }
            None => tracing::warn!("cannot read notAfter of the served certificate"),
        }
    }

    pub fn allocation(&self, outcome: AllocationOutcome) {
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
