//! The node's container image, built and run under a real Docker daemon: `scripts/container-check.sh`
//! makes a bookworm base with debootstrap (no image registry needed), builds the Dockerfile's
//! `runtime-prebuilt` target around this test's `pico` with the classic builder and with
//! BuildKit where the client has it, runs it with host networking (so everything is on
//! 127.0.0.1), and checks the user, the io_uring settings, auth, create/append/read, a clean
//! SIGTERM stop, the data surviving in the volume, the healthcheck, and
//! `harness/aio/compose.lite.yml` brought up with the same image.
//!
//! The script's tools (docker.io, docker-compose, debootstrap) come from
//! `scripts/container-check.sh --install-only` (`.ci/run` runs it): without them the test is
//! skipped, and fails under `CI=true`. Where Docker itself cannot run (no root to start dockerd,
//! or dockerd does not start) it is skipped with the reason, under CI too, loudly.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the whole check may take: about 25 s warm and 2 minutes cold (debootstrap) on an
/// idle 2-core machine.
const CHECK_TIMEOUT: Duration = Duration::from_secs(900);
/// The script's exit status when Docker cannot run on this machine.
const DOCKER_CANNOT_RUN: i32 = 77;
/// The script's exit status when a tool it needs is not installed.
const TOOL_MISSING: i32 = 78;

#[ignore = "needs root and Docker: scripts/container-check.sh --install-only installs docker.io, docker-compose and debootstrap"]
#[test]
fn the_image_builds_on_a_local_base_and_serves_under_docker_and_compose() {
    let test = "the_image_builds_on_a_local_base_and_serves_under_docker_and_compose";
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = tempfile::NamedTempFile::new().expect("a file for the check's output");
    // One open file for both streams (a clone shares its offset), so neither overwrites the other.
    let stdout = out.reopen().expect("reopen the output file");
    let stderr = stdout.try_clone().expect("clone the output file");
    // A process group of its own: on a timeout the script and its docker clients all go (its
    // dockerd runs in a session of its own and is stopped by the script's exit trap on SIGTERM).
    let mut child = Command::new("bash")
        .arg(root.join("scripts/container-check.sh"))
        .env("PICO_BIN", env!("CARGO_BIN_EXE_pico"))
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("run scripts/container-check.sh: {e}"));
    let deadline = Instant::now() + CHECK_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the check") {
            break Some(status);
        }
        if Instant::now() > deadline {
            // SIGTERM first, so that the script's trap stops its dockerd and removes its
            // containers; SIGKILL for what is left after a grace period.
            // SAFETY: kill(2) on the process group of our own child; no memory is involved.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(40));
            // SAFETY: as above.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(out.path()).unwrap_or_default();
    let Some(status) = status else {
        panic!("scripts/container-check.sh did not finish within {CHECK_TIMEOUT:?}\n{output}");
    };
    match status.code() {
        Some(0) => eprint!("{output}"),
        Some(DOCKER_CANNOT_RUN) => {
            // Straight to the process's stderr: the test harness captures eprintln! of a test
            // that passes, and this skip must show in a CI log.
            let _ = writeln!(
                std::io::stderr(),
                "{output}\n{test}: SKIPPED: Docker cannot run on this machine (the reason is \
                 above); the container image was NOT checked"
            );
        }
        Some(TOOL_MISSING) => {
            eprintln!("{output}");
            pico_testkit::missing_service(
                test,
                "needs docker.io, docker-compose and debootstrap (scripts/container-check.sh --install-only)",
            );
        }
        _ => panic!("scripts/container-check.sh: {status}\n{output}"),
    }
}
