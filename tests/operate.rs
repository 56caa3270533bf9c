//! The operator's commands over a ledger with known content: `status` (golden table, JSON,
//! YAML), `explain`, `release`, `check`, and the monitoring files against the real metrics.

mod common;

use common::{Ran, claims, fakeapi, ip_webhook};
use std::path::Path;

use ip_webhook_ledger::{Claim, EmbeddedLedger, Ledger, Phase, PodRef, Source};
use serde_json::Value;

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// 2025-11-29T07:06:40Z
const T0: u64 = 1_764_400_000;

/// The known content: web holds two of its four IPs (one only reserved), api holds one IP of
/// pool blue, a static pod without an app holds one, and one released record is history.
async fn seed(dir: &Path) {
    let ledger = EmbeddedLedger::open(dir, Default::default()).unwrap();
    let claims = [
        claims::builder("10.0.0.10", "web", "web-7d4b9c8f6d-abcde")
            .generate_name("web-7d4b9c8f6d-")
            .bound()
            .list_size(4)
            .at(T0)
            .build(),
        claims::builder("10.0.0.11", "web", "")
            .generate_name("web-7d4b9c8f6d-")
            .phase(Phase::Reserved)
            .list_size(4)
            .at(T0 + 60)
            .build(),
        claims::builder("10.0.0.12", "web", "web-7d4b9c8f6d-zzzzz")
            .bound()
            .list_size(4)
            .at(T0 - 600)
            .build(),
        claims::builder("10.20.0.1", "api", "api-0")
            .namespace("prod")
            .pool("blue")
            .bound()
            .list_size(254)
            .at(T0 + 120)
            .build(),
        claims::builder("10.0.0.50", "", "legacy")
            .bound()
            .source(Source::Static)
            .at(T0 + 180)
            .build(),
    ];
    for claim in &claims {
        ledger.create(claim.clone().into()).await.unwrap();
    }
    ledger.release(&claims[2]).await.unwrap();
    ledger.close().await;
}

fn check_golden(name: &str, actual: &str) {
    let path = fixture(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        actual, expected,
        "{name} differs (UPDATE_GOLDEN=1 rewrites it after review)"
    );
}

#[tokio::test]
async fn status_prints_pools_apps_and_holders() {
    let state = tempfile::tempdir().unwrap();
    seed(state.path()).await;
    let dir = state.path().to_str().unwrap();
    let pools = fixture("status-pools.yaml");
    let Ran {
        ok,
        stdout: table,
        stderr,
        ..
    } = ip_webhook(&["status", "--state-dir", dir, "--pools-file", &pools]);
    assert!(ok, "{stderr}");
    check_golden("status.txt", &table);
    // -o wide: the same tables, the holders with their pool, pod UID, token and request
    let Ran {
        ok,
        stdout: wide,
        stderr,
        ..
    } = ip_webhook(&[
        "status",
        "--state-dir",
        dir,
        "--pools-file",
        &pools,
        "-o",
        "wide",
    ]);
    assert!(ok, "{stderr}");
    check_golden("status-wide.txt", &wide);

    let Ran {
        ok,
        stdout: json,
        stderr,
        ..
    } = ip_webhook(&[
        "pools",
        "--state-dir",
        dir,
        "--pools-file",
        &pools,
        "-o",
        "json",
    ]);
    assert!(ok, "{stderr}");
    let report: Value = serde_json::from_str(&json).unwrap();
    let blue = &report["pools"][0];
    assert_eq!(
        (
            blue["name"].as_str(),
            blue["size"].as_u64(),
            blue["held"].as_u64(),
            blue["free"].as_u64()
        ),
        (Some("blue"), Some(254), Some(1), Some(253))
    );
    assert_eq!(
        report["pools"][1]["held"], 0,
        "green is listed though unused"
    );
    let web = report["apps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["app"] == "web")
        .unwrap();
    assert_eq!(
        (
            web["size"].as_u64(),
            web["held"].as_u64(),
            web["reserved"].as_u64(),
            web["free"].as_u64()
        ),
        (Some(4), Some(2), Some(1), Some(2))
    );
    let holders: Vec<&str> = web["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["pod"].as_str().unwrap())
        .collect();
    assert_eq!(
        holders,
        ["default/web-7d4b9c8f6d-abcde", "default/web-7d4b9c8f6d-*"],
        "the released record is not a holder"
    );
    assert_eq!(web["holders"][0]["since"], "2025-11-29T07:06:40Z");

    let Ran {
        ok,
        stdout: yaml,
        stderr,
        ..
    } = ip_webhook(&[
        "status",
        "--state-dir",
        dir,
        "-o",
        "yaml",
        "--app",
        "prod/api",
    ]);
    assert!(ok, "{stderr}");
    let report: Value = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(report["apps"].as_array().unwrap().len(), 1);
    assert_eq!(report["apps"][0]["pool"], "blue");
    assert_eq!(report["apps"][0]["holders"][0]["ip"], "10.20.0.1");
}

#[tokio::test]
async fn explain_walks_replicas_through_mutate_without_recording() {
    let state = tempfile::tempdir().unwrap();
    seed(state.path()).await;
    let dir = state.path().to_str().unwrap();
    let pools = fixture("status-pools.yaml");
    let args = [
        "explain",
        "-f",
        &fixture("explain.yaml"),
        "--state-dir",
        dir,
        "--pools-file",
        &pools,
    ];
    let Ran {
        ok,
        stdout: json,
        stderr,
        ..
    } = ip_webhook(&[&args[..], &["-o", "json"]].concat());
    assert!(!ok, "two replicas are refused: {stderr}");
    assert_eq!(stderr, "Error: 2 of 10 replicas would be refused\n");
    let outcomes: Value = serde_json::from_str(&json).unwrap();
    let summary = |object: &Value| -> Vec<String> {
        object["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| match r["refused"].as_str() {
                Some(message) => format!("{} refused: {message}", r["pod"].as_str().unwrap()),
                None => format!(
                    "{} {} ({})",
                    r["pod"].as_str().unwrap(),
                    r["ips"][0].as_str().unwrap_or("-"),
                    r["why"][0].as_str().unwrap_or("")
                ),
            })
            .collect()
    };
    assert_eq!(outcomes[0]["object"], "Deployment default/web");
    assert_eq!(
        outcomes[0]["warnings"][0],
        "Deployment default/web asks for 5 replicas but its list has 4 IPs: pods beyond 4 will be refused"
    );
    // the two pods that hold IPs already count as replicas 0 and 1
    assert_eq!(
        summary(&outcomes[0]),
        [
            "default/web-7d4b9c8f6d-abcde 10.0.0.10 (already holds it (Bound since 2025-11-29T07:06:40Z))",
            "default/web-7d4b9c8f6d-* 10.0.0.11 (already holds it (Reserved since 2025-11-29T07:07:40Z))",
            "default/web-* 10.0.0.12 (lowest free IP of the list)",
            "default/web-* 10.0.0.13 (lowest free IP of the list)",
            "default/web-* refused: app default/web: all 4 allocatable IPs are held (10.0.0.10 by default/web-7d4b9c8f6d-abcde, 10.0.0.11 by default/web-7d4b9c8f6d-*, 10.0.0.12 by default/web-*, 10.0.0.13 by default/web-*)",
        ]
    );
    assert_eq!(outcomes[0]["replicas"][0]["existing"], true);
    assert_eq!(outcomes[0]["replicas"][2]["existing"], false);
    assert_eq!(
        outcomes[1]["warnings"][0],
        "StatefulSet prod/db asks for 4 replicas but its list has 3 IPs: pods beyond 3 will be refused"
    );
    assert_eq!(
        summary(&outcomes[1]),
        [
            "prod/db-0 10.40.0.1 (StatefulSet ordinal 0: entry 0 of the list (ascending))",
            "prod/db-1 10.40.0.2 (StatefulSet ordinal 1: entry 1 of the list (ascending))",
            "prod/db-2 10.40.0.3 (StatefulSet ordinal 2: entry 2 of the list (ascending))",
            "prod/db-3 refused: app prod/db: all 3 allocatable IPs are held (10.40.0.1 by prod/db-0, 10.40.0.2 by prod/db-1, 10.40.0.3 by prod/db-2)",
        ]
    );
    assert_eq!(
        summary(&outcomes[2]),
        ["prod/api-1 10.20.0.2 (lowest free IP of the list)"]
    );

    let Ran {
        ok,
        stdout: text,
        stderr,
        ..
    } = ip_webhook(&args);
    assert!(!ok, "{stderr}");
    assert!(
        text.contains("StatefulSet prod/db\n  warning: StatefulSet prod/db asks for 4 replicas"),
        "{text}"
    );
    assert!(text.contains("#3        prod/db-3   REFUSED"), "{text}");

    // nothing was recorded: the ledger still holds the seeded four
    let Ran {
        ok, stdout: json, ..
    } = ip_webhook(&["status", "--state-dir", dir, "-o", "json"]);
    assert!(ok);
    let report: Value = serde_json::from_str(&json).unwrap();
    let held: u64 = report["apps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["held"].as_u64().unwrap())
        .sum();
    assert_eq!(held, 4);
}

/// A KubeVirt VirtualMachine is explained as its launcher pod, which KubeVirt's controller
/// creates from the VM's template: the VM's IP, named as the VM's.
#[tokio::test]
async fn explain_shows_a_virtual_machines_ip_as_its_vms() {
    let state = tempfile::tempdir().unwrap();
    let file = state.path().join("vm.yaml");
    std::fs::write(
        &file,
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: db, namespace: default}\n\
         spec:\n  runStrategy: Always\n  template:\n    metadata:\n      labels: {app: db}\n\
         \x20     annotations: {ip-webhook.io/allocatable-ips: 10.90.0.1-10.90.0.4}\n    spec: {}\n",
    )
    .unwrap();
    let dir = state.path().join("state");
    let explain = |dir: &Path| {
        let ran = ip_webhook(&[
            "explain",
            "-f",
            file.to_str().unwrap(),
            "--state-dir",
            dir.to_str().unwrap(),
            "-o",
            "json",
        ]);
        assert!(ran.ok, "{}", ran.stderr);
        let outcomes: Value = serde_json::from_str(&ran.stdout).unwrap();
        assert_eq!(outcomes[0]["object"], "VirtualMachine default/db");
        let replicas = outcomes[0]["replicas"].as_array().unwrap().clone();
        assert_eq!(replicas.len(), 1, "a VM runs one launcher pod: {outcomes}");
        assert_eq!(replicas[0]["pod"], "vm default/db");
        replicas[0].clone()
    };
    let fresh = explain(&dir);
    assert_eq!(fresh["ips"][0], "10.90.0.1");
    assert_eq!(fresh["existing"], false);
    // the VM holds 10.90.0.3 already (its launcher pod is gone, the VM stopped): kept for it
    let ledger = EmbeddedLedger::open(&dir, Default::default()).unwrap();
    let held = Claim {
        vm: Some("db".into()),
        pod: PodRef {
            generate_name: "virt-launcher-db-".into(),
            ..claims::pod_ref("default", "virt-launcher-db-x7k2p")
        },
        ..claims::claim("10.90.0.3", "db", "virt-launcher-db-x7k2p")
    };
    ledger.create(held.into()).await.unwrap();
    ledger.close().await;
    let kept = explain(&dir);
    assert_eq!(kept["ips"][0], "10.90.0.3", "{kept}");
    assert_eq!(kept["existing"], true, "{kept}");
}

#[tokio::test]
async fn explain_names_the_document_it_cannot_use() {
    let state = tempfile::tempdir().unwrap();
    let file = state.path().join("svc.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n",
    )
    .unwrap();
    let dir = state.path().join("state");
    seed(&dir).await;
    let Ran { ok, stderr, .. } = ip_webhook(&[
        "explain",
        "-f",
        file.to_str().unwrap(),
        "--state-dir",
        dir.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("document 0: \"Service\" (v1) is not a Pod, a workload"),
        "{stderr}"
    );
}

#[tokio::test]
async fn explain_suggests_the_known_key_for_a_mistyped_one() {
    let state = tempfile::tempdir().unwrap();
    let file = state.path().join("pod.yaml");
    let pod = |annotations: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: default\n  labels: {{app: web}}\n  annotations: {{{annotations}}}\nspec: {{containers: [{{name: c, image: i}}]}}\n"
        )
    };
    std::fs::write(&file, pod("ip-webhook.io/allocatable-ip: 10.0.0.12")).unwrap();
    let dir = state.path().join("state");
    seed(&dir).await;
    let explain = |extra: &[&str]| {
        let args = [
            &[
                "explain",
                "-f",
                file.to_str().unwrap(),
                "--state-dir",
                dir.to_str().unwrap(),
            ][..],
            extra,
        ]
        .concat();
        ip_webhook(&args)
    };
    let Ran {
        ok,
        stdout: text,
        stderr,
        ..
    } = explain(&[]);
    assert!(ok, "{stderr}");
    assert!(
        text.contains(r#"Pod default/p
  warning: metadata.annotations["ip-webhook.io/allocatable-ip"]: ip-webhook reads no such key and ignores it; did you mean "ip-webhook.io/allocatable-ips"?"#),
        "{text}"
    );
    // --strict: the same answer, and a CI gate stops on the warning (exit 3)
    let strict = explain(&["--strict"]);
    assert_eq!(strict.code, Some(3), "{}", strict.stderr);
    assert_eq!(strict.stdout, text);
    assert_eq!(strict.stderr, "Error: 1 warning (--strict)\n");
    // ... and passes what has no warning
    std::fs::write(&file, pod("ip-webhook.io/allocatable-ips: 10.0.0.12")).unwrap();
    let clean = explain(&["--strict"]);
    assert_eq!(
        (clean.code, clean.stderr.as_str()),
        (Some(0), ""),
        "{}",
        clean.stdout
    );
    assert!(clean.stdout.contains("10.0.0.12"), "{}", clean.stdout);
}

#[tokio::test]
async fn release_needs_force_off_cluster_and_says_what_it_did() {
    let state = tempfile::tempdir().unwrap();
    seed(state.path()).await;
    let dir = state.path().to_str().unwrap();
    let Ran { ok, stderr, .. } = ip_webhook(&["release", "10.0.0.10", "--state-dir", dir]);
    assert!(!ok);
    assert!(stderr.contains("refused: cannot tell whether pod default/web-7d4b9c8f6d-abcde still runs (the embedded ledger has no pod list"), "{stderr}");
    assert!(stderr.contains("rerun with --force"), "{stderr}");

    let Ran {
        ok, stdout, stderr, ..
    } = ip_webhook(&["release", "10.0.0.10", "--force", "--state-dir", dir]);
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout,
        "released 10.0.0.10 (Bound, held by pod default/web-7d4b9c8f6d-abcde of app default/web since 2025-11-29T07:06:40Z) (forced); it can be allocated again\n"
    );

    let Ran { ok, stderr, .. } =
        ip_webhook(&["release", "10.0.0.10", "--force", "--state-dir", dir]);
    assert!(!ok);
    assert!(
        stderr.contains("nothing to release: no claim holds 10.0.0.10"),
        "{stderr}"
    );

    let Ran {
        ok, stdout: json, ..
    } = ip_webhook(&[
        "status",
        "--state-dir",
        dir,
        "-o",
        "json",
        "--app",
        "default/web",
    ]);
    assert!(ok);
    let report: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["apps"][0]["held"], 1);
    assert_eq!(report["apps"][0]["free"], 3);
}

/// Every `ip_webhook_*` series the dashboard and the alerts use is one the server exposes.
fn assert_monitoring_uses_real_metrics(exposition: &str) {
    let dir = format!("{}/deploy/monitoring", env!("CARGO_MANIFEST_DIR"));
    let dashboard = std::fs::read_to_string(format!("{dir}/grafana-dashboard.json")).unwrap();
    let rules = std::fs::read_to_string(format!("{dir}/prometheusrule.yaml")).unwrap();
    let _: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let parsed: Value = serde_yaml::from_str(&rules).expect("the rules are YAML");
    assert_eq!(parsed["kind"], "PrometheusRule");
    let mut missing = Vec::new();
    for text in [&dashboard, &rules] {
        for (start, _) in text.match_indices("ip_webhook_") {
            let name: String = text[start..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .fold(name.as_str(), |n, s| n.strip_suffix(s).unwrap_or(n));
            let exposed = exposition.lines().any(|line| {
                line.strip_prefix("# TYPE ")
                    .and_then(|l| l.split_whitespace().next())
                    .is_some_and(|family| {
                        base == family || base.strip_suffix("_total") == Some(family)
                    })
            });
            if !exposed {
                missing.push(name);
            }
        }
    }
    missing.dedup();
    assert!(missing.is_empty(), "not exposed: {missing:?}\n{exposition}");
}

#[tokio::test]
async fn check_reports_each_part_of_a_running_install() {
    let pools = fixture("status-pools.yaml");
    let server =
        common::TestServer::start_with(|c| c.webhook.pools_file = Some(pools.clone().into())).await;
    // one app with one IP, now used up: capacity warns
    let pod = common::pod("default", "solo", "solo-", Some("10.0.0.99"));
    let response = server.mutate(&common::create("u-solo", pod.clone())).await;
    assert_eq!(response["allowed"], true);
    let refused = server.mutate(&common::create("u-solo-2", pod)).await;
    assert_eq!(refused["allowed"], false);

    let url = format!(
        "https://localhost:{}",
        server.launched.running.https_addr.port()
    );
    let admin = format!("http://{}", server.launched.running.admin_addr);
    let ca = server.state_dir.path().join("ca.crt").display().to_string();
    let with_url = |url: &str| {
        ["--url", url, "--ca-file", &ca]
            .map(str::to_string)
            .to_vec()
    };
    let mut args = with_url(&url);
    args.extend(["--admin-url".to_string(), admin.clone()]);
    let (checks, ran) = common::check(args).await;
    let verdicts: Vec<(&str, &str)> = checks
        .iter()
        .map(|c| (c.name.as_str(), c.status.as_str()))
        .collect();
    assert_eq!(
        verdicts,
        [
            ("reachable", "OK"),
            ("certificate", "OK"),
            ("expiry", "OK"),
            ("admission", "OK"),
            ("ready", "OK"),
            ("capacity", "WARN"),
            ("leader", "SKIP"),
        ],
        "{ran:?}"
    );
    assert!(ran.ok, "a warning is not a failure: {ran:?}");
    let capacity = &checks[5].detail;
    assert_eq!(
        capacity,
        "app default/solo 100% held; exhausted since start: default/solo refused 1 pods"
    );

    // a caBundle of another CA: the API server would refuse the certificate
    let other = ip_webhook::server::certs::self_signed(&[]).unwrap();
    let other_ca = server.state_dir.path().join("other-ca.crt");
    std::fs::write(&other_ca, &other.ca_pem).unwrap();
    let Ran {
        ok, stdout, stderr, ..
    } = tokio::task::spawn_blocking(move || {
        ip_webhook(&[
            "check",
            "--url",
            &url,
            "--ca-file",
            other_ca.to_str().unwrap(),
            "--admin-url",
            &admin,
        ])
    })
    .await
    .unwrap();
    assert!(!ok, "{stdout}");
    // same CA name, other key: webpki finds the issuer by name and the signature fails
    assert!(stdout.contains("FAIL     certificate   the API server would refuse it: invalid peer certificate: BadSignature"), "{stdout}");
    assert!(stdout.contains("OK       admission"), "{stdout}");
    assert!(stderr.contains("1 of 7 checks failed"), "{stderr}");

    // nothing listens: reachable fails, and says where it tried
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let (down, ran) = common::check(with_url(&format!("https://127.0.0.1:{port}"))).await;
    assert_eq!(
        (down[0].name.as_str(), down[0].status.as_str()),
        ("reachable", "FAIL")
    );
    assert!(
        down[0]
            .detail
            .starts_with(&format!("cannot connect to 127.0.0.1:{port}")),
        "{ran:?}"
    );
    assert!(!ran.ok && ran.stderr.contains("checks failed"), "{ran:?}");

    let (_, mut metrics) = server.admin_get("/metrics").await;
    // the Lease gauge exists only in-cluster, once the Lease code sets it
    let in_cluster = ip_webhook::metrics::Metrics::new();
    in_cluster
        .leader
        .get_or_create(&ip_webhook::metrics::LeaseLabels {
            lease: "ip-webhook".into(),
        })
        .set(1);
    metrics.push_str(&in_cluster.encode());
    assert_monitoring_uses_real_metrics(&metrics);
    server.launched.shutdown().await;
}

#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn one_json_log_line_per_decision() {
    use ip_webhook::metrics::Endpoint;
    use std::sync::Arc;
    let captured = Captured::default();
    let writer = captured.clone();
    // as `--log-format json` builds it (`server::logging::init`): fields at the top level
    let subscriber = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let allocator = Arc::new(
        ip_webhook_ipam::allocator::Allocator::new(
            Arc::new(ip_webhook_ledger::MemoryLedger::new()),
        )
        .await
        .unwrap(),
    );
    let webhook = ip_webhook::decisions::Webhook::new(
        Default::default(),
        allocator,
        Default::default(),
        Arc::new(ip_webhook::metrics::Metrics::new()),
    );
    let pod = common::pod("default", "web", "web-", Some("10.0.0.10"));
    // a dry run, a grant, the grant's request retried, a denial
    let dry_run = common::review("v1", "uid-0", "CREATE", Some(pod.clone()), None, true);
    let bodies = [
        dry_run,
        common::create("uid-1", pod.clone()),
        common::create("uid-1", pod.clone()),
        common::create("uid-2", pod.clone()),
    ];
    for body in bodies {
        webhook
            .review(Endpoint::mutate, body.to_string().as_bytes())
            .await
            .unwrap();
    }
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let every: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["message"] == "admission decision")
        .collect();
    // what changed the books (the grant) and the denial at INFO, the rest at DEBUG
    let levels: Vec<(&str, &str)> = every
        .iter()
        .map(|l| (l["uid"].as_str().unwrap(), l["level"].as_str().unwrap()))
        .collect();
    assert_eq!(
        levels,
        [
            ("uid-0", "DEBUG"),
            ("uid-1", "INFO"),
            ("uid-1", "DEBUG"),
            ("uid-2", "INFO")
        ],
        "{text}"
    );
    let decisions: Vec<&Value> = every.iter().filter(|l| l["level"] == "INFO").collect();
    assert_eq!(decisions.len(), 2, "{text}");
    let first = &decisions[0];
    assert_eq!(first["uid"], "uid-1");
    assert_eq!(first["namespace"], "default");
    assert_eq!(first["app"], "default/web");
    assert_eq!(first["ip"], "10.0.0.10");
    assert_eq!(first["outcome"], "allowed");
    assert!(first["latency_us"].as_u64().is_some(), "{first}");
    let second = &decisions[1];
    assert_eq!(second["outcome"], "denied");
    assert_eq!(second["ip"], "", "{second}");
    assert!(
        second["reason"]
            .as_str()
            .unwrap()
            .contains("all 1 allocatable IPs are held"),
        "{second}"
    );
}

// ---- the operator commands as kubectl users run them --------------------------------------

/// Run the binary as from a fresh shell: no $KUBECONFIG unless given, an empty $HOME (no
/// ~/.kube/config), not in a pod, RUST_BACKTRACE=1 (as many shells have it), in `cwd`.
fn operator(args: &[&str], kubeconfig: Option<&Path>, cwd: &Path) -> (i32, String, String) {
    let home = tempfile::tempdir().unwrap();
    let mut command = common::binary();
    command
        .args(args)
        .current_dir(cwd)
        .env("HOME", home.path())
        .env("RUST_BACKTRACE", "1");
    if let Some(path) = kubeconfig {
        command.env("KUBECONFIG", path);
    }
    let out = command.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An error as the binary must print it: exactly one `Error: …` line, no backtrace.
fn assert_one_error_line(stderr: &str, starts: &str) {
    assert!(
        stderr.starts_with(&format!("Error: {starts}")) && stderr.lines().count() == 1,
        "not one Error line starting with {starts:?}:\n{stderr}"
    );
    for word in ["backtrace", "Caused by", "panicked"] {
        assert!(!stderr.contains(word), "{word} in {stderr}");
    }
}

fn is_empty_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().next().is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_read_the_cluster_of_kubeconfig_and_create_nothing() {
    use ip_webhook_ledger::KubeLedger;
    use ip_webhook_ledger::crd::{FixedIPPool, IPClaim};
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    use kube::api::{Api, PostParams};

    let fake = fakeapi::FakeApi::start();
    let cwd = tempfile::tempdir().unwrap();
    let kubeconfig = fake.kubeconfig();
    let kc = Some(kubeconfig.as_path());
    let run = |args: &[&str]| operator(args, kc, cwd.path());

    // a cluster without ip-webhook: said in a sentence
    let (code, _, stderr) = run(&["status"]);
    assert_eq!(code, 1);
    assert_one_error_line(
        &stderr,
        &format!(
            "the API server http://127.0.0.1:{}/ (from $KUBECONFIG ({})) serves no IPClaims (ipclaims.ip-webhook.io): ip-webhook is not installed there (wrong --context?); install its CRDs with `ip-webhook crds | kubectl apply -f -` or the Helm chart",
            fake.port,
            kubeconfig.display()
        ),
    );
    // `serve` says the same, and writes nothing
    let state = cwd.path().join("state");
    let (code, _, stderr) = run(&[
        "serve",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert_one_error_line(
        &stderr,
        &format!(
            "the API server http://127.0.0.1:{}/ (from --kubeconfig {}) serves no IPClaims (ipclaims.ip-webhook.io): ip-webhook is not installed there (wrong --context?); install its CRDs with `ip-webhook crds | kubectl apply -f -` or the Helm chart",
            fake.port,
            kubeconfig.display()
        ),
    );
    assert!(!state.join("ca.crt").exists(), "{stderr}");

    let client = fake.client().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [FixedIPPool::crd(), IPClaim::crd()] {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }

    let (code, stdout, stderr) = run(&["status"]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    assert_eq!(stdout, "No IPs are held and no FixedIPPools are defined.\n");

    // a pool, a live pod holding one of its IPs, and the claim of a pod that is gone
    let pools: Api<FixedIPPool> = Api::all(client.clone());
    let blue: FixedIPPool = serde_json::from_value(serde_json::json!({
        "apiVersion": "ip-webhook.io/v1alpha1", "kind": "FixedIPPool",
        "metadata": {"name": "blue"}, "spec": {"cidr": "10.20.0.0/24"}
    }))
    .unwrap();
    pools.create(&PostParams::default(), &blue).await.unwrap();
    let namespace: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "prod"}})).unwrap();
    Api::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "api-0", "namespace": "prod", "labels": {"app": "api"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]}
    }))
    .unwrap();
    let pod = Api::<Pod>::namespaced(client.clone(), "prod")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let uid = pod.metadata.uid.unwrap();
    let ledger = KubeLedger::new(client.clone());
    ledger
        .create(
            claims::bound("10.20.0.1", "prod", "api", "api-0", &uid)
                .pool("blue")
                .build()
                .into(),
        )
        .await
        .unwrap();
    ledger
        .create(
            claims::bound("10.0.0.10", "default", "web", "web-0", "gone-uid")
                .build()
                .into(),
        )
        .await
        .unwrap();

    let (code, json, stderr) = run(&["status", "-o", "json"]);
    assert_eq!(code, 0, "{stderr}");
    let report: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["pools"][0]["name"], "blue");
    assert_eq!(report["pools"][0]["held"], 1);
    let apps: Vec<&str> = report["apps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["app"].as_str().unwrap())
        .collect();
    assert_eq!(apps, ["web", "api"], "{json}");

    // filters that match nothing say so, and exit 3
    let (code, stdout, stderr) = run(&["status", "--app", "nope/nope"]);
    assert_eq!((code, stdout.as_str()), (3, ""));
    assert_one_error_line(
        &stderr,
        "no app nope/nope holds an IP (apps holding IPs: default/web, prod/api)",
    );
    let (code, _, stderr) = run(&["status", "--pool", "nosuch"]);
    assert_eq!(code, 3);
    assert_one_error_line(&stderr, "no FixedIPPool nosuch (known: blue)");
    let (code, _, stderr) = run(&["status", "--app", "web"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("\"web\" is not NAMESPACE/APP"), "{stderr}");

    // explain decides over the cluster's claims and pools, and prints only its own output
    let explain = ["explain", "-f", &fixture("explain.yaml"), "-o", "json"];
    let (code, json, stderr) = run(&explain);
    assert_eq!(
        (code, stderr.as_str()),
        (3, "Error: 2 of 10 replicas would be refused\n")
    );
    let outcomes: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(outcomes[2]["object"], "Pod prod/api-1");
    assert_eq!(outcomes[2]["replicas"][0]["ips"][0], "10.20.0.2", "{json}");
    let (code, verbose_json, stderr) = run(&[&explain[..], &["-v"]].concat());
    assert_eq!(code, 3, "{stderr}");
    assert_eq!(verbose_json, json);
    assert!(stderr.contains("admission decision"), "{stderr}");

    // release asks the API server whether the pod behind the claim still runs
    let (code, _, stderr) = run(&["release", "10.20.0.1"]);
    assert_eq!(code, 3);
    assert_one_error_line(
        &stderr,
        "refused: pod prod/api-0 still exists and holds 10.20.0.1",
    );
    let (code, stdout, stderr) = run(&["release", "10.0.0.10"]);
    assert_eq!(code, 0, "{stderr}");
    // (the API server drops status on create: the claim is Reserved)
    assert!(
        stdout.starts_with(
            "released 10.0.0.10 (Reserved, held by pod default/web-0 of app default/web since "
        ),
        "{stdout}"
    );
    let (_, json, _) = run(&["status", "-o", "json", "--app", "default/web"]);
    let report: Value = serde_json::from_str(&json).unwrap_or_default();
    assert!(
        report["apps"]
            .as_array()
            .is_none_or(|a| a.is_empty() || a[0]["held"] == 0),
        "{json}"
    );

    // --kubeconfig beats $KUBECONFIG, --context picks the cluster
    let dead = fakeapi::closed_port();
    let two = cwd.path().join("../two-contexts.yaml");
    std::fs::write(
        &two,
        fakeapi::kubeconfig_yaml(&[("fake", fake.port), ("dead", dead)]),
    )
    .unwrap();
    let other = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(other.path(), fakeapi::kubeconfig_yaml(&[("dead", dead)])).unwrap();
    let two = two.to_str().unwrap();
    let (code, _, stderr) = operator(
        &["status", "--kubeconfig", two],
        Some(other.path()),
        cwd.path(),
    );
    assert_eq!((code, stderr.as_str()), (0, ""));
    let (code, _, stderr) = run(&["status", "--kubeconfig", two, "--context", "dead"]);
    assert_eq!(code, 1);
    assert_one_error_line(
        &stderr,
        &format!(
            "reading IPClaims from the API server http://127.0.0.1:{dead}/ (from --kubeconfig {two})"
        ),
    );
    let (code, _, stderr) = run(&["status", "--context", "nosuch"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, "finding the API server through $KUBECONFIG (");
    assert!(stderr.contains("nosuch"), "{stderr}");
    std::fs::remove_file(two).unwrap();

    assert!(
        is_empty_dir(cwd.path()),
        "an operator command wrote into the working directory"
    );
}

#[tokio::test]
async fn errors_are_one_line_with_an_exit_code_and_never_a_backtrace() {
    let cwd = tempfile::tempdir().unwrap();
    let dir = cwd.path();

    // $KUBECONFIG names a dead API server: an error naming it, and no state created
    let port = fakeapi::closed_port();
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        kubeconfig.path(),
        fakeapi::kubeconfig_yaml(&[("dead", port)]),
    )
    .unwrap();
    for command in ["status", "release"] {
        let args: &[&str] = if command == "release" {
            &["release", "10.0.0.1"]
        } else {
            &["status"]
        };
        let (code, stdout, stderr) = operator(args, Some(kubeconfig.path()), dir);
        assert_eq!((code, stdout.as_str()), (1, ""), "{command}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "the API server http://127.0.0.1:{port}/ (from $KUBECONFIG ({}))",
                kubeconfig.path().display()
            )),
            "{stderr}"
        );
        assert_one_error_line(&stderr, "");
    }
    // `serve` too: its own `Error:` line, no client library's ERROR line before it
    let state = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = operator(
        &[
            "serve",
            "--kubeconfig",
            kubeconfig.path().to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--state-dir",
            state.path().to_str().unwrap(),
        ],
        None,
        dir,
    );
    assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
    assert!(
        stderr.contains(&format!("the API server http://127.0.0.1:{port}/")),
        "{stderr}"
    );
    assert_one_error_line(&stderr, "");

    // no cluster anywhere
    let (code, _, stderr) = operator(&["status"], None, dir);
    assert_eq!(code, 1);
    assert_one_error_line(
        &stderr,
        "no cluster found: no --kubeconfig, $KUBECONFIG is unset, ~/.kube/config does not exist and this is not a pod, and ./ip-webhook-state holds no ledger; give --kubeconfig FILE, or --state-dir DIR",
    );

    // a missing state dir is named, not created, and explained against as an empty ledger
    let missing = dir.join("state");
    let (code, _, stderr) = operator(
        &[
            "explain",
            "-f",
            &fixture("explain.yaml"),
            "--state-dir",
            missing.to_str().unwrap(),
        ],
        None,
        dir,
    );
    assert_eq!(code, 3, "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "note: no embedded ledger: {} does not exist (give the --state-dir of `ip-webhook serve`); explaining against an empty ledger\nError: 3 of 10 replicas would be refused\n",
            missing.display()
        )
    );
    assert!(!missing.exists());
    std::fs::create_dir(&missing).unwrap();
    let (code, _, stderr) = operator(
        &["status", "--state-dir", missing.to_str().unwrap()],
        None,
        dir,
    );
    assert_eq!(code, 1);
    assert_one_error_line(
        &stderr,
        &format!(
            "no embedded ledger in {}: no journal or snapshot there",
            missing.display()
        ),
    );
    let (code, _, stderr) = operator(
        &[
            "release",
            "10.0.0.1",
            "--force",
            "--state-dir",
            missing.to_str().unwrap(),
        ],
        None,
        dir,
    );
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, "no embedded ledger in ");
    assert!(
        is_empty_dir(&missing),
        "a command created state in {}",
        missing.display()
    );
    std::fs::remove_dir(&missing).unwrap();

    let (code, _, stderr) = operator(
        &["explain", "-f", "missing.yaml", "--state-dir", "x"],
        None,
        dir,
    );
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, "reading missing.yaml: No such file or directory");

    let (code, _, stderr) = operator(
        &[
            "check",
            "--url",
            "https://127.0.0.1:1",
            "--ca-file",
            "/nonexistent/ca.crt",
        ],
        None,
        dir,
    );
    assert_eq!(code, 1);
    assert_one_error_line(
        &stderr,
        "reading /nonexistent/ca.crt: No such file or directory",
    );
    let (code, stdout, stderr) = operator(
        &["check", "--url", &format!("https://127.0.0.1:{port}")],
        None,
        dir,
    );
    assert_eq!(code, 3, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "FAIL     reachable   cannot connect to 127.0.0.1:{port}"
        )),
        "{stdout}"
    );
    assert_one_error_line(&stderr, "");

    // a refused release (off-cluster, not forced) exits 3
    let state = dir.join("seeded");
    seed(&state).await;
    let (code, _, stderr) = operator(
        &[
            "release",
            "10.0.0.10",
            "--state-dir",
            state.to_str().unwrap(),
        ],
        None,
        dir,
    );
    assert_eq!(code, 3);
    assert_one_error_line(
        &stderr,
        "refused: cannot tell whether pod default/web-7d4b9c8f6d-abcde still runs",
    );
    std::fs::remove_dir_all(&state).unwrap();

    assert!(
        is_empty_dir(dir),
        "state was created in the working directory"
    );
}

/// Where `serve` keeps its ledger by default (`./ip-webhook-state`), `status`, `explain` and
/// `release` find it with no flag, as `serve` run there does, unless a cluster is named.
#[tokio::test]
async fn the_commands_read_the_ledger_serve_keeps_here() {
    let served = tempfile::tempdir().unwrap();
    let here = served.path();
    let state = here.join("ip-webhook-state");
    seed(&state).await;
    let state = state.to_str().unwrap();
    let explain = ["explain", "-f", &fixture("explain.yaml")];
    for args in [&["status"][..], &["status", "-o", "json"], &explain] {
        let (code, stdout, stderr) = operator(args, None, here);
        let named = operator(&[args, &["--state-dir", state]].concat(), None, here);
        assert_eq!(
            (code, &stdout, &stderr),
            (named.0, &named.1, &named.2),
            "{args:?}"
        );
        assert!(stdout.contains("10.0.0.11"), "{args:?}: {stdout}");
    }
    let (code, stdout, stderr) = operator(&["status"], None, here);
    assert_eq!((code, stderr.as_str()), (0, ""), "{stdout}");
    // release writes there (forced: off-cluster nothing can confirm the pod is gone)
    let (code, stdout, stderr) = operator(&["release", "10.0.0.11", "--force"], None, here);
    assert_eq!((code, stderr.as_str()), (0, ""), "{stdout}");
    assert!(stdout.starts_with("released 10.0.0.11 "), "{stdout}");
    let (_, stdout, _) = operator(&["status"], None, here);
    assert!(!stdout.contains("10.0.0.11"), "{stdout}");
    // $KUBECONFIG names a cluster: that one is asked, not the directory
    let port = fakeapi::closed_port();
    let kubeconfig = here.join("kubeconfig");
    std::fs::write(&kubeconfig, fakeapi::kubeconfig_yaml(&[("dead", port)])).unwrap();
    let (code, _, stderr) = operator(&["status"], Some(&kubeconfig), here);
    assert_eq!(code, 1);
    assert!(
        stderr.contains(&format!("the API server http://127.0.0.1:{port}/")),
        "{stderr}"
    );
    let (code, _, stderr) = operator(&["status", "--context", "dead"], None, here);
    assert_eq!(code, 1, "--context names a cluster: {stderr}");
}

/// Without the `etcd` feature, `--ledger etcd` says so in one line. (scripts/test.sh builds
/// with --all-features, and checks the same answer from its `cargo install` build, which has
/// no etcd.)
#[cfg(not(feature = "etcd"))]
#[test]
fn a_build_without_etcd_says_how_to_get_it() {
    let cwd = tempfile::tempdir().unwrap();
    let (code, _, stderr) = operator(&["status", "--ledger", "etcd"], None, cwd.path());
    assert_eq!(code, 1);
    assert_one_error_line(
        &stderr,
        "this build has no etcd support; rebuild with --features etcd",
    );
}

#[test]
fn the_no_etcd_error_names_the_feature() {
    assert_eq!(
        ip_webhook_ledger::OpenError::NoEtcd.to_string(),
        "this build has no etcd support; rebuild with --features etcd"
    );
}

/// etcd down: one plain cause (the refused connection), said once, as the API server's errors
/// are; not the client library's nested statuses and `Debug` dumps.
#[cfg(feature = "etcd")]
#[test]
fn an_unreachable_etcd_is_one_plain_cause() {
    let cwd = tempfile::tempdir().unwrap();
    let endpoint = format!("http://127.0.0.1:{}", fakeapi::closed_port());
    for command in [&["status"][..], &["release", "10.0.0.1", "--force"]] {
        let args = [
            command,
            &[
                "--ledger",
                "etcd",
                "--etcd-endpoints",
                &endpoint,
                "--etcd-timeout",
                "1s",
            ],
        ]
        .concat();
        let (code, stdout, stderr) = operator(&args, None, cwd.path());
        assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
        assert_eq!(
            stderr,
            format!(
                "Error: opening the etcd ledger: ledger storage error: etcd status: Connection refused (os error 111) (endpoints [\"{endpoint}\"])\n"
            )
        );
        for noise in [
            "ledger storage error: ledger storage error",
            "tonic",
            "Os {",
            "Error(",
        ] {
            assert!(!stderr.contains(noise), "{noise:?} in {stderr}");
        }
    }
}

/// `status`, `explain` and `review --dry-run` read the embedded ledger while the server that
/// writes it runs; `review` that records says what to do. The self-signed CA survives a
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_servers_ledger_is_read_and_its_ca_kept() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().to_str().unwrap();
    let mut server = common::BinaryServer::start(&["--state-dir", dir]);
    let ca = std::fs::read(state.path().join("ca.crt")).unwrap();
    let client = common::HttpsClient::new(server.https_addr, &ca);
    let pod = common::pod("default", "web", "web-", Some("10.0.0.10,10.0.0.11"));
    let reply = client
        .post("/mutate", common::create("u-1", pod).to_string())
        .await
        .unwrap()
        .response();
    assert_eq!(reply["allowed"], true);
    let cwd = tempfile::tempdir().unwrap();
    let (code, json, stderr) = operator(
        &["status", "--state-dir", dir, "-o", "json"],
        None,
        cwd.path(),
    );
    // the command's own output only; what no claim can show off-cluster is a log line of -v
    assert_eq!((code, stderr.as_str()), (0, ""));
    let (code, verbose_json, verbose) = operator(
        &["status", "--state-dir", dir, "-o", "json", "-v"],
        None,
        cwd.path(),
    );
    assert_eq!((code, &verbose_json), (0, &json));
    assert!(
        verbose.lines().any(|line| line.contains(" INFO ")
            && line
                .contains("no API server to ask: a claim whose pod was refused after admission")
            && line.ends_with(
                "free its IP with `ip-webhook release IP --force` (works while the server runs)"
            )),
        "{verbose}"
    );
    let report: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["apps"][0]["holders"][0]["ip"], "10.0.0.10", "{json}");
    let (code, _, stderr) = operator(
        &[
            "explain",
            "-f",
            &fixture("explain.yaml"),
            "--state-dir",
            dir,
        ],
        None,
        cwd.path(),
    );
    assert_eq!(
        (code, stderr.as_str()),
        (3, "Error: 3 of 10 replicas would be refused\n")
    );
    let (code, json, stderr) = operator(
        &[
            "review",
            "--dry-run",
            "--state-dir",
            dir,
            &fixture("pod-create-v1.json"),
        ],
        None,
        cwd.path(),
    );
    assert_eq!((code, stderr.as_str()), (0, ""));
    assert_eq!(
        serde_json::from_str::<Value>(&json).unwrap()["response"]["allowed"],
        true
    );
    let (code, _, stderr) = operator(
        &["review", "--state-dir", dir, &fixture("pod-create-v1.json")],
        None,
        cwd.path(),
    );
    assert_eq!(code, 1);
    assert_one_error_line(
        &stderr,
        &format!(
            "opening the embedded ledger in {dir} to record the review's claim (with --dry-run it is only read, also while `serve` runs)"
        ),
    );

    server.kill9();
    let server = common::BinaryServer::start(&["--state-dir", dir]);
    assert_eq!(
        std::fs::read(state.path().join("ca.crt")).unwrap(),
        ca,
        "the CA changed on restart"
    );
    let client = common::HttpsClient::new(server.https_addr, &ca);
    let pod = common::pod("default", "web", "web-", Some("10.0.0.10,10.0.0.11"));
    let reply = client
        .post("/mutate", common::create("u-2", pod).to_string())
        .await
        .expect("the kept CA still verifies the server")
        .response();
    assert_eq!(reply["allowed"], true);
    assert!(is_empty_dir(cwd.path()));
}

/// Off-cluster nothing can confirm a pod is gone, so `release --force` is the way to free the
/// claim of a pod refused after admission; it goes through the running server, which frees the
/// IP in its own held set too.
#[tokio::test]
async fn release_frees_through_a_running_server() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().to_str().unwrap();
    let server = common::BinaryServer::start(&["--state-dir", dir]);
    let ca = std::fs::read(state.path().join("ca.crt")).unwrap();
    let client = common::HttpsClient::new(server.https_addr, &ca);
    let mutate = async |uid: &str| {
        let pod = common::pod("default", "web", "web-", Some("10.0.0.10,10.0.0.11"));
        let reply = client
            .post("/mutate", common::create(uid, pod).to_string())
            .await
            .unwrap()
            .response();
        assert_eq!(reply["allowed"], true, "{reply}");
        common::allocated_ip(&reply)
    };
    assert_eq!(mutate("u-1").await, "10.0.0.10");
    let cwd = tempfile::tempdir().unwrap();

    let (code, _, stderr) = operator(
        &["release", "10.0.0.10", "--state-dir", dir],
        None,
        cwd.path(),
    );
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains("refused: cannot tell whether pod default/web-"),
        "{stderr}"
    );
    assert!(
        stderr.contains("the server has no API server to ask"),
        "{stderr}"
    );
    let (code, _, stderr) = operator(
        &[
            "release",
            "10.0.0.10",
            "--force",
            "-n",
            "prod",
            "--state-dir",
            dir,
        ],
        None,
        cwd.path(),
    );
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("not in namespace prod"), "{stderr}");
    assert_eq!(mutate("u-2").await, "10.0.0.11", "10.0.0.10 is still held");

    let (code, stdout, stderr) = operator(
        &["release", "10.0.0.10", "--force", "--state-dir", dir],
        None,
        cwd.path(),
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.starts_with("released 10.0.0.10 (Reserved, held by pod default/web-"),
        "{stdout}"
    );
    assert!(
        stdout.ends_with("(forced); it can be allocated again\n"),
        "{stdout}"
    );
    // The server itself lets it go: the next pod is granted it at once.
    assert_eq!(mutate("u-3").await, "10.0.0.10");
}

/// `check --tls-server-name` (a port-forward) and `check --kubeconfig`, which compares the
/// webhook configurations' caBundles with the served chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_verifies_the_service_name_and_the_clusters_ca_bundles() {
    use base64::Engine;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, ApiResource, DynamicObject, PostParams};

    let service = "ip-webhook.ip-webhook-system.svc";
    let server = common::TestServer::start_with(|c| {
        c.tls = ip_webhook::app::TlsConfig::SelfSigned {
            dns_names: vec![service.to_string()],
        }
    })
    .await;
    let ca_file = server.state_dir.path().join("ca.crt");
    let ca = std::fs::read(&ca_file).unwrap();
    let url = format!(
        "https://127.0.0.1:{}",
        server.launched.running.https_addr.port()
    );
    let cwd = tempfile::tempdir().unwrap();
    let check = |extra: &[&str], kubeconfig: Option<&Path>| {
        let mut args = vec!["check", "--url", &url];
        args.extend_from_slice(extra);
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let kubeconfig = kubeconfig.map(Path::to_path_buf);
        let cwd = cwd.path().to_path_buf();
        std::thread::spawn(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            operator(&args, kubeconfig.as_deref(), &cwd)
        })
        .join()
        .unwrap()
    };
    let ca_path = ca_file.to_str().unwrap();
    let (code, stdout, stderr) = check(&["--ca-file", ca_path, "--tls-server-name", service], None);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!(
            "OK       certificate   valid for {service} and signed by the caBundle"
        )),
        "{stdout}"
    );
    let (code, stdout, _) = check(
        &[
            "--ca-file",
            ca_path,
            "--tls-server-name",
            "other.example.svc",
        ],
        None,
    );
    assert_eq!(code, 3);
    assert!(stdout.contains("FAIL     certificate   the API server would refuse it: invalid peer certificate: certificate not valid for name \"other.example.svc\""), "{stdout}");

    let fake = fakeapi::FakeApi::start();
    // fakeapi.py serves no admissionregistration.k8s.io: CRDs of the same shape stand in
    let client = fake.client().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut resources = Vec::new();
    for (kind, plural) in [
        (
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
        ),
        (
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
        ),
    ] {
        let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.admissionregistration.k8s.io"),
                         "annotations": {"api-approved.kubernetes.io": "unapproved, test only"}},
            "spec": {"group": "admissionregistration.k8s.io", "scope": "Cluster",
                     "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase()},
                     "versions": [{"name": "v1", "served": true, "storage": true,
                                   "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
        }))
        .unwrap();
        crds.create(&PostParams::default(), &crd).await.unwrap();
        resources.push(ApiResource {
            group: "admissionregistration.k8s.io".into(),
            version: "v1".into(),
            api_version: "admissionregistration.k8s.io/v1".into(),
            kind: kind.into(),
            plural: plural.into(),
        });
    }
    let bundle = base64::engine::general_purpose::STANDARD.encode(&ca);
    let other_bundle = base64::engine::general_purpose::STANDARD
        .encode(ip_webhook::server::certs::self_signed(&[]).unwrap().ca_pem);
    let configuration = |resource: &ApiResource, webhook: &str, bundle: &str| -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": resource.kind,
            "metadata": {"name": "ip-webhook"},
            "webhooks": [{"name": webhook, "clientConfig": {"caBundle": bundle}}]
        }))
        .unwrap()
    };
    let mutating = Api::<DynamicObject>::all_with(client.clone(), &resources[0]);
    let validating = Api::<DynamicObject>::all_with(client.clone(), &resources[1]);
    mutating
        .create(
            &PostParams::default(),
            &configuration(&resources[0], "pods.mutate.ip-webhook.io", &bundle),
        )
        .await
        .unwrap();
    validating
        .create(
            &PostParams::default(),
            &configuration(&resources[1], "pods.validate.ip-webhook.io", &bundle),
        )
        .await
        .unwrap();
    let kubeconfig = fake.kubeconfig();
    let (code, stdout, stderr) = check(&["--tls-server-name", service], Some(&kubeconfig));
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains(&format!("OK       cabundle      the caBundle of each of the 2 webhooks signs the served certificate for {service}")), "{stdout}");
    assert!(stdout.contains("SKIP     certificate"), "{stdout}");

    let mut stale = validating.get("ip-webhook").await.unwrap();
    stale.data["webhooks"][0]["clientConfig"]["caBundle"] = other_bundle.into();
    validating
        .replace("ip-webhook", &PostParams::default(), &stale)
        .await
        .unwrap();
    let kubeconfig_flag = kubeconfig.to_str().unwrap();
    let (code, stdout, stderr) = check(
        &[
            "--tls-server-name",
            service,
            "--ca-file",
            ca_path,
            "--kubeconfig",
            kubeconfig_flag,
        ],
        None,
    );
    assert_eq!(code, 3, "{stdout}");
    assert!(stdout.contains("OK       certificate"), "{stdout}");
    assert!(stdout.contains("FAIL     cabundle      the API server would refuse the served certificate: ValidatingWebhookConfiguration ip-webhook webhook pods.validate.ip-webhook.io: invalid peer certificate: BadSignature"), "{stdout}");
    assert!(
        !stdout.contains("MutatingWebhookConfiguration ip-webhook webhook"),
        "{stdout}"
    );
    assert_one_error_line(&stderr, "1 of 8 checks failed");

    let (code, stdout, _) = check(&["--webhook-configuration", "nosuch"], Some(&kubeconfig));
    assert_eq!(code, 3);
    assert!(stdout.contains(&format!("FAIL     cabundle      the API server http://127.0.0.1:{}/ (from $KUBECONFIG ({})) has no MutatingWebhookConfiguration or ValidatingWebhookConfiguration named nosuch (--webhook-configuration)", fake.port, kubeconfig.display())), "{stdout}");
    server.launched.shutdown().await;
}
