//! `check --drift` against `fakeapi.py` with Kube-OVN's and Calico's IPAM CRDs
//! installed (tests/fixtures/cni-crds.yaml): each of the four kinds of drift is found, a clean
//! cluster reports none and exits 0, and an embedded ledger is compared as `status` reads it.

mod common;

use std::time::Duration;

use common::{Ran, claims, eventually, fakeapi, ip_webhook};
use fakeapi::{FakeApi, install_crd_fixture};
use ip_webhook_ledger::crd::IPClaim;
use ip_webhook_ledger::{KubeLedger, Ledger};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

const TOKEN: &str = "0123456789abcdef0123456789abcdef";
const LIST: &str = "10.0.0.10-10.0.0.17";

/// Install the Kube-OVN and Calico IPAM CRDs of tests/fixtures/cni-crds.yaml.
async fn install_cni_crds(client: &Client) {
    assert_eq!(
        install_crd_fixture(client, "cni-crds.yaml").await,
        [
            "ips.kubeovn.io",
            "ipamhandles.crd.projectcalico.org",
            "ipamblocks.crd.projectcalico.org"
        ]
    );
}

fn resource(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1", kind), plural)
}

/// Create a cluster-scoped CNI object, waiting for its CRD to be served.
async fn create_cni_object(client: &Client, resource: &ApiResource, name: &str, data: Value) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    let object = DynamicObject::new(name, resource).data(data);
    eventually(
        &format!("{} {name} to be created", resource.kind),
        Duration::from_secs(10),
        || {
            let (api, object) = (&api, &object);
            async move { api.create(&PostParams::default(), object).await.ok() }
        },
    )
    .await;
}

/// A pod of app web (carrying the list and the claim token), running on `pod_ips`. Returns
/// its UID.
async fn web_pod(client: &Client, name: &str, label_ip: &str, pod_ips: &[&str]) -> String {
    let object = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "default",
            "labels": {"app": "web", "ip-webhook.io/allocated-ip": label_ip},
            "annotations": {
                "ip-webhook.io/allocatable-ips": LIST,
                "ip-webhook.io/claim": TOKEN,
                "cni.projectcalico.org/ipAddrs": format!("[\"{label_ip}\"]"),
            },
        },
        "spec": {"containers": [{"name": "c", "image": "i"}], "nodeName": "n1"},
    });
    running_pod(client, "default", object, pod_ips).await
}

/// A pod another IPAM runs, without ip-webhook's annotations.
async fn foreign_pod(client: &Client, namespace: &str, name: &str, ip: &str) -> String {
    let object = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "legacy"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    });
    running_pod(client, namespace, object, &[ip]).await
}

async fn running_pod(client: &Client, namespace: &str, object: Value, ips: &[&str]) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let name = object["metadata"]["name"].as_str().unwrap().to_string();
    let created = pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(object).unwrap(),
        )
        .await
        .unwrap();
    let pod_ips: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    pods.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"phase": "Running", "podIP": ips.first(), "podIPs": pod_ips}}),
        ),
    )
    .await
    .unwrap();
    created.metadata.uid.unwrap()
}

/// An IPClaim as the reconciler leaves it: Bound to `uid`, reserved an hour ago.
async fn bound_claim(client: &Client, ip: &str, name: &str, uid: &str) {
    let claim = claims::builder(ip, "web", name)
        .generate_name("web-")
        .uid(uid)
        .bound()
        .list_size(8)
        .token(TOKEN)
        .at(0)
        .build();
    KubeLedger::new(client.clone())
        .create(claim.clone().into())
        .await
        .unwrap();
    let hour_ago =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_hours(1);
    let claims: Api<IPClaim> = Api::all(client.clone());
    claims
        .patch_status(
            &ip_webhook_ledger::kubernetes::claim_name(&claim.ip),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "Bound",
                "reservedAt": hour_ago.to_string(),
                "updatedAt": hour_ago.to_string(),
            }})),
        )
        .await
        .unwrap();
}

fn kube_ovn_ip(pod: &str, ip: &str) -> Value {
    json!({"spec": {
        "podName": pod, "namespace": "default", "subnet": "ovn-default", "podType": "",
        "ipAddress": ip, "v4IpAddress": ip, "nodeName": "n1",
    }})
}

/// A Calico block over 10.0.0.16/29 ... 10.0.0.8/29: `allocations` by ordinal.
fn calico_block(cidr: &str, allocations: Value, attributes: Value) -> Value {
    json!({"spec": {
        "cidr": cidr, "affinity": "host:n1", "allocations": allocations, "attributes": attributes,
        "unallocated": [], "strictAffinity": false,
    }})
}

fn calico_attribute(handle: &str, pod: &str) -> Value {
    json!({"handle_id": handle, "secondary": {"namespace": "default", "pod": pod, "node": "n1"}})
}

async fn calico_handle(client: &Client, handle: &str, block: &str) {
    create_cni_object(
        client,
        &resource("crd.projectcalico.org", "IPAMHandle", "ipamhandles"),
        handle,
        json!({"spec": {"handleID": handle, "block": {block: 1}}}),
    )
    .await;
}

/// The cluster of the clean case: pod web-a on its claimed 10.0.0.10, known to both CNIs.
async fn clean_cluster(fake: &FakeApi) -> Client {
    let client = fake.install_crds().await;
    install_cni_crds(&client).await;
    let uid = web_pod(&client, "web-a", "10.0.0.10", &["10.0.0.10"]).await;
    bound_claim(&client, "10.0.0.10", "web-a", &uid).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let other = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}});
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(other).unwrap(),
        )
        .await
        .unwrap();
    foreign_pod(&client, "other", "db", "10.9.0.1").await; // on no list: no business of ours
    create_cni_object(
        &client,
        &resource("kubeovn.io", "IP", "ips"),
        "web-a.default",
        kube_ovn_ip("web-a", "10.0.0.10"),
    )
    .await;
    calico_handle(&client, "k8s-pod-network.aaa", "10.0.0.8/29").await;
    create_cni_object(
        &client,
        &resource("crd.projectcalico.org", "IPAMBlock", "ipamblocks"),
        "10-0-0-8-29",
        calico_block(
            "10.0.0.8/29",
            json!([null, null, 0, null, null, null, null, null]),
            json!([calico_attribute("k8s-pod-network.aaa", "web-a")]),
        ),
    )
    .await;
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_cluster_has_no_drift_and_exits_0() {
    let fake = FakeApi::start();
    clean_cluster(&fake).await;
    let kubeconfig = fake.kubeconfig().display().to_string();
    let Ran {
        code,
        stdout: out,
        stderr: err,
        ..
    } = ip_webhook(&["check", "--drift", "--kubeconfig", &kubeconfig]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(
        out,
        "No drift: compared 1 claims, 2 pods, 1 Kube-OVN IP objects, 1 Calico IPAM allocations.\n"
    );
    let Ran {
        code,
        stdout: json,
        stderr: err,
        ..
    } = ip_webhook(&[
        "check",
        "--drift",
        "--kubeconfig",
        &kubeconfig,
        "-o",
        "json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let report: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        report,
        json!({"drift": [], "compared": {"claims": 1, "pods": 2, "kube_ovn_ips": 1, "calico_allocations": 1}})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_of_drift_is_found_and_exits_3() {
    let fake = FakeApi::start();
    let client = clean_cluster(&fake).await;
    // 1. A claim whose pod is gone (the reconciler was not running to free it).
    bound_claim(&client, "10.0.0.11", "web-gone", "uid-of-a-gone-pod").await;
    // 2. A pod of another IPAM on an IP of web's list.
    foreign_pod(&client, "other", "squatter", "10.0.0.14").await;
    // 3. A pod the CNI gave another IP than its claim.
    let uid = web_pod(&client, "web-b", "10.0.0.12", &["10.0.0.13"]).await;
    bound_claim(&client, "10.0.0.12", "web-b", &uid).await;
    // 4. Both CNIs still holding list IPs for pods that are gone.
    create_cni_object(
        &client,
        &resource("kubeovn.io", "IP", "ips"),
        "web-old.default",
        kube_ovn_ip("web-old", "10.0.0.15"),
    )
    .await;
    calico_handle(&client, "k8s-pod-network.fff", "10.0.0.16/29").await;
    create_cni_object(
        &client,
        &resource("crd.projectcalico.org", "IPAMBlock", "ipamblocks"),
        "10-0-0-16-29",
        calico_block(
            "10.0.0.16/29",
            json!([null, 0, null, null, null, null, null, null]),
            json!([calico_attribute("k8s-pod-network.fff", "web-older")]),
        ),
    )
    .await;

    let kubeconfig = fake.kubeconfig().display().to_string();
    let Ran {
        code,
        stdout: json,
        stderr: err,
        ..
    } = ip_webhook(&[
        "check",
        "--drift",
        "--kubeconfig",
        &kubeconfig,
        "-o",
        "json",
    ]);
    assert_eq!(code, Some(3), "{json}{err}");
    assert_eq!(err.trim(), "Error: 5 drift found");
    let report: Value = serde_json::from_str(&json).unwrap();
    let found: Vec<(String, String, String)> = report["drift"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["kind"].as_str().unwrap().to_string(),
                d["ip"].as_str().unwrap().to_string(),
                d["pod"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let row = |kind: &str, ip: &str, pod: &str| (kind.to_string(), ip.to_string(), pod.to_string());
    assert_eq!(
        found,
        [
            row("claim-without-pod", "10.0.0.11", "default/web-gone"),
            row("pod-without-claim", "10.0.0.14", "other/squatter"),
            row("pod-ip-differs", "10.0.0.12", "default/web-b"),
            row("cni-holds-gone-pod", "10.0.0.15", "default/web-old"),
            row("cni-holds-gone-pod", "10.0.0.17", "default/web-older"),
        ]
    );
    assert_eq!(
        report["drift"][0]["detail"],
        "Bound claim of app default/web has no pod (`ip-webhook release 10.0.0.11` frees it)"
    );
    assert_eq!(report["drift"][2]["pod_ips"], json!(["10.0.0.13"]));
    assert_eq!(
        report["drift"][3]["detail"],
        "Kube-OVN IP web-old.default holds it for a pod that is gone"
    );
    assert_eq!(
        report["drift"][4]["detail"],
        "Calico IPAMBlock 10-0-0-16-29 (handle k8s-pod-network.fff) holds it for a pod that is gone"
    );
    assert_eq!(report["compared"]["calico_allocations"], 2);

    // The table names each kind; -n keeps one namespace's pods.
    let Ran {
        code,
        stdout: table,
        ..
    } = ip_webhook(&["check", "--drift", "--kubeconfig", &kubeconfig]);
    assert_eq!(code, Some(3));
    for kind in [
        "claim-without-pod",
        "pod-without-claim",
        "pod-ip-differs",
        "cni-holds-gone-pod",
    ] {
        assert!(table.contains(kind), "{kind} missing:\n{table}");
    }
    assert!(table.starts_with("KIND "), "{table}");
    let Ran {
        code,
        stdout: table,
        ..
    } = ip_webhook(&[
        "check",
        "--drift",
        "--kubeconfig",
        &kubeconfig,
        "-n",
        "other",
    ]);
    assert_eq!(code, Some(3));
    assert_eq!(
        table.lines().filter(|l| l.contains("10.0.0.")).count(),
        1,
        "{table}"
    );
    assert!(table.contains("other/squatter"), "{table}");
}

/// `release --from-report` reads what `check --drift -o json` wrote: it shows what it would
/// free (nothing written), frees the claims without a pod with --apply, and never touches a
/// finding of another kind nor a claim that is gone by then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_from_report_frees_the_claims_without_a_pod() {
    let fake = FakeApi::start();
    let client = clean_cluster(&fake).await;
    bound_claim(&client, "10.0.0.11", "web-gone", "uid-of-a-gone-pod").await;
    let uid = web_pod(&client, "web-b", "10.0.0.12", &["10.0.0.13"]).await;
    bound_claim(&client, "10.0.0.12", "web-b", &uid).await;
    let kubeconfig = fake.kubeconfig().display().to_string();
    let Ran { code, stdout, .. } = ip_webhook(&[
        "check",
        "--drift",
        "--kubeconfig",
        &kubeconfig,
        "-o",
        "json",
    ]);
    assert_eq!(code, Some(3));
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("drift.json");
    std::fs::write(&report, &stdout).unwrap();
    let report = report.to_str().unwrap();
    let claims: Api<IPClaim> = Api::all(client.clone());
    let release = |apply: bool| {
        let mut args = vec![
            "release",
            "--from-report",
            report,
            "--kubeconfig",
            &kubeconfig,
        ];
        if apply {
            args.push("--apply");
        }
        ip_webhook(&args)
    };

    let Ran {
        ok, stdout, stderr, ..
    } = release(false);
    assert!(ok, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines[0].starts_with(
            "would release 10.0.0.11 (Bound, held by pod default/web-gone of app default/web"
        ),
        "{stdout}"
    );
    assert_eq!(
        lines[1],
        "would release 1 of 1 claims without a pod; rerun with --apply to release them"
    );
    assert!(
        claims.get_opt("10.0.0.11").await.unwrap().is_some(),
        "a dry run writes nothing"
    );

    let Ran {
        ok, stdout, stderr, ..
    } = release(true);
    assert!(ok, "{stderr}");
    assert!(stdout.starts_with("released 10.0.0.11 (Bound"), "{stdout}");
    assert!(
        stdout.ends_with("released 1 of 1 claims without a pod\n"),
        "{stdout}"
    );
    eventually("the claim is deleted", Duration::from_secs(5), || async {
        claims
            .get_opt("10.0.0.11")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(
        claims.get_opt("10.0.0.12").await.unwrap().is_some(),
        "a pod-ip-differs finding is not a claim to free"
    );

    // the report is stale now: nothing of it is freed twice, and the exit status says so
    let Ran {
        code,
        stdout,
        stderr,
        ..
    } = release(true);
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    assert!(
        stdout.starts_with("nothing to release: no claim holds 10.0.0.11"),
        "{stdout}"
    );
    assert_eq!(stderr.trim(), "Error: 1 of 1 findings not released (above)");

    let Ran { ok, stderr, .. } = ip_webhook(&["release", "--from-report", "/no/such/report"]);
    assert!(!ok);
    assert!(
        stderr.starts_with("Error: reading the report /no/such/report: "),
        "{stderr}"
    );
}

/// Without the CNI CRDs, the pods are still compared and the CNIs reported as not installed;
/// an embedded ledger (--state-dir) is compared with the cluster of --kubeconfig.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_ledger_is_compared_with_the_cluster() {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let uid = web_pod(&client, "web-a", "10.0.0.10", &["10.0.0.10"]).await;
    let state = tempfile::tempdir().unwrap();
    let ledger = ip_webhook_ledger::EmbeddedLedger::open(state.path(), Default::default()).unwrap();
    let gone = claims::builder("10.0.0.11", "web", "web-gone")
        .generate_name("web-")
        .uid("uid-gone")
        .bound()
        .list_size(8)
        .token(TOKEN)
        .at(1_764_400_000)
        .build();
    let live = claims::builder("10.0.0.10", "web", "web-a")
        .generate_name("web-")
        .uid(&uid)
        .bound()
        .list_size(8)
        .token(TOKEN)
        .at(1_764_400_000)
        .build();
    ledger.create(gone.clone().into()).await.unwrap();
    ledger.create(live.clone().into()).await.unwrap();
    ledger.close().await;

    let kubeconfig = fake.kubeconfig().display().to_string();
    let dir = state.path().display().to_string();
    let Ran {
        code,
        stdout: table,
        stderr: err,
        ..
    } = ip_webhook(&[
        "check",
        "--drift",
        "--kubeconfig",
        &kubeconfig,
        "--state-dir",
        &dir,
    ]);
    assert_eq!(code, Some(3), "{table}{err}");
    let rows: Vec<&str> = table
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(rows.len(), 1, "{table}");
    assert!(
        rows[0].starts_with("claim-without-pod   10.0.0.11   default/web-gone"),
        "{table}"
    );
    assert!(
        table.ends_with(
            "1 drift found; compared 2 claims, 1 pods, no Kube-OVN IP objects (not installed), no Calico IPAM allocations (not installed).\n"
        ),
        "{table}"
    );
    // Without a cluster there is nothing to compare with.
    let Ran {
        code, stderr: err, ..
    } = ip_webhook(&["check", "--drift", "--state-dir", &dir]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("give --kubeconfig FILE"), "{err}");
}

/// Pods spread over three pages of the pod list (500 a page): every page is read, the plain
/// pods that matter on each are kept, and every pod is counted. The list IPs are written on
/// pods only (no workload lists them), so the cluster is read a second time for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_of_pods_is_read() {
    use futures::StreamExt;
    let fake = FakeApi::start();
    let client = clean_cluster(&fake).await;
    // In the list's order (namespace, then name): default/web-a, other/a-squatter, other/db,
    // other/f-*, other/m-squatter (page 2), other/p-* (a Kube-OVN IP names p-0599, page 3),
    // other/z-squatter (page 3).
    let fillers = (0..600).flat_map(|i| [format!("f-{i:04}"), format!("p-{i:04}")]);
    futures::stream::iter(fillers)
        .for_each_concurrent(8, |name| {
            let pods: Api<Pod> = Api::namespaced(client.clone(), "other");
            async move {
                let object = json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": "other"},
                    "spec": {"containers": [{"name": "c", "image": "i"}]},
                });
                let object = serde_json::from_value(object).unwrap();
                pods.create(&PostParams::default(), &object).await.unwrap();
            }
        })
        .await;
    for (name, ip) in [
        ("a-squatter", "10.0.0.14"),
        ("m-squatter", "10.0.0.15"),
        ("z-squatter", "10.0.0.16"),
    ] {
        foreign_pod(&client, "other", name, ip).await;
    }
    let mut held = kube_ovn_ip("p-0599", "10.0.0.17");
    held["spec"]["namespace"] = json!("other");
    create_cni_object(
        &client,
        &resource("kubeovn.io", "IP", "ips"),
        "p-0599.other",
        held,
    )
    .await;
    fake.control("/fake/requests/clear", json!({}));
    let kubeconfig = fake.kubeconfig().display().to_string();
    let Ran { code, stdout, .. } = ip_webhook(&[
        "check",
        "--drift",
        "--kubeconfig",
        &kubeconfig,
        "-o",
        "json",
    ]);
    assert_eq!(code, Some(3), "{stdout}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let found: Vec<(&str, &str, &str)> = report["drift"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let field = |key: &str| d[key].as_str().unwrap();
            (field("kind"), field("ip"), field("pod"))
        })
        .collect();
    assert_eq!(
        found,
        [
            ("pod-without-claim", "10.0.0.14", "other/a-squatter"),
            ("pod-without-claim", "10.0.0.15", "other/m-squatter"),
            ("pod-without-claim", "10.0.0.16", "other/z-squatter"),
        ],
        "p-0599 on page 3 exists: its Kube-OVN IP is not reported"
    );
    assert_eq!(report["compared"]["pods"], 1205);
    let log = fake.get_json("/fake/requests");
    let continued = log["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["path"] == "/api/v1/pods")
        .filter(|r| r["query"].as_str().unwrap_or("").contains("continue="))
        .count();
    // pages 2 and 3, once for every read and once more for the IPs only pods list
    assert_eq!(continued, 4, "{log}");
}
