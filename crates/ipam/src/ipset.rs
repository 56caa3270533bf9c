//! IP specs: the one parser for lists, ranges and CIDRs, and the canonical set they denote.
//!
//! A spec is a comma-separated list of entries; each entry is an IP (`10.0.0.10`), an inclusive
//! range (`10.0.0.20-10.0.0.29`), or a CIDR (`10.0.1.0/28`). IPv4 and IPv6 may be mixed. A CIDR
//! entry stands for its usable addresses: for IPv4 prefixes shorter than /31 the network and
//! broadcast addresses are left out, for IPv6 prefixes shorter than /127 the subnet-router
//! anycast address (the first) is (list them explicitly to include them). IPv4-mapped IPv6
//! addresses (`::ffff:10.0.0.1`) are refused: the CNI would treat them as IPv4.
//!
//! An [`IpSet`] keeps, per address family, sorted disjoint inclusive ranges of integers, so a
//! /8 or a /64 costs one range, and the n-th address of a set is a binary search away.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::IpNet;

/// Address family of an IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: &IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    /// Address width in bits.
    pub fn bits(self) -> u32 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

/// An IP as (family, integer): the key every index in this crate uses.
pub fn ip_key(ip: &IpAddr) -> (Family, u128) {
    match ip {
        IpAddr::V4(v4) => (Family::V4, u32::from(*v4) as u128),
        IpAddr::V6(v6) => (Family::V6, u128::from(*v6)),
    }
}

pub fn ip_from_key(family: Family, value: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(value as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

/// How much of a user's text an error message quotes.
const QUOTED_CHARS: usize = 64;

/// `text` as an error message quotes it: whole when short, else its start and its size, so a
/// megabyte of garbage in an annotation gives a message of a line, not a megabyte.
pub fn excerpt(text: &str) -> String {
    match text.char_indices().nth(QUOTED_CHARS) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}… ({} bytes)", &text[..cut], text.len()),
    }
}

/// An IP in canonical form: IPv4-mapped IPv6 is not folded (it is a distinct address), but an
/// IPv6 written two ways (`fd00::0a`, `fd00:0:0::a`) parses to one value, displayed once.
pub fn parse_ip(text: &str) -> Result<IpAddr, IpSpecError> {
    let trimmed = text.trim();
    IpAddr::from_str(trimmed).map_err(|_| IpSpecError::InvalidIp(excerpt(trimmed)))
}

/// The label value form of an IP (`ip-webhook.io/allocated-ip`). Labels allow no `:` and must
/// start and end with an alphanumeric, so IPv6 is written with `-` for `:` (`fd00--a`), or, when
/// that form would start or end with `-` (`fd00:10::` → `fd00-10--`, `::1`), as its 32 hex
/// digits (`fd000010000000000000000000000000`). Always a valid label value of at most 39 bytes.
pub fn ip_label_value(ip: &IpAddr) -> String {
    let mut text = String::with_capacity(15);
    push_ip(&mut text, ip);
    if let IpAddr::V6(v6) = ip {
        text = text.replace(':', "-");
        if text.starts_with('-') || text.ends_with('-') || text.contains('.') {
            text = format!("{:032x}", u128::from(*v6));
        }
    }
    text
}

/// Append `ip` as `Display` writes it, IPv4 without the formatting machinery: an admission
/// writes its IP several times (CNI annotation, label, log line).
pub fn push_ip(out: &mut String, ip: &IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                if octet >= 100 {
                    out.push(char::from(b'0' + octet / 100));
                }
                if octet >= 10 {
                    out.push(char::from(b'0' + octet / 10 % 10));
                }
                out.push(char::from(b'0' + octet % 10));
            }
        }
        IpAddr::V6(_) => {
            use std::fmt::Write;
            let _ = write!(out, "{ip}");
        }
    }
}

/// Inverse of [`ip_label_value`]: `None` for a value of a form it does not write (an IPv6
/// `-` form that starts or ends with `-` or holds a `.`).
pub fn ip_from_label_value(value: &str) -> Option<IpAddr> {
    if value.len() == 32 && value.bytes().all(|b| b.is_ascii_hexdigit()) {
        return u128::from_str_radix(value, 16)
            .ok()
            .map(|v| IpAddr::V6(std::net::Ipv6Addr::from(v)));
    }
    if !value.contains('-') {
        return value.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4);
    }
    if value.starts_with('-') || value.ends_with('-') || value.contains('.') {
        return None;
    }
    value
        .replace('-', ":")
        .parse::<std::net::Ipv6Addr>()
        .ok()
        .map(IpAddr::V6)
}

/// Whether `value` is a valid Kubernetes label value: at most 63 characters, alphanumerics,
/// `-`, `_` and `.`, starting and ending with an alphanumeric (or empty).
#[cfg(test)]
pub(crate) fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    if bytes.is_empty() {
        return true;
    }
    bytes.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpSpecError {
    #[error("{0:?} is not an IP address")]
    InvalidIp(String),
    #[error("the list is empty")]
    Empty,
    #[error("entry {index} {entry:?}: {reason}")]
    Entry {
        index: usize,
        entry: String,
        reason: EntryError,
    },
    #[error("entry {index} {entry:?} overlaps entry {other_index} {other:?}")]
    Overlap {
        index: usize,
        entry: String,
        other_index: usize,
        other: String,
    },
}

/// Why one entry of a list (an IP, a CIDR or a range) is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error(
        "IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) cannot be given to pods; write the IPv4 address instead"
    )]
    V4Mapped,
    #[error("not a valid CIDR")]
    NotCidr,
    #[error("host bits are set; did you mean {0}?")]
    HostBits(IpNet),
    /// The text (shortened) that is not an IP address.
    #[error("{0:?} is not an IP address")]
    NotAnIp(String),
    #[error("a range cannot mix IPv4 and IPv6")]
    MixedFamilies,
    #[error("the range is reversed ({first} is after {last})")]
    Reversed { first: IpAddr, last: IpAddr },
}

/// An IP address of an entry, or why it is not one.
fn entry_ip(text: &str) -> Result<IpAddr, EntryError> {
    let trimmed = text.trim();
    IpAddr::from_str(trimmed).map_err(|_| EntryError::NotAnIp(excerpt(trimmed)))
}

/// One inclusive range of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IpRange {
    pub family: Family,
    pub start: u128,
    pub end: u128,
}

impl IpRange {
    pub fn single(ip: IpAddr) -> IpRange {
        let (family, value) = ip_key(&ip);
        IpRange {
            family,
            start: value,
            end: value,
        }
    }

    pub fn len(&self) -> u128 {
        (self.end - self.start).saturating_add(1)
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn first(&self) -> IpAddr {
        ip_from_key(self.family, self.start)
    }

    pub fn last(&self) -> IpAddr {
        ip_from_key(self.family, self.end)
    }

    pub fn overlaps(&self, other: &IpRange) -> bool {
        self.family == other.family && self.start <= other.end && other.start <= self.end
    }

    /// The usable addresses of a CIDR (see the module docs).
    pub(crate) fn from_net(net: &IpNet) -> IpRange {
        let family = Family::of(&net.network());
        let (_, mut start) = ip_key(&net.network());
        let (_, mut end) = ip_key(&net.broadcast());
        match family {
            Family::V4 if net.prefix_len() < 31 => {
                start += 1;
                end -= 1;
            }
            // the subnet-router anycast address (RFC 4291 2.6.1); /127 links use both (RFC 6164)
            Family::V6 if net.prefix_len() < 127 => start += 1,
            _ => {}
        }
        IpRange { family, start, end }
    }

    /// The whole CIDR, network and broadcast included.
    pub fn from_net_all(net: &IpNet) -> IpRange {
        let (family, start) = ip_key(&net.network());
        let (_, end) = ip_key(&net.broadcast());
        IpRange { family, start, end }
    }
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.start == self.end {
            write!(f, "{}", self.first())
        } else {
            write!(f, "{}-{}", self.first(), self.last())
        }
    }
}

/// A canonical set of IPs: sorted, disjoint, adjacent ranges merged.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct IpSet {
    ranges: Vec<IpRange>,
}

/// How a spec writes ranges: `a-b` (annotations, IPPools) or `a..b` (Kube-OVN `excludeIps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeSyntax {
    Dash,
    DotDot,
}

/// Parse a spec; overlapping or duplicate entries are an error that names both entries.
pub fn parse_ip_spec(spec: &str) -> Result<IpSet, IpSpecError> {
    parse_ip_spec_with(spec, RangeSyntax::Dash)
}

/// The entries of a spec, trimmed, empty ones skipped.
fn spec_entries(spec: &str) -> impl Iterator<Item = &str> {
    spec.split([',', '\n', ';'])
        .map(str::trim)
        .filter(|e| !e.is_empty())
}

pub fn parse_ip_spec_with(spec: &str, syntax: RangeSyntax) -> Result<IpSet, IpSpecError> {
    // One range per entry, at most one entry per separator: reserved once, so a list of
    // 20,000 IPs holds 20,000 ranges while it is parsed, not room for 32,768 of them.
    let most = 1 + spec
        .bytes()
        .filter(|b| matches!(b, b',' | b'\n' | b';'))
        .count();
    let mut ranges: Vec<IpRange> = Vec::with_capacity(most);
    for (position, raw) in spec_entries(spec).enumerate() {
        let range = parse_entry(raw, syntax).map_err(|reason| IpSpecError::Entry {
            index: position + 1,
            entry: excerpt(raw),
            reason,
        })?;
        ranges.push(range);
    }
    if ranges.is_empty() {
        return Err(IpSpecError::Empty);
    }
    ranges.sort_unstable();
    if ranges.windows(2).any(|pair| pair[0].overlaps(&pair[1])) {
        return Err(overlap(spec, syntax));
    }
    let set = IpSet::merge_sorted(ranges);
    let mapped = IpSet::from_ranges([IpRange {
        family: Family::V6,
        start: V4_MAPPED.0,
        end: V4_MAPPED.1,
    }]);
    Ok(if set.intersects(&mapped) {
        set.subtract(&mapped)
    } else {
        set
    })
}

/// The error for a spec whose entries overlap (every entry parses): the first overlap in
/// address order, naming the later entry and the one it overlaps. The rare path, so it
/// parses again, keeping each entry's position and text.
fn overlap(spec: &str, syntax: RangeSyntax) -> IpSpecError {
    let mut entries: Vec<(IpRange, usize, &str)> = spec_entries(spec)
        .enumerate()
        .filter_map(|(position, raw)| Some((parse_entry(raw, syntax).ok()?, position + 1, raw)))
        .collect();
    entries.sort_by_key(|(range, index, _)| (*range, *index));
    for pair in entries.windows(2) {
        let (a, a_index, a_text) = pair[0];
        let (b, b_index, b_text) = pair[1];
        if a.overlaps(&b) {
            let ((index, entry), (other_index, other)) = if a_index > b_index {
                ((a_index, a_text), (b_index, b_text))
            } else {
                ((b_index, b_text), (a_index, a_text))
            };
            return IpSpecError::Overlap {
                index,
                entry: excerpt(entry),
                other_index,
                other: excerpt(other),
            };
        }
    }
    unreachable!("called for a spec with overlapping entries")
}

/// `::ffff:0.0.0.0/96`: IPv4-mapped IPv6 addresses.
const V4_MAPPED: (u128, u128) = (0xffff_0000_0000, 0xffff_ffff_ffff);

fn parse_entry(entry: &str, syntax: RangeSyntax) -> Result<IpRange, EntryError> {
    let range = parse_entry_range(entry, syntax)?;
    let overlaps = range.start <= V4_MAPPED.1 && V4_MAPPED.0 <= range.end;
    let spans = range.start < V4_MAPPED.0 && V4_MAPPED.1 < range.end;
    // a wider CIDR or range around them (`::/0`) just leaves them out
    if range.family == Family::V6 && overlaps && !spans {
        return Err(EntryError::V4Mapped);
    }
    Ok(range)
}

fn parse_entry_range(entry: &str, syntax: RangeSyntax) -> Result<IpRange, EntryError> {
    if entry.contains('/') {
        let net = IpNet::from_str(entry).map_err(|_| EntryError::NotCidr)?;
        if net.trunc() != net {
            return Err(EntryError::HostBits(net.trunc()));
        }
        return Ok(IpRange::from_net(&net));
    }
    let separator = match syntax {
        RangeSyntax::Dash => "-",
        RangeSyntax::DotDot => "..",
    };
    if let Some((first, last)) = entry.split_once(separator) {
        let first = entry_ip(first)?;
        let last = entry_ip(last)?;
        let (fa, start) = ip_key(&first);
        let (fb, end) = ip_key(&last);
        if fa != fb {
            return Err(EntryError::MixedFamilies);
        }
        if start > end {
            return Err(EntryError::Reversed { first, last });
        }
        return Ok(IpRange {
            family: fa,
            start,
            end,
        });
    }
    entry_ip(entry).map(IpRange::single)
}

impl IpSet {
    /// Build from any ranges: sorts and merges overlapping or adjacent ones.
    pub fn from_ranges(ranges: impl IntoIterator<Item = IpRange>) -> IpSet {
        let mut ranges: Vec<IpRange> = ranges.into_iter().collect();
        ranges.sort_unstable();
        IpSet::merge_sorted(ranges)
    }

    /// Build from ranges already in ascending order, merging overlapping or adjacent ones in
    /// place. The storage is then cut to what the merged set needs: 17,000 adjacent IPs keep
    /// one range, not room for 17,000.
    fn merge_sorted(mut ranges: Vec<IpRange>) -> IpSet {
        let mut kept: usize = 0;
        for i in 0..ranges.len() {
            let range = ranges[i];
            match kept.checked_sub(1).map(|last| &mut ranges[last]) {
                Some(last)
                    if last.family == range.family && range.start <= last.end.saturating_add(1) =>
                {
                    last.end = last.end.max(range.end);
                }
                _ => {
                    ranges[kept] = range;
                    kept += 1;
                }
            }
        }
        ranges.truncate(kept);
        ranges.shrink_to_fit();
        IpSet { ranges }
    }

    /// Heap bytes the set keeps allocated (its ranges' capacity).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.ranges.capacity() * std::mem::size_of::<IpRange>()
    }

    pub fn from_ips(ips: impl IntoIterator<Item = IpAddr>) -> IpSet {
        IpSet::from_ranges(ips.into_iter().map(IpRange::single))
    }

    pub fn ranges(&self) -> &[IpRange] {
        &self.ranges
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Number of IPs (saturating: an IPv6 /0 counts as u128::MAX).
    pub fn len(&self) -> u128 {
        self.ranges
            .iter()
            .fold(0u128, |acc, r| acc.saturating_add(r.len()))
    }

    pub fn family_ranges(&self, family: Family) -> impl Iterator<Item = &IpRange> {
        self.ranges.iter().filter(move |r| r.family == family)
    }

    pub fn families(&self) -> Vec<Family> {
        let mut out = Vec::new();
        for f in [Family::V4, Family::V6] {
            if self.ranges.iter().any(|r| r.family == f) {
                out.push(f);
            }
        }
        out
    }

    pub fn contains(&self, ip: &IpAddr) -> bool {
        let (family, value) = ip_key(ip);
        let probe = IpRange {
            family,
            start: value,
            end: u128::MAX,
        };
        let idx = self.ranges.partition_point(|r| *r <= probe);
        idx > 0 && {
            let r = &self.ranges[idx - 1];
            r.family == family && r.start <= value && value <= r.end
        }
    }

    /// The `n`-th (0-based) IP of one family in ascending order.
    pub fn nth(&self, family: Family, mut n: u128) -> Option<IpAddr> {
        for range in self.family_ranges(family) {
            if n < range.len() {
                return Some(ip_from_key(family, range.start + n));
            }
            n -= range.len();
        }
        None
    }

    /// Iterate the IPs in ascending order (lazy: safe on huge sets when bounded with `take`).
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.ranges.iter().flat_map(|r| {
            let family = r.family;
            RangeIter {
                next: Some(r.start),
                end: r.end,
            }
            .map(move |v| ip_from_key(family, v))
        })
    }

    pub fn union(&self, other: &IpSet) -> IpSet {
        IpSet::from_ranges(self.ranges.iter().chain(other.ranges.iter()).copied())
    }

    /// Whether the sets share an IP: one pass over both (they are sorted and disjoint).
    pub(crate) fn intersects(&self, other: &IpSet) -> bool {
        let (mut a, mut b) = (
            self.ranges.iter().peekable(),
            other.ranges.iter().peekable(),
        );
        while let (Some(x), Some(y)) = (a.peek(), b.peek()) {
            if x.overlaps(y) {
                return true;
            }
            // the range that ends first cannot meet anything later in the other set
            if (x.family, x.end) < (y.family, y.end) {
                a.next();
            } else {
                b.next();
            }
        }
        false
    }

    /// `self` minus `other`: one pass over both.
    pub fn subtract(&self, other: &IpSet) -> IpSet {
        let cuts = &other.ranges;
        let mut out = Vec::new();
        let mut next_cut = 0;
        for range in &self.ranges {
            // cuts wholly before this range meet no later range either
            while next_cut < cuts.len()
                && (cuts[next_cut].family, cuts[next_cut].end) < (range.family, range.start)
            {
                next_cut += 1;
            }
            let mut rest = Some(*range);
            while let Some(piece) = rest {
                let Some(cut) = cuts.get(next_cut).filter(|cut| cut.overlaps(&piece)) else {
                    break;
                };
                if piece.start < cut.start {
                    out.push(IpRange {
                        end: cut.start - 1,
                        ..piece
                    });
                }
                if cut.end < piece.end {
                    rest = Some(IpRange {
                        start: cut.end + 1,
                        ..piece
                    });
                    // this cut is used up; one that reaches past the range may cut the next
                    next_cut += 1;
                } else {
                    rest = None;
                }
            }
            out.extend(rest);
        }
        IpSet::merge_sorted(out)
    }

    /// Whether every IP of `self` lies in `other`.
    pub fn is_subset_of(&self, other: &IpSet) -> bool {
        self.subtract(other).is_empty()
    }
}

#[cfg(test)]
struct RangeIter {
    next: Option<u128>,
    end: u128,
}

#[cfg(test)]
impl Iterator for RangeIter {
    type Item = u128;
    fn next(&mut self) -> Option<u128> {
        let current = self.next?;
        self.next = if current < self.end {
            Some(current + 1)
        } else {
            None
        };
        Some(current)
    }
}

impl fmt::Display for IpSet {
    /// Canonical text: ranges joined by commas, single IPs bare.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl IpRange {
    /// The fewest CIDRs that cover exactly this range (e.g. for Calico's `reservedCIDRs`).
    pub(crate) fn to_cidrs(self) -> Vec<IpNet> {
        let bits = self.family.bits();
        let mut out = Vec::new();
        let mut start = self.start;
        loop {
            // The largest block that starts at `start` (aligned) and does not pass `end`.
            let mut size_log = if start == 0 {
                bits
            } else {
                start.trailing_zeros().min(bits)
            };
            while size_log > 0 && block_last(start, size_log) > self.end {
                size_log -= 1;
            }
            let prefix = u8::try_from(bits - size_log).unwrap_or(0);
            let net = IpNet::new(ip_from_key(self.family, start), prefix)
                .expect("prefix length fits the family");
            out.push(net);
            let last = block_last(start, size_log);
            if last >= self.end {
                return out;
            }
            start = last + 1;
        }
    }
}

/// The last value of the aligned block of 2^`size_log` values that starts at `start`.
fn block_last(start: u128, size_log: u32) -> u128 {
    if size_log >= 128 {
        u128::MAX
    } else {
        start + ((1u128 << size_log) - 1)
    }
}

impl IpSet {
    /// The set as the fewest CIDRs, IPv4 first.
    pub fn to_cidrs(&self) -> Vec<IpNet> {
        self.ranges.iter().flat_map(|r| r.to_cidrs()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_ip_writes_what_display_writes() {
        for octet in 0..=255u8 {
            for ip in [
                std::net::Ipv4Addr::new(octet, 0, 9, octet),
                std::net::Ipv4Addr::new(10, octet, 255, 100),
            ] {
                let mut text = String::from("x");
                push_ip(&mut text, &IpAddr::V4(ip));
                assert_eq!(text, format!("x{ip}"));
            }
        }
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// `n` IPv4 addresses from 10.0.0.1 up, `step` apart: step 1 is one range, step 2 is `n`.
    fn spaced_list(n: u32, step: u32) -> String {
        let base = u32::from(std::net::Ipv4Addr::new(10, 0, 0, 1));
        (0..n)
            .map(|i| std::net::Ipv4Addr::from(base + i * step).to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    #[test]
    fn a_parsed_list_keeps_room_for_its_ranges_not_its_entries() {
        let adjacent = parse_ip_spec(&spaced_list(17_000, 1)).unwrap();
        assert_eq!(adjacent.ranges().len(), 1);
        assert_eq!(adjacent.heap_bytes(), std::mem::size_of::<IpRange>());
        let every_other = parse_ip_spec(&spaced_list(17_000, 2)).unwrap();
        assert_eq!(every_other.ranges().len(), 17_000);
        assert_eq!(
            every_other.heap_bytes(),
            17_000 * std::mem::size_of::<IpRange>()
        );
        // set algebra keeps sets as tight
        let odd = every_other.subtract(&parse_ip_spec("10.0.0.0/16").unwrap());
        assert!(odd.is_empty());
        assert_eq!(odd.heap_bytes(), 0);
    }

    /// The IPv4 values of a set over a small universe, one by one.
    fn values(set: &IpSet) -> std::collections::BTreeSet<(Family, u128)> {
        set.ranges()
            .iter()
            .flat_map(|r| (r.start..=r.end).map(move |v| (r.family, v)))
            .collect()
    }

    #[test]
    fn intersects_and_subtract_agree_with_ip_by_ip_answers() {
        // a fixed pseudo-random walk over sets of both families in 0..64
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut random_set = || {
            IpSet::from_ranges((0..(next() % 6)).map(|_| {
                let start = (next() % 64) as u128;
                let end = start + (next() % 8) as u128;
                let family = if next() % 3 == 0 {
                    Family::V6
                } else {
                    Family::V4
                };
                IpRange { family, start, end }
            }))
        };
        for _ in 0..2_000 {
            let (a, b) = (random_set(), random_set());
            let (va, vb) = (values(&a), values(&b));
            assert_eq!(a.intersects(&b), !va.is_disjoint(&vb), "{a} ∩ {b}");
            let difference = a.subtract(&b);
            assert_eq!(
                values(&difference),
                va.difference(&vb).copied().collect(),
                "{a} - {b}"
            );
            assert_eq!(difference, IpSet::from_ranges(difference.ranges().to_vec()));
        }
    }

    #[test]
    fn ranges_split_into_the_fewest_cidrs() {
        let cidrs = |spec: &str| -> Vec<String> {
            parse_ip_spec(spec)
                .unwrap()
                .to_cidrs()
                .iter()
                .map(|n| n.to_string())
                .collect()
        };
        assert_eq!(cidrs("10.0.0.7"), ["10.0.0.7/32"]);
        assert_eq!(
            cidrs("10.0.0.1-10.0.0.254"),
            [
                "10.0.0.1/32",
                "10.0.0.2/31",
                "10.0.0.4/30",
                "10.0.0.8/29",
                "10.0.0.16/28",
                "10.0.0.32/27",
                "10.0.0.64/26",
                "10.0.0.128/26",
                "10.0.0.192/27",
                "10.0.0.224/28",
                "10.0.0.240/29",
                "10.0.0.248/30",
                "10.0.0.252/31",
                "10.0.0.254/32",
            ]
        );
        assert_eq!(cidrs("10.0.0.0-10.0.1.255"), ["10.0.0.0/23"]);
        assert_eq!(cidrs("fd00::1-fd00::3"), ["fd00::1/128", "fd00::2/127"]);
        assert_eq!(cidrs("0.0.0.0-255.255.255.255"), ["0.0.0.0/0"]);
        assert_eq!(
            cidrs("8000::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
            ["8000::/1"]
        );
        assert_eq!(
            cidrs("255.255.255.254-255.255.255.255"),
            ["255.255.255.254/31"]
        );
    }

    #[test]
    fn cidrs_cover_exactly_the_set() {
        let set =
            parse_ip_spec("10.0.0.3-10.0.0.77,10.0.1.9,10.0.2.0-10.0.3.128,fd00::5-fd00::1:2")
                .unwrap();
        let back = IpSet::from_ranges(set.to_cidrs().iter().map(IpRange::from_net_all));
        assert_eq!(back, set);
        for net in set.to_cidrs() {
            assert_eq!(net.trunc(), net, "{net} is aligned");
        }
    }

    #[test]
    fn parses_lists_ranges_and_cidrs_in_canonical_order() {
        let set = parse_ip_spec(" 10.0.0.12, 10.0.0.10 ,10.0.0.20-10.0.0.22, 10.0.1.0/30").unwrap();
        assert_eq!(
            set.to_string(),
            "10.0.0.10,10.0.0.12,10.0.0.20-10.0.0.22,10.0.1.1-10.0.1.2"
        );
        assert_eq!(set.len(), 7);
        assert_eq!(set.nth(Family::V4, 0), Some(ip("10.0.0.10")));
        assert_eq!(set.nth(Family::V4, 3), Some(ip("10.0.0.21")));
        assert_eq!(set.nth(Family::V4, 7), None);
    }

    #[test]
    fn ipv6_written_two_ways_is_one_ip() {
        let err = parse_ip_spec("fd00::0a, fd00:0:0::a").unwrap_err();
        assert_eq!(
            err.to_string(),
            "entry 2 \"fd00:0:0::a\" overlaps entry 1 \"fd00::0a\""
        );
        let set = parse_ip_spec("fd00:0000::000a").unwrap();
        assert_eq!(set.to_string(), "fd00::a");
    }

    #[test]
    fn dual_stack_sets_keep_families_apart() {
        let set = parse_ip_spec("10.0.0.10,fd00::10-fd00::11").unwrap();
        assert_eq!(set.families(), vec![Family::V4, Family::V6]);
        assert_eq!(set.nth(Family::V6, 1), Some(ip("fd00::11")));
        assert!(set.contains(&ip("fd00::10")));
        assert!(!set.contains(&ip("fd00::12")));
        assert!(!set.contains(&ip("10.0.0.11")));
    }

    #[test]
    fn rejects_bad_entries_with_their_position() {
        let cases = [
            (
                "10.0.0.1,10.0.0.x",
                "entry 2 \"10.0.0.x\": \"10.0.0.x\" is not an IP address",
            ),
            (
                "10.0.0.9-10.0.0.1",
                "entry 1 \"10.0.0.9-10.0.0.1\": the range is reversed (10.0.0.9 is after 10.0.0.1)",
            ),
            (
                "10.0.0.1-fd00::1",
                "entry 1 \"10.0.0.1-fd00::1\": a range cannot mix IPv4 and IPv6",
            ),
            (
                "10.0.0.5/28",
                "entry 1 \"10.0.0.5/28\": host bits are set; did you mean 10.0.0.0/28?",
            ),
            ("10.0.0.0/33", "entry 1 \"10.0.0.0/33\": not a valid CIDR"),
            (" , ", "the list is empty"),
            (
                "10.0.0.0/29,10.0.0.3",
                "entry 2 \"10.0.0.3\" overlaps entry 1 \"10.0.0.0/29\"",
            ),
        ];
        for (spec, message) in cases {
            assert_eq!(
                parse_ip_spec(spec).unwrap_err().to_string(),
                message,
                "{spec}"
            );
        }
    }

    #[test]
    fn cidr_usable_addresses() {
        assert_eq!(
            parse_ip_spec("10.0.0.0/30").unwrap().to_string(),
            "10.0.0.1-10.0.0.2"
        );
        assert_eq!(
            parse_ip_spec("10.0.0.0/31").unwrap().to_string(),
            "10.0.0.0-10.0.0.1"
        );
        assert_eq!(
            parse_ip_spec("10.0.0.7/32").unwrap().to_string(),
            "10.0.0.7"
        );
        assert_eq!(
            parse_ip_spec("fd00:10::/126").unwrap().to_string(),
            "fd00:10::1-fd00:10::3",
            "the subnet-router anycast address is left out"
        );
        assert_eq!(parse_ip_spec("fd00::/127").unwrap().len(), 2);
        assert_eq!(parse_ip_spec("fd00::5/128").unwrap().len(), 1);
        // a /8 is one range, not 16 million entries
        let big = parse_ip_spec("10.0.0.0/8").unwrap();
        assert_eq!(big.ranges().len(), 1);
        assert_eq!(big.len(), (1 << 24) - 2);
        let huge = parse_ip_spec("fd00::/8").unwrap();
        assert_eq!(huge.len(), (1u128 << 120) - 1);
    }

    #[test]
    fn kube_ovn_dotdot_ranges() {
        let set =
            parse_ip_spec_with("10.16.0.1..10.16.0.10,10.16.0.20", RangeSyntax::DotDot).unwrap();
        assert_eq!(set.len(), 11);
    }

    #[test]
    fn set_algebra() {
        let a = parse_ip_spec("10.0.0.0/28").unwrap();
        let b = parse_ip_spec("10.0.0.5-10.0.0.7,10.0.0.14").unwrap();
        let d = a.subtract(&b);
        assert_eq!(d.to_string(), "10.0.0.1-10.0.0.4,10.0.0.8-10.0.0.13");
        assert!(b.is_subset_of(&a));
        assert!(!a.is_subset_of(&b));
        assert!(a.intersects(&b));
        assert_eq!(d.union(&b).to_string(), "10.0.0.1-10.0.0.14");
        assert_eq!(
            a.iter().take(2).collect::<Vec<_>>(),
            vec![ip("10.0.0.1"), ip("10.0.0.2")]
        );
    }

    #[test]
    fn errors_quote_an_excerpt_of_huge_input() {
        let huge = "1".repeat(1 << 20);
        let message = parse_ip_spec(&huge).unwrap_err().to_string();
        assert!(message.len() < 400, "a {}-byte message", message.len());
        assert!(
            message.contains(&format!("… ({} bytes)", huge.len())),
            "{message}"
        );
        assert_eq!(excerpt("10.0.0.1"), "10.0.0.1");
        // a cut never splits a character
        assert!(excerpt(&"é".repeat(100)).starts_with(&"é".repeat(64)));
    }

    #[test]
    fn label_values_round_trip_and_are_always_valid() {
        for s in [
            "10.0.0.1",
            "fd00::a",
            "2001:db8::1:2",
            "fd00:10::",
            "::1",
            "::",
            "::ffff:10.9.9.9",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ] {
            let v = ip_label_value(&ip(s));
            let mut pushed = String::new();
            push_ip(&mut pushed, &ip(s));
            assert_eq!(pushed, ip(s).to_string());
            assert!(is_label_value(&v), "{s} -> {v:?} is not a label value");
            assert_eq!(ip_from_label_value(&v), Some(ip(s)), "{v}");
        }
        assert_eq!(
            ip_label_value(&ip("fd00:10::")),
            "fd000010000000000000000000000000"
        );
        assert_eq!(ip_label_value(&ip("fd00::a")), "fd00--a");
        // only the forms `ip_label_value` writes are read
        for unwritten in ["fd00-10--", "--1", "--ffff-10.9.9.9", "64-ff9b--10.0.0.1"] {
            assert_eq!(ip_from_label_value(unwritten), None, "{unwritten}");
        }
        assert!(!is_label_value("fd00-10--"));
        assert!(!is_label_value(&"a".repeat(64)));
    }

    #[test]
    fn ipv4_mapped_ipv6_is_refused_with_its_reason() {
        for spec in [
            "::ffff:10.9.9.9",
            "::ffff:10.0.0.0/120",
            "::ffff:10.0.0.1-::ffff:10.0.0.9",
        ] {
            let message = parse_ip_spec(spec).unwrap_err().to_string();
            assert!(message.contains("IPv4-mapped"), "{spec}: {message}");
        }
    }
}
