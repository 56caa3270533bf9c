//! Reading a journal or snapshot file: its records in file order, whether a torn write ends it,
//! and the damaged stretches that valid records follow.
//!
//! A file is read through a [`Window`] a chunk at a time, and each claim is handed on as its
//! record is read. Reading a file thus costs one chunk besides the claims, not a copy of the
//! whole file and a list of everything parsed: at 200,000 claims those two were about 40 MB
//! freed at once after the load, which the allocator kept resident (docs/performance.md,
//! "Memory per held claim").

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use super::header::{Header, HeaderFault, Kind, Mark, short};
use super::{Claim, HEADER, LedgerError, RecordError};
use super::{crc32c, decode_claim};

/// What reading a journal or snapshot file found, besides its claims.
pub(crate) struct Scan {
    /// The file's length.
    pub(crate) len: u64,
    /// Its fixed header, or why it cannot be read.
    pub(crate) header: Result<Header, HeaderFault>,
    /// A journal's newest whole acknowledgement mark (`None` for a snapshot, or a journal too
    /// short to hold its marks: then `header` is a fault).
    pub(crate) mark: Option<Result<Mark, HeaderFault>>,
    /// Valid records, in file order (also those after a damaged stretch).
    pub(crate) records: usize,
    /// Where the records end: the end of the last valid record (or where records start; the
    /// file's length when it ends inside its header). A journal's next record goes here.
    pub(crate) good: u64,
    /// Whether bytes other than zeros follow the last valid record. A journal's zeros are room
    /// made for records to come (`journal.rs`, `GROW_STEP`); anything else, with no valid
    /// record after it, is the write a crash cut short (never answered: a commit answers only
    /// after its `fdatasync`).
    pub(crate) torn: bool,
    /// The stretches of bytes that are no valid record but have valid records after them:
    /// not a torn write but damage (a flipped bit, a lost page), in file order.
    pub(crate) damage: Vec<Stretch>,
}

/// A file's claims, each with the size of its record, and what else reading it found.
#[cfg(test)]
pub(crate) struct Parsed {
    pub(crate) claims: Vec<(Claim, u64)>,
    pub(crate) scan: Scan,
}

/// A damaged stretch of a file: `len` bytes at byte `offset`, after the first `before` of
/// the file's valid records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stretch {
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) before: usize,
}

impl Scan {
    /// Valid records after the first damaged stretch.
    pub(crate) fn records_after_damage(&self) -> usize {
        self.damage
            .first()
            .map_or(0, |first| self.records - first.before)
    }
}

/// The largest record a resynchronising scan takes for one: claim records are a few hundred
/// bytes (names and labels are bounded by the API server), and a bound keeps the scan over a
/// damaged stretch linear in practice.
const MAX_SCANNED_RECORD: usize = 1 << 20;

/// Bytes read from a file at a time. Unit tests read in small odd chunks, so that records,
/// headers and damaged stretches fall across the chunks' edges.
#[cfg(not(test))]
const CHUNK: usize = 1 << 20;
#[cfg(test)]
const CHUNK: usize = 61;

/// The record at the start of `bytes` (which run on to at least its end, or to the end of the
/// file), if one is there: its length is not zero nor over `max_len`, it fits, its CRC matches.
/// With the record's size; `Some(Err)` is a record whose CRC matches but whose payload does
/// not decode.
fn record_at(bytes: &[u8], max_len: usize) -> Option<(Result<Claim, RecordError>, usize)> {
    if bytes.len() < HEADER {
        return None;
    }
    let len = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
    if len == 0 || len > max_len || len > bytes.len() - HEADER {
        return None;
    }
    let crc = u32::from_le_bytes(bytes[4..HEADER].try_into().expect("4 bytes"));
    let payload = &bytes[HEADER..HEADER + len];
    if crc32c(payload) != crc {
        return None;
    }
    Some((decode_claim(payload), HEADER + len))
}

/// A file's bytes, read forward a chunk at a time: `buf` holds those from byte `start` on.
struct Window<R> {
    reader: R,
    /// The file's length when it was opened, or where its bytes turned out to end (a file
    /// read without the lock can be cut while it is read).
    len: usize,
    buf: Vec<u8>,
    start: usize,
}

impl<R: Read> Window<R> {
    fn new(reader: R, len: usize) -> Window<R> {
        Window {
            reader,
            len,
            buf: Vec::new(),
            start: 0,
        }
    }

    /// The bytes from `at` on: at least `want` of them, or all to the end of the file. The
    /// bytes before `keep` (at most `at`, and never less than an earlier call's) may be
    /// dropped.
    fn bytes(&mut self, keep: usize, at: usize, want: usize) -> io::Result<&[u8]> {
        debug_assert!(self.start <= keep && keep <= at);
        let upto = at.saturating_add(want).min(self.len);
        let read_to = self.start + self.buf.len();
        if upto > read_to {
            self.buf.drain(..keep - self.start);
            self.start = keep;
            let more = (upto - read_to).max(CHUNK).min(self.len - read_to);
            self.buf.reserve_exact(more);
            let got = (&mut self.reader)
                .take(more as u64)
                .read_to_end(&mut self.buf)?;
            if got < more {
                self.len = read_to + got;
            }
        }
        Ok(&self.buf[(at - self.start).min(self.buf.len())..])
    }

    /// The record at `at`, as [`record_at`] finds it, with where it ends. No more than the
    /// file holds is read for a length that cannot be a record's.
    fn record(
        &mut self,
        at: usize,
        max_len: usize,
    ) -> io::Result<Option<(Result<Claim, RecordError>, usize)>> {
        let header = self.bytes(at, at, HEADER)?;
        if header.len() < HEADER {
            return Ok(None);
        }
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        if len > max_len || len > self.len - at - HEADER {
            return Ok(None);
        }
        let bytes = self.bytes(at, at, HEADER + len)?;
        Ok(record_at(bytes, max_len).map(|(claim, size)| (claim, at + size)))
    }

    /// The first offset after `after` where a whole record starts (its CRC matches and its
    /// payload decodes: a stretch of damage is not taken for records by chance). The bytes
    /// from `after` on are kept: whether the file is torn is read from them.
    fn next_record(&mut self, after: usize) -> io::Result<Option<usize>> {
        let mut at = after + 1;
        while at + HEADER < self.len {
            let bytes = self.bytes(after, at, HEADER + MAX_SCANNED_RECORD)?;
            // most bytes of a journal's room are zeros: a zero length is no record
            if bytes[..4] != [0; 4]
                && matches!(record_at(bytes, MAX_SCANNED_RECORD), Some((Ok(_), _)))
            {
                return Ok(Some(at));
            }
            at += 1;
        }
        Ok(None)
    }
}

/// Which file a scan reads: what its name says it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Named {
    pub(crate) kind: Kind,
    pub(crate) generation: u64,
}

/// Read the file at `path`, named as `named`, handing each claim, with the size of its record,
/// to `each` in file order. A record whose CRC matches but whose claim does not decode is an
/// error, after the claims before it were handed on. A header that cannot be read is no error
/// here: the records after it are read all the same, and [`Scan::header`] says why.
pub(crate) fn scan_file(
    path: &Path,
    named: Named,
    each: impl FnMut(Claim, u64),
) -> Result<Scan, LedgerError> {
    let cannot_read =
        |e: io::Error| LedgerError::Storage(format!("cannot read {}: {e}", path.display()));
    let file = File::open(path).map_err(cannot_read)?;
    let len = file.metadata().map_err(cannot_read)?.len();
    let len = usize::try_from(len)
        .map_err(|_| LedgerError::Storage(format!("{} is too large to read", path.display())))?;
    scan(path, named, file, len, each)
}

/// A file's bytes, read as [`scan_file`] reads a file, its claims decoded and dropped.
pub(crate) fn scan_bytes(path: &Path, named: Named, bytes: &[u8]) -> Result<Scan, LedgerError> {
    scan(path, named, bytes, bytes.len(), |_, _| {})
}

/// What a test's file is, from its name (`journal.N`, `snapshot.N`; anything else is read as
/// journal 1).
#[cfg(test)]
fn named_by(path: &Path) -> Named {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let (kind, number) = match name.split_once('.') {
        Some(("snapshot", number)) => (Kind::Snapshot, number),
        Some(("journal", number)) => (Kind::Journal, number),
        _ => (Kind::Journal, "1"),
    };
    Named {
        kind,
        generation: number.parse().unwrap_or(1),
    }
}

/// A file's bytes, read as [`scan_file`] reads a file, with its claims collected.
#[cfg(test)]
pub(crate) fn parse_bytes(path: &Path, bytes: &[u8]) -> Result<Parsed, LedgerError> {
    let mut claims = Vec::new();
    let scan = scan(path, named_by(path), bytes, bytes.len(), |claim, size| {
        claims.push((claim, size))
    })?;
    Ok(Parsed { claims, scan })
}

/// The file at `path` with its claims collected, named as its name says.
#[cfg(test)]
pub(crate) fn parse_file(path: &Path) -> Result<Parsed, LedgerError> {
    let mut claims = Vec::new();
    let scan = scan_file(path, named_by(path), |claim, size| {
        claims.push((claim, size))
    })?;
    Ok(Parsed { claims, scan })
}

/// The header (and a journal's mark) from the file's first bytes.
fn read_header(
    bytes: &[u8],
    len: usize,
    named: Named,
) -> (
    Result<Header, HeaderFault>,
    Option<Result<Mark, HeaderFault>>,
) {
    let header = Header::decode(bytes, named.kind, named.generation);
    let start = named.kind.records_start() as usize;
    let header = match header {
        Ok(_) if len < start => Err(short(len as u64, named.kind)),
        header => header,
    };
    let mark = (named.kind == Kind::Journal && len >= start).then(|| Mark::newest(bytes));
    (header, mark)
}

fn scan(
    path: &Path,
    named: Named,
    reader: impl Read,
    len: usize,
    mut each: impl FnMut(Claim, u64),
) -> Result<Scan, LedgerError> {
    let cannot_read =
        |e: io::Error| LedgerError::Storage(format!("cannot read {}: {e}", path.display()));
    let corrupt = |reason: String| LedgerError::Corrupt {
        ip: path.display().to_string(),
        reason,
    };
    let start = named.kind.records_start() as usize;
    let mut window = Window::new(reader, len);
    let head = window.bytes(0, 0, start).map_err(cannot_read)?;
    let head = head[..head.len().min(start)].to_vec();
    let (header, mark) = read_header(&head, window.len, named);
    let mut scan = Scan {
        len: window.len as u64,
        header,
        mark,
        records: 0,
        good: window.len.min(start) as u64,
        torn: false,
        damage: Vec::new(),
    };
    if window.len < start {
        return Ok(scan);
    }
    let mut at = start;
    loop {
        match window.record(at, usize::MAX).map_err(cannot_read)? {
            Some((claim, end)) => {
                let claim = claim.map_err(|e| corrupt(format!("record at byte {at}: {e}")))?;
                each(claim, (end - at) as u64);
                scan.records += 1;
                at = end;
                scan.good = end as u64;
            }
            // no record here: the end of the records, a torn write, or damage with records
            // after it
            None => match window.next_record(at).map_err(cannot_read)? {
                Some(next) => {
                    scan.damage.push(Stretch {
                        offset: at as u64,
                        len: (next - at) as u64,
                        before: scan.records,
                    });
                    at = next;
                }
                None => break,
            },
        }
    }
    let good = scan.good as usize;
    let rest = window.bytes(good, good, usize::MAX).map_err(cannot_read)?;
    scan.torn = rest.iter().any(|&b| b != 0);
    scan.len = window.len as u64;
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{encode_record, new_journal};
    use crate::unreadable_holder;

    fn claim(n: u32) -> Claim {
        unreadable_holder(
            std::net::Ipv4Addr::from(0x0a00_0000 + n).into(),
            &format!("request-{n}"),
        )
    }

    /// A binary file of `count` records, with where each record starts.
    fn file(count: u32) -> (Vec<u8>, Vec<usize>) {
        let mut bytes = new_journal(1);
        let mut starts = Vec::new();
        for n in 0..count {
            starts.push(bytes.len());
            encode_record(&mut bytes, &claim(n)).unwrap();
        }
        (bytes, starts)
    }

    fn ips(parsed: &Parsed) -> Vec<u32> {
        parsed
            .claims
            .iter()
            .map(|(claim, _)| match claim.ip {
                std::net::IpAddr::V4(ip) => u32::from(ip) - 0x0a00_0000,
                ip => panic!("{ip}"),
            })
            .collect()
    }

    /// Every record of a file many chunks long is read once, in order, with its size, and the
    /// file is whole.
    #[test]
    fn a_file_of_many_chunks_is_read_record_by_record() {
        let (bytes, starts) = file(300);
        assert!(bytes.len() > 100 * CHUNK);
        let parsed = parse_bytes(Path::new("f"), &bytes).unwrap();
        assert_eq!(ips(&parsed), (0..300).collect::<Vec<_>>());
        let sizes: Vec<u64> = parsed.claims.iter().map(|(_, size)| *size).collect();
        let expected: Vec<u64> = starts
            .windows(2)
            .map(|w| (w[1] - w[0]) as u64)
            .chain([(bytes.len() - starts[299]) as u64])
            .collect();
        assert_eq!(sizes, expected);
        assert_eq!(parsed.scan.good, bytes.len() as u64);
        assert!(!parsed.scan.torn && parsed.scan.damage.is_empty());
    }

    /// Damage over several chunks is one stretch from the first bad record to the next whole
    /// one, wherever the chunks' edges fall; every record after it is still read; a torn
    /// write at the end is told from room.
    #[test]
    fn damage_across_chunks_is_one_stretch_and_the_records_after_it_are_read() {
        let (mut bytes, starts) = file(200);
        // from inside record 50 to inside record 53: records 50, 51, 52 and 53 are lost
        let (from, to) = (starts[50] + 3, starts[53] + 5);
        bytes[from..to].fill(0xa5);
        let room = bytes.len();
        bytes.extend_from_slice(&[0; 500]);
        let parsed = parse_bytes(Path::new("f"), &bytes).unwrap();
        let kept: Vec<u32> = (0..50).chain(54..200).collect();
        assert_eq!(ips(&parsed), kept);
        assert_eq!(
            parsed.scan.damage,
            [Stretch {
                offset: starts[50] as u64,
                len: (starts[54] - starts[50]) as u64,
                before: 50
            }]
        );
        assert_eq!(parsed.scan.records_after_damage(), 146);
        assert_eq!(parsed.scan.good, room as u64);
        assert!(!parsed.scan.torn, "zeros after the records are room");
        bytes[room + 400] = 7;
        assert!(parse_bytes(Path::new("f"), &bytes).unwrap().scan.torn);
    }

    /// A length that no record of the file can have is not read as one: the scan finds the
    /// next record instead of reading on to the end.
    #[test]
    fn a_huge_length_in_a_header_is_no_record() {
        let (mut bytes, starts) = file(20);
        bytes[starts[5]..starts[5] + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let parsed = parse_bytes(Path::new("f"), &bytes).unwrap();
        assert_eq!(parsed.scan.records, 19);
        assert_eq!(parsed.scan.damage[0].offset, starts[5] as u64);
        assert_eq!(parsed.scan.damage[0].len, (starts[6] - starts[5]) as u64);
    }

    /// Reading a file through the window gives what reading its bytes gives.
    #[test]
    fn a_file_reads_as_its_bytes_do() {
        let (mut bytes, starts) = file(40);
        bytes[starts[30] + 9] ^= 1;
        bytes.extend_from_slice(&[1, 2]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        std::fs::write(&path, &bytes).unwrap();
        let from_file = parse_file(&path).unwrap();
        let from_bytes = parse_bytes(&path, &bytes).unwrap();
        assert_eq!(from_file.claims, from_bytes.claims);
        assert_eq!(from_file.scan.damage, from_bytes.scan.damage);
        assert_eq!(from_file.scan.good, from_bytes.scan.good);
        assert!(from_file.scan.torn && from_bytes.scan.torn);
        assert_eq!(from_file.claims.len(), 39);
    }
}
