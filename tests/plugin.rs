//! The kubectl plugin: the binary linked as `kubectl-ipw` says `kubectl ipw` in its
//! help, usage and errors, takes kubectl's --kubeconfig, --context and -n, and real kubectl's
//! plugin discovery finds and runs it, also as `ip-webhook plugin install` puts it in place.

mod common;

use common::{claims, fakeapi};
use std::path::{Path, PathBuf};
use std::process::Command;

use fakeapi::FakeApi;
use ip_webhook_ledger::{KubeLedger, Ledger};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

/// A directory holding the built binary as `kubectl-ipw` (a symlink, as docs/install.md
/// shows) and as `kubectl-ipw.exe` (a copy: the Windows file name).
fn plugin_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let binary = env!("CARGO_BIN_EXE_ip-webhook");
    std::os::unix::fs::symlink(binary, dir.path().join("kubectl-ipw")).unwrap();
    std::fs::copy(binary, dir.path().join("kubectl-ipw.exe")).unwrap();
    dir
}

/// Run `program` as from a fresh shell: an empty $HOME, no $KUBECONFIG, not in a pod, with
/// `path` first on $PATH.
fn run(program: &Path, args: &[&str], path: &Path) -> (i32, String, String) {
    let home = tempfile::tempdir().unwrap();
    let search = std::env::join_paths(std::iter::once(path.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let out = Command::new(program)
        .args(args)
        .env("PATH", search)
        .env("HOME", home.path())
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// kubectl: `.tools/kubectl` (scripts/install-test-deps.sh puts it there), else one on $PATH.
fn kubectl() -> PathBuf {
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/kubectl");
    if tools.is_file() {
        return tools;
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("kubectl"))
        .find(|candidate| candidate.is_file())
        .expect("tests/plugin.rs needs kubectl: run scripts/install-test-deps.sh (it installs .tools/kubectl) or put kubectl on PATH")
}

/// prod/api holds 10.20.0.1 (its pod runs); default/web's claim on 10.0.0.10 outlived its pod.
async fn cluster(fake: &FakeApi) {
    let client = fake.install_crds().await;
    let prod: Namespace = serde_json::from_value(json!({"metadata": {"name": "prod"}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &prod)
        .await
        .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "api-0", "namespace": "prod", "labels": {"app": "api"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }))
    .unwrap();
    let pod = Api::<Pod>::namespaced(client.clone(), "prod")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let ledger = KubeLedger::new(client);
    let uid = pod.metadata.uid.unwrap();
    ledger
        .create(
            claims::bound("10.20.0.1", "prod", "api", "api-0", &uid)
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
}

fn apps(json: &str) -> Vec<String> {
    let report: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    report["apps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            format!(
                "{}/{}",
                a["namespace"].as_str().unwrap(),
                a["app"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn help_usage_and_errors_say_kubectl_ipw() {
    let dir = plugin_dir();
    for file in ["kubectl-ipw", "kubectl-ipw.exe"] {
        let plugin = dir.path().join(file);
        let (code, help, _) = run(&plugin, &["--help"], dir.path());
        assert_eq!(code, 0, "{file}");
        assert!(
            help.contains("Usage: kubectl ipw [OPTIONS] <COMMAND>"),
            "{file}:\n{help}"
        );
        for command in ["status", "explain", "release", "check"] {
            assert!(
                help.lines().any(|l| l.trim_start().starts_with(command)),
                "{command} missing:\n{help}"
            );
        }
        assert!(
            !help.lines().any(|l| l.trim_start().starts_with("serve ")),
            "the server's commands are not shown to kubectl users:\n{help}"
        );
    }
    let plugin = dir.path().join("kubectl-ipw");
    let (code, help, _) = run(&plugin, &["status", "--help"], dir.path());
    assert_eq!(code, 0);
    assert!(
        help.contains("Usage: kubectl ipw status [OPTIONS]"),
        "{help}"
    );
    for flag in [
        "--kubeconfig <FILE>",
        "--context <NAME>",
        "-n, --namespace <NAMESPACE>",
    ] {
        assert!(help.contains(flag), "{flag} missing:\n{help}");
    }
    let (code, _, stderr) = run(&plugin, &["stauts"], dir.path());
    assert_eq!(code, 2);
    assert!(
        stderr.contains("Usage: kubectl ipw [OPTIONS] <COMMAND>"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&plugin, &["check"], dir.path());
    assert_eq!(code, 2);
    assert!(
        stderr.contains("Usage: kubectl ipw check --url <URL>"),
        "{stderr}"
    );
    // Under its own name, the binary is still ip-webhook.
    let (_, help, _) = run(
        Path::new(env!("CARGO_BIN_EXE_ip-webhook")),
        &["--help"],
        dir.path(),
    );
    assert!(
        help.contains("Usage: ip-webhook [OPTIONS] <COMMAND>"),
        "{help}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_ipw_reads_the_cluster_of_kubeconfig_context_and_namespace() {
    let fake = FakeApi::start();
    cluster(&fake).await;
    let dir = plugin_dir();
    // Two contexts: the current one points at nothing; --context picks the fake.
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        fakeapi::kubeconfig_yaml(&[("dead", fakeapi::closed_port()), ("fake", fake.port)]),
    )
    .unwrap();
    let kc = kubeconfig.display().to_string();
    let plugin = dir.path().join("kubectl-ipw");
    let at = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["--kubeconfig", kc.as_str(), "--context", "fake"];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_string).collect()
    };
    let strs = |v: &[String]| v.iter().map(String::as_str).collect::<Vec<_>>().join(" ");

    // the binary under the plugin name
    let mut args = vec!["status"];
    let rest = at(&["-n", "prod", "-o", "json"]);
    args.extend(rest.iter().map(String::as_str));
    let (code, json, stderr) = run(&plugin, &args, dir.path());
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(apps(&json), ["prod/api"]);
    let (code, _, stderr) = run(
        &plugin,
        &["status", "--kubeconfig", &kc, "-n", "prod"],
        dir.path(),
    );
    assert_eq!(code, 1, "the current context points at a closed port");
    assert!(stderr.starts_with("Error: "), "{stderr}");

    // real kubectl finds it on PATH and runs it, passing the flags through
    let kubectl = kubectl();
    let (code, list, stderr) = run(&kubectl, &["plugin", "list"], dir.path());
    assert_eq!(code, 0, "{stderr}");
    assert!(
        list.contains(&dir.path().join("kubectl-ipw").display().to_string()),
        "{list}{stderr}"
    );
    let run_kubectl = |args: Vec<String>| {
        let mut all = vec!["ipw".to_string()];
        all.extend(args);
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        run(&kubectl, &refs, dir.path())
    };
    let (code, json, stderr) = run_kubectl(
        std::iter::once("status".to_string())
            .chain(at(&["-n", "default", "-o", "json"]))
            .collect(),
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(apps(&json), ["default/web"]);
    let (code, _, stderr) = run_kubectl(
        std::iter::once("status".to_string())
            .chain(at(&["-n", "nowhere"]))
            .collect(),
    );
    assert_eq!(code, 3, "a filter that matches nothing: {stderr}");
    assert_eq!(
        stderr.trim(),
        "Error: no app in namespace nowhere holds an IP"
    );

    // explain -f through kubectl
    let fixture = format!("{}/tests/fixtures/explain.yaml", env!("CARGO_MANIFEST_DIR"));
    let (code, text, stderr) = run_kubectl(
        ["explain", "-f", &fixture]
            .map(str::to_string)
            .into_iter()
            .chain(at(&["-n", "default"]))
            .collect(),
    );
    // the fixture asks for more replicas than its lists hold: exit 3, after the answer
    assert_eq!(code, 3, "{}: {stderr}", strs(&at(&[])));
    assert_eq!(stderr.trim(), "Error: 3 of 10 replicas would be refused");
    assert!(text.contains("REFUSED"), "{text}");

    // release: -n guards against freeing another namespace's IP
    let (code, _, stderr) = run_kubectl(
        ["release", "10.0.0.10"]
            .map(str::to_string)
            .into_iter()
            .chain(at(&["-n", "prod"]))
            .collect(),
    );
    assert_eq!(code, 3, "{stderr}");
    assert_eq!(
        stderr.trim(),
        "Error: not released: 10.0.0.10 is claimed for pod default/web-0, not in namespace prod"
    );
    let (code, out, stderr) = run_kubectl(
        ["release", "10.0.0.10"]
            .map(str::to_string)
            .into_iter()
            .chain(at(&["-n", "default"]))
            .collect(),
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(out.starts_with("released 10.0.0.10"), "{out}");

    // check --drift through kubectl: prod is clean
    let (code, out, stderr) = run_kubectl(
        ["check", "--drift"]
            .map(str::to_string)
            .into_iter()
            .chain(at(&["-n", "prod"]))
            .collect(),
    );
    assert_eq!(code, 0, "{out}{stderr}");
    assert!(
        out.starts_with("No drift: compared 1 claims, 1 pods"),
        "{out}"
    );
}

/// deploy/krew/ipw.yaml parses and passes the rules of krew's own `ValidatePlugin`
/// (kubernetes-sigs/krew `internal/index/validation/validate.go`): apiVersion and kind, a
/// safe name equal to the file's, a one-line shortDescription, a `v`-prefixed semver version,
/// and per platform a uri, a sha256 of 64 hex digits, a bin, well-formed files and an
/// os/arch selector. Its URLs are placeholders, and it says so.
#[test]
fn the_krew_manifest_passes_krews_validation_rules() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/krew/ipw.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let manifest: Value = serde_yaml::from_str(&text).unwrap();
    let str_at = |value: &Value, pointer: &str| -> String {
        value
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("{pointer} missing or not a string"))
            .to_string()
    };
    assert_eq!(
        str_at(&manifest, "/apiVersion"),
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(str_at(&manifest, "/kind"), "Plugin");
    let name = str_at(&manifest, "/metadata/name");
    assert_eq!(name, path.file_stem().unwrap().to_str().unwrap());
    assert!(
        name.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    );
    let short = str_at(&manifest, "/spec/shortDescription");
    assert!(!short.is_empty() && !short.contains(['\r', '\n']));
    let version = str_at(&manifest, "/spec/version");
    let numbers: Vec<&str> = version
        .strip_prefix('v')
        .unwrap_or_else(|| panic!("version {version} lacks the v krew wants"))
        .split('.')
        .collect();
    assert_eq!(numbers.len(), 3, "{version}");
    assert!(
        numbers
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    );
    // The crate's version: a release bumps both.
    assert_eq!(version, format!("v{}", env!("CARGO_PKG_VERSION")));
    let platforms = manifest["spec"]["platforms"].as_array().unwrap();
    assert!(!platforms.is_empty());
    for platform in platforms {
        let uri = str_at(platform, "/uri");
        assert!(
            uri.starts_with("https://") && uri.ends_with(".tar.gz"),
            "{uri}"
        );
        let sha = str_at(platform, "/sha256");
        assert!(
            sha.len() == 64
                && sha
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{sha}"
        );
        assert_eq!(str_at(platform, "/bin"), "kubectl-ipw");
        let files = platform["files"].as_array().unwrap();
        assert!(!files.is_empty());
        for file in files {
            assert!(!str_at(file, "/from").is_empty() && !str_at(file, "/to").is_empty());
        }
        assert!(
            files
                .iter()
                .any(|f| f["from"] == "ip-webhook" && f["to"] == "kubectl-ipw"),
            "the binary must be installed under the plugin's name: {files:?}"
        );
        let labels = platform["selector"]["matchLabels"].as_object().unwrap();
        assert!(!labels.is_empty());
        assert!(
            labels.keys().all(|k| k == "os" || k == "arch"),
            "{labels:?}"
        );
        // Placeholder until releases exist: a host that cannot resolve, and the header says so.
        assert!(uri.contains(".example.invalid/"), "{uri}");
    }
    assert!(text.starts_with("# A krew plugin manifest") && text.contains("PLACEHOLDER"));
}

/// `ip-webhook plugin install` (docs/install.md): with no --dir the link goes next to the
/// binary (as after `cargo install`, in a directory on PATH), and real kubectl's plugin
/// discovery then lists and runs it.
#[test]
fn plugin_install_puts_kubectl_ipw_where_kubectl_finds_it() {
    // The binary in a directory of its own, as `cargo install` leaves it (a hard link where
    // the filesystem allows, so nothing large is copied).
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let bin = root.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let binary = bin.join("ip-webhook");
    let built = env!("CARGO_BIN_EXE_ip-webhook");
    if std::fs::hard_link(built, &binary).is_err() {
        std::fs::copy(built, &binary).unwrap();
    }
    let in_shell = |program: &Path, args: &[&str]| run(program, args, &bin);

    let (code, out, err) = in_shell(&binary, &["plugin", "install"]);
    assert_eq!(code, 0, "{out}{err}");
    let link = bin.join("kubectl-ipw");
    assert!(
        out.contains(&format!("installed {}", link.display())),
        "{out}"
    );
    assert!(out.contains("kubectl ipw --help runs it"), "{out}");
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        binary.canonicalize().unwrap()
    );
    // Again: nothing to do, and still success.
    let (code, out, _) = in_shell(&binary, &["plugin", "install"]);
    assert_eq!(code, 0);
    assert!(out.contains("is already"), "{out}");
    // Another file of that name is not replaced without --force, and the refusal names it.
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::write(elsewhere.path().join("kubectl-ipw"), "#!/bin/sh\n").unwrap();
    let dir = elsewhere.path().to_str().unwrap();
    let (code, _, err) = in_shell(&binary, &["plugin", "install", "--dir", dir]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(dir) && err.contains("--force"), "{err}");

    let kubectl = kubectl();
    let (code, out, err) = in_shell(&kubectl, &["plugin", "list"]);
    assert_eq!(code, 0, "kubectl plugin list:\n{out}{err}");
    assert!(out.contains(&link.display().to_string()), "{out}{err}");
    let (code, help, err) = in_shell(&kubectl, &["ipw", "--help"]);
    assert_eq!(code, 0, "kubectl ipw --help:\n{help}{err}");
    assert!(
        help.contains("Usage: kubectl ipw [OPTIONS] <COMMAND>"),
        "{help}"
    );
    // The install command itself is not shown to kubectl users.
    assert!(
        !help.lines().any(|l| l.trim_start().starts_with("plugin ")),
        "{help}"
    );
}
