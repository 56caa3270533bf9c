//! Parsed `allocatable-ips` lists by their text, bounded in entries and in bytes.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use super::ipset::{IpSet, IpSpecError, parse_ip_spec};

/// What [`SpecCache`] may hold, counted as [`SpecCache::bytes`] counts it: a few thousand
/// ordinary lists, or about twenty of the largest an annotation can carry.
pub(crate) const SPEC_CACHE_BYTES: usize = 8 * 1024 * 1024;
/// Lists the cache holds at most, however small.
pub(crate) const SPEC_CACHE_ENTRIES: usize = 1024;

/// Parsed specs by their text: every pod of an app carries the same `allocatable-ips`
/// annotation, so each admission would otherwise parse the same list again.
///
/// Bounded in entries and in bytes: each entry counts what it keeps allocated (its text, the
/// capacity of its set's ranges, the `Arc`s' headers), and the table and the eviction queue
/// count their capacity. Past either bound the oldest entries are dropped; a list larger than
/// a quarter of the byte budget is parsed every time and never kept. A flood of distinct lists
/// (anyone who can send a dry-run review can send one) costs re-parsing, never memory.
#[derive(Debug)]
pub struct SpecCache {
    state: Mutex<CacheState>,
    max_entries: usize,
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct CacheState {
    parsed: HashMap<Arc<str>, Arc<IpSet>>,
    /// Keys in insertion order (sharing the map's text), oldest first.
    order: VecDeque<Arc<str>>,
    /// The sum of [`entry_bytes`] over the entries.
    entries_bytes: usize,
}

/// Heap bytes one cached entry keeps: the key's allocation (text and the `Arc`'s two
/// counters) and the set's (the `Arc` around the `IpSet`, and its ranges' capacity).
fn entry_bytes(key: &str, set: &IpSet) -> usize {
    const ARC_COUNTERS: usize = 2 * std::mem::size_of::<usize>();
    ARC_COUNTERS + key.len() + ARC_COUNTERS + std::mem::size_of::<IpSet>() + set.heap_bytes()
}

impl CacheState {
    /// Everything counted: entries plus the table's and the queue's capacity (a hash table
    /// slot is the key-value pair and one control byte).
    fn bytes(&self) -> usize {
        let slot = std::mem::size_of::<(Arc<str>, Arc<IpSet>)>() + 1;
        self.entries_bytes
            + self.parsed.capacity() * slot
            + self.order.capacity() * std::mem::size_of::<Arc<str>>()
    }

    fn evict_oldest(&mut self) -> bool {
        let Some(key) = self.order.pop_front() else {
            return false;
        };
        if let Some(set) = self.parsed.remove(&key) {
            self.entries_bytes -= entry_bytes(&key, &set);
        }
        true
    }
}

impl Default for SpecCache {
    fn default() -> Self {
        SpecCache::bounded(SPEC_CACHE_ENTRIES, SPEC_CACHE_BYTES)
    }
}

impl SpecCache {
    pub(crate) fn bounded(max_entries: usize, max_bytes: usize) -> SpecCache {
        SpecCache {
            state: Mutex::new(CacheState::default()),
            max_entries: max_entries.max(1),
            max_bytes,
        }
    }

    /// [`parse_ip_spec`], remembered. Errors are not cached (they are the rare path).
    pub fn parse(&self, spec: &str) -> Result<Arc<IpSet>, IpSpecError> {
        if let Some(set) = self.lock().parsed.get(spec) {
            return Ok(set.clone());
        }
        let set = Arc::new(parse_ip_spec(spec)?);
        let cost = entry_bytes(spec, &set);
        if cost > self.max_bytes / 4 {
            return Ok(set);
        }
        let mut state = self.lock();
        if state.parsed.contains_key(spec) {
            return Ok(set);
        }
        let key: Arc<str> = Arc::from(spec);
        state.parsed.insert(key.clone(), set.clone());
        state.order.push_back(key);
        state.entries_bytes += cost;
        while (state.parsed.len() > self.max_entries || state.bytes() > self.max_bytes)
            && state.evict_oldest()
        {}
        if state.parsed.capacity() > 2 * state.parsed.len().max(16) {
            state.parsed.shrink_to_fit();
            state.order.shrink_to_fit();
        }
        Ok(set)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().parsed.len()
    }

    /// The bytes the cache holds, as its bound counts them.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.lock().bytes()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheState> {
        // every change leaves the state consistent before the next statement can panic, so a
        // poisoned lock is still usable
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_cache_returns_what_the_parser_returns_and_stays_bounded() {
        let cache = SpecCache::bounded(2, SPEC_CACHE_BYTES);
        let spec = "10.0.0.10,10.0.0.20-10.0.0.29";
        let first = cache.parse(spec).unwrap();
        assert_eq!(*first, parse_ip_spec(spec).unwrap());
        assert!(
            Arc::ptr_eq(&first, &cache.parse(spec).unwrap()),
            "second parse is a hit"
        );
        assert_eq!(
            cache.parse("10.0.0.300").unwrap_err(),
            parse_ip_spec("10.0.0.300").unwrap_err()
        );
        assert_eq!(cache.len(), 1, "errors are not cached");
        cache.parse("10.0.1.0/30").unwrap();
        cache.parse("fd00::1").unwrap();
        assert!(cache.len() <= 2, "bounded: {}", cache.len());
        assert_eq!(*cache.parse(spec).unwrap(), parse_ip_spec(spec).unwrap());
    }

    #[test]
    fn the_cache_stays_within_its_bytes_and_drops_the_oldest_first() {
        let budget = 256 * 1024;
        let cache = SpecCache::bounded(SPEC_CACHE_ENTRIES, budget);
        let list = |i: u32, count: u32, step: u32| -> String {
            let base = u32::from(std::net::Ipv4Addr::new(10, i as u8, 0, 1));
            (0..count)
                .map(|k| std::net::Ipv4Addr::from(base + step * k).to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        // every other IP: 3,000 ranges each, about 30 KB of text
        let mut costs = Vec::new();
        for i in 0..5 {
            let text = list(i, 3_000, 2);
            let set = cache.parse(&text).unwrap();
            costs.push(entry_bytes(&text, &set));
            assert!(cache.bytes() <= budget, "{} > {budget}", cache.bytes());
        }
        // what an entry counts is its text and its ranges' capacity: about 175 KB here, more
        // than a quarter of the budget, so none of these is kept
        assert!(costs.iter().all(|c| *c > budget / 4), "{costs:?}");
        assert_eq!(cache.len(), 0);
        // lists of adjacent IPs are one range each: what they keep is mostly their text
        // (about 9 KB each: 40 of them are more than the budget)
        let small = SpecCache::bounded(SPEC_CACHE_ENTRIES, budget);
        let adjacent: Vec<String> = (0..40).map(|i| list(i, 800, 1)).collect();
        let first_parsed: Vec<Arc<IpSet>> = adjacent
            .iter()
            .map(|list| {
                let set = small.parse(list).unwrap();
                assert!(small.bytes() <= budget, "{} > {budget}", small.bytes());
                set
            })
            .collect();
        let kept = small.len();
        assert!((1..40).contains(&kept), "{kept} of 40 kept");
        // the newest were kept (a hit returns the same set), the oldest went first
        for i in 40 - kept..40 {
            let again = small.parse(&adjacent[i]).unwrap();
            assert!(Arc::ptr_eq(&again, &first_parsed[i]), "list {i} was kept");
        }
        let again = small.parse(&adjacent[0]).unwrap();
        assert!(!Arc::ptr_eq(&again, &first_parsed[0]), "list 0 was dropped");
        assert_eq!(*again, parse_ip_spec(&adjacent[0]).unwrap());
    }
}
