//! Who holds a claim besides its pod: a KubeVirt virtual machine ([`VmRef`]), whose launcher
//! pods hold its IP in turn, several at once after live migrations ([`Carrier`]).

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Shared, Text};

/// The KubeVirt VM (in the claim's namespace) whose launcher pods hold a claim, and, once a
/// live migration's target pod holds it, the other launcher pods that may still run the VM
/// on the claim's IP ([`VmRef::sources`]). Reads as the VM's name.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct VmRef(Arc<VmHolding>);

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct VmHolding {
    name: Shared,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    sources: Vec<Carrier>,
}

/// How many launcher pods besides its own a VM's claim remembers at most: the newest are
/// kept. Each migration adds one and each DELETE of one removes it; past this many, the
/// oldest (done the longest) are forgotten, and their DELETE frees nothing.
pub(crate) const MAX_SOURCES: usize = 8;

/// A launcher pod that may run the claim's VM on its IP besides the claim's own pod: the
/// source of a live migration whose target pod holds the claim (or an earlier target, when
/// which of them won is not known). Named as a DELETE review names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Carrier {
    pub name: Text,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<Text>,
    /// The claim token it carries.
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub token: Text,
}

impl Carrier {
    /// Whether the pod (of the claim's namespace) with this UID and claim token is this
    /// launcher pod: by UID when both have one, else by the token it carries.
    pub(crate) fn is(&self, uid: Option<&str>, token: Option<&str>) -> bool {
        match (self.uid.as_deref(), uid) {
            (Some(mine), Some(theirs)) => mine == theirs,
            _ => !self.token.is_empty() && token == Some(self.token.as_str()),
        }
    }
}

impl VmRef {
    pub fn named(name: &str) -> VmRef {
        VmRef(Arc::new(VmHolding {
            name: name.into(),
            sources: Vec::new(),
        }))
    }

    pub(crate) fn name(&self) -> &str {
        &self.0.name
    }

    /// The launcher pods besides the claim's own that may still run the VM on its IP, oldest
    /// first: the sources of the migrations since the last pod the claim names was deleted.
    pub fn sources(&self) -> &[Carrier] {
        &self.0.sources
    }

    /// Whether a launcher pod with this UID and claim token is one of [`VmRef::sources`].
    pub fn carried_by(&self, uid: Option<&str>, token: Option<&str>) -> bool {
        self.sources().iter().any(|source| source.is(uid, token))
    }

    /// The same VM with `sources` (oldest first; the newest `MAX_SOURCES` are kept).
    pub fn with_sources(&self, mut sources: Vec<Carrier>) -> VmRef {
        if sources.len() > MAX_SOURCES {
            sources.drain(..sources.len() - MAX_SOURCES);
        }
        VmRef(Arc::new(VmHolding {
            name: self.0.name.clone(),
            sources,
        }))
    }
}

impl Deref for VmRef {
    type Target = str;

    fn deref(&self) -> &str {
        self.name()
    }
}

impl From<&str> for VmRef {
    fn from(name: &str) -> VmRef {
        VmRef::named(name)
    }
}

impl fmt::Display for VmRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Debug for VmRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.sources() {
            [] => write!(f, "{:?}", self.name()),
            sources => write!(f, "{:?} (migrating from {sources:?})", self.name()),
        }
    }
}

/// A VM as the etcd ledger stores it: its name, or its name and the launcher pods besides the
/// claim's that may run it.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Stored {
    Name(Shared),
    Holding(VmHolding),
}

impl Serialize for VmRef {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.sources() {
            [] => self.0.name.serialize(serializer),
            _ => self.0.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for VmRef {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<VmRef, D::Error> {
        Ok(match Stored::deserialize(deserializer)? {
            Stored::Name(name) => VmRef::named(&name),
            Stored::Holding(holding) => VmRef::named(&holding.name).with_sources(holding.sources),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vm_is_stored_as_its_name_until_it_migrates() {
        let vm = VmRef::named("db");
        assert_eq!(serde_json::to_string(&vm).unwrap(), "\"db\"");
        let migrating = vm.with_sources(vec![Carrier {
            name: "virt-launcher-db-a".into(),
            uid: Some("u-a".into()),
            token: "t-a".into(),
        }]);
        let text = serde_json::to_string(&migrating).unwrap();
        let read: VmRef = serde_json::from_str(&text).unwrap();
        assert_eq!(read, migrating);
        assert_eq!(&*read, "db");
        assert_eq!(serde_json::from_str::<VmRef>("\"db\"").unwrap(), vm);
    }

    #[test]
    fn a_vm_remembers_its_newest_sources_only() {
        let carrier = |n: usize| Carrier {
            name: format!("virt-launcher-db-{n}").as_str().into(),
            uid: None,
            token: format!("t-{n}").as_str().into(),
        };
        let vm = VmRef::named("db").with_sources((0..MAX_SOURCES + 3).map(carrier).collect());
        assert_eq!(vm.sources().len(), MAX_SOURCES);
        assert_eq!(vm.sources()[0], carrier(3), "the oldest went");
        assert!(vm.carried_by(Some("any-uid"), Some("t-10")));
        assert!(!vm.carried_by(None, Some("t-2")));
        let text = serde_json::to_string(&vm).unwrap();
        assert_eq!(serde_json::from_str::<VmRef>(&text).unwrap(), vm);
    }

    #[test]
    fn a_carrier_is_its_uid_once_known_else_its_token() {
        let carrier = Carrier {
            name: "virt-launcher-db-a".into(),
            uid: Some("u-a".into()),
            token: "t-a".into(),
        };
        assert!(carrier.is(Some("u-a"), None));
        assert!(!carrier.is(Some("u-b"), Some("t-a")));
        assert!(carrier.is(None, Some("t-a")));
        let unbound = Carrier {
            uid: None,
            ..carrier
        };
        assert!(unbound.is(Some("u-x"), Some("t-a")));
        assert!(!unbound.is(Some("u-x"), Some("t-b")));
    }
}
