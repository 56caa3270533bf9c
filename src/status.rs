//! `status`: who holds which IP, per pool and per app, from the claims of any ledger.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Serialize;

use crate::ipset::ip_key;
use crate::ledger::{Claim, Phase, Source};
use crate::pools::PoolCatalog;

/// One IP and who holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    pub ip: IpAddr,
    /// `namespace/name`, or `namespace/generateName*` before the pod has its name.
    pub pod: String,
    /// The node the pod runs on, when the caller knows it (in-cluster).
    pub node: Option<String>,
    /// `namespace/app`.
    pub app: String,
    pub pool: Option<String>,
    pub phase: Phase,
    pub source: Source,
    /// When the IP was claimed (RFC 3339, UTC).
    pub since: String,
    /// `Terminating`: when the IP is released, once the pod is gone (RFC 3339, UTC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_at: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolStatus {
    pub name: String,
    /// `None` for a pool that claims name but that is not defined (any more).
    pub cidr: Option<String>,
    pub size: Option<u64>,
    /// Reserved plus bound.
    pub held: u64,
    /// Admitted, no pod seen yet.
    pub reserved: u64,
    pub free: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<Holder>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AppStatus {
    pub namespace: String,
    /// Empty for static IPs of pods without an app label.
    pub app: String,
    /// The FixedIPPool the app draws from; `None` for an `allocatable-ips` list.
    pub pool: Option<String>,
    /// The list's size (for a pool app: the pool's), from the app's newest claim.
    pub size: Option<u64>,
    pub held: u64,
    pub reserved: u64,
    /// IPs the app could still get (for a pool app: the pool's free IPs).
    pub free: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<Holder>,
}

impl AppStatus {
    /// `namespace/app`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.app)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub pools: Vec<PoolStatus>,
    pub apps: Vec<AppStatus>,
    /// IPs that two or more live pods carry (in-cluster), as the reconciler finds them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub duplicates: Vec<DuplicateStatus>,
}

/// One IP carried by two or more live pods: never granted so, but possible after a refused
/// deletion, a deleted IPClaim or a hand-written IP. The reconciler reports it (Warning Events
/// `DuplicateIP`, `ip_webhook_duplicate_ips`) and keeps the claim with the oldest pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DuplicateStatus {
    pub ip: IpAddr,
    /// `namespace/name` of each pod carrying it, oldest first.
    pub pods: Vec<String>,
    /// The pod that keeps the IP (the oldest); the others should be deleted.
    pub keeps: String,
    /// `namespace/app` of each pod, in the order of `pods` (`namespace/` without an app label).
    pub apps: Vec<String>,
}

impl DuplicateStatus {
    pub fn from_found(found: &crate::cluster::reconcile::Duplicate) -> DuplicateStatus {
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
}

/// Every IP two or more live pods carry in the cluster behind `client`, found as the
/// reconciler finds them (the pods' `allocated-ip` label and CNI annotations; one metadata
/// list of all pods).
pub async fn cluster_duplicates(
    client: &kube::Client,
    app_label: &str,
) -> Result<Vec<DuplicateStatus>, kube::Error> {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::all(client.clone());
    let list = pods
        .list_metadata(&kube::api::ListParams::default())
        .await?;
    let infos = list
        .items
        .iter()
        .filter_map(|pod| crate::cluster::pod_info(&pod.metadata, app_label))
        .map(|info| (info.uid.clone(), info))
        .collect();
    Ok(crate::cluster::reconcile::duplicates(&infos)
        .iter()
        .map(DuplicateStatus::from_found)
        .collect())
}

#[derive(Default)]
struct Tally {
    held: u64,
    reserved: u64,
    /// (created_at, list_size) of the newest claim that carried a size.
    newest_size: Option<(u64, u64)>,
    pool: Option<String>,
    holders: Vec<Holder>,
}

impl Tally {
    fn add(&mut self, claim: &Claim, holder: Option<Holder>) {
        self.held += 1;
        if claim.phase == Phase::Reserved {
            self.reserved += 1;
        }
        if let Some(size) = claim.list_size
            && self
                .newest_size
                .is_none_or(|(at, _)| claim.created_at >= at)
        {
            self.newest_size = Some((claim.created_at, size));
        }
        if claim.pool.is_some() {
            self.pool = claim.pool.clone();
        }
        if let Some(holder) = holder {
            self.holders.push(holder);
        }
    }
}

/// RFC 3339 (UTC, seconds) for unix seconds.
pub fn rfc3339(unix_seconds: u64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(unix_seconds as i64)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| unix_seconds.to_string())
}

fn holder(claim: &Claim) -> Holder {
    Holder {
        ip: claim.ip,
        pod: claim.pod.display(),
        node: None,
        app: claim.app_key(),
        pool: claim.pool.clone(),
        phase: claim.phase,
        source: claim.source,
        since: rfc3339(claim.created_at),
        release_at: claim.release_at.map(rfc3339),
    }
}

impl Report {
    /// Count the held claims per pool and per app. Every pool of `pools` is listed, used or
    /// not; `holders` says whether to list each IP (metrics only need the counts).
    pub fn build<'a>(
        claims: impl IntoIterator<Item = &'a Claim>,
        pools: &PoolCatalog,
        holders: bool,
    ) -> Report {
        let mut by_pool: BTreeMap<String, Tally> = pools
            .names()
            .into_iter()
            .map(|name| (name.to_string(), Tally::default()))
            .collect();
        let mut by_app: BTreeMap<(String, String), Tally> = BTreeMap::new();
        for claim in claims.into_iter().filter(|c| c.is_held()) {
            let made = |wanted: bool| wanted.then(|| holder(claim));
            if let Some(pool) = &claim.pool {
                by_pool
                    .entry(pool.clone())
                    .or_default()
                    .add(claim, made(holders));
            }
            by_app
                .entry((claim.pod.namespace.clone(), claim.app.clone()))
                .or_default()
                .add(claim, made(holders));
        }
        let pool_list: Vec<PoolStatus> = by_pool
            .into_iter()
            .map(|(name, tally)| {
                let defined = pools.get(&name);
                let size = match defined {
                    Some(pool) => Some(u64::try_from(pool.usable.len()).unwrap_or(u64::MAX)),
                    None => tally.newest_size.map(|(_, size)| size),
                };
                PoolStatus {
                    cidr: defined.map(|p| p.cidr.to_string()),
                    size,
                    held: tally.held,
                    reserved: tally.reserved,
                    free: size.map(|s| s.saturating_sub(tally.held)),
                    holders: sorted(tally.holders),
                    name,
                }
            })
            .collect();
        let apps = by_app
            .into_iter()
            .map(|((namespace, app), tally)| {
                let pool = tally
                    .pool
                    .as_ref()
                    .and_then(|name| pool_list.iter().find(|p| &p.name == name));
                let (size, free) = match pool {
                    Some(pool) => (pool.size, pool.free),
                    None => {
                        let size = tally.newest_size.map(|(_, size)| size);
                        (size, size.map(|s| s.saturating_sub(tally.held)))
                    }
                };
                AppStatus {
                    namespace,
                    app,
                    pool: tally.pool,
                    size,
                    held: tally.held,
                    reserved: tally.reserved,
                    free,
                    holders: sorted(tally.holders),
                }
            })
            .collect();
        Report {
            pools: pool_list,
            apps,
            duplicates: Vec::new(),
        }
    }

    /// Keep only this app (`namespace/app`) and/or this pool.
    pub fn retain(&mut self, app: Option<&str>, pool: Option<&str>) {
        if let Some(app) = app {
            self.duplicates.retain(|d| d.apps.iter().any(|a| a == app));
            self.apps.retain(|a| a.key() == app);
            self.pools
                .retain(|p| self.apps.iter().any(|a| a.pool.as_ref() == Some(&p.name)));
        }
        if let Some(pool) = pool {
            self.pools.retain(|p| p.name == pool);
            self.apps.retain(|a| a.pool.as_deref() == Some(pool));
        }
    }

    /// The IPs of the holders listed.
    pub fn holder_ips(&self) -> std::collections::BTreeSet<IpAddr> {
        let pools = self.pools.iter().flat_map(|p| p.holders.iter());
        let apps = self.apps.iter().flat_map(|a| a.holders.iter());
        pools.chain(apps).map(|h| h.ip).collect()
    }

    /// Fill in each holder's node, by IP (in-cluster: its pod's spec.nodeName).
    pub fn fill_nodes(&mut self, nodes: &BTreeMap<IpAddr, String>) {
        let pools = self.pools.iter_mut().flat_map(|p| p.holders.iter_mut());
        let apps = self.apps.iter_mut().flat_map(|a| a.holders.iter_mut());
        for holder in pools.chain(apps) {
            holder.node = nodes.get(&holder.ip).cloned();
        }
    }

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
        if !self.duplicates.is_empty() {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&format!(
                "DUPLICATE IPS: {} IP(s) carried by two or more live pods; the oldest keeps each, delete the others\n",
                self.duplicates.len()
            ));
            let rows = self
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

fn sorted(mut holders: Vec<Holder>) -> Vec<Holder> {
    holders.sort_by_key(|h| ip_key(&h.ip));
    holders
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
    use crate::ledger::PodRef;

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
    fn duplicates_are_listed_in_the_table_and_the_json() {
        use crate::cluster::reconcile::{Duplicate, PodInfo};
        let pod = |ns: &str, name: &str, app: &str, at: u64| PodInfo {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            ips: vec!["10.97.40.1".parse().unwrap()],
            created_at: at,
            terminating: false,
            stateful: false,
            app: app.into(),
            token: None,
        };
        let found = Duplicate {
            ip: "10.97.40.1".parse().unwrap(),
            pods: vec![
                pod("default", "web-old", "web", 1),
                pod("dev", "squat", "", 2),
            ],
        };
        let claims = [claim("10.97.40.1", "web", "web-old", Phase::Bound, Some(4))];
        let mut report = Report::build(&claims, &PoolCatalog::default(), true);
        report.duplicates = vec![DuplicateStatus::from_found(&found)];
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
    fn table_aligns_columns() {
        let text = table(&["A", "LONGER"], &[vec!["wide cell".into(), "x".into()]]);
        assert_eq!(text, "A           LONGER\nwide cell   x\n");
    }
}
