//! Idempotent-producer state is client-created, so it is bounded (docs/security.md): an id is at
//! most 256 bytes, the node keeps at most `--producers-max` producers (a stream 4,096), and a
//! producer idle for `--producer-idle-expiry-sec` is forgotten, at a restart too. Before these
//! limits 3,000 producers with 60 KB ids took a node from 58 to 487 MB, and every one came
//! back at each start.

mod common;

use common::{ds, Conn, Server};

/// A Pico append by producer `id` (epoch 0) with sequence `seq`; the status.
fn pico_append(conn: &mut Conn, stream: &str, id: &str, seq: u64) -> u16 {
    let seq = seq.to_string();
    let headers = [
        ("pico-producer-id", id),
        ("pico-producer-epoch", "0"),
        ("pico-producer-seq", seq.as_str()),
    ];
    conn.request("POST", stream, &headers, format!("{id}-{seq}").as_bytes())
        .expect("an answer")
        .status
}

#[test]
fn producer_ids_are_bounded_on_both_protocols() {
    let server = Server::start(&["--ds-listen", "127.0.0.1:0"]);
    server.put("/ids", "application/octet-stream").expect(201);
    let mut conn = server.connect();
    let longest = "p".repeat(256);
    assert_eq!(pico_append(&mut conn, "/ids", &longest, 0), 200);
    let too_long = "p".repeat(257);
    let refused = conn
        .request(
            "POST",
            "/ids",
            &[
                ("pico-producer-id", too_long.as_str()),
                ("pico-producer-epoch", "0"),
                ("pico-producer-seq", "0"),
            ],
            b"x",
        )
        .unwrap();
    refused.expect(400);
    assert!(
        refused.text().contains("256 bytes"),
        "{}",
        refused.describe()
    );

    let ds_addr = server.second.expect("the Durable Streams listener");
    ds(
        ds_addr,
        "PUT",
        "/ds-ids",
        &[("content-type", "text/plain")],
        b"",
    )
    .expect(201);
    let refused = ds(
        ds_addr,
        "POST",
        "/ds-ids",
        &[
            ("content-type", "text/plain"),
            ("producer-id", too_long.as_str()),
            ("producer-epoch", "0"),
            ("producer-seq", "0"),
        ],
        b"x",
    );
    refused.expect(400);
}

#[test]
fn the_node_keeps_at_most_its_producers_and_forgets_idle_ones_across_a_restart() {
    const NODE_MAX: u64 = 40;
    let mut server = Server::start(&[
        "--producers-max",
        &NODE_MAX.to_string(),
        "--producer-idle-expiry-sec",
        "8",
        "--segment-max-age-ms",
        "100",
    ]);
    for stream in ["/a", "/b"] {
        server.put(stream, "application/octet-stream").expect(201);
    }
    let mut conn = server.connect();
    // Half on each stream: the limit is the node's.
    for n in 0..NODE_MAX {
        let stream = if n % 2 == 0 { "/a" } else { "/b" };
        assert_eq!(pico_append(&mut conn, stream, &format!("p{n}"), 0), 200);
    }
    let refused = conn
        .request(
            "POST",
            "/a",
            &[
                ("pico-producer-id", "one-too-many"),
                ("pico-producer-epoch", "0"),
                ("pico-producer-seq", "0"),
            ],
            b"x",
        )
        .unwrap();
    refused.expect(429);
    assert!(
        refused.text().contains("this node keeps 40"),
        "{}",
        refused.describe()
    );
    // Known producers go on writing, and a retry is still answered as a duplicate.
    assert_eq!(pico_append(&mut conn, "/a", "p0", 1), 200);
    let retry = conn
        .request(
            "POST",
            "/a",
            &[
                ("pico-producer-id", "p0"),
                ("pico-producer-epoch", "0"),
                ("pico-producer-seq", "1"),
            ],
            b"p0-1",
        )
        .unwrap();
    assert!(
        retry.status == 200 || retry.status == 204,
        "{}",
        retry.describe()
    );
    let tail_before = server.head("/a").h_u64("pico-next-seq");

    // Every producer comes back after a restart (from the catalog), so the limit still holds.
    std::thread::sleep(std::time::Duration::from_millis(300));
    server.restart();
    let mut conn = server.connect();
    assert_eq!(pico_append(&mut conn, "/b", "one-too-many", 0), 429);
    assert_eq!(
        server.head("/a").h_u64("pico-next-seq"),
        tail_before,
        "nothing refused was written"
    );

    // Idle past the expiry, they are forgotten at the next start: room for new producers, and
    // a forgotten producer's old sequence is refused, never applied again.
    std::thread::sleep(std::time::Duration::from_millis(8_500));
    server.restart();
    let mut conn = server.connect();
    assert_eq!(pico_append(&mut conn, "/b", "one-too-many", 0), 200);
    assert_eq!(pico_append(&mut conn, "/a", "p2", 1), 400);
    assert_eq!(
        pico_append(&mut conn, "/a", "p2", 0),
        200,
        "it starts again at 0"
    );
}
