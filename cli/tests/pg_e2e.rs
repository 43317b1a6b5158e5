//! A node whose metadata log is in PostgreSQL (`--meta-url postgres://…`), end to end: streams
//! created and appended through both protocols, a fork and its soft-deleted source, all back
//! after `kill -9` and a restart. Needs `PICOMQ_PG_URL` to name a server (each test on a fresh
//! database of its own, see `pico_meta::testing`): `#[ignore]`d, run with `--include-ignored`;
//! without the variable it prints a skip note, or fails under `CI=true`.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{ds, ds_read, read_all, wait_for, Server};
use pico_meta::testing::PgDatabase;

const TEXT: (&str, &str) = ("content-type", "text/plain");

#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
#[test]
fn a_node_on_postgres_keeps_every_acknowledged_record_across_kill_9() {
    let Some(database) = PgDatabase::create("pg_e2e_node") else {
        return;
    };
    // Segments seal within 50 ms, so the restart reads sealed data through the catalog in
    // Postgres, not only the local WAL.
    let mut server = Server::start(&[
        "--meta-url",
        database.url(),
        "--ds-listen",
        "127.0.0.1:0",
        "--segment-max-age-ms",
        "50",
    ]);

    // The password is in neither the log nor the admin API.
    let password = database
        .url()
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map(|(_, password)| password.to_string())
        .expect("PICOMQ_PG_URL carries a password");
    assert!(
        !server.log().contains(&format!(":{password}@")),
        "log shows the password"
    );
    let cluster = common::Conn::connect(server.admin)
        .unwrap()
        .request("GET", "/admin/cluster", &[], b"")
        .unwrap();
    assert!(cluster.text().contains(":***@"), "{}", cluster.text());

    // Pico protocol: three streams, every append acknowledged.
    let mut acknowledged: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    for stream in 0..3 {
        let name = format!("/pg/s{stream}");
        server.put(&name, "text/plain").expect(201);
        acknowledged.insert(name, Vec::new());
    }
    for round in 0..30 {
        for (name, bodies) in acknowledged.iter_mut() {
            let body = format!("{name} #{round}").into_bytes();
            server.post(name, &body).expect(200);
            bodies.push(body);
        }
        if round == 10 {
            std::thread::sleep(Duration::from_millis(100)); // a seal between appends
        }
    }

    // Durable Streams: a source, a fork inside its first record, then the source deleted: gone
    // for clients, kept (soft-deleted) for the fork.
    let ds_addr = server.second.expect("the --ds-listen address is printed");
    ds(ds_addr, "PUT", "/pg/src", &[TEXT], b"hello").expect(201);
    ds(ds_addr, "POST", "/pg/src", &[TEXT], b" world").expect(204);
    let fork_headers = [
        ("stream-forked-from", "/pg/src"),
        ("stream-fork-offset", "0000000000000000_0000000000000000"),
        ("stream-fork-sub-offset", "3"),
    ];
    ds(ds_addr, "PUT", "/pg/fork", &fork_headers, b"").expect(201);
    ds(ds_addr, "POST", "/pg/fork", &[TEXT], b"p!").expect(204);
    ds(ds_addr, "DELETE", "/pg/src", &[], b"").expect(204);
    ds_read(ds_addr, "/pg/src", "-1").expect(410);
    assert_eq!(ds_read(ds_addr, "/pg/fork", "-1").text(), "help!");

    // The registry and the catalog are in Postgres, and nothing went to a local SQLite file.
    wait_for(
        "a segment in the Postgres catalog",
        Duration::from_secs(20),
        || {
            let count = database.query("SELECT count(*) FROM segments");
            (count[0][0].as_deref() != Some("0")).then_some(())
        },
    );
    assert!(!server.dir().join("meta.db").exists());

    server.restart(); // SIGKILL, then the same flags: the same database

    for (name, bodies) in &acknowledged {
        let (records, next) = read_all(&server, name, 0);
        assert_eq!(next, bodies.len() as u64, "{name}: tail after restart");
        let read: Vec<&[u8]> = records.iter().map(|record| &record.body[..]).collect();
        let want: Vec<&[u8]> = bodies.iter().map(|body| &body[..]).collect();
        assert_eq!(read, want, "{name}: records after restart");
    }
    let ds_addr = server.second.expect("the --ds-listen address is printed");
    assert_eq!(ds_read(ds_addr, "/pg/fork", "-1").text(), "help!");
    ds_read(ds_addr, "/pg/src", "-1").expect(410);
    ds(ds_addr, "PUT", "/pg/src", &[TEXT], b"").expect(409);
    let rows = database.query(
        "SELECT name, soft_deleted::text, fork_source FROM streams
         WHERE name IN ('/pg/src', '/pg/fork') ORDER BY name",
    );
    let some = |text: &str| Some(text.to_string());
    assert_eq!(
        rows,
        [
            vec![some("/pg/fork"), some("false"), some("/pg/src")],
            vec![some("/pg/src"), some("true"), None],
        ]
    );

    // Appends continue at the tail.
    server.post("/pg/s0", b"after").expect(200);
    let (records, next) = read_all(&server, "/pg/s0", 0);
    assert_eq!(next, 31);
    assert_eq!(records.last().unwrap().body, b"after");
}

/// Needs no server: a Postgres that cannot be reached stops `pico serve` at startup with an
/// error naming the URL, its password masked.
#[test]
fn an_unreachable_postgres_stops_startup_with_the_password_masked() {
    let dir = tempfile::tempdir().unwrap();
    let output = common::pico(
        dir.path(),
        &[
            "serve",
            "--meta-url",
            "postgres://pico:s3cret@127.0.0.1:1/meta", // nothing listens on port 1
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--wal-dir",
            "wal",
            "--storage",
            "file://objects",
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("cannot connect to metadata database postgres://pico:***@127.0.0.1:1/meta"),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cret"), "{stderr}");
}
