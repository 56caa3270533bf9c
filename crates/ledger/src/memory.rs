//! An in-memory ledger: for `review --dry-run`, tests and benchmarks. Nothing survives a restart.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Mutex;

use super::claim::{CreateRule, create_rule, release_of, step_of};
use super::{Claim, CreateOutcome, Ledger, LedgerError, unix_now};

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

    async fn create(&self, claim: Arc<Claim>) -> Result<CreateOutcome, LedgerError> {
        let mut claims = self.claims.lock().await;
        let existing = claims.get(&claim.ip);
        match create_rule(existing, &claim) {
            CreateRule::Write => {
                claims.insert(claim.ip, Arc::unwrap_or_clone(claim));
                Ok(CreateOutcome::Created)
            }
            CreateRule::Existing => Ok(CreateOutcome::for_existing(
                existing.cloned().expect("a rule about an existing record"),
                &claim,
            )),
            CreateRule::Held => Ok(CreateOutcome::AlreadyHeld(Box::new(
                existing.cloned().expect("a rule about an existing record"),
            ))),
        }
    }

    async fn transition(&self, current: &Claim, next: &Claim) -> Result<bool, LedgerError> {
        let mut claims = self.claims.lock().await;
        let Some(record) = claims.get_mut(&next.ip) else {
            return Ok(false);
        };
        match step_of(record, current, next) {
            Some(written) => {
                *record = written;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn release(&self, claim: &Claim) -> Result<bool, LedgerError> {
        let mut claims = self.claims.lock().await;
        match claims.get_mut(&claim.ip) {
            Some(held) => match release_of(held, claim, unix_now()) {
                Some(next) => {
                    *held = next;
                    Ok(true)
                }
                None => Ok(false),
            },
            None => Ok(false),
        }
    }
}
