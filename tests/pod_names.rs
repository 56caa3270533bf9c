//! What names a pod's IP, over HTTPS in the API server's order (`/mutate`, then `/validate`
//! with the generated name and UID, then updates and the DELETE): the keys that name a
//! claim-holding pod's IP cannot change, a DELETE finds the pod's claims by who the pod is,
//! each CNI annotation is read as that CNI reads it, and static IPs keep to pool and app
//! policy. The ledger-dependent cases run in the embedded, in-cluster and etcd modes.

mod common;

#[cfg(feature = "etcd")]
use common::etcd_cluster;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{TestServer, apply, create, eventually, fakeapi, message, pod, review};
use fakeapi::FakeApi;
use ip_webhook_ledger::Phase;
use ip_webhook_ledger::crd::FixedIPPool;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::{Value, json};

const POOLS: &str = r#"
- apiVersion: ip-webhook.io/v1alpha1
  kind: FixedIPPool
  metadata: {name: blue}
  spec: {cidr: 10.20.0.0/24, namespaces: [prod]}
"#;

fn next_uid(tag: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{tag}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Where a scenario runs: the server, and (in-cluster) the API server its pods are stored in.
struct Mode {
    name: &'static str,
    server: TestServer,
    pods: Option<Api<Pod>>,
    /// In-cluster: the API server's client.
    client: Option<kube::Client>,
    // kept alive for the test
    _fake: Option<FakeApi>,
    #[cfg(feature = "etcd")]
    _etcd: Option<etcd_cluster::EtcdCluster>,
}

async fn embedded(extra: &[&str]) -> Mode {
    Mode {
        name: "embedded",
        server: TestServer::start(extra).await,
        pods: None,
        client: None,
        _fake: None,
        #[cfg(feature = "etcd")]
        _etcd: None,
    }
}

async fn in_cluster(extra: &[&str]) -> Mode {
    let fake = FakeApi::start();
    let client = fake.install_crds().await;
    let server = fake.replica(extra).await;
    Mode {
        name: "in-cluster",
        server,
        pods: Some(Api::namespaced(client.clone(), "default")),
        client: Some(client),
        _fake: Some(fake),
        #[cfg(feature = "etcd")]
        _etcd: None,
    }
}

#[cfg(feature = "etcd")]
async fn etcd(test: &str, extra: &[&str]) -> Mode {
    let binary = etcd_cluster::etcd_binary(test);
    let cluster = etcd_cluster::EtcdCluster::start(&binary, 1);
    let endpoints = cluster.endpoints_flag();
    let mut args = vec!["--ledger", "etcd", "--etcd-endpoints", &endpoints];
    args.extend_from_slice(extra);
    Mode {
        name: "etcd",
        server: TestServer::start(&args).await,
        pods: None,
        client: None,
        _fake: None,
        _etcd: Some(cluster),
    }
}

impl Mode {
    /// A pod admitted as the API server does it: `/mutate`, the patch applied, the name and
    /// UID set, `/validate` (which binds the claim to the UID), then stored (in-cluster).
    async fn admit(&self, object: Value, name: &str) -> Result<Value, String> {
        let mutated = self
            .server
            .mutate(&create(&next_uid("m"), object.clone()))
            .await;
        if mutated["allowed"] != true {
            return Err(message(&mutated));
        }
        let mut stored = if mutated.get("patch").is_some() {
            apply(&object, &mutated)
        } else {
            object
        };
        stored["metadata"]["name"] = json!(name);
        stored["metadata"]["uid"] = json!(format!("uid-{name}"));
        // in-cluster the API server's store picks the UID: stored first, validated with it
        if let Some(pods) = self.pods_of(&stored) {
            let pod: Pod = serde_json::from_value(stored.clone()).unwrap();
            let created = pods.create(&Default::default(), &pod).await.unwrap();
            stored = serde_json::to_value(&created).unwrap();
        }
        let validated = self
            .server
            .validate(&create(&next_uid("v"), stored.clone()))
            .await;
        if validated["allowed"] != true {
            if let Some(pods) = self.pods_of(&stored) {
                pods.delete(name, &DeleteParams::default()).await.unwrap();
            }
            return Err(message(&validated));
        }
        Ok(stored)
    }

    /// In-cluster: the pods of `object`'s namespace (`default` for the namespace the
    /// scenarios use most, where `pods` points).
    fn pods_of(&self, object: &Value) -> Option<Api<Pod>> {
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default");
        match (&self.client, namespace) {
            (_, "default") => self.pods.clone(),
            (Some(client), namespace) => Some(Api::namespaced(client.clone(), namespace)),
            (None, _) => None,
        }
    }

    /// The FixedIPPools of `yaml`: in-cluster created through the API server (and waited
    /// for), elsewhere given with `--pools-file` when the server started.
    async fn with_pools(&self, yaml: &str) {
        let Some(client) = &self.client else {
            return;
        };
        let pools: Api<FixedIPPool> = Api::all(client.clone());
        let wanted: Vec<FixedIPPool> = serde_yaml::from_str(yaml).unwrap();
        for pool in &wanted {
            pools.create(&Default::default(), pool).await.unwrap();
        }
        let webhook = &self.server.launched.webhook;
        eventually(
            "the FixedIPPools to be watched",
            Duration::from_secs(10),
            || async { (webhook.pools.load().iter().count() == wanted.len()).then_some(()) },
        )
        .await;
    }

    /// The namespaces the scenario's pods live in (in-cluster the API server wants them).
    async fn with_namespaces(&self, names: &[&str]) {
        let Some(client) = &self.client else {
            return;
        };
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        for name in names {
            let namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
            namespaces
                .create(&Default::default(), &namespace)
                .await
                .unwrap();
        }
    }

    /// A workload CREATE: `/validate`, then (in-cluster) stored, and waited for until the
    /// workload watch has it (in-cluster the watches, not admissions, feed the registry).
    async fn workload(&self, review: &Value) -> Value {
        let answer = self.server.validate(review).await;
        if let (Some(client), true) = (&self.client, answer["allowed"] == true) {
            let object = &review["request"]["object"];
            let namespace = object["metadata"]["namespace"].as_str().unwrap();
            let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
                Api::namespaced(client.clone(), namespace);
            let mut typed: k8s_openapi::api::apps::v1::Deployment =
                serde_json::from_value(object.clone()).unwrap();
            let spec = typed.spec.get_or_insert_with(Default::default);
            let app = object["spec"]["template"]["metadata"]["labels"]["app"].clone();
            spec.selector = serde_json::from_value(json!({"matchLabels": {"app": app}})).unwrap();
            let before = self.server.launched.webhook.workloads.len();
            deployments
                .create(&Default::default(), &typed)
                .await
                .unwrap();
            let webhook = &self.server.launched.webhook;
            eventually(
                "the workload watch to see it",
                Duration::from_secs(10),
                || async { (webhook.workloads.len() > before).then_some(()) },
            )
            .await;
        }
        answer
    }

    /// The UPDATE review of `old` becoming `new`.
    async fn update(&self, old: &Value, new: &Value) -> Value {
        let mut update = review(
            "v1",
            &next_uid("u"),
            "UPDATE",
            Some(new.clone()),
            Some(old.clone()),
            false,
        );
        update["request"]["name"] = old["metadata"]["name"].clone();
        self.server.validate(&update).await
    }

    /// The pod's DELETE review (grace 0; `stored` as the API server stores it), then the pod
    /// is gone.
    async fn delete(&self, stored: &Value) {
        let mut delete = review(
            "v1",
            &next_uid("d"),
            "DELETE",
            None,
            Some(stored.clone()),
            false,
        );
        delete["request"]["name"] = stored["metadata"]["name"].clone();
        delete["request"]["options"] = json!({"gracePeriodSeconds": 0});
        let answer = self.server.mutate(&delete).await;
        assert_eq!(answer["allowed"], true, "{}: {answer}", self.name);
        if let Some(pods) = &self.pods {
            let name = stored["metadata"]["name"].as_str().unwrap();
            pods.delete(name, &DeleteParams::default()).await.unwrap();
        }
    }

    fn holder(&self, ip: &str) -> Option<ip_webhook_ledger::Claim> {
        let ip: IpAddr = ip.parse().unwrap();
        self.server.launched.webhook.allocator.holder(&ip)
    }
}

/// A holds 10.2.0.1: an update that moves it to 10.2.0.2 or strips what names its IP is
/// refused, naming the key; an unrelated update passes; the next pod gets 10.2.0.2; and A's
/// DELETE, with its annotation and label gone from the stored pod, still frees 10.2.0.1.
async fn updates_cannot_move_or_strip_a_claimed_pods_ip(mode: Mode) {
    let list = "10.2.0.1-10.2.0.2";
    let a = mode
        .admit(pod("default", "web", "web-", Some(list)), "web-a")
        .await
        .unwrap();
    assert_eq!(
        a["metadata"]["labels"]["ip-webhook.io/allocated-ip"],
        "10.2.0.1"
    );
    let bound = eventually("A's claim bound", Duration::from_secs(10), || async {
        mode.holder("10.2.0.1")
            .filter(|c| c.phase == Phase::Bound)
            .map(|_| ())
    });
    bound.await;

    let mut moved = a.clone();
    moved["metadata"]["annotations"]["cni.projectcalico.org/ipAddrs"] = json!("[\"10.2.0.2\"]");
    moved["metadata"]["labels"]["ip-webhook.io/allocated-ip"] = json!("10.2.0.2");
    let answer = mode.update(&a, &moved).await;
    assert_eq!(answer["allowed"], false, "{}: {answer}", mode.name);
    assert_eq!(
        message(&answer),
        "pod default/web-a holds an IP claim, so annotation cni.projectcalico.org/ipAddrs cannot be changed (was \"[\\\"10.2.0.1\\\"]\", now \"[\\\"10.2.0.2\\\"]\"): it names the pod's IP to the CNI and to ip-webhook; to give the pod another IP, delete the pod and create it again instead",
        "{}",
        mode.name
    );
    let stripped = {
        let mut p = a.clone();
        let meta = p["metadata"].as_object_mut().unwrap();
        meta["annotations"]
            .as_object_mut()
            .unwrap()
            .remove("cni.projectcalico.org/ipAddrs");
        meta["labels"]
            .as_object_mut()
            .unwrap()
            .remove("ip-webhook.io/allocated-ip");
        p
    };
    let answer = mode.update(&a, &stripped).await;
    assert!(
        message(&answer).contains("annotation cni.projectcalico.org/ipAddrs cannot be removed"),
        "{}: {answer}",
        mode.name
    );
    for (key, label) in [
        ("ip-webhook.io/claim", false),
        ("ip-webhook.io/status", false),
        ("ip-webhook.io/allocated-ip", true),
    ] {
        let mut p = a.clone();
        let map = if label { "labels" } else { "annotations" };
        p["metadata"][map].as_object_mut().unwrap().remove(key);
        let answer = mode.update(&a, &p).await;
        let what = if label { "label" } else { "annotation" };
        assert!(
            message(&answer).contains(&format!("{what} {key} cannot be removed")),
            "{}: {key}: {answer}",
            mode.name
        );
    }
    let mut noipam = a.clone();
    noipam["metadata"]["annotations"]["cni.projectcalico.org/ipAddrsNoIpam"] =
        json!("[\"10.2.0.9\"]");
    assert!(
        message(&mode.update(&a, &noipam).await)
            .contains("annotation cni.projectcalico.org/ipAddrsNoIpam cannot be added"),
        "{}",
        mode.name
    );
    let mut relabelled = a.clone();
    relabelled["metadata"]["labels"]["tier"] = json!("front");
    let answer = mode.update(&a, &relabelled).await;
    assert_eq!(answer["allowed"], true, "{}: {answer}", mode.name);

    let b = mode
        .admit(pod("default", "web", "web-", Some(list)), "web-b")
        .await
        .unwrap();
    assert_eq!(
        b["metadata"]["labels"]["ip-webhook.io/allocated-ip"],
        "10.2.0.2"
    );

    // A as stored after an update that got past an older webhook: no ipAddrs, no label
    mode.delete(&stripped).await;
    eventually("A's IP released", Duration::from_secs(15), || async {
        mode.holder("10.2.0.1").is_none().then_some(())
    })
    .await;
    let c = mode
        .admit(pod("default", "web", "web-", Some(list)), "web-c")
        .await
        .unwrap();
    assert_eq!(
        c["metadata"]["labels"]["ip-webhook.io/allocated-ip"],
        "10.2.0.1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_of_claimed_pods_embedded() {
    updates_cannot_move_or_strip_a_claimed_pods_ip(embedded(&["--release-delay", "0s"]).await)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_of_claimed_pods_in_cluster() {
    updates_cannot_move_or_strip_a_claimed_pods_ip(in_cluster(&["--release-delay", "0s"]).await)
        .await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_of_claimed_pods_etcd() {
    let mode = etcd("updates_of_claimed_pods_etcd", &["--release-delay", "0s"]).await;
    updates_cannot_move_or_strip_a_claimed_pods_ip(mode).await;
}

fn static_pod(name_prefix: &str, app: Option<&str>, annotations: Value) -> Value {
    let mut labels = serde_json::Map::new();
    if let Some(app) = app {
        labels.insert("app".into(), json!(app));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": name_prefix,
            "namespace": "default",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]},
    })
}

/// One IP identity: a v4-mapped IPv6 form of an IP a pod holds is that IP (both CNIs give it
/// as IPv4), whatever the ledger; the IP recorded and labelled is the IPv4 address.
async fn v4_mapped_forms_are_the_ipv4_address(mode: Mode) {
    let held = mode
        .admit(
            static_pod(
                "calico-",
                Some("a"),
                json!({"cni.projectcalico.org/ipAddrs": "[\"::ffff:10.9.0.5\"]"}),
            ),
            "calico-1",
        )
        .await
        .unwrap();
    assert_eq!(
        held["metadata"]["labels"]["ip-webhook.io/allocated-ip"], "10.9.0.5",
        "{}",
        mode.name
    );
    assert!(mode.holder("10.9.0.5").is_some(), "{}", mode.name);
    assert!(mode.holder("::ffff:10.9.0.5").is_none(), "{}", mode.name);
    let second = mode
        .admit(
            static_pod(
                "plain-",
                Some("b"),
                json!({"cni.projectcalico.org/ipAddrs": "[\"10.9.0.5\"]"}),
            ),
            "plain-1",
        )
        .await
        .unwrap_err();
    assert!(
        second.starts_with(
            "static IP 10.9.0.5 requested by default/plain-* is already held by default/calico-"
        ),
        "{}: {second}",
        mode.name
    );
    let ovn = mode
        .admit(
            static_pod(
                "ovn-",
                Some("c"),
                json!({"ovn.kubernetes.io/ip_address": "::ffff:192.0.2.1"}),
            ),
            "ovn-1",
        )
        .await
        .unwrap();
    assert_eq!(
        ovn["metadata"]["labels"]["ip-webhook.io/allocated-ip"],
        "192.0.2.1"
    );
    let again = mode
        .admit(
            static_pod(
                "ovn2-",
                Some("d"),
                json!({"ovn.kubernetes.io/ip_address": "192.0.2.1"}),
            ),
            "ovn2-1",
        )
        .await
        .unwrap_err();
    assert!(
        again.contains("192.0.2.1") && again.contains("already held"),
        "{}: {again}",
        mode.name
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v4_mapped_forms_embedded() {
    v4_mapped_forms_are_the_ipv4_address(embedded(&[]).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v4_mapped_forms_in_cluster() {
    v4_mapped_forms_are_the_ipv4_address(in_cluster(&[]).await).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v4_mapped_forms_etcd() {
    v4_mapped_forms_are_the_ipv4_address(etcd("v4_mapped_forms_etcd", &[]).await).await;
}

/// Spaces are refused with the exact value, empty values are no value, and
/// `ipAddrsNoIpam` is checked and recorded like `ipAddrs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cni_values_are_read_as_the_cnis_read_them() {
    let mode = embedded(&[]).await;
    for (key, value, shown) in [
        (
            "cni.projectcalico.org/ipAddrs",
            "[\" 10.9.1.7\"]",
            "\"[\\\" 10.9.1.7\\\"]\" has spaces around 10.9.1.7",
        ),
        (
            "ovn.kubernetes.io/ip_address",
            "10.9.1.1, fd00::1",
            "\"10.9.1.1, fd00::1\" has spaces around fd00::1",
        ),
    ] {
        let object = static_pod("sp-", Some("sp"), json!({ key: value }));
        let refused = mode.admit(object.clone(), "sp-1").await.unwrap_err();
        assert_eq!(
            refused,
            format!(
                "pod default/sp-*: annotation {key}: {shown}: the CNI reads each IP exactly as written (Go's net.ParseIP, no trimming), so the pod's network could never be set up; write the IP without spaces"
            )
        );
        // /validate refuses it as well (a pod that skipped /mutate)
        let mut named = object;
        named["metadata"]["name"] = json!("sp-2");
        named["metadata"]["uid"] = json!("uid-sp-2");
        let answer = mode.server.validate(&create("v-sp", named)).await;
        assert!(message(&answer).contains(shown), "{answer}");
    }
    // empty values: treated as absent, so a list pod is allocated and a bare pod ignored
    for key in [
        "cni.projectcalico.org/ipAddrs",
        "cni.projectcalico.org/ipAddrsNoIpam",
        "ovn.kubernetes.io/ip_address",
    ] {
        let mut object = pod("default", "empty", "empty-", Some("10.9.2.1-10.9.2.9"));
        object["metadata"]["annotations"][key] = json!("");
        let admitted = mode
            .admit(object, &format!("empty-{}", key.len()))
            .await
            .unwrap();
        assert!(
            admitted["metadata"]["labels"]["ip-webhook.io/allocated-ip"]
                .as_str()
                .unwrap()
                .starts_with("10.9.2."),
            "{key}: {admitted}"
        );
        let bare = static_pod("bare-", None, json!({ key: "" }));
        let answer = mode.server.mutate(&create(&next_uid("m"), bare)).await;
        assert_eq!(answer["allowed"], true, "{key}: {answer}");
        assert!(answer.get("patch").is_none(), "{key}: {answer}");
    }
    // ipAddrsNoIpam: a held IP is refused, a free one recorded
    mode.admit(
        static_pod(
            "h-",
            Some("h"),
            json!({"cni.projectcalico.org/ipAddrs": "[\"10.9.3.1\"]"}),
        ),
        "h-1",
    )
    .await
    .unwrap();
    let refused = mode
        .admit(
            static_pod(
                "n-",
                Some("n"),
                json!({"cni.projectcalico.org/ipAddrsNoIpam": "[\"10.9.3.1\"]"}),
            ),
            "n-1",
        )
        .await
        .unwrap_err();
    assert!(
        refused.starts_with(
            "static IP 10.9.3.1 requested by default/n-* is already held by default/h-1"
        ),
        "{refused}"
    );
    let recorded = mode
        .admit(
            static_pod(
                "n-",
                Some("n"),
                json!({"cni.projectcalico.org/ipAddrsNoIpam": "[\"10.9.3.2\"]"}),
            ),
            "n-2",
        )
        .await
        .unwrap();
    assert_eq!(
        recorded["metadata"]["labels"]["ip-webhook.io/allocated-ip"],
        "10.9.3.2"
    );
    assert!(
        recorded["metadata"]["annotations"]
            .get("cni.projectcalico.org/ipAddrs")
            .is_none(),
        "a NoIpam pod gets no ipAddrs (Calico refuses both): {recorded}"
    );
    assert_eq!(mode.holder("10.9.3.2").unwrap().pod.name, "n-2");
    let both = mode
        .admit(
            static_pod(
                "b-",
                Some("b"),
                json!({
                    "cni.projectcalico.org/ipAddrs": "[\"10.9.3.3\"]",
                    "cni.projectcalico.org/ipAddrsNoIpam": "[\"10.9.3.4\"]",
                }),
            ),
            "b-1",
        )
        .await
        .unwrap_err();
    assert!(
        both.contains("are both set; Calico refuses a pod with both"),
        "{both}"
    );
}

fn deployment(namespace: &str, name: &str, app: &str, annotations: Value) -> Value {
    let object = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"template": {
            "metadata": {"labels": {"app": app}, "annotations": annotations},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }},
    });
    common::object_review(
        &next_uid("w"),
        ("apps", "v1", "Deployment"),
        "CREATE",
        Some(object),
        None,
    )
}

fn in_namespace(mut object: Value, namespace: &str) -> Value {
    object["metadata"]["namespace"] = json!(namespace);
    object
}

/// Static IPs keep to pool and app policy: blue serves only `prod`, so `dev` pods naming its
/// IPs are refused (app label or not) and a `prod` pod's static IP counts in blue's usage;
/// IPs `prod/web` lists are refused to a bare `dev` pod, listed or named, and `prod/web`
/// still gets them.
async fn static_ips_keep_to_pool_and_app_policy(mode: Mode) {
    mode.with_namespaces(&["dev", "prod"]).await;
    mode.with_pools(POOLS).await;
    for (i, app) in [Some("db"), None, Some("db"), None].into_iter().enumerate() {
        let object = in_namespace(
            static_pod(
                "dev-",
                app,
                json!({"cni.projectcalico.org/ipAddrs": format!("[\"10.20.0.{}\"]", i + 1)}),
            ),
            "dev",
        );
        let refused = mode.admit(object, &format!("dev-{i}")).await.unwrap_err();
        assert_eq!(
            refused,
            format!(
                "pod dev/dev-*: static IP 10.20.0.{} is in FixedIPPool blue, which this pod may not use: FixedIPPool blue serves namespaces [prod], not dev",
                i + 1
            )
        );
    }
    let ok = mode
        .admit(
            in_namespace(
                static_pod(
                    "p-",
                    Some("p"),
                    json!({"cni.projectcalico.org/ipAddrs": "[\"10.20.0.9\"]"}),
                ),
                "prod",
            ),
            "p-1",
        )
        .await
        .unwrap();
    assert_eq!(
        ok["metadata"]["labels"]["ip-webhook.io/allocated-ip"],
        "10.20.0.9"
    );
    let webhook = &mode.server.launched.webhook;
    let report = ip_webhook_ipam::usage::Report::build(
        &webhook.allocator.claims(),
        &webhook.pools.load(),
        false,
    );
    let blue = report.pools.iter().find(|p| p.name == "blue").unwrap();
    assert_eq!((blue.held, blue.free), (1, Some(253)), "{blue:?}");

    let web = mode
        .workload(&deployment(
            "prod",
            "web",
            "web",
            json!({"ip-webhook.io/allocatable-ips": "10.50.0.1-10.50.0.4"}),
        ))
        .await;
    assert_eq!(web["allowed"], true, "{web}");
    let listed = mode
        .admit(
            in_namespace(
                static_pod(
                    "x-",
                    None,
                    json!({"ip-webhook.io/allocatable-ips": "10.50.0.1-10.50.0.2"}),
                ),
                "dev",
            ),
            "x-1",
        )
        .await
        .unwrap_err();
    assert_eq!(
        listed,
        "pod dev/x-*: annotation ip-webhook.io/allocatable-ips lists 10.50.0.1-10.50.0.2, which Deployment prod/web (app prod/web) lists; only that app's pods may have them"
    );
    let named = mode
        .admit(
            in_namespace(
                static_pod(
                    "x-",
                    None,
                    json!({"cni.projectcalico.org/ipAddrs": "[\"10.50.0.3\"]"}),
                ),
                "dev",
            ),
            "x-2",
        )
        .await
        .unwrap_err();
    assert_eq!(
        named,
        "pod dev/x-*: static IP 10.50.0.3 is listed by Deployment prod/web (app prod/web); only that app's pods may have it"
    );
    for name in ["web-1", "web-2"] {
        mode.admit(
            pod("prod", "web", "web-", Some("10.50.0.1-10.50.0.4")),
            name,
        )
        .await
        .unwrap();
    }
    assert_eq!(
        webhook.allocator.held_by_app("prod", "web"),
        2,
        "{}",
        mode.name
    );
}

/// `--pools-file` for the modes with no API server to hold FixedIPPools.
fn pools_file() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pools.yaml");
    std::fs::write(&file, POOLS).unwrap();
    let path = file.display().to_string();
    (dir, path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_ip_policy_embedded() {
    let (_dir, file) = pools_file();
    static_ips_keep_to_pool_and_app_policy(embedded(&["--pools-file", &file]).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_ip_policy_in_cluster() {
    static_ips_keep_to_pool_and_app_policy(in_cluster(&[]).await).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_ip_policy_etcd() {
    let (_dir, file) = pools_file();
    let mode = etcd("static_ip_policy_etcd", &["--pools-file", &file]).await;
    static_ips_keep_to_pool_and_app_policy(mode).await;
}

/// Kube-OVN `ip_pool` lists are their app's IPs: a Deployment listing them makes another
/// app's pod naming one refused, and a pod whose `ip_pool` names an IP another app holds is
/// refused.
async fn kube_ovn_ip_pool_lists_count_as_their_apps_ips(mode: Mode) {
    mode.with_namespaces(&["dev", "prod"]).await;
    let web = mode
        .workload(&deployment(
            "prod",
            "web",
            "web",
            json!({"ovn.kubernetes.io/ip_pool": "10.16.0.10,10.16.0.11"}),
        ))
        .await;
    assert_eq!(web["allowed"], true, "{web}");
    let named = mode
        .admit(
            in_namespace(
                static_pod(
                    "o-",
                    Some("other"),
                    json!({"ovn.kubernetes.io/ip_address": "10.16.0.11"}),
                ),
                "dev",
            ),
            "o-1",
        )
        .await
        .unwrap_err();
    assert_eq!(
        named,
        "pod dev/o-*: static IP 10.16.0.11 is listed by Deployment prod/web (app prod/web); only that app's pods may have it"
    );
    let db = mode
        .workload(&deployment(
            "dev",
            "db",
            "db",
            json!({"ovn.kubernetes.io/ip_pool": "10.16.0.11;10.16.0.12"}),
        ))
        .await;
    assert_eq!(
        message(&db),
        "Deployment dev/db: spec.template.metadata.annotations[ovn.kubernetes.io/ip_pool] lists 10.16.0.11, which Deployment prod/web (app prod/web) already lists"
    );
    mode.admit(
        in_namespace(
            static_pod(
                "h-",
                Some("holder"),
                json!({"ovn.kubernetes.io/ip_address": "10.16.0.20"}),
            ),
            "dev",
        ),
        "h-1",
    )
    .await
    .unwrap();
    let mut pooled = in_namespace(
        static_pod(
            "q-",
            Some("q"),
            json!({"ovn.kubernetes.io/ip_pool": "10.16.0.20, 10.16.0.21"}),
        ),
        "dev",
    );
    pooled["metadata"]["name"] = json!("q-1");
    pooled["metadata"]["uid"] = json!("uid-q-1");
    let answer = mode.server.validate(&create("v-q", pooled)).await;
    assert_eq!(
        message(&answer),
        "pod dev/q-1: annotation ovn.kubernetes.io/ip_pool lists 10.16.0.20, which pod dev/h-1 of app dev/holder holds",
        "{}",
        mode.name
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_ovn_ip_pool_embedded() {
    kube_ovn_ip_pool_lists_count_as_their_apps_ips(embedded(&["--cni", "kube-ovn"]).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_ovn_ip_pool_in_cluster() {
    kube_ovn_ip_pool_lists_count_as_their_apps_ips(in_cluster(&["--cni", "kube-ovn"]).await).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_ovn_ip_pool_etcd() {
    let mode = etcd("kube_ovn_ip_pool_etcd", &["--cni", "kube-ovn"]).await;
    kube_ovn_ip_pool_lists_count_as_their_apps_ips(mode).await;
}

/// A pod that skipped `/mutate` (a webhook outage with `Ignore`) and names its own IP carries
/// none of ip-webhook's marks: `/validate` records its IP, and from then on the IP it names
/// is as fixed as any claim-holding pod's, found by its UID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_pod_recorded_at_validate_keeps_its_ip_too() {
    let mode = embedded(&[]).await;
    let mut object = static_pod(
        "s-",
        Some("s"),
        json!({"ovn.kubernetes.io/ip_address": "10.9.4.1"}),
    );
    object["metadata"]["name"] = json!("s-1");
    object["metadata"]["uid"] = json!("uid-s-1");
    let answer = mode.server.validate(&create("v-s-1", object.clone())).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    assert_eq!(
        mode.holder("10.9.4.1").unwrap().pod.uid.as_deref(),
        Some("uid-s-1")
    );
    let mut moved = object.clone();
    moved["metadata"]["annotations"]["ovn.kubernetes.io/ip_address"] = json!("10.9.4.2");
    assert_eq!(
        message(&mode.update(&object, &moved).await),
        "pod default/s-1 holds an IP claim, so annotation ovn.kubernetes.io/ip_address cannot be changed (was \"10.9.4.1\", now \"10.9.4.2\"): it names the pod's IP to the CNI and to ip-webhook; to give the pod another IP, delete the pod and create it again instead"
    );
    // Kube-OVN writing the same IP back, in its own spelling, passes
    let mut same = object.clone();
    same["metadata"]["annotations"]["ovn.kubernetes.io/ip_address"] = json!("::ffff:10.9.4.1");
    assert_eq!(mode.update(&object, &same).await["allowed"], true);
}
