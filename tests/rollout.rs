//! A rollout through three replicas of the real binary sharing IPClaims: the pods of one
//! StatefulSet and one Deployment created at once, as fast as the API server takes them
//! (`ROLLOUT_CONCURRENCY` creates in flight), every one through the manifest's webhooks, each
//! call sent to a replica picked at random. Every create must be admitted, every pod must
//! carry an IP of its own from its app's list, and every claim must end Bound to its pod.
//!
//! In the suite it runs 40 pods; `scripts/bench-rollout.sh` runs it with
//! `ROLLOUT_PODS=1000` against a release build (`IP_WEBHOOK_TEST_BINARY`) and it prints the
//! figures: the webhooks' own latency (each replica's decision lines, `latency_us`), the mean
//! of each ledger call, the IPClaim writes and conflicts, the latency the API server saw, and
//! the time until every claim is Bound.
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use common::BinaryServer;
use common::admission::{self, Backend, Census, create_pod};
use common::fakeapi::FakeApi;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::{Value, json};

const NS: &str = "default";

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v:?}")))
        .unwrap_or(default)
}

/// `count` IPs from `first`, as one range.
fn range(first: Ipv4Addr, count: usize) -> (String, BTreeSet<String>) {
    let start = u32::from(first);
    let ips: BTreeSet<String> = (0..count as u32)
        .map(|i| Ipv4Addr::from(start + i).to_string())
        .collect();
    let last = Ipv4Addr::from(start + count as u32 - 1);
    (format!("{first}-{last}"), ips)
}

/// Each answer's latency (seconds) as the replicas logged it, by webhook: the time from
/// the review's arrival to its answer (`latency_us` of each "admission decision" line).
fn logged_latencies(logs: &[std::path::PathBuf]) -> BTreeMap<String, Vec<f64>> {
    let mut by_webhook: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for log in logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("admission decision")) {
            let field = |name: &str| {
                line.split(&format!(" {name}="))
                    .nth(1)
                    .and_then(|rest| rest.split(' ').next())
                    .map(|v| v.trim_matches('"').to_string())
            };
            if let (Some(webhook), Some(us)) = (field("webhook"), field("latency_us")) {
                let us: f64 = us.parse().unwrap_or_else(|_| panic!("latency in {line}"));
                by_webhook.entry(webhook).or_default().push(us / 1e6);
            }
        }
    }
    for seconds in by_webhook.values_mut() {
        seconds.sort_by(f64::total_cmp);
    }
    by_webhook
}

/// The mean time of each kind of ledger call (the replicas' `ledger_operation_seconds`), to
/// tell the webhook's own work from the API server's writes within its latency.
async fn ledger_means(replicas: &[BinaryServer]) -> BTreeMap<String, (f64, f64)> {
    let mut sums: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for replica in replicas {
        let (_, text) = common::http_get(replica.admin_addr, "/metrics").await;
        for line in text.lines() {
            for (suffix, slot) in [("_sum{", 0), ("_count{", 1)] {
                let prefix = format!("ip_webhook_ledger_operation_seconds{suffix}");
                if let Some(rest) = line.strip_prefix(&prefix) {
                    let (labels, value) = rest.rsplit_once(' ').unwrap();
                    let entry = sums
                        .entry(labels.trim_end_matches('}').to_string())
                        .or_default();
                    let value: f64 = value.parse().unwrap();
                    if slot == 0 {
                        entry.0 += value
                    } else {
                        entry.1 += value
                    }
                }
            }
        }
    }
    sums
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rollout_through_three_replicas_admits_every_pod_on_its_own_ip_and_binds_every_claim() {
    let total = setting("ROLLOUT_PODS", 40).max(2);
    let concurrency = setting("ROLLOUT_CONCURRENCY", 16).max(1);
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let kubeconfig = fake.kubeconfig().display().to_string();
    let mut replicas = Vec::new();
    let mut state_dirs = Vec::new();
    let mut logs = Vec::new();
    for _ in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().display().to_string();
        let log = dir.path().join("serve.log");
        replicas.push(BinaryServer::start_logging(
            &[
                "--ledger",
                "kubernetes",
                "--kubeconfig",
                &kubeconfig,
                "--state-dir",
                &state,
                "--lease-namespace",
                "default",
                "--resync-period",
                "30s",
            ],
            // every decision line, also the answers that grant nothing (DEBUG)
            "info,ip_webhook::decisions::dispatch=debug",
            &log,
        ));
        logs.push(log);
        state_dirs.push(dir);
    }
    for replica in &replicas {
        let addr = replica.admin_addr;
        let deadline = Instant::now() + Duration::from_secs(30);
        while common::http_get(addr, "/readyz").await.0 != 200 {
            assert!(Instant::now() < deadline, "replica {addr} never ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let backends: Vec<Backend> = replicas
        .iter()
        .zip(&state_dirs)
        .map(|(replica, dir)| Backend {
            addr: replica.https_addr,
            ca_pem: std::fs::read_to_string(dir.path().join("ca.crt")).unwrap(),
        })
        .collect();
    admission::register_webhooks(
        &fake,
        admission::served_pod_webhooks(&backends, &backends),
        json!({}),
    );

    // half a StatefulSet `db` (fixed names), half a Deployment's ReplicaSet `web`
    // (generateName), each app's list a tenth larger than its pods
    let sets = total / 2;
    let webs = total - sets;
    let (db_list, db_ips) = range(Ipv4Addr::new(10, 70, 0, 1), sets + sets / 10 + 1);
    let (web_list, web_ips) = range(Ipv4Addr::new(10, 71, 0, 1), webs + webs / 10 + 1);
    let mut objects: Vec<Value> = Vec::new();
    for ordinal in 0..sets {
        let mut pod = admission::statefulset_pod("db", ordinal as u32, "db", &db_list, 1);
        pod["metadata"]["namespace"] = json!(NS);
        objects.push(pod);
    }
    for _ in 0..webs {
        let mut pod = admission::replicaset_pod("web", &web_list, 1);
        pod["metadata"]["namespace"] = json!(NS);
        objects.push(pod);
    }
    // the two apps' pods interleaved, as two controllers working at once
    let (left, right) = objects.split_at(sets);
    let objects: Vec<Value> = left
        .iter()
        .zip(right)
        .flat_map(|(a, b)| [a.clone(), b.clone()])
        .chain(right.iter().skip(left.len()).cloned())
        .collect();

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let started = Instant::now();
    let results: Vec<Result<Pod, String>> = futures::stream::iter(objects)
        .map(|object| {
            let pods = pods.clone();
            async move {
                create_pod(&pods, &object)
                    .await
                    .map_err(|e| format!("{}: {e}", object["metadata"]))
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let created_in = started.elapsed();
    let refused: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        refused.is_empty(),
        "{} of {total} creates failed, the first: {}",
        refused.len(),
        refused[0]
    );

    // every pod on an IP of its own, from its app's list
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for pod in results.iter().filter_map(|r| r.as_ref().ok()) {
        let name = pod.metadata.name.clone().unwrap();
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let listed = annotations
            .get("cni.projectcalico.org/ipAddrs")
            .unwrap_or_else(|| panic!("{name} has no IP: {annotations:?}"));
        let ips: Vec<String> = serde_json::from_str(listed).unwrap();
        assert_eq!(ips.len(), 1, "{name}: {listed}");
        let app_ips = if name.starts_with("db-") {
            &db_ips
        } else {
            &web_ips
        };
        assert!(
            app_ips.contains(&ips[0]),
            "{name}: {} not in its list",
            ips[0]
        );
        if let Some(other) = seen.insert(ips[0].clone(), name.clone()) {
            panic!("{name} and {other} were both given {}", ips[0]);
        }
    }

    // every claim Bound to its pod: no live pod without a claim bound to its UID
    let deadline = Instant::now() + Duration::from_secs(60);
    let census = loop {
        let census = Census::take(&client, NS).await;
        if census.lost.is_empty() && census.claims == total {
            break census;
        }
        assert!(
            Instant::now() < deadline,
            "claims never all bound: {} claims, {} pods without a bound claim, e.g. {:?}",
            census.claims,
            census.lost.len(),
            census.lost.iter().next()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let bound_in = started.elapsed();
    assert!(census.duplicates.is_empty(), "{:?}", census.duplicates);
    assert_eq!(census.live_pods, total);

    // figures: the webhooks' own latency, what the API server saw, the time until Bound
    let log = fake.get_json("/fake/admission");
    let mut seen_by_api: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for call in log["calls"].as_array().into_iter().flatten() {
        if let Some(seconds) = call["seconds"].as_f64() {
            seen_by_api
                .entry(call["type"].as_str().unwrap_or("?").to_string())
                .or_default()
                .push(seconds);
        }
    }
    println!(
        "rollout: {total} pods ({sets} StatefulSet, {webs} Deployment), {concurrency} creates in flight, 3 replicas"
    );
    println!(
        "created in {:.2} s ({:.0} pods/s); every claim Bound {:.2} s after the first create",
        created_in.as_secs_f64(),
        total as f64 / created_in.as_secs_f64(),
        bound_in.as_secs_f64()
    );
    // a replica writes its log lines within its flush period (50 ms) of logging them: the
    // last answers may not be in the files yet
    let flushed = Instant::now() + Duration::from_secs(5);
    let own = loop {
        let own = logged_latencies(&logs);
        let all_logged = ["mutate", "validate"]
            .iter()
            .all(|webhook| own.get(*webhook).map_or(0, Vec::len) >= total);
        if all_logged || Instant::now() > flushed {
            break own;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for (webhook, seconds) in &own {
        println!(
            "{webhook}: {} answers; the webhook's own latency p50 {:.2} ms, p99 {:.2} ms, slowest {:.2} ms",
            seconds.len(),
            percentile(seconds, 0.5) * 1e3,
            percentile(seconds, 0.99) * 1e3,
            seconds.last().copied().unwrap_or(f64::NAN) * 1e3
        );
    }
    for (call, (seconds, count)) in ledger_means(&replicas).await {
        if count > 0.0 {
            println!(
                "ledger {call}: {count} calls, mean {:.2} ms (through the API server)",
                seconds / count * 1e3
            );
        }
    }
    // the replicas' writes of IPClaims, and those the API server refused as conflicts
    let requests = fake.get_json("/fake/requests");
    let mut writes: BTreeMap<(String, i64), usize> = BTreeMap::new();
    for request in requests["requests"].as_array().into_iter().flatten() {
        let path = request["path"].as_str().unwrap_or("");
        let method = request["method"].as_str().unwrap_or("");
        if path.contains("/ipclaims") && method != "GET" {
            let code = request["code"].as_i64().unwrap_or(0);
            *writes.entry((method.to_string(), code)).or_default() += 1;
        }
    }
    println!("IPClaim writes (method, answer): {writes:?}");
    for (kind, mut seconds) in seen_by_api {
        seconds.sort_by(f64::total_cmp);
        println!(
            "{kind} calls as the API server saw them (its own TLS connection per call): {} calls, p50 {:.1} ms, p99 {:.1} ms, slowest {:.1} ms",
            seconds.len(),
            percentile(&seconds, 0.5) * 1e3,
            percentile(&seconds, 0.99) * 1e3,
            seconds.last().copied().unwrap_or(f64::NAN) * 1e3
        );
    }
    // every answer logged: each pod mutated and validated at least once
    for webhook in ["mutate", "validate"] {
        let answers = own.get(webhook).map_or(0, Vec::len);
        assert!(
            answers >= total,
            "{answers} {webhook} answers logged for {total} pods"
        );
    }
}
