//! The chart rendered with the real Helm (`.tools/helm`, from scripts/install-test-deps.sh) and
//! the documents it prints.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde::Deserialize;
use serde_json::Value;

pub const NAMESPACE: &str = "ip-webhook-system";
pub const RELEASE: &str = "ip-webhook";

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn chart_dir() -> PathBuf {
    repo().join("deploy/helm/ip-webhook")
}

/// A tool of scripts/install-test-deps.sh; the test fails without it (no test passes by
/// skipping).
pub fn tool(path: PathBuf) -> PathBuf {
    assert!(
        path.is_file(),
        "{} is missing: run scripts/install-test-deps.sh",
        path.display()
    );
    path
}

/// The real Helm binary.
pub fn helm() -> PathBuf {
    tool(repo().join(".tools/helm"))
}

/// A tool of the test venv (kubernetes-validate, actionlint).
pub fn venv_tool(name: &str) -> PathBuf {
    tool(repo().join(".tools/venv/bin").join(name))
}

pub fn run(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"))
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `helm template` of the chart with `--set` for each of `set`, as YAML text, or the
/// failure's stderr.
pub fn template_text(helm: &Path, set: &[&str], kube_version: &str) -> Result<String, String> {
    let mut command = Command::new(helm);
    command
        .arg("template")
        .arg(RELEASE)
        .arg(chart_dir())
        .args(["--namespace", NAMESPACE, "--include-crds"])
        .args(["--kube-version", kube_version]);
    for s in set {
        command.args(["--set", s]);
    }
    let output = run(&mut command);
    if output.status.success() {
        Ok(text(&output.stdout))
    } else {
        Err(text(&output.stderr))
    }
}

/// The documents of a multi-document YAML text, empty ones left out.
pub fn parse_documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).expect("helm output is YAML"))
        .filter(|doc| !doc.is_null())
        .collect()
}

pub fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

pub fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(docs, kind);
    assert_eq!(found.len(), 1, "expected one {kind}, got {}", found.len());
    found[0]
}

/// `kubernetes-validate --strict` of `files` for Kubernetes `kube_version`: its report; the
/// test fails, with the report, unless every file passes.
pub fn kubernetes_validate(files: &[PathBuf], kube_version: &str) -> String {
    let output = run(Command::new(venv_tool("kubernetes-validate"))
        .args(["--strict", "-k", kube_version])
        .args(files));
    let report = text(&output.stdout);
    assert!(
        output.status.success(),
        "kubernetes-validate --strict -k {kube_version} failed:\n{report}{}",
        text(&output.stderr)
    );
    report
}
