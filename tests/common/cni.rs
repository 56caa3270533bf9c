//! The real readers of what ip-webhook writes for a secondary network: the `static` IPAM
//! plugin of containernetworking/plugins (Debian's `containernetworking-plugins`, installed by
//! scripts/install-test-deps.sh), run as a container runtime runs it, and asked which
//! addresses it would configure.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

/// Where Debian's `containernetworking-plugins` puts the plugins (`dpkg -L
/// containernetworking-plugins`), or `CNI_PLUGIN_DIR`.
pub fn plugin_dir() -> PathBuf {
    let dir = std::env::var_os("CNI_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/cni"));
    assert!(
        dir.join("static").is_file(),
        "the CNI `static` IPAM plugin is not at {}: install Debian's containernetworking-plugins \
         (scripts/install-test-deps.sh does), or set CNI_PLUGIN_DIR to where `static` is",
        dir.display()
    );
    dir
}

/// What the `static` IPAM plugin configures for the `ips` Multus passes it in
/// `runtimeConfig` (an attachment with `capabilities: {ips: true}`): each address as
/// `ip/prefix`, or the plugin's refusal. `CNI_COMMAND=ADD` with a network namespace that does
/// not exist: an IPAM plugin only answers with addresses, it configures nothing itself.
pub fn static_ipam(ips: &[&str]) -> Result<Vec<String>, String> {
    let dir = plugin_dir();
    let config = json!({
        "cniVersion": "0.3.1", "name": "storage", "type": "macvlan",
        "ipam": {"type": "static"}, "runtimeConfig": {"ips": ips},
    });
    let mut child = Command::new(dir.join("static"))
        .env_clear()
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", "ip-webhook-test")
        .env("CNI_NETNS", "/nonexistent/netns")
        .env("CNI_IFNAME", "net1")
        .env("CNI_PATH", &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running the static IPAM plugin");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(config.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the static plugin's answer is not JSON ({e}): {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    if !out.status.success() {
        return Err(answer["msg"].as_str().unwrap_or_default().to_string());
    }
    Ok(answer["ips"]
        .as_array()
        .expect("the static plugin's result lists its IPs")
        .iter()
        .map(|ip| ip["address"].as_str().unwrap().to_string())
        .collect())
}

/// Assert that the `static` IPAM, given the `ips` entries `written` as Multus passes them,
/// configures exactly `read` (each `ip/prefix`, in order): what ip-webhook reads of an entry,
/// or writes, is what the pod gets.
pub fn assert_static_configures(written: &[&str], read: &[String]) {
    let configured = static_ipam(written)
        .unwrap_or_else(|refusal| panic!("the static IPAM refuses {written:?}: {refusal}"));
    assert_eq!(
        configured, read,
        "the static IPAM configures other addresses from {written:?} than ip-webhook reads"
    );
}
