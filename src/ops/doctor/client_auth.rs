//! The doctor's client certificate: presented when given, and in any case a record of whether
//! the server asked for one and which CAs its CertificateRequest named, so a refusal can say
//! so instead of "connection error".
//!
//! Under TLS 1.3 a client's handshake ends before the server has judged its certificate: a
//! refusal arrives as an alert on the first read, which hyper reports as a failed request. The
//! alert is dug out of the error's sources.

use std::error::Error;
use std::sync::{Arc, Mutex};

use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;
use rustls::{AlertDescription, SignatureScheme};
use x509_parser::prelude::FromDer;

/// Presents `key` (if any) when asked, and remembers the asking.
#[derive(Debug)]
pub(super) struct ClientIdentity {
    key: Option<Arc<CertifiedKey>>,
    /// The CA names of the server's CertificateRequest, once one arrived.
    asked: Mutex<Option<Vec<String>>>,
}

impl ClientIdentity {
    pub(super) fn new(key: Option<CertifiedKey>) -> ClientIdentity {
        ClientIdentity {
            key: key.map(Arc::new),
            asked: Mutex::new(None),
        }
    }

    /// The CA names the server asked for, if it asked for a client certificate.
    pub(super) fn asked(&self) -> Option<Vec<String>> {
        self.asked.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The issuer of the certificate presented, as text.
    fn issuer(&self) -> Option<String> {
        let leaf = self.key.as_ref()?.cert.first()?;
        let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
        Some(cert.issuer().to_string())
    }

    /// What a failed handshake or request means when the server asked for a client
    /// certificate; `None` when it did not ask (the failure is about something else).
    pub(super) fn refusal(&self, alert: Option<AlertDescription>) -> Option<String> {
        let names = self.asked()?;
        let wanted = if names.is_empty() {
            "it named no CA in its request".to_string()
        } else {
            format!("it wants one signed by {}", names.join(" or "))
        };
        let said = alert.map_or_else(String::new, |alert| {
            format!(", and it refused the connection with the TLS alert {alert:?}")
        });
        Some(match self.issuer() {
            None => format!(
                "the server asked for a client certificate ({wanted}) and none was given{said}; pass the API server's with --client-cert-file and --client-key-file"
            ),
            Some(issuer) if !names.is_empty() && !names.contains(&issuer) => format!(
                "the server asked for a client certificate ({wanted}); the one given is signed by {issuer}{said}"
            ),
            Some(issuer) => format!(
                "the server asked for a client certificate ({wanted}); the one given (signed by {issuer}) was not accepted{said}: is its CN or a DNS SAN in --client-allowed-names, and is it valid now?"
            ),
        })
    }
}

impl ResolvesClientCert for ClientIdentity {
    fn resolve(
        &self,
        root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        let names = root_hint_subjects
            .iter()
            .map(|der| match x509_parser::x509::X509Name::from_der(der) {
                Ok((_, name)) => name.to_string(),
                Err(_) => format!("an unreadable name ({} bytes)", der.len()),
            })
            .collect();
        *self.asked.lock().unwrap_or_else(|p| p.into_inner()) = Some(names);
        self.key.clone()
    }

    fn has_certs(&self) -> bool {
        self.key.is_some()
    }
}

/// The TLS alert the server sent, found among `error`'s sources (an `io::Error` hides the
/// rustls error it wraps from `source()`, so it is looked into).
pub(super) fn alert_in(error: &(dyn Error + 'static)) -> Option<AlertDescription> {
    let mut next = Some(error);
    while let Some(error) = next {
        let inner = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|inner| inner as &(dyn Error + 'static));
        for candidate in [Some(error), inner].into_iter().flatten() {
            if let Some(rustls::Error::AlertReceived(alert)) =
                candidate.downcast_ref::<rustls::Error>()
            {
                return Some(*alert);
            }
        }
        next = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alerts_are_found_inside_io_errors() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(AlertDescription::CertificateRequired),
        );
        assert_eq!(alert_in(&io), Some(AlertDescription::CertificateRequired));
        assert_eq!(alert_in(&std::io::Error::other("reset")), None);
    }

    #[test]
    fn a_refusal_says_what_was_asked_and_given() {
        let identity = ClientIdentity::new(None);
        assert_eq!(
            identity.refusal(None),
            None,
            "not asked: not about certificates"
        );
        *identity.asked.lock().unwrap() = Some(vec!["CN=front-proxy CA".to_string()]);
        assert_eq!(
            identity
                .refusal(Some(AlertDescription::CertificateRequired))
                .unwrap(),
            "the server asked for a client certificate (it wants one signed by CN=front-proxy CA) and none was given, and it refused the connection with the TLS alert CertificateRequired; pass the API server's with --client-cert-file and --client-key-file"
        );
    }
}
