//! The Deployment: its flags, ports and paths against what `serve` accepts, the hardened
//! install, the embedded ledger's replica and volume, the PDB, host networking and extra
//! volumes, and the image the Dockerfile builds.

use super::*;

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
        let serve = ip_webhook::cli::parse_serve(argv)
            .unwrap_or_else(|e| panic!("case {}: {args:?} does not parse: {e}", case.name));
        assert_eq!(serve.listen.port(), container_port(&docs, "https"));
        assert_eq!(serve.admin_listen.port(), container_port(&docs, "admin"));
        // the ledger is named, not left to `serve`'s guess from its environment
        let (flag, embedded) = if case.name == "embedded-ledger" {
            ("--ledger=embedded", true)
        } else {
            ("--ledger=kubernetes", false)
        };
        assert!(
            args.iter().any(|a| a == flag),
            "case {}: {args:?}",
            case.name
        );
        assert_eq!(
            matches!(
                serve.webhook.ledger,
                ip_webhook_ledger::LedgerConfig::Embedded { .. }
            ),
            embedded,
            "case {}: {:?}",
            case.name,
            serve.webhook.ledger
        );
        if case.name == "everything-on" {
            assert_eq!(serve.tls_reload_interval, std::time::Duration::from_secs(5));
            let settings = &serve.webhook.settings;
            assert!(settings.check_kube_ovn_subnets && settings.check_calico_pools);
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
    let serve = ip_webhook::cli::parse_serve(argv).expect("the Deployment's flags parse");
    let client_ca = serve.client_ca.expect("--client-ca-file is passed");
    assert_eq!(
        client_ca.file,
        Path::new("/etc/ip-webhook/client-ca/ca.crt")
    );
    assert_eq!(
        client_ca.allowed_names,
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
    // (0 is refused while a webhook is on: schema::no_replicas_are_refused_while_a_webhook_is_on)
    for (replicas, pdb) in [("1", false), ("2", true), ("3", true)] {
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

/// On the node's network the ports default to 10260 and 10261, next to the kubelet's 10250
/// (8443 and 8080 are often taken on a node); ports that are set win. The flags, the
/// container's ports and the NetworkPolicy follow.
#[test]
fn host_network_defaults_the_ports_next_to_the_kubelets() {
    let helm = helm();
    for (set, https, admin) in [
        (&[][..], 8443, 8080),
        (&["hostNetwork=true"][..], 10260, 10261),
        (
            &[
                "hostNetwork=true",
                "server.port=10300",
                "server.adminPort=10301",
            ][..],
            10300,
            10301,
        ),
        (&["server.port=9443"][..], 9443, 8080),
    ] {
        let set = [
            set,
            &[
                "networkPolicy.enabled=true",
                "networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.0/24",
            ],
        ]
        .concat();
        let docs = render(&helm, &set, "1.31.0");
        assert_eq!(container_port(&docs, "https"), https, "{set:?}");
        assert_eq!(container_port(&docs, "admin"), admin, "{set:?}");
        let args = args(&docs);
        for flag in [
            format!("--listen=0.0.0.0:{https}"),
            format!("--admin-listen=0.0.0.0:{admin}"),
        ] {
            assert!(args.contains(&flag), "{set:?}: {flag} not in {args:?}");
        }
        let opened: Vec<u64> = one(&docs, "NetworkPolicy")["spec"]["ingress"]
            .as_array()
            .unwrap()
            .iter()
            .map(|rule| rule["ports"][0]["port"].as_u64().unwrap())
            .collect();
        assert_eq!(opened, [u64::from(https), u64::from(admin)], "{set:?}");
    }
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
