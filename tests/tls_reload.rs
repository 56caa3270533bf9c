//! A certificate swapped on disk the way a Secret volume swaps it (a `..data` symlink) is
//! served without a restart; a broken new pair leaves the old certificate serving.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use ip_webhook::server::certs::self_signed;

fn write_generation(dir: &Path, name: &str, cert: &str, key: &str) {
    let generation = dir.join(name);
    std::fs::create_dir_all(&generation).unwrap();
    std::fs::write(generation.join("tls.crt"), cert).unwrap();
    std::fs::write(generation.join("tls.key"), key).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(name, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap(); // atomic swap, as kubelet does
}

async fn handshakes(client: &HttpsClient) -> bool {
    client
        .post("/mutate", "{}")
        .await
        .is_ok_and(|reply| reply.status == 400)
}

#[tokio::test]
async fn swapped_certificate_is_served_without_restart() {
    let secret = tempfile::tempdir().unwrap();
    let first = self_signed(&[]).unwrap();
    write_generation(
        secret.path(),
        "..2026_11_29_01",
        &first.cert_pem,
        &first.key_pem,
    );
    std::os::unix::fs::symlink("..data/tls.crt", secret.path().join("tls.crt")).unwrap();
    std::os::unix::fs::symlink("..data/tls.key", secret.path().join("tls.key")).unwrap();
    let cert = secret.path().join("tls.crt");
    let key = secret.path().join("tls.key");
    let state = tempfile::tempdir().unwrap();
    let config = with_cert_files(state.path(), &cert, &key, Duration::from_secs(30));
    let launched = ip_webhook::app::launch(&config).await.unwrap();
    let addr = launched.running.https_addr;
    let old_client = HttpsClient::new(addr, first.ca_pem.as_bytes());
    assert!(handshakes(&old_client).await);

    // a broken pair (cert of one CA, key of another) is refused; the old one keeps serving
    let second = self_signed(&[]).unwrap();
    let third = self_signed(&[]).unwrap();
    write_generation(
        secret.path(),
        "..2026_11_29_02",
        &second.cert_pem,
        &third.key_pem,
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        handshakes(&old_client).await,
        "a bad pair replaced the good certificate"
    );
    let failures = launched
        .webhook
        .metrics
        .tls_reloads
        .get_or_create(&ip_webhook::metrics::ResultLabels { result: "failure" })
        .get();
    assert!(failures >= 1, "the bad pair was not noticed");

    // a good pair is served well before the 30 s poll: the directory watch saw the swap
    write_generation(
        secret.path(),
        "..2026_11_29_03",
        &second.cert_pem,
        &second.key_pem,
    );
    let new_client = HttpsClient::new(addr, second.ca_pem.as_bytes());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !handshakes(&new_client).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "new certificate not served within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !handshakes(&old_client).await,
        "the old CA still validates the served certificate"
    );
    launched.shutdown().await;
}

fn reloads(launched: &ip_webhook::app::Launched, result: &'static str) -> u64 {
    launched
        .webhook
        .metrics
        .tls_reloads
        .get_or_create(&ip_webhook::metrics::ResultLabels { result })
        .get()
}

/// Plain files with a 1 s poll: our own reads do not trigger more reads (the finding was 60
/// reads in 3 s, forever), and a broken pair is counted (and logged) once per change, not
/// at every event or poll.
#[tokio::test]
async fn reload_checks_are_bounded_and_a_broken_pair_is_reported_once() {
    let dir = tempfile::tempdir().unwrap();
    let pair = self_signed(&[]).unwrap();
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    std::fs::write(&cert, &pair.cert_pem).unwrap();
    std::fs::write(&key, &pair.key_pem).unwrap();
    let state = tempfile::tempdir().unwrap();
    let config = with_cert_files(state.path(), &cert, &key, Duration::from_secs(1));
    let launched = ip_webhook::app::launch(&config).await.unwrap();
    let client = HttpsClient::new(launched.running.https_addr, pair.ca_pem.as_bytes());
    assert!(handshakes(&client).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let checks = launched.webhook.metrics.tls_checks.get();
    assert!(
        (1..=5).contains(&checks),
        "{checks} reads of unchanged files in 3 s at a 1 s poll"
    );
    assert_eq!(reloads(&launched, "success"), 0);
    assert_eq!(reloads(&launched, "failure"), 0);

    // a broken key: reported once over several polls and file events
    std::fs::write(&key, "not a key").unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(reloads(&launched, "failure"), 1, "one report per change");
    assert!(
        handshakes(&client).await,
        "the old certificate keeps serving"
    );
    let checks = launched.webhook.metrics.tls_checks.get();
    assert!(checks <= 12, "{checks} reads in 6 s at a 1 s poll");

    // the good key back: one success
    std::fs::write(&key, &pair.key_pem).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(reloads(&launched, "success"), 1);
    assert_eq!(reloads(&launched, "failure"), 1);
    launched.shutdown().await;
}
