//! Tests of the registry's state machine: configuration, wakes, leases, fencing, back-off and
//! restore, each driven by a `Clock` without a server.

use std::time::Duration;

use ring::rand::SystemRandom;

use super::*;
use crate::limits::LEASE_TTL_MS_DEFAULT;

proptest::proptest! {
    #![proptest_config(crate::fuzzing::config())]
    #[test]
    fn fuzz_subscription_body(body in crate::fuzzing::inputs("subscription_body")) {
        if let Ok(value) = serde_json::from_slice::<Value>(&body) {
            let _ = parse_config(&value);
            let _ = parse_ack_request(&value);
            let _ = parse_streams(&value["streams"]);
            if let Some(path) = value["path"].as_str() {
                let _ = normalize_path(path);
            }
        }
    }
}

const ROOT: &str = "/v1/stream/";
/// The registry key of subscription "s" under `ROOT`.
const S: &str = "/v1/stream/s";
const P: &str = "/v1/stream/p";
const BASE: &str = "http://127.0.0.1:4437/v1/stream/";

fn offset(n: u64) -> String {
    crate::ds::format_offset(n, 0)
}

/// The tail `offset(n)` of the stream whose id is [`STREAM_ID`].
fn seen(n: u64) -> StreamTail {
    StreamTail {
        offset: offset(n),
        stream_id: Some(STREAM_ID),
    }
}

/// The id of the stream the tests' writes report.
const STREAM_ID: u64 = 7;

fn registry() -> Registry {
    Registry::new(TokenKey::generate(&SystemRandom::new()).unwrap())
}

fn config(body: Value) -> Config {
    parse_config(&body).unwrap()
}

fn webhook(lease: u64) -> Config {
    config(json!({"type": "webhook", "pattern": "events/*",
        "webhook": {"url": "http://127.0.0.1:9/hook"}, "lease_ttl_ms": lease}))
}

fn pull(lease: u64) -> Config {
    config(json!({"type": "pull-wake", "pattern": "events/*",
        "wake_stream": "wake/pool", "lease_ttl_ms": lease}))
}

fn job_of(effects: &[Effect]) -> (Job, Value) {
    let jobs: Vec<&Job> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Deliver(job) => Some(job),
            _ => None,
        })
        .collect();
    assert_eq!(jobs.len(), 1, "{effects:?}");
    let body = serde_json::from_str(&jobs[0].body).unwrap();
    (jobs[0].clone(), body)
}

fn ack_request(body: &Value, path: &str, offset: &str, done: bool) -> AckRequest {
    AckRequest {
        wake_id: body["wake_id"].as_str().map(str::to_string),
        generation: body["generation"].as_u64(),
        acks: vec![(path.to_string(), offset.to_string())],
        done,
    }
}

#[test]
fn config_parsing_and_defaults() {
    let c = webhook(1000);
    assert_eq!(c.kind, Kind::Webhook);
    assert_eq!(c.pattern.as_deref(), Some("events/*"));
    assert_eq!(c.lease_ttl_ms, 1000);
    let c = config(json!({"type": "pull-wake", "streams": ["/a/", "b"], "wake_stream": "w"}));
    assert_eq!(c.lease_ttl_ms, LEASE_TTL_MS_DEFAULT);
    assert_eq!(c.streams.iter().collect::<Vec<_>>(), ["a", "b"]);
    for bad in [
        json!([]),
        json!({"type": "x", "pattern": "a/*"}),
        json!({"type": "webhook", "webhook": {"url": "http://localhost/"}}),
        json!({"type": "webhook", "pattern": "a/*"}),
        json!({"type": "pull-wake", "pattern": "a/*"}),
        json!({"type": "pull-wake", "pattern": "a/*", "wake_stream": "w", "lease_ttl_ms": 10}),
        json!({"type": "pull-wake", "pattern": "a*", "wake_stream": "w"}),
        json!({"type": "pull-wake", "streams": ["a/../b"], "wake_stream": "w"}),
        json!({"type": "pull-wake", "streams": ["__ds/x"], "wake_stream": "w"}),
        json!({"type": "pull-wake", "streams": [1], "wake_stream": "w"}),
    ] {
        assert!(parse_config(&bad).is_err(), "{bad}");
    }
    let too_many: Vec<String> = (0..=STREAMS_PER_SUBSCRIPTION_MAX)
        .map(|i| format!("s{i}"))
        .collect();
    let err = parse_config(&json!({"type": "pull-wake", "streams": too_many, "wake_stream": "w"}))
        .unwrap_err();
    assert_eq!(err.code, "LIMIT_EXCEEDED");
}

#[test]
fn create_confirms_identical_and_rejects_different_config() {
    let mut reg = registry();
    let clock = Clock::now();
    assert_eq!(
        reg.create("s", ROOT, ROOT, BASE, webhook(1000), vec![], clock),
        Ok(true)
    );
    assert_eq!(
        reg.create("s", ROOT, ROOT, BASE, webhook(1000), vec![], clock),
        Ok(false)
    );
    let err = reg
        .create("s", ROOT, ROOT, BASE, webhook(2000), vec![], clock)
        .unwrap_err();
    assert_eq!((err.status, err.code), (409, "SUBSCRIPTION_ALREADY_EXISTS"));
    let described = reg.describe(S, "ds_k", "http://x/jwks").unwrap();
    assert_eq!(described["id"], "s");
    assert_eq!(described["type"], "webhook");
    assert_eq!(described["webhook"]["signing"]["kid"], "ds_k");
    assert!(described.get("webhook_secret").is_none());
    assert!(described.get("wake_stream").is_none());
}

#[test]
fn subscription_count_is_bounded() {
    let mut reg = registry();
    let clock = Clock::now();
    // Spread over scopes so that only the node's limit applies.
    let scopes = SUBSCRIPTIONS_PER_NODE_MAX / SUBSCRIPTIONS_PER_SCOPE_MAX;
    for i in 0..SUBSCRIPTIONS_PER_NODE_MAX {
        let scope = format!("/t{}/", i % scopes);
        reg.create(
            &format!("s{i}"),
            ROOT,
            &scope,
            BASE,
            webhook(1000),
            vec![],
            clock,
        )
        .unwrap();
    }
    let err = reg
        .create(
            "one-more",
            ROOT,
            "/other/",
            BASE,
            webhook(1000),
            vec![],
            clock,
        )
        .unwrap_err();
    assert_eq!((err.status, err.code), (429, "LIMIT_EXCEEDED"));
    assert!(
        err.message.contains("this node holds at most"),
        "{}",
        err.message
    );
}

/// One tenant (scope) cannot take every subscription of the node.
#[test]
fn one_scope_holds_at_most_its_share() {
    let mut reg = registry();
    let clock = Clock::now();
    for i in 0..SUBSCRIPTIONS_PER_SCOPE_MAX {
        // Under several roots of one grant: they count together.
        let root = format!("/a/r{}/", i % 3);
        reg.create(
            &format!("s{i}"),
            &root,
            "/a/",
            BASE,
            webhook(1000),
            vec![],
            clock,
        )
        .unwrap();
    }
    let err = reg
        .create("more", "/a/", "/a/", BASE, webhook(1000), vec![], clock)
        .unwrap_err();
    assert_eq!((err.status, err.code), (429, "LIMIT_EXCEEDED"));
    assert!(err.message.contains("under /a/"), "{}", err.message);
    // Another tenant still can.
    reg.create("more", "/b/", "/b/", BASE, webhook(1000), vec![], clock)
        .unwrap();
    // A deleted one makes room again.
    assert!(reg.delete("/a/r0/s0"));
    reg.create("more", "/a/", "/a/", BASE, webhook(1000), vec![], clock)
        .unwrap();
}

/// The same id under two roots names two subscriptions, each reachable only
/// by its own key.
#[test]
fn subscriptions_belong_to_their_root() {
    let mut reg = registry();
    let clock = Clock::now();
    assert_eq!(
        reg.create("x", "/a/", "/a/", BASE, webhook(1000), vec![], clock),
        Ok(true)
    );
    // Not "already exists with a different configuration": /b/ learns nothing of /a/'s ids.
    assert_eq!(
        reg.create("x", "/b/", "/b/", BASE, webhook(2000), vec![], clock),
        Ok(true)
    );
    assert_eq!(
        reg.describe("/a/x", "k", "u").unwrap()["lease_ttl_ms"],
        1000
    );
    assert_eq!(
        reg.describe("/b/x", "k", "u").unwrap()["lease_ttl_ms"],
        2000
    );
    assert!(reg.describe("x", "k", "u").is_none());
    assert!(reg.delete("/b/x"));
    assert!(reg.describe("/a/x", "k", "u").is_some());
    // The snapshot keeps them apart too.
    reg.create("x", "/b/", "/b/", BASE, webhook(2000), vec![], clock)
        .unwrap();
    let restored = Registry::restore(
        &reg.snapshot(),
        TokenKey::from_secret(*reg.tokens().secret()),
    )
    .unwrap();
    assert_eq!(restored.len(), 2);
    assert_eq!(
        restored.describe("/b/x", "k", "u").unwrap()["lease_ttl_ms"],
        2000
    );
}

#[test]
fn webhook_done_reply_acks_the_snapshot() {
    let mut reg = registry();
    let clock = Clock::now();
    reg.create("s", ROOT, ROOT, BASE, webhook(1000), vec![], clock)
        .unwrap();
    assert!(!reg.interested("/v1/stream/other/x"));
    assert!(!reg.interested("/v1/stream/__ds/x"));
    assert!(reg.interested("/v1/stream/events/x"));
    let effects = reg.on_write("/v1/stream/events/x", &seen(1), clock);
    let (job, body) = job_of(&effects);
    assert_eq!(body["subscription_id"], "s");
    assert_eq!(body["generation"], 1);
    assert_eq!(
        body["callback_url"],
        "http://127.0.0.1:4437/v1/stream/__ds/subscriptions/s/callback"
    );
    assert_eq!(body["streams"][0]["path"], "events/x");
    assert_eq!(body["streams"][0]["tail_offset"], offset(1));
    assert_eq!(body["streams"][0]["has_pending"], true);
    // A second write while the wake is out starts nothing new.
    assert!(reg
        .on_write("/v1/stream/events/x", &seen(2), clock)
        .is_empty());
    // `done` acks what the wake announced; the second write is still pending, so the next
    // wake goes out at once.
    let effects = reg.delivery_result(&job, Outcome::Done, clock);
    let (next, body) = job_of(&effects);
    assert_eq!(next.generation, 2);
    assert_eq!(body["streams"][0]["acked_offset"], offset(1));
    assert_eq!(body["streams"][0]["tail_offset"], offset(2));
    // The late result of the first wake changes nothing.
    assert!(reg.delivery_result(&job, Outcome::Done, clock).is_empty());
    assert!(reg.delivery_result(&next, Outcome::Done, clock).is_empty());
    let described = reg.describe(S, "k", "u").unwrap();
    assert_eq!(described["streams"][0]["acked_offset"], offset(2));
    assert_eq!(described["streams"][0]["link_type"], "glob");
    assert_eq!(described["status"], "active");
}

fn token_of(body: &Value, field: &str) -> String {
    body[field].as_str().unwrap().to_string()
}

#[test]
fn callback_acks_then_fences_the_finished_generation() {
    let mut reg = registry();
    let clock = Clock::now();
    reg.create("s", ROOT, ROOT, BASE, webhook(1000), vec![], clock)
        .unwrap();
    let (job, body) = job_of(&reg.on_write("/v1/stream/events/x", &seen(1), clock));
    assert!(reg
        .delivery_result(&job, Outcome::Accepted, clock)
        .is_empty());
    let token = token_of(&body, "callback_token");
    let done = ack_request(&body, "events/x", &offset(1), true);
    let mut effects = Vec::new();
    let settle = |reg: &mut Registry, req: &AckRequest, token: &str, fx: &mut Vec<Effect>| {
        reg.settle(S, Kind::Webhook, token, req, clock, fx)
    };
    // Bad acks are refused as a whole and leave the wake open.
    for (path, off) in [
        ("events/y", offset(1)),
        ("events/x", offset(2)),
        ("events/x", "-1".into()),
    ] {
        let req = ack_request(&body, path, &off, true);
        let err = settle(&mut reg, &req, &token, &mut effects).unwrap_err();
        assert_eq!(
            (err.status, err.code),
            (409, "INVALID_OFFSET"),
            "{path} {off}"
        );
    }
    let err = settle(&mut reg, &done, "garbage", &mut effects).unwrap_err();
    assert_eq!((err.status, err.code), (401, "TOKEN_INVALID"));
    let mut wrong_wake = done.clone();
    wrong_wake.wake_id = Some("w_other".into());
    assert_eq!(
        settle(&mut reg, &wrong_wake, &token, &mut effects)
            .unwrap_err()
            .code,
        "FENCED"
    );
    assert_eq!(settle(&mut reg, &done, &token, &mut effects), Ok(false));
    assert!(effects.is_empty());
    let err = settle(&mut reg, &done, &token, &mut effects).unwrap_err();
    assert_eq!((err.status, err.code), (409, "FENCED"));
    // The next wake's token is not the old one, and the old token cannot settle it.
    let (_, body2) = job_of(&reg.on_write("/v1/stream/events/x", &seen(2), clock));
    assert_eq!(body2["generation"], 2);
    let stale = ack_request(&body2, "events/x", &offset(2), true);
    assert_eq!(
        settle(&mut reg, &stale, &token, &mut effects)
            .unwrap_err()
            .code,
        "FENCED"
    );
    let fresh = token_of(&body2, "callback_token");
    assert_eq!(settle(&mut reg, &stale, &fresh, &mut effects), Ok(false));
    // A recreated subscription of the same id rejects its predecessor's tokens.
    reg.delete(S);
    reg.create("s", ROOT, ROOT, BASE, webhook(1000), vec![], clock)
        .unwrap();
    let err = settle(&mut reg, &stale, &fresh, &mut effects).unwrap_err();
    assert_eq!(err.code, "TOKEN_INVALID");
}

#[test]
fn acks_may_reach_tails_refreshed_from_the_engine() {
    let mut reg = registry();
    let clock = Clock::now();
    reg.create("s", ROOT, ROOT, BASE, webhook(1000), vec![], clock)
        .unwrap();
    let (_, body) = job_of(&reg.on_write("/v1/stream/events/x", &seen(1), clock));
    let token = token_of(&body, "callback_token");
    let ack = ack_request(&body, "events/x", &offset(3), false);
    let mut fx = Vec::new();
    let err = reg
        .settle(S, Kind::Webhook, &token, &ack, clock, &mut fx)
        .unwrap_err();
    assert_eq!(err.code, "INVALID_OFFSET");
    // Tails never move back.
    reg.refresh_tails(S, &[("events/x".into(), seen(3))]);
    reg.refresh_tails(S, &[("events/x".into(), seen(2))]);
    assert_eq!(
        reg.settle(S, Kind::Webhook, &token, &ack, clock, &mut fx),
        Ok(false)
    );
    let regress = ack_request(&body, "events/x", &offset(2), false);
    let err = reg
        .settle(S, Kind::Webhook, &token, &regress, clock, &mut fx)
        .unwrap_err();
    assert_eq!(err.code, "INVALID_OFFSET");
}

#[test]
fn webhook_lease_expiry_redelivers_with_a_new_generation() {
    let mut reg = registry();
    let t0 = Clock::now();
    reg.create("s", ROOT, ROOT, BASE, webhook(1000), vec![], t0)
        .unwrap();
    let (job, body) = job_of(&reg.on_write("/v1/stream/events/x", &seen(1), t0));
    reg.delivery_result(&job, Outcome::Accepted, t0);
    assert!(reg.tick(t0).is_empty());
    let later = Clock {
        now: t0.now + Duration::from_millis(1001),
        ..t0
    };
    let (next, _) = job_of(&reg.tick(later));
    assert_eq!(next.generation, 2);
    let req = ack_request(&body, "events/x", &offset(1), true);
    let err = reg
        .settle(
            S,
            Kind::Webhook,
            &token_of(&body, "callback_token"),
            &req,
            later,
            &mut Vec::new(),
        )
        .unwrap_err();
    assert_eq!(err.code, "FENCED");
}

#[test]
fn failed_deliveries_back_off_then_give_up() {
    let mut reg = registry();
    let mut clock = Clock::now();
    reg.create("s", ROOT, ROOT, BASE, webhook(1000), vec![], clock)
        .unwrap();
    let (mut job, _) = job_of(&reg.on_write("/v1/stream/events/x", &seen(1), clock));
    for attempt in 1..DELIVERY_ATTEMPTS_MAX {
        assert!(reg
            .delivery_result(&job, Outcome::Failed("refused".into()), clock)
            .is_empty());
        assert_eq!(reg.describe(S, "k", "u").unwrap()["status"], "failed");
        // Not before the backoff, then the same generation again.
        assert!(reg.tick(clock).is_empty());
        clock.now += retry_delay(attempt);
        let (retry, _) = job_of(&reg.tick(clock));
        assert_eq!(retry.generation, 1);
        job = retry;
    }
    assert!(reg
        .delivery_result(&job, Outcome::Failed("refused".into()), clock)
        .is_empty());
    clock.now += Duration::from_secs(3600);
    assert!(reg.tick(clock).is_empty());
    // The next write tries again, and success clears the failed status.
    let (job, _) = job_of(&reg.on_write("/v1/stream/events/x", &seen(2), clock));
    assert_eq!(job.generation, 2);
    reg.delivery_result(&job, Outcome::Accepted, clock);
    assert_eq!(reg.describe(S, "k", "u").unwrap()["status"], "active");
    assert_eq!(retry_delay(1), Duration::from_secs(1));
    assert_eq!(retry_delay(3), Duration::from_secs(4));
    assert_eq!(retry_delay(30), Duration::from_secs(60));
}

#[test]
fn pull_wake_claim_ack_release() {
    let mut reg = registry();
    let clock = Clock::now();
    reg.create("p", ROOT, ROOT, BASE, pull(1000), vec![], clock)
        .unwrap();
    let mut effects = Vec::new();
    let err = reg.claim(P, "w1", clock, &mut effects).unwrap_err();
    assert_eq!(err.code, "NO_PENDING_WORK");
    // The subscription's own wake stream never links (it would wake itself forever).
    assert!(!reg.interested("/v1/stream/wake/pool"));
    let effects = reg.on_write("/v1/stream/events/a", &seen(1), clock);
    let [Effect::AppendWake { stream, event }] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    assert_eq!(stream, "/v1/stream/wake/pool");
    let event: Value = serde_json::from_str(event).unwrap();
    assert_eq!(
        (event["subscription_id"].as_str(), event["stream"].as_str()),
        (Some("p"), Some("events/a"))
    );
    let mut effects = Vec::new();
    let claimed = reg.claim(P, "w1", clock, &mut effects).unwrap();
    assert!(effects.is_empty());
    assert_eq!(claimed["generation"], 1);
    assert_eq!(claimed["streams"][0]["tail_offset"], offset(1));
    let busy = reg.claim(P, "w2", clock, &mut effects).unwrap_err();
    assert_eq!((busy.status, busy.code), (409, "ALREADY_CLAIMED"));
    assert_eq!(busy.to_json()["error"]["current_holder"], "w1");
    let token = token_of(&claimed, "token");
    let done = ack_request(&claimed, "events/a", &offset(1), true);
    let err = reg
        .settle(P, Kind::Webhook, &token, &done, clock, &mut effects)
        .unwrap_err();
    assert_eq!(err.status, 400);
    assert_eq!(
        reg.settle(P, Kind::PullWake, &token, &done, clock, &mut effects),
        Ok(false)
    );
    // A write, a claim and a release: the work is still pending, so a new wake is announced.
    assert_eq!(
        reg.on_write("/v1/stream/events/a", &seen(2), clock).len(),
        1
    );
    let claimed = reg.claim(P, "w1", clock, &mut effects).unwrap();
    assert_eq!(claimed["generation"], 2);
    let release = ack_request(&claimed, "events/a", &offset(2), false);
    let mut effects = Vec::new();
    reg.release(
        P,
        &token_of(&claimed, "token"),
        &release,
        clock,
        &mut effects,
    )
    .unwrap();
    assert!(matches!(effects.as_slice(), [Effect::AppendWake { .. }]));
    let err = reg
        .release(
            P,
            &token_of(&claimed, "token"),
            &release,
            clock,
            &mut effects,
        )
        .unwrap_err();
    assert_eq!(err.code, "FENCED");
}

#[test]
fn pull_wake_lease_expiry_frees_the_claim() {
    let mut reg = registry();
    let t0 = Clock::now();
    reg.create("p", ROOT, ROOT, BASE, pull(1000), vec![], t0)
        .unwrap();
    reg.on_write("/v1/stream/events/a", &seen(1), t0);
    let mut effects = Vec::new();
    let claimed = reg.claim(P, "w1", t0, &mut effects).unwrap();
    let later = Clock {
        now: t0.now + Duration::from_millis(1500),
        ..t0
    };
    // The claim checks the lease itself, before any sweep.
    let claimed2 = reg.claim(P, "w2", later, &mut effects).unwrap();
    assert_eq!(claimed2["generation"], 2);
    assert!(matches!(effects.as_slice(), [Effect::AppendWake { .. }]));
    let ack = ack_request(&claimed, "events/a", &offset(1), true);
    let err = reg
        .settle(
            P,
            Kind::PullWake,
            &token_of(&claimed, "token"),
            &ack,
            later,
            &mut effects,
        )
        .unwrap_err();
    assert_eq!(err.code, "FENCED");
}

#[test]
fn restored_registry_fences_old_wakes_and_resumes_pending_work() {
    let rng = SystemRandom::new();
    let mut secret = [0u8; crate::subscriptions::keys::TOKEN_KEY_LEN];
    rng.fill(&mut secret).unwrap();
    let mut reg = Registry::new(TokenKey::from_secret(secret));
    let clock = Clock::now();
    reg.create("p", ROOT, ROOT, BASE, pull(1000), vec![], clock)
        .unwrap();
    // Linked, nothing pending: not woken by the resume.
    let quiet = config(json!({"type": "pull-wake", "streams": ["quiet/x"],
        "wake_stream": "wake/quiet"}));
    let links = vec![("quiet/x".to_string(), LinkKind::Explicit, seen(4))];
    reg.create("quiet", ROOT, ROOT, BASE, quiet, links, clock)
        .unwrap();
    let version = reg.version();
    reg.on_write("/v1/stream/events/a", &seen(1), clock);
    assert!(reg.version() > version, "a new link and a wake are durable");
    let mut effects = Vec::new();
    let claimed = reg.claim(P, "w1", clock, &mut effects).unwrap();
    let token = token_of(&claimed, "token");
    // A write while the wake is out moves only a tail: nothing to write.
    let version = reg.version();
    reg.on_write("/v1/stream/events/a", &seen(2), clock);
    assert_eq!(reg.version(), version);

    let mut restored = Registry::restore(&reg.snapshot(), TokenKey::from_secret(secret)).unwrap();
    assert!(restored.resume_pending());
    assert_eq!(restored.version(), 0);
    // The claim did not survive: its token is fenced, not invalid.
    let ack = ack_request(&claimed, "events/a", &offset(1), true);
    let err = restored
        .settle(P, Kind::PullWake, &token, &ack, clock, &mut effects)
        .unwrap_err();
    assert_eq!(err.code, "FENCED");
    // The tails read from the engine, then the pending work is announced again, once.
    restored.refresh_tails(P, &[("events/a".into(), seen(3))]);
    let effects = restored.resume(clock);
    let [Effect::AppendWake { stream, event }] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    assert_eq!(stream, "/v1/stream/wake/pool");
    let event: Value = serde_json::from_str(event).unwrap();
    assert_eq!(
        (
            event["subscription_id"].as_str(),
            event["generation"].as_u64()
        ),
        (Some("p"), Some(2))
    );
    assert!(restored.resume(clock).is_empty());
    let mut effects = Vec::new();
    let claimed = restored.claim(P, "w1", clock, &mut effects).unwrap();
    assert_eq!(claimed["streams"][0]["tail_offset"], offset(3));
    assert_eq!(
        restored.describe("/v1/stream/quiet", "k", "u").unwrap()["streams"][0]["acked_offset"],
        offset(4)
    );
    assert_eq!(
        Registry::restore(&json!({}), TokenKey::from_secret(secret)).err(),
        Some(SnapshotError::NotAnArray)
    );
}

#[test]
fn explicit_streams_link_and_unlink() {
    let mut reg = registry();
    let clock = Clock::now();
    let c = config(json!({"type": "webhook", "streams": ["manual/a"],
        "webhook": {"url": "http://127.0.0.1:9/hook"}}));
    let links = vec![("manual/a".to_string(), LinkKind::Explicit, seen(5))];
    reg.create("s", ROOT, ROOT, BASE, c, links, clock).unwrap();
    reg.add_explicit(S, vec![("manual/b".into(), StreamTail::none())])
        .unwrap();
    let paths = |reg: &Registry| -> Vec<String> {
        reg.describe(S, "k", "u").unwrap()["streams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["path"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(paths(&reg), ["manual/a", "manual/b"]);
    reg.remove_explicit(S, "manual/b").unwrap();
    reg.remove_explicit(S, "never/linked").unwrap();
    assert_eq!(paths(&reg), ["manual/a"]);
    assert_eq!(
        reg.describe(S, "k", "u").unwrap()["streams"][0]["link_type"],
        "explicit"
    );
    assert_eq!(
        reg.describe(S, "k", "u").unwrap()["streams"][0]["acked_offset"],
        offset(5)
    );
    // Writes to unlinked streams do nothing; to a linked one, they wake.
    assert!(!reg.interested("/v1/stream/manual/b"));
    assert!(reg
        .on_write("/v1/stream/manual/a", &seen(5), clock)
        .is_empty());
    assert_eq!(
        reg.on_write("/v1/stream/manual/a", &seen(6), clock).len(),
        1
    );
    assert_eq!(reg.add_explicit("nope", vec![]).unwrap_err().status, 404);
    let many: Vec<(String, StreamTail)> = (0..STREAMS_PER_SUBSCRIPTION_MAX)
        .map(|i| (format!("m/{i}"), StreamTail::none()))
        .collect();
    assert_eq!(
        reg.add_explicit(S, many).unwrap_err().code,
        "LIMIT_EXCEEDED"
    );
    reg.on_delete("/v1/stream/manual/a");
    assert!(paths(&reg).is_empty());
}

#[test]
fn a_tail_of_the_name_created_again_starts_a_link_over_and_an_earlier_ones_is_stale() {
    let of = |n, id| StreamTail {
        offset: offset(n),
        stream_id: id,
    };
    let mut link = Link::at(of(5, Some(STREAM_ID)));
    assert!(!link.pending());
    // The link's own stream: forward only.
    assert_eq!(link.observe(&of(7, Some(STREAM_ID))), Observed::Tail);
    assert_eq!(link.observe(&of(6, Some(STREAM_ID))), Observed::Tail);
    assert_eq!(
        (link.tail.as_str(), link.pending()),
        (offset(7).as_str(), true)
    );
    link.acked = offset(7);
    // An earlier stream of the name (a report that raced its delete): nothing changes.
    assert_eq!(link.observe(&of(9, Some(STREAM_ID - 1))), Observed::Stale);
    assert_eq!(
        (link.tail.as_str(), link.pending()),
        (offset(7).as_str(), false)
    );
    // The name created again: its first record is work, however far the old one had come,
    // and a worker starts at its beginning.
    assert_eq!(
        link.observe(&of(1, Some(STREAM_ID + 1))),
        Observed::Restarted
    );
    assert_eq!(link.acked, BEFORE_FIRST_OFFSET);
    assert_eq!(link.tail, offset(1));
    assert_eq!(link.stream_id, Some(STREAM_ID + 1));
    assert!(link.pending());
    // A link of a state file that kept no id takes the first one it sees, counts as before.
    let mut legacy = Link {
        stream_id: None,
        ..Link::at(of(5, None))
    };
    assert_eq!(
        legacy.observe(&of(5, Some(STREAM_ID))),
        Observed::Identified
    );
    assert_eq!(
        (legacy.stream_id, legacy.pending()),
        (Some(STREAM_ID), false)
    );
    // No stream by the name: nothing moves.
    assert_eq!(legacy.observe(&StreamTail::none()), Observed::Tail);
    assert_eq!(legacy.tail, offset(5));
}

#[test]
fn a_write_to_the_name_created_again_restarts_a_pattern_link_and_drops_an_explicit_one() {
    let mut reg = registry();
    let clock = Clock::now();
    let both = config(json!({"type": "pull-wake", "pattern": "events/*",
        "streams": ["events/a", "manual/b"], "wake_stream": "wake/pool"}));
    let links = vec![
        ("events/a".to_string(), LinkKind::Explicit, seen(4)),
        ("events/a".to_string(), LinkKind::Glob, seen(4)),
        ("manual/b".to_string(), LinkKind::Explicit, seen(4)),
    ];
    reg.create("p", ROOT, ROOT, BASE, both, links, clock)
        .unwrap();
    let streams = |reg: &Registry| reg.describe(P, "k", "u").unwrap()["streams"].clone();
    let again = StreamTail {
        offset: offset(1),
        stream_id: Some(STREAM_ID + 1),
    };
    let version = reg.version();
    reg.on_write("/v1/stream/events/a", &again, clock);
    reg.on_write("/v1/stream/manual/b", &again, clock);
    assert!(reg.version() > version, "the changed links are durable");
    // As a seen delete leaves them: the pattern's link starts over, the explicit-only one is
    // gone.
    assert_eq!(
        streams(&reg),
        json!([{"path": "events/a", "link_type": "explicit", "acked_offset": "-1"}])
    );
    // A late report of the old stream changes nothing.
    reg.on_write("/v1/stream/events/a", &seen(9), clock);
    assert_eq!(streams(&reg)[0]["acked_offset"], "-1");
}
