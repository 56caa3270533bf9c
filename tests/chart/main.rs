//! The Helm chart, checked with the real tools: `helm lint --strict` and `helm template` for
//! each documented switch, every rendered document through `kubernetes-validate --strict`
//! (cert-manager and prometheus-operator kinds through models generated from their CRDs),
//! the rendered facts asserted, the CEL matchConditions evaluated on pod shapes, and the
//! Deployment's flags, ports and paths compared with what `ip-webhook serve --help` accepts.
//!
//! The tools come from `scripts/install-test-deps.sh` (`.tools/helm`, `.tools/venv`); a test
//! whose tool is missing prints why and returns.

#[path = "../common/mod.rs"]
mod common;

mod certificates;
mod deployment;
mod match_conditions;
mod monitoring;
mod rbac;
mod schema;
mod webhooks;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use base64::Engine;
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
