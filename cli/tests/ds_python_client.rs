//! The official Durable Streams Python client (PyPI `durable-streams`, pinned in
//! `conformance/python/requirements.txt`) against a real node: create, byte and JSON appends,
//! head, catch-up reads, a read from an offset, long-poll and SSE readers that get what is
//! appended while they wait, `Stream-Seq` conflicts and delete
//! (`conformance/python/client_check.py`). `PICOMQ_PYTHON` names a Python that has the client
//! (`.ci/run` makes a virtual environment with it); without one the test is skipped, and fails
//! under `CI=true`.

mod common;

use std::path::Path;
use std::time::Duration;

use common::Server;

/// How long the script may take (its own waits are bounded at 20 s each).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

#[ignore = "needs the official Python client: PICOMQ_PYTHON (a Python with `pip install -r conformance/python/requirements.txt`)"]
#[test]
fn the_official_python_client_works_against_a_node() {
    let test = "the_official_python_client_works_against_a_node";
    let Some(python) = std::env::var("PICOMQ_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
    else {
        pico_testkit::missing_service(
            test,
            "needs PICOMQ_PYTHON, a Python with the client (conformance/python/requirements.txt)",
        );
        return;
    };
    let server = Server::start(&["--ds-listen", "127.0.0.1:0"]);
    let ds_addr = server.second.expect("the Durable Streams listener");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../conformance/python/client_check.py");
    let mut child = std::process::Command::new(&python)
        .arg(&script)
        .arg(format!("http://{ds_addr}"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {python}: {e}"));
    let Some(status) = common::exit_within(&mut child, SCRIPT_TIMEOUT) else {
        panic!("the Python client did not finish within {SCRIPT_TIMEOUT:?}");
    };
    let output = child.wait_with_output().expect("the script's output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        status.success() && stdout.contains("all checks passed"),
        "{status}\n{stdout}\n{stderr}\n{}",
        server.log()
    );
    eprint!("{stdout}");
}
