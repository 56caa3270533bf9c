//! The claim lifecycle's contract, cell by cell: every rule for every holder (a pod, or a
//! KubeVirt VM through its launcher pods) on every interface (the primary one, or a Multus
//! network) in every ledger (embedded, IPClaims, etcd), each ledger with an API server to ask
//! (`fakeapi.py`; the embedded and etcd ledgers ask it for pods and VMs). A rule that skips a
//! cell fails by name: `R3 leak sweeper × vm × network × etcd: ...`. The cells run at once, one
//! replica and one API server each; the rules of a cell run one after another, each on an app
//! and a list of its own.
//!
//! Rules (VM cells skip R4: a VM's claim follows the VM, not a pod name):
//! - R1 bind: a pod's reservation is bound to its UID at `/validate`; a copy carrying its
//!   token (created by another user than the pod's controller) is refused from then on.
//! - R2 release: a DELETE reviewed frees the IP only once the holder is verified gone (a pod
//!   that outlives its grace keeps it; a VM keeps it while it exists).
//! - R3 leak sweeper: a holder gone with no DELETE reviewed has its IP freed; a VM's launcher
//!   pod gone while the VM exists frees nothing.
//! - R4 sticky names: a StatefulSet pod's IP is kept for its name (its recreated pod gets it
//!   back, no other pod meanwhile), then freed after the sticky grace.
//! - R5 node loss: a ReplicaSet pod stuck Terminating on a lost node frees its IP; a VM's
//!   launcher pod there frees nothing.
//! - R6 UPDATE: what names a pod's IP on the interface cannot be changed.

mod common;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use common::etcd_cluster::EtcdCluster;
use common::fakeapi::{FakeApi, install_crd_fixture, persist_pod};
use common::{TestServer, apply, eventually, message};
use ip_webhook_ipam::allocator::Allocator;
use ip_webhook_ledger::network::Network;
use ip_webhook_ledger::{Claim, Phase};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

const NS: &str = "default";
const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
const CONTROLLER: &str = "system:serviceaccount:kubevirt:kubevirt-controller";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LedgerKind {
    Embedded,
    IpClaims,
    /// its cells run only with the `etcd` feature
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Etcd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Holder {
    Pod,
    Vm,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Interface {
    Primary,
    Network,
}

/// One cell: a replica over its ledger, its API server, and what the rules share.
struct Cell {
    name: String,
    holder: Holder,
    interface: Interface,
    /// The cell's API server, running for as long as the cell.
    _fake: FakeApi,
    client: Client,
    server: TestServer,
}

fn kubevirt_api(client: &Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", kind),
        plural,
    );
    Api::namespaced_with(client.clone(), NS, &resource)
}

impl Cell {
    async fn start(
        ledger: LedgerKind,
        holder: Holder,
        interface: Interface,
        etcd: Option<&EtcdCluster>,
        prefix: &str,
    ) -> Cell {
        let name = format!(
            "{} × {} × {:?}",
            match holder {
                Holder::Pod => "pod",
                Holder::Vm => "vm",
            },
            match interface {
                Interface::Primary => "primary",
                Interface::Network => "network",
            },
            ledger
        );
        let fake = FakeApi::start();
        let client = fake.install_crds().await;
        install_crd_fixture(&client, "kubevirt-crds.yaml").await;
        install_crd_fixture(&client, "multus-crds.yaml").await;
        let kubeconfig = fake.kubeconfig().display().to_string();
        let endpoints = etcd.map(|e| e.endpoints_flag()).unwrap_or_default();
        let mut args: Vec<&str> = match ledger {
            LedgerKind::Embedded => vec!["--ledger", "embedded", "--kubeconfig", &kubeconfig],
            LedgerKind::IpClaims => vec!["--ledger", "kubernetes", "--kubeconfig", &kubeconfig],
            LedgerKind::Etcd => vec![
                "--ledger",
                "etcd",
                "--etcd-endpoints",
                &endpoints,
                "--etcd-prefix",
                prefix,
                "--kubeconfig",
                &kubeconfig,
            ],
        };
        args.extend([
            "--network",
            "default/storage",
            "--reservation-ttl",
            "1s",
            "--sticky-grace",
            "3s",
            "--resync-period",
            "500ms",
            "--release-delay",
            "0s",
            "--node-lost-grace",
            "1s",
            "--lease-namespace",
            "default",
            "--lease-duration",
            "2s",
            "--lease-renew-interval",
            "200ms",
        ]);
        let server = TestServer::start(&args).await;
        common::fakeapi::wait_ready(&server).await;
        Cell {
            name,
            holder,
            interface,
            _fake: fake,
            client,
            server,
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    /// The allocator of this cell's interface.
    fn allocator(&self) -> &Arc<Allocator> {
        let webhook = &self.server.launched.webhook;
        match self.interface {
            Interface::Primary => &webhook.allocator,
            Interface::Network => webhook
                .secondary
                .get(&Network::parse("default/storage").unwrap())
                .expect("the cell's network is managed"),
        }
    }

    /// The claim that locks `ip` on this cell's interface.
    fn claim(&self, ip: &str) -> Option<Claim> {
        self.allocator()
            .holder(&ip.parse().unwrap())
            .filter(Claim::locks_ip)
    }

    /// A pod of `app` asking for its IP from `list` on this cell's interface: a ReplicaSet's,
    /// a StatefulSet's (`ordinal`), or (VM cells) a launcher pod of VM `app`.
    fn object(&self, app: &str, list: &str, ordinal: Option<u32>) -> Value {
        let mut annotations = serde_json::Map::new();
        match self.interface {
            Interface::Primary => {
                annotations.insert("ip-webhook.io/allocatable-ips".into(), json!(list));
            }
            Interface::Network => {
                annotations.insert(NETWORKS.into(), json!("storage"));
                annotations.insert(
                    "storage.default.ip-webhook.io/allocatable-ips".into(),
                    json!(list),
                );
                annotations.insert(
                    "storage.default.ip-webhook.io/prefix-length".into(),
                    json!("24"),
                );
            }
        }
        let mut labels = json!({"app": app});
        let owner = match (self.holder, ordinal) {
            (Holder::Vm, _) => {
                labels["kubevirt.io"] = json!("virt-launcher");
                labels["vm.kubevirt.io/name"] = json!(app);
                json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                       "name": app, "uid": format!("vmi-{app}"), "controller": true})
            }
            (Holder::Pod, Some(_)) => json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                       "name": app, "uid": format!("sts-{app}"), "controller": true}),
            (Holder::Pod, None) => json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                       "name": app, "uid": format!("rs-{app}"), "controller": true}),
        };
        let mut metadata = json!({
            "namespace": NS, "labels": labels, "annotations": annotations,
            "ownerReferences": [owner],
        });
        match ordinal {
            Some(n) => metadata["name"] = json!(format!("{app}-{n}")),
            None => metadata["generateName"] = json!(format!("{app}-")),
        }
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
               "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]}})
    }

    /// A review sent as the pod's controller would (KubeVirt's, for a launcher pod).
    fn review(
        &self,
        uid: &str,
        operation: &str,
        object: Option<Value>,
        old: Option<Value>,
    ) -> Value {
        let mut review = common::review("v1", uid, operation, object, old, false);
        if self.holder == Holder::Vm {
            review["request"]["userInfo"] = json!({"username": CONTROLLER});
        }
        review
    }

    /// The IP `object` was given on this cell's interface, from the answer to its CREATE.
    fn granted_ip(&self, object: &Value, response: &Value) -> String {
        let patched = apply(object, response);
        match self.interface {
            Interface::Primary => common::allocated_ip(response),
            Interface::Network => {
                let value = patched["metadata"]["annotations"][NETWORKS]
                    .as_str()
                    .unwrap();
                let entries: Value = serde_json::from_str(value).unwrap();
                let ip = entries[0]["ips"][0].as_str().unwrap();
                ip.split('/').next().unwrap().to_string()
            }
        }
    }

    /// The VM `app` (its VirtualMachine and VMI), for a VM cell.
    async fn start_vm(&self, app: &str) {
        if self.holder != Holder::Vm {
            return;
        }
        for (kind, plural) in [
            ("VirtualMachine", "virtualmachines"),
            ("VirtualMachineInstance", "virtualmachineinstances"),
        ] {
            let object: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "kubevirt.io/v1", "kind": kind,
                "metadata": {"name": app, "namespace": NS}, "spec": {},
            }))
            .unwrap();
            kubevirt_api(&self.client, kind, plural)
                .create(&PostParams::default(), &object)
                .await
                .unwrap();
        }
    }

    async fn delete_vm(&self, app: &str) {
        for (kind, plural) in [
            ("VirtualMachineInstance", "virtualmachineinstances"),
            ("VirtualMachine", "virtualmachines"),
        ] {
            kubevirt_api(&self.client, kind, plural)
                .delete(app, &DeleteParams::default())
                .await
                .unwrap();
        }
    }

    /// Admit `object`, store it as `name` (with `patch` applied to the stored object), validate
    /// it: its IP on the interface, and the stored pod.
    async fn admit(
        &self,
        object: Value,
        name: &str,
        stored: impl FnOnce(&mut Value),
    ) -> (String, Pod) {
        let response = self
            .server
            .mutate(&self.review(&format!("m-{name}"), "CREATE", Some(object.clone()), None))
            .await;
        assert_eq!(
            response["allowed"],
            true,
            "admitting {name}: {}",
            message(&response)
        );
        let ip = self.granted_ip(&object, &response);
        let mut patched = apply(&object, &response);
        stored(&mut patched);
        let pod = persist_pod(&self.pods(), patched, name).await;
        let validated = self
            .server
            .validate(&self.review(
                &format!("v-{name}"),
                "CREATE",
                Some(serde_json::to_value(&pod).unwrap()),
                None,
            ))
            .await;
        assert_eq!(
            validated["allowed"],
            true,
            "validating {name}: {}",
            message(&validated)
        );
        (ip, pod)
    }

    async fn delete_reviewed(&self, pod: &Pod, grace: i64) {
        let mut review = common::delete_review(pod, grace);
        if self.holder == Holder::Vm {
            review["request"]["userInfo"] = json!({"username": CONTROLLER});
        }
        let answer = self.server.mutate(&review).await;
        assert_eq!(answer["allowed"], true, "{answer}");
    }

    async fn remove(&self, pod: &Pod) {
        let name = pod.metadata.name.as_deref().unwrap();
        self.pods()
            .delete(name, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    }

    async fn freed(&self, ip: &str, what: &str) {
        eventually(what, Duration::from_secs(15), || async {
            self.claim(ip).is_none().then_some(())
        })
        .await;
    }

    /// The claim on `ip` still locks it after `seconds` (every timer and sweep ran).
    async fn kept(&self, ip: &str, seconds: u64, what: &str) {
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        assert!(self.claim(ip).is_some(), "{what}: the IP {ip} was freed");
    }
}

async fn r1_bind(cell: &Cell) {
    cell.start_vm("r1").await;
    let object = cell.object("r1", "10.71.0.1-10.71.0.4", None);
    let (ip, pod) = cell.admit(object, "r1-a", |_| {}).await;
    let claim = cell.claim(&ip).expect("a claim");
    assert_eq!(claim.pod.uid.as_deref(), pod.metadata.uid.as_deref());
    assert_eq!(claim.phase, Phase::Bound);
    let mut copy = serde_json::to_value(&pod).unwrap();
    copy["metadata"]["name"] = json!("r1-copy");
    copy["metadata"]["uid"] = json!("uid-r1-copy");
    // created by an ordinary user: a launcher pod is one only when KubeVirt's controller
    // creates it (its next launcher pod takes the VM's claim over by design)
    let refused = cell
        .server
        .validate(&common::review(
            "v1",
            "v-copy",
            "CREATE",
            Some(copy),
            None,
            false,
        ))
        .await;
    assert_eq!(refused["allowed"], false, "a copy: {refused}");
}

async fn r2_release(cell: &Cell) {
    cell.start_vm("r2").await;
    let object = cell.object("r2", "10.72.0.1-10.72.0.4", None);
    let (ip, pod) = cell.admit(object, "r2-a", |_| {}).await;
    cell.delete_reviewed(&pod, 0).await;
    if cell.holder == Holder::Pod {
        // the deletion did not happen (refused after us): the pod runs on and keeps its IP
        cell.kept(&ip, 3, "a pod alive past its DELETE's grace")
            .await;
        cell.remove(&pod).await;
    } else {
        cell.remove(&pod).await;
        cell.kept(&ip, 3, "a VM whose launcher pod went").await;
        cell.delete_vm("r2").await;
    }
    cell.freed(&ip, "the IP to be freed once its holder is gone")
        .await;
}

async fn r3_leak(cell: &Cell) {
    cell.start_vm("r3").await;
    let object = cell.object("r3", "10.73.0.1-10.73.0.4", None);
    let (ip, pod) = cell.admit(object, "r3-a", |_| {}).await;
    cell.remove(&pod).await;
    if cell.holder == Holder::Vm {
        cell.kept(&ip, 4, "a running VM whose launcher pod went unseen")
            .await;
        cell.delete_vm("r3").await;
    }
    cell.freed(&ip, "a gone holder's IP to be freed").await;
}

async fn r4_sticky(cell: &Cell) {
    let object = cell.object("r4", "10.74.0.1-10.74.0.4", Some(0));
    let (ip, pod) = cell.admit(object.clone(), "r4-0", |_| {}).await;
    cell.delete_reviewed(&pod, 0).await;
    cell.remove(&pod).await;
    cell.kept(&ip, 1, "a StatefulSet pod's IP within the sticky grace")
        .await;
    let mut other = cell.object("r4", &ip, None);
    other["metadata"]["generateName"] = json!("r4-other-");
    let refused = cell
        .server
        .mutate(&cell.review("m-other", "CREATE", Some(other), None))
        .await;
    assert_eq!(refused["allowed"], false, "kept for r4-0: {refused}");
    let (again, pod) = cell.admit(object, "r4-0", |_| {}).await;
    assert_eq!(again, ip, "the recreated pod gets its IP back");
    cell.delete_reviewed(&pod, 0).await;
    cell.remove(&pod).await;
    cell.freed(&ip, "the kept IP to be freed after the sticky grace")
        .await;
}

async fn r5_node_loss(cell: &Cell) {
    cell.start_vm("r5").await;
    let nodes: Api<Node> = Api::all(cell.client.clone());
    common::node_loss::make_node(&nodes, "r5-node").await;
    let object = cell.object("r5", "10.75.0.1-10.75.0.4", None);
    let (ip, pod) = cell
        .admit(object, "r5-a", |stored| {
            stored["spec"]["nodeName"] = json!("r5-node");
            stored["metadata"]["finalizers"] = json!(["test.ip-webhook.io/stuck"]);
        })
        .await;
    let status = json!({"status": {"phase": "Running", "podIP": "10.9.9.9",
                                   "podIPs": [{"ip": "10.9.9.9"}]}});
    cell.pods()
        .patch_status(
            "r5-a",
            &Default::default(),
            &kube::api::Patch::Merge(&status),
        )
        .await
        .unwrap();
    common::node_loss::set_ready(&nodes, "r5-node", "Unknown", 0).await;
    cell.delete_reviewed(&pod, 1).await;
    cell.pods()
        .delete("r5-a", &DeleteParams::default().grace_period(1))
        .await
        .unwrap();
    match cell.holder {
        Holder::Pod => {
            cell.freed(&ip, "a pod lost with its node to free its IP")
                .await
        }
        Holder::Vm => {
            cell.kept(&ip, 4, "a VM's launcher pod on a lost node")
                .await
        }
    }
}

async fn r6_update(cell: &Cell) {
    cell.start_vm("r6").await;
    let object = cell.object("r6", "10.76.0.1-10.76.0.4", None);
    let (ip, pod) = cell.admit(object, "r6-a", |_| {}).await;
    let old = serde_json::to_value(&pod).unwrap();
    let mut new = old.clone();
    let annotations = new["metadata"]["annotations"].as_object_mut().unwrap();
    match cell.interface {
        Interface::Primary => {
            annotations.insert(
                "cni.projectcalico.org/ipAddrs".into(),
                json!("[\"10.76.0.4\"]"),
            );
        }
        Interface::Network => {
            annotations.insert(
                NETWORKS.into(),
                json!(r#"[{"name":"storage","ips":["10.76.0.4/24"]}]"#),
            );
        }
    }
    let answer = cell
        .server
        .validate(&cell.review("u-1", "UPDATE", Some(new), Some(old)))
        .await;
    assert_eq!(answer["allowed"], false, "{answer}");
    assert!(cell.claim(&ip).is_some());
}

/// Run `rule` on `cell`; its failure, named.
async fn check<F, Fut>(cell: &Arc<Cell>, name: &str, rule: F) -> Option<String>
where
    F: FnOnce(Arc<Cell>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let task = tokio::spawn(rule(cell.clone()));
    match task.await {
        Ok(()) => None,
        Err(error) => {
            let why = error
                .into_panic()
                .downcast::<String>()
                .map(|s| *s)
                .unwrap_or_else(|_| "panicked".into());
            Some(format!("{name} × {}: {why}", cell.name))
        }
    }
}

async fn run_cell(cell: Cell) -> Vec<String> {
    let cell = Arc::new(cell);
    let mut failures = Vec::new();
    failures.extend(check(&cell, "R1 bind", |c| async move { r1_bind(&c).await }).await);
    failures.extend(check(&cell, "R2 release", |c| async move { r2_release(&c).await }).await);
    failures.extend(
        check(
            &cell,
            "R3 leak sweeper",
            |c| async move { r3_leak(&c).await },
        )
        .await,
    );
    if cell.holder == Holder::Pod {
        failures.extend(
            check(
                &cell,
                "R4 sticky names",
                |c| async move { r4_sticky(&c).await },
            )
            .await,
        );
    }
    failures.extend(
        check(
            &cell,
            "R5 node loss",
            |c| async move { r5_node_loss(&c).await },
        )
        .await,
    );
    failures.extend(check(&cell, "R6 UPDATE", |c| async move { r6_update(&c).await }).await);
    failures
}

/// Every cell of one ledger, at once.
async fn ledger_cells(ledger: LedgerKind, etcd: Option<&EtcdCluster>) -> Vec<String> {
    let mut cells = Vec::new();
    for holder in [Holder::Pod, Holder::Vm] {
        for interface in [Interface::Primary, Interface::Network] {
            let prefix = format!("/matrix-{holder:?}-{interface:?}/");
            cells.push(Cell::start(ledger, holder, interface, etcd, &prefix).await);
        }
    }
    let runs: Vec<_> = cells.into_iter().map(run_cell).collect();
    futures::future::join_all(runs).await.concat()
}

fn assert_no_failures(failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{} cell rule(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_rule_holds_for_every_holder_and_interface_with_the_embedded_ledger() {
    assert_no_failures(ledger_cells(LedgerKind::Embedded, None).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_rule_holds_for_every_holder_and_interface_with_ipclaims() {
    assert_no_failures(ledger_cells(LedgerKind::IpClaims, None).await);
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_rule_holds_for_every_holder_and_interface_with_etcd() {
    let binary = common::etcd_cluster::etcd_binary(
        "every_rule_holds_for_every_holder_and_interface_with_etcd",
    );
    let etcd = EtcdCluster::start(&binary, 1);
    assert_no_failures(ledger_cells(LedgerKind::Etcd, Some(&etcd)).await);
}
