//! Producer mode: writers hand records to one idempotent producer per stream (raw producer
//! headers), which batches them and keeps a few requests in flight.

use pico_proto::header::*;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use reqwest::header::CONTENT_TYPE;
use reqwest::StatusCode;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;

use super::clock::Shared;
use crate::pacing::Pacer;
use crate::wire::{self, BATCH_CONTENT_TYPE};

/// A record handed to a producer: where to report its durability.
pub(super) struct Pending {
    done: oneshot::Sender<Result<(), ()>>,
}

/// Producer mode writer: hands one record at a time to its stream's producer and waits for
/// it to be durable; latency per record.
pub(super) async fn producer_writer(
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<Pending>,
    record_size: u64,
    pacer: Option<Arc<Pacer>>,
) {
    while !shared.stopped() {
        if let Some(pacer) = &pacer {
            tokio::select! {
                _ = pacer.pace(record_size) => {}
                _ = shared.until_stopped() => break,
            }
        }
        let (done, acked) = oneshot::channel();
        let sent = Instant::now();
        if tx.send(Pending { done }).is_err() {
            break;
        }
        match acked.await {
            Ok(Ok(())) => {
                let micros = sent.elapsed().as_micros() as u64;
                shared.record_write(1, record_size, Some(micros));
            }
            // The producer failed (and recorded why) or stopped.
            _ => break,
        }
    }
}

/// An idempotent producer over the raw headers: `Pico-Producer-Id`, `-Epoch` (0) and
/// `-Seq` (one per request, from 0). Records queued by the writers are sent in batches of up
/// to `batch`, with up to `max_requests` requests in flight; a request that overtakes its
/// predecessor (`409 sequence_gap`) is sent again once every earlier one is acknowledged.
pub(super) struct ProducerTask {
    pub(super) client: reqwest::Client,
    pub(super) url: String,
    pub(super) name: String,
    pub(super) id: String,
    pub(super) batch: usize,
    pub(super) record_size: usize,
    pub(super) max_requests: usize,
    pub(super) shared: Arc<Shared>,
}

impl ProducerTask {
    pub(super) async fn run(self, mut rx: mpsc::UnboundedReceiver<Pending>) {
        let this = Arc::new(self);
        let mut next_seq = 0u64;
        // Number of requests acknowledged without a hole (all sequences below it).
        let (acked_tx, acked_rx) = watch::channel(0u64);
        let mut done = BTreeSet::new();
        let mut in_flight: JoinSet<(u64, Vec<Pending>, Result<(), String>)> = JoinSet::new();
        let mut open = true;
        loop {
            tokio::select! {
                joined = in_flight.join_next(), if !in_flight.is_empty() => {
                    let Some(Ok((seq, pendings, result))) = joined else {
                        this.shared.fail(format!("producer of {} failed", this.name));
                        break;
                    };
                    match result {
                        Ok(()) => {
                            for p in pendings {
                                let _ = p.done.send(Ok(()));
                            }
                            done.insert(seq);
                            let mut contiguous = *acked_tx.borrow();
                            while done.remove(&contiguous) {
                                contiguous += 1;
                            }
                            acked_tx.send_replace(contiguous);
                        }
                        Err(e) => {
                            this.shared.fail(e);
                            break;
                        }
                    }
                }
                first = rx.recv(), if open && in_flight.len() < this.max_requests => {
                    let Some(first) = first else {
                        open = false;
                        continue;
                    };
                    let mut pendings = vec![first];
                    while pendings.len() < this.batch {
                        match rx.try_recv() {
                            Ok(p) => pendings.push(p),
                            Err(_) => break,
                        }
                    }
                    let seq = next_seq;
                    next_seq += 1;
                    let body = wire::encode_batch(pendings.len(), this.record_size);
                    let task = this.clone();
                    let acked = acked_rx.clone();
                    in_flight.spawn(async move {
                        let result = task.send(seq, body, acked).await;
                        (seq, pendings, result)
                    });
                }
                _ = this.shared.until_stopped(), if open => {
                    // No new requests; finish the ones in flight.
                    open = false;
                    rx.close();
                }
                else => break,
            }
        }
        // Anything still queued fails (its writer stops).
        in_flight.abort_all();
        rx.close();
        while rx.try_recv().is_ok() {}
    }

    async fn send(
        &self,
        seq: u64,
        body: Bytes,
        mut acked: watch::Receiver<u64>,
    ) -> Result<(), String> {
        let what = format!("append to {} (producer seq {seq})", self.name);
        loop {
            // Every earlier request acknowledged before this send: a gap is then real.
            let acked_before = *acked.borrow();
            let predecessors_done = acked_before >= seq;
            let resp = self
                .client
                .post(&self.url)
                .header(CONTENT_TYPE, BATCH_CONTENT_TYPE)
                .header(PICO_PRODUCER_ID, &self.id)
                .header(PICO_PRODUCER_EPOCH, "0")
                .header(PICO_PRODUCER_SEQ, seq.to_string())
                .body(body.clone())
                .send()
                .await
                .map_err(|e| format!("{what}: {}", wire::describe(&e)))?;
            let status = resp.status();
            if status == StatusCode::OK {
                let _ = resp.bytes().await;
                return Ok(());
            }
            // Overtaking shows as `409 sequence_gap`, or as `400` while the server has not
            // seen the producer's sequence 0 yet (a new producer must start at 0).
            let overtaken = (status == StatusCode::CONFLICT
                || (status == StatusCode::BAD_REQUEST && acked_before == 0))
                && !predecessors_done;
            if overtaken {
                let text = resp.text().await.unwrap_or_default();
                let code = wire::error_code(&text);
                if matches!(code.as_deref(), Some("sequence_gap" | "bad_request")) {
                    // Overtook an earlier request: wait for it, then send again.
                    acked
                        .wait_for(|n| *n >= seq)
                        .await
                        .map_err(|_| format!("{what}: the producer stopped"))?;
                    continue;
                }
                return Err(format!("{what}: HTTP {status}: {text}"));
            }
            return Err(wire::status_error(&what, resp).await);
        }
    }
}
