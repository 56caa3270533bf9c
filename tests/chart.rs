//! The Helm chart, checked with the real tools: `helm lint --strict` and `helm template` for
//! each documented switch, every rendered document through `kubernetes-validate --strict`
//! (cert-manager and prometheus-operator kinds through models generated from their CRDs),
//! the rendered facts asserted, the CEL matchConditions evaluated on pod shapes, and the
//! Deployment's flags, ports and paths compared with what `ip-webhook serve --help` accepts.
//!
//! The tools come from `scripts/install-test-deps.sh` (`.tools/helm`, `.tools/venv`); a test
//! whose tool is missing prints why and returns.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use base64::Engine;
use clap::Parser;
use serde_json::{Value, json};

use common::helm::{
    NAMESPACE, RELEASE, chart_dir, helm, kubernetes_validate, of_kind, one, parse_documents, repo,
    run, template_text, text, venv_tool,
};

const SERVICE_DNS: &str = "ip-webhook.ip-webhook-system.svc";

/// One documented way to install the chart.
struct Case {
    name: &'static str,
    set: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case {
        name: "defaults",
        set: &[],
    },
    Case {
        name: "validating-disabled",
        set: &["validatingWebhook.enabled=false"],
    },
    Case {
        name: "external-certificate",
        set: &["validatingWebhook.certificate.create=false"],
    },
    Case {
        name: "helm-certificate",
        set: &["validatingWebhook.certificate.source=helm"],
    },
    Case {
        name: "no-webhooks",
        set: &[
            "validatingWebhook.enabled=false",
            "mutatingWebhook.enabled=false",
        ],
    },
    Case {
        name: "everything-on",
        set: &[
            "validatingWebhook.kubeOvnSubnets.enabled=true",
            "validatingWebhook.calicoIPPools.enabled=true",
            "metrics.serviceMonitor.enabled=true",
            "excludeNamespaces={monitoring,kube-system}",
            "server.extraArgs={--tls-reload-interval=5s}",
        ],
    },
    Case {
        name: "monitoring",
        set: &[
            "metrics.serviceMonitor.enabled=true",
            "metrics.prometheusRule.enabled=true",
            "metrics.prometheusRule.labels.release=prometheus",
            "metrics.dashboards.enabled=true",
        ],
    },
    Case {
        name: "embedded-ledger",
        set: &[
            "server.ledger=embedded",
            "replicaCount=1",
            "persistence.enabled=true",
            "persistence.storageClass=fast",
            "persistence.size=2Gi",
        ],
    },
    Case {
        name: "host-network-and-extra-volumes",
        set: &[
            "hostNetwork=true",
            "server.port=10260",
            "server.adminPort=10261",
            "extraVolumes[0].name=etcd-client",
            "extraVolumes[0].secret.secretName=etcd-client-tls",
            "extraVolumeMounts[0].name=etcd-client",
            "extraVolumeMounts[0].mountPath=/etc/etcd",
            "extraVolumeMounts[0].readOnly=true",
        ],
    },
    Case {
        name: "hardened",
        set: HARDENED,
    },
];

/// Client certificates (CA from a ConfigMap) and the NetworkPolicy, as docs/security.md says.
const HARDENED: &[&str] = &[
    "clientAuth.enabled=true",
    "clientAuth.caConfigMap=apiserver-client-ca",
    "clientAuth.allowedNames={kube-apiserver,apiserver.example}",
    "networkPolicy.enabled=true",
    "networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.0/24",
    "networkPolicy.webhookFrom[1].ipBlock.cidr=192.168.10.5/32",
    "networkPolicy.metricsFrom[0].ipBlock.cidr=10.1.0.0/16",
];

fn case(name: &str) -> &'static Case {
    CASES
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no case {name}"))
}

const KUBE_VERSIONS: &[&str] = &["1.29.0", "1.31.0"];

/// `helm template` output as YAML text, or the failure's stderr.
/// The rendered documents of `set` for Kubernetes `kube_version`.
fn render(helm: &Path, set: &[&str], kube_version: &str) -> Vec<Value> {
    let yaml = template_text(helm, set, kube_version)
        .unwrap_or_else(|e| panic!("helm template {set:?} failed: {e}"));
    parse_documents(&yaml)
}

fn kinds(docs: &[Value]) -> BTreeSet<String> {
    docs.iter()
        .map(|d| d["kind"].as_str().unwrap_or("?").to_string())
        .collect()
}

fn webhook<'a>(config: &'a Value, name: &str) -> &'a Value {
    config["webhooks"]
        .as_array()
        .expect("webhooks list")
        .iter()
        .find(|w| w["name"] == name)
        .unwrap_or_else(|| panic!("no webhook entry {name} in {config:#}"))
}

fn webhook_names(config: &Value) -> Vec<String> {
    config["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap().to_string())
        .collect()
}

fn container(docs: &[Value]) -> &Value {
    &one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
}

fn args(docs: &[Value]) -> Vec<String> {
    container(docs)["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

fn container_port(docs: &[Value], name: &str) -> u16 {
    container(docs)["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no container port {name}")) as u16
}

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

fn namespace_selector_values(entry: &Value) -> Vec<String> {
    let expressions = entry["namespaceSelector"]["matchExpressions"]
        .as_array()
        .expect("namespaceSelector.matchExpressions");
    assert_eq!(expressions.len(), 1);
    assert_eq!(expressions[0]["key"], "kubernetes.io/metadata.name");
    assert_eq!(expressions[0]["operator"], "NotIn");
    expressions[0]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

fn assert_common_entry(entry: &Value, path: &str) {
    let name = &entry["name"];
    assert_eq!(entry["sideEffects"], "NoneOnDryRun", "{name}");
    assert_eq!(entry["matchPolicy"], "Equivalent", "{name}");
    assert_eq!(entry["timeoutSeconds"], 5, "{name}");
    assert_eq!(
        entry["admissionReviewVersions"],
        json!(["v1", "v1beta1"]),
        "{name}"
    );
    let service = &entry["clientConfig"]["service"];
    assert_eq!(service["name"], RELEASE, "{name}");
    assert_eq!(service["namespace"], NAMESPACE, "{name}");
    assert_eq!(service["path"], path, "{name}");
    assert_eq!(service["port"], 443, "{name}");
}

fn rule_summary(entry: &Value) -> Vec<(String, String, String)> {
    let mut summary = Vec::new();
    for rule in entry["rules"].as_array().unwrap() {
        for group in rule["apiGroups"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                let operations: Vec<&str> = rule["operations"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|o| o.as_str().unwrap())
                    .collect();
                summary.push((
                    group.as_str().unwrap().to_string(),
                    resource.as_str().unwrap().to_string(),
                    operations.join(","),
                ));
            }
        }
    }
    summary
}

fn summary(items: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    items
        .iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect()
}

#[test]
fn defaults_render_the_documented_webhooks() {
    let helm = helm();
    let docs = render(&helm, &[], "1.31.0");
    let inject = format!("{NAMESPACE}/ip-webhook-serving-cert");

    let mutating = one(&docs, "MutatingWebhookConfiguration");
    assert_eq!(
        mutating["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        inject
    );
    assert_eq!(
        webhook_names(mutating),
        [
            "pods.mutate.ip-webhook.io",
            "pod-deletes.mutate.ip-webhook.io"
        ]
    );
    let create = webhook(mutating, "pods.mutate.ip-webhook.io");
    assert_common_entry(create, "/mutate");
    assert_eq!(create["failurePolicy"], "Fail");
    assert_eq!(create["reinvocationPolicy"], "IfNeeded");
    assert_eq!(rule_summary(create), summary(&[("", "pods", "CREATE")]));
    assert_eq!(
        namespace_selector_values(create),
        [NAMESPACE, "kube-system"]
    );
    assert!(create["matchConditions"].is_array());
    assert!(create.get("objectSelector").is_none());
    let delete = webhook(mutating, "pod-deletes.mutate.ip-webhook.io");
    assert_common_entry(delete, "/mutate");
    assert_eq!(delete["failurePolicy"], "Ignore");
    assert_eq!(rule_summary(delete), summary(&[("", "pods", "DELETE")]));
    assert_eq!(
        namespace_selector_values(delete),
        [NAMESPACE, "kube-system"]
    );
    let delete_conditions = delete["matchConditions"].to_string();
    assert!(delete_conditions.contains("oldObject"));
    assert!(
        !delete_conditions
            .replace("oldObject", "")
            .contains("object"),
        "a DELETE condition reads request.object, which is null on DELETE: {delete_conditions}"
    );

    let validating = one(&docs, "ValidatingWebhookConfiguration");
    assert_eq!(
        validating["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        inject
    );
    assert_eq!(
        webhook_names(validating),
        [
            "pods.validate.ip-webhook.io",
            "pod-updates.validate.ip-webhook.io",
            "fixedippools.validate.ip-webhook.io",
            "ipclaims.validate.ip-webhook.io",
            "workloads.validate.ip-webhook.io",
            "deletes.validate.ip-webhook.io"
        ]
    );
    for entry in validating["webhooks"].as_array().unwrap() {
        assert_common_entry(entry, "/validate");
        assert!(entry.get("reinvocationPolicy").is_none());
    }
    let pods = webhook(validating, "pods.validate.ip-webhook.io");
    assert_eq!(pods["failurePolicy"], "Ignore");
    assert_eq!(
        rule_summary(pods),
        summary(&[("", "pods", "CREATE,UPDATE")])
    );
    assert_eq!(namespace_selector_values(pods), [NAMESPACE, "kube-system"]);
    // updates of pods that hold a claim: fail closed, only pods with our marks
    let updates = webhook(validating, "pod-updates.validate.ip-webhook.io");
    assert_eq!(updates["failurePolicy"], "Fail");
    assert_eq!(rule_summary(updates), summary(&[("", "pods", "UPDATE")]));
    assert_eq!(updates["matchConditions"][0]["name"], "pod-holds-claim");
    assert_eq!(
        namespace_selector_values(updates),
        [NAMESPACE, "kube-system"]
    );
    let pools = webhook(validating, "fixedippools.validate.ip-webhook.io");
    assert_eq!(pools["failurePolicy"], "Fail");
    assert_eq!(
        rule_summary(pools),
        summary(&[("ip-webhook.io", "fixedippools", "CREATE,UPDATE,DELETE")])
    );
    // IPClaim hand edits: refused unless forced; the server's own service account left out
    let ipclaims = webhook(validating, "ipclaims.validate.ip-webhook.io");
    assert_eq!(ipclaims["failurePolicy"], "Fail");
    assert_eq!(
        rule_summary(ipclaims),
        summary(&[
            ("ip-webhook.io", "ipclaims", "UPDATE,DELETE"),
            ("ip-webhook.io", "ipclaims/status", "UPDATE"),
        ])
    );
    assert_eq!(
        ipclaims["matchConditions"][0]["name"],
        "not-ip-webhook-itself"
    );
    let own = format!("system:serviceaccount:{NAMESPACE}:ip-webhook");
    let expression = ipclaims["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    let program = cel::Program::compile(expression).unwrap();
    for (user, sent) in [(own.as_str(), false), ("kubernetes-admin", true)] {
        let mut context = cel::Context::default();
        context.add_variable_from_value(
            "request",
            cel::to_value(json!({"userInfo": {"username": user}})).unwrap(),
        );
        assert_eq!(
            program.execute(&context).unwrap(),
            cel::Value::Bool(sent),
            "{user}"
        );
    }
    assert!(
        args(&docs).contains(&format!("--trusted-username={own}")),
        "the server trusts its own service account: {:?}",
        args(&docs)
    );
    let workloads = webhook(validating, "workloads.validate.ip-webhook.io");
    assert_eq!(workloads["failurePolicy"], "Ignore");
    assert_eq!(
        workloads["matchConditions"][0]["name"],
        "template-asks-fixed-ips"
    );
    assert_eq!(
        rule_summary(workloads),
        summary(&[
            ("apps", "deployments", "CREATE,UPDATE"),
            ("apps", "statefulsets", "CREATE,UPDATE"),
            ("apps", "replicasets", "CREATE,UPDATE"),
            ("apps", "daemonsets", "CREATE,UPDATE"),
            ("batch", "jobs", "CREATE,UPDATE"),
            ("batch", "cronjobs", "CREATE,UPDATE"),
        ])
    );
    // Deleting a workload only makes the server forget its list: never blocked, and only
    // sent for workloads whose template asked for fixed IPs.
    let deletes = webhook(validating, "deletes.validate.ip-webhook.io");
    assert_eq!(deletes["failurePolicy"], "Ignore");
    assert_eq!(
        deletes["matchConditions"][0]["name"],
        "template-asked-fixed-ips"
    );
    assert_eq!(
        namespace_selector_values(deletes),
        [NAMESPACE, "kube-system"]
    );
    assert_eq!(
        rule_summary(deletes),
        summary(&[
            ("apps", "deployments", "DELETE"),
            ("apps", "statefulsets", "DELETE"),
            ("apps", "replicasets", "DELETE"),
            ("apps", "daemonsets", "DELETE"),
            ("batch", "jobs", "DELETE"),
            ("batch", "cronjobs", "DELETE"),
        ])
    );
    // The CNI pool kinds only when switched on.
    let all_rules = format!("{:?}", rule_summary(pools)) + &validating.to_string();
    assert!(!all_rules.contains("kubeovn.io") && !all_rules.contains("crd.projectcalico.org"));
}

#[test]
fn defaults_render_the_cert_manager_certificate_and_a_hardened_deployment() {
    let helm = helm();
    let docs = render(&helm, &[], "1.31.0");

    let issuer = one(&docs, "Issuer");
    assert_eq!(issuer["metadata"]["namespace"], NAMESPACE);
    assert_eq!(issuer["spec"], json!({"selfSigned": {}}));
    let certificate = one(&docs, "Certificate");
    assert_eq!(certificate["metadata"]["name"], "ip-webhook-serving-cert");
    assert_eq!(certificate["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        certificate["spec"]["dnsNames"],
        json!([
            "ip-webhook",
            "ip-webhook.ip-webhook-system",
            "ip-webhook.ip-webhook-system.svc",
            "ip-webhook.ip-webhook-system.svc.cluster.local"
        ])
    );
    assert_eq!(
        certificate["spec"]["issuerRef"],
        json!({"group": "cert-manager.io", "kind": "Issuer", "name": issuer["metadata"]["name"]})
    );
    assert_eq!(certificate["spec"]["secretName"], "ip-webhook-tls");

    let deployment = one(&docs, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert!(
        pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            .is_array()
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let security = &pod["containers"][0]["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    let resources = &pod["containers"][0]["resources"];
    assert!(resources["requests"]["cpu"].is_string() && resources["limits"]["memory"].is_string());
    // The TLS Secret is mounted as a whole directory: subPath mounts never see a renewal.
    let tls_volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == "ip-webhook-tls")
        .expect("a volume from the TLS Secret");
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == tls_volume["name"])
        .expect("the TLS volume is mounted");
    assert!(mount.get("subPath").is_none());
    assert!(args(&docs).contains(&format!(
        "--tls-cert-file={}/tls.crt",
        mount["mountPath"].as_str().unwrap()
    )));
    // Graceful shutdown: the grace period covers preStop sleep and --shutdown-grace.
    assert!(args(&docs).contains(&"--shutdown-grace=25s".to_string()));
    assert_eq!(
        pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"],
        5
    );
    assert_eq!(pod["terminationGracePeriodSeconds"], 25 + 5 + 5);
    assert!(args(&docs).contains(&"--ledger=kubernetes".to_string()));

    assert!(pod.get("hostNetwork").is_none() && pod.get("dnsPolicy").is_none());
    assert_eq!(deployment["spec"]["strategy"]["type"], "RollingUpdate");
    let state = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "state")
        .expect("a state volume");
    assert!(state["emptyDir"].is_object(), "{state}");
    assert!(of_kind(&docs, "PersistentVolumeClaim").is_empty());

    let pdb = one(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let service = one(&docs, "Service");
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    assert!(of_kind(&docs, "ServiceMonitor").is_empty());
    // CRDs are the ones `ip-webhook crds` prints.
    let crd_names: BTreeSet<&str> = of_kind(&docs, "CustomResourceDefinition")
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        crd_names,
        BTreeSet::from(["fixedippools.ip-webhook.io", "ipclaims.ip-webhook.io"])
    );
}

fn rules_of(role: &Value) -> Vec<(String, String, BTreeSet<String>)> {
    let mut out = Vec::new();
    for rule in role["rules"].as_array().unwrap() {
        let verbs: BTreeSet<String> = rule["verbs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        for group in rule["apiGroups"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                out.push((
                    group.as_str().unwrap().to_string(),
                    resource.as_str().unwrap().to_string(),
                    verbs.clone(),
                ));
            }
        }
    }
    out.sort();
    out
}

fn grant(group: &str, resource: &str, verbs: &str) -> (String, String, BTreeSet<String>) {
    (
        group.to_string(),
        resource.to_string(),
        verbs.split(',').map(str::to_string).collect(),
    )
}

#[test]
fn rbac_grants_what_the_server_needs_and_the_cni_extras_only_when_switched_on() {
    let helm = helm();
    let base = vec![
        grant("", "events", "create,patch"),
        grant("", "nodes", "list,watch"),
        grant("", "pods", "get,list,watch"),
        grant("apps", "daemonsets", "list,watch"),
        grant("apps", "deployments", "list,watch"),
        grant("apps", "replicasets", "list,watch"),
        grant("apps", "statefulsets", "list,watch"),
        grant("batch", "cronjobs", "list,watch"),
        grant("batch", "jobs", "list,watch"),
        grant("events.k8s.io", "events", "create,patch"),
        grant(
            "ip-webhook.io",
            "ipclaims",
            "get,list,watch,create,update,patch,delete",
        ),
        grant("ip-webhook.io", "ipclaims/status", "update,patch"),
        grant("ip-webhook.io", "fixedippools", "get,list,watch"),
        grant("ip-webhook.io", "fixedippools/status", "update,patch"),
    ];
    let calico = [
        grant("crd.projectcalico.org", "ippools", "list,watch"),
        grant(
            "crd.projectcalico.org",
            "ipreservations",
            "list,watch,create,patch",
        ),
    ];
    let kube_ovn = [
        grant("kubeovn.io", "ips", "list,watch"),
        grant("kubeovn.io", "subnets", "list,watch"),
    ];
    // server.cni=calico is the default, and rbac.calico follows it unless set.
    let docs = render(&helm, &[], "1.31.0");
    let mut expected = base.clone();
    expected.extend(calico.clone());
    expected.sort();
    assert_eq!(rules_of(one(&docs, "ClusterRole")), expected);
    let mut plain = base.clone();
    plain.sort();
    let off = render(&helm, &["rbac.calico=false"], "1.31.0");
    assert_eq!(rules_of(one(&off, "ClusterRole")), plain);
    let ovn = render(&helm, &["server.cni=kube-ovn"], "1.31.0");
    let mut expected_ovn = base.clone();
    expected_ovn.extend(kube_ovn.clone());
    expected_ovn.sort();
    assert_eq!(rules_of(one(&ovn, "ClusterRole")), expected_ovn);
    let role = one(&docs, "Role");
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        rules_of(role),
        vec![grant("coordination.k8s.io", "leases", "get,create,update")]
    );
    for binding in ["ClusterRoleBinding", "RoleBinding"] {
        let subjects = &one(&docs, binding)["subjects"];
        assert_eq!(
            subjects,
            &json!([{"kind": "ServiceAccount", "name": "ip-webhook", "namespace": NAMESPACE}])
        );
    }
    assert_eq!(
        one(&docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"],
        "ip-webhook"
    );

    let docs = render(
        &helm,
        &[
            "server.cni=kube-ovn",
            "rbac.calico=true",
            "rbac.kubeOvn=true",
        ],
        "1.31.0",
    );
    let mut expected = base.clone();
    expected.extend(calico);
    expected.extend(kube_ovn.clone());
    expected.sort();
    assert_eq!(rules_of(one(&docs, "ClusterRole")), expected);

    // Node-loss release off: no nodes; the Kube-OVN reservation on: its IPPools.
    let docs = render(
        &helm,
        &[
            "server.cni=kube-ovn",
            "server.nodeLostGrace=0",
            "server.kubeOvnReservation=true",
        ],
        "1.31.0",
    );
    let mut expected: Vec<_> = base.into_iter().filter(|g| g.1 != "nodes").collect();
    expected.extend(kube_ovn);
    expected.push(grant(
        "kubeovn.io",
        "ippools",
        "list,watch,create,patch,delete",
    ));
    expected.sort();
    assert_eq!(rules_of(one(&docs, "ClusterRole")), expected);
    let args = &one(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"];
    let args: Vec<&str> = args
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(args.contains(&"--node-lost-grace=0"), "{args:?}");
    assert!(args.contains(&"--kube-ovn-reservation=true"), "{args:?}");
}

#[test]
fn cni_pool_kinds_are_validated_when_switched_on() {
    let helm = helm();
    let docs = render(&helm, CASES[5].set, "1.31.0");
    let validating = one(&docs, "ValidatingWebhookConfiguration");
    let subnets = webhook(validating, "kubeovn-subnets.validate.ip-webhook.io");
    assert_common_entry(subnets, "/validate");
    assert_eq!(subnets["failurePolicy"], "Fail");
    assert_eq!(
        rule_summary(subnets),
        summary(&[("kubeovn.io", "subnets", "CREATE,UPDATE")])
    );
    let calico = webhook(validating, "calico-ippools.validate.ip-webhook.io");
    assert_common_entry(calico, "/validate");
    assert_eq!(
        rule_summary(calico),
        summary(&[
            ("crd.projectcalico.org", "ippools", "CREATE,UPDATE"),
            ("projectcalico.org", "ippools", "CREATE,UPDATE"),
        ])
    );
    // Deleting a CNI pool is sent whatever its labels; deleting a workload only when its
    // template asked for fixed IPs: two entries.
    let pool_deletes = webhook(validating, "cni-pool-deletes.validate.ip-webhook.io");
    assert_common_entry(pool_deletes, "/validate");
    assert_eq!(pool_deletes["failurePolicy"], "Ignore");
    assert!(pool_deletes.get("matchConditions").is_none());
    assert!(pool_deletes.get("objectSelector").is_none());
    assert_eq!(
        rule_summary(pool_deletes),
        summary(&[
            ("kubeovn.io", "subnets", "DELETE"),
            ("crd.projectcalico.org", "ippools", "DELETE"),
            ("projectcalico.org", "ippools", "DELETE"),
        ])
    );
    let deletes = rule_summary(webhook(validating, "deletes.validate.ip-webhook.io"));
    assert!(
        deletes
            .iter()
            .all(|(group, _, _)| group == "apps" || group == "batch")
    );
    // The server checks them only when told to.
    let flags = args(&docs);
    assert!(flags.contains(&"--check-kube-ovn-subnets".to_string()));
    assert!(flags.contains(&"--check-calico-ippools".to_string()));
    let plain = render(&helm, &[], "1.31.0");
    assert!(!args(&plain).iter().any(|a| a.starts_with("--check-")));
    // Without workload checks or CNI pools there is nothing to forget.
    let only_pools = render(
        &helm,
        &[
            "validatingWebhook.workloads.enabled=false",
            "validatingWebhook.calicoIPPools.enabled=true",
        ],
        "1.31.0",
    );
    assert_eq!(
        webhook_names(one(&only_pools, "ValidatingWebhookConfiguration")),
        [
            "pods.validate.ip-webhook.io",
            "pod-updates.validate.ip-webhook.io",
            "fixedippools.validate.ip-webhook.io",
            "ipclaims.validate.ip-webhook.io",
            "calico-ippools.validate.ip-webhook.io",
            "cni-pool-deletes.validate.ip-webhook.io"
        ]
    );
    let bare = render(
        &helm,
        &[
            "validatingWebhook.workloads.enabled=false",
            "validatingWebhook.ipClaims.enabled=false",
        ],
        "1.31.0",
    );
    assert_eq!(
        webhook_names(one(&bare, "ValidatingWebhookConfiguration")),
        [
            "pods.validate.ip-webhook.io",
            "pod-updates.validate.ip-webhook.io",
            "fixedippools.validate.ip-webhook.io"
        ]
    );
    // Validating them needs reading them: the RBAC extras follow the switches.
    let grants = format!("{:?}", rules_of(one(&docs, "ClusterRole")));
    assert!(grants.contains("kubeovn.io") && grants.contains("crd.projectcalico.org"));
    // Extra excluded namespaces join the two fixed ones, without duplicates.
    assert_eq!(
        namespace_selector_values(webhook(validating, "pods.validate.ip-webhook.io")),
        [NAMESPACE, "kube-system", "monitoring"]
    );
    let monitor = one(&docs, "ServiceMonitor");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    let service = one(&docs, "Service");
    let metrics_port = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a metrics Service port");
    assert_eq!(metrics_port["targetPort"], "admin");
}

#[test]
fn kubernetes_before_1_30_selects_pods_by_label_instead_of_cel() {
    let helm = helm();
    let docs = render(&helm, &[], "1.29.0");
    let mutating = one(&docs, "MutatingWebhookConfiguration");
    for entry in mutating["webhooks"].as_array().unwrap() {
        assert!(
            entry.get("matchConditions").is_none(),
            "{}: matchConditions on 1.29",
            entry["name"]
        );
        assert_eq!(
            entry["objectSelector"],
            json!({"matchExpressions": [{"key": "ip-webhook.io/fixed-ip", "operator": "Exists"}]})
        );
    }
    let validating = one(&docs, "ValidatingWebhookConfiguration");
    assert!(validating.to_string().find("matchConditions").is_none());
    // Every pod and workload entry selects by the label too: without it every pod and
    // workload CREATE/UPDATE/DELETE of the cluster would be sent to the webhook.
    let label_selector =
        json!({"matchExpressions": [{"key": "ip-webhook.io/fixed-ip", "operator": "Exists"}]});
    for name in [
        "pods.validate.ip-webhook.io",
        "workloads.validate.ip-webhook.io",
        "deletes.validate.ip-webhook.io",
    ] {
        assert_eq!(
            webhook(validating, name)["objectSelector"],
            label_selector,
            "{name} on 1.29"
        );
    }
    // updates of claim-holding pods: every pod ip-webhook gave an IP carries this label
    assert_eq!(
        webhook(validating, "pod-updates.validate.ip-webhook.io")["objectSelector"],
        json!({"matchExpressions": [{"key": "ip-webhook.io/allocated-ip", "operator": "Exists"}]})
    );
    // Pools are cluster-scoped objects of ours: every one matters.
    assert!(
        webhook(validating, "fixedippools.validate.ip-webhook.io")
            .get("objectSelector")
            .is_none()
    );
    for entry in validating["webhooks"].as_array().unwrap() {
        let sends_pods_or_workloads = rule_summary(entry)
            .iter()
            .any(|(group, _, _)| group.is_empty() || group == "apps" || group == "batch");
        assert_eq!(
            entry["objectSelector"].is_object(),
            sends_pods_or_workloads,
            "{}",
            entry["name"]
        );
    }
    // And CNI pool deletes keep coming, whatever labels the CNI's objects carry.
    let everything = render(&helm, case("everything-on").set, "1.29.0");
    let validating = one(&everything, "ValidatingWebhookConfiguration");
    for name in [
        "kubeovn-subnets.validate.ip-webhook.io",
        "calico-ippools.validate.ip-webhook.io",
        "cni-pool-deletes.validate.ip-webhook.io",
    ] {
        assert!(
            webhook(validating, name).get("objectSelector").is_none(),
            "{name}"
        );
    }
    // The preStop sleep action is beta (on by default) from 1.30.
    let pod = &one(&docs, "Deployment")["spec"]["template"]["spec"];
    assert!(pod["containers"][0].get("lifecycle").is_none());
    assert_eq!(pod["terminationGracePeriodSeconds"], 25 + 5);

    // Forcing either mode works on any version.
    let forced = render(
        &helm,
        &["mutatingWebhook.podSelection=objectSelector"],
        "1.31.0",
    );
    let entry = &one(&forced, "MutatingWebhookConfiguration")["webhooks"][0];
    assert!(entry.get("matchConditions").is_none() && entry["objectSelector"].is_object());
    let validating = one(&forced, "ValidatingWebhookConfiguration");
    for name in [
        "pods.validate.ip-webhook.io",
        "pod-updates.validate.ip-webhook.io",
        "workloads.validate.ip-webhook.io",
        "deletes.validate.ip-webhook.io",
    ] {
        let entry = webhook(validating, name);
        assert!(
            entry.get("matchConditions").is_none() && entry["objectSelector"].is_object(),
            "{name}"
        );
    }
    let forced = render(
        &helm,
        &["mutatingWebhook.podSelection=matchConditions"],
        "1.29.0",
    );
    let entry = &one(&forced, "MutatingWebhookConfiguration")["webhooks"][0];
    assert!(entry["matchConditions"].is_array() && entry.get("objectSelector").is_none());
}

#[test]
fn validating_webhook_disabled_means_no_validating_resources() {
    let helm = helm();
    let docs = render(&helm, &["validatingWebhook.enabled=false"], "1.31.0");
    assert!(of_kind(&docs, "ValidatingWebhookConfiguration").is_empty());
    // The one server still answers /mutate, with its certificate.
    assert_eq!(of_kind(&docs, "MutatingWebhookConfiguration").len(), 1);
    assert_eq!(of_kind(&docs, "Deployment").len(), 1);
    assert_eq!(of_kind(&docs, "Certificate").len(), 1);

    // With both webhooks off, no webhook resource at all, whatever certificate.create says.
    for create in ["true", "false"] {
        let create = format!("validatingWebhook.certificate.create={create}");
        let docs = render(
            &helm,
            &[
                "validatingWebhook.enabled=false",
                "mutatingWebhook.enabled=false",
                "metrics.serviceMonitor.enabled=true",
                "metrics.prometheusRule.enabled=true",
                "metrics.dashboards.enabled=true",
                "persistence.enabled=true",
                &create,
            ],
            "1.31.0",
        );
        let present = kinds(&docs);
        for absent in [
            "ValidatingWebhookConfiguration",
            "MutatingWebhookConfiguration",
            "Certificate",
            "Issuer",
            "Secret",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
            "ServiceMonitor",
            "PrometheusRule",
            "ConfigMap",
            "PersistentVolumeClaim",
        ] {
            assert!(!present.contains(absent), "{absent} rendered with {create}");
        }
    }
}

#[test]
fn external_certificate_keeps_the_documented_names_and_injection() {
    let helm = helm();
    let docs = render(
        &helm,
        &["validatingWebhook.certificate.create=false"],
        "1.31.0",
    );
    assert!(of_kind(&docs, "Certificate").is_empty());
    assert!(of_kind(&docs, "Issuer").is_empty());
    assert!(of_kind(&docs, "Secret").is_empty());
    let inject = format!("{NAMESPACE}/ip-webhook-serving-cert");
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let config = one(&docs, kind);
        assert_eq!(
            config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            inject
        );
        for entry in config["webhooks"].as_array().unwrap() {
            assert!(entry["clientConfig"].get("caBundle").is_none());
        }
    }
    let volumes = &one(&docs, "Deployment")["spec"]["template"]["spec"]["volumes"];
    assert!(
        volumes
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["secret"]["secretName"] == "ip-webhook-tls")
    );
    // The names docs/install.md tells people to create.
    let guide = std::fs::read_to_string(repo().join("docs/install.md")).unwrap();
    assert!(guide.contains("name: ip-webhook-serving-cert"));
    assert!(guide.contains("secretName: ip-webhook-tls"));
}

fn decode(b64: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(b64.as_str().expect("base64 string"))
        .expect("valid base64")
}

#[tokio::test]
async fn helm_generated_certificate_is_trusted_through_ca_bundle_for_the_service_name() {
    let helm = helm();
    let docs = render(
        &helm,
        &["validatingWebhook.certificate.source=helm"],
        "1.31.0",
    );
    assert!(of_kind(&docs, "Certificate").is_empty());
    assert!(of_kind(&docs, "Issuer").is_empty());
    let secret = one(&docs, "Secret");
    assert_eq!(secret["metadata"]["name"], "ip-webhook-tls");
    assert_eq!(secret["type"], "kubernetes.io/tls");
    let ca = decode(&secret["data"]["ca.crt"]);
    let mut bundles = BTreeSet::new();
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let config = one(&docs, kind);
        assert!(config["metadata"].get("annotations").is_none());
        for entry in config["webhooks"].as_array().unwrap() {
            bundles.insert(decode(&entry["clientConfig"]["caBundle"]));
        }
    }
    assert_eq!(
        bundles,
        BTreeSet::from([ca.clone()]),
        "every caBundle is the Secret's ca.crt"
    );

    // The real server loads the Secret's files, and a client that trusts only caBundle
    // completes a handshake under the name the API server dials.
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    std::fs::write(&cert, decode(&secret["data"]["tls.crt"])).unwrap();
    std::fs::write(&key, decode(&secret["data"]["tls.key"])).unwrap();
    let config = common::with_cert_files(
        dir.path(),
        &cert,
        &key,
        common::serve_config(dir.path()).tls_reload_interval,
    );
    let launched = ip_webhook::app::launch(&config)
        .await
        .expect("server starts");
    let addr = launched.running.https_addr;
    for name in [
        "ip-webhook",
        "ip-webhook.ip-webhook-system",
        SERVICE_DNS,
        "ip-webhook.ip-webhook-system.svc.cluster.local",
    ] {
        let status = https_post_status(addr, &ca, name, "/mutate").await;
        assert_eq!(status, Ok(200), "as {name}");
    }
    let wrong = https_post_status(addr, &ca, "other.ip-webhook-system.svc", "/mutate").await;
    assert!(
        wrong.is_err(),
        "a name outside the SANs must fail: {wrong:?}"
    );
    launched.shutdown().await;
}

/// POST an AdmissionReview over TLS with SNI `server_name`; the HTTP status or the TLS error.
async fn https_post_status(
    addr: std::net::SocketAddr,
    ca_pem: &[u8],
    server_name: &str,
    path: &str,
) -> Result<u16, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = common::client_config(ca_pem);
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string())
        .map_err(|e| e.to_string())?;
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let body = common::create(
        "0df28fbd-5f5f-11e8-bc74-36e6bb280816",
        common::pod("default", "web", "web-", None),
    )
    .to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {server_name}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    tls.read_to_end(&mut reply)
        .await
        .map_err(|e| e.to_string())?;
    let reply = text(&reply);
    let status = reply
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no HTTP status in {reply:?}"))?;
    Ok(status)
}

/// The long flags `ip-webhook serve --help` lists.
fn serve_help() -> (String, BTreeSet<String>) {
    let output = run(Command::new(env!("CARGO_BIN_EXE_ip-webhook")).args(["serve", "--help"]));
    assert!(output.status.success());
    let help = text(&output.stdout);
    let flags = help
        .split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .map(|word| word.split('=').next().unwrap().to_string())
        .collect();
    (help, flags)
}

#[test]
fn deployment_flags_ports_and_paths_match_what_serve_accepts() {
    let helm = helm();
    let (help, accepted) = serve_help();
    assert!(accepted.contains("--listen") && accepted.contains("--tls-cert-file"));
    for case in CASES.iter().filter(|c| c.name != "no-webhooks") {
        let docs = render(&helm, case.set, "1.31.0");
        let args = args(&docs);
        assert_eq!(args[0], "serve", "case {}", case.name);
        for arg in &args[1..] {
            let flag = arg.split('=').next().unwrap();
            assert!(
                accepted.contains(flag),
                "case {}: the Deployment passes {flag}, which `serve --help` does not list:\n{help}",
                case.name
            );
        }
        // The real parser takes the whole list, values included.
        let argv = std::iter::once("ip-webhook".to_string()).chain(args.iter().cloned());
        let cli = ip_webhook::cli::Cli::try_parse_from(argv)
            .unwrap_or_else(|e| panic!("case {}: {args:?} does not parse: {e}", case.name));
        let ip_webhook::cli::Command::Serve(serve) = cli.command else {
            panic!("not a serve command")
        };
        assert_eq!(serve.listen.port(), container_port(&docs, "https"));
        assert_eq!(serve.admin_listen.port(), container_port(&docs, "admin"));
        let ledger = if case.name == "embedded-ledger" {
            ip_webhook::cli::LedgerKind::Embedded
        } else {
            ip_webhook::cli::LedgerKind::Kubernetes
        };
        assert_eq!(serve.webhook.ledger, Some(ledger), "case {}", case.name);
        if case.name == "everything-on" {
            assert_eq!(serve.tls_reload_interval, std::time::Duration::from_secs(5));
            assert!(serve.webhook.check_kube_ovn_subnets && serve.webhook.check_calico_ippools);
        }

        // Probes hit the admin port's paths; the Service routes 443 to the HTTPS port.
        let container = container(&docs);
        assert_eq!(container["livenessProbe"]["httpGet"]["port"], "admin");
        assert_eq!(container["readinessProbe"]["httpGet"]["port"], "admin");
        for probe in ["livenessProbe", "readinessProbe"] {
            let path = container[probe]["httpGet"]["path"].as_str().unwrap();
            assert!(
                help.contains(path),
                "{probe} path {path} not in serve --help"
            );
        }
        let service = one(&docs, "Service");
        let https = service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "https")
            .unwrap();
        assert_eq!(https["targetPort"], "https");
        assert_eq!(https["port"], 443);
        for kind in [
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ] {
            for config in of_kind(&docs, kind) {
                for entry in config["webhooks"].as_array().unwrap() {
                    let path = entry["clientConfig"]["service"]["path"].as_str().unwrap();
                    assert!(
                        help.contains(&format!("POST {path}")),
                        "webhook path {path} not served according to serve --help"
                    );
                }
            }
        }
    }
}

#[test]
fn hardened_install_renders_the_network_policy_and_the_client_ca() {
    let helm = helm();
    // off by default
    let defaults = render(&helm, &[], "1.31.0");
    assert!(of_kind(&defaults, "NetworkPolicy").is_empty());
    assert!(
        !args(&defaults)
            .iter()
            .any(|a| a.starts_with("--client-ca-file"))
    );

    let docs = render(&helm, HARDENED, "1.31.0");
    let policy = one(&docs, "NetworkPolicy");
    assert_eq!(policy["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"],
        one(&docs, "Deployment")["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    let https = container_port(&docs, "https");
    let admin = container_port(&docs, "admin");
    assert_eq!(
        policy["spec"]["ingress"],
        json!([
            {
                "ports": [{"port": https, "protocol": "TCP"}],
                "from": [
                    {"ipBlock": {"cidr": "10.0.0.0/24"}},
                    {"ipBlock": {"cidr": "192.168.10.5/32"}},
                ],
            },
            {
                "ports": [{"port": admin, "protocol": "TCP"}],
                "from": [
                    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
                    {"ipBlock": {"cidr": "10.1.0.0/16"}},
                ],
            },
        ])
    );

    // the CA from the ConfigMap, mounted as a directory, named by the flags the server parses
    let flags = args(&docs);
    let argv = std::iter::once("ip-webhook".to_string()).chain(flags.iter().cloned());
    let cli = ip_webhook::cli::Cli::try_parse_from(argv).expect("the Deployment's flags parse");
    let ip_webhook::cli::Command::Serve(serve) = cli.command else {
        panic!("not a serve command")
    };
    let ca_file = serve.client_ca_file.expect("--client-ca-file is passed");
    assert_eq!(ca_file, Path::new("/etc/ip-webhook/client-ca/ca.crt"));
    assert_eq!(
        serve.client_allowed_names,
        ["kube-apiserver", "apiserver.example"]
    );
    let container = container(&docs);
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "client-ca")
        .expect("the client CA is mounted");
    assert_eq!(mount["mountPath"], "/etc/ip-webhook/client-ca");
    assert_eq!(mount["readOnly"], true);
    assert!(
        mount.get("subPath").is_none(),
        "a subPath mount never sees a new CA"
    );
    let deployment = one(&docs, "Deployment");
    let volume = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "client-ca")
        .unwrap();
    assert_eq!(volume["configMap"]["name"], "apiserver-client-ca");

    // from a Secret, with another key
    let docs = render(
        &helm,
        &[
            "clientAuth.enabled=true",
            "clientAuth.caSecret=front-proxy-ca",
            "clientAuth.caKey=tls.crt",
        ],
        "1.31.0",
    );
    assert!(
        args(&docs).contains(&"--client-ca-file=/etc/ip-webhook/client-ca/tls.crt".to_string())
    );
    assert!(
        !args(&docs)
            .iter()
            .any(|a| a.starts_with("--client-allowed-names"))
    );
    let volume = one(&docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "client-ca")
        .cloned()
        .unwrap();
    assert_eq!(volume["secret"]["secretName"], "front-proxy-ca");

    // the chart refuses a half-configured hardening
    for (set, says) in [
        (
            &["networkPolicy.enabled=true"][..],
            "networkPolicy.webhookFrom",
        ),
        (
            &["clientAuth.enabled=true"][..],
            "exactly one of clientAuth.caSecret",
        ),
        (
            &[
                "clientAuth.enabled=true",
                "clientAuth.caSecret=a",
                "clientAuth.caConfigMap=b",
            ][..],
            "exactly one of clientAuth.caSecret",
        ),
    ] {
        let error = template_text(&helm, set, "1.31.0").expect_err("refused");
        assert!(error.contains(says), "{set:?}: {error}");
    }
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
fn embedded_ledger_needs_one_replica_and_a_persistent_volume() {
    let helm = helm();
    // Replicas with per-pod books would hand out the same IP twice; books on an emptyDir
    // vanish with the pod. Each refusal says why and what to set.
    for (set, reason) in [
        (
            &["server.ledger=embedded", "persistence.enabled=true"][..],
            "server.ledger=embedded needs replicaCount=1 (got 2)",
        ),
        (
            &[
                "server.ledger=embedded",
                "persistence.enabled=true",
                "replicaCount=3",
            ][..],
            "server.ledger=embedded needs replicaCount=1 (got 3)",
        ),
        (
            &["server.ledger=embedded", "replicaCount=1"][..],
            "server.ledger=embedded needs persistence.enabled=true",
        ),
        (
            &[
                "server.ledger=embedded",
                "replicaCount=0",
                "persistence.enabled=true",
            ][..],
            "server.ledger=embedded needs replicaCount=1 (got 0)",
        ),
    ] {
        let error =
            template_text(&helm, set, "1.31.0").expect_err(&format!("{set:?} must be refused"));
        assert!(error.contains(reason), "{set:?}: {error}");
        assert!(
            error.contains("same IPs") || error.contains("vanish"),
            "{error}"
        );
    }

    // One replica on a claim: the chart makes it, mounts it, and never runs two pods on it.
    let docs = render(&helm, case("embedded-ledger").set, "1.31.0");
    let claim = one(&docs, "PersistentVolumeClaim");
    assert_eq!(claim["metadata"]["name"], "ip-webhook-state");
    assert_eq!(claim["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        claim["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    assert_eq!(claim["spec"]["accessModes"], json!(["ReadWriteOnce"]));
    assert_eq!(claim["spec"]["storageClassName"], "fast");
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "2Gi");
    let deployment = one(&docs, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(deployment["spec"]["strategy"], json!({"type": "Recreate"}));
    let pod = &deployment["spec"]["template"]["spec"];
    let state = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "state")
        .unwrap();
    assert_eq!(
        state,
        &json!({"name": "state", "persistentVolumeClaim": {"claimName": "ip-webhook-state"}})
    );
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "state")
        .unwrap();
    assert!(args(&docs).contains(&format!(
        "--state-dir={}",
        mount["mountPath"].as_str().unwrap()
    )));
    assert!(args(&docs).contains(&"--ledger=embedded".to_string()));
    // One replica: a PDB with minAvailable 1 would block every drain.
    assert!(of_kind(&docs, "PodDisruptionBudget").is_empty());

    // Any ledger: a claim that mounts on one node cannot serve several replicas.
    let error = template_text(&helm, &["persistence.enabled=true"], "1.31.0")
        .expect_err("2 replicas on a ReadWriteOnce claim must be refused");
    assert!(
        error.contains("persistence.enabled with replicaCount=2 needs persistence.accessModes with ReadWriteMany"),
        "{error}"
    );
    let shared = render(
        &helm,
        &[
            "persistence.enabled=true",
            "persistence.accessModes={ReadWriteMany}",
        ],
        "1.31.0",
    );
    assert_eq!(
        one(&shared, "Deployment")["spec"]["strategy"]["type"],
        "RollingUpdate"
    );
    assert_eq!(
        one(&shared, "PersistentVolumeClaim")["spec"]["accessModes"],
        json!(["ReadWriteMany"])
    );

    // An existing claim is used, not made.
    let mut set = case("embedded-ledger").set.to_vec();
    set.push("persistence.existingClaim=books");
    let docs = render(&helm, &set, "1.31.0");
    assert!(of_kind(&docs, "PersistentVolumeClaim").is_empty());
    let volumes = one(&docs, "Deployment")["spec"]["template"]["spec"]["volumes"].to_string();
    assert!(volumes.contains(r#"{"claimName":"books"}"#), "{volumes}");
}

#[test]
fn pdb_only_with_more_than_one_replica() {
    let helm = helm();
    for (replicas, pdb) in [("0", false), ("1", false), ("2", true), ("3", true)] {
        let set = format!("replicaCount={replicas}");
        let docs = render(&helm, &[&set], "1.31.0");
        assert_eq!(
            of_kind(&docs, "PodDisruptionBudget").len(),
            usize::from(pdb),
            "{set}"
        );
    }
    let docs = render(&helm, &["podDisruptionBudget.enabled=false"], "1.31.0");
    assert!(of_kind(&docs, "PodDisruptionBudget").is_empty());
}

#[test]
fn host_network_and_extra_volumes_reach_the_pod() {
    let helm = helm();
    let docs = render(&helm, case("host-network-and-extra-volumes").set, "1.31.0");
    let pod = &one(&docs, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    // On the node's network the port must be free there: the flag, the port and the Service
    // follow server.port.
    assert_eq!(container_port(&docs, "https"), 10260);
    assert_eq!(container_port(&docs, "admin"), 10261);
    assert!(args(&docs).contains(&"--listen=0.0.0.0:10260".to_string()));
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "etcd-client")
        .expect("the extra volume");
    assert_eq!(volume["secret"]["secretName"], "etcd-client-tls");
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "etcd-client")
        .expect("the extra mount");
    assert_eq!(mount["mountPath"], "/etc/etcd");
    assert_eq!(mount["readOnly"], true);
    // The chart's own volumes stay.
    for name in ["tls", "state"] {
        assert!(pod["volumes"].to_string().contains(&format!("\"{name}\"")));
    }
    // An explicit dnsPolicy wins; without hostNetwork none is set.
    let mut set = case("host-network-and-extra-volumes").set.to_vec();
    set.push("dnsPolicy=Default");
    let docs = render(&helm, &set, "1.31.0");
    assert_eq!(
        one(&docs, "Deployment")["spec"]["template"]["spec"]["dnsPolicy"],
        "Default"
    );
    let docs = render(&helm, &["dnsPolicy=ClusterFirst"], "1.31.0");
    let pod = &one(&docs, "Deployment")["spec"]["template"]["spec"];
    assert!(pod.get("hostNetwork").is_none());
    assert_eq!(pod["dnsPolicy"], "ClusterFirst");
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

// ---- CEL ------------------------------------------------------------------------------

/// The rendered CEL conditions, by entry name, on Kubernetes 1.31.
fn rendered_conditions(helm: &Path) -> Vec<(String, String, String)> {
    let docs = render(helm, &[], "1.31.0");
    let mut out = Vec::new();
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        for entry in one(&docs, kind)["webhooks"].as_array().unwrap() {
            for condition in entry["matchConditions"].as_array().into_iter().flatten() {
                out.push((
                    entry["name"].as_str().unwrap().to_string(),
                    condition["name"].as_str().unwrap().to_string(),
                    condition["expression"].as_str().unwrap().to_string(),
                ));
            }
        }
    }
    out
}

/// Evaluate `expression` as the API server would for a request with these objects.
fn evaluate(expression: &str, object: &Value, old_object: &Value) -> Result<bool, String> {
    let program = cel::Program::compile(expression).map_err(|e| format!("compile: {e}"))?;
    let mut context = cel::Context::default();
    let request = json!({"operation": if object.is_null() { "DELETE" } else { "CREATE" }});
    for (name, value) in [
        ("object", object),
        ("oldObject", old_object),
        ("request", &request),
    ] {
        let value = cel::to_value(value).map_err(|e| format!("{name}: {e}"))?;
        context.add_variable_from_value(name, value);
    }
    match program.execute(&context) {
        Ok(cel::Value::Bool(b)) => Ok(b),
        Ok(other) => Err(format!("not a bool: {other:?}")),
        Err(e) => Err(format!("execution error: {e}")),
    }
}

/// Pods as users write them, and what each condition must answer for them.
struct PodCase {
    name: &'static str,
    pod: Value,
    /// pod-wants-fixed-ip: the pod asks us for an IP.
    wants_ip: bool,
    /// pod-holds-ip: the pod may hold an IP in our books.
    holds_ip: bool,
    /// pod-holds-claim: the pod carries our own marks (label, marker, claim token).
    marked: bool,
    /// It carries a Kube-OVN ip_pool (pods.validate sees it, to count its IPs as its app's).
    ovn_pool: bool,
}

fn pod_cases() -> Vec<PodCase> {
    let meta = |m: Value| json!({"apiVersion": "v1", "kind": "Pod", "metadata": m, "spec": {}});
    vec![
        PodCase {
            name: "no metadata maps",
            pod: meta(json!({"name": "plain", "namespace": "default"})),
            wants_ip: false,
            holds_ip: false,
            marked: false,
            ovn_pool: false,
        },
        PodCase {
            name: "no metadata at all",
            pod: json!({"apiVersion": "v1", "kind": "Pod"}),
            wants_ip: false,
            holds_ip: false,
            marked: false,
            ovn_pool: false,
        },
        PodCase {
            name: "empty maps",
            pod: meta(json!({"name": "e", "annotations": {}, "labels": {}})),
            wants_ip: false,
            holds_ip: false,
            marked: false,
            ovn_pool: false,
        },
        PodCase {
            name: "unrelated annotations and labels",
            pod: meta(json!({"annotations": {"a": "b"}, "labels": {"app": "web"}})),
            wants_ip: false,
            holds_ip: false,
            marked: false,
            ovn_pool: false,
        },
        PodCase {
            name: "allocatable-ips annotation",
            pod: meta(json!({"annotations": {"ip-webhook.io/allocatable-ips": "10.0.0.10"}})),
            wants_ip: true,
            holds_ip: false,
            marked: false,
            ovn_pool: false,
        },
        PodCase {
            name: "ip-pool annotation, no labels",
            pod: meta(json!({"annotations": {"ip-webhook.io/ip-pool": "blue"}})),
            wants_ip: true,
            holds_ip: false,
            marked: false,
            ovn_pool: false,
        },
        PodCase {
            name: "fixed-ip label only",
            pod: meta(json!({"labels": {"ip-webhook.io/fixed-ip": ""}})),
            wants_ip: true,
            holds_ip: true,
            marked: false,
            ovn_pool: false,
        },
        PodCase {
            name: "hand-written Calico static IP",
            pod: meta(json!({"annotations": {"cni.projectcalico.org/ipAddrs": "[\"10.0.0.9\"]"}})),
            wants_ip: true,
            holds_ip: true,
            marked: false,
            ovn_pool: false,
        },
        PodCase {
            name: "hand-written Kube-OVN static IP",
            pod: meta(json!({"annotations": {"ovn.kubernetes.io/ip_address": "10.16.0.15"}})),
            wants_ip: true,
            holds_ip: true,
            marked: false,
            ovn_pool: false,
        },
        PodCase {
            name: "mutated pod",
            pod: meta(json!({
                "annotations": {
                    "ip-webhook.io/allocatable-ips": "10.0.0.10",
                    "ip-webhook.io/status": "mutated",
                    "cni.projectcalico.org/ipAddrs": "[\"10.0.0.10\"]"
                },
                "labels": {"app": "web", "ip-webhook.io/allocated-ip": "10.0.0.10"}
            })),
            wants_ip: true,
            holds_ip: true,
            marked: true,
            ovn_pool: false,
        },
        PodCase {
            name: "allocated label without annotations",
            pod: meta(json!({"labels": {"ip-webhook.io/allocated-ip": "fd00--a"}})),
            wants_ip: false,
            holds_ip: true,
            marked: true,
            ovn_pool: false,
        },
        PodCase {
            name: "claim token only",
            pod: meta(
                json!({"annotations": {"ip-webhook.io/claim": "0123456789abcdef0123456789abcdef"}}),
            ),
            wants_ip: false,
            holds_ip: true,
            marked: true,
            ovn_pool: false,
        },
        PodCase {
            name: "status marker only",
            pod: meta(json!({"annotations": {"ip-webhook.io/status": "mutated"}})),
            wants_ip: false,
            holds_ip: true,
            marked: true,
            ovn_pool: false,
        },
        PodCase {
            name: "Calico ipAddrsNoIpam",
            pod: meta(
                json!({"annotations": {"cni.projectcalico.org/ipAddrsNoIpam": "[\"10.0.0.9\"]"}}),
            ),
            wants_ip: true,
            holds_ip: true,
            marked: false,
            ovn_pool: false,
        },
        PodCase {
            name: "Kube-OVN ip_pool list",
            pod: meta(
                json!({"annotations": {"ovn.kubernetes.io/ip_pool": "10.16.0.10,10.16.0.11"}}),
            ),
            wants_ip: false,
            holds_ip: false,
            marked: false,
            ovn_pool: true,
        },
    ]
}

#[test]
fn cel_match_conditions_select_the_right_pods_and_never_error() {
    let helm = helm();
    let all = rendered_conditions(&helm);
    let names: BTreeSet<&str> = all.iter().map(|(_, n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "pod-wants-fixed-ip",
            "pod-holds-ip",
            "pod-names-ip",
            "pod-holds-claim",
            "template-asks-fixed-ips",
            "template-asked-fixed-ips",
            "not-ip-webhook-itself"
        ])
    );
    let conditions: Vec<_> = all
        .into_iter()
        .filter(|(_, name, _)| name.starts_with("pod-"))
        .collect();
    assert_eq!(
        conditions.len(),
        4,
        "CREATE, DELETE, validate-pods and pod-updates entries"
    );
    let null = Value::Null;
    for (entry, condition, expression) in &conditions {
        for case in pod_cases() {
            let create = evaluate(expression, &case.pod, &null);
            let update = evaluate(expression, &case.pod, &case.pod);
            let delete = evaluate(expression, &null, &case.pod);
            let (on_create, on_update, on_delete) = match condition.as_str() {
                // Reads object: true for the pods that ask, false when object is null.
                "pod-wants-fixed-ip" => (case.wants_ip, case.wants_ip, false),
                // Reads oldObject only: false on CREATE, where oldObject is null.
                "pod-holds-ip" => (false, case.holds_ip, case.holds_ip),
                // Asks or names an IP before or after, unless it carries our marks before
                // (those updates are pod-holds-claim's).
                "pod-names-ip" => (
                    case.wants_ip || case.ovn_pool,
                    (case.wants_ip || case.ovn_pool) && !case.marked,
                    case.wants_ip && !case.marked,
                ),
                "pod-holds-claim" => (false, case.marked, case.marked),
                other => panic!("untested condition {other}"),
            };
            let context = format!("{entry}/{condition} on pod '{}'", case.name);
            assert_eq!(create, Ok(on_create), "{context}, CREATE");
            assert_eq!(update, Ok(on_update), "{context}, UPDATE");
            assert_eq!(delete, Ok(on_delete), "{context}, DELETE");
        }
    }
}

/// An update that strips our marks is still sent to pod-updates (it reads oldObject), and
/// never to pods.validate too; an update that adds an IP annotation to an unmarked pod goes
/// to pods.validate.
#[test]
fn cel_pod_updates_are_judged_by_the_pod_as_stored() {
    let helm = helm();
    let all = rendered_conditions(&helm);
    let expression = |name: &str| {
        all.iter()
            .find(|(_, n, _)| n == name)
            .map(|(_, _, e)| e.clone())
            .unwrap()
    };
    let (names_ip, holds_claim) = (expression("pod-names-ip"), expression("pod-holds-claim"));
    let ours = json!({"metadata": {
        "labels": {"app": "web", "ip-webhook.io/allocated-ip": "10.2.0.1"},
        "annotations": {"cni.projectcalico.org/ipAddrs": "[\"10.2.0.1\"]", "ip-webhook.io/status": "mutated", "ip-webhook.io/claim": "0123456789abcdef0123456789abcdef"},
    }});
    let stripped = json!({"metadata": {"labels": {"app": "web"}, "annotations": {}}});
    assert_eq!(evaluate(&holds_claim, &stripped, &ours), Ok(true));
    assert_eq!(evaluate(&names_ip, &stripped, &ours), Ok(false));
    let plain = json!({"metadata": {"name": "p"}});
    let named = json!({"metadata": {"annotations": {"ovn.kubernetes.io/ip_address": "10.16.0.5"}}});
    assert_eq!(evaluate(&holds_claim, &named, &plain), Ok(false));
    assert_eq!(evaluate(&names_ip, &named, &plain), Ok(true));
    // a hand-written static IP removed from an unmarked pod: pods.validate sees it
    assert_eq!(evaluate(&names_ip, &plain, &named), Ok(true));
}

#[test]
fn cel_evaluation_reports_errors_so_the_guards_are_what_keeps_conditions_safe() {
    // The interpreter does error where the API server would: without the has() guards, a pod
    // without annotations, or a null object, makes the unguarded expression fail.
    let pod = json!({"metadata": {"name": "plain"}});
    let unguarded = "'ip-webhook.io/ip-pool' in object.metadata.annotations";
    assert!(evaluate(unguarded, &pod, &Value::Null).is_err());
    assert!(evaluate("has(object.metadata.labels)", &Value::Null, &pod).is_err());
}

#[test]
fn dockerfile_builds_what_the_chart_runs() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let stages: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert!(stages.len() >= 2, "multi-stage: {stages:?}");
    assert!(
        stages[stages.len() - 1].contains("distroless"),
        "small runtime base: {stages:?}"
    );
    // The builder is the toolchain Cargo.toml asks for.
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let rust_version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .unwrap()
        .trim_matches('"');
    assert!(
        stages[0].starts_with(&format!("FROM rust:{rust_version}")),
        "{stages:?} vs rust-version {rust_version}"
    );
    // The shipped image has the etcd ledger (the chart offers ledger=etcd), and with it the
    // protoc that etcd-client's build script needs.
    let build = dockerfile
        .lines()
        .find(|l| l.contains("cargo build"))
        .expect("the image is built with cargo");
    assert!(build.contains("--features etcd"), "{build}");
    assert!(dockerfile.contains("protobuf-compiler"));
    let final_stage = dockerfile.rsplit("\nFROM ").next().unwrap();
    assert!(final_stage.contains("ENTRYPOINT [\"/ip-webhook\"]"));
    let user = final_stage
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("the image names its user");
    let uid: u64 = user.split(':').next().unwrap().parse().unwrap();
    assert_ne!(uid, 0, "non-root");
    let helm = helm();
    let docs = render(&helm, &[], "1.31.0");
    let pod = &one(&docs, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsUser"], uid);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
}

/// Workloads as users write them, and whether their pod template asks for fixed IPs.
fn workload_cases() -> Vec<(&'static str, Value, bool)> {
    let with_template = |kind: &str, template_meta: Value| {
        json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "w"},
               "spec": {"replicas": 2, "template": {"metadata": template_meta, "spec": {}}}})
    };
    let cronjob = |template_meta: Value| {
        json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c"},
               "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {"metadata": template_meta}}}}})
    };
    vec![
        (
            "Deployment without template annotations",
            with_template("Deployment", json!({"labels": {"app": "web"}})),
            false,
        ),
        (
            "Deployment with an IP list",
            with_template(
                "Deployment",
                json!({"annotations": {"ip-webhook.io/allocatable-ips": "10.0.0.10-10.0.0.12"}}),
            ),
            true,
        ),
        (
            "StatefulSet drawing from a pool",
            with_template(
                "StatefulSet",
                json!({"annotations": {"ip-webhook.io/ip-pool": "blue"}}),
            ),
            true,
        ),
        (
            "Deployment with a Kube-OVN ip_pool list",
            with_template(
                "Deployment",
                json!({"annotations": {"ovn.kubernetes.io/ip_pool": "10.16.0.10,10.16.0.11"}}),
            ),
            true,
        ),
        (
            "annotation on the Deployment itself, not its template",
            json!({"kind": "Deployment",
                   "metadata": {"annotations": {"ip-webhook.io/allocatable-ips": "10.0.0.10"}},
                   "spec": {"template": {"metadata": {}}}}),
            false,
        ),
        (
            "CronJob with an IP list",
            cronjob(json!({"annotations": {"ip-webhook.io/allocatable-ips": "10.0.0.10"}})),
            true,
        ),
        ("CronJob without", cronjob(json!({})), false),
        (
            "CronJob without a job template",
            json!({"kind": "CronJob", "spec": {"schedule": "* * * * *"}}),
            false,
        ),
        (
            "no spec",
            json!({"kind": "Deployment", "metadata": {}}),
            false,
        ),
    ]
}

#[test]
fn cel_workload_condition_sees_template_annotations_before_and_after_and_never_errors() {
    let helm = helm();
    let conditions: Vec<_> = rendered_conditions(&helm)
        .into_iter()
        .filter(|(_, name, _)| name == "template-asks-fixed-ips")
        .collect();
    assert_eq!(conditions.len(), 1);
    let (entry, _, expression) = &conditions[0];
    assert_eq!(entry, "workloads.validate.ip-webhook.io");
    let null = Value::Null;
    let plain = json!({"kind": "Deployment", "spec": {"template": {"metadata": {}}}});
    for (name, workload, asks) in workload_cases() {
        assert_eq!(
            evaluate(expression, &workload, &null),
            Ok(asks),
            "{name}, CREATE"
        );
        assert_eq!(
            evaluate(expression, &workload, &workload),
            Ok(asks),
            "{name}, UPDATE"
        );
        // An UPDATE that removes the annotations still reaches the server, which forgets.
        assert_eq!(
            evaluate(expression, &plain, &workload),
            Ok(asks),
            "{name}, UPDATE removing the annotations"
        );
        assert_eq!(
            evaluate(expression, &null, &workload),
            Ok(asks),
            "{name}, DELETE shape"
        );
    }

    // The deletes entry: on DELETE only oldObject is set; a workload whose template asked for
    // fixed IPs is sent, others are not.
    let deletes: Vec<_> = rendered_conditions(&helm)
        .into_iter()
        .filter(|(_, name, _)| name == "template-asked-fixed-ips")
        .collect();
    assert_eq!(deletes.len(), 1);
    let (entry, _, expression) = &deletes[0];
    assert_eq!(entry, "deletes.validate.ip-webhook.io");
    let mut sent = 0;
    for (name, workload, asks) in workload_cases() {
        assert_eq!(
            evaluate(expression, &null, &workload),
            Ok(asks),
            "{name}, DELETE"
        );
        sent += usize::from(asks);
    }
    assert!(sent >= 2, "both outcomes are exercised");
}

// ---- Monitoring -----------------------------------------------------------------------

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
    let cli = ip_webhook::cli::Cli::try_parse_from(argv).unwrap();
    let ip_webhook::cli::Command::Serve(serve) = cli.command else {
        panic!("not a serve command")
    };
    assert_eq!(
        serve.cluster.reservation_ttl,
        std::time::Duration::from_secs(90)
    );
    assert_eq!(
        serve.cluster.sticky_grace,
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

/// The admission deadline ends every admission's ledger calls 1 s before the shortest
/// webhook timeout, so a slow ledger is a clear denial rather than an API server timeout.
#[test]
fn the_admission_deadline_is_below_the_shortest_webhook_timeout() {
    let helm = helm();
    let deadline = |set: &[&str]| {
        args(&render(&helm, set, "1.31.0"))
            .into_iter()
            .find(|a| a.starts_with("--admission-deadline="))
            .expect("the deployment passes --admission-deadline")
    };
    assert_eq!(deadline(&[]), "--admission-deadline=4s");
    assert_eq!(
        deadline(&[
            "mutatingWebhook.timeoutSeconds=10",
            "validatingWebhook.timeoutSeconds=3"
        ]),
        "--admission-deadline=2s"
    );
    assert_eq!(
        deadline(&[
            "mutatingWebhook.timeoutSeconds=1",
            "validatingWebhook.timeoutSeconds=1"
        ]),
        "--admission-deadline=1s"
    );
}
