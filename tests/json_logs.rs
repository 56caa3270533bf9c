//! `--log-format json`: every line the server writes is JSON, from the first one (the startup
//! lines included), so a log collector never meets a plain-text line.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

fn json_line(line: &str) -> Value {
    let value: Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"));
    assert!(value["timestamp"].is_string(), "{line}");
    assert!(value["level"].is_string(), "{line}");
    assert!(value["message"].is_string(), "{line}");
    value
}

#[test]
fn json_log_format_writes_json_from_the_first_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ip-webhook"))
        .args([
            "--log-format",
            "json",
            "serve",
            "--self-signed",
            "--ledger",
            "embedded",
        ])
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .arg("--state-dir")
        .arg(dir.path())
        .env("RUST_LOG", "info")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBECONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary starts");
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let mut serving = None;
    loop {
        let Ok(line) = received.recv_timeout(Duration::from_secs(30)) else {
            let _ = child.kill();
            panic!("no self-signed CA event within 30 s; stderr so far: {seen:#?}");
        };
        let value = json_line(&line);
        seen.push(line);
        if value["message"] == "self-signed CA written" {
            break;
        }
        if value["message"] == "ip-webhook serving" {
            serving = Some(value);
        }
    }
    let _ = child.kill();
    child.wait().unwrap();
    let serving = serving.unwrap_or_else(|| panic!("no serving event in {seen:#?}"));
    // The line carries what the plain-text format prints: where it listens, and the build.
    let fields = &serving;
    for field in ["https", "admin"] {
        let addr: std::net::SocketAddr = fields[field].as_str().unwrap().parse().unwrap();
        assert!(
            addr.ip().is_loopback() && addr.port() != 0,
            "{field}: {addr}"
        );
    }
    assert_eq!(fields["ledger"], "embedded");
    assert_eq!(fields["version"], env!("CARGO_PKG_VERSION"));
    assert!(fields["commit"].is_string());
    let ca = seen.last().map(|l| json_line(l)).unwrap();
    assert_eq!(ca["message"], "self-signed CA written");
    assert!(ca["ca_bundle"].as_str().unwrap().len() > 100);
    // Nothing in plain text on stdout either.
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert_eq!(stdout, "", "stdout under --log-format json");
}

#[test]
fn json_log_format_reports_a_failed_start_as_json_first() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_ip-webhook"))
        .args([
            "--log-format",
            "json",
            "serve",
            "--self-signed",
            "--ledger",
            "embedded",
        ])
        .args(["--listen", &address, "--admin-listen", "127.0.0.1:0"])
        .arg("--state-dir")
        .arg(dir.path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBECONFIG")
        .output()
        .expect("binary runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    // every log line is JSON (the self-signed CA's line included), and the failure is a JSON
    // ERROR naming the address before the process's closing `Error:` line
    let logged: Vec<&str> = stderr
        .lines()
        .take_while(|line| !line.starts_with("Error: "))
        .collect();
    let errors: Vec<Value> = logged
        .iter()
        .map(|line| json_line(line))
        .filter(|value| value["level"] == "ERROR")
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0]["error"].as_str().unwrap().contains(&address),
        "the error names the address: {stderr}"
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout), "");
}
