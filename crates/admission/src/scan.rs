//! One pass over an AdmissionReview body that checks it is JSON and picks out what a decision
//! reads, skipping the rest (a pod's `spec`, `managedFields`, `userInfo`) without allocating:
//! objects and arrays it skips go by a 64-byte block at a time ([`super::skip`]).
//!
//! This is the fast path of [`super::decode`]. Whenever the body holds anything it does not
//! expect (a field of another type, a duplicate field, an escaped key, a `\u` escape, deep
//! nesting, invalid JSON) it gives up with [`Unusual`], and the serde derive decides, with
//! serde's own error message. So the fast path can only agree with serde; tests check it does.

use std::borrow::Cow;
use std::collections::BTreeMap;

use wide::u8x16;

pub(super) use super::lex::Unusual;
use super::lex::{Scan, past_scalar, past_word, string_stop};
use super::skip;
use super::{
    GroupVersionKind, Meta, MetaOnly, Operation, OwnerRef, RawJson, Request, Review,
    ScannedMetadata,
};

/// Containers nested deeper than this take the serde path (whose own limit is 128; and the
/// skip loop keeps one bit per open container in a `u128`).
const MAX_DEPTH: usize = 100;

/// The review in `body`, or `Unusual`.
pub(super) fn review(body: &[u8]) -> Scan<Review<'_>> {
    let mut s = Scanner::new(simdutf8::basic::from_utf8(body).map_err(|_| Unusual)?);
    let mut review = Review {
        api_version: None,
        kind: None,
        request: None,
    };
    let mut seen = Seen::default();
    s.object(|s, key, escaped| {
        if escaped {
            return Err(Unusual); // it may spell a field name
        }
        match key {
            "apiVersion" => review.api_version = seen.first(0, s.opt_string())?,
            "kind" => review.kind = seen.first(1, s.opt_string())?,
            "request" => {
                review.request = seen.first(2, s.nullable(request))?;
            }
            _ => s.skip_value(1)?,
        }
        Ok(())
    })?;
    s.end()?;
    Ok(review)
}

/// The fields of a `metadata` object the webhook reads; `depth` counts the containers around it.
fn metadata(s: &mut Scanner<'_>, depth: usize) -> Scan<Meta> {
    let mut meta = Meta::default();
    let mut seen = Seen::default();
    s.object(|s, key, escaped| {
        if escaped {
            return Err(Unusual);
        }
        let owned = |value: Option<Cow<'_, str>>| value.map(Cow::into_owned);
        match key {
            "name" => meta.name = seen.first(0, s.opt_string().map(owned))?,
            "generateName" => meta.generate_name = seen.first(1, s.opt_string().map(owned))?,
            "namespace" => meta.namespace = seen.first(2, s.opt_string().map(owned))?,
            "uid" => meta.uid = seen.first(3, s.opt_string().map(owned))?,
            "labels" => meta.labels = seen.first(4, s.nullable(Scanner::string_map))?,
            "annotations" => meta.annotations = seen.first(5, s.nullable(Scanner::string_map))?,
            "ownerReferences" => {
                let owners = s.nullable(|s| s.array(|s| owner_reference(s, depth + 2)));
                meta.owner_references = seen.first(6, owners)?;
            }
            _ => s.skip_value(depth + 1)?,
        }
        Ok(())
    })?;
    Ok(meta)
}

/// One of `ownerReferences`; `depth` counts the containers around it.
fn owner_reference(s: &mut Scanner<'_>, depth: usize) -> Scan<OwnerRef> {
    let mut owner = OwnerRef::default();
    let mut seen = Seen::default();
    s.object(|s, key, escaped| {
        if escaped {
            return Err(Unusual);
        }
        match key {
            "apiVersion" => owner.api_version = seen.first(0, s.string())?.into_owned(),
            "kind" => owner.kind = seen.first(1, s.string())?.into_owned(),
            "uid" => owner.uid = seen.first(2, s.string())?.into_owned(),
            "name" => owner.name = seen.first(3, s.string())?.into_owned(),
            "controller" => owner.controller = seen.first(4, s.nullable(Scanner::boolean))?,
            _ => s.skip_value(depth + 1)?,
        }
        Ok(())
    })?;
    Ok(owner)
}

fn request<'a>(s: &mut Scanner<'a>) -> Scan<Request<'a>> {
    let mut uid = None;
    let mut kind = GroupVersionKind::default();
    let mut sub_resource = None;
    let mut name = None;
    let mut namespace = None;
    let mut operation = None;
    let mut object = (None, ScannedMetadata::Absent);
    let mut old_object = (None, ScannedMetadata::Absent);
    let mut dry_run = None;
    let mut options = None;
    let mut user_info = None;
    let mut seen = Seen::default();
    s.object(|s, key, escaped| {
        if escaped {
            return Err(Unusual);
        }
        match key {
            "uid" => uid = Some(seen.first(0, s.string())?),
            "kind" => kind = seen.first(1, group_version_kind(s))?,
            "subResource" => sub_resource = seen.first(2, s.opt_string())?,
            "name" => name = seen.first(3, s.opt_string())?,
            "namespace" => namespace = seen.first(4, s.opt_string())?,
            "operation" => operation = Some(seen.first(5, self::operation(s))?),
            "object" => object = seen.first(6, embedded(s))?,
            "oldObject" => old_object = seen.first(7, embedded(s))?,
            "dryRun" => dry_run = seen.first(8, s.nullable(Scanner::boolean))?,
            "options" => options = seen.first(9, embedded(s))?.0,
            "userInfo" => user_info = seen.first(10, embedded(s))?.0,
            _ => s.skip_value(2)?,
        }
        Ok(())
    })?;
    Ok(Request {
        uid: uid.unwrap_or_default(),
        kind,
        sub_resource,
        name,
        namespace,
        operation: operation.ok_or(Unusual)?,
        object: object.0,
        old_object: old_object.0,
        dry_run,
        options,
        user_info,
        object_metadata: object.1,
        old_object_metadata: old_object.1,
    })
}

fn group_version_kind(s: &mut Scanner<'_>) -> Scan<GroupVersionKind> {
    let mut gvk = GroupVersionKind::default();
    let mut seen = Seen::default();
    s.object(|s, key, escaped| {
        if escaped {
            return Err(Unusual);
        }
        match key {
            "group" => gvk.group = seen.first(0, s.string())?.into_owned(),
            "version" => gvk.version = seen.first(1, s.string())?.into_owned(),
            "kind" => gvk.kind = seen.first(2, s.string())?.into_owned(),
            _ => s.skip_value(3)?,
        }
        Ok(())
    })?;
    Ok(gvk)
}

fn operation(s: &mut Scanner<'_>) -> Scan<Operation> {
    match s.string()?.as_ref() {
        "CREATE" => Ok(Operation::Create),
        "UPDATE" => Ok(Operation::Update),
        "DELETE" => Ok(Operation::Delete),
        "CONNECT" => Ok(Operation::Connect),
        _ => Err(Unusual),
    }
}

/// `object` or `oldObject`: its raw text, and its `metadata` when it is plain.
fn embedded<'a>(s: &mut Scanner<'a>) -> Scan<(Option<RawJson<'a>>, ScannedMetadata)> {
    match s.peek() {
        Some(b'n') => s.literal(b"null").map(|()| (None, ScannedMetadata::Absent)),
        Some(b'{') => {
            let start = s.at;
            let mut scanned = ScannedMetadata::Absent;
            s.object(|s, key, escaped| {
                match (key, escaped, &scanned) {
                    ("metadata", false, ScannedMetadata::Absent) => {
                        s.peek();
                        let at = s.at;
                        scanned = match metadata(s, 4) {
                            Ok(metadata) => ScannedMetadata::Read(MetaOnly { metadata }),
                            Err(Unusual) => {
                                // serde reads it (and words what is wrong with it)
                                s.at = at;
                                s.skip_value(4)?;
                                ScannedMetadata::NotScanned
                            }
                        };
                        return Ok(());
                    }
                    ("metadata", false, _) | (_, true, _) => scanned = ScannedMetadata::NotScanned,
                    _ => {}
                }
                s.skip_value(4)
            })?;
            Ok((Some(RawJson(&s.text[start..s.at])), scanned))
        }
        _ => s
            .raw_value(3)
            .map(|raw| (Some(RawJson(raw)), ScannedMetadata::NotScanned)),
    }
}

/// Which of up to 32 known fields were already read: serde refuses duplicates.
#[derive(Default)]
struct Seen(u32);

impl Seen {
    fn first<T>(&mut self, field: u32, value: Scan<T>) -> Scan<T> {
        let bit = 1 << field;
        if self.0 & bit != 0 {
            return Err(Unusual);
        }
        self.0 |= bit;
        value
    }
}

struct Scanner<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Scanner<'a> {
    fn new(text: &'a str) -> Scanner<'a> {
        Scanner { text, at: 0 }
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// The next byte that is not whitespace (the scanner stops on it).
    #[inline(always)]
    fn peek(&mut self) -> Option<u8> {
        self.at = past_whitespace(self.bytes(), self.at);
        self.bytes().get(self.at).copied()
    }

    #[inline(always)]
    fn eat(&mut self, byte: u8) -> Scan<()> {
        if self.peek() != Some(byte) {
            return Err(Unusual);
        }
        self.at += 1;
        Ok(())
    }

    /// Only whitespace is left.
    fn end(&mut self) -> Scan<()> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(Unusual),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Scan<()> {
        self.peek();
        self.at = past_word(self.bytes(), self.at, word)?;
        Ok(())
    }

    /// `null` is `None`, anything else is read by `read`.
    fn nullable<T>(&mut self, read: impl FnOnce(&mut Self) -> Scan<T>) -> Scan<Option<T>> {
        if self.peek() == Some(b'n') {
            return self.literal(b"null").map(|()| None);
        }
        read(self).map(Some)
    }

    fn boolean(&mut self) -> Scan<bool> {
        match self.peek() {
            Some(b't') => self.literal(b"true").map(|()| true),
            Some(b'f') => self.literal(b"false").map(|()| false),
            _ => Err(Unusual),
        }
    }

    /// A string's text between its quotes, checked, and whether it holds escapes.
    fn raw_string(&mut self) -> Scan<(&'a str, bool)> {
        if self.peek() != Some(b'"') {
            return Err(Unusual);
        }
        let start = self.at + 1;
        let (end, escaped) = past_string(self.bytes(), self.at)?;
        self.at = end;
        Ok((&self.text[start..end - 1], escaped))
    }

    /// A string, unescaped (borrowed when it has no escapes).
    fn string(&mut self) -> Scan<Cow<'a, str>> {
        match self.raw_string()? {
            (raw, false) => Ok(Cow::Borrowed(raw)),
            (raw, true) => unescape(raw).map(Cow::Owned),
        }
    }

    fn opt_string(&mut self) -> Scan<Option<Cow<'a, str>>> {
        self.nullable(Scanner::string)
    }

    /// An object of string values (labels, annotations). A repeated key keeps its last value,
    /// as serde does for maps.
    fn string_map(&mut self) -> Scan<BTreeMap<String, String>> {
        let mut map = BTreeMap::new();
        self.object(|s, key, escaped| {
            let key = if escaped {
                unescape(key)?
            } else {
                key.to_string()
            };
            map.insert(key, s.string()?.into_owned());
            Ok(())
        })?;
        Ok(map)
    }

    /// The members of an object: `member` gets each raw key (and whether it has escapes) and
    /// must read its value.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'a str, bool) -> Scan<()>) -> Scan<()> {
        self.eat(b'{')?;
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        loop {
            let (key, escaped) = self.raw_string()?;
            self.eat(b':')?;
            member(self, key, escaped)?;
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(Unusual),
            }
        }
    }

    /// The items of an array, each read by `item`.
    fn array<T>(&mut self, mut item: impl FnMut(&mut Self) -> Scan<T>) -> Scan<Vec<T>> {
        self.eat(b'[')?;
        let mut items = Vec::new();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(items);
        }
        loop {
            items.push(item(self)?);
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(items);
                }
                _ => return Err(Unusual),
            }
        }
    }

    /// Skip one value, checking it is JSON; `depth` counts the containers around it.
    /// Containers, where most of a pod's bytes go by, are skipped a block at a time.
    fn skip_value(&mut self, depth: usize) -> Scan<()> {
        let bytes = self.bytes();
        let at = past_whitespace(bytes, self.at);
        self.at = match *bytes.get(at).ok_or(Unusual)? {
            b'"' => past_string(bytes, at)?.0,
            b'{' | b'[' => skip::past_container(bytes, at, MAX_DEPTH.saturating_sub(depth))?,
            _ => past_scalar(bytes, at)?,
        };
        Ok(())
    }

    /// Skip one value and return its text.
    fn raw_value(&mut self, depth: usize) -> Scan<&'a str> {
        self.peek();
        let start = self.at;
        self.skip_value(depth)?;
        Ok(&self.text[start..self.at])
    }
}

/// The position of the first byte at or after `at` that is not whitespace.
#[inline(always)]
fn past_whitespace(bytes: &[u8], mut at: usize) -> usize {
    loop {
        // one byte (a newline), then one more (one space alone, after a colon, when the body
        // is pretty-printed, is the common case), then the rest of the indentation sixteen
        // bytes at a time
        for _ in 0..2 {
            match bytes.get(at) {
                Some(b' ' | b'\n' | b'\r' | b'\t') => at += 1,
                _ => return at,
            }
        }
        let space = u8x16::splat(b' ');
        while let Some(chunk) = bytes.get(at..at + 16) {
            let lanes = u8x16::new(chunk.try_into().expect("sixteen bytes"));
            let spaces = lanes.simd_eq(space).to_bitmask().trailing_ones() as usize;
            at += spaces;
            if spaces < 16 {
                break;
            }
        }
    }
}

/// Past the string whose opening quote is at `at`, and whether it holds escapes.
/// `\u` escapes (rare; their surrogate rules are subtle) go to serde.
#[inline(always)]
fn past_string(bytes: &[u8], at: usize) -> Scan<(usize, bool)> {
    let mut at = at + 1;
    let mut escaped = false;
    loop {
        let stop = string_stop(bytes, at).ok_or(Unusual)?;
        match (bytes[stop], bytes.get(stop + 1)) {
            (b'"', _) => return Ok((stop + 1, escaped)),
            (b'\\', Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't')) => {
                at = stop + 2;
                escaped = true;
            }
            _ => return Err(Unusual), // a control character or another escape
        }
    }
}

fn unescape(raw: &str) -> Scan<String> {
    serde_json::from_str(&format!("\"{raw}\"")).map_err(|_| Unusual)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitespace_of_any_length_and_mix_is_skipped_to_the_next_token() {
        for len in 0..50 {
            for mix in [&b" "[..], b"\n", b"\n ", b"\t\r ", b"   \n"] {
                let mut bytes: Vec<u8> = mix.iter().copied().cycle().take(len).collect();
                bytes.push(b'x');
                bytes.extend_from_slice(b"  y");
                assert_eq!(past_whitespace(&bytes, 0), len, "{len} of {mix:?}");
                // and at the end of the text, with nothing after the spaces
                assert_eq!(past_whitespace(&bytes[..len], 0), len);
            }
        }
    }

    #[test]
    fn a_body_that_is_not_utf8_goes_to_serde() {
        assert!(review(b"{\"kind\": \"\xff\"}").is_err());
        assert!(review(b"{\"kind\": \"AdmissionReview\", \"x\": \"\xc3\"}").is_err());
        assert!(review("{\"kind\": \"Admission\u{e9}\"}".as_bytes()).is_ok());
    }
}
