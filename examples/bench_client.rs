#![forbid(unsafe_code)]
//! The load benchmark's second client: closed-loop HTTPS/1.1 keep-alive load on one thread,
//! like `wrk -t1`, that keeps every request's latency (not a histogram) and prints its
//! percentiles. `scripts/bench-load.sh` runs it after wrk in each ip-webhook cell: wrk corrects
//! its latencies for coordinated omission, and for durable `/mutate` at 16 connections its p99
//! was 20–30× what a packet capture of the same run showed between request and answer on the
//! wire (docs/performance.md, "B-trees instead of hash maps: where the durable tail was").
//!
//! ```text
//! bench_client URL FIXTURE MODE CONNECTIONS SECONDS CA_PEM [RUN_ID [RATE]]
//! ```
//!
//! MODE is `as-is` (the fixture unchanged), `dry-run` (`request.dryRun` true) or `durable` (a
//! fresh `request.uid` per request and a /10 allocatable list, as `scripts/bench-load.lua`
//! does; each uid is a UUID, as API servers send, made of a hash of RUN_ID, the connection and
//! the sequence, so runs against one server do not repeat one). Prints one
//! line: `requests=N rps=R p50_us=… p90_us=… p99_us=… p999_us=… max_us=… over_20ms=N
//! max_at_unix_ms=T late_max_us=L non_200=N`.
//!
//! With RATE (requests per second) it is an open loop instead: request `i` is due at
//! `start + i / RATE`, whatever became of the ones before it, and goes out on the first of the
//! CONNECTIONS connections that is free; its latency counts from when it was due, not from
//! when it was sent, so a stall of the server is counted for every request that should have
//! gone out during it (no coordinated omission, as wrk2 measures). `late_max_us` is the most a
//! request waited between being due and being sent (for a free connection, or for this client
//! itself: a figure near the max says the client or its core was the bottleneck).

use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const FIXTURE_UID: &str = "705ab4f5-6393-11e8-b7cc-42010a800002";

/// How each request's body is made from the fixture.
enum Bodies {
    Fixed(Bytes),
    /// `prefix + fresh uid + suffix`
    FreshUid {
        prefix: String,
        suffix: String,
    },
}

impl Bodies {
    fn new(fixture: &str, mode: &str) -> anyhow::Result<Bodies> {
        match mode {
            "as-is" => Ok(Bodies::Fixed(Bytes::from(fixture.to_string()))),
            "dry-run" => {
                let body = fixture.replacen("\"dryRun\": false", "\"dryRun\": true", 1);
                if body == fixture {
                    bail!("the fixture has no \"dryRun\": false to turn on");
                }
                Ok(Bodies::Fixed(Bytes::from(body)))
            }
            "durable" => {
                let key = "\"ip-webhook.io/allocatable-ips\": \"";
                let start = fixture
                    .find(key)
                    .context("the fixture has no allocatable-ips")?
                    + key.len();
                let end = start + fixture[start..].find('"').context("unterminated list")?;
                let body = format!("{}10.64.0.0/10{}", &fixture[..start], &fixture[end..]);
                let at = body
                    .find(FIXTURE_UID)
                    .context("the fixture lacks its request uid")?;
                Ok(Bodies::FreshUid {
                    prefix: body[..at].to_string(),
                    suffix: body[at + FIXTURE_UID.len()..].to_string(),
                })
            }
            other => bail!("unknown mode {other:?}: as-is, dry-run or durable"),
        }
    }

    /// A fresh request's body: its UID shaped as an API server's (a UUID), from a hash of
    /// `run_id`, the connection and the sequence.
    fn body(&self, run_id: &str, connection: usize, sequence: u64) -> Bytes {
        match self {
            Bodies::Fixed(body) => body.clone(),
            Bodies::FreshUid { prefix, suffix } => {
                let run = foldhash::fast::FixedState::with_seed(0).hash_one(run_id);
                let (run_high, run_mid, run_low) = (run >> 32, (run >> 16) & 0xffff, run & 0xffff);
                Bytes::from(format!(
                    "{prefix}{run_high:08x}-{run_mid:04x}-{run_low:04x}-{connection:04x}-{sequence:012x}{suffix}"
                ))
            }
        }
    }
}

struct Target {
    addr: std::net::SocketAddr,
    path: String,
    tls: TlsConnector,
    bodies: Bodies,
    run_id: String,
}

/// One connection's closed loop until `until`: the latency of every answered request, in µs,
/// how many answers were not 200, and when the slowest was sent.
async fn drive(
    target: Arc<Target>,
    connection: usize,
    until: Instant,
) -> anyhow::Result<(Vec<u32>, u64, Option<std::time::SystemTime>)> {
    let tcp = TcpStream::connect(target.addr).await?;
    tcp.set_nodelay(true)?;
    let tls = target
        .tls
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let (mut sender, connection_task) =
        hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(connection_task);
    let mut latencies = Vec::with_capacity(1 << 16);
    let mut non_200 = 0;
    let mut sequence = 0u64;
    let mut slowest = (0, None);
    while Instant::now() < until {
        sequence += 1;
        let request = Request::builder()
            .method(Method::POST)
            .uri(target.path.as_str())
            .header(header::HOST, "localhost")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(target.bodies.body(
                &target.run_id,
                connection,
                sequence,
            )))?;
        let (sent, sent_at) = (Instant::now(), std::time::SystemTime::now());
        let response = sender.send_request(request).await?;
        let status = response.status();
        response.into_body().collect().await?;
        let micros = u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX);
        latencies.push(micros);
        if micros > slowest.0 {
            slowest = (micros, Some(sent_at));
        }
        if status != StatusCode::OK {
            non_200 += 1;
        }
    }
    Ok((latencies, non_200, slowest.1))
}

/// Latency (µs) of each answered request, counted from when it was due; the answers that were
/// not 200; the most a request waited between due and sent (µs); when the slowest was due.
struct OpenLoop {
    latencies: Vec<u32>,
    non_200: u64,
    late_max: u32,
    slowest_due: Option<std::time::SystemTime>,
}

/// One connection of the open loop: takes the next due request, sends it, records it.
async fn open_drive(
    target: Arc<Target>,
    connection: usize,
    due: Arc<tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<(u64, Instant)>>>,
    clock: (Instant, std::time::SystemTime),
) -> anyhow::Result<OpenLoop> {
    let tcp = TcpStream::connect(target.addr).await?;
    tcp.set_nodelay(true)?;
    let tls = target
        .tls
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let (mut sender, connection_task) =
        hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(connection_task);
    let mut out = OpenLoop {
        latencies: Vec::with_capacity(1 << 16),
        non_200: 0,
        late_max: 0,
        slowest_due: None,
    };
    let mut slowest = 0;
    loop {
        let next = due.lock().await.recv().await;
        let Some((sequence, due_at)) = next else {
            break;
        };
        let request = Request::builder()
            .method(Method::POST)
            .uri(target.path.as_str())
            .header(header::HOST, "localhost")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(target.bodies.body(
                &target.run_id,
                connection,
                sequence,
            )))?;
        let late = due_at.elapsed().as_micros();
        out.late_max = out.late_max.max(u32::try_from(late).unwrap_or(u32::MAX));
        let response = sender.send_request(request).await?;
        let status = response.status();
        response.into_body().collect().await?;
        let micros = u32::try_from(due_at.elapsed().as_micros()).unwrap_or(u32::MAX);
        out.latencies.push(micros);
        if micros > slowest {
            slowest = micros;
            out.slowest_due = Some(clock.1 + due_at.duration_since(clock.0));
        }
        if status != StatusCode::OK {
            out.non_200 += 1;
        }
    }
    Ok(out)
}

/// Hand out request `i` when it is due, `start + i / rate`, until `until`: a thread of its own
/// that sleeps to each due time (the runtime's timer has a 1 ms grain).
fn schedule(
    start: Instant,
    until: Instant,
    rate: f64,
    due: tokio::sync::mpsc::UnboundedSender<(u64, Instant)>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for i in 0u64.. {
            let at = start + Duration::from_secs_f64(i as f64 / rate);
            if at >= until {
                break;
            }
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            if due.send((i, at)).is_err() {
                break;
            }
        }
    })
}

fn percentile(sorted: &[u32], q: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, fixture, mode, connections, seconds, ca, rest @ ..] = args.as_slice() else {
        bail!("usage: bench_client URL FIXTURE MODE CONNECTIONS SECONDS CA_PEM [RUN_ID [RATE]]");
    };
    let rate: Option<f64> = rest.get(1).map(|r| r.parse().context("RATE")).transpose()?;
    if rate.is_some_and(|r| r.is_nan() || r <= 0.0) {
        bail!("RATE must be more than 0 requests per second");
    }
    let uri: http::Uri = url.parse().context("URL")?;
    let authority = uri.authority().context("URL has no host:port")?;
    let addr = authority.as_str().parse().context("URL's host:port")?;
    let connections: usize = connections.parse().context("CONNECTIONS")?;
    let seconds: f64 = seconds.parse().context("SECONDS")?;
    let fixture = std::fs::read_to_string(fixture).context("FIXTURE")?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).context("CA_PEM")? {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(ip_webhook::server::tls::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let target = Arc::new(Target {
        addr,
        path: uri.path().to_string(),
        tls: TlsConnector::from(Arc::new(config)),
        bodies: Bodies::new(&fixture, mode)?,
        run_id: rest.first().cloned().unwrap_or_else(|| "0".into()),
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let clock = (Instant::now(), std::time::SystemTime::now());
    let (mut latencies, non_200, late_max, slowest_due) = match rate {
        None => runtime.block_on(async {
            let loops: Vec<_> = (0..connections)
                .map(|c| tokio::spawn(drive(target.clone(), c, until)))
                .collect();
            let (mut all, mut non_200) = (Vec::new(), 0);
            let mut slowest: Option<(u32, std::time::SystemTime)> = None;
            for one in loops {
                let (latencies, bad, at) = one.await??;
                if let (Some(&max), Some(at)) = (latencies.iter().max(), at)
                    && slowest.is_none_or(|(m, _)| max > m)
                {
                    slowest = Some((max, at));
                }
                all.extend(latencies);
                non_200 += bad;
            }
            anyhow::Ok((all, non_200, 0, slowest.map(|(_, at)| at)))
        })?,
        Some(rate) => runtime.block_on(async {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let rx = Arc::new(tokio::sync::Mutex::new(rx));
            let loops: Vec<_> = (0..connections)
                .map(|c| tokio::spawn(open_drive(target.clone(), c, rx.clone(), clock)))
                .collect();
            // the connections' handshakes are done before the first request is due
            tokio::time::sleep(Duration::from_millis(200)).await;
            let scheduler = schedule(Instant::now(), until, rate, tx);
            let (mut all, mut non_200, mut late_max) = (Vec::new(), 0, 0);
            let mut slowest: Option<(u32, std::time::SystemTime)> = None;
            for one in loops {
                let done = one.await??;
                if let (Some(&max), Some(at)) = (done.latencies.iter().max(), done.slowest_due)
                    && slowest.is_none_or(|(m, _)| max > m)
                {
                    slowest = Some((max, at));
                }
                all.extend(done.latencies);
                non_200 += done.non_200;
                late_max = late_max.max(done.late_max);
            }
            scheduler.join().expect("the scheduler thread");
            anyhow::Ok((all, non_200, late_max, slowest.map(|(_, at)| at)))
        })?,
    };
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let over_20ms = latencies.iter().filter(|&&l| l > 20_000).count();
    let max_at = slowest_due
        .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis());
    println!(
        "requests={} rps={:.0} p50_us={} p90_us={} p99_us={} p999_us={} max_us={} over_20ms={over_20ms} max_at_unix_ms={max_at} late_max_us={late_max} non_200={}",
        latencies.len(),
        latencies.len() as f64 / elapsed,
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.90),
        percentile(&latencies, 0.99),
        percentile(&latencies, 0.999),
        latencies.last().copied().unwrap_or(0),
        non_200,
    );
    Ok(())
}
