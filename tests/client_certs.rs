//! `--client-ca-file` and `--client-allowed-names`: only a client whose certificate chains to
//! the CA (and names an allowed CN or DNS SAN) is served; refusals are counted by reason; a
//! new CA file is picked up without a restart.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{HttpsClient, TestServer};
use ip_webhook::metrics::ReasonLabels;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

const FIXTURE: &str = include_str!("fixtures/pod-create-v1.json");

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    params.distinguished_name = dn;
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// A client certificate with this CN and these DNS SANs, signed by `ca`: (chain PEM, key PEM).
fn client_cert(ca: &Ca, common_name: &str, dns: &[&str]) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(dns.iter().map(|d| d.to_string()).collect::<Vec<_>>()).unwrap();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn client_with(server: &TestServer, cert: Option<&(String, String)>) -> HttpsClient {
    let ca = std::fs::read(server.state_dir.path().join("ca.crt")).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&ca) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(ip_webhook::server::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match cert {
        Some((chain, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(chain.as_bytes())
                    .map(Result::unwrap)
                    .collect(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.resumption = rustls::client::Resumption::disabled();
    HttpsClient {
        addr: server.launched.running.https_addr,
        config: Arc::new(config),
    }
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
    server
        .launched
        .webhook
        .metrics
        .client_cert_refusals
        .get_or_create(&ReasonLabels { reason })
        .get()
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
    let server = TestServer::start(&[
        "--client-ca-file",
        ca_file.to_str().unwrap(),
        "--client-allowed-names",
        "kube-apiserver,apiserver.example",
        "--tls-reload-interval",
        "500ms",
    ])
    .await;

    // no certificate: refused, counted
    assert!(!served(&client_with(&server, None)).await);
    refused(&server, "missing", 1).await;

    // `ip-webhook check` with and without the API server's certificate
    let apiserver = client_cert(&first, "kube-apiserver", &[]);
    let serving_ca = std::fs::read(server.state_dir.path().join("ca.crt")).unwrap();
    let mut options = ip_webhook::ops::doctor::Options {
        url: format!(
            "https://localhost:{}",
            server.launched.running.https_addr.port()
        ),
        ca_pem: Some(serving_ca),
        admin_url: None,
        min_days: 7,
        exhaustion_ratio: 0.9,
        timeout: Duration::from_secs(5),
        client_pem: None,
        server_name: None,
        cluster_bundles: None,
    };
    let admission = |checks: &[ip_webhook::ops::doctor::Check]| {
        checks
            .iter()
            .find(|c| c.name == "admission")
            .map(|c| (c.status, c.detail.clone()))
    };
    let without = ip_webhook::ops::doctor::run(&options).await;
    assert!(
        matches!(
            admission(&without),
            Some((ip_webhook::ops::doctor::Status::Fail, _)) | None
        ),
        "{without:#?}"
    );
    options.client_pem = Some((
        apiserver.0.clone().into_bytes(),
        apiserver.1.clone().into_bytes(),
    ));
    let with = ip_webhook::ops::doctor::run(&options).await;
    assert_eq!(
        admission(&with).map(|(status, _)| status),
        Some(ip_webhook::ops::doctor::Status::Ok),
        "{with:#?}"
    );
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

    // another CA, an allowed name
    let other = ca("someone else's CA");
    let forged = client_cert(&other, "kube-apiserver", &[]);
    assert!(!served(&client_with(&server, Some(&forged))).await);
    refused(&server, "untrusted", 1).await;

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
    let args = common::serve_args(
        state.path(),
        &["--client-ca-file", ca_file.to_str().unwrap()],
    );
    let error = ip_webhook::cli::app::launch(&args)
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
