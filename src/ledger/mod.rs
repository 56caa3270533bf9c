//! The ledger: where claims on IPs are recorded durably. One contract, several adapters.
//!
//! The allocator keeps the in-memory index and decides; a ledger only has to make one claim
//! durable with create-if-absent semantics, release it, and list what it holds on start.

use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub mod embedded;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod kubernetes;
pub mod memory;
pub mod timed;

pub use embedded::EmbeddedLedger;
#[cfg(feature = "etcd")]
pub use etcd::{EtcdLedger, EtcdOptions};
pub use kubernetes::KubeLedger;
pub use memory::MemoryLedger;
pub use timed::TimedLedger;

/// Lifecycle of a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
pub enum Phase {
    /// Recorded at admission; no pod seen yet.
    Reserved,
    /// Tied to a pod UID.
    Bound,
    /// Given back; kept only as history (which pod name held which IP last).
    Released,
}

/// Why the pod holds the IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
pub enum Source {
    /// Chosen by ip-webhook from the app's list or pool.
    Allocated,
    /// Written on the pod by hand (`cni.projectcalico.org/ipAddrs`, `ovn.kubernetes.io/ip_address`).
    Static,
}

/// The pod a claim belongs to. At admission a `generateName` pod has no name and no UID yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default, Hash)]
pub struct PodRef {
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub generate_name: String,
    #[serde(default)]
    pub uid: Option<String>,
}

impl PodRef {
    /// Whether a pod seen later (with its final name and maybe its UID) is this one.
    pub fn matches(&self, namespace: &str, name: &str, uid: Option<&str>) -> bool {
        if self.namespace != namespace {
            return false;
        }
        if let (Some(mine), Some(theirs)) = (self.uid.as_deref(), uid) {
            return mine == theirs;
        }
        if !self.name.is_empty() {
            return self.name == name;
        }
        !self.generate_name.is_empty() && name.starts_with(&self.generate_name)
    }

    /// `namespace/name`, or `namespace/generateName*` before the name exists.
    pub fn display(&self) -> String {
        if self.name.is_empty() {
            format!("{}/{}*", self.namespace, self.generate_name)
        } else {
            format!("{}/{}", self.namespace, self.name)
        }
    }
}

/// One IP held by one pod of one app.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub ip: IpAddr,
    /// The app's name (value of the app label); empty for a static pod without one.
    pub app: String,
    /// The IPPool it was drawn from, if any.
    #[serde(default)]
    pub pool: Option<String>,
    pub pod: PodRef,
    /// The admission request that made the claim: a retried admission gets the same answer.
    pub request_uid: String,
    pub phase: Phase,
    pub source: Source,
    /// Unix seconds.
    pub created_at: u64,
    pub updated_at: u64,
    /// How many IPs the app's list (or the pool) had when this claim was made, all families
    /// counted (saturating): what `status` reports as the app's size. Absent in records
    /// written before it existed and for static IPs outside any list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list_size: Option<u64>,
}

impl Claim {
    pub fn is_held(&self) -> bool {
        self.phase != Phase::Released
    }

    /// `namespace/app`.
    pub fn app_key(&self) -> String {
        format!("{}/{}", self.pod.namespace, self.app)
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What `create` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOutcome {
    Created,
    /// Someone else holds the IP (another replica, or a record the index did not know).
    AlreadyHeld(Box<Claim>),
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger storage error: {0}")]
    Storage(String),
    #[error("the ledger is shut down")]
    Closed,
    #[error("ledger record for {ip} is corrupt: {reason}")]
    Corrupt { ip: String, reason: String },
}

/// A change to a claim that this process learned by watching a shared ledger (another replica
/// wrote it), as opposed to the answers of its own calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObservedChange {
    /// The claim is held.
    Held(Claim),
    /// The claim was released, or its record deleted.
    Released(Claim),
}

/// The contract every state backend keeps.
#[async_trait]
pub trait Ledger: Send + Sync + 'static {
    /// A short name for logs and metrics (`embedded`, `memory`, `kubernetes`, `etcd`).
    fn kind(&self) -> &'static str;

    /// Every claim recorded, held or released (released ones are history).
    async fn load(&self) -> Result<Vec<Claim>, LedgerError>;

    /// Make `claim` durable unless its IP is held already. Returns only once durable.
    async fn create(&self, claim: &Claim) -> Result<CreateOutcome, LedgerError>;

    /// Mark the claim on `claim.ip` released, if it is still the one given (same pod and
    /// request). Returns whether a record changed.
    async fn release(&self, claim: &Claim) -> Result<bool, LedgerError>;

    /// Flush and stop; later calls fail with [`LedgerError::Closed`].
    async fn close(&self) {}
}
