//! An in-memory ledger: for `review --dry-run`, tests and benchmarks. Nothing survives a restart.

use std::collections::HashMap;
use std::net::IpAddr;

use async_trait::async_trait;
use tokio::sync::Mutex;

use super::{Claim, CreateOutcome, Ledger, LedgerError, Phase, unix_now};

#[derive(Default)]
pub struct MemoryLedger {
    claims: Mutex<HashMap<IpAddr, Claim>>,
}

impl MemoryLedger {
    pub fn new() -> MemoryLedger {
        MemoryLedger::default()
    }
}

#[async_trait]
impl Ledger for MemoryLedger {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn load(&self) -> Result<Vec<Claim>, LedgerError> {
        Ok(self.claims.lock().await.values().cloned().collect())
    }

    async fn create(&self, claim: &Claim) -> Result<CreateOutcome, LedgerError> {
        let mut claims = self.claims.lock().await;
        if let Some(held) = claims.get(&claim.ip).filter(|c| c.is_held()) {
            return Ok(CreateOutcome::AlreadyHeld(Box::new(held.clone())));
        }
        claims.insert(claim.ip, claim.clone());
        Ok(CreateOutcome::Created)
    }

    async fn release(&self, claim: &Claim) -> Result<bool, LedgerError> {
        let mut claims = self.claims.lock().await;
        match claims.get_mut(&claim.ip) {
            Some(held)
                if held.is_held()
                    && held.pod == claim.pod
                    && held.request_uid == claim.request_uid =>
            {
                held.phase = Phase::Released;
                held.updated_at = unix_now();
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}
