//! The header every journal and snapshot file starts with, and a journal's acknowledgement
//! marks.
//!
//! ```text
//! bytes 0..64      the fixed header: magic, kind, generation, a snapshot's record count and
//!                  length, CRC-32C of bytes 0..60 (written once)
//! bytes 512..544   a journal's mark slot 0 \ the acknowledged end of its records and, once
//! bytes 1024..1056 a journal's mark slot 1 / closed, the generation that follows it
//! ```
//!
//! A snapshot's records start at byte 64, a journal's at byte 1536. A mark says how far the
//! journal's acknowledged records reach: the writer writes it after the `fdatasync` of a commit
//! (and before or after its answers), never before, so it never names a byte a crash could
//! take back. Records that end short of it were answered and are gone, which no crash does.
//! The two slots are written in turn (the one of the mark's sequence number's parity), each in
//! a 512-byte sector of its own: a write torn by a power loss leaves the other one whole.

use super::crc32c;

/// First bytes of every journal and snapshot file.
pub(crate) const MAGIC: &[u8; 8] = b"IPWJRNL3";
/// The fixed header's length: a snapshot's records start here.
pub(crate) const FIXED_LEN: u64 = 64;
/// Where a journal's two mark slots are.
pub(crate) const SLOTS: [u64; 2] = [512, 1024];
/// A mark slot's length.
pub(crate) const SLOT_LEN: usize = 32;
/// Where a journal's records start.
pub(crate) const JOURNAL_START: u64 = 1536;

/// What a file of the ledger holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Journal,
    Snapshot,
}

impl Kind {
    /// Where its records start.
    pub(crate) fn records_start(self) -> u64 {
        match self {
            Kind::Journal => JOURNAL_START,
            Kind::Snapshot => FIXED_LEN,
        }
    }

    fn code(self) -> u32 {
        match self {
            Kind::Journal => 1,
            Kind::Snapshot => 2,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Journal => "journal",
            Kind::Snapshot => "snapshot",
        }
    }
}

/// The fixed header of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) kind: Kind,
    pub(crate) generation: u64,
    /// A snapshot's: how many records it holds, and its length (it has no room: its last
    /// record ends the file). Zero in a journal.
    pub(crate) records: u64,
    pub(crate) end: u64,
}

/// A journal's acknowledgement mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mark {
    /// Which mark: the higher one of the two slots is the newer.
    pub(crate) seq: u64,
    /// Where the acknowledged records end.
    pub(crate) acknowledged: u64,
    /// Once the journal is closed: the generation of the journal that follows it (0: open).
    pub(crate) next: u64,
}

/// Why a file's header cannot be read; `offset` is where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HeaderFault {
    pub(crate) offset: u64,
    pub(crate) reason: String,
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

impl Header {
    pub(crate) fn journal(generation: u64) -> Header {
        Header {
            kind: Kind::Journal,
            generation,
            records: 0,
            end: 0,
        }
    }

    pub(crate) fn encode(&self) -> [u8; FIXED_LEN as usize] {
        let mut bytes = [0u8; FIXED_LEN as usize];
        bytes[..8].copy_from_slice(MAGIC);
        bytes[8..12].copy_from_slice(&self.kind.code().to_le_bytes());
        bytes[16..24].copy_from_slice(&self.generation.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.records.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.end.to_le_bytes());
        let crc = crc32c(&bytes[..60]);
        bytes[60..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// The header of the file named as a `kind` of `generation`, from its first bytes (all
    /// there are, when fewer than [`FIXED_LEN`]).
    pub(crate) fn decode(bytes: &[u8], kind: Kind, generation: u64) -> Result<Header, HeaderFault> {
        let fault = |offset: u64, reason: String| HeaderFault { offset, reason };
        let compare = bytes.len().min(MAGIC.len());
        if bytes[..compare] != MAGIC[..compare] {
            let at = (0..compare).find(|&i| bytes[i] != MAGIC[i]).unwrap_or(0);
            return Err(fault(
                at as u64,
                "not an ip-webhook ledger file (bad magic)".into(),
            ));
        }
        if (bytes.len() as u64) < FIXED_LEN {
            return Err(short(bytes.len() as u64, kind));
        }
        if crc32c(&bytes[..60]) != u32_at(bytes, 60) {
            return Err(fault(0, "its header's checksum does not match".into()));
        }
        let code = u32_at(bytes, 8);
        if code != kind.code() {
            return Err(fault(
                8,
                format!("its header is not a {}'s (kind {code})", kind.name()),
            ));
        }
        let header = Header {
            kind,
            generation: u64_at(bytes, 16),
            records: u64_at(bytes, 24),
            end: u64_at(bytes, 32),
        };
        if header.generation != generation {
            return Err(fault(
                16,
                format!(
                    "its header is generation {}'s, its name generation {generation}'s",
                    header.generation
                ),
            ));
        }
        Ok(header)
    }
}

/// The fault of a `kind` file that ends at `len`, inside its header.
pub(crate) fn short(len: u64, kind: Kind) -> HeaderFault {
    HeaderFault {
        offset: len,
        reason: format!(
            "the file ends at byte {len}, inside the {}-byte header of a {}",
            kind.records_start(),
            kind.name()
        ),
    }
}

impl Mark {
    pub(crate) fn encode(&self) -> [u8; SLOT_LEN] {
        let mut bytes = [0u8; SLOT_LEN];
        bytes[..8].copy_from_slice(&self.seq.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.acknowledged.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.next.to_le_bytes());
        let crc = crc32c(&bytes[..24]);
        bytes[24..28].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Where this mark is written: the slot of its sequence number's parity.
    pub(crate) fn slot(&self) -> u64 {
        SLOTS[(self.seq % 2) as usize]
    }

    fn decode(bytes: &[u8]) -> Option<Mark> {
        let whole = bytes.len() == SLOT_LEN
            && crc32c(&bytes[..24]) == u32_at(bytes, 24)
            && bytes[28..] == [0; 4];
        let mark = Mark {
            seq: u64_at(bytes, 0),
            acknowledged: u64_at(bytes, 8),
            next: u64_at(bytes, 16),
        };
        (whole && mark.acknowledged >= JOURNAL_START).then_some(mark)
    }

    /// The newer of the journal's two marks that are whole, from its first
    /// [`JOURNAL_START`] bytes.
    pub(crate) fn newest(header: &[u8]) -> Result<Mark, HeaderFault> {
        SLOTS
            .iter()
            .filter_map(|&at| Mark::decode(&header[at as usize..at as usize + SLOT_LEN]))
            .max_by_key(|mark| mark.seq)
            .ok_or(HeaderFault {
                offset: SLOTS[0],
                reason: format!(
                    "neither of its acknowledgement marks (bytes {}..{} and {}..{}) is whole",
                    SLOTS[0],
                    SLOTS[0] + SLOT_LEN as u64,
                    SLOTS[1],
                    SLOTS[1] + SLOT_LEN as u64
                ),
            })
    }
}

/// The first [`JOURNAL_START`] bytes of a new journal of `generation`: its header, and both
/// slots holding `mark`.
pub(crate) fn journal_head(generation: u64, mark: Mark) -> Vec<u8> {
    let mut head = vec![0u8; JOURNAL_START as usize];
    head[..FIXED_LEN as usize].copy_from_slice(&Header::journal(generation).encode());
    for older in 0..2 {
        let mark = Mark {
            seq: mark.seq.saturating_sub(older),
            ..mark
        };
        let at = mark.slot() as usize;
        head[at..at + SLOT_LEN].copy_from_slice(&mark.encode());
    }
    head
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_and_any_changed_byte_is_a_fault_naming_where() {
        let header = Header {
            kind: Kind::Snapshot,
            generation: 7,
            records: 3,
            end: 400,
        };
        let bytes = header.encode();
        assert_eq!(Header::decode(&bytes, Kind::Snapshot, 7), Ok(header));
        for at in 0..FIXED_LEN as usize {
            let mut changed = bytes;
            changed[at] ^= 0x10;
            let fault = Header::decode(&changed, Kind::Snapshot, 7).unwrap_err();
            assert!(fault.offset <= at as u64, "{at}: {fault:?}");
        }
        for len in 0..FIXED_LEN as usize {
            let fault = Header::decode(&bytes[..len], Kind::Snapshot, 7).unwrap_err();
            assert_eq!(fault.offset, len as u64, "{fault:?}");
        }
        let other = Header::decode(&bytes, Kind::Journal, 7).unwrap_err();
        assert!(other.reason.contains("not a journal's"), "{other:?}");
        let renamed = Header::decode(&bytes, Kind::Snapshot, 8).unwrap_err();
        assert!(renamed.reason.contains("generation 7's"), "{renamed:?}");
    }

    #[test]
    fn the_newer_whole_mark_wins_and_none_whole_is_a_fault() {
        let first = Mark {
            seq: 1,
            acknowledged: JOURNAL_START,
            next: 0,
        };
        let mut head = journal_head(3, first);
        assert_eq!(Mark::newest(&head), Ok(first));
        let later = Mark {
            seq: 2,
            acknowledged: JOURNAL_START + 300,
            next: 0,
        };
        let at = later.slot() as usize;
        head[at..at + SLOT_LEN].copy_from_slice(&later.encode());
        assert_eq!(Mark::newest(&head), Ok(later));
        // the newer one torn: the older one is read
        head[at + 9] ^= 1;
        assert_eq!(Mark::newest(&head), Ok(first));
        let other = first.slot() as usize;
        head[other..other + SLOT_LEN].fill(0);
        assert_eq!(Mark::newest(&head).unwrap_err().offset, SLOTS[0]);
    }
}
