//! Upgrades keep data: a node of this build started on a data directory that an
//! earlier release wrote and left by a crash recovers every record that release acknowledged,
//! or refuses to start with a message naming both versions; never a silent misread.
//!
//! `tests/fixtures/v0.2-wal-v1` was written by commit 890fc16 (pico 0.2.0, WAL format 1:
//! frames only, no file header) and killed with SIGKILL: a SQLite catalog, two sealed segment
//! objects, and WAL files holding the rest of the streams. Its `manifest.json` is what that
//! release acknowledged, read back through it before the kill: every stream, every record
//! (offset, timestamp, headers, body), closed flags, trims, a deleted stream, producer states,
//! the Durable Streams views, a subscription and the node's signing key (kept in
//! `subscriptions.json`). `scripts/make-upgrade-fixture.sh` made both.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::{assert_records_eq, ds, ds_read, read_all, ReadRecord, Server};
use pico_engine::frame::{encode_frame, FrameMeta};
use pico_engine::wal_file::{self, file_header, WalEnd, FRAME_KIND_WAL_FILE, WAL_FORMAT_VERSION};
use serde::Deserialize;
use serde_json::{json, Value};

/// The fixture of WAL format 1, relative to this crate.
const FIXTURE_V1: &str = "tests/fixtures/v0.2-wal-v1";

/// Bytes the release of the fixture pre-allocated per WAL file (zeros past the frames; the
/// fixture keeps each file cut after its last frame).
const V1_PREALLOCATED: usize = 1_114_112;

/// How long a `pico serve` that must refuse to start may take to exit.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Deserialize)]
struct Manifest {
    written_by: String,
    wal_format: u64,
    streams: Vec<ManifestStream>,
    deleted: Vec<String>,
    producers: Vec<ManifestProducer>,
    ds: Vec<ManifestDs>,
    /// `GET /__ds/subscriptions/{id}` of each Durable Streams subscription.
    subscriptions: Vec<Value>,
    /// `GET /__ds/jwks.json`: the node's signing key.
    jwks: Value,
}

#[derive(Deserialize)]
struct ManifestStream {
    name: String,
    content_type: String,
    start_seq: u64,
    next_seq: u64,
    closed: bool,
    #[serde(default)]
    retention_bytes: Option<u64>,
    records: Vec<ManifestRecord>,
}

#[derive(Deserialize)]
struct ManifestRecord {
    seq: u64,
    timestamp: i64,
    headers: Vec<(String, String)>,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    body_b64: Option<String>,
}

#[derive(Deserialize)]
struct ManifestProducer {
    stream: String,
    protocol: String,
    id: String,
    epoch: u64,
    seq: u64,
    #[serde(default)]
    stream_seq: Option<String>,
}

#[derive(Deserialize)]
struct ManifestDs {
    name: String,
    next_offset: String,
    closed: bool,
    body: String,
}

/// What the node must serve: the manifest, plus what this test appended since.
struct Expected {
    streams: Vec<ExpectedStream>,
    deleted: Vec<String>,
    producers: Vec<ManifestProducer>,
    ds: Vec<ExpectedDs>,
    subscriptions: Vec<Value>,
    jwks: Value,
}

struct ExpectedStream {
    name: String,
    content_type: String,
    start_seq: u64,
    closed: bool,
    retention_bytes: Option<u64>,
    records: Vec<ReadRecord>,
    /// Where the stream's tail is (the manifest's `next_seq`, then one past each append).
    next_seq: u64,
}

struct ExpectedDs {
    name: String,
    closed: bool,
    /// The catch-up read's body: a JSON array (JSON streams) or the bodies back to back.
    body: DsBody,
}

enum DsBody {
    Json(Vec<Value>),
    Text(String),
}

impl Expected {
    fn from_manifest(manifest: Manifest) -> Expected {
        let streams = manifest
            .streams
            .into_iter()
            .map(|s| {
                let records: Vec<ReadRecord> = s.records.into_iter().map(read_record).collect();
                assert_eq!(
                    records.iter().map(|r| r.seq).collect::<Vec<_>>(),
                    (s.start_seq..s.next_seq).collect::<Vec<_>>(),
                    "manifest: {} lists every offset from its start to its tail",
                    s.name
                );
                ExpectedStream {
                    name: s.name,
                    content_type: s.content_type,
                    start_seq: s.start_seq,
                    closed: s.closed,
                    retention_bytes: s.retention_bytes,
                    records,
                    next_seq: s.next_seq,
                }
            })
            .collect::<Vec<_>>();
        let ds = manifest
            .ds
            .into_iter()
            .map(|d| {
                let stream = streams
                    .iter()
                    .find(|s| s.name == d.name)
                    .expect("a Durable Streams stream of the manifest is one of its streams");
                assert_eq!(d.next_offset, ds_offset(stream.next_seq), "{}", d.name);
                let body = if stream.content_type.starts_with("application/json") {
                    match serde_json::from_str(&d.body).expect("a JSON stream's body") {
                        Value::Array(items) => DsBody::Json(items),
                        other => panic!("{}: not a JSON array: {other}", d.name),
                    }
                } else {
                    DsBody::Text(d.body)
                };
                ExpectedDs {
                    name: d.name,
                    closed: d.closed,
                    body,
                }
            })
            .collect();
        Expected {
            streams,
            deleted: manifest.deleted,
            producers: manifest.producers,
            ds,
            subscriptions: manifest.subscriptions,
            jwks: manifest.jwks,
        }
    }

    fn stream(&mut self, name: &str) -> &mut ExpectedStream {
        self.streams
            .iter_mut()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("{name} is in the manifest"))
    }
}

fn read_record(r: ManifestRecord) -> ReadRecord {
    let body = match (r.body, r.body_b64) {
        (Some(text), None) => text.into_bytes(),
        (None, Some(b64)) => base64_decode(&b64),
        other => panic!("record {}: body or body_b64, not {other:?}", r.seq),
    };
    ReadRecord {
        seq: r.seq,
        timestamp: r.timestamp,
        headers: r.headers,
        body,
    }
}

/// Standard base64 with padding (the manifest's `body_b64`).
fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut bits, mut count) = (0u32, 0);
    for c in text.bytes().filter(|c| *c != b'=') {
        let value = ALPHABET
            .iter()
            .position(|a| *a == c)
            .unwrap_or_else(|| panic!("not base64: {text}"));
        bits = bits << 6 | value as u32;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    out
}

/// A Durable Streams offset: before record `seq`.
fn ds_offset(seq: u64) -> String {
    format!("{seq:016}_{:016}", 0)
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(name)
}

fn load_manifest(fixture: &Path) -> Manifest {
    let text = std::fs::read_to_string(fixture.join("manifest.json")).expect("manifest.json");
    let manifest: Manifest = serde_json::from_str(&text).expect("manifest.json parses");
    assert_eq!(manifest.wal_format, 1, "{}", manifest.written_by);
    manifest
}

/// Copies a directory tree (files and directories only).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy's directory");
    for entry in std::fs::read_dir(from).expect("list the fixture") {
        let entry = entry.expect("a fixture entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a fixture file");
        }
    }
}

/// `pico serve` flags for a data directory laid out as the fixture's. Segments seal only at
/// 64 KiB, so what this test appends stays in WAL files (of this build's format) across its
/// restarts.
fn serve_args(dir: &Path, cores: u32) -> Vec<String> {
    vec![
        "--meta-url".into(),
        format!("sqlite:{}", dir.join("data/meta.db").display()),
        "--storage".into(),
        format!("-2@file://{}", dir.join("objects").display()),
        "--wal-dir".into(),
        dir.join("data/wal").display().to_string(),
        "--durability".into(),
        "local".into(),
        "--cores".into(),
        cores.to_string(),
        "--segment-size".into(),
        "64KiB".into(),
        "--segment-max-age-ms".into(),
        "600000".into(),
        "--ds-listen".into(),
        "127.0.0.1:0".into(),
    ]
}

/// Everything the node serves matches `want`: listing, `HEAD`, every record through the Pico
/// protocol, trims, deletions, and the Durable Streams catch-up reads.
fn check(server: &Server, want: &Expected, context: &str) {
    let listing = server.get("/?prefix=/");
    listing.expect(200);
    let listing = listing.json();
    assert_eq!(listing["has_more"], false, "{context}");
    let listed: Vec<&Value> = listing["streams"]
        .as_array()
        .expect("streams")
        .iter()
        .collect();
    let mut names: Vec<&str> = want.streams.iter().map(|s| s.name.as_str()).collect();
    names.sort();
    assert_eq!(
        listed
            .iter()
            .map(|s| s["name"].as_str().expect("name"))
            .collect::<Vec<_>>(),
        names,
        "{context}: the listing"
    );
    for stream in &want.streams {
        let what = format!("{context}: {}", stream.name);
        let entry = listed
            .iter()
            .find(|s| s["name"] == stream.name.as_str())
            .expect("listed");
        assert_eq!(entry["start_seq"], stream.start_seq, "{what}: listed start");
        assert_eq!(entry["next_seq"], stream.next_seq, "{what}: listed tail");
        assert_eq!(entry["closed"], stream.closed, "{what}: listed closed");

        let head = server.head(&stream.name);
        head.expect(200);
        assert_eq!(head.h("content-type"), stream.content_type, "{what}");
        assert_eq!(
            head.h_u64("pico-start-seq"),
            stream.start_seq,
            "{what}: start"
        );
        assert_eq!(head.h_u64("pico-next-seq"), stream.next_seq, "{what}: tail");
        assert_eq!(
            head.header("pico-closed") == Some("true"),
            stream.closed,
            "{what}: closed"
        );
        assert_eq!(
            head.header("pico-retention-bytes")
                .map(|v| v.parse::<u64>().expect("retention bytes")),
            stream.retention_bytes,
            "{what}: retention"
        );

        let (records, next) = read_all(server, &stream.name, stream.start_seq);
        assert_eq!(next, stream.next_seq, "{what}: read to the tail");
        assert_records_eq(&what, &records, &stream.records);
        if stream.start_seq > 0 {
            server
                .get(&format!("{}?seq={}", stream.name, stream.start_seq - 1))
                .expect_error(410, "offset_gone");
        }
    }
    for name in &want.deleted {
        server.head(name).expect(404);
        server
            .get(&format!("{name}?seq=0"))
            .expect_error(404, "not_found");
    }
    let second = server.second.expect("the Durable Streams listener");
    for stream in &want.ds {
        let what = format!("{context}: {} (Durable Streams)", stream.name);
        let next = want
            .streams
            .iter()
            .find(|s| s.name == stream.name)
            .expect("a stream")
            .next_seq;
        let read = ds_read(second, &stream.name, "-1");
        read.expect(200);
        assert_eq!(read.h("stream-next-offset"), ds_offset(next), "{what}");
        assert_eq!(
            read.header("stream-closed") == Some("true"),
            stream.closed,
            "{what}: closed"
        );
        match &stream.body {
            DsBody::Json(items) => {
                assert_eq!(read.json(), Value::Array(items.clone()), "{what}")
            }
            DsBody::Text(text) => assert_eq!(&read.text(), text, "{what}"),
        }
    }
    let jwks = ds(second, "GET", "/__ds/jwks.json", &[], b"");
    jwks.expect(200);
    assert_eq!(jwks.json(), want.jwks, "{context}: the same signing key");
    for subscription in &want.subscriptions {
        let id = subscription["id"].as_str().expect("an id");
        let got = ds(
            second,
            "GET",
            &format!("/__ds/subscriptions/{id}"),
            &[],
            b"",
        );
        got.expect(200);
        let got = got.json();
        let jwks_url = &got["webhook"]["signing"]["jwks_url"];
        assert!(
            jwks_url
                .as_str()
                .is_some_and(|u| u.ends_with("/__ds/jwks.json")),
            "{context}: {got}"
        );
        // The JWKS URL is built from the request's Host, which differs from run to run.
        let mut want = subscription.clone();
        want["webhook"]["signing"]["jwks_url"] = jwks_url.clone();
        assert_eq!(got, want, "{context}: subscription {id}");
    }
}

/// Producer headers of the Pico protocol.
fn pico_producer<'a>(id: &'a str, epoch: &'a str, seq: &'a str) -> [(&'a str, &'a str); 3] {
    [
        ("pico-producer-id", id),
        ("pico-producer-epoch", epoch),
        ("pico-producer-seq", seq),
    ]
}

/// Every producer's last acknowledged request is known: its retry is a duplicate (nothing
/// written), the sequence after the next one is a gap, an older epoch is fenced; a Durable
/// Streams producer's last Stream-Seq is known too. Appends to closed streams are refused.
fn check_producers(server: &Server, want: &Expected, context: &str) {
    let second = server.second.expect("the Durable Streams listener");
    for producer in &want.producers {
        let what = format!(
            "{context}: producer {} (epoch {}, seq {}) of {}",
            producer.id, producer.epoch, producer.seq, producer.stream
        );
        let next = want
            .streams
            .iter()
            .find(|s| s.name == producer.stream)
            .expect("a stream")
            .next_seq;
        let (epoch, seq) = (producer.epoch.to_string(), producer.seq.to_string());
        match producer.protocol.as_str() {
            "pico" => {
                let retry = server.request(
                    "POST",
                    &producer.stream,
                    &pico_producer(&producer.id, &epoch, &seq),
                    b"a retry",
                );
                retry.expect(200);
                assert_eq!(retry.header("pico-start-seq"), None, "{what}: a duplicate");
                assert_eq!(
                    retry.h_u64("pico-next-seq"),
                    next,
                    "{what}: nothing written"
                );
                assert_eq!(retry.h("pico-producer-epoch"), epoch, "{what}");
                assert_eq!(retry.h("pico-producer-seq"), seq, "{what}");
                let skipped = server.request(
                    "POST",
                    &producer.stream,
                    &pico_producer(&producer.id, &epoch, &(producer.seq + 2).to_string()),
                    b"a gap",
                );
                skipped.expect_error(409, "sequence_gap");
                assert_eq!(
                    skipped.h_u64("pico-expected-seq"),
                    producer.seq + 1,
                    "{what}"
                );
                if producer.epoch > 0 {
                    let older = (producer.epoch - 1).to_string();
                    server
                        .request(
                            "POST",
                            &producer.stream,
                            &pico_producer(&producer.id, &older, "0"),
                            b"an older epoch",
                        )
                        .expect_error(403, "fenced");
                }
            }
            "ds" => {
                let stream_seq = producer.stream_seq.as_deref().expect("its Stream-Seq");
                let retry = ds_produce(second, producer, producer.seq, stream_seq, b"{}");
                retry.expect(204);
                assert_eq!(retry.h("producer-seq"), seq, "{what}: a duplicate");
                assert_eq!(retry.h("stream-next-offset"), ds_offset(next), "{what}");
                let skipped = ds_produce(second, producer, producer.seq + 2, "zzz", b"{}");
                skipped.expect(409);
                assert_eq!(
                    skipped.h_u64("producer-expected-seq"),
                    producer.seq + 1,
                    "{what}"
                );
                // The last Stream-Seq is known too: the same one again does not sort after it.
                ds(
                    second,
                    "POST",
                    &producer.stream,
                    &[
                        ("content-type", "application/json"),
                        ("stream-seq", stream_seq),
                    ],
                    b"{}",
                )
                .expect(409);
            }
            other => panic!("{what}: protocol {other}"),
        }
    }
    for stream in want.streams.iter().filter(|s| s.closed) {
        let refused = server.post(&stream.name, b"after the close");
        let body = refused.expect_error(409, "closed");
        assert_eq!(
            body["next_seq"], stream.next_seq,
            "{context}: {}",
            stream.name
        );
    }
}

/// The record at `seq` of `name`, read back (its timestamp is the server's).
fn record_at(server: &Server, name: &str, seq: u64) -> ReadRecord {
    let read = server.get(&format!("{name}?seq={seq}&count=1&format=binary"));
    read.expect(200);
    let mut records = common::decode_binary_read(&read.body);
    assert_eq!(records.len(), 1, "{name} at {seq}");
    records.remove(0)
}

/// An acknowledged append of [`append_round`], to read back.
struct Appended {
    stream: String,
    seq: u64,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// A Durable Streams append of a producer, with a Stream-Seq.
fn ds_produce(
    addr: std::net::SocketAddr,
    producer: &ManifestProducer,
    seq: u64,
    stream_seq: &str,
    body: &[u8],
) -> common::Resp {
    let (epoch, seq) = (producer.epoch.to_string(), seq.to_string());
    let headers = [
        ("content-type", "application/json"),
        ("producer-id", producer.id.as_str()),
        ("producer-epoch", epoch.as_str()),
        ("producer-seq", seq.as_str()),
        ("stream-seq", stream_seq),
    ];
    ds(addr, "POST", &producer.stream, &headers, body)
}

/// Appends one record to every open stream (each producer's next sequence, the Durable
/// Streams producer with a new Stream-Seq), each at its stream's tail and read back there with
/// its body and headers and a later timestamp than the record before it; adds them to `want`.
fn append_round(server: &Server, want: &mut Expected, round: u64) {
    let second = server.second.expect("the Durable Streams listener");
    let mut appended: Vec<Appended> = Vec::new();
    for i in 0..want.producers.len() {
        let producer = &want.producers[i];
        let stream = producer.stream.clone();
        let next = want
            .streams
            .iter()
            .find(|s| s.name == stream)
            .expect("a stream")
            .next_seq;
        let seq = producer.seq + 1;
        let body = json!({"round": round, "producer": producer.id, "seq": seq}).to_string();
        match &producer.stream_seq {
            None => {
                let (epoch, seq_text) = (producer.epoch.to_string(), seq.to_string());
                let mut headers = pico_producer(&producer.id, &epoch, &seq_text).to_vec();
                headers.push(("content-type", "text/plain"));
                let r = server.request("POST", &stream, &headers, body.as_bytes());
                r.expect(200);
                assert_eq!(r.h_u64("pico-start-seq"), next, "{stream}: {body}");
            }
            Some(_) => {
                let stream_seq = format!("r{round:03}");
                let r = ds_produce(second, producer, seq, &stream_seq, body.as_bytes());
                r.expect(200);
                assert_eq!(r.h("stream-next-offset"), ds_offset(next + 1), "{stream}");
                want.producers[i].stream_seq = Some(stream_seq);
            }
        }
        want.producers[i].seq = seq;
        want.stream(&stream).next_seq = next + 1;
        appended.push(Appended {
            stream,
            seq: next,
            headers: Vec::new(),
            body: body.into_bytes(),
        });
    }
    let plain: Vec<(String, String)> = want
        .streams
        .iter()
        .filter(|s| !s.closed && !want.producers.iter().any(|p| p.stream == s.name))
        .map(|s| (s.name.clone(), s.content_type.clone()))
        .collect();
    for (stream, content_type) in plain {
        let next = want.stream(&stream).next_seq;
        let body = json!({"round": round, "stream": stream}).to_string();
        let mut headers = Vec::new();
        if want.ds.iter().any(|d| d.name == stream) {
            let r = ds(
                second,
                "POST",
                &stream,
                &[("content-type", &content_type)],
                body.as_bytes(),
            );
            r.expect(204);
            assert_eq!(r.h("stream-next-offset"), ds_offset(next + 1), "{stream}");
        } else {
            headers.push(("round".to_string(), round.to_string()));
            let batch =
                json!({"records": [{"headers": {"round": round.to_string()}, "body": body}]});
            let r = server.request(
                "POST",
                &stream,
                &[("content-type", "application/vnd.picomq.batch+json")],
                batch.to_string().as_bytes(),
            );
            r.expect(200);
            assert_eq!(r.h_u64("pico-start-seq"), next, "{stream}: round {round}");
        }
        want.stream(&stream).next_seq = next + 1;
        appended.push(Appended {
            stream,
            seq: next,
            headers,
            body: body.into_bytes(),
        });
    }
    for Appended {
        stream,
        seq,
        headers,
        body,
    } in appended
    {
        let got = record_at(server, &stream, seq);
        assert_eq!(
            (&got.headers, &got.body),
            (&headers, &body),
            "{stream} at {seq}"
        );
        let before = want
            .stream(&stream)
            .records
            .last()
            .map_or(i64::MIN, |r| r.timestamp);
        assert!(
            got.timestamp > before,
            "{stream}: the append at {seq} has timestamp {} after {before}",
            got.timestamp
        );
        if let Some(ds) = want.ds.iter_mut().find(|d| d.name == stream) {
            if let DsBody::Json(items) = &mut ds.body {
                items.push(serde_json::from_slice(&body).expect("JSON"));
            }
        }
        want.stream(&stream).records.push(got);
    }
}

/// A copy of the fixture in a temporary directory, and what it holds.
fn fixture_copy() -> (tempfile::TempDir, Expected) {
    let fixture = fixture(FIXTURE_V1);
    let want = Expected::from_manifest(load_manifest(&fixture));
    let copy = tempfile::Builder::new()
        .prefix("pico-upgrade-")
        .tempdir()
        .expect("a temporary directory");
    copy_tree(&fixture, copy.path());
    (copy, want)
}

fn start(dir: &Path, cores: u32) -> Server {
    let args = serve_args(dir, cores);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(&args)
}

#[test]
fn a_data_directory_of_wal_format_1_is_recovered_whole() {
    let (copy, mut want) = fixture_copy();
    // As many cores as the release that wrote it ran.
    let mut server = start(copy.path(), 2);

    check(&server, &want, "first start on the format-1 directory");
    check_producers(&server, &want, "first start");
    append_round(&server, &mut want, 1);
    check(&server, &want, "after appends");

    server.restart();
    check(&server, &want, "after kill -9 and a restart");
    check_producers(&server, &want, "after a restart");
    append_round(&server, &mut want, 2);
    check(&server, &want, "after the second appends");
    assert!(server.is_running(), "log:\n{}", server.log());

    // Once more after kill -9, on one core: WAL files of both cores are read by one.
    server.kill();
    let server = start(copy.path(), 1);
    check(&server, &want, "on one core");
    check_producers(&server, &want, "on one core");
}

/// The fixture as the release left it on disk: WAL files pre-allocated (zeros past their
/// frames), and the WAL file of a segment that was stored and committed before the crash
/// (which came before the file's removal) still there.
#[test]
fn a_format_1_directory_as_left_on_disk_is_recovered_whole() {
    let (copy, want) = fixture_copy();
    let wal_dir = copy.path().join("data/wal");
    for entry in std::fs::read_dir(&wal_dir).expect("the WAL directory") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "wal") {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .expect("open a WAL file");
            file.set_len(V1_PREALLOCATED as u64)
                .expect("pad the WAL file");
        }
    }
    // Format 1 wrote a segment's frames to its WAL file exactly as the object holds them.
    let mut sealed: Vec<PathBuf> = std::fs::read_dir(copy.path().join("objects/segments"))
        .expect("the segment objects")
        .map(|e| e.expect("an entry").path())
        .collect();
    sealed.sort();
    let first = sealed.first().expect("a sealed segment");
    let mut leftover = std::fs::read(first).expect("a segment object");
    leftover.resize(V1_PREALLOCATED, 0);
    let stem = first.file_stem().expect("a name").to_str().expect("UTF-8");
    std::fs::write(wal_dir.join(format!("{stem}.wal")), leftover).expect("the leftover");

    let server = start(copy.path(), 2);
    check(&server, &want, "the directory as left on disk");
    check_producers(&server, &want, "the directory as left on disk");
}

#[test]
fn the_fixture_wal_files_read_as_format_1_to_their_last_frame() {
    let wal_dir = fixture(FIXTURE_V1).join("data/wal");
    let mut frames = 0;
    for entry in std::fs::read_dir(&wal_dir).expect("the fixture's WAL directory") {
        let path = entry.expect("an entry").path();
        if path.extension().is_none_or(|e| e != "wal") {
            continue;
        }
        let data = std::fs::read(&path).expect("a WAL file");
        let scanned = wal_file::scan(&data).expect("format 1 is read");
        let what = path.display();
        assert_eq!(scanned.version, 1, "{what}");
        assert_eq!(scanned.end, WalEnd::Clean, "{what}");
        assert_eq!(
            scanned.committed_end,
            data.len(),
            "{what}: every frame kept"
        );
        // As the release left it on disk: pre-allocated, zeros past the frames.
        let mut padded = data.clone();
        padded.resize(V1_PREALLOCATED, 0);
        assert_eq!(wal_file::scan(&padded), Ok(scanned.clone()), "{what}");
        frames += scanned.committed.len();
    }
    assert!(frames > 0, "the fixture keeps records in its WAL files");
}

/// A WAL file header of format `version`, built as this build builds its own.
fn header_of_version(version: u64, created_ms: i64) -> Vec<u8> {
    let mut out = Vec::new();
    let meta = FrameMeta {
        kind: FRAME_KIND_WAL_FILE,
        stream_id: version,
        offset: 0,
        timestamp_ms: created_ms,
        request_end: false,
        producer: None,
        writer_seq: None,
    };
    encode_frame(&mut out, meta, &[], &[]);
    out
}

#[test]
fn a_wal_file_of_a_newer_format_is_refused_naming_both_versions() {
    let created_ms = 1_796_428_189_475;
    assert_eq!(
        header_of_version(WAL_FORMAT_VERSION, created_ms),
        file_header(WAL_FORMAT_VERSION, created_ms),
        "the header is built as the engine builds one"
    );
    let future = 9;
    assert_ne!(
        future, WAL_FORMAT_VERSION,
        "a version this build does not write"
    );
    let dir = tempfile::Builder::new()
        .prefix("pico-upgrade-")
        .tempdir()
        .expect("a temporary directory");
    let wal_dir = dir.path().join("data/wal");
    std::fs::create_dir_all(&wal_dir).expect("the WAL directory");
    let mut bytes = header_of_version(future, created_ms);
    bytes.resize(64 << 10, 0);
    let wal = wal_dir.join("0001796428189475-000-0000000000.wal");
    std::fs::write(&wal, &bytes).expect("write the WAL file");

    let log = dir.path().join("server.log");
    let mut child = common::cli::pico_without_pico_env()
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(serve_args(dir.path(), 1))
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("server.log"))
        .spawn()
        .expect("spawn pico serve");
    let Some(status) = common::exit_within(&mut child, REFUSAL_TIMEOUT) else {
        panic!(
            "pico serve started on a WAL file of format {future}; log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    };
    let text = std::fs::read_to_string(&log).expect("server.log");
    assert!(!status.success(), "exit {status:?}; log:\n{text}");
    assert!(
        text.contains(&format!("version {future}"))
            && text.contains(&format!("versions 1 and {WAL_FORMAT_VERSION}")),
        "the refusal names both versions; log:\n{text}"
    );
    assert_eq!(
        std::fs::read(&wal).expect("the WAL file is still there"),
        bytes,
        "the refused file is left as it was"
    );
}
