//! The one table of workload kinds (`WORKLOAD_KINDS`): where each kind's resource, pod
//! template and pod count are, and how its pods are owned. The workload checks
//! (`workloads.rs`), the cluster's watches and `explain` read it.

/// A workload kind whose pod template is checked, watched in-cluster and explained: where
/// its resource is, where its pod template and pod count are, and how its pods are owned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WorkloadKind {
    pub(crate) group: &'static str,
    pub(crate) version: &'static str,
    pub(crate) kind: &'static str,
    /// The resource's plural (`deployments`).
    pub(crate) plural: &'static str,
    /// JSON pointer into `spec` to the pod template.
    pub(crate) template: &'static str,
    /// JSON pointer into `spec` to the number of pods at once (1 when absent).
    pub(crate) count: &'static str,
    /// The kind of the pods' controller: the ReplicaSet of a Deployment, the Job of a CronJob,
    /// else the workload itself.
    pub(crate) pod_owner: &'static str,
    /// Pods named `NAME-ORDINAL` (a StatefulSet), not from `generateName`.
    pub(crate) ordinal: bool,
}

const fn kind(
    group: &'static str,
    kind: &'static str,
    plural: &'static str,
    pod_owner: &'static str,
) -> WorkloadKind {
    WorkloadKind {
        group,
        version: "v1",
        kind,
        plural,
        template: "/template",
        count: "/replicas",
        pod_owner,
        ordinal: false,
    }
}

/// Every workload kind: the one list the webhook, the cluster's watches and `explain` read.
pub(crate) const WORKLOAD_KINDS: [WorkloadKind; 6] = [
    kind("apps", "Deployment", "deployments", "ReplicaSet"),
    WorkloadKind {
        ordinal: true,
        ..kind("apps", "StatefulSet", "statefulsets", "StatefulSet")
    },
    kind("apps", "ReplicaSet", "replicasets", "ReplicaSet"),
    kind("apps", "DaemonSet", "daemonsets", "DaemonSet"),
    WorkloadKind {
        count: "/parallelism",
        ..kind("batch", "Job", "jobs", "Job")
    },
    WorkloadKind {
        template: "/jobTemplate/spec/template",
        count: "/jobTemplate/spec/parallelism",
        ..kind("batch", "CronJob", "cronjobs", "Job")
    },
];

/// The workload kinds checked, as `(group, kind)`, from [`WORKLOAD_KINDS`].
pub(crate) const KINDS: [(&str, &str); WORKLOAD_KINDS.len()] = {
    let mut kinds = [("", ""); WORKLOAD_KINDS.len()];
    let mut i = 0;
    while i < kinds.len() {
        kinds[i] = (WORKLOAD_KINDS[i].group, WORKLOAD_KINDS[i].kind);
        i += 1;
    }
    kinds
};

/// The workload kind `kind` of API group `group`, if it is one.
pub(crate) fn workload_kind(group: &str, kind: &str) -> Option<&'static WorkloadKind> {
    WORKLOAD_KINDS
        .iter()
        .find(|w| w.group == group && w.kind == kind)
}

pub(crate) fn is_workload(group: &str, kind: &str) -> bool {
    workload_kind(group, kind).is_some()
}
