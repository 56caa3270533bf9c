//! One IP, one pod: claim identity and the release lifecycle over real HTTPS with the embedded
//! ledger, each case in the API server's order — `/mutate`, apply the patch, generate the name
//! and the UID, `/validate` — and deletions as the API server sends them (a DELETE review
//! with `options.gracePeriodSeconds` while the pod still runs).

mod common;

use std::time::Duration;

use common::api_order::{admit, delete, mutate_only, next_uid};
use common::*;
use serde_json::{Value, json};

fn label(pod: &Value) -> &str {
    pod["metadata"]["labels"]["ip-webhook.io/allocated-ip"]
        .as_str()
        .unwrap_or("")
}

fn with_annotations(mut pod: Value, annotations: Value) -> Value {
    for (key, value) in annotations.as_object().unwrap() {
        pod["metadata"]["annotations"][key] = value.clone();
    }
    pod
}

fn named(mut pod: Value, name: &str) -> Value {
    pod["metadata"]["name"] = json!(name);
    pod["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("generateName");
    pod
}

async fn server() -> TestServer {
    TestServer::start_with(|c| c.webhook.settings.release_delay = Duration::ZERO).await
}

#[tokio::test]
async fn a_deleted_pod_keeps_its_ip_until_its_grace_has_passed() {
    let server = server().await;
    let web = pod("default", "web", "web-7d4b9c-", Some("10.91.0.1"));
    let first = admit(&server, web.clone()).await.unwrap();
    assert_eq!(label(&first), "10.91.0.1");

    // a dry-run DELETE leaves no trace; a real one starts the 2 s grace
    let dry = server.mutate(&delete(&first, Some(2), true)).await;
    assert_eq!(dry["allowed"], true);
    let deleted = server.mutate(&delete(&first, Some(2), false)).await;
    assert_eq!(deleted["allowed"], true);
    // the second DELETE of the same pod (the kubelet's final one) changes nothing either
    let again = server.mutate(&delete(&first, Some(0), false)).await;
    assert_eq!(again["allowed"], true);

    let refused = admit(&server, web.clone()).await.unwrap_err();
    assert!(
        refused.contains("all 1 allocatable IPs are held (10.91.0.1 by default/web-7d4b9c-"),
        "{refused}"
    );
    // off-cluster the timer alone frees the IP once the grace has passed
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let next = loop {
        match admit(&server, web.clone()).await {
            Ok(next) => break next,
            Err(message) => {
                assert!(tokio::time::Instant::now() < deadline, "{message}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert_eq!(label(&next), "10.91.0.1");
    server.launched.shutdown().await;
}

#[tokio::test]
async fn only_the_pods_own_delete_releases_its_claim() {
    let server = server().await;
    let web = pod("default", "web", "web-7d4b9c-", Some("10.91.1.1"));
    let running = admit(&server, web.clone()).await.unwrap();

    // the same pod without its UID (a forged or stale review)
    let mut no_uid = running.clone();
    no_uid["metadata"].as_object_mut().unwrap().remove("uid");
    // an invented pod whose name starts with the holder's generateName
    let mut invented = pod("default", "web", "web-7d4b9c-", None);
    invented["metadata"]["name"] = json!("web-7d4b9c-zzzzz");
    invented["metadata"]["uid"] = json!("made-up");
    invented["metadata"]["labels"]["ip-webhook.io/allocated-ip"] = json!("10.91.1.1");
    // a copy that carries the token and the IP under another UID
    let mut copy = running.clone();
    copy["metadata"]["uid"] = json!("another-uid");
    for forged in [no_uid, invented, copy] {
        let answer = server.mutate(&delete(&forged, Some(0), false)).await;
        assert_eq!(answer["allowed"], true, "a DELETE is never blocked");
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let refused = admit(&server, web.clone()).await.unwrap_err();
    assert!(
        refused.contains(&format!(
            "10.91.1.1 by default/{}",
            running["metadata"]["name"].as_str().unwrap()
        )),
        "{refused}"
    );
    server.launched.shutdown().await;
}

#[tokio::test]
async fn the_status_marker_is_verified_against_the_ledger() {
    let server = server().await;
    // written by its author with our marker, as if it had been through the webhook
    let forged = with_annotations(
        pod("default", "legacy", "legacy-", None),
        json!({"cni.projectcalico.org/ipAddrs": "[\"10.91.2.10\"]", "ip-webhook.io/status": "mutated"}),
    );
    let stored = admit(&server, forged).await.unwrap();
    assert!(
        stored["metadata"]["annotations"]["ip-webhook.io/claim"].is_string(),
        "recorded as a static IP with a claim token: {stored}"
    );
    assert_eq!(
        stored["metadata"]["annotations"]["cni.projectcalico.org/ipAddrs"], "[\"10.91.2.10\"]",
        "a static IP is never overwritten"
    );
    let refused = admit(
        &server,
        pod("default", "web", "web-7d4b9c-", Some("10.91.2.10")),
    )
    .await
    .unwrap_err();
    assert!(
        refused.contains(&format!(
            "10.91.2.10 by default/{}",
            stored["metadata"]["name"].as_str().unwrap()
        )),
        "{refused}"
    );

    // a copy of the running pod (its token, marker, IP) is a second pod on one IP
    let mut copy = stored.clone();
    copy["metadata"]["name"] = json!("legacy-copy");
    copy["metadata"].as_object_mut().unwrap().remove("uid");
    let refused = admit(&server, copy).await.unwrap_err();
    assert!(
        refused.starts_with("static IP 10.91.2.10 requested by default/legacy-copy is already held by default/legacy-"),
        "{refused}"
    );

    // our own patch seen again (reinvocation) is left as it is
    let web = pod("default", "web", "web-7d4b9c-", Some("10.91.2.20"));
    let first = server.mutate(&create(&next_uid("m"), web.clone())).await;
    let patched = apply(&web, &first);
    let reinvoked = server.mutate(&create(&next_uid("m"), patched)).await;
    assert_eq!(reinvoked["allowed"], true);
    assert!(reinvoked["patch"].is_null(), "{reinvoked}");
    server.launched.shutdown().await;
}

#[tokio::test]
async fn siblings_of_one_replicaset_cannot_share_a_static_ip() {
    let server = server().await;
    let sibling = || {
        with_annotations(
            pod("default", "web", "web-7d4b9c-", None),
            json!({"cni.projectcalico.org/ipAddrs": "[\"10.91.3.5\"]"}),
        )
    };
    let first = admit(&server, sibling()).await.unwrap();
    let refused = admit(&server, sibling()).await.unwrap_err();
    assert!(
        refused.starts_with(&format!(
            "static IP 10.91.3.5 requested by default/web-7d4b9c-* is already held by default/{} (app default/web)",
            first["metadata"]["name"].as_str().unwrap()
        )),
        "{refused}"
    );
    // and at /mutate already, before any name exists
    let at_mutate = mutate_only(&server, sibling()).await;
    assert_eq!(at_mutate["allowed"], false);
    server.launched.shutdown().await;
}

#[tokio::test]
async fn a_retried_statefulset_pod_keeps_one_ip() {
    let server = server().await;
    let db0 = || {
        let mut pod = named(
            pod("default", "db", "", Some("10.91.4.1-10.91.4.3")),
            "db-0",
        );
        pod["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "sts", "controller": true
        }]);
        pod
    };
    // three creates that failed after mutation, then one that succeeds
    let mut given = Vec::new();
    for _ in 0..3 {
        let answer = mutate_only(&server, db0()).await;
        assert_eq!(answer["allowed"], true, "{answer}");
        given.push(allocated_ip(&answer));
    }
    let stored = admit(&server, db0()).await.unwrap();
    given.push(label(&stored).to_string());
    assert_eq!(given, ["10.91.4.1"; 4]);
    // the rest of the list is untouched
    let other = admit(
        &server,
        pod("default", "db", "db-other-", Some("10.91.4.1-10.91.4.3")),
    )
    .await
    .unwrap();
    assert_eq!(label(&other), "10.91.4.2");

    // deleted: while its grace runs the old pod exists (the API server would refuse a second
    // db-0 as AlreadyExists), so a create of the name is refused, naming it; once the grace is
    // over the recreated pod gets the same IP
    let deleted = server.mutate(&delete(&stored, Some(2), false)).await;
    assert_eq!(deleted["allowed"], true);
    let early = admit(&server, db0()).await.unwrap_err();
    assert!(
        early.contains("default/db-0") && early.contains("still exists"),
        "{early}"
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let recreated = admit(&server, db0()).await.unwrap();
    assert_eq!(label(&recreated), "10.91.4.1");
    // and the old pod's late release does not free the new pod's IP
    let old_again = server.mutate(&delete(&stored, Some(0), false)).await;
    assert_eq!(old_again["allowed"], true);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let third = admit(
        &server,
        pod("default", "db", "db-third-", Some("10.91.4.1-10.91.4.3")),
    )
    .await
    .unwrap();
    assert_eq!(label(&third), "10.91.4.3");
    server.launched.shutdown().await;
}

#[tokio::test]
async fn ipv6_labels_are_always_valid_label_values() {
    let server = server().await;
    // the subnet-router anycast address fd00:10:: is not handed out
    let first = admit(&server, pod("default", "v6", "v6-", Some("fd00:10::/126")))
        .await
        .unwrap();
    assert_eq!(label(&first), "fd00-10--1");
    // a static IP whose short label form would end in '-' gets the 32-digit form
    let anycast = admit(
        &server,
        with_annotations(
            pod("default", "v6s", "v6s-", None),
            json!({"cni.projectcalico.org/ipAddrs": "[\"fd00:20::\"]"}),
        ),
    )
    .await
    .unwrap();
    assert_eq!(label(&anycast), "fd000020000000000000000000000000");
    // IPv4-mapped IPv6 in a list is refused, saying why, before anything is claimed
    let refused = admit(
        &server,
        pod("default", "mapped", "mapped-", Some("::ffff:10.9.9.9")),
    )
    .await
    .unwrap_err();
    assert!(refused.contains("IPv4-mapped IPv6"), "{refused}");
    server.launched.shutdown().await;
}

/// A DELETE whose grace period is centuries holds the IP for `--max-release-grace` at most
/// (off-cluster the timer alone frees it then), and `status` prints the release time as an
/// RFC 3339 date.
#[tokio::test]
async fn a_huge_grace_period_is_capped_and_status_prints_the_release_date() {
    let server = TestServer::start_with(|c| {
        c.webhook.settings.release_delay = Duration::ZERO;
        c.webhook.settings.max_release_grace = Duration::from_secs(3);
    })
    .await;
    let web = pod("default", "web", "web-7d4b9c-", Some("10.91.9.1"));
    let running = admit(&server, web.clone()).await.unwrap();
    let deleted = server
        .mutate(&delete(&running, Some(i64::MAX), false))
        .await;
    assert_eq!(deleted["allowed"], true);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ip-webhook"))
        .args(["status", "--state-dir"])
        .arg(server.state_dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let release = text
        .split("(release ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or_else(|| panic!("no release time in {text}"));
    let at: jiff::Timestamp = release
        .parse()
        .unwrap_or_else(|e| panic!("{release:?} is no RFC 3339 date: {e}"));
    let from_now = at.as_second() - jiff::Timestamp::now().as_second();
    assert!((0..=4).contains(&from_now), "released {from_now}s from now");

    // held until then, free after
    assert!(admit(&server, web.clone()).await.is_err());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match admit(&server, web.clone()).await {
            Ok(next) => {
                assert_eq!(label(&next), "10.91.9.1");
                break;
            }
            Err(message) => assert!(tokio::time::Instant::now() < deadline, "{message}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.launched.shutdown().await;
}
