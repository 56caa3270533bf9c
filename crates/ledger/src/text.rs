//! The strings of a claim, in less memory than a `String` each: the allocator holds every
//! claim for the life of the process, so each byte of a claim is paid once per held IP.
//!
//! [`Text`] is a string of one claim's own (a pod's name or UID): 16 bytes where a `String`
//! is 24, its heap copy exactly its length. [`Shared`] is a string that many claims carry alike
//! (a namespace, an app, a pool, a ReplicaSet's `generateName`): every claim holds the one
//! interned copy, through a thin pointer of 8 bytes (the `Arc` holds a `Box<str>`: the second
//! indirection is paid once per distinct string, not per claim). Both read as `&str` (`Deref`),
//! compare with `str`, `&str` and `String`, and serialize as plain strings. [`HexId`] is a
//! claim's request UID or token: the 16 bytes a UUID or 32 hex digits spell, kept inside the
//! claim with no heap copy; it compares and serializes as its string too, and is read through
//! [`HexId::with_str`].

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

/// A claim's identifier of 16 bytes written in hex: its token (`ip-webhook.io/claim`, 32
/// lower-case hex digits when this process issued it, [`crate::claim::new_token`]) or its
/// admission's request UID (a UUID, `8-4-4-4-12` lower-case hex digits: the API server makes a
/// fresh `uuid.NewUUID()` for each webhook call, k8s.io/apiserver
/// `pkg/admission/plugin/webhook/request/admissionreview.go`). Either shape is kept as its 16
/// bytes inside the claim, where a [`Text`] would keep 32 or 48 bytes more on the heap for
/// every held IP. Any other string (an upper-case token a pod was given by hand, a record's
/// from elsewhere, a test's) is kept as text, and none is empty but the empty one, so equal
/// strings have equal forms. Not a `str`: read it with [`HexId::with_str`], print it, or
/// compare it with a string.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct HexId(HexIdForm);

#[derive(Clone, Default, PartialEq, Eq, Hash)]
enum HexIdForm {
    #[default]
    Empty,
    /// 32 lower-case hex digits.
    Digits([u8; 16]),
    /// A UUID's 36 characters: lower-case hex digits with dashes after the 8th, 12th, 16th
    /// and 20th.
    Uuid([u8; 16]),
    Text(Box<str>),
}

/// Where a UUID's text has its dashes.
const UUID_DASHES: [usize; 4] = [8, 13, 18, 23];

fn lower_hex(text: &[u8]) -> bool {
    text.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl HexIdForm {
    /// The 16 bytes of `text` when it has one of the two shapes, exactly (so that it writes
    /// back as the same string).
    fn packed(text: &str) -> Option<HexIdForm> {
        let mut bytes = [0u8; 16];
        match text.len() {
            32 if lower_hex(text.as_bytes()) => {
                hex::decode_to_slice(text, &mut bytes).ok()?;
                Some(HexIdForm::Digits(bytes))
            }
            36 => {
                let text = text.as_bytes();
                let mut digits = [0u8; 32];
                let mut from = 0;
                for (group, dash) in UUID_DASHES.into_iter().chain([36]).enumerate() {
                    if dash < 36 && text[dash] != b'-' {
                        return None;
                    }
                    let part = &text[from..dash];
                    let at = from - group;
                    digits[at..at + part.len()].copy_from_slice(part);
                    from = dash + 1;
                }
                if !lower_hex(&digits) {
                    return None;
                }
                hex::decode_to_slice(digits, &mut bytes).ok()?;
                Some(HexIdForm::Uuid(bytes))
            }
            _ => None,
        }
    }
}

impl HexId {
    pub fn new(text: &str) -> HexId {
        if text.is_empty() {
            return HexId(HexIdForm::Empty);
        }
        HexId(HexIdForm::packed(text).unwrap_or_else(|| HexIdForm::Text(text.into())))
    }

    pub fn is_empty(&self) -> bool {
        matches!(self.0, HexIdForm::Empty)
    }

    /// The identifier as a `str`, for as long as `read` runs (no allocation).
    pub fn with_str<R>(&self, read: impl FnOnce(&str) -> R) -> R {
        match &self.0 {
            HexIdForm::Empty => read(""),
            HexIdForm::Text(text) => read(text),
            HexIdForm::Digits(bytes) => {
                let mut digits = [0u8; 32];
                hex::encode_to_slice(bytes, &mut digits).expect("32 digits for 16 bytes");
                read(std::str::from_utf8(&digits).expect("hex digits are ASCII"))
            }
            HexIdForm::Uuid(bytes) => {
                let mut digits = [0u8; 32];
                hex::encode_to_slice(bytes, &mut digits).expect("32 digits for 16 bytes");
                let mut text = [b'-'; 36];
                let mut from = 0;
                for (group, dash) in UUID_DASHES.into_iter().chain([36]).enumerate() {
                    let at = from - group;
                    text[from..dash].copy_from_slice(&digits[at..at + dash - from]);
                    from = dash + 1;
                }
                read(std::str::from_utf8(&text).expect("hex digits and dashes are ASCII"))
            }
        }
    }

    /// The 16 bytes of an identifier of 32 lower-case hex digits (a token this process may
    /// have issued).
    pub(crate) fn digits(&self) -> Option<&[u8; 16]> {
        match &self.0 {
            HexIdForm::Digits(bytes) => Some(bytes),
            _ => None,
        }
    }
}

impl From<&str> for HexId {
    fn from(text: &str) -> HexId {
        HexId::new(text)
    }
}

impl From<String> for HexId {
    fn from(text: String) -> HexId {
        HexId::new(&text)
    }
}

impl From<&String> for HexId {
    fn from(text: &String) -> HexId {
        HexId::new(text)
    }
}

impl From<&HexId> for String {
    fn from(id: &HexId) -> String {
        id.to_string()
    }
}

impl From<HexId> for String {
    fn from(id: HexId) -> String {
        id.to_string()
    }
}

impl fmt::Display for HexId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with_str(|text| fmt::Display::fmt(text, f))
    }
}

impl fmt::Debug for HexId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with_str(|text| fmt::Debug::fmt(text, f))
    }
}

impl PartialEq<str> for HexId {
    fn eq(&self, other: &str) -> bool {
        match &self.0 {
            HexIdForm::Empty => other.is_empty(),
            HexIdForm::Text(text) => &**text == other,
            packed => HexIdForm::packed(other).as_ref() == Some(packed),
        }
    }
}

impl PartialEq<&str> for HexId {
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

impl PartialEq<String> for HexId {
    fn eq(&self, other: &String) -> bool {
        *self == **other
    }
}

impl PartialEq<HexId> for &str {
    fn eq(&self, other: &HexId) -> bool {
        *other == **self
    }
}

impl PartialEq<HexId> for str {
    fn eq(&self, other: &HexId) -> bool {
        *other == *self
    }
}

impl PartialEq<HexId> for String {
    fn eq(&self, other: &HexId) -> bool {
        *other == **self
    }
}

impl Serialize for HexId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.with_str(|text| serializer.serialize_str(text))
    }
}

impl<'de> Deserialize<'de> for HexId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<HexId, D::Error> {
        String::deserialize(deserializer).map(HexId::from)
    }
}

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

    /// What is kept in 16 bytes, and what as text: each string reads, prints, compares and
    /// serializes as itself whatever its form.
    #[test]
    fn an_id_reads_compares_and_serializes_as_the_string_it_was_made_from() {
        let token = "0123456789abcdef0123456789abcdef";
        // API servers' request UIDs (`uuid.NewUUID`: version 1; and a version 4)
        let uuids = [
            "705ab4f5-6393-11e8-b7cc-42010a800002",
            "0f1e2d3c-4b5a-4978-8a6b-5c4d3e2f1a0b",
            "00000000-0000-0000-0000-000000000000",
        ];
        let text = [
            "",
            "tok-a",
            "r-db-2",
            "0123456789ABCDEF0123456789abcdef",
            "0123456789abcdef0123456789abcde",
            "0123456789abcdef0123456789abcdef0",
            "0123456789abcdeg0123456789abcdef",
            "+123456789abcdef0123456789abcdef",
            // 36 characters that are not a lower-case UUID
            "705AB4F5-6393-11E8-B7CC-42010A800002",
            "705ab4f5-6393-11e8-b7cc-42010a80000g",
            "705ab4f5a6393-11e8-b7cc-42010a800002",
            "705ab4f-56393-11e8-b7cc-42010a800002",
            "705ab4f5-6393-11e8-b7cc-42010a80000-",
            "705ab4f5-6393-11e8-b7cc-42010a8000+2",
            "705ab4f5063930011e80b7cc042010a80000",
            "{05ab4f5-6393-11e8-b7cc-42010a80000}",
            // 36 bytes, not 36 characters
            "705ab4f5-6393-11e8-b7cc-42010a8000é",
        ];
        let all = || std::iter::once(token).chain(uuids).chain(text);
        for written in all() {
            let id = HexId::from(written);
            assert_eq!(id.to_string(), written);
            assert_eq!(format!("{id:?}"), format!("{written:?}"));
            assert_eq!(id.with_str(str::to_owned), written);
            assert_eq!(id.is_empty(), written.is_empty());
            assert_eq!(String::from(id.clone()), written);
            assert_eq!(
                serde_json::to_string(&id).unwrap(),
                serde_json::to_string(written).unwrap()
            );
            let back: HexId =
                serde_json::from_str(&serde_json::to_string(written).unwrap()).unwrap();
            assert_eq!(back, id);
            for compared in all() {
                let same = written == compared;
                assert_eq!(id == *compared, same, "{written:?} {compared:?}");
                let made = HexId::from(compared);
                assert_eq!(id == made, same, "{written:?} {compared:?}");
                assert_eq!(compared == id, same);
            }
            assert_eq!(id.digits().is_some(), written == token, "{written:?}");
            let packed = !matches!(id.0, HexIdForm::Text(_) | HexIdForm::Empty);
            assert_eq!(
                packed,
                written == token || uuids.contains(&written),
                "{written:?}"
            );
        }
        assert_eq!(std::mem::size_of::<HexId>(), 24);
    }

    /// Each character of a UUID changed in turn: kept in 16 bytes exactly when the result is
    /// still lower-case hex with its four dashes in place, and read back as written either way.
    #[test]
    fn a_uuid_changed_anywhere_packs_only_while_it_keeps_its_shape() {
        let uuid = "705ab4f5-6393-11e8-b7cc-42010a800002";
        let shaped = |text: &str| {
            text.len() == 36
                && text.char_indices().all(|(at, c)| match at {
                    8 | 13 | 18 | 23 => c == '-',
                    _ => matches!(c, '0'..='9' | 'a'..='f'),
                })
        };
        for at in 0..uuid.len() {
            for with in ['-', '0', '9', 'a', 'f', 'g', 'A', 'F', ' ', '"'] {
                let mut text = uuid.to_string();
                text.replace_range(at..at + 1, with.encode_utf8(&mut [0; 4]));
                let id = HexId::from(text.as_str());
                assert_eq!(id.to_string(), text);
                assert_eq!(id, *text);
                assert_eq!(
                    matches!(id.0, HexIdForm::Uuid(_)),
                    shaped(&text),
                    "{text:?}"
                );
            }
        }
    }
}
