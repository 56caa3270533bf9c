//! `/mutate`: give a Pod its fixed IP on CREATE, release it on DELETE.

use std::net::IpAddr;

use crate::decisions::assess::{Answer, Denial, PodAsk, assess};
use crate::decisions::events::Refused;
use crate::decisions::secondary::{self, NetworkAsks, NetworkGrant};
use crate::decisions::{Candidates, PodView, Webhook};
use crate::metrics::AllocationOutcome;
use ip_webhook_admission::annotations::{
    ALLOCATED_IP_LABEL, CLAIM_TOKEN, STATUS, STATUS_MUTATED, carried_ips, static_ips,
};
use ip_webhook_admission::patch::MetadataPatch;
use ip_webhook_admission::{Incoming, Operation, OwnerRef, Response, ReviewError};
use ip_webhook_ipam::allocator::{AllocError, Allocation, AllocationRequest, Reason};
use ip_webhook_ipam::ipset::ip_label_value;
use ip_webhook_ledger::claim::{self, PodIdentity, PodPresence, held_by, is_token, new_token};
use ip_webhook_ledger::{Claim, Phase, PodRef, unix_now};

/// What `/mutate` decided for a Pod CREATE: the typed result that the response, the decision
/// log line and `explain` are all made from.
#[derive(Debug)]
pub(crate) enum PodDecision {
    /// The pod asks for no fixed IP and carries none.
    Unrelated,
    /// Our own patch seen again (reinvocation): the pod's token holds every IP it carries.
    AlreadyHeld(Vec<IpAddr>),
    /// IPs granted (allocated from the list or pool, or the pod's static IPs recorded).
    Granted {
        app: String,
        allocation: Allocation,
        /// The IPs granted on secondary networks.
        networks: Vec<NetworkGrant>,
        patch: Vec<u8>,
        /// New claims were recorded (not a dry run, not a retried request's own claim).
        recorded: bool,
    },
    Denied {
        app: Option<String>,
        denial: Denial,
    },
}

impl PodDecision {
    /// `namespace/app`, once known.
    pub(crate) fn app(&self) -> Option<&str> {
        match self {
            PodDecision::Granted { app, .. } => Some(app),
            PodDecision::Denied { app, .. } => app.as_deref(),
            _ => None,
        }
    }

    /// The IPs the pod holds after this decision.
    pub(crate) fn ips(&self) -> &[IpAddr] {
        match self {
            PodDecision::AlreadyHeld(ips) => ips,
            PodDecision::Granted { allocation, .. } => &allocation.ips,
            _ => &[],
        }
    }

    fn respond(self, response: Response) -> Answer {
        let app = self.app().map(str::to_string);
        let ips = self.ips().to_vec();
        let granted = matches!(self, PodDecision::Granted { recorded: true, .. });
        let response = match self {
            PodDecision::Granted { patch, .. } => response.with_patch(patch),
            PodDecision::Denied { denial, .. } => response.deny(denial.to_string()),
            PodDecision::Unrelated | PodDecision::AlreadyHeld(_) => response,
        };
        Answer {
            response,
            app,
            ips,
            granted,
        }
    }
}

pub(crate) async fn mutate(
    webhook: &Webhook,
    incoming: &Incoming<'_>,
) -> Result<Answer, ReviewError> {
    let response = incoming.respond();
    let request = &incoming.request;
    if request.kind.kind != "Pod"
        || !request.kind.group.is_empty()
        || request.sub_resource.is_some()
    {
        return Ok(Answer::from(response));
    }
    match request.operation {
        Operation::Create => Ok(decide_create(webhook, incoming).await?.respond(response)),
        Operation::Delete => delete(webhook, incoming, response).await.map(Answer::from),
        _ => Ok(Answer::from(response)),
    }
}

/// A CREATE of a fixed name (a StatefulSet's `db-0`) takes over the claims its name held, on
/// every interface, once their pod is verified gone: with an API server, asked there (after
/// reading the claims from a shared ledger, since this replica's copy may lag behind the
/// DELETE another replica saw); off-cluster, once the DELETE this webhook saw has its grace
/// over. While that pod still exists the create is refused: the API server would answer it
/// AlreadyExists after the webhooks, and a takeover now would leave the running pod, or the
/// stored pod a reservation was made for, without its claim. A claim of a gone pod that is
/// still `Reserved` or `Bound` (its DELETE was missed, or is not seen here yet) is moved to
/// `Terminating` first, so the create can take it over.
async fn take_back_name(webhook: &Webhook, ask: &PodAsk<'_>, pod: &PodRef) -> Option<Denial> {
    if pod.name.is_empty() {
        return None;
    }
    let (identity, app) = (&ask.identity(), ask.view.app.unwrap_or(""));
    let now = unix_now();
    for (interface, allocator) in webhook.interfaces() {
        let ips: Vec<IpAddr> = allocator
            .held_under_name(pod, app)
            .iter()
            .map(|c| c.ip)
            .collect();
        if let Err(error) = allocator.refresh(&ips).await {
            tracing::warn!(%error, %interface, "cannot read the claims of a pod name; deciding on this replica's copy");
        }
        for claim in allocator.held_under_name(pod, app) {
            // a kept release is the name's to take; the pod's own claim (a retried or
            // reinvoked admission) is no earlier pod's
            if claim.phase == Phase::Released || held_by(&claim, identity) {
                continue;
            }
            let presence = match webhook.pods.get() {
                Some(lookup) => lookup.presence(&claim).await,
                None => match presence_off_cluster(&claim, now) {
                    Some(presence) => presence,
                    None => continue,
                },
            };
            let uid = claim.pod.uid.as_deref().unwrap_or("?");
            let why = match presence {
                PodPresence::Gone => {
                    if matches!(claim.phase, Phase::Reserved | Phase::Bound) {
                        let gone = claim::terminating(&claim, &PodIdentity::default(), now, now);
                        if let Err(error) = allocator.transition(&claim, &gone).await {
                            tracing::warn!(%error, ip = %claim.ip, "cannot end the claim of a gone pod");
                        }
                    }
                    continue;
                }
                PodPresence::Terminating | PodPresence::Running => format!(
                    "pod {} (uid {uid}) still exists and holds {} on {interface}; a pod of the same name can be created once it is gone",
                    claim.pod.display(),
                    claim.ip
                ),
                PodPresence::Unknown(why) => format!(
                    "cannot tell whether pod {} (uid {uid}), which holds {} on {interface}, is gone: {why}",
                    claim.pod.display(),
                    claim.ip
                ),
            };
            return Some(Denial::Conflict(why));
        }
    }
    None
}

/// Where the pod of a claim is, as a webhook with no API server knows it: in its grace until
/// the release time of the DELETE it saw. `None` for a claim whose DELETE it did not see: it
/// tells nothing, and the claim rules alone decide (a reservation whose pod never came is the
/// name's to take over, a bound claim is not).
fn presence_off_cluster(claim: &Claim, now: u64) -> Option<PodPresence> {
    match claim.phase {
        Phase::Terminating if claim.release_at.is_some_and(|at| now < at.get()) => {
            Some(PodPresence::Terminating)
        }
        _ => None,
    }
}

/// Decide a Pod CREATE: assess it, then grant (allocate or record its static IPs, on the
/// primary interface and on each managed secondary network it asks of) or deny. Records the
/// claims (unless dry run), counts the outcome and reports it to the event sink.
pub(crate) async fn decide_create(
    webhook: &Webhook,
    incoming: &Incoming<'_>,
) -> Result<PodDecision, ReviewError> {
    let Some(pod) = incoming.metadata(false)? else {
        return Ok(PodDecision::Denied {
            app: None,
            denial: Denial::MissingObject("a Pod CREATE review must carry request.object"),
        });
    };
    let meta = &pod.metadata;
    let view = PodView::new(meta, incoming, &webhook.settings);
    // named once: each naming interns the namespace and generateName
    let pod_ref = view.pod_ref();
    let context = refusal(webhook, incoming, &view, &pod_ref);
    let ask = match assess(webhook, view) {
        Ok(ask) => ask,
        Err(denial) => return Ok(refused(&context, None, denial)),
    };
    let networks = match secondary::asks(webhook, &ask.view) {
        Ok(networks) => networks,
        Err(denial) => return Ok(refused(&context, Some(ask.view.app_key()), denial)),
    };
    // the primary interface asks for nothing, or is our own earlier answer
    let primary_held = already_held(webhook, &ask);
    let primary_done = ask.is_unrelated() || primary_held;
    let networks_held = networks
        .as_ref()
        .is_none_or(|n| secondary::all_held(webhook, n, &ask.identity()));
    if primary_done && networks_held {
        return Ok(match networks.is_none() && ask.is_unrelated() {
            true => PodDecision::Unrelated,
            false => PodDecision::AlreadyHeld(ask.carried),
        });
    }
    if let Some(denial) = take_back_name(webhook, &ask, &pod_ref).await {
        return Ok(refused(&context, Some(ask.view.app_key()), denial));
    }
    let empty = Candidates {
        set: Default::default(),
        pool: None,
    };
    let chosen = ask.candidates.as_ref().unwrap_or(&empty);
    let token = match ask.token {
        Some(token) if primary_held => token.to_string(),
        _ => new_token(incoming.uid()),
    };
    let request = AllocationRequest {
        scope: ask.scope(),
        app: ask.view.app.unwrap_or(""),
        pool: chosen.pool.as_deref(),
        pod: pod_ref.clone(),
        request_uid: incoming.uid(),
        token: &token,
        candidates: &chosen.set,
        ordinal: ask.view.statefulset_ordinal(),
        vm: ask.view.vm,
        migration: ask.view.migration,
        dry_run: incoming.dry_run(),
    };
    let grant = Grant {
        ask: &ask,
        request: &request,
        allocation: None,
        networks: Vec::new(),
        app_key: ask.view.app_key(),
    };
    Ok(
        match grant.record(webhook, primary_done, networks.as_ref()).await {
            Ok(grant) => grant.decide(webhook, meta, networks.as_ref()),
            Err(denial) => refused(&context, Some(ask.view.app_key()), denial),
        },
    )
}

/// Our own patch seen again (reinvocation, a retried call): the marker and the token are
/// worth something only when the ledger says this token holds every IP the pod carries.
fn already_held(webhook: &Webhook, ask: &PodAsk<'_>) -> bool {
    ask.marked
        && !ask.carried.is_empty()
        && webhook
            .allocator
            .held_by(&ask.identity(), &ask.carried)
            .len()
            == ask.carried.len()
}

/// A granted allocation, before it is counted, reported and patched onto the pod.
struct Grant<'a> {
    ask: &'a PodAsk<'a>,
    request: &'a AllocationRequest<'a>,
    /// The primary interface's (none when it asks for nothing, or holds its IPs already).
    allocation: Option<Allocation>,
    networks: Vec<NetworkGrant>,
    app_key: String,
}

impl Grant<'_> {
    /// Record the primary interface's claims (unless `primary_done`), then each network's
    /// under the same token; a network's refusal gives back what this request recorded.
    async fn record(
        mut self,
        webhook: &Webhook,
        primary_done: bool,
        networks: Option<&NetworkAsks>,
    ) -> Result<Self, Denial> {
        let (ask, request) = (self.ask, self.request);
        if !primary_done {
            let result = if ask.carried.is_empty() {
                webhook.allocator.allocate(request).await
            } else {
                // IPs the pod carries without a claim of its own: asked for as static IPs
                webhook.allocator.claim_static(&ask.carried, request).await
            };
            match result {
                Ok(allocation) => self.allocation = Some(allocation),
                Err(error) => {
                    if matches!(error, AllocError::Exhausted(_)) {
                        webhook
                            .metrics
                            .exhausted(&ask.view.namespace, request.app, request.pool);
                    }
                    return Err(Denial::from(error));
                }
            }
        }
        let Some(networks) = networks else {
            return Ok(self);
        };
        // a retried request is answered with the token its first attempt recorded
        let token = self.allocation.as_ref().map(|a| a.token.clone());
        let network_request = AllocationRequest {
            token: token.as_deref().unwrap_or(request.token),
            ..request.clone()
        };
        match secondary::grant(webhook, networks, &network_request).await {
            Ok(granted) => self.networks = granted,
            Err(denial) => {
                if let Some(allocation) = &self.allocation
                    && !request.dry_run
                    && !allocation.reasons.contains(&Reason::SameRequest)
                    && let Err(error) = webhook
                        .allocator
                        .release_held(&network_request.identity(), &allocation.ips)
                        .await
                {
                    tracing::warn!(%error, pod = %ask.view.display(), "could not give back a refused pod's claims; the reconciler frees them");
                }
                return Err(denial);
            }
        }
        Ok(self)
    }

    /// Count the outcome (dry run, a retried request's claim, a new allocation or the pod's
    /// own static IPs recorded), report it to the event sink and build the patch.
    fn decide(
        self,
        webhook: &Webhook,
        meta: &ip_webhook_admission::Meta,
        networks: Option<&NetworkAsks>,
    ) -> PodDecision {
        let Grant {
            ask,
            request,
            allocation,
            networks: granted,
            app_key,
        } = self;
        let allocation = allocation.unwrap_or_else(|| Allocation {
            ips: ask.carried.clone(),
            reasons: Vec::new(),
            token: request.token.to_string(),
        });
        let outcome = if request.dry_run {
            AllocationOutcome::dry_run
        } else if allocation.reasons.contains(&Reason::SameRequest) {
            AllocationOutcome::reused
        } else if ask.carried.is_empty() {
            AllocationOutcome::allocated
        } else {
            AllocationOutcome::static_recorded
        };
        let recorded = matches!(
            outcome,
            AllocationOutcome::allocated | AllocationOutcome::static_recorded
        );
        webhook.metrics.allocation(outcome);
        tracing::debug!(pod = %ask.view.display(), reasons = ?allocation.reasons, networks = ?granted, "allocated");
        let mut patch = metadata_patch(webhook, meta, &allocation);
        if let Some(networks) = networks {
            secondary::add_to_patch(webhook, meta, networks, &granted, &mut patch);
        }
        PodDecision::Granted {
            app: app_key,
            allocation,
            networks: granted,
            patch: patch.to_json(),
            recorded,
        }
    }
}

/// The JSON patch that hands the allocation's IPs to the CNI (unless the pod names them
/// already: a static IP is never overwritten), marks the pod as done, and gives it its claim
/// token.
pub fn patch_for(
    webhook: &Webhook,
    meta: &ip_webhook_admission::Meta,
    allocation: &Allocation,
) -> Vec<u8> {
    metadata_patch(webhook, meta, allocation).to_json()
}

/// [`patch_for`]'s operations, to which a secondary network's may be added. An allocation
/// of no IP (a pod that asks only of secondary networks) writes no CNI annotation or label.
fn metadata_patch(
    webhook: &Webhook,
    meta: &ip_webhook_admission::Meta,
    allocation: &Allocation,
) -> MetadataPatch {
    let cni = webhook.settings.cni;
    let has_annotations = meta.annotations.is_some();
    let mut patch = MetadataPatch::default();
    let mut annotations_present = has_annotations;
    if !allocation.ips.is_empty()
        && static_ips(meta.annotations.as_ref()).is_ok_and(|statics| statics.is_empty())
    {
        patch.add(
            "annotations",
            annotations_present,
            cni.annotation(),
            &cni.format(&allocation.ips),
        );
        annotations_present = true;
    }
    if meta.annotation(STATUS) != Some(STATUS_MUTATED) {
        patch.add("annotations", annotations_present, STATUS, STATUS_MUTATED);
        annotations_present = true;
    }
    if meta.annotation(CLAIM_TOKEN) != Some(allocation.token.as_str()) {
        patch.add(
            "annotations",
            annotations_present,
            CLAIM_TOKEN,
            &allocation.token,
        );
    }
    if let Some(first) = allocation.ips.first() {
        let label = ip_label_value(first);
        if meta.label(ALLOCATED_IP_LABEL) != Some(label.as_str()) {
            patch.add("labels", meta.labels.is_some(), ALLOCATED_IP_LABEL, &label);
        }
    }
    patch
}

/// What a refusal is reported with (besides its message and outcome).
struct RefusalContext<'a> {
    webhook: &'a Webhook,
    pod: &'a PodRef,
    owners: &'a [OwnerRef],
    dry_run: bool,
}

fn refusal<'a>(
    webhook: &'a Webhook,
    incoming: &'a Incoming<'_>,
    view: &PodView<'a>,
    pod: &'a PodRef,
) -> RefusalContext<'a> {
    RefusalContext {
        webhook,
        pod,
        owners: view.meta.owner_references.as_deref().unwrap_or(&[]),
        dry_run: incoming.dry_run(),
    }
}

/// Count and report a refusal.
fn refused(context: &RefusalContext<'_>, app: Option<String>, denial: Denial) -> PodDecision {
    let outcome = denial.outcome();
    let message = denial.to_string();
    context.webhook.metrics.allocation(outcome.clone());
    context.webhook.events.refused(&Refused {
        pod: context.pod,
        owners: context.owners,
        outcome,
        message: &message,
        dry_run: context.dry_run,
    });
    PodDecision::Denied { app, denial }
}

/// A Pod DELETE review: the pod may run on for its grace period, so its claims turn
/// `Terminating` and are released only after that (plus `--release-delay`), once the pod is
/// gone. Only the pod's own claims are touched: by UID, else by claim token. They are found
/// by who the pod is as well as by the IPs it carries, so a pod whose IP annotations or label
/// were stripped (before they were immutable, or with the webhook away) still frees its IPs.
async fn delete(
    webhook: &Webhook,
    incoming: &Incoming<'_>,
    response: Response,
) -> Result<Response, ReviewError> {
    if incoming.dry_run() {
        return Ok(response);
    }
    let Some(pod) = incoming.metadata(true)? else {
        return Ok(response);
    };
    let meta = &pod.metadata;
    let view = PodView::new(meta, incoming, &webhook.settings);
    let ips = carried_ips(meta.labels.as_ref(), meta.annotations.as_ref());
    let name = match view.name() {
        "" => incoming.request.name.as_deref().unwrap_or(""),
        name => name,
    };
    let identity = PodIdentity {
        namespace: &view.namespace,
        name,
        uid: meta.uid.as_deref().filter(|u| !u.is_empty()),
        token: meta.annotation(CLAIM_TOKEN).filter(|t| is_token(t)),
    };
    let asked = incoming.deletion_grace_seconds();
    let most = webhook.settings.max_release_grace.as_secs();
    if asked > most {
        tracing::warn!(pod = %format!("{}/{name}", view.namespace), grace_seconds = asked, max_release_grace_seconds = most, "the DELETE's grace period is longer than --max-release-grace; the IP is held for that long at most");
    }
    let release_at = unix_now()
        .saturating_add(asked.min(most))
        .saturating_add(webhook.settings.release_delay.as_secs());
    match webhook
        .allocator
        .terminate(&identity, &ips, release_at)
        .await
    {
        Ok(terminating) => {
            if !terminating.is_empty() {
                let ips: Vec<IpAddr> = terminating.iter().map(|c| c.ip).collect();
                tracing::info!(pod = %format!("{}/{name}", view.namespace), ips = ?ips, release_at, "terminating: the IPs are released once the grace period is over and the pod is gone");
            }
        }
        // A DELETE is never blocked on our books; the release timer and reconciler catch up.
        Err(error) => {
            tracing::warn!(%error, pod = name, "could not mark the pod's claims terminating")
        }
    }
    secondary::terminate(webhook, meta, &identity, release_at).await;
    Ok(response)
}
