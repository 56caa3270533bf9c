//! The embedded ledger's disk on an operator's worst day, through the real binary: a damaged
//! journal (a flipped byte, a zeroed page) refuses `serve`, `status` and `review` with the same
//! message until `ledger repair --apply`; a torn tail still starts; a state dir that lost its
//! journal refuses to start empty; a full disk (a small tmpfs) refuses admissions at once,
//! turns `/readyz` 503 and resumes by itself once space returns, losing nothing.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::fakeapi::FakeApi;
use common::*;
use ip_webhook_ledger::embedded::CommitCounters;
use ip_webhook_ledger::{Claim, EmbeddedLedger, Ledger, Phase};

/// Run the binary with `args` to its end (at most 20 s): (success, stdout, stderr).
fn run(args: &[&str]) -> (bool, String, String) {
    let mut child = binary()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("`ip-webhook {}` did not end", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `serve` on `dir` (expected to refuse): its stderr.
fn serve_refuses(dir: &Path) -> String {
    let dir = dir.display().to_string();
    let (ok, _, stderr) = run(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--ledger",
        "embedded",
        "--state-dir",
        &dir,
    ]);
    assert!(!ok, "serve started on {dir}");
    stderr
}

/// The `i`th claim of a seeded ledger: pod `prod/web-{i}`'s, Bound, on its own IP.
fn claim_number(i: u32) -> Claim {
    let ip = format!("10.40.{}.{}", i / 250, i % 250 + 1);
    claims::builder(&ip, "web", &format!("web-{i}"))
        .namespace("prod")
        .request(&format!("uid-{i}"))
        .bound()
        .list_size(1000)
        .token(&format!("token-{i}"))
        .at(1_764_000_000)
        .build()
}

/// A state dir whose ledger holds `n` claims, closed cleanly: the path of its journal.
async fn seeded(dir: &Path, n: u32) -> PathBuf {
    let ledger = EmbeddedLedger::open(dir, CommitCounters::default()).unwrap();
    for i in 0..n {
        ledger.create(claim_number(i).into()).await.unwrap();
    }
    ledger.close().await;
    journal(dir)
}

fn journal(dir: &Path) -> PathBuf {
    newest(dir, "journal.")
}

/// The newest file of `dir` named `prefix` and a generation.
fn newest(dir: &Path, prefix: &str) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix(prefix))
                .is_some_and(|generation| generation.parse::<u64>().is_ok())
        })
        .collect();
    found.sort();
    found
        .pop()
        .unwrap_or_else(|| panic!("no {prefix}* in {}", dir.display()))
}

async fn held(dir: &Path) -> Vec<Claim> {
    let ledger = EmbeddedLedger::open(dir, CommitCounters::default()).unwrap();
    let claims = ledger.load().await.unwrap();
    ledger.close().await;
    claims.into_iter().filter(|c| c.is_held()).collect()
}

/// The end of the journal's records (the zeros of its room follow): every record of
/// [`claim`] ends in two zero bytes (no release time, not sticky) after a non-zero one.
fn records_end(bytes: &[u8]) -> usize {
    bytes.iter().rposition(|&b| b != 0).unwrap() + 3
}

/// Cut the file at `path` to `len` bytes.
fn cut(path: &Path, len: u64) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.set_len(len).unwrap();
}

/// Where a journal's records start: a journal of that length holds none.
const JOURNAL_HEADER: u64 = 1536;

/// The message the first line of `stderr` carries after `Error: `.
fn error_line(stderr: &str) -> &str {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("Error: "))
        .unwrap_or_else(|| panic!("no Error: line in {stderr}"));
    line.trim_start_matches("Error: ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_in_the_middle_refuses_every_command_until_repaired() {
    // 40 claims and a flipped byte at 30 %; 4000 claims (past one 4 KiB page) and a zeroed page
    for (claims, zero_page) in [(40u32, false), (400, true)] {
        let state = tempfile::tempdir().unwrap();
        let dir = state.path();
        let path = seeded(dir, claims).await;
        let mut bytes = std::fs::read(&path).unwrap();
        let end = records_end(&bytes);
        if zero_page {
            assert!(end > 3 * 4096, "{end} bytes of records");
            bytes[4096..8192].fill(0);
        } else {
            let start = JOURNAL_HEADER as usize;
            bytes[start + (end - start) * 3 / 10] ^= 0x01;
        }
        std::fs::write(&path, &bytes).unwrap();
        let listing = || {
            let mut names: Vec<_> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            names
        };
        let before = listing();

        let refused = serve_refuses(dir);
        let message = error_line(&refused).to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains("is damaged at byte"), "{message}");
        assert!(message.contains("valid record(s) follow"), "{message}");
        assert!(message.contains("ledger repair --state-dir"), "{message}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "serve changed the file"
        );
        assert_eq!(listing(), before, "serve added or removed files");

        // status and review read the same damage, and say it the same way
        let dir_arg = dir.display().to_string();
        let (ok, _, stderr) = run(&["status", "--state-dir", &dir_arg]);
        assert!(!ok);
        assert!(error_line(&stderr).contains(&message), "{stderr}");
        let review = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            review.path(),
            create("r1", pod("prod", "web", "web-", Some("10.40.0.0/16"))).to_string(),
        )
        .unwrap();
        let file = review.path().display().to_string();
        for dry in [true, false] {
            let mut args = vec![
                "review",
                "--ledger",
                "embedded",
                "--state-dir",
                &dir_arg,
                &file,
            ];
            if dry {
                args.push("--dry-run");
            }
            let (ok, stdout, stderr) = run(&args);
            assert!(!ok, "review (dry run {dry}) answered: {stdout}");
            assert!(stderr.contains(&message), "{stderr}");
        }
        assert_eq!(std::fs::read(&path).unwrap(), bytes);

        // the dry run says what a repair keeps and loses, and changes nothing
        let (ok, plan, stderr) = run(&["ledger", "repair", "--state-dir", &dir_arg]);
        assert!(ok, "{stderr}");
        assert!(plan.contains("kept: ") && plan.contains("lost: "), "{plan}");
        assert!(plan.contains("Dry run"), "{plan}");
        assert_eq!(listing(), before, "the dry run changed the dir");
        let (ok, done, stderr) = run(&["ledger", "repair", "--state-dir", &dir_arg, "--apply"]);
        assert!(ok, "{stderr}");
        let copy = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.display().to_string().contains(".damaged-"))
            .expect("the original is kept");
        assert_eq!(std::fs::read(&copy).unwrap(), bytes);
        assert!(done.contains(&copy.display().to_string()), "{done}");

        // it starts again with every readable claim
        let kept = held(dir).await.len();
        // a page holds at most 4096 / (smallest record) records, and two cut at its edges
        let smallest = (end - JOURNAL_HEADER as usize) / claims as usize - 4;
        let lost = if zero_page { 4096 / smallest + 2 } else { 1 };
        assert!(
            kept < claims as usize && kept + lost >= claims as usize,
            "{kept} of {claims} claims kept"
        );
        let (ok, _, stderr) = run(&["status", "--state-dir", &dir_arg]);
        assert!(ok, "{stderr}");
    }
}

/// A torn tail (the last write a crash cut short, never answered) is no damage: `serve`
/// starts and keeps every whole record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_tail_still_starts_and_keeps_every_whole_record() {
    let state = tempfile::tempdir().unwrap();
    let path = seeded(state.path(), 40).await;
    let mut bytes = std::fs::read(&path).unwrap();
    let end = records_end(&bytes);
    // half of one more record, as a crash mid-write leaves it
    let torn = std::fs::read(&path).unwrap()[end - 60..end - 30].to_vec();
    bytes[end..end + torn.len()].copy_from_slice(&torn);
    std::fs::write(&path, &bytes).unwrap();
    let dir = state.path().display().to_string();
    let server = tokio::task::spawn_blocking(move || {
        BinaryServer::start(&["--ledger", "embedded", "--state-dir", &dir])
    })
    .await
    .unwrap();
    let (code, body) = http_get(server.admin_addr, "/readyz").await;
    assert_eq!((code, body.as_str()), (200, "ready\n"));
    drop(server);
    let held = held(state.path()).await;
    let missing: Vec<String> = (0..40)
        .map(|i| claim_number(i).ip.to_string())
        .filter(|ip| !held.iter().any(|c| c.ip.to_string() == *ip))
        .collect();
    assert!(missing.is_empty(), "lost {missing:?}; {} held", held.len());
}

/// A state dir that held a ledger (its marker, or an older release's lock file) and lost its
/// journal refuses to start, naming what is missing; a fresh dir starts empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_journal_refuses_to_start_and_a_fresh_dir_starts() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path();
    let path = seeded(dir, 3).await;
    assert!(dir.join("ledger.id").is_file(), "the marker is written");
    std::fs::remove_file(&path).unwrap();
    let message = error_line(&serve_refuses(dir)).to_string();
    assert!(
        message.contains(&dir.display().to_string())
            && message.contains("ledger.id")
            && message.contains("no journal"),
        "{message}"
    );
    let (ok, _, stderr) = run(&["status", "--state-dir", &dir.display().to_string()]);
    assert!(!ok && stderr.contains(&message), "{stderr}");

    let fresh = tempfile::tempdir().unwrap();
    let fresh_dir = fresh.path().display().to_string();
    let server = tokio::task::spawn_blocking(move || {
        BinaryServer::start(&["--ledger", "embedded", "--state-dir", &fresh_dir])
    })
    .await
    .unwrap();
    let (code, _) = http_get(server.admin_addr, "/readyz").await;
    assert_eq!(code, 200);
    drop(server);
    assert!(fresh.path().join("ledger.id").is_file());
}

/// A tmpfs of `size`, mounted on a fresh directory and unmounted on drop.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("mount(8) runs");
        assert!(
            out.status.success(),
            "this test mounts a {size} tmpfs to fill its disk: run it as root (or with CAP_SYS_ADMIN); mount said: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir)
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

fn metric(text: &str, name: &str) -> Option<String> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .map(|l| l[name.len() + 1..].to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_at_once_says_where_and_resumes_by_itself() {
    // room for the journal's first MiB once the ballast is gone
    let disk = Tmpfs::mount("1200k");
    let state = disk.path().join("state");
    let dir = state.display().to_string();
    // a first start writes the certificates and the journal; its room is then taken back
    let args = ["--ledger", "embedded", "--state-dir", &dir];
    let first = tokio::task::spawn_blocking({
        let args = args.map(String::from);
        move || BinaryServer::start(&args.each_ref().map(|a| a.as_str()))
    })
    .await
    .unwrap();
    drop(first);
    cut(&journal(&state), JOURNAL_HEADER);
    // the disk filled up but for 72 KiB: the journal gets some room, not all it asks for
    let ballast = disk.path().join("ballast");
    let mut file = std::fs::File::create(&ballast).unwrap();
    while std::io::Write::write_all(&mut file, &[1u8; 4096]).is_ok() {}
    let len = file.metadata().unwrap().len();
    file.set_len(len - (72 << 10)).unwrap();
    drop(file);
    let server = tokio::task::spawn_blocking({
        let args = args.map(String::from);
        move || BinaryServer::start(&args.each_ref().map(|a| a.as_str()))
    })
    .await
    .unwrap();
    let ca = std::fs::read(state.join("ca.crt")).unwrap();
    let client = HttpsClient::new(server.https_addr, &ca);
    let admit = |i: usize| {
        let client = client.clone();
        async move {
            let body = create(
                &format!("r{i}"),
                pod("prod", "api", "api-", Some("10.50.0.0/16")),
            );
            let started = Instant::now();
            let response = client
                .post("/mutate", body.to_string())
                .await
                .unwrap()
                .response();
            (response, started.elapsed())
        }
    };

    // the room made is used up first: admissions go on while the growth fails
    let (_, metrics) = http_get(server.admin_addr, "/metrics").await;
    assert_eq!(
        metric(&metrics, "ip_webhook_ledger_disk_full").as_deref(),
        Some("1"),
        "the journal could not make all its room"
    );
    let mut acknowledged = Vec::new();
    let (denial, took) = loop {
        let (response, took) = admit(acknowledged.len()).await;
        if response["allowed"] != true {
            break (message(&response), took);
        }
        acknowledged.push(allocated_ip(&response));
        assert!(acknowledged.len() < 5000, "the disk never filled up");
    };
    assert!(acknowledged.len() > 100, "{} admitted", acknowledged.len());
    assert!(
        denial.contains("disk is full") && denial.contains(&state.display().to_string()),
        "{denial}"
    );
    assert!(took < Duration::from_secs(1), "denied after {took:?}");
    let (again, took) = admit(100_000).await;
    assert_eq!(again["allowed"], false);
    assert!(took < Duration::from_secs(1), "denied after {took:?}");
    let (code, body) = http_get(server.admin_addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("disk is full") && body.contains(&state.display().to_string()),
        "{body}"
    );

    // space returns: the ledger resumes with no restart
    std::fs::remove_file(&ballast).unwrap();
    let ready = Instant::now();
    loop {
        let (code, _) = http_get(server.admin_addr, "/readyz").await;
        if code == 200 {
            break;
        }
        assert!(ready.elapsed() < Duration::from_secs(10), "not ready again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (response, _) = admit(200_000).await;
    assert_eq!(response["allowed"], true, "{response}");
    acknowledged.push(allocated_ip(&response));
    let (_, metrics) = http_get(server.admin_addr, "/metrics").await;
    assert_eq!(
        metric(&metrics, "ip_webhook_ledger_disk_full").as_deref(),
        Some("0")
    );
    drop(server);

    // nothing acknowledged is lost
    let held: std::collections::HashSet<String> = held(&state)
        .await
        .into_iter()
        .map(|c| c.ip.to_string())
        .collect();
    for ip in &acknowledged {
        assert!(held.contains(ip), "{ip} was acknowledged and is not held");
    }
}

/// Claims `range` made in the ledger of `dir`, one commit each, closed cleanly: the path of its
/// journal. Names of one length: every record is the same size.
async fn seeded_with(dir: &Path, range: std::ops::Range<u32>) -> PathBuf {
    let ledger = EmbeddedLedger::open(dir, CommitCounters::default()).unwrap();
    for i in range {
        ledger.create(claim_number(i).into()).await.unwrap();
    }
    ledger.close().await;
    journal(dir)
}

/// `serve` and `status` on `dir` both refuse, with one message that names `path` (and `byte`,
/// for a damaged file), changing nothing: the message.
fn both_refuse(dir: &Path, path: &Path, byte: Option<u64>) -> String {
    let before = tree(dir);
    let message = error_line(&serve_refuses(dir)).to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    if let Some(byte) = byte {
        assert!(
            message.contains(&format!("damaged at byte {byte}:")),
            "{message}"
        );
    }
    let (ok, stdout, stderr) = run(&["status", "--state-dir", &dir.display().to_string()]);
    assert!(!ok, "status showed a ledger serve refuses: {stdout}");
    assert_eq!(error_line(&stderr), message);
    assert_eq!(tree(dir), before, "the refusals changed the state dir");
    message
}

/// An emptied journal (or one cut inside its header) in a dir whose marker says it held a
/// ledger: no crash leaves it (the marker follows the journal's synced header), so `serve`
/// and `status` refuse it, naming the file, where they used to start an empty ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emptied_journal_is_refused_naming_it() {
    for len in [0u64, 4] {
        let state = tempfile::tempdir().unwrap();
        let path = seeded(state.path(), 5).await;
        cut(&path, len);
        let message = both_refuse(state.path(), &path, Some(len));
        assert!(message.contains("inside the 1536-byte header"), "{message}");
    }
}

/// The last records of a journal zeroed, its length kept: the records before its
/// acknowledgement mark were answered, so this is no torn write but claims lost, refused with
/// the repair path; the repair says what it loses and the ledger starts with the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zeroed_last_records_of_a_journal_are_refused_until_repaired() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path();
    let path = seeded_with(dir, 10..30).await;
    let mut bytes = std::fs::read(&path).unwrap();
    let end = records_end(&bytes);
    let size = (end - JOURNAL_HEADER as usize) / 20;
    let from = end - 3 * size;
    bytes[from..end].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    let message = both_refuse(dir, &path, Some(from as u64));
    assert!(
        message.contains(&format!(
            "its acknowledgement mark says the records answered to admissions reach byte {end}"
        )) && message.contains("ledger repair --state-dir"),
        "{message}"
    );
    let dir_arg = dir.display().to_string();
    let (ok, plan, stderr) = run(&["ledger", "repair", "--state-dir", &dir_arg]);
    assert!(ok, "{stderr}");
    assert!(
        plan.contains(&format!(
            "lost: the answered records from byte {from} to byte {end}"
        )),
        "{plan}"
    );
    let (ok, _, stderr) = run(&["ledger", "repair", "--state-dir", &dir_arg, "--apply"]);
    assert!(ok, "{stderr}");
    let held: Vec<u32> = held(dir)
        .await
        .iter()
        .map(|c| {
            c.request_uid
                .with_str(|uid| uid.trim_start_matches("uid-").parse().unwrap())
        })
        .collect();
    assert_eq!(held.len(), 17, "{held:?}");
    assert!(held.iter().all(|i| (10..27).contains(i)), "{held:?}");
}

/// Every entry under `dir`: its path, mode, size, modification time and contents (a
/// directory's entries and times too), sorted: equal before and after means nothing was
/// created, removed, changed or touched.
fn tree(dir: &Path) -> Vec<(PathBuf, u32, u64, i64, i64, Vec<u8>)> {
    use std::os::unix::fs::MetadataExt;
    let mut entries = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(at) = todo.pop() {
        let meta = std::fs::symlink_metadata(&at).unwrap();
        let contents = if meta.is_file() {
            std::fs::read(&at).unwrap()
        } else {
            Vec::new()
        };
        if meta.is_dir() {
            todo.extend(std::fs::read_dir(&at).unwrap().map(|e| e.unwrap().path()));
        }
        let relative = at.strip_prefix(dir).unwrap().to_path_buf();
        entries.push((
            relative,
            meta.mode(),
            meta.size(),
            meta.mtime(),
            meta.mtime_nsec(),
            contents,
        ));
    }
    entries.sort();
    entries
}

/// A ledger with a snapshot: ten claims whose records are about 60 KB each, stepped between
/// Bound and Terminating until the journals passed the 8 MiB a compaction waits for, then
/// one step more (in the journal after the snapshot). The claims as held.
async fn with_snapshot(dir: &Path) -> Vec<Claim> {
    let ledger = EmbeddedLedger::open(dir, CommitCounters::default()).unwrap();
    let app: ip_webhook_ledger::Shared = "a".repeat(60_000).as_str().into();
    let mut held: Vec<Claim> = (10..20)
        .map(|i| Claim {
            app: app.clone(),
            ..claim_number(i)
        })
        .collect();
    for claim in &held {
        ledger.create(claim.clone().into()).await.unwrap();
    }
    let snapshots = |dir: &Path| {
        std::fs::read_dir(dir).unwrap().any(|e| {
            let name = e.unwrap().file_name();
            name.to_str()
                .and_then(|n| n.strip_prefix("snapshot."))
                .is_some_and(|generation| generation.parse::<u64>().is_ok())
        })
    };
    let mut steps = 0;
    while !snapshots(dir) || steps % held.len() != 1 {
        let current = &mut held[steps % 10];
        // the phase a terminating claim's pod turns back to, and back
        let phase = if current.phase == Phase::Bound {
            Phase::Terminating
        } else {
            Phase::Bound
        };
        let next = Claim {
            phase,
            updated_at: current.updated_at + 1,
            ..current.clone()
        };
        assert!(ledger.transition(current, &next).await.unwrap());
        *current = next;
        steps += 1;
        assert!(steps < 2000, "no compaction after {steps} steps");
    }
    ledger.close().await;
    held
}

/// A snapshot whose last record is zeroed (its length kept): a snapshot has no room, so it is
/// damage, and `serve` and `status` refuse it alike, naming the file and the byte (`status`
/// used to show the ledger without that claim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_whose_last_record_is_zeroed_is_refused_by_serve_and_status() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path();
    with_snapshot(dir).await;
    let snapshot = newest(dir, "snapshot.");
    let mut bytes = std::fs::read(&snapshot).unwrap();
    // ten records of one size after the 64-byte header
    let size = (bytes.len() - 64) / 10;
    assert_eq!((bytes.len() - 64) % 10, 0);
    let last = bytes.len() - size;
    bytes[last..].fill(0);
    std::fs::write(&snapshot, &bytes).unwrap();
    let message = both_refuse(dir, &snapshot, Some(last as u64));
    assert!(message.contains("a snapshot is written whole"), "{message}");
}

/// A network's books that the primary dir names and that are gone (a partial copy such as
/// `cp state/* new/`) are refused like a journal gone; `ledger repair --apply` forgets them on
/// purpose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_networks_books_gone_are_refused_like_a_journal_gone() {
    use ip_webhook_ledger::network::Network;
    use ip_webhook_ledger::{LedgerConfig, OpenOptions};
    let state = tempfile::tempdir().unwrap();
    let dir = state.path();
    seeded(dir, 2).await;
    let config = LedgerConfig::Embedded {
        state_dir: dir.to_path_buf(),
    };
    let options = OpenOptions {
        network: Some(Network::parse("default/storage").unwrap()),
        ..OpenOptions::default()
    };
    let opened = ip_webhook_ledger::open(&config, &options).await.unwrap();
    opened.ledger.create(claim_number(90).into()).await.unwrap();
    opened.ledger.close().await;
    drop(opened);
    // what `cp state/* new/` copies: the files, not the directories
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap();
        }
    }
    let books = copy.path().join("networks/default.storage");
    let message = both_refuse(copy.path(), &books, None);
    assert!(
        message.contains("secondary network default.storage"),
        "{message}"
    );
    let copy_arg = copy.path().display().to_string();
    let (ok, done, stderr) = run(&["ledger", "repair", "--state-dir", &copy_arg, "--apply"]);
    assert!(ok, "{stderr}");
    assert!(done.contains("no longer names them"), "{done}");
    assert_eq!(held(copy.path()).await.len(), 2);
}

/// `status`, `explain`, `check --drift`, `release --dry-run` and `review --dry-run` leave the
/// state dir byte for byte as they found it: names, modes, sizes, contents and times, also
/// where `serve` would write (a torn tail to cut, a snapshot's and a marker's temp files left
/// by a crash, a network's books without their marker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_commands_leave_the_state_dir_as_they_found_it() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path();
    let held = with_snapshot(dir).await;
    let books = dir.join("networks/default.storage");
    std::fs::create_dir_all(&books).unwrap();
    seeded_with(&books, 40..42).await;
    std::fs::remove_file(books.join("ledger.id")).unwrap();
    let last = journal(dir);
    let mut bytes = std::fs::read(&last).unwrap();
    let end = records_end(&bytes);
    bytes[end..end + 20].fill(0x5a);
    std::fs::write(&last, &bytes).unwrap();
    std::fs::write(dir.join("snapshot.00000000000000000099.tmp"), b"half").unwrap();
    std::fs::write(dir.join("ledger.id.tmp"), b"half").unwrap();
    let fake = FakeApi::start();
    let kubeconfig = fake.kubeconfig().display().to_string();
    let manifest = tempfile::NamedTempFile::new().unwrap();
    let mut deployment = pod("prod", "web", "web-", Some("10.40.0.0/24"));
    deployment["spec"] = serde_json::json!({"containers": []});
    std::fs::write(
        manifest.path(),
        serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "prod"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": deployment["metadata"], "spec": deployment["spec"]}}
        })
        .to_string(),
    )
    .unwrap();
    let review = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        review.path(),
        create("r1", pod("prod", "web", "web-", Some("10.40.0.0/16"))).to_string(),
    )
    .unwrap();
    let (d, m, r) = (
        dir.display().to_string(),
        manifest.path().display().to_string(),
        review.path().display().to_string(),
    );
    assert_eq!(held.len(), 10);
    let report = tempfile::NamedTempFile::new().unwrap();
    let p = report.path().display().to_string();
    let before = tree(dir);
    let drift = [
        "check",
        "--drift",
        "--ledger",
        "embedded",
        "--state-dir",
        &d,
        "--kubeconfig",
        &kubeconfig,
        "-o",
        "json",
    ];
    // (arguments, exit code): 3 is a "no" (drift found, a replica refused, a release refused)
    let commands: [(&[&str], i32); 8] = [
        (&["status", "--state-dir", &d], 0),
        (&["status", "--state-dir", &d, "-o", "wide"], 0),
        (&["status", "--state-dir", &d, "-o", "json"], 0),
        (
            &["status", "--state-dir", &d, "--network", "default/storage"],
            0,
        ),
        // denied: the held claims (of another app) hold the IPs it lists
        (&["explain", "--state-dir", &d, "-f", &m], 3),
        (
            &[
                "review",
                "--ledger",
                "embedded",
                "--state-dir",
                &d,
                &r,
                "--dry-run",
            ],
            0,
        ),
        (&drift, 3),
        // without --apply: what would be released
        (
            &[
                "release",
                "--from-report",
                &p,
                "--state-dir",
                &d,
                "--kubeconfig",
                &kubeconfig,
            ],
            0,
        ),
    ];
    for (args, expected) in commands {
        // the output is large (60 KB app names): read as it comes
        let ran = ip_webhook(args);
        let said = format!(
            "`{}`: {}{}",
            args.join(" "),
            &ran.stdout[..ran.stdout.len().min(400)],
            ran.stderr
        );
        assert_eq!(ran.code, Some(expected), "{said}");
        if args[0] == "check" {
            std::fs::write(report.path(), &ran.stdout).unwrap();
        }
        if args[0] == "release" {
            assert!(
                ran.stdout
                    .contains("would release 10 of 10 claims without a pod"),
                "{said}"
            );
        }
        assert_eq!(tree(dir), before, "{said}: the state dir changed");
    }
}
