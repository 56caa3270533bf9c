//! Pods on nodes that go away, as the API server shows them: nodes and their Ready condition,
//! admitted pods held Terminating by a finalizer (a dead node's kubelet never confirms).

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::api_order::Reviewer;
use super::{allocated_ip, apply, create, pod};

/// An RFC 3339 time `ago` seconds before now, whole seconds (as the API server writes it).
pub fn seconds_ago(ago: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    k8s_openapi::jiff::Timestamp::from_second((now - ago) as i64)
        .unwrap()
        .to_string()
}

/// Set a node's Ready condition (`True`, `False` or `Unknown`), changed `ago` seconds ago.
pub async fn set_ready(nodes: &Api<Node>, name: &str, status: &str, ago: u64) {
    let patch = json!({"status": {"conditions": [
        {"type": "MemoryPressure", "status": "False", "lastTransitionTime": seconds_ago(3600)},
        {"type": "Ready", "status": status, "lastTransitionTime": seconds_ago(ago),
         "reason": "NodeStatusUnknown", "message": "Kubelet stopped posting node status."},
    ]}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

pub async fn make_node(nodes: &Api<Node>, name: &str) {
    let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    set_ready(nodes, name, "True", 3600).await;
}

/// A pod of `owner_kind` on `node`, admitted by the webhook (its list is one IP), persisted
/// with a finalizer (so it stays Terminating, as on a dead node whose kubelet never confirms)
/// and running on its IP. Returns the persisted pod.
pub async fn running_pod(
    server: &impl Reviewer,
    pods: &Api<Pod>,
    (name, app, owner_kind, node, ip): (&str, &str, &str, &str, &str),
) -> Pod {
    let mut object = pod("default", app, "", Some(ip));
    object["metadata"]["name"] = json!(name);
    object["metadata"]["ownerReferences"] = json!([{
        "apiVersion": if owner_kind == "Job" { "batch/v1" } else { "apps/v1" },
        "kind": owner_kind, "name": app, "uid": format!("uid-{app}"), "controller": true,
    }]);
    object["spec"]["nodeName"] = json!(node);
    let response = server
        .reviewer()
        .mutate(&create(&format!("create-{name}"), object.clone()))
        .await;
    assert_eq!(allocated_ip(&response), ip, "{response}");
    let mut persisted = apply(&object, &response);
    persisted["metadata"]["finalizers"] = json!(["test.ip-webhook.io/stuck"]);
    let created = pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(persisted).unwrap(),
        )
        .await
        .unwrap();
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    created
}

/// The pod's deletion as the API server makes it: its DELETE review, then the deletion with
/// a grace of 1 s (the pod stays, Terminating, held by its finalizer).
pub async fn delete_pod(server: &impl Reviewer, pods: &Api<Pod>, pod: &Pod) {
    let review = super::delete_review(pod, 1);
    let answer = server.reviewer().mutate(&review).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    pods.delete(
        pod.metadata.name.as_deref().unwrap(),
        &DeleteParams::default().grace_period(1),
    )
    .await
    .unwrap();
}
