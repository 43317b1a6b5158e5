use serde_json::json;

use super::*;
use crate::consumers::view::{render, Dialect};

fn ds_view(h: &Harness) -> Value {
    let outcome = h.run_read(describe).unwrap();
    render(&outcome, "c", Dialect::DurableStreams)
}

const TAIL: u64 = 10;

/// A tail of [`TAIL`] in the live incarnation of `path`, as the harness's catalog holds it.
fn tail(h: &Harness, path: &str) -> Option<Tail> {
    Some(Tail {
        at: (TAIL, 0),
        incarnation: *h.incarnations.get(path)?,
    })
}

/// The live stream ids the harness's catalog starts with.
fn live_streams() -> BTreeMap<String, u64> {
    [("/a", 1), ("/b", 2), ("/c", 3), ("/d", 4)]
        .into_iter()
        .map(|(path, id)| (path.to_string(), id))
        .collect()
}
const TTL_MS: u64 = 1_000;

/// One consumer's stored document and the clock, as the metadata thread would hold them.
struct Harness {
    document: Option<String>,
    now_ms: i64,
    /// The live stream id by each name (what the metadata log holds).
    incarnations: BTreeMap<String, u64>,
}

impl Harness {
    fn registered() -> Harness {
        let mut h = Harness {
            document: None,
            now_ms: 1_000_000,
            incarnations: live_streams(),
        };
        let body = json!({"consumer_id": "c", "streams": ["/a", "/b"], "lease_ttl_ms": TTL_MS});
        let (id, registration) = parse_registration(&body).unwrap();
        let status = h
            .run(|read| register(read, &id, &registration))
            .unwrap()
            .status;
        assert_eq!(status, 201);
        h
    }

    fn read(&self) -> ConsumerRead {
        ConsumerRead {
            wake: None,
            document: self.document.clone(),
            now_ms: self.now_ms,
            scope_count: u64::from(self.document.is_some()),
            incarnations: self.incarnations.clone(),
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
            ConsumerWrite::Put(document) | ConsumerWrite::PutWithWake(document, _) => {
                self.document = Some(document)
            }
            ConsumerWrite::Delete => self.document = None,
        }
        if answer.is_err() {
            assert_eq!(before, self.document);
        }
        answer
    }

    fn run_read(&self, decide: impl FnOnce(ConsumerRead) -> (ConsumerWrite, Answer)) -> Answer {
        decide(self.read()).1
    }

    fn consumer(&self) -> Consumer {
        Consumer::parse(self.document.as_deref().unwrap()).unwrap()
    }

    fn acquire(&mut self, secret: &str) -> String {
        let token = Token::new(secret.to_string());
        let outcome = self.run(|read| acquire(read, None, &token)).unwrap();
        outcome.token.unwrap()
    }

    fn ack(&mut self, token: &str, path: &str, at: Offset) -> Answer {
        let offsets = vec![(path.to_string(), at)];
        let tails = [tail(self, path)];
        self.run(|read| ack(read, token, &offsets, &tails))
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
    let view = ds_view(&h);
    assert_eq!(view["state"], "REGISTERED");
    assert_eq!(view["streams"][0]["offset"], "-1");
    assert_eq!(view["streams"][1]["path"], "/b");
    // The same body again: found, nothing written.
    let body = json!({"consumer_id": "c", "streams": ["/b", "/a"], "lease_ttl_ms": TTL_MS});
    let (id, registration) = parse_registration(&body).unwrap();
    let before = h.document.clone();
    assert_eq!(
        h.run(|r| register(r, &id, &registration)).unwrap().status,
        200
    );
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
    let tails = [tail(&h, "/b"), tail(&h, "/a")];
    let answer = h.run(|r| ack(r, &token, &offsets, &tails));
    assert_eq!(code(&answer), "OFFSET_REGRESSION");
    assert!(answer.unwrap_err().message.contains("/a"));
    assert_eq!(h.consumer().streams[1].next, None, "/b did not move");
    // A stream that does not exist has no room past -1.
    let offsets = vec![("/b".to_string(), at(1))];
    let answer = h.run(|r| ack(r, &token, &offsets, &[None]));
    assert_eq!(code(&answer), "INVALID_OFFSET");
}

fn pico_view(h: &Harness) -> Value {
    render(&h.run_read(describe).unwrap(), "c", Dialect::Pico)
}

#[test]
fn a_stream_deleted_and_created_again_begins_anew_for_its_consumer() {
    let mut h = Harness::registered();
    assert_eq!(h.consumer().streams[0].incarnation, Some(1), "registered");
    let token = h.acquire("s1");
    assert_eq!(code(&h.ack(&token, "/a", at(5))), "OK");
    assert_eq!(code(&h.ack(&token, "/b", at(4))), "OK");
    // /a deleted: its cursor stays as it was until a stream by that name lives again.
    h.incarnations.remove("/a");
    assert_eq!(pico_view(&h)["streams"][0]["offset"], 4);
    assert_eq!(code(&h.ack(&token, "/a", at(6))), "INVALID_OFFSET");
    // Created again: what the cursor counted was the old stream's records.
    h.incarnations.insert("/a".into(), 7);
    let view = pico_view(&h);
    assert_eq!(view["streams"][0]["offset"], -1, "{view}");
    assert_eq!(view["streams"][0]["next_seq"], 0);
    assert_eq!(view["streams"][1]["offset"], 3, "/b kept: {view}");
    assert_eq!(ds_view(&h)["streams"][0]["offset"], "-1");
    // A reader that acquires now starts /a at its beginning, and acks from there.
    let token = h.acquire("s2");
    let cursor = &h.consumer().streams[0];
    assert_eq!((cursor.next, cursor.incarnation), (None, Some(7)));
    assert_eq!(code(&h.ack(&token, "/a", at(1))), "OK");
    let cursor = &h.consumer().streams[0];
    assert_eq!((cursor.next, cursor.incarnation), (Some((1, 0)), Some(7)));
    assert_eq!(h.consumer().streams[1].next, Some((4, 0)));
}

#[test]
fn an_ack_bounded_by_another_incarnation_than_the_logs_is_refused_for_a_retry() {
    let mut h = Harness::registered();
    let token = h.acquire("s1");
    assert_eq!(code(&h.ack(&token, "/a", at(2))), "OK");
    let before = h.document.clone();
    // The owning core answered for a stream created after the log's view (or before it).
    let offsets = vec![("/a".to_string(), at(3))];
    let stale = [Some(Tail {
        at: (TAIL, 0),
        incarnation: 9,
    })];
    let answer = h.run(|r| ack(r, &token, &offsets, &stale));
    assert_eq!(
        answer.as_ref().map_err(|e| (e.status, e.code)).err(),
        Some((503, "UNAVAILABLE"))
    );
    assert_eq!(h.document, before, "nothing written");
}

#[test]
fn cursors_that_know_no_incarnation_take_the_live_one() {
    let mut h = Harness::registered();
    let token = h.acquire("s1");
    assert_eq!(code(&h.ack(&token, "/a", at(5))), "OK");
    // As a build that did not keep incarnations stored it.
    let mut document: Value = serde_json::from_str(h.document.as_deref().unwrap()).unwrap();
    for cursor in document["streams"].as_array_mut().unwrap() {
        cursor.as_object_mut().unwrap().remove("incarnation");
    }
    h.document = Some(document.to_string());
    assert_eq!(
        pico_view(&h)["streams"][0]["offset"],
        4,
        "the position is kept"
    );
    assert_eq!(code(&h.ack(&token, "/a", at(6))), "OK");
    assert_eq!(h.consumer().streams[0].incarnation, Some(1));
    // A stream created after the registration: its cursor learns it from the first change.
    let mut h = Harness::registered();
    h.incarnations.remove("/b");
    h.document = None;
    let body = json!({"consumer_id": "c", "streams": ["/a", "/b"], "lease_ttl_ms": TTL_MS});
    let (id, registration) = parse_registration(&body).unwrap();
    h.run(|read| register(read, &id, &registration)).unwrap();
    assert_eq!(h.consumer().streams[1].incarnation, None);
    h.incarnations.insert("/b".into(), 12);
    let token = h.acquire("s1");
    assert_eq!(h.consumer().streams[1].incarnation, Some(12));
    assert_eq!(code(&h.ack(&token, "/b", at(2))), "OK");
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
    let released = h.run(|r| release(r, &second)).unwrap();
    let released = render(&released, "c", Dialect::DurableStreams);
    assert_eq!(released["state"], "REGISTERED");
    assert_eq!(released["streams"][0]["offset"], offset::format(3, 0));
    assert_eq!(code(&h.ack(&second, "/a", at(4))), "CONSUMER_NOT_READING");
    assert_eq!(
        code(&h.run(|r| release(r, &second))),
        "CONSUMER_NOT_READING"
    );
}

#[test]
fn a_lease_lapses_without_heartbeats_and_an_empty_ack_extends_it() {
    let mut h = Harness::registered();
    let token = h.acquire("s1");
    for _ in 0..5 {
        h.now_ms += (TTL_MS as i64) * 3 / 4;
        let answer = h.run(|r| ack(r, &token, &Vec::new(), &[])).unwrap();
        assert_eq!(
            render(&answer, "c", Dialect::DurableStreams)["state"],
            "READING"
        );
    }
    h.now_ms += TTL_MS as i64;
    assert_eq!(ds_view(&h)["state"], "REGISTERED");
    assert_eq!(code(&h.ack(&token, "/a", at(1))), "CONSUMER_NOT_READING");
    let again = h.acquire("s2");
    assert_eq!(code(&h.ack(&again, "/a", at(1))), "OK");
}

#[test]
fn unknown_consumers_are_not_found() {
    let mut h = Harness {
        document: None,
        now_ms: 0,
        incarnations: live_streams(),
    };
    assert_eq!(code(&h.run(describe)), "CONSUMER_NOT_FOUND");
    assert_eq!(code(&h.run(delete)), "CONSUMER_NOT_FOUND");
    let token = Token::new("x".into());
    assert_eq!(
        code(&h.run(|r| acquire(r, None, &token))),
        "CONSUMER_NOT_FOUND"
    );
    assert_eq!(code(&h.ack("1.x", "/a", at(0))), "CONSUMER_NOT_FOUND");
    assert_eq!(code(&h.run(|r| release(r, "1.x"))), "CONSUMER_NOT_FOUND");
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
                Ok(None)
            }
            Action::AckNewest(delta) => {
                let seq = (committed as i64 + i64::from(delta)).max(0) as u64;
                h.ack(&newest, "/a", at(seq)).map(Some)
            }
            Action::AckTail => h.ack(&newest, "/a", at(TAIL)).map(Some),
            Action::AckPastTail => h.ack(&newest, "/a", at(TAIL + 1)).map(Some),
            Action::AckPrevious => {
                let previous = tokens
                    .len()
                    .checked_sub(2)
                    .map_or("0.none".to_string(), |i| tokens[i].clone());
                let answer = h.ack(&previous, "/a", at(TAIL));
                if tokens.len() >= 2 {
                    assert_eq!(code(&answer), "STALE_EPOCH", "{sequence:?}");
                }
                answer.map(Some)
            }
            Action::Heartbeat => h.run(|r| ack(r, &newest, &Vec::new(), &[])).map(Some),
            Action::Release => h.run(|r| release(r, &newest)).map(Some),
            Action::Lapse => {
                h.now_ms += TTL_MS as i64;
                Ok(None)
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

/// A group of four streams and the tokens of its members' incarnations.
struct Group {
    h: Harness,
    tokens: std::collections::BTreeMap<&'static str, Vec<String>>,
    joins: u32,
}

impl Group {
    fn new() -> Group {
        let mut h = Harness {
            document: None,
            now_ms: 1_000_000,
            incarnations: live_streams(),
        };
        let registration = Registration {
            streams: ["/a", "/b", "/c", "/d"].map(String::from).to_vec(),
            lease_ttl_ms: Some(TTL_MS),
            group: true,
        };
        h.run(|r| register(r, "g", &registration)).unwrap();
        Group {
            h,
            tokens: Default::default(),
            joins: 0,
        }
    }

    fn join(&mut self, member: &'static str) -> Outcome {
        self.joins += 1;
        let token = Token::new(format!("s{}", self.joins));
        let outcome = self.h.run(|r| acquire(r, Some(member), &token)).unwrap();
        self.tokens
            .entry(member)
            .or_default()
            .push(outcome.token.clone().unwrap());
        outcome
    }

    fn token(&self, member: &str) -> String {
        self.tokens
            .get(member)
            .and_then(|t| t.last().cloned())
            .unwrap_or_else(|| "0.none".into())
    }

    fn held(&self, member: &str) -> Vec<String> {
        self.h
            .consumer()
            .streams
            .iter()
            .filter(|s| s.holder.as_deref() == Some(member))
            .map(|s| s.path.clone())
            .collect()
    }
}

#[test]
fn a_group_spreads_its_streams_and_moves_them_on_join_and_leave() {
    let mut g = Group::new();
    let a = g.join("a");
    assert_eq!(a.member.as_deref(), Some("a"));
    assert_eq!(g.held("a").len(), 4);
    g.join("b");
    assert_eq!((g.held("a").len(), g.held("b").len()), (2, 2));
    // a kept two of its four: only two changed hands (epoch 2), two stayed at epoch 1.
    let epochs: Vec<u64> = g.h.consumer().streams.iter().map(|s| s.epoch).collect();
    assert_eq!(epochs.iter().filter(|e| **e == 2).count(), 2, "{epochs:?}");
    g.join("c");
    let counts = [g.held("a").len(), g.held("b").len(), g.held("c").len()];
    assert_eq!(counts.iter().sum::<usize>(), 4);
    assert!(counts.iter().all(|c| (1..=2).contains(c)), "{counts:?}");
    // b leaves: its streams go to a and c.
    let b_token = g.token("b");
    g.h.run(|r| release(r, &b_token)).unwrap();
    assert_eq!((g.held("a").len(), g.held("c").len()), (2, 2));
    assert_eq!(code(&g.h.ack(&b_token, "/a", Offset::Start)), "STALE_EPOCH");
    // A member acks only what it holds.
    let a_stream = g.held("a")[0].clone();
    let c_stream = g.held("c")[0].clone();
    let a_token = g.token("a");
    assert_eq!(code(&g.h.ack(&a_token, &a_stream, at(3))), "OK");
    assert_eq!(code(&g.h.ack(&a_token, &c_stream, at(3))), "STALE_EPOCH");
    // a rejoins (a restart): its old incarnation's token is stale.
    g.join("a");
    assert_eq!(code(&g.h.ack(&a_token, &a_stream, at(4))), "STALE_EPOCH");
    // c goes silent: the next change drops it and a holds everything.
    g.h.now_ms += TTL_MS as i64 / 2;
    let fresh = g.token("a");
    let beat = g.h.run(|r| ack(r, &fresh, &Vec::new(), &[])).unwrap();
    assert_eq!(beat.member.as_deref(), Some("a"));
    g.h.now_ms += TTL_MS as i64 * 3 / 4;
    g.h.run(|r| ack(r, &fresh, &Vec::new(), &[])).unwrap();
    assert_eq!(g.held("a").len(), 4);
    assert!(g.h.consumer().members.iter().all(|m| m.id == "a"));
    // A group is joined by a named member.
    let token = Token::new("x".into());
    assert_eq!(
        code(&g.h.run(|r| acquire(r, None, &token))),
        "INVALID_REQUEST"
    );
}

#[derive(Clone, Copy, Debug)]
enum GroupAction {
    Join(&'static str),
    /// The member acks, for every stream it holds, one record further.
    AckHeld(&'static str),
    /// The member acks a stream it does not hold.
    AckOther(&'static str),
    /// The member's previous incarnation acks.
    AckStale(&'static str),
    Leave(&'static str),
    Tick,
}

const GROUP_ACTIONS: [GroupAction; 9] = [
    GroupAction::Join("a"),
    GroupAction::Join("b"),
    GroupAction::Join("c"),
    GroupAction::AckHeld("a"),
    GroupAction::AckHeld("b"),
    GroupAction::AckOther("a"),
    GroupAction::AckStale("a"),
    GroupAction::Leave("b"),
    GroupAction::Tick,
];

/// Every sequence of up to four group actions: a stream is held by at most one live member,
/// acks move only streams their member holds under its current incarnation, offsets never go
/// back, every hand-over bumps the stream's epoch, and after every change the live members
/// hold shares that differ by one at most.
#[test]
fn every_short_group_sequence_keeps_the_invariants() {
    let mut sequences = 0;
    let mut stack: Vec<Vec<GroupAction>> = vec![Vec::new()];
    while let Some(sequence) = stack.pop() {
        check_group_sequence(&sequence);
        sequences += 1;
        if sequence.len() < 4 {
            for action in GROUP_ACTIONS {
                let mut longer = sequence.clone();
                longer.push(action);
                stack.push(longer);
            }
        }
    }
    assert_eq!(sequences, (0..=4).map(|n| 9usize.pow(n)).sum::<usize>());
}

fn check_group_sequence(sequence: &[GroupAction]) {
    let mut g = Group::new();
    for action in sequence {
        let before = g.h.consumer();
        let now = g.h.now_ms;
        let answer = match *action {
            GroupAction::Join(m) => Ok(Some(g.join(m))),
            GroupAction::AckHeld(m) => {
                let offsets: AckOffsets = g
                    .held(m)
                    .into_iter()
                    .map(|path| {
                        let next = before.streams.iter().find(|s| s.path == path).unwrap().next;
                        (path, at(next.map_or(0, |(seq, _)| seq) + 1))
                    })
                    .collect();
                let tails: Vec<_> = offsets.iter().map(|(path, _)| tail(&g.h, path)).collect();
                let token = g.token(m);
                g.h.run(|r| ack(r, &token, &offsets, &tails)).map(Some)
            }
            GroupAction::AckOther(m) => {
                let other = before
                    .streams
                    .iter()
                    .find(|s| s.holder.as_deref() != Some(m))
                    .map(|s| s.path.clone());
                match other {
                    Some(path) => {
                        let answer = g.h.ack(&g.token(m), &path, at(TAIL));
                        assert!(answer.is_err(), "{sequence:?}");
                        answer.map(Some)
                    }
                    None => Ok(None),
                }
            }
            GroupAction::AckStale(m) => {
                let tokens = g.tokens.get(m).cloned().unwrap_or_default();
                match tokens.len().checked_sub(2).map(|i| tokens[i].clone()) {
                    Some(stale) => {
                        let answer = g.h.ack(&stale, "/a", at(TAIL));
                        assert_eq!(code(&answer), "STALE_EPOCH", "{sequence:?}");
                        answer.map(Some)
                    }
                    None => Ok(None),
                }
            }
            GroupAction::Leave(m) => {
                let token = g.token(m);
                g.h.run(|r| release(r, &token)).map(Some)
            }
            GroupAction::Tick => {
                g.h.now_ms += TTL_MS as i64 * 3 / 5;
                Ok(None)
            }
        };
        let after = g.h.consumer();
        for (old, new) in before.streams.iter().zip(&after.streams) {
            assert!(new.next >= old.next, "went back: {sequence:?}");
            if new.holder != old.holder {
                assert!(
                    new.epoch > old.epoch,
                    "a hand-over kept its epoch: {sequence:?}"
                );
            }
            if new.next != old.next {
                // Only the holder moved it, under a live incarnation.
                let GroupAction::AckHeld(m) = action else {
                    panic!("moved by {action:?}: {sequence:?}");
                };
                assert_eq!(old.holder.as_deref(), Some(*m), "{sequence:?}");
                let member = before.members.iter().find(|x| x.id == *m).unwrap();
                assert!(member.lease_expires_ms > now, "{sequence:?}");
            }
            if let Some(holder) = &new.holder {
                assert!(
                    after.members.iter().any(|m| &m.id == holder),
                    "held by a non-member: {sequence:?}"
                );
            }
        }
        if matches!(answer, Ok(Some(_))) && after != before {
            let live: Vec<&Member> = after.members.iter().collect();
            if !live.is_empty() {
                let shares: Vec<usize> = live
                    .iter()
                    .map(|m| {
                        after
                            .streams
                            .iter()
                            .filter(|s| s.holder.as_deref() == Some(&m.id))
                            .count()
                    })
                    .collect();
                let (min, max) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
                assert!(max - min <= 1, "unbalanced {shares:?}: {sequence:?}");
                assert_eq!(
                    shares.iter().sum::<usize>(),
                    after.streams.len(),
                    "{sequence:?}"
                );
            }
        }
    }
}
