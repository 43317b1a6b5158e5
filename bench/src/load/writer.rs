//! Writers: one append outstanding each, over reqwest or the writers' own HTTP/2
//! connections.

use std::sync::Arc;
use std::time::Instant;

use reqwest::header::CONTENT_TYPE;

use super::clock::Shared;
use crate::args::BenchArgs;
use crate::pacing::Pacer;
use crate::wire::{self, AppendShape, REQUEST_TIMEOUT};
use crate::Connection;

/// How writers send their appends.
pub(super) enum Transport {
    Reqwest(reqwest::Client),
    /// `--http2` to an `http://` endpoint that serves the streams itself.
    Direct(crate::h2direct::H2Conn),
}

/// The writers' own HTTP/2 connections, when they measure the same thing as reqwest would:
/// `--http2` (cleartext) and every stream served by the endpoint itself (no cluster redirect).
pub(super) async fn direct_connections(
    args: &BenchArgs,
    conn: &Connection,
    base: &str,
    client: &reqwest::Client,
    names: &[String],
) -> Result<Option<Vec<crate::h2direct::H2Conn>>, String> {
    let Some(authority) = conn
        .http2
        .then(|| crate::h2direct::cleartext_authority(base))
        .flatten()
    else {
        return Ok(None);
    };
    for name in names {
        let url = format!("{base}{name}");
        let served_here = match client.head(&url).send().await {
            Ok(resp) => resp.url().as_str() == url,
            Err(_) => false,
        };
        if !served_here {
            return Ok(None);
        }
    }
    let mut conns = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        conns.push(crate::h2direct::H2Conn::connect(&authority, conn.token.as_deref()).await?);
    }
    Ok(Some(conns))
}

/// One writer: appends `shape.body` until stopped, one request outstanding.
#[allow(clippy::too_many_arguments)]
pub(super) async fn writer(
    shared: Arc<Shared>,
    transport: Transport,
    url: String,
    name: String,
    shape: AppendShape,
    records: u64,
    bytes: u64,
    pacer: Option<Arc<Pacer>>,
) {
    while !shared.stopped() {
        if let Some(pacer) = &pacer {
            tokio::select! {
                _ = pacer.pace(bytes) => {}
                _ = shared.until_stopped() => break,
            }
        }
        let sent = Instant::now();
        match transport
            .append(&url, &shape, &format!("append to {name}"))
            .await
        {
            Ok(()) => {
                let micros = sent.elapsed().as_micros() as u64;
                shared.record_write(records, bytes, Some(micros));
            }
            Err(message) => {
                shared.fail(message);
                break;
            }
        }
    }
}

impl Transport {
    /// One append; `Err` says why it was not acknowledged, starting with `what`.
    async fn append(&self, url: &str, shape: &AppendShape, what: &str) -> Result<(), String> {
        match self {
            Transport::Reqwest(client) => {
                let resp = client
                    .post(url)
                    .header(CONTENT_TYPE, shape.content_type)
                    .body(shape.body.clone())
                    .send()
                    .await
                    .map_err(|e| format!("{what}: {}", wire::describe(&e)))?;
                if resp.status() != shape.ok {
                    return Err(wire::status_error(what, resp).await);
                }
                let _ = resp.bytes().await;
                Ok(())
            }
            Transport::Direct(h2) => {
                let posted = tokio::time::timeout(
                    REQUEST_TIMEOUT,
                    h2.post(url, shape.content_type, shape.body.clone()),
                )
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {REQUEST_TIMEOUT:?}")))
                .map_err(|e| format!("{what}: {e}"))?;
                match posted {
                    (status, _) if status == shape.ok => Ok(()),
                    (status, body) => Err(wire::error_message(
                        what,
                        status.as_u16(),
                        &String::from_utf8_lossy(&body),
                    )),
                }
            }
        }
    }
}
