//! The server's log: the default filter silences glommio's harmless start-up `ERROR
//! glommio::reactor: got unexpected error when probing iopoll support ...` lines unless
//! `RUST_LOG` names glommio; `--log-format json` prints one JSON object per line; and no
//! secret reaches the log, even at `RUST_LOG=trace`: bearer tokens (known, unknown and
//! reloaded), S3 credentials, the password of a `postgres://` `--meta-url`.

mod common;

use std::time::Duration;

use common::{ds, Server};
use time::format_description::well_known::Rfc3339;

#[test]
fn default_log_has_no_glommio_lines() {
    let mut server = Server::start_with_env(&[], &[("RUST_LOG", "info")]);
    // The WAL files are opened before `serving on` is printed; an append makes sure the
    // data path has run too.
    server.put("/logging/s", "text/plain").expect(201);
    server.post("/logging/s", b"x").expect(200);
    server.kill();
    let log = server.log();
    assert!(log.contains("INFO"), "the log shows info lines:\n{log}");
    assert!(!log.contains("glommio"), "glommio lines leaked:\n{log}");
}

#[test]
fn a_bad_log_format_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::pico(dir.path(), &["serve", "--log-format", "yaml"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--log-format") && stderr.contains("expected text or json"),
        "{stderr}"
    );
}

/// The two formats, and how the server is told: the flag, or its variable.
const FORMATS: [(&str, Format); 2] = [("text", Format::Flag), ("json", Format::Env)];

#[derive(Clone, Copy)]
enum Format {
    Flag,
    Env,
}

/// Starts a node with `args` and `env` (plus `RUST_LOG=trace` and the log format) in each
/// format, runs `exercise` on it, stops it with SIGTERM (the shutdown path logs too), and
/// returns each format's log after checking that its lines have that format.
fn logs_of(
    args: &[&str],
    env: &[(&str, &str)],
    exercise: &dyn Fn(&Server),
) -> Vec<(&'static str, String)> {
    let mut logs = Vec::new();
    for (format, how) in FORMATS {
        let mut args = args.to_vec();
        let mut env = env.to_vec();
        env.push(("RUST_LOG", "trace"));
        match how {
            Format::Flag => args.extend(["--log-format", format]),
            Format::Env => env.push(("PICO_LOG_FORMAT", format)),
        }
        let mut server = Server::start_with_env(&args, &env);
        exercise(&server);
        assert!(server.terminate(Duration::from_secs(60)).success());
        let log = server.log();
        assert!(
            log.contains("log filter: RUST_LOG"),
            "RUST_LOG=trace shows debug lines:\n{log}"
        );
        let mut lines = log.lines();
        check_line(format, lines.next().unwrap_or_default());
        for line in lines {
            // A text message may span lines (tokio-postgres logs its SQL); a JSON one may not.
            let continued = format == "text"
                && time::OffsetDateTime::parse(line.split(' ').next().unwrap(), &Rfc3339).is_err();
            if !continued {
                check_line(format, line);
            }
        }
        logs.push((format, log));
    }
    logs
}

/// `ts level target: msg`, or `{"ts":..,"level":..,"target":..,"msg":..}`; `ts` is RFC 3339
/// with milliseconds.
#[track_caller]
fn check_line(format: &str, line: &str) {
    let (ts, level) = if format == "json" {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let object = value.as_object().expect("an object");
        let keys: Vec<&str> = object.keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 4, "{line}");
        for key in ["ts", "level", "target", "msg"] {
            assert!(object[key].is_string(), "{key} in {line}");
        }
        (
            object["ts"].as_str().unwrap().to_owned(),
            object["level"].as_str().unwrap().to_owned(),
        )
    } else {
        let mut words = line.split_whitespace();
        let ts = words.next().unwrap_or_default().to_owned();
        let level = words.next().unwrap_or_default().to_owned();
        assert!(
            words.next().is_some_and(|target| target.ends_with(':')),
            "{line}"
        );
        (ts, level)
    };
    assert!(
        ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&level.as_str()),
        "{line}"
    );
    time::OffsetDateTime::parse(&ts, &Rfc3339).unwrap_or_else(|e| panic!("ts {ts:?} ({e})"));
    assert!(
        ts.len() == "2026-05-01T12:34:56.789Z".len() && ts.ends_with('Z'),
        "{line}"
    );
}

#[track_caller]
fn assert_absent(logs: &[(&str, String)], secrets: &[&str]) {
    for (format, log) in logs {
        for secret in secrets {
            assert!(
                !log.contains(secret),
                "--log-format {format}: the log shows {secret:?}:\n{log}"
            );
        }
    }
}

const READER: &str = "tok-reader-7c1f0e92d4";
const WRITER: &str = "tok-writer-3b8a65e1f0";
const RELOADED: &str = "tok-reloaded-c94d2a07b6";
const UNKNOWN: &str = "tok-unknown-58e3f1a9c2";
const ADMIN: &str = "tok-admin-9d0b6e2f5a";
const S3_SECRET: &str = "s3-secret-0f6e2d9c8b7a";
const S3_SESSION: &str = "s3-session-4a1b7c3e9d";

fn bearer(token: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {token}"))
}

#[test]
fn tokens_and_credentials_never_reach_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let grants = format!("{READER} /logs/ read\n{WRITER} / read,append\n{ADMIN} / admin\n");
    let tokens_arg = tokens.display().to_string();
    let args = [
        "--auth",
        "required",
        "--auth-tokens",
        tokens_arg.as_str(),
        "--ds-listen",
        "127.0.0.1:0",
    ];
    // Unused by a file:// bucket, but in the environment like an operator's: nothing may
    // print the environment.
    let env = [
        ("AWS_ACCESS_KEY_ID", "AKIDLOGTEST"),
        ("AWS_SECRET_ACCESS_KEY", S3_SECRET),
        ("AWS_SESSION_TOKEN", S3_SESSION),
    ];
    let exercise = |server: &Server| {
        std::fs::write(&tokens, &grants).unwrap();
        let (name, value) = bearer(WRITER);
        let writer = [(name, value.as_str())];
        let (name, value) = bearer(READER);
        let reader = [(name, value.as_str())];
        let (name, value) = bearer(UNKNOWN);
        let unknown = [(name, value.as_str())];
        let text = [("content-type", "text/plain"), writer[0]];

        // Pico protocol: allowed, forbidden (403) and unknown (401) tokens.
        server.request("PUT", "/logs/a", &text, b"").expect(201);
        server
            .request("POST", "/logs/a", &writer, b"one")
            .expect(200);
        server.request("GET", "/logs/a", &reader, b"").expect(200);
        server
            .request("POST", "/logs/a", &reader, b"no")
            .expect(403);
        server.request("GET", "/logs/a", &unknown, b"").expect(401);
        server
            .request("GET", "/logs/a", &[("authorization", WRITER)], b"")
            .expect(401);

        // Durable Streams.
        let second = server.second.expect("the --ds-listen address");
        ds(second, "PUT", "/logs/ds", &text, b"hi").expect(201);
        ds(second, "POST", "/logs/ds", &text, b" there").expect(204);
        ds(second, "GET", "/logs/ds?offset=-1", &reader, b"").expect(200);
        ds(second, "GET", "/logs/ds?offset=-1", &unknown, b"").expect(401);

        // The admin listener: the admin grant, a token without it (403), an unknown one (401).
        let (name, value) = bearer(ADMIN);
        let admin = [(name, value.as_str())];
        ds(server.admin, "GET", "/admin/streams", &admin, b"").expect(200);
        ds(server.admin, "GET", "/admin/streams", &writer, b"").expect(403);
        ds(server.admin, "GET", "/admin/streams", &unknown, b"").expect(401);

        // SIGHUP reloads the file: the new token works, and is not printed either.
        std::fs::write(&tokens, format!("{grants}{RELOADED} / read\n")).unwrap();
        let pid = server.pid().expect("the server runs") as i32;
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(pid, libc::SIGHUP) };
        let (name, value) = bearer(RELOADED);
        let reloaded = [(name, value.as_str())];
        common::wait_for("the reloaded token", Duration::from_secs(30), || {
            (server.request("GET", "/logs/a", &reloaded, b"").status == 200).then_some(())
        });
    };
    // The token file must exist before the node starts.
    std::fs::write(&tokens, &grants).unwrap();
    let logs = logs_of(&args, &env, &exercise);
    for (format, log) in &logs {
        assert!(log.contains("SIGHUP: reloaded"), "{format}:\n{log}");
    }
    assert_absent(
        &logs,
        &[
            READER, WRITER, RELOADED, UNKNOWN, ADMIN, S3_SECRET, S3_SESSION,
        ],
    );
}

#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
#[test]
fn the_meta_url_password_never_reaches_the_log() {
    let Some(database) = pico_meta::testing::PgDatabase::create("log_secrets") else {
        return;
    };
    // A role of this test's own, so that its password is a string found nowhere else (the
    // CI user's password is its name, which the log rightly shows).
    let role = format!("pico_log_{}", std::process::id());
    let password = format!("pw-{}-5d2e8f1a", std::process::id());
    database.execute_admin(&format!("DROP ROLE IF EXISTS {role}"));
    database.execute_admin(&format!("CREATE ROLE {role} LOGIN PASSWORD '{password}'"));
    database.execute_admin(&format!(
        "ALTER DATABASE {} OWNER TO {role}",
        database.name()
    ));
    let host = database
        .url()
        .split_once('@')
        .map(|(_, host)| host)
        .expect("PICOMQ_PG_URL has user@host");
    let url = format!("postgres://{role}:{password}@{host}");

    // Both nodes on the catalog's one bucket, as nodes of one catalog must be.
    let objects = tempfile::tempdir().unwrap();
    let storage = format!("-2@file://{}", objects.path().display());
    let logs = logs_of(
        &["--meta-url", &url, "--storage", &storage],
        &[],
        &|server| {
            // The second node (the other format) finds the stream the first created.
            let created = server.put("/pg/a", "text/plain").status;
            assert!(created == 201 || created == 200, "{created}");
            server.post("/pg/a", b"one").expect(200);
        },
    );
    for (format, log) in &logs {
        assert!(log.contains(&format!("{role}:***@")), "{format}:\n{log}");
    }
    assert_absent(&logs, &[&password]);

    // The database (with the tables the role owns) goes first, then the role.
    database.execute(&format!("DROP OWNED BY {role}"));
    database.execute_admin(&format!(
        "ALTER DATABASE {} OWNER TO CURRENT_USER",
        database.name()
    ));
    database.execute_admin(&format!("DROP ROLE {role}"));
}

#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY"]
#[test]
fn s3_credentials_never_reach_the_log() {
    let Some(values) = pico_testkit::require("s3_credentials_log", &pico_testkit::GARAGE) else {
        return;
    };
    let (endpoint, secret) = (&values[0], &values[2]);
    let storage = common::services::storage(endpoint);
    // The node takes the credentials from the environment it inherits from this test.
    let logs = logs_of(&["--storage", &storage], &[], &|server| {
        server.put("/s3/a", "text/plain").expect(201);
        server.post("/s3/a", b"one").expect(200);
    });
    for (format, log) in &logs {
        assert!(log.contains("object store"), "{format}:\n{log}");
    }
    assert_absent(&logs, &[secret]);
}
