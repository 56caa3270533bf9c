//! Replicas whose clocks disagree. A replica runs under `faketime` (libfaketime, Debian
//! `faketime`), ten minutes ahead of the others: no release decision may compare a time one
//! machine wrote with another machine's clock.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::api_order::{admit, delete};
use common::node_loss::{delete_pod, make_node, running_pod, set_ready};
use common::{BinaryServer, HttpsClient, etcd_cluster, fakeapi, http_get, pod};
use etcd_cluster::{EtcdCluster, etcd_binary};
use fakeapi::{FakeApi, bound_claim};
use ip_webhook_ledger::crd::IPClaim;
use ip_webhook_ledger::{EtcdLedger, EtcdOptions, Ledger};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;

/// The clock offset of the skewed replica.
const AHEAD: &str = "+600s";

/// `faketime` on PATH. A test that needs it fails without it, saying what to install.
fn faketime() -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("faketime"))
                .find(|path| path.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "clock_skew needs faketime on PATH (install Debian faketime, as scripts/install-test-deps.sh does)"
            )
        })
}

fn etcd_replica(
    wrapper: &[&str],
    cluster: &EtcdCluster,
    state_dir: &Path,
) -> (BinaryServer, HttpsClient) {
    let endpoints = cluster.endpoints_flag();
    let dir = state_dir.display().to_string();
    let server = BinaryServer::start_under(
        wrapper,
        &[
            "--ledger",
            "etcd",
            "--etcd-endpoints",
            &endpoints,
            "--etcd-prefix",
            "/skew",
            "--state-dir",
            &dir,
        ],
    );
    let ca = std::fs::read(state_dir.join("ca.crt")).unwrap();
    let client = HttpsClient::new(server.https_addr, &ca);
    (server, client)
}

/// etcd ledger, off-cluster: the DELETE reaches a replica with the right clock, which writes
/// the release time on its clock; the replica ten minutes ahead must still wait the pod's
/// grace, counted on its own clock from when it saw the DELETE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_ahead_waits_the_grace_the_delete_gave() {
    let faketime = faketime();
    let cluster = EtcdCluster::start(&etcd_binary("clock_skew"), 1);
    let (state_a, state_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_a, right) = etcd_replica(&[], &cluster, state_a.path());
    let (_b, ahead) = etcd_replica(
        &[faketime.to_str().unwrap(), "-f", AHEAD],
        &cluster,
        state_b.path(),
    );
    let web = || pod("default", "web", "web-", Some("10.61.0.1"));

    let running = admit(&right, web()).await.unwrap();
    const GRACE: u64 = 4;
    let deleted = right
        .mutate(&delete(&running, Some(GRACE as i64), false))
        .await;
    assert_eq!(deleted["allowed"], true, "{deleted}");
    let deleted_at = Instant::now();

    // Within the grace the IP is still the old pod's, on both replicas (the one ahead has had
    // its release timer run several times by now).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for (replica, name) in [(&ahead, "ahead"), (&right, "right")] {
        let refused = admit(replica, web()).await.unwrap_err();
        assert!(refused.contains("10.61.0.1"), "replica {name}: {refused}");
    }
    assert!(
        deleted_at.elapsed() < Duration::from_secs(GRACE),
        "the checks ran past the grace: the machine is too slow for this test"
    );

    // After the grace it is freed (not lost), and the replica ahead can grant it again.
    let deadline = Instant::now() + Duration::from_secs(15);
    let again = loop {
        match admit(&ahead, web()).await {
            Ok(pod) => break pod,
            Err(refused) => {
                assert!(Instant::now() < deadline, "never freed: {refused}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(deleted_at.elapsed() >= Duration::from_secs(GRACE));
    assert_eq!(
        again["metadata"]["labels"]["ip-webhook.io/allocated-ip"],
        "10.61.0.1"
    );
    // The replica that granted it really runs ahead: it dated the claim by its clock.
    let ledger = EtcdLedger::connect(&EtcdOptions {
        endpoints: cluster.endpoints(),
        prefix: "/skew".into(),
        timeout: Duration::from_secs(10),
        ..EtcdOptions::default()
    })
    .await
    .unwrap();
    let claim = ledger
        .load()
        .await
        .unwrap()
        .into_iter()
        .find(|c| c.is_held())
        .expect("the new pod's claim");
    let now = ip_webhook_ledger::unix_now();
    assert!(
        claim.created_at >= now + 590,
        "the claim was dated {} s from now, not ten minutes ahead",
        claim.created_at as i64 - now as i64
    );
}

/// IPClaim ledger: the Lease holder runs ten minutes ahead. A node's NotReady blip of a second
/// must not look like ten minutes of loss: node loss is counted on the leader's own clock from
/// when it saw the node go, never by comparing the node's `lastTransitionTime` with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_ahead_counts_a_nodes_loss_from_when_it_saw_it() {
    let faketime = faketime();
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let nodes: Api<Node> = Api::all(client.clone());
    make_node(&nodes, "n1").await;
    let state = tempfile::tempdir().unwrap();
    let kubeconfig = fake.kubeconfig().display().to_string();
    const GRACE: u64 = 5;
    let server = BinaryServer::start_under(
        &[faketime.to_str().unwrap(), "-f", AHEAD],
        &[
            "--ledger",
            "kubernetes",
            "--kubeconfig",
            &kubeconfig,
            "--node-lost-grace",
            &format!("{GRACE}s"),
            "--release-delay",
            "0s",
            "--state-dir",
            state.path().to_str().unwrap(),
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while http_get(server.admin_addr, "/readyz").await.0 != 200 {
        assert!(Instant::now() < deadline, "the replica never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ca = std::fs::read(state.path().join("ca.crt")).unwrap();
    let webhook = HttpsClient::new(server.https_addr, &ca);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<IPClaim> = Api::all(client.clone());
    let web = running_pod(
        &webhook,
        &pods,
        ("web-7d4b9-x2k8p", "web", "ReplicaSet", "n1", "10.62.0.1"),
    )
    .await;
    bound_claim(&claims, "10.62.0.1", Duration::from_secs(15)).await;
    delete_pod(&webhook, &pods, &web).await;
    let held = async || claims.get_opt("10.62.0.1").await.unwrap().is_some();

    // A blip: NotReady for a second, then Ready again.
    set_ready(&nodes, "n1", "Unknown", 0).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    set_ready(&nodes, "n1", "True", 0).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(held().await, "a 1 s NotReady blip released the pod's IP");

    // Lost for real: released once the grace has passed on the leader's clock, not before.
    set_ready(&nodes, "n1", "Unknown", 0).await;
    let lost_at = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(20);
    while held().await {
        assert!(Instant::now() < deadline, "the lost node's pod kept its IP");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        lost_at.elapsed() >= Duration::from_secs(GRACE - 1),
        "released {:?} after the node was lost, inside the grace of {GRACE}s",
        lost_at.elapsed()
    );
}
