//! Multus's pod annotation `k8s.v1.cni.cncf.io/networks`: the secondary networks (network
//! attachments) a pod asks for, read as Multus reads it, and written back with the IPs asked
//! of each network's IPAM.
//!
//! The rules are Multus's (k8snetworkplumbingwg/multus-cni `pkg/k8sclient/k8sclient.go`,
//! `parsePodNetworkAnnotation` and `parsePodNetworkObjectName`):
//! - a value with any of `[`, `{` or `"` is a JSON list of objects (`name`, `namespace`,
//!   `interface`, `ips`, `mac`, and more, which are kept as written);
//! - otherwise it is a comma-separated list of `[namespace/]name[@interface]`, each item and
//!   part trimmed, the namespace and name DNS-1123 labels;
//! - an attachment without a namespace is in the pod's;
//! - an interface name is at most 15 bytes, without `/` or whitespace (the list form);
//! - each of `ips` is an IP or a CIDR (`10.1.0.5/24`), and `mac` a MAC address, as Go's
//!   `net.ParseIP`, `net.ParseCIDR` and `net.ParseMAC` read them.
//!
//! The IPs are written in the JSON form's `ips`, as Multus passes them to the attachment's
//! IPAM (the `static` IPAM plugin with `capabilities: {ips: true}`, Whereabouts, Spiderpool),
//! which needs a prefix length: `10.1.0.5/24`.

use std::net::IpAddr;

use serde_json::{Map, Value};

use super::annotations::AnnotationError;
use crate::ipam::ipset::excerpt;
use crate::ledger::network::is_dns_label;

/// The annotation a pod names its network attachments in.
pub const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";

/// The longest interface name Linux takes (`IFNAMSIZ` less its NUL).
const MAX_INTERFACE: usize = 15;

/// One network attachment a pod asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Attachment {
    /// The NetworkAttachmentDefinition's namespace (the pod's when the annotation names none).
    pub namespace: String,
    pub name: String,
    /// The interface asked for (`net1`), if any.
    pub interface: Option<String>,
    /// The IPs asked for by hand (`ips`), each with its prefix length when written as a CIDR.
    pub ips: Vec<(IpAddr, Option<u8>)>,
    /// The JSON object as written (the list form: none), so that writing it back keeps every
    /// field Multus or another plugin reads.
    fields: Map<String, Value>,
}

impl Attachment {
    /// `namespace/name`: the attachment's identity.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Ask the attachment's IPAM for `ips` (each with its prefix length), in place of any
    /// `ips` it had.
    pub fn set_ips(&mut self, ips: &[(IpAddr, u8)]) {
        self.ips = ips
            .iter()
            .map(|(ip, prefix)| (*ip, Some(*prefix)))
            .collect();
    }

    fn to_json(&self) -> Value {
        let mut object = self.fields.clone();
        object.insert("name".into(), Value::from(self.name.as_str()));
        object.insert("namespace".into(), Value::from(self.namespace.as_str()));
        if let Some(interface) = &self.interface {
            object.insert("interface".into(), Value::from(interface.as_str()));
        }
        if self.ips.is_empty() {
            object.remove("ips");
        } else {
            let ips = self.ips.iter().map(|(ip, prefix)| match prefix {
                Some(prefix) => Value::from(format!("{ip}/{prefix}")),
                None => Value::from(ip.to_string()),
            });
            object.insert("ips".into(), Value::Array(ips.collect()));
        }
        Value::Object(object)
    }
}

/// The attachments of a `k8s.v1.cni.cncf.io/networks` value, in order; none for an empty one.
pub fn parse_networks(
    value: &str,
    pod_namespace: &str,
) -> Result<Vec<Attachment>, AnnotationError> {
    if value.is_empty() {
        return Ok(Vec::new());
    }
    if value.contains(['[', '{', '"']) {
        return parse_json_form(value, pod_namespace);
    }
    value
        .split(',')
        .map(|item| parse_list_item(item.trim(), pod_namespace))
        .collect()
}

/// The JSON form of `attachments`, as the annotation's new value.
pub fn write_networks(attachments: &[Attachment]) -> String {
    Value::Array(attachments.iter().map(Attachment::to_json).collect()).to_string()
}

/// The annotation Multus writes once a pod's interfaces are up: one entry per interface, its
/// network named `namespace/name` and the IPs it got (k8snetworkplumbingwg
/// network-attachment-definition-client `pkg/apis/k8s.cni.cncf.io/v1/types.go`,
/// `NetworkStatusAnnot` and `NetworkStatus`).
pub const NETWORK_STATUS: &str = "k8s.v1.cni.cncf.io/network-status";

/// The IPs a `k8s.v1.cni.cncf.io/network-status` value says the network `namespace/name` gave
/// the pod; none for a value that cannot be read.
pub fn status_ips(value: &str, namespace: &str, name: &str) -> Vec<IpAddr> {
    let Ok(Value::Array(entries)) = serde_json::from_str::<Value>(value) else {
        return Vec::new();
    };
    let network = format!("{namespace}/{name}");
    entries
        .iter()
        .filter(|entry| entry["name"].as_str() == Some(network.as_str()))
        .flat_map(|entry| entry["ips"].as_array().into_iter().flatten())
        .filter_map(|ip| {
            let text = ip.as_str()?;
            text.split('/').next()?.parse().ok()
        })
        .collect()
}

fn networks_error(value: &str, reason: impl Into<String>) -> AnnotationError {
    AnnotationError::Networks {
        value: excerpt(value),
        reason: reason.into(),
    }
}

/// One item of the list form: `[namespace/]name[@interface]`.
fn parse_list_item(item: &str, pod_namespace: &str) -> Result<Attachment, AnnotationError> {
    let (namespace, rest) = match item.split('/').collect::<Vec<_>>()[..] {
        [name] => ("", name),
        [namespace, name] => (namespace.trim(), name),
        _ => return Err(networks_error(item, "has more than one '/'")),
    };
    let (name, interface) = match rest.split('@').collect::<Vec<_>>()[..] {
        [name] => (name.trim(), None),
        [name, interface] => (name.trim(), Some(interface.trim())),
        _ => return Err(networks_error(item, "has more than one '@'")),
    };
    for part in [namespace, name] {
        if !part.is_empty() && !is_dns_label(part) {
            return Err(networks_error(
                item,
                format!(
                    "{part:?} is not a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit)"
                ),
            ));
        }
    }
    if name.is_empty() {
        return Err(networks_error(item, "names no network attachment"));
    }
    if let Some(interface) = interface
        && (interface.len() > MAX_INTERFACE
            || interface.contains(|c: char| c == '/' || c.is_ascii_whitespace()))
    {
        return Err(networks_error(
            item,
            format!(
                "interface {interface:?} must be at most {MAX_INTERFACE} bytes, without '/' or spaces"
            ),
        ));
    }
    Ok(Attachment {
        namespace: if namespace.is_empty() {
            pod_namespace
        } else {
            namespace
        }
        .to_string(),
        name: name.to_string(),
        interface: interface.filter(|i| !i.is_empty()).map(str::to_string),
        ips: Vec::new(),
        fields: Map::new(),
    })
}

fn parse_json_form(value: &str, pod_namespace: &str) -> Result<Vec<Attachment>, AnnotationError> {
    let elements: Vec<Map<String, Value>> = serde_json::from_str(value)
        .map_err(|_| networks_error(value, "is not a JSON list of network selection objects"))?;
    elements
        .into_iter()
        .map(|fields| parse_json_element(fields, value, pod_namespace))
        .collect()
}

fn string_field<'a>(
    fields: &'a Map<String, Value>,
    key: &str,
    whole: &str,
) -> Result<Option<&'a str>, AnnotationError> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(networks_error(whole, format!("{key:?} is not a string"))),
    }
}

fn parse_json_element(
    fields: Map<String, Value>,
    whole: &str,
    pod_namespace: &str,
) -> Result<Attachment, AnnotationError> {
    let name = string_field(&fields, "name", whole)?.unwrap_or("");
    if name.is_empty() {
        return Err(networks_error(
            whole,
            "an element names no network attachment",
        ));
    }
    let namespace = string_field(&fields, "namespace", whole)?
        .filter(|n| !n.is_empty())
        .unwrap_or(pod_namespace);
    // `interfaceRequest` is the name before Multus 3.2, read when `interface` is not given
    let interface = string_field(&fields, "interface", whole)?
        .filter(|i| !i.is_empty())
        .or(string_field(&fields, "interfaceRequest", whole)?.filter(|i| !i.is_empty()));
    if let Some(mac) = string_field(&fields, "mac", whole)?.filter(|m| !m.is_empty())
        && !is_mac(mac)
    {
        return Err(networks_error(
            whole,
            format!("mac {mac:?} is not a MAC address"),
        ));
    }
    let ips = match fields.get("ips") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(text) => parse_ip_request(text, whole),
                _ => Err(networks_error(
                    whole,
                    "\"ips\" holds a value that is not a string",
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(networks_error(whole, "\"ips\" is not a list")),
    };
    Ok(Attachment {
        namespace: namespace.to_string(),
        name: name.to_string(),
        interface: interface.map(str::to_string),
        ips,
        fields,
    })
}

/// An IP (`net.ParseIP`) or a CIDR (`net.ParseCIDR`, the host's bits kept) of `ips`.
fn parse_ip_request(text: &str, whole: &str) -> Result<(IpAddr, Option<u8>), AnnotationError> {
    let not_one = || {
        networks_error(
            whole,
            format!("ips: {text:?} is not an IP address or a CIDR"),
        )
    };
    match text.split_once('/') {
        None => text
            .parse::<IpAddr>()
            .map(|ip| (ip.to_canonical(), None))
            .map_err(|_| not_one()),
        Some((ip, prefix)) => {
            let ip: IpAddr = ip.parse().map_err(|_| not_one())?;
            let bits = if ip.is_ipv4() { 32 } else { 128 };
            let prefix: u8 = (prefix.bytes().all(|b| b.is_ascii_digit()) && !prefix.is_empty())
                .then(|| prefix.parse().ok())
                .flatten()
                .filter(|p| *p <= bits)
                .ok_or_else(not_one)?;
            Ok((ip, Some(prefix)))
        }
    }
}

/// A MAC address as Go's `net.ParseMAC` reads one: 6, 8 or 20 bytes, as pairs of hex digits
/// separated by `:` or `-`, or groups of four separated by `.`.
fn is_mac(text: &str) -> bool {
    let sizes = [6, 8, 20];
    let hex = |group: &str, len: usize| {
        group.len() == len && group.bytes().all(|b| b.is_ascii_hexdigit())
    };
    for separator in [':', '-'] {
        let groups: Vec<&str> = text.split(separator).collect();
        if groups.len() > 1 && sizes.contains(&groups.len()) && groups.iter().all(|g| hex(g, 2)) {
            return true;
        }
    }
    let groups: Vec<&str> = text.split('.').collect();
    sizes.contains(&(groups.len() * 2)) && groups.iter().all(|g| hex(g, 4))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of Multus's own test fixtures (network-attachment-definition-client
    /// `pkg/utils/net-attach-def_test.go`): the primary network's entry, then each attachment's.
    #[test]
    fn the_network_status_gives_each_networks_ips() {
        let status = r#"[
            {"name": "k8s-pod-network", "interface": "eth0", "ips": ["10.244.1.5"], "default": true, "dns": {}},
            {"name": "default/storage", "interface": "net1", "ips": ["10.50.0.1", "fd00::1"], "mac": "c2:b0:57:49:47:f1", "dns": {}},
            {"name": "other/storage", "interface": "net2", "ips": ["10.51.0.1/24"]}
        ]"#;
        let ips = |namespace, name| status_ips(status, namespace, name);
        assert_eq!(
            ips("default", "storage"),
            [
                "10.50.0.1".parse::<IpAddr>().unwrap(),
                "fd00::1".parse().unwrap()
            ]
        );
        assert_eq!(
            ips("other", "storage"),
            ["10.51.0.1".parse::<IpAddr>().unwrap()]
        );
        assert!(ips("default", "backup").is_empty());
        assert!(status_ips("not json", "default", "storage").is_empty());
    }

    fn names(value: &str) -> Vec<(String, Option<String>)> {
        parse_networks(value, "default")
            .unwrap()
            .into_iter()
            .map(|a| (a.key(), a.interface))
            .collect()
    }

    fn refusal(value: &str) -> String {
        parse_networks(value, "default").unwrap_err().to_string()
    }

    /// The cases of Multus's own parser tests (`TestParsePodNetworkObjectName`,
    /// `TestParsePodNetworkAnnotation`, as Kube-OVN carries them in
    /// `pkg/util/network_attachment_test.go`).
    #[test]
    fn the_list_form_as_multus_reads_it() {
        assert_eq!(
            names("kube-system/lb-svc-attachment@eth0"),
            [("kube-system/lb-svc-attachment".into(), Some("eth0".into()))]
        );
        assert_eq!(
            names("lb-svc-attachment"),
            [("default/lb-svc-attachment".into(), None)]
        );
        assert_eq!(
            names(" net1 , other-ns/net2@eth9 "),
            [
                ("default/net1".into(), None),
                ("other-ns/net2".into(), Some("eth9".into()))
            ]
        );
        assert!(names("").is_empty());
        assert!(refusal("kube-system/lb-svc-attachment/1").contains("more than one '/'"));
        assert!(refusal("kube-system/lb-svc-attachment@eth0@1").contains("more than one '@'"));
        assert!(refusal("mellanox.com/cx5_sriov_switchdev").contains("not a DNS-1123 label"));
        assert!(refusal("net1,").contains("names no network attachment"));
        assert!(refusal("net1@averyveryverylongname").contains("at most 15 bytes"));
    }

    #[test]
    fn the_json_form_as_multus_reads_it() {
        let value = r#"[{"name":"lb-svc-attachment","namespace":"kube-system","interface":"eth0",
            "mac":"00:0c:29:9a:96:74","ips":["192.168.50.6"],"default-route":["192.168.50.1"]}]"#;
        let parsed = parse_networks(value, "default").unwrap();
        assert_eq!(parsed[0].key(), "kube-system/lb-svc-attachment");
        assert_eq!(parsed[0].interface.as_deref(), Some("eth0"));
        assert_eq!(parsed[0].ips, [("192.168.50.6".parse().unwrap(), None)]);
        let cidr = parse_networks(r#"[{"name":"a","ips":["192.168.50.6/20"]}]"#, "ns").unwrap();
        assert_eq!(cidr[0].ips, [("192.168.50.6".parse().unwrap(), Some(20))]);
        assert_eq!(cidr[0].key(), "ns/a");
        // `interfaceRequest`, the name before Multus 3.2
        let old = parse_networks(r#"[{"name":"a","interfaceRequest":"eth0"}]"#, "ns").unwrap();
        assert_eq!(old[0].interface.as_deref(), Some("eth0"));
        for (value, why) in [
            (r#"{"name":"a"}"#, "not a JSON list"),
            (r#"[{"name":"a","mac":"123"}]"#, "not a MAC address"),
            (
                r#"[{"name":"a","ips":["192.168.6"]}]"#,
                "not an IP address or a CIDR",
            ),
            (
                r#"[{"name":"a","ips":["192.168.6/20"]}]"#,
                "not an IP address or a CIDR",
            ),
            (
                r#"[{"name":"a","ips":["10.0.0.1/33"]}]"#,
                "not an IP address or a CIDR",
            ),
            (r#"[{"name":"a","ips":"10.0.0.1"}]"#, "not a list"),
            (r#"[{"namespace":"x"}]"#, "names no network attachment"),
        ] {
            assert!(refusal(value).contains(why), "{value}: {}", refusal(value));
        }
    }

    #[test]
    fn macs_are_read_as_go_reads_them() {
        for good in [
            "00:00:5e:00:53:01",
            "02:00:5e:10:00:00:00:01",
            "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01",
            "00-00-5E-00-53-01",
            "0000.5e00.5301",
            "0200.5e10.0000.0001",
        ] {
            assert!(is_mac(good), "{good}");
        }
        for bad in [
            "123",
            "00:00:5e:00:53",
            "00:00:5e:00:53:0g",
            "00:00-5e:00:53:01",
            "0000.5e00",
        ] {
            assert!(!is_mac(bad), "{bad}");
        }
    }

    #[test]
    fn writing_back_keeps_every_field_and_sets_the_ips_with_their_prefix() {
        let mut parsed = parse_networks(
            r#"[{"name":"a","mac":"00:00:5e:00:53:01","cni-args":{"x":1}}, {"name":"b","namespace":"o"}]"#,
            "ns",
        )
        .unwrap();
        parsed[0].set_ips(&[
            ("10.1.0.5".parse().unwrap(), 24),
            ("fd00::5".parse().unwrap(), 64),
        ]);
        let written: Value = serde_json::from_str(&write_networks(&parsed)).unwrap();
        assert_eq!(
            written,
            serde_json::json!([
                {"name": "a", "namespace": "ns", "mac": "00:00:5e:00:53:01", "cni-args": {"x": 1},
                 "ips": ["10.1.0.5/24", "fd00::5/64"]},
                {"name": "b", "namespace": "o"},
            ])
        );
        // what is written reads back the same
        let again = parse_networks(&write_networks(&parsed), "elsewhere").unwrap();
        assert_eq!(again[0].key(), "ns/a");
        assert_eq!(again[0].ips, parsed[0].ips);
        // the list form becomes the JSON form with the same attachments
        let mut listed = parse_networks("net1@eth1,o/net2", "ns").unwrap();
        listed[1].set_ips(&[("192.168.9.9".parse().unwrap(), 16)]);
        let written: Value = serde_json::from_str(&write_networks(&listed)).unwrap();
        assert_eq!(
            written,
            serde_json::json!([
                {"name": "net1", "namespace": "ns", "interface": "eth1"},
                {"name": "net2", "namespace": "o", "ips": ["192.168.9.9/16"]},
            ])
        );
    }
}
