//! Fixed IPs on secondary networks (Multus attachments named by `--network`): what a pod
//! asks of each, the IP chosen per network from the pod's list for it, and where that
//! network's IPAM reads it.
//!
//! Each managed network has an allocator over books of its own
//! ([`ip_webhook_ledger::network::Network`]), so every rule of the primary interface (tokens,
//! UIDs, the lifecycle, StatefulSet ordinals, static requests) holds per network, and the same
//! address on two networks is two claims. A pod names its list for a network in
//! `NAME.NAMESPACE.ip-webhook.io/allocatable-ips`; the chosen IP is written in the `ips` of
//! that network's entry in `k8s.v1.cni.cncf.io/networks` (with the prefix length of
//! `NAME.NAMESPACE.ip-webhook.io/prefix-length`, which the `static` IPAM needs), and with
//! `--cni kube-ovn` in Kube-OVN's attachment annotations
//! ([`ip_webhook_admission::networks::kube_ovn_ip_annotations`]: `NAME.NAMESPACE.ovn.kubernetes.io/ip_address`
//! for an attachment of Kube-OVN's CNI, `NAME.NAMESPACE.kubernetes.io/ip_address` for an
//! IPAM-only one). An IP the pod names by hand, in an `ips` entry or one of those annotations,
//! is a static request on that network ([`ip_webhook_admission::networks::carried_on`] reads them).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use crate::decisions::assess::{Denial, PodAsk};
use crate::decisions::carried::{self, Carried};
use crate::decisions::{PodView, Webhook};
use ip_webhook_admission::annotations::{AnnotationError, Cni};
use ip_webhook_admission::networks::{
    Attachment, NETWORKS, carried_on, kube_ovn_ip_annotations, kube_ovn_ips, pod_network_ips,
    read_networks, write_networks,
};
use ip_webhook_admission::patch::MetadataPatch;
use ip_webhook_admission::{Incoming, Meta, Operation};
use ip_webhook_ipam::allocator::{AllocationRequest, Allocator, Reason};
use ip_webhook_ipam::ipset::{Family, IpSet};
use ip_webhook_ledger::claim::{PodIdentity, new_token};
use ip_webhook_ledger::network::Network;

/// The allocator of each secondary network ip-webhook gives IPs out on.
#[derive(Default)]
pub struct SecondaryNetworks {
    by_network: BTreeMap<Network, Arc<Allocator>>,
}

impl SecondaryNetworks {
    pub(crate) fn new(by_network: BTreeMap<Network, Arc<Allocator>>) -> SecondaryNetworks {
        SecondaryNetworks { by_network }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_network.is_empty()
    }

    pub fn get(&self, network: &Network) -> Option<&Arc<Allocator>> {
        self.by_network.get(network)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Network, &Arc<Allocator>)> {
        self.by_network.iter()
    }
}

/// The annotation in which a pod names the IPs it may get on `network`.
pub(crate) fn list_annotation(network: &Network) -> String {
    format!(
        "{}.{}.ip-webhook.io/allocatable-ips",
        network.name, network.namespace
    )
}

/// The annotation giving the prefix length written with each IP on `network`.
pub(crate) fn prefix_annotation(network: &Network) -> String {
    format!(
        "{}.{}.ip-webhook.io/prefix-length",
        network.name, network.namespace
    )
}

/// What a pod asks of one managed network.
#[derive(Debug)]
pub(crate) struct NetworkAsk {
    pub(crate) network: Network,
    /// Its entry among the pod's attachments.
    attachment: usize,
    /// The pod's list for it (none: only IPs named by hand).
    list: Option<Arc<IpSet>>,
    prefix: Option<u8>,
    /// The IPs the pod carries on it (a static request, or our own earlier answer).
    pub(crate) carried: Vec<IpAddr>,
    /// Whether the pod wrote one of Kube-OVN's annotations for it itself.
    kube_ovn_by_hand: bool,
}

/// A pod's attachments of the managed networks, and what it asks of them.
#[derive(Debug)]
pub(crate) struct NetworkAsks {
    attachments: Vec<Attachment>,
    /// The pod's namespace, where its attachments without one are.
    namespace: String,
    pub(crate) asks: Vec<NetworkAsk>,
}

/// The IPs granted on one network.
#[derive(Debug, Clone)]
pub(crate) struct NetworkGrant {
    pub(crate) network: Network,
    pub(crate) ips: Vec<IpAddr>,
}

/// Read what `view` asks of the managed networks: `None` when it asks nothing of them (or
/// none is managed). Multus reads the networks annotation as it likes for the networks
/// ip-webhook does not manage; for a managed one, an unreadable annotation, list or prefix, a
/// list for a network the pod does not attach, or an `ips` entry outside its list is refused.
pub(crate) fn asks(webhook: &Webhook, view: &PodView<'_>) -> Result<Option<NetworkAsks>, Denial> {
    if webhook.secondary.is_empty() {
        return Ok(None);
    }
    let meta = view.meta;
    let malformed = |message: AnnotationError| Denial::Malformed {
        pod: view.display(),
        message,
    };
    let attachments = managed_attachments(webhook, view).map_err(malformed)?;
    for (network, _) in webhook.secondary.iter() {
        let key = list_annotation(network);
        let attached = attachments.iter().any(|a| a.attaches(network));
        if !attached && meta.annotation(&key).is_some() {
            return Err(Denial::Candidates(format!(
                "pod {}: annotation {key} names IPs on network {network}, which its {NETWORKS} does not attach",
                view.display()
            )));
        }
    }
    let mut asks = Vec::new();
    for (attachment, entry) in attachments.iter().enumerate() {
        let network = Network {
            namespace: entry.namespace.clone(),
            name: entry.name.clone(),
        };
        if webhook.secondary.get(&network).is_none() {
            continue;
        }
        if asks.iter().any(|ask: &NetworkAsk| ask.network == network) {
            return Err(Denial::Candidates(format!(
                "pod {}: its {NETWORKS} attaches network {network} more than once; ip-webhook gives a pod one fixed IP per network",
                view.display()
            )));
        }
        let key = list_annotation(&network);
        let list = meta.annotation(&key);
        let annotations = meta.annotations.as_ref();
        let by_hand = kube_ovn_ips(annotations, &network).map_err(malformed)?;
        let carried = carried_on(&attachments, annotations, &network);
        if list.is_none() && carried.is_empty() {
            continue;
        }
        let ask = NetworkAsk {
            list: list
                .map(|l| parse_list(webhook, view, &key, l))
                .transpose()?,
            prefix: prefix_of(view, &network)?,
            network,
            attachment,
            carried,
            kube_ovn_by_hand: !by_hand.is_empty(),
        };
        check_ask(webhook, view, &ask)?;
        asks.push(ask);
    }
    Ok((!asks.is_empty()).then_some(NetworkAsks {
        attachments,
        namespace: view.namespace.to_string(),
        asks,
    }))
}

/// The pod's attachments of the managed networks, each network's first two at most (a second
/// is refused, and more need not be held), its networks annotation checked whole.
fn managed_attachments(
    webhook: &Webhook,
    view: &PodView<'_>,
) -> Result<Vec<Attachment>, AnnotationError> {
    let mut kept: Vec<(String, String)> = Vec::new();
    let managed = |a: &Attachment| {
        let held = kept
            .iter()
            .filter(|(namespace, name)| *namespace == a.namespace && *name == a.name)
            .count();
        let keep = held < 2 && webhook.secondary.iter().any(|(n, _)| a.attaches(n));
        if keep {
            kept.push((a.namespace.clone(), a.name.clone()));
        }
        keep
    };
    let value = view.meta.annotation(NETWORKS).unwrap_or("");
    read_networks(value, &view.namespace, managed)
}

fn parse_list(
    webhook: &Webhook,
    view: &PodView<'_>,
    key: &str,
    list: &str,
) -> Result<Arc<IpSet>, Denial> {
    webhook.specs.parse(list).map_err(|error| {
        Denial::Candidates(format!("pod {}: annotation {key}: {error}", view.display()))
    })
}

/// The prefix length of `NAME.NAMESPACE.ip-webhook.io/prefix-length`, if given.
fn prefix_of(view: &PodView<'_>, network: &Network) -> Result<Option<u8>, Denial> {
    let key = prefix_annotation(network);
    let Some(value) = view.meta.annotation(&key) else {
        return Ok(None);
    };
    match value.trim().parse::<u8>() {
        Ok(prefix) if prefix <= 128 => Ok(Some(prefix)),
        _ => Err(Denial::Candidates(format!(
            "pod {}: annotation {key}: {value:?} is not a prefix length (0-32 for IPv4, 0-128 for IPv6)",
            view.display()
        ))),
    }
}

/// A list needs the app label (its claims are the app's); IPs named by hand must be in the
/// list when there is one; the IPs written for the network's IPAM need a prefix length unless
/// Kube-OVN's attachment annotation carries them.
fn check_ask(webhook: &Webhook, view: &PodView<'_>, ask: &NetworkAsk) -> Result<(), Denial> {
    if ask.list.is_some() && view.app.is_none() {
        return Err(Denial::NoAppLabel {
            pod: view.display(),
            app_label: webhook.settings.app_label.clone(),
        });
    }
    if let Some(list) = &ask.list
        && let Some(outside) = ask.carried.iter().find(|ip| !list.contains(ip))
    {
        return Err(Denial::OutsideList {
            ip: *outside,
            pod: view.display(),
            scope: format!(
                "list {} of app {}",
                list_annotation(&ask.network),
                view.app_key()
            ),
        });
    }
    let shortest = ask
        .list
        .iter()
        .flat_map(|list| list.families())
        .chain(ask.carried.iter().map(Family::of))
        .min_by_key(|family| family.bits());
    if let (Some(prefix), Some(family)) = (ask.prefix, shortest)
        && u32::from(prefix) > family.bits()
    {
        return Err(Denial::Candidates(format!(
            "pod {}: annotation {}: /{prefix} is longer than an {} address",
            view.display(),
            prefix_annotation(&ask.network),
            family.name()
        )));
    }
    if ask.list.is_some() && ask.prefix.is_none() && webhook.settings.cni != Cni::KubeOvn {
        return Err(Denial::Candidates(format!(
            "pod {}: network {}: annotation {} is missing: the IPs written in the network's `ips` need a prefix length (the static IPAM reads them as CIDRs)",
            view.display(),
            ask.network,
            prefix_annotation(&ask.network)
        )));
    }
    Ok(())
}

/// Whether every ask is our own earlier answer (a reinvocation, a retried call): each
/// network's carried IPs held under `identity`.
pub(crate) fn all_held(webhook: &Webhook, asks: &NetworkAsks, identity: &PodIdentity<'_>) -> bool {
    asks.asks
        .iter()
        .all(|ask| already_held(webhook, ask, identity))
}

/// Whether the claims on the ask's network hold every IP it carries under `identity` (its
/// token, its UID once bound): the pod is seen again with our own answer.
fn already_held(webhook: &Webhook, ask: &NetworkAsk, identity: &PodIdentity<'_>) -> bool {
    !ask.carried.is_empty()
        && webhook
            .secondary
            .get(&ask.network)
            .is_some_and(|allocator| {
                allocator.held_by(identity, &ask.carried).len() == ask.carried.len()
            })
}

/// Grant each ask: the IPs it carries recorded as static IPs on its network (unless they are
/// its own already), or one IP per family chosen from its list. `request` is the primary
/// interface's (its token, pod, ordinal and VM), with each network's list. On a refusal, what
/// this request recorded on the networks before it is given back.
pub(crate) async fn grant(
    webhook: &Webhook,
    asks: &NetworkAsks,
    request: &AllocationRequest<'_>,
) -> Result<Vec<NetworkGrant>, Denial> {
    let identity = request.identity();
    let mut granted: Vec<NetworkGrant> = Vec::new();
    // what this request recorded, given back if a later network refuses the pod
    let mut recorded: Vec<NetworkGrant> = Vec::new();
    for ask in &asks.asks {
        let Some(allocator) = webhook.secondary.get(&ask.network) else {
            continue;
        };
        if already_held(webhook, ask, &identity) {
            granted.push(NetworkGrant {
                network: ask.network.clone(),
                ips: ask.carried.clone(),
            });
            continue;
        }
        let empty = IpSet::default();
        let network_request = AllocationRequest {
            candidates: ask.list.as_deref().unwrap_or(&empty),
            ..request.clone()
        };
        let result = if ask.carried.is_empty() {
            allocator.allocate(&network_request).await
        } else {
            allocator.claim_static(&ask.carried, &network_request).await
        };
        match result {
            Ok(allocation) => {
                let grant = NetworkGrant {
                    network: ask.network.clone(),
                    ips: allocation.ips,
                };
                if !allocation.reasons.contains(&Reason::SameRequest) {
                    recorded.push(grant.clone());
                }
                granted.push(grant);
            }
            Err(error) => {
                give_back(webhook, &recorded, &identity, request.dry_run).await;
                return Err(network_denial(&ask.network, error.into()));
            }
        }
    }
    Ok(granted)
}

/// `denial` on `network`: its message names the network.
fn network_denial(network: &Network, denial: Denial) -> Denial {
    match denial {
        Denial::Exhausted(message) => Denial::Exhausted(format!("network {network}: {message}")),
        Denial::Conflict(message) => Denial::Conflict(format!("network {network}: {message}")),
        Denial::Ledger(message) => Denial::Ledger(format!("network {network}: {message}")),
        other => other,
    }
}

/// Give back the claims `granted` recorded for a pod that is refused after all.
pub(crate) async fn give_back(
    webhook: &Webhook,
    granted: &[NetworkGrant],
    identity: &PodIdentity<'_>,
    dry_run: bool,
) {
    if dry_run {
        return;
    }
    for grant in granted {
        if let Some(allocator) = webhook.secondary.get(&grant.network)
            && let Err(error) = allocator.release_held(identity, &grant.ips).await
        {
            tracing::warn!(network = %grant.network, %error, "could not give back a refused pod's claims; the sweeper frees them");
        }
    }
}

/// Add to `patch` what hands the granted IPs to each network's IPAM: the networks
/// annotation in its JSON form with each granted entry's `ips` (and their prefix length), and
/// with Kube-OVN, its attachment annotations (both kinds: Kube-OVN reads the one of the
/// attachment's provider). Values already as wanted are left alone, and what the pod named by
/// hand is never overwritten.
pub(crate) fn add_to_patch(
    webhook: &Webhook,
    meta: &Meta,
    asks: &NetworkAsks,
    granted: &[NetworkGrant],
    patch: &mut MetadataPatch,
) {
    let mut attachments = asks.attachments.clone();
    let mut changed = false;
    for (ask, grant) in asks.asks.iter().zip(granted) {
        // IPs the pod named by hand stay as it wrote them
        if let Some(prefix) = ask.prefix.filter(|_| ask.carried.is_empty()) {
            let ips: Vec<(IpAddr, u8)> = grant.ips.iter().map(|ip| (*ip, prefix)).collect();
            changed |= attachments[ask.attachment].set_ips(&ips);
        }
        if webhook.settings.cni == Cni::KubeOvn && !ask.kube_ovn_by_hand {
            let value = Cni::KubeOvn.format(&grant.ips);
            for key in kube_ovn_ip_annotations(&ask.network) {
                if meta.annotation(&key) != Some(value.as_str()) {
                    patch.add("annotations", true, &key, &value);
                }
            }
        }
    }
    if changed && let Some(value) = meta.annotation(NETWORKS) {
        let written = write_networks(value, &asks.namespace, &attachments);
        patch.add("annotations", true, NETWORKS, &written);
    }
}

/// The IPs a pod carries on each managed network
/// ([`ip_webhook_admission::networks::carried_on`]), for its DELETE and its validation; none when
/// its networks annotation cannot be read.
pub(crate) fn carried(
    webhook: &Webhook,
    meta: &Meta,
    namespace: &str,
) -> Vec<(Network, Vec<IpAddr>)> {
    if webhook.secondary.is_empty() {
        return Vec::new();
    }
    let networks = webhook.secondary.iter().map(|(network, _)| network);
    pod_network_ips(meta.annotations.as_ref(), namespace, networks).unwrap_or_default()
}

/// A pod's `/validate` on the managed networks: what it asks of them is read and checked as
/// `/mutate` checks it ([`asks`]: a pod that skipped `/mutate` gets the same refusals, an IP
/// outside a network's list among them); every IP it carries on one is its own claim (by UID
/// once bound, else by token); or free, then (a CREATE) recorded for it now as a static IP;
/// or held by another holder: refused, naming both. A CREATE's claims are then bound to its
/// UID. `Err` is the denial.
pub(crate) async fn validate(
    webhook: &Webhook,
    incoming: &Incoming<'_>,
    ask: &PodAsk<'_>,
) -> Result<(), Denial> {
    if webhook.secondary.is_empty() {
        return Ok(());
    }
    let (view, identity) = (&ask.view, &ask.identity());
    // a CREATE reads what it asks as /mutate reads it (and is refused alike); an UPDATE only
    // what it carries
    let on_networks = if incoming.request.operation == Operation::Create {
        let asks = asks(webhook, view)?;
        let asks = asks.map(|asks| asks.asks).unwrap_or_default();
        asks.into_iter()
            .map(|ask| (ask.network, ask.carried))
            .collect()
    } else {
        carried(webhook, view.meta, &view.namespace)
    };
    let token = identity
        .token
        .map(str::to_string)
        .unwrap_or_else(|| new_token(incoming.uid()));
    let records = incoming.request.operation == Operation::Create && !incoming.dry_run();
    let empty = IpSet::default();
    let request = &AllocationRequest {
        scope: ask.scope(),
        app: view.app.unwrap_or(""),
        pool: None,
        pod: view.pod_ref(),
        request_uid: incoming.uid(),
        token: &token,
        candidates: &empty,
        ordinal: None,
        vm: view.vm,
        migration: view.migration,
        dry_run: incoming.dry_run(),
    };
    for (network, ips) in on_networks {
        let Some(allocator) = webhook.secondary.get(&network) else {
            continue;
        };
        let mine = allocator.held_by(identity, &ips);
        let ledger_decides = identity.token.is_some() && records;
        let on_network = Carried {
            ips: &ips,
            mine: &mine,
            pod: &request.pod,
            vm: view.vm,
        };
        let unrecorded = carried::unrecorded(allocator, None, on_network, ledger_decides)
            .await
            .map_err(|denial| network_denial(&network, denial))?;
        if !records {
            continue;
        }
        if !unrecorded.is_empty() {
            allocator
                .claim_static(&unrecorded, request)
                .await
                .map_err(|error| network_denial(&network, error.into()))?;
        }
        let recorded = PodIdentity {
            token: Some(request.token),
            ..*identity
        };
        if let Err(error) = allocator.bind(&recorded, &ips, view.is_stateful()).await {
            return Err(Denial::NetworkBind {
                network: network.to_string(),
                error: error.to_string(),
            });
        }
    }
    Ok(())
}

/// A pod's DELETE on the managed networks: its claims on each turn `Terminating` until
/// `release_at`, found by who the pod is and by the IPs its networks annotation names.
pub(crate) async fn terminate(
    webhook: &Webhook,
    meta: &Meta,
    identity: &PodIdentity<'_>,
    release_at: u64,
) {
    for (network, ips) in carried(webhook, meta, identity.namespace) {
        let Some(allocator) = webhook.secondary.get(&network) else {
            continue;
        };
        match allocator.terminate(identity, &ips, release_at).await {
            Ok(terminating) if !terminating.is_empty() => {
                let ips: Vec<IpAddr> = terminating.iter().map(|c| c.ip).collect();
                tracing::info!(pod = %format!("{}/{}", identity.namespace, identity.name), %network, ips = ?ips, release_at, "terminating on a secondary network");
            }
            Ok(_) => {}
            // A DELETE is never blocked on our books; the release timer and sweeper catch up.
            Err(error) => {
                tracing::warn!(%error, %network, pod = identity.name, "could not mark the pod's claims terminating")
            }
        }
    }
}

/// The refusal of an update of a pod holding no claim whose networks annotation gives it new
/// IPs on a managed network: claims are recorded at a pod's creation only, so the IPs an
/// update names would be recorded for nobody, and the sandbox's next start would put the pod
/// on them while the network gives them to another pod. Kube-OVN's controller writing the IP
/// it allocated into its attachment annotation (the networks annotation unchanged) is not
/// such an update.
pub(crate) fn unclaimed_update_refusal(
    webhook: &Webhook,
    view: &PodView<'_>,
    old: &Meta,
) -> Option<String> {
    if old.annotation(NETWORKS) == view.meta.annotation(NETWORKS) {
        return None;
    }
    let before = carried(webhook, old, &view.namespace);
    let after = carried(webhook, view.meta, &view.namespace);
    let changed = after.iter().find(|(network, ips)| {
        let was = before
            .iter()
            .find(|(n, _)| n == network)
            .map(|(_, ips)| ips);
        !ips.is_empty() && was != Some(ips)
    })?;
    let (network, ips) = changed;
    Some(format!(
        "pod {}: an update cannot give the pod IPs on network {network} ({}): ip-webhook records a network's IPs when a pod is created; delete the pod and create it again with them instead",
        view.display(),
        ips.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// The refusal of an update of a pod holding a claim (on any interface) that changes the IPs
/// it carries on a managed network (in its networks annotation or a Kube-OVN attachment
/// annotation), or its networks annotation where it carries some: a DELETE reads the IPs
/// there, and the sandbox's next start would ask the network's IPAM for IPs nobody recorded.
pub(crate) fn update_refusal(webhook: &Webhook, view: &PodView<'_>, old: &Meta) -> Option<String> {
    let (before, after) = (old.annotation(NETWORKS), view.meta.annotation(NETWORKS));
    let carried_before = carried(webhook, old, &view.namespace);
    let same_ips = carried(webhook, view.meta, &view.namespace) == carried_before;
    let carries_any = carried_before.iter().any(|(_, ips)| !ips.is_empty());
    if same_ips && (before == after || !carries_any) {
        return None;
    }
    Some(format!(
        "pod {} holds IP claims on secondary networks, so annotation {NETWORKS} cannot be changed: it names the pod's IPs to Multus and to ip-webhook; to give the pod other IPs, delete the pod and create it again instead",
        view.display()
    ))
}
