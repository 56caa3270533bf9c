//! A pod's way through the API server as the webhooks see it: `/mutate`, the patch applied,
//! the name and UID generated, `/validate`; and the DELETE review sent when a deletion starts.

use serde_json::{Value, json};

use super::{HttpsClient, TestServer, apply, create, message, review};

/// What sends reviews: a server in this process, or a client of a server process.
pub trait Reviewer {
    fn reviewer(&self) -> &HttpsClient;
}

impl Reviewer for TestServer {
    fn reviewer(&self) -> &HttpsClient {
        &self.client
    }
}

impl Reviewer for HttpsClient {
    fn reviewer(&self) -> &HttpsClient {
        self
    }
}

/// What the API server made of a Pod CREATE: the stored pod, or the denial message.
pub async fn admit(server: &impl Reviewer, pod: Value) -> Result<Value, String> {
    let uid = next_uid("mutate");
    let mutated = server.reviewer().mutate(&create(&uid, pod.clone())).await;
    if mutated["allowed"] != true {
        return Err(message(&mutated));
    }
    let mut stored = if mutated["patch"].is_string() {
        apply(&pod, &mutated)
    } else {
        pod
    };
    // rest.BeforeCreate: the name from generateName, and the UID
    if stored["metadata"]["name"].as_str().unwrap_or("").is_empty() {
        let prefix = stored["metadata"]["generateName"]
            .as_str()
            .unwrap_or("")
            .to_string();
        stored["metadata"]["name"] = json!(format!("{prefix}{}", &next_uid("")[..5]));
    }
    stored["metadata"]["uid"] = json!(next_uid("pod"));
    let validated = server
        .reviewer()
        .validate(&create(&next_uid("validate"), stored.clone()))
        .await;
    if validated["allowed"] != true {
        return Err(message(&validated));
    }
    Ok(stored)
}

/// `/mutate` only: the create then failed in a later admission step (quota, another webhook).
pub async fn mutate_only(server: &impl Reviewer, pod: Value) -> Value {
    server
        .reviewer()
        .mutate(&create(&next_uid("mutate"), pod))
        .await
}

/// The DELETE review the API server sends when a pod's deletion starts.
pub fn delete(pod: &Value, grace: Option<i64>, dry_run: bool) -> Value {
    let mut review = review(
        "v1",
        &next_uid("delete"),
        "DELETE",
        None,
        Some(pod.clone()),
        dry_run,
    );
    review["request"]["name"] = pod["metadata"]["name"].clone();
    if let Some(grace) = grace {
        review["request"]["options"] = json!({
            "kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", "gracePeriodSeconds": grace
        });
    }
    review
}

pub fn next_uid(what: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!(
        "{what}{:05x}-{}",
        NEXT.fetch_add(1, Ordering::Relaxed),
        std::process::id()
    )
}
