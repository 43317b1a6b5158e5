//! Tests of the Durable Streams handlers: offsets, JSON bodies, SSE data lines, cursors and
//! queries.

use bytes::Bytes;
use pico_engine::limits;

use super::encode::*;
use super::params::*;
use super::sse::*;
use super::write::*;
use crate::params::query_values;

proptest::proptest! {
    #![proptest_config(crate::fuzzing::config())]
    #[test]
    fn fuzz_ds_offset(text in crate::fuzzing::inputs("ds_offset")) {
        let text = String::from_utf8_lossy(&text);
        if let Ok(Position::At { seq, bytes }) = parse_offset(&text) {
            let again = parse_offset(&format_offset(seq, bytes)).ok();
            proptest::prop_assert_eq!(again, Some(Position::At { seq, bytes }));
        }
    }

    #[test]
    fn fuzz_ds_json_body(body in crate::fuzzing::inputs("ds_json_body")) {
        let body = Bytes::from(body);
        if let Ok(records) = body_records(&body, true, true) {
            for record in &records {
                let parsed = serde_json::from_slice::<serde::de::IgnoredAny>(&record.body);
                proptest::prop_assert!(parsed.is_ok(), "{:?}", record.body);
            }
        }
    }
}

#[test]
fn offsets_round_trip_and_sort() {
    let a = format_offset(9, 0);
    let b = format_offset(10, 0);
    assert!(a < b, "lexicographic order is stream order");
    assert_eq!(
        parse_offset(&a).ok(),
        Some(Position::At { seq: 9, bytes: 0 })
    );
    assert_eq!(parse_offset("-1").ok(), Some(Position::Start));
    assert_eq!(parse_offset("now").ok(), Some(Position::Now));
    for bad in [
        "", "abc", "1_", "_1", "1 _2", "../1_2", "1,2", "1_2_3", "-2",
    ] {
        assert!(parse_offset(bad).is_err(), "{bad:?} must be rejected");
    }
}

#[test]
fn json_bodies_flatten_one_level() {
    let count = |text: &str| {
        body_records(&Bytes::from(text.to_string()), true, false).map(|r| {
            r.into_iter()
                .map(|r| String::from_utf8(r.body.to_vec()).unwrap())
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(count("[1, {\"a\":2}]").ok().unwrap(), ["1", "{\"a\":2}"]);
    assert_eq!(count("[[1,2],[3]]").ok().unwrap(), ["[1,2]", "[3]"]);
    assert_eq!(count("[[[1]]]").ok().unwrap(), ["[[1]]"]);
    assert_eq!(count(" {\"x\":1} ").ok().unwrap(), ["{\"x\":1}"]);
    assert!(count("[]").is_err());
    assert!(count("{bad").is_err());
    assert!(body_records(&Bytes::from_static(b"[]"), true, true)
        .unwrap()
        .is_empty());
}

#[test]
fn json_arrays_stop_at_the_message_limit() {
    let array = |n: usize| {
        let mut text = vec![b'['];
        for i in 0..n {
            if i > 0 {
                text.push(b',');
            }
            text.push(b'0');
        }
        text.push(b']');
        Bytes::from(text)
    };
    let limit = limits::RECORDS_PER_APPEND_MAX;
    assert_eq!(
        body_records(&array(limit), true, false).ok().unwrap().len(),
        limit
    );
    let refused = body_records(&array(limit + 1), true, false).err().unwrap();
    assert_eq!(refused.status, 400);
    assert!(
        refused.message.contains("at most 100000 messages"),
        "{}",
        refused.message
    );
    let broken = body_records(&Bytes::from_static(b"[0,0,"), true, false)
        .err()
        .unwrap();
    assert!(
        broken.message.starts_with("invalid JSON"),
        "{}",
        broken.message
    );
}

#[test]
fn sse_data_lines_split_every_line_ending() {
    let mut out = Vec::new();
    data_lines(&mut out, b"a\r\nb\rc\n\n d");
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "data:a\ndata:b\ndata:c\ndata:\ndata:  d\n"
    );
}

#[test]
fn cursors_move_past_an_echoed_one() {
    let current: u64 = next_cursor(None).parse().unwrap();
    let echoed = current.to_string();
    let next: u64 = next_cursor(Some(&echoed)).parse().unwrap();
    assert!(next > current);
    assert_eq!(next_cursor(Some("1")), current.to_string());
}

#[test]
fn queries_keep_every_value() {
    assert_eq!(query_values("offset=1&offset=2", "offset"), ["1", "2"]);
    assert_eq!(query_values("a=%2F&b", "a"), ["/"]);
    assert!(query_values("x=1", "offset").is_empty());
}

/// The size of the future `f` returns (lifetimes do not change it).
fn future_size<A, B, C, D, F>(_: fn(A, B, C, D) -> F) -> usize {
    std::mem::size_of::<F>()
}

/// A parked long-poll holds its handler's future for as long as it waits (thousands at once):
/// an SSE response's setup is boxed, as are writes, so that future is a read's. In both
/// protocols it would be over 2,500 bytes with the SSE setup inline.
#[test]
fn a_parked_long_poll_holds_a_small_future() {
    use std::rc::Rc;

    use pico_engine::CoreHandle;

    use crate::auth::CoreTokens;
    use crate::pico::PicoSettings;
    use crate::transport::message::Request;

    fn durable_streams() -> usize {
        future_size::<
            &'static Rc<CoreHandle>,
            &'static DsSettings,
            Option<&'static CoreTokens>,
            Request,
            _,
        >(super::handle::handle)
    }
    fn pico() -> usize {
        future_size::<
            &'static Rc<CoreHandle>,
            &'static PicoSettings,
            Option<&'static CoreTokens>,
            Request,
            _,
        >(crate::pico::handle)
    }
    for (protocol, bytes) in [("Durable Streams", durable_streams()), ("Pico", pico())] {
        assert!(
            bytes < 1600,
            "a {protocol} request's future takes {bytes} bytes"
        );
    }
}
