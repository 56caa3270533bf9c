#![forbid(unsafe_code)]
#![warn(unreachable_pub)]
//! The AdmissionReview wire protocol (`admission.k8s.io/v1` and `v1beta1`), and the pod's
//! annotations as the CNIs and Multus read them.
//!
//! The contract, for the webhook above it:
//!
//! - [`decode`] takes a review body and answers an [`Incoming`] whose `apiVersion`, `kind`
//!   and `request.uid` were checked, or a [`ReviewError`] that says what was wrong (the
//!   webhook answers it with a 400). It never panics, whatever the bytes (`fuzz/` and
//!   `tests/fuzz_corpus.rs` hold it to that).
//! - [`Incoming::respond`] makes the only kind of [`Response`]: it copies the request's uid
//!   and version, so an answer cannot name another request. [`Response::to_json`] writes the
//!   review the API server reads, the patch as the base64 string the API documents.
//! - [`annotations`] reads each CNI's IP annotations exactly as that CNI does (Go's
//!   `encoding/json` and `net.ParseIP`; `tests/real_readers.rs` checks it against Go), and
//!   [`networks`] reads Multus's network selections; [`patch`] writes the JSON Patch.
//! - [`bounds`] refuses names and values longer than the API server allows.
//!
//! Decoding is one pass over the body (`scan`) that checks it is JSON, borrows the object as
//! raw JSON and reads only what a decision needs, so a 6 KB pod's `spec` is skipped without
//! allocation; anything unusual goes to the serde derive below, which decides and words the
//! errors.
//!
//! ```
//! let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",
//!   "request":{"uid":"705ab4f5","operation":"CREATE","namespace":"shop",
//!              "object":{"metadata":{"name":"web-0","labels":{"app":"web"}}}}}"#;
//! let incoming = ip_webhook_admission::decode(body).unwrap();
//! assert_eq!(incoming.uid(), "705ab4f5");
//! assert_eq!(incoming.namespace(), "shop");
//! let answer = incoming.respond().deny("no IP is free");
//! let json = String::from_utf8(answer.to_json()).unwrap();
//! assert!(json.contains(r#""uid":"705ab4f5""#) && json.contains(r#""allowed":false"#));
//!
//! // Not a review: an error that says so, never a panic.
//! assert!(ip_webhook_admission::decode(br#"{"kind":"Pod"}"#).is_err());
//! ```

pub mod annotations;
mod go_json;
pub mod networks;
pub mod patch;

pub mod bounds;
mod lex;
mod scan;
mod skip;

use std::borrow::Cow;
use std::collections::BTreeMap;

use base64::Engine;
use serde::Deserialize;
use serde_json::value::RawValue;

pub const V1: &str = "admission.k8s.io/v1";
pub(crate) const V1BETA1: &str = "admission.k8s.io/v1beta1";

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
pub(crate) struct Review<'a> {
    #[serde(borrow, default)]
    pub(crate) api_version: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) request: Option<Request<'a>>,
}

#[derive(Debug, Deserialize, Default, Clone, PartialEq, Eq)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub(crate) version: String,
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
    pub(crate) uid: Cow<'a, str>,
    #[serde(default)]
    pub kind: GroupVersionKind,
    #[serde(borrow, default)]
    pub sub_resource: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) namespace: Option<Cow<'a, str>>,
    pub operation: Operation,
    #[serde(borrow, default)]
    pub(crate) object: Option<RawJson<'a>>,
    #[serde(borrow, default)]
    pub(crate) old_object: Option<RawJson<'a>>,
    #[serde(default)]
    pub(crate) dry_run: Option<bool>,
    /// `CreateOptions`, `DeleteOptions`…, as raw JSON (read only for a Pod DELETE's grace).
    #[serde(borrow, default)]
    pub(crate) options: Option<RawJson<'a>>,
    /// `userInfo`, as raw JSON (read by the webhook's IPClaim guard, and to tell KubeVirt's
    /// launcher pods).
    #[serde(borrow, default)]
    pub(crate) user_info: Option<RawJson<'a>>,
    /// `object.metadata` as the scan read it (the serde path leaves it `NotScanned`).
    #[serde(skip)]
    pub(crate) object_metadata: ScannedMetadata,
    #[serde(skip)]
    pub(crate) old_object_metadata: ScannedMetadata,
}

/// A JSON value's text, borrowed from the body (checked as JSON when the review was decoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawJson<'a>(&'a str);

impl<'a> RawJson<'a> {
    pub(crate) fn get(&self) -> &'a str {
        self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for RawJson<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        <&'de RawValue>::deserialize(deserializer).map(|raw| RawJson(raw.get()))
    }
}

/// What the scan made of an embedded object's `metadata`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) enum ScannedMetadata {
    /// Not read, or not plain: read the object with serde.
    #[default]
    NotScanned,
    /// The object is a JSON object without `metadata`.
    Absent,
    Read(MetaOnly),
}

impl Operation {
    pub fn as_str(&self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

/// A decoded review whose version and uid were checked.
#[derive(Debug)]
pub struct Incoming<'a> {
    pub api_version: &'static str,
    pub request: Request<'a>,
}

impl<'a> Incoming<'a> {
    /// `request.userInfo.username`: who the API server says sent the request.
    pub fn username(&self) -> Option<String> {
        #[derive(Deserialize)]
        struct UserInfo {
            username: Option<String>,
        }
        let raw = self.request.user_info?;
        serde_json::from_str::<UserInfo>(raw.get()).ok()?.username
    }

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

    /// The `metadata` of `object` (or `oldObject`): what [`Incoming::object`]`::<MetaOnly>`
    /// returns, without parsing the rest of the object. The object was validated as JSON when
    /// the review was decoded, so its members are located by a byte scan and only the metadata
    /// fields the webhook reads go through serde; anything unusual (a field of the wrong type,
    /// a `null` metadata) takes the full serde path, which also gives the error message.
    pub fn metadata(&self, old: bool) -> Result<Option<Cow<'_, MetaOnly>>, ReviewError> {
        let (raw, scanned) = if old {
            (self.request.old_object, &self.request.old_object_metadata)
        } else {
            (self.request.object, &self.request.object_metadata)
        };
        match (raw.map(|raw| raw.get()), scanned) {
            (None | Some("null"), _) => Ok(None),
            (Some(_), ScannedMetadata::Absent) => Ok(Some(Cow::Owned(MetaOnly::default()))),
            (Some(_), ScannedMetadata::Read(metadata)) => Ok(Some(Cow::Borrowed(metadata))),
            (Some(_), ScannedMetadata::NotScanned) => {
                Ok(self.object::<MetaOnly>(old)?.map(Cow::Owned))
            }
        }
    }

    /// How long a deleted pod may run on (seconds): the DELETE's
    /// `options.gracePeriodSeconds`, else the pod's `spec.terminationGracePeriodSeconds`,
    /// else Kubernetes' default of 30. Negative or unreadable values count as absent.
    pub fn deletion_grace_seconds(&self) -> u64 {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Options {
            grace_period_seconds: Option<i64>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct PodSpec {
            termination_grace_period_seconds: Option<i64>,
        }
        #[derive(Deserialize)]
        struct Pod {
            spec: Option<PodSpec>,
        }
        let seconds = |value: Option<i64>| value.and_then(|v| u64::try_from(v).ok());
        let from_options = self
            .request
            .options
            .and_then(|raw| serde_json::from_str::<Options>(raw.get()).ok())
            .and_then(|o| seconds(o.grace_period_seconds));
        from_options
            .or_else(|| {
                self.object::<Pod>(true)
                    .ok()
                    .flatten()
                    .and_then(|pod| seconds(pod.spec?.termination_grace_period_seconds))
            })
            .unwrap_or(DEFAULT_GRACE_SECONDS)
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

/// Kubernetes' default `terminationGracePeriodSeconds`.
pub(crate) const DEFAULT_GRACE_SECONDS: u64 = 30;

/// Decode and check a review body.
pub fn decode(body: &[u8]) -> Result<Incoming<'_>, ReviewError> {
    let review = match scan::review(body) {
        Ok(review) => review,
        Err(scan::Unusual) => decode_with_serde(body)?,
    };
    check(review)
}

/// The reference decoder: what the scan must agree with, and what words the errors.
///
/// Our own derive, not kube-core's `AdmissionReview<DynamicObject>`: kube-core requires
/// `request.kind`, `resource` and `userInfo`, which no decision reads and the scan does not
/// ask for, so the two decoders would disagree on what is a review; and it parses the whole
/// object into a `DynamicObject` where a decision borrows the object as raw JSON and reads
/// only its metadata. `decodes_what_kube_core_decodes` holds the two to the same reading of a
/// real review.
fn decode_with_serde(body: &[u8]) -> Result<Review<'_>, ReviewError> {
    serde_json::from_slice(body).map_err(|e| ReviewError::NotAReview(e.to_string()))
}

fn check(review: Review<'_>) -> Result<Incoming<'_>, ReviewError> {
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
    pub(crate) api_version: &'static str,
    pub(crate) uid: String,
    pub allowed: bool,
    pub message: Option<String>,
    /// A JSON Patch document (raw JSON bytes).
    pub(crate) patch: Option<Vec<u8>>,
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

    /// Serialize as an AdmissionReview (written directly: this runs on every request).
    pub fn to_json(&self) -> Vec<u8> {
        let engine = &base64::engine::general_purpose::STANDARD;
        let patch_len = self.patch.as_ref().map_or(0, |p| p.len().div_ceil(3) * 4);
        let message_len = self.message.as_ref().map_or(0, String::len);
        let mut out = Vec::with_capacity(160 + self.uid.len() + patch_len + message_len);
        out.extend_from_slice(br#"{"apiVersion":""#);
        out.extend_from_slice(self.api_version.as_bytes());
        out.extend_from_slice(br#"","kind":"AdmissionReview","response":{"uid":"#);
        write_json_string(&mut out, &self.uid);
        out.extend_from_slice(if self.allowed {
            br#","allowed":true"#
        } else {
            br#","allowed":false"#
        });
        if let (Some(message), false) = (&self.message, self.allowed) {
            out.extend_from_slice(br#","status":{"code":403,"message":"#);
            write_json_string(&mut out, message);
            out.extend_from_slice(br#","reason":"Forbidden"}"#);
        }
        if let Some(patch) = &self.patch {
            out.extend_from_slice(br#","patchType":"JSONPatch","patch":""#);
            let start = out.len();
            out.resize(start + patch_len, 0);
            let written = engine
                .encode_slice(patch, &mut out[start..])
                .expect("buffer sized for base64");
            out.truncate(start + written);
            out.push(b'"');
        }
        if !self.warnings.is_empty() {
            out.extend_from_slice(br#","warnings":["#);
            for (i, warning) in self.warnings.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json_string(&mut out, warning);
            }
            out.push(b']');
        }
        out.extend_from_slice(b"}}");
        out
    }
}

/// The parts of an object's metadata the webhook reads.
#[derive(Debug, Deserialize, Default, Clone, PartialEq, Eq)]
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

#[derive(Debug, Deserialize, Default, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct OwnerRef {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub controller: Option<bool>,
}

/// An object of which only `metadata` is read (the rest is skipped while parsing).
#[derive(Debug, Deserialize, Default, Clone, PartialEq, Eq)]
pub struct MetaOnly {
    #[serde(default)]
    pub metadata: Meta,
}

fn write_json_string(out: &mut Vec<u8>, value: &str) {
    out.push(b'"');
    write_json_string_content(out, value);
    out.push(b'"');
}

/// Whether `value` holds a quote, a backslash or a control character: what a JSON string, or a
/// quoted log field, must escape (sixteen bytes at a time).
#[inline]
pub fn needs_escape(value: &str) -> bool {
    lex::string_stop(value.as_bytes(), 0).is_some()
}

fn write_json_string_content(out: &mut Vec<u8>, value: &str) {
    if !needs_escape(value) {
        out.extend_from_slice(value.as_bytes());
        return;
    }
    let mut quoted = serde_json::to_vec(value).expect("a string serializes");
    quoted.pop();
    out.extend_from_slice(&quoted[1..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::MetadataPatch;

    const REVIEW: &str = include_str!("../../../tests/fixtures/pod-create-v1.json");

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

    /// `metadata()` (byte scan) and `object::<MetaOnly>()` (serde) agree on `object`.
    fn assert_metadata_agrees(object: &str) {
        let body = format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","operation":"CREATE","object":{object}}}}}"#
        );
        let incoming = decode(body.as_bytes()).unwrap();
        let fast = incoming.metadata(false).map(|m| m.map(Cow::into_owned));
        let serde = incoming.object::<MetaOnly>(false);
        assert_eq!(fast, serde, "object: {object}");
    }

    #[test]
    fn metadata_scan_agrees_with_serde() {
        let fixture: serde_json::Value = serde_json::from_str(REVIEW).unwrap();
        let pod = &fixture["request"]["object"];
        assert_metadata_agrees(&pod.to_string());
        assert_metadata_agrees(&serde_json::to_string_pretty(pod).unwrap());
        let incoming = decode(REVIEW.as_bytes()).unwrap();
        let ours = incoming.metadata(false).unwrap().unwrap();
        assert_eq!(ours.metadata.label("app"), Some("web"));
        assert_eq!(
            ours.metadata.generate_name.as_deref(),
            Some("web-7d4b9c8f6d-")
        );
        for object in [
            "{}",
            "null",
            "[]",
            "5",
            r#"{"metadata":null}"#,
            r#"{"metadata":{}}"#,
            r#"{"metadata":[]}"#,
            r#"{"metadata":{"labels":null,"annotations":{}}}"#,
            r#"{"metadata":{"labels":5}}"#,
            r#"{"metadata":{"labels":{"a":1}}}"#,
            r#"{"metadata":{"name":"a"},"metadata":{"name":"b"}}"#,
            r#"{"metad\u0061ta":{"name":"escaped key"}}"#,
            r#"{"metadata":{"n\u0061me":"escaped field"}}"#,
            r#"{"spec":{"x":"}]\"{[","y":[{"z":"\\"}],"n":-1.5e3,"t":true,"f":null},"metadata":{"name":"after-spec"}}"#,
            r#" { "metadata" : { "name" : "spaced" , "labels" : { "a" : "b" } } , "status" : { } } "#,
            r#"{"metadata":{"ownerReferences":[{"kind":"StatefulSet","name":"web","controller":true,"uid":"x"}],"annotations":{"k/\"q\"":"v\n\u00e9"}}}"#,
            r#"{"metadata":{"managedFields":[{"fieldsV1":{"f:metadata":{"k:{\"uid\":\"x\"}":{}}}}],"uid":"the-uid","namespace":"ns"}}"#,
            // owner references: each field's odd but legal and illegal forms
            r#"{"metadata":{"ownerReferences":null}}"#,
            r#"{"metadata":{"ownerReferences":[]}}"#,
            r#"{"metadata":{"ownerReferences":[{}, {"controller":null,"blockOwnerDeletion":true,"x":[{}]}]}}"#,
            r#"{"metadata":{"ownerReferences":[{"name":null}]}}"#,
            r#"{"metadata":{"ownerReferences":[{"name":"a","name":"b"}]}}"#,
            r#"{"metadata":{"ownerReferences":[{"n\u0061me":"a"}]}}"#,
            r#"{"metadata":{"ownerReferences":[{"controller":"yes"}]}}"#,
            r#"{"metadata":{"ownerReferences":[{"uid":"a\"b"}],"ownerReferences":[]}}"#,
            r#"{"metadata":{"ownerReferences":{"kind":"ReplicaSet"}}}"#,
            r#"{"metadata":{"ownerReferences":[null]}}"#,
            r#"{"metadata":{"ownerReferences":[ { "kind" : "ReplicaSet" } , { "uid" : "u" } ]}}"#,
        ] {
            assert_metadata_agrees(object);
        }
        // as a real API server sends a stored pod: managedFields naming the annotations
        let stored = r#"{"metadata":{"annotations":{"ip-webhook.io/claim":"d43c8785e641ca288c2a9c6f5296c9cb"},"creationTimestamp":"2026-12-02T02:14:30Z","generateName":"web-","generation":1,"labels":{"app":"web"},"managedFields":[{"apiVersion":"v1","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:annotations":{"f:ip-webhook.io/claim":{}},"f:labels":{"f:app":{}}},"f:spec":{"f:containers":{}}},"manager":"m","operation":"Update","time":"2026-12-02T02:14:30Z"}],"name":"web-a","namespace":"default","uid":"21b784ae"}}"#;
        assert_metadata_agrees(stored);
        let body = format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","operation":"CREATE","object":{stored}}}}}"#
        );
        let incoming = decode(body.as_bytes()).unwrap();
        let meta = incoming.metadata(false).unwrap().unwrap();
        assert_eq!(
            meta.metadata.annotation("ip-webhook.io/claim"),
            Some("d43c8785e641ca288c2a9c6f5296c9cb")
        );
    }

    /// The scan either gives up or decodes what serde decodes; where serde refuses the body, the
    /// scan gives up (so the answer and its error message are serde's).
    fn assert_scan_agrees(body: &[u8]) {
        fn comparable(mut review: Review<'_>) -> String {
            if let Some(request) = &mut review.request {
                request.object_metadata = ScannedMetadata::NotScanned;
                request.old_object_metadata = ScannedMetadata::NotScanned;
            }
            format!("{review:?}")
        }
        let shown = String::from_utf8_lossy(body);
        match (scan::review(body), decode_with_serde(body)) {
            (Ok(fast), Ok(serde)) => assert_eq!(comparable(fast), comparable(serde), "{shown}"),
            (Ok(fast), Err(error)) => {
                panic!("the scan accepted what serde refuses ({error}): {fast:?}\n{shown}")
            }
            (Err(scan::Unusual), _) => {}
        }
    }

    /// Replaces the character at `at` (a fraction of the text's length, never before byte
    /// `from`) with `edit`, or inserts `edit` at the end.
    pub(super) fn damage(text: &mut String, at: f64, edit: &str, from: usize) {
        let mut at = (at * text.len() as f64) as usize;
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        let end = (at + 1).min(text.len());
        let end = if text.is_char_boundary(end) { end } else { at };
        text.replace_range(at.max(from)..end.max(from), edit);
    }

    fn compact_fixture() -> String {
        serde_json::from_str::<serde_json::Value>(REVIEW)
            .unwrap()
            .to_string()
    }

    #[test]
    fn scan_decodes_the_fixture_in_one_pass() {
        for body in [REVIEW.to_string(), compact_fixture()] {
            let review = scan::review(body.as_bytes()).expect("a plain review takes the fast path");
            let request = review.request.as_ref().unwrap();
            assert_eq!(request.operation, Operation::Create);
            assert_eq!(request.dry_run, Some(false));
            assert!(
                matches!(&request.object_metadata, ScannedMetadata::Read(pod) if pod.metadata.generate_name.as_deref() == Some("web-7d4b9c8f6d-")),
                "{:?}",
                request.object_metadata
            );
            assert_eq!(request.old_object, None);
            assert_scan_agrees(body.as_bytes());
        }
    }

    #[test]
    fn scan_gives_up_where_serde_must_decide() {
        let good = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE","object":{"metadata":{"name":"a"},"spec":SPEC}}}"#;
        for spec in [
            "01",
            "1.",
            "-",
            "1e",
            "1e+",
            "--1",
            "nul",
            "truex",
            "[1,]",
            "{\"a\":1,}",
            "[1 2]",
            "{\"a\" 1}",
            "{1:2}",
            "\"tab\tin\"",
            "\"bad \\x escape\"",
            "\"\\ud800\"",
            "'single'",
            "NaN",
            "Infinity",
            "[",
            "{",
        ] {
            let body = good.replace("SPEC", &spec.replace("\\t", "\t"));
            assert_eq!(
                scan::review(body.as_bytes()).map(drop),
                Err(scan::Unusual),
                "{body}"
            );
            assert_scan_agrees(body.as_bytes());
        }
        for spec in [
            "0",
            "-0.5e-3",
            "1E9",
            "[]",
            "{}",
            "[[],{}]",
            "\"\\\"\\\\/\\n\"",
            "true",
            "null",
        ] {
            let body = good.replace("SPEC", spec);
            assert!(scan::review(body.as_bytes()).is_ok(), "{body}");
            assert_scan_agrees(body.as_bytes());
        }
        for body in [
            // duplicates, escaped keys, wrong types, trailing bytes, deep nesting
            r#"{"apiVersion":"admission.k8s.io/v1","apiVersion":"x","kind":"AdmissionReview"}"#,
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","uid":"v","operation":"CREATE"}}"#,
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"u\u0069d":"u","operation":"CREATE"}}"#,
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":5,"operation":"CREATE"}}"#,
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"PATCH"}}"#,
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u"}}"#,
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE","dryRun":"yes"}} x"#,
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE","kind":{"kind":null}}}"#,
        ] {
            assert_eq!(
                scan::review(body.as_bytes()).map(drop),
                Err(scan::Unusual),
                "{body}"
            );
            assert_scan_agrees(body.as_bytes());
        }
        let deep = good.replace("SPEC", &format!("{}{}", "[".repeat(120), "]".repeat(120)));
        assert_eq!(scan::review(deep.as_bytes()).map(drop), Err(scan::Unusual));
        assert_scan_agrees(deep.as_bytes());
        let mut invalid_utf8 = good.replace("SPEC", "\"\u{e9}\"").into_bytes();
        let at = invalid_utf8.iter().position(|&b| b == 0xc3).unwrap();
        invalid_utf8[at + 1] = 0x28;
        assert_eq!(scan::review(&invalid_utf8).map(drop), Err(scan::Unusual));
        // escaped values it does decode
        let escaped = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"a\"b\\c\/d\n","name":null,"operation":"DELETE","oldObject":{"metadata":{"name":"x"}},"object":null}}"#;
        let review = scan::review(escaped.as_bytes()).expect("simple escapes take the fast path");
        assert_eq!(review.request.as_ref().unwrap().uid, "a\"b\\c/d\n");
        assert_scan_agrees(escaped.as_bytes());
    }

    proptest::proptest! {
        #[test]
        fn scan_agrees_with_serde_on_damaged_reviews(
            edits in proptest::collection::vec((0.0..1.0f64, proptest::sample::select(vec![
                "", "\"", "\\", "{", "}", "[", "]", ",", ":", "0", "-", ".", "e", "n", "t", " ", "\n", "\u{1}", "\u{e9}", "null", "\\u00e9",
            ])), 1..4),
            compact in proptest::bool::ANY,
        ) {
            let mut body = if compact { compact_fixture() } else { REVIEW.to_string() };
            for (at, text) in edits {
                damage(&mut body, at, text, 0);
            }
            assert_scan_agrees(body.as_bytes());
        }

        #[test]
        fn metadata_scan_agrees_with_serde_on_generated_objects(
            labels in proptest::collection::btree_map("[a-z/.~\"\\\\ \\n{}\\[\\]:,]{0,8}", "[ -~\\n]{0,8}", 0..4),
            noise in proptest::collection::vec(("[a-zA-Z\"{}:,]{1,6}", "[ -~]{0,12}"), 0..4),
            name in proptest::option::of("[a-z0-9-]{1,12}"),
            pretty in proptest::bool::ANY,
        ) {
            let mut metadata = serde_json::json!({ "labels": labels, "annotations": { "a": "b" } });
            if let Some(name) = name {
                metadata["name"] = name.into();
            }
            let mut object = serde_json::json!({ "metadata": metadata, "spec": { "containers": [] } });
            for (key, value) in noise {
                object["spec"][key.clone()] = serde_json::json!([value.clone(), { "k": value }]);
                object["metadata"]["managedFields"] = serde_json::json!([{ key: value }]);
            }
            let text = if pretty {
                serde_json::to_string_pretty(&object).unwrap()
            } else {
                object.to_string()
            };
            assert_metadata_agrees(&text);
        }
    }

    #[test]
    fn responses_are_the_documented_json() {
        let incoming = decode(REVIEW.as_bytes()).unwrap();
        let allowed = incoming
            .respond()
            .with_patch(br#"[{"op":"add"}]"#.to_vec())
            .warn("careful \"quoted\"\n")
            .warn("second");
        let v: serde_json::Value = serde_json::from_slice(&allowed.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "apiVersion": V1,
                "kind": "AdmissionReview",
                "response": {
                    "uid": incoming.uid(),
                    "allowed": true,
                    "patchType": "JSONPatch",
                    "patch": "W3sib3AiOiJhZGQifV0=",
                    "warnings": ["careful \"quoted\"\n", "second"],
                }
            })
        );
        let denied = incoming.respond().deny("no \\ way\u{1}");
        let v: serde_json::Value = serde_json::from_slice(&denied.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "apiVersion": V1,
                "kind": "AdmissionReview",
                "response": {
                    "uid": incoming.uid(),
                    "allowed": false,
                    "status": {"code": 403, "message": "no \\ way\u{1}", "reason": "Forbidden"},
                }
            })
        );
        // every patch length pads correctly
        for len in 0..8 {
            let patch = vec![b'x'; len];
            let json = incoming.respond().with_patch(patch.clone()).to_json();
            let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
            let encoded = v["response"]["patch"].as_str().unwrap();
            assert_eq!(
                base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .unwrap(),
                patch
            );
        }
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
        patch.add("labels", true, "q\"/\\~\u{7}", "v\"\\\u{1f}");
        let ops: serde_json::Value = serde_json::from_slice(&patch.to_json()).unwrap();
        assert_eq!(
            ops,
            serde_json::json!([
                {"op":"add","path":"/metadata/annotations","value":{}},
                {"op":"add","path":"/metadata/annotations/cni.projectcalico.org~1ipAddrs","value":"[\"10.0.0.1\"]"},
                {"op":"add","path":"/metadata/annotations/a~0b","value":"x"},
                {"op":"add","path":"/metadata/labels/ip-webhook.io~1allocated-ip","value":"10.0.0.1"},
                {"op":"add","path":"/metadata/labels/q\"~1\\~0\u{7}","value":"v\"\\\u{1f}"},
            ])
        );
    }
}
