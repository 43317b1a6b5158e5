//! The admin listener: probes, every admin endpoint, `/metrics`, the dashboard assets, and
//! the admin side of the auth matrix.

mod common;

use common::{Conn, Resp, Server};

fn admin(server: &Server, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    Conn::connect(server.admin)
        .expect("connect to the admin listener")
        .request(method, path, headers, body)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

fn get(server: &Server, path: &str) -> Resp {
    admin(server, "GET", path, &[], b"")
}

/// The value of one sample line of a Prometheus text page.
fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn every_admin_endpoint_answers_with_the_reference_shapes() {
    let server = Server::start(&[]);
    server.put("/orders/eu", "text/plain").expect(201);
    for body in [&b"a"[..], b"bb", b"ccc"] {
        server.post("/orders/eu", body).expect(200);
    }
    server.put("/orders/us", "application/json").expect(201);
    server.put("/other", "text/plain").expect(201);

    assert_eq!(get(&server, "/health").text(), "ok");
    let ready = get(&server, "/ready");
    ready.expect(200);
    assert_eq!(ready.json()["ready"], true);

    let cluster = get(&server, "/admin/cluster");
    cluster.expect(200);
    let cluster = cluster.json();
    assert_eq!(cluster["streamCount"], 3);
    assert_eq!(cluster["nodeId"], 1);
    assert_eq!(
        cluster["advertisedAddress"],
        format!("http://{}", server.addr)
    );
    assert!(cluster["pendingTransfers"].as_array().unwrap().is_empty());

    let nodes = get(&server, "/admin/nodes").json();
    let node = &nodes["nodes"][0];
    assert_eq!(node["nodeId"], 1);
    assert_eq!(node["local"], true);
    assert_eq!(node["state"], "live");
    assert_eq!(node["live"], true);

    // A page of streams by prefix, with live offsets.
    let page = get(&server, "/admin/streams?prefix=/orders/&limit=1").json();
    assert_eq!(page["streams"].as_array().unwrap().len(), 1);
    assert_eq!(page["streams"][0]["name"], "/orders/eu");
    assert_eq!(page["streams"][0]["endOffset"], 3);
    assert_eq!(page["hasMore"], true);
    let all = get(&server, "/admin/streams?prefix=/orders/").json();
    assert_eq!(all["streams"].as_array().unwrap().len(), 2);
    assert_eq!(all["hasMore"], false);
    get(&server, "/admin/streams?limit=x").expect(400);

    let detail = get(&server, "/admin/streams/orders/us");
    detail.expect(200);
    let detail = detail.json();
    assert_eq!(detail["name"], "/orders/us");
    assert_eq!(detail["contentType"], "application/json");
    assert_eq!(detail["state"], "opened");
    assert_eq!(detail["startOffset"], 0);
    let missing = get(&server, "/admin/streams/nope");
    missing.expect(404);
    assert_eq!(missing.json()["error"], "stream /nope not found");

    // Transfers and slots: the request checks, on a single node.
    let post = |path: &str, body: &str| admin(&server, "POST", path, &[], body.as_bytes());
    assert_eq!(
        post("/admin/transfer", "{\"toNode\":2}").json()["error"],
        "missing \"stream\""
    );
    assert_eq!(
        post("/admin/transfer", "{\"stream\":\"/other\"}").json()["error"],
        "missing \"toNode\""
    );
    post("/admin/transfer", "{\"stream\":\"/nope\",\"toNode\":1}").expect(404);
    let refused = post("/admin/transfer", "{\"stream\":\"/other\",\"toNode\":2}");
    refused.expect(400);
    assert_eq!(refused.json()["error"], "node 2 is not registered");
    post("/admin/nodes/1", "{}").expect(400);
    post("/admin/nodes/7", "{\"slots\":3}").expect(404);
    let slots = post("/admin/nodes/1", "{\"slots\":5}");
    slots.expect(200);
    assert_eq!(slots.json()["slots"], 5);
    assert_eq!(get(&server, "/admin/nodes").json()["nodes"][0]["slots"], 5);

    // Stats count what happened (gauges refresh within a moment).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let stats = loop {
        let stats = get(&server, "/admin/stats").json();
        if stats["total"]["streams"] == 3 || std::time::Instant::now() > deadline {
            break stats;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(stats["total"]["recordsAppended"], 3);
    assert_eq!(stats["total"]["bytesAppended"], 6);
    assert_eq!(stats["total"]["streams"], 3);
    assert_eq!(
        stats["cores"].as_array().unwrap().len() as u64,
        cluster["cores"].as_u64().unwrap()
    );

    // The dashboard is embedded; unknown paths are JSON 404s.
    let page = get(&server, "/");
    page.expect(200);
    assert!(page.text().contains("/assets/app.js"));
    get(&server, "/assets/app.js").expect(200);
    get(&server, "/assets/style.css").expect(200);
    assert_eq!(get(&server, "/nope").json()["error"], "no such path /nope");
}

#[test]
fn metrics_count_operations_per_core_without_stream_labels() {
    let server = Server::start(&["--cores", "2"]);
    for i in 0..20 {
        let name = format!("/m/{i}");
        server.put(&name, "text/plain").expect(201);
        server.post(&name, b"12345").expect(200);
        server.get(&name).expect(200);
    }
    server.get("/m/missing").expect(404);
    let page = get(&server, "/metrics");
    page.expect(200);
    assert!(page
        .h("content-type")
        .starts_with("text/plain; version=0.0.4"));
    let text = page.text();
    let sum = |series: &str| -> f64 {
        (0..2)
            .map(|core| sample(&text, &series.replace("CORE", &core.to_string())).unwrap_or(0.0))
            .sum()
    };
    assert_eq!(sum("pico_ops_total{core=\"CORE\",op=\"append\"}"), 20.0);
    assert_eq!(sum("pico_ops_total{core=\"CORE\",op=\"create\"}"), 20.0);
    assert_eq!(sum("pico_records_appended_total{core=\"CORE\"}"), 20.0);
    assert_eq!(sum("pico_bytes_appended_total{core=\"CORE\"}"), 100.0);
    assert_eq!(sum("pico_op_errors_total{core=\"CORE\",op=\"read\"}"), 1.0);
    assert!(sum("pico_wal_fsyncs_total{core=\"CORE\"}") >= 1.0);
    assert_eq!(
        sum("pico_op_latency_seconds_count{core=\"CORE\",op=\"append\"}"),
        20.0
    );
    assert!(sum("pico_http_responses_total{core=\"CORE\",protocol=\"pico\",code=\"201\"}") >= 20.0);
    // Bounded cardinality: no series names a stream.
    assert!(!text.contains("/m/"), "no stream names in metrics");
}

/// `(files, bytes)` of the objects under a `file://` bucket's directory (a put's temporary
/// file left out).
fn objects_under(dir: &std::path::Path) -> (u64, u64) {
    let (mut files, mut bytes) = (0, 0);
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            if metadata.is_dir() {
                pending.push(entry.path());
            } else if !entry
                .file_name()
                .to_string_lossy()
                .starts_with(".pico-tmp.")
            {
                files += 1;
                bytes += metadata.len();
            }
        }
    }
    (files, bytes)
}

/// What the dashboard charts beyond the counters: the append and fsync latency histograms
/// summed over the cores, the answers by kind (a refusal of the transport itself included),
/// and the storage the node uses, which must match the files: the catalog's bucket bytes are
/// the segment objects in the `file://` bucket.
#[test]
fn stats_and_metrics_report_latency_answers_and_storage_matching_the_files() {
    let server = Server::start(&[
        "--cores",
        "2",
        "--max-body-size",
        "4KiB",
        "--segment-max-age-ms",
        "200",
    ]);
    server.put("/s", "text/plain").expect(201);
    for i in 0..10 {
        server
            .post("/s", format!("record {i}").as_bytes())
            .expect(200);
    }
    // Refused by the HTTP layer before any handler: still counted.
    server.post("/s", &[b'x'; 16 * 1024]).expect(413);
    server.get("/nope").expect(404);

    // The catalog's segments; its marker (`catalogs/`) is no segment.
    let objects = server.dir().join("objects/segments");
    let stats = common::wait_for(
        "every segment uploaded and measured",
        std::time::Duration::from_secs(30),
        || {
            let stats = get(&server, "/admin/stats").json();
            let (files, bytes) = objects_under(&objects);
            let storage = &stats["storage"];
            let measured = files > 0
                && storage["bucketSegments"] == files
                && storage["bucketBytes"] == bytes
                && storage["walBytes"].as_u64() > Some(0)
                && storage["metaBytes"].as_u64() > Some(0)
                && storage["measuredAtMs"].as_u64() > Some(0);
            measured.then_some(stats)
        },
    );

    let latency = &stats["latency"];
    let bounds = latency["boundsUs"].as_array().unwrap();
    for (name, expected_count) in [("append", Some(10)), ("fsync", None)] {
        let histogram = &latency[name];
        let buckets: Vec<u64> = histogram["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .collect();
        assert_eq!(
            buckets.len(),
            bounds.len() + 1,
            "{name}: one bucket above the bounds"
        );
        assert!(
            buckets.windows(2).all(|w| w[0] <= w[1]),
            "{name}: cumulative"
        );
        let count = histogram["count"].as_u64().unwrap();
        assert_eq!(*buckets.last().unwrap(), count, "{name}");
        match expected_count {
            Some(expected) => assert_eq!(count, expected, "{name}"),
            None => assert!(count >= 1, "{name}: the WAL synced the appends"),
        }
        assert!(histogram["sumUs"].as_u64().unwrap() > 0, "{name}");
    }

    let responses = &stats["responses"];
    assert_eq!(responses["total"], 13, "{responses}");
    assert_eq!(responses["serverErrors"], 0, "{responses}");
    assert_eq!(responses["clientErrors"], 1, "the 404: {responses}");
    assert_eq!(
        responses["refused"],
        serde_json::json!({"413": 1, "429": 0, "431": 0, "503": 0, "507": 0})
    );

    let page = get(&server, "/metrics").text();
    let storage = &stats["storage"];
    assert_eq!(
        sample(&page, "pico_bucket_bytes"),
        storage["bucketBytes"].as_f64()
    );
    assert_eq!(
        sample(&page, "pico_bucket_segments"),
        storage["bucketSegments"].as_f64()
    );
    assert!(sample(&page, "pico_disk_bytes{dir=\"wal\"}").unwrap() > 0.0);
    assert!(sample(&page, "pico_disk_bytes{dir=\"meta\"}").unwrap() > 0.0);
    let refused: f64 = (0..2)
        .filter_map(|core| {
            sample(
                &page,
                &format!(
                    "pico_http_responses_total{{core=\"{core}\",protocol=\"pico\",code=\"413\"}}"
                ),
            )
        })
        .sum();
    assert_eq!(refused, 1.0);
}

#[test]
fn the_admin_api_needs_an_admin_token_when_auth_is_on() {
    let (server, _tokens) = common::start_with_tokens("ops / admin\nwriter / read,append\n", &[]);
    let with = |token: &str| format!("Bearer {token}");

    // Probes and the page stay open; the data needs the admin grant.
    get(&server, "/health").expect(200);
    get(&server, "/ready").expect(200);
    get(&server, "/").expect(200);
    for path in [
        "/admin/cluster",
        "/metrics",
        "/admin/streams",
        "/admin/stats",
        "/admin/quarantine",
    ] {
        let anonymous = get(&server, path);
        anonymous.expect(401);
        assert_eq!(anonymous.h("www-authenticate"), "Bearer");
        admin(
            &server,
            "GET",
            path,
            &[("authorization", &with("nobody"))],
            b"",
        )
        .expect(401);
        admin(
            &server,
            "GET",
            path,
            &[("authorization", &with("writer"))],
            b"",
        )
        .expect(403);
        admin(
            &server,
            "GET",
            path,
            &[("authorization", &with("ops"))],
            b"",
        )
        .expect(200);
    }
    // Tokens never reach the log.
    assert!(!server.log().contains("writer"));
}

/// The quarantine endpoints on a node with nothing quarantined: an empty list, and clear
/// refusals for what is missing or malformed (the cluster tests fill it:
/// engine/tests/cluster_fencing.rs); `pico admin quarantine` prints them.
#[test]
fn the_quarantine_lists_exports_and_releases_with_clear_refusals() {
    let server = Server::start(&[]);
    let list = get(&server, "/admin/quarantine");
    list.expect(200);
    assert_eq!(list.json()["entries"], serde_json::json!([]));
    for (method, path, status) in [
        ("GET", "/admin/quarantine/records", 400),
        (
            "GET",
            "/admin/quarantine/records?segment=segments/x.seg&stream=x",
            400,
        ),
        (
            "GET",
            "/admin/quarantine/records?segment=segments/x.seg&stream=7",
            404,
        ),
        ("DELETE", "/admin/quarantine?segment=segments/x.seg", 400),
        (
            "DELETE",
            "/admin/quarantine?segment=segments/x.seg&stream=7",
            404,
        ),
        ("POST", "/admin/quarantine", 405),
    ] {
        let answer = admin(&server, method, path, &[], b"");
        assert_eq!(
            answer.status,
            status,
            "{method} {path}: {}",
            answer.describe()
        );
        assert!(answer.json()["error"].is_string(), "{method} {path}");
    }
    let endpoint = format!("http://{}", server.admin);
    let listed = common::pico(
        server.dir(),
        &["admin", "--admin-endpoint", &endpoint, "quarantine", "ls"],
    );
    assert!(listed.status.success(), "{listed:?}");
    assert!(listed.stdout.is_empty(), "nothing quarantined: {listed:?}");
    let missing = common::pico(
        server.dir(),
        &[
            "admin",
            "--admin-endpoint",
            &endpoint,
            "quarantine",
            "export",
            "segments/x.seg",
            "7",
        ],
    );
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("404"),
        "{missing:?}"
    );
}
