//! Forks across cores: a read of a fork below its fork point continues in its source (and
//! so on down a chain of forks), and a fork's create first resolves the fork point with the
//! source, which counts the reference until the fork is gone.

use std::rc::Rc;

use crate::api::{Created, ForkSpec, ReadBatch, ReadBound, ReadFrom, ReadRequest, RecordInput};
use crate::error::{CreateError, EngineError, InvalidCreate, Mismatch, ReadError, StorageFault};
use crate::route::Router;
use crate::rules::{mime_base_eq, ForkOrigin, StreamConfig};

/// A read, stitched across forks: a fork read below its fork point continues in its
/// source (bounded by the fork point), then in the fork's own records. Walks a chain of
/// forks in a loop, one level per step, so no chain depth can exhaust the stack.
pub(crate) async fn read(
    router: &Router,
    name: &str,
    request: ReadRequest,
) -> Result<ReadBatch, ReadError> {
    // Each level down the chain: the fork read, its request and where its source ends.
    struct Level {
        name: String,
        request: ReadRequest,
        batch: ReadBatch,
        origin: ForkOrigin,
        inherited_end: u64,
        more_allowed: bool,
    }
    let mut levels: Vec<Level> = Vec::new();
    let (mut name, mut request) = (name.to_string(), request);
    let mut batch = loop {
        let batch = router.read(&name, request.clone()).await?;
        let Some(origin) = batch.inherit.clone() else {
            break batch;
        };
        // The inherited part, bounded by both the fork point and any bound of our own.
        let fork_end = (origin.row.offset, origin.row.partial_bytes);
        let own_bound = request.bound.map(|b| (b.until, b.partial_bytes));
        let (until, partial_bytes) = match own_bound {
            Some(bound) if bound < fork_end => bound,
            _ => fork_end,
        };
        // A read from the beginning starts at the source's start if it was trimmed.
        let source_from = match request.from {
            ReadFrom::AtLeast(_) => ReadFrom::AtLeast(batch.from),
            _ => ReadFrom::Offset(batch.from),
        };
        let source_request = ReadRequest {
            from: source_from,
            wait_ms: None,
            with_content_type: false,
            bound: Some(ReadBound {
                source_id: origin.row.source_id,
                until,
                partial_bytes,
            }),
            ..request.clone()
        };
        let source = origin.row.source.clone();
        levels.push(Level {
            name: std::mem::replace(&mut name, source),
            request: std::mem::replace(&mut request, source_request),
            batch,
            origin,
            inherited_end: until.saturating_add(u64::from(partial_bytes > 0)),
            more_allowed: own_bound.is_none_or(|bound| bound > fork_end),
        });
    };
    // Back up the chain: each fork's answer is its source's part, then its own records.
    while let Some(level) = levels.pop() {
        let mut inherited = batch;
        let mut stitched = ReadBatch {
            from: inherited.from,
            next_offset: inherited.next_offset,
            records: std::mem::take(&mut inherited.records),
            tail: level.batch.tail,
            closed: false,
            content_type: level.batch.content_type,
            inherit: None,
            shared_read: None,
        };
        let bytes: usize = stitched.records.iter().map(|r| r.body.len()).sum();
        if stitched.next_offset >= level.inherited_end
            && level.more_allowed
            && stitched.records.len() < level.request.max_records
            && bytes < level.request.max_bytes
        {
            let own_request = ReadRequest {
                from: ReadFrom::Offset(level.origin.base()),
                max_records: level.request.max_records - stitched.records.len(),
                max_bytes: level.request.max_bytes - bytes,
                wait_ms: None,
                with_content_type: false,
                bound: level.request.bound,
            };
            // Boxed: only forks get here, and it would size every read's future.
            let own = Box::pin(router.read(&level.name, own_request)).await?;
            if own.inherit.is_some() {
                return Err(EngineError::Storage(StorageFault::ForkReadLoop {
                    fork: level.name.clone(),
                })
                .into());
            }
            if !own.records.is_empty() {
                stitched.next_offset = own.next_offset;
                stitched.records.extend(own.records);
            }
            stitched.tail = own.tail;
            stitched.closed = own.closed;
        }
        batch = stitched;
    }
    Ok(batch)
}

/// Creates a fork: resolves the fork point with the source (which counts the reference),
/// then creates the stream on its own core; a fork that is not created releases it.
pub(crate) async fn create(
    router: &Router,
    name: &str,
    mut config: StreamConfig,
    closed: bool,
    records: Vec<RecordInput>,
    spec: ForkSpec,
) -> Result<Created, CreateError> {
    let source = match router.head(&spec.source).await {
        Err(EngineError::Gone) => return Err(CreateError::SourceGone),
        other => other?,
    };
    if spec.offset_bytes > 0 {
        return Err(CreateError::Invalid(InvalidCreate::ForeignForkOffset));
    }
    let offset = spec.offset.unwrap_or(source.next_offset);
    if offset > source.next_offset {
        return Err(CreateError::Invalid(InvalidCreate::ForkPastTail {
            tail: source.next_offset,
        }));
    }
    let (offset, partial_bytes) = if spec.sub_offset == 0 {
        (offset, 0)
    } else if mime_base_eq(&source.content_type, "application/json") {
        // JSON: the sub-offset counts messages, which are records.
        let at = offset.checked_add(spec.sub_offset);
        let Some(at) = at.filter(|&at| at <= source.next_offset) else {
            return Err(CreateError::Invalid(
                InvalidCreate::SubOffsetPastLastMessage,
            ));
        };
        (at, 0)
    } else {
        if offset >= source.next_offset {
            return Err(CreateError::Invalid(InvalidCreate::SubOffsetWithoutRecord));
        }
        let request = ReadRequest {
            from: ReadFrom::Offset(offset),
            max_records: 1,
            max_bytes: 1,
            wait_ms: None,
            with_content_type: false,
            bound: None,
        };
        let record = read(router, &spec.source, request).await?;
        let length = record.records.first().map_or(0, |r| r.body.len() as u64);
        match spec.sub_offset.cmp(&length) {
            std::cmp::Ordering::Greater => {
                return Err(CreateError::Invalid(InvalidCreate::SubOffsetPastRecord))
            }
            std::cmp::Ordering::Equal => (offset + 1, 0),
            std::cmp::Ordering::Less => (offset, spec.sub_offset),
        }
    };
    let (origin, source_config) = router
        .fork_acquire(&spec.source, offset, partial_bytes)
        .await?;
    // A release that fails here is left to the release loop, which tries until it goes through.
    let release = || async {
        if router
            .fork_release(&spec.source, origin.row.source_id)
            .await
            .is_err()
        {
            let retry = vec![(spec.source.clone(), origin.row.source_id)];
            router.shard.queue_fork_releases(retry);
        }
    };
    if config.content_type.is_empty() {
        config.content_type = source_config.content_type.clone();
    } else if !mime_base_eq(&config.content_type, &source_config.content_type) {
        release().await;
        return Err(CreateError::ConfigMismatch {
            reason: Mismatch::ForkContentType {
                source: source_config.content_type.clone(),
            },
            next_offset: 0,
        });
    }
    if config.ttl_sec.is_none() && config.expires_at_ms.is_none() {
        config.ttl_sec = source_config.ttl_sec;
        config.expires_at_ms = source_config.expires_at_ms;
    }
    let fork = Some(origin.clone());
    let created = router.create(name, config, closed, records, fork).await;
    if !matches!(created, Ok(Created { created: true, .. })) {
        release().await;
    }
    created
}

/// Tells sources that a fork of theirs is gone (deleted or expired on this core). A release
/// that fails is tried again after [`limits::FORK_RELEASE_RETRY_MS`], until it goes through:
/// trying again is safe, since a source's count stops at zero and its removal is idempotent.
pub(crate) async fn release_loop(router: Rc<Router>) {
    loop {
        router.shard.fork_released.wait().await;
        let mut failed = Vec::new();
        for (source, source_id) in router.shard.take_fork_releases() {
            if let Err(e) = router.fork_release(&source, source_id).await {
                log::warn!("could not release a fork of {source} ({e}); trying again");
                failed.push((source, source_id));
            }
        }
        if !failed.is_empty() {
            glommio::timer::sleep(std::time::Duration::from_millis(
                crate::limits::FORK_RELEASE_RETRY_MS,
            ))
            .await;
            router.shard.queue_fork_releases(failed);
        }
    }
}
