//! TLS: the serving certificate behind a lock-free swap, reloaded when its files change, and a
//! self-signed CA + serving certificate for running without a cluster.
//!
//! cert-manager (like any Secret volume) updates the mounted directory by swapping a `..data`
//! symlink, so the watcher watches the directories, re-reads both files on any event, and polls
//! as a backstop. A new pair that does not parse or does not match is ignored (the old
//! certificate keeps serving); existing connections are never touched.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};

use crate::metrics::{Metrics, ResultLabels};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: String },
    #[error("{path} holds no usable PEM private key: {reason}")]
    BadKey { path: String, reason: String },
    #[error("the certificate in {cert} does not match the key in {key}: {reason}")]
    Mismatch {
        cert: String,
        key: String,
        reason: String,
    },
    #[error("cannot generate a certificate: {0}")]
    Generate(String),
}

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parse a PEM chain and key into a key rustls can serve.
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_name: &str,
    key_name: &str,
) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|_| TlsError::NoCertificate {
            path: cert_name.into(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_name.into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::BadKey {
        path: key_name.into(),
        reason: e.to_string(),
    })?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|e| TlsError::Mismatch {
        cert: cert_name.into(),
        key: key_name.into(),
        reason: e.to_string(),
    })
}

/// notAfter of a DER certificate, unix seconds.
pub fn not_after(der: &[u8]) -> Option<i64> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// Serves whichever certificate was stored last; each handshake costs one atomic load.
pub struct CertResolver {
    current: ArcSwap<CertifiedKey>,
}

impl fmt::Debug for CertResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CertResolver")
    }
}

impl CertResolver {
    pub fn new(key: CertifiedKey) -> CertResolver {
        CertResolver {
            current: ArcSwap::from_pointee(key),
        }
    }

    pub fn store(&self, key: CertifiedKey) {
        self.current.store(Arc::new(key));
    }

    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// TLS 1.2 and 1.3 only (rustls has nothing older), HTTP/2 and HTTP/1.1 by ALPN.
pub fn server_config(resolver: Arc<CertResolver>) -> rustls::ServerConfig {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("ring supports TLS 1.2 and 1.3")
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}

/// Certificate files to serve and watch.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertFiles {
    fn read(&self) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| TlsError::Read {
                path: path.display().to_string(),
                reason: e.to_string(),
            })
        };
        Ok((read(&self.cert)?, read(&self.key)?))
    }

    /// Read and parse both files, returning the key and a fingerprint of the bytes.
    pub fn load(&self) -> Result<(CertifiedKey, [u8; 32]), TlsError> {
        let (cert, key) = self.read()?;
        let fingerprint = fingerprint(&cert, &key);
        let parsed = certified_key(
            &cert,
            &key,
            &self.cert.display().to_string(),
            &self.key.display().to_string(),
        )?;
        Ok((parsed, fingerprint))
    }
}

fn fingerprint(cert: &[u8], key: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(cert);
    hasher.update([0]);
    hasher.update(key);
    hasher.finalize().into()
}

/// Watch the certificate files' directories and poll every `poll`; swap in a new pair when
/// its bytes change and it parses. Runs until the task is dropped.
pub fn spawn_reloader(
    resolver: Arc<CertResolver>,
    files: CertFiles,
    initial: [u8; 32],
    poll: Duration,
    metrics: Arc<Metrics>,
) -> tokio::task::JoinHandle<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
    let watcher = {
        use notify::Watcher;
        let tx = tx.clone();
        let mut watcher =
            notify::recommended_watcher(move |_event: notify::Result<notify::Event>| {
                let _ = tx.try_send(());
            });
        if let Ok(w) = watcher.as_mut() {
            let mut dirs: Vec<PathBuf> = [&files.cert, &files.key]
                .iter()
                .map(|p| {
                    p.parent()
                        .map(Path::to_path_buf)
                        .filter(|d| !d.as_os_str().is_empty())
                        .unwrap_or_else(|| PathBuf::from("."))
                })
                .collect();
            dirs.dedup();
            for dir in dirs {
                if let Err(error) = w.watch(&dir, notify::RecursiveMode::NonRecursive) {
                    tracing::warn!(dir = %dir.display(), %error, "cannot watch certificate directory; polling only");
                }
            }
        }
        watcher
    };
    tokio::spawn(async move {
        let _watcher = watcher;
        let mut last = initial;
        let mut ticker = tokio::time::interval(poll);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                Some(()) = rx.recv() => {
                    // let a symlink swap (several events) settle
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            let files = files.clone();
            let loaded = tokio::task::spawn_blocking(move || files.load()).await;
            match loaded {
                Ok(Ok((key, print))) if print != last => {
                    if let Some(leaf) = key.cert.first() {
                        metrics.served_certificate(leaf);
                    }
                    resolver.store(key);
                    last = print;
                    metrics
                        .tls_reloads
                        .get_or_create(&ResultLabels { result: "success" })
                        .inc();
                    tracing::info!("serving a new TLS certificate");
                }
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    metrics
                        .tls_reloads
                        .get_or_create(&ResultLabels { result: "failure" })
                        .inc();
                    tracing::warn!(%error, "new certificate files are not usable; keeping the current certificate");
                }
                Err(error) => tracing::warn!(%error, "certificate reload task failed"),
            }
        }
    })
}

/// A CA and a serving certificate signed by it.
pub struct SelfSigned {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl SelfSigned {
    /// The serving certificate and its key, ready to serve.
    pub fn certified_key(&self) -> Result<CertifiedKey, TlsError> {
        certified_key(
            self.cert_pem.as_bytes(),
            self.key_pem.as_bytes(),
            "generated certificate",
            "generated key",
        )
    }
}

/// Generate a CA and a serving certificate for `localhost`, `127.0.0.1`, `::1` and `dns_names`.
pub fn self_signed(dns_names: &[String]) -> Result<SelfSigned, TlsError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
        KeyUsagePurpose,
    };
    let generate = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let ca_key = KeyPair::generate().map_err(generate)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "ip-webhook self-signed CA");
    ca_params.distinguished_name = dn;
    let ca_cert = ca_params.self_signed(&ca_key).map_err(generate)?;

    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    names.extend(dns_names.iter().cloned());
    names.dedup();
    let key = KeyPair::generate().map_err(generate)?;
    let mut params = CertificateParams::new(names).map_err(generate)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "ip-webhook");
    params.distinguished_name = dn;
    let issuer = Issuer::new(ca_params, ca_key);
    let cert = params.signed_by(&key, &issuer).map_err(generate)?;
    Ok(SelfSigned {
        ca_pem: ca_cert.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_pair_parses_and_mismatch_is_refused() {
        let a = self_signed(&["svc.ns.svc".into()]).unwrap();
        let b = self_signed(&[]).unwrap();
        certified_key(
            a.cert_pem.as_bytes(),
            a.key_pem.as_bytes(),
            "a.crt",
            "a.key",
        )
        .unwrap();
        let err = certified_key(
            a.cert_pem.as_bytes(),
            b.key_pem.as_bytes(),
            "a.crt",
            "b.key",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("the certificate in a.crt does not match the key in b.key"),
            "{err}"
        );
        let err = certified_key(b"junk", a.key_pem.as_bytes(), "x.crt", "a.key").unwrap_err();
        assert_eq!(err.to_string(), "x.crt holds no PEM certificate");
    }
}
