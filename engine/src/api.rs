//! What the protocol layers ask of the engine and what they get back.

use bytes::Bytes;

use crate::frame::RecordHeader;
use crate::rules::{ForkOrigin, ProducerTuple, StreamConfig};

/// One record of an append, as decoded by a protocol layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordInput {
    pub headers: Vec<RecordHeader>,
    pub body: Bytes,
}

/// Where a read starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFrom {
    Offset(u64),
    /// This offset, or the stream's first readable one if a trim (or retention) removed it:
    /// a read "from the beginning" starts where the stream now starts instead of failing as
    /// gone. A fork passes its own start on to its source this way.
    AtLeast(u64),
    /// The durable tail at the time of the read (`seq=now`).
    Tail,
}

impl ReadFrom {
    /// The beginning of the stream, wherever it starts now (Pico `seq=-1`, DS `offset=-1`).
    pub const START: ReadFrom = ReadFrom::AtLeast(0);
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadRequest {
    pub from: ReadFrom,
    /// At most this many records (≥ 1).
    pub max_records: usize,
    /// Stop once this many frame bytes were returned (at least one record is always returned).
    pub max_bytes: usize,
    /// Long-poll: when nothing is readable at `from`, wait up to this long for new data.
    pub wait_ms: Option<u64>,
    /// Answer with the stream's content type too (raw reads serve it as theirs).
    pub with_content_type: bool,
    /// A fork reading the records it inherited: only what lies below the bound, and also from
    /// a source that is deleted for clients or expired.
    pub bound: Option<ReadBound>,
}

/// The part of a source stream a fork inherited (see [`ForkOrigin`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadBound {
    pub source_id: u64,
    /// Records below this offset...
    pub until: u64,
    /// ...and this many bytes of record `until` (0: none of it).
    pub partial_bytes: u64,
}

/// A fork as requested: the source, where to fork (default: its tail) and how far into the
/// following data (records of a JSON stream, bytes of the next record otherwise).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForkSpec {
    pub source: String,
    pub offset: Option<u64>,
    /// Bytes of a record within the record, carried by a mid-record offset.
    pub offset_bytes: u64,
    pub sub_offset: u64,
}

/// One append request as the protocols give it.
#[derive(Clone, Debug)]
pub struct AppendRequest {
    pub records: Vec<RecordInput>,
    /// Close the stream after these records (alone: a close-only request).
    pub close: bool,
    /// Apply only if the tail equals this offset.
    pub match_offset: Option<u64>,
    pub producer: Option<ProducerTuple>,
    /// The request's content type, when the protocol requires it to match the stream's.
    pub content_type: Option<String>,
    /// A writer sequence (`Stream-Seq`) that must sort after the last one accepted.
    pub writer_seq: Option<String>,
    /// The protocol checked that each record is one JSON value by [`crate::json::check_value`]
    /// (a Durable Streams JSON-mode append); otherwise the owning core checks, when the stream
    /// is JSON.
    pub json_checked: bool,
}

/// A stream to create: as the protocols give it, a fork's point as requested ([`ForkSpec`]);
/// as its owning core runs it, the point resolved with the source (`CreateRequest<ForkOrigin>`,
/// see `fork.rs`).
#[derive(Clone, Debug)]
pub struct CreateRequest<Fork = ForkSpec> {
    /// For a fork, an empty content type means the source's.
    pub config: StreamConfig,
    pub closed: bool,
    /// Appended right after the create (a create with a body).
    pub records: Vec<RecordInput>,
    /// Create the stream as a fork of another one.
    pub fork: Option<Fork>,
}

/// The answer to a create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created {
    /// `false`: the stream existed already with this configuration (an idempotent create).
    pub created: bool,
    pub info: StreamInfo,
    /// The append of the create's records, when it had some.
    pub first: Option<AppendAck>,
}

/// A stream's externally visible state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamInfo {
    /// Internal id: never reused, so a recreated stream has another.
    pub id: u64,
    pub content_type: String,
    pub ttl_sec: Option<u64>,
    pub expires_at_ms: Option<i64>,
    pub start_offset: u64,
    /// The durable tail: the offset the next record will get once everything is durable.
    pub next_offset: u64,
    pub closed: bool,
    pub retention: pico_meta::Retention,
}

/// A change to a retention policy: each limit given (`Some`) replaces that one, `Some(None)`
/// turning it off; the others stay. Applied on the stream's core to the policy in force
/// then, so concurrent changes of different limits all take effect.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetentionChange {
    pub age_ms: Option<Option<u64>>,
    pub bytes: Option<Option<u64>>,
    pub delete_on_empty_ms: Option<Option<u64>>,
}

impl RetentionChange {
    pub fn apply(&self, to: pico_meta::Retention) -> pico_meta::Retention {
        pico_meta::Retention {
            age_ms: self.age_ms.unwrap_or(to.age_ms),
            bytes: self.bytes.unwrap_or(to.bytes),
            delete_on_empty_ms: self.delete_on_empty_ms.unwrap_or(to.delete_on_empty_ms),
        }
    }
}

/// The acknowledgement of a durable append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendAck {
    /// First offset appended; `None` when no record was appended (close-only).
    pub start_offset: Option<u64>,
    pub next_offset: u64,
    /// The id of the stream the offsets count in ([`StreamInfo::id`]): a stream created again
    /// under the same name has another.
    pub stream_id: u64,
    pub timestamp_ms: Option<i64>,
    /// The stream is closed after this request.
    pub closed: bool,
    /// A producer retry of an applied request: nothing was written; this is the producer's
    /// highest accepted sequence.
    pub duplicate_of_seq: Option<u64>,
}

/// One record as read back; `headers` is the raw headers block (see `frame`), `body` a slice of
/// the stored frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordView {
    pub offset: u64,
    pub timestamp_ms: i64,
    pub headers: Bytes,
    pub body: Bytes,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadBatch {
    /// The resolved start position.
    pub from: u64,
    pub records: Vec<RecordView>,
    /// Position to resume from.
    pub next_offset: u64,
    /// The durable tail when the read was answered.
    pub tail: u64,
    /// The stream is closed and this read reached its end.
    pub closed: bool,
    /// The stream's content type, when the request asked for it.
    pub content_type: Option<String>,
    /// The read starts below a fork point: these records live in the source, ask it (the
    /// batch holds no records then).
    pub inherit: Option<ForkOrigin>,
    /// The batch answers a live read shared by the readers of one core (`live.rs`), numbered
    /// uniquely in this process: batches with the same number are the same answer, so a
    /// protocol can encode it once for all of them. `None` for a read answered alone.
    pub shared_read: Option<u64>,
}

impl ReadBatch {
    pub fn up_to_date(&self) -> bool {
        self.next_offset >= self.tail
    }
}

/// One line of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamSummary {
    pub name: String,
    pub info: StreamInfo,
}
