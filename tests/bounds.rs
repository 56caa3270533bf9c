//! Hostile sizes, each reproduced and bounded: oversized names are refused before
//! they reach the ledger, logs or metrics; denied requests make no metrics series; slow
//! bodies cannot exhaust memory; idle and silent connections are closed on time; the
//! connection limit holds; HTTP/2 early answers arrive whole.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{BinaryServer, HttpsClient, TestServer, create, pod};
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const FIXTURE: &str = include_str!("fixtures/pod-create-v1.json");
const MIB: u64 = 1024 * 1024;

fn proc_status(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

fn rss_kib(pid: u32) -> u64 {
    proc_status(pid, "VmRSS:")
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn with_alpn(config: &Arc<rustls::ClientConfig>, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut config = (**config).clone();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

async fn tls(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// Read until the server closes the connection; how long that took (None: still open after
/// `within`).
async fn closed_after<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    started: Instant,
    within: Duration,
) -> Option<Duration> {
    let mut buffer = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => continue,
        }
    }
}

async fn metrics_text(server: &TestServer) -> String {
    let (code, text) = server.admin_get("/metrics").await;
    assert_eq!(code, 200);
    text
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// 50 forged CREATEs with 1 MB generateName, app and uid (the disk finding) and 50 with unique
/// 1 MB namespaces (the metrics finding): all denied naming the field; the ledger file and
/// `/metrics` do not grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_names_are_denied_and_stored_nowhere() {
    let server = TestServer::start(&[]).await;
    // the embedded ledger's files: its journals and snapshots
    let state_dir = server.state_dir.path().to_path_buf();
    let size = || -> u64 {
        std::fs::read_dir(&state_dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("journal.") || name.starts_with("snapshot.")
            })
            .map(|e| e.metadata().unwrap().len())
            .sum()
    };
    // a real allocation first, so the ledger file exists at its working size
    let granted = server
        .mutate(&create(
            "ok",
            pod("team", "web", "web-", Some("10.90.0.0/28")),
        ))
        .await;
    assert_eq!(granted["allowed"], true, "{granted}");
    let ledger_before = size();
    assert!(ledger_before > 0, "the allocation is in the ledger's files");
    let metrics_before = metrics_text(&server).await.len();
    let big = "a".repeat(MIB as usize);
    for i in 0..50 {
        let field = ["generateName", "app", "uid"][i % 3];
        let mut p = pod("team", "web", "web-", Some("10.90.0.0/28"));
        let mut uid = format!("forged-{i}");
        match field {
            "generateName" => p["metadata"]["generateName"] = json!(big),
            "app" => p["metadata"]["labels"]["app"] = json!(big),
            _ => uid = big.clone(),
        }
        let review = create(&uid, p);
        let reply = server
            .client
            .post("/mutate", review.to_string())
            .await
            .unwrap();
        let response = reply.response();
        assert_eq!(response["allowed"], false, "{field}");
        let message = response["status"]["message"].as_str().unwrap();
        let expected = match field {
            "generateName" => "request.object.metadata.generateName: ",
            "app" => "request.object.metadata.labels[\"app\"]: ",
            _ => "request.uid: ",
        };
        assert!(message.starts_with(expected), "{field}: {message}");
        assert!(message.len() < 300, "the message repeats the value");
    }
    for i in 0..50 {
        let namespace = format!("{i}{big}");
        let review = create(
            &format!("ns-{i}"),
            pod(&namespace, "web", "web-", Some("10.90.0.0/28")),
        );
        let response = server.validate(&review).await;
        assert_eq!(response["allowed"], false);
        assert!(
            response["status"]["message"]
                .as_str()
                .unwrap()
                .starts_with("request.namespace: "),
            "{response}"
        );
    }
    let ledger_after = size();
    let metrics_after = metrics_text(&server).await;
    eprintln!(
        "ledger {ledger_before} -> {ledger_after} bytes; /metrics {metrics_before} -> {} bytes",
        metrics_after.len()
    );
    assert!(
        ledger_after <= ledger_before + 64 * 1024,
        "the ledger grew from {ledger_before} to {ledger_after} bytes"
    );
    assert!(
        metrics_after.len() < metrics_before + 4096,
        "/metrics grew from {metrics_before} to {} bytes",
        metrics_after.len()
    );
    assert!(!metrics_after.contains("aaaaaaaaaaaaaaaa"));
    server.launched.shutdown().await;
}

/// Exhaustion denials of apps that hold nothing make no series (the names are the request's
/// own); the app that holds the IPs gets its series; `--metrics-max-apps` caps the per-app
/// gauges and counts what it leaves out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_requests_make_no_metrics_series_and_apps_are_capped() {
    let server = TestServer::start_with(|c| c.metrics_max_apps = 2).await;
    for (i, namespace) in ["one", "two", "three"].iter().enumerate() {
        let list = format!("10.91.{i}.1");
        let response = server
            .mutate(&create(
                &format!("hold-{i}"),
                pod(namespace, "web", "web-", Some(&list)),
            ))
            .await;
        assert_eq!(response["allowed"], true, "{response}");
    }
    // app one/web is exhausted: its own refusal is labelled
    let response = server
        .mutate(&create("own", pod("one", "web", "web-", Some("10.91.0.1"))))
        .await;
    assert_eq!(response["allowed"], false, "{response}");
    // 50 forged apps in fresh namespaces ask for one/web's list
    for i in 0..50 {
        let response = server
            .mutate(&create(
                &format!("forged-{i}"),
                pod(&format!("evil-{i}"), "x", "x-", Some("10.91.0.1")),
            ))
            .await;
        assert_eq!(response["allowed"], false, "{response}");
    }
    let text = metrics_text(&server).await;
    assert!(
        !text.contains("evil-"),
        "a denied request's namespace is a label"
    );
    assert_eq!(
        metric(
            &text,
            "ip_webhook_exhausted_refusals_total{app_namespace=\"one\",app=\"web\",pool=\"\"}"
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "ip_webhook_exhausted_refusals_unattributed_total"),
        50.0
    );
    let app_rows = text
        .lines()
        .filter(|l| l.starts_with("ip_webhook_app_held_ips{"))
        .count();
    assert_eq!(app_rows, 2, "three apps hold IPs, the cap is 2: {text}");
    assert_eq!(
        metric(&text, "ip_webhook_metrics_apps_left_out"),
        1.0,
        "{text}"
    );
    // the cap holds for refusal series too: one/web has one, two/web gets the second,
    // three/web's refusal is counted without a series
    for (i, namespace) in ["two", "three"].iter().enumerate() {
        let list = format!("10.91.{}.1", i + 1);
        let response = server
            .mutate(&create(
                &format!("own-{namespace}"),
                pod(namespace, "web", "web-", Some(&list)),
            ))
            .await;
        assert_eq!(response["allowed"], false, "{response}");
    }
    let text = metrics_text(&server).await;
    let series = text
        .lines()
        .filter(|l| l.starts_with("ip_webhook_exhausted_refusals_total{"))
        .count();
    assert_eq!(series, 2, "{text}");
    assert_eq!(
        metric(&text, "ip_webhook_metrics_app_series_overflow_total"),
        1.0
    );
    assert_eq!(
        metric(&text, "ip_webhook_exhausted_refusals_unattributed_total"),
        51.0
    );
    server.launched.shutdown().await;
}

/// One connection of the slow-body attack: the head declares `Content-Length: 7340022` and
/// all but the last byte of the body follows. Returns the status the server answered, if it
/// answered within `wait`.
async fn slow_body(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    wait: Duration,
) -> Option<u16> {
    const LENGTH: usize = 7_340_022;
    let stream = tls(addr, config).await.ok()?;
    let (mut reader, mut writer) = tokio::io::split(stream);
    let writing = tokio::spawn(async move {
        let head = format!(
            "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {LENGTH}\r\n\r\n"
        );
        writer.write_all(head.as_bytes()).await?;
        let chunk = vec![b' '; 64 * 1024];
        let mut sent = 0;
        while sent < LENGTH - 1 {
            let n = chunk.len().min(LENGTH - 1 - sent);
            writer.write_all(&chunk[..n]).await?;
            sent += n;
        }
        writer.flush().await?;
        // hold the connection open without the last byte
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<_, std::io::Error>(writer)
    });
    let mut reply = Vec::new();
    let mut buffer = [0u8; 1024];
    let status = tokio::time::timeout(wait, async {
        loop {
            match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => reply.extend_from_slice(&buffer[..n]),
            }
            if reply.len() >= 12 {
                return String::from_utf8_lossy(&reply[9..12]).parse().ok();
            }
        }
    })
    .await
    .ok()
    .flatten();
    writing.abort();
    status
}

/// The memory finding: 40 connections each hold a 7 MB body but its last byte. Past
/// `--max-inflight-bytes` (64 MiB) the rest get a 503 before their bodies are read, so RSS
/// stays under 128 MiB above idle, during the attack and after the read timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_body_attack_keeps_memory_bounded() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().display().to_string();
    let server = BinaryServer::start(&["--state-dir", &dir, "--read-timeout", "8s"]);
    let ca = std::fs::read(state.path().join("ca.crt")).unwrap();
    let client = HttpsClient::new(server.https_addr, &ca);
    let pid = server.child.id();
    // warm up: one ordinary review
    let fine = client.post("/mutate", FIXTURE).await.unwrap().response();
    assert_eq!(fine["allowed"], true);
    let idle = rss_kib(pid);
    let attack: Vec<_> = (0..40)
        .map(|_| {
            let config = client.config.clone();
            tokio::spawn(slow_body(server.https_addr, config, Duration::from_secs(6)))
        })
        .collect();
    // sample RSS while the bodies are held
    let mut peak = idle;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        peak = peak.max(rss_kib(pid));
    }
    let mut refused = 0;
    for task in attack {
        if task.await.unwrap() == Some(503) {
            refused += 1;
        }
    }
    let during = rss_kib(pid).max(peak);
    // the held ones run into the read timeout (408)
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = rss_kib(pid);
    let (_, metrics) = common::http_get(server.admin_addr, "/metrics").await;
    eprintln!(
        "slow-body attack: idle {idle} KiB, peak {during} KiB (+{} MiB), after the timeout {after} KiB; {refused} of 40 refused with 503",
        (during - idle) / 1024
    );
    assert!(
        refused >= 30,
        "only {refused} of 40 connections were refused early"
    );
    assert!(
        metric(
            &metrics,
            "ip_webhook_load_refusals_total{reason=\"max_inflight_bytes\"}"
        ) >= 30.0
    );
    assert!(
        during < idle + 128 * 1024,
        "RSS grew from {idle} KiB to {during} KiB"
    );
    assert!(
        after < idle + 128 * 1024,
        "RSS after the attack {after} KiB"
    );
    // still serving
    let fine = client.post("/mutate", FIXTURE).await.unwrap().response();
    assert_eq!(fine["allowed"], true);
}

/// The idle finding: a TLS handshake followed by nothing (no ALPN, http/1.1 or h2) is closed
/// after `--read-timeout`; the HTTP/2 preface alone, and an HTTP/1 keep-alive connection after
/// its request, after `--idle-timeout`; 200 silent connections give back their descriptors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_idle_connections_are_closed_on_time() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().display().to_string();
    let server = BinaryServer::start(&[
        "--state-dir",
        &dir,
        "--read-timeout",
        "1s",
        "--idle-timeout",
        "3s",
    ]);
    let ca = std::fs::read(state.path().join("ca.crt")).unwrap();
    let base = common::client_config(&ca);
    let addr = server.https_addr;
    let pid = server.child.id();

    let mut silent = Vec::new();
    for alpn in [&[][..], &[&b"http/1.1"[..]][..], &[&b"h2"[..]][..]] {
        let stream = tls(addr, with_alpn(&base, alpn)).await.unwrap();
        silent.push((
            alpn.first()
                .map(|p| String::from_utf8_lossy(p).into_owned()),
            stream,
        ));
    }
    let started = Instant::now();
    let mut preface = tls(addr, with_alpn(&base, &[b"h2"])).await.unwrap();
    // the preface and an empty SETTINGS frame, then nothing
    preface
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let mut keep_alive = tls(addr, with_alpn(&base, &[b"http/1.1"])).await.unwrap();
    let body = FIXTURE.as_bytes();
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    keep_alive.write_all(head.as_bytes()).await.unwrap();
    keep_alive.write_all(body).await.unwrap();
    let mut first = [0u8; 12];
    keep_alive.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let answered = Instant::now();

    for (alpn, mut stream) in silent {
        let closed = closed_after(&mut stream, started, Duration::from_secs(5)).await;
        let closed = closed.unwrap_or_else(|| panic!("ALPN {alpn:?}: still open after 5 s"));
        assert!(
            closed < Duration::from_millis(2500),
            "ALPN {alpn:?}: closed only after {closed:?}"
        );
    }
    let closed = closed_after(&mut preface, started, Duration::from_secs(8))
        .await
        .expect("an h2 connection without streams is closed when idle");
    assert!(
        closed >= Duration::from_millis(2500) && closed < Duration::from_secs(6),
        "h2 preface only: closed after {closed:?} (idle timeout 3 s)"
    );
    let closed = closed_after(&mut keep_alive, answered, Duration::from_secs(8))
        .await
        .expect("an idle keep-alive connection is closed");
    assert!(
        closed >= Duration::from_millis(2500) && closed < Duration::from_secs(6),
        "keep-alive: closed {closed:?} after its answer (idle timeout 3 s)"
    );

    // descriptors: 200 silent connections, all given back after the read timeout
    let fds_idle = open_fds(pid);
    // opened all at once: one after another on a loaded machine, the first would meet their
    // read timeout (1 s) before the last is open. The most descriptors the server held while
    // they opened is sampled: on a machine busy enough that 200 handshakes take near a second,
    // the first are already given back when the last completes.
    let opening = futures::future::join_all((0..200).map(|_| tls(addr, base.clone())));
    let mut opening = std::pin::pin!(opening);
    let mut fds_held = 0;
    let held: Vec<_> = loop {
        tokio::select! {
            done = &mut opening => break done,
            _ = tokio::time::sleep(Duration::from_millis(5)) => fds_held = fds_held.max(open_fds(pid)),
        }
    }
    .into_iter()
    .map(Result::unwrap)
    .collect();
    let fds_held = fds_held.max(open_fds(pid));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let fds_after = open_fds(pid);
    eprintln!(
        "descriptors: idle {fds_idle}, 200 silent connections {fds_held}, after 3 s {fds_after}"
    );
    assert!(
        fds_held >= fds_idle + 150,
        "the connections were not held: {fds_held}"
    );
    assert!(
        fds_after <= fds_idle + 5,
        "silent connections keep their descriptors: {fds_idle} -> {fds_after}"
    );
    drop(held);
}

/// `--max-connections`: past it, a connection is closed at accept (counted), and served
/// again once one ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_refused_at_accept() {
    let server = TestServer::start(&["--max-connections", "3", "--read-timeout", "2s"]).await;
    let addr = server.launched.running.https_addr;
    let config = server.client.config.clone();
    // three connections each served a request (a connection only the client thinks done with
    // its TLS handshake could still be closed for a newcomer: see docs/security.md)
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut stream = tls(addr, with_alpn(&config, &[b"http/1.1"])).await.unwrap();
        let body = FIXTURE.as_bytes();
        let head = format!(
            "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(body).await.unwrap();
        let mut first = [0u8; 12];
        stream.read_exact(&mut first).await.unwrap();
        assert_eq!(&first, b"HTTP/1.1 200");
        held.push(stream);
    }
    let refused = server.client.post("/mutate", FIXTURE).await;
    assert!(
        refused.is_err(),
        "a fourth connection was served: {:?}",
        refused.map(|r| r.status)
    );
    let text = metrics_text(&server).await;
    assert!(
        metric(
            &text,
            "ip_webhook_load_refusals_total{reason=\"max_connections\"}"
        ) >= 1.0
    );
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match server.client.post("/mutate", FIXTURE).await {
            Ok(reply) => {
                assert_eq!(reply.response()["allowed"], true);
                break;
            }
            Err(error) => assert!(Instant::now() < deadline, "never served again: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.launched.shutdown().await;
}

/// A request body whose data comes `delay` after the head, in 64 KiB frames: the server
/// answers from the head alone while the body is still on its way.
fn late_body(
    total: usize,
    delay: Duration,
) -> http_body_util::StreamBody<
    futures::stream::BoxStream<
        'static,
        Result<hyper::body::Frame<Bytes>, std::convert::Infallible>,
    >,
> {
    use futures::StreamExt;
    let chunk = Bytes::from(vec![b' '; 64 * 1024]);
    let frames = (0..total.div_ceil(chunk.len())).map(move |i| {
        let len = chunk.len().min(total - i * chunk.len());
        Ok(hyper::body::Frame::data(chunk.slice(..len)))
    });
    let stream = futures::stream::once(tokio::time::sleep(delay))
        .flat_map(move |()| futures::stream::iter(frames.clone()))
        .boxed();
    http_body_util::StreamBody::new(stream)
}

/// A server of the built binary on a fresh state dir (kept while the `TempDir` lives), and a
/// client configuration that trusts it and offers only HTTP/2.
fn h2_server() -> (tempfile::TempDir, BinaryServer, Arc<rustls::ClientConfig>) {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().display().to_string();
    let server = BinaryServer::start(&["--state-dir", &dir]);
    let ca = std::fs::read(state.path().join("ca.crt")).unwrap();
    let config = with_alpn(&common::client_config(&ca), &[b"h2"]);
    (state, server, config)
}

/// HTTP/2 through hyper's client: a 415 (6.6 KB text/plain body) and a 413 (declared 8 MiB)
/// answered from the head, with the body sent at once or a little later, arrive whole. (hyper's
/// client tolerates the reset that followed them before; the next test catches it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_early_answers_arrive_whole() {
    let (_state, server, config) = h2_server();
    let addr = server.https_addr;
    for attempt in 0..8 {
        let stream = tls(addr, config.clone()).await.unwrap();
        assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(connection);
        let (content_type, length, code) = if attempt % 2 == 0 {
            ("text/plain", 6600, 415)
        } else {
            ("application/json", 8 * MIB as usize, 413)
        };
        // half the time the body follows the head at once, half the time a little later
        let delay = Duration::from_millis(if attempt % 4 < 2 { 0 } else { 50 });
        let request = hyper::Request::post(format!("https://localhost:{}/mutate", addr.port()))
            .header("content-type", content_type)
            .header("content-length", length)
            .body(late_body(length, delay))
            .unwrap();
        let response = sender
            .send_request(request)
            .await
            .unwrap_or_else(|e| panic!("attempt {attempt}: {e:?}"));
        assert_eq!(response.status().as_u16(), code, "attempt {attempt}");
        let body = response
            .into_body()
            .collect()
            .await
            .unwrap_or_else(|e| panic!("attempt {attempt}: body: {e:?}"))
            .to_bytes();
        let status: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["code"], code);
    }
}

/// Send `length` bytes of `content_type` over a raw HTTP/2 stream; the answer's status and
/// body, and how the stream ended on our side: `Ok(())` when the whole body was sent and
/// the server reset nothing, else what went wrong.
async fn h2_exchange(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    content_type: &str,
    length: usize,
) -> (u16, Bytes, Result<(), String>) {
    use std::future::poll_fn;
    let stream = tls(addr, config).await.unwrap();
    let (client, connection) = h2::client::handshake(stream).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = http::Request::post(format!("https://localhost:{}/mutate", addr.port()))
        .header("content-type", content_type)
        .header("content-length", length)
        .body(())
        .unwrap();
    let (response, mut send) = client.send_request(request, false).unwrap();
    let sending = tokio::spawn(async move {
        let mut left = length;
        while left > 0 {
            send.reserve_capacity(left.min(64 * 1024));
            match poll_fn(|cx| send.poll_capacity(cx)).await {
                Some(Ok(0)) => continue,
                Some(Ok(n)) => {
                    let n = n.min(left);
                    if let Err(error) = send.send_data(Bytes::from(vec![b' '; n]), n == left) {
                        return Err(format!("{left} bytes unsent: {error}"));
                    }
                    left -= n;
                }
                Some(Err(error)) => return Err(format!("{left} bytes unsent: {error}")),
                None => return Err(format!("{left} bytes unsent: the stream closed")),
            }
        }
        // a reset, if one comes, comes soon after the answer
        match tokio::time::timeout(Duration::from_secs(1), poll_fn(|cx| send.poll_reset(cx))).await
        {
            Ok(Ok(reason)) if reason != h2::Reason::NO_ERROR => {
                Err(format!("the stream was reset: {reason:?}"))
            }
            _ => Ok(()),
        }
    });
    let response = response.await.expect("an answer");
    let status = response.status().as_u16();
    let bytes = h2_body(response.into_body()).await;
    (status, bytes, sending.await.unwrap())
}

/// An HTTP/2 answer's whole body, its flow-control capacity given back as it arrives.
async fn h2_body(mut body: h2::RecvStream) -> Bytes {
    let mut bytes = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("the answer's body arrives whole");
        let _ = body.flow_control().release_capacity(chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    Bytes::from(bytes)
}

/// Reviews over HTTP/2 whose bodies come in different shapes of DATA frames are each answered
/// as the same review in one piece: one frame that ends the stream, one frame then an empty one
/// that ends it, three frames, and a body under 4 KiB (the size HTTP/1 keeps a frame from).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_reviews_in_any_shape_of_frames_are_answered_whole() {
    use std::future::poll_fn;
    let (_state, server, config) = h2_server();
    let stream = tls(server.https_addr, config).await.unwrap();
    let (client, connection) = h2::client::handshake(stream).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let review = |uid: &str, compact: bool| {
        let mut review: Value = serde_json::from_str(FIXTURE).unwrap();
        review["request"]["uid"] = json!(uid);
        review["request"]["dryRun"] = json!(true);
        if compact {
            // under 4 KiB
            review["request"]["object"]["spec"] = json!({"containers": [{"name": "c"}]});
        }
        Bytes::from(review.to_string())
    };
    for (uid, compact, pieces, empty_end) in [
        ("one-frame", false, 1, false),
        ("then-an-empty-frame", false, 1, true),
        ("three-frames", false, 3, false),
        ("small", true, 1, false),
    ] {
        let body = review(uid, compact);
        assert_eq!(body.len() < 4096, compact, "{uid}: {} bytes", body.len());
        let request = http::Request::post(format!(
            "https://localhost:{}/mutate",
            server.https_addr.port()
        ))
        .header("content-type", "application/json")
        .header("content-length", body.len())
        .body(())
        .unwrap();
        let (response, mut send) = client.send_request(request, false).unwrap();
        let size = body.len().div_ceil(pieces);
        let chunks: Vec<Bytes> = body.chunks(size).map(Bytes::copy_from_slice).collect();
        let count = chunks.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            send.reserve_capacity(chunk.len());
            while poll_fn(|cx| send.poll_capacity(cx)).await.unwrap().unwrap() < chunk.len() {}
            let last = i + 1 == count && !empty_end;
            send.send_data(chunk, last).unwrap();
            if !last {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        if empty_end {
            send.send_data(Bytes::new(), true).unwrap();
        }
        let response = response.await.expect("an answer");
        assert_eq!(response.status().as_u16(), 200, "{uid}");
        let answer: Value = serde_json::from_slice(&h2_body(response.into_body()).await).unwrap();
        assert_eq!(answer["response"]["uid"], uid, "{answer}");
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
        assert!(answer["response"]["patch"].is_string(), "{uid}: {answer}");
    }
}

/// The HTTP/2 finding as curl saw it (exit 92, "stream was not closed cleanly: CANCEL"): the
/// server answered 413/415 and then reset the stream while the client was still sending.
/// Now it reads and drops the rest of the body, and the stream ends cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_early_answers_end_the_stream_without_a_reset() {
    let (_state, server, config) = h2_server();
    for (content_type, length, code) in [
        ("text/plain", 6600, 415),
        ("text/plain", 8 * MIB as usize, 415),
        ("application/json", 8 * MIB as usize, 413),
    ] {
        for attempt in 0..3 {
            let (status, body, reset) =
                h2_exchange(server.https_addr, config.clone(), content_type, length).await;
            let what = format!("{content_type}, {length} bytes, attempt {attempt}");
            assert_eq!(status, code, "{what}");
            let json: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(json["code"], code, "{what}");
            assert_eq!(reset, Ok(()), "{what}");
        }
    }
}

/// A UID with a control character (a terminal's escape sequence), sent straight to the port:
/// refused at admission, naming the field and quoting it escaped, and never stored; a claim
/// that holds one anyway (a ledger edited by hand) is shown escaped by `status -o wide`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uids_with_control_characters_are_refused_and_shown_escaped() {
    let server = TestServer::start(&[]).await;
    let escape = "\u{1b}]0;owned\u{7}\u{1b}[2J";
    let forged = create(
        &format!("r{escape}"),
        pod("team", "web", "web-", Some("10.91.0.0/28")),
    );
    let response = server.mutate(&forged).await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.starts_with("request.uid: "), "{message}");
    assert!(message.contains("\\u{1b}]0;owned"), "{message}");
    assert!(!message.chars().any(char::is_control), "{message:?}");

    let granted = server
        .mutate(&create(
            "ok-1",
            pod("team", "web", "web-", Some("10.91.0.0/28")),
        ))
        .await;
    assert_eq!(granted["allowed"], true, "{granted}");
    let mut created = common::apply(&pod("team", "web", "web-", Some("10.91.0.0/28")), &granted);
    created["metadata"]["name"] = json!("web-x1");
    created["metadata"]["uid"] = json!(format!("u{escape}"));
    let response = server.validate(&create("ok-2", created)).await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("request.object.metadata.uid: "),
        "{message}"
    );
    let state_dir = server.state_dir.path().to_path_buf();
    server.launched.shutdown().await;
    let shown = common::ip_webhook(&[
        "status",
        "--state-dir",
        &state_dir.display().to_string(),
        "-o",
        "wide",
    ]);
    assert!(shown.ok, "{}", shown.stderr);
    assert!(shown.stdout.contains("ok-1"), "{}", shown.stdout);
    assert!(!shown.stdout.contains('\u{1b}'), "{}", shown.stdout);

    // a claim that holds them anyway
    let forged_dir = tempfile::tempdir().unwrap();
    let ledger = ip_webhook_ledger::EmbeddedLedger::open(
        forged_dir.path(),
        ip_webhook_ledger::embedded::CommitCounters::default(),
    )
    .unwrap();
    let mut claim = common::claims::claim("10.91.1.1", "web", "web-1");
    claim.request_uid = format!("r{escape}").as_str().into();
    claim.pod.uid = Some(format!("u{escape}").as_str().into());
    use ip_webhook_ledger::Ledger;
    ledger.create(claim.into()).await.unwrap();
    ledger.close().await;
    drop(ledger);
    let shown = common::ip_webhook(&[
        "status",
        "--state-dir",
        &forged_dir.path().display().to_string(),
        "-o",
        "wide",
    ]);
    assert!(shown.ok, "{}", shown.stderr);
    assert!(
        !shown.stdout.chars().any(|c| c.is_control() && c != '\n'),
        "{:?}",
        shown.stdout
    );
    assert!(
        shown.stdout.contains("r\\u{1b}]0;owned\\u{7}\\u{1b}[2J"),
        "{}",
        shown.stdout
    );
}

/// Mistyped-key warnings are bounded in count, length and cost: one 6 MB `ip-webhook.io/` key,
/// or 240,000 of them, get an answer of a few KiB (five keys named, quoted to 64 bytes, the
/// rest counted), not one that quotes them all; and an admission sent beside them is answered
/// as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistyped_key_warnings_are_bounded_in_count_length_and_cost() {
    let server = TestServer::start(&[]).await;
    let long_key = format!("ip-webhook.io/{}", "k".repeat(6_000_000));
    let mut one_long = pod("team", "web", "web-", None);
    one_long["metadata"]["annotations"] = json!({ long_key.as_str(): "" });
    let mut many = pod("team", "web", "web-", None);
    let keys: serde_json::Map<String, Value> = (0..240_000)
        .map(|i| (format!("ip-webhook.io/x{i}"), json!("")))
        .collect();
    many["metadata"]["annotations"] = Value::Object(keys);
    for (name, object) in [("one 6 MB key", one_long), ("240,000 keys", many)] {
        let review = create("forged", object).to_string();
        assert!(
            review.len() < 7 * MIB as usize,
            "{name}: {} bytes",
            review.len()
        );
        let forged = {
            let client = server.client.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let reply = client.post("/mutate", review).await.unwrap();
                (reply.body.len(), reply.response(), started.elapsed())
            })
        };
        // a legitimate admission meanwhile
        let started = Instant::now();
        let granted = server
            .mutate(&create(
                &format!("ok-{}", name.len()),
                pod("team", "web", "web-", Some("10.92.0.0/28")),
            ))
            .await;
        let legit = started.elapsed();
        assert_eq!(granted["allowed"], true, "{granted}");
        let (bytes, response, took) = forged.await.unwrap();
        eprintln!("{name}: answer {bytes} bytes in {took:?}; the admission beside it {legit:?}");
        assert_eq!(response["allowed"], true, "{name}: {response}");
        let warnings = response["warnings"].as_array().unwrap();
        assert!(warnings.len() <= 6, "{name}: {} warnings", warnings.len());
        assert!(bytes < 4096, "{name}: a {bytes}-byte answer");
        // within the API server's default webhook timeout (a debug build, on a busy machine;
        // before the bound, the 6 MB key alone took 26 s here)
        let timeout = Duration::from_secs(10);
        assert!(
            took < timeout && legit < timeout,
            "{name}: {took:?}, the admission beside it {legit:?}"
        );
    }
    server.launched.shutdown().await;
}
