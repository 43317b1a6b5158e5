//! Shared helpers of the end-to-end tests: a guard around a real `pico serve` process and a
//! minimal blocking HTTP/1.1 client over `std::net::TcpStream`.
//!
//! Every wait is bounded: server start-up, socket reads and writes all have deadlines.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

pub mod cli;
pub mod disk;
pub mod services;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a server may take to print its `serving on` line.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Socket read/write timeout of the test client.
pub const IO_TIMEOUT: Duration = Duration::from_secs(15);

/// A network namespace a server runs in (`pico_testkit::netns`) and the address it binds there.
#[derive(Clone, Debug)]
pub struct Place {
    pub namespace: String,
    pub ip: IpAddr,
}

/// A running `pico serve` with its own temporary directory; killed (SIGKILL) on drop.
pub struct Server {
    child: Option<Child>,
    /// Listener of the Pico protocol.
    pub addr: SocketAddr,
    /// Admin listener (`/health`, `/ready`).
    pub admin: SocketAddr,
    /// The `--ds-listen` listener (the other protocol): Durable Streams on an ephemeral port
    /// unless the test gives its own `--ds-listen` (or `off`) or `--protocol ds`.
    pub second: Option<SocketAddr>,
    extra_args: Vec<String>,
    /// Variables set for the process on top of the test's environment (restarts too).
    extra_env: Vec<(String, String)>,
    /// Where the process runs and its listeners bind: a network namespace and its address, or
    /// the test's own namespace and 127.0.0.1.
    place: Option<Place>,
    // Dropped last: the directory outlives the process.
    dir: tempfile::TempDir,
}

impl Server {
    /// Starts a server in a fresh temporary directory with these extra `serve` flags.
    pub fn start(extra_args: &[&str]) -> Server {
        Server::start_with_env(extra_args, &[])
    }

    /// [`Server::start`] with these variables set for the server process alone, so tests of one
    /// binary can run side by side with different values (`RUST_LOG`, credentials).
    pub fn start_with_env(extra_args: &[&str], env: &[(&str, &str)]) -> Server {
        Server::start_placed(extra_args, env, None)
    }

    /// [`Server::start`] inside a network namespace, its listeners on that namespace's address.
    pub fn start_in(place: Place, extra_args: &[&str]) -> Server {
        Server::start_placed(extra_args, &[], Some(place))
    }

    fn start_placed(extra_args: &[&str], env: &[(&str, &str)], place: Option<Place>) -> Server {
        let dir = tempfile::Builder::new()
            .prefix("pico-e2e-")
            .tempdir()
            .expect("create a temporary directory");
        let extra_args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        let extra_env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (child, addr, admin, second) =
            spawn(dir.path(), &extra_args, &extra_env, place.as_ref());
        Server {
            child: Some(child),
            addr,
            admin,
            second,
            extra_args,
            extra_env,
            place,
            dir,
        }
    }

    /// The server's data directory (meta.db unless the test passed `--meta-url`, objects/,
    /// wal/, server.log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn wal_dir(&self) -> PathBuf {
        self.dir.path().join("wal")
    }

    /// Removes the running node's WAL directory (a disk fault as the node sees it). The node
    /// may create a file in it meanwhile (a WAL file made ahead, a state file written by
    /// rename), which makes one removal fail with "directory not empty": it is tried again,
    /// up to 5 s.
    pub fn remove_wal_dir(&self) {
        let dir = self.wal_dir();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !dir.exists() => return,
                Err(e) if Instant::now() >= deadline => {
                    panic!("remove the WAL directory {}: {e}", dir.display())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// The server's process id, to SIGKILL it from another thread while load runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `kill -9`: the process gets no chance to flush or clean up.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits (bounded) for the process to exit; its exit status.
    pub fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        let pid = self.pid().expect("the server runs") as i32;
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        self.wait_exit(within)
    }

    /// Waits (bounded) for the process to exit on its own; its exit status.
    pub fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("the server runs");
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait().expect("wait for pico serve") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "pico serve did not exit within {within:?} of SIGTERM; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server if it runs, then starts it again on the same directories (new ports).
    pub fn restart(&mut self) {
        self.kill();
        let (child, addr, admin, second) = spawn(
            self.dir.path(),
            &self.extra_args,
            &self.extra_env,
            self.place.as_ref(),
        );
        self.child = Some(child);
        self.addr = addr;
        self.admin = admin;
        self.second = second;
    }

    /// Kills the server if it runs, then starts it again on the same directories with
    /// `more_args` added for this start only (later restarts go back to the server's own).
    pub fn restart_with(&mut self, more_args: &[&str]) {
        self.kill();
        let mut args = self.extra_args.clone();
        args.extend(more_args.iter().map(|a| a.to_string()));
        let (child, addr, admin, second) =
            spawn(self.dir.path(), &args, &self.extra_env, self.place.as_ref());
        self.child = Some(child);
        self.addr = addr;
        self.admin = admin;
        self.second = second;
    }

    /// Kills the server if it runs, starts it again on the same directories and expects it to
    /// refuse to start: waits (bounded) for it to exit; its exit status and what it wrote to
    /// stderr in this attempt.
    pub fn restart_refused(&mut self, within: Duration) -> (std::process::ExitStatus, String) {
        self.kill();
        let before = self.log().len();
        let mut child = serve_command(
            self.dir.path(),
            &self.extra_args,
            &self.extra_env,
            self.place.as_ref(),
        )
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn pico serve");
        let Some(status) = exit_within(&mut child, within) else {
            panic!(
                "pico serve did not exit within {within:?}; log:\n{}",
                self.log()
            );
        };
        let log = self.log();
        (status, log.get(before..).unwrap_or_default().to_string())
    }

    /// The server's stderr so far (logs), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Still running?
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// `GET path` on the admin listener, on a fresh connection.
    pub fn admin_get(&self, path: &str) -> Resp {
        Conn::connect(self.admin)
            .and_then(|mut conn| conn.request("GET", path, &[], b""))
            .unwrap_or_else(|e| panic!("GET {path} on the admin listener: {e}"))
    }

    /// One sample of the admin listener's `/metrics`: `series` with its labels (say
    /// `pico_uploads_total{core="0"}`), or `None` if the page has no such line.
    pub fn metric_sample(&self, series: &str) -> Option<u64> {
        self.admin_get("/metrics")
            .text()
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// A new keep-alive connection to the protocol listener.
    pub fn connect(&self) -> Conn {
        Conn::connect(self.addr).expect("connect to the server")
    }

    /// One request on a fresh connection.
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        let mut conn = self.connect();
        conn.request(method, path, headers, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}\nserver log:\n{}", self.log()))
    }

    pub fn get(&self, path: &str) -> Resp {
        self.request("GET", path, &[], b"")
    }

    pub fn put(&self, path: &str, content_type: &str) -> Resp {
        self.request("PUT", path, &[("content-type", content_type)], b"")
    }

    pub fn post(&self, path: &str, body: &[u8]) -> Resp {
        self.request("POST", path, &[], body)
    }

    pub fn head(&self, path: &str) -> Resp {
        self.request("HEAD", path, &[], b"")
    }

    pub fn delete(&self, path: &str) -> Resp {
        self.request("DELETE", path, &[], b"")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A token file for `--auth-tokens` (one `token prefix perms` grant per line); the file lives
/// as long as this value.
pub struct TokenFile {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

/// A server with `--auth required` reading `grants` from a token file, plus `extra_args`; the
/// file too, for tests that rewrite it (SIGHUP reloads it).
pub fn start_with_tokens(grants: &str, extra_args: &[&str]) -> (Server, TokenFile) {
    let dir = tempfile::tempdir().expect("create a directory for the token file");
    let path = dir.path().join("tokens");
    std::fs::write(&path, grants).expect("write the token file");
    let path_arg = path.display().to_string();
    let mut args = vec!["--auth", "required", "--auth-tokens", path_arg.as_str()];
    args.extend_from_slice(extra_args);
    let server = Server::start(&args);
    (server, TokenFile { path, _dir: dir })
}

/// One request to a Durable Streams listener (`server.second`, or `server.addr` under
/// `--protocol ds`) on a fresh connection.
pub fn ds(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    Conn::connect(addr)
        .expect("connect to the Durable Streams listener")
        .request(method, path, headers, body)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// One JSON request on a fresh connection, with `Authorization: Bearer TOKEN` when a token is
/// given: the control APIs (subscriptions, consumers) of both protocols.
pub fn json_request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    token: Option<&str>,
    body: &[u8],
) -> Resp {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(auth) = &auth {
        headers.push(("authorization", auth.as_str()));
    }
    ds(addr, method, target, &headers, body)
}

/// A Durable Streams read of `path` from `offset` (`-1`: the start).
pub fn ds_read(addr: SocketAddr, path: &str, offset: &str) -> Resp {
    ds(addr, "GET", &format!("{path}?offset={offset}"), &[], b"")
}

/// Runs `pico ARGS` to completion in `dir` with no `PICO_*` (or any other) environment: for
/// client commands and for `serve` invocations that must fail at startup.
pub fn pico(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pico"))
        .args(args)
        .current_dir(dir)
        .env_clear()
        .stdin(Stdio::null())
        .output()
        .expect("run pico")
}

/// Waits (bounded) for `child` to exit on its own; its exit status, or `None` when it did
/// not within `within` (it is killed then).
/// Runs `pico serve` on loopback ports of its own (no Durable Streams listener) with `args`
/// (its catalog, WAL directory and bucket), expecting it to refuse to start: waits up to
/// `within`; whether it exited with a failure, and its stderr. One that runs is killed.
pub fn serve_refused(args: &[&str], within: Duration) -> (bool, String) {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let stderr_path = dir.path().join("stderr");
    let mut child = cli::pico_without_pico_env()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0", "--ds-listen", "off"])
        .args(args)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).expect("create the stderr file"))
        .spawn()
        .expect("spawn pico serve");
    let status = exit_within(&mut child, within);
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    (status.is_some_and(|s| !s.success()), stderr)
}

/// [`serve_refused`] on `server`'s bucket, with the catalog `meta_url`, the WAL directory
/// `wal_dir` and `more` flags.
pub fn serve_refused_on(
    server: &Server,
    meta_url: &str,
    wal_dir: &Path,
    more: &[&str],
) -> (bool, String) {
    let wal_dir = wal_dir.display().to_string();
    let storage = format!("-2@file://{}", server.dir().join("objects").display());
    let mut args = vec![
        "--meta-url",
        meta_url,
        "--wal-dir",
        &wal_dir,
        "--storage",
        &storage,
    ];
    args.extend(more);
    serve_refused(&args, Duration::from_secs(60))
}

/// The flags that give a `pico serve` its own catalog, bucket and WAL directory in `dir`.
pub fn data_in(dir: &Path) -> [String; 6] {
    [
        "--meta-url".to_string(),
        format!("sqlite:{}", dir.join("meta.db").display()),
        "--storage".to_string(),
        format!("-2@file://{}", dir.join("objects").display()),
        "--wal-dir".to_string(),
        dir.join("wal").display().to_string(),
    ]
}

pub fn exit_within(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait for the process") {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `pico serve` in `dir` with the test's flags (ephemeral ports, its own catalog, bucket and
/// WAL unless `extra_args` names them), its stderr appended to `server.log`.
fn serve_command(
    dir: &Path,
    extra_args: &[String],
    extra_env: &[(String, String)],
    place: Option<&Place>,
) -> Command {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("server.log"))
        .expect("open server.log");
    // The test environment must not configure the server behind our back.
    let mut command = cli::pico_without_pico_env();
    let listen = format!(
        "{}:0",
        place.map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |place| place.ip)
    );
    if let Some(place) = place {
        pico_testkit::netns::enter(&place.namespace, &mut command);
    }
    command
        .arg("serve")
        .args(["--listen", &listen, "--admin-listen", &listen])
        // A node opens Durable Streams on port 4438 by default; tests run side by side.
        .args(if gives_ds_listen(extra_args) || speaks_ds(extra_args) {
            Vec::new()
        } else {
            vec!["--ds-listen".to_string(), listen.clone()]
        })
        .args(if extra_args.iter().any(|a| a == "--meta-url") {
            // The test names its own metadata log (e.g. postgres:// from PICOMQ_PG_URL).
            Vec::new()
        } else {
            vec![
                "--meta-url".to_string(),
                format!("sqlite:{}", dir.join("meta.db").display()),
            ]
        })
        .args(if extra_args.iter().any(|a| a == "--storage") {
            // The test names its own bucket (e.g. s3:// against Garage).
            Vec::new()
        } else {
            vec![
                "--storage".to_string(),
                format!("-2@file://{}", dir.join("objects").display()),
            ]
        })
        .args(if extra_args.iter().any(|a| a == "--wal-dir") {
            // The test puts the WAL somewhere of its own (e.g. a small tmpfs).
            Vec::new()
        } else {
            vec![
                "--wal-dir".to_string(),
                dir.join("wal").display().to_string(),
            ]
        })
        .args(extra_args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log));
    for (key, value) in extra_env {
        match key.as_str() {
            OPEN_FILES_LIMIT => limit_open_files(&mut command, value.parse().expect("a limit")),
            _ => drop(command.env(key, value)),
        }
    }
    if place.is_some() {
        // Only the test's own namespaces reach that address.
        command.arg("--insecure-allow-remote");
    }
    command
}

/// Not a variable: an `env` entry with this key sets the server process's open-file limit
/// (soft and hard) to its value, so the node cannot raise it.
pub const OPEN_FILES_LIMIT: &str = "test:open-files";

fn limit_open_files(command: &mut Command, limit: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure calls only setrlimit, which is
    // async-signal-safe, on a struct on its own stack.
    unsafe {
        command.pre_exec(move || {
            let rlimit = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &rlimit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

/// Whether the test gives its own `--ds-listen`.
fn gives_ds_listen(extra_args: &[String]) -> bool {
    extra_args.iter().any(|a| a == "--ds-listen")
}

/// Whether `--listen` speaks Durable Streams (`--protocol ds`).
fn speaks_ds(extra_args: &[String]) -> bool {
    extra_args
        .windows(2)
        .any(|w| w[0] == "--protocol" && w[1] == "ds")
}

/// Starts `pico serve` in `dir` and waits (bounded) for its `serving on` / `admin on` lines.
fn spawn(
    dir: &Path,
    extra_args: &[String],
    extra_env: &[(String, String)],
    place: Option<&Place>,
) -> (Child, SocketAddr, SocketAddr, Option<SocketAddr>) {
    let mut child = serve_command(dir, extra_args, extra_env, place)
        .spawn()
        .expect("spawn pico serve");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel::<String>();
    // Drains stdout for the life of the process so the server never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                // Nobody listens any more; keep draining.
                continue;
            }
        }
    });
    let deadline = Instant::now() + START_TIMEOUT;
    let mut addr = None;
    let mut admin = None;
    let mut second = None;
    // The second listener's line is printed unless the test turned it off (or made `--listen`
    // speak Durable Streams without asking for the Pico one).
    let wants_second = if gives_ds_listen(extra_args) {
        !extra_args
            .windows(2)
            .any(|w| w[0] == "--ds-listen" && w[1] == "off")
    } else {
        !speaks_ds(extra_args)
    };
    while addr.is_none() || admin.is_none() || (wants_second && second.is_none()) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.max(Duration::from_millis(1))) {
            Ok(line) => {
                // The scheme is http, or https with --tls-cert.
                let line = line.replacen("https://", "http://", 1);
                if let Some(rest) = line.strip_prefix("serving on http://") {
                    let text = rest.split_whitespace().next().unwrap_or_default();
                    addr = Some(text.parse::<SocketAddr>().expect("serving address"));
                } else if let Some(rest) = line.strip_prefix("admin on http://") {
                    let text = rest.split_whitespace().next().unwrap_or_default();
                    admin = Some(text.parse::<SocketAddr>().expect("admin address"));
                } else if let Some(rest) = line
                    .strip_prefix("durable streams on http://")
                    .or_else(|| line.strip_prefix("pico on http://"))
                {
                    let text = rest.split_whitespace().next().unwrap_or_default();
                    second = Some(text.parse::<SocketAddr>().expect("second listener address"));
                }
            }
            Err(_) => {
                let _ = child.kill();
                let status = child.wait();
                let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
                panic!("pico serve did not become ready ({status:?}); log:\n{log}");
            }
        }
    }
    (child, addr.unwrap(), admin.unwrap(), second)
}

/// A response as parsed by the test client; header names are lowercased.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    /// The first header with this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The header, which must be present.
    pub fn h(&self, name: &str) -> &str {
        self.header(name)
            .unwrap_or_else(|| panic!("missing header {name} in {}", self.describe()))
    }

    /// The header parsed as an integer.
    pub fn h_u64(&self, name: &str) -> u64 {
        self.h(name)
            .parse()
            .unwrap_or_else(|_| panic!("header {name} not an integer in {}", self.describe()))
    }

    pub fn h_i64(&self, name: &str) -> i64 {
        self.h(name)
            .parse()
            .unwrap_or_else(|_| panic!("header {name} not an integer in {}", self.describe()))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.describe()))
    }

    /// Status, headers and body, for assertion messages.
    pub fn describe(&self) -> String {
        let mut out = format!("HTTP {}\n", self.status);
        for (n, v) in &self.headers {
            out.push_str(&format!("{n}: {v}\n"));
        }
        out.push('\n');
        out.push_str(&String::from_utf8_lossy(&self.body));
        out
    }

    /// Asserts the status, showing the whole response when it differs.
    #[track_caller]
    pub fn expect(&self, status: u16) -> &Resp {
        assert_eq!(
            self.status,
            status,
            "unexpected status:\n{}",
            self.describe()
        );
        self
    }

    /// Checks the headers every response carries, errors included (the opening of
    /// docs/api.md): `nosniff`, `same-origin` and the CORS origin `*`.
    #[track_caller]
    pub fn expect_every_response_headers(&self) {
        for (name, want) in [
            ("x-content-type-options", "nosniff"),
            ("cross-origin-resource-policy", "same-origin"),
            ("access-control-allow-origin", "*"),
        ] {
            assert_eq!(
                self.header(name),
                Some(want),
                "{name}:\n{}",
                self.describe()
            );
        }
    }

    /// Asserts a JSON error body `{"error":code,...}` with this status; returns the body.
    #[track_caller]
    pub fn expect_error(&self, status: u16, code: &str) -> serde_json::Value {
        self.expect(status);
        assert_eq!(
            self.header("content-type"),
            Some("application/json"),
            "{}",
            self.describe()
        );
        let body = self.json();
        assert_eq!(body["error"], code, "{}", self.describe());
        body
    }
}

/// One client connection; requests on it are keep-alive.
pub struct Conn {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    pub fn connect(addr: SocketAddr) -> std::io::Result<Conn> {
        Conn::over(TcpStream::connect_timeout(&addr, IO_TIMEOUT)?)
    }

    /// A connection over `stream` (one opened elsewhere, e.g. inside a network namespace).
    pub fn over(stream: TcpStream) -> std::io::Result<Conn> {
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: Vec::new(),
        })
    }

    /// Changes the read timeout (long-polls wait longer than a normal request).
    pub fn set_read_timeout(&mut self, timeout: Duration) {
        self.stream
            .set_read_timeout(Some(timeout))
            .expect("set read timeout");
    }

    /// Writes bytes as they are (malformed or pipelined requests).
    pub fn raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Writes one request with `Content-Length` (unless a `content-length` or
    /// `transfer-encoding` header is given explicitly).
    pub fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<()> {
        self.raw(&encode_request(method, path, headers, body))
    }

    /// Sends a request and reads its final response (interim 1xx responses are skipped).
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Resp> {
        self.send(method, path, headers, body)?;
        loop {
            let response = self.read_response(method == "HEAD")?;
            if response.status >= 200 {
                return Ok(response);
            }
        }
    }

    /// Reads one response (including interim 1xx ones). `head`: the request was a HEAD, so a
    /// `Content-Length` does not announce a body.
    pub fn read_response(&mut self, head: bool) -> std::io::Result<Resp> {
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i;
            }
            if self.fill()? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "connection closed before a full response head ({} bytes buffered)",
                        self.buf.len()
                    ),
                ));
            }
        };
        let head_text = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        self.buf.drain(..head_end + 4);
        let mut lines = head_text.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        if version != "HTTP/1.1" && version != "HTTP/1.0" {
            return Err(bad_data(format!("bad status line {status_line:?}")));
        }
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad_data(format!("bad status line {status_line:?}")))?;
        let mut headers = Vec::new();
        for line in lines {
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| bad_data(format!("bad header line {line:?}")))?;
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
        let mut response = Resp {
            status,
            headers,
            body: Vec::new(),
        };
        if head || status < 200 || status == 204 || status == 304 {
            return Ok(response);
        }
        if let Some(length) = response.header("content-length") {
            let length: usize = length
                .parse()
                .map_err(|_| bad_data(format!("bad content-length {length:?}")))?;
            while self.buf.len() < length {
                if self.fill()? == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "connection closed mid-body",
                    ));
                }
            }
            response.body = self.buf.drain(..length).collect();
        } else if response
            .header("transfer-encoding")
            .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
        {
            return Err(bad_data("chunked responses are not expected from pico"));
        } else {
            // No length: the body runs to the end of the connection.
            while self.fill()? > 0 {}
            response.body = std::mem::take(&mut self.buf);
        }
        Ok(response)
    }

    /// True if the peer closed the connection (EOF or reset) within 5 s, with no more data;
    /// false if data arrives or the connection stays open.
    pub fn at_eof(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        self.set_read_timeout(Duration::from_secs(5));
        let result = self.fill();
        self.set_read_timeout(IO_TIMEOUT);
        match result {
            Ok(n) => n == 0,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    }

    fn fill(&mut self) -> std::io::Result<usize> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }
}

fn bad_data(message: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message.into())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The bytes of one HTTP/1.1 request.
pub fn encode_request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n").into_bytes();
    let explicit_length = headers.iter().any(|(n, _)| {
        n.eq_ignore_ascii_case("content-length") || n.eq_ignore_ascii_case("transfer-encoding")
    });
    for (name, value) in headers {
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    if !explicit_length && (!body.is_empty() || matches!(method, "POST" | "PUT")) {
        out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// A record of a binary append batch (docs/api.md, "Append").
pub struct BatchRecord<'a> {
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
}

/// Encodes a binary append batch: u8 version 1, u32 count, per record u32 header count,
/// headers as (u32 len + name, u32 len + value), u32 body length, body; all big-endian.
pub fn encode_binary_batch(records: &[BatchRecord]) -> Vec<u8> {
    let mut out = vec![1u8];
    out.extend_from_slice(&(records.len() as u32).to_be_bytes());
    for record in records {
        out.extend_from_slice(&(record.headers.len() as u32).to_be_bytes());
        for (name, value) in record.headers {
            out.extend_from_slice(&(name.len() as u32).to_be_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value.as_bytes());
        }
        out.extend_from_slice(&(record.body.len() as u32).to_be_bytes());
        out.extend_from_slice(record.body);
    }
    out
}

/// A record decoded from the `binary` read format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRecord {
    pub seq: u64,
    pub timestamp: i64,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// An answer as the named-consumer driver of the fault tests reads it.
impl From<Resp> for pico_testkit::consumer::Reply {
    fn from(r: Resp) -> Self {
        pico_testkit::consumer::Reply {
            status: r.status,
            body: r.body,
        }
    }
}

/// A binary page (`format=binary`) answered to `reader` asking from `from`, as a fault test's
/// history records it (completed at `completed_ms`), and where its next read starts.
pub fn history_read(
    reader: &str,
    from: u64,
    response: &Resp,
    invoked_ms: u64,
    completed_ms: u64,
) -> (pico_testkit::history::Read, u64) {
    let records = decode_binary_read(&response.body)
        .into_iter()
        .map(|r| (r.seq, r.body))
        .collect();
    let read = pico_testkit::history::Read {
        reader: reader.to_string(),
        from,
        records,
        invoked_ms,
        completed_ms,
    };
    (read, response.h_u64("pico-next-seq").max(from))
}

/// Decodes the `binary` read format: u8 version 1; u32 count; per record u64 seq,
/// i64 timestamp, u32 header count, headers, u32 body length, body (all big-endian).
/// Panics on malformed input (including trailing bytes).
pub fn decode_binary_read(data: &[u8]) -> Vec<ReadRecord> {
    let mut pos = 0usize;
    let mut take = |n: usize| -> &[u8] {
        let slice = data
            .get(pos..pos + n)
            .unwrap_or_else(|| panic!("binary read truncated at {pos} (+{n}) of {}", data.len()));
        pos += n;
        slice
    };
    assert_eq!(take(1), [1], "binary read version");
    let u32_of = |b: &[u8]| u32::from_be_bytes(b.try_into().unwrap()) as usize;
    let count = u32_of(take(4));
    let mut records = Vec::with_capacity(count);
    for _ in 0..count {
        let seq = u64::from_be_bytes(take(8).try_into().unwrap());
        let timestamp = i64::from_be_bytes(take(8).try_into().unwrap());
        let header_count = u32_of(take(4));
        let mut headers = Vec::new();
        for _ in 0..header_count {
            let len = u32_of(take(4));
            let name = String::from_utf8(take(len).to_vec()).expect("UTF-8 header name");
            let len = u32_of(take(4));
            let value = String::from_utf8(take(len).to_vec()).expect("UTF-8 header value");
            headers.push((name, value));
        }
        let len = u32_of(take(4));
        let body = take(len).to_vec();
        records.push(ReadRecord {
            seq,
            timestamp,
            headers,
            body,
        });
    }
    assert_eq!(pos, data.len(), "trailing bytes after the binary read");
    records
}

/// Reads a whole stream from `from` in `format=binary` pages until up to date; returns every
/// record and the final `Pico-Next-Seq`. Panics on any non-200 page or a page that makes no
/// progress.
pub fn read_all(server: &Server, name: &str, from: u64) -> (Vec<ReadRecord>, u64) {
    let mut conn = server.connect();
    let mut records = Vec::new();
    let mut next = from;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "reading {name} did not finish");
        let path = format!("{name}?seq={next}&format=binary&bytes=1048576");
        let response = conn
            .request("GET", &path, &[], b"")
            .unwrap_or_else(|e| panic!("GET {path}: {e}\nserver log:\n{}", server.log()));
        response.expect(200);
        let page = decode_binary_read(&response.body);
        let page_next = response.h_u64("pico-next-seq");
        if let Some(first) = page.first() {
            assert_eq!(
                first.seq, next,
                "page of {name} starts at the requested seq"
            );
        }
        assert_eq!(
            page_next,
            next + page.len() as u64,
            "Pico-Next-Seq follows the page"
        );
        next = page_next;
        let empty = page.is_empty();
        records.extend(page);
        if response.header("pico-up-to-date") == Some("true") {
            return (records, next);
        }
        assert!(
            !empty,
            "an empty page that is not up to date: {name} at {next}"
        );
    }
}

/// A small deterministic PRNG (xorshift64*), seeded by the tests.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.max(1))
    }

    /// A seed from the clock (printed by the tests so a failure can be replayed).
    pub fn seed_from_time() -> u64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        (now.as_nanos() as u64) ^ 0x9E37_79B9_7F4A_7C15
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform-ish in `[low, high)`.
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next_u64() % (high - low).max(1)
    }
}

/// Polls `check` until it returns `Some` or the deadline passes (then panics with `what`).
pub fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The time units [`at_a_pace_the_machine_keeps`] tries, in seconds.
pub const TIME_UNITS: [u64; 4] = [1, 2, 4, 8];

/// Runs a test whose steps are spaced in time (TTLs, expiry instants) with its time unit at
/// 1 s, then, for as long as the scenario says the machine was too slow for that pace, at 2,
/// 4 and 8 s; returns the unit of the round that counted. The scenario measures its steps and
/// returns `Err(why)` when they came too late to prove anything, before it asserts anything
/// that depends on them; every other assertion fails the test at once. Only a machine that is
/// too slow at every pace fails it for being slow (with what it measured).
pub fn at_a_pace_the_machine_keeps(
    test: &str,
    mut scenario: impl FnMut(u64) -> Result<(), String>,
) -> u64 {
    let mut late = Vec::new();
    for unit in TIME_UNITS {
        match scenario(unit) {
            Ok(()) => return unit,
            Err(why) => {
                eprintln!("{test}: at {unit} s per step the machine was too slow: {why}");
                late.push(format!("{unit} s: {why}"));
            }
        }
    }
    panic!("{test}: too slow at every pace: {late:?}");
}

/// Standard base64 with padding (for expected ETags and `body_b64` values).
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Size of the frame header of the WAL and segment files (engine/src/frame.rs).
pub const FRAME_HEADER_LEN: usize = 40;

/// Length of the prefix of `data` made of well-formed frames, walking the little-endian `len`
/// field of each frame header (a zero `len` ends a pre-allocated WAL file). CRCs are not
/// checked: this finds where the server stopped writing.
pub fn frames_prefix_len(data: &[u8]) -> usize {
    let mut pos = 0;
    while pos + FRAME_HEADER_LEN <= data.len() {
        let len = u32::from_le_bytes(data[pos..pos + 4].try_into().unwrap()) as usize;
        if len < FRAME_HEADER_LEN || pos + len > data.len() {
            break;
        }
        pos += len;
    }
    pos
}

/// Where a byte of the body of the first record frame at or after `fraction` of `data`'s
/// frames lies (a WAL file or a segment object: frames laid end to end, each header's `len`
/// first and its kind at byte 8, 1 for a record; the body ends the frame).
pub fn record_body_byte_after(data: &[u8], fraction: f64) -> usize {
    let written = frames_prefix_len(data);
    let from = (written as f64 * fraction) as usize;
    let mut pos = 0;
    loop {
        let len = u32::from_le_bytes(data[pos..pos + 4].try_into().unwrap()) as usize;
        if pos >= from && data[pos + 8] == 1 {
            return pos + len - 3;
        }
        pos += len;
        assert!(pos < written, "a record frame after byte {from}");
    }
}

/// Where the `file://` bucket of the server directory `dir` holds the segment objects of its
/// SQLite catalog: `objects/segments/c<catalog id>/` (`engine/src/placement.rs`), the id read
/// from `dir/meta.db`.
pub fn segments_dir(dir: &Path) -> PathBuf {
    pico_meta::use_page_checksums().expect("the checksummed SQLite VFS");
    let db = rusqlite::Connection::open_with_flags(
        dir.join("meta.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("open the catalog");
    let id: String = db
        .query_row("SELECT id FROM catalog_identity", [], |row| row.get(0))
        .expect("the catalog's id");
    dir.join("objects/segments").join(format!("c{id}"))
}

/// Bytes of frames per core index, over the WAL files (`<epoch>-<core>-<n>.wal`) and the
/// sealed segments (`<epoch>-<core>-<n>.seg` in [`segments_dir`]) of a server directory.
pub fn frame_bytes_per_core(dir: &Path) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for sub in [dir.join("wal"), segments_dir(dir)] {
        let Ok(entries) = std::fs::read_dir(sub) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            // WAL files and segments only (not the ledgers, the WAL directory's id, the lock).
            if !path.extension().is_some_and(|e| e == "wal" || e == "seg") {
                continue;
            }
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_string();
            let Some(core) = stem.split('-').nth(1) else {
                continue;
            };
            let data = std::fs::read(&path).unwrap_or_default();
            *out.entry(core.to_string()).or_insert(0) += frames_prefix_len(&data);
        }
    }
    out
}

/// Asserts two record lists are equal, reporting the first difference briefly (bodies can be
/// large).
#[track_caller]
pub fn assert_records_eq(context: &str, got: &[ReadRecord], want: &[ReadRecord]) {
    for (g, w) in got.iter().zip(want) {
        let show = |r: &ReadRecord| {
            format!(
                "seq={} timestamp={} headers={:?} body={:?}{}",
                r.seq,
                r.timestamp,
                r.headers,
                String::from_utf8_lossy(&r.body[..r.body.len().min(60)]),
                if r.body.len() > 60 { "…" } else { "" }
            )
        };
        assert!(
            g == w,
            "{context}: records differ\n got: {}\nwant: {}",
            show(g),
            show(w)
        );
    }
    assert_eq!(got.len(), want.len(), "{context}: record count");
}

/// `http://host:port/path?q` (a redirect's `Location`) → (address, "/path?q").
pub fn split_url(url: &str) -> (SocketAddr, String) {
    let rest = url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("an http:// URL: {url}"));
    let at = rest.find('/').unwrap_or(rest.len());
    let addr = rest[..at]
        .parse()
        .unwrap_or_else(|_| panic!("a socket address in {url}"));
    let target = if at == rest.len() { "/" } else { &rest[at..] };
    (addr, target.to_string())
}

/// Returns once every node's admin API lists every node of `ids` live with an address
/// (bounded by `within`), so that a test does not race the cluster's forming.
pub fn wait_until_formed(nodes: &[Server], ids: &[u64], within: Duration) {
    wait_until_formed_as(nodes, ids, within, None)
}

/// [`wait_until_formed`] on nodes with `--auth required`, asking with the admin `token`.
pub fn wait_until_formed_as(nodes: &[Server], ids: &[u64], within: Duration, token: Option<&str>) {
    let authorization = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = authorization
        .iter()
        .map(|a| ("authorization", a.as_str()))
        .collect();
    for node in nodes {
        wait_for("the cluster to form", within, || {
            let listed = Conn::connect(node.admin)
                .ok()?
                .request("GET", "/admin/nodes", &headers, b"")
                .ok()?;
            let live: Vec<u64> = listed.json()["nodes"]
                .as_array()?
                .iter()
                .filter(|n| n["live"] == true && !n["advertisedAddress"].is_null())
                .filter_map(|n| n["nodeId"].as_u64())
                .collect();
            ids.iter().all(|id| live.contains(id)).then_some(())
        });
    }
}

/// One HTTP/1.1 request as a server of the test's own (a webhook receiver, say) reads it from
/// `conn`: its head (request line and headers) and its `Content-Length` body. `None` when the
/// connection ends, fails or times out first, or the request grows past `max_bytes`.
pub fn read_request(conn: &mut TcpStream, max_bytes: usize) -> Option<(String, Vec<u8>)> {
    let mut data = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(head_end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..head_end]).into_owned();
            let length: usize = header_of(&head, "content-length")
                .and_then(|value| value.parse().ok())
                .unwrap_or(0);
            let body_start = head_end + 4;
            if data.len() >= body_start + length {
                return Some((head, data[body_start..body_start + length].to_vec()));
            }
        }
        if data.len() >= max_bytes {
            return None;
        }
        let n = conn.read(&mut chunk).ok().filter(|n| *n > 0)?;
        data.extend_from_slice(&chunk[..n]);
    }
}

/// The value of header `name` (any case) in a request or response head, trimmed.
pub fn header_of<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// A socket's receive buffer made as small as the kernel allows, so a client that does not
/// read stops the server's writes after a few KiB instead of the kernel taking megabytes.
pub fn small_receive_buffer(socket: &TcpStream) {
    use std::os::fd::AsRawFd;
    let size: libc::c_int = 4096;
    // SAFETY: a valid socket and a c_int option value for the length given.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(set, 0, "SO_RCVBUF: {}", std::io::Error::last_os_error());
}

/// A webhook POST as a [`receiver`] got it.
pub struct Delivery {
    pub signature: String,
    pub body: serde_json::Value,
}

/// A webhook receiver on loopback answering every POST with the status in the returned cell
/// (200 unless the test changes it); hands over every delivery, whatever it answered. Lives
/// as long as the test process.
pub fn receiver() -> (
    String,
    std::sync::Arc<std::sync::atomic::AtomicU16>,
    std::sync::mpsc::Receiver<Delivery>,
) {
    use std::io::Write;
    use std::sync::atomic::{AtomicU16, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the webhook receiver");
    let url = format!(
        "http://127.0.0.1:{}/wake",
        listener.local_addr().unwrap().port()
    );
    let status = std::sync::Arc::new(AtomicU16::new(200));
    let answer = status.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
            let parsed = read_request(&mut conn, 1 << 20).map(|(head, body)| {
                let signature = header_of(&head, "webhook-signature").unwrap_or_default();
                (signature.to_string(), body)
            });
            let status = answer.load(Ordering::SeqCst);
            let _ = conn.write_all(
                format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
                )
                .as_bytes(),
            );
            if let Some((signature, body)) = parsed {
                let body = serde_json::from_slice(&body).expect("a JSON delivery");
                if tx.send(Delivery { signature, body }).is_err() {
                    return;
                }
            }
        }
    });
    (url, status, rx)
}

/// Record `i` of [`killed_after_big_records`]: about 2 KiB, naming its index.
pub fn big_record(i: u64) -> Vec<u8> {
    format!("record {i:04} {}", "b".repeat(2000)).into_bytes()
}

/// A one-core node with 64 KiB segments that never seal by age: `name` created, `before`
/// run, then 100 [`big_record`]s appended, each acknowledged, and the node `kill -9`ed. The
/// segments that filled were stored; the rest is in the WAL.
pub fn killed_after_big_records(name: &str, before: impl FnOnce(&Server)) -> Server {
    killed_after_big_records_with(&[], name, before)
}

/// [`killed_after_big_records`] with `more` flags (another `--storage`, say).
pub fn killed_after_big_records_with(
    more: &[&str],
    name: &str,
    before: impl FnOnce(&Server),
) -> Server {
    let mut args = vec![
        "--cores",
        "1",
        "--segment-size",
        "64KiB",
        "--segment-max-age-ms",
        "600000",
    ];
    args.extend(more);
    let mut server = Server::start(&args);
    server.put(name, "text/plain").expect(201);
    before(&server);
    let mut conn = server.connect();
    for i in 0..100 {
        conn.request("POST", name, &[], &big_record(i))
            .unwrap()
            .expect(200);
    }
    server.kill();
    server
}
