#![forbid(unsafe_code)]
//! The load benchmark's floor: an HTTPS server on ip-webhook's TLS stack (hyper + hyper-util
//! auto builder + tokio-rustls with ring, same `ServerConfig`) that reads each request body and
//! answers one canned AdmissionReview without parsing anything. Whatever ip-webhook spends above
//! this is the cost of deciding.
//!
//! With `--journal DIR` it is also the floor of a durable answer: every request adds one
//! 116-byte record (the size of one claim in ip-webhook's journal) to `DIR/floor-journal`
//! through a writer thread that takes every record waiting, writes them with one `write` and
//! one `fdatasync`, and only then lets their answers go (group commit). As ip-webhook's journal
//! does, the records go into zeros written and synced ahead of them (up to the next MiB once
//! less than 256 KiB is left, after a batch has its answers), so a commit does not grow the
//! file, and the writer runs as `SCHED_BATCH`. There is no ledger, no
//! claim and no decision: what this costs above the plain floor is what durability itself
//! costs on this disk and core, whatever the store. `--journal-inline` makes the same commits
//! with no writer thread: the request that seals a batch writes and syncs it on the runtime's
//! own thread (blocking that thread for the sync), to weigh the hand-over against it.
//!
//! ```text
//! bench_floor [ADDR] [--ca-out FILE] [--journal DIR | --journal-inline DIR] [--parse]
//! ```
//!
//! `--ca-out` writes the CA certificate's PEM, for `bench_client`. `--parse` makes each answer
//! also parse the body into a `serde_json::Value` (and drop it): about twice the CPU of
//! ip-webhook's whole decision. With and without `--journal`, it shows whether a durable answer
//! costs more when the requests themselves cost more.

use std::convert::Infallible;
use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};

use anyhow::Context;
use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use ip_webhook::server::MAX_BODY_BYTES;
use ip_webhook::server::certs::self_signed;
use ip_webhook::server::tls::{CertResolver, server_config};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_rustls::TlsAcceptor;

/// The answer ip-webhook gives the fixture review (a three-op allocation patch), precomputed.
const CANNED: &[u8] = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002","allowed":true,"patchType":"JSONPatch","patch":"W3sib3AiOiJhZGQiLCJwYXRoIjoiL21ldGFkYXRhL2Fubm90YXRpb25zL2NuaS5wcm9qZWN0Y2FsaWNvLm9yZ34xaXBBZGRycyIsInZhbHVlIjoiW1wiMTAuMC4wLjEwXCJdIn0seyJvcCI6ImFkZCIsInBhdGgiOiIvbWV0YWRhdGEvYW5ub3RhdGlvbnMvaXAtd2ViaG9vay5pb34xc3RhdHVzIiwidmFsdWUiOiJtdXRhdGVkIn0seyJvcCI6ImFkZCIsInBhdGgiOiIvbWV0YWRhdGEvbGFiZWxzL2lwLXdlYmhvb2suaW9+MWFsbG9jYXRlZC1pcCIsInZhbHVlIjoiMTAuMC4wLjEwIn1d"}}"#;

/// Bytes one request adds in `--journal` mode: one binary claim record's size.
const RECORD_BYTES: usize = 116;
/// The journal grows by synced zeros as ip-webhook's does: to the next step of this many
/// bytes once less than a quarter of one is left, after a batch has its answers.
const ROOM_BYTES: u64 = 1 << 20;
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Write zeros from `from` up to `to` in pieces, then sync them.
fn zero_fill(file: &File, from: u64, to: u64) -> std::io::Result<()> {
    let mut at = from;
    while at < to {
        let piece = (to - at).min(ZEROS.len() as u64);
        file.write_all_at(&ZEROS[..piece as usize], at)?;
        at += piece;
    }
    file.sync_data()
}

/// Records waiting for their commit, each with the answer it releases. A batch forms as
/// ip-webhook's ledger forms one: the request that opens it yields to the runtime once, so
/// that every request the runtime had ready joins, and then seals it: for the writer thread,
/// or (`--journal-inline`) to write and sync it itself, on the runtime's thread.
struct GroupCommit {
    inbox: Mutex<Inbox>,
    ready: Condvar,
    /// `Some` with `--journal-inline`: the journal the sealing request commits to itself
    inline: Option<Mutex<Journal>>,
}

#[derive(Default)]
struct Inbox {
    waiting: Vec<oneshot::Sender<()>>,
    sealed: bool,
}

/// The journal file: records go into zeros written and synced ahead of them.
struct Journal {
    file: File,
    end: u64,
    allocated: u64,
    bytes: Vec<u8>,
}

impl Journal {
    fn create(dir: &Path) -> anyhow::Result<Journal> {
        std::fs::create_dir_all(dir)?;
        Ok(Journal {
            file: File::create(dir.join("floor-journal"))?,
            end: 0,
            allocated: 0,
            bytes: Vec::new(),
        })
    }

    /// Write `records` records and sync them: one `write`, one `fdatasync`.
    fn commit(&mut self, records: usize) {
        self.bytes.clear();
        self.bytes.resize(records * RECORD_BYTES, b'r');
        let len = self.bytes.len() as u64;
        if self.end + len > self.allocated {
            let grown = (self.end + len).next_multiple_of(ROOM_BYTES);
            zero_fill(&self.file, self.allocated, grown).expect("floor journal room");
            self.allocated = grown;
        }
        self.file
            .write_all_at(&self.bytes, self.end)
            .and_then(|()| self.file.sync_data())
            .expect("floor journal write");
        self.end += len;
    }

    /// After a batch has its answers: room for the next ones, if little is left.
    fn keep_room(&mut self) {
        if self.allocated - self.end < ROOM_BYTES / 4 {
            let grown = (self.end + ROOM_BYTES / 4).next_multiple_of(ROOM_BYTES);
            zero_fill(&self.file, self.allocated, grown).expect("floor journal room");
            self.allocated = grown;
        }
    }
}

impl GroupCommit {
    fn start(dir: &Path, inline: bool) -> anyhow::Result<Arc<GroupCommit>> {
        let mut journal = Journal::create(dir)?;
        if inline {
            return Ok(Arc::new(GroupCommit {
                inbox: Mutex::default(),
                ready: Condvar::new(),
                inline: Some(Mutex::new(journal)),
            }));
        }
        let commits = Arc::new(GroupCommit {
            inbox: Mutex::default(),
            ready: Condvar::new(),
            inline: None,
        });
        let writer = commits.clone();
        std::thread::Builder::new()
            .name("floor-writer".into())
            .spawn(move || {
                // as ip-webhook's ledger writer runs
                ip_webhook_ledger::embedded::writer_batch_policy().expect("SCHED_BATCH");
                let mut batch = Vec::new();
                loop {
                    {
                        let mut inbox = writer.inbox.lock().expect("floor inbox");
                        while !inbox.sealed {
                            inbox = writer.ready.wait(inbox).expect("floor inbox");
                        }
                        inbox.sealed = false;
                        std::mem::swap(&mut inbox.waiting, &mut batch);
                    }
                    journal.commit(batch.len());
                    for done in batch.drain(..) {
                        let _ = done.send(());
                    }
                    journal.keep_room();
                }
            })?;
        Ok(commits)
    }

    /// Returns once a commit holding this request's record has been synced.
    async fn append(&self) {
        let (done, synced) = oneshot::channel();
        let opened = {
            let mut inbox = self.inbox.lock().expect("floor inbox");
            inbox.waiting.push(done);
            inbox.waiting.len() == 1
        };
        if opened {
            let _seal = Seal(self);
            tokio::task::yield_now().await;
        }
        let _ = synced.await;
    }
}

/// Seals the batch its request opened, also when that request is dropped during its yield
/// (wrk closes connections with requests in flight): else the batch would wait forever.
struct Seal<'a>(&'a GroupCommit);

impl Drop for Seal<'_> {
    fn drop(&mut self) {
        let Some(journal) = &self.0.inline else {
            self.0.inbox.lock().expect("floor inbox").sealed = true;
            self.0.ready.notify_one();
            return;
        };
        // the journal's lock first: the next batch forms in the inbox while this one syncs
        let mut journal = journal.lock().expect("floor journal");
        let batch = std::mem::take(&mut self.0.inbox.lock().expect("floor inbox").waiting);
        journal.commit(batch.len());
        for done in batch {
            let _ = done.send(());
        }
        journal.keep_room();
    }
}

async fn answer(
    request: Request<Incoming>,
    journal: Option<Arc<GroupCommit>>,
    parse: bool,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let read = Limited::new(request.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
        .map(|body| body.to_bytes());
    if parse && let Ok(body) = &read {
        std::hint::black_box(serde_json::from_slice::<serde_json::Value>(body).ok());
    }
    if read.is_ok()
        && let Some(journal) = journal
    {
        journal.append().await;
    }
    let response = match read {
        Ok(_) => Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from_static(CANNED))),
        Err(_) => Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .body(Full::new(Bytes::new())),
    };
    Ok(response.expect("static response parts"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut listen: SocketAddr = "127.0.0.1:9443".parse()?;
    let mut ca_out = None;
    let mut journal = None;
    let mut parse = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--ca-out" => ca_out = Some(args.next().context("--ca-out needs a file")?),
            "--journal" | "--journal-inline" => {
                let dir = args.next().context("--journal needs a directory")?;
                let inline = arg == "--journal-inline";
                journal = Some(GroupCommit::start(Path::new(&dir), inline)?);
            }
            "--parse" => parse = true,
            addr => listen = addr.parse().with_context(|| format!("address {addr:?}"))?,
        }
    }
    let certs = self_signed(&[])?;
    if let Some(path) = ca_out {
        std::fs::write(&path, &certs.ca_pem).with_context(|| format!("writing {path}"))?;
    }
    let acceptor = TlsAcceptor::from(Arc::new(server_config(Arc::new(CertResolver::new(
        certs.certified_key()?,
    )))));
    let listener = TcpListener::bind(listen).await?;
    println!("bench_floor serving https://{}", listener.local_addr()?);
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let journal = journal.clone();
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let service = service_fn(move |request| answer(request, journal.clone(), parse));
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
