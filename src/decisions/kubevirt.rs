//! KubeVirt virtual machines: which pods are a VM's launcher pods, and who may create them.
//!
//! KubeVirt runs each VirtualMachineInstance (VMI) in a `virt-launcher-<vmi>-<random>` pod
//! that its controller creates with the labels `kubevirt.io: virt-launcher` and
//! `vm.kubevirt.io/name: <vmi>`, controlled by the VMI (`kubevirt.io/v1`, kind
//! `VirtualMachineInstance`), whose name is the VirtualMachine's (kubevirt/kubevirt
//! `pkg/virt-controller/services/template.go`, the labels in
//! `staging/src/kubevirt.io/api/core/v1/types.go`). A live migration's target pod is one more
//! launcher pod of the same VMI, labelled `kubevirt.io/migrationJobUID`
//! (`pkg/virt-controller/watch/migration/migration.go`).
//!
//! A launcher pod's claim is its VM's ([`ip_webhook_ledger::Claim::vm`]): the next launcher pod of
//! the VM takes it over in any phase ([`ip_webhook_ledger::claim::same_virtual_machine`]). That
//! is a promise only KubeVirt keeps, so a pod is taken for a launcher pod only when the
//! admission request comes from a user named in [`KubevirtSettings::controllers`]; a pod any
//! other user creates with the same labels and owner is an ordinary pod.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use ip_webhook_admission::{Incoming, Meta, OwnerRef};

/// The label KubeVirt puts on every launcher pod, and its value there.
pub(crate) const LAUNCHER_LABEL: (&str, &str) = ("kubevirt.io", "virt-launcher");
/// The API group of VirtualMachines and VirtualMachineInstances.
pub(crate) const GROUP: &str = "kubevirt.io";
/// The label KubeVirt puts on a live migration's target launcher pod (its value: the
/// migration's UID) (kubevirt/kubevirt `staging/src/kubevirt.io/api/core/v1/types.go`,
/// `MigrationJobLabel`).
pub(crate) const MIGRATION_LABEL: &str = "kubevirt.io/migrationJobUID";
/// The user KubeVirt's controller creates launcher pods as, in its default install.
pub(crate) const DEFAULT_CONTROLLER: &str = "system:serviceaccount:kubevirt:kubevirt-controller";

/// How ip-webhook treats virtual machines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KubevirtSettings {
    /// The users (as the API server names them in `userInfo.username`) whose pods are taken
    /// for launcher pods (`--kubevirt-controller`). Empty: no pod is a VM's.
    pub(crate) controllers: Vec<String>,
    /// Free a VM's IP once it is stopped (no VMI), not only once it is deleted
    /// (`--kubevirt-release-on-stop`).
    pub(crate) release_on_stop: bool,
}

impl Default for KubevirtSettings {
    fn default() -> Self {
        KubevirtSettings {
            controllers: vec![DEFAULT_CONTROLLER.to_string()],
            release_on_stop: false,
        }
    }
}

/// The VM a pod of these labels and owners is a launcher pod of: the name of the VMI that
/// controls it, when it also carries KubeVirt's launcher label. Says nothing of who made it.
pub(crate) fn launcher_vm<'m>(
    labels: Option<&'m BTreeMap<String, String>>,
    owners: impl IntoIterator<Item = (&'m str, &'m str, &'m str, bool)>,
) -> Option<&'m str> {
    let (key, value) = LAUNCHER_LABEL;
    if labels?.get(key).map(String::as_str) != Some(value) {
        return None;
    }
    owners
        .into_iter()
        .find(|(api_version, kind, name, controller)| {
            *controller
                && *kind == "VirtualMachineInstance"
                && api_version.split('/').next() == Some(GROUP)
                && !name.is_empty()
        })
        .map(|(_, _, name, _)| name)
}

/// [`launcher_vm`] of an admission's pod metadata.
pub(crate) fn launcher_vm_of(meta: &Meta) -> Option<&str> {
    launcher_vm(
        meta.labels.as_ref(),
        meta.owner_references.iter().flatten().map(owner_fields),
    )
}

/// [`launcher_vm`] of a pod's metadata as the API server returns it.
pub(crate) fn launcher_vm_of_object(meta: &ObjectMeta) -> Option<&str> {
    launcher_vm(
        meta.labels.as_ref(),
        meta.owner_references.iter().flatten().map(|owner| {
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.controller == Some(true),
            )
        }),
    )
}

fn owner_fields(owner: &OwnerRef) -> (&str, &str, &str, bool) {
    (
        owner.api_version.as_str(),
        owner.kind.as_str(),
        owner.name.as_str(),
        owner.controller.unwrap_or(false),
    )
}

/// Whether the pod is a live migration's target launcher pod ([`MIGRATION_LABEL`]); only
/// read for a pod [`admitted_vm`] takes for a launcher pod.
pub(crate) fn is_migration_target(meta: &Meta) -> bool {
    meta.label(MIGRATION_LABEL)
        .is_some_and(|uid| !uid.is_empty())
}

/// The VM whose launcher pod this admission creates: [`launcher_vm_of`], when the request's
/// user is one of the KubeVirt controllers.
pub(crate) fn admitted_vm<'m>(
    meta: &'m Meta,
    incoming: &Incoming<'_>,
    settings: &KubevirtSettings,
) -> Option<&'m str> {
    let vm = launcher_vm_of(meta)?;
    let user = incoming.username()?;
    settings.controllers.contains(&user).then_some(vm)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A launcher pod's metadata as KubeVirt writes it (the shape of
    /// `pkg/virt-controller/services/template.go`'s pod).
    fn launcher() -> Meta {
        serde_json::from_value(serde_json::json!({
            "generateName": "virt-launcher-db-",
            "namespace": "default",
            "labels": {
                "kubevirt.io": "virt-launcher",
                "kubevirt.io/created-by": "2076f683-2d58-4f46-a2d9-4cb682060e36",
                "vm.kubevirt.io/name": "db",
                "app": "db",
            },
            "ownerReferences": [{
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": "db",
                "uid": "2076f683-2d58-4f46-a2d9-4cb682060e36",
                "controller": true, "blockOwnerDeletion": true,
            }],
        }))
        .unwrap()
    }

    #[test]
    fn a_launcher_pod_is_its_vmis_and_needs_the_label_and_the_controlling_owner() {
        assert_eq!(launcher_vm_of(&launcher()), Some("db"));
        let mut unlabelled = launcher();
        unlabelled.labels.as_mut().unwrap().remove("kubevirt.io");
        assert_eq!(launcher_vm_of(&unlabelled), None);
        let mut not_controller = launcher();
        not_controller.owner_references.as_mut().unwrap()[0].controller = Some(false);
        assert_eq!(launcher_vm_of(&not_controller), None);
        let mut other_group = launcher();
        other_group.owner_references.as_mut().unwrap()[0].api_version = "example.com/v1".into();
        assert_eq!(launcher_vm_of(&other_group), None);
        let mut older_version = launcher();
        older_version.owner_references.as_mut().unwrap()[0].api_version =
            "kubevirt.io/v1alpha3".into();
        assert_eq!(launcher_vm_of(&older_version), Some("db"));
        let mut replica_set = launcher();
        replica_set.owner_references.as_mut().unwrap()[0].kind = "ReplicaSet".into();
        assert_eq!(launcher_vm_of(&replica_set), None);
    }
}
