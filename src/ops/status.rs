//! `status`: who holds which IP, per pool and per app, from the claims of any ledger; the
//! counts are [`ip_webhook_ipam::usage::Report`]'s, this is their text, and in-cluster the IPs two
//! live pods carry.

use crate::cluster::reconcile::Duplicate;
use ip_webhook_ipam::usage::{AppStatus, DuplicateStatus, Holder, Report};

/// A duplicate the reconciler found, as `status` reports it: the pods first, the one that
/// keeps the IP first of all.
pub(crate) fn duplicate_status(found: &Duplicate) -> DuplicateStatus {
    let pods: Vec<String> = found
        .pods
        .iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    DuplicateStatus {
        ip: found.ip,
        keeps: pods.first().cloned().unwrap_or_default(),
        apps: found
            .pods
            .iter()
            .map(|p| format!("{}/{}", p.namespace, p.app))
            .collect(),
        pods,
    }
}

/// Every IP two or more live pods carry in the cluster behind `client`, found as the
/// reconciler finds them (the pods' `allocated-ip` label and CNI annotations): the metadata of
/// all pods, page by page, each page cut down to the pods that carry an IP of ours.
pub(crate) async fn cluster_duplicates(
    client: &kube::Client,
    app_label: &str,
) -> Result<Vec<DuplicateStatus>, kube::Error> {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::all(client.clone());
    let mut infos = crate::cluster::PodMap::default();
    crate::cluster::list_pages(
        |params| {
            let pods = pods.clone();
            async move { pods.list_metadata(&params).await }
        },
        |page| {
            for pod in page {
                if let Some(info) = crate::cluster::claiming_pod(&pod.metadata, app_label) {
                    infos.insert(info.uid.clone(), info);
                }
            }
        },
    )
    .await?;
    Ok(crate::cluster::reconcile::duplicates(&infos)
        .iter()
        .map(duplicate_status)
        .collect())
}

/// `status`'s text of the allocator's [`Report`]: the counts are the allocator's, their text
/// the operator command's.
pub(crate) trait StatusTable {
    /// The kubectl-style text: a pool table, an app table and a holder table.
    #[cfg(test)]
    fn to_table(&self) -> String {
        self.to_table_with(false)
    }

    /// [`StatusTable::to_table`]; `wide` (`-o wide`) adds each holder's pool, pod UID, claim
    /// token and admission request.
    fn to_table_with(&self, wide: bool) -> String;
}

impl StatusTable for Report {
    fn to_table_with(&self, wide: bool) -> String {
        let mut out = String::new();
        if !self.pools.is_empty() {
            out.push_str(&pool_table(self));
        }
        if !self.apps.is_empty() {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&app_table(self));
            let holders: Vec<&Holder> = self.apps.iter().flat_map(|a| &a.holders).collect();
            if !holders.is_empty() {
                out.push('\n');
                out.push_str(&holder_table(&holders, wide));
            }
        }
        if !self.duplicates.is_empty() {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&duplicate_table(self));
        }
        if out.is_empty() {
            out.push_str("No IPs are held and no FixedIPPools are defined.\n");
        }
        out
    }
}

/// One row per FixedIPPool: its CIDR and capacity.
fn pool_table(report: &Report) -> String {
    let rows = report
        .pools
        .iter()
        .map(|p| {
            let mut row = vec![
                p.name.clone(),
                p.cidr.clone().unwrap_or_else(|| "(undefined)".into()),
            ];
            row.extend(capacity_columns(p.size, p.held, p.reserved, p.free));
            row
        })
        .collect::<Vec<_>>();
    table(
        &["POOL", "CIDR", "SIZE", "HELD", "RESERVED", "FREE", "USED"],
        &rows,
    )
}

/// One row per app: its pool and capacity.
fn app_table(report: &Report) -> String {
    let rows = report
        .apps
        .iter()
        .map(|a| {
            let mut row = vec![app_name(a), a.pool.clone().unwrap_or_else(|| "-".into())];
            row.extend(capacity_columns(a.size, a.held, a.reserved, a.free));
            row
        })
        .collect::<Vec<_>>();
    table(
        &["APP", "POOL", "SIZE", "HELD", "RESERVED", "FREE", "USED"],
        &rows,
    )
}

/// The IPs carried by two or more live pods, under a line that says what to do.
fn duplicate_table(report: &Report) -> String {
    let mut out = format!(
        "DUPLICATE IPS: {} IP(s) carried by two or more live pods; the oldest keeps each, delete the others\n",
        report.duplicates.len()
    );
    let rows = report
        .duplicates
        .iter()
        .map(|d| {
            vec![
                d.ip.to_string(),
                d.keeps.clone(),
                d.pods.iter().skip(1).cloned().collect::<Vec<_>>().join(","),
            ]
        })
        .collect::<Vec<_>>();
    out.push_str(&table(&["IP", "KEEPS", "ALSO ON"], &rows));
    out
}

/// One row per held IP: its app, pod, node, phase, source and age.
/// The holder table; `wide` adds each holder's pool, pod UID, claim token and request.
fn holder_table(holders: &[&Holder], wide: bool) -> String {
    let dash = |text: &str| {
        if text.is_empty() {
            "-".to_string()
        } else {
            text.to_string()
        }
    };
    let rows = holders
        .iter()
        .map(|h| {
            let mut row = vec![
                h.ip.to_string(),
                if h.app.ends_with('/') {
                    "-".to_string()
                } else {
                    h.app.clone()
                },
                match &h.vm {
                    Some(vm) => format!("vm {vm}"),
                    None => h.pod.clone(),
                },
                h.node.clone().unwrap_or_else(|| "-".into()),
                match &h.release_at {
                    Some(at) => format!("{:?} (release {at})", h.phase),
                    None => format!("{:?}", h.phase),
                },
                format!("{:?}", h.source),
                h.since.clone(),
            ];
            if wide {
                row.extend([
                    dash(h.pool.as_deref().unwrap_or("")),
                    dash(h.pod_uid.as_deref().unwrap_or("")),
                    dash(&h.token),
                    dash(&h.request_uid),
                ]);
            }
            row
        })
        .collect::<Vec<_>>();
    let mut headers = vec!["IP", "APP", "POD", "NODE", "PHASE", "SOURCE", "SINCE"];
    if wide {
        headers.extend(["POOL", "POD UID", "CLAIM TOKEN", "REQUEST"]);
    }
    table(&headers, &rows)
}

fn app_name(app: &AppStatus) -> String {
    if app.app.is_empty() {
        format!("{}/- (static)", app.namespace)
    } else {
        app.key()
    }
}

/// SIZE, HELD, RESERVED, FREE and USED: the columns the pool and app tables share.
fn capacity_columns(size: Option<u64>, held: u64, reserved: u64, free: Option<u64>) -> [String; 5] {
    let count = |n: Option<u64>| n.map_or_else(|| "?".to_string(), |n| n.to_string());
    [
        count(size),
        held.to_string(),
        reserved.to_string(),
        count(free),
        used(held, size),
    ]
}

fn used(held: u64, size: Option<u64>) -> String {
    match size {
        Some(0) | None => "?".into(),
        Some(size) => format!("{}%", (held as u128 * 100 / size as u128)),
    }
}

/// `cell` as a terminal may show it: a control character (the start of an escape sequence, a
/// line break) or an invisible one that reorders text is written as its escape (`\u{1b}`).
/// What the admission bounds let into a claim has none; a claim object edited by hand, or
/// another ledger's record, may.
fn printable(cell: &str) -> std::borrow::Cow<'_, str> {
    let hidden = |c: char| {
        c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
    };
    if !cell.chars().any(hidden) {
        return cell.into();
    }
    cell.chars()
        .map(|c| {
            if hidden(c) {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

/// Left-aligned columns three spaces apart, like kubectl; every cell [`printable`].
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|cell| printable(cell).into_owned())
                .collect()
        })
        .collect();
    let rows = &rows[..];
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}   "));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_claims as claims;
    use ip_webhook_ipam::pools::PoolCatalog;
    use ip_webhook_ledger::{Claim, Phase};

    /// A claim of `default/{pod}` made at 2023-11-14T22:13:20Z, from a list of `size` IPs.
    fn app_claim(ip: &str, app: &str, pod: &str, phase: Phase, size: Option<u64>) -> Claim {
        claims::builder(ip, app, pod)
            .request(&format!("r-{pod}"))
            .phase(phase)
            .list_size(size.unwrap_or(0))
            .at(1_700_000_000)
            .build()
    }

    #[test]
    fn counts_held_and_reserved_and_ignores_released() {
        let claims = [
            app_claim("10.0.0.11", "web", "web-b", Phase::Reserved, Some(4)),
            app_claim("10.0.0.10", "web", "web-a", Phase::Bound, Some(4)),
            app_claim("10.0.0.12", "web", "web-c", Phase::Released, Some(4)),
            app_claim("10.0.0.20", "old", "old-a", Phase::Bound, None),
        ];
        let report = Report::build(&claims, &PoolCatalog::default(), true);
        assert_eq!(report.apps.len(), 2);
        let web = &report.apps[1];
        assert_eq!(
            (web.key().as_str(), web.held, web.reserved),
            ("default/web", 2, 1)
        );
        assert_eq!((web.size, web.free), (Some(4), Some(2)));
        let ips: Vec<String> = web.holders.iter().map(|h| h.ip.to_string()).collect();
        assert_eq!(ips, ["10.0.0.10", "10.0.0.11"]);
        let old = &report.apps[0];
        assert_eq!((old.size, old.free), (None, None));
        assert!(
            report
                .to_table()
                .contains("default/old   -      ?      1      0          ?      ?")
        );
    }

    #[test]
    fn duplicates_are_listed_in_the_table_and_the_json() {
        use crate::cluster::reconcile::{ClaimingPod, Duplicate};
        let pod = |ns: &str, name: &str, app: &str, at: u64| ClaimingPod {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            ips: vec!["10.97.40.1".parse().unwrap()],
            created_at: at,
            terminating: false,
            stateful: false,
            app: app.into(),
            token: None,
            vm: None,
        };
        let found = Duplicate {
            ip: "10.97.40.1".parse().unwrap(),
            pods: vec![
                pod("default", "web-old", "web", 1),
                pod("dev", "squat", "", 2),
            ],
        };
        let claims = [app_claim(
            "10.97.40.1",
            "web",
            "web-old",
            Phase::Bound,
            Some(4),
        )];
        let mut report = Report::build(&claims, &PoolCatalog::default(), true);
        report.duplicates = vec![duplicate_status(&found)];
        let text = report.to_table();
        assert!(
            text.ends_with(
                "DUPLICATE IPS: 1 IP(s) carried by two or more live pods; the oldest keeps each, delete the others\n\
                 IP           KEEPS             ALSO ON\n\
                 10.97.40.1   default/web-old   dev/squat\n"
            ),
            "{text}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json["duplicates"],
            serde_json::json!([{
                "ip": "10.97.40.1",
                "pods": ["default/web-old", "dev/squat"],
                "keeps": "default/web-old",
                "apps": ["default/web", "dev/"],
            }])
        );
        // filtered by an app, only the duplicates one of its pods is part of
        let mut web = report.clone();
        web.retain(Some("default/web"), None);
        assert_eq!(web.duplicates.len(), 1);
        report.retain(Some("default/old"), None);
        assert!(report.duplicates.is_empty());
        // without duplicates, the JSON has no such key
        assert!(
            serde_json::to_value(&report)
                .unwrap()
                .get("duplicates")
                .is_none()
        );
    }

    #[test]
    fn a_vms_claim_is_shown_as_the_vms() {
        let claims = [Claim {
            vm: Some("db".into()),
            ..app_claim(
                "10.0.0.30",
                "db",
                "virt-launcher-db-x2x9q",
                Phase::Bound,
                Some(4),
            )
        }];
        let report = Report::build(&claims, &PoolCatalog::default(), true);
        let table = report.to_table();
        assert!(
            table.contains("10.0.0.30   default/db   vm default/db "),
            "{table}"
        );
        let json = serde_json::to_value(&report.apps[0].holders[0]).unwrap();
        assert_eq!(json["vm"], "default/db");
        assert_eq!(json["pod"], "default/virt-launcher-db-x2x9q");
    }

    #[test]
    fn table_aligns_columns() {
        let text = table(&["A", "LONGER"], &[vec!["wide cell".into(), "x".into()]]);
        assert_eq!(text, "A           LONGER\nwide cell   x\n");
    }
}
