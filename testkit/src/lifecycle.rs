//! A checker for what a stream's lifecycle operations promise across faults: an acknowledged
//! create, close, delete or trim stays done, as an acknowledged append stays stored
//! ([`crate::history`] checks appends under load; this checks the operations around them).
//!
//! A client works on names of its own, one operation at a time, and records each operation
//! with what it was told ([`Step`]). After the faults, [`check`] holds the steps of one name
//! against what the node serves for it ([`State`]): the state must be one that the
//! acknowledged steps lead to, each step whose outcome is unknown either done or not. A step
//! the node refused (a definite `4xx`, such as an append to a closed stream) changed nothing.
//!
//! A state found once must also stay: the caller keeps the first [`State`] it saw for a name
//! and compares later ones with it (nothing is done to the name after its steps).

/// What a client asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Create,
    /// Appends one record with this body.
    Append(Vec<u8>),
    /// Closes the stream (no body).
    Close,
    Delete,
    /// Trims the stream's start to this offset.
    Trim(u64),
}

/// What the client was told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A `2xx`. `value`: an append's offset, a trim's new start, when the answer named them.
    Acked { value: Option<u64> },
    /// A definite refusal (a `4xx` that says nothing was done).
    Refused,
    /// No answer, or an answer that leaves it open (`5xx`, a cut connection): done or not.
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub op: Op,
    pub outcome: Outcome,
}

/// A name as the node serves it, or as the steps may have left it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    Absent,
    Present {
        closed: bool,
        /// The first offset it serves.
        start: u64,
        /// The offset its next append gets.
        next: u64,
        /// Its records from `start`, with their offsets.
        records: Vec<(u64, Vec<u8>)>,
    },
}

impl State {
    const EMPTY: State = State::Present {
        closed: false,
        start: 0,
        next: 0,
        records: Vec::new(),
    };

    /// `op` done on this state, as its outcome says it went (`value` only for an
    /// acknowledgement); `None` when an acknowledgement cannot follow this state (the
    /// branch that led here did not happen).
    fn apply(&self, op: &Op, acked: Option<Option<u64>>) -> Option<State> {
        let State::Present {
            closed,
            start,
            next,
            records,
        } = self
        else {
            // Only a create changes an absent name; anything else acknowledged on one did not
            // happen this way.
            return match op {
                Op::Create => Some(State::EMPTY),
                _ => acked.is_none().then_some(State::Absent),
            };
        };
        let (closed, start, next) = (*closed, *start, *next);
        let present = |closed, start, next, records| {
            Some(State::Present {
                closed,
                start,
                next,
                records,
            })
        };
        match op {
            // An existing name with the same settings: acknowledged, nothing changes.
            Op::Create => Some(self.clone()),
            // A closed stream refuses appends.
            Op::Append(_) if closed => acked.is_none().then(|| self.clone()),
            Op::Append(_) if matches!(acked, Some(Some(offset)) if offset != next) => None,
            Op::Append(body) => {
                let mut records = records.clone();
                records.push((next, body.clone()));
                present(closed, start, next + 1, records)
            }
            Op::Close => present(true, start, next, records.clone()),
            Op::Delete => Some(State::Absent),
            Op::Trim(asked) => {
                // The node may clamp the start it was asked for (to what is stored); an
                // acknowledgement names the start it set. One of unknown outcome is taken as
                // asked, clamped to the tail: exact for the plan's trims (to 1 from 0).
                let new_start = match acked {
                    Some(Some(set)) if set < start || set > next => return None,
                    Some(Some(set)) => set,
                    _ => (*asked).clamp(start, next),
                };
                let kept = records
                    .iter()
                    .filter(|(offset, _)| *offset >= new_start)
                    .cloned()
                    .collect();
                present(closed, new_start, next, kept)
            }
        }
    }
}

/// What a lifecycle client does to its `n`th name (`name`), and the answers each operation
/// should get besides the ones a fault explains: by `n`, a stream left open with two records,
/// one closed (then an append it must refuse), one deleted, one deleted and created again (its
/// new incarnation must hold only its own record), one trimmed. Each record's body names its
/// stream.
pub fn plan(name: &str, n: u64) -> Vec<(Op, &'static [u16])> {
    let record = |tag: &str| Op::Append(format!("{name}-{tag}").into_bytes());
    let created: (Op, &[u16]) = (Op::Create, &[201]);
    match n % 5 {
        0 => vec![created, (record("a"), &[200]), (record("b"), &[200])],
        1 => vec![
            created,
            (record("a"), &[200]),
            (Op::Close, &[200]),
            (record("late"), &[409]),
        ],
        2 => vec![created, (record("a"), &[200]), (Op::Delete, &[204])],
        3 => vec![
            created.clone(),
            (record("a"), &[200]),
            (Op::Delete, &[204]),
            created,
            (record("b"), &[200]),
        ],
        _ => vec![
            created,
            (record("a"), &[200]),
            (record("b"), &[200]),
            (Op::Trim(1), &[200]),
        ],
    }
}

impl Op {
    /// The Pico protocol request that does it: method, headers and body.
    pub fn pico_request(&self) -> (&'static str, Vec<(&'static str, String)>, &[u8]) {
        match self {
            Op::Create => (
                "PUT",
                vec![("content-type", "application/octet-stream".into())],
                b"",
            ),
            Op::Append(body) => ("POST", vec![], body),
            Op::Close => ("POST", vec![("pico-closed", "true".into())], b""),
            Op::Delete => ("DELETE", vec![], b""),
            Op::Trim(start) => ("POST", vec![("pico-trim-seq", start.to_string())], b""),
        }
    }
}

/// What a Pico protocol answer (`None`: no answer) says of its operation: a `2xx` is
/// acknowledged (with `Pico-Start-Seq`, an append's offset or a trim's new start), a `4xx`
/// other than `429` a refusal, anything else unknown.
pub fn pico_outcome(status: Option<u16>, start_seq: Option<&str>) -> Outcome {
    match status {
        Some(200..=299) => Outcome::Acked {
            value: start_seq.and_then(|v| v.parse().ok()),
        },
        Some(status @ 400..=499) if status != 429 => Outcome::Refused,
        _ => Outcome::Unknown,
    }
}

/// Every state `steps` (done in order, from no stream) may have left the name in.
pub fn allowed(steps: &[Step]) -> Vec<State> {
    let mut states = vec![State::Absent];
    for step in steps {
        let mut after = Vec::new();
        for state in &states {
            let outcomes: Vec<Option<State>> = match &step.outcome {
                Outcome::Acked { value } => vec![state.apply(&step.op, Some(*value))],
                Outcome::Refused => vec![Some(state.clone())],
                Outcome::Unknown => vec![Some(state.clone()), state.apply(&step.op, None)],
            };
            for next in outcomes.into_iter().flatten() {
                if !after.contains(&next) {
                    after.push(next);
                }
            }
        }
        states = after;
    }
    states
}

/// `None` when `found` is a state `steps` may have left the name in; otherwise what is wrong.
pub fn check(name: &str, steps: &[Step], found: &State) -> Option<String> {
    let states = allowed(steps);
    if states.contains(found) {
        return None;
    }
    Some(format!(
        "{name}: found {}, but its steps {} allow only {}",
        describe(found),
        steps
            .iter()
            .map(|s| format!("{:?}→{:?}", short(&s.op), s.outcome))
            .collect::<Vec<_>>()
            .join(", "),
        if states.is_empty() {
            "none (the acknowledgements contradict each other)".to_string()
        } else {
            states.iter().map(describe).collect::<Vec<_>>().join(" or ")
        }
    ))
}

fn short(op: &Op) -> String {
    match op {
        Op::Append(body) => format!(
            "Append({})",
            String::from_utf8_lossy(&body[..body.len().min(24)])
        ),
        other => format!("{other:?}"),
    }
}

/// A state in words, bodies cut short.
pub fn describe(state: &State) -> String {
    match state {
        State::Absent => "absent".into(),
        State::Present {
            closed,
            start,
            next,
            records,
        } => format!(
            "{} [{start}, {next}) {:?}",
            if *closed { "closed" } else { "open" },
            records
                .iter()
                .map(|(o, b)| format!("{o}:{}", String::from_utf8_lossy(&b[..b.len().min(24)])))
                .collect::<Vec<_>>()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acked(op: Op, value: Option<u64>) -> Step {
        Step {
            op,
            outcome: Outcome::Acked { value },
        }
    }

    fn unknown(op: Op) -> Step {
        Step {
            op,
            outcome: Outcome::Unknown,
        }
    }

    fn append(body: &str) -> Op {
        Op::Append(body.as_bytes().to_vec())
    }

    fn present(closed: bool, start: u64, next: u64, records: &[(u64, &str)]) -> State {
        State::Present {
            closed,
            start,
            next,
            records: records
                .iter()
                .map(|(o, b)| (*o, b.as_bytes().to_vec()))
                .collect(),
        }
    }

    #[test]
    fn acknowledged_steps_leave_one_state() {
        let steps = [
            acked(Op::Create, None),
            acked(append("a"), Some(0)),
            acked(append("b"), Some(1)),
            acked(Op::Close, None),
            Step {
                op: append("late"),
                outcome: Outcome::Refused,
            },
        ];
        assert_eq!(
            allowed(&steps),
            vec![present(true, 0, 2, &[(0, "a"), (1, "b")])]
        );
        assert!(check("s", &steps, &present(true, 0, 2, &[(0, "a"), (1, "b")])).is_none());
        // A close taken back, a record lost, the late append stored: each is reported.
        for wrong in [
            present(false, 0, 2, &[(0, "a"), (1, "b")]),
            present(true, 0, 1, &[(0, "a")]),
            present(true, 0, 3, &[(0, "a"), (1, "b"), (2, "late")]),
            State::Absent,
        ] {
            let message = check("s", &steps, &wrong).expect("a violation");
            assert!(message.contains("allow only closed [0, 2)"), "{message}");
        }
    }

    #[test]
    fn an_unknown_step_may_or_may_not_be_done() {
        let steps = [acked(Op::Create, None), unknown(append("a"))];
        assert_eq!(
            allowed(&steps),
            vec![present(false, 0, 0, &[]), present(false, 0, 1, &[(0, "a")])]
        );
        let steps = [unknown(Op::Create)];
        assert_eq!(
            allowed(&steps),
            vec![State::Absent, present(false, 0, 0, &[])]
        );
        let steps = [
            acked(Op::Create, None),
            acked(append("a"), Some(0)),
            unknown(Op::Delete),
        ];
        assert_eq!(
            allowed(&steps),
            vec![present(false, 0, 1, &[(0, "a")]), State::Absent]
        );
    }

    #[test]
    fn a_deleted_and_recreated_name_holds_only_its_new_records() {
        let steps = [
            acked(Op::Create, None),
            acked(append("old"), Some(0)),
            acked(Op::Delete, None),
            acked(Op::Create, None),
            acked(append("new"), Some(0)),
        ];
        assert_eq!(allowed(&steps), vec![present(false, 0, 1, &[(0, "new")])]);
        let message = check(
            "s",
            &steps,
            &present(false, 0, 2, &[(0, "old"), (1, "new")]),
        )
        .expect("the old incarnation's record is a violation");
        assert!(message.contains("found open [0, 2)"), "{message}");
    }

    #[test]
    fn a_trim_sets_the_start_it_acknowledged() {
        let steps = [
            acked(Op::Create, None),
            acked(append("a"), Some(0)),
            acked(append("b"), Some(1)),
            acked(Op::Trim(1), Some(1)),
        ];
        assert_eq!(allowed(&steps), vec![present(false, 1, 2, &[(1, "b")])]);
        assert!(check("s", &steps, &present(false, 0, 2, &[(0, "a"), (1, "b")])).is_some());
        // A trim the node clamped to 0 (nothing stored yet) changed nothing.
        let clamped = [
            acked(Op::Create, None),
            acked(append("a"), Some(0)),
            acked(Op::Trim(1), Some(0)),
        ];
        assert_eq!(allowed(&clamped), vec![present(false, 0, 1, &[(0, "a")])]);
        let steps = [
            acked(Op::Create, None),
            acked(append("a"), Some(0)),
            acked(append("b"), Some(1)),
            unknown(Op::Trim(1)),
        ];
        assert_eq!(allowed(&steps).len(), 2);
    }

    #[test]
    fn contradicting_acknowledgements_allow_nothing() {
        // An append acknowledged at an offset the model cannot give it: a reused offset.
        let steps = [
            acked(Op::Create, None),
            acked(append("a"), Some(0)),
            acked(append("b"), Some(0)),
        ];
        assert!(allowed(&steps).is_empty());
        let message = check("s", &steps, &present(false, 0, 1, &[(0, "b")])).unwrap();
        assert!(message.contains("contradict"), "{message}");
        // An append acknowledged on a closed stream.
        let steps = [
            acked(Op::Create, None),
            acked(Op::Close, None),
            acked(append("late"), Some(0)),
        ];
        assert!(allowed(&steps).is_empty());
        // An acknowledged delete of a name that was never created.
        assert!(allowed(&[acked(Op::Delete, None)]).is_empty());
    }
}
