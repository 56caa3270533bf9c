//! Leader election with a `coordination.k8s.io/v1` Lease: one replica runs the reconciler's
//! writes; every replica keeps serving admissions.
//!
//! The holder renews `spec.renewTime` every `renew_every`. Another replica takes the lease over
//! only after it has seen the same holder and renew time unchanged for `duration` on its own
//! clock (as client-go does, so clock skew between nodes does not matter). Every write carries
//! the resourceVersion it read, so two candidates cannot both win. A holder that cannot renew
//! within `duration` steps down before anyone else may take over.
//!
//! Not kube-lease-manager (0.13.1): it takes a lease as expired once the holder's `renewTime`
//! plus the duration is past on its own clock (its `src/state.rs`, `is_expired`), so a replica
//! whose clock runs ahead takes a live holder's lease. Two of its candidates against
//! `fakeapi.py`, one under `faketime -f +600s`, showed exactly that: the one ahead led 0.4 s
//! after it started while the other was renewing; without the offset it never did.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::metrics::{LeaseLabels, Metrics};
use ip_webhook_ledger::kubernetes::is_status;

#[derive(Debug, Clone)]
pub(crate) struct LeaseSettings {
    pub(crate) name: String,
    pub(crate) namespace: String,
    /// Who we are in `spec.holderIdentity` (pod name plus a random suffix).
    pub(crate) identity: String,
    pub(crate) duration: Duration,
    pub(crate) renew_every: Duration,
}

/// One candidate's view of the lease.
pub(crate) struct Elector {
    api: Api<Lease>,
    settings: LeaseSettings,
    /// The other holder's (identity, renewTime, resourceVersion) and when we first saw it.
    observed: Option<(String, Instant)>,
    /// When we last renewed successfully (while leader).
    renewed: Option<Instant>,
}

impl Elector {
    pub(crate) fn new(api: Api<Lease>, settings: LeaseSettings) -> Elector {
        Elector {
            api,
            settings,
            observed: None,
            renewed: None,
        }
    }

    fn spec(&self, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.settings.identity.clone()),
            lease_duration_seconds: Some(self.settings.duration.as_secs().max(1) as i32),
            acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// One round: acquire, renew or observe. Returns whether we lead now.
    pub(crate) async fn step(&mut self) -> bool {
        let leading = self.try_step().await;
        match leading {
            Ok(leading) => {
                if leading {
                    self.renewed = Some(Instant::now());
                } else {
                    self.renewed = None;
                }
                leading
            }
            Err(error) => {
                // Keep leading only while the last renewal is fresh enough that nobody else
                // may have taken over yet.
                let fresh = self
                    .renewed
                    .is_some_and(|at| at.elapsed() < self.settings.duration);
                tracing::warn!(%error, still_leading = fresh, "lease round failed");
                if !fresh {
                    self.renewed = None;
                }
                fresh
            }
        }
    }

    async fn try_step(&mut self) -> Result<bool, kube::Error> {
        let name = self.settings.name.clone();
        let Some(current) = self.api.get_opt(&name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name),
                    namespace: Some(self.settings.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(0, None)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(error) if is_status(&error, 409) => Ok(false),
                Err(error) => Err(error),
            };
        };
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let transitions = spec.lease_transitions.unwrap_or(0);
        let mine = holder == self.settings.identity;
        if !mine && !holder.is_empty() {
            let seen = format!(
                "{holder}/{:?}/{}",
                spec.renew_time.as_ref().map(|t| t.0),
                current
                    .metadata
                    .resource_version
                    .clone()
                    .unwrap_or_default()
            );
            let first_seen = match &self.observed {
                Some((previous, at)) if *previous == seen => *at,
                _ => {
                    self.observed = Some((seen, Instant::now()));
                    Instant::now()
                }
            };
            let duration = spec
                .lease_duration_seconds
                .map(|s| Duration::from_secs(s.max(1) as u64))
                .unwrap_or(self.settings.duration);
            if first_seen.elapsed() < duration {
                return Ok(false);
            }
            tracing::info!(previous = %holder, "lease expired; taking over");
        }
        let mut lease = current.clone();
        lease.spec = Some(if mine {
            self.spec(transitions, spec.acquire_time.clone())
        } else {
            self.spec(transitions + 1, None)
        });
        match self
            .api
            .replace(&name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                self.observed = None;
                Ok(true)
            }
            Err(error) if is_status(&error, 409) => Ok(false),
            Err(error) => Err(error),
        }
    }
}

/// Give the lease up if we hold it (graceful shutdown), so another replica takes over at its
/// next round instead of waiting out the lease. Returns whether we held it.
pub(crate) async fn release(
    api: &Api<Lease>,
    settings: &LeaseSettings,
) -> Result<bool, kube::Error> {
    let Some(mut lease) = api.get_opt(&settings.name).await? else {
        return Ok(false);
    };
    let mut spec = lease.spec.clone().unwrap_or_default();
    if spec.holder_identity.as_deref() != Some(settings.identity.as_str()) {
        return Ok(false);
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    lease.spec = Some(spec);
    match api
        .replace(&settings.name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => Ok(true),
        Err(error) if is_status(&error, 409) => Ok(false),
        Err(error) => Err(error),
    }
}

/// The clock of a leader-only keeper: [`LeaderTicks::next`] returns every `every` while this
/// replica leads and the keeper's inputs are ready, and skips the ticks in between.
pub(crate) struct LeaderTicks {
    tick: tokio::time::Interval,
    leading: watch::Receiver<bool>,
}

impl LeaderTicks {
    pub(crate) fn new(every: Duration, leading: watch::Receiver<bool>) -> LeaderTicks {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        LeaderTicks { tick, leading }
    }

    /// Wait for the next tick at which this replica leads and `ready()` holds.
    pub(crate) async fn next(&mut self, ready: impl Fn() -> bool) {
        loop {
            self.tick.tick().await;
            if *self.leading.borrow() && ready() {
                return;
            }
        }
    }
}

/// Run rounds forever, publishing whether we lead.
pub(crate) async fn run(mut elector: Elector, leading: watch::Sender<bool>) {
    let every = elector.settings.renew_every;
    loop {
        let now_leading = elector.step().await;
        leading.send_if_modified(|was| {
            if *was != now_leading {
                tracing::info!(leading = now_leading, identity = %elector.settings.identity, "leadership changed");
                *was = now_leading;
                true
            } else {
                false
            }
        });
        tokio::time::sleep(every).await;
    }
}

/// Run `task` while this replica leads: started when it becomes the leader, dropped (and
/// `stopped` called) when it stops being one.
pub(crate) async fn while_leading<F, Fut>(
    mut leading: watch::Receiver<bool>,
    task: F,
    stopped: impl Fn(),
) where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    loop {
        while !*leading.borrow_and_update() {
            if leading.changed().await.is_err() {
                return;
            }
        }
        let mut follower = leading.clone();
        tokio::select! {
            _ = task() => {}
            _ = async {
                while *follower.borrow_and_update() {
                    if follower.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            } => {}
        }
        stopped();
    }
}

/// Keep the `ip_webhook_leader{lease}` gauge equal to this replica's leadership.
pub(crate) async fn export_leadership(
    mut leading: watch::Receiver<bool>,
    metrics: std::sync::Arc<Metrics>,
    lease: String,
) {
    let gauge = metrics.leader.get_or_create_owned(&LeaseLabels { lease });
    loop {
        gauge.set(i64::from(*leading.borrow_and_update()));
        if leading.changed().await.is_err() {
            return;
        }
    }
}
