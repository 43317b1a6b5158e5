use serde_json::json;

use super::*;

const TAIL: u64 = 10;
const TTL_MS: u64 = 1_000;

/// One consumer's stored document and the clock, as the metadata thread would hold them.
struct Harness {
    document: Option<String>,
    now_ms: i64,
}

impl Harness {
    fn registered() -> Harness {
        let mut h = Harness {
            document: None,
            now_ms: 1_000_000,
        };
        let body = json!({"consumer_id": "c", "streams": ["/a", "/b"], "lease_ttl_ms": TTL_MS});
        let (id, registration) = parse_registration(&body).unwrap();
        let (status, _) = h.run(|read| register(read, &id, &registration)).unwrap();
        assert_eq!(status, 201);
        h
    }

    fn read(&self) -> ConsumerRead {
        ConsumerRead {
            document: self.document.clone(),
            now_ms: self.now_ms,
            scope_count: u64::from(self.document.is_some()),
        }
    }

    fn run(&mut self, decide: impl FnOnce(ConsumerRead) -> (ConsumerWrite, Answer)) -> Answer {
        let before = self.document.clone();
        let (write, answer) = decide(self.read());
        if answer.is_err() {
            assert_eq!(write, ConsumerWrite::Keep, "a refusal changed the consumer");
        }
        match write {
            ConsumerWrite::Keep => {}
            ConsumerWrite::Put(document) => self.document = Some(document),
            ConsumerWrite::Delete => self.document = None,
        }
        if answer.is_err() {
            assert_eq!(before, self.document);
        }
        answer
    }

    fn consumer(&self) -> Consumer {
        Consumer::parse(self.document.as_deref().unwrap()).unwrap()
    }

    fn acquire(&mut self, secret: &str) -> String {
        let token = Token::new(secret.to_string());
        let (_, body) = self.run(|read| acquire(read, "c", &token)).unwrap();
        body["token"].as_str().unwrap().to_string()
    }

    fn ack(&mut self, token: &str, path: &str, at: Offset) -> Answer {
        let offsets = vec![(path.to_string(), at)];
        let tails = [Some((TAIL, 0))];
        self.run(|read| ack(read, "c", token, &offsets, &tails))
    }
}

fn at(seq: u64) -> Offset {
    Offset::At { seq, bytes: 0 }
}

fn code(answer: &Answer) -> &'static str {
    answer.as_ref().err().map_or("OK", |e| e.code)
}

#[test]
fn a_new_consumer_starts_before_everything_and_registers_idempotently() {
    let mut h = Harness::registered();
    let view = h.consumer().view("c", h.now_ms);
    assert_eq!(view["state"], "REGISTERED");
    assert_eq!(view["streams"][0]["offset"], "-1");
    assert_eq!(view["streams"][1]["path"], "/b");
    // The same body again: found, nothing written.
    let body = json!({"consumer_id": "c", "streams": ["/b", "/a"], "lease_ttl_ms": TTL_MS});
    let (id, registration) = parse_registration(&body).unwrap();
    let before = h.document.clone();
    assert_eq!(h.run(|r| register(r, &id, &registration)).unwrap().0, 200);
    assert_eq!(before, h.document);
    // Other streams, or another lease: a conflict.
    for body in [
        json!({"consumer_id": "c", "streams": ["/a"]}),
        json!({"consumer_id": "c", "streams": ["/a", "/b", "/c"]}),
        json!({"consumer_id": "c", "streams": ["/a", "/b"], "lease_ttl_ms": 5000}),
    ] {
        let (id, registration) = parse_registration(&body).unwrap();
        let answer = h.run(|r| register(r, &id, &registration));
        assert_eq!(code(&answer), "CONSUMER_ALREADY_EXISTS");
        assert_eq!(answer.unwrap_err().status, 409);
    }
}

#[test]
fn malformed_registrations_are_invalid_requests() {
    for body in [
        json!({"streams": ["/a"]}),
        json!({"consumer_id": "", "streams": ["/a"]}),
        json!({"consumer_id": "__wh__:x", "streams": ["/a"]}),
        json!({"consumer_id": "c"}),
        json!({"consumer_id": "c", "streams": []}),
        json!({"consumer_id": "c", "streams": ["a"]}),
        json!({"consumer_id": "c", "streams": [1]}),
        json!({"consumer_id": "c", "streams": ["/a"], "lease_ttl_ms": 0}),
        json!({"consumer_id": "c", "streams": ["/a"], "lease_ttl_ms": -5}),
        json!({"consumer_id": "c", "streams": ["/a"], "lease_ttl_ms": "10"}),
        json!({"consumer_id": "x".repeat(CONSUMER_ID_BYTES_MAX + 1), "streams": ["/a"]}),
        json!([1, 2]),
    ] {
        let error = parse_registration(&body).unwrap_err();
        assert_eq!(
            (error.status, error.code),
            (400, "INVALID_REQUEST"),
            "{body}"
        );
    }
    let many: Vec<String> = (0..=STREAMS_PER_CONSUMER_MAX)
        .map(|i| format!("/s{i}"))
        .collect();
    let error = parse_registration(&json!({"consumer_id": "c", "streams": many})).unwrap_err();
    assert_eq!(error.code, "INVALID_REQUEST");
}

#[test]
fn acks_move_forward_within_the_tail_atomically() {
    let mut h = Harness::registered();
    let token = h.acquire("s1");
    assert_eq!(h.consumer().epoch, 1);
    assert_eq!(code(&h.ack(&token, "/a", at(3))), "OK");
    assert_eq!(
        code(&h.ack(&token, "/a", at(3))),
        "OK",
        "the same offset again"
    );
    assert_eq!(code(&h.ack(&token, "/a", at(2))), "OFFSET_REGRESSION");
    assert_eq!(
        code(&h.ack(&token, "/a", Offset::Start)),
        "OFFSET_REGRESSION"
    );
    assert_eq!(code(&h.ack(&token, "/a", at(TAIL + 1))), "INVALID_OFFSET");
    assert_eq!(code(&h.ack(&token, "/nope", at(1))), "UNKNOWN_STREAM");
    assert_eq!(code(&h.ack(&token, "/a", at(TAIL))), "OK");
    // Two streams in one ack: one bad entry refuses both.
    let offsets = vec![("/b".to_string(), at(4)), ("/a".to_string(), at(1))];
    let tails = [Some((TAIL, 0)), Some((TAIL, 0))];
    let answer = h.run(|r| ack(r, "c", &token, &offsets, &tails));
    assert_eq!(code(&answer), "OFFSET_REGRESSION");
    assert!(answer.unwrap_err().message.contains("/a"));
    assert_eq!(h.consumer().streams[1].next, None, "/b did not move");
    // A stream that does not exist has no room past -1.
    let offsets = vec![("/b".to_string(), at(1))];
    let answer = h.run(|r| ack(r, "c", &token, &offsets, &[None]));
    assert_eq!(code(&answer), "INVALID_OFFSET");
}

#[test]
fn acquire_supersedes_and_release_keeps_offsets() {
    let mut h = Harness::registered();
    let first = h.acquire("s1");
    assert_eq!(code(&h.ack(&first, "/a", at(2))), "OK");
    let second = h.acquire("s2");
    assert_eq!(code(&h.ack(&first, "/a", at(3))), "STALE_EPOCH");
    assert_eq!(code(&h.ack(&second, "/a", at(3))), "OK");
    assert_eq!(code(&h.ack("2.forged", "/a", at(4))), "TOKEN_INVALID");
    assert_eq!(code(&h.ack("nonsense", "/a", at(4))), "TOKEN_INVALID");
    assert_eq!(code(&h.ack("9.future", "/a", at(4))), "TOKEN_INVALID");
    let released = h.run(|r| release(r, "c", &second)).unwrap();
    assert_eq!(released.1["state"], "REGISTERED");
    assert_eq!(released.1["streams"][0]["offset"], offset::format(3, 0));
    assert_eq!(code(&h.ack(&second, "/a", at(4))), "CONSUMER_NOT_READING");
    assert_eq!(
        code(&h.run(|r| release(r, "c", &second))),
        "CONSUMER_NOT_READING"
    );
}

#[test]
fn a_lease_lapses_without_heartbeats_and_an_empty_ack_extends_it() {
    let mut h = Harness::registered();
    let token = h.acquire("s1");
    for _ in 0..5 {
        h.now_ms += (TTL_MS as i64) * 3 / 4;
        let answer = h.run(|r| ack(r, "c", &token, &Vec::new(), &[]));
        assert_eq!(answer.unwrap().1["state"], "READING");
    }
    h.now_ms += TTL_MS as i64;
    assert_eq!(h.consumer().view("c", h.now_ms)["state"], "REGISTERED");
    assert_eq!(code(&h.ack(&token, "/a", at(1))), "CONSUMER_NOT_READING");
    let again = h.acquire("s2");
    assert_eq!(code(&h.ack(&again, "/a", at(1))), "OK");
}

#[test]
fn unknown_consumers_are_not_found() {
    let mut h = Harness {
        document: None,
        now_ms: 0,
    };
    assert_eq!(code(&h.run(|r| describe(r, "c"))), "CONSUMER_NOT_FOUND");
    assert_eq!(code(&h.run(delete)), "CONSUMER_NOT_FOUND");
    let token = Token::new("x".into());
    assert_eq!(
        code(&h.run(|r| acquire(r, "c", &token))),
        "CONSUMER_NOT_FOUND"
    );
    assert_eq!(code(&h.ack("1.x", "/a", at(0))), "CONSUMER_NOT_FOUND");
    assert_eq!(
        code(&h.run(|r| release(r, "c", "1.x"))),
        "CONSUMER_NOT_FOUND"
    );
}

#[test]
fn malformed_acks_are_refused_whole() {
    for body in [
        json!({}),
        json!({"offsets": {}}),
        json!({"offsets": [{"path": "/a"}]}),
        json!({"offsets": [{"offset": "-1"}]}),
        json!({"offsets": [{"path": "/a", "offset": 3}]}),
        json!({"offsets": [{"path": "/a", "offset": "now"}]}),
        json!({"offsets": [{"path": "/a", "offset": "12"}]}),
        json!({"offsets": [{"path": "/a", "offset": "-1"}, {"path": "/b"}]}),
    ] {
        let error = parse_ack(&body).unwrap_err();
        assert_eq!(
            (error.status, error.code),
            (400, "INVALID_REQUEST"),
            "{body}"
        );
    }
}

/// The actions of the exhaustive sequences.
#[derive(Clone, Copy, Debug)]
enum Action {
    Acquire,
    /// Ack with the newest token, `delta` records past the committed offset (may be < 0).
    AckNewest(i8),
    AckTail,
    AckPastTail,
    /// Ack with the token of the epoch before the newest.
    AckPrevious,
    Heartbeat,
    Release,
    Lapse,
}

const ACTIONS: [Action; 10] = [
    Action::Acquire,
    Action::AckNewest(-1),
    Action::AckNewest(0),
    Action::AckNewest(1),
    Action::AckTail,
    Action::AckPastTail,
    Action::AckPrevious,
    Action::Heartbeat,
    Action::Release,
    Action::Lapse,
];

/// Every sequence of up to four actions, from `REGISTERED` and from `READING`: after each
/// step the committed offset never went back nor past the tail, only the newest epoch's
/// holder moved it, and only while its lease ran.
#[test]
fn every_short_sequence_keeps_the_invariants() {
    let mut sequences = 0;
    for from_reading in [false, true] {
        let mut stack: Vec<Vec<Action>> = vec![Vec::new()];
        while let Some(sequence) = stack.pop() {
            check_sequence(&sequence, from_reading);
            sequences += 1;
            if sequence.len() < 4 {
                for action in ACTIONS {
                    let mut longer = sequence.clone();
                    longer.push(action);
                    stack.push(longer);
                }
            }
        }
    }
    assert_eq!(
        sequences,
        2 * (1..=4).map(|n| 10usize.pow(n)).sum::<usize>() + 2
    );
}

fn check_sequence(sequence: &[Action], from_reading: bool) {
    let mut h = Harness::registered();
    let mut tokens: Vec<String> = Vec::new();
    if from_reading {
        tokens.push(h.acquire("t0"));
    }
    for (step, action) in sequence.iter().enumerate() {
        let before = h.consumer();
        let reading = before.is_reading(h.now_ms);
        let committed = before.streams[0].next.map_or(0, |(seq, _)| seq);
        let newest = tokens.last().cloned().unwrap_or_else(|| "0.none".into());
        let answer = match *action {
            Action::Acquire => {
                tokens.push(h.acquire(&format!("t{step}")));
                Ok((200, Value::Null))
            }
            Action::AckNewest(delta) => {
                let seq = (committed as i64 + i64::from(delta)).max(0) as u64;
                h.ack(&newest, "/a", at(seq))
            }
            Action::AckTail => h.ack(&newest, "/a", at(TAIL)),
            Action::AckPastTail => h.ack(&newest, "/a", at(TAIL + 1)),
            Action::AckPrevious => {
                let previous = tokens
                    .len()
                    .checked_sub(2)
                    .map_or("0.none".to_string(), |i| tokens[i].clone());
                let answer = h.ack(&previous, "/a", at(TAIL));
                if tokens.len() >= 2 {
                    assert_eq!(code(&answer), "STALE_EPOCH", "{sequence:?}");
                }
                answer
            }
            Action::Heartbeat => h.run(|r| ack(r, "c", &newest, &Vec::new(), &[])),
            Action::Release => h.run(|r| release(r, "c", &newest)),
            Action::Lapse => {
                h.now_ms += TTL_MS as i64;
                Ok((200, Value::Null))
            }
        };
        let after = h.consumer();
        let moved = after.streams[0].next != before.streams[0].next;
        let next = after.streams[0].next.map_or(0, |(seq, _)| seq);
        assert!(next >= committed, "went back: {sequence:?}");
        assert!(next <= TAIL, "past the tail: {sequence:?}");
        assert!(after.epoch >= before.epoch);
        if moved {
            assert!(reading, "moved while not held: {sequence:?}");
            assert!(answer.is_ok());
        }
        let is_ack = matches!(
            action,
            Action::AckNewest(_) | Action::AckTail | Action::Heartbeat | Action::Release
        );
        if is_ack && !reading {
            assert!(answer.is_err(), "a lapsed holder was served: {sequence:?}");
        }
        if matches!(action, Action::Acquire) {
            assert_eq!(after.epoch, before.epoch + 1);
            assert!(after.is_reading(h.now_ms));
        }
        if matches!(action, Action::Release) && answer.is_ok() {
            assert!(!after.is_reading(h.now_ms));
            assert_eq!(after.streams, before.streams);
        }
    }
}
