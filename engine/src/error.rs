//! Typed engine errors. The protocol layers map every variant to a status code in one
//! exhaustive `match` each (no catch-all arm).

/// Why an operation on a stream failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// No such stream (never created, deleted, or expired).
    NotFound,
    /// A create found the name registered with another configuration.
    ConfigMismatch { message: String, next_offset: u64 },
    /// The stream is closed: no more records.
    Closed { next_offset: u64 },
    /// Deleted while forks still read it: gone for clients, and its name stays taken.
    Gone,
    /// A fork was asked of a deleted source.
    SourceGone,
    /// A trim of a stream that live forks read through: they keep its records while they
    /// exist (its retention is paused for the same reason).
    ReadByForks { forks: u64 },
    /// An append's content type differs from the stream's.
    ContentTypeMismatch { expected: String },
    /// An append's writer sequence does not sort after the last accepted one.
    WriterSeqRegression { last: String },
    /// A conditional append (`match_seq`) did not match the tail.
    MatchFailed { expected: u64, actual: u64 },
    /// An idempotent producer wrote with an epoch older than the stream has seen.
    StaleProducerEpoch { current: u64 },
    /// A producer this stream has never seen did not start at sequence 0.
    UnknownProducer { received: u64 },
    /// An idempotent producer skipped sequence numbers.
    ProducerSequenceGap { expected: u64, received: u64 },
    /// A new idempotent producer found no room: `scope` ("this stream", "this node") keeps
    /// `limit` producers, and one idle for `idle_expiry_sec` makes room.
    TooManyProducers {
        scope: &'static str,
        limit: usize,
        idle_expiry_sec: u64,
    },
    /// A read asked for a position past the tail.
    OffsetBeyondTail { requested: u64, tail: u64 },
    /// A read asked for a position below the first readable record.
    OffsetGone { requested: u64, start: u64 },
    /// A named limit was hit; try again after the given seconds.
    Overloaded {
        limit: &'static str,
        retry_after_sec: u64,
    },
    /// The request itself is invalid (the message says why).
    Invalid(String),
    /// The data could not be made durable; the append is not acknowledged.
    Durability(String),
    /// The metadata log or object store failed.
    Storage(String),
    /// The WAL's filesystem has no room for this append; retry once space is freed (the
    /// node resumes on its own).
    OutOfSpace(String),
    /// This core takes no appends now (its WAL failed: until a restart; or its next WAL file
    /// cannot be made: until it can). The message says which.
    WritesStopped(String),
    /// The node is shutting down.
    ShuttingDown,
    /// Another node of the cluster owns the stream: ask it (`307` to its listener of the
    /// request's protocol: `address` for Pico, `ds_address` for Durable Streams).
    Moved {
        node: u32,
        address: String,
        ds_address: String,
    },
    /// This node cannot serve the stream right now (its lease lapsed, or the owner is not
    /// known yet); the message says why. Retry shortly.
    NotOwner(String),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::NotFound => f.write_str("no such stream"),
            EngineError::ConfigMismatch { message, .. } => f.write_str(message),
            EngineError::Closed { .. } => f.write_str("stream is closed"),
            EngineError::Gone => f.write_str("stream was deleted"),
            EngineError::SourceGone => f.write_str("fork source was deleted"),
            EngineError::ReadByForks { forks } => write!(
                f,
                "{forks} live fork(s) read this stream's records: it cannot be trimmed while they \
                 exist (delete the forks first)"
            ),
            EngineError::ContentTypeMismatch { expected } => {
                write!(f, "content type does not match the stream's ({expected})")
            }
            EngineError::WriterSeqRegression { last } => {
                write!(f, "Stream-Seq must sort after the last one ({last})")
            }
            EngineError::MatchFailed { expected, actual } => {
                write!(f, "match failed: expected tail {expected}, actual {actual}")
            }
            EngineError::StaleProducerEpoch { .. } => f.write_str("Stale producer epoch"),
            EngineError::ProducerSequenceGap { .. } => f.write_str("Producer sequence gap"),
            // Kept word for word: clients recognise this case by the message.
            EngineError::UnknownProducer { .. } => {
                f.write_str("New epoch must start with sequence 0")
            }
            EngineError::TooManyProducers {
                scope,
                limit,
                idle_expiry_sec,
            } => write!(
                f,
                "{scope} keeps {limit} idempotent producers, the most it may: a new producer is \
                 refused until one has been idle for {idle_expiry_sec} s"
            ),
            EngineError::OffsetBeyondTail { requested, tail } => {
                write!(f, "offset {requested} is past the tail {tail}")
            }
            EngineError::OffsetGone { requested, start } => {
                write!(
                    f,
                    "offset {requested} is below the first readable offset {start}"
                )
            }
            EngineError::Overloaded { limit, .. } => write!(f, "overloaded: {limit}"),
            EngineError::Invalid(message) => f.write_str(message),
            EngineError::Durability(message) => write!(f, "append not durable: {message}"),
            EngineError::Storage(message) => write!(f, "storage: {message}"),
            EngineError::OutOfSpace(message) => write!(f, "out of space: {message}"),
            EngineError::WritesStopped(message) => write!(f, "writes stopped: {message}"),
            EngineError::ShuttingDown => f.write_str("the node is shutting down"),
            EngineError::Moved { node, .. } => {
                write!(f, "the stream is served by node {node}")
            }
            EngineError::NotOwner(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for EngineError {}
