//! Self-signed certificates for running without cert-manager: a CA kept on disk and a
//! serving certificate it issues (again when it nears its end or its names change).

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::sign::CertifiedKey;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::tls::*;

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

pub(super) fn generate(e: rcgen::Error) -> TlsError {
    TlsError::Generate(e.to_string())
}

/// How long before its making a self-signed certificate is valid from (`notBefore`): a
/// verifier whose clock is a little behind this host's (an API server on another machine
/// given the caBundle) still accepts it. rcgen's default, 1975-01-01, is what certificate
/// scanners flag.
pub(crate) const NOT_BEFORE_SKEW: jiff::SignedDuration = jiff::SignedDuration::from_hours(1);

/// `notBefore` of a certificate made now: [`NOT_BEFORE_SKEW`] ago, to the second.
fn not_before() -> Result<time::OffsetDateTime, TlsError> {
    let at = jiff::Timestamp::now() - NOT_BEFORE_SKEW;
    time::OffsetDateTime::from_unix_timestamp(at.as_second())
        .map_err(|e| TlsError::Generate(e.to_string()))
}

/// The self-signed CA's parameters. Always the same name: a leaf issued later by the CA's
/// kept key names the same issuer as the first one.
pub(super) fn ca_params(
    valid_until: Option<jiff::Timestamp>,
) -> Result<rcgen::CertificateParams, TlsError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyUsagePurpose,
    };
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "ip-webhook self-signed CA");
    params.distinguished_name = dn;
    params.not_before = not_before()?;
    if let Some(until) = valid_until {
        let (year, month, day) = ymd(until);
        params.not_after = rcgen::date_time_ymd(year, month, day);
    }
    Ok(params)
}

/// (year, month, day) of `at` in UTC, for [`rcgen::date_time_ymd`].
pub(super) fn ymd(at: jiff::Timestamp) -> (i32, u8, u8) {
    let date = at.to_zoned(jiff::tz::TimeZone::UTC).date();
    (i32::from(date.year()), date.month() as u8, date.day() as u8)
}

/// The serving certificate for `localhost`, `127.0.0.1`, `::1` and `dns_names`, signed by
/// `issuer`; valid until `valid_until` (`None`: rcgen's default, the year 4096).
pub(super) fn issue_leaf(
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
    dns_names: &[String],
    valid_until: Option<jiff::Timestamp>,
) -> Result<(String, String), TlsError> {
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
    let key = KeyPair::generate().map_err(generate)?;
    let mut params = CertificateParams::new(serving_names(dns_names)).map_err(generate)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "ip-webhook");
    params.distinguished_name = dn;
    params.not_before = not_before()?;
    if let Some(until) = valid_until {
        let (year, month, day) = ymd(until);
        params.not_after = rcgen::date_time_ymd(year, month, day);
    }
    let cert = params.signed_by(&key, issuer).map_err(generate)?;
    Ok((cert.pem(), key.serialize_pem()))
}

pub(super) fn serving_names(dns_names: &[String]) -> Vec<String> {
    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    for name in dns_names {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    names
}

/// Generate a CA and a serving certificate for `localhost`, `127.0.0.1`, `::1` and `dns_names`.
pub fn self_signed(dns_names: &[String]) -> Result<SelfSigned, TlsError> {
    let ca_key = rcgen::KeyPair::generate().map_err(generate)?;
    let params = ca_params(None)?;
    let ca_cert = params.self_signed(&ca_key).map_err(generate)?;
    let issuer = rcgen::Issuer::new(params, ca_key);
    let (cert_pem, key_pem) = issue_leaf(&issuer, dns_names, None)?;
    Ok(SelfSigned {
        ca_pem: ca_cert.pem(),
        cert_pem,
        key_pem,
    })
}

/// How long a self-signed serving certificate is valid, and how long before its end `serve`
/// issues a new one (from the same CA) on start.
pub(crate) const SELF_SIGNED_VALIDITY_DAYS: i64 = 365;
pub(crate) const SELF_SIGNED_RENEW_DAYS: i64 = 30;
pub(super) const SELF_SIGNED_CA_DAYS: i64 = 3650;

/// What [`self_signed_in`] did with the files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kept {
    /// The CA was made now (none was kept, or it was unusable).
    pub(crate) new_ca: bool,
    /// The serving certificate was issued now.
    pub(crate) new_cert: bool,
}

/// The self-signed CA and serving certificate kept in `dir` (`ca.crt`, `ca.key`, `tls.crt`,
/// `tls.key`; keys mode 0600). The CA is made once and kept, so a caBundle copied from
/// `ca.crt` keeps working across restarts; the serving certificate is kept too, and issued
/// again by the same CA when it is missing, does not cover `dns_names`, is not the CA's, or
/// has fewer than [`SELF_SIGNED_RENEW_DAYS`] left.
pub(crate) fn self_signed_in(
    dir: &Path,
    dns_names: &[String],
) -> Result<(SelfSigned, Kept), TlsError> {
    let now = jiff::Timestamp::now();
    let days = |n: i64| jiff::SignedDuration::from_hours(24 * n);
    std::fs::create_dir_all(dir).map_err(|e| TlsError::Write {
        action: "create the directory",
        path: dir.display().to_string(),
        reason: e.to_string(),
    })?;
    let (ca_crt, ca_key, tls_crt, tls_key) = (
        dir.join("ca.crt"),
        dir.join("ca.key"),
        dir.join("tls.crt"),
        dir.join("tls.key"),
    );
    let (ca_pem, ca_key_pair, new_ca) = kept_or_new_ca(&ca_crt, &ca_key, now)?;
    let kept_leaf = match (
        read_unless_absent(&tls_crt, |p| std::fs::read(p))?,
        read_unless_absent(&tls_key, |p| std::fs::read(p))?,
    ) {
        (Some(cert), Some(key)) if !new_ca => Some((cert, key)),
        _ => None,
    }
    .filter(|(cert, key)| {
        leaf_still_good(
            cert,
            key,
            ca_pem.as_bytes(),
            dns_names,
            now + days(SELF_SIGNED_RENEW_DAYS),
        )
    });
    let new_cert = kept_leaf.is_none();
    let (cert_pem, key_pem) = match kept_leaf {
        Some((cert, key)) => (
            String::from_utf8_lossy(&cert).into_owned(),
            String::from_utf8_lossy(&key).into_owned(),
        ),
        None => {
            let issuer = rcgen::Issuer::new(ca_params(None)?, ca_key_pair);
            let (cert, key) = issue_leaf(
                &issuer,
                dns_names,
                Some(now + days(SELF_SIGNED_VALIDITY_DAYS)),
            )?;
            write_secret(&tls_key, &key)?;
            write_whole(&tls_crt, cert.as_bytes(), 0o644)?;
            (cert, key)
        }
    };
    Ok((
        SelfSigned {
            ca_pem,
            cert_pem,
            key_pem,
        },
        Kept { new_ca, new_cert },
    ))
}

/// The CA in `ca_crt` and `ca_key` when both are there and match, else a new one written
/// there; with whether it is new.
fn kept_or_new_ca(
    ca_crt: &Path,
    ca_key: &Path,
    now: jiff::Timestamp,
) -> Result<(String, rcgen::KeyPair, bool), TlsError> {
    let kept_ca = match (
        read_unless_absent(ca_crt, |p| std::fs::read_to_string(p))?,
        read_unless_absent(ca_key, |p| std::fs::read_to_string(p))?,
    ) {
        (Some(cert), Some(key)) => rcgen::KeyPair::from_pem(&key)
            .ok()
            .filter(|key| ca_pair_matches(&cert, key))
            .map(|key| (cert, key)),
        _ => None,
    };
    if let Some((cert, key)) = kept_ca {
        return Ok((cert, key, false));
    }
    let key = rcgen::KeyPair::generate().map_err(generate)?;
    let cert = ca_params(Some(
        now + jiff::SignedDuration::from_hours(24 * SELF_SIGNED_CA_DAYS),
    ))?
    .self_signed(&key)
    .map_err(generate)?;
    // Each file whole or not at all; a crash between the two leaves a key that does not match
    // the certificate, which the next start replaces as a pair.
    write_secret(ca_key, &key.serialize_pem())?;
    write_whole(ca_crt, cert.pem().as_bytes(), 0o644)?;
    Ok((cert.pem(), key, true))
}

/// The contents of `path`, `None` when it does not exist (or is no text: replaced like a
/// mismatched pair). Any other failure (a file this user may not read) is an error naming the
/// file: replacing a CA that is there but unreadable would break every caBundle copied from it.
fn read_unless_absent<T>(
    path: &Path,
    read: impl FnOnce(&Path) -> std::io::Result<T>,
) -> Result<Option<T>, TlsError> {
    match read(path) {
        Ok(contents) => Ok(Some(contents)),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::InvalidData
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(TlsError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        }),
    }
}

/// Write a private key readable by its owner only, whole or not at all.
pub(super) fn write_secret(path: &Path, text: &str) -> Result<(), TlsError> {
    write_whole(path, text.as_bytes(), 0o600)
}

/// Write `bytes` to `path` whole or not at all (a temp file, fsync, rename, directory fsync): a
/// full disk or a crash never leaves an empty or cut key or certificate behind.
fn write_whole(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let error = |e: std::io::Error| TlsError::Write {
        action: "write",
        path: path.display().to_string(),
        reason: e.to_string(),
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(error(e));
    }
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(error)?;
    }
    Ok(())
}

/// Whether `key` is the key of the first certificate in `cert_pem`.
fn ca_pair_matches(cert_pem: &str, key: &rcgen::KeyPair) -> bool {
    let Some(Ok(der)) = CertificateDer::pem_slice_iter(cert_pem.as_bytes()).next() else {
        return false;
    };
    x509_parser::parse_x509_certificate(&der).is_ok_and(|(_, cert)| {
        use rcgen::PublicKeyData;
        cert.tbs_certificate.subject_pki.raw == key.subject_public_key_info().as_slice()
    })
}

/// Whether a kept serving certificate may be served again: it matches its key, the CA signed
/// it for every name wanted, and it is still valid at `until`.
pub(super) fn leaf_still_good(
    cert_pem: &[u8],
    key_pem: &[u8],
    ca_pem: &[u8],
    dns_names: &[String],
    until: jiff::Timestamp,
) -> bool {
    let Ok(certified) = certified_key(cert_pem, key_pem, "tls.crt", "tls.key") else {
        return false;
    };
    let Some(leaf) = certified.cert.first() else {
        return false;
    };
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots
        .add_parsable_certificates(CertificateDer::pem_slice_iter(ca_pem).filter_map(Result::ok));
    let Ok(verifier) =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
    else {
        return false;
    };
    let Ok(at) = u64::try_from(until.as_second()) else {
        return false;
    };
    let at = rustls::pki_types::UnixTime::since_unix_epoch(Duration::from_secs(at));
    added > 0
        && serving_names(dns_names).iter().all(|name| {
            rustls::pki_types::ServerName::try_from(name.as_str()).is_ok_and(|name| {
                use rustls::client::danger::ServerCertVerifier;
                verifier
                    .verify_server_cert(leaf, &[], &name, &[], at)
                    .is_ok()
            })
        })
}
