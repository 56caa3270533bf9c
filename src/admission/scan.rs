//! One pass over an AdmissionReview body that checks it is JSON and picks out what a decision
//! reads, skipping the rest (a pod's `spec`, `managedFields`, `userInfo`) without allocating.
//!
//! This is the fast path of [`super::decode`]. Whenever the body holds anything it does not
//! expect (a field of another type, a duplicate field, an escaped key, a `\u` escape, deep
//! nesting, invalid JSON) it gives up with [`Unusual`], and the serde derive decides, with
//! serde's own error message. So the fast path can only agree with serde; tests check it does.

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::{
    GroupVersionKind, Meta, MetaOnly, Operation, RawJson, Request, Review, ScannedMetadata,
};

/// The fast path gives up: the serde path decides.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Unusual;

type Scan<T> = Result<T, Unusual>;

/// Containers nested deeper than this take the serde path (whose own limit is 128; and the
/// skip loop keeps one bit per open container in a `u128`).
const MAX_DEPTH: usize = 100;

/// A byte in every lane of a word, for eight-bytes-at-a-time searches.
const ONES: u64 = 0x0101_0101_0101_0101;

/// The review in `body`, or `Unusual`.
pub(super) fn review(body: &[u8]) -> Scan<Review<'_>> {
    let mut s = Scanner::new(std::str::from_utf8(body).map_err(|_| Unusual)?);
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
                let text = s.raw_value(depth + 1)?;
                meta.owner_references =
                    seen.first(6, serde_json::from_str(text).map_err(|_| Unusual))?;
            }
            _ => s.skip_value(depth + 1)?,
        }
        Ok(())
    })?;
    Ok(meta)
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
        let bytes = self.bytes();
        let mut at = self.at;
        loop {
            match bytes.get(at) {
                Some(b' ' | b'\n' | b'\r' | b'\t') => at += 1,
                next => {
                    self.at = at;
                    return next.copied();
                }
            }
            // the spaces that follow (indentation, when the body is pretty-printed), eight at a time
            while let Some(chunk) = bytes.get(at..at + 8) {
                let not_spaces = u64::from_le_bytes(chunk.try_into().expect("eight bytes"))
                    ^ (ONES * u64::from(b' '));
                if not_spaces != 0 {
                    at += (not_spaces.trailing_zeros() / 8) as usize;
                    break;
                }
                at += 8;
            }
        }
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
        if !self.bytes()[self.at..].starts_with(word) {
            return Err(Unusual);
        }
        self.at += word.len();
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
    /// `\u` escapes (rare; their surrogate rules are subtle) go to serde.
    fn raw_string(&mut self) -> Scan<(&'a str, bool)> {
        if self.peek() != Some(b'"') {
            return Err(Unusual);
        }
        let start = self.at + 1;
        let escaped = self.skip_string()?;
        Ok((&self.text[start..self.at - 1], escaped))
    }

    /// Past the string whose opening quote is at `self.at`; whether it holds escapes.
    #[inline(always)]
    fn skip_string(&mut self) -> Scan<bool> {
        let bytes = self.bytes();
        let mut at = self.at + 1;
        let mut escaped = false;
        loop {
            let stop = string_stop(bytes, at).ok_or(Unusual)?;
            if bytes[stop] == b'"' {
                self.at = stop + 1;
                return Ok(escaped);
            }
            match (bytes[stop], bytes.get(stop + 1)) {
                (b'\\', Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't')) => {
                    at = stop + 2;
                    escaped = true;
                }
                _ => return Err(Unusual), // a control character or another escape
            }
        }
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

    /// Skip one value, checking it is JSON; `depth` counts the containers around it.
    /// One loop, no recursion: this is where most of a pod's bytes go by.
    fn skip_value(&mut self, depth: usize) -> Scan<()> {
        // One bit per open container, innermost lowest: 1 for an object, 0 for an array.
        let mut open: u128 = 0;
        let mut nesting = 0;
        loop {
            // a value
            match self.peek().ok_or(Unusual)? {
                b'"' => drop(self.skip_string()?),
                container @ (b'{' | b'[') => {
                    if depth + nesting >= MAX_DEPTH {
                        return Err(Unusual);
                    }
                    self.at += 1;
                    let is_object = container == b'{';
                    if self.peek() == Some(if is_object { b'}' } else { b']' }) {
                        self.at += 1;
                    } else {
                        open = open << 1 | u128::from(is_object);
                        nesting += 1;
                        if is_object {
                            self.key()?;
                        }
                        continue;
                    }
                }
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                b'-' | b'0'..=b'9' => self.number()?,
                _ => return Err(Unusual),
            }
            // after a value: the next one, or the end of its container
            loop {
                if nesting == 0 {
                    return Ok(());
                }
                let in_object = open & 1 == 1;
                match self.peek() {
                    Some(b',') => {
                        self.at += 1;
                        if in_object {
                            self.key()?;
                        }
                        break;
                    }
                    Some(b'}') if in_object => {}
                    Some(b']') if !in_object => {}
                    _ => return Err(Unusual),
                }
                self.at += 1;
                open >>= 1;
                nesting -= 1;
            }
        }
    }

    /// An object member's key and its colon.
    #[inline(always)]
    fn key(&mut self) -> Scan<()> {
        if self.peek() != Some(b'"') {
            return Err(Unusual);
        }
        self.skip_string()?;
        self.eat(b':')
    }

    /// Skip one value and return its text.
    fn raw_value(&mut self, depth: usize) -> Scan<&'a str> {
        self.peek();
        let start = self.at;
        self.skip_value(depth)?;
        Ok(&self.text[start..self.at])
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
    fn number(&mut self) -> Scan<()> {
        let bytes = self.bytes();
        let digits = |at: usize| {
            let run = bytes[at..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            if run == 0 { Err(Unusual) } else { Ok(at + run) }
        };
        let mut at = self.at;
        if bytes[at] == b'-' {
            at += 1;
        }
        at = match bytes.get(at) {
            Some(b'0') => at + 1,
            _ => digits(at)?,
        };
        if bytes.get(at) == Some(&b'.') {
            at = digits(at + 1)?;
        }
        if matches!(bytes.get(at), Some(b'e' | b'E')) {
            at += 1;
            if matches!(bytes.get(at), Some(b'+' | b'-')) {
                at += 1;
            }
            at = digits(at)?;
        }
        self.at = at;
        Ok(())
    }
}

/// The index of the first `"`, `\\` or control character in `bytes[at..]`, eight bytes at a time.
#[inline(always)]
fn string_stop(bytes: &[u8], mut at: usize) -> Option<usize> {
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // High bit set in each zero byte of `word`. Borrows can flag bytes above a zero byte too,
    // never below one, so the lowest flag is exact, and that is the only one read.
    let zero_bytes = |word: u64| word.wrapping_sub(ONES) & !word & HIGHS;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let stops = zero_bytes(word ^ (ONES * u64::from(b'"')))
            | zero_bytes(word ^ (ONES * u64::from(b'\\')))
            | (word.wrapping_sub(ONES * 0x20) & !word & HIGHS);
        if stops != 0 {
            return Some(at + (stops.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    let tail = bytes.get(at..)?;
    tail.iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .map(|found| at + found)
}

fn unescape(raw: &str) -> Scan<String> {
    serde_json::from_str(&format!("\"{raw}\"")).map_err(|_| Unusual)
}
