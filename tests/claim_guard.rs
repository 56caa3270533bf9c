//! The IPClaim guard (`ipclaims.validate.ip-webhook.io`) over HTTPS, in-cluster against
//! `fakeapi.py`: a real claim, bound to a real pod by a replica, judged as the API server would
//! send it for a hand edit, a deletion and the server's own writes.

mod common;

use std::time::Duration;

use common::{TestServer, allocated_ip, apply, create, fakeapi, message, pod};
use fakeapi::{FakeApi, bound_claim, persist_pod};
use ip_webhook_ledger::crd::IPClaim;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::{Value, json};

const OWN: &str = "system:serviceaccount:ip-webhook-system:ip-webhook";
const FORCE_HINT: &str = "kubectl annotate ipclaim 10.97.70.1 ip-webhook.io/force=true";

fn claim_review(uid: &str, operation: &str, user: &str, object: Value, old: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "ip-webhook.io", "version": "v1alpha1", "kind": "IPClaim"},
            "resource": {"group": "ip-webhook.io", "version": "v1alpha1", "resource": "ipclaims"},
            "name": old["metadata"]["name"].clone(),
            "operation": operation,
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old,
        }
    })
}

async fn judged(server: &TestServer, review: Value) -> (bool, String) {
    let response = server.validate(&review).await;
    (response["allowed"] == json!(true), message(&response))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_edits_of_ipclaims_are_refused_unless_forced_and_own_writes_pass() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let server = fake
        .replica(&[
            "--lease-duration",
            "2s",
            "--lease-renew-interval",
            "200ms",
            "--trusted-username",
            OWN,
        ])
        .await;
    let claims: Api<IPClaim> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let object = pod("default", "web", "web-", Some("10.97.70.1"));
    let response = server.mutate(&create("guard-1", object.clone())).await;
    assert_eq!(allocated_ip(&response), "10.97.70.1");
    let live = persist_pod(&pods, apply(&object, &response), "web-gu4rd").await;
    let bound = bound_claim(&claims, "10.97.70.1", Duration::from_secs(15)).await;
    assert_eq!(bound.spec.pod_uid, live.metadata.uid);
    let bound = serde_json::to_value(&bound).unwrap();

    // a spec edit by a person: refused, naming the claim, the pod and how to force
    let mut edited = bound.clone();
    edited["spec"]["ip"] = json!("10.97.70.9");
    let (allowed, text) = judged(
        &server,
        claim_review(
            "g-1",
            "UPDATE",
            "kubernetes-admin",
            edited.clone(),
            bound.clone(),
        ),
    )
    .await;
    assert!(!allowed, "{text}");
    for part in [
        "IPClaim 10.97.70.1",
        "pod default/web-gu4rd, phase Bound",
        "spec.ip changed",
        "ip-webhook.io/force: \"true\"",
    ] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
    // ... the same edit carrying the force annotation passes
    edited["metadata"]["annotations"] = json!({"ip-webhook.io/force": "true"});
    let (allowed, text) = judged(
        &server,
        claim_review("g-2", "UPDATE", "kubernetes-admin", edited, bound.clone()),
    )
    .await;
    assert!(allowed, "{text}");

    // the server's own writes: a status/finalizer-only change and a spec write (a bind)
    let mut finalizer_off = bound.clone();
    finalizer_off["metadata"]["finalizers"] = json!(null);
    finalizer_off["status"]["phase"] = json!("Released");
    let (allowed, text) = judged(
        &server,
        claim_review("g-3", "UPDATE", OWN, finalizer_off, bound.clone()),
    )
    .await;
    assert!(allowed, "{text}");
    let mut rebound = bound.clone();
    rebound["spec"]["podUid"] = json!("another-uid");
    let (allowed, text) = judged(
        &server,
        claim_review("g-4", "UPDATE", OWN, rebound.clone(), bound.clone()),
    )
    .await;
    assert!(allowed, "{text}");
    // ... which another service account is not
    let (allowed, _) = judged(
        &server,
        claim_review(
            "g-5",
            "UPDATE",
            "system:serviceaccount:default:default",
            rebound,
            bound.clone(),
        ),
    )
    .await;
    assert!(!allowed);

    // a status write by a person (`kubectl patch ipclaim --subresource=status`), setting the
    // phase to Released while the pod runs: refused, naming the field and how to force
    let mut marked_released = bound.clone();
    marked_released["status"]["phase"] = json!("Released");
    let mut status_review = claim_review(
        "g-s1",
        "UPDATE",
        "kubernetes-admin",
        marked_released.clone(),
        bound.clone(),
    );
    status_review["request"]["subResource"] = json!("status");
    let (allowed, text) = judged(&server, status_review.clone()).await;
    assert!(!allowed, "{text}");
    for part in [
        "IPClaim 10.97.70.1",
        "pod default/web-gu4rd, phase Bound",
        "its status is written by ip-webhook only (status.phase changed)",
        "ip-webhook.io/force: \"true\" on the IPClaim first",
    ] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
    // ... the server's own status write passes, and so does one on a claim marked forced
    status_review["request"]["userInfo"]["username"] = json!(OWN);
    let (allowed, text) = judged(&server, status_review.clone()).await;
    assert!(allowed, "{text}");
    let mut forced_old = bound.clone();
    forced_old["metadata"]["annotations"] = json!({"ip-webhook.io/force": "true"});
    let mut forced_new = marked_released;
    forced_new["metadata"]["annotations"] = json!({"ip-webhook.io/force": "true"});
    let mut forced_review =
        claim_review("g-s2", "UPDATE", "kubernetes-admin", forced_new, forced_old);
    forced_review["request"]["subResource"] = json!("status");
    let (allowed, text) = judged(&server, forced_review).await;
    assert!(allowed, "{text}");

    // deleting the Bound claim of the running pod: refused, naming both and how to force
    let (allowed, text) = judged(
        &server,
        claim_review(
            "g-6",
            "DELETE",
            "kubernetes-admin",
            json!(null),
            bound.clone(),
        ),
    )
    .await;
    assert!(!allowed, "{text}");
    for part in [
        "IPClaim 10.97.70.1",
        "pod default/web-gu4rd",
        "which is running",
        FORCE_HINT,
        "kubectl delete ipclaim 10.97.70.1",
    ] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
    // forced: the claim being deleted (oldObject) was annotated first
    let mut annotated = bound.clone();
    annotated["metadata"]["annotations"] = json!({"ip-webhook.io/force": "true"});
    let (allowed, text) = judged(
        &server,
        claim_review("g-7", "DELETE", "kubernetes-admin", json!(null), annotated),
    )
    .await;
    assert!(allowed, "{text}");
    // a Released claim goes freely
    let mut released = bound.clone();
    released["status"]["phase"] = json!("Released");
    let (allowed, text) = judged(
        &server,
        claim_review("g-8", "DELETE", "kubernetes-admin", json!(null), released),
    )
    .await;
    assert!(allowed, "{text}");

    // a malformed object: a clear denial naming the field, not a 400 or a 500
    let (allowed, text) = judged(
        &server,
        claim_review(
            "g-9",
            "UPDATE",
            "kubernetes-admin",
            json!({"metadata": {"name": "10.97.70.1"}, "spec": "nope"}),
            bound.clone(),
        ),
    )
    .await;
    assert!(!allowed);
    assert!(
        text.contains("IPClaim \"10.97.70.1\": request.object is not an IPClaim"),
        "{text}"
    );
}

/// Once the pod is gone (deleted in the API server, seen by the watch), deleting its claim is
/// nobody's loss: admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_pod_is_gone_may_be_deleted() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let server = fake.replica(&[]).await;
    let claim: IPClaim = serde_json::from_value(json!({
        "apiVersion": "ip-webhook.io/v1alpha1", "kind": "IPClaim",
        "metadata": {"name": "10.97.70.2"},
        "spec": {"ip": "10.97.70.2", "namespace": "default", "app": "web", "podName": "web-0",
                 "podUid": "uid-of-a-pod-that-never-ran", "requestUid": "r", "source": "Allocated"},
        "status": {"phase": "Bound"},
    }))
    .unwrap();
    let old = serde_json::to_value(&claim).unwrap();
    let (allowed, text) = judged(
        &server,
        claim_review("g-10", "DELETE", "kubernetes-admin", json!(null), old),
    )
    .await;
    assert!(allowed, "{text}");
    drop(client);
}

/// `ip-webhook release IP --force` in-cluster marks the claim forced before it deletes it, so
/// the guard lets the operator's own deletion of a running pod's claim through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_force_marks_the_claim_so_the_guard_lets_it_go() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let server = fake
        .replica(&["--lease-duration", "2s", "--lease-renew-interval", "200ms"])
        .await;
    let claims: Api<IPClaim> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let object = pod("default", "web", "web-", Some("10.97.71.1"));
    let response = server.mutate(&create("force-1", object.clone())).await;
    persist_pod(&pods, apply(&object, &response), "web-f0rce").await;
    let bound = bound_claim(&claims, "10.97.71.1", Duration::from_secs(15)).await;
    let (allowed, _) = judged(
        &server,
        claim_review(
            "f-1",
            "DELETE",
            "kubernetes-admin",
            json!(null),
            serde_json::to_value(&bound).unwrap(),
        ),
    )
    .await;
    assert!(!allowed, "unmarked, the running pod's claim is kept");

    let ip = "10.97.71.1".parse().unwrap();
    ip_webhook::decisions::claim_guard::mark_forced(&client, &ip)
        .await
        .unwrap();
    let marked = claims.get("10.97.71.1").await.unwrap();
    assert_eq!(
        marked
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("ip-webhook.io/force"))
            .map(String::as_str),
        Some("true")
    );
    let (allowed, text) = judged(
        &server,
        claim_review(
            "f-2",
            "DELETE",
            "kubernetes-admin",
            json!(null),
            serde_json::to_value(&marked).unwrap(),
        ),
    )
    .await;
    assert!(allowed, "{text}");
    // no claim: nothing to mark, no error
    ip_webhook::decisions::claim_guard::mark_forced(&client, &"10.97.71.9".parse().unwrap())
        .await
        .unwrap();
}
