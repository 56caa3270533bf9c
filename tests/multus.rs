//! Fixed IPs on Multus secondary networks, end to end against `fakeapi.py` with Multus's
//! NetworkAttachmentDefinition CRD installed from tests/fixtures/multus-crds.yaml: a replica
//! with the IPClaim ledger gives a Deployment's pods one IP per network from each network's
//! list (distinct per pod on one network, the same address free to be used on both), written
//! where Multus hands it to the network's IPAM; the claims live their lifecycle per network;
//! a static `ips` entry on a network is checked like a primary static IP; and the embedded
//! ledger keeps each network's claims across a restart.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::fakeapi::{FakeApi, install_crd_fixture, persist_pod};
use common::{TestServer, apply, create, eventually, message, patch_of};
use ip_webhook_admission::networks::parse_networks;
use ip_webhook_ledger::LedgerConfig;
use ip_webhook_ledger::crd::IPClaim;
use ip_webhook_ledger::network::Network;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
/// The same three addresses on both networks.
const SECONDARY_LIST: &str = "10.50.0.1-10.50.0.3";

/// The two NetworkAttachmentDefinitions, macvlan with the `static` IPAM, which takes the
/// IPs Multus passes it (`capabilities: {ips: true}`).
async fn create_attachments(client: &Client) {
    install_crd_fixture(client, "multus-crds.yaml").await;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition"),
        "network-attachment-definitions",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
    for (name, master) in [("storage", "eth1"), ("backup", "eth2")] {
        let config = json!({
            "cniVersion": "0.3.1", "type": "macvlan", "master": master,
            "capabilities": {"ips": true}, "ipam": {"type": "static"},
        });
        let object = DynamicObject::new(name, &resource)
            .within("default")
            .data(json!({"spec": {"config": config.to_string()}}));
        api.create(&PostParams::default(), &object).await.unwrap();
    }
}

/// A pod of Deployment `web` (through its ReplicaSet) on both secondary networks, each with
/// its list and the prefix length its static IPAM needs, and a primary list too.
fn web_pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": "web-7d9f-", "namespace": "default",
            "labels": {"app": "web"},
            "annotations": {
                NETWORKS: "storage@net1, default/backup@net2",
                "ip-webhook.io/allocatable-ips": "10.60.0.1-10.60.0.9",
                "storage.default.ip-webhook.io/allocatable-ips": SECONDARY_LIST,
                "storage.default.ip-webhook.io/prefix-length": "24",
                "backup.default.ip-webhook.io/allocatable-ips": SECONDARY_LIST,
                "backup.default.ip-webhook.io/prefix-length": "24",
            },
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f",
                "uid": "rs-uid", "controller": true,
            }],
        },
        "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]},
    })
}

/// The IPs the networks annotation of `pod` gives each network, read by Multus's rules; and
/// the real `static` IPAM plugin, given each entry's `ips` as written (as Multus passes them),
/// configures exactly those.
fn network_ips(pod: &Value) -> Vec<(String, String, Vec<String>)> {
    let value = pod["metadata"]["annotations"][NETWORKS].as_str().unwrap();
    let written: Value = serde_json::from_str(value).unwrap_or(Value::Null);
    parse_networks(value, "default")
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(n, a)| {
            let ips: Vec<String> = a
                .ips
                .iter()
                .map(|(ip, p)| format!("{ip}/{}", p.unwrap()))
                .collect();
            if let Some(texts) = written[n]["ips"].as_array().filter(|t| !t.is_empty()) {
                let texts: Vec<&str> = texts.iter().map(|t| t.as_str().unwrap()).collect();
                common::cni::assert_static_configures(&texts, &ips);
            }
            (a.name.clone(), a.interface.clone().unwrap_or_default(), ips)
        })
        .collect()
}

fn replica_args() -> Vec<&'static str> {
    vec![
        "--network",
        "default/storage",
        "--network",
        "default/backup",
        "--release-delay",
        "0s",
        "--lease-duration",
        "2s",
        "--lease-renew-interval",
        "200ms",
        "--resync-period",
        "2s",
        "--reservation-ttl",
        "2s",
    ]
}

async fn claim(claims: &Api<IPClaim>, name: &str) -> Option<IPClaim> {
    claims.get_opt(name).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_gets_one_fixed_ip_per_network_and_each_network_has_its_own_books() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    create_attachments(&client).await;
    let server = fake.replica(&replica_args()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<IPClaim> = Api::all(client.clone());

    let mut per_network: Vec<BTreeSet<String>> = vec![BTreeSet::new(), BTreeSet::new()];
    let mut stored = Vec::new();
    for n in 0..3 {
        let object = web_pod();
        let response = server
            .mutate(&create(&format!("web-{n}"), object.clone()))
            .await;
        assert_eq!(response["allowed"], true, "{response}");
        let patched = apply(&object, &response);
        let networks = network_ips(&patched);
        // the JSON form Multus reads: each entry keeps its name and interface, and gets `ips`
        assert_eq!(networks[0].0, "storage");
        assert_eq!(networks[0].1, "net1");
        assert_eq!(networks[1].0, "backup");
        assert_eq!(networks[1].1, "net2");
        let written: Value = serde_json::from_str(
            patched["metadata"]["annotations"][NETWORKS]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(written[0]["namespace"], "default", "{written}");
        for (slot, (_, _, ips)) in per_network.iter_mut().zip(&networks) {
            assert_eq!(ips.len(), 1, "{networks:?}");
            assert!(ips[0].ends_with("/24"), "{networks:?}");
            assert!(
                slot.insert(ips[0].clone()),
                "one IP per pod on a network: {networks:?}"
            );
        }
        let name = format!("web-7d9f-{n}");
        let pod = persist_pod(&pods, patched.clone(), &name).await;
        // the API server's CREATE validation, with the pod's UID: the claims are bound to it
        let validated = server
            .validate(&create(
                &format!("v-{n}"),
                serde_json::to_value(&pod).unwrap(),
            ))
            .await;
        assert_eq!(validated["allowed"], true, "{validated}");
        stored.push(pod);
    }
    // what names the pod's IPs on the networks stays as admitted
    let old = serde_json::to_value(&stored[1]).unwrap();
    let mut new = old.clone();
    new["metadata"]["annotations"][NETWORKS] = json!("storage@net1");
    let update = common::review("v1", "u-1", "UPDATE", Some(new), Some(old.clone()), false);
    let refused = server.validate(&update).await;
    assert_eq!(refused["allowed"], false, "{refused}");
    assert!(message(&refused).contains("cannot be changed"), "{refused}");
    let mut relabelled = old.clone();
    relabelled["metadata"]["labels"]["tier"] = json!("front");
    let update = common::review("v1", "u-2", "UPDATE", Some(relabelled), Some(old), false);
    let allowed = server.validate(&update).await;
    assert_eq!(
        allowed["allowed"], true,
        "another change is not ours: {allowed}"
    );

    // every address of the list on each network: the same addresses used on both
    let all: BTreeSet<String> = ["10.50.0.1/24", "10.50.0.2/24", "10.50.0.3/24"]
        .map(String::from)
        .into();
    assert_eq!(per_network[0], all);
    assert_eq!(per_network[1], all);

    // one IPClaim per network and IP, labelled with its network, bound to its pod
    let first = &stored[0];
    let first_ips = network_ips(&serde_json::to_value(first).unwrap());
    let storage_ip = first_ips[0].2[0].split('/').next().unwrap().to_string();
    let held = claim(&claims, &format!("{storage_ip}.storage.default"))
        .await
        .expect("the storage network's claim");
    assert_eq!(
        held.metadata.labels.as_ref().unwrap()["ip-webhook.io/network"],
        "storage"
    );
    assert_eq!(held.spec.pod_uid, first.metadata.uid);
    assert_eq!(held.status.as_ref().unwrap().phase, "Bound");
    // the primary interface's claims are apart: its IPClaims carry no network label
    let primary_ip = patched_label(first);
    let primary = claim(&claims, &primary_ip)
        .await
        .expect("the primary claim");
    assert!(
        !primary
            .metadata
            .labels
            .unwrap()
            .contains_key("ip-webhook.io/network")
    );

    // the list of a network is exhausted on its own, and the refusal names the network
    let refused = server.mutate(&create("web-3", web_pod())).await;
    assert_eq!(refused["allowed"], false, "{refused}");
    let text = message(&refused);
    assert!(text.contains("network default/storage"), "{text}");
    // ... and the refused pod's primary claim was given back
    let primary_left = claims
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|c| c.spec.request_uid == "web-3")
        .count();
    assert_eq!(primary_left, 0, "the refused pod keeps no claim");

    // after the reconciler's resyncs the network claims are still there (the primary
    // reconciler does not take them for its own)
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        claim(&claims, &format!("{storage_ip}.storage.default"))
            .await
            .is_some()
    );
    let (_, metrics) = server.admin_get("/metrics").await;
    assert!(
        metrics.contains("ip_webhook_leaks_reclaimed_total 0"),
        "a running pod's network claims are no leak: {metrics}"
    );

    // the pod's DELETE: its network claims turn Terminating, then are freed once it is gone
    let answer = server.mutate(&common::delete_review(first, 0)).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    pods.delete(
        first.metadata.name.as_deref().unwrap(),
        &DeleteParams::default(),
    )
    .await
    .unwrap();
    for network in ["storage", "backup"] {
        let ip = first_ips[usize::from(network == "backup")].2[0]
            .split('/')
            .next()
            .unwrap()
            .to_string();
        let name = format!("{ip}.{network}.default");
        eventually(
            &format!("{name} to be released"),
            Duration::from_secs(10),
            || async { claim(&claims, &name).await.is_none().then_some(()) },
        )
        .await;
    }
    // and the next pod of the Deployment gets the freed addresses
    let next = server.mutate(&create("web-4", web_pod())).await;
    assert_eq!(next["allowed"], true, "{next}");
    let next_ips = network_ips(&apply(&web_pod(), &next));
    assert_eq!(next_ips[0].2, first_ips[0].2);
}

/// The primary IP a stored pod carries (its allocated-ip label).
fn patched_label(pod: &Pod) -> String {
    pod.metadata.labels.as_ref().unwrap()["ip-webhook.io/allocated-ip"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_no_pod_took_up_is_freed_and_a_static_ip_on_a_network_is_checked() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    create_attachments(&client).await;
    let server = fake.replica(&replica_args()).await;
    let claims: Api<IPClaim> = Api::all(client.clone());

    // a pod that asks only of a secondary network: no primary IP, our token and marker
    let mut object = web_pod();
    let annotations = object["metadata"]["annotations"].as_object_mut().unwrap();
    annotations.remove("ip-webhook.io/allocatable-ips");
    annotations.remove("backup.default.ip-webhook.io/allocatable-ips");
    let response = server.mutate(&create("lost", object.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");
    let patch = patch_of(&response).to_string();
    assert!(!patch.contains("cni.projectcalico.org"), "{patch}");
    assert!(patch.contains("ip-webhook.io~1claim"), "{patch}");
    let patched = apply(&object, &response);
    let ips = network_ips(&patched);
    assert!(ips[1].2.is_empty(), "no list for backup: {ips:?}");
    let ip = ips[0].2[0].split('/').next().unwrap().to_string();
    let name = format!("{ip}.storage.default");
    assert!(claim(&claims, &name).await.is_some());

    // another pod naming that IP by hand on the same network is refused, naming the holder
    let mut thief = common::pod("default", "other", "other-", None);
    thief["metadata"]["annotations"][NETWORKS] =
        json!(format!(r#"[{{"name":"storage","ips":["{ip}/24"]}}]"#));
    let refused = server.mutate(&create("thief", thief.clone())).await;
    assert_eq!(refused["allowed"], false, "{refused}");
    let text = message(&refused);
    assert!(
        text.contains(&ip) && text.contains("network default/storage"),
        "{text}"
    );
    // the same address by hand on the other network is another claim, and free
    thief["metadata"]["annotations"][NETWORKS] =
        json!(format!(r#"[{{"name":"backup","ips":["{ip}/24"]}}]"#));
    let other = server.mutate(&create("other-net", thief)).await;
    assert_eq!(other["allowed"], true, "{other}");
    assert!(
        claim(&claims, &format!("{ip}.backup.default"))
            .await
            .is_some()
    );

    // the API server refused the first pod after us: nothing takes its reservation up, and
    // the sweeper frees it once the reservation TTL has passed
    eventually(
        "the reservation no pod took up to be freed",
        Duration::from_secs(20),
        || async { claim(&claims, &name).await.is_none().then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_ledger_keeps_each_networks_claims_apart_across_a_restart() {
    let state = tempfile::tempdir().unwrap();
    let books = state.path().to_path_buf();
    let start = || {
        let books = books.clone();
        TestServer::start_with(move |config| {
            config.webhook.ledger = LedgerConfig::Embedded { state_dir: books };
            config.webhook.networks = vec![Network::parse("default/storage").unwrap()];
        })
    };
    let object = {
        let mut pod = web_pod();
        pod["metadata"]["annotations"][NETWORKS] = json!("storage");
        pod["metadata"]["annotations"]["storage.default.ip-webhook.io/allocatable-ips"] =
            json!("10.60.0.1");
        pod["metadata"]["annotations"]["ip-webhook.io/allocatable-ips"] = json!("10.60.0.1");
        pod
    };
    let server = start().await;
    // the primary list and the network's list name the same address: two claims
    let response = server.mutate(&create("one", object.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(common::allocated_ip(&response), "10.60.0.1");
    assert_eq!(
        network_ips(&apply(&object, &response))[0].2,
        ["10.60.0.1/24"]
    );
    // a pod of another app that asks only of the network
    let mut db = common::pod("default", "db", "db-", None);
    db["metadata"]["annotations"] = json!({
        NETWORKS: "storage",
        "storage.default.ip-webhook.io/allocatable-ips": "10.70.0.5",
        "storage.default.ip-webhook.io/prefix-length": "16",
    });
    let response = server.mutate(&create("db", db.clone())).await;
    assert_eq!(network_ips(&apply(&db, &response))[0].2, ["10.70.0.5/16"]);
    server.launched.shutdown().await;
    assert!(state.path().join("networks/default.storage").is_dir());
    // `status --network` shows that network's books, `status` the primary interface's
    let dir = state.path().display().to_string();
    for network in [None, Some("default/storage")] {
        let mut args = vec!["status", "--state-dir", dir.as_str(), "-o", "json"];
        args.extend(network.iter().flat_map(|n| ["--network", *n]));
        let ran = common::ip_webhook(&args);
        assert!(ran.ok, "{network:?}: {}", ran.stderr);
        let report: Value = serde_json::from_str(&ran.stdout).unwrap();
        let text = report.to_string();
        assert!(
            text.contains("10.60.0.1") && text.contains("default/web"),
            "{network:?}: {text}"
        );
        assert_eq!(
            text.contains("10.70.0.5"),
            network.is_some(),
            "{network:?}: {text}"
        );
    }
    // `explain --network` shows what a new pod would get on the network, beside its IP
    let manifest = state.path().join("db.json");
    std::fs::write(&manifest, db.to_string()).unwrap();
    let manifest = manifest.display().to_string();
    let explain = [
        "explain",
        "--state-dir",
        &dir,
        "-f",
        &manifest,
        "--network",
        "default/storage",
    ];
    let ran = common::ip_webhook(&explain);
    assert_eq!(ran.code, Some(3), "a refusal: {}", ran.stderr);
    assert!(
        ran.stdout.contains("REFUSED") && ran.stdout.contains("10.70.0.5"),
        "the network's only IP is held: {}",
        ran.stdout
    );
    db["metadata"]["annotations"]["storage.default.ip-webhook.io/allocatable-ips"] =
        json!("10.70.0.5-10.70.0.6");
    std::fs::write(&manifest, db.to_string()).unwrap();
    let ran = common::ip_webhook(&explain);
    assert!(
        ran.ok && ran.stdout.contains("on network default/storage: 10.70.0.6"),
        "{}{}",
        ran.stdout,
        ran.stderr
    );
    let ran = common::ip_webhook(&["status", "--state-dir", &dir, "--network", "default/other"]);
    assert!(!ran.ok);
    assert!(
        ran.stderr.contains("networks/default.other"),
        "{}",
        ran.stderr
    );

    let server = start().await;
    let refused = server.mutate(&create("two", object)).await;
    assert_eq!(refused["allowed"], false, "{refused}");
    let text = message(&refused);
    assert!(
        text.contains("10.60.0.1"),
        "both lists are held after the restart: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_network_annotations_get_a_clear_denial() {
    let server = TestServer::start(&["--network", "default/storage"]).await;
    let cases: [(&str, Value, &str); 5] = [
        (
            "twice",
            json!({NETWORKS: "storage@net1,storage@net2", "storage.default.ip-webhook.io/allocatable-ips": "10.50.0.1-10.50.0.2",
                   "storage.default.ip-webhook.io/prefix-length": "24"}),
            "attaches network default/storage more than once",
        ),
        (
            "no prefix",
            json!({NETWORKS: "storage", "storage.default.ip-webhook.io/allocatable-ips": "10.50.0.1"}),
            "storage.default.ip-webhook.io/prefix-length is missing",
        ),
        (
            "not attached",
            json!({NETWORKS: "other", "storage.default.ip-webhook.io/allocatable-ips": "10.50.0.1",
                   "storage.default.ip-webhook.io/prefix-length": "24"}),
            "does not attach",
        ),
        (
            "bad annotation",
            json!({NETWORKS: "storage@eth0@x", "storage.default.ip-webhook.io/allocatable-ips": "10.50.0.1"}),
            NETWORKS,
        ),
        (
            "long prefix",
            json!({NETWORKS: "storage", "storage.default.ip-webhook.io/allocatable-ips": "10.50.0.1",
                   "storage.default.ip-webhook.io/prefix-length": "33"}),
            "/33 is longer than an IPv4 address",
        ),
    ];
    for (what, annotations, expected) in cases {
        let mut pod = common::pod("default", "web", "web-", None);
        pod["metadata"]["annotations"] = annotations;
        let response = server.mutate(&create(what, pod)).await;
        assert_eq!(response["allowed"], false, "{what}: {response}");
        let text = message(&response);
        assert!(text.contains(expected), "{what}: {text}");
    }
    // a network ip-webhook does not manage is Multus's alone: nothing is written
    let mut pod = common::pod("default", "web", "web-", None);
    pod["metadata"]["annotations"] = json!({NETWORKS: "elsewhere@net1"});
    let response = server.mutate(&create("unmanaged", pod)).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(
        response.get("patch").is_none_or(Value::is_null),
        "{response}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_kube_ovn_the_attachment_annotation_carries_the_ip_and_other_fields_are_kept() {
    let server = TestServer::start(&["--cni", "kube-ovn", "--network", "default/storage"]).await;
    let written = r#"[{"name":"storage","interface":"net1","mac":"c2:b0:57:49:47:f1","default-route":["10.50.0.254"]}]"#;
    let pod = |prefix: Option<&str>| {
        let mut pod = common::pod("default", "web", "web-", None);
        pod["metadata"]["annotations"] = json!({
            NETWORKS: written,
            "storage.default.ip-webhook.io/allocatable-ips": "10.50.0.7",
        });
        if let Some(prefix) = prefix {
            pod["metadata"]["annotations"]["storage.default.ip-webhook.io/prefix-length"] =
                json!(prefix);
        }
        pod
    };
    // Kube-OVN's IPAM reads the attachment's own annotation: no prefix length is needed
    let object = pod(None);
    let response = server.mutate(&create("ovn", object.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");
    let patched = apply(&object, &response);
    let annotations = &patched["metadata"]["annotations"];
    assert_eq!(
        annotations["storage.default.ovn.kubernetes.io/ip_address"],
        "10.50.0.7"
    );
    assert_eq!(
        annotations[NETWORKS], written,
        "nothing to add to the networks annotation"
    );
    assert!(
        annotations.get("ovn.kubernetes.io/ip_address").is_none(),
        "{annotations}"
    );

    // with a prefix length, `ips` is written too, and every other field stays as it was
    server
        .mutate(&common::delete_review(
            &serde_json::from_value(patched).unwrap(),
            0,
        ))
        .await;
    let object = pod(Some("24"));
    let response = eventually("the IP to be free again", Duration::from_secs(10), || {
        let (server, object) = (&server, object.clone());
        async move {
            let response = server.mutate(&create("ovn-2", object)).await;
            (response["allowed"] == true).then_some(response)
        }
    })
    .await;
    let patched = apply(&object, &response);
    let entry: Value = serde_json::from_str(
        patched["metadata"]["annotations"][NETWORKS]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        entry,
        json!([{"name": "storage", "interface": "net1",
                "mac": "c2:b0:57:49:47:f1", "default-route": ["10.50.0.254"],
                "ips": ["10.50.0.7/24"]}])
    );
    // and the element is written back as it was, `ips` added at its end
    assert_eq!(
        patched["metadata"]["annotations"][NETWORKS],
        written.replace("]}]", r#"],"ips":["10.50.0.7/24"]}]"#)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_refused_on_one_network_keeps_nothing_on_the_others() {
    let server = TestServer::start(&[
        "--network",
        "default/storage",
        "--network",
        "default/backup",
    ])
    .await;
    let pod = |backup: &str| {
        let mut pod = web_pod();
        pod["metadata"]["annotations"]["storage.default.ip-webhook.io/allocatable-ips"] =
            json!("10.50.0.1-10.50.0.2");
        pod["metadata"]["annotations"]["backup.default.ip-webhook.io/allocatable-ips"] =
            json!(backup);
        pod
    };
    let first = server.mutate(&create("first", pod("10.51.0.1"))).await;
    assert_eq!(first["allowed"], true, "{first}");
    let taken = network_ips(&apply(&pod("10.51.0.1"), &first))[0].2.clone();
    // storage has room, backup has none: refused, and storage's second IP is given back
    let refused = server.mutate(&create("second", pod("10.51.0.1"))).await;
    assert_eq!(refused["allowed"], false, "{refused}");
    assert!(
        message(&refused).contains("network default/backup"),
        "{refused}"
    );
    let third = server.mutate(&create("third", pod("10.51.0.2"))).await;
    assert_eq!(third["allowed"], true, "{third}");
    let storage = network_ips(&apply(&pod("10.51.0.2"), &third))[0].2.clone();
    assert_ne!(storage, taken);
    assert_eq!(storage.len(), 1, "{storage:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_drift_compares_a_networks_claims_with_what_multus_reports() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    create_attachments(&client).await;
    let server = fake.replica(&replica_args()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // ours, on 10.50.0.1; Multus reports the interface came up on 10.50.0.2 instead
    let mut object = web_pod();
    object["metadata"]["annotations"][NETWORKS] = json!("storage@net1");
    let annotations = object["metadata"]["annotations"].as_object_mut().unwrap();
    annotations.remove("backup.default.ip-webhook.io/allocatable-ips");
    let response = server.mutate(&create("ours", object.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");
    let mut patched = apply(&object, &response);
    let claimed = network_ips(&patched)[0].2[0]
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let other = if claimed == "10.50.0.2" {
        "10.50.0.1"
    } else {
        "10.50.0.2"
    };
    let status = |ip: &str| {
        json!(format!(
            r#"[{{"name":"k8s-pod-network","interface":"eth0","ips":["10.244.0.9"],"default":true}},{{"name":"default/storage","interface":"net1","ips":["{ip}"]}}]"#
        ))
    };
    patched["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"] = status(other);
    let ours = persist_pod(&pods, patched, "web-ours").await;
    let validated = server
        .validate(&create("v-ours", serde_json::to_value(&ours).unwrap()))
        .await;
    assert_eq!(validated["allowed"], true, "{validated}");
    // not ours: a pod another IPAM put on 10.50.0.3 of the list, with no claim
    let squatter = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": "default", "labels": {"app": "other"}, "annotations": {
            NETWORKS: "storage", "k8s.v1.cni.cncf.io/network-status": status("10.50.0.3"),
        }},
        "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]},
    });
    persist_pod(&pods, squatter, "squatter").await;
    let kubeconfig = fake.kubeconfig().display().to_string();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "check",
            "--drift",
            "--kubeconfig",
            kubeconfig.as_str(),
            "-o",
            "json",
        ];
        args.extend_from_slice(extra);
        let ran = common::ip_webhook(&args);
        let report: Value = serde_json::from_str(&ran.stdout)
            .unwrap_or_else(|e| panic!("{e}: {} {}", ran.stdout, ran.stderr));
        let found: Vec<(String, String, String)> = report["drift"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                let text = |key: &str| d[key].as_str().unwrap().to_string();
                (text("kind"), text("ip"), text("pod"))
            })
            .collect();
        (ran.code, found)
    };
    let (code, found) = run(&["--network", "default/storage"]);
    assert_eq!(code, Some(3), "{found:?}");
    let row = |kind: &str, ip: &str, pod: &str| (kind.to_string(), ip.to_string(), pod.to_string());
    assert_eq!(
        found,
        [
            row("pod-without-claim", "10.50.0.3", "default/squatter"),
            row("pod-ip-differs", &claimed, "default/web-ours"),
        ]
    );
    // the primary interface's comparison does not see the network's IPs
    let (_, primary) = run(&[]);
    assert!(
        primary.iter().all(|(_, ip, _)| !ip.starts_with("10.50.")),
        "{primary:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_pod_gets_its_ordinals_entry_on_each_network() {
    let server = TestServer::start(&["--network", "default/storage"]).await;
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "db-2", "namespace": "default", "labels": {"app": "db"},
            "annotations": {
                NETWORKS: "storage",
                "ip-webhook.io/allocatable-ips": "10.60.1.0-10.60.1.9",
                "storage.default.ip-webhook.io/allocatable-ips": "10.52.0.10-10.52.0.19",
                "storage.default.ip-webhook.io/prefix-length": "24",
            },
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                                 "uid": "sts-uid", "controller": true}],
        },
        "spec": {"containers": [{"name": "c", "image": "registry.example/db:1"}]},
    });
    let response = server.mutate(&create("db-2", pod.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(common::allocated_ip(&response), "10.60.1.2");
    assert_eq!(network_ips(&apply(&pod, &response))[0].2, ["10.52.0.12/24"]);
}

/// `pod` with a list on network `storage` only (prefix /24), as a controller creates it.
fn on_storage(mut pod: Value, list: &str) -> Value {
    let annotations = pod["metadata"]["annotations"].as_object_mut().unwrap();
    annotations.insert(NETWORKS.into(), json!("storage"));
    annotations.insert(
        "storage.default.ip-webhook.io/allocatable-ips".into(),
        json!(list),
    );
    annotations.insert(
        "storage.default.ip-webhook.io/prefix-length".into(),
        json!("24"),
    );
    pod
}

/// The IP the stored `pod` carries on network storage.
fn storage_ip(pod: &Pod) -> String {
    let value = serde_json::to_value(pod).unwrap();
    let ips = network_ips(&value);
    ips[0].2[0].split('/').next().unwrap().to_string()
}

/// A StatefulSet pod's IP on a network lives the lifecycle its primary IP does: kept for its
/// name for the sticky grace once the pod is gone (the pod recreated under that name gets it
/// back, no other pod can have it meanwhile), then freed for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_pods_network_ip_is_kept_for_its_name_then_freed() {
    use common::admission::{create_pod, delete_pod, register, statefulset_pod};
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    create_attachments(&client).await;
    let mut args = replica_args();
    args.extend(["--sticky-grace", "3s"]);
    let server = fake.replica(&args).await;
    register(&fake, &[&server], json!({}));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<IPClaim> = Api::all(client.clone());
    let list = "10.53.0.1-10.53.0.3";
    let db_0 = || {
        let mut pod = on_storage(
            statefulset_pod("db", 0, "db", "10.63.0.1-10.63.0.3", 0),
            list,
        );
        pod["spec"].as_object_mut().unwrap().remove("nodeName");
        pod
    };
    let first = create_pod(&pods, &db_0()).await.unwrap();
    let ip = storage_ip(&first);
    let name = format!("{ip}.storage.default");
    let bound = eventually(
        "the network claim to be bound",
        Duration::from_secs(10),
        || async {
            let claim = claim(&claims, &name).await?;
            (claim.status.as_ref()?.phase == "Bound").then_some(claim)
        },
    )
    .await;
    assert!(
        bound.spec.sticky,
        "a StatefulSet pod's network claim is kept for its name"
    );

    // gone, and back under its name within the grace: the same IP on the network
    delete_pod(&pods, "db-0", Some(0)).await.unwrap();
    let again = create_pod(&pods, &db_0()).await.unwrap();
    assert_eq!(storage_ip(&again), ip, "db-0 gets its network IP back");

    // gone for good: kept for the grace (another pod cannot have it), then freed
    delete_pod(&pods, "db-0", Some(0)).await.unwrap();
    let mut other = on_storage(common::pod("default", "db", "other-", None), &ip);
    other["metadata"]["annotations"]["ip-webhook.io/allocatable-ips"] = json!("10.63.0.9");
    let refused = server.mutate(&create("other", other.clone())).await;
    assert_eq!(refused["allowed"], false, "kept for db-0: {refused}");
    eventually(
        "the kept network claim to be freed after the sticky grace",
        Duration::from_secs(20),
        || async { claim(&claims, &name).await.is_none().then_some(()) },
    )
    .await;
    let given = server.mutate(&create("other-after", other)).await;
    assert_eq!(given["allowed"], true, "{given}");
}

/// Node-loss release frees a pod's claims on every interface: a ReplicaSet pod stuck
/// Terminating on a node gone NotReady gives back its primary IP and its network IP, so its
/// replacement gets both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_lost_with_its_node_frees_its_network_ip_too() {
    use common::node_loss::{make_node, set_ready};
    use k8s_openapi::api::core::v1::Node;
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    create_attachments(&client).await;
    let mut args = replica_args();
    args.extend(["--node-lost-grace", "2s"]);
    let server = fake.replica(&args).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes: Api<Node> = Api::all(client.clone());
    let claims: Api<IPClaim> = Api::all(client.clone());
    make_node(&nodes, "n1").await;
    let mut object = on_storage(
        common::admission::replicaset_pod("lost", "10.64.0.1", 1),
        "10.54.0.1",
    );
    object["metadata"]["namespace"] = json!("default");
    object["spec"]["nodeName"] = json!("n1");
    let response = server.mutate(&create("create-lost", object.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");
    let mut stored = apply(&object, &response);
    stored["metadata"]["name"] = json!("lost-1");
    stored["metadata"]["finalizers"] = json!(["test.ip-webhook.io/stuck"]);
    let pod = pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(stored).unwrap(),
        )
        .await
        .unwrap();
    let validated = server
        .validate(&create(
            "validate-lost",
            serde_json::to_value(&pod).unwrap(),
        ))
        .await;
    assert_eq!(validated["allowed"], true, "{validated}");
    let status = json!({"status": {"phase": "Running", "podIP": "10.64.0.1",
                                   "podIPs": [{"ip": "10.64.0.1"}]}});
    pods.patch_status(
        "lost-1",
        &Default::default(),
        &kube::api::Patch::Merge(&status),
    )
    .await
    .unwrap();
    // the node stops reporting; the pod's deletion is admitted and it stays Terminating
    set_ready(&nodes, "n1", "Unknown", 0).await;
    let answer = server.mutate(&common::delete_review(&pod, 1)).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    pods.delete("lost-1", &DeleteParams::default().grace_period(1))
        .await
        .unwrap();
    for name in ["10.64.0.1", "10.54.0.1.storage.default"] {
        eventually(
            &format!("claim {name} of the lost pod to be released"),
            Duration::from_secs(20),
            || async { claim(&claims, name).await.is_none().then_some(()) },
        )
        .await;
    }
}

/// A replica whose copy of a network's books lags (its watch of IPClaims 5 s behind) still
/// admits a pod whose network IP another replica granted after that IP's earlier holder went:
/// it asks the ledger, as on the primary interface, instead of refusing on its stale copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_asks_the_ledger_before_refusing_a_network_ip() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    create_attachments(&client).await;
    let fast = fake.replica(&replica_args()).await;
    let slow_port = fake.listen();
    let slow = fake.replica_via(slow_port, &replica_args()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let one_ip = || {
        let mut pod = on_storage(common::pod("default", "solo", "solo-", None), "10.55.0.1");
        pod["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove("ip-webhook.io/allocatable-ips");
        pod
    };
    // the first holder: granted by the fast replica, validated (bound) by the slow one, so
    // the slow replica's copy shows it
    let object = one_ip();
    let response = fast.mutate(&create("m-1", object.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");
    let first = persist_pod(&pods, apply(&object, &response), "solo-1").await;
    let validated = slow
        .validate(&create("v-1", serde_json::to_value(&first).unwrap()))
        .await;
    assert_eq!(validated["allowed"], true, "{validated}");
    // from now on the slow replica learns of claims 5 s late
    fake.control(
        "/fake/config",
        json!({"watchDelay": [{"port": slow_port, "resource": "ipclaims", "seconds": 5}]}),
    );
    // the first holder goes; the fast replica frees its IP once it is verified gone
    let answer = fast.mutate(&common::delete_review(&first, 0)).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    pods.delete("solo-1", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let claims: Api<IPClaim> = Api::all(client.clone());
    eventually(
        "the first holder's claim to go",
        Duration::from_secs(10),
        || async {
            claim(&claims, "10.55.0.1.storage.default")
                .await
                .is_none()
                .then_some(())
        },
    )
    .await;
    // the next pod gets it from the fast replica; the slow one validates it
    let object = one_ip();
    let response = fast.mutate(&create("m-2", object.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");
    let second = persist_pod(&pods, apply(&object, &response), "solo-2").await;
    assert_eq!(storage_ip(&second), "10.55.0.1");
    let validated = slow
        .validate(&create("v-2", serde_json::to_value(&second).unwrap()))
        .await;
    assert_eq!(validated["allowed"], true, "{}", message(&validated));
}

/// An UPDATE may not name another holder's network IP: not by a pod holding no claim, nor by
/// one holding only a primary claim (what names its IPs stays as admitted); nor a free one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_cannot_name_another_pods_network_ip() {
    let server = TestServer::start(&["--network", "default/storage"]).await;
    let object = on_storage(web_pod(), "10.56.0.1");
    let object = {
        let mut o = object;
        let a = o["metadata"]["annotations"].as_object_mut().unwrap();
        a.remove("backup.default.ip-webhook.io/allocatable-ips");
        a.remove("backup.default.ip-webhook.io/prefix-length");
        o
    };
    let response = server.mutate(&create("holder", object.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");
    for (who, mut pod) in [
        (
            "a pod without a claim",
            common::pod("default", "plain", "plain-", None),
        ),
        (
            "a pod with a primary claim only",
            common::pod("default", "prim", "prim-", Some("10.66.0.1")),
        ),
    ] {
        if who.contains("primary") {
            let granted = server.mutate(&create("prim", pod.clone())).await;
            assert_eq!(granted["allowed"], true, "{granted}");
            pod = apply(&pod, &granted);
        }
        pod["metadata"]["name"] = json!(who.replace(' ', "-"));
        pod["metadata"]["uid"] = json!(format!("uid-{}", who.len()));
        let mut updated = pod.clone();
        updated["metadata"]["annotations"][NETWORKS] =
            json!(r#"[{"name":"storage","ips":["10.56.0.1/24"]}]"#);
        let review = common::review("v1", "u-1", "UPDATE", Some(updated), Some(pod), false);
        let answer = server.validate(&review).await;
        assert_eq!(answer["allowed"], false, "{who}: {answer}");
        assert!(
            message(&answer).contains("10.56.0.1") || message(&answer).contains(NETWORKS),
            "{who}: {}",
            message(&answer)
        );
    }
    // a free IP is refused too: an update records nothing, so the network would give the IP
    // to the next pod while this one's sandbox, started again, comes up on it
    let plain = common::pod("default", "plain", "plain-", None);
    let mut updated = plain.clone();
    updated["metadata"]["annotations"][NETWORKS] =
        json!(r#"[{"name":"storage","ips":["10.56.0.2/24"]}]"#);
    let review = common::review("v1", "u-2", "UPDATE", Some(updated), Some(plain), false);
    let answer = server.validate(&review).await;
    assert_eq!(answer["allowed"], false, "{answer}");
    assert!(
        message(&answer).contains("cannot give the pod IPs on network default/storage (10.56.0.2)"),
        "{}",
        message(&answer)
    );
    // Kube-OVN's controller writing the IP it allocated on an attachment (the networks
    // annotation as it was) is no such update
    let mut attached = common::pod("default", "dynamic", "dynamic-", None);
    attached["metadata"]["annotations"][NETWORKS] = json!("storage");
    let mut allocated = attached.clone();
    allocated["metadata"]["annotations"]["storage.default.ovn.kubernetes.io/ip_address"] =
        json!("10.56.0.3");
    let review = common::review(
        "v1",
        "u-3",
        "UPDATE",
        Some(allocated),
        Some(attached),
        false,
    );
    let answer = server.validate(&review).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    let mut next = object;
    next["metadata"]["annotations"]["storage.default.ip-webhook.io/allocatable-ips"] =
        json!("10.56.0.2");
    let granted = server.mutate(&create("next", next)).await;
    assert_eq!(granted["allowed"], true, "{granted}");
}

/// A pod of app `app` with `annotations` (the networks annotation among them).
fn pod_with(app: &str, annotations: Value) -> Value {
    let mut pod = common::pod("default", app, &format!("{app}-"), None);
    pod["metadata"]["annotations"] = annotations;
    pod
}

/// `/mutate`'s answer to the CREATE of a pod of `app` with `annotations`, which must be
/// `allowed` (or not).
async fn admitted(server: &TestServer, app: &str, annotations: Value, allowed: bool) -> Value {
    let pod = pod_with(app, annotations);
    let response = server.mutate(&create(app, pod.clone())).await;
    assert_eq!(response["allowed"], allowed, "{response}");
    if allowed {
        // what it asks of the static IPAM, by hand or from us, is what it holds
        network_ips(&apply(&pod, &response));
    }
    response
}

/// Multus reads the networks annotation with Go's `encoding/json`: keys match in any case and
/// the last one wins, so these all attach `default/storage` on 10.50.0.1 and are another
/// pod's IP; an IPv4-mapped `ips` entry is the same IPv4 address (the static IPAM configures
/// it so). Refused at `/mutate` and, for a pod that skipped it, at `/validate`, naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ip_is_one_claim_however_the_annotation_spells_it() {
    let server = TestServer::start(&["--network", "default/storage"]).await;
    let holder = json!({NETWORKS: r#"[{"name":"storage","ips":["10.50.0.1/24"]}]"#});
    admitted(&server, "db", holder, true).await;
    for (n, value) in [
        r#"[{"name":"unmanaged","Name":"storage","ips":["10.50.0.1/24"]}]"#,
        r#"[{"name":"storage","namespace":"other","Namespace":"default","ips":["10.50.0.1/24"]}]"#,
        r#"[{"name":"storage","IPS":["10.50.0.1/24"]}]"#,
        r#"[{"name":"storage","ips":["10.50.0.9/24"],"iPs":["10.50.0.1/24"]}]"#,
        r#"[{"n\u0061me":"storage","ip\u017f":["10.50.0.1/24"]}]"#,
        r#"[{"name":"storage","ips":["::ffff:10.50.0.1/120"]}]"#,
        r#"[{"name":"storage","ips":["::ffff:10.50.0.1/24"]}]"#,
    ]
    .into_iter()
    .enumerate()
    {
        let thief = pod_with("web", json!({NETWORKS: value}));
        for (what, response) in [
            (
                "mutate",
                server
                    .mutate(&create(&format!("m-{n}"), thief.clone()))
                    .await,
            ),
            (
                "validate",
                server.validate(&create(&format!("v-{n}"), thief)).await,
            ),
        ] {
            assert_eq!(response["allowed"], false, "{what} {value}: {response}");
            let text = message(&response);
            assert!(
                text.contains("10.50.0.1") && text.contains("network default/storage"),
                "{what} {value}: {text}"
            );
        }
    }
    // alone, the IPv4-mapped form is the IPv4 address's claim: the holder's IP once given
    // back, it is taken again as 10.50.0.1, which a plain form then cannot have
    let mapped = json!({NETWORKS: r#"[{"name":"storage","ips":["::ffff:10.50.0.2/120"]}]"#});
    admitted(&server, "web", mapped, true).await;
    let plain = json!({NETWORKS: r#"[{"name":"storage","ips":["10.50.0.2/24"]}]"#});
    let refused = admitted(&server, "other", plain, false).await;
    assert!(message(&refused).contains("10.50.0.2"), "{refused}");
}

/// What Multus's parser (or Go's `Unmarshal` before it) refuses, Multus never starts: it is
/// refused at admission with what is wrong, and no claim is kept for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_multus_refuses_is_refused_at_admission() {
    let server = TestServer::start(&["--network", "default/storage"]).await;
    for (value, expected) in [
        (
            r#"[{"name":"net1","infiniband-guid":"not-a-guid"}]"#,
            "infiniband-guid \"not-a-guid\" is not a MAC address",
        ),
        (
            r#"[{"name":"storage","infiniband-guid":"not-a-guid","ips":["10.50.0.5/24"]}]"#,
            "infiniband-guid",
        ),
        (
            r#"[{"name":"storage","mac":"c2:b0:57:49:47","ips":["10.50.0.5/24"]}]"#,
            "not a MAC address",
        ),
        (
            r#"[{"name":"storage","ips":["10.50.0.5/24"],"portMappings":[{"hostPort":"80"}]}]"#,
            "not an integer",
        ),
        (
            r#"[{"name":"storage","ips":["10.50.0.5/24"],"default-route":["gw"]}]"#,
            "not an IP address",
        ),
        (
            r#"[{"name":"storage","ips":["10.50.0.5/24"]},null]"#,
            "null",
        ),
        (
            r#"[{"name":"storage","ips":["10.50.0.5/24 "]}]"#,
            "not an IP address or a CIDR",
        ),
        (
            r#"[{"name":"storage","ips":["10.99.0.1/24"]}]"#,
            "is not one of the IPs of list storage.default.ip-webhook.io/allocatable-ips",
        ),
    ] {
        let pod = pod_with(
            "web",
            json!({NETWORKS: value, "storage.default.ip-webhook.io/allocatable-ips": "10.50.0.5",
                   "storage.default.ip-webhook.io/prefix-length": "24"}),
        );
        // /mutate refuses it, and so does /validate for a pod that skipped /mutate
        // (failurePolicy Ignore, or a later webhook's edit)
        for (what, response) in [
            ("mutate", server.mutate(&create("bad", pod.clone())).await),
            ("validate", server.validate(&create("bad", pod)).await),
        ] {
            assert_eq!(response["allowed"], false, "{what} {value}: {response}");
            let text = message(&response);
            assert!(
                text.contains(expected)
                    && (text.contains(NETWORKS) || text.contains("static IP 10.99.0.1")),
                "{what} {value}: {text}"
            );
        }
    }
    // nothing was kept for any of them: the address is free
    let fine = json!({NETWORKS: r#"[{"name":"storage","ips":["10.50.0.5/24"]}]"#});
    admitted(&server, "web", fine, true).await;
}

/// With Kube-OVN, an attachment's IP written by hand in Kube-OVN's annotation (either kind:
/// `NAME.NAMESPACE.ovn.kubernetes.io/ip_address`, or `NAME.NAMESPACE.kubernetes.io/ip_address`
/// of an IPAM-only attachment) is a static request on that network, as the primary
/// `ovn.kubernetes.io/ip_address` is: checked, recorded, never overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_written_kube_ovn_attachment_ip_is_a_static_request() {
    let server = TestServer::start(&["--cni", "kube-ovn", "--network", "default/storage"]).await;
    let ovn = "storage.default.ovn.kubernetes.io/ip_address";
    let ipam_only = "storage.default.kubernetes.io/ip_address";
    // ours: from a list, written in both kinds of Kube-OVN's annotation
    let listed = pod_with(
        "db",
        json!({NETWORKS: "storage@net1", "storage.default.ip-webhook.io/allocatable-ips": "10.50.1.7"}),
    );
    let response = server.mutate(&create("listed", listed.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");
    let patched = apply(&listed, &response);
    for key in [ovn, ipam_only] {
        assert_eq!(
            patched["metadata"]["annotations"][key], "10.50.1.7",
            "{key}: {patched}"
        );
    }
    // another pod naming it by hand, in either annotation, is refused naming both
    for key in [ovn, ipam_only] {
        let thief = pod_with("web", json!({NETWORKS: "storage", key: "10.50.1.7"}));
        for (what, response) in [
            ("mutate", server.mutate(&create("m", thief.clone())).await),
            ("validate", server.validate(&create("v", thief)).await),
        ] {
            assert_eq!(response["allowed"], false, "{what} {key}: {response}");
            let text = message(&response);
            assert!(
                text.contains("10.50.1.7")
                    && text.contains("network default/storage")
                    && text.contains("db"),
                "{what} {key}: {text}"
            );
        }
    }
    // a hand-written one is recorded: the next pod cannot have it
    let hand = pod_with("web", json!({NETWORKS: "storage", ipam_only: "10.50.1.8"}));
    let response = server.mutate(&create("hand", hand.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");
    let patched = apply(&hand, &response);
    assert_eq!(patched["metadata"]["annotations"][ipam_only], "10.50.1.8");
    assert!(
        patched["metadata"]["annotations"].get(ovn).is_none(),
        "what the pod named by hand is not written over or added to: {patched}"
    );
    let second = json!({NETWORKS: r#"[{"name":"storage","ips":["10.50.1.8/24"]}]"#});
    admitted(&server, "other", second, false).await;
    // written in another form, it is kept as written
    let mapped = pod_with(
        "web",
        json!({NETWORKS: "storage", ovn: "::ffff:10.50.1.9",
               "storage.default.ip-webhook.io/allocatable-ips": "10.50.1.9-10.50.1.10"}),
    );
    let response = server.mutate(&create("mapped", mapped.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(
        apply(&mapped, &response)["metadata"]["annotations"][ovn],
        "::ffff:10.50.1.9"
    );
    // outside the pod's list, or unreadable as Kube-OVN reads it: refused
    for (value, expected) in [("10.50.1.20", "10.50.1.20"), ("10.50.1.11 ", ovn)] {
        let pod = pod_with(
            "web",
            json!({NETWORKS: "storage", ovn: value,
                   "storage.default.ip-webhook.io/allocatable-ips": "10.50.1.11-10.50.1.12"}),
        );
        let response = server.mutate(&create("bad", pod)).await;
        assert_eq!(response["allowed"], false, "{value}: {response}");
        assert!(message(&response).contains(expected), "{value}: {response}");
    }
}

/// A Kube-OVN network IP needs no prefix length; its pod carries it in Kube-OVN's attachment
/// annotation, which the cluster's readings (the `/validate` that binds the claim, the watches
/// and the leak sweeper) read as admission does: the claim is bound to the pod and kept while
/// it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kube_ovn_network_ip_without_a_prefix_is_bound_and_kept_while_its_pod_runs() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    create_attachments(&client).await;
    install_crd_fixture(&client, "kube-ovn-crds.yaml").await;
    let mut args = vec!["--cni", "kube-ovn", "--network", "default/storage"];
    // the timings of replica_args(), without its second network
    args.extend(replica_args().into_iter().skip(4));
    let server = fake.replica(&args).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<IPClaim> = Api::all(client.clone());
    let object = pod_with(
        "db",
        json!({NETWORKS: "storage@net1", "storage.default.ip-webhook.io/allocatable-ips": "10.50.1.7"}),
    );
    let response = server.mutate(&create("db", object.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");
    let pod = persist_pod(&pods, apply(&object, &response), "db-0").await;
    let validated = server
        .validate(&create("v-db", serde_json::to_value(&pod).unwrap()))
        .await;
    assert_eq!(validated["allowed"], true, "{validated}");
    let name = "10.50.1.7.storage.default";
    let bound = claim(&claims, name).await.expect("the network's claim");
    assert_eq!(bound.spec.pod_uid, pod.metadata.uid, "bound to the pod");
    assert_eq!(bound.spec.pod_name, pod.metadata.name.clone().unwrap());
    assert_eq!(bound.status.as_ref().unwrap().phase, "Bound");
    // past the reservation TTL and a few resyncs and sweeps, the running pod keeps it
    tokio::time::sleep(Duration::from_secs(8)).await;
    let kept = claim(&claims, name)
        .await
        .expect("the claim of a running pod is kept");
    assert_eq!(kept.spec.pod_uid, pod.metadata.uid);
    let next = pod_with(
        "db",
        json!({NETWORKS: "storage@net1", "storage.default.ip-webhook.io/allocatable-ips": "10.50.1.7"}),
    );
    let refused = server.mutate(&create("next", next)).await;
    assert_eq!(refused["allowed"], false, "{refused}");
}
