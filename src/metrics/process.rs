//! The standard `process_*` metrics (as the Go and Python clients name them), read from
//! `/proc/self` at each scrape: prometheus-client has no process collector of its own.
//! Elsewhere than Linux nothing is reported.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// One reading of this process.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    /// User and system CPU time, seconds.
    pub(crate) cpu_seconds: f64,
    pub(crate) resident_memory_bytes: u64,
    pub(crate) virtual_memory_bytes: u64,
    pub(crate) open_fds: u64,
    /// The soft RLIMIT_NOFILE; `None` when unlimited.
    pub(crate) max_fds: Option<u64>,
    /// Unix seconds.
    pub(crate) start_time_seconds: f64,
    pub(crate) threads: u64,
}

impl Sample {
    #[cfg(target_os = "linux")]
    pub(crate) fn read() -> Option<Sample> {
        use procfs::process::{LimitValue, Process};
        let me = Process::myself().ok()?;
        let stat = me.stat().ok()?;
        let ticks = procfs::ticks_per_second().max(1) as f64;
        let boot = procfs::boot_time_secs().ok()? as f64;
        let max_fds = match me.limits().ok()?.max_open_files.soft_limit {
            LimitValue::Value(n) => Some(n),
            LimitValue::Unlimited => None,
        };
        Some(Sample {
            cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
            resident_memory_bytes: stat.rss.saturating_mul(procfs::page_size()),
            virtual_memory_bytes: stat.vsize,
            open_fds: u64::try_from(me.fd_count().ok()?).unwrap_or(u64::MAX),
            max_fds,
            start_time_seconds: boot + stat.starttime as f64 / ticks,
            threads: u64::try_from(stat.num_threads).unwrap_or(0),
        })
    }

    #[cfg(not(target_os = "linux"))]
    pub(crate) fn read() -> Option<Sample> {
        None
    }
}

/// Registered on the unprefixed registry, so the names are the usual `process_*`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ProcessCollector;

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: impl prometheus_client::encoding::EncodeGaugeValue + Copy,
) -> Result<(), std::fmt::Error> {
    let metric = ConstGauge::new(value);
    let family = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(family)
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(sample) = Sample::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(sample.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        gauge(
            &mut encoder,
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            clamp(sample.resident_memory_bytes),
        )?;
        gauge(
            &mut encoder,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            clamp(sample.virtual_memory_bytes),
        )?;
        gauge(
            &mut encoder,
            "process_open_fds",
            "Number of open file descriptors",
            clamp(sample.open_fds),
        )?;
        if let Some(max) = sample.max_fds {
            gauge(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors",
                clamp(max),
            )?;
        }
        gauge(
            &mut encoder,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            sample.start_time_seconds,
        )?;
        gauge(
            &mut encoder,
            "process_threads",
            "Number of OS threads in the process",
            clamp(sample.threads),
        )
    }
}
