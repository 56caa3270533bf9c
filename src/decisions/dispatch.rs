//! Routing: decodes a review, hands it to `/mutate` or `/validate`, counts it, writes its one
//! decision log line (INFO for a grant or a denial, DEBUG for the rest) and encodes the
//! answer. Transport-free, so the HTTPS server and the `review` command share it.

use std::time::Instant;

use crate::decisions::Webhook;
use crate::decisions::assess::Answer;
use crate::decisions::mutate;
use crate::decisions::validate;
use crate::metrics::{Endpoint, Outcome};
use ip_webhook_admission::{self as admission, ReviewError};
use ip_webhook_ipam::ipset::push_ip;

impl Webhook {
    /// Answer one AdmissionReview body. `Err` means the body was not a usable review (HTTP 400).
    pub async fn review(&self, endpoint: Endpoint, body: &[u8]) -> Result<Vec<u8>, ReviewError> {
        let started = Instant::now();
        let series = self.metrics.webhook(&endpoint);
        series.in_flight.inc();
        let result = ip_webhook_ledger::health::with_deadline(
            started + self.settings.admission_deadline,
            self.decide(endpoint, body, started),
        )
        .await;
        series.in_flight.dec();
        let outcome = match &result {
            Ok(response) if response.allowed => Outcome::allowed,
            Ok(_) => Outcome::denied,
            Err(_) => Outcome::bad_request,
        };
        series.latency.observe(started.elapsed().as_secs_f64());
        series.requests(outcome).inc();
        result.map(|response| response.to_json())
    }

    async fn decide(
        &self,
        endpoint: Endpoint,
        body: &[u8],
        started: Instant,
    ) -> Result<admission::Response, ReviewError> {
        let incoming = match admission::decode(body) {
            Ok(incoming) => incoming,
            Err(error) => {
                tracing::info!(webhook = endpoint.as_str(), outcome = "bad_request", %error, latency_us = started.elapsed().as_micros() as u64, "admission decision");
                return Err(error);
            }
        };
        if let Err(refused) = admission::bounds::check(&incoming, &self.settings.app_label) {
            // One line, naming the field: the review's own names stay out of logs and metrics.
            tracing::info!(
                webhook = endpoint.as_str(),
                outcome = "denied",
                field = refused.field.as_str(),
                latency_us = started.elapsed().as_micros() as u64,
                "admission decision: a name is out of bounds"
            );
            return Ok(incoming.respond().deny(refused.to_string()));
        }
        // A pod's keys are checked at /mutate only, so the user sees each warning once. Read
        // before deciding, while the review is in the cache: a durable grant waits for its
        // commit, after which it is cold.
        let warnings = match (&endpoint, incoming.request.kind.kind.as_str()) {
            (Endpoint::mutate, "Pod")
                if incoming.request.operation == admission::Operation::Create =>
            {
                unknown_key_warnings(&incoming)?
            }
            _ => Vec::new(),
        };
        let Answer {
            response,
            app,
            ips,
            granted,
        } = match endpoint {
            Endpoint::mutate => mutate::mutate(self, &incoming).await?,
            Endpoint::validate if crate::decisions::claim_guard::handles(&incoming) => {
                Answer::from(crate::decisions::claim_guard::review(
                    &self.claim_guard,
                    &incoming,
                ))
            }
            Endpoint::validate => validate::validate(self, &incoming).await?,
        };
        let response = warnings
            .into_iter()
            .fold(response, admission::Response::warn);
        let answer = Answer {
            response,
            app,
            ips,
            granted,
        };
        log_decision(&incoming, &endpoint, &answer, started);
        Ok(answer.response)
    }
}

/// The one line per decision, with plain fields and no span. A state change (claims recorded)
/// and a denial are logged at INFO; every other decision (a dry run, a pod that asks for
/// nothing, a retried request, a validation that records nothing) at DEBUG, which costs one
/// level check when DEBUG is off: a line per admission at INFO was about 15 % of the durable
/// path's CPU.
fn log_decision(
    incoming: &admission::Incoming<'_>,
    endpoint: &Endpoint,
    answer: &Answer,
    started: Instant,
) {
    let Answer {
        response,
        app,
        ips,
        granted,
    } = answer;
    let info = *granted || !response.allowed;
    if !info && !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    // room for dotted IPv4 addresses and their commas: no regrowth as they are pushed
    let mut ip_text = String::with_capacity(16 * ips.len());
    for (i, ip) in ips.iter().enumerate() {
        if i > 0 {
            ip_text.push(',');
        }
        push_ip(&mut ip_text, ip);
    }
    macro_rules! decision_line {
        ($level:ident) => {
            tracing::$level!(
                uid = incoming.uid(),
                namespace = incoming.namespace(),
                app = app.as_deref().unwrap_or(""),
                ip = ip_text.as_str(),
                webhook = endpoint.as_str(),
                operation = incoming.request.operation.as_str(),
                kind = incoming.request.kind.kind.as_str(),
                name = incoming.request.name.as_deref().unwrap_or(""),
                outcome = if response.allowed {
                    "allowed"
                } else {
                    "denied"
                },
                dry_run = incoming.dry_run(),
                latency_us = started.elapsed().as_micros() as u64,
                reason = response.message.as_deref().unwrap_or(""),
                "admission decision"
            )
        };
    }
    if info {
        decision_line!(info);
    } else {
        decision_line!(debug);
    }
}

/// A warning for each `ip-webhook.io/` key of the pod that nothing reads.
fn unknown_key_warnings(incoming: &admission::Incoming<'_>) -> Result<Vec<String>, ReviewError> {
    let Some(pod) = incoming.metadata(false)? else {
        return Ok(Vec::new());
    };
    let meta = &pod.metadata;
    let marks = (meta.labels.as_ref(), meta.annotations.as_ref());
    Ok(admission::annotations::unknown_key_warnings(
        marks, "metadata",
    ))
}
