//! `helm lint --strict` for every case, every rendered document through strict schema
//! validation, the values schema refusing typos, the plain manifest and Go durations.

use super::*;

#[test]
fn helm_lint_strict_passes_for_every_case_and_kubernetes_version() {
    let helm = helm();
    for case in CASES {
        for kube_version in KUBE_VERSIONS {
            let mut command = Command::new(&helm);
            command
                .args(["lint", "--strict", "--namespace", NAMESPACE])
                .args(["--kube-version", kube_version])
                .arg(chart_dir());
            for s in case.set {
                command.args(["--set", s]);
            }
            let output = run(&mut command);
            assert!(
                output.status.success(),
                "helm lint --strict, case {} on {kube_version}:\n{}{}",
                case.name,
                text(&output.stdout),
                text(&output.stderr)
            );
        }
    }
}

/// Kinds kubernetes-validate has no schema for, and that validate_crs.py checks instead.
const CUSTOM_KINDS: &[&str] = &["Certificate", "Issuer", "ServiceMonitor", "PrometheusRule"];

#[test]
fn every_rendered_document_passes_strict_schema_validation() {
    let helm = helm();
    let python = venv_tool("python");
    let dir = tempfile::tempdir().unwrap();
    // file -> the (kind, name) of each rendered document
    let mut rendered: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for kube_version in KUBE_VERSIONS {
        let mut files = Vec::new();
        for case in CASES {
            let yaml = template_text(&helm, case.set, kube_version).unwrap();
            let file = dir
                .path()
                .join(format!("{}-{kube_version}.yaml", case.name));
            std::fs::write(&file, &yaml).unwrap();
            let docs = parse_documents(&yaml);
            assert!(!docs.is_empty(), "case {} renders nothing", case.name);
            let names = docs
                .iter()
                .map(|d| {
                    (
                        d["kind"].as_str().unwrap().to_string(),
                        d["metadata"]["name"].as_str().unwrap().to_string(),
                    )
                })
                .collect();
            rendered.insert(file.display().to_string(), names);
            files.push(file);
        }
        let report = kubernetes_validate(&files, kube_version);
        let version = &kube_version[..4];
        for file in files.iter().map(|f| f.display().to_string()) {
            for (kind, name) in &rendered[&file] {
                if CUSTOM_KINDS.contains(&kind.as_str()) {
                    continue;
                }
                let key = format!("{}/{name}", kind.to_lowercase());
                let pass =
                    format!("INFO {file} passed for resource {key} against version {version}");
                assert!(
                    report.contains(&pass),
                    "{file}: {key} did not pass kubernetes-validate {version}:\n{report}"
                );
            }
        }
        for line in report.lines().filter(|l| l.starts_with("WARN")) {
            assert!(
                CUSTOM_KINDS
                    .iter()
                    .any(|k| line.contains(&format!("for kind {k} with"))),
                "unexpected warning: {line}"
            );
        }
    }

    // The kinds kubernetes-validate has no schema for (the same for every version).
    let crs = run(Command::new(&python)
        .arg(repo().join("tests/chart/validate_crs.py"))
        .args(rendered.keys()));
    let cr_report = text(&crs.stdout);
    assert!(
        crs.status.success(),
        "validate_crs.py failed:\n{cr_report}{}",
        text(&crs.stderr)
    );
    let mut custom_checked = 0;
    for (file, docs) in &rendered {
        for (kind, name) in docs {
            if CUSTOM_KINDS.contains(&kind.as_str()) {
                let pass = format!("PASS {file} {kind}/{name}");
                assert!(
                    cr_report.contains(&pass),
                    "{file}: {kind}/{name} not checked by validate_crs.py:\n{cr_report}"
                );
                custom_checked += 1;
            }
        }
    }
    assert!(
        custom_checked >= 4,
        "Certificate, Issuer, ServiceMonitor and PrometheusRule were checked"
    );
}

#[test]
fn values_schema_refuses_typos_and_out_of_range_settings() {
    let helm = helm();
    for (set, names) in [
        ("mutatingWebhook.timeoutSeconds=0", "timeoutSeconds"),
        ("validatingWebhook.timeoutSeconds=31", "timeoutSeconds"),
        ("validatingWebhook.certifcate.create=false", "certifcate"),
        ("mutatingWebhook.failurePolicy=fail", "failurePolicy"),
        ("validatingWebhook.certificate.source=vault", "source"),
        ("server.cni=flannel", "cni"),
        (
            "networkPolicy.webhookFrom[0].ipblock.cidr=10.0.0.0/8",
            "ipblock",
        ),
        ("clientAuth.allowedNames={a,}", "allowedNames"),
    ] {
        let error = template_text(&helm, &[set], "1.31.0")
            .expect_err(&format!("--set {set} must be refused"));
        assert!(
            error.contains(names) && error.contains("schema"),
            "--set {set}: the error should name {names}: {error}"
        );
    }
    // Go-style durations, as `serve` takes them.
    for set in [
        "server.reservationTTL=1m30s",
        "server.stickyGrace=1.5s",
        "server.resyncPeriod=2h45m",
        "metrics.serviceMonitor.scrapeTimeout=2.5s",
    ] {
        let rendered = template_text(&helm, &[set], "1.31.0");
        assert!(rendered.is_ok(), "--set {set}: {rendered:?}");
    }
    for (set, name) in [
        ("server.reservationTTL=2 minutes", "reservationTTL"),
        ("server.stickyGrace=5", "stickyGrace"),
        ("server.resyncPeriod=1d", "resyncPeriod"),
        ("persistence.size=lots", "size"),
        ("dnsPolicy=ClusterLast", "dnsPolicy"),
        ("rbac.calico=maybe", "calico"),
    ] {
        let error = template_text(&helm, &[set], "1.31.0")
            .expect_err(&format!("--set {set} must be refused"));
        assert!(
            error.contains(name) && error.contains("schema"),
            "--set {set}: {error}"
        );
    }
    let within = template_text(&helm, &["validatingWebhook.timeoutSeconds=30"], "1.31.0");
    assert!(within.is_ok(), "{within:?}");
}

#[test]
fn plain_manifest_is_the_chart_rendered_with_defaults() {
    helm();
    let output = run(Command::new("bash")
        .arg(repo().join("scripts/render-manifests.sh"))
        .arg("-"));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let shipped = std::fs::read_to_string(repo().join("deploy/manifests/ip-webhook.yaml"))
        .expect("deploy/manifests/ip-webhook.yaml exists");
    assert!(
        shipped == text(&output.stdout),
        "deploy/manifests/ip-webhook.yaml is stale; regenerate it with scripts/render-manifests.sh"
    );
    let docs = parse_documents(&shipped);
    assert_eq!(docs[0]["kind"], "Namespace");
    assert_eq!(docs[0]["metadata"]["name"], NAMESPACE);
    assert!(docs[1..].iter().all(|d| {
        d["metadata"].get("namespace").is_none() || d["metadata"]["namespace"] == NAMESPACE
    }));
}

/// Go durations pass the values schema and the real flag parser; other spellings are refused.
#[test]
fn duration_values_are_go_durations() {
    let helm = helm();
    let docs = render(
        &helm,
        &[
            "server.reservationTTL=1m30s",
            "server.stickyGrace=1.5h",
            "server.resyncPeriod=300s",
        ],
        "1.31.0",
    );
    let args = args(&docs);
    for wanted in [
        "--reservation-ttl=1m30s",
        "--sticky-grace=1.5h",
        "--resync-period=300s",
    ] {
        assert!(args.iter().any(|a| a == wanted), "{wanted} not in {args:?}");
    }
    let argv = std::iter::once("ip-webhook".to_string()).chain(args.iter().cloned());
    let serve = ip_webhook::cli::parse_serve(argv).unwrap();
    // the cluster's rules keep the TTL in seconds, and show it only in their debug form
    let cluster = format!("{:?}", serve.cluster);
    assert!(cluster.contains("reservation_ttl: 90,"), "{cluster}");
    assert_eq!(
        serve.webhook.settings.sticky_grace,
        std::time::Duration::from_secs(5400)
    );
    for bad in ["5 minutes", "5", "1m30"] {
        let error =
            template_text(&helm, &[&format!("server.stickyGrace={bad}")], "1.31.0").expect_err(bad);
        assert!(
            error.contains("stickyGrace") && error.contains("schema"),
            "{bad}: {error}"
        );
    }
}

/// The keys other charts use for what this chart spells otherwise
/// (`files/other-spellings.yaml`) get past the schema and are refused by the templates,
/// naming this chart's key; the chart's README lists each. A key nobody uses is refused by the
/// schema, naming it and where it is.
#[test]
fn other_charts_keys_are_refused_naming_this_charts() {
    let helm = helm();
    let spellings: Value = serde_yaml::from_str(
        &std::fs::read_to_string(chart_dir().join("files/other-spellings.yaml")).unwrap(),
    )
    .unwrap();
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let readme = std::fs::read_to_string(chart_dir().join("README.md")).unwrap();
    let spellings = spellings.as_object().unwrap();
    assert!(spellings.len() >= 10, "{spellings:?}");
    for (key, entry) in spellings {
        assert!(
            schema["properties"].get(key).is_some(),
            "values.schema.json refuses {key} before the templates can say what to use"
        );
        let (what, to_use) = (
            entry["for"].as_str().unwrap(),
            entry["use"].as_str().unwrap(),
        );
        let error = template_text(&helm, &[&format!("{key}=x")], "1.31.0")
            .expect_err(&format!("--set {key}=x must be refused"));
        assert!(
            error.contains(&format!(
                "{key} is not a value of this chart. For {what}, use {to_use}."
            )),
            "--set {key}=x: {error}"
        );
        assert!(
            readme.contains(&format!("| `{key}` | {what} | {to_use} |")),
            "the chart's README does not map {key}"
        );
    }
    // the common one, as other charts' READMEs spell it
    let error = template_text(&helm, &["certManager.enabled=false"], "1.31.0").unwrap_err();
    assert!(
        error.contains(
            "use `validatingWebhook.certificate.source`: `cert-manager` (the default), `helm`"
        ),
        "{error}"
    );
    let error = template_text(&helm, &["certMnager.enabled=false"], "1.31.0").unwrap_err();
    assert!(
        error.contains("at '': additional properties 'certMnager' not allowed"),
        "{error}"
    );
    let error = template_text(&helm, &["server.prot=9443"], "1.31.0").unwrap_err();
    assert!(
        error.contains("at '/server': additional properties 'prot' not allowed"),
        "{error}"
    );
}

/// No replica while a webhook is on would refuse every pod that asks for a fixed IP (or start
/// it on a random IP): refused, saying why and what to set; with both webhooks off nothing is
/// served, so nothing needs a replica.
#[test]
fn no_replicas_are_refused_while_a_webhook_is_on() {
    let helm = helm();
    for set in [
        &["replicaCount=0"][..],
        &["replicaCount=0", "mutatingWebhook.failurePolicy=Ignore"],
        &["replicaCount=0", "validatingWebhook.enabled=false"],
    ] {
        let error =
            template_text(&helm, set, "1.31.0").expect_err(&format!("{set:?} must be refused"));
        assert!(
            error.contains("replicaCount=0 leaves no replica to answer the webhooks")
                && error.contains(
                    "set mutatingWebhook.enabled=false and validatingWebhook.enabled=false"
                ),
            "{set:?}: {error}"
        );
    }
    let off = render(
        &helm,
        &[
            "replicaCount=0",
            "mutatingWebhook.enabled=false",
            "validatingWebhook.enabled=false",
        ],
        "1.31.0",
    );
    assert!(of_kind(&off, "Deployment").is_empty());
    assert!(of_kind(&off, "MutatingWebhookConfiguration").is_empty());
    let one_replica = render(&helm, &["replicaCount=1"], "1.31.0");
    assert_eq!(one(&one_replica, "Deployment")["spec"]["replicas"], 1);
}
