//! Bounds on every name a review carries, checked before anything is stored, logged or
//! labelled.
//!
//! Anyone who can reach the webhook port can send a review, so its fields are untrusted:
//! a forged review with a 1 MB namespace would otherwise become a ledger key, a log field and
//! a metrics label. The API server never sends such a review (it validates objects first), so
//! a review that breaks a bound is refused with a message naming the field, and the message
//! never repeats an over-long value.
//!
//! | field | rule |
//! |---|---|
//! | `request.namespace`, `metadata.namespace` | DNS label (RFC 1123), at most 63 characters |
//! | `request.name`, `metadata.name`, owner names | DNS subdomain, at most 253 characters |
//! | `metadata.generateName` | DNS subdomain prefix (may end in `-`), at most 253 |
//! | the app label's value, the `ip-webhook.io/ip-pool` annotation | label value, at most 63 |
//! | `request.uid`, `metadata.uid`, owner UIDs | at most 128 characters, printable ASCII (no control character) |

use super::{Incoming, Meta};
use crate::annotations::IP_POOL;

/// A DNS label (namespace) is at most this long.
pub(crate) const MAX_DNS_LABEL: usize = 63;
/// A DNS subdomain (object name) is at most this long.
pub(crate) const MAX_DNS_SUBDOMAIN: usize = 253;
/// A label value is at most this long.
pub(crate) const MAX_LABEL_VALUE: usize = 63;
/// A UID is at most this long (the API server's are 36-character UUIDs).
pub(crate) const MAX_UID: usize = 128;

/// The field that broke a bound, and why; the message never holds an over-long value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct OutOfBounds {
    pub field: String,
    pub(crate) reason: BoundReason,
}

/// Why a value breaks its bound; a value is quoted only when it is within its length.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BoundReason {
    #[error(
        "{len} bytes long; at most {max} are allowed (the API server never sends a longer one)"
    )]
    TooLong { len: usize, max: usize },
    #[error(
        "{0:?} is not a DNS label (lower-case letters, digits and '-', starting and ending with a letter or digit)"
    )]
    NotDnsLabel(String),
    #[error(
        "{0:?} is not a DNS subdomain (lower-case letters, digits, '-' and '.', each part starting and ending with a letter or digit)"
    )]
    NotDnsSubdomain(String),
    #[error(
        "{0:?} is not a label value (letters, digits, '-', '_' and '.', starting and ending with a letter or digit)"
    )]
    NotLabelValue(String),
    /// Quoted escaped: a control character (a terminal's escape sequence) is never repeated.
    #[error(
        "{0:?} has a character that is not printable ASCII at byte {1} (a UID is printable ASCII: the API server's are UUIDs)"
    )]
    NotPrintable(String, usize),
}

/// Check the names of `incoming` (the request, `object` and `oldObject`). `app_label` is the
/// label that names a pod's app. A metadata block that cannot be decoded is left to the
/// handlers, which answer it with a 400.
pub fn check(incoming: &Incoming<'_>, app_label: &str) -> Result<(), OutOfBounds> {
    let request = &incoming.request;
    uid(&request.uid).map_err(at(|| "request.uid".to_string()))?;
    if let Some(namespace) = request.namespace.as_deref() {
        dns_label(namespace).map_err(at(|| "request.namespace".to_string()))?;
    }
    if let Some(name) = request.name.as_deref() {
        dns_subdomain(name, false).map_err(at(|| "request.name".to_string()))?;
    }
    for (old, prefix) in [(false, "request.object"), (true, "request.oldObject")] {
        if let Ok(Some(object)) = incoming.metadata(old) {
            metadata(prefix, &object.metadata, app_label)?;
        }
    }
    Ok(())
}

/// Names the field of a broken bound. The name is written only then: a review within bounds
/// (every one the API server sends) costs no formatting.
fn at(field: impl FnOnce() -> String) -> impl FnOnce(BoundReason) -> OutOfBounds {
    move |reason| OutOfBounds {
        field: field(),
        reason,
    }
}

fn metadata(prefix: &str, meta: &Meta, app_label: &str) -> Result<(), OutOfBounds> {
    let field = |name: &str| format!("{prefix}.metadata.{name}");
    if let Some(namespace) = meta.namespace.as_deref() {
        dns_label(namespace).map_err(at(|| field("namespace")))?;
    }
    if let Some(name) = meta.name.as_deref() {
        dns_subdomain(name, false).map_err(at(|| field("name")))?;
    }
    if let Some(generate_name) = meta.generate_name.as_deref() {
        dns_subdomain(generate_name, true).map_err(at(|| field("generateName")))?;
    }
    if let Some(value) = meta.uid.as_deref() {
        uid(value).map_err(at(|| field("uid")))?;
    }
    if let Some(app) = meta.label(app_label) {
        label_value(app).map_err(at(|| field(&format!("labels[{app_label:?}]"))))?;
    }
    if let Some(pool) = meta.annotation(IP_POOL) {
        label_value(pool.trim()).map_err(at(|| field(&format!("annotations[{IP_POOL:?}]"))))?;
    }
    for (i, owner) in meta.owner_references.iter().flatten().enumerate() {
        too_long(&owner.name, MAX_DNS_SUBDOMAIN)
            .map_err(at(|| field(&format!("ownerReferences[{i}].name"))))?;
        uid(&owner.uid).map_err(at(|| field(&format!("ownerReferences[{i}].uid"))))?;
    }
    Ok(())
}

/// Why a value breaks its bound.
type Reason = Result<(), BoundReason>;

/// Refuse `value` when longer than `max` characters (bytes: every allowed character is ASCII).
fn too_long(value: &str, max: usize) -> Reason {
    if value.len() > max {
        return Err(BoundReason::TooLong {
            len: value.len(),
            max,
        });
    }
    Ok(())
}

/// A UID: within [`MAX_UID`] and printable ASCII (the API server's are UUIDs). It is stored in
/// the ledger and shown by `status -o wide`; a control character in it would reach a terminal.
fn uid(value: &str) -> Reason {
    too_long(value, MAX_UID)?;
    match value.bytes().position(|b| !(b' '..=b'~').contains(&b)) {
        Some(at) => Err(BoundReason::NotPrintable(value.to_string(), at)),
        None => Ok(()),
    }
}

fn is_alphanumeric_lower(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `[-a-z0-9]*`, starting with a letter or digit when not empty.
fn is_dns_label_start(text: &[u8]) -> bool {
    text.first()
        .is_none_or(|&first| is_alphanumeric_lower(first))
        && text.iter().all(|&b| is_alphanumeric_lower(b) || b == b'-')
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn is_dns_label(text: &[u8]) -> bool {
    !text.is_empty()
        && is_dns_label_start(text)
        && text.last().is_some_and(|&b| is_alphanumeric_lower(b))
}

fn dns_label(value: &str) -> Reason {
    too_long(value, MAX_DNS_LABEL)?;
    if !value.is_empty() && !is_dns_label(value.as_bytes()) {
        return Err(BoundReason::NotDnsLabel(value.to_string()));
    }
    Ok(())
}

/// A DNS subdomain; `prefix` allows the trailing `-` of a `generateName`.
fn dns_subdomain(value: &str, prefix: bool) -> Reason {
    too_long(value, MAX_DNS_SUBDOMAIN)?;
    if value.is_empty() {
        return Ok(());
    }
    let valid = match (prefix, value.strip_suffix('-')) {
        // As the API server does: the trailing dash stands for the random suffix to come, so
        // the last part only has to start like a DNS label.
        (true, Some(stem)) if !stem.is_empty() => {
            let mut parts = stem.rsplit('.');
            let last = parts.next().unwrap_or_default();
            is_dns_label_start(last.as_bytes()) && parts.all(|part| is_dns_label(part.as_bytes()))
        }
        _ => value.split('.').all(|part| is_dns_label(part.as_bytes())),
    };
    if !valid {
        return Err(BoundReason::NotDnsSubdomain(value.to_string()));
    }
    Ok(())
}

/// `(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?`
fn label_value(value: &str) -> Reason {
    too_long(value, MAX_LABEL_VALUE)?;
    let bytes = value.as_bytes();
    let ok = match (bytes.first(), bytes.last()) {
        (None, _) | (_, None) => true,
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
    };
    if !ok {
        return Err(BoundReason::NotLabelValue(value.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode;

    fn review(request: serde_json::Value) -> String {
        serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": request,
        })
        .to_string()
    }

    fn pod_request(metadata: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "namespace": "default",
            "operation": "CREATE",
            "object": {"metadata": metadata, "spec": {}},
        })
    }

    fn checked(request: serde_json::Value) -> Result<(), OutOfBounds> {
        let body = review(request);
        let incoming = decode(body.as_bytes()).unwrap();
        check(&incoming, "app")
    }

    #[test]
    fn the_fixture_and_real_names_pass() {
        let fixture = include_str!("../../../tests/fixtures/pod-create-v1.json");
        check(&decode(fixture.as_bytes()).unwrap(), "app").unwrap();
        checked(pod_request(serde_json::json!({
            "generateName": "web-7d4b9c8f6d-",
            "namespace": "a".repeat(63),
            "name": format!("{}.{}", "b".repeat(63), "c".repeat(63)),
            "uid": "u".repeat(128),
            "labels": {"app": format!("A{}z", "-_.".repeat(20))},
            "annotations": {"ip-webhook.io/ip-pool": " pool-1 "},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "web-7d4b9c8f6d", "uid": "x"}],
        })))
        .unwrap();
        // empty values are what absent fields look like
        checked(pod_request(
            serde_json::json!({"name": "", "labels": {"app": ""}}),
        ))
        .unwrap();
    }

    #[test]
    fn each_bound_names_its_field() {
        let long = "a".repeat(1 << 20);
        let cases = [
            (
                pod_request(serde_json::json!({"namespace": "a".repeat(64)})),
                "request.object.metadata.namespace",
            ),
            (
                pod_request(serde_json::json!({"namespace": "Upper"})),
                "request.object.metadata.namespace",
            ),
            (
                pod_request(serde_json::json!({"generateName": long.clone()})),
                "request.object.metadata.generateName",
            ),
            (
                pod_request(serde_json::json!({"generateName": "web_-"})),
                "request.object.metadata.generateName",
            ),
            (
                pod_request(serde_json::json!({"name": "a".repeat(254)})),
                "request.object.metadata.name",
            ),
            (
                pod_request(serde_json::json!({"name": "a..b"})),
                "request.object.metadata.name",
            ),
            (
                pod_request(serde_json::json!({"uid": "u".repeat(129)})),
                "request.object.metadata.uid",
            ),
            (
                pod_request(serde_json::json!({"labels": {"app": "a".repeat(64)}})),
                "request.object.metadata.labels[\"app\"]",
            ),
            (
                pod_request(serde_json::json!({"labels": {"app": "-web"}})),
                "request.object.metadata.labels[\"app\"]",
            ),
            (
                pod_request(serde_json::json!({"annotations": {"ip-webhook.io/ip-pool": "p q"}})),
                "request.object.metadata.annotations[\"ip-webhook.io/ip-pool\"]",
            ),
            (
                pod_request(
                    serde_json::json!({"ownerReferences": [{"name": "x", "uid": long.clone()}]}),
                ),
                "request.object.metadata.ownerReferences[0].uid",
            ),
            (
                serde_json::json!({"uid": long.clone(), "operation": "CREATE"}),
                "request.uid",
            ),
            (
                serde_json::json!({"uid": "r\u{1b}[2J", "operation": "CREATE"}),
                "request.uid",
            ),
            (
                pod_request(serde_json::json!({"uid": "u\u{7}\u{85}x"})),
                "request.object.metadata.uid",
            ),
            (
                pod_request(serde_json::json!({"uid": "café"})),
                "request.object.metadata.uid",
            ),
            (
                serde_json::json!({"uid": "u", "namespace": long.clone(), "operation": "CREATE"}),
                "request.namespace",
            ),
            (
                serde_json::json!({"uid": "u", "name": "A", "operation": "DELETE"}),
                "request.name",
            ),
            (
                serde_json::json!({"uid": "u", "operation": "DELETE",
                    "oldObject": {"metadata": {"namespace": long.clone()}}}),
                "request.oldObject.metadata.namespace",
            ),
        ];
        for (request, field) in cases {
            let error = checked(request).unwrap_err();
            assert_eq!(error.field, field, "{error}");
            assert!(
                !error.to_string().chars().any(char::is_control),
                "the message repeats a control character: {error:?}"
            );
            assert!(
                error.to_string().len() < 400,
                "the message repeats the value: {} bytes",
                error.to_string().len()
            );
        }
    }

    #[test]
    fn syntax_helpers() {
        assert!(is_dns_label(b"a"));
        assert!(is_dns_label(b"a-1"));
        assert!(!is_dns_label(b""));
        assert!(!is_dns_label(b"a-"));
        assert!(!is_dns_label(b"a.b"));
        assert!(dns_subdomain("a.b-c.d", false).is_ok());
        assert!(dns_subdomain("a.", false).is_err());
        assert!(dns_subdomain("web-", true).is_ok());
        assert!(dns_subdomain("web-", false).is_err());
        assert!(dns_subdomain("-", true).is_err());
        assert!(label_value("A.b_c-D").is_ok());
        assert!(label_value("a b").is_err());
        assert!(label_value("é").is_err());
    }

    /// A `generateName` ending in `-` is valid exactly when the name the API server makes of
    /// it (the prefix without its dash, then a random suffix such as `a`) is a DNS subdomain.
    #[test]
    fn a_generate_name_passes_when_the_name_made_of_it_would() {
        let alphabet = ['a', '0', '-', '.', 'B'];
        let mut stems = vec![String::new()];
        for _ in 0..5 {
            let longer: Vec<String> = stems
                .iter()
                .flat_map(|stem| alphabet.iter().map(move |c| format!("{stem}{c}")))
                .collect();
            stems.extend(longer);
        }
        stems.sort();
        stems.dedup();
        let mut valid = 0;
        for stem in stems.iter().filter(|stem| !stem.is_empty()) {
            let generate_name = format!("{stem}-");
            let made = dns_subdomain(&format!("{stem}a"), false).is_ok();
            assert_eq!(
                dns_subdomain(&generate_name, true).is_ok(),
                made,
                "generateName {generate_name:?}"
            );
            valid += usize::from(made);
        }
        assert!(
            valid > 100 && valid < stems.len() / 2,
            "{valid} of {}",
            stems.len()
        );
    }
}
