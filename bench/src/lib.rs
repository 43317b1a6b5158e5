//! PicoMQ load generator: `pico bench` (README.md, "Operating a node").
//!
//! [`run`] creates temporary streams (`/bench/<pid>-<unix ms>-<i>`), runs `--in-flight`
//! writer tasks (each with one append outstanding) spread round-robin over the streams and
//! over `--connections` independent HTTP client pools, one catch-up reader per stream, and
//! returns a [`Summary`]. Progress lines go to stderr in text mode; the caller prints the
//! summary ([`Summary::print_text`] or [`Summary::to_json`] on stdout).
//!
//! `--live-latency` runs a different measurement: one writer appends a record every 10 ms
//! and one live reader (SSE or long-poll) follows the stream; it reports the time from just
//! before an append is sent to the moment its record reaches the reader, and the time from
//! the writer having the append's acknowledgement to that moment (0 when the reader was first).
//!
//! ```no_run
//! # async fn demo() -> Result<(), String> {
//! use pico_bench::{BenchArgs, Connection, Output};
//! let args = BenchArgs { duration: 5, ..BenchArgs::default() };
//! let conn = Connection::new("http://127.0.0.1:4437");
//! let summary = pico_bench::run(&args, &conn).await?;
//! match args.output {
//!     Output::Text => summary.print_text(),
//!     Output::Json => println!("{}", summary.to_json()),
//! }
//! # Ok(())
//! # }
//! ```

// First, so that its print macro replaces std's in every module below.
#[macro_use]
mod output;
mod args;
mod fanout;
mod h2direct;
mod live;
mod load;
mod pacing;
mod report;
mod wire;

pub use args::{BenchArgs, LiveMode, Output};
pub use pico_client::Protocol;
pub use report::{FanOutSummary, Latency, LiveSummary, Summary, Throughput};

/// How to reach the server (the CLI's global connection flags).
#[derive(Clone, Debug, Default)]
pub struct Connection {
    /// Base URL, e.g. `http://127.0.0.1:4437` (a trailing `/` is ignored).
    pub endpoint: String,
    pub protocol: Protocol,
    /// Cleartext HTTP/2 with prior knowledge (h2c) instead of HTTP/1.1.
    pub http2: bool,
    /// Sent as `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Extra trusted root certificates (PEM) for `https://` endpoints.
    pub ca_cert_pem: Option<Vec<u8>>,
}

impl Connection {
    /// Pico protocol over HTTP/1.1, no token.
    pub fn new(endpoint: impl Into<String>) -> Connection {
        Connection {
            endpoint: endpoint.into(),
            ..Connection::default()
        }
    }

    /// The endpoint without a trailing `/`, checked to be an http(s) URL.
    pub(crate) fn base(&self) -> Result<String, String> {
        let base = self.endpoint.trim_end_matches('/').to_owned();
        let url = reqwest::Url::parse(&base)
            .map_err(|e| format!("invalid endpoint {:?}: {e}", self.endpoint))?;
        if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
            return Err(format!(
                "invalid endpoint {:?}: expected http://HOST:PORT or https://HOST:PORT",
                self.endpoint
            ));
        }
        Ok(base)
    }
}

/// Runs the benchmark on the current tokio runtime and returns what it measured.
///
/// Text mode prints `created ...`, `warmup ...` and the progress lines on stderr; nothing is
/// printed in JSON mode. The summary itself is left to the caller. The first append error
/// stops every writer; the streams are still deleted (unless `--keep`) and the error is
/// returned (exit code 1). A multi-threaded runtime lets the load use more than one core;
/// [`run_blocking`] makes one.
pub async fn run(args: &BenchArgs, conn: &Connection) -> Result<Summary, String> {
    args.validate()?;
    if conn.protocol == Protocol::DurableStreams {
        check_ds(args)?;
    }
    if args.fan_out > 0 {
        if conn.http2 {
            return Err(
                "--fan-out opens one HTTP/1.1 connection per subscriber: drop --http2".into(),
            );
        }
        fanout::run(args, conn).await
    } else if args.live_latency {
        live::run(args, conn).await
    } else {
        load::run(args, conn).await
    }
}

/// What the Durable Streams bench cannot do: producers are a Pico session, the
/// live-latency reader follows Pico record sequences, and an append needs a body (a JSON
/// element at least its two quotes).
fn check_ds(args: &BenchArgs) -> Result<(), String> {
    if args.producer {
        return Err("--producer is a Pico protocol feature; use --protocol pico".into());
    }
    if args.live_latency {
        return Err("--live-latency measures the Pico protocol only; use --protocol pico".into());
    }
    let min_size = if args.batch > 1 { 2 } else { 1 };
    if args.record_size < min_size {
        return Err(format!(
            "--record-size must be at least {min_size} with --protocol ds{}",
            if args.batch > 1 {
                " and --batch > 1 (each record is a JSON string)"
            } else {
                ""
            }
        ));
    }
    Ok(())
}

/// [`run`] on a new multi-threaded tokio runtime (one worker per available core); call it
/// from outside any runtime.
pub fn run_blocking(args: &BenchArgs, conn: &Connection) -> Result<Summary, String> {
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(run(args, conn))
}

/// `/bench/<pid>-<unix ms>-<i>` for `i` in `0..count`.
pub fn stream_names(count: usize) -> Vec<String> {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let pid = std::process::id();
    (0..count)
        .map(|i| format!("/bench/{pid}-{ms}-{i}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let names = stream_names(3);
        assert_eq!(names.len(), 3);
        let prefix = format!("/bench/{}-", std::process::id());
        for (i, name) in names.iter().enumerate() {
            assert!(name.starts_with(&prefix), "{name}");
            assert!(name.ends_with(&format!("-{i}")), "{name}");
            let ms: u128 = name[prefix.len()..name.rfind('-').unwrap()]
                .parse()
                .unwrap();
            assert!(ms > 1_600_000_000_000);
        }
    }

    #[test]
    fn endpoint_checks() {
        assert_eq!(
            Connection::new("http://127.0.0.1:1/").base().unwrap(),
            "http://127.0.0.1:1"
        );
        assert!(Connection::new("ftp://x").base().is_err());
        assert!(Connection::new("nonsense").base().is_err());
    }

    #[tokio::test]
    async fn what_ds_cannot_do_is_refused_before_connecting() {
        let conn = Connection {
            protocol: Protocol::DurableStreams,
            ..Connection::new("http://127.0.0.1:1")
        };
        let refused = |args: BenchArgs| {
            let conn = conn.clone();
            async move { run(&args, &conn).await.unwrap_err() }
        };
        let producer = BenchArgs {
            producer: true,
            ..BenchArgs::default()
        };
        assert_eq!(
            refused(producer).await,
            "--producer is a Pico protocol feature; use --protocol pico"
        );
        let live = BenchArgs {
            live_latency: true,
            ..BenchArgs::default()
        };
        assert!(refused(live).await.starts_with("--live-latency"));
        let tiny_json = BenchArgs {
            batch: 3,
            record_size: 1,
            ..BenchArgs::default()
        };
        assert!(refused(tiny_json)
            .await
            .starts_with("--record-size must be at least 2"));
        let empty = BenchArgs {
            record_size: 0,
            ..BenchArgs::default()
        };
        assert!(refused(empty)
            .await
            .starts_with("--record-size must be at least 1"));
        // Everything else gets as far as the (absent) server.
        let err = refused(BenchArgs::default()).await;
        assert!(err.starts_with("create /bench/"), "{err}");
    }
}
