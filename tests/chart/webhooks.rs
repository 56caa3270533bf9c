//! The webhook configurations: the documented webhooks and their rules, the CNI pool kinds,
//! label selection before Kubernetes 1.30, the validating webhook switched off, and the
//! admission deadline below the webhooks' timeouts.

use super::*;

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
