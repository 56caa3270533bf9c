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
//!             [--hold BYTES] [--remember BYTES [--remember-hashed]]
//! ```
//!
//! `--ca-out` writes the CA certificate's PEM, for `bench_client`. `--parse` makes each answer
//! also parse the body into a `serde_json::Value` (and drop it): about twice the CPU of
//! ip-webhook's whole decision. With and without `--journal`, it shows whether a durable answer
//! costs more when the requests themselves cost more. `--hold BYTES` makes each request
//! write that many bytes of fresh heap before its commit's wait and read them after it, as a
//! decision's parsed review and state are kept across the wait: whether what a request keeps
//! alive while it waits costs more than its size. `--remember BYTES` makes each request keep,
//! for the life of the process, what an allocator must to answer a retry: its `request.uid`
//! looked up (a miss for a fresh one) and filed in a B-tree by its 64-bit hash, and a record of
//! about BYTES bytes filed by a sequential IP (the UID and a token as strings, and padding up to
//! BYTES; under 160, only the UID's hash and the IP, in one 64-byte allocation). 460 is what one
//! ip-webhook claim takes in all. Under `--remember-hashed` the UIDs are filed in a hash map
//! instead of the B-tree. With no rules and no line, it is the least that remembering who got
//! what costs, for records of that size.

use std::collections::{BTreeMap, HashMap, btree_map, hash_map};
use std::convert::Infallible;
use std::fs::File;
use std::hash::BuildHasher;
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

/// What each request does besides reading its body and answering.
#[derive(Clone, Default)]
struct Work {
    parse: bool,
    /// Bytes of fresh heap written before the commit's wait and read after it.
    hold: usize,
    remember: Option<Arc<Mutex<Remembered>>>,
}

/// `--remember`'s claims: by the hash of their request UID, and by IP.
struct Remembered {
    by_request: ByRequest,
    by_ip: BTreeMap<u32, Arc<Record>>,
    /// The bytes each record takes in all, about.
    record_bytes: usize,
}

enum ByRequest {
    Tree(BTreeMap<u64, u32>),
    Hashed(HashMap<u64, u32, foldhash::fast::RandomState>),
}

/// One remembered request: its UID, a token and the rest of a claim's size (or, lean, its key
/// and IP alone).
#[allow(dead_code, reason = "kept, never read: only its memory is the point")]
enum Record {
    Lean {
        key: u64,
        ip: u32,
    },
    Full {
        request_uid: Box<str>,
        token: Box<str>,
        rest: Box<[u8]>,
    },
}

/// What a full record takes before its padding: the `Arc`'s counts and the enum, the UID's and
/// the token's heap copies.
const FULL_RECORD_BYTES: usize = 16 + 48 + 36 + 32;

impl Remembered {
    fn new(record_bytes: usize, hashed: bool) -> Remembered {
        Remembered {
            by_request: match hashed {
                true => ByRequest::Hashed(HashMap::default()),
                false => ByRequest::Tree(BTreeMap::new()),
            },
            by_ip: BTreeMap::new(),
            record_bytes,
        }
    }

    /// File the request whose review is `body`, unless its UID is filed already (a retry).
    fn file(&mut self, body: &[u8]) {
        let uid = request_uid(body).unwrap_or_default();
        let key = foldhash::fast::FixedState::with_seed(7).hash_one(uid);
        let ip = self.by_ip.len() as u32;
        let fresh = match &mut self.by_request {
            ByRequest::Tree(map) => match map.entry(key) {
                btree_map::Entry::Vacant(entry) => {
                    entry.insert(ip);
                    true
                }
                btree_map::Entry::Occupied(_) => false,
            },
            ByRequest::Hashed(map) => match map.entry(key) {
                hash_map::Entry::Vacant(entry) => {
                    entry.insert(ip);
                    true
                }
                hash_map::Entry::Occupied(_) => false,
            },
        };
        if !fresh {
            return;
        }
        let record = match self.record_bytes {
            0..160 => Record::Lean { key, ip },
            bytes => Record::Full {
                request_uid: String::from_utf8_lossy(uid).into(),
                token: format!("{key:016x}{ip:016x}").into(),
                rest: vec![0x5a; bytes - FULL_RECORD_BYTES].into(),
            },
        };
        self.by_ip.insert(ip, Arc::new(record));
    }
}

/// The string value of the first `"uid"` key in `body`: the review's request UID.
fn request_uid(body: &[u8]) -> Option<&[u8]> {
    let after_key = memchr::memmem::find(body, b"\"uid\"")? + 5;
    let open = after_key + memchr::memchr(b'"', &body[after_key..])? + 1;
    let len = memchr::memchr(b'"', &body[open..])?;
    Some(&body[open..open + len])
}

async fn answer(
    request: Request<Incoming>,
    journal: Option<Arc<GroupCommit>>,
    work: Work,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let read = Limited::new(request.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
        .map(|body| body.to_bytes());
    if work.parse
        && let Ok(body) = &read
    {
        std::hint::black_box(serde_json::from_slice::<serde_json::Value>(body).ok());
    }
    if let (Some(remember), Ok(body)) = (&work.remember, &read) {
        remember.lock().expect("remembered claims").file(body);
    }
    if read.is_ok()
        && let Some(journal) = journal
    {
        if work.hold == 0 {
            journal.append().await;
        } else {
            let held = std::hint::black_box(vec![0x5a_u8; work.hold]);
            journal.append().await;
            // one read a cache line
            std::hint::black_box(
                held.iter()
                    .step_by(64)
                    .fold(0u8, |sum, b| sum.wrapping_add(*b)),
            );
        }
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
    let mut work = Work::default();
    let (mut remember, mut hashed) = (None, false);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--ca-out" => ca_out = Some(args.next().context("--ca-out needs a file")?),
            "--journal" | "--journal-inline" => {
                let dir = args.next().context("--journal needs a directory")?;
                let inline = arg == "--journal-inline";
                journal = Some(GroupCommit::start(Path::new(&dir), inline)?);
            }
            "--parse" => work.parse = true,
            "--hold" => {
                let bytes = args.next().context("--hold needs a byte count")?;
                work.hold = bytes.parse().with_context(|| format!("--hold {bytes:?}"))?;
            }
            "--remember" => {
                let bytes = args.next().context("--remember needs a byte count")?;
                let bytes = bytes
                    .parse()
                    .with_context(|| format!("--remember {bytes:?}"))?;
                remember = Some(bytes);
            }
            "--remember-hashed" => hashed = true,
            addr => listen = addr.parse().with_context(|| format!("address {addr:?}"))?,
        }
    }
    work.remember = remember.map(|bytes| Arc::new(Mutex::new(Remembered::new(bytes, hashed))));
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
        let (journal, work) = (journal.clone(), work.clone());
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let service = service_fn(move |request| answer(request, journal.clone(), work.clone()));
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
