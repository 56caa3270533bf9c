//! TLS in operation: certificate rotation by a Secret-volume symlink swap under constant
//! traffic, old protocol versions refused, and a client that dribbles its head cut off.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::with_cert_files;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use ip_webhook::app;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const FIXTURE: &str = include_str!("fixtures/pod-create-v1.json");

/// A directory laid out like a mounted Secret: `tls.crt -> ..data/tls.crt`,
/// `..data -> ..<timestamp>`; `publish` swaps `..data` atomically, as the kubelet does.
struct SecretVolume {
    dir: tempfile::TempDir,
    generation: usize,
}

impl SecretVolume {
    fn new(cert: &str, key: &str) -> SecretVolume {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("..data/tls.crt", dir.path().join("tls.crt")).unwrap();
        std::os::unix::fs::symlink("..data/tls.key", dir.path().join("tls.key")).unwrap();
        let mut volume = SecretVolume { dir, generation: 0 };
        volume.publish(cert, key);
        volume
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn publish(&mut self, cert: &str, key: &str) {
        self.generation += 1;
        let name = format!(
            "..2026_11_29_00_00_0{}.000000{}",
            self.generation, self.generation
        );
        let data = self.path().join(&name);
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("tls.crt"), cert).unwrap();
        std::fs::write(data.join("tls.key"), key).unwrap();
        let tmp = self.path().join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp).unwrap();
        let old = std::fs::read_link(self.path().join("..data")).ok();
        std::fs::rename(&tmp, self.path().join("..data")).unwrap();
        if let Some(old) = old {
            std::fs::remove_dir_all(self.path().join(old)).unwrap();
        }
    }
}

fn leaf_der(pem: &str) -> Vec<u8> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

/// One review on a fresh connection; returns the certificate the server presented.
async fn review_once(
    addr: std::net::SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> Result<Vec<u8>, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let served = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let response = sender
        .send_request(
            hyper::Request::post("/mutate")
                .header("host", "localhost")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(FIXTURE.as_bytes())))
                .unwrap(),
        )
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if status != 200 {
        return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)));
    }
    Ok(served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlink_swap_rotation_drops_nothing_and_serves_the_new_cert_within_the_poll_period() {
    const POLL: Duration = Duration::from_secs(2);
    let first = ip_webhook::server::certs::self_signed(&[]).unwrap();
    let second = ip_webhook::server::certs::self_signed(&[]).unwrap();
    let mut volume = SecretVolume::new(&first.cert_pem, &first.key_pem);
    let state = tempfile::tempdir().unwrap();
    let cert = volume.path().join("tls.crt");
    let key = volume.path().join("tls.key");
    let launched = app::launch(&with_cert_files(state.path(), &cert, &key, POLL))
        .await
        .unwrap();
    let addr = launched.running.https_addr;
    // both CAs, so the client accepts the certificate before and after the swap
    let config = common::client_config(format!("{}{}", first.ca_pem, second.ca_pem).as_bytes());
    let (old_leaf, new_leaf) = (leaf_der(&first.cert_pem), leaf_der(&second.cert_pem));

    // a connection opened before the swap keeps working after it
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(config.clone())
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (mut kept, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(connection);

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let mut senders = Vec::new();
    for _ in 0..4 {
        let (stop, sent, config) = (stop.clone(), sent.clone(), config.clone());
        senders.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                match review_once(addr, config.clone()).await {
                    Ok(served) => seen.push((Instant::now(), served)),
                    Err(error) => failures.push(error),
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
            (failures, seen)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let swapped_at = Instant::now();
    volume.publish(&second.cert_pem, &second.key_pem);
    let mut served_new_after = None;
    while swapped_at.elapsed() < POLL * 2 {
        if review_once(addr, config.clone()).await.unwrap() == new_leaf {
            served_new_after = Some(swapped_at.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    let mut old_after = 0;
    for sender in senders {
        let (f, seen) = sender.await.unwrap();
        failures.extend(f);
        let cutoff = swapped_at + served_new_after.unwrap_or(POLL * 2) + Duration::from_millis(100);
        old_after += seen
            .iter()
            .filter(|(at, leaf)| *at > cutoff && *leaf == old_leaf)
            .count();
    }
    let served_new_after = served_new_after.expect("the new certificate was never served");
    eprintln!(
        "{} requests during rotation; new certificate served {served_new_after:?} after the swap",
        sent.load(Ordering::Relaxed)
    );
    assert!(
        failures.is_empty(),
        "requests failed during rotation: {failures:?}"
    );
    assert!(
        served_new_after <= POLL,
        "new certificate served only after {served_new_after:?}"
    );
    assert_eq!(
        old_after, 0,
        "the old certificate was served after the new one"
    );
    assert!(sent.load(Ordering::Relaxed) > 20, "the client kept sending");
    let response = kept
        .send_request(
            hyper::Request::post("/mutate")
                .header("host", "localhost")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(FIXTURE.as_bytes())))
                .unwrap(),
        )
        .await
        .expect("the connection opened before the swap still works");
    assert_eq!(response.status(), 200);

    // a broken new pair (key of another cert) is refused; the current cert stays
    volume.publish(&first.cert_pem, &second.key_pem);
    tokio::time::sleep(POLL + Duration::from_millis(500)).await;
    assert_eq!(review_once(addr, config.clone()).await.unwrap(), new_leaf);
    launched.shutdown().await;
}

/// A ClientHello a TLS 1.0/1.1 (or, as a control, 1.2) client would send.
fn client_hello(version: [u8; 2]) -> Vec<u8> {
    fn u16be(v: usize) -> [u8; 2] {
        (v as u16).to_be_bytes()
    }
    let mut body = version.to_vec();
    body.extend([0x42; 32]);
    body.push(0);
    let suites: [u16; 10] = [
        0xc02b, 0xc02c, 0xcca9, 0xc02f, 0xc030, 0xcca8, 0xc013, 0xc014, 0x002f, 0x0035,
    ];
    body.extend(u16be(suites.len() * 2));
    for suite in suites {
        body.extend(suite.to_be_bytes());
    }
    body.extend([1, 0]);
    let mut ext = Vec::new();
    let host = b"localhost";
    ext.extend([0, 0]);
    ext.extend(u16be(host.len() + 5));
    ext.extend(u16be(host.len() + 3));
    ext.push(0);
    ext.extend(u16be(host.len()));
    ext.extend(host);
    ext.extend([0, 10, 0, 6, 0, 4, 0, 29, 0, 23]); // supported_groups: x25519, secp256r1
    ext.extend([0, 11, 0, 2, 1, 0]); // ec_point_formats: uncompressed
    ext.extend([0, 13, 0, 8, 0, 6, 4, 3, 8, 4, 4, 1]); // signature_algorithms
    body.extend(u16be(ext.len()));
    body.extend(ext);
    let mut handshake = vec![1];
    handshake.extend(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend(body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend(u16be(handshake.len()));
    record.extend(handshake);
    record
}

async fn first_record(addr: std::net::SocketAddr, hello: &[u8]) -> Vec<u8> {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(hello).await.unwrap();
    let mut reply = vec![0u8; 7];
    tokio::time::timeout(Duration::from_secs(5), tcp.read_exact(&mut reply))
        .await
        .expect("the server answers the hello")
        .expect("a TLS record");
    reply
}

#[tokio::test]
async fn tls_1_0_and_1_1_clients_are_refused_with_a_protocol_version_alert() {
    let server = common::TestServer::start(&[]).await;
    let addr = server.launched.running.https_addr;
    // control: the same hello offering TLS 1.2 gets a ServerHello (handshake record)
    let control = first_record(addr, &client_hello([3, 3])).await;
    assert_eq!(
        control[0], 0x16,
        "a TLS 1.2 hello is answered with a handshake: {control:?}"
    );
    assert_eq!(control[5], 2, "ServerHello");
    for (name, version) in [("TLS 1.0", [3, 1]), ("TLS 1.1", [3, 2])] {
        let reply = first_record(addr, &client_hello(version)).await;
        assert_eq!(reply[0], 0x15, "{name}: an alert record, got {reply:?}");
        assert_eq!(
            &reply[5..7],
            &[2, 70],
            "{name}: fatal protocol_version alert"
        );
    }
    // and the server is still fine
    assert_eq!(
        server.mutate(&serde_json::from_str(FIXTURE).unwrap()).await["allowed"],
        true
    );
}

#[tokio::test]
async fn a_client_that_keeps_dribbling_its_head_is_cut_off_at_the_read_timeout() {
    let server =
        common::TestServer::start_with(|c| common::read_timeout(c, Duration::from_secs(1))).await;
    let tcp = tokio::net::TcpStream::connect(server.launched.running.https_addr)
        .await
        .unwrap();
    let tls = tokio_rustls::TlsConnector::from(server.client.config.clone())
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (mut reader, mut writer) = tokio::io::split(tls);
    let started = Instant::now();
    let head = b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let dribble = async {
        for byte in head.iter().cycle() {
            if writer.write_all(&[*byte]).await.is_err() || writer.flush().await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let mut sink = Vec::new();
    tokio::select! {
        _ = reader.read_to_end(&mut sink) => {}
        _ = dribble => {}
        _ = tokio::time::sleep(Duration::from_secs(10)) => panic!("a client sending one byte per 100 ms held the connection for 10 s"),
    }
    let held = started.elapsed();
    assert!(held < Duration::from_secs(4), "cut off only after {held:?}");
    assert_eq!(server.admin_get("/readyz").await.0, 200);
}
