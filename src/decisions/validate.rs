//! `/validate`: refuse static-IP conflicts and malformed IP annotations on Pods, invalid or
//! overlapping IPPools, conflicting workload templates, and (when switched on) overlapping
//! Kube-OVN Subnets and Calico IPPools.

use std::net::IpAddr;

use crate::decisions::assess::{Answer, Denial, PodAsk, assess};
use crate::decisions::carried::{self, Carried};
use crate::decisions::cni_pools;
use crate::decisions::secondary;
use crate::decisions::workloads;
use crate::decisions::{Candidates, PodView, Webhook};
use ip_webhook_admission::annotations::{
    ALLOCATED_IP_LABEL, CLAIM_TOKEN, STATUS, STATUS_MUTATED, carried_ips, changed_mark,
};
use ip_webhook_admission::{Incoming, Meta, Operation, Response, ReviewError};
use ip_webhook_ipam::allocator::AllocationRequest;
use ip_webhook_ipam::ipset::{IpSet, excerpt};
use ip_webhook_ipam::messages::holder_list;
use ip_webhook_ipam::pools::{Pool, PoolError};
use ip_webhook_ledger::Claim;
use ip_webhook_ledger::claim::{PodIdentity, is_token, new_token};
use ip_webhook_ledger::crd::{self, FixedIPPool};

pub(crate) async fn validate(
    webhook: &Webhook,
    incoming: &Incoming<'_>,
) -> Result<Answer, ReviewError> {
    let request = &incoming.request;
    if request.sub_resource.is_some() {
        return Ok(Answer::from(incoming.respond()));
    }
    let settings = &webhook.settings;
    let (group, kind) = (request.kind.group.as_str(), request.kind.kind.as_str());
    let response = match (group, kind) {
        ("", "Pod") if matches!(request.operation, Operation::Create | Operation::Update) => {
            return validate_pod(webhook, incoming, incoming.respond()).await;
        }
        (crd::GROUP, "FixedIPPool") => validate_pool(webhook, incoming),
        (group, kind) if workloads::is_workload(group, kind) => {
            workloads::review(webhook, incoming)
        }
        (cni_pools::KUBE_OVN_GROUP, "Subnet") if settings.check_kube_ovn_subnets => {
            cni_pools::review_subnet(&webhook.networks, incoming)
        }
        (group, "IPPool")
            if settings.check_calico_pools && cni_pools::CALICO_GROUPS.contains(&group) =>
        {
            cni_pools::review_calico_pool(&webhook.networks, incoming)
        }
        _ => Ok(incoming.respond()),
    };
    response.map(Answer::from)
}

/// How many holders a pool refusal names before "and N more" (the message gives the count).
const POOL_HOLDERS_NAMED: usize = 5;

fn holders_text(claims: &[Claim]) -> String {
    let named: Vec<String> = claims
        .iter()
        .take(POOL_HOLDERS_NAMED)
        .map(|c| format!("{} by {}", c.ip, c.holder()))
        .collect();
    holder_list(&named, claims.len() as u128)
}

/// FixedIPPool CREATE/UPDATE: valid, inside its CIDR, no overlap, no held IP removed.
/// DELETE: refused while any of its IPs is held.
fn validate_pool(webhook: &Webhook, incoming: &Incoming<'_>) -> Result<Response, ReviewError> {
    let response = incoming.respond();
    let operation = incoming.request.operation;
    let old: Option<FixedIPPool> = match operation {
        Operation::Update | Operation::Delete => incoming.object(true).unwrap_or(None),
        _ => None,
    };
    let old_pool = old.as_ref().and_then(|o| Pool::from_resource(o).ok());
    let held_in = |name: &str, usable: Option<&IpSet>| -> Vec<Claim> {
        webhook
            .allocator
            .claims()
            .into_iter()
            .filter(|c| {
                c.pool.as_deref() == Some(name) || usable.is_some_and(|u| u.contains(&c.ip))
            })
            .collect()
    };
    if operation == Operation::Delete {
        let name = incoming.request.name.as_deref().unwrap_or("").to_string();
        let held = held_in(&name, old_pool.as_ref().map(|p| &*p.usable));
        if held.is_empty() {
            return Ok(response);
        }
        return Ok(response.deny(format!(
            "FixedIPPool {name} cannot be deleted while {} of its IPs are held: {}",
            held.len(),
            holders_text(&held)
        )));
    }
    if !matches!(operation, Operation::Create | Operation::Update) {
        return Ok(response);
    }
    let resource: FixedIPPool = match incoming.object(false) {
        Ok(Some(resource)) => resource,
        Ok(None) => return Ok(response.deny("a FixedIPPool review must carry request.object")),
        Err(e) => return Ok(response.deny(format!("FixedIPPool cannot be read: {e}"))),
    };
    let pool = match Pool::from_resource(&resource) {
        Ok(pool) => pool,
        Err(e) => return Ok(response.deny(e.to_string())),
    };
    if let Some(other) = webhook.pools.load().overlapping(&pool) {
        let overlap = PoolError::Overlap {
            pool: pool.name.clone(),
            cidr: pool.cidr.to_string(),
            other: other.name.clone(),
            other_cidr: other.cidr.to_string(),
        };
        return Ok(response.deny(overlap.to_string()));
    }
    if operation == Operation::Update {
        let removed: Vec<Claim> = held_in(&pool.name, old_pool.as_ref().map(|p| &*p.usable))
            .into_iter()
            .filter(|c| !pool.usable.contains(&c.ip))
            .collect();
        if !removed.is_empty() {
            return Ok(response.deny(format!(
                "FixedIPPool {}: the update removes {} IPs that are held: {}",
                pool.name,
                removed.len(),
                holders_text(&removed)
            )));
        }
    }
    Ok(response)
}

/// Pod CREATE/UPDATE: the pod's IP annotations, list and pool are sound, and every IP it
/// carries is its own: its claim (by UID once bound, else by token), or free — then recorded
/// for it now. A CREATE that holds reservations binds them to its UID, so a copy of the pod
/// (same token) is refused from then on.
async fn validate_pod(
    webhook: &Webhook,
    incoming: &Incoming<'_>,
    response: Response,
) -> Result<Answer, ReviewError> {
    let Some(pod) = incoming.metadata(false)? else {
        return Ok(Answer::from(
            response.deny("a Pod review must carry request.object"),
        ));
    };
    let meta = &pod.metadata;
    let view = PodView::new(meta, incoming, &webhook.settings);
    let old = match incoming.request.operation {
        Operation::Update => incoming.metadata(true)?,
        _ => None,
    };
    if let Some(old) = &old
        && holds_claim(webhook, &view, &old.metadata)
    {
        // What names the pod's IP stays as admitted; nothing else of an update concerns us.
        let refusal = update_refusal(&view, &old.metadata, meta)
            .or_else(|| secondary::update_refusal(webhook, &view, &old.metadata));
        let response = match refusal {
            Some(message) => response.deny(message),
            None => response,
        };
        return Ok(Answer {
            app: view.app.is_some().then(|| view.app_key()),
            ips: carried_ips(
                old.metadata.labels.as_ref(),
                old.metadata.annotations.as_ref(),
            ),
            response,
            granted: false,
        });
    }
    let mut answer = Answer {
        app: view.app.is_some().then(|| view.app_key()),
        ips: Vec::new(),
        response,
        granted: false,
    };
    if let Some(old) = &old
        && let Some(refusal) = secondary::unclaimed_update_refusal(webhook, &view, &old.metadata)
    {
        answer.response = answer.response.deny(refusal);
        return Ok(answer);
    }
    match assess(webhook, view) {
        Ok(ask) => {
            answer.ips = ask.carried.clone();
            answer.response = pod_verdict(
                webhook,
                incoming,
                &ask,
                answer.response,
                &mut answer.granted,
            )
            .await;
            if answer.response.allowed
                && let Err(denial) = secondary::validate(webhook, incoming, &ask).await
            {
                answer.response = answer.response.deny(denial.to_string());
            }
        }
        Err(denial) => answer.response = answer.response.deny(denial.to_string()),
    }
    Ok(answer)
}

/// Whether the pod before an update holds a claim: the books hold one for its UID or token,
/// or it carries ip-webhook's marks (marker, claim token), which only a granted admission
/// writes (another replica's claim may not have reached this one's index yet).
fn holds_claim(webhook: &Webhook, view: &PodView<'_>, old: &Meta) -> bool {
    let token = old.annotation(CLAIM_TOKEN).filter(|t| is_token(t));
    let identity = PodIdentity {
        namespace: &view.namespace,
        name: old.name.as_deref().unwrap_or(view.name()),
        uid: old
            .uid
            .as_deref()
            .or(view.meta.uid.as_deref())
            .filter(|u| !u.is_empty()),
        token,
    };
    token.is_some()
        || old.annotation(STATUS) == Some(STATUS_MUTATED)
        || !webhook.allocator.claims_of(&identity).is_empty()
}

/// The refusal of an update that changes what names a claim-holding pod's IP
/// ([`changed_mark`]): the CNI reads its annotation again whenever the pod's sandbox is
/// recreated, and a DELETE and the reconciler read the pod's marks, so a changed value would
/// put the pod on an IP nobody recorded, or free the wrong one.
fn update_refusal(view: &PodView<'_>, old: &Meta, new: &Meta) -> Option<String> {
    let (key, before, after) = changed_mark(
        (old.labels.as_ref(), old.annotations.as_ref()),
        (new.labels.as_ref(), new.annotations.as_ref()),
    )?;
    let what = if key == ALLOCATED_IP_LABEL {
        "label"
    } else {
        "annotation"
    };
    let quoted = |v: Option<&str>| match v {
        Some(v) => format!("{:?}", excerpt(v)),
        None => "absent".to_string(),
    };
    let change = match (before, after) {
        (Some(_), None) => "removed",
        (None, Some(_)) => "added",
        _ => "changed",
    };
    Some(format!(
        "pod {} holds an IP claim, so {what} {key} cannot be {change} (was {}, now {}): it names the pod's IP to the CNI and to ip-webhook; to give the pod another IP, delete the pod and create it again instead",
        view.display(),
        quoted(before),
        quoted(after),
    ))
}

/// The answer for an assessed pod: warnings, conflicts with other pods' claims, and (CREATE,
/// not dry run) the claims recorded or bound for it; `granted` is set when claims were
/// recorded.
async fn pod_verdict(
    webhook: &Webhook,
    incoming: &Incoming<'_>,
    ask: &PodAsk<'_>,
    response: Response,
    granted: &mut bool,
) -> Response {
    let mut response = response;
    for warning in &ask.warnings {
        response = response.warn(warning.clone());
    }
    if ask.carried.is_empty() {
        return response;
    }
    let identity = ask.identity();
    let mine = webhook.allocator.held_by(&identity, &ask.carried);
    let unrecorded = match unrecorded_ips(webhook, incoming, ask, &mine).await {
        Ok(unrecorded) => unrecorded,
        Err(denial) => return response.deny(denial.to_string()),
    };
    if incoming.dry_run() || incoming.request.operation != Operation::Create {
        return response;
    }
    // IPs no claim covers (the pod skipped /mutate: a webhook outage with `Ignore`, a selector
    // gap): recorded for it now as static IPs, so the next pod cannot be given them.
    if !unrecorded.is_empty() {
        if let Err(denial) = record_static(webhook, incoming, ask, &unrecorded).await {
            return response.deny(denial.to_string());
        }
        *granted = true;
    }
    if mine.iter().any(|c| c.pod.uid.is_none())
        && let Err(error) = webhook
            .allocator
            .bind(&identity, &ask.carried, ask.view.is_stateful())
            .await
    {
        return response.deny(
            Denial::Ledger(format!("binding the claims to the pod's UID: {error}")).to_string(),
        );
    }
    response
}

/// The carried IPs no claim of this pod's covers, and free for it; a denial for an IP another
/// pod's claim locks (or the cluster says is in use) ([`carried::unrecorded`]).
async fn unrecorded_ips(
    webhook: &Webhook,
    incoming: &Incoming<'_>,
    ask: &PodAsk<'_>,
    mine: &[Claim],
) -> Result<Vec<IpAddr>, Denial> {
    let ledger_decides = ask.identity().token.is_some()
        && !incoming.dry_run()
        && incoming.request.operation == Operation::Create;
    let pod = ask.view.pod_ref();
    let carried = Carried {
        ips: &ask.carried,
        mine,
        pod: &pod,
        vm: ask.view.vm,
    };
    let pods = webhook.pods.get().map(|p| &**p);
    carried::unrecorded(&webhook.allocator, pods, carried, ledger_decides).await
}

/// Record `unrecorded` for the pod as static IPs under its token (a new one if it has none)
/// and bind them to it.
async fn record_static(
    webhook: &Webhook,
    incoming: &Incoming<'_>,
    ask: &PodAsk<'_>,
    unrecorded: &[IpAddr],
) -> Result<(), Denial> {
    let identity = ask.identity();
    let pod_ref = ask.view.pod_ref();
    let empty = Candidates {
        set: Default::default(),
        pool: None,
    };
    let chosen = ask.candidates.as_ref().unwrap_or(&empty);
    let scope = ask.scope();
    let token = identity
        .token
        .map(str::to_string)
        .unwrap_or_else(|| new_token(incoming.uid()));
    let request = AllocationRequest {
        scope,
        app: ask.view.app.unwrap_or(""),
        pool: chosen.pool.as_deref(),
        pod: pod_ref.clone(),
        request_uid: incoming.uid(),
        token: &token,
        candidates: &chosen.set,
        ordinal: None,
        vm: ask.view.vm,
        migration: ask.view.migration,
        dry_run: false,
    };
    if let Err(error) = webhook.allocator.claim_static(unrecorded, &request).await {
        return Err(Denial::from(error));
    }
    let recorded = PodIdentity {
        token: Some(&token),
        ..identity
    };
    if let Err(error) = webhook
        .allocator
        .bind(&recorded, unrecorded, ask.view.is_stateful())
        .await
    {
        tracing::warn!(%error, pod = %ask.view.display(), "could not bind the recorded claims");
    }
    Ok(())
}
