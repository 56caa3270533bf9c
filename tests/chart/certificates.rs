//! The serving certificate: cert-manager's, an external one, and the one Helm generates,
//! trusted through the caBundle for the Service name.

use super::*;

#[test]
fn defaults_render_the_cert_manager_certificate_and_a_hardened_deployment() {
    let helm = helm();
    let docs = render(&helm, &[], "1.31.0");

    let issuer = one(&docs, "Issuer");
    assert_eq!(issuer["metadata"]["namespace"], NAMESPACE);
    assert_eq!(issuer["spec"], json!({"selfSigned": {}}));
    let certificate = one(&docs, "Certificate");
    assert_eq!(certificate["metadata"]["name"], "ip-webhook-serving-cert");
    assert_eq!(certificate["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        certificate["spec"]["dnsNames"],
        json!([
            "ip-webhook",
            "ip-webhook.ip-webhook-system",
            "ip-webhook.ip-webhook-system.svc",
            "ip-webhook.ip-webhook-system.svc.cluster.local"
        ])
    );
    assert_eq!(
        certificate["spec"]["issuerRef"],
        json!({"group": "cert-manager.io", "kind": "Issuer", "name": issuer["metadata"]["name"]})
    );
    assert_eq!(certificate["spec"]["secretName"], "ip-webhook-tls");

    let deployment = one(&docs, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert!(
        pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            .is_array()
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let security = &pod["containers"][0]["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    let resources = &pod["containers"][0]["resources"];
    assert!(resources["requests"]["cpu"].is_string() && resources["limits"]["memory"].is_string());
    // The TLS Secret is mounted as a whole directory: subPath mounts never see a renewal.
    let tls_volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == "ip-webhook-tls")
        .expect("a volume from the TLS Secret");
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == tls_volume["name"])
        .expect("the TLS volume is mounted");
    assert!(mount.get("subPath").is_none());
    assert!(args(&docs).contains(&format!(
        "--tls-cert-file={}/tls.crt",
        mount["mountPath"].as_str().unwrap()
    )));
    // Graceful shutdown: the grace period covers preStop sleep and --shutdown-grace.
    assert!(args(&docs).contains(&"--shutdown-grace=25s".to_string()));
    assert_eq!(
        pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"],
        5
    );
    assert_eq!(pod["terminationGracePeriodSeconds"], 25 + 5 + 5);
    assert!(args(&docs).contains(&"--ledger=kubernetes".to_string()));

    assert!(pod.get("hostNetwork").is_none() && pod.get("dnsPolicy").is_none());
    assert_eq!(deployment["spec"]["strategy"]["type"], "RollingUpdate");
    let state = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "state")
        .expect("a state volume");
    assert!(state["emptyDir"].is_object(), "{state}");
    assert!(of_kind(&docs, "PersistentVolumeClaim").is_empty());

    let pdb = one(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let service = one(&docs, "Service");
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    assert!(of_kind(&docs, "ServiceMonitor").is_empty());
    // CRDs are the ones `ip-webhook crds` prints.
    let crd_names: BTreeSet<&str> = of_kind(&docs, "CustomResourceDefinition")
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        crd_names,
        BTreeSet::from(["fixedippools.ip-webhook.io", "ipclaims.ip-webhook.io"])
    );
}

#[test]
fn external_certificate_keeps_the_documented_names_and_injection() {
    let helm = helm();
    let docs = render(
        &helm,
        &["validatingWebhook.certificate.create=false"],
        "1.31.0",
    );
    assert!(of_kind(&docs, "Certificate").is_empty());
    assert!(of_kind(&docs, "Issuer").is_empty());
    assert!(of_kind(&docs, "Secret").is_empty());
    let inject = format!("{NAMESPACE}/ip-webhook-serving-cert");
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let config = one(&docs, kind);
        assert_eq!(
            config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            inject
        );
        for entry in config["webhooks"].as_array().unwrap() {
            assert!(entry["clientConfig"].get("caBundle").is_none());
        }
    }
    let volumes = &one(&docs, "Deployment")["spec"]["template"]["spec"]["volumes"];
    assert!(
        volumes
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["secret"]["secretName"] == "ip-webhook-tls")
    );
    // The names docs/install.md tells people to create.
    let guide = std::fs::read_to_string(repo().join("docs/install.md")).unwrap();
    assert!(guide.contains("name: ip-webhook-serving-cert"));
    assert!(guide.contains("secretName: ip-webhook-tls"));
}

fn decode(b64: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(b64.as_str().expect("base64 string"))
        .expect("valid base64")
}

#[tokio::test]
async fn helm_generated_certificate_is_trusted_through_ca_bundle_for_the_service_name() {
    let helm = helm();
    let docs = render(
        &helm,
        &["validatingWebhook.certificate.source=helm"],
        "1.31.0",
    );
    assert!(of_kind(&docs, "Certificate").is_empty());
    assert!(of_kind(&docs, "Issuer").is_empty());
    let secret = one(&docs, "Secret");
    assert_eq!(secret["metadata"]["name"], "ip-webhook-tls");
    assert_eq!(secret["type"], "kubernetes.io/tls");
    let ca = decode(&secret["data"]["ca.crt"]);
    let mut bundles = BTreeSet::new();
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let config = one(&docs, kind);
        assert!(config["metadata"].get("annotations").is_none());
        for entry in config["webhooks"].as_array().unwrap() {
            bundles.insert(decode(&entry["clientConfig"]["caBundle"]));
        }
    }
    assert_eq!(
        bundles,
        BTreeSet::from([ca.clone()]),
        "every caBundle is the Secret's ca.crt"
    );

    // The real server loads the Secret's files, and a client that trusts only caBundle
    // completes a handshake under the name the API server dials.
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    std::fs::write(&cert, decode(&secret["data"]["tls.crt"])).unwrap();
    std::fs::write(&key, decode(&secret["data"]["tls.key"])).unwrap();
    let config = common::with_cert_files(
        dir.path(),
        &cert,
        &key,
        common::serve_config(dir.path()).tls_reload_interval,
    );
    let launched = ip_webhook::app::launch(&config)
        .await
        .expect("server starts");
    let addr = launched.running.https_addr;
    for name in [
        "ip-webhook",
        "ip-webhook.ip-webhook-system",
        SERVICE_DNS,
        "ip-webhook.ip-webhook-system.svc.cluster.local",
    ] {
        let status = https_post_status(addr, &ca, name, "/mutate").await;
        assert_eq!(status, Ok(200), "as {name}");
    }
    let wrong = https_post_status(addr, &ca, "other.ip-webhook-system.svc", "/mutate").await;
    assert!(
        wrong.is_err(),
        "a name outside the SANs must fail: {wrong:?}"
    );
    launched.shutdown().await;
}

/// POST an AdmissionReview over TLS with SNI `server_name`; the HTTP status or the TLS error.
async fn https_post_status(
    addr: std::net::SocketAddr,
    ca_pem: &[u8],
    server_name: &str,
    path: &str,
) -> Result<u16, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = common::client_config(ca_pem);
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string())
        .map_err(|e| e.to_string())?;
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let body = common::create(
        "0df28fbd-5f5f-11e8-bc74-36e6bb280816",
        common::pod("default", "web", "web-", None),
    )
    .to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {server_name}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    tls.read_to_end(&mut reply)
        .await
        .map_err(|e| e.to_string())?;
    let reply = text(&reply);
    let status = reply
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no HTTP status in {reply:?}"))?;
    Ok(status)
}
