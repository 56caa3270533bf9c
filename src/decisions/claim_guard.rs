//! The IPClaim guard (`/validate`, `ipclaims.validate.ip-webhook.io`): an IPClaim is
//! ip-webhook's record that an IP is taken, so a hand edit of its `spec`, or the deletion of a
//! claim whose pod still runs, would let the IP be handed out twice.
//!
//! - **UPDATE** that changes `spec`: refused, unless the new object carries the annotation
//!   `FORCE`` = "true"`. Metadata edits (labels, annotations, finalizers) are never refused.
//! - **UPDATE of the `status` subresource** that changes it (`kubectl patch ipclaim IP
//!   --subresource=status`): refused unless the stored claim already carries `FORCE`; a
//!   status write cannot change metadata, so the mark is set with an edit of its own first.
//!   The phase is only what the record says: the reconciler never frees a claim whose pod
//!   runs for its phase alone, but no one else should write it.
//! - **DELETE** of a claim whose pod runs (phase `Reserved`, `Bound` or `Terminating`, with a
//!   pod UID that the watch-fed pod caches hold): refused, unless the claim being deleted
//!   (`oldObject`) carries `FORCE`` = "true"`. So an operator forces in two steps:
//!   `kubectl annotate ipclaim NAME ip-webhook.io/force=true`, then `kubectl delete ipclaim
//!   NAME`. A `Released` claim, or one whose pod is gone, is deleted freely.
//! - **ip-webhook's own writes** (the ledger adapter's creates and binds, the reconciler's
//!   phase changes and finalizer removal) are never refused: a request whose
//!   `userInfo.username` is one of the server's own names (`ClaimGuard::trust`; in a pod,
//!   its service account, read from the mounted token) is admitted without a look. The chart
//!   also leaves them out with a `matchCondition`, so they cost no call at all.
//!
//! "The pod runs" is answered without an API call: the pod with the claim's `spec.podUid`
//! is in the reconciler's pod cache (pods carrying our IP label or annotations, any phase
//! until the pod object is gone) or in the pod-IP index (pods with `status.podIPs`, not
//! finished). This is what the claim's finalizer waits for too. Until those caches have
//! synced, or off-cluster where there are none, the answer is "cannot tell", and the
//! deletion is refused with the same way to force it.

use std::sync::{Arc, OnceLock, RwLock};

use serde::Deserialize;

use ip_webhook_admission::{Incoming, Operation, Response, ReviewError};
use ip_webhook_ledger::Phase;
use ip_webhook_ledger::crd::{self, IPClaim};
use ip_webhook_ledger::kubernetes::from_resource;

/// The annotation that lets a hand edit of an IPClaim through.
pub(crate) const FORCE: &str = "ip-webhook.io/force";

/// Where the in-pod service account's token is mounted.
const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// What the caches say about a claim's pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PodLife {
    /// The pod exists: `namespace/name`.
    Runs(String),
    Gone,
    /// The caches have not synced (or there are none): no answer.
    Unknown(&'static str),
}

/// Who knows which pods run, by UID.
pub(crate) trait LivePods: Send + Sync {
    fn life(&self, uid: &str) -> PodLife;
}

/// The guard's state: the server's own user names and the pod caches.
#[derive(Default)]
pub(crate) struct ClaimGuard {
    trusted: RwLock<Vec<String>>,
    pods: OnceLock<Arc<dyn LivePods>>,
}

impl ClaimGuard {
    /// Admit every IPClaim write by `username` (the server's own service account).
    pub(crate) fn trust(&self, username: &str) {
        let username = username.trim();
        if username.is_empty() {
            return;
        }
        let mut trusted = self.trusted.write().unwrap_or_else(|p| p.into_inner());
        if !trusted.iter().any(|t| t == username) {
            trusted.push(username.to_string());
        }
    }

    fn is_trusted(&self, username: &str) -> bool {
        self.trusted
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|t| t == username)
    }

    /// Judge deletions from these caches (in-cluster; set once).
    pub(crate) fn watch_pods(&self, pods: Arc<dyn LivePods>) {
        let _ = self.pods.set(pods);
    }

    fn life(&self, uid: &str) -> PodLife {
        match self.pods.get() {
            Some(pods) => pods.life(uid),
            None => PodLife::Unknown("this server watches no pods (it is not in-cluster)"),
        }
    }
}

/// The user name in a service-account token (`sub` of the JWT): what the API server puts in
/// `userInfo.username` for the server's own requests. `None` when the text is not such a token.
pub(crate) fn username_in_token(token: &str) -> Option<String> {
    use base64::Engine;
    let payload = token.trim().split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    #[derive(Deserialize)]
    struct Claims {
        sub: Option<String>,
    }
    let sub = serde_json::from_slice::<Claims>(&bytes).ok()?.sub?;
    sub.starts_with("system:serviceaccount:").then_some(sub)
}

/// The service account this process runs as, from its mounted token, if it runs in a pod.
pub(crate) fn own_service_account() -> Option<String> {
    username_in_token(&std::fs::read_to_string(SERVICE_ACCOUNT_TOKEN).ok()?)
}

/// Annotate the IPClaim of `ip` with `FORCE` (`release --force` in-cluster), so that its
/// deletion by the operator's user passes the guard. A missing claim is not an error.
pub async fn mark_forced(client: &kube::Client, ip: &std::net::IpAddr) -> Result<(), kube::Error> {
    let claims: kube::Api<IPClaim> = kube::Api::all(client.clone());
    let patch = serde_json::json!({"metadata": {"annotations": {FORCE: "true"}}});
    match claims
        .patch(
            &ip_webhook_ledger::kubernetes::claim_name(ip),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}

/// Whether this review is the guard's: an IPClaim.
pub(crate) fn handles(incoming: &Incoming<'_>) -> bool {
    let kind = &incoming.request.kind;
    kind.group == crd::GROUP && kind.kind == "IPClaim"
}

fn forced(claim: &IPClaim) -> bool {
    claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(FORCE))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

fn name_of(claim: &IPClaim, incoming: &Incoming<'_>) -> String {
    claim
        .metadata
        .name
        .clone()
        .or_else(|| incoming.request.name.as_deref().map(str::to_string))
        .unwrap_or_default()
}

/// The `spec` fields that differ, by their JSON names.
fn changed_fields(old: &IPClaim, new: &IPClaim) -> Vec<String> {
    differing(
        "spec",
        serde_json::to_value(&old.spec),
        serde_json::to_value(&new.spec),
    )
}

/// The `status` fields that differ, by their JSON names.
fn changed_status(old: &IPClaim, new: &IPClaim) -> Vec<String> {
    differing(
        "status",
        serde_json::to_value(&old.status),
        serde_json::to_value(&new.status),
    )
}

/// The keys of two JSON objects whose values differ, as `part.key`.
fn differing(
    part: &str,
    old: serde_json::Result<serde_json::Value>,
    new: serde_json::Result<serde_json::Value>,
) -> Vec<String> {
    let as_map = |value: serde_json::Result<serde_json::Value>| match value {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    let (old, new) = (as_map(old), as_map(new));
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| old.get(*k) != new.get(*k))
        .map(|k| format!("{part}.{k}"))
        .collect()
}

/// Why the claim of a review cannot be read: the denial, naming the claim (`what`) and the
/// field.
#[derive(Debug, thiserror::Error)]
enum UnreadClaim {
    #[error("an IPClaim {operation} review must carry {field}; refusing IPClaim {what:?} unjudged")]
    Missing {
        operation: &'static str,
        field: &'static str,
        what: String,
    },
    #[error("IPClaim {what:?}: {field} is not an IPClaim ({reason}); refusing it unjudged")]
    NotAClaim {
        what: String,
        field: &'static str,
        reason: String,
    },
    #[error("IPClaim {what:?}: {source}")]
    Review { what: String, source: ReviewError },
}

/// The claim in `object` (or `oldObject`); `Err` is the denial for a claim that cannot be read.
fn claim_in(incoming: &Incoming<'_>, old: bool) -> Result<IPClaim, UnreadClaim> {
    let field = if old {
        "request.oldObject"
    } else {
        "request.object"
    };
    let what = incoming.request.name.as_deref().unwrap_or("").to_string();
    match incoming.object::<IPClaim>(old) {
        Ok(Some(claim)) => Ok(claim),
        Ok(None) => Err(UnreadClaim::Missing {
            operation: incoming.request.operation.as_str(),
            field,
            what,
        }),
        Err(ReviewError::BadObject { reason, .. }) => Err(UnreadClaim::NotAClaim {
            what,
            field,
            reason,
        }),
        Err(source) => Err(UnreadClaim::Review { what, source }),
    }
}

/// Judge an IPClaim review.
pub(crate) fn review(guard: &ClaimGuard, incoming: &Incoming<'_>) -> Response {
    let response = incoming.respond();
    let request = &incoming.request;
    let status_write = match request.sub_resource.as_deref() {
        None => false,
        Some("status") => true,
        Some(_) => return response,
    };
    if !matches!(request.operation, Operation::Update | Operation::Delete) {
        return response;
    }
    if incoming
        .username()
        .is_some_and(|user| guard.is_trusted(&user))
    {
        return response;
    }
    let old = match claim_in(incoming, true) {
        Ok(old) => old,
        Err(unread) => return response.deny(unread.to_string()),
    };
    if let Some(name) = request.name.as_deref()
        && !name.is_empty()
        && old.metadata.name.as_deref().is_some_and(|n| n != name)
    {
        return response.deny(format!(
            "request.name {name:?} is not request.oldObject.metadata.name {:?}; refusing IPClaim {name:?} unjudged",
            old.metadata.name.as_deref().unwrap_or("")
        ));
    }
    let name = name_of(&old, incoming);
    match request.operation {
        Operation::Update => {
            let new = match claim_in(incoming, false) {
                Ok(new) => new,
                Err(unread) => return response.deny(unread.to_string()),
            };
            let changed = if status_write {
                changed_status(&old, &new)
            } else {
                changed_fields(&old, &new)
            };
            if changed.is_empty() {
                return response;
            }
            let holder = holder_text(&old);
            // a status write carries the object's metadata as stored: the force mark is set
            // beforehand with a metadata edit
            if forced(&new) || (status_write && forced(&old)) {
                return response.warn(format!(
                    "IPClaim {name}: {} edited by hand ({FORCE}=true); ip-webhook treats a claim whose name and spec.ip disagree as unreadable and keeps its IP held",
                    changed.join(", ")
                ));
            }
            let part = if status_write { "status" } else { "spec" };
            let how = if status_write {
                format!("set the annotation {FORCE}: \"true\" on the IPClaim first")
            } else {
                format!("set the annotation {FORCE}: \"true\" in the same change")
            };
            response.deny(format!(
                "IPClaim {name} is ip-webhook's record of IP {} ({holder}); its {part} is written by ip-webhook only ({} changed). To force the edit, {how}",
                old.spec.ip,
                changed.join(", ")
            ))
        }
        Operation::Delete => judge_delete(guard, &old, &name, response),
        _ => response,
    }
}

/// `pod default/web-0, phase Bound`.
fn holder_text(claim: &IPClaim) -> String {
    let phase = claim
        .status
        .as_ref()
        .map(|s| s.phase.as_str())
        .filter(|p| !p.is_empty())
        .unwrap_or("Reserved");
    let pod = if claim.spec.pod_name.is_empty() {
        format!("{}/{}*", claim.spec.namespace, claim.spec.generate_name)
    } else {
        format!("{}/{}", claim.spec.namespace, claim.spec.pod_name)
    };
    format!("pod {pod}, phase {phase}")
}

fn judge_delete(guard: &ClaimGuard, old: &IPClaim, name: &str, response: Response) -> Response {
    if forced(old) {
        return response.warn(format!(
            "IPClaim {name} deleted by force ({FORCE}=true): its IP is free once the finalizer ip-webhook.io/pod-gone comes off (when its pod is gone, or by hand)"
        ));
    }
    // An unreadable record (edited by force) is judged by what it says about its pod.
    let (phase, uid) = match from_resource(old) {
        Ok(claim) => (claim.phase, claim.pod.uid.map(String::from)),
        Err(_) => {
            let phase = match old.status.as_ref().map(|s| s.phase.as_str()) {
                Some("Released") => Phase::Released,
                Some("Terminating") => Phase::Terminating,
                Some("Bound") => Phase::Bound,
                _ => Phase::Reserved,
            };
            (phase, old.spec.pod_uid.clone().filter(|u| !u.is_empty()))
        }
    };
    if phase == Phase::Released {
        return response;
    }
    let Some(uid) = uid else {
        // a reservation no pod has taken up: the reconciler would drop it at its TTL anyway
        return response;
    };
    let how = format!(
        "delete the pod instead, or force: kubectl annotate ipclaim {name} {FORCE}=true, then kubectl delete ipclaim {name}"
    );
    match guard.life(&uid) {
        PodLife::Gone => response,
        PodLife::Runs(pod) => response.deny(format!(
            "IPClaim {name} records IP {} for pod {pod} (uid {uid}, phase {phase:?}), which is running: deleting the claim would let the IP be handed out again; {how}",
            old.spec.ip
        )),
        PodLife::Unknown(why) => response.deny(format!(
            "IPClaim {name} records IP {} for pod {}/{} (uid {uid}, phase {phase:?}) and whether that pod runs cannot be told ({why}); retry in a moment, or {how}",
            old.spec.ip, old.spec.namespace, old.spec.pod_name
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ip_webhook_admission::decode;
    use serde_json::{Value, json};
    use std::collections::HashMap;

    const SA: &str = "system:serviceaccount:ip-webhook-system:ip-webhook";

    struct Pods(HashMap<String, PodLife>);

    impl LivePods for Pods {
        fn life(&self, uid: &str) -> PodLife {
            self.0.get(uid).cloned().unwrap_or(PodLife::Gone)
        }
    }

    fn guard() -> ClaimGuard {
        let guard = ClaimGuard::default();
        guard.trust(SA);
        guard.watch_pods(Arc::new(Pods(HashMap::from([(
            "uid-web-0".to_string(),
            PodLife::Runs("default/web-0".into()),
        )]))));
        guard
    }

    fn claim(phase: &str, annotations: Value) -> Value {
        json!({
            "apiVersion": "ip-webhook.io/v1alpha1", "kind": "IPClaim",
            "metadata": {"name": "10.0.0.5", "annotations": annotations,
                         "finalizers": ["ip-webhook.io/pod-gone"]},
            "spec": {"ip": "10.0.0.5", "namespace": "default", "app": "web", "podName": "web-0",
                     "podUid": "uid-web-0", "requestUid": "r", "source": "Allocated"},
            "status": {"phase": phase},
        })
    }

    fn body(operation: &str, user: &str, object: Value, old: Value) -> String {
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u-1", "operation": operation, "name": "10.0.0.5",
                "kind": {"group": "ip-webhook.io", "version": "v1alpha1", "kind": "IPClaim"},
                "resource": {"group": "ip-webhook.io", "version": "v1alpha1", "resource": "ipclaims"},
                "userInfo": {"username": user, "groups": ["system:authenticated"]},
                "object": object, "oldObject": old,
            }
        })
        .to_string()
    }

    fn judge(guard: &ClaimGuard, body: &str) -> Response {
        let incoming = decode(body.as_bytes()).unwrap();
        assert!(handles(&incoming));
        review(guard, &incoming)
    }

    #[test]
    fn a_spec_edit_is_refused_unless_forced_and_metadata_edits_pass() {
        let guard = guard();
        let old = claim("Bound", json!({}));
        let mut edited = old.clone();
        edited["spec"]["ip"] = json!("10.0.0.9");
        let refused = judge(
            &guard,
            &body("UPDATE", "kubernetes-admin", edited.clone(), old.clone()),
        );
        assert!(!refused.allowed);
        let message = refused.message.unwrap();
        assert!(message.contains("IPClaim 10.0.0.5"), "{message}");
        assert!(
            message.contains("pod default/web-0, phase Bound"),
            "{message}"
        );
        assert!(message.contains("spec.ip changed"), "{message}");
        assert!(
            message.contains("ip-webhook.io/force: \"true\""),
            "{message}"
        );

        edited["metadata"]["annotations"] = json!({FORCE: "true"});
        let forced = judge(
            &guard,
            &body("UPDATE", "kubernetes-admin", edited, old.clone()),
        );
        assert!(forced.allowed);
        assert_eq!(forced.warnings.len(), 1);

        let mut finalizer_off = old.clone();
        finalizer_off["metadata"]["finalizers"] = json!(null);
        finalizer_off["metadata"]["annotations"] = json!({"note": "x"});
        assert!(
            judge(
                &guard,
                &body("UPDATE", "kubernetes-admin", finalizer_off, old)
            )
            .allowed
        );
    }

    #[test]
    fn the_servers_own_writes_are_never_refused() {
        let guard = guard();
        let old = claim("Reserved", json!({}));
        let mut bound = old.clone();
        bound["spec"]["podUid"] = json!("uid-other");
        assert!(judge(&guard, &body("UPDATE", SA, bound.clone(), old.clone())).allowed);
        assert!(
            judge(
                &guard,
                &body("DELETE", SA, json!(null), claim("Bound", json!({})))
            )
            .allowed
        );
        // another service account is not the server
        let other = "system:serviceaccount:ip-webhook-system:default";
        assert!(!judge(&guard, &body("UPDATE", other, bound, old)).allowed);
    }

    #[test]
    fn deleting_a_running_pods_claim_is_refused_unless_the_claim_was_annotated() {
        let guard = guard();
        let refused = judge(
            &guard,
            &body("DELETE", "jane", json!(null), claim("Bound", json!({}))),
        );
        assert!(!refused.allowed);
        let message = refused.message.unwrap();
        for part in [
            "IPClaim 10.0.0.5",
            "pod default/web-0",
            "uid-web-0",
            "kubectl annotate ipclaim 10.0.0.5 ip-webhook.io/force=true",
            "kubectl delete ipclaim 10.0.0.5",
        ] {
            assert!(message.contains(part), "{part:?} in {message}");
        }
        let forced = claim("Bound", json!({FORCE: "true"}));
        assert!(judge(&guard, &body("DELETE", "jane", json!(null), forced)).allowed);
        assert!(
            judge(
                &guard,
                &body("DELETE", "jane", json!(null), claim("Released", json!({})))
            )
            .allowed
        );
        // pod gone: nothing to protect
        let mut gone = claim("Bound", json!({}));
        gone["spec"]["podUid"] = json!("uid-gone");
        assert!(judge(&guard, &body("DELETE", "jane", json!(null), gone)).allowed);
    }

    #[test]
    fn without_pod_caches_a_deletion_cannot_be_judged_and_is_refused() {
        let guard = ClaimGuard::default();
        let refused = judge(
            &guard,
            &body("DELETE", "jane", json!(null), claim("Bound", json!({}))),
        );
        assert!(!refused.allowed);
        assert!(
            refused
                .message
                .unwrap()
                .contains("cannot be told (this server watches no pods")
        );
    }

    #[test]
    fn a_malformed_claim_is_refused_naming_the_field() {
        let guard = guard();
        let refused = judge(
            &guard,
            &body(
                "UPDATE",
                "jane",
                json!({"spec": "nope"}),
                claim("Bound", json!({})),
            ),
        );
        assert!(!refused.allowed);
        let message = refused.message.unwrap();
        assert!(
            message.contains("request.object is not an IPClaim"),
            "{message}"
        );
        let missing = judge(&guard, &body("DELETE", "jane", json!(null), json!(null)));
        assert!(
            missing
                .message
                .unwrap()
                .contains("must carry request.oldObject")
        );
    }

    #[test]
    fn the_username_is_read_from_a_service_account_token() {
        use base64::Engine;
        let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let token = format!(
            "{}.{}.sig",
            engine.encode(br#"{"alg":"RS256"}"#),
            engine.encode(format!(r#"{{"iss":"x","sub":"{SA}"}}"#))
        );
        assert_eq!(username_in_token(&token).as_deref(), Some(SA));
        assert_eq!(username_in_token("not-a-token"), None);
        let user = format!("a.{}.b", engine.encode(br#"{"sub":"jane"}"#));
        assert_eq!(username_in_token(&user), None);
    }
}
