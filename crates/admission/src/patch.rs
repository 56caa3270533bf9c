//! The JSON Patch of a granted pod: labels and annotations added to its metadata, written
//! straight to bytes.

use super::{write_json_string, write_json_string_content};

/// Builds a JSON Patch that adds metadata labels and annotations, writing each operation's
/// JSON as it is added.
#[derive(Debug, Default)]
pub struct MetadataPatch {
    /// `[` and the operations so far, comma-separated (empty before the first)
    json: Vec<u8>,
    /// the maps this patch creates itself (with an `add` of `{}` before their first entry)
    created: Vec<&'static str>,
}

impl MetadataPatch {
    /// `map` is `labels` or `annotations`; `present` says whether the object has that map.
    pub fn add(&mut self, map: &'static str, present: bool, key: &str, value: &str) {
        if !present && !self.created.contains(&map) {
            self.created.push(map);
            self.op(map);
            self.json.extend_from_slice(br#"","value":{}}"#);
        }
        self.op(map);
        self.json.push(b'/');
        write_pointer_token(&mut self.json, key);
        self.json.extend_from_slice(br#"","value":"#);
        write_json_string(&mut self.json, value);
        self.json.push(b'}');
    }

    /// The start of an `add` operation on `map`, up to its path's text so far.
    fn op(&mut self, map: &str) {
        if self.json.is_empty() {
            self.json.reserve(512);
            self.json.push(b'[');
        } else {
            self.json.push(b',');
        }
        self.json
            .extend_from_slice(br#"{"op":"add","path":"/metadata/"#);
        self.json.extend_from_slice(map.as_bytes());
    }

    pub fn is_empty(&self) -> bool {
        self.json.is_empty()
    }

    pub fn to_json(mut self) -> Vec<u8> {
        if self.json.is_empty() {
            self.json.push(b'[');
        }
        self.json.push(b']');
        self.json
    }
}

/// Append `key` escaped as a JSON Pointer token and then as JSON string content.
fn write_pointer_token(out: &mut Vec<u8>, key: &str) {
    let mut rest = key;
    while let Some(at) = rest.bytes().position(|b| b == b'~' || b == b'/') {
        write_json_string_content(out, &rest[..at]);
        out.extend_from_slice(if rest.as_bytes()[at] == b'~' {
            b"~0"
        } else {
            b"~1"
        });
        rest = &rest[at + 1..];
    }
    write_json_string_content(out, rest);
}
