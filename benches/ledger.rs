//! Embedded ledger commits: `batch` concurrent creates, which the writer thread gathers into as few commits (fsyncs) as
//! it can. Time per batch; throughput in claims. The restart figures (open + load of 100,000
//! claims, bytes per claim) are `examples/ledger_load.rs restart`.
//!
//! `cargo bench --bench ledger`

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ip_webhook_ledger::embedded::CommitCounters;
use ip_webhook_ledger::{Claim, CreateOutcome, EmbeddedLedger, Ledger};

#[path = "../tests/common/claims.rs"]
mod claims;

/// The `n`th reservation of app `web`: 10.0.0.0 + `n`, by request `uid-{n}`.
fn reservation(n: u32) -> Claim {
    let ip = Ipv4Addr::from(u32::from_be_bytes([10, 0, 0, 0]) + n).to_string();
    claims::builder(&ip, "web", "")
        .generate_name("web-7d4b9c8f6d-")
        .request(&format!("uid-{n}"))
        .build()
}

fn commits(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("ledger_commit");
    group.sample_size(20);
    {
        let label = "journal";
        let dir = tempfile::tempdir().expect("temp dir");
        let counters = CommitCounters::default();
        let ledger =
            Arc::new(EmbeddedLedger::open(dir.path(), counters.clone()).expect("ledger opens"));
        let next = AtomicU32::new(0);
        for batch in [1u32, 16, 256] {
            group.throughput(Throughput::Elements(u64::from(batch)));
            group.bench_function(BenchmarkId::new(label, batch), |b| {
                b.to_async(&runtime).iter(|| async {
                    let first = next.fetch_add(batch, Ordering::Relaxed);
                    let creates = (first..first + batch).map(|n| {
                        let ledger = ledger.clone();
                        tokio::spawn(async move { ledger.create(reservation(n).into()).await })
                    });
                    for created in futures::future::join_all(creates).await {
                        assert_eq!(
                            created.expect("task").expect("durable"),
                            CreateOutcome::Created
                        );
                    }
                })
            });
        }
        eprintln!(
            "embedded ledger ({label}): {} claims in {} commits ({:.3} fsyncs per claim)",
            counters.writes.get(),
            counters.commits.get(),
            counters.commits.get() as f64 / counters.writes.get().max(1) as f64
        );
        runtime.block_on(ledger.close());
    }
    group.finish();
}

criterion_group!(benches, commits);
criterion_main!(benches);
