//! What the reconciler knows of a pod that carries an IP ([`ClaimingPod`]), and the map of them
//! by UID that its passes read ([`PodMap`]).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use super::index::RunningPod;
use ip_webhook_ledger::claim::PodIdentity;

/// The pods that carry an IP, by UID: what a pass reads for every claim. Hashed with
/// foldhash (seeded per process; UIDs are the API server's, not a user's choice): a pass
/// looks up each claim's pod, and SipHash was a fifth of a pass over a few hundred claims.
pub(crate) type PodMap = HashMap<String, ClaimingPod, foldhash::fast::RandomState>;

/// A set hashed as [`PodMap`] is: the sets a pass builds from every claim.
pub(crate) type FastSet<T> = HashSet<T, foldhash::fast::RandomState>;

/// What the reconciler needs to know about a pod; everything else is dropped on arrival.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimingPod {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    /// The IPs the pod carries (`allocated-ip` label, CNI annotations).
    pub(crate) ips: Vec<IpAddr>,
    /// Unix seconds.
    pub(crate) created_at: u64,
    pub(crate) terminating: bool,
    /// Controlled by a StatefulSet: its IP is kept for the same name after it goes.
    pub(crate) stateful: bool,
    /// The app label's value, empty if none.
    pub(crate) app: String,
    /// The claim token it carries (`ip-webhook.io/claim`), if any.
    pub(crate) token: Option<String>,
    /// The KubeVirt VM it is a launcher pod of (`crate::decisions::kubevirt::launcher_vm`).
    pub(crate) vm: Option<String>,
}

impl ClaimingPod {
    /// A pod as the pod-IP index saw it run: its IPs from `status.podIPs`, no claim token.
    pub(crate) fn running(pod: &RunningPod) -> ClaimingPod {
        ClaimingPod {
            namespace: pod.namespace.to_string(),
            name: pod.name.to_string(),
            uid: pod.uid.to_string(),
            ips: pod.ips.to_vec(),
            created_at: pod.created_at,
            terminating: pod.deleting_at.is_some(),
            stateful: pod.controller == Some(super::controller::ControllerKind::StatefulSet),
            app: pod.app.to_string(),
            token: None,
            vm: None,
        }
    }

    pub(crate) fn identity(&self) -> PodIdentity<'_> {
        PodIdentity {
            namespace: &self.namespace,
            name: &self.name,
            uid: Some(&self.uid),
            token: self.token.as_deref(),
        }
    }
}
