//! The pods behind claims: `release` asks whether a claim's pod still exists, `status` which
//! node it runs on, the leak sweeper ([`super::sweep`]) which claims no pod holds. One list of
//! the namespace's pods through the API server, matched to each claim the way the reconciler
//! matches them.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PartialObjectMeta};
use kube::{Api, Client, Resource};

use ip_webhook_ledger::Claim;
use ip_webhook_ledger::claim::PodPresence;
use ip_webhook_ledger::pod_lookup::{PodLookup, PodState};

use super::lifecycle::takes_up;
use super::listed_pod::ListedPod;
use super::virtual_machines::VmDirectory;
use super::watches::network_claiming_pod;
use super::{ClusterError, claiming_pod};
use ip_webhook_admission::annotations::ALLOCATED_IP_LABEL;
use ip_webhook_ledger::network::Network;

/// Lists pods through the API server (the operator's kubeconfig, or the service account).
/// A virtual machine's claim is held while the VM is ([`VmDirectory`]), not its pod.
pub(crate) struct PodDirectory {
    client: Client,
    app_label: String,
    vms: VmDirectory,
    /// The secondary network whose claims are looked up (a pod carries those IPs in its
    /// networks annotation); `None`: the primary interface's.
    network: Option<Network>,
}

impl PodDirectory {
    pub(crate) fn new(client: Client, app_label: impl Into<String>) -> PodDirectory {
        PodDirectory {
            vms: VmDirectory::new(client.clone(), false),
            client,
            app_label: app_label.into(),
            network: None,
        }
    }

    /// Who holds the claims of `interface`'s books, reading apps by `app_label` and VMs as
    /// `kubevirt` says.
    pub(crate) fn of_interface(
        client: Client,
        app_label: &str,
        kubevirt: &crate::decisions::kubevirt::KubevirtSettings,
        interface: ip_webhook_ledger::network::Interface<'_>,
    ) -> PodDirectory {
        let pods =
            PodDirectory::new(client, app_label).release_vms_on_stop(kubevirt.release_on_stop);
        match interface.network() {
            None => pods,
            Some(network) => pods.for_network(network.clone()),
        }
    }

    /// Look up the pods of the claims of secondary network `network`.
    pub(crate) fn for_network(mut self, network: Network) -> PodDirectory {
        self.network = Some(network);
        self
    }

    /// Free a virtual machine's claim once the VM is stopped (`--kubevirt-release-on-stop`).
    pub(crate) fn release_vms_on_stop(mut self, release_on_stop: bool) -> PodDirectory {
        self.vms = VmDirectory::new(self.client.clone(), release_on_stop);
        self
    }

    /// Whether the VM of a VM's claim still holds it, read now (not from the memo the
    /// reconciler's drops use: a release is decided once, on what the API server says).
    async fn vm_state(&self, claim: &Claim, vm: &str) -> PodState {
        let state = self.vms.state(&claim.pod.namespace, vm).await;
        match self.vms.verdict(state) {
            Ok(true) => PodState::Live,
            Ok(false) => PodState::Gone,
            Err(why) => PodState::Unknown(why),
        }
    }

    /// The metadata of every pod of `namespace`: all that finding a claim's pod needs, for
    /// a fraction of the bytes.
    pub(crate) async fn list_metadata(
        &self,
        namespace: &str,
    ) -> Result<Vec<PartialObjectMeta<Pod>>, ClusterError> {
        self.api(namespace)
            .list_metadata(&ListParams::default())
            .await
            .map(|list| list.items)
            .map_err(|error| list_failed(namespace, error))
    }

    fn api(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// What the rules read of `meta`'s pod for these books: the IPs it carries on their
    /// interface; `None` when it carries none there.
    pub(crate) fn info(&self, meta: &kube::api::ObjectMeta) -> Option<super::ClaimingPod> {
        match &self.network {
            None => claiming_pod(meta, &self.app_label),
            Some(network) => network_claiming_pod(meta, &self.app_label, network),
        }
    }

    /// [`PodDirectory::info`], or the pod with no IP when it carries none there.
    pub(crate) fn info_or_bare(&self, meta: &kube::api::ObjectMeta) -> Option<super::ClaimingPod> {
        self.info(meta)
            .or_else(|| super::watches::bare_claiming_pod(meta, &self.app_label, Vec::new()))
    }

    /// Whether the VM `namespace/name` still holds its IP, read now (not from a memo): a
    /// release is decided once, on what the API server says.
    pub(crate) async fn vm_holds_ip(&self, namespace: &str, vm: &str) -> Result<bool, String> {
        self.vms.verdict(self.vms.state(namespace, vm).await)
    }

    /// The pod among `pods` (of the claim's namespace) that holds `claim`.
    pub(crate) fn holder<'a, P: Resource>(&self, pods: &'a [P], claim: &Claim) -> Option<&'a P> {
        match &self.network {
            None => holder(pods, claim, &self.app_label),
            Some(network) => network_holder(pods, claim, &self.app_label, network),
        }
    }

    /// The node of each claim's pod, by IP, for the claims whose pod exists and is scheduled.
    /// Many claims that name their pods cost one paged list of the pods carrying our label
    /// (which `/mutate` writes on every pod it gives an IP); a claim whose pod that list did
    /// not show (few claims, or an adopted pod without the label) costs one read of its pod;
    /// the others (reservations that name none yet) one paged list of their namespace, of
    /// which only the pods that could hold them are kept. Each pod is cut down to its node as
    /// it arrives. What could not be read is left out, and named in the second value.
    pub(crate) async fn nodes(&self, claims: &[Claim]) -> (BTreeMap<IpAddr, String>, Vec<String>) {
        let mut by_namespace: HashMap<&str, Vec<&Claim>> = HashMap::new();
        let mut named: Vec<&Claim> = Vec::new();
        for claim in claims.iter().filter(|c| c.is_held()) {
            if claim.pod.name.is_empty() {
                by_namespace
                    .entry(claim.pod.namespace.as_str())
                    .or_default()
                    .push(claim);
            } else {
                named.push(claim);
            }
        }
        let mut nodes = BTreeMap::new();
        let mut failures = Vec::new();
        if named.len() >= LIST_FROM {
            self.nodes_from_our_pods(&mut named, &mut nodes).await;
        }
        self.read_nodes(named, &mut nodes, &mut failures).await;
        for (namespace, claims) in by_namespace {
            let pods = match self.candidates(namespace, &claims).await {
                Ok(pods) => pods,
                Err(why) => {
                    failures.push(why.to_string());
                    continue;
                }
            };
            for claim in claims {
                if let Some(node) = self.holder(&pods, claim).and_then(node_of) {
                    nodes.insert(claim.ip, node);
                }
            }
        }
        failures.sort();
        (nodes, failures)
    }

    /// The nodes of the claims in `named` whose pods the list of the pods carrying our label
    /// shows; those claims are taken out of `named`, the rest left for a read each.
    async fn nodes_from_our_pods(
        &self,
        named: &mut Vec<&Claim>,
        nodes: &mut BTreeMap<IpAddr, String>,
    ) {
        let pods = match self.labelled_pods().await {
            Ok(pods) => pods,
            // every claim is then read on its own: nothing is left out
            Err(why) => {
                tracing::debug!(%why, "listing the pods carrying our label failed; reading each claim's pod");
                return;
            }
        };
        named.retain(|claim| {
            let key = (claim.pod.namespace.to_string(), claim.pod.name.to_string());
            let Some(pod) = pods.get(&key) else {
                return true;
            };
            let Some(pod) = self.holder(std::slice::from_ref(pod), claim) else {
                return true;
            };
            if let Some(node) = node_of(pod) {
                nodes.insert(claim.ip, node);
            }
            false
        });
    }

    /// The node of each claim in `named`, one read of its pod each, [`CONCURRENT_READS`] at a
    /// time, each pod cut down to its node as it arrives.
    async fn read_nodes(
        &self,
        named: Vec<&Claim>,
        nodes: &mut BTreeMap<IpAddr, String>,
        failures: &mut Vec<String>,
    ) {
        let mut reads = futures::stream::iter(named.into_iter().map(|claim| async move {
            let read = self
                .api(&claim.pod.namespace)
                .get_opt(&claim.pod.name)
                .await
                .map_err(|error| {
                    format!(
                        "reading pod {}/{} failed: {error}",
                        claim.pod.namespace, claim.pod.name
                    )
                });
            let node = read.map(|pod| {
                let pods: Vec<Pod> = pod.into_iter().collect();
                self.holder(&pods, claim).and_then(node_of)
            });
            (claim, node)
        }))
        .buffer_unordered(CONCURRENT_READS);
        while let Some((claim, node)) = reads.next().await {
            match node {
                Ok(Some(node)) => {
                    nodes.insert(claim.ip, node);
                }
                Ok(None) => {}
                Err(why) => failures.push(why),
            }
        }
    }

    /// Every pod carrying our label, by namespace and name, read page by page and cut down to
    /// its metadata (without managed fields) and node.
    async fn labelled_pods(&self) -> Result<HashMap<(String, String), Pod>, ClusterError> {
        // read as the fields matching reads: containers, volumes and managed fields skipped
        let api: Api<ListedPod> = Api::all(self.client.clone());
        let mut kept = HashMap::new();
        super::reconciler::list_pages(
            |params| {
                let api = api.clone();
                async move { api.list(&params.labels(ALLOCATED_IP_LABEL)).await }
            },
            |page| {
                kept.extend(page.into_iter().map(|ListedPod(pod)| {
                    let slim = node_and_metadata(pod);
                    let key = (
                        slim.metadata.namespace.clone().unwrap_or_default(),
                        slim.metadata.name.clone().unwrap_or_default(),
                    );
                    (key, slim)
                }));
            },
        )
        .await
        .map_err(|error| list_failed("every namespace", error))?;
        Ok(kept)
    }

    /// The pods of `namespace` that could hold one of `claims` (its UID, or an IP of ours),
    /// read page by page and cut down to their metadata and node.
    async fn candidates(
        &self,
        namespace: &str,
        claims: &[&Claim],
    ) -> Result<Vec<Pod>, ClusterError> {
        let uids: std::collections::HashSet<&str> =
            claims.iter().filter_map(|c| c.pod.uid.as_deref()).collect();
        let api: Api<ListedPod> = Api::namespaced(self.client.clone(), namespace);
        let mut kept = Vec::new();
        super::reconciler::list_pages(
            |params| {
                let api = api.clone();
                async move { api.list(&params).await }
            },
            |page| {
                kept.extend(page.into_iter().filter_map(|ListedPod(pod)| {
                    let could = pod
                        .metadata
                        .uid
                        .as_deref()
                        .is_some_and(|u| uids.contains(u))
                        || claiming_pod(&pod.metadata, &self.app_label).is_some();
                    could.then(|| node_and_metadata(pod))
                }))
            },
        )
        .await
        .map_err(|error| list_failed(namespace, error))?;
        Ok(kept)
    }
}

/// Reads of single pods `status` has in flight at once.
const CONCURRENT_READS: usize = 16;

/// From this many claims naming their pods, `status` lists the pods carrying our label
/// instead of reading each pod: at 20,000 claims one read each cost 7 s of CPU and 831 MiB
/// (`scripts/bench-scale.sh` with 20,000 fixed-IP pods).
const LIST_FROM: usize = 64;

/// A pod cut down to what matching it to a claim and naming its node read.
fn node_and_metadata(pod: Pod) -> Pod {
    let mut metadata = pod.metadata;
    metadata.managed_fields = None;
    Pod {
        metadata,
        spec: pod.spec.map(|spec| k8s_openapi::api::core::v1::PodSpec {
            node_name: spec.node_name,
            ..Default::default()
        }),
        status: None,
    }
}

fn node_of(pod: &Pod) -> Option<String> {
    pod.spec.as_ref()?.node_name.clone()
}

#[async_trait]
impl PodLookup for PodDirectory {
    async fn state(&self, claim: &Claim) -> PodState {
        if let Some(vm) = &claim.vm {
            return self.vm_state(claim, vm).await;
        }
        match self.list_metadata(&claim.pod.namespace).await {
            Ok(pods) if self.holder(&pods, claim).is_some() => PodState::Live,
            Ok(_) => PodState::Gone,
            Err(why) => PodState::Unknown(why.to_string()),
        }
    }

    async fn uses_ip(
        &self,
        namespace: &str,
        name: &str,
        ip: IpAddr,
    ) -> Result<bool, ip_webhook_ledger::LedgerError> {
        let pod = self.api(namespace).get_opt(name).await.map_err(|source| {
            ip_webhook_ledger::LedgerError::PodRead {
                namespace: namespace.to_string(),
                name: name.to_string(),
                source: Box::new(source),
            }
        })?;
        Ok(pod.is_some_and(|pod| {
            let running = pod
                .status
                .iter()
                .flat_map(|status| status.pod_ips.iter().flatten())
                .any(|address| address.ip.parse() == Ok(ip));
            running
                || claiming_pod(&pod.metadata, &self.app_label).is_some_and(|p| p.ips.contains(&ip))
        }))
    }

    async fn presence(&self, claim: &Claim) -> PodPresence {
        if claim.pod.name.is_empty() || claim.vm.is_some() {
            return self.state(claim).await.into();
        }
        match self
            .api(&claim.pod.namespace)
            .get_metadata_opt(&claim.pod.name)
            .await
        {
            Ok(None) => PodPresence::Gone,
            Ok(Some(pod)) => {
                let same = claim
                    .pod
                    .uid
                    .as_deref()
                    .is_none_or(|uid| pod.metadata.uid.as_deref() == Some(uid));
                match (same, pod.metadata.deletion_timestamp.is_some()) {
                    (false, _) => PodPresence::Gone,
                    (true, true) => PodPresence::Terminating,
                    (true, false) => PodPresence::Running,
                }
            }
            Err(error) => PodPresence::Unknown(format!(
                "reading pod {}/{} failed: {error}",
                claim.pod.namespace, claim.pod.name
            )),
        }
    }
}

/// The pod among `pods` that holds `claim`: the one with its UID once it is bound; before
/// that (a reservation), one that carries its IP and its claim token
/// ([`super::lifecycle::takes_up`]). A terminating pod still holds its IP.
pub(crate) fn holder<'a, P: Resource>(
    pods: &'a [P],
    claim: &Claim,
    app_label: &str,
) -> Option<&'a P> {
    holder_by(pods, claim, |meta| claiming_pod(meta, app_label))
}

/// [`holder`] for a claim of the secondary network `network`, whose pod carries its IPs in
/// the networks annotation.
pub(crate) fn network_holder<'a, P: Resource>(
    pods: &'a [P],
    claim: &Claim,
    app_label: &str,
    network: &Network,
) -> Option<&'a P> {
    holder_by(pods, claim, |meta| {
        network_claiming_pod(meta, app_label, network)
    })
}

/// [`holder`], with the IPs a pod carries read by `info`.
fn holder_by<'a, P: Resource>(
    pods: &'a [P],
    claim: &Claim,
    info: impl Fn(&kube::api::ObjectMeta) -> Option<super::ClaimingPod>,
) -> Option<&'a P> {
    if let Some(uid) = claim.pod.uid.as_deref() {
        return pods.iter().find(|pod| {
            pod.meta().namespace.as_deref() == Some(claim.pod.namespace.as_str())
                && pod.meta().uid.as_deref() == Some(uid)
        });
    }
    pods.iter()
        .filter(|pod| info(pod.meta()).is_some_and(|info| takes_up(claim, &info)))
        .min_by_key(|pod| pod.meta().creation_timestamp.clone())
}

fn list_failed(namespace: &str, source: kube::Error) -> ClusterError {
    ClusterError::ListPods {
        namespace: namespace.to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_claims as claims;
    use serde_json::json;

    const AT: u64 = 1_764_400_000;

    /// A claim of app `web`: Bound to the pod with UID `uid`, or Reserved for one not bound yet.
    fn web_claim(ip: &str, name: &str, generate_name: &str, uid: Option<&str>) -> Claim {
        let claim = claims::builder(ip, "web", name)
            .generate_name(generate_name)
            .request("r-1")
            .at(AT);
        match uid {
            Some(uid) => claim.uid(uid).bound().build(),
            None => claim.build(),
        }
    }

    fn pod(namespace: &str, name: &str, uid: &str, ip: &str, created_at: u64) -> Pod {
        let created = k8s_openapi::jiff::Timestamp::from_second(created_at as i64).unwrap();
        serde_json::from_value(json!({
            "metadata": {
                "namespace": namespace,
                "name": name,
                "uid": uid,
                "creationTimestamp": created.to_string(),
                "labels": {"app": "web", "ip-webhook.io/allocated-ip": ip},
            },
            "spec": {"containers": [], "nodeName": format!("node-{name}")},
        }))
        .unwrap()
    }

    fn name_of(pod: Option<&Pod>) -> Option<&str> {
        pod.and_then(|p| p.metadata.name.as_deref())
    }

    #[test]
    fn a_bound_claim_is_held_by_the_pod_with_its_uid_only() {
        let bound = web_claim("10.0.0.10", "web-a", "web-", Some("uid-a"));
        let pods = [
            pod("default", "web-a", "uid-recreated", "10.0.0.10", AT + 60),
            pod("other", "web-a", "uid-a", "10.0.0.10", AT),
        ];
        assert_eq!(name_of(holder(&pods, &bound, "app")), None);
        let pods = [pod("default", "web-a", "uid-a", "10.0.0.99", AT)];
        assert_eq!(name_of(holder(&pods, &bound, "app")), Some("web-a"));
    }

    fn with_token(mut pod: Pod, token: &str) -> Pod {
        pod.metadata.annotations.get_or_insert_default().insert(
            ip_webhook_admission::annotations::CLAIM_TOKEN.into(),
            token.into(),
        );
        pod
    }

    #[test]
    fn a_reservation_is_held_by_the_pod_carrying_its_ip_and_token() {
        const TOKEN: &str = "0123456789abcdef0123456789abcdef";
        let mut reserved = web_claim("10.0.0.10", "", "web-", None);
        reserved.token = TOKEN.into();
        let pods = [
            // a pod of the same generateName carrying the IP, but not the token
            pod("default", "web-old", "u1", "10.0.0.10", AT + 1),
            with_token(pod("default", "web-y", "u3", "10.0.0.11", AT + 1), TOKEN),
            with_token(pod("other", "web-w", "u5", "10.0.0.10", AT + 1), TOKEN),
        ];
        assert_eq!(name_of(holder(&pods, &reserved, "app")), None);
        let mut pods = pods.to_vec();
        pods.push(with_token(
            pod("default", "web-z", "u4", "10.0.0.10", AT + 2),
            TOKEN,
        ));
        assert_eq!(name_of(holder(&pods, &reserved, "app")), Some("web-z"));
    }

    #[test]
    fn a_reservation_from_before_tokens_is_held_by_a_newer_pod_of_its_exact_name() {
        let legacy = web_claim("10.0.0.10", "db-0", "", None);
        let pods = [
            pod("default", "db-0", "u-old", "10.0.0.10", AT - 3600),
            pod("default", "db-01", "u2", "10.0.0.10", AT + 1),
        ];
        assert_eq!(name_of(holder(&pods, &legacy, "app")), None);
        let mut pods = pods.to_vec();
        pods.push(pod("default", "db-0", "u-new", "10.0.0.10", AT + 2));
        assert_eq!(name_of(holder(&pods, &legacy, "app")), Some("db-0"));
        let generated = web_claim("10.0.0.10", "", "db-", None);
        assert_eq!(
            name_of(holder(&pods, &generated, "app")),
            None,
            "a generateName prefix identifies no pod"
        );
    }

    /// With the API server's clock 10 s behind the webhook's, the sweeper
    /// freed a running pod's IP (its creationTimestamp preceded the claim's created_at by more
    /// than the slack). A reservation with a token is found by the token, whatever the clocks.
    #[test]
    fn clock_skew_does_not_hide_a_reservations_pod() {
        const TOKEN: &str = "0123456789abcdef0123456789abcdef";
        let mut reserved = web_claim("10.0.0.10", "", "web-", None);
        reserved.token = TOKEN.into();
        for skew in [10, 600, 86_400] {
            let pods = [with_token(
                pod("default", "web-q", "u1", "10.0.0.10", AT - skew),
                TOKEN,
            )];
            assert_eq!(
                name_of(holder(&pods, &reserved, "app")),
                Some("web-q"),
                "API server {skew} s behind"
            );
        }
    }
}
