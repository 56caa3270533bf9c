//! Who holds a claim besides its pod: a KubeVirt virtual machine ([`VmRef`]), whose launcher
//! pods hold its IP in turn, two at once during a live migration ([`Carrier`]).

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Shared, Text};

/// The KubeVirt VM (in the claim's namespace) whose launcher pods hold a claim, and, while a
/// live migration's target pod holds it, the migration's source pod, which still runs the VM
/// on the claim's IP. Reads as the VM's name.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct VmRef(Arc<VmHolding>);

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct VmHolding {
    name: Shared,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<Carrier>,
}

/// A launcher pod that runs the claim's VM on its IP besides the claim's own pod: the source
/// of a live migration whose target pod holds the claim. Named as a DELETE review names it.
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
    pub fn is(&self, uid: Option<&str>, token: Option<&str>) -> bool {
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
            source: None,
        }))
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The migration's source pod, while its target holds the claim.
    pub fn source(&self) -> Option<&Carrier> {
        self.0.source.as_ref()
    }

    /// The same VM with `source` as its migration's source pod (`None`: none).
    pub fn with_source(&self, source: Option<Carrier>) -> VmRef {
        VmRef(Arc::new(VmHolding {
            name: self.0.name.clone(),
            source,
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
        match self.source() {
            None => write!(f, "{:?}", self.name()),
            Some(source) => write!(f, "{:?} (migrating from {source:?})", self.name()),
        }
    }
}

/// A VM as the etcd ledger stores it: its name, or its name and migration source.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Stored {
    Name(Shared),
    Holding(VmHolding),
}

impl Serialize for VmRef {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.source() {
            None => self.0.name.serialize(serializer),
            Some(_) => self.0.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for VmRef {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<VmRef, D::Error> {
        Ok(match Stored::deserialize(deserializer)? {
            Stored::Name(name) => VmRef(Arc::new(VmHolding { name, source: None })),
            Stored::Holding(holding) => VmRef(Arc::new(holding)),
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
        let migrating = vm.with_source(Some(Carrier {
            name: "virt-launcher-db-a".into(),
            uid: Some("u-a".into()),
            token: "t-a".into(),
        }));
        let text = serde_json::to_string(&migrating).unwrap();
        let read: VmRef = serde_json::from_str(&text).unwrap();
        assert_eq!(read, migrating);
        assert_eq!(&*read, "db");
        assert_eq!(serde_json::from_str::<VmRef>("\"db\"").unwrap(), vm);
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
