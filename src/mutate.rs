//! `/mutate`: give a Pod its fixed IP on CREATE, release it on DELETE.

use std::net::IpAddr;

use crate::admission::{Incoming, MetadataPatch, Operation, Response, ReviewError};
use crate::allocator::{AllocError, AllocationRequest, Reason};
use crate::annotations::{ALLOCATED_IP_LABEL, STATUS, STATUS_MUTATED, static_ips};
use crate::ipset::{IpSet, ip_from_label_value, ip_label_value};
use crate::metrics::{AllocationOutcome, AppLabels};
use crate::webhook::{Candidates, PodView, Webhook};

pub async fn mutate(webhook: &Webhook, incoming: &Incoming<'_>) -> Result<Response, ReviewError> {
    let response = incoming.respond();
    let request = &incoming.request;
    if request.kind.kind != "Pod"
        || !request.kind.group.is_empty()
        || request.sub_resource.is_some()
    {
        return Ok(response);
    }
    match request.operation {
        Operation::Create => create(webhook, incoming, response).await,
        Operation::Delete => delete(webhook, incoming, response).await,
        _ => Ok(response),
    }
}

async fn create(
    webhook: &Webhook,
    incoming: &Incoming<'_>,
    response: Response,
) -> Result<Response, ReviewError> {
    let Some(pod) = incoming.metadata(false)? else {
        return Ok(response.deny("a Pod CREATE review must carry request.object"));
    };
    let meta = &pod.metadata;
    if meta.annotation(STATUS) == Some(STATUS_MUTATED) {
        return Ok(response);
    }
    let view = PodView::new(meta, incoming, &webhook.settings);
    let statics = match static_ips(meta.annotations.as_ref()) {
        Ok(statics) => statics,
        Err(message) => return Ok(response.deny(format!("pod {}: {message}", view.display()))),
    };
    let candidates = match webhook.candidates(&view) {
        Ok(candidates) => candidates,
        Err(message) => return Ok(refuse(webhook, response, message)),
    };
    if candidates.is_none() && statics.is_empty() {
        return Ok(response);
    }
    if candidates.is_some() && view.app.is_none() {
        let message = no_app_label(&view, &webhook.settings.app_label);
        return Ok(refuse(webhook, response, message));
    }
    let empty = Candidates {
        set: Default::default(),
        pool: None,
    };
    let chosen = candidates.as_ref().unwrap_or(&empty);
    let scope = view.scope(chosen);
    let static_set = IpSet::from_ips(statics.iter().flat_map(|(_, ips)| ips.iter().copied()));
    let checked = if statics.is_empty() {
        &chosen.set
    } else {
        &static_set
    };
    // warnings are /validate's to give; here only a hard "no" matters
    if let Err(message) = webhook.cni_check(checked, &scope) {
        return Ok(refuse(webhook, response, message));
    }
    let request = AllocationRequest {
        scope: &scope,
        app: view.app.unwrap_or(""),
        pool: chosen.pool.as_deref(),
        pod: view.pod_ref(),
        request_uid: incoming.uid(),
        candidates: &chosen.set,
        ordinal: view.statefulset_ordinal(),
        dry_run: incoming.dry_run(),
    };

    if !statics.is_empty() {
        let mut ips: Vec<IpAddr> = statics
            .iter()
            .flat_map(|(_, ips)| ips.iter().copied())
            .collect();
        ips.sort();
        ips.dedup();
        if let Some(candidates) = &candidates
            && let Some(outside) = ips.iter().find(|ip| !candidates.set.contains(ip))
        {
            return Ok(refuse(
                webhook,
                response,
                outside_list(&view, outside, &scope),
            ));
        }
        return Ok(match webhook.allocator.claim_static(&ips, &request).await {
            Ok(()) => {
                webhook
                    .metrics
                    .allocation(AllocationOutcome::static_recorded);
                response
            }
            Err(error) => alloc_failure(webhook, response, error),
        });
    }

    match webhook.allocator.allocate(&request).await {
        Ok(allocation) => {
            let outcome = if request.dry_run {
                AllocationOutcome::dry_run
            } else if allocation.reasons.contains(&Reason::SameRequest) {
                AllocationOutcome::reused
            } else {
                AllocationOutcome::allocated
            };
            webhook.metrics.allocation(outcome);
            if !request.dry_run {
                record_app_gauges(webhook, &view, chosen);
            }
            tracing::debug!(uid = incoming.uid(), pod = %view.display(), ips = ?allocation.ips, reasons = ?allocation.reasons, "allocated");
            Ok(response.with_patch(patch_for(webhook, meta, &allocation.ips)))
        }
        Err(error) => Ok(alloc_failure(webhook, response, error)),
    }
}

/// The JSON patch that hands `ips` to the CNI and marks the pod as done.
pub fn patch_for(webhook: &Webhook, meta: &crate::admission::Meta, ips: &[IpAddr]) -> Vec<u8> {
    let cni = webhook.settings.cni;
    let has_annotations = meta.annotations.is_some();
    let mut patch = MetadataPatch::default();
    patch.add(
        "annotations",
        has_annotations,
        cni.annotation(),
        &cni.format(ips),
    );
    patch.add("annotations", has_annotations, STATUS, STATUS_MUTATED);
    patch.add(
        "labels",
        meta.labels.is_some(),
        ALLOCATED_IP_LABEL,
        &ip_label_value(&ips[0]),
    );
    patch.to_json()
}

fn record_app_gauges(webhook: &Webhook, view: &PodView<'_>, candidates: &Candidates) {
    let app = view.app.unwrap_or("").to_string();
    let held = webhook.allocator.held_by_app(&view.namespace, &app);
    let total = u64::try_from(candidates.set.len()).unwrap_or(u64::MAX);
    let labels = AppLabels {
        namespace: view.namespace.clone(),
        app,
    };
    webhook
        .metrics
        .app_held
        .get_or_create(&labels)
        .set(held as i64);
    webhook
        .metrics
        .app_free
        .get_or_create(&labels)
        .set(total.saturating_sub(held).min(i64::MAX as u64) as i64);
}

fn refuse(webhook: &Webhook, response: Response, message: String) -> Response {
    webhook.metrics.allocation(AllocationOutcome::refused);
    response.deny(message)
}

fn alloc_failure(webhook: &Webhook, response: Response, error: AllocError) -> Response {
    let (outcome, message) = match error {
        AllocError::Exhausted(message) => (AllocationOutcome::exhausted, message),
        AllocError::Conflict(message) => (AllocationOutcome::conflict, message),
        other => (
            AllocationOutcome::error,
            format!(
                "ip-webhook could not record the IP claim, so the pod is not admitted (retry): {other}"
            ),
        ),
    };
    webhook.metrics.allocation(outcome);
    response.deny(message)
}

pub fn no_app_label(view: &PodView<'_>, app_label: &str) -> String {
    format!(
        "pod {} asks for fixed IPs but has no {app_label:?} label; ip-webhook needs it (with the namespace) to know which app the IPs belong to",
        view.display()
    )
}

pub fn outside_list(view: &PodView<'_>, ip: &IpAddr, scope: &str) -> String {
    format!(
        "static IP {ip} requested by {} is not one of the IPs of {scope}",
        view.display()
    )
}

async fn delete(
    webhook: &Webhook,
    incoming: &Incoming<'_>,
    response: Response,
) -> Result<Response, ReviewError> {
    if incoming.dry_run() {
        return Ok(response);
    }
    let Some(pod) = incoming.metadata(true)? else {
        return Ok(response);
    };
    let meta = &pod.metadata;
    let view = PodView::new(meta, incoming, &webhook.settings);
    let mut ips: Vec<IpAddr> = meta
        .label(ALLOCATED_IP_LABEL)
        .and_then(ip_from_label_value)
        .into_iter()
        .collect();
    if let Ok(statics) = static_ips(meta.annotations.as_ref()) {
        ips.extend(statics.into_iter().flat_map(|(_, ips)| ips));
    }
    ips.sort();
    ips.dedup();
    if ips.is_empty() {
        return Ok(response);
    }
    let name = match view.name() {
        "" => incoming.request.name.as_deref().unwrap_or(""),
        name => name,
    };
    match webhook
        .allocator
        .release_pod(&view.namespace, name, view.meta.uid.as_deref(), &ips)
        .await
    {
        Ok(released) => {
            webhook.metrics.releases.inc_by(released.len() as u64);
            if !released.is_empty() {
                tracing::info!(pod = %format!("{}/{name}", view.namespace), ips = ?released, "released");
            }
        }
        // A DELETE is never blocked on our books; the reconciler (in-cluster) catches up.
        Err(error) => tracing::warn!(%error, pod = name, "could not release the pod's claims"),
    }
    Ok(response)
}
