//! Carrying out the reconciler's plans ([`super::reconcile::Plan`]) against the API server:
//! IPClaim writes, Events about duplicates, `FixedIPPool.status`.

use super::ClusterError;
use super::reconcile::*;
use super::virtual_machines::VmDirectory;
use crate::metrics::{AdoptReason, Metrics};
use ip_webhook_ledger::crd::{FixedIPPool, FixedIPPoolStatus, IPClaim};
use ip_webhook_ledger::kubernetes::{
    claim_name, delete_exact_object, is_status, status_now, to_resource,
};
use ip_webhook_ledger::{Claim, Phase, PodRef, Source, unix_now};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::{Api, Resource};
use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

/// Carries out plans against the API server.
pub(crate) struct Executor {
    pub(crate) claims: Api<IPClaim>,
    pub(crate) pools: Api<FixedIPPool>,
    pub(crate) pods: Api<k8s_openapi::api::core::v1::Pod>,
    pub(crate) recorder: Recorder,
    /// Counts reclaimed leaks and expired reservations.
    pub(crate) metrics: Arc<Metrics>,
    /// Duplicates already reported (IP and the UIDs carrying it): one Event each.
    pub(crate) reported_duplicates: std::sync::Mutex<HashSet<(IpAddr, Vec<String>)>>,
    /// Asked before a virtual machine's claim is dropped: it goes with the VM, not its pod.
    /// Shared with the watch of VM deletions, which makes it forget what it remembered.
    pub(crate) vms: std::sync::Arc<VmDirectory>,
}

/// The live pod of the claim's name, when it is not the claim's pod but carries the claim's IP
/// and a claim token (so our webhooks admitted it): the holder a takeover displaced.
fn displaced_holder(claim: &IPClaim, live: &ObjectMeta) -> Option<ClaimingPod> {
    let pod = super::watches::claiming_pod(live, "")?;
    let ip: IpAddr = claim.spec.ip.parse().ok()?;
    (pod.namespace == claim.spec.namespace && pod.ips.contains(&ip) && pod.token.is_some())
        .then_some(pod)
}

fn name_of(resource: &IPClaim) -> String {
    resource.metadata.name.clone().unwrap_or_default()
}

impl Executor {
    /// Run every action; one failing (conflict, gone) does not stop the others.
    /// Returns how many actions changed something.
    pub(crate) async fn run(&self, plan: &Plan) -> usize {
        let mut done = 0;
        for action in &plan.actions {
            match self.act(action).await {
                Ok(true) => done += 1,
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, ?action, "reconcile action failed"),
            }
        }
        done
    }

    async fn act(&self, action: &Action) -> Result<bool, ClusterError> {
        match action {
            Action::Bind { claim, pod } => self.bind(claim, pod).await,
            Action::Keep { claim } => self.set_phase(claim, Phase::Released).await,
            Action::Drop { claim, reason } => self.drop_claim(claim, *reason).await,
            Action::Adopt { ip, pod, reason } => self.adopt(*ip, pod, *reason).await,
        }
    }

    async fn bind(&self, claim: &IPClaim, pod: &ClaimingPod) -> Result<bool, ClusterError> {
        let name = name_of(claim);
        let mut spec =
            serde_json::json!({"podUid": pod.uid, "podName": pod.name, "sticky": pod.stateful});
        if let Some(token) = &pod.token {
            spec["token"] = serde_json::json!(token);
        }
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": claim.metadata.resource_version},
            "spec": spec,
        });
        let updated = match self
            .claims
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(updated) => updated,
            Err(error) if is_status(&error, 404) || is_status(&error, 409) => return Ok(false),
            Err(error) => return Err(ClusterError::api("binding IPClaim", &name, error)),
        };
        self.set_phase(&updated, Phase::Bound).await?;
        tracing::info!(ip = %claim.spec.ip, pod = %format!("{}/{}", pod.namespace, pod.name), uid = %pod.uid, "claim bound");
        Ok(true)
    }

    async fn set_phase(&self, claim: &IPClaim, phase: Phase) -> Result<bool, ClusterError> {
        let name = name_of(claim);
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": claim.metadata.resource_version},
            "status": status_now(claim, phase),
        });
        match self
            .claims
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(true),
            Err(error) if is_status(&error, 404) || is_status(&error, 409) => Ok(false),
            Err(error) => Err(ClusterError::api(
                "updating the status of IPClaim",
                &name,
                error,
            )),
        }
    }

    async fn drop_claim(&self, claim: &IPClaim, reason: DropReason) -> Result<bool, ClusterError> {
        let name = name_of(claim);
        let vm = claim.spec.vm.as_deref().filter(|vm| !vm.is_empty());
        if let Some(vm) = vm {
            // the caches said its launcher pod is gone: the VM may still be there (stopped,
            // restarting, migrated away from that pod), and then it keeps its IP
            let holds = self.vms.holds_ip(&claim.spec.namespace, vm).await;
            if holds.map_err(ClusterError::VmLookup)? {
                return Ok(false);
            }
        }
        if let Some(uid) = claim.spec.pod_uid.as_deref()
            && !claim.spec.pod_name.is_empty()
        {
            // The caches said the pod is gone. A GET is served from etcd with a quorum read, so
            // it cannot be older than the bind; it decides before anything is freed.
            let pods: Api<k8s_openapi::api::core::v1::Pod> =
                Api::namespaced(self.pods.clone().into_client(), &claim.spec.namespace);
            let live = pods
                .get_metadata_opt(&claim.spec.pod_name)
                .await
                .map_err(|error| ClusterError::api("reading pod", &claim.spec.pod_name, error))?;
            if let Some(live) = live {
                if live.metadata.uid.as_deref() == Some(uid) {
                    return Ok(false);
                }
                if let Some(holder) = displaced_holder(claim, &live.metadata) {
                    return self.give_back_to(claim, &holder).await;
                }
            }
        }
        match delete_exact_object(&self.claims, claim).await {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(error) => return Err(ClusterError::api("deleting IPClaim", &name, error)),
        }
        let pod = if claim.spec.pod_name.is_empty() {
            format!("{}/{}*", claim.spec.namespace, claim.spec.generate_name)
        } else {
            format!("{}/{}", claim.spec.namespace, claim.spec.pod_name)
        };
        // who is gone: the VM for a VM's claim, else the pod (and its UID)
        let holder = match vm {
            Some(vm) => format!("vm {}/{vm}", claim.spec.namespace),
            None => format!(
                "pod {pod} (uid {})",
                claim.spec.pod_uid.as_deref().unwrap_or("?")
            ),
        };
        tracing::info!(ip = %claim.spec.ip, %pod, reason = reason.event_reason(), "claim dropped");
        match reason {
            DropReason::PodGone => {
                self.metrics.leaks_reclaimed.inc();
            }
            DropReason::ReservationExpired => {
                self.metrics.reservations_expired.inc();
            }
            DropReason::ReleaseDone => {}
        }
        if reason.is_leak() {
            let note = match reason {
                DropReason::PodGone => format!(
                    "IP {} returned to the pool: {holder} is gone and its release was missed",
                    claim.spec.ip
                ),
                _ => format!(
                    "IP {} returned to the pool: reserved for {pod} at admission, but no such pod appeared",
                    claim.spec.ip
                ),
            };
            self.event(claim, reason.event_reason(), note).await;
        }
        Ok(true)
    }

    /// `claim` is bound to a pod that never came (a create refused after the webhooks, such as
    /// a second CREATE of `db-0` answered AlreadyExists), while the live pod of that name
    /// still carries the IP it held before: the claim is its again.
    async fn give_back_to(
        &self,
        claim: &IPClaim,
        holder: &ClaimingPod,
    ) -> Result<bool, ClusterError> {
        let bound = self.bind(claim, holder).await?;
        if bound {
            tracing::warn!(
                ip = %claim.spec.ip,
                pod = %format!("{}/{}", holder.namespace, holder.name),
                uid = %holder.uid,
                never_created = claim.spec.pod_uid.as_deref().unwrap_or(""),
                "claim given back to the pod of that name that still carries the IP: the pod it was bound to was never created"
            );
        }
        Ok(bound)
    }

    async fn adopt(
        &self,
        ip: IpAddr,
        pod: &ClaimingPod,
        reason: AdoptReason,
    ) -> Result<bool, ClusterError> {
        let mut pod = pod.clone();
        // The index said so; the API server confirms before anything is recorded.
        if reason == AdoptReason::AppList && !self.still_runs_on(ip, &mut pod).await? {
            return Ok(false);
        }
        let pod = &pod;
        let claim = adopted_claim(ip, pod, reason);
        let mut resource = to_resource(&claim);
        resource.spec.sticky = pod.stateful;
        let created = match self.claims.create(&PostParams::default(), &resource).await {
            Ok(created) => created,
            Err(error) if is_status(&error, 409) => return Ok(false),
            Err(error) => {
                return Err(ClusterError::api(
                    "creating IPClaim",
                    &claim_name(&ip),
                    error,
                ));
            }
        };
        self.set_phase(&created, Phase::Bound).await?;
        let note = match reason {
            AdoptReason::Token => format!(
                "pod {}/{} carries IP {ip} without a claim; recorded it so it is not handed out again",
                pod.namespace, pod.name
            ),
            AdoptReason::AppList => format!(
                "pod {}/{} runs on IP {ip} (status.podIPs), one of the IPs of its app {}/{}, without a claim (it started before ip-webhook was installed); recorded it so it is not handed out again",
                pod.namespace, pod.name, pod.namespace, pod.app
            ),
        };
        self.metrics
            .adoptions
            .get_or_create(&crate::metrics::ReasonLabels {
                reason: reason.label(),
            })
            .inc();
        tracing::info!(%ip, pod = %format!("{}/{}", pod.namespace, pod.name), reason = reason.label(), "IP adopted");
        self.event(&created, "IPAdopted", note).await;
        Ok(true)
    }

    /// Whether the API server still has `pod` (the same UID) running on `ip` and not being
    /// deleted; if so, whether a StatefulSet controls it is taken from the live object.
    async fn still_runs_on(&self, ip: IpAddr, pod: &mut ClaimingPod) -> Result<bool, ClusterError> {
        let pods: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(self.pods.clone().into_client(), &pod.namespace);
        let live = match pods.get_opt(&pod.name).await {
            Ok(live) => live,
            Err(error) => return Err(ClusterError::api("reading pod", &pod.name, error)),
        };
        let Some(live) = live.filter(|l| l.metadata.uid.as_deref() == Some(&pod.uid)) else {
            return Ok(false);
        };
        let still = super::index::RunningPod::from_pod(&live).is_some_and(|s| s.ips.contains(&ip));
        if !still || live.metadata.deletion_timestamp.is_some() {
            return Ok(false);
        }
        pod.stateful = live
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "StatefulSet" && o.controller == Some(true));
        Ok(true)
    }

    async fn event(&self, claim: &IPClaim, reason: &str, note: String) {
        let event = KubeEvent {
            type_: EventType::Normal,
            reason: reason.to_string(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &claim.object_ref(&())).await {
            tracing::warn!(%error, reason, "could not publish an Event");
        }
    }

    /// Set `ip_webhook_duplicate_ips`, and for each duplicate not reported before, log it and
    /// record a Warning Event on every pod that carries the IP (the older one keeps it).
    pub(crate) async fn report_duplicates(&self, duplicates: &[Duplicate]) {
        self.metrics
            .duplicate_ips
            .set(i64::try_from(duplicates.len()).unwrap_or(i64::MAX));
        let current: HashSet<(IpAddr, Vec<String>)> = duplicates
            .iter()
            .map(|d| (d.ip, d.pods.iter().map(|p| p.uid.clone()).collect()))
            .collect();
        let fresh: Vec<&Duplicate> = {
            let mut reported = self
                .reported_duplicates
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let fresh = duplicates
                .iter()
                .filter(|d| {
                    !reported.contains(&(d.ip, d.pods.iter().map(|p| p.uid.clone()).collect()))
                })
                .collect();
            *reported = current;
            fresh
        };
        for duplicate in fresh {
            let names: Vec<String> = duplicate
                .pods
                .iter()
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .collect();
            tracing::error!(ip = %duplicate.ip, pods = ?names, "two or more live pods carry one IP");
            let note = format!(
                "IP {} is carried by {} live pods: {} (the oldest, {}, keeps it; delete the others)",
                duplicate.ip,
                names.len(),
                names.join(", "),
                names[0]
            );
            for pod in &duplicate.pods {
                let reference = k8s_openapi::api::core::v1::ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.name.clone()),
                    namespace: Some(pod.namespace.clone()),
                    uid: Some(pod.uid.clone()),
                    ..Default::default()
                };
                let event = KubeEvent {
                    type_: EventType::Warning,
                    reason: "DuplicateIP".into(),
                    note: Some(note.clone()),
                    action: "Reconcile".into(),
                    secondary: None,
                };
                if let Err(error) = self.recorder.publish(&event, &reference).await {
                    tracing::warn!(%error, "could not publish a DuplicateIP Event");
                }
            }
        }
    }

    /// Write `FixedIPPool.status` where it changed.
    pub(crate) async fn write_pool_statuses(
        &self,
        pools: &[FixedIPPool],
        statuses: &[(String, FixedIPPoolStatus)],
    ) {
        for (name, status) in statuses {
            let current = pools
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(name))
                .and_then(|p| p.status.as_ref());
            if current == Some(status) {
                continue;
            }
            let patch = serde_json::json!({ "status": status });
            if let Err(error) = self
                .pools
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::warn!(%error, pool = %name, "could not write FixedIPPool status");
            }
        }
    }
}

/// The Bound claim an adopted IP gets: static for a pod that carries a claim token, allocated
/// for a pod on its app's list; sticky for a StatefulSet's pod.
fn adopted_claim(ip: IpAddr, pod: &ClaimingPod, reason: AdoptReason) -> Claim {
    Claim {
        ip,
        app: pod.app.as_str().into(),
        pool: None,
        pod: PodRef {
            namespace: pod.namespace.as_str().into(),
            name: pod.name.as_str().into(),
            generate_name: Default::default(),
            uid: Some(pod.uid.as_str().into()),
        },
        request_uid: format!("adopted-{}", pod.uid).into(),
        phase: Phase::Bound,
        source: match reason {
            AdoptReason::Token => Source::Static,
            AdoptReason::AppList => Source::Allocated,
        },
        created_at: unix_now(),
        updated_at: unix_now(),
        list_size: None,
        token: pod.token.as_deref().unwrap_or("").into(),
        release_at: None,
        sticky: pod.stateful,
        vm: pod.vm.as_deref().map(Into::into),
    }
}
