//! The JSON Patch of a granted pod: labels and annotations added to its metadata, written
//! straight to bytes.

use super::{write_json_string, write_json_string_content};

/// Builds a JSON Patch that adds metadata labels and annotations, writing the JSON directly.
#[derive(Debug, Default)]
pub struct MetadataPatch {
    ops: Vec<(&'static str, String, String)>,
}

impl MetadataPatch {
    /// `map` is `labels` or `annotations`; `present` says whether the object has that map.
    pub fn add(&mut self, map: &'static str, present: bool, key: &str, value: &str) {
        let map_present = present || self.ops.iter().any(|(m, k, _)| *m == map && k.is_empty());
        if !map_present {
            self.ops.push((map, String::new(), String::new()));
        }
        self.ops.push((map, key.to_string(), value.to_string()));
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(2 + self.ops.len() * 96);
        out.push(b'[');
        for (i, (map, key, value)) in self.ops.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(br#"{"op":"add","path":"/metadata/"#);
            out.extend_from_slice(map.as_bytes());
            if key.is_empty() {
                out.extend_from_slice(br#"","value":{}}"#);
            } else {
                out.push(b'/');
                write_pointer_token(&mut out, key);
                out.extend_from_slice(br#"","value":"#);
                write_json_string(&mut out, value);
                out.push(b'}');
            }
        }
        out.push(b']');
        out
    }
}

/// Append `key` escaped as a JSON Pointer token and then as JSON string content.
fn write_pointer_token(out: &mut Vec<u8>, key: &str) {
    let mut rest = key;
    while let Some(at) = rest.find(['~', '/']) {
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
