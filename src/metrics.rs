//! Prometheus metrics, registered once and encoded on `GET /metrics`.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::ledger::embedded::CommitCounters;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Endpoint {
    mutate,
    validate,
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
    pub app_free: Family<AppLabels, Gauge>,
    pub app_held: Family<AppLabels, Gauge>,
    pub releases: Counter,
    pub ledger: CommitCounters,
    pub tls_reloads: Family<ResultLabels, Counter>,
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
        let app_free = Family::<AppLabels, Gauge>::default();
        registry.register(
            "app_free_ips",
            "Free allocatable IPs per app (as of its last admission)",
            app_free.clone(),
        );
        let app_held = Family::<AppLabels, Gauge>::default();
        registry.register("app_held_ips", "IPs held per app", app_held.clone());
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
            app_free,
            app_held,
            releases,
            ledger,
            tls_reloads,
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
