//! The builder: a [`ServeConfig`] (or a [`WebhookConfig`] for `review`) becomes a running
//! process: the ledger, the allocator over it, the pools, TLS, the servers and, with an API
//! server, the cluster's watches and reconciler. The configuration is plain data made by the
//! command line (`cli/`) or by a test.

mod config;

pub use config::*;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use base64::Engine;

use crate::cluster::ClusterHandle;
use crate::cluster::pods::PodDirectory;
use crate::decisions::Webhook;
use crate::decisions::secondary::SecondaryNetworks;
use crate::metrics::Metrics;
use crate::server::tls::{self, CertFiles, CertResolver};
use crate::server::{self, Running};
use ip_webhook_ipam::allocator::Allocator;
use ip_webhook_ipam::pools::PoolCatalog;
#[cfg(feature = "etcd")]
use ip_webhook_ledger::EtcdLedger;
use ip_webhook_ledger::crd::FixedIPPool;
use ip_webhook_ledger::pod_lookup::PodLookup;
use ip_webhook_ledger::{ApiServer, Ledger, LedgerConfig, OpenOptions, Opened, TimedLedger};

/// What [`build`] made; `api_server` is the kubernetes ledger's.
pub struct Built {
    pub webhook: Arc<Webhook>,
    pub ledger: Arc<dyn Ledger>,
    pub(crate) api_server: Option<ApiServer>,
}

/// Open the ledger (as `options` say), rebuild the allocator's index from it, load the pools
/// (with the kubernetes ledger: list the IPClaims and FixedIPPools before any decision).
pub async fn build(
    config: &WebhookConfig,
    metrics: Arc<Metrics>,
    options: &OpenOptions,
) -> anyhow::Result<Built> {
    let options = OpenOptions {
        counters: metrics.ledger.clone(),
        ..options.clone()
    };
    let Opened {
        ledger,
        api_server,
        #[cfg(feature = "etcd")]
        etcd,
    } = ip_webhook_ledger::open(&config.ledger, &options).await?;
    let ledger = TimedLedger::wrap_watched(
        ledger,
        metrics.ledger_latency.clone(),
        metrics.ledger_health.clone(),
    );
    let sticky_grace = config.settings.sticky_grace.as_secs();
    let allocator = Arc::new(
        Allocator::keeping_sticky(ledger.clone(), sticky_grace)
            .await
            .context("loading the ledger")?,
    );
    #[cfg(feature = "etcd")]
    if let Some(etcd) = etcd {
        spawn_etcd_watch(etcd, Arc::downgrade(&allocator));
    }
    let pools = pools(config.pools_file.as_deref(), api_server.as_ref()).await?;
    let secondary = secondary_networks(config, &metrics, &options).await?;
    let mut webhook =
        Webhook::new(config.settings.clone(), allocator, pools, metrics).with_secondary(secondary);
    for user in &config.trusted_usernames {
        webhook.claim_guard.trust(user);
    }
    if let Some(api_server) = &api_server {
        webhook = webhook.with_events(Arc::new(crate::cluster::events::KubeEvents::new(
            api_server.watches.clone(),
            config.instance.clone(),
        )));
    }
    Ok(Built {
        webhook: Arc::new(webhook),
        ledger,
        api_server,
    })
}

/// An allocator for each secondary network, over its own books in the ledger `config`
/// names (opened as `options` say).
async fn secondary_networks(
    config: &WebhookConfig,
    metrics: &Arc<Metrics>,
    options: &OpenOptions,
) -> anyhow::Result<SecondaryNetworks> {
    let mut by_network = std::collections::BTreeMap::new();
    for network in &config.networks {
        let options = OpenOptions {
            network: Some(network.clone()),
            ..options.clone()
        };
        let opened = ip_webhook_ledger::open(&config.ledger, &options)
            .await
            .with_context(|| format!("opening the claims of secondary network {network}"))?;
        let ledger = TimedLedger::wrap_watched(
            opened.ledger,
            metrics.ledger_latency.clone(),
            metrics.ledger_health.clone(),
        );
        let allocator = Arc::new(
            Allocator::keeping_sticky(ledger, config.settings.sticky_grace.as_secs())
                .await
                .with_context(|| format!("loading the claims of secondary network {network}"))?,
        );
        #[cfg(feature = "etcd")]
        if let Some(etcd) = opened.etcd {
            spawn_etcd_watch(etcd, Arc::downgrade(&allocator));
        }
        by_network.insert(network.clone(), allocator);
    }
    Ok(SecondaryNetworks::new(by_network))
}

/// The pools decisions draw from: the file's, or the API server's FixedIPPools (those that
/// are valid, oldest first), or none.
pub(crate) async fn pools(
    pools_file: Option<&std::path::Path>,
    api_server: Option<&ApiServer>,
) -> anyhow::Result<PoolCatalog> {
    match (pools_file, api_server) {
        (Some(_), Some(_)) => anyhow::bail!(
            "--pools-file is for off-cluster use; with the kubernetes ledger, pools are FixedIPPool objects"
        ),
        (Some(path), None) => Ok(PoolCatalog::from_file(path)?),
        (None, Some(api_server)) => {
            let list = kube::Api::<FixedIPPool>::all(api_server.admission.clone())
                .list(&Default::default())
                .await
                .with_context(|| format!("listing FixedIPPools from {}", api_server.name))?;
            Ok(crate::cluster::tolerant_catalog(
                &list
                    .items
                    .into_iter()
                    .map(|p| (p.metadata.name.clone().unwrap_or_default(), p))
                    .collect(),
            ))
        }
        (None, None) => Ok(PoolCatalog::default()),
    }
}

/// Keep the allocator's index in step with claims other replicas make and release in etcd.
/// Ends when the ledger is closed or the allocator is gone.
#[cfg(feature = "etcd")]
fn spawn_etcd_watch(ledger: Arc<EtcdLedger>, allocator: std::sync::Weak<Allocator>) {
    tokio::spawn(async move {
        ledger
            .watch(
                |change| {
                    if let Some(allocator) = allocator.upgrade() {
                        allocator.apply_observed(change);
                    }
                },
                |claims| {
                    if let Some(allocator) = allocator.upgrade() {
                        // etcd: a released record locks its IP only while kept (sticky)
                        allocator
                            .replace_all(claims.into_iter().filter(|c| c.locks_ip()).collect());
                    }
                },
            )
            .await;
    });
}

/// Ask the ledger whether it can serve every second (bounded to 2 s a call), so `/readyz`
/// turns 503 while it cannot even when no admission arrives, and 200 again once it can.
fn spawn_ledger_prober(
    ledger: Arc<dyn Ledger>,
    health: Arc<ip_webhook_ledger::health::LedgerHealth>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(std::time::Duration::from_secs(1));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match tokio::time::timeout(std::time::Duration::from_secs(2), ledger.ping()).await {
                Ok(Ok(())) | Ok(Err(ip_webhook_ledger::LedgerError::Corrupt { .. })) => {}
                Ok(Err(ip_webhook_ledger::LedgerError::Closed)) => return,
                Ok(Err(_)) => {} // counted by the timed ledger
                Err(_) => health.failure("a ping got no answer within 2s"),
            }
        }
    })
}

/// A started server and what it needs to stop cleanly.
pub struct Launched {
    pub running: Running,
    pub webhook: Arc<Webhook>,
    pub ledger: Arc<dyn Ledger>,
    /// base64 of the CA that signed the serving certificate, when self-signed.
    pub(crate) ca_bundle: Option<String>,
    /// The watches and the reconciler, with the kubernetes ledger; the leak sweeper with
    /// another ledger when there is an API server.
    pub cluster: Option<ClusterHandle>,
    reloaders: Vec<tokio::task::JoinHandle<()>>,
    /// The primary interface's, and one per secondary network.
    release_timers: Vec<tokio::task::JoinHandle<()>>,
}

impl Launched {
    /// Stop accepting, finish in-flight admissions, flush the ledger.
    pub async fn shutdown(self) {
        self.running.shutdown().await;
        for timer in self.release_timers {
            timer.abort();
        }
        for reloader in self.reloaders {
            reloader.abort();
        }
        if let Some(cluster) = &self.cluster {
            cluster.shutdown().await;
        }
        self.ledger.close().await;
        for (_, allocator) in self.webhook.secondary.iter() {
            allocator.ledger().close().await;
        }
    }
}

/// Keep the process's memory off transparent huge pages. The allocator asks for them
/// (mimalloc `madvise`s its arenas), and the first touch of each one clears 2 MiB at once: on
/// the benchmark's VM that held the one request thread, or the ledger writer, for about 4 ms
/// each time the heap grew by 2 MiB, which a growing claim index does all the time. Small
/// pages spread the same clearing over many faults of microseconds.
fn avoid_huge_page_stalls() {
    #[cfg(target_os = "linux")]
    if let Err(error) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::debug!(%error, "transparent huge pages stay enabled");
    }
}

/// Limits a server could not work with: a review it could never read, no connection slot.
fn check_limits(limits: &server::Limits) -> anyhow::Result<()> {
    if limits.max_inflight_bytes < server::MAX_BODY_BYTES {
        anyhow::bail!(
            "--max-inflight-bytes {} is less than one largest review ({} bytes, 7Mi): such a review could never be read",
            limits.max_inflight_bytes,
            server::MAX_BODY_BYTES
        );
    }
    if limits.max_connections == 0 {
        anyhow::bail!("--max-connections must be at least 1");
    }
    if limits.max_handshakes == 0 || limits.max_handshakes > limits.max_connections {
        anyhow::bail!(
            "--max-handshakes {} must be between 1 and --max-connections ({})",
            limits.max_handshakes,
            limits.max_connections
        );
    }
    if limits.handshake.is_zero() {
        anyhow::bail!("--handshake-timeout must be more than zero");
    }
    Ok(())
}

/// The serving certificate: its resolver, the task that reloads its files, and the CA bundle
/// when self-signed.
type Serving = (
    Arc<CertResolver>,
    Option<tokio::task::JoinHandle<()>>,
    Option<String>,
);

fn serving_certificate(config: &ServeConfig, metrics: &Arc<Metrics>) -> anyhow::Result<Serving> {
    match &config.tls {
        TlsConfig::Files { cert, key } => {
            let files = CertFiles {
                cert: cert.clone(),
                key: key.clone(),
            };
            let (certified, fingerprint) = files.load()?;
            if let Some(leaf) = certified.cert.first() {
                tls::served_certificate(metrics, leaf);
            }
            let resolver = Arc::new(CertResolver::new(certified));
            let reloader = tls::spawn_reloader(
                resolver.clone(),
                files,
                fingerprint,
                config.tls_reload_interval,
                metrics.clone(),
            );
            Ok((resolver, Some(reloader), None))
        }
        TlsConfig::SelfSigned { dns_names } => {
            let (generated, kept) =
                crate::server::certs::self_signed_in(&config.state_dir, dns_names)?;
            tracing::info!(
                new_ca = kept.new_ca,
                new_certificate = kept.new_cert,
                "self-signed TLS from {}",
                config.state_dir.display()
            );
            let certified = generated.certified_key()?;
            if let Some(leaf) = certified.cert.first() {
                tls::served_certificate(metrics, leaf);
            }
            let bundle =
                base64::engine::general_purpose::STANDARD.encode(generated.ca_pem.as_bytes());
            Ok((Arc::new(CertResolver::new(certified)), None, Some(bundle)))
        }
    }
}

/// The client-certificate verifier of `--client-ca-file`, and the task that reloads it.
fn client_verifier(
    client_ca: &ClientCaConfig,
    reload_interval: std::time::Duration,
    metrics: Arc<Metrics>,
) -> anyhow::Result<(Arc<tls::ClientVerifier>, tokio::task::JoinHandle<()>)> {
    let path = &client_ca.file;
    let (contents, digest) = tls::read_all(std::slice::from_ref(path));
    let pem = contents?.remove(0);
    let verifier = Arc::new(tls::ClientVerifier::new(
        tls::client_ca_verifier(&pem, &path.display().to_string())?,
        client_ca.allowed_names.clone(),
    ));
    let reloader = tls::spawn_client_ca_reloader(
        verifier.clone(),
        path.clone(),
        digest,
        reload_interval,
        metrics,
    );
    Ok((verifier, reloader))
}

/// Start what `config` describes: the ledger and the decisions, HTTPS and the admin server,
/// the release timer and, with an API server, the cluster's watches (or the leak sweeper).
pub async fn launch(config: &ServeConfig) -> anyhow::Result<Launched> {
    avoid_huge_page_stalls();
    check_limits(&config.limits)?;
    let metrics = Arc::new(Metrics::new());
    metrics.set_max_apps(config.metrics_max_apps);
    let Built {
        webhook,
        ledger,
        api_server,
    } = build(&config.webhook, metrics.clone(), &OpenOptions::default()).await?;
    // Bound before the self-signed CA is written: a busy port leaves no new CA behind.
    let listeners = server::bind(config.listen, config.admin_listen).await?;
    let (resolver, reloader, ca_bundle) = serving_certificate(config, &metrics)?;
    let mut reloaders: Vec<tokio::task::JoinHandle<()>> = reloader.into_iter().collect();
    let clients = match &config.client_ca {
        Some(client_ca) => {
            let (verifier, reloader) =
                client_verifier(client_ca, config.tls_reload_interval, metrics.clone())?;
            reloaders.push(reloader);
            Some(verifier)
        }
        None => None,
    };
    let tls_config = Arc::new(tls::server_config_with_clients(resolver, clients));
    let ready = Arc::new(AtomicBool::new(false));
    let running = server::start(
        webhook.clone(),
        tls_config,
        listeners,
        config.limits,
        ready.clone(),
    )
    .with_context(|| format!("serving {} and {}", config.listen, config.admin_listen))?;
    // With another ledger, the API server that says whether a claim's pod is gone.
    let pod_api = match (&api_server, &config.webhook.pod_api_server) {
        (None, Some(access)) => Some(ip_webhook_ledger::connect(access).await?.watches),
        _ => None,
    };
    let pods_client = api_server
        .as_ref()
        .map(|a| a.watches.clone())
        .or(pod_api.clone());
    let pod_lookup: Option<Arc<dyn PodLookup>> = pods_client.clone().map(|client| {
        Arc::new(PodDirectory::of_interface(
            client,
            &webhook.settings.app_label,
            &webhook.settings.kubevirt,
            ip_webhook_ledger::network::Interface::Primary,
        )) as Arc<dyn PodLookup>
    });
    if let Some(lookup) = &pod_lookup {
        let _ = webhook.pods.set(lookup.clone());
    }
    if let LedgerConfig::Embedded { state_dir } = &config.webhook.ledger {
        reloaders.extend(control_socket(state_dir, &webhook, pod_lookup.clone()));
    }
    reloaders.push(spawn_ledger_prober(
        ledger.clone(),
        webhook.metrics.ledger_health.clone(),
    ));
    let release_timers = release_timers(&webhook, pods_client);
    let cluster = start_cluster(config, &webhook, &ready, api_server, pod_api);
    Ok(Launched {
        running,
        webhook,
        ledger,
        ca_bundle,
        cluster,
        reloaders,
        release_timers,
    })
}

/// One release timer per interface ([`Webhook::interfaces`]), each asking the API server
/// (when there is one) for the holders of its own books' claims.
fn release_timers(
    webhook: &Arc<Webhook>,
    pods_client: Option<kube::Client>,
) -> Vec<tokio::task::JoinHandle<()>> {
    webhook
        .interfaces()
        .map(|(interface, allocator)| {
            let lookup = pods_client.clone().map(|client| {
                Arc::new(PodDirectory::of_interface(
                    client,
                    &webhook.settings.app_label,
                    &webhook.settings.kubevirt,
                    interface,
                )) as Arc<dyn PodLookup>
            });
            tokio::spawn(crate::decisions::release_timer::run(
                allocator.clone(),
                lookup,
                webhook.metrics.clone(),
                crate::decisions::release_timer::PERIOD,
            ))
        })
        .collect()
}

/// The socket through which `release` frees a claim of the embedded ledger this server
/// holds. Without it `release` needs the server stopped: worth a warning, not a refusal to
/// serve (a state dir path too long for a socket, say).
fn control_socket(
    state_dir: &std::path::Path,
    webhook: &Arc<Webhook>,
    pod_lookup: Option<Arc<dyn PodLookup>>,
) -> Option<tokio::task::JoinHandle<()>> {
    let unverifiable = pod_lookup.is_none();
    let control =
        match crate::ops::control::listen(state_dir, webhook.allocator.clone(), pod_lookup) {
            Ok(control) => Some(control),
            Err(error) => {
                tracing::warn!(
                    %error,
                    "`release` cannot reach this server; stop it to release an IP"
                );
                None
            }
        };
    if unverifiable {
        tracing::warn!(
            "{}",
            crate::ops::control::unverifiable_claims_note(crate::ops::invocation())
        );
    }
    control
}

/// With the kubernetes ledger, the watches and the reconciler (ready once the watches have
/// synced); with another ledger and an API server to ask, the sweeper that frees the IPs of
/// gone pods; without an API server, nothing (ready at once).
fn start_cluster(
    config: &ServeConfig,
    webhook: &Arc<Webhook>,
    ready: &Arc<AtomicBool>,
    api_server: Option<ApiServer>,
    pod_api: Option<kube::Client>,
) -> Option<ClusterHandle> {
    // The cluster reads pods by the decisions' app label and watches their CNI's objects.
    let options = crate::cluster::ClusterOptions {
        app_label: config.webhook.settings.app_label.clone(),
        cni: config.webhook.settings.cni,
        ..config.cluster.clone()
    };
    if let Some(api_server) = api_server {
        return Some(crate::cluster::start(
            api_server.watches,
            webhook,
            ready.clone(),
            options,
        ));
    }
    ready.store(true, std::sync::atomic::Ordering::SeqCst);
    pod_api.map(|client| crate::cluster::start_sweeper(client, webhook, options))
}

/// `serve`: run until SIGTERM or SIGINT, then drain and flush.
pub(crate) async fn serve_until_signal(config: ServeConfig) -> anyhow::Result<()> {
    let mut launched = match launch(&config).await {
        Ok(launched) => launched,
        Err(error) if crate::server::logging::json() => {
            tracing::error!(error = format!("{error:#}"), "ip-webhook cannot start");
            return Err(error);
        }
        Err(error) => return Err(error),
    };
    announce(&config, &launched);
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: draining"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: draining"),
        _ = launched.running.stopped() => anyhow::bail!("the HTTPS server stopped unexpectedly"),
    }
    launched.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// The startup lines: where it serves, which ledger, and the self-signed CA's bundle.
fn announce(config: &ServeConfig, launched: &Launched) {
    let ca_file = config.state_dir.join("ca.crt");
    if crate::server::logging::json() {
        // Collectors read one format: the startup lines are log events too.
        tracing::info!(
            https = %launched.running.https_addr,
            admin = %launched.running.admin_addr,
            ledger = launched.ledger.kind(),
            state_dir = %config.state_dir.display(),
            version = env!("CARGO_PKG_VERSION"),
            commit = crate::metrics::COMMIT,
            "ip-webhook serving"
        );
        if let Some(bundle) = &launched.ca_bundle {
            tracing::info!(ca_file = %ca_file.display(), ca_bundle = %bundle, "self-signed CA written");
        }
    } else {
        println!(
            "ip-webhook serving https://{} (admin http://{}), ledger {} in {}",
            launched.running.https_addr,
            launched.running.admin_addr,
            launched.ledger.kind(),
            config.state_dir.display()
        );
        if let Some(bundle) = &launched.ca_bundle {
            println!(
                "self-signed CA in {} (kept across restarts); caBundle: {bundle}",
                ca_file.display()
            );
        }
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
}
