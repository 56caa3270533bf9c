//! The IPs a pod carries on one interface, as `/validate` judges them: one rule for the
//! primary interface and for every secondary network.

use std::net::IpAddr;

use crate::ipam::allocator::Allocator;
use crate::ipam::messages::conflict_message;
use crate::ledger::{Claim, PodRef};

/// The IPs of `ips` that no claim of the pod's (`mine`) covers and that are free for it (`vm`:
/// the pod is a launcher pod of that VM, whose other launcher pods share its IPs); the
/// refusal's message for an IP another holder's claim locks, or that the cluster says a pod
/// outside the ledger uses.
///
/// `ledger_decides`: the review is the pod's CREATE (not a dry run) and the pod carries a
/// claim token, so a `/mutate` granted its IPs, maybe another replica's, whose record this
/// replica's copy may not show yet (nor the release that made the IP free): such an IP is
/// returned as unrecorded, and the write that records it asks the ledger itself.
pub fn unrecorded(
    allocator: &Allocator,
    ips: &[IpAddr],
    mine: &[Claim],
    pod: &PodRef,
    vm: Option<&str>,
    ledger_decides: bool,
) -> Result<Vec<IpAddr>, String> {
    let mut unrecorded = Vec::new();
    for ip in ips {
        if mine.iter().any(|c| c.ip == *ip) {
            continue;
        }
        match allocator.holder(ip) {
            Some(holder) if holder.locks_ip() && !ledger_decides => {
                return Err(conflict_message(ip, pod, &holder));
            }
            Some(holder) if holder.locks_ip() => unrecorded.push(*ip),
            _ => match allocator.foreign_conflict(ip, pod, vm) {
                Some(message) => return Err(message),
                None => unrecorded.push(*ip),
            },
        }
    }
    Ok(unrecorded)
}
