//! Overlap checks stay fast with thousands of pools: the interval index against a linear scan.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ip_webhook_ipam::ipset::IpRange;
use ip_webhook_ipam::pools::{Pool, PoolCatalog};
use ip_webhook_ledger::crd::{FixedIPPool, FixedIPPoolSpec};

fn pools(count: u32) -> Vec<FixedIPPool> {
    (0..count)
        .map(|i| {
            FixedIPPool::new(
                &format!("pool-{i}"),
                FixedIPPoolSpec {
                    cidr: format!("10.{}.{}.0/24", i / 256, i % 256),
                    ..Default::default()
                },
            )
        })
        .collect()
}

fn probe(cidr: &str) -> Pool {
    Pool::from_resource(&FixedIPPool::new(
        "probe",
        FixedIPPoolSpec {
            cidr: cidr.into(),
            ..Default::default()
        },
    ))
    .unwrap()
}

fn overlap(c: &mut Criterion) {
    let mut group = c.benchmark_group("pool_overlap");
    for count in [100u32, 10_000] {
        let resources = pools(count);
        let catalog = PoolCatalog::new(&resources).unwrap();
        let all: Vec<Pool> = resources
            .iter()
            .map(|r| Pool::from_resource(r).unwrap())
            .collect();
        let hit = probe(&format!(
            "10.{}.{}.128/25",
            (count / 2) / 256,
            (count / 2) % 256
        ));
        let miss = probe("172.16.0.0/24");
        group.bench_with_input(BenchmarkId::new("index_hit", count), &hit, |b, p| {
            b.iter(|| black_box(catalog.overlapping(black_box(p)).is_some()))
        });
        group.bench_with_input(BenchmarkId::new("index_miss", count), &miss, |b, p| {
            b.iter(|| black_box(catalog.overlapping(black_box(p)).is_some()))
        });
        group.bench_with_input(
            BenchmarkId::new("linear_scan_miss", count),
            &miss,
            |b, p| {
                b.iter(|| {
                    let probe = IpRange::from_net_all(&p.cidr);
                    black_box(
                        all.iter()
                            .any(|o| IpRange::from_net_all(&o.cidr).overlaps(&probe)),
                    )
                })
            },
        );
    }
    group.finish();
    c.bench_function("pool_catalog_build_10000", |b| {
        let resources = pools(10_000);
        b.iter(|| black_box(PoolCatalog::new(black_box(&resources)).unwrap()))
    });
}

criterion_group!(benches, overlap);
criterion_main!(benches);
