//! Pods through the API server's real admission order: three in-process replicas behind the
//! shipped manifest's pod webhooks on `fakeapi.py` (mutate → patch → name and UID → validate →
//! store), a fake CNI that starts each scheduled pod on the IP its annotation names, and pods
//! created and deleted with kube-rs as a ReplicaSet and a StatefulSet do. What must hold: no
//! two live pods ever share an IP, every live pod's IP has a claim bound to its UID, and once
//! the pods are gone and the timers have run no claim is left but a StatefulSet pod's
//! Released one.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use admission::{Census, api_error, create_pod, delete_pod, replicaset_pod, statefulset_pod};
use common::{TestServer, admission, fakeapi};
use fakeapi::FakeApi;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::Mutex;

/// One app's list: 10 IPs for at most 7 live pods, so IPs are handed out again quickly.
const LIST: &str = "10.61.0.1-10.61.0.10";
const APP: &str = "web";
const NS: &str = "default";

/// Replica flags that make every timer short enough for a test: reservations expire after
/// 3 s, a deleted pod's IP is released once its grace is over and it is gone, a StatefulSet
/// pod's IP is kept 3 s for its name, the Lease turns over in 2 s.
const FAST: &[&str] = &[
    "--reservation-ttl",
    "3s",
    "--release-delay",
    "0s",
    "--sticky-grace",
    "3s",
    "--lease-duration",
    "2s",
    "--lease-renew-interval",
    "200ms",
];

/// A small deterministic generator (xorshift): the churn's timings vary from pod to pod.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.next() % (high - low + 1))
    }
}

/// An API server with the fake CNI, three replicas as the pod webhooks' backends.
struct Cluster {
    fake: FakeApi,
    client: Client,
    replicas: Vec<TestServer>,
}

impl Cluster {
    async fn start(admission_extra: Value, replica_flags: &[&str]) -> Cluster {
        let fake = FakeApi::start_with(&["--kubelet-delay", "0.3"]);
        fake.control("/fake/config", json!({"fakeCni": true, "cniDelay": 0.05}));
        let client = fake.install_crds().await;
        let mut flags = FAST.to_vec();
        flags.extend_from_slice(replica_flags);
        let mut replicas = Vec::new();
        for _ in 0..3 {
            replicas.push(fake.replica(&flags).await);
        }
        let backends: Vec<&TestServer> = replicas.iter().collect();
        admission::register(&fake, &backends, admission_extra);
        Cluster {
            fake,
            client,
            replicas,
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }
}

/// What a churn run counted.
#[derive(Debug, Default)]
struct Counts {
    creates: usize,
    deletes: usize,
    /// Creates the API server refused (a webhook's denial, e.g. every IP held).
    refused: usize,
    refusals: BTreeSet<String>,
    /// Of those, refused by /validate: these pods named no IP themselves, so a refusal as a
    /// static-IP conflict is a replica mistaking the pod's own reservation for another's.
    own_refused: usize,
    /// Claims the leaders' reconcilers dropped as leaked (ip_webhook_leaks_reclaimed_total).
    reclaimed: u64,
    duplicates: BTreeSet<(String, Vec<String>)>,
    lost: BTreeSet<String>,
    leaked: BTreeSet<String>,
    /// IPs the fake CNI gave a pod while another pod (live or terminating) still had them.
    cni_conflicts: usize,
}

/// Wait until the pod named `name` is gone (a StatefulSet creates the next pod of a name
/// only then).
async fn gone(pods: &Api<Pod>, name: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while pods.get_opt(name).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "pod {name} never went");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One worker: create a pod, let it run a little, delete it; again until `target` creates
/// were made in all. `set`: a StatefulSet slot (the fixed name `db-N`, recreated once the
/// old pod is gone); else a ReplicaSet slot (generateName).
async fn worker(
    pods: Api<Pod>,
    slot: u32,
    set: bool,
    target: usize,
    made: Arc<AtomicUsize>,
    counts: Arc<Mutex<Counts>>,
) {
    let mut dice = Dice(0x9E37_79B9_7F4A_7C15 ^ (u64::from(slot + 1) * 0x1000_0001));
    while made.load(Ordering::SeqCst) < target {
        let object = if set {
            statefulset_pod("db", slot, APP, LIST, 1)
        } else {
            replicaset_pod(APP, LIST, 1)
        };
        let pod = match create_pod(&pods, &object).await {
            Ok(pod) => pod,
            Err(error) => {
                let mut c = counts.lock().await;
                c.refused += 1;
                let (code, message) = api_error(&error).unwrap_or((0, error.to_string()));
                // the ledger's words only: the pod names vary from run to run
                let kind = message.split(" by ").next().unwrap_or("").to_string();
                if message.contains("pods.validate.ip-webhook.io") {
                    c.own_refused += 1;
                    // whole, to tell which holder /validate saw
                    c.refusals.insert(format!("{code} {message}"));
                } else {
                    c.refusals.insert(format!("{code} {kind}"));
                }
                drop(c);
                tokio::time::sleep(dice.millis(50, 150)).await;
                continue;
            }
        };
        made.fetch_add(1, Ordering::SeqCst);
        counts.lock().await.creates += 1;
        tokio::time::sleep(dice.millis(200, 600)).await;
        let name = pod.metadata.name.clone().unwrap();
        // ReplicaSet pods: half with their grace period (1 s), half at once (grace 0)
        let grace = if set || dice.next().is_multiple_of(2) {
            None
        } else {
            Some(0)
        };
        delete_pod(&pods, &name, grace).await.unwrap();
        counts.lock().await.deletes += 1;
        if set {
            gone(&pods, &name, Duration::from_secs(10)).await;
        }
    }
}

/// Churn `target` creates (and as many deletes) through the admission chain, watching the
/// invariants all along; then wait for the books to settle and count what is left.
async fn churn(cluster: &Cluster, target: usize) -> Counts {
    let counts = Arc::new(Mutex::new(Counts::default()));
    let made = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (client, counts, done) = (cluster.client.clone(), counts.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let census = Census::take(&client, NS).await;
                let mut c = counts.lock().await;
                c.duplicates.extend(census.duplicates);
                c.lost.extend(census.lost);
                drop(c);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let mut workers = Vec::new();
    for slot in 0..7u32 {
        // two StatefulSet slots (db-0, db-1), five ReplicaSet slots
        let set = slot < 2;
        workers.push(tokio::spawn(worker(
            cluster.pods(),
            slot,
            set,
            target,
            made.clone(),
            counts.clone(),
        )));
    }
    for w in workers {
        w.await.unwrap();
    }
    // Every pod is deleted: wait until they are gone, then until the timers settle the books.
    let pods = cluster.pods();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .is_empty()
    {
        assert!(Instant::now() < deadline, "pods left after the churn");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done.store(true, Ordering::SeqCst);
    monitor.await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let last = loop {
        let census = Census::take(&cluster.client, NS).await;
        if census.leaked.is_empty() || Instant::now() > deadline {
            break census;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let cni = cluster.fake.get_json("/fake/cni");
    let mut c = Arc::try_unwrap(counts).unwrap().into_inner();
    c.leaked = last.leaked;
    c.reclaimed = cluster
        .replicas
        .iter()
        .map(|r| r.launched.webhook.metrics.leaks_reclaimed.get())
        .sum();
    c.cni_conflicts = cni["conflicts"]
        .as_array()
        .map(|a| a.iter().filter(|x| x["holderTerminating"] == false).count())
        .unwrap_or(0);
    c
}

fn report(name: &str, c: &Counts, took: Duration) {
    println!(
        "{name}: {} creates, {} deletes, {} refused ({} by /validate) {:?}, {} reclaimed as leaks, \
         {} duplicates, {} lost claims, {} leaked, {} CNI conflicts with a live pod, in {:.1} s",
        c.creates,
        c.deletes,
        c.refused,
        c.own_refused,
        c.refusals,
        c.reclaimed,
        c.duplicates.len(),
        c.lost.len(),
        c.leaked.len(),
        c.cni_conflicts,
        took.as_secs_f64()
    );
    for d in &c.duplicates {
        println!("  duplicate: {d:?}");
    }
    for l in &c.lost {
        println!("  lost: {l}");
    }
    for l in &c.leaked {
        println!("  leaked: {l}");
    }
}

fn assert_clean(c: &Counts, target: usize) {
    assert!(c.creates >= target, "{} creates", c.creates);
    assert!(
        c.duplicates.is_empty() && c.cni_conflicts == 0,
        "two live pods on one IP: {:?} ({} CNI conflicts)",
        c.duplicates,
        c.cni_conflicts
    );
    assert!(
        c.lost.is_empty(),
        "live pods without their claim: {:?}",
        c.lost
    );
    assert_eq!(
        c.own_refused, 0,
        "pods refused for their own reservation: {:?}",
        c.refusals
    );
    assert!(
        c.leaked.is_empty(),
        "claims left without a pod: {:?}",
        c.leaked
    );
}

/// Creates (and as many deletes) per churn run with a delay injected.
const CREATES: usize = 250;
/// Creates (and as many deletes) of the run with no fault injected.
const CREATES_NO_FAULT: usize = 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn churn_through_the_admission_chain_never_gives_one_ip_twice() {
    let cluster = Cluster::start(json!({}), &[]).await;
    let started = Instant::now();
    let counts = churn(&cluster, CREATES_NO_FAULT).await;
    report("churn", &counts, started.elapsed());
    assert_clean(&counts, CREATES_NO_FAULT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn churn_with_a_slow_store_after_validate_never_gives_one_ip_twice() {
    // 0.15–0.4 s between /validate and the stored pod: a slower validating webhook beside
    // ours, or a slow etcd write.
    let cluster = Cluster::start(json!({"delayAfterValidate": [0.15, 0.4]}), &[]).await;
    let started = Instant::now();
    let counts = churn(&cluster, CREATES).await;
    report(
        "churn, 0.15-0.4 s after validate",
        &counts,
        started.elapsed(),
    );
    assert_clean(&counts, CREATES);
}

/// The claim of `ip` as the API server has it: (pod name, pod UID, phase).
async fn claim_of(client: &Client, ip: &str) -> Option<(String, Option<String>, String)> {
    let claims: Api<ip_webhook_ledger::crd::IPClaim> = Api::all(client.clone());
    let claim = claims.get_opt(ip).await.unwrap()?;
    let phase = claim
        .status
        .as_ref()
        .map(|s| s.phase.clone())
        .unwrap_or_else(|| "Reserved".into());
    Some((claim.spec.pod_name, claim.spec.pod_uid, phase))
}

/// The IP the CNI annotation of a pod names.
fn cni_ip(pod: &Pod) -> String {
    let list = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("cni.projectcalico.org/ipAddrs"))
        .expect("the pod carries the Calico annotation");
    serde_json::from_str::<Vec<String>>(list).unwrap()[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fixed_name_recreated_while_the_old_pod_terminates_loses_nothing() {
    // The old db-0 stays Terminating for 3 s (its grace is 30 s; the fake kubelet stops it
    // after 3 s).
    let fake = FakeApi::start_with(&["--kubelet-delay", "3"]);
    fake.control("/fake/config", json!({"fakeCni": true, "cniDelay": 0.05}));
    let client = fake.install_crds().await;
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(fake.replica(FAST).await);
    }
    let backends: Vec<&TestServer> = replicas.iter().collect();
    admission::register(&fake, &backends, json!({}));
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let list = "10.4.0.1-10.4.0.4";

    let first = create_pod(&pods, &statefulset_pod("db", 0, "db", list, 30))
        .await
        .unwrap();
    let old_uid = first.metadata.uid.clone().unwrap();
    assert_eq!(cni_ip(&first), "10.4.0.1", "ordinal 0 takes entry 0");
    delete_pod(&pods, "db-0", None).await.unwrap();
    let terminating = pods.get("db-0").await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());

    // A second CREATE of db-0 within the grace period (a controller acting on a stale cache):
    // it is refused, by the store (AlreadyExists, after /mutate and /validate admitted it) or
    // by a webhook; either way it must cost the old pod nothing.
    let error = create_pod(&pods, &statefulset_pod("db", 0, "db", list, 30))
        .await
        .expect_err("db-0 still exists");
    let (code, message) = api_error(&error).unwrap();
    let log = fake.get_json("/fake/admission");
    let validated = log["calls"].as_array().unwrap().iter().any(|c| {
        c["type"] == "validating"
            && c["operation"] == "CREATE"
            && c["name"] == "db-0"
            && c["allowed"] == true
            && c["podUid"] != json!(old_uid)
    });
    println!("second db-0: {code} {message} (passed /validate first: {validated})");
    assert!(
        (code == 409 && validated) || message.starts_with("admission webhook \"pods."),
        "{code} {message}"
    );

    // While the old pod runs on, its IP stays claimed for it.
    let until = Instant::now() + Duration::from_millis(2000);
    while Instant::now() < until && pods.get_opt("db-0").await.unwrap().is_some() {
        let claim = claim_of(&client, "10.4.0.1").await;
        assert!(
            claim
                .as_ref()
                .is_some_and(|(_, uid, _)| uid.as_deref() == Some(old_uid.as_str())),
            "the terminating db-0 ({old_uid}) lost its claim of 10.4.0.1: {claim:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Once the old pod is gone, the recreated db-0 gets 10.4.0.1 back, and it is the only
    // claim of db-0.
    gone(&pods, "db-0", Duration::from_secs(10)).await;
    let again = create_pod(&pods, &statefulset_pod("db", 0, "db", list, 30))
        .await
        .unwrap();
    assert_eq!(cni_ip(&again), "10.4.0.1");
    let claims: Api<ip_webhook_ledger::crd::IPClaim> = Api::all(client.clone());
    let held: Vec<String> = claims
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        // a reservation the refused create left may remain until --reservation-ttl; a
        // bound claim may not
        .filter(|c| c.spec.pod_name == "db-0" && c.spec.pod_uid.is_some())
        .map(|c| c.spec.ip)
        .collect();
    assert_eq!(held, ["10.4.0.1"], "db-0's bound claims");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_whose_claim_watch_lags_admits_the_pods_another_replica_reserved() {
    let fake = FakeApi::start_with(&["--kubelet-delay", "0.3"]);
    fake.control("/fake/config", json!({"fakeCni": true, "cniDelay": 0.05}));
    let client = fake.install_crds().await;
    let fresh = fake.replica(FAST).await;
    // The lagging replica reaches the API server through its own port, where every IPClaim
    // watch event arrives 0.4 s after its commit.
    let slow_port = fake.listen();
    let lagging = fake.replica_via(slow_port, FAST).await;
    fake.control(
        "/fake/config",
        json!({"watchDelay": [{"port": slow_port, "resource": "ipclaims", "seconds": 0.4}]}),
    );
    // /mutate on the up-to-date replica, /validate on the lagging one.
    admission::register_webhooks(
        &fake,
        admission::routed_pod_webhooks(&[&fresh], &[&lagging]),
        json!({}),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut refused = Vec::new();
    for _ in 0..10 {
        match create_pod(&pods, &replicaset_pod(APP, "10.62.0.1-10.62.0.20", 1)).await {
            Ok(_) => {}
            Err(error) => refused.push(api_error(&error).map(|(_, m)| m).unwrap_or_default()),
        }
    }
    println!("lagging replica: {} of 10 creates refused", refused.len());
    assert!(refused.is_empty(), "refused: {refused:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_is_ready_only_once_the_claims_it_decides_on_are_loaded() {
    let fake = FakeApi::start_with(&["--kubelet-delay", "0.3"]);
    fake.control("/fake/config", json!({"fakeCni": true, "cniDelay": 0.05}));
    let client = fake.install_crds().await;
    let first = fake.replica(FAST).await;
    let slow_port = fake.listen();
    // The new replica's IPClaim list is answered at once, its watch (from the list's
    // resourceVersion) starts 1.5 s later: the claims written in between reach it only then.
    fake.control(
        "/fake/config",
        json!({"requestDelay": [{
            "method": "GET", "port": slow_port,
            "path": "^/apis/ip-webhook.io/v1alpha1/ipclaims$", "query": "watch=true",
            "seconds": 1.5,
        }]}),
    );
    let started = Instant::now();
    let second = fake.replica_via(slow_port, FAST).await;
    let ready_after = started.elapsed();
    // Six pods at once, right after it turned ready: /mutate on the first replica, /validate
    // on the new one.
    admission::register_webhooks(
        &fake,
        admission::routed_pod_webhooks(&[&first], &[&second]),
        json!({}),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut creates = Vec::new();
    for _ in 0..6 {
        let pods = pods.clone();
        creates.push(tokio::spawn(async move {
            create_pod(&pods, &replicaset_pod(APP, "10.63.0.1-10.63.0.20", 1)).await
        }));
    }
    let mut refused = Vec::new();
    for create in creates {
        if let Err(error) = create.await.unwrap() {
            refused.push(api_error(&error).map(|(_, m)| m).unwrap_or_default());
        }
    }
    println!(
        "fresh replica ready after {:.2} s: {} of 6 creates refused",
        ready_after.as_secs_f64(),
        refused.len()
    );
    assert!(refused.is_empty(), "refused: {refused:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fake_api_server_admits_pods_in_the_api_servers_order() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let replica = fake.replica(FAST).await;
    admission::register(&fake, &[&replica], json!({}));
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);

    // CREATE: /mutate sees no name and no UID, its patch is applied (paths with ~1), /validate
    // sees the generated name and the UID the stored pod keeps.
    let pod = create_pod(&pods, &replicaset_pod(APP, "10.64.0.1-10.64.0.4", 30))
        .await
        .unwrap();
    let name = pod.metadata.name.clone().unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    assert_eq!(cni_ip(&pod), "10.64.0.1");
    assert_eq!(
        pod.metadata.labels.as_ref().unwrap()["ip-webhook.io/allocated-ip"],
        "10.64.0.1"
    );
    // DELETE: the stored pod as oldObject, the grace period in the options.
    delete_pod(&pods, &name, Some(7)).await.unwrap();
    let log = fake.get_json("/fake/admission");
    let calls = log["calls"].as_array().unwrap();
    let call = |kind: &str, op: &str| {
        calls
            .iter()
            .find(|c| c["type"] == kind && c["operation"] == op)
            .unwrap_or_else(|| panic!("no {kind} {op} call: {log}"))
            .clone()
    };
    let mutate = call("mutating", "CREATE");
    assert_eq!(
        (mutate["hadName"].clone(), mutate["podUid"].clone()),
        (json!(false), Value::Null)
    );
    let validate = call("validating", "CREATE");
    assert_eq!(validate["name"], json!(name));
    assert_eq!(validate["podUid"], json!(uid));
    let delete = call("mutating", "DELETE");
    assert_eq!(delete["podUid"], json!(uid));
    assert_eq!(delete["options"]["gracePeriodSeconds"], 7);
    let request_uids: BTreeSet<&str> = calls
        .iter()
        .map(|c| c["requestUid"].as_str().unwrap())
        .collect();
    assert_eq!(request_uids.len(), calls.len(), "one request.uid per call");

    // A denial is the webhook's message behind kube-apiserver's prefix.
    let mut malformed = replicaset_pod(APP, "10.64.0.1-10.64.0.4", 30);
    malformed["metadata"]["annotations"]["cni.projectcalico.org/ipAddrs"] = json!("not-json");
    let error = create_pod(&pods, &malformed).await.unwrap_err();
    let (code, message) = api_error(&error).unwrap();
    assert!((400..500).contains(&code), "{code} {message}");
    assert!(
        message.starts_with("admission webhook \"pods.")
            && message.contains("\" denied the request: "),
        "{message}"
    );

    // A webhook that never answers: failurePolicy Fail refuses after timeoutSeconds with
    // kube-apiserver's words; Ignore goes on without it.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}/mutate", silent.local_addr().unwrap());
    let ca = std::fs::read_to_string(replica.state_dir.path().join("ca.crt")).unwrap();
    let hook = |policy: &str| {
        json!({"webhooks": [{
            "name": "silent.example.io", "type": "mutating", "urls": [url],
            "operations": ["CREATE"], "failurePolicy": policy, "timeoutSeconds": 1, "caBundle": ca,
        }]})
    };
    fake.control("/fake/admission", hook("Fail"));
    let started = Instant::now();
    let error = create_pod(&pods, &replicaset_pod(APP, "10.64.0.1-10.64.0.4", 30))
        .await
        .unwrap_err();
    let (code, message) = api_error(&error).unwrap();
    assert_eq!(code, 500, "{message}");
    assert!(
        message.starts_with(
            "Internal error occurred: failed calling webhook \"silent.example.io\": failed to call webhook: Post"
        ) && message.ends_with("context deadline exceeded"),
        "{message}"
    );
    assert!(started.elapsed() >= Duration::from_millis(900));
    fake.control("/fake/admission", hook("Ignore"));
    let admitted = create_pod(&pods, &replicaset_pod(APP, "10.64.0.1-10.64.0.4", 30))
        .await
        .unwrap();
    assert!(
        !admitted
            .metadata
            .annotations
            .unwrap()
            .contains_key("cni.projectcalico.org/ipAddrs")
    );
}
