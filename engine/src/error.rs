//! Typed engine errors: the causes any operation on a stream can meet, and each operation's
//! own on top of them. The protocol layers map every variant to a status code in one
//! exhaustive `match` per type (no catch-all arm). Every cause is a typed value its caller
//! can match; the text a client reads is made here, by `Display`.

use std::sync::Arc;

use pico_meta::{MetaError, NodeId};
use pico_s3::StoreError;

use crate::frame::FrameError;
use crate::health::WalFault;
use crate::json::JsonError;

/// What can stop any operation on a stream; each operation's own error type adds the causes
/// only it has ([`AppendError`], [`ReadError`], [`CreateError`], [`TrimError`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// No such stream (never created, deleted, or expired).
    NotFound,
    /// Deleted while forks still read it: gone for clients, and its name stays taken.
    Gone,
    /// A named limit was hit; try again after the given seconds.
    Overloaded {
        limit: &'static str,
        retry_after_sec: u64,
    },
    /// The metadata log or object store failed, or what they hold does not add up.
    Storage(StorageFault),
    /// The node is shutting down.
    ShuttingDown,
    /// Another node of the cluster owns the stream: ask it (`307` to its listener of the
    /// request's protocol: `address` for Pico, `ds_address` for Durable Streams).
    Moved {
        node: u32,
        address: String,
        ds_address: String,
    },
    /// This node cannot serve the stream right now (its lease lapsed, the stream is moving,
    /// or its owner is not known yet). Retry shortly.
    NotOwner(NotOwnerReason),
}

/// What failed beneath an operation: the metadata log, the object store, or the bytes they
/// hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageFault {
    /// The metadata log failed.
    Meta(MetaError),
    /// The object store could not return a range of the segment stored at `key`.
    Object { key: String, error: StoreError },
    /// The object at `key` is not in the bucket, while a stream's records still lie in it.
    ObjectMissing { key: String },
    /// A chunk names a segment this core no longer holds.
    SegmentGone { segment: u64 },
    /// A chunk names an open segment that is no longer in the WAL's log.
    OpenSegmentGone,
    /// The uploaded segment at `key` is shorter (`size` bytes) than its catalog entry says.
    SegmentShort { key: String, size: u64 },
    /// Block `index` of the uploaded segment at `key` ends before the segment does.
    BlockShort { key: String, index: usize },
    /// A frame of the segment stored at `key` did not decode, or failed its CRC.
    CorruptFrame { key: String, error: FrameError },
    /// The catalog places record `offset` of stream `stream_id` in the segment at `key`, and
    /// the bytes it names there hold no such record (a damaged catalog row, or a segment that
    /// is not the one the row was written for): never read past as if it were not written.
    RecordMissing {
        key: String,
        stream_id: u64,
        offset: u64,
    },
    /// No catalog entry places record `offset` of stream `stream_id`, below its tail, while
    /// later records have one (a damaged catalog row).
    RecordUnplaced { stream_id: u64, offset: u64 },
    /// The fork source `source` holds fewer records than its forks inherited.
    ForkSourceShort { source: String },
    /// A fork's read from its own first offset named its source again.
    ForkReadLoop { fork: String },
}

impl StorageFault {
    /// Whether the stored bytes themselves are damaged (a frame failing its CRC, an object
    /// shorter than the catalog says, or gone while records lie in it): asking again finds
    /// the same stored bytes, so the answer is a server error to report, not an outage to
    /// wait out.
    pub fn is_damage(&self) -> bool {
        matches!(
            self,
            StorageFault::CorruptFrame { .. }
                | StorageFault::RecordMissing { .. }
                | StorageFault::RecordUnplaced { .. }
                | StorageFault::ObjectMissing { .. }
                | StorageFault::SegmentShort { .. }
                | StorageFault::BlockShort { .. }
                | StorageFault::Object {
                    error: StoreError::Short { .. },
                    ..
                }
        )
    }

    /// Whether the metadata log's disk (or quota) is full: nothing was written, and it heals
    /// once space is freed.
    pub fn is_out_of_space(&self) -> bool {
        matches!(self, StorageFault::Meta(MetaError::OutOfSpace(_)))
    }
}

impl EngineError {
    /// Whether this is damage of the stored bytes ([`StorageFault::is_damage`]).
    pub fn is_damage(&self) -> bool {
        matches!(self, EngineError::Storage(fault) if fault.is_damage())
    }
}

/// Why this node cannot serve a stream right now; each is retried by the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotOwnerReason {
    /// Node `node` (this one) does not hold its cluster lease.
    NoLease { node: NodeId },
    /// Node `node` serves the stream, and this node does not redirect (`--routing local`).
    LocalRouting { node: NodeId },
    /// Node `node` serves the stream, and its listener is not known yet.
    OwnerUnreachable { node: NodeId },
    /// The stream has no owner yet.
    NoOwnerYet,
    /// `stream`'s owner (none, or a node) does not renew its lease, and no node took it over
    /// yet.
    OwnerLapsed {
        stream: String,
        owner: Option<NodeId>,
    },
    /// The stream changed hands while it was being created.
    ChangedHandsDuringCreate,
    /// The stream is being handed to another node.
    Moving,
    /// The stream moved to another node.
    MovedAway,
    /// The stream moved to another node before this append was stored: it was not appended.
    MovedBeforeStored,
    /// The stream moved before the original of this retried request was stored.
    MovedBeforeRetryStored,
    /// The stream is being deleted (empty past its delete-on-empty time).
    Retiring,
    /// The stream was just loaded again on this node.
    Reloaded,
    /// Appends to a stream this core let go are still on their way to the catalog, which the
    /// stream's state is loaded from once they are committed or refused.
    Unsettled,
    /// The metadata log fenced this node's write (another node or a newer incarnation took
    /// over); the metadata store's message.
    Fenced(String),
    /// Whether a metadata write was stored is unknown (the metadata store's message): the
    /// stream is read back from the metadata log before it takes anything.
    OutcomeUnknown(String),
}

/// Why an append failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendError {
    Engine(EngineError),
    /// The stream is closed: no more records.
    Closed {
        next_offset: u64,
    },
    /// An append's content type differs from the stream's.
    ContentTypeMismatch {
        expected: String,
    },
    /// An append's writer sequence does not sort after the last accepted one.
    WriterSeqRegression {
        last: String,
    },
    /// A conditional append (`match_seq`) did not match the tail.
    MatchFailed {
        expected: u64,
        actual: u64,
    },
    /// An idempotent producer wrote with an epoch older than the stream has seen.
    StaleProducerEpoch {
        current: u64,
    },
    /// A producer this stream has never seen did not start at sequence 0.
    UnknownProducer {
        received: u64,
    },
    /// An idempotent producer skipped sequence numbers.
    ProducerSequenceGap {
        expected: u64,
        received: u64,
    },
    /// A new idempotent producer found no room: `scope` ("this stream", "this node") keeps
    /// `limit` producers, and one idle for `idle_expiry_sec` makes room.
    TooManyProducers {
        scope: &'static str,
        limit: usize,
        idle_expiry_sec: u64,
    },
    /// The request itself is invalid.
    Invalid(InvalidAppend),
    /// The data could not be made durable (`fault`: the WAL's failure, as reported when it
    /// happened); the append is not acknowledged. `retry`: the request is a producer's retry
    /// of one that failed so.
    Durability {
        fault: WalFault,
        retry: bool,
    },
    /// The WAL's filesystem has no room for this append (`fault`: why its next file cannot be
    /// made); retry once space is freed (the node resumes on its own).
    OutOfSpace {
        fault: WalFault,
    },
    /// This core takes no appends now (`fault`: the WAL's failure), until `until`.
    WritesStopped {
        fault: WalFault,
        until: Resume,
    },
}

/// Why an append request is invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InvalidAppend {
    /// No records and no close.
    EmptyBody,
    /// A producer's new epoch did not start at sequence 0.
    NewEpochNotAtZero,
    /// The producer id is longer than `max` bytes.
    ProducerIdTooLong { max: usize },
    /// The writer sequence (`Stream-Seq`) is longer than `max` bytes.
    WriterSeqTooLong { max: usize },
    /// More than `max` records in one append.
    TooManyRecords { max: usize },
    /// Record `record` of a JSON stream is not one JSON value.
    NotJson {
        record: usize,
        error: Arc<JsonError>,
    },
}

/// When a core whose WAL cannot take appends takes them again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// After a restart (the WAL failed: what it holds is read back by recovery).
    Restart,
    /// Once its next WAL file can be made (retried on its own).
    NextFile,
}

/// Why a read failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    Engine(EngineError),
    /// A read asked for a position past the tail.
    OffsetBeyondTail {
        requested: u64,
        tail: u64,
    },
    /// A read asked for a position below the first readable record.
    OffsetGone {
        requested: u64,
        start: u64,
    },
}

/// Why a create (or a fork's acquisition of its source) failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateError {
    Engine(EngineError),
    /// The name is registered with another configuration (`next_offset`: its tail).
    ConfigMismatch {
        reason: Mismatch,
        next_offset: u64,
    },
    /// A fork was asked of a deleted source.
    SourceGone,
    /// The request itself is invalid.
    Invalid(InvalidCreate),
    /// The create's first records (a create with a body) were refused.
    Append(AppendError),
    /// A fork's source could not be read at the fork point (a mid-record fork).
    ForkPoint(ReadError),
}

/// How a create differs from the stream that holds its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// A deleted stream that live forks still read holds the name.
    DeletedWithForks,
    /// An expired stream that live forks still read holds the name.
    ExpiredWithForks,
    /// Another TTL, expiry, or closed state.
    Config,
    /// Another fork origin (or none).
    ForkOrigin,
    /// Another content type: the stream's is `existing`.
    ContentType { existing: String },
    /// A fork's content type differs from its source's, `source`.
    ForkContentType { source: String },
}

/// Why a create (or fork) request is invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InvalidCreate {
    /// `Stream-Fork-Offset` carries a byte position this server never issues.
    ForeignForkOffset,
    /// The fork offset is past the source's tail.
    ForkPastTail { tail: u64 },
    /// `Stream-Fork-Sub-Offset` counts past the JSON source's last message.
    SubOffsetPastLastMessage,
    /// `Stream-Fork-Sub-Offset` with no record after the fork offset.
    SubOffsetWithoutRecord,
    /// `Stream-Fork-Sub-Offset` past the end of the record it splits.
    SubOffsetPastRecord,
    /// A TTL over `max` seconds.
    TtlTooLarge { max: u64 },
    /// The source is a fork at the deepest a chain may be, `max`.
    ForkTooDeep { max: u32 },
}

/// Why a trim failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrimError {
    Engine(EngineError),
    /// The stream's live forks read through its records: they keep them while they exist
    /// (its retention is paused for the same reason).
    ReadByForks {
        forks: u64,
    },
}

/// Why a core's engine did not start.
#[derive(Debug)]
pub enum StartError {
    /// Its first WAL file could not be made: the file and the filesystem's answer, shown as
    /// `/ready` would show them.
    WalFile(WalFault),
    /// Its inbox task could not be spawned.
    Inbox {
        core: usize,
        source: glommio::GlommioError<()>,
    },
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::WalFile(fault) => fault.fmt(f),
            StartError::Inbox { core, source } => {
                write!(f, "cannot start core {core} inbox: {source}")
            }
        }
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StartError::WalFile(fault) => Some(fault),
            StartError::Inbox { source, .. } => Some(source),
        }
    }
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::NotFound => f.write_str("no such stream"),
            EngineError::Gone => f.write_str("stream was deleted"),
            EngineError::Overloaded { limit, .. } => write!(f, "overloaded: {limit}"),
            EngineError::Storage(cause) => write!(f, "storage: {cause}"),
            EngineError::ShuttingDown => f.write_str("the node is shutting down"),
            EngineError::Moved { node, .. } => {
                write!(f, "the stream is served by node {node}")
            }
            EngineError::NotOwner(reason) => reason.fmt(f),
        }
    }
}

impl std::fmt::Display for StorageFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StorageFault::Meta(e) => e.fmt(f),
            StorageFault::Object { key, error } => write!(f, "reading {key}: {error}"),
            StorageFault::ObjectMissing { key } => write!(
                f,
                "segment object {key} is missing from the bucket, and records still lie in it"
            ),
            StorageFault::SegmentGone { segment } => write!(f, "segment {segment} is gone"),
            StorageFault::OpenSegmentGone => f.write_str("open segment vanished"),
            StorageFault::SegmentShort { key, size } => write!(
                f,
                "segment {key} is shorter ({size} bytes) than its catalog entry"
            ),
            StorageFault::BlockShort { key, index } => {
                write!(
                    f,
                    "block {index} of segment {key} is shorter than the segment"
                )
            }
            StorageFault::CorruptFrame { key, error } => {
                write!(f, "corrupt frame in segment object {key}: {error:?}")
            }
            StorageFault::RecordMissing {
                key,
                stream_id,
                offset,
            } => write!(
                f,
                "segment {key} does not hold record {offset} of stream {stream_id}, which its \
                 catalog entry places there"
            ),
            StorageFault::RecordUnplaced { stream_id, offset } => write!(
                f,
                "no catalog entry places record {offset} of stream {stream_id}, below its tail, \
                 while later records have one"
            ),
            StorageFault::ForkSourceShort { source } => write!(
                f,
                "fork source {source} holds fewer records than its forks inherited"
            ),
            StorageFault::ForkReadLoop { fork } => write!(
                f,
                "{fork}: a read from its own first offset named its source again"
            ),
        }
    }
}

impl std::fmt::Display for NotOwnerReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotOwnerReason::NoLease { node } => write!(
                f,
                "node {node} does not hold its cluster lease (the metadata database is \
                 unreachable, or a newer incarnation took over); retry"
            ),
            NotOwnerReason::LocalRouting { node } => write!(
                f,
                "the stream is served by node {node} (this node runs --routing local)"
            ),
            NotOwnerReason::OwnerUnreachable { node } => write!(
                f,
                "the stream is served by node {node}, which is not reachable yet; retry"
            ),
            NotOwnerReason::NoOwnerYet => f.write_str("the stream has no owner yet; retry"),
            NotOwnerReason::OwnerLapsed { stream, owner } => {
                write!(f, "stream {stream} is owned by ")?;
                match owner {
                    Some(node) => write!(f, "node {node}")?,
                    None => f.write_str("no node")?,
                }
                f.write_str(", which does not renew its lease, and no node took it over yet; retry")
            }
            NotOwnerReason::ChangedHandsDuringCreate => {
                f.write_str("the stream changed hands while it was created; retry")
            }
            NotOwnerReason::Moving => f.write_str("the stream is moving to another node; retry"),
            NotOwnerReason::MovedAway => f.write_str("the stream moved to another node; retry"),
            NotOwnerReason::MovedBeforeStored => f.write_str(
                "the stream moved to another node before this append was stored; it was not \
                 appended",
            ),
            NotOwnerReason::MovedBeforeRetryStored => {
                f.write_str("the stream moved before the original of this retry was stored; retry")
            }
            NotOwnerReason::Retiring => f.write_str(
                "the stream is being deleted (empty past its delete-on-empty time); retry",
            ),
            NotOwnerReason::Reloaded => {
                f.write_str("the stream was just loaded again on this node; retry")
            }
            NotOwnerReason::Unsettled => f.write_str(
                "appends this node took before it let the stream go are still on their way to \
                 the metadata log; retry",
            ),
            NotOwnerReason::Fenced(message) => write!(f, "{message}; retry"),
            NotOwnerReason::OutcomeUnknown(message) => write!(
                f,
                "whether this change was stored is unknown ({message}); the stream is read \
                 back from the metadata log before it takes anything; retry"
            ),
        }
    }
}

impl std::fmt::Display for AppendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppendError::Engine(e) => e.fmt(f),
            AppendError::Closed { .. } => f.write_str("stream is closed"),
            AppendError::ContentTypeMismatch { expected } => {
                write!(f, "content type does not match the stream's ({expected})")
            }
            AppendError::WriterSeqRegression { last } => {
                write!(f, "Stream-Seq must sort after the last one ({last})")
            }
            AppendError::MatchFailed { expected, actual } => {
                write!(f, "match failed: expected tail {expected}, actual {actual}")
            }
            AppendError::StaleProducerEpoch { .. } => f.write_str("Stale producer epoch"),
            AppendError::ProducerSequenceGap { .. } => f.write_str("Producer sequence gap"),
            // Kept word for word: clients recognise this case by the message.
            AppendError::UnknownProducer { .. } => {
                f.write_str("New epoch must start with sequence 0")
            }
            AppendError::TooManyProducers {
                scope,
                limit,
                idle_expiry_sec,
            } => write!(
                f,
                "{scope} keeps {limit} idempotent producers, the most it may: a new producer is \
                 refused until one has been idle for {idle_expiry_sec} s"
            ),
            AppendError::Invalid(why) => why.fmt(f),
            AppendError::Durability { fault, retry } => {
                write!(f, "append not durable: {fault}")?;
                if *retry {
                    f.write_str(
                        "; the original of this request was not acknowledged and may be found \
                         at most once after a restart",
                    )?;
                }
                Ok(())
            }
            AppendError::OutOfSpace { fault } => {
                write!(f, "out of space: {fault}; {}", Resume::NextFile)
            }
            AppendError::WritesStopped { fault, until } => {
                write!(f, "writes stopped: {fault}; {until}")
            }
        }
    }
}

impl std::fmt::Display for InvalidAppend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InvalidAppend::EmptyBody => f.write_str("empty body"),
            // Kept word for word: clients recognise this case by the message.
            InvalidAppend::NewEpochNotAtZero => f.write_str("New epoch must start with sequence 0"),
            InvalidAppend::ProducerIdTooLong { max } => {
                write!(f, "producer id longer than {max} bytes")
            }
            InvalidAppend::WriterSeqTooLong { max } => {
                write!(f, "Stream-Seq longer than {max} bytes")
            }
            InvalidAppend::TooManyRecords { max } => write!(f, "at most {max} records per append"),
            InvalidAppend::NotJson { record, error } => write!(
                f,
                "record {record}: a record of this application/json stream must be one JSON \
                 value ({error})"
            ),
        }
    }
}

impl std::fmt::Display for Resume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Resume::Restart => "this core takes appends again after a restart",
            Resume::NextFile => "appends resume once it can be made",
        })
    }
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Engine(e) => e.fmt(f),
            ReadError::OffsetBeyondTail { requested, tail } => {
                write!(f, "offset {requested} is past the tail {tail}")
            }
            ReadError::OffsetGone { requested, start } => {
                write!(
                    f,
                    "offset {requested} is below the first readable offset {start}"
                )
            }
        }
    }
}

impl std::fmt::Display for CreateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CreateError::Engine(e) => e.fmt(f),
            CreateError::ConfigMismatch { reason, .. } => reason.fmt(f),
            CreateError::SourceGone => f.write_str("fork source was deleted"),
            CreateError::Invalid(why) => why.fmt(f),
            CreateError::Append(e) => e.fmt(f),
            CreateError::ForkPoint(e) => e.fmt(f),
        }
    }
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mismatch::DeletedWithForks => {
                f.write_str("a deleted stream with live forks still holds this name")
            }
            Mismatch::ExpiredWithForks => {
                f.write_str("an expired stream with live forks still holds this name")
            }
            Mismatch::Config => f.write_str("stream exists with a different configuration"),
            Mismatch::ForkOrigin => f.write_str("stream exists with a different fork origin"),
            Mismatch::ContentType { existing } => {
                write!(f, "stream exists with content type {existing}")
            }
            Mismatch::ForkContentType { source } => {
                write!(f, "fork content type differs from the source's ({source})")
            }
        }
    }
}

impl std::fmt::Display for InvalidCreate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InvalidCreate::ForeignForkOffset => {
                f.write_str("Stream-Fork-Offset is not an offset this server issued")
            }
            InvalidCreate::ForkPastTail { tail } => {
                write!(f, "fork offset is past the source's tail ({tail})")
            }
            InvalidCreate::SubOffsetPastLastMessage => {
                f.write_str("Stream-Fork-Sub-Offset is past the source's last message")
            }
            InvalidCreate::SubOffsetWithoutRecord => {
                f.write_str("Stream-Fork-Sub-Offset needs a record after the fork offset")
            }
            InvalidCreate::SubOffsetPastRecord => {
                f.write_str("Stream-Fork-Sub-Offset is past the end of the record")
            }
            InvalidCreate::TtlTooLarge { max } => {
                write!(f, "a TTL must be at most {max} seconds")
            }
            InvalidCreate::ForkTooDeep { max } => write!(
                f,
                "fork chains are at most {max} forks deep, and this source is a fork at that depth"
            ),
        }
    }
}

impl std::fmt::Display for TrimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrimError::Engine(e) => e.fmt(f),
            TrimError::ReadByForks { forks } => write!(
                f,
                "{forks} live fork(s) read this stream's records: it cannot be trimmed while they \
                 exist (delete the forks first)"
            ),
        }
    }
}

impl std::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EngineError::Storage(cause) => Some(cause),
            _ => None,
        }
    }
}

impl std::error::Error for StorageFault {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StorageFault::Meta(e) => Some(e),
            StorageFault::Object { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl std::error::Error for AppendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AppendError::Engine(e) => Some(e),
            AppendError::Invalid(InvalidAppend::NotJson { error, .. }) => Some(error.as_ref()),
            _ => None,
        }
    }
}

impl std::error::Error for ReadError {}
impl std::error::Error for CreateError {}
impl std::error::Error for TrimError {}

impl From<StorageFault> for EngineError {
    fn from(cause: StorageFault) -> EngineError {
        EngineError::Storage(cause)
    }
}

impl From<MetaError> for EngineError {
    fn from(e: MetaError) -> EngineError {
        EngineError::Storage(StorageFault::Meta(e))
    }
}

impl From<NotOwnerReason> for EngineError {
    fn from(reason: NotOwnerReason) -> EngineError {
        EngineError::NotOwner(reason)
    }
}

impl From<EngineError> for AppendError {
    fn from(e: EngineError) -> AppendError {
        AppendError::Engine(e)
    }
}

impl From<EngineError> for ReadError {
    fn from(e: EngineError) -> ReadError {
        ReadError::Engine(e)
    }
}

impl From<EngineError> for CreateError {
    fn from(e: EngineError) -> CreateError {
        CreateError::Engine(e)
    }
}

impl From<AppendError> for CreateError {
    fn from(e: AppendError) -> CreateError {
        match e {
            AppendError::Engine(e) => CreateError::Engine(e),
            e => CreateError::Append(e),
        }
    }
}

impl From<ReadError> for CreateError {
    fn from(e: ReadError) -> CreateError {
        match e {
            ReadError::Engine(e) => CreateError::Engine(e),
            e => CreateError::ForkPoint(e),
        }
    }
}

impl From<EngineError> for TrimError {
    fn from(e: EngineError) -> TrimError {
        TrimError::Engine(e)
    }
}
