//! The public names ip-webhook reads and writes, and the CNI annotations' formats.

use std::net::IpAddr;

use crate::ipam::ipset::{Family, excerpt, parse_ip};

pub const ALLOCATABLE_IPS: &str = "ip-webhook.io/allocatable-ips";
pub const IP_POOL: &str = "ip-webhook.io/ip-pool";
pub const FIXED_IP_LABEL: &str = "ip-webhook.io/fixed-ip";
pub const ALLOCATED_IP_LABEL: &str = "ip-webhook.io/allocated-ip";
pub const STATUS: &str = "ip-webhook.io/status";
pub const STATUS_MUTATED: &str = "mutated";
/// The claim token ip-webhook writes on a pod it gave IPs to: the claim's identity until the
/// pod's UID is known ([`crate::ledger::claim`]).
pub const CLAIM_TOKEN: &str = "ip-webhook.io/claim";
pub const CALICO_IP_ADDRS: &str = "cni.projectcalico.org/ipAddrs";
pub const OVN_IP_ADDRESS: &str = "ovn.kubernetes.io/ip_address";

/// Which CNI's annotation carries the IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cni {
    #[default]
    Calico,
    KubeOvn,
}

impl Cni {
    pub fn annotation(self) -> &'static str {
        match self {
            Cni::Calico => CALICO_IP_ADDRS,
            Cni::KubeOvn => OVN_IP_ADDRESS,
        }
    }

    /// The annotation value for `ips`: `["10.0.0.10","fd00::a"]` or `10.0.0.10,fd00::a`.
    pub fn format(self, ips: &[IpAddr]) -> String {
        // IPs print without characters JSON would escape
        let (open, separator, close) = match self {
            Cni::Calico => ("[\"", "\",\"", "\"]"),
            Cni::KubeOvn => ("", ",", ""),
        };
        let mut text = String::with_capacity(2 + ips.len() * 42);
        text.push_str(open);
        for (i, ip) in ips.iter().enumerate() {
            if i > 0 {
                text.push_str(separator);
            }
            crate::ipam::ipset::push_ip(&mut text, ip);
        }
        text.push_str(close);
        text
    }
}

/// Parse `cni.projectcalico.org/ipAddrs`: a JSON array of IP strings, at most one per family.
pub fn parse_calico_ip_addrs(value: &str) -> Result<Vec<IpAddr>, String> {
    let items: Vec<String> = serde_json::from_str(value).map_err(|_| {
        format!(
            "{:?} is not a JSON array of IP strings (example: [\"10.0.0.10\"])",
            excerpt(value)
        )
    })?;
    parse_one_per_family(items.iter().map(String::as_str), value)
}

/// Parse `ovn.kubernetes.io/ip_address`: `10.0.0.10` or `10.0.0.10,fd00::a`.
pub fn parse_ovn_ip_address(value: &str) -> Result<Vec<IpAddr>, String> {
    parse_one_per_family(value.split(','), value)
}

fn parse_one_per_family<'a>(
    items: impl Iterator<Item = &'a str>,
    whole: &str,
) -> Result<Vec<IpAddr>, String> {
    let mut ips: Vec<IpAddr> = Vec::new();
    for item in items {
        let ip = parse_ip(item).map_err(|e| e.to_string())?;
        if let Some(other) = ips.iter().find(|o| Family::of(o) == Family::of(&ip)) {
            return Err(format!(
                "{:?} has two {} addresses ({other} and {ip}); a pod gets at most one per family",
                excerpt(whole),
                Family::of(&ip).name()
            ));
        }
        ips.push(ip);
    }
    if ips.is_empty() {
        return Err(format!("{:?} names no IP", excerpt(whole)));
    }
    Ok(ips)
}

/// The static IPs a pod's annotations ask for, with the annotation that asked.
pub fn static_ips(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
) -> Result<Vec<(&'static str, Vec<IpAddr>)>, String> {
    let mut out = Vec::new();
    let Some(annotations) = annotations else {
        return Ok(out);
    };
    if let Some(value) = annotations.get(CALICO_IP_ADDRS) {
        let ips = parse_calico_ip_addrs(value)
            .map_err(|e| format!("annotation {CALICO_IP_ADDRS}: {e}"))?;
        out.push((CALICO_IP_ADDRS, ips));
    }
    if let Some(value) = annotations.get(OVN_IP_ADDRESS) {
        let ips =
            parse_ovn_ip_address(value).map_err(|e| format!("annotation {OVN_IP_ADDRESS}: {e}"))?;
        out.push((OVN_IP_ADDRESS, ips));
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

/// [`carried_ips`] from annotations already parsed by [`static_ips`].
pub fn carried_with(
    statics: &[(&'static str, Vec<IpAddr>)],
    labels: Option<&std::collections::BTreeMap<String, String>>,
) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = statics
        .iter()
        .flat_map(|(_, ips)| ips.iter().copied())
        .collect();
    if let Some(ip) = labels
        .and_then(|l| l.get(ALLOCATED_IP_LABEL))
        .and_then(|v| crate::ipam::ipset::ip_from_label_value(v))
        && !ips.iter().any(|held| Family::of(held) == Family::of(&ip))
    {
        ips.push(ip);
    }
    ips.sort();
    ips.dedup();
    ips
}

#[cfg(test)]
mod tests {
    use super::*;

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
                parse_calico_ip_addrs(value).unwrap_err(),
                message,
                "{value}"
            );
        }
    }

    #[test]
    fn errors_about_huge_values_stay_short() {
        let huge = format!("[{}]", "\"1\",".repeat(200_000));
        for message in [
            parse_calico_ip_addrs(&"x".repeat(1 << 20)).unwrap_err(),
            parse_calico_ip_addrs(&huge).unwrap_err(),
            parse_ovn_ip_address(&"1".repeat(1 << 20)).unwrap_err(),
            parse_ovn_ip_address(&format!("10.0.0.1,10.0.0.2{}", " ".repeat(1 << 20))).unwrap_err(),
        ] {
            assert!(message.len() < 400, "a {}-byte message", message.len());
        }
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
                .contains("two IPv6")
        );
        assert!(parse_ovn_ip_address("x").unwrap_err().contains("not an IP"));
    }
}
