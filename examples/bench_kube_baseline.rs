#![forbid(unsafe_code)]
//! The load benchmark's comparison point: a mutating webhook written the way the kube-rs
//! admission example is (axum, `Json<AdmissionReview<DynamicObject>>`, kube-core's
//! `AdmissionResponse` with a `json_patch::Patch`), served on ip-webhook's TLS stack so only the
//! handler differs. It adds the same three patch operations ip-webhook adds, without an
//! allocator or a ledger: its cost is the protocol handling alone.
//!
//! `cargo run --release --example bench_kube_baseline -- 127.0.0.1:9444`

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::routing::post;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use ip_webhook::server::certs::self_signed;
use ip_webhook::server::tls::{CertResolver, server_config};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

async fn mutate(
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(error) => return Json(AdmissionResponse::invalid(error.to_string()).into_review()),
    };
    let response = AdmissionResponse::from(&request);
    let Some(pod) = &request.object else {
        return Json(response.into_review());
    };
    let has_annotations = pod.metadata.annotations.is_some();
    let mut ops = Vec::new();
    if !has_annotations {
        ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
    }
    ops.push(json!({"op": "add", "path": "/metadata/annotations/cni.projectcalico.org~1ipAddrs", "value": "[\"10.0.0.10\"]"}));
    ops.push(json!({"op": "add", "path": "/metadata/annotations/ip-webhook.io~1status", "value": "mutated"}));
    if pod.metadata.labels.is_none() {
        ops.push(json!({"op": "add", "path": "/metadata/labels", "value": {}}));
    }
    ops.push(json!({"op": "add", "path": "/metadata/labels/ip-webhook.io~1allocated-ip", "value": "10.0.0.10"}));
    let patch = serde_json::from_value(serde_json::Value::Array(ops)).expect("valid JSON Patch");
    let response = match response.with_patch(patch) {
        Ok(response) => response,
        Err(error) => AdmissionResponse::invalid(error.to_string()),
    };
    Json(response.into_review())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let listen: SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9444".into())
        .parse()?;
    let key = self_signed(&[])?.certified_key()?;
    let acceptor = TlsAcceptor::from(Arc::new(server_config(Arc::new(CertResolver::new(key)))));
    let router = Router::new().route("/mutate", post(mutate));
    let listener = TcpListener::bind(listen).await?;
    println!(
        "bench_kube_baseline serving https://{}",
        listener.local_addr()?
    );
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
