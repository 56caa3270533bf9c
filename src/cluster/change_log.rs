//! What changed between two leader passes, by key: what a watch notes as it applies an event
//! and a pass takes, so the pass looks at what changed instead of at everything. Past `CAP`
//! keys, or after a relist, the keys are forgotten and the log says so: then only a look at
//! everything is sure to see every change.

use std::collections::BTreeSet;

/// Keys noted since the last [`ChangeLog::take`], at most `CAP` of them.
#[derive(Debug)]
pub(crate) struct ChangeLog<K, const CAP: usize> {
    keys: BTreeSet<K>,
    /// More than `CAP` keys came, or everything changed: the keys are lost.
    overflowed: bool,
}

impl<K, const CAP: usize> Default for ChangeLog<K, CAP> {
    fn default() -> Self {
        ChangeLog {
            keys: BTreeSet::new(),
            overflowed: false,
        }
    }
}

impl<K: Ord, const CAP: usize> ChangeLog<K, CAP> {
    /// `key` changed.
    pub(crate) fn note(&mut self, key: K) {
        if self.overflowed {
            return;
        }
        if self.keys.len() >= CAP {
            self.note_all();
            return;
        }
        self.keys.insert(key);
    }

    /// Everything may have changed (a relist).
    pub(crate) fn note_all(&mut self) {
        self.overflowed = true;
        self.keys.clear();
    }

    /// The keys noted since the last call, in order, and a fresh start; `None` when they were
    /// lost: then everything needs a look.
    pub(crate) fn take(&mut self) -> Option<Vec<K>> {
        let keys = std::mem::take(&mut self.keys);
        let overflowed = std::mem::replace(&mut self.overflowed, false);
        (!overflowed).then(|| keys.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_taken_once_in_order_and_lost_past_the_cap_or_a_relist() {
        let mut log = ChangeLog::<&str, 3>::default();
        assert_eq!(log.take(), Some(vec![]));
        log.note("b");
        log.note("a");
        log.note("b");
        assert_eq!(log.take(), Some(vec!["a", "b"]));
        assert_eq!(log.take(), Some(vec![]));
        for key in ["a", "b", "c"] {
            log.note(key);
        }
        assert_eq!(
            log.take(),
            Some(vec!["a", "b", "c"]),
            "the cap itself is kept"
        );
        for key in ["a", "b", "c", "d"] {
            log.note(key);
        }
        assert_eq!(log.take(), None, "past the cap the keys are lost");
        log.note("a");
        log.note_all();
        log.note("b");
        assert_eq!(log.take(), None, "a relist loses the keys");
        assert_eq!(log.take(), Some(vec![]));
    }
}
