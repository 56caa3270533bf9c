//! The allocator's index of claims by key ([`ByKey`]): the 64-bit keys of their request UIDs,
//! pod UIDs and tokens ([`claim::uid_key`](ip_webhook_ledger::claim::uid_key),
//! [`claim::token_key`](ip_webhook_ledger::claim::token_key)), each naming the IPs of the
//! claims filed under it.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use ip_webhook_ledger::Claim;
use ip_webhook_ledger::ip_map::IpMap;

/// IPs by the 64-bit keys of their claims' request UIDs, pod UIDs and tokens. Keys are
/// hashes: readers check each claim's own fields, so two strings that share a key cost a
/// filter, never a wrong answer.
///
/// A key is in one of two maps. Almost every key names one IPv4 address, kept as its 4 bytes
/// in `v4` ([`V4ByKey`]). An IPv6 address, or more than one IP (a dual-stack pod), goes to
/// `other`, and a key left with one IPv4 address comes back to `v4`. A retry's lookup, which
/// almost always finds nothing, reads both: `other` is empty in an IPv4-only cluster and `v4`
/// in a dual-stack one.
#[derive(Default)]
pub(super) struct ByKey {
    v4: V4ByKey,
    other: BTreeMap<u64, Ips>,
}

/// One IPv4 address by key, in [`V4ByKey::TABLES`] hash tables chosen by the key's low bits.
///
/// Every grant looks its request's key up (a retry finds its answer there; a fresh request,
/// nearly every one, finds nothing) and files it. Among hundreds of thousands of keys a
/// B-tree's descent misses the cache at each of its lower levels; a table's lookup reads one
/// group of control bytes, and a new key's entry one more line (docs/performance.md, "The
/// index by key in hash tables"). A table grows by doubling, and a doubling moves only that
/// table's keys, about 1/256 of them: no admission waits for the whole index to move, as it
/// did behind one hash map's rehash ("B-trees instead of hash maps"). The keys are spread
/// evenly, so the tables double in the same stretch of grants, one grant in a few hundred
/// paying for one table (about 0.1–0.3 ms at two million keys).
///
/// A table that has shrunk to a quarter of its room is rebuilt at half full
/// ([`V4ByKey::remove`]): the memory a mass release frees is given back, as a B-tree's nodes
/// are.
struct V4ByKey {
    tables: Box<[V4Table]>,
}

/// foldhash, seeded per table: the keys are hashes seeded per process, but a token's first
/// digits show its request's key, so a table's own seed keeps anyone who learns keys from
/// choosing ones that crowd a table's probe sequence.
type V4Table = HashMap<SplitKey, u32, foldhash::fast::RandomState>;

/// A 64-bit key as two `u32`s: aligned to 4 bytes, so that an entry with its IPv4 address
/// takes 12 bytes, not 16 (13 with the table's control byte).
#[derive(Clone, Copy, PartialEq, Eq)]
struct SplitKey([u32; 2]);

impl SplitKey {
    fn new(key: u64) -> SplitKey {
        SplitKey([(key >> 32) as u32, key as u32])
    }

    fn get(self) -> u64 {
        u64::from(self.0[0]) << 32 | u64::from(self.0[1])
    }
}

impl Hash for SplitKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.get());
    }
}

impl Default for V4ByKey {
    fn default() -> Self {
        V4ByKey {
            tables: (0..V4ByKey::TABLES).map(|_| V4Table::default()).collect(),
        }
    }
}

impl V4ByKey {
    /// A power of two. An empty table allocates nothing, so a small cluster pays 256 tables'
    /// heads (10 KiB); at a million keys (half a million bound claims: a request's key and a
    /// pod's) a table holds about 3,900.
    const TABLES: usize = 256;

    fn table(&self, key: u64) -> &V4Table {
        &self.tables[key as usize & (V4ByKey::TABLES - 1)]
    }

    fn table_mut(&mut self, key: u64) -> &mut V4Table {
        &mut self.tables[key as usize & (V4ByKey::TABLES - 1)]
    }

    fn get(&self, key: u64) -> Option<u32> {
        self.table(key).get(&SplitKey::new(key)).copied()
    }

    fn insert(&mut self, key: u64, ip: u32) {
        self.table_mut(key).insert(SplitKey::new(key), ip);
    }

    /// Drop `key`, and rebuild its table at half full once it fills no more than a quarter of
    /// its room: growing again takes more than as many adds as the rebuild moved keys.
    fn remove(&mut self, key: u64) -> Option<u32> {
        let table = self.table_mut(key);
        let held = table.remove(&SplitKey::new(key));
        if table.len() * 4 <= table.capacity() {
            table.shrink_to(table.len() * 2);
        }
        held
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.tables.iter().map(HashMap::len).sum()
    }

    #[cfg(test)]
    fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.tables
            .iter()
            .flat_map(|table| table.keys().map(|key| key.get()))
    }
}

/// The IPs under one key of [`ByKey::other`], in the order they were indexed, one inline.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ips {
    One(IpAddr),
    Many(Box<[IpAddr]>),
}

impl Ips {
    /// Add `ip` after the others, unless it is there already.
    fn push(&mut self, ip: IpAddr) {
        if self.as_slice().contains(&ip) {
            return;
        }
        let mut ips = self.as_slice().to_vec();
        ips.push(ip);
        *self = Ips::Many(ips.into_boxed_slice());
    }

    /// Drop `ip`; `false` when nothing is left.
    fn remove(&mut self, ip: IpAddr) -> bool {
        if !self.as_slice().contains(&ip) {
            return true;
        }
        let left: Vec<IpAddr> = self
            .as_slice()
            .iter()
            .copied()
            .filter(|held| *held != ip)
            .collect();
        *self = match left.as_slice() {
            [] => return false,
            [one] => Ips::One(*one),
            _ => Ips::Many(left.into_boxed_slice()),
        };
        true
    }

    fn as_slice(&self) -> &[IpAddr] {
        match self {
            Ips::One(ip) => std::slice::from_ref(ip),
            Ips::Many(ips) => ips,
        }
    }
}

impl ByKey {
    pub(super) fn add(&mut self, key: u64, ip: IpAddr) {
        if let Some(ips) = self.other.get_mut(&key) {
            ips.push(ip);
            return;
        }
        let held = match ip {
            IpAddr::V4(v4) => match self.v4.table_mut(key).entry(SplitKey::new(key)) {
                Entry::Vacant(entry) => {
                    entry.insert(v4.to_bits());
                    return;
                }
                Entry::Occupied(entry) if *entry.get() == v4.to_bits() => return,
                Entry::Occupied(_) => self.v4.remove(key),
            },
            // not through `entry`, which makes room for a key it would not keep
            IpAddr::V6(_) => self.v4.remove(key),
        };
        let ips = match held {
            Some(held) => {
                let mut ips = Ips::One(v4_ip(held));
                ips.push(ip);
                ips
            }
            None => Ips::One(ip),
        };
        self.other.insert(key, ips);
    }

    pub(super) fn remove(&mut self, key: u64, ip: IpAddr) {
        if let Some(held) = self.v4.get(key) {
            if ip == v4_ip(held) {
                self.v4.remove(key);
            }
            return;
        }
        let Some(ips) = self.other.get_mut(&key) else {
            return;
        };
        if !ips.remove(ip) {
            self.other.remove(&key);
        } else if let Ips::One(IpAddr::V4(left)) = *ips {
            // back to one IPv4 address (a dual-stack pod's IPv6 claim gone): its 4 bytes again
            self.other.remove(&key);
            self.v4.insert(key, left.to_bits());
        }
    }

    /// `read` of the IPs under `key`, in the order they were indexed, whichever map holds
    /// them; no list is copied.
    fn with_ips<T>(&self, key: u64, read: impl FnOnce(&[IpAddr]) -> T) -> T {
        match self.v4.get(key) {
            Some(held) => read(&[v4_ip(held)]),
            None => read(self.other.get(&key).map_or(&[], Ips::as_slice)),
        }
    }

    /// The claims under `key` that `owns` confirms, in the order they were indexed.
    pub(super) fn claims<'a>(
        &self,
        key: u64,
        claims: &'a IpMap<Arc<Claim>>,
        owns: impl Fn(&Claim) -> bool,
    ) -> Vec<&'a Claim> {
        self.with_ips(key, |ips| {
            ips.iter()
                .filter_map(|ip| claims.get(ip).map(|claim| &**claim))
                .filter(|claim| owns(claim))
                .collect()
        })
    }

    /// The IPs under `key`, in the order they were indexed.
    #[cfg(test)]
    pub(super) fn ips(&self, key: u64) -> Vec<IpAddr> {
        self.with_ips(key, <[IpAddr]>::to_vec)
    }

    /// How many keys name an IP.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.v4.len() + self.other.len()
    }

    /// How many keys name one IPv4 address, kept in 4 bytes.
    #[cfg(test)]
    pub(super) fn v4_len(&self) -> usize {
        self.v4.len()
    }

    /// Every key with its IPs, by key.
    #[cfg(test)]
    pub(super) fn entries(&self) -> Vec<(u64, Vec<IpAddr>)> {
        let mut entries: Vec<(u64, Vec<IpAddr>)> = self
            .v4
            .keys()
            .chain(self.other.keys().copied())
            .map(|key| (key, self.ips(key)))
            .collect();
        entries.sort();
        entries
    }
}

/// An IPv4 address from the 4 bytes [`ByKey`] keeps it in.
fn v4_ip(bits: u32) -> IpAddr {
    IpAddr::V4(std::net::Ipv4Addr::from_bits(bits))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ip_webhook_ledger::claim;

    #[test]
    fn an_ipv4_entry_takes_12_bytes() {
        assert_eq!(std::mem::size_of::<(SplitKey, u32)>(), 12);
        for key in [0, 1, u64::MAX, 0x8000_0000_0000_0001, claim::uid_key("a")] {
            assert_eq!(SplitKey::new(key).get(), key);
        }
    }

    #[test]
    fn a_key_keeps_its_ips_in_order_and_one_ip_inline() {
        let v6: IpAddr = "fd00::1".parse().unwrap();
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let pod = claim::uid_key("pod");
        let mut by_key = ByKey::default();
        by_key.add(pod, v6);
        assert_eq!(by_key.other.get(&pod), Some(&Ips::One(v6)));
        by_key.add(pod, v4);
        by_key.add(pod, v6);
        assert_eq!(
            by_key.ips(pod),
            [v6, v4],
            "in the order indexed, not the order of the addresses, each IP once"
        );
        by_key.remove(pod, v6);
        assert_eq!(by_key.ips(pod), [v4]);
        assert_eq!(
            (by_key.v4.len(), by_key.other.len()),
            (1, 0),
            "back in 4 bytes"
        );
        by_key.remove(pod, v6);
        assert_eq!(
            by_key.len(),
            1,
            "removing an IP the key lacks changes nothing"
        );
        by_key.remove(pod, v4);
        assert_eq!(by_key.len(), 0, "a key with no IP left is dropped");
        // one IPv4 address goes to the 4-byte map, and moves out when a second IP joins it
        by_key.add(pod, v4);
        assert_eq!((by_key.v4.len(), by_key.other.len()), (1, 0));
        by_key.add(pod, v4);
        assert_eq!(
            (by_key.v4.len(), by_key.other.len()),
            (1, 0),
            "each IP once"
        );
        by_key.add(pod, v6);
        assert_eq!((by_key.v4.len(), by_key.other.len()), (0, 1));
        assert_eq!(by_key.ips(pod), [v4, v6]);
        // an enum no larger than the Vec it replaced, so the B-tree's nodes do not grow
        assert!(std::mem::size_of::<Ips>() <= std::mem::size_of::<Vec<IpAddr>>());
    }

    /// xorshift64: the model tests' moves, the same on every run.
    fn moves(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    /// Against a map of keys to lists as the model: the same IPs in the same order under each
    /// key after a long run of adds and removes of IPv4 and IPv6 addresses over a few keys,
    /// which differ in their low bits (the table) and in their high ones.
    #[test]
    fn by_key_answers_as_a_map_of_lists_does() {
        let mut next = moves(0x2545_f491_4f6c_dd1d);
        let ips: Vec<IpAddr> = ["10.0.0.1", "10.0.0.2", "fd00::1", "fd00::2", "0.0.0.0"]
            .iter()
            .map(|ip| ip.parse().unwrap())
            .collect();
        let keys = [0, 1, 256, 1 << 32, u64::MAX, claim::uid_key("uid")];
        let mut by_key = ByKey::default();
        let mut model: BTreeMap<u64, Vec<IpAddr>> = BTreeMap::new();
        for _ in 0..20_000 {
            let n = next();
            let key = keys[n as usize % keys.len()];
            let ip = ips[(n >> 8) as usize % ips.len()];
            if (n >> 16) % 3 < 2 {
                by_key.add(key, ip);
                let list = model.entry(key).or_default();
                if !list.contains(&ip) {
                    list.push(ip);
                }
            } else {
                by_key.remove(key, ip);
                if let Some(list) = model.get_mut(&key) {
                    list.retain(|held| *held != ip);
                    if list.is_empty() {
                        model.remove(&key);
                    }
                }
            }
            assert_eq!(
                by_key.ips(key),
                model.get(&key).cloned().unwrap_or_default()
            );
            assert!(
                by_key.v4.keys().all(|k| !by_key.other.contains_key(&k)),
                "a key in both maps"
            );
            assert!(
                by_key
                    .other
                    .values()
                    .all(|ips| !matches!(ips, Ips::One(IpAddr::V4(_)))),
                "one IPv4 address kept in the map for others"
            );
        }
        assert_eq!(by_key.entries(), model.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn ipv6_addresses_take_no_room_in_the_ipv4_tables() {
        let mut by_key = ByKey::default();
        for n in 0..2_000u64 {
            by_key.add(n, "fd00::1".parse().unwrap());
        }
        assert_eq!(by_key.other.len(), 2_000);
        assert!(by_key.v4.tables.iter().all(|table| table.capacity() == 0));
    }

    /// A mass release gives the tables' memory back, as a B-tree gives its nodes.
    #[test]
    fn emptied_tables_give_their_room_back() {
        let mut next = moves(0x1234_5678_9abc_def1);
        let mut by_key = ByKey::default();
        let keys: Vec<u64> = (0..100_000).map(|_| next()).collect();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        for &key in &keys {
            by_key.add(key, ip);
        }
        let room =
            |by_key: &ByKey| -> usize { by_key.v4.tables.iter().map(HashMap::capacity).sum() };
        assert!(room(&by_key) >= 100_000);
        for &key in &keys[..90_000] {
            by_key.remove(key, ip);
        }
        assert!(
            room(&by_key) <= 4 * 10_000,
            "{} entries of room for 10,000 keys",
            room(&by_key)
        );
        for &key in &keys[90_000..] {
            assert_eq!(by_key.ips(key), [ip]);
            by_key.remove(key, ip);
        }
        assert_eq!(room(&by_key), 0);
    }

    /// Many keys, as a cluster's claims make them: every table fills and doubles, keys
    /// removed and filed again, and each answers as the model does.
    #[test]
    fn tables_answer_through_their_growth() {
        let mut next = moves(0x9e37_79b9_7f4a_7c15);
        let mut by_key = ByKey::default();
        let mut model: BTreeMap<u64, IpAddr> = BTreeMap::new();
        let mut filed: Vec<u64> = Vec::new();
        for n in 0..120_000u32 {
            let step = next();
            if step.is_multiple_of(4) && !filed.is_empty() {
                let key = filed.swap_remove((step >> 8) as usize % filed.len());
                let ip = model.remove(&key).expect("filed");
                by_key.remove(key, ip);
                assert!(by_key.ips(key).is_empty());
            } else {
                let key = next();
                let ip = IpAddr::from(std::net::Ipv4Addr::from_bits(n));
                by_key.add(key, ip);
                model.insert(key, ip);
                filed.push(key);
            }
        }
        assert_eq!(by_key.v4.len(), model.len());
        assert!(
            by_key.v4.tables.iter().all(|table| table.len() > 100),
            "every table has its share of the keys"
        );
        for (&key, &ip) in &model {
            assert_eq!(by_key.ips(key), [ip]);
        }
        for _ in 0..1_000 {
            assert!(by_key.ips(next()).is_empty(), "a key never filed");
        }
        assert!(by_key.other.is_empty());
    }
}
