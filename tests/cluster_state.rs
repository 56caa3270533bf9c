//! Conflicts judged from the cluster's state, the same on every replica: three
//! replicas against `fakeapi.py`, with pods, Kube-OVN `IP` objects and Deployments created
//! directly in the API server (never admitted by any replica).

mod common;

use std::time::{Duration, Instant};

use common::resources::kube_ovn_ips;
use common::{TestServer, allocated_ip, create, eventually, fakeapi, message, pod};
use fakeapi::{FakeApi, wait_ready};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// A pod another IPAM runs: created in the API server, then given `status.podIP(s)`.
async fn foreign_pod(client: &Client, namespace: &str, name: &str, ip: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let object: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "legacy"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &object).await.unwrap();
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})),
    )
    .await
    .unwrap();
}

/// A pod asking for `ip` as a static IP (Kube-OVN's annotation).
fn static_pod(name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "default", "labels": {"app": name},
            "annotations": {"ovn.kubernetes.io/ip_address": ip},
        },
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    })
}

async fn three_replicas(fake: &FakeApi, extra: &[&str]) -> Vec<TestServer> {
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(fake.replica(extra).await);
    }
    replicas
}

fn ovn_ip_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "ips.kubeovn.io"},
        "spec": {
            "group": "kubeovn.io",
            "scope": "Cluster",
            "names": {"kind": "IP", "plural": "ips", "singular": "ip", "listKind": "IPList"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            }],
        },
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_pods_ip_and_a_kube_ovn_ip_object_are_refused_by_every_replica() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    foreign_pod(&client, "default", "legacy-0", "10.98.0.5").await;
    let replicas = three_replicas(&fake, &["--cni", "kube-ovn"]).await;

    for (n, replica) in replicas.iter().enumerate() {
        let response = replica
            .mutate(&create(&format!("s-{n}"), static_pod("x", "10.98.0.5")))
            .await;
        assert_eq!(response["allowed"], false, "replica {n}: {response}");
        assert_eq!(
            message(&response),
            "static IP 10.98.0.5 requested by default/x is already used by pod default/legacy-0",
            "replica {n}"
        );
        // /validate refuses it too (a pod that skipped /mutate).
        let response = replica
            .validate(&create(&format!("v-{n}"), static_pod("x", "10.98.0.5")))
            .await;
        assert_eq!(response["allowed"], false, "replica {n}: {response}");
        assert!(message(&response).contains("already used by pod default/legacy-0"));
    }
    // An app whose list starts at that IP is handed the next one.
    let response = replicas[1]
        .mutate(&create(
            "a-1",
            pod("default", "web", "web-", Some("10.98.0.5-10.98.0.7")),
        ))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(allocated_ip(&response), "10.98.0.6");
    // A free IP no pod uses is still granted as a static IP.
    let response = replicas[2]
        .mutate(&create("s-free", static_pod("y", "10.98.0.9")))
        .await;
    assert_eq!(response["allowed"], true, "{response}");

    // Kube-OVN installed after the replicas started: its IP objects are picked up.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &ovn_ip_crd())
        .await
        .unwrap();
    let ips: Api<DynamicObject> = Api::all_with(client.clone(), &kube_ovn_ips());
    let object = DynamicObject::new("static-7584848b74-fw9dm.default", &kube_ovn_ips()).data(
        json!({"spec": {"podName": "static-7584848b74-fw9dm", "namespace": "default", "ipAddress": "10.98.2.7", "v4IpAddress": "10.98.2.7"}}),
    );
    eventually(
        "the ips.kubeovn.io CRD to be served",
        Duration::from_secs(10),
        || {
            let (ips, object) = (&ips, &object);
            async move { ips.create(&PostParams::default(), object).await.ok() }
        },
    )
    .await;
    for (n, replica) in replicas.iter().enumerate() {
        let text = eventually(
            "the Kube-OVN IP object to be known",
            Duration::from_secs(60),
            || {
                let review = create(&format!("o-{n}"), static_pod("x", "10.98.2.7"));
                async move {
                    let response = replica.mutate(&review).await;
                    (response["allowed"] == false).then(|| message(&response))
                }
            },
        )
        .await;
        assert_eq!(
            text,
            "static IP 10.98.2.7 requested by default/x is already used by pod default/static-7584848b74-fw9dm (Kube-OVN IP static-7584848b74-fw9dm.default)",
            "replica {n}"
        );
    }
    // The metrics count what the indexes hold.
    let (code, metrics) = replicas[0].admin_get("/metrics").await;
    assert_eq!(code, 200);
    assert!(
        metrics.contains("ip_webhook_cache_objects{kind=\"pod\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("ip_webhook_cache_objects{kind=\"kube-ovn-ip\"} 1"),
        "{metrics}"
    );
}

/// A review of a Deployment in namespace prod listing `ips`.
fn deployment_review(name: &str, ips: &str) -> Value {
    common::object_review(
        &format!("deploy-{name}"),
        ("apps", "v1", "Deployment"),
        "CREATE",
        Some(deployment(name, ips)),
        None,
    )
}

fn deployment(name: &str, ips: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "prod"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": {"ip-webhook.io/allocatable-ips": ips}},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
        },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_no_replica_admitted_is_a_conflict_for_every_replica_and_after_a_restart() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let prod: Namespace = serde_json::from_value(json!({"metadata": {"name": "prod"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &prod)
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "prod");
    let legacy: Deployment =
        serde_json::from_value(deployment("legacy", "10.98.3.1-10.98.3.3")).unwrap();
    deployments
        .create(&PostParams::default(), &legacy)
        .await
        .unwrap();
    let mut replicas = three_replicas(&fake, &[]).await;
    let expected = "Deployment prod/other: spec.template.metadata.annotations[ip-webhook.io/allocatable-ips] lists 10.98.3.2, which Deployment prod/legacy (app prod/legacy) already lists";
    for (n, replica) in replicas.iter().enumerate() {
        let response = replica
            .validate(&deployment_review("other", "10.98.3.2"))
            .await;
        assert_eq!(response["allowed"], false, "replica {n}: {response}");
        assert_eq!(message(&response), expected, "replica {n}");
    }
    // A list that overlaps nothing is admitted, and (not created) is not remembered.
    let response = replicas[0]
        .validate(&deployment_review("fresh", "10.98.4.1"))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    let response = replicas[1]
        .validate(&deployment_review("fresh2", "10.98.4.1"))
        .await;
    assert_eq!(response["allowed"], true, "{response}");

    let first = replicas.remove(0);
    first.launched.shutdown().await;
    let restarted = fake.replica(&[]).await;
    let response = restarted
        .validate(&deployment_review("other", "10.98.3.2"))
        .await;
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(message(&response), expected);

    // Deleted in the API server: every replica forgets it.
    deployments
        .delete("legacy", &Default::default())
        .await
        .unwrap();
    for replica in replicas.iter().chain([&restarted]) {
        eventually(
            "the deleted Deployment to be forgotten",
            Duration::from_secs(20),
            || async {
                let response = replica
                    .validate(&deployment_review("other", "10.98.3.2"))
                    .await;
                (response["allowed"] == true).then_some(())
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_the_pod_ip_and_workload_indexes() {
    let fake = FakeApi::start();
    fake.install_crds().await;
    // Listing Deployments fails until cleared: the workload index cannot sync.
    fake.control(
        "/fake/fail",
        json!({"method": "GET", "path": "^/apis/apps/v1/deployments$", "code": 500, "count": 1_000_000}),
    );
    let kubeconfig = fake.kubeconfig();
    let server = TestServer::start_with(|c| common::kubernetes_ledger(c, &kubeconfig)).await;
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        let (code, body) = server.admin_get("/readyz").await;
        assert_eq!(code, 503, "ready before the workload index synced: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fake.control("/fake/fail", json!({"clear": true}));
    wait_ready(&server).await;
}

/// Two pods another IPAM runs on one IP (seen only in `status.podIPs`): a Warning Event
/// `DuplicateIP` on each and `ip_webhook_duplicate_ips`; once the newer one goes, the IP is
/// still refused for the older one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_running_on_one_ip_are_a_duplicate_and_the_survivor_keeps_it_used() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let replica = fake
        .replica(&["--lease-duration", "2s", "--lease-renew-interval", "200ms"])
        .await;
    foreign_pod(&client, "default", "legacy-0", "10.98.7.5").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    foreign_pod(&client, "default", "legacy-1", "10.98.7.5").await;

    let events = Api::namespaced(client.clone(), "default");
    let warned = common::events::events_on(&events, "DuplicateIP", 2).await;
    let note = warned[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("IP 10.98.7.5 is carried by 2 live pods: default/legacy-0, default/legacy-1 (the oldest, default/legacy-0, keeps it"),
        "{note}"
    );
    let (_, exposition) = replica.admin_get("/metrics").await;
    assert!(
        exposition.contains("ip_webhook_duplicate_ips 1\n"),
        "{exposition}"
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.delete("legacy-1", &Default::default()).await.unwrap();
    eventually(
        "the duplicate to clear",
        Duration::from_secs(20),
        || async {
            let (_, exposition) = replica.admin_get("/metrics").await;
            exposition
                .contains("ip_webhook_duplicate_ips 0\n")
                .then_some(())
        },
    )
    .await;
    let response = replica
        .mutate(&create("s-1", static_pod("x", "10.98.7.5")))
        .await;
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(
        message(&response),
        "static IP 10.98.7.5 requested by default/x is already used by pod default/legacy-0"
    );
}
