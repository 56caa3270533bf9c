//! `status`: who holds which IP, per pool and per app, from the claims of any ledger; the
//! counts are [`crate::ipam::usage::Report`]'s, this is their text.

use crate::ipam::usage::{AppStatus, Holder, Report};

impl Report {
    /// The kubectl-style text: a pool table, an app table and a holder table.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        if !self.pools.is_empty() {
            let rows = self
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
            out.push_str(&table(
                &["POOL", "CIDR", "SIZE", "HELD", "RESERVED", "FREE", "USED"],
                &rows,
            ));
        }
        if !self.apps.is_empty() {
            if !out.is_empty() {
                out.push('\n');
            }
            let rows = self
                .apps
                .iter()
                .map(|a| {
                    let mut row = vec![app_name(a), a.pool.clone().unwrap_or_else(|| "-".into())];
                    row.extend(capacity_columns(a.size, a.held, a.reserved, a.free));
                    row
                })
                .collect::<Vec<_>>();
            out.push_str(&table(
                &["APP", "POOL", "SIZE", "HELD", "RESERVED", "FREE", "USED"],
                &rows,
            ));
            let holders: Vec<&Holder> = self.apps.iter().flat_map(|a| &a.holders).collect();
            if !holders.is_empty() {
                out.push('\n');
                let rows = holders
                    .iter()
                    .map(|h| {
                        vec![
                            h.ip.to_string(),
                            if h.app.ends_with('/') {
                                "-".to_string()
                            } else {
                                h.app.clone()
                            },
                            h.pod.clone(),
                            h.node.clone().unwrap_or_else(|| "-".into()),
                            match &h.release_at {
                                Some(at) => format!("{:?} (release {at})", h.phase),
                                None => format!("{:?}", h.phase),
                            },
                            format!("{:?}", h.source),
                            h.since.clone(),
                        ]
                    })
                    .collect::<Vec<_>>();
                out.push_str(&table(
                    &["IP", "APP", "POD", "NODE", "PHASE", "SOURCE", "SINCE"],
                    &rows,
                ));
            }
        }
        if out.is_empty() {
            out.push_str("No IPs are held and no FixedIPPools are defined.\n");
        }
        out
    }
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

/// Left-aligned columns three spaces apart, like kubectl.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
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
    use crate::ipam::pools::PoolCatalog;
    use crate::ledger::{Claim, Phase, PodRef, Source};

    fn claim(ip: &str, app: &str, pod: &str, phase: Phase, size: Option<u64>) -> Claim {
        Claim {
            ip: ip.parse().unwrap(),
            app: app.into(),
            pool: None,
            pod: PodRef {
                namespace: "default".into(),
                name: pod.into(),
                ..Default::default()
            },
            request_uid: format!("r-{pod}"),
            phase,
            source: Source::Allocated,
            created_at: 1_700_000_000,
            updated_at: 1_700_000_000,
            list_size: size,
            token: String::new(),
            release_at: None,
            sticky: false,
        }
    }

    #[test]
    fn counts_held_and_reserved_and_ignores_released() {
        let claims = [
            claim("10.0.0.11", "web", "web-b", Phase::Reserved, Some(4)),
            claim("10.0.0.10", "web", "web-a", Phase::Bound, Some(4)),
            claim("10.0.0.12", "web", "web-c", Phase::Released, Some(4)),
            claim("10.0.0.20", "old", "old-a", Phase::Bound, None),
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
    fn table_aligns_columns() {
        let text = table(&["A", "LONGER"], &[vec!["wide cell".into(), "x".into()]]);
        assert_eq!(text, "A           LONGER\nwide cell   x\n");
    }
}
