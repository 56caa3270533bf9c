//! The words of a refusal about held IPs, in one place: who holds an IP, and the list of
//! holders an exhaustion or a pool change names.

use std::fmt;
use std::net::IpAddr;

use super::foreign::ForeignUse;
use super::ipset::IpSet;
use ip_webhook_ledger::{Claim, PodName, PodRef};

/// Whose IPs a message is about. Written only when a message is: a granted pod costs no
/// formatting.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// `app default/web`
    App { namespace: &'a str, app: &'a str },
    /// `FixedIPPool blue (app default/web)`
    Pool {
        pool: &'a str,
        namespace: &'a str,
        app: &'a str,
    },
    /// `pod default/web-1`: a pod with neither a list nor a pool
    Pod(PodName<'a>),
}

impl fmt::Display for Scope<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::App { namespace, app } => write!(f, "app {namespace}/{app}"),
            Scope::Pool {
                pool,
                namespace,
                app,
            } => write!(f, "FixedIPPool {pool} (app {namespace}/{app})"),
            Scope::Pod(pod) => write!(f, "pod {pod}"),
        }
    }
}

/// How many holders an exhaustion message names before "and N more".
pub(crate) const HOLDERS_NAMED: usize = 10;

/// `10.0.0.1 by default/a, 10.0.0.2 by default/b, and 3 more`: `named`, the first holders
/// of `total`.
pub fn holder_list(named: &[String], total: u128) -> String {
    let mut list = named.join(", ");
    let count = named.len() as u128;
    if total > count {
        list.push_str(&format!(", and {} more", total - count));
    }
    list
}

/// `static IP 10.16.0.15 requested by default/web-2 is already held by default/static-1`.
pub fn conflict_message(ip: &IpAddr, requester: &PodRef, holder: &Claim) -> String {
    let app = if holder.app.is_empty() {
        String::new()
    } else {
        format!(" (app {})", holder.app_key())
    };
    format!(
        "static IP {ip} requested by {} is already held by {}{app}",
        requester.display(),
        holder.holder()
    )
}

/// `static IP 10.98.2.7 requested by default/x is already used by pod default/y (Kube-OVN IP
/// y.default)`: a pod outside the ledger runs on it.
pub fn foreign_message(ip: &IpAddr, requester: &PodRef, user: &ForeignUse) -> String {
    format!(
        "static IP {ip} requested by {} is already used by {}",
        requester.display(),
        user.describe()
    )
}

/// The IPs `a` and `b` share, as canonical text (shortened when long).
pub fn overlap_text(a: &IpSet, b: &IpSet) -> String {
    let text = a.subtract(&a.subtract(b)).to_string();
    if text.len() > 120 {
        format!("{}…", text.chars().take(120).collect::<String>())
    } else {
        text
    }
}
