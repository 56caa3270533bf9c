//! Skipping a container (an object or array the decision does not read) sixty-four bytes at a
//! time, checking that it is JSON.
//!
//! The design of simdjson's first stage (simdjson `src/generic/stage1/json_string_scanner.h`
//! and `json_scanner.h`), in safe SIMD: each block of 64 bytes becomes bit masks
//! (quotes, backslashes, whitespace, structural characters, control characters); the quotes not
//! escaped give, by a prefix XOR, which bytes are inside strings; and what is left outside
//! strings is a set of tokens (structural characters, opening quotes, the first byte of each
//! number or literal) that a table-driven state machine walks in order. Only the tokens' own
//! bytes, escapes, numbers and literals are read one at a time; the bytes between tokens are
//! not, and the walk branches on which token comes next only for the rarer ones.
//!
//! It accepts exactly what serde_json accepts inside a container, except that it gives up
//! (`Unusual`) on a `\u` escape and on nesting deeper than its room; tests hold it to serde.
//! Bytes after the container, in its last block, are masked too: a fault among them is not the
//! container's, so only tokens before the first fault may close it.

use wide::u8x16;

use super::lex::{Unusual, past_scalar};

/// Bit masks of one block: bit `i` is the block's byte `i`.
#[derive(Default)]
struct Masks {
    quote: u64,
    backslash: u64,
    whitespace: u64,
    /// `{ } [ ] , :`
    structural: u64,
    /// below 0x20: never allowed inside a string
    control: u64,
}

fn masks(block: &[u8; 64]) -> Masks {
    let splat = u8x16::splat;
    let mut m = Masks::default();
    for (lane, bytes) in block.chunks_exact(16).enumerate() {
        let v = u8x16::new(bytes.try_into().expect("sixteen bytes"));
        // `[` and `{` differ only in bit 0x20, as do `]` and `}`
        let folded = v | splat(0x20);
        let structural = folded.simd_eq(splat(b'{'))
            | folded.simd_eq(splat(b'}'))
            | v.simd_eq(splat(b','))
            | v.simd_eq(splat(b':'));
        let whitespace = v.simd_eq(splat(b' '))
            | v.simd_eq(splat(b'\n'))
            | v.simd_eq(splat(b'\r'))
            | v.simd_eq(splat(b'\t'));
        // a lane is a control character when nothing is left of it after taking 0x1f away
        let control = v.saturating_sub(splat(0x1f)).simd_eq(u8x16::ZERO);
        let shift = 16 * lane;
        let bits = |lanes: u8x16| u64::from(lanes.to_bitmask() as u16) << shift;
        m.quote |= bits(v.simd_eq(splat(b'"')));
        m.backslash |= bits(v.simd_eq(splat(b'\\')));
        m.whitespace |= bits(whitespace);
        m.structural |= bits(structural);
        m.control |= bits(control);
    }
    m
}

/// Bit `i` set when an odd number of bits `0..=i` of `bits` are: with the real quotes, the
/// bytes from an opening quote up to (not including) its closing one.
fn prefix_xor(mut bits: u64) -> u64 {
    for shift in [1, 2, 4, 8, 16, 32] {
        bits ^= bits << shift;
    }
    bits
}

/// The bytes a backslash escapes, given the block's backslashes and whether the previous block
/// ended in a backslash that escapes this block's first byte (updated for the next block).
/// Backslashes are rare in a pod, so this walks them one at a time.
fn escaped_bytes(mut backslash: u64, carry: &mut bool) -> u64 {
    let mut escaped = 0;
    if std::mem::take(carry) {
        escaped = 1;
        backslash &= !1;
    }
    while backslash != 0 {
        let at = backslash.trailing_zeros();
        if at == 63 {
            *carry = true;
        } else {
            // the escaped byte, a backslash itself perhaps, escapes nothing
            escaped |= 2 << at;
            backslash &= !(2 << at);
        }
        backslash &= backslash - 1;
    }
    escaped
}

/// Of the block's escaped bytes, those that are not one of `" \ / b f n r t` (`\u`, the other
/// valid escape, is left to serde).
fn bad_escapes(block: &[u8; 64], mut escaped: u64) -> u64 {
    let mut bad = 0;
    while escaped != 0 {
        let at = escaped.trailing_zeros();
        if !matches!(
            block[at as usize],
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't'
        ) {
            bad |= 1 << at;
        }
        escaped &= escaped - 1;
    }
    bad
}

/// Where the walk is in the grammar: what it expects next, times two, plus one inside an
/// object (a comma and a closing bracket mean different things there).
type State = u8;
/// after `:`, or `,` in an array
const VALUE: State = 0;
/// after `[`
const VALUE_OR_CLOSE: State = 2;
/// after `{`
const KEY_OR_CLOSE: State = 4;
/// after `,` in an object
const KEY: State = 6;
/// after a key
const COLON: State = 8;
/// after a value
const COMMA_OR_CLOSE: State = 10;
const STATES: usize = 12;

/// Tokens by their first byte: `"`, `:`, `,`, `{`, `[`, `}`, `]`, the first byte of a number or
/// literal, anything else.
const CLASSES: usize = 9;
const CLASS: [u8; 256] = {
    let mut class = [8; 256];
    let mut byte = 0;
    while byte < 256 {
        class[byte] = match byte as u8 {
            b'"' => 0,
            b':' => 1,
            b',' => 2,
            b'{' => 3,
            b'[' => 4,
            b'}' => 5,
            b']' => 6,
            b't' | b'f' | b'n' | b'-' | b'0'..=b'9' => 7,
            _ => 8,
        };
        byte += 1;
    }
    class
};

// A state is kept multiplied by CLASSES, its row in [`SINGLE`]; a row is odd exactly when its
// state is (in an object) only while CLASSES is odd.
const _: () = assert!(CLASSES % 2 == 1);

/// A state's row in [`SINGLE`]: the walk keeps this, so that finding the next state is one
/// addition and one load (the chain every token waits on).
const fn row(state: State) -> u8 {
    state * CLASSES as u8
}

/// Entries at or above this are not a row but one of the steps below.
const STEP: u8 = row(STATES as u8);
const OPEN_OBJECT: u8 = STEP;
const OPEN_ARRAY: u8 = STEP + 1;
const CLOSE: u8 = STEP + 2;
const SCALAR: u8 = STEP + 3;
const INVALID: u8 = STEP + 4;

/// The next state's row, or a step, after a token of `class` in `state`.
const fn single(state: State, class: usize) -> u8 {
    let (expect, in_object) = (state & !1, state & 1);
    let closes = match expect {
        COMMA_OR_CLOSE => true,
        KEY_OR_CLOSE => in_object == 1,
        VALUE_OR_CLOSE => in_object == 0,
        _ => false,
    };
    match (expect, class) {
        (VALUE | VALUE_OR_CLOSE, 0) => row(COMMA_OR_CLOSE + in_object),
        (VALUE | VALUE_OR_CLOSE, 3) => OPEN_OBJECT,
        (VALUE | VALUE_OR_CLOSE, 4) => OPEN_ARRAY,
        (VALUE | VALUE_OR_CLOSE, 7) => SCALAR,
        (KEY | KEY_OR_CLOSE, 0) => row(COLON + in_object),
        (COLON, 1) => row(VALUE + in_object),
        (COMMA_OR_CLOSE, 2) if in_object == 1 => row(KEY + 1),
        (COMMA_OR_CLOSE, 2) => row(VALUE),
        (_, 5) if closes && in_object == 1 => CLOSE,
        (_, 6) if closes && in_object == 0 => CLOSE,
        _ => INVALID,
    }
}

/// [`single`] as a table, by row plus class: the walk does not branch on which token comes
/// next (that cannot be predicted), only on the rarer steps. Padded to any byte plus any byte,
/// so that indexing it needs no bounds check in the chain every token waits on.
const SINGLE: [u8; 512] = {
    let mut table = [INVALID; 512];
    let mut state = 0;
    while state < STATES {
        let mut class = 0;
        while class < CLASSES {
            table[state * CLASSES + class] = single(state as State, class);
            class += 1;
        }
        state += 1;
    }
    table
};

/// The state carried from one block to the next.
struct Walk {
    /// the state's row in [`SINGLE`]
    row: u8,
    /// one bit per open container, innermost lowest: 1 for an object, 0 for an array
    open: u128,
    nesting: usize,
    room: usize,
    in_string: u64,
    escape_carry: bool,
    scalar_carry: u64,
}

impl Walk {
    /// One token at `at` of class `class`; `Some(end)` once the outermost container closed.
    #[inline(always)]
    fn token(&mut self, bytes: &[u8], at: usize, class: usize) -> Result<Option<usize>, Unusual> {
        let next = SINGLE[usize::from(self.row) + class];
        if next < STEP {
            self.row = next;
            return Ok(None);
        }
        let in_object = self.row & 1;
        self.row = match next {
            OPEN_OBJECT | OPEN_ARRAY => {
                if self.nesting >= self.room {
                    return Err(Unusual);
                }
                self.nesting += 1;
                let object = next == OPEN_OBJECT;
                self.open = self.open << 1 | u128::from(object);
                match object {
                    true => row(KEY_OR_CLOSE + 1),
                    false => row(VALUE_OR_CLOSE),
                }
            }
            CLOSE => {
                self.open >>= 1;
                self.nesting -= 1;
                if self.nesting == 0 {
                    return Ok(Some(at + 1));
                }
                row(COMMA_OR_CLOSE + (self.open & 1) as u8)
            }
            SCALAR => {
                scalar(bytes, at)?;
                row(COMMA_OR_CLOSE + in_object)
            }
            _ => return Err(Unusual),
        };
        Ok(None)
    }
}

/// A number or literal starting at `at`, which must end where a token or whitespace does.
fn scalar(bytes: &[u8], at: usize) -> Result<(), Unusual> {
    match bytes.get(past_scalar(bytes, at)?) {
        Some(b' ' | b'\n' | b'\r' | b'\t' | b',' | b':' | b'"' | b'{' | b'}' | b'[' | b']') => {
            Ok(())
        }
        _ => Err(Unusual),
    }
}

/// Past the object or array whose opening byte is at `at`, checking it is JSON; `room` is how
/// many containers may still open (this one included).
pub(super) fn past_container(bytes: &[u8], at: usize, room: usize) -> Result<usize, Unusual> {
    let mut walk = Walk {
        row: row(VALUE),
        open: 0,
        nesting: 0,
        room,
        in_string: 0,
        escape_carry: false,
        scalar_carry: 0,
    };
    let mut start = at;
    while start < bytes.len() {
        let block: [u8; 64] = match bytes.get(start..start + 64) {
            Some(full) => full.try_into().expect("sixty-four bytes"),
            None => {
                // the text's last bytes, padded with whitespace
                let mut padded = [b' '; 64];
                padded[..bytes.len() - start].copy_from_slice(&bytes[start..]);
                padded
            }
        };
        let m = masks(&block);
        let escaped = if m.backslash | u64::from(walk.escape_carry) != 0 {
            escaped_bytes(m.backslash, &mut walk.escape_carry)
        } else {
            0
        };
        let quote = m.quote & !escaped;
        let inside = prefix_xor(quote) ^ walk.in_string;
        walk.in_string = ((inside as i64) >> 63) as u64;
        // a control character in a string, a backslash out of one, or an unknown escape
        let mut faults = (m.control & inside) | (m.backslash & !inside);
        if escaped != 0 {
            faults |= bad_escapes(&block, escaped);
        }
        let scalar = !(inside | quote | m.whitespace | m.structural);
        let scalar_starts = scalar & !(scalar << 1 | walk.scalar_carry);
        walk.scalar_carry = scalar >> 63;
        let mut tokens = (m.structural & !inside) | (quote & inside) | scalar_starts;
        if faults != 0 {
            // the container may still end before the first fault (what follows it is not
            // this container's to judge)
            tokens &= (faults & faults.wrapping_neg()) - 1;
        }
        while tokens != 0 {
            let i = tokens.trailing_zeros() as usize;
            tokens &= tokens - 1;
            let class = usize::from(CLASS[usize::from(block[i])]);
            if let Some(end) = walk.token(bytes, start + i, class)? {
                return Ok(end);
            }
        }
        if faults != 0 {
            return Err(Unusual);
        }
        start += 64;
    }
    Err(Unusual)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::de::IgnoredAny;

    /// Where serde_json's first value in `text` ends, if it is one.
    fn serde_end(text: &str) -> Option<usize> {
        let mut values = serde_json::Deserializer::from_str(text).into_iter::<IgnoredAny>();
        match values.next() {
            Some(Ok(_)) => Some(values.byte_offset()),
            _ => None,
        }
    }

    fn depth(text: &str) -> usize {
        let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0, false, false);
        for byte in text.bytes() {
            match (in_string, escaped, byte) {
                (true, true, _) => escaped = false,
                (true, false, b'\\') => escaped = true,
                (true, false, b'"') | (false, _, b'"') => in_string = !in_string,
                (false, _, b'{' | b'[') => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                (false, _, b'}' | b']') => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        deepest
    }

    /// The skip either gives up or ends where serde's value does; where serde's value is a
    /// container it could skip (no `\u`, not too deep), it does.
    fn assert_agrees(text: &str, pad: usize, room: usize) {
        let padded = format!("{}{text}", " ".repeat(pad));
        let fast = past_container(padded.as_bytes(), pad, room).map(|end| end - pad);
        let serde = serde_end(text);
        match (fast, serde) {
            (Ok(end), Some(serde)) => assert_eq!(end, serde, "{text:?}"),
            (Ok(end), None) => panic!("skipped {end} bytes serde refuses: {text:?}"),
            (Err(Unusual), Some(end)) => assert!(
                text[..end].contains("\\u") || depth(&text[..end]) > room,
                "gave up on what serde reads: {text:?}"
            ),
            (Err(Unusual), None) => {}
        }
    }

    fn json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            (-1e6..1e6f64).prop_map(serde_json::Value::from),
            "[ -~\\n\\t\"\\\\/é]{0,80}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(6, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
                prop::collection::btree_map("[a-z\"\\\\]{0,12}", inner, 0..6)
                    .prop_map(|map| serde_json::Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn skips_what_serde_reads_and_refuses_what_it_refuses(
            value in json(),
            pretty in any::<bool>(),
            edits in prop::collection::vec((0.0..1.0f64, prop::sample::select(vec![
                "", "\"", "\\", "{", "}", "[", "]", ",", ":", "0", "-", ".", "e", "+", "n",
                "t", "f", " ", "\n", "\u{1}", "\t", "é", "null", "\\u0041", "x", "/",
            ])), 0..3),
            pad in 0..64usize,
            tail in prop::sample::select(vec!["", " ", ",\"k\":1}", "]", "x"]),
        ) {
            let value = serde_json::json!([value]);
            let mut text = if pretty {
                serde_json::to_string_pretty(&value).unwrap()
            } else {
                value.to_string()
            };
            for (at, edit) in edits {
                // never the opening bracket: the skip is only asked about containers
                crate::tests::damage(&mut text, at, edit, 1);
            }
            text.push_str(tail);
            assert_agrees(&text, pad, 100);
        }
    }

    #[test]
    fn backslash_runs_escape_across_block_boundaries() {
        for run in 0..6 {
            for at in 50..80 {
                for after in ["\"", "n", "u0041", "x"] {
                    let filler = "a".repeat(at);
                    let backslashes = "\\".repeat(run);
                    let text = format!("[\"{filler}{backslashes}{after}\", 1]");
                    for pad in [0, 1, 63] {
                        assert_agrees(&text, pad, 100);
                    }
                }
            }
        }
    }

    #[test]
    fn strings_numbers_and_literals_that_straddle_blocks() {
        for at in 55..70 {
            let filler = " ".repeat(at);
            for value in [
                "\"a b c d e f g h\"",
                "-12.5e+3",
                "true",
                "false",
                "null",
                "tru",
                "1.",
                "01",
            ] {
                assert_agrees(&format!("[{filler}{value}]"), 0, 100);
                assert_agrees(&format!("{{{filler}\"k\" : {value} }}"), 0, 100);
            }
        }
    }

    #[test]
    fn nesting_beyond_its_room_gives_up() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(past_container(deep(3).as_bytes(), 0, 3), Ok(6));
        assert_eq!(past_container(deep(4).as_bytes(), 0, 3), Err(Unusual));
        assert_eq!(past_container(deep(100).as_bytes(), 0, 100), Ok(200));
        assert_eq!(past_container(b"[{\"a\":[{}]}]", 0, 4), Ok(12));
        assert_eq!(past_container(b"[{\"a\":[{}]}]", 0, 3), Err(Unusual));
    }

    #[test]
    fn a_container_the_text_never_closes_gives_up() {
        for text in [
            "[", "{", "[1,", "{\"a\":", "[\"abc", "[\"a\\", "[1", "{\"a\":1",
        ] {
            assert_eq!(
                past_container(text.as_bytes(), 0, 100),
                Err(Unusual),
                "{text}"
            );
        }
    }
}
