//! Memory of the pod IP index: bytes per cached pod with 100,000 pods, and the time
//! to build the index and look an IP up.
//!
//! The figure is the growth of the process's resident memory (`/proc/self/statm`) while
//! 100,000 realistic pods are slimmed and indexed, divided by 100,000. It includes the
//! watch's own copy: the index keeps only the slim form (no reflector store beside it), so
//! what is measured is all the watch keeps. Freed temporaries the allocator does not hand
//! back to the system count too, so this is an upper bound. Goal: <= 1024 bytes per pod.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use criterion::{Criterion, criterion_group, criterion_main};
use ip_webhook::cluster::index::{ClusterIps, RunningPod};
use ip_webhook_ipam::foreign::ForeignIps;
use k8s_openapi::api::core::v1::Pod;

const PODS: u32 = 100_000;

/// A pod as the API server sends it (labels, annotations, owner, a container, status): the
/// full object, slimmed the way the watch slims each event.
fn full_pod(i: u32) -> Pod {
    let ip = Ipv4Addr::from(0x0a00_0000 + i);
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("web-7584848b74-{i:05x}"),
            "namespace": format!("team-{}", i % 50),
            "uid": format!("5f2b{i:04x}-9c1e-4d7a-8b3f-{i:012x}"),
            "labels": {"app": "web", "pod-template-hash": "7584848b74"},
            "annotations": {"ip-webhook.io/claim": "0123456789abcdef0123456789abcdef"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7584848b74", "uid": "u", "controller": true}],
        },
        "spec": {
            "nodeName": format!("node-{}.cluster.example.internal", i % 500),
            "containers": [{"name": "web", "image": "registry.example/web:1.2.3", "ports": [{"containerPort": 8080}]}],
        },
        "status": {"phase": "Running", "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}], "hostIP": "192.168.0.1"},
    }))
    .unwrap()
}

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn slim_pods() -> Vec<RunningPod> {
    (0..PODS)
        .map(|i| RunningPod::from_pod(&full_pod(i)).expect("a running pod"))
        .collect()
}

fn memory(c: &mut Criterion) {
    let before = resident_bytes();
    let index = ClusterIps::default();
    index.set_pods(slim_pods());
    let after = resident_bytes();
    assert_eq!(index.pod_count(), PODS as usize);
    let per_pod = after.saturating_sub(before) as f64 / f64::from(PODS);
    println!(
        "pod IP index: {PODS} pods, resident memory grew {} KiB: {per_pod:.0} bytes per cached pod (goal <= 1024)",
        after.saturating_sub(before) / 1024
    );

    let probe = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + PODS / 2));
    c.bench_function("pod_index_lookup_100k", |b| {
        b.iter(|| black_box(index.user(black_box(&probe))))
    });
    let mut group = c.benchmark_group("pod_index_build");
    group.sample_size(10);
    let pods = slim_pods();
    group.bench_function("set_pods_100k", |b| {
        b.iter(|| {
            let index = ClusterIps::default();
            index.set_pods(pods.clone());
            black_box(index.pod_count())
        })
    });
    group.finish();
}

criterion_group!(benches, memory);
criterion_main!(benches);
