//! Reading the Prometheus text exposition of `/metrics`: the samples of one metric, and the
//! capacity and leader checks built on them.

use super::{Check, Status, check};

/// One sample of the text exposition: name, labels as written, value.
pub(super) fn samples<'t>(text: &'t str, name: &str) -> Vec<(&'t str, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(rest) => {
                    let (labels, value) = rest.split_once('}')?;
                    (labels, value)
                }
                None if rest.starts_with(' ') => ("", rest),
                None => return None,
            };
            Some((labels, value.split_whitespace().next()?.parse().ok()?))
        })
        .collect()
}

pub(super) fn label<'t>(labels: &'t str, key: &str) -> &'t str {
    labels
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().trim_matches('"'))
        .unwrap_or("")
}

/// Pools and apps whose held share is at least `ratio`, and pods refused for exhaustion.
pub(crate) fn capacity_check(metrics: &str, ratio: f64) -> Check {
    let mut near = Vec::new();
    for (labels, value) in samples(metrics, "ip_webhook_pool_utilization_ratio") {
        if value >= ratio {
            near.push(format!(
                "FixedIPPool {} {:.0}% held",
                label(labels, "pool"),
                value * 100.0
            ));
        }
    }
    for (labels, value) in samples(metrics, "ip_webhook_app_utilization_ratio") {
        if value >= ratio {
            near.push(format!(
                "app {}/{} {:.0}% held",
                label(labels, "app_namespace"),
                label(labels, "app"),
                value * 100.0
            ));
        }
    }
    let refused: Vec<String> = samples(metrics, "ip_webhook_exhausted_refusals_total")
        .into_iter()
        .filter(|(_, v)| *v > 0.0)
        .map(|(labels, v)| {
            format!(
                "{}/{} refused {v} pods",
                label(labels, "app_namespace"),
                label(labels, "app")
            )
        })
        .collect();
    if near.is_empty() && refused.is_empty() {
        return check(
            "capacity",
            Status::Ok,
            format!("no pool or app at {:.0}% or more", ratio * 100.0),
        );
    }
    let mut detail = near.join(", ");
    if !refused.is_empty() {
        if !detail.is_empty() {
            detail.push_str("; ");
        }
        detail.push_str(&format!("exhausted since start: {}", refused.join(", ")));
    }
    check("capacity", Status::Warn, detail)
}

/// Whether this replica leads, when the metrics expose the Lease (in-cluster only).
pub(crate) fn leader_check(metrics: &str) -> Check {
    let leases = samples(metrics, "ip_webhook_leader");
    match leases.first() {
        None => check(
            "leader",
            Status::Skip,
            "the metrics expose no Lease (off-cluster or etcd ledger: no leader needed)",
        ),
        Some((labels, value)) if *value >= 1.0 => check(
            "leader",
            Status::Ok,
            format!("this replica holds Lease {}", label(labels, "lease")),
        ),
        Some((labels, _)) => check(
            "leader",
            Status::Warn,
            format!(
                "this replica does not hold Lease {}; check `kubectl get lease {}` names a live replica",
                label(labels, "lease"),
                label(labels, "lease")
            ),
        ),
    }
}
