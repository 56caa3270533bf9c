//! Memory under a flood of distinct allocatable lists: the real binary, 250 dry-run Pod CREATEs
//! over HTTPS, each with its own list as large as Kubernetes lets an annotation be, and the
//! server's resident memory read from /proc. Dry runs record nothing, so all that could grow is
//! what parsing keeps: the parse cache (bounded in bytes) and the sets (sized by their ranges).
//! And memory per held claim: the binary started on a state dir of 200,000 claims.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::{BinaryServer, claims, pod, review};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde_json::Value;

/// The API server's limit on all of an object's annotations together, keys included
/// (apimachinery `TotalAnnotationSizeLimitB`, `pkg/api/validation/objectmeta.go`).
const ANNOTATION_LIMIT: usize = 256 * 1024;
const KEY: &str = "ip-webhook.io/allocatable-ips";
const PLACEHOLDER: &str = "@@list@@";
/// The bound the issue set: resident memory stays less than this over idle through the flood.
const RSS_BOUND_KIB: u64 = 64 * 1024;

/// IPv4 addresses from 10.0.0.1, `step` apart, as many as fit in `room` bytes of list: step 1
/// collapses into one range, step 2 is one range per IP.
fn tail(step: u32, room: usize) -> String {
    let base = u32::from(std::net::Ipv4Addr::new(10, 0, 0, 1));
    let mut text = String::new();
    for k in 0.. {
        let ip = std::net::Ipv4Addr::from(base + k * step).to_string();
        if text.len() + 1 + ip.len() > room {
            break;
        }
        text.push(',');
        text.push_str(&ip);
    }
    text
}

/// List `n`: an IP of its own (10.255.x.y, so every list's text differs and none is a cache
/// hit) and then `tail`, as large together as the annotation limit allows.
fn list_head(n: u32) -> String {
    std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 255, 0, 0)) + n).to_string()
}

/// `VmRSS` or `VmHWM` of `pid`, in KiB.
fn memory_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// One keep-alive HTTPS connection that posts reviews to /mutate and returns each response.
struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Connection {
    async fn open(server: &BinaryServer, config: Arc<rustls::ClientConfig>) -> Connection {
        let tcp = tokio::net::TcpStream::connect(server.https_addr)
            .await
            .unwrap();
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(connection);
        Connection { sender }
    }

    async fn mutate(&mut self, body: Vec<u8>) -> Value {
        let request = hyper::Request::post("/mutate")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let response = self.sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice::<Value>(&body).unwrap()["response"].clone()
    }
}

/// Send dry-run CREATEs, one per list head in `heads`, each with `tail` after its head, over
/// two connections at once; every one must be allowed (its list parsed and used).
async fn flood(
    server: &BinaryServer,
    config: &Arc<rustls::ClientConfig>,
    heads: Vec<u32>,
    tail: &Arc<String>,
) {
    // the review around a placeholder, the list spliced in as text (it needs no escaping):
    // serializing 256 KiB through serde_json per request would be most of this test's time
    let template = review(
        "v1",
        "flood",
        "CREATE",
        Some(pod("flood", "web", "web-", Some(PLACEHOLDER))),
        None,
        true,
    )
    .to_string();
    let (before, after) = template.split_once(PLACEHOLDER).unwrap();
    let (before, after) = (Arc::new(before.to_string()), Arc::new(after.to_string()));
    let halves: Vec<Vec<u32>> = vec![
        heads.iter().copied().step_by(2).collect(),
        heads.iter().copied().skip(1).step_by(2).collect(),
    ];
    let mut tasks = Vec::new();
    for half in halves {
        let mut connection = Connection::open(server, config.clone()).await;
        let (before, after, tail) = (before.clone(), after.clone(), tail.clone());
        tasks.push(tokio::spawn(async move {
            for n in half {
                let head = list_head(n);
                let mut body =
                    String::with_capacity(before.len() + head.len() + tail.len() + after.len());
                body.push_str(&before);
                body.push_str(&head);
                body.push_str(&tail);
                body.push_str(&after);
                let response = connection.mutate(body.into_bytes()).await;
                assert_eq!(response["allowed"], true, "{response}");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_lists_as_large_as_an_annotation_do_not_grow_memory() {
    let state = tempfile::tempdir().unwrap();
    let server = BinaryServer::start(&[
        "--state-dir",
        state.path().to_str().unwrap(),
        "--ledger",
        "embedded",
    ]);
    let pid = server.child.id();
    let ca = std::fs::read(state.path().join("ca.crt")).unwrap();
    let config = common::client_config(&ca);
    // as large as the API server lets the annotations be (the head is at most 14 bytes)
    let room = ANNOTATION_LIMIT - KEY.len() - 14;
    let plain = Arc::new(tail(1, room));
    let every_other = Arc::new(tail(2, room));
    assert!(KEY.len() + list_head(255).len() + every_other.len() <= ANNOTATION_LIMIT);
    assert!(every_other.len() > room - 16, "filled to the limit");
    let plain_ips = plain.split(',').count();
    let every_other_ips = every_other.split(',').count();
    assert!(
        every_other_ips >= 17_000,
        "{every_other_ips} single-IP ranges"
    );

    // idle, after one review has warmed up TLS and the handler
    flood(
        &server,
        &config,
        vec![1000],
        &Arc::new(",10.1.0.1".to_string()),
    )
    .await;
    let idle = memory_kib(pid, "VmRSS");

    // 125 plain lists: each collapses into one range (and its head)
    flood(&server, &config, (0..125).collect(), &plain).await;
    let after_plain = memory_kib(pid, "VmRSS");
    let peak_plain = memory_kib(pid, "VmHWM");
    // 125 lists of single IPs: one range per IP
    flood(&server, &config, (125..250).collect(), &every_other).await;
    let after_every_other = memory_kib(pid, "VmRSS");
    let peak = memory_kib(pid, "VmHWM");
    eprintln!(
        "RSS idle {idle} KiB; after 125 plain lists ({plain_ips} IPs, 1 range each) {after_plain} KiB (peak {peak_plain} KiB); after 125 every-other-IP lists ({every_other_ips} ranges each) {after_every_other} KiB (peak {peak} KiB)"
    );
    assert!(
        peak - idle < RSS_BOUND_KIB,
        "peak RSS {peak} KiB through the flood is {} KiB over idle ({idle} KiB), past {RSS_BOUND_KIB} KiB",
        peak - idle
    );
}

/// What one held claim may cost in resident memory: its copy (shared by the allocator's index
/// and the journal), the indexes by IP, request, token and app, and the B-tree nodes. The goal
/// is 512 B; measured 454–467 B (a 168-byte claim in mimalloc's 192-byte class with its `Arc`, its
/// request UID and token, the maps by IP built with full nodes: docs/performance.md, "Memory
/// per held claim"). The budget leaves that measurement a few percent of room.
const CLAIM_BUDGET_BYTES: u64 = 480;
const HELD_CLAIMS: u32 = 200_000;

/// A claim as `/mutate` records it for a ReplicaSet's pod: a 36-character request UID, a
/// 32-digit token, no pod name or UID yet.
fn held_claim(n: u32) -> ip_webhook_ledger::Claim {
    let ip = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 64, 0, 0)) + n);
    claims::builder(&ip.to_string(), "web", "")
        .generate_name("web-7d4b9c8f6d-")
        .request(&format!("5f0c8a9e-3b1d-4c7a-9e2f-{n:012}"))
        .list_size(1 << 22)
        .token(&format!("{n:032x}"))
        .at(1_764_460_800)
        .build()
}

/// `VmRSS` of a server started on `state` once `/readyz` answers 200, and how long that took.
async fn ready_rss_kib(state: &std::path::Path) -> (u64, std::time::Duration) {
    let started = std::time::Instant::now();
    let server = BinaryServer::start(&[
        "--state-dir",
        state.to_str().unwrap(),
        "--ledger",
        "embedded",
    ]);
    while common::http_get(server.admin_addr, "/readyz").await.0 != 200 {
        assert!(started.elapsed().as_secs() < 60, "not ready within 60 s");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let took = started.elapsed();
    (memory_kib(server.child.id(), "VmRSS"), took)
}

/// 200,000 held claims cost at most CLAIM_BUDGET_BYTES of resident memory each in the server that
/// loaded them (against the same server on an empty state dir). Debug and release builds lay
/// the claims and indexes out alike; the time to ready is printed, not judged here (it is a
/// release build's figure: `scripts/bench-open-loop.sh`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_claim_stays_within_its_resident_memory_budget() {
    use ip_webhook_ledger::{EmbeddedLedger, Ledger};
    let full = tempfile::tempdir().unwrap();
    {
        let ledger = Arc::new(
            EmbeddedLedger::open(full.path(), Default::default()).expect("an empty state dir"),
        );
        let next = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let mut writers = Vec::new();
        for _ in 0..256 {
            let (ledger, next) = (ledger.clone(), next.clone());
            writers.push(tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if n >= HELD_CLAIMS {
                        break;
                    }
                    ledger.create(Arc::new(held_claim(n))).await.unwrap();
                }
            }));
        }
        for writer in writers {
            writer.await.unwrap();
        }
        ledger.close().await;
    }
    let empty = tempfile::tempdir().unwrap();
    let (empty_kib, _) = ready_rss_kib(empty.path()).await;
    let (full_kib, took) = ready_rss_kib(full.path()).await;
    let per_claim = full_kib.saturating_sub(empty_kib) * 1024 / u64::from(HELD_CLAIMS);
    eprintln!(
        "RSS at ready: {empty_kib} KiB empty, {full_kib} KiB with {HELD_CLAIMS} claims: {per_claim} B per claim; ready in {took:?} (this build)"
    );
    assert!(
        per_claim <= CLAIM_BUDGET_BYTES,
        "{per_claim} bytes of RSS per held claim ({empty_kib} KiB empty, {full_kib} KiB with {HELD_CLAIMS}), past {CLAIM_BUDGET_BYTES}"
    );
}

/// A dry-run CREATE as large as the server takes (6.5 MiB), nearly all of it the pod's
/// `k8s.v1.cni.cncf.io/networks`: an attachment of `default/storage` that asks for an IP from
/// its list, among 80,000 attachments of other networks with the fields Multus reads.
fn networks_review(uid: &str) -> Vec<u8> {
    const BODY: usize = 6_500_000;
    let mut networks = String::with_capacity(BODY);
    networks.push_str(r#"[{"name":"storage","interface":"net1"}"#);
    // its size as the review carries it, each quote escaped
    let mut escaped = networks.len() + networks.matches('"').count();
    for n in 0.. {
        if escaped > BODY - 2_000 {
            break;
        }
        let element = format!(
            r#",{{"name":"n{n}","ips":["10.9.{}.{}/16"],"cni-args":{{"k":[1,2,3,4,5,6,7,8]}}}}"#,
            n / 250 % 250,
            n % 250 + 1
        );
        escaped += element.len() + element.matches('"').count();
        networks.push_str(&element);
    }
    networks.push(']');
    let mut pod = pod("default", "web", "web-", None);
    pod["metadata"]["annotations"] = serde_json::json!({
        "k8s.v1.cni.cncf.io/networks": networks,
        "storage.default.ip-webhook.io/allocatable-ips": "10.50.0.1-10.50.0.9",
        "storage.default.ip-webhook.io/prefix-length": "24",
    });
    serde_json::to_vec(&review("v1", uid, "CREATE", Some(pod), None, true)).unwrap()
}

/// How many servers each peak is measured in: the least is kept, since one measurement moves
/// by several MiB with how the allocator happens to lay the reviews out.
const TRIES: usize = 3;

/// Peak RSS over idle (KiB) of a server started with `args` through one such review, then
/// four at once: the least of [`TRIES`] servers each.
async fn networks_review_peaks(args: &[&str], state: &std::path::Path) -> Peaks {
    let mut least = Peaks {
        one: u64::MAX,
        four: u64::MAX,
        ..Peaks::default()
    };
    for _ in 0..TRIES {
        let peaks = one_servers_networks_peaks(args, state).await;
        least = Peaks {
            one: least.one.min(peaks.one),
            four: least.four.min(peaks.four),
            ..peaks
        };
    }
    least
}

/// Peak RSS over idle (KiB) through one review and four at once, and the size of the answer
/// to one (KiB: its base64 patch and the patch it encodes).
#[derive(Debug, Default, Clone, Copy)]
struct Peaks {
    idle: u64,
    one: u64,
    four: u64,
    answer: u64,
}

/// [`networks_review_peaks`] in one server.
async fn one_servers_networks_peaks(args: &[&str], state: &std::path::Path) -> Peaks {
    let dir = state.to_str().unwrap();
    let mut all = vec!["--state-dir", dir, "--ledger", "embedded"];
    all.extend_from_slice(args);
    let server = BinaryServer::start(&all);
    let pid = server.child.id();
    let ca = std::fs::read(state.join("ca.crt")).unwrap();
    let config = common::client_config(&ca);
    let mut warm = Connection::open(&server, config.clone()).await;
    let small = serde_json::to_vec(&review(
        "v1",
        "warm",
        "CREATE",
        Some(pod("flood", "web", "web-", Some("10.1.0.1"))),
        None,
        true,
    ))
    .unwrap();
    assert_eq!(warm.mutate(small).await["allowed"], true);
    let idle = memory_kib(pid, "VmRSS");
    let body = networks_review("one");
    let answer = warm.mutate(body.clone()).await;
    assert_eq!(
        answer["allowed"],
        true,
        "{}",
        answer.to_string().chars().take(300).collect::<String>()
    );
    let one = memory_kib(pid, "VmHWM");
    let base64 = answer["patch"].as_str().map_or(0, str::len) as u64;
    let answer = (base64 + base64 * 3 / 4) / 1024;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let mut connection = Connection::open(&server, config.clone()).await;
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            connection.mutate(body).await["allowed"] == true
        }));
    }
    for task in tasks {
        assert!(task.await.unwrap());
    }
    let four = memory_kib(pid, "VmHWM");
    Peaks {
        idle,
        one: one.saturating_sub(idle),
        four: four.saturating_sub(idle),
        answer,
    }
}

/// The networks annotation is read without a value tree and written back only where it
/// changes: with `--network`, the 6.5 MiB review stays within the budget the same review
/// has without it (where the annotation is not read at all), plus the annotation written
/// back in the patch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_networks_annotation_stays_within_the_primary_paths_budget() {
    let plain = tempfile::tempdir().unwrap();
    let plain = networks_review_peaks(&[], plain.path()).await;
    let networks = tempfile::tempdir().unwrap();
    let with = networks_review_peaks(&["--network", "default/storage"], networks.path()).await;
    eprintln!(
        "peak RSS over idle, least of {TRIES} servers: without --network (idle {} KiB) one review {} KiB, four at once {} KiB; with it (idle {} KiB) {} KiB, {} KiB; the answer {} KiB",
        plain.idle, plain.one, plain.four, with.idle, with.one, with.four, with.answer
    );
    // each review's answer holds the annotation again, rewritten: its JSON Patch and the
    // patch's base64, in buffers that grow by doubling (up to twice what they hold), per
    // review in flight
    let answers = |reviews: u64| 2 * reviews * with.answer;
    assert!(
        with.four <= plain.four + answers(4) && with.one <= plain.one + answers(1),
        "with --network the review peaks {} KiB (one) and {} KiB (four at once) over idle, past the {} and {} KiB without it plus twice the {} KiB answer per review",
        with.one,
        with.four,
        plain.one,
        plain.four,
        with.answer
    );
}
