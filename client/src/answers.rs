//! The values the client's calls take and answer: a retention policy, a stream's `HEAD`, the
//! acknowledgement of an append (plain or as a producer), a listing, a read page.

use bytes::Bytes;
use reqwest::RequestBuilder;

use crate::codec::Record;
use crate::position::Position;

/// Default stream content type, as the server assumes without a `Content-Type`.
pub const DEFAULT_CONTENT_TYPE: &str = pico_proto::media::OCTET_STREAM;

/// A stream's retention policy as the Pico protocol carries it (docs/api.md, Retention).
/// In a request, `None` leaves a limit as it is (or the server's default, at create) and
/// `Some(0)` turns it off; in an answer, `None` means off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Records older than this many seconds become unreadable.
    pub age_secs: Option<u64>,
    /// The oldest records go once the stream stores more than this many bytes.
    pub bytes: Option<u64>,
    /// An empty stream with no write for this many seconds is deleted.
    pub delete_on_empty_secs: Option<u64>,
}

impl Retention {
    pub fn is_empty(&self) -> bool {
        *self == Retention::default()
    }

    pub(crate) fn headers(&self, mut request: RequestBuilder) -> RequestBuilder {
        let named = [
            ("Pico-Retention-Age", self.age_secs),
            ("Pico-Retention-Bytes", self.bytes),
            ("Pico-Delete-On-Empty", self.delete_on_empty_secs),
        ];
        for (name, value) in named {
            if let Some(value) = value {
                request = request.header(name, value.to_string());
            }
        }
        request
    }
}

/// `HEAD` of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamInfo {
    /// First readable position: a sequence that moves up with trims (Pico), or always `-1`
    /// (Durable Streams reports no start, and the beginning is always readable).
    pub start: Position,
    /// Durable tail: the sequence the next record will get, or the tail offset.
    pub next: Position,
    pub closed: bool,
    pub content_type: Option<String>,
    /// Sliding idle expiry, seconds, if set.
    pub ttl_secs: Option<u64>,
    /// Absolute expiry (RFC 3339), if set.
    pub expires_at: Option<String>,
}

/// Acknowledgement of an append that wrote records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendAck {
    /// Sequence of the first record of the request. Durable Streams reports only the new
    /// tail, so there it equals `next`.
    pub start: Position,
    /// Stream tail after the request.
    pub next: Position,
    /// Server timestamp (epoch ms) shared by all records of the request; Pico only.
    pub timestamp: Option<i64>,
}

/// Answer to an idempotent producer's append ([`Client::append_as_producer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerAck {
    /// Sequence of the first record written; `None` for a duplicate (nothing was written).
    pub start: Option<u64>,
    /// Stream tail after the request.
    pub next: u64,
    /// Server timestamp of the records, if any were written.
    pub timestamp: Option<i64>,
    /// On a duplicate, the producer's highest accepted sequence; else the one sent.
    pub producer_seq: Option<u64>,
    /// The stream is closed.
    pub closed: bool,
}

impl ProducerAck {
    /// The server had already applied this request (or a later one of the producer).
    pub fn is_duplicate(&self) -> bool {
        self.start.is_none()
    }
}

/// One stream of a listing (`GET /`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedStream {
    pub name: String,
    pub content_type: String,
    pub start: u64,
    pub next: u64,
    pub closed: bool,
    pub ttl_secs: Option<u64>,
    pub expires_at: Option<String>,
    /// The node that owns the stream, in a cluster's listing (`owner_node`).
    pub owner_node: Option<u64>,
}

/// One page of a listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamList {
    pub streams: Vec<ListedStream>,
    /// More streams match: continue with `start_after` = the last name.
    pub has_more: bool,
}

/// One read response.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadPage {
    /// The records read (Pico). Always empty with Durable Streams, which has no record
    /// framing: see `chunk`.
    pub records: Vec<Record>,
    /// Durable Streams: the bytes of the response (the messages back to back, or a JSON
    /// array of them on `application/json` streams); `None` when it held no message.
    pub chunk: Option<Bytes>,
    /// Where to continue reading.
    pub next: Position,
    /// The page reaches the durable tail.
    pub up_to_date: bool,
    /// The stream is closed and the page reaches its end: nothing more will ever come.
    pub closed: bool,
    /// Long-poll cursor to echo in the next poll (`Pico-Cursor` / `Stream-Cursor`).
    pub cursor: Option<String>,
}

impl ReadPage {
    /// Nothing was read: no record and no chunk.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.chunk.is_none()
    }

    /// What was read as `(position, body)` pairs: each record at its sequence, or the one
    /// Durable Streams chunk at the offset after it (the only position the protocol gives).
    pub fn entries(&self) -> Vec<(Position, &Bytes)> {
        let records = self
            .records
            .iter()
            .map(|record| (Position::Seq(record.seq), &record.body));
        let chunk = self.chunk.iter().map(|chunk| (self.next.clone(), chunk));
        records.chain(chunk).collect()
    }
}
