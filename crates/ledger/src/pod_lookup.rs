//! Whether the pod of a claim still exists, as the releasing code asks it: in-cluster
//! the webhook's `cluster::pods::PodDirectory` answers, off-cluster [`NoPodList`].

use std::net::IpAddr;

use async_trait::async_trait;

use crate::claim::PodPresence;
use crate::{Claim, LedgerError};

/// Whether the pod of a claim still exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    Live,
    Gone,
    /// The pods cannot be listed from here; why.
    Unknown(String),
}

/// Looks up the pod that holds a claim (in-cluster: the webhook's `cluster::pods::PodDirectory`).
#[async_trait]
pub trait PodLookup: Send + Sync {
    async fn state(&self, claim: &Claim) -> PodState;

    /// Where the pod of a `Terminating` claim is (its namespace/name, and its UID when the
    /// claim has one): gone, still terminating, or running as if never deleted.
    async fn presence(&self, claim: &Claim) -> PodPresence {
        self.state(claim).await.into()
    }

    /// Whether the pod `namespace/name` still exists and runs on (or carries) `ip`, read now:
    /// what a replica asks before refusing an IP its copy of the cluster's pods says that pod
    /// uses, since the copy may lag behind the pod's deletion. `Err` when it cannot tell.
    async fn uses_ip(&self, namespace: &str, name: &str, ip: IpAddr) -> Result<bool, LedgerError> {
        let _ = (namespace, name, ip);
        Ok(true)
    }
}

impl From<PodState> for PodPresence {
    fn from(state: PodState) -> PodPresence {
        match state {
            PodState::Live => PodPresence::Running,
            PodState::Gone => PodPresence::Gone,
            PodState::Unknown(why) => PodPresence::Unknown(why),
        }
    }
}

/// Off-cluster: nothing to ask.
pub struct NoPodList(pub String);

#[async_trait]
impl PodLookup for NoPodList {
    async fn state(&self, _claim: &Claim) -> PodState {
        PodState::Unknown(self.0.clone())
    }
}
