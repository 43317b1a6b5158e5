//! Group commit: the commit loop writes what arrived since its last round to the WAL with one
//! write that is durable when it completes (`RWF_DSYNC`), seals finished segments and keeps a
//! spare WAL file ready; the age loop seals segments that grew old.

use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Durability;
use crate::health::{WalFault, WalHealth, WAL_FILE_RETRY_MS};
use crate::metrics::CoreMetrics;

use super::journal::{Round, RoundWrite, WalFile};
use super::state::Shard;
use super::wal::same_file;

impl Shard {
    pub(super) async fn commit_loop(self: Rc<Self>) {
        loop {
            self.journal.commit_wanted().await;
            loop {
                match self.commit_round().await {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(fault) => {
                        self.set_health(WalHealth::Failed {
                            fault: fault.clone(),
                        });
                        self.fail_pending(&fault);
                        return;
                    }
                }
            }
        }
    }

    /// Makes the oldest open segment with unwritten bytes durable, seals a finished one, and
    /// keeps a spare WAL file ready. Returns whether there may be more to do.
    pub(super) async fn commit_round(self: &Rc<Self>) -> Result<bool, WalFault> {
        // The spare WAL file is created while idle, or right away once the active segment is
        // a quarter full, so a rotation rarely waits for it (one that does lets the segment
        // grow into its slack, and past it a writer's buffer doubles). It is made beside the
        // rounds, which go on meanwhile: creating, reserving and syncing a file takes about a
        // millisecond (a file written through with zeros, `WalFill`, far longer), which a
        // writer filling segments would otherwise pay once per segment in some
        // acknowledgements.
        let journal = &self.journal;
        let wanted = journal.all_durable() || journal.active_reached(self.config.segment_size / 4);
        let due = journal.spare_due(self.clock.now());
        if self.wal_enabled() && !journal.has_spare() && !journal.making_spare() && wanted && due {
            let fill = journal.next_fill(self.config.segment_size / 2);
            journal.set_making_spare(true);
            let shard = self.clone();
            glommio::spawn_local(async move {
                let made = shard.create_wal_file(fill).await;
                shard.journal.set_making_spare(false);
                shard.spare_made(made);
                shard.journal.wake_commit();
            })
            .detach();
        }
        let (no, written_len, write) = match journal.next_round(self.clock.now_ms()) {
            Round::Idle => return Ok(false),
            Round::Seal(no) => {
                self.seal_front(no);
                return Ok(true);
            }
            Round::Write {
                no,
                written_len,
                write,
            } => (no, written_len, write),
        };
        if let Some(RoundWrite {
            file,
            start,
            len,
            buffer,
            path,
        }) = write
        {
            let shown = || path.clone().unwrap_or_else(|| Path::new("?").to_path_buf());
            #[cfg(feature = "fault-injection")]
            if let Some(source) =
                crate::faults::take(&self.config.wal_dir, crate::faults::WalIo::Write)
            {
                return Err(WalFault::Write {
                    path: shown(),
                    source: Arc::new(source),
                });
            }
            // One write that completes once its bytes are durable (`RWF_DSYNC`: as a write and
            // an `fdatasync` of its range, in one request instead of two, the second of which
            // a kernel worker thread ran). A short write is an error too: the bytes past it are
            // not on disk.
            let durable_from = self.clock.now();
            let mut write = std::pin::pin!(file.write_rc_at_durable(buffer.clone(), start as u64));
            // Polled once, the write is in the kernel (vendored glommio submits DMA writes at
            // once), and the file's name is checked while the device works rather than after
            // it, off the acknowledgement's path. A file removed during the write is one
            // removed just after an acknowledgement: the check stops the next round.
            let early = futures_lite::future::poll_once(write.as_mut()).await;
            if let Some(path) = &path {
                same_file(&file, path)?;
            }
            let written = match early {
                Some(done) => done,
                None => write.await,
            }
            .map_err(|e| WalFault::Write {
                path: shown(),
                source: Arc::new(e.into()),
            })?;
            journal.round_buffer_written(buffer, self.clock.now());
            if written < len {
                return Err(WalFault::ShortWrite {
                    path: shown(),
                    written,
                    len,
                });
            }
            // The fault point of the durability step: a failure the device reports for the
            // flush comes back with the write itself.
            #[cfg(feature = "fault-injection")]
            if let Some(source) =
                crate::faults::take(&self.config.wal_dir, crate::faults::WalIo::Sync)
            {
                return Err(WalFault::Fdatasync {
                    path: shown(),
                    source: Arc::new(source),
                });
            }
            // What arrived during the write goes into the kept buffer now, so the next round
            // copies only what comes after.
            journal.stage_next_round(no, written_len);
            CoreMetrics::add(&self.metrics.wal_fsyncs, 1);
            self.metrics
                .wal_fsync_latency
                .observe(self.clock.now().saturating_duration_since(durable_from));
        }
        journal.round_written(no, written_len);
        self.release_acks();
        self.flush_when_free();
        Ok(true)
    }

    /// Takes the outcome of making the spare WAL file. A spare that cannot be made fails no
    /// append: the active file was made with room for its segment, and only appends past
    /// that room are refused until a retry succeeds.
    fn spare_made(&self, made: Result<Option<WalFile>, WalFault>) {
        let journal = &self.journal;
        // A failed WAL stays failed (a file made beside the rounds may come after the
        // failure): it takes appends again only after a restart.
        let failed = journal.failed();
        match made {
            Ok(spare) => {
                if !failed {
                    self.set_health(WalHealth::Ok);
                }
                journal.set_spare(spare);
                if journal.active_reached(self.config.segment_size) {
                    self.rotate();
                }
            }
            // The rounds go on: what the active file holds is still made durable.
            Err(fault) => {
                let retry_at = self.clock.now() + Duration::from_millis(WAL_FILE_RETRY_MS);
                journal.retry_spare_at(retry_at);
                if !failed {
                    self.set_health(WalHealth::NoNextFile { fault });
                }
            }
        }
    }

    pub(super) async fn age_loop(self: Rc<Self>) {
        // The age is at least `limits::SEGMENT_MAX_AGE_MS_MIN` (`EngineConfig::check`).
        let period_ms = (self.config.segment_max_age_ms / 2 + 1).min(WAL_FILE_RETRY_MS);
        let period = Duration::from_millis(period_ms);
        loop {
            glommio::timer::sleep(period).await;
            // A WAL file that could not be made is tried again even when no append comes.
            if self.journal.no_next_file() {
                self.journal.wake_commit();
            }
            // Object durability flushes as soon as the uploader is free (`flush.rs`); an age
            // would only add PUTs beyond the node's budget.
            let old = self.config.durability != Durability::Object
                && self
                    .journal
                    .active_opened_with_frames()
                    .is_some_and(|opened| {
                        self.clock.now().saturating_duration_since(opened)
                            >= Duration::from_millis(self.config.segment_max_age_ms)
                    });
            if old {
                self.rotate();
            }
            // Acknowledgements held back while this node's lease was in doubt go out once it
            // is valid again, even when no new append comes to trigger a commit round.
            let held = self.config.durability != Durability::Object
                && self.cluster.as_ref().is_some_and(|c| c.lease_valid())
                && self.journal.acks_pending();
            if held {
                self.release_acks();
            }
        }
    }
}
