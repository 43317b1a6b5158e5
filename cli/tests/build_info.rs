//! Which build a node runs: `pico --version` and
//! `-V`, the start-up log, `/metrics` (`pico_build_info`), the admin API and the dashboard all
//! name the same version and git commit.

mod common;

use common::{Conn, Server};

/// The commit `build.rs` records: `git rev-parse --short HEAD` of this checkout, when git
/// answers here (else the binary says `unknown`).
fn expected_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

#[test]
fn version_flags_print_the_version_and_commit() {
    let dir = tempfile::tempdir().unwrap();
    let line = format!(
        "pico {} (commit {})\n",
        env!("CARGO_PKG_VERSION"),
        expected_commit()
    );
    for flag in ["--version", "-V"] {
        let out = common::pico(dir.path(), &[flag]);
        assert_eq!(out.status.code(), Some(0), "{flag}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), line, "{flag}");
        assert!(out.stderr.is_empty(), "{flag}: {out:?}");
    }
    // Anywhere else it is still an unknown flag, as before.
    let out = common::pico(dir.path(), &["head", "-V"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn a_node_reports_its_build_in_the_log_metrics_admin_api_and_dashboard() {
    let server = Server::start(&["--cores", "1"]);
    let (version, commit) = (env!("CARGO_PKG_VERSION"), expected_commit());
    let log = server.log();
    assert!(
        log.contains(&format!("pico {version} (commit {commit})")),
        "{log}"
    );
    let get = |path: &str| {
        Conn::connect(server.admin)
            .unwrap()
            .request("GET", path, &[], b"")
            .unwrap()
    };
    let metrics = get("/metrics").expect(200).text();
    assert!(
        metrics.contains("# TYPE pico_build_info gauge\n")
            && metrics.contains(&format!(
                "\npico_build_info{{version=\"{version}\",commit=\"{commit}\"}} 1\n"
            )),
        "{metrics}"
    );
    let cluster = get("/admin/cluster").expect(200).json();
    assert_eq!(cluster["version"], version, "{cluster}");
    assert_eq!(cluster["commit"], commit.as_str(), "{cluster}");
    // The dashboard shows what /admin/cluster says.
    assert!(get("/").expect(200).text().contains("id=\"version\""));
    assert!(get("/assets/app.js")
        .expect(200)
        .text()
        .contains("text(\"version\", `pico ${c.version} (commit ${c.commit})`)"));
}
