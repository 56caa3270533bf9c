//! `/validate`: refuse static-IP conflicts and malformed IP annotations on Pods.

use std::net::IpAddr;

use crate::admission::{Incoming, MetaOnly, Operation, Response, ReviewError};
use crate::allocator::conflict_message;
use crate::annotations::static_ips;
use crate::mutate::{no_app_label, outside_list};
use crate::webhook::{PodView, Webhook};

pub async fn validate(webhook: &Webhook, incoming: &Incoming<'_>) -> Result<Response, ReviewError> {
    let response = incoming.respond();
    let request = &incoming.request;
    let is_pod = request.kind.kind == "Pod"
        && request.kind.group.is_empty()
        && request.sub_resource.is_none();
    match request.operation {
        Operation::Create | Operation::Update if is_pod => {
            validate_pod(webhook, incoming, response)
        }
        _ => Ok(response),
    }
}

fn validate_pod(
    webhook: &Webhook,
    incoming: &Incoming<'_>,
    response: Response,
) -> Result<Response, ReviewError> {
    let Some(pod) = incoming.object::<MetaOnly>(false)? else {
        return Ok(response.deny("a Pod review must carry request.object"));
    };
    let meta = &pod.metadata;
    let view = PodView::new(meta, incoming, &webhook.settings);
    let statics = match static_ips(meta.annotations.as_ref()) {
        Ok(statics) => statics,
        Err(message) => return Ok(response.deny(format!("pod {}: {message}", view.display()))),
    };
    let candidates = match webhook.candidates(&view) {
        Ok(candidates) => candidates,
        Err(message) => return Ok(response.deny(message)),
    };
    if candidates.is_some() && view.app.is_none() {
        return Ok(response.deny(no_app_label(&view, &webhook.settings.app_label)));
    }
    if let [(first, a), (second, b), ..] = statics.as_slice()
        && a != b
    {
        return Ok(response.deny(format!(
            "pod {}: annotations {first} and {second} name different IPs ({} vs {})",
            view.display(),
            join(a),
            join(b)
        )));
    }
    let pod_ref = view.pod_ref();
    for ip in statics.iter().flat_map(|(_, ips)| ips.iter()) {
        if let Some(candidates) = &candidates
            && !candidates.set.contains(ip)
        {
            return Ok(response.deny(outside_list(&view, ip, &view.scope(candidates))));
        }
        if let Some(holder) = webhook.allocator.holder(ip)
            && !holder
                .pod
                .matches(&view.namespace, view.name(), meta.uid.as_deref())
        {
            return Ok(response.deny(conflict_message(ip, &pod_ref, &holder)));
        }
    }
    Ok(response)
}

fn join(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(|ip| ip.to_string())
        .collect::<Vec<_>>()
        .join(",")
}
