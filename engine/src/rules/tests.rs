//! Tests of the per-stream state machine: appends, producers, reads and recreates.

use super::*;
use proptest::prelude::*;

fn config() -> StreamConfig {
    StreamConfig {
        content_type: "text/plain".into(),
        ttl_sec: None,
        expires_at_ms: None,
        retention: Default::default(),
    }
}

#[derive(Debug, Clone)]
enum Step {
    Append {
        records: u64,
        close: bool,
        match_tail: bool,
        now: i64,
    },
    Durable,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (
            0u64..5,
            proptest::bool::weighted(0.05),
            any::<bool>(),
            0i64..1000
        )
            .prop_map(|(records, close, match_tail, now)| Step::Append {
                records,
                close,
                match_tail,
                now
            }),
        Just(Step::Durable),
    ]
}

proptest! {
    /// Offsets are dense and increasing, timestamps strictly increase, nothing is appended
    /// after a close, and errors leave the state unchanged.
    #[test]
    fn invariants_hold(steps in proptest::collection::vec(step(), 1..200)) {
        let mut state = StreamState::new(1, config(), false, 0);
        let mut expected_next = 0u64;
        let mut last_ts = 0i64;
        for step in steps {
            match step {
                Step::Durable => {
                    let (next, closed) = (state.next_offset, state.closed);
                    state.mark_durable(next, closed);
                    prop_assert_eq!(state.durable_offset, state.next_offset);
                }
                Step::Append { records, close, match_tail, now } => {
                    let before = state.clone();
                    let match_offset = match_tail.then_some(state.next_offset);
                    let result = state.apply_append(AppendCommand { records, close, match_offset, producer: None, content_type: None, writer_seq: None, producer_limits: &ProducerLimits::default() }, now);
                    match result {
                        Ok(AppendOutcome::Appended { start_offset, next_offset, timestamp_ms, .. }) => {
                            prop_assert!(!before.closed);
                            prop_assert_eq!(start_offset, expected_next);
                            prop_assert_eq!(next_offset, start_offset + records);
                            prop_assert!(timestamp_ms > last_ts);
                            prop_assert!(timestamp_ms >= now);
                            last_ts = timestamp_ms;
                            expected_next = next_offset;
                        }
                        Ok(AppendOutcome::Closed { next_offset, newly }) => {
                            prop_assert_eq!(records, 0);
                            prop_assert_eq!(next_offset, expected_next);
                            prop_assert_eq!(newly, !before.closed);
                            prop_assert!(state.closed);
                        }
                        Ok(AppendOutcome::Duplicate { .. }) => prop_assert!(false, "no producer was given"),
                        Err(_) => prop_assert_eq!(&state, &before),
                    }
                }
            }
            prop_assert!(state.durable_offset <= state.next_offset);
        }
    }
}

fn append(
    state: &mut StreamState,
    records: u64,
    close: bool,
    producer: Option<(&str, u64, u64)>,
) -> Result<AppendOutcome, AppendError> {
    let producer = producer.map(|(id, epoch, seq)| ProducerTuple {
        id: id.into(),
        epoch,
        seq,
    });
    state.apply_append(
        AppendCommand {
            records,
            close,
            match_offset: None,
            producer: producer.as_ref(),
            content_type: None,
            writer_seq: None,
            producer_limits: &ProducerLimits::default(),
        },
        1,
    )
}

#[test]
fn producer_decision_table() {
    let mut state = StreamState::new(1, config(), false, 0);
    assert!(
        matches!(
            append(&mut state, 1, false, Some(("p", 0, 1))),
            Err(AppendError::UnknownProducer { received: 1 })
        ),
        "unknown id must start at 0"
    );
    assert!(matches!(
        append(&mut state, 1, false, Some(("p", 0, 0))),
        Ok(AppendOutcome::Appended { .. })
    ));
    assert!(matches!(
        append(&mut state, 1, false, Some(("p", 0, 1))),
        Ok(AppendOutcome::Appended { .. })
    ));
    assert!(matches!(
        append(&mut state, 1, false, Some(("p", 0, 1))),
        Ok(AppendOutcome::Duplicate {
            last_seq: 1,
            next_offset: 2,
            closed: false
        })
    ));
    assert!(matches!(
        append(&mut state, 1, false, Some(("p", 0, 0))),
        Ok(AppendOutcome::Duplicate { last_seq: 1, .. })
    ));
    assert_eq!(
        append(&mut state, 1, false, Some(("p", 0, 3))).unwrap_err(),
        AppendError::ProducerSequenceGap {
            expected: 2,
            received: 3
        }
    );
    assert!(
        matches!(
            append(&mut state, 1, false, Some(("p", 1, 1))),
            Err(AppendError::Invalid(_))
        ),
        "new epoch must start at 0"
    );
    assert!(matches!(
        append(&mut state, 1, false, Some(("p", 1, 0))),
        Ok(AppendOutcome::Appended { .. })
    ));
    assert_eq!(
        append(&mut state, 1, false, Some(("p", 0, 2))).unwrap_err(),
        AppendError::StaleProducerEpoch { current: 1 }
    );
    assert_eq!(state.next_offset, 3);
}

#[test]
fn closing_producer_may_retry_others_may_not() {
    let mut state = StreamState::new(1, config(), false, 0);
    append(&mut state, 2, true, Some(("p", 0, 0))).unwrap();
    assert!(state.closed);
    assert!(matches!(
        append(&mut state, 2, true, Some(("p", 0, 0))),
        Ok(AppendOutcome::Duplicate { closed: true, .. })
    ));
    assert!(matches!(
        append(&mut state, 1, false, Some(("q", 0, 0))),
        Err(AppendError::Closed { .. })
    ));
    assert!(matches!(
        append(&mut state, 0, true, Some(("q", 0, 0))),
        Err(AppendError::Closed { .. })
    ));
    assert!(matches!(
        append(&mut state, 0, true, None),
        Ok(AppendOutcome::Closed { newly: false, .. })
    ));
}

#[test]
fn trim_clamps_to_the_durable_tail() {
    let mut state = StreamState::new(1, config(), false, 0);
    append(&mut state, 5, false, None).unwrap();
    state.mark_durable(3, false);
    assert_eq!(state.trim(2), 2);
    assert_eq!(state.trim(1), 2, "never lowered");
    assert_eq!(state.trim(10), 3, "clamped to the durable tail");
    assert!(matches!(
        state.check_read(2),
        Err(ReadError::OffsetGone { start: 3, .. })
    ));
}

#[test]
fn match_failure_reports_the_tail() {
    let mut state = StreamState::new(1, config(), false, 0);
    state
        .apply_append(
            AppendCommand {
                records: 2,
                close: false,
                match_offset: None,
                producer: None,
                content_type: None,
                writer_seq: None,
                producer_limits: &ProducerLimits::default(),
            },
            1,
        )
        .unwrap();
    let err = state
        .apply_append(
            AppendCommand {
                records: 1,
                close: false,
                match_offset: Some(5),
                producer: None,
                content_type: None,
                writer_seq: None,
                producer_limits: &ProducerLimits::default(),
            },
            2,
        )
        .unwrap_err();
    assert_eq!(
        err,
        AppendError::MatchFailed {
            expected: 5,
            actual: 2
        }
    );
}

#[test]
fn sliding_ttl_and_fixed_expiry() {
    let mut cfg = config();
    cfg.ttl_sec = Some(10);
    let mut state = StreamState::new(1, cfg, false, 1_000);
    assert!(!state.is_expired(10_999));
    state.touch(5_000);
    assert!(!state.is_expired(14_999));
    assert!(state.is_expired(15_000));
    state.extras_mut().expires_at_ms = Some(12_000);
    assert!(state.is_expired(12_000));
}

#[test]
fn reads_are_bounded_by_the_durable_tail() {
    let mut state = StreamState::new(1, config(), false, 0);
    state
        .apply_append(
            AppendCommand {
                records: 3,
                close: false,
                match_offset: None,
                producer: None,
                content_type: None,
                writer_seq: None,
                producer_limits: &ProducerLimits::default(),
            },
            1,
        )
        .unwrap();
    assert!(matches!(
        state.check_read(1),
        Err(ReadError::OffsetBeyondTail { .. })
    ));
    state.mark_durable(3, false);
    assert!(state.check_read(3).is_ok());
    assert!(state.check_read(4).is_err());
}

#[test]
fn recreate_compares_configuration() {
    let state = StreamState::new(1, config(), false, 0);
    assert!(state.check_recreate(&config(), false, None).is_ok());
    let mut other = config();
    other.content_type = "TEXT/PLAIN; charset=utf-8".into();
    assert!(state.check_recreate(&other, false, None).is_ok());
    other.content_type = "application/json".into();
    assert!(state.check_recreate(&other, false, None).is_err());
    assert!(state.check_recreate(&config(), true, None).is_err());
}

#[test]
fn content_types_compare_by_base_type_whatever_the_case_and_parameters() {
    assert!(mime_base_eq(
        "application/json",
        "Application/JSON; charset=utf-8"
    ));
    assert!(mime_base_eq(" text/plain ", "text/plain;format=flowed"));
    assert!(mime_base_eq("", ";x=y"));
    assert!(!mime_base_eq("application/json", "application/json-seq"));
    assert!(!mime_base_eq("text/plain", "text/html; charset=utf-8"));
    assert_eq!(mime_base("Text/Plain ; charset=utf-8"), "Text/Plain");
}

#[test]
fn a_base_type_is_told_apart_as_the_full_comparison_tells_it() {
    let bases = ["application/json", "text/plain"];
    let given = [
        "application/json",
        "Application/JSON; charset=utf-8",
        "  application/json ;x=y",
        "\tapplication/json",
        "\u{a0}application/json",
        "application/jsonx",
        "application/json-seq",
        "application/jso",
        "application/octet-stream",
        "text/plain",
        "TEXT/PLAIN ",
        "text/plainer",
        ";application/json",
        "",
        " ",
        "é",
    ];
    for base in bases {
        for content_type in given {
            assert_eq!(
                mime_base_is(content_type, base),
                mime_base(content_type).eq_ignore_ascii_case(base),
                "{content_type:?} against {base:?}"
            );
        }
    }
    // Written alike, or alike but for case: equal without finding the bases.
    assert!(mime_base_eq("text/plain; a=1", "TEXT/PLAIN; A=1"));
}
