//! The strings of a claim, in less memory than a `String` each: the allocator holds every
//! claim for the life of the process, so each byte of a claim is paid once per held IP.
//!
//! [`Text`] is a string of one claim's own (a request UID, a token, a pod's name or UID): 16
//! bytes where a `String` is 24, its heap copy exactly its length. [`Shared`] is a string that
//! many claims carry alike (a namespace, an app, a pool, a ReplicaSet's `generateName`): every
//! claim holds the one interned copy, through a thin pointer of 8 bytes (the `Arc` holds a
//! `Box<str>`: the second indirection is paid once per distinct string, not per claim). Both read as `&str` (`Deref`), compare with `str`,
//! `&str` and `String`, and serialize as plain strings.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A string of one claim's own.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Text(Box<str>);

/// A string that many claims carry alike, interned: equal strings share one copy.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shared(Arc<Box<str>>);

/// The interned strings: each kept while a [`Shared`] holds it. Swept when it has grown to
/// twice what the last sweep left, so its size stays within twice the strings in use and a
/// sweep's cost is spread over the strings interned since the last one.
struct Interner {
    /// foldhash, seeded per process: the names come from the cluster's users, so not a hash
    /// anyone can aim collisions at, and several times cheaper than SipHash on short strings.
    strings: HashSet<Shared, foldhash::fast::RandomState>,
    sweep_at: usize,
}

/// Below this many strings the interner is never swept.
const SWEEP_FLOOR: usize = 1024;

fn interner() -> &'static Mutex<Interner> {
    static INTERNER: OnceLock<Mutex<Interner>> = OnceLock::new();
    INTERNER.get_or_init(|| {
        Mutex::new(Interner {
            strings: HashSet::default(),
            sweep_at: SWEEP_FLOOR,
        })
    })
}

impl Shared {
    /// The interned copy of `text`.
    pub(crate) fn new(text: &str) -> Shared {
        // a panic under the lock leaves the set whole (one insert or retain), so a poisoned
        // lock is still usable
        let mut interner = interner()
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(held) = interner.strings.get(text) {
            return held.clone();
        }
        if interner.strings.len() >= interner.sweep_at {
            // a count of 1 is the interner's own: no other `Shared` holds the string any more
            interner
                .strings
                .retain(|held| Arc::strong_count(&held.0) > 1);
            interner.sweep_at = (interner.strings.len() * 2).max(SWEEP_FLOOR);
        }
        let held = Shared(Arc::new(text.into()));
        interner.strings.insert(held.clone());
        held
    }
}

impl Default for Shared {
    fn default() -> Shared {
        static EMPTY: OnceLock<Shared> = OnceLock::new();
        EMPTY.get_or_init(|| Shared::new("")).clone()
    }
}

impl Text {
    pub(crate) fn new(text: &str) -> Text {
        Text(text.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Shared {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Shared {
    fn from(text: &str) -> Shared {
        Shared::new(text)
    }
}

impl From<String> for Shared {
    fn from(text: String) -> Shared {
        Shared::new(&text)
    }
}

impl From<&String> for Shared {
    fn from(text: &String) -> Shared {
        Shared::new(text)
    }
}

impl From<&str> for Text {
    fn from(text: &str) -> Text {
        Text::new(text)
    }
}

impl From<String> for Text {
    fn from(text: String) -> Text {
        Text(text.into_boxed_str())
    }
}

impl From<&String> for Text {
    fn from(text: &String) -> Text {
        Text::new(text)
    }
}

/// What both types offer alike: reading, comparing, printing and serializing as a `str`.
macro_rules! as_str {
    ($type:ident) => {
        impl Deref for $type {
            type Target = str;
            fn deref(&self) -> &str {
                self.as_str()
            }
        }

        impl AsRef<str> for $type {
            fn as_ref(&self) -> &str {
                self.as_str()
            }
        }

        impl Borrow<str> for $type {
            fn borrow(&self) -> &str {
                self.as_str()
            }
        }

        impl From<$type> for String {
            fn from(text: $type) -> String {
                text.as_str().to_string()
            }
        }

        impl From<&$type> for String {
            fn from(text: &$type) -> String {
                text.as_str().to_string()
            }
        }

        impl fmt::Display for $type {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self.as_str(), f)
            }
        }

        impl fmt::Debug for $type {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(self.as_str(), f)
            }
        }

        impl PartialEq<str> for $type {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $type {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl PartialEq<String> for $type {
            fn eq(&self, other: &String) -> bool {
                self.as_str() == *other
            }
        }

        impl PartialEq<$type> for str {
            fn eq(&self, other: &$type) -> bool {
                self == other.as_str()
            }
        }

        impl PartialEq<$type> for &str {
            fn eq(&self, other: &$type) -> bool {
                *self == other.as_str()
            }
        }

        impl PartialEq<$type> for String {
            fn eq(&self, other: &$type) -> bool {
                *self == other.as_str()
            }
        }

        impl Serialize for $type {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<$type, D::Error> {
                String::deserialize(deserializer).map($type::from)
            }
        }
    };
}

as_str!(Text);
as_str!(Shared);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_shared_strings_are_one_copy() {
        let a = Shared::from("team-a/web");
        let b = Shared::from(String::from("team-a/web"));
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert_eq!(std::mem::size_of::<Option<Shared>>(), 8);
        assert_eq!(a, "team-a/web");
        assert_eq!(Shared::default(), "");
    }

    #[test]
    fn a_string_no_claim_holds_is_swept() {
        let kept = Shared::from("kept-across-sweeps");
        for n in 0..3 * SWEEP_FLOOR {
            drop(Shared::from(format!("passing-{n}")));
        }
        let interner = interner().lock().unwrap();
        assert!(interner.strings.len() <= interner.sweep_at);
        assert!(interner.strings.len() < 2 * SWEEP_FLOOR + 2);
        assert!(interner.strings.contains("kept-across-sweeps"));
        drop(interner);
        assert_eq!(kept, "kept-across-sweeps");
    }

    #[test]
    fn both_read_compare_and_serialize_as_str() {
        let text = Text::from("5f0c8a9e");
        assert_eq!(text, "5f0c8a9e");
        assert_eq!("5f0c8a9e", text);
        assert_eq!(String::from("5f0c8a9e"), text);
        assert_eq!(text.len(), 8);
        assert_eq!(format!("{text} {text:?}"), "5f0c8a9e \"5f0c8a9e\"");
        assert_eq!(serde_json::to_string(&text).unwrap(), "\"5f0c8a9e\"");
        let back: Shared = serde_json::from_str("\"default\"").unwrap();
        assert_eq!(back, Shared::from("default"));
        assert_eq!(std::mem::size_of::<Text>(), 16);
        assert_eq!(std::mem::size_of::<Option<Text>>(), 16);
    }
}
