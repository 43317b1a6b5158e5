//! What the Pico handlers are configured with, shared by every file of the protocol.

use pico_meta::Retention;

/// Settings of the Pico handlers.
#[derive(Clone)]
pub struct PicoSettings {
    pub long_poll_timeout_ms: u64,
    pub max_chunk_size: usize,
    pub sse_max_duration_ms: u64,
    pub cors_origin: String,
    /// `--auth required`: the token table shared by the cores.
    pub auth: Option<std::sync::Arc<crate::auth::SharedTokens>>,
    /// Durable Streams subscriptions watch the same streams: Pico writes wake them too.
    pub subscriptions: std::sync::Arc<crate::subscriptions::Subscriptions>,
    /// The node's waker of named consumers (their wake webhooks).
    pub consumer_wakes: crate::consumers::ConsumerWakes,
    /// `https` when the listener serves TLS (for the callbacks of consumer wakes).
    pub scheme: &'static str,
    /// `--default-retention-*`: each limit a create does not set.
    pub default_retention: Retention,
    /// Where the node serves Durable Streams, named when a request of that protocol comes
    /// here (`crate::crossing`).
    pub durable_streams: crate::crossing::OtherListener,
}
