//! `check`: a doctor for a running install. Each check reports OK, WARN, FAIL or SKIP with
//! what it saw; any FAIL makes the command exit non-zero.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde::Serialize;
use tokio::net::TcpStream;

mod certs;
mod client_auth;
mod prometheus;
mod url;

use certs::{CertError, Inspector, cluster_bundle_check, expiry_check};
use client_auth::{ClientIdentity, alert_in};
use prometheus::{capacity_check, leader_check};
pub(crate) use url::split_url;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub(crate) enum Status {
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
pub(crate) struct Check {
    pub(crate) name: &'static str,
    pub(crate) status: Status,
    pub(crate) detail: String,
}

fn check(name: &'static str, status: Status, detail: impl Into<String>) -> Check {
    Check {
        name,
        status,
        detail: detail.into(),
    }
}

/// caBundles (PEM), each with the webhook it belongs to.
pub(crate) type CaBundles = Vec<(String, Vec<u8>)>;

/// Why `check` could not reach or read what a check looks at; `Display` is the check's detail.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum Unreached {
    #[error("cannot connect to {address}: {reason}")]
    Connect { address: String, reason: String },
    #[error("TLS handshake with {address} failed: {reason}")]
    Handshake { address: String, reason: String },
    #[error("no answer from {address} within {timeout:?}")]
    NoAnswer { address: String, timeout: Duration },
    /// The HTTP request on the connection failed.
    #[error("{0}")]
    Request(String),
    /// The webhook configurations could not be read from the cluster: the causes, outermost
    /// first.
    #[error("{0}")]
    Cluster(String),
}

#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// `https://host:port` (a path, if any, replaces `/mutate`).
    pub(crate) url: String,
    /// PEM of the CA the API server trusts (the webhook configuration's caBundle).
    pub(crate) ca_pem: Option<Vec<u8>>,
    /// The name to verify the certificate for and send as SNI (through a port-forward: the
    /// Service's `<svc>.<namespace>.svc`); default: the URL's host.
    pub(crate) server_name: Option<String>,
    /// The caBundles of the webhook configurations read from the cluster, each with where it
    /// came from, or why they could not be read; `None` when the cluster was not asked.
    pub(crate) cluster_bundles: Option<Result<CaBundles, Unreached>>,
    /// `http://host:port` of the admin port.
    pub(crate) admin_url: Option<String>,
    /// Fewer days than this before the certificate expires is a failure (a warning below 30).
    pub(crate) min_days: i64,
    /// Pools and apps at or above this share of held IPs are reported.
    pub(crate) exhaustion_ratio: f64,
    pub(crate) timeout: Duration,
    /// PEM chain and key to present when the webhook requires client certificates.
    pub(crate) client_pem: Option<(Vec<u8>, Vec<u8>)>,
}

/// A review that asks for nothing: a Pod CREATE without fixed-IP annotations, dry run.
pub(crate) fn harmless_review() -> Vec<u8> {
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

/// What a request's failure said, and the TLS alert behind it if the server sent one.
type Failure = (String, Option<rustls::AlertDescription>);

async fn http_request<S>(
    stream: S,
    method: http::Method,
    host: &str,
    path: &str,
    body: Vec<u8>,
) -> Result<(http::StatusCode, Vec<u8>), Failure>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| (format!("HTTP handshake: {e}"), alert_in(&e)))?;
    let mut driver = tokio::spawn(connection);
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, host)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| (e.to_string(), None))?;
    let response = match sender.send_request(request).await {
        Ok(response) => response,
        Err(e) => {
            // the request only hears "canceled"; the connection holds what the server said
            let alert = match tokio::time::timeout(Duration::from_secs(1), &mut driver).await {
                Ok(Ok(Err(connection))) => alert_in(&connection),
                _ => None,
            }
            .or_else(|| alert_in(&e));
            driver.abort();
            return Err((format!("request failed: {e}"), alert));
        }
    };
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| (format!("reading the answer: {e}"), alert_in(&e)))?
        .to_bytes();
    driver.abort();
    Ok((status, bytes.to_vec()))
}

/// A PEM chain and key as rustls presents them.
fn certified_key(chain: &[u8], key: &[u8]) -> Result<rustls::sign::CertifiedKey, CertError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain)
        .collect::<Result<_, _>>()
        .map_err(CertError::ClientCertFile)?;
    if chain.is_empty() {
        return Err(CertError::NoClientCert);
    }
    let key =
        rustls::pki_types::PrivateKeyDer::from_pem_slice(key).map_err(CertError::ClientKeyFile)?;
    rustls::sign::CertifiedKey::from_der(chain, key, &crate::server::tls::provider())
        .map_err(CertError::from)
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
pub(crate) async fn run(options: &Options) -> Vec<Check> {
    let mut checks = Vec::new();
    webhook_checks(options, &mut checks).await;
    admin_checks(options, &mut checks).await;
    checks
}

/// The webhook's port, checked in order: TLS reachable, its certificate, an admission answer.
/// A step that fails ends the list, since the next would only repeat its failure.
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
    let client = match Client::new(options, &host) {
        Ok(client) => client,
        Err(failed) => return checks.push(failed),
    };
    let address = format!(
        "{}:{port}",
        if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        }
    );
    let tls = match client.connect(&address, options.timeout).await {
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
        Err(e) => return checks.push(check("reachable", Status::Fail, e.to_string())),
    };
    certificate_checks(options, &client, checks);
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
    .unwrap_or_else(|_| Err((format!("no answer within {:?}", options.timeout), None)));
    checks.push(admission_check(&path, answer, &client.identity));
}

/// The TLS client `check` connects with: it records the chain the server presents (and the
/// verdict of the caBundle on it) instead of refusing it, so every later check can say why.
struct Client {
    config: Arc<rustls::ClientConfig>,
    inspector: Arc<Inspector>,
    identity: Arc<ClientIdentity>,
    /// The name the certificate is judged for (and sent as SNI).
    name: String,
    server_name: ServerName<'static>,
}

impl Client {
    fn new(options: &Options, host: &str) -> Result<Self, Check> {
        let provider = crate::server::tls::provider();
        let verifier = options
            .ca_pem
            .as_deref()
            .map(|pem| ca_verifier(pem, &provider))
            .transpose()?;
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
        let key = options
            .client_pem
            .as_ref()
            .map(|(chain, key)| certified_key(chain, key))
            .transpose()
            .map_err(|e| {
                check(
                    "webhook",
                    Status::Fail,
                    format!("cannot use the client certificate: {e}"),
                )
            })?;
        let identity = Arc::new(ClientIdentity::new(key));
        let mut config = builder.with_client_cert_resolver(identity.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = options
            .server_name
            .clone()
            .unwrap_or_else(|| host.to_string());
        let server_name = ServerName::try_from(name.clone()).map_err(|e| {
            check(
                "webhook",
                Status::Fail,
                format!("{name:?} is not a host name: {e}"),
            )
        })?;
        Ok(Client {
            config: Arc::new(config),
            inspector,
            identity,
            name,
            server_name,
        })
    }

    async fn connect(
        &self,
        address: &str,
        timeout: Duration,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, Unreached> {
        let connected = async {
            let tcp = TcpStream::connect(address)
                .await
                .map_err(|e| Unreached::Connect {
                    address: address.to_string(),
                    reason: e.to_string(),
                })?;
            tokio_rustls::TlsConnector::from(self.config.clone())
                .connect(self.server_name.clone(), tcp)
                .await
                .map_err(|e| Unreached::Handshake {
                    address: address.to_string(),
                    reason: self
                        .identity
                        .refusal(alert_in(&e))
                        .unwrap_or_else(|| e.to_string()),
                })
        };
        tokio::time::timeout(timeout, connected)
            .await
            .unwrap_or_else(|_| {
                Err(Unreached::NoAnswer {
                    address: address.to_string(),
                    timeout,
                })
            })
    }
}

/// The verifier of the caBundle given with `--ca-file`/`--ca-bundle`.
fn ca_verifier(
    pem: &[u8],
    provider: &Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<rustls::client::WebPkiServerVerifier>, Check> {
    let mut roots = rustls::RootCertStore::empty();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(check(
            "certificate",
            Status::Fail,
            "the caBundle holds no PEM certificate",
        ));
    }
    rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| {
            check(
                "certificate",
                Status::Fail,
                format!("the caBundle is not usable: {e}"),
            )
        })
}

/// What the chain the server presented says: whether the caBundle (or the cluster's) signs it
/// for the name, and how long it has left.
fn certificate_checks(options: &Options, client: &Client, checks: &mut Vec<Check>) {
    let seen = client
        .inspector
        .seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    let Some((chain, verdict)) = seen else {
        return;
    };
    let name = &client.name;
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
        Err(reason) if options.ca_pem.is_none() => {
            check("certificate", Status::Warn, reason.to_string())
        }
        Err(reason) => check(
            "certificate",
            Status::Fail,
            format!("the API server would refuse it: {reason}"),
        ),
    });
    if let Some(bundles) = &options.cluster_bundles {
        checks.push(cluster_bundle_check(bundles, &chain, name));
    }
    checks.push(expiry_check(
        &leaf,
        options.min_days,
        ip_webhook_ledger::unix_now() as i64,
    ));
}

/// Whether the harmless dry-run review got the answer a working webhook gives.
fn admission_check(
    path: &str,
    answer: Result<(http::StatusCode, Vec<u8>), Failure>,
    identity: &ClientIdentity,
) -> Check {
    match answer {
        Err((e, alert)) => {
            let e = identity.refusal(alert).unwrap_or(e);
            check("admission", Status::Fail, format!("POST {path}: {e}"))
        }
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
    }
}

async fn admin_get(
    options: &Options,
    host: &str,
    port: u16,
    path: &str,
) -> Result<(http::StatusCode, Vec<u8>), Unreached> {
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
            .map_err(|e| Unreached::Connect {
                address: address.clone(),
                reason: e.to_string(),
            })?;
        http_request(tcp, http::Method::GET, &address, path, Vec::new())
            .await
            .map_err(|(e, _)| Unreached::Request(e))
    })
    .await
    .unwrap_or_else(|_| {
        Err(Unreached::NoAnswer {
            address: address.clone(),
            timeout: options.timeout,
        })
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
        Err(e) => check("ready", Status::Fail, e.to_string()),
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
        Err(e) => checks.push(check("capacity", Status::Fail, e.to_string())),
    }
}

/// The report, one line per check.
pub(crate) fn to_text(checks: &[Check]) -> String {
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
