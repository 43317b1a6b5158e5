//! Group commit: the commit loop writes what arrived since its last round to the WAL with one
//! write and one `fdatasync`, seals finished segments and keeps a spare WAL file ready; the
//! age loop seals segments that grew old.

use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use crate::config::Durability;
use crate::health::{WalHealth, WAL_FILE_RETRY_MS};
use crate::metrics::CoreMetrics;

use super::state::Shard;
use super::wal::{same_file, WalIoError};
use crate::wal_file::end_round;

impl Shard {
    pub(super) async fn commit_loop(self: Rc<Self>) {
        loop {
            self.commit_wanted.wait().await;
            loop {
                match self.commit_round().await {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(e) => {
                        let message = e.to_string();
                        self.set_health(WalHealth::Failed {
                            message: message.clone(),
                        });
                        self.fail_pending(&message);
                        return;
                    }
                }
            }
        }
    }

    /// Makes the oldest open segment with unwritten bytes durable, seals a finished one, and
    /// keeps a spare WAL file ready. Returns whether there may be more to do.
    pub(super) async fn commit_round(self: &Rc<Self>) -> Result<bool, WalIoError> {
        // The spare WAL file is created while idle, or right away once the active segment is
        // half full, so creating it rarely delays an acknowledgement and a rotation never
        // waits for it.
        let active_len = self.log.borrow().back().map_or(0, |s| s.buf.len());
        let idle = self
            .log
            .borrow()
            .iter()
            .all(|s| s.durable_len == s.buf.len());
        let wanted = idle || active_len >= self.config.segment_size / 2;
        let due = self
            .wal
            .borrow()
            .retry_at
            .is_none_or(|at| self.clock.now() >= at);
        if self.wal_enabled() && self.wal.borrow().spare.is_none() && wanted && due {
            // A spare that cannot be made fails no append: the active file was made with
            // room for its segment, and only appends past that room are refused.
            match self.create_wal_file().await {
                Ok(spare) => {
                    self.wal.borrow_mut().retry_at = None;
                    // (A failed WAL ends the commit loop: no round runs after it.)
                    self.set_health(WalHealth::Ok);
                    self.wal.borrow_mut().spare = spare;
                    let overdue = self
                        .log
                        .borrow()
                        .back()
                        .is_some_and(|s| s.buf.len() >= self.config.segment_size);
                    if overdue {
                        self.rotate();
                    }
                }
                // The round goes on: what the active file holds is still made durable.
                Err(e) => {
                    let retry_at = self.clock.now() + Duration::from_millis(WAL_FILE_RETRY_MS);
                    self.wal.borrow_mut().retry_at = Some(retry_at);
                    self.set_health(WalHealth::NoNextFile {
                        message: e.message,
                        out_of_space: e.out_of_space,
                    });
                }
            }
        }
        let job = {
            let log = self.log.borrow();
            let count = log.len();
            log.iter().enumerate().find_map(|(i, segment)| {
                let sealed = i + 1 < count;
                if segment.durable_len < segment.buf.len() {
                    Some((segment.no, false))
                } else if sealed {
                    Some((segment.no, true))
                } else {
                    None
                }
            })
        };
        let Some((no, seal)) = job else {
            return Ok(false);
        };
        if seal {
            self.seal_front(no);
            return Ok(true);
        }
        // `written_len`: the segment's bytes this round makes durable (appends that arrive
        // during the write wait for the next round).
        let (file, start, len, written_len, buffer, path) = {
            let mut log = self.log.borrow_mut();
            let segment = log.iter_mut().find(|s| s.no == no).expect("picked above");
            match &segment.wal {
                None => (None, 0, 0, segment.buf.len(), None, None),
                Some(file) => {
                    // The round's frames, then the epoch records of streams new to the segment
                    // and its commit record, in the segment's own bytes (`wal_file.rs`). Taken:
                    // a failed round fails the WAL, and no round follows it.
                    let epochs = std::mem::take(&mut segment.wal_epochs);
                    segment.wal_rounds += 1;
                    let now = self.clock.now_ms();
                    end_round(&mut segment.buf, segment.wal_rounds, &epochs, now);
                    let written_len = segment.buf.len();
                    // DMA writes whole blocks: the round starts at the block holding the end
                    // of the previous one, rewriting its bytes as they are.
                    let align = file.alignment() as usize;
                    let start = segment.durable_len / align * align;
                    let size = (written_len - start).div_ceil(align) * align;
                    let mut buffer = file.alloc_dma_buffer(size);
                    let dst = buffer.as_bytes_mut();
                    dst[..written_len - start].copy_from_slice(&segment.buf[start..written_len]);
                    dst[written_len - start..].fill(0);
                    let path = segment.wal_path.clone();
                    let (file, buffer) = (Some(file.clone()), Some(buffer));
                    (file, start, written_len - start, written_len, buffer, path)
                }
            }
        };
        if let (Some(file), Some(buffer)) = (file, buffer) {
            let shown = || path.clone().unwrap_or_else(|| Path::new("?").to_path_buf());
            #[cfg(feature = "fault-injection")]
            if let Some(source) =
                crate::faults::take(&self.config.wal_dir, crate::faults::WalIo::Write)
            {
                return Err(WalIoError::Write {
                    path: shown(),
                    source,
                });
            }
            // A short write is an error too: the bytes past it are not on disk.
            let written =
                file.write_at(buffer, start as u64)
                    .await
                    .map_err(|e| WalIoError::Write {
                        path: shown(),
                        source: e.into(),
                    })?;
            if written < len {
                return Err(WalIoError::ShortWrite {
                    path: shown(),
                    written,
                    len,
                });
            }
            let synced = self.clock.now();
            #[cfg(feature = "fault-injection")]
            if let Some(source) =
                crate::faults::take(&self.config.wal_dir, crate::faults::WalIo::Sync)
            {
                return Err(WalIoError::Fdatasync {
                    path: shown(),
                    source,
                });
            }
            file.fdatasync().await.map_err(|e| WalIoError::Fdatasync {
                path: shown(),
                source: e.into(),
            })?;
            CoreMetrics::add(&self.metrics.wal_fsyncs, 1);
            self.metrics
                .wal_fsync_latency
                .observe(self.clock.now().saturating_duration_since(synced));
            if let Some(path) = &path {
                same_file(&file, path)?;
            }
        }
        if let Some(segment) = self.log.borrow_mut().iter_mut().find(|s| s.no == no) {
            segment.durable_len = written_len;
        }
        self.release_acks();
        self.flush_when_free();
        Ok(true)
    }

    pub(super) async fn age_loop(self: Rc<Self>) {
        // The age is at least `limits::SEGMENT_MAX_AGE_MS_MIN` (`EngineConfig::check`).
        let period_ms = (self.config.segment_max_age_ms / 2 + 1).min(WAL_FILE_RETRY_MS);
        let period = Duration::from_millis(period_ms);
        loop {
            glommio::timer::sleep(period).await;
            // A WAL file that could not be made is tried again even when no append comes.
            if matches!(self.wal.borrow().health, WalHealth::NoNextFile { .. }) {
                self.commit_wanted.notify();
            }
            // Object durability flushes as soon as the uploader is free (`flush.rs`); an age
            // would only add PUTs beyond the node's budget.
            let old = self.config.durability != Durability::Object && {
                let log = self.log.borrow();
                let active = log.back().expect("an active segment always exists");
                !active.buf.is_empty()
                    && self.clock.now().saturating_duration_since(active.opened)
                        >= Duration::from_millis(self.config.segment_max_age_ms)
            };
            if old {
                self.rotate();
            }
            // Acknowledgements held back while this node's lease was in doubt go out once it
            // is valid again, even when no new append comes to trigger a commit round.
            let held = self.config.durability != Durability::Object
                && self.cluster.as_ref().is_some_and(|c| c.lease_valid())
                && !self.acks.borrow().is_empty();
            if held {
                self.release_acks();
            }
        }
    }
}
