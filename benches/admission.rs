//! The request path without the network: decoding a review, the whole mutate and validate
//! decisions (dry run, so no ledger write), and encoding the patch and response.
//!
//! `cargo bench --bench admission`

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ip_webhook::decisions::mutate::patch_for;
use ip_webhook::decisions::{Settings, Webhook};
use ip_webhook::metrics::{Endpoint, Metrics};
use ip_webhook_admission::{self as admission, MetaOnly};
use ip_webhook_ipam::allocator::Allocation;
use ip_webhook_ipam::allocator::Allocator;
use ip_webhook_ipam::pools::PoolCatalog;
use ip_webhook_ledger::MemoryLedger;

const REVIEW: &str = include_str!("../tests/fixtures/pod-create-v1.json");

fn dry_run_review() -> Vec<u8> {
    let mut review: serde_json::Value = serde_json::from_str(REVIEW).expect("fixture is JSON");
    review["request"]["dryRun"] = serde_json::Value::Bool(true);
    serde_json::to_vec(&review).expect("serializes")
}

fn webhook(runtime: &tokio::runtime::Runtime) -> Webhook {
    let allocator = runtime
        .block_on(Allocator::new(Arc::new(MemoryLedger::new())))
        .expect("empty ledger loads");
    Webhook::new(
        Settings::default(),
        Arc::new(allocator),
        PoolCatalog::default(),
        Arc::new(Metrics::new()),
    )
}

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Bytes(REVIEW.len() as u64));
    group.bench_function("review_and_pod_metadata", |b| {
        b.iter(|| {
            let incoming = admission::decode(black_box(REVIEW.as_bytes())).expect("decodes");
            let pod = incoming.metadata(false).expect("pod").expect("present");
            black_box(pod.metadata.annotations.as_ref().map(|a| a.len()))
        })
    });
    // For scale: the same review as kube-core's typed AdmissionReview<DynamicObject>.
    group.bench_function("kube_core_dynamic_object", |b| {
        b.iter(|| {
            let review: kube::core::admission::AdmissionReview<kube::core::DynamicObject> =
                serde_json::from_str(black_box(REVIEW)).expect("decodes");
            black_box(review.request.map(|r| r.uid))
        })
    });
    group.finish();
}

fn decide(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let webhook = webhook(&runtime);
    let dry_run = dry_run_review();
    let probe = runtime
        .block_on(webhook.review(Endpoint::mutate, &dry_run))
        .expect("the fixture is a review");
    assert!(
        String::from_utf8_lossy(&probe).contains("\"patch\""),
        "the dry-run mutate must reach the allocation and patch: {}",
        String::from_utf8_lossy(&probe)
    );
    let mut group = c.benchmark_group("decide");
    group.bench_function("mutate_dry_run", |b| {
        b.to_async(&runtime).iter(|| async {
            black_box(
                webhook
                    .review(Endpoint::mutate, black_box(&dry_run))
                    .await
                    .expect("review"),
            )
        })
    });
    group.bench_function("validate", |b| {
        b.to_async(&runtime).iter(|| async {
            black_box(
                webhook
                    .review(Endpoint::validate, black_box(REVIEW.as_bytes()))
                    .await
                    .expect("review"),
            )
        })
    });
    group.finish();
}

fn encode(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let webhook = webhook(&runtime);
    let incoming = admission::decode(REVIEW.as_bytes()).expect("decodes");
    let pod: MetaOnly = incoming.object(false).expect("pod").expect("present");
    let ips = Allocation {
        ips: vec!["10.0.0.10".parse().unwrap()],
        reasons: Vec::new(),
        token: "0123456789abcdef0123456789abcdef".into(),
    };
    let mut group = c.benchmark_group("encode");
    group.bench_function("patch", |b| {
        b.iter(|| black_box(patch_for(&webhook, black_box(&pod.metadata), &ips)))
    });
    let response = incoming
        .respond()
        .with_patch(patch_for(&webhook, &pod.metadata, &ips));
    group.bench_function("response_review_with_patch", |b| {
        b.iter(|| black_box(black_box(&response).to_json()))
    });
    group.finish();
}

criterion_group!(benches, decode, decide, encode);
criterion_main!(benches);
