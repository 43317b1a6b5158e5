//! The Durable Streams offset: the text of `Stream-Next-Offset` and of a read's `offset`.
//!
//! ```text
//! SSSSSSSSSSSSSSSS_BBBBBBBBBBBBBBBB    seq and byte position, 16 zero-padded decimal digits each
//! -1                                   the beginning of the stream
//! now                                  its tail
//! ```
//!
//! Clients treat offsets as opaque and compare them as strings: the padding makes the string
//! order the stream order.

/// A parsed offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offset {
    /// `-1`: the beginning.
    Start,
    /// `now`: the tail.
    Now,
    At {
        seq: u64,
        bytes: u64,
    },
}

/// The offset of record `seq`, `bytes` into its data.
pub fn format(seq: u64, bytes: u64) -> String {
    let mut out = Vec::with_capacity(OFFSET_TEXT_BYTES);
    format_into(&mut out, seq, bytes);
    // Digits and `_` only.
    String::from_utf8(out).unwrap_or_default()
}

/// The length of an offset's text while both numbers fit in 16 digits.
const OFFSET_TEXT_BYTES: usize = 33;

/// The offset of record `seq`, `bytes` into its data, appended to `out`: each number in at
/// least 16 digits, zero-padded, so offsets sort as strings (`format!` is several times
/// slower, and an SSE response writes one per event).
pub fn format_into(out: &mut Vec<u8>, seq: u64, bytes: u64) {
    padded(out, seq);
    out.push(b'_');
    padded(out, bytes);
}

/// `n` in decimal, zero-padded to 16 digits (more when it needs them: up to 20).
fn padded(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [b'0'; 20];
    let mut start = digits.len();
    while n > 0 {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    out.extend_from_slice(&digits[start.min(digits.len() - 16)..]);
}

/// Parses an offset; `None` for anything else (the caller names the text in its 400).
pub fn parse(text: &str) -> Option<Offset> {
    match text {
        "-1" => return Some(Offset::Start),
        "now" => return Some(Offset::Now),
        _ => {}
    }
    let (seq, bytes) = text.split_once('_')?;
    // Digits only (no sign, no spaces), at most as many as a u64 has.
    let number = |part: &str| {
        (!part.is_empty() && part.len() <= 20 && part.bytes().all(|b| b.is_ascii_digit()))
            .then(|| part.parse::<u64>().ok())
            .flatten()
    };
    Some(Offset::At {
        seq: number(seq)?,
        bytes: number(bytes)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_written_as_format_writes_them() {
        for n in [
            0,
            1,
            9,
            10,
            12,
            999_999,
            10u64.pow(15),
            10u64.pow(16) - 1,
            10u64.pow(16),
        ]
        .into_iter()
        .chain([10u64.pow(19), u64::MAX - 1, u64::MAX])
        {
            assert_eq!(format(n, n), std::format!("{n:016}_{n:016}"));
            assert_eq!(format(n, 7), std::format!("{n:016}_0000000000000007"));
        }
    }

    #[test]
    fn offsets_round_trip_and_sort_as_strings() {
        assert_eq!(format(12, 3), "0000000000000012_0000000000000003");
        for (seq, bytes) in [(0, 0), (1, 99), (u64::MAX, u64::MAX)] {
            assert_eq!(parse(&format(seq, bytes)), Some(Offset::At { seq, bytes }));
        }
        assert!(format(9, 0) < format(10, 0));
        assert_eq!(parse("-1"), Some(Offset::Start));
        assert_eq!(parse("now"), Some(Offset::Now));
        for bad in [
            "",
            "_",
            "1_",
            "_1",
            "+1_0",
            "1_-0",
            " 1_0",
            "1_0_0",
            "18446744073709551616_0",
            "x",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
