//! Wiring: ledger, allocator, pools, TLS and servers, from the command-line options.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use base64::Engine;

use crate::allocator::Allocator;
use crate::cli::{LedgerKind, ServeArgs, WebhookArgs};
use crate::ledger::embedded::CommitCounters;
use crate::ledger::{EmbeddedLedger, Ledger};
use crate::metrics::Metrics;
use crate::pools::PoolCatalog;
use crate::server::{self, Limits, Running};
use crate::tls::{self, CertFiles, CertResolver};
use crate::webhook::{Settings, Webhook};

/// Open the ledger, rebuild the allocator's index from it, load pools.
pub async fn build_webhook(
    args: &WebhookArgs,
    metrics: Arc<Metrics>,
) -> anyhow::Result<(Arc<Webhook>, Arc<dyn Ledger>)> {
    let ledger = open_ledger(args, metrics.ledger.clone()).await?;
    let allocator = Arc::new(
        Allocator::new(ledger.clone())
            .await
            .context("loading the ledger")?,
    );
    let pools = match &args.pools_file {
        Some(path) => PoolCatalog::from_file(path)?,
        None => PoolCatalog::default(),
    };
    let settings = Settings {
        app_label: args.app_label.clone(),
        cni: args.cni,
        check_kube_ovn_subnets: args.check_kube_ovn_subnets,
        check_calico_pools: args.check_calico_ippools,
    };
    Ok((
        Arc::new(Webhook::new(settings, allocator, pools, metrics)),
        ledger,
    ))
}

/// The ledger the options ask for.
pub async fn open_ledger(
    args: &WebhookArgs,
    counters: CommitCounters,
) -> anyhow::Result<Arc<dyn Ledger>> {
    match args.ledger.unwrap_or(LedgerKind::Embedded) {
        LedgerKind::Embedded => Ok(Arc::new(EmbeddedLedger::open(&args.state_dir, counters)?)),
        other => anyhow::bail!("--ledger {other:?} is not available in this build yet"),
    }
}

/// A started server and what it needs to stop cleanly.
pub struct Launched {
    pub running: Running,
    pub webhook: Arc<Webhook>,
    pub ledger: Arc<dyn Ledger>,
    /// base64 of the CA that signed the serving certificate, when self-signed.
    pub ca_bundle: Option<String>,
    reloader: Option<tokio::task::JoinHandle<()>>,
}

impl Launched {
    /// Stop accepting, finish in-flight admissions, flush the ledger.
    pub async fn shutdown(self) {
        self.running.shutdown().await;
        if let Some(reloader) = self.reloader {
            reloader.abort();
        }
        self.ledger.close().await;
    }
}

pub async fn launch(args: &ServeArgs) -> anyhow::Result<Launched> {
    let metrics = Arc::new(Metrics::new());
    let (webhook, ledger) = build_webhook(&args.webhook, metrics.clone()).await?;
    let (resolver, reloader, ca_bundle) = match (&args.tls_cert_file, &args.tls_key_file) {
        (Some(cert), Some(key)) => {
            let files = CertFiles {
                cert: cert.clone(),
                key: key.clone(),
            };
            let (certified, fingerprint) = files.load()?;
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
            let generated = tls::self_signed(&args.dns_names)?;
            write_ca(&args.webhook.state_dir, &generated.ca_pem)?;
            let certified = tls::certified_key(
                generated.cert_pem.as_bytes(),
                generated.key_pem.as_bytes(),
                "generated certificate",
                "generated key",
            )?;
            let bundle =
                base64::engine::general_purpose::STANDARD.encode(generated.ca_pem.as_bytes());
            (Arc::new(CertResolver::new(certified)), None, Some(bundle))
        }
    };
    let tls_config = Arc::new(tls::server_config(resolver));
    let limits = Limits {
        header_read: args.read_timeout,
        body_read: args.read_timeout,
        drain: args.shutdown_grace,
        ..Limits::default()
    };
    let ready = Arc::new(AtomicBool::new(false));
    let running = server::start(
        webhook.clone(),
        tls_config,
        args.listen,
        args.admin_listen,
        limits,
        ready,
    )
    .await
    .with_context(|| format!("binding {} and {}", args.listen, args.admin_listen))?;
    Ok(Launched {
        running,
        webhook,
        ledger,
        ca_bundle,
        reloader,
    })
}

fn write_ca(state_dir: &Path, ca_pem: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(state_dir)?;
    let path = state_dir.join("ca.crt");
    std::fs::write(&path, ca_pem).with_context(|| format!("writing {}", path.display()))
}

/// `serve`: run until SIGTERM or SIGINT, then drain and flush.
pub async fn serve_until_signal(args: ServeArgs) -> anyhow::Result<()> {
    let mut launched = launch(&args).await?;
    println!(
        "ip-webhook serving https://{} (admin http://{}), ledger {} in {}",
        launched.running.https_addr,
        launched.running.admin_addr,
        launched.ledger.kind(),
        args.webhook.state_dir.display()
    );
    if let Some(bundle) = &launched.ca_bundle {
        println!(
            "self-signed CA written to {}; caBundle: {bundle}",
            args.webhook.state_dir.join("ca.crt").display()
        );
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
