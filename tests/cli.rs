//! The `review` and `crds` commands run the same code as the server, offline.

mod common;

use common::{Ran, ip_webhook};

use std::process::Command;

use serde_json::Value;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/pod-create-v1.json"
);

#[test]
fn review_dry_run_answers_without_recording() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().to_str().unwrap();
    for _ in 0..2 {
        let Ran {
            ok, stdout, stderr, ..
        } = ip_webhook(&["review", "--dry-run", "--state-dir", dir, FIXTURE]);
        assert!(ok, "{stderr}");
        let review: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(review["response"]["allowed"], true);
        assert_eq!(review["response"]["patchType"], "JSONPatch");
    }
    // a real review records the claim, so the same review (same uid) gets the same answer and
    // a validate of a pod that writes that IP by hand is refused
    let Ran {
        ok, stdout: first, ..
    } = ip_webhook(&["review", "--state-dir", dir, FIXTURE]);
    assert!(ok);
    let Ran {
        ok, stdout: again, ..
    } = ip_webhook(&["review", "--state-dir", dir, FIXTURE]);
    assert!(ok);
    assert_eq!(first, again);
    let conflicting = std::fs::read_to_string(FIXTURE).unwrap().replace(
        "\"ip-webhook.io/allocatable-ips\"",
        "\"cni.projectcalico.org/ipAddrs\": \"[\\\"10.0.0.10\\\"]\", \"ip-webhook.io/allocatable-ips\"",
    );
    let file = state.path().join("conflict.json");
    std::fs::write(&file, conflicting).unwrap();
    let Ran {
        ok, stdout, stderr, ..
    } = ip_webhook(&[
        "review",
        "--validate",
        "--state-dir",
        dir,
        file.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let review: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(review["response"]["allowed"], false);
    assert!(
        review["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("static IP 10.0.0.10 requested by default/web-7d4b9c8f6d-* is already held by default/web-7d4b9c8f6d-*"),
        "{stdout}"
    );
}

/// `review` prints the response review and nothing else; `-v` adds the decision line `serve`
/// logs (a dry run's is at debug there) and the patch decoded, as `jq -r .response.patch |
/// base64 -d` shows it.
#[test]
fn review_dry_run_shows_the_decision_and_the_patch_at_v() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().to_str().unwrap();
    let quiet = ip_webhook(&["review", "--dry-run", "--state-dir", dir, FIXTURE]);
    assert!(quiet.ok, "{}", quiet.stderr);
    assert_eq!(quiet.stderr, "");
    let verbose = ip_webhook(&["review", "--dry-run", "-v", "--state-dir", dir, FIXTURE]);
    assert!(verbose.ok, "{}", verbose.stderr);
    let decision = verbose
        .stderr
        .lines()
        .find(|line| line.contains("admission decision"))
        .unwrap_or_else(|| panic!("no decision line at -v:\n{}", verbose.stderr));
    for field in [
        r#"ip="10.0.0.10""#,
        r#"outcome="allowed""#,
        "dry_run=true",
        r#"app="default/web""#,
    ] {
        assert!(decision.contains(field), "{field} not in {decision}");
    }
    // the same answer on stdout (each run's claim token differs)
    let review: Value = serde_json::from_str(&verbose.stdout).unwrap();
    let quiet: Value = serde_json::from_str(&quiet.stdout).unwrap();
    assert_eq!(review["response"]["allowed"], quiet["response"]["allowed"]);
    use base64::Engine;
    let patch = base64::engine::general_purpose::STANDARD
        .decode(review["response"]["patch"].as_str().unwrap())
        .unwrap();
    let patch = String::from_utf8(patch).unwrap();
    assert!(patch.contains("cni.projectcalico.org~1ipAddrs"), "{patch}");
    assert!(
        verbose
            .stderr
            .lines()
            .any(|line| line.ends_with(&format!("the response's JSON Patch, decoded: {patch}"))),
        "{}",
        verbose.stderr
    );
    // -vv: every debug line too, the decision among them
    let debug = ip_webhook(&["review", "--dry-run", "-vv", "--state-dir", dir, FIXTURE]);
    assert!(
        debug.stderr.contains("admission decision"),
        "{}",
        debug.stderr
    );
}

#[test]
fn review_of_garbage_fails_with_the_reason() {
    let state = tempfile::tempdir().unwrap();
    let file = state.path().join("bad.json");
    std::fs::write(&file, "{\"kind\":\"Pod\"}").unwrap();
    let Ran { ok, stderr, .. } = ip_webhook(&[
        "review",
        "--state-dir",
        state.path().to_str().unwrap(),
        file.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("HTTP 400: apiVersion \"\" is not supported"),
        "{stderr}"
    );
}

#[test]
fn crds_command_prints_both_crds() {
    let Ran { ok, stdout, .. } = ip_webhook(&["crds"]);
    assert!(ok);
    assert_eq!(stdout, ip_webhook_ledger::crd::crds_yaml());
}

/// The bash completion script completes the commands and a command's flags, as bash itself
/// runs it (the function it registers, with the words typed so far).
#[test]
fn completion_bash_completes_commands_and_flags() {
    let Ran {
        ok, stdout, stderr, ..
    } = ip_webhook(&["completion", "bash"]);
    assert!(ok, "{stderr}");
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("ip-webhook.bash");
    std::fs::write(&script, &stdout).unwrap();
    // what bash offers after `ip-webhook <words…>`, the last word being completed
    let offered = |words: &str| -> Vec<String> {
        // bash calls the registered function with the command, the word being completed and
        // the word before it (bash(1), "Programmable Completion")
        let program = format!(
            r#"source {script}
COMP_WORDS=(ip-webhook {words})
COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))
COMP_LINE="ip-webhook {words}"
COMP_POINT=${{#COMP_LINE}}
function=$(complete -p ip-webhook | sed -E 's/.*-F ([^ ]+).*/\1/')
"$function" ip-webhook "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
printf '%s\n' "${{COMPREPLY[@]}}""#,
            script = script.display()
        );
        let out = Command::new("bash")
            .args(["-c", &program])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let commands = offered("st");
    assert!(commands.contains(&"status".to_string()), "{commands:?}");
    assert!(
        !commands.contains(&"serve".to_string()),
        "only words that start with st: {commands:?}"
    );
    let flags = offered("status --state");
    assert_eq!(flags, ["--state-dir"], "status's flags");
    let Ran { ok, stderr, .. } = ip_webhook(&["completion", "tcsh"]);
    assert!(!ok && stderr.contains("possible values: bash"), "{stderr}");
}

/// `--listen :PORT` as Go programs take it, and Go durations in the flags; the serving process
/// runs with transparent huge pages off.
#[test]
fn serve_takes_a_port_only_listen_and_go_durations() {
    use std::io::{BufRead, BufReader, Read, Write};
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (https, admin) = (free(), free());
    let state = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ip-webhook"))
        .args(["serve", "--listen", &format!(":{https}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .args(["--read-timeout", "1m30s", "--shutdown-grace", "1.5s"])
        .args(["--tls-reload-interval", "500ms", "--ledger", "embedded"])
        .args(["--state-dir", state.path().to_str().unwrap()])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(
        first.starts_with(&format!(
            "ip-webhook serving https://0.0.0.0:{https} (admin http://127.0.0.1:{admin})"
        )),
        "{first}"
    );
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", admin)).unwrap();
    write!(stream, "GET /readyz HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    assert!(
        reply.starts_with("HTTP/1.0 200") || reply.starts_with("HTTP/1.1 200"),
        "{reply}"
    );
    assert!(std::net::TcpStream::connect(("127.0.0.1", https)).is_ok());
    // the server keeps its heap off transparent huge pages
    #[cfg(target_os = "linux")]
    {
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
        assert!(
            status.lines().any(|line| line == "THP_enabled:\t0"),
            "transparent huge pages still enabled:\n{status}"
        );
    }
    let _ = child.kill();
    let _ = child.wait();

    let Ran { ok, stderr, .. } = ip_webhook(&["serve", "--read-timeout", "1m30"]);
    assert!(!ok);
    assert!(
        stderr.contains(
            "\"1m30\" is not a duration like 500ms, 10s, 1m30s, 1.5s or 2h: 30 has no unit"
        ),
        "{stderr}"
    );
}

/// A busy port: one line naming the address, and no self-signed CA written into the fresh
/// state dir (the listeners are bound first).
#[test]
fn serve_on_a_busy_port_names_it_and_writes_no_ca() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap();
    let state = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ip-webhook"))
        .args(["serve", "--listen", &addr.to_string()])
        .args(["--admin-listen", "127.0.0.1:0", "--ledger", "embedded"])
        .args(["--state-dir", state.path().to_str().unwrap()])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr,
        format!(
            "Error: cannot listen on {addr} (the HTTPS listener): the address is in use (another process listens there; stop it or choose another address)\n"
        )
    );
    assert!(!state.path().join("ca.crt").exists());
    assert!(!state.path().join("tls.crt").exists());
}

/// A prefix etcd users would not mean (a leading space, a tab, a non-ASCII letter) is its own
/// key space: two replicas given different spellings would hand one IP out twice. Refused
/// before anything starts, naming the character.
#[test]
fn serve_refuses_an_etcd_prefix_with_characters_no_key_space_means() {
    for (prefix, shown) in [
        (" /ipw", "' ' at byte 0"),
        ("/ipw\t", "'\\t' at byte 4"),
        ("/ipwé/", "'é' at byte 4"),
    ] {
        let Ran { ok, stderr, .. } =
            ip_webhook(&["serve", "--ledger", "etcd", "--etcd-prefix", prefix]);
        assert!(!ok, "{prefix:?} accepted");
        assert!(
            stderr.contains("--etcd-prefix") && stderr.contains(shown),
            "{prefix:?}: {stderr}"
        );
        assert!(
            stderr.contains("letters, digits and / . _ - : only"),
            "{stderr}"
        );
    }
}

/// `review --dry-run` decides over exactly what a live server holds: it reads the server's
/// journal as `status` does (the server keeps its lock). With 10.0.0.10 Bound through the
/// server, the README's review is not offered 10.0.0.10 (the server's own dry run offers the
/// same IP), and `review --validate --dry-run` denies a static 10.0.0.10 with the server's
/// words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_dry_run_sees_what_a_live_server_holds() {
    let server = common::TestServer::start_with(|_| {}).await;
    let dir = server.state_dir.path().to_str().unwrap().to_string();
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(FIXTURE).unwrap()).unwrap();
    // Bind 10.0.0.10 through the server: the README's /mutate, then the pod's /validate once
    // it has a name and a UID.
    let mutated = server.mutate(&fixture).await;
    assert_eq!(common::allocated_ip(&mutated), "10.0.0.10");
    let mut pod = common::apply(&fixture["request"]["object"], &mutated);
    pod["metadata"]["name"] = "web-7d4b9c8f6d-abcde".into();
    pod["metadata"]["uid"] = "0b6f3c1e-2d4a-4e5f-9a8b-7c6d5e4f3a21".into();
    let bound = server.validate(&common::create("u-bind", pod)).await;
    assert_eq!(bound["allowed"], true, "{bound}");
    let Ran {
        ok,
        stdout: json,
        stderr,
        ..
    } = ip_webhook(&["status", "--state-dir", &dir, "-o", "json"]);
    assert!(ok, "{stderr}");
    assert!(
        json.contains("\"phase\": \"Bound\"") && json.contains("10.0.0.10"),
        "{json}"
    );

    let Ran {
        ok, stdout, stderr, ..
    } = ip_webhook(&["review", "--dry-run", "--state-dir", &dir, FIXTURE]);
    assert!(ok, "{stderr}");
    let offline: Value = serde_json::from_str(&stdout).unwrap();
    let offered = common::allocated_ip(&offline["response"]);
    assert_ne!(offered, "10.0.0.10", "{stdout}");
    let mut dry_run = fixture.clone();
    dry_run["request"]["dryRun"] = true.into();
    let live = server.mutate(&dry_run).await;
    assert_eq!(offered, common::allocated_ip(&live));

    let mut conflicting = fixture.clone();
    conflicting["request"]["uid"] = "u-static".into();
    conflicting["request"]["object"]["metadata"]["annotations"]["cni.projectcalico.org/ipAddrs"] =
        "[\"10.0.0.10\"]".into();
    let file = server.state_dir.path().join("static.json");
    std::fs::write(&file, conflicting.to_string()).unwrap();
    let Ran {
        ok, stdout, stderr, ..
    } = ip_webhook(&[
        "review",
        "--validate",
        "--dry-run",
        "--state-dir",
        &dir,
        file.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let offline: Value = serde_json::from_str(&stdout).unwrap();
    conflicting["request"]["dryRun"] = true.into();
    let live = server.validate(&conflicting).await;
    assert_eq!(live["allowed"], false, "{live}");
    assert_eq!(offline["response"]["allowed"], false, "{stdout}");
    assert_eq!(offline["response"]["status"], live["status"]);
    assert!(
        common::message(&live).contains("static IP 10.0.0.10")
            && common::message(&live).contains("default/web-7d4b9c8f6d-abcde"),
        "{live}"
    );
    server.launched.shutdown().await;
}

/// The README's table of `serve`'s flags has a row for each flag `serve` takes.
#[test]
fn the_readme_lists_every_serve_flag() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let table = readme
        .split("## Configuration (`ip-webhook serve`)")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("the README's Configuration section");
    let first_cells: Vec<&str> = table
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .map(|line| line.split(" | ").next().unwrap_or(""))
        .collect();
    let cli = ip_webhook::cli::command(false);
    let serve = cli.find_subcommand("serve").unwrap();
    let missing: Vec<String> = serve
        .get_arguments()
        .filter(|arg| !arg.is_hide_set())
        .filter_map(|arg| arg.get_long())
        .filter(|long| !["help", "version"].contains(long))
        .filter(|long| {
            !first_cells
                .iter()
                .any(|cell| format!("`{cell}").contains(&format!("`--{long}")))
        })
        .map(|long| format!("--{long}"))
        .collect();
    assert!(
        missing.is_empty(),
        "the README's flag table lacks {missing:?}"
    );
}
