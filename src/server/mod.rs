//! The HTTPS admission server and the plain-HTTP admin server.
//!
//! HTTPS: `POST /mutate`, `POST /validate`, HTTP/1.1 and HTTP/2. Every failure is answered with
//! a status and a message: 404/405 for a wrong route, 415 for a body that is not JSON, 413 over
//! 7 MiB, 408 for a body that does not arrive in time, 400 for JSON that is not an
//! AdmissionReview, 500 (counted) if a handler panics. Slow clients are cut off: the TLS
//! handshake, the request head and the body each have a deadline.
//!
//! Load is bounded before it is buffered: at most `max_connections` connections, of which at
//! most `max_handshakes` still in the TLS handshake (a handshaking connection never keeps a
//! slot from a newcomer, see `slots`; with every slot past its handshake, a newcomer is
//! closed at accept), at most `max_inflight_bytes` of request bodies held at once (a request
//! past it gets a 503 before its body is read: a declared `Content-Length` is reserved whole
//! up front). A connection that has done its TLS handshake must send a request head (or the
//! HTTP/2 preface and SETTINGS) within the read timeout, and one with no request open for
//! `idle` is closed; HTTP/2 peers are pinged. Over HTTP/2 an early answer (404, 405, 413,
//! 415, 503) is sent whole while the rest of the body is read and dropped, so the client gets
//! the answer rather than a stream reset.
//!
//! Admin: `GET /healthz`, `GET /readyz` (200 once the caller marks `ready` and while the
//! ledger answers: 503 after repeated ledger failures, see `ip_webhook_ledger::health`), `GET /metrics`.

mod admin;
use admin::serve_admin;
mod bind;
pub(crate) use bind::{Listeners, bind};
mod answers;
use answers::{busy, check_head, endpoint_of, json_response, panicked, status, unread_body};
mod body;
pub mod certs;
mod slots;
mod watched;
use body::{Held, discard, read_body};
use slots::{FIRST_BYTE_WAIT, HandshakeSlot, Noticing, Slots, admit};
pub mod logging;
pub mod tls;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, SemaphorePermit, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::decisions::Webhook;
use crate::metrics::{Metrics, Outcome, ReasonLabels};

/// controller-runtime's limit: the API server never sends more.
pub const MAX_BODY_BYTES: usize = 7 * 1024 * 1024;

/// Deadlines that keep a slow or stuck client from holding a connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub(crate) handshake: Duration,
    pub header_read: Duration,
    pub body_read: Duration,
    /// How long shutdown waits for in-flight admissions.
    pub(crate) drain: Duration,
    /// A connection with no request open this long is closed (`--idle-timeout`).
    pub(crate) idle: Duration,
    /// Connections served at once (`--max-connections`); more are closed at accept.
    pub max_connections: usize,
    /// Of those, connections still in their TLS handshake (`--max-handshakes`); past it the
    /// oldest is closed (`slots`).
    pub max_handshakes: usize,
    /// Request body bytes held at once (`--max-inflight-bytes`); past it, 503.
    pub(crate) max_inflight_bytes: usize,
}

/// The default of `--max-inflight-bytes`: 64 MiB.
pub(crate) const DEFAULT_MAX_INFLIGHT_BYTES: usize = 64 * 1024 * 1024;
/// The default of `--max-connections`.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// The default of `--handshake-timeout`: a TLS handshake takes milliseconds.
pub(crate) const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);

/// The default of `--max-handshakes`: a quarter of the connections (at least one).
pub(crate) fn default_max_handshakes(max_connections: usize) -> usize {
    max_connections.div_ceil(4).max(1)
}
/// The HTTP/2 preface (24 bytes) and the header of the SETTINGS frame that must follow it.
const H2_PREFACE_AND_SETTINGS: u64 = 24 + 9;
/// hyper's HTTP/1 read buffer per connection (its default is about 400 KB).
const H1_MAX_BUF: usize = 64 * 1024;
/// HTTP/2 flow-control windows: what a peer may send before we read it, per stream and per
/// connection (hyper's default is 1 MB each).
const H2_STREAM_WINDOW: u32 = 256 * 1024;
const H2_CONNECTION_WINDOW: u32 = 512 * 1024;
const H2_MAX_HEADER_LIST: u32 = 64 * 1024;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshake: DEFAULT_HANDSHAKE_TIMEOUT,
            header_read: Duration::from_secs(10),
            body_read: Duration::from_secs(10),
            drain: Duration::from_secs(25),
            idle: Duration::from_secs(90),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_handshakes: default_max_handshakes(DEFAULT_MAX_CONNECTIONS),
            max_inflight_bytes: DEFAULT_MAX_INFLIGHT_BYTES,
        }
    }
}

/// A running pair of servers.
pub struct Running {
    pub https_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    https: tokio::task::JoinHandle<()>,
    admin: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stop accepting, let in-flight admissions finish (up to `Limits::drain`), then return.
    pub(crate) async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.https.await;
        self.admin.abort();
    }

    /// Resolves when the HTTPS server stops on its own (it should not).
    pub(crate) fn stopped(&mut self) -> &mut tokio::task::JoinHandle<()> {
        &mut self.https
    }
}

/// Serve both listeners (see [`bind`]) until [`Running::shutdown`].
pub(crate) fn start(
    webhook: Arc<Webhook>,
    tls: Arc<rustls::ServerConfig>,
    listeners: Listeners,
    limits: Limits,
    ready: Arc<AtomicBool>,
) -> std::io::Result<Running> {
    let (https_addr, admin_addr) = listeners.addrs()?;
    let Listeners {
        https: https_listener,
        admin: admin_listener,
    } = listeners;
    let (shutdown, signal) = watch::channel(false);
    let admin = tokio::spawn(serve_admin(
        admin_listener,
        webhook.metrics.clone(),
        ready.clone(),
    ));
    let https = tokio::spawn(serve_https(
        https_listener,
        TlsAcceptor::from(tls),
        webhook,
        limits,
        signal,
    ));
    Ok(Running {
        https_addr,
        admin_addr,
        shutdown,
        https,
        admin,
    })
}

async fn serve_https(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    webhook: Arc<Webhook>,
    limits: Limits,
    mut signal: watch::Receiver<bool>,
) {
    let max_connections = limits.max_connections.clamp(1, u32::MAX as usize);
    let slots = Slots::new(max_connections, limits.max_handshakes);
    let budget = Arc::new(Semaphore::new(
        limits.max_inflight_bytes.min(Semaphore::MAX_PERMITS),
    ));
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = signal.changed() => break,
        };
        let acceptor = acceptor.clone();
        let webhook = webhook.clone();
        let budget = budget.clone();
        let signal = signal.clone();
        if !slots::has_sent(&tcp) {
            // A client's ClientHello follows its connect within a round trip, but often not
            // before the accept: wait for it briefly, off the accept loop, so that a client
            // that has spoken is never weighed as a silent one (which a flood of silent
            // connections would push out before its handshake is read).
            let slots = slots.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(FIRST_BYTE_WAIT, tcp.readable()).await;
                if let Some((tcp, slot, _)) = admit(&slots, tcp, &webhook) {
                    serve_connection(tcp, peer, slot, acceptor, webhook, limits, budget, signal)
                        .await;
                }
            });
            continue;
        }
        let Some((tcp, slot, crowded)) = admit(&slots, tcp, &webhook) else {
            continue;
        };
        tokio::spawn(serve_connection(
            tcp, peer, slot, acceptor, webhook, limits, budget, signal,
        ));
        if crowded {
            // let the new connection read its ClientHello before more arrivals are weighed
            // against it (under a flood, accept is always ready and would run on); without
            // pressure, accepting on lets a burst's requests reach the ledger together
            tokio::task::yield_now().await;
        }
    }
    drop(listener);
    // every connection holds a permit until it ends; all of them back means all are done
    let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(limits.drain, slots.total.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!("some connections were still busy when the drain period ended");
    }
}

/// What a connection has done, for its deadlines.
struct Activity {
    opened: Instant,
    bytes_read: AtomicU64,
    requests: AtomicU64,
    open_requests: AtomicUsize,
    /// Milliseconds after `opened` when the last open request ended.
    idle_since_ms: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            opened: Instant::now(),
            bytes_read: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            open_requests: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
        }
    }

    fn begin(self: &Arc<Self>) -> RequestOpen {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.open_requests.fetch_add(1, Ordering::SeqCst);
        RequestOpen(self.clone())
    }

    /// Why the connection should be closed now, if it should.
    fn expired(&self, now: Instant, limits: &Limits) -> Option<&'static str> {
        let age = now.saturating_duration_since(self.opened);
        if self.requests.load(Ordering::Relaxed) == 0
            && self.bytes_read.load(Ordering::Relaxed) < H2_PREFACE_AND_SETTINGS
            && age >= limits.header_read
        {
            return Some("no request head or HTTP/2 preface within the read timeout");
        }
        if self.open_requests.load(Ordering::SeqCst) == 0 {
            let idle_since = Duration::from_millis(self.idle_since_ms.load(Ordering::SeqCst));
            if age.saturating_sub(idle_since) >= limits.idle {
                return Some("idle");
            }
        }
        None
    }
}

/// An open request; the connection counts as idle again when the last one is dropped.
struct RequestOpen(Arc<Activity>);

impl Drop for RequestOpen {
    fn drop(&mut self) {
        let since = u64::try_from(self.0.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.idle_since_ms.store(since, Ordering::SeqCst);
        self.0.open_requests.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The TLS stream's reads count into its connection's bytes read.
impl watched::ReadWatch for Activity {
    fn read(&self, count: usize) {
        self.bytes_read.fetch_add(count as u64, Ordering::Relaxed);
    }
}

/// Why a TLS handshake failed, when the client certificate is the reason.
fn client_refusal(error: &std::io::Error) -> Option<&'static str> {
    match error.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::NoCertificatesPresented => Some("missing"),
        rustls::Error::InvalidCertificate(
            rustls::CertificateError::ApplicationVerificationFailure,
        ) => Some("name"),
        rustls::Error::InvalidCertificate(_) => Some("untrusted"),
        _ => None,
    }
}

#[allow(clippy::too_many_arguments)]
async fn serve_connection(
    tcp: Noticing<tokio::net::TcpStream>,
    peer: SocketAddr,
    mut slot: HandshakeSlot,
    acceptor: TlsAcceptor,
    webhook: Arc<Webhook>,
    limits: Limits,
    budget: Arc<Semaphore>,
    mut signal: watch::Receiver<bool>,
) {
    let shake = Handshake {
        peer,
        limits: &limits,
        webhook: &webhook,
    };
    let Some(stream) = shake.run(tcp, &mut slot, acceptor, &mut signal).await else {
        return;
    };
    // past the handshake (with a client CA: the API server's certificate shown), the
    // connection keeps its slot until it ends
    let Some(_permit) = slot.established() else {
        return;
    };
    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
    let activity = Arc::new(Activity::new());
    let io = watched::Watched {
        inner: stream,
        watch: activity.clone(),
    };
    let service = {
        let activity = activity.clone();
        service_fn(move |request| {
            let webhook = webhook.clone();
            let budget = budget.clone();
            let open = activity.begin();
            async move {
                let response = admission(&webhook, request, limits, &budget).await;
                drop(open);
                Ok::<_, Infallible>(response)
            }
        })
    };
    let builder = http_builder(h2, &limits);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let tick = (limits.header_read.min(limits.idle) / 4)
        .clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let closing = loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%peer, %error, "connection ended with an error");
                }
                return;
            }
            _ = signal.changed() => break "shutting down",
            _ = ticker.tick() => {
                if let Some(reason) = activity.expired(Instant::now(), &limits) {
                    break reason;
                }
            }
        }
    };
    tracing::debug!(%peer, reason = closing, "closing the connection");
    connection.as_mut().graceful_shutdown();
    // in-flight requests finish (shutdown bounds this by the drain period); a peer that
    // never answers an HTTP/2 GOAWAY is dropped
    let patience = if closing == "shutting down" {
        limits.drain
    } else {
        limits.header_read.min(Duration::from_secs(5))
    };
    let _ = tokio::time::timeout(patience, connection).await;
}

/// One connection's TLS handshake, within its time limit and its slot.
struct Handshake<'a> {
    peer: SocketAddr,
    limits: &'a Limits,
    webhook: &'a Webhook,
}

impl Handshake<'_> {
    /// The TLS stream; `None` when the handshake failed (a refused client certificate is
    /// counted), timed out, gave its slot up to make room, or the server shuts down.
    async fn run(
        &self,
        tcp: Noticing<tokio::net::TcpStream>,
        slot: &mut HandshakeSlot,
        acceptor: TlsAcceptor,
        signal: &mut watch::Receiver<bool>,
    ) -> Option<tokio_rustls::server::TlsStream<Noticing<tokio::net::TcpStream>>> {
        let peer = self.peer;
        let handshake = tokio::time::timeout(self.limits.handshake, acceptor.accept(tcp));
        let handshake = tokio::select! {
            done = handshake => done,
            () = slot.closed() => {
                tracing::debug!(%peer, "closing a connection still in its TLS handshake to make room");
                return None;
            }
            _ = signal.changed() => return None,
        };
        match handshake {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(error)) => {
                if let Some(reason) = client_refusal(&error) {
                    self.webhook
                        .metrics
                        .client_cert_refusals
                        .get_or_create(&ReasonLabels { reason })
                        .inc();
                }
                tracing::debug!(%peer, %error, "TLS handshake failed");
                None
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                None
            }
        }
    }
}

/// The HTTP/1.1 and HTTP/2 server settings of one connection (HTTP/2 only when ALPN chose
/// it): header and keep-alive timeouts from `limits`, buffer and window sizes.
fn http_builder(h2: bool, limits: &Limits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    if h2 {
        builder = builder.http2_only();
    }
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read)
        .max_buf_size(H1_MAX_BUF);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(limits.idle.min(Duration::from_secs(30))))
        .keep_alive_timeout(limits.header_read.min(Duration::from_secs(20)))
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_header_list_size(H2_MAX_HEADER_LIST);
    builder
}

/// Route and answer one HTTPS request.
async fn admission(
    webhook: &Webhook,
    request: Request<Incoming>,
    limits: Limits,
    budget: &Semaphore,
) -> Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let h2 = parts.version == http::Version::HTTP_2;
    // An answer given before the body is read: over HTTP/2 the rest of the body is read and
    // dropped in the background, so the stream ends cleanly and the answer arrives whole.
    let early = |response: Response<Full<Bytes>>, body: Incoming| {
        if h2 && !body.is_end_stream() {
            tokio::spawn(discard(body, limits.body_read));
        }
        response
    };
    let endpoint = match endpoint_of(parts.uri.path()) {
        Ok(endpoint) => endpoint,
        Err(response) => return early(*response, body),
    };
    let count = |outcome| {
        webhook.metrics.webhook(&endpoint).requests(outcome).inc();
    };
    let declared = match check_head(&parts) {
        Ok(declared) => declared,
        Err(response) => {
            count(Outcome::bad_request);
            return early(*response, body);
        }
    };
    // Nothing below reads the head: freed now, while it is in the cache, not after a durable
    // admission's commit wait, by when it is cold.
    drop(parts);
    let mut held = Held::default();
    if let Some(len) = declared
        && !held.take(budget, len)
    {
        count(Outcome::bad_request);
        return early(busy(webhook, limits), body);
    }
    let collected = tokio::time::timeout(
        limits.body_read,
        read_body(body, declared, !h2, budget, &mut held),
    )
    .await;
    let unread = |error| {
        count(Outcome::bad_request);
        match unread_body(error, webhook, limits) {
            (response, Some(rest)) => early(response, rest),
            (response, None) => response,
        }
    };
    let body = match collected {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(error)) => return unread(Some(error)),
        Err(_) => return unread(None),
    };
    let answer = recover(webhook.review(endpoint.clone(), &body)).await;
    drop(body);
    drop(held);
    match answer {
        Ok(Ok(json)) => json_response(StatusCode::OK, json),
        Ok(Err(error)) => status(StatusCode::BAD_REQUEST, &error.to_string()),
        Err(panic) => {
            count(Outcome::error);
            panicked(webhook, &panic.message)
        }
    }
}

/// A panic caught while deciding a request: its message (`panic` when it had none).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub(crate) struct Panic {
    pub(crate) message: String,
}

/// Run a future; a panic inside becomes `Err(Panic)` instead of tearing down the connection.
/// Not an `async fn`, for the reason [`ip_webhook_ledger::health::with_deadline`] gives.
pub(crate) fn recover<T>(
    future: impl Future<Output = T>,
) -> impl Future<Output = Result<T, Panic>> {
    AssertUnwindSafe(future).catch_unwind().map(|caught| {
        caught.map_err(|payload| Panic {
            message: payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".to_string()),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_becomes_an_error_value() {
        let caught = recover(async { panic!("boom at {}", 42) }).await;
        assert_eq!(
            caught,
            Err::<(), _>(Panic {
                message: "boom at 42".to_string()
            })
        );
        assert_eq!(recover(async { 7 }).await, Ok(7));
    }

    #[test]
    fn a_connection_expires_without_a_first_request_and_when_idle() {
        let limits = Limits {
            header_read: Duration::from_secs(10),
            idle: Duration::from_secs(90),
            ..Limits::default()
        };
        let activity = Arc::new(Activity::new());
        let at = |secs| activity.opened + Duration::from_secs(secs);
        assert_eq!(activity.expired(at(9), &limits), None);
        assert_eq!(
            activity.expired(at(10), &limits),
            Some("no request head or HTTP/2 preface within the read timeout")
        );
        // the HTTP/2 preface and SETTINGS arrived: idle rules from then on
        activity
            .bytes_read
            .store(H2_PREFACE_AND_SETTINGS, Ordering::Relaxed);
        assert_eq!(activity.expired(at(89), &limits), None);
        assert_eq!(activity.expired(at(90), &limits), Some("idle"));
        // an open request is never idle; its end starts the idle clock again
        let open = activity.begin();
        assert_eq!(activity.expired(at(500), &limits), None);
        drop(open);
        let ended = activity.opened.elapsed().as_secs();
        assert_eq!(activity.expired(at(ended + 89), &limits), None);
        assert_eq!(activity.expired(at(ended + 91), &limits), Some("idle"));
    }

    #[test]
    fn the_budget_is_taken_whole_or_not_at_all() {
        let budget = Semaphore::new(100);
        let mut first = Held::default();
        assert!(first.take(&budget, 60));
        assert!(first.take(&budget, 30));
        assert_eq!(first.bytes, 90);
        let mut second = Held::default();
        assert!(!second.take(&budget, 11), "more than is left");
        assert!(second.take(&budget, 10));
        assert_eq!(budget.available_permits(), 0);
        drop(first);
        assert_eq!(budget.available_permits(), 90);
        assert!(second.take(&budget, 0));
    }

    #[test]
    fn handshake_errors_name_the_client_certificate_reason() {
        let io = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        assert_eq!(
            client_refusal(&io(rustls::Error::NoCertificatesPresented)),
            Some("missing")
        );
        assert_eq!(
            client_refusal(&io(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer
            ))),
            Some("untrusted")
        );
        assert_eq!(
            client_refusal(&io(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure
            ))),
            Some("name")
        );
        assert_eq!(client_refusal(&io(rustls::Error::DecryptError)), None);
        assert_eq!(client_refusal(&std::io::Error::other("reset")), None);
    }
}
