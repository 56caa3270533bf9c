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

/// A claim's token (`ip-webhook.io/claim`). Every token this process issues is 32 lower-case
/// hex digits ([`crate::claim::new_token`]): kept as their 16 bytes, inside the claim, where a
/// [`Text`] would keep 32 bytes more on the heap for every held IP. Any other string (an
/// upper-case token a pod was given by hand, a record's from elsewhere, a test's) is kept as
/// text, and none is empty but the empty one, so equal tokens have equal forms. Not a `str`:
/// read it with [`Token::with_str`], print it, or compare it with a string.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Token(TokenForm);

#[derive(Clone, Default, PartialEq, Eq, Hash)]
enum TokenForm {
    #[default]
    Empty,
    Digits([u8; 16]),
    Text(Box<str>),
}

impl Token {
    pub fn new(text: &str) -> Token {
        if text.is_empty() {
            return Token(TokenForm::Empty);
        }
        let mut bytes = [0u8; 16];
        let lower_hex = text.len() == 32
            && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            && hex::decode_to_slice(text, &mut bytes).is_ok();
        if lower_hex {
            Token(TokenForm::Digits(bytes))
        } else {
            Token(TokenForm::Text(text.into()))
        }
    }

    pub fn is_empty(&self) -> bool {
        matches!(self.0, TokenForm::Empty)
    }

    /// The token as a `str`, for as long as `read` runs (no allocation).
    pub fn with_str<R>(&self, read: impl FnOnce(&str) -> R) -> R {
        match &self.0 {
            TokenForm::Empty => read(""),
            TokenForm::Text(text) => read(text),
            TokenForm::Digits(bytes) => {
                let mut digits = [0u8; 32];
                hex::encode_to_slice(bytes, &mut digits).expect("32 digits for 16 bytes");
                read(std::str::from_utf8(&digits).expect("hex digits are ASCII"))
            }
        }
    }

    /// The 16 bytes of a token of 32 lower-case hex digits.
    pub(crate) fn digits(&self) -> Option<&[u8; 16]> {
        match &self.0 {
            TokenForm::Digits(bytes) => Some(bytes),
            _ => None,
        }
    }
}

impl From<&str> for Token {
    fn from(text: &str) -> Token {
        Token::new(text)
    }
}

impl From<String> for Token {
    fn from(text: String) -> Token {
        Token::new(&text)
    }
}

impl From<&String> for Token {
    fn from(text: &String) -> Token {
        Token::new(text)
    }
}

impl From<&Token> for String {
    fn from(token: &Token) -> String {
        token.to_string()
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with_str(|text| fmt::Display::fmt(text, f))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with_str(|text| fmt::Debug::fmt(text, f))
    }
}

impl PartialEq<str> for Token {
    fn eq(&self, other: &str) -> bool {
        match &self.0 {
            TokenForm::Empty => other.is_empty(),
            TokenForm::Text(text) => &**text == other,
            TokenForm::Digits(_) => other.len() == 32 && *self == Token::new(other),
        }
    }
}

impl PartialEq<&str> for Token {
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

impl PartialEq<String> for Token {
    fn eq(&self, other: &String) -> bool {
        *self == **other
    }
}

impl PartialEq<Token> for &str {
    fn eq(&self, other: &Token) -> bool {
        *other == **self
    }
}

impl PartialEq<Token> for str {
    fn eq(&self, other: &Token) -> bool {
        *other == *self
    }
}

impl PartialEq<Token> for String {
    fn eq(&self, other: &Token) -> bool {
        *other == **self
    }
}

impl Serialize for Token {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.with_str(|text| serializer.serialize_str(text))
    }
}

impl<'de> Deserialize<'de> for Token {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Token, D::Error> {
        String::deserialize(deserializer).map(Token::from)
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

    #[test]
    fn a_token_reads_compares_and_serializes_as_the_string_it_was_made_from() {
        let ours = "0123456789abcdef0123456789abcdef";
        let other = [
            "",
            "tok-a",
            "0123456789ABCDEF0123456789abcdef",
            "0123456789abcdef0123456789abcde",
            "0123456789abcdef0123456789abcdef0",
            "0123456789abcdeg0123456789abcdef",
            "+123456789abcdef0123456789abcdef",
        ];
        assert!(Token::from(ours).digits().is_some());
        for text in std::iter::once(ours).chain(other) {
            let token = Token::from(text);
            assert_eq!(token.to_string(), text);
            assert_eq!(format!("{token:?}"), format!("{text:?}"));
            assert_eq!(token.with_str(str::to_owned), text);
            assert_eq!(token.is_empty(), text.is_empty());
            assert_eq!(
                serde_json::to_string(&token).unwrap(),
                serde_json::to_string(text).unwrap()
            );
            let back: Token = serde_json::from_str(&serde_json::to_string(text).unwrap()).unwrap();
            assert_eq!(back, token);
            for compared in std::iter::once(ours).chain(other) {
                assert_eq!(
                    token == *compared,
                    text == compared,
                    "{text:?} {compared:?}"
                );
                let made = Token::from(compared);
                assert_eq!(token == made, text == compared, "{text:?} {compared:?}");
                assert_eq!(compared == token, text == compared);
            }
            assert_eq!(token.digits().is_some(), text == ours, "{text:?}");
        }
        assert_eq!(std::mem::size_of::<Token>(), 24);
    }
}
