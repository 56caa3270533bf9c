//! A pod as ip-webhook reads it from lists and watches: [`ListedPod`], a [`Pod`] holding only
//! the fields the decisions read. Serde passes over the rest (containers, volumes, managed
//! fields, conditions, container statuses) without building them, which is most of the cost
//! of reading a big cluster's pods; the API server still sends them (it has no field
//! projection).

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Pod, PodIP, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
use serde::Deserialize;

/// A pod with only: name, namespace, UID, resource version, generateName, labels,
/// annotations, owner references, creation and deletion times and grace; `spec.nodeName`,
/// `spec.hostNetwork`; `status.phase`, `status.podIP`, `status.podIPs`. Everything that reads
/// a watched or listed pod (the pod index, the pod cache, `check --drift`) reads no more.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "Raw")]
pub(crate) struct ListedPod(pub Pod);

impl Resource for ListedPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Pod::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        Pod::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        Pod::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        Pod::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
struct Raw {
    #[serde(default)]
    metadata: ListedMeta,
    spec: Option<ListedSpec>,
    status: Option<ListedStatus>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListedMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generate_name: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListedSpec {
    node_name: Option<String>,
    host_network: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListedStatus {
    phase: Option<String>,
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(rename = "podIPs")]
    pod_ips: Option<Vec<PodIP>>,
}

impl From<Raw> for ListedPod {
    fn from(raw: Raw) -> ListedPod {
        ListedPod(raw.into_pod())
    }
}

impl Raw {
    fn into_pod(self) -> Pod {
        let meta = self.metadata;
        Pod {
            metadata: ObjectMeta {
                name: meta.name,
                namespace: meta.namespace,
                uid: meta.uid,
                resource_version: meta.resource_version,
                generate_name: meta.generate_name,
                labels: meta.labels,
                annotations: meta.annotations,
                owner_references: meta.owner_references,
                creation_timestamp: meta.creation_timestamp,
                deletion_timestamp: meta.deletion_timestamp,
                deletion_grace_period_seconds: meta.deletion_grace_period_seconds,
                ..Default::default()
            },
            spec: self.spec.map(|spec| PodSpec {
                node_name: spec.node_name,
                host_network: spec.host_network,
                ..Default::default()
            }),
            status: self.status.map(|status| PodStatus {
                phase: status.phase,
                pod_ip: status.pod_ip,
                pod_ips: status.pod_ips,
                ..Default::default()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_pod_keeps_the_fields_read_and_drops_the_rest() {
        let value = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "web-0", "namespace": "prod", "uid": "u1", "resourceVersion": "812",
                "finalizers": ["x/y"], "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"app": "web"}, "annotations": {"a": "b"},
                "managedFields": [{"manager": "kubectl", "operation": "Update"}],
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "x"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}],
                       "conditions": [{"type": "Ready", "status": "True"}]},
        });
        let ListedPod(pod) = serde_json::from_value(value.clone()).unwrap();
        let whole: Pod = serde_json::from_value(value).unwrap();
        let meta = &pod.metadata;
        assert_eq!(
            meta.resource_version.as_deref(),
            Some("812"),
            "the watcher resumes from it"
        );
        assert_eq!(meta.labels, whole.metadata.labels);
        assert_eq!(meta.annotations, whole.metadata.annotations);
        assert_eq!(meta.creation_timestamp, whole.metadata.creation_timestamp);
        assert_eq!(
            (meta.finalizers.as_ref(), meta.managed_fields.as_ref()),
            (None, None)
        );
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert!(spec.containers.is_empty());
        let status = pod.status.as_ref().unwrap();
        assert_eq!(status.pod_ips, whole.status.as_ref().unwrap().pod_ips);
        assert_eq!(status.conditions, None);
        assert_eq!(ListedPod::url_path(&(), None), "/api/v1/pods");
    }
}
