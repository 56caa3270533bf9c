//! The embedded journal's file format. Every journal and snapshot file starts with a header
//! ([`header`]: magic `IPWJRNL3`, kind, generation, CRC; a journal's acknowledgement marks),
//! then records of `length (u32 LE) | CRC-32C of the payload (u32 LE) | payload`, one claim
//! each, the payload a compact binary claim ([`encode_claim`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::holder::{Carrier, MAX_SOURCES, VmRef};
use super::{Claim, LedgerError, Phase, PodRef, Source};

pub(super) mod header;
mod read;

pub(super) use header::{FIXED_LEN, Header, JOURNAL_START, Kind, Mark, journal_head};
#[cfg(test)]
pub(super) use header::{SLOT_LEN, SLOTS};
#[cfg(test)]
pub(super) use read::parse_file;
pub(super) use read::{Named, Scan, Stretch, scan_bytes, scan_file};

/// A record's length and CRC.
const HEADER: usize = 8;

/// The first bytes of a new journal of `generation`, whose records are yet to come.
pub(super) fn new_journal(generation: u64) -> Vec<u8> {
    journal_head(
        generation,
        Mark {
            seq: 1,
            acknowledged: JOURNAL_START,
            next: 0,
        },
    )
}

/// Append one record holding `claim` to `buf` (binary payload); returns its size.
pub(super) fn encode_record(buf: &mut Vec<u8>, claim: &Claim) -> Result<u64, LedgerError> {
    let start = buf.len();
    buf.extend_from_slice(&[0; HEADER]);
    encode_claim(buf, claim);
    seal_record(buf, start)
}

/// The size of the record [`encode_record`] writes for `claim`, found by encoding its payload
/// into `scratch` (cleared first): one encoder, so the two cannot disagree.
pub(super) fn record_size(claim: &Claim, scratch: &mut Vec<u8>) -> u64 {
    scratch.clear();
    encode_claim(scratch, claim);
    (HEADER + scratch.len()) as u64
}

/// Fill in the header of the record that starts at `start` and runs to the end of `buf`;
/// returns its size.
fn seal_record(buf: &mut [u8], start: usize) -> Result<u64, LedgerError> {
    let len = u32::try_from(buf.len() - start - HEADER)
        .map_err(|_| LedgerError::Storage("claim record too large".into()))?;
    let crc = crc32c(&buf[start + HEADER..]);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok((buf.len() - start) as u64)
}

/// Why a record whose CRC matches does not decode to a claim; each names the field it was
/// reading.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecordError {
    #[error("the record ends inside {field}")]
    Ends { field: &'static str },
    #[error("{field} is longer than 64 bits")]
    Overlong { field: &'static str },
    #[error("{field} too long")]
    TooLong { field: &'static str },
    #[error("{field} is not UTF-8")]
    NotUtf8 { field: &'static str },
    #[error("{field} presence is {value}, not 0 or 1")]
    Presence { field: &'static str, value: u8 },
    #[error("unknown {field} {value}")]
    Unknown { field: &'static str, value: u8 },
    #[error("the flags byte is {0}: unknown flags")]
    Flags(u8),
    #[error("{count} {field}: not 1 to 8")]
    Count { field: &'static str, count: u64 },
    #[error("{0} bytes after the claim")]
    Trailing(usize),
}

/// The claim, field by field in a fixed order: strings and integers as LEB128 lengths and
/// values, an optional field as a 0/1 byte before its value, enums as one byte each.
fn encode_claim(buf: &mut Vec<u8>, claim: &Claim) {
    match claim.ip {
        IpAddr::V4(ip) => {
            buf.push(4);
            buf.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            buf.push(6);
            buf.extend_from_slice(&ip.octets());
        }
    }
    put_str(buf, &claim.app);
    put_opt(buf, claim.pool.as_deref(), put_str);
    put_str(buf, &claim.pod.namespace);
    put_str(buf, &claim.pod.name);
    put_str(buf, &claim.pod.generate_name);
    put_opt(buf, claim.pod.uid.as_deref(), put_str);
    claim.request_uid.with_str(|uid| put_str(buf, uid));
    buf.push(match claim.phase {
        Phase::Reserved => 0,
        Phase::Bound => 1,
        Phase::Terminating => 2,
        Phase::Released => 3,
    });
    buf.push(match claim.source {
        Source::Allocated => 0,
        Source::Static => 1,
    });
    put_u64(buf, claim.created_at);
    put_u64(buf, claim.updated_at);
    put_opt(buf, claim.list_size.map(std::num::NonZeroU64::get), put_u64);
    claim.token.with_str(|token| put_str(buf, token));
    put_opt(buf, claim.release_at.map(crate::ReleaseAt::get), put_u64);
    // The flags byte: `sticky`, and one flag per optional field after it, each field present
    // only when its flag is set. A claim with none of them ends with this byte (0 or 1).
    let sources = claim.vm.as_ref().map(|vm| vm.sources()).unwrap_or_default();
    let mut flags = if claim.sticky { FLAG_STICKY } else { 0 };
    if claim.vm.is_some() {
        flags |= FLAG_VM;
    }
    if !sources.is_empty() {
        flags |= FLAG_VM_SOURCE;
    }
    buf.push(flags);
    if let Some(vm) = &claim.vm {
        put_str(buf, vm);
    }
    if !sources.is_empty() {
        put_u64(buf, sources.len() as u64);
        for source in sources {
            put_str(buf, &source.name);
            put_opt(buf, source.uid.as_deref(), put_str);
            put_str(buf, &source.token);
        }
    }
}

/// In the flags byte: the claim is kept for its pod name.
const FLAG_STICKY: u8 = 1;
/// In the flags byte: the claim's virtual machine follows.
const FLAG_VM: u8 = 2;
/// In the flags byte: the migration sources its VM remembers follow the VM (their count, then
/// each: name, optional UID, token).
const FLAG_VM_SOURCE: u8 = 4;

fn decode_claim(payload: &[u8]) -> Result<Claim, RecordError> {
    let mut r = Reader(payload);
    let ip = match r.byte("ip family")? {
        4 => IpAddr::V4(Ipv4Addr::from(r.array::<4>("IPv4 address")?)),
        6 => IpAddr::V6(Ipv6Addr::from(r.array::<16>("IPv6 address")?)),
        value => {
            return Err(RecordError::Unknown {
                field: "ip family",
                value,
            });
        }
    };
    let mut claim = Claim {
        ip,
        app: r.string("app")?,
        pool: r.optional("pool", |r| r.string("pool"))?,
        pod: PodRef {
            namespace: r.string("namespace")?,
            name: r.string("pod name")?,
            generate_name: r.string("generateName")?,
            uid: r.optional("pod uid", |r| r.string("pod uid"))?,
        },
        request_uid: r.string("request uid")?,
        phase: match r.byte("phase")? {
            0 => Phase::Reserved,
            1 => Phase::Bound,
            2 => Phase::Terminating,
            3 => Phase::Released,
            value => {
                return Err(RecordError::Unknown {
                    field: "phase",
                    value,
                });
            }
        },
        source: match r.byte("source")? {
            0 => Source::Allocated,
            1 => Source::Static,
            value => {
                return Err(RecordError::Unknown {
                    field: "source",
                    value,
                });
            }
        },
        created_at: r.u64("createdAt")?,
        updated_at: r.u64("updatedAt")?,
        list_size: r
            .optional("listSize", |r| r.u64("listSize"))?
            .and_then(std::num::NonZeroU64::new),
        token: r.string("token")?,
        release_at: r
            .optional("releaseAt", |r| r.u64("releaseAt"))?
            .map(crate::ReleaseAt::new),
        sticky: false,
        vm: None,
    };
    let flags = r.byte("flags")?;
    if flags & !(FLAG_STICKY | FLAG_VM | FLAG_VM_SOURCE) != 0
        || (flags & FLAG_VM_SOURCE != 0 && flags & FLAG_VM == 0)
    {
        return Err(RecordError::Flags(flags));
    }
    claim.sticky = flags & FLAG_STICKY != 0;
    if flags & FLAG_VM != 0 {
        let vm: VmRef = VmRef::named(&r.string::<String>("vm")?);
        claim.vm = Some(match flags & FLAG_VM_SOURCE {
            0 => vm,
            _ => vm.with_sources(read_sources(&mut r)?),
        });
    }
    if !r.0.is_empty() {
        return Err(RecordError::Trailing(r.0.len()));
    }
    Ok(claim)
}

/// The migration sources after a VM's name: 1 to [`MAX_SOURCES`] of them.
fn read_sources(r: &mut Reader<'_>) -> Result<Vec<Carrier>, RecordError> {
    let count = r.u64("migration sources")?;
    if count == 0 || count > MAX_SOURCES as u64 {
        return Err(RecordError::Count {
            field: "migration sources",
            count,
        });
    }
    (0..count)
        .map(|_| {
            Ok(Carrier {
                name: r.string("migration source")?,
                uid: r.optional("migration source uid", |r| r.string("migration source uid"))?,
                token: r.string("migration source token")?,
            })
        })
        .collect()
}

fn put_u64(buf: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        buf.push((value as u8) | 0x80);
        value >>= 7;
    }
    buf.push(value as u8);
}

fn put_str(buf: &mut Vec<u8>, value: &str) {
    put_u64(buf, value.len() as u64);
    buf.extend_from_slice(value.as_bytes());
}

fn put_opt<T>(buf: &mut Vec<u8>, value: Option<T>, put: fn(&mut Vec<u8>, T)) {
    match value {
        None => buf.push(0),
        Some(value) => {
            buf.push(1);
            put(buf, value);
        }
    }
}

/// Reads a payload front to back; every error names the field it was reading.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&[u8], RecordError> {
        if self.0.len() < n {
            return Err(RecordError::Ends { field });
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn byte(&mut self, field: &'static str) -> Result<u8, RecordError> {
        Ok(self.take(1, field)?[0])
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], RecordError> {
        Ok(self.take(N, field)?.try_into().expect("N bytes"))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, RecordError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte(field)?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(RecordError::Overlong { field })
    }

    /// A string field, made straight into the claim's type for it (no `String` in between).
    fn string<T: for<'s> From<&'s str>>(&mut self, field: &'static str) -> Result<T, RecordError> {
        let len = usize::try_from(self.u64(field)?).map_err(|_| RecordError::TooLong { field })?;
        let bytes = self.take(len, field)?;
        std::str::from_utf8(bytes)
            .map(T::from)
            .map_err(|_| RecordError::NotUtf8 { field })
    }

    fn optional<T>(
        &mut self,
        field: &'static str,
        read: impl FnOnce(&mut Self) -> Result<T, RecordError>,
    ) -> Result<Option<T>, RecordError> {
        match self.byte(field)? {
            0 => Ok(None),
            1 => read(self).map(Some),
            value => Err(RecordError::Presence { field, value }),
        }
    }
}

/// CRC-32C (Castagnoli), the checksum of every record, header and mark: the `crc32c` crate's,
/// which uses the CPU's CRC32 instruction where there is one (SSE 4.2, ARMv8) and tables
/// otherwise (the writer checksums every record it commits).
pub(crate) fn crc32c(data: &[u8]) -> u32 {
    ::crc32c::crc32c(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Claim {
        Claim {
            ip: "fd00::1:2".parse().unwrap(),
            app: "wéb-ünïcode".into(),
            pool: Some("blue".into()),
            pod: PodRef {
                namespace: "prod".into(),
                name: "db-0".into(),
                generate_name: "db-".into(),
                uid: Some("0b0c1d2e-3f40-4152-a3b4-c5d6e7f80912".into()),
            },
            request_uid: "6f1e2d3c-4b5a-4968-8776-655443322110".into(),
            phase: Phase::Terminating,
            source: Source::Static,
            created_at: 1_764_400_000,
            updated_at: u64::MAX,
            list_size: std::num::NonZeroU64::new(1 << 40),
            token: "tok-1234567890abcdef".into(),
            release_at: Some(crate::ReleaseAt::new(u64::MAX)),
            sticky: true,
            vm: Some(VmRef::named("db").with_sources(vec![
                Carrier {
                    name: "virt-launcher-db-abcde".into(),
                    uid: Some("1a2b3c4d-0000-4000-8000-000000000001".into()),
                    token: "tok-source".into(),
                },
                Carrier {
                    name: "virt-launcher-db-fghij".into(),
                    uid: None,
                    token: "tok-earlier-target".into(),
                },
            ])),
        }
    }

    /// A record with every text empty but the namespace, made at 0 and updated at 127.
    fn bare() -> Claim {
        Claim {
            updated_at: 127,
            ..crate::test_claims::builder("10.0.0.7", "", "")
                .request("")
                .at(0)
                .build()
        }
    }

    fn binary(claim: &Claim) -> Vec<u8> {
        let mut buf = Vec::new();
        encode_claim(&mut buf, claim);
        buf
    }

    #[test]
    fn every_field_survives_the_binary_payload() {
        for phase in [
            Phase::Reserved,
            Phase::Bound,
            Phase::Terminating,
            Phase::Released,
        ] {
            for claim in [full(), bare()] {
                let claim = Claim { phase, ..claim };
                assert_eq!(decode_claim(&binary(&claim)).unwrap(), claim);
            }
        }
    }

    #[test]
    fn a_claim_without_a_vm_ends_with_its_flags_byte() {
        let plain = binary(&bare());
        // the last byte is `sticky`: nothing follows it
        assert_eq!(plain.last(), Some(&0));
        let with_vm = binary(&Claim {
            vm: Some("db".into()),
            ..bare()
        });
        assert_eq!(&with_vm[..plain.len() - 1], &plain[..plain.len() - 1]);
        assert_eq!(&with_vm[plain.len() - 1..], &[FLAG_VM, 2, b'd', b'b']);
        assert_eq!(decode_claim(&with_vm).unwrap().vm.as_deref(), Some("db"));
    }

    #[test]
    fn the_binary_payload_is_at_most_half_the_json_one() {
        for claim in [full(), bare()] {
            let json = serde_json::to_vec(&claim).unwrap().len();
            let binary = binary(&claim).len();
            assert!(2 * binary <= json, "{binary} bytes against JSON's {json}");
        }
    }

    #[test]
    fn a_damaged_payload_is_refused_naming_the_field() {
        let good = binary(&full());
        let cut = decode_claim(&good[..good.len() - 3])
            .unwrap_err()
            .to_string();
        assert!(cut.contains("ends inside"), "{cut}");
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(
            decode_claim(&longer).unwrap_err().to_string(),
            "1 bytes after the claim"
        );
        let mut flags = binary(&bare());
        *flags.last_mut().unwrap() = 4;
        assert_eq!(
            decode_claim(&flags).unwrap_err().to_string(),
            "the flags byte is 4: unknown flags"
        );
        // a VM remembering no source, or more than a claim keeps, after the flag that says
        // sources follow
        let vm_only = Claim {
            vm: Some(VmRef::named("db")),
            ..bare()
        };
        for count in [0u8, 9] {
            let mut sources = binary(&vm_only);
            *sources.iter_mut().rev().nth(3).unwrap() |= FLAG_VM_SOURCE; // before "db"
            sources.push(count);
            assert_eq!(
                decode_claim(&sources).unwrap_err().to_string(),
                format!("{count} migration sources: not 1 to 8")
            );
        }
        let mut family = good.clone();
        family[0] = 5;
        assert_eq!(
            decode_claim(&family).unwrap_err().to_string(),
            "unknown ip family 5"
        );
        // the app's first byte turned into an invalid UTF-8 byte
        let mut app = good;
        app[18] = 0xff;
        assert_eq!(
            decode_claim(&app).unwrap_err().to_string(),
            "app is not UTF-8"
        );
    }

    #[test]
    fn no_cut_or_changed_byte_makes_the_decoder_panic() {
        // a record whose CRC was forged over damaged bytes: an answer either way, never a panic
        for claim in [full(), bare()] {
            let good = binary(&claim);
            for end in 0..good.len() {
                assert!(
                    decode_claim(&good[..end]).is_err(),
                    "a cut at {end} decoded"
                );
            }
            for at in 0..good.len() {
                for value in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                    let mut changed = good.clone();
                    changed[at] = value;
                    let _ = decode_claim(&changed);
                }
            }
        }
    }

    /// A journal and a snapshot read back with their headers; a torn tail is reported.
    #[test]
    fn files_read_back_with_their_headers_and_a_torn_tail_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = new_journal(4);
        for claim in [full(), bare()] {
            encode_record(&mut bytes, &claim).unwrap();
        }
        let whole = bytes.len() as u64;
        bytes.extend_from_slice(&[9, 0, 0]);
        let path = dir.path().join("journal.4");
        std::fs::write(&path, &bytes).unwrap();
        let parsed = parse_file(&path).unwrap();
        assert_eq!(parsed.scan.header, Ok(Header::journal(4)));
        let mark = parsed.scan.mark.clone().unwrap().unwrap();
        assert_eq!((mark.acknowledged, mark.next), (JOURNAL_START, 0));
        let claims: Vec<Claim> = parsed.claims.into_iter().map(|(c, _)| c).collect();
        assert_eq!(claims, [full(), bare()]);
        assert_eq!(parsed.scan.good, whole);
        assert!(parsed.scan.torn);

        let mut snapshot = vec![0u8; FIXED_LEN as usize];
        encode_record(&mut snapshot, &full()).unwrap();
        let header = Header {
            kind: Kind::Snapshot,
            generation: 2,
            records: 1,
            end: snapshot.len() as u64,
        };
        snapshot[..FIXED_LEN as usize].copy_from_slice(&header.encode());
        let path = dir.path().join("snapshot.2");
        std::fs::write(&path, &snapshot).unwrap();
        let parsed = parse_file(&path).unwrap();
        assert_eq!(parsed.scan.header, Ok(header));
        assert_eq!(parsed.scan.mark, None);
        assert_eq!(parsed.claims.len(), 1);
        // the same bytes under another name are refused by their header
        let path = dir.path().join("snapshot.3");
        std::fs::write(&path, &snapshot).unwrap();
        assert!(parse_file(&path).unwrap().scan.header.is_err());
    }

    /// Zeros after the records are room made for the next ones, not a torn write; a cut
    /// record in that room is one.
    #[test]
    fn zeros_after_the_records_are_room_and_a_record_cut_in_them_is_torn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.1");
        let mut bytes = new_journal(1);
        encode_record(&mut bytes, &full()).unwrap();
        let whole = bytes.len();
        bytes.resize(whole + 4096, 0);
        std::fs::write(&path, &bytes).unwrap();
        let parsed = parse_file(&path).unwrap();
        assert_eq!(
            (parsed.claims.len(), parsed.scan.good, parsed.scan.torn),
            (1, whole as u64, false)
        );

        let mut record = Vec::new();
        encode_record(&mut record, &bare()).unwrap();
        let cut = record.len() - 5;
        bytes[whole..whole + cut].copy_from_slice(&record[..cut]);
        std::fs::write(&path, &bytes).unwrap();
        let parsed = parse_file(&path).unwrap();
        assert_eq!(
            (parsed.claims.len(), parsed.scan.good, parsed.scan.torn),
            (1, whole as u64, true)
        );

        bytes[whole + cut..whole + record.len()].copy_from_slice(&record[cut..]);
        std::fs::write(&path, &bytes).unwrap();
        let parsed = parse_file(&path).unwrap();
        assert_eq!(parsed.claims.len(), 2, "the whole record is read");
        assert!(!parsed.scan.torn);
    }

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn crc32c_is_the_bitwise_crc_the_files_were_written_with() {
        // the definition, one bit at a time (reflected polynomial 0x82F63B78): what every
        // journal, snapshot and marker on disk was checksummed with, whatever computes it
        let bitwise = |data: &[u8]| {
            let mut c = !0u32;
            for &b in data {
                c ^= u32::from(b);
                for _ in 0..8 {
                    c = if c & 1 != 0 {
                        0x82f6_3b78 ^ (c >> 1)
                    } else {
                        c >> 1
                    };
                }
            }
            !c
        };
        let data: Vec<u8> = (0..300u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for start in 0..9 {
            for end in start..data.len() {
                assert_eq!(
                    crc32c(&data[start..end]),
                    bitwise(&data[start..end]),
                    "{start}..{end}"
                );
            }
        }
    }
}
