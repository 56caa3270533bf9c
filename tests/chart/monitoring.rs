//! The PrometheusRule and dashboard: the chart's copies of the shipped files, and the
//! queries against the metrics and labels the server exports.

use super::*;

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn chart_copies_of_the_monitoring_files_are_identical() {
    // Helm packages no symlink target outside the chart, so the chart has copies.
    for file in ["prometheusrule.yaml", "grafana-dashboard.json"] {
        assert!(
            read(&format!("deploy/monitoring/{file}"))
                == read(&format!("deploy/helm/ip-webhook/files/{file}")),
            "deploy/helm/ip-webhook/files/{file} differs from deploy/monitoring/{file}: copy it"
        );
    }
}

/// `text` with the substitutions the chart makes for a release.
fn rules_for_release(text: &str, job: &str, namespace: &str, timeout: u32) -> Value {
    // Helm's divf prints 4 and 2.5, as Rust's f64 Display does.
    let half = (f64::from(timeout) / 2.0).to_string();
    let text = text
        .replace(
            "job=\"ip-webhook\"",
            &format!("job=\"{job}\",namespace=\"{namespace}\""),
        )
        .replace(
            "timeoutSeconds (5 s)",
            &format!("timeoutSeconds ({timeout} s)"),
        )
        .replace(
            "rate(ip_webhook_webhook_latency_seconds_bucket[5m]))) > 2.5",
            &format!("rate(ip_webhook_webhook_latency_seconds_bucket[5m]))) > {half}"),
        );
    serde_yaml::from_str(&text).unwrap()
}

fn alert<'a>(rule: &'a Value, name: &str) -> &'a Value {
    rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .find(|r| r["alert"] == name)
        .unwrap_or_else(|| panic!("no alert {name}"))
}

#[test]
fn prometheus_rule_and_dashboard_render_from_the_shipped_files() {
    let helm = helm();
    let defaults = render(&helm, &[], "1.31.0");
    assert!(of_kind(&defaults, "PrometheusRule").is_empty());
    assert!(of_kind(&defaults, "ConfigMap").is_empty());

    let docs = render(&helm, case("monitoring").set, "1.31.0");
    let rule = one(&docs, "PrometheusRule");
    assert_eq!(rule["metadata"]["name"], RELEASE);
    assert_eq!(rule["metadata"]["namespace"], NAMESPACE);
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
    // The job Prometheus gives the targets: the ServiceMonitor sets no jobLabel, so it is
    // the Service's name.
    let service = one(&docs, "Service")["metadata"]["name"].as_str().unwrap();
    assert!(
        one(&docs, "ServiceMonitor")["spec"]
            .get("jobLabel")
            .is_none()
    );
    let file = read("deploy/monitoring/prometheusrule.yaml");
    let expected = rules_for_release(&file, service, NAMESPACE, 5);
    assert_eq!(rule["spec"], expected["spec"]);
    // The file is a PrometheusRule of its own, applied as is outside the chart.
    let standalone: Value = serde_yaml::from_str(&file).unwrap();
    assert_eq!(standalone["kind"], "PrometheusRule");
    assert!(file.contains("metrics.prometheusRule.enabled"));

    // The alert that matters most with failurePolicy: Fail.
    let down = alert(rule, "IPWebhookDown");
    assert_eq!(
        down["expr"],
        format!("absent(up{{job=\"{service}\",namespace=\"{NAMESPACE}\"}} == 1)")
    );
    assert_eq!(down["labels"]["severity"], "critical");
    // Timeouts in the texts are the chart's: every webhook entry has 5 s.
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        for entry in one(&docs, kind)["webhooks"].as_array().unwrap() {
            assert_eq!(entry["timeoutSeconds"], 5);
        }
    }
    let texts = rule["spec"].to_string();
    assert!(texts.contains("timeoutSeconds (5 s)"), "{texts}");
    assert!(!texts.contains("10 s"), "{texts}");
    // ...and follow them when they change.
    let mut set = case("monitoring").set.to_vec();
    set.extend([
        "mutatingWebhook.timeoutSeconds=8",
        "validatingWebhook.timeoutSeconds=9",
    ]);
    let slower = render(&helm, &set, "1.31.0");
    let rule = one(&slower, "PrometheusRule");
    assert_eq!(
        rule["spec"],
        rules_for_release(&file, service, NAMESPACE, 8)["spec"]
    );
    assert_eq!(
        alert(rule, "IPWebhookAdmissionSlow")["expr"]
            .as_str()
            .unwrap()
            .rsplit(' ')
            .next(),
        Some("4")
    );
    assert!(
        alert(rule, "IPWebhookLedgerSlow")["annotations"]["description"]
            .as_str()
            .unwrap()
            .contains("timeoutSeconds (8 s)")
    );

    // The dashboard, for Grafana's sidecar.
    let dashboard = one(&docs, "ConfigMap");
    assert_eq!(dashboard["metadata"]["name"], "ip-webhook-dashboard");
    assert_eq!(dashboard["metadata"]["namespace"], NAMESPACE);
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json_text = dashboard["data"]["ip-webhook.json"].as_str().unwrap();
    assert_eq!(json_text, read("deploy/monitoring/grafana-dashboard.json"));
    let parsed: Value = serde_json::from_str(json_text).unwrap();
    assert_eq!(parsed["uid"], "ip-webhook");
    let elsewhere = render(
        &helm,
        &[
            "metrics.dashboards.enabled=true",
            "metrics.dashboards.namespace=monitoring",
            "metrics.dashboards.annotations.grafana_folder=Network",
        ],
        "1.31.0",
    );
    let dashboard = one(&elsewhere, "ConfigMap");
    assert_eq!(dashboard["metadata"]["namespace"], "monitoring");
    assert_eq!(
        dashboard["metadata"]["annotations"]["grafana_folder"],
        "Network"
    );
}

/// Every PromQL expression of the alerts and the dashboard, with its legend or texts.
fn monitoring_queries() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let rule: Value = serde_yaml::from_str(&read("deploy/monitoring/prometheusrule.yaml")).unwrap();
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for r in group["rules"].as_array().unwrap() {
            out.push((
                r["expr"].as_str().unwrap().to_string(),
                r["annotations"].to_string(),
            ));
        }
    }
    let dashboard: Value =
        serde_json::from_str(&read("deploy/monitoring/grafana-dashboard.json")).unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push((
                target["expr"].as_str().unwrap().to_string(),
                target["legendFormat"].as_str().unwrap_or("").to_string(),
            ));
        }
    }
    out
}

/// Label names inside `by (...)`, `on (...)` and `group_left (...)` clauses.
fn grouping_labels(expr: &str) -> Vec<String> {
    let mut labels = Vec::new();
    for keyword in ["by (", "on (", "group_left ("] {
        for (at, _) in expr.match_indices(keyword) {
            let rest = &expr[at + keyword.len()..];
            let inner = &rest[..rest.find(')').unwrap()];
            labels.extend(inner.split(',').map(|l| l.trim().to_string()));
        }
    }
    labels
}

/// Names in `{{ $labels.x }}` and legend `{{x}}` templates.
fn template_labels(text: &str) -> Vec<String> {
    let mut labels = Vec::new();
    for (at, _) in text.match_indices("{{") {
        let inner = &text[at + 2..];
        let inner = inner[..inner.find("}}").unwrap()].trim();
        if let Some(name) = inner.strip_prefix("$labels.") {
            labels.push(name.to_string());
        } else if !inner.starts_with('$') {
            labels.push(inner.to_string());
        }
    }
    labels
}

/// The metric names (families and samples) and the label names of a /metrics text.
fn exported(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut names = BTreeSet::new();
    let mut labels = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            names.insert(rest.split(' ').next().unwrap().to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap();
        names.insert(line[..name_end].to_string());
        if line[name_end..].starts_with('{') {
            let mut rest = &line[name_end + 1..];
            while let Some(eq) = rest.find("=\"") {
                labels.insert(rest[..eq].trim_start_matches(',').to_string());
                // skip the quoted value (values here hold no escaped quotes)
                let after = &rest[eq + 2..];
                rest = &after[after.find('"').unwrap() + 1..];
                if rest.starts_with('}') {
                    break;
                }
            }
        }
    }
    (names, labels)
}

#[tokio::test]
async fn alerts_and_dashboard_query_the_metrics_and_labels_the_server_exports() {
    use ip_webhook::metrics::{Endpoint, Metrics};
    // A webhook with a pool app, a list app and a refusal, so every family has samples.
    let dir = tempfile::tempdir().unwrap();
    let pools = repo().join("tests/fixtures/status-pools.yaml");
    let mut config = common::serve_config(dir.path()).webhook;
    config.pools_file = Some(pools);
    let metrics = std::sync::Arc::new(Metrics::new());
    let ip_webhook::app::Built {
        webhook, ledger, ..
    } = ip_webhook::app::build(&config, metrics.clone(), &Default::default())
        .await
        .expect("webhook builds");
    let mut pooled = common::pod("prod", "api", "api-", None);
    pooled["metadata"]["annotations"]["ip-webhook.io/ip-pool"] = json!("blue");
    let listed = common::pod("default", "web", "web-", Some("10.0.0.10"));
    for (uid, pod) in [("u-1", pooled), ("u-2", listed.clone()), ("u-3", listed)] {
        let body = common::create(uid, pod).to_string();
        webhook
            .review(Endpoint::mutate, body.as_bytes())
            .await
            .expect("a review");
    }
    ledger.close().await;
    // In a cluster the Lease code sets it; off-cluster there is no Lease.
    metrics
        .leader
        .get_or_create(&ip_webhook::metrics::LeaseLabels {
            lease: "ip-webhook".into(),
        })
        .set(1);
    let text = metrics.encode();
    let (names, labels) = exported(&text);
    assert!(
        labels.contains("app_namespace") && !labels.contains("namespace"),
        "{labels:?}"
    );

    // What Prometheus adds to every target (prometheus-operator's ServiceMonitor), and
    // histogram buckets' le.
    let target_labels = [
        "job",
        "instance",
        "pod",
        "namespace",
        "service",
        "container",
        "le",
    ];
    let queries = monitoring_queries();
    assert!(queries.len() > 15);
    let mut families = 0;
    for (expr, texts) in &queries {
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if !(word.starts_with("ip_webhook_") || word.starts_with("process_")) {
                continue;
            }
            families += 1;
            let base = ["_bucket", "_total", "_sum", "_count"]
                .iter()
                .find_map(|suffix| word.strip_suffix(suffix))
                .unwrap_or(word);
            assert!(
                names.contains(word) || names.contains(base),
                "{expr}: the server exports no {word}:\n{text}"
            );
        }
        for label in grouping_labels(expr)
            .into_iter()
            .chain(template_labels(texts))
        {
            // Grouping app metrics by the target's namespace would merge default/web with
            // prod/web under the webhook's namespace.
            if label == "namespace" {
                panic!("{expr} ({texts}) uses the target's namespace label; use app_namespace");
            }
            assert!(
                labels.contains(&label) || target_labels.contains(&label.as_str()),
                "{expr} ({texts}): no label {label} on the server's metrics"
            );
        }
    }
    assert!(families > 20, "{families}");
    // The webhook-down alert and the process panels are there.
    let all: String = queries.iter().map(|(e, _)| e.as_str()).collect();
    assert!(all.contains("absent(up{job=\"ip-webhook\"} == 1)"));
    assert!(
        all.contains("process_resident_memory_bytes") && all.contains("process_cpu_seconds_total")
    );
}
