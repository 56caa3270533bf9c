//! The CEL matchConditions, evaluated on pod and workload shapes.

use super::*;

/// The rendered CEL conditions, by entry name, on Kubernetes 1.31.
pub(super) fn rendered_conditions(helm: &Path) -> Vec<(String, String, String)> {
    rendered_conditions_with(helm, &[])
}

/// [`rendered_conditions`] with these `--set` values.
fn rendered_conditions_with(helm: &Path, set: &[&str]) -> Vec<(String, String, String)> {
    let docs = render(helm, set, "1.31.0");
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
    /// It carries a label or annotation key under `ip-webhook.io/`, known or mistyped
    /// (pod-wants-fixed-ip sends it to /mutate, which warns about a mistyped one).
    our_key: bool,
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
            our_key: false,
        },
        PodCase {
            name: "no metadata at all",
            pod: json!({"apiVersion": "v1", "kind": "Pod"}),
            wants_ip: false,
            holds_ip: false,
            marked: false,
            ovn_pool: false,
            our_key: false,
        },
        PodCase {
            name: "empty maps",
            pod: meta(json!({"name": "e", "annotations": {}, "labels": {}})),
            wants_ip: false,
            holds_ip: false,
            marked: false,
            ovn_pool: false,
            our_key: false,
        },
        PodCase {
            name: "unrelated annotations and labels",
            pod: meta(json!({"annotations": {"a": "b"}, "labels": {"app": "web"}})),
            wants_ip: false,
            holds_ip: false,
            marked: false,
            ovn_pool: false,
            our_key: false,
        },
        PodCase {
            name: "allocatable-ips annotation",
            pod: meta(json!({"annotations": {"ip-webhook.io/allocatable-ips": "10.0.0.10"}})),
            wants_ip: true,
            holds_ip: false,
            marked: false,
            ovn_pool: false,
            our_key: true,
        },
        PodCase {
            name: "ip-pool annotation, no labels",
            pod: meta(json!({"annotations": {"ip-webhook.io/ip-pool": "blue"}})),
            wants_ip: true,
            holds_ip: false,
            marked: false,
            ovn_pool: false,
            our_key: true,
        },
        PodCase {
            name: "fixed-ip label only",
            pod: meta(json!({"labels": {"ip-webhook.io/fixed-ip": ""}})),
            wants_ip: true,
            holds_ip: true,
            marked: false,
            ovn_pool: false,
            our_key: true,
        },
        PodCase {
            name: "hand-written Calico static IP",
            pod: meta(json!({"annotations": {"cni.projectcalico.org/ipAddrs": "[\"10.0.0.9\"]"}})),
            wants_ip: true,
            holds_ip: true,
            marked: false,
            ovn_pool: false,
            our_key: false,
        },
        PodCase {
            name: "hand-written Kube-OVN static IP",
            pod: meta(json!({"annotations": {"ovn.kubernetes.io/ip_address": "10.16.0.15"}})),
            wants_ip: true,
            holds_ip: true,
            marked: false,
            ovn_pool: false,
            our_key: false,
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
            our_key: true,
        },
        PodCase {
            name: "allocated label without annotations",
            pod: meta(json!({"labels": {"ip-webhook.io/allocated-ip": "fd00--a"}})),
            wants_ip: false,
            holds_ip: true,
            marked: true,
            ovn_pool: false,
            our_key: true,
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
            our_key: true,
        },
        PodCase {
            name: "status marker only",
            pod: meta(json!({"annotations": {"ip-webhook.io/status": "mutated"}})),
            wants_ip: false,
            holds_ip: true,
            marked: true,
            ovn_pool: false,
            our_key: true,
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
            our_key: false,
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
            our_key: false,
        },
        PodCase {
            name: "mistyped annotation of ours",
            pod: meta(json!({"annotations": {"ip-webhook.io/allocatable-ip": "10.0.0.10"}})),
            wants_ip: false,
            holds_ip: false,
            marked: false,
            ovn_pool: false,
            our_key: true,
        },
        PodCase {
            name: "mistyped label of ours",
            pod: meta(json!({"labels": {"ip-webhook.io/fixedip": ""}})),
            wants_ip: false,
            holds_ip: false,
            marked: false,
            ovn_pool: false,
            our_key: true,
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
                // Reads object: true for the pods that ask or carry a key of ours, false when
                // object is null.
                "pod-wants-fixed-ip" => {
                    let sent = case.wants_ip || case.our_key;
                    (sent, sent, false)
                }
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

/// With server.networks, a pod that attaches Multus networks (or names a list for one) is sent
/// to /mutate and to pods.validate at its CREATE; without, no Multus pod is (it would wait on
/// a webhook that has nothing to give it).
#[test]
fn cel_sends_multus_pods_only_when_secondary_networks_are_managed() {
    let helm = helm();
    let network_pods = [
        json!({"metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": "storage@net1"}}}),
        json!({"metadata": {"annotations": {"storage.default.ip-webhook.io/allocatable-ips": "10.50.0.1"}}}),
    ];
    let plain = json!({"metadata": {"annotations": {"a": "b"}}});
    for (set, managed) in [
        (&["server.networks={default/storage}"][..], true),
        (&[][..], false),
    ] {
        let all = rendered_conditions_with(&helm, set);
        for name in ["pod-wants-fixed-ip", "pod-names-ip"] {
            let (_, _, expression) = all.iter().find(|(_, n, _)| n == name).unwrap();
            for pod in &network_pods {
                assert_eq!(
                    evaluate(expression, pod, &Value::Null),
                    Ok(managed),
                    "{name} {set:?} {pod}"
                );
            }
            assert_eq!(
                evaluate(expression, &plain, &Value::Null),
                Ok(false),
                "{name} {set:?}"
            );
            assert_eq!(
                evaluate(expression, &Value::Null, &plain),
                Ok(false),
                "{name} {set:?}"
            );
        }
    }
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
