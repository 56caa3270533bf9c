//! Other CNIs' pool objects, checked when switched on: Kube-OVN `Subnet`s overlapping another
//! Subnet of the same VPC, and Calico `IPPool`s overlapping another Calico IPPool (Calico checks
//! that only through its own API server, not when the CRD is written directly).
//!
//! The known objects come from the admissions this process has allowed (and forgets on DELETE
//! reviews); in-cluster they can also be seeded from a list.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::Deserialize;

use crate::admission::{Incoming, Meta, Operation, Response, ReviewError};
use crate::ipset::{IpRange, IpSet, RangeSyntax, parse_ip_spec_with};
use crate::overlap::RangeIndex;

pub const KUBE_OVN_GROUP: &str = "kubeovn.io";
pub const CALICO_GROUPS: [&str; 2] = ["crd.projectcalico.org", "projectcalico.org"];
/// Kube-OVN's default VPC.
pub const DEFAULT_VPC: &str = "ovn-cluster";

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
struct CalicoPoolSpec {
    #[serde(default)]
    cidr: String,
}

/// The CIDRs of the Subnets (per VPC) and Calico IPPools known to this process.
#[derive(Default)]
pub struct NetworkRegistry {
    subnets: Mutex<HashMap<String, RangeIndex<String>>>,
    calico: Mutex<RangeIndex<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl NetworkRegistry {
    pub fn record_subnet(&self, vpc: &str, name: &str, cidrs: &IpSet) {
        let mut subnets = lock(&self.subnets);
        for index in subnets.values_mut() {
            index.remove(&name.to_string());
        }
        subnets
            .entry(vpc.to_string())
            .or_default()
            .insert_set(cidrs, name.to_string());
    }

    pub fn forget_subnet(&self, name: &str) {
        for index in lock(&self.subnets).values_mut() {
            index.remove(&name.to_string());
        }
    }

    pub fn record_calico_pool(&self, name: &str, cidr: IpRange) {
        let mut calico = lock(&self.calico);
        calico.remove(&name.to_string());
        calico.insert(cidr, name.to_string());
    }

    pub fn forget_calico_pool(&self, name: &str) {
        lock(&self.calico).remove(&name.to_string());
    }
}

/// Parse a CIDR list (`10.16.0.0/16,fd00:10:16::/64`) into whole-network ranges.
fn cidr_block(text: &str) -> Result<IpSet, String> {
    let mut ranges = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let net: ipnet::IpNet = part
            .parse()
            .map_err(|_| format!("{part:?} is not a valid CIDR"))?;
        if net.trunc() != net {
            return Err(format!(
                "{part} has host bits set; did you mean {}?",
                net.trunc()
            ));
        }
        ranges.push(IpRange::from_net_all(&net));
    }
    if ranges.is_empty() {
        return Err("is empty".into());
    }
    Ok(IpSet::from_ranges(ranges))
}

fn name_of(meta: &Meta, incoming: &Incoming<'_>) -> String {
    meta.name
        .clone()
        .or_else(|| incoming.request.name.as_deref().map(str::to_string))
        .unwrap_or_default()
}

/// `/validate` for a Kube-OVN Subnet.
pub fn review_subnet(
    registry: &NetworkRegistry,
    incoming: &Incoming<'_>,
) -> Result<Response, ReviewError> {
    let response = incoming.respond();
    match incoming.request.operation {
        Operation::Delete => {
            if !incoming.dry_run() {
                registry.forget_subnet(incoming.request.name.as_deref().unwrap_or(""));
            }
            return Ok(response);
        }
        Operation::Create | Operation::Update => {}
        Operation::Connect => return Ok(response),
    }
    let Some(subnet) = incoming.object::<Object<SubnetSpec>>(false)? else {
        return Ok(response.deny("a Subnet review must carry request.object"));
    };
    let name = name_of(&subnet.metadata, incoming);
    let cidrs = match cidr_block(&subnet.spec.cidr_block) {
        Ok(cidrs) => cidrs,
        Err(e) => return Ok(response.deny(format!("Subnet {name}: spec.cidrBlock {e}"))),
    };
    if let Some(excluded) = subnet.spec.exclude_ips.as_ref().filter(|e| !e.is_empty()) {
        match parse_ip_spec_with(&excluded.join(","), RangeSyntax::DotDot) {
            Ok(set) if !set.is_subset_of(&cidrs) => {
                return Ok(response.deny(format!(
                    "Subnet {name}: spec.excludeIps {} lies outside spec.cidrBlock {}",
                    set.subtract(&cidrs),
                    subnet.spec.cidr_block
                )));
            }
            Ok(_) => {}
            Err(e) => return Ok(response.deny(format!("Subnet {name}: spec.excludeIps: {e}"))),
        }
    }
    let vpc = subnet
        .spec
        .vpc
        .clone()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| DEFAULT_VPC.to_string());
    {
        let subnets = lock(&registry.subnets);
        if let Some(index) = subnets.get(&vpc)
            && let Some((range, other)) = index.first_overlap_set(&cidrs, Some(&name))
        {
            return Ok(response.deny(format!(
                "Subnet {name} ({}) overlaps Subnet {other} ({}) in VPC {vpc}",
                subnet.spec.cidr_block,
                cidr_text(range)
            )));
        }
    }
    if !incoming.dry_run() {
        registry.record_subnet(&vpc, &name, &cidrs);
    }
    Ok(response)
}

/// `/validate` for a Calico IPPool.
pub fn review_calico_pool(
    registry: &NetworkRegistry,
    incoming: &Incoming<'_>,
) -> Result<Response, ReviewError> {
    let response = incoming.respond();
    match incoming.request.operation {
        Operation::Delete => {
            if !incoming.dry_run() {
                registry.forget_calico_pool(incoming.request.name.as_deref().unwrap_or(""));
            }
            return Ok(response);
        }
        Operation::Create | Operation::Update => {}
        Operation::Connect => return Ok(response),
    }
    let Some(pool) = incoming.object::<Object<CalicoPoolSpec>>(false)? else {
        return Ok(response.deny("a Calico IPPool review must carry request.object"));
    };
    let name = name_of(&pool.metadata, incoming);
    let cidr = match cidr_block(&pool.spec.cidr) {
        Ok(set) if set.ranges().len() == 1 => set.ranges()[0],
        Ok(_) => {
            return Ok(response.deny(format!("Calico IPPool {name}: spec.cidr must be one CIDR")));
        }
        Err(e) => return Ok(response.deny(format!("Calico IPPool {name}: spec.cidr {e}"))),
    };
    if let Some((range, other)) = lock(&registry.calico).first_overlap(&cidr, Some(&name)) {
        return Ok(response.deny(format!(
            "Calico IPPool {name} ({}) overlaps Calico IPPool {other} ({})",
            pool.spec.cidr,
            cidr_text(range)
        )));
    }
    if !incoming.dry_run() {
        registry.record_calico_pool(&name, cidr);
    }
    Ok(response)
}

/// A whole-network range back as CIDR text when it is one, else as a range.
fn cidr_text(range: IpRange) -> String {
    let size = range.len();
    if size.is_power_of_two() && range.start.is_multiple_of(size) {
        let bits = match range.family {
            crate::ipset::Family::V4 => 32,
            crate::ipset::Family::V6 => 128,
        };
        format!("{}/{}", range.first(), bits - size.trailing_zeros())
    } else {
        range.to_string()
    }
}
