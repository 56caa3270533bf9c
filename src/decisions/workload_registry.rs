//! The IP lists of the workloads ([`WorkloadRegistry`]): which app lists which IPs, so that a
//! second app cannot list IPs the first one lists, and so that the reconciler can tell which
//! app's list holds an IP.

use std::collections::HashMap;
use std::sync::Mutex;

use ip_webhook_ipam::ipset::IpSet;
use ip_webhook_ipam::messages::overlap_text;
use ip_webhook_ipam::overlap::RangeIndex;

/// Who a workload is, for messages and the registry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct WorkloadId {
    pub(crate) kind: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
}

impl std::fmt::Display for WorkloadId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// The IP lists of the workloads this process has admitted, by app: so a second app cannot
/// list IPs the first one lists. It learns from admissions (and forgets on DELETE reviews).
#[derive(Default)]
pub struct WorkloadRegistry {
    inner: Mutex<RegistryState>,
    /// Fed by watches of every workload kind (in-cluster): admissions no longer record into
    /// it, so every replica answers the same, restarts included.
    watched: std::sync::atomic::AtomicBool,
}

/// What the registry keeps of one workload: who it is, its app, its list.
#[derive(Debug, Clone)]
pub(crate) struct Listing {
    pub(crate) id: WorkloadId,
    pub(crate) app: String,
    pub(crate) set: IpSet,
}

#[derive(Default)]
struct RegistryState {
    index: RangeIndex<WorkloadId>,
    apps: HashMap<WorkloadId, String>,
    lists: HashMap<WorkloadId, IpSet>,
    /// Counts the changes of a list or of the app that lists it: a workload event that
    /// changes neither (a scale, a status write) leaves it as it was.
    generation: u64,
    /// [`WorkloadRegistry::listed`] as of `.0`, the generation it was made at: the union of
    /// every list is made once per change, not once per reader (the leader's passes and its
    /// CNI reservation check each ask).
    listed: Option<(u64, IpSet)>,
}

impl WorkloadRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, RegistryState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// From now on the watches feed the registry (see [`WorkloadRegistry::watched`]).
    pub(crate) fn set_watched(&self) {
        self.watched
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether watches feed the registry (in-cluster).
    pub(crate) fn watched(&self) -> bool {
        self.watched.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How many workloads are known to list IPs.
    pub fn len(&self) -> usize {
        self.lock().lists.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replace every workload of `kind` with `listings` (a watch's (re)list).
    pub(crate) fn replace_kind(&self, kind: &str, listings: Vec<Listing>) {
        let mut state = self.lock();
        let stale: Vec<WorkloadId> = state
            .lists
            .keys()
            .filter(|id| id.kind == kind)
            .cloned()
            .collect();
        if !stale.is_empty() {
            state.generation += 1;
        }
        for id in stale {
            state.index.remove(&id);
            state.apps.remove(&id);
            state.lists.remove(&id);
        }
        drop(state);
        for listing in listings {
            self.record(listing.id, listing.app, &listing.set);
        }
    }

    pub(crate) fn record(&self, id: WorkloadId, app_key: String, set: &IpSet) {
        let mut state = self.lock();
        if state.lists.get(&id) == Some(set) && state.apps.get(&id) == Some(&app_key) {
            return;
        }
        state.generation += 1;
        state.index.remove(&id);
        state.index.insert_set(set, id.clone());
        state.lists.insert(id.clone(), set.clone());
        state.apps.insert(id, app_key);
    }

    pub(crate) fn forget(&self, id: &WorkloadId) {
        let mut state = self.lock();
        state.index.remove(id);
        state.apps.remove(id);
        if state.lists.remove(id).is_some() {
            state.generation += 1;
        }
    }

    /// A count that changes whenever a workload's list, or the app that lists it, does.
    pub(crate) fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Every IP some admitted workload lists.
    pub(crate) fn listed(&self) -> IpSet {
        let mut state = self.lock();
        let generation = state.generation;
        if let Some((made_at, listed)) = &state.listed
            && *made_at == generation
        {
            return listed.clone();
        }
        let listed = state
            .lists
            .values()
            .fold(IpSet::default(), |all, set| all.union(set));
        state.listed = Some((generation, listed.clone()));
        listed
    }

    /// Every app (`namespace/app`) whose workloads list `ip`, sorted (the reconciler's
    /// adoption asks; an IP no workload lists costs one index lookup).
    pub(crate) fn apps_listing(&self, ip: std::net::IpAddr) -> Vec<String> {
        let state = self.lock();
        if state
            .index
            .first_overlap(&ip_webhook_ipam::ipset::IpRange::single(ip), None)
            .is_none()
        {
            return Vec::new();
        }
        let mut apps: Vec<String> = state
            .lists
            .iter()
            .filter(|(_, set)| set.contains(&ip))
            .filter_map(|(id, _)| state.apps.get(id).cloned())
            .collect();
        apps.sort();
        apps.dedup();
        apps
    }

    /// A workload of another app whose list overlaps `set`: (overlap, workload, its app).
    pub(crate) fn other_app_listing(
        &self,
        set: &IpSet,
        app_key: &str,
    ) -> Option<(String, WorkloadId, String)> {
        let state = self.lock();
        for range in set.ranges() {
            let mut probe = *range;
            while let Some((found, id)) = state.index.first_overlap(&probe, None) {
                let other_app = state.apps.get(id).cloned().unwrap_or_default();
                if other_app != app_key {
                    let shared = overlap_text(&IpSet::from_ranges([found]), set);
                    return Some((shared, id.clone(), other_app));
                }
                if found.end >= probe.end {
                    break;
                }
                probe.start = found.end + 1;
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ip_webhook_ipam::ipset::parse_ip_spec;

    /// The generation (the reconciler's `listed_version`) moves with a list or its app and
    /// not with an event that changes neither; `listed` made once per generation is the union
    /// made afresh.
    #[test]
    fn the_generation_moves_with_a_list_or_its_app_and_listed_follows_it() {
        let registry = WorkloadRegistry::default();
        let id = |name: &str| WorkloadId {
            kind: "Deployment".into(),
            namespace: "prod".into(),
            name: name.into(),
        };
        let set = |spec: &str| parse_ip_spec(spec).unwrap();
        let start = registry.generation();
        registry.record(id("web"), "prod/web".into(), &set("10.0.0.1-10.0.0.3"));
        let first = registry.generation();
        assert_ne!(first, start);
        assert_eq!(registry.listed().to_string(), "10.0.0.1-10.0.0.3");
        // a scale or a status write: the same list for the same app
        registry.record(id("web"), "prod/web".into(), &set("10.0.0.1-10.0.0.3"));
        assert_eq!(registry.generation(), first);
        // the app label changed, the IPs did not: adoption must look again
        registry.record(id("web"), "prod/web2".into(), &set("10.0.0.1-10.0.0.3"));
        let relabelled = registry.generation();
        assert_ne!(relabelled, first);
        registry.record(id("db"), "prod/db".into(), &set("10.0.0.9"));
        assert_ne!(registry.generation(), relabelled);
        assert_eq!(registry.listed().to_string(), "10.0.0.1-10.0.0.3,10.0.0.9");
        let before = registry.generation();
        registry.forget(&id("nothing"));
        assert_eq!(
            registry.generation(),
            before,
            "forgetting no workload changes nothing"
        );
        registry.forget(&id("web"));
        assert_ne!(registry.generation(), before);
        assert_eq!(registry.listed().to_string(), "10.0.0.9");
        registry.replace_kind("Deployment", Vec::new());
        assert!(registry.listed().is_empty());
    }
}
