//! Whether a KubeVirt virtual machine still holds its IP: the question a VM's claim is
//! released on ([`ip_webhook_ledger::Claim::vm`]), asked of the API server, never of a cache.
//!
//! A VM holds its IP while its VirtualMachine or its VirtualMachineInstance exists (a VMI
//! without a VM is a VM of its own); a stopped VM (a VirtualMachine with no VMI) keeps it
//! unless `--kubevirt-release-on-stop` is given. Read with two metadata GETs, served by the
//! API server from etcd with a quorum read, so the answer is never older than the claim.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::PartialObjectMeta;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use crate::decisions::kubevirt::GROUP;

/// Where a VM stands, as far as its IP is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum VmState {
    /// Its VirtualMachineInstance exists (running, starting, migrating or shutting down).
    Running,
    /// Its VirtualMachine exists and no VMI does.
    Stopped,
    /// Neither exists.
    Gone,
    /// The API server could not say; why.
    Unknown(String),
}

/// The longest a VM found holding its IP is not asked about again
/// ([`VmDirectory::remembering`]): the reconciler plans to drop a stopped VM's claim on every
/// pass, and each would otherwise cost two reads.
pub(crate) const KEPT_AT_MOST: Duration = Duration::from_secs(30);

/// Reads VirtualMachines and VirtualMachineInstances.
pub(crate) struct VmDirectory {
    client: Client,
    release_on_stop: bool,
    /// VMs (namespace, name) found holding their IP, and when.
    kept: Mutex<HashMap<(String, String), Instant>>,
    /// How long [`VmDirectory::holds_ip`] trusts such a finding.
    kept_for: Duration,
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1", kind), plural)
}

/// KubeVirt's `VirtualMachine`s (`kubevirt.io/v1`).
pub(crate) fn virtual_machines() -> ApiResource {
    resource("VirtualMachine", "virtualmachines")
}

/// KubeVirt's `VirtualMachineInstance`s (`kubevirt.io/v1`).
pub(crate) fn virtual_machine_instances() -> ApiResource {
    resource("VirtualMachineInstance", "virtualmachineinstances")
}

impl VmDirectory {
    pub(crate) fn new(client: Client, release_on_stop: bool) -> VmDirectory {
        VmDirectory {
            client,
            release_on_stop,
            kept: Mutex::default(),
            kept_for: Duration::ZERO,
        }
    }

    /// Answer [`VmDirectory::holds_ip`] from a finding that the VM holds its IP for this long
    /// (at most [`KEPT_AT_MOST`]): the reconciler's, which sees a deleted VM's claim again at
    /// its next pass, at the latest the next resync.
    pub(crate) fn remembering(mut self, kept_for: Duration) -> VmDirectory {
        self.kept_for = kept_for.min(KEPT_AT_MOST);
        self
    }

    /// The VM `namespace/name` as the API server has it now.
    pub(crate) async fn state(&self, namespace: &str, name: &str) -> VmState {
        let exists = |kind: &'static str, resource: ApiResource| async move {
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), namespace, &resource);
            api.get_metadata_opt(name)
                .await
                .map(|found| found.is_some())
                .map_err(|error| format!("reading {kind} {namespace}/{name} failed: {error}"))
        };
        match exists("VirtualMachineInstance", virtual_machine_instances()).await {
            Ok(true) => return VmState::Running,
            Ok(false) => {}
            Err(why) => return VmState::Unknown(why),
        }
        match exists("VirtualMachine", virtual_machines()).await {
            Ok(true) => VmState::Stopped,
            Ok(false) => VmState::Gone,
            Err(why) => VmState::Unknown(why),
        }
    }

    /// Whether the VM still holds its IP: `Ok(true)` running (or stopped, unless released on
    /// stop), `Ok(false)` once it may be freed, `Err` when the API server could not say.
    pub(crate) async fn holds_ip(&self, namespace: &str, name: &str) -> Result<bool, String> {
        let key = (namespace.to_string(), name.to_string());
        if self.recently_kept(&key) {
            return Ok(true);
        }
        let holds = self.verdict(self.state(namespace, name).await)?;
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if holds {
            kept.insert(key, Instant::now());
        } else {
            kept.remove(&key);
        }
        Ok(holds)
    }

    /// Whether the VM holds its IP in `state`.
    pub(crate) fn verdict(&self, state: VmState) -> Result<bool, String> {
        match state {
            VmState::Running => Ok(true),
            VmState::Stopped => Ok(!self.release_on_stop),
            VmState::Gone => Ok(false),
            VmState::Unknown(why) => Err(why),
        }
    }

    /// Forget that the VM `namespace/name` held its IP: it (or its VMI) was deleted, and the
    /// next lookup asks the API server.
    pub(crate) fn forget(&self, namespace: &str, name: &str) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.remove(&(namespace.to_string(), name.to_string()));
    }

    fn recently_kept(&self, key: &(String, String)) -> bool {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|_, at| at.elapsed() < self.kept_for);
        kept.contains_key(key)
    }
}

/// Follow deletions of `resource` (VirtualMachines, or VirtualMachineInstances when a stopped
/// VM's IP is freed) by their metadata: each deletion forgets what `vms` remembered of that
/// VM and wakes the reconciler, so a VM deleted while stopped is freed at once, not at the
/// next resync. Where KubeVirt is not installed (the API server does not serve the resource),
/// looks again every `recheck` and wakes nothing; nothing here gates readiness.
pub(crate) async fn watch_deletions(
    client: Client,
    resource: ApiResource,
    vms: Arc<VmDirectory>,
    caches: Arc<super::Caches>,
    recheck: Duration,
) {
    loop {
        let served = client
            .list_api_group_resources(&resource.api_version)
            .await
            .is_ok_and(|list| list.resources.iter().any(|r| r.name == resource.plural));
        if !served {
            tokio::time::sleep(recheck).await;
            continue;
        }
        // metadata only: a deletion is all that is read
        let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client.clone(), &resource);
        let stream = watcher(api, watcher::Config::default()).default_backoff();
        super::watches::drive(stream, "virtual machines", None, |event| match event {
            watcher::Event::Delete(object) => {
                if let (Some(namespace), Some(name)) = (
                    object.metadata.namespace.as_deref(),
                    object.metadata.name.as_deref(),
                ) {
                    vms.forget(namespace, name);
                }
                caches.mark_changed();
            }
            // after a relist, a deletion missed meanwhile shows only as an absence
            watcher::Event::InitDone => caches.mark_changed(),
            _ => {}
        })
        .await;
    }
}

/// The leader's watches of VM deletions ([`watch_deletions`]) of VirtualMachines and of
/// VMIs (a stopped VM's, or one without a VM), so a VM's claim is dropped at its deletion, not
/// at the next resync; each runs only while this replica leads.
pub(crate) fn spawn_deletion_watches(
    client: &Client,
    vms: &Arc<VmDirectory>,
    caches: &Arc<super::Caches>,
    leading: &tokio::sync::watch::Receiver<bool>,
    recheck: Duration,
) -> Vec<tokio::task::JoinHandle<()>> {
    // a VMI without a VM is a VM of its own: its deletion frees as a VM's does
    [virtual_machines(), virtual_machine_instances()]
        .into_iter()
        .map(|resource| {
            let (client, caches, vms) = (client.clone(), caches.clone(), vms.clone());
            tokio::spawn(super::lease::while_leading(
                leading.clone(),
                move || {
                    watch_deletions(
                        client.clone(),
                        resource.clone(),
                        vms.clone(),
                        caches.clone(),
                        recheck,
                    )
                },
                || {},
            ))
        })
        .collect()
}
