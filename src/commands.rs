//! The operator's commands (`status`, `explain`, `release`, `check`), wired from the command
//! line to the library. Every ledger kind goes through the adapters `serve` uses
//! ([`app::build`], [`app::open_ledger`]), so each command works with whichever ledger the
//! flags select.

use std::io::Read;
use std::sync::Arc;

use anyhow::{Context, bail};
use base64::Engine;
use serde::Serialize;

use crate::app;
use crate::cli::{CheckArgs, ExplainArgs, OutputFormat, ReleaseArgs, StatusArgs};
use crate::cluster::pods::PodDirectory;
use crate::ledger::Claim;
use crate::metrics::Metrics;
use crate::release::{NoPodList, PodLookup};
use crate::status::Report;

fn print<T: Serialize>(
    format: OutputFormat,
    value: &T,
    table: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    let text = match format {
        OutputFormat::Table => table(),
        OutputFormat::Json => serde_json::to_string_pretty(value)? + "\n",
        OutputFormat::Yaml => serde_yaml::to_string(value)?,
    };
    print!("{text}");
    Ok(())
}

/// `status`: the report over the held claims and the pools the flags give; in-cluster, with
/// the node of each holder's pod.
pub async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let app::Built {
        webhook,
        ledger,
        client,
    } = app::build(&args.webhook, Arc::new(Metrics::new())).await?;
    ledger.close().await;
    let pools = webhook.pools.load();
    let mut report = webhook
        .allocator
        .with_claims(|claims| Report::build(claims, &pools, true));
    report.retain(args.app.as_deref(), args.pool.as_deref());
    if let Some(client) = client {
        let shown = report.holder_ips();
        let claims: Vec<Claim> = webhook
            .allocator
            .with_claims(|claims| claims.filter(|c| shown.contains(&c.ip)).cloned().collect());
        let directory = PodDirectory::new(client, &args.webhook.app_label);
        let (nodes, failures) = directory.nodes(&claims).await;
        for failure in failures {
            eprintln!("warning: {failure}; NODE is left empty for its pods");
        }
        report.fill_nodes(&nodes);
    }
    print(args.output, &report, || report.to_table())
}

/// `explain`: the replicas of each object through `/mutate` over an in-memory copy.
pub async fn explain(args: ExplainArgs) -> anyhow::Result<()> {
    let text = if args.file == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading standard input")?;
        text
    } else {
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file))?
    };
    let objects =
        crate::explain::parse_objects(&text).with_context(|| format!("reading {}", args.file))?;
    let (webhook, ledger) = app::build_webhook(&args.webhook, Arc::new(Metrics::new())).await?;
    let claims = ledger.load().await;
    ledger.close().await;
    let claims = claims.context("loading the ledger")?;
    let sandbox = crate::explain::sandbox(
        claims,
        webhook.settings.clone(),
        (**webhook.pools.load()).clone(),
    )
    .await?;
    let outcomes =
        crate::explain::explain(&sandbox, &objects, &args.namespace, args.replicas).await?;
    print(args.output, &outcomes, || {
        crate::explain::to_text(&outcomes)
    })
}

/// `release`: free a leaked claim.
pub async fn release(args: ReleaseArgs) -> anyhow::Result<()> {
    let ledger = app::open_ledger(&args.webhook, Default::default()).await?;
    let pods: Box<dyn PodLookup> = if args.webhook.has_api_server() {
        let client = app::kube_client(args.webhook.kubeconfig.as_deref()).await?;
        Box::new(PodDirectory::new(client, &args.webhook.app_label))
    } else {
        Box::new(NoPodList(format!(
            "the {} ledger has no pod list; off-cluster nothing can confirm the pod is gone",
            ledger.kind()
        )))
    };
    let outcome =
        crate::release::release(ledger.as_ref(), pods.as_ref(), args.ip, args.force).await;
    ledger.close().await;
    let outcome = outcome.context("releasing")?;
    let message = outcome.message(&args.ip);
    if outcome.released() {
        println!("{message}");
        Ok(())
    } else {
        bail!("{message}")
    }
}

/// `check`: the doctor.
pub async fn check(args: CheckArgs) -> anyhow::Result<()> {
    let ca_pem = match (&args.ca_file, &args.ca_bundle) {
        (Some(path), _) => {
            Some(std::fs::read(path).with_context(|| format!("reading {}", path.display()))?)
        }
        (None, Some(bundle)) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(bundle.trim())
                .context("--ca-bundle is not base64")?,
        ),
        (None, None) => None,
    };
    let client_pem = match (&args.client_cert_file, &args.client_key_file) {
        (Some(cert), Some(key)) => Some((
            std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?,
            std::fs::read(key).with_context(|| format!("reading {}", key.display()))?,
        )),
        _ => None,
    };
    let options = crate::doctor::Options {
        client_pem,
        url: args.url.clone(),
        ca_pem,
        admin_url: args.admin_url.clone(),
        min_days: args.min_days,
        exhaustion_ratio: args.exhaustion_threshold,
        timeout: args.timeout,
    };
    let checks = crate::doctor::run(&options).await;
    print(args.output, &checks, || crate::doctor::to_text(&checks))?;
    let failed = checks
        .iter()
        .filter(|c| c.status == crate::doctor::Status::Fail)
        .count();
    if failed > 0 {
        bail!("{failed} of {} checks failed", checks.len());
    }
    Ok(())
}
