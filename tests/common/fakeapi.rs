//! `fakeapi.py` (`<repo>/../shared/tools/fakeapi.py`, as `tests/in_cluster.rs` runs it) for the
//! operator-command tests: a running fake API server and a kubeconfig that points at it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct FakeApi {
    child: Child,
    pub port: u16,
    dir: tempfile::TempDir,
}

/// A kubeconfig for `http://127.0.0.1:PORT` per context; the first is the current one.
pub fn kubeconfig_yaml(contexts: &[(&str, u16)]) -> String {
    let mut clusters = String::new();
    let mut named = String::new();
    for (name, port) in contexts {
        clusters.push_str(&format!(
            "- name: {name}\n  cluster:\n    server: http://127.0.0.1:{port}\n"
        ));
        named.push_str(&format!(
            "- name: {name}\n  context:\n    cluster: {name}\n    user: fake\n"
        ));
    }
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n{clusters}contexts:\n{named}current-context: {}\n\
         users:\n- name: fake\n  user: {{}}\n",
        contexts[0].0
    )
}

/// A loopback port nothing listens on.
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

impl FakeApi {
    /// `None` (after printing why) when fakeapi.py or python3 is not there, as in
    /// `tests/in_cluster.rs`.
    pub fn start() -> Option<FakeApi> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/tools/fakeapi.py");
        if !script.exists() {
            println!(
                "SKIP: {} not found; these tests need the shared fakeapi.py",
                script.display()
            );
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = match Command::new("python3")
            .arg(&script)
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(child) => child,
            Err(error) => {
                println!("SKIP: cannot run python3 ({error})");
                return None;
            }
        };
        let fake = FakeApi {
            child,
            port,
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::write(fake.kubeconfig(), kubeconfig_yaml(&[("fake", port)])).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !fake.answers() {
            assert!(
                Instant::now() < deadline,
                "fakeapi.py did not start on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(fake)
    }

    fn answers(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = write!(stream, "GET /version HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        let mut reply = String::new();
        stream.read_to_string(&mut reply).is_ok() && reply.contains(" 200 ")
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    pub async fn client(&self) -> kube::Client {
        let file = kube::config::Kubeconfig::read_from(self.kubeconfig()).unwrap();
        let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
