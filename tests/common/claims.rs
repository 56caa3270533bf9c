//! The claim every test starts from: change the fields a test is about with struct update
//! syntax, `Claim { request_uid: "r".into(), ..claims::claim("10.0.0.1", "web", "web-0") }`,
//! or by name with [`builder`]: `claims::builder("10.0.0.1", "web", "web-0").request("r")`.
//!
//! The one claim fixture of the project: the integration tests use it as `common::claims`, the
//! unit tests of the ledger, IPAM and root crates as `crate::test_claims` (each `lib.rs`
//! includes this file), and the ledger and allocator benches and `examples/ledger_load.rs`
//! include it by path.
#![allow(dead_code)]

use ip_webhook_ledger::{Claim, Phase, PodRef, Source};

/// A claim as admission makes it: pod `default/{pod}` of app `app`, `Reserved`, allocated from
/// the app's list, request `req-{ip}`, no token, made at unix second 1.
pub fn claim(ip: &str, app: &str, pod: &str) -> Claim {
    Claim {
        ip: ip.parse().unwrap(),
        app: app.into(),
        pool: None,
        pod: pod_ref("default", pod),
        request_uid: format!("req-{ip}").into(),
        phase: Phase::Reserved,
        source: Source::Allocated,
        created_at: 1,
        updated_at: 1,
        list_size: None,
        token: Default::default(),
        release_at: None,
        sticky: false,
        vm: None,
    }
}

/// `namespace/name`, no generateName, no UID.
pub fn pod_ref(namespace: &str, name: &str) -> PodRef {
    PodRef {
        namespace: namespace.into(),
        name: name.into(),
        ..Default::default()
    }
}

/// The claim made at unix second `at` (created and updated).
pub fn at(claim: Claim, at: u64) -> Claim {
    Claim {
        created_at: at,
        updated_at: at,
        ..claim
    }
}

/// A claim `Bound` to the running pod `namespace/pod` with UID `uid`, drawn from a list of 4,
/// made at 2025-11-29T07:06:40Z: what a cluster's ledger holds for a pod that runs.
pub fn bound(ip: &str, namespace: &str, app: &str, pod: &str, uid: &str) -> ClaimBuilder {
    builder(ip, app, pod)
        .namespace(namespace)
        .uid(uid)
        .bound()
        .list_size(4)
        .at(1_764_400_000)
}

/// [`claim`] with the fields a test is about set by name, for tests that build many claims
/// that differ in a few fields:
/// `claims::builder("10.0.0.1", "web", "web-0").uid("u1").bound().at(T0).build()`.
pub fn builder(ip: &str, app: &str, pod: &str) -> ClaimBuilder {
    ClaimBuilder(claim(ip, app, pod))
}

/// A claim under construction; see [`builder`]. Each method sets one field (or, [`Self::at`],
/// both times).
pub struct ClaimBuilder(Claim);

impl ClaimBuilder {
    /// The pod's namespace (the name stays).
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.0.pod.namespace = namespace.into();
        self
    }

    pub fn generate_name(mut self, generate_name: &str) -> Self {
        self.0.pod.generate_name = generate_name.into();
        self
    }

    /// The pod's UID.
    pub fn uid(mut self, uid: &str) -> Self {
        self.0.pod.uid = Some(uid.into());
        self
    }

    /// The admission request's UID.
    pub fn request(mut self, request_uid: &str) -> Self {
        self.0.request_uid = request_uid.into();
        self
    }

    pub fn token(mut self, token: &str) -> Self {
        self.0.token = token.into();
        self
    }

    /// The FixedIPPool the IP was drawn from.
    pub fn pool(mut self, pool: &str) -> Self {
        self.0.pool = Some(pool.into());
        self
    }

    pub fn phase(mut self, phase: Phase) -> Self {
        self.0.phase = phase;
        self
    }

    pub fn bound(self) -> Self {
        self.phase(Phase::Bound)
    }

    pub fn source(mut self, source: Source) -> Self {
        self.0.source = source;
        self
    }

    /// The size of the list or pool the IP came from (none for 0).
    pub fn list_size(mut self, size: u64) -> Self {
        self.0.list_size = std::num::NonZeroU64::new(size);
        self
    }

    /// Made at unix second `at` (created and updated).
    pub fn at(self, at: u64) -> Self {
        ClaimBuilder(self::at(self.0, at))
    }

    pub fn build(self) -> Claim {
        self.0
    }
}
