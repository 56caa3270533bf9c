//! In-cluster mode end to end against `fakeapi.py`, a small in-memory Kubernetes API server
//! (`tests/support/fakeapi.py`, this project's own test tool): webhook replicas with `--ledger kubernetes
//! --kubeconfig`, racing for the last IP, rebuilding state on restart, and the reconciler
//! binding, reclaiming and expiring claims and writing FixedIPPool status.

mod common;

// The etcd case needs the `etcd` feature; scripts/test.sh builds with --all-features.
#[cfg(feature = "etcd")]
use common::etcd_cluster;

use std::process::Command;
use std::time::{Duration, Instant};

use common::events::events_with_reason;
use common::resources::{RESERVATION_NAME, calico_ippools, calico_reservations, kube_ovn_subnets};
use common::{TestServer, allocated_ip, apply, create, eventually, fakeapi, message, pod, rbac};
use fakeapi::{FakeApi, bound_claim, create_spec, persist_pod, wait_ready};
use ip_webhook_ledger::crd::{FixedIPPool, IPClaim};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use kube::{Api, Client};
use rbac::assert_rbac_covers;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_racing_for_the_last_ip_one_wins_the_other_is_denied() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let a = fake.replica(&[]).await;
    let b = fake.replica(&[]).await;
    let claims: Api<IPClaim> = Api::all(client);
    for round in 0..6 {
        let ip = format!("10.77.0.{}", round + 1);
        let app = format!("race{round}");
        let review_a = create(
            &format!("a-{round}"),
            pod("default", &app, &format!("{app}-"), Some(&ip)),
        );
        let review_b = create(
            &format!("b-{round}"),
            pod("default", &app, &format!("{app}-"), Some(&ip)),
        );
        let (from_a, from_b) = tokio::join!(a.mutate(&review_a), b.mutate(&review_b));
        let allowed: Vec<&Value> = [&from_a, &from_b]
            .into_iter()
            .filter(|r| r["allowed"] == true)
            .collect();
        assert_eq!(
            allowed.len(),
            1,
            "round {round}: exactly one wins: {from_a} {from_b}"
        );
        let (winner_uid, loser) = if from_a["allowed"] == true {
            (format!("a-{round}"), &from_b)
        } else {
            (format!("b-{round}"), &from_a)
        };
        assert_eq!(
            message(loser),
            format!("app default/{app}: all 1 allocatable IPs are held ({ip} by default/{app}-*)"),
            "round {round}"
        );
        let record = claims.get(&ip).await.unwrap();
        assert_eq!(record.spec.request_uid, winner_uid, "round {round}");
    }
    let all = claims.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 6, "one record per IP, nothing else");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replica_rebuilds_its_books_from_ipclaims() {
    let fake = FakeApi::start();
    fake.install_crds().await;
    let list = "10.78.0.1-10.78.0.2";
    let first = fake.replica(&[]).await;
    let response = first
        .mutate(&create("r-1", pod("default", "db", "db-", Some(list))))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(common::allocated_ip(&response), "10.78.0.1");
    first.launched.shutdown().await;

    let second = fake.replica(&[]).await;
    let holder = second
        .launched
        .webhook
        .allocator
        .holder(&"10.78.0.1".parse().unwrap())
        .expect("the claim made by the first process is known");
    assert_eq!(holder.request_uid, "r-1");
    let response = second
        .mutate(&create("r-2", pod("default", "db", "db-", Some(list))))
        .await;
    assert_eq!(common::allocated_ip(&response), "10.78.0.2");
    let response = second
        .mutate(&create("r-3", pod("default", "db", "db-", Some(list))))
        .await;
    assert_eq!(response["allowed"], false);
    assert!(
        message(&response).contains("all 2 allocatable IPs are held"),
        "{response}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_binds_reclaims_expires_and_counts() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let pools: Api<FixedIPPool> = Api::all(client.clone());
    let blue: FixedIPPool = serde_json::from_value(json!({
        "apiVersion": "ip-webhook.io/v1alpha1", "kind": "FixedIPPool",
        "metadata": {"name": "blue"},
        "spec": {"cidr": "10.79.0.0/29"},
    }))
    .unwrap();
    pools.create(&PostParams::default(), &blue).await.unwrap();
    let server = fake
        .replica(&[
            "--reservation-ttl",
            "5s",
            "--lease-duration",
            "2s",
            "--lease-renew-interval",
            "200ms",
        ])
        .await;
    let claims: Api<IPClaim> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let events: Api<Event> = Api::namespaced(client.clone(), "default");

    // A pod of pool blue is admitted, then persisted under its generated name: bound by UID.
    let mut object = pod("default", "web", "web-", None);
    object["metadata"]["annotations"]["ip-webhook.io/ip-pool"] = json!("blue");
    let response = server.mutate(&create("bind-1", object.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");
    let ip = common::allocated_ip(&response);
    assert_eq!(ip, "10.79.0.1");
    let live = persist_pod(&pods, apply(&object, &response), "web-x7k2p").await;
    let uid = live.metadata.uid.clone().unwrap();
    let bound = bound_claim(&claims, &ip, Duration::from_secs(15)).await;
    assert_eq!(bound.spec.pod_uid.as_deref(), Some(uid.as_str()));
    assert_eq!(bound.spec.pod_name, "web-x7k2p");

    // FixedIPPool status counts it.
    let status = eventually("FixedIPPool status", Duration::from_secs(15), || async {
        let pool = pools.get("blue").await.ok()?;
        pool.status.filter(|s| s.held == 1)
    })
    .await;
    assert_eq!((status.total, status.held, status.free), (6, 1, 5));

    // The pod is deleted and no admission DELETE reaches the webhook: the reconciler frees
    // the IP (the pod UID is gone) and says so in an Event.
    pods.delete("web-x7k2p", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the claim to be reclaimed",
        Duration::from_secs(15),
        || async { claims.get_opt(&ip).await.ok()?.is_none().then_some(()) },
    )
    .await;
    let reclaimed = eventually("an IPReclaimed event", Duration::from_secs(10), || async {
        let found = events_with_reason(&events, "IPReclaimed").await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    assert!(
        reclaimed[0]
            .note
            .as_deref()
            .unwrap_or("")
            .contains(&format!("default/web-x7k2p (uid {uid})")),
        "{:?}",
        reclaimed[0].note
    );
    assert!(
        server
            .launched
            .webhook
            .allocator
            .holder(&ip.parse().unwrap())
            .is_none(),
        "the replica's index follows the delete"
    );

    // An admission whose pod never appears: the reservation expires after --reservation-ttl.
    let response = server
        .mutate(&create(
            "never-1",
            pod("default", "job", "job-", Some("10.79.8.1")),
        ))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(claims.get_opt("10.79.8.1").await.unwrap().is_some());
    eventually(
        "the reservation to expire",
        Duration::from_secs(20),
        || async {
            claims
                .get_opt("10.79.8.1")
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
    // The Event is published right after the delete.
    let expired = eventually(
        "a ReservationExpired event",
        Duration::from_secs(10),
        || async {
            let found = events_with_reason(&events, "ReservationExpired").await;
            (!found.is_empty()).then_some(found)
        },
    )
    .await;
    assert_eq!(expired.len(), 1, "{expired:?}");
    let metrics = &server.launched.webhook.metrics;
    assert_eq!(metrics.leaks_reclaimed.get(), 1);
    assert_eq!(metrics.reservations_expired.get(), 1);
    let (_, exposition) = server.admin_get("/metrics").await;
    assert!(
        exposition
            .lines()
            .any(|l| l.starts_with("ip_webhook_leader{") && l.ends_with(" 1")),
        "the only replica leads and says so:\n{exposition}"
    );

    // A pod refused for exhaustion: a Warning Event on its owner says why pods are missing.
    let first = server
        .mutate(&create(
            "full-1",
            pod("default", "api", "api-", Some("10.79.9.1")),
        ))
        .await;
    assert_eq!(first["allowed"], true, "{first}");
    let mut second = pod("default", "api", "api-", Some("10.79.9.1"));
    second["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "api-5d9c",
        "uid": "0f6c3a1e-0000-4000-8000-000000000001", "controller": true,
    }]);
    let refused = server.mutate(&create("full-2", second)).await;
    assert_eq!(refused["allowed"], false, "{refused}");
    let exhausted = eventually("an IPExhausted event", Duration::from_secs(10), || async {
        let found = events_with_reason(&events, "IPExhausted").await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    assert_eq!(exhausted[0].type_.as_deref(), Some("Warning"));
    let regarding = exhausted[0]
        .regarding
        .as_ref()
        .expect("the Event names its object");
    assert_eq!(regarding.kind.as_deref(), Some("ReplicaSet"));
    assert_eq!(regarding.name.as_deref(), Some("api-5d9c"));
    assert!(
        exhausted[0].note.as_deref().unwrap_or("").starts_with(
            "app default/api: all 1 allocatable IPs are held (10.79.9.1 by default/api-*)"
        ),
        "{:?}",
        exhausted[0].note
    );
    assert_rbac_covers(&fake);
    assert!(
        expired[0]
            .note
            .as_deref()
            .unwrap_or("")
            .contains("IP 10.79.8.1 returned to the pool: reserved for default/job-*"),
        "{:?}",
        expired[0].note
    );
}

/// Run the `ip-webhook` binary (an operator command) off the async workers.
async fn command(args: Vec<String>) -> (bool, String, String) {
    tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_ip-webhook"))
            .args(&args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_and_status_look_up_the_pods_behind_the_claims() {
    // The fake kubelet takes its time to finish a deleted pod: long enough to see it terminate.
    let fake = FakeApi::start_with(&["--kubelet-delay", "120"]);
    let client = fake.install_crds().await;
    let kubeconfig = fake.kubeconfig().display().to_string();
    let server = fake.replica(&[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<IPClaim> = Api::all(client.clone());
    let list = "10.77.0.1-10.77.0.3";

    // 10.77.0.1: admitted and persisted, scheduled on node-a. 10.77.0.2: admitted, no pod came.
    let object = pod("default", "web", "web-", Some(list));
    let response = server.mutate(&create("rel-1", object.clone())).await;
    assert_eq!(allocated_ip(&response), "10.77.0.1");
    let mut persisted = apply(&object, &response);
    persisted["spec"]["nodeName"] = json!("node-a");
    persist_pod(&pods, persisted, "web-live").await;
    let response = server.mutate(&create("rel-2", object.clone())).await;
    assert_eq!(allocated_ip(&response), "10.77.0.2");
    // an operator command against this API server (its IPClaims; --state-dir would select
    // an embedded ledger instead)
    let operator = |args: &[&str]| {
        let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        all.extend(["--kubeconfig", &kubeconfig].map(str::to_string));
        command(all)
    };

    let (ok, json, stderr) = operator(&["status", "-o", "json"]).await;
    assert!(ok, "{stderr}");
    let report: Value = serde_json::from_str(&json).unwrap();
    let holders = report["apps"][0]["holders"].as_array().unwrap();
    let node_of = |ip: &str| {
        holders
            .iter()
            .find(|h| h["ip"] == ip)
            .map(|h| h["node"].clone())
    };
    assert_eq!(node_of("10.77.0.1"), Some(json!("node-a")), "{json}");
    assert_eq!(node_of("10.77.0.2"), Some(Value::Null), "{json}");
    // the list's size travels in the IPClaims: SIZE, FREE and USED are known in-cluster too
    let app = &report["apps"][0];
    assert_eq!(
        (&app["size"], &app["held"], &app["free"]),
        (&json!(3), &json!(2), &json!(1)),
        "{json}"
    );

    // The pod holding 10.77.0.1 exists: refused without --force.
    let (ok, _, stderr) = operator(&["release", "10.77.0.1"]).await;
    assert!(!ok);
    assert!(
        stderr.contains("refused: pod default/web-") && stderr.contains("still exists"),
        "{stderr}"
    );
    assert!(claims.get_opt("10.77.0.1").await.unwrap().is_some());

    // No pod took 10.77.0.2 up: released, and not forced.
    let (ok, stdout, stderr) = operator(&["release", "10.77.0.2"]).await;
    assert!(ok, "{stderr}");
    assert!(
        stdout.starts_with("released 10.77.0.2 (Reserved, held by pod default/web-*")
            && !stdout.contains("forced"),
        "{stdout}"
    );
    assert!(claims.get_opt("10.77.0.2").await.unwrap().is_none());

    // With the webhook (and its reconciler) stopped, the pod is deleted. While it terminates
    // (the kubelet has not finished it) it still holds the IP; once it is gone, release frees it.
    server.launched.shutdown().await;
    let terminating = pods
        .delete("web-live", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        terminating.is_left(),
        "a scheduled pod is deleted gracefully"
    );
    let (ok, _, stderr) = operator(&["release", "10.77.0.1"]).await;
    assert!(!ok && stderr.contains("still exists"), "{stderr}");
    pods.delete("web-live", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert!(pods.get_opt("web-live").await.unwrap().is_none());
    let (ok, stdout, stderr) = operator(&["release", "10.77.0.1"]).await;
    assert!(ok, "{stderr}");
    assert!(
        stdout.starts_with("released 10.77.0.1") && !stdout.contains("forced"),
        "{stdout}"
    );
    assert!(claims.get_opt("10.77.0.1").await.unwrap().is_none());
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_etcd_ledger_the_leak_sweeper_frees_the_ips_no_pod_holds() {
    let test = "with_the_etcd_ledger_the_leak_sweeper_frees_the_ips_no_pod_holds";
    let binary = etcd_cluster::etcd_binary(test);
    let fake = FakeApi::start();
    let etcd = etcd_cluster::EtcdCluster::start(&binary, 1);
    let client = fake.client().await;
    let kubeconfig = fake.kubeconfig().display().to_string();
    let endpoints = etcd.endpoints_flag();
    let server = TestServer::start(&[
        "--ledger",
        "etcd",
        "--etcd-endpoints",
        &endpoints,
        "--kubeconfig",
        &kubeconfig,
        // claims' times are whole seconds: 2s is at least 1s after the admission
        "--reservation-ttl",
        "2s",
        "--sticky-grace",
        "4s",
        "--resync-period",
        "300ms",
        "--lease-namespace",
        "default",
        "--lease-duration",
        "2s",
        "--lease-renew-interval",
        "200ms",
    ])
    .await;
    wait_ready(&server).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let list = "10.76.0.1-10.76.0.9";
    let admit = |uid: &'static str, object: Value| {
        let server = &server;
        async move {
            let response = server.mutate(&create(uid, object.clone())).await;
            assert_eq!(response["allowed"], true, "{response}");
            (apply(&object, &response), allocated_ip(&response))
        }
    };
    let web = pod("default", "web", "web-", Some(list));
    let mut db_0 = pod("default", "db", "", Some(list));
    db_0["metadata"]["name"] = json!("db-0");
    db_0["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "sts-db",
        "controller": true,
    }]);

    // live: persisted and running. gone: persisted, then deleted with no admission DELETE.
    // never: admitted, no pod came. db-0: a StatefulSet pod, validated (bound, kept for its
    // name), deleted; its IP waits the sticky grace.
    // each stored pod validated as the API server would (its claims bound to its UID)
    let store = |object: Value, name: &'static str| {
        let (server, pods) = (&server, &pods);
        async move {
            let stored = persist_pod(pods, object, name).await;
            let review = create(&format!("v-{name}"), serde_json::to_value(&stored).unwrap());
            let validated = server.validate(&review).await;
            assert_eq!(validated["allowed"], true, "{validated}");
        }
    };
    let (object, live) = admit("s-live", web.clone()).await;
    store(object, "web-live").await;
    let (object, gone) = admit("s-gone", web.clone()).await;
    store(object, "web-gone").await;
    let (_, never) = admit("s-never", web.clone()).await;
    let (object, sticky) = admit("s-db-0", db_0.clone()).await;
    store(object, "db-0").await;
    for name in ["web-gone", "db-0"] {
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    }
    let allocator = server.launched.webhook.allocator.clone();
    let held = |ip: &str| allocator.holder(&ip.parse().unwrap()).is_some();
    eventually(
        "the sweep to free gone and never",
        Duration::from_secs(20),
        || async { (!held(&gone) && !held(&never)).then_some(()) },
    )
    .await;
    assert!(held(&sticky), "db-0's IP is kept for the sticky grace");
    assert!(held(&live));
    eventually(
        "the sweep to free db-0 after the grace",
        Duration::from_secs(20),
        || async { (!held(&sticky)).then_some(()) },
    )
    .await;
    assert!(held(&live), "a running pod's IP is never freed");
    // as the reconciler counts them: a gone pod's IP is a leak, a reservation no pod took up
    // expired, and a StatefulSet pod's kept IP an ordinary release
    let metrics = &server.launched.webhook.metrics;
    assert_eq!(metrics.leaks_reclaimed.get(), 1);
    assert_eq!(metrics.reservations_expired.get(), 1);

    // etcd has the releases too: a new pod of web gets the lowest freed IP.
    let (_, next) = admit("s-next", web.clone()).await;
    assert_eq!(next, gone.min(never), "freed IPs are handed out again");
    assert_rbac_covers(&fake);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_the_watches_to_sync() {
    let fake = FakeApi::start();
    fake.install_crds().await;
    // Listing pods fails until cleared: the pod cache cannot sync.
    fake.control(
        "/fake/fail",
        json!({"method": "GET", "path": "^/api/v1/pods$", "code": 500, "count": 1_000_000}),
    );
    let kubeconfig = fake.kubeconfig();
    let server = TestServer::start_with(|c| common::kubernetes_ledger(c, &kubeconfig)).await;
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        let (code, body) = server.admin_get("/readyz").await;
        assert_eq!(code, 503, "ready before the pod cache synced: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fake.control("/fake/fail", json!({"clear": true}));
    wait_ready(&server).await;
}

/// A replica whose pod watch has stopped would not see a pod started outside ip-webhook on a
/// listed IP: readiness follows the watches the decisions read, not only their first list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_watches_after_they_synced() {
    let fake = FakeApi::start();
    fake.install_crds().await;
    let server = fake.replica(&[]).await;
    fake.control(
        "/fake/fail",
        json!({"method": "GET", "path": "^/api/v1/pods$", "code": 500, "count": 1_000_000}),
    );
    fake.control("/fake/close-watches", json!({}));
    let body = eventually(
        "/readyz to answer 503 for the failing pod watch",
        Duration::from_secs(30),
        || async {
            let (code, body) = server.admin_get("/readyz").await;
            (code == 503).then_some(body)
        },
    )
    .await;
    assert!(
        body.contains("watch has failed for") && body.contains("pod"),
        "names the watch: {body}"
    );
    fake.control("/fake/fail", json!({"clear": true}));
    // a reconnected watch brings no event: back once no error came for longer than the
    // watcher's longest backoff (35 s)
    eventually(
        "/readyz to answer 200 once the pod watch is back",
        Duration::from_secs(60),
        || async { (server.admin_get("/readyz").await.0 == 200).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_pod_gets_its_ip_back_within_the_sticky_grace() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let server = fake
        .replica(&[
            "--sticky-grace",
            "60s",
            // web-0 goes before the leader may have seen it stored: its claim is kept once the
            // admission window has passed
            "--reservation-ttl",
            "2s",
            "--lease-duration",
            "2s",
            "--lease-renew-interval",
            "200ms",
        ])
        .await;
    let claims: Api<IPClaim> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let list = "10.80.0.1-10.80.0.3";
    let web0 = |uid: &str| {
        let mut object = pod("default", "web", "", Some(list));
        object["metadata"]["name"] = json!("web-0");
        object["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
            "uid": uid, "controller": true, "blockOwnerDeletion": true,
        }]);
        object
    };
    let object = web0("sts-uid");
    let response = server.mutate(&create("web-0-first", object.clone())).await;
    assert_eq!(common::allocated_ip(&response), "10.80.0.1");
    persist_pod(&pods, apply(&object, &response), "web-0").await;
    let bound = eventually(
        "web-0's claim to be bound",
        Duration::from_secs(15),
        || async {
            let claim = claims.get("10.80.0.1").await.ok()?;
            (claim.status.as_ref()?.phase == "Bound").then_some(claim)
        },
    )
    .await;
    assert!(bound.spec.sticky, "a StatefulSet pod's claim is sticky");

    pods.delete("web-0", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the claim to be kept as Released",
        Duration::from_secs(15),
        || async {
            let claim = claims.get("10.80.0.1").await.ok()?;
            (claim.status.as_ref()?.phase == "Released").then_some(())
        },
    )
    .await;
    eventually(
        "the replica to see the kept claim",
        Duration::from_secs(5),
        || async {
            server
                .launched
                .webhook
                .allocator
                .holder(&"10.80.0.1".parse().unwrap())
                .filter(|c| c.phase == ip_webhook_ledger::Phase::Released)
        },
    )
    .await;

    // Another pod of the app does not get the kept IP...
    let response = server
        .mutate(&create(
            "other-1",
            pod("default", "web", "other-", Some(list)),
        ))
        .await;
    assert_eq!(common::allocated_ip(&response), "10.80.0.2");
    // ...the recreated web-0 does.
    let response = server
        .mutate(&create("web-0-second", web0("sts-uid")))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(common::allocated_ip(&response), "10.80.0.1");
    let record = claims.get("10.80.0.1").await.unwrap();
    assert_eq!(record.spec.request_uid, "web-0-second");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_leader_goes_another_replica_takes_over_the_reconciler() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let fast = ["--lease-duration", "2s", "--lease-renew-interval", "200ms"];
    let first = fake.replica(&fast).await;
    let leads = |server: &TestServer| *server.launched.cluster.as_ref().unwrap().leading.borrow();
    eventually(
        "the first replica to lead",
        Duration::from_secs(10),
        || async { leads(&first).then_some(()) },
    )
    .await;
    let second = fake.replica(&fast).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!leads(&second), "one leader at a time");
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "default");
    let holder = |lease: k8s_openapi::api::coordination::v1::Lease| {
        let spec = lease.spec.unwrap_or_default();
        (
            spec.holder_identity.unwrap_or_default(),
            spec.lease_transitions.unwrap_or(0),
        )
    };
    let (first_holder, _) = holder(leases.get("ip-webhook-reconciler").await.unwrap());

    // The leader stops without giving the Lease back (as if its node died).
    first.launched.cluster.as_ref().unwrap().stop();
    let claims: Api<IPClaim> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let object = pod("default", "svc", "svc-", Some("10.81.0.1"));
    let response = second.mutate(&create("svc-1", object.clone())).await;
    assert_eq!(common::allocated_ip(&response), "10.81.0.1");
    persist_pod(&pods, apply(&object, &response), "svc-abcde").await;
    eventually(
        "the new leader to bind the claim",
        Duration::from_secs(20),
        || async {
            let claim = claims.get("10.81.0.1").await.ok()?;
            (claim.status.as_ref()?.phase == "Bound").then_some(())
        },
    )
    .await;
    assert!(leads(&second));
    let (second_holder, transitions) = holder(leases.get("ip-webhook-reconciler").await.unwrap());
    assert_ne!(second_holder, first_holder);
    assert_eq!(transitions, 1);
    assert_rbac_covers(&fake);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_shutting_down_hands_the_lease_over_at_once() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    // A long lease: without the hand-over the second replica would wait 60s.
    let slow = ["--lease-duration", "60s", "--lease-renew-interval", "200ms"];
    let first = fake.replica(&slow).await;
    let leads = |server: &TestServer| *server.launched.cluster.as_ref().unwrap().leading.borrow();
    eventually(
        "the first replica to lead",
        Duration::from_secs(10),
        || async { leads(&first).then_some(()) },
    )
    .await;
    let second = fake.replica(&slow).await;
    first.launched.shutdown().await;
    eventually(
        "the second replica to lead",
        Duration::from_secs(5),
        || async { leads(&second).then_some(()) },
    )
    .await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client, "default");
    let spec = leases
        .get("ip-webhook-reconciler")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(
        spec.lease_duration_seconds,
        Some(60),
        "the new holder writes its own duration"
    );
    assert_eq!(spec.lease_transitions, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_error_on_the_claim_is_a_clear_denial_and_leaves_no_hold() {
    let fake = FakeApi::start();
    fake.install_crds().await;
    let server = fake.replica(&[]).await;
    fake.control(
        "/fake/fail",
        json!({"method": "POST", "path": "/ipclaims$", "code": 500, "count": 1}),
    );
    let response = server
        .mutate(&create(
            "e-1",
            pod("default", "api", "api-", Some("10.82.0.1")),
        ))
        .await;
    assert_eq!(response["allowed"], false, "{response}");
    let text = message(&response);
    assert!(
        text.starts_with(
            "ip-webhook could not record the IP claim, so the pod is not admitted (retry)"
        ) && text.contains("creating IPClaim 10.82.0.1"),
        "{text}"
    );
    // The failed attempt held nothing: the retry gets the same IP.
    let response = server
        .mutate(&create(
            "e-2",
            pod("default", "api", "api-", Some("10.82.0.1")),
        ))
        .await;
    assert_eq!(common::allocated_ip(&response), "10.82.0.1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_with_the_kubernetes_ledger() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().display().to_string();
    let kubeconfig = fake.kubeconfig().display().to_string();
    // No --ledger: --kubeconfig selects the kubernetes ledger.
    let server = common::BinaryServer::start(&["--state-dir", &dir, "--kubeconfig", &kubeconfig]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while common::http_get(server.admin_addr, "/readyz").await.0 != 200 {
        assert!(Instant::now() < deadline, "the binary never became ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ca = std::fs::read(state.path().join("ca.crt")).unwrap();
    let https = common::HttpsClient::new(server.https_addr, &ca);
    let review = create("bin-1", pod("default", "bin", "bin-", Some("10.83.0.1")));
    let response = https
        .post("/mutate", review.to_string())
        .await
        .unwrap()
        .response();
    assert_eq!(common::allocated_ip(&response), "10.83.0.1");
    let claims: Api<IPClaim> = Api::all(client);
    assert_eq!(
        claims.get("10.83.0.1").await.unwrap().spec.request_uid,
        "bin-1"
    );
    assert!(
        !state.path().join("ledger.lock").exists() && !state.path().join("ledger.id").exists(),
        "no embedded ledger was opened"
    );
}

/// A minimal cluster-scoped CRD that keeps any spec (as Calico's and Kube-OVN's own CRDs would).
fn foreign_crd(group: &str, kind: &str, plural: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            }],
        },
    }))
    .unwrap()
}

async fn install_foreign_crds(client: &Client, crds: &[(&str, &str, &str)]) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (group, kind, plural) in crds {
        api.create(&PostParams::default(), &foreign_crd(group, kind, plural))
            .await
            .unwrap();
    }
}

/// A review of a Deployment in namespace prod listing `ips`.
fn deployment_review(operation: &str, name: &str, ips: &str) -> Value {
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "prod"},
        "spec": {"replicas": 1, "template": {
            "metadata": {"labels": {"app": name}, "annotations": {"ip-webhook.io/allocatable-ips": ips}},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }},
    });
    let (object, old) = match operation {
        "DELETE" => (None, Some(deployment)),
        _ => (Some(deployment), None),
    };
    common::object_review(
        &format!("deploy-{name}-{operation}"),
        ("apps", "v1", "Deployment"),
        operation,
        object,
        old,
    )
}

/// Create the Deployment `deployment_review` describes in the API server (namespace prod).
async fn persist_deployment(client: &Client, name: &str, ips: &str) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let prod = serde_json::from_value(json!({"metadata": {"name": "prod"}})).unwrap();
    let _ = namespaces.create(&PostParams::default(), &prod).await;
    let mut deployment = deployment_review("CREATE", name, ips)["request"]["object"].clone();
    deployment["spec"]["selector"] = json!({"matchLabels": {"app": name}});
    let deployment = serde_json::from_value(deployment).unwrap();
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), "prod")
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
}

fn calico_warnings(response: &Value) -> Vec<String> {
    response["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w.as_str())
        .filter(|w| w.contains("Calico"))
        .map(str::to_string)
        .collect()
}

async fn reserved_cidrs(reservations: &Api<DynamicObject>) -> Option<Vec<String>> {
    let object = reservations.get_opt(RESERVATION_NAME).await.unwrap()?;
    Some(
        object.data["spec"]["reservedCIDRs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_string())
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calico_pools_gate_fixed_ips_and_the_reservation_follows_pools_and_workloads() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    install_foreign_crds(
        &client,
        &[
            ("crd.projectcalico.org", "IPPool", "ippools"),
            ("crd.projectcalico.org", "IPReservation", "ipreservations"),
        ],
    )
    .await;
    let calico_pools: Api<DynamicObject> = Api::all_with(client.clone(), &calico_ippools());
    let reservations: Api<DynamicObject> = Api::all_with(client.clone(), &calico_reservations());
    for (name, spec) in [
        (
            "fixed",
            json!({"cidr": "10.10.0.0/24", "nodeSelector": "!all()"}),
        ),
        ("auto", json!({"cidr": "10.20.0.0/24"})),
        ("off", json!({"cidr": "10.30.0.0/24", "disabled": true})),
        (
            "tunnel",
            json!({"cidr": "10.40.0.0/24", "allowedUses": ["Tunnel"]}),
        ),
    ] {
        create_spec(&calico_pools, &calico_ippools(), name, spec).await;
    }
    let server = fake.replica(&[]).await;
    let ask = |n: u32, list: &str| {
        create(
            &format!("calico-{n}"),
            pod("prod", &format!("app{n}"), "web-", Some(list)),
        )
    };

    // Outside every pool: denied (once the Calico watch has synced), naming the IP and pools.
    let denied = eventually(
        "the Calico pools to be known",
        Duration::from_secs(20),
        || {
            let server = &server;
            let review = ask(1, "10.99.0.5");
            async move {
                let response = server.mutate(&review).await;
                (response["allowed"] == false).then_some(response)
            }
        },
    )
    .await;
    let text = message(&denied);
    assert!(
        text.contains("IP 10.99.0.5 of")
            && text.contains("lies in no enabled Calico IPPool that allows Workload use")
            && text.contains("The provided IP address is not in a configured pool"),
        "{text}"
    );
    for pool in [
        "fixed 10.10.0.0/24",
        "auto 10.20.0.0/24",
        "off 10.30.0.0/24 (disabled)",
        "tunnel 10.40.0.0/24 (allowedUses Tunnel)",
    ] {
        assert!(text.contains(pool), "{pool:?} in {text}");
    }
    // In a disabled pool, and in a pool that allows only Tunnel use: denied.
    for (n, ip) in [(2, "10.30.0.5"), (3, "10.40.0.5")] {
        let response = server.mutate(&ask(n, ip)).await;
        assert_eq!(response["allowed"], false, "{ip}: {response}");
        assert!(
            message(&response).contains(&format!("IP {ip} of")),
            "{response}"
        );
    }
    // In the dedicated pool: allocated.
    let response = server.mutate(&ask(4, "10.10.0.5")).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(allocated_ip(&response), "10.10.0.5");

    // In a pool Calico also assigns from: allowed with a warning, until the reservation
    // (which now holds the workload's list) covers the IPs.
    let response = server
        .validate(&deployment_review("CREATE", "web", "10.20.0.7-10.20.0.8"))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    // The registry follows the Deployments the API server holds (watched), not admissions.
    persist_deployment(&client, "web", "10.20.0.7-10.20.0.8").await;
    let warnings = calico_warnings(&response);
    assert_eq!(warnings.len(), 1, "{response}");
    assert!(
        warnings[0].contains("IPs 10.20.0.7-10.20.0.8 of Deployment prod/web")
            && warnings[0].contains("Calico IPPool auto"),
        "{warnings:?}"
    );
    let created = eventually(
        "the IPReservation to be created",
        Duration::from_secs(20),
        || {
            let reservations = &reservations;
            async move { reserved_cidrs(reservations).await }
        },
    )
    .await;
    assert_eq!(created, ["10.20.0.7/32", "10.20.0.8/32"]);
    let again = eventually(
        "the reservation to silence the warning",
        Duration::from_secs(20),
        || {
            let server = &server;
            async move {
                let response = server
                    .validate(&deployment_review("UPDATE", "web", "10.20.0.7-10.20.0.8"))
                    .await;
                calico_warnings(&response).is_empty().then_some(response)
            }
        },
    )
    .await;
    assert_eq!(again["allowed"], true, "{again}");

    // A FixedIPPool's usable IPs join the reservation...
    let pools: Api<FixedIPPool> = Api::all(client.clone());
    let blue: FixedIPPool = serde_json::from_value(json!({
        "apiVersion": "ip-webhook.io/v1alpha1", "kind": "FixedIPPool",
        "metadata": {"name": "blue"}, "spec": {"cidr": "10.20.0.16/29"},
    }))
    .unwrap();
    pools.create(&PostParams::default(), &blue).await.unwrap();
    let expected = [
        "10.20.0.7/32",
        "10.20.0.8/32",
        "10.20.0.17/32",
        "10.20.0.18/31",
        "10.20.0.20/31",
        "10.20.0.22/32",
    ];
    eventually("the reservation to grow", Duration::from_secs(20), || {
        let reservations = &reservations;
        async move { (reserved_cidrs(reservations).await? == expected).then_some(()) }
    })
    .await;
    // ... and leave it as the workload and the pool go.
    let response = server
        .validate(&deployment_review("DELETE", "web", "10.20.0.7-10.20.0.8"))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), "prod")
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the reservation to shrink", Duration::from_secs(20), || {
        let reservations = &reservations;
        async move { (reserved_cidrs(reservations).await? == expected[2..]).then_some(()) }
    })
    .await;
    pools
        .delete("blue", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the reservation to empty", Duration::from_secs(20), || {
        let reservations = &reservations;
        async move { reserved_cidrs(reservations).await?.is_empty().then_some(()) }
    })
    .await;

    // A pool deleted through the watch stops admitting its IPs.
    calico_pools
        .delete("fixed", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the deleted Calico pool to be forgotten",
        Duration::from_secs(20),
        || {
            let server = &server;
            let review = ask(5, "10.10.0.6");
            async move {
                let response = server.mutate(&review).await;
                (response["allowed"] == false).then_some(())
            }
        },
    )
    .await;
    assert_rbac_covers(&fake);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_calico_reservation_off_no_ipreservation_is_written() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    install_foreign_crds(
        &client,
        &[
            ("crd.projectcalico.org", "IPPool", "ippools"),
            ("crd.projectcalico.org", "IPReservation", "ipreservations"),
        ],
    )
    .await;
    let calico_pools: Api<DynamicObject> = Api::all_with(client.clone(), &calico_ippools());
    create_spec(
        &calico_pools,
        &calico_ippools(),
        "auto",
        json!({"cidr": "10.20.0.0/24"}),
    )
    .await;
    let server = fake.replica(&["--calico-reservation=false"]).await;
    // The warning shows the Calico pools are known, and stays: nothing reserves the IPs.
    eventually(
        "the Calico pools to be known",
        Duration::from_secs(20),
        || {
            let server = &server;
            async move {
                let response = server
                    .validate(&deployment_review("CREATE", "web", "10.20.0.7"))
                    .await;
                (!calico_warnings(&response).is_empty()).then_some(())
            }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reservations: Api<DynamicObject> = Api::all_with(client, &calico_reservations());
    assert!(reserved_cidrs(&reservations).await.is_none());
    let response = server
        .validate(&deployment_review("UPDATE", "web", "10.20.0.7"))
        .await;
    assert_eq!(calico_warnings(&response).len(), 1, "{response}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_ovn_subnets_and_exclude_ips_gate_fixed_ips_through_the_watch() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    install_foreign_crds(&client, &[("kubeovn.io", "Subnet", "subnets")]).await;
    let subnets: Api<DynamicObject> = Api::all_with(client.clone(), &kube_ovn_subnets());
    create_spec(
        &subnets,
        &kube_ovn_subnets(),
        "net1",
        json!({"cidrBlock": "10.16.0.0/16", "excludeIps": ["10.16.0.1..10.16.0.10"]}),
    )
    .await;
    let server = fake.replica(&["--cni", "kube-ovn"]).await;
    let ask = |n: u32, list: &str| {
        create(
            &format!("ovn-{n}"),
            pod("prod", &format!("app{n}"), "web-", Some(list)),
        )
    };
    let denied = eventually("the Subnets to be known", Duration::from_secs(20), || {
        let server = &server;
        let review = ask(1, "10.17.0.5");
        async move {
            let response = server.mutate(&review).await;
            (response["allowed"] == false).then_some(response)
        }
    })
    .await;
    let text = message(&denied);
    assert!(
        text.contains("IP 10.17.0.5 of")
            && text.contains("lies in no Kube-OVN Subnet (Subnets: net1 10.16.0.0/16)"),
        "{text}"
    );
    let response = server.mutate(&ask(2, "10.16.0.5")).await;
    assert_eq!(response["allowed"], false, "{response}");
    assert!(
        message(&response).contains("IP 10.16.0.5 of")
            && message(&response).contains("excludeIps of Kube-OVN Subnet net1"),
        "{response}"
    );
    let response = server.mutate(&ask(3, "10.16.0.50")).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(allocated_ip(&response), "10.16.0.50");

    // A Subnet added, then deleted, through the watch.
    create_spec(
        &subnets,
        &kube_ovn_subnets(),
        "net2",
        json!({"cidrBlock": "10.17.0.0/24"}),
    )
    .await;
    eventually(
        "the new Subnet to be known",
        Duration::from_secs(20),
        || {
            let server = &server;
            let review = ask(4, "10.17.0.5");
            async move {
                let response = server.mutate(&review).await;
                (response["allowed"] == true).then_some(())
            }
        },
    )
    .await;
    subnets
        .delete("net2", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the deleted Subnet to be forgotten",
        Duration::from_secs(20),
        || {
            let server = &server;
            let review = ask(5, "10.17.0.6");
            async move {
                let response = server.mutate(&review).await;
                (response["allowed"] == false).then_some(())
            }
        },
    )
    .await;
    assert_rbac_covers(&fake);
}

/// A Pod DELETE review, as the API server sends it when the pod's deletion starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_review_frees_the_ip_only_once_the_pod_is_verified_gone() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let server = fake.replica(&["--release-delay", "0s"]).await;
    let claims: Api<IPClaim> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let object = pod("default", "api", "api-", Some("10.82.0.1"));
    let response = server.mutate(&create("api-1", object.clone())).await;
    assert_eq!(allocated_ip(&response), "10.82.0.1");
    let running = persist_pod(&pods, apply(&object, &response), "api-abcde").await;
    let phase = |claim: Option<IPClaim>| claim.and_then(|c| c.status).map(|s| s.phase);
    eventually("the claim to be bound", Duration::from_secs(15), || async {
        (phase(claims.get_opt("10.82.0.1").await.ok()?).as_deref() == Some("Bound")).then_some(())
    })
    .await;

    // A forged DELETE review for the running pod (grace 0): the claim turns Terminating, but
    // the pod is still there when the grace ends, so it keeps its IP.
    let answer = server.mutate(&common::delete_review(&running, 0)).await;
    assert_eq!(answer["allowed"], true);
    eventually(
        "the release to be refused",
        Duration::from_secs(15),
        || async {
            let (_, metrics) = server.admin_get("/metrics").await;
            metrics
                .contains("ip_webhook_releases_refused_total 1")
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        phase(claims.get_opt("10.82.0.1").await.unwrap()).as_deref(),
        Some("Bound")
    );
    let refused = server
        .mutate(&create(
            "api-2",
            pod("default", "api", "api-", Some("10.82.0.1")),
        ))
        .await;
    assert_eq!(refused["allowed"], false);
    assert!(
        message(&refused).contains("10.82.0.1 by default/api-abcde"),
        "{refused}"
    );

    // The real deletion: the pod goes, its DELETE review comes, and the IP is free again.
    let answer = server.mutate(&common::delete_review(&running, 0)).await;
    assert_eq!(answer["allowed"], true);
    pods.delete("api-abcde", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the claim to be released",
        Duration::from_secs(15),
        || async {
            claims
                .get_opt("10.82.0.1")
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
    let next = eventually(
        "the IP to be given again",
        Duration::from_secs(10),
        || async {
            let response = server
                .mutate(&create(
                    "api-3",
                    pod("default", "api", "api-", Some("10.82.0.1")),
                ))
                .await;
            (response["allowed"] == true).then(|| allocated_ip(&response))
        },
    )
    .await;
    assert_eq!(next, "10.82.0.1");
    assert_rbac_covers(&fake);
}

/// Against the fake API server: pods written straight to the API
/// (no webhook saw them). Two live pods carrying one IP get a Warning Event `DuplicateIP`
/// each and count in `ip_webhook_duplicate_ips`, and the older one's claim is recorded; a pod
/// with only the `allocated-ip` label and no claim token is never adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_are_reported_and_a_bare_label_is_not_adopted() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let server = fake
        .replica(&["--lease-duration", "2s", "--lease-renew-interval", "200ms"])
        .await;
    let claims: Api<IPClaim> = Api::all(client.clone());
    let token = |n: u8| format!("{n:032x}");
    let by_hand = |namespace: &str, name: &str, ip: &str, token: Option<String>| {
        let mut object = pod(namespace, "web", "", None);
        object["metadata"]["name"] = json!(name);
        object["metadata"]["labels"]["ip-webhook.io/allocated-ip"] = json!(ip);
        if let Some(token) = token {
            object["metadata"]["annotations"]["ip-webhook.io/claim"] = json!(token);
        }
        serde_json::from_value::<Pod>(object).unwrap()
    };
    let default_pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "dev"}})).unwrap(),
        )
        .await
        .unwrap();
    let dev_pods: Api<Pod> = Api::namespaced(client.clone(), "dev");
    let older = default_pods
        .create(
            &PostParams::default(),
            &by_hand("default", "web-old", "10.97.40.1", Some(token(1))),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    default_pods
        .create(
            &PostParams::default(),
            &by_hand("default", "web-new", "10.97.40.1", Some(token(2))),
        )
        .await
        .unwrap();
    dev_pods
        .create(
            &PostParams::default(),
            &by_hand("dev", "squat", "10.97.9.5", None),
        )
        .await
        .unwrap();

    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let warned = common::events::events_on(&events, "DuplicateIP", 2).await;
    assert_eq!(warned[0].type_.as_deref(), Some("Warning"));
    let note = warned[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("10.97.40.1") && note.contains("the oldest, default/web-old, keeps it"),
        "{note}"
    );
    let (_, exposition) = server.admin_get("/metrics").await;
    assert!(
        exposition.contains("ip_webhook_duplicate_ips 1\n"),
        "{exposition}"
    );
    let kept = eventually("the older pod's claim", Duration::from_secs(10), || async {
        claims.get_opt("10.97.40.1").await.ok()?
    })
    .await;
    assert_eq!(kept.spec.pod_uid, older.metadata.uid);
    // the same passes saw dev/squat and recorded nothing for it
    assert!(claims.get_opt("10.97.9.5").await.unwrap().is_none());
}

/// `kubectl delete ipclaim` on a running pod's claim freed its IP, and
/// the next pod was granted it. IPClaims carry a finalizer now: the deletion only marks the
/// claim, the IP stays held while the pod runs, and the reconciler lets the claim go once
/// the pod is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_running_pods_ipclaim_does_not_free_its_ip() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let server = fake
        .replica(&["--lease-duration", "2s", "--lease-renew-interval", "200ms"])
        .await;
    let claims: Api<IPClaim> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let object = pod("default", "web", "web-", Some("10.97.60.1"));
    let response = server.mutate(&create("fin-1", object.clone())).await;
    assert_eq!(allocated_ip(&response), "10.97.60.1");
    let live = persist_pod(&pods, apply(&object, &response), "web-f1n4l").await;
    let bound = eventually("the claim to be bound", Duration::from_secs(15), || async {
        let claim = claims.get("10.97.60.1").await.ok()?;
        (claim.status.as_ref().map(|s| s.phase.as_str()) == Some("Bound")).then_some(claim)
    })
    .await;
    assert_eq!(
        bound.metadata.finalizers,
        Some(vec!["ip-webhook.io/pod-gone".to_string()])
    );

    claims
        .delete("10.97.60.1", &DeleteParams::default())
        .await
        .unwrap();
    let marked = claims.get("10.97.60.1").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    // a reconcile pass and a fresh admission later, the IP is still held by the running pod
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(claims.get_opt("10.97.60.1").await.unwrap().is_some());
    let response = server.mutate(&create("fin-2", object.clone())).await;
    assert_eq!(response["allowed"], false, "{response}");
    assert!(
        message(&response).contains("web-f1n4l"),
        "the refusal names the holder: {response}"
    );

    // the pod goes (no DELETE review reaches the webhook): the claim goes with it
    pods.delete("web-f1n4l", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the claim to go", Duration::from_secs(20), || async {
        claims
            .get_opt("10.97.60.1")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    drop(live);
}

/// `status` with many claims that name their pods: one paged list of the pods carrying our
/// label names their nodes (not a read of each pod), and a pod without the label (adopted by
/// its list) is still read on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_the_nodes_of_many_claims_from_one_list_of_our_pods() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let kubeconfig = fake.kubeconfig().display().to_string();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<IPClaim> = Api::all(client.clone());
    let count = 80;
    for i in 0..count {
        let ip = format!("10.78.0.{}", i + 1);
        // the last pod carries no label of ours: a pod its app's list adopted
        let labels = if i + 1 == count {
            json!({"app": "web"})
        } else {
            json!({"app": "web", "ip-webhook.io/allocated-ip": ip})
        };
        let object: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": format!("web-{i}"), "namespace": "default", "labels": labels,
                "annotations": {"cni.projectcalico.org/ipAddrs": format!("[\"{ip}\"]")},
            },
            "spec": {"nodeName": format!("node-{}", i % 3), "containers": [{"name": "c", "image": "i"}]},
        }))
        .unwrap();
        let created = pods.create(&PostParams::default(), &object).await.unwrap();
        let claim: IPClaim = serde_json::from_value(json!({
            "apiVersion": "ip-webhook.io/v1alpha1", "kind": "IPClaim",
            "metadata": {"name": ip},
            "spec": {"ip": ip, "namespace": "default", "app": "web", "podName": format!("web-{i}"),
                     "podUid": created.metadata.uid, "requestUid": format!("req-{i}"),
                     "source": "Allocated"},
        }))
        .unwrap();
        let mut stored = claims.create(&PostParams::default(), &claim).await.unwrap();
        stored.status = Some(serde_json::from_value(json!({"phase": "Bound"})).unwrap());
        claims
            .replace_status(&ip, &PostParams::default(), &stored)
            .await
            .unwrap();
    }
    fake.control("/fake/requests/clear", json!({}));
    let (ok, json, stderr) = command(
        ["status", "-o", "json", "--kubeconfig", &kubeconfig]
            .map(str::to_string)
            .to_vec(),
    )
    .await;
    assert!(ok, "{stderr}");
    let report: Value = serde_json::from_str(&json).unwrap();
    let holders = report["apps"][0]["holders"].as_array().unwrap();
    assert_eq!(holders.len(), count, "{json}");
    for holder in holders {
        let ip: std::net::Ipv4Addr = holder["ip"].as_str().unwrap().parse().unwrap();
        let i = ip.octets()[3] as usize - 1;
        assert_eq!(holder["node"], json!(format!("node-{}", i % 3)), "{holder}");
    }
    let log = fake.get_json("/fake/requests");
    let requests = log["requests"].as_array().unwrap();
    let single_reads: Vec<&Value> = requests
        .iter()
        .filter(|r| r["method"] == "GET")
        .filter(|r| {
            r["path"]
                .as_str()
                .unwrap_or("")
                .starts_with("/api/v1/namespaces/default/pods/")
        })
        .collect();
    assert_eq!(
        single_reads.len(),
        1,
        "only the unlabelled pod is read on its own: {single_reads:?}"
    );
    assert_eq!(
        single_reads[0]["path"],
        format!("/api/v1/namespaces/default/pods/web-{}", count - 1)
    );
    assert!(
        requests.iter().any(|r| r["path"] == "/api/v1/pods"
            && r["query"]
                .as_str()
                .unwrap_or("")
                .contains("labelSelector=ip-webhook.io")),
        "one list of the pods carrying our label: {requests:?}"
    );
}
