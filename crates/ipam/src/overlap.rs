//! An interval index over IP ranges: "does this range overlap anything stored, and what?"
//! in O(log n) for the usual case of disjoint stored ranges, instead of all-pairs.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use crate::ipset::{Family, IpRange, IpSet};

/// Ranges keyed by owner. One owner may store several ranges (dual stack, lists).
#[derive(Debug, Clone)]
pub struct RangeIndex<K> {
    by_start: BTreeMap<(Family, u128), Vec<(u128, K)>>,
    /// Where each owner's ranges start, so removing an owner does not scan everything.
    starts: HashMap<K, Vec<(Family, u128)>>,
    /// The largest range stored: a backwards walk never needs to look further than this.
    widest: u128,
}

impl<K> Default for RangeIndex<K> {
    fn default() -> Self {
        RangeIndex {
            by_start: BTreeMap::new(),
            starts: HashMap::new(),
            widest: 0,
        }
    }
}

impl<K: Clone + Eq + Hash> RangeIndex<K> {
    pub fn insert(&mut self, range: IpRange, owner: K) {
        self.widest = self.widest.max(range.end - range.start);
        self.starts
            .entry(owner.clone())
            .or_default()
            .push((range.family, range.start));
        self.by_start
            .entry((range.family, range.start))
            .or_default()
            .push((range.end, owner));
    }

    pub fn insert_set(&mut self, set: &IpSet, owner: K) {
        for range in set.ranges() {
            self.insert(*range, owner.clone());
        }
    }

    /// Remove every range of `owner`.
    pub fn remove(&mut self, owner: &K) {
        for key in self.starts.remove(owner).unwrap_or_default() {
            if let Some(entries) = self.by_start.get_mut(&key) {
                entries.retain(|(_, o)| o != owner);
                if entries.is_empty() {
                    self.by_start.remove(&key);
                }
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_start.values().map(Vec::len).sum()
    }

    /// The first stored range overlapping `range` whose owner is not `except`.
    pub fn first_overlap(&self, range: &IpRange, except: Option<&K>) -> Option<(IpRange, &K)> {
        let low = range.start.saturating_sub(self.widest);
        // Only ranges starting in [start - widest, end] can reach into `range`.
        for (&(family, start), entries) in self
            .by_start
            .range((range.family, low)..=(range.family, range.end))
        {
            for (end, owner) in entries {
                if *end >= range.start && except != Some(owner) {
                    return Some((
                        IpRange {
                            family,
                            start,
                            end: *end,
                        },
                        owner,
                    ));
                }
            }
        }
        None
    }

    pub fn first_overlap_set(&self, set: &IpSet, except: Option<&K>) -> Option<(IpRange, &K)> {
        set.ranges()
            .iter()
            .find_map(|r| self.first_overlap(r, except))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipset::parse_ip_spec;

    fn range(spec: &str) -> IpRange {
        parse_ip_spec(spec).unwrap().ranges()[0]
    }

    #[test]
    fn finds_overlaps_and_skips_the_owner_itself() {
        let mut index = RangeIndex::default();
        index.insert(range("10.0.0.0-10.0.255.255"), "a");
        index.insert(range("10.2.0.0-10.2.0.255"), "b");
        index.insert(range("fd00::-fd00::ff"), "c");
        assert_eq!(
            index
                .first_overlap(&range("10.0.4.0-10.0.4.255"), None)
                .unwrap()
                .1,
            &"a"
        );
        assert_eq!(
            index
                .first_overlap(&range("10.1.255.0-10.2.0.0"), None)
                .unwrap()
                .1,
            &"b"
        );
        assert!(
            index
                .first_overlap(&range("10.1.0.0-10.1.255.255"), None)
                .is_none()
        );
        assert!(
            index
                .first_overlap(&range("10.0.4.0-10.0.4.255"), Some(&"a"))
                .is_none()
        );
        assert_eq!(
            index.first_overlap(&range("fd00::10"), None).unwrap().1,
            &"c"
        );
        assert!(
            index
                .first_overlap(&range("10.255.0.0-10.255.0.1"), None)
                .is_none()
        );
        index.remove(&"a");
        assert!(
            index
                .first_overlap(&range("10.0.4.0-10.0.4.255"), None)
                .is_none()
        );
        assert_eq!(index.len(), 2);
    }

    #[test]
    fn a_wide_range_stored_early_is_still_found() {
        let mut index = RangeIndex::default();
        index.insert(range("10.0.0.0-10.255.255.255"), "wide");
        for i in 0..100u32 {
            index.insert(range(&format!("11.0.{i}.0-11.0.{i}.255")), "narrow");
        }
        assert_eq!(
            index
                .first_overlap(&range("10.200.0.0-10.200.0.1"), None)
                .unwrap()
                .1,
            &"wide"
        );
    }
}
