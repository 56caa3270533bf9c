//! A fast stand-in API server for `scripts/bench-scale.sh`: a cluster of N realistic pods
//! (4–7 KB each, with `status.podIPs`, `spec.nodeName`, a ReplicaSet owner), N/30 nodes, their
//! Deployments and ReplicaSets (nine old revisions each), fixed-IP apps (by default 100 apps
//! of 3 or 4 pods, 350 pods; `FIXED_APPS=A FIXED_PER_APP=P` in the environment: A apps of P
//! pods), each pod with one bound IPClaim, and Calico's `IPAMBlock`s of every pod's IP (a /26 each, as Calico's
//! default block size; the attributes as Calico's CNI plugin writes them), served over plain
//! HTTP on loopback. Pod lists and watches honour the one label selector the replica sends
//! (`ip-webhook.io/allocated-ip`: the pod carries that label).
//!
//!   cargo build --release --example scale_apiserver
//!   target/release/examples/scale_apiserver PORT PODS
//!   FIXED_APPS=2000 FIXED_PER_APP=10 target/release/examples/scale_apiserver PORT PODS
//!
//! The big kinds (pods, nodes, deployments, replicasets) are generated from their index on
//! each request, so the server holds none of them; every other resource lives in a small
//! generic store (create, get, replace, merge patch, delete, list, watch). Lists honour
//! `limit`/`continue` (a continue token is an offset) except with `resourceVersion=0`, which,
//! as kube-apiserver's watch cache does, answers whole. `Accept: ...;as=PartialObjectMetadataList`
//! gets metadata only. Watches stream the events of the store and of the churn below.
//!
//! Control endpoints (not Kubernetes):
//! - `GET /bench/stats`: `{"bytes": B, "bytes_by": {"pods list": b, "nodes watch (meta)": b,
//!   ...}, "requests": {"GET /api/v1/pods": n, ...}}`, the bytes of every response body sent
//!   since start or the last `/bench/reset`, in all and per resource and kind of response;
//! - `POST /bench/reset`;
//! - `POST /bench/churn?n=1000`: n plain pods (no fixed IP) each ADDED running, MODIFIED
//!   Terminating and DELETED on the pod watches, 100 pods per 10 ms, and its block MODIFIED
//!   when its IP is allocated (a full block) and released;
//! - `POST /bench/admit?n=50&interval_ms=560&from=0`: n fixed-IP admissions as the cluster
//!   sees them: the IPClaim created Reserved, the pod ADDED with its IP (and its block
//!   MODIFIED), the claim bound to it, one every `interval_ms`; the k-th of all (from `from`)
//!   has its own pod and IP. Answers when all are sent.
//!
//! This is a benchmark tool: no authentication, no validation beyond what the webhook needs.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::sync::broadcast;

const NAMESPACES: usize = 50;
const PODS_PER_DEPLOYMENT: usize = 30;
const OLD_REVISIONS: usize = 9;
const CREATED: &str = "2026-01-01T00:00:00Z";

/// One watch event: its resource (`group/version/plural`), namespace, and the line to send,
/// whole and as metadata only.
struct Event {
    resource: String,
    namespace: String,
    /// The object carries the label `ip-webhook.io/allocated-ip`.
    labelled: bool,
    full: Bytes,
    meta: Bytes,
}

const OUR_LABEL: &str = "ip-webhook.io/allocated-ip";

struct Server {
    pods: usize,
    rv: AtomicU64,
    bytes: AtomicU64,
    /// bytes sent per resource and kind of response (`pods list`, `nodes watch (meta)`)
    bytes_by: Mutex<BTreeMap<String, u64>>,
    requests: Mutex<BTreeMap<String, u64>>,
    /// resource → "namespace/name" → object
    store: Mutex<BTreeMap<String, BTreeMap<String, Value>>>,
    events: broadcast::Sender<Arc<Event>>,
}

type Body = BoxBody<Bytes, Infallible>;

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// The parts of a resource path.
struct Target {
    resource: String,
    plural: String,
    namespace: Option<String>,
    name: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, plural, name) = match rest {
        ["namespaces", ns, plural, tail @ ..] => (Some(ns.to_string()), *plural, tail.first()),
        [plural, tail @ ..] => (None, *plural, tail.first()),
        [] => return None,
    };
    Some(Target {
        resource: format!("{group}/{version}/{plural}"),
        plural: plural.to_string(),
        namespace,
        name: name.map(|n| n.to_string()),
    })
}

fn query(uri: &http::Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (!k.is_empty()).then(|| (k.to_string(), v.replace("%2F", "/")))
        })
        .collect()
}

// --- the generated cluster ---------------------------------------------------------------

fn hash10(seed: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut x = (seed as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    (0..10)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ALPHABET[(x >> 33) as usize % ALPHABET.len()] as char
        })
        .collect()
}

fn uid(kind: u32, i: usize) -> String {
    format!("{kind:08x}-0000-4000-8000-{i:012x}")
}

/// Pod `i`: the first 350 belong to the fixed-IP apps (`fixed-A`, 3 or 4 pods each).
struct PodShape {
    namespace: String,
    deployment: String,
    rs_hash: String,
    name: String,
    uid: String,
    ip: String,
    node: String,
    fixed_app: Option<usize>,
}

/// How the fixed-IP pods are laid out: `apps` apps of `per_app` pods each, or of 3 and 4 pods
/// in turn. Fixed pod `g` (of all apps, app by app) has IP 10.200.0.0 + g + 1, so an app's IPs
/// are one range and 64 fixed pods fill a /26.
struct FixedLayout {
    apps: usize,
    per_app: Option<usize>,
}

fn layout() -> &'static FixedLayout {
    static LAYOUT: std::sync::OnceLock<FixedLayout> = std::sync::OnceLock::new();
    LAYOUT.get_or_init(|| {
        let number = |name: &str| {
            std::env::var(name).ok().map(|v| {
                v.parse::<usize>()
                    .unwrap_or_else(|_| panic!("{name}={v:?}: not a number"))
            })
        };
        let layout = FixedLayout {
            apps: number("FIXED_APPS").unwrap_or(100).max(1),
            per_app: number("FIXED_PER_APP").map(|p| p.max(1)),
        };
        assert!(
            layout.app_start(layout.apps) < 65_000,
            "fixed pods must fit in 10.200.0.0/16"
        );
        layout
    })
}

impl FixedLayout {
    fn app_size(&self, a: usize) -> usize {
        self.per_app.unwrap_or(3 + a % 2)
    }

    /// The index of app `a`'s first pod among the fixed pods.
    fn app_start(&self, a: usize) -> usize {
        self.per_app.map_or(a * 3 + a / 2, |p| a * p)
    }
}

fn fixed_apps() -> usize {
    layout().apps
}

fn fixed_pods() -> usize {
    layout().app_start(layout().apps)
}

/// Fixed pod `i`'s app and its ordinal in the app.
fn fixed_of(i: usize) -> Option<(usize, usize)> {
    if i >= fixed_pods() {
        return None;
    }
    Some(match layout().per_app {
        Some(p) => (i / p, i % p),
        // two apps (3 pods, then 4) every 7 pods
        None if i % 7 < 3 => (i / 7 * 2, i % 7),
        None => (i / 7 * 2 + 1, i % 7 - 3),
    })
}

fn deployments(pods: usize) -> usize {
    pods.saturating_sub(fixed_pods())
        .div_ceil(PODS_PER_DEPLOYMENT)
}

fn nodes(pods: usize) -> usize {
    (pods / 30).max(1)
}

/// The IP of fixed pod `g` (of all apps).
fn fixed_ip(g: usize) -> String {
    let [a, b, c, d] = fixed_octets(g);
    format!("{a}.{b}.{c}.{d}")
}

fn fixed_octets(g: usize) -> [u8; 4] {
    let n = g + 1;
    [10, 200, (n >> 8) as u8, (n & 255) as u8]
}

/// App `a`'s allocatable IPs, as one range.
fn fixed_range(a: usize) -> String {
    let first = layout().app_start(a);
    format!(
        "{}-{}",
        fixed_ip(first),
        fixed_ip(first + layout().app_size(a) - 1)
    )
}

/// The IP of plain pod `i`: consecutive pods on consecutive IPs, so 64 pods fill a /26.
fn plain_ip(i: usize) -> [u8; 4] {
    [
        10,
        (64 + (i >> 16) % 64) as u8,
        ((i >> 8) & 255) as u8,
        (i & 255) as u8,
    ]
}

fn pod_shape(pods: usize, i: usize) -> PodShape {
    let (namespace, deployment, fixed_app, ip) = match fixed_of(i) {
        Some((a, r)) => (
            format!("ns-{}", a % NAMESPACES),
            format!("fixed-{a}"),
            Some(a),
            fixed_ip(layout().app_start(a) + r),
        ),
        None => {
            let d = (i - fixed_pods()) / PODS_PER_DEPLOYMENT;
            (
                format!("ns-{}", d % NAMESPACES),
                format!("app-{d}"),
                None,
                {
                    let [a, b, c, d] = plain_ip(i);
                    format!("{a}.{b}.{c}.{d}")
                },
            )
        }
    };
    let rs_hash = hash10(
        deployment.len() * 7919
            + deployment.bytes().map(usize::from).sum::<usize>() * 31
            + i / PODS_PER_DEPLOYMENT,
    );
    let name = format!("{deployment}-{rs_hash}-{}", &hash10(i)[..5]);
    PodShape {
        namespace,
        deployment,
        rs_hash,
        name,
        uid: uid(1, i),
        ip,
        node: format!("node-{}", i % nodes(pods)),
        fixed_app,
    }
}

fn fixed_annotations(shape: &PodShape) -> String {
    match shape.fixed_app {
        Some(a) => format!(
            r#""ip-webhook.io/status":"mutated","ip-webhook.io/claim":"{:032x}","cni.projectcalico.org/ipAddrs":"[\"{}\"]","ip-webhook.io/allocatable-ips":"{}","#,
            0xC1A1_0000_0000usize + a * 16 + shape.ip.len(),
            shape.ip,
            fixed_range(a)
        ),
        None => String::new(),
    }
}

fn pod_metadata(shape: &PodShape, rv: u64, deleting: bool) -> String {
    let fixed_label = match shape.fixed_app {
        Some(_) => format!(r#","ip-webhook.io/allocated-ip":"{}""#, shape.ip),
        None => String::new(),
    };
    let deletion = if deleting {
        format!(r#""deletionTimestamp":"{CREATED}","deletionGracePeriodSeconds":30,"#)
    } else {
        String::new()
    };
    format!(
        r#"{{"name":"{name}","generateName":"{dep}-{hash}-","namespace":"{ns}","uid":"{uid}","resourceVersion":"{rv}","creationTimestamp":"{CREATED}",{deletion}"labels":{{"app":"{dep}","pod-template-hash":"{hash}","team":"platform","tier":"backend"{fixed_label}}},"annotations":{{{fixed}"kubectl.kubernetes.io/restartedAt":"{CREATED}","prometheus.io/scrape":"true","prometheus.io/port":"9090"}},"ownerReferences":[{{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"{dep}-{hash}","uid":"{rsuid}","controller":true,"blockOwnerDeletion":true}}],"managedFields":[{{"manager":"kube-controller-manager","operation":"Update","apiVersion":"v1","time":"{CREATED}","fieldsType":"FieldsV1","fieldsV1":{{"f:metadata":{{"f:generateName":{{}},"f:labels":{{".":{{}},"f:app":{{}},"f:pod-template-hash":{{}},"f:team":{{}},"f:tier":{{}}}},"f:ownerReferences":{{".":{{}},"k:{{\"uid\":\"{rsuid}\"}}":{{}}}}}},"f:spec":{{"f:containers":{{"k:{{\"name\":\"main\"}}":{{".":{{}},"f:env":{{}},"f:image":{{}},"f:imagePullPolicy":{{}},"f:name":{{}},"f:ports":{{}},"f:resources":{{}},"f:volumeMounts":{{}}}}}},"f:dnsPolicy":{{}},"f:enableServiceLinks":{{}},"f:restartPolicy":{{}},"f:schedulerName":{{}},"f:securityContext":{{}},"f:terminationGracePeriodSeconds":{{}},"f:volumes":{{}}}}}}}},{{"manager":"kubelet","operation":"Update","apiVersion":"v1","time":"{CREATED}","fieldsType":"FieldsV1","fieldsV1":{{"f:status":{{"f:conditions":{{}},"f:containerStatuses":{{}},"f:hostIP":{{}},"f:hostIPs":{{}},"f:phase":{{}},"f:podIP":{{}},"f:podIPs":{{".":{{}},"k:{{\"ip\":\"{ip}\"}}":{{".":{{}},"f:ip":{{}}}}}},"f:startTime":{{}}}}}},"subresource":"status"}}]}}"#,
        name = shape.name,
        dep = shape.deployment,
        hash = shape.rs_hash,
        ns = shape.namespace,
        uid = shape.uid,
        rsuid = uid(2, shape.rs_hash.len() + shape.deployment.len()),
        fixed = fixed_annotations(shape),
        ip = shape.ip,
    )
}

fn pod_json(shape: &PodShape, rv: u64, deleting: bool, meta_only: bool) -> String {
    let metadata = pod_metadata(shape, rv, deleting);
    if meta_only {
        return format!(
            r#"{{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{metadata}}}"#
        );
    }
    let mut env = String::new();
    for k in 0..12 {
        let _ = write!(
            env,
            r#"{{"name":"SETTING_{k}","value":"value-of-setting-number-{k}-for-{}"}},"#,
            shape.deployment
        );
    }
    env.push_str(r#"{"name":"POD_NAME","valueFrom":{"fieldRef":{"apiVersion":"v1","fieldPath":"metadata.name"}}}"#);
    format!(
        r#"{{"kind":"Pod","apiVersion":"v1","metadata":{metadata},"spec":{{"volumes":[{{"name":"config","configMap":{{"name":"{dep}-config","defaultMode":420}}}},{{"name":"kube-api-access","projected":{{"sources":[{{"serviceAccountToken":{{"expirationSeconds":3607,"path":"token"}}}},{{"configMap":{{"name":"kube-root-ca.crt","items":[{{"key":"ca.crt","path":"ca.crt"}}]}}}},{{"downwardAPI":{{"items":[{{"path":"namespace","fieldRef":{{"apiVersion":"v1","fieldPath":"metadata.namespace"}}}}]}}}}],"defaultMode":420}}}}],"containers":[{{"name":"main","image":"registry.example.com/platform/{dep}:v1.42.7","ports":[{{"name":"http","containerPort":8080,"protocol":"TCP"}},{{"name":"metrics","containerPort":9090,"protocol":"TCP"}}],"env":[{env}],"resources":{{"limits":{{"cpu":"1","memory":"512Mi"}},"requests":{{"cpu":"100m","memory":"128Mi"}}}},"volumeMounts":[{{"name":"config","mountPath":"/etc/config"}},{{"name":"kube-api-access","readOnly":true,"mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}}],"livenessProbe":{{"httpGet":{{"path":"/healthz","port":8080,"scheme":"HTTP"}},"timeoutSeconds":1,"periodSeconds":10,"successThreshold":1,"failureThreshold":3}},"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File","imagePullPolicy":"IfNotPresent"}}],"restartPolicy":"Always","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","serviceAccountName":"default","serviceAccount":"default","nodeName":"{node}","securityContext":{{}},"schedulerName":"default-scheduler","tolerations":[{{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}},{{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}}],"priority":0,"enableServiceLinks":true,"preemptionPolicy":"PreemptLowerPriority"}},"status":{{"phase":"Running","conditions":[{{"type":"PodReadyToStartContainers","status":"True","lastProbeTime":null,"lastTransitionTime":"{CREATED}"}},{{"type":"Initialized","status":"True","lastProbeTime":null,"lastTransitionTime":"{CREATED}"}},{{"type":"Ready","status":"True","lastProbeTime":null,"lastTransitionTime":"{CREATED}"}},{{"type":"ContainersReady","status":"True","lastProbeTime":null,"lastTransitionTime":"{CREATED}"}},{{"type":"PodScheduled","status":"True","lastProbeTime":null,"lastTransitionTime":"{CREATED}"}}],"hostIP":"192.168.{h1}.{h2}","hostIPs":[{{"ip":"192.168.{h1}.{h2}"}}],"podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}],"startTime":"{CREATED}","containerStatuses":[{{"name":"main","state":{{"running":{{"startedAt":"{CREATED}"}}}},"lastState":{{}},"ready":true,"restartCount":0,"image":"registry.example.com/platform/{dep}:v1.42.7","imageID":"registry.example.com/platform/{dep}@sha256:{sha}{sha}","containerID":"containerd://{sha}{sha}","started":true}}],"qosClass":"Burstable"}}}}"#,
        dep = shape.deployment,
        node = shape.node,
        ip = shape.ip,
        h1 = shape.node.len() % 250,
        h2 = shape.uid.len() % 250,
        sha = &format!("{:0>32}", shape.uid.replace('-', ""))[..32],
    )
}

fn node_json(i: usize, meta_only: bool) -> String {
    let metadata = format!(
        r#"{{"name":"node-{i}","uid":"{uid}","resourceVersion":"7","creationTimestamp":"{CREATED}","labels":{{"kubernetes.io/hostname":"node-{i}","kubernetes.io/os":"linux","kubernetes.io/arch":"amd64","node.kubernetes.io/instance-type":"m5.2xlarge","topology.kubernetes.io/zone":"zone-{z}"}},"annotations":{{"node.alpha.kubernetes.io/ttl":"0","volumes.kubernetes.io/controller-managed-attach-detach":"true"}}}}"#,
        uid = uid(3, i),
        z = i % 3
    );
    if meta_only {
        return format!(
            r#"{{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{metadata}}}"#
        );
    }
    let mut images = String::new();
    for k in 0..25 {
        let _ = write!(
            images,
            r#"{}{{"names":["registry.example.com/platform/image-{k}@sha256:{k:064x}","registry.example.com/platform/image-{k}:v{k}"],"sizeBytes":{}}}"#,
            if k == 0 { "" } else { "," },
            10_000_000 + k * 1000
        );
    }
    format!(
        r#"{{"kind":"Node","apiVersion":"v1","metadata":{metadata},"spec":{{"podCIDR":"10.{a}.{b}.0/24","providerID":"aws:///zone/i-{i:017x}"}},"status":{{"capacity":{{"cpu":"8","memory":"32Gi","pods":"110"}},"allocatable":{{"cpu":"7910m","memory":"31Gi","pods":"110"}},"conditions":[{{"type":"MemoryPressure","status":"False","lastHeartbeatTime":"{CREATED}","lastTransitionTime":"{CREATED}","reason":"KubeletHasSufficientMemory","message":"kubelet has sufficient memory available"}},{{"type":"DiskPressure","status":"False","lastHeartbeatTime":"{CREATED}","lastTransitionTime":"{CREATED}","reason":"KubeletHasNoDiskPressure","message":"kubelet has no disk pressure"}},{{"type":"PIDPressure","status":"False","lastHeartbeatTime":"{CREATED}","lastTransitionTime":"{CREATED}","reason":"KubeletHasSufficientPID","message":"kubelet has sufficient PID available"}},{{"type":"Ready","status":"True","lastHeartbeatTime":"{CREATED}","lastTransitionTime":"{CREATED}","reason":"KubeletReady","message":"kubelet is posting ready status"}}],"addresses":[{{"type":"InternalIP","address":"192.168.{a}.{b}"}},{{"type":"Hostname","address":"node-{i}"}}],"nodeInfo":{{"machineID":"{i:032x}","systemUUID":"{i:032x}","bootID":"{i:032x}","kernelVersion":"6.1.0","osImage":"Linux","containerRuntimeVersion":"containerd://1.7.0","kubeletVersion":"v1.33.0","kubeProxyVersion":"v1.33.0","operatingSystem":"linux","architecture":"amd64"}},"images":[{images}]}}}}"#,
        a = i / 250,
        b = i % 250
    )
}

/// Deployment `d` (the fixed-IP apps first: `fixed-A` lists its IPs in its template).
fn deployment_shape(d: usize) -> (String, String, Option<usize>, usize) {
    if d < fixed_apps() {
        (
            format!("ns-{}", d % NAMESPACES),
            format!("fixed-{d}"),
            Some(d),
            layout().app_size(d),
        )
    } else {
        let p = d - fixed_apps();
        (
            format!("ns-{}", p % NAMESPACES),
            format!("app-{p}"),
            None,
            PODS_PER_DEPLOYMENT,
        )
    }
}

fn template(name: &str, fixed: Option<usize>) -> String {
    let annotations = match fixed {
        Some(a) => format!(
            r#","annotations":{{"ip-webhook.io/allocatable-ips":"{}"}}"#,
            fixed_range(a)
        ),
        None => String::new(),
    };
    format!(
        r#"{{"metadata":{{"labels":{{"app":"{name}","team":"platform","tier":"backend"}}{annotations}}},"spec":{{"containers":[{{"name":"main","image":"registry.example.com/platform/{name}:v1.42.7","ports":[{{"name":"http","containerPort":8080,"protocol":"TCP"}}],"resources":{{"limits":{{"cpu":"1","memory":"512Mi"}},"requests":{{"cpu":"100m","memory":"128Mi"}}}},"livenessProbe":{{"httpGet":{{"path":"/healthz","port":8080}},"periodSeconds":10}},"imagePullPolicy":"IfNotPresent"}}],"restartPolicy":"Always","terminationGracePeriodSeconds":30}}}}"#
    )
}

fn workload_json(kind: &str, i: usize, meta_only: bool) -> String {
    let (d, revision) = if kind == "ReplicaSet" {
        (i / (OLD_REVISIONS + 1), i % (OLD_REVISIONS + 1))
    } else {
        (i, 0)
    };
    let (namespace, name, fixed, replicas) = deployment_shape(d);
    let own_name = if kind == "ReplicaSet" {
        format!("{name}-{}", hash10(d * 131 + revision))
    } else {
        name.clone()
    };
    let owner = if kind == "ReplicaSet" {
        format!(
            r#","ownerReferences":[{{"apiVersion":"apps/v1","kind":"Deployment","name":"{name}","uid":"{}","controller":true,"blockOwnerDeletion":true}}]"#,
            uid(4, d)
        )
    } else {
        String::new()
    };
    let metadata = format!(
        r#"{{"name":"{own_name}","namespace":"{namespace}","uid":"{}","resourceVersion":"9","generation":3,"creationTimestamp":"{CREATED}","labels":{{"app":"{name}"}},"annotations":{{"deployment.kubernetes.io/revision":"{}"}}{owner}}}"#,
        uid(if kind == "ReplicaSet" { 5 } else { 4 }, i),
        revision + 1
    );
    if meta_only {
        return format!(
            r#"{{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{metadata}}}"#
        );
    }
    let live = if revision == 0 { replicas } else { 0 };
    format!(
        r#"{{"kind":"{kind}","apiVersion":"apps/v1","metadata":{metadata},"spec":{{"replicas":{live},"selector":{{"matchLabels":{{"app":"{name}"}}}},"template":{tpl}}},"status":{{"replicas":{live},"readyReplicas":{live},"availableReplicas":{live},"observedGeneration":3}}}}"#,
        tpl = template(&name, fixed)
    )
}

/// The number of objects of a generated kind, and each one's namespace and JSON.
fn generated(pods: usize, plural: &str) -> Option<usize> {
    Some(match plural {
        "pods" => pods,
        "nodes" => nodes(pods),
        "deployments" => fixed_apps() + deployments(pods),
        "replicasets" => (fixed_apps() + deployments(pods)) * (OLD_REVISIONS + 1),
        "ipamblocks" => fixed_blocks() + plain_blocks(pods).len(),
        _ => return None,
    })
}

fn generated_namespace(pods: usize, plural: &str, i: usize) -> Option<String> {
    match plural {
        "pods" => Some(pod_shape(pods, i).namespace),
        "nodes" | "ipamblocks" => None,
        "replicasets" => Some(deployment_shape(i / (OLD_REVISIONS + 1)).0),
        _ => Some(deployment_shape(i).0),
    }
}

fn generated_json(pods: usize, plural: &str, i: usize, meta_only: bool) -> String {
    match plural {
        "pods" => pod_json(&pod_shape(pods, i), 5, false, meta_only),
        "nodes" => node_json(i, meta_only),
        "replicasets" => workload_json("ReplicaSet", i, meta_only),
        "ipamblocks" => generated_block(pods, i, meta_only),
        _ => workload_json("Deployment", i, meta_only),
    }
}

// --- Calico's IPAM blocks ----------------------------------------------------------------

const BLOCK: usize = 64;

/// The /26 blocks of the fixed pods' IPs (10.200.0.0 + 1 + g for fixed pod g).
fn fixed_blocks() -> usize {
    (fixed_pods() + 1).div_ceil(BLOCK)
}

/// The blocks of the plain pods (pod `i` is the `i % 64`-th address of block `i / 64`).
fn plain_blocks(pods: usize) -> std::ops::Range<usize> {
    let first = fixed_pods() / BLOCK;
    first..pods.saturating_sub(1) / BLOCK + 1
}

fn ip_octets(ip: &str) -> [u8; 4] {
    let mut octets = [0u8; 4];
    for (slot, part) in octets.iter_mut().zip(ip.split('.')) {
        *slot = part.parse().unwrap_or(0);
    }
    octets
}

/// One `IPAMBlock` of `base` (a /26), with each allocated ordinal's pod, as Calico writes it
/// (`libcalico-go/lib/apis/internalapi/ipam_block.go`; attributes from the CNI plugin).
fn block_json(base: [u8; 4], node: &str, owners: &[(usize, &PodShape)], meta_only: bool) -> String {
    let [a, b, c, d] = base;
    let name = format!("{a}-{b}-{c}-{d}-26");
    let metadata = format!(
        r#"{{"name":"{name}","uid":"{}","resourceVersion":"5","creationTimestamp":"{CREATED}","annotations":{{"projectcalico.org/metadata":"{{\"creationTimestamp\":null}}"}}}}"#,
        uid(
            11,
            (a as usize) << 24 | (b as usize) << 16 | (c as usize) << 8 | d as usize
        )
    );
    if meta_only {
        return format!(
            r#"{{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{metadata}}}"#
        );
    }
    let mut allocations = vec!["null".to_string(); BLOCK];
    let mut attributes = Vec::new();
    let mut sequence = Vec::new();
    for (n, (ordinal, shape)) in owners.iter().enumerate() {
        allocations[*ordinal] = n.to_string();
        let sha = format!(
            "{:016x}",
            (*ordinal as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ shape.uid.len() as u64
                ^ u64::from(d)
        );
        attributes.push(format!(
            r#"{{"handle_id":"k8s-pod-network.{sha}{sha}{sha}{sha}","secondary":{{"namespace":"{}","node":"{}","pod":"{}","timestamp":"2026-01-01 00:00:00.123456789 +0000 UTC"}}}}"#,
            shape.namespace, shape.node, shape.name
        ));
        sequence.push(format!(r#""{ordinal}":{}"#, 1000 + ordinal));
    }
    let unallocated: Vec<String> = (0..BLOCK)
        .filter(|o| allocations[*o] == "null")
        .map(|o| o.to_string())
        .collect();
    format!(
        r#"{{"apiVersion":"crd.projectcalico.org/v1","kind":"IPAMBlock","metadata":{metadata},"spec":{{"affinity":"host:{node}","allocations":[{}],"attributes":[{}],"cidr":"{a}.{b}.{c}.{d}/26","deleted":false,"sequenceNumber":1100,"sequenceNumberForAllocation":{{{}}},"strictAffinity":false,"unallocated":[{}]}}}}"#,
        allocations.join(","),
        attributes.join(","),
        sequence.join(","),
        unallocated.join(",")
    )
}

/// Block `j`: the fixed pods' blocks first, then the plain pods'.
fn generated_block(pods: usize, j: usize, meta_only: bool) -> String {
    if j < fixed_blocks() {
        // block j holds the addresses 10.200.0.0 + 64j ..+64, fixed pod g is at + g + 1
        let offset = j * BLOCK;
        let base = [10, 200, (offset >> 8) as u8, (offset & 255) as u8];
        let pods_in = offset.saturating_sub(1)..(offset + BLOCK - 1).min(fixed_pods());
        let shapes: Vec<PodShape> = pods_in.map(|g| pod_shape(pods, g)).collect();
        let owners: Vec<(usize, &PodShape)> = shapes
            .iter()
            .map(|shape| (usize::from(ip_octets(&shape.ip)[3] & 0x3F), shape))
            .collect();
        let node = owners.first().map_or("node-0", |(_, s)| s.node.as_str());
        return block_json(base, node, &owners, meta_only);
    }
    let block = plain_blocks(pods).start + (j - fixed_blocks());
    let first = (block * BLOCK).max(fixed_pods());
    let shapes: Vec<PodShape> = (first..((block + 1) * BLOCK).min(pods))
        .map(|i| pod_shape(pods, i))
        .collect();
    let owners: Vec<(usize, &PodShape)> = shapes
        .iter()
        .map(|shape| (usize::from(ip_octets(&shape.ip)[3] & 0x3F), shape))
        .collect();
    let base = plain_ip(block * BLOCK);
    let node = owners.first().map_or("node-0", |(_, s)| s.node.as_str());
    block_json(base, node, &owners, meta_only)
}

/// The pod of the `k`-th admission of `/bench/admit`: app `fixed-(k % apps)`, IP
/// 10.201.(k / 250).(k % 250 + 1).
fn admitted_shape(pods: usize, k: usize) -> PodShape {
    let a = k % fixed_apps();
    let mut shape = pod_shape(pods, pods + 2_000_000 + k);
    shape.namespace = format!("ns-{}", a % NAMESPACES);
    shape.deployment = format!("fixed-{a}");
    shape.ip = format!("10.201.{}.{}", k / 250, k % 250 + 1);
    shape.fixed_app = Some(a);
    shape
}

/// The bound IPClaim of fixed pod `i`.
fn claim_of(pods: usize, i: usize) -> Value {
    let shape = pod_shape(pods, i);
    let a = shape.fixed_app.expect("a fixed pod");
    json!({
        "apiVersion": "ip-webhook.io/v1alpha1", "kind": "IPClaim",
        "metadata": {"name": shape.ip, "uid": uid(6, i), "resourceVersion": "3", "creationTimestamp": CREATED},
        "spec": {"ip": shape.ip, "namespace": shape.namespace, "app": format!("fixed-{a}"),
                 "podName": shape.name, "generateName": format!("{}-{}-", shape.deployment, shape.rs_hash),
                 "podUid": shape.uid, "requestUid": uid(7, i), "source": "Allocated",
                 "token": format!("{:032x}", 0xC1A1_0000_0000usize + a * 16 + shape.ip.len())},
        "status": {"phase": "Bound", "reservedAt": CREATED},
    })
}

// --- serving -----------------------------------------------------------------------------

impl Server {
    fn next_rv(&self) -> u64 {
        self.rv.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn count(&self, bytes: usize) {
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    fn count_for(&self, resource: &str, what: &str, meta_only: bool, bytes: usize) {
        let label = format!(
            "{resource} {what}{}",
            if meta_only { " (meta)" } else { "" }
        );
        *self.bytes_by.lock().unwrap().entry(label).or_default() += bytes as u64;
    }

    fn reply(&self, status: StatusCode, body: String) -> Response<Body> {
        self.count(body.len());
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(full(body))
            .unwrap()
    }

    fn status(&self, code: StatusCode, reason: &str, message: &str) -> Response<Body> {
        self.reply(
            code,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": message, "reason": reason, "code": code.as_u16()})
            .to_string(),
        )
    }

    fn broadcast(&self, resource: &str, namespace: &str, kind: &str, object: &Value) {
        let meta = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                          "metadata": object["metadata"]});
        let _ = self.events.send(Arc::new(Event {
            resource: resource.into(),
            namespace: namespace.into(),
            labelled: object["metadata"]["labels"].get(OUR_LABEL).is_some(),
            full: format!("{{\"type\":\"{kind}\",\"object\":{object}}}\n").into(),
            meta: format!("{{\"type\":\"{kind}\",\"object\":{meta}}}\n").into(),
        }));
    }

    /// A MODIFIED event of the block at `base` holding `owners`.
    fn broadcast_block(&self, base: [u8; 4], node: &str, owners: &[(usize, &PodShape)]) {
        let full = block_json(base, node, owners, false);
        let meta = block_json(base, node, owners, true);
        let _ = self.events.send(Arc::new(Event {
            resource: "crd.projectcalico.org/v1/ipamblocks".into(),
            namespace: String::new(),
            labelled: false,
            full: format!("{{\"type\":\"MODIFIED\",\"object\":{full}}}\n").into(),
            meta: format!("{{\"type\":\"MODIFIED\",\"object\":{meta}}}\n").into(),
        }));
    }

    fn list(
        &self,
        target: &Target,
        q: &BTreeMap<String, String>,
        meta_only: bool,
    ) -> Response<Body> {
        let rv = self.rv.load(Ordering::SeqCst);
        let kind = if meta_only {
            "PartialObjectMetadataList"
        } else {
            "List"
        };
        let api_version = if meta_only { "meta.k8s.io/v1" } else { "v1" };
        let mut body = String::new();
        let mut next: Option<usize> = None;
        if let Some(total) = generated(self.pods, &target.plural) {
            // the fixed pods, the first ones, are the pods that carry our label
            let total = if target.plural == "pods" && selects_ours(q) {
                total.min(fixed_pods())
            } else {
                total
            };
            let whole = q.get("resourceVersion").is_some_and(|v| v == "0");
            let limit = q
                .get("limit")
                .and_then(|l| l.parse::<usize>().ok())
                .filter(|_| !whole);
            let mut i: usize = q.get("continue").and_then(|c| c.parse().ok()).unwrap_or(0);
            let mut taken = 0;
            while i < total {
                if limit.is_some_and(|l| taken == l) {
                    next = Some(i);
                    break;
                }
                let ns = generated_namespace(self.pods, &target.plural, i);
                if target.namespace.is_none() || target.namespace == ns {
                    if taken > 0 {
                        body.push(',');
                    }
                    body.push_str(&generated_json(self.pods, &target.plural, i, meta_only));
                    taken += 1;
                }
                i += 1;
            }
        } else {
            // as the generated kinds: `limit` and `continue` (an offset among the matches)
            // unless `resourceVersion=0`, so that a `limit=1` list (the ledger's ping) reads
            // one object, as from kube-apiserver
            let whole = q.get("resourceVersion").is_some_and(|v| v == "0");
            let limit = q
                .get("limit")
                .and_then(|l| l.parse::<usize>().ok())
                .filter(|_| !whole);
            let offset: usize = q.get("continue").and_then(|c| c.parse().ok()).unwrap_or(0);
            let store = self.store.lock().unwrap();
            let matching: Vec<&Value> = store
                .get(&target.resource)
                .into_iter()
                .flat_map(|m| m.values())
                .filter(|object| {
                    target
                        .namespace
                        .as_deref()
                        .is_none_or(|ns| object["metadata"]["namespace"] == ns)
                })
                .collect();
            let end = limit.map_or(matching.len(), |l| (offset + l).min(matching.len()));
            if end < matching.len() {
                next = Some(end);
            }
            let mut first = true;
            for object in matching.iter().take(end).skip(offset) {
                if !first {
                    body.push(',');
                }
                first = false;
                if meta_only {
                    let _ = write!(
                        body,
                        r#"{{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{}}}"#,
                        object["metadata"]
                    );
                } else {
                    body.push_str(&object.to_string());
                }
            }
        }
        let cont = next
            .map(|n| format!(r#","continue":"{n}""#))
            .unwrap_or_default();
        let body = format!(
            r#"{{"kind":"{kind}","apiVersion":"{api_version}","metadata":{{"resourceVersion":"{rv}"{cont}}},"items":[{body}]}}"#
        );
        self.count_for(&target.resource, "list", meta_only, body.len());
        self.reply(StatusCode::OK, body)
    }

    fn watch(
        self: &Arc<Self>,
        target: Target,
        q: &BTreeMap<String, String>,
        meta_only: bool,
    ) -> Response<Body> {
        let ours = selects_ours(q);
        let mut events = self.events.subscribe();
        let server = self.clone();
        let stream = async_stream(move |tx| async move {
            loop {
                match events.recv().await {
                    Ok(event) => {
                        if event.resource != target.resource
                            || (ours && !event.labelled)
                            || target
                                .namespace
                                .as_ref()
                                .is_some_and(|ns| *ns != event.namespace)
                        {
                            continue;
                        }
                        let line = if meta_only {
                            event.meta.clone()
                        } else {
                            event.full.clone()
                        };
                        server.count(line.len());
                        server.count_for(&target.resource, "watch", meta_only, line.len());
                        if tx.send(line).await.is_err() {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        eprintln!("a watch of {} lagged by {n} events", target.resource);
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(StreamBody::new(stream).boxed())
            .unwrap()
    }

    fn write(&self, method: &Method, target: &Target, body: &[u8], path: &str) -> Response<Body> {
        let mut store = self.store.lock().unwrap();
        let objects = store.entry(target.resource.clone()).or_default();
        let ns = target.namespace.clone().unwrap_or_default();
        let status_only = path.ends_with("/status");
        let incoming: Option<Value> = serde_json::from_slice(body).ok();
        let (kind, object) = match (method, &target.name) {
            (&Method::POST, None) => {
                let Some(mut object) = incoming else {
                    drop(store);
                    return self.status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON");
                };
                let meta = &mut object["metadata"];
                if meta.get("name").is_none()
                    && let Some(prefix) = meta.get("generateName").and_then(Value::as_str)
                {
                    meta["name"] =
                        json!(format!("{prefix}{}", &hash10(self.next_rv() as usize)[..5]));
                }
                let name = meta["name"].as_str().unwrap_or("").to_string();
                let key = format!("{ns}/{name}");
                if objects.contains_key(&key) {
                    drop(store);
                    return self.status(
                        StatusCode::CONFLICT,
                        "AlreadyExists",
                        &format!("{} {name:?} already exists", target.plural),
                    );
                }
                let rv = self.next_rv();
                meta["uid"] = json!(uid(9, rv as usize));
                meta["resourceVersion"] = json!(rv.to_string());
                meta["creationTimestamp"] = json!(CREATED);
                if !ns.is_empty() {
                    meta["namespace"] = json!(ns);
                }
                if target.plural == "ipclaims" {
                    object.as_object_mut().unwrap().remove("status");
                }
                objects.insert(key, object.clone());
                ("ADDED", object)
            }
            (_, Some(name)) => {
                let key = format!("{ns}/{name}");
                let Some(current) = objects.get(&key).cloned() else {
                    drop(store);
                    return self.status(
                        StatusCode::NOT_FOUND,
                        "NotFound",
                        &format!("{} {name:?} not found", target.plural),
                    );
                };
                let mut object = current.clone();
                match *method {
                    Method::GET => {
                        drop(store);
                        return self.reply(StatusCode::OK, current.to_string());
                    }
                    Method::DELETE => {
                        let precondition = incoming
                            .as_ref()
                            .and_then(|o| o.pointer("/preconditions/resourceVersion"))
                            .and_then(Value::as_str);
                        if precondition.is_some_and(|rv| {
                            Some(rv) != current["metadata"]["resourceVersion"].as_str()
                        }) {
                            drop(store);
                            return self.status(
                                StatusCode::CONFLICT,
                                "Conflict",
                                "the object has been modified",
                            );
                        }
                        objects.remove(&key);
                        let rv = self.next_rv();
                        object["metadata"]["resourceVersion"] = json!(rv.to_string());
                        ("DELETED", object)
                    }
                    Method::PUT => {
                        let Some(new) = incoming else {
                            drop(store);
                            return self.status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON");
                        };
                        if new["metadata"]["resourceVersion"]
                            .as_str()
                            .is_some_and(|rv| {
                                Some(rv) != current["metadata"]["resourceVersion"].as_str()
                            })
                        {
                            drop(store);
                            return self.status(StatusCode::CONFLICT, "Conflict", "the object has been modified; please apply your changes to the latest version and try again");
                        }
                        if status_only {
                            object["status"] = new["status"].clone();
                        } else {
                            let keep_status = object.get("status").cloned();
                            object = new;
                            if let Some(status) =
                                keep_status.filter(|_| target.plural == "ipclaims")
                            {
                                object["status"] = status;
                            }
                        }
                        let rv = self.next_rv();
                        object["metadata"]["resourceVersion"] = json!(rv.to_string());
                        object["metadata"]["uid"] = current["metadata"]["uid"].clone();
                        object["metadata"]["creationTimestamp"] =
                            current["metadata"]["creationTimestamp"].clone();
                        objects.insert(key, object.clone());
                        ("MODIFIED", object)
                    }
                    Method::PATCH => {
                        let Some(patch) = incoming else {
                            drop(store);
                            return self.status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON");
                        };
                        if let Some(ops) = patch.as_array() {
                            match serde_json::from_value::<json_patch::Patch>(Value::Array(
                                ops.clone(),
                            )) {
                                Ok(p) if json_patch::patch(&mut object, &p).is_ok() => {}
                                _ => {
                                    drop(store);
                                    return self.status(
                                        StatusCode::UNPROCESSABLE_ENTITY,
                                        "Invalid",
                                        "the JSON patch does not apply",
                                    );
                                }
                            }
                        } else {
                            merge(&mut object, &patch);
                        }
                        let rv = self.next_rv();
                        object["metadata"]["resourceVersion"] = json!(rv.to_string());
                        objects.insert(key, object.clone());
                        ("MODIFIED", object)
                    }
                    _ => {
                        drop(store);
                        return self.status(
                            StatusCode::METHOD_NOT_ALLOWED,
                            "MethodNotAllowed",
                            "method not allowed",
                        );
                    }
                }
            }
            _ => {
                drop(store);
                return self.status(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    "method not allowed",
                );
            }
        };
        drop(store);
        self.broadcast(&target.resource, &ns, kind, &object);
        let code = if kind == "ADDED" {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        self.reply(code, object.to_string())
    }

    async fn churn(self: Arc<Self>, n: usize) {
        for k in 0..n {
            let i = self.pods + 1_000_000 + k;
            let mut shape = pod_shape(self.pods, i);
            shape.namespace = format!("ns-{}", k % NAMESPACES);
            // its block, full: the others of its /26 run on as far as the replica can tell
            let block = i / BLOCK * BLOCK;
            let neighbours: Vec<PodShape> = (block..block + BLOCK)
                .filter(|j| *j != i)
                .map(|j| pod_shape(self.pods, j))
                .collect();
            let mut owners: Vec<(usize, &PodShape)> = neighbours
                .iter()
                .map(|s| (usize::from(ip_octets(&s.ip)[3] & 0x3F), s))
                .collect();
            let base = plain_ip(block);
            for (kind, deleting) in [("ADDED", false), ("MODIFIED", true), ("DELETED", true)] {
                let rv = self.next_rv();
                let full = pod_json(&shape, rv, deleting, false);
                let meta = pod_json(&shape, rv, deleting, true);
                let _ = self.events.send(Arc::new(Event {
                    resource: "/v1/pods".into(),
                    namespace: shape.namespace.clone(),
                    labelled: false,
                    full: format!("{{\"type\":\"{kind}\",\"object\":{full}}}\n").into(),
                    meta: format!("{{\"type\":\"{kind}\",\"object\":{meta}}}\n").into(),
                }));
                match kind {
                    "ADDED" => {
                        owners.push((i % BLOCK, &shape));
                        self.broadcast_block(base, &shape.node, &owners);
                    }
                    "DELETED" => {
                        owners.pop();
                        self.broadcast_block(base, &shape.node, &owners);
                    }
                    _ => {}
                }
            }
            if k % 100 == 99 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    /// A fixed-IP admission as the cluster sees it afterwards: claim created Reserved, pod
    /// created carrying its IP and token, claim bound to the pod's UID.
    async fn admit(self: Arc<Self>, from: usize, n: usize, interval: Duration) {
        for k in from..from + n {
            let a = k % fixed_apps();
            let i = self.pods + 2_000_000 + k;
            let shape = admitted_shape(self.pods, k);
            let token = format!("{:032x}", 0xC1A1_0000_0000usize + a * 16 + shape.ip.len());
            let mut claim = json!({
                "apiVersion": "ip-webhook.io/v1alpha1", "kind": "IPClaim",
                "metadata": {"name": shape.ip, "uid": uid(8, i), "creationTimestamp": CREATED},
                "spec": {"ip": shape.ip, "namespace": shape.namespace, "app": format!("fixed-{a}"),
                         "generateName": format!("{}-{}-", shape.deployment, shape.rs_hash),
                         "requestUid": uid(7, i), "source": "Allocated", "token": token},
            });
            let key = format!("/{}", shape.ip);
            let resource = "ip-webhook.io/v1alpha1/ipclaims";
            claim["metadata"]["resourceVersion"] = json!(self.next_rv().to_string());
            self.store
                .lock()
                .unwrap()
                .entry(resource.into())
                .or_default()
                .insert(key.clone(), claim.clone());
            self.broadcast(resource, "", "ADDED", &claim);
            tokio::time::sleep(Duration::from_millis(20)).await;
            let rv = self.next_rv();
            let pod: Value = serde_json::from_str(&pod_json(&shape, rv, false, false)).unwrap();
            self.broadcast("/v1/pods", &shape.namespace, "ADDED", &pod);
            // Calico allocated its IP: its block, with the admissions before it in that /26
            let base = [10, 201, (k / 250) as u8, ((k % 250 + 1) & 0xC0) as u8];
            let shapes: Vec<PodShape> = (0..=k)
                .filter(|j| j / 250 == k / 250 && (j % 250 + 1) & 0xC0 == (k % 250 + 1) & 0xC0)
                .map(|j| admitted_shape(self.pods, j))
                .collect();
            let owners: Vec<(usize, &PodShape)> = shapes
                .iter()
                .map(|s| (usize::from(ip_octets(&s.ip)[3] & 0x3F), s))
                .collect();
            self.broadcast_block(base, &shape.node, &owners);
            tokio::time::sleep(Duration::from_millis(20)).await;
            claim["spec"]["podName"] = json!(shape.name);
            claim["spec"]["podUid"] = json!(shape.uid);
            claim["status"] = json!({"phase": "Bound", "reservedAt": CREATED});
            claim["metadata"]["resourceVersion"] = json!(self.next_rv().to_string());
            self.store
                .lock()
                .unwrap()
                .entry(resource.into())
                .or_default()
                .insert(key, claim.clone());
            self.broadcast(resource, "", "MODIFIED", &claim);
            tokio::time::sleep(interval.saturating_sub(Duration::from_millis(40))).await;
        }
    }

    async fn handle(
        self: Arc<Self>,
        request: Request<Incoming>,
    ) -> Result<Response<Body>, Infallible> {
        let (parts, body) = request.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let path = parts.uri.path().to_string();
        let q = query(&parts.uri);
        let watching = q.get("watch").is_some_and(|w| w == "true" || w == "1");
        {
            let label = format!(
                "{} {}{}",
                parts.method,
                path,
                if watching { " (watch)" } else { "" }
            );
            *self.requests.lock().unwrap().entry(label).or_default() += 1;
        }
        if let Some(control) = path.strip_prefix("/bench/") {
            let n: usize = q.get("n").and_then(|n| n.parse().ok()).unwrap_or(1000);
            return Ok(match control {
                "stats" => {
                    let requests = self.requests.lock().unwrap().clone();
                    let bytes = self.bytes.load(Ordering::Relaxed);
                    let by = self.bytes_by.lock().unwrap().clone();
                    Response::new(full(
                        json!({"bytes": bytes, "bytes_by": by, "requests": requests}).to_string(),
                    ))
                }
                "reset" => {
                    self.bytes.store(0, Ordering::Relaxed);
                    self.bytes_by.lock().unwrap().clear();
                    self.requests.lock().unwrap().clear();
                    Response::new(full("{}"))
                }
                "churn" => {
                    self.clone().churn(n).await;
                    Response::new(full("{}"))
                }
                "admit" => {
                    let interval = q
                        .get("interval_ms")
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(560);
                    let from = q.get("from").and_then(|n| n.parse().ok()).unwrap_or(0);
                    self.clone()
                        .admit(from, n, Duration::from_millis(interval))
                        .await;
                    Response::new(full("{}"))
                }
                _ => Response::builder().status(404).body(full("")).unwrap(),
            });
        }
        if path == "/version" {
            return Ok(self.reply(
                StatusCode::OK,
                json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0"}).to_string(),
            ));
        }
        let Some(target) = parse_path(&path) else {
            return Ok(self.status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            ));
        };
        let meta_only = parts
            .headers
            .get("accept")
            .and_then(|a| a.to_str().ok())
            .is_some_and(|a| a.contains("as=PartialObjectMetadata"));
        Ok(match (&parts.method, &target.name) {
            (&Method::GET, None) if watching => self.watch(target, &q, meta_only),
            (&Method::GET, None) => self.list(&target, &q, meta_only),
            (&Method::GET, Some(name)) if generated(self.pods, &target.plural).is_some() => {
                let total = generated(self.pods, &target.plural).unwrap();
                let found = (0..total).find(|&i| {
                    let json = generated_json(self.pods, &target.plural, i, true);
                    json.contains(&format!(r#""name":"{name}""#))
                });
                match found {
                    Some(i) => self.reply(
                        StatusCode::OK,
                        generated_json(self.pods, &target.plural, i, meta_only),
                    ),
                    None => self.status(
                        StatusCode::NOT_FOUND,
                        "NotFound",
                        &format!("{} {name:?} not found", target.plural),
                    ),
                }
            }
            _ => self.write(&parts.method, &target, &body, &path),
        })
    }
}

/// Whether a list or watch selects the pods carrying our label (the one selector the replica
/// sends; any other is not honoured).
fn selects_ours(q: &BTreeMap<String, String>) -> bool {
    q.get("labelSelector").is_some_and(|s| s == OUR_LABEL)
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// A body stream fed by a task through a channel.
fn async_stream<F, Fut>(
    task: F,
) -> impl futures::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + Sync + 'static
where
    F: FnOnce(tokio::sync::mpsc::Sender<Bytes>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1024);
    tokio::spawn(task(tx));
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok(Frame::data(b)), rx))
    })
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let port: u16 = args
        .get(1)
        .and_then(|p| p.parse().ok())
        .expect("usage: scale_apiserver PORT PODS");
    let pods: usize = args
        .get(2)
        .and_then(|p| p.parse().ok())
        .expect("usage: scale_apiserver PORT PODS");
    let pods = pods.max(fixed_pods());
    let (events, _) = broadcast::channel(1 << 16);
    let server = Arc::new(Server {
        pods,
        rv: AtomicU64::new(100),
        bytes: AtomicU64::new(0),
        bytes_by: Mutex::new(BTreeMap::new()),
        requests: Mutex::default(),
        store: Mutex::default(),
        events,
    });
    {
        let mut store = server.store.lock().unwrap();
        let claims = store
            .entry("ip-webhook.io/v1alpha1/ipclaims".into())
            .or_default();
        for i in 0..fixed_pods() {
            let claim = claim_of(pods, i);
            claims.insert(
                format!("/{}", claim["metadata"]["name"].as_str().unwrap()),
                claim,
            );
        }
    }
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind");
    eprintln!("scale_apiserver: {pods} pods on 127.0.0.1:{port}");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let server = server.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |r| server.clone().handle(r));
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
