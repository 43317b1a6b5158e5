//! The operations on one stream, each its own type naming the answer it gets, and the
//! message that carries one to the stream's owning core with its typed reply channel. The
//! shard runs them (`shard::Run`); `route.rs` sends them where their stream lives.

use futures_channel::oneshot;

use crate::api::{
    AppendAck, AppendRequest, CreateRequest, Created, ReadBatch, ReadRequest, RetentionChange,
    StreamInfo,
};
use crate::error::{AppendError, CreateError, EngineError, ReadError, TrimError};
use crate::metrics::OpKind;
use crate::rules::{ForkOrigin, StreamConfig};

/// One operation on one stream, run by the stream's owning core (`Shard::execute`), and the
/// answer it gets.
pub(crate) trait StreamOp: Sized + Send + 'static {
    type Answer: Send + 'static;
    /// Why it can fail: at least what any operation can meet on its way ([`EngineError`]).
    type Error: From<EngineError> + Send + 'static;
    /// Under which operation its metrics count it.
    const KIND: OpKind;
    /// Asked across cores, it is dropped with its waiter when the asker goes away (a
    /// long-poll's client left); otherwise it runs to its end.
    const CANCELLABLE: bool = false;

    /// What cluster routing needs to know of it (`Shard::route`).
    fn route(&self) -> RouteAs {
        RouteAs::Existing
    }

    /// Whether its latency is recorded (a live read's time is mostly waiting, not work).
    fn timed(&self) -> bool {
        true
    }

    /// The inbox message that carries it to another core.
    fn message(sent: Sent<Self>) -> StreamRequest;
}

/// How cluster routing treats an operation on a stream this core does not hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RouteAs {
    /// It needs the stream: found where it lives (loaded here, or redirected).
    Existing,
    /// A create that is not a fork: placed here or sent to the node placement picks.
    PlainCreate,
    /// Runs whether or not the stream is loaded (a fork release).
    Anywhere,
}

/// A create, a fork's point already resolved with its source (see `fork.rs`).
pub(crate) type Create = CreateRequest<ForkOrigin>;

/// The stream's state.
#[derive(Debug)]
pub(crate) struct Head;

/// A delete; answered with the source (name and id) whose reference a fork gives back.
#[derive(Debug)]
pub(crate) struct Delete;

/// Raises the first readable offset (clamped to the durable tail); answered with the new one.
#[derive(Debug)]
pub(crate) struct Trim {
    pub(crate) offset: u64,
}

/// Changes the retention policy (recorded in the metadata log before the answer; the next
/// retention pass applies it).
#[derive(Debug)]
pub(crate) struct Configure {
    pub(crate) change: RetentionChange,
}

/// A fork is being created from this stream: validate the fork point and count the reference
/// (the stream's records stay readable for the fork until it is released). Answered with
/// where the fork starts and the source's configuration (a fork inherits its content type and
/// expiry when it gives none).
#[derive(Debug)]
pub(crate) struct ForkAcquire {
    pub(crate) offset: u64,
    pub(crate) partial_bytes: u64,
}

/// A fork of this stream is gone (or was never created).
#[derive(Debug)]
pub(crate) struct ForkRelease {
    pub(crate) source_id: u64,
}

/// An operation on `name` sent to its owning core, and where its answer goes.
pub(crate) struct Sent<O: StreamOp> {
    pub(crate) name: String,
    pub(crate) op: O,
    pub(crate) reply: oneshot::Sender<Result<O::Answer, O::Error>>,
}

/// Each operation on a stream that crosses between cores, with its typed reply channel.
pub(crate) enum StreamRequest {
    Create(Sent<Create>),
    Append(Sent<AppendRequest>),
    Read(Sent<ReadRequest>),
    Head(Sent<Head>),
    Trim(Sent<Trim>),
    Configure(Sent<Configure>),
    Delete(Sent<Delete>),
    ForkAcquire(Sent<ForkAcquire>),
    ForkRelease(Sent<ForkRelease>),
}

impl StreamOp for Create {
    type Answer = Created;
    type Error = CreateError;
    const KIND: OpKind = OpKind::Create;

    fn route(&self) -> RouteAs {
        if self.fork.is_none() {
            RouteAs::PlainCreate
        } else {
            RouteAs::Existing
        }
    }

    fn message(sent: Sent<Self>) -> StreamRequest {
        StreamRequest::Create(sent)
    }
}

impl StreamOp for AppendRequest {
    type Answer = AppendAck;
    type Error = AppendError;
    const KIND: OpKind = OpKind::Append;

    fn message(sent: Sent<Self>) -> StreamRequest {
        StreamRequest::Append(sent)
    }
}

impl StreamOp for ReadRequest {
    type Answer = ReadBatch;
    type Error = ReadError;
    const KIND: OpKind = OpKind::Read;
    const CANCELLABLE: bool = true;

    fn timed(&self) -> bool {
        self.wait_ms.is_none_or(|ms| ms == 0)
    }

    fn message(sent: Sent<Self>) -> StreamRequest {
        StreamRequest::Read(sent)
    }
}

impl StreamOp for Head {
    type Answer = StreamInfo;
    type Error = EngineError;
    const KIND: OpKind = OpKind::Head;
    const CANCELLABLE: bool = true;

    fn message(sent: Sent<Self>) -> StreamRequest {
        StreamRequest::Head(sent)
    }
}

impl StreamOp for Trim {
    type Answer = u64;
    type Error = TrimError;
    const KIND: OpKind = OpKind::Trim;

    fn message(sent: Sent<Self>) -> StreamRequest {
        StreamRequest::Trim(sent)
    }
}

impl StreamOp for Configure {
    type Answer = StreamInfo;
    type Error = EngineError;
    const KIND: OpKind = OpKind::Configure;

    fn message(sent: Sent<Self>) -> StreamRequest {
        StreamRequest::Configure(sent)
    }
}

impl StreamOp for Delete {
    /// For a fork, its source (name and id), whose reference the asker gives back.
    type Answer = Option<(String, u64)>;
    type Error = EngineError;
    const KIND: OpKind = OpKind::Delete;

    fn message(sent: Sent<Self>) -> StreamRequest {
        StreamRequest::Delete(sent)
    }
}

impl StreamOp for ForkAcquire {
    type Answer = (ForkOrigin, StreamConfig);
    type Error = CreateError;
    const KIND: OpKind = OpKind::Fork;

    fn message(sent: Sent<Self>) -> StreamRequest {
        StreamRequest::ForkAcquire(sent)
    }
}

impl StreamOp for ForkRelease {
    type Answer = ();
    type Error = EngineError;
    const KIND: OpKind = OpKind::Fork;

    fn route(&self) -> RouteAs {
        RouteAs::Anywhere
    }

    fn message(sent: Sent<Self>) -> StreamRequest {
        StreamRequest::ForkRelease(sent)
    }
}
