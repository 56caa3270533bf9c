#![forbid(unsafe_code)]
//! The load benchmark's floor: an HTTPS server on ip-webhook's TLS stack (hyper + hyper-util
//! auto builder + tokio-rustls with ring, same `ServerConfig`) that reads each request body and
//! answers one canned AdmissionReview without parsing anything. Whatever ip-webhook spends above
//! this is the cost of deciding.
//!
//! `cargo run --release --example bench_floor -- 127.0.0.1:9443`

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

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
use tokio_rustls::TlsAcceptor;

/// The answer ip-webhook gives the fixture review (a three-op allocation patch), precomputed.
const CANNED: &[u8] = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002","allowed":true,"patchType":"JSONPatch","patch":"W3sib3AiOiJhZGQiLCJwYXRoIjoiL21ldGFkYXRhL2Fubm90YXRpb25zL2NuaS5wcm9qZWN0Y2FsaWNvLm9yZ34xaXBBZGRycyIsInZhbHVlIjoiW1wiMTAuMC4wLjEwXCJdIn0seyJvcCI6ImFkZCIsInBhdGgiOiIvbWV0YWRhdGEvYW5ub3RhdGlvbnMvaXAtd2ViaG9vay5pb34xc3RhdHVzIiwidmFsdWUiOiJtdXRhdGVkIn0seyJvcCI6ImFkZCIsInBhdGgiOiIvbWV0YWRhdGEvbGFiZWxzL2lwLXdlYmhvb2suaW9+MWFsbG9jYXRlZC1pcCIsInZhbHVlIjoiMTAuMC4wLjEwIn1d"}}"#;

async fn answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let read = Limited::new(request.into_body(), MAX_BODY_BYTES)
        .collect()
        .await;
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
    let listen: SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9443".into())
        .parse()?;
    let key = self_signed(&[])?.certified_key()?;
    let acceptor = TlsAcceptor::from(Arc::new(server_config(Arc::new(CertResolver::new(key)))));
    let listener = TcpListener::bind(listen).await?;
    println!("bench_floor serving https://{}", listener.local_addr()?);
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service_fn(answer))
                .await;
        });
    }
}
