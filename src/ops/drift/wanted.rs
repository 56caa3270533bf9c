//! Which of the cluster's plain pods and CNI records `check --drift` keeps: the ones that can
//! change a finding of [`super::compare`]. Every other one is counted and dropped as its page
//! is read, so what the command holds grows with the claims, the lists and the pods that carry
//! our or the CNIs' marks, not with the cluster.
//!
//! A plain pod (one that carries none of our or the CNIs' labels and annotations) enters a
//! finding in three ways only, each keyed on something known before the pods are read:
//! - a held claim names it by namespace and UID (kinds 1 and 3: the claim has its pod);
//! - it runs on an IP that is listed (an app's list, a FixedIPPool) or claimed (kind 2);
//! - a kept CNI record names it by namespace and name (kind 4: the record's pod exists).
//!
//! A CNI record enters one only when its IP is listed or claimed (kind 4). The lists written
//! on pods are the one input known only once every pod is read; [`super::fetch::read`] reads
//! again for the IPs only those lists add.

use std::collections::{HashMap, HashSet};

use super::{CniHold, PlainPod};
use ip_webhook_ipam::ipset::IpSet;
use ip_webhook_ledger::Claim;

/// What a plain pod or a CNI record must touch to be kept.
#[derive(Debug, Default)]
pub(crate) struct Wanted {
    /// The listed and claimed IPs.
    ips: IpSet,
    /// The pods held claims name: namespace → UIDs.
    claim_pods: HashMap<Box<str>, HashSet<Box<str>>>,
    /// The pods the kept CNI records name: namespace → names.
    named: HashMap<Box<str>, HashSet<Box<str>>>,
}

impl Wanted {
    /// Keep what touches `listed` or the held `claims` (their IPs, and their pods by UID).
    pub(crate) fn new(claims: &[Claim], listed: &IpSet) -> Wanted {
        let held = || claims.iter().filter(|c| c.is_held());
        let mut claim_pods: HashMap<Box<str>, HashSet<Box<str>>> = HashMap::new();
        for claim in held() {
            if let Some(uid) = claim.pod.uid.as_deref() {
                claim_pods
                    .entry(claim.pod.namespace.as_str().into())
                    .or_default()
                    .insert(uid.into());
            }
        }
        Wanted {
            ips: listed.union(&IpSet::from_ips(held().map(|c| c.ip))),
            claim_pods,
            named: HashMap::new(),
        }
    }

    /// Keep what touches `ips` only: the second read, for the IPs only pods' lists add (the
    /// claims' pods were kept by the first).
    pub(crate) fn ips_only(ips: IpSet) -> Wanted {
        Wanted {
            ips,
            ..Wanted::default()
        }
    }

    /// The listed and claimed IPs this keeps what touches.
    pub(crate) fn ips(&self) -> &IpSet {
        &self.ips
    }

    /// Whether `hold` is kept; a kept one's pod is then kept too, to say it exists.
    pub(crate) fn keep_hold(&mut self, hold: &CniHold) -> bool {
        if !self.ips.contains(&hold.ip) {
            return false;
        }
        self.named
            .entry(hold.namespace.as_str().into())
            .or_default()
            .insert(hold.pod.as_str().into());
        true
    }

    /// Whether the plain pod `pod` is kept.
    pub(crate) fn keeps(&self, pod: &PlainPod) -> bool {
        let (namespace, name, uid) = pod.identity();
        let has = |map: &HashMap<Box<str>, HashSet<Box<str>>>, key: &str| {
            map.get(namespace).is_some_and(|keys| keys.contains(key))
        };
        has(&self.claim_pods, uid)
            || has(&self.named, name)
            || matches!(pod, PlainPod::Running(slim) if slim.ips.iter().any(|ip| self.ips.contains(ip)))
    }
}
