//! Shared helpers for integration tests: a real HTTPS client over loopback, servers started
//! in-process or as the real binary, and AdmissionReview builders.
#![allow(dead_code)]

pub mod admission;
pub mod api_order;
pub mod claims;
pub mod client_ca;
pub mod cni;
pub mod etcd_cluster;
pub mod events;
pub mod fakeapi;
pub mod helm;
pub mod load;
pub mod node_loss;
pub mod ports;
pub mod rbac;
pub mod resources;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use hyper_util::rt::TokioIo;
use ip_webhook::app::{self, Launched, ServeConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

/// The built binary, with none of the environment that would point it at a cluster
/// (`KUBECONFIG`, `KUBERNETES_SERVICE_HOST`) or change what it logs (`RUST_LOG`).
pub fn binary() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ip-webhook"));
    command
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("RUST_LOG");
    command
}

/// What a run of the binary to its end printed.
#[derive(Debug)]
pub struct Ran {
    /// Exit status 0.
    pub ok: bool,
    /// The exit code; `None` if a signal ended it.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Run the binary ([`binary`]) with `args` to its end.
pub fn ip_webhook(args: &[&str]) -> Ran {
    let out = binary().args(args).output().unwrap();
    Ran {
        ok: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// One check of `ip-webhook check --output json`: its name, `OK`/`WARN`/`FAIL`/`SKIP` and what
/// it saw.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct Check {
    pub name: String,
    pub status: String,
    pub detail: String,
}

/// `ip-webhook check --output json` with `args`, run to its end off the runtime's threads:
/// every check it printed, and how it ended.
pub async fn check(args: Vec<String>) -> (Vec<Check>, Ran) {
    let ran = tokio::task::spawn_blocking(move || {
        let mut argv = vec!["check", "--output", "json"];
        argv.extend(args.iter().map(String::as_str));
        ip_webhook(&argv)
    })
    .await
    .unwrap();
    let checks = serde_json::from_str(&ran.stdout)
        .unwrap_or_else(|e| panic!("check's output is not its checks: {e}\n{ran:?}"));
    (checks, ran)
}

pub fn client_config(ca_pem: &[u8]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots
            .add(cert.expect("CA PEM parses"))
            .expect("CA is usable");
    }
    let mut config =
        rustls::ClientConfig::builder_with_provider(ip_webhook::server::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    // every connection verifies the served certificate afresh (no session resumption)
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

/// An HTTPS client that trusts one CA and opens a fresh connection per request.
#[derive(Clone)]
pub struct HttpsClient {
    pub addr: SocketAddr,
    pub config: Arc<rustls::ClientConfig>,
}

pub struct Reply {
    pub status: StatusCode,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "reply is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The `response` of an AdmissionReview reply, after checking it is a 200.
    pub fn response(&self) -> Value {
        assert_eq!(
            self.status,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&self.body)
        );
        self.json()["response"].clone()
    }
}

/// Longer than any answer a test waits for (the slowest are ledger retries of a few seconds).
const REQUEST_DEADLINE: Duration = Duration::from_secs(60);

impl HttpsClient {
    pub fn new(addr: SocketAddr, ca_pem: &[u8]) -> HttpsClient {
        HttpsClient {
            addr,
            config: client_config(ca_pem),
        }
    }

    /// POST a review to `/mutate`; the AdmissionReview's `response`.
    pub async fn mutate(&self, review: &Value) -> Value {
        self.post("/mutate", review.to_string())
            .await
            .unwrap()
            .response()
    }

    /// POST a review to `/validate`; the AdmissionReview's `response`.
    pub async fn validate(&self, review: &Value) -> Value {
        self.post("/validate", review.to_string())
            .await
            .unwrap()
            .response()
    }

    pub async fn post(&self, path: &str, body: impl Into<Bytes>) -> Result<Reply, String> {
        self.request("POST", path, Some("application/json"), body.into())
            .await
    }

    /// One request on a new connection. A server that never answers fails the test here, by
    /// name, rather than holding the suite until CI's own limit.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<Reply, String> {
        tokio::time::timeout(
            REQUEST_DEADLINE,
            self.request_unbounded(method, path, content_type, body),
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{method} {path} to {}: no answer within {REQUEST_DEADLINE:?}",
                self.addr
            )
        })
    }

    async fn request_unbounded(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<Reply, String> {
        let tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|e| e.to_string())?;
        let connector = tokio_rustls::TlsConnector::from(self.config.clone());
        let name = ServerName::try_from("localhost").unwrap();
        let tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        let mut builder = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost");
        if let Some(content_type) = content_type {
            builder = builder.header("content-type", content_type);
        }
        let response = sender
            .send_request(builder.body(Full::new(body)).unwrap())
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(Reply { status, body })
    }
}

/// What `serve` runs for a command line of loopback ports, the state dir, the embedded ledger
/// unless `extra` names another or a kubeconfig, and `extra`.
pub fn serve_config_with(state_dir: &Path, extra: &[&str]) -> ServeConfig {
    let mut argv = vec![
        "ip-webhook".to_string(),
        "serve".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--admin-listen".into(),
        "127.0.0.1:0".into(),
        "--state-dir".into(),
        state_dir.display().to_string(),
    ];
    // Off-cluster unless a test asks otherwise, even when the suite itself runs in a pod.
    if !extra
        .iter()
        .any(|a| *a == "--ledger" || *a == "--kubeconfig")
    {
        argv.extend(["--ledger".to_string(), "embedded".to_string()]);
    }
    argv.extend(extra.iter().map(|s| s.to_string()));
    ip_webhook::cli::parse_serve(argv).expect("test arguments parse")
}

/// A server running in this process with a self-signed certificate.
pub struct TestServer {
    pub launched: Launched,
    pub client: HttpsClient,
    pub state_dir: tempfile::TempDir,
}

/// What `serve` runs with its defaults, on loopback ports (chosen by the kernel), with the
/// embedded ledger and the self-signed certificate in `state_dir`: a test changes the fields
/// it is about.
pub fn serve_config(state_dir: &Path) -> ServeConfig {
    serve_config_with(state_dir, &[])
}

/// [`serve_config`] serving the PEM files `cert` and `key`, read again every `reload`.
pub fn with_cert_files(state_dir: &Path, cert: &Path, key: &Path, reload: Duration) -> ServeConfig {
    ServeConfig {
        tls: app::TlsConfig::Files {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        },
        tls_reload_interval: reload,
        ..serve_config(state_dir)
    }
}

/// `--read-timeout`: the deadline of a request's head, and again of its body.
pub fn read_timeout(config: &mut ServeConfig, timeout: Duration) {
    config.limits.header_read = timeout;
    config.limits.body_read = timeout;
}

/// The kubernetes ledger (IPClaims) of the API server `kubeconfig` describes.
pub fn kubernetes_ledger(config: &mut ServeConfig, kubeconfig: &Path) {
    config.webhook.ledger = ip_webhook_ledger::LedgerConfig::Kubernetes(
        ip_webhook_ledger::KubeAccess::new(Some(kubeconfig), None),
    );
}

impl TestServer {
    /// A server with `serve`'s defaults and these flags.
    pub async fn start(extra: &[&str]) -> TestServer {
        let state_dir = tempfile::tempdir().unwrap();
        let config = serve_config_with(state_dir.path(), extra);
        TestServer::launch(state_dir, &config).await
    }

    /// A server with [`serve_config`], changed by `change`.
    pub async fn start_with(change: impl FnOnce(&mut ServeConfig)) -> TestServer {
        let state_dir = tempfile::tempdir().unwrap();
        let mut config = serve_config(state_dir.path());
        change(&mut config);
        TestServer::launch(state_dir, &config).await
    }

    async fn launch(state_dir: tempfile::TempDir, config: &ServeConfig) -> TestServer {
        let launched = app::launch(config).await.expect("server starts");
        let ca = std::fs::read(state_dir.path().join("ca.crt")).unwrap();
        let client = HttpsClient::new(launched.running.https_addr, &ca);
        TestServer {
            launched,
            client,
            state_dir,
        }
    }

    pub async fn mutate(&self, review: &Value) -> Value {
        self.client.mutate(review).await
    }

    pub async fn validate(&self, review: &Value) -> Value {
        self.client.validate(review).await
    }

    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        http_get(self.launched.running.admin_addr, path).await
    }
}

/// A plain-HTTP GET (the admin port).
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(connection);
    let response = sender
        .send_request(
            hyper::Request::get(path)
                .header("host", "localhost")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The real binary, started with `args` after `serve`; waits for its "serving" line.
pub struct BinaryServer {
    pub child: Child,
    /// Started under a wrapper, in a process group of its own: killed as a group.
    wrapped: bool,
    pub https_addr: SocketAddr,
    pub admin_addr: SocketAddr,
}

impl BinaryServer {
    /// `IP_WEBHOOK_TEST_BINARY` runs another build instead (to measure a finding before and
    /// after a change).
    pub fn start(args: &[&str]) -> BinaryServer {
        BinaryServer::start_under(&[], args)
    }

    /// Run the server under `wrapper` (a command and its arguments that run the rest, such as
    /// `faketime -f +600s`). The wrapper and the server get a process group of their own, so
    /// that dropping the server also kills what the wrapper forked (faketime forks); a server
    /// without a wrapper stays in the test's group, where a Ctrl-C of the run reaches it.
    pub fn start_under(wrapper: &[&str], args: &[&str]) -> BinaryServer {
        BinaryServer::spawn(wrapper, args, None)
    }

    /// [`BinaryServer::start`] with `RUST_LOG=rust_log` and its log (stderr) written to `log`.
    pub fn start_logging(args: &[&str], rust_log: &str, log: &Path) -> BinaryServer {
        BinaryServer::spawn(&[], args, Some((rust_log, log)))
    }

    fn spawn(wrapper: &[&str], args: &[&str], logging: Option<(&str, &Path)>) -> BinaryServer {
        let binary = std::env::var_os("IP_WEBHOOK_TEST_BINARY")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_ip-webhook").into());
        let mut command = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut command = Command::new(program);
                command.args(rest).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        let wrapped = !wrapper.is_empty();
        if wrapped {
            command.process_group(0);
        }
        match logging {
            Some((rust_log, log)) => {
                command
                    .env("RUST_LOG", rust_log)
                    .stderr(std::fs::File::create(log).expect("log file"));
            }
            None => {
                command.stderr(Stdio::null());
            }
        }
        let mut child = command
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::piped())
            .spawn()
            .expect("binary starts");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let line = lines
            .next()
            .expect("the server prints a serving line")
            .expect("stdout is readable");
        std::thread::spawn(move || for _ in lines {});
        let https = between(&line, "https://", " ");
        let admin = between(&line, "admin http://", ")");
        BinaryServer {
            child,
            wrapped,
            https_addr: https
                .parse()
                .unwrap_or_else(|_| panic!("address in {line:?}")),
            admin_addr: admin
                .parse()
                .unwrap_or_else(|_| panic!("address in {line:?}")),
        }
    }

    /// SIGKILL to the server and whatever wrapped it.
    pub fn kill9(&mut self) {
        self.kill().expect("SIGKILL");
        self.child.wait().unwrap();
    }

    fn kill(&mut self) -> std::io::Result<()> {
        if !self.wrapped {
            return self.child.kill();
        }
        let group = rustix::process::Pid::from_raw(self.child.id() as i32).expect("a child's pid");
        rustix::process::kill_process_group(group, rustix::process::Signal::KILL)?;
        Ok(())
    }
}

impl Drop for BinaryServer {
    fn drop(&mut self) {
        let _ = self.kill();
        let _ = self.child.wait();
    }
}

fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let from = text
        .find(start)
        .map(|i| i + start.len())
        .unwrap_or_else(|| panic!("{start:?} in {text:?}"));
    let rest = &text[from..];
    &rest[..rest.find(end).unwrap_or(rest.len())]
}

/// A Pod as a ReplicaSet would create it: `generateName`, app label, allocatable IPs.
pub fn pod(namespace: &str, app: &str, generate_name: &str, allocatable: Option<&str>) -> Value {
    let mut annotations = serde_json::Map::new();
    if let Some(list) = allocatable {
        annotations.insert("ip-webhook.io/allocatable-ips".into(), json!(list));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": generate_name,
            "namespace": namespace,
            "labels": {"app": app},
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]},
    })
}

/// An AdmissionReview for a Pod.
pub fn review(
    version: &str,
    uid: &str,
    operation: &str,
    object: Option<Value>,
    old: Option<Value>,
    dry_run: bool,
) -> Value {
    let namespace = object
        .as_ref()
        .or(old.as_ref())
        .and_then(|o| o["metadata"]["namespace"].as_str())
        .unwrap_or("default")
        .to_string();
    json!({
        "apiVersion": format!("admission.k8s.io/{version}"),
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": object,
            "oldObject": old,
            "dryRun": dry_run,
        }
    })
}

/// An AdmissionReview (v1) of any object, `gvk` = (group, version, kind); the resource is the
/// kind's plural, the name and namespace are the object's (or the old object's).
pub fn object_review(
    uid: &str,
    gvk: (&str, &str, &str),
    operation: &str,
    object: Option<Value>,
    old: Option<Value>,
) -> Value {
    let (group, version, kind) = gvk;
    let meta = object
        .as_ref()
        .or(old.as_ref())
        .map(|o| o["metadata"].clone())
        .unwrap_or(json!({}));
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": format!("{}s", kind.to_lowercase())},
            "name": meta["name"],
            "namespace": meta["namespace"],
            "operation": operation,
            "object": object,
            "oldObject": old,
        }
    })
}

pub fn create(uid: &str, pod: Value) -> Value {
    review("v1", uid, "CREATE", Some(pod), None, false)
}

/// The DELETE review the API server sends for a stored `pod`, with `gracePeriodSeconds`.
pub fn delete_review(pod: &k8s_openapi::api::core::v1::Pod, grace: i64) -> Value {
    let mut review = review(
        "v1",
        &format!("delete-{}", pod.metadata.uid.as_deref().unwrap_or("x")),
        "DELETE",
        None,
        Some(serde_json::to_value(pod).unwrap()),
        false,
    );
    review["request"]["name"] = json!(pod.metadata.name);
    review["request"]["options"] = json!({"gracePeriodSeconds": grace});
    review
}

/// Decode the base64 JSON Patch of a response.
pub fn patch_of(response: &Value) -> Value {
    use base64::Engine;
    let encoded = response["patch"]
        .as_str()
        .expect("response has a base64 patch string");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .expect("base64");
    serde_json::from_slice(&bytes).expect("patch is JSON")
}

/// Apply a response's patch with an independent RFC 6902 implementation.
pub fn apply(pod: &Value, response: &Value) -> Value {
    let patch: json_patch::Patch =
        serde_json::from_value(patch_of(response)).expect("RFC 6902 patch");
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &patch).expect("patch applies");
    patched
}

pub fn allocated_ip(response: &Value) -> String {
    patch_of(response)
        .as_array()
        .unwrap()
        .iter()
        .find(|op| op["path"] == "/metadata/labels/ip-webhook.io~1allocated-ip")
        .and_then(|op| op["value"].as_str())
        .expect("patch sets the allocated-ip label")
        .to_string()
}

pub async fn wait_for<F: Fn() -> bool>(what: &str, timeout: Duration, check: F) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Poll `check` until it returns `Some`, for up to `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A denial's message (empty for an allowed review).
pub fn message(response: &Value) -> String {
    response["status"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// The value of one counter series of `metrics` as `/metrics` shows it, e.g.
/// `ip_webhook_tls_client_refusals_total{reason="name"}`, for a counter whose series exist
/// from the start: a series `/metrics` does not show fails the test.
pub fn counter(metrics: &ip_webhook::metrics::Metrics, series: &str) -> u64 {
    let text = metrics.encode();
    let name = series.split('{').next().unwrap();
    let family = name.strip_suffix("_total").unwrap_or(name);
    assert!(
        text.contains(&format!("# TYPE {family} counter\n")),
        "no counter {family} in /metrics:\n{text}"
    );
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no series {series} in /metrics:\n{text}"))
}
