//! Backups of a serving node and restores from them (docs/backup.md), with real `pico serve`
//! processes: a backup taken while writers append through both protocols holds every append
//! acknowledged before it began, at its offset (records only the WAL held at the cut
//! included), with closed streams, trims, producers, forks and subscriptions; a node started
//! from it after the original was killed serves exactly that. A backup without its manifest is
//! refused, one backup runs at a time, and the garbage collector deletes nothing a backup
//! copies. The Garage case (an s3:// bucket backed up to a directory) is `#[ignore]`d like the
//! other Garage tests: it skips without Garage, and fails under `CI=true`.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{assert_records_eq, ds, ds_read, pico, read_all, Conn, ReadRecord, Resp, Server};
use serde_json::{json, Value};

/// How long the writers run before the backup, and after it.
const WRITE_BEFORE: Duration = Duration::from_millis(1_500);
const WRITE_AFTER: Duration = Duration::from_millis(500);
/// How long an admin request of these tests may take (a throttled backup takes seconds).
const ADMIN_TIMEOUT: Duration = Duration::from_secs(120);

/// One acknowledged append: when its answer came, the offset it got and its body.
#[derive(Clone, Debug)]
struct Ack {
    at: Instant,
    offset: u64,
    body: Vec<u8>,
    /// The producer sequence of the request (producer writers only).
    producer_seq: Option<u64>,
}

/// The kind of writer a thread is.
#[derive(Clone, Copy)]
enum Writer {
    Pico,
    PicoProducer,
    DurableStreams,
}

/// Appends to `stream` until `stop`, one record per request; every acknowledged append.
fn write_until(
    addr: SocketAddr,
    stream: &'static str,
    kind: Writer,
    stop: Arc<AtomicBool>,
) -> Vec<Ack> {
    let mut conn = Conn::connect(addr).expect("connect");
    let mut acks = Vec::new();
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let seq = n.to_string();
        let (response, body) = match kind {
            Writer::Pico => {
                let body = format!("pico-{n}").into_bytes();
                let response = conn.request("POST", stream, &[], &body);
                (response, body)
            }
            Writer::PicoProducer => {
                let body = format!("producer-{n}").into_bytes();
                let headers = [
                    ("pico-producer-id", "p1"),
                    ("pico-producer-epoch", "0"),
                    ("pico-producer-seq", seq.as_str()),
                ];
                (conn.request("POST", stream, &headers, &body), body)
            }
            Writer::DurableStreams => {
                let body = format!("{{\"n\":{n}}}").into_bytes();
                let headers = [("content-type", "application/json")];
                (conn.request("POST", stream, &headers, &body), body)
            }
        };
        let response = response.unwrap_or_else(|e| panic!("append to {stream}: {e}"));
        let at = Instant::now();
        let offset = match kind {
            Writer::Pico | Writer::PicoProducer => {
                response.expect(200);
                response.h_u64("pico-start-seq")
            }
            Writer::DurableStreams => {
                response.expect(204);
                ds_record(response.h("stream-next-offset")) - 1
            }
        };
        let producer_seq = matches!(kind, Writer::PicoProducer).then_some(n);
        acks.push(Ack {
            at,
            offset,
            body,
            producer_seq,
        });
        n += 1;
    }
    acks
}

/// The record part of a Durable Streams offset (`<record>_<bytes>`).
fn ds_record(offset: &str) -> u64 {
    let (record, _) = offset.split_once('_').expect("a Durable Streams offset");
    record.parse().expect("a record number")
}

/// One request to the admin listener, answered within [`ADMIN_TIMEOUT`].
fn admin(server: &Server, method: &str, path: &str, body: &Value) -> Resp {
    let mut conn = Conn::connect(server.admin).expect("connect to the admin listener");
    conn.set_read_timeout(ADMIN_TIMEOUT);
    let bytes = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    conn.request(
        method,
        path,
        &[("content-type", "application/json")],
        &bytes,
    )
    .unwrap_or_else(|e| panic!("{method} {path}: {e}\nserver log:\n{}", server.log()))
}

/// Where the backup named `name` of `server` goes: under its default `--backup-dir`
/// (`./data/backups`, the node running in its directory).
fn backup_path(server: &Server, name: &str) -> PathBuf {
    server.dir().join("data/backups").join(name)
}

/// `GET /admin/backup` until the backup running ends: how it ended.
fn finished_backup(server: &Server) -> Value {
    common::wait_for("the backup to end", ADMIN_TIMEOUT, || {
        let status = admin(server, "GET", "/admin/backup", &Value::Null);
        assert_eq!(status.status, 200, "{}", status.describe());
        let status = status.json();
        (status["state"] != "running").then_some(status)
    })
}

/// Starts a backup (`202`) and waits for it to end: how it ended.
fn backup(server: &Server, body: &Value) -> Value {
    let started = admin(server, "POST", "/admin/backup", body);
    assert_eq!(
        started.status,
        202,
        "{}\n{}",
        started.describe(),
        server.log()
    );
    finished_backup(server)
}

/// `pico admin restore --from FROM --to TO [more]`: its output.
fn restore(work: &Path, from: &Path, to: &Path, more: &[&str]) -> std::process::Output {
    let (from, to) = (from.display().to_string(), to.display().to_string());
    let mut args = vec!["admin", "restore", "--from", &from, "--to", &to];
    args.extend_from_slice(more);
    pico(work, &args)
}

/// Restores `from` into `to` and starts a node on it with `extra` flags.
fn restore_and_start(work: &Path, from: &Path, to: &Path, extra: &[&str]) -> Server {
    let out = restore(work, from, to, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "restore failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let serve = stdout
        .lines()
        .find_map(|line| line.strip_prefix("pico serve "))
        .unwrap_or_else(|| panic!("restore prints the serve flags: {stdout}"));
    let flags: Vec<&str> = serve.split_whitespace().collect();
    assert_eq!(flags.len(), 6, "three flags with values: {serve}");
    let mut args = flags;
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// Every append of `acks` acknowledged before `cut` is in `restored` at its offset, and
/// `restored` is a prefix of `original` (what the node served at the end): nothing that was
/// never written, nothing at another offset. The number of acknowledged appends it checked.
fn check_stream(
    name: &str,
    acks: &[Ack],
    cut: Instant,
    original: &[ReadRecord],
    restored: &[ReadRecord],
) -> usize {
    let before: Vec<&Ack> = acks.iter().filter(|a| a.at < cut).collect();
    assert!(
        !before.is_empty(),
        "{name}: appends were acknowledged before the backup"
    );
    for ack in &before {
        let record = restored
            .iter()
            .find(|r| r.seq == ack.offset)
            .unwrap_or_else(|| {
                panic!(
                    "{name}: record {} acknowledged before the backup is not in it ({} records restored)",
                    ack.offset,
                    restored.len()
                )
            });
        assert_eq!(record.body, ack.body, "{name}: record {}", ack.offset);
    }
    assert!(
        restored.len() <= original.len(),
        "{name}: the restore holds {} records, the node only ever had {}",
        restored.len(),
        original.len()
    );
    assert_records_eq(name, restored, &original[..restored.len()]);
    before.len()
}

#[test]
fn a_backup_under_load_restores_every_append_acknowledged_before_it() {
    // Nothing seals before the backup (8 MiB segments, 10 minutes of age): every record is
    // in the WAL alone when the backup begins, and only its checkpoint can bring them along.
    let mut server = Server::start(&[
        "--durability",
        "local",
        "--cores",
        "2",
        "--segment-max-age-ms",
        "600000",
    ]);
    let ds_addr = server.second.expect("the Durable Streams listener");
    // A closed stream, a trimmed one, a fork (inside a record) and a subscription.
    server.put("/p/closed", "text/plain").expect(201);
    for body in ["c0", "c1", "c2"] {
        server.post("/p/closed", body.as_bytes()).expect(200);
    }
    server
        .request("POST", "/p/closed", &[("pico-closed", "true")], b"")
        .expect(200);
    server.put("/p/trimmed", "text/plain").expect(201);
    for i in 0..10 {
        server
            .post("/p/trimmed", format!("t{i}").as_bytes())
            .expect(200);
    }
    let trim = server.request("POST", "/p/trimmed", &[("pico-trim-seq", "4")], b"");
    trim.expect(200);
    assert_eq!(trim.h_u64("pico-start-seq"), 4);
    ds(
        ds_addr,
        "PUT",
        "/d/src",
        &[("content-type", "text/plain")],
        b"hello",
    )
    .expect(201);
    ds(
        ds_addr,
        "POST",
        "/d/src",
        &[("content-type", "text/plain")],
        b" world",
    )
    .expect(204);
    ds(
        ds_addr,
        "PUT",
        "/d/fork",
        &[
            ("stream-forked-from", "/d/src"),
            ("stream-fork-offset", "0000000000000000_0000000000000000"),
            ("stream-fork-sub-offset", "3"),
        ],
        b"",
    )
    .expect(201);
    ds(
        ds_addr,
        "POST",
        "/d/fork",
        &[("content-type", "text/plain")],
        b"p!",
    )
    .expect(204);
    assert_eq!(ds_read(ds_addr, "/d/fork", "-1").text(), "help!");
    let subscription = json!({
        "type": "webhook",
        "pattern": "none/*",
        "webhook": {"url": "http://127.0.0.1:9/hook"},
        "description": "kept by backups",
    });
    ds(
        ds_addr,
        "PUT",
        "/__ds/subscriptions/hook",
        &[("content-type", "application/json")],
        subscription.to_string().as_bytes(),
    )
    .expect(201);

    // Writers through both protocols, one of them an idempotent producer.
    server.put("/p/plain", "text/plain").expect(201);
    server.put("/p/producer", "text/plain").expect(201);
    ds(
        ds_addr,
        "PUT",
        "/d/json",
        &[("content-type", "application/json")],
        b"",
    )
    .expect(201);
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<(&'static str, thread::JoinHandle<Vec<Ack>>)> = [
        ("/p/plain", server.addr, Writer::Pico),
        ("/p/producer", server.addr, Writer::PicoProducer),
        ("/d/json", ds_addr, Writer::DurableStreams),
    ]
    .into_iter()
    .map(|(name, addr, kind)| {
        let stop = stop.clone();
        (
            name,
            thread::spawn(move || write_until(addr, name, kind, stop)),
        )
    })
    .collect();
    thread::sleep(WRITE_BEFORE);
    let sealed = std::fs::read_dir(common::segments_dir(server.dir()))
        .map(|entries| entries.count())
        .unwrap_or(0);
    assert_eq!(
        sealed, 0,
        "no segment was stored before the backup: the WAL alone holds the records"
    );

    let backup_dir = backup_path(&server, "under-load");
    let cut = Instant::now();
    let out = pico(
        server.dir(),
        &[
            "admin",
            "--admin-endpoint",
            &format!("http://{}", server.admin),
            "backup",
            "--to",
            "under-load",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "pico admin backup: {stdout}{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    assert!(stdout.starts_with("backup="), "{stdout}");
    thread::sleep(WRITE_AFTER);
    stop.store(true, Ordering::Relaxed);
    let acks: Vec<(&str, Vec<Ack>)> = writers
        .into_iter()
        .map(|(name, handle)| (name, handle.join().expect("a writer")))
        .collect();
    let originals: Vec<Vec<ReadRecord>> = acks
        .iter()
        .map(|(name, _)| read_all(&server, name, 0).0)
        .collect();
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(backup_dir.join("manifest.json")).expect("the manifest"),
    )
    .expect("JSON");
    assert!(manifest["startedAtMs"].as_i64().is_some(), "{manifest}");
    assert_eq!(manifest["subscriptions"], 1);
    server.kill();

    let restored_dir = tempfile::tempdir().expect("a directory");
    let to = restored_dir.path().join("node");
    let restored = restore_and_start(
        restored_dir.path(),
        &backup_dir,
        &to,
        &["--durability", "local"],
    );
    let restored_ds = restored.second.expect("the Durable Streams listener");
    let mut checked = 0;
    for ((name, acks), original) in acks.iter().zip(&originals) {
        let (records, _) = read_all(&restored, name, 0);
        checked += check_stream(name, acks, cut, original, &records);
    }
    eprintln!("backup: {checked} appends acknowledged before the backup found after the restore");

    // The producer's state: a retry of the last request acknowledged before the backup is a
    // duplicate (the restore may hold later ones too: still a duplicate).
    let producer = &acks[1].1;
    let last = producer
        .iter()
        .rfind(|a| a.at < cut)
        .expect("a producer request before the backup");
    let seq = last.producer_seq.expect("a producer seq").to_string();
    let retry = restored.request(
        "POST",
        "/p/producer",
        &[
            ("pico-producer-id", "p1"),
            ("pico-producer-epoch", "0"),
            ("pico-producer-seq", seq.as_str()),
        ],
        b"a retry",
    );
    retry.expect(200);
    assert_eq!(
        retry.header("pico-start-seq"),
        None,
        "a duplicate: nothing written"
    );

    // Closed stays closed, the trim stays, the fork reads through its source, the
    // subscription is there.
    let refused = restored.post("/p/closed", b"after the close");
    assert_eq!(refused.expect_error(409, "closed")["next_seq"], 3);
    let (trimmed, next) = read_all(&restored, "/p/trimmed", 4);
    let bodies: Vec<String> = trimmed
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    assert_eq!(bodies, ["t4", "t5", "t6", "t7", "t8", "t9"]);
    assert_eq!(next, 10);
    restored.get("/p/trimmed?seq=1").expect(410);
    assert_eq!(ds_read(restored_ds, "/d/fork", "-1").text(), "help!");
    let got = ds(restored_ds, "GET", "/__ds/subscriptions/hook", &[], b"");
    got.expect(200);
    assert_eq!(got.json()["pattern"], "none/*");
    assert_eq!(got.json()["description"], "kept by backups");

    // The restored node takes appends at its tail.
    let (records, tail) = read_all(&restored, "/p/plain", 0);
    assert_eq!(tail, records.len() as u64);
    let appended = restored.post("/p/plain", b"after the restore");
    appended.expect(200);
    assert_eq!(appended.h_u64("pico-start-seq"), tail);
}

/// A stream of `records` records of `size` bytes each on `server`.
fn fill(server: &Server, name: &str, records: usize, size: usize) {
    server.put(name, "application/octet-stream").expect(201);
    let mut conn = server.connect();
    for i in 0..records {
        let mut body = format!("{name}-{i}-").into_bytes();
        body.resize(size, b'x');
        conn.request("POST", name, &[], &body)
            .expect("append")
            .expect(200);
    }
}

#[test]
fn one_backup_at_a_time_and_an_unfinished_or_damaged_backup_is_refused() {
    let server = Server::start(&[]);
    // ~400 KB read at 100 KB/s: the first backup takes about 4 s.
    fill(&server, "/limits/a", 400, 1_000);
    let work = server.dir().to_path_buf();
    let first_dir = backup_path(&server, "first");
    let first = admin(
        &server,
        "POST",
        "/admin/backup",
        &json!({"to": "first", "maxBytesPerSecond": 100_000}),
    );
    assert_eq!(first.status, 202, "{}", first.describe());
    assert_eq!(first.json()["state"], "running");
    assert_eq!(
        admin(&server, "GET", "/admin/backup", &Value::Null).json()["state"],
        "running"
    );
    let second = admin(&server, "POST", "/admin/backup", &json!({"to": "second"}));
    assert_eq!(second.status, 409, "{}", second.describe());
    assert!(second.json()["error"]
        .as_str()
        .unwrap_or_default()
        .contains("one at a time"));
    let summary = finished_backup(&server);
    assert_eq!(summary["state"], "complete", "{summary}\n{}", server.log());
    assert!(summary["objects"].as_u64().unwrap_or(0) >= 1, "{summary}");
    assert!(
        summary["finishedAtMs"].as_i64() >= summary["startedAtMs"].as_i64(),
        "{summary}"
    );

    // A backup that cannot finish in its time fails and leaves no manifest: restore refuses it.
    let failed = backup(
        &server,
        &json!({"to": "too-slow", "timeoutSec": 1, "maxBytesPerSecond": 1_000}),
    );
    assert_eq!(failed["state"], "failed", "{failed}");
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(error.contains("ran out of time"), "{failed}");
    let out = restore(
        &work,
        &backup_path(&server, "too-slow"),
        &work.join("from-slow"),
        &[],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no manifest.json"), "{stderr}");

    // Requests the node refuses.
    let refused = |body: Value, status: u16, text: &str| {
        let response = admin(&server, "POST", "/admin/backup", &body);
        assert_eq!(response.status, status, "{body}: {}", response.describe());
        let error = response.json()["error"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(error.contains(text), "{body}: {error}");
    };
    refused(json!({}), 400, "missing \"to\"");
    refused(json!({"to": "../outside"}), 400, "plain names");
    refused(
        json!({"to": "/etc/outside"}),
        400,
        "inside the node's --backup-dir",
    );
    // An absolute path inside --backup-dir is that directory.
    refused(json!({"to": "first"}), 400, "not empty");
    refused(
        json!({"to": first_dir.display().to_string()}),
        400,
        "not empty",
    );
    refused(json!({"to": "x", "timeoutSec": 0}), 400, "timeoutSec");
    std::fs::write(backup_path(&server, "a-file"), b"not a directory").expect("a file");
    refused(json!({"to": "a-file/below"}), 400, "cannot create");
    assert_eq!(
        admin(&server, "PUT", "/admin/backup", &Value::Null).status,
        405
    );

    // The finished backup restores; into a non-empty directory or a non-empty bucket it does
    // not.
    let restored = work.join("restored");
    let out = restore(&work, &first_dir, &restored, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = restore(&work, &first_dir, &restored, &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));
    let bucket = format!("-2@file://{}", restored.join("objects").display());
    let out = restore(
        &work,
        &first_dir,
        &work.join("elsewhere-too"),
        &["--storage", &bucket],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("holds"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Into another bucket (empty): its objects there, the catalog and the state here.
    let other_bucket = work.join("other-bucket");
    let bucket = format!("-2@file://{}", other_bucket.display());
    let out = restore(
        &work,
        &first_dir,
        &work.join("elsewhere"),
        &["--storage", &bucket],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(stdout.contains(&format!("--storage {bucket} ")), "{stdout}");
    assert_eq!(
        first_object(&other_bucket).file_name(),
        first_object(&first_dir.join("objects")).file_name()
    );
    assert!(work.join("elsewhere/meta.db").exists());

    // A damaged object is found before anything is laid out.
    let damaged = work.join("damaged");
    copy_tree(&first_dir, &damaged);
    let object = first_object(&damaged.join("objects"));
    let mut bytes = std::fs::read(&object).expect("an object");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&object, bytes).expect("write");
    let out = restore(&work, &damaged, &work.join("from-damaged"), &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not match its manifest"));

    // Without its manifest (a backup that did not finish) it is refused.
    std::fs::remove_file(first_dir.join("manifest.json")).expect("remove the manifest");
    let out = restore(&work, &first_dir, &work.join("from-unfinished"), &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no manifest.json") && stderr.contains("refused"),
        "{stderr}"
    );
    assert!(!work.join("from-unfinished").exists(), "nothing laid out");
}

#[test]
fn a_backup_refuses_a_damaged_segment_object_and_names_it() {
    let server = Server::start(&["--cores", "1", "--segment-max-age-ms", "200"]);
    fill(&server, "/b", 50, 1_000);
    let object = common::wait_for("an uploaded segment", ADMIN_TIMEOUT, || {
        let uploaded = server
            .metric_sample("pico_uploads_total{core=\"0\"}")
            .is_some_and(|n| n >= 1);
        uploaded.then(|| segment_objects(&server).into_iter().next())?
    });
    let mut bytes = std::fs::read(&object).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&object, &bytes).unwrap();

    let failed = backup(&server, &json!({"to": "damaged"}));
    assert_eq!(failed["state"], "failed", "{failed}");
    let error = failed["error"].as_str().unwrap_or_default();
    let key = object.file_name().unwrap().to_str().unwrap();
    assert!(error.contains(key), "{failed}");
    assert!(error.contains("is damaged"), "{failed}");
    // No manifest: the damaged copy can never be restored as a backup.
    let out = restore(
        server.dir(),
        &backup_path(&server, "damaged"),
        &server.dir().join("from-damaged"),
        &[],
    );
    assert!(!out.status.success());
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create");
    for entry in std::fs::read_dir(from).expect("read").flatten() {
        let (path, dest) = (entry.path(), to.join(entry.file_name()));
        if path.is_dir() {
            copy_tree(&path, &dest);
        } else {
            std::fs::copy(&path, &dest).expect("copy");
        }
    }
}

fn first_object(dir: &Path) -> PathBuf {
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read").flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "seg") {
                return path;
            }
        }
    }
    panic!("no object under {}", dir.display());
}

#[test]
fn the_collector_deletes_nothing_a_backup_copies() {
    // Small segments sealed often, a stream whose retention trims it every second and a
    // collector every 100 ms: segments the backup's catalog copy names become garbage for the
    // node while the (throttled) copy runs.
    let server = Server::start(&[
        "--segment-size",
        "64KiB",
        "--segment-max-age-ms",
        "200",
        "--gc-interval-ms",
        "100",
    ]);
    server
        .request(
            "PUT",
            "/gc/trimmed",
            &[
                ("content-type", "application/octet-stream"),
                ("pico-retention-bytes", "300000"),
            ],
            b"",
        )
        .expect(201);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (addr, stop) = (server.addr, stop.clone());
        thread::spawn(move || {
            let mut conn = Conn::connect(addr).expect("connect");
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut body = format!("gc-{n}-").into_bytes();
                body.resize(4_000, b'g');
                conn.request("POST", "/gc/trimmed", &[], &body)
                    .expect("append")
                    .expect(200);
                n += 1;
                thread::sleep(Duration::from_millis(10));
            }
        })
    };
    // Enough segments for the retention to trim past some.
    common::wait_for("a trim by retention", Duration::from_secs(60), || {
        let head = server.head("/gc/trimmed");
        (head.h_u64("pico-start-seq") > 0).then_some(())
    });
    let to = backup_path(&server, "gc");
    let started = Instant::now();
    let summary = backup(&server, &json!({"to": "gc", "maxBytesPerSecond": 60_000}));
    let took = started.elapsed();
    assert_eq!(summary["state"], "complete", "{summary}\n{}", server.log());
    assert_eq!(summary["skippedGarbage"], json!([]), "{summary}");
    // The copy lasted long enough for the retention and the collector to act meanwhile.
    assert!(
        took > Duration::from_secs(3),
        "the backup took {took:?}: {summary}"
    );
    let start_after = server.head("/gc/trimmed").h_u64("pico-start-seq");
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("the writer");

    let manifest: Value =
        serde_json::from_slice(&std::fs::read(to.join("manifest.json")).expect("manifest"))
            .expect("JSON");
    let stream = manifest["streams"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "/gc/trimmed"))
        .expect("the stream in the manifest")
        .clone();
    let start = stream["startOffset"].as_u64().expect("a start");
    assert!(
        start < start_after,
        "retention trimmed past the copy's start ({start}) while it ran (now {start_after})"
    );
    let restored_dir = tempfile::tempdir().expect("a directory");
    let restored = restore_and_start(
        restored_dir.path(),
        &to,
        &restored_dir.path().join("node"),
        &[],
    );
    // Every record the copy's catalog holds is readable: no object it names was deleted.
    let (records, next) = read_all(&restored, "/gc/trimmed", start);
    assert_eq!(next, stream["nextOffset"].as_u64().expect("a tail"));
    assert_eq!(records.len() as u64, next - start);
}

#[test]
#[ignore = "needs Garage (PICOMQ_S3_ENDPOINT); run with --include-ignored"]
fn a_node_on_garage_is_backed_up_to_a_directory() {
    let Some(endpoint) = pico_testkit::require("backup_garage", &pico_testkit::GARAGE)
        .map(|mut values| values.remove(0))
    else {
        return;
    };
    let storage = common::services::storage(&endpoint);
    let mut server = Server::start(&["--storage", &storage, "--durability", "object"]);
    fill(&server, "/garage/a", 200, 500);
    server.put("/garage/closed", "text/plain").expect(201);
    server
        .request(
            "POST",
            "/garage/closed",
            &[("pico-closed", "true")],
            b"last",
        )
        .expect(200);
    let (original, _) = read_all(&server, "/garage/a", 0);
    let to = backup_path(&server, "garage");
    let summary = backup(&server, &json!({"to": "garage"}));
    assert_eq!(summary["state"], "complete", "{summary}\n{}", server.log());
    assert!(summary["objects"].as_u64().unwrap_or(0) >= 1, "{summary}");
    server.kill();
    let restored_dir = tempfile::tempdir().expect("a directory");
    let restored = restore_and_start(
        restored_dir.path(),
        &to,
        &restored_dir.path().join("node"),
        &[],
    );
    let (records, _) = read_all(&restored, "/garage/a", 0);
    assert_records_eq("/garage/a", &records, &original);
    assert_eq!(records.len(), 200);
    restored
        .post("/garage/closed", b"more")
        .expect_error(409, "closed");
}

/// The `.seg` objects under a node's `file://` bucket.
fn segment_objects(server: &Server) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(common::segments_dir(server.dir())) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect()
}

/// `pico admin ARGS` against `server`; its stdout, after checking it succeeded.
fn pico_admin(server: &Server, args: &[&str]) -> String {
    let endpoint = format!("http://{}", server.admin);
    let mut all = vec!["admin", "--admin-endpoint", endpoint.as_str()];
    all.extend_from_slice(args);
    let out = pico(server.dir(), &all);
    assert!(
        out.status.success(),
        "pico {all:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_cluster_backups_steps_checkpoint_and_hold_the_collector() {
    // Nothing seals by itself (10 minutes of age); the collector looks every 100 ms.
    let server = Server::start(&["--segment-max-age-ms", "600000", "--gc-interval-ms", "100"]);
    server.put("/hold/a", "text/plain").expect(201);
    for i in 0..5 {
        server
            .post("/hold/a", format!("a{i}").as_bytes())
            .expect(200);
    }
    assert!(
        segment_objects(&server).is_empty(),
        "the WAL alone holds the records"
    );
    let out = pico_admin(&server, &["checkpoint"]);
    assert!(out.starts_with("startedAtMs="), "{out}");
    let stored = segment_objects(&server);
    assert_eq!(
        stored.len(),
        1,
        "the checkpoint stored the WAL's records: {stored:?}"
    );

    let out = pico_admin(&server, &["gc-hold", "--seconds", "600"]);
    assert!(out.starts_with("held=true until="), "{out}");
    assert_eq!(
        admin(&server, "GET", "/admin/gc-hold", &Value::Null).json()["held"],
        true
    );
    // Deleted, the stream leaves its segment garbage; held, the collector keeps it through
    // many rounds (a segment is judged a second after its seal).
    server.delete("/hold/a").expect(204);
    thread::sleep(Duration::from_millis(2_500));
    assert!(
        stored[0].exists(),
        "the held collector deleted {}",
        stored[0].display()
    );
    let out = pico_admin(&server, &["gc-release"]);
    assert_eq!(out.trim(), "held=false until=null");
    common::wait_for(
        "the collector to delete the segment",
        Duration::from_secs(30),
        || (!stored[0].exists()).then_some(()),
    );

    // A hold runs out by itself.
    let held = admin(&server, "POST", "/admin/gc-hold", &json!({"seconds": 1}));
    assert_eq!(held.status, 200, "{}", held.describe());
    common::wait_for("the hold to run out", Duration::from_secs(30), || {
        let status = admin(&server, "GET", "/admin/gc-hold", &Value::Null).json();
        (status["held"] == false).then_some(())
    });
    let refused = admin(&server, "POST", "/admin/gc-hold", &json!({"seconds": 0}));
    assert_eq!(refused.status, 400, "{}", refused.describe());
}

/// The directory of the installed Postgres programs (`pg_dump`, `pg_restore`), or `None`
/// after a skip note (a failure under `CI=true`).
fn postgres_programs(test: &str) -> Option<PathBuf> {
    let bin = std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .and_then(|versions| {
            versions
                .filter_map(|v| v.ok().map(|v| v.path().join("bin")))
                .filter(|bin| bin.join("pg_dump").exists() && bin.join("pg_restore").exists())
                .max()
        });
    if bin.is_none() {
        pico_testkit::missing_service(test, "needs pg_dump and pg_restore (scripts/pg-up.sh)");
    }
    bin
}

fn run_program(program: &Path, args: &[&str]) {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    assert!(
        out.status.success(),
        "{} {args:?}: {}{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
fn a_cluster_is_backed_up_by_its_procedure() {
    let test = "backup_cluster";
    let Some(database) = pico_meta::testing::PgDatabase::create(test) else {
        return;
    };
    let Some(bin) = postgres_programs(test) else {
        return;
    };
    let bucket = tempfile::tempdir().expect("a directory");
    let storage = format!("-2@file://{}", bucket.path().display());
    let node = |meta_url: &str, storage: &str| {
        Server::start(&[
            "--meta-url",
            meta_url,
            "--storage",
            storage,
            "--node-id",
            "1",
            "--lease-ms",
            "1500",
        ])
    };
    let mut server = node(database.url(), &storage);
    let refused = admin(&server, "POST", "/admin/backup", &json!({"to": "x"}));
    assert_eq!(refused.status, 501, "{}", refused.describe());
    server.put("/c/a", "text/plain").expect(201);
    for i in 0..20 {
        server.post("/c/a", format!("a{i}").as_bytes()).expect(200);
    }
    server.put("/c/closed", "text/plain").expect(201);
    server
        .request("POST", "/c/closed", &[("pico-closed", "true")], b"last")
        .expect(200);
    server.put("/c/trimmed", "text/plain").expect(201);
    for i in 0..6 {
        server
            .post("/c/trimmed", format!("t{i}").as_bytes())
            .expect(200);
    }
    server
        .request("POST", "/c/trimmed", &[("pico-trim-seq", "3")], b"")
        .expect(200);
    let (original, _) = read_all(&server, "/c/a", 0);

    // The procedure of docs/backup.md, "Clusters", on this one-node cluster.
    let backup = tempfile::tempdir().expect("a directory");
    pico_admin(&server, &["gc-hold", "--seconds", "600"]);
    pico_admin(&server, &["checkpoint"]);
    let dump = backup.path().join("catalog.dump");
    let dump_arg = dump.display().to_string();
    run_program(
        &bin.join("pg_dump"),
        &[
            "--format=custom",
            "--file",
            &dump_arg,
            "--dbname",
            database.url(),
        ],
    );
    let keys = database.query("SELECT key FROM segments UNION SELECT segment_key FROM quarantine");
    assert!(!keys.is_empty(), "the catalog names objects");
    for row in &keys {
        let key = row[0].as_deref().expect("a key");
        let to = backup.path().join("objects").join(key);
        std::fs::create_dir_all(to.parent().expect("a parent")).expect("create");
        std::fs::copy(bucket.path().join(key), &to).expect("copy an object");
    }
    pico_admin(&server, &["gc-release"]);
    // After the backup: /c/a goes, and the collector deletes its objects from the bucket.
    server.delete("/c/a").expect(204);
    server.kill();

    let restored_db = pico_meta::testing::PgDatabase::create("backup_cluster_restored")
        .expect("a second database");
    run_program(
        &bin.join("pg_restore"),
        &["--no-owner", "--dbname", restored_db.url(), &dump_arg],
    );
    let restored_storage = format!("-2@file://{}", backup.path().join("objects").display());
    let restored = node(restored_db.url(), &restored_storage);
    let (records, _) = read_all(&restored, "/c/a", 0);
    assert_records_eq("/c/a", &records, &original);
    assert_eq!(records.len(), 20);
    restored
        .post("/c/closed", b"more")
        .expect_error(409, "closed");
    let (trimmed, next) = read_all(&restored, "/c/trimmed", 3);
    assert_eq!((trimmed.len(), next), (3, 6));
}
