//! The operator's commands (`status`, `explain`, `release`, `check`), wired from the command
//! line to the library.
//!
//! They find their ledger as kubectl finds a cluster ([`crate::cli::find_cluster`]): the
//! IPClaims behind `--kubeconfig`, else `$KUBECONFIG`, else `~/.kube/config`, else the
//! in-cluster service account; `--state-dir` reads an embedded ledger instead, and so does
//! a `./ip-webhook-state` that holds one when nothing names a cluster (`serve`'s default).
//! `status` and `explain` only read: they create nothing, and read an embedded ledger that a
//! running server holds.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, anyhow, bail};
use base64::Engine;
use serde::Serialize;

use crate::cli::{
    AnswerIsNo, CheckArgs, DEFAULT_STATE_DIR, ExplainArgs, LedgerArgs, OperatorConfig,
    OutputFormat, ReleaseArgs, StatusArgs, find_cluster,
};
use crate::cluster::pods::PodDirectory;
use ip_webhook_ipam::pools::PoolCatalog;
use ip_webhook_ipam::usage::Report;
use ip_webhook_ledger::network::Network;
use ip_webhook_ledger::pod_lookup::{NoPodList, PodLookup};
use ip_webhook_ledger::{ApiServer, Claim, KubeAccess, LedgerConfig, OpenError, OpenOptions};

/// `value` in `format`; `table` writes the text for people, given whether `-o wide` asked
/// for its extra columns.
fn print<T: Serialize>(
    format: OutputFormat,
    value: &T,
    table: impl FnOnce(bool) -> String,
) -> anyhow::Result<()> {
    let text = match format {
        OutputFormat::Table => table(false),
        OutputFormat::Wide => table(true),
        OutputFormat::Json => serde_json::to_string_pretty(value)? + "\n",
        OutputFormat::Yaml => serde_yaml::to_string(value)?,
    };
    crate::cli::emit(&text)
}

/// The ledger the flags and the environment name (or, when they name none, the one `serve`
/// keeps in its default state dir here), and where pods are looked up.
fn operator_config(source: &LedgerArgs) -> anyhow::Result<OperatorConfig> {
    source
        .config(
            find_cluster(&source.cluster),
            Some(Path::new(DEFAULT_STATE_DIR)),
        )
        .map_err(|e| anyhow!(e))
}

/// What an operator command read: every claim and pool, and the API server of the ledger (or
/// of the pods, with another ledger).
struct Contents {
    claims: Vec<Claim>,
    pools: PoolCatalog,
    api_server: Option<ApiServer>,
}

/// Every claim and pool, read without writing anything (an embedded ledger is read as
/// `status` reads it, also while a server holds it); with `existing` false, an absent embedded
/// ledger reads as an empty one; with `network`, the claims of that secondary network.
async fn read(
    config: &OperatorConfig,
    pools_file: Option<&Path>,
    existing: bool,
    network: Option<&Network>,
) -> anyhow::Result<Contents> {
    let options = OpenOptions {
        read_only: true,
        existing,
        network: network.cloned(),
        ..OpenOptions::default()
    };
    let opened = ip_webhook_ledger::open(&config.ledger, &options).await?;
    let both = async {
        let pools = crate::app::pools(pools_file, opened.api_server.as_ref()).await?;
        let claims = opened
            .ledger
            .load()
            .await
            .with_context(|| match &opened.api_server {
                Some(api_server) => format!("reading IPClaims from {}", api_server.name),
                None => format!("reading the {} ledger", config.ledger.kind()),
            })?;
        anyhow::Ok((claims, pools))
    };
    let both = both.await;
    opened.ledger.close().await;
    let (claims, pools) = both?;
    let api_server = pods_api(config, opened.api_server).await?;
    Ok(Contents {
        claims,
        pools,
        api_server,
    })
}

/// The API server pods are looked up on: the kubernetes ledger's, else the one the flags name.
async fn pods_api(
    config: &OperatorConfig,
    ledgers: Option<ApiServer>,
) -> anyhow::Result<Option<ApiServer>> {
    match (ledgers, &config.api_server) {
        (Some(api_server), _) => Ok(Some(api_server)),
        (None, Some(access)) => Ok(Some(ip_webhook_ledger::connect(access).await?)),
        (None, None) => Ok(None),
    }
}

/// `status`: the report over the held claims and the pools; in-cluster, with the node of each
/// holder's pod.
pub(crate) async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let config = operator_config(&args.source)?;
    let Contents {
        claims,
        pools,
        api_server,
    } = read(
        &config,
        args.pools_file.as_deref(),
        true,
        args.network.as_ref(),
    )
    .await?;
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
    // Off-cluster, what no claim can show: a log line (with -v), as `serve` says it at start.
    if api_server.is_none() && claims.iter().any(Claim::is_held) {
        tracing::info!(
            "{}",
            crate::ops::control::unverifiable_claims_note(crate::ops::invocation())
        );
    }
    if let Some(client) = api_server.map(|a| a.watches) {
        cluster_view(&mut report, claims, client, &args).await;
    }
    print(args.output, &report, |wide| {
        crate::ops::status::StatusTable::to_table_with(&report, wide)
    })
}

/// What the cluster adds to `status`: the duplicates among the pods (the primary interface's)
/// and each holder's node.
async fn cluster_view(
    report: &mut Report,
    claims: Vec<Claim>,
    client: kube::Client,
    args: &StatusArgs,
) {
    let shown = report.holder_ips();
    let held: Vec<Claim> = claims
        .into_iter()
        .filter(|c| c.is_held() && shown.contains(&c.ip))
        .collect();
    let mut directory = PodDirectory::new(client.clone(), &args.app_label);
    match &args.network {
        // pods' IPs on a secondary network are in their networks annotation, which the
        // duplicates (read from the CNI's annotations and status.podIPs) do not cover
        Some(network) => directory = directory.for_network(network.clone()),
        None => match crate::ops::status::cluster_duplicates(&client, &args.app_label).await {
            Ok(found) => {
                report.duplicates = found;
                report.retain(args.app.as_deref(), None);
            }
            Err(error) => eprintln!("warning: listing pods to find duplicate IPs: {error}"),
        },
    }
    let (nodes, failures) = directory.nodes(&held).await;
    for failure in failures {
        eprintln!("warning: {failure}; NODE is left empty for its pods");
    }
    report.fill_nodes(&nodes);
}

/// `explain`: the replicas of each object through `/mutate` over an in-memory copy.
pub(crate) async fn explain(args: ExplainArgs) -> anyhow::Result<()> {
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
    let config = operator_config(&args.source)?;
    // A manifest can be explained before anything runs: no ledger yet is an empty one,
    // said on stderr so that the output stays the same to a script.
    if let LedgerConfig::Embedded { state_dir } = &config.ledger {
        match ip_webhook_ledger::existing_embedded(state_dir) {
            Err(OpenError::NoLedger(missing)) => {
                eprintln!("note: {missing}; explaining against an empty ledger")
            }
            // a state dir that cannot be read is not an empty ledger
            Err(error) => return Err(error.into()),
            Ok(()) => {}
        }
    }
    let read_primary = read(&config, args.pools_file.as_deref(), false, None).await?;
    let mut networks = Vec::new();
    for network in &args.networks {
        let books = read(&config, args.pools_file.as_deref(), false, Some(network)).await?;
        networks.push((network.clone(), books.claims));
    }
    let settings = crate::cli::settings(&args.app_label, args.cni);
    let sandbox = crate::ops::explain::sandbox(read_primary.claims, settings, read_primary.pools)
        .await?
        .with_secondary(crate::ops::explain::network_sandboxes(networks).await?);
    let outcomes =
        crate::ops::explain::explain(&sandbox, &objects, &args.namespace, args.replicas).await?;
    print(args.output, &outcomes, |_| {
        crate::ops::explain::to_text(&outcomes)
    })?;
    // Exit 3 when anything would be refused (with --strict: or warned about), so that
    // `explain` can gate a CI job.
    let replicas: usize = outcomes.iter().map(|o| o.replicas.len()).sum();
    let refused = outcomes
        .iter()
        .flat_map(|o| &o.replicas)
        .filter(|r| !r.allowed)
        .count();
    let denied = outcomes.iter().filter(|o| o.denied.is_some()).count();
    let mut no = Vec::new();
    if refused > 0 {
        no.push(format!("{refused} of {replicas} replicas would be refused"));
    }
    if denied > 0 {
        no.push(format!(
            "{denied} of {} objects would be denied when written",
            outcomes.len()
        ));
    }
    let warnings: usize = outcomes.iter().map(|o| o.warnings.len()).sum();
    if args.strict && warnings > 0 {
        no.push(match warnings {
            1 => "1 warning (--strict)".to_string(),
            n => format!("{n} warnings (--strict)"),
        });
    }
    if !no.is_empty() {
        return Err(AnswerIsNo(no.join("; ")).into());
    }
    Ok(())
}

/// `release`: free a leaked claim. On an embedded ledger a running server frees it (it holds
/// the journal); otherwise the command opens the ledger itself.
pub(crate) async fn release(args: ReleaseArgs) -> anyhow::Result<()> {
    let requests = match (&args.from_report, args.ip) {
        (Some(file), _) => {
            let text = if file == Path::new("-") {
                let mut text = String::new();
                std::io::stdin()
                    .read_to_string(&mut text)
                    .context("reading the report from standard input")?;
                text
            } else {
                std::fs::read_to_string(file)
                    .with_context(|| format!("reading the report {}", file.display()))?
            };
            crate::ops::release::requests_from_report(
                &text,
                args.namespace.as_deref(),
                crate::ops::drift::SETTLE_SECONDS,
                !args.apply,
            )
            .with_context(|| format!("{}", file.display()))?
        }
        (None, Some(ip)) => vec![crate::ops::release::Request::one(
            ip,
            args.force,
            args.namespace.clone(),
        )],
        (None, None) => unreachable!("clap requires an IP or --from-report"),
    };
    let answers = release_each(&args, &requests).await?;
    let refused: Vec<&String> = answers
        .iter()
        .filter(|(released, _)| !released)
        .map(|(_, message)| message)
        .collect();
    match &args.from_report {
        None if refused.is_empty() => crate::cli::emit(&format!("{}\n", answers[0].1)),
        None => Err(AnswerIsNo(answers[0].1.clone()).into()),
        Some(file) => {
            let mut out: String = answers
                .iter()
                .map(|(_, message)| format!("{message}\n"))
                .collect();
            let freed = answers.len() - refused.len();
            out.push_str(&match (args.apply, answers.len()) {
                (_, 0) => format!("{} holds no claim without a pod\n", file.display()),
                (true, n) => format!("released {freed} of {n} claims without a pod\n"),
                (false, n) => format!(
                    "would release {freed} of {n} claims without a pod; rerun with --apply to release them\n"
                ),
            });
            if refused.is_empty() {
                crate::cli::emit(&out)
            } else {
                crate::cli::emit(&out)?;
                Err(AnswerIsNo(format!(
                    "{} of {} findings not released (above)",
                    refused.len(),
                    answers.len()
                ))
                .into())
            }
        }
    }
}

/// Each request through the control socket of the server running on `state_dir`; `None`
/// when no server answers there.
async fn release_through_server(
    state_dir: &Path,
    requests: &[crate::ops::release::Request],
) -> anyhow::Result<Option<Vec<(bool, String)>>> {
    let mut answers = Vec::with_capacity(requests.len());
    for request in requests {
        match crate::ops::control::ask(state_dir, request).await? {
            Some(reply) if reply.failed => bail!(
                "the running server could not release {}: {}",
                request.ip,
                reply.message
            ),
            Some(reply) => answers.push((reply.released, reply.message)),
            None => return Ok(None),
        }
    }
    Ok(Some(answers))
}

/// Each request under the release rule, through the running server's control socket when it
/// holds the embedded ledger, else through the ledger opened once: `(released, message)` each.
async fn release_each(
    args: &ReleaseArgs,
    requests: &[crate::ops::release::Request],
) -> anyhow::Result<Vec<(bool, String)>> {
    let config = operator_config(&args.source)?;
    let mut answers = Vec::with_capacity(requests.len());
    if requests.is_empty() {
        return Ok(answers);
    }
    if let LedgerConfig::Embedded { state_dir } = &config.ledger {
        ip_webhook_ledger::existing_embedded(state_dir)?;
        if let Some(answers) = release_through_server(state_dir, requests).await? {
            return Ok(answers);
        }
    }
    let options = OpenOptions {
        existing: true,
        read_only: requests.iter().all(|r| r.dry_run),
        ..OpenOptions::default()
    };
    let opened = match ip_webhook_ledger::open(&config.ledger, &options).await {
        Err(OpenError::Embedded(error)) => {
            let LedgerConfig::Embedded { state_dir } = &config.ledger else {
                unreachable!("only the embedded ledger fails so")
            };
            return Err(anyhow::Error::new(error).context(format!(
                "release writes the embedded ledger and needs it to itself, or the `ip-webhook serve` that uses {} to answer on {}",
                state_dir.display(),
                crate::ops::control::socket_path(state_dir).display()
            )));
        }
        opened => opened?,
    };
    let ledger = opened.ledger;
    if args.force
        && let (Some(api_server), Some(ip)) = (&opened.api_server, args.ip)
    {
        // --force is the operator's word: the IPClaim guard lets a claim annotated so go
        crate::decisions::claim_guard::mark_forced(&api_server.admission, &ip)
            .await
            .with_context(|| format!("marking the IPClaim of {ip} forced"))?;
    }
    let through = opened.api_server.as_ref().map(|a| a.name.clone());
    let api_server = pods_api(&config, opened.api_server).await?;
    let pods: Box<dyn PodLookup> = match api_server {
        Some(api_server) => Box::new(PodDirectory::new(api_server.watches, &args.app_label)),
        None => Box::new(NoPodList(format!(
            "the {} ledger has no pod list; off-cluster nothing can confirm the pod is gone",
            ledger.kind()
        ))),
    };
    for request in requests {
        let outcome = crate::ops::release::release(ledger.as_ref(), pods.as_ref(), request).await;
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(e) => {
                ledger.close().await;
                let through = through
                    .as_ref()
                    .map(|server| format!(" through {server}"))
                    .unwrap_or_default();
                return Err(
                    anyhow::Error::new(e).context(format!("releasing {}{through}", request.ip))
                );
            }
        };
        answers.push((outcome.released(), outcome.message(&request.ip)));
    }
    ledger.close().await;
    Ok(answers)
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

/// `check --drift`: the claims against the cluster's pods and the CNI's records.
async fn drift(args: CheckArgs) -> anyhow::Result<()> {
    // No local default: drift compares with a cluster, so the ledger is that cluster's unless
    // the flags name another.
    let config = args
        .source
        .config(find_cluster(&args.source.cluster), None)
        .map_err(|e| anyhow!(e))?;
    if config.api_server.is_none() {
        bail!(
            "check --drift compares the claims with a cluster's pods: give --kubeconfig FILE (or run it in a pod)"
        );
    }
    let Contents {
        claims,
        pools,
        api_server,
    } = read(&config, None, true, args.drift.network.as_ref()).await?;
    let api_server = api_server.expect("an API server was configured");
    let (client, server) = (api_server.watches, api_server.name);
    let mut cluster =
        crate::ops::drift::fetch::read(&client, &pools, &args.drift.app_label, &claims)
            .await
            .with_context(|| format!("reading the cluster from {server}"))?;
    if let Some(network) = &args.drift.network {
        cluster = crate::ops::drift::network::project(cluster, network);
    }
    for warning in &cluster.warnings {
        eprintln!("warning: {warning}");
    }
    let drift = crate::ops::drift::compare(&crate::ops::drift::Inputs {
        claims: &claims,
        pods: &cluster.pods,
        plain: &cluster.plain,
        listed: &cluster.listed,
        cni: &cluster.cni,
        app_label: &args.drift.app_label,
        now: ip_webhook_ledger::unix_now(),
        settle: crate::ops::drift::SETTLE_SECONDS,
        vms: &cluster.vms,
        network: args.drift.network.as_ref(),
    });
    let mut report = crate::ops::drift::Report {
        drift,
        compared: crate::ops::drift::Compared {
            claims: claims.iter().filter(|c| c.is_held()).count(),
            pods: cluster.pod_count,
            kube_ovn_ips: cluster.kube_ovn_ips,
            calico_allocations: cluster.calico_allocations,
            namespace: None,
        },
    };
    if let Some(namespace) = &args.drift.namespace {
        report.retain_namespace(namespace);
    }
    print(args.output, &report, |_| report.to_table())?;
    match report.drift_count() {
        0 => Ok(()),
        n => Err(AnswerIsNo(format!("{n} drift found")).into()),
    }
}

/// `check`: the doctor.
pub(crate) async fn check(args: CheckArgs) -> anyhow::Result<()> {
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
    let cluster = if explicit || ca_pem.is_none() {
        find_cluster(&args.source.cluster)
    } else {
        None
    };
    let cluster_bundles = match cluster {
        None => None,
        Some(cluster) => {
            let read = async {
                let access = KubeAccess {
                    source: cluster,
                    context: args.source.cluster.context.clone(),
                };
                let api_server = ip_webhook_ledger::connect(&access).await?;
                cluster_bundles(
                    api_server.admission,
                    &args.webhook_configuration,
                    &api_server.name,
                )
                .await
            };
            Some(
                read.await
                    .map_err(|e| crate::ops::doctor::Unreached::Cluster(format!("{e:#}"))),
            )
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
    print(args.output, &checks, |_| {
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
