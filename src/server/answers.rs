//! The answers a request gets besides a review's: a route or request head refused before the
//! body is read, a body that was not read whole, the in-flight budget spent, a panic; each a
//! `metav1.Status` with a message that says what to send instead.

use bytes::Bytes;
use http::{Method, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;

use super::body::BodyError;
use super::{Limits, MAX_BODY_BYTES};
use crate::decisions::Webhook;
use crate::metrics::{Endpoint, ReasonLabels};

/// The endpoint a path names, or a 404 naming the two there are.
pub(super) fn endpoint_of(path: &str) -> Result<Endpoint, Box<Response<Full<Bytes>>>> {
    match path {
        "/mutate" => Ok(Endpoint::mutate),
        "/validate" => Ok(Endpoint::validate),
        path => {
            let message =
                format!("no such path {path:?}; ip-webhook serves POST /mutate and POST /validate");
            Err(Box::new(status(StatusCode::NOT_FOUND, &message)))
        }
    }
}

/// Refuse a request head no review gets past (a method other than POST, a content type other
/// than JSON, a declared length over [`MAX_BODY_BYTES`]); else the declared length.
pub(super) fn check_head(
    parts: &http::request::Parts,
) -> Result<Option<usize>, Box<Response<Full<Bytes>>>> {
    if parts.method != Method::POST {
        let message = format!("{} is not allowed; send POST", parts.method);
        return Err(Box::new(status(StatusCode::METHOD_NOT_ALLOWED, &message)));
    }
    if let Err(refused) = check_content_type(&parts.headers) {
        return Err(Box::new(status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &refused.to_string(),
        )));
    }
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > MAX_BODY_BYTES as u64) {
        return Err(Box::new(too_large()));
    }
    Ok(declared.map(|len| len as usize))
}

/// The answer to a body that was not read whole (`None`: it did not arrive in time), and
/// what is left of it to drain (a body over the limit or the in-flight budget).
pub(super) fn unread_body(
    error: Option<BodyError>,
    webhook: &Webhook,
    limits: Limits,
) -> (Response<Full<Bytes>>, Option<Incoming>) {
    match error {
        Some(BodyError::TooLarge(body)) => (too_large(), Some(body)),
        Some(BodyError::Busy(body)) => (busy(webhook, limits), Some(body)),
        Some(BodyError::Read(error)) => (
            status(
                StatusCode::BAD_REQUEST,
                &format!("cannot read the request body: {error}"),
            ),
            None,
        ),
        None => (
            status(
                StatusCode::REQUEST_TIMEOUT,
                &format!(
                    "the request body did not arrive within {:?}",
                    limits.body_read
                ),
            ),
            None,
        ),
    }
}

/// The answer when deciding a review panicked: counted, logged, and a 500 that says so.
pub(super) fn panicked(webhook: &Webhook, panic: &str) -> Response<Full<Bytes>> {
    webhook.metrics.panics.inc();
    tracing::error!(panic = %panic, "admission handler panicked");
    status(
        StatusCode::INTERNAL_SERVER_ERROR,
        &format!("ip-webhook hit an internal error and did not decide this request: {panic}"),
    )
}

pub(super) fn busy(webhook: &Webhook, limits: Limits) -> Response<Full<Bytes>> {
    webhook
        .metrics
        .load_refusals
        .get_or_create(&ReasonLabels {
            reason: "max_inflight_bytes",
        })
        .inc();
    let mut response = status(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!(
            "ip-webhook is busy: {} bytes of request bodies are already in flight (--max-inflight-bytes); retry",
            limits.max_inflight_bytes
        ),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
    response
}

/// Why a request's Content-Type is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum ContentTypeError {
    #[error("Content-Type {0:?} is not supported; send application/json")]
    Unsupported(String),
    #[error("Content-Type is missing; send application/json")]
    Missing,
}

pub(super) fn check_content_type(headers: &http::HeaderMap) -> Result<(), ContentTypeError> {
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
        Some(other) => Err(ContentTypeError::Unsupported(other.to_string())),
        None => Err(ContentTypeError::Missing),
    }
}

pub(super) fn too_large() -> Response<Full<Bytes>> {
    status(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("the request body is larger than {MAX_BODY_BYTES} bytes (7 MiB)"),
    )
}

pub(super) fn json_response(code: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts")
}

/// A `metav1.Status` body, the shape Kubernetes clients understand.
pub(super) fn status(code: StatusCode, message: &str) -> Response<Full<Bytes>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        let mut headers = http::HeaderMap::new();
        assert!(
            check_content_type(&headers)
                .unwrap_err()
                .to_string()
                .contains("missing")
        );
        headers.insert(
            header::CONTENT_TYPE,
            "application/json; charset=utf-8".parse().unwrap(),
        );
        assert!(check_content_type(&headers).is_ok());
        headers.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert_eq!(
            check_content_type(&headers).unwrap_err().to_string(),
            "Content-Type \"text/plain\" is not supported; send application/json"
        );
    }
}
