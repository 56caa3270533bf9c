//! JSON as Go's `encoding/json` reads it into a struct: what `json.Unmarshal` accepts and how it
//! matches keys to fields, for the annotations the CNIs and Multus read with it (Multus's
//! `k8s.v1.cni.cncf.io/networks`, [`super::networks`]).
//!
//! The rules, from Go's `src/encoding/json` (`scanner.go`, `decode.go`, `fold.go`):
//! - the syntax is RFC 8259's, with at most 10,000 nested arrays and objects
//!   (`maxNestingDepth`), checked over the whole value before any of it is stored;
//! - a key names a field when it equals the field's name under Unicode simple case folding:
//!   ASCII letters in either case, and `ſ` (U+017F) for `s`, `K` (U+212A, the Kelvin sign) for
//!   `k`; when several keys name one field, the last one's value is the field's;
//! - a key that names no field is skipped, its value checked only as JSON;
//! - `null` leaves a string or number field as it was, and empties a list, map or pointer;
//!   a list is decoded in place into the slice a field already holds, so a `null` item keeps
//!   what an earlier list of the field left at its index;
//! - a value of the wrong type (a number for a string, `1.5` for an `int`) fails the whole
//!   `Unmarshal` (Go stores what it can and returns the first such error; every caller here
//!   refuses on it);
//! - a string's escapes are decoded; a `\u` escape of a lone UTF-16 surrogate is U+FFFD.
//!
//! The reader never builds a value tree: it walks the text once, borrowing strings without
//! escapes, and hands each member of an object to its caller, which skips what it does not read.

use std::borrow::Cow;
use std::ops::Range;

/// Go's `maxNestingDepth` (`encoding/json/scanner.go`).
pub(crate) const MAX_DEPTH: usize = 10_000;

/// Why Go's `json.Unmarshal` refuses a value: where, and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GoJsonError {
    pub(crate) at: usize,
    pub(crate) what: String,
}

impl std::fmt::Display for GoJsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (at byte {})", self.what, self.at)
    }
}

pub(crate) type GoJson<T> = Result<T, GoJsonError>;

/// The kind of JSON value that starts at a position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Bool => "a bool",
            Kind::Number => "a number",
            Kind::String => "a string",
            Kind::Array => "a list",
            Kind::Object => "an object",
        }
    }
}

/// A cursor over a JSON text, with the nesting depth of where it stands.
pub(crate) struct Reader<'a> {
    text: &'a str,
    at: usize,
    depth: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(text: &'a str) -> Reader<'a> {
        Reader {
            text,
            at: 0,
            depth: 0,
        }
    }

    pub(crate) fn position(&self) -> usize {
        self.at
    }

    pub(crate) fn error<T>(&self, what: impl Into<String>) -> GoJson<T> {
        Err(GoJsonError {
            at: self.at,
            what: what.into(),
        })
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// Past JSON whitespace (space, tab, CR, LF: no other).
    pub(crate) fn skip_space(&mut self) {
        while let Some(b' ' | b'\t' | b'\r' | b'\n') = self.bytes().get(self.at) {
            self.at += 1;
        }
    }

    /// The kind of the value at the cursor (after whitespace), without reading it.
    pub(crate) fn peek(&mut self) -> GoJson<Kind> {
        self.skip_space();
        match self.bytes().get(self.at) {
            Some(b'n') => Ok(Kind::Null),
            Some(b't' | b'f') => Ok(Kind::Bool),
            Some(b'-' | b'0'..=b'9') => Ok(Kind::Number),
            Some(b'"') => Ok(Kind::String),
            Some(b'[') => Ok(Kind::Array),
            Some(b'{') => Ok(Kind::Object),
            Some(&other) => self.error(format!("{:?} cannot start a value", other as char)),
            None => self.error("the text ends where a value should be"),
        }
    }

    /// Nothing but whitespace is left.
    pub(crate) fn end(&mut self) -> GoJson<()> {
        self.skip_space();
        if self.at == self.text.len() {
            Ok(())
        } else {
            self.error("more text after the value")
        }
    }

    fn expect(&mut self, byte: u8) -> GoJson<()> {
        self.skip_space();
        if self.bytes().get(self.at) == Some(&byte) {
            self.at += 1;
            Ok(())
        } else {
            self.error(format!("expected {:?}", byte as char))
        }
    }

    fn enter(&mut self) -> GoJson<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.error(format!("nested deeper than {MAX_DEPTH} lists and objects"));
        }
        Ok(())
    }

    /// Read `null`, `true` or `false`.
    fn word(&mut self) -> GoJson<()> {
        for word in ["null", "true", "false"] {
            if self.text[self.at..].starts_with(word) {
                self.at += word.len();
                return Ok(());
            }
        }
        self.error("not a value")
    }

    /// The text of the number at the cursor: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    pub(crate) fn number(&mut self) -> GoJson<&'a str> {
        self.skip_space();
        let start = self.at;
        let bytes = self.bytes();
        let digits = |at: usize| {
            bytes[at..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count()
        };
        let mut at = start;
        if bytes.get(at) == Some(&b'-') {
            at += 1;
        }
        match bytes.get(at) {
            Some(b'0') => at += 1,
            Some(b'1'..=b'9') => at += digits(at),
            _ => return self.error("not a number"),
        }
        if bytes.get(at) == Some(&b'.') {
            let run = digits(at + 1);
            if run == 0 {
                self.at = at + 1;
                return self.error("a number with no digit after its '.'");
            }
            at += 1 + run;
        }
        if let Some(b'e' | b'E') = bytes.get(at) {
            at += 1;
            if let Some(b'+' | b'-') = bytes.get(at) {
                at += 1;
            }
            let run = digits(at);
            if run == 0 {
                self.at = at;
                return self.error("a number with no digit in its exponent");
            }
            at += run;
        }
        self.at = at;
        Ok(&self.text[start..at])
    }

    /// The string at the cursor, its escapes decoded as Go's `unquote` does.
    pub(crate) fn string(&mut self) -> GoJson<Cow<'a, str>> {
        self.expect(b'"')?;
        let start = self.at;
        let bytes = self.bytes();
        let mut at = start;
        // the plain run: no escape, nothing to copy
        while let Some(&b) = bytes.get(at) {
            match b {
                b'"' => {
                    self.at = at + 1;
                    return Ok(Cow::Borrowed(&self.text[start..at]));
                }
                b'\\' => break,
                0..=0x1f => {
                    self.at = at;
                    return self.error("a control character inside a string");
                }
                _ => at += 1,
            }
        }
        let mut decoded = String::from(&self.text[start..at]);
        self.at = at;
        self.escaped_rest(&mut decoded)?;
        Ok(Cow::Owned(decoded))
    }

    /// The rest of a string from its first escape, into `out`; past the closing quote.
    fn escaped_rest(&mut self, out: &mut String) -> GoJson<()> {
        loop {
            let rest = &self.text[self.at..];
            let run = rest
                .bytes()
                .position(|b| b == b'"' || b == b'\\' || b < 0x20)
                .ok_or(GoJsonError {
                    at: self.text.len(),
                    what: "a string that never ends".into(),
                })?;
            out.push_str(&rest[..run]);
            self.at += run;
            match self.bytes()[self.at] {
                b'"' => {
                    self.at += 1;
                    return Ok(());
                }
                b'\\' => self.escape(out)?,
                _ => return self.error("a control character inside a string"),
            }
        }
    }

    /// One escape at the cursor (its backslash), decoded into `out`.
    fn escape(&mut self, out: &mut String) -> GoJson<()> {
        let simple = match self.bytes().get(self.at + 1) {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                let unit = self.hex4(self.at + 2)?;
                self.at += 6;
                out.push(self.utf16(unit));
                return Ok(());
            }
            _ => {
                return self.error(
                    "an escape Go does not know (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)",
                );
            }
        };
        out.push(simple);
        self.at += 2;
        Ok(())
    }

    fn hex4(&self, at: usize) -> GoJson<u16> {
        self.text
            .get(at..at + 4)
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|h| u16::from_str_radix(h, 16).ok())
            .ok_or(GoJsonError {
                at,
                what: "\\u not followed by four hex digits".into(),
            })
    }

    /// The character of UTF-16 unit `unit` (already read), reading the low half of a surrogate
    /// pair when one follows as a `\u` escape; a lone surrogate is U+FFFD, as Go makes it.
    fn utf16(&mut self, unit: u16) -> char {
        if let Some(c) = char::from_u32(u32::from(unit)) {
            return c;
        }
        if (0xd800..0xdc00).contains(&unit)
            && self.text[self.at..].starts_with("\\u")
            && let Ok(low) = self.hex4(self.at + 2)
            && (0xdc00..0xe000).contains(&low)
        {
            self.at += 6;
            let code = 0x10000 + ((u32::from(unit) - 0xd800) << 10) + (u32::from(low) - 0xdc00);
            return char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER);
        }
        char::REPLACEMENT_CHARACTER
    }

    /// Past one value of any kind, checked as JSON. With `as_float`, every number in it must
    /// fit a float64, as Go requires of a number it stores in an `interface{}`.
    pub(crate) fn skip(&mut self, as_float: bool) -> GoJson<()> {
        // whether each open container is an object, innermost last
        let mut open: Vec<bool> = Vec::new();
        loop {
            let kind = self.peek()?;
            match kind {
                Kind::Array | Kind::Object => {
                    let object = kind == Kind::Object;
                    let (start, end) = if object { (b'{', b'}') } else { (b'[', b']') };
                    if !self.open(start, end)? {
                        open.push(object);
                        if object {
                            self.member_key()?;
                        }
                        continue;
                    }
                }
                Kind::String => {
                    self.string()?;
                }
                Kind::Number => {
                    let text = self.number()?;
                    if as_float && !text.parse::<f64>().is_ok_and(f64::is_finite) {
                        return self.error(format!("number {text} does not fit a float64"));
                    }
                }
                Kind::Null | Kind::Bool => self.word()?,
            }
            // after a value: close what ends here, or go on to the next member or item
            loop {
                let Some(&object) = open.last() else {
                    return Ok(());
                };
                if !self.after_item(if object { b'}' } else { b']' })? {
                    if object {
                        self.member_key()?;
                    }
                    break;
                }
                open.pop();
            }
        }
    }

    /// A member's key and its `:`.
    fn member_key(&mut self) -> GoJson<Cow<'a, str>> {
        self.skip_space();
        if self.bytes().get(self.at) != Some(&b'"') {
            return self.error("an object key must be a string");
        }
        let key = self.string()?;
        self.expect(b':')?;
        Ok(key)
    }

    /// Past the `open` of a container at the cursor, one level deeper; `true` when it closes
    /// at once (and is left).
    fn open(&mut self, open: u8, close: u8) -> GoJson<bool> {
        self.expect(open)?;
        self.enter()?;
        self.skip_space();
        Ok(self.closes(close))
    }

    /// Whether the container ends at the cursor with `close` (then left, one level up).
    fn closes(&mut self, close: u8) -> bool {
        if self.bytes().get(self.at) == Some(&close) {
            self.at += 1;
            self.depth -= 1;
            return true;
        }
        false
    }

    /// After a member or item: `true` past the container's `close`, `false` past a `,`.
    fn after_item(&mut self, close: u8) -> GoJson<bool> {
        self.skip_space();
        if self.closes(close) {
            return Ok(true);
        }
        match self.bytes().get(self.at) {
            Some(b',') => {
                self.at += 1;
                Ok(false)
            }
            _ => self.error(format!("expected ',' or {:?}", close as char)),
        }
    }

    /// Read an object at the cursor: `member` is called with each key, the cursor at its value,
    /// and must read or skip that value. Returns the object's span.
    pub(crate) fn object(
        &mut self,
        mut member: impl FnMut(&mut Reader<'a>, Member<'a>) -> GoJson<()>,
    ) -> GoJson<Range<usize>> {
        self.skip_space();
        let start = self.at;
        let mut done = self.open(b'{', b'}')?;
        while !done {
            self.skip_space();
            let key_start = self.at;
            let key = self.member_key()?;
            member(
                self,
                Member {
                    key,
                    start: key_start,
                },
            )?;
            done = self.after_item(b'}')?;
        }
        Ok(start..self.at)
    }

    /// Read a list at the cursor: `item` is called with the cursor at each item's value, and
    /// must read or skip it.
    pub(crate) fn array(
        &mut self,
        mut item: impl FnMut(&mut Reader<'a>) -> GoJson<()>,
    ) -> GoJson<()> {
        let mut done = self.open(b'[', b']')?;
        while !done {
            item(self)?;
            done = self.after_item(b']')?;
        }
        Ok(())
    }

    /// `null` at the cursor is read and gives `true`; anything else is left for the caller.
    pub(crate) fn null(&mut self) -> GoJson<bool> {
        if self.peek()? == Kind::Null {
            self.word()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// A Go `string` field's value: a string, or `None` for `null` (the field stays as it
    /// was); anything else fails `Unmarshal`.
    pub(crate) fn string_field(&mut self, field: &str) -> GoJson<Option<Cow<'a, str>>> {
        match self.peek()? {
            Kind::Null => self.word().map(|()| None),
            Kind::String => self.string().map(Some),
            other => self.error(format!("{field:?} is {}, not a string", other.name())),
        }
    }

    /// A Go `int` field's value (`strconv.ParseInt` of the number's text: no fraction, no
    /// exponent, within 64 bits); `null` leaves it as it was.
    pub(crate) fn int_field(&mut self, field: &str) -> GoJson<()> {
        match self.peek()? {
            Kind::Null => self.word(),
            Kind::Number => {
                let text = self.number()?;
                match text.parse::<i64>() {
                    Ok(_) => Ok(()),
                    Err(_) => self.error(format!("{field:?} is {text}, not an integer")),
                }
            }
            other => self.error(format!("{field:?} is {}, not an integer", other.name())),
        }
    }
}

/// One member of an object, its key decoded; `start` is where its key begins.
pub(crate) struct Member<'a> {
    pub(crate) key: Cow<'a, str>,
    pub(crate) start: usize,
}

impl Member<'_> {
    /// Whether the key names the field `field` (an ASCII name) as Go matches keys.
    pub(crate) fn names(&self, field: &str) -> bool {
        folds_to(&self.key, field)
    }
}

/// Whether `key` equals the ASCII field name `field` under Unicode simple case folding, as Go's
/// `encoding/json` matches a key to a field (`fold.go`): the only characters outside ASCII
/// that fold to an ASCII letter are `ſ` (to `s`) and the Kelvin sign `K` (to `k`).
pub(crate) fn folds_to(key: &str, field: &str) -> bool {
    let mut field = field.bytes();
    for c in key.chars() {
        let Some(f) = field.next() else {
            return false;
        };
        let same = match c {
            '\u{17f}' => f.eq_ignore_ascii_case(&b's'),
            '\u{212a}' => f.eq_ignore_ascii_case(&b'k'),
            c if c.is_ascii_alphabetic() => f.eq_ignore_ascii_case(&(c as u8)),
            c => c.is_ascii() && f == c as u8,
        };
        if !same {
            return false;
        }
    }
    field.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skip(text: &str) -> GoJson<()> {
        let mut reader = Reader::new(text);
        reader.skip(true)?;
        reader.end()
    }

    #[test]
    fn keys_fold_as_go_folds_them() {
        for (key, field) in [
            ("name", "name"),
            ("Name", "name"),
            ("NAME", "name"),
            ("IPS", "ips"),
            ("ipſ", "ips"),
            ("iPſ", "ips"),
            ("namespace", "namespace"),
            ("NameSpace", "namespace"),
            ("nameſpace", "namespace"),
            ("cni-args", "cni-args"),
            ("CNI-ARGS", "cni-args"),
            ("deviceid", "deviceID"),
        ] {
            assert!(folds_to(key, field), "{key} {field}");
        }
        for (key, field) in [
            ("names", "name"),
            ("nam", "name"),
            ("nąme", "name"),
            ("ip", "ips"),
            ("cni_args", "cni-args"),
            ("ıps", "ips"),
            ("İps", "ips"),
            ("", "ips"),
        ] {
            assert!(!folds_to(key, field), "{key} {field}");
        }
        assert!(folds_to("\u{212a}", "k"));
    }

    #[test]
    fn strings_decode_as_go_decodes_them() {
        let read = |text: &str| Reader::new(text).string().map(Cow::into_owned);
        assert_eq!(read(r#""plain""#).unwrap(), "plain");
        assert_eq!(read(r#""n\u0061me""#).unwrap(), "name");
        assert_eq!(
            read(r#""\"\\\/\b\f\n\r\t""#).unwrap(),
            "\"\\/\u{8}\u{c}\n\r\t"
        );
        assert_eq!(read(r#""\ud83d\ude00""#).unwrap(), "😀");
        assert_eq!(read(r#""\ud800x""#).unwrap(), "\u{fffd}x");
        assert_eq!(read(r#""\udc00""#).unwrap(), "\u{fffd}");
        assert_eq!(read(r#""\ud800\u0041""#).unwrap(), "\u{fffd}A");
        assert_eq!(read(r#""\ud800\ud800""#).unwrap(), "\u{fffd}\u{fffd}");
        assert_eq!(read("\"é\"").unwrap(), "é");
        for bad in [
            r#""\x""#,
            r#""\'""#,
            r#""\u12""#,
            "\"a\nb\"",
            r#""open"#,
            r#""a\"#,
        ] {
            assert!(read(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn skipping_checks_the_syntax_go_checks() {
        for good in [
            "null",
            "true",
            "-0",
            "1.5e+3",
            r#"{"a":[1,{"b":null}],"c":{}}"#,
            "[]",
            " [ 1 , 2 ] ",
            "1e-400",
        ] {
            assert_eq!(skip(good), Ok(()), "{good}");
        }
        for bad in [
            "01",
            "+1",
            ".5",
            "1.",
            "1e",
            "[1,]",
            "{,}",
            r#"{"a"}"#,
            r#"{"a":1,}"#,
            "[1 2]",
            "nul",
            "True",
            "'a'",
            "[",
            "{\"a\":1",
            "1e400",
            "-1e400",
            "\u{feff}1",
            "[1]x",
        ] {
            assert!(skip(bad).is_err(), "{bad}");
        }
        // an unknown field's number need not fit a float64
        let mut reader = Reader::new("1e400");
        assert_eq!(reader.skip(false), Ok(()));
    }

    #[test]
    fn nesting_stops_at_gos_depth() {
        let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert_eq!(skip(&nested(MAX_DEPTH)), Ok(()));
        let too_deep = skip(&nested(MAX_DEPTH + 1)).unwrap_err();
        assert!(too_deep.what.contains("nested deeper"), "{too_deep}");
        let objects = format!(
            "{}1{}",
            r#"{"a":"#.repeat(MAX_DEPTH + 1),
            "}".repeat(MAX_DEPTH + 1)
        );
        assert!(skip(&objects).is_err());
    }

    #[test]
    fn integers_are_what_parse_int_takes() {
        let int = |text: &str| Reader::new(text).int_field("hostPort");
        for good in [
            "0",
            "-0",
            "9223372036854775807",
            "-9223372036854775808",
            "null",
        ] {
            assert_eq!(int(good), Ok(()), "{good}");
        }
        for bad in ["1.0", "1e2", "9223372036854775808", "\"1\"", "true", "[1]"] {
            assert!(int(bad).is_err(), "{bad}");
        }
    }
}
