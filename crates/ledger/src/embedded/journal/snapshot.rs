//! Writing a snapshot and removing the files it covers, in steps the disk absorbs while the
//! writer goes on committing to the new journal.
//!
//! The compactor runs beside the writer, on the same disk, and the writer's `fdatasync` waits
//! for whatever the disk has in flight. Two things made it wait for tens of milliseconds
//! (measured on ext4 mounted with `discard`, docs/performance.md): the snapshot's data synced at
//! once at its end (the whole file's writeback ahead of a 512-byte commit), and the unlink of a
//! large old journal or snapshot (its extents freed, and discarded, in one file-system
//! transaction that the next commit waits for). So the snapshot is synced every
//! [`SYNC_STEP`], and a file is shrunk [`FREE_STEP`] at a time, each step synced, before it is
//! unlinked.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::super::{JOURNAL, SNAPSHOT, generations, name, storage, storage_at};
use crate::record::{FIXED_LEN, Header, Kind, encode_record};
use crate::{Claim, LedgerError};

/// A snapshot's written data is synced every this many bytes.
#[cfg(not(test))]
const SYNC_STEP: usize = 2 << 20;
#[cfg(test)]
const SYNC_STEP: usize = 1 << 10;

/// The snapshot's records are written this many bytes at a time.
#[cfg(not(test))]
const WRITE_CHUNK: usize = 1 << 20;
#[cfg(test)]
const WRITE_CHUNK: usize = 300;

/// A file removed after a compaction loses this many bytes per synced truncation.
#[cfg(not(test))]
const FREE_STEP: u64 = 8 << 20;
#[cfg(test)]
const FREE_STEP: u64 = 1 << 10;

pub(in super::super) fn sync_dir(dir: &Path) -> Result<(), LedgerError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| LedgerError::Storage(format!("cannot sync {}: {e}", dir.display())))
}

/// Write every claim to `snapshot.<generation>`: temp file, synced in steps, its header (with
/// its record count and length) written last, rename, directory fsync.
pub(in super::super) fn write_snapshot<'a>(
    dir: &Path,
    generation: u64,
    claims: impl Iterator<Item = &'a Claim>,
) -> Result<(), LedgerError> {
    let tmp = dir.join(format!("{}.tmp", name(SNAPSHOT, generation)));
    let written = write_snapshot_to(dir, &tmp, generation, claims);
    if written.is_err() {
        // a full disk gets its space back
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn write_snapshot_to<'a>(
    dir: &Path,
    tmp: &Path,
    generation: u64,
    claims: impl Iterator<Item = &'a Claim>,
) -> Result<(), LedgerError> {
    let mut buf = Vec::with_capacity(WRITE_CHUNK + 4096);
    // the header's place, written once the count and the length are known
    buf.resize(FIXED_LEN as usize, 0);
    let mut file = File::create(tmp).map_err(storage_at("create the snapshot", tmp))?;
    let (mut unsynced, mut records, mut end) = (0, 0u64, 0u64);
    for claim in claims {
        encode_record(&mut buf, claim)?;
        records += 1;
        if buf.len() >= WRITE_CHUNK {
            file.write_all(&buf).map_err(storage("write snapshot"))?;
            unsynced += buf.len();
            end += buf.len() as u64;
            buf.clear();
            if unsynced >= SYNC_STEP {
                file.sync_data().map_err(storage("sync snapshot"))?;
                unsynced = 0;
            }
        }
    }
    file.write_all(&buf).map_err(storage("write snapshot"))?;
    end += buf.len() as u64;
    let header = Header {
        kind: Kind::Snapshot,
        generation,
        records,
        end,
    };
    file.write_all_at(&header.encode(), 0)
        .map_err(storage("write snapshot"))?;
    file.sync_all().map_err(storage("sync snapshot"))?;
    drop(file);
    std::fs::rename(tmp, dir.join(name(SNAPSHOT, generation)))
        .map_err(storage("rename snapshot"))?;
    sync_dir(dir)
}

/// Delete the journals and snapshots older than `generation` (a snapshot of it is durable).
/// A crash part way leaves a shortened file below the newest snapshot, which no open reads
/// and the next compaction removes.
pub(in super::super) fn remove_before(dir: &Path, generation: u64) -> Result<(), LedgerError> {
    for prefix in [JOURNAL, SNAPSHOT] {
        for old in generations(dir, prefix)? {
            if old < generation {
                remove_in_steps(&dir.join(name(prefix, old)))?;
            }
        }
    }
    sync_dir(dir)
}

/// Shrink the file at `path` to nothing, [`FREE_STEP`] at a time with each step synced, then
/// unlink it.
fn remove_in_steps(path: &Path) -> Result<(), LedgerError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(storage_at("open the old file", path))?;
    let len = file.metadata().map_err(storage_at("stat", path))?.len();
    for size in shrinking(len, FREE_STEP) {
        file.set_len(size)
            .and_then(|()| file.sync_data())
            .map_err(storage_at("shrink the old file", path))?;
    }
    drop(file);
    std::fs::remove_file(path).map_err(storage_at("remove the old file", path))
}

/// The sizes a file of `len` bytes is cut to, `step` less each time, down to 0.
fn shrinking(len: u64, step: u64) -> impl Iterator<Item = u64> {
    std::iter::successors(Some(len), move |&size| {
        (size > 0).then(|| size.saturating_sub(step))
    })
    .skip(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{new_journal, parse_file};
    use crate::unreadable_holder;

    #[test]
    fn a_file_shrinks_a_step_at_a_time_to_nothing() {
        assert_eq!(shrinking(2500, 1000).collect::<Vec<_>>(), [1500, 500, 0]);
        assert_eq!(shrinking(2000, 1000).collect::<Vec<_>>(), [1000, 0]);
        assert_eq!(shrinking(0, 1000).count(), 0);
    }

    /// A snapshot of many write chunks and sync steps reads back whole, and removing what it
    /// covers leaves only it and the newer journal.
    #[test]
    fn a_snapshot_written_in_steps_reads_back_and_the_files_before_it_go() {
        let dir = tempfile::tempdir().unwrap();
        let claims: Vec<Claim> = (0..400u32)
            .map(|n| {
                let ip = std::net::Ipv4Addr::from(0x0a09_0000 + n).into();
                unreadable_holder(ip, &format!("request-{n}"))
            })
            .collect();
        for generation in [1, 2] {
            std::fs::write(dir.path().join(name(JOURNAL, generation)), vec![7u8; 5000]).unwrap();
        }
        write_snapshot(dir.path(), 1, claims.iter()).unwrap();
        write_snapshot(dir.path(), 2, claims.iter().take(10)).unwrap();
        let snapshot = dir.path().join(name(SNAPSHOT, 1));
        let size = std::fs::metadata(&snapshot).unwrap().len();
        assert!(
            size > 8 * SYNC_STEP as u64,
            "{size} bytes: several sync steps"
        );
        let parsed = parse_file(&snapshot).unwrap();
        assert_eq!(parsed.claims.len(), claims.len());
        assert!(!parsed.scan.torn && parsed.scan.damage.is_empty());
        let header = parsed.scan.header.unwrap();
        assert_eq!((header.records, header.end), (400, size));
        assert_eq!(parsed.claims[399].0.ip, claims[399].ip);

        remove_before(dir.path(), 2).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, [name(JOURNAL, 2), name(SNAPSHOT, 2)]);
    }

    /// A crash while the files below a durable snapshot were being shrunk leaves them cut in
    /// the middle of a record: the ledger still opens with every claim of the snapshot.
    #[test]
    fn files_cut_short_below_the_snapshot_are_never_read() {
        let dir = tempfile::tempdir().unwrap();
        let claims: Vec<Claim> = (0..50u32)
            .map(|n| unreadable_holder(std::net::Ipv4Addr::from(0x0a0a_0000 + n).into(), "r"))
            .collect();
        write_snapshot(dir.path(), 1, claims.iter().take(20)).unwrap();
        let mut journal = new_journal(1);
        for claim in &claims[20..] {
            encode_record(&mut journal, claim).unwrap();
        }
        std::fs::write(dir.path().join(name(JOURNAL, 1)), &journal).unwrap();
        write_snapshot(dir.path(), 2, claims.iter()).unwrap();
        std::fs::write(dir.path().join(name(JOURNAL, 2)), new_journal(2)).unwrap();
        // what a crash between two steps of the removal leaves
        for old in [name(JOURNAL, 1), name(SNAPSHOT, 1)] {
            let file = OpenOptions::new()
                .write(true)
                .open(dir.path().join(old))
                .unwrap();
            let len = file.metadata().unwrap().len();
            file.set_len(len / 2 + 3).unwrap();
        }

        let opened = super::super::Journal::open(dir.path()).unwrap();
        let mut ips: Vec<_> = opened.load().iter().map(|c| c.ip).collect();
        ips.sort();
        assert_eq!(ips, claims.iter().map(|c| c.ip).collect::<Vec<_>>());
        drop(opened);
        remove_before(dir.path(), 2).unwrap();
        assert!(!dir.path().join(name(JOURNAL, 1)).exists());
        assert!(!dir.path().join(name(SNAPSHOT, 1)).exists());
    }
}
