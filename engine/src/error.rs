//! Typed engine errors: the causes any operation on a stream can meet, and each operation's
//! own on top of them. The protocol layers map every variant to a status code in one
//! exhaustive `match` per type (no catch-all arm).

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
    /// The metadata log or object store failed.
    Storage(String),
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
    /// The request itself is invalid (the message says why).
    Invalid(String),
    /// The data could not be made durable; the append is not acknowledged.
    Durability(String),
    /// The WAL's filesystem has no room for this append; retry once space is freed (the
    /// node resumes on its own).
    OutOfSpace(String),
    /// This core takes no appends now (its WAL failed: until a restart; or its next WAL file
    /// cannot be made: until it can). The message says which.
    WritesStopped(String),
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
    /// The name is registered with another configuration.
    ConfigMismatch {
        message: String,
        next_offset: u64,
    },
    /// A fork was asked of a deleted source.
    SourceGone,
    /// The request itself is invalid (the message says why).
    Invalid(String),
    /// The create's first records (a create with a body) were refused.
    Append(AppendError),
    /// A fork's source could not be read at the fork point (a mid-record fork).
    ForkPoint(ReadError),
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

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::NotFound => f.write_str("no such stream"),
            EngineError::Gone => f.write_str("stream was deleted"),
            EngineError::Overloaded { limit, .. } => write!(f, "overloaded: {limit}"),
            EngineError::Storage(message) => write!(f, "storage: {message}"),
            EngineError::ShuttingDown => f.write_str("the node is shutting down"),
            EngineError::Moved { node, .. } => {
                write!(f, "the stream is served by node {node}")
            }
            EngineError::NotOwner(message) => f.write_str(message),
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
            AppendError::Invalid(message) => f.write_str(message),
            AppendError::Durability(message) => write!(f, "append not durable: {message}"),
            AppendError::OutOfSpace(message) => write!(f, "out of space: {message}"),
            AppendError::WritesStopped(message) => write!(f, "writes stopped: {message}"),
        }
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
            CreateError::ConfigMismatch { message, .. } => f.write_str(message),
            CreateError::SourceGone => f.write_str("fork source was deleted"),
            CreateError::Invalid(message) => f.write_str(message),
            CreateError::Append(e) => e.fmt(f),
            CreateError::ForkPoint(e) => e.fmt(f),
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

impl std::error::Error for EngineError {}
impl std::error::Error for AppendError {}
impl std::error::Error for ReadError {}
impl std::error::Error for CreateError {}
impl std::error::Error for TrimError {}

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
