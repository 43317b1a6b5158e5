//! The OpenAPI descriptions in `docs/openapi/` (the Pico protocol, Durable Streams, the admin
//! API) against a real node: `scripts/api-check.sh` starts a fresh node on ephemeral ports and
//! runs schemathesis (PyPI, pinned in `conformance/api/requirements.txt`) on each description
//! with a fixed seed; it fails on any 5xx, any status code the description does not list and
//! any body that does not match its schema. `PICOMQ_SCHEMATHESIS` names the `st` executable
//! (`.ci/run` makes a virtual environment with it); without one the test is skipped, and fails
//! under `CI=true`.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the whole check may take (about 20 s on an idle 2-core machine).
const CHECK_TIMEOUT: Duration = Duration::from_secs(300);

#[ignore = "needs schemathesis: PICOMQ_SCHEMATHESIS (the `st` of `pip install -r conformance/api/requirements.txt`)"]
#[test]
fn every_answer_of_a_node_matches_its_openapi_description() {
    let test = "every_answer_of_a_node_matches_its_openapi_description";
    let Some(st) = std::env::var("PICOMQ_SCHEMATHESIS")
        .ok()
        .filter(|p| !p.is_empty())
    else {
        pico_testkit::missing_service(
            test,
            "needs PICOMQ_SCHEMATHESIS, schemathesis' `st` (conformance/api/requirements.txt)",
        );
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = tempfile::NamedTempFile::new().expect("a file for the check's output");
    // A process group of its own: on a timeout the script, schemathesis and the node all go.
    let mut child = Command::new("bash")
        .arg(root.join("scripts/api-check.sh"))
        .env("PICO_BIN", env!("CARGO_BIN_EXE_pico"))
        .env("SCHEMATHESIS", &st)
        .stdin(Stdio::null())
        .stdout(out.reopen().expect("reopen the output file"))
        .stderr(out.reopen().expect("reopen the output file"))
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("run scripts/api-check.sh: {e}"));
    let deadline = Instant::now() + CHECK_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the check") {
            break Some(status);
        }
        if Instant::now() > deadline {
            // SAFETY: kill(2) on the process group of our own child; no memory is involved.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = std::fs::read_to_string(out.path()).unwrap_or_default();
    let Some(status) = status else {
        panic!("scripts/api-check.sh did not finish within {CHECK_TIMEOUT:?}\n{output}");
    };
    assert!(status.success(), "scripts/api-check.sh: {status}\n{output}");
    eprint!("{output}");
}
