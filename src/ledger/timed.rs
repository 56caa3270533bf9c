//! A ledger wrapper that times every call into `ip_webhook_ledger_operation_seconds`,
//! whatever the adapter underneath.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use super::{Claim, CreateOutcome, Ledger, LedgerError};
use crate::metrics::LedgerLabels;

pub struct TimedLedger {
    inner: Arc<dyn Ledger>,
    latency: Family<LedgerLabels, Histogram>,
}

impl TimedLedger {
    pub fn wrap(
        inner: Arc<dyn Ledger>,
        latency: Family<LedgerLabels, Histogram>,
    ) -> Arc<dyn Ledger> {
        Arc::new(TimedLedger { inner, latency })
    }

    fn observe(&self, operation: &'static str, started: Instant) {
        self.latency
            .get_or_create(&LedgerLabels {
                ledger: self.inner.kind(),
                operation,
            })
            .observe(started.elapsed().as_secs_f64());
    }
}

#[async_trait]
impl Ledger for TimedLedger {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn load(&self) -> Result<Vec<Claim>, LedgerError> {
        let started = Instant::now();
        let result = self.inner.load().await;
        self.observe("load", started);
        result
    }

    async fn create(&self, claim: &Claim) -> Result<CreateOutcome, LedgerError> {
        let started = Instant::now();
        let result = self.inner.create(claim).await;
        self.observe("create", started);
        result
    }

    async fn release(&self, claim: &Claim) -> Result<bool, LedgerError> {
        let started = Instant::now();
        let result = self.inner.release(claim).await;
        self.observe("release", started);
        result
    }

    async fn transition(&self, current: &Claim, next: &Claim) -> Result<bool, LedgerError> {
        let started = Instant::now();
        let result = self.inner.transition(current, next).await;
        self.observe("transition", started);
        result
    }

    async fn close(&self) {
        self.inner.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{MemoryLedger, Phase, PodRef, Source};

    #[tokio::test]
    async fn every_call_is_observed_under_its_operation() {
        let latency = Family::<LedgerLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.001].into_iter())
        });
        let ledger = TimedLedger::wrap(Arc::new(MemoryLedger::new()), latency.clone());
        let claim = Claim {
            ip: "10.0.0.1".parse().unwrap(),
            app: "web".into(),
            pool: None,
            pod: PodRef::default(),
            request_uid: "r".into(),
            phase: Phase::Reserved,
            source: Source::Allocated,
            created_at: 0,
            updated_at: 0,
            list_size: None,
            token: String::new(),
            release_at: None,
            sticky: false,
        };
        ledger.create(&claim).await.unwrap();
        ledger.create(&claim).await.unwrap();
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
}
