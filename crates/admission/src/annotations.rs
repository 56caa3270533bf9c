//! The public names ip-webhook reads and writes, and the CNI annotations' formats.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::str::FromStr;

use ip_webhook_ipam::ipset::{Family, excerpt};

pub const ALLOCATABLE_IPS: &str = "ip-webhook.io/allocatable-ips";
pub const IP_POOL: &str = "ip-webhook.io/ip-pool";
pub(crate) const FIXED_IP_LABEL: &str = "ip-webhook.io/fixed-ip";
pub const ALLOCATED_IP_LABEL: &str = "ip-webhook.io/allocated-ip";
pub const STATUS: &str = "ip-webhook.io/status";
pub const STATUS_MUTATED: &str = "mutated";
/// The claim token ip-webhook writes on a pod it gave IPs to: the claim's identity until the
/// pod's UID is known ([`ip_webhook_ledger::claim`]).
pub const CLAIM_TOKEN: &str = "ip-webhook.io/claim";
pub(crate) const CALICO_IP_ADDRS: &str = "cni.projectcalico.org/ipAddrs";
/// Calico's IP annotation that bypasses its IPAM (behind its `ip_addrs_no_ipam` feature):
/// the CNI sets the IPs as written, so they are checked and recorded like `ipAddrs`.
pub(crate) const CALICO_IP_ADDRS_NO_IPAM: &str = "cni.projectcalico.org/ipAddrsNoIpam";
pub(crate) const OVN_IP_ADDRESS: &str = "ovn.kubernetes.io/ip_address";
/// Kube-OVN's per-workload list of static IPs (or the name of a Kube-OVN IPPool).
pub const OVN_IP_POOL: &str = "ovn.kubernetes.io/ip_pool";

/// Which CNI's annotation carries the IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cni {
    #[default]
    Calico,
    KubeOvn,
}

/// A pod annotation that names its IPs to a CNI: its key, the CNI that reads it, and how that
/// CNI parses it.
#[derive(Debug, Clone, Copy)]
pub struct IpAnnotation {
    pub key: &'static str,
    pub cni: Cni,
    pub parse: fn(&str) -> Result<Vec<IpAddr>, AnnotationError>,
}

/// Why an IP annotation cannot be read as its CNI reads it. Values are quoted shortened
/// (`excerpt`), so a huge value gives a short message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    #[error("{value:?} is not a JSON array of IP strings (example: [\"10.0.0.10\"])")]
    NotJsonArray { value: String },
    #[error(
        "{value:?} has spaces around {ip}: the CNI reads each IP exactly as written (Go's net.ParseIP, no trimming), so the pod's network could never be set up; write the IP without spaces"
    )]
    Spaces { value: String, ip: String },
    #[error("{item:?} is not an IP address")]
    NotAnIp { item: String },
    #[error(
        "{value:?} has two {family} addresses ({first} and {second}); a pod gets at most one per family"
    )]
    TwoOfFamily {
        value: String,
        family: &'static str,
        first: IpAddr,
        second: IpAddr,
    },
    #[error("{value:?} names no IP")]
    NoIp { value: String },
    #[error("{value:?}: {item:?} is not an IP address")]
    PoolEntry { value: String, item: String },
    #[error(
        "annotations {CALICO_IP_ADDRS} and {CALICO_IP_ADDRS_NO_IPAM} are both set; Calico refuses a pod with both, so it could never start: keep one"
    )]
    BothCalico,
    /// Multus's `k8s.v1.cni.cncf.io/networks` as Multus would refuse it
    /// ([`super::networks`]).
    #[error("k8s.v1.cni.cncf.io/networks {value:?}: {reason}")]
    Networks { value: String, reason: String },
    /// Kube-OVN's annotation of an attachment's IP
    /// (`super::networks::kube_ovn_ip_annotations`) that does not parse.
    #[error("annotation {key}: {error}")]
    Attachment {
        key: String,
        error: Box<AnnotationError>,
    },
    /// An annotation of [`IP_ANNOTATIONS`] that does not parse.
    #[error("annotation {key}: {error}")]
    Annotation {
        key: &'static str,
        error: Box<AnnotationError>,
    },
}

/// Every IP annotation ip-webhook reads, checks and keeps unchanged on a pod that holds a
/// claim, whatever `--cni` says (a pod may carry another CNI's annotation by hand). A new
/// CNI's annotation is one more entry here.
pub const IP_ANNOTATIONS: [IpAnnotation; 3] = [
    IpAnnotation {
        key: CALICO_IP_ADDRS,
        cni: Cni::Calico,
        parse: parse_calico_ip_addrs,
    },
    IpAnnotation {
        key: CALICO_IP_ADDRS_NO_IPAM,
        cni: Cni::Calico,
        parse: parse_calico_ip_addrs,
    },
    IpAnnotation {
        key: OVN_IP_ADDRESS,
        cni: Cni::KubeOvn,
        parse: parse_ovn_ip_address,
    },
];

/// What `--cni` chooses, and everything about a CNI the other layers read instead of matching
/// on its name: the name on the command line, the annotation ip-webhook writes (the first
/// entry of [`IP_ANNOTATIONS`] it reads; those entries say how it parses each) and how its
/// value is written, which of the CNI's objects a static IP must fall in, and the objects an
/// in-cluster replica watches (the chart grants each; `tests/chart/rbac.rs` checks it). A new
/// CNI is an entry here and in [`IP_ANNOTATIONS`], plus handlers for object kinds not known
/// yet.
#[derive(Debug, Clone, Copy)]
pub struct CniDescriptor {
    pub(crate) cni: Cni,
    pub name: &'static str,
    pub annotation: &'static str,
    /// How [`Cni::format`] writes IPs into `annotation`.
    pub(crate) format: ListFormat,
    /// Where /validate checks that a static IP can be set up (`webhook::Webhook::cni_check`).
    pub pools: PoolCheck,
    /// The CNI's objects an in-cluster replica watches (`cluster::cni_tasks`).
    pub watches: &'static [CniObject],
}

/// How an annotation writes a list of IPs: `open`, the IPs joined by `separator`, `close`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ListFormat {
    pub(crate) open: &'static str,
    pub(crate) separator: &'static str,
    pub(crate) close: &'static str,
}

/// The CNI's objects a static IP must fall in, as the CNI would set it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolCheck {
    /// Calico `IPPool`s: an IP in none is refused, one in a disabled pool warned about.
    CalicoIpPools,
    /// Kube-OVN `Subnet`s: an IP outside the pod's subnet is refused.
    KubeOvnSubnets,
}

/// A kind of CNI object an in-cluster replica reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CniObject {
    /// Calico `IPPool`s, for [`PoolCheck::CalicoIpPools`].
    CalicoIpPools,
    /// Calico `IPReservation`s: IPs Calico keeps out of its own assignment (and, with
    /// `--calico-reservation`, the one ip-webhook keeps).
    CalicoIpReservations,
    /// Kube-OVN `Subnet`s, for [`PoolCheck::KubeOvnSubnets`].
    KubeOvnSubnets,
    /// Kube-OVN `IP`s: which pod Kube-OVN gave each IP, for the cluster's IP index.
    KubeOvnIps,
    /// Calico `IPAMBlock`s: which pod Calico's IPAM gave each IP, for the cluster's IP index
    /// (read with the pod watch, which then watches only our pods whole).
    CalicoIpamBlocks,
}

impl CniObject {
    /// API group, version, kind and plural.
    pub fn resource(self) -> (&'static str, &'static str, &'static str, &'static str) {
        match self {
            CniObject::CalicoIpPools => ("crd.projectcalico.org", "v1", "IPPool", "ippools"),
            CniObject::CalicoIpReservations => (
                "crd.projectcalico.org",
                "v1",
                "IPReservation",
                "ipreservations",
            ),
            CniObject::KubeOvnSubnets => ("kubeovn.io", "v1", "Subnet", "subnets"),
            CniObject::KubeOvnIps => ("kubeovn.io", "v1", "IP", "ips"),
            CniObject::CalicoIpamBlocks => {
                ("crd.projectcalico.org", "v1", "IPAMBlock", "ipamblocks")
            }
        }
    }
}

/// The CNIs `--cni` can name.
pub const CNIS: [CniDescriptor; 2] = [
    CniDescriptor {
        cni: Cni::Calico,
        name: "calico",
        annotation: CALICO_IP_ADDRS,
        // a JSON array of strings, as parse_calico_ip_addrs reads it
        format: ListFormat {
            open: "[\"",
            separator: "\",\"",
            close: "\"]",
        },
        pools: PoolCheck::CalicoIpPools,
        watches: &[
            CniObject::CalicoIpPools,
            CniObject::CalicoIpReservations,
            CniObject::CalicoIpamBlocks,
        ],
    },
    CniDescriptor {
        cni: Cni::KubeOvn,
        name: "kube-ovn",
        annotation: OVN_IP_ADDRESS,
        // comma-separated, as parse_ovn_ip_address reads it
        format: ListFormat {
            open: "",
            separator: ",",
            close: "",
        },
        pools: PoolCheck::KubeOvnSubnets,
        watches: &[CniObject::KubeOvnIps, CniObject::KubeOvnSubnets],
    },
];

impl Cni {
    /// This CNI's entry of [`CNIS`].
    pub fn descriptor(self) -> &'static CniDescriptor {
        CNIS.iter()
            .find(|d| d.cni == self)
            .expect("every Cni has an entry in CNIS")
    }

    /// The CNI `--cni` names `name`, if any.
    pub fn from_name(name: &str) -> Option<Cni> {
        CNIS.iter().find(|d| d.name == name).map(|d| d.cni)
    }

    /// Its name on the command line (`calico`, `kube-ovn`).
    #[cfg(test)]
    pub(crate) fn name(self) -> &'static str {
        self.descriptor().name
    }

    pub fn annotation(self) -> &'static str {
        self.descriptor().annotation
    }

    /// The annotation value for `ips`: `["10.0.0.10","fd00::a"]` or `10.0.0.10,fd00::a`.
    pub fn format(self, ips: &[IpAddr]) -> String {
        // IPs print without characters JSON would escape
        let ListFormat {
            open,
            separator,
            close,
        } = self.descriptor().format;
        let mut text = String::with_capacity(2 + ips.len() * 42);
        text.push_str(open);
        for (i, ip) in ips.iter().enumerate() {
            if i > 0 {
                text.push_str(separator);
            }
            ip_webhook_ipam::ipset::push_ip(&mut text, ip);
        }
        text.push_str(close);
        text
    }
}

/// Parse `cni.projectcalico.org/ipAddrs` (or `ipAddrsNoIpam`): a JSON array of IP strings, at
/// most one per family, each read as Calico reads it: `json.Unmarshal` into `[]string`, then
/// `net.ParseIP` per item, one IPv4 (`To4() != nil`) and one IPv6 at most
/// (projectcalico/calico `cni-plugin/pkg/k8s/k8s.go`, `validateAndExtractIPs` and
/// `parseIPAddrs`). JSON whitespace between items is fine; inside an item it is not.
///
/// ```
/// use ip_webhook_admission::annotations::parse_calico_ip_addrs;
/// let ips = parse_calico_ip_addrs(r#"["10.0.0.5", "fd00::5"]"#).unwrap();
/// assert_eq!(ips, ["10.0.0.5".parse::<std::net::IpAddr>().unwrap(), "fd00::5".parse().unwrap()]);
/// // Calico takes one IP per family, and an item as written: both are refused.
/// assert!(parse_calico_ip_addrs(r#"["10.0.0.5", "10.0.0.6"]"#).is_err());
/// assert!(parse_calico_ip_addrs(r#"[" 10.0.0.5"]"#).is_err());
/// ```
pub fn parse_calico_ip_addrs(value: &str) -> Result<Vec<IpAddr>, AnnotationError> {
    let items: Vec<String> =
        serde_json::from_str(value).map_err(|_| AnnotationError::NotJsonArray {
            value: excerpt(value),
        })?;
    parse_one_per_family(items.iter().map(String::as_str), value)
}

/// Parse `ovn.kubernetes.io/ip_address`: `10.0.0.10` or `10.0.0.10,fd00::a`, split on `,` with
/// each item given to `net.ParseIP` untrimmed, as the Kube-OVN controller does
/// (kubeovn/kube-ovn `pkg/controller/pod.go`, `acquireStaticAddress`; its webhook's
/// `pkg/util/validator.go`, `ValidatePodNetwork`, does not trim either).
pub fn parse_ovn_ip_address(value: &str) -> Result<Vec<IpAddr>, AnnotationError> {
    parse_one_per_family(value.split(','), value)
}

/// An IP as Go's `net.ParseIP` reads it, which every CNI and Multus use: exactly as written (no
/// trimming, no zone), and an IPv4-mapped IPv6 address (`::ffff:10.0.0.5`) is that IPv4
/// address (`To4()` is non-nil), so it is returned as IPv4: one address has one identity in
/// the ledger, conflicts and labels. `tests/real_readers.rs` holds it to Go's.
pub(crate) fn go_parse_ip(text: &str) -> Option<IpAddr> {
    IpAddr::from_str(text).ok().map(|ip| ip.to_canonical())
}

/// One item of a CNI's list as [`go_parse_ip`] reads it, or why not.
fn parse_cni_ip(item: &str, whole: &str) -> Result<IpAddr, AnnotationError> {
    if let Some(ip) = go_parse_ip(item) {
        return Ok(ip);
    }
    let trimmed = item.trim();
    if trimmed != item && IpAddr::from_str(trimmed).is_ok() {
        return Err(AnnotationError::Spaces {
            value: excerpt(whole),
            ip: trimmed.to_string(),
        });
    }
    Err(AnnotationError::NotAnIp {
        item: excerpt(item),
    })
}

fn parse_one_per_family<'a>(
    items: impl Iterator<Item = &'a str>,
    whole: &str,
) -> Result<Vec<IpAddr>, AnnotationError> {
    let mut ips: Vec<IpAddr> = Vec::new();
    for item in items {
        let ip = parse_cni_ip(item, whole)?;
        if let Some(other) = ips.iter().find(|o| Family::of(o) == Family::of(&ip)) {
            return Err(AnnotationError::TwoOfFamily {
                value: excerpt(whole),
                family: Family::of(&ip).name(),
                first: *other,
                second: ip,
            });
        }
        ips.push(ip);
    }
    if ips.is_empty() {
        return Err(AnnotationError::NoIp {
            value: excerpt(whole),
        });
    }
    Ok(ips)
}

/// The IPs of a Kube-OVN `ovn.kubernetes.io/ip_pool` list, read as the Kube-OVN controller
/// reads it (kubeovn/kube-ovn `pkg/controller/pod.go`, `acquireStaticAddressHelper`): entries
/// split on `;` when there is one (each entry `v4` or `v4,v6`), else on `,`; each entry
/// trimmed. A single entry that is not an IP and has no `,` names an IPPool object instead:
/// `Ok(None)`. The webhook's check (`pkg/util/validator.go`, `ValidatePodNetwork`) trims each
/// address of an entry before `net.ParseIP`, as here. IPv4-mapped forms are IPv4.
pub fn parse_ovn_ip_pool(value: &str) -> Result<Option<Vec<IpAddr>>, AnnotationError> {
    let value_trimmed = value.trim();
    if value_trimmed.is_empty() {
        return Ok(None);
    }
    if !value_trimmed.contains([',', ';']) && IpAddr::from_str(value_trimmed).is_err() {
        return Ok(None);
    }
    let mut ips = Vec::new();
    for entry in value.split(';') {
        for item in entry.split(',') {
            let item = item.trim();
            let ip = IpAddr::from_str(item).map_err(|_| AnnotationError::PoolEntry {
                value: excerpt(value),
                item: excerpt(item),
            })?;
            ips.push(ip.to_canonical());
        }
    }
    ips.sort();
    ips.dedup();
    Ok(Some(ips))
}

/// The static IPs a pod's annotations ask for, with the annotation that asked. An empty value
/// is no value: both CNIs test `== ""` before parsing (Calico's `CmdAddK8s` in
/// `cni-plugin/pkg/k8s/k8s.go`; Kube-OVN's `acquireStaticAddressHelper` in
/// `pkg/controller/pod.go`). Calico refuses a pod that sets both `ipAddrs` and
/// `ipAddrsNoIpam` (its `CmdAddK8s`), so that is refused here too, at admission.
pub fn static_ips(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
) -> Result<Vec<(&'static str, Vec<IpAddr>)>, AnnotationError> {
    let mut out = Vec::new();
    let Some(annotations) = annotations else {
        return Ok(out);
    };
    let set = |key: &str| annotations.get(key).filter(|v| !v.is_empty());
    if set(CALICO_IP_ADDRS).is_some() && set(CALICO_IP_ADDRS_NO_IPAM).is_some() {
        return Err(AnnotationError::BothCalico);
    }
    for annotation in &IP_ANNOTATIONS {
        if let Some(value) = set(annotation.key) {
            let key = annotation.key;
            let ips = (annotation.parse)(value).map_err(|error| AnnotationError::Annotation {
                key,
                error: Box::new(error),
            })?;
            out.push((key, ips));
        }
    }
    Ok(out)
}

/// Every IP a pod carries: its CNI annotations' IPs, and the `allocated-ip` label's IP when
/// no CNI annotation names one (what a pod shows to `/validate`, a DELETE and the watches).
/// Malformed annotations count as carrying nothing (`/validate` refuses them on their own).
pub fn carried_ips(
    labels: Option<&std::collections::BTreeMap<String, String>>,
    annotations: Option<&std::collections::BTreeMap<String, String>>,
) -> Vec<IpAddr> {
    let statics = static_ips(annotations).unwrap_or_default();
    carried_with(&statics, labels)
}

/// The IP the `allocated-ip` label names (IPv4-mapped forms as their IPv4 address).
pub(crate) fn label_ip(
    labels: Option<&std::collections::BTreeMap<String, String>>,
) -> Option<IpAddr> {
    labels
        .and_then(|l| l.get(ALLOCATED_IP_LABEL))
        .and_then(|v| ip_webhook_ipam::ipset::ip_from_label_value(v))
        .map(|ip| ip.to_canonical())
}

/// [`carried_ips`] from annotations already parsed by [`static_ips`].
pub fn carried_with(
    statics: &[(&'static str, Vec<IpAddr>)],
    labels: Option<&std::collections::BTreeMap<String, String>>,
) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = statics
        .iter()
        .flat_map(|(_, ips)| ips.iter().copied())
        .collect();
    if let Some(ip) = label_ip(labels)
        && !ips.iter().any(|held| Family::of(held) == Family::of(&ip))
    {
        ips.push(ip);
    }
    ips.sort();
    ips.dedup();
    ips
}

/// The keys that stay as they are on a pod that holds a claim: what names its IP to a CNI,
/// and ip-webhook's own marks.
pub(crate) const IMMUTABLE_ANNOTATIONS: [&str; IP_ANNOTATIONS.len() + 2] = [
    IP_ANNOTATIONS[0].key,
    IP_ANNOTATIONS[1].key,
    IP_ANNOTATIONS[2].key,
    STATUS,
    CLAIM_TOKEN,
];

/// A pod's labels and annotations, in that order.
pub(crate) type PodMarks<'a> = (
    Option<&'a BTreeMap<String, String>>,
    Option<&'a BTreeMap<String, String>>,
);

/// The first of the claim-holding keys (annotations `IMMUTABLE_ANNOTATIONS`, label
/// [`ALLOCATED_IP_LABEL`]) that an update changes, adds or removes: `(key, old, new)`, with
/// `None` for absent. An IP annotation or the label rewritten to the same IPs (another spelling
/// of one IPv6 address, as the Kube-OVN controller writes it back) is not a change.
pub fn changed_mark<'a>(
    old: PodMarks<'a>,
    new: PodMarks<'a>,
) -> Option<(&'static str, Option<&'a str>, Option<&'a str>)> {
    let get = |map: Option<&'a BTreeMap<String, String>>, key: &str| {
        map.and_then(|m| m.get(key)).map(String::as_str)
    };
    let same_ips = |key: &str, a: &str, b: &str| -> bool {
        let parse = |v: &str| match IP_ANNOTATIONS.iter().find(|a| a.key == key) {
            Some(annotation) => (annotation.parse)(v).ok(),
            None if key == ALLOCATED_IP_LABEL => {
                ip_webhook_ipam::ipset::ip_from_label_value(v).map(|ip| vec![ip.to_canonical()])
            }
            None => None,
        };
        let (mut a, mut b) = match (parse(a), parse(b)) {
            (Some(a), Some(b)) => (a, b),
            _ => return false,
        };
        a.sort();
        b.sort();
        // Kube-OVN's controller writes the annotation back with the IPs it assigned, adding
        // an address of a family the pod did not name in a dual-stack Subnet
        // (kubeovn/kube-ovn `pkg/controller/pod.go`:699-700, `ipStr := util.GetStringIP(v4IP,
        // v6IP)` after `acquireAddress`): the IPs named stay, so that is no change.
        let completed = key == OVN_IP_ADDRESS
            && a.iter().all(|ip| b.contains(ip))
            && b.iter()
                .filter(|ip| !a.contains(ip))
                .all(|added| a.iter().all(|ip| Family::of(ip) != Family::of(added)));
        a == b || completed
    };
    let (old_labels, old_annotations) = old;
    let (new_labels, new_annotations) = new;
    let pairs = IMMUTABLE_ANNOTATIONS
        .iter()
        .map(|key| (*key, get(old_annotations, key), get(new_annotations, key)))
        .chain(std::iter::once((
            ALLOCATED_IP_LABEL,
            get(old_labels, ALLOCATED_IP_LABEL),
            get(new_labels, ALLOCATED_IP_LABEL),
        )));
    for (key, before, after) in pairs {
        let changed = match (before, after) {
            (None, None) => false,
            (Some(a), Some(b)) if a == b => false,
            (Some(a), Some(b)) if key != STATUS && key != CLAIM_TOKEN => !same_ips(key, a, b),
            _ => true,
        };
        if changed {
            return Some((key, before, after));
        }
    }
    None
}

/// The prefix of ip-webhook's own keys.
pub(crate) const KEY_PREFIX: &str = "ip-webhook.io/";

/// The `ip-webhook.io/` annotations read or written on a pod or a pod template.
const KNOWN_ANNOTATIONS: [&str; 4] = [ALLOCATABLE_IPS, IP_POOL, STATUS, CLAIM_TOKEN];

/// The `ip-webhook.io/` labels read or written on a pod or a pod template.
const KNOWN_LABELS: [&str; 2] = [FIXED_IP_LABEL, ALLOCATED_IP_LABEL];

/// At most this many keys get a warning of their own; the rest are counted in one more.
const MAX_KEY_WARNINGS: usize = 5;

/// A key is quoted up to this many bytes (the longest key ip-webhook reads has 30).
const MAX_QUOTED_KEY: usize = 64;

/// One warning per `ip-webhook.io/` label or annotation under `path` (`metadata`,
/// `spec.template.metadata`) that ip-webhook does not read, naming the known key closest to
/// it: nothing reads a mistyped key, so without the warning the pod is admitted as one that
/// asks for nothing.
///
/// Bounded, whatever the object holds: at most `MAX_KEY_WARNINGS` keys are named, then one
/// warning counts the others; a key is quoted to `MAX_QUOTED_KEY` bytes; the closest known
/// key is looked for only for a key that short (an edit distance costs its length times the
/// known key's). The API server keeps at most 4 KiB of warnings per answer, and cuts each to
/// 256 characters past that (k8s.io/apiserver `pkg/endpoints/filters/warning.go`).
pub fn unknown_key_warnings(marks: PodMarks<'_>, path: &str) -> Vec<String> {
    let (labels, annotations) = marks;
    let mut warnings = Vec::new();
    let mut unnamed = 0usize;
    let places = [
        ("labels", labels, &KNOWN_LABELS[..], &KNOWN_ANNOTATIONS[..]),
        (
            "annotations",
            annotations,
            &KNOWN_ANNOTATIONS[..],
            &KNOWN_LABELS[..],
        ),
    ];
    for (place, map, known, other) in places {
        for key in map.into_iter().flat_map(|m| m.keys()) {
            if !key.starts_with(KEY_PREFIX) || known.contains(&key.as_str()) {
                continue;
            }
            if warnings.len() == MAX_KEY_WARNINGS {
                unnamed += 1;
                continue;
            }
            let hint = key_hint(key, place, known, other, path);
            warnings.push(format!(
                "{path}.{place}[{}]: ip-webhook reads no such key and ignores it; {hint}",
                quoted_key(key)
            ));
        }
    }
    if unnamed > 0 {
        warnings.push(format!(
            "{path}: {unnamed} more {KEY_PREFIX} keys that ip-webhook does not read (ignored)"
        ));
    }
    warnings
}

/// `key` quoted, cut to [`MAX_QUOTED_KEY`] bytes (at a character's edge) with its length said.
fn quoted_key(key: &str) -> String {
    if key.len() <= MAX_QUOTED_KEY {
        return format!("{key:?}");
    }
    let mut cut = MAX_QUOTED_KEY;
    while !key.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{:?}… ({} bytes)", &key[..cut], key.len())
}

/// What a key ip-webhook does not read was likely meant to be.
fn key_hint(key: &str, place: &str, known: &[&str], other: &[&str], path: &str) -> String {
    let (article, other_place) = if place == "labels" {
        ("an", "annotation")
    } else {
        ("a", "label")
    };
    if other.contains(&key) {
        return format!("it is read as {article} {other_place}, not from {path}.{place}");
    }
    if key.len() > MAX_QUOTED_KEY {
        return "no key ip-webhook reads is that long".to_string();
    }
    let closest = known
        .iter()
        .chain(other)
        .min_by_key(|k| strsim::levenshtein(key, k))
        .copied()
        .unwrap_or(ALLOCATABLE_IPS);
    if known.contains(&closest) {
        format!("did you mean {closest:?}?")
    } else {
        format!("did you mean the {other_place} {closest:?}?")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks_of(
        labels: &[&str],
        annotations: &[&str],
    ) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        let map = |keys: &[&str]| {
            keys.iter()
                .map(|k| (k.to_string(), String::new()))
                .collect()
        };
        (map(labels), map(annotations))
    }

    #[test]
    fn unknown_keys_are_named_with_the_closest_known_key() {
        let (labels, annotations) = marks_of(
            &[
                "app",
                "ip-webhook.io/fixed-ips",
                "ip-webhook.io/allocatable-ips",
            ],
            &[
                ALLOCATABLE_IPS,
                "ip-webhook.io/allocatable-ip",
                "ip-webhook.io/ippool",
                "ip-webhook.io/allocated-ip",
                "other.io/x",
            ],
        );
        let warnings = unknown_key_warnings(
            (Some(&labels), Some(&annotations)),
            "spec.template.metadata",
        );
        assert_eq!(
            warnings,
            [
                r#"spec.template.metadata.labels["ip-webhook.io/allocatable-ips"]: ip-webhook reads no such key and ignores it; it is read as an annotation, not from spec.template.metadata.labels"#,
                r#"spec.template.metadata.labels["ip-webhook.io/fixed-ips"]: ip-webhook reads no such key and ignores it; did you mean "ip-webhook.io/fixed-ip"?"#,
                r#"spec.template.metadata.annotations["ip-webhook.io/allocatable-ip"]: ip-webhook reads no such key and ignores it; did you mean "ip-webhook.io/allocatable-ips"?"#,
                r#"spec.template.metadata.annotations["ip-webhook.io/allocated-ip"]: ip-webhook reads no such key and ignores it; it is read as a label, not from spec.template.metadata.annotations"#,
                r#"spec.template.metadata.annotations["ip-webhook.io/ippool"]: ip-webhook reads no such key and ignores it; did you mean "ip-webhook.io/ip-pool"?"#,
            ]
        );
        let (labels, annotations) = marks_of(
            &[FIXED_IP_LABEL, ALLOCATED_IP_LABEL],
            &[IP_POOL, STATUS, CLAIM_TOKEN],
        );
        assert!(unknown_key_warnings((Some(&labels), Some(&annotations)), "metadata").is_empty());
        assert!(unknown_key_warnings((None, None), "metadata").is_empty());
    }

    /// However many and however long the keys, the warnings stay few and short: 240,000 keys
    /// give five warnings and a count, a 6 MB key is quoted by its first 64 bytes.
    #[test]
    fn unknown_key_warnings_are_bounded_in_count_and_length() {
        let keys: Vec<String> = (0..240_000)
            .map(|i| format!("ip-webhook.io/x{i}"))
            .collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let (labels, annotations) = marks_of(&[], &refs);
        let warnings = unknown_key_warnings((Some(&labels), Some(&annotations)), "metadata");
        assert_eq!(warnings.len(), MAX_KEY_WARNINGS + 1, "{warnings:?}");
        assert_eq!(
            warnings.last().unwrap(),
            "metadata: 239995 more ip-webhook.io/ keys that ip-webhook does not read (ignored)"
        );
        let long = format!("ip-webhook.io/{}", "é".repeat(3 << 20));
        let (labels, annotations) = marks_of(&[&long], &[]);
        let warnings = unknown_key_warnings((Some(&labels), Some(&annotations)), "metadata");
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].len() < 256, "{} bytes", warnings[0].len());
        assert!(
            warnings[0].contains(&format!("… ({} bytes)", long.len()))
                && warnings[0].contains("no key ip-webhook reads is that long"),
            "{}",
            warnings[0]
        );
    }

    /// One table per extension point: each CNI `--cni` names writes an annotation it reads,
    /// every IP annotation is kept unchanged on a claim holder, and the names round-trip.
    #[test]
    fn the_cni_tables_agree() {
        for descriptor in &CNIS {
            assert_eq!(Cni::from_name(descriptor.name), Some(descriptor.cni));
            assert_eq!(descriptor.cni.name(), descriptor.name);
            let written = IP_ANNOTATIONS
                .iter()
                .find(|a| a.key == descriptor.annotation)
                .expect("the written annotation is read too");
            assert_eq!(written.cni, descriptor.cni);
        }
        assert_eq!(Cni::from_name("cilium"), None);
        for annotation in &IP_ANNOTATIONS {
            assert!(
                IMMUTABLE_ANNOTATIONS.contains(&annotation.key),
                "{}",
                annotation.key
            );
            assert!(CNIS.iter().any(|d| d.cni == annotation.cni));
        }
        assert_eq!(
            Cni::Calico.format(&["10.0.0.10".parse().unwrap()]),
            "[\"10.0.0.10\"]"
        );
        let ips = (IP_ANNOTATIONS[2].parse)("10.0.0.10").unwrap();
        assert_eq!(Cni::KubeOvn.format(&ips), "10.0.0.10");
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn formats_per_cni() {
        let both = ips(&["10.0.0.10", "fd00::a"]);
        assert_eq!(Cni::Calico.format(&both), r#"["10.0.0.10","fd00::a"]"#);
        assert_eq!(Cni::KubeOvn.format(&both), "10.0.0.10,fd00::a");
    }

    #[test]
    fn parses_and_rejects_calico_values() {
        assert_eq!(
            parse_calico_ip_addrs(r#"["10.0.0.1","fd00::1"]"#).unwrap(),
            ips(&["10.0.0.1", "fd00::1"])
        );
        let cases = [
            (
                "10.0.0.1",
                "\"10.0.0.1\" is not a JSON array of IP strings (example: [\"10.0.0.10\"])",
            ),
            (
                r#"["10.0.0.1","10.0.0.2"]"#,
                "\"[\\\"10.0.0.1\\\",\\\"10.0.0.2\\\"]\" has two IPv4 addresses (10.0.0.1 and 10.0.0.2); a pod gets at most one per family",
            ),
            (r#"["10.0.0.300"]"#, "\"10.0.0.300\" is not an IP address"),
            ("[]", "\"[]\" names no IP"),
        ];
        for (value, message) in cases {
            assert_eq!(
                parse_calico_ip_addrs(value).unwrap_err().to_string(),
                message,
                "{value}"
            );
        }
    }

    #[test]
    fn errors_about_huge_values_stay_short() {
        let huge = format!("[{}]", "\"1\",".repeat(200_000));
        for message in [
            parse_calico_ip_addrs(&"x".repeat(1 << 20))
                .unwrap_err()
                .to_string(),
            parse_calico_ip_addrs(&huge).unwrap_err().to_string(),
            parse_ovn_ip_address(&"1".repeat(1 << 20))
                .unwrap_err()
                .to_string(),
            parse_ovn_ip_address(&format!("10.0.0.1,10.0.0.2{}", " ".repeat(1 << 20)))
                .unwrap_err()
                .to_string(),
        ] {
            assert!(message.len() < 400, "a {}-byte message", message.len());
        }
    }

    /// Each CNI annotation value and what the CNI makes of it, row by row from the CNI's own
    /// source (projectcalico/calico at 87c15906, kubeovn/kube-ovn at 1533681d):
    /// `Ok(ips)` is what the pod gets; `Err(part)` a refusal naming `part`; `absent` no value.
    #[test]
    fn each_annotation_is_read_as_its_cni_reads_it() {
        type Expect = Result<&'static [&'static str], &'static str>;
        const ABSENT: Expect = Ok(&[]);
        let rows: [(&str, &str, Expect, &str); 16] = [
            // Calico: JSON array, net.ParseIP per item, To4() != nil is IPv4
            (
                CALICO_IP_ADDRS,
                r#"["::ffff:10.0.0.5"]"#,
                Ok(&["10.0.0.5"]),
                "calico cni-plugin/pkg/k8s/k8s.go:879-885 validateAndExtractIPs: net.ParseIP, To4() != nil",
            ),
            (
                CALICO_IP_ADDRS,
                r#"[" 10.0.0.7"]"#,
                Err(r#""[\" 10.0.0.7\"]" has spaces around 10.0.0.7"#),
                "calico cni-plugin/pkg/k8s/k8s.go:879 net.ParseIP(ip) with no trim: invalid IP format",
            ),
            (
                CALICO_IP_ADDRS,
                r#"["10.0.0.1", "fd00::1"]"#,
                Ok(&["10.0.0.1", "fd00::1"]),
                "calico cni-plugin/pkg/k8s/k8s.go:912 json.Unmarshal: whitespace between items is JSON's",
            ),
            (
                CALICO_IP_ADDRS,
                "",
                ABSENT,
                "calico cni-plugin/pkg/k8s/k8s.go:318 ipAddrs == \"\": Calico IPAM as if unset",
            ),
            (
                CALICO_IP_ADDRS,
                "[]",
                Err("names no IP"),
                "calico cni-plugin/pkg/k8s/k8s.go:869 len(ips) == 0: specified but empty",
            ),
            (
                CALICO_IP_ADDRS,
                r#"["10.0.0.5","::ffff:10.0.0.6"]"#,
                Err("two IPv4 addresses"),
                "calico cni-plugin/pkg/k8s/k8s.go:885-888 a second To4() != nil: more than one IPv4",
            ),
            (
                CALICO_IP_ADDRS_NO_IPAM,
                r#"["10.0.0.9"]"#,
                Ok(&["10.0.0.9"]),
                "calico cni-plugin/pkg/k8s/k8s.go:331-345 ipAddrsNoIpam: the IPs set as written, no IPAM",
            ),
            (
                CALICO_IP_ADDRS_NO_IPAM,
                r#"["::ffff:10.0.0.9"]"#,
                Ok(&["10.0.0.9"]),
                "calico cni-plugin/pkg/k8s/k8s.go:822 the same validateAndExtractIPs as ipAddrs",
            ),
            (
                CALICO_IP_ADDRS_NO_IPAM,
                "",
                ABSENT,
                "calico cni-plugin/pkg/k8s/k8s.go:318 ipAddrsNoIpam == \"\"",
            ),
            // Kube-OVN: split on ',', net.ParseIP per item, no trim
            (
                OVN_IP_ADDRESS,
                "::ffff:192.0.2.1",
                Ok(&["192.0.2.1"]),
                "kube-ovn pkg/controller/pod.go:2759 acquireStaticAddress: net.ParseIP, an IPv4 to its IPAM",
            ),
            (
                OVN_IP_ADDRESS,
                "10.0.0.1, fd00::1",
                Err(r#""10.0.0.1, fd00::1" has spaces around fd00::1"#),
                "kube-ovn pkg/controller/pod.go:2759 and pkg/util/validator.go:372 net.ParseIP(ip), untrimmed",
            ),
            (
                OVN_IP_ADDRESS,
                "10.0.0.1,fd00::1",
                Ok(&["10.0.0.1", "fd00::1"]),
                "kube-ovn pkg/controller/pod.go:2758 strings.SplitSeq(ip, \",\")",
            ),
            (
                OVN_IP_ADDRESS,
                "",
                ABSENT,
                "kube-ovn pkg/controller/pod.go:2649 ipStr != \"\"; pkg/util/validator.go:362 ipAddress != \"\"",
            ),
            (
                OVN_IP_ADDRESS,
                "10.16.0.15/16",
                Err("is not an IP address"),
                "kube-ovn pkg/controller/pod.go:2759 net.ParseIP fails on a CIDR (the validator lets it by)",
            ),
            (
                OVN_IP_ADDRESS,
                "10.0.0.1,",
                Err(r#""" is not an IP address"#),
                "kube-ovn pkg/controller/pod.go:2759 net.ParseIP(\"\") is nil",
            ),
            (
                OVN_IP_ADDRESS,
                "FD00::A",
                Ok(&["fd00::a"]),
                "kube-ovn pkg/controller/pod.go:2759 net.ParseIP is case-blind",
            ),
        ];
        for (key, value, expect, source) in rows {
            let annotations = BTreeMap::from([(key.to_string(), value.to_string())]);
            let got = static_ips(Some(&annotations));
            match expect {
                Ok(want) => {
                    let want: Vec<IpAddr> = want.iter().map(|s| s.parse().unwrap()).collect();
                    let got: Vec<IpAddr> = got
                        .unwrap_or_else(|e| panic!("{key}={value:?} ({source}): {e}"))
                        .into_iter()
                        .flat_map(|(_, ips)| ips)
                        .collect();
                    assert_eq!(got, want, "{key}={value:?} ({source})");
                    assert!(got.iter().all(|ip| *ip == ip.to_canonical()), "{source}");
                }
                Err(part) => {
                    let message = got.expect_err(source).to_string();
                    assert!(
                        message.starts_with(&format!("annotation {key}: "))
                            && message.contains(part),
                        "{key}={value:?} ({source}): {message}"
                    );
                }
            }
        }
    }

    #[test]
    fn calico_refuses_both_ip_annotations_at_once_and_empty_ones_do_not_count() {
        // calico cni-plugin/pkg/k8s/k8s.go:325 ipAddrs != "" && ipAddrsNoIpam != "": an error
        let both = BTreeMap::from([
            (CALICO_IP_ADDRS.to_string(), r#"["10.0.0.1"]"#.to_string()),
            (
                CALICO_IP_ADDRS_NO_IPAM.to_string(),
                r#"["10.0.0.2"]"#.to_string(),
            ),
        ]);
        assert!(
            static_ips(Some(&both))
                .unwrap_err()
                .to_string()
                .contains("both set")
        );
        let one_empty = BTreeMap::from([
            (CALICO_IP_ADDRS.to_string(), String::new()),
            (
                CALICO_IP_ADDRS_NO_IPAM.to_string(),
                r#"["10.0.0.2"]"#.to_string(),
            ),
        ]);
        assert_eq!(
            static_ips(Some(&one_empty)).unwrap(),
            [(CALICO_IP_ADDRS_NO_IPAM, ips(&["10.0.0.2"]))]
        );
    }

    #[test]
    fn kube_ovn_ip_pool_lists_are_split_as_its_controller_splits_them() {
        // kube-ovn pkg/controller/pod.go:2660-2675 acquireStaticAddressHelper
        let cases: [(&str, Option<&[&str]>); 6] = [
            ("10.16.0.10,10.16.0.11", Some(&["10.16.0.10", "10.16.0.11"])),
            (
                "10.16.0.10, 10.16.0.11",
                Some(&["10.16.0.10", "10.16.0.11"]),
            ),
            (
                "10.16.0.10,fd00::a;10.16.0.11,fd00::b",
                Some(&["10.16.0.10", "10.16.0.11", "fd00::a", "fd00::b"]),
            ),
            ("::ffff:10.16.0.12", Some(&["10.16.0.12"])),
            ("my-ippool", None),
            ("", None),
        ];
        for (value, want) in cases {
            let want = want.map(ips);
            assert_eq!(parse_ovn_ip_pool(value).unwrap(), want, "{value:?}");
        }
        assert!(
            parse_ovn_ip_pool("10.16.0.10,bad")
                .unwrap_err()
                .to_string()
                .contains("\"bad\" is not an IP address")
        );
    }

    #[test]
    fn an_update_changes_a_mark_only_when_it_names_other_ips_or_other_marks() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let labels = map(&[(ALLOCATED_IP_LABEL, "10.2.0.1")]);
        let annotations = map(&[
            (CALICO_IP_ADDRS, r#"["10.2.0.1"]"#),
            (STATUS, STATUS_MUTATED),
            (CLAIM_TOKEN, "t1"),
        ]);
        let old = (Some(&labels), Some(&annotations));
        assert_eq!(changed_mark(old, old), None);
        // another spelling of the same IPs is no change
        let respelled = map(&[
            (CALICO_IP_ADDRS, r#"[ "10.2.0.1" ]"#),
            (STATUS, STATUS_MUTATED),
            (CLAIM_TOKEN, "t1"),
        ]);
        assert_eq!(changed_mark(old, (Some(&labels), Some(&respelled))), None);
        let moved = map(&[
            (CALICO_IP_ADDRS, r#"["10.2.0.2"]"#),
            (STATUS, STATUS_MUTATED),
            (CLAIM_TOKEN, "t1"),
        ]);
        assert_eq!(
            changed_mark(old, (Some(&labels), Some(&moved))),
            Some((
                CALICO_IP_ADDRS,
                Some(r#"["10.2.0.1"]"#),
                Some(r#"["10.2.0.2"]"#)
            ))
        );
        let no_label = map(&[]);
        assert_eq!(
            changed_mark(old, (Some(&no_label), Some(&annotations))),
            Some((ALLOCATED_IP_LABEL, Some("10.2.0.1"), None))
        );
        let added = map(&[
            (CALICO_IP_ADDRS, r#"["10.2.0.1"]"#),
            (CALICO_IP_ADDRS_NO_IPAM, r#"["10.2.0.9"]"#),
            (STATUS, STATUS_MUTATED),
            (CLAIM_TOKEN, "t1"),
        ]);
        assert_eq!(
            changed_mark(old, (Some(&labels), Some(&added))),
            Some((CALICO_IP_ADDRS_NO_IPAM, None, Some(r#"["10.2.0.9"]"#)))
        );
        // Kube-OVN completing a dual-stack pod's ip_address with its IPv6 is no change; moving
        // its IPv4 is
        let ovn = map(&[(OVN_IP_ADDRESS, "10.16.0.15")]);
        let completed = map(&[(OVN_IP_ADDRESS, "10.16.0.15,fd00::f")]);
        let moved_v4 = map(&[(OVN_IP_ADDRESS, "10.16.0.16,fd00::f")]);
        assert_eq!(
            changed_mark((None, Some(&ovn)), (None, Some(&completed))),
            None
        );
        assert_eq!(
            changed_mark((None, Some(&ovn)), (None, Some(&moved_v4))),
            Some((
                OVN_IP_ADDRESS,
                Some("10.16.0.15"),
                Some("10.16.0.16,fd00::f")
            ))
        );
        assert!(changed_mark((None, Some(&completed)), (None, Some(&ovn))).is_some());
        let retoken = map(&[
            (CALICO_IP_ADDRS, r#"["10.2.0.1"]"#),
            (STATUS, STATUS_MUTATED),
            (CLAIM_TOKEN, "t2"),
        ]);
        assert_eq!(
            changed_mark(old, (Some(&labels), Some(&retoken))),
            Some((CLAIM_TOKEN, Some("t1"), Some("t2")))
        );
    }

    #[test]
    fn parses_and_rejects_ovn_values() {
        assert_eq!(
            parse_ovn_ip_address("10.16.0.15").unwrap(),
            ips(&["10.16.0.15"])
        );
        assert_eq!(
            parse_ovn_ip_address("10.16.0.15,fd00::f").unwrap(),
            ips(&["10.16.0.15", "fd00::f"])
        );
        assert!(
            parse_ovn_ip_address("fd00::1,fd00::2")
                .unwrap_err()
                .to_string()
                .contains("two IPv6")
        );
        assert!(
            parse_ovn_ip_address("x")
                .unwrap_err()
                .to_string()
                .contains("not an IP")
        );
    }
}
