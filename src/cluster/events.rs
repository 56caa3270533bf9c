//! Kubernetes Events for refused allocations, on the pod's owner (the ReplicaSet, StatefulSet
//! or Job that keeps trying), so `kubectl describe` shows why pods are missing.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::decisions::events::{EventSink, Refused};
use crate::metrics::AllocationOutcome;

/// Event notes are limited to 1 KiB by the API server.
const NOTE_LIMIT: usize = 1000;

/// Publishes refusals as Events; never waits on the admission path.
pub(crate) struct KubeEvents {
    recorder: Recorder,
}

impl KubeEvents {
    pub(crate) fn new(client: Client, instance: Option<String>) -> KubeEvents {
        KubeEvents {
            recorder: recorder(client, instance),
        }
    }
}

/// Events reported as ip-webhook's, from `instance` (this replica's Lease identity, in-cluster).
pub(crate) fn recorder(client: Client, instance: Option<String>) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: "ip-webhook".into(),
            instance,
        },
    )
}

/// The Event reason for a refusal worth telling the owner about.
pub(crate) fn refusal_reason(outcome: &AllocationOutcome) -> Option<&'static str> {
    match outcome {
        AllocationOutcome::exhausted => Some("IPExhausted"),
        AllocationOutcome::conflict => Some("IPConflict"),
        _ => None,
    }
}

impl EventSink for KubeEvents {
    fn refused(&self, refused: &Refused<'_>) {
        let Some(reason) = refusal_reason(&refused.outcome) else {
            return;
        };
        if refused.dry_run {
            return;
        }
        let Some(owner) = refused
            .owners
            .iter()
            .find(|o| o.controller.unwrap_or(false))
            .or(refused.owners.first())
        else {
            return;
        };
        let reference = ObjectReference {
            api_version: Some(owner.api_version.clone()),
            kind: Some(owner.kind.clone()),
            name: Some(owner.name.clone()),
            namespace: Some(refused.pod.namespace.to_string()),
            uid: Some(owner.uid.clone()).filter(|u| !u.is_empty()),
            ..ObjectReference::default()
        };
        let note: String = refused.message.chars().take(NOTE_LIMIT).collect();
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: "AllocateFixedIP".into(),
            secondary: None,
        };
        let recorder = self.recorder.clone();
        tokio::spawn(async move {
            if let Err(error) = recorder.publish(&event, &reference).await {
                tracing::warn!(%error, reason = event.reason, "could not publish an Event");
            }
        });
    }
}
