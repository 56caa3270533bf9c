//! A ledger wrapper that times every call into `ip_webhook_ledger_operation_seconds`,
//! whatever the adapter underneath.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use futures::FutureExt;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use super::health::{self, LedgerHealth};
use super::{Claim, CreateOutcome, Ledger, LedgerError};

/// The labels of the latency histogram [`TimedLedger`] records into.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct LedgerLabels {
    /// `embedded`, `kubernetes`, `etcd`, `memory`.
    pub(crate) ledger: &'static str,
    /// `create`, `release`, `load`.
    pub(crate) operation: &'static str,
}

pub struct TimedLedger {
    inner: Arc<dyn Ledger>,
    latency: Family<LedgerLabels, Histogram>,
    /// `latency`'s `create` series, looked up once: every grant observes it, and a lookup
    /// takes the family's lock and hashes the labels.
    create_latency: Histogram,
    health: Arc<LedgerHealth>,
}

impl TimedLedger {
    #[cfg(test)]
    pub(crate) fn wrap(
        inner: Arc<dyn Ledger>,
        latency: Family<LedgerLabels, Histogram>,
    ) -> Arc<dyn Ledger> {
        TimedLedger::wrap_watched(inner, latency, Arc::new(LedgerHealth::new()))
    }

    /// `TimedLedger::wrap`, counting failures into `health` (what `/readyz` reads).
    pub fn wrap_watched(
        inner: Arc<dyn Ledger>,
        latency: Family<LedgerLabels, Histogram>,
        health: Arc<LedgerHealth>,
    ) -> Arc<dyn Ledger> {
        // a clone shares the series it was cloned from
        let create_latency = latency
            .get_or_create(&LedgerLabels {
                ledger: inner.kind(),
                operation: "create",
            })
            .clone();
        Arc::new(TimedLedger {
            inner,
            latency,
            create_latency,
            health,
        })
    }

    /// Run `call`, timing it under `operation` and telling the health tracker how it went.
    async fn measured<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, LedgerError>>,
    ) -> Result<T, LedgerError> {
        let started = Instant::now();
        let result = call.await;
        let seconds = started.elapsed().as_secs_f64();
        match operation {
            "create" => self.create_latency.observe(seconds),
            _ => self
                .latency
                .get_or_create(&LedgerLabels {
                    ledger: self.inner.kind(),
                    operation,
                })
                .observe(seconds),
        }
        self.count(&result);
        result
    }

    fn count<T>(&self, result: &Result<T, LedgerError>) {
        match result {
            Ok(_) => self.health.success(),
            Err(LedgerError::Storage(error)) => self.health.failure(error),
            Err(full @ LedgerError::DiskFull { .. }) => self.health.disk_full(&full.to_string()),
            Err(_) => {}
        }
    }

    /// Run `call` bounded by `deadline`, in place (no task of its own: an extra task per call
    /// costs a spawn and a cross-task wake-up on every admission). A call still running at the
    /// deadline is answered with an error and handed, as it is, to a task that finishes it;
    /// `late` gets its result (to undo a write nobody was told about). The call is never
    /// dropped half-way, so a write the ledger already took is always seen through.
    async fn bounded<T: Send + 'static, C: Send + 'static>(
        &self,
        operation: &'static str,
        deadline: Instant,
        call: impl Future<Output = (Result<T, LedgerError>, C)> + Send + 'static,
        late: impl FnOnce(Result<T, LedgerError>, C) -> BoxFuture + Send + 'static,
    ) -> Result<T, LedgerError> {
        // a panic in the adapter is an answer, as it was when the call had a task of its own
        let mut call = Box::pin(AssertUnwindSafe(call).catch_unwind());
        match tokio::time::timeout_at(deadline.into(), call.as_mut()).await {
            Ok(Ok((result, _))) => result,
            Ok(Err(_)) => Err(LedgerError::Storage(format!(
                "the ledger {operation} stopped: it panicked"
            ))),
            Err(_) => {
                tokio::spawn(async move {
                    if let Ok((result, context)) = call.await {
                        late(result, context).await;
                    }
                });
                Err(LedgerError::Storage(format!(
                    "the {} ledger did not answer the {operation} within the admission deadline (--admission-deadline)",
                    self.inner.kind()
                )))
            }
        }
    }
}

type BoxFuture = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

fn nothing<T>(_: T, _: ()) -> BoxFuture {
    Box::pin(async {})
}

#[async_trait]
impl Ledger for TimedLedger {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn load(&self) -> Result<Vec<Claim>, LedgerError> {
        self.measured("load", self.inner.load()).await
    }

    async fn load_shared(&self) -> Result<Vec<Arc<Claim>>, LedgerError> {
        self.measured("load", self.inner.load_shared()).await
    }

    async fn create(&self, claim: Arc<Claim>) -> Result<CreateOutcome, LedgerError> {
        let call = async {
            match health::deadline() {
                None => self.inner.create(claim).await,
                Some(deadline) => {
                    let inner = self.inner.clone();
                    self.bounded(
                        "create",
                        deadline,
                        async move {
                            let result = inner.create(claim.clone()).await;
                            (result, (inner, claim))
                        },
                        |late, (undo, made)| {
                            Box::pin(async move {
                                // the admission was already denied: a claim that landed anyway is rolled back
                                if matches!(late, Ok(CreateOutcome::Created)) {
                                    match undo.release(&made).await {
                                        Ok(_) => tracing::warn!(ip = %made.ip, "rolled back a claim made after the admission deadline"),
                                        Err(error) => tracing::warn!(%error, ip = %made.ip, "could not roll back a claim made after the admission deadline; the reservation TTL or leak sweeper frees it"),
                                    }
                                }
                            })
                        },
                    )
                    .await
                }
            }
        };
        self.measured("create", call).await
    }

    async fn release(&self, claim: &Claim) -> Result<bool, LedgerError> {
        let call = async {
            match health::deadline() {
                None => self.inner.release(claim).await,
                Some(deadline) => {
                    let (inner, owned) = (self.inner.clone(), claim.clone());
                    self.bounded(
                        "release",
                        deadline,
                        async move { (inner.release(&owned).await, ()) },
                        nothing,
                    )
                    .await
                }
            }
        };
        self.measured("release", call).await
    }

    async fn transition(&self, current: &Claim, next: &Claim) -> Result<bool, LedgerError> {
        let call = async {
            match health::deadline() {
                None => self.inner.transition(current, next).await,
                Some(deadline) => {
                    let (inner, current, next) =
                        (self.inner.clone(), current.clone(), next.clone());
                    self.bounded(
                        "transition",
                        deadline,
                        async move { (inner.transition(&current, &next).await, ()) },
                        nothing,
                    )
                    .await
                }
            }
        };
        self.measured("transition", call).await
    }

    async fn get(&self, ip: std::net::IpAddr) -> Result<Option<Claim>, LedgerError> {
        self.measured("get", self.inner.get(ip)).await
    }

    fn shared(&self) -> bool {
        self.inner.shared()
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        let result = self.inner.ping().await;
        self.count(&result);
        result
    }

    async fn close(&self) {
        self.inner.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryLedger, PodRef};

    /// A reservation of 10.0.0.1 for no pod yet, by request `r` with token `token`.
    fn reserved(token: &str) -> Claim {
        Claim {
            pod: PodRef::default(),
            ..crate::test_claims::builder("10.0.0.1", "web", "")
                .request("r")
                .token(token)
                .at(0)
                .build()
        }
    }

    #[tokio::test]
    async fn every_call_is_observed_under_its_operation() {
        let latency = Family::<LedgerLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.001].into_iter())
        });
        let ledger = TimedLedger::wrap(Arc::new(MemoryLedger::new()), latency.clone());
        let claim = reserved("");
        ledger.create(claim.clone().into()).await.unwrap();
        ledger.create(claim.clone().into()).await.unwrap();
        assert!(ledger.release(&claim).await.unwrap());
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("op", "ops", latency);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"op_count{ledger="memory",operation="create"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"op_count{ledger="memory",operation="release"} 1"#),
            "{text}"
        );
        assert!(!text.contains(r#"operation="load""#), "{text}");
    }

    /// A memory ledger whose creates take `delay`.
    struct Slow {
        inner: MemoryLedger,
        delay: std::time::Duration,
    }

    #[async_trait]
    impl Ledger for Slow {
        fn kind(&self) -> &'static str {
            "slow"
        }
        async fn load(&self) -> Result<Vec<Claim>, LedgerError> {
            self.inner.load().await
        }
        async fn create(&self, claim: Arc<Claim>) -> Result<CreateOutcome, LedgerError> {
            tokio::time::sleep(self.delay).await;
            self.inner.create(claim).await
        }
        async fn release(&self, claim: &Claim) -> Result<bool, LedgerError> {
            self.inner.release(claim).await
        }
        async fn transition(&self, current: &Claim, next: &Claim) -> Result<bool, LedgerError> {
            self.inner.transition(current, next).await
        }
    }

    #[tokio::test]
    async fn a_create_past_the_admission_deadline_is_denied_then_rolled_back() {
        let slow = Arc::new(Slow {
            inner: MemoryLedger::new(),
            delay: std::time::Duration::from_millis(300),
        });
        let health = Arc::new(LedgerHealth::new());
        let latency = Family::<LedgerLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.001].into_iter())
        });
        let ledger = TimedLedger::wrap_watched(slow.clone(), latency, health.clone());
        let claim = reserved("t");
        let started = Instant::now();
        let deadline = started + std::time::Duration::from_millis(100);
        let error = health::with_deadline(deadline, ledger.create(claim.clone().into()))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            started.elapsed() < std::time::Duration::from_millis(250),
            "answered at the deadline, not when the ledger did"
        );
        assert!(error.contains("within the admission deadline"), "{error}");
        // the create lands at 300 ms; the rollback follows it
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        let records = slow.load().await.unwrap();
        assert!(
            records.iter().all(|c| !c.is_held()),
            "the late claim is still held: {records:?}"
        );
        // without a deadline (the reconciler, the release timer) the call just takes its time
        let claim = Claim {
            ip: "10.0.0.2".parse().unwrap(),
            ..claim
        };
        assert_eq!(
            ledger.create(claim.clone().into()).await.unwrap(),
            CreateOutcome::Created
        );
        assert!(
            slow.load()
                .await
                .unwrap()
                .iter()
                .any(|c| c.ip == claim.ip && c.is_held())
        );
    }
}
