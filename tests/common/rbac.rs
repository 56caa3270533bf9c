//! Checks every API request a webhook replica made against the RBAC it is granted
//! (`deploy/rbac.yaml`), from the fake API server's request log.
#![allow(dead_code)]

use std::collections::{BTreeSet, HashSet};
use std::path::Path;

use serde_json::Value;

use super::fakeapi::FakeApi;

/// (apiGroup, resource[/subresource], verb) of one API request, as RBAC sees it.
pub fn rbac_request(method: &str, path: &str, query: &str) -> Option<(String, String, String)> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    let (resource, named) = match rest {
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, sub] => (format!("{resource}/{sub}"), true),
        _ => return None,
    };
    let watch = query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    let verb = match (method, named) {
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    Some((group.to_string(), resource, verb.to_string()))
}

/// Every request the webhook made (its User-Agent) is allowed by `deploy/rbac.yaml`; returns
/// what it used.
pub fn assert_rbac_covers(fake: &FakeApi) -> BTreeSet<(String, String, String)> {
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/rbac.yaml"))
            .unwrap();
    let mut granted = HashSet::new();
    for document in serde_yaml::Deserializer::from_str(&manifest) {
        let value: Value = serde::Deserialize::deserialize(document).unwrap();
        if !matches!(value["kind"].as_str(), Some("ClusterRole" | "Role")) {
            continue;
        }
        for rule in value["rules"].as_array().unwrap() {
            for group in rule["apiGroups"].as_array().unwrap() {
                for resource in rule["resources"].as_array().unwrap() {
                    for verb in rule["verbs"].as_array().unwrap() {
                        granted.insert((
                            group.as_str().unwrap().to_string(),
                            resource.as_str().unwrap().to_string(),
                            verb.as_str().unwrap().to_string(),
                        ));
                    }
                }
            }
        }
    }
    let log = fake.get_json("/fake/requests");
    let mut used = BTreeSet::new();
    for request in log["requests"].as_array().unwrap() {
        if !request["ua"]
            .as_str()
            .unwrap_or("")
            .starts_with("ip-webhook/")
        {
            continue;
        }
        let method = request["method"].as_str().unwrap();
        let path = request["path"].as_str().unwrap();
        let query = request["query"].as_str().unwrap_or("");
        if let Some(needed) = rbac_request(method, path, query) {
            used.insert(needed);
        }
    }
    assert!(
        !used.is_empty(),
        "the request log shows the webhook's requests"
    );
    let missing: Vec<_> = used.iter().filter(|u| !granted.contains(*u)).collect();
    assert!(missing.is_empty(), "deploy/rbac.yaml lacks {missing:?}");
    println!("RBAC used by the webhook: {used:?}");
    used
}
