//! A full pass's list of IPClaims, merged with what the claim watch saw while it was read.
//!
//! The list is a snapshot from when the API server answered; the watch may already have
//! delivered a newer version of a claim by the time the list is in hand (a bind's spec write
//! listed, its status write watched). Rebuilding the index from the list alone would put that
//! claim back to its older version, and no later event would correct it until the next change
//! or the next full pass. So for every claim the watch changed (or deleted) while the list was
//! being read, the watch's version wins, and the list's wins for the others: it still repairs
//! whatever the watch missed. Either way the index converges: a watch that is behind delivers
//! the newer events later, and a watch that is ahead already holds them. No resourceVersion
//! is compared (the API server documents them as opaque).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use ip_webhook_ledger::crd::IPClaim;

/// What the claim watch changed since a list began. The watch notes a change while it holds
/// the claim cache's lock, and the list is merged under that lock, so no change falls between.
#[derive(Default)]
pub(crate) struct ListWindow {
    open: Mutex<Option<Touched>>,
}

#[derive(Default)]
struct Touched {
    names: HashSet<String>,
    /// The watch relisted meanwhile: its cache is newer than the list throughout.
    relisted: bool,
}

impl ListWindow {
    /// A list is about to be requested.
    pub(crate) fn open(&self) {
        *self.lock() = Some(Touched::default());
    }

    /// The watch changed or deleted claim `name`.
    pub(crate) fn note(&self, name: &str) {
        if let Some(touched) = self.lock().as_mut() {
            touched.names.insert(name.to_string());
        }
    }

    /// The watch replaced its whole cache from its own list.
    pub(crate) fn note_relist(&self) {
        if let Some(touched) = self.lock().as_mut() {
            touched.relisted = true;
        }
    }

    /// The list failed: nothing to merge.
    pub(crate) fn close(&self) {
        *self.lock() = None;
    }

    /// The claims as of now: `listed`, with the watch's version (`watched`, the watch's cache,
    /// locked by the caller) of every claim the watch touched since [`ListWindow::open`].
    pub(crate) fn close_and_merge(
        &self,
        listed: Vec<Arc<IPClaim>>,
        watched: &BTreeMap<String, Arc<IPClaim>>,
    ) -> Vec<Arc<IPClaim>> {
        let touched = self.lock().take().unwrap_or_default();
        merge(listed, watched, &touched)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Touched>> {
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn merge(
    listed: Vec<Arc<IPClaim>>,
    watched: &BTreeMap<String, Arc<IPClaim>>,
    touched: &Touched,
) -> Vec<Arc<IPClaim>> {
    if touched.relisted {
        return watched.values().cloned().collect();
    }
    let mut merged: BTreeMap<String, Arc<IPClaim>> = listed
        .into_iter()
        .filter_map(|claim| Some((claim.metadata.name.clone()?, claim)))
        .collect();
    for name in &touched.names {
        match watched.get(name) {
            Some(claim) => merged.insert(name.clone(), claim.clone()),
            None => merged.remove(name),
        };
    }
    merged.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str, version: &str) -> Arc<IPClaim> {
        let claim: IPClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "ip-webhook.io/v1alpha1",
            "kind": "IPClaim",
            "metadata": {"name": name, "resourceVersion": version},
            "spec": {"ip": "10.0.0.1", "app": "web", "namespace": "default",
                     "podName": "", "requestUid": "r", "source": "Allocated"},
        }))
        .unwrap();
        Arc::new(claim)
    }

    fn versions(claims: &[Arc<IPClaim>]) -> Vec<(String, String)> {
        claims
            .iter()
            .map(|c| {
                let name = c.metadata.name.clone().unwrap();
                (name, c.metadata.resource_version.clone().unwrap())
            })
            .collect()
    }

    fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
        expected
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    /// Claims the watch changed while the list was read keep the watch's version (a newer
    /// one, or one deleted or created since); the others keep the list's, even where the
    /// watch's cache differs (an event it missed).
    #[test]
    fn the_watch_wins_for_what_it_changed_during_the_list() {
        let window = ListWindow::default();
        window.note("a"); // before the list: not counted
        window.open();
        let watched: BTreeMap<String, Arc<IPClaim>> = [
            ("a", "11"), // bound after the list's snapshot
            ("b", "3"),  // the watch missed b's change to 7
            ("d", "12"), // created after the snapshot
        ]
        .into_iter()
        .map(|(n, v)| (n.to_string(), claim(n, v)))
        .collect();
        for name in ["a", "c", "d"] {
            window.note(name); // c: deleted after the snapshot
        }
        let listed = vec![claim("a", "10"), claim("b", "7"), claim("c", "9")];
        let merged = window.close_and_merge(listed, &watched);
        assert_eq!(
            versions(&merged),
            pairs(&[("a", "11"), ("b", "7"), ("d", "12")])
        );

        // closed: what the watch notes now belongs to no list
        window.note("b");
        let again = window.close_and_merge(vec![claim("b", "7")], &watched);
        assert_eq!(versions(&again), pairs(&[("b", "7")]));
    }

    #[test]
    fn a_relist_of_the_watch_meanwhile_makes_its_cache_the_answer() {
        let window = ListWindow::default();
        window.open();
        window.note_relist();
        let watched: BTreeMap<String, Arc<IPClaim>> =
            [("a".to_string(), claim("a", "20"))].into_iter().collect();
        let merged = window.close_and_merge(vec![claim("a", "10"), claim("b", "9")], &watched);
        assert_eq!(versions(&merged), pairs(&[("a", "20")]));
    }
}
