//! The AdmissionReview wire protocol (`admission.k8s.io/v1` and `v1beta1`).
//!
//! Decoding borrows the object as raw JSON and reads only what a decision needs, so a 6 KB
//! pod is parsed once and its `spec` is skipped without allocation. Responses echo the
//! request's `apiVersion` and `uid`, and carry the patch as the base64 string the API documents.

use std::borrow::Cow;
use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

pub const V1: &str = "admission.k8s.io/v1";
pub const V1BETA1: &str = "admission.k8s.io/v1beta1";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReviewError {
    #[error("the body is not an AdmissionReview: {0}")]
    NotAReview(String),
    #[error(
        "apiVersion {0:?} is not supported; send admission.k8s.io/v1 or admission.k8s.io/v1beta1"
    )]
    UnsupportedVersion(String),
    #[error("kind {0:?} is not AdmissionReview")]
    WrongKind(String),
    #[error("the AdmissionReview has no request")]
    MissingRequest,
    #[error("request.uid is empty")]
    MissingUid,
    #[error("request.{field} cannot be decoded: {reason}")]
    BadObject { field: &'static str, reason: String },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Review<'a> {
    #[serde(borrow, default)]
    pub api_version: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub request: Option<Request<'a>>,
}

#[derive(Debug, Deserialize, Default, Clone, PartialEq, Eq)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request<'a> {
    #[serde(borrow, default)]
    pub uid: Cow<'a, str>,
    #[serde(default)]
    pub kind: GroupVersionKind,
    #[serde(borrow, default)]
    pub sub_resource: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub namespace: Option<Cow<'a, str>>,
    pub operation: Operation,
    #[serde(borrow, default)]
    pub object: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub old_object: Option<&'a RawValue>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// A decoded review whose version and uid were checked.
#[derive(Debug)]
pub struct Incoming<'a> {
    pub api_version: &'static str,
    pub request: Request<'a>,
}

impl<'a> Incoming<'a> {
    pub fn uid(&self) -> &str {
        &self.request.uid
    }

    pub fn dry_run(&self) -> bool {
        self.request.dry_run.unwrap_or(false)
    }

    pub fn namespace(&self) -> &str {
        self.request.namespace.as_deref().unwrap_or("")
    }

    /// Decode `object` (or `oldObject`) into `T`; `null` and absent are `None`.
    pub fn object<T: Deserialize<'a>>(&self, old: bool) -> Result<Option<T>, ReviewError> {
        let (field, raw) = if old {
            ("oldObject", self.request.old_object)
        } else {
            ("object", self.request.object)
        };
        match raw {
            None => Ok(None),
            Some(raw) if raw.get() == "null" => Ok(None),
            Some(raw) => {
                serde_json::from_str(raw.get())
                    .map(Some)
                    .map_err(|e| ReviewError::BadObject {
                        field,
                        reason: e.to_string(),
                    })
            }
        }
    }

    /// A response for this request (uid and version copied, so they cannot be forgotten).
    pub fn respond(&self) -> Response {
        Response {
            api_version: self.api_version,
            uid: self.uid().to_string(),
            allowed: true,
            message: None,
            patch: None,
            warnings: Vec::new(),
        }
    }
}

/// Decode and check a review body.
pub fn decode(body: &[u8]) -> Result<Incoming<'_>, ReviewError> {
    let review: Review<'_> =
        serde_json::from_slice(body).map_err(|e| ReviewError::NotAReview(e.to_string()))?;
    let api_version = match review.api_version.as_deref() {
        Some(V1) => V1,
        Some(V1BETA1) => V1BETA1,
        Some(other) => return Err(ReviewError::UnsupportedVersion(other.to_string())),
        None => return Err(ReviewError::UnsupportedVersion(String::new())),
    };
    match review.kind.as_deref() {
        Some("AdmissionReview") => {}
        other => return Err(ReviewError::WrongKind(other.unwrap_or("").to_string())),
    }
    let request = review.request.ok_or(ReviewError::MissingRequest)?;
    if request.uid.is_empty() {
        return Err(ReviewError::MissingUid);
    }
    Ok(Incoming {
        api_version,
        request,
    })
}

/// The decision to send back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub api_version: &'static str,
    pub uid: String,
    pub allowed: bool,
    pub message: Option<String>,
    /// A JSON Patch document (raw JSON bytes).
    pub patch: Option<Vec<u8>>,
    pub warnings: Vec<String>,
}

impl Response {
    pub fn deny(mut self, message: impl Into<String>) -> Response {
        self.allowed = false;
        self.message = Some(message.into());
        self.patch = None;
        self
    }

    pub fn with_patch(mut self, patch: Vec<u8>) -> Response {
        self.patch = Some(patch);
        self
    }

    pub fn warn(mut self, warning: impl Into<String>) -> Response {
        self.warnings.push(warning.into());
        self
    }

    /// Serialize as an AdmissionReview.
    pub fn to_json(&self) -> Vec<u8> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Status<'s> {
            code: u16,
            message: &'s str,
            reason: &'static str,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Inner<'s> {
            uid: &'s str,
            allowed: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            status: Option<Status<'s>>,
            #[serde(skip_serializing_if = "Option::is_none")]
            patch_type: Option<&'static str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            patch: Option<String>,
            #[serde(skip_serializing_if = "<[String]>::is_empty")]
            warnings: &'s [String],
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Outer<'s> {
            api_version: &'static str,
            kind: &'static str,
            response: Inner<'s>,
        }
        let status = match (&self.message, self.allowed) {
            (Some(message), false) => Some(Status {
                code: 403,
                message,
                reason: "Forbidden",
            }),
            _ => None,
        };
        let patch = self
            .patch
            .as_ref()
            .map(|p| base64::engine::general_purpose::STANDARD.encode(p));
        let review = Outer {
            api_version: self.api_version,
            kind: "AdmissionReview",
            response: Inner {
                uid: &self.uid,
                allowed: self.allowed,
                status,
                patch_type: patch.as_ref().map(|_| "JSONPatch"),
                patch,
                warnings: &self.warnings,
            },
        };
        serde_json::to_vec(&review).expect("a response always serializes")
    }
}

/// The parts of an object's metadata the webhook reads.
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub generate_name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub uid: Option<String>,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub owner_references: Option<Vec<OwnerRef>>,
}

impl Meta {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.as_ref()?.get(key).map(String::as_str)
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key).map(String::as_str)
    }
}

#[derive(Debug, Deserialize, Default, Clone)]
#[serde(rename_all = "camelCase")]
pub struct OwnerRef {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub controller: Option<bool>,
}

/// An object of which only `metadata` is read (the rest is skipped while parsing).
#[derive(Debug, Deserialize, Default, Clone)]
pub struct MetaOnly {
    #[serde(default)]
    pub metadata: Meta,
}

/// Escape a key for a JSON Pointer (RFC 6901): `~` → `~0`, `/` → `~1`.
pub fn escape_pointer(key: &str) -> Cow<'_, str> {
    if key.contains(['~', '/']) {
        Cow::Owned(key.replace('~', "~0").replace('/', "~1"))
    } else {
        Cow::Borrowed(key)
    }
}

/// Builds a JSON Patch that adds metadata labels and annotations, writing the JSON directly.
#[derive(Debug, Default)]
pub struct MetadataPatch {
    ops: Vec<(&'static str, String, String)>,
}

impl MetadataPatch {
    /// `map` is `labels` or `annotations`; `present` says whether the object has that map.
    pub fn add(&mut self, map: &'static str, present: bool, key: &str, value: &str) {
        let map_present = present || self.ops.iter().any(|(m, k, _)| *m == map && k.is_empty());
        if !map_present {
            self.ops.push((map, String::new(), String::new()));
        }
        self.ops.push((map, key.to_string(), value.to_string()));
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub fn to_json(&self) -> Vec<u8> {
        let mut out = String::with_capacity(64 + self.ops.len() * 96);
        out.push('[');
        for (i, (map, key, value)) in self.ops.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            if key.is_empty() {
                out.push_str(&format!(
                    r#"{{"op":"add","path":"/metadata/{map}","value":{{}}}}"#
                ));
            } else {
                let path = format!("/metadata/{map}/{}", escape_pointer(key));
                out.push_str(r#"{"op":"add","path":"#);
                out.push_str(&serde_json::to_string(&path).expect("string"));
                out.push_str(r#","value":"#);
                out.push_str(&serde_json::to_string(value).expect("string"));
                out.push('}');
            }
        }
        out.push(']');
        out.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REVIEW: &str = include_str!("../tests/fixtures/pod-create-v1.json");

    #[test]
    fn decodes_what_kube_core_decodes() {
        let ours = decode(REVIEW.as_bytes()).unwrap();
        let theirs: kube::core::admission::AdmissionReview<kube::core::DynamicObject> =
            serde_json::from_str(REVIEW).unwrap();
        let theirs: kube::core::admission::AdmissionRequest<kube::core::DynamicObject> =
            theirs.try_into().unwrap();
        assert_eq!(ours.uid(), theirs.uid);
        assert_eq!(ours.namespace(), theirs.namespace.as_deref().unwrap_or(""));
        assert_eq!(ours.request.kind.kind, theirs.kind.kind);
        assert_eq!(ours.dry_run(), theirs.dry_run);
        let pod: MetaOnly = ours.object(false).unwrap().unwrap();
        let obj = theirs.object.unwrap();
        assert_eq!(pod.metadata.labels, obj.metadata.labels);
        assert_eq!(pod.metadata.annotations, obj.metadata.annotations);
        assert_eq!(pod.metadata.generate_name, obj.metadata.generate_name);
    }

    #[test]
    fn rejects_what_is_not_a_review() {
        let cases: [(&str, ReviewError); 5] = [
            (
                "{",
                ReviewError::NotAReview("EOF while parsing an object at line 1 column 1".into()),
            ),
            (
                r#"{"apiVersion":"v1","kind":"Pod"}"#,
                ReviewError::UnsupportedVersion("v1".into()),
            ),
            (
                r#"{"apiVersion":"admission.k8s.io/v1","kind":"Pod"}"#,
                ReviewError::WrongKind("Pod".into()),
            ),
            (
                r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
                ReviewError::MissingRequest,
            ),
            (
                r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"","operation":"CREATE"}}"#,
                ReviewError::MissingUid,
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(decode(body.as_bytes()).unwrap_err(), expected, "{body}");
        }
    }

    #[test]
    fn response_carries_base64_patch_and_echoes_version() {
        let body = REVIEW.replace(V1, V1BETA1);
        let incoming = decode(body.as_bytes()).unwrap();
        let json = incoming.respond().with_patch(b"[]".to_vec()).to_json();
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(v["apiVersion"], V1BETA1);
        assert_eq!(v["response"]["uid"], incoming.uid());
        assert_eq!(v["response"]["patch"], "W10=");
        assert_eq!(v["response"]["patchType"], "JSONPatch");
        let denied = incoming.respond().deny("no").to_json();
        let v: serde_json::Value = serde_json::from_slice(&denied).unwrap();
        assert_eq!(v["response"]["allowed"], false);
        assert_eq!(v["response"]["status"]["message"], "no");
        assert_eq!(v["response"]["status"]["code"], 403);
        assert!(v["response"].get("patch").is_none());
    }

    #[test]
    fn patch_escapes_keys_and_creates_maps_once() {
        let mut patch = MetadataPatch::default();
        patch.add(
            "annotations",
            false,
            "cni.projectcalico.org/ipAddrs",
            "[\"10.0.0.1\"]",
        );
        patch.add("annotations", false, "a~b", "x");
        patch.add("labels", true, "ip-webhook.io/allocated-ip", "10.0.0.1");
        let ops: serde_json::Value = serde_json::from_slice(&patch.to_json()).unwrap();
        assert_eq!(
            ops,
            serde_json::json!([
                {"op":"add","path":"/metadata/annotations","value":{}},
                {"op":"add","path":"/metadata/annotations/cni.projectcalico.org~1ipAddrs","value":"[\"10.0.0.1\"]"},
                {"op":"add","path":"/metadata/annotations/a~0b","value":"x"},
                {"op":"add","path":"/metadata/labels/ip-webhook.io~1allocated-ip","value":"10.0.0.1"},
            ])
        );
    }
}
