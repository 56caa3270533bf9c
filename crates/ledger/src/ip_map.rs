//! [`IpMap`]: a B-tree map by IP address, one map per family keyed by the address's integer.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A `BTreeMap<IpAddr, V>` (the same order: every IPv4 address before every IPv6 one, each
/// family by value) in less memory and with cheaper comparisons. The allocator and the
/// journal each keep one entry per held IP for the life of the process, and every byte a claim
/// keeps costs CPU on later grants (docs/performance.md, "What remembering a claim costs"):
/// with 8-byte values, a leaf of 11 IPv4 entries keyed by `u32` takes 144 bytes, against 288
/// with 17-byte `IpAddr` keys. `IpAddr`'s own `Ord` compares an IPv4 address octet by octet and
/// an IPv6 one segment by segment; these keys compare as one integer each.
pub struct IpMap<V> {
    v4: BTreeMap<u32, V>,
    v6: BTreeMap<u128, V>,
}

impl<V> Default for IpMap<V> {
    fn default() -> Self {
        IpMap {
            v4: BTreeMap::new(),
            v6: BTreeMap::new(),
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
            IpAddr::V4(ip) => self.v4.get(&ip.to_bits()),
            IpAddr::V6(ip) => self.v6.get(&ip.to_bits()),
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
            IpAddr::V4(ip) => self.v4.remove(&ip.to_bits()),
            IpAddr::V6(ip) => self.v6.remove(&ip.to_bits()),
        }
    }

    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    /// The entries in the order of their IPs.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (IpAddr, &V)> {
        let v4 = self.v4.iter().map(|(&bits, value)| (v4(bits), value));
        let v6 = self.v6.iter().map(|(&bits, value)| (v6(bits), value));
        v4.chain(v6)
    }

    /// The IPs in order.
    pub fn keys(&self) -> impl Iterator<Item = IpAddr> {
        self.iter().map(|(ip, _)| ip)
    }

    /// The values in the order of their IPs.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.v4.values().chain(self.v6.values())
    }
}

fn v4(bits: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from_bits(bits))
}

fn v6(bits: u128) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from_bits(bits))
}

impl<V> FromIterator<(IpAddr, V)> for IpMap<V> {
    /// Built at once, its nodes full, as a `BTreeMap` collected from an iterator is.
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
            v4: v4.into_iter().collect(),
            v6: v6.into_iter().collect(),
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
}
