//! `/validate`: refuse static-IP conflicts and malformed IP annotations on Pods, invalid or
//! overlapping IPPools, conflicting workload templates, and (when switched on) overlapping
//! Kube-OVN Subnets and Calico IPPools.

use std::net::IpAddr;

use crate::admission::{Incoming, Operation, Response, ReviewError};
use crate::allocator::conflict_message;
use crate::annotations::static_ips;
use crate::crd::{self, IPPool};
use crate::ipset::IpSet;
use crate::ledger::Claim;
use crate::mutate::{no_app_label, outside_list};
use crate::pools::{Pool, PoolError};
use crate::webhook::{Noted, PodView, Webhook};
use crate::{cni_pools, workloads};

pub async fn validate(
    webhook: &Webhook,
    incoming: &Incoming<'_>,
    noted: &mut Noted,
) -> Result<Response, ReviewError> {
    let request = &incoming.request;
    if request.sub_resource.is_some() {
        return Ok(incoming.respond());
    }
    let settings = &webhook.settings;
    let (group, kind) = (request.kind.group.as_str(), request.kind.kind.as_str());
    match (group, kind) {
        ("", "Pod") if matches!(request.operation, Operation::Create | Operation::Update) => {
            validate_pod(webhook, incoming, incoming.respond(), noted)
        }
        (crd::GROUP, "FixedIPPool") => validate_ippool(webhook, incoming),
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
    }
}

/// How many holders a message names before "and N more".
const HOLDERS_NAMED: usize = 5;

fn holders_text(claims: &[Claim]) -> String {
    let mut text = claims
        .iter()
        .take(HOLDERS_NAMED)
        .map(|c| format!("{} by {}", c.ip, c.pod.display()))
        .collect::<Vec<_>>()
        .join(", ");
    if claims.len() > HOLDERS_NAMED {
        text.push_str(&format!(", and {} more", claims.len() - HOLDERS_NAMED));
    }
    text
}

/// IPPool CREATE/UPDATE: valid, inside its CIDR, no overlap, no held IP removed.
/// DELETE: refused while any of its IPs is held.
fn validate_ippool(webhook: &Webhook, incoming: &Incoming<'_>) -> Result<Response, ReviewError> {
    let response = incoming.respond();
    let operation = incoming.request.operation;
    let old: Option<IPPool> = match operation {
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
    let resource: IPPool = match incoming.object(false) {
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

fn validate_pod(
    webhook: &Webhook,
    incoming: &Incoming<'_>,
    response: Response,
    noted: &mut Noted,
) -> Result<Response, ReviewError> {
    let Some(pod) = incoming.metadata(false)? else {
        return Ok(response.deny("a Pod review must carry request.object"));
    };
    let meta = &pod.metadata;
    let view = PodView::new(meta, incoming, &webhook.settings);
    if view.app.is_some() {
        noted.app = Some(view.app_key());
    }
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
    let mut response = response;
    let static_set = IpSet::from_ips(statics.iter().flat_map(|(_, ips)| ips.iter().copied()));
    let whose = match &candidates {
        Some(candidates) => view.scope(candidates),
        None => format!("pod {}", view.display()),
    };
    for set in [Some(&static_set), candidates.as_ref().map(|c| &*c.set)]
        .into_iter()
        .flatten()
    {
        match webhook.cni_check(set, &whose) {
            Ok(warnings) => {
                for warning in warnings {
                    response = response.warn(warning);
                }
            }
            Err(message) => return Ok(response.deny(message)),
        }
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
