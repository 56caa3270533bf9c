//! `explain`: which IP each replica of a Pod, Deployment or StatefulSet would get, and why —
//! or why it would be refused. Every replica's Pod CREATE goes through the same
//! [`Webhook::review`] as `/mutate`, over a copy of the ledger in memory, so replica N sees
//! replicas 0..N-1 holding their IPs and nothing is recorded for real.

use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::decisions::kubevirt;
use crate::decisions::mutate::{self, PodDecision};
use crate::decisions::validate;
use crate::decisions::workloads;
use crate::decisions::{Settings, Webhook};
use crate::metrics::Metrics;
use ip_webhook_admission::{self as admission, ReviewError};
use ip_webhook_ipam::allocator::{Allocator, Reason};
use ip_webhook_ipam::pools::PoolCatalog;
use ip_webhook_ledger::{Claim, CreateOutcome, Ledger, LedgerError, MemoryLedger};

use networks::network_holdings;
pub(crate) use networks::{NetworkIps, network_sandboxes};

mod networks;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ExplainError {
    #[error("document {index}: {reason}")]
    Document { index: usize, reason: String },
    #[error("the input holds no objects")]
    Empty,
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("the webhook answered HTTP 400 for {what}: {reason}")]
    Review { what: String, reason: String },
}

/// What one replica would get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReplicaOutcome {
    pub(crate) replica: u64,
    /// `namespace/name`, or `namespace/generateName*`.
    pub(crate) pod: String,
    pub(crate) allowed: bool,
    pub(crate) ips: Vec<IpAddr>,
    /// Why each IP was chosen, in the order of `ips`.
    pub(crate) why: Vec<String>,
    /// The replica's pod exists already and holds `ips` (nothing was run for it).
    pub(crate) existing: bool,
    /// The denial message when refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) refused: Option<String>,
    /// The IPs it would get on each secondary network it asks of.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) networks: Vec<NetworkIps>,
}

/// One object of the input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ObjectOutcome {
    /// `Deployment prod/web`.
    pub(crate) object: String,
    /// Warnings (and a denial) the webhook gives the object when it is written: `/validate`'s
    /// workload check, or the unknown-key warnings `/mutate` gives a Pod.
    pub(crate) warnings: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) denied: Option<String>,
    pub(crate) replicas: Vec<ReplicaOutcome>,
}

/// Why, in words.
pub(crate) fn reason_text(reason: Option<&Reason>, ordinal: Option<u64>) -> String {
    match reason {
        Some(Reason::StatefulSetOrdinal) => format!(
            "StatefulSet ordinal {}: entry {} of the list (ascending)",
            ordinal.unwrap_or(0),
            ordinal.unwrap_or(0)
        ),
        Some(Reason::PreviousHolder) => "this pod name held it last".into(),
        Some(Reason::LowestFree) => "lowest free IP of the list".into(),
        Some(Reason::SameRequest) => "same admission request as an earlier answer".into(),
        None => "static IP written on the pod; recorded".into(),
    }
}

/// A webhook deciding over an in-memory copy of `claims` (held and released, so name history
/// counts), with the same settings and pools as the real one.
pub(crate) async fn sandbox(
    claims: Vec<Claim>,
    settings: Settings,
    pools: PoolCatalog,
) -> Result<Webhook, ExplainError> {
    let memory = MemoryLedger::new();
    for claim in claims {
        let ip = claim.ip;
        if let CreateOutcome::AlreadyHeld(_) = memory.create(claim.into()).await? {
            tracing::warn!(%ip, "two held records for one IP in the ledger; explain keeps the first");
        }
    }
    let allocator = Arc::new(Allocator::new(Arc::new(memory)).await?);
    Ok(Webhook::new(
        settings,
        allocator,
        pools,
        Arc::new(Metrics::new()),
    ))
}

#[derive(Debug, Deserialize, Default)]
struct Object {
    #[serde(default, rename = "apiVersion")]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    metadata: Value,
    #[serde(default)]
    spec: Value,
}

/// Split YAML or JSON text (multi-document, `List` objects) into objects.
pub(crate) fn parse_objects(text: &str) -> Result<Vec<Value>, ExplainError> {
    let mut objects = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(document).map_err(|e| ExplainError::Document {
            index,
            reason: e.to_string(),
        })?;
        match value {
            Value::Null => {}
            Value::Object(ref map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
                objects.extend(
                    map.get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                );
            }
            other => objects.push(other),
        }
    }
    if objects.is_empty() {
        return Err(ExplainError::Empty);
    }
    Ok(objects)
}

/// A CREATE review of `object`, sent by `user` when given.
fn review(
    uid: &str,
    kind: (&str, &str, &str),
    namespace: &str,
    name: Option<&str>,
    object: &Value,
    user: Option<&str>,
) -> Vec<u8> {
    let (group, version, kind) = kind;
    let mut request = json!({
        "uid": uid,
        "kind": {"group": group, "version": version, "kind": kind},
        "namespace": namespace,
        "operation": "CREATE",
        "object": object,
        "dryRun": false,
    });
    if let Some(name) = name {
        request["name"] = json!(name);
    }
    if let Some(user) = user {
        request["userInfo"] = json!({"username": user});
    }
    serde_json::to_vec(&json!({
        "apiVersion": ip_webhook_admission::V1,
        "kind": "AdmissionReview",
        "request": request,
    }))
    .expect("a JSON value serializes")
}

/// Explain every object, in order, on one sandbox: later objects see earlier ones' IPs.
/// `replicas` overrides the replica count of workloads (a DaemonSet's is the node count).
pub(crate) async fn explain(
    webhook: &Webhook,
    objects: &[Value],
    default_namespace: &str,
    replicas: Option<u64>,
) -> Result<Vec<ObjectOutcome>, ExplainError> {
    let mut outcomes = Vec::new();
    for (index, value) in objects.iter().enumerate() {
        let object: Object =
            serde_json::from_value(value.clone()).map_err(|e| ExplainError::Document {
                index,
                reason: e.to_string(),
            })?;
        let meta = &object.metadata;
        let name = meta["name"].as_str().unwrap_or("").to_string();
        let namespace = meta["namespace"]
            .as_str()
            .filter(|n| !n.is_empty())
            .unwrap_or(default_namespace)
            .to_string();
        let group = object
            .api_version
            .rsplit_once('/')
            .map(|(g, _)| g)
            .unwrap_or("");
        let version = object.api_version.rsplit('/').next().unwrap_or("v1");
        let label = format!(
            "{} {namespace}/{}",
            object.kind,
            if name.is_empty() {
                meta["generateName"]
                    .as_str()
                    .map(|g| format!("{g}*"))
                    .unwrap_or_default()
            } else {
                name.clone()
            }
        );
        let mut outcome = ObjectOutcome {
            object: label.clone(),
            warnings: Vec::new(),
            denied: None,
            replicas: Vec::new(),
        };
        let target = Target {
            index,
            group,
            version,
            name: &name,
            namespace: &namespace,
            label: &label,
        };
        let (template, count, pods) =
            object_pods(webhook, &object, value, &target, replicas, &mut outcome).await?;
        let existing = existing_pods(webhook, &pods, &template, &namespace);
        for replica in 0..count {
            if let Some(claims) = pods.existing(&existing, replica) {
                outcome
                    .replicas
                    .push(existing_outcome(webhook, replica, claims));
                continue;
            }
            let admitted = replica_outcome(webhook, &pods, &template, replica, &target).await?;
            outcome.replicas.push(admitted);
        }
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// The object an outcome is about: its place in the input, its API group and version, name,
/// namespace, and how the outcome names it (`Deployment prod/web`).
struct Target<'a> {
    index: usize,
    group: &'a str,
    version: &'a str,
    name: &'a str,
    namespace: &'a str,
    label: &'a str,
}

/// The pod template, the number of pods and how they are named, for a Pod or a workload of
/// [`workloads::WORKLOAD_KINDS`] (`replicas` overrides its count); a workload goes through
/// `/validate` first, as when it is written, and its warnings and denial go into `outcome`.
async fn object_pods(
    webhook: &Webhook,
    object: &Object,
    value: &Value,
    target: &Target<'_>,
    replicas: Option<u64>,
    outcome: &mut ObjectOutcome,
) -> Result<(Value, u64, PodNaming), ExplainError> {
    if (target.group, object.kind.as_str()) == ("", "Pod") {
        // The warnings /mutate gives the pod when it is created.
        let meta: admission::Meta =
            serde_json::from_value(object.metadata.clone()).unwrap_or_default();
        let marks = (meta.labels.as_ref(), meta.annotations.as_ref());
        outcome.warnings = admission::annotations::unknown_key_warnings(marks, "metadata");
        return Ok((value.clone(), 1, PodNaming::AsIs));
    }
    if (target.group, object.kind.as_str()) == (kubevirt::GROUP, "VirtualMachine") {
        // one launcher pod runs a VM at a time, made from the VM's template
        let template = object.spec.get("template").cloned().unwrap_or(Value::Null);
        let vm = target.name.to_string();
        return Ok((template, 1, PodNaming::Launcher { vm }));
    }
    let Some(workload) = workloads::workload_kind(target.group, &object.kind) else {
        let kinds: Vec<&str> = workloads::WORKLOAD_KINDS.iter().map(|w| w.kind).collect();
        return Err(ExplainError::Document {
            index: target.index,
            reason: format!(
                "{:?} ({}) is not a Pod, a workload ({}) or a KubeVirt VirtualMachine",
                object.kind,
                object.api_version,
                kinds.join(", ")
            ),
        });
    };
    let body = review(
        &format!("explain-{}", target.index),
        (target.group, target.version, workload.kind),
        target.namespace,
        Some(target.name),
        value,
        None,
    );
    let failed = |e: ReviewError| ExplainError::Review {
        what: target.label.to_string(),
        reason: e.to_string(),
    };
    let incoming = admission::decode(&body).map_err(failed)?;
    let response = validate::validate(webhook, &incoming)
        .await
        .map_err(failed)?
        .response;
    outcome.warnings = response.warnings;
    if !response.allowed {
        outcome.denied = response.message;
    }
    let spec = &object.spec;
    let template = spec
        .pointer(workload.template)
        .cloned()
        .unwrap_or(Value::Null);
    let default_count = spec
        .pointer(workload.count)
        .and_then(Value::as_u64)
        .unwrap_or(1);
    let owner = target.name.to_string();
    let naming = if workload.ordinal {
        PodNaming::Ordinal { owner }
    } else {
        PodNaming::Generated {
            owner_kind: workload.pod_owner.to_string(),
            owner,
        }
    };
    Ok((template, replicas.unwrap_or(default_count), naming))
}

/// A replica whose pod exists already: what it holds, and since when.
fn existing_outcome(webhook: &Webhook, replica: u64, claims: &[Claim]) -> ReplicaOutcome {
    let since = |c: &Claim| match c.release_at {
        Some(at) => format!(
            "already holds it ({:?} since {}; released at {} once the pod is gone)",
            c.phase,
            ip_webhook_ipam::usage::rfc3339(c.created_at),
            ip_webhook_ipam::usage::rfc3339(at.get())
        ),
        None => format!(
            "already holds it ({:?} since {})",
            c.phase,
            ip_webhook_ipam::usage::rfc3339(c.created_at)
        ),
    };
    ReplicaOutcome {
        replica,
        pod: claims[0].holder(),
        allowed: true,
        ips: claims.iter().map(|c| c.ip).collect(),
        why: claims.iter().map(since).collect(),
        existing: true,
        refused: None,
        networks: network_holdings(webhook, &claims[0]),
    }
}

/// Replica `replica`'s Pod CREATE through `/mutate`'s decision, and what it would get.
async fn replica_outcome(
    webhook: &Webhook,
    pods: &PodNaming,
    template: &Value,
    replica: u64,
    target: &Target<'_>,
) -> Result<ReplicaOutcome, ExplainError> {
    let namespace = target.namespace;
    let pod = pods.pod(template, replica, namespace);
    let uid = format!("explain-{}-{replica}", target.index);
    let pod_name = pod["metadata"]["name"].as_str().map(str::to_string);
    // KubeVirt's controller creates a VM's launcher pod
    let user = match pods {
        PodNaming::Launcher { .. } => webhook.settings.kubevirt.controllers.first(),
        _ => None,
    };
    let body = review(
        &uid,
        ("", "v1", "Pod"),
        namespace,
        pod_name.as_deref(),
        &pod,
        user.map(String::as_str),
    );
    let failed = |e: ReviewError| ExplainError::Review {
        what: format!("{} replica {replica}", target.label),
        reason: e.to_string(),
    };
    let incoming = admission::decode(&body).map_err(failed)?;
    let decision = mutate::decide_create(webhook, &incoming)
        .await
        .map_err(failed)?;
    let shown = match (&pod_name, pods) {
        (_, PodNaming::Launcher { vm }) => format!("vm {namespace}/{vm}"),
        (Some(name), _) if !name.is_empty() => format!("{namespace}/{name}"),
        _ => format!(
            "{namespace}/{}*",
            pod["metadata"]["generateName"].as_str().unwrap_or("")
        ),
    };
    let ordinal = matches!(pods, PodNaming::Ordinal { .. }).then_some(replica);
    // the decision line `serve` would log (shown with -v)
    tracing::info!(
        uid = uid.as_str(),
        pod = shown.as_str(),
        app = decision.app().unwrap_or(""),
        ip = ?decision.ips(),
        outcome = if matches!(decision, PodDecision::Denied { .. }) { "denied" } else { "allowed" },
        "admission decision"
    );
    let networks = match &decision {
        PodDecision::Granted { networks, .. } => networks
            .iter()
            .map(|grant| NetworkIps {
                network: grant.network.to_string(),
                ips: grant.ips.clone(),
            })
            .collect(),
        _ => Vec::new(),
    };
    let (allowed, ips, why, refused) = decision_outcome(decision, ordinal);
    Ok(ReplicaOutcome {
        replica,
        pod: shown,
        allowed,
        ips,
        why,
        existing: false,
        refused,
        networks,
    })
}

/// What a replica's decision comes to: allowed, its IPs, why each, the refusal.
fn decision_outcome(
    decision: PodDecision,
    ordinal: Option<u64>,
) -> (bool, Vec<IpAddr>, Vec<String>, Option<String>) {
    match decision {
        PodDecision::Unrelated => (
            true,
            Vec::new(),
            vec![
                "asks for no fixed IP (no ip-webhook.io/allocatable-ips or ip-webhook.io/ip-pool)"
                    .to_string(),
            ],
            None,
        ),
        PodDecision::AlreadyHeld(ips) => {
            let why = vec![
                "already holds it (its claim token and IPs match the ledger)".to_string();
                ips.len()
            ];
            (true, ips, why, None)
        }
        PodDecision::Granted { allocation, .. } => {
            let why = (0..allocation.ips.len())
                .map(|i| reason_text(allocation.reasons.get(i), ordinal))
                .collect();
            (true, allocation.ips, why, None)
        }
        PodDecision::Denied { denial, .. } => {
            (false, Vec::new(), Vec::new(), Some(denial.to_string()))
        }
    }
}

/// The held claims of the object's pods that exist already, one entry per pod (its IPs): for
/// a StatefulSet by ordinal name, for a Pod by its name, for other workloads every pod whose
/// name starts with `owner-`, in IP order.
fn existing_pods(
    webhook: &Webhook,
    naming: &PodNaming,
    template: &Value,
    namespace: &str,
) -> Vec<(String, Vec<Claim>)> {
    let app = template["metadata"]["labels"][webhook.settings.app_label.as_str()]
        .as_str()
        .unwrap_or("");
    let (exact, prefix): (Option<&str>, Option<String>) = match naming {
        PodNaming::AsIs => (template["metadata"]["name"].as_str(), None),
        PodNaming::Ordinal { owner } => (None, Some(format!("{owner}-"))),
        PodNaming::Generated { owner, .. } => (None, Some(format!("{owner}-"))),
        PodNaming::Launcher { .. } => (None, None),
    };
    let vm = match naming {
        PodNaming::Launcher { vm } => Some(vm.as_str()),
        _ => None,
    };
    let mut pods: Vec<(String, Vec<Claim>)> = Vec::new();
    for claim in webhook.allocator.claims() {
        let pod = &claim.pod;
        let name: &str = if pod.name.is_empty() {
            &pod.generate_name
        } else {
            &pod.name
        };
        let belongs = pod.namespace == namespace
            && claim.app == app
            && match (exact, &prefix, vm) {
                (_, _, Some(vm)) => claim.vm.as_deref() == Some(vm),
                (Some(exact), _, _) => !exact.is_empty() && pod.name == exact,
                (None, Some(prefix), _) => name.starts_with(prefix.as_str()),
                (None, None, None) => false,
            };
        if !belongs {
            continue;
        }
        let key = if pod.name.is_empty() {
            claim.request_uid.to_string()
        } else {
            pod.name.to_string()
        };
        match pods.iter_mut().find(|(k, _)| *k == key) {
            Some((_, claims)) => claims.push(claim),
            None => pods.push((key, vec![claim])),
        }
    }
    pods
}

/// How a workload's pods are named.
enum PodNaming {
    AsIs,
    /// `owner-N`, owned by the StatefulSet.
    Ordinal {
        owner: String,
    },
    /// `generateName: owner-`.
    Generated {
        owner_kind: String,
        owner: String,
    },
    /// A KubeVirt VM's launcher pod (`virt-launcher-VM-`), controlled by its VMI, whose claim
    /// is the VM's.
    Launcher {
        vm: String,
    },
}

impl PodNaming {
    /// The claims of replica `replica` if its pod exists already.
    fn existing<'e>(&self, pods: &'e [(String, Vec<Claim>)], replica: u64) -> Option<&'e [Claim]> {
        let found = match self {
            PodNaming::Ordinal { owner } => {
                let name = format!("{owner}-{replica}");
                pods.iter().find(|(key, _)| *key == name)
            }
            PodNaming::AsIs | PodNaming::Launcher { .. } => pods.first(),
            PodNaming::Generated { .. } => pods.get(usize::try_from(replica).ok()?),
        };
        found.map(|(_, claims)| claims.as_slice())
    }

    fn pod(&self, template: &Value, replica: u64, namespace: &str) -> Value {
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": template.get("metadata").cloned().unwrap_or_else(|| json!({})),
            "spec": template.get("spec").cloned().unwrap_or_else(|| json!({})),
        });
        if !pod["metadata"].is_object() {
            pod["metadata"] = json!({});
        }
        let meta = &mut pod["metadata"];
        meta["namespace"] = json!(namespace);
        match self {
            PodNaming::AsIs => {
                if let Some(object) = template.get("metadata") {
                    pod["metadata"] = object.clone();
                    pod["metadata"]["namespace"] = json!(namespace);
                }
            }
            PodNaming::Ordinal { owner } => {
                meta["name"] = json!(format!("{owner}-{replica}"));
                meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": owner, "controller": true}]);
            }
            PodNaming::Generated { owner_kind, owner } => {
                meta["generateName"] = json!(format!("{owner}-"));
                meta["ownerReferences"] =
                    json!([{"kind": owner_kind, "name": owner, "controller": true}]);
            }
            PodNaming::Launcher { vm } => {
                // as kubevirt's pkg/virt-controller/services/template.go writes the pod
                meta["generateName"] = json!(format!("virt-launcher-{vm}-"));
                let (key, value) = kubevirt::LAUNCHER_LABEL;
                if !meta["labels"].is_object() {
                    meta["labels"] = json!({});
                }
                meta["labels"][key] = json!(value);
                meta["labels"]["vm.kubevirt.io/name"] = json!(vm);
                meta["ownerReferences"] = json!([{
                    "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                    "name": vm, "controller": true,
                }]);
            }
        }
        pod
    }
}

/// Text for people: one block per object.
pub(crate) fn to_text(outcomes: &[ObjectOutcome]) -> String {
    let mut out = String::new();
    for (i, outcome) in outcomes.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&outcome.object);
        out.push('\n');
        if let Some(denied) = &outcome.denied {
            out.push_str(&format!("  DENIED when written: {denied}\n"));
        }
        for warning in &outcome.warnings {
            out.push_str(&format!("  warning: {warning}\n"));
        }
        let rows: Vec<Vec<String>> = outcome
            .replicas
            .iter()
            .map(|r| {
                let ips = if r.allowed {
                    if r.ips.is_empty() {
                        "-".to_string()
                    } else {
                        r.ips
                            .iter()
                            .map(IpAddr::to_string)
                            .collect::<Vec<_>>()
                            .join(",")
                    }
                } else {
                    "REFUSED".to_string()
                };
                let mut why = match &r.refused {
                    Some(message) => message.clone(),
                    None => r.why.join("; "),
                };
                for on in &r.networks {
                    let ips: Vec<String> = on.ips.iter().map(IpAddr::to_string).collect();
                    why.push_str(&format!("; on network {}: {}", on.network, ips.join(",")));
                }
                vec![format!("#{}", r.replica), r.pod.clone(), ips, why]
            })
            .collect();
        for line in crate::ops::status::table(&["REPLICA", "POD", "IP", "WHY"], &rows).lines() {
            out.push_str("  ");
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}
