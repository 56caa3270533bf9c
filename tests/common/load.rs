//! Concurrent Pod CREATE load against one or more webhook replicas, and the bookkeeping the
//! race and crash tests check.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use serde_json::Value;

use super::{HttpsClient, allocated_ip, create, pod};

/// What one client saw for one review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// HTTP 200, allowed, and a patch naming the IP.
    Granted(IpAddr),
    /// HTTP 200, not allowed, with this message.
    Denied(String),
    /// No AdmissionReview answer (connection refused or cut, or a non-200 status).
    Failed(String),
}

/// A replica that can be replaced (restarted on another port) while load runs.
pub type Slot = Arc<RwLock<HttpsClient>>;

pub fn slot(client: HttpsClient) -> Slot {
    Arc::new(RwLock::new(client))
}

/// One review of a ReplicaSet-style pod of `app` whose list is `list`.
pub fn app_review(app: &str, list: &str, uid: &str) -> Value {
    create(uid, pod("load", app, &format!("{app}-"), Some(list)))
}

pub async fn send(client: &HttpsClient, review: &Value) -> Outcome {
    match client.post("/mutate", review.to_string()).await {
        Err(error) => Outcome::Failed(error),
        Ok(reply) if reply.status != 200 => Outcome::Failed(format!(
            "HTTP {}: {}",
            reply.status,
            String::from_utf8_lossy(&reply.body)
        )),
        Ok(reply) => {
            let response = reply.json()["response"].clone();
            assert_eq!(
                response["uid"], review["request"]["uid"],
                "the answer echoes the request uid"
            );
            if response["allowed"] == true {
                let ip = allocated_ip(&response);
                Outcome::Granted(ip.parse().unwrap_or_else(|_| panic!("granted {ip:?}")))
            } else {
                let message = response["status"]["message"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                assert!(
                    !message.is_empty(),
                    "a denial without a message: {response}"
                );
                Outcome::Denied(message)
            }
        }
    }
}

/// One unit of load: which app, which replica.
#[derive(Debug, Clone)]
pub struct Job {
    pub app: String,
    pub list: String,
    pub uid: String,
    pub replica: usize,
}

/// Run `jobs` with at most `concurrency` in flight; results in job order.
pub async fn run(slots: &[Slot], jobs: Vec<Job>, concurrency: usize) -> Vec<(Job, Outcome)> {
    run_counting(slots, jobs, concurrency, Default::default()).await
}

/// `run`, counting finished jobs in `done` (for tests that act mid-run).
pub async fn run_counting(
    slots: &[Slot],
    jobs: Vec<Job>,
    concurrency: usize,
    done: Arc<std::sync::atomic::AtomicUsize>,
) -> Vec<(Job, Outcome)> {
    let semaphore = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut tasks = Vec::with_capacity(jobs.len());
    for job in jobs {
        let permit = semaphore.clone().acquire_owned().await.unwrap();
        let client = slots[job.replica].read().unwrap().clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let outcome = send(&client, &app_review(&job.app, &job.list, &job.uid)).await;
            drop(permit);
            done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            (job, outcome)
        }));
    }
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await.expect("load task"));
    }
    results
}

/// Tally of a run, with the promises every run must keep checked on the way.
#[derive(Debug, Default)]
pub struct Tally {
    pub granted: BTreeMap<IpAddr, String>,
    pub granted_per_app: HashMap<String, usize>,
    pub denied_per_app: HashMap<String, Vec<String>>,
    pub failed: Vec<String>,
}

impl Tally {
    /// Panics on an IP granted twice, or granted outside the app's list.
    pub fn add(&mut self, results: &[(Job, Outcome)], in_list: impl Fn(&str, &IpAddr) -> bool) {
        for (job, outcome) in results {
            match outcome {
                Outcome::Granted(ip) => {
                    assert!(
                        in_list(&job.app, ip),
                        "{ip} granted to {} is not in its list",
                        job.app
                    );
                    if let Some(first) = self.granted.insert(*ip, job.uid.clone()) {
                        panic!("{ip} granted twice: to {first} and to {}", job.uid);
                    }
                    *self.granted_per_app.entry(job.app.clone()).or_default() += 1;
                }
                Outcome::Denied(message) => self
                    .denied_per_app
                    .entry(job.app.clone())
                    .or_default()
                    .push(message.clone()),
                Outcome::Failed(error) => self.failed.push(error.clone()),
            }
        }
    }

    pub fn total(&self) -> usize {
        self.granted.len()
            + self.denied_per_app.values().map(Vec::len).sum::<usize>()
            + self.failed.len()
    }
}
