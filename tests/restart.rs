//! `kill -9` of the real binary under load loses no acknowledged claim, and a restart never
//! hands an acknowledged IP to anyone else.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use ip_webhook_ledger::embedded::CommitCounters;
use ip_webhook_ledger::{EmbeddedLedger, Ledger};
use tokio::sync::Mutex;

const LIST: &str = "10.30.0.0/22";

async fn load_held(dir: &std::path::Path) -> HashMap<String, String> {
    let ledger =
        EmbeddedLedger::open(dir, CommitCounters::default()).expect("ledger reopens after kill -9");
    let claims = ledger.load().await.unwrap();
    ledger.close().await;
    claims
        .into_iter()
        .filter(|c| c.is_held())
        .map(|c| (c.ip.to_string(), c.request_uid.into()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_keeps_every_acknowledged_claim() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().to_str().unwrap().to_string();
    let mut acknowledged: HashMap<String, String> = HashMap::new(); // ip -> request uid

    for round in 0..3 {
        let mut server = BinaryServer::start(&["--state-dir", &dir]);
        let ca = std::fs::read(state.path().join("ca.crt")).unwrap();
        let client = HttpsClient::new(server.https_addr, &ca);
        let acked = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
        let mut tasks = Vec::new();
        for i in 0..150 {
            let client = client.clone();
            let acked = acked.clone();
            let uid = format!("r{round}-{i}");
            let body = create(&uid, pod("prod", "api", "api-", Some(LIST))).to_string();
            tasks.push(tokio::spawn(async move {
                if let Ok(reply) = client.post("/mutate", body).await
                    && reply.status == 200
                {
                    let response = reply.json()["response"].clone();
                    assert_eq!(response["allowed"], true, "{response}");
                    acked.lock().await.push((allocated_ip(&response), uid));
                }
            }));
        }
        // kill while requests are in flight
        let target = 40 + round * 20;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while acked.lock().await.len() < target && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        server.kill9();
        for task in tasks {
            task.await.unwrap();
        }
        let round_acked = acked.lock().await.clone();
        assert!(
            round_acked.len() >= target,
            "round {round}: only {} answers before the kill",
            round_acked.len()
        );
        for (ip, uid) in round_acked {
            let previous = acknowledged.insert(ip.clone(), uid.clone());
            assert!(
                previous.is_none(),
                "IP {ip} acknowledged to {uid} was acknowledged before to {previous:?}"
            );
        }

        let held = load_held(state.path()).await;
        for (ip, uid) in &acknowledged {
            assert_eq!(
                held.get(ip),
                Some(uid),
                "acknowledged claim {ip} for {uid} lost after kill -9"
            );
        }
    }

    // after the last restart, new pods never get an acknowledged IP
    let server = BinaryServer::start(&["--state-dir", &dir]);
    let ca = std::fs::read(state.path().join("ca.crt")).unwrap();
    let client = HttpsClient::new(server.https_addr, &ca);
    let mut fresh = HashSet::new();
    for i in 0..50 {
        let body = create(
            &format!("after-{i}"),
            pod("prod", "api", "api-", Some(LIST)),
        )
        .to_string();
        let response = client.post("/mutate", body).await.unwrap().response();
        let ip = allocated_ip(&response);
        assert!(
            !acknowledged.contains_key(&ip),
            "{ip} handed out twice across a restart"
        );
        assert!(fresh.insert(ip));
    }
}
