//! The embedded ledger's Prometheus counters: commits, batch sizes and the stages of one
//! request (queue, commit, wake-up), registered by `metrics` beside the others.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    /// `queue` (request sent to the writer until its batch starts), `commit` (batch start until
    /// durable), `wakeup` (answer sent until the request task runs again).
    pub(crate) stage: &'static str,
}

/// Counters and histograms the writer updates; the metrics registry holds clones of them.
#[derive(Clone, Debug)]
pub struct CommitCounters {
    /// Commits that wrote something (one `fdatasync` each).
    pub commits: Counter,
    /// Claim writes made durable.
    pub writes: Counter,
    /// Time of each commit that wrote something (apply, write, fsync).
    pub commit_seconds: Histogram,
    /// Requests per batch the writer took.
    pub batch_size: Histogram,
    /// Time of each stage of a durable request.
    pub stage_seconds: Family<StageLabels, Histogram>,
    /// 1 while the journal cannot grow its room for lack of space (its disk is full).
    pub disk_full: prometheus_client::metrics::gauge::Gauge,
    /// `stage_seconds`' three series, looked up once: an observation then takes neither the
    /// family's lock nor a hash of its labels.
    stages: [Histogram; 3],
}

/// The stages of a durable request, as `stage_seconds` labels them.
#[derive(Clone, Copy)]
pub(super) enum Stage {
    Queue,
    Commit,
    Wakeup,
}

impl Stage {
    const ALL: [Stage; 3] = [Stage::Queue, Stage::Commit, Stage::Wakeup];

    pub(super) fn label(self) -> &'static str {
        match self {
            Stage::Queue => "queue",
            Stage::Commit => "commit",
            Stage::Wakeup => "wakeup",
        }
    }
}

pub(super) fn seconds_buckets() -> impl Iterator<Item = f64> {
    // 10 µs .. ~10 s
    exponential_buckets(0.00001, 2.0, 21)
}

impl Default for CommitCounters {
    fn default() -> Self {
        let stage_seconds = Family::<StageLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(seconds_buckets())
        });
        // a clone shares the series it was cloned from
        let stages = Stage::ALL.map(|stage| {
            let labels = StageLabels {
                stage: stage.label(),
            };
            stage_seconds.get_or_create(&labels).clone()
        });
        CommitCounters {
            commits: Counter::default(),
            writes: Counter::default(),
            commit_seconds: Histogram::new(seconds_buckets()),
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 13)),
            stage_seconds,
            disk_full: Default::default(),
            stages,
        }
    }
}

impl CommitCounters {
    pub(super) fn stage(&self, stage: Stage, seconds: f64) {
        self.stages[stage as usize].observe(seconds);
    }
}
