//! Running the `pico` binary as the tests need it: without the test run's `PICO_*`
//! environment, with bytes on its standard input, and checking its exit code, stdout and
//! stderr exactly.

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// `pico` with no `PICO_*` variable of the test run, which would configure it behind the
/// test's back; the rest of the environment is kept.
pub fn pico_without_pico_env() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pico"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("PICO_") {
            command.env_remove(key);
        }
    }
    command
}

/// Runs `command` to completion with `stdin` on its standard input (closed after it), stdout
/// and stderr captured.
pub fn run_with_stdin(command: &mut Command, stdin: &[u8]) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pico");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(stdin)
        .expect("write stdin");
    child.wait_with_output().expect("wait for pico")
}

/// Exit code, stdout and stderr (as text) of a finished `pico`.
pub fn outcome(out: &Output) -> (Option<i32>, String, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Checks exit code, stdout and stderr exactly; `what` names the call in the failure.
#[track_caller]
pub fn check_outcome(out: &Output, what: &str, code: i32, stdout: &str, stderr: &str) {
    assert_eq!(
        outcome(out),
        (Some(code), stdout.to_owned(), stderr.to_owned()),
        "{what}"
    );
}
