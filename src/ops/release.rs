//! `release`: free a leaked claim, safely. A claim whose pod still runs is never freed unless
//! forced; when the pods cannot be listed (off-cluster) it must be forced too, and says so.

use std::net::IpAddr;

use crate::ledger::pod_lookup::{PodLookup, PodState};
use crate::ledger::{Claim, Ledger, LedgerError};

/// What the operator asks to free.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    pub ip: IpAddr,
    /// Free it even when the pod still runs or cannot be checked.
    pub force: bool,
    /// Free it only if its pod is in this namespace (kubectl's -n, as a guard: an IP names its
    /// claim cluster-wide).
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
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
}

impl Outcome {
    /// What happened, for people.
    pub fn message(&self, ip: &IpAddr) -> String {
        let about = |c: &Claim| {
            let app = if c.app.is_empty() {
                String::new()
            } else {
                format!(" of app {}", c.app_key())
            };
            format!(
                "{ip} ({:?}, held by pod {}{app} since {})",
                c.phase,
                c.pod.display(),
                crate::ipam::usage::rfc3339(c.created_at)
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
                "refused: pod {} still exists and holds {}; delete the pod instead, or pass --force to free the IP under it (it could then be given twice)",
                claim.pod.display(),
                about(claim)
            ),
            Outcome::Unchecked { claim, why } => format!(
                "refused: cannot tell whether pod {} still runs ({why}); if you know it is gone, rerun with --force to release {}",
                claim.pod.display(),
                about(claim)
            ),
            Outcome::OtherNamespace { claim, namespace } => format!(
                "not released: {ip} is claimed for pod {}, not in namespace {namespace}",
                claim.pod.display()
            ),
            Outcome::Changed(claim) => format!(
                "not released: the claim on {} changed while releasing it; look again with `{} status`",
                about(claim),
                crate::ops::invocation()
            ),
        }
    }

    pub fn released(&self) -> bool {
        matches!(self, Outcome::Released { .. })
    }
}

/// Release the held claim on `request.ip`, if its pod is gone (or `request.force`).
pub async fn release(
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
pub async fn release_from(
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
    use crate::ledger::pod_lookup::NoPodList;
    use crate::ledger::{CreateOutcome, MemoryLedger, Phase, PodRef, Source};
    use async_trait::async_trait;

    struct Fixed(PodState);

    #[async_trait]
    impl PodLookup for Fixed {
        async fn state(&self, _claim: &Claim) -> PodState {
            self.0.clone()
        }
    }

    /// A Bound claim of app `web` for pod `namespace/web-0` (UID `u1`), on `ip`.
    pub(crate) fn bound(ip: &str, namespace: &str) -> Claim {
        Claim {
            ip: ip.parse().unwrap(),
            app: "web".into(),
            pool: None,
            pod: PodRef {
                namespace: namespace.into(),
                name: "web-0".into(),
                uid: Some("u1".into()),
                ..Default::default()
            },
            request_uid: "r".into(),
            phase: Phase::Bound,
            source: Source::Allocated,
            created_at: 0,
            updated_at: 0,
            list_size: Some(2),
            token: String::new(),
            release_at: None,
            sticky: false,
        }
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
        Request {
            ip,
            force,
            namespace: None,
        }
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
}
