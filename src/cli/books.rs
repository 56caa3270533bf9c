//! Which books (ledger) and which cluster a command uses, from its arguments and the
//! environment.

use super::*;

pub fn in_pod() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|v| !v.is_empty())
}

pub fn choose_ledger(given: Option<LedgerKind>, kubeconfig: bool, in_pod: bool) -> LedgerKind {
    match given {
        Some(kind) => kind,
        None if kubeconfig || in_pod => LedgerKind::Kubernetes,
        None => LedgerKind::Embedded,
    }
}

/// Where an operator command found the API server, in kubectl's order.
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
}

impl std::fmt::Display for ClusterSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterSource::Flag(path) => write!(f, "--kubeconfig {}", path.display()),
            ClusterSource::Env(value) => write!(f, "$KUBECONFIG ({value})"),
            ClusterSource::Home(path) => write!(f, "{}", path.display()),
            ClusterSource::InCluster => f.write_str("the in-cluster service account"),
        }
    }
}

/// Find the API server as kubectl does: --kubeconfig, else $KUBECONFIG, else ~/.kube/config,
/// else the in-cluster service account. `None` when there is none of these.
pub fn find_cluster(access: &ClusterAccess) -> Option<ClusterSource> {
    find_cluster_in(
        access.kubeconfig.as_deref(),
        std::env::var("KUBECONFIG").ok(),
        std::env::var_os("HOME").map(PathBuf::from),
        in_pod(),
    )
}

pub fn find_cluster_in(
    flag: Option<&Path>,
    env: Option<String>,
    home: Option<PathBuf>,
    in_pod: bool,
) -> Option<ClusterSource> {
    if let Some(path) = flag {
        return Some(ClusterSource::Flag(path.to_path_buf()));
    }
    if let Some(value) = env.filter(|v| !v.trim().is_empty()) {
        return Some(ClusterSource::Env(value));
    }
    if let Some(config) = home
        .map(|h| h.join(".kube").join("config"))
        .filter(|c| c.is_file())
    {
        return Some(ClusterSource::Home(config));
    }
    in_pod.then_some(ClusterSource::InCluster)
}

/// The ledger an operator command reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Books {
    Embedded(PathBuf),
    Kubernetes(ClusterSource),
    Etcd,
}

/// Choose the ledger of an operator command: `--ledger` if given; else `--state-dir` means
/// the embedded ledger; else the cluster kubectl would use; else an error saying where it
/// looked and what to pass.
pub fn choose_books(
    source: &LedgerSource,
    cluster: Option<ClusterSource>,
) -> Result<Books, String> {
    let state_dir = || {
        source
            .state_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR))
    };
    match (source.ledger, cluster) {
        (Some(LedgerKind::Embedded), _) => Ok(Books::Embedded(state_dir())),
        (Some(LedgerKind::Etcd), _) => Ok(Books::Etcd),
        (None, _) if source.state_dir.is_some() => Ok(Books::Embedded(state_dir())),
        (Some(LedgerKind::Kubernetes) | None, Some(cluster)) => Ok(Books::Kubernetes(cluster)),
        (Some(LedgerKind::Kubernetes) | None, None) => {
            let local = Path::new(DEFAULT_STATE_DIR).join("ledger.redb");
            let hint = if local.is_file() {
                format!(" ({DEFAULT_STATE_DIR} holds one)")
            } else {
                String::new()
            };
            Err(format!(
                "no cluster found: no --kubeconfig, $KUBECONFIG is unset, ~/.kube/config does \
                 not exist and this is not a pod; give --kubeconfig FILE, or --state-dir DIR to \
                 read the embedded ledger of `ip-webhook serve`{hint}"
            ))
        }
    }
}
