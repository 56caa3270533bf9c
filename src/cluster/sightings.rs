//! Since when the leader has seen each claim as it is ([`Sightings`]): the ages the
//! reconciler's rules read, on the leader's own clock.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use super::claiming_pod::PodMap;
use ip_webhook_ledger::Claim;
use ip_webhook_ledger::crd::IPClaim;
use ip_webhook_ledger::kubernetes::from_resource;

/// What a claim says about its holder; a change of any part restarts its age.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ClaimState {
    object_uid: Option<String>,
    phase: Option<String>,
    pod_uid: Option<String>,
}

impl ClaimState {
    fn of(resource: &IPClaim) -> ClaimState {
        ClaimState {
            object_uid: resource.metadata.uid.clone(),
            phase: resource.status.as_ref().map(|s| s.phase.clone()),
            pod_uid: resource.spec.pod_uid.clone(),
        }
    }
}

/// When the leader first saw each claim in its present state, in seconds on the leader's own
/// clock (the one `now` is read from), and whether it has seen the claim's pod since. A
/// claim's age is how long this leader has watched it, never a time another machine wrote
/// compared with this machine's clock: replicas' clocks may disagree by minutes. A new leader
/// starts its own count, so it waits a whole window before freeing anything.
///
/// Each sighting also keeps the object it last read and the [`Claim`] it parsed to: the watch
/// cache hands every pass the same `Arc` until the claim changes, so a pass reads only the
/// claims that changed since the last one, and one it holds is never freed, so no other object
/// can share its address.
#[derive(Debug, Default)]
pub(crate) struct Sightings {
    first: HashMap<String, Sighting, foldhash::fast::RandomState>,
    /// How many times [`Sightings::observe`] ran: which sightings the last one listed.
    observed: u64,
}

#[derive(Debug)]
struct Sighting {
    state: ClaimState,
    since: u64,
    /// The pod with the claim's UID was in the pod cache: the API server stored it, so the
    /// promise made at admission was kept.
    pod_seen: bool,
    /// The object as last observed and what it parsed to (`None`: not observed yet).
    read: Option<Read>,
    /// The [`Sightings::observe`] that last listed the claim.
    listed_in: u64,
}

#[derive(Debug)]
struct Read {
    resource: Arc<IPClaim>,
    claim: Result<Claim, ip_webhook_ledger::LedgerError>,
}

impl Sighting {
    /// Whether this is the sighting of `resource` as it is now.
    fn is_of(&self, resource: &Arc<IPClaim>) -> bool {
        self.read
            .as_ref()
            .is_some_and(|read| Arc::ptr_eq(&read.resource, resource))
            || self.state == ClaimState::of(resource)
    }
}

impl Sightings {
    /// Note `claims` as seen at `now`, with the pods of `pods` (by UID); forget the claims no
    /// longer listed. A claim that is the very object the last call saw costs a lookup.
    pub(crate) fn observe(&mut self, claims: &[Arc<IPClaim>], pods: &PodMap, now: u64) {
        self.observed += 1;
        let pass = self.observed;
        for resource in claims {
            self.observe_one(resource, pods, now);
        }
        self.first.retain(|_, seen| seen.listed_in == pass);
    }

    /// Note one claim as seen at `now` (in the current [`Sightings::observe`]), with the pods
    /// of `pods`.
    pub(crate) fn observe_one(&mut self, resource: &Arc<IPClaim>, pods: &PodMap, now: u64) {
        let pass = self.observed;
        let name = resource.metadata.name.as_deref().unwrap_or_default();
        let pod_here = |uid: Option<&String>| uid.is_some_and(|uid| pods.contains_key(uid));
        let unchanged = self.first.get_mut(name).filter(|seen| {
            seen.read
                .as_ref()
                .is_some_and(|read| Arc::ptr_eq(&read.resource, resource))
        });
        if let Some(seen) = unchanged {
            seen.pod_seen |= pod_here(resource.spec.pod_uid.as_ref());
            seen.listed_in = pass;
            return;
        }
        let state = ClaimState::of(resource);
        let read = Some(Read {
            resource: Arc::clone(resource),
            claim: from_resource(resource),
        });
        let pod_here = pod_here(state.pod_uid.as_ref());
        match self.first.get_mut(name) {
            Some(seen) if seen.state == state => {
                seen.pod_seen |= pod_here;
                seen.read = read;
                seen.listed_in = pass;
            }
            previous => {
                // a phase change of the same pod's claim: that pod was still seen
                let pod_seen = pod_here
                    || previous.is_some_and(|p| {
                        p.pod_seen && p.state.pod_uid.is_some() && p.state.pod_uid == state.pod_uid
                    });
                let seen = Sighting {
                    state,
                    since: now,
                    pod_seen,
                    read,
                    listed_in: pass,
                };
                self.first.insert(name.to_string(), seen);
            }
        }
    }

    /// The claim `name` is gone.
    pub(crate) fn forget(&mut self, name: &str) {
        self.first.remove(name);
    }

    /// The pod of the claim `name` is in the pod cache.
    pub(crate) fn note_pod_seen(&mut self, name: &str) {
        if let Some(seen) = self.first.get_mut(name) {
            seen.pod_seen = true;
        }
    }

    /// The claim object `name` as last observed, and what it parsed to (`None`: unreadable).
    pub(crate) fn last_read(&self, name: &str) -> Option<(&Arc<IPClaim>, Option<&Claim>)> {
        let read = self.first.get(name)?.read.as_ref()?;
        Some((&read.resource, read.claim.as_ref().ok()))
    }

    fn sighting(&self, resource: &Arc<IPClaim>) -> Option<&Sighting> {
        let name = resource.metadata.name.as_deref().unwrap_or_default();
        self.first.get(name).filter(|seen| seen.is_of(resource))
    }

    /// Since when `resource` has been in its present state; `now` for one not seen before.
    pub(crate) fn since(&self, resource: &Arc<IPClaim>, now: u64) -> u64 {
        self.sighting(resource).map_or(now, |seen| seen.since)
    }

    /// Whether the pod `resource` is bound to has been seen since the claim was.
    pub(crate) fn pod_seen(&self, resource: &Arc<IPClaim>) -> bool {
        self.sighting(resource).is_some_and(|seen| seen.pod_seen)
    }

    /// The claim `resource` records: parsed when [`Sightings::observe`] saw this very object,
    /// parsed now otherwise; `None` (and a warning) for one that cannot be read.
    pub(crate) fn claim<'a>(&'a self, resource: &Arc<IPClaim>) -> Option<Cow<'a, Claim>> {
        let name = resource.metadata.name.as_deref().unwrap_or_default();
        let read = self
            .first
            .get(name)
            .and_then(|seen| seen.read.as_ref())
            .filter(|read| Arc::ptr_eq(&read.resource, resource));
        let skip = |error: &ip_webhook_ledger::LedgerError| {
            tracing::warn!(%error, "the reconciler skips an IPClaim");
        };
        match read.map(|read| &read.claim) {
            Some(Ok(claim)) => Some(Cow::Borrowed(claim)),
            Some(Err(error)) => {
                skip(error);
                None
            }
            None => from_resource(resource)
                .map(Cow::Owned)
                .inspect_err(skip)
                .ok(),
        }
    }
}

#[cfg(test)]
impl Sightings {
    /// Each claim as first seen when it was written (in tests one clock writes and reads).
    pub(crate) fn as_written(claims: &[Arc<IPClaim>]) -> Sightings {
        let first = claims
            .iter()
            .map(|resource| {
                let name = resource.metadata.name.clone().unwrap_or_default();
                let seen = Sighting {
                    state: ClaimState::of(resource),
                    since: from_resource(resource).unwrap().updated_at,
                    pod_seen: false,
                    read: None,
                    listed_in: 0,
                };
                (name, seen)
            })
            .collect();
        Sightings { first, observed: 0 }
    }

    /// How many claims are tracked.
    pub(crate) fn len(&self) -> usize {
        self.first.len()
    }
}
