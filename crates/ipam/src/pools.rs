//! IP pools: `FixedIPPool` objects turned into the usable IP sets the allocator draws from, and the
//! rules that say which pods may draw from which pool.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::ipset::{IpRange, IpSet, IpSpecError, parse_ip_spec};
use crate::overlap::RangeIndex;
use ip_webhook_ledger::crd::FixedIPPool;

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("FixedIPPool {pool}: spec.cidr {cidr:?} is not a valid CIDR")]
    BadCidr { pool: String, cidr: String },
    #[error("FixedIPPool {pool}: spec.cidr {cidr} has host bits set; did you mean {truncated}?")]
    HostBits {
        pool: String,
        cidr: String,
        truncated: String,
    },
    #[error("FixedIPPool {pool}: spec.{field}: {source}")]
    BadList {
        pool: String,
        field: &'static str,
        source: IpSpecError,
    },
    #[error("FixedIPPool {pool}: spec.{field} {outside} lies outside spec.cidr {cidr}")]
    Outside {
        pool: String,
        field: &'static str,
        outside: String,
        cidr: String,
    },
    #[error("FixedIPPool {pool}: no usable IPs are left after spec.excludeIPs")]
    Empty { pool: String },
    #[error("FixedIPPool {pool}: metadata.name is empty")]
    NoName { pool: String },
    #[error("FixedIPPool {pool} ({cidr}) overlaps FixedIPPool {other} ({other_cidr})")]
    Overlap {
        pool: String,
        cidr: String,
        other: String,
        other_cidr: String,
    },
    #[error("cannot read pools file {path}: {reason}")]
    File { path: String, reason: String },
}

/// A pool ready for allocation.
#[derive(Debug, Clone)]
pub struct Pool {
    pub name: String,
    pub cidr: IpNet,
    pub usable: Arc<IpSet>,
    pub(crate) namespaces: Vec<String>,
    pub(crate) pod_selector: Option<LabelSelector>,
}

impl Pool {
    pub fn from_resource(resource: &FixedIPPool) -> Result<Pool, PoolError> {
        let name = resource.metadata.name.clone().unwrap_or_default();
        if name.is_empty() {
            return Err(PoolError::NoName {
                pool: format!("with cidr {}", resource.spec.cidr),
            });
        }
        let spec = &resource.spec;
        let cidr = IpNet::from_str(spec.cidr.trim()).map_err(|_| PoolError::BadCidr {
            pool: name.clone(),
            cidr: spec.cidr.clone(),
        })?;
        if cidr.trunc() != cidr {
            return Err(PoolError::HostBits {
                pool: name,
                cidr: spec.cidr.clone(),
                truncated: cidr.trunc().to_string(),
            });
        }
        let whole = IpSet::from_ranges([IpRange::from_net_all(&cidr)]);
        let list = |field: &'static str,
                    entries: &Option<Vec<String>>|
         -> Result<Option<IpSet>, PoolError> {
            let Some(entries) = entries.as_ref().filter(|e| !e.is_empty()) else {
                return Ok(None);
            };
            let set = parse_ip_spec(&entries.join(",")).map_err(|source| PoolError::BadList {
                pool: name.clone(),
                field,
                source,
            })?;
            let outside = set.subtract(&whole);
            if !outside.is_empty() {
                return Err(PoolError::Outside {
                    pool: name.clone(),
                    field,
                    outside: outside.to_string(),
                    cidr: cidr.to_string(),
                });
            }
            Ok(Some(set))
        };
        let ips = list("ips", &spec.ips)?;
        let excluded = list("excludeIPs", &spec.exclude_ips)?;
        let mut usable = ips.unwrap_or_else(|| IpSet::from_ranges([IpRange::from_net(&cidr)]));
        if let Some(excluded) = excluded {
            usable = usable.subtract(&excluded);
        }
        if usable.is_empty() {
            return Err(PoolError::Empty { pool: name });
        }
        Ok(Pool {
            name,
            cidr,
            usable: Arc::new(usable),
            namespaces: spec.namespaces.clone().unwrap_or_default(),
            pod_selector: spec.pod_selector.clone(),
        })
    }

    /// Why this pod may not draw from the pool, if it may not.
    pub fn refuses(
        &self,
        namespace: &str,
        labels: Option<&BTreeMap<String, String>>,
    ) -> Option<String> {
        if !self.namespaces.is_empty() && !self.namespaces.iter().any(|n| n == namespace) {
            return Some(format!(
                "FixedIPPool {} serves namespaces [{}], not {namespace}",
                self.name,
                self.namespaces.join(", ")
            ));
        }
        if let Some(selector) = &self.pod_selector
            && !selector_matches(selector, labels)
        {
            return Some(format!(
                "FixedIPPool {}'s podSelector does not select this pod",
                self.name
            ));
        }
        None
    }
}

/// Whether a label selector selects `labels` (matchLabels and matchExpressions).
pub(crate) fn selector_matches(
    selector: &LabelSelector,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    let empty = BTreeMap::new();
    let labels = labels.unwrap_or(&empty);
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions_ok = selector.match_expressions.iter().flatten().all(|expr| {
        let value = labels.get(&expr.key);
        let values = expr.values.as_deref().unwrap_or(&[]);
        match expr.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_ok && expressions_ok
}

/// All pools by name, with an interval index of their CIDRs.
#[derive(Debug, Clone, Default)]
pub struct PoolCatalog {
    pools: HashMap<String, Arc<Pool>>,
    cidrs: RangeIndex<String>,
}

impl PoolCatalog {
    /// Build a catalog, refusing invalid pools and overlapping CIDRs.
    pub fn new(resources: &[FixedIPPool]) -> Result<PoolCatalog, PoolError> {
        let mut catalog = PoolCatalog::default();
        for resource in resources {
            let pool = Pool::from_resource(resource)?;
            if let Some(other) = catalog.overlapping(&pool) {
                return Err(PoolError::Overlap {
                    pool: pool.name.clone(),
                    cidr: pool.cidr.to_string(),
                    other: other.name.clone(),
                    other_cidr: other.cidr.to_string(),
                });
            }
            catalog.insert(pool);
        }
        Ok(catalog)
    }

    /// Add or replace a pool (no overlap check: see [`PoolCatalog::overlapping`]).
    pub fn insert(&mut self, pool: Pool) {
        self.cidrs.remove(&pool.name);
        self.cidrs
            .insert(IpRange::from_net_all(&pool.cidr), pool.name.clone());
        self.pools.insert(pool.name.clone(), Arc::new(pool));
    }

    /// Another pool whose CIDR overlaps `pool`'s (a pool of the same name is not "another").
    pub fn overlapping(&self, pool: &Pool) -> Option<&Arc<Pool>> {
        let (_, name) = self
            .cidrs
            .first_overlap(&IpRange::from_net_all(&pool.cidr), Some(&pool.name))?;
        self.pools.get(name)
    }

    /// The pool whose usable IPs include `ip`, if one does (pools never overlap).
    pub(crate) fn containing(&self, ip: &std::net::IpAddr) -> Option<&Arc<Pool>> {
        let (_, name) = self.cidrs.first_overlap(&IpRange::single(*ip), None)?;
        self.pools.get(name).filter(|pool| pool.usable.contains(ip))
    }

    /// Pools whose usable IPs intersect `set`.
    pub fn intersecting<'a>(&'a self, set: &'a IpSet) -> impl Iterator<Item = &'a Arc<Pool>> + 'a {
        let mut seen: Vec<&String> = Vec::new();
        for range in set.ranges() {
            let mut probe = *range;
            while let Some((found, name)) = self.cidrs.first_overlap(&probe, None) {
                if !seen.contains(&name) {
                    seen.push(name);
                }
                if found.end >= probe.end {
                    break;
                }
                probe.start = found.end + 1;
            }
        }
        seen.into_iter()
            .filter_map(|name| self.pools.get(name))
            .filter(move |pool| pool.usable.intersects(set))
    }

    /// Load `--pools-file`: a YAML list of FixedIPPool objects (or a multi-document stream).
    pub fn from_file(path: &Path) -> Result<PoolCatalog, PoolError> {
        let file_error = |reason: String| PoolError::File {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
        let mut resources: Vec<FixedIPPool> = Vec::new();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value =
                serde_yaml::Value::deserialize(document).map_err(|e| file_error(e.to_string()))?;
            match value {
                serde_yaml::Value::Null => {}
                serde_yaml::Value::Sequence(_) => {
                    let list: Vec<FixedIPPool> =
                        serde_yaml::from_value(value).map_err(|e| file_error(e.to_string()))?;
                    resources.extend(list);
                }
                other => resources
                    .push(serde_yaml::from_value(other).map_err(|e| file_error(e.to_string()))?),
            }
        }
        PoolCatalog::new(&resources)
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Pool>> {
        self.pools.get(name)
    }

    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.pools.keys().map(String::as_str).collect();
        names.sort();
        names
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Pool>> {
        self.pools.values()
    }
}

use serde::Deserialize as _;

#[cfg(test)]
mod tests {
    use super::*;
    use ip_webhook_ledger::crd::FixedIPPoolSpec;

    fn pool(name: &str, cidr: &str) -> FixedIPPool {
        FixedIPPool::new(
            name,
            FixedIPPoolSpec {
                cidr: cidr.into(),
                ..Default::default()
            },
        )
    }

    #[test]
    fn usable_ips_exclude_network_broadcast_and_excluded() {
        let mut p = pool("blue", "10.20.0.0/29");
        p.spec.exclude_ips = Some(vec!["10.20.0.2-10.20.0.3".into()]);
        let built = Pool::from_resource(&p).unwrap();
        assert_eq!(built.usable.to_string(), "10.20.0.1,10.20.0.4-10.20.0.6");
        p.spec.ips = Some(vec!["10.20.0.0".into(), "10.20.0.4".into()]);
        p.spec.exclude_ips = None;
        assert_eq!(
            Pool::from_resource(&p).unwrap().usable.to_string(),
            "10.20.0.0,10.20.0.4"
        );
    }

    #[test]
    fn invalid_pools_are_refused_with_the_field() {
        let mut p = pool("blue", "10.20.0.0/24");
        p.spec.ips = Some(vec!["10.21.0.1".into()]);
        assert_eq!(
            Pool::from_resource(&p).unwrap_err().to_string(),
            "FixedIPPool blue: spec.ips 10.21.0.1 lies outside spec.cidr 10.20.0.0/24"
        );
        assert_eq!(
            Pool::from_resource(&pool("x", "10.0.0.1/24"))
                .unwrap_err()
                .to_string(),
            "FixedIPPool x: spec.cidr 10.0.0.1/24 has host bits set; did you mean 10.0.0.0/24?"
        );
        assert_eq!(
            Pool::from_resource(&pool("x", "banana"))
                .unwrap_err()
                .to_string(),
            "FixedIPPool x: spec.cidr \"banana\" is not a valid CIDR"
        );
    }

    #[test]
    fn overlapping_pools_are_refused() {
        let err = PoolCatalog::new(&[
            pool("a", "10.0.0.0/16"),
            pool("b", "10.0.4.0/24"),
            pool("c", "fd00::/64"),
        ])
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "FixedIPPool b (10.0.4.0/24) overlaps FixedIPPool a (10.0.0.0/16)"
        );
        assert!(
            PoolCatalog::new(&[
                pool("a", "10.0.0.0/24"),
                pool("b", "10.0.1.0/24"),
                pool("c", "fd00::/64")
            ])
            .is_ok()
        );
    }

    #[test]
    fn namespaces_and_selector_decide_who_draws() {
        let mut p = pool("blue", "10.20.0.0/24");
        p.spec.namespaces = Some(vec!["prod".into()]);
        p.spec.pod_selector = Some(LabelSelector {
            match_labels: Some([("tier".to_string(), "db".to_string())].into()),
            ..Default::default()
        });
        let built = Pool::from_resource(&p).unwrap();
        let db: BTreeMap<String, String> = [("tier".to_string(), "db".to_string())].into();
        assert_eq!(built.refuses("prod", Some(&db)), None);
        assert_eq!(
            built.refuses("dev", Some(&db)).unwrap(),
            "FixedIPPool blue serves namespaces [prod], not dev"
        );
        assert_eq!(
            built.refuses("prod", None).unwrap(),
            "FixedIPPool blue's podSelector does not select this pod"
        );
    }
}
