//! TLS: the serving certificate behind a lock-free swap, reloaded when its files change, and a
//! self-signed CA + serving certificate for running without a cluster.
//!
//! cert-manager (like any Secret volume) updates the mounted directory by swapping a `..data`
//! symlink, so the watcher watches the directories, re-reads the files on any change event
//! (not on the access events its own reads cause), and polls as a backstop. Only a change of
//! the files' digest is acted on: a new pair that does not parse or does not match is logged
//! once and ignored (the old certificate keeps serving); existing connections are never
//! touched.
//!
//! With `--client-ca-file`, a client certificate chaining to that CA is required (rustls'
//! `WebPkiClientVerifier` behind the same kind of swap, reloaded the same way), and with
//! `--client-allowed-names` its CN (a subject with several CNs is refused) or a DNS SAN must be
//! one of the names.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::UnixTime;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use sha2::{Digest, Sha256};

use crate::metrics::{Metrics, ResultLabels};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    /// Creating or writing a file or directory (the self-signed CA's) failed.
    #[error("cannot {action} {path}: {reason}")]
    Write {
        action: &'static str,
        path: String,
        reason: String,
    },
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
    #[error("{path} is not a usable client CA bundle: {reason}")]
    ClientCa { path: String, reason: String },
}

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parse a PEM chain and key into a key rustls can serve.
pub(crate) fn certified_key(
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
pub(crate) fn not_after(der: &[u8]) -> Option<i64> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// Record the notAfter of the certificate now served (DER of the leaf) in `metrics`.
pub(crate) fn served_certificate(metrics: &Metrics, leaf_der: &[u8]) {
    match not_after(leaf_der) {
        Some(not_after) => {
            metrics.certificate_expiry.set(not_after);
        }
        None => tracing::warn!("cannot read notAfter of the served certificate"),
    }
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

    pub(crate) fn store(&self, key: CertifiedKey) {
        self.current.store(Arc::new(key));
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// TLS 1.2 and 1.3 only (rustls has nothing older), HTTP/2 and HTTP/1.1 by ALPN.
pub fn server_config(resolver: Arc<CertResolver>) -> rustls::ServerConfig {
    server_config_with_clients(resolver, None)
}

/// [`server_config`], requiring a client certificate that `clients` accepts when given.
pub(crate) fn server_config_with_clients(
    resolver: Arc<CertResolver>,
    clients: Option<Arc<ClientVerifier>>,
) -> rustls::ServerConfig {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("ring supports TLS 1.2 and 1.3");
    let mut config = match clients {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    }
    .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}

/// rustls' WebPKI client verifier for one CA bundle (PEM).
pub(crate) fn client_ca_verifier(
    pem: &[u8],
    name: &str,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let bad = |reason: String| TlsError::ClientCa {
        path: name.to_string(),
        reason,
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| bad(e.to_string()))?;
        roots.add(cert).map_err(|e| bad(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad("it holds no PEM certificate".into()));
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| bad(e.to_string()))
}

/// Distinct client CA bundles whose names one process sends as hints; past them, no hints.
const HINT_SLOTS: usize = 32;

/// Requires a client certificate: chaining to the current CA (swapped on reload), and with
/// allowed names, naming one of them as its CN or a DNS SAN.
///
/// Each CertificateRequest names the current bundle's CA subjects (the `certificate_authorities`
/// a Go server sends from its `ClientCAs` too), so a client learns which CA is wanted: Go's
/// client sends its certificate only when its chain names one of them, and `check` prints
/// them. rustls borrows the names for as long as the verifier, and the bundle can change under
/// it: each distinct list is written once into a slot of its own and the current one is an
/// index, so no reload frees names a handshake may still read.
pub(crate) struct ClientVerifier {
    current: ArcSwap<Arc<dyn ClientCertVerifier>>,
    allowed: Vec<String>,
    hints: [OnceLock<Vec<DistinguishedName>>; HINT_SLOTS],
    /// The slot of the current bundle's names; `HINT_SLOTS` for none.
    hint: AtomicUsize,
}

impl fmt::Debug for ClientVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientVerifier")
            .field("allowed", &self.allowed)
            .finish()
    }
}

impl ClientVerifier {
    pub(crate) fn new(
        verifier: Arc<dyn ClientCertVerifier>,
        allowed: Vec<String>,
    ) -> ClientVerifier {
        let client = ClientVerifier {
            current: ArcSwap::from_pointee(verifier.clone()),
            allowed: allowed
                .into_iter()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect(),
            hints: [const { OnceLock::new() }; HINT_SLOTS],
            hint: AtomicUsize::new(HINT_SLOTS),
        };
        client.store_hints(&*verifier);
        client
    }

    pub(crate) fn store(&self, verifier: Arc<dyn ClientCertVerifier>) {
        self.store_hints(&*verifier);
        self.current.store(Arc::new(verifier));
    }

    /// Point the hints at `verifier`'s CA names: the slot that holds the same list, or a
    /// free one; with none free, send no names (clients then send what they have).
    fn store_hints(&self, verifier: &dyn ClientCertVerifier) {
        let names = verifier.root_hint_subjects();
        for (index, slot) in self.hints.iter().enumerate() {
            let fresh = slot.get().is_none() && slot.set(names.to_vec()).is_ok();
            let same = |kept: &Vec<DistinguishedName>| {
                kept.len() == names.len()
                    && kept
                        .iter()
                        .zip(names)
                        .all(|(a, b)| a.as_ref() == b.as_ref())
            };
            if fresh || slot.get().is_some_and(same) {
                self.hint.store(index, Ordering::Release);
                return;
            }
        }
        tracing::warn!(
            "{HINT_SLOTS} client CA bundles were loaded since the start: the client CA's names are no longer sent to clients"
        );
        self.hint.store(HINT_SLOTS, Ordering::Release);
    }

    fn inner(&self) -> Arc<Arc<dyn ClientCertVerifier>> {
        self.current.load_full()
    }

    /// Whether the certificate's CN or one of its DNS SANs is allowed (any, with no list).
    /// A subject with several CNs is refused whatever they say: which one a client means is
    /// ambiguous (`CN=evil, CN=kube-apiserver`), and a CA that signs such a subject signs
    /// whatever it is sent.
    fn name_allowed(&self, der: &[u8]) -> bool {
        if self.allowed.is_empty() {
            return true;
        }
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
            return false;
        };
        let mut subject_cns = cert.subject().iter_common_name();
        let common_name = match (subject_cns.next(), subject_cns.next()) {
            (_, Some(_)) => return false,
            (one, None) => one.and_then(|cn| cn.as_str().ok().map(str::to_string)),
        };
        let dns_names = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|name| match name {
                        x509_parser::extensions::GeneralName::DNSName(dns) => Some(dns.to_string()),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        common_name
            .into_iter()
            .chain(dns_names)
            .any(|name| self.allowed.iter().any(|a| a.eq_ignore_ascii_case(&name)))
    }
}

impl ClientCertVerifier for ClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.hints
            .get(self.hint.load(Ordering::Acquire))
            .and_then(OnceLock::get)
            .map_or(&[], Vec::as_slice)
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner()
            .verify_client_cert(end_entity, intermediates, now)?;
        if !self.name_allowed(end_entity) {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner().supported_verify_schemes()
    }
}

/// Certificate files to serve and watch.
#[derive(Debug, Clone)]
pub(crate) struct CertFiles {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

impl CertFiles {
    /// Read and parse both files, returning the key and the digest the reloader compares.
    pub(crate) fn load(&self) -> Result<(CertifiedKey, [u8; 32]), TlsError> {
        let (contents, fingerprint) = read_all(&[self.cert.clone(), self.key.clone()]);
        let [cert, key]: [Vec<u8>; 2] = contents?.try_into().expect("two files read, two contents");
        let parsed = certified_key(
            &cert,
            &key,
            &self.cert.display().to_string(),
            &self.key.display().to_string(),
        )?;
        Ok((parsed, fingerprint))
    }
}

/// Watch the certificate files' directories and poll every `poll`; swap in a new pair when
/// its bytes change and it parses. Runs until the task is dropped.
pub(crate) fn spawn_reloader(
    resolver: Arc<CertResolver>,
    files: CertFiles,
    initial: [u8; 32],
    poll: Duration,
    metrics: Arc<Metrics>,
) -> tokio::task::JoinHandle<()> {
    let names = (
        files.cert.display().to_string(),
        files.key.display().to_string(),
    );
    let served = metrics.clone();
    spawn_watch(
        vec![files.cert, files.key],
        initial,
        poll,
        metrics,
        "serving certificate",
        move |contents| {
            let key = certified_key(&contents[0], &contents[1], &names.0, &names.1)?;
            if let Some(leaf) = key.cert.first() {
                served_certificate(&served, leaf);
            }
            resolver.store(key);
            Ok(())
        },
    )
}

/// Watch the client CA bundle like the serving certificate; swap in a new verifier when its
/// bytes change and it parses.
pub(crate) fn spawn_client_ca_reloader(
    verifier: Arc<ClientVerifier>,
    file: PathBuf,
    initial: [u8; 32],
    poll: Duration,
    metrics: Arc<Metrics>,
) -> tokio::task::JoinHandle<()> {
    let name = file.display().to_string();
    spawn_watch(
        vec![file],
        initial,
        poll,
        metrics,
        "client CA",
        move |contents| {
            verifier.store(client_ca_verifier(&contents[0], &name)?);
            Ok(())
        },
    )
}

/// Read `paths`; the digest covers their bytes, or the error when one cannot be read.
pub(crate) fn read_all(paths: &[PathBuf]) -> (Result<Vec<Vec<u8>>, TlsError>, [u8; 32]) {
    let mut hasher = Sha256::new();
    let mut contents = Vec::with_capacity(paths.len());
    for path in paths {
        match std::fs::read(path) {
            Ok(bytes) => {
                hasher.update((bytes.len() as u64).to_le_bytes());
                hasher.update(&bytes);
                contents.push(bytes);
            }
            Err(e) => {
                let error = TlsError::Read {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                };
                hasher.update(b"error");
                hasher.update(error.to_string().as_bytes());
                return (Err(error), hasher.finalize().into());
            }
        }
    }
    (Ok(contents), hasher.finalize().into())
}

/// Whether a file event can mean new contents (our own reads cause access events).
fn is_change(event: &notify::Result<notify::Event>) -> bool {
    match event {
        Ok(event) => !matches!(event.kind, notify::EventKind::Access(_)),
        Err(_) => true,
    }
}

/// Watch the directories of `paths` and poll every `poll`; call `apply` with the files'
/// bytes whenever their digest differs from the last one seen (starting from `initial`).
/// A failure is counted and logged once per change of contents.
fn spawn_watch(
    paths: Vec<PathBuf>,
    initial: [u8; 32],
    poll: Duration,
    metrics: Arc<Metrics>,
    what: &'static str,
    apply: impl Fn(&[Vec<u8>]) -> Result<(), TlsError> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
    let watcher = {
        use notify::Watcher;
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                if is_change(&event) {
                    let _ = tx.try_send(());
                }
            });
        if let Ok(w) = watcher.as_mut() {
            let mut dirs: Vec<PathBuf> = paths
                .iter()
                .map(|p| {
                    p.parent()
                        .map(Path::to_path_buf)
                        .filter(|d| !d.as_os_str().is_empty())
                        .unwrap_or_else(|| PathBuf::from("."))
                })
                .collect();
            dirs.sort();
            dirs.dedup();
            for dir in dirs {
                if let Err(error) = w.watch(&dir, notify::RecursiveMode::NonRecursive) {
                    tracing::warn!(dir = %dir.display(), %error, "cannot watch {what} directory; polling only");
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
            let paths = paths.clone();
            let Ok((contents, digest)) =
                tokio::task::spawn_blocking(move || read_all(&paths)).await
            else {
                tracing::warn!("{what} reload task failed");
                continue;
            };
            metrics.tls_checks.inc();
            if digest == last {
                continue;
            }
            last = digest;
            match contents.and_then(|contents| apply(&contents)) {
                Ok(()) => {
                    metrics
                        .tls_reloads
                        .get_or_create(&ResultLabels { result: "success" })
                        .inc();
                    tracing::info!("serving with a new {what}");
                }
                Err(error) => {
                    metrics
                        .tls_reloads
                        .get_or_create(&ResultLabels { result: "failure" })
                        .inc();
                    tracing::warn!(%error, "the new {what} files are not usable; keeping the current one");
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::certs::*;

    #[test]
    fn our_own_reads_are_not_changes() {
        use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind};
        let event = |kind| Ok(notify::Event::new(kind));
        assert!(!is_change(&event(notify::EventKind::Access(
            AccessKind::Open(AccessMode::Read)
        ))));
        assert!(!is_change(&event(notify::EventKind::Access(
            AccessKind::Close(AccessMode::Read)
        ))));
        assert!(is_change(&event(notify::EventKind::Create(
            CreateKind::File
        ))));
        assert!(is_change(&event(notify::EventKind::Modify(
            ModifyKind::Any
        ))));
        assert!(is_change(&Err(notify::Error::generic("queue overflow"))));
    }

    #[test]
    fn digests_follow_contents_and_read_errors() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ca.crt");
        std::fs::write(&file, "a").unwrap();
        let paths = [file.clone()];
        let (first, digest) = read_all(&paths);
        assert_eq!(first.unwrap(), [b"a".to_vec()]);
        assert_eq!(read_all(&paths).1, digest, "same bytes, same digest");
        std::fs::write(&file, "b").unwrap();
        assert_ne!(read_all(&paths).1, digest);
        std::fs::remove_file(&file).unwrap();
        let (missing, gone) = read_all(&paths);
        assert!(missing.is_err());
        assert_eq!(read_all(&paths).1, gone, "one missing file, one digest");
    }

    /// The self-signed certificates start an hour before they were made (a verifier's clock a
    /// little behind still accepts them; not rcgen's 1975-01-01), and end when they should:
    /// the CA in ten years, the serving certificate in one (to the day).
    #[test]
    fn self_signed_certificates_start_just_before_they_were_made() {
        let dates = |pem: &str| {
            let der = CertificateDer::pem_slice_iter(pem.as_bytes())
                .next()
                .unwrap()
                .unwrap();
            let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
            let validity = cert.validity();
            (
                validity.not_before.timestamp(),
                validity.not_after.timestamp(),
            )
        };
        let dir = tempfile::tempdir().unwrap();
        let before = jiff::Timestamp::now().as_second();
        let (made, _) = self_signed_in(dir.path(), &[]).unwrap();
        let after = jiff::Timestamp::now().as_second();
        let skew = NOT_BEFORE_SKEW.as_secs();
        let day = 24 * 3600;
        for (what, pem, days) in [
            ("CA", &made.ca_pem, 3650),
            ("serving certificate", &made.cert_pem, 365),
        ] {
            let (from, until) = dates(pem);
            assert!(
                (before - skew..=after - skew).contains(&from),
                "{what}: notBefore {from} is not an hour before {before}..{after}"
            );
            // notAfter is the start of the day `days` from now (UTC)
            let end = before + days * day;
            assert!(
                (end - day..=end).contains(&until),
                "{what}: notAfter {until}, not {days} days on from {before}"
            );
        }
        // the kept pair is served again with its dates, and so is a plain self-signed pair
        let (kept, _) = self_signed_in(dir.path(), &[]).unwrap();
        assert_eq!(dates(&kept.cert_pem), dates(&made.cert_pem));
        let (from, _) = dates(&self_signed(&[]).unwrap().ca_pem);
        assert!(from >= before - skew, "notBefore {from}");
    }

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

    #[test]
    fn self_signed_files_keep_the_ca_and_renew_the_certificate_only_when_needed() {
        let dir = tempfile::tempdir().unwrap();
        let (first, kept) = self_signed_in(dir.path(), &[]).unwrap();
        assert_eq!(
            kept,
            Kept {
                new_ca: true,
                new_cert: true
            }
        );
        use std::os::unix::fs::PermissionsExt;
        for key in ["ca.key", "tls.key"] {
            let mode = std::fs::metadata(dir.path().join(key))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{key}");
        }
        let leaf = first.certified_key().unwrap();
        let days_left = (not_after(leaf.cert[0].as_ref()).unwrap()
            - jiff::Timestamp::now().as_second())
            / 86_400;
        assert!((363..=366).contains(&days_left), "{days_left}");

        // a restart: the same CA and the same certificate
        let (again, kept) = self_signed_in(dir.path(), &[]).unwrap();
        assert_eq!(
            kept,
            Kept {
                new_ca: false,
                new_cert: false
            }
        );
        assert_eq!(again.ca_pem, first.ca_pem);
        assert_eq!(again.cert_pem, first.cert_pem);

        // a new name: same CA, a new certificate that the CA signed for it
        let names = ["ip-webhook.ip-webhook-system.svc".to_string()];
        let (renamed, kept) = self_signed_in(dir.path(), &names).unwrap();
        assert_eq!(
            kept,
            Kept {
                new_ca: false,
                new_cert: true
            }
        );
        assert_eq!(renamed.ca_pem, first.ca_pem);
        assert!(leaf_still_good(
            renamed.cert_pem.as_bytes(),
            renamed.key_pem.as_bytes(),
            first.ca_pem.as_bytes(),
            &names,
            jiff::Timestamp::now()
        ));

        // close to its end: issued again
        let issuer = rcgen::Issuer::new(
            ca_params(None).unwrap(),
            rcgen::KeyPair::from_pem(&std::fs::read_to_string(dir.path().join("ca.key")).unwrap())
                .unwrap(),
        );
        let soon = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24 * 10);
        let (cert, key) = issue_leaf(&issuer, &names, Some(soon)).unwrap();
        std::fs::write(dir.path().join("tls.crt"), &cert).unwrap();
        std::fs::write(dir.path().join("tls.key"), &key).unwrap();
        let (_, kept) = self_signed_in(dir.path(), &names).unwrap();
        assert!(kept.new_cert && !kept.new_ca, "{kept:?}");

        // a certificate of another CA is not served
        let other = self_signed(&names).unwrap();
        std::fs::write(dir.path().join("tls.crt"), &other.cert_pem).unwrap();
        std::fs::write(dir.path().join("tls.key"), &other.key_pem).unwrap();
        let (served, kept) = self_signed_in(dir.path(), &names).unwrap();
        assert!(kept.new_cert, "{kept:?}");
        assert_ne!(served.cert_pem, other.cert_pem);
    }

    /// A CA key cut short or not the certificate's (a crash between the two writes of an older
    /// release) is replaced as a pair, so the chain served always verifies; the files are
    /// written whole (no temp file is left).
    #[test]
    fn a_ca_key_that_is_cut_or_not_the_certificates_is_replaced_as_a_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (first, _) = self_signed_in(dir.path(), &[]).unwrap();
        let other_ca_key = {
            let scratch = tempfile::tempdir().unwrap();
            self_signed_in(scratch.path(), &[]).unwrap();
            std::fs::read_to_string(scratch.path().join("ca.key")).unwrap()
        };
        std::fs::write(dir.path().join("ca.key"), &other_ca_key).unwrap();
        let (replaced, kept) = self_signed_in(dir.path(), &[]).unwrap();
        assert!(kept.new_ca && kept.new_cert, "{kept:?}");
        assert_ne!(replaced.ca_pem, first.ca_pem);
        assert!(leaf_still_good(
            replaced.cert_pem.as_bytes(),
            replaced.key_pem.as_bytes(),
            replaced.ca_pem.as_bytes(),
            &[],
            jiff::Timestamp::now()
        ));

        let cut = std::fs::read_to_string(dir.path().join("ca.key")).unwrap();
        std::fs::write(dir.path().join("ca.key"), &cut[..cut.len() / 2]).unwrap();
        let (_, kept) = self_signed_in(dir.path(), &[]).unwrap();
        assert!(kept.new_ca, "{kept:?}");
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(names.is_empty(), "{names:?}");
    }
}
