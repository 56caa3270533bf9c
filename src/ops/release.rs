//! `release`: free a leaked claim, safely. A claim whose pod still runs is never freed unless
//! forced; when the pods cannot be listed (off-cluster) it must be forced too, and says so.

use std::net::IpAddr;

use ip_webhook_ledger::pod_lookup::{PodLookup, PodState};
use ip_webhook_ledger::{Claim, Ledger, LedgerError, Phase, unix_now};

/// What the operator asks to free.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Request {
    pub(crate) ip: IpAddr,
    /// Free it even when the pod still runs or cannot be checked.
    pub(crate) force: bool,
    /// Free it only if its pod is in this namespace (kubectl's -n, as a guard: an IP names its
    /// claim cluster-wide).
    pub(crate) namespace: Option<String>,
    /// Free it only if its claim is still for this pod, as `status` and `check --drift` name
    /// it (`namespace/name`, `namespace/generateName*`): a report's finding, not whatever
    /// holds the IP now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pod: Option<String>,
    /// Free it only if its claim is still this very claim (its grant and pod UID): a report
    /// about a gone pod must not free the claim of the pod that took its name since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) claim: Option<FoundClaim>,
    /// Free it only once it has not changed for this many seconds ([`settled`]): a claim
    /// bound a moment ago may have its pod between `/validate` and the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) settle: Option<u64>,
    /// Judge it under the same rule, and free nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) dry_run: bool,
}

/// Which claim a report found: its grant (the admission request and token) and the pod UID it
/// was bound to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FoundClaim {
    pub(crate) request_uid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pod_uid: Option<String>,
}

impl FoundClaim {
    pub(crate) fn of(claim: &Claim) -> FoundClaim {
        FoundClaim {
            request_uid: claim.request_uid.to_string(),
            token: claim.token.to_string(),
            pod_uid: claim.pod.uid.as_deref().map(str::to_string),
        }
    }

    /// Whether `claim` is still the claim found.
    pub(crate) fn is(&self, claim: &Claim) -> bool {
        *self == FoundClaim::of(claim)
    }
}

/// Whether `claim` has stood still for `settle` seconds at `now`, and is not waiting out a
/// DELETE's grace: a claim made or bound at admission is a promise until its pod is stored,
/// and may look podless for that long.
pub(crate) fn settled(claim: &Claim, now: u64, settle: u64) -> bool {
    if claim.phase == Phase::Terminating && claim.release_at.is_some_and(|at| at.get() > now) {
        return false; // its pod may be gone; the IP waits for release_at by design
    }
    claim
        .updated_at
        .max(claim.created_at)
        .saturating_add(settle)
        <= now
}

impl Request {
    /// Free `ip` (`--force`, `-n` as given).
    pub(crate) fn one(ip: IpAddr, force: bool, namespace: Option<String>) -> Request {
        Request {
            ip,
            force,
            namespace,
            pod: None,
            claim: None,
            settle: None,
            dry_run: false,
        }
    }
}

/// A `check --drift -o json` report that `release --from-report` cannot use.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct ReportError(String);

/// The requests `release --from-report` makes of a `check --drift -o json` report: one per
/// `claim-without-pod` finding (the only kind whose fix is freeing a claim; a CNI's record of
/// a gone pod is the CNI's to free), each freed only if its claim is still the very claim the
/// report found (its grant and pod UID, not only its pod's name, which a recreated pod takes),
/// has not changed for `settle` seconds, and its pod is gone, never forced. `namespace`
/// keeps the findings about pods of one namespace; `dry_run` frees nothing.
pub(crate) fn requests_from_report(
    text: &str,
    namespace: Option<&str>,
    settle: u64,
    dry_run: bool,
) -> Result<Vec<Request>, ReportError> {
    #[derive(serde::Deserialize)]
    struct Report {
        drift: Vec<Finding>,
    }
    #[derive(serde::Deserialize)]
    struct Finding {
        kind: String,
        ip: IpAddr,
        pod: String,
        claim: Option<FoundClaim>,
    }
    let report: Report = serde_json::from_str(text).map_err(|e| {
        ReportError(format!(
            "not a report of `check --drift -o json` (a JSON object with a \"drift\" list of findings with kind, ip and pod): {e}"
        ))
    })?;
    report
        .drift
        .into_iter()
        .filter(|finding| finding.kind == "claim-without-pod")
        .filter(|finding| namespace.is_none_or(|ns| finding.pod.split('/').next() == Some(ns)))
        .map(|finding| {
            let claim = finding.claim.ok_or_else(|| {
                ReportError(format!(
                    "the finding about {} names no claim (its \"claim\" is missing): make the report again with this version's `check --drift -o json`",
                    finding.ip
                ))
            })?;
            Ok(Request {
                pod: Some(finding.pod),
                claim: Some(claim),
                settle: Some(settle),
                dry_run,
                ..Request::one(finding.ip, false, namespace.map(str::to_string))
            })
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Freed; `forced` when the pod was live or could not be checked.
    Released { claim: Box<Claim>, forced: bool },
    /// No held claim on the IP.
    NotHeld,
    /// The pod still runs; not freed.
    PodLive(Box<Claim>),
    /// The pod could not be checked; not freed.
    Unchecked { claim: Box<Claim>, why: String },
    /// The claim changed while we looked (another admission or the reconciler); not freed.
    Changed(Box<Claim>),
    /// The claim's pod is not in the namespace the operator named; not freed.
    OtherNamespace {
        claim: Box<Claim>,
        namespace: String,
    },
    /// The claim is now another pod's than the one the request named; not freed.
    OtherPod { claim: Box<Claim>, pod: String },
    /// The claim changed within the request's settle time; not freed.
    Recent { claim: Box<Claim>, settle: u64 },
    /// A dry run: the rule would free it.
    WouldRelease { claim: Box<Claim>, forced: bool },
}

impl Outcome {
    /// What happened, for people.
    pub(crate) fn message(&self, ip: &IpAddr) -> String {
        let about = |c: &Claim| {
            let app = if c.app.is_empty() {
                String::new()
            } else {
                format!(" of app {}", c.app_key())
            };
            format!(
                "{ip} ({:?}, held by {}{app} since {})",
                c.phase,
                c.named_holder(),
                ip_webhook_ipam::usage::rfc3339(c.created_at)
            )
        };
        match self {
            Outcome::Released { claim, forced } => format!(
                "released {}{}; it can be allocated again",
                about(claim),
                if *forced { " (forced)" } else { "" }
            ),
            Outcome::NotHeld => format!("nothing to release: no claim holds {ip}"),
            Outcome::PodLive(claim) => format!(
                "refused: {} still exists and holds {}; delete the {} instead, or pass --force to free the IP under it (it could then be given twice)",
                claim.named_holder(),
                about(claim),
                if claim.vm.is_some() { "VM" } else { "pod" }
            ),
            Outcome::Unchecked { claim, why } => format!(
                "refused: cannot tell whether {} still runs ({why}); if you know it is gone, rerun with --force to release {}",
                claim.named_holder(),
                about(claim)
            ),
            Outcome::OtherNamespace { claim, namespace } => format!(
                "not released: {ip} is claimed for {}, not in namespace {namespace}",
                claim.named_holder()
            ),
            Outcome::OtherPod { claim, pod } => format!(
                "not released: {} is no longer the claim of pod {pod} the report found",
                about(claim)
            ),
            Outcome::Recent { claim, settle } => format!(
                "not released: {} changed within the last {settle} s; its pod may still be on its way to the API server, look again later",
                about(claim)
            ),
            Outcome::WouldRelease { claim, forced } => format!(
                "would release {}{}",
                about(claim),
                if *forced { " (forced)" } else { "" }
            ),
            Outcome::Changed(claim) => format!(
                "not released: the claim on {} changed while releasing it; look again with `{} status`",
                about(claim),
                crate::ops::invocation()
            ),
        }
    }

    /// Freed, or (a dry run) it would be.
    pub(crate) fn released(&self) -> bool {
        matches!(
            self,
            Outcome::Released { .. } | Outcome::WouldRelease { .. }
        )
    }
}

/// Release the held claim on `request.ip`, if its pod is gone (or `request.force`).
pub(crate) async fn release(
    ledger: &dyn Ledger,
    pods: &dyn PodLookup,
    request: &Request,
) -> Result<Outcome, LedgerError> {
    let claims = ledger.load().await?;
    release_from(claims, pods, request, async |claim| {
        ledger.release(claim).await
    })
    .await
}

/// The one rule of `release`, over `claims` as the caller sees them; `free` frees a claim and
/// says whether it was still as seen (the running server frees through its allocator, so its
/// held set and the ledger agree).
pub(crate) async fn release_from(
    claims: impl IntoIterator<Item = Claim>,
    pods: &dyn PodLookup,
    request: &Request,
    free: impl AsyncFnOnce(&Claim) -> Result<bool, LedgerError>,
) -> Result<Outcome, LedgerError> {
    let Some(claim) = claims
        .into_iter()
        .find(|c| c.ip == request.ip && c.is_held())
    else {
        return Ok(Outcome::NotHeld);
    };
    if let Some(namespace) = &request.namespace
        && &claim.pod.namespace != namespace
    {
        return Ok(Outcome::OtherNamespace {
            claim: Box::new(claim),
            namespace: namespace.clone(),
        });
    }
    let another = request
        .claim
        .as_ref()
        .is_some_and(|found| !found.is(&claim));
    if let Some(pod) = &request.pod
        && (claim.pod.display() != *pod || another)
    {
        return Ok(Outcome::OtherPod {
            claim: Box::new(claim),
            pod: pod.clone(),
        });
    }
    if let Some(settle) = request.settle
        && !settled(&claim, unix_now(), settle)
    {
        return Ok(Outcome::Recent {
            claim: Box::new(claim),
            settle,
        });
    }
    let forced = match pods.state(&claim).await {
        PodState::Gone => false,
        PodState::Live if request.force => true,
        PodState::Live => return Ok(Outcome::PodLive(Box::new(claim))),
        PodState::Unknown(_) if request.force => true,
        PodState::Unknown(why) => {
            return Ok(Outcome::Unchecked {
                claim: Box::new(claim),
                why,
            });
        }
    };
    if request.dry_run {
        return Ok(Outcome::WouldRelease {
            claim: Box::new(claim),
            forced,
        });
    }
    if free(&claim).await? {
        Ok(Outcome::Released {
            claim: Box::new(claim),
            forced,
        })
    } else {
        Ok(Outcome::Changed(Box::new(claim)))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use async_trait::async_trait;
    use ip_webhook_ledger::pod_lookup::NoPodList;
    use ip_webhook_ledger::{CreateOutcome, MemoryLedger};

    struct Fixed(PodState);

    #[async_trait]
    impl PodLookup for Fixed {
        async fn state(&self, _claim: &Claim) -> PodState {
            self.0.clone()
        }
    }

    /// A Bound claim of app `web` for pod `namespace/web-0` (UID `u1`), on `ip`.
    pub(crate) fn bound(ip: &str, namespace: &str) -> Claim {
        crate::test_claims::builder(ip, "web", "web-0")
            .namespace(namespace)
            .uid("u1")
            .bound()
            .request("r")
            .list_size(2)
            .at(0)
            .build()
    }

    async fn ledger_with(ip: &str) -> MemoryLedger {
        let ledger = MemoryLedger::new();
        assert_eq!(
            ledger.create(bound(ip, "default").into()).await.unwrap(),
            CreateOutcome::Created
        );
        ledger
    }

    fn ask(ip: IpAddr, force: bool) -> Request {
        Request::one(ip, force, None)
    }

    fn held(ledger_claims: &[Claim]) -> usize {
        ledger_claims.iter().filter(|c| c.is_held()).count()
    }

    #[tokio::test]
    async fn a_live_or_unknown_pod_needs_force() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let ledger = ledger_with("10.0.0.1").await;
        let live = release(&ledger, &Fixed(PodState::Live), &ask(ip, false))
            .await
            .unwrap();
        assert!(matches!(live, Outcome::PodLive(_)), "{live:?}");
        let unknown = release(&ledger, &NoPodList("off-cluster".into()), &ask(ip, false))
            .await
            .unwrap();
        assert!(
            unknown
                .message(&ip)
                .contains("(off-cluster); if you know it is gone, rerun with --force"),
            "{}",
            unknown.message(&ip)
        );
        assert_eq!(held(&ledger.load().await.unwrap()), 1);
        let forced = release(&ledger, &NoPodList("off-cluster".into()), &ask(ip, true))
            .await
            .unwrap();
        assert_eq!(
            forced.message(&ip),
            "released 10.0.0.1 (Bound, held by pod default/web-0 of app default/web since 1970-01-01T00:00:00Z) (forced); it can be allocated again"
        );
        assert_eq!(held(&ledger.load().await.unwrap()), 0);
        let again = release(&ledger, &Fixed(PodState::Gone), &ask(ip, false))
            .await
            .unwrap();
        assert_eq!(again, Outcome::NotHeld);
    }

    #[tokio::test]
    async fn a_gone_pod_is_released_without_force() {
        let ip: IpAddr = "10.0.0.2".parse().unwrap();
        let ledger = ledger_with("10.0.0.2").await;
        let outcome = release(&ledger, &Fixed(PodState::Gone), &ask(ip, false))
            .await
            .unwrap();
        assert!(
            matches!(outcome, Outcome::Released { forced: false, .. }),
            "{outcome:?}"
        );
        assert_eq!(held(&ledger.load().await.unwrap()), 0);
    }

    /// A `check --drift -o json` report: findings about claims that hold (10.0.0.3), that
    /// another pod holds now (10.0.0.4), in another namespace (10.0.0.5), a CNI's record
    /// (10.0.0.6), a claim a recreated pod of the name made since (10.0.0.7) and a claim that
    /// changed a moment ago (`recent`, 10.0.0.8).
    fn report_of(recent: &Claim) -> String {
        let found = |ip: &str| serde_json::to_value(FoundClaim::of(&bound(ip, "default"))).unwrap();
        // the web-0 the report found was replaced by a new web-0 (another grant, another UID)
        let mut old_web_0 = bound("10.0.0.7", "default");
        old_web_0.request_uid = "r-old".into();
        old_web_0.pod.uid = Some("u-old".into());
        serde_json::json!({"drift": [
            {"kind": "claim-without-pod", "ip": "10.0.0.3", "pod": "default/web-0", "detail": "…", "claim": found("10.0.0.3")},
            {"kind": "claim-without-pod", "ip": "10.0.0.4", "pod": "default/web-9", "detail": "…", "claim": found("10.0.0.4")},
            {"kind": "claim-without-pod", "ip": "10.0.0.5", "pod": "other/web-0", "detail": "…", "claim": found("10.0.0.5")},
            {"kind": "cni-holds-gone-pod", "ip": "10.0.0.6", "pod": "default/gone", "detail": "…"},
            {"kind": "claim-without-pod", "ip": "10.0.0.7", "pod": "default/web-0", "detail": "…", "claim": FoundClaim::of(&old_web_0)},
            {"kind": "claim-without-pod", "ip": "10.0.0.8", "pod": "default/web-0", "detail": "…", "claim": FoundClaim::of(recent)},
        ], "compared": {}})
        .to_string()
    }

    /// A report's findings: each freed under the one rule, only while its claim is still the
    /// very claim the report found (not another pod's, not one a recreated pod of the same
    /// name made since) and has stood still for the settle time; a dry run judges them alike
    /// and frees nothing.
    #[tokio::test]
    async fn a_report_frees_only_its_own_findings_while_they_hold() {
        let ledger = ledger_with("10.0.0.3").await;
        for ip in ["10.0.0.4", "10.0.0.7"] {
            ledger.create(bound(ip, "default").into()).await.unwrap();
        }
        let mut recent = bound("10.0.0.8", "default");
        recent.updated_at = unix_now();
        ledger.create(recent.clone().into()).await.unwrap();
        let report = report_of(&recent);
        let requests = requests_from_report(&report, Some("default"), 120, true).unwrap();
        let ips: Vec<String> = requests.iter().map(|r| r.ip.to_string()).collect();
        assert_eq!(
            ips,
            ["10.0.0.3", "10.0.0.4", "10.0.0.7", "10.0.0.8"],
            "one namespace, claims only"
        );
        assert!(requests.iter().all(|r| r.dry_run && !r.force));

        let mut messages = Vec::new();
        for request in &requests {
            let outcome = release(&ledger, &Fixed(PodState::Gone), request)
                .await
                .unwrap();
            messages.push(outcome.message(&request.ip));
        }
        assert!(
            messages[0].starts_with("would release 10.0.0.3 (Bound"),
            "{messages:?}"
        );
        assert!(
            messages[1].contains("is no longer the claim of pod default/web-9"),
            "{messages:?}"
        );
        assert!(
            messages[2].contains("is no longer the claim of pod default/web-0"),
            "a recreated pod of the name has another claim: {messages:?}"
        );
        assert!(
            messages[3].contains("changed within the last 120 s"),
            "{messages:?}"
        );
        assert_eq!(
            held(&ledger.load().await.unwrap()),
            4,
            "a dry run frees nothing"
        );

        let applied = requests_from_report(&report, None, 120, false).unwrap();
        assert_eq!(applied.len(), 5);
        let outcome = release(&ledger, &Fixed(PodState::Gone), &applied[0])
            .await
            .unwrap();
        assert!(
            matches!(outcome, Outcome::Released { forced: false, .. }),
            "{outcome:?}"
        );
        let live = release(&ledger, &Fixed(PodState::Live), &applied[1])
            .await
            .unwrap();
        assert!(matches!(live, Outcome::OtherPod { .. }), "{live:?}");
        for request in &applied[3..] {
            let outcome = release(&ledger, &Fixed(PodState::Gone), request)
                .await
                .unwrap();
            assert!(!outcome.released(), "{outcome:?}");
        }
        assert_eq!(held(&ledger.load().await.unwrap()), 3);
    }

    /// What is not a report of `check --drift -o json`, or names no claim, is refused.
    #[test]
    fn a_report_without_claims_is_refused() {
        let error = requests_from_report("[1, 2]", None, 120, true)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("not a report of `check --drift -o json`"),
            "{error}"
        );
        let unnamed = serde_json::json!({"drift": [
            {"kind": "claim-without-pod", "ip": "10.0.0.3", "pod": "default/web-0", "detail": "…"},
        ]})
        .to_string();
        let error = requests_from_report(&unnamed, None, 120, true)
            .unwrap_err()
            .to_string();
        assert!(error.contains("names no claim"), "{error}");
    }
}
