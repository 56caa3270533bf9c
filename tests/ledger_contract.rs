//! The allocator and ledger contract, as a property over any interleaving of claim, release,
//! expire (a release made elsewhere, e.g. by a reconciler or another replica), retry and
//! restart, run against every ledger adapter that runs in-process: memory, embedded (redb
//! in a temp dir) and etcd (a real single-member etcd on loopback; skipped when absent).
//!
//! After every step: one holder per IP; the allocator's view, the ledger's records and the
//! model agree; a released or expired IP can be allocated again.

// The etcd cases need the `etcd` feature; scripts/test.sh builds with --all-features.
#[cfg(feature = "etcd")]
#[path = "common/etcd_cluster.rs"]
mod etcd_cluster;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ip_webhook::allocator::{AllocError, AllocationRequest, Allocator};
use ip_webhook::ipset::{IpSet, parse_ip_spec};
use ip_webhook::ledger::embedded::CommitCounters;
use ip_webhook::ledger::{Claim, EmbeddedLedger, Ledger, MemoryLedger, ObservedChange, PodRef};
#[cfg(feature = "etcd")]
use ip_webhook::ledger::{EtcdLedger, EtcdOptions};
use proptest::prelude::*;

const LIST: &str = "10.0.0.1-10.0.0.6";
const SIZE: usize = 6;

#[derive(Debug, Clone)]
enum Op {
    Claim(u8),
    Release(u8),
    Expire(u8),
    Retry(u8),
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..9).prop_map(Op::Claim),
        2 => (0u8..9).prop_map(Op::Release),
        2 => (0u8..9).prop_map(Op::Expire),
        1 => (0u8..9).prop_map(Op::Retry),
        1 => Just(Op::Restart),
    ]
}

enum Backend {
    Memory,
    Embedded(PathBuf),
    #[cfg(feature = "etcd")]
    Etcd {
        endpoint: String,
        prefix: String,
    },
}

impl Backend {
    async fn open(&self, previous: Option<Arc<dyn Ledger>>) -> Arc<dyn Ledger> {
        match self {
            // nothing survives a memory ledger's restart: keep the same one
            Backend::Memory => previous.unwrap_or_else(|| Arc::new(MemoryLedger::new())),
            Backend::Embedded(dir) => {
                if let Some(previous) = previous {
                    previous.close().await;
                    drop(previous);
                }
                Arc::new(EmbeddedLedger::open(dir, CommitCounters::default()).unwrap())
            }
            #[cfg(feature = "etcd")]
            Backend::Etcd { endpoint, prefix } => {
                if let Some(previous) = previous {
                    previous.close().await;
                }
                Arc::new(
                    EtcdLedger::connect(&EtcdOptions {
                        endpoints: vec![endpoint.clone()],
                        prefix: prefix.clone(),
                        timeout: Duration::from_secs(10),
                        ..EtcdOptions::default()
                    })
                    .await
                    .unwrap(),
                )
            }
        }
    }
}

fn pod(n: u8) -> PodRef {
    PodRef {
        namespace: "default".into(),
        name: format!("p{n}"),
        ..Default::default()
    }
}

fn request<'a>(set: &'a IpSet, n: u8, uid: &'a str) -> AllocationRequest<'a> {
    AllocationRequest {
        scope: "app default/web",
        app: "web",
        pool: None,
        pod: pod(n),
        request_uid: uid,
        candidates: set,
        ordinal: None,
        dry_run: false,
    }
}

/// The model: which pod holds which IP, under which request uid.
type Model = HashMap<u8, (IpAddr, String)>;

async fn check_agreement(
    model: &Model,
    allocator: &Allocator,
    ledger: &dyn Ledger,
) -> Result<(), TestCaseError> {
    let mut seen = HashMap::new();
    for (n, (ip, _)) in model {
        prop_assert!(seen.insert(*ip, *n).is_none(), "{} held by two pods", ip);
    }
    let claims = allocator.claims();
    prop_assert_eq!(
        claims.len(),
        model.len(),
        "allocator view {:?} vs model {:?}",
        claims,
        model
    );
    for claim in &claims {
        let n: u8 = claim.pod.name[1..].parse().unwrap();
        prop_assert_eq!(model.get(&n).map(|(ip, _)| *ip), Some(claim.ip));
    }
    let mut held: Vec<Claim> = ledger
        .load()
        .await
        .unwrap()
        .into_iter()
        .filter(Claim::is_held)
        .collect();
    held.sort_by_key(|c| c.ip);
    prop_assert_eq!(
        held.len(),
        model.len(),
        "ledger records {:?} vs model {:?}",
        held,
        model
    );
    for claim in &held {
        let n: u8 = claim.pod.name[1..].parse().unwrap();
        prop_assert_eq!(model.get(&n), Some(&(claim.ip, claim.request_uid.clone())));
    }
    Ok(())
}

async fn run(backend: Backend, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let set = parse_ip_spec(LIST).unwrap();
    let mut ledger = backend.open(None).await;
    let mut allocator = Allocator::new(ledger.clone()).await.unwrap();
    let mut model: Model = HashMap::new();
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Claim(n) | Op::Retry(n) if !model.contains_key(&n) => {
                let uid = format!("u{step}");
                match allocator.allocate(&request(&set, n, &uid)).await {
                    Ok(got) => {
                        prop_assert_eq!(got.ips.len(), 1);
                        model.insert(n, (got.ips[0], uid));
                    }
                    Err(AllocError::Exhausted(message)) => {
                        prop_assert_eq!(
                            model.len(),
                            SIZE,
                            "refused with free IPs left: {}",
                            message
                        );
                    }
                    Err(other) => return Err(TestCaseError::fail(format!("step {step}: {other}"))),
                }
            }
            Op::Retry(n) => {
                // the same admission again (the API server retried): the same answer
                let (ip, uid) = model[&n].clone();
                let got = allocator.allocate(&request(&set, n, &uid)).await.unwrap();
                prop_assert_eq!(got.ips, vec![ip]);
            }
            // the pod holds an IP already; its name is not admitted twice
            Op::Claim(_) => {}
            Op::Release(n) => {
                if let Some((ip, _)) = model.remove(&n) {
                    let released = allocator
                        .release_pod("default", &format!("p{n}"), None, &[ip])
                        .await
                        .unwrap();
                    prop_assert_eq!(released, vec![ip]);
                }
            }
            Op::Expire(n) => {
                if let Some((ip, _)) = model.remove(&n) {
                    // released by someone else, straight in the ledger; the allocator hears of
                    // it as a watch would tell it
                    let claim = allocator
                        .holder(&ip)
                        .expect("the allocator knows the holder");
                    prop_assert!(ledger.release(&claim).await.unwrap());
                    allocator.apply_observed(ObservedChange::Released(claim));
                }
            }
            Op::Restart => {
                drop(allocator);
                ledger = backend.open(Some(ledger)).await;
                allocator = Allocator::new(ledger.clone()).await.unwrap();
            }
        }
        check_agreement(&model, &allocator, ledger.as_ref()).await?;
    }
    ledger.close().await;
    Ok(())
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn memory_ledger_keeps_the_contract(ops in proptest::collection::vec(op(), 1..60)) {
        block_on(run(Backend::Memory, ops))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn embedded_ledger_keeps_the_contract(ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        block_on(run(Backend::Embedded(dir.path().to_path_buf()), ops))?;
    }
}

/// A one-member etcd for one test; stopped when the test ends (dropped), so no member
/// outlives the test process.
#[cfg(feature = "etcd")]
fn etcd_member(test: &str) -> Option<(etcd_cluster::EtcdCluster, String)> {
    let binary = etcd_cluster::etcd_binary(test)?;
    let cluster = etcd_cluster::EtcdCluster::start(&binary, 1);
    let endpoint = cluster.endpoints()[0].clone();
    Some((cluster, endpoint))
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_ledger_keeps_the_contract() {
    let Some((_member, endpoint)) = etcd_member("etcd_ledger_keeps_the_contract") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(16));
    let case = std::cell::Cell::new(0usize);
    let result = runner.run(&proptest::collection::vec(op(), 1..40), |ops| {
        case.set(case.get() + 1);
        let prefix = format!("/contract/{}/", case.get());
        block_on(run(
            Backend::Etcd {
                endpoint: endpoint.clone(),
                prefix,
            },
            ops,
        ))
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// Two replicas on one etcd: each one's index learns the other's claims and releases through
/// the watch, without having to collide with them first.
#[cfg(feature = "etcd")]
#[test]
fn etcd_watch_keeps_another_replicas_index_fresh() {
    let Some((_member, endpoint)) = etcd_member("etcd_watch_keeps_another_replicas_index_fresh")
    else {
        return;
    };
    block_on(async {
        let set = parse_ip_spec(LIST).unwrap();
        let mut replicas = Vec::new();
        for _ in 0..2 {
            // as `app` wires it: one ledger serves the allocator and feeds it the watch
            let etcd = Arc::new(
                EtcdLedger::connect(&EtcdOptions {
                    endpoints: vec![endpoint.clone()],
                    prefix: "/watch-test/".into(),
                    ..EtcdOptions::default()
                })
                .await
                .unwrap(),
            );
            let allocator = Arc::new(Allocator::new(etcd.clone()).await.unwrap());
            let weak = Arc::downgrade(&allocator);
            tokio::spawn(async move {
                etcd.watch(|change| {
                    if let Some(allocator) = weak.upgrade() {
                        allocator.apply_observed(change);
                    }
                })
                .await
            });
            replicas.push(allocator);
        }
        let (a, b) = (&replicas[0], &replicas[1]);
        let got = a.allocate(&request(&set, 1, "w1")).await.unwrap();
        let ip = got.ips[0];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while b.holder(&ip).is_none() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "replica b never saw {ip} claimed"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(b.holder(&ip).unwrap().request_uid, "w1");
        // b's next choice skips the IP without a collision
        let next = b.allocate(&request(&set, 2, "w2")).await.unwrap();
        assert_ne!(next.ips[0], ip);
        a.release_pod("default", "p1", None, &[ip]).await.unwrap();
        while b.holder(&ip).is_some() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "replica b never saw {ip} released"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // and b hands the released IP out again
        let again = b.allocate(&request(&set, 3, "w3")).await.unwrap();
        assert_eq!(again.ips[0], ip);
    });
}
