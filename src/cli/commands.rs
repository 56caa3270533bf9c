//! The operator's commands (`status`, `explain`, `release`, `check`), wired from the command
//! line to the library.
//!
//! They find their ledger as kubectl finds a cluster ([`crate::cli::find_cluster`]): the
//! IPClaims behind `--kubeconfig`, else `$KUBECONFIG`, else `~/.kube/config`, else the
//! in-cluster service account; `--state-dir` reads an embedded ledger instead. `status` and
//! `explain` only read: they create nothing, and read an embedded ledger that a running
//! server holds.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use base64::Engine;
use serde::Serialize;

use crate::cli::app;
use crate::cli::{
    AnswerIsNo, Books, CheckArgs, ClusterSource, ExplainArgs, LedgerSource, OutputFormat,
    ReleaseArgs, StatusArgs, choose_books, find_cluster, in_pod,
};
use crate::cluster::pods::PodDirectory;
use crate::crd::FixedIPPool;
use crate::ipam::pools::PoolCatalog;
use crate::ipam::usage::Report;
use crate::ledger::pod_lookup::{NoPodList, PodLookup};
use crate::ledger::{Claim, KubeLedger, Ledger};

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
    crate::cli::emit(&text)
}

/// The ledger an operator command found, and the API server behind it.
struct Access {
    books: Books,
    /// For watches and pod lookups (no read timeout).
    client: Option<kube::Client>,
    /// For IPClaim reads and writes (the admission path's timeouts).
    admission: Option<kube::Client>,
    /// `the API server https://… (from $KUBECONFIG (…))`, for error messages.
    server: String,
}

/// Find the ledger (and the API server) the flags and the environment name.
async fn connect(source: &LedgerSource) -> anyhow::Result<Access> {
    let explicit = source.cluster.kubeconfig.is_some() || source.cluster.context.is_some();
    let found = find_cluster(&source.cluster);
    let books = choose_books(source, found.clone()).map_err(|e| anyhow!(e))?;
    // With another ledger, pods are looked up where the flags point (or in a pod).
    let cluster = match &books {
        Books::Kubernetes(cluster) => Some(cluster.clone()),
        _ if explicit || in_pod() => found,
        _ => None,
    };
    let Some(cluster) = cluster else {
        return Ok(Access {
            books,
            client: None,
            admission: None,
            server: String::new(),
        });
    };
    let config = cluster_config(&cluster, source.cluster.context.as_deref()).await?;
    let server = format!("the API server {} (from {cluster})", config.cluster_url);
    let (client, admission) = app::clients_from(config)?;
    Ok(Access {
        books,
        client: Some(client),
        admission: Some(admission),
        server,
    })
}

/// The client configuration from where [`find_cluster`] found the cluster.
async fn cluster_config(
    cluster: &ClusterSource,
    context: Option<&str>,
) -> anyhow::Result<kube::Config> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let config = match cluster {
        ClusterSource::Flag(path) => app::kube_config(Some(path), context).await,
        ClusterSource::Env(_) | ClusterSource::Home(_) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(anyhow::Error::from),
        ClusterSource::InCluster if context.is_some() => {
            Err(anyhow!("--context needs a kubeconfig"))
        }
        ClusterSource::InCluster => kube::Config::incluster().map_err(anyhow::Error::from),
    };
    config.with_context(|| format!("finding the API server through {cluster}"))
}

/// Check that `dir` is a state dir with a ledger, without creating anything.
fn existing_ledger(dir: &Path) -> anyhow::Result<()> {
    if !dir.is_dir() {
        bail!(
            "no embedded ledger: {} does not exist (give the --state-dir of `ip-webhook serve`)",
            dir.display()
        );
    }
    if !crate::ledger::embedded::exists_in(dir) {
        bail!(
            "no embedded ledger in {}: no journal, snapshot or ledger.redb there (is it the --state-dir of `ip-webhook serve`?)",
            dir.display()
        );
    }
    Ok(())
}

/// Every claim and pool, read without writing anything.
async fn read(
    access: &Access,
    source: &LedgerSource,
    pools_file: Option<&Path>,
) -> anyhow::Result<(Vec<Claim>, PoolCatalog)> {
    let from_file = || -> anyhow::Result<PoolCatalog> {
        Ok(match pools_file {
            Some(path) => PoolCatalog::from_file(path)?,
            None => PoolCatalog::default(),
        })
    };
    match &access.books {
        Books::Embedded(dir) => {
            existing_ledger(dir)?;
            let claims = crate::ledger::embedded::read_claims(dir)?;
            Ok((claims, from_file()?))
        }
        Books::Kubernetes(_) => {
            if pools_file.is_some() {
                bail!(
                    "--pools-file is for off-cluster use; with the kubernetes ledger, pools are FixedIPPool objects"
                );
            }
            let admission = access.admission.clone().expect("kubernetes has a client");
            installed(&admission, &access.server).await?;
            let claims = KubeLedger::new(admission.clone())
                .load()
                .await
                .with_context(|| format!("reading IPClaims from {}", access.server))?;
            let list = kube::Api::<FixedIPPool>::all(admission)
                .list(&Default::default())
                .await
                .with_context(|| format!("listing FixedIPPools from {}", access.server))?;
            let pools = crate::cluster::tolerant_catalog(
                &list
                    .items
                    .into_iter()
                    .map(|p| (p.metadata.name.clone().unwrap_or_default(), p))
                    .collect(),
            );
            Ok((claims, pools))
        }
        Books::Etcd => {
            let ledger = open_etcd(source).await?;
            let claims = ledger.load().await;
            ledger.close().await;
            Ok((claims.context("reading the etcd ledger")?, from_file()?))
        }
    }
}

/// Whether the API server serves ip-webhook's IPClaims at all: a cluster without them (no
/// ip-webhook installed, or the wrong context) gets a sentence, not a 404 Status dump.
async fn installed(client: &kube::Client, server: &str) -> anyhow::Result<()> {
    let probe = kube::Api::<crate::crd::IPClaim>::all(client.clone())
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await;
    match probe {
        Err(kube::Error::Api(status)) if status.code == 404 => bail!(
            "{server} serves no IPClaims (ipclaims.ip-webhook.io): ip-webhook is not installed there (wrong --context?)"
        ),
        Err(error) => Err(error).with_context(|| format!("reading IPClaims from {server}")),
        Ok(_) => Ok(()),
    }
}

#[cfg(feature = "etcd")]
async fn open_etcd(source: &LedgerSource) -> anyhow::Result<Arc<dyn Ledger>> {
    let options = source.etcd.options();
    let ledger = crate::ledger::EtcdLedger::connect(&options)
        .await
        .with_context(|| format!("opening the etcd ledger at {:?}", options.endpoints))?;
    Ok(Arc::new(ledger))
}

#[cfg(not(feature = "etcd"))]
async fn open_etcd(_: &LedgerSource) -> anyhow::Result<Arc<dyn Ledger>> {
    Err(app::no_etcd())
}

/// `status`: the report over the held claims and the pools; in-cluster, with the node of each
/// holder's pod.
pub async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let access = connect(&args.source).await?;
    let (claims, pools) = read(&access, &args.source, args.pools_file.as_deref()).await?;
    let mut report = Report::build(&claims, &pools, true);
    let known_apps: Vec<String> = report.apps.iter().map(|a| a.key()).collect();
    let known_pools: Vec<String> = report.pools.iter().map(|p| p.name.clone()).collect();
    report.retain(args.app.as_deref(), args.pool.as_deref());
    if let Some(namespace) = &args.namespace {
        retain_namespace(&mut report, namespace);
        if report.apps.is_empty() {
            return Err(AnswerIsNo(format!("no app in namespace {namespace} holds an IP")).into());
        }
    }
    let list = |names: &[String]| {
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    };
    if let Some(app) = &args.app
        && report.apps.is_empty()
    {
        return Err(AnswerIsNo(format!(
            "no app {app} holds an IP (apps holding IPs: {})",
            list(&known_apps)
        ))
        .into());
    }
    if let Some(pool) = &args.pool
        && report.pools.is_empty()
    {
        return Err(if known_pools.contains(pool) {
            AnswerIsNo(format!("FixedIPPool {pool} serves no app that matches"))
        } else {
            AnswerIsNo(format!(
                "no FixedIPPool {pool} (known: {})",
                list(&known_pools)
            ))
        }
        .into());
    }
    // Off-cluster, on stderr so that the table and -o json/yaml stay the same to a script.
    if access.client.is_none() && claims.iter().any(Claim::is_held) {
        eprintln!(
            "note: {}",
            crate::ops::control::unverifiable_claims_note(crate::ops::invocation())
        );
    }
    if let Some(client) = access.client {
        let shown = report.holder_ips();
        let held: Vec<Claim> = claims
            .into_iter()
            .filter(|c| c.is_held() && shown.contains(&c.ip))
            .collect();
        match crate::ops::status::cluster_duplicates(&client, &args.app_label).await {
            Ok(found) => {
                report.duplicates = found;
                report.retain(args.app.as_deref(), None);
            }
            Err(error) => eprintln!("warning: listing pods to find duplicate IPs: {error}"),
        }
        let directory = PodDirectory::new(client, &args.app_label);
        let (nodes, failures) = directory.nodes(&held).await;
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
    let objects = crate::ops::explain::parse_objects(&text)
        .with_context(|| format!("reading {}", args.file))?;
    let access = connect(&args.source).await?;
    let (claims, pools) = read(&access, &args.source, args.pools_file.as_deref()).await?;
    let settings = crate::webhook::Settings {
        app_label: args.app_label.clone(),
        cni: args.cni,
        check_kube_ovn_subnets: false,
        check_calico_pools: false,
        ..crate::webhook::Settings::default()
    };
    let sandbox = crate::ops::explain::sandbox(claims, settings, pools).await?;
    let outcomes =
        crate::ops::explain::explain(&sandbox, &objects, &args.namespace, args.replicas).await?;
    print(args.output, &outcomes, || {
        crate::ops::explain::to_text(&outcomes)
    })
}

/// `release`: free a leaked claim. On an embedded ledger a running server frees it (it holds
/// the journal); otherwise the command opens the ledger itself.
pub async fn release(args: ReleaseArgs) -> anyhow::Result<()> {
    let request = crate::ops::release::Request {
        ip: args.ip,
        force: args.force,
        namespace: args.namespace.clone(),
    };
    let answered = |released: bool, message: String| {
        if released {
            crate::cli::emit(&format!("{message}\n"))
        } else {
            Err(AnswerIsNo(message).into())
        }
    };
    let access = connect(&args.source).await?;
    if let Books::Embedded(dir) = &access.books {
        existing_ledger(dir)?;
        if let Some(reply) = crate::ops::control::ask(dir, &request).await? {
            if reply.failed {
                bail!(
                    "the running server could not release {}: {}",
                    args.ip,
                    reply.message
                );
            }
            return answered(reply.released, reply.message);
        }
    }
    let ledger: Arc<dyn Ledger> = match &access.books {
        Books::Embedded(dir) => Arc::new(
            crate::ledger::EmbeddedLedger::open(dir, Default::default()).with_context(|| {
                format!(
                    "release writes the embedded ledger and needs it to itself, or the `ip-webhook serve` that uses {} to answer on {}",
                    dir.display(),
                    crate::ops::control::socket_path(dir).display()
                )
            })?,
        ),
        Books::Kubernetes(_) => {
            let admission = access.admission.clone().expect("kubernetes has a client");
            installed(&admission, &access.server).await?;
            if args.force {
                // --force is the operator's word: the IPClaim guard lets a claim annotated so go
                crate::webhook::claim_guard::mark_forced(&admission, &args.ip)
                    .await
                    .with_context(|| format!("marking the IPClaim of {} forced", args.ip))?;
            }
            Arc::new(KubeLedger::new(admission))
        }
        Books::Etcd => open_etcd(&args.source).await?,
    };
    let pods: Box<dyn PodLookup> = match access.client.clone() {
        Some(client) => Box::new(PodDirectory::new(client, &args.app_label)),
        None => Box::new(NoPodList(format!(
            "the {} ledger has no pod list; off-cluster nothing can confirm the pod is gone",
            ledger.kind()
        ))),
    };
    let outcome = crate::ops::release::release(ledger.as_ref(), pods.as_ref(), &request).await;
    ledger.close().await;
    let outcome = match (&access.books, outcome) {
        (Books::Kubernetes(_), Err(e)) => {
            Err(e).with_context(|| format!("releasing through {}", access.server))?
        }
        (_, outcome) => outcome.context("releasing")?,
    };
    answered(outcome.released(), outcome.message(&args.ip))
}

/// The caBundles of the webhooks in the webhook configurations named `name`, each with where
/// it came from.
async fn cluster_bundles(
    client: kube::Client,
    name: &str,
    server: &str,
) -> anyhow::Result<crate::ops::doctor::CaBundles> {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    let mutating = kube::Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get_opt(name)
        .await
        .with_context(|| format!("reading MutatingWebhookConfiguration {name} from {server}"))?;
    let validating = kube::Api::<ValidatingWebhookConfiguration>::all(client)
        .get_opt(name)
        .await
        .with_context(|| format!("reading ValidatingWebhookConfiguration {name} from {server}"))?;
    if mutating.is_none() && validating.is_none() {
        bail!(
            "{server} has no MutatingWebhookConfiguration or ValidatingWebhookConfiguration named {name} (--webhook-configuration)"
        );
    }
    let mut bundles = Vec::new();
    let mut add = |kind: &str, webhook: &str, bundle: Option<&k8s_openapi::ByteString>| {
        let source = format!("{kind} {name} webhook {webhook}");
        bundles.push((source, bundle.map(|b| b.0.clone()).unwrap_or_default()));
    };
    for webhook in mutating.iter().flat_map(|c| c.webhooks.iter().flatten()) {
        add(
            "MutatingWebhookConfiguration",
            &webhook.name,
            webhook.client_config.ca_bundle.as_ref(),
        );
    }
    for webhook in validating.iter().flat_map(|c| c.webhooks.iter().flatten()) {
        add(
            "ValidatingWebhookConfiguration",
            &webhook.name,
            webhook.client_config.ca_bundle.as_ref(),
        );
    }
    Ok(bundles)
}

/// `status -n`: the apps of one namespace, and the pools they draw from.
fn retain_namespace(report: &mut Report, namespace: &str) {
    let prefix = format!("{namespace}/");
    report.apps.retain(|a| a.key().starts_with(&prefix));
    report
        .pools
        .retain(|p| report.apps.iter().any(|a| a.pool.as_ref() == Some(&p.name)));
}

/// `check --drift`: the claims against the cluster's pods and the CNI's records (issue 20).
async fn drift(args: CheckArgs) -> anyhow::Result<()> {
    let access = connect(&args.source).await?;
    let Some(client) = access.client.clone() else {
        bail!(
            "check --drift compares the claims with a cluster's pods: give --kubeconfig FILE (or run it in a pod)"
        );
    };
    let (claims, pools) = read(&access, &args.source, None).await?;
    let server = if access.server.is_empty() {
        "the API server".to_string()
    } else {
        access.server.clone()
    };
    let cluster = crate::ops::drift::fetch::read(&client, &pools, &args.drift.app_label)
        .await
        .with_context(|| format!("reading the cluster from {server}"))?;
    for warning in &cluster.warnings {
        eprintln!("warning: {warning}; their lists are left out");
    }
    let drift = crate::ops::drift::compare(&crate::ops::drift::Inputs {
        claims: &claims,
        pods: &cluster.pods,
        listed: &cluster.listed,
        cni: &cluster.cni,
        app_label: &args.drift.app_label,
        now: crate::ledger::unix_now(),
        settle: crate::ops::drift::SETTLE_SECONDS,
    });
    let mut report = crate::ops::drift::Report {
        drift,
        compared: crate::ops::drift::Compared {
            claims: claims.iter().filter(|c| c.is_held()).count(),
            pods: cluster.pods.len(),
            kube_ovn_ips: cluster.kube_ovn_ips,
            calico_allocations: cluster.calico_allocations,
            namespace: None,
        },
    };
    if let Some(namespace) = &args.drift.namespace {
        report.retain_namespace(namespace);
    }
    print(args.output, &report, || report.to_table())?;
    match report.drift_count() {
        0 => Ok(()),
        n => Err(AnswerIsNo(format!("{n} drift found")).into()),
    }
}

/// `check`: the doctor.
pub async fn check(args: CheckArgs) -> anyhow::Result<()> {
    if args.drift.enabled {
        return drift(args).await;
    }
    let Some(url) = args.url.clone() else {
        bail!("check needs --url (or --drift)");
    };
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
    // The cluster's caBundles: when asked for (--kubeconfig, --context), or when no CA was
    // given and kubectl would find a cluster.
    let explicit =
        args.source.cluster.kubeconfig.is_some() || args.source.cluster.context.is_some();
    let cluster: Option<ClusterSource> = if explicit || ca_pem.is_none() {
        find_cluster(&args.source.cluster)
    } else {
        None
    };
    let cluster_bundles = match cluster {
        None => None,
        Some(cluster) => {
            let read = async {
                let config =
                    cluster_config(&cluster, args.source.cluster.context.as_deref()).await?;
                let server = format!("the API server {} (from {cluster})", config.cluster_url);
                let (_, client) = app::clients_from(config)?;
                cluster_bundles(client, &args.webhook_configuration, &server).await
            };
            Some(read.await.map_err(|e| format!("{e:#}")))
        }
    };
    let options = crate::ops::doctor::Options {
        client_pem,
        url,
        ca_pem,
        server_name: args.tls_server_name.clone(),
        cluster_bundles,
        admin_url: args.admin_url.clone(),
        min_days: args.min_days,
        exhaustion_ratio: args.exhaustion_threshold,
        timeout: args.timeout,
    };
    let checks = crate::ops::doctor::run(&options).await;
    print(args.output, &checks, || {
        crate::ops::doctor::to_text(&checks)
    })?;
    let failed = checks
        .iter()
        .filter(|c| c.status == crate::ops::doctor::Status::Fail)
        .count();
    if failed > 0 {
        return Err(AnswerIsNo(format!("{failed} of {} checks failed", checks.len())).into());
    }
    Ok(())
}
