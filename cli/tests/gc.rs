//! Stored data of deleted, expired and trimmed streams leaves the object store: segments that
//! no live stream needs are deleted by the garbage collector, and what is still needed stays.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Server;

fn segment_files(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(common::segments_dir(dir))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.ends_with(".seg"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Waits (bounded) until `check` holds for the segment files.
fn wait_for(server: &Server, what: &str, check: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let files = segment_files(server.dir());
        if check(&files) {
            return files;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: segments now {files:?}\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn deleted_expired_and_trimmed_data_is_reclaimed() {
    // Segments seal after 50 ms; the collector runs every 200 ms.
    let mut server = Server::start(&[
        "--cores",
        "1",
        "--segment-max-age-ms",
        "50",
        "--gc-interval-ms",
        "200",
    ]);
    // Each stream's records land in segments of their own: write, then wait until everything
    // is sealed and stored (no new segment for well over the 50 ms seal age).
    // Three records in one append, so one seal writes them all: the stream's segment is the
    // first new file, with no guessing from a quiet spell whether a late seal is still to come.
    let write_alone = |name: &str, headers: &[(&str, &str)]| -> Vec<String> {
        let before = segment_files(server.dir());
        assert_eq!(server.request("PUT", name, headers, b"").status, 201);
        let records: Vec<_> = (0..3)
            .map(|i| serde_json::json!({ "body": format!("{name}-{i}") }))
            .collect();
        let batch = serde_json::json!({ "records": records }).to_string();
        let appended = server.request(
            "POST",
            name,
            &[("content-type", "application/vnd.picomq.batch+json")],
            batch.as_bytes(),
        );
        assert_eq!(appended.status, 200, "{}", appended.describe());
        assert_eq!(appended.h("pico-next-seq"), "3");
        let after = wait_for(&server, &format!("the segment of {name}"), |files| {
            files.iter().any(|f| !before.contains(f))
        });
        after.into_iter().filter(|f| !before.contains(f)).collect()
    };
    write_alone("/gc/deleted", &[]);
    // Alive from its create to its append: 5 s between two requests is more than a busy
    // machine takes.
    write_alone("/gc/expiring", &[("pico-ttl", "5")]);
    write_alone("/gc/trimmed", &[]);
    let kept_segments = write_alone("/gc/kept", &[]);
    assert!(!kept_segments.is_empty());

    assert_eq!(server.delete("/gc/deleted").status, 204);
    let trimmed = server.request("POST", "/gc/trimmed", &[("pico-trim-seq", "3")], b"");
    assert_eq!(trimmed.h("pico-start-seq"), "3");
    // The expiring stream is left alone: the reaper deletes it after its TTL.
    let left = wait_for(&server, "the other streams' segments collected", |files| {
        files == kept_segments.as_slice()
    });
    assert_eq!(left, kept_segments, "only the live stream's segments stay");

    // What stays is intact, and so is the trimmed stream's state.
    let kept = server.get("/gc/kept?format=raw");
    assert_eq!(kept.body, b"/gc/kept-0/gc/kept-1/gc/kept-2");
    let head = server.head("/gc/trimmed");
    assert_eq!(
        (head.h("pico-start-seq"), head.h("pico-next-seq")),
        ("3", "3")
    );
    assert_eq!(server.head("/gc/deleted").status, 404);
    assert_eq!(server.head("/gc/expiring").status, 404);

    // After a crash, offsets continue where they were, although the trimmed stream's data
    // segment is gone.
    server.restart();
    let head = server.head("/gc/trimmed");
    assert_eq!(
        (head.h("pico-start-seq"), head.h("pico-next-seq")),
        ("3", "3")
    );
    let appended = server.post("/gc/trimmed", b"after");
    assert_eq!(appended.h("pico-start-seq"), "3");
    assert_eq!(
        server.get("/gc/kept?format=raw").body,
        b"/gc/kept-0/gc/kept-1/gc/kept-2"
    );
}
