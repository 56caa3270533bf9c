//! Whether a state dir has held a ledger, and which secondary networks' books it keeps. The
//! marker `ledger.id` is written once the first journal of a dir exists; a dir that has it (or
//! a copy a repair kept) and no journal or snapshot lost its ledger: starting it empty would
//! hand out again the IPs running pods hold. It also names each network's books
//! (`networks/NAMESPACE.NAME`), written before that network's first claim can be answered: a
//! book it names that is gone is refused like a journal that is gone.
//!
//! ```text
//! ip-webhook embedded ledger
//! created 2026-12-01T10:00:00Z
//! network default.storage
//! check 1c2d3e4f
//! ```
//!
//! The last line is the CRC-32C of the lines before it: a marker changed on the disk is
//! refused, never read as naming fewer books.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use super::{storage, storage_at};
use crate::LedgerError;

/// The marker's file name.
pub(super) const MARKER: &str = "ledger.id";
/// Where the books of secondary networks are, inside a state dir.
pub(super) const NETWORKS: &str = "networks";
const TITLE: &str = "ip-webhook embedded ledger";

/// What a marker says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Marker {
    /// `created …`, as written.
    pub(super) created: String,
    /// The network books kept in `networks/`, sorted.
    pub(super) books: Vec<String>,
}

impl Marker {
    pub(super) fn new() -> Marker {
        let created = crate::unix_now();
        Marker {
            created: k8s_openapi::jiff::Timestamp::from_second(created as i64)
                .map(|t| t.to_string())
                .unwrap_or_else(|_| created.to_string()),
            books: Vec::new(),
        }
    }

    fn text(&self) -> String {
        let mut text = format!("{TITLE}\ncreated {}\n", self.created);
        for book in &self.books {
            text.push_str(&format!("network {book}\n"));
        }
        let check = crate::record::crc32c(text.as_bytes());
        text.push_str(&format!("check {check:08x}\n"));
        text
    }

    /// The marker of `dir` from its text; an error naming what is damaged.
    fn parse(text: &str, dir: &Path) -> Result<Marker, LedgerError> {
        let lines = text
            .strip_suffix('\n')
            .ok_or_else(|| damaged(dir, "it does not end with a whole line"))?;
        let body_end = lines.rfind('\n').map_or(0, |at| at + 1);
        let (body, last) = text.split_at(body_end);
        let check = last
            .strip_prefix("check ")
            .map(|hex| hex.trim_end_matches('\n'))
            .filter(|hex| hex.len() == 8)
            .and_then(|hex| u32::from_str_radix(hex, 16).ok())
            .ok_or_else(|| damaged(dir, "its last line is no `check` line"))?;
        if check != crate::record::crc32c(body.as_bytes()) {
            return Err(damaged(dir, "its check does not match its lines"));
        }
        let mut lines = body.lines();
        if lines.next() != Some(TITLE) {
            return Err(damaged(dir, format!("its first line is not {TITLE:?}")));
        }
        let mut marker = Marker {
            created: String::new(),
            books: Vec::new(),
        };
        for line in lines {
            match line.split_once(' ') {
                Some(("created", at)) => marker.created = at.to_string(),
                Some(("network", book)) => marker.books.push(book.to_string()),
                _ => return Err(damaged(dir, format!("unknown line {line:?}"))),
            }
        }
        marker.books.sort();
        marker.books.dedup();
        Ok(marker)
    }
}

/// The marker of `dir`: `None` when there is none, an error naming the file when it cannot be
/// read or was changed.
pub(super) fn read(dir: &Path) -> Result<Option<Marker>, LedgerError> {
    let path = dir.join(MARKER);
    let bytes = match std::fs::read(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        read => read.map_err(storage_at("read", &path))?,
    };
    let text = std::str::from_utf8(&bytes).map_err(|_| damaged(dir, "it is not text"))?;
    Marker::parse(text, dir).map(Some)
}

/// The refusal for the marker of `dir` that cannot be read as written (`why`).
fn damaged(dir: &Path, why: impl std::fmt::Display) -> LedgerError {
    LedgerError::Missing(format!(
        "{} is damaged: {why}. It records that this dir holds a ledger and which networks' books it keeps; `ip-webhook ledger repair --state-dir {}` writes it again from the files there",
        dir.join(MARKER).display(),
        dir.display()
    ))
}

/// Write `marker` to `dir`: temp file, fsync, rename, directory fsync.
pub(super) fn write(dir: &Path, marker: &Marker) -> Result<(), LedgerError> {
    let path = dir.join(MARKER);
    let tmp = dir.join(format!("{MARKER}.tmp"));
    let mut file = File::create(&tmp).map_err(storage_at("create", &tmp))?;
    file.write_all(marker.text().as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(storage_at("write", &tmp))?;
    drop(file);
    std::fs::rename(&tmp, &path).map_err(storage_at("rename to", &path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(storage("sync state dir"))
}

/// The network books that `dir/networks/` holds (each a dir with a ledger in it).
pub(super) fn books_present(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir.join(NETWORKS)) else {
        return Vec::new();
    };
    let mut books: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|book| super::exists_in(&dir.join(NETWORKS).join(book)))
        .collect();
    books.sort();
    books
}

/// The files in `dir` that say a ledger was kept there: the marker, the copies a repair keeps.
pub(super) fn signs(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    if dir.join(MARKER).exists() {
        found.push(MARKER.to_string());
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        let mut copies: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|name| name.contains(".damaged-"))
            .collect();
        copies.sort();
        found.extend(copies);
    }
    found
}

/// The refusal for a dir that held a ledger and has no journal or snapshot.
pub(super) fn missing(dir: &Path, signs: &[String]) -> LedgerError {
    LedgerError::Missing(format!(
        "{} held a ledger ({} there) but has no journal (journal.*) or snapshot (snapshot.*) file: refusing to start an empty ledger, which would hand out again the IPs running pods hold. Restore the files from a backup; to start an empty ledger on purpose, remove {} first",
        dir.display(),
        signs.join(", "),
        signs.join(" and ")
    ))
}

/// The refusal for a network's books that the marker names and that are gone.
pub(super) fn books_gone(dir: &Path, book: &str) -> LedgerError {
    let path = dir.join(NETWORKS).join(book);
    LedgerError::Missing(format!(
        "{} names the books of secondary network {book}, and {} holds no ledger: refusing to start without them, which would hand out again the IPs its pods hold. Restore {} from a backup; to go on without that network's claims on purpose, `ip-webhook ledger repair --state-dir {} --apply` forgets it",
        dir.join(MARKER).display(),
        path.display(),
        path.display(),
        dir.display()
    ))
}

/// The refusal for a ledger one of whose journals (or the snapshot its journals follow) is
/// gone: the records in it are lost, and starting without them would hand out again the IPs
/// they recorded. `first` is the first journal there.
pub(super) fn journal_gone(dir: &Path, base: u64, gone: u64, first: Option<u64>) -> LedgerError {
    let journal = dir.join(super::name(super::JOURNAL, gone));
    let refusing = "Refusing to start without those records, which would hand out again the IPs running pods hold";
    let detail = match first {
        Some(first) if base == 0 && first > gone => format!(
            "its journals start at {} and {}, the snapshot they follow, is gone. {refusing}. Restore the snapshot from a backup",
            super::name(super::JOURNAL, first),
            dir.join(super::name(super::SNAPSHOT, first)).display()
        ),
        _ => {
            let what = if base > 0 && gone == base {
                format!(
                    "{} is there, but {}, which holds the records written after it, is gone",
                    super::name(super::SNAPSHOT, base),
                    journal.display()
                )
            } else {
                format!("{} is gone", journal.display())
            };
            format!(
                "{what}. {refusing}. Restore it from a backup; to go on without its records on purpose, `ip-webhook ledger repair --state-dir {} --apply` writes it again empty",
                dir.display()
            )
        }
    };
    LedgerError::Missing(format!(
        "{} holds an incomplete ledger: {detail}",
        dir.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_reads_back_and_any_change_is_refused() {
        let marker = Marker {
            created: "2026-12-01T10:00:00Z".into(),
            books: vec!["default.a".into(), "prod.b".into()],
        };
        let text = marker.text();
        let dir = Path::new("/state");
        assert_eq!(Marker::parse(&text, dir).unwrap(), marker);
        for at in 0..text.len() {
            let mut bytes = text.clone().into_bytes();
            bytes[at] ^= 0x01;
            if let Ok(changed) = std::str::from_utf8(&bytes) {
                assert!(
                    Marker::parse(changed, dir).is_err(),
                    "a change at {at} was read"
                );
            }
        }
        for len in 0..text.len() {
            assert!(
                Marker::parse(&text[..len], dir).is_err(),
                "cut at {len} was read"
            );
        }
    }
}
