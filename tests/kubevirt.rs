//! KubeVirt virtual machines keep their IP, end to end against `fakeapi.py` with KubeVirt's
//! CRDs installed from tests/fixtures/kubevirt-crds.yaml: a replica with the IPClaim ledger,
//! launcher pods admitted as KubeVirt's controller creates them (its user, its labels, the
//! VMI as controller), then stored, deleted and their DELETEs reviewed as the API server
//! would. A VM restarted three times keeps its IP and keeps it while stopped; a live
//! migration's target pod shares it with the source, whose DELETE frees nothing; the IP is
//! freed once the VM is deleted; and the same pod from any other user is an ordinary pod.

mod common;

use std::time::Duration;

use common::events::events_with_reason;
use common::fakeapi::{FakeApi, install_crd_fixture, persist_pod};
use common::{allocated_ip, apply, create, eventually, message, rbac};
use ip_webhook_ledger::crd::IPClaim;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

const CONTROLLER: &str = "system:serviceaccount:kubevirt:kubevirt-controller";
const LIST: &str = "10.90.0.1-10.90.0.20";

fn kubevirt(client: &Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", kind),
        plural,
    );
    Api::namespaced_with(client.clone(), "default", &resource)
}

struct Cluster {
    client: Client,
    vms: Api<DynamicObject>,
    vmis: Api<DynamicObject>,
    pods: Api<Pod>,
    claims: Api<IPClaim>,
}

impl Cluster {
    async fn new(fake: &FakeApi) -> Cluster {
        let client = fake.install_crds().await;
        install_crd_fixture(&client, "kubevirt-crds.yaml").await;
        Cluster {
            vms: kubevirt(&client, "VirtualMachine", "virtualmachines"),
            vmis: kubevirt(&client, "VirtualMachineInstance", "virtualmachineinstances"),
            pods: Api::namespaced(client.clone(), "default"),
            claims: Api::all(client.clone()),
            client,
        }
    }

    /// A VirtualMachine whose template gives its launcher pods the app label and its list.
    async fn create_vm(&self, name: &str) {
        let vm: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"runStrategy": "Always", "template": {"metadata": {
                "labels": {"app": name},
                "annotations": {"ip-webhook.io/allocatable-ips": LIST},
            }}},
        }))
        .unwrap();
        self.vms.create(&PostParams::default(), &vm).await.unwrap();
    }

    /// The VM's VirtualMachineInstance (same name, as KubeVirt's VM controller makes it); its UID.
    async fn start_vmi(&self, name: &str) -> String {
        let vmi: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {},
        }))
        .unwrap();
        let created = self
            .vmis
            .create(&PostParams::default(), &vmi)
            .await
            .unwrap();
        created.metadata.uid.unwrap()
    }

    async fn delete(&self, api: &Api<DynamicObject>, name: &str) {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }

    async fn claim(&self, ip: &str) -> Option<IPClaim> {
        self.claims.get_opt(ip).await.unwrap()
    }

    /// Wait until the claim of `ip` is Bound to the pod `pod`.
    async fn bound_to(&self, ip: &str, pod: &str) -> IPClaim {
        eventually(
            &format!("the claim of {ip} to be bound to {pod}"),
            Duration::from_secs(15),
            || async {
                let claim = self.claim(ip).await?;
                (claim.spec.pod_name == pod && claim.status.as_ref()?.phase == "Bound")
                    .then_some(claim)
            },
        )
        .await
    }
}

/// A launcher pod of VMI `vm` (UID `vmi_uid`) as KubeVirt's controller writes it
/// (kubevirt/kubevirt pkg/virt-controller/services/template.go): labels from the VM's template
/// and its own, the VMI as controlling owner; `migration` labels a migration's target pod.
fn launcher(vm: &str, vmi_uid: &str, migration: Option<&str>) -> Value {
    let mut labels = json!({
        "app": vm,
        "kubevirt.io": "virt-launcher",
        "kubevirt.io/created-by": vmi_uid,
        "vm.kubevirt.io/name": vm,
    });
    if let Some(job) = migration {
        labels["kubevirt.io/migrationJobUID"] = json!(job);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": format!("virt-launcher-{vm}-"),
            "namespace": "default",
            "labels": labels,
            "annotations": {
                "ip-webhook.io/allocatable-ips": LIST,
                "kubevirt.io/domain": vm,
            },
            "ownerReferences": [{
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "name": vm, "uid": vmi_uid, "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {"containers": [{"name": "compute", "image": "quay.io/kubevirt/virt-launcher"}]},
    })
}

/// A CREATE review of `pod` sent by `user`.
fn create_as(uid: &str, pod: Value, user: &str) -> Value {
    let mut review = create(uid, pod);
    review["request"]["userInfo"] = json!({"username": user});
    review
}

/// A launcher pod's DELETE review, sent by KubeVirt's controller.
fn delete_review(pod: &Pod) -> Value {
    let mut review = common::delete_review(pod, 0);
    review["request"]["userInfo"] = json!({"username": CONTROLLER});
    review
}

/// Admit a launcher pod (as KubeVirt's controller) and store it as `name`; its IP and the pod.
async fn launch(
    server: &common::TestServer,
    cluster: &Cluster,
    object: Value,
    name: &str,
) -> (String, Pod) {
    let (ip, admitted) = admit_launcher(server, &object, name).await;
    (ip, persist_pod(&cluster.pods, admitted, name).await)
}

/// `/mutate` a launcher pod as KubeVirt's controller: its IP and the pod as admitted.
async fn admit_launcher(
    server: &common::TestServer,
    object: &Value,
    name: &str,
) -> (String, Value) {
    let response = server
        .mutate(&create_as(
            &format!("create-{name}"),
            object.clone(),
            CONTROLLER,
        ))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    (allocated_ip(&response), apply(object, &response))
}

/// Delete a launcher pod the way the API server does: its DELETE reviewed, the object gone.
async fn remove_pod(server: &common::TestServer, cluster: &Cluster, pod: &Pod) {
    let answer = server.mutate(&delete_review(pod)).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    let name = pod.metadata.name.as_deref().unwrap();
    cluster
        .pods
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

/// An ordinary pod of app `app` asking for an IP from the list: which it gets.
async fn plain_pod_ip(server: &common::TestServer, app: &str, uid: &str) -> String {
    let response = server
        .mutate(&create(
            uid,
            common::pod("default", app, "other-", Some(LIST)),
        ))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    allocated_ip(&response)
}

async fn replica(fake: &FakeApi) -> common::TestServer {
    replica_with(fake, &[]).await
}

async fn replica_with(fake: &FakeApi, extra: &[&str]) -> common::TestServer {
    replica_resyncing(fake, "3s", extra).await
}

async fn replica_resyncing(fake: &FakeApi, resync: &str, extra: &[&str]) -> common::TestServer {
    let mut args = vec![
        "--release-delay",
        "0s",
        "--lease-duration",
        "2s",
        "--lease-renew-interval",
        "200ms",
        "--resync-period",
        resync,
        // a launcher pod may go before the leader saw it stored: its claim is a promise for
        // this long, then judged by the VM
        "--reservation-ttl",
        "2s",
    ];
    args.extend_from_slice(extra);
    fake.replica(&args).await
}

/// Wait for the release timer and the reconciler to have seen the change (they run every
/// second and on every watch event); then the claim of `ip` must still be the VM's.
async fn still_the_vms(cluster: &Cluster, ip: &str, vm: &str) -> IPClaim {
    tokio::time::sleep(Duration::from_secs(3)).await;
    let claim = cluster.claim(ip).await.expect("the VM's claim is kept");
    assert_eq!(claim.spec.vm.as_deref(), Some(vm), "{claim:?}");
    claim
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_restarted_three_times_keeps_its_ip_and_deleting_it_frees_the_ip() {
    let fake = FakeApi::start();
    let cluster = Cluster::new(&fake).await;
    let server = replica(&fake).await;
    cluster.create_vm("db").await;

    let mut first_ip = None;
    for start in 0..4 {
        let vmi_uid = cluster.start_vmi("db").await;
        let name = format!("virt-launcher-db-{start}");
        let (ip, pod) = launch(&server, &cluster, launcher("db", &vmi_uid, None), &name).await;
        assert_eq!(*first_ip.get_or_insert(ip.clone()), ip, "start {start}");
        let claim = cluster.bound_to(&ip, &name).await;
        assert_eq!(claim.spec.vm.as_deref(), Some("db"));
        // a pod that is not the VM's never gets its IP, running or stopped
        assert_ne!(
            plain_pod_ip(&server, "db", &format!("other-{start}")).await,
            ip
        );
        // stop: the launcher pod goes, then the VMI; the VirtualMachine stays
        remove_pod(&server, &cluster, &pod).await;
        cluster.delete(&cluster.vmis, "db").await;
        still_the_vms(&cluster, &ip, "db").await;
    }
    let ip = first_ip.unwrap();
    assert_ne!(
        plain_pod_ip(&server, "db", "other-stopped").await,
        ip,
        "a stopped VM keeps its IP"
    );

    // Deleting the stopped VM frees its IP: the reconciler's next pass (at the latest the
    // next resync) finds neither a VirtualMachine nor a VMI behind the claim.
    cluster.delete(&cluster.vms, "db").await;
    eventually(
        "the deleted VM's claim to be released",
        Duration::from_secs(20),
        || async { cluster.claim(&ip).await.is_none().then_some(()) },
    )
    .await;
    let next = eventually("the IP to be given again", Duration::from_secs(10), || {
        let server = &server;
        async move {
            let response = server
                .mutate(&create(
                    "after",
                    common::pod("default", "db", "x-", Some("10.90.0.1")),
                ))
                .await;
            (response["allowed"] == true).then(|| allocated_ip(&response))
        }
    })
    .await;
    assert_eq!(next, ip);
    let (_, metrics) = server.admin_get("/metrics").await;
    assert!(
        metrics.contains("ip_webhook_leaks_reclaimed_total 0"),
        "a VM's release is no leak: {metrics}"
    );
    rbac::assert_rbac_covers(&fake);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_migration_shares_the_ip_and_the_sources_delete_frees_nothing() {
    let fake = FakeApi::start();
    let cluster = Cluster::new(&fake).await;
    let server = replica(&fake).await;
    cluster.create_vm("mig").await;
    let vmi_uid = cluster.start_vmi("mig").await;
    let (ip, source) = launch(
        &server,
        &cluster,
        launcher("mig", &vmi_uid, None),
        "virt-launcher-mig-src",
    )
    .await;
    cluster.bound_to(&ip, "virt-launcher-mig-src").await;

    // The same pod from a user other than KubeVirt's controller is an ordinary pod: it does
    // not get the VM's IP.
    let forged = server
        .mutate(&create_as(
            "forged",
            launcher("mig", &vmi_uid, Some("job-1")),
            "system:serviceaccount:default:intruder",
        ))
        .await;
    assert_eq!(forged["allowed"], true, "{forged}");
    assert_ne!(allocated_ip(&forged), ip, "{forged}");

    // The migration's target pod comes up on the IP while the source still runs.
    let (target_ip, target) = launch(
        &server,
        &cluster,
        launcher("mig", &vmi_uid, Some("job-1")),
        "virt-launcher-mig-dst",
    )
    .await;
    assert_eq!(target_ip, ip);
    cluster.bound_to(&ip, "virt-launcher-mig-dst").await;
    assert!(
        cluster
            .pods
            .get_opt("virt-launcher-mig-src")
            .await
            .unwrap()
            .is_some(),
        "both pods run together"
    );
    assert_ne!(plain_pod_ip(&server, "mig", "other-during").await, ip);

    // The migration is over: KubeVirt deletes the source pod. Its DELETE frees nothing.
    remove_pod(&server, &cluster, &source).await;
    let claim = still_the_vms(&cluster, &ip, "mig").await;
    assert_eq!(claim.spec.pod_name, "virt-launcher-mig-dst");
    assert_eq!(claim.status.unwrap().phase, "Bound");
    assert_ne!(plain_pod_ip(&server, "mig", "other-after").await, ip);
    let events: Api<Event> = Api::all(cluster.client.clone());
    assert!(
        events_with_reason(&events, "DuplicateIP").await.is_empty(),
        "a migration's two pods are one holder"
    );

    // The VM is deleted: its VMI and its pod go, and the IP is free.
    cluster.delete(&cluster.vmis, "mig").await;
    cluster.delete(&cluster.vms, "mig").await;
    remove_pod(&server, &cluster, &target).await;
    eventually(
        "the migrated VM's claim to be released",
        Duration::from_secs(15),
        || async { cluster.claim(&ip).await.is_none().then_some(()) },
    )
    .await;
    let refused_other = server
        .mutate(&create(
            "static-after",
            common::pod("default", "mig", "x-", Some(&ip)),
        ))
        .await;
    assert_eq!(
        refused_other["allowed"],
        true,
        "{}",
        message(&refused_other)
    );
    assert_eq!(allocated_ip(&refused_other), ip);
    rbac::assert_rbac_covers(&fake);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_release_on_stop_a_stopped_vm_gives_its_ip_back() {
    let fake = FakeApi::start();
    let cluster = Cluster::new(&fake).await;
    let server = replica_with(&fake, &["--kubevirt-release-on-stop"]).await;
    cluster.create_vm("web").await;
    let vmi_uid = cluster.start_vmi("web").await;
    let (ip, pod) = launch(
        &server,
        &cluster,
        launcher("web", &vmi_uid, None),
        "virt-launcher-web-a",
    )
    .await;
    cluster.bound_to(&ip, "virt-launcher-web-a").await;
    // stopped: the VMI goes, then its pod; the VirtualMachine stays
    cluster.delete(&cluster.vmis, "web").await;
    remove_pod(&server, &cluster, &pod).await;
    eventually(
        "the stopped VM's claim to be released",
        Duration::from_secs(20),
        || async { cluster.claim(&ip).await.is_none().then_some(()) },
    )
    .await;
    assert!(
        cluster.vms.get_opt("web").await.unwrap().is_some(),
        "the VM itself is still there"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_deleted_while_stopped_is_freed_at_its_deletion_not_at_the_next_resync() {
    let fake = FakeApi::start();
    let cluster = Cluster::new(&fake).await;
    // a resync far beyond the test: only the watch of VM deletions can free the IP in time
    let server = replica_resyncing(&fake, "10m", &[]).await;
    cluster.create_vm("cold").await;
    let vmi_uid = cluster.start_vmi("cold").await;
    let (ip, pod) = launch(
        &server,
        &cluster,
        launcher("cold", &vmi_uid, None),
        "virt-launcher-cold-a",
    )
    .await;
    cluster.bound_to(&ip, "virt-launcher-cold-a").await;
    // stopped: kept (the leader found, and remembers, that the VM holds its IP)
    cluster.delete(&cluster.vmis, "cold").await;
    remove_pod(&server, &cluster, &pod).await;
    still_the_vms(&cluster, &ip, "cold").await;
    cluster.delete(&cluster.vms, "cold").await;
    eventually(
        "the deleted VM's claim to be released",
        Duration::from_secs(10),
        || async { cluster.claim(&ip).await.is_none().then_some(()) },
    )
    .await;
    let (_, metrics) = server.admin_get("/metrics").await;
    assert!(
        metrics.contains("ip_webhook_leaks_reclaimed_total 0"),
        "a VM's release is no leak: {metrics}"
    );
    rbac::assert_rbac_covers(&fake);
}

/// `object` as the API server stores it after our patch: its final name and UID.
fn stored(object: Value, name: &str) -> Pod {
    let mut object = object;
    object["metadata"]["name"] = json!(name);
    object["metadata"]["uid"] = json!(format!("uid-{name}"));
    serde_json::from_value(object).unwrap()
}

/// Admit (as KubeVirt's controller) and validate a launcher pod, stored as `name`; its IP
/// and the pod, with no API server behind the webhook.
async fn launch_off_cluster(
    server: &common::TestServer,
    object: Value,
    name: &str,
) -> (String, Pod) {
    let (ip, admitted) = admit_launcher(server, &object, name).await;
    let pod = stored(admitted, name);
    let validated = server
        .validate(&create_as(
            &format!("validate-{name}"),
            serde_json::to_value(&pod).unwrap(),
            CONTROLLER,
        ))
        .await;
    assert_eq!(validated["allowed"], true, "{validated}");
    (ip, pod)
}

/// Off-cluster: `pod`'s DELETE reviewed, and the release timer's ticks past (the release
/// delay is 0 s in these tests).
async fn deleted_off_cluster(server: &common::TestServer, pod: &Pod) {
    let answer = server.mutate(&delete_review(pod)).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    tokio::time::sleep(Duration::from_secs(3)).await;
}

/// The VM stops: its last launcher pod's DELETE frees `ip` once its grace is over.
async fn last_launcher_frees(server: &common::TestServer, last: &Pod, ip: &str) {
    let answer = server.mutate(&delete_review(last)).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    eventually(
        "the stopped VM's IP to be freed",
        Duration::from_secs(10),
        || async { holder_of(server, ip).is_none().then_some(()) },
    )
    .await;
}

/// A pod of another app asking for `ip` statically is refused: the VM holds it.
async fn intruder_refused(server: &common::TestServer, ip: &str) -> Value {
    let intruder = server
        .mutate(&create(
            "static-intruder",
            common::pod("default", "other", "x-", Some(ip)),
        ))
        .await;
    assert_eq!(intruder["allowed"], false, "{intruder}");
    intruder
}

/// Which pod holds the claim on `ip`, and in which phase; `None` once it is free.
fn holder_of(server: &common::TestServer, ip: &str) -> Option<(String, ip_webhook_ledger::Phase)> {
    let claim = server
        .launched
        .webhook
        .allocator
        .holder(&ip.parse().unwrap())?;
    claim
        .locks_ip()
        .then(|| (claim.pod.name.to_string(), claim.phase))
}

/// With no API server to ask, the webhook knows the VM runs on from the launcher pods it
/// admitted and saw deleted: a live migration's target that fails (KubeVirt deletes it with
/// grace 0) gives the claim back to the source, which still runs the VM, and the retried
/// migration's new target gets the same IP; the source's DELETE once a migration succeeds
/// frees nothing, and only the last launcher pod's DELETE frees the IP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_api_server_a_failed_migration_gives_the_ip_back_to_the_source() {
    use ip_webhook_ledger::Phase;
    let server = common::TestServer::start(&["--release-delay", "0s"]).await;
    let (ip, source) = launch_off_cluster(&server, launcher("db", "vmi-1", None), "src").await;
    let (target_ip, target) =
        launch_off_cluster(&server, launcher("db", "vmi-1", Some("job-1")), "dst-1").await;
    assert_eq!(target_ip, ip, "the target comes up on the VM's IP");
    assert_eq!(
        holder_of(&server, &ip),
        Some(("dst-1".into(), Phase::Bound))
    );

    // the migration fails: KubeVirt deletes its target at once; past the release timer's
    // ticks the source still runs the VM, so the IP is kept for it
    deleted_off_cluster(&server, &target).await;
    assert_eq!(
        holder_of(&server, &ip),
        Some(("src".into(), Phase::Bound)),
        "the source runs the VM on its IP"
    );
    let intruder = intruder_refused(&server, &ip).await;
    assert!(
        message(&intruder).contains("vm default/db"),
        "{}",
        message(&intruder)
    );

    // the retried migration's new target gets the VM's IP, not a second one
    let (retry_ip, retry) =
        launch_off_cluster(&server, launcher("db", "vmi-1", Some("job-2")), "dst-2").await;
    assert_eq!(retry_ip, ip, "one VM, one IP");
    // it succeeds: the source is deleted, and frees nothing
    deleted_off_cluster(&server, &source).await;
    assert_eq!(
        holder_of(&server, &ip),
        Some(("dst-2".into(), Phase::Bound))
    );
    let vm_claims = server
        .launched
        .webhook
        .allocator
        .claims()
        .into_iter()
        .filter(|c| c.vm.as_deref() == Some("db") && c.locks_ip())
        .count();
    assert_eq!(vm_claims, 1, "the VM holds one claim");

    last_launcher_frees(&server, &retry, &ip).await;
}

/// Off-cluster, with launcher pods KubeVirt leaves undeleted: a first migration succeeds and
/// its source stays (completed), a second one starts and fails. Which pod runs the VM the
/// reviews do not say, so the claim keeps every launcher pod not yet deleted: the source's
/// DELETE frees nothing while the first target may run the VM, and the IP is freed only after
/// the last of them is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_api_server_every_undeleted_launcher_pod_keeps_the_vms_ip() {
    use ip_webhook_ledger::Phase;
    let server = common::TestServer::start(&["--release-delay", "0s"]).await;
    let (ip, source) = launch_off_cluster(&server, launcher("db", "vmi-1", None), "src").await;
    let (_, first) =
        launch_off_cluster(&server, launcher("db", "vmi-1", Some("job-1")), "dst-1").await;
    let (second_ip, second) =
        launch_off_cluster(&server, launcher("db", "vmi-1", Some("job-2")), "dst-2").await;
    assert_eq!(second_ip, ip, "one VM, one IP");

    // the second migration fails: its target goes, the first target holds the claim again
    deleted_off_cluster(&server, &second).await;
    assert_eq!(
        holder_of(&server, &ip),
        Some(("dst-1".into(), Phase::Bound))
    );
    // the first migration's source, done long ago, is deleted: the first target runs on
    deleted_off_cluster(&server, &source).await;
    assert_eq!(
        holder_of(&server, &ip),
        Some(("dst-1".into(), Phase::Bound)),
        "the pod that runs the VM keeps its IP"
    );
    intruder_refused(&server, &ip).await;

    // the VM stops: the last launcher pod's DELETE frees the IP
    last_launcher_frees(&server, &first, &ip).await;
}

/// `pod` runs on `ip`, as the kubelet and the CNI report it (`status.podIPs`).
async fn running_on(cluster: &Cluster, pod: &Pod, ip: &str) {
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
    let name = pod.metadata.name.as_deref().unwrap();
    cluster
        .pods
        .patch_status(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&status),
        )
        .await
        .unwrap();
}

/// A live migration whose target fails, in a cluster: its DELETE gives the claim back to the
/// source, and the retried migration's target comes up on the same IP, though the source runs
/// on it as the pod index sees (the VM's launcher pods are its own, never another user of
/// the IP). The same holds when the webhook missed the failed target's DELETE, and the claim
/// still names that gone pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_migration_keeps_the_vms_ip_while_the_source_runs_on_it() {
    let fake = FakeApi::start();
    let cluster = Cluster::new(&fake).await;
    let server = replica(&fake).await;
    cluster.create_vm("mv").await;
    let vmi_uid = cluster.start_vmi("mv").await;
    let (ip, source) = launch(
        &server,
        &cluster,
        launcher("mv", &vmi_uid, None),
        "virt-launcher-mv-src",
    )
    .await;
    cluster.bound_to(&ip, "virt-launcher-mv-src").await;
    running_on(&cluster, &source, &ip).await;

    for (attempt, missed) in [(1, false), (2, true)] {
        let name = format!("virt-launcher-mv-dst-{attempt}");
        let job = format!("job-{attempt}");
        let (target_ip, target) = launch(
            &server,
            &cluster,
            launcher("mv", &vmi_uid, Some(&job)),
            &name,
        )
        .await;
        assert_eq!(
            target_ip, ip,
            "attempt {attempt}: the target gets the VM's IP"
        );
        cluster.bound_to(&ip, &name).await;
        // the target fails and goes: its DELETE reviewed, or (missed) not
        if !missed {
            let answer = server.mutate(&delete_review(&target)).await;
            assert_eq!(answer["allowed"], true, "{answer}");
        }
        cluster
            .pods
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
        let claim = still_the_vms(&cluster, &ip, "mv").await;
        if !missed {
            assert_eq!(claim.spec.pod_name, "virt-launcher-mv-src", "{claim:?}");
        }
    }
    let (retry_ip, _) = launch(
        &server,
        &cluster,
        launcher("mv", &vmi_uid, Some("job-3")),
        "virt-launcher-mv-dst-3",
    )
    .await;
    assert_eq!(retry_ip, ip, "the third attempt too: one VM, one IP");
    // another app's pod asking for the IP by hand is refused, naming the VM, not a pod of it
    let mut thief = common::pod("default", "other", "thief-", None);
    thief["metadata"]["annotations"]["cni.projectcalico.org/ipAddrs"] =
        json!(format!("[\"{ip}\"]"));
    let refused = server.mutate(&create("thief", thief)).await;
    assert_eq!(refused["allowed"], false, "{refused}");
    assert!(
        message(&refused).contains("vm default/mv"),
        "{}",
        message(&refused)
    );
    let claims: Vec<IPClaim> = cluster
        .claims
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let vms = claims
        .iter()
        .filter(|c| c.spec.vm.as_deref() == Some("mv"))
        .count();
    assert_eq!(vms, 1, "the VM holds one claim: {claims:?}");
}

/// A VMI without a VirtualMachine is a VM of its own: its claim outlives its launcher pod while
/// the VMI exists, and is freed at the VMI's deletion, not at the next resync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vmi_without_a_vm_is_freed_at_its_deletion_not_at_the_next_resync() {
    let fake = FakeApi::start();
    let cluster = Cluster::new(&fake).await;
    let server = replica_resyncing(&fake, "10m", &[]).await;
    let vmi_uid = cluster.start_vmi("solo").await;
    let (ip, pod) = launch(
        &server,
        &cluster,
        launcher("solo", &vmi_uid, None),
        "virt-launcher-solo-a",
    )
    .await;
    cluster.bound_to(&ip, "virt-launcher-solo-a").await;
    remove_pod(&server, &cluster, &pod).await;
    still_the_vms(&cluster, &ip, "solo").await;
    cluster.delete(&cluster.vmis, "solo").await;
    eventually(
        "the deleted VMI's claim to be released",
        Duration::from_secs(10),
        || async { cluster.claim(&ip).await.is_none().then_some(()) },
    )
    .await;
}

/// [`launch`], then the stored pod validated as the API server would: its claim bound.
#[cfg(feature = "etcd")]
async fn launch_validated(
    server: &common::TestServer,
    cluster: &Cluster,
    object: Value,
    name: &str,
) -> (String, Pod) {
    let (ip, pod) = launch(server, cluster, object, name).await;
    let review = create_as(
        &format!("validate-{name}"),
        serde_json::to_value(&pod).unwrap(),
        CONTROLLER,
    );
    let validated = server.validate(&review).await;
    assert_eq!(validated["allowed"], true, "{validated}");
    (ip, pod)
}

/// With the etcd ledger the leak sweeper frees a VM's claim as the reconciler does: only once
/// the VM is gone. A migration's target deleted with no DELETE reviewed leaves the claim naming
/// a gone pod while the VM runs on the source, then the VM stops (its VMI and pod go): the IP
/// stays the VM's through both, well past the sticky grace, and is freed once the VM is
/// deleted.
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_etcd_ledger_a_vms_ip_is_freed_only_once_the_vm_is_gone() {
    use common::etcd_cluster::{EtcdCluster, etcd_binary};
    let binary = etcd_binary("with_the_etcd_ledger_a_vms_ip_is_freed_only_once_the_vm_is_gone");
    let etcd = EtcdCluster::start(&binary, 1);
    let fake = FakeApi::start();
    let cluster = Cluster::new(&fake).await;
    let endpoints = etcd.endpoints_flag();
    let extra = [
        "--reservation-ttl",
        "1s",
        "--sticky-grace",
        "2s",
        "--resync-period",
        "300ms",
        "--release-delay",
        "0s",
        "--lease-namespace",
        "default",
        "--lease-duration",
        "2s",
        "--lease-renew-interval",
        "200ms",
    ];
    let server = fake.etcd_replica_via(fake.port, &endpoints, &extra).await;
    let vm_holds = |ip: &str| {
        server
            .launched
            .webhook
            .allocator
            .holder(&ip.parse().unwrap())
            .is_some_and(|c| c.locks_ip() && c.vm.as_deref() == Some("db"))
    };
    cluster.create_vm("db").await;
    let vmi_uid = cluster.start_vmi("db").await;
    let (ip, source) = launch_validated(
        &server,
        &cluster,
        launcher("db", &vmi_uid, None),
        "virt-launcher-db-src",
    )
    .await;
    let (target_ip, _) = launch_validated(
        &server,
        &cluster,
        launcher("db", &vmi_uid, Some("job-1")),
        "virt-launcher-db-dst",
    )
    .await;
    assert_eq!(target_ip, ip);
    cluster
        .pods
        .delete("virt-launcher-db-dst", &DeleteParams::default())
        .await
        .unwrap();
    // reservation TTL, sticky grace and many sweeps later
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        vm_holds(&ip),
        "the VM runs on the source: its IP stays held"
    );
    assert_ne!(plain_pod_ip(&server, "db", "other-migrated").await, ip);

    // stopped: the VMI and its pod go (no DELETE reviewed); the VirtualMachine stays
    cluster.delete(&cluster.vmis, "db").await;
    cluster
        .pods
        .delete(
            source.metadata.name.as_deref().unwrap(),
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(vm_holds(&ip), "a stopped VM keeps its IP");

    cluster.delete(&cluster.vms, "db").await;
    eventually(
        "the deleted VM's IP to be freed",
        Duration::from_secs(15),
        || async { (!vm_holds(&ip)).then_some(()) },
    )
    .await;
}
