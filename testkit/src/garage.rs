//! A Garage (the S3-compatible store of the tests) of one test's own, on free ports, so the
//! test can kill and restart it without disturbing the shared instance (`PICOMQ_S3_*`).
//! Started with the project's `scripts/garage-up.sh`; needs `garage` on `PATH`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The bucket the tests use (`PICOMQ_S3_BUCKET`, default `segments`).
pub fn bucket() -> String {
    std::env::var("PICOMQ_S3_BUCKET").unwrap_or_else(|_| "segments".to_string())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind a free port")
        .local_addr()
        .unwrap()
        .port()
}

/// A Garage of our own on free ports, started with the project's script; killed on drop.
pub struct OwnGarage {
    dir: tempfile::TempDir,
    port: u16,
    rpc_port: u16,
}

impl OwnGarage {
    /// `None` (and a note; a failure under CI) if `garage` is not installed.
    pub fn start(test: &str) -> Option<OwnGarage> {
        if !crate::require_program(test, "garage", "this test runs its own instance") {
            return None;
        }
        let garage = OwnGarage {
            dir: tempfile::Builder::new()
                .prefix("pico-garage-")
                .tempdir()
                .expect("create a temporary directory"),
            port: free_port(),
            rpc_port: free_port(),
        };
        garage.up();
        Some(garage)
    }

    /// Starts (or restarts, on the same data) the instance; the script waits until it answers.
    /// A Garage that dies while starting is started again, up to [`GARAGE_STARTS_MAX`] times:
    /// right after a `kill -9` on a busy machine one occasionally aborts before it logs a line
    /// (its data directory still settling), which is the test store's trouble, not the test's.
    pub fn up(&self) {
        let mut failures = Vec::new();
        for attempt in 1..=GARAGE_STARTS_MAX {
            let output = Command::new("bash")
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/garage-up.sh"))
                .env("GARAGE_DIR", self.dir.path())
                .env("GARAGE_S3_PORT", self.port.to_string())
                .env("GARAGE_RPC_PORT", self.rpc_port.to_string())
                .env(
                    "S3_AK",
                    std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_default(),
                )
                .env(
                    "S3_SK",
                    std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_default(),
                )
                .env("S3_BUCKET", bucket())
                .stdin(Stdio::null())
                .output()
                .expect("run scripts/garage-up.sh");
            if output.status.success() {
                return;
            }
            let failure = format!(
                "attempt {attempt}: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            eprintln!("garage-up.sh failed, {failure}");
            failures.push(failure);
            std::thread::sleep(Duration::from_secs(1));
        }
        panic!("garage-up.sh failed {GARAGE_STARTS_MAX} times: {failures:?}");
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.address())
    }

    /// Where its S3 API listens.
    pub fn address(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn pid(&self) -> Option<String> {
        std::fs::read_to_string(self.dir.path().join("pid"))
            .ok()
            .map(|pid| pid.trim().to_string())
    }

    /// `kill -9` by the pid the script wrote, then waits (bounded) until the port is closed.
    pub fn kill(&self) {
        let pid = self.pid().expect("garage pid file");
        let _ = Command::new("kill").args(["-9", &pid]).status();
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "garage did not die"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Starts of one instance tried before a test gives up on it.
const GARAGE_STARTS_MAX: u32 = 3;

impl Drop for OwnGarage {
    fn drop(&mut self) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill").args(["-9", &pid]).status();
        }
    }
}
