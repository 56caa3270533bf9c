//! Pods through the fake API server's admission: replicas registered as the backends of the
//! pod webhooks of the shipped manifest (`deploy/manifests/ip-webhook.yaml`), pods created and
//! deleted with kube-rs as controllers do, and a census of what the cluster holds (live pods
//! sharing an IP, pods without their claim, claims without their pod).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use ip_webhook_ledger::crd::IPClaim;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::TestServer;
use super::fakeapi::FakeApi;

/// The pod webhooks of the shipped manifest (`deploy/manifests/ip-webhook.yaml`), each served
/// by every replica (the replicas behind one Service), in the shape `/fake/admission` takes.
/// `clientConfig.service` becomes one `https://ADDR/PATH` per replica; the caBundle holds every
/// replica's self-signed CA. `matchConditions` are left out: fakeapi.py cannot evaluate CEL
/// (every pod these tests create matches them).
pub fn manifest_pod_webhooks(replicas: &[&TestServer]) -> Vec<Value> {
    routed_pod_webhooks(replicas, replicas)
}

/// [`manifest_pod_webhooks`] with the mutating webhooks served by `mutating` and the
/// validating ones by `validating` (to send each step of an admission to a chosen replica).
pub fn routed_pod_webhooks(mutating: &[&TestServer], validating: &[&TestServer]) -> Vec<Value> {
    let backend = |replica: &&TestServer| Backend {
        addr: replica.launched.running.https_addr,
        ca_pem: std::fs::read_to_string(replica.state_dir.path().join("ca.crt")).unwrap(),
    };
    served_pod_webhooks(
        &mutating.iter().map(backend).collect::<Vec<_>>(),
        &validating.iter().map(backend).collect::<Vec<_>>(),
    )
}

/// One replica behind the webhooks' Service: its HTTPS address and its CA.
pub struct Backend {
    pub addr: std::net::SocketAddr,
    pub ca_pem: String,
}

/// The manifest's pod webhooks served by these backends (replicas in this process or not).
pub fn served_pod_webhooks(mutating: &[Backend], validating: &[Backend]) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/manifests/ip-webhook.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut ca_bundle = String::new();
    let mut seen = BTreeSet::new();
    for replica in mutating.iter().chain(validating) {
        if seen.insert(replica.addr) {
            ca_bundle.push_str(&replica.ca_pem);
        }
    }
    let mut hooks = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let doc: Value = serde::Deserialize::deserialize(document).unwrap();
        let kind = match doc["kind"].as_str() {
            Some("MutatingWebhookConfiguration") => "mutating",
            Some("ValidatingWebhookConfiguration") => "validating",
            _ => continue,
        };
        for webhook in doc["webhooks"].as_array().into_iter().flatten() {
            let rules = webhook["rules"].as_array().cloned().unwrap_or_default();
            let pods = rules.iter().any(|rule| {
                rule["apiGroups"] == json!([""])
                    && rule["resources"]
                        .as_array()
                        .is_some_and(|r| r.contains(&json!("pods")))
            });
            if !pods {
                continue;
            }
            let mut operations: Vec<Value> = Vec::new();
            for rule in &rules {
                for op in rule["operations"].as_array().into_iter().flatten() {
                    if !operations.contains(op) {
                        operations.push(op.clone());
                    }
                }
            }
            let service_path = webhook["clientConfig"]["service"]["path"]
                .as_str()
                .expect("the manifest's webhooks name a service path");
            let backends = if kind == "mutating" {
                mutating
            } else {
                validating
            };
            let urls: Vec<String> = backends
                .iter()
                .map(|r| format!("https://{}{service_path}", r.addr))
                .collect();
            hooks.push(json!({
                "name": webhook["name"],
                "type": kind,
                "urls": urls,
                "operations": operations,
                "failurePolicy": webhook["failurePolicy"],
                "timeoutSeconds": webhook["timeoutSeconds"],
                "namespaceSelector": webhook["namespaceSelector"],
                "objectSelector": webhook["objectSelector"],
                "caBundle": ca_bundle,
            }));
        }
    }
    assert!(
        hooks.len() >= 3,
        "the manifest's pod webhooks (mutate CREATE, mutate DELETE, validate): {hooks:?}"
    );
    hooks
}

/// Register `replicas` as the backends of the manifest's pod webhooks, plus `extra` keys of
/// `/fake/admission` (e.g. `delayAfterValidate`).
pub fn register(fake: &FakeApi, replicas: &[&TestServer], extra: Value) {
    register_webhooks(fake, manifest_pod_webhooks(replicas), extra);
}

/// Configure `/fake/admission` with these webhooks and `extra` keys.
pub fn register_webhooks(fake: &FakeApi, webhooks: Vec<Value>, extra: Value) {
    let mut body = json!({"webhooks": webhooks});
    if let Value::Object(more) = extra {
        body.as_object_mut().unwrap().extend(more);
    }
    fake.control("/fake/admission", body);
}

/// A pod as a ReplicaSet creates it: `generateName`, the app label and list, scheduled on
/// `node-1` (so the fake CNI starts it), a short grace period.
pub fn replicaset_pod(app: &str, ips: &str, grace: u32) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": format!("{app}-7d4b9c-"),
            "labels": {"app": app},
            "annotations": {"ip-webhook.io/allocatable-ips": ips},
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{app}-7d4b9c"),
                "uid": "5e0c1c1e-0000-4000-8000-00000000a001", "controller": true,
            }],
        },
        "spec": {
            "nodeName": "node-1",
            "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "c", "image": "registry.example/app:1"}],
        },
    })
}

/// A pod as a StatefulSet creates it: the fixed name `<set>-<ordinal>`, owned by the set.
pub fn statefulset_pod(set: &str, ordinal: u32, app: &str, ips: &str, grace: u32) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("{set}-{ordinal}"),
            "labels": {"app": app},
            "annotations": {"ip-webhook.io/allocatable-ips": ips},
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "StatefulSet", "name": set,
                "uid": "5e0c1c1e-0000-4000-8000-00000000b001", "controller": true,
            }],
        },
        "spec": {
            "nodeName": "node-1",
            "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "c", "image": "registry.example/app:1"}],
        },
    })
}

/// POST the pod through the API server (and so through its webhooks).
pub async fn create_pod(pods: &Api<Pod>, pod: &Value) -> Result<Pod, kube::Error> {
    let pod: Pod = serde_json::from_value(pod.clone()).unwrap();
    pods.create(&PostParams::default(), &pod).await
}

/// DELETE the pod through the API server with this grace period (None: the pod's own).
pub async fn delete_pod(
    pods: &Api<Pod>,
    name: &str,
    grace: Option<u32>,
) -> Result<(), kube::Error> {
    let params = DeleteParams {
        grace_period_seconds: grace,
        ..DeleteParams::default()
    };
    pods.delete(name, &params).await.map(|_| ())
}

/// The API error's code and message (`None`: not an API error).
pub fn api_error(error: &kube::Error) -> Option<(u16, String)> {
    match error {
        kube::Error::Api(status) => Some((status.code, status.message.clone())),
        _ => None,
    }
}

/// A pod's IPs: `status.podIPs` and the CNI annotations.
fn pod_ips(pod: &Pod) -> (Vec<String>, Vec<String>) {
    let status = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ips.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|p| p.ip)
        .collect();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let mut cni = Vec::new();
    if let Some(list) = annotations.get("cni.projectcalico.org/ipAddrs") {
        cni.extend(serde_json::from_str::<Vec<String>>(list).unwrap_or_default());
    }
    if let Some(list) = annotations.get("ovn.kubernetes.io/ip_address") {
        cni.extend(list.split(',').map(str::to_string));
    }
    (status, cni)
}

/// What one look at the cluster found.
#[derive(Debug, Default, Clone)]
pub struct Census {
    /// (IP, the live pods that carry it): two or more live (not terminating) pods on one IP,
    /// in `status.podIPs` or in the CNI annotation.
    pub duplicates: BTreeSet<(String, Vec<String>)>,
    /// `namespace/name (uid) IP`: a live pod whose IP has no claim bound to its UID.
    pub lost: BTreeSet<String>,
    /// `IP phase pod`: a claim whose pod is in neither pod list (or that has no pod yet), and
    /// that is not `Released` and sticky. Only meaningful once the release timers have run.
    pub leaked: BTreeSet<String>,
    pub live_pods: usize,
    pub claims: usize,
}

impl Census {
    /// Look once: pods, then claims, then pods again. Only a pod live in both pod lists counts
    /// for lost claims (it was live while the claims were read), and only a claim whose pod is
    /// in neither list counts as leaked.
    pub async fn take(client: &Client, namespace: &str) -> Census {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let claims: Api<IPClaim> = Api::all(client.clone());
        let before = pods.list(&ListParams::default()).await.unwrap().items;
        let claim_list = claims.list(&ListParams::default()).await.unwrap().items;
        let after = pods.list(&ListParams::default()).await.unwrap().items;
        let live = |pod: &Pod| pod.metadata.deletion_timestamp.is_none();
        let uid = |pod: &Pod| pod.metadata.uid.clone().unwrap_or_default();
        let mut census = Census {
            claims: claim_list.len(),
            ..Census::default()
        };
        let mut by_ip: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for pod in after.iter().filter(|p| live(p)) {
            census.live_pods += 1;
            let (status, cni) = pod_ips(pod);
            let who = format!(
                "{} ({})",
                pod.metadata.name.clone().unwrap_or_default(),
                uid(pod)
            );
            for ip in status.into_iter().chain(cni) {
                by_ip.entry(ip).or_default().insert(who.clone());
            }
        }
        for (ip, holders) in by_ip {
            if holders.len() > 1 {
                census
                    .duplicates
                    .insert((ip, holders.into_iter().collect()));
            }
        }
        let live_before: BTreeSet<String> = before.iter().filter(|p| live(p)).map(&uid).collect();
        for pod in after
            .iter()
            .filter(|p| live(p) && live_before.contains(&uid(p)))
        {
            let (_, cni) = pod_ips(pod);
            let token = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("ip-webhook.io/claim"))
                .cloned()
                .unwrap_or_default();
            for ip in cni {
                let claim = claim_list.iter().find(|c| c.spec.ip == ip);
                // Bound to the pod's UID; or not bound yet and carrying the pod's claim token.
                let held = claim.is_some_and(|c| match c.spec.pod_uid.as_deref() {
                    Some(bound) => bound == uid(pod),
                    None => !token.is_empty() && c.spec.token == token,
                });
                if !held {
                    let found = claim.map(|c| {
                        let phase = c
                            .status
                            .as_ref()
                            .map(|s| s.phase.as_str())
                            .unwrap_or("Reserved");
                        format!("{phase} for {} ({:?})", c.spec.pod_name, c.spec.pod_uid)
                    });
                    census.lost.insert(format!(
                        "{namespace}/{} ({}) {ip}: claim {}",
                        pod.metadata.name.clone().unwrap_or_default(),
                        uid(pod),
                        found.unwrap_or_else(|| "none".into())
                    ));
                }
            }
        }
        let known: BTreeSet<String> = before.iter().chain(after.iter()).map(&uid).collect();
        for claim in &claim_list {
            let phase = claim
                .status
                .as_ref()
                .map(|s| s.phase.clone())
                .unwrap_or_else(|| "Reserved".into());
            let sticky_released = claim.spec.sticky && phase == "Released";
            let pod_known = claim
                .spec
                .pod_uid
                .as_ref()
                .is_some_and(|u| known.contains(u));
            if !sticky_released && !pod_known {
                census.leaked.insert(format!(
                    "{} {phase} {}/{}",
                    claim.spec.ip, claim.spec.namespace, claim.spec.pod_name
                ));
            }
        }
        census
    }
}
