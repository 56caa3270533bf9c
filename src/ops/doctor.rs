//! `check`: a doctor for a running install. Each check reports OK, WARN, FAIL or SKIP with
//! what it saw; any FAIL makes the command exit non-zero.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use serde::Serialize;
use tokio::net::TcpStream;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    Ok,
    Warn,
    Fail,
    Skip,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
}

fn check(name: &'static str, status: Status, detail: impl Into<String>) -> Check {
    Check {
        name,
        status,
        detail: detail.into(),
    }
}

/// caBundles (PEM), each with the webhook it belongs to.
pub type CaBundles = Vec<(String, Vec<u8>)>;

#[derive(Debug, Clone)]
pub struct Options {
    /// `https://host:port` (a path, if any, replaces `/mutate`).
    pub url: String,
    /// PEM of the CA the API server trusts (the webhook configuration's caBundle).
    pub ca_pem: Option<Vec<u8>>,
    /// The name to verify the certificate for and send as SNI (through a port-forward: the
    /// Service's `<svc>.<namespace>.svc`); default: the URL's host.
    pub server_name: Option<String>,
    /// The caBundles of the webhook configurations read from the cluster, each with where it
    /// came from, or why they could not be read; `None` when the cluster was not asked.
    pub cluster_bundles: Option<Result<CaBundles, String>>,
    /// `http://host:port` of the admin port.
    pub admin_url: Option<String>,
    /// Fewer days than this before the certificate expires is a failure (a warning below 30).
    pub min_days: i64,
    /// Pools and apps at or above this share of held IPs are reported.
    pub exhaustion_ratio: f64,
    pub timeout: Duration,
    /// PEM chain and key to present when the webhook requires client certificates.
    pub client_pem: Option<(Vec<u8>, Vec<u8>)>,
}

#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error("{0:?} is not a {1}://host:port URL")]
    Shape(String, &'static str),
}

/// `(host, port, path)` of `scheme://host[:port][/path]`; IPv6 hosts in brackets.
pub fn split_url(url: &str, scheme: &'static str) -> Result<(String, u16, String), UrlError> {
    let bad = || UrlError::Shape(url.to_string(), scheme);
    let rest = url
        .strip_prefix(scheme)
        .and_then(|r| r.strip_prefix("://"))
        .ok_or_else(bad)?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let default_port = if scheme == "https" { 443 } else { 80 };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(bad)?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| bad())?,
            None if after.is_empty() => default_port,
            None => return Err(bad()),
        };
        (host.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), port.parse().map_err(|_| bad())?),
            None => (authority.to_string(), default_port),
        }
    };
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host, port, path.to_string()))
}

/// The served chain (DER, leaf first) and what the verifier said of it.
type Seen = (Vec<Vec<u8>>, Result<(), String>);

/// Accepts any certificate but remembers the leaf and what the real verifier said of it, so
/// one handshake both inspects and judges the certificate.
#[derive(Debug)]
struct Inspector {
    verifier: Option<Arc<rustls::client::WebPkiServerVerifier>>,
    seen: Mutex<Option<Seen>>,
    schemes: rustls::crypto::WebPkiSupportedAlgorithms,
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
                .map_err(|e| e.to_string()),
            None => Err("not verified: no --ca-file, --ca-bundle or cluster given".to_string()),
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

/// A review that asks for nothing: a Pod CREATE without fixed-IP annotations, dry run.
pub fn harmless_review() -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "ip-webhook-check",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "ip-webhook-check",
            "operation": "CREATE",
            "dryRun": true,
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ip-webhook-check", "namespace": "ip-webhook-check"}},
        }
    }))
    .expect("a JSON value serializes")
}

async fn http_request<S>(
    stream: S,
    method: http::Method,
    host: &str,
    path: &str,
    body: Vec<u8>,
) -> Result<(http::StatusCode, Vec<u8>), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    let driver = tokio::spawn(connection);
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, host)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?
        .to_bytes();
    driver.abort();
    Ok((status, bytes.to_vec()))
}

fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.chars().count() > 200 {
        format!("{}…", text.chars().take(200).collect::<String>())
    } else {
        text.to_string()
    }
}

/// Run every check.
pub async fn run(options: &Options) -> Vec<Check> {
    let mut checks = Vec::new();
    webhook_checks(options, &mut checks).await;
    admin_checks(options, &mut checks).await;
    checks
}

async fn webhook_checks(options: &Options, checks: &mut Vec<Check>) {
    let (host, port, path) = match split_url(&options.url, "https") {
        Ok(parts) => parts,
        Err(e) => return checks.push(check("webhook", Status::Fail, e.to_string())),
    };
    let path = if path.is_empty() {
        "/mutate".to_string()
    } else {
        path
    };
    let provider = crate::server::tls::provider();
    let verifier = match &options.ca_pem {
        None => None,
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
                .filter_map(Result::ok)
                .collect();
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                checks.push(check(
                    "certificate",
                    Status::Fail,
                    "the caBundle holds no PEM certificate",
                ));
                return;
            }
            match rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                provider.clone(),
            )
            .build()
            {
                Ok(v) => Some(v),
                Err(e) => {
                    return checks.push(check(
                        "certificate",
                        Status::Fail,
                        format!("the caBundle is not usable: {e}"),
                    ));
                }
            }
        }
    };
    let inspector = Arc::new(Inspector {
        verifier,
        seen: Mutex::new(None),
        schemes: provider.signature_verification_algorithms,
    });
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("ring supports TLS 1.2 and 1.3")
        .dangerous()
        .with_custom_certificate_verifier(inspector.clone());
    let mut config = match &options.client_pem {
        None => builder.with_no_client_auth(),
        Some((chain, key)) => {
            use rustls::pki_types::pem::PemObject;
            let chain: Result<Vec<_>, _> =
                rustls::pki_types::CertificateDer::pem_slice_iter(chain).collect();
            let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key);
            let identity = match (chain, key) {
                (Ok(chain), Ok(key)) if !chain.is_empty() => builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| e.to_string()),
                (Ok(_), Ok(_)) => {
                    Err("the client certificate file holds no PEM certificate".into())
                }
                (Err(e), _) => Err(format!("the client certificate file: {e}")),
                (_, Err(e)) => Err(format!("the client key file: {e}")),
            };
            match identity {
                Ok(config) => config,
                Err(e) => {
                    return checks.push(check(
                        "webhook",
                        Status::Fail,
                        format!("cannot use the client certificate: {e}"),
                    ));
                }
            }
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = options.server_name.clone().unwrap_or_else(|| host.clone());
    let server_name = match ServerName::try_from(name.clone()) {
        Ok(name) => name,
        Err(e) => {
            return checks.push(check(
                "webhook",
                Status::Fail,
                format!("{name:?} is not a host name: {e}"),
            ));
        }
    };
    let address = format!(
        "{}:{port}",
        if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        }
    );
    let connected = tokio::time::timeout(options.timeout, async {
        let tcp = TcpStream::connect(&address)
            .await
            .map_err(|e| format!("cannot connect to {address}: {e}"))?;
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(server_name, tcp)
            .await
            .map_err(|e| format!("TLS handshake with {address} failed: {e}"))
    })
    .await
    .unwrap_or_else(|_| {
        Err(format!(
            "no answer from {address} within {:?}",
            options.timeout
        ))
    });
    let tls = match connected {
        Ok(tls) => {
            let version = tls
                .get_ref()
                .1
                .protocol_version()
                .map(|v| format!("{v:?}"))
                .unwrap_or_default();
            checks.push(check(
                "reachable",
                Status::Ok,
                format!("{address} answers TLS ({version})"),
            ));
            tls
        }
        Err(e) => return checks.push(check("reachable", Status::Fail, e)),
    };
    let seen = inspector
        .seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    if let Some((chain, verdict)) = seen {
        let leaf = chain.first().cloned().unwrap_or_default();
        checks.push(match verdict {
            Ok(()) => check(
                "certificate",
                Status::Ok,
                format!("valid for {name} and signed by the caBundle"),
            ),
            Err(_) if options.ca_pem.is_none() && options.cluster_bundles.is_some() => check(
                "certificate",
                Status::Skip,
                "no --ca-file or --ca-bundle: judged by the cluster's caBundles (cabundle)",
            ),
            Err(reason) if options.ca_pem.is_none() => check("certificate", Status::Warn, reason),
            Err(reason) => check(
                "certificate",
                Status::Fail,
                format!("the API server would refuse it: {reason}"),
            ),
        });
        if let Some(bundles) = &options.cluster_bundles {
            checks.push(cluster_bundle_check(bundles, &chain, &name));
        }
        checks.push(expiry_check(
            &leaf,
            options.min_days,
            crate::ledger::unix_now() as i64,
        ));
    }
    let host_header = format!("{host}:{port}");
    let answer = tokio::time::timeout(
        options.timeout,
        http_request(
            tls,
            http::Method::POST,
            &host_header,
            &path,
            harmless_review(),
        ),
    )
    .await
    .unwrap_or_else(|_| Err(format!("no answer within {:?}", options.timeout)));
    checks.push(match answer {
        Err(e) => check("admission", Status::Fail, format!("POST {path}: {e}")),
        Ok((status, body)) if status != http::StatusCode::OK => check(
            "admission",
            Status::Fail,
            format!("POST {path} answered {status}: {}", snippet(&body)),
        ),
        Ok((_, body)) => {
            let review: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let response = &review["response"];
            if response["uid"] == "ip-webhook-check" && response["allowed"] == true {
                check(
                    "admission",
                    Status::Ok,
                    format!("POST {path} answered a dry-run review (allowed)"),
                )
            } else {
                check(
                    "admission",
                    Status::Fail,
                    format!(
                        "POST {path} answered an unexpected review: {}",
                        snippet(&body)
                    ),
                )
            }
        }
    });
}

/// Whether `pem` (a caBundle) signs `chain` (leaf first) for `name`, as the API server would
/// check it.
fn verify_with_bundle(pem: &[u8], chain: &[Vec<u8>], name: &str) -> Result<(), String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err("it holds no PEM certificate".into());
    }
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        crate::server::tls::provider(),
    )
    .build()
    .map_err(|e| format!("it is not usable: {e}"))?;
    let (leaf, intermediates) = chain.split_first().ok_or("no certificate was served")?;
    let leaf = CertificateDer::from(leaf.clone());
    let intermediates: Vec<CertificateDer<'_>> = intermediates
        .iter()
        .map(|c| CertificateDer::from(c.clone()))
        .collect();
    let server_name = ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?;
    verifier
        .verify_server_cert(&leaf, &intermediates, &server_name, &[], UnixTime::now())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The webhook configurations' caBundles against the served chain: OK when every one of them
/// signs it (the API server checks each webhook with its own caBundle).
pub fn cluster_bundle_check(
    bundles: &Result<CaBundles, String>,
    chain: &[Vec<u8>],
    name: &str,
) -> Check {
    let bundles = match bundles {
        Ok(bundles) => bundles,
        Err(why) => return check("cabundle", Status::Fail, why.clone()),
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
                Err("it has no caBundle".to_string())
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
pub fn expiry_check(leaf_der: &[u8], min_days: i64, now: i64) -> Check {
    let Some(not_after) = crate::server::tls::not_after(leaf_der) else {
        return check(
            "expiry",
            Status::Fail,
            "the served certificate cannot be parsed",
        );
    };
    let seconds = not_after - now;
    let days = seconds.div_euclid(86_400);
    let when = crate::ipam::usage::rfc3339(not_after.max(0) as u64);
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

async fn admin_get(
    options: &Options,
    host: &str,
    port: u16,
    path: &str,
) -> Result<(http::StatusCode, Vec<u8>), String> {
    let address = format!(
        "{}:{port}",
        if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_string()
        }
    );
    tokio::time::timeout(options.timeout, async {
        let tcp = TcpStream::connect(&address)
            .await
            .map_err(|e| format!("cannot connect to {address}: {e}"))?;
        http_request(tcp, http::Method::GET, &address, path, Vec::new()).await
    })
    .await
    .unwrap_or_else(|_| {
        Err(format!(
            "no answer from {address} within {:?}",
            options.timeout
        ))
    })
}

async fn admin_checks(options: &Options, checks: &mut Vec<Check>) {
    let Some(url) = &options.admin_url else {
        for name in ["ready", "capacity", "leader"] {
            checks.push(check(name, Status::Skip, "no --admin-url given"));
        }
        return;
    };
    let (host, port, _) = match split_url(url, "http") {
        Ok(parts) => parts,
        Err(e) => return checks.push(check("ready", Status::Fail, e.to_string())),
    };
    checks.push(match admin_get(options, &host, port, "/readyz").await {
        Ok((status, _)) if status == http::StatusCode::OK => check(
            "ready",
            Status::Ok,
            "/readyz answers 200 (ledger loaded, caches synced)",
        ),
        Ok((status, body)) => check(
            "ready",
            Status::Fail,
            format!("/readyz answers {status}: {}", snippet(&body)),
        ),
        Err(e) => check("ready", Status::Fail, e),
    });
    match admin_get(options, &host, port, "/metrics").await {
        Ok((status, body)) if status == http::StatusCode::OK => {
            let text = String::from_utf8_lossy(&body);
            checks.push(capacity_check(&text, options.exhaustion_ratio));
            checks.push(leader_check(&text));
        }
        Ok((status, body)) => checks.push(check(
            "capacity",
            Status::Fail,
            format!("/metrics answers {status}: {}", snippet(&body)),
        )),
        Err(e) => checks.push(check("capacity", Status::Fail, e)),
    }
}

/// One sample of the text exposition: name, labels as written, value.
fn samples<'t>(text: &'t str, name: &str) -> Vec<(&'t str, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(rest) => {
                    let (labels, value) = rest.split_once('}')?;
                    (labels, value)
                }
                None if rest.starts_with(' ') => ("", rest),
                None => return None,
            };
            Some((labels, value.split_whitespace().next()?.parse().ok()?))
        })
        .collect()
}

fn label<'t>(labels: &'t str, key: &str) -> &'t str {
    labels
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().trim_matches('"'))
        .unwrap_or("")
}

/// Pools and apps whose held share is at least `ratio`, and pods refused for exhaustion.
pub fn capacity_check(metrics: &str, ratio: f64) -> Check {
    let mut near = Vec::new();
    for (labels, value) in samples(metrics, "ip_webhook_pool_utilization_ratio") {
        if value >= ratio {
            near.push(format!(
                "FixedIPPool {} {:.0}% held",
                label(labels, "pool"),
                value * 100.0
            ));
        }
    }
    for (labels, value) in samples(metrics, "ip_webhook_app_utilization_ratio") {
        if value >= ratio {
            near.push(format!(
                "app {}/{} {:.0}% held",
                label(labels, "app_namespace"),
                label(labels, "app"),
                value * 100.0
            ));
        }
    }
    let refused: Vec<String> = samples(metrics, "ip_webhook_exhausted_refusals_total")
        .into_iter()
        .filter(|(_, v)| *v > 0.0)
        .map(|(labels, v)| {
            format!(
                "{}/{} refused {v} pods",
                label(labels, "app_namespace"),
                label(labels, "app")
            )
        })
        .collect();
    if near.is_empty() && refused.is_empty() {
        return check(
            "capacity",
            Status::Ok,
            format!("no pool or app at {:.0}% or more", ratio * 100.0),
        );
    }
    let mut detail = near.join(", ");
    if !refused.is_empty() {
        if !detail.is_empty() {
            detail.push_str("; ");
        }
        detail.push_str(&format!("exhausted since start: {}", refused.join(", ")));
    }
    check("capacity", Status::Warn, detail)
}

/// Whether this replica leads, when the metrics expose the Lease (in-cluster only).
pub fn leader_check(metrics: &str) -> Check {
    let leases = samples(metrics, "ip_webhook_leader");
    match leases.first() {
        None => check(
            "leader",
            Status::Skip,
            "the metrics expose no Lease (off-cluster or etcd ledger: no leader needed)",
        ),
        Some((labels, value)) if *value >= 1.0 => check(
            "leader",
            Status::Ok,
            format!("this replica holds Lease {}", label(labels, "lease")),
        ),
        Some((labels, _)) => check(
            "leader",
            Status::Warn,
            format!(
                "this replica does not hold Lease {}; check `kubectl get lease {}` names a live replica",
                label(labels, "lease"),
                label(labels, "lease")
            ),
        ),
    }
}

/// The report, one line per check.
pub fn to_text(checks: &[Check]) -> String {
    let rows: Vec<Vec<String>> = checks
        .iter()
        .map(|c| vec![c.status.to_string(), c.name.to_string(), c.detail.clone()])
        .collect();
    crate::ops::status::table(&["STATUS", "CHECK", "DETAIL"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            split_url("https://10.0.0.1:8443", "https").unwrap(),
            ("10.0.0.1".into(), 8443, "".into())
        );
        assert_eq!(
            split_url("https://[::1]:9/x", "https").unwrap(),
            ("::1".into(), 9, "/x".into())
        );
        assert_eq!(
            split_url("http://svc.ns.svc", "http").unwrap(),
            ("svc.ns.svc".into(), 80, "".into())
        );
        assert!(split_url("svc:8443", "https").is_err());
        assert!(split_url("https://host:port", "https").is_err());
    }

    #[test]
    fn capacity_reads_the_ratios_and_refusals() {
        let text = "# HELP x\nip_webhook_pool_utilization_ratio{pool=\"blue\"} 0.95\nip_webhook_pool_utilization_ratio{pool=\"red\"} 0.5\nip_webhook_app_utilization_ratio{app_namespace=\"prod\",app=\"web\"} 1.0\nip_webhook_exhausted_refusals_total{app_namespace=\"prod\",app=\"web\",pool=\"\"} 3\n";
        let result = capacity_check(text, 0.9);
        assert_eq!(result.status, Status::Warn);
        assert_eq!(
            result.detail,
            "FixedIPPool blue 95% held, app prod/web 100% held; exhausted since start: prod/web refused 3 pods"
        );
        assert_eq!(
            capacity_check("ip_webhook_pool_utilization_ratio{pool=\"red\"} 0.5\n", 0.9).status,
            Status::Ok
        );
    }

    #[test]
    fn leader_is_skipped_without_a_lease() {
        assert_eq!(
            leader_check("ip_webhook_requests_total 1\n").status,
            Status::Skip
        );
        assert_eq!(
            leader_check("ip_webhook_leader{lease=\"ip-webhook\"} 1\n").status,
            Status::Ok
        );
        assert_eq!(
            leader_check("ip_webhook_leader{lease=\"ip-webhook\"} 0\n").status,
            Status::Warn
        );
    }
}
