//! The claim rules, in one place: which pod holds a claim, when a create may write over a
//! record, and which phase changes are allowed. Every ledger adapter and the allocator call
//! these, so no two of them can disagree.
//!
//! A claim's identity is its **token** (`ip-webhook.io/claim` on the pod, unique per admitted
//! pod) until the pod's UID is known, and the UID after that. Names are compared only for
//! fixed names (a StatefulSet's `db-0`); a `generateName` prefix never identifies a pod.
//!
//! ```
//! use ip_webhook_ledger::claim::{self, PodIdentity};
//! use ip_webhook_ledger::{Claim, Phase, PodRef, Source};
//!
//! // What /mutate records for a generateName pod: no name, no UID, a fresh token.
//! let token = claim::new_token("admission-request-1");
//! let reserved = Claim {
//!     ip: "10.0.0.7".parse().unwrap(),
//!     app: "web".into(),
//!     pool: None,
//!     pod: PodRef { namespace: "shop".into(), generate_name: "web-".into(), ..Default::default() },
//!     request_uid: "admission-request-1".into(),
//!     phase: Phase::Reserved,
//!     source: Source::Allocated,
//!     created_at: 0,
//!     updated_at: 0,
//!     list_size: None,
//!     token: token.as_str().into(),
//!     release_at: None,
//!     sticky: false,
//!     vm: None,
//! };
//! let pod = PodIdentity { namespace: "shop", name: "web-x7k2p", uid: Some("uid-1"), token: Some(&token) };
//! assert!(claim::held_by(&reserved, &pod));
//! // Before the UID is bound, the token is the identity: a pod without it is not the holder.
//! assert!(!claim::held_by(&reserved, &PodIdentity { token: None, ..pod }));
//!
//! // Once bound, only that UID holds it, token or not: a copy of the pod does not.
//! let bound = claim::bound(&reserved, "web-x7k2p", "uid-1", 1);
//! assert_eq!(bound.phase, Phase::Bound);
//! assert!(!claim::held_by(&bound, &PodIdentity { uid: Some("uid-2"), ..pod }));
//!
//! // A released StatefulSet claim still locks its IP for its pod name.
//! let sticky = Claim { sticky: true, ..bound.clone() };
//! assert!(claim::released(&sticky, 2).locks_ip());
//! assert!(!claim::released(&bound, 2).locks_ip());
//! ```

use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{LazyLock, OnceLock};

use super::holder::{Carrier, VmRef};
use super::{Claim, HexId, Phase, Text};

/// A pod as a review, a watch or a lookup shows it.
#[derive(Debug, Clone, Copy, Default)]
pub struct PodIdentity<'a> {
    pub namespace: &'a str,
    /// Empty while a `generateName` pod is being mutated.
    pub name: &'a str,
    /// Absent at mutation; set by the API server before validation.
    pub uid: Option<&'a str>,
    /// The claim token the pod carries, if any.
    pub token: Option<&'a str>,
}

/// Whether `pod` is the pod that holds `claim`.
///
/// - Once the claim knows its pod's UID, only that UID matches: a pod without one (being
///   mutated, or a forged review) or with another (a copy, a recreated pod) does not.
/// - Before that, the pod must carry the claim's token; a claim made for a fixed name also
///   needs that name (a copy of the pod under another name does not match).
/// - A record written before tokens existed matches its exact, non-empty pod name only.
pub fn held_by(claim: &Claim, pod: &PodIdentity<'_>) -> bool {
    if claim.pod.namespace != pod.namespace {
        return false;
    }
    match (claim.pod.uid.as_deref(), pod.uid) {
        (Some(mine), Some(theirs)) => return mine == theirs,
        (Some(_), None) => return false,
        (None, _) => {}
    }
    let name_fits = claim.pod.name.is_empty() || pod.name.is_empty() || claim.pod.name == pod.name;
    if !claim.token.is_empty() {
        return pod.token.is_some_and(|token| claim.token == *token) && name_fits;
    }
    !claim.pod.name.is_empty() && claim.pod.name == pod.name
}

/// Whether two records come from one admission request (a retry whose answer was lost).
pub fn same_admission(a: &Claim, b: &Claim) -> bool {
    !a.request_uid.is_empty()
        && a.request_uid == b.request_uid
        && a.pod.namespace == b.pod.namespace
}

/// Whether two records carry one grant's token: the IPs a pod's /mutate was granted, recorded
/// again by its /validate (another admission request, which may reach a replica whose copy of
/// the ledger has not shown the grant yet).
pub(crate) fn same_token(a: &Claim, b: &Claim) -> bool {
    !a.token.is_empty() && a.token == b.token && a.pod.namespace == b.pod.namespace
}

/// Whether `record` is still the grant `given` was (same admission, same token): the
/// condition for releasing it or changing its phase.
pub fn same_grant(record: &Claim, given: &Claim) -> bool {
    same_admission(record, given) && record.token == given.token
}

/// Whether an admission of a fixed-name pod may take over `existing`: a claim of the same
/// namespace, pod name and app that no live pod of that name can still be using as its own —
/// a reservation whose create failed (quota, another webhook), a pod whose deletion was
/// admitted, or a released record. The API server allows one pod per name, so the new pod is
/// the only one that can carry it from now on.
pub fn may_take_over(existing: &Claim, new: &Claim) -> bool {
    if new.vm.is_some() || existing.vm.is_some() {
        return same_virtual_machine(existing, new);
    }
    !new.pod.name.is_empty()
        && existing.pod.namespace == new.pod.namespace
        && existing.pod.name == new.pod.name
        && existing.app == new.app
        && matches!(
            existing.phase,
            Phase::Reserved | Phase::Terminating | Phase::Released
        )
}

/// Whether `new`, an admission of a virtual machine's launcher pod, may take over `existing`:
/// a claim of the same VM (namespace and name) and app, in any phase. KubeVirt runs one
/// VirtualMachineInstance per VM and one launcher pod per VMI, but for a live migration's
/// target pod, which must come up on the IP the source pod still runs on: the claim moves to
/// the newest launcher pod, and the source's DELETE, whose token and UID it no longer names,
/// frees nothing. Only pods the KubeVirt controller creates are taken for launcher pods
/// (`crate::webhook::kubevirt`).
pub fn same_virtual_machine(existing: &Claim, new: &Claim) -> bool {
    new.vm.is_some()
        && existing.vm.as_deref() == new.vm.as_deref()
        && existing.pod.namespace == new.pod.namespace
        && existing.app == new.app
}

/// The launcher pods a live migration's target takes its VM's claim `existing` from: each
/// that may still run the VM on the IP. Those the claim remembers, and the claim's own pod
/// while no DELETE of it was seen (`Reserved` or `Bound`). The reviews do not say which of
/// them runs the VM (a finished migration's source, like a failed target, stays until it is
/// deleted), so every one is kept until its DELETE. Oldest first.
pub fn migration_sources(existing: &Claim) -> Vec<Carrier> {
    let mut sources = existing
        .vm
        .as_ref()
        .map(|vm| vm.sources().to_vec())
        .unwrap_or_default();
    if matches!(existing.phase, Phase::Reserved | Phase::Bound) {
        let own = Carrier {
            name: existing.pod.name.clone(),
            uid: existing.pod.uid.clone(),
            token: existing.token.to_string().into(),
        };
        sources.retain(|source| !source.is(own.uid.as_deref(), Some(&own.token)));
        sources.push(own);
    }
    sources
}

/// A VM's `claim` once the launcher pod with this UID and token, one of the sources it
/// remembers, is deleted: the others (and the claim's own pod) hold it on.
pub fn source_gone(claim: &Claim, uid: Option<&str>, token: Option<&str>, now: u64) -> Claim {
    let mut next = claim.clone();
    next.vm = claim.vm.as_ref().map(|vm| {
        let left = vm.sources().iter().filter(|s| !s.is(uid, token)).cloned();
        vm.with_sources(left.collect())
    });
    next.updated_at = now;
    next
}

/// A VM's `claim` once its own pod, a migration's target, is deleted while other launcher
/// pods it remembers may still run the VM (the migration failed): the claim is the newest of
/// them, as it was before the target took it over. `None` when it remembers none.
pub fn back_to_source(claim: &Claim, now: u64) -> Option<Claim> {
    let vm = claim.vm.as_ref()?;
    let (newest, older) = vm.sources().split_last()?;
    let mut next = claim.clone();
    next.vm = Some(vm.with_sources(older.to_vec()));
    next.pod.name = newest.name.clone();
    next.pod.uid = newest.uid.clone();
    next.updated_at = now;
    Some(next)
}

/// Whether `next` is what a DELETE of one of a VM's launcher pods makes of `record`
/// ([`source_gone`], [`back_to_source`]): one of its pods (the claim's own, or one it
/// remembers) is gone from it, the newest remembered one holding it when its own went; its
/// phase stays.
fn is_carrier_step(record: &Claim, next: &Claim) -> bool {
    let (Some(before), Some(after)) = (record.vm.as_ref(), next.vm.as_ref()) else {
        return false;
    };
    let pods = |claim: &Claim, vm: &VmRef| -> Vec<(Text, Option<Text>)> {
        vm.sources()
            .iter()
            .map(|s| (s.name.clone(), s.uid.clone()))
            .chain([(claim.pod.name.clone(), claim.pod.uid.clone())])
            .collect()
    };
    let (was, now) = (pods(record, before), pods(next, after));
    // `now` is `was` with the one element at the first place they differ taken out
    let gone = was.iter().zip(&now).take_while(|(a, b)| a == b).count();
    let one_gone = was.len() == now.len() + 1 && was[gone + 1..] == now[gone..];
    matches!(record.phase, Phase::Reserved | Phase::Bound)
        && next.phase == record.phase
        && before.name() == after.name()
        && next.pod.namespace == record.pod.namespace
        && next.pod.generate_name == record.pod.generate_name
        && one_gone
}

/// What a ledger does with `create(new)` given the record it holds on that IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CreateRule {
    /// Write `new` (no record, a released one, or a takeover).
    Write,
    /// The same admission already holds it: answer with the record, write nothing.
    Existing,
    /// Another pod holds it.
    Held,
}

pub(crate) fn create_rule(existing: Option<&Claim>, new: &Claim) -> CreateRule {
    match existing {
        None => CreateRule::Write,
        Some(existing) if existing.is_held() && same_admission(existing, new) => {
            CreateRule::Existing
        }
        // The pod's own grant: it answers. A takeover would delete it and write anew, and any
        // other create in between would be given the IP the pod already carries. Once bound,
        // the grant is its pod's UID's: a copy carrying the token is another pod.
        Some(existing)
            if existing.is_held()
                && same_token(existing, new)
                && existing
                    .pod
                    .uid
                    .as_ref()
                    .is_none_or(|uid| new.pod.uid.as_ref() == Some(uid)) =>
        {
            CreateRule::Existing
        }
        Some(existing) if !existing.locks_ip() => CreateRule::Write,
        Some(existing) if may_take_over(existing, new) => CreateRule::Write,
        Some(_) => CreateRule::Held,
    }
}

/// Whether `record` may be replaced by `next` in a phase change made by the holder of
/// `given`: the record must still be that grant, and the step one of
/// `Reserved → Bound`, `Reserved|Bound → Terminating`, `Terminating → Bound` (a deletion that
/// did not happen). A deletion already seen is not applied twice.
pub(crate) fn may_step(record: &Claim, given: &Claim, next: &Claim) -> bool {
    let step_allowed = matches!(
        (record.phase, next.phase),
        (Phase::Reserved, Phase::Bound)
            | (Phase::Reserved, Phase::Terminating)
            | (Phase::Bound, Phase::Terminating)
            | (Phase::Terminating, Phase::Bound)
    );
    let same_pod = record
        .pod
        .uid
        .as_ref()
        .is_none_or(|uid| next.pod.uid.as_ref() == Some(uid));
    ((step_allowed && same_pod) || is_carrier_step(record, next))
        && same_grant(record, given)
        && next.ip == record.ip
        && same_grant(record, next)
}

/// What a phase change made by the holder of `given` writes over `record`, in every ledger:
/// `None` unless [`may_step`] allows it; else `record` with the fields the caller changed
/// (those where `next` differs from `given`) and the record's own for the rest. `given` may
/// lag the record (a replica's copy of a shared ledger, behind another replica's or the
/// reconciler's bind), and a field the caller did not mean to change (`sticky`, the pod's UID,
/// a VM's sources) must not go back to the copy's older value.
pub(crate) fn step_of(record: &Claim, given: &Claim, next: &Claim) -> Option<Claim> {
    if !may_step(record, given, next) {
        return None;
    }
    let mut written = record.clone();
    if next.phase != given.phase {
        written.phase = next.phase;
    }
    if next.pod.name != given.pod.name {
        written.pod.name = next.pod.name.clone();
    }
    if next.pod.uid != given.pod.uid {
        written.pod.uid = next.pod.uid.clone();
    }
    if next.sticky != given.sticky {
        written.sticky = next.sticky;
    }
    if next.vm != given.vm {
        written.vm = next.vm.clone();
    }
    if next.release_at != given.release_at {
        written.release_at = next.release_at;
    }
    written.updated_at = next.updated_at;
    Some(written)
}

/// `claim` tied to the pod's final name and UID.
pub fn bound(claim: &Claim, name: &str, uid: &str, now: u64) -> Claim {
    let mut next = claim.clone();
    next.phase = Phase::Bound;
    if next.pod.name.is_empty() {
        next.pod.name = name.into();
    }
    next.pod.uid = Some(uid.into());
    next.release_at = None;
    next.updated_at = now;
    next
}

/// `claim` once its pod's DELETE is admitted: held until `release_at`.
pub fn terminating(claim: &Claim, pod: &PodIdentity<'_>, release_at: u64, now: u64) -> Claim {
    let mut next = claim.clone();
    next.phase = Phase::Terminating;
    if next.pod.name.is_empty() {
        next.pod.name = pod.name.into();
    }
    if next.pod.uid.is_none() {
        next.pod.uid = pod.uid.map(Text::from);
    }
    next.release_at = Some(crate::ReleaseAt::new(release_at));
    next.updated_at = now;
    next
}

/// `claim` given back. A sticky claim (a StatefulSet pod's) is kept for its pod name: the
/// record stays `Released` and still locks the IP until it is released once more, when the
/// sticky grace is over ((the webhook's `cluster::lifecycle`) says when). Any other claim becomes
/// history of which pod name held the IP last. (The kubernetes ledger deletes such a record
/// instead.)
pub fn released(claim: &Claim, now: u64) -> Claim {
    let mut next = claim.clone();
    next.sticky = claim.sticky && claim.phase != Phase::Released;
    next.phase = Phase::Released;
    next.release_at = None;
    next.updated_at = now;
    next
}

/// What `release(given)` writes over `record`, in every ledger: [`released`], when the record
/// still locks its IP and is `given`'s grant; `None` leaves it as it is.
///
/// A record already `Released` (kept for its pod name) is released again only when `given`
/// says it is released too: that second release ends the sticky grace. A caller holding an
/// older view (a watch event of the `Terminating` claim that arrived after this replica's
/// own release) would otherwise end the grace the moment it began.
pub(crate) fn release_of(record: &Claim, given: &Claim, now: u64) -> Option<Claim> {
    let older_view = record.phase == Phase::Released && given.phase != Phase::Released;
    (record.locks_ip() && same_grant(record, given) && !older_view).then(|| released(record, now))
}

/// Where a `Terminating` claim's pod is, when its release falls due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodPresence {
    /// No pod of that namespace/name, or one with another UID.
    Gone,
    /// Still there, with its deletion under way (a long grace, a finalizer).
    Terminating,
    /// Still there and not being deleted: the deletion was refused after the webhook
    /// admitted it, or the DELETE review was forged.
    Running,
    /// The lookup failed.
    Unknown(String),
}

/// What to do with a `Terminating` claim whose release time has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DueStep {
    Release,
    /// Back to `Bound`: the pod still runs, so it keeps its IP.
    KeepBound,
    /// Look again later.
    Wait,
}

pub fn due_step(presence: &PodPresence) -> DueStep {
    match presence {
        PodPresence::Gone => DueStep::Release,
        PodPresence::Running => DueStep::KeepBound,
        PodPresence::Terminating | PodPresence::Unknown(_) => DueStep::Wait,
    }
}

/// A fresh claim token: 32 hex digits, unique per call and not to be guessed. The first 16
/// are the request UID's index key ([`uid_key`]), so that the allocator files a grant's
/// request and its token under one key, the one its retry lookup has just read
/// ([`token_key`]). The next 8 count the tokens this process has issued, and the last 8 are a
/// check of the first 24 that only this process can make (a SipHash of them with std's
/// `RandomState`, keyed once per process from the OS's randomness). A token is the claim's
/// identity until the pod's UID is known, so a pod that could guess another pod's pending
/// token could pass for it: that takes the keyed prefix of a request UID it does not see and
/// the keyed check, one pod created per guess. A token is not a secret once written on the pod.
pub fn new_token(request_uid: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let prefix = uid_key(request_uid);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let token =
        u128::from(prefix) << 64 | u128::from(count) << 32 | u128::from(token_check(prefix, count));
    let mut digits = [0u8; 32];
    hex::encode_to_slice(token.to_be_bytes(), &mut digits).expect("32 digits for 16 bytes");
    std::str::from_utf8(&digits)
        .expect("hex digits are ASCII")
        .to_owned()
}

/// The check a token this process issues ends with ([`new_token`]).
fn token_check(prefix: u64, count: u32) -> u32 {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    let mut hasher = KEYS.get_or_init(RandomState::new).build_hasher();
    hasher.write_u64(prefix);
    hasher.write_u32(count);
    hasher.finish() as u32
}

/// The key the allocator indexes a claim under for an admission request's UID or a pod's
/// UID: foldhash, seeded once per process (SipHash took about five times the instructions on
/// a 36-byte UID). Keys are an index's, never an identity: readers check each claim's own
/// fields, so two strings that share a key cost a filter, never a wrong answer.
pub fn uid_key(uid: &str) -> u64 {
    static HASHER: LazyLock<foldhash::fast::RandomState> = LazyLock::new(Default::default);
    HASHER.hash_one(uid)
}

/// The key the allocator indexes a claim under for its token. A token this process issued
/// (its check holds: [`new_token`]) is keyed by its first 16 digits, its request's
/// [`uid_key`]; any other (another process's, one a pod wrote itself, a record's from before)
/// by its own [`uid_key`]. Digits a pod chooses never pick a key: a thousand tokens that share
/// their first digits land on a thousand keys, not on one.
pub fn token_key(token: &str) -> u64 {
    let mut bytes = [0u8; 16];
    if hex::decode_to_slice(token, &mut bytes).is_ok()
        && let Some(prefix) = issued_prefix(&bytes)
    {
        return prefix;
    }
    uid_key(token)
}

/// [`token_key`] of a claim's token; `None` for the empty one.
pub fn held_token_key(token: &HexId) -> Option<u64> {
    if token.is_empty() {
        return None;
    }
    Some(match token.digits().and_then(issued_prefix) {
        Some(prefix) => prefix,
        None => token.with_str(token_key),
    })
}

/// The request UID's key a token's 16 bytes begin with, if this process issued it (its check
/// holds).
fn issued_prefix(bytes: &[u8; 16]) -> Option<u64> {
    let value = u128::from_be_bytes(*bytes);
    let (prefix, count, check) = ((value >> 64) as u64, (value >> 32) as u32, value as u32);
    (token_check(prefix, count) == check).then_some(prefix)
}

/// Whether `text` is shaped like a token we issue (so a pod cannot smuggle megabytes in it).
pub fn is_token(text: &str) -> bool {
    text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stale release (a `Terminating` view of a claim already released and kept for its
    /// pod name) leaves the record as it is; a release of the kept claim ends its grace.
    #[test]
    fn a_release_of_an_older_view_does_not_end_the_sticky_grace() {
        let bound = Claim {
            sticky: true,
            ..pod_claim("db-0", Some("uid-0"), "tok", Phase::Bound)
        };
        let terminating = Claim {
            phase: Phase::Terminating,
            release_at: Some(crate::ReleaseAt::new(10)),
            ..bound.clone()
        };
        let kept = release_of(&terminating, &terminating, 11).expect("released");
        assert_eq!(
            (kept.phase, kept.sticky, kept.locks_ip()),
            (Phase::Released, true, true)
        );
        assert_eq!(release_of(&kept, &terminating, 12), None);
        assert_eq!(release_of(&kept, &bound, 12), None);
        let ended = release_of(&kept, &kept, 14).expect("the grace ends");
        assert!(!ended.locks_ip());
    }

    /// A claim of 10.0.0.1 for pod `default/{name}` of app `web` (generateName `web-7d4b9c-`),
    /// by request `req-1` with token `token`, bound to the pod `uid` when given.
    fn pod_claim(name: &str, uid: Option<&str>, token: &str, phase: Phase) -> Claim {
        let claim = crate::test_claims::builder("10.0.0.1", "web", name)
            .generate_name("web-7d4b9c-")
            .request("req-1")
            .token(token)
            .phase(phase);
        match uid {
            Some(uid) => claim.uid(uid).build(),
            None => claim.build(),
        }
    }

    /// A replica whose copy still shows the reservation terminates it after the reconciler
    /// bound it for its StatefulSet pod: the phase and release time change, the binding stays.
    #[test]
    fn a_step_from_a_lagging_copy_changes_only_what_its_caller_changed() {
        let copy = pod_claim("", None, "tok", Phase::Reserved);
        let record = Claim {
            sticky: true,
            ..bound(&copy, "db-0", "uid-db-0", 2)
        };
        let deleting = pod("db-0", Some("uid-db-0"), Some("tok"));
        let next = terminating(&copy, &deleting, 40, 3);
        let written = step_of(&record, &copy, &next).expect("Bound → Terminating");
        assert_eq!(written.phase, Phase::Terminating);
        assert_eq!(written.release_at, Some(crate::ReleaseAt::new(40)));
        assert!(written.sticky, "the reconciler's sticky binding is kept");
        assert_eq!(written.pod.uid.as_deref(), Some("uid-db-0"));
        assert_eq!(written.pod.name, "db-0");
        // the copy's own bind changes what a bind changes
        let fresh = pod_claim("", None, "tok", Phase::Reserved);
        let mut bind = bound(&fresh, "db-0", "uid-db-0", 2);
        bind.sticky = true;
        assert_eq!(step_of(&fresh, &fresh, &bind), Some(bind));
        // and a step the rules refuse writes nothing
        assert_eq!(
            step_of(&record, &copy, &bound(&copy, "db-0", "uid-x", 4)),
            None
        );
    }

    fn pod<'a>(name: &'a str, uid: Option<&'a str>, token: Option<&'a str>) -> PodIdentity<'a> {
        PodIdentity {
            namespace: "default",
            name,
            uid,
            token,
        }
    }

    #[test]
    fn a_bound_claim_is_held_by_its_uid_only() {
        let c = pod_claim("web-7d4b9c-abcde", Some("u1"), "t1", Phase::Bound);
        assert!(held_by(
            &c,
            &pod("web-7d4b9c-abcde", Some("u1"), Some("t1"))
        ));
        assert!(!held_by(
            &c,
            &pod("web-7d4b9c-abcde", Some("u2"), Some("t1"))
        ));
        // a DELETE review without a UID, or a copy being mutated, is not its pod
        assert!(!held_by(&c, &pod("web-7d4b9c-abcde", None, Some("t1"))));
    }

    #[test]
    fn before_the_uid_the_token_decides_never_the_generate_name() {
        let c = pod_claim("", None, "t1", Phase::Reserved);
        assert!(held_by(&c, &pod("", None, Some("t1"))));
        assert!(held_by(
            &c,
            &pod("web-7d4b9c-zzzzz", Some("u9"), Some("t1"))
        ));
        assert!(!held_by(&c, &pod("web-7d4b9c-zzzzz", Some("u9"), None)));
        assert!(!held_by(&c, &pod("web-7d4b9c-zzzzz", None, Some("t2"))));
        let other_namespace = PodIdentity {
            namespace: "evil",
            ..pod("", None, Some("t1"))
        };
        assert!(!held_by(&c, &other_namespace));
        // a fixed-name claim also needs the name
        let named = pod_claim("db-0", None, "t1", Phase::Reserved);
        assert!(!held_by(&named, &pod("db-copy", None, Some("t1"))));
    }

    #[test]
    fn records_without_a_token_match_their_exact_name_only() {
        let legacy = pod_claim("db-0", None, "", Phase::Reserved);
        assert!(held_by(&legacy, &pod("db-0", Some("u"), None)));
        assert!(!held_by(&legacy, &pod("db-01", Some("u"), None)));
        let legacy_generated = pod_claim("", None, "", Phase::Reserved);
        assert!(!held_by(
            &legacy_generated,
            &pod("web-7d4b9c-abcde", Some("u"), None)
        ));
    }

    #[test]
    fn creates_write_retry_take_over_or_are_refused() {
        let mut new = pod_claim("", None, "t2", Phase::Reserved);
        new.request_uid = "req-2".into();
        assert_eq!(create_rule(None, &new), CreateRule::Write);
        let held = pod_claim("", None, "t1", Phase::Reserved);
        assert_eq!(create_rule(Some(&held), &new), CreateRule::Held);
        let retry = pod_claim("", None, "t-other-replica", Phase::Reserved);
        assert_eq!(create_rule(Some(&held), &retry), CreateRule::Existing);
        let released = pod_claim("", None, "t1", Phase::Released);
        assert_eq!(create_rule(Some(&released), &new), CreateRule::Write);
        let mut kept = released.clone();
        kept.sticky = true;
        assert_eq!(create_rule(Some(&kept), &new), CreateRule::Held);

        // a fixed name takes over its own Reserved/Terminating/kept claim, never a Bound one
        let mut db0 = pod_claim("db-0", None, "t3", Phase::Reserved);
        db0.request_uid = "req-3".into();
        for phase in [Phase::Reserved, Phase::Terminating, Phase::Released] {
            let mut old = pod_claim("db-0", Some("u-old"), "t1", phase);
            old.sticky = true;
            assert_eq!(
                create_rule(Some(&old), &db0),
                CreateRule::Write,
                "{phase:?}"
            );
        }
        let running = pod_claim("db-0", Some("u-old"), "t1", Phase::Bound);
        assert_eq!(create_rule(Some(&running), &db0), CreateRule::Held);
        // /validate recording what /mutate granted (the same token, another request): the
        // grant answers, a takeover by name would delete it
        let mut validated = db0.clone();
        validated.request_uid = "req-validate".into();
        validated.pod.uid = Some("u-new".into());
        assert_eq!(create_rule(Some(&db0), &validated), CreateRule::Existing);
        let mut other_app = pod_claim("db-0", None, "t1", Phase::Reserved);
        other_app.app = "cache".into();
        assert_eq!(create_rule(Some(&other_app), &db0), CreateRule::Held);
    }

    #[test]
    fn a_virtual_machines_launcher_pods_take_its_claim_over_in_any_phase() {
        let vm = |name: &str, token: &str, phase: Phase| Claim {
            vm: Some(name.into()),
            ..pod_claim("", Some("u-source"), token, phase)
        };
        let mut target = vm("db", "t-target", Phase::Reserved);
        target.request_uid = "req-target".into();
        target.pod.uid = None;
        // a restart (Terminating, Released) and a migration (Bound: the source still runs)
        for phase in [
            Phase::Reserved,
            Phase::Bound,
            Phase::Terminating,
            Phase::Released,
        ] {
            let source = vm("db", "t-source", phase);
            assert_eq!(
                create_rule(Some(&source), &target),
                CreateRule::Write,
                "{phase:?}"
            );
        }
        // another VM, another app, another namespace, a pod that is no launcher: held
        let other_vm = vm("cache", "t1", Phase::Bound);
        assert_eq!(create_rule(Some(&other_vm), &target), CreateRule::Held);
        let mut other_app = vm("db", "t1", Phase::Bound);
        other_app.app = "cache".into();
        assert_eq!(create_rule(Some(&other_app), &target), CreateRule::Held);
        let mut elsewhere = vm("db", "t1", Phase::Bound);
        elsewhere.pod.namespace = "prod".into();
        assert_eq!(create_rule(Some(&elsewhere), &target), CreateRule::Held);
        let plain_pod = pod_claim("", Some("u1"), "t1", Phase::Bound);
        assert_eq!(create_rule(Some(&plain_pod), &target), CreateRule::Held);
        let mut plain_new = pod_claim("", None, "t9", Phase::Reserved);
        plain_new.request_uid = "req-9".into();
        assert_eq!(
            create_rule(Some(&vm("db", "t1", Phase::Terminating)), &plain_new),
            CreateRule::Held
        );
    }

    #[test]
    fn phase_steps_follow_the_lifecycle_and_happen_once() {
        let reserved = pod_claim("", None, "t1", Phase::Reserved);
        let bound_claim = bound(&reserved, "web-x", "u1", 5);
        assert!(may_step(&reserved, &reserved, &bound_claim));
        let pod = pod("web-x", Some("u1"), Some("t1"));
        let ending = terminating(&bound_claim, &pod, 40, 6);
        assert_eq!(ending.release_at, Some(crate::ReleaseAt::new(40)));
        assert!(may_step(&bound_claim, &bound_claim, &ending));
        assert!(
            !may_step(&ending, &ending, &ending),
            "a deletion seen twice"
        );
        let back = bound(&ending, "web-x", "u1", 41);
        assert!(may_step(&ending, &ending, &back));
        // a stale view of another grant changes nothing
        let mut stale = reserved.clone();
        stale.token = "t0".into();
        assert!(!may_step(&reserved, &stale, &bound_claim));
        // a bound claim is never rebound to another UID
        let rebind = terminating(&bound(&reserved, "web-x", "u2", 5), &pod, 40, 6);
        assert!(!may_step(&bound_claim, &bound_claim, &rebind));
    }

    #[test]
    fn tokens_are_unique_and_shaped() {
        let a = new_token("r");
        let b = new_token("r");
        assert_ne!(a, b);
        assert!(is_token(&a) && is_token(&b));
        for token in [&a, &b] {
            assert!(
                token
                    .bytes()
                    .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
                "{token} is not lower-case hex"
            );
        }
        assert!(!is_token("x"));
        assert!(!is_token(&"g".repeat(32)));
        // many calls for one request: all distinct, each keyed as its request is
        let many: std::collections::HashSet<String> =
            (0..10_000).map(|_| new_token("same-request")).collect();
        assert_eq!(many.len(), 10_000);
        assert!(many.iter().all(|t| is_token(t) && t[..16] != t[16..]));
        assert!(many.iter().all(|t| token_key(t) == uid_key("same-request")));
        assert_ne!(
            token_key(&new_token("another-request")),
            uid_key("same-request")
        );
    }

    #[test]
    fn only_a_token_this_process_issued_is_keyed_by_its_digits() {
        let ours = new_token("uid-a");
        assert_eq!(ours[..16], format!("{:016x}", uid_key("uid-a")));
        assert_eq!(token_key(&ours), uid_key("uid-a"));
        assert_eq!(token_key(&ours.to_uppercase()), uid_key("uid-a"));
        // its check broken, or its digits chosen by hand: keyed by its hash, as a UID is
        let mut forged = ours.clone();
        let last = if forged.ends_with('0') { "1" } else { "0" };
        forged.replace_range(31.., last);
        assert_eq!(token_key(&forged), uid_key(&forged));
        let chosen: Vec<u64> = (0..1000).map(|n| token_key(&format!("{n:032x}"))).collect();
        assert_eq!(
            chosen
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len(),
            1000,
            "tokens sharing their first digits share no key"
        );
        assert_eq!(token_key("t0"), uid_key("t0"));
        // not 32 hex digits (longer, shorter, odd, 32 bytes of which some are not ASCII):
        // hashed whole, even when our token is inside
        for shaped_otherwise in [
            format!("{ours}{ours}"),
            ours[..30].to_string(),
            ours[..31].to_string(),
            format!("é{}", &ours[..30]),
        ] {
            assert_eq!(
                token_key(&shaped_otherwise),
                uid_key(&shaped_otherwise),
                "{shaped_otherwise}"
            );
        }
        assert_eq!(token_key(&"g".repeat(32)), uid_key(&"g".repeat(32)));
        assert_ne!(uid_key("pod-uid"), uid_key("pod-uie"));
    }

    #[test]
    fn due_releases_wait_for_the_pod_to_be_gone() {
        assert_eq!(due_step(&PodPresence::Gone), DueStep::Release);
        assert_eq!(due_step(&PodPresence::Running), DueStep::KeepBound);
        assert_eq!(due_step(&PodPresence::Terminating), DueStep::Wait);
        assert_eq!(due_step(&PodPresence::Unknown("x".into())), DueStep::Wait);
    }
}
