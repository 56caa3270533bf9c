//! The plain-HTTP admin server: `/healthz`, `/readyz` and `/metrics`.

use super::*;

pub(super) async fn serve_admin(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
) {
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

pub(super) fn admin(
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
            match metrics
                .ledger_health
                .failing()
                .or_else(|| metrics.watch_health.failing())
            {
                None => text(StatusCode::OK, "text/plain", "ready\n".into()),
                Some(why) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!("not ready: {why}\n"),
                ),
            }
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
