//! The one place a ledger configuration becomes a ledger: `serve`, `review` and every operator
//! command open theirs with [`open`], and reach the API server with [`connect`].
//!
//! A configuration is plain data ([`LedgerConfig`]); the command line makes it (`cli/`), and
//! tests build it directly.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::embedded::CommitCounters;
#[cfg(feature = "etcd")]
use super::etcd::EtcdLedger;
use super::network::Network;
use super::{EmbeddedLedger, KubeLedger, Ledger, LedgerError, MemoryLedger};

/// Which ledger, and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerConfig {
    /// The journal and snapshots in this state dir.
    Embedded { state_dir: PathBuf },
    /// One IPClaim per IP, through this API server.
    Kubernetes(KubeAccess),
    /// One key per IP in etcd (a build with the `etcd` feature).
    Etcd(EtcdOptions),
}

impl LedgerConfig {
    /// The name `--ledger` gives this kind (and [`Ledger::kind`] reports).
    pub fn kind(&self) -> &'static str {
        match self {
            LedgerConfig::Embedded { .. } => "embedded",
            LedgerConfig::Kubernetes(_) => "kubernetes",
            LedgerConfig::Etcd(_) => "etcd",
        }
    }
}

/// How a command uses its ledger.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Only read: an embedded ledger is copied into memory (the live server keeps its lock and
    /// writes on; the copy is what it had made durable), so nothing is created or changed.
    /// The other kinds are opened as they are: a dry-run review writes nothing to them.
    pub read_only: bool,
    /// The embedded ledger must exist already (a state dir with a journal or snapshot);
    /// without, an absent one is created (or, read-only, read as empty). An API server must
    /// serve IPClaims either way.
    pub existing: bool,
    /// The writer's counters of an embedded ledger opened for writing.
    pub counters: CommitCounters,
    /// Whose books: the primary interface's (`None`), or a secondary network's, kept apart
    /// ([`Network`] says where each ledger keeps them).
    pub network: Option<Network>,
}

/// Where an API server was found, in kubectl's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterSource {
    /// `--kubeconfig FILE`.
    Flag(PathBuf),
    /// `$KUBECONFIG` (one path, or several separated by `:`).
    Env(String),
    /// `~/.kube/config`, which exists.
    Home(PathBuf),
    /// The pod's service account (KUBERNETES_SERVICE_HOST is set).
    InCluster,
    /// Whatever the client library infers ($KUBECONFIG, ~/.kube/config, the in-cluster
    /// service account): `serve` without `--kubeconfig`.
    Inferred,
}

impl std::fmt::Display for ClusterSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterSource::Flag(path) => write!(f, "--kubeconfig {}", path.display()),
            ClusterSource::Env(value) => write!(f, "$KUBECONFIG ({value})"),
            ClusterSource::Home(path) => write!(f, "{}", path.display()),
            ClusterSource::InCluster => f.write_str("the in-cluster service account"),
            ClusterSource::Inferred => {
                f.write_str("$KUBECONFIG, ~/.kube/config or the in-cluster service account")
            }
        }
    }
}

/// How to reach an API server: where its configuration is, and which context of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeAccess {
    pub source: ClusterSource,
    pub context: Option<String>,
}

impl KubeAccess {
    /// `--kubeconfig FILE` if given, else what the client library infers.
    pub fn new(kubeconfig: Option<&Path>, context: Option<&str>) -> KubeAccess {
        KubeAccess {
            source: match kubeconfig {
                Some(path) => ClusterSource::Flag(path.to_path_buf()),
                None => ClusterSource::Inferred,
            },
            context: context.map(str::to_string),
        }
    }
}

/// An API server reached: two clients and its name for messages.
#[derive(Clone)]
pub struct ApiServer {
    /// For watches and pod lookups (long reads, no read timeout).
    pub watches: kube::Client,
    /// For IPClaim reads and writes (cut at `ADMISSION_API_TIMEOUT`).
    pub admission: kube::Client,
    /// `the API server https://… (from $KUBECONFIG (…))`.
    pub name: String,
}

/// A ledger opened, with what its kind brings along.
pub struct Opened {
    pub ledger: Arc<dyn Ledger>,
    /// The API server of the kubernetes ledger (also where its pools are).
    pub api_server: Option<ApiServer>,
    /// The etcd ledger, whose watch keeps an allocator in step with other replicas.
    #[cfg(feature = "etcd")]
    pub etcd: Option<Arc<EtcdLedger>>,
}

/// Why a ledger or an API server could not be opened. The message says where and what.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// No embedded ledger where one must exist.
    #[error("{0}")]
    NoLedger(String),
    /// The embedded ledger's state dir exists but cannot be read (permissions, not a
    /// directory): the message names it and the cause.
    #[error("{0}")]
    Unreadable(String),
    /// The embedded ledger could not be opened (another process holds it, damage, …).
    #[error(transparent)]
    Embedded(LedgerError),
    /// Reading a ledger failed.
    #[error("{what}")]
    Read {
        what: String,
        #[source]
        source: LedgerError,
    },
    /// The API server's configuration or clients.
    #[error("{what}")]
    Kube {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The API server answers, but serves no IPClaims.
    #[error("{0}")]
    NotInstalled(String),
    #[error("this build has no etcd support; rebuild with --features etcd")]
    NoEtcd,
}

fn kube_error(what: String) -> impl FnOnce(kube::Error) -> OpenError {
    move |e| OpenError::Kube {
        what,
        source: Box::new(e),
    }
}

/// How long one IPClaim request on the admission path may take: well inside the API server's
/// webhook timeout (10s by default), so a stuck API server gets a clear denial, not a timeout.
pub(crate) const ADMISSION_API_TIMEOUT: Duration = Duration::from_secs(5);

/// Open the ledger `config` names, as `options` say.
pub async fn open(config: &LedgerConfig, options: &OpenOptions) -> Result<Opened, OpenError> {
    let plain = |ledger: Arc<dyn Ledger>| Opened {
        ledger,
        api_server: None,
        #[cfg(feature = "etcd")]
        etcd: None,
    };
    let primary = config;
    let config = &books_of(config, options.network.as_ref())?;
    match config {
        LedgerConfig::Embedded { state_dir } => {
            if options.existing {
                existing_embedded(state_dir)?;
            }
            if options.read_only {
                Ok(plain(Arc::new(embedded_copy(state_dir).await?)))
            } else {
                let ledger = EmbeddedLedger::open(state_dir, options.counters.clone())
                    .map_err(OpenError::Embedded)?;
                if let (Some(network), LedgerConfig::Embedded { state_dir: primary }) =
                    (&options.network, primary)
                {
                    // before any of its claims is answered: its books gone are refused
                    super::embedded::register_books(primary, &network.books())
                        .map_err(OpenError::Embedded)?;
                }
                Ok(plain(Arc::new(ledger)))
            }
        }
        LedgerConfig::Kubernetes(access) => {
            let api_server = connect(access).await?;
            // Every use lists IPClaims first (`serve` loads them all): without the CRD that
            // list is a 404, which says nothing about what is missing.
            installed(&api_server).await?;
            let ledger = match &options.network {
                None => KubeLedger::new(api_server.admission.clone()),
                Some(network) => {
                    KubeLedger::for_network(api_server.admission.clone(), network.clone())
                }
            };
            Ok(Opened {
                api_server: Some(api_server),
                ..plain(Arc::new(ledger))
            })
        }
        #[cfg(feature = "etcd")]
        LedgerConfig::Etcd(etcd) => {
            let ledger = EtcdLedger::connect(etcd)
                .await
                // the cause names the endpoints where they matter (not for a missing file)
                .map_err(|source| OpenError::Read {
                    what: "opening the etcd ledger".into(),
                    source,
                })?;
            let ledger = Arc::new(ledger);
            Ok(Opened {
                etcd: Some(ledger.clone()),
                ..plain(ledger)
            })
        }
        #[cfg(not(feature = "etcd"))]
        LedgerConfig::Etcd(_) => Err(OpenError::NoEtcd),
    }
}

/// Where the books of `network` are for `config`: a state dir inside the primary one, an
/// etcd prefix beside the primary one; the API server's are the same IPClaims, told apart by
/// label.
fn books_of(config: &LedgerConfig, network: Option<&Network>) -> Result<LedgerConfig, OpenError> {
    let Some(network) = network else {
        return Ok(config.clone());
    };
    Ok(match config {
        LedgerConfig::Embedded { state_dir } => LedgerConfig::Embedded {
            state_dir: network.state_dir(state_dir),
        },
        LedgerConfig::Kubernetes(access) => LedgerConfig::Kubernetes(access.clone()),
        LedgerConfig::Etcd(etcd) => {
            let prefix = network.etcd_prefix(&etcd.prefix).ok_or_else(|| {
                OpenError::NoLedger(format!(
                    "secondary network {network}: its claims need an etcd prefix of their own beside --etcd-prefix, and every key is under the prefix /; give --etcd-prefix a name (/ip-webhook/)"
                ))
            })?;
            LedgerConfig::Etcd(EtcdOptions {
                prefix,
                ..etcd.clone()
            })
        }
    })
}

/// Every claim of the embedded ledger in `state_dir` as a [`MemoryLedger`], read without
/// creating or changing anything, also while a server holds the ledger: the journal is read
/// the way `status` reads it ([`super::embedded::read_claims`]), not opened. No ledger there
/// yet reads as an empty one.
async fn embedded_copy(state_dir: &Path) -> Result<MemoryLedger, OpenError> {
    let claims = if listable_state_dir(state_dir)? && super::embedded::exists_in(state_dir) {
        super::embedded::read_claims(state_dir).map_err(OpenError::Embedded)?
    } else {
        Vec::new()
    };
    let memory = MemoryLedger::new();
    for claim in claims {
        memory
            .create(claim.into())
            .await
            .map_err(OpenError::Embedded)?;
    }
    Ok(memory)
}

/// That `dir` is a state dir holding an embedded ledger, checked without creating anything.
pub fn existing_embedded(dir: &Path) -> Result<(), OpenError> {
    if !listable_state_dir(dir)? {
        return Err(OpenError::NoLedger(format!(
            "no embedded ledger: {} does not exist (give the --state-dir of `ip-webhook serve`)",
            dir.display()
        )));
    }
    if !super::embedded::exists_in(dir) {
        return Err(OpenError::NoLedger(format!(
            "no embedded ledger in {}: no journal or snapshot there (is it the --state-dir of `ip-webhook serve`?)",
            dir.display()
        )));
    }
    Ok(())
}

/// Whether the state dir `dir` exists (`false` only when it is absent), having listed it: a dir
/// that cannot be read (EACCES, a path through a file) is an error naming it and the cause,
/// never an absent or empty ledger, which would hand out again the IPs it records.
pub(crate) fn listable_state_dir(dir: &Path) -> Result<bool, OpenError> {
    use std::os::unix::fs::MetadataExt;
    let unreadable = |e: std::io::Error, about: String| {
        OpenError::Unreadable(format!(
            "cannot read the state dir {}{about}: {e}",
            dir.display()
        ))
    };
    let meta = match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(unreadable(e, String::new())),
        Ok(meta) => meta,
    };
    if !meta.is_dir() {
        return Err(OpenError::Unreadable(format!(
            "the state dir {} is not a directory (give the --state-dir of `ip-webhook serve`)",
            dir.display()
        )));
    }
    // Owner and mode: what a permission error is about.
    let about = format!(
        " (owner uid {}, mode {:04o})",
        meta.uid(),
        meta.mode() & 0o7777
    );
    std::fs::read_dir(dir)
        .and_then(|mut entries| entries.next().transpose())
        .map_err(|e| unreadable(e, about))?;
    Ok(true)
}

/// Whether the API server serves ip-webhook's IPClaims at all: a cluster without them (no
/// ip-webhook installed, or the wrong context) gets one sentence saying how to install them,
/// not a 404 Status dump.
async fn installed(api_server: &ApiServer) -> Result<(), OpenError> {
    let probe = kube::Api::<crate::crd::IPClaim>::all(api_server.admission.clone())
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await;
    match probe {
        Err(kube::Error::Api(status)) if status.code == 404 => {
            Err(OpenError::NotInstalled(format!(
                "{} serves no IPClaims (ipclaims.ip-webhook.io): ip-webhook is not installed there (wrong --context?); install its CRDs with `ip-webhook crds | kubectl apply -f -` or the Helm chart",
                api_server.name
            )))
        }
        Err(error) => Err(kube_error(format!(
            "reading IPClaims from {}",
            api_server.name
        ))(error)),
        Ok(_) => Ok(()),
    }
}

/// Reach the API server `access` names: its configuration, then the two clients.
pub async fn connect(access: &KubeAccess) -> Result<ApiServer, OpenError> {
    let config = kube_config(access).await?;
    let name = match &access.source {
        ClusterSource::Inferred => format!("the API server {}", config.cluster_url),
        source => format!("the API server {} (from {source})", config.cluster_url),
    };
    let (watches, admission) = clients_from(config)?;
    Ok(ApiServer {
        watches,
        admission,
        name,
    })
}

/// The client configuration from where `access` says the API server is.
pub(crate) async fn kube_config(access: &KubeAccess) -> Result<kube::Config, OpenError> {
    let context = access.context.as_deref();
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    match &access.source {
        ClusterSource::Flag(path) => {
            let read = async {
                let file =
                    kube::config::Kubeconfig::read_from(path).map_err(|e| OpenError::Kube {
                        what: format!("reading kubeconfig {}", path.display()),
                        source: Box::new(e),
                    })?;
                kube::Config::from_custom_kubeconfig(file, &options)
                    .await
                    .map_err(|e| OpenError::Kube {
                        what: format!("using kubeconfig {}", path.display()),
                        source: Box::new(e),
                    })
            };
            read.await.map_err(|e| through(&access.source, Box::new(e)))
        }
        ClusterSource::Env(_) | ClusterSource::Home(_) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| through(&access.source, e.into())),
        ClusterSource::InCluster if context.is_some() => Err(through(
            &access.source,
            "--context needs a kubeconfig".into(),
        )),
        ClusterSource::InCluster => {
            kube::Config::incluster().map_err(|e| through(&access.source, e.into()))
        }
        ClusterSource::Inferred => match context {
            Some(context) => {
                kube::Config::from_kubeconfig(&options)
                    .await
                    .map_err(|e| OpenError::Kube {
                        what: format!("using context {context:?} of $KUBECONFIG or ~/.kube/config"),
                        source: Box::new(e),
                    })
            }
            None => kube::Config::infer().await.map_err(|e| OpenError::Kube {
                what: "finding the API server ($KUBECONFIG, ~/.kube/config or the in-cluster service account)".into(),
                source: Box::new(e),
            }),
        },
    }
}

/// `finding the API server through SOURCE: …`, for a source found as kubectl finds it.
fn through(source: &ClusterSource, error: Box<dyn std::error::Error + Send + Sync>) -> OpenError {
    OpenError::Kube {
        what: format!("finding the API server through {source}"),
        source: error,
    }
}

/// Two clients for one API server: one for watches (long reads), one for the admission path
/// (reads cut at [`ADMISSION_API_TIMEOUT`]).
pub(crate) fn clients_from(
    mut config: kube::Config,
) -> Result<(kube::Client, kube::Client), OpenError> {
    // Named in the API server's audit log and request metrics.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("ip-webhook/", env!("CARGO_PKG_VERSION"))),
    ));
    let mut admission = config.clone();
    admission.read_timeout = Some(ADMISSION_API_TIMEOUT);
    admission.write_timeout = Some(ADMISSION_API_TIMEOUT);
    admission.connect_timeout = Some(ADMISSION_API_TIMEOUT);
    let build = |config| {
        kube::Client::try_from(config).map_err(kube_error("building the Kubernetes client".into()))
    };
    Ok((build(config)?, build(admission)?))
}

/// Where the etcd cluster is and how to talk to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    /// `http://host:2379` or `https://host:2379` (a bare `host:port` means http).
    pub endpoints: Vec<String>,
    /// Key prefix; normalised to one leading and one trailing `/` by the etcd ledger.
    pub prefix: String,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// Deadline of one etcd request, and of the retries of one ledger call.
    pub timeout: Duration,
    /// The watch reloads the whole prefix this often (and after a gap or a reconnect).
    pub resync_period: Duration,
}

impl Default for EtcdOptions {
    fn default() -> EtcdOptions {
        EtcdOptions {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "/ip-webhook/".into(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            timeout: Duration::from_secs(5),
            resync_period: Duration::from_secs(300),
        }
    }
}
