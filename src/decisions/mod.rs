//! The admission decisions: what `/mutate` and `/validate` answer, over the allocator, the
//! pod's workload, its CNI networks and the IPClaim guard.
//!
//! The contract, for the server and the cluster tasks above it (the folders of this crate
//! after this one) and for the tests:
//!
//! - [`Webhook::review`] takes an AdmissionReview's bytes for an
//!   [`crate::metrics::Endpoint`] and returns the response review's bytes, or an
//!   [`ip_webhook_admission::ReviewError`] for a body that is not a review (the server's 400).
//!   Every response echoes the request's `uid`. A refusal is an answer (`allowed: false` with
//!   a message naming what was wrong), never an error.
//! - A granted `/mutate` has made its claims durable through the ledger before it answers; a
//!   retry of the same request (same `uid`) gets the same IPs; no IP is granted to two pods.
//! - One [`Webhook`] is shared by every connection. What the cluster learns reaches the
//!   decisions through the registries it holds (the workload registry and the network
//!   registry, this crate's own), which the cluster's watches fill; the workload reviews
//!   also record or take out the listing of the workload they admit.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use base64::Engine;
//! use ip_webhook::decisions::{Settings, Webhook};
//! use ip_webhook_ipam::{allocator::Allocator, pools::PoolCatalog};
//! use ip_webhook_ledger::MemoryLedger;
//! use ip_webhook::metrics::{Endpoint, Metrics};
//!
//! let allocator = Allocator::new(Arc::new(MemoryLedger::new())).await.unwrap();
//! let webhook = Webhook::new(
//!     Settings::default(),
//!     Arc::new(allocator),
//!     PoolCatalog::default(),
//!     Arc::new(Metrics::new()),
//! );
//! // a Pod CREATE of app `web`, which may have 10.0.0.1 and 10.0.0.2
//! let create = |uid: &str| {
//!     serde_json::json!({
//!         "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
//!         "request": {
//!             "uid": uid, "operation": "CREATE", "namespace": "default",
//!             "kind": {"group": "", "version": "v1", "kind": "Pod"},
//!             "resource": {"group": "", "version": "v1", "resource": "pods"},
//!             "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {
//!                 "generateName": "web-", "namespace": "default", "labels": {"app": "web"},
//!                 "annotations": {"ip-webhook.io/allocatable-ips": "10.0.0.1-10.0.0.2"}}}}})
//!     .to_string()
//! };
//! let mutate = async |uid: &str| {
//!     let bytes = webhook.review(Endpoint::mutate, create(uid).as_bytes()).await.unwrap();
//!     let review: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
//!     let response = &review["response"];
//!     assert_eq!(response["uid"], uid);
//!     let patch = response["patch"].as_str().map(|patch| {
//!         let json = base64::engine::general_purpose::STANDARD.decode(patch).unwrap();
//!         String::from_utf8(json).unwrap()
//!     });
//!     (response["allowed"].as_bool().unwrap(), patch, response["status"]["message"].clone())
//! };
//! let (allowed, first, _) = mutate("a").await;
//! assert!(allowed && first.as_ref().unwrap().contains("10.0.0.1"));
//! let (_, second, _) = mutate("b").await;
//! assert!(second.unwrap().contains("10.0.0.2"));
//! // the same request again: the same IP, not a third one
//! assert_eq!(mutate("a").await.1, first);
//! // the list is used up: a refusal that says so, not an error
//! let (allowed, patch, message) = mutate("c").await;
//! assert!(!allowed && patch.is_none());
//! assert!(message.as_str().unwrap().contains("10.0.0.1"), "{message}");
//! # });
//! ```

pub(crate) mod assess;
pub(crate) mod carried;
pub mod claim_guard;
pub(crate) mod cni_pools;
pub(crate) mod dispatch;
pub(crate) mod events;
pub(crate) mod kubevirt;
pub mod mutate;
pub(crate) mod release_timer;
pub(crate) mod secondary;
pub(crate) mod validate;
pub(crate) mod workload_kinds;
pub(crate) mod workload_registry;
pub(crate) mod workloads;

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::decisions::cni_pools::NetworkRegistry;
use crate::decisions::events::{EventSink, NoEvents};
use crate::decisions::workloads::WorkloadRegistry;
use crate::metrics::Metrics;
use ip_webhook_admission::annotations::{ALLOCATABLE_IPS, Cni, IP_POOL, PoolCheck};
use ip_webhook_admission::{Incoming, Meta};
use ip_webhook_ipam::allocator::Allocator;
use ip_webhook_ipam::ipset::{IpSet, IpSpecError};
use ip_webhook_ipam::messages::Scope;
use ip_webhook_ipam::pools::PoolCatalog;
use ip_webhook_ipam::spec_cache::SpecCache;
use ip_webhook_ledger::{PodName, PodRef};

/// Behaviour switches from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The label naming a pod's app (with its namespace).
    pub app_label: String,
    pub cni: Cni,
    /// Refuse Kube-OVN Subnets that overlap another Subnet of the same VPC.
    pub check_kube_ovn_subnets: bool,
    /// Refuse Calico IPPools that overlap another Calico IPPool.
    pub check_calico_pools: bool,
    /// Added to a deleted pod's grace period before its IP is released.
    pub release_delay: std::time::Duration,
    /// The most of a deleted pod's grace period its IP stays held for
    /// (`--max-release-grace`): a DELETE with a grace of centuries must not hold an IP for
    /// them where no API server can say the pod is gone.
    pub max_release_grace: std::time::Duration,
    /// Every ledger call of one admission ends by this long after the review arrived
    /// (`--admission-deadline`): below the webhook's `timeoutSeconds`, so a slow ledger gets
    /// a clear denial before the API server gives up.
    pub(crate) admission_deadline: std::time::Duration,
    /// Which pods are KubeVirt launcher pods, and when a VM's IP is freed.
    pub(crate) kubevirt: kubevirt::KubevirtSettings,
    /// How long a released StatefulSet pod's claim is kept for its name (`--sticky-grace`),
    /// in every ledger (`ip_webhook_ledger::claim::released`).
    pub sticky_grace: std::time::Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            app_label: "app".into(),
            cni: Cni::Calico,
            check_kube_ovn_subnets: false,
            check_calico_pools: false,
            release_delay: std::time::Duration::from_secs(5),
            max_release_grace: std::time::Duration::from_secs(24 * 3600),
            admission_deadline: std::time::Duration::from_secs(4),
            kubevirt: kubevirt::KubevirtSettings::default(),
            sticky_grace: std::time::Duration::from_secs(
                ip_webhook_ipam::held::DEFAULT_STICKY_GRACE,
            ),
        }
    }
}

pub struct Webhook {
    pub(crate) settings: Settings,
    pub allocator: Arc<Allocator>,
    pub pools: Arc<ArcSwap<PoolCatalog>>,
    pub metrics: Arc<Metrics>,
    /// Which workload lists which IPs; shared with the cluster's workload watches.
    pub workloads: Arc<WorkloadRegistry>,
    /// The CNI's pools or subnets; shared with the cluster's CNI watches.
    pub(crate) networks: Arc<NetworkRegistry>,
    /// Parsed `allocatable-ips` lists, so an app's pods do not re-parse the same list.
    specs: SpecCache,
    /// Told about every Pod CREATE decision (Kubernetes Events in-cluster; `explain`).
    pub(crate) events: Arc<dyn EventSink>,
    /// Judges IPClaim edits and deletions ([`crate::decisions::claim_guard`]).
    pub(crate) claim_guard: crate::decisions::claim_guard::ClaimGuard,
    /// Asks the API server whether a claim's pod still exists (set when there is one).
    pub(crate) pods: std::sync::OnceLock<Arc<dyn ip_webhook_ledger::pod_lookup::PodLookup>>,
    /// The allocators of the secondary networks IPs are given out on.
    pub secondary: secondary::SecondaryNetworks,
}

impl Webhook {
    /// Every interface IPs are given out on, with its allocator: the primary interface's
    /// first, then each secondary network's. Each lifecycle task runs over all of them.
    pub(crate) fn interfaces(
        &self,
    ) -> impl Iterator<Item = (ip_webhook_ledger::network::Interface<'_>, &Arc<Allocator>)> {
        use ip_webhook_ledger::network::Interface;
        std::iter::once((Interface::Primary, &self.allocator)).chain(
            self.secondary
                .iter()
                .map(|(network, allocator)| (Interface::Network(network), allocator)),
        )
    }

    pub fn new(
        settings: Settings,
        allocator: Arc<Allocator>,
        pools: PoolCatalog,
        metrics: Arc<Metrics>,
    ) -> Webhook {
        let pools = Arc::new(ArcSwap::from_pointee(pools));
        metrics.watch_capacity(allocator.clone(), pools.clone());
        Webhook {
            settings,
            allocator,
            pools,
            metrics,
            workloads: Arc::default(),
            networks: Arc::default(),
            specs: SpecCache::default(),
            events: Arc::new(NoEvents),
            claim_guard: Default::default(),
            pods: Default::default(),
            secondary: Default::default(),
        }
    }

    /// Give IPs out on these secondary networks too, each from its own allocator.
    pub(crate) fn with_secondary(mut self, secondary: secondary::SecondaryNetworks) -> Webhook {
        self.secondary = secondary;
        self
    }

    /// Send Pod CREATE outcomes to `events` instead of nowhere.
    pub(crate) fn with_events(mut self, events: Arc<dyn EventSink>) -> Webhook {
        self.events = events;
        self
    }

    /// Whether the CNI can use these fixed IPs (Calico pools / Kube-OVN subnets, when known):
    /// `Err` is a denial, `Ok` carries warnings.
    pub(crate) fn cni_check(
        &self,
        ips: &IpSet,
        whose: &dyn fmt::Display,
    ) -> Result<Vec<String>, cni_pools::CniRefusal> {
        match self.settings.cni.descriptor().pools {
            PoolCheck::CalicoIpPools => self.networks.calico_check(ips, whose),
            PoolCheck::KubeOvnSubnets => self.networks.ovn_check(ips, whose).map(|()| Vec::new()),
        }
    }

    /// The IPs a pod may get: its `allocatable-ips` list or its pool. `Ok(None)` when it asks
    /// for neither; `Err` is the denial.
    pub(crate) fn candidates(
        &self,
        pod: &PodView<'_>,
    ) -> Result<Option<Candidates>, Box<CandidatesRefusal>> {
        let list = pod.meta.annotation(ALLOCATABLE_IPS);
        let pool = pod.meta.annotation(IP_POOL);
        match (list, pool) {
            (None, None) => Ok(None),
            (Some(_), Some(_)) => Err(Box::new(CandidatesRefusal::ListAndPool {
                pod: pod.display(),
            })),
            (Some(list), None) => {
                let set = self.specs.parse(list).map_err(|error| {
                    Box::new(CandidatesRefusal::List {
                        pod: pod.display(),
                        error,
                    })
                })?;
                if let Some(refusal) = self.policy_refusal(&set, pod) {
                    return Err(Box::new(CandidatesRefusal::Policy {
                        pod: pod.display(),
                        lists: refusal.lists(),
                    }));
                }
                Ok(Some(Candidates { set, pool: None }))
            }
            (None, Some(name)) => {
                let pools = self.pools.load();
                let Some(found) = pools.get(name.trim()) else {
                    let known = pools.names();
                    let known = if known.is_empty() {
                        "none are defined".to_string()
                    } else {
                        format!("known pools: {}", known.join(", "))
                    };
                    return Err(Box::new(CandidatesRefusal::NoSuchPool {
                        pod: pod.display(),
                        pool: name.to_string(),
                        known,
                    }));
                };
                if let Some(reason) = found.refuses(&pod.namespace, pod.meta.labels.as_ref()) {
                    return Err(Box::new(CandidatesRefusal::PoolRefuses {
                        pod: pod.display(),
                        pool: name.to_string(),
                        reason,
                    }));
                }
                Ok(Some(Candidates {
                    set: found.usable.clone(),
                    pool: Some(found.name.clone()),
                }))
            }
        }
    }
}

/// Why a pod cannot draw from the list or pool it names; each names the pod.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CandidatesRefusal {
    #[error("pod {pod} sets both {ALLOCATABLE_IPS} and {IP_POOL}; use one")]
    ListAndPool { pod: String },
    #[error("pod {pod}: annotation {ALLOCATABLE_IPS}: {error}")]
    List { pod: String, error: IpSpecError },
    /// The list holds IPs the pod may not have (`lists` says whose).
    #[error("pod {pod}: annotation {ALLOCATABLE_IPS} {lists}")]
    Policy { pod: String, lists: String },
    #[error("pod {pod} asks for FixedIPPool {pool:?} ({IP_POOL}), which does not exist; {known}")]
    NoSuchPool {
        pod: String,
        pool: String,
        known: String,
    },
    #[error("pod {pod} may not draw from FixedIPPool {pool}: {reason}")]
    PoolRefuses {
        pod: String,
        pool: String,
        reason: String,
    },
}

impl Webhook {
    /// Whether `pod` may have the IPs of `set` at all, wherever it names them (its list, its
    /// CNI annotation, a Kube-OVN `ip_pool` list): an IP inside a FixedIPPool is only for the
    /// pods the pool serves (`spec.namespaces`, `spec.podSelector`), and an IP a workload of
    /// another app lists is only for that app. Workload templates are held to the same rule
    /// ([`workloads::review`]).
    pub(crate) fn policy_refusal(&self, set: &IpSet, pod: &PodView<'_>) -> Option<PolicyRefusal> {
        self.policy_refusal_for(
            set,
            &pod.namespace,
            pod.meta.labels.as_ref(),
            &pod.app_key(),
        )
    }

    /// [`Webhook::policy_refusal`] for pods of `namespace` with `labels`, of app `app_key`.
    pub(crate) fn policy_refusal_for(
        &self,
        set: &IpSet,
        namespace: &str,
        labels: Option<&std::collections::BTreeMap<String, String>>,
        app_key: &str,
    ) -> Option<PolicyRefusal> {
        let pools = self.pools.load();
        for pool in pools.intersecting(set) {
            if let Some(reason) = pool.refuses(namespace, labels) {
                return Some(PolicyRefusal::Pool {
                    shared: ip_webhook_ipam::messages::overlap_text(&pool.usable, set),
                    pool: pool.name.clone(),
                    reason,
                });
            }
        }
        let (shared, workload, app) = self.workloads.other_app_listing(set, app_key)?;
        Some(PolicyRefusal::App {
            shared,
            workload,
            app,
        })
    }
}

/// Why a pod (or a workload's pods) may not have some IPs ([`Webhook::policy_refusal`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PolicyRefusal {
    /// The IPs `shared` are in FixedIPPool `pool`, which does not serve the pod.
    Pool {
        shared: String,
        pool: String,
        reason: String,
    },
    /// The IPs `shared` are listed by `workload` of another app, `app`.
    App {
        shared: String,
        workload: workloads::WorkloadId,
        app: String,
    },
}

impl PolicyRefusal {
    /// The refusal of a list that names the IPs: `lists 10.0.0.1 of FixedIPPool blue, …`.
    pub(crate) fn lists(&self) -> String {
        match self {
            PolicyRefusal::Pool {
                shared,
                pool,
                reason,
            } => format!(
                "lists {shared} of FixedIPPool {pool}, which this pod may not use: {reason}"
            ),
            PolicyRefusal::App {
                shared,
                workload,
                app,
            } => format!(
                "lists {shared}, which {workload} (app {app}) lists; only that app's pods may have them"
            ),
        }
    }

    /// The refusal of IPs a pod names for itself: `10.0.0.1 is in FixedIPPool blue, …`.
    pub(crate) fn names(&self) -> String {
        match self {
            PolicyRefusal::Pool {
                shared,
                pool,
                reason,
            } => format!("{shared} is in FixedIPPool {pool}, which this pod may not use: {reason}"),
            PolicyRefusal::App {
                shared,
                workload,
                app,
            } => format!(
                "{shared} is listed by {workload} (app {app}); only that app's pods may have it"
            ),
        }
    }
}

/// Where a pod's IPs come from.
#[derive(Debug, Clone)]
pub(crate) struct Candidates {
    pub(crate) set: Arc<IpSet>,
    pub(crate) pool: Option<String>,
}

/// A pod as admission sees it: its metadata plus the names it has at this point.
pub(crate) struct PodView<'m> {
    pub(crate) meta: &'m Meta,
    pub(crate) namespace: String,
    pub(crate) app: Option<&'m str>,
    /// The KubeVirt VM this is a launcher pod of (`kubevirt::admitted_vm`).
    pub(crate) vm: Option<&'m str>,
    /// A launcher pod that is a live migration's target (`kubevirt::is_migration_target`).
    pub(crate) migration: bool,
}

impl<'m> PodView<'m> {
    pub(crate) fn new(meta: &'m Meta, incoming: &Incoming<'_>, settings: &Settings) -> PodView<'m> {
        let namespace = meta
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| incoming.namespace().to_string());
        PodView {
            meta,
            namespace,
            app: meta.label(&settings.app_label).filter(|a| !a.is_empty()),
            vm: kubevirt::admitted_vm(meta, incoming, &settings.kubevirt),
            migration: kubevirt::is_migration_target(meta),
        }
    }

    pub(crate) fn name(&self) -> &str {
        self.meta.name.as_deref().unwrap_or("")
    }

    pub(crate) fn pod_ref(&self) -> PodRef {
        PodRef {
            namespace: self.namespace.as_str().into(),
            name: self.name().into(),
            generate_name: self.meta.generate_name.as_deref().unwrap_or("").into(),
            uid: self
                .meta
                .uid
                .as_deref()
                .filter(|u| !u.is_empty())
                .map(Into::into),
        }
    }

    /// `namespace/app`, as claims and Events name an app (`namespace/` without an app label).
    pub(crate) fn app_key(&self) -> String {
        format!("{}/{}", self.namespace, self.app.unwrap_or(""))
    }

    pub(crate) fn display(&self) -> String {
        self.pod_name().to_string()
    }

    pub(crate) fn pod_name(&self) -> PodName<'_> {
        PodName {
            namespace: &self.namespace,
            name: self.name(),
            generate_name: self.meta.generate_name.as_deref().unwrap_or(""),
        }
    }

    /// `app namespace/app` or, for a pool pod, `FixedIPPool NAME (app namespace/app)`.
    pub(crate) fn scope<'s>(&'s self, candidates: &'s Candidates) -> Scope<'s> {
        let (namespace, app) = (self.namespace.as_str(), self.app.unwrap_or(""));
        match &candidates.pool {
            Some(pool) => Scope::Pool {
                pool,
                namespace,
                app,
            },
            None => Scope::App { namespace, app },
        }
    }

    /// Whether a StatefulSet controls the pod (its IP is kept for its name after it goes).
    pub(crate) fn is_stateful(&self) -> bool {
        self.meta.owner_references.as_ref().is_some_and(|owners| {
            owners
                .iter()
                .any(|o| o.kind == "StatefulSet" && o.controller.unwrap_or(false))
        })
    }

    /// The ordinal of a StatefulSet pod (`web-3` owned by StatefulSet `web` → 3).
    pub(crate) fn statefulset_ordinal(&self) -> Option<u64> {
        let owner = self
            .meta
            .owner_references
            .as_ref()?
            .iter()
            .find(|o| o.kind == "StatefulSet" && o.controller.unwrap_or(false))?;
        let suffix = self
            .name()
            .strip_prefix(owner.name.as_str())?
            .strip_prefix('-')?;
        if suffix.is_empty()
            || !suffix.bytes().all(|b| b.is_ascii_digit())
            || (suffix.len() > 1 && suffix.starts_with('0'))
        {
            return None;
        }
        suffix.parse().ok()
    }
}
