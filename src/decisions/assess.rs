//! One assessment of a Pod for `/mutate` and `/validate`: what it asks for (its app, its list
//! or pool, the IPs it already carries, its claim token), checked once, and the typed denials
//! both endpoints answer with.

use std::fmt;
use std::net::IpAddr;

use crate::decisions::{Candidates, PodView, Webhook};
use crate::metrics::AllocationOutcome;
use ip_webhook_admission::Response;
use ip_webhook_admission::annotations::{
    AnnotationError, CLAIM_TOKEN, OVN_IP_POOL, STATUS, STATUS_MUTATED, carried_with,
    parse_ovn_ip_pool, static_ips,
};
use ip_webhook_ipam::allocator::AllocError;
use ip_webhook_ipam::ipset::IpSet;
use ip_webhook_ipam::messages::Scope;
use ip_webhook_ledger::claim::{PodIdentity, is_token};

/// Why a pod is refused. `Display` is the message the API server shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Denial {
    /// The review has no object to judge.
    MissingObject(&'static str),
    /// An IP annotation cannot be read.
    Malformed {
        pod: String,
        message: AnnotationError,
    },
    /// The list or pool cannot be used (unknown pool, bad list, a pool the pod may not use).
    Candidates(String),
    NoAppLabel {
        pod: String,
        app_label: String,
    },
    /// A carried IP is not one of the app's.
    OutsideList {
        ip: IpAddr,
        pod: String,
        scope: String,
    },
    /// Two IP annotations name different IPs.
    AnnotationsDisagree {
        pod: String,
        first: &'static str,
        second: &'static str,
        a: String,
        b: String,
    },
    /// The IPs are a FixedIPPool's that does not serve the pod, or another app's
    /// ([`Webhook::policy_refusal`]).
    Policy(String),
    /// The CNI's own pools or subnets refuse the IPs.
    Cni(String),
    /// Every IP of the list or pool is held.
    Exhausted(String),
    /// Another pod holds the IP.
    Conflict(String),
    /// The ledger failed; nothing was recorded.
    Ledger(String),
    /// A secondary network's claims could not be bound to the pod's UID (the ledger's error).
    NetworkBind {
        network: String,
        error: String,
    },
}

impl From<AllocError> for Denial {
    fn from(error: AllocError) -> Denial {
        match error {
            AllocError::Exhausted(message) => Denial::Exhausted(message),
            AllocError::Conflict(message) => Denial::Conflict(message),
            other => Denial::Ledger(other.to_string()),
        }
    }
}

/// An endpoint's answer, with what its decision log line names besides the response.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) response: Response,
    /// `namespace/app`, when the review was about an app's pod.
    pub(crate) app: Option<String>,
    /// The IPs the decision concerns (granted, or carried by the pod validated).
    pub(crate) ips: Vec<IpAddr>,
    /// The decision recorded new claims (an allocation or static IPs, not a dry run or a
    /// retried request): its line is logged at INFO, as a denial's is; other allowed
    /// decisions at DEBUG.
    pub(crate) granted: bool,
}

impl From<Response> for Answer {
    fn from(response: Response) -> Answer {
        Answer {
            response,
            app: None,
            ips: Vec::new(),
            granted: false,
        }
    }
}

impl Denial {
    /// How the refusal is counted in `ip_webhook_allocations_total`.
    pub(crate) fn outcome(&self) -> AllocationOutcome {
        match self {
            Denial::Exhausted(_) => AllocationOutcome::exhausted,
            Denial::Conflict(_) => AllocationOutcome::conflict,
            Denial::Ledger(_) | Denial::NetworkBind { .. } => AllocationOutcome::error,
            _ => AllocationOutcome::refused,
        }
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::MissingObject(what) => write!(f, "{what}"),
            Denial::Malformed { pod, message } => write!(f, "pod {pod}: {message}"),
            Denial::Candidates(message) | Denial::Cni(message) | Denial::Policy(message) => {
                write!(f, "{message}")
            }
            Denial::NoAppLabel { pod, app_label } => write!(
                f,
                "pod {pod} asks for fixed IPs but has no {app_label:?} label; ip-webhook needs it (with the namespace) to know which app the IPs belong to"
            ),
            Denial::OutsideList { ip, pod, scope } => write!(
                f,
                "static IP {ip} requested by {pod} is not one of the IPs of {scope}"
            ),
            Denial::AnnotationsDisagree {
                pod,
                first,
                second,
                a,
                b,
            } => write!(
                f,
                "pod {pod}: annotations {first} and {second} name different IPs ({a} vs {b})"
            ),
            Denial::Exhausted(message) | Denial::Conflict(message) => write!(f, "{message}"),
            Denial::Ledger(reason) => write!(
                f,
                "ip-webhook could not record the IP claim, so the pod is not admitted (retry): {reason}"
            ),
            Denial::NetworkBind { network, error } => write!(
                f,
                "network {network}: binding the claims to the pod's UID: {error}"
            ),
        }
    }
}

/// What a pod asks for, read and checked.
pub(crate) struct PodAsk<'m> {
    pub(crate) view: PodView<'m>,
    /// IPs the pod already carries (CNI annotations, else the `allocated-ip` label): asked
    /// for as static IPs unless they are its own verified claims.
    pub(crate) carried: Vec<IpAddr>,
    /// Its list or pool, if it names one.
    pub(crate) candidates: Option<Candidates>,
    /// The claim token it carries (only a well-formed one counts).
    pub(crate) token: Option<&'m str>,
    /// Whether it carries ip-webhook's `status: mutated` marker.
    pub(crate) marked: bool,
    /// Warnings from the CNI checks (for `/validate`).
    pub(crate) warnings: Vec<String>,
}

impl PodAsk<'_> {
    /// Whether ip-webhook has nothing to do with this pod.
    pub(crate) fn is_unrelated(&self) -> bool {
        self.candidates.is_none() && self.carried.is_empty()
    }

    /// The pod as the claim rules see it.
    pub(crate) fn identity(&self) -> PodIdentity<'_> {
        PodIdentity {
            namespace: &self.view.namespace,
            name: self.view.name(),
            uid: self.view.meta.uid.as_deref().filter(|u| !u.is_empty()),
            token: self.token,
        }
    }

    /// `app namespace/app`, `FixedIPPool NAME (app …)`, or `pod namespace/name` without a list.
    pub(crate) fn scope(&self) -> Scope<'_> {
        match &self.candidates {
            Some(candidates) => self.view.scope(candidates),
            None => Scope::Pod(self.view.pod_name()),
        }
    }
}

/// Read and check what `view` asks for: its IP annotations, its list or pool, its app label,
/// that its carried IPs are in its list, and what the CNI's pools say about them.
pub(crate) fn assess<'m>(webhook: &Webhook, view: PodView<'m>) -> Result<PodAsk<'m>, Denial> {
    let meta = view.meta;
    let statics = static_ips(meta.annotations.as_ref()).map_err(|message| Denial::Malformed {
        pod: view.display(),
        message,
    })?;
    if let [(first, a), (second, b), ..] = statics.as_slice()
        && a != b
    {
        return Err(Denial::AnnotationsDisagree {
            pod: view.display(),
            first,
            second,
            a: join(a),
            b: join(b),
        });
    }
    let carried = carried_with(&statics, meta.labels.as_ref());
    let candidates = webhook
        .candidates(&view)
        .map_err(|refused| Denial::Candidates(refused.to_string()))?;
    if candidates.is_some() && view.app.is_none() {
        return Err(Denial::NoAppLabel {
            pod: view.display(),
            app_label: webhook.settings.app_label.clone(),
        });
    }
    check_ovn_ip_pool(webhook, &view)?;
    let mut ask = PodAsk {
        token: meta.annotation(CLAIM_TOKEN).filter(|t| is_token(t)),
        marked: meta.annotation(STATUS) == Some(STATUS_MUTATED),
        view,
        carried,
        candidates,
        warnings: Vec::new(),
    };
    if ask.is_unrelated() {
        return Ok(ask);
    }
    if let Some(candidates) = &ask.candidates
        && let Some(outside) = ask.carried.iter().find(|ip| !candidates.set.contains(ip))
    {
        return Err(Denial::OutsideList {
            ip: *outside,
            pod: ask.view.display(),
            scope: ask.view.scope(candidates).to_string(),
        });
    }
    // IPs the pod names for itself are held to the same rule as a list: a FixedIPPool's IPs
    // only for the pods it serves, another app's listed IPs only for that app.
    if ask.candidates.is_none()
        && let Some(refusal) =
            webhook.policy_refusal(&IpSet::from_ips(ask.carried.iter().copied()), &ask.view)
    {
        return Err(Denial::Policy(format!(
            "pod {}: static IP {}",
            ask.view.display(),
            refusal.names()
        )));
    }
    let whose = ask.scope();
    let carried_set = IpSet::from_ips(ask.carried.iter().copied());
    let sets = [
        (!ask.carried.is_empty()).then_some(&carried_set),
        ask.candidates.as_ref().map(|c| &*c.set),
    ];
    let mut warnings = Vec::new();
    for set in sets.into_iter().flatten() {
        warnings.extend(
            webhook
                .cni_check(set, &whose)
                .map_err(|refused| Denial::Cni(refused.to_string()))?,
        );
    }
    ask.warnings = warnings;
    Ok(ask)
}

/// Kube-OVN's `ovn.kubernetes.io/ip_pool` list ([`parse_ovn_ip_pool`]): Kube-OVN gives the
/// pod one of those IPs itself, so they count as the pod's app's: refused when they are
/// another app's (a FixedIPPool that does not serve the pod, another app's list, another
/// app's claim) or cannot be read (Kube-OVN's own webhook refuses those too).
fn check_ovn_ip_pool(webhook: &Webhook, view: &PodView<'_>) -> Result<(), Denial> {
    let Some(value) = view.meta.annotation(OVN_IP_POOL) else {
        return Ok(());
    };
    let ips = match parse_ovn_ip_pool(value) {
        Ok(Some(ips)) => ips,
        Ok(None) => return Ok(()),
        Err(error) => {
            return Err(Denial::Malformed {
                pod: view.display(),
                message: AnnotationError::Annotation {
                    key: OVN_IP_POOL,
                    error: Box::new(error),
                },
            });
        }
    };
    if let Some(refusal) = webhook.policy_refusal(&IpSet::from_ips(ips.iter().copied()), view) {
        return Err(Denial::Policy(format!(
            "pod {}: annotation {OVN_IP_POOL} {}",
            view.display(),
            refusal.lists()
        )));
    }
    let app_key = view.app_key();
    for ip in &ips {
        if let Some(holder) = webhook.allocator.holder(ip)
            && holder.locks_ip()
            && holder.app_key() != app_key
        {
            return Err(Denial::Conflict(format!(
                "pod {}: annotation {OVN_IP_POOL} lists {ip}, which {} of app {} holds",
                view.display(),
                holder.named_holder(),
                holder.app_key()
            )));
        }
    }
    Ok(())
}

fn join(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(|ip| ip.to_string())
        .collect::<Vec<_>>()
        .join(",")
}
