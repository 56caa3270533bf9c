//! A running `tests/support/fakeapi.py` (an in-memory Kubernetes API server, this project's
//! own test tool) and a kubeconfig that points at it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ip_webhook_ledger::crd::{FixedIPPool, IPClaim};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::{Api, Client, CustomResourceExt};

use super::ports;
use serde_json::Value;

use super::TestServer;

/// A running fakeapi.py and a kubeconfig that points at it.
pub struct FakeApi {
    child: Child,
    pub port: u16,
    dir: tempfile::TempDir,
}

/// A kubeconfig for `http://127.0.0.1:PORT` per context; the first is the current one.
pub fn kubeconfig_yaml(contexts: &[(&str, u16)]) -> String {
    let mut clusters = String::new();
    let mut named = String::new();
    for (name, port) in contexts {
        clusters.push_str(&format!(
            "- name: {name}\n  cluster:\n    server: http://127.0.0.1:{port}\n"
        ));
        named.push_str(&format!(
            "- name: {name}\n  context:\n    cluster: {name}\n    user: fake\n"
        ));
    }
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n{clusters}contexts:\n{named}current-context: {}\n\
         users:\n- name: fake\n  user: {{}}\n",
        contexts[0].0
    )
}

/// A loopback port nothing listens on.
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

impl FakeApi {
    /// Start `tests/support/fakeapi.py` (this project's own test API server, stdlib Python).
    /// Fails the test, saying what is missing, when python3 cannot run it.
    pub fn start() -> FakeApi {
        FakeApi::start_with(&[])
    }

    /// [`FakeApi::start`] with more fakeapi.py flags.
    pub fn start_with(flags: &[&str]) -> FakeApi {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/fakeapi.py");
        assert!(script.exists(), "{} is missing", script.display());
        let port = ports::listen_port();
        let child = Command::new("python3")
            .arg(&script)
            .arg(port.to_string())
            .args(flags)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!("cannot run python3 ({error}); the fake API server tests need it")
            });
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeApi { child, port, dir };
        std::fs::write(fake.kubeconfig(), fake.kubeconfig_yaml()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while fake.raw("GET", "/version").is_err() {
            assert!(
                Instant::now() < deadline,
                "fakeapi.py did not start on port {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        fake
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    pub fn kubeconfig_yaml(&self) -> String {
        kubeconfig_yaml(&[("fake", self.port)])
    }

    /// A plain HTTP/1.0 request; the status line's code.
    pub fn raw(&self, method: &str, path: &str) -> std::io::Result<u16> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        write!(
            stream,
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
        )?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply)?;
        reply
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no status line in {reply:?}")))
    }

    /// POST a JSON body to a /fake/* control hook.
    pub fn control(&self, path: &str, body: Value) {
        let body = body.to_string();
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            stream,
            "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        assert!(
            reply.starts_with("HTTP/1.0 200") || reply.starts_with("HTTP/1.1 200"),
            "{reply}"
        );
    }

    /// GET a JSON document (a /fake/* hook).
    pub fn get_json(&self, path: &str) -> Value {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        let body = reply.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{path}: {e}: {reply:.200}"))
    }

    /// The test's own client (a User-Agent of its own, so the RBAC check can tell it apart).
    pub async fn client(&self) -> Client {
        let file = kube::config::Kubeconfig::read_from(self.kubeconfig()).unwrap();
        let mut config = kube::Config::from_custom_kubeconfig(file, &Default::default())
            .await
            .unwrap();
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_static("in-cluster-test"),
        ));
        Client::try_from(config).unwrap()
    }

    /// Install the CRDs as `ip-webhook crds` prints them.
    pub async fn install_crds(&self) -> Client {
        let client = self.client().await;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in [FixedIPPool::crd(), IPClaim::crd()] {
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
        client
    }

    /// Serve this API server on one more loopback port (`/fake/listen`): a client that
    /// connects there can be slowed down alone (`watchDelay` and `requestDelay` by port).
    pub fn listen(&self) -> u16 {
        let body = serde_json::json!({}).to_string();
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            stream,
            "POST /fake/listen HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        let body = reply.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        let answer: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {reply}"));
        answer["port"]
            .as_u64()
            .expect("/fake/listen answers a port") as u16
    }

    /// A kubeconfig file for `port` (another listener of this API server).
    pub fn kubeconfig_via(&self, port: u16) -> PathBuf {
        let path = self.dir.path().join(format!("kubeconfig-{port}"));
        std::fs::write(&path, kubeconfig_yaml(&[("fake", port)])).unwrap();
        path
    }

    /// A webhook replica that reaches this API server through `port` (see [`FakeApi::listen`]).
    pub async fn replica_via(&self, port: u16, extra: &[&str]) -> TestServer {
        let kubeconfig = self.kubeconfig_via(port).display().to_string();
        let mut args = vec!["--ledger", "kubernetes", "--kubeconfig", &kubeconfig];
        args.extend_from_slice(extra);
        let server = TestServer::start(&args).await;
        wait_ready(&server).await;
        server
    }

    /// A webhook replica over the etcd ledger at `endpoints` (an `--etcd-endpoints` value)
    /// that asks this API server, through its listener `port`, for pods and VMs.
    pub async fn etcd_replica_via(&self, port: u16, endpoints: &str, extra: &[&str]) -> TestServer {
        let kubeconfig = self.kubeconfig_via(port).display().to_string();
        let mut args = vec![
            "--ledger",
            "etcd",
            "--etcd-endpoints",
            endpoints,
            "--kubeconfig",
            &kubeconfig,
        ];
        args.extend_from_slice(extra);
        let server = TestServer::start(&args).await;
        wait_ready(&server).await;
        server
    }

    /// Start a webhook replica against this API server.
    pub async fn replica(&self, extra: &[&str]) -> TestServer {
        let kubeconfig = self.kubeconfig().display().to_string();
        let mut args = vec!["--ledger", "kubernetes", "--kubeconfig", &kubeconfig];
        args.extend_from_slice(extra);
        let server = TestServer::start(&args).await;
        wait_ready(&server).await;
        server
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Wait until the replica's `/readyz` answers 200.
pub async fn wait_ready(server: &TestServer) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, _) = server.admin_get("/readyz").await;
        if code == 200 {
            return;
        }
        assert!(Instant::now() < deadline, "replica never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Create every CustomResourceDefinition of `tests/fixtures/<file>` (the published CRDs of
/// another project, e.g. a CNI's); returns their names in file order.
pub async fn install_crd_fixture(client: &Client, file: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let crd: CustomResourceDefinition = serde::Deserialize::deserialize(document).unwrap();
        names.push(crd.metadata.name.clone().unwrap_or_default());
        api.create(&PostParams::default(), &crd).await.unwrap();
    }
    names
}

/// Create the custom object `name` of `resource` with this `spec`.
pub async fn create_spec(
    api: &Api<DynamicObject>,
    resource: &ApiResource,
    name: &str,
    spec: Value,
) {
    let object = DynamicObject::new(name, resource).data(serde_json::json!({ "spec": spec }));
    api.create(&PostParams::default(), &object).await.unwrap();
}

/// Create Deployment `namespace/name` of 2 replicas whose pods (label `app: NAME`) name
/// `list` in `ip-webhook.io/allocatable-ips`.
pub async fn create_listed_deployment(client: &Client, namespace: &str, name: &str, list: &str) {
    let deployment: k8s_openapi::api::apps::v1::Deployment =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name},
                                 "annotations": {"ip-webhook.io/allocatable-ips": list}},
                    "spec": {"containers": [{"name": "c", "image": "i"}]},
                },
            },
        }))
        .unwrap();
    Api::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
}

/// Create the pod an admission answered for (`object` with the patch applied) under `name`.
pub async fn persist_pod(pods: &Api<Pod>, mut object: Value, name: &str) -> Pod {
    object["metadata"]["name"] = serde_json::json!(name);
    let pod: Pod = serde_json::from_value(object).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap()
}

/// Wait until the IPClaim of `ip` is Bound (at most `within`); returns it.
pub async fn bound_claim(claims: &Api<IPClaim>, ip: &str, within: Duration) -> IPClaim {
    super::eventually(
        &format!("the claim of {ip} to be bound"),
        within,
        || async move {
            let claim = claims.get_opt(ip).await.ok()??;
            (claim.status.as_ref()?.phase == "Bound").then_some(claim)
        },
    )
    .await
}
