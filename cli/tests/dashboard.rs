//! The dashboard in a real browser: headless Chromium loads the page from a running node, the
//! page's script polls the admin API, and the rendered DOM must show what the API reports.
//! Also writes a screenshot to `target/dashboard.png` (with `PICOMQ_UPDATE_DOCS_SCREENSHOT=1`,
//! to `docs/dashboard.png` as well, the README's picture).
//!
//! No WebDriver: `chromium --dump-dom` under `--virtual-time-budget`, which runs the page's
//! timers on a virtual clock that only advances while no request is pending, so the number of
//! polls before the dump does not depend on the machine's speed; the screenshot is taken in
//! real time (see `frame_page`). `#[ignore]`d (`--include-ignored` runs them); skipped with a note
//! when Chromium is not installed, a failure under `CI=true` (`.ci/run` installs it).

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Conn, Server};
use serde_json::Value;

/// How long one Chromium run may take (start-up on a loaded CI machine included).
const BROWSER_TIMEOUT: Duration = Duration::from_secs(90);
/// Attempts at a dump that shows the expected state, in case a run dies or misbehaves.
const ATTEMPTS: usize = 3;
/// How long the dashboard runs, in real time, before the screenshot.
const SCREENSHOT_AFTER: Duration = Duration::from_secs(10);
/// Connections appending (and reading) while the screenshot is taken.
const LOAD_CONNECTIONS: u64 = 4;
/// `--max-body-size` of the nodes whose load includes refused appends, and such an append.
const OVERSIZED_LIMIT: &str = "16KiB";
const OVERSIZED_BYTES: usize = 20 * 1024;

/// `chromium` (Debian) or `chromium-browser` from `PATH`.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser"].map(|name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

macro_rules! chromium_or_skip {
    () => {
        match chromium() {
            Some(binary) => binary,
            None => {
                pico_testkit::missing_service(
                    "dashboard",
                    "needs `chromium` on PATH (apt-get install chromium)",
                );
                return;
            }
        }
    };
}

/// Runs Chromium headless on `url` with `extra` flags, in a fresh profile directory; its
/// stdout and stderr. Panics (with Chromium's stderr) if it does not finish in time.
fn run_chromium(binary: &Path, url: &str, extra: &[String]) -> (String, String) {
    let dir = tempfile::Builder::new()
        .prefix("pico-chromium-")
        .tempdir()
        .expect("create a profile directory");
    let stdout_path = dir.path().join("stdout");
    let stderr_path = dir.path().join("stderr");
    let mut child = Command::new(binary)
        .args([
            "--headless=new",
            // Tests run as root in CI, where the sandbox cannot start.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-extensions",
            "--disable-background-networking",
            "--hide-scrollbars",
        ])
        .arg(format!(
            "--user-data-dir={}",
            dir.path().join("profile").display()
        ))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).expect("create stdout file"))
        .stderr(std::fs::File::create(&stderr_path).expect("create stderr file"))
        .spawn()
        .expect("start chromium");
    let deadline = Instant::now() + BROWSER_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium did not finish within {BROWSER_TIMEOUT:?}; stderr:\n{}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = std::fs::read_to_string(&stdout_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    assert!(
        status.success(),
        "chromium failed ({status}); stderr:\n{stderr}"
    );
    (stdout, stderr)
}

/// The DOM after the page's script ran for a few seconds of virtual time; retried until
/// `done` accepts it.
fn dump_dom(binary: &Path, server: &Server, url: &str, done: impl Fn(&str) -> bool) -> String {
    let flags = [
        "--virtual-time-budget=5000".to_string(),
        "--dump-dom".into(),
    ];
    let (mut dom, mut stderr) = (String::new(), String::new());
    for _ in 0..ATTEMPTS {
        (dom, stderr) = run_chromium(binary, url, &flags);
        if done(&dom) {
            return dom;
        }
    }
    panic!(
        "the dashboard never reached the expected state; last DOM:\n{dom}\n\
         chromium's stderr:\n{stderr}\nserver log:\n{}",
        server.log()
    );
}

fn loaded(dom: &str) -> bool {
    dom.contains("data-loaded=\"true\"")
}

// ---- A little DOM reading: Chromium serializes the page the same way every time. ----

/// The start tag of the element with this id, e.g. `<span id="ready" class="pill ok">`.
fn start_tag<'d>(dom: &'d str, id: &str) -> &'d str {
    let at = dom
        .find(&format!(" id=\"{id}\""))
        .unwrap_or_else(|| panic!("no element #{id} in the DOM:\n{dom}"));
    let open = dom[..at].rfind('<').expect("a start tag");
    let close = at + dom[at..].find('>').expect("the end of a start tag");
    &dom[open..=close]
}

fn attr(tag: &str, name: &str) -> Option<String> {
    let marker = format!(" {name}=\"");
    let from = tag.find(&marker)? + marker.len();
    let len = tag[from..].find('"')?;
    Some(unescape(&tag[from..from + len]))
}

/// The text of an element that holds only text.
fn text(dom: &str, id: &str) -> String {
    let tag = start_tag(dom, id);
    let from = dom.find(tag).expect("the tag is in the DOM") + tag.len();
    let len = dom[from..].find('<').expect("an end tag");
    unescape(&dom[from..from + len])
}

fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}

/// The body rows of a table: each row's start tag and cell texts.
fn rows(dom: &str, table_id: &str) -> Vec<(String, Vec<String>)> {
    let tag = start_tag(dom, table_id);
    let table = &dom[dom.find(tag).unwrap()..];
    let table = &table[..table.find("</table>").expect("the end of the table")];
    let body = &table[table.find("<tbody>").expect("a tbody")..];
    body.split("<tr")
        .skip(1)
        .map(|row| {
            let tag = format!("<tr{}", &row[..=row.find('>').unwrap()]);
            let cells = row
                .split("<td>")
                .skip(1)
                .map(|cell| unescape(&cell[..cell.find("</td>").expect("a cell end")]))
                .collect();
            (tag, cells)
        })
        .collect()
}

/// The start tag of the line of `series` (its `data-series`) in the chart `chart_id`, once
/// the chart is drawn.
fn series_tag<'d>(dom: &'d str, chart_id: &str, series: &str) -> Option<&'d str> {
    let chart = chart_markup(dom, chart_id);
    let at = chart.find(&format!(" data-series=\"{series}\""))?;
    let open = chart[..at].rfind('<')?;
    let close = at + chart[at..].find('>')?;
    Some(&chart[open..=close])
}

/// The markup of the `<svg>` chart with this id.
fn chart_markup<'d>(dom: &'d str, chart_id: &str) -> &'d str {
    let tag = start_tag(dom, chart_id);
    let from = dom.find(tag).expect("the tag is in the DOM");
    let len = dom[from..].find("</svg>").expect("the end of the chart");
    &dom[from..from + len]
}

/// A drawn series' number of points and largest value (`data-points`, `data-max`); `(0, 0)`
/// before the chart is drawn.
fn series_points(dom: &str, chart_id: &str, series: &str) -> (u64, f64) {
    let Some(tag) = series_tag(dom, chart_id, series) else {
        return (0, 0.0);
    };
    let number = |name: &str| attr(tag, name).unwrap_or_else(|| panic!("{name} in {tag}"));
    (
        number("data-points").parse().expect("a point count"),
        number("data-max").parse().expect("a value"),
    )
}

/// The labels of a chart's time axis.
fn time_labels(dom: &str, chart_id: &str) -> Vec<String> {
    chart_markup(dom, chart_id)
        .split("<text class=\"time\"")
        .skip(1)
        .map(|label| {
            let from = label.find('>').expect("the end of a start tag") + 1;
            let len = label[from..].find('<').expect("an end tag");
            unescape(&label[from..from + len])
        })
        .collect()
}

/// `HH:MM:SS`, the page's clock format.
fn is_clock_time(label: &str) -> bool {
    let parts: Vec<&str> = label.split(':').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_digit()))
        && parts[0] < "24"
        && parts[1] < "60"
        && parts[2] < "60"
}

// ---- The page's number formats (app.js), to compare with the API's numbers. ----

/// `Number.toLocaleString("en-US")` of an integer: thousands separated by commas.
fn fmt_int(value: &Value) -> String {
    let digits = value
        .as_u64()
        .unwrap_or_else(|| panic!("not a count: {value}"))
        .to_string();
    let mut groups = Vec::new();
    let mut end = digits.len();
    while end > 3 {
        groups.push(&digits[end - 3..end]);
        end -= 3;
    }
    groups.push(&digits[..end]);
    groups.reverse();
    groups.join(",")
}

/// `fmtBytes`: bytes as they are below 1 KiB, else one decimal in the largest unit.
fn fmt_bytes(value: &Value) -> String {
    let mut n = value.as_f64().expect("a byte count");
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut i = 0;
    while n >= 1024.0 && i < units.len() - 1 {
        n /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} {}", units[i])
    } else {
        format!("{n:.1} {}", units[i])
    }
}

fn api(server: &Server, path: &str) -> Value {
    let response = Conn::connect(server.admin)
        .and_then(|mut conn| conn.request("GET", path, &[], b""))
        .unwrap_or_else(|e| panic!("GET {path}: {e}; server log:\n{}", server.log()));
    response.expect(200);
    response.json()
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the cli crate is in the workspace")
        .to_path_buf()
}

#[ignore = "needs Chromium: apt-get install chromium"]
#[test]
fn the_dashboard_shows_what_the_admin_api_reports() {
    let browser = chromium_or_skip!();
    // Two cores, so the cores table has rows to tell apart; no age-based seals, so the
    // segment count holds still between the API call and the page's.
    let server = Server::start(&[
        "--cores",
        "2",
        "--segment-max-age-ms",
        "600000",
        "--max-body-size",
        OVERSIZED_LIMIT,
    ]);
    let streams: [(&str, &str, &[&str]); 4] = [
        (
            "/orders/eu",
            "text/plain",
            &["a", "bb", "ccc", "dddd", "eeeee"],
        ),
        (
            "/orders/us",
            "application/json",
            &["{\"n\":1}", "{\"n\":2}"],
        ),
        ("/logs/app", "text/plain", &["started", "ok", "stopping"]),
        ("/empty", "application/octet-stream", &[]),
    ];
    for (name, content_type, records) in streams {
        server.put(name, content_type).expect(201);
        for record in records {
            server.post(name, record.as_bytes()).expect(200);
        }
    }
    server.get("/orders/eu").expect(200);
    server.get("/logs/app").expect(200);
    // A named consumer of /orders/eu that processed two of its five records: lag 3.
    let consumer = |method: &str, query: &str, token: Option<&str>, body: &str| {
        common::json_request(
            server.addr,
            method,
            &format!("/?{query}"),
            token,
            body.as_bytes(),
        )
    };
    consumer(
        "PUT",
        "consumer=/billing",
        None,
        r#"{"streams":["/orders/eu"]}"#,
    )
    .expect(201);
    let acquired = consumer("POST", "consumer=/billing&action=acquire", None, "");
    acquired.expect(200);
    let token = acquired.json()["token"].as_str().unwrap().to_string();
    consumer(
        "POST",
        "consumer=/billing&action=ack",
        Some(&token),
        r#"{"offsets":[{"stream":"/orders/eu","offset":1}]}"#,
    )
    .expect(200);
    // The per-core gauges refresh within a moment; wait until they have.
    let stats = common::wait_for("the stream gauges", Duration::from_secs(10), || {
        let stats = api(&server, "/admin/stats");
        (stats["total"]["streams"] == 4 && stats["total"]["reads"] == 2).then_some(stats)
    });
    assert_eq!(stats["total"]["recordsAppended"], 10);
    let cluster = api(&server, "/admin/cluster");
    let listing = api(&server, "/admin/streams?limit=100");

    let url = format!("http://{}/?interval=200", server.admin);
    let dom = dump_dom(&browser, &server, &url, loaded);

    // Nothing moved while the page looked: the API answers the same afterwards. Except two
    // live gauges: open connections (the browser has exited, but when the node sees its
    // sockets close depends on how busy the machine is) and memory (a core lets its idle
    // buffers go 10 s after its last commit round, which this test can outlast).
    let without_live_gauges = |stats: &Value| {
        let mut total = stats["total"].clone();
        let total_fields = total.as_object_mut().expect("total is an object");
        total_fields.remove("connections");
        total_fields.remove("memoryBytes");
        total
    };
    let after = api(&server, "/admin/stats");
    assert_eq!(
        without_live_gauges(&after),
        without_live_gauges(&stats),
        "counters moved during the test"
    );
    assert_eq!(api(&server, "/admin/streams?limit=100"), listing);

    // Readiness and identity.
    assert_eq!(text(&dom, "ready"), "ready");
    assert_eq!(
        attr(start_tag(&dom, "ready"), "class").as_deref(),
        Some("pill ok")
    );
    assert_eq!(text(&dom, "node-id"), format!("node {}", cluster["nodeId"]));
    assert_eq!(
        text(&dom, "cluster-id"),
        cluster["clusterId"].as_str().unwrap()
    );
    assert_eq!(text(&dom, "advertised"), format!("http://{}", server.addr));
    assert_eq!(text(&dom, "cores"), "2 cores");
    assert_eq!(
        text(&dom, "version"),
        format!(
            "pico {} (commit {})",
            cluster["version"].as_str().unwrap(),
            cluster["commit"].as_str().unwrap()
        )
    );
    assert!(
        text(&dom, "status").starts_with("updated "),
        "{}",
        text(&dom, "status")
    );

    // Cards and counters.
    assert_eq!(text(&dom, "stream-count"), fmt_int(&cluster["streamCount"]));
    assert_eq!(text(&dom, "stream-count"), "4");
    assert_eq!(text(&dom, "object-count"), fmt_int(&cluster["objectCount"]));
    assert_eq!(
        text(&dom, "upload-backlog"),
        fmt_bytes(&stats["total"]["uploadBacklogBytes"])
    );
    assert_eq!(
        text(&dom, "records-appended"),
        fmt_int(&stats["total"]["recordsAppended"])
    );
    assert!(
        text(&dom, "uptime").ends_with('s'),
        "{}",
        text(&dom, "uptime")
    );
    // Rates need two polls; with the traffic over they are all zero.
    for id in ["append-rate", "read-rate"] {
        assert_eq!(text(&dom, id), "0", "#{id}");
    }
    for id in ["bytes-in-rate", "bytes-out-rate"] {
        assert_eq!(text(&dom, id), "0.00", "#{id}");
    }

    // One row per core, with that core's counters.
    let cores = rows(&dom, "cores-table");
    let api_cores = stats["cores"].as_array().unwrap();
    assert_eq!(cores.len(), api_cores.len());
    for ((tag, cells), core) in cores.iter().zip(api_cores) {
        assert_eq!(attr(tag, "data-core"), Some(core["core"].to_string()));
        assert_eq!(cells.len(), 9, "{cells:?}");
        let expected = [
            core["core"].to_string(),
            fmt_int(&core["streams"]),
            fmt_int(&core["appends"]),
            fmt_int(&core["recordsAppended"]),
            fmt_int(&core["reads"]),
        ];
        assert_eq!(cells[..5], expected, "core {}", core["core"]);
        assert_eq!(cells[7], fmt_bytes(&core["uploadBacklogBytes"]));
    }
    let column_sum = |column: usize| -> u64 {
        cores
            .iter()
            .map(|(_, c)| c[column].parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(column_sum(1), 4, "streams over the cores");
    assert_eq!(column_sum(3), 10, "records over the cores");

    // One row per stream, in the API's order, with its offsets.
    let table = rows(&dom, "streams-table");
    let api_streams = listing["streams"].as_array().unwrap();
    assert_eq!(table.len(), 4);
    assert_eq!(table.len(), api_streams.len());
    for ((tag, cells), stream) in table.iter().zip(api_streams) {
        let name = stream["name"].as_str().unwrap();
        assert_eq!(attr(tag, "data-name").as_deref(), Some(name));
        assert_eq!(
            attr(tag, "data-next"),
            Some(stream["endOffset"].to_string())
        );
        let expected = [
            name.to_string(),
            stream["contentType"].as_str().unwrap().to_string(),
            fmt_int(&stream["startOffset"]),
            fmt_int(&stream["endOffset"]),
            "no".to_string(),
        ];
        assert_eq!(cells[..], expected, "{name}");
    }
    let next_of = |name: &str| {
        table
            .iter()
            .find(|(tag, _)| attr(tag, "data-name").as_deref() == Some(name))
            .and_then(|(tag, _)| attr(tag, "data-next"))
    };
    assert_eq!(next_of("/orders/eu").as_deref(), Some("5"));
    assert_eq!(next_of("/orders/us").as_deref(), Some("2"));
    assert_eq!(next_of("/logs/app").as_deref(), Some("3"));
    assert_eq!(next_of("/empty").as_deref(), Some("0"));
    assert_eq!(attr(start_tag(&dom, "more"), "hidden").as_deref(), Some(""));
    // The consumer's row, as GET /admin/consumers has it.
    let consumers = rows(&dom, "consumers-table");
    assert_eq!(consumers.len(), 1, "{consumers:?}");
    assert_eq!(
        consumers[0].1,
        ["/billing", "pico", "single", "/orders/eu", "2", "5", "3"],
        "{consumers:?}"
    );
    assert_eq!(attr(&consumers[0].0, "data-lag").as_deref(), Some("3"));
    assert_eq!(
        attr(start_tag(&dom, "consumers-more"), "hidden").as_deref(),
        Some("")
    );
    // No stream is selected, so the detail panel stays hidden.
    assert!(attr(start_tag(&dom, "detail"), "hidden").is_some());

    screenshot_under_load(&browser, &server);
}

/// The README's picture: the page while a writer and a reader keep the node busy, so the
/// rates and the chart show something.
fn screenshot_under_load(browser: &Path, server: &Server) {
    let stop = Arc::new(AtomicBool::new(false));
    // Several writers, so group commits carry several appends each.
    let load: Vec<_> = (0..LOAD_CONNECTIONS)
        .map(|writer| {
            let stop = Arc::clone(&stop);
            let addr = server.addr;
            std::thread::spawn(move || -> Result<u64, String> {
                let mut conn = Conn::connect(addr).map_err(|e| format!("connect: {e}"))?;
                let deadline = Instant::now() + BROWSER_TIMEOUT * 2;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    n += 1;
                    let body = format!("{{\"writer\":{writer},\"n\":{n}}}");
                    let r = conn.request("POST", "/orders/us", &[], body.as_bytes());
                    let status = r.map_err(|e| format!("append {n}: {e}"))?.status;
                    if status != 200 {
                        return Err(format!("append {n}: status {status}"));
                    }
                    // Now and then one too large (refused: the refusal chart has a line), on
                    // a connection of its own.
                    if n.is_multiple_of(25) {
                        refused_append(addr).map_err(|e| format!("append {n}: {e}"))?;
                    }
                    // A read after every other append.
                    if n & 1 == 0 {
                        let r = conn.request("GET", "/orders/us?seq=0&bytes=4096", &[], b"");
                        let status = r.map_err(|e| format!("read {n}: {e}"))?.status;
                        if status != 200 {
                            return Err(format!("read {n}: status {status}"));
                        }
                    }
                }
                Ok(n)
            })
        })
        .collect();
    let target = workspace_root().join("target").join("dashboard.png");
    std::fs::create_dir_all(target.parent().unwrap()).expect("create target/");
    let _ = std::fs::remove_file(&target);
    let frame = frame_page(
        &format!("http://{}/?interval=100", server.admin),
        SCREENSHOT_AFTER,
    );
    run_chromium(
        browser,
        &frame,
        &[
            // Tall enough for the whole page with a few streams, and no more.
            "--window-size=1280,1280".into(),
            format!("--screenshot={}", target.display()),
        ],
    );
    stop.store(true, Ordering::Relaxed);
    for writer in load {
        if let Err(e) = writer.join().expect("a load thread") {
            panic!("the load failed: {e}; server log:\n{}", server.log());
        }
    }
    let png = std::fs::read(&target).expect("the screenshot was written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    // A blank page compresses to a few KiB; the rendered dashboard does not.
    assert!(
        png.len() > 20_000,
        "suspiciously small screenshot: {} bytes",
        png.len()
    );
    eprintln!("dashboard screenshot: {}", target.display());
    if std::env::var_os("PICOMQ_UPDATE_DOCS_SCREENSHOT").is_some() {
        let docs = workspace_root().join("docs").join("dashboard.png");
        std::fs::copy(&target, &docs).expect("copy the screenshot to docs/");
        eprintln!("updated {}", docs.display());
    }
}

/// An append too large for the node (`OVERSIZED_LIMIT`), on a new connection: it must be
/// refused with `413`.
fn refused_append(addr: std::net::SocketAddr) -> Result<(), String> {
    let mut conn = Conn::connect(addr).map_err(|e| format!("connect: {e}"))?;
    let body = vec![b'x'; OVERSIZED_BYTES];
    let status = conn
        .request("POST", "/orders/us", &[], &body)
        .map_err(|e| format!("oversized append: {e}"))?
        .status;
    match status {
        413 => Ok(()),
        other => Err(format!("oversized append: status {other}, not 413")),
    }
}

/// A page showing `url` in a frame the size of the window, whose load event (and so
/// Chromium's `--screenshot`) waits `hold` of real time for an image that answers late.
///
/// Virtual time suits the DOM checks, but there the page's polls run back to back, a few
/// milliseconds of real time apart, and the rates it computes between them are noise; a
/// picture of the dashboard at work needs the polls at their real interval.
fn frame_page(url: &str, hold: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the frame page listener");
    let address = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let page = format!(
        "<!doctype html><body style=\"margin:0\">\
         <iframe src=\"{url}\" style=\"border:0;display:block;width:100vw;height:100vh\"></iframe>\
         <img src=\"/hold\" alt=\"\" style=\"display:none\"></body>"
    );
    std::thread::spawn(move || {
        // Serves for as long as a Chromium run may take, then lets go of the port.
        let deadline = Instant::now() + BROWSER_TIMEOUT;
        while Instant::now() < deadline {
            let Ok((socket, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            let page = page.clone();
            std::thread::spawn(move || serve_frame_request(socket, &page, hold));
        }
    });
    format!("http://{address}/")
}

fn serve_frame_request(mut socket: TcpStream, page: &str, hold: Duration) {
    let _ = socket.set_nonblocking(false);
    let _ = socket.set_read_timeout(Some(BROWSER_TIMEOUT));
    let mut head = Vec::new();
    let mut chunk = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match socket.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
    let response = if head.starts_with(b"GET /hold ") {
        std::thread::sleep(hold);
        "HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n".to_string()
    } else if head.starts_with(b"GET / ") {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
            page.len()
        )
    } else {
        "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_string()
    };
    let _ = socket.write_all(response.as_bytes());
}

#[ignore = "needs Chromium: apt-get install chromium"]
#[test]
fn with_auth_the_page_takes_the_admin_token_from_the_url() {
    let browser = chromium_or_skip!();
    let (server, _tokens) = common::start_with_tokens(
        "ops-token / admin\nwriter-token / read,append\n",
        &["--cores", "1"],
    );
    let base = format!("http://{}/?interval=200", server.admin);
    let failed = |dom: &str| text(dom, "status").starts_with("error: ");

    // No token: the page loads (it is public) but its data does not.
    let dom = dump_dom(&browser, &server, &base, failed);
    assert!(!loaded(&dom));
    assert_eq!(text(&dom, "ready"), "unreachable");
    assert_eq!(
        text(&dom, "status"),
        "error: /admin/cluster: 401 a valid bearer token is required"
    );
    // A token without the admin grant.
    let dom = dump_dom(
        &browser,
        &server,
        &format!("{base}#token=writer-token"),
        failed,
    );
    assert_eq!(
        text(&dom, "status"),
        "error: /admin/cluster: 403 an admin token is required"
    );
    // The admin token.
    let dom = dump_dom(
        &browser,
        &server,
        &format!("{base}#token=ops-token"),
        loaded,
    );
    assert_eq!(text(&dom, "ready"), "ready");
    assert_eq!(text(&dom, "stream-count"), "0");
    assert_eq!(rows(&dom, "cores-table").len(), 1);
    // The token stays out of the page itself.
    assert!(!dom.contains("ops-token"), "the token is in the DOM");
}

/// Appends (and refused appends) on a thread until dropped: traffic between the page's polls.
struct Load {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<u64, String>>>,
}

impl Load {
    fn start(addr: std::net::SocketAddr) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || -> Result<u64, String> {
            let mut conn = Conn::connect(addr).map_err(|e| format!("connect: {e}"))?;
            let deadline = Instant::now() + BROWSER_TIMEOUT * 2;
            let mut n = 0u64;
            while !flag.load(Ordering::Relaxed) && Instant::now() < deadline {
                n += 1;
                let status = conn
                    .request("POST", "/orders/us", &[], b"{}")
                    .map_err(|e| format!("append {n}: {e}"))?
                    .status;
                if status != 200 {
                    return Err(format!("append {n}: status {status}"));
                }
                if n.is_multiple_of(4) {
                    refused_append(addr)?;
                }
            }
            Ok(n)
        });
        Load {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the load; how many appends it made, or what went wrong.
    fn finish(mut self) -> Result<u64, String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .expect("finished once")
            .join()
            .expect("the load thread")
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The charts while appends (some refused) run: latency percentiles from the histograms, the
/// refusal rate, a time axis of clock times; the storage cards once measured; and after the
/// WAL directory is taken away, the errors and refusals the appends then get, since the start.
#[ignore = "needs Chromium: apt-get install chromium"]
#[test]
fn the_charts_show_latency_refusals_and_errors_on_a_time_axis() {
    let browser = chromium_or_skip!();
    let server = Server::start(&[
        "--cores",
        "1",
        "--segment-max-age-ms",
        "200",
        "--max-body-size",
        OVERSIZED_LIMIT,
    ]);
    server.put("/orders/us", "application/json").expect(201);
    server.post("/orders/us", b"{}").expect(200);
    // A segment in the bucket, and the node has measured it.
    common::wait_for("the storage measured", Duration::from_secs(30), || {
        let storage = api(&server, "/admin/stats")["storage"].clone();
        let measured = storage["bucketBytes"].as_u64() > Some(0)
            && storage["walBytes"].as_u64() > Some(0)
            && storage["metaBytes"].as_u64() > Some(0);
        measured.then_some(())
    });

    let url = format!("http://{}/?interval=200", server.admin);
    let load = Load::start(server.addr);
    let charted = |dom: &str| {
        loaded(dom)
            && series_points(dom, "latency-chart", "appendP99").0 > 0
            && series_points(dom, "errors-chart", "refusals").1 > 0.0
    };
    let dom = dump_dom(&browser, &server, &url, charted);
    let appends = load
        .finish()
        .unwrap_or_else(|e| panic!("the load failed: {e}; server log:\n{}", server.log()));
    assert!(appends > 0);

    // Latency: the append and fsync percentiles have points, and the tiles say milliseconds.
    for series in ["appendP50", "appendP99", "fsyncP50", "fsyncP99"] {
        let (points, max) = series_points(&dom, "latency-chart", series);
        assert!(
            points > 0 && max > 0.0,
            "{series}: {points} points, max {max}"
        );
    }
    for id in ["append-p50", "append-p99", "fsync-p50", "fsync-p99"] {
        assert!(text(&dom, id).ends_with(" ms"), "#{id}: {}", text(&dom, id));
    }
    // Refusals: the rate had points above zero, and the 413s are listed by code.
    let refusals = series_points(&dom, "errors-chart", "refusals");
    assert!(refusals.0 > 0 && refusals.1 > 0.0, "{refusals:?}");
    let listed = start_tag(&dom, "refusal-codes");
    assert!(listed.starts_with("<ul"), "{listed}");
    let codes = &dom[dom.find(listed).unwrap()..];
    let codes = &codes[..codes.find("</ul>").unwrap()];
    assert!(codes.contains("data-code=\"413\""), "{codes}");
    assert_eq!(text(&dom, "error-total"), "0");
    assert!(
        // The page groups digits (`1,024`), as the admin numbers it shows.
        text(&dom, "refusal-total")
            .replace(',', "")
            .parse::<u64>()
            .unwrap()
            >= 1,
        "{}",
        text(&dom, "refusal-total")
    );
    // Every chart runs on a time axis of clock times.
    for chart in ["traffic-chart", "latency-chart", "errors-chart"] {
        let labels = time_labels(&dom, chart);
        assert!(labels.len() >= 2, "#{chart}: {labels:?}");
        assert!(
            labels.iter().all(|l| is_clock_time(l)),
            "#{chart}: {labels:?}"
        );
        let window = attr(start_tag(&dom, chart), "data-window").unwrap_or_default();
        assert!(window.starts_with("last "), "#{chart}: {window}");
    }
    // Storage: measured, in bytes.
    for id in ["disk-bytes", "bucket-bytes"] {
        assert!(text(&dom, id).ends_with('B'), "#{id}: {}", text(&dom, id));
    }
    assert!(text(&dom, "disk-detail").starts_with("WAL "));
    assert!(text(&dom, "bucket-segments").ends_with(" segments in the catalog"));

    // Errors: without its WAL directory the node fails the next append (500 or 503) and
    // refuses the ones after it (503); the page shows the counts the API has.
    server.remove_wal_dir();
    for _ in 0..2 {
        let status = server.post("/orders/us", b"{}").status;
        assert!(status == 500 || status == 503, "status {status}");
    }
    let responses = api(&server, "/admin/stats")["responses"].clone();
    let unavailable = responses["refused"]["503"].as_u64().unwrap();
    let errors = responses["serverErrors"].as_u64().unwrap();
    assert_eq!(errors + unavailable, 2, "{responses}");
    let dom = dump_dom(&browser, &server, &url, loaded);
    assert_eq!(
        text(&dom, "error-total"),
        fmt_int(&responses["serverErrors"])
    );
    let refused_total: u64 = responses["refused"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(text(&dom, "refusal-total"), fmt_int(&refused_total.into()));
    if unavailable > 0 {
        let codes = &dom[dom.find("id=\"refusal-codes\"").unwrap()..];
        let codes = &codes[..codes.find("</ul>").unwrap()];
        assert!(
            codes.contains(&format!("data-code=\"503\" data-count=\"{unavailable}\"")),
            "{codes}"
        );
    }
}
