#![forbid(unsafe_code)]
#![warn(unreachable_pub)]
//! The ledger: where claims on IPs are recorded durably. One contract, several adapters.
//!
//! The contract, for the allocator and the cluster tasks above it:
//!
//! - A [`Claim`] is one IP held by one pod (or one KubeVirt VM) of one app. It lives
//!   `Reserved → Bound → Terminating → Released` ([`Phase`]), and every change of it is one of
//!   the rules in [`claim`], which every adapter applies, so no two ledgers disagree.
//! - The [`Ledger`] trait is what an adapter offers: `create` is create-if-absent (a held IP
//!   answers [`CreateOutcome::AlreadyHeld`] with its holder; a retried admission's own record,
//!   [`CreateOutcome::Existing`]), `transition` and `release` change one claim if it is still
//!   the one given, `load` lists what it holds on start. In every adapter but the memory one
//!   (tests, and the copies `explain` and `review` work on), a call that answered `Ok` is
//!   durable: the claim survives a crash of this process.
//! - The adapters: [`MemoryLedger`] (tests), [`EmbeddedLedger`] (a journal in a state dir),
//!   [`KubeLedger`] (`IPClaim` objects through the API server), and `EtcdLedger` (with the
//!   `etcd` feature). [`open()`](fn@open) picks and opens one from a [`LedgerConfig`]; each secondary
//!   network's books are kept apart ([`network`]).
//! - [`crd`] is the custom resources (`IPClaim`, `FixedIPPool`) and the CRDs the chart ships.
//!
//! The allocator keeps the in-memory index and decides; a ledger only has to make one claim
//! durable with create-if-absent semantics, release it, and list what it holds on start.

use std::fmt;
use std::net::IpAddr;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub mod claim;
pub mod crd;
pub mod embedded;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub mod health;
pub mod holder;
pub mod ip_map;
pub mod kubernetes;
pub(crate) mod memory;
pub mod network;
mod open;
pub mod pod_lookup;
mod record;
mod text;
mod timed;

/// The claim every test starts from, shared with the integration tests (whence its `pub`s).
#[cfg(test)]
#[allow(unreachable_pub)]
#[path = "../../../tests/common/claims.rs"]
pub(crate) mod test_claims;
// so that the shared test claims name this crate as every other crate does
#[cfg(test)]
extern crate self as ip_webhook_ledger;

pub use embedded::EmbeddedLedger;
#[cfg(feature = "etcd")]
pub use etcd::EtcdLedger;
pub use kubernetes::KubeLedger;
pub use memory::MemoryLedger;
pub use open::{
    ApiServer, ClusterSource, EtcdOptions, KubeAccess, LedgerConfig, OpenError, OpenOptions,
    Opened, connect, existing_embedded, open,
};
pub use text::{HexId, Shared, Text};
pub use timed::{LedgerLabels, TimedLedger};

/// Lifecycle of a claim: `Reserved → Bound → Terminating → Released` (rules in [`claim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
pub enum Phase {
    /// Recorded at admission; no pod seen yet.
    Reserved,
    /// Tied to a pod UID.
    Bound,
    /// Its pod's DELETE was admitted: the pod may still run for its grace period, so the IP
    /// stays held (`release_at` says until when) and only the same pod name may take it over.
    Terminating,
    /// Given back; kept only as history (which pod name held which IP last), or, when
    /// `sticky`, kept for the same pod name during the sticky grace (a StatefulSet pod).
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

/// The pod a claim belongs to. At admission a `generateName` pod has no name and no UID yet;
/// the claim's `token`, which the pod carries, is what ties the two until the UID is known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default, Hash)]
pub struct PodRef {
    pub namespace: Shared,
    #[serde(default)]
    pub name: Text,
    /// Shared: every pod of a ReplicaSet carries the same one.
    #[serde(default)]
    pub generate_name: Shared,
    #[serde(default)]
    pub uid: Option<Text>,
}

impl PodRef {
    /// `namespace/name`, or `namespace/generateName*` before the name exists.
    pub fn display(&self) -> String {
        self.pod_name().to_string()
    }

    pub(crate) fn pod_name(&self) -> PodName<'_> {
        PodName {
            namespace: &self.namespace,
            name: &self.name,
            generate_name: &self.generate_name,
        }
    }
}

/// A pod as messages name it: `namespace/name`, or `namespace/generateName*` before the name
/// exists. Written only when a message is.
#[derive(Debug, Clone, Copy)]
pub struct PodName<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub generate_name: &'a str,
}

impl fmt::Display for PodName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.name.is_empty() {
            write!(f, "{}/{}*", self.namespace, self.generate_name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// One IP held by one pod of one app.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub ip: IpAddr,
    /// The app's name (value of the app label); empty for a static pod without one.
    pub app: Shared,
    /// The FixedIPPool it was drawn from, if any.
    #[serde(default)]
    pub pool: Option<Shared>,
    pub pod: PodRef,
    /// The admission request that made the claim: a retried admission gets the same answer.
    pub request_uid: HexId,
    pub phase: Phase,
    pub source: Source,
    /// Unix seconds.
    pub created_at: u64,
    pub updated_at: u64,
    /// How many IPs the app's list (or the pool) had when this claim was made, all families
    /// counted (saturating): what `status` reports as the app's size. Absent in records
    /// written before it existed and for static IPs outside any list.
    /// Never zero (a list of no IPs makes no claim; a record's 0 reads as absent): the niche
    /// keeps `Claim` in 168 bytes.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "zero_is_none"
    )]
    pub list_size: Option<NonZeroU64>,
    /// The claim's identity, written on the pod as `ip-webhook.io/claim`: unique per admitted
    /// pod (its IPv4 and IPv6 claims share it). Empty in records written before it existed.
    #[serde(default, skip_serializing_if = "HexId::is_empty")]
    pub token: HexId,
    /// `Terminating`: when the IP may be released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_at: Option<ReleaseAt>,
    /// Kept for the same pod name after its pod went (a StatefulSet pod, in-cluster).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sticky: bool,
    /// The KubeVirt virtual machine (in the pod's namespace) whose launcher pods hold the IP:
    /// the claim is the VM's, not one pod's. A restarted VM's new launcher pod takes it over,
    /// a migration's target pod takes it over while its source still runs the VM (the claim
    /// remembers the source, `holder::VmRef::source`), and it is released only once the VM
    /// is verified gone (`crate::webhook::kubevirt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm: Option<holder::VmRef>,
}

/// When (unix seconds) a `Terminating` claim's IP may be released, in the 4 bytes that keep
/// [`Claim`] in 168 (with its two [`HexId`]s). Written and read as unix seconds: 0 is kept as
/// 1 (both long past), and a time after 2106-02-07 (`u32::MAX`, which only a grace period of
/// more than 80 years reaches) as that day, so the IP waits as it would have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReleaseAt(std::num::NonZeroU32);

impl ReleaseAt {
    pub fn new(unix_seconds: u64) -> ReleaseAt {
        let seconds = u32::try_from(unix_seconds).unwrap_or(u32::MAX);
        ReleaseAt(std::num::NonZeroU32::new(seconds).unwrap_or(std::num::NonZeroU32::MIN))
    }

    /// Unix seconds.
    pub fn get(self) -> u64 {
        u64::from(self.0.get())
    }
}

impl fmt::Display for ReleaseAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.get(), f)
    }
}

impl Serialize for ReleaseAt {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.get())
    }
}

impl<'de> Deserialize<'de> for ReleaseAt {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<ReleaseAt, D::Error> {
        u64::deserialize(deserializer).map(ReleaseAt::new)
    }
}

/// A count written as a number, 0 read as absent.
fn zero_is_none<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<NonZeroU64>, D::Error> {
    let value: Option<u64> = serde::Deserialize::deserialize(deserializer)?;
    Ok(value.and_then(NonZeroU64::new))
}

impl Claim {
    /// Whether a pod holds the IP (any phase but `Released`).
    pub fn is_held(&self) -> bool {
        self.phase != Phase::Released
    }

    /// Whether no other pod may be given the IP: held, or released but kept for its pod name.
    pub fn locks_ip(&self) -> bool {
        self.is_held() || self.sticky
    }

    /// `namespace/app`.
    pub fn app_key(&self) -> String {
        format!("{}/{}", self.pod.namespace, self.app)
    }

    /// Who holds the IP, as status, explain and refusals name it: `vm namespace/name` for a
    /// virtual machine's claim, the pod (`namespace/name`) otherwise.
    pub fn holder(&self) -> String {
        match &self.vm {
            Some(vm) => format!("vm {}/{vm}", self.pod.namespace),
            None => self.pod.display(),
        }
    }

    /// [`Claim::holder`] with what it is: `pod namespace/name` or `vm namespace/name`.
    pub fn named_holder(&self) -> String {
        match &self.vm {
            Some(_) => self.holder(),
            None => format!("pod {}", self.pod.display()),
        }
    }
}

/// Records a ledger could not read (hand-edited, written by something else): skipped by
/// `load` and the watches, treated as holding their IP by `create`; each one logged and
/// counted here (`ip_webhook_ledger_corrupt_records_total`).
pub fn corrupt_records() -> &'static prometheus_client::metrics::counter::Counter {
    static COUNTER: std::sync::OnceLock<prometheus_client::metrics::counter::Counter> =
        std::sync::OnceLock::new();
    COUNTER.get_or_init(Default::default)
}

/// Times a shared ledger's index was reloaded whole (etcd: after a compaction gap, a
/// reconnect, or every `--resync-period`): `ip_webhook_ledger_index_resyncs_total`.
pub fn index_resyncs() -> &'static prometheus_client::metrics::counter::Counter {
    static COUNTER: std::sync::OnceLock<prometheus_client::metrics::counter::Counter> =
        std::sync::OnceLock::new();
    COUNTER.get_or_init(Default::default)
}

/// Log and count a record that could not be read, and say what was done with it.
pub fn skip_corrupt(error: &LedgerError, what: &str) {
    corrupt_records().inc();
    tracing::warn!(%error, "{what}");
}

/// A stand-in for a record that exists on `ip` but cannot be read: it holds the IP (nothing
/// may be written over it) and names itself in refusals.
pub(crate) fn unreadable_holder(ip: IpAddr, record: &str) -> Claim {
    Claim {
        ip,
        app: Shared::default(),
        pool: None,
        pod: PodRef {
            namespace: Shared::default(),
            name: format!("(unreadable ledger record {record})").into(),
            generate_name: Shared::default(),
            uid: None,
        },
        request_uid: HexId::default(),
        phase: Phase::Bound,
        source: Source::Allocated,
        created_at: 0,
        updated_at: 0,
        list_size: None,
        token: HexId::default(),
        release_at: None,
        sticky: false,
        vm: None,
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
    /// The same grant is already recorded (a retried admission whose first answer was lost,
    /// possibly made by another replica): the caller answers with this record.
    Existing(Box<Claim>),
    /// Someone else holds the IP (another replica, or a record the index did not know).
    AlreadyHeld(Box<Claim>),
}

impl CreateOutcome {
    /// The answer to a create that found the same admission's record or the same grant's:
    /// `Created` when it is this very claim (the same admission and token: an earlier
    /// attempt's answer was lost), else `Existing` with the record (another replica recorded
    /// the admission first, or /mutate granted what /validate records), so that the caller's
    /// copy holds the record itself. Every adapter answers so.
    pub(crate) fn for_existing(existing: Claim, new: &Claim) -> CreateOutcome {
        if claim::same_admission(&existing, new) && existing.token == new.token {
            CreateOutcome::Created
        } else {
            CreateOutcome::Existing(Box::new(existing))
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger storage error: {0}")]
    Storage(String),
    #[error("the ledger is shut down")]
    Closed,
    #[error("ledger record for {ip} is corrupt: {reason}")]
    Corrupt { ip: String, reason: String },
    /// A journal or snapshot of the embedded ledger has a damaged stretch with valid records
    /// after it: not the torn write a crash leaves, so the file is not read at all.
    #[error("{0}")]
    Damaged(Box<Damage>),
    /// The embedded ledger's state dir held a ledger, and its files are gone.
    #[error("{0}")]
    Missing(String),
    /// The embedded ledger cannot make room for new records: the file system of `dir` is full.
    #[error(
        "the ledger's disk is full: no room for new records in {dir} ({error}); admissions that need the ledger are refused until space is freed there, then it resumes by itself"
    )]
    DiskFull { dir: String, error: String },
    /// The embedded ledger's writer thread keeps the default scheduling policy: why.
    #[error("{0}")]
    SchedulingPolicy(String),
    /// A pod could not be read from the API server.
    #[error("reading pod {namespace}/{name} failed: {source}")]
    PodRead {
        namespace: String,
        name: String,
        source: Box<kube::Error>,
    },
}

/// Where a ledger file is damaged, and what was found there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// The file.
    pub(crate) path: std::path::PathBuf,
    /// The state dir (for the repair command the message names).
    pub(crate) state_dir: std::path::PathBuf,
    /// Where the damage starts.
    pub(crate) offset: u64,
    pub(crate) found: Found,
}

/// What a damaged ledger file holds at [`Damage::offset`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// Bytes that are no valid record, with valid records after them.
    Stretch {
        /// Valid records after the first damaged stretch.
        records_after: usize,
        /// Damaged stretches in the file, and their bytes.
        stretches: usize,
        damaged_bytes: u64,
    },
    /// A journal's records end here, short of where its acknowledgement mark says the
    /// records answered to admissions reach.
    Lost { acknowledged: u64 },
    /// A snapshot's records end here (or its bytes go on past here), and its header says
    /// it runs to `end` with `records` records: a snapshot is written whole, then renamed.
    Cut { end: u64, records: u64 },
    /// The file's header cannot be read (why).
    Header(String),
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} is damaged at byte {}: ",
            self.path.display(),
            self.offset
        )?;
        match &self.found {
            Found::Stretch {
                records_after,
                stretches,
                damaged_bytes,
            } => write!(
                f,
                "{records_after} valid record(s) follow the damage ({stretches} damaged stretch(es), {damaged_bytes} byte(s)), so it is not a torn write a crash left"
            )?,
            Found::Lost { acknowledged } => write!(
                f,
                "its records end there, but its acknowledgement mark says the records answered to admissions reach byte {acknowledged}; a crash never takes back an answered record (only a write never answered), so they were lost from the disk"
            )?,
            Found::Cut { end, records } if self.offset < *end => write!(
                f,
                "its records end there, but its header says the snapshot holds {records} record(s) up to byte {end}; a snapshot is written whole and then renamed into place, so the rest was lost from the disk"
            )?,
            Found::Cut { end, .. } => write!(
                f,
                "its header says the snapshot ends at byte {end}, and bytes follow; a snapshot is written whole and then renamed into place, so it was changed on the disk"
            )?,
            Found::Header(why) => write!(f, "{why}")?,
        }
        write!(
            f,
            "; the ledger is not read rather than lose claims, and nothing was changed on disk. `ip-webhook ledger repair --state-dir {}` shows what a repair keeps and loses",
            self.state_dir.display()
        )
    }
}

/// A change to a claim that this process learned by watching a shared ledger (another replica
/// wrote it), as opposed to the answers of its own calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObservedChange {
    /// The claim locks its IP: held, or released and kept for its pod name.
    Held(Claim),
    /// The claim was released for good, or its record deleted.
    Released(Claim),
}

/// The contract every state backend keeps.
#[async_trait]
pub trait Ledger: Send + Sync + 'static {
    /// A short name for logs and metrics (`embedded`, `memory`, `kubernetes`, `etcd`).
    fn kind(&self) -> &'static str;

    /// Every claim recorded, held or released (released ones are history).
    async fn load(&self) -> Result<Vec<Claim>, LedgerError>;

    /// [`Ledger::load`], as shared copies: a ledger that keeps its records in memory (the
    /// embedded journal) hands out the very copies it keeps, so that the allocator, which
    /// holds every claim for the life of the process, holds those instead of a second copy.
    async fn load_shared(&self) -> Result<Vec<Arc<Claim>>, LedgerError> {
        Ok(self.load().await?.into_iter().map(Arc::new).collect())
    }

    /// Make `claim` durable unless its IP is held already. Returns only once durable.
    ///
    /// The claim comes shared: a ledger that keeps its records in memory (the embedded
    /// journal) keeps this very copy, the one the allocator holds too, instead of a clone.
    async fn create(&self, claim: Arc<Claim>) -> Result<CreateOutcome, LedgerError>;

    /// Mark the claim on `claim.ip` released, if it is still the one given (same grant:
    /// request and token). Returns whether a record changed.
    async fn release(&self, claim: &Claim) -> Result<bool, LedgerError>;

    /// Replace the record on `next.ip` by `next` (a phase change: bind, terminate, keep) if
    /// the record there is still `current`'s grant and the step is one `claim::may_step`
    /// allows. Returns whether a record changed.
    async fn transition(&self, current: &Claim, next: &Claim) -> Result<bool, LedgerError>;

    /// The record on `ip` as the ledger holds it now (an unreadable one as
    /// `unreadable_holder`): what a replica asks when its copy may lag. Every ledger answers
    /// correctly by default, with a whole [`Ledger::load`]; a shared one reads the one record.
    async fn get(&self, ip: IpAddr) -> Result<Option<Claim>, LedgerError> {
        let claims = self.load().await?;
        Ok(claims.into_iter().rfind(|claim| claim.ip == ip))
    }

    /// Whether other processes write to this ledger too (IPClaims, etcd): then this process's
    /// copy of it may lag behind, and [`Ledger::get`] is worth asking before a decision that a
    /// stale copy would get wrong. An in-process ledger's copy is the ledger.
    fn shared(&self) -> bool {
        false
    }

    /// A cheap call that answers only when the ledger can serve (the readiness prober uses
    /// it while no admission arrives). In-process ledgers always can.
    async fn ping(&self) -> Result<(), LedgerError> {
        Ok(())
    }

    /// Flush and stop; later calls fail with [`LedgerError::Closed`].
    async fn close(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A release time of 0 (a record written by hand, or by a tool) is as long past as 1; one
    /// past what 4 bytes hold waits until the last second they do.
    #[test]
    fn release_times_read_as_written_zero_as_long_past_and_far_ones_as_far() {
        let mut claim =
            serde_json::to_value(unreadable_holder("10.0.0.1".parse().unwrap(), "x")).unwrap();
        for (written, read_as) in [
            (0, 1),
            (1, 1),
            (1_764_400_000u64, 1_764_400_000),
            (u64::from(u32::MAX), u64::from(u32::MAX)),
            (u64::from(u32::MAX) + 1, u64::from(u32::MAX)),
            (u64::MAX, u64::from(u32::MAX)),
        ] {
            claim["release_at"] = serde_json::json!(written);
            let read: Claim = serde_json::from_value(claim.clone()).unwrap();
            assert_eq!(
                read.release_at.map(ReleaseAt::get),
                Some(read_as),
                "{written}"
            );
            assert_eq!(
                serde_json::to_value(&read).unwrap()["release_at"],
                serde_json::json!(read_as)
            );
        }
        claim["release_at"] = serde_json::Value::Null;
        let read: Claim = serde_json::from_value(claim).unwrap();
        assert_eq!(read.release_at, None);
        assert_eq!(ReleaseAt::new(7).to_string(), "7");
    }

    #[test]
    fn a_list_size_of_zero_reads_as_absent() {
        let mut claim =
            serde_json::to_value(unreadable_holder("10.0.0.1".parse().unwrap(), "x")).unwrap();
        claim["list_size"] = serde_json::json!(0);
        let read: Claim = serde_json::from_value(claim.clone()).unwrap();
        assert_eq!(read.list_size, None);
        claim["list_size"] = serde_json::json!(7);
        let read: Claim = serde_json::from_value(claim).unwrap();
        assert_eq!(read.list_size, NonZeroU64::new(7));
    }

    /// The allocator holds every claim for the life of the process, in an `Arc` (16 bytes
    /// more), in mimalloc's 192-byte class (a claim of `String`s, 264 bytes, took the 320-byte
    /// one). At most 168, not 176, so that it stays there under either version of mimalloc.
    /// The `mimalloc` crate asks for every block with its alignment. mimalloc 2, which the
    /// binaries link, serves such a block from its own class; mimalloc 3, the crate's default,
    /// serves a size whose class is not a power of two by
    /// asking for the size plus the alignment less one when the class's current page is full.
    /// There a 184-byte `Arc` still asks within 192 bytes, and a 192-byte one asks for 199 and
    /// lands in the 224-byte class (mimalloc `src/alloc-aligned.c`; docs/performance.md, "A
    /// kept block asks for its alignment"). Its request UID and token in 16 bytes each
    /// ([`HexId`]) fit by its release time in 4 ([`ReleaseAt`]).
    #[test]
    fn a_claim_fits_the_192_byte_class_in_its_arc() {
        assert!(
            std::mem::size_of::<Claim>() <= 168,
            "{}",
            std::mem::size_of::<Claim>()
        );
    }
}
