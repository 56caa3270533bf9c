//! How full the pools and apps are, from the claims of any ledger: what `status` prints
//! (`crate::ops::status`) and what the per-pool and per-app gauges report.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Serialize;

use crate::ipset::ip_key;
use crate::pools::PoolCatalog;
use ip_webhook_ledger::{Claim, Phase, Source};

/// One IP and who holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    pub ip: IpAddr,
    /// `namespace/name`, or `namespace/generateName*` before the pod has its name.
    pub pod: String,
    /// The KubeVirt VM (`namespace/name`) whose claim this is: its launcher pods hold it in
    /// turn ([`Claim::vm`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm: Option<String>,
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
    /// The UID of the pod the claim is bound to (none while Reserved).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The claim token the pod carries as `ip-webhook.io/claim`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub token: String,
    /// The admission request that made the claim.
    pub request_uid: String,
    /// Kept for the pod's name once it is gone (a StatefulSet pod's).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) sticky: bool,
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
    pub(crate) holders: Vec<Holder>,
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
            self.newest_size = Some((claim.created_at, size.get()));
        }
        if claim.pool.is_some() {
            self.pool = claim.pool.as_deref().map(String::from);
        }
        if let Some(holder) = holder {
            self.holders.push(holder);
        }
    }
}

/// RFC 3339 (UTC, seconds) for unix seconds. A time past the last one RFC 3339 can write
/// (a release time from a DELETE with a grace of centuries, recorded before
/// `--max-release-grace` capped it) is written as that last second, 9999-12-31T23:59:59Z.
pub fn rfc3339(unix_seconds: u64) -> String {
    i64::try_from(unix_seconds)
        .ok()
        .and_then(|second| k8s_openapi::jiff::Timestamp::from_second(second).ok())
        .map_or_else(|| "9999-12-31T23:59:59Z".to_string(), |t| t.to_string())
}

fn holder(claim: &Claim) -> Holder {
    Holder {
        ip: claim.ip,
        pod: claim.pod.display(),
        vm: claim
            .vm
            .as_ref()
            .map(|vm| format!("{}/{vm}", claim.pod.namespace)),
        node: None,
        app: claim.app_key(),
        pool: claim.pool.as_deref().map(String::from),
        phase: claim.phase,
        source: claim.source,
        since: rfc3339(claim.created_at),
        release_at: claim.release_at.map(|at| rfc3339(at.get())),
        pod_uid: claim.pod.uid.as_deref().map(String::from),
        token: claim.token.to_string(),
        request_uid: claim.request_uid.to_string(),
        sticky: claim.sticky,
    }
}

/// A pool's line: its size is the FixedIPPool's (or, for a pool no longer defined, the size
/// its newest claim recorded), its free IPs the size less those held.
fn pool_status(name: String, tally: Tally, pools: &PoolCatalog) -> PoolStatus {
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
            // a claim counts in its pool, and so does a static IP inside a pool's IPs (the
            // pool's IPs are used up by it all the same)
            let pool = claim
                .pool
                .as_deref()
                .or_else(|| pools.containing(&claim.ip).map(|p| p.name.as_str()));
            if let Some(pool) = pool {
                by_pool
                    .entry(pool.to_string())
                    .or_default()
                    .add(claim, made(holders));
            }
            by_app
                .entry((claim.pod.namespace.to_string(), claim.app.to_string()))
                .or_default()
                .add(claim, made(holders));
        }
        let pool_list: Vec<PoolStatus> = by_pool
            .into_iter()
            .map(|(name, tally)| pool_status(name, tally, pools))
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
}

fn sorted(mut holders: Vec<Holder>) -> Vec<Holder> {
    holders.sort_by_key(|h| ip_key(&h.ip));
    holders
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn release_times_print_as_dates_even_past_year_9999() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_764_640_000), "2025-12-02T01:46:40Z");
        // what a grace of i64::MAX seconds made of a release time before the cap
        assert_eq!(rfc3339(9_223_372_038_650_942_618), "9999-12-31T23:59:59Z");
        assert_eq!(rfc3339(u64::MAX), "9999-12-31T23:59:59Z");
    }
}
