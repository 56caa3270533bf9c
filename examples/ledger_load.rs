#![forbid(unsafe_code)]
//! The embedded ledger alone under the load benchmark's durable workload: N tasks
//! each making new claims as fast as the ledger answers, on whatever cores the process is
//! pinned to. Prints claims/s, latency p50/p99, process CPU per claim, commits, the batch size
//! and the stages of a request (queue, commit, wake-up) from the ledger's own histograms; an
//! `fdatasync` probe of the same directory; and the restart figures (time to open and load N
//! claims, bytes per claim).
//!
//! ```text
//! cargo build --release --example ledger_load
//! taskset -c 0 target/release/examples/ledger_load load  DIR [CONNS] [SECONDS]
//! taskset -c 0 target/release/examples/ledger_load probe DIR [COUNT]
//! taskset -c 0 target/release/examples/ledger_load probe-for DIR SECONDS
//! taskset -c 0 target/release/examples/ledger_load commit-cost DIR [SECONDS] [RECORDS]
//! taskset -c 0 target/release/examples/ledger_load mark-cost DIR [ROUNDS] [SECONDS] [RECORDS]
//! taskset -c 0 target/release/examples/ledger_load restart DIR [CLAIMS]
//! taskset -c 0 target/release/examples/ledger_load compact DIR [CLAIMS] [SECONDS]
//! ```
//!
//! `compact` holds CLAIMS claims and steps them between Bound and Terminating as fast as the
//! ledger answers, so the journals grow past twice the live records again and again and the
//! ledger compacts while commits go on: it prints the slowest step and how many snapshots were
//! written, to set beside `probe-for` of the same dir.
//!
//! `commit-cost` is the disk's part of one group commit, with no threads and no ledger: it
//! overwrites space it filled with synced zeros first (as the journal does) with RECORDS
//! (default 15, the batch a 16-connection run forms) 116-byte records and `fdatasync`s them,
//! again and again, and prints the process's CPU per commit and per record. `mark-cost` runs it
//! without and with the journal's acknowledgement mark (a 32-byte write into the header after
//! each commit) in alternating pairs and prints the ratio of the medians.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ip_webhook_ledger::embedded::CommitCounters;
use ip_webhook_ledger::{Claim, CreateOutcome, EmbeddedLedger, Ledger, Phase};

// as the `ip-webhook` binary does: glibc's malloc here spent 60-85 ms at a time consolidating
// the claims a compaction let go, on whichever thread allocated next
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "../tests/common/claims.rs"]
mod claims;

/// The `n`th reservation of app `web` (10.0.0.0 + `n`), shaped as admission makes them: a
/// request UID and a token of their real lengths, from a list of 2^20.
fn reservation(n: u32) -> Claim {
    let ip = Ipv4Addr::from(u32::from_be_bytes([10, 0, 0, 0]) + n).to_string();
    claims::builder(&ip, "web", "")
        .generate_name("web-7d4b9c8f6d-")
        .request(&format!("5f0c8a9e-3b1d-4c7a-9e2f-{n:012}"))
        // shaped as `new_token` makes them: 32 hex digits
        .token(&format!("{n:032x}"))
        .list_size(1 << 20)
        .at(1_764_460_800)
        .build()
}

/// This process's user and system CPU so far, in seconds.
fn process_cpu() -> (f64, f64) {
    let stat = procfs::process::Process::myself()
        .and_then(|p| p.stat())
        .expect("/proc/self/stat");
    let ticks = procfs::ticks_per_second() as f64;
    (stat.utime as f64 / ticks, stat.stime as f64 / ticks)
}

fn cpu_seconds() -> f64 {
    let (user, system) = process_cpu();
    user + system
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// One histogram series: labels, `(le, cumulative count)` buckets, sum, count.
type Series = (String, Vec<(f64, f64)>, f64, f64);

/// p50 and p99 (bucket upper bounds) and the mean of every histogram series in `text`.
fn histogram_summary(text: &str, name: &str) -> Vec<String> {
    let mut series: Vec<Series> = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (key, value) = rest.rsplit_once(' ').unwrap_or((rest, "0"));
        let value: f64 = value.parse().unwrap_or(0.0);
        let labels = key
            .split_once('{')
            .map(|(_, l)| l.trim_end_matches('}').to_string())
            .unwrap_or_default();
        let base: String = labels
            .split(',')
            .filter(|l| !l.starts_with("le="))
            .collect::<Vec<_>>()
            .join(",");
        let at = match series.iter().position(|s| s.0 == base) {
            Some(at) => at,
            None => {
                series.push((base.clone(), Vec::new(), 0.0, 0.0));
                series.len() - 1
            }
        };
        if key.starts_with("_bucket") {
            let le = labels
                .split(',')
                .find_map(|l| l.strip_prefix("le=\""))
                .map(|l| l.trim_end_matches('"'))
                .unwrap_or("+Inf");
            series[at]
                .1
                .push((le.parse().unwrap_or(f64::INFINITY), value));
        } else if key.starts_with("_sum") {
            series[at].2 = value;
        } else if key.starts_with("_count") {
            series[at].3 = value;
        }
    }
    series
        .into_iter()
        .map(|(labels, buckets, sum, count)| {
            let q = |p: f64| {
                buckets
                    .iter()
                    .find(|(_, c)| *c >= count * p)
                    .map(|(le, _)| *le)
                    .unwrap_or(f64::NAN)
            };
            format!(
                "{name}{{{labels}}} n={count} mean={:.6} p50<={} p99<={}",
                if count > 0.0 { sum / count } else { 0.0 },
                q(0.5),
                q(0.99)
            )
        })
        .collect()
}

async fn load(dir: &Path, conns: usize, seconds: u64) {
    let counters = CommitCounters::default();
    let ledger = Arc::new(EmbeddedLedger::open(dir, counters.clone()).unwrap());
    let next = Arc::new(AtomicU32::new(0));
    // warm-up
    let run = |duration: Duration| {
        let ledger = ledger.clone();
        let next = next.clone();
        async move {
            let until = Instant::now() + duration;
            let mut tasks = Vec::new();
            for _ in 0..conns {
                let ledger = ledger.clone();
                let next = next.clone();
                tasks.push(tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    while Instant::now() < until {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        let started = Instant::now();
                        let outcome = ledger.create(reservation(n).into()).await.unwrap();
                        latencies.push(started.elapsed().as_secs_f64());
                        assert_eq!(outcome, CreateOutcome::Created);
                    }
                    latencies
                }));
            }
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.unwrap());
            }
            all
        }
    };
    run(Duration::from_secs(1)).await;
    let counters_before = (counters.commits.get(), counters.writes.get());
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    let mut latencies = run(Duration::from_secs(seconds)).await;
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    latencies.sort_by(f64::total_cmp);
    let n = latencies.len() as f64;
    let commits = counters.commits.get() - counters_before.0;
    println!(
        "conns={conns} claims/s={:.0} p50={:.0}us p99={:.0}us p99.9={:.0}us max={:.0}us cpu/claim={:.1}us commits={} claims/commit={:.1}",
        n / elapsed,
        percentile(&latencies, 0.5) * 1e6,
        percentile(&latencies, 0.99) * 1e6,
        percentile(&latencies, 0.999) * 1e6,
        latencies.last().copied().unwrap_or(0.0) * 1e6,
        cpu * 1e6 / n,
        commits,
        (counters.writes.get() - counters_before.1) as f64 / commits.max(1) as f64,
    );
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register("commit_seconds", "", counters.commit_seconds.clone());
    registry.register("batch_size", "", counters.batch_size.clone());
    registry.register("stage_seconds", "", counters.stage_seconds.clone());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for name in ["commit_seconds", "batch_size", "stage_seconds"] {
        for line in histogram_summary(&text, name) {
            println!("  (incl. warm-up) {line}");
        }
    }
    ledger.close().await;
}

/// The disk's part of one group commit of `records` claims: CPU per commit and per record, from
/// writing them over synced zeros and `fdatasync`ing, again and again for `seconds`. With
/// `mark`, each commit is followed by the 32-byte write of an acknowledgement mark into the
/// file's header, in the slot of its turn, as the journal writes it after each commit's
/// answers (`record/header.rs`): the next `fdatasync` carries it. Returns the CPU per commit
/// in µs and the commits per second.
fn commit_cost(dir: &Path, seconds: f64, records: usize, mark: bool) -> (f64, f64) {
    use std::os::unix::fs::FileExt;
    const ROOM: u64 = 8 << 20;
    const HEADER: u64 = 1536;
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("commit-cost");
    let file = std::fs::File::create(&path).unwrap();
    file.write_all_at(&vec![0; ROOM as usize], 0).unwrap();
    file.sync_data().unwrap();
    let batch = vec![b'r'; records * 116];
    let slot = [b'm'; 32];
    let (user, system) = process_cpu();
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let (mut commits, mut at) = (0u64, HEADER);
    while Instant::now() < until {
        file.write_all_at(&batch, at).unwrap();
        file.sync_data().unwrap();
        if mark {
            file.write_all_at(&slot, [512, 1024][(commits % 2) as usize])
                .unwrap();
        }
        at = HEADER + (at + batch.len() as u64 - HEADER) % (ROOM - HEADER - batch.len() as u64);
        commits += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (user, system) = {
        let (u, s) = process_cpu();
        (u - user, s - system)
    };
    let per_commit = (user + system) / commits as f64 * 1e6;
    println!(
        "commit cost (overwrite {} B: {records} records of 116 B, then fdatasync{}; {seconds}s) in {}: commits={commits} cpu per commit {per_commit:.1}us (user {:.1}, system {:.1}), per record {:.2}us",
        batch.len(),
        if mark { ", then a 32 B mark" } else { "" },
        dir.display(),
        user / commits as f64 * 1e6,
        system / commits as f64 * 1e6,
        per_commit / records as f64,
    );
    drop(file);
    std::fs::remove_file(&path).unwrap();
    (per_commit, commits as f64 / elapsed)
}

/// [`commit_cost`] without and with the acknowledgement mark, in `rounds` alternating pairs
/// of `seconds` each (the drift of a shared disk falls on both alike): the medians, and with
/// the mark ÷ without.
fn mark_cost(dir: &Path, rounds: usize, seconds: f64, records: usize) {
    let (mut plain, mut marked) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        plain.push(commit_cost(dir, seconds, records, false));
        marked.push(commit_cost(dir, seconds, records, true));
    }
    let median = |runs: &[(f64, f64)], pick: fn(&(f64, f64)) -> f64| {
        let mut values: Vec<f64> = runs.iter().map(pick).collect();
        values.sort_by(f64::total_cmp);
        percentile(&values, 0.5)
    };
    let (cpu, rate) = (|r: &(f64, f64)| r.0, |r: &(f64, f64)| r.1);
    println!(
        "mark cost ({rounds} pairs of {seconds}s, {records} records a commit): cpu per commit {:.1} -> {:.1}us (x{:.3}), commits/s {:.0} -> {:.0} (x{:.3})",
        median(&plain, cpu),
        median(&marked, cpu),
        median(&marked, cpu) / median(&plain, cpu),
        median(&plain, rate),
        median(&marked, rate),
        median(&marked, rate) / median(&plain, rate),
    );
}

/// The disk's own tail: 512-byte appends, each followed by `fdatasync`, for `seconds`. The
/// slowest of them is what no ledger on this file system can beat; `scripts/bench-open-loop.sh`
/// judges the server's slowest durable answer against it.
fn probe_for(dir: &Path, seconds: f64) {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("fsync-probe-for");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .unwrap();
    let record = [b'x'; 512];
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let mut times = Vec::with_capacity(1 << 16);
    let mut slowest = (0.0, std::time::SystemTime::now());
    while Instant::now() < until {
        let (started, at) = (Instant::now(), std::time::SystemTime::now());
        file.write_all(&record).unwrap();
        file.sync_data().unwrap();
        let took = started.elapsed().as_secs_f64();
        if took > slowest.0 {
            slowest = (took, at);
        }
        times.push(took);
    }
    times.sort_by(f64::total_cmp);
    let at_ms = slowest
        .1
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    println!(
        "fdatasync probe (append 512 B, {seconds}s) in {}: syncs={} p50={:.0}us p99={:.0}us p99.9={:.0}us max={:.0}us max_at_unix_ms={at_ms}",
        dir.display(),
        times.len(),
        percentile(&times, 0.5) * 1e6,
        percentile(&times, 0.99) * 1e6,
        percentile(&times, 0.999) * 1e6,
        times.last().copied().unwrap_or(0.0) * 1e6,
    );
    drop(file);
    std::fs::remove_file(&path).unwrap();
}

/// `fdatasync` after each of `count` writes: a 300-byte record written into zeros already
/// synced, as one journal commit does (`room`); the same record
/// appended, growing the file, as one did before; and 4 KiB overwritten in place, as a page
/// store does.
fn probe(dir: &Path, count: usize) {
    use std::os::unix::fs::FileExt;
    std::fs::create_dir_all(dir).unwrap();
    let record = [b'x'; 300];
    let page = [b'y'; 4096];
    for label in ["300 B into synced zeros", "append 300 B", "overwrite 4 KiB"] {
        let path = dir.join("fsync-probe");
        let _ = std::fs::remove_file(&path);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)
            .unwrap();
        let room = label.contains("zeros");
        if room {
            file.write_all(&vec![0; record.len() * count]).unwrap();
        } else if label.contains("overwrite") {
            file.write_all(&[7u8; 4096]).unwrap();
        }
        file.sync_all().unwrap();
        let mut times = Vec::with_capacity(count);
        for i in 0..count {
            let started = Instant::now();
            if room {
                file.write_all_at(&record, (i * record.len()) as u64)
                    .unwrap();
            } else if label.contains("append") {
                file.write_all(&record).unwrap();
            } else {
                file.write_all_at(&page, 0).unwrap();
            }
            file.sync_data().unwrap();
            times.push(started.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        println!(
            "fdatasync probe ({label}, {count}x) in {}: p50={:.0}us p99={:.0}us",
            dir.display(),
            percentile(&times, 0.5) * 1e6,
            percentile(&times, 0.99) * 1e6
        );
        drop(file);
        std::fs::remove_file(&path).unwrap();
    }
}

/// Claims 0..`claims` made in `ledger`, 256 at a time.
async fn fill(ledger: &Arc<EmbeddedLedger>, claims: u32) {
    let next = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..256 {
        let ledger = ledger.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= claims {
                    break;
                }
                ledger.create(reservation(n).into()).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

async fn restart(dir: &Path, claims: u32) {
    {
        let ledger = Arc::new(EmbeddedLedger::open(dir, CommitCounters::default()).unwrap());
        fill(&ledger, claims).await;
        ledger.close().await;
    }
    let bytes: u64 = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    let started = Instant::now();
    let ledger = EmbeddedLedger::open(dir, CommitCounters::default()).unwrap();
    let loaded = ledger.load().await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(loaded.len(), claims as usize);
    println!(
        "claims={claims} bytes={bytes} bytes/claim={:.0} open+load={:.3}s",
        bytes as f64 / f64::from(claims),
        elapsed.as_secs_f64()
    );
    ledger.close().await;
}

/// The newest snapshot's generation in `dir` (0: none).
fn newest_snapshot(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().ok()?;
            name.strip_prefix("snapshot.")?.parse().ok()
        })
        .max()
        .unwrap_or(0)
}

async fn compact(dir: &Path, claims: u32, seconds: u64) {
    const TASKS: u32 = 16;
    let ledger = Arc::new(EmbeddedLedger::open(dir, CommitCounters::default()).unwrap());
    fill(&ledger, claims).await;
    let before = newest_snapshot(dir);
    // each task's claims as the ledger holds them, made before any step is timed
    let shares: Vec<Vec<Claim>> = (0..TASKS)
        .map(|task| {
            (task..claims)
                .step_by(TASKS as usize)
                .map(reservation)
                .collect()
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for mut held in shares {
        let ledger = ledger.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(1 << 20);
            'steps: loop {
                for current in &mut held {
                    if Instant::now() >= until {
                        break 'steps;
                    }
                    let mut next = current.clone();
                    next.phase = match current.phase {
                        Phase::Bound => Phase::Terminating,
                        _ => Phase::Bound,
                    };
                    next.pod.uid = Some("0c9d4b1e-uid".into());
                    next.updated_at += 1;
                    let started = Instant::now();
                    assert!(ledger.transition(current, &next).await.unwrap());
                    latencies.push(started.elapsed().as_secs_f64());
                    *current = next;
                }
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    ledger.close().await;
    latencies.sort_by(f64::total_cmp);
    println!(
        "claims={claims} steps/s={:.0} p50={:.0}us p99={:.0}us p99.9={:.0}us max={:.0}us over_20ms={} snapshots_written={}",
        latencies.len() as f64 / seconds as f64,
        percentile(&latencies, 0.5) * 1e6,
        percentile(&latencies, 0.99) * 1e6,
        percentile(&latencies, 0.999) * 1e6,
        latencies.last().copied().unwrap_or(0.0) * 1e6,
        latencies.iter().filter(|l| **l > 0.020).count(),
        newest_snapshot(dir) - before,
    );
}

#[tokio::main]
async fn main() {
    // the ledger's own stall trace (WARN lines of answers and commits slower than 20 ms)
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("RUST_LOG"))
        .with_writer(std::io::stderr)
        .init();
    // as `ip-webhook serve` does: no stall of a huge page cleared or compacted on first touch
    let _ = rustix::thread::disable_transparent_huge_pages(true);
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: ledger_load load DIR [CONNS] [SECONDS] | probe DIR [COUNT] | probe-for DIR SECONDS | commit-cost DIR [SECONDS] [RECORDS] | mark-cost DIR [ROUNDS] [SECONDS] [RECORDS] | restart DIR [CLAIMS] | compact DIR [CLAIMS] [SECONDS]";
    let mode = args.get(1).expect(usage).as_str();
    let dir = Path::new(args.get(2).expect(usage));
    match mode {
        "load" => {
            let conns = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(16);
            let seconds = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(5);
            load(dir, conns, seconds).await;
        }
        "probe" => probe(
            dir,
            args.get(3).and_then(|a| a.parse().ok()).unwrap_or(2000),
        ),
        "probe-for" => probe_for(
            dir,
            args.get(3).and_then(|a| a.parse().ok()).unwrap_or(15.0),
        ),
        "commit-cost" => drop(commit_cost(
            dir,
            args.get(3).and_then(|a| a.parse().ok()).unwrap_or(5.0),
            args.get(4)
                .and_then(|a| a.parse().ok())
                .filter(|&records| records > 0)
                .unwrap_or(15),
            false,
        )),
        "mark-cost" => mark_cost(
            dir,
            args.get(3).and_then(|a| a.parse().ok()).unwrap_or(6),
            args.get(4).and_then(|a| a.parse().ok()).unwrap_or(3.0),
            args.get(5)
                .and_then(|a| a.parse().ok())
                .filter(|&records| records > 0)
                .unwrap_or(15),
        ),
        "restart" => {
            let claims = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(100_000);
            restart(dir, claims).await;
        }
        "compact" => {
            let claims = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(200_000);
            let seconds = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(30);
            compact(dir, claims, seconds).await;
        }
        _ => panic!("{usage}"),
    }
}
