//! The core promises of a StatefulSet pod's claim, across three replicas sharing one ledger
//! (IPClaims, or real etcd with the API server for pods) and off-cluster: a pod recreated the
//! moment its old pod is gone gets its IP back on any replica, however far that replica's
//! copy lags; a fixed name is never given to a second create while its pod exists; a
//! reservation whose `/validate` was missed is bound to its stored pod by the leader and never
//! handed to a copy of it; a replica whose pod index lags asks before refusing an IP its peer
//! granted; and a churn of StatefulSets gives every recreated ordinal its old IP back.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::admission::{self, Census, api_error, create_pod, delete_pod, statefulset_pod};
use common::etcd_cluster::EtcdCluster;
use common::fakeapi::{FakeApi, persist_pod};
use common::{TestServer, allocated_ip, apply, create, eventually, message};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::{Value, json};

const NS: &str = "default";

/// Timers short enough for a test; the sticky grace outlasts every test here, however busy
/// the machine (a StatefulSet pod's IP must stay kept while its pod is recreated).
const FAST: &[&str] = &[
    "--reservation-ttl",
    "3s",
    "--release-delay",
    "0s",
    "--sticky-grace",
    "60s",
    "--resync-period",
    "2s",
    "--lease-namespace",
    "default",
    "--lease-duration",
    "2s",
    "--lease-renew-interval",
    "200ms",
];

/// Which ledger the replicas share.
enum Ledger {
    IpClaims,
    /// built only with the `etcd` feature
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Etcd(EtcdCluster),
}

impl Ledger {
    #[cfg(feature = "etcd")]
    fn etcd(test: &str) -> Ledger {
        let binary = common::etcd_cluster::etcd_binary(test);
        Ledger::Etcd(EtcdCluster::start(&binary, 1))
    }

    /// A replica over this ledger, asking `fake` (through `port`: one of its listeners) for
    /// pods.
    async fn replica(&self, fake: &FakeApi, port: u16, extra: &[&str]) -> TestServer {
        let mut args = FAST.to_vec();
        args.extend_from_slice(extra);
        match self {
            Ledger::IpClaims => fake.replica_via(port, &args).await,
            Ledger::Etcd(etcd) => {
                fake.etcd_replica_via(port, &etcd.endpoints_flag(), &args)
                    .await
            }
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Ledger::IpClaims => "IPClaims",
            Ledger::Etcd(_) => "etcd",
        }
    }
}

/// A StatefulSet pod `db-N` of app `db` (as its controller writes it), not scheduled.
fn db(ordinal: u32, list: &str) -> Value {
    let mut pod = statefulset_pod("db", ordinal, "db", list, 0);
    pod["metadata"]["namespace"] = json!(NS);
    pod["spec"].as_object_mut().unwrap().remove("nodeName");
    pod
}

/// Admit `object` on `replica`, store it as `name`, validate it there: its IP and the pod.
async fn admit(replica: &TestServer, pods: &Api<Pod>, object: Value, name: &str) -> (String, Pod) {
    let response = replica
        .mutate(&create(&format!("m-{name}"), object.clone()))
        .await;
    assert_eq!(response["allowed"], true, "{name}: {}", message(&response));
    let ip = allocated_ip(&response);
    let stored = persist_pod(pods, apply(&object, &response), name).await;
    let validated = replica
        .validate(&create(
            &format!("v-{name}"),
            serde_json::to_value(&stored).unwrap(),
        ))
        .await;
    assert_eq!(
        validated["allowed"],
        true,
        "{name}: {}",
        message(&validated)
    );
    (ip, stored)
}

/// The pod's DELETE reviewed by `replica` (grace 0), and the pod removed.
async fn remove(replica: &TestServer, pods: &Api<Pod>, pod: &Pod) {
    let answer = replica.mutate(&common::delete_review(pod, 0)).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    pods.delete(
        pod.metadata.name.as_deref().unwrap(),
        &DeleteParams::default().grace_period(0),
    )
    .await
    .unwrap();
}

/// db-0 admitted on replica A, deleted with grace 0, another pod of the app admitted on B a
/// second later, db-0 created again on C: it gets its IP back, whether or not C's copy of the
/// claims (5 s behind, with IPClaims) or the leader has caught up.
async fn recreated_at_once(ledger: Ledger) {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let lagging = fake.listen();
    let (a, b) = (
        ledger.replica(&fake, fake.port, &[]).await,
        ledger.replica(&fake, fake.port, &[]).await,
    );
    let c = ledger.replica(&fake, lagging, &[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let list = "10.97.3.1,10.97.3.2,10.97.3.3";
    let (ip, old) = admit(&a, &pods, db(0, list), "db-0").await;
    assert_eq!(ip, "10.97.3.1");
    // C's copy shows db-0 bound, and from now on learns of claims 5 s late (IPClaims)
    eventually("C to see db-0 bound", Duration::from_secs(10), || async {
        let claim = c.launched.webhook.allocator.holder(&ip.parse().unwrap())?;
        claim.pod.uid.is_some().then_some(())
    })
    .await;
    fake.control(
        "/fake/config",
        json!({"watchDelay": [{"port": lagging, "resource": "ipclaims", "seconds": 5}]}),
    );
    remove(&a, &pods, &old).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut other = common::pod(NS, "db", "db-other-", Some(list));
    other["metadata"]["namespace"] = json!(NS);
    let (other_ip, _) = admit(&b, &pods, other, "db-other").await;
    assert_ne!(
        other_ip,
        ip,
        "{}: db-0's IP is kept for it; the replicas' views of it now (A, B, C): {:?}",
        ledger.name(),
        [&a, &b, &c].map(|r| r.launched.webhook.allocator.holder(&ip.parse().unwrap()))
    );
    let (again, _) = admit(&c, &pods, db(0, list), "db-0").await;
    assert_eq!(
        again,
        ip,
        "{}: db-0 recreated on C gets its IP back",
        ledger.name()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_ipclaims_a_statefulset_pod_recreated_at_once_gets_its_ip_back() {
    recreated_at_once(Ledger::IpClaims).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcd_a_statefulset_pod_recreated_at_once_gets_its_ip_back() {
    recreated_at_once(Ledger::etcd(
        "with_etcd_a_statefulset_pod_recreated_at_once_gets_its_ip_back",
    ))
    .await;
}

/// Off-cluster the webhook saw db-0's DELETE and knows it runs for its grace: a second CREATE
/// of db-0 meanwhile (which the API server would refuse as AlreadyExists) is refused, naming
/// the pod that holds the IP; once the grace is over, db-0 gets its IP back, one claim of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_cluster_a_fixed_name_created_within_its_old_pods_grace_is_refused() {
    let server = TestServer::start(&["--release-delay", "1s"]).await;
    let list = "10.4.0.1-10.4.0.3";
    let response = server.mutate(&create("m-1", db(0, list))).await;
    assert_eq!(allocated_ip(&response), "10.4.0.1", "{response}");
    let mut stored = apply(&db(0, list), &response);
    stored["metadata"]["uid"] = json!("uid-db-0-old");
    let validated = server.validate(&create("v-1", stored.clone())).await;
    assert_eq!(validated["allowed"], true, "{validated}");
    let pod: Pod = serde_json::from_value(stored).unwrap();
    let answer = server.mutate(&common::delete_review(&pod, 4)).await;
    assert_eq!(answer["allowed"], true, "{answer}");

    let second = server.mutate(&create("m-2", db(0, list))).await;
    assert_eq!(second["allowed"], false, "{second}");
    let text = message(&second);
    assert!(
        text.contains("default/db-0") && text.contains("10.4.0.1"),
        "{text}"
    );

    let again = eventually(
        "db-0 to be admitted once its old pod's grace is over",
        Duration::from_secs(15),
        || async {
            let response = server.mutate(&create("m-3", db(0, list))).await;
            (response["allowed"] == true).then(|| allocated_ip(&response))
        },
    )
    .await;
    assert_eq!(again, "10.4.0.1");
    let held = server
        .launched
        .webhook
        .allocator
        .claims()
        .into_iter()
        .filter(|c| c.locks_ip() && c.pod.name.as_str() == "db-0")
        .count();
    assert_eq!(held, 1, "one claim for default/db-0");
}

/// A pod stored while `/validate` was not reached keeps its reservation: the leader binds it
/// to the stored pod, after which a copy of the pod carrying its annotations is refused; a
/// second CREATE of a running db-0 whose reservation was never bound takes nothing over.
async fn unbound_reservations(ledger: Ledger) {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let (a, b) = (
        ledger.replica(&fake, fake.port, &[]).await,
        ledger.replica(&fake, fake.port, &[]).await,
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let list = "10.98.4.1-10.98.4.4";
    let object = common::pod(NS, "web", "web-", Some(list));
    let response = a.mutate(&create("m-web", object.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");
    let ip = allocated_ip(&response);
    let patched = apply(&object, &response);
    let original = persist_pod(&pods, patched.clone(), "web-original").await;
    let response = a.mutate(&create("m-db", db(0, list))).await;
    assert_eq!(response["allowed"], true, "{response}");
    let db_ip = allocated_ip(&response);
    persist_pod(&pods, apply(&db(0, list), &response), "db-0").await;

    // the leader binds both reservations to their stored pods
    let bound_to = |ip: String| {
        let a = &a;
        async move {
            let claim = a.launched.webhook.allocator.holder(&ip.parse().unwrap())?;
            claim.pod.uid.clone()
        }
    };
    let uid = eventually(
        &format!("{}: the reservation to be bound", ledger.name()),
        Duration::from_secs(15),
        || bound_to(ip.clone()),
    )
    .await;
    assert_eq!(Some(uid.as_str()), original.metadata.uid.as_deref());
    eventually(
        &format!("{}: db-0's reservation to be bound", ledger.name()),
        Duration::from_secs(15),
        || bound_to(db_ip.clone()),
    )
    .await;

    // a copy of the stored pod carrying its annotations is another pod
    let mut copy = patched;
    copy["metadata"]["name"] = json!("web-copy");
    copy["metadata"]["uid"] = json!("uid-web-copy");
    let refused = b.validate(&create("v-copy", copy)).await;
    assert_eq!(refused["allowed"], false, "{}: {refused}", ledger.name());
    // a second CREATE of the running db-0 takes nothing over
    let second = b.mutate(&create("m-db-again", db(0, list))).await;
    assert_eq!(second["allowed"], false, "{}: {second}", ledger.name());
    let claim = a
        .launched
        .webhook
        .allocator
        .holder(&db_ip.parse().unwrap())
        .unwrap();
    assert!(claim.pod.uid.is_some() && claim.locks_ip(), "{claim:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_ipclaims_a_reservation_is_bound_to_its_stored_pod_and_never_taken_over() {
    unbound_reservations(Ledger::IpClaims).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcd_a_reservation_is_bound_to_its_stored_pod_and_never_taken_over() {
    unbound_reservations(Ledger::etcd(
        "with_etcd_a_reservation_is_bound_to_its_stored_pod_and_never_taken_over",
    ))
    .await;
}

/// A replica whose pod watch lags 5 s still admits the IP its peer granted after the pod that
/// ran on it went: it asks the API server about that pod before refusing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_pod_watch_lags_asks_before_refusing_an_ip() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let slow_port = fake.listen();
    let fast = Ledger::IpClaims.replica(&fake, fake.port, &[]).await;
    let slow = Ledger::IpClaims.replica(&fake, slow_port, &[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let object = || common::pod(NS, "solo", "solo-", Some("10.98.5.1"));
    let (ip, first) = admit(&fast, &pods, object(), "solo-1").await;
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
    pods.patch_status(
        "solo-1",
        &Default::default(),
        &kube::api::Patch::Merge(&status),
    )
    .await
    .unwrap();
    // the slow replica has seen it run on the IP; from now on it sees pods 5 s late
    tokio::time::sleep(Duration::from_secs(1)).await;
    let delays = |resources: &[&str]| {
        let rules: Vec<Value> = resources
            .iter()
            .map(|r| json!({"port": slow_port, "resource": r, "seconds": 5}))
            .collect();
        fake.control("/fake/config", json!({"watchDelay": rules}));
    };
    delays(&["pods"]);
    remove(&fast, &pods, &first).await;
    // both replicas see its claim go; the slow one still sees the pod run on the IP
    for replica in [&fast, &slow] {
        eventually("the IP to be freed", Duration::from_secs(10), || async {
            replica
                .launched
                .webhook
                .allocator
                .holder(&ip.parse().unwrap())
                .is_none()
                .then_some(())
        })
        .await;
    }
    // the next claims reach the slow replica late too: the IP's next grant is not in its copy
    delays(&["pods", "ipclaims"]);
    let response = fast.mutate(&create("m-2", object())).await;
    assert_eq!(allocated_ip(&response), ip, "{response}");
    let second = persist_pod(&pods, apply(&object(), &response), "solo-2").await;
    let validated = slow
        .validate(&create("v-2", serde_json::to_value(&second).unwrap()))
        .await;
    assert_eq!(validated["allowed"], true, "{}", message(&validated));
}

/// A StatefulSet's controller at work through the admission chain (the fake API server calls
/// the three replicas' webhooks, its fake CNI starts the pods): pods deleted with grace 0 or 1
/// and recreated the moment they are gone, scale-downs and scale-ups. Every recreated ordinal
/// must get its old IP back, no two live pods share an IP, and no live pod lacks its claim.
async fn statefulset_churn(ledger: Ledger) {
    let fake = FakeApi::start_with(&["--kubelet-delay", "0.3"]);
    fake.control("/fake/config", json!({"fakeCni": true, "cniDelay": 0.05}));
    let client = fake.install_crds().await;
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(ledger.replica(&fake, fake.port, &[]).await);
    }
    admission::register(&fake, &replicas.iter().collect::<Vec<_>>(), json!({}));
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let list = "10.62.0.1-10.62.0.8";
    let set = |ordinal: u32| {
        let mut pod = statefulset_pod("db", ordinal, "db", list, 1);
        pod["metadata"]["namespace"] = json!(NS);
        pod
    };
    let ip_of = |pod: &Pod| -> String {
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        serde_json::from_str::<Vec<String>>(&annotations["cni.projectcalico.org/ipAddrs"]).unwrap()
            [0]
        .clone()
    };
    let mut first_ip: BTreeMap<u32, String> = BTreeMap::new();
    let (mut recreated, mut kept, mut duplicates, mut lost) = (0, 0, 0, Vec::new());
    let create = |ordinal: u32| {
        let pods = pods.clone();
        let object = set(ordinal);
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                match create_pod(&pods, &object).await {
                    Ok(pod) => return pod,
                    Err(error) => {
                        // the controller retries a refused or conflicting create
                        assert!(
                            Instant::now() < deadline,
                            "db-{ordinal} never created: {:?}",
                            api_error(&error)
                        );
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }
    };
    for ordinal in 0..4 {
        let pod = create(ordinal).await;
        first_ip.insert(ordinal, ip_of(&pod));
    }
    let gone = |name: String| {
        let pods = pods.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(15);
            while pods.get_opt(&name).await.unwrap().is_some() {
                assert!(Instant::now() < deadline, "{name} never went");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    for round in 0..12u32 {
        // a rolling restart step, a pod deleted at once, or a scale down and up
        let ordinal = round % 4;
        let name = format!("db-{ordinal}");
        let grace = if round % 3 == 0 { Some(0) } else { Some(1) };
        delete_pod(&pods, &name, grace).await.unwrap();
        gone(name.clone()).await;
        if round % 4 == 3 {
            tokio::time::sleep(Duration::from_millis(1500)).await; // scaled down a while
        }
        let pod = create(ordinal).await;
        recreated += 1;
        if ip_of(&pod) == first_ip[&ordinal] {
            kept += 1;
        }
        if let Ledger::IpClaims = ledger {
            let census = Census::take(&client, NS).await;
            duplicates += census.duplicates.len();
            lost.extend(census.lost);
        }
    }
    let cni = fake.get_json("/fake/cni");
    let conflicts = cni["conflicts"]
        .as_array()
        .map(|a| a.iter().filter(|x| x["holderTerminating"] == false).count())
        .unwrap_or(0);
    println!(
        "{}: {kept} of {recreated} recreated ordinals got their IP back, {duplicates} duplicates, {} lost claims, {conflicts} CNI conflicts with a live pod",
        ledger.name(),
        lost.len()
    );
    assert_eq!(
        kept,
        recreated,
        "{}: every ordinal its old IP",
        ledger.name()
    );
    assert_eq!(
        duplicates + conflicts,
        0,
        "{}: one live pod per IP",
        ledger.name()
    );
    assert!(lost.is_empty(), "{}: {lost:?}", ledger.name());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_ipclaims_a_statefulset_churn_gives_every_ordinal_its_ip_back() {
    statefulset_churn(Ledger::IpClaims).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_etcd_a_statefulset_churn_gives_every_ordinal_its_ip_back() {
    statefulset_churn(Ledger::etcd(
        "with_etcd_a_statefulset_churn_gives_every_ordinal_its_ip_back",
    ))
    .await;
}
