//! `pico bench` against a real `pico serve` over HTTP/1.1 and h2c.
//!
//! Needs the server binary: `cargo build -p pico-cli` (found at `target/debug/pico`, or
//! `$PICO_BENCH_SERVER_BIN`). A missing binary fails the test with that instruction.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pico_bench::{BenchArgs, Connection, LiveMode, Output, Protocol};

/// A running `pico serve` in its own temporary directory; killed on drop.
struct Server {
    child: Child,
    endpoint: String,
    dir: tempfile::TempDir,
}

fn server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("PICO_BENCH_SERVER_BIN") {
        return PathBuf::from(path);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")));
    target.join("debug").join("pico")
}

impl Server {
    fn start() -> Server {
        let bin = server_binary();
        assert!(
            bin.is_file(),
            "the bench tests need the server binary at {}: run `cargo build -p pico-cli` first \
             (or point PICO_BENCH_SERVER_BIN at a pico binary)",
            bin.display()
        );
        let dir = tempfile::Builder::new()
            .prefix("pico-bench-")
            .tempdir()
            .expect("temporary directory");
        let log = std::fs::File::create(dir.path().join("server.log")).expect("server.log");
        let mut command = Command::new(&bin);
        command
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .arg("--meta-url")
            .arg(format!("sqlite:{}", dir.path().join("meta.db").display()))
            .arg("--storage")
            .arg(format!(
                "-2@file://{}",
                dir.path().join("objects").display()
            ))
            .arg("--wal-dir")
            .arg(dir.path().join("wal"))
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("PICO_") {
                command.env_remove(key);
            }
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let endpoint = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix("serving on http://") {
                        let addr = rest.split_whitespace().next().unwrap_or_default();
                        break format!("http://{addr}");
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let log =
                        std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
                    panic!("pico serve did not start; log:\n{log}");
                }
            }
        };
        Server {
            child,
            endpoint,
            dir,
        }
    }

    fn conn(&self, http2: bool) -> Connection {
        Connection {
            endpoint: self.endpoint.clone(),
            protocol: Protocol::Pico,
            http2,
            token: None,
            ca_cert_pem: None,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Names of the streams under `/bench/`.
    async fn bench_streams(&self) -> Vec<String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let resp = reqwest::Client::new()
            .get(format!("{}/?prefix=/bench/", self.endpoint))
            .send()
            .await
            .expect("list streams");
        assert_eq!(resp.status(), 200);
        let list: serde_json::Value =
            serde_json::from_str(&resp.text().await.expect("listing")).expect("listing JSON");
        list["streams"]
            .as_array()
            .expect("streams array")
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_owned())
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn small(duration: u64) -> BenchArgs {
    BenchArgs {
        record_size: 256,
        duration,
        in_flight: 8,
        streams: 2,
        connections: 2,
        interval: 0.5,
        ..BenchArgs::default()
    }
}

async fn run_ok(server: &Server, args: &BenchArgs, http2: bool) -> pico_bench::Summary {
    match pico_bench::run(args, &server.conn(http2)).await {
        Ok(summary) => summary,
        Err(e) => panic!("bench failed: {e}\nserver log:\n{}", server.log()),
    }
}

fn check_throughput(summary: &pico_bench::Summary, args: &BenchArgs) {
    assert!(summary.write.records > 0, "{summary:?}");
    assert_eq!(
        summary.write.bytes,
        summary.write.records * args.record_size as u64,
        "{summary:?}"
    );
    assert!(summary.append_latency.count > 0, "{summary:?}");
    assert!(summary.append_latency.p50_ms > 0.0, "{summary:?}");
    assert!(summary.elapsed_sec >= args.duration as f64, "{summary:?}");
    assert!(
        summary.elapsed_sec < args.duration as f64 + 5.0,
        "{summary:?}"
    );
    let json: serde_json::Value = serde_json::from_str(&summary.to_json()).unwrap();
    assert_eq!(json["write"]["records"], summary.write.records);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_over_http1() {
    let server = Server::start();

    let args = small(2);
    let summary = run_ok(&server, &args, false).await;
    check_throughput(&summary, &args);
    let read = summary.read.expect("readers ran");
    assert!(read.records > 0, "{summary:?}");
    assert!(read.records <= summary.write.records + 64, "{summary:?}");
    assert!(
        server.bench_streams().await.is_empty(),
        "the streams were not deleted"
    );

    // Idempotent producers, batches of up to 4 records, no reader, warmup, JSON mode.
    let args = BenchArgs {
        producer: true,
        batch: 4,
        no_read: true,
        warmup: 1,
        output: Output::Json,
        ..small(1)
    };
    let summary = run_ok(&server, &args, false).await;
    check_throughput(&summary, &args);
    assert!(summary.read.is_none());

    // --keep leaves the streams; paced at 1 MiB/s.
    let args = BenchArgs {
        keep: true,
        target_mibps: 1.0,
        streams: 3,
        ..small(1)
    };
    let summary = run_ok(&server, &args, false).await;
    check_throughput(&summary, &args);
    let mib = summary.write.mib_per_sec(summary.elapsed_sec);
    assert!(mib < 1.5, "pacing at 1 MiB/s gave {mib} MiB/s");
    let kept = server.bench_streams().await;
    assert_eq!(kept.len(), 3, "{kept:?}");
    let prefix = format!("/bench/{}-", std::process::id());
    assert!(kept.iter().all(|n| n.starts_with(&prefix)), "{kept:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_over_h2() {
    let server = Server::start();

    let args = BenchArgs {
        batch: 3,
        ..small(2)
    };
    let summary = run_ok(&server, &args, true).await;
    check_throughput(&summary, &args);
    assert_eq!(summary.write.records % 3, 0);
    assert!(summary.read.expect("readers ran").records > 0);
    assert!(server.bench_streams().await.is_empty());

    // Every append the h2 writers counted is in the streams (kept for the check).
    let args = BenchArgs {
        keep: true,
        no_read: true,
        ..small(1)
    };
    let summary = run_ok(&server, &args, true).await;
    check_throughput(&summary, &args);
    let listing: serde_json::Value = serde_json::from_str(
        &reqwest::Client::new()
            .get(format!("{}/?prefix=/bench/", server.endpoint))
            .send()
            .await
            .expect("list streams")
            .text()
            .await
            .expect("listing"),
    )
    .expect("listing JSON");
    let stored: u64 = listing["streams"]
        .as_array()
        .expect("streams array")
        .iter()
        .map(|s| s["next_seq"].as_u64().expect("next_seq"))
        .sum();
    assert!(
        stored >= summary.write.records,
        "{stored} stored, {} counted",
        summary.write.records
    );
    for name in server.bench_streams().await {
        reqwest::Client::new()
            .delete(format!("{}{name}", server.endpoint))
            .send()
            .await
            .expect("delete a kept stream");
    }

    let args = BenchArgs {
        producer: true,
        batch: 2,
        ..small(1)
    };
    let summary = run_ok(&server, &args, true).await;
    check_throughput(&summary, &args);
    assert!(server.bench_streams().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_latency_sse_and_long_poll() {
    let server = Server::start();
    for (mode, http2) in [(LiveMode::Sse, true), (LiveMode::LongPoll, false)] {
        let args = BenchArgs {
            live_latency: true,
            live_mode: mode,
            duration: 1,
            record_size: 100,
            ..BenchArgs::default()
        };
        let summary = run_ok(&server, &args, http2).await;
        let live = summary.live.clone().expect("live summary");
        assert_eq!(live.mode, mode.name());
        // One append per 10 ms for a second.
        assert!(summary.write.records >= 20, "{summary:?}");
        assert!(live.records >= 10, "{summary:?}");
        assert!(live.latency.p50_ms > 0.0, "{summary:?}");
        assert!(live.latency.max_ms < 10_000.0, "{summary:?}");
        // Measured from the acknowledgement, delivery can only be sooner than from the send.
        assert!(live.after_ack.count >= 10, "{summary:?}");
        assert!(live.after_ack.p50_ms <= live.latency.p50_ms, "{summary:?}");
        let json: serde_json::Value = serde_json::from_str(&summary.to_json()).unwrap();
        assert_eq!(json["live"]["mode"], mode.name());
        assert!(json["live"]["after_ack"]["p99_ms"].is_number());
    }
    assert!(server.bench_streams().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_errors_stop_the_run() {
    // The stream is deleted under the writers: their next append is 404.
    let server = Server::start();
    let args = BenchArgs {
        in_flight: 4,
        // Far longer than the bounds below, which a busy machine does not come near: a run
        // that ends within them was stopped by the error, not by its duration.
        duration: 300,
        streams: 1,
        connections: 1,
        no_read: true,
        interval: 0.0,
        ..BenchArgs::default()
    };
    let conn = server.conn(false);
    let started = Instant::now();
    let bench = tokio::spawn(async move { pico_bench::run(&args, &conn).await });
    let name = loop {
        if let Some(name) = server.bench_streams().await.pop() {
            break name;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no bench stream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let resp = reqwest::Client::new()
        .delete(format!("{}{name}", server.endpoint))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    let err = bench.await.unwrap().unwrap_err();
    assert!(
        err.starts_with(&format!("append to {name}: HTTP 404")),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "the error did not stop the run"
    );
}
