//! The IPs a pod carries on one interface, as `/validate` judges them: one rule for the
//! primary interface and for every secondary network.

use std::net::IpAddr;

use crate::decisions::assess::Denial;
use ip_webhook_ipam::allocator::Allocator;
use ip_webhook_ipam::foreign::ForeignUse;
use ip_webhook_ipam::messages::{conflict_message, foreign_message};
use ip_webhook_ledger::pod_lookup::PodLookup;
use ip_webhook_ledger::{Claim, PodRef};

/// The IPs of `ips` that no claim of the pod's (`mine`) covers and that are free for it (`vm`:
/// the pod is a launcher pod of that VM, whose other launcher pods share its IPs); the
/// refusal ([`Denial::Conflict`]) for an IP another holder's claim locks, or that the cluster
/// says a pod outside the ledger uses.
///
/// `ledger_decides`: the review is the pod's CREATE (not a dry run) and the pod carries a
/// claim token, so a `/mutate` granted its IPs, maybe another replica's, whose record this
/// replica's copy may not show yet (nor the release that made the IP free): such an IP is
/// returned as unrecorded, and the write that records it asks the ledger itself. Likewise a
/// pod this replica's copy of the cluster says uses the IP is asked for at the API server
/// (`pods`), which may know it gone.
pub(crate) async fn unrecorded(
    allocator: &Allocator,
    pods: Option<&dyn PodLookup>,
    carried: Carried<'_>,
    ledger_decides: bool,
) -> Result<Vec<IpAddr>, Denial> {
    let Carried { ips, mine, pod, vm } = carried;
    let mut unrecorded = Vec::new();
    for ip in ips {
        if mine.iter().any(|c| c.ip == *ip) {
            continue;
        }
        match allocator.holder(ip) {
            Some(holder) if holder.locks_ip() && !ledger_decides => {
                return Err(Denial::Conflict(conflict_message(ip, pod, &holder)));
            }
            Some(holder) if holder.locks_ip() => unrecorded.push(*ip),
            _ => match allocator.foreign_user(ip, pod, vm) {
                Some(user) if ledger_decides && still_gone(pods, &user, *ip).await => {
                    allocator.foreign_gone(ip, &user);
                    unrecorded.push(*ip)
                }
                Some(user) => return Err(Denial::Conflict(foreign_message(ip, pod, &user))),
                None => unrecorded.push(*ip),
            },
        }
    }
    Ok(unrecorded)
}

/// The IPs a pod carries on one interface, and what it holds of them.
#[derive(Clone, Copy)]
pub(crate) struct Carried<'a> {
    pub(crate) ips: &'a [IpAddr],
    /// The pod's own claims among them.
    pub(crate) mine: &'a [Claim],
    pub(crate) pod: &'a PodRef,
    /// The VM the pod is a launcher pod of.
    pub(crate) vm: Option<&'a str>,
}

/// Whether the API server says `user` no longer uses `ip` (gone, or on other IPs): the copy
/// of the cluster's pods that named it lags.
async fn still_gone(pods: Option<&dyn PodLookup>, user: &ForeignUse, ip: IpAddr) -> bool {
    let Some(pods) = pods else { return false };
    match pods.uses_ip(&user.namespace, &user.name, ip).await {
        Ok(uses) => !uses,
        Err(why) => {
            tracing::warn!(%ip, pod = %format!("{}/{}", user.namespace, user.name), %why, "cannot tell whether a pod still uses an IP; refusing it");
            false
        }
    }
}
