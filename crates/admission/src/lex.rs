//! The bytes of JSON that both the scanner ([`super::scan`]) and the block skip
//! ([`super::skip`]) read one at a time, or sixteen at a time: literals, numbers, and where a
//! string's plain run stops.

use wide::u8x16;

/// The fast path gives up: the serde path decides.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Unusual;

pub(super) type Scan<T> = Result<T, Unusual>;

/// Past `word` (`true`, `false`, `null`), which must start at `at`.
#[inline(always)]
pub(super) fn past_word(bytes: &[u8], at: usize, word: &[u8]) -> Scan<usize> {
    match bytes[at..].starts_with(word) {
        true => Ok(at + word.len()),
        false => Err(Unusual),
    }
}

/// Past the number at `at`: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
pub(super) fn past_number(bytes: &[u8], mut at: usize) -> Scan<usize> {
    let digits = |at: usize| {
        let run = bytes[at..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if run == 0 { Err(Unusual) } else { Ok(at + run) }
    };
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
    Ok(at)
}

/// Past the number or literal starting at `at`, or `Unusual` when no number or literal starts
/// there.
pub(super) fn past_scalar(bytes: &[u8], at: usize) -> Scan<usize> {
    match bytes.get(at) {
        Some(b't') => past_word(bytes, at, b"true"),
        Some(b'f') => past_word(bytes, at, b"false"),
        Some(b'n') => past_word(bytes, at, b"null"),
        Some(b'-' | b'0'..=b'9') => past_number(bytes, at),
        _ => Err(Unusual),
    }
}

/// The index of the first `"`, `\\` or control character in `bytes[at..]`, sixteen bytes at a
/// time.
#[inline(always)]
pub(super) fn string_stop(bytes: &[u8], mut at: usize) -> Option<usize> {
    let (quote, backslash, last_control) =
        (u8x16::splat(b'"'), u8x16::splat(b'\\'), u8x16::splat(0x1f));
    while let Some(chunk) = bytes.get(at..at + 16) {
        let lanes = u8x16::new(chunk.try_into().expect("sixteen bytes"));
        // a lane is a control character when nothing is left of it after taking 0x1f away
        let stops = lanes.simd_eq(quote)
            | lanes.simd_eq(backslash)
            | lanes.saturating_sub(last_control).simd_eq(u8x16::ZERO);
        let mask = stops.to_bitmask();
        if mask != 0 {
            return Some(at + mask.trailing_zeros() as usize);
        }
        at += 16;
    }
    let tail = bytes.get(at..)?;
    tail.iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .map(|found| at + found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where a byte at a time would stop: the reference for the sixteen-lane search.
    fn stop_one_at_a_time(bytes: &[u8], at: usize) -> Option<usize> {
        (at..bytes.len()).find(|&i| matches!(bytes[i], b'"' | b'\\' | 0..=0x1f))
    }

    #[test]
    fn a_string_stops_at_its_first_quote_backslash_or_control_character_in_any_lane() {
        for len in 0..40 {
            for stop in [b'"', b'\\', 0x00, 0x1f, b'\n'] {
                for place in 0..=len {
                    let mut bytes = vec![b'a'; len];
                    // a byte just above each stop class, which must not stop the search
                    bytes.extend_from_slice(b" #]\x7f\xc3\xa9");
                    if place < len {
                        bytes[place] = stop;
                    }
                    for from in [0, 1.min(len)] {
                        assert_eq!(
                            string_stop(&bytes, from),
                            stop_one_at_a_time(&bytes, from),
                            "len {len}, {stop:#x} at {place}, from {from}"
                        );
                    }
                }
            }
        }
    }
}
