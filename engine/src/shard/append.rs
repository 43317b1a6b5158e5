//! Create and append: limits and producer checks, the state machine's verdict, the frames
//! written into the active segment and the acknowledgement queued for the commit loop.

use std::rc::Rc;

use futures_channel::oneshot;
use pico_meta::SegmentRun;

use crate::api::{AppendAck, AppendRequest, Created, RecordInput};
use crate::error::{
    AppendError, CreateError, EngineError, InvalidAppend, InvalidCreate, Mismatch, NotOwnerReason,
};
use crate::frame::{self, FrameMeta, ProducerTuple, FRAME_KIND_CLOSE, FRAME_KIND_RECORD};
use crate::json;
use crate::limits;
use crate::metrics::CoreMetrics;
use crate::rules::{AppendCommand, AppendOutcome, ForkOrigin, StreamConfig, StreamState};

use super::pending::PendingAck;
use super::state::Shard;
use super::stream::{info_of, Chunk, Stream};

/// What one append request writes.
pub(super) struct Frames<'a> {
    pub(super) records: &'a [RecordInput],
    pub(super) close: bool,
    pub(super) producer: Option<&'a ProducerTuple>,
    pub(super) writer_seq: Option<&'a str>,
}

/// Bytes the frames of one append take in a segment.
pub(super) fn frames_len(
    records: &[RecordInput],
    producer: Option<&ProducerTuple>,
    writer_seq: Option<&str>,
) -> usize {
    records
        .iter()
        .map(|r| frame::frame_len(&r.headers, None, None, r.body.len()))
        .sum::<usize>()
        + frame::frame_len(&[], producer, writer_seq, 0)
}

/// What an append comes to once the stream's state judged it, with its answer: the one place
/// an [`AppendAck`] is built.
enum AppendPlan {
    /// Write the records (and a close frame when `ack.closed`), answer once durable. A
    /// close-only request keeps no `Stream-Seq` (`keep_writer_seq: false`).
    Write {
        ack: AppendAck,
        keep_writer_seq: bool,
    },
    /// Nothing to write (the stream was already closed, or a producer's retry): answer once
    /// what the original request wrote is durable.
    Nothing(AppendAck),
}

impl AppendPlan {
    /// The plan for `outcome`, judged by the state of the stream whose id is `stream_id`.
    fn judged(outcome: AppendOutcome, stream_id: u64) -> AppendPlan {
        // What a request that writes no record answers: the tail, and no first offset.
        let unwritten = |next_offset, closed, duplicate_of_seq| AppendAck {
            start_offset: None,
            next_offset,
            stream_id,
            timestamp_ms: None,
            closed,
            duplicate_of_seq,
        };
        match outcome {
            AppendOutcome::Appended {
                start_offset,
                next_offset,
                timestamp_ms,
                closed,
            } => AppendPlan::Write {
                ack: AppendAck {
                    start_offset: Some(start_offset),
                    next_offset,
                    stream_id,
                    timestamp_ms: Some(timestamp_ms),
                    closed,
                    duplicate_of_seq: None,
                },
                keep_writer_seq: true,
            },
            // A close-only request writes a close frame, unless the stream was closed already.
            AppendOutcome::Closed { next_offset, newly } => {
                let ack = unwritten(next_offset, true, None);
                if newly {
                    AppendPlan::Write {
                        ack,
                        keep_writer_seq: false,
                    }
                } else {
                    AppendPlan::Nothing(ack)
                }
            }
            AppendOutcome::Duplicate {
                next_offset,
                last_seq,
                closed,
            } => AppendPlan::Nothing(unwritten(next_offset, closed, Some(last_seq))),
        }
    }
}

impl Shard {
    pub(super) async fn create(
        self: &Rc<Self>,
        name: &str,
        config: StreamConfig,
        closed: bool,
        records: Vec<RecordInput>,
        fork: Option<ForkOrigin>,
    ) -> Result<Created, CreateError> {
        // The protocols refuse larger TTLs with their own wording; this guards every caller.
        if config.ttl_sec.is_some_and(|ttl| ttl > limits::TTL_SEC_MAX) {
            let max = limits::TTL_SEC_MAX;
            return Err(CreateError::Invalid(InvalidCreate::TtlTooLarge { max }));
        }
        let found = self.live_stream_id(name, false).await;
        if let Err(EngineError::Gone) = found {
            let stream = self.streams.get(name).ok_or(EngineError::NotFound)?;
            stream
                .state
                .check_recreate(&config, closed, fork.as_ref())?;
        }
        if found.is_err() && self.streams.holds(name) {
            // Expired, but forks still read it: the name stays taken until they are gone.
            return Err(CreateError::ConfigMismatch {
                reason: Mismatch::ExpiredWithForks,
                next_offset: 0,
            });
        }
        if found.is_ok() {
            return self.already_created(name, &config, closed, fork.as_ref());
        }
        // A create with a body the WAL cannot take is refused whole, not left half done (a
        // stream without its records).
        if !records.is_empty() {
            self.journal
                .check_writable(frames_len(&records, None, None))?;
        }
        // A body given with a closing create is appended first, then the close.
        let (meta_config, meta_closed) = (config.clone(), closed && records.is_empty());
        let fork_row = fork.as_ref().map(|origin| origin.row.clone());
        let me = self.cluster.as_ref().map(|c| c.node_id());
        let outcome = self
            .meta
            .create_stream_owned(
                name,
                meta_config,
                meta_closed,
                fork_row,
                self.clock.now_ms(),
                me,
            )
            .await
            .map_err(|_| EngineError::ShuttingDown)?
            .map_err(EngineError::from)?;
        if let (Some(cluster), false) = (&self.cluster, outcome.created) {
            // Registered meanwhile by another node (or by this one before a restart): serve
            // it where it lives.
            if outcome.ownership.node != me {
                let owner_live = outcome
                    .ownership
                    .node
                    .is_some_and(|node| cluster.live_node(node).is_some());
                if owner_live {
                    return Err(cluster.moved_to(outcome.ownership.node).into());
                }
                // Its owner's lease lapsed: wait, as any request does, for the keeper to hand
                // the stream on, then answer as the node that holds it.
                self.resolve_owner(cluster, name, false).await?;
                if !self.streams.holds(name) {
                    return Err(EngineError::from(NotOwnerReason::ChangedHandsDuringCreate).into());
                }
                return self.already_created(name, &config, closed, fork.as_ref());
            }
            self.adopt(name, outcome.row.id).await?;
            return self.already_created(name, &config, closed, fork.as_ref());
        }
        let row = outcome.row;
        // Another create of the same name on this core may have won the race: no await
        // between this look and the insert below.
        let existing = self.streams.get(name).map(|existing| {
            existing
                .state
                .check_recreate(&config, closed, fork.as_ref())
        });
        let created = match existing {
            Some(matches) => {
                matches?;
                false
            }
            None => {
                let row_config = &row.config;
                let mut state = StreamState::with_content_type(
                    row.id,
                    self.streams.shared_content_type(&row_config.content_type),
                    (
                        row_config.ttl_sec,
                        row_config.expires_at_ms,
                        row_config.retention,
                    ),
                    row.closed,
                    row.created_ms,
                );
                if let Some(origin) = &fork {
                    state.next_offset = origin.base();
                    state.durable_offset = origin.base();
                    state.extras_mut().fork = Some(origin.clone());
                }
                if !outcome.created {
                    state.check_recreate(&config, closed, fork.as_ref())?;
                }
                self.streams.insert(
                    Rc::from(name),
                    Stream {
                        recorded_access_ms: state.last_access_ms,
                        state,
                        chunks: Vec::new(),
                        waiters: Vec::new(),
                        epoch: outcome.ownership.epoch,
                        retiring: false,
                    },
                );
                outcome.created
            }
        };
        let mut first = None;
        if created && !records.is_empty() {
            let request = AppendRequest {
                records,
                close: closed,
                match_offset: None,
                producer: None,
                content_type: None,
                writer_seq: None,
                // A create's body is checked here (rare; one rule for both protocols).
                json_checked: false,
            };
            first = Some(self.append(name, request).await?);
        }
        let stream = self.streams.get(name).ok_or(EngineError::NotFound)?;
        Ok(Created {
            created,
            info: info_of(&stream.state),
            first,
        })
    }

    /// The answer to a create of a name this core already serves: `200` when the configuration
    /// matches, a conflict otherwise.
    pub(super) fn already_created(
        &self,
        name: &str,
        config: &StreamConfig,
        closed: bool,
        fork: Option<&ForkOrigin>,
    ) -> Result<Created, CreateError> {
        let stream = self.streams.get(name).ok_or(EngineError::NotFound)?;
        stream.state.check_recreate(config, closed, fork)?;
        Ok(Created {
            created: false,
            info: info_of(&stream.state),
            first: None,
        })
    }

    pub(super) async fn append(
        self: &Rc<Self>,
        name: &str,
        request: AppendRequest,
    ) -> Result<AppendAck, AppendError> {
        let AppendRequest {
            records,
            close,
            match_offset,
            producer,
            content_type,
            writer_seq,
            json_checked,
        } = request;
        if producer
            .as_ref()
            .is_some_and(|p| p.id.len() > limits::PRODUCER_ID_BYTES_MAX)
        {
            let max = limits::PRODUCER_ID_BYTES_MAX;
            return Err(AppendError::Invalid(InvalidAppend::ProducerIdTooLong {
                max,
            }));
        }
        if writer_seq
            .as_ref()
            .is_some_and(|w| w.len() > frame::WRITER_SEQ_LEN_MAX)
        {
            let max = frame::WRITER_SEQ_LEN_MAX;
            return Err(AppendError::Invalid(InvalidAppend::WriterSeqTooLong {
                max,
            }));
        }
        if records.len() > limits::RECORDS_PER_APPEND_MAX {
            let max = limits::RECORDS_PER_APPEND_MAX;
            return Err(AppendError::Invalid(InvalidAppend::TooManyRecords { max }));
        }
        let body_bytes: usize = records.iter().map(|r| r.body.len()).sum();
        let in_flight_bytes = self.journal.in_flight_bytes();
        if in_flight_bytes + body_bytes > self.config.in_flight_bytes_max && in_flight_bytes > 0 {
            return Err(EngineError::Overloaded {
                limit: "in-flight bytes per core",
                retry_after_sec: limits::OVERLOADED_RETRY_AFTER_SEC,
            }
            .into());
        }
        if self.unstored_bytes() > self.config.unuploaded_bytes_max {
            return Err(EngineError::Overloaded {
                limit: "unuploaded bytes per core (the object store is behind)",
                retry_after_sec: limits::OVERLOADED_RETRY_AFTER_SEC,
            }
            .into());
        }
        // Before the stream's state moves: a refused append has no offset.
        self.journal.check_writable(frames_len(
            &records,
            producer.as_ref(),
            writer_seq.as_deref(),
        ))?;
        let id = self.live_stream_id(name, false).await?;
        self.one_incarnation_per_segment(name, id)?;
        let now = self.clock.now_ms();
        // Judged first, then written: no await between, so the state the plan was made from
        // is the one the frames go into.
        let (key, plan) = {
            let (key, mut stream) = self
                .streams
                .get_named_mut(name)
                .ok_or(EngineError::NotFound)?;
            if self.streams.handing_off(name) {
                return Err(EngineError::from(NotOwnerReason::Moving).into());
            }
            if stream.retiring {
                return Err(EngineError::from(NotOwnerReason::Retiring).into());
            }
            // One contract for both protocols: a JSON stream's records are JSON values.
            if !json_checked && json::is_json(&stream.state.content_type) {
                for (i, record) in records.iter().enumerate() {
                    json::check_value(&record.body).map_err(|error| {
                        let error = std::sync::Arc::new(error);
                        AppendError::Invalid(InvalidAppend::NotJson { record: i, error })
                    })?;
                }
            }
            let command = AppendCommand {
                records: records.len() as u64,
                close,
                match_offset,
                producer: producer.as_ref(),
                content_type: content_type.as_deref(),
                writer_seq: writer_seq.as_deref(),
                producer_limits: &self.config.producers,
            };
            let outcome = stream.state.apply_append(command, now)?;
            self.record_access(&mut stream);
            (key, AppendPlan::judged(outcome, stream.state.id))
        };
        let (ack_rx, ack) = match plan {
            AppendPlan::Write {
                ack,
                keep_writer_seq,
            } => {
                let mut stream = self
                    .streams
                    .get_mut(&key)
                    .expect("judged above, no await since");
                let frames = Frames {
                    records: &records,
                    close: ack.closed,
                    producer: producer.as_ref(),
                    writer_seq: writer_seq.as_deref().filter(|_| keep_writer_seq),
                };
                let rx = self.write_frames(&key, &mut stream, frames, &ack, body_bytes);
                (rx, ack)
            }
            AppendPlan::Nothing(ack) => return self.after_durable(name, ack).await,
        };
        self.journal.wake_commit();
        match ack_rx.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(EngineError::ShuttingDown.into()),
        }
        if let Some(start) = ack.start_offset {
            CoreMetrics::add(&self.metrics.records_appended, ack.next_offset - start);
            CoreMetrics::add(&self.metrics.bytes_appended, body_bytes as u64);
        }
        if ack.closed {
            if let Ok(id) = self.live_stream_id(name, false).await {
                // Durable already through the WAL close frame; the registry follows for listings.
                let fence = self.streams.get(name).and_then(|s| self.fence(&s));
                drop(self.meta.close_stream_fenced(id, fence));
            }
        }
        Ok(ack)
    }

    /// A segment's commit is fenced by one owner epoch per stream, so the active segment
    /// never holds frames of two incarnations of a stream (lost to another node and loaded
    /// here again while the segment was open): the older one's frames would be committed
    /// under the newer one's epoch, beside offsets the newer one assigns again. Starts a new
    /// segment when it would; without a spare WAL file for one, the append is refused as
    /// retryable.
    pub(super) fn one_incarnation_per_segment(
        &self,
        name: &str,
        id: u64,
    ) -> Result<(), EngineError> {
        let Some((_, epoch)) = self.streams.incarnation(name) else {
            return Ok(());
        };
        let mixed = || self.journal.active_epoch(id).is_some_and(|e| e != epoch);
        if mixed() {
            self.rotate();
            if mixed() {
                return Err(NotOwnerReason::Reloaded.into());
            }
        }
        Ok(())
    }

    /// Answers a request that wrote nothing once everything before it is durable: the
    /// stream's tail up to `ack.next_offset`, and its close if `ack.closed`.
    pub(super) async fn after_durable(
        self: &Rc<Self>,
        name: &str,
        ack: AppendAck,
    ) -> Result<AppendAck, AppendError> {
        let (offset, closed) = (ack.next_offset, ack.closed);
        // The incarnation whose state made this a retry: only its own durable tail proves the
        // original stored. If the stream is dropped (fenced: the original's append is refused)
        // and loaded again here from the catalog, the new incarnation's tail passing `offset`
        // says nothing about the original, which may never have been stored; answering then
        // would tell a producer a sequence number is stored that no one has (the fault
        // test's cluster profile covers it: the producer would then be refused with a
        // sequence gap).
        let incarnation = self.streams.incarnation(name);
        loop {
            let rx = {
                let mut stream = match self.streams.get_mut(name) {
                    Some(s) if Some((s.state.id, s.epoch)) == incarnation => s,
                    None if self.cluster.is_none() => return Err(EngineError::NotFound.into()),
                    _ => {
                        return Err(EngineError::from(NotOwnerReason::MovedBeforeRetryStored).into())
                    }
                };
                if stream.state.durable_offset >= offset && (!closed || stream.state.closed_durable)
                {
                    return Ok(ack);
                }
                // The original's commit round failed (or one before it): it was answered
                // `500`, and so is its retry, with the same promise: stored at most once,
                // found after a restart or not at all.
                if let Some(fault) = self.journal.failure() {
                    return Err(AppendError::Durability { fault, retry: true });
                }
                let (tx, rx) = oneshot::channel();
                stream.waiters.push(tx);
                rx
            };
            let _ = rx.await;
        }
    }

    /// Frames the records into the active segment and queues their acknowledgement. The last
    /// frame of the request carries the request-end flag and the producer tuple.
    pub(super) fn write_frames(
        &self,
        name: &Rc<str>,
        stream: &mut Stream,
        frames: Frames<'_>,
        ack: &AppendAck,
        body_bytes: usize,
    ) -> oneshot::Receiver<Result<(), AppendError>> {
        let Frames {
            records,
            close,
            producer,
            writer_seq,
        } = frames;
        let needed = frames_len(records, producer, writer_seq);
        self.maybe_rotate(needed);
        let (no, end) = self.journal.write_active(needed, |segment| {
            let id = stream.state.id;
            let byte_start = segment.buf.len() as u64;
            let timestamp = ack.timestamp_ms.unwrap_or(stream.state.last_timestamp_ms);
            let first_offset = ack.start_offset.unwrap_or(ack.next_offset);
            for (i, record) in records.iter().enumerate() {
                let last = i + 1 == records.len() && !close;
                let meta = FrameMeta {
                    kind: FRAME_KIND_RECORD,
                    stream_id: id,
                    offset: first_offset + i as u64,
                    timestamp_ms: timestamp,
                    request_end: last,
                    producer: if last { producer } else { None },
                    writer_seq: if last { writer_seq } else { None },
                };
                frame::encode_frame(&mut segment.buf, meta, &record.headers, &record.body);
            }
            if close {
                let meta = FrameMeta {
                    kind: FRAME_KIND_CLOSE,
                    stream_id: id,
                    offset: ack.next_offset,
                    timestamp_ms: timestamp,
                    request_end: true,
                    producer,
                    writer_seq,
                };
                frame::encode_frame(&mut segment.buf, meta, &[], &[]);
            }
            let byte_end = segment.buf.len() as u64;
            let wal_epochs = &mut segment.wal_epochs;
            let entry = segment.index.entry(id).or_default();
            if entry.name.is_none() {
                entry.name = Some(name.clone());
                // A cluster node's WAL says which incarnation these frames belong to.
                if self.cluster.is_some() && self.wal_enabled() {
                    wal_epochs.push((id, stream.epoch));
                }
            }
            entry.epoch = stream.epoch;
            entry.last_timestamp_ms = entry.last_timestamp_ms.max(timestamp);
            entry.closed |= close;
            if let Some(writer_seq) = writer_seq {
                entry.writer_seq = Some(writer_seq.to_string());
            }
            if let Some(producer) = producer {
                entry
                    .producers
                    .insert(producer.id.clone(), (producer.epoch, producer.seq));
                if close {
                    entry.closed_by = Some(producer.clone());
                }
            }
            if !records.is_empty() {
                let run = SegmentRun {
                    first_offset,
                    next_offset: ack.next_offset,
                    byte_start,
                    byte_end,
                };
                if !entry.runs.last_mut().is_some_and(|last| last.extend(&run)) {
                    entry.runs.push(run);
                }
                let chunk = Chunk::new(run, segment.no, timestamp);
                match stream.chunks.last_mut() {
                    Some(last)
                        if last.segment == chunk.segment
                            && last.byte_end == byte_start
                            && last.next_offset == first_offset
                            && last.byte_end - last.byte_start < limits::CHUNK_BYTES_MAX =>
                    {
                        last.next_offset = chunk.next_offset;
                        last.byte_end = chunk.byte_end;
                        last.last_timestamp_ms = chunk.last_timestamp_ms;
                    }
                    _ => stream.chunks.push(chunk),
                }
            }
            (segment.no, segment.buf.len())
        });
        let (tx, rx) = oneshot::channel();
        self.journal.queue_ack(PendingAck {
            segment: no,
            end,
            name: name.clone(),
            stream_id: stream.state.id,
            epoch: stream.epoch,
            next_offset: ack.next_offset,
            closed: close,
            body_bytes,
            reply: tx,
        });
        rx
    }
}
