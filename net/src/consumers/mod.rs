//! Named consumers: the server remembers where each reader of a set of streams stands.
//!
//! Durable Streams serves them under `{root}__ds/consumers` (the draft "L1 named consumers"
//! API; `docs/consumers.md`):
//!
//! ```text
//! POST   {root}__ds/consumers                {consumer_id, streams, lease_ttl_ms?}  register
//! GET    {root}__ds/consumers/{id}           state and committed offsets
//! DELETE {root}__ds/consumers/{id}
//! POST   {root}__ds/consumers/{id}/acquire   new epoch + bearer token, state READING
//! POST   {root}__ds/consumers/{id}/ack       Bearer token; {offsets:[{path, offset}]}
//! POST   {root}__ds/consumers/{id}/release   Bearer token; back to REGISTERED
//! PUT    {root}__ds/consumers/{id}/wake      {type:"webhook", url}: appends wake it
//! DELETE {root}__ds/consumers/{id}/wake
//! ```
//!
//! State lives in the metadata log, one document per consumer (`rules.rs` has its format and
//! every rule), changed in one transaction per request: a committed offset survives what the
//! metadata log survives (kill -9, power cuts, a node's failover in a cluster, where every
//! node reads the same rows). A consumer belongs to the root it was registered under and
//! follows streams under that root only, so a token granted a prefix reaches the consumers
//! of that prefix only.
//!
//! A consumer with a wake webhook is woken on appends (`wake.rs` the rules and the body,
//! `waker.rs` the node's service that hears the writes and delivers).

mod routes;
pub mod rules;
mod view;
mod wake;
mod waker;

pub use routes::{handle_ds, handle_pico, is_pico_call, Node};
pub use waker::{ConsumerWakes, WAKES_DELIVERED, WAKES_FAILED};
