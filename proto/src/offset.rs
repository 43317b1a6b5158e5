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
    format!("{seq:016}_{bytes:016}")
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
