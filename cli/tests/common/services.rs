//! Outside services a test runs instances of its own of, so it can stop and start them
//! without disturbing the tests that share the machine's: a Postgres server (a Garage is
//! `pico_testkit::garage::OwnGarage`), and the names the tests reach the shared Garage by.

use pico_testkit::garage::bucket;

pub fn region() -> String {
    std::env::var("PICOMQ_S3_REGION").unwrap_or_else(|_| "garage".to_string())
}

pub fn access_key() -> String {
    std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_default()
}

pub fn secret_key() -> String {
    std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_default()
}

/// The `--storage` value of a node on this endpoint.
pub fn storage(endpoint: &str) -> String {
    format!(
        "-2@s3://{}?region={}&endpoint={endpoint}&pathStyle=true",
        bucket(),
        region()
    )
}

/// A Postgres server of one test's own (its own data directory and port), so the test can
/// stop and start it without disturbing the tests that share `PICOMQ_PG_URL`.
pub struct PrivatePostgres {
    bin: std::path::PathBuf,
    data: std::path::PathBuf,
    port: u16,
    _dir: tempfile::TempDir,
}

impl PrivatePostgres {
    /// `None` (after a skip note; a failure under `CI=true`) when the Postgres binaries are
    /// not installed (`scripts/pg-up.sh` installs them).
    pub fn start(test: &str) -> Option<PrivatePostgres> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()
            .and_then(|versions| {
                versions
                    .filter_map(|v| v.ok().map(|v| v.path().join("bin")))
                    .filter(|bin| bin.join("pg_ctl").exists())
                    .max()
            });
        let Some(bin) = bin else {
            pico_testkit::missing_service(test, "needs Postgres installed (scripts/pg-up.sh)");
            return None;
        };
        let dir = tempfile::Builder::new()
            .prefix("pico-pg-")
            .tempdir()
            .unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        // Postgres refuses to run as root: the data belongs to user postgres.
        let chown = std::process::Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(chown.success());
        // One port per test of this process: the two restart tests run side by side.
        let salt = test
            .bytes()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b.into()));
        let port = 20_000 + ((std::process::id() + salt) % 10_000) as u16;
        let pg = PrivatePostgres {
            bin,
            data,
            port,
            _dir: dir,
        };
        pg.run("initdb", &["-A", "trust", "-U", "postgres", "-D"]);
        pg.ctl("start");
        Some(pg)
    }

    pub fn run(&self, program: &str, args: &[&str]) {
        let out = std::process::Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join(program))
            .args(args)
            .arg(&self.data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{program}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `pg_ctl start|stop` (waiting until done; a fast stop drops every connection).
    pub fn ctl(&self, action: &str) {
        let options = format!("-p {} -k /tmp -c listen_addresses=127.0.0.1", self.port);
        self.run(
            "pg_ctl",
            &[
                action,
                "-w",
                "-m",
                "fast",
                "-o",
                &options,
                "-l",
                "/dev/null",
                "-D",
            ],
        );
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = std::process::Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .args(["stop", "-m", "immediate", "-D"])
            .arg(&self.data)
            .output();
    }
}
