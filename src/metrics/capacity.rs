//! The per-pool and per-app gauges, computed from the allocator's claims at each scrape.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

use super::{AppLabels, PoolLabels};
use ip_webhook_ipam::allocator::Allocator;
use ip_webhook_ipam::pools::PoolCatalog;
use ip_webhook_ipam::usage::Report;

/// Where the per-pool and per-app gauges are computed from at each scrape.
pub(super) struct CapacitySource {
    pub(super) allocator: Arc<Allocator>,
    pub(super) pools: Arc<ArcSwap<PoolCatalog>>,
}

#[derive(Clone)]
pub(super) struct CapacityCollector {
    pub(super) source: Arc<OnceLock<CapacitySource>>,
    pub(super) max_apps: Arc<AtomicUsize>,
}

impl std::fmt::Debug for CapacityCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapacityCollector")
    }
}

impl Collector for CapacityCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(source) = self.source.get() else {
            return Ok(());
        };
        let pools = source.pools.load();
        let mut report = source
            .allocator
            .with_claims(|claims| Report::build(claims, &pools, false));
        // Every app here holds an IP; past the cap, the rest are left out and counted.
        let max_apps = self.max_apps.load(Ordering::Relaxed);
        let left_out = report.apps.len().saturating_sub(max_apps);
        report.apps.truncate(max_apps);
        let gauge = ConstGauge::new(i64::try_from(left_out).unwrap_or(i64::MAX));
        let family = encoder.encode_descriptor(
            "metrics_apps_left_out",
            "Apps holding IPs left out of the per-app gauges by --metrics-max-apps",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(family)?;
        encode_pool_gauges(&mut encoder, &report.pools)?;
        encode_app_gauges(&mut encoder, &report.apps)
    }
}

fn gauge_count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `pool_*`: each FixedIPPool's size, held and reserved IPs, and utilization.
fn encode_pool_gauges(
    encoder: &mut DescriptorEncoder,
    pools: &[ip_webhook_ipam::usage::PoolStatus],
) -> Result<(), std::fmt::Error> {
    let pool = |p: &ip_webhook_ipam::usage::PoolStatus| {
        PoolOrApp::Pool(PoolLabels {
            pool: p.name.clone(),
        })
    };
    let ratio =
        |held: u64, size: Option<u64>| size.filter(|s| *s > 0).map(|s| held as f64 / s as f64);
    encode_gauges(
        encoder,
        "pool_size_ips",
        "Usable IPs of each FixedIPPool",
        pools
            .iter()
            .filter_map(|x| Some((pool(x), gauge_count(x.size?))))
            .collect(),
    )?;
    encode_gauges(
        encoder,
        "pool_held_ips",
        "IPs of each FixedIPPool held (reserved or bound)",
        pools
            .iter()
            .map(|x| (pool(x), gauge_count(x.held)))
            .collect(),
    )?;
    encode_gauges(
        encoder,
        "pool_reserved_ips",
        "IPs of each FixedIPPool reserved at admission, no pod seen yet",
        pools
            .iter()
            .map(|x| (pool(x), gauge_count(x.reserved)))
            .collect(),
    )?;
    encode_gauges(
        encoder,
        "pool_utilization_ratio",
        "Held / usable IPs of each FixedIPPool (1 = exhausted)",
        pools
            .iter()
            .filter_map(|x| Some((pool(x), ratio(x.held, x.size)?)))
            .collect(),
    )
}

/// `app_*`: each app's list (or pool) size, held and free IPs, and utilization.
fn encode_app_gauges(
    encoder: &mut DescriptorEncoder,
    apps: &[ip_webhook_ipam::usage::AppStatus],
) -> Result<(), std::fmt::Error> {
    let app = |a: &ip_webhook_ipam::usage::AppStatus| {
        PoolOrApp::App(AppLabels {
            app_namespace: a.namespace.clone(),
            app: a.app.clone(),
        })
    };
    encode_gauges(
        encoder,
        "app_size_ips",
        "IPs of each app's list (or its pool's)",
        apps.iter()
            .filter_map(|x| Some((app(x), gauge_count(x.size?))))
            .collect(),
    )?;
    encode_gauges(
        encoder,
        "app_held_ips",
        "IPs held per app",
        apps.iter().map(|x| (app(x), gauge_count(x.held))).collect(),
    )?;
    encode_gauges(
        encoder,
        "app_free_ips",
        "IPs each app could still get",
        apps.iter()
            .filter_map(|x| Some((app(x), gauge_count(x.free?))))
            .collect(),
    )?;
    // Lists and pools alike: 1 always means the app's next pod is refused.
    encode_gauges(
        encoder,
        "app_utilization_ratio",
        "Taken / usable IPs of each app's list or pool (1 = the next pod is refused)",
        apps.iter()
            .filter_map(|x| Some((app(x), app_utilization(x)?)))
            .collect(),
    )
}

/// Taken / usable IPs of what the app draws from: its own list (taken = held by the app), or
/// its pool (taken = held by any app of the pool). `None` when the size is unknown or 0.
pub(crate) fn app_utilization(app: &ip_webhook_ipam::usage::AppStatus) -> Option<f64> {
    let size = app.size.filter(|s| *s > 0)?;
    let taken = size.saturating_sub(app.free?);
    Some(taken as f64 / size as f64)
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
