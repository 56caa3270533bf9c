//! [`IpMap`]: a B-tree map by IP address whose keys compare as integers.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// An IP address as a B-tree key, in `IpAddr`'s order (every IPv4 address before every IPv6
/// one, each family by value) and of its size. `IpAddr`'s own `Ord` compares an IPv4 address
/// octet by octet and an IPv6 one segment by segment; this compares each as one integer. A
/// lookup among 100,000 claims makes about twenty comparisons, and every grant looks up the
/// allocator's map and the journal's and inserts into both.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Key(IpAddr);

impl Ord for Key {
    #[inline]
    fn cmp(&self, other: &Key) -> Ordering {
        match (self.0, other.0) {
            (IpAddr::V4(a), IpAddr::V4(b)) => a.to_bits().cmp(&b.to_bits()),
            (IpAddr::V6(a), IpAddr::V6(b)) => a.to_bits().cmp(&b.to_bits()),
            (IpAddr::V4(_), IpAddr::V6(_)) => Ordering::Less,
            (IpAddr::V6(_), IpAddr::V4(_)) => Ordering::Greater,
        }
    }
}

impl PartialOrd for Key {
    #[inline]
    fn partial_cmp(&self, other: &Key) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A `BTreeMap<IpAddr, V>` (the same order, the same memory) with cheaper comparisons.
pub struct IpMap<V>(BTreeMap<Key, V>);

impl<V> Default for IpMap<V> {
    fn default() -> Self {
        IpMap(BTreeMap::new())
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
        self.0.get(&Key(*ip))
    }

    #[inline]
    pub fn insert(&mut self, ip: IpAddr, value: V) -> Option<V> {
        self.0.insert(Key(ip), value)
    }

    #[inline]
    pub fn remove(&mut self, ip: &IpAddr) -> Option<V> {
        self.0.remove(&Key(*ip))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entries in the order of their IPs.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&IpAddr, &V)> {
        self.0.iter().map(|(key, value)| (&key.0, value))
    }

    /// The IPs in order.
    pub fn keys(&self) -> impl Iterator<Item = &IpAddr> {
        self.0.keys().map(|key| &key.0)
    }

    /// The values in the order of their IPs.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.0.values()
    }
}

impl<V> FromIterator<(IpAddr, V)> for IpMap<V> {
    /// Built at once, its nodes full, as a `BTreeMap` collected from an iterator is.
    fn from_iter<I: IntoIterator<Item = (IpAddr, V)>>(entries: I) -> Self {
        IpMap(entries.into_iter().map(|(ip, v)| (Key(ip), v)).collect())
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
        assert_eq!(map.keys().copied().collect::<Vec<_>>(), sorted);
        for (n, ip) in ips.iter().enumerate() {
            assert_eq!(map.get(ip), Some(&n));
            for other in &ips {
                assert_eq!(Key(*ip).cmp(&Key(*other)), ip.cmp(other), "{ip} {other}");
            }
        }
        let collected: IpMap<usize> = ips.iter().copied().zip(0..).collect();
        assert_eq!(collected.len(), ips.len());
        assert_eq!(map.remove(&ips[0]), Some(0));
        assert_eq!(map.get(&ips[0]), None);
        assert_eq!(map.len(), ips.len() - 1);
    }
}
