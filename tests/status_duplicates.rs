//! `ip-webhook status` against `fakeapi.py` lists IPs that two live pods carry, in
//! the table and in `-o json`, the oldest pod first, as the reconciler finds them.

mod common;

use common::fakeapi;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

fn status(args: &[&str], kubeconfig: &std::path::Path) -> (i32, String, String) {
    let home = tempfile::tempdir().unwrap();
    let out = common::binary()
        .arg("status")
        .args(args)
        .current_dir(home.path())
        .env("HOME", home.path())
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_ips_two_live_pods_carry() {
    let fake = fakeapi::FakeApi::start();
    let client = fake.install_crds().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let carrying = |name: &str, ip: &str| -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"app": "web", "ip-webhook.io/allocated-ip": ip}},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }))
        .unwrap()
    };
    pods.create(&PostParams::default(), &carrying("web-old", "10.97.40.1"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    pods.create(&PostParams::default(), &carrying("web-new", "10.97.40.1"))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &carrying("web-alone", "10.97.40.2"))
        .await
        .unwrap();

    let (code, table, stderr) = status(&[], &fake.kubeconfig());
    assert_eq!((code, stderr.as_str()), (0, ""), "{table}");
    assert!(
        table.contains(
            "DUPLICATE IPS: 1 IP(s) carried by two or more live pods; the oldest keeps each, delete the others\n\
             IP           KEEPS             ALSO ON\n\
             10.97.40.1   default/web-old   default/web-new\n"
        ),
        "{table}"
    );
    let (code, json, stderr) = status(&["-o", "json"], &fake.kubeconfig());
    assert_eq!((code, stderr.as_str()), (0, ""));
    let report: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        report["duplicates"],
        json!([{
            "ip": "10.97.40.1",
            "pods": ["default/web-old", "default/web-new"],
            "keeps": "default/web-old",
            "apps": ["default/web", "default/web"],
        }]),
        "{json}"
    );
}
