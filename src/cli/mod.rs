//! The command line: `serve`, `review`, `crds`, and the operator's commands `status`,
//! `explain`, `release` and `check`.

mod args;
pub(crate) mod commands;
mod config;
mod parse;
pub(crate) mod plugin;

pub(crate) use args::*;
pub(crate) use config::*;
pub(crate) use parse::*;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::metrics::Endpoint;
use crate::server::logging::LogFormat;
use ip_webhook_admission::annotations::Cni;
use ip_webhook_ledger::{LedgerConfig, OpenOptions};

/// What every command's exit status means (also in the README).
pub(crate) const EXIT_CODES: &str = "Exit status: 0 done; 1 error (one `Error: …` line on stderr); \
2 bad command line; 3 the command ran and the answer is no (a `check` failed, `check --drift` \
found drift, `release` freed nothing, a `status` filter matched nothing, `explain` found a replica \
that would be refused, or with --strict a warning).";

/// The name the binary runs under as a kubectl plugin (`kubectl ipw …`).
pub(crate) const PLUGIN_FILE: &str = "kubectl-ipw";

/// Whether `argv0` (the program's path) names the kubectl plugin: a file `kubectl-ipw`, or
/// `kubectl-ipw.exe`.
pub(crate) fn is_plugin_name(argv0: &std::ffi::OsStr) -> bool {
    let Some(name) = Path::new(argv0).file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    let name = name.strip_suffix(".exe").unwrap_or(name);
    name == PLUGIN_FILE
}

/// The clap command, named `kubectl ipw` in help, usage and errors when run as the plugin.
pub fn command(plugin: bool) -> clap::Command {
    use clap::CommandFactory;
    let command = Cli::command();
    if plugin {
        // The server's commands still run, but kubectl users are shown the operator's.
        ["serve", "review", "crds", "plugin"]
            .into_iter()
            .fold(command, |c, name| c.mut_subcommand(name, |s| s.hide(true)))
            .name(PLUGIN_FILE)
            .bin_name("kubectl ipw")
            .display_name("kubectl ipw")
            .about("ip-webhook's fixed pod IPs from kubectl: who holds which IP (status), what a workload would get (explain), free a leaked IP (release), check the install or its drift from the CNI (check)")
    } else {
        command
    }
}

/// What `serve` runs for a whole command line (program name first), as `serve` parses it; a
/// command line of another command is an error.
pub fn parse_serve<I, T>(argv: I) -> Result<crate::app::ServeConfig, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::Parser;
    match Cli::try_parse_from(argv)?.command {
        Command::Serve(args) => Ok(args.config()),
        _ => Err(clap::Error::raw(
            clap::error::ErrorKind::InvalidSubcommand,
            "not a serve command line",
        )),
    }
}

/// Parse the process's command line, as `kubectl ipw` when the program's file is
/// `PLUGIN_FILE`; a bad command line prints clap's message and exits 2.
fn parse_env() -> Cli {
    use clap::FromArgMatches;
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let plugin = args.first().is_some_and(|a| is_plugin_name(a));
    if plugin {
        crate::ops::set_invocation("kubectl ipw");
    }
    let matches = command(plugin).get_matches_from(args);
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// The command ran, and its answer is no: a `check` failed, `release` freed nothing, a
/// filter matched nothing, `explain` found a replica that would be refused. Exits 3 (an error exits 1).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct AnswerIsNo(pub String);

/// The process: parse the command line, run it, and end with its exit status. Errors end as
/// one `Error: …` line with their causes (never a backtrace, whatever RUST_BACKTRACE says).
#[tokio::main]
pub async fn main() -> std::process::ExitCode {
    match run(parse_env()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("Error: {}", error_line(&error));
            std::process::ExitCode::from(exit_code(&error))
        }
    }
}

/// The exit status for an error: 3 when its answer is no (`AnswerIsNo`), else 1.
fn exit_code(error: &anyhow::Error) -> u8 {
    if error.chain().any(|cause| cause.is::<AnswerIsNo>()) {
        3
    } else {
        1
    }
}

/// Write a command's output to stdout. A reader that went away (`| head`) ends the output
/// quietly, as for any Unix tool, instead of a panic.
pub(crate) fn emit(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// An error as one line: each cause after the last, `: `-separated, leaving out a cause whose
/// text the line already holds (client libraries often repeat their source in their message).
pub(crate) fn error_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        let text = text.trim();
        if text.is_empty() || line.contains(text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(text);
    }
    line.replace('\n', " ")
}

/// The log filter: `serve` logs at RUST_LOG (default info); the other commands print only
/// their own output unless -v is given: -v info, -vv debug.
fn log_filter(command: &Command) -> Option<&'static str> {
    let verbosity = match command {
        Command::Serve(_) => return None,
        Command::Crds => Verbosity::default(),
        Command::Review(args) => args.verbosity,
        Command::Status(args) => args.verbosity,
        Command::Explain(args) => args.verbosity,
        Command::Release(args) => args.verbosity,
        Command::Check(args) => args.verbosity,
        Command::Ledger(LedgerCommand::Repair(args)) => args.verbosity,
        Command::Plugin(_) | Command::Completion { .. } => Verbosity::default(),
    };
    // Without -v, no log line at all: what went wrong is the `Error:` line, and what the
    // ledger notes on the way (a slow commit, a torn tail cut off) is for -v.
    Some(match (verbosity.verbose, command) {
        (0, _) => "off",
        // `serve` logs a dry run's decision at debug (a line per admission costs CPU); the
        // one review `review` runs is what -v is for.
        (1, Command::Review(_)) => "info,ip_webhook::decisions::dispatch=debug",
        (1, _) => "info",
        _ => "debug",
    })
}

/// Run a parsed command line.
async fn run(cli: Cli) -> anyhow::Result<()> {
    let _logs = crate::server::logging::init(cli.log_format(), log_filter(&cli.command));
    match cli.command {
        Command::Serve(args) => crate::app::serve_until_signal(args.config()).await,
        Command::Review(args) => review(args).await,
        Command::Crds => emit(&ip_webhook_ledger::crd::crds_yaml()),
        Command::Status(args) => crate::cli::commands::status(args).await,
        Command::Explain(args) => crate::cli::commands::explain(args).await,
        Command::Release(args) => crate::cli::commands::release(args).await,
        Command::Check(args) => crate::cli::commands::check(args).await,
        Command::Ledger(LedgerCommand::Repair(args)) => {
            let repair = ip_webhook_ledger::embedded::repair::repair(&args.state_dir, args.apply)?;
            emit(&repair.to_string())
        }
        Command::Plugin(command) => plugin::run(command),
        Command::Completion { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "ip-webhook",
                &mut script,
            );
            let mut script = String::from_utf8_lossy(&script).into_owned();
            if shell == clap_complete::Shell::Bash {
                // clap_complete's bash script spells a hyphenated program's subcommand states
                // two ways (`ip__webhook__subcmd__status` in its loop, `ip__subcmd__webhook__…`
                // in its case arms), so no subcommand's flags ever complete (clap-rs/clap#6421):
                // the arms are given the loop's spelling.
                script = script.replace("ip__subcmd__webhook", "ip__webhook");
            }
            emit(&script)
        }
    }
}

async fn review(args: ReviewArgs) -> anyhow::Result<()> {
    let mut body = Vec::new();
    if args.file == "-" {
        std::io::stdin()
            .read_to_end(&mut body)
            .context("reading standard input")?;
    } else {
        body = std::fs::read(&args.file).with_context(|| format!("reading {}", args.file))?;
    }
    if args.dry_run {
        let mut value: serde_json::Value =
            serde_json::from_slice(&body).context("the review is not JSON")?;
        match value.get_mut("request").and_then(|r| r.as_object_mut()) {
            Some(request) => {
                request.insert("dryRun".into(), serde_json::Value::Bool(true));
            }
            None => bail!("the review has no request object"),
        }
        body = serde_json::to_vec(&value)?;
    }
    // A dry run only reads: the embedded ledger is copied into memory as `status` reads it,
    // so it works while `serve` holds the journal and creates nothing when there is none yet.
    let config = args.webhook.config();
    let options = OpenOptions {
        read_only: args.dry_run,
        ..OpenOptions::default()
    };
    let recording = !args.dry_run && matches!(config.ledger, LedgerConfig::Embedded { .. });
    let built = crate::app::build(&config, Default::default(), &options)
        .await
        .with_context(|| {
            if recording {
                format!(
                    "opening the embedded ledger in {} to record the review's claim (with --dry-run it is only read, also while `serve` runs)",
                    args.webhook.state_dir.display()
                )
            } else {
                "opening the ledger".to_string()
            }
        })?;
    let (webhook, ledger) = (built.webhook, built.ledger);
    let endpoint = if args.validate {
        Endpoint::validate
    } else {
        Endpoint::mutate
    };
    let answer = webhook.review(endpoint, &body).await;
    ledger.close().await;
    let json = answer.map_err(|e| anyhow::anyhow!("HTTP 400: {e}"))?;
    let value: serde_json::Value = serde_json::from_slice(&json)?;
    if let Some(patch) = value["response"]["patch"].as_str() {
        // with -v, what `jq -r .response.patch | base64 -d` shows
        use base64::Engine;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
        match decoded {
            Ok(patch) => tracing::info!("the response's JSON Patch, decoded: {patch}"),
            Err(error) => tracing::warn!(%error, "the response's patch is not base64"),
        }
    }
    emit(&(serde_json::to_string_pretty(&value)? + "\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ip_webhook_ledger::ClusterSource;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert!(parse_duration("2 weeks").is_err());
        assert!(
            parse_duration("5d")
                .unwrap_err()
                .to_string()
                .contains("unknown unit")
        );
    }

    /// The values Go's time.ParseDuration takes (and the chart's schema allows).
    #[test]
    fn go_durations() {
        let ok = |text: &str, nanos: u64| {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_nanos(nanos)),
                "{text}"
            )
        };
        ok("1m30s", 90_000_000_000);
        ok("1.5s", 1_500_000_000);
        ok("2h45m", 9_900_000_000_000);
        ok("1h1m1s1ms1us1ns", 3_661_001_001_001);
        ok("300µs", 300_000);
        ok("0.5m", 30_000_000_000);
        ok(".5s", 500_000_000);
        ok("1.0000000001s", 1_000_000_000);
        ok("0", 0);
        for bad in [
            "",
            "s",
            "1.2.3s",
            "1m30",
            "1x",
            "-1s",
            "1s 2s",
            "99999999999999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert!(
            parse_duration("1m30")
                .unwrap_err()
                .to_string()
                .contains("30 has no unit")
        );
    }

    #[test]
    fn listen_addresses() {
        let addr = |text: &str| {
            parse_listen(text)
                .map(|a| a.to_string())
                .map_err(|e| e.to_string())
        };
        assert_eq!(addr(":8443"), Ok("0.0.0.0:8443".into()));
        assert_eq!(addr("127.0.0.1:8443"), Ok("127.0.0.1:8443".into()));
        assert_eq!(addr("[::]:8443"), Ok("[::]:8443".into()));
        assert_eq!(addr("localhost:8080"), Ok("127.0.0.1:8080".into()));
        assert!(addr(":http").unwrap_err().contains("bad port"));
        assert!(
            addr("example.com:80")
                .unwrap_err()
                .contains("IP address or localhost")
        );
        let missing = |text: &str, why: &str| {
            assert_eq!(
                addr(text),
                Err(format!(
                    "{text:?} is not a listen address like :8443, 0.0.0.0:8443 or [::]:8443 ({why})"
                ))
            )
        };
        missing("localhost", "the port is missing: write localhost:8443");
        missing("127.0.0.1", "the port is missing: write 127.0.0.1:8443");
        missing("::1", "the port is missing: write [::1]:8443");
        missing("[::]", "the port is missing: write [::]:8443");
        missing(
            "8443",
            "the host is missing: write :8443 for every IPv4 address",
        );
    }

    #[test]
    fn apps_are_namespace_slash_name() {
        assert_eq!(parse_app("prod/web"), Ok("prod/web".into()));
        assert!(
            parse_app("web")
                .unwrap_err()
                .to_string()
                .contains("e.g. default/web")
        );
        for bad in ["/web", "prod/", "a/b/c", ""] {
            assert!(parse_app(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_cluster_is_found_in_kubectls_order() {
        let home = tempfile::tempdir().unwrap();
        let flag = Path::new("/etc/kc");
        let env = || Some("/env/kc".to_string());
        let h = || Some(home.path().to_path_buf());
        assert_eq!(
            find_cluster_in(Some(flag), env(), h(), true),
            Some(ClusterSource::Flag(flag.into()))
        );
        assert_eq!(
            find_cluster_in(None, env(), h(), true),
            Some(ClusterSource::Env("/env/kc".into()))
        );
        // no ~/.kube/config yet: the service account, else nothing
        assert_eq!(
            find_cluster_in(None, Some(String::new()), h(), true),
            Some(ClusterSource::InCluster)
        );
        assert_eq!(find_cluster_in(None, None, h(), false), None);
        let config = home.path().join(".kube/config");
        std::fs::create_dir_all(config.parent().unwrap()).unwrap();
        std::fs::write(&config, "apiVersion: v1\nkind: Config\n").unwrap();
        assert_eq!(
            find_cluster_in(None, None, h(), true),
            Some(ClusterSource::Home(config))
        );
    }

    #[test]
    fn operator_ledger_choice() {
        let source = |ledger: Option<LedgerKind>, state_dir: Option<&str>| {
            let mut args = vec!["ip-webhook", "status"];
            if let Some(dir) = state_dir {
                args.extend(["--state-dir", dir]);
            }
            let kind;
            if let Some(k) = ledger {
                kind = format!("{k:?}").to_lowercase();
                args.extend(["--ledger", kind.as_str()]);
            }
            match Cli::try_parse_from(args).unwrap().command {
                Command::Status(status) => status.source,
                _ => unreachable!(),
            }
        };
        let cluster = Some(ClusterSource::InCluster);
        let ledger = |source: &LedgerArgs, cluster: Option<ClusterSource>| {
            source.config(cluster, None).map(|c| c.ledger)
        };
        let embedded = |dir: &str| LedgerConfig::Embedded {
            state_dir: dir.into(),
        };
        assert_eq!(
            ledger(&source(None, Some("s")), cluster.clone()),
            Ok(embedded("s"))
        );
        let in_cluster = ip_webhook_ledger::KubeAccess {
            source: ClusterSource::InCluster,
            context: None,
        };
        assert_eq!(
            ledger(&source(None, None), cluster.clone()),
            Ok(LedgerConfig::Kubernetes(in_cluster.clone()))
        );
        // the kubernetes ledger's API server is where pods are looked up too
        assert_eq!(
            source(None, None)
                .config(cluster.clone(), None)
                .unwrap()
                .api_server,
            Some(in_cluster)
        );
        assert_eq!(
            ledger(&source(Some(LedgerKind::Embedded), None), cluster.clone()),
            Ok(embedded(DEFAULT_STATE_DIR))
        );
        assert!(matches!(
            ledger(&source(Some(LedgerKind::Etcd), None), None),
            Ok(LedgerConfig::Etcd(options)) if options.prefix == "/ip-webhook/"
        ));
        let error = ledger(&source(None, None), None).unwrap_err().to_string();
        assert!(error.starts_with("no cluster found: no --kubeconfig, $KUBECONFIG is unset, ~/.kube/config does not exist"), "{error}");
        assert!(ledger(&source(Some(LedgerKind::Kubernetes), None), None).is_err());
    }

    /// `serve`'s default state dir, when it holds a ledger, is read by the operator commands
    /// unless something names where the claims are.
    #[test]
    fn the_local_state_dir_is_used_when_nothing_names_a_cluster() {
        let local = tempfile::tempdir().unwrap();
        let local = local.path();
        let args = |extra: &[&str]| {
            let cli = Cli::try_parse_from([&["ip-webhook", "status"], extra].concat()).unwrap();
            match cli.command {
                Command::Status(status) => status.source,
                _ => unreachable!(),
            }
        };
        let ledger = |extra: &[&str], cluster: Option<ClusterSource>| {
            args(extra).config(cluster, Some(local)).map(|c| c.ledger)
        };
        let home = || Some(ClusterSource::Home("/home/me/.kube/config".into()));
        let kubernetes = |source: ClusterSource, context: Option<&str>| {
            Ok(LedgerConfig::Kubernetes(ip_webhook_ledger::KubeAccess {
                source,
                context: context.map(str::to_string),
            }))
        };
        // an empty directory is no ledger: the cluster, or the error
        assert_eq!(ledger(&[], home()), kubernetes(home().unwrap(), None));
        assert_eq!(ledger(&[], None), Err(ConfigError::NoCluster));
        std::fs::write(local.join("journal.00000000000000000001"), b"").unwrap();
        let here = Ok(LedgerConfig::Embedded {
            state_dir: local.to_path_buf(),
        });
        assert_eq!(ledger(&[], None), here);
        // ~/.kube/config names no cluster (`serve` does not read it either) ...
        assert_eq!(ledger(&[], home()), here);
        // ... $KUBECONFIG, --kubeconfig, --context, a pod and the flags do
        let env = ClusterSource::Env("/env/kc".into());
        assert_eq!(ledger(&[], Some(env.clone())), kubernetes(env, None));
        let flag = ClusterSource::Flag("/etc/kc".into());
        assert_eq!(
            ledger(&["--kubeconfig", "/etc/kc"], Some(flag.clone())),
            kubernetes(flag, None)
        );
        assert_eq!(
            ledger(&["--context", "prod"], home()),
            kubernetes(home().unwrap(), Some("prod"))
        );
        let pod = ClusterSource::InCluster;
        assert_eq!(ledger(&[], Some(pod.clone())), kubernetes(pod, None));
        assert_eq!(
            ledger(&["--ledger", "kubernetes"], home()),
            kubernetes(home().unwrap(), None)
        );
        assert_eq!(
            ledger(&["--state-dir", "elsewhere"], None),
            Ok(LedgerConfig::Embedded {
                state_dir: "elsewhere".into()
            })
        );
        // read off-cluster: no API server to look pods up on
        assert_eq!(
            args(&[]).config(home(), Some(local)).unwrap().api_server,
            None
        );
    }

    #[test]
    fn an_error_is_one_line_without_repeated_causes() {
        let root = std::io::Error::other("connection refused");
        let error = anyhow::Error::new(root)
            .context("client error (Connect): connection refused")
            .context("reading IPClaims");
        assert_eq!(
            error_line(&error),
            "reading IPClaims: client error (Connect): connection refused"
        );
        assert_eq!(exit_code(&error), 1);
        let no = anyhow::Error::new(AnswerIsNo("2 of 7 checks failed".into())).context("check");
        assert_eq!(exit_code(&no), 3);
        assert_eq!(error_line(&no), "check: 2 of 7 checks failed");
    }

    /// Each command's help lists its own flags: the serve-only ones stay out of the operator
    /// commands.
    #[test]
    fn each_command_lists_only_its_own_flags() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let flags = |name: &str| -> Vec<String> {
            cli.find_subcommand(name)
                .unwrap()
                .get_arguments()
                .filter_map(|a| a.get_long().map(str::to_string))
                .collect()
        };
        let serve_only = [
            "check-calico-ippools",
            "check-kube-ovn-subnets",
            "tls-cert-file",
            "self-signed",
            "reservation-ttl",
            "lease-name",
            "calico-reservation",
            "listen",
        ];
        for command in ["status", "explain", "release"] {
            let flags = flags(command);
            for flag in serve_only {
                assert!(!flags.iter().any(|f| f == flag), "{command} lists --{flag}");
            }
            for flag in [
                "kubeconfig",
                "context",
                "state-dir",
                "ledger",
                "verbose",
                "namespace",
            ] {
                assert!(flags.iter().any(|f| f == flag), "{command} lacks --{flag}");
            }
        }
        let release = flags("release");
        for flag in ["pools-file", "cni", "output"] {
            assert!(!release.iter().any(|f| f == flag), "release lists --{flag}");
        }
        let check = flags("check");
        for flag in ["pools-file", "cni"] {
            assert!(!check.iter().any(|f| f == flag), "check lists --{flag}");
        }
        // --drift reads the claims as status does.
        for flag in [
            "tls-server-name",
            "kubeconfig",
            "context",
            "webhook-configuration",
            "drift",
            "state-dir",
            "ledger",
            "namespace",
        ] {
            assert!(check.iter().any(|f| f == flag), "check lacks --{flag}");
        }
        let serve = flags("serve");
        for flag in serve_only {
            assert!(serve.iter().any(|f| f == flag), "serve lacks --{flag}");
        }
    }

    /// `--log-format` is `serve`'s (the other commands log only with -v), and the top level's
    /// (before the command), not every command's.
    #[test]
    fn only_serve_lists_the_log_format() {
        use clap::CommandFactory;
        let mut cli = Cli::command();
        // built: a global flag is then in every subcommand's arguments, as in its help
        cli.build();
        let lists = |command: &clap::Command| {
            command
                .get_arguments()
                .any(|a| a.get_long() == Some("log-format") && !a.is_hide_set())
        };
        assert!(lists(&cli), "the top-level help omits --log-format");
        for command in cli.get_subcommands() {
            let name = command.get_name();
            assert_eq!(lists(command), name == "serve", "{name}");
            for sub in command.get_subcommands() {
                assert!(!lists(sub), "{name} {}", sub.get_name());
            }
        }
        let json = |args: &[&str]| {
            matches!(
                Cli::try_parse_from(args).unwrap().log_format(),
                LogFormat::Json
            )
        };
        assert!(json(&["ip-webhook", "serve", "--log-format", "json"]));
        assert!(json(&["ip-webhook", "--log-format", "json", "serve"]));
        assert!(json(&[
            "ip-webhook",
            "--log-format",
            "json",
            "status",
            "-v"
        ]));
        assert!(!json(&["ip-webhook", "serve"]));
        assert!(Cli::try_parse_from(["ip-webhook", "status", "--log-format", "json"]).is_err());
    }

    /// `completion --help` says where each shell it accepts keeps the script.
    #[test]
    fn completion_help_covers_every_shell() {
        use clap::{CommandFactory, ValueEnum};
        let mut cli = Cli::command();
        let help = cli
            .find_subcommand_mut("completion")
            .unwrap()
            .render_long_help()
            .to_string();
        for shell in clap_complete::Shell::value_variants() {
            let name = shell.to_possible_value().unwrap().get_name().to_string();
            assert!(
                help.contains(&format!("{name}: ")),
                "completion --help says nothing of {name}:\n{help}"
            );
        }
    }

    #[test]
    fn the_plugin_is_known_by_its_file_name() {
        use std::ffi::OsStr;
        for yes in [
            "kubectl-ipw",
            "/usr/local/bin/kubectl-ipw",
            "kubectl-ipw.exe",
            "./bin/kubectl-ipw.exe",
        ] {
            assert!(is_plugin_name(OsStr::new(yes)), "{yes}");
        }
        for no in [
            "ip-webhook",
            "/usr/bin/kubectl-ipw2",
            "kubectl-ipw/ip-webhook",
            "kubectl",
            "",
        ] {
            assert!(!is_plugin_name(OsStr::new(no)), "{no}");
        }
    }

    #[test]
    fn the_plugin_says_kubectl_ipw_in_usage_and_errors() {
        let mut plugin = command(true);
        plugin.build();
        let help = plugin
            .find_subcommand_mut("status")
            .unwrap()
            .render_help()
            .to_string();
        assert!(
            help.contains("Usage: kubectl ipw status [OPTIONS]"),
            "{help}"
        );
        let error = command(true)
            .try_get_matches_from(["kubectl-ipw", "check", "--drift", "--url", "https://x"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("Usage: kubectl ipw check"), "{error}");
        let error = command(false)
            .try_get_matches_from(["ip-webhook", "release"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("Usage: ip-webhook release"), "{error}");
    }

    #[test]
    fn check_needs_a_url_unless_drift() {
        let error = Cli::try_parse_from(["ip-webhook", "check"]).unwrap_err();
        assert!(error.to_string().contains("--url"), "{error}");
        let cli = Cli::try_parse_from(["ip-webhook", "check", "--drift", "-n", "prod"]).unwrap();
        match cli.command {
            Command::Check(args) => {
                assert!(args.drift.enabled);
                assert_eq!(args.drift.namespace.as_deref(), Some("prod"));
                assert_eq!(args.url, None);
            }
            _ => unreachable!(),
        }
        assert!(
            Cli::try_parse_from(["ip-webhook", "check", "--url", "https://x", "-n", "p"]).is_err()
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64Mi"), Ok(64 * 1024 * 1024));
        assert_eq!(parse_size("7340032"), Ok(7340032));
        assert_eq!(parse_size("1Gi"), Ok(1 << 30));
        assert!(
            parse_size("64MB")
                .unwrap_err()
                .to_string()
                .contains("unknown unit")
        );
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn ledger_selection() {
        use LedgerKind::*;
        assert_eq!(choose_ledger(None, false, false), Embedded);
        assert_eq!(choose_ledger(None, true, false), Kubernetes);
        assert_eq!(choose_ledger(None, false, true), Kubernetes);
        assert_eq!(choose_ledger(Some(Embedded), true, true), Embedded);
        assert_eq!(choose_ledger(Some(Kubernetes), false, false), Kubernetes);
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn every_command_and_flag_is_documented() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let mut undocumented = Vec::new();
        for command in cli.get_subcommands() {
            let about = command
                .get_about()
                .map(|a| a.to_string())
                .unwrap_or_default();
            if about.len() < 20 {
                undocumented.push(format!("{}: no about line", command.get_name()));
            }
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                if help.len() < 3 {
                    undocumented.push(format!("{} --{id}: no help", command.get_name()));
                }
            }
        }
        assert!(undocumented.is_empty(), "{undocumented:#?}");
        let names: Vec<&str> = cli.get_subcommands().map(|c| c.get_name()).collect();
        for wanted in [
            "serve", "review", "crds", "status", "explain", "release", "check",
        ] {
            assert!(names.contains(&wanted), "{wanted} missing from {names:?}");
        }
    }
}
