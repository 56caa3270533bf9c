//! Instructions per admission review, for callgrind: counts that do not move with the noise of a
//! shared machine, to compare changes to the request path (decode, decide, log line, encode).
//!
//!   cargo build --release --example count_review
//!   valgrind --tool=callgrind --toggle-collect='count_review::measured' \
//!       target/release/examples/count_review [mutate|validate] [REVIEWS]
//!
//! Divide the reported `Collected` Ir by REVIEWS (default 1000). Each review is the pretty-printed
//! Pod CREATE fixture as a dry run, through `Webhook::review`, with the INFO decision line
//! formatted as `serve` does (text format) into a discarded buffer. No TLS, no HTTP: see
//! `scripts/bench-load.sh` for those.

#![forbid(unsafe_code)]

use std::sync::Arc;

use ip_webhook::decisions::{Settings, Webhook};
use ip_webhook::metrics::{Endpoint, Metrics};
use ip_webhook_ipam::allocator::Allocator;
use ip_webhook_ipam::pools::PoolCatalog;
use ip_webhook_ledger::MemoryLedger;

const REVIEW: &str = include_str!("../tests/fixtures/pod-create-v1.json");

// as the `ip-webhook` binary does
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[inline(never)]
fn measured(
    runtime: &tokio::runtime::Runtime,
    webhook: &Webhook,
    endpoint: Endpoint,
    body: &[u8],
    reviews: usize,
) -> usize {
    let mut bytes = 0;
    for _ in 0..reviews {
        let answer = runtime
            .block_on(webhook.review(endpoint.clone(), body))
            .expect("the fixture is a review");
        bytes += answer.len();
    }
    bytes
}

fn main() {
    let mut args = std::env::args().skip(1);
    let endpoint = match args.next().as_deref() {
        None | Some("mutate") => Endpoint::mutate,
        Some("validate") => Endpoint::validate,
        Some(other) => panic!("unknown endpoint {other:?}: use mutate or validate"),
    };
    let reviews: usize = args
        .next()
        .map_or(1000, |n| n.parse().expect("REVIEWS is a number"));
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .event_format(ip_webhook::server::logging::Text)
        .with_writer(std::io::sink)
        .finish();
    tracing::subscriber::set_global_default(subscriber).expect("no subscriber yet");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let allocator = runtime
        .block_on(Allocator::new(Arc::new(MemoryLedger::new())))
        .expect("empty ledger loads");
    let webhook = Webhook::new(
        Settings::default(),
        Arc::new(allocator),
        PoolCatalog::default(),
        Arc::new(Metrics::new()),
    );
    let body = REVIEW.replacen("\"dryRun\": false", "\"dryRun\": true", 1);
    assert_ne!(body, REVIEW, "the fixture has dryRun: false");
    let warm = measured(&runtime, &webhook, endpoint.clone(), body.as_bytes(), 1);
    let total = measured(&runtime, &webhook, endpoint, body.as_bytes(), reviews);
    assert_eq!(total, warm * reviews, "every answer is the same");
    println!("{reviews} reviews, {warm} bytes per answer");
}
