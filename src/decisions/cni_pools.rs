//! Other CNIs' pool objects, checked when switched on: Kube-OVN `Subnet`s overlapping another
//! Subnet of the same VPC, and Calico `IPPool`s overlapping another Calico IPPool (Calico checks
//! that only through its own API server, not when the CRD is written directly).
//!
//! The known objects come from the admissions this process has allowed (and forgets on DELETE
//! reviews); in-cluster they can also be seeded from a list.

use std::collections::HashMap;
use std::fmt;
use std::sync::RwLock;

use serde::Deserialize;

use ip_webhook_admission::{Incoming, Meta, Operation, Response, ReviewError};
use ip_webhook_ipam::ipset::{IpRange, IpSet, IpSpecError, RangeSyntax, parse_ip_spec_with};
use ip_webhook_ipam::overlap::RangeIndex;

pub(crate) const KUBE_OVN_GROUP: &str = "kubeovn.io";
pub(crate) const CALICO_GROUPS: [&str; 2] = ["crd.projectcalico.org", "projectcalico.org"];
/// Kube-OVN's default VPC.
pub(crate) const DEFAULT_VPC: &str = "ovn-cluster";

#[derive(Debug, Deserialize, Default)]
struct Object<S> {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    spec: S,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct SubnetSpec {
    #[serde(default)]
    cidr_block: String,
    #[serde(default)]
    vpc: Option<String>,
    #[serde(default)]
    exclude_ips: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct CalicoPoolSpec {
    #[serde(default)]
    cidr: String,
    #[serde(default)]
    disabled: bool,
    #[serde(default)]
    allowed_uses: Option<Vec<String>>,
    #[serde(default)]
    node_selector: Option<String>,
}

/// A Calico IPPool as far as fixed IPs care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CalicoPool {
    pub(crate) name: String,
    pub(crate) cidr: IpRange,
    pub(crate) disabled: bool,
    /// `Workload`, `Tunnel`; Calico's default when unset is both.
    pub(crate) allowed_uses: Vec<String>,
    /// Calico's default is `all()`; `!all()` keeps automatic assignment away.
    pub(crate) node_selector: String,
}

impl CalicoPool {
    pub(crate) fn serves_workloads(&self) -> bool {
        !self.disabled
            && (self.allowed_uses.is_empty() || self.allowed_uses.iter().any(|u| u == "Workload"))
    }

    pub(crate) fn auto_assigns(&self) -> bool {
        self.serves_workloads() && self.node_selector.replace(' ', "") != "!all()"
    }

    fn describe(&self) -> String {
        let mut notes = Vec::new();
        if self.disabled {
            notes.push("disabled".to_string());
        } else if !self.serves_workloads() {
            notes.push(format!("allowedUses {}", self.allowed_uses.join(",")));
        }
        let notes = if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join(", "))
        };
        format!("{} {}{notes}", self.name, cidr_text(self.cidr))
    }
}

/// A Kube-OVN Subnet as far as fixed IPs care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OvnSubnet {
    pub(crate) name: String,
    pub(crate) vpc: String,
    pub(crate) cidrs: IpSet,
    pub(crate) excluded: IpSet,
}

#[derive(Default)]
struct NetworkState {
    subnets: HashMap<String, OvnSubnet>,
    subnet_index: HashMap<String, RangeIndex<String>>,
    calico: HashMap<String, CalicoPool>,
    calico_index: RangeIndex<String>,
    /// IPs held by Calico IPReservations: automatic assignment skips them.
    calico_reserved: IpSet,
    /// Whether the Calico pools are known (a watch synced): only then are IPs checked.
    calico_synced: bool,
    ovn_synced: bool,
}

/// The Subnets (per VPC) and Calico IPPools known to this process: learned from admissions,
/// and in-cluster filled by watches.
#[derive(Default)]
pub(crate) struct NetworkRegistry {
    state: RwLock<NetworkState>,
}

impl NetworkRegistry {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, NetworkState> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, NetworkState> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn upsert_subnet(&self, subnet: OvnSubnet) {
        let mut state = self.write();
        for index in state.subnet_index.values_mut() {
            index.remove(&subnet.name);
        }
        state
            .subnet_index
            .entry(subnet.vpc.clone())
            .or_default()
            .insert_set(&subnet.cidrs, subnet.name.clone());
        state.subnets.insert(subnet.name.clone(), subnet);
    }

    pub(crate) fn forget_subnet(&self, name: &str) {
        let mut state = self.write();
        for index in state.subnet_index.values_mut() {
            index.remove(&name.to_string());
        }
        state.subnets.remove(name);
    }

    pub(crate) fn upsert_calico_pool(&self, pool: CalicoPool) {
        let mut state = self.write();
        state.calico_index.remove(&pool.name);
        state.calico_index.insert(pool.cidr, pool.name.clone());
        state.calico.insert(pool.name.clone(), pool);
    }

    pub(crate) fn forget_calico_pool(&self, name: &str) {
        let mut state = self.write();
        state.calico_index.remove(&name.to_string());
        state.calico.remove(name);
    }

    pub(crate) fn set_calico_reserved(&self, reserved: IpSet) {
        self.write().calico_reserved = reserved;
    }

    /// Say whether the Calico pools are fully known (checks of fixed IPs run only then).
    pub(crate) fn set_calico_synced(&self, synced: bool) {
        self.write().calico_synced = synced;
    }

    pub(crate) fn set_ovn_synced(&self, synced: bool) {
        self.write().ovn_synced = synced;
    }

    /// Fixed IPs against Calico's pools: `Err` names an IP no enabled Workload pool holds;
    /// `Ok` carries warnings for IPs in pools Calico also hands out automatically.
    pub(crate) fn calico_check(
        &self,
        ips: &IpSet,
        whose: &dyn fmt::Display,
    ) -> Result<Vec<String>, CniRefusal> {
        let state = self.read();
        if !state.calico_synced || ips.is_empty() {
            return Ok(Vec::new());
        }
        let usable = IpSet::from_ranges(
            state
                .calico
                .values()
                .filter(|p| p.serves_workloads())
                .map(|p| p.cidr),
        );
        let outside = ips.subtract(&usable);
        if let Some(first) = outside.ranges().first() {
            let mut pools: Vec<&CalicoPool> = state.calico.values().collect();
            pools.sort_by_key(|p| (p.cidr, p.name.clone()));
            let known = if pools.is_empty() {
                "there are no Calico IPPools".to_string()
            } else {
                format!(
                    "Calico IPPools: {}",
                    pools
                        .iter()
                        .map(|p| p.describe())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            return Err(CniRefusal::OutsideCalicoPools {
                ip: first.to_string(),
                whose: whose.to_string(),
                known,
            });
        }
        let mut warnings = Vec::new();
        let mut pools: Vec<&CalicoPool> =
            state.calico.values().filter(|p| p.auto_assigns()).collect();
        pools.sort_by_key(|p| p.cidr);
        for pool in pools {
            let exposed = ips
                .subtract(&ips.subtract(&IpSet::from_ranges([pool.cidr])))
                .subtract(&state.calico_reserved);
            if !exposed.is_empty() {
                warnings.push(format!(
                    "IPs {} of {whose} lie in Calico IPPool {}, which Calico also uses for automatic assignment: another pod may get them first (use a pool with nodeSelector: \"!all()\", or let ip-webhook keep a Calico IPReservation)",
                    shorten(&exposed.to_string()),
                    pool.name
                ));
            }
        }
        Ok(warnings)
    }

    /// Fixed IPs against Kube-OVN's Subnets: each must lie in a Subnet's cidrBlock and outside
    /// its excludeIps.
    pub(crate) fn ovn_check(
        &self,
        ips: &IpSet,
        whose: &dyn fmt::Display,
    ) -> Result<(), CniRefusal> {
        let state = self.read();
        if !state.ovn_synced || ips.is_empty() {
            return Ok(());
        }
        let mut subnets: Vec<&OvnSubnet> = state.subnets.values().collect();
        subnets.sort_by(|a, b| a.name.cmp(&b.name));
        for range in ips.ranges() {
            let single = IpSet::from_ranges([*range]);
            let mut rest = single.clone();
            for subnet in &subnets {
                let inside = rest.subtract(&rest.subtract(&subnet.cidrs));
                if inside.is_empty() {
                    continue;
                }
                let excluded = inside.subtract(&inside.subtract(&subnet.excluded));
                if let Some(bad) = excluded.ranges().first() {
                    return Err(CniRefusal::OvnExcluded {
                        ip: bad.to_string(),
                        whose: whose.to_string(),
                        subnet: subnet.name.clone(),
                    });
                }
                rest = rest.subtract(&inside);
            }
            if let Some(bad) = rest.ranges().first() {
                let known = subnets
                    .iter()
                    .map(|s| format!("{} {}", s.name, cidrs_text(&s.cidrs)))
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(CniRefusal::OutsideOvnSubnets {
                    ip: bad.to_string(),
                    whose: whose.to_string(),
                    known,
                });
            }
        }
        Ok(())
    }
}

/// Why the CNI would not give a workload or pod its fixed IPs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CniRefusal {
    #[error(
        "IP {ip} of {whose} lies in no enabled Calico IPPool that allows Workload use, so Calico would fail the pod with \"The provided IP address is not in a configured pool\"; {known}"
    )]
    OutsideCalicoPools {
        ip: String,
        whose: String,
        known: String,
    },
    #[error(
        "IP {ip} of {whose} lies in excludeIps of Kube-OVN Subnet {subnet}, so Kube-OVN will not assign it"
    )]
    OvnExcluded {
        ip: String,
        whose: String,
        subnet: String,
    },
    #[error("IP {ip} of {whose} lies in no Kube-OVN Subnet (Subnets: {known})")]
    OutsideOvnSubnets {
        ip: String,
        whose: String,
        known: String,
    },
}

/// Why a CIDR list of a CNI object is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CidrError {
    #[error("{0:?} is not a valid CIDR")]
    NotCidr(String),
    #[error("{part} has host bits set; did you mean {network}?")]
    HostBits { part: String, network: ipnet::IpNet },
    #[error("is empty")]
    Empty,
}

/// Why a Kube-OVN Subnet or a Calico IPPool cannot be used; each names the object.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CniObjectError {
    #[error("{kind} {name}: {error}")]
    Json {
        kind: &'static str,
        name: String,
        error: serde_json::Error,
    },
    #[error("{kind} {name}: {field} {error}")]
    Cidr {
        kind: &'static str,
        name: String,
        field: &'static str,
        error: CidrError,
    },
    #[error("Subnet {name}: spec.excludeIps: {error}")]
    ExcludeIps { name: String, error: IpSpecError },
    #[error("Subnet {name}: spec.excludeIps {outside} lies outside spec.cidrBlock {cidr_block}")]
    ExcludedOutside {
        name: String,
        outside: String,
        cidr_block: String,
    },
    #[error("Calico IPPool {name}: spec.cidr must be one CIDR")]
    NotOneCidr { name: String },
}

fn shorten(text: &str) -> String {
    if text.len() > 120 {
        format!("{}…", text.chars().take(120).collect::<String>())
    } else {
        text.to_string()
    }
}

/// Parse a CIDR list (`10.16.0.0/16,fd00:10:16::/64`) into whole-network ranges.
fn cidr_block(text: &str) -> Result<IpSet, CidrError> {
    let mut ranges = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let net: ipnet::IpNet = part
            .parse()
            .map_err(|_| CidrError::NotCidr(part.to_string()))?;
        if net.trunc() != net {
            return Err(CidrError::HostBits {
                part: part.to_string(),
                network: net.trunc(),
            });
        }
        ranges.push(IpRange::from_net_all(&net));
    }
    if ranges.is_empty() {
        return Err(CidrError::Empty);
    }
    Ok(IpSet::from_ranges(ranges))
}

fn name_of(meta: &Meta, incoming: &Incoming<'_>) -> String {
    meta.name
        .clone()
        .or_else(|| incoming.request.name.as_deref().map(str::to_string))
        .unwrap_or_default()
}

/// A CREATE/UPDATE's object (name and spec), or the answer already given: DELETE forgets the
/// object (unless dry run), CONNECT passes.
enum Written<S> {
    Object(String, S),
    Answered(Response),
}

fn written<'a, S: Deserialize<'a> + Default>(
    incoming: &Incoming<'a>,
    what: &str,
    forget: impl FnOnce(&str),
) -> Result<Written<S>, ReviewError> {
    let response = incoming.respond();
    match incoming.request.operation {
        Operation::Delete => {
            if !incoming.dry_run() {
                forget(incoming.request.name.as_deref().unwrap_or(""));
            }
            return Ok(Written::Answered(response));
        }
        Operation::Create | Operation::Update => {}
        Operation::Connect => return Ok(Written::Answered(response)),
    }
    let Some(object) = incoming.object::<Object<S>>(false)? else {
        let message = format!("a {what} review must carry request.object");
        return Ok(Written::Answered(response.deny(message)));
    };
    Ok(Written::Object(
        name_of(&object.metadata, incoming),
        object.spec,
    ))
}

/// `/validate` for a Kube-OVN Subnet.
pub(crate) fn review_subnet(
    registry: &NetworkRegistry,
    incoming: &Incoming<'_>,
) -> Result<Response, ReviewError> {
    let (name, spec) =
        match written::<SubnetSpec>(incoming, "Subnet", |name| registry.forget_subnet(name))? {
            Written::Object(name, spec) => (name, spec),
            Written::Answered(response) => return Ok(response),
        };
    let response = incoming.respond();
    let subnet = match OvnSubnet::from_spec(&name, &spec) {
        Ok(subnet) => subnet,
        Err(refused) => return Ok(response.deny(refused.to_string())),
    };
    if let Some((range, other)) = registry
        .read()
        .subnet_index
        .get(&subnet.vpc)
        .and_then(|index| index.first_overlap_set(&subnet.cidrs, Some(&name)))
    {
        return Ok(response.deny(format!(
            "Subnet {name} ({}) overlaps Subnet {other} ({}) in VPC {}",
            cidrs_text(&subnet.cidrs),
            cidr_text(range),
            subnet.vpc
        )));
    }
    if !incoming.dry_run() {
        registry.upsert_subnet(subnet);
    }
    Ok(response)
}

/// `/validate` for a Calico IPPool.
pub(crate) fn review_calico_pool(
    registry: &NetworkRegistry,
    incoming: &Incoming<'_>,
) -> Result<Response, ReviewError> {
    let (name, spec) = match written::<CalicoPoolSpec>(incoming, "Calico IPPool", |name| {
        registry.forget_calico_pool(name)
    })? {
        Written::Object(name, spec) => (name, spec),
        Written::Answered(response) => return Ok(response),
    };
    let response = incoming.respond();
    let pool = match CalicoPool::from_spec(&name, &spec) {
        Ok(pool) => pool,
        Err(refused) => return Ok(response.deny(refused.to_string())),
    };
    if let Some((range, other)) = registry
        .read()
        .calico_index
        .first_overlap(&pool.cidr, Some(&name))
    {
        return Ok(response.deny(format!(
            "Calico IPPool {name} ({}) overlaps Calico IPPool {other} ({})",
            cidr_text(pool.cidr),
            cidr_text(range)
        )));
    }
    if !incoming.dry_run() {
        registry.upsert_calico_pool(pool);
    }
    Ok(response)
}

impl OvnSubnet {
    /// From a Subnet object's JSON (as a watch delivers it).
    pub(crate) fn from_json(
        name: &str,
        spec: &serde_json::Value,
    ) -> Result<OvnSubnet, CniObjectError> {
        let spec: SubnetSpec =
            serde_json::from_value(spec.clone()).map_err(|error| CniObjectError::Json {
                kind: "Subnet",
                name: name.to_string(),
                error,
            })?;
        OvnSubnet::from_spec(name, &spec)
    }

    fn from_spec(name: &str, spec: &SubnetSpec) -> Result<OvnSubnet, CniObjectError> {
        let cidrs = cidr_block(&spec.cidr_block).map_err(|error| CniObjectError::Cidr {
            kind: "Subnet",
            name: name.to_string(),
            field: "spec.cidrBlock",
            error,
        })?;
        let excluded = match spec.exclude_ips.as_ref().filter(|e| !e.is_empty()) {
            None => IpSet::default(),
            Some(entries) => {
                let set = parse_ip_spec_with(&entries.join(","), RangeSyntax::DotDot).map_err(
                    |error| CniObjectError::ExcludeIps {
                        name: name.to_string(),
                        error,
                    },
                )?;
                if !set.is_subset_of(&cidrs) {
                    return Err(CniObjectError::ExcludedOutside {
                        name: name.to_string(),
                        outside: set.subtract(&cidrs).to_string(),
                        cidr_block: spec.cidr_block.clone(),
                    });
                }
                set
            }
        };
        let vpc = spec
            .vpc
            .clone()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| DEFAULT_VPC.to_string());
        Ok(OvnSubnet {
            name: name.to_string(),
            vpc,
            cidrs,
            excluded,
        })
    }
}

impl CalicoPool {
    /// From a Calico IPPool object's JSON (as a watch delivers it).
    pub(crate) fn from_json(
        name: &str,
        spec: &serde_json::Value,
    ) -> Result<CalicoPool, CniObjectError> {
        let spec: CalicoPoolSpec =
            serde_json::from_value(spec.clone()).map_err(|error| CniObjectError::Json {
                kind: "Calico IPPool",
                name: name.to_string(),
                error,
            })?;
        CalicoPool::from_spec(name, &spec)
    }

    fn from_spec(name: &str, spec: &CalicoPoolSpec) -> Result<CalicoPool, CniObjectError> {
        let cidr = match cidr_block(&spec.cidr) {
            Ok(set) if set.ranges().len() == 1 => set.ranges()[0],
            Ok(_) => {
                return Err(CniObjectError::NotOneCidr {
                    name: name.to_string(),
                });
            }
            Err(error) => {
                return Err(CniObjectError::Cidr {
                    kind: "Calico IPPool",
                    name: name.to_string(),
                    field: "spec.cidr",
                    error,
                });
            }
        };
        Ok(CalicoPool {
            name: name.to_string(),
            cidr,
            disabled: spec.disabled,
            allowed_uses: spec.allowed_uses.clone().unwrap_or_default(),
            node_selector: spec
                .node_selector
                .clone()
                .unwrap_or_else(|| "all()".to_string()),
        })
    }
}

fn cidrs_text(set: &IpSet) -> String {
    set.ranges()
        .iter()
        .map(|r| cidr_text(*r))
        .collect::<Vec<_>>()
        .join(",")
}

/// A whole-network range back as CIDR text when it is one, else as a range.
fn cidr_text(range: IpRange) -> String {
    let size = range.len();
    if size.is_power_of_two() && range.start.is_multiple_of(size) {
        let bits = match range.family {
            ip_webhook_ipam::ipset::Family::V4 => 32,
            ip_webhook_ipam::ipset::Family::V6 => 128,
        };
        format!("{}/{}", range.first(), bits - size.trailing_zeros())
    } else {
        range.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ip_webhook_ipam::ipset::parse_ip_spec;
    use serde_json::json;

    fn calico(name: &str, spec: serde_json::Value) -> CalicoPool {
        CalicoPool::from_json(name, &spec).unwrap()
    }

    fn registry() -> NetworkRegistry {
        let registry = NetworkRegistry::default();
        registry.upsert_calico_pool(calico("default-ipv4", json!({"cidr": "192.168.0.0/16"})));
        registry.upsert_calico_pool(calico(
            "fixed",
            json!({"cidr": "10.20.0.0/24", "nodeSelector": "!all()"}),
        ));
        registry.upsert_calico_pool(calico(
            "off",
            json!({"cidr": "10.30.0.0/24", "disabled": true}),
        ));
        registry.upsert_calico_pool(calico(
            "tunnels",
            json!({"cidr": "10.40.0.0/24", "allowedUses": ["Tunnel"]}),
        ));
        registry
    }

    #[test]
    fn calico_checks_run_only_once_pools_are_known() {
        let registry = registry();
        let outside = parse_ip_spec("10.99.0.5").unwrap();
        assert_eq!(
            registry.calico_check(&outside, &"app default/web"),
            Ok(vec![])
        );
        registry.set_calico_synced(true);
        let pools = "Calico IPPools: fixed 10.20.0.0/24, off 10.30.0.0/24 (disabled), tunnels 10.40.0.0/24 (allowedUses Tunnel), default-ipv4 192.168.0.0/16";
        let cases: [(&str, Result<Vec<String>, String>); 5] = [
            ("10.20.0.5-10.20.0.9", Ok(vec![])),
            ("10.99.0.5", Err(format!("IP 10.99.0.5 of app default/web lies in no enabled Calico IPPool that allows Workload use, so Calico would fail the pod with \"The provided IP address is not in a configured pool\"; {pools}"))),
            ("10.30.0.5", Err(format!("IP 10.30.0.5 of app default/web lies in no enabled Calico IPPool that allows Workload use, so Calico would fail the pod with \"The provided IP address is not in a configured pool\"; {pools}"))),
            ("10.40.0.5", Err(format!("IP 10.40.0.5 of app default/web lies in no enabled Calico IPPool that allows Workload use, so Calico would fail the pod with \"The provided IP address is not in a configured pool\"; {pools}"))),
            ("192.168.3.1-192.168.3.2", Ok(vec!["IPs 192.168.3.1-192.168.3.2 of app default/web lie in Calico IPPool default-ipv4, which Calico also uses for automatic assignment: another pod may get them first (use a pool with nodeSelector: \"!all()\", or let ip-webhook keep a Calico IPReservation)".to_string()])),
        ];
        for (ips, expected) in cases {
            assert_eq!(
                registry
                    .calico_check(&parse_ip_spec(ips).unwrap(), &"app default/web")
                    .map_err(|e| e.to_string()),
                expected,
                "{ips}"
            );
        }
        // reserved IPs are safe from automatic assignment: no warning
        registry.set_calico_reserved(parse_ip_spec("192.168.3.0/24").unwrap());
        assert_eq!(
            registry.calico_check(&parse_ip_spec("192.168.3.1").unwrap(), &"x"),
            Ok(vec![])
        );
        // no pools at all
        let empty = NetworkRegistry::default();
        empty.set_calico_synced(true);
        assert!(
            empty
                .calico_check(&parse_ip_spec("10.0.0.1").unwrap(), &"x")
                .unwrap_err()
                .to_string()
                .ends_with("there are no Calico IPPools")
        );
    }

    #[test]
    fn kube_ovn_subnet_and_exclude_checks() {
        let registry = NetworkRegistry::default();
        registry.upsert_subnet(OvnSubnet::from_json("ovn-default", &json!({"cidrBlock": "10.16.0.0/16,fd00:10:16::/64", "excludeIps": ["10.16.0.1..10.16.0.10"]})).unwrap());
        registry.set_ovn_synced(true);
        assert_eq!(
            registry.ovn_check(
                &parse_ip_spec("10.16.0.11-10.16.0.20,fd00:10:16::5").unwrap(),
                &"x"
            ),
            Ok(())
        );
        assert_eq!(
            registry
                .ovn_check(&parse_ip_spec("10.16.0.8-10.16.0.12").unwrap(), &"app default/web")
                .map_err(|e| e.to_string()),
            Err("IP 10.16.0.8-10.16.0.10 of app default/web lies in excludeIps of Kube-OVN Subnet ovn-default, so Kube-OVN will not assign it".into())
        );
        assert_eq!(
            registry
                .ovn_check(&parse_ip_spec("10.17.0.1").unwrap(), &"app default/web")
                .map_err(|e| e.to_string()),
            Err("IP 10.17.0.1 of app default/web lies in no Kube-OVN Subnet (Subnets: ovn-default 10.16.0.0/16,fd00:10:16::/64)".into())
        );
    }
}
