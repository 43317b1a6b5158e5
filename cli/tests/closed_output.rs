//! Output to a pipe whose reader is gone (`pico serve --help | head`): the CLI stops quietly
//! (status 0, nothing on stderr) or carries on, never panics; a server keeps serving. Each
//! case gets a pipe whose read end is closed before `pico` starts, so every write to it
//! fails with `EPIPE` (Rust ignores `SIGPIPE`), whatever the timing.

mod common;

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Output, Stdio};

use common::Server;

/// The write end of a pipe nobody reads.
fn closed_pipe() -> Stdio {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe(2)");
    // SAFETY: pipe(2) just opened both descriptors and nothing else owns them.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    Stdio::from(write)
}

fn pico(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pico"));
    command.args(args).env_clear().stdin(Stdio::null());
    command
}

/// Runs with stdout closed, stderr captured.
fn stdout_closed(args: &[&str]) -> Output {
    pico(args)
        .stdout(closed_pipe())
        .stderr(Stdio::piped())
        .output()
        .expect("run pico")
}

/// Runs with stderr closed, stdout captured.
fn stderr_closed(args: &[&str]) -> Output {
    pico(args)
        .stdout(Stdio::piped())
        .stderr(closed_pipe())
        .output()
        .expect("run pico")
}

#[track_caller]
fn quiet_success(out: &Output, what: &str) {
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).as_ref()
        ),
        (Some(0), ""),
        "{what}"
    );
}

#[test]
fn help_and_commands_stop_quietly_when_stdout_is_closed() {
    for args in [
        &["serve", "--help"][..],
        &["--help"],
        &["read", "--help"],
        &["config", "--help"],
    ] {
        quiet_success(&stdout_closed(args), &format!("pico {args:?}"));
    }
    let server = Server::start(&["--cores", "1"]);
    let endpoint = format!("http://{}", server.addr);
    server.put("/s", "text/plain").expect(201);
    server.post("/s", b"one").expect(200);
    for args in [&["ls"][..], &["read", "/s"], &["head", "/s"]] {
        let mut all = vec!["--endpoint", endpoint.as_str()];
        all.extend_from_slice(args);
        quiet_success(&stdout_closed(&all), &format!("pico {args:?}"));
    }
}

#[test]
fn a_closed_stderr_changes_nothing_but_the_messages() {
    let server = Server::start(&["--cores", "1"]);
    let endpoint = format!("http://{}", server.addr);
    let run = |args: &[&str]| {
        let mut all = vec!["--endpoint", endpoint.as_str()];
        all.extend_from_slice(args);
        stderr_closed(&all)
    };
    // `create` reports on stderr, and still succeeds.
    let out = run(&["create", "/s"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    server.head("/s").expect(200);
    // Failures keep their exit codes: 1 for an error, 2 for a usage error.
    assert_eq!(run(&["read", "/nope"]).status.code(), Some(1));
    assert_eq!(run(&["read"]).status.code(), Some(2));
    assert_eq!(stderr_closed(&["no-such-command"]).status.code(), Some(2));
}

#[test]
fn a_node_whose_stdout_is_closed_serves_and_stops_cleanly() {
    let dir = tempfile::tempdir().expect("a directory");
    let log_path = dir.path().join("server.log");
    let log = std::fs::File::create(&log_path).expect("create the log");
    let mut child = pico(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--cores",
        "1",
        "--meta-url",
        &format!("sqlite:{}", dir.path().join("meta.db").display()),
        "--storage",
        &format!("-2@file://{}", dir.path().join("objects").display()),
        "--wal-dir",
        &dir.path().join("wal").display().to_string(),
    ])
    .stdout(closed_pipe())
    .stderr(log)
    .spawn()
    .expect("spawn pico serve");
    // Its address is only on the closed stdout; the log names it too.
    let addr = common::wait_for("the node's address in its log", common::IO_TIMEOUT, || {
        let text = std::fs::read_to_string(&log_path).ok()?;
        text.lines()
            .find_map(|l| l.split("protocol pico on http://").nth(1))
            .and_then(|a| a.trim().parse::<std::net::SocketAddr>().ok())
    });
    let r = common::Conn::connect(addr)
        .expect("connect")
        .request("PUT", "/s", &[], b"")
        .expect("PUT");
    r.expect(201);
    // SIGTERM: "shutting down" goes to the closed stdout, and the node stops cleanly.
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) },
        0,
        "kill"
    );
    let status = child.wait().expect("wait for pico serve");
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "log:\n{log}");
    assert!(!log.contains("panicked"), "log:\n{log}");
}
