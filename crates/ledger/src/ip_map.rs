//! [`IpMap`]: a map by IP address, one per family, each a B-tree of runs of 8 neighbouring
//! addresses keyed by the run's place in the family's integer space.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A `BTreeMap<IpAddr, V>` (the same order: every IPv4 address before every IPv6 one, each
/// family by value) in less memory and with cheaper comparisons. The allocator and the journal
/// each keep one entry per held IP for the life of the process, and every byte a claim keeps
/// costs CPU on later grants (docs/performance.md, "What remembering a claim costs").
///
/// Addresses are kept in runs of [`RUN`] neighbours: a B-tree keyed by the run's number (the
/// address's integer divided by 8), each value a boxed array of 8 slots. IPs are granted from
/// lists and pools in order, so runs fill up: with 8-byte values a held IPv4 address takes its
/// slot's 8 bytes and an eighth of the run's B-tree entry, about 11 bytes, where a B-tree of
/// single addresses took about 27 (a leaf of 11 entries is 144 bytes, and a B-tree filled in
/// ascending order keeps 6 in each). A lone address pays for its whole run, 64 bytes and the
/// entry, about 85 bytes (docs/performance.md, "Runs of eight addresses").
/// `IpAddr`'s own `Ord` compares an IPv4 address octet by octet and an IPv6 one segment by
/// segment; these keys compare as one integer each.
pub struct IpMap<V> {
    v4: Runs<u32, V>,
    v6: Runs<u128, V>,
}

/// Neighbouring addresses a run holds. With 8-byte values a run is 64 bytes: a power of two,
/// so the allocator's aligned path asks for no more ("A kept block asks for its alignment").
const RUN: usize = 8;

/// One family's addresses by run.
struct Runs<K, V> {
    runs: BTreeMap<K, Box<[Option<V>; RUN]>>,
    /// Occupied slots.
    len: usize,
}

/// A family's address as an integer, split into its run's number and its slot in the run.
trait RunKey: Copy + Ord {
    fn split(self) -> (Self, usize);
    fn join(run: Self, slot: usize) -> Self;
}

impl RunKey for u32 {
    #[inline]
    fn split(self) -> (u32, usize) {
        (self / RUN as u32, (self % RUN as u32) as usize)
    }
    #[inline]
    fn join(run: u32, slot: usize) -> u32 {
        run * RUN as u32 + slot as u32
    }
}

impl RunKey for u128 {
    #[inline]
    fn split(self) -> (u128, usize) {
        (self / RUN as u128, (self % RUN as u128) as usize)
    }
    #[inline]
    fn join(run: u128, slot: usize) -> u128 {
        run * RUN as u128 + slot as u128
    }
}

fn empty_run<V>() -> Box<[Option<V>; RUN]> {
    Box::new([const { None }; RUN])
}

impl<K: RunKey, V> Runs<K, V> {
    fn new() -> Self {
        Runs {
            runs: BTreeMap::new(),
            len: 0,
        }
    }

    #[inline]
    fn get(&self, key: K) -> Option<&V> {
        let (run, slot) = key.split();
        self.runs.get(&run)?[slot].as_ref()
    }

    #[inline]
    fn insert(&mut self, key: K, value: V) -> Option<V> {
        let (run, slot) = key.split();
        let old = self.runs.entry(run).or_insert_with(empty_run)[slot].replace(value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    #[inline]
    fn remove(&mut self, key: K) -> Option<V> {
        let (run, slot) = key.split();
        let slots = self.runs.get_mut(&run)?;
        let old = slots[slot].take()?;
        self.len -= 1;
        // an emptied run goes: what the map keeps follows what it holds
        if slots.iter().all(Option::is_none) {
            self.runs.remove(&run);
        }
        Some(old)
    }

    fn iter(&self) -> impl Iterator<Item = (K, &V)> {
        self.runs.iter().flat_map(|(&run, slots)| {
            let held = slots.iter().enumerate();
            held.filter_map(move |(slot, value)| Some((K::join(run, slot), value.as_ref()?)))
        })
    }

    /// Built from `(key, value)` pairs in any order, a later pair of a key replacing an earlier
    /// one (as `BTreeMap`'s `FromIterator` does); the B-tree of runs built at once, its nodes
    /// full.
    fn from_pairs(mut pairs: Vec<(K, V)>) -> Self {
        // stable: the pairs of one key stay in the order given
        pairs.sort_by_key(|(key, _)| *key);
        let mut runs: Vec<(K, Box<[Option<V>; RUN]>)> = Vec::new();
        let mut len = 0;
        for (key, value) in pairs {
            let (run, slot) = key.split();
            if runs.last().is_none_or(|(last, _)| *last != run) {
                runs.push((run, empty_run()));
            }
            let slots = &mut runs.last_mut().expect("a run was just pushed").1;
            if slots[slot].replace(value).is_none() {
                len += 1;
            }
        }
        Runs {
            runs: runs.into_iter().collect(),
            len,
        }
    }
}

impl<V> Default for IpMap<V> {
    fn default() -> Self {
        IpMap {
            v4: Runs::new(),
            v6: Runs::new(),
        }
    }
}

impl<V: std::fmt::Debug> std::fmt::Debug for IpMap<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<V> IpMap<V> {
    #[inline]
    pub fn get(&self, ip: &IpAddr) -> Option<&V> {
        match ip {
            IpAddr::V4(ip) => self.v4.get(ip.to_bits()),
            IpAddr::V6(ip) => self.v6.get(ip.to_bits()),
        }
    }

    #[inline]
    pub fn insert(&mut self, ip: IpAddr, value: V) -> Option<V> {
        match ip {
            IpAddr::V4(ip) => self.v4.insert(ip.to_bits(), value),
            IpAddr::V6(ip) => self.v6.insert(ip.to_bits(), value),
        }
    }

    #[inline]
    pub fn remove(&mut self, ip: &IpAddr) -> Option<V> {
        match ip {
            IpAddr::V4(ip) => self.v4.remove(ip.to_bits()),
            IpAddr::V6(ip) => self.v6.remove(ip.to_bits()),
        }
    }

    pub fn len(&self) -> usize {
        self.v4.len + self.v6.len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The entries in the order of their IPs.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (IpAddr, &V)> {
        let v4 = self.v4.iter().map(|(bits, value)| (v4(bits), value));
        let v6 = self.v6.iter().map(|(bits, value)| (v6(bits), value));
        v4.chain(v6)
    }

    /// The IPs in order.
    pub fn keys(&self) -> impl Iterator<Item = IpAddr> {
        self.iter().map(|(ip, _)| ip)
    }

    /// The values in the order of their IPs.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, value)| value)
    }
}

fn v4(bits: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from_bits(bits))
}

fn v6(bits: u128) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from_bits(bits))
}

impl<V> FromIterator<(IpAddr, V)> for IpMap<V> {
    /// Built at once, the B-tree of each family's runs full, as a `BTreeMap` collected from an
    /// iterator is.
    fn from_iter<I: IntoIterator<Item = (IpAddr, V)>>(entries: I) -> Self {
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        for (ip, value) in entries {
            match ip {
                IpAddr::V4(ip) => v4.push((ip.to_bits(), value)),
                IpAddr::V6(ip) => v6.push((ip.to_bits(), value)),
            }
        }
        IpMap {
            v4: Runs::from_pairs(v4),
            v6: Runs::from_pairs(v6),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ips_are_kept_in_ipaddrs_order() {
        let ips: Vec<IpAddr> = [
            "10.0.0.2",
            "fd00::1",
            "9.255.255.255",
            "::",
            "255.255.255.255",
            "0.0.0.0",
            "10.0.1.0",
            "::ffff:10.0.0.2",
            "fd00::",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "10.0.0.10",
            "fd00:0:0:1::",
        ]
        .iter()
        .map(|ip| ip.parse().unwrap())
        .collect();
        let mut map = IpMap::default();
        for (n, ip) in ips.iter().enumerate() {
            assert_eq!(map.insert(*ip, n), None);
        }
        let mut sorted = ips.clone();
        sorted.sort();
        assert_eq!(map.keys().collect::<Vec<_>>(), sorted);
        for (n, ip) in ips.iter().enumerate() {
            assert_eq!(map.get(ip), Some(&n));
        }
        let by_ip: Vec<usize> = sorted
            .iter()
            .map(|ip| ips.iter().position(|other| other == ip).unwrap())
            .collect();
        assert_eq!(map.values().copied().collect::<Vec<_>>(), by_ip);
        let collected: IpMap<usize> = ips.iter().copied().zip(0..).collect();
        assert_eq!(collected.len(), ips.len());
        assert_eq!(
            collected.iter().collect::<Vec<_>>(),
            map.iter().collect::<Vec<_>>()
        );
        assert_eq!(map.remove(&ips[0]), Some(0));
        assert_eq!(map.get(&ips[0]), None);
        assert_eq!(map.len(), ips.len() - 1);
    }

    /// Against `BTreeMap<IpAddr, _>` as the model: the same answers and the same order after
    /// a long run of inserts, replacements and removals over both families, with IPv4
    /// addresses and their IPv4-mapped IPv6 forms side by side.
    #[test]
    fn answers_as_a_btreemap_by_ipaddr_does() {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let pick = |n: u64| -> IpAddr {
            let low = (n >> 8) as u32 % 64;
            match n % 4 {
                0 => IpAddr::V4(Ipv4Addr::from_bits(0x0a00_0000 + low)),
                1 => IpAddr::V4(Ipv4Addr::from_bits(u32::MAX - low)),
                2 => IpAddr::V6(Ipv4Addr::from_bits(0x0a00_0000 + low).to_ipv6_mapped()),
                _ => IpAddr::V6(Ipv6Addr::from_bits(u128::MAX - u128::from(low))),
            }
        };
        let mut map = IpMap::default();
        let mut model = BTreeMap::new();
        for step in 0..20_000u32 {
            let n = next();
            let ip = pick(n);
            match (n >> 16) % 3 {
                0 | 1 => assert_eq!(map.insert(ip, step), model.insert(ip, step), "{ip}"),
                _ => assert_eq!(map.remove(&ip), model.remove(&ip), "{ip}"),
            }
            assert_eq!(map.get(&ip), model.get(&ip), "{ip}");
            assert_eq!(map.len(), model.len());
        }
        assert!(map.len() > 100, "the run left {} entries", map.len());
        let entries: Vec<(IpAddr, u32)> = map.iter().map(|(ip, v)| (ip, *v)).collect();
        let expected: Vec<(IpAddr, u32)> = model.iter().map(|(ip, v)| (*ip, *v)).collect();
        assert_eq!(entries, expected);
        assert_eq!(
            map.keys().collect::<Vec<_>>(),
            model.keys().copied().collect::<Vec<_>>()
        );
        let rebuilt: IpMap<u32> = expected.iter().rev().copied().collect();
        assert_eq!(
            rebuilt.iter().map(|(ip, v)| (ip, *v)).collect::<Vec<_>>(),
            expected
        );
    }

    /// Collected from pairs in any order, a later pair of an IP wins, as in a `BTreeMap`; the
    /// runs at each end of both families hold their addresses.
    #[test]
    fn a_collected_map_keeps_the_last_value_of_each_ip() {
        let ips: Vec<IpAddr> = [
            "0.0.0.0",
            "0.0.0.7",
            "0.0.0.8",
            "255.255.255.255",
            "::",
            "::7",
            "::8",
        ]
        .iter()
        .map(|ip| ip.parse().unwrap())
        .chain([IpAddr::V6(Ipv6Addr::from_bits(u128::MAX))])
        .collect();
        let pairs: Vec<(IpAddr, usize)> = ips
            .iter()
            .rev()
            .chain(ips.iter())
            .copied()
            .zip(0..)
            .collect();
        let map: IpMap<usize> = pairs.iter().copied().collect();
        let model: BTreeMap<IpAddr, usize> = pairs.iter().copied().collect();
        assert_eq!(map.len(), ips.len());
        assert_eq!(
            map.iter().map(|(ip, v)| (ip, *v)).collect::<Vec<_>>(),
            model.into_iter().collect::<Vec<_>>()
        );
    }

    /// A run whose addresses are all removed is dropped: what the map keeps follows what it
    /// holds, not every address it ever held.
    #[test]
    fn an_emptied_run_is_dropped() {
        let mut map = IpMap::default();
        for n in 0..64u32 {
            map.insert(v4(0x0a00_0000 + n), n);
        }
        assert_eq!(map.v4.runs.len(), 8);
        for n in 0..60u32 {
            assert_eq!(map.remove(&v4(0x0a00_0000 + n)), Some(n));
        }
        assert_eq!(map.v4.runs.len(), 1);
        assert_eq!(map.len(), 4);
        assert_eq!(map.remove(&v4(0x0a00_0000)), None);
        assert_eq!(
            map.keys().collect::<Vec<_>>(),
            (60..64).map(|n| v4(0x0a00_0000 + n)).collect::<Vec<_>>()
        );
    }
}
