//! The etcd ledger over TLS with client certificates (rustls with ring), against a real etcd
//! started with `--client-cert-auth`. Fails, naming what to install, when no `etcd` binary
//! exists.

mod common;

use common::{claims, etcd_cluster};
use std::path::Path;
use std::time::Duration;

use etcd_cluster::{EtcdCluster, ServerTls, etcd_binary};
use ip_webhook_ledger::{CreateOutcome, EtcdLedger, EtcdOptions, Ledger};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

struct Pki {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        let ca_pem = params.self_signed(&key).unwrap().pem();
        Pki {
            ca_pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// (cert PEM, key PEM) for `names` with the given purpose.
    fn leaf(&self, cn: &str, names: &[&str], purpose: ExtendedKeyUsagePurpose) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        params.extended_key_usages = vec![purpose];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test]
async fn etcd_ledger_speaks_tls_with_a_client_certificate() {
    let etcd = etcd_binary("etcd_ledger_speaks_tls_with_a_client_certificate");
    let files = tempfile::tempdir().unwrap();
    let pki = Pki::new("test etcd CA");
    let (server_cert, server_key) = pki.leaf(
        "etcd",
        &["127.0.0.1", "localhost"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client_cert, client_key) =
        pki.leaf("ip-webhook", &[], ExtendedKeyUsagePurpose::ClientAuth);
    let ca = write(files.path(), "ca.crt", &pki.ca_pem);
    let tls = ServerTls {
        cert: write(files.path(), "server.crt", &server_cert),
        key: write(files.path(), "server.key", &server_key),
        client_ca: ca.clone(),
    };
    let cluster = tokio::task::spawn_blocking(move || EtcdCluster::start_with(&etcd, 1, Some(tls)))
        .await
        .unwrap();
    let options = EtcdOptions {
        endpoints: cluster.endpoints(),
        prefix: "/tls/".into(),
        ca_file: Some(ca.clone()),
        cert_file: Some(write(files.path(), "client.crt", &client_cert)),
        key_file: Some(write(files.path(), "client.key", &client_key)),
        timeout: Duration::from_secs(10),
        ..EtcdOptions::default()
    };
    assert!(options.endpoints[0].starts_with("https://"));
    let ledger = EtcdLedger::connect(&options)
        .await
        .expect("TLS with a client certificate");
    assert_eq!(
        ledger
            .create(
                claims::builder("10.0.0.1", "web", "web-0")
                    .request("tls-1")
                    .build()
                    .into()
            )
            .await
            .unwrap(),
        CreateOutcome::Created
    );
    assert_eq!(ledger.load().await.unwrap().len(), 1);

    // without a client certificate the server refuses us, and the error says where
    let no_identity = EtcdOptions {
        cert_file: None,
        key_file: None,
        timeout: Duration::from_secs(2),
        ..options.clone()
    };
    let error = EtcdLedger::connect(&no_identity)
        .await
        .err()
        .expect("refused without a client certificate");
    assert!(error.to_string().contains(&options.endpoints[0]), "{error}");

    // a CA that did not sign the server is refused too
    let other = Pki::new("another CA");
    let wrong_ca = EtcdOptions {
        ca_file: Some(write(files.path(), "other-ca.crt", &other.ca_pem)),
        timeout: Duration::from_secs(2),
        ..options.clone()
    };
    assert!(EtcdLedger::connect(&wrong_ca).await.is_err());
    // and a missing file is named
    let missing = EtcdOptions {
        ca_file: Some(files.path().join("nope.crt")),
        ..options
    };
    let error = EtcdLedger::connect(&missing).await.err().unwrap();
    assert!(error.to_string().contains("nope.crt"), "{error}");
}
