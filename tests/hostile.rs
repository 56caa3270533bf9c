//! A catalog of hostile requests over real HTTPS to the real binary: every one gets a clear
//! answer (a 4xx with a Status message, or a denial with a message; the few that are legal
//! but extreme get a grant, fast), the server stays up, and its memory stays bounded.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{BinaryServer, HttpsClient, create, pod};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const FIXTURE: &str = include_str!("fixtures/pod-create-v1.json");

/// What a catalog entry must get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// HTTP 4xx with a metav1.Status message.
    Status(u16),
    /// HTTP 200, allowed: false, with a message.
    Denied,
    /// Legal but extreme: HTTP 200, allowed, with a patch.
    Granted,
}

enum Body {
    Bytes(Vec<u8>),
    /// Raw HTTP/1.1 request bytes, written as is after the TLS handshake.
    Raw(Vec<u8>),
}

struct Case {
    name: String,
    content_type: Option<&'static str>,
    method: &'static str,
    path: &'static str,
    body: Body,
    expect: Expect,
}

fn case(name: &str, body: impl Into<Vec<u8>>, expect: Expect) -> Case {
    Case {
        name: name.to_string(),
        content_type: Some("application/json"),
        method: "POST",
        path: "/mutate",
        body: Body::Bytes(body.into()),
        expect,
    }
}

fn fixture() -> Value {
    serde_json::from_str(FIXTURE).unwrap()
}

/// The fixture review with `edit` applied.
fn edited(edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut review = fixture();
    edit(&mut review);
    review.to_string().into_bytes()
}

/// A pod review whose allocatable list is `list` (uid unique per case).
fn with_list(uid: &str, list: &str) -> Vec<u8> {
    create(uid, pod("hostile", "h", "h-", Some(list)))
        .to_string()
        .into_bytes()
}

/// A pod review carrying `annotation: value` besides a valid list.
fn with_annotation(uid: &str, annotation: &str, value: &str) -> Vec<u8> {
    let mut p = pod("hostile", "h", "h-", Some("10.77.0.0/24"));
    p["metadata"]["annotations"][annotation] = json!(value);
    create(uid, p).to_string().into_bytes()
}

fn nested(depth: usize, open: &str, close: &str) -> String {
    format!("{}{}", open.repeat(depth), close.repeat(depth))
}

fn catalog() -> Vec<Case> {
    use Expect::*;
    let half = &FIXTURE.as_bytes()[..FIXTURE.len() / 2];
    let mut cases = vec![
        case("empty body", "", Status(400)),
        case("truncated JSON (half the fixture)", half, Status(400)),
        case("a lone brace", "{", Status(400)),
        case("JSON array", "[]", Status(400)),
        case("JSON null", "null", Status(400)),
        case("JSON number", "42", Status(400)),
        case("JSON string", "\"AdmissionReview\"", Status(400)),
        case("invalid UTF-8", vec![b'{', 0xff, 0xfe, b'}'], Status(400)),
        case("byte order mark", [b"\xef\xbb\xbf".as_slice(), FIXTURE.as_bytes()].concat(), Status(400)),
        case("trailing garbage", format!("{FIXTURE}xyz"), Status(400)),
        case(
            "deep nesting at the top (100k arrays)",
            format!("{{\"x\":{},\"apiVersion\":\"admission.k8s.io/v1\"}}", nested(100_000, "[", "]")),
            Status(400),
        ),
        case(
            "deep nesting in request.object (20k objects)",
            String::from_utf8(edited(|r| r["request"]["object"] = json!("PLACEHOLDER")))
                .unwrap()
                .replace("\"PLACEHOLDER\"", &nested(20_000, "{\"a\":", "}")),
            Status(400),
        ),
        case("apiVersion v2", edited(|r| r["apiVersion"] = json!("admission.k8s.io/v2")), Status(400)),
        case("apiVersion a number", edited(|r| r["apiVersion"] = json!(1)), Status(400)),
        case("kind Pod at the top", edited(|r| r["kind"] = json!("Pod")), Status(400)),
        case("no request", edited(|r| r.as_object_mut().unwrap().retain(|k, _| k != "request")), Status(400)),
        case("request is a string", edited(|r| r["request"] = json!("x")), Status(400)),
        case("empty uid", edited(|r| r["request"]["uid"] = json!("")), Status(400)),
        case("uid is a number", edited(|r| r["request"]["uid"] = json!(7)), Status(400)),
        case("unknown operation", edited(|r| r["request"]["operation"] = json!("EXPLODE")), Status(400)),
        case("no operation", edited(|r| r["request"].as_object_mut().unwrap().retain(|k, _| k != "operation")), Status(400)),
        case("operation lowercase", edited(|r| r["request"]["operation"] = json!("create")), Status(400)),
        case("object is a string", edited(|r| r["request"]["object"] = json!("pod")), Status(400)),
        case("metadata is an array", edited(|r| r["request"]["object"]["metadata"] = json!([1, 2])), Status(400)),
        case("labels is a list", edited(|r| r["request"]["object"]["metadata"]["labels"] = json!(["app"])), Status(400)),
        case("annotation value a number", edited(|r| r["request"]["object"]["metadata"]["annotations"]["ip-webhook.io/allocatable-ips"] = json!(10)), Status(400)),
        case("dryRun a string", edited(|r| r["request"]["dryRun"] = json!("yes")), Status(400)),
        case("ownerReferences an object", edited(|r| r["request"]["object"]["metadata"]["ownerReferences"] = json!({"kind": "StatefulSet"})), Status(400)),
        case(
            "duplicate apiVersion key",
            FIXTURE.replacen("\"kind\": \"AdmissionReview\",", "\"kind\": \"AdmissionReview\", \"apiVersion\": \"admission.k8s.io/v1\",", 1),
            Status(400),
        ),
        case(
            "duplicate uid key",
            FIXTURE.replacen("\"uid\": \"705ab4f5", "\"uid\": \"other\", \"uid\": \"705ab4f5", 1),
            Status(400),
        ),
        case(
            "duplicate allocatable-ips annotation, the last one malformed",
            FIXTURE.replacen(
                "\"ip-webhook.io/allocatable-ips\": \"10.0.0.10,10.0.0.11,10.0.0.20-10.0.0.29\",",
                "\"ip-webhook.io/allocatable-ips\": \"10.0.0.10\", \"ip-webhook.io/allocatable-ips\": \"10.0.0.300\",",
                1,
            ),
            Denied,
        ),
        case("10 MB string in the body", format!("{{\"x\":\"{}\"}}", "a".repeat(10 * 1024 * 1024)), Status(413)),
        case("6 MB malformed allocatable list", with_list("big-list", &"1".repeat(6 * 1024 * 1024)), Denied),
        case("100k junk entries", with_list("junk", &vec!["x"; 100_000].join(",")), Denied),
        case("list entry with a bad octet", with_list("c1", "10.0.0.1-10.0.0"), Denied),
        case("prefix length 33", with_list("c2", "10.0.0.0/33"), Denied),
        case("CIDR with host bits", with_list("c3", "10.0.0.1/24"), Denied),
        case("fullwidth digits", with_list("c4", "１０.0.0.1"), Denied),
        case("Arabic-Indic digits", with_list("c5", "١٠.٠.٠.١"), Denied),
        case("zero-width space in an IP", with_list("c6", "10.0.0.1\u{200b}"), Denied),
        case("right-to-left override in an IP", with_list("c7", "\u{202e}10.0.0.1"), Denied),
        case("IPv6 zone", with_list("c8", "fe80::1%eth0"), Denied),
        case("reversed range", with_list("c9", "10.0.0.10-10.0.0.1"), Denied),
        case("range mixing families", with_list("c10", "10.0.0.1-fd00::1"), Denied),
        case("overlapping entries", with_list("c11", "10.0.0.0/24,10.0.0.5"), Denied),
        case("duplicate entries", with_list("c12", "10.0.0.5,10.0.0.5"), Denied),
        case("negative number as an IP", with_list("c13", "-1"), Denied),
        case("octet 256", with_list("c14", "10.0.0.256"), Denied),
        case("leading-zero octet", with_list("c15", "010.0.0.1"), Denied),
        case("only separators", with_list("c16", ",;,\n,"), Denied),
        case("calico annotation not JSON", with_annotation("a1", "cni.projectcalico.org/ipAddrs", "10.77.0.5"), Denied),
        case("calico annotation two IPv4", with_annotation("a2", "cni.projectcalico.org/ipAddrs", "[\"10.77.0.5\",\"10.77.0.6\"]"), Denied),
        case("calico annotation numbers", with_annotation("a3", "cni.projectcalico.org/ipAddrs", "[1,2]"), Denied),
        case("calico annotation nested 10k deep", with_annotation("a4", "cni.projectcalico.org/ipAddrs", &nested(10_000, "[", "]")), Denied),
        case("calico annotation empty array", with_annotation("a5", "cni.projectcalico.org/ipAddrs", "[]"), Denied),
        case("ovn annotation with empty items", with_annotation("a6", "ovn.kubernetes.io/ip_address", "10.77.0.5,,,"), Denied),
        case("ovn annotation unicode", with_annotation("a7", "ovn.kubernetes.io/ip_address", "10.77.0.５"), Denied),
        case("static IP outside the list", with_annotation("a8", "cni.projectcalico.org/ipAddrs", "[\"192.168.1.1\"]"), Denied),
        case("unknown IP pool", with_annotation("a9", "ip-webhook.io/ip-pool", "no-such-pool"), Denied),
        // legal but extreme: answered fast, without materialising the range
        case("a /8 list", with_list("g1", "10.0.0.0/8"), Granted),
        case("the whole IPv4 space", with_list("g2", "0.0.0.0/0"), Granted),
        case("the whole IPv6 space", with_list("g3", "::/0"), Granted),
        case("a 2^64 IPv6 range and a /8", with_list("g4", "fd00::-fd00::ffff:ffff:ffff:ffff,11.0.0.0/8"), Granted),
        case(
            "50k distinct single IPs",
            with_list("g5", &(0..50_000u32).map(|i| format!("12.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255)).collect::<Vec<_>>().join(",")),
            Granted,
        ),
    ];
    for (name, ordinal) in [
        ("negative ordinal", "-1"),
        ("ordinal past u64", "18446744073709551616"),
        ("ordinal past the list", "99999"),
    ] {
        let mut p = pod("hostile", "sts", "", Some("10.78.0.0/28"));
        p["metadata"]["name"] = json!(format!("sts-{ordinal}"));
        p["metadata"]["ownerReferences"] = json!([{"kind": "StatefulSet", "name": "sts", "controller": true, "apiVersion": "apps/v1", "uid": "u"}]);
        cases.push(case(
            name,
            create(&format!("o{ordinal}"), p).to_string(),
            Granted,
        ));
    }
    let transport = [
        (
            "text/plain content type",
            Some("text/plain"),
            "POST",
            "/mutate",
            Status(415),
        ),
        ("no content type", None, "POST", "/mutate", Status(415)),
        (
            "GET",
            Some("application/json"),
            "GET",
            "/mutate",
            Status(405),
        ),
        (
            "DELETE method",
            Some("application/json"),
            "DELETE",
            "/validate",
            Status(405),
        ),
        (
            "path traversal",
            Some("application/json"),
            "POST",
            "/mutate/../../etc/passwd",
            Status(404),
        ),
    ];
    for (name, content_type, method, path, expect) in transport {
        cases.push(Case {
            name: name.into(),
            content_type,
            method,
            path,
            body: Body::Bytes(FIXTURE.as_bytes().to_vec()),
            expect,
        });
    }
    cases.push(Case {
        name: "Content-Length of 8 MiB declared".into(),
        content_type: None,
        method: "POST",
        path: "/mutate",
        body: Body::Raw(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 8388608\r\n\r\n{".to_vec()),
        expect: Status(413),
    });
    let mut chunked = b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..10 {
        chunked.extend(format!("{:x}\r\n", 1024 * 1024).as_bytes());
        chunked.extend(vec![b' '; 1024 * 1024]);
        chunked.extend(b"\r\n");
    }
    chunked.extend(b"0\r\n\r\n");
    cases.push(Case {
        name: "10 MiB chunked without a length".into(),
        content_type: None,
        method: "POST",
        path: "/mutate",
        body: Body::Raw(chunked),
        expect: Status(413),
    });
    cases.push(Case {
        name: "body shorter than its Content-Length".into(),
        content_type: None,
        method: "POST",
        path: "/mutate",
        body: Body::Raw(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{\"apiVersion\":".to_vec()),
        expect: Status(408),
    });
    cases
}

/// Write raw request bytes while reading the reply (the server may answer, e.g. 413, before
/// the body is all sent); return (status, body) of the reply.
async fn send_raw(client: &HttpsClient, raw: &[u8]) -> Result<(u16, Bytes), String> {
    let tcp = tokio::net::TcpStream::connect(client.addr)
        .await
        .map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(client.config.clone())
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .map_err(|e| e.to_string())?;
    let (mut reader, mut writer) = tokio::io::split(tls);
    let raw = raw.to_vec();
    let writing = tokio::spawn(async move {
        let _ = writer.write_all(&raw).await;
        let _ = writer.flush().await;
        writer
    });
    let mut reply = Vec::new();
    let mut buffer = vec![0u8; 64 * 1024];
    // (head end, body length) once the head is in
    let mut head: Option<(usize, usize)> = None;
    let head_end = loop {
        if head.is_none()
            && let Some(end) = reply.windows(4).position(|w| w == b"\r\n\r\n")
        {
            let text = String::from_utf8_lossy(&reply[..end]).to_ascii_lowercase();
            let length = text
                .lines()
                .find_map(|l| {
                    l.strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>())
                })
                .and_then(Result::ok)
                .ok_or_else(|| format!("a reply without Content-Length: {text:?}"))?;
            head = Some((end + 4, length));
        }
        if let Some((end, length)) = head
            && reply.len() >= end + length
        {
            break end;
        }
        match reader.read(&mut buffer).await {
            Ok(0) | Err(_) => {
                return Err(format!(
                    "connection closed after {:?}",
                    String::from_utf8_lossy(&reply[..reply.len().min(300)])
                ));
            }
            Ok(n) => reply.extend_from_slice(&buffer[..n]),
        }
    };
    writing.abort();
    let text = String::from_utf8_lossy(&reply[..head_end]);
    let status: u16 = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no HTTP reply: {text:?}"))?;
    Ok((status, Bytes::copy_from_slice(&reply[head_end..])))
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

async fn check(client: &HttpsClient, case: &Case) {
    let started = Instant::now();
    let (status, body) = match &case.body {
        Body::Bytes(bytes) if bytes.len() > 1024 * 1024 => {
            let mut raw = format!(
                "{} {} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                case.method,
                case.path,
                bytes.len()
            )
            .into_bytes();
            raw.extend_from_slice(bytes);
            send_raw(client, &raw)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", case.name))
        }
        Body::Bytes(bytes) => {
            let reply = client
                .request(
                    case.method,
                    case.path,
                    case.content_type,
                    Bytes::from(bytes.clone()),
                )
                .await
                .unwrap_or_else(|e| panic!("{}: no answer: {e}", case.name));
            (reply.status.as_u16(), reply.body)
        }
        Body::Raw(raw) => send_raw(client, raw)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", case.name)),
    };
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(10),
        "{}: answered only after {elapsed:?}",
        case.name
    );
    let json: Value = serde_json::from_slice(&body).unwrap_or_else(|e| {
        panic!(
            "{}: HTTP {status} with a body that is not JSON ({e}): {:?}",
            case.name,
            String::from_utf8_lossy(&body[..body.len().min(300)])
        )
    });
    match case.expect {
        Expect::Status(code) => {
            assert_eq!(status, code, "{}: {json}", case.name);
            assert_eq!(json["kind"], "Status", "{}: {json}", case.name);
            assert!(
                !json["message"].as_str().unwrap_or("").is_empty(),
                "{}: no message: {json}",
                case.name
            );
        }
        Expect::Denied => {
            assert_eq!(status, 200, "{}: {json}", case.name);
            assert_eq!(json["response"]["allowed"], false, "{}: {json}", case.name);
            let message = json["response"]["status"]["message"].as_str().unwrap_or("");
            assert!(
                !message.is_empty(),
                "{}: a denial without a message",
                case.name
            );
            assert!(
                message.len() < 4096,
                "{}: a {}-byte message",
                case.name,
                message.len()
            );
        }
        Expect::Granted => {
            assert_eq!(status, 200, "{}: {json}", case.name);
            assert_eq!(json["response"]["allowed"], true, "{}: {json}", case.name);
            assert!(
                json["response"]["patch"].is_string(),
                "{}: no patch: {json}",
                case.name
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_catalog_gets_clear_answers_and_memory_stays_bounded() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().display().to_string();
    let mut server = BinaryServer::start(&["--state-dir", &dir, "--read-timeout", "2s"]);
    let ca = std::fs::read(state.path().join("ca.crt")).unwrap();
    let client = HttpsClient::new(server.https_addr, &ca);
    let pid = server.child.id();
    let cases = catalog();
    assert!(cases.len() >= 50, "the catalog has {} cases", cases.len());
    let mut after_round = Vec::new();
    for round in 0..3 {
        for case in &cases {
            check(&client, case).await;
            assert!(
                server.child.try_wait().unwrap().is_none(),
                "the server died on {}",
                case.name
            );
        }
        after_round.push(rss_kib(pid, "VmRSS:"));
        eprintln!(
            "round {round}: {} cases, RSS {} KiB, peak {} KiB",
            cases.len(),
            after_round[round],
            rss_kib(pid, "VmHWM:")
        );
    }
    let peak = rss_kib(pid, "VmHWM:");
    assert!(peak < 384 * 1024, "peak RSS {peak} KiB");
    assert!(
        after_round[2] < after_round[0] + 48 * 1024,
        "RSS grows round over round: {after_round:?} KiB"
    );
    // still serving normally
    let (code, _) = common::http_get(server.admin_addr, "/readyz").await;
    assert_eq!(code, 200);
    let fine = client.post("/mutate", FIXTURE).await.unwrap().response();
    assert_eq!(fine["allowed"], true);
    server.kill9();
}
