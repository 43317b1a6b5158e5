//! PicoMQ client library: the stream operations of the Pico and Durable Streams protocols
//! over HTTP (reqwest), the Pico binary batch codecs, a typed error, and an idempotent,
//! batching [`Producer`] session (Pico). Used by the `pico` CLI and the tests.
//!
//! ```no_run
//! # async fn demo() -> Result<(), pico_client::ClientError> {
//! use pico_client::{Client, ClientConfig};
//! let client = Client::new(ClientConfig::new("http://127.0.0.1:4437"))?;
//! client.create("/streams/orders", Some("text/plain"), None).await?;
//! let ack = client.append_binary_batch("/streams/orders", &["a".into(), "b".into()]).await?;
//! let page = client.read("/streams/orders", ack.start).await?;
//! assert_eq!(page.records.len(), 2);
//! # Ok(())
//! # }
//! ```

mod answers;
mod client;
pub mod codec;
mod consumers;
mod error;
mod parse;
mod position;
mod producer;

pub use answers::{
    AppendAck, ListedStream, ProducerAck, ReadPage, Retention, StreamInfo, StreamList,
    DEFAULT_CONTENT_TYPE,
};
pub use client::{build_http_client, http_client_builder, Client, ClientConfig, Protocol};
pub use codec::{CodecError, NewRecord, Record};
pub use consumers::{ConsumerCursor, ConsumerView};
pub use error::{kind_for_status, transport_message, ApiError, ClientError, ErrorKind};
pub use position::Position;
pub use producer::{Producer, ProducerConfig, SendHandle};
