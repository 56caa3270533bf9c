//! The chart's conventions as values, checked with the real tools (`.tools/helm`,
//! `kubernetes-validate --strict`): common labels and annotations, the image's registry and
//! digest, security contexts and probes, the Linux nodeSelector and the default priority, CRDs
//! as templates (`crds.enabled`, `crds.keep`), a namespaceSelector for each webhook entry, the
//! fixed-secret certificate mode, the schema's refusals, NOTES.txt and the generated README.
//! tests/chart/ covers the webhooks, RBAC, CEL and the documented install cases.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use common::helm::{
    NAMESPACE, RELEASE, chart_dir, helm, kubernetes_validate, of_kind, one, parse_documents, repo,
    run, template_text, text, venv_tool,
};

/// `helm template` as YAML text, or the failure's stderr.
fn template(set: &[&str], kube_version: &str) -> Result<String, String> {
    template_text(&helm(), set, kube_version)
}

fn render(set: &[&str]) -> Vec<Value> {
    parse_documents(
        &template(set, "1.31.0").unwrap_or_else(|e| panic!("helm template {set:?}: {e}")),
    )
}

fn pod(docs: &[Value]) -> &Value {
    &one(docs, "Deployment")["spec"]["template"]["spec"]
}

fn entries(docs: &[Value]) -> BTreeMap<String, Value> {
    docs.iter()
        .filter(|d| {
            d["kind"]
                .as_str()
                .is_some_and(|k| k.ends_with("WebhookConfiguration"))
        })
        .flat_map(|d| d["webhooks"].as_array().unwrap().clone())
        .map(|w| (w["name"].as_str().unwrap().to_string(), w))
        .collect()
}

const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// The value settings this file adds, each rendered, linted and validated.
const CASES: &[(&str, &[&str])] = &[
    ("defaults", &[]),
    (
        "common-metadata-and-digest",
        &[
            "global.commonLabels.team=network",
            "global.commonAnnotations.owner=platform",
            "image.registry=",
            "image.repository=registry.example/ip-webhook",
            "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "metrics.serviceMonitor.enabled=true",
            "metrics.dashboards.enabled=true",
            "networkPolicy.enabled=true",
            "networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.0/24",
        ],
    ),
    (
        "openshift",
        &[
            "podSecurityContext.runAsUser=null",
            "podSecurityContext.runAsGroup=null",
            "podSecurityContext.fsGroup=null",
            "startupProbe=null",
            "priorityClassName=",
            "nodeSelector=null",
        ],
    ),
    ("crds-off", &["crds.enabled=false"]),
    ("crds-not-kept", &["crds.keep=false"]),
    (
        "namespace-selectors",
        &[
            "mutatingWebhook.namespaceSelector.matchLabels.fixed-ips=enabled",
            "validatingWebhook.workloads.namespaceSelector.matchExpressions[0].key=team",
            "validatingWebhook.workloads.namespaceSelector.matchExpressions[0].operator=Exists",
        ],
    ),
    (
        "existing-certificate",
        &[
            "validatingWebhook.certificate.source=existing",
            "validatingWebhook.certificate.existingSecret=webhook-tls",
            "validatingWebhook.certificate.caBundle=Q0EK",
        ],
    ),
    (
        "embedded-with-common-annotations",
        &[
            "global.commonAnnotations.owner=platform",
            "server.ledger=embedded",
            "replicaCount=1",
            "persistence.enabled=true",
        ],
    ),
];

fn lint_case(helm: &Path, name: &str, set: &[&str], kube_version: &str) {
    let mut lint = Command::new(helm);
    lint.args(["lint", "--strict", "--namespace", NAMESPACE])
        .args(["--kube-version", kube_version])
        .arg(chart_dir());
    for s in set {
        lint.args(["--set", s]);
    }
    let output = run(&mut lint);
    assert!(
        output.status.success(),
        "helm lint --strict, {name} on {kube_version}:\n{}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
}

#[test]
fn every_case_lints_and_passes_strict_schema_validation() {
    let helm = helm();
    let dir = tempfile::tempdir().unwrap();
    let mut all_files = Vec::new();
    let mut custom = Vec::new();
    for kube_version in ["1.29.0", "1.31.0"] {
        let mut files = Vec::new();
        let mut expected = Vec::new();
        for (name, set) in CASES {
            // tests/chart/schema.rs lints its cases on both versions; once is enough for these.
            if kube_version == "1.31.0" {
                lint_case(&helm, name, set, kube_version);
            }
            let yaml = template(set, kube_version).unwrap();
            let file = dir.path().join(format!("{name}-{kube_version}.yaml"));
            std::fs::write(&file, &yaml).unwrap();
            for doc in parse_documents(&yaml) {
                let kind = doc["kind"].as_str().unwrap().to_string();
                let name = doc["metadata"]["name"].as_str().unwrap();
                if ["Certificate", "Issuer", "ServiceMonitor"].contains(&kind.as_str()) {
                    // no built-in schema: the models of their CRDs (validate_crs.py)
                    custom.push(format!("PASS {} {kind}/{name}", file.display()));
                    continue;
                }
                expected.push(format!(
                    "INFO {} passed for resource {}/{name} against version {}",
                    file.display(),
                    kind.to_lowercase(),
                    &kube_version[..4]
                ));
            }
            files.push(file);
        }
        let report = kubernetes_validate(&files, kube_version);
        for pass in &expected {
            assert!(report.contains(pass), "missing `{pass}` in:\n{report}");
        }
        all_files.extend(files);
    }
    let crs = run(Command::new(venv_tool("python"))
        .arg(repo().join("tests/chart/validate_crs.py"))
        .args(&all_files));
    let report = text(&crs.stdout);
    assert!(
        crs.status.success(),
        "validate_crs.py:\n{report}{}",
        text(&crs.stderr)
    );
    assert!(custom.len() >= 4, "{custom:?}");
    for pass in &custom {
        assert!(report.contains(pass), "missing `{pass}` in:\n{report}");
    }
}

#[test]
fn common_labels_and_annotations_reach_every_object() {
    let docs = render(CASES[1].1);
    assert!(docs.len() >= 10, "{} documents", docs.len());
    for doc in &docs {
        let what = format!("{} {}", doc["kind"], doc["metadata"]["name"]);
        assert_eq!(doc["metadata"]["labels"]["team"], "network", "{what}");
        assert_eq!(
            doc["metadata"]["labels"]["app.kubernetes.io/name"], "ip-webhook",
            "{what}"
        );
        assert_eq!(
            doc["metadata"]["annotations"]["owner"], "platform",
            "{what}"
        );
    }
    let template = &one(&docs, "Deployment")["spec"]["template"]["metadata"];
    assert_eq!(template["labels"]["team"], "network");
    assert!(template.get("annotations").is_none(), "{template}");
    // The chart's own annotations stay beside the common ones.
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        assert_eq!(
            one(&docs, kind)["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            format!("{NAMESPACE}/ip-webhook-serving-cert")
        );
    }
    for crd in of_kind(&docs, "CustomResourceDefinition") {
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"],
            "keep"
        );
    }
    let embedded = render(CASES[7].1);
    let claim = one(&embedded, "PersistentVolumeClaim");
    assert_eq!(
        claim["metadata"]["annotations"],
        json!({"helm.sh/resource-policy": "keep", "owner": "platform"})
    );
    // Without common metadata, no object carries an empty annotations map.
    let plain = render(&[]);
    for doc in &plain {
        if let Some(annotations) = doc["metadata"].get("annotations") {
            assert!(
                !annotations.as_object().unwrap().is_empty(),
                "{}",
                doc["kind"]
            );
        }
    }
}

fn image(set: &[&str]) -> String {
    pod(&render(set))["containers"][0]["image"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn the_image_is_registry_repository_and_tag_or_digest() {
    let chart: Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap())
            .unwrap();
    let app_version = chart["appVersion"].as_str().unwrap();
    assert_eq!(
        image(&[]),
        format!("ghcr.io/ip-webhook/ip-webhook:{app_version}")
    );
    assert_eq!(
        image(&["image.tag=1.2.3"]),
        "ghcr.io/ip-webhook/ip-webhook:1.2.3"
    );
    assert_eq!(
        image(&["image.registry=", "image.repository=ip-webhook"]),
        format!("ip-webhook:{app_version}")
    );
    let digest = format!("image.digest={DIGEST}");
    assert_eq!(
        image(&["image.tag=1.2.3", &digest]),
        format!("ghcr.io/ip-webhook/ip-webhook@{DIGEST}")
    );
    let refused = template(&["image.digest=latest"], "1.31.0").unwrap_err();
    assert!(refused.contains("/image/digest"), "{refused}");
}

#[test]
fn security_contexts_probes_node_selector_and_priority_are_values() {
    let docs = render(&[]);
    let pod = pod(&docs);
    assert_eq!(
        pod["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
               "seccompProfile": {"type": "RuntimeDefault"}})
    );
    let container = &pod["containers"][0];
    assert_eq!(
        container["securityContext"],
        json!({"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
               "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}})
    );
    assert_eq!(pod["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    // The startup probe holds liveness off for a minute; all three on the admin port.
    let startup = &container["startupProbe"];
    assert_eq!(
        startup["httpGet"],
        json!({"path": "/healthz", "port": "admin"})
    );
    let budget =
        startup["periodSeconds"].as_u64().unwrap() * startup["failureThreshold"].as_u64().unwrap();
    assert!(budget >= 60, "{startup}");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(
        container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "admin"),
        "the probes' port"
    );

    // OpenShift: the SCC picks the UID; probes and scheduling can be switched off.
    let docs = render(CASES[2].1);
    let pod = crate::pod(&docs);
    assert_eq!(
        pod["securityContext"],
        json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}})
    );
    assert!(pod["containers"][0].get("startupProbe").is_none());
    assert!(pod["containers"][0].get("livenessProbe").is_some());
    assert!(pod.get("priorityClassName").is_none() && pod.get("nodeSelector").is_none());
    let docs = render(&[
        "readinessProbe.periodSeconds=9",
        "securityContext.readOnlyRootFilesystem=false",
    ]);
    let container = &crate::pod(&docs)["containers"][0];
    assert_eq!(container["readinessProbe"]["periodSeconds"], 9);
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(
        container["securityContext"]["readOnlyRootFilesystem"],
        false
    );
    assert_eq!(
        container["securityContext"]["capabilities"]["drop"],
        json!(["ALL"])
    );
}

#[test]
fn crds_are_templates_kept_on_uninstall_and_can_be_left_out() {
    assert!(
        !chart_dir().join("crds").exists(),
        "crds/ is installed once and never upgraded by Helm: the CRDs are templates"
    );
    let shipped =
        parse_documents(&std::fs::read_to_string(chart_dir().join("files/crds.yaml")).unwrap());
    assert_eq!(shipped.len(), 2);
    let docs = render(&[]);
    let mut rendered: Vec<Value> = of_kind(&docs, "CustomResourceDefinition")
        .into_iter()
        .cloned()
        .collect();
    for crd in &mut rendered {
        let metadata = crd["metadata"].as_object_mut().unwrap();
        assert_eq!(
            metadata["annotations"],
            json!({"helm.sh/resource-policy": "keep"})
        );
        assert_eq!(metadata["labels"]["app.kubernetes.io/managed-by"], "Helm");
        metadata.remove("annotations");
        metadata.remove("labels");
    }
    // Apart from Helm's labels and the keep annotation, exactly `ip-webhook crds` (Helm's YAML
    // round trip writes `minimum: 0.0` as 0: the same number to the API server).
    assert_eq!(
        rendered.into_iter().map(numbers_as_f64).collect::<Vec<_>>(),
        shipped.into_iter().map(numbers_as_f64).collect::<Vec<_>>()
    );

    let not_kept = render(&["crds.keep=false"]);
    for crd in of_kind(&not_kept, "CustomResourceDefinition") {
        assert!(
            crd["metadata"].get("annotations").is_none(),
            "{}",
            crd["metadata"]
        );
    }
    let off = render(&["crds.enabled=false"]);
    assert!(of_kind(&off, "CustomResourceDefinition").is_empty());
    assert_eq!(of_kind(&off, "Deployment").len(), 1);
}

fn numbers_as_f64(value: Value) -> Value {
    match value {
        Value::Number(n) => json!(n.as_f64().unwrap()),
        Value::Array(items) => Value::Array(items.into_iter().map(numbers_as_f64).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, numbers_as_f64(v)))
                .collect(),
        ),
        other => other,
    }
}

fn names_of(selector: &Value) -> Option<Vec<String>> {
    let expression = &selector["matchExpressions"][0];
    (expression["key"] == "kubernetes.io/metadata.name").then(|| {
        expression["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    })
}

#[test]
fn each_webhook_entry_takes_its_own_namespace_selector() {
    let default = vec![NAMESPACE.to_string(), "kube-system".to_string()];
    let namespaced = [
        "pods.mutate.ip-webhook.io",
        "pod-deletes.mutate.ip-webhook.io",
        "pods.validate.ip-webhook.io",
        "pod-updates.validate.ip-webhook.io",
        "workloads.validate.ip-webhook.io",
        "deletes.validate.ip-webhook.io",
    ];
    let all = entries(&render(&[]));
    for name in namespaced {
        assert_eq!(
            names_of(&all[name]["namespaceSelector"]),
            Some(default.clone()),
            "{name}"
        );
    }

    let labelled = json!({"matchLabels": {"fixed-ips": "enabled"}});
    let team = json!({"matchExpressions": [{"key": "team", "operator": "Exists"}]});
    let set = entries(&render(CASES[5].1));
    // pod CREATE's selector is also the DELETE's and the updates' (the pods given an IP);
    // pods.validate keeps the default; the workloads' is its own.
    for name in namespaced {
        let want = match name {
            "pods.mutate.ip-webhook.io"
            | "pod-deletes.mutate.ip-webhook.io"
            | "pod-updates.validate.ip-webhook.io" => labelled.clone(),
            "workloads.validate.ip-webhook.io" | "deletes.validate.ip-webhook.io" => team.clone(),
            _ => all[name]["namespaceSelector"].clone(),
        };
        assert_eq!(set[name]["namespaceSelector"], want, "{name}");
    }

    let each = entries(&render(&[
        "mutatingWebhook.deleteNamespaceSelector.matchLabels.a=one",
        "validatingWebhook.pods.namespaceSelector.matchLabels.b=two",
        "validatingWebhook.podUpdates.namespaceSelector.matchLabels.c=three",
    ]));
    assert_eq!(
        names_of(&each["pods.mutate.ip-webhook.io"]["namespaceSelector"]),
        Some(default)
    );
    for (name, key, value) in [
        ("pod-deletes.mutate.ip-webhook.io", "a", "one"),
        ("pods.validate.ip-webhook.io", "b", "two"),
        ("pod-updates.validate.ip-webhook.io", "c", "three"),
    ] {
        assert_eq!(
            each[name]["namespaceSelector"],
            json!({"matchLabels": {key: value}}),
            "{name}"
        );
    }
    let refused = template(
        &["mutatingWebhook.namespaceSelector.matchLabel.x=y"],
        "1.31.0",
    )
    .unwrap_err();
    assert!(refused.contains("matchLabel"), "{refused}");
}

#[test]
fn the_schema_refuses_kube_ovn_reservation_without_kube_ovn() {
    let refused = template(&["server.kubeOvnReservation=true"], "1.31.0").unwrap_err();
    assert!(
        refused.contains("/server/cni") && refused.contains("kube-ovn"),
        "{refused}"
    );
    let refused = template(
        &["server.kubeOvnReservation=true", "server.cni=calico"],
        "1.31.0",
    )
    .unwrap_err();
    assert!(refused.contains("/server/cni"), "{refused}");
    let docs = render(&["server.kubeOvnReservation=true", "server.cni=kube-ovn"]);
    let args = &pod(&docs)["containers"][0]["args"];
    assert!(
        args.as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--kube-ovn-reservation=true"),
        "{args}"
    );
}

#[test]
fn secondary_networks_are_flags_and_the_schema_refuses_a_name_that_is_not_one() {
    let docs = render(&["server.networks={default/storage,tenant-a/backup}"]);
    let args = &pod(&docs)["containers"][0]["args"];
    let networks: Vec<&str> = args
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str()?.strip_prefix("--network="))
        .collect();
    assert_eq!(networks, ["default/storage", "tenant-a/backup"], "{args}");
    for bad in ["storage", "Default/storage", "a/b/c"] {
        let refused = template(&[&format!("server.networks={{{bad}}}")], "1.31.0").unwrap_err();
        assert!(refused.contains("/server/networks"), "{bad}: {refused}");
    }
}

#[test]
fn the_certificate_dns_names_start_without_a_blank_line() {
    let yaml = template(&[], "1.31.0").unwrap();
    let certificate = yaml
        .split("\n---")
        .find(|d| d.contains("\nkind: Certificate\n"))
        .expect("a Certificate");
    assert!(
        certificate.contains("  dnsNames:\n    - ip-webhook\n"),
        "{certificate}"
    );
    assert!(!certificate.contains("\n\n"), "{certificate}");
}

#[test]
fn an_existing_secret_renders_the_same_every_time_unlike_the_helm_generated_one() {
    let set = CASES[6].1;
    let first = template(set, "1.31.0").unwrap();
    assert_eq!(
        first,
        template(set, "1.31.0").unwrap(),
        "a GitOps diff stays empty"
    );
    let docs = parse_documents(&first);
    for kind in ["Certificate", "Issuer", "Secret"] {
        assert!(
            of_kind(&docs, kind).is_empty(),
            "no {kind}: the Secret is yours"
        );
    }
    let volume = pod(&docs)["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "tls")
        .unwrap()
        .clone();
    assert_eq!(volume["secret"]["secretName"], "webhook-tls");
    let all = entries(&docs);
    assert!(all.len() >= 6);
    for (name, entry) in &all {
        assert_eq!(entry["clientConfig"]["caBundle"], "Q0EK", "{name}");
    }
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        assert!(one(&docs, kind)["metadata"].get("annotations").is_none());
    }
    for (missing, value) in [
        ("existingSecret", "caBundle=Q0EK"),
        ("caBundle", "existingSecret=s"),
    ] {
        let refused = template(
            &[
                "validatingWebhook.certificate.source=existing",
                &format!("validatingWebhook.certificate.{value}"),
            ],
            "1.31.0",
        )
        .unwrap_err();
        assert!(refused.contains(missing), "{refused}");
    }
    // What docs/install.md warns GitOps users of: source=helm makes a new CA on every
    // `helm template` (there is no Secret to read back outside a cluster).
    let helm_set = ["validatingWebhook.certificate.source=helm"];
    assert_ne!(
        template(&helm_set, "1.31.0").unwrap(),
        template(&helm_set, "1.31.0").unwrap()
    );
}

/// NOTES.txt as `helm install` prints it (a client-side dry run: no cluster).
fn notes(set: &[&str]) -> String {
    let home = tempfile::tempdir().unwrap();
    let mut command = Command::new(helm());
    command
        .args(["install", RELEASE])
        .arg(chart_dir())
        .args(["--namespace", NAMESPACE, "--dry-run=client"])
        .env("HOME", home.path())
        .env("KUBECONFIG", home.path().join("none"));
    for s in set {
        command.args(["--set", s]);
    }
    let output = run(&mut command);
    let out = text(&output.stdout);
    assert!(output.status.success(), "{out}{}", text(&output.stderr));
    out.split_once("NOTES:\n")
        .unwrap_or_else(|| panic!("no NOTES in:\n{out}"))
        .1
        .to_string()
}

#[test]
fn notes_say_what_was_installed_and_how_to_check_it() {
    let notes = notes(&[]);
    for wanted in [
        "release ip-webhook in namespace ip-webhook-system",
        "Deployment/ip-webhook   2 replica(s) of ghcr.io/ip-webhook/ip-webhook:",
        "--cni=calico --ledger=kubernetes",
        "MutatingWebhookConfiguration/ip-webhook",
        "ValidatingWebhookConfiguration/ip-webhook",
        "CRDs fixedippools.ip-webhook.io, ipclaims.ip-webhook.io (kept on uninstall)",
        "kubectl -n ip-webhook-system rollout status deployment/ip-webhook",
        "certificate/ip-webhook-serving-cert",
    ] {
        assert!(notes.contains(wanted), "`{wanted}` missing:\n{notes}");
    }
    // The check command is one `kubectl ipw` accepts, aimed at the port-forwards above it.
    let check = notes
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("kubectl ipw check"))
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.trim().trim_end_matches('\\').trim())
        .collect::<Vec<_>>()
        .join(" ");
    let words: Vec<&str> = check.split_whitespace().collect();
    assert_eq!(&words[..3], ["kubectl", "ipw", "check"], "{notes}");
    let matches = ip_webhook::cli::command(true)
        .try_get_matches_from(std::iter::once("kubectl-ipw").chain(words[2..].iter().copied()))
        .unwrap_or_else(|e| panic!("`{check}` is refused: {e}"));
    let (_, check_args) = matches.subcommand().unwrap();
    assert_eq!(
        check_args
            .get_one::<String>("tls_server_name")
            .map(String::as_str),
        Some("ip-webhook.ip-webhook-system.svc")
    );
    assert!(
        notes.contains("port-forward svc/ip-webhook 8443:443"),
        "{notes}"
    );
    assert!(check.contains("--url https://127.0.0.1:8443"), "{check}");

    let off = crate::notes(&[
        "mutatingWebhook.enabled=false",
        "validatingWebhook.enabled=false",
    ]);
    assert!(off.contains("Both webhooks are off"), "{off}");
    assert!(!off.contains("kubectl ipw check"), "{off}");
    let existing = crate::notes(CASES[6].1);
    assert!(existing.contains("your Secret/webhook-tls"), "{existing}");
}

#[test]
fn the_chart_readme_is_generated_from_the_values() {
    let python = venv_tool("python");
    let output = run(Command::new(python)
        .arg(repo().join("scripts/chart-readme.py"))
        .arg("-"));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let shipped = std::fs::read_to_string(chart_dir().join("README.md")).unwrap();
    assert!(
        shipped == text(&output.stdout),
        "deploy/helm/ip-webhook/README.md is stale: run scripts/chart-readme.py"
    );
    // Each top-level value has a row, with its default.
    let values: Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap())
            .unwrap();
    for key in values.as_object().unwrap().keys() {
        assert!(
            shipped.contains(&format!("| `{key}")),
            "{key} has no row in the chart README"
        );
    }
    assert!(shipped.contains("| `crds.keep` | `true` |"), "{shipped}");
    assert!(
        shipped.contains("| `nodeSelector` | `{\"kubernetes.io/os\": \"linux\"}` |"),
        "{shipped}"
    );
}
