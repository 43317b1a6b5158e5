//! The rules of one stream as a pure state machine: no I/O, time passed in.
//!
//! Both protocols translate their requests into these calls; the owning core applies them
//! and then does the I/O (frames into the WAL, waiters, replies).

use std::sync::Arc;

use crate::error::{AppendError, CreateError, InvalidAppend, Mismatch, ReadError};
pub use crate::frame::ProducerTuple;
use crate::producers::{Producer, ProducerLimits, Producers};

/// Configuration fixed at create (but for the retention): the registry's own type, one shape
/// from the protocols to the catalog.
pub use pico_meta::StreamConfig;

/// A fork's origin: where its inherited records come from, as the catalog stores it (records
/// `0..offset` of the source, plus the first `partial_bytes` bytes of its record `offset` when
/// non-zero), and how deep the fork is. The fork's own records start at
/// [`ForkOrigin::base`]; offsets are shared, never translated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForkOrigin {
    pub row: pico_meta::ForkRow,
    /// Forks from a stream that is no fork down to this one, this one included (1: the source
    /// is no fork). Derived when the catalog is loaded, not stored; see
    /// [`crate::limits::FORK_DEPTH_MAX`].
    pub depth: u32,
}

impl ForkOrigin {
    /// The first offset the fork's own records get.
    pub fn base(&self) -> u64 {
        ForkOrigin::base_of(&self.row)
    }

    /// The first offset a fork of `row` gives its own records: past a record it forked inside.
    pub fn base_of(row: &pico_meta::ForkRow) -> u64 {
        row.offset + u64::from(row.partial_bytes > 0)
    }
}

/// Everything the owning core knows about a stream's offsets and lifecycle.
///
/// A core holds one per stream it owns, so its size is most of what an idle stream costs
/// (docs/decisions/2026-12-small-idle-streams.md): the fields every stream uses are inline,
/// the content type is shared with the core's other streams of that type, and what few
/// streams set (an expiry, retention, producers, a writer sequence, a fork) lives in
/// [`StreamExtras`], boxed only once one of them is set.
///
/// ```text
///   StreamState (96 B)                      StreamExtras (boxed, 240 B, most streams: none)
///   id, created_ms, start/next/durable      ttl_sec, expires_at_ms, retention,
///   offsets, last_timestamp_ms,             producers, closed_by, writer_seq,
///   last_access_ms, content_type (Arc),     fork, fork_refs
///   closed, closed_durable, soft_deleted,
///   extras: Option<Box<StreamExtras>> ────▶
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamState {
    pub id: u64,
    /// Fixed at create; shared with the core's other streams of the same type.
    pub content_type: Arc<str>,
    pub created_ms: i64,
    /// First readable offset.
    pub start_offset: u64,
    /// Next offset to assign (includes appends still waiting for durability).
    pub next_offset: u64,
    /// Records below this offset are durable and readable.
    pub durable_offset: u64,
    /// Timestamp of the last assigned record; timestamps strictly increase per stream.
    pub last_timestamp_ms: i64,
    /// Last read or append, for the sliding TTL.
    pub last_access_ms: i64,
    /// A close was accepted (appends are refused from now on).
    pub closed: bool,
    /// The close marker is durable; readers at the tail see `closed`.
    pub closed_durable: bool,
    /// Deleted for clients while forks still read it.
    pub soft_deleted: bool,
    /// `None` while every field of [`StreamExtras`] has its default.
    extras: Option<Box<StreamExtras>>,
}

/// The parts of a stream's state that few streams set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamExtras {
    /// Sliding idle expiry: reads and appends move the deadline to `now + ttl`.
    pub ttl_sec: Option<u64>,
    /// Fixed expiry instant (Unix ms).
    pub expires_at_ms: Option<i64>,
    /// What the stream keeps; changeable after create.
    pub retention: pico_meta::Retention,
    /// Idempotent producers by id (limited and expired: `producers.rs`).
    pub producers: Producers,
    /// The producer tuple of the request that closed the stream, if a producer closed it.
    pub closed_by: Option<ProducerTuple>,
    /// The last writer sequence (`Stream-Seq`) accepted.
    pub writer_seq: Option<String>,
    /// Set for a fork: records below `fork.base()` are the source's.
    pub fork: Option<ForkOrigin>,
    /// Forks reading this stream's records.
    pub fork_refs: u64,
}

/// What a stream without extras reads.
static NO_EXTRAS: StreamExtras = StreamExtras {
    ttl_sec: None,
    expires_at_ms: None,
    retention: pico_meta::Retention {
        age_ms: None,
        bytes: None,
        delete_on_empty_ms: None,
    },
    producers: Producers::new(),
    closed_by: None,
    writer_seq: None,
    fork: None,
    fork_refs: 0,
};

/// An append as the protocols express it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendCommand<'a> {
    /// Records in the request (0 for a close-only request).
    pub records: u64,
    /// Close the stream after these records.
    pub close: bool,
    /// Apply only if the tail equals this offset.
    pub match_offset: Option<u64>,
    /// Idempotent producer identity; its `seq` counts requests, not records.
    pub producer: Option<&'a ProducerTuple>,
    /// The request's content type, when it must match the stream's.
    pub content_type: Option<&'a str>,
    /// Writer sequence: must sort (bytewise) after the last accepted one.
    pub writer_seq: Option<&'a str>,
    /// What a new producer must fit in.
    pub producer_limits: &'a ProducerLimits,
}

/// What an accepted append did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendOutcome {
    /// Records were assigned `start_offset..next_offset`, all with `timestamp_ms`.
    Appended {
        start_offset: u64,
        next_offset: u64,
        timestamp_ms: i64,
        closed: bool,
    },
    /// No records; the stream is (now, or already was) closed.
    Closed { next_offset: u64, newly: bool },
    /// A producer retried a request already applied: nothing written. `last_seq` is the
    /// producer's highest accepted sequence; answer once `next_offset` is durable.
    Duplicate {
        next_offset: u64,
        last_seq: u64,
        closed: bool,
    },
}

impl StreamState {
    pub fn new(id: u64, config: StreamConfig, closed: bool, now_ms: i64) -> StreamState {
        let content_type = Arc::from(config.content_type);
        let StreamConfig {
            ttl_sec,
            expires_at_ms,
            retention,
            ..
        } = config;
        StreamState::with_content_type(
            id,
            content_type,
            (ttl_sec, expires_at_ms, retention),
            closed,
            now_ms,
        )
    }

    /// [`StreamState::new`] with its content type given as the copy to share (the owning
    /// core's, `Streams::shared_content_type`) and the rest of the configuration as
    /// `(ttl_sec, expires_at_ms, retention)`.
    pub fn with_content_type(
        id: u64,
        content_type: Arc<str>,
        (ttl_sec, expires_at_ms, retention): (Option<u64>, Option<i64>, pico_meta::Retention),
        closed: bool,
        now_ms: i64,
    ) -> StreamState {
        let mut state = StreamState {
            id,
            content_type,
            created_ms: now_ms,
            start_offset: 0,
            next_offset: 0,
            durable_offset: 0,
            last_timestamp_ms: 0,
            last_access_ms: now_ms,
            closed,
            closed_durable: closed,
            soft_deleted: false,
            extras: None,
        };
        if ttl_sec.is_some() || expires_at_ms.is_some() || !retention.is_off() {
            let extras = state.extras_mut();
            extras.ttl_sec = ttl_sec;
            extras.expires_at_ms = expires_at_ms;
            extras.retention = retention;
        }
        state
    }

    /// The fields few streams set (their defaults when none is).
    pub fn extras(&self) -> &StreamExtras {
        self.extras.as_deref().unwrap_or(&NO_EXTRAS)
    }

    /// The fields few streams set, boxed now if they were not yet.
    pub fn extras_mut(&mut self) -> &mut StreamExtras {
        self.extras.get_or_insert_with(Box::default)
    }

    /// The configuration fixed at create (and the retention as configured since).
    pub fn config(&self) -> StreamConfig {
        let extras = self.extras();
        StreamConfig {
            content_type: self.content_type.to_string(),
            ttl_sec: extras.ttl_sec,
            expires_at_ms: extras.expires_at_ms,
            retention: extras.retention,
        }
    }

    /// The fork origin, for a fork.
    pub fn fork(&self) -> Option<&ForkOrigin> {
        self.extras().fork.as_ref()
    }

    /// The first offset of the stream's own records (above the inherited ones of a fork).
    pub fn own_base(&self) -> u64 {
        self.fork().map_or(0, ForkOrigin::base)
    }

    /// The instant after which the stream no longer exists, if any.
    pub fn deadline_ms(&self) -> Option<i64> {
        let extras = self.extras();
        let sliding = extras.ttl_sec.map(|ttl| {
            let ttl_ms = i64::try_from(ttl).unwrap_or(i64::MAX).saturating_mul(1000);
            self.last_access_ms.saturating_add(ttl_ms)
        });
        match (sliding, extras.expires_at_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn is_expired(&self, now_ms: i64) -> bool {
        self.deadline_ms()
            .is_some_and(|deadline| now_ms >= deadline)
    }

    /// Reads and appends slide the TTL; `HEAD` does not.
    pub fn touch(&mut self, now_ms: i64) {
        self.last_access_ms = self.last_access_ms.max(now_ms);
    }

    /// Validates and assigns an append. On error the state is unchanged; every accepted
    /// request (also a duplicate or a repeated close) slides the TTL.
    pub fn apply_append(
        &mut self,
        command: AppendCommand,
        now_ms: i64,
    ) -> Result<AppendOutcome, AppendError> {
        let outcome = self.assign_append(command, now_ms)?;
        self.touch(now_ms);
        Ok(outcome)
    }

    fn assign_append(
        &mut self,
        command: AppendCommand,
        now_ms: i64,
    ) -> Result<AppendOutcome, AppendError> {
        if command.records == 0 && !command.close {
            return Err(AppendError::Invalid(InvalidAppend::EmptyBody));
        }
        // Producer outcomes come before the closed check, so a retry of a request that was
        // applied (even the one that closed the stream) still succeeds.
        if let Some(producer) = command.producer {
            if let Some(duplicate) = self.check_producer(producer)? {
                return Ok(duplicate);
            }
            self.extras_mut()
                .producers
                .admit(&producer.id, command.producer_limits, now_ms)?;
        }
        if self.closed {
            if command.records == 0 {
                let other_closer = match (command.producer, &self.extras().closed_by) {
                    (Some(producer), Some(closer)) => producer != closer,
                    _ => false,
                };
                if other_closer {
                    return Err(AppendError::Closed {
                        next_offset: self.next_offset,
                    });
                }
                return Ok(AppendOutcome::Closed {
                    next_offset: self.next_offset,
                    newly: false,
                });
            }
            return Err(AppendError::Closed {
                next_offset: self.next_offset,
            });
        }
        if let Some(given) = command.content_type {
            if command.records > 0 && !mime_base_eq(given, &self.content_type) {
                return Err(AppendError::ContentTypeMismatch {
                    expected: self.content_type.to_string(),
                });
            }
        }
        if let (Some(given), Some(last)) = (command.writer_seq, &self.extras().writer_seq) {
            if given.as_bytes() <= last.as_bytes() {
                return Err(AppendError::WriterSeqRegression { last: last.clone() });
            }
        }
        if let Some(expected) = command.match_offset {
            if expected != self.next_offset {
                return Err(AppendError::MatchFailed {
                    expected,
                    actual: self.next_offset,
                });
            }
        }
        if let Some(given) = command.writer_seq {
            self.extras_mut().writer_seq = Some(given.to_string());
        }
        if let Some(producer) = command.producer {
            self.extras_mut()
                .producers
                .record(producer, command.producer_limits, now_ms);
        }
        if command.close {
            self.closed = true;
            if let Some(producer) = command.producer {
                self.extras_mut().closed_by = Some(producer.clone());
            }
        }
        if command.records == 0 {
            return Ok(AppendOutcome::Closed {
                next_offset: self.next_offset,
                newly: true,
            });
        }
        let timestamp_ms = now_ms.max(self.last_timestamp_ms + 1);
        self.last_timestamp_ms = timestamp_ms;
        let start_offset = self.next_offset;
        self.next_offset += command.records;
        Ok(AppendOutcome::Appended {
            start_offset,
            next_offset: self.next_offset,
            timestamp_ms,
            closed: command.close,
        })
    }

    /// The producer decision table: `Ok(None)` to apply, `Ok(Some(Duplicate))` for a retry of
    /// an applied request, or the error to answer.
    fn check_producer(
        &self,
        producer: &ProducerTuple,
    ) -> Result<Option<AppendOutcome>, AppendError> {
        let new_epoch_error = || AppendError::Invalid(InvalidAppend::NewEpochNotAtZero);
        match self.extras().producers.get(&producer.id) {
            None if producer.seq != 0 => Err(AppendError::UnknownProducer {
                received: producer.seq,
            }),
            None => Ok(None),
            Some(&Producer { epoch, .. }) if producer.epoch < epoch => {
                Err(AppendError::StaleProducerEpoch { current: epoch })
            }
            Some(&Producer { epoch, .. }) if producer.epoch > epoch => {
                if producer.seq == 0 {
                    Ok(None)
                } else {
                    Err(new_epoch_error())
                }
            }
            Some(&Producer { seq: last, .. }) if producer.seq <= last => {
                Ok(Some(AppendOutcome::Duplicate {
                    next_offset: self.next_offset,
                    last_seq: last,
                    closed: self.closed,
                }))
            }
            Some(&Producer { seq: last, .. }) if producer.seq > last.saturating_add(1) => {
                Err(AppendError::ProducerSequenceGap {
                    expected: last.saturating_add(1),
                    received: producer.seq,
                })
            }
            Some(_) => Ok(None),
        }
    }

    /// Records up to `next_offset` (and the close, if `closed`) became durable.
    pub fn mark_durable(&mut self, next_offset: u64, closed: bool) {
        debug_assert!(next_offset <= self.next_offset);
        self.durable_offset = self.durable_offset.max(next_offset);
        self.closed_durable |= closed;
    }

    /// Raises the first readable offset to `offset`, clamped to `[start, durable tail]`
    /// (trim). Returns the new start.
    pub fn trim(&mut self, offset: u64) -> u64 {
        self.start_offset = self.trimmed_start(offset);
        self.start_offset
    }

    /// Where a trim to `offset` would put the start: never back, never past the durable tail.
    pub fn trimmed_start(&self, offset: u64) -> u64 {
        offset.clamp(
            self.start_offset,
            self.durable_offset.max(self.start_offset),
        )
    }

    /// Checks a read position against the readable range.
    pub fn check_read(&self, from: u64) -> Result<(), ReadError> {
        if from < self.start_offset {
            return Err(ReadError::OffsetGone {
                requested: from,
                start: self.start_offset,
            });
        }
        if from > self.durable_offset {
            return Err(ReadError::OffsetBeyondTail {
                requested: from,
                tail: self.durable_offset,
            });
        }
        Ok(())
    }

    /// Whether a reader that got everything up to `next_offset` is at the closed end.
    pub fn closed_at(&self, next_offset: u64) -> bool {
        self.closed_durable && next_offset >= self.durable_offset
    }

    /// An existing stream accepts an idempotent create only with the same configuration.
    pub fn check_recreate(
        &self,
        config: &StreamConfig,
        closed: bool,
        fork: Option<&ForkOrigin>,
    ) -> Result<(), CreateError> {
        if self.soft_deleted {
            return Err(CreateError::ConfigMismatch {
                reason: Mismatch::DeletedWithForks,
                next_offset: self.durable_offset,
            });
        }
        let mismatch = |reason: Mismatch| CreateError::ConfigMismatch {
            reason,
            next_offset: self.durable_offset,
        };
        let extras = self.extras();
        if extras.ttl_sec != config.ttl_sec
            || extras.expires_at_ms != config.expires_at_ms
            || self.closed != closed
        {
            return Err(mismatch(Mismatch::Config));
        }
        if self.fork() != fork {
            return Err(mismatch(Mismatch::ForkOrigin));
        }
        if !mime_base_eq(&self.content_type, &config.content_type) {
            return Err(mismatch(Mismatch::ContentType {
                existing: self.content_type.to_string(),
            }));
        }
        Ok(())
    }
}

/// Compares the MIME base types (before `;`), case-insensitively. Every append with a
/// content type asks, so it allocates nothing, and two content types written alike (an
/// append's and its stream's, nearly always) are equal without finding their bases.
pub fn mime_base_eq(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b) || mime_base(a).eq_ignore_ascii_case(mime_base(b))
}

/// Whether `content_type`'s base type is `base` (lowercase ASCII without spaces or `;`),
/// case-insensitively. A content type that starts with another visible ASCII character
/// than `base` is told apart by its first bytes, without a scan for `;`.
pub fn mime_base_is(content_type: &str, base: &str) -> bool {
    let bytes = content_type.as_bytes();
    let opens_with_base = bytes
        .get(..base.len())
        .is_some_and(|start| start.eq_ignore_ascii_case(base.as_bytes()));
    // A base type found at byte 0 that is `base` opens the content type; one found later
    // follows whitespace, which is not a visible ASCII character.
    if !opens_with_base && bytes.first().is_some_and(u8::is_ascii_graphic) {
        return false;
    }
    mime_base(content_type).eq_ignore_ascii_case(base)
}

/// A content type's base type: what comes before its parameters, trimmed. The `;` is found
/// by a byte scan, which costs a third of `split_once`'s character searcher on a content type.
pub fn mime_base(content_type: &str) -> &str {
    let base = match content_type.bytes().position(|b| b == b';') {
        // `;` is ASCII: a character boundary.
        Some(at) => &content_type[..at],
        None => content_type,
    };
    base.trim()
}

#[cfg(test)]
mod tests;
