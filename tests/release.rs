//! The release workflow (`.github/workflows/release.yml`), which no CI here can run (no
//! container engine): actionlint (`.tools/venv/bin/actionlint`, with shellcheck for the `run:`
//! scripts) passes it and still catches a broken copy; it publishes the image the chart pulls by
//! default, for both platforms, and an archive for each platform of the krew manifest; and its
//! version check, run here, passes for the crate's version and refuses another.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn workflow_path() -> PathBuf {
    repo().join(".github/workflows/release.yml")
}

fn workflow() -> Value {
    serde_yaml::from_str(&std::fs::read_to_string(workflow_path()).unwrap()).unwrap()
}

fn actionlint(files: &[PathBuf]) -> (bool, String) {
    let actionlint = repo().join(".tools/venv/bin/actionlint");
    assert!(
        actionlint.is_file(),
        "{} is missing: run scripts/install-test-deps.sh",
        actionlint.display()
    );
    let output = Command::new(&actionlint)
        .args(["-shellcheck", "shellcheck", "-no-color"])
        .args(files)
        .current_dir(repo())
        .output()
        .expect("running actionlint");
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

#[test]
fn actionlint_passes_every_workflow_and_catches_a_broken_one() {
    assert!(
        Command::new("shellcheck")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "shellcheck is missing: run scripts/install-test-deps.sh"
    );
    let workflows: Vec<PathBuf> = std::fs::read_dir(repo().join(".github/workflows"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yml" || e == "yaml"))
        .collect();
    assert!(workflows.contains(&workflow_path()), "{workflows:?}");
    let (ok, report) = actionlint(&workflows);
    assert!(ok, "actionlint:\n{report}");

    // The same file with a job that needs one that does not exist, and a run: script that
    // shellcheck refuses: both reported.
    let text = std::fs::read_to_string(workflow_path()).unwrap();
    let broken = text
        .replacen(
            "needs: [binaries, manifest]",
            "needs: [binaries, manifests]",
            1,
        )
        .replacen(
            "run: cargo build --profile dist",
            "run: cd $UNQUOTED_DIR && cargo build --profile dist",
            1,
        );
    assert_ne!(broken, text);
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("release.yml");
    std::fs::write(&copy, broken).unwrap();
    let (ok, report) = actionlint(&[copy]);
    assert!(!ok, "{report}");
    assert!(report.contains("manifests"), "{report}");
    assert!(report.contains("shellcheck"), "{report}");
}

#[test]
fn the_workflow_publishes_the_image_the_chart_pulls_for_both_platforms() {
    let workflow = workflow();
    let values: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("deploy/helm/ip-webhook/values.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        workflow["env"]["IMAGE_REGISTRY"],
        values["image"]["registry"]
    );
    assert_eq!(
        workflow["env"]["IMAGE_REPOSITORY"],
        values["image"]["repository"]
    );
    assert_eq!(
        values["image"]["tag"], "",
        "the chart's tag is its appVersion"
    );

    let jobs = &workflow["jobs"];
    let platforms: Vec<&str> = jobs["image"]["strategy"]["matrix"]["include"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["platform"].as_str().unwrap())
        .collect();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"]);
    let steps = jobs["image"]["steps"].as_array().unwrap();
    let build = steps
        .iter()
        .find(|s| {
            s["uses"]
                .as_str()
                .is_some_and(|u| u.starts_with("docker/build-push-action@"))
        })
        .expect("the image job builds the Dockerfile");
    assert_eq!(build["with"]["context"], ".");
    // The binaries are built as the Dockerfile builds the image's (profile, lock, features).
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let cargo = "cargo build --profile dist --locked --features etcd --bin ip-webhook";
    assert!(dockerfile.contains(cargo));
    let binaries = serde_json::to_string(&jobs["binaries"]).unwrap();
    assert!(binaries.contains(cargo), "{binaries}");
    // One archive for each platform of the krew manifest (deploy/krew/ipw.yaml).
    let krew: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("deploy/krew/ipw.yaml")).unwrap(),
    )
    .unwrap();
    let krew_platforms: Vec<String> = krew["spec"]["platforms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let labels = &p["selector"]["matchLabels"];
            format!(
                "{}-{}",
                labels["os"].as_str().unwrap(),
                labels["arch"].as_str().unwrap()
            )
        })
        .collect();
    let archives: Vec<String> = jobs["binaries"]["strategy"]["matrix"]["include"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["platform"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(archives, krew_platforms);
    // The manifest job tags the joined image with the version (no "v"), the chart's tag.
    let manifest = serde_json::to_string(&jobs["manifest"]).unwrap();
    assert!(
        manifest.contains(r#"imagetools create -t \"$image:$VERSION\""#),
        "{manifest}"
    );
}

/// The workflow's version check, run here as the runner runs it.
fn version_check(tag: &str) -> (bool, String) {
    let steps = workflow()["jobs"]["version"]["steps"].clone();
    let script = steps
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "check")
        .and_then(|s| s["run"].as_str())
        .expect("the version job's check step")
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let output_file = dir.path().join("output");
    let output = Command::new("bash")
        .args(["-e", "-c", &script])
        .current_dir(repo())
        .env("TAG", tag)
        .env("GITHUB_OUTPUT", &output_file)
        .output()
        .unwrap();
    let written = std::fs::read_to_string(&output_file).unwrap_or_default();
    (
        output.status.success(),
        format!("{written}{}", String::from_utf8_lossy(&output.stdout)),
    )
}

#[test]
fn the_version_check_passes_the_crate_version_and_refuses_another() {
    let version = env!("CARGO_PKG_VERSION");
    let chart = std::fs::read_to_string(repo().join("deploy/helm/ip-webhook/Chart.yaml")).unwrap();
    assert!(
        chart.contains(&format!("appVersion: \"{version}\"")),
        "{chart}"
    );
    let (ok, out) = version_check(&format!("v{version}"));
    assert!(ok, "{out}");
    assert_eq!(out, format!("version={version}\n"));
    let (ok, out) = version_check("v99.0.0");
    assert!(!ok, "{out}");
    assert!(out.contains("all three must agree"), "{out}");
}

/// The binaries users run stay small: `cargo install` and `cargo run --release` build the
/// `release` profile, the image and the release archives the `dist` one, and neither keeps
/// debug info (line tables alone made a 160 MB binary of a 25 MB one). CI builds neither (a
/// cold release build would take a third of its time), so this checks the settings, and the
/// release workflow measures the binary it ships with scripts/check-binary-size.sh, whose
/// verdict is checked here on files of known size.
#[test]
fn the_shipped_binaries_keep_no_debug_info_and_are_held_to_a_budget() {
    let manifest: toml_edit::DocumentMut = std::fs::read_to_string(repo().join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let profile = |name: &str| &manifest["profile"][name];
    let release = profile("release");
    assert_eq!(release["debug"].as_bool(), Some(false), "{release:?}");
    assert_eq!(release["strip"].as_str(), Some("debuginfo"), "{release:?}");
    let dist = profile("dist");
    assert_eq!(dist["inherits"].as_str(), Some("release"), "{dist:?}");
    for key in ["debug", "strip"] {
        assert!(dist.get(key).is_none(), "dist sets its own {key}: {dist:?}");
    }
    assert!(
        manifest["profile"]["release"]
            .as_table()
            .is_some_and(|t| !t.contains_key("package")),
        "a per-package release setting could bring debug info back"
    );

    // the workflow checks the dist binary it builds, before it is archived
    let steps = workflow()["jobs"]["binaries"]["steps"]
        .as_array()
        .unwrap()
        .clone();
    let runs: Vec<&str> = steps.iter().filter_map(|s| s["run"].as_str()).collect();
    let position = |needle: &str| {
        runs.iter()
            .position(|r| r.contains(needle))
            .unwrap_or_else(|| panic!("no step runs {needle}"))
    };
    let check = format!("scripts/check-binary-size.sh target/dist/ip-webhook {DIST_BUDGET_MIB}");
    assert!(position("cargo build --profile dist") < position(&check));
    assert!(position(&check) < position("tar czf"));

    // the check itself: at the budget passes, a byte over fails saying so
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("ip-webhook");
    let run = |size: u64| {
        let file = std::fs::File::create(&binary).unwrap();
        file.set_len(size).unwrap();
        let output = Command::new("bash")
            .arg(repo().join("scripts/check-binary-size.sh"))
            .arg(&binary)
            .arg(DIST_BUDGET_MIB.to_string())
            .output()
            .unwrap();
        (
            output.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        )
    };
    let budget = DIST_BUDGET_MIB << 20;
    let (ok, out) = run(budget);
    assert!(ok, "{out}");
    assert!(
        out.ends_with(&format!("within its budget of {DIST_BUDGET_MIB} MiB\n")),
        "{out}"
    );
    let (ok, out) = run(budget + 1);
    assert!(!ok, "{out}");
    assert!(
        out.contains(&format!("over its budget of {DIST_BUDGET_MIB} MiB")),
        "{out}"
    );
}

/// The dist binary's budget in MiB, in .github/workflows/release.yml: what it measured here
/// (x86-64, with the etcd ledger) plus room for growth.
const DIST_BUDGET_MIB: u64 = 32;
