//! What every file of the Durable Streams protocol shares: its settings, the wire form of
//! offsets, and the small request facts (JSON mode, base URL, a fork's source path).

use std::sync::Arc;

use super::error::DsError;
use crate::subscriptions::Subscriptions;
use crate::transport::message::Request;

/// Settings of the Durable Streams handlers.
#[derive(Clone)]
pub struct DsSettings {
    pub long_poll_timeout_ms: u64,
    /// An SSE response ends after this long; the client reconnects from its last offset.
    pub sse_max_duration_ms: u64,
    /// Live reads and SSE events carry at most this per response or event.
    pub max_chunk_size: usize,
    /// A catch-up read answers up to the tail within this (never less than `max_chunk_size`).
    pub catch_up_bytes: usize,
    pub cors_origin: String,
    /// `https` when the listener serves TLS (for absolute URLs in `Location`).
    pub scheme: &'static str,
    pub subscriptions: Arc<Subscriptions>,
    /// The node's waker of named consumers (their wake webhooks).
    pub consumer_wakes: crate::consumers::ConsumerWakes,
    /// The protocol has no retention header: a stream created here gets the node's default
    /// (`--default-retention-*`), and a Pico `PATCH` can change it later.
    pub default_retention: pico_meta::Retention,
    /// Where the node serves the Pico protocol, named when a request of that protocol comes
    /// here (`crate::crossing`).
    pub pico: crate::crossing::OtherListener,
}

/// Immutable catch-up chunks (they end before the tail) may be cached.
pub(super) const CATCH_UP_CACHE: &str = "public, max-age=60, stale-while-revalidate=300";

/// The wire form of a position: record `seq`, `bytes` into it ([`pico_proto::offset`]).
pub use pico_proto::offset::format as format_offset;
pub(super) use pico_proto::offset::Offset as Position;

/// A parsed `offset` (or `Stream-Fork-Offset`).
pub(super) fn parse_offset(text: &str) -> Result<Position, DsError> {
    pico_proto::offset::parse(text)
        .ok_or_else(|| DsError::bad_request(format!("invalid offset: {text:?}")))
}

pub(super) fn base_url(settings: &DsSettings, request: &Request) -> String {
    crate::params::base_url(settings.scheme, request)
}

pub(super) fn is_json(content_type: &str) -> bool {
    pico_engine::json::is_json(content_type)
}

/// The stream a `Stream-Forked-From` names: a path on this server, with or without our scheme
/// and host. Authorization and the engine both use exactly this.
pub(super) fn fork_source_path(source: &str) -> &str {
    match source.find("://") {
        Some(at) => source[at + 3..]
            .find('/')
            .map_or("/", |slash| &source[at + 3 + slash..]),
        None => source,
    }
}
