//! The damage table of `docs/ledgers.md`, tested: every damage of a single region of a small
//! ledger is either refused, naming the file (and, for a damaged file, a byte at or before
//! the damage), or read with every acknowledged claim, the way SQLite's corruption tests
//! damage a database byte by byte. The ledger has a snapshot, a closed journal and the open
//! one (a compaction whose snapshot is not written yet), the marker, and one network's books.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::oneshot;

use super::journal::Journal;
use super::load::survey;
use super::marker::{MARKER, NETWORKS};
use super::writer::Request;
use super::{JOURNAL, SNAPSHOT, name, register_books};
use crate::record::{FIXED_LEN, JOURNAL_START, Kind, SLOT_LEN, SLOTS};
use crate::{Claim, LedgerError, Phase, unreadable_holder};

/// The rows of the table, as `docs/ledgers.md` shows them.
const ROWS: [(&str, &str, &str); 11] = [
    (
        "a journal's fixed header (bytes 0–64), or both of its marks",
        "a byte changed, zeroed, the file cut inside its header",
        "refused",
    ),
    (
        "one of a journal's two marks",
        "a byte changed, zeroed",
        "read: the other mark is used",
    ),
    (
        "the unused bytes of a journal's header",
        "a byte changed",
        "read: nothing reads them",
    ),
    (
        "a journal's records, up to its mark",
        "a byte changed, a record zeroed, a trailing stretch zeroed, the file cut",
        "refused",
    ),
    (
        "a journal after its mark (its room)",
        "a byte changed, a stretch zeroed, the file cut",
        "read: a torn write never answered; `serve` cuts it",
    ),
    (
        "a snapshot",
        "a byte changed, a record or trailing stretch zeroed, the file cut, bytes added",
        "refused",
    ),
    ("a journal or the snapshot", "deleted", "refused"),
    ("`ledger.id`", "deleted", "read: `serve` writes it again"),
    (
        "`ledger.id`",
        "a byte changed, zeroed, the file cut",
        "refused",
    ),
    ("`networks/` or a network's books", "deleted", "refused"),
    (
        "a network's journal, snapshot or `ledger.id`",
        "as above",
        "as above",
    ),
];

/// Where a damage falls: the row of [`ROWS`] it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Row {
    JournalHeader,
    OneMark,
    Unused,
    Records,
    Room,
    Snapshot,
    Deleted,
    MarkerDeleted,
    Marker,
    BooksDeleted,
}

impl Row {
    fn refused(self) -> bool {
        !matches!(
            self,
            Row::OneMark | Row::Unused | Row::Room | Row::MarkerDeleted
        )
    }
}

/// A claim per IP `10.77.n.1` (`n` < 200) or `10.78.n.1` (a network's).
fn claim(network: bool, n: u8) -> Claim {
    let ip = std::net::Ipv4Addr::new(10, if network { 78 } else { 77 }, n, 1);
    unreadable_holder(ip.into(), &format!("request-{network}-{n}"))
}

fn commit(journal: &mut Journal, requests: Vec<Request>) {
    let mut batch = requests;
    journal.commit(&mut batch, &mut Vec::new()).unwrap();
    journal.mark_acknowledged();
}

fn create(claim: &Claim) -> Request {
    Request::Create(Arc::new(claim.clone()), oneshot::channel().0)
}

/// The small ledger: snapshot 2 (four claims), journal 2 closed for journal 3 (three claims),
/// journal 3 (three more and one claim bound), and a network's books with two claims. With
/// every claim it acknowledged, each IP's last record.
fn small_ledger(dir: &Path) -> (Vec<Claim>, Vec<Claim>) {
    let mut primary: BTreeMap<_, Claim> = BTreeMap::new();
    let mut journal = Journal::open(dir).unwrap();
    for n in 0..4 {
        commit(&mut journal, vec![create(&claim(false, n))]);
        primary.insert(n, claim(false, n));
    }
    let (generation, closed) = journal.rotate().unwrap();
    journal.snapshot_in_background(generation, closed);
    journal.finish_compaction();
    for n in 4..7 {
        commit(&mut journal, vec![create(&claim(false, n))]);
        primary.insert(n, claim(false, n));
    }
    let (_, closed) = journal.rotate().unwrap();
    closed.unwrap().sync_data().unwrap();
    let bound = Claim {
        phase: Phase::Bound,
        ..claim(false, 0)
    };
    let step = Request::Transition(
        Box::new((claim(false, 0), bound.clone())),
        oneshot::channel().0,
    );
    commit(&mut journal, vec![create(&claim(false, 7)), step]);
    commit(&mut journal, vec![create(&claim(false, 8))]);
    commit(&mut journal, vec![create(&claim(false, 9))]);
    journal.close();
    drop(journal);
    primary.insert(0, bound);
    primary.extend((7..10).map(|n| (n, claim(false, n))));

    let books = dir.join(NETWORKS).join("default.net");
    std::fs::create_dir_all(&books).unwrap();
    let mut journal = Journal::open(&books).unwrap();
    commit(&mut journal, vec![create(&claim(true, 0))]);
    commit(&mut journal, vec![create(&claim(true, 1))]);
    journal.close();
    drop(journal);
    register_books(dir, "default.net").unwrap();
    let network = (0..2).map(|n| claim(true, n)).collect();
    (primary.into_values().collect(), network)
}

/// The claims of the ledger in `dir`, read as `serve` and `status` read them, sorted by IP;
/// or the refusal.
fn claims(dir: &Path) -> Result<Vec<Claim>, LedgerError> {
    let mut claims = BTreeMap::new();
    survey(dir, |claim, _| drop(claims.insert(claim.ip, claim)))?.refusal()?;
    Ok(claims.into_values().collect())
}

/// Every claim of `dir` and of its network's books; or the refusal. The network's books are
/// read again only after a damage of theirs (`network`: what they read undamaged).
fn read(dir: &Path, network: Option<&Vec<Claim>>) -> Result<(Vec<Claim>, Vec<Claim>), LedgerError> {
    let primary = claims(dir)?;
    let network = match network {
        Some(claims) => claims.clone(),
        None => claims(&dir.join(NETWORKS).join("default.net"))?,
    };
    Ok((primary, network))
}

/// One damage: what it does to which file, the bytes it changes, and its row.
struct Case {
    what: String,
    file: PathBuf,
    region: Range<u64>,
    row: Row,
}

/// The row of a damage of `region` in a journal whose mark is at `mark`; `cut`: the file is
/// cut at `region.start`.
fn journal_row(region: &Range<u64>, mark: u64, cut: bool) -> Row {
    let (a, b) = (region.start, region.end);
    let meets = |r: Range<u64>| a < r.end && r.start < b;
    let slot = |i: usize| SLOTS[i]..SLOTS[i] + SLOT_LEN as u64;
    if cut {
        return match a {
            a if a < JOURNAL_START => Row::JournalHeader,
            a if a < mark => Row::Records,
            _ => Row::Room,
        };
    }
    if meets(0..FIXED_LEN) || (meets(slot(0)) && meets(slot(1))) {
        Row::JournalHeader
    } else if meets(slot(0)) || meets(slot(1)) {
        Row::OneMark
    } else if b <= JOURNAL_START {
        Row::Unused
    } else if a < mark {
        Row::Records
    } else {
        Row::Room
    }
}

/// The record boundaries of a ledger file (its records' starts, and its records' end).
fn boundaries(path: &Path) -> Vec<u64> {
    let mut at = Vec::new();
    let parsed = crate::record::parse_file(path).unwrap();
    let mut start = match path.file_name().unwrap().to_str().unwrap() {
        n if n.starts_with(SNAPSHOT) => Kind::Snapshot.records_start(),
        _ => JOURNAL_START,
    };
    for (_, size) in &parsed.claims {
        at.push(start);
        start += size;
    }
    at.push(start);
    at
}

/// What a damage does to the files.
enum Change {
    /// The file cut to this length.
    Cut(u64),
    /// One bit of this byte flipped.
    Flip(u64),
    /// These bytes zeroed.
    Zero(Range<u64>),
    /// These bytes added at the end.
    Append(Vec<u8>),
    /// The file, or the directory, deleted.
    Delete,
}

/// Apply `change` to `path` (whose bytes were `bytes`).
fn apply(path: &Path, bytes: &[u8], change: &Change) {
    let mut changed = bytes.to_vec();
    match change {
        Change::Cut(len) => changed.truncate(*len as usize),
        Change::Flip(at) => changed[*at as usize] ^= 0x01,
        Change::Zero(range) => changed[range.start as usize..range.end as usize].fill(0),
        Change::Append(more) => changed.extend_from_slice(more),
        Change::Delete if path.is_dir() => return std::fs::remove_dir_all(path).unwrap(),
        Change::Delete => return std::fs::remove_file(path).unwrap(),
    }
    std::fs::write(path, changed).unwrap();
}

/// Every damage of one region of the ledger file `path` that this test makes, with its row.
fn damages_of_file(path: &Path) -> Vec<(Change, Range<u64>, Row)> {
    let bytes = std::fs::read(path).unwrap();
    let len = bytes.len() as u64;
    let file_name = path.file_name().unwrap().to_str().unwrap();
    let mut damages: Vec<(Change, Range<u64>)> = Vec::new();
    for at in 0..len {
        damages.push((Change::Cut(at), at..len));
        damages.push((Change::Flip(at), at..at + 1));
    }
    damages.push((Change::Zero(0..len), 0..len));
    damages.push((Change::Delete, 0..len));
    if file_name == MARKER {
        let row = |change: &Change| match change {
            Change::Delete => Row::MarkerDeleted,
            _ => Row::Marker,
        };
        return damages
            .into_iter()
            .map(|(change, region)| {
                let row = row(&change);
                (change, region, row)
            })
            .collect();
    }
    let starts = boundaries(path);
    let end = *starts.last().unwrap();
    for pair in starts.windows(2) {
        damages.push((Change::Zero(pair[0]..pair[1]), pair[0]..pair[1]));
        damages.push((Change::Zero(pair[0]..end), pair[0]..end));
        damages.push((Change::Zero(pair[0]..len), pair[0]..len));
    }
    if file_name.starts_with(SNAPSHOT) {
        let last = starts[starts.len() - 2] as usize..end as usize;
        damages.push((Change::Append(vec![0]), len..len + 1));
        let record = bytes[last].to_vec();
        damages.push((
            Change::Append(record.clone()),
            len..len + record.len() as u64,
        ));
        return damages
            .into_iter()
            .map(|(change, region)| {
                let row = match change {
                    Change::Delete => Row::Deleted,
                    _ => Row::Snapshot,
                };
                (change, region, row)
            })
            .collect();
    }
    damages.extend(header_damages(end, len));
    let mark = crate::record::parse_file(path)
        .unwrap()
        .scan
        .mark
        .unwrap()
        .unwrap()
        .acknowledged;
    damages
        .into_iter()
        .map(|(change, region)| {
            let row = match change {
                Change::Delete => Row::Deleted,
                Change::Cut(_) => journal_row(&region, mark, true),
                _ => journal_row(&region, mark, false),
            };
            (change, region, row)
        })
        .collect()
}

/// The damages of a journal's header (each mark, both, the fixed part, all of it) and of the
/// room after its records (`end` to `len`).
fn header_damages(end: u64, len: u64) -> Vec<(Change, Range<u64>)> {
    let mut regions: Vec<Range<u64>> = SLOTS.iter().map(|&at| at..at + SLOT_LEN as u64).collect();
    regions.extend([
        SLOTS[0]..SLOTS[1] + SLOT_LEN as u64,
        0..FIXED_LEN,
        0..JOURNAL_START,
    ]);
    if len > end {
        regions.push(end..len.min(end + 100));
    }
    regions
        .into_iter()
        .map(|region| (Change::Zero(region.clone()), region))
        .collect()
}

/// Whether `refusal` names `file`, and for a damaged file a byte at or before `region`'s end.
fn names(refusal: &LedgerError, file: &Path, region: &Range<u64>) -> bool {
    match refusal {
        LedgerError::Damaged(damage) => damage.path == file && damage.offset <= region.end,
        LedgerError::Missing(message) => {
            let dir = file.parent().unwrap().display().to_string();
            message.contains(&file.display().to_string())
                || (message.contains(&dir) && message.contains("no journal (journal.*)"))
        }
        _ => false,
    }
}

/// Every file of the ledger, and its dirs, relative to the state dir.
fn ledger_files(dir: &Path) -> Vec<PathBuf> {
    let books = Path::new(NETWORKS).join("default.net");
    let mut files = vec![
        PathBuf::from(name(SNAPSHOT, 2)),
        PathBuf::from(name(JOURNAL, 2)),
        PathBuf::from(name(JOURNAL, 3)),
        PathBuf::from(MARKER),
        books.join(name(JOURNAL, 1)),
        books.join(MARKER),
    ];
    for file in &files {
        assert!(dir.join(file).is_file(), "{} not made", file.display());
    }
    files.extend([PathBuf::from(NETWORKS), books]);
    files
}

#[test]
fn every_damage_of_one_region_is_refused_naming_the_file_or_loses_no_claim() {
    let pristine = tempfile::tempdir().unwrap();
    let expected = small_ledger(pristine.path());
    assert_eq!(read(pristine.path(), None).unwrap(), expected);
    let work = tempfile::tempdir().unwrap();
    copy_dir(pristine.path(), work.path());
    let mut seen: BTreeMap<Row, usize> = BTreeMap::new();
    for relative in ledger_files(pristine.path()) {
        let file = work.path().join(&relative);
        let damages = if file.is_dir() {
            vec![(Change::Delete, 0..0, Row::BooksDeleted)]
        } else {
            damages_of_file(&file)
        };
        let original = (!file.is_dir()).then(|| std::fs::read(&file).unwrap());
        for (change, region, row) in damages {
            apply(&file, original.as_deref().unwrap_or_default(), &change);
            let case = Case {
                what: format!("{} {:?}", relative.display(), Describe(&change)),
                file: file.clone(),
                region,
                row,
            };
            let in_books = relative.starts_with(NETWORKS);
            let unchanged = (!in_books).then_some(&expected.1);
            check(&case, read(work.path(), unchanged), &expected);
            let count = seen.entry(row).or_default();
            *count += 1;
            // `serve` opens what is read, with the same claims (its writes undone after)
            if !row.refused() && (row != Row::Unused || *count % 64 == 1) {
                let (books, claims) = match in_books {
                    true => (work.path().join(NETWORKS).join("default.net"), &expected.1),
                    false => (work.path().to_path_buf(), &expected.0),
                };
                let mut opened: Vec<Claim> = Journal::open(&books)
                    .unwrap_or_else(|e| panic!("{}: serve refused: {e}", case.what))
                    .load()
                    .iter()
                    .map(|c| (**c).clone())
                    .collect();
                opened.sort_by_key(|c| c.ip);
                assert!(&opened == claims, "{}: serve lost claims", case.what);
                copy_dir(pristine.path(), work.path());
            }
            match &original {
                Some(bytes) => std::fs::write(&file, bytes).unwrap(),
                None => copy_dir(&pristine.path().join(&relative), &file),
            }
        }
    }
    assert_eq!(read(work.path(), None).unwrap(), expected, "restored");
    assert_eq!(seen.len(), 10, "every row met: {seen:?}");
    let docs = include_str!("../../../../docs/ledgers.md");
    for (place, damage, answer) in ROWS {
        let line = format!("| {place} | {damage} | {answer} |");
        assert!(
            docs.contains(&line),
            "docs/ledgers.md lacks the row\n{line}"
        );
    }
}

fn check(
    case: &Case,
    read: Result<(Vec<Claim>, Vec<Claim>), LedgerError>,
    expected: &(Vec<Claim>, Vec<Claim>),
) {
    match (read, case.row.refused()) {
        (Ok(claims), false) => assert!(&claims == expected, "{}: claims lost", case.what),
        (Err(refusal), true) => assert!(
            names(&refusal, &case.file, &case.region),
            "{} ({:?}): the refusal does not name the file and a byte at or before the damage: {refusal}",
            case.what,
            case.region
        ),
        (Ok(_), true) => panic!("{} ({:?}) was read, not refused", case.what, case.row),
        (Err(refusal), false) => {
            panic!("{} ({:?}) was refused: {refusal}", case.what, case.row)
        }
    }
}

/// A change, said shortly.
struct Describe<'a>(&'a Change);

impl std::fmt::Debug for Describe<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Change::Cut(len) => write!(f, "cut at {len}"),
            Change::Flip(at) => write!(f, "bit flipped at {at}"),
            Change::Zero(range) => write!(f, "zeroed {range:?}"),
            Change::Append(more) => write!(f, "{} bytes added", more.len()),
            Change::Delete => write!(f, "deleted"),
        }
    }
}

/// Copy the directory `from` (files and directories) to `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
