//! Fixed IPs at the edges, against `fakeapi.py` (this project's in-memory API server):
//! node-loss release (`--node-lost-grace`) and the Kube-OVN reservation keeper
//! (`--kube-ovn-reservation`).

mod common;

use std::time::{Duration, Instant};

use common::node_loss::{delete_pod, make_node, running_pod, set_ready};
use common::resources::{kube_ovn_ippools, kube_ovn_subnets};
use common::{allocated_ip, create, eventually, fakeapi, pod, rbac};
use fakeapi::{FakeApi, bound_claim, create_spec, install_crd_fixture};
use ip_webhook_ledger::crd::{FixedIPPool, IPClaim};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use rbac::assert_rbac_covers;
use serde_json::json;

fn used(group: &str, resource: &str, verb: &str) -> (String, String, String) {
    (group.into(), resource.into(), verb.into())
}

async fn claim_exists(claims: &Api<IPClaim>, ip: &str) -> bool {
    claims.get_opt(ip).await.unwrap().is_some()
}

async fn metric(server: &common::TestServer, name: &str) -> Option<f64> {
    let (_, text) = server.admin_get("/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_pod_on_a_lost_node_is_freed_after_the_grace_and_a_statefulset_pod_is_not() {
    const GRACE: u64 = 2;
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let nodes: Api<Node> = Api::all(client.clone());
    make_node(&nodes, "n-lost").await;
    make_node(&nodes, "n-fine").await;
    let server = fake
        .replica(&[
            "--node-lost-grace",
            &format!("{GRACE}s"),
            "--release-delay",
            "0s",
        ])
        .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<IPClaim> = Api::all(client.clone());
    let web = running_pod(
        &server,
        &pods,
        (
            "web-7d4b9-x2k8p",
            "web",
            "ReplicaSet",
            "n-lost",
            "10.83.0.1",
        ),
    )
    .await;
    let db = running_pod(
        &server,
        &pods,
        ("db-0", "db", "StatefulSet", "n-lost", "10.83.0.2"),
    )
    .await;
    let api = running_pod(
        &server,
        &pods,
        (
            "api-5f6c7-q9w2e",
            "api",
            "ReplicaSet",
            "n-fine",
            "10.83.0.3",
        ),
    )
    .await;
    for ip in ["10.83.0.1", "10.83.0.2", "10.83.0.3"] {
        bound_claim(&claims, ip, Duration::from_secs(15)).await;
    }
    for pod in [&web, &db, &api] {
        delete_pod(&server, &pods, pod).await;
    }
    for pod in [&web, &db, &api] {
        let current = pods
            .get(pod.metadata.name.as_deref().unwrap())
            .await
            .unwrap();
        assert!(current.metadata.deletion_timestamp.is_some(), "{current:?}");
    }

    // Every node Ready: the pods' grace passes and nothing is freed (they are Terminating,
    // not gone), over several passes of the releaser and of the release timer.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for ip in ["10.83.0.1", "10.83.0.2", "10.83.0.3"] {
        assert!(
            claim_exists(&claims, ip).await,
            "{ip} was freed while its node was Ready"
        );
    }
    assert_eq!(
        metric(&server, "ip_webhook_node_lost_releases_total").await,
        Some(0.0)
    );

    // The node stops reporting: only the ReplicaSet pod's IP is freed, after the grace.
    set_ready(&nodes, "n-lost", "Unknown", 0).await;
    let lost_at = Instant::now();
    eventually(
        "the lost Deployment pod's IP to be freed",
        Duration::from_secs(20),
        || {
            let claims = &claims;
            async move { (!claim_exists(claims, "10.83.0.1").await).then_some(()) }
        },
    )
    .await;
    // lastTransitionTime has whole seconds, so the grace may have started up to 1 s earlier.
    assert!(
        lost_at.elapsed() >= Duration::from_secs(GRACE - 1),
        "freed {:?} after the node was lost, before the grace of {GRACE}s",
        lost_at.elapsed()
    );
    // Counted once the release is done (the IPClaim's deletion may be seen a moment earlier).
    eventually("the release to be counted", Duration::from_secs(5), || {
        let server = &server;
        async move {
            (metric(server, "ip_webhook_node_lost_releases_total").await == Some(1.0)).then_some(())
        }
    })
    .await;
    let events: Api<Event> = Api::all(client.clone());
    let told = eventually(
        "the Warning Event on the ReplicaSet",
        Duration::from_secs(10),
        || {
            let events = &events;
            async move {
                common::events::events_with_reason(events, "NodeLostIPReleased")
                    .await
                    .into_iter()
                    .next()
            }
        },
    )
    .await;
    assert_eq!(told.type_.as_deref(), Some("Warning"));
    let regarding = told.regarding.unwrap();
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("ReplicaSet"), Some("web"))
    );
    let note = told.note.unwrap_or_default();
    assert!(
        note.contains("10.83.0.1")
            && note.contains("default/web-7d4b9-x2k8p")
            && note.contains("n-lost"),
        "{note}"
    );

    // The replacement gets the IP, though the old pod object (and its podIP) is still there.
    let replacement = server
        .mutate(&create(
            "create-web-2",
            pod("default", "web", "web-7d4b9-", Some("10.83.0.1")),
        ))
        .await;
    assert_eq!(allocated_ip(&replacement), "10.83.0.1", "{replacement}");
    assert!(pods.get_opt("web-7d4b9-x2k8p").await.unwrap().is_some());

    // The StatefulSet pod on the same node and the pod on the Ready node keep theirs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        claim_exists(&claims, "10.83.0.2").await,
        "the StatefulSet pod's IP was freed"
    );
    assert!(
        claim_exists(&claims, "10.83.0.3").await,
        "the Ready node's pod's IP was freed"
    );
    assert_eq!(
        metric(&server, "ip_webhook_node_lost_releases_total").await,
        Some(1.0)
    );
    let refused = server
        .mutate(&create(
            "create-db-again",
            pod("default", "other", "x-", Some("10.83.0.2")),
        ))
        .await;
    assert_eq!(refused["allowed"], false, "{refused}");

    let rbac = assert_rbac_covers(&fake);
    assert!(rbac.contains(&used("", "nodes", "watch")), "{rbac:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_node_lost_grace_zero_a_lost_nodes_pods_keep_their_ips() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let nodes: Api<Node> = Api::all(client.clone());
    make_node(&nodes, "n-lost").await;
    let server = fake
        .replica(&["--node-lost-grace", "0", "--release-delay", "0s"])
        .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<IPClaim> = Api::all(client.clone());
    let web = running_pod(
        &server,
        &pods,
        (
            "web-7d4b9-x2k8p",
            "web",
            "ReplicaSet",
            "n-lost",
            "10.84.0.1",
        ),
    )
    .await;
    bound_claim(&claims, "10.84.0.1", Duration::from_secs(15)).await;
    delete_pod(&server, &pods, &web).await;
    set_ready(&nodes, "n-lost", "False", 3600).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(claim_exists(&claims, "10.84.0.1").await);
    assert_eq!(
        metric(&server, "ip_webhook_node_lost_releases_total").await,
        Some(0.0)
    );
    let rbac = assert_rbac_covers(&fake);
    assert!(
        !rbac.iter().any(|(_, r, _)| r == "nodes"),
        "nodes watched while off: {rbac:?}"
    );
}

/// Kube-OVN's CRDs (tests/fixtures/kube-ovn-crds.yaml).
/// A Deployment in namespace prod whose pod template lists `ips`.
fn deployment(name: &str, ips: &str) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "prod"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": {
            "metadata": {"labels": {"app": name}, "annotations": {"ip-webhook.io/allocatable-ips": ips}},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }},
    }))
    .unwrap()
}

/// Our IPPools as (name, subnet, ips), by name.
async fn our_pools(pools: &Api<DynamicObject>) -> Vec<(String, String, Vec<String>)> {
    let mut out: Vec<(String, String, Vec<String>)> = pools
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=ip-webhook"))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            let spec = &p.data["spec"];
            (
                p.metadata.name.clone().unwrap(),
                spec["subnet"].as_str().unwrap().to_string(),
                spec["ips"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_string())
                    .collect(),
            )
        })
        .collect();
    out.sort();
    out
}

fn pools_of(expected: &[(&str, &str, &[&str])]) -> Vec<(String, String, Vec<String>)> {
    expected
        .iter()
        .map(|(n, s, ips)| {
            (
                n.to_string(),
                s.to_string(),
                ips.iter().map(|i| i.to_string()).collect(),
            )
        })
        .collect()
}

async fn wait_pools(what: &str, pools: &Api<DynamicObject>, expected: &[(&str, &str, &[&str])]) {
    let expected = pools_of(expected);
    let mut last = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        last = our_pools(pools).await;
        if last == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: expected {expected:?}, have {last:?}");
}

/// A fake API server with our CRDs, Kube-OVN's, and the Subnets `(name, cidrBlock)`.
async fn kube_ovn_cluster(subnets: &[(&str, &str)]) -> (FakeApi, kube::Client) {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    install_crd_fixture(&client, "kube-ovn-crds.yaml").await;
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &kube_ovn_subnets());
    for (name, cidr) in subnets {
        create_spec(&api, &kube_ovn_subnets(), name, json!({"cidrBlock": cidr})).await;
    }
    (fake, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kube_ovn_reservation_follows_lists_and_pools() {
    let (fake, client) =
        kube_ovn_cluster(&[("net1", "10.16.0.0/16"), ("net2", "10.17.0.0/24")]).await;
    let ippools: Api<DynamicObject> = Api::all_with(client.clone(), &kube_ovn_ippools());
    // Someone else's IPPool: Kube-OVN refuses overlapping IPPools, so its IPs are left out.
    create_spec(
        &ippools,
        &kube_ovn_ippools(),
        "theirs",
        json!({"subnet": "net1", "ips": ["10.16.0.12"]}),
    )
    .await;
    let _server = fake
        .replica(&["--cni", "kube-ovn", "--kube-ovn-reservation", "true"])
        .await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "prod"}})).unwrap(),
        )
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "prod");
    deployments
        .create(
            &PostParams::default(),
            &deployment("web", "10.16.0.10-10.16.0.13,10.17.0.5"),
        )
        .await
        .unwrap();
    wait_pools(
        "a pool per Subnet over the list",
        &ippools,
        &[
            (
                "ip-webhook-net1",
                "net1",
                &["10.16.0.10..10.16.0.11", "10.16.0.13"],
            ),
            ("ip-webhook-net2", "net2", &["10.17.0.5"]),
        ],
    )
    .await;
    let theirs = ippools.get("theirs").await.unwrap();
    assert_eq!(
        theirs.data["spec"]["ips"],
        json!(["10.16.0.12"]),
        "theirs left alone"
    );

    // The list changes: IPs removed (net2's pool goes) and added.
    let mut web = deployments.get("web").await.unwrap();
    web.spec
        .as_mut()
        .unwrap()
        .template
        .metadata
        .as_mut()
        .unwrap()
        .annotations
        .as_mut()
        .unwrap()
        .insert(
            "ip-webhook.io/allocatable-ips".into(),
            "10.16.0.10,10.16.0.20".into(),
        );
    deployments
        .replace("web", &PostParams::default(), &web)
        .await
        .unwrap();
    wait_pools(
        "the pools to follow the list",
        &ippools,
        &[("ip-webhook-net1", "net1", &["10.16.0.10", "10.16.0.20"])],
    )
    .await;

    // A FixedIPPool's usable IPs join.
    let fixed: Api<FixedIPPool> = Api::all(client.clone());
    let blue: FixedIPPool = serde_json::from_value(json!({
        "apiVersion": "ip-webhook.io/v1alpha1", "kind": "FixedIPPool",
        "metadata": {"name": "blue"}, "spec": {"cidr": "10.17.0.16/29"},
    }))
    .unwrap();
    fixed.create(&PostParams::default(), &blue).await.unwrap();
    wait_pools(
        "the pool's IPs to be reserved",
        &ippools,
        &[
            ("ip-webhook-net1", "net1", &["10.16.0.10", "10.16.0.20"]),
            ("ip-webhook-net2", "net2", &["10.17.0.17..10.17.0.22"]),
        ],
    )
    .await;

    // All gone: so are our IPPools; theirs stays.
    deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    fixed
        .delete("blue", &DeleteParams::default())
        .await
        .unwrap();
    wait_pools("our pools to be deleted", &ippools, &[]).await;
    assert!(ippools.get_opt("theirs").await.unwrap().is_some());

    let rbac = assert_rbac_covers(&fake);
    for verb in ["watch", "create", "patch", "delete"] {
        assert!(
            rbac.contains(&used("kubeovn.io", "ippools", verb)),
            "{verb}: {rbac:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_kube_ovn_reservation_no_ippool_is_written() {
    let (fake, client) = kube_ovn_cluster(&[("net1", "10.16.0.0/16")]).await;
    let _server = fake.replica(&["--cni", "kube-ovn"]).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "prod"}})).unwrap(),
        )
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "prod");
    deployments
        .create(&PostParams::default(), &deployment("web", "10.16.0.10"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ippools: Api<DynamicObject> = Api::all_with(client.clone(), &kube_ovn_ippools());
    assert!(
        ippools
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let rbac = assert_rbac_covers(&fake);
    assert!(
        !rbac
            .iter()
            .any(|(g, r, _)| g == "kubeovn.io" && r == "ippools"),
        "{rbac:?}"
    );
}
