//! Tests of HTTP/1.1 connections: the room an idle or parked connection holds, request
//! parsing (fuzzed), strict chunked framing, and the body budget.

use bytes::Bytes;

use super::parse::*;
use super::*;

/// The size of the future `f` returns.
fn output_size<A, B, C, D, E, G>(_: fn(A, B, C, D, E) -> G) -> usize {
    std::mem::size_of::<G>()
}

/// The size of a plain TCP connection's future, serving with `handler`.
fn connection_size<H, F>(_handler: &H) -> usize
where
    H: Fn(Request) -> F + 'static,
    F: Future<Output = Response> + 'static,
{
    output_size(serve_connection::<crate::transport::socket::PlainTcp, H, F>)
}

/// An idle HTTP/1.1 connection holds its own small future only: the request's (here a
/// handler holding 32 KiB across an await) is on the heap while it runs. Inline, every
/// connection would carry that room for its whole life (124 KiB per idle connection, measured
/// with 2,000 of them; docs/decisions/2026-12-small-connection-futures.md).
#[test]
fn an_idle_connection_does_not_carry_a_request_s_future() {
    let handle = |_request: Request| async {
        let scratch = [1u8; 32 * 1024];
        futures_lite::future::yield_now().await;
        Response::new(200).with_body(Bytes::copy_from_slice(&scratch[..1]))
    };
    let bytes = connection_size(&handle);
    // Taking the connection's socket, buffer and limits by value (a second copy of each)
    // makes it 1,288 bytes, and awaiting the future `within` and `unless_stopped` wrap inside
    // an `async` block (room for it twice) 1,016.
    assert!(bytes < 800, "a connection's future takes {bytes} bytes");
}

/// Reading a request is a future of a few hundred bytes, boxed per request: httparse's room
/// for the headers is a synchronous function's, not kept in it across the body's awaits
/// (there it would make the future about 3.9 KiB, allocated and copied per request).
#[test]
fn reading_a_request_keeps_no_room_for_the_headers_parser() {
    let mut stream = futures_lite::io::Cursor::new(Vec::<u8>::new());
    let limits = ConnectionLimits::with_body_limit(1 << 20);
    let mut buf = BytesMut::new();
    let bytes = std::mem::size_of_val(&read_request(&mut stream, &mut buf, &limits));
    assert!(
        bytes < 1024,
        "reading a request takes {bytes} bytes of future"
    );
}

/// A request parked in its handler (a long-poll) or streaming its response (SSE) holds the
/// handler's future plus little else: reading the request, handling it, writing the answer
/// and draining a refused body are boxed phases, and watching for the peer leaving keeps no
/// buffer of its own. (With a trivial handler and the phases inline: 12,048 bytes.)
#[test]
fn a_parked_request_holds_little_besides_its_handler() {
    let (request, watch, write, stream_events) = glommio::LocalExecutor::default().run(async {
        let handle = |_request: Request| async {
            futures_lite::future::yield_now().await;
            Response::new(200)
        };
        let stop = crate::shutdown::Shutdown::default().on_this_core();
        let mut stream = futures_lite::io::Cursor::new(Vec::<u8>::new());
        let limits = ConnectionLimits::with_body_limit(1 << 20);
        let mut buf = BytesMut::new();
        let on_error = |s, _: &str| Response::new(s);
        let request = std::mem::size_of_val(&serve_request(
            &mut stream,
            &mut buf,
            &limits,
            &handle,
            on_error,
            &stop,
        ));
        let watch = std::mem::size_of_val(&peer_gone(&mut stream, &mut buf));
        let response = Response::new(200);
        let write = std::mem::size_of_val(&write_response(&mut stream, response, false, false));
        let mut live: LiveBody = Box::new(Queued(Default::default()));
        let mut writer = ChunkedWriter {
            stream: &mut stream,
            arrived: &mut buf,
            chunks: Chunks::default(),
        };
        let stream_events = std::mem::size_of_val(&drive(&mut live, &mut writer, true, false));
        (request, watch, write, stream_events)
    });
    // 1,184 bytes while the write was inline, 784 while draining a refused body was.
    assert!(
        request < 768,
        "a request's own future takes {request} bytes"
    );
    assert!(watch < 256, "watching for the peer takes {watch} bytes");
    assert!(write < 1024, "writing a response takes {write} bytes");
    // What an SSE subscriber holds while its events are written, besides its connection's
    // future and the event stream (1,192 bytes if the request's future and the writer's, with
    // the event stream's writing inline, stayed under it).
    assert!(
        stream_events < 512,
        "writing an event stream takes {stream_events} bytes"
    );
}

/// Parses `wire` as one request with a 1 MiB body limit: the status of the error, or 0.
fn parse_status(wire: &[u8]) -> u16 {
    let mut stream = futures_lite::io::Cursor::new(wire.to_vec());
    let mut buf = BytesMut::new();
    let limits = ConnectionLimits::with_body_limit(1 << 20);
    let read = read_request(&mut stream, &mut buf, &limits);
    match futures_lite::future::block_on(read) {
        Ok(_) => 0,
        Err(e) => e.status,
    }
}

/// A refused body says how much of it is still to come when its Content-Length tells, so
/// the connection discards exactly that and closes at once; a chunked one cannot say, and is
/// drained until the peer stops (bounded). Before, every refusal waited out the drain's
/// timeout for bytes a client that keeps its connection open never sends.
#[test]
fn a_refused_body_says_how_much_of_it_is_still_to_come() {
    let refusal = |wire: &[u8]| {
        let mut stream = futures_lite::io::Cursor::new(wire.to_vec());
        let mut buf = BytesMut::new();
        let limits = ConnectionLimits::with_body_limit(1024);
        let read = read_request(&mut stream, &mut buf, &limits);
        match futures_lite::future::block_on(read) {
            Ok(_) => panic!("accepted"),
            Err(e) => (e.status, e.body_left),
        }
    };
    let head = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3000\r\n\r\n".to_vec();
    assert_eq!(refusal(&head), (413, Some(3000)));
    let mut some_arrived = head.clone();
    some_arrived.extend_from_slice(&[b'x'; 100]);
    assert_eq!(refusal(&some_arrived), (413, Some(2900)));
    let mut all_arrived = head;
    all_arrived.extend_from_slice(&[b'x'; 3000]);
    assert_eq!(refusal(&all_arrived), (413, Some(0)));
    let chunked = format!("{CHUNKED}801\r\n");
    assert_eq!(refusal(chunked.as_bytes()), (413, None));
}

proptest::proptest! {
    #![proptest_config(crate::fuzzing::config())]
    #[test]
    fn fuzz_http1_request(wire in crate::fuzzing::inputs("http1")) {
        let mut stream = futures_lite::io::Cursor::new(wire);
        let mut buf = BytesMut::new();
        let limits = ConnectionLimits::with_body_limit(4096);
        let read = read_request(&mut stream, &mut buf, &limits);
        if let Ok(Some((request, _, _))) = futures_lite::future::block_on(read) {
            proptest::prop_assert!(request.body.len() <= 4096);
            proptest::prop_assert!(request.path.starts_with('/'));
            // At most one Host, and a valid authority (Durable Streams builds URLs of it).
            let hosts: Vec<_> = request.headers.iter().filter(|(n, _)| n == "host").collect();
            proptest::prop_assert!(hosts.len() <= 1);
            proptest::prop_assert!(hosts
                .iter()
                .all(|(_, v)| crate::transport::message::valid_authority(v)));
        }
    }
}

const CHUNKED: &str = "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";

#[test]
fn chunk_sizes_from_the_wire_never_overflow() {
    for size in ["ffffffffffffffff", "fffffffffffffff0", "100001"] {
        let wire = format!("{CHUNKED}1\r\na\r\n{size}\r\n");
        assert_eq!(parse_status(wire.as_bytes()), 413, "chunk size {size}");
    }
    let overlong = format!("{CHUNKED}00000000000000001\r\na\r\n0\r\n\r\n");
    assert_eq!(parse_status(overlong.as_bytes()), 400);
}

#[test]
fn chunk_size_lines_are_strict() {
    for line in [
        "+1",
        "-1",
        "0x1",
        " 1",
        "1 x",
        "",
        ";a",
        "1\na",
        "1 ",
        "1\t",
        "1;a\0",
        "1;\0",
        "1;a=\"\x01\"",
        "1;a\x7f",
    ] {
        let wire = format!("{CHUNKED}{line}\r\na\r\n0\r\n\r\n");
        assert_eq!(
            parse_status(wire.as_bytes()),
            400,
            "chunk size line {line:?}"
        );
    }
    for line in ["1", "1;name=value", "1 ;name", "01", "1\t;a", "1;a=\"b c\""] {
        let wire = format!("{CHUNKED}{line}\r\na\r\n0\r\n\r\n");
        assert_eq!(parse_status(wire.as_bytes()), 0, "chunk size line {line:?}");
    }
}

#[test]
fn framing_that_proxies_read_differently_is_refused() {
    let http10 = "POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n";
    assert_eq!(parse_status(http10.as_bytes()), 400);
    let twice = "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    assert_eq!(parse_status(twice.as_bytes()), 400);
    let bare_lf = "POST /x HTTP/1.1\nHost: a\nContent-Length: 1\n\na";
    assert_eq!(parse_status(bare_lf.as_bytes()), 400);
    let mixed = "GET /x HTTP/1.1\r\nHost: a\nX: y\r\n\r\n";
    assert_eq!(parse_status(mixed.as_bytes()), 400);
    let signed = "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\na";
    assert_eq!(parse_status(signed.as_bytes()), 400);
    let fine = "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\na";
    assert_eq!(parse_status(fine.as_bytes()), 0);
}

/// A stream that hands out its bytes a few KiB per read, as a socket under load does.
struct Trickle(futures_lite::io::Cursor<Vec<u8>>);

impl futures_lite::AsyncRead for Trickle {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        out: &mut [u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let n = out.len().min(3000);
        std::pin::Pin::new(&mut self.0).poll_read(cx, &mut out[..n])
    }
}

impl futures_lite::AsyncWrite for Trickle {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(Ok(data.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_close(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[test]
fn a_body_takes_no_more_memory_than_the_budget_was_charged() {
    let size = 3_000_000;
    let mut chunked = CHUNKED.as_bytes().to_vec();
    for part in vec![b'c'; size].chunks(100_000) {
        chunked.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        chunked.extend_from_slice(part);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let mut plain =
        format!("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: {size}\r\n\r\n").into_bytes();
    plain.extend(std::iter::repeat_n(b'p', size));
    for wire in [plain, chunked] {
        let mut stream = Trickle(futures_lite::io::Cursor::new(wire));
        let mut buf = BytesMut::new();
        let limits = ConnectionLimits::with_body_limit(8 << 20);
        let read = read_request(&mut stream, &mut buf, &limits);
        let (request, _, held) = futures_lite::future::block_on(read).unwrap().unwrap();
        assert_eq!(request.body.len(), size);
        drop(buf);
        let allocated = request.body.try_into_mut().unwrap().capacity();
        let charged = limits.bodies.held_bytes();
        // Left to `BytesMut`, doubling left up to twice the body allocated, half uncounted.
        assert!(
            allocated <= charged,
            "{allocated} bytes held, {charged} charged"
        );
        assert!(
            charged <= size + (64 << 10),
            "charged {charged} for {size} bytes"
        );
        drop(held);
        assert_eq!(limits.bodies.held_bytes(), 0);
    }
}

#[test]
fn a_body_past_the_budget_is_refused_while_another_is_held() {
    let limits = ConnectionLimits {
        bodies: crate::limits::BodyBudget::new(1 << 20),
        ..ConnectionLimits::with_body_limit(8 << 20)
    };
    let mut first = limits.bodies.reservation();
    assert!(first.grow_to(512 << 10));
    let size = 600 << 10;
    let mut wire =
        format!("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: {size}\r\n\r\n").into_bytes();
    wire.extend(std::iter::repeat_n(b'p', size));
    let mut stream = Trickle(futures_lite::io::Cursor::new(wire));
    let mut buf = BytesMut::new();
    let read = read_request(&mut stream, &mut buf, &limits);
    let refused = futures_lite::future::block_on(read).err().unwrap();
    assert_eq!(refused.status, 429);
    assert_eq!(
        limits.bodies.held_bytes(),
        512 << 10,
        "the refused body gave its share back"
    );
}

/// A socket that keeps each write apart and never has anything to read.
#[derive(Default)]
struct Writes(Vec<Vec<u8>>);

impl crate::transport::socket::Socket for Writes {
    fn set_send_stall_timeout(&self, _: std::time::Duration) {}
}

impl crate::transport::socket::Socket for Trickle {
    fn set_send_stall_timeout(&self, _: std::time::Duration) {}
}

/// A buffer as a connection's socket, for sizing futures.
impl crate::transport::socket::Socket for futures_lite::io::Cursor<Vec<u8>> {
    fn set_send_stall_timeout(&self, _: std::time::Duration) {}
}

impl futures_lite::AsyncRead for Writes {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        _buf: &mut [u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Pending
    }
}

impl futures_lite::AsyncWrite for Writes {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.0.push(buf.to_vec());
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_close(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Live events that are all queued from the start (no reads).
struct Queued(std::collections::VecDeque<Bytes>);

impl crate::live_response::LiveEvents for Queued {
    fn core(&self) -> &std::rc::Rc<pico_engine::CoreHandle> {
        unreachable!("queued events make no read")
    }
    fn stream_name(&self) -> &str {
        "/queued"
    }
    fn pop_event(&mut self) -> Option<Bytes> {
        self.0.pop_front()
    }
    fn next_read(&mut self) -> Option<pico_engine::ReadRequest> {
        None
    }
    fn answer(&mut self, _: Option<&(pico_engine::ReadBatch, bool)>) {}
    fn at_tail(&self) -> bool {
        false
    }
}

/// Events that are ready together (an SSE data event and its control event) leave in one
/// write, one TCP segment; an empty event is no chunk (its frame would end the body); unsent
/// chunks of a resumed response go first.
#[test]
fn events_ready_together_leave_in_one_write() {
    let writes = glommio::LocalExecutor::default().run(async {
        let events = [
            Bytes::from_static(b"a"),
            Bytes::new(),
            Bytes::from_static(b"bb"),
        ];
        let mut socket = Writes::default();
        let response = Response::new(200).with_live(Box::new(Queued(events.into())));
        let mut live = super::write::write_response(&mut socket, response, false, true)
            .await
            .expect("head written")
            .expect("live events");
        let mut writer = ChunkedWriter {
            stream: &mut socket,
            arrived: &mut BytesMut::new(),
            chunks: Chunks(b"1\r\nz\r\n".to_vec()),
        };
        let ended = drive(&mut live, &mut writer, true, false)
            .await
            .expect("written");
        assert!(matches!(ended, Driven::Ended));
        socket.0
    });
    let writes: Vec<String> = writes
        .into_iter()
        .map(|w| String::from_utf8(w).unwrap())
        .collect();
    assert!(writes[0].starts_with("HTTP/1.1 200 OK\r\n"), "{writes:?}");
    assert_eq!(
        &writes[1..],
        ["1\r\nz\r\n", "1\r\na\r\n2\r\nbb\r\n", "0\r\n\r\n"],
        "one write per set of ready events"
    );
}

/// A chunk-size line longer than the limit is refused however it arrives: in pieces (the wait
/// for its end stops at the limit), or whole in one read (it was taken before).
#[test]
fn an_overlong_chunk_size_line_is_refused_even_in_one_read() {
    let long = format!(
        "{CHUNKED}1;{}\r\na\r\n0\r\n\r\n",
        "x".repeat(crate::limits::CHUNK_SIZE_LINE_BYTES_MAX + 10)
    );
    assert_eq!(parse_status(long.as_bytes()), 400);
    let fits = format!(
        "{CHUNKED}1;{}\r\na\r\n0\r\n\r\n",
        "x".repeat(crate::limits::CHUNK_SIZE_LINE_BYTES_MAX - 10)
    );
    assert_eq!(parse_status(fits.as_bytes()), 0);
}

/// RFC 9112 §3.2: an HTTP/1.1 request has exactly one `Host` (HTTP/1.0 may have none), and
/// its value is an authority: it names the server in the URLs built from it.
#[test]
fn an_http1_1_request_has_one_valid_host() {
    let with = |version: &str, hosts: &[&str]| {
        let mut wire = format!("GET /s HTTP/{version}\r\n");
        for host in hosts {
            wire.push_str(&format!("Host: {host}\r\n"));
        }
        wire.push_str("\r\n");
        parse_status(wire.as_bytes())
    };
    assert_eq!(with("1.1", &[]), 400, "no Host");
    assert_eq!(with("1.1", &["a", "a"]), 400, "two Hosts, even alike");
    assert_eq!(with("1.1", &["a", "b"]), 400, "two Hosts");
    assert_eq!(with("1.0", &[]), 0, "HTTP/1.0 needs none");
    assert_eq!(with("1.0", &["a", "b"]), 400, "but has at most one");
    for good in [
        "a",
        "",
        "example.com",
        "example.com:4437",
        "127.0.0.1:1",
        "[::1]",
        "[::1]:4437",
        "[2001:db8::7]:80",
        "xn--bcher-kva.example",
        "my_host.local:",
        "a%2Db",
    ] {
        assert_eq!(with("1.1", &[good]), 0, "Host {good:?}");
    }
    for bad in [
        "evil.example/path",
        "a?b",
        "a#b",
        "user@evil.example",
        "a b",
        "a:b",
        "a:123456",
        "::1",
        "[::1",
        "[not-ip]",
        "[::1]x",
        "a\"b",
        "a<b>",
        "a\\b",
    ] {
        assert_eq!(with("1.1", &[bad]), 400, "Host {bad:?}");
    }
}

/// `100-continue` is the only expectation (RFC 9110 §10.1.1): any other is `417`.
#[test]
fn expectations_other_than_100_continue_are_417() {
    let expect = |value: &str| {
        let wire =
            format!("PUT /s HTTP/1.1\r\nHost: a\r\nExpect: {value}\r\nContent-Length: 0\r\n\r\n");
        parse_status(wire.as_bytes())
    };
    assert_eq!(expect("100-continue"), 0);
    assert_eq!(expect("100-Continue"), 0);
    for other in ["200-ok", "100-continue, foo", "foo", "\"100-continue\""] {
        assert_eq!(expect(other), 417, "Expect: {other}");
    }
}

/// A response's head is its status line, its headers in order (constant and built values
/// alike), `content-length` for a body and no length for a status without one; the body
/// follows in the same write when it is small.
#[test]
fn a_response_head_is_written_in_order_with_its_length() {
    let writes = glommio::LocalExecutor::default().run(async {
        let mut socket = Writes::default();
        let created = Response::new(201)
            .header("location", format!("/s/{}", 7))
            .header("cache-control", "no-store")
            .with_body(Bytes::from(vec![b'x'; 1234]));
        super::write::write_response(&mut socket, created, false, true)
            .await
            .expect("written");
        let empty = Response::new(204).header("stream-next-offset", "0_0");
        super::write::write_response(&mut socket, empty, false, false)
            .await
            .expect("written");
        socket.0
    });
    let writes: Vec<String> = writes
        .into_iter()
        .map(|w| String::from_utf8(w).unwrap())
        .collect();
    assert_eq!(
        writes[0],
        format!(
            "HTTP/1.1 201 Created\r\nlocation: /s/7\r\ncache-control: no-store\r\n\
             content-length: 1234\r\n\r\n{}",
            "x".repeat(1234)
        )
    );
    assert_eq!(
        writes[1],
        "HTTP/1.1 204 No Content\r\nstream-next-offset: 0_0\r\nconnection: close\r\n\r\n"
    );
}
