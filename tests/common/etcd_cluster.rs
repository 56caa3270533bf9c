//! Real etcd members on loopback for tests: each in its own temp dir, on free ports.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The etcd binary (`$ETCD_BIN` or `etcd` on PATH). A test that needs etcd fails without
/// it, saying what to install: no test passes by skipping.
pub fn etcd_binary(test: &str) -> PathBuf {
    let candidate = std::env::var_os("ETCD_BIN").map(PathBuf::from).or_else(|| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("etcd"))
                .find(|path| path.is_file())
        })
    });
    candidate.unwrap_or_else(|| {
        panic!(
            "{test} needs etcd: no etcd binary on PATH or in $ETCD_BIN (install Debian etcd-server, as scripts/install-test-deps.sh does)"
        )
    })
}

use super::ports::listen_port;

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// PEM files for etcd's client port: its certificate and key, and the CA clients must present
/// certificates from (`--client-cert-auth`).
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

/// A cluster of `n` etcd members started with `--initial-cluster-state new`.
pub struct EtcdCluster {
    binary: PathBuf,
    tls: Option<ServerTls>,
    dir: tempfile::TempDir,
    initial_cluster: String,
    token: String,
    members: Vec<Member>,
}

impl EtcdCluster {
    pub fn start(binary: &Path, size: usize) -> EtcdCluster {
        EtcdCluster::start_with(binary, size, None)
    }

    /// A cluster whose client URLs are https and require client certificates.
    pub fn start_with(binary: &Path, size: usize, tls: Option<ServerTls>) -> EtcdCluster {
        let dir = tempfile::tempdir().unwrap();
        let members: Vec<Member> = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: listen_port(),
                peer_port: listen_port(),
                data_dir: dir.path().join(format!("m{i}")),
                log: dir.path().join(format!("m{i}.log")),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            binary: binary.to_path_buf(),
            tls,
            token: format!(
                "t{}-{}",
                std::process::id(),
                dir.path().file_name().unwrap().to_string_lossy()
            ),
            dir,
            initial_cluster,
            members,
        };
        for i in 0..size {
            cluster.spawn(i);
        }
        cluster.wait_healthy(Duration::from_secs(60));
        cluster
    }

    fn spawn(&mut self, i: usize) {
        let member = &self.members[i];
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{}", member.client_port);
        let peer_url = format!("http://127.0.0.1:{}", member.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&member.log)
            .unwrap();
        let mut command = Command::new(&self.binary);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .arg("--trusted-ca-file")
                .arg(&tls.client_ca)
                .arg("--client-cert-auth");
        }
        let child = command
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(&member.data_dir)
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.token])
            // a loaded 2-core CI machine: be patient before calling an election
            .args(["--heartbeat-interval", "100", "--election-timeout", "2000"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("etcd starts");
        self.members[i].child = Some(child);
    }

    pub fn endpoints(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.members
            .iter()
            .map(|m| format!("{scheme}://127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// `--etcd-endpoints` value.
    pub fn endpoints_flag(&self) -> String {
        self.endpoints().join(",")
    }

    fn healthy(&self, i: usize) -> bool {
        let member = &self.members[i];
        if self.tls.is_some() {
            // the client port speaks TLS only: a leader shows in the member's log
            return std::fs::read_to_string(&member.log)
                .is_ok_and(|log| log.contains("became leader") || log.contains("elected leader"));
        }
        let Ok(mut stream) = std::net::TcpStream::connect_timeout(
            &format!("127.0.0.1:{}", member.client_port).parse().unwrap(),
            Duration::from_millis(500),
        ) else {
            return false;
        };
        use std::io::{Read, Write};
        let _ = stream.set_read_timeout(Some(Duration::from_secs(3)));
        if stream
            .write_all(b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut reply = String::new();
        let _ = stream.read_to_string(&mut reply);
        reply.contains("\"health\":\"true\"")
    }

    /// Wait until every running member reports healthy (a leader exists).
    pub fn wait_healthy(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        for i in 0..self.members.len() {
            if self.members[i].child.is_none() {
                continue;
            }
            while !self.healthy(i) {
                if Instant::now() > deadline {
                    panic!(
                        "etcd member {i} not healthy after {timeout:?}; log:\n{}",
                        self.log_tail(i)
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    pub fn log_tail(&self, i: usize) -> String {
        let log = std::fs::read_to_string(&self.members[i].log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// SIGKILL member `i` (its data dir stays).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start member `i` again on its data dir.
    pub fn restart(&mut self, i: usize) {
        assert!(self.members[i].child.is_none(), "member {i} is running");
        self.spawn(i);
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
