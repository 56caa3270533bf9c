//! Faults and hand edits: what the ledgers and their indexes do with records they
//! cannot read, with a watch that lost history, and with prefixes spelled two ways. Each test
//! reproduces a finding against the fake API server (`tests/support/fakeapi.py`) or a real
//! single-member etcd on loopback.

mod common;

use common::{etcd_cluster, fakeapi};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ip_webhook_ipam::allocator::{AllocationRequest, Allocator};
use ip_webhook_ipam::ipset::{IpSet, parse_ip_spec};
use ip_webhook_ipam::messages::Scope;
use ip_webhook_ledger::crd::IPClaim;
use ip_webhook_ledger::{
    CreateOutcome, EtcdLedger, EtcdOptions, KubeLedger, Ledger, PodRef, corrupt_records,
    index_resyncs,
};
use kube::Api;
use kube::api::{Patch, PatchParams};

fn request<'a>(set: &'a IpSet, name: &str, uid: &'a str) -> AllocationRequest<'a> {
    AllocationRequest {
        scope: Scope::App {
            namespace: "dev",
            app: "web",
        },
        app: "web",
        pool: None,
        pod: PodRef {
            namespace: "dev".into(),
            name: name.into(),
            ..Default::default()
        },
        request_uid: uid,
        token: uid,
        candidates: set,
        ordinal: None,
        vm: None,
        migration: false,
        dry_run: false,
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

fn etcd_member(test: &str) -> (etcd_cluster::EtcdCluster, String) {
    let binary = etcd_cluster::etcd_binary(test);
    let cluster = etcd_cluster::EtcdCluster::start(&binary, 1);
    let endpoint = cluster.endpoints()[0].clone();
    (cluster, endpoint)
}

async fn etcd_ledger(endpoint: &str, prefix: &str) -> Arc<EtcdLedger> {
    Arc::new(
        EtcdLedger::connect(&EtcdOptions {
            endpoints: vec![endpoint.to_string()],
            prefix: prefix.into(),
            timeout: Duration::from_secs(10),
            ..EtcdOptions::default()
        })
        .await
        .expect("the test connects to etcd"),
    )
}

/// Finding 6: the `spec.ip` of IPClaim `10.97.12.1` patched to `.9` made every pod of the app
/// refused (the 409 re-read failed hard). Now the unreadable record is skipped and counted,
/// still holds `.1`, and the allocator goes on to `.2`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_edited_ipclaim_does_not_block_its_app() {
    let fake = fakeapi::FakeApi::start();
    let client = fake.install_crds().await;
    let ledger = Arc::new(KubeLedger::new(client.clone()));
    let set = parse_ip_spec("10.97.12.1-10.97.12.3").unwrap();

    let first = Allocator::new(ledger.clone()).await.unwrap();
    let got = first
        .allocate(&request(&set, "web-a", "req-a"))
        .await
        .unwrap();
    assert_eq!(got.ips, vec![ip("10.97.12.1")]);
    let held = first.holder(&ip("10.97.12.1")).unwrap();

    // the careless edit
    let claims: Api<IPClaim> = Api::all(client);
    claims
        .patch(
            "10.97.12.1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"ip": "10.97.12.9"}})),
        )
        .await
        .unwrap();

    let skipped_before = corrupt_records().get();
    // a replica starting now: load skips the record instead of failing
    let second = Allocator::new(ledger.clone()).await.unwrap();
    assert!(
        corrupt_records().get() > skipped_before,
        "the skip is counted"
    );
    assert!(second.holder(&ip("10.97.12.1")).is_none());

    // the allocator tries .1 (free in its index), meets the unreadable record, takes .2
    let got = second
        .allocate(&request(&set, "web-b", "req-b"))
        .await
        .unwrap();
    assert_eq!(got.ips, vec![ip("10.97.12.2")]);
    let stand_in = second.holder(&ip("10.97.12.1")).expect(".1 stays held");
    assert!(
        stand_in.pod.name.contains("IPClaim 10.97.12.1"),
        "{stand_in:?}"
    );
    let got = second
        .allocate(&request(&set, "web-c", "req-c"))
        .await
        .unwrap();
    assert_eq!(got.ips, vec![ip("10.97.12.3")]);

    // a release or phase change of the unreadable record changes nothing and is no error
    assert!(!ledger.release(&held).await.unwrap());
    let object = claims_get(&fake, "10.97.12.1").await;
    assert_eq!(
        object.spec.ip, "10.97.12.9",
        "the record is left for the operator"
    );
}

async fn claims_get(fake: &fakeapi::FakeApi, name: &str) -> IPClaim {
    Api::<IPClaim>::all(fake.client().await)
        .get(name)
        .await
        .unwrap()
}

/// Finding 6 in etcd: a value that is not a claim, or a claim on another IP than its key,
/// made `load` fail (no replica could start) and `create` deny. Both are skipped and counted
/// now, and their IPs stay held.
#[test]
fn unreadable_etcd_records_do_not_block_an_app() {
    let (_member, endpoint) = etcd_member("unreadable_etcd_records_do_not_block_an_app");
    block_on(async {
        let ledger = etcd_ledger(&endpoint, "/faults/").await;
        let set = parse_ip_spec("10.97.12.1-10.97.12.4").unwrap();
        let writer = Allocator::new(ledger.clone()).await.unwrap();
        writer
            .allocate(&request(&set, "web-a", "req-a"))
            .await
            .unwrap();
        let mut raw = etcd_client::Client::connect([endpoint.as_str()], None)
            .await
            .unwrap();
        // .1's record moved by hand to claim .9; .3 holds garbage
        let (key, value) = {
            let response = raw.get("/faults/10.97.12.1", None).await.unwrap();
            let kv = response.kvs()[0].clone();
            (kv.key().to_vec(), kv.value_str().unwrap().to_string())
        };
        let edited = value.replace("\"10.97.12.1\"", "\"10.97.12.9\"");
        assert_ne!(edited, value);
        raw.put(key, edited, None).await.unwrap();
        raw.put("/faults/10.97.12.3", "not json", None)
            .await
            .unwrap();

        let skipped_before = corrupt_records().get();
        let second = Allocator::new(ledger.clone())
            .await
            .expect("load skips what it cannot read");
        assert!(corrupt_records().get() >= skipped_before + 2);
        let got = second
            .allocate(&request(&set, "web-b", "req-b"))
            .await
            .unwrap();
        assert_eq!(got.ips, vec![ip("10.97.12.2")]);
        let got = second
            .allocate(&request(&set, "web-c", "req-c"))
            .await
            .unwrap();
        assert_eq!(got.ips, vec![ip("10.97.12.4")]);
        let error = second
            .allocate(&request(&set, "web-d", "req-d"))
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("all 4 allocatable IPs are held"), "{error}");
        let holder = second.holder(&ip("10.97.12.3")).unwrap();
        assert!(
            holder.pod.name.contains("etcd key /faults/10.97.12.3"),
            "{holder:?}"
        );
    });
}

/// Finding 5: replica A missed a release while its watch was away, etcd compacted that
/// history, and A refused the free IP until restarted. Now the watch reloads the prefix.
#[test]
fn etcd_index_is_reloaded_after_a_compaction_gap() {
    let (_member, endpoint) = etcd_member("etcd_index_is_reloaded_after_a_compaction_gap");
    block_on(async {
        let set = parse_ip_spec("10.97.30.1").unwrap();
        let b_ledger = etcd_ledger(&endpoint, "/gap/").await;
        let b = Allocator::new(b_ledger.clone()).await.unwrap();
        b.allocate(&request(&set, "web-a", "req-a")).await.unwrap();
        let claim = b.holder(&ip("10.97.30.1")).unwrap();

        // A loads while .1 is held, then is cut off from the watch
        let a_ledger = etcd_ledger(&endpoint, "/gap/").await;
        let a = Arc::new(Allocator::new(a_ledger.clone()).await.unwrap());
        assert!(a.holder(&ip("10.97.30.1")).is_some());

        assert!(b.release_claim(&claim).await.unwrap());
        let mut raw = etcd_client::Client::connect([endpoint.as_str()], None)
            .await
            .unwrap();
        // more history, then compact all of it
        raw.put("/elsewhere", "x", None).await.unwrap();
        let revision = raw
            .get("/elsewhere", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        raw.compact(revision, None).await.unwrap();

        let resyncs_before = index_resyncs().get();
        let weak = Arc::downgrade(&a);
        let reload = weak.clone();
        tokio::spawn(async move {
            a_ledger
                .watch(
                    |change| {
                        if let Some(a) = weak.upgrade() {
                            a.apply_observed(change);
                        }
                    },
                    |claims| {
                        if let Some(a) = reload.upgrade() {
                            a.replace_all(claims.into_iter().filter(|c| c.locks_ip()).collect());
                        }
                    },
                )
                .await
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while a.holder(&ip("10.97.30.1")).is_some() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "replica A still holds the released IP after the compaction gap"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            index_resyncs().get() > resyncs_before,
            "the reload is counted"
        );
        let got = a.allocate(&request(&set, "web-b", "req-b")).await.unwrap();
        assert_eq!(got.ips, vec![ip("10.97.30.1")]);
    });
}

/// Finding 5, the periodic resync: a record changed behind the watch's back (here: the
/// watch is told it has seen it already) is picked up within `resync_period`.
#[test]
fn etcd_index_is_reloaded_every_resync_period() {
    let (_member, endpoint) = etcd_member("etcd_index_is_reloaded_every_resync_period");
    block_on(async {
        let set = parse_ip_spec("10.97.31.1").unwrap();
        let ledger = Arc::new(
            EtcdLedger::connect(&EtcdOptions {
                endpoints: vec![endpoint.clone()],
                prefix: "/period/".into(),
                timeout: Duration::from_secs(10),
                resync_period: Duration::from_secs(1),
                ..EtcdOptions::default()
            })
            .await
            .unwrap(),
        );
        let a = Arc::new(Allocator::new(ledger.clone()).await.unwrap());
        let resyncs_before = index_resyncs().get();
        let weak = Arc::downgrade(&a);
        let reload = weak.clone();
        let watcher = ledger.clone();
        tokio::spawn(async move {
            watcher
                .watch(
                    |_ignored| {},
                    |claims| {
                        if let Some(a) = reload.upgrade() {
                            a.replace_all(claims.into_iter().filter(|c| c.locks_ip()).collect());
                        }
                    },
                )
                .await
        });
        drop(weak);
        // another replica claims .1; this one's watch events are dropped on the floor above,
        // so only the periodic reload can tell it
        let other = Allocator::new(etcd_ledger(&endpoint, "/period/").await)
            .await
            .unwrap();
        other
            .allocate(&request(&set, "web-a", "req-a"))
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while a.holder(&ip("10.97.31.1")).is_none() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the periodic resync never loaded the other replica's claim"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(index_resyncs().get() > resyncs_before);
    });
}

/// Finding 8: `--etcd-prefix /ip-webhook/` and `ip-webhook/` were two key spaces, so two
/// replicas configured each way granted one IP twice. Every spelling is one key space now.
#[test]
fn etcd_prefix_spellings_share_one_key_space() {
    let (_member, endpoint) = etcd_member("etcd_prefix_spellings_share_one_key_space");
    block_on(async {
        let set = parse_ip_spec("10.97.32.1").unwrap();
        let slash = etcd_ledger(&endpoint, "/ip-webhook/").await;
        let bare = etcd_ledger(&endpoint, "ip-webhook").await;
        let doubled = etcd_ledger(&endpoint, "//ip-webhook//").await;
        assert_eq!(slash.prefix(), "/ip-webhook/");
        assert_eq!(bare.prefix(), "/ip-webhook/");
        assert_eq!(doubled.prefix(), "/ip-webhook/");
        let a = Allocator::new(slash).await.unwrap();
        a.allocate(&request(&set, "web-a", "req-a")).await.unwrap();
        let claim = a.holder(&ip("10.97.32.1")).unwrap();
        let mut other = claim.clone();
        other.pod.name = "web-b".into();
        other.request_uid = "req-b".into();
        other.token = "req-b".into();
        match bare.create(other.clone().into()).await.unwrap() {
            CreateOutcome::AlreadyHeld(holder) => assert_eq!(holder.pod.name, "web-a"),
            outcome => panic!("ip-webhook (no slashes) did not see the claim: {outcome:?}"),
        }
    });
}

async fn wait_readyz(server: &common::TestServer, want: u16, within: Duration) -> String {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let (code, body) = server.admin_get("/readyz").await;
        if code == want {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz stayed {code} ({body:?}), expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Finding 8: `/readyz` stayed 200 while the API server answered 500 to everything. Now it
/// turns 503 after a few failed ledger calls (the prober asks every second), says why, and
/// recovers by itself once the API server answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_turns_503_while_the_api_server_fails_and_recovers() {
    let fake = fakeapi::FakeApi::start();
    fake.install_crds().await;
    let replica = fake.replica(&[]).await;
    wait_readyz(&replica, 200, Duration::from_secs(5)).await;
    fake.control(
        "/fake/fail",
        serde_json::json!({"method": "GET", "path": "ipclaims", "code": 500, "count": 100000}),
    );
    let why = wait_readyz(&replica, 503, Duration::from_secs(10)).await;
    assert!(
        why.contains("not ready: the ledger failed") && why.contains("in a row"),
        "{why}"
    );
    fake.control("/fake/fail", serde_json::json!({"clear": true}));
    wait_readyz(&replica, 200, Duration::from_secs(10)).await;
}

/// Finding 8 with etcd: `/readyz` stayed 200 while etcd was down. Now 503 while it is, 200
/// again after it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_etcd_down_and_back() {
    let binary = etcd_cluster::etcd_binary("readyz_follows_etcd_down_and_back");
    let mut cluster =
        tokio::task::spawn_blocking(move || etcd_cluster::EtcdCluster::start(&binary, 1))
            .await
            .unwrap();
    let endpoints = cluster.endpoints_flag();
    let replica = common::TestServer::start(&[
        "--ledger",
        "etcd",
        "--etcd-endpoints",
        &endpoints,
        "--etcd-timeout",
        "1s",
    ])
    .await;
    wait_readyz(&replica, 200, Duration::from_secs(10)).await;
    cluster.kill(0);
    let why = wait_readyz(&replica, 503, Duration::from_secs(15)).await;
    assert!(why.contains("not ready:"), "{why}");
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.restart(0);
        cluster.wait_healthy(Duration::from_secs(20));
        cluster
    })
    .await
    .unwrap();
    wait_readyz(&replica, 200, Duration::from_secs(30)).await;
    drop(cluster);
}

/// Finding 1: pod A (`web-7d4b9c-*`) is deleted and frees `.1`; its replacement B gets `.1`;
/// A's final DELETE (the kubelet's) then matched B's claim by generateName prefix and freed
/// it. Releases are by token and UID now: A's late DELETE frees nothing of B's, whatever the
/// ledger (here etcd, where the finding reproduced every time).
#[test]
fn a_pods_final_delete_does_not_free_its_replacements_ip() {
    let (_member, endpoint) = etcd_member("a_pods_final_delete_does_not_free_its_replacements_ip");
    block_on(async {
        use ip_webhook_ledger::claim::PodIdentity;
        let set = parse_ip_spec("10.97.50.1").unwrap();
        let allocator = Allocator::new(etcd_ledger(&endpoint, "/final/").await)
            .await
            .unwrap();
        let replicaset_pod = |uid: &'static str| AllocationRequest {
            pod: PodRef {
                namespace: "dev".into(),
                name: Default::default(),
                generate_name: "web-7d4b9c-".into(),
                uid: None,
            },
            ..request(&set, "", uid)
        };
        let a = allocator.allocate(&replicaset_pod("req-a")).await.unwrap();
        let a_ips = a.ips.clone();
        let a_pod = PodIdentity {
            namespace: "dev",
            name: "web-7d4b9c-aaaaa",
            uid: Some("uid-a"),
            token: Some(&a.token),
        };
        assert_eq!(
            allocator.bind(&a_pod, &a_ips, false).await.unwrap().len(),
            1
        );
        // A's deletion frees .1 (its grace over, the pod gone)
        assert_eq!(allocator.release_held(&a_pod, &a_ips).await.unwrap(), a_ips);
        let b = allocator.allocate(&replicaset_pod("req-b")).await.unwrap();
        assert_eq!(b.ips, a_ips, "the replacement gets .1");
        // A's final DELETE, seen again: same name prefix, A's UID and token
        assert!(
            allocator
                .release_held(&a_pod, &a_ips)
                .await
                .unwrap()
                .is_empty()
        );
        let held = allocator.holder(&a_ips[0]).expect("B still holds .1");
        assert_eq!(held.token, b.token);
        // a third pod is refused
        let error = allocator
            .allocate(&replicaset_pod("req-c"))
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("all 1 allocatable IPs are held"), "{error}");
    });
}
