//! Choosing an IP: lists of 16, 1,024 and 65,536 IPs, empty and 99 % held. The held IPs are the
//! lowest 99 % of the list, the worst case for a scan from the bottom; the allocator's run index
//! should make every case cost about the same.
//!
//! `decide` is the dry-run choice (what /mutate does on `dryRun: true`); `claim_and_release`
//! also marks the IP held and records it (memory ledger), then releases it, so the index is
//! updated twice per iteration.
//!
//! `cargo bench --bench allocator`

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ip_webhook_ipam::allocator::{AllocationRequest, Allocator};
use ip_webhook_ipam::ipset::{Family, IpRange, IpSet};
use ip_webhook_ipam::messages::Scope;
use ip_webhook_ledger::claim::PodIdentity;
use ip_webhook_ledger::{Ledger, MemoryLedger, PodRef};

const BASE: u32 = u32::from_be_bytes([10, 0, 0, 0]);

fn list(size: u32) -> IpSet {
    IpSet::from_ranges([IpRange {
        family: Family::V4,
        start: u128::from(BASE),
        end: u128::from(BASE + size - 1),
    }])
}

#[path = "../tests/common/claims.rs"]
mod claims;

fn pod(generate_name: &str) -> PodRef {
    PodRef {
        namespace: "default".into(),
        generate_name: generate_name.into(),
        ..Default::default()
    }
}

/// An allocator whose ledger holds the lowest `held` IPs of the list for pods of app `web`.
async fn allocator_holding(held: u32) -> Allocator {
    let ledger = Arc::new(MemoryLedger::new());
    for i in 0..held {
        let ip = Ipv4Addr::from(BASE + i).to_string();
        let claim = claims::builder(&ip, "web", &format!("web-held-{i}"))
            .generate_name("web-held-")
            .request(&format!("held-{i}"))
            .bound()
            .build();
        ledger
            .create(claim.clone().into())
            .await
            .expect("memory ledger");
    }
    Allocator::new(ledger).await.expect("loads")
}

fn allocation(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("allocate");
    for size in [16u32, 1024, 65_536] {
        let set = list(size);
        for (state, held) in [("empty", 0), ("held99", size * 99 / 100)] {
            let allocator = runtime.block_on(allocator_holding(held));
            let expected = IpAddr::V4(Ipv4Addr::from(BASE + held));
            let request = AllocationRequest {
                scope: Scope::App {
                    namespace: "default",
                    app: "web",
                },
                app: "web",
                pool: None,
                pod: pod("web-7d4b9c8f6d-"),
                request_uid: "bench",
                token: "0123456789abcdef0123456789abcdef",
                candidates: &set,
                ordinal: None,
                vm: None,
                migration: false,
                dry_run: true,
            };
            let chosen = runtime
                .block_on(allocator.allocate(&request))
                .expect("free");
            assert_eq!(chosen.ips, vec![expected], "the lowest free IP");
            let id = format!("{size}/{state}");
            group.bench_function(BenchmarkId::new("decide", &id), |b| {
                b.to_async(&runtime)
                    .iter(|| async { black_box(allocator.allocate(black_box(&request)).await) })
            });
            let durable = AllocationRequest {
                dry_run: false,
                ..request.clone()
            };
            group.bench_function(BenchmarkId::new("claim_and_release", &id), |b| {
                b.to_async(&runtime).iter(|| async {
                    let made = allocator.allocate(&durable).await.expect("free");
                    let pod = PodIdentity {
                        namespace: "default",
                        name: "web-7d4b9c8f6d-x",
                        uid: None,
                        token: Some(&made.token),
                    };
                    let released = allocator
                        .release_held(&pod, &made.ips)
                        .await
                        .expect("memory ledger");
                    assert_eq!(released, made.ips);
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, allocation);
criterion_main!(benches);
