//! [`Position`]: where a record sits or a read starts, in the terms of the protocol spoken.

use std::fmt;

/// A position in a stream. The Pico protocol counts records (`Seq`); the Durable Streams
/// protocol hands out opaque offsets (`Offset`) that are only compared and echoed back.
///
/// `From<u64>` and `PartialEq<u64>` keep Pico call sites as short as plain numbers
/// (`client.read(s, 0)`, `assert_eq!(page.next, 4)`); `Display` prints either form as it
/// goes on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Position {
    /// Pico: a record sequence number.
    Seq(u64),
    /// Durable Streams: an offset the server issued, or the sentinels `-1` (the beginning)
    /// and `now` (the tail). The Pico protocol takes `-1` too (`seq=-1`).
    Offset(String),
}

impl Position {
    /// The Durable Streams sentinel for the beginning of a stream.
    pub const DS_BEGINNING: &'static str = "-1";
    /// The Durable Streams sentinel for the current tail.
    pub const DS_NOW: &'static str = "now";

    /// `-1`: a Durable Streams read from the beginning.
    pub fn ds_beginning() -> Position {
        Position::Offset(Position::DS_BEGINNING.into())
    }

    /// `now`: a Durable Streams read from the tail.
    pub fn ds_now() -> Position {
        Position::Offset(Position::DS_NOW.into())
    }

    /// The sequence number of a Pico position.
    pub fn seq(&self) -> Option<u64> {
        match self {
            Position::Seq(seq) => Some(*seq),
            Position::Offset(_) => None,
        }
    }

    /// The offset of a Durable Streams position.
    pub fn offset(&self) -> Option<&str> {
        match self {
            Position::Seq(_) => None,
            Position::Offset(offset) => Some(offset),
        }
    }
}

/// Sequence 0, the Pico beginning: the default of [`crate::ReadPage`] and friends.
impl Default for Position {
    fn default() -> Position {
        Position::Seq(0)
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Position::Seq(seq) => write!(f, "{seq}"),
            Position::Offset(offset) => f.write_str(offset),
        }
    }
}

impl From<u64> for Position {
    fn from(seq: u64) -> Position {
        Position::Seq(seq)
    }
}

impl From<&str> for Position {
    fn from(offset: &str) -> Position {
        Position::Offset(offset.to_owned())
    }
}

impl From<String> for Position {
    fn from(offset: String) -> Position {
        Position::Offset(offset)
    }
}

impl From<&Position> for Position {
    fn from(position: &Position) -> Position {
        position.clone()
    }
}

impl PartialEq<u64> for Position {
    fn eq(&self, seq: &u64) -> bool {
        self.seq() == Some(*seq)
    }
}

impl PartialEq<&str> for Position {
    fn eq(&self, offset: &&str) -> bool {
        self.offset() == Some(*offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_as_on_the_wire() {
        assert_eq!(Position::Seq(42).to_string(), "42");
        assert_eq!(
            Position::from("0000000000000002_0000000000000000").to_string(),
            "0000000000000002_0000000000000000"
        );
        assert_eq!(Position::ds_beginning().to_string(), "-1");
        assert_eq!(Position::ds_now().to_string(), "now");
    }

    #[test]
    fn compares_with_plain_values_of_its_own_kind_only() {
        assert_eq!(Position::from(7), 7);
        assert_ne!(Position::from("7"), 7);
        assert_eq!(Position::from("now"), "now");
        assert_ne!(Position::Seq(0), "0");
        assert_eq!(Position::default(), 0);
    }
}
