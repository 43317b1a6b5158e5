//! A named consumer's wake webhook: its stored form, the rules that set it and that start a
//! wake, and the body its receiver gets. The service that watches appends and delivers is
//! `waker.rs`.
//!
//! Stored in the metadata log next to the document (`consumers.wake`, JSON):
//!
//! ```text
//! {"type": "webhook",
//!  "url": "https://receiver.example/hook",                     where wakes are POSTed
//!  "callback": "https://node/v1/stream/__ds/consumers/c1/ack"}  where the receiver acks
//! ```
//!
//! A wake is an acquire made for the receiver: when an append leaves one of the consumer's
//! streams past its committed offset and no lease runs, the node takes a new epoch (as
//! `acquire` does, in the same transaction that checks both) and POSTs the token to the URL:
//!
//! ```text
//! {"consumer_id": "c1", "primary_stream": "/v1/stream/a", "token": "<epoch>.<secret>",
//!  "callback": "<ack URL>", "epoch": 7, "lease_ttl_ms": 30000,
//!  "streams": [{"path": "/v1/stream/a", "offset": "<committed>"}, ...]}
//! ```
//!
//! The receiver reads from the committed offsets, acks with the token and releases (or lets
//! the lease lapse); a running lease means someone reads, so appends meanwhile wake nobody.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use pico_meta::{ConsumerRead, ConsumerWrite, SeenStream};

use super::rules::{offset_text, stored, Answer, Consumer, ConsumerError, Holder, Outcome, Token};

/// The longest wake URL accepted.
pub const WAKE_URL_BYTES_MAX: usize = 2048;

/// A consumer's wake webhook as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wake {
    #[serde(rename = "type")]
    pub kind: String,
    pub url: String,
    pub callback: String,
}

impl Wake {
    pub fn parse(stored: &str) -> Option<Wake> {
        serde_json::from_str(stored).ok()
    }

    pub fn stored(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// How a consumer's view shows it.
    pub fn view(stored: &str) -> Value {
        match Wake::parse(stored) {
            Some(wake) => json!({"type": wake.kind, "url": wake.url}),
            None => Value::Null,
        }
    }
}

/// The URL of a `PUT …/wake` body `{"type": "webhook", "url": URL}`, checked for shape here
/// and against the webhook URL policy by the caller.
pub fn parse_request(body: &Value) -> Result<String, ConsumerError> {
    match body.get("type").and_then(Value::as_str) {
        Some("webhook") => {}
        Some(other) => {
            return Err(ConsumerError::invalid(format!(
                "unknown wake type {other:?}: \"webhook\""
            )))
        }
        None => return Err(ConsumerError::invalid("type (\"webhook\") is required")),
    }
    let url = body
        .get("url")
        .and_then(Value::as_str)
        .ok_or_else(|| ConsumerError::invalid("url (a string) is required"))?;
    if url.len() > WAKE_URL_BYTES_MAX {
        return Err(ConsumerError::invalid(format!(
            "url is longer than {WAKE_URL_BYTES_MAX} bytes"
        )));
    }
    Ok(url.to_string())
}

/// Sets (`Some`) or removes (`None`) the consumer's wake webhook; the document is unchanged.
pub fn set(read: ConsumerRead, wake: Option<Wake>) -> (ConsumerWrite, Answer) {
    let consumer = match stored(&read) {
        Ok(consumer) => consumer,
        Err(e) => return (ConsumerWrite::Keep, Err(e)),
    };
    if consumer.group && wake.is_some() {
        return (
            ConsumerWrite::Keep,
            Err(ConsumerError::invalid(
                "wake webhooks serve single-reader consumers: a group's members join it themselves",
            )),
        );
    }
    let stored_wake = wake.as_ref().map(Wake::stored);
    let outcome = Outcome {
        status: 200,
        consumer: Some(consumer.clone()),
        token: None,
        member: None,
        now_ms: read.now_ms,
        wake: stored_wake.clone(),
    };
    let write = if stored_wake == read.wake {
        ConsumerWrite::Keep
    } else {
        ConsumerWrite::PutWithWake(consumer.document(), stored_wake)
    };
    (write, Ok(outcome))
}

/// What an attempt to wake a consumer found.
#[derive(Debug)]
pub enum Start {
    /// A new epoch was taken for the receiver: POST `body` to `wake.url`.
    Woken {
        epoch: u64,
        body: String,
        wake: Wake,
        consumer: Consumer,
    },
    /// A lease runs: its holder reads.
    Held(Consumer),
    /// Nothing past the committed offsets of the streams the waker knows of.
    Idle(Consumer),
    /// No such consumer, or it has no wake (any more).
    Gone,
}

/// Wakes consumer `id` when one of `tails` (the tails its waker serves) is past the committed
/// offset and no lease runs: a new epoch whose token is
/// `token`, as `acquire` takes one. The node reading the tails knows them; this transaction
/// decides against the stored consumer, so two nodes waking one consumer at once make one
/// wake.
pub fn start(
    read: ConsumerRead,
    id: &str,
    tails: &[(String, KnownTail)],
    token: &Token,
) -> (ConsumerWrite, Start) {
    let Some(wake) = read.wake.as_deref().and_then(Wake::parse) else {
        return (ConsumerWrite::Keep, Start::Gone);
    };
    let Ok(mut consumer) = stored(&read) else {
        return (ConsumerWrite::Keep, Start::Gone);
    };
    let now_ms = read.now_ms;
    if consumer.group {
        return (ConsumerWrite::Keep, Start::Gone);
    }
    if consumer.is_reading(now_ms) {
        return (ConsumerWrite::Keep, Start::Held(consumer));
    }
    let Some(primary) = pending_stream(&consumer, tails) else {
        return (ConsumerWrite::Keep, Start::Idle(consumer));
    };
    let Some(epoch) = consumer.epoch.checked_add(1) else {
        return (ConsumerWrite::Keep, Start::Idle(consumer));
    };
    consumer.epoch = epoch;
    consumer.holder = Some(Holder {
        token_sha256: token.digest_for(epoch),
        lease_expires_ms: consumer.lease_until(now_ms),
    });
    let body = json!({
        "consumer_id": id,
        "primary_stream": primary,
        "token": token.text_for(epoch),
        "callback": wake.callback,
        "epoch": epoch,
        "lease_ttl_ms": consumer.lease_ttl_ms,
        "streams": consumer.streams.iter()
            .map(|s| json!({"path": s.path, "offset": offset_text(s.next)}))
            .collect::<Vec<_>>(),
    })
    .to_string();
    (
        ConsumerWrite::Put(consumer.document()),
        Start::Woken {
            epoch,
            body,
            wake,
            consumer,
        },
    )
}

/// A followed stream's tail as a node last saw it: its record count, and the id of the stream
/// (the incarnation of its name) that count is of; `None` when there was no stream (count 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownTail {
    pub records: u64,
    pub incarnation: Option<u64>,
}

/// The first stream of the consumer (in registration order) whose tail in `tails` is past
/// its committed offset. A tail of a later stream of the name than the cursor's is all work (a
/// node that did not see the delete still holds the old cursor), one of an earlier stream says
/// nothing of the cursor's ([`SeenStream`]).
pub fn pending_stream(consumer: &Consumer, tails: &[(String, KnownTail)]) -> Option<String> {
    consumer.streams.iter().find_map(|cursor| {
        let (_, tail) = tails.iter().find(|(path, _)| *path == cursor.path)?;
        let next = match SeenStream::compare(cursor.incarnation, tail.incarnation) {
            SeenStream::Later => 0,
            SeenStream::Earlier => return None,
            SeenStream::Same => cursor.next.map_or(0, |(seq, _)| seq),
        };
        (next < tail.records).then(|| cursor.path.clone())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumers::rules::{self, parse_registration};

    const NOW: i64 = 1_000_000;

    fn registered(wake: bool) -> ConsumerRead {
        let body = json!({"consumer_id": "c", "streams": ["/s/a", "/s/b"], "lease_ttl_ms": 1000});
        let (id, registration) = parse_registration(&body).unwrap();
        let empty = ConsumerRead {
            document: None,
            wake: None,
            now_ms: NOW,
            scope_count: 0,
            incarnations: Default::default(),
        };
        let (write, answer) = rules::register(empty, &id, &registration);
        answer.unwrap();
        let ConsumerWrite::Put(document) = write else {
            panic!("register writes")
        };
        ConsumerRead {
            document: Some(document),
            wake: wake.then(|| {
                Wake {
                    kind: "webhook".into(),
                    url: "http://127.0.0.1:9/hook".into(),
                    callback: "http://127.0.0.1:1/__ds/consumers/c/ack".into(),
                }
                .stored()
            }),
            now_ms: NOW,
            scope_count: 1,
            incarnations: Default::default(),
        }
    }

    fn token() -> Token {
        Token::new("secret".into())
    }

    fn seen(records: u64, incarnation: Option<u64>) -> KnownTail {
        KnownTail {
            records,
            incarnation,
        }
    }

    #[test]
    fn a_tail_counts_against_a_cursor_of_its_own_incarnation_and_is_all_work_for_an_earlier_one() {
        let mut consumer = Consumer::parse(&registered(true).document.unwrap()).unwrap();
        let cursor = &mut consumer.streams[0];
        cursor.next = Some((5, 50));
        cursor.incarnation = Some(7);
        let path = cursor.path.clone();
        let pending = |consumer: &Consumer, records, incarnation| {
            pending_stream(consumer, &[(path.clone(), seen(records, incarnation))])
        };
        // The same incarnation: past the committed offset or not.
        assert_eq!(pending(&consumer, 5, Some(7)), None);
        assert_eq!(pending(&consumer, 6, Some(7)), Some(path.clone()));
        // A later incarnation (the name created again): its first record is work, however
        // short it is of where the cursor stood in the old one.
        assert_eq!(pending(&consumer, 1, Some(8)), Some(path.clone()));
        assert_eq!(pending(&consumer, 0, Some(8)), None);
        // An earlier incarnation's tail (a node that did not see the delete): no work.
        assert_eq!(pending(&consumer, 9, Some(6)), None);
        // No stream, or a cursor or tail whose incarnation is not known: the counts alone.
        assert_eq!(pending(&consumer, 0, None), None);
        assert_eq!(pending(&consumer, 6, None), Some(path.clone()));
        consumer.streams[0].incarnation = None;
        assert_eq!(pending(&consumer, 5, Some(8)), None);
        assert_eq!(pending(&consumer, 6, Some(8)), Some(path.clone()));
    }

    #[test]
    fn a_wake_takes_a_new_epoch_only_with_work_pending_and_no_lease() {
        let tails = [("/s/b".to_string(), seen(3, None))];
        let (write, start) = start(registered(true), "c", &tails, &token());
        let Start::Woken {
            epoch,
            body,
            consumer,
            ..
        } = start
        else {
            panic!("{start:?}")
        };
        assert_eq!(epoch, 1);
        assert!(consumer.is_reading(NOW));
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["primary_stream"], "/s/b");
        assert_eq!(body["token"], "1.secret");
        assert_eq!(body["callback"], "http://127.0.0.1:1/__ds/consumers/c/ack");
        let ConsumerWrite::Put(document) = write else {
            panic!("a wake writes the new holder")
        };
        // The lease now runs: another append wakes nobody until it ends.
        let held = ConsumerRead {
            document: Some(document),
            ..registered(true)
        };
        let (write, start) = super::start(held, "c", &tails, &token());
        assert!(matches!(start, Start::Held(_)) && write == ConsumerWrite::Keep);
    }

    #[test]
    fn nothing_past_the_committed_offsets_or_no_wake_wakes_nobody() {
        let (write, start) = start(
            registered(true),
            "c",
            &[("/s/a".into(), seen(0, None))],
            &token(),
        );
        assert!(matches!(start, Start::Idle(_)) && write == ConsumerWrite::Keep);
        let (_, start) = super::start(
            registered(true),
            "c",
            &[("/s/x".into(), seen(5, None))],
            &token(),
        );
        assert!(matches!(start, Start::Idle(_)));
        let (write, start) = super::start(
            registered(false),
            "c",
            &[("/s/a".into(), seen(5, None))],
            &token(),
        );
        assert!(matches!(start, Start::Gone) && write == ConsumerWrite::Keep);
    }

    #[test]
    fn setting_a_wake_keeps_the_document_and_refuses_groups() {
        let wake = Wake {
            kind: "webhook".into(),
            url: "http://127.0.0.1:9/hook".into(),
            callback: "cb".into(),
        };
        let read = registered(false);
        let document = read.document.clone().unwrap();
        let (write, answer) = set(read, Some(wake.clone()));
        assert_eq!(
            write,
            ConsumerWrite::PutWithWake(document, Some(wake.stored()))
        );
        assert_eq!(answer.unwrap().wake, Some(wake.stored()));
        // The same wake again writes nothing; removing it writes `None`.
        let again = ConsumerRead {
            wake: Some(wake.stored()),
            ..registered(false)
        };
        assert_eq!(set(again, Some(wake.clone())).0, ConsumerWrite::Keep);
        let (write, _) = set(registered(true), None);
        assert!(matches!(write, ConsumerWrite::PutWithWake(_, None)));
        let missing = ConsumerRead {
            document: None,
            wake: None,
            now_ms: NOW,
            scope_count: 0,
            incarnations: Default::default(),
        };
        assert_eq!(set(missing, Some(wake)).1.unwrap_err().status, 404);
    }

    #[test]
    fn wake_requests_are_checked() {
        assert_eq!(
            parse_request(&json!({"type": "webhook", "url": "https://x/"})).unwrap(),
            "https://x/"
        );
        for bad in [
            json!({"url": "https://x/"}),
            json!({"type": "email", "url": "https://x/"}),
            json!({"type": "webhook"}),
            json!({"type": "webhook", "url": 5}),
            json!({"type": "webhook", "url": "x".repeat(WAKE_URL_BYTES_MAX + 1)}),
        ] {
            assert_eq!(parse_request(&bad).unwrap_err().status, 400, "{bad}");
        }
    }
}
