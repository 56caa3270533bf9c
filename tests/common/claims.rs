//! The claim every test starts from: change the fields a test is about with struct update
//! syntax, `Claim { request_uid: "r".into(), ..claims::claim("10.0.0.1", "web", "web-0") }`.
#![allow(dead_code)]

use ip_webhook::ledger::{Claim, Phase, PodRef, Source};

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
