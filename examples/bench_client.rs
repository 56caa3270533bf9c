#![forbid(unsafe_code)]
//! The load benchmark's second client: closed-loop HTTPS/1.1 keep-alive load on one thread,
//! like `wrk -t1`, that keeps every request's latency (not a histogram) and prints its
//! percentiles. `scripts/bench-load.sh` runs it after wrk in each ip-webhook cell: wrk corrects
//! its latencies for coordinated omission, and for durable `/mutate` at 16 connections its p99
//! was 20–30× what a packet capture of the same run showed between request and answer on the
//! wire (docs/performance.md, "B-trees instead of hash maps: where the durable tail was").
//!
//! ```text
//! bench_client URL FIXTURE MODE CONNECTIONS SECONDS CA_PEM [RUN_ID]
//! ```
//!
//! MODE is `as-is` (the fixture unchanged), `dry-run` (`request.dryRun` true) or `durable` (a
//! fresh `request.uid` per request and a /10 allocatable list, as `scripts/bench-load.lua`
//! does). Prints one line: `requests=N rps=R p50_us=… p90_us=… p99_us=… p999_us=… max_us=…
//! non_200=N`.

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

    fn body(&self, run_id: &str, connection: usize, sequence: u64) -> Bytes {
        match self {
            Bodies::Fixed(body) => body.clone(),
            Bodies::FreshUid { prefix, suffix } => Bytes::from(format!(
                "{prefix}bench-{run_id}-{connection:03}-{sequence:010}{suffix}"
            )),
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
/// and how many answers were not 200.
async fn drive(
    target: Arc<Target>,
    connection: usize,
    until: Instant,
) -> anyhow::Result<(Vec<u32>, u64)> {
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
        let sent = Instant::now();
        let response = sender.send_request(request).await?;
        let status = response.status();
        response.into_body().collect().await?;
        let micros = sent.elapsed().as_micros();
        latencies.push(u32::try_from(micros).unwrap_or(u32::MAX));
        if status != StatusCode::OK {
            non_200 += 1;
        }
    }
    Ok((latencies, non_200))
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
        bail!("usage: bench_client URL FIXTURE MODE CONNECTIONS SECONDS CA_PEM [RUN_ID]");
    };
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
    let (mut latencies, non_200) = runtime.block_on(async {
        let loops: Vec<_> = (0..connections)
            .map(|c| tokio::spawn(drive(target.clone(), c, until)))
            .collect();
        let mut all = Vec::new();
        let mut non_200 = 0;
        for one in loops {
            let (latencies, bad) = one.await??;
            all.extend(latencies);
            non_200 += bad;
        }
        anyhow::Ok((all, non_200))
    })?;
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    println!(
        "requests={} rps={:.0} p50_us={} p90_us={} p99_us={} p999_us={} max_us={} non_200={}",
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
