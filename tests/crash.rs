//! The embedded ledger under `kill -9` at random points of a load, and SIGTERM with admissions
//! in flight: nothing granted is ever lost, nothing is ever granted twice.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{BinaryServer, HttpsClient, allocated_ip, load};
use ip_webhook_ledger::embedded::CommitCounters;
use ip_webhook_ledger::{EmbeddedLedger, Ledger};
use load::{Job, Tally};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LIST: &str = "10.60.0.0/20";

fn in_list(_app: &str, ip: &std::net::IpAddr) -> bool {
    ip_webhook_ipam::ipset::parse_ip_spec(LIST)
        .unwrap()
        .contains(ip)
}

fn start(state_dir: &Path, extra: &[&str]) -> (BinaryServer, HttpsClient) {
    let dir = state_dir.display().to_string();
    let mut args = vec!["--state-dir", dir.as_str()];
    args.extend_from_slice(extra);
    let server = BinaryServer::start(&args);
    let ca = std::fs::read(state_dir.join("ca.crt")).unwrap();
    let client = HttpsClient::new(server.https_addr, &ca);
    (server, client)
}

async fn held_claims(state_dir: &Path) -> std::collections::HashMap<std::net::IpAddr, String> {
    let ledger = EmbeddedLedger::open(state_dir, CommitCounters::default())
        .expect("ledger reopens after the crash");
    let claims = ledger.load().await.unwrap();
    ledger.close().await;
    claims
        .into_iter()
        .filter(|c| c.is_held())
        .map(|c| (c.ip, c.request_uid.into()))
        .collect()
}

/// A small deterministic generator; the seed is printed so a failure can be replayed.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_ledger_kill9_at_random_points_loses_and_duplicates_nothing() {
    const ROUNDS: usize = 4;
    const PER_ROUND: usize = 500;
    let seed = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("CRASH_SEED={seed}");
    let mut rng = Rng(seed);
    let state = tempfile::tempdir().unwrap();
    let mut tally = Tally::default();
    for round in 0..ROUNDS {
        let dir = state.path().to_path_buf();
        let (mut server, client) = tokio::task::spawn_blocking(move || start(&dir, &[]))
            .await
            .unwrap();
        let jobs: Vec<Job> = (0..PER_ROUND)
            .map(|i| Job {
                app: "crash".into(),
                list: LIST.into(),
                uid: format!("round{round}-{i}"),
                replica: 0,
            })
            .collect();
        let done = Arc::new(AtomicUsize::new(0));
        let slots = vec![load::slot(client)];
        let load_task = {
            let done = done.clone();
            tokio::spawn(async move { load::run_counting(&slots, jobs, 32, done).await })
        };
        let kill_at = 50 + rng.below(PER_ROUND as u64 - 150) as usize;
        while done.load(Ordering::Relaxed) < kill_at {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        server.kill9();
        let results = load_task.await.unwrap();
        let before = tally.granted.len();
        tally.add(&results, in_list);
        let granted = tally.granted.len() - before;
        eprintln!(
            "round {round}: killed after {kill_at} answers; {granted} granted, {} failed so far",
            tally.failed.len()
        );
        assert!(
            granted >= kill_at / 2,
            "round {round}: the kill came under load"
        );
        for (_, outcome) in &results {
            if let load::Outcome::Denied(message) = outcome {
                panic!("nothing should be refused with a /20 list: {message}");
            }
        }
        // after each crash, the reopened ledger holds every IP a client saw granted
        let held = held_claims(state.path()).await;
        for (ip, uid) in &tally.granted {
            assert_eq!(
                held.get(ip),
                Some(uid),
                "{ip} granted to {uid} is not in the ledger after kill -9"
            );
        }
    }
    assert_eq!(tally.total(), ROUNDS * PER_ROUND);
}

/// Send the head and half the body of a review on a raw TLS connection; the rest later.
async fn half_sent(
    client: &HttpsClient,
    body: &[u8],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(client.addr).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(client.config.clone());
    let mut tls = connector
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(&body[..body.len() / 2]).await.unwrap();
    tls.flush().await.unwrap();
    tls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_admissions_and_they_are_durable() {
    const IN_FLIGHT: usize = 16;
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().to_path_buf();
    let (mut server, client) =
        tokio::task::spawn_blocking(move || start(&dir, &["--shutdown-grace", "20s"]))
            .await
            .unwrap();
    let reviews: Vec<Vec<u8>> = (0..IN_FLIGHT)
        .map(|i| {
            load::app_review("drain", LIST, &format!("drain-{i}"))
                .to_string()
                .into_bytes()
        })
        .collect();
    let mut streams = Vec::new();
    for review in &reviews {
        streams.push(half_sent(&client, review).await);
    }
    // the requests are in flight: heads parsed, bodies half read
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = server.child.id().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    // the listener closes: new connections are refused while the old ones drain
    let deadline = Instant::now() + Duration::from_secs(5);
    while tokio::net::TcpStream::connect(client.addr).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "still accepting 5 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut granted = Vec::new();
    for (stream, review) in streams.iter_mut().zip(&reviews) {
        stream.write_all(&review[review.len() / 2..]).await.unwrap();
        stream.flush().await.unwrap();
    }
    for (i, mut stream) in streams.into_iter().enumerate() {
        let mut reply = Vec::new();
        let _ = stream.read_to_end(&mut reply).await;
        let text = String::from_utf8_lossy(&reply);
        assert!(
            text.starts_with("HTTP/1.1 200"),
            "in-flight review {i} was not answered: {text:?}"
        );
        let body = &text[text.find("\r\n\r\n").expect("a full HTTP reply") + 4..];
        let review: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(review["response"]["allowed"], true, "{body}");
        granted.push((allocated_ip(&review["response"]), format!("drain-{i}")));
    }
    let exit = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = server.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not exit after draining"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap();
    assert!(exit.success(), "exit after SIGTERM: {exit:?}");
    let held = held_claims(state.path()).await;
    assert_eq!(held.len(), IN_FLIGHT);
    for (ip, uid) in granted {
        assert_eq!(
            held.get(&ip.parse().unwrap()),
            Some(&uid),
            "{ip} answered during the drain is durable"
        );
    }
}
