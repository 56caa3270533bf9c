//! "Conflicts we refuse": every check of /validate with an accepted and a denied case and the
//! exact message, over real HTTPS.

mod common;

use common::*;
use serde_json::{Value, json};

/// (group, version, kind)
type Gvk = (&'static str, &'static str, &'static str);
/// An object and its kind.
type Manifest = (Value, Gvk);

const POOLS: &str = r#"
- apiVersion: ip-webhook.io/v1alpha1
  kind: FixedIPPool
  metadata: {name: blue}
  spec: {cidr: 10.20.0.0/24, namespaces: [prod]}
- apiVersion: ip-webhook.io/v1alpha1
  kind: FixedIPPool
  metadata: {name: v6}
  spec: {cidr: "fd00:20::/120"}
"#;

async fn server(extra: &[&str]) -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pools.yaml");
    std::fs::write(&file, POOLS).unwrap();
    let mut args = vec!["--pools-file", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    (TestServer::start(&refs).await, dir)
}

fn object_review(gvk: Gvk, operation: &str, object: Option<Value>, old: Option<Value>) -> Value {
    common::object_review(
        &format!("uid-{}", rand_suffix()),
        gvk,
        operation,
        object,
        old,
    )
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

const IPPOOL: Gvk = ("ip-webhook.io", "v1alpha1", "FixedIPPool");

fn ippool(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "ip-webhook.io/v1alpha1", "kind": "FixedIPPool", "metadata": {"name": name}, "spec": spec})
}

/// Assert allowed (`None`) or denied with exactly `message`.
fn expect(response: &Value, message: Option<&str>, case: &str) {
    match message {
        None => assert_eq!(response["allowed"], true, "{case}: {response}"),
        Some(message) => {
            assert_eq!(response["allowed"], false, "{case}: {response}");
            assert_eq!(response["status"]["message"], message, "{case}");
        }
    }
}

#[tokio::test]
async fn ippool_checks() {
    let (server, _dir) = server(&[]).await;
    let cases: Vec<(&str, Value, Option<&str>)> = vec![
        (
            "valid",
            ippool("green", json!({"cidr": "10.21.0.0/24"})),
            None,
        ),
        (
            "valid IPv6",
            ippool(
                "green6",
                json!({"cidr": "fd00:21::/64", "excludeIPs": ["fd00:21::1-fd00:21::ff"]}),
            ),
            None,
        ),
        (
            "bad CIDR",
            ippool("x", json!({"cidr": "10.0.0.0/33"})),
            Some("FixedIPPool x: spec.cidr \"10.0.0.0/33\" is not a valid CIDR"),
        ),
        (
            "host bits",
            ippool("x", json!({"cidr": "10.22.0.7/24"})),
            Some(
                "FixedIPPool x: spec.cidr 10.22.0.7/24 has host bits set; did you mean 10.22.0.0/24?",
            ),
        ),
        (
            "ips outside",
            ippool(
                "x",
                json!({"cidr": "10.22.0.0/24", "ips": ["10.22.0.10-10.22.1.2"]}),
            ),
            Some("FixedIPPool x: spec.ips 10.22.1.0-10.22.1.2 lies outside spec.cidr 10.22.0.0/24"),
        ),
        (
            "excludeIPs outside",
            ippool(
                "x",
                json!({"cidr": "fd00:22::/120", "excludeIPs": ["fd00:23::1"]}),
            ),
            Some("FixedIPPool x: spec.excludeIPs fd00:23::1 lies outside spec.cidr fd00:22::/120"),
        ),
        (
            "malformed ips",
            ippool(
                "x",
                json!({"cidr": "10.22.0.0/24", "ips": ["10.22.0.1", "10.22.0.1"]}),
            ),
            Some("FixedIPPool x: spec.ips: entry 2 \"10.22.0.1\" overlaps entry 1 \"10.22.0.1\""),
        ),
        (
            "overlap",
            ippool("teal", json!({"cidr": "10.20.0.128/25"})),
            Some("FixedIPPool teal (10.20.0.128/25) overlaps FixedIPPool blue (10.20.0.0/24)"),
        ),
        (
            "overlap IPv6",
            ippool("teal6", json!({"cidr": "fd00:20::/64"})),
            Some("FixedIPPool teal6 (fd00:20::/64) overlaps FixedIPPool v6 (fd00:20::/120)"),
        ),
        (
            "update of itself is no overlap",
            ippool("blue", json!({"cidr": "10.20.0.0/24"})),
            None,
        ),
    ];
    for (case, pool, message) in cases {
        let response = server
            .validate(&object_review(IPPOOL, "CREATE", Some(pool), None))
            .await;
        expect(&response, message, case);
    }
}

#[tokio::test]
async fn ippool_updates_and_deletes_keep_held_ips() {
    let (server, _dir) = server(&[]).await;
    let mut p = pod("prod", "api", "api-", None);
    p["metadata"]["annotations"]["ip-webhook.io/ip-pool"] = json!("blue");
    assert_eq!(
        allocated_ip(&server.mutate(&create("m-1", p)).await),
        "10.20.0.1"
    );
    let blue = ippool(
        "blue",
        json!({"cidr": "10.20.0.0/24", "namespaces": ["prod"]}),
    );
    let shrunk = ippool(
        "blue",
        json!({"cidr": "10.20.0.0/24", "excludeIPs": ["10.20.0.1-10.20.0.9"]}),
    );
    let harmless = ippool(
        "blue",
        json!({"cidr": "10.20.0.0/24", "excludeIPs": ["10.20.0.100"]}),
    );
    let response = server
        .validate(&object_review(
            IPPOOL,
            "UPDATE",
            Some(shrunk),
            Some(blue.clone()),
        ))
        .await;
    expect(
        &response,
        Some("FixedIPPool blue: the update removes 1 IPs that are held: 10.20.0.1 by prod/api-*"),
        "shrink",
    );
    let response = server
        .validate(&object_review(
            IPPOOL,
            "UPDATE",
            Some(harmless),
            Some(blue.clone()),
        ))
        .await;
    expect(&response, None, "harmless update");
    let response = server
        .validate(&object_review(IPPOOL, "DELETE", None, Some(blue)))
        .await;
    expect(
        &response,
        Some(
            "FixedIPPool blue cannot be deleted while 1 of its IPs are held: 10.20.0.1 by prod/api-*",
        ),
        "delete held",
    );
    let response = server
        .validate(&object_review(
            IPPOOL,
            "DELETE",
            None,
            Some(ippool("v6", json!({"cidr": "fd00:20::/120"}))),
        ))
        .await;
    expect(&response, None, "delete unused");
}

fn workload(kind: &str, name: &str, app: &str, annotations: Value, spec_extra: Value) -> Manifest {
    let template = json!({"metadata": {"labels": {"app": app}, "annotations": annotations}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
    let mut spec = match kind {
        "CronJob" => {
            json!({"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}})
        }
        _ => json!({"template": template}),
    };
    for (k, v) in spec_extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    let gvk = match kind {
        "Deployment" => ("apps", "v1", "Deployment"),
        "StatefulSet" => ("apps", "v1", "StatefulSet"),
        "ReplicaSet" => ("apps", "v1", "ReplicaSet"),
        "DaemonSet" => ("apps", "v1", "DaemonSet"),
        "Job" => ("batch", "v1", "Job"),
        "CronJob" => ("batch", "v1", "CronJob"),
        _ => unreachable!(),
    };
    (
        json!({"kind": kind, "metadata": {"name": name, "namespace": "prod"}, "spec": spec}),
        gvk,
    )
}

async fn check_workload(server: &TestServer, w: Manifest) -> Value {
    server
        .validate(&object_review(w.1, "CREATE", Some(w.0), None))
        .await
}

#[tokio::test]
async fn workload_checks() {
    let (server, _dir) = server(&[]).await;
    let list = |l: &str| json!({"ip-webhook.io/allocatable-ips": l});
    // accepted, and recorded as app prod/web's list
    let ok = check_workload(
        &server,
        workload(
            "Deployment",
            "web",
            "web",
            list("10.50.0.1-10.50.0.4"),
            json!({"replicas": 2}),
        ),
    )
    .await;
    expect(&ok, None, "valid deployment");
    assert!(ok.get("warnings").is_none(), "{ok}");

    let denied: Vec<(&str, Manifest, &str)> = vec![
        (
            "malformed",
            workload("Deployment", "bad", "bad", list("10.51.0.1,x"), json!({})),
            "Deployment prod/bad: spec.template.metadata.annotations[ip-webhook.io/allocatable-ips]: entry 2 \"x\": \"x\" is not an IP address",
        ),
        (
            "malformed cronjob",
            workload(
                "CronJob",
                "nightly",
                "nightly",
                list("10.51.0.9-10.51.0.1"),
                json!({}),
            ),
            "CronJob prod/nightly: spec.jobTemplate.spec.template.metadata.annotations[ip-webhook.io/allocatable-ips]: entry 1 \"10.51.0.9-10.51.0.1\": the range is reversed (10.51.0.9 is after 10.51.0.1)",
        ),
        (
            "no app label",
            workload("Job", "j", "", list("10.51.1.1"), json!({})),
            "Job prod/j: the pod template asks for fixed IPs but spec.template.metadata.labels has no \"app\" label; ip-webhook needs it (with the namespace) to know which app the IPs belong to",
        ),
        (
            "listed by another app",
            workload(
                "StatefulSet",
                "db",
                "db",
                list("10.50.0.4-10.50.0.8"),
                json!({"replicas": 1}),
            ),
            "StatefulSet prod/db: spec.template.metadata.annotations[ip-webhook.io/allocatable-ips] lists 10.50.0.4, which Deployment prod/web (app prod/web) already lists",
        ),
        (
            "unknown pool",
            workload(
                "Deployment",
                "p",
                "p",
                json!({"ip-webhook.io/ip-pool": "nope"}),
                json!({}),
            ),
            "Deployment prod/p: spec.template.metadata.annotations[ip-webhook.io/ip-pool] names FixedIPPool \"nope\", which does not exist",
        ),
        (
            "list inside a pool of others",
            workload(
                "Deployment",
                "sneaky",
                "sneaky",
                list("10.20.0.5"),
                json!({}),
            ),
            "",
        ),
    ];
    for (case, w, message) in denied {
        let response = check_workload(&server, w).await;
        if message.is_empty() {
            assert_eq!(
                response["allowed"], true,
                "{case}: blue serves prod, so prod may list its IPs: {response}"
            );
        } else {
            expect(&response, Some(message), case);
        }
    }
    // the same app's ReplicaSet (made by the Deployment) may repeat the list
    let (mut replica_set, gvk) = workload(
        "ReplicaSet",
        "web-5d9c",
        "web",
        list("10.50.0.1-10.50.0.4"),
        json!({"replicas": 2}),
    );
    replica_set["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u", "controller": true}]);
    let same_app = check_workload(&server, (replica_set, gvk)).await;
    expect(&same_app, None, "same app");
    // once web stops listing its IPs, another app may list them
    let (unlisted, gvk) = workload(
        "Deployment",
        "web",
        "web",
        json!({}),
        json!({"replicas": 2}),
    );
    let (listed, _) = workload(
        "Deployment",
        "web",
        "web",
        list("10.50.0.1-10.50.0.4"),
        json!({"replicas": 2}),
    );
    expect(
        &server
            .validate(&object_review(gvk, "UPDATE", Some(unlisted), Some(listed)))
            .await,
        None,
        "unlist",
    );
    let db = check_workload(
        &server,
        workload(
            "StatefulSet",
            "db",
            "db",
            list("10.50.0.4-10.50.0.8"),
            json!({"replicas": 1}),
        ),
    )
    .await;
    expect(&db, None, "listed by nobody now");
}

#[tokio::test]
async fn workload_lists_reserved_pools_and_held_ips() {
    let (server, _dir) = server(&[]).await;
    // pool blue serves only namespace prod: a dev workload may not list its IPs
    let (mut w, gvk) = workload(
        "Deployment",
        "intruder",
        "intruder",
        json!({"ip-webhook.io/allocatable-ips": "10.20.0.5-10.20.0.6"}),
        json!({}),
    );
    w["metadata"]["namespace"] = json!("dev");
    let response = server
        .validate(&object_review(gvk, "CREATE", Some(w), None))
        .await;
    expect(
        &response,
        Some(
            "Deployment dev/intruder: spec.template.metadata.annotations[ip-webhook.io/allocatable-ips] lists 10.20.0.5-10.20.0.6 of FixedIPPool blue, which this workload may not use: FixedIPPool blue serves namespaces [prod], not dev",
        ),
        "reserved pool",
    );
    // the same rule for a pod
    let mut p = pod("dev", "intruder", "intruder-", Some("10.20.0.5"));
    p["metadata"]["name"] = json!("intruder-1");
    let response = server.validate(&create("p-1", p)).await;
    expect(
        &response,
        Some(
            "pod dev/intruder-1: annotation ip-webhook.io/allocatable-ips lists 10.20.0.5 of FixedIPPool blue, which this pod may not use: FixedIPPool blue serves namespaces [prod], not dev",
        ),
        "reserved pool, pod",
    );
    // an IP held by another app's pod
    server
        .mutate(&create(
            "m-1",
            pod("prod", "cache", "cache-", Some("10.60.0.7")),
        ))
        .await;
    let response = check_workload(
        &server,
        workload(
            "Deployment",
            "web",
            "web",
            json!({"ip-webhook.io/allocatable-ips": "10.60.0.0/28"}),
            json!({}),
        ),
    )
    .await;
    expect(
        &response,
        Some(
            "Deployment prod/web: spec.template.metadata.annotations[ip-webhook.io/allocatable-ips] lists 10.60.0.7, which pod prod/cache-* of app prod/cache holds",
        ),
        "held by another app",
    );
    // a pool-based workload outside the pool's namespaces
    let (mut w, gvk) = workload(
        "StatefulSet",
        "s",
        "s",
        json!({"ip-webhook.io/ip-pool": "blue"}),
        json!({}),
    );
    w["metadata"]["namespace"] = json!("dev");
    let response = server
        .validate(&object_review(gvk, "CREATE", Some(w), None))
        .await;
    expect(
        &response,
        Some(
            "StatefulSet dev/s may not draw from FixedIPPool blue: FixedIPPool blue serves namespaces [prod], not dev",
        ),
        "pool namespaces",
    );
}

#[tokio::test]
async fn capacity_warnings() {
    let (server, _dir) = server(&[]).await;
    let list = |l: &str| json!({"ip-webhook.io/allocatable-ips": l});
    let cases: Vec<(&str, Manifest, Option<&str>)> = vec![
        (
            "replicas beyond the list",
            workload(
                "StatefulSet",
                "a",
                "a",
                list("10.70.0.1-10.70.0.3"),
                json!({"replicas": 5}),
            ),
            Some(
                "StatefulSet prod/a asks for 5 replicas but its list has 3 IPs: pods beyond 3 will be refused",
            ),
        ),
        (
            "dual stack counts the short family",
            workload(
                "StatefulSet",
                "b",
                "b",
                list("10.70.1.1-10.70.1.3,fd00:70::1"),
                json!({"replicas": 2}),
            ),
            Some(
                "StatefulSet prod/b asks for 2 replicas but its list has 1 IPs: pods beyond 1 will be refused",
            ),
        ),
        (
            "rolling surge",
            workload(
                "Deployment",
                "c",
                "c",
                list("10.70.2.1-10.70.2.4"),
                json!({"replicas": 4}),
            ),
            Some(
                "Deployment prod/c asks for 4 replicas and a rolling update adds up to 1 more, but its list has 4 IPs: surge pods will be refused until old pods release their IPs (consider maxSurge: 0)",
            ),
        ),
        (
            "no surge",
            workload(
                "Deployment",
                "d",
                "d",
                list("10.70.3.1-10.70.3.4"),
                json!({"replicas": 4, "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}}),
            ),
            None,
        ),
        (
            "daemonset",
            workload(
                "DaemonSet",
                "e",
                "e",
                list("10.70.4.1-10.70.4.3"),
                json!({}),
            ),
            Some(
                "DaemonSet prod/e runs one pod per node and its list has 3 IPs: pods on nodes beyond the first 3 will be refused",
            ),
        ),
        (
            "pool",
            workload(
                "Deployment",
                "f",
                "f",
                json!({"ip-webhook.io/ip-pool": "blue"}),
                json!({"replicas": 300}),
            ),
            Some(
                "Deployment prod/f asks for 300 replicas but FixedIPPool blue has 254 IPs: pods beyond 254 will be refused",
            ),
        ),
    ];
    for (case, w, warning) in cases {
        let response = check_workload(&server, w).await;
        assert_eq!(
            response["allowed"], true,
            "{case}: warnings never deny: {response}"
        );
        match warning {
            Some(warning) => assert_eq!(response["warnings"], json!([warning]), "{case}"),
            None => assert!(response.get("warnings").is_none(), "{case}: {response}"),
        }
    }
}

const SUBNET: Gvk = ("kubeovn.io", "v1", "Subnet");
const CALICO: Gvk = ("crd.projectcalico.org", "v1", "IPPool");

fn subnet(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "kubeovn.io/v1", "kind": "Subnet", "metadata": {"name": name}, "spec": spec})
}

#[tokio::test]
async fn kube_ovn_subnets_and_calico_pools_when_switched_on() {
    let (off, _d1) = server(&[]).await;
    let (on, _d2) = server(&["--check-kube-ovn-subnets", "--check-calico-ippools"]).await;
    let ordered: Vec<(&str, Gvk, &str, Value, Option<&str>)> = vec![
        (
            "subnet a",
            SUBNET,
            "CREATE",
            subnet("a", json!({"cidrBlock": "10.16.0.0/16,fd00:10:16::/64"})),
            None,
        ),
        (
            "overlap v4",
            SUBNET,
            "CREATE",
            subnet("b", json!({"cidrBlock": "10.16.4.0/24"})),
            Some("Subnet b (10.16.4.0/24) overlaps Subnet a (10.16.0.0/16) in VPC ovn-cluster"),
        ),
        (
            "overlap v6 half of dual stack",
            SUBNET,
            "CREATE",
            subnet("b", json!({"cidrBlock": "10.17.0.0/16,fd00:10:16::/96"})),
            Some(
                "Subnet b (10.17.0.0/16,fd00:10:16::/96) overlaps Subnet a (fd00:10:16::/64) in VPC ovn-cluster",
            ),
        ),
        (
            "other VPC",
            SUBNET,
            "CREATE",
            subnet("c", json!({"cidrBlock": "10.16.4.0/24", "vpc": "tenant-1"})),
            None,
        ),
        (
            "excludeIps outside",
            SUBNET,
            "CREATE",
            subnet(
                "d",
                json!({"cidrBlock": "10.18.0.0/24", "excludeIps": ["10.18.0.1..10.18.0.10", "10.19.0.1"]}),
            ),
            Some("Subnet d: spec.excludeIps 10.19.0.1 lies outside spec.cidrBlock 10.18.0.0/24"),
        ),
        (
            "bad cidrBlock",
            SUBNET,
            "CREATE",
            subnet("e", json!({"cidrBlock": "10.18.0.0/40"})),
            Some("Subnet e: spec.cidrBlock \"10.18.0.0/40\" is not a valid CIDR"),
        ),
        (
            "calico a",
            CALICO,
            "CREATE",
            json!({"kind": "IPPool", "metadata": {"name": "default-ipv4"}, "spec": {"cidr": "192.168.0.0/16"}}),
            None,
        ),
        (
            "calico overlap",
            CALICO,
            "CREATE",
            json!({"kind": "IPPool", "metadata": {"name": "fixed"}, "spec": {"cidr": "192.168.1.0/24"}}),
            Some(
                "Calico IPPool fixed (192.168.1.0/24) overlaps Calico IPPool default-ipv4 (192.168.0.0/16)",
            ),
        ),
        (
            "calico delete",
            CALICO,
            "DELETE",
            json!({"kind": "IPPool", "metadata": {"name": "default-ipv4"}, "spec": {"cidr": "192.168.0.0/16"}}),
            None,
        ),
        (
            "calico after delete",
            CALICO,
            "CREATE",
            json!({"kind": "IPPool", "metadata": {"name": "fixed"}, "spec": {"cidr": "192.168.1.0/24"}}),
            None,
        ),
    ];
    for (case, gvk, operation, object, message) in ordered {
        let (object, old) = if operation == "DELETE" {
            (None, Some(object))
        } else {
            (Some(object), None)
        };
        let review = object_review(gvk, operation, object, old);
        expect(&on.validate(&review).await, message, case);
        expect(
            &off.validate(&review).await,
            None,
            &format!("{case} (checks off)"),
        );
    }
}

/// A mistyped `ip-webhook.io/` key asks for nothing, so the pod or workload is admitted as it
/// is: the answer warns, naming the key and the known key closest to it.
#[tokio::test]
async fn mistyped_keys_are_warned_about_with_the_closest_known_key() {
    let (server, _dir) = server(&[]).await;
    let mut typo = pod("prod", "t", "t-", None);
    typo["metadata"]["labels"]["ip-webhook.io/fixed-ip"] = json!("");
    typo["metadata"]["annotations"]["ip-webhook.io/allocatable-ip"] = json!("10.70.9.1");
    let response = server.mutate(&create("typo-1", typo)).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response.get("patch").is_none(), "{response}");
    assert_eq!(
        response["warnings"],
        json!([
            r#"metadata.annotations["ip-webhook.io/allocatable-ip"]: ip-webhook reads no such key and ignores it; did you mean "ip-webhook.io/allocatable-ips"?"#
        ]),
        "{response}"
    );
    // the same pod spelled right gets its IP and no warning
    let right = pod("prod", "t", "t-", Some("10.70.9.1"));
    let response = server.mutate(&create("typo-2", right)).await;
    assert_eq!(allocated_ip(&response), "10.70.9.1", "{response}");
    assert!(response.get("warnings").is_none(), "{response}");

    let w = workload(
        "Deployment",
        "w",
        "w",
        json!({"ip-webhook.io/allocatable-ips": "10.70.8.1-10.70.8.3", "ip-webhook.io/ippool": "blue"}),
        json!({"replicas": 2}),
    );
    let response = check_workload(&server, w).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(
        response["warnings"],
        json!([
            r#"spec.template.metadata.annotations["ip-webhook.io/ippool"]: ip-webhook reads no such key and ignores it; did you mean "ip-webhook.io/ip-pool"?"#
        ]),
        "{response}"
    );
}
