//! `/mutate`: give a Pod its fixed IP on CREATE, release it on DELETE.

use std::net::IpAddr;

use crate::admission::{Incoming, MetadataPatch, Operation, OwnerRef, Response, ReviewError};
use crate::allocator::{AllocError, AllocationRequest, Reason};
use crate::annotations::{ALLOCATED_IP_LABEL, STATUS, STATUS_MUTATED, static_ips};
use crate::events::{Assigned, Refused};
use crate::ipset::{IpSet, ip_from_label_value, ip_label_value};
use crate::ledger::PodRef;
use crate::metrics::AllocationOutcome;
use crate::webhook::{Candidates, Noted, PodView, Webhook};

pub async fn mutate(
    webhook: &Webhook,
    incoming: &Incoming<'_>,
    noted: &mut Noted,
) -> Result<Response, ReviewError> {
    let response = incoming.respond();
    let request = &incoming.request;
    if request.kind.kind != "Pod"
        || !request.kind.group.is_empty()
        || request.sub_resource.is_some()
    {
        return Ok(response);
    }
    match request.operation {
        Operation::Create => create(webhook, incoming, response, noted).await,
        Operation::Delete => delete(webhook, incoming, response).await,
        _ => Ok(response),
    }
}

async fn create(
    webhook: &Webhook,
    incoming: &Incoming<'_>,
    response: Response,
    noted: &mut Noted,
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
        Err(message) => {
            return Ok(refuse(
                &refusal(webhook, incoming, &view),
                response,
                message,
            ));
        }
    };
    if candidates.is_none() && statics.is_empty() {
        return Ok(response);
    }
    if candidates.is_some() && view.app.is_none() {
        let message = no_app_label(&view, &webhook.settings.app_label);
        return Ok(refuse(
            &refusal(webhook, incoming, &view),
            response,
            message,
        ));
    }
    let empty = Candidates {
        set: Default::default(),
        pool: None,
    };
    let chosen = candidates.as_ref().unwrap_or(&empty);
    let scope = view.scope(chosen);
    let app_key = view.app_key();
    noted.app = Some(app_key.clone());
    let static_set = IpSet::from_ips(statics.iter().flat_map(|(_, ips)| ips.iter().copied()));
    let checked = if statics.is_empty() {
        &chosen.set
    } else {
        &static_set
    };
    // warnings are /validate's to give; here only a hard "no" matters
    if let Err(message) = webhook.cni_check(checked, &scope) {
        return Ok(refuse(
            &refusal(webhook, incoming, &view),
            response,
            message,
        ));
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
                &refusal(webhook, incoming, &view),
                response,
                outside_list(&view, outside, &scope),
            ));
        }
        return Ok(match webhook.allocator.claim_static(&ips, &request).await {
            Ok(()) => {
                webhook
                    .metrics
                    .allocation(AllocationOutcome::static_recorded);
                noted.ips(&ips);
                webhook.events.assigned(&Assigned {
                    request_uid: incoming.uid(),
                    pod: &request.pod,
                    app: &app_key,
                    ips: &ips,
                    reasons: &[],
                    dry_run: request.dry_run,
                });
                response
            }
            Err(error) => alloc_failure(&refusal(webhook, incoming, &view), response, error),
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
            noted.ips(&allocation.ips);
            tracing::debug!(pod = %view.display(), reasons = ?allocation.reasons, "allocated");
            webhook.events.assigned(&Assigned {
                request_uid: incoming.uid(),
                pod: &request.pod,
                app: &app_key,
                ips: &allocation.ips,
                reasons: &allocation.reasons,
                dry_run: request.dry_run,
            });
            Ok(response.with_patch(patch_for(webhook, meta, &allocation.ips)))
        }
        Err(error) => {
            if matches!(error, AllocError::Exhausted(_)) {
                webhook
                    .metrics
                    .exhausted(&view.namespace, view.app.unwrap_or(""), request.pool);
            }
            Ok(alloc_failure(
                &refusal(webhook, incoming, &view),
                response,
                error,
            ))
        }
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

/// What a refusal is reported with (besides its message and outcome).
struct RefusalContext<'a> {
    webhook: &'a Webhook,
    request_uid: &'a str,
    pod: PodRef,
    app: String,
    owners: &'a [OwnerRef],
    dry_run: bool,
}

fn refusal<'a>(
    webhook: &'a Webhook,
    incoming: &'a Incoming<'_>,
    view: &'a PodView<'_>,
) -> RefusalContext<'a> {
    RefusalContext {
        webhook,
        request_uid: incoming.uid(),
        pod: view.pod_ref(),
        app: view
            .app
            .map(|app| format!("{}/{app}", view.namespace))
            .unwrap_or_default(),
        owners: view.meta.owner_references.as_deref().unwrap_or(&[]),
        dry_run: incoming.dry_run(),
    }
}

fn deny(
    context: &RefusalContext<'_>,
    response: Response,
    outcome: AllocationOutcome,
    message: String,
) -> Response {
    context.webhook.metrics.allocation(outcome.clone());
    context.webhook.events.refused(&Refused {
        request_uid: context.request_uid,
        pod: &context.pod,
        app: &context.app,
        owners: context.owners,
        outcome,
        message: &message,
        dry_run: context.dry_run,
    });
    response.deny(message)
}

fn refuse(context: &RefusalContext<'_>, response: Response, message: String) -> Response {
    deny(context, response, AllocationOutcome::refused, message)
}

fn alloc_failure(context: &RefusalContext<'_>, response: Response, error: AllocError) -> Response {
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
    deny(context, response, outcome, message)
}

/// IPs as `10.0.0.1,fd00::1`, formatted only when a log line is written.
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
