//! The webhook over real HTTPS on loopback: protocol, mutation, validation, limits.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use ip_webhook_admission::annotations::Cni;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

const FIXTURE: &str = include_str!("fixtures/pod-create-v1.json");

fn fixture() -> Value {
    serde_json::from_str(FIXTURE).unwrap()
}

#[tokio::test]
async fn patch_applied_by_rfc6902_leaves_a_valid_pod() {
    let server = TestServer::start(&[]).await;
    let review = fixture();
    let response = server.mutate(&review).await;
    assert_eq!(response["uid"], review["request"]["uid"]);
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    let patched = apply(&review["request"]["object"], &response);
    let pod: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(patched).expect("still a valid Pod");
    let meta = pod.metadata;
    let annotations = meta.annotations.unwrap();
    assert_eq!(
        annotations["cni.projectcalico.org/ipAddrs"],
        r#"["10.0.0.10"]"#
    );
    assert_eq!(annotations["ip-webhook.io/status"], "mutated");
    assert_eq!(
        annotations["kubectl.kubernetes.io/restartedAt"], "2026-11-01T10:00:00Z",
        "other annotations kept"
    );
    assert_eq!(
        meta.labels.unwrap()["ip-webhook.io/allocated-ip"],
        "10.0.0.10"
    );
    assert_eq!(pod.spec.unwrap().containers[0].name, "web");
}

#[tokio::test]
async fn existing_maps_are_kept_and_ipv6_labels_have_no_colons() {
    let server = TestServer::start_with(|c| c.webhook.settings.cni = Cni::KubeOvn).await;
    let no_labels = pod("default", "db", "db-", Some("fd00::10-fd00::11,10.2.0.5"));
    let response = server.mutate(&create("u-1", no_labels.clone())).await;
    let ops = patch_of(&response);
    assert!(
        !ops.as_array()
            .unwrap()
            .iter()
            .any(|op| op["path"] == "/metadata/annotations"),
        "annotations exist, so the map is not re-created: {ops}"
    );
    let patched = apply(&no_labels, &response);
    assert_eq!(
        patched["metadata"]["annotations"]["ovn.kubernetes.io/ip_address"],
        "10.2.0.5,fd00::10"
    );
    assert_eq!(
        patched["metadata"]["labels"]["ip-webhook.io/allocated-ip"],
        "10.2.0.5"
    );

    // a pod without any labels map but with allocatable IPs is refused for lack of an app
    let mut unlabeled = pod("default", "x", "x-", Some("10.3.0.1"));
    unlabeled["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("labels");
    let response = server.mutate(&create("u-2", unlabeled)).await;
    assert_eq!(response["allowed"], false);
    assert_eq!(
        response["status"]["message"],
        "pod default/x-* asks for fixed IPs but has no \"app\" label; ip-webhook needs it (with the namespace) to know which app the IPs belong to"
    );

    // IPv6-only: the label spells the IP with dashes
    let mut v6 = pod("default", "v6", "v6-", Some("fd00::a"));
    v6["metadata"]["labels"] = json!({"app": "v6"});
    let response = server.mutate(&create("u-3", v6.clone())).await;
    assert_eq!(allocated_ip(&response), "fd00--a");
}

#[tokio::test]
async fn labels_map_is_created_when_absent() {
    let server = TestServer::start_with(|c| c.webhook.settings.app_label = "team".into()).await;
    let mut p = pod("default", "ignored", "p-", Some("10.4.0.1"));
    p["metadata"].as_object_mut().unwrap().remove("labels");
    // the app label is configurable; with no labels at all the pod is refused ...
    let refused = server.mutate(&create("u-1", p.clone())).await;
    assert!(
        refused["status"]["message"]
            .as_str()
            .unwrap()
            .contains("has no \"team\" label")
    );
    // ... and a pod whose only map is annotations gets its labels map created in the patch
    p["metadata"]["labels"] = json!({"team": "t"});
    let response = server.mutate(&create("u-2", p.clone())).await;
    assert_eq!(
        apply(&p, &response)["metadata"]["labels"]["ip-webhook.io/allocated-ip"],
        "10.4.0.1"
    );
}

#[tokio::test]
async fn v1beta1_in_v1beta1_out() {
    let server = TestServer::start(&[]).await;
    let body = FIXTURE.replace("admission.k8s.io/v1", "admission.k8s.io/v1beta1");
    let reply = server.client.post("/mutate", body).await.unwrap();
    let json = reply.json();
    assert_eq!(json["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(json["kind"], "AdmissionReview");
    assert_eq!(
        json["response"]["uid"],
        "705ab4f5-6393-11e8-b7cc-42010a800002"
    );
    assert_eq!(allocated_ip(&json["response"]), "10.0.0.10");
}

#[tokio::test]
async fn dry_run_answers_the_same_patch_and_records_nothing() {
    let server = TestServer::start(&[]).await;
    let p = pod("default", "web", "web-", Some("10.5.0.1-10.5.0.3"));
    let dry = server
        .mutate(&review(
            "v1",
            "dry-1",
            "CREATE",
            Some(p.clone()),
            None,
            true,
        ))
        .await;
    assert_eq!(allocated_ip(&dry), "10.5.0.1");
    assert!(
        server.launched.webhook.allocator.claims().is_empty(),
        "dry run recorded a claim"
    );
    let ledger_claims = server.launched.ledger.load().await.unwrap();
    assert!(
        ledger_claims.is_empty(),
        "dry run wrote to the ledger: {ledger_claims:?}"
    );
    let real = server.mutate(&create("real-1", p.clone())).await;
    // the same patch, but for the claim token: a dry run makes no claim to name
    let without_token = |response: &Value| -> Vec<Value> {
        patch_of(response)
            .as_array()
            .unwrap()
            .iter()
            .filter(|op| op["path"] != "/metadata/annotations/ip-webhook.io~1claim")
            .cloned()
            .collect()
    };
    assert_eq!(without_token(&real), without_token(&dry));
    assert_eq!(server.launched.ledger.load().await.unwrap().len(), 1);
    // a dry run of a request that holds a claim answers with that claim
    let dry_again = server
        .mutate(&review("v1", "real-1", "CREATE", Some(p), None, true))
        .await;
    assert_eq!(patch_of(&dry_again), patch_of(&real));
}

#[tokio::test]
async fn two_hundred_concurrent_creates_get_two_hundred_distinct_ips() {
    let server = TestServer::start(&[]).await;
    let list = "10.7.0.1-10.7.0.200";
    let mut tasks = Vec::new();
    for i in 0..200 {
        let client = server.client.clone();
        let body = create(&format!("uid-{i}"), pod("prod", "api", "api-", Some(list))).to_string();
        tasks.push(tokio::spawn(async move {
            client.post("/mutate", body).await.unwrap().response()
        }));
    }
    let mut ips = HashSet::new();
    for task in tasks {
        let response = task.await.unwrap();
        assert_eq!(response["allowed"], true, "{response}");
        assert!(ips.insert(allocated_ip(&response)), "an IP was given twice");
    }
    assert_eq!(ips.len(), 200);
    let refused = server
        .mutate(&create("uid-200", pod("prod", "api", "api-", Some(list))))
        .await;
    assert_eq!(refused["allowed"], false);
    let message = refused["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "app prod/api: all 200 allocatable IPs are held (10.7.0.1 by prod/api-*, "
        ),
        "{message}"
    );
    assert!(message.ends_with(", and 190 more)"), "{message}");
    let commits = server.launched.webhook.metrics.ledger.commits.get();
    // 4 here since the inbox (the admissions the runtime has ready share a commit);
    // 181-200 when each claim reached the writer on its own
    assert!(
        commits <= 20,
        "200 concurrent claims took {commits} commits: group commit is not batching"
    );
}

#[tokio::test]
async fn reinvocation_and_unrelated_pods_pass_untouched() {
    let server = TestServer::start(&[]).await;
    let plain = pod("default", "web", "web-", None);
    let response = server.mutate(&create("u-2", plain)).await;
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none());
    assert!(server.launched.webhook.allocator.claims().is_empty());

    // our own patch seen again: left as it is
    let web = pod("default", "web", "web-", Some("10.8.0.1-10.8.0.2"));
    let first = server.mutate(&create("u-3", web.clone())).await;
    let reinvoked = server.mutate(&create("u-4", apply(&web, &first))).await;
    assert_eq!(reinvoked["allowed"], true);
    assert!(reinvoked.get("patch").is_none(), "{reinvoked}");
    assert_eq!(server.launched.webhook.allocator.claims().len(), 1);

    // a marker no claim stands behind is not trusted: the pod is given an IP like any other
    let mut forged = pod("default", "web", "web-", Some("10.8.0.1-10.8.0.2"));
    forged["metadata"]["annotations"]["ip-webhook.io/status"] = json!("mutated");
    let response = server.mutate(&create("u-1", forged)).await;
    assert_eq!(response["allowed"], true);
    assert_eq!(allocated_ip(&response), "10.8.0.2");
}

#[tokio::test]
async fn static_ips_are_recorded_never_overwritten_and_conflicts_name_both_pods() {
    let server = TestServer::start(&[]).await;
    let mut holder = pod("default", "static", "", Some("10.16.0.10-10.16.0.20"));
    holder["metadata"]["name"] = json!("static-7584848b74-fw9dm");
    holder["metadata"]["annotations"]["cni.projectcalico.org/ipAddrs"] = json!(r#"["10.16.0.15"]"#);
    let response = server.mutate(&create("u-1", holder.clone())).await;
    assert_eq!(response["allowed"], true);
    let ops = patch_of(&response);
    assert!(
        !ops.to_string().contains("ipAddrs"),
        "a static IP is not overwritten: {ops}"
    );
    let mut stored = apply(&holder, &response);
    assert!(
        stored["metadata"]["annotations"]["ip-webhook.io/claim"].is_string(),
        "the static IP is a claim the pod carries"
    );
    stored["metadata"]["uid"] = json!("uid-static");
    assert_eq!(
        server.validate(&create("v-1", stored)).await["allowed"],
        true,
        "its own IP"
    );

    let mut intruder = pod("default", "web", "", None);
    intruder["metadata"]["name"] = json!("web-2");
    intruder["metadata"]["annotations"]["ovn.kubernetes.io/ip_address"] = json!("10.16.0.15");
    let expected = "static IP 10.16.0.15 requested by default/web-2 is already held by default/static-7584848b74-fw9dm (app default/static)";
    let validated = server.validate(&create("v-2", intruder.clone())).await;
    assert_eq!(validated["allowed"], false);
    assert_eq!(validated["status"]["message"], expected);
    let mutated = server.mutate(&create("u-2", intruder)).await;
    assert_eq!(mutated["status"]["message"], expected);

    // a static IP outside the pod's own list
    let mut outside = pod("default", "static", "", Some("10.16.0.10-10.16.0.20"));
    outside["metadata"]["name"] = json!("static-x");
    outside["metadata"]["annotations"]["cni.projectcalico.org/ipAddrs"] = json!(r#"["10.16.1.1"]"#);
    let denied = server.validate(&create("v-3", outside)).await;
    assert_eq!(
        denied["status"]["message"],
        "static IP 10.16.1.1 requested by default/static-x is not one of the IPs of app default/static"
    );
}

#[tokio::test]
async fn malformed_ip_annotations_are_denied_with_the_reason() {
    let server = TestServer::start(&[]).await;
    let cases = [
        (
            "cni.projectcalico.org/ipAddrs",
            "10.0.0.1",
            "is not a JSON array of IP strings",
        ),
        (
            "cni.projectcalico.org/ipAddrs",
            r#"["10.0.0.1","10.0.0.2"]"#,
            "has two IPv4 addresses",
        ),
        (
            "cni.projectcalico.org/ipAddrs",
            r#"["10.0.0.256"]"#,
            "\"10.0.0.256\" is not an IP address",
        ),
        (
            "ovn.kubernetes.io/ip_address",
            "10.0.0.1,10.0.0.2",
            "has two IPv4 addresses",
        ),
        (
            "ip-webhook.io/allocatable-ips",
            "10.0.0.1,banana",
            "entry 2 \"banana\"",
        ),
        (
            "ip-webhook.io/allocatable-ips",
            "10.0.0.5-10.0.0.1",
            "the range is reversed",
        ),
    ];
    for (i, (key, value, fragment)) in cases.into_iter().enumerate() {
        let mut p = pod("default", "web", "", None);
        p["metadata"]["name"] = json!("web-0");
        p["metadata"]["annotations"][key] = json!(value);
        for endpoint in ["/validate", "/mutate"] {
            let body = create(&format!("u-{i}"), p.clone()).to_string();
            let response = server.client.post(endpoint, body).await.unwrap().response();
            assert_eq!(response["allowed"], false, "{endpoint} {key}={value}");
            let message = response["status"]["message"].as_str().unwrap();
            assert!(
                message.contains(fragment),
                "{endpoint} {key}={value}: {message}"
            );
            assert!(
                message.contains("default/web-0"),
                "names the pod: {message}"
            );
        }
    }
}

#[tokio::test]
async fn delete_releases_and_the_same_pod_name_gets_its_ip_back() {
    let server =
        TestServer::start_with(|c| c.webhook.settings.release_delay = Duration::ZERO).await;
    let list = "10.9.0.1-10.9.0.5";
    let named = |name: &str| {
        let mut p = pod("default", "db", "", Some(list));
        p["metadata"]["name"] = json!(name);
        p
    };
    let delete = |pod: &Value, response: &Value, uid: &str| {
        let mut stored = apply(pod, response);
        stored["metadata"]["uid"] = json!(uid);
        let mut review = review(
            "v1",
            &format!("d-{uid}"),
            "DELETE",
            None,
            Some(stored),
            false,
        );
        review["request"]["options"] = json!({"gracePeriodSeconds": 0});
        review
    };
    let other = server.mutate(&create("u-1", named("other"))).await;
    let cache = server.mutate(&create("u-2", named("cache"))).await;
    assert_eq!(allocated_ip(&other), "10.9.0.1");
    assert_eq!(allocated_ip(&cache), "10.9.0.2");
    for (pod, response, uid) in [
        (named("other"), &other, "uid-other"),
        (named("cache"), &cache, "uid-cache"),
    ] {
        let answer = server.mutate(&delete(&pod, response, uid)).await;
        assert_eq!(answer["allowed"], true);
    }
    // held while terminating; released by the timer once the grace (0 s here) has passed
    assert_eq!(server.launched.webhook.allocator.claims().len(), 2);
    let metrics = server.launched.webhook.metrics.clone();
    wait_for("both releases", Duration::from_secs(10), || {
        metrics.releases.get() == 2
    })
    .await;
    assert!(server.launched.webhook.allocator.claims().is_empty());

    // 10.9.0.1 is the lowest free IP, but the recreated "cache" gets the IP it held before
    let again = server.mutate(&create("u-3", named("cache"))).await;
    assert_eq!(allocated_ip(&again), "10.9.0.2");
    let newcomer = server.mutate(&create("u-4", named("newcomer"))).await;
    assert_eq!(allocated_ip(&newcomer), "10.9.0.1");

    // a DELETE of a different pod with the same IP label releases nothing
    let stranger = server
        .mutate(&delete(&named("stranger"), &again, "uid-stranger"))
        .await;
    assert_eq!(stranger["allowed"], true);
    assert_eq!(server.launched.webhook.allocator.claims().len(), 2);
}

#[tokio::test]
async fn statefulset_pods_prefer_their_ordinal() {
    let server = TestServer::start(&[]).await;
    let mut p = pod("default", "db", "", Some("10.10.0.10-10.10.0.19"));
    p["metadata"]["name"] = json!("db-4");
    p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "x", "controller": true}]);
    let response = server.mutate(&create("u-1", p)).await;
    assert_eq!(allocated_ip(&response), "10.10.0.14");
}

#[tokio::test]
async fn pools_file_pods_draw_from_their_pool() {
    let dir = tempfile::tempdir().unwrap();
    let pools = dir.path().join("pools.yaml");
    std::fs::write(
        &pools,
        "- apiVersion: ip-webhook.io/v1alpha1\n  kind: FixedIPPool\n  metadata: {name: blue}\n  spec:\n    cidr: 10.20.0.0/30\n    namespaces: [prod]\n",
    )
    .unwrap();
    let server = TestServer::start_with(|c| c.webhook.pools_file = Some(pools.clone())).await;
    let mut p = pod("prod", "api", "api-", None);
    p["metadata"]["annotations"]["ip-webhook.io/ip-pool"] = json!("blue");
    assert_eq!(
        allocated_ip(&server.mutate(&create("u-1", p.clone())).await),
        "10.20.0.1"
    );
    // A pool app has its utilization gauge too: the pool's share taken.
    let (_, metrics) = server.admin_get("/metrics").await;
    for needle in [
        "ip_webhook_app_utilization_ratio{app_namespace=\"prod\",app=\"api\"} 0.5\n",
        "ip_webhook_pool_utilization_ratio{pool=\"blue\"} 0.5\n",
    ] {
        assert!(metrics.contains(needle), "missing {needle:?} in\n{metrics}");
    }
    assert_eq!(
        allocated_ip(&server.mutate(&create("u-2", p.clone())).await),
        "10.20.0.2"
    );
    let (_, metrics) = server.admin_get("/metrics").await;
    let full_ratio = "ip_webhook_app_utilization_ratio{app_namespace=\"prod\",app=\"api\"} 1.0\n";
    assert!(
        metrics.contains(full_ratio),
        "missing {full_ratio:?} in\n{metrics}"
    );
    let full = server.mutate(&create("u-3", p.clone())).await;
    assert_eq!(
        full["status"]["message"],
        "FixedIPPool blue (app prod/api): all 2 IPs are held (10.20.0.1 by prod/api-*, 10.20.0.2 by prod/api-*)"
    );
    let mut elsewhere = p.clone();
    elsewhere["metadata"]["namespace"] = json!("dev");
    let refused = server.mutate(&create("u-4", elsewhere)).await;
    assert_eq!(
        refused["status"]["message"],
        "pod dev/api-* may not draw from FixedIPPool blue: FixedIPPool blue serves namespaces [prod], not dev"
    );
    p["metadata"]["annotations"]["ip-webhook.io/ip-pool"] = json!("green");
    let unknown = server.mutate(&create("u-5", p)).await;
    assert_eq!(
        unknown["status"]["message"],
        "pod prod/api-* asks for FixedIPPool \"green\" (ip-webhook.io/ip-pool), which does not exist; known pools: blue"
    );
}

#[tokio::test]
async fn transport_errors_get_a_status_and_a_message() {
    let server = TestServer::start(&[]).await;
    let client = &server.client;
    let not_review = client.post("/mutate", "{\"hello\":1}").await.unwrap();
    assert_eq!(not_review.status, 400);
    assert_eq!(
        not_review.json()["message"],
        "apiVersion \"\" is not supported; send admission.k8s.io/v1 or admission.k8s.io/v1beta1"
    );
    let garbage = client.post("/validate", "not json").await.unwrap();
    assert_eq!(garbage.status, 400);
    assert!(
        garbage.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("the body is not an AdmissionReview")
    );
    let text = client
        .request("POST", "/mutate", Some("text/plain"), FIXTURE.into())
        .await
        .unwrap();
    assert_eq!(text.status, 415);
    let get = client
        .request("GET", "/mutate", None, "".into())
        .await
        .unwrap();
    assert_eq!(get.status, 405);
    let nowhere = client.post("/nowhere", FIXTURE).await.unwrap();
    assert_eq!(nowhere.status, 404);
    let huge = vec![b' '; 8 * 1024 * 1024];
    let too_big = client.post("/mutate", huge).await.unwrap();
    assert_eq!(too_big.status, 413);
    assert!(
        too_big.json()["message"]
            .as_str()
            .unwrap()
            .contains("7 MiB")
    );
    let charset = client
        .request(
            "POST",
            "/mutate",
            Some("application/json; charset=utf-8"),
            FIXTURE.into(),
        )
        .await
        .unwrap();
    assert_eq!(charset.status, 200);
    // the server is still fine
    assert_eq!(server.admin_get("/readyz").await.0, 200);
}

/// A TLS connection to the server with nothing sent yet, for bytes no HTTP client would write.
async fn raw_tls(server: &TestServer) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(server.launched.running.https_addr)
        .await
        .unwrap();
    let connector = tokio_rustls::TlsConnector::from(server.client.config.clone());
    connector
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap()
}

#[tokio::test]
async fn a_client_that_dribbles_its_head_is_cut_off() {
    let server = TestServer::start_with(|c| read_timeout(c, Duration::from_secs(1))).await;
    let mut tls = raw_tls(&server).await;
    tls.write_all(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut buffer = Vec::new();
    use tokio::io::AsyncReadExt;
    let read = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut buffer)).await;
    assert!(
        read.is_ok(),
        "the server kept a half-sent request open for 10 s"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A review whose body arrives in several pieces (chunks written a while apart, so the server
/// reads them as separate frames) is answered as one in one piece is, and two reviews sent in
/// one write on one connection each get their own answer.
#[tokio::test]
async fn a_body_in_pieces_and_reviews_back_to_back_are_each_answered_whole() {
    let server = TestServer::start(&[]).await;
    let review = |uid: &str| {
        let mut review = fixture();
        review["request"]["uid"] = json!(uid);
        review.to_string()
    };
    let mut tls = raw_tls(&server).await;

    let chunked_body = review("in-pieces");
    tls.write_all(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    for piece in chunked_body.as_bytes().chunks(chunked_body.len() / 3 + 1) {
        tls.write_all(format!("{:x}\r\n", piece.len()).as_bytes())
            .await
            .unwrap();
        tls.write_all(piece).await.unwrap();
        tls.write_all(b"\r\n").await.unwrap();
        tls.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tls.write_all(b"0\r\n\r\n").await.unwrap();

    let mut back_to_back = Vec::new();
    for (uid, last) in [("first-of-two", false), ("second-of-two", true)] {
        let body = review(uid);
        let close = if last { "Connection: close\r\n" } else { "" };
        back_to_back.extend(
            format!(
                "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{close}\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
    }
    tls.write_all(&back_to_back).await.unwrap();
    tls.flush().await.unwrap();

    let mut answers = Vec::new();
    use tokio::io::AsyncReadExt;
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut answers))
        .await
        .expect("three answers within 10 s")
        .unwrap();
    let answers = String::from_utf8(answers).unwrap();
    let mut uids = Vec::new();
    for answer in answers.split("HTTP/1.1 ").skip(1) {
        assert!(answer.starts_with("200 OK"), "{answer}");
        let body: Value = serde_json::from_str(&answer[answer.find("\r\n\r\n").unwrap() + 4..])
            .unwrap_or_else(|e| panic!("{e}: {answer}"));
        assert_eq!(body["response"]["allowed"], true, "{body}");
        assert!(body["response"]["patch"].is_string(), "{body}");
        uids.push(body["response"]["uid"].as_str().unwrap().to_string());
    }
    assert_eq!(uids, ["in-pieces", "first-of-two", "second-of-two"]);
}

#[tokio::test]
async fn admin_port_reports_health_readiness_and_metrics() {
    let server = TestServer::start(&[]).await;
    server.mutate(&fixture()).await;
    assert_eq!(
        server.admin_get("/healthz").await,
        (200, "ok\n".to_string())
    );
    assert_eq!(server.admin_get("/readyz").await.0, 200);
    let (code, metrics) = server.admin_get("/metrics").await;
    assert_eq!(code, 200);
    for needle in [
        "ip_webhook_requests_total{webhook=\"mutate\",outcome=\"allowed\"} 1",
        "ip_webhook_allocations_total{outcome=\"allocated\"} 1",
        "ip_webhook_app_held_ips{app_namespace=\"default\",app=\"web\"} 1",
        "ip_webhook_app_free_ips{app_namespace=\"default\",app=\"web\"} 11",
        "ip_webhook_webhook_latency_seconds_bucket{le=\"0.00001\",webhook=\"mutate\"}",
        "ip_webhook_ledger_commits_total 1",
    ] {
        assert!(metrics.contains(needle), "missing {needle:?} in\n{metrics}");
    }
}
