//! `--client-ca-file` and `--client-allowed-names`: only a client whose certificate chains to
//! the CA (and names an allowed CN or DNS SAN) is served; refusals are counted by reason; a
//! new CA file is picked up without a restart.

mod common;

use std::path::Path;
use std::time::Duration;

use common::client_ca::{ca, client_cert, client_cert_with, client_config};
use common::{HttpsClient, TestServer};
use rcgen::{DistinguishedName, DnType};
use rustls::pki_types::pem::PemObject;

const FIXTURE: &str = include_str!("fixtures/pod-create-v1.json");

fn client_with(server: &TestServer, cert: Option<&(String, String)>) -> HttpsClient {
    let ca = std::fs::read(server.state_dir.path().join("ca.crt")).unwrap();
    HttpsClient {
        addr: server.launched.running.https_addr,
        config: client_config(&ca, cert),
    }
}

/// `ip-webhook check` against `server`, presenting `cert` (PEM chain and key) when given: the
/// status and detail of its admission check.
async fn admission_check(server: &TestServer, cert: Option<&(String, String)>) -> (String, String) {
    let files = tempfile::tempdir().unwrap();
    let mut args = vec![
        "--url".to_string(),
        format!(
            "https://localhost:{}",
            server.launched.running.https_addr.port()
        ),
        "--ca-file".into(),
        server.state_dir.path().join("ca.crt").display().to_string(),
    ];
    if let Some((chain, key)) = cert {
        let (chain_file, key_file) = (files.path().join("tls.crt"), files.path().join("tls.key"));
        std::fs::write(&chain_file, chain).unwrap();
        std::fs::write(&key_file, key).unwrap();
        args.extend([
            "--client-cert-file".into(),
            chain_file.display().to_string(),
            "--client-key-file".into(),
            key_file.display().to_string(),
        ]);
    }
    let (checks, ran) = common::check(args).await;
    let admission = checks
        .into_iter()
        .find(|c| c.name == "admission")
        .unwrap_or_else(|| panic!("an admission check: {ran:?}"));
    (admission.status, admission.detail)
}

async fn served(client: &HttpsClient) -> bool {
    match client.post("/mutate", FIXTURE).await {
        Ok(reply) => {
            assert_eq!(reply.response()["allowed"], true);
            true
        }
        Err(_) => false,
    }
}

fn refusals(server: &TestServer, reason: &'static str) -> u64 {
    common::counter(
        &server.launched.webhook.metrics,
        &format!("ip_webhook_tls_client_refusals_total{{reason=\"{reason}\"}}"),
    )
}

/// The server counts a refusal after the client has seen it fail: wait for exactly `count`.
async fn refused(server: &TestServer, reason: &'static str, count: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while refusals(server, reason) < count && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(refusals(server, reason), count, "refusals for {reason}");
}

fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_clients_with_an_allowed_certificate_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("client-ca.crt");
    let first = ca("front-proxy CA");
    write(&ca_file, &first.pem);
    let server = TestServer::start_with(|c| {
        c.client_ca = Some(ip_webhook::app::ClientCaConfig {
            file: ca_file.clone(),
            allowed_names: vec!["kube-apiserver".into(), "apiserver.example".into()],
        });
        c.tls_reload_interval = Duration::from_millis(500);
    })
    .await;

    // no certificate: refused, counted
    assert!(!served(&client_with(&server, None)).await);
    refused(&server, "missing", 1).await;

    // `ip-webhook check` with and without the API server's certificate
    let apiserver = client_cert(&first, "kube-apiserver", &[]);
    // without one: the check says the server asked for one, and of which CA
    let (status, detail) = admission_check(&server, None).await;
    assert_eq!(status, "FAIL");
    assert!(
        detail.contains(
            "the server asked for a client certificate (it wants one signed by CN=front-proxy CA) and none was given"
        ) && detail.contains("TLS alert CertificateRequired"),
        "{detail}"
    );
    let (status, detail) = admission_check(&server, Some(&apiserver)).await;
    assert_eq!(status, "OK", "{detail}");
    refused(&server, "missing", 2).await; // the check without a certificate

    // the API server's certificate (allowed CN): served, again and again
    let client = client_with(&server, Some(&apiserver));
    assert!(served(&client).await);
    assert!(served(&client).await);
    // allowed by a DNS SAN
    let by_san = client_cert(&first, "something-else", &["apiserver.example"]);
    assert!(served(&client_with(&server, Some(&by_san))).await);

    // the right CA, a name not allowed
    let intruder = client_cert(&first, "intruder", &["intruder.example"]);
    assert!(!served(&client_with(&server, Some(&intruder))).await);
    refused(&server, "name", 1).await;

    // several CNs: refused whichever is allowed and in whatever order (x509 allows repeated
    // attributes; rcgen writes the second CN under its OID)
    for names in [["evil", "kube-apiserver"], ["kube-apiserver", "evil"]] {
        let mut subject = DistinguishedName::new();
        subject.push(DnType::CommonName, names[0]);
        subject.push(DnType::CustomDnType(vec![2, 5, 4, 3]), names[1]);
        let two_cns = client_cert_with(&first, subject, &[]);
        let (pem, _) = &two_cns;
        let der = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert_eq!(
            parsed.subject().iter_common_name().count(),
            2,
            "{}",
            parsed.subject()
        );
        assert!(
            !served(&client_with(&server, Some(&two_cns))).await,
            "{names:?}"
        );
    }
    refused(&server, "name", 3).await;
    // an allowed DNS SAN does not make several CNs acceptable either
    let mut subject = DistinguishedName::new();
    subject.push(DnType::CommonName, "evil");
    subject.push(DnType::CustomDnType(vec![2, 5, 4, 3]), "kube-apiserver");
    let with_san = client_cert_with(&first, subject, &["apiserver.example"]);
    assert!(!served(&client_with(&server, Some(&with_san))).await);
    refused(&server, "name", 4).await;

    // another CA, an allowed name
    let other = ca("someone else's CA");
    let forged = client_cert(&other, "kube-apiserver", &[]);
    assert!(!served(&client_with(&server, Some(&forged))).await);
    refused(&server, "untrusted", 1).await;
    // `check` with it: the CA wanted and the one that signed it
    let (status, detail) = admission_check(&server, Some(&forged)).await;
    assert_eq!(status, "FAIL");
    assert!(
        detail.contains(
            "the server asked for a client certificate (it wants one signed by CN=front-proxy CA); the one given is signed by CN=someone else's CA"
        ) && detail.contains("TLS alert UnknownCA"),
        "{detail}"
    );
    refused(&server, "untrusted", 2).await;
    // the right CA, a name not allowed: the CA matches, so the names are what to look at
    let (_, detail) = admission_check(&server, Some(&intruder)).await;
    assert!(
        detail.contains("--client-allowed-names") && detail.contains("TLS alert AccessDenied"),
        "{detail}"
    );
    refused(&server, "name", 5).await;

    // the CA file replaced: the new CA's clients are served, the old one's refused
    write(&ca_file, &other.pem);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !served(&client_with(&server, Some(&forged))).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new client CA was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !served(&client).await,
        "the old CA still admits its clients"
    );

    // a broken CA file keeps the current one
    write(&ca_file, "not a certificate");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(served(&client_with(&server, Some(&forged))).await);

    // the refusals are on /metrics
    let (_, text) = server.admin_get("/metrics").await;
    assert!(
        text.contains("ip_webhook_tls_client_refusals_total{reason=\"missing\"} 2"),
        "{text}"
    );
    server.launched.shutdown().await;
}

#[tokio::test]
async fn an_unusable_client_ca_file_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("client-ca.crt");
    std::fs::write(&ca_file, "junk").unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut config = common::serve_config(state.path());
    config.client_ca = Some(ip_webhook::app::ClientCaConfig {
        file: ca_file.clone(),
        allowed_names: Vec::new(),
    });
    let error = ip_webhook::app::launch(&config)
        .await
        .err()
        .expect("refused");
    assert!(
        error
            .to_string()
            .contains("is not a usable client CA bundle"),
        "{error}"
    );
}
