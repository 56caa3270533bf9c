//! Multus's pod annotation `k8s.v1.cni.cncf.io/networks`: the secondary networks (network
//! attachments) a pod asks for, read as Multus reads it, written back with the IPs asked of
//! each network's IPAM, and the one reading of the IPs a pod carries on a network.
//!
//! The rules are Multus's (k8snetworkplumbingwg/multus-cni `pkg/k8sclient/k8sclient.go`,
//! `parsePodNetworkAnnotation` and `parsePodNetworkObjectName`):
//! - a value with any of `[`, `{` or `"` is a JSON list of `NetworkSelectionElement` objects,
//!   read by Go's `encoding/json` (`selection`, `super::go_json`): keys match their field
//!   in any case, the last one wins, unknown fields are skipped, and a value of the wrong type
//!   anywhere refuses the whole annotation;
//! - otherwise it is a comma-separated list of `[namespace/]name[@interface]`, each item and
//!   part trimmed, the namespace and name lower-case alphanumerics and `-` (no length limit);
//! - an attachment without a namespace is in the pod's;
//! - an interface name is at most 15 bytes, without `/` or ASCII whitespace (the list form);
//! - each of `ips` is an IP or a CIDR (`10.1.0.5/24`), `mac` and `infiniband-guid` MAC
//!   addresses, as Go's `net.ParseIP`, `net.ParseCIDR` and `net.ParseMAC` read them.
//!
//! The IPs are written in the JSON form's `ips`, as Multus passes them to the attachment's
//! IPAM (the `static` IPAM plugin with `capabilities: {ips: true}`, Whereabouts, Spiderpool),
//! which needs a prefix length: `10.1.0.5/24`. Writing back changes only the elements whose
//! `ips` change; every other byte of the JSON form stays as written.

mod selection;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::ops::Range;

use super::annotations::{AnnotationError, go_parse_ip, parse_ovn_ip_address};
use super::go_json::{GoJson, Kind, Reader};
use ip_webhook_ipam::ipset::excerpt;
use ip_webhook_ledger::network::Network;

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
    /// The IPs asked for by hand (`ips`), each with its prefix length when written as a CIDR
    /// (an IPv4-mapped CIDR's prefix as the IPv4 address's: `::ffff:10.0.0.1/120` is `/24`).
    pub ips: Vec<(IpAddr, Option<u8>)>,
    /// Its place among all the annotation's attachments.
    position: usize,
    /// Where it is in the JSON form (none in the list form).
    source: Option<Source>,
    /// Whether [`Attachment::set_ips`] changed its `ips`, to be written back.
    changed: bool,
}

/// Where an element of the JSON form is: its object, each member, and which name `ips`.
#[derive(Debug, Clone, PartialEq)]
struct Source {
    object: Range<usize>,
    members: Vec<Range<usize>>,
    ips_members: Vec<usize>,
}

impl Attachment {
    /// `namespace/name`: the attachment's identity.
    #[cfg(test)]
    pub(crate) fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether it attaches `network`.
    pub fn attaches(&self, network: &Network) -> bool {
        self.namespace == network.namespace && self.name == network.name
    }

    /// Ask the attachment's IPAM for `ips` (each with its prefix length), in place of any
    /// `ips` it had; `false` when it asked for exactly these already.
    pub fn set_ips(&mut self, ips: &[(IpAddr, u8)]) -> bool {
        let wanted: Vec<(IpAddr, Option<u8>)> = ips
            .iter()
            .map(|(ip, prefix)| (*ip, Some(*prefix)))
            .collect();
        if wanted == self.ips {
            return false;
        }
        self.ips = wanted;
        self.changed = true;
        true
    }

    /// Its `ips` member as JSON, or none when it asks for none.
    fn ips_json(&self) -> Option<String> {
        if self.ips.is_empty() {
            return None;
        }
        let ips: Vec<String> = self
            .ips
            .iter()
            .map(|(ip, prefix)| match prefix {
                Some(prefix) => format!("\"{ip}/{prefix}\""),
                None => format!("\"{ip}\""),
            })
            .collect();
        Some(format!("\"ips\":[{}]", ips.join(",")))
    }
}

/// The attachments of a `k8s.v1.cni.cncf.io/networks` value, in order; none for an empty one.
pub fn parse_networks(
    value: &str,
    pod_namespace: &str,
) -> Result<Vec<Attachment>, AnnotationError> {
    read_networks(value, pod_namespace, |_| true)
}

/// The attachments of `value` that `keep` wants, in order, the whole value checked as Multus
/// checks it. Only the kept ones are held, so a large value costs its reading, not its size.
pub fn read_networks(
    value: &str,
    pod_namespace: &str,
    mut keep: impl FnMut(&Attachment) -> bool,
) -> Result<Vec<Attachment>, AnnotationError> {
    let mut kept = Vec::new();
    if value.is_empty() {
        return Ok(kept);
    }
    if is_json_form(value) {
        read_json_form(value, pod_namespace, &mut |a| {
            if keep(&a) {
                kept.push(a)
            }
        })
        .map_err(|error| networks_error(value, error.to_string()))?;
        return Ok(kept);
    }
    for (position, item) in value.split(',').enumerate() {
        let attachment = parse_list_item(item.trim(), pod_namespace, position)?;
        if keep(&attachment) {
            kept.push(attachment);
        }
    }
    Ok(kept)
}

/// Multus's test for the JSON form.
fn is_json_form(value: &str) -> bool {
    value.contains(['[', '{', '"'])
}

/// `value` with the `ips` of each of `attachments` (read from it) that
/// [`Attachment::set_ips`] changed: in the JSON form those elements are rewritten, every other
/// byte kept; the list form becomes the JSON form, which alone carries `ips`.
pub fn write_networks(value: &str, pod_namespace: &str, attachments: &[Attachment]) -> String {
    if !is_json_form(value) {
        return list_as_json(value, pod_namespace, attachments);
    }
    let mut out = String::with_capacity(value.len() + 64 * attachments.len());
    let mut done = 0;
    for attachment in attachments.iter().filter(|a| a.changed) {
        let Some(source) = &attachment.source else {
            continue;
        };
        out.push_str(&value[done..source.object.start]);
        let members = source
            .members
            .iter()
            .enumerate()
            .filter(|(i, _)| !source.ips_members.contains(i))
            .map(|(_, span)| value[span.clone()].to_string())
            .chain(attachment.ips_json());
        out.push('{');
        out.push_str(&members.collect::<Vec<_>>().join(","));
        out.push('}');
        done = source.object.end;
    }
    out.push_str(&value[done..]);
    out
}

/// The list form `value` as the JSON form, with the `ips` of `attachments`.
fn list_as_json(value: &str, pod_namespace: &str, attachments: &[Attachment]) -> String {
    let text = |s: &str| serde_json::Value::from(s).to_string();
    let mut elements = Vec::new();
    for (position, item) in value.split(',').enumerate() {
        let Ok(parsed) = parse_list_item(item.trim(), pod_namespace, position) else {
            continue;
        };
        let attachment = attachments
            .iter()
            .find(|a| a.position == position)
            .unwrap_or(&parsed);
        let mut members = vec![
            format!("\"name\":{}", text(&attachment.name)),
            format!("\"namespace\":{}", text(&attachment.namespace)),
        ];
        if let Some(interface) = &attachment.interface {
            members.push(format!("\"interface\":{}", text(interface)));
        }
        members.extend(attachment.ips_json());
        elements.push(format!("{{{}}}", members.join(",")));
    }
    format!("[{}]", elements.join(","))
}

/// The annotation Multus writes once a pod's interfaces are up: one entry per interface, its
/// network named `namespace/name` and the IPs it got (k8snetworkplumbingwg
/// network-attachment-definition-client `pkg/apis/k8s.cni.cncf.io/v1/types.go`,
/// `NetworkStatusAnnot` and `NetworkStatus`).
pub const NETWORK_STATUS: &str = "k8s.v1.cni.cncf.io/network-status";

/// The IPs a `k8s.v1.cni.cncf.io/network-status` value says the network `namespace/name` gave
/// the pod; none for a value that cannot be read.
pub fn status_ips(value: &str, namespace: &str, name: &str) -> Vec<IpAddr> {
    let Ok(serde_json::Value::Array(entries)) = serde_json::from_str(value) else {
        return Vec::new();
    };
    let network = format!("{namespace}/{name}");
    entries
        .iter()
        .filter(|entry| entry["name"].as_str() == Some(network.as_str()))
        .flat_map(|entry| entry["ips"].as_array().into_iter().flatten())
        .filter_map(|ip| go_parse_ip(ip.as_str()?.split('/').next()?))
        .collect()
}

/// Kube-OVN's annotations of the IP of an attachment of `network`, one per kind of
/// attachment, as its controller names them (kubeovn/kube-ovn `pkg/controller/pod.go`,
/// `getPodAttachmentNet`; `pkg/util/const.go`, `IPAddressAnnotationTemplate`,
/// `%s.kubernetes.io/ip_address` of the provider): `NAME.NAMESPACE.ovn` for an attachment of
/// Kube-OVN's own CNI, and `NAME.NAMESPACE` for an IPAM-only one (another CNI, such as macvlan,
/// with `ipam.type: kube-ovn`).
pub fn kube_ovn_ip_annotations(network: &Network) -> [String; 2] {
    let provider = format!("{}.{}", network.name, network.namespace);
    [
        format!("{provider}.ovn.kubernetes.io/ip_address"),
        format!("{provider}.kubernetes.io/ip_address"),
    ]
}

type Annotations = BTreeMap<String, String>;

/// The IPs of Kube-OVN's annotations of an attachment of `network` (an empty value is no
/// value), each read as Kube-OVN reads its primary `ovn.kubernetes.io/ip_address`, or the
/// first that cannot be read.
pub fn kube_ovn_ips(
    annotations: Option<&Annotations>,
    network: &Network,
) -> Result<Vec<IpAddr>, AnnotationError> {
    let mut ips = Vec::new();
    for key in kube_ovn_ip_annotations(network) {
        let Some(value) = annotations
            .and_then(|a| a.get(&key))
            .filter(|v| !v.is_empty())
        else {
            continue;
        };
        let read = parse_ovn_ip_address(value).map_err(|error| AnnotationError::Attachment {
            key: key.clone(),
            error: Box::new(error),
        })?;
        ips.extend(read);
    }
    Ok(ips)
}

/// The IPs a pod carries on `network`, the one reading of them that admission, DELETE, the
/// watches and the holder lookup share: the `ips` of its attachments of `network` (read from
/// `attachments`), and when it attaches `network`, the IPs of Kube-OVN's annotations for it
/// ([`kube_ovn_ips`]; one that cannot be read names none here, and is refused at admission).
/// Each IP once.
pub fn carried_on(
    attachments: &[Attachment],
    annotations: Option<&Annotations>,
    network: &Network,
) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = Vec::new();
    let mut attached = false;
    for attachment in attachments.iter().filter(|a| a.attaches(network)) {
        attached = true;
        ips.extend(attachment.ips.iter().map(|(ip, _)| *ip));
    }
    if attached {
        for key in kube_ovn_ip_annotations(network) {
            let value = annotations.and_then(|a| a.get(&key));
            if let Some(Ok(read)) = value
                .filter(|v| !v.is_empty())
                .map(|v| parse_ovn_ip_address(v))
            {
                ips.extend(read);
            }
        }
    }
    let mut seen = std::collections::HashSet::with_capacity(ips.len());
    ips.retain(|ip| seen.insert(*ip));
    ips
}

/// The IPs a pod carries on each of `networks` ([`carried_on`]), its networks annotation read
/// for those networks alone; `None` when the annotation cannot be read (a pod Multus refuses
/// carries nothing on its networks).
pub fn pod_network_ips<'n>(
    annotations: Option<&Annotations>,
    pod_namespace: &str,
    networks: impl IntoIterator<Item = &'n Network>,
) -> Option<Vec<(Network, Vec<IpAddr>)>> {
    let networks: Vec<&Network> = networks.into_iter().collect();
    let value = annotations.and_then(|a| a.get(NETWORKS)).map_or("", |v| v);
    let attachments = read_networks(value, pod_namespace, |a| {
        networks.iter().any(|n| a.attaches(n))
    })
    .ok()?;
    Some(
        networks
            .into_iter()
            .map(|n| (n.clone(), carried_on(&attachments, annotations, n)))
            .collect(),
    )
}

fn networks_error(value: &str, reason: impl Into<String>) -> AnnotationError {
    AnnotationError::Networks {
        value: excerpt(value),
        reason: reason.into(),
    }
}

/// A name or namespace of the list form as Multus checks it: `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`,
/// with no length limit (`parsePodNetworkObjectName`).
fn is_multus_name(part: &str) -> bool {
    let bytes = part.as_bytes();
    !bytes.is_empty()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// Go's `strings.ContainsAny(name, " \t\n\v\f\r/")`: what an interface name may not hold.
fn bad_interface_byte(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b'/')
}

/// One item of the list form: `[namespace/]name[@interface]`.
fn parse_list_item(
    item: &str,
    pod_namespace: &str,
    position: usize,
) -> Result<Attachment, AnnotationError> {
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
        if !part.is_empty() && !is_multus_name(part) {
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
        && (interface.len() > MAX_INTERFACE || interface.bytes().any(bad_interface_byte))
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
        position,
        source: None,
        changed: false,
    })
}

/// The JSON form, each element handed to `each` as Multus reads it.
fn read_json_form(
    value: &str,
    pod_namespace: &str,
    each: &mut dyn FnMut(Attachment),
) -> GoJson<()> {
    let mut reader = Reader::new(value);
    match reader.peek()? {
        Kind::Array => {}
        other => {
            return reader.error(format!(
                "is {}, not a JSON list of network selection objects",
                other.name()
            ));
        }
    }
    let mut position = 0;
    reader.array(|reader| {
        match reader.peek()? {
            Kind::Object => {}
            Kind::Null => return reader.error("an element is null, which Multus cannot read"),
            other => {
                return reader.error(format!(
                    "an element is {}, not a network selection object",
                    other.name()
                ));
            }
        }
        let element = selection::read(reader)?;
        each(attachment_of(element, pod_namespace, position)?);
        position += 1;
        Ok(())
    })?;
    reader.end()
}

/// An element of the JSON form as `parsePodNetworkAnnotation` checks and completes it.
fn attachment_of(
    element: selection::Selection<'_>,
    pod_namespace: &str,
    position: usize,
) -> GoJson<Attachment> {
    let refuse = |what: String| {
        Err(super::go_json::GoJsonError {
            at: element.span.start,
            what,
        })
    };
    if element.name.is_empty() {
        return refuse("an element names no network attachment".into());
    }
    for (field, text) in [
        ("mac", &element.mac),
        ("infiniband-guid", &element.infiniband_guid),
    ] {
        if !text.is_empty() && !is_mac(text) {
            return refuse(format!(
                "{field} {text:?} is not a MAC address (Go's net.ParseMAC)"
            ));
        }
    }
    let mut ips = Vec::with_capacity(element.ips().len());
    for text in element.ips() {
        match parse_ip_request(text) {
            Some(ip) => ips.push(ip),
            None => return refuse(format!("ips: {text:?} is not an IP address or a CIDR")),
        }
    }
    let interface = [&element.interface, &element.deprecated_interface]
        .into_iter()
        .find(|i| !i.is_empty())
        .map(|i| i.to_string());
    Ok(Attachment {
        namespace: match element.namespace.is_empty() {
            true => pod_namespace.to_string(),
            false => element.namespace.into_owned(),
        },
        name: element.name.into_owned(),
        interface,
        ips,
        position,
        source: Some(Source {
            object: element.span,
            members: element.members,
            ips_members: element.ips_members,
        }),
        changed: false,
    })
}

/// An IP (`net.ParseIP`) or, with a `/`, a CIDR (`net.ParseCIDR`, the host's bits kept) of
/// `ips`. An IPv4-mapped address is the IPv4 address, as the `static` IPAM configures it; its
/// prefix counts in 128 bits, so the IPv4 address's is 96 less (`::ffff:10.0.0.1/120` is
/// `10.0.0.1/24`, and `/24` there is `/0`).
pub(crate) fn parse_ip_request(text: &str) -> Option<(IpAddr, Option<u8>)> {
    let Some((ip, prefix)) = text.split_once('/') else {
        return go_parse_ip(text).map(|ip| (ip, None));
    };
    let written: IpAddr = ip.parse().ok()?;
    let bits = if written.is_ipv4() { 32 } else { 128 };
    // `dtoi`: decimal digits only, leading zeros allowed
    let prefix: u32 = match prefix.bytes().all(|b| b.is_ascii_digit()) && !prefix.is_empty() {
        true => prefix.parse().ok().filter(|p| *p <= bits)?,
        false => return None,
    };
    let ip = written.to_canonical();
    let prefix = match (written, ip) {
        (IpAddr::V6(_), IpAddr::V4(_)) => prefix.saturating_sub(96),
        _ => prefix,
    };
    Some((ip, Some(prefix as u8)))
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
    use serde_json::Value;

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
        assert!(refusal("net1@et\u{b}h0").contains("without '/' or spaces"));
        // Multus's pattern has no length limit
        let long = "n".repeat(70);
        assert_eq!(names(&long), [(format!("default/{long}"), None)]);
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
    fn writing_back_rewrites_only_what_changed_and_sets_the_ips_with_their_prefix() {
        let value = r#"[{"name":"a","mac":"00:00:5e:00:53:01", "cni-args":{"x":1}} , {"name":"b","namespace":"o"}]"#;
        let mut parsed = parse_networks(value, "ns").unwrap();
        assert!(parsed[0].set_ips(&[
            ("10.1.0.5".parse().unwrap(), 24),
            ("fd00::5".parse().unwrap(), 64),
        ]));
        let written = write_networks(value, "ns", &parsed);
        assert_eq!(
            written,
            r#"[{"name":"a","mac":"00:00:5e:00:53:01","cni-args":{"x":1},"ips":["10.1.0.5/24","fd00::5/64"]} , {"name":"b","namespace":"o"}]"#
        );
        // what is written reads back the same, and asking again changes nothing
        let mut again = parse_networks(&written, "elsewhere").unwrap();
        assert_eq!(again[0].key(), "elsewhere/a");
        assert_eq!(again[0].ips, parsed[0].ips);
        assert!(!again[0].set_ips(&[
            ("10.1.0.5".parse().unwrap(), 24),
            ("fd00::5".parse().unwrap(), 64),
        ]));
        assert_eq!(write_networks(&written, "ns", &again), written);
        // every key Go reads as `ips` goes, in whatever case, and the new one is the last
        let value = r#"[{"IPS":["10.9.9.9/8"],"name":"a","ips":null,"iPs":["10.8.8.8/8"]}]"#;
        let mut parsed = parse_networks(value, "ns").unwrap();
        assert_eq!(parsed[0].ips, [("10.8.8.8".parse().unwrap(), Some(8))]);
        parsed[0].set_ips(&[("10.1.0.5".parse().unwrap(), 24)]);
        assert_eq!(
            write_networks(value, "ns", &parsed),
            r#"[{"name":"a","ips":["10.1.0.5/24"]}]"#
        );
        // the list form becomes the JSON form with the same attachments
        let mut listed = parse_networks("net1@eth1,o/net2", "ns").unwrap();
        listed[1].set_ips(&[("192.168.9.9".parse().unwrap(), 16)]);
        let written: Value =
            serde_json::from_str(&write_networks("net1@eth1,o/net2", "ns", &listed)).unwrap();
        assert_eq!(
            written,
            serde_json::json!([
                {"name": "net1", "namespace": "ns", "interface": "eth1"},
                {"name": "net2", "namespace": "o", "ips": ["192.168.9.9/16"]},
            ])
        );
        // only the kept attachments are held; the others are written back as they were
        let value = r#"[{"name":"x"},{"name":"a"},{"name":"y","bandwidth":{"ingressRate":1}}]"#;
        let mut kept = read_networks(value, "ns", |a| a.name == "a").unwrap();
        assert_eq!(kept.len(), 1);
        kept[0].set_ips(&[("10.1.0.5".parse().unwrap(), 24)]);
        assert_eq!(
            write_networks(value, "ns", &kept),
            r#"[{"name":"x"},{"name":"a","ips":["10.1.0.5/24"]},{"name":"y","bandwidth":{"ingressRate":1}}]"#
        );
    }

    /// Go's `encoding/json` matches keys to `NetworkSelectionElement`'s fields in any case
    /// and keeps the last; Multus attaches what it reads.
    #[test]
    fn keys_are_read_as_go_reads_them() {
        let one = |value: &str| parse_networks(value, "default").unwrap().remove(0);
        let read = one(r#"[{"name":"unmanaged","Name":"storage","ips":["10.50.0.1/24"]}]"#);
        assert_eq!(read.key(), "default/storage");
        let read = one(r#"[{"name":"storage","NAMESPACE":"other","Namespace":"kube-system"}]"#);
        assert_eq!(read.key(), "kube-system/storage");
        let read = one(r#"[{"name":"storage","IPS":["10.50.0.2/24"]}]"#);
        assert_eq!(read.ips, [("10.50.0.2".parse().unwrap(), Some(24))]);
        // escapes in keys, the long s Go folds to `s`, a `null` that leaves a string alone
        let read = one(r#"[{"name":"storage","ipſ":["10.50.0.3/24"],"name":null}]"#);
        assert_eq!(read.key(), "default/storage");
        assert_eq!(read.ips, [("10.50.0.3".parse().unwrap(), Some(24))]);
        // `null` empties a list; an unknown field is skipped whatever it holds
        let read = one(r#"[{"name":"storage","ips":["10.50.0.3/24"],"IPs":null,"x":[1e999]}]"#);
        assert!(read.ips.is_empty());
        // a later list is decoded in place: its `null` item keeps what the slice held there,
        // until `[]` or `null` gives a new slice (Go's `decodeState.array`)
        let read = one(r#"[{"name":"s","ips":["fd00::2"],"IPS":[null,"10.50.0.4/24"]}]"#);
        let held: Vec<_> = ["fd00::2", "10.50.0.4"]
            .map(|ip| ip.parse().unwrap())
            .into();
        assert_eq!(read.ips, [(held[0], None), (held[1], Some(24))]);
        let read = one(
            r#"[{"name":"s","ips":["fd00::1","fd00::2"],"ips":["fd00::3"],"ips":[null,null]}]"#,
        );
        let held: Vec<_> = ["fd00::3", "fd00::2"].map(|ip| ip.parse().unwrap()).into();
        assert_eq!(read.ips, [(held[0], None), (held[1], None)]);
        for fresh in ["[]", "null"] {
            let value = format!(r#"[{{"name":"s","ips":["fd00::1"],"ips":{fresh},"ips":[null]}}]"#);
            let refused = parse_networks(&value, "default").unwrap_err().to_string();
            assert!(refused.contains(r#""" is not an IP"#), "{value}: {refused}");
        }
        // the interface, and the field of Multus before 3.2 when it is not given
        let read = one(r#"[{"name":"s","interfaceRequest":"eth9","Interface":""}]"#);
        assert_eq!(read.interface.as_deref(), Some("eth9"));
    }

    #[test]
    fn an_ipv4_mapped_ip_is_the_ipv4_address() {
        let ips = |value: &str| parse_networks(value, "default").unwrap().remove(0).ips;
        let v4 = "10.50.0.1".parse::<IpAddr>().unwrap();
        assert_eq!(
            ips(r#"[{"name":"s","ips":["::ffff:10.50.0.1/24"]}]"#),
            [(v4, Some(0))]
        );
        assert_eq!(
            ips(r#"[{"name":"s","ips":["::ffff:10.50.0.1/120"]}]"#),
            [(v4, Some(24))]
        );
        assert_eq!(
            ips(r#"[{"name":"s","ips":["::ffff:10.50.0.1"]}]"#),
            [(v4, None)]
        );
        assert_eq!(
            ips(r#"[{"name":"s","ips":["10.50.0.1/024"]}]"#),
            [(v4, Some(24))]
        );
        assert_eq!(
            status_ips(r#"[{"name":"d/s","ips":["::ffff:10.50.0.1"]}]"#, "d", "s"),
            [v4]
        );
    }

    /// Every field Multus's parser (or Go's `Unmarshal` before it) refuses is refused here:
    /// Multus would never start the pod.
    #[test]
    fn what_multus_refuses_is_refused() {
        for (value, why) in [
            (
                r#"[{"name":"net1","infiniband-guid":"not-a-guid"}]"#,
                "infiniband-guid",
            ),
            (
                r#"[{"name":"net1","mac":"00:00:5e:00:53"}]"#,
                "not a MAC address",
            ),
            (
                r#"[{"name":"net1","ips":[" 10.0.0.1/24"]}]"#,
                "not an IP address or a CIDR",
            ),
            (
                r#"[{"name":"net1","ips":["10.0.0.1/24 "]}]"#,
                "not an IP address or a CIDR",
            ),
            (
                r#"[{"name":"net1","ips":["fe80::1%eth0"]}]"#,
                "not an IP address or a CIDR",
            ),
            (
                r#"[{"name":"net1","ips":[null]}]"#,
                "not an IP address or a CIDR",
            ),
            (
                r#"[{"name":"net1","ips":[""]}]"#,
                "not an IP address or a CIDR",
            ),
            (r#"[{"name":"net1","ips":[1]}]"#, "not a string"),
            (r#"[{"name":"net1","IPS":"10.0.0.1"}]"#, "not a list"),
            (r#"[{"name":5}]"#, "not a string"),
            (r#"[{"name":"net1","namespace":true}]"#, "not a string"),
            (r#"[{"name":"net1","interface":{}}]"#, "not a string"),
            (r#"[{"name":"net1","deviceID":1}]"#, "not a string"),
            (
                r#"[{"name":"net1","portMappings":[{"hostPort":"80"}]}]"#,
                "not an integer",
            ),
            (
                r#"[{"name":"net1","portMappings":[{"hostPort":80.5}]}]"#,
                "not an integer",
            ),
            (r#"[{"name":"net1","portMappings":{}}]"#, "not a list"),
            (
                r#"[{"name":"net1","bandwidth":{"egressRate":1e3}}]"#,
                "not an integer",
            ),
            (r#"[{"name":"net1","bandwidth":[]}]"#, "not an object"),
            (r#"[{"name":"net1","cni-args":[]}]"#, "not an object"),
            (r#"[{"name":"net1","cni-args":{"a":1e400}}]"#, "float64"),
            (
                r#"[{"name":"net1","default-route":["10.0.0.300"]}]"#,
                "not an IP address",
            ),
            (
                r#"[{"name":"net1","default-route":"10.0.0.1"}]"#,
                "not a list",
            ),
            (r#"[null]"#, "null"),
            (r#"[1]"#, "not a network selection object"),
            (r#"[{"name":"net1"},]"#, "cannot start a value"),
            (r#"[{"name":"net1"}] x"#, "more text"),
            (r#"[{"name":"net1" "x":1}]"#, "expected"),
        ] {
            let refused = parse_networks(value, "default").unwrap_err().to_string();
            assert!(refused.contains(why), "{value}: {refused}");
        }
        // and what Go reads without complaint is read
        for fine in [
            r#"[{"name":"net1","portMappings":[null,{"hostPort":-0,"protocol":null}],"bandwidth":null}]"#,
            r#"[{"name":"net1","default-route":["",null,"::ffff:1.2.3.4"],"cni-args":{"a":[{}]}}]"#,
            r#"[]"#,
            "\n[ {\"name\" : \"net1\"} ]\t",
        ] {
            assert!(parse_networks(fine, "default").is_ok(), "{fine}");
        }
    }

    #[test]
    fn kube_ovn_attachment_annotations_are_carried_on_an_attached_network() {
        let network = Network::parse("default/storage").unwrap();
        let annotations: Annotations = [
            (NETWORKS, "storage@net1"),
            ("storage.default.ovn.kubernetes.io/ip_address", "10.50.1.7"),
            (
                "storage.default.kubernetes.io/ip_address",
                "::ffff:10.50.1.8,fd00::8",
            ),
            ("backup.default.ovn.kubernetes.io/ip_address", "10.50.1.9"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let read = pod_network_ips(
            Some(&annotations),
            "default",
            [&network, &Network::parse("default/backup").unwrap()],
        )
        .unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(read[0].1, [ip("10.50.1.7"), ip("10.50.1.8"), ip("fd00::8")]);
        assert!(read[1].1.is_empty(), "backup is not attached: {read:?}");
        let mut bad = annotations.clone();
        bad.insert(
            "storage.default.kubernetes.io/ip_address".into(),
            " 10.50.1.8".into(),
        );
        let refused = kube_ovn_ips(Some(&bad), &network).unwrap_err().to_string();
        assert!(
            refused.contains("storage.default.kubernetes.io/ip_address"),
            "{refused}"
        );
        // what can be read still counts for the holder
        let read = pod_network_ips(Some(&bad), "default", [&network]).unwrap();
        assert_eq!(read[0].1, [ip("10.50.1.7")]);
    }
}
