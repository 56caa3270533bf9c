//! The HTTPS admission server and the plain-HTTP admin server.
//!
//! HTTPS: `POST /mutate`, `POST /validate`, HTTP/1.1 and HTTP/2. Every failure is answered with
//! a status and a message: 404/405 for a wrong route, 415 for a body that is not JSON, 413 over
//! 7 MiB, 408 for a body that does not arrive in time, 400 for JSON that is not an
//! AdmissionReview, 500 (counted) if a handler panics. Slow clients are cut off: the TLS
//! handshake, the request head and the body each have a deadline.
//!
//! Admin: `GET /healthz`, `GET /readyz` (200 once the caller marks `ready`), `GET /metrics`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::metrics::{Endpoint, Metrics, Outcome, RequestLabels};
use crate::webhook::Webhook;

/// controller-runtime's limit: the API server never sends more.
pub const MAX_BODY_BYTES: usize = 7 * 1024 * 1024;

/// Deadlines that keep a slow or stuck client from holding a connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub handshake: Duration,
    pub header_read: Duration,
    pub body_read: Duration,
    /// How long shutdown waits for in-flight admissions.
    pub drain: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshake: Duration::from_secs(10),
            header_read: Duration::from_secs(10),
            body_read: Duration::from_secs(10),
            drain: Duration::from_secs(25),
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
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.https.await;
        self.admin.abort();
    }

    /// Resolves when the HTTPS server stops on its own (it should not).
    pub fn stopped(&mut self) -> &mut tokio::task::JoinHandle<()> {
        &mut self.https
    }
}

/// Bind both listeners and serve until [`Running::shutdown`].
pub async fn start(
    webhook: Arc<Webhook>,
    tls: Arc<rustls::ServerConfig>,
    listen: SocketAddr,
    admin_listen: SocketAddr,
    limits: Limits,
    ready: Arc<AtomicBool>,
) -> std::io::Result<Running> {
    let https_listener = TcpListener::bind(listen).await?;
    let admin_listener = TcpListener::bind(admin_listen).await?;
    let https_addr = https_listener.local_addr()?;
    let admin_addr = admin_listener.local_addr()?;
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
    let graceful = GracefulShutdown::new();
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
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let webhook = webhook.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(limits.handshake, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let service = service_fn(move |request| {
                let webhook = webhook.clone();
                async move { Ok::<_, Infallible>(admission(&webhook, request, limits).await) }
            });
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read);
            builder.http2().timer(TokioTimer::new());
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            if let Err(error) = watcher.watch(connection.into_owned()).await {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("some connections were still busy when the drain period ended");
    }
}

/// Route and answer one HTTPS request.
async fn admission(
    webhook: &Webhook,
    request: Request<Incoming>,
    limits: Limits,
) -> Response<Full<Bytes>> {
    let endpoint = match request.uri().path() {
        "/mutate" => Endpoint::mutate,
        "/validate" => Endpoint::validate,
        path => {
            return status(
                StatusCode::NOT_FOUND,
                &format!(
                    "no such path {path:?}; ip-webhook serves POST /mutate and POST /validate"
                ),
            );
        }
    };
    let count = |outcome| {
        webhook
            .metrics
            .requests
            .get_or_create(&RequestLabels {
                webhook: endpoint.clone(),
                outcome,
            })
            .inc();
    };
    if request.method() != Method::POST {
        count(Outcome::bad_request);
        return status(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("{} is not allowed; send POST", request.method()),
        );
    }
    if let Err(message) = check_content_type(request.headers()) {
        count(Outcome::bad_request);
        return status(StatusCode::UNSUPPORTED_MEDIA_TYPE, &message);
    }
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > MAX_BODY_BYTES as u64) {
        count(Outcome::bad_request);
        return too_large();
    }
    let body = match tokio::time::timeout(
        limits.body_read,
        Limited::new(request.into_body(), MAX_BODY_BYTES).collect(),
    )
    .await
    {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => {
            count(Outcome::bad_request);
            return too_large();
        }
        Ok(Err(error)) => {
            count(Outcome::bad_request);
            return status(
                StatusCode::BAD_REQUEST,
                &format!("cannot read the request body: {error}"),
            );
        }
        Err(_) => {
            count(Outcome::bad_request);
            return status(
                StatusCode::REQUEST_TIMEOUT,
                &format!(
                    "the request body did not arrive within {:?}",
                    limits.body_read
                ),
            );
        }
    };
    let answer = recover(webhook.review(endpoint.clone(), &body)).await;
    match answer {
        Ok(Ok(json)) => json_response(StatusCode::OK, json),
        Ok(Err(error)) => status(StatusCode::BAD_REQUEST, &error.to_string()),
        Err(panic) => {
            webhook.metrics.panics.inc();
            count(Outcome::error);
            tracing::error!(panic = %panic, "admission handler panicked");
            status(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!(
                    "ip-webhook hit an internal error and did not decide this request: {panic}"
                ),
            )
        }
    }
}

/// Run a future; a panic inside becomes `Err(message)` instead of tearing down the connection.
pub async fn recover<T>(future: impl Future<Output = T>) -> Result<T, String> {
    AssertUnwindSafe(future)
        .catch_unwind()
        .await
        .map_err(|payload| {
            payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".to_string())
        })
}

fn check_content_type(headers: &http::HeaderMap) -> Result<(), String> {
    let value = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let media = value.map(|v| {
        v.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    });
    match media.as_deref() {
        Some("application/json") => Ok(()),
        Some(other) => Err(format!(
            "Content-Type {other:?} is not supported; send application/json"
        )),
        None => Err("Content-Type is missing; send application/json".to_string()),
    }
}

fn too_large() -> Response<Full<Bytes>> {
    status(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("the request body is larger than {MAX_BODY_BYTES} bytes (7 MiB)"),
    )
}

fn json_response(code: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts")
}

/// A `metav1.Status` body, the shape Kubernetes clients understand.
fn status(code: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": code.canonical_reason().unwrap_or("").replace(' ', ""),
        "code": code.as_u16(),
    });
    json_response(code, serde_json::to_vec(&body).expect("json"))
}

async fn serve_admin(listener: TcpListener, metrics: Arc<Metrics>, ready: Arc<AtomicBool>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let metrics = metrics.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let metrics = metrics.clone();
                let ready = ready.clone();
                async move { Ok::<_, Infallible>(admin(&request, &metrics, &ready)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

fn admin(
    request: &Request<Incoming>,
    metrics: &Metrics,
    ready: &AtomicBool,
) -> Response<Full<Bytes>> {
    let text = |code: StatusCode, content_type: &'static str, body: String| {
        Response::builder()
            .status(code)
            .header(header::CONTENT_TYPE, content_type)
            .body(Full::new(Bytes::from(body)))
            .expect("static response parts")
    };
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "text/plain", "ok\n".into()),
        (&Method::GET, "/readyz") if ready.load(Ordering::SeqCst) => {
            text(StatusCode::OK, "text/plain", "ready\n".into())
        }
        (&Method::GET, "/readyz") => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready: still starting\n".into(),
        ),
        (&Method::GET, "/metrics") => text(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        (_, path) => text(
            StatusCode::NOT_FOUND,
            "text/plain",
            format!(
                "no such path {path:?}; the admin port serves GET /healthz, /readyz, /metrics\n"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_becomes_an_error_value() {
        let caught = recover(async { panic!("boom at {}", 42) }).await;
        assert_eq!(caught, Err::<(), _>("boom at 42".to_string()));
        assert_eq!(recover(async { 7 }).await, Ok(7));
    }

    #[test]
    fn content_types() {
        let mut headers = http::HeaderMap::new();
        assert!(
            check_content_type(&headers)
                .unwrap_err()
                .contains("missing")
        );
        headers.insert(
            header::CONTENT_TYPE,
            "application/json; charset=utf-8".parse().unwrap(),
        );
        assert!(check_content_type(&headers).is_ok());
        headers.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert_eq!(
            check_content_type(&headers).unwrap_err(),
            "Content-Type \"text/plain\" is not supported; send application/json"
        );
    }
}
