//! The CRD YAML shipped with the chart is exactly what the Rust types generate.

#[test]
fn chart_crds_match_the_rust_types() {
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/helm/ip-webhook/files/crds.yaml"
    ))
    .expect("the chart's CRD file exists");
    assert!(
        shipped == ip_webhook_ledger::crd::crds_yaml(),
        "deploy/helm/ip-webhook/files/crds.yaml is stale; regenerate it with \
         `cargo run -- crds > deploy/helm/ip-webhook/files/crds.yaml`"
    );
}
