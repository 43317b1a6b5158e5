//! Header names of both protocols, lowercase as HTTP/2 sends them (HTTP/1.1 compares them
//! without case). `docs/api.md` says what each means for Pico, `docs/durable-streams.md` for
//! Durable Streams.

// Pico: appends and their answers.
pub const PICO_NEXT_SEQ: &str = "pico-next-seq";
pub const PICO_START_SEQ: &str = "pico-start-seq";
pub const PICO_TIMESTAMP: &str = "pico-timestamp";
pub const PICO_CLOSED: &str = "pico-closed";
pub const PICO_MATCH_SEQ: &str = "pico-match-seq";
pub const PICO_TRIM_SEQ: &str = "pico-trim-seq";
pub const PICO_PRODUCER_ID: &str = "pico-producer-id";
pub const PICO_PRODUCER_EPOCH: &str = "pico-producer-epoch";
pub const PICO_PRODUCER_SEQ: &str = "pico-producer-seq";
pub const PICO_EXPECTED_SEQ: &str = "pico-expected-seq";
pub const PICO_RECEIVED_SEQ: &str = "pico-received-seq";
// Pico: reads.
pub const PICO_UP_TO_DATE: &str = "pico-up-to-date";
pub const PICO_CURSOR: &str = "pico-cursor";
// Pico: a stream's settings.
pub const PICO_TTL: &str = "pico-ttl";
pub const PICO_EXPIRES_AT: &str = "pico-expires-at";
pub const PICO_RETENTION_AGE: &str = "pico-retention-age";
pub const PICO_RETENTION_BYTES: &str = "pico-retention-bytes";
pub const PICO_DELETE_ON_EMPTY: &str = "pico-delete-on-empty";
pub const PICO_WEBHOOKS: &str = "pico-webhooks";
pub const PICO_SIGNALS: &str = "pico-signals";

// Durable Streams.
pub const STREAM_NEXT_OFFSET: &str = "stream-next-offset";
pub const STREAM_UP_TO_DATE: &str = "stream-up-to-date";
pub const STREAM_CURSOR: &str = "stream-cursor";
pub const STREAM_CLOSED: &str = "stream-closed";
pub const STREAM_SEQ: &str = "stream-seq";
pub const STREAM_TTL: &str = "stream-ttl";
pub const STREAM_EXPIRES_AT: &str = "stream-expires-at";
pub const STREAM_FORKED_FROM: &str = "stream-forked-from";
pub const STREAM_FORK_OFFSET: &str = "stream-fork-offset";
pub const STREAM_FORK_SUB_OFFSET: &str = "stream-fork-sub-offset";
pub const STREAM_SSE_DATA_ENCODING: &str = "stream-sse-data-encoding";
pub const PRODUCER_ID: &str = "producer-id";
pub const PRODUCER_EPOCH: &str = "producer-epoch";
pub const PRODUCER_SEQ: &str = "producer-seq";
pub const PRODUCER_EXPECTED_SEQ: &str = "producer-expected-seq";
pub const PRODUCER_RECEIVED_SEQ: &str = "producer-received-seq";
