//! The doctor's TLS side: an inspecting verifier that keeps the served chain and the real
//! verifier's judgement from one handshake, and the checks of a caBundle and of expiry.

use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use super::{CaBundles, Check, Status, Unreached, check};

/// The served chain (DER, leaf first) and what the verifier said of it.
pub(super) type Seen = (Vec<Vec<u8>>, Result<(), CertError>);

/// Why a certificate is not trusted, or not usable.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CertError {
    #[error("it holds no PEM certificate")]
    NoPem,
    #[error("it is not usable: {0}")]
    Unusable(rustls::client::VerifierBuilderError),
    #[error("no certificate was served")]
    NothingServed,
    #[error(transparent)]
    Name(#[from] rustls::pki_types::InvalidDnsNameError),
    #[error(transparent)]
    Refused(#[from] rustls::Error),
    #[error("it has no caBundle")]
    NoCaBundle,
    #[error("not verified: no --ca-file, --ca-bundle or cluster given")]
    NotVerified,
    #[error("the client certificate file: {0}")]
    ClientCertFile(rustls::pki_types::pem::Error),
    #[error("the client certificate file holds no PEM certificate")]
    NoClientCert,
    #[error("the client key file: {0}")]
    ClientKeyFile(rustls::pki_types::pem::Error),
}

/// Accepts any certificate but remembers the leaf and what the real verifier said of it, so
/// one handshake both inspects and judges the certificate.
#[derive(Debug)]
pub(super) struct Inspector {
    pub(super) verifier: Option<Arc<rustls::client::WebPkiServerVerifier>>,
    pub(super) seen: Mutex<Option<Seen>>,
    pub(super) schemes: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Inspector {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verdict = match &self.verifier {
            Some(verifier) => verifier
                .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
                .map(|_| ())
                .map_err(CertError::from),
            None => Err(CertError::NotVerified),
        };
        let chain = std::iter::once(end_entity)
            .chain(intermediates)
            .map(|c| c.as_ref().to_vec())
            .collect();
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some((chain, verdict));
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.schemes)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.schemes)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes.supported_schemes()
    }
}

/// Whether `pem` (a caBundle) signs `chain` (leaf first) for `name`, as the API server would
/// check it.
pub(super) fn verify_with_bundle(
    pem: &[u8],
    chain: &[Vec<u8>],
    name: &str,
) -> Result<(), CertError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(CertError::NoPem);
    }
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        crate::server::tls::provider(),
    )
    .build()
    .map_err(CertError::Unusable)?;
    let (leaf, intermediates) = chain.split_first().ok_or(CertError::NothingServed)?;
    let leaf = CertificateDer::from(leaf.clone());
    let intermediates: Vec<CertificateDer<'_>> = intermediates
        .iter()
        .map(|c| CertificateDer::from(c.clone()))
        .collect();
    let server_name = ServerName::try_from(name.to_string())?;
    verifier
        .verify_server_cert(&leaf, &intermediates, &server_name, &[], UnixTime::now())
        .map(|_| ())
        .map_err(CertError::from)
}

/// The webhook configurations' caBundles against the served chain: OK when every one of them
/// signs it (the API server checks each webhook with its own caBundle).
pub(crate) fn cluster_bundle_check(
    bundles: &Result<CaBundles, Unreached>,
    chain: &[Vec<u8>],
    name: &str,
) -> Check {
    let bundles = match bundles {
        Ok(bundles) => bundles,
        Err(why) => return check("cabundle", Status::Fail, why.to_string()),
    };
    if bundles.is_empty() {
        return check(
            "cabundle",
            Status::Fail,
            "the webhook configurations hold no webhooks",
        );
    }
    let refused: Vec<String> = bundles
        .iter()
        .filter_map(|(source, pem)| {
            let verdict = if pem.is_empty() {
                Err(CertError::NoCaBundle)
            } else {
                verify_with_bundle(pem, chain, name)
            };
            verdict.err().map(|why| format!("{source}: {why}"))
        })
        .collect();
    if refused.is_empty() {
        check(
            "cabundle",
            Status::Ok,
            format!(
                "the caBundle of each of the {} webhooks signs the served certificate for {name}",
                bundles.len()
            ),
        )
    } else {
        check(
            "cabundle",
            Status::Fail,
            format!(
                "the API server would refuse the served certificate: {}",
                refused.join("; ")
            ),
        )
    }
}

/// Days left on the certificate: FAIL under `min_days` (or expired), WARN under 30.
pub(crate) fn expiry_check(leaf_der: &[u8], min_days: i64, now: i64) -> Check {
    let Some(not_after) = crate::server::tls::not_after(leaf_der) else {
        return check(
            "expiry",
            Status::Fail,
            "the served certificate cannot be parsed",
        );
    };
    let seconds = not_after - now;
    let days = seconds.div_euclid(86_400);
    let when = ip_webhook_ipam::usage::rfc3339(not_after.max(0) as u64);
    if seconds <= 0 {
        check("expiry", Status::Fail, format!("expired at {when}"))
    } else if days < min_days {
        check(
            "expiry",
            Status::Fail,
            format!("expires in {days} days ({when}); renew it"),
        )
    } else if days < 30 {
        check(
            "expiry",
            Status::Warn,
            format!("expires in {days} days ({when})"),
        )
    } else {
        check(
            "expiry",
            Status::Ok,
            format!("expires in {days} days ({when})"),
        )
    }
}
