//! The RBAC rules: what the server needs, and the CNI extras only when switched on.

use super::*;

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
        grant("kubevirt.io", "virtualmachineinstances", "get,list,watch"),
        grant("kubevirt.io", "virtualmachines", "get,list,watch"),
    ];
    let calico = [
        grant("crd.projectcalico.org", "ippools", "list,watch"),
        grant(
            "crd.projectcalico.org",
            "ipreservations",
            "list,watch,create,patch",
        ),
        grant("crd.projectcalico.org", "ipamblocks", "list,watch"),
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
    // every pod read whole: Calico's IPAM blocks are not read
    let from_pods = render(&helm, &["server.podIPsFrom=pods"], "1.31.0");
    let rules = rules_of(one(&from_pods, "ClusterRole"));
    assert!(
        !rules.iter().any(|(_, r, _)| r == "ipamblocks"),
        "{rules:?}"
    );
    assert_eq!(rules.len(), expected.len() - 1);
    let args = &one(&from_pods, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(
        args.as_array()
            .unwrap()
            .contains(&json!("--pod-ips-from=pods")),
        "{args}"
    );
    let mut plain = base.clone();
    plain.sort();
    let off = render(&helm, &["rbac.calico=false"], "1.31.0");
    assert_eq!(rules_of(one(&off, "ClusterRole")), plain);
    let ovn = render(&helm, &["server.cni=kube-ovn"], "1.31.0");
    let mut expected_ovn = base.clone();
    expected_ovn.extend(kube_ovn.clone());
    expected_ovn.sort();
    assert_eq!(rules_of(one(&ovn, "ClusterRole")), expected_ovn);
    // no KubeVirt controller named: no pod is a VM's, and no VM is read
    let no_vms = render(&helm, &["server.kubevirt.controllers=null"], "1.31.0");
    let without_vms: Vec<_> = plain
        .iter()
        .chain(calico.iter())
        .filter(|(group, _, _)| group != "kubevirt.io")
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(rules_of(one(&no_vms, "ClusterRole")), without_vms);
    let args = &one(&no_vms, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(
        args.as_array()
            .unwrap()
            .contains(&json!("--kubevirt-controller=")),
        "{args}"
    );
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

/// Each CNI's descriptor (`CNIS`) names the objects an in-cluster replica of it watches; the
/// chart rendered for that CNI lets the service account list and watch every one of them, and
/// its pod webhooks' conditions name the annotation the descriptor says is written.
#[test]
fn each_cnis_descriptor_is_what_the_chart_grants_and_matches() {
    let helm = helm();
    let conditions = super::match_conditions::rendered_conditions(&helm);
    for descriptor in ip_webhook_admission::annotations::CNIS {
        let set = format!("server.cni={}", descriptor.name);
        let docs = render(&helm, &[&set], "1.31.0");
        let rules = rules_of(one(&docs, "ClusterRole"));
        for object in descriptor.watches {
            let (group, _, _, plural) = object.resource();
            assert!(
                rules.iter().any(|(g, r, verbs)| g == group
                    && r == plural
                    && verbs.contains("list")
                    && verbs.contains("watch")),
                "{}: no list and watch on {group}/{plural}: {rules:?}",
                descriptor.name
            );
        }
        assert!(
            conditions
                .iter()
                .any(|(_, name, expression)| name == "pod-wants-fixed-ip"
                    && expression.contains(descriptor.annotation)),
            "{}: pod-wants-fixed-ip does not name {}",
            descriptor.name,
            descriptor.annotation
        );
    }
}
