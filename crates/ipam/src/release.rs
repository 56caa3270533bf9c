//! The release side of the allocator: what a pod's DELETE does to its claims, on whichever
//! holder and interface, and the releases the release timer makes once they are due.

use std::net::IpAddr;

use crate::allocator::Allocator;
use crate::held::identity_keys;
use ip_webhook_ledger::claim::{self, DueStep, PodIdentity, PodPresence};
use ip_webhook_ledger::pod_lookup::PodLookup;
use ip_webhook_ledger::{Claim, LedgerError, Phase, unix_now};

impl Allocator {
    /// A Pod DELETE was admitted: the pod's claims turn `Terminating` until `release_at`
    /// (unix seconds): those on `ips` (what it carries) and every other claim it holds by UID
    /// or token (`Allocator::claims_of`). The IPs stay held; `Allocator::release_due`
    /// frees them once the time has come and the pod is gone. A deletion already seen changes
    /// nothing.
    ///
    /// A VM's claim whose VM may run on in another launcher pod stays held: a live
    /// migration's target deleted gives the claim back to the newest source it remembers
    /// ([`claim::back_to_source`]), and a source deleted leaves the claim to the others
    /// ([`claim::source_gone`]).
    pub async fn terminate(
        &self,
        pod: &PodIdentity<'_>,
        ips: &[IpAddr],
        release_at: u64,
    ) -> Result<Vec<Claim>, LedgerError> {
        let now = unix_now();
        let mut all: Vec<IpAddr> = self.claims_of(pod).iter().map(|c| c.ip).collect();
        all.extend(
            ips.iter()
                .filter(|ip| !all.contains(ip))
                .copied()
                .collect::<Vec<_>>(),
        );
        let mut changed = self
            .step(pod, &all, |current| {
                if !matches!(current.phase, Phase::Reserved | Phase::Bound) {
                    return None;
                }
                claim::back_to_source(current, now)
                    .or_else(|| Some(claim::terminating(current, pod, release_at, now)))
            })
            .await?;
        for current in self.claims_carried_by(pod) {
            let next = claim::source_gone(&current, pod.uid, pod.token, now);
            if self.transition(&current, &next).await? {
                changed.push(next);
            }
        }
        Ok(changed)
    }

    /// `Terminating` claims whose release time has passed at `now`, and released claims
    /// kept for their pod name whose sticky grace has.
    pub(crate) fn due(&self, now: u64) -> Vec<Claim> {
        let state = self.lock();
        state
            .releasing
            .iter()
            .take_while(|(at, _)| *at <= now)
            .filter_map(|(_, ip)| state.claims.get(ip).map(|c| (**c).clone()))
            .collect()
    }

    /// Free the `Terminating` claims that are due, once `pods` confirms each pod is gone
    /// (`None`: no API server to ask, so the timer alone decides), and the kept released
    /// claims that are due (their pod was gone when they were released). A pod that still runs
    /// keeps its IP (back to `Bound`). Returns what happened to each claim looked at.
    pub async fn release_due(
        &self,
        now: u64,
        pods: Option<&dyn PodLookup>,
    ) -> Vec<(Claim, DueStep)> {
        let mut done = Vec::new();
        for current in self.due(now) {
            // a released claim kept for its pod name, whose grace is over: its pod is gone
            let presence = match pods {
                _ if current.phase == Phase::Released => PodPresence::Gone,
                Some(pods) => pods.presence(&current).await,
                None => PodPresence::Gone,
            };
            let step = claim::due_step(&presence);
            let result = match step {
                DueStep::Release => self.release_claim(&current).await.map(|_| ()),
                DueStep::KeepBound => {
                    let uid = current.pod.uid.clone().unwrap_or_default();
                    let next = claim::bound(&current, &current.pod.name, &uid, now);
                    match self.transition(&current, &next).await {
                        Ok(true) => {
                            tracing::warn!(
                                ip = %current.ip,
                                pod = %current.pod.display(),
                                "the pod's DELETE was admitted but the pod still runs after its grace period; it keeps its IP"
                            );
                            Ok(())
                        }
                        Ok(false) => Ok(()),
                        Err(error) => Err(error),
                    }
                }
                DueStep::Wait => {
                    if let PodPresence::Unknown(why) = &presence {
                        tracing::warn!(ip = %current.ip, pod = %current.pod.display(), %why, "cannot check whether a terminating pod is gone; its IP stays held");
                    }
                    Ok(())
                }
            };
            match result {
                Ok(()) => done.push((current, step)),
                Err(error) => {
                    tracing::warn!(ip = %current.ip, %error, "releasing a terminating claim failed; trying again")
                }
            }
        }
        done
    }

    /// Release at once the claims `pod` holds on `ips`, with no grace: for a pod known to be
    /// gone. Returns the IPs released.
    pub async fn release_held(
        &self,
        pod: &PodIdentity<'_>,
        ips: &[IpAddr],
    ) -> Result<Vec<IpAddr>, LedgerError> {
        let mut released = Vec::new();
        for claim in self.held_by(pod, ips) {
            if self.release_claim(&claim).await? {
                released.push(claim.ip);
            }
        }
        Ok(released)
    }

    /// Release one claim now (its grant as recorded). Returns whether the ledger changed.
    /// A sticky claim stays held, `Released`, for its pod name (`claim::released`).
    pub async fn release_claim(&self, claim: &Claim) -> Result<bool, LedgerError> {
        if !self.ledger().release(claim).await? {
            return Ok(false);
        }
        let kept = claim::released(claim, unix_now());
        let mut state = self.lock();
        state.unhold(claim);
        state.remember(claim);
        if kept.locks_ip() {
            state.hold(kept);
        }
        Ok(true)
    }

    /// The VM claims that remember `pod` among their migration sources
    /// ([`claim::migration_sources`]): it may run the VM on their IP while a migration's
    /// target holds them.
    fn claims_carried_by(&self, pod: &PodIdentity<'_>) -> Vec<Claim> {
        let state = self.lock();
        let mut found: Vec<Claim> = Vec::new();
        for key in identity_keys(pod) {
            for claim in state.by_key.claims(key, &state.claims, |c| {
                c.is_held()
                    && c.pod.namespace == pod.namespace
                    && c.vm
                        .as_ref()
                        .is_some_and(|vm| vm.carried_by(pod.uid, pod.token))
                    && !found.iter().any(|f| f.ip == c.ip)
            }) {
                found.push(claim.clone());
            }
        }
        found
    }
}
