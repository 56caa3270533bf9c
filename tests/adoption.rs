//! Adoption: a pod that already runs on an IP of its own app's list when
//! ip-webhook is installed (created directly in the API server, its `status.podIPs` set as the
//! kubelet would) gets a Bound claim from the reconciler, with an `IPAdopted` Event and
//! `ip_webhook_adoptions_total{reason="app_list"}`. Another app's pod on a list IP, and a pod
//! carrying only our label, are never adopted.

mod common;

use std::time::Duration;

use common::fakeapi::create_listed_deployment;
use common::{allocated_ip, create, eventually, fakeapi, pod};
use fakeapi::{FakeApi, bound_claim};
use ip_webhook_ledger::crd::IPClaim;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// A pod created in the API server (no webhook saw it); with `ip`, given `status.podIPs`.
async fn running_pod(client: &Client, name: &str, labels: Value, ip: Option<&str>) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "legacy");
    let object: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "legacy", "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &object).await.unwrap();
    if let Some(ip) = ip {
        pods.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}),
            ),
        )
        .await
        .unwrap();
    }
    created
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_running_on_its_apps_ip_before_install_is_adopted_and_others_are_not() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "legacy"}})).unwrap(),
        )
        .await
        .unwrap();
    // the app's list, in a Deployment no replica admitted
    create_listed_deployment(&client, "legacy", "web", "10.99.0.1-10.99.0.3").await;
    let web = running_pod(
        &client,
        "web-old-1",
        json!({"app": "web"}),
        Some("10.99.0.2"),
    )
    .await;
    // another app of the namespace runs on an IP of web's list: a conflict, not web's
    running_pod(
        &client,
        "other-1",
        json!({"app": "other"}),
        Some("10.99.0.3"),
    )
    .await;
    // only our label, not running on anything
    running_pod(
        &client,
        "squat",
        json!({"app": "web", "ip-webhook.io/allocated-ip": "10.99.0.1"}),
        None,
    )
    .await;

    let server = fake
        .replica(&["--lease-duration", "2s", "--lease-renew-interval", "200ms"])
        .await;
    let claims: Api<IPClaim> = Api::all(client.clone());
    let adopted = bound_claim(&claims, "10.99.0.2", Duration::from_secs(20)).await;
    assert_eq!(adopted.spec.pod_uid, web.metadata.uid);
    assert_eq!(
        (
            adopted.spec.namespace.as_str(),
            adopted.spec.app.as_str(),
            adopted.spec.pod_name.as_str()
        ),
        ("legacy", "web", "web-old-1")
    );
    let events: Api<Event> = Api::all(client.clone());
    let event = eventually("an IPAdopted Event", Duration::from_secs(10), || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("IPAdopted"))
    })
    .await;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("pod legacy/web-old-1 runs on IP 10.99.0.2")
            && note.contains("its app legacy/web"),
        "{note}"
    );
    let (_, exposition) = server.admin_get("/metrics").await;
    assert!(
        exposition.contains("ip_webhook_adoptions_total{reason=\"app_list\"} 1\n"),
        "{exposition}"
    );

    // more passes later: the other app's pod and the bare label have no claim
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(claims.get_opt("10.99.0.3").await.unwrap().is_none());
    assert!(claims.get_opt("10.99.0.1").await.unwrap().is_none());
    let (_, exposition) = server.admin_get("/metrics").await;
    assert!(
        exposition.contains("ip_webhook_adoptions_total{reason=\"app_list\"} 1\n"),
        "{exposition}"
    );
    // and a new pod of the app gets the one IP nobody uses: not the adopted one, not the one
    // the other app's pod runs on
    let response = server
        .mutate(&create(
            "adopt-1",
            pod("legacy", "web", "web-", Some("10.99.0.1-10.99.0.3")),
        ))
        .await;
    assert_eq!(allocated_ip(&response), "10.99.0.1", "{response}");
}
