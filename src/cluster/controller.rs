//! The kind of a pod's controller owner: what the pod index records for each pod and
//! node-loss release (`node_loss.rs`) and the reconciler's plans (`reconcile.rs`) read.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// The kind of a pod's controller owner, as far as node-loss release cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ControllerKind {
    ReplicaSet,
    Job,
    DaemonSet,
    StatefulSet,
    /// A KubeVirt launcher pod's: its VM's IP goes only with the VM.
    VirtualMachineInstance,
    Other,
}

impl ControllerKind {
    /// The kind of the owner reference marked `controller: true`; `None` for a bare pod.
    pub(crate) fn of(owners: Option<&[OwnerReference]>) -> Option<ControllerKind> {
        let owner = owners?.iter().find(|o| o.controller == Some(true))?;
        Some(match owner.kind.as_str() {
            "ReplicaSet" => ControllerKind::ReplicaSet,
            "Job" => ControllerKind::Job,
            "DaemonSet" => ControllerKind::DaemonSet,
            "StatefulSet" => ControllerKind::StatefulSet,
            "VirtualMachineInstance" => ControllerKind::VirtualMachineInstance,
            _ => ControllerKind::Other,
        })
    }

    /// Whether the controller replaces a pod by one with a new name (so the old pod's IP is
    /// not waited for by its successor).
    pub(crate) fn replaces_under_new_name(self) -> bool {
        matches!(
            self,
            ControllerKind::ReplicaSet | ControllerKind::Job | ControllerKind::DaemonSet
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(kind: &str, controller: bool) -> Vec<OwnerReference> {
        vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: "x".into(),
            uid: "u".into(),
            controller: Some(controller),
            ..OwnerReference::default()
        }]
    }

    #[test]
    fn only_controllers_that_rename_replacements_qualify() {
        for (kind, renamed) in [
            ("ReplicaSet", true),
            ("Job", true),
            ("DaemonSet", true),
            ("StatefulSet", false),
            ("VirtualMachineInstance", false),
            ("Node", false),
        ] {
            let of = ControllerKind::of(Some(&owners(kind, true))).unwrap();
            assert_eq!(of.replaces_under_new_name(), renamed, "{kind}");
        }
        assert_eq!(ControllerKind::of(None), None);
        assert_eq!(ControllerKind::of(Some(&owners("ReplicaSet", false))), None);
    }
}
