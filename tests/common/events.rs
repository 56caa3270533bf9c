//! Events as the API server keeps them (`events.k8s.io/v1`).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;

/// The events of `events` with this reason.
pub async fn events_with_reason(events: &Api<Event>, reason: &str) -> Vec<Event> {
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// Wait until events with this reason regard `objects` distinct objects; those events.
pub async fn events_on(events: &Api<Event>, reason: &str, objects: usize) -> Vec<Event> {
    super::eventually(
        &format!("{reason} events on {objects} objects"),
        Duration::from_secs(20),
        || async {
            let found = events_with_reason(events, reason).await;
            let on: BTreeSet<String> = found
                .iter()
                .filter_map(|e| e.regarding.as_ref()?.name.clone())
                .collect();
            (on.len() == objects).then_some(found)
        },
    )
    .await
}
