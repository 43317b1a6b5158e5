//! The server's default log filter: glommio's harmless start-up `ERROR glommio::reactor: got
//! unexpected error when probing iopoll support ...` lines are silenced unless `RUST_LOG`
//! names glommio.

mod common;

use common::Server;

#[test]
fn default_log_has_no_glommio_lines() {
    // The guard passes the test's environment through (except PICO_*): pin RUST_LOG.
    std::env::set_var("RUST_LOG", "info");
    let mut server = Server::start(&[]);
    // The WAL files are opened before `serving on` is printed; an append makes sure the
    // data path has run too.
    server.put("/logging/s", "text/plain").expect(201);
    server.post("/logging/s", b"x").expect(200);
    server.kill();
    let log = server.log();
    assert!(log.contains("INFO"), "the log shows info lines:\n{log}");
    assert!(!log.contains("glommio"), "glommio lines leaked:\n{log}");
}
