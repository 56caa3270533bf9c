//! Arguments to configuration: the one place flags, and the environment some of them default
//! from (POD_NAME, POD_NAMESPACE, KUBERNETES_SERVICE_HOST, the mounted service account),
//! become the plain configurations of [`crate::app`] and [`ip_webhook_ledger`].

use super::*;
use crate::app::{ClientCaConfig, ServeConfig, TlsConfig, WebhookConfig};
use crate::cluster::lease::LeaseSettings;
use crate::cluster::{ClusterOptions, PodIpSource, Rules};
use crate::decisions::Settings;
use crate::server::Limits;
use ip_webhook_ledger::{ClusterSource, EtcdOptions, KubeAccess, LedgerConfig};

pub(crate) fn in_pod() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|v| !v.is_empty())
}

pub(crate) fn choose_ledger(
    given: Option<LedgerKind>,
    kubeconfig: bool,
    in_pod: bool,
) -> LedgerKind {
    match given {
        Some(kind) => kind,
        None if kubeconfig || in_pod => LedgerKind::Kubernetes,
        None => LedgerKind::Embedded,
    }
}

/// Find the API server as kubectl does: --kubeconfig, else $KUBECONFIG, else ~/.kube/config,
/// else the in-cluster service account. `None` when there is none of these.
pub(crate) fn find_cluster(access: &ClusterAccess) -> Option<ClusterSource> {
    find_cluster_in(
        access.kubeconfig.as_deref(),
        std::env::var("KUBECONFIG").ok(),
        std::env::var_os("HOME").map(PathBuf::from),
        in_pod(),
    )
}

pub(crate) fn find_cluster_in(
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

/// The decisions' settings every command shares: the app label and the CNI; the rest as
/// [`Settings::default`] has them.
pub(crate) fn settings(app_label: &str, cni: Cni) -> Settings {
    Settings {
        app_label: app_label.to_string(),
        cni,
        ..Settings::default()
    }
}

impl WebhookArgs {
    /// The ledger to use: --ledger if given; else kubernetes in a pod (KUBERNETES_SERVICE_HOST
    /// set) or with --kubeconfig; else embedded.
    pub(crate) fn ledger_kind(&self) -> LedgerKind {
        choose_ledger(self.ledger, self.kubeconfig.is_some(), in_pod())
    }

    /// Whether there is an API server to ask about pods: in a pod, or given --kubeconfig.
    pub(crate) fn has_api_server(&self) -> bool {
        self.kubeconfig.is_some() || in_pod()
    }

    fn kube_access(&self) -> KubeAccess {
        KubeAccess::new(self.kubeconfig.as_deref(), self.context.as_deref())
    }

    pub(crate) fn ledger_config(&self) -> LedgerConfig {
        match self.ledger_kind() {
            LedgerKind::Embedded => LedgerConfig::Embedded {
                state_dir: self.state_dir.clone(),
            },
            LedgerKind::Kubernetes => LedgerConfig::Kubernetes(self.kube_access()),
            LedgerKind::Etcd => LedgerConfig::Etcd(self.etcd.options()),
        }
    }

    pub(crate) fn config(&self) -> WebhookConfig {
        let ledger = self.ledger_config();
        let pod_api_server = match ledger {
            LedgerConfig::Kubernetes(_) => None,
            _ => self.has_api_server().then(|| self.kube_access()),
        };
        WebhookConfig {
            ledger,
            settings: Settings {
                check_kube_ovn_subnets: self.check_kube_ovn_subnets,
                check_calico_pools: self.check_calico_ippools,
                release_delay: self.release_delay,
                max_release_grace: self.max_release_grace,
                admission_deadline: self.admission_deadline,
                kubevirt: crate::decisions::kubevirt::KubevirtSettings {
                    controllers: self
                        .kubevirt_controller
                        .iter()
                        .filter(|user| !user.is_empty())
                        .cloned()
                        .collect(),
                    release_on_stop: self.kubevirt_release_on_stop,
                },
                ..settings(&self.app_label, self.cni)
            },
            pools_file: self.pools_file.clone(),
            // The IPClaim guard admits the server's own writes: its service account, and any
            // name given.
            trusted_usernames: crate::decisions::claim_guard::own_service_account()
                .into_iter()
                .chain(self.trusted_username.iter().cloned())
                .collect(),
            pod_api_server,
            instance: std::env::var("POD_NAME").ok(),
            networks: self.networks.clone(),
        }
    }
}

impl EtcdArgs {
    pub(crate) fn options(&self) -> EtcdOptions {
        EtcdOptions {
            endpoints: self.etcd_endpoints.clone(),
            prefix: self.etcd_prefix.clone(),
            ca_file: self.etcd_ca_file.clone(),
            cert_file: self.etcd_cert_file.clone(),
            key_file: self.etcd_key_file.clone(),
            timeout: self.etcd_timeout,
            resync_period: self.etcd_resync_period.max(Duration::from_secs(1)),
        }
    }
}

impl ServeArgs {
    pub(crate) fn config(&self) -> ServeConfig {
        let tls = match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => TlsConfig::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            _ => TlsConfig::SelfSigned {
                dns_names: self.dns_names.clone(),
            },
        };
        let mut webhook = self.webhook.config();
        webhook.settings.sticky_grace = self.cluster.sticky_grace;
        ServeConfig {
            webhook,
            state_dir: self.webhook.state_dir.clone(),
            listen: self.listen,
            admin_listen: self.admin_listen,
            tls,
            client_ca: self.client_ca_file.as_ref().map(|file| ClientCaConfig {
                file: file.clone(),
                allowed_names: self.client_allowed_names.clone(),
            }),
            tls_reload_interval: self.tls_reload_interval,
            limits: Limits {
                header_read: self.read_timeout,
                body_read: self.read_timeout,
                drain: self.shutdown_grace,
                idle: self.idle_timeout,
                max_connections: self.max_connections,
                max_handshakes: self
                    .max_handshakes
                    .unwrap_or_else(|| crate::server::default_max_handshakes(self.max_connections)),
                handshake: self.handshake_timeout,
                max_inflight_bytes: self.max_inflight_bytes,
            },
            metrics_max_apps: self.metrics_max_apps,
            cluster: self.cluster_options(),
        }
    }

    /// The reconciler's settings; the Lease's namespace and holder name default from the pod.
    fn cluster_options(&self) -> ClusterOptions {
        let cluster = &self.cluster;
        let namespace = cluster.lease_namespace.clone().unwrap_or_else(|| {
            std::env::var("POD_NAMESPACE")
                .ok()
                .filter(|n| !n.is_empty())
                .or_else(|| {
                    std::fs::read_to_string(
                        "/var/run/secrets/kubernetes.io/serviceaccount/namespace",
                    )
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
            resync_period: cluster.resync_period.max(Duration::from_secs(1)),
            lease: LeaseSettings {
                name: cluster.lease_name.clone(),
                namespace,
                identity: format!("{host}_{:08x}{:x}", nanos, std::process::id()),
                duration: cluster.lease_duration,
                renew_every: cluster.lease_renew_interval,
            },
            app_label: self.webhook.app_label.clone(),
            cni: self.webhook.cni,
            calico_reservation: cluster.calico_reservation,
            node_lost_grace: cluster.node_lost_grace,
            kube_ovn_reservation: cluster.kube_ovn_reservation,
            pod_ips: match cluster.pod_ips_from {
                PodIpsFrom::Auto => PodIpSource::Auto,
                PodIpsFrom::Pods => PodIpSource::Pods,
            },
        }
    }
}

/// The ledger of an operator command, and the API server to look pods up on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OperatorConfig {
    pub(crate) ledger: LedgerConfig,
    /// The kubernetes ledger's API server, or with another ledger the one the flags name (or
    /// the pod's own).
    pub(crate) api_server: Option<KubeAccess>,
}

/// Why an operator command has no ledger to read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ConfigError {
    /// No `--ledger`, no `--state-dir`, no cluster, and no ledger in `serve`'s default state
    /// dir.
    #[error(
        "no cluster found: no --kubeconfig, $KUBECONFIG is unset, ~/.kube/config does \
         not exist and this is not a pod, and ./ip-webhook-state holds no ledger; give \
         --kubeconfig FILE, or --state-dir DIR to read the embedded ledger of `ip-webhook serve`"
    )]
    NoCluster,
}

impl LedgerArgs {
    /// Whether nothing names where the claims are: no `--ledger`, `--state-dir`,
    /// `--kubeconfig` or `--context`, and the cluster found is at most `~/.kube/config` (a
    /// default, not a choice: `serve` does not read it either; `$KUBECONFIG` and a pod's
    /// service account are choices).
    fn nothing_named(&self, cluster: Option<&ClusterSource>) -> bool {
        self.ledger.is_none()
            && self.state_dir.is_none()
            && self.cluster.context.is_none()
            && matches!(cluster, None | Some(ClusterSource::Home(_)))
    }

    /// Choose the ledger of an operator command: `--ledger` if given; else `--state-dir` means
    /// the embedded ledger; else, when nothing names a cluster and `local` (`serve`'s default
    /// state dir, for `status`, `explain` and `release`) holds a ledger, that one, as `serve`
    /// run in the same directory uses it; else the cluster kubectl would use (`cluster`);
    /// else an error saying where it looked and what to pass.
    pub(crate) fn config(
        &self,
        cluster: Option<ClusterSource>,
        local: Option<&Path>,
    ) -> Result<OperatorConfig, ConfigError> {
        let explicit = self.cluster.kubeconfig.is_some() || self.cluster.context.is_some();
        let access = |source: ClusterSource| KubeAccess {
            source,
            context: self.cluster.context.clone(),
        };
        let state_dir = || {
            self.state_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR))
        };
        let local = local.filter(|dir| {
            self.nothing_named(cluster.as_ref()) && ip_webhook_ledger::embedded::exists_in(dir)
        });
        let ledger = match (self.ledger, &cluster, local) {
            (Some(LedgerKind::Embedded), ..) => LedgerConfig::Embedded {
                state_dir: state_dir(),
            },
            (Some(LedgerKind::Etcd), ..) => LedgerConfig::Etcd(self.etcd.options()),
            (None, ..) if self.state_dir.is_some() => LedgerConfig::Embedded {
                state_dir: state_dir(),
            },
            (None, _, Some(dir)) => LedgerConfig::Embedded {
                state_dir: dir.to_path_buf(),
            },
            (Some(LedgerKind::Kubernetes) | None, Some(cluster), _) => {
                LedgerConfig::Kubernetes(access(cluster.clone()))
            }
            (Some(LedgerKind::Kubernetes) | None, None, _) => return Err(ConfigError::NoCluster),
        };
        // With another ledger, pods are looked up where the flags point (or in a pod).
        let api_server = match &ledger {
            LedgerConfig::Kubernetes(access) => Some(access.clone()),
            _ if explicit || in_pod() => cluster.map(access),
            _ => None,
        };
        Ok(OperatorConfig { ledger, api_server })
    }
}
