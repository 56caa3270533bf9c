//! Other pods' IPs from Calico's `IPAMBlock`s: with `ipamblocks.crd.projectcalico.org` served
//! (tests/fixtures/cni-crds.yaml), a replica watches whole only the pods carrying our label
//! and learns every other pod's IP from the blocks: an IP a block gives a pod is refused as a
//! static IP and skipped by allocation, a block changed later is picked up, and a pod running
//! on its app's list IP without a claim is still adopted. With `--pod-ips-from pods`, or no
//! block at all (Calico's IPAM gives no pod an IP), every pod is watched whole.

mod common;

use std::time::Duration;

use common::fakeapi::create_listed_deployment;
use common::{allocated_ip, create, eventually, fakeapi, message, pod};
use fakeapi::{FakeApi, bound_claim, install_crd_fixture};
use ip_webhook_ledger::crd::IPClaim;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

fn ipam_blocks() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("crd.projectcalico.org", "v1", "IPAMBlock"),
        "ipamblocks",
    )
}

/// The `spec` of a /26 block at `cidr` allocating each `(ordinal, namespace, pod)`.
fn block_spec(cidr: &str, owners: &[(usize, &str, &str)]) -> Value {
    let mut allocations = vec![Value::Null; 64];
    let mut attributes = Vec::new();
    for (n, (ordinal, namespace, pod)) in owners.iter().enumerate() {
        allocations[*ordinal] = json!(n);
        attributes.push(json!({
            "handle_id": format!("k8s-pod-network.{n:064x}"),
            "secondary": {"namespace": namespace, "node": "node-1", "pod": pod,
                          "timestamp": "2026-01-01 00:00:00 +0000 UTC"},
        }));
    }
    json!({"cidr": cidr, "affinity": "host:node-1", "allocations": allocations,
           "attributes": attributes, "unallocated": [], "strictAffinity": false})
}

async fn put_block(client: &Client, name: &str, spec: Value) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ipam_blocks());
    let object = DynamicObject::new(name, &ipam_blocks()).data(json!({ "spec": spec }));
    eventually(
        &format!("IPAMBlock {name} to be written"),
        Duration::from_secs(10),
        || {
            let (api, object) = (&api, &object);
            async move {
                match api.get_opt(name).await.ok()? {
                    None => api.create(&PostParams::default(), object).await.ok(),
                    Some(_) => api
                        .patch(name, &PatchParams::default(), &Patch::Merge(object))
                        .await
                        .ok(),
                }
            }
        },
    )
    .await;
}

/// A pod created in the API server (no webhook saw it), running on `ip`.
async fn running_pod(client: &Client, namespace: &str, name: &str, app: &str, ip: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let object: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": app}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &object).await.unwrap();
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})),
    )
    .await
    .unwrap();
    created
}

/// A pod asking for `ip` as a static IP (Calico's annotation).
fn static_pod(name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "default", "labels": {"app": name},
            "annotations": {"cni.projectcalico.org/ipAddrs": format!("[\"{ip}\"]")},
        },
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    })
}

/// The queries of the replica's pod lists and watches so far.
fn pod_queries(fake: &FakeApi) -> Vec<String> {
    let log = fake.get_json("/fake/requests");
    log["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["path"] == "/api/v1/pods" && r["ua"] != "in-cluster-test")
        .map(|r| r["query"].as_str().unwrap_or("").to_string())
        .collect()
}

async fn cluster_with_blocks() -> (FakeApi, Client) {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    install_crd_fixture(&client, "cni-crds.yaml").await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "legacy"}})).unwrap(),
        )
        .await
        .unwrap();
    // a pod Calico gave 10.98.0.5, as its block says, and one the blocks do not know
    put_block(
        &client,
        "10-98-0-0-26",
        block_spec("10.98.0.0/26", &[(5, "default", "legacy-0")]),
    )
    .await;
    running_pod(&client, "default", "legacy-0", "legacy", "10.98.0.5").await;
    running_pod(&client, "default", "other-ipam-0", "legacy", "10.98.0.9").await;
    (fake, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_pods_ips_come_from_calicos_blocks_and_only_our_pods_are_watched_whole() {
    let (fake, client) = cluster_with_blocks().await;
    // the app's list, in a Deployment no replica admitted, and a pod of it running on one of
    // its IPs, known to the replica only through Calico's block
    create_listed_deployment(&client, "legacy", "web", "10.99.0.1-10.99.0.3").await;
    let web = running_pod(&client, "legacy", "web-old-1", "web", "10.99.0.2").await;
    put_block(
        &client,
        "10-99-0-0-26",
        block_spec("10.99.0.0/26", &[(2, "legacy", "web-old-1")]),
    )
    .await;

    let server = fake
        .replica(&["--lease-duration", "2s", "--lease-renew-interval", "200ms"])
        .await;
    let queries = pod_queries(&fake);
    assert!(!queries.is_empty());
    assert!(
        queries
            .iter()
            .all(|q| q.contains("labelSelector=ip-webhook.io%2Fallocated-ip")),
        "every pod list and watch selects our pods: {queries:?}"
    );

    let response = server
        .mutate(&create("s-1", static_pod("x", "10.98.0.5")))
        .await;
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(
        message(&response),
        "static IP 10.98.0.5 requested by default/x is already used by pod default/legacy-0"
    );
    let response = server
        .mutate(&create(
            "a-1",
            pod("default", "api", "api-", Some("10.98.0.5-10.98.0.7")),
        ))
        .await;
    assert_eq!(allocated_ip(&response), "10.98.0.6", "{response}");

    // Calico gives 10.98.0.7 to another pod later: the changed block is read
    put_block(
        &client,
        "10-98-0-0-26",
        block_spec(
            "10.98.0.0/26",
            &[(5, "default", "legacy-0"), (7, "default", "late-0")],
        ),
    )
    .await;
    let text = eventually(
        "the block's change to be seen",
        Duration::from_secs(20),
        || {
            let review = create("s-2", static_pod("y", "10.98.0.7"));
            let server = &server;
            async move {
                let response = server.mutate(&review).await;
                (response["allowed"] == false).then(|| message(&response))
            }
        },
    )
    .await;
    assert_eq!(
        text,
        "static IP 10.98.0.7 requested by default/y is already used by pod default/late-0"
    );

    // list adoption reads the pod behind the block's listed IP
    let claims: Api<IPClaim> = Api::all(client.clone());
    let adopted = bound_claim(&claims, "10.99.0.2", Duration::from_secs(20)).await;
    assert_eq!(adopted.spec.pod_uid, web.metadata.uid);
    assert_eq!(adopted.spec.pod_name, "web-old-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_pod_ips_from_pods_every_pod_is_watched_whole() {
    let (fake, _client) = cluster_with_blocks().await;
    let server = fake.replica(&["--pod-ips-from", "pods"]).await;
    let queries = pod_queries(&fake);
    assert!(
        queries.iter().any(|q| !q.contains("labelSelector")),
        "the pods are watched without a selector: {queries:?}"
    );
    // the pod the blocks do not know is seen running on its IP
    let response = server
        .mutate(&create("s-1", static_pod("x", "10.98.0.9")))
        .await;
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(
        message(&response),
        "static IP 10.98.0.9 requested by default/x is already used by pod default/other-ipam-0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_crd_but_no_block_every_pod_is_watched_whole() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    install_crd_fixture(&client, "cni-crds.yaml").await;
    running_pod(&client, "default", "other-ipam-0", "legacy", "10.98.0.9").await;
    let server = fake.replica(&[]).await;
    let queries = pod_queries(&fake);
    assert!(
        queries.iter().any(|q| !q.contains("labelSelector")),
        "the pods are watched without a selector: {queries:?}"
    );
    let response = server
        .mutate(&create("s-1", static_pod("x", "10.98.0.9")))
        .await;
    assert_eq!(
        message(&response),
        "static IP 10.98.0.9 requested by default/x is already used by pod default/other-ipam-0"
    );
}
