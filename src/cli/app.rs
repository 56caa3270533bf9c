//! Wiring: ledger, allocator, pools, TLS and servers, from the command-line options.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use base64::Engine;

use crate::cli::{LedgerKind, ServeArgs, WebhookArgs};
use crate::cluster::lease::LeaseSettings;
use crate::cluster::pods::PodDirectory;
use crate::cluster::{ClusterHandle, ClusterOptions, Rules};
use crate::crd::FixedIPPool;
use crate::ipam::allocator::Allocator;
use crate::ipam::pools::PoolCatalog;
#[cfg(feature = "etcd")]
use crate::ledger::EtcdLedger;
use crate::ledger::embedded::CommitCounters;
use crate::ledger::{EmbeddedLedger, KubeLedger, Ledger, TimedLedger};
use crate::metrics::Metrics;
use crate::server::tls::{self, CertFiles, CertResolver};
use crate::server::{self, Limits, Running};
use crate::webhook::{Settings, Webhook};

/// Open the ledger, rebuild the allocator's index from it, load pools.
pub async fn build_webhook(
    args: &WebhookArgs,
    metrics: Arc<Metrics>,
) -> anyhow::Result<(Arc<Webhook>, Arc<dyn Ledger>)> {
    let built = build(args, metrics).await?;
    Ok((built.webhook, built.ledger))
}

/// What [`build`] made; `client` is set in kubernetes mode.
pub struct Built {
    pub webhook: Arc<Webhook>,
    pub ledger: Arc<dyn Ledger>,
    pub client: Option<kube::Client>,
}

/// Open the ledger, rebuild the allocator's index from it, load pools (in kubernetes mode:
/// list the IPClaims and FixedIPPools before any decision).
pub async fn build(args: &WebhookArgs, metrics: Arc<Metrics>) -> anyhow::Result<Built> {
    build_with(args, metrics, None).await
}

/// [`build`], deciding over `ledger` instead of the one the options name (the API server is
/// still asked for pools in kubernetes mode): `review --dry-run` over a read-only copy.
pub async fn build_with(
    args: &WebhookArgs,
    metrics: Arc<Metrics>,
    ledger: Option<Arc<dyn Ledger>>,
) -> anyhow::Result<Built> {
    let opened = match ledger {
        None => open_ledger(args, metrics.ledger.clone()).await?,
        // the given ledger decides; in kubernetes mode the API server still gives the pools
        Some(given) => Opened {
            ledger: given,
            clients: match args.ledger_kind() {
                LedgerKind::Kubernetes => {
                    Some(kube_clients(args.kubeconfig.as_deref(), args.context.as_deref()).await?)
                }
                _ => None,
            },
            #[cfg(feature = "etcd")]
            etcd: None,
        },
    };
    let Opened {
        ledger,
        clients,
        #[cfg(feature = "etcd")]
        etcd,
    } = opened;
    let ledger = TimedLedger::wrap_watched(
        ledger,
        metrics.ledger_latency.clone(),
        metrics.ledger_health.clone(),
    );
    let client = clients.map(|(watches, _)| watches);
    let allocator = Arc::new(
        Allocator::new(ledger.clone())
            .await
            .context("loading the ledger")?,
    );
    #[cfg(feature = "etcd")]
    if let Some(etcd) = etcd {
        spawn_etcd_watch(etcd, Arc::downgrade(&allocator));
    }
    let pools = match (&args.pools_file, &client) {
        (Some(_), Some(_)) => anyhow::bail!(
            "--pools-file is for off-cluster use; with the kubernetes ledger, pools are FixedIPPool objects"
        ),
        (Some(path), None) => PoolCatalog::from_file(path)?,
        (None, Some(client)) => {
            let list = kube::Api::<FixedIPPool>::all(client.clone())
                .list(&Default::default())
                .await
                .context("listing FixedIPPools")?;
            crate::cluster::tolerant_catalog(
                &list
                    .items
                    .into_iter()
                    .map(|p| (p.metadata.name.clone().unwrap_or_default(), p))
                    .collect(),
            )
        }
        (None, None) => PoolCatalog::default(),
    };
    let settings = Settings {
        app_label: args.app_label.clone(),
        cni: args.cni,
        check_kube_ovn_subnets: args.check_kube_ovn_subnets,
        check_calico_pools: args.check_calico_ippools,
        release_delay: args.release_delay,
        max_release_grace: args.max_release_grace,
        admission_deadline: args.admission_deadline,
    };
    let mut webhook = Webhook::new(settings, allocator, pools, metrics);
    // The IPClaim guard admits the server's own writes: its service account, and any name given.
    for user in crate::webhook::claim_guard::own_service_account()
        .into_iter()
        .chain(args.trusted_username.iter().cloned())
    {
        webhook.claim_guard.trust(&user);
    }
    if let Some(client) = &client {
        let instance = std::env::var("POD_NAME").ok();
        webhook = webhook.with_events(Arc::new(crate::cluster::events::KubeEvents::new(
            client.clone(),
            instance,
        )));
    }
    Ok(Built {
        webhook: Arc::new(webhook),
        ledger,
        client,
    })
}

/// A client for `kubeconfig`, or inferred ($KUBECONFIG, ~/.kube/config, in-cluster service
/// account), with `context` if given.
pub async fn kube_client(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> anyhow::Result<kube::Client> {
    Ok(kube_clients(kubeconfig, context).await?.0)
}

/// How long one IPClaim request on the admission path may take: well inside the API server's
/// webhook timeout (10s by default), so a stuck API server gets a clear denial, not a timeout.
pub const ADMISSION_API_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The client configuration for `kubeconfig` (else $KUBECONFIG or ~/.kube/config, else the
/// in-cluster service account, as kubectl finds it), with `context` if given.
pub async fn kube_config(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> anyhow::Result<kube::Config> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    Ok(match (kubeconfig, context) {
        (Some(path), _) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .with_context(|| format!("using kubeconfig {}", path.display()))?
        }
        (None, Some(context)) => kube::Config::from_kubeconfig(&options)
            .await
            .with_context(|| {
                format!("using context {context:?} of $KUBECONFIG or ~/.kube/config")
            })?,
        (None, None) => kube::Config::infer()
            .await
            .context("finding the API server ($KUBECONFIG, ~/.kube/config or the in-cluster service account)")?,
    })
}

/// Two clients for one API server: one for watches (long reads), one for the admission path
/// (reads cut at [`ADMISSION_API_TIMEOUT`]).
pub async fn kube_clients(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> anyhow::Result<(kube::Client, kube::Client)> {
    clients_from(kube_config(kubeconfig, context).await?)
}

/// [`kube_clients`] for a configuration already read.
pub fn clients_from(mut config: kube::Config) -> anyhow::Result<(kube::Client, kube::Client)> {
    // Named in the API server's audit log and request metrics.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("ip-webhook/", env!("CARGO_PKG_VERSION"))),
    ));
    let mut admission = config.clone();
    admission.read_timeout = Some(ADMISSION_API_TIMEOUT);
    admission.write_timeout = Some(ADMISSION_API_TIMEOUT);
    admission.connect_timeout = Some(ADMISSION_API_TIMEOUT);
    Ok((
        kube::Client::try_from(config).context("building the Kubernetes client")?,
        kube::Client::try_from(admission).context("building the Kubernetes client")?,
    ))
}

/// A ledger opened from the options, with what its kind brings along: the API server's
/// clients (kubernetes: watches, admission) or the etcd handle whose watch keeps the
/// allocator in step.
pub struct Opened {
    pub ledger: Arc<dyn Ledger>,
    pub clients: Option<(kube::Client, kube::Client)>,
    #[cfg(feature = "etcd")]
    pub etcd: Option<Arc<EtcdLedger>>,
}

/// The one place a `--ledger` kind becomes a ledger.
pub async fn open_ledger(args: &WebhookArgs, counters: CommitCounters) -> anyhow::Result<Opened> {
    let plain = |ledger: Arc<dyn Ledger>| Opened {
        ledger,
        clients: None,
        #[cfg(feature = "etcd")]
        etcd: None,
    };
    match args.ledger_kind() {
        LedgerKind::Embedded => Ok(plain(Arc::new(EmbeddedLedger::open(
            &args.state_dir,
            counters,
        )?))),
        LedgerKind::Kubernetes => {
            let clients = kube_clients(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
            Ok(Opened {
                clients: Some(clients.clone()),
                ..plain(Arc::new(KubeLedger::new(clients.1)))
            })
        }
        #[cfg(feature = "etcd")]
        LedgerKind::Etcd => {
            let etcd = open_etcd(args).await?;
            Ok(Opened {
                etcd: Some(etcd.clone()),
                ..plain(etcd)
            })
        }
        #[cfg(not(feature = "etcd"))]
        LedgerKind::Etcd => Err(no_etcd()),
    }
}

/// The reconciler's settings from the command line.
pub fn cluster_options(args: &ServeArgs) -> ClusterOptions {
    let cluster = &args.cluster;
    let namespace = cluster.lease_namespace.clone().unwrap_or_else(|| {
        std::env::var("POD_NAMESPACE")
            .ok()
            .filter(|n| !n.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                    .ok()
                    .map(|n| n.trim().to_string())
                    .filter(|n| !n.is_empty())
            })
            .unwrap_or_else(|| "default".into())
    });
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "ip-webhook".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    ClusterOptions {
        rules: Rules {
            reservation_ttl: cluster.reservation_ttl.as_secs(),
            sticky_grace: cluster.sticky_grace.as_secs(),
        },
        resync_period: cluster.resync_period.max(std::time::Duration::from_secs(1)),
        lease: LeaseSettings {
            name: cluster.lease_name.clone(),
            namespace,
            identity: format!("{host}_{:08x}{:x}", nanos, std::process::id()),
            duration: cluster.lease_duration,
            renew_every: cluster.lease_renew_interval,
        },
        app_label: args.webhook.app_label.clone(),
        cni: args.webhook.cni,
        calico_reservation: cluster.calico_reservation,
        node_lost_grace: cluster.node_lost_grace,
        kube_ovn_reservation: cluster.kube_ovn_reservation,
    }
}

/// What `--ledger etcd` says in a build without the `etcd` feature.
pub fn no_etcd() -> anyhow::Error {
    anyhow::anyhow!("this build has no etcd support; rebuild with --features etcd")
}

#[cfg(feature = "etcd")]
async fn open_etcd(args: &WebhookArgs) -> anyhow::Result<Arc<EtcdLedger>> {
    let options = args.etcd.options();
    let ledger = EtcdLedger::connect(&options)
        .await
        .with_context(|| format!("opening the etcd ledger at {:?}", options.endpoints))?;
    Ok(Arc::new(ledger))
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
    health: Arc<crate::ledger::health::LedgerHealth>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(std::time::Duration::from_secs(1));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match tokio::time::timeout(std::time::Duration::from_secs(2), ledger.ping()).await {
                Ok(Ok(())) | Ok(Err(crate::ledger::LedgerError::Corrupt { .. })) => {}
                Ok(Err(crate::ledger::LedgerError::Closed)) => return,
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
    pub ca_bundle: Option<String>,
    /// The watches and the reconciler, in kubernetes mode; the leak sweeper with another
    /// ledger when there is an API server.
    pub cluster: Option<ClusterHandle>,
    /// `/readyz` answers 200 once this is set.
    pub ready: Arc<AtomicBool>,
    reloaders: Vec<tokio::task::JoinHandle<()>>,
    release_timer: tokio::task::JoinHandle<()>,
}

impl Launched {
    /// Stop accepting, finish in-flight admissions, flush the ledger.
    pub async fn shutdown(self) {
        self.running.shutdown().await;
        self.release_timer.abort();
        for reloader in self.reloaders {
            reloader.abort();
        }
        if let Some(cluster) = &self.cluster {
            cluster.shutdown().await;
        }
        self.ledger.close().await;
    }
}

/// Keep the process's memory off transparent huge pages. The allocator asks for them
/// (mimalloc `madvise`s its arenas), and the first touch of each one clears 2 MiB at once: on
/// the benchmark's VM that held the one request thread, or the ledger writer, for about 4 ms
/// each time the heap grew by 2 MiB, which a growing claim index does all the time (issue 18
/// round 7). Small pages spread the same clearing over many faults of microseconds.
fn avoid_huge_page_stalls() {
    #[cfg(target_os = "linux")]
    if let Err(error) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::debug!(%error, "transparent huge pages stay enabled");
    }
}

pub async fn launch(args: &ServeArgs) -> anyhow::Result<Launched> {
    avoid_huge_page_stalls();
    if args.max_inflight_bytes < server::MAX_BODY_BYTES {
        anyhow::bail!(
            "--max-inflight-bytes {} is less than one largest review ({} bytes, 7Mi): such a review could never be read",
            args.max_inflight_bytes,
            server::MAX_BODY_BYTES
        );
    }
    if args.max_connections == 0 {
        anyhow::bail!("--max-connections must be at least 1");
    }
    let max_handshakes = args
        .max_handshakes
        .unwrap_or_else(|| server::default_max_handshakes(args.max_connections));
    if max_handshakes == 0 || max_handshakes > args.max_connections {
        anyhow::bail!(
            "--max-handshakes {max_handshakes} must be between 1 and --max-connections ({})",
            args.max_connections
        );
    }
    if args.handshake_timeout.is_zero() {
        anyhow::bail!("--handshake-timeout must be more than zero");
    }
    let metrics = Arc::new(Metrics::new());
    metrics.set_max_apps(args.metrics_max_apps);
    let Built {
        webhook,
        ledger,
        client,
    } = build(&args.webhook, metrics.clone()).await?;
    let (resolver, reloader, ca_bundle) = match (&args.tls_cert_file, &args.tls_key_file) {
        (Some(cert), Some(key)) => {
            let files = CertFiles {
                cert: cert.clone(),
                key: key.clone(),
            };
            let (certified, fingerprint) = files.load()?;
            if let Some(leaf) = certified.cert.first() {
                tls::served_certificate(&metrics, leaf);
            }
            let resolver = Arc::new(CertResolver::new(certified));
            let reloader = tls::spawn_reloader(
                resolver.clone(),
                files,
                fingerprint,
                args.tls_reload_interval,
                metrics,
            );
            (resolver, Some(reloader), None)
        }
        _ => {
            let (generated, kept) =
                crate::server::certs::self_signed_in(&args.webhook.state_dir, &args.dns_names)?;
            tracing::info!(
                new_ca = kept.new_ca,
                new_certificate = kept.new_cert,
                "self-signed TLS from {}",
                args.webhook.state_dir.display()
            );
            let certified = generated.certified_key()?;
            if let Some(leaf) = certified.cert.first() {
                tls::served_certificate(&metrics, leaf);
            }
            let bundle =
                base64::engine::general_purpose::STANDARD.encode(generated.ca_pem.as_bytes());
            (Arc::new(CertResolver::new(certified)), None, Some(bundle))
        }
    };
    let mut reloaders: Vec<tokio::task::JoinHandle<()>> = reloader.into_iter().collect();
    let clients = match &args.client_ca_file {
        Some(path) => {
            let (contents, digest) = tls::read_all(std::slice::from_ref(path));
            let pem = contents?.remove(0);
            let verifier = Arc::new(tls::ClientVerifier::new(
                tls::client_ca_verifier(&pem, &path.display().to_string())?,
                args.client_allowed_names.clone(),
            ));
            reloaders.push(tls::spawn_client_ca_reloader(
                verifier.clone(),
                path.clone(),
                digest,
                args.tls_reload_interval,
                webhook.metrics.clone(),
            ));
            Some(verifier)
        }
        None => None,
    };
    let tls_config = Arc::new(tls::server_config_with_clients(resolver, clients));
    let limits = Limits {
        header_read: args.read_timeout,
        body_read: args.read_timeout,
        drain: args.shutdown_grace,
        idle: args.idle_timeout,
        max_connections: args.max_connections,
        max_handshakes,
        handshake: args.handshake_timeout,
        max_inflight_bytes: args.max_inflight_bytes,
    };
    let ready = Arc::new(AtomicBool::new(false));
    let running = server::start(
        webhook.clone(),
        tls_config,
        args.listen,
        args.admin_listen,
        limits,
        ready.clone(),
    )
    .await
    .with_context(|| format!("binding {} and {}", args.listen, args.admin_listen))?;
    let pod_lookup: Option<Arc<dyn crate::ledger::pod_lookup::PodLookup>> = match &client {
        Some(client) => Some(Arc::new(PodDirectory::new(
            client.clone(),
            args.webhook.app_label.clone(),
        ))),
        None if args.webhook.has_api_server() => Some(Arc::new(PodDirectory::new(
            kube_client(
                args.webhook.kubeconfig.as_deref(),
                args.webhook.context.as_deref(),
            )
            .await?,
            args.webhook.app_label.clone(),
        ))),
        None => None,
    };
    if let Some(lookup) = &pod_lookup {
        let _ = webhook.pods.set(lookup.clone());
    }
    if args.webhook.ledger_kind() == LedgerKind::Embedded {
        // Without it `release` needs the server stopped, as before: worth a warning, not a
        // refusal to serve (a state dir path too long for a socket, say).
        match crate::ops::control::listen(
            &args.webhook.state_dir,
            webhook.allocator.clone(),
            pod_lookup.clone(),
        ) {
            Ok(control) => reloaders.push(control),
            Err(error) => tracing::warn!(
                %error,
                "`release` cannot reach this server; stop it to release an IP"
            ),
        }
        if pod_lookup.is_none() {
            tracing::warn!(
                "{}",
                crate::ops::control::unverifiable_claims_note(crate::ops::invocation())
            );
        }
    }
    reloaders.push(spawn_ledger_prober(
        ledger.clone(),
        webhook.metrics.ledger_health.clone(),
    ));
    let release_timer = tokio::spawn(crate::webhook::release_timer::run(
        webhook.allocator.clone(),
        pod_lookup,
        webhook.metrics.clone(),
        crate::webhook::release_timer::PERIOD,
    ));
    let cluster = match client {
        // Ready once the watches have synced.
        Some(client) => Some(crate::cluster::start(
            client,
            webhook.clone(),
            ready.clone(),
            cluster_options(args),
        )),
        None => {
            ready.store(true, std::sync::atomic::Ordering::SeqCst);
            // etcd or embedded ledger: with an API server to ask, free the IPs of gone pods
            if args.webhook.has_api_server() {
                let client = kube_client(
                    args.webhook.kubeconfig.as_deref(),
                    args.webhook.context.as_deref(),
                )
                .await?;
                Some(crate::cluster::start_sweeper(
                    client,
                    webhook.clone(),
                    cluster_options(args),
                ))
            } else {
                None
            }
        }
    };
    Ok(Launched {
        running,
        webhook,
        ledger,
        ca_bundle,
        cluster,
        ready,
        reloaders,
        release_timer,
    })
}

/// `serve`: run until SIGTERM or SIGINT, then drain and flush.
pub async fn serve_until_signal(args: ServeArgs) -> anyhow::Result<()> {
    let mut launched = match launch(&args).await {
        Ok(launched) => launched,
        Err(error) if crate::server::logging::json() => {
            tracing::error!(error = format!("{error:#}"), "ip-webhook cannot start");
            return Err(error);
        }
        Err(error) => return Err(error),
    };
    let ca_file = args.webhook.state_dir.join("ca.crt");
    if crate::server::logging::json() {
        // Collectors read one format: the startup lines are log events too.
        tracing::info!(
            https = %launched.running.https_addr,
            admin = %launched.running.admin_addr,
            ledger = launched.ledger.kind(),
            state_dir = %args.webhook.state_dir.display(),
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
            args.webhook.state_dir.display()
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
