//! Workload checks: a Deployment, StatefulSet, ReplicaSet, DaemonSet, Job or CronJob whose pod
//! template asks for fixed IPs is checked when it is written, before any pod exists.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::decisions::{PolicyRefusal, Webhook};
use ip_webhook_admission::annotations::{
    ALLOCATABLE_IPS, AnnotationError, IP_POOL, OVN_IP_POOL, parse_ovn_ip_pool,
};
use ip_webhook_admission::{Incoming, Meta, Operation, Response, ReviewError};
use ip_webhook_ipam::ipset::{Family, IpSet, IpSpecError, parse_ip_spec};
use ip_webhook_ledger::Claim;

pub(crate) use super::workload_kinds::{KINDS, WORKLOAD_KINDS, is_workload, workload_kind};
pub(crate) use super::workload_registry::{Listing, WorkloadId, WorkloadRegistry};

#[derive(Debug, Deserialize, Default)]
struct Workload {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    spec: WorkloadSpec,
}

impl Workload {
    /// Its pod template's metadata, where that sits in the object, and how many pods it runs
    /// at once; `None` when it has no pod template.
    fn pod_template(&self) -> Option<(&Meta, &'static str, Option<i64>)> {
        match (&self.spec.template, &self.spec.job_template) {
            (Some(template), _) => Some((
                &template.metadata,
                "spec.template.metadata",
                self.spec.replicas.or(self.spec.parallelism),
            )),
            (None, Some(job)) => job.spec.template.as_ref().map(|template| {
                (
                    &template.metadata,
                    "spec.jobTemplate.spec.template.metadata",
                    job.spec.parallelism,
                )
            }),
            (None, None) => None,
        }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct WorkloadSpec {
    #[serde(default)]
    replicas: Option<i64>,
    #[serde(default)]
    parallelism: Option<i64>,
    #[serde(default)]
    strategy: Option<Strategy>,
    #[serde(default)]
    template: Option<Template>,
    #[serde(default)]
    job_template: Option<Box<JobTemplate>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Strategy {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    rolling_update: Option<RollingUpdate>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RollingUpdate {
    #[serde(default)]
    max_surge: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize, Default)]
struct Template {
    #[serde(default)]
    metadata: Meta,
}

#[derive(Debug, Deserialize, Default)]
struct JobTemplate {
    #[serde(default)]
    spec: WorkloadSpec,
}

/// The listing of a watched workload of `kind`, when its pod template lists fixed IPs (an
/// `allocatable-ips` list or a Kube-OVN `ip_pool` list, not a pool) and no controller owns it (the owner's list counts).
pub(crate) fn listing_of(
    kind: &str,
    object: &kube::api::DynamicObject,
    app_label: &str,
) -> Option<Listing> {
    let meta = &object.metadata;
    if meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller.unwrap_or(false))
    {
        return None;
    }
    let spec: WorkloadSpec = serde_json::from_value(object.data.get("spec")?.clone()).ok()?;
    let template = match (&spec.template, &spec.job_template) {
        (Some(template), _) => &template.metadata,
        (None, Some(job)) => &job.spec.template.as_ref()?.metadata,
        (None, None) => return None,
    };
    if template.annotation(IP_POOL).is_some() {
        return None;
    }
    let set = match template.annotation(ALLOCATABLE_IPS) {
        Some(list) => parse_ip_spec(list).ok()?,
        None => ovn_pool_set(template)?.ok()?,
    };
    let app = template.label(app_label).filter(|a| !a.is_empty())?;
    let namespace = meta.namespace.clone().unwrap_or_default();
    Some(Listing {
        app: format!("{namespace}/{app}"),
        id: WorkloadId {
            kind: kind.to_string(),
            namespace,
            name: meta.name.clone()?,
        },
        set,
    })
}

/// `/validate` for a workload CREATE, UPDATE or DELETE.
pub(crate) fn review(webhook: &Webhook, incoming: &Incoming<'_>) -> Result<Response, ReviewError> {
    let response = incoming.respond();
    let kind = incoming.request.kind.kind.clone();
    // Where watches feed the registry, admissions neither record nor forget.
    let remembers = !incoming.dry_run() && !webhook.workloads.watched();
    if incoming.request.operation == Operation::Delete {
        if remembers {
            forget_deleted(webhook, incoming, kind);
        }
        return Ok(response);
    }
    if !matches!(
        incoming.request.operation,
        Operation::Create | Operation::Update
    ) {
        return Ok(response);
    }
    let Some(workload) = incoming.object::<Workload>(false)? else {
        return Ok(response.deny(format!("a {kind} review must carry request.object")));
    };
    let id = workload_id(incoming, &workload, &kind);
    // A workload that (no longer) asks for fixed IPs lists none: forget any list it had.
    let lists_nothing = |response: Response| {
        if remembers {
            webhook.workloads.forget(&id);
        }
        Ok(response)
    };
    let Some((template, path, replicas)) = workload.pod_template() else {
        return lists_nothing(response);
    };
    let mut response = response;
    let marks = (template.labels.as_ref(), template.annotations.as_ref());
    for warning in ip_webhook_admission::annotations::unknown_key_warnings(marks, path) {
        response = response.warn(warning);
    }
    let list = template.annotation(ALLOCATABLE_IPS);
    let pool_name = template.annotation(IP_POOL);
    let ovn_list = ovn_pool_set(template);
    if list.is_none() && pool_name.is_none() && ovn_list.is_none() {
        return lists_nothing(response);
    }
    let ours = list.is_some() || pool_name.is_some();
    let app = match template_app(webhook, &id, path, template, ours) {
        Ok(Some(app)) => app,
        Ok(None) => return lists_nothing(response),
        Err(refused) => return Ok(response.deny(refused.to_string())),
    };
    let app_key = format!("{}/{app}", id.namespace);
    let (set, from_pool) = match listed_set(webhook, &id, path, template, ovn_list) {
        Ok(Some(listed)) => listed,
        Ok(None) => return Ok(response),
        Err(refused) => return Ok(response.deny(refused.to_string())),
    };

    if from_pool.is_none() {
        let listed = Listed {
            id: &id,
            path,
            set: &set,
            app_key: &app_key,
        };
        if let Some(message) = list_refusal(webhook, &listed, template) {
            return Ok(response.deny(message));
        }
    }

    let cni_warnings = match webhook.cni_check(&set, &id) {
        Ok(warnings) => warnings,
        Err(refused) => return Ok(response.deny(refused.to_string())),
    };
    let capacity = capacity_warnings(&id, &workload.spec, replicas, &set, from_pool.as_deref());
    for warning in cni_warnings.into_iter().chain(capacity) {
        response = response.warn(warning);
    }
    if remembers {
        remember(webhook, &workload, id, app_key, &set, from_pool.is_some());
    }
    Ok(response)
}

/// The app (its label) a template asking for fixed IPs gives them to; `None`: none is
/// needed, as for a Kube-OVN ip_pool alone (`ours` false: no list or pool of ours), which
/// Kube-OVN checks itself; an error when the label is missing.
fn template_app<'t>(
    webhook: &Webhook,
    id: &WorkloadId,
    path: &str,
    template: &'t Meta,
    ours: bool,
) -> Result<Option<&'t str>, Box<TemplateRefusal>> {
    let app_label = &webhook.settings.app_label;
    match template.label(app_label).filter(|a| !a.is_empty()) {
        Some(app) => Ok(Some(app)),
        None if !ours => Ok(None),
        None => Err(Box::new(TemplateRefusal::NoAppLabel {
            id: id.clone(),
            path: path.to_string(),
            app_label: app_label.clone(),
        })),
    }
}

/// A deleted workload lists nothing any more.
fn forget_deleted(webhook: &Webhook, incoming: &Incoming<'_>, kind: String) {
    let name = incoming.request.name.as_deref().unwrap_or("").to_string();
    webhook.workloads.forget(&WorkloadId {
        kind,
        namespace: incoming.namespace().to_string(),
        name,
    });
}

/// Record the list an admitted workload gives its pods; a list from a pool, a workload a
/// controller owns (its owner's list is the one that counts) or one without a name lists
/// nothing of its own.
fn remember(
    webhook: &Webhook,
    workload: &Workload,
    id: WorkloadId,
    app_key: String,
    set: &IpSet,
    from_pool: bool,
) {
    let owned_by_controller = workload
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller.unwrap_or(false));
    if !from_pool && !owned_by_controller && !id.name.is_empty() {
        webhook.workloads.record(id, app_key, set);
    } else {
        webhook.workloads.forget(&id);
    }
}

/// Which workload a review is about: its kind, its namespace (the review's when the object
/// names none) and its name.
fn workload_id(incoming: &Incoming<'_>, workload: &Workload, kind: &str) -> WorkloadId {
    WorkloadId {
        kind: kind.to_string(),
        namespace: workload
            .metadata
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| incoming.namespace().to_string()),
        name: workload
            .metadata
            .name
            .clone()
            .or_else(|| incoming.request.name.as_deref().map(str::to_string))
            .unwrap_or_default(),
    }
}

/// Why a workload's pod template cannot have the fixed IPs it asks for; each names the
/// workload and the template's place in it.
#[derive(Debug, thiserror::Error)]
enum TemplateRefusal {
    #[error(
        "{id}: the pod template asks for fixed IPs but {path}.labels has no {app_label:?} label; ip-webhook needs it (with the namespace) to know which app the IPs belong to"
    )]
    NoAppLabel {
        id: WorkloadId,
        path: String,
        app_label: String,
    },
    #[error("{id}: {path}.annotations[{OVN_IP_POOL}]: {error}")]
    OvnList {
        id: WorkloadId,
        path: String,
        error: AnnotationError,
    },
    #[error("{id}: {path}.annotations sets both {ALLOCATABLE_IPS} and {IP_POOL}; use one")]
    ListAndPool { id: WorkloadId, path: String },
    #[error("{id}: {path}.annotations[{ALLOCATABLE_IPS}]: {error}")]
    List {
        id: WorkloadId,
        path: String,
        error: IpSpecError,
    },
    #[error("{id}: {path}.annotations[{IP_POOL}] names FixedIPPool {pool:?}, which does not exist")]
    NoSuchPool {
        id: WorkloadId,
        path: String,
        pool: String,
    },
    #[error("{id} may not draw from FixedIPPool {pool}: {reason}")]
    PoolRefuses {
        id: WorkloadId,
        pool: String,
        reason: String,
    },
}

/// The IPs a pod template asks for (its list, its FixedIPPool's usable IPs, or a Kube-OVN
/// `ip_pool` list) and the pool's name; `Ok(None)` when it asks for none; `Err` the denial.
fn listed_set(
    webhook: &Webhook,
    id: &WorkloadId,
    path: &str,
    template: &Meta,
    ovn_list: Option<Result<IpSet, AnnotationError>>,
) -> Result<Option<(IpSet, Option<String>)>, Box<TemplateRefusal>> {
    let list = template.annotation(ALLOCATABLE_IPS);
    let pool_name = template.annotation(IP_POOL);
    let at = || (id.clone(), path.to_string());
    Ok(Some(match (list, pool_name) {
        (None, None) => match ovn_list {
            Some(Ok(set)) => (set, None),
            Some(Err(error)) => {
                let (id, path) = at();
                return Err(Box::new(TemplateRefusal::OvnList { id, path, error }));
            }
            None => return Ok(None),
        },
        (Some(_), Some(_)) => {
            let (id, path) = at();
            return Err(Box::new(TemplateRefusal::ListAndPool { id, path }));
        }
        (Some(list), None) => match parse_ip_spec(list) {
            Ok(set) => (set, None),
            Err(error) => {
                let (id, path) = at();
                return Err(Box::new(TemplateRefusal::List { id, path, error }));
            }
        },
        (None, Some(name)) => {
            let pools = webhook.pools.load();
            let Some(pool) = pools.get(name.trim()) else {
                let (id, path) = at();
                let pool = name.to_string();
                return Err(Box::new(TemplateRefusal::NoSuchPool { id, path, pool }));
            };
            if let Some(reason) = pool.refuses(&id.namespace, template.labels.as_ref()) {
                return Err(Box::new(TemplateRefusal::PoolRefuses {
                    id: id.clone(),
                    pool: name.to_string(),
                    reason,
                }));
            }
            ((*pool.usable).clone(), Some(pool.name.clone()))
        }
    }))
}

/// A list of IPs a workload names, and where: for the words of a refusal.
struct Listed<'a> {
    id: &'a WorkloadId,
    path: &'a str,
    set: &'a IpSet,
    app_key: &'a str,
}

/// Why a workload may not list these IPs (the rule pods are held to as well: their lists and
/// their static IPs): a FixedIPPool's policy, another app's list, another app's claim.
fn list_refusal(webhook: &Webhook, listed: &Listed<'_>, template: &Meta) -> Option<String> {
    let Listed {
        id,
        path,
        set,
        app_key,
    } = listed;
    // the annotation the list came from: the list's own, or else Kube-OVN's ip_pool
    let key = if template.annotation(ALLOCATABLE_IPS).is_some() {
        ALLOCATABLE_IPS
    } else {
        OVN_IP_POOL
    };
    match webhook.policy_refusal_for(set, &id.namespace, template.labels.as_ref(), app_key) {
        Some(PolicyRefusal::Pool {
            shared,
            pool,
            reason,
        }) => {
            return Some(format!(
                "{id}: {path}.annotations[{key}] lists {shared} of FixedIPPool {pool}, which this workload may not use: {reason}"
            ));
        }
        Some(PolicyRefusal::App {
            shared,
            workload,
            app,
        }) if held_by_other_app(webhook, set, app_key).is_none() => {
            return Some(format!(
                "{id}: {path}.annotations[{key}] lists {shared}, which {workload} (app {app}) already lists"
            ));
        }
        _ => {}
    }
    held_by_other_app(webhook, set, app_key).map(|claim| {
        format!(
            "{id}: {path}.annotations[{key}] lists {}, which {} of app {} holds",
            claim.ip,
            claim.named_holder(),
            claim.app_key()
        )
    })
}

/// A Kube-OVN `ovn.kubernetes.io/ip_pool` list of IPs in a pod template (a name of a
/// Kube-OVN IPPool is not a list): the IPs Kube-OVN gives the workload's pods, so they are its
/// app's, like an `allocatable-ips` list.
fn ovn_pool_set(template: &Meta) -> Option<Result<IpSet, AnnotationError>> {
    match parse_ovn_ip_pool(template.annotation(OVN_IP_POOL)?) {
        Ok(Some(ips)) => Some(Ok(IpSet::from_ips(ips))),
        Ok(None) => None,
        Err(e) => Some(Err(e)),
    }
}

fn held_by_other_app(webhook: &Webhook, set: &IpSet, app_key: &str) -> Option<Claim> {
    webhook
        .allocator
        .claims()
        .into_iter()
        .find(|claim| set.contains(&claim.ip) && claim.app_key() != app_key)
}

fn capacity_warnings(
    id: &WorkloadId,
    spec: &WorkloadSpec,
    replicas: Option<i64>,
    set: &IpSet,
    pool: Option<&str>,
) -> Vec<String> {
    let per_family: BTreeMap<Family, u128> = set
        .families()
        .into_iter()
        .map(|f| (f, set.family_ranges(f).map(|r| r.len()).sum()))
        .collect();
    let available = per_family.values().copied().min().unwrap_or(0);
    let source = match pool {
        Some(pool) => format!("FixedIPPool {pool} has {available} IPs"),
        None => format!("its list has {available} IPs"),
    };
    let mut warnings = Vec::new();
    if id.kind == "DaemonSet" {
        warnings.push(format!(
            "{id} runs one pod per node and {source}: pods on nodes beyond the first {available} will be refused"
        ));
        return warnings;
    }
    let wanted = replicas.unwrap_or(1).max(0) as u128;
    if wanted > available {
        warnings.push(format!(
            "{id} asks for {wanted} replicas but {source}: pods beyond {available} will be refused"
        ));
    } else if id.kind == "Deployment" {
        let surge = surge(spec, wanted);
        if wanted + surge > available && surge > 0 {
            warnings.push(format!(
                "{id} asks for {wanted} replicas and a rolling update adds up to {surge} more, but {source}: surge pods will be refused until old pods release their IPs (consider maxSurge: 0)"
            ));
        }
    }
    warnings
}

/// A Deployment's maxSurge in pods (default 25%, rounded up), or 0 for Recreate.
fn surge(spec: &WorkloadSpec, replicas: u128) -> u128 {
    let strategy = spec.strategy.as_ref();
    if strategy.and_then(|s| s.kind.as_deref()) == Some("Recreate") {
        return 0;
    }
    let value = strategy
        .and_then(|s| s.rolling_update.as_ref())
        .and_then(|r| r.max_surge.clone())
        .unwrap_or(serde_json::Value::String("25%".into()));
    match value {
        serde_json::Value::Number(n) => n.as_u64().unwrap_or(0) as u128,
        serde_json::Value::String(s) => {
            match s.strip_suffix('%').and_then(|p| p.parse::<u128>().ok()) {
                Some(percent) => (replicas * percent).div_ceil(100),
                None => s.parse().unwrap_or(0),
            }
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one workload-kind table: `KINDS` is its `(group, kind)` column, and each kind's
    /// pointers find the template and the count where its API puts them.
    #[test]
    fn the_workload_kind_table() {
        assert_eq!(KINDS.len(), WORKLOAD_KINDS.len());
        for (pair, workload) in KINDS.iter().zip(&WORKLOAD_KINDS) {
            assert_eq!(*pair, (workload.group, workload.kind));
            assert_eq!(workload_kind(workload.group, workload.kind), Some(workload));
        }
        assert!(!is_workload("", "Deployment") && !is_workload("apps", "Pod"));
        let cronjob = workload_kind("batch", "CronJob").unwrap();
        let spec = serde_json::json!({"jobTemplate": {"spec": {"parallelism": 3, "template": {"metadata": {"name": "t"}}}}});
        assert_eq!(spec.pointer(cronjob.count), Some(&serde_json::json!(3)));
        assert_eq!(
            spec.pointer(cronjob.template).unwrap()["metadata"]["name"],
            "t"
        );
        assert_eq!(cronjob.pod_owner, "Job");
        let sets: Vec<&str> = WORKLOAD_KINDS
            .iter()
            .filter(|w| w.ordinal)
            .map(|w| w.kind)
            .collect();
        assert_eq!(sets, ["StatefulSet"]);
    }

    fn object(json: serde_json::Value) -> kube::api::DynamicObject {
        serde_json::from_value(json).unwrap()
    }

    fn deployment(name: &str, annotations: serde_json::Value, owned: bool) -> serde_json::Value {
        let owners = if owned {
            serde_json::json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "u", "controller": true}])
        } else {
            serde_json::json!([])
        };
        serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "prod", "ownerReferences": owners},
            "spec": {"template": {"metadata": {"labels": {"app": name}, "annotations": annotations}}},
        })
    }

    #[test]
    fn a_watched_workload_keeps_only_its_list_app_and_identity() {
        let listed = object(deployment(
            "legacy",
            serde_json::json!({ALLOCATABLE_IPS: "10.98.3.1-10.98.3.3"}),
            false,
        ));
        let listing = listing_of("Deployment", &listed, "app").unwrap();
        assert_eq!(listing.id.to_string(), "Deployment prod/legacy");
        assert_eq!(listing.app, "prod/legacy");
        assert_eq!(listing.set.to_string(), "10.98.3.1-10.98.3.3");
        let owned = object(deployment(
            "rs",
            serde_json::json!({ALLOCATABLE_IPS: "10.98.3.1"}),
            true,
        ));
        assert!(listing_of("ReplicaSet", &owned, "app").is_none());
        let pool = object(deployment("p", serde_json::json!({IP_POOL: "blue"}), false));
        assert!(listing_of("Deployment", &pool, "app").is_none());
        let cronjob = object(serde_json::json!({
            "metadata": {"name": "c", "namespace": "prod"},
            "spec": {"jobTemplate": {"spec": {"template": {"metadata": {
                "labels": {"app": "c"}, "annotations": {ALLOCATABLE_IPS: "10.98.5.1"}}}}}},
        }));
        assert_eq!(
            listing_of("CronJob", &cronjob, "app")
                .unwrap()
                .set
                .to_string(),
            "10.98.5.1"
        );

        let registry = WorkloadRegistry::default();
        registry.replace_kind("Deployment", vec![listing]);
        let other = parse_ip_spec("10.98.3.2").unwrap();
        let (shared, id, app) = registry.other_app_listing(&other, "prod/other").unwrap();
        assert_eq!(
            (shared.as_str(), app.as_str()),
            ("10.98.3.2", "prod/legacy")
        );
        assert_eq!(id.name, "legacy");
        // A relist of another kind leaves Deployments alone; a relist of Deployments replaces them.
        registry.replace_kind("StatefulSet", Vec::new());
        assert_eq!(registry.len(), 1);
        registry.replace_kind("Deployment", Vec::new());
        assert!(registry.other_app_listing(&other, "prod/other").is_none());
    }
}
