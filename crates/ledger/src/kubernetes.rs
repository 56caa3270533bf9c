//! The Kubernetes ledger: one `IPClaim` object per IP in use, through the API server.
//!
//! Creating the object named after the IP is the lock: the API server (etcd behind it) lets
//! exactly one create of a name succeed, and answers every other with `409 AlreadyExists`.
//! Every replica serves admissions; none needs to be the leader to claim an IP.
//!
//! Object names: an IPv4 address is already a valid DNS-1123 subdomain (`10.0.0.5`). An IPv6
//! address is written as `v6-` and its eight groups in lowercase hex without leading zeros,
//! joined by `-` (`fd00::a` → `v6-fd00-0-0-0-0-0-0-a`): one name per address, always a valid
//! name (no `::`, never ends in `-`) and reversible.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use kube::{Api, Client};

use super::claim::{CreateRule, create_rule, release_of, step_of};
use super::holder::{Carrier, VmRef};
use super::network::{NETWORK_LABEL, NETWORK_NAMESPACE_LABEL, Network};
use super::{
    Claim, CreateOutcome, Ledger, LedgerError, Phase, PodRef, Source, skip_corrupt, unix_now,
    unreadable_holder,
};
use crate::crd::{IPClaim, IPClaimSpec, IPClaimStatus, MigrationSource};

/// The finalizer every IPClaim carries: `kubectl delete ipclaim` on a running pod's claim
/// only marks it for deletion (its IP stays held); the ledger and the reconciler remove the
/// finalizer when they release the claim, the reconciler once the claim's pod is gone.
pub(crate) const FINALIZER: &str = "ip-webhook.io/pod-gone";

/// How many times `create` retries when the record it collided with vanished meanwhile.
const CREATE_ATTEMPTS: usize = 4;

/// The `IPClaim` name for an IP.
pub fn claim_name(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let groups: Vec<String> = v6.segments().iter().map(|g| format!("{g:x}")).collect();
            format!("v6-{}", groups.join("-"))
        }
    }
}

/// The IP an `IPClaim` name stands for; `None` for a name no IP encodes to.
pub(crate) fn ip_from_claim_name(name: &str) -> Option<IpAddr> {
    if let Some(groups) = name.strip_prefix("v6-") {
        let parts: Vec<&str> = groups.split('-').collect();
        if parts.len() != 8 {
            return None;
        }
        let mut segments = [0u16; 8];
        for (slot, part) in segments.iter_mut().zip(parts) {
            if part.is_empty() || part.len() > 4 || part != part.to_ascii_lowercase() {
                return None;
            }
            *slot = u16::from_str_radix(part, 16).ok()?;
        }
        let ip = IpAddr::V6(Ipv6Addr::from(segments));
        return (claim_name(&ip) == name).then_some(ip);
    }
    let ip: IpAddr = name.parse().ok()?;
    (ip.is_ipv4() && claim_name(&ip) == name).then_some(ip)
}

pub(crate) fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Reserved => "Reserved",
        Phase::Bound => "Bound",
        Phase::Terminating => "Terminating",
        Phase::Released => "Released",
    }
}

fn parse_phase(text: &str) -> Phase {
    match text {
        "Bound" => Phase::Bound,
        "Terminating" => Phase::Terminating,
        "Released" => Phase::Released,
        _ => Phase::Reserved,
    }
}

fn source_name(source: Source) -> &'static str {
    match source {
        Source::Allocated => "Allocated",
        Source::Static => "Static",
    }
}

/// RFC 3339 for unix seconds.
pub fn rfc3339(unix_seconds: u64) -> String {
    Timestamp::from_second(unix_seconds as i64)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn unix_seconds(text: &str) -> Option<u64> {
    text.parse::<Timestamp>()
        .ok()
        .and_then(|t| u64::try_from(t.as_second()).ok())
}

/// The object admission creates for `claim` (no status: the API server would drop it).
pub fn to_resource(claim: &Claim) -> IPClaim {
    network_resource(claim, None)
}

/// The name of the IPClaim of `ip` in the books of `network` (the primary interface's: none).
pub(crate) fn network_claim_name(ip: &IpAddr, network: Option<&Network>) -> String {
    match network {
        None => claim_name(ip),
        Some(network) => claim_name(ip) + &network.claim_suffix(),
    }
}

/// The object for `claim` in the books of `network`: its name carries the network, and its
/// labels name it.
fn network_resource(claim: &Claim, network: Option<&Network>) -> IPClaim {
    let name = network_claim_name(&claim.ip, network);
    let mut labels: std::collections::BTreeMap<String, String> = [(
        "app.kubernetes.io/managed-by".to_string(),
        "ip-webhook".to_string(),
    )]
    .into();
    if let Some(network) = network {
        labels.insert(NETWORK_LABEL.into(), network.name.clone());
        labels.insert(NETWORK_NAMESPACE_LABEL.into(), network.namespace.clone());
    }
    let mut resource = IPClaim::new(
        &name,
        IPClaimSpec {
            ip: claim.ip.to_string(),
            namespace: claim.pod.namespace.as_str().into(),
            app: claim.app.as_str().into(),
            pool: claim.pool.as_deref().map(Into::into),
            pod_name: claim.pod.name.as_str().into(),
            generate_name: claim.pod.generate_name.as_str().into(),
            pod_uid: claim.pod.uid.as_deref().map(Into::into),
            request_uid: claim.request_uid.to_string(),
            source: source_name(claim.source).to_string(),
            sticky: claim.sticky,
            token: claim.token.to_string(),
            list_size: claim.list_size.map(std::num::NonZeroU64::get),
            vm: claim.vm.as_deref().map(Into::into),
            migration_sources: migration_sources_spec(claim),
        },
    );
    resource.metadata = ObjectMeta {
        name: Some(name),
        labels: Some(labels),
        finalizers: Some(vec![FINALIZER.to_string()]),
        ..ObjectMeta::default()
    };
    resource
}

/// The migration sources a VM's claim remembers, as `spec.migrationSources` writes them.
fn migration_sources_spec(claim: &Claim) -> Vec<MigrationSource> {
    let sources = claim.vm.as_ref().map(|vm| vm.sources()).unwrap_or_default();
    sources
        .iter()
        .map(|source| MigrationSource {
            pod_name: source.name.to_string(),
            pod_uid: source.uid.as_deref().map(Into::into),
            token: source.token.to_string(),
        })
        .collect()
}

/// Delete `existing` only if it is still that very object (uid and resourceVersion), taking
/// our finalizer off first. `Ok(false)` when it changed or went meanwhile.
pub async fn delete_exact_object(
    api: &Api<IPClaim>,
    existing: &IPClaim,
) -> Result<bool, kube::Error> {
    let name = existing.metadata.name.clone().unwrap_or_default();
    let mut resource_version = existing.metadata.resource_version.clone();
    let finalizers = existing.metadata.finalizers.clone().unwrap_or_default();
    if finalizers.iter().any(|f| f == FINALIZER) {
        let rest: Vec<String> = finalizers.into_iter().filter(|f| f != FINALIZER).collect();
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": resource_version,
                "finalizers": if rest.is_empty() { serde_json::Value::Null } else { serde_json::json!(rest) },
            },
        });
        match api
            .patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
        {
            Ok(updated) => resource_version = updated.metadata.resource_version,
            Err(error) if is_status(&error, 404) || is_status(&error, 409) => return Ok(false),
            Err(error) => return Err(error),
        }
        if existing.metadata.deletion_timestamp.is_some() && rest.is_empty() {
            // someone deleted it already: it went with its last finalizer
            return Ok(true);
        }
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: existing.metadata.uid.clone(),
            resource_version,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&name, &params).await {
        Ok(_) => Ok(true),
        Err(error) if is_status(&error, 404) || is_status(&error, 409) => Ok(false),
        Err(error) => Err(error),
    }
}

/// The claim an `IPClaim` object records. `Err` names what is wrong with it.
pub fn from_resource(resource: &IPClaim) -> Result<Claim, LedgerError> {
    let name = resource.metadata.name.clone().unwrap_or_default();
    let corrupt = |reason: String| LedgerError::Corrupt {
        ip: name.clone(),
        reason,
    };
    let ip: IpAddr = resource
        .spec
        .ip
        .parse()
        .map_err(|_| corrupt(format!("spec.ip {:?} is not an IP", resource.spec.ip)))?;
    if let Some(network) = network_of(resource) {
        let want = network_claim_name(&ip, Some(&network));
        if name != want {
            return Err(corrupt(format!(
                "an IPClaim of network {network} for spec.ip {ip} is named {want}"
            )));
        }
        return claim_of(resource, ip);
    }
    match ip_from_claim_name(&name) {
        Some(named) if named == ip => {}
        Some(named) => {
            return Err(corrupt(format!(
                "its name stands for {named} but spec.ip is {ip} (the IPClaim for {ip} would be named {})",
                claim_name(&ip)
            )));
        }
        None => {
            return Err(corrupt(format!(
                "its name {name:?} encodes no IP (spec.ip is {ip}, whose IPClaim would be named {})",
                claim_name(&ip)
            )));
        }
    }
    claim_of(resource, ip)
}

/// The network whose books an IPClaim is in, from its labels; `None`: the primary interface's.
pub(crate) fn network_of(resource: &IPClaim) -> Option<Network> {
    let labels = resource.metadata.labels.as_ref()?;
    Some(Network {
        name: labels.get(NETWORK_LABEL)?.clone(),
        namespace: labels
            .get(NETWORK_NAMESPACE_LABEL)
            .cloned()
            .unwrap_or_default(),
    })
}

/// The claim an IPClaim named right for `ip` records.
fn claim_of(resource: &IPClaim, ip: IpAddr) -> Result<Claim, LedgerError> {
    let created_at = resource
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|Time(t)| u64::try_from(t.as_second()).ok())
        .unwrap_or_else(unix_now);
    // a status written for another grant than the spec's (the claim was taken over) is not
    // this claim's: it is Reserved, as a claim without a status is
    let status = resource
        .status
        .clone()
        .filter(|status| {
            status
                .request_uid
                .as_ref()
                .is_none_or(|uid| *uid == resource.spec.request_uid)
        })
        .unwrap_or_default();
    let reserved_at = status
        .reserved_at
        .as_deref()
        .and_then(unix_seconds)
        .unwrap_or(created_at);
    let updated_at = status
        .updated_at
        .as_deref()
        .and_then(unix_seconds)
        .unwrap_or(reserved_at);
    let spec = &resource.spec;
    Ok(Claim {
        ip,
        app: spec.app.as_str().into(),
        pool: spec.pool.as_deref().map(Into::into),
        pod: PodRef {
            namespace: spec.namespace.as_str().into(),
            name: spec.pod_name.as_str().into(),
            generate_name: spec.generate_name.as_str().into(),
            uid: spec
                .pod_uid
                .as_deref()
                .filter(|u| !u.is_empty())
                .map(Into::into),
        },
        request_uid: spec.request_uid.as_str().into(),
        phase: parse_phase(&status.phase),
        source: if spec.source == "Static" {
            Source::Static
        } else {
            Source::Allocated
        },
        created_at: reserved_at,
        updated_at,
        list_size: spec.list_size.and_then(std::num::NonZeroU64::new),
        token: spec.token.as_str().into(),
        release_at: status
            .release_at
            .as_deref()
            .and_then(unix_seconds)
            .map(crate::ReleaseAt::new),
        sticky: spec.sticky,
        vm: spec.vm.as_deref().filter(|vm| !vm.is_empty()).map(|vm| {
            let sources = spec.migration_sources.iter().map(|source| Carrier {
                name: source.pod_name.as_str().into(),
                uid: source.pod_uid.as_deref().map(Into::into),
                token: source.token.as_str().into(),
            });
            VmRef::named(vm).with_sources(sources.collect())
        }),
    })
}

/// The status the reconciler writes for a phase change now.
pub fn status_now(resource: &IPClaim, phase: Phase) -> IPClaimStatus {
    let now = rfc3339(unix_now());
    let reserved_at = resource
        .status
        .as_ref()
        .and_then(|s| s.reserved_at.clone())
        .or_else(|| {
            resource
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|Time(t)| t.to_string())
        });
    IPClaimStatus {
        phase: phase_name(phase).to_string(),
        reserved_at,
        updated_at: Some(now),
        release_at: None,
        request_uid: Some(resource.spec.request_uid.clone()),
    }
}

pub fn is_status(error: &kube::Error, code: u16) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == code)
}

fn storage(what: &str, error: kube::Error) -> LedgerError {
    LedgerError::Storage(format!("{what}: {error}"))
}

/// The IPClaims of the primary interface: those no secondary network's label marks.
pub const PRIMARY_SELECTOR: &str = "!ip-webhook.io/network";

pub struct KubeLedger {
    api: Api<IPClaim>,
    /// Whose books: the primary interface's (`None`) or a secondary network's.
    network: Option<Network>,
}

impl KubeLedger {
    /// The primary interface's IPClaims.
    pub fn new(client: Client) -> KubeLedger {
        KubeLedger {
            api: Api::all(client),
            network: None,
        }
    }

    /// The IPClaims of the secondary network `network`.
    pub(crate) fn for_network(client: Client, network: Network) -> KubeLedger {
        KubeLedger {
            api: Api::all(client),
            network: Some(network),
        }
    }

    fn name(&self, ip: &IpAddr) -> String {
        network_claim_name(ip, self.network.as_ref())
    }

    /// The list of these books' IPClaims.
    fn listing(&self) -> ListParams {
        let selector = match &self.network {
            None => PRIMARY_SELECTOR.to_string(),
            Some(network) => network.selector(),
        };
        ListParams::default().labels(&selector)
    }

    /// The IPClaim `name` and the claim it records; `None` when there is none, or when it
    /// cannot be read (skipped and counted: `doing` says what was not done to it).
    async fn read_held(
        &self,
        name: &str,
        doing: &str,
    ) -> Result<Option<(IPClaim, Claim)>, LedgerError> {
        let existing = match self.api.get_opt(name).await {
            Ok(Some(existing)) => existing,
            Ok(None) => return Ok(None),
            Err(error) => return Err(storage(&format!("reading IPClaim {name}"), error)),
        };
        match from_resource(&existing) {
            Ok(held) => Ok(Some((existing, held))),
            Err(error) => {
                skip_corrupt(
                    &error,
                    &format!("not {doing} an IPClaim that cannot be read"),
                );
                Ok(None)
            }
        }
    }

    /// Write `replacement` over `existing` in one write, if it is still that very object
    /// (its resourceVersion): no other create can find the IP free in between, as it could
    /// between a delete and a create. The status stays as it was, written for the old grant,
    /// so the claim reads as `Reserved` ([`from_resource`]). An object being deleted already
    /// goes with its finalizer instead, and the create is tried again. `Ok(false)`: it
    /// changed or went meanwhile.
    async fn take_over(
        &self,
        existing: &IPClaim,
        replacement: &IPClaim,
    ) -> Result<bool, LedgerError> {
        let name = existing.metadata.name.clone().unwrap_or_default();
        if existing.metadata.deletion_timestamp.is_some() {
            self.delete_exact(existing).await?;
            return Ok(false);
        }
        let mut replacement = replacement.clone();
        replacement.metadata.resource_version = existing.metadata.resource_version.clone();
        match self
            .api
            .replace(&name, &PostParams::default(), &replacement)
            .await
        {
            Ok(_) => Ok(true),
            Err(error) if is_status(&error, 404) || is_status(&error, 409) => Ok(false),
            Err(error) => Err(storage(&format!("taking over IPClaim {name}"), error)),
        }
    }

    /// Delete `existing` only if it is still that very object (uid and resourceVersion).
    async fn delete_exact(&self, existing: &IPClaim) -> Result<bool, LedgerError> {
        let name = existing.metadata.name.clone().unwrap_or_default();
        delete_exact_object(&self.api, existing)
            .await
            .map_err(|error| storage(&format!("deleting IPClaim {name}"), error))
    }
}

#[async_trait]
impl Ledger for KubeLedger {
    fn kind(&self) -> &'static str {
        "kubernetes"
    }

    async fn load(&self) -> Result<Vec<Claim>, LedgerError> {
        let list = self
            .api
            .list(&self.listing())
            .await
            .map_err(|e| storage("listing IPClaims", e))?;
        let mut claims = Vec::with_capacity(list.items.len());
        for resource in &list.items {
            match from_resource(resource) {
                Ok(claim) => claims.push(claim),
                Err(error) => skip_corrupt(&error, "skipping an IPClaim that cannot be read"),
            }
        }
        Ok(claims)
    }

    async fn get(&self, ip: IpAddr) -> Result<Option<Claim>, LedgerError> {
        let name = self.name(&ip);
        match self.api.get_opt(&name).await {
            Ok(Some(resource)) => Ok(Some(from_resource(&resource).unwrap_or_else(|error| {
                skip_corrupt(&error, "an unreadable IPClaim holds this IP");
                unreadable_holder(ip, &format!("IPClaim {name}"))
            }))),
            Ok(None) => Ok(None),
            Err(error) => Err(storage(&format!("reading IPClaim {name}"), error)),
        }
    }

    fn shared(&self) -> bool {
        true
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        self.api
            .list(&self.listing().limit(1))
            .await
            .map(|_| ())
            .map_err(|e| storage("listing IPClaims", e))
    }

    async fn create(&self, claim: Arc<Claim>) -> Result<CreateOutcome, LedgerError> {
        let claim = &*claim;
        let name = self.name(&claim.ip);
        let resource = network_resource(claim, self.network.as_ref());
        for _ in 0..CREATE_ATTEMPTS {
            let error = match self.api.create(&PostParams::default(), &resource).await {
                Ok(_) => return Ok(CreateOutcome::Created),
                Err(error) if is_status(&error, 409) => error,
                Err(error) => return Err(storage(&format!("creating IPClaim {name}"), error)),
            };
            tracing::debug!(%error, ip = %claim.ip, "IPClaim exists");
            let existing = match self.api.get_opt(&name).await {
                Ok(Some(existing)) => existing,
                // Deleted between our create and get: try again.
                Ok(None) => continue,
                Err(error) => return Err(storage(&format!("reading IPClaim {name}"), error)),
            };
            let held = match from_resource(&existing) {
                Ok(held) => held,
                Err(error) => {
                    // the object of this name exists, so the IP cannot be claimed here: the
                    // allocator tries the next one; an operator repairs or deletes the record
                    skip_corrupt(&error, "an unreadable IPClaim holds this IP; not taking it");
                    return Ok(CreateOutcome::AlreadyHeld(Box::new(unreadable_holder(
                        claim.ip,
                        &format!("IPClaim {name}"),
                    ))));
                }
            };
            match create_rule(Some(&held), claim) {
                CreateRule::Write => match self.take_over(&existing, &resource).await? {
                    true => return Ok(CreateOutcome::Created),
                    false => continue,
                },
                CreateRule::Existing => return Ok(CreateOutcome::for_existing(held, claim)),
                CreateRule::Held => return Ok(CreateOutcome::AlreadyHeld(Box::new(held))),
            }
        }
        Err(LedgerError::Storage(format!(
            "IPClaim {name} kept changing under {CREATE_ATTEMPTS} create attempts"
        )))
    }

    async fn release(&self, claim: &Claim) -> Result<bool, LedgerError> {
        let name = self.name(&claim.ip);
        let Some((existing, held)) = self.read_held(&name, "releasing").await? else {
            return Ok(false);
        };
        let Some(next) = release_of(&held, claim, unix_now()) else {
            return Ok(false);
        };
        if next.locks_ip() {
            let status = serde_json::json!({
                "metadata": {"resourceVersion": existing.metadata.resource_version},
                "status": status_now(&existing, Phase::Released),
            });
            return match self
                .api
                .patch_status(
                    &name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&status),
                )
                .await
            {
                Ok(_) => Ok(true),
                Err(error) if is_status(&error, 404) || is_status(&error, 409) => Ok(false),
                Err(error) => Err(storage(&format!("releasing IPClaim {name}"), error)),
            };
        }
        self.delete_exact(&existing).await
    }

    async fn transition(&self, current: &Claim, next: &Claim) -> Result<bool, LedgerError> {
        let name = self.name(&next.ip);
        let Some((existing, held)) = self.read_held(&name, "changing").await? else {
            return Ok(false);
        };
        let Some(next) = &step_of(&held, current, next) else {
            return Ok(false);
        };
        let params = kube::api::PatchParams::default();
        let mut resource_version = existing.metadata.resource_version.clone();
        if held.pod.uid != next.pod.uid
            || held.pod.name != next.pod.name
            || held.sticky != next.sticky
            || held.vm != next.vm
        {
            let spec = serde_json::json!({
                "metadata": {"resourceVersion": resource_version},
                "spec": {
                    "podUid": next.pod.uid, "podName": next.pod.name, "sticky": next.sticky,
                    // null removes the list (a merge patch's way to remove a field)
                    "migrationSources": Some(migration_sources_spec(next)).filter(|s| !s.is_empty()),
                },
            });
            match self
                .api
                .patch(&name, &params, &kube::api::Patch::Merge(&spec))
                .await
            {
                Ok(updated) => resource_version = updated.metadata.resource_version,
                Err(error) if is_status(&error, 404) || is_status(&error, 409) => {
                    return Ok(false);
                }
                Err(error) => return Err(storage(&format!("updating IPClaim {name}"), error)),
            }
        }
        let mut status = serde_json::to_value(status_now(&existing, next.phase))
            .map_err(|e| LedgerError::Storage(format!("encoding a status: {e}")))?;
        // null removes a release time a merge patch would otherwise keep
        status["releaseAt"] = next.release_at.map(|at| rfc3339(at.get())).into();
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": resource_version},
            "status": status,
        });
        match self
            .api
            .patch_status(&name, &params, &kube::api::Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(true),
            Err(error) if is_status(&error, 404) || is_status(&error, 409) => Ok(false),
            Err(error) => Err(storage(
                &format!("updating the status of IPClaim {name}"),
                error,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_dns_subdomain(name: &str) -> bool {
        name.len() <= 253 && name.split('.').all(super::super::network::is_dns_label)
    }

    #[test]
    fn a_networks_ipclaim_is_named_and_labelled_for_its_network_and_read_back() {
        let network = Network::parse("tenant-a/storage").unwrap();
        for ip in ["10.50.0.7", "fd00::7"] {
            let claim = Claim {
                ip: ip.parse().unwrap(),
                ..reserved_claim()
            };
            let resource = network_resource(&claim, Some(&network));
            let name = resource.metadata.name.clone().unwrap();
            assert!(name.ends_with(".storage.tenant-a"), "{name}");
            assert!(is_dns_subdomain(&name), "{name}");
            assert_eq!(network_of(&resource), Some(network.clone()));
            assert_eq!(from_resource(&resource).unwrap().ip, claim.ip);
            // the primary interface's object of the same IP is another name, unlabelled
            let primary = to_resource(&claim);
            assert_ne!(primary.metadata.name.as_deref(), Some(name.as_str()));
            assert_eq!(network_of(&primary), None);
            // a network's object under another name is damage, not a claim
            let mut misnamed = resource.clone();
            misnamed.metadata.name = Some(claim_name(&claim.ip));
            assert!(from_resource(&misnamed).is_err());
        }
    }

    #[test]
    fn names_are_valid_and_reversible() {
        for text in [
            "10.0.0.5",
            "0.0.0.0",
            "255.255.255.255",
            "fd00::a",
            "::",
            "::1",
            "fd00::",
            "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
            "::ffff:10.0.0.1",
        ] {
            let ip: IpAddr = text.parse().unwrap();
            let name = claim_name(&ip);
            assert!(is_dns_subdomain(&name), "{text} → {name}");
            assert_eq!(ip_from_claim_name(&name), Some(ip), "{name}");
        }
        assert_eq!(
            claim_name(&"fd00::a".parse().unwrap()),
            "v6-fd00-0-0-0-0-0-0-a"
        );
    }

    #[test]
    fn foreign_names_decode_to_nothing() {
        for name in [
            "web",
            "010.0.0.5",
            "v6-fd00-0-0-0-0-0-a",
            "v6-fd00-0-0-0-0-0-0-0a",
            "v6-FD00-0-0-0-0-0-0-a",
            "v6-fd00--0-0-0-0-0-a",
        ] {
            assert_eq!(ip_from_claim_name(name), None, "{name}");
        }
    }

    /// A reservation of a `generateName` pod, as admission records one.
    fn reserved_claim() -> Claim {
        crate::test_claims::builder("fd00::a", "web", "")
            .generate_name("web-7d9f-")
            .request("req-1")
            .pool("blue")
            .source(Source::Static)
            .at(1_700_000_000)
            .build()
    }

    #[test]
    fn claim_round_trips_through_the_resource() {
        let claim = reserved_claim();
        let mut resource = to_resource(&claim);
        assert_eq!(
            resource.metadata.name.as_deref(),
            Some("v6-fd00-0-0-0-0-0-0-a")
        );
        assert!(resource.status.is_none(), "admission writes no status");
        resource.metadata.creation_timestamp =
            Some(Time(Timestamp::from_second(1_700_000_000).unwrap()));
        assert_eq!(from_resource(&resource).unwrap(), claim);

        resource.status = Some(IPClaimStatus {
            phase: "Released".into(),
            reserved_at: Some(rfc3339(1_700_000_000)),
            updated_at: Some(rfc3339(1_700_000_300)),
            release_at: None,
            request_uid: None,
        });
        let released = from_resource(&resource).unwrap();
        assert_eq!(released.phase, Phase::Released);
        assert_eq!(released.updated_at, 1_700_000_300);
    }

    #[test]
    fn a_name_that_does_not_match_the_ip_is_corrupt() {
        let mut resource = to_resource(&Claim {
            pod: PodRef::default(),
            ..crate::test_claims::builder("10.0.0.5", "web", "")
                .request("r")
                .at(0)
                .build()
        });
        resource.spec.ip = "10.0.0.6".into();
        let error = from_resource(&resource).unwrap_err().to_string();
        assert_eq!(
            error,
            "ledger record for 10.0.0.5 is corrupt: its name stands for 10.0.0.5 but spec.ip is 10.0.0.6 (the IPClaim for 10.0.0.6 would be named 10.0.0.6)"
        );
    }
}
