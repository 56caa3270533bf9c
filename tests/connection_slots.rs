//! Connection slots under a flood of connections that never send a ClientHello: with
//! `--client-ca-file` and `--max-connections 50`, the API server's requests (its client
//! certificate signed by the client CA) are served while 60 silent connections are kept open
//! against the server, and every silent connection is closed within the handshake deadline
//! (`--handshake-timeout`, 3 s by default). The real binary is run, so
//! `IP_WEBHOOK_TEST_BINARY` can measure another build the same way.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::client_ca::{ca, client_cert, client_config};
use common::{BinaryServer, HttpsClient};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

const FIXTURE: &str = include_str!("fixtures/pod-create-v1.json");
/// The default `--handshake-timeout`.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(3);
/// Scheduling slack on a loaded machine (the server's timers are not exact either).
const SLACK: Duration = Duration::from_secs(1);

/// How long `stream` stays open from `opened` until the server closes it (EOF or reset), or
/// `None` if it is still open at `until`.
async fn open_for(mut stream: TcpStream, opened: Instant, until: Instant) -> Option<Duration> {
    let mut byte = [0u8; 1];
    match tokio::time::timeout_at(until, stream.read(&mut byte)).await {
        Ok(Ok(0)) | Ok(Err(_)) => Some(opened.elapsed()),
        Ok(Ok(_)) => panic!("the server sent bytes to a client that sent no ClientHello"),
        Err(_) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_is_served_while_silent_connections_hold_the_slots() {
    let dir = tempfile::tempdir().unwrap();
    let client_ca = ca("kubernetes front-proxy CA");
    let ca_file = dir.path().join("client-ca.crt");
    std::fs::write(&ca_file, &client_ca.pem).unwrap();
    let state = dir.path().join("state");
    let server = BinaryServer::start(&[
        "--state-dir",
        state.to_str().unwrap(),
        "--ledger",
        "embedded",
        "--client-ca-file",
        ca_file.to_str().unwrap(),
        "--client-allowed-names",
        "kube-apiserver",
        "--max-connections",
        "50",
    ]);
    let addr = server.https_addr;
    let serving_ca = std::fs::read(state.join("ca.crt")).unwrap();
    let apiserver = HttpsClient {
        addr,
        config: client_config(
            &serving_ca,
            Some(&client_cert(&client_ca, "kube-apiserver", &[])),
        ),
    };
    let served = async |client: &HttpsClient| match client.post("/mutate", FIXTURE).await {
        Ok(reply) => reply.response()["allowed"] == true,
        Err(_) => false,
    };
    assert!(served(&apiserver).await, "served before the flood");

    // 60 flooders, each keeping one silent connection open: when the server closes it, the
    // flooder opens another (after 50 ms)
    let stop = Arc::new(AtomicBool::new(false));
    let mut flooders = Vec::new();
    for _ in 0..60 {
        let stop = stop.clone();
        flooders.push(tokio::spawn(async move {
            let mut lifetimes = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let Ok(stream) = TcpStream::connect(addr).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let opened = Instant::now();
                // checked every 100 ms for the stop
                let mut stream = Some(stream);
                while let Some(open) = stream.take() {
                    let mut byte = [0u8; 1];
                    let mut open = open;
                    match tokio::time::timeout(Duration::from_millis(100), open.read(&mut byte))
                        .await
                    {
                        Ok(Ok(0)) | Ok(Err(_)) => lifetimes.push(opened.elapsed()),
                        Ok(Ok(_)) => panic!("bytes sent to a client that sent no ClientHello"),
                        Err(_) if stop.load(Ordering::Relaxed) => {
                            // still open at the stop: its age so far is a lower bound
                            lifetimes.push(opened.elapsed());
                        }
                        Err(_) => stream = Some(open),
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            lifetimes
        }));
    }
    // let the flood take the slots
    tokio::time::sleep(Duration::from_millis(500)).await;
    let flood_started = Instant::now();
    let mut ok = 0;
    for _ in 0..30 {
        if served(&apiserver).await {
            ok += 1;
        }
    }
    let requests_took = flood_started.elapsed();
    // keep flooding past the deadline and its slack (a connection held longer shows), then stop
    let flood_for = HANDSHAKE_DEADLINE + SLACK + Duration::from_millis(500);
    tokio::time::sleep(flood_for.saturating_sub(requests_took)).await;
    stop.store(true, Ordering::Relaxed);
    let mut lifetimes = Vec::new();
    for flooder in flooders {
        lifetimes.extend(flooder.await.unwrap());
    }
    let longest = lifetimes.iter().max().copied().unwrap_or_default();

    // a few silent connections, fewer than the handshake budget: no newcomer pushes them out,
    // the handshake deadline closes them
    let opened = Instant::now();
    let until = opened + HANDSHAKE_DEADLINE + SLACK;
    let mut silent = Vec::new();
    for _ in 0..5 {
        silent.push(tokio::spawn(open_for(
            TcpStream::connect(addr).await.unwrap(),
            opened,
            until,
        )));
    }
    let mut closed_after = Vec::new();
    for task in silent {
        closed_after.push(task.await.unwrap());
    }
    eprintln!(
        "API server requests served during the flood: {ok} of 30 (in {requests_took:?}); flood connections: {} opened, the longest open {longest:?}; 5 silent connections closed after {closed_after:?}",
        lifetimes.len()
    );
    assert_eq!(ok, 30, "API server requests served during the flood");
    assert!(
        longest <= HANDSHAKE_DEADLINE + SLACK,
        "a flood connection stayed open {longest:?}"
    );
    for after in closed_after {
        let after = after.expect("a silent connection still open past the handshake deadline");
        assert!(
            after >= HANDSHAKE_DEADLINE - Duration::from_millis(100),
            "closed after {after:?}, before the deadline: by what?"
        );
    }
    assert!(served(&apiserver).await, "served after the flood");
}
