//! A checker for what a stream's lifecycle operations promise across faults: an acknowledged
//! create, close, delete, trim or fork stays done, as an acknowledged append stays stored
//! ([`crate::history`] checks appends under load; this checks the operations around them).
//!
//! A client works through plans ([`plan`]) on names of its own, one operation at a time, and
//! records each operation with what it was told ([`Step`]). After the faults, [`check`] holds
//! the steps of one plan against what the node serves for its names ([`World`]): that must be
//! a world the acknowledged steps lead to, each step whose outcome is unknown either done or
//! not. A step the node refused (a definite `4xx`, such as an append to a closed stream)
//! changed nothing.
//!
//! A world found once must also stay: the caller keeps the first one it saw for a plan and
//! compares later ones with it (nothing is done to the names after their plan).

use std::collections::BTreeMap;

/// What a client asked for, of one name.
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
    /// Creates the name as a fork of `source` at the source's tail (Durable Streams only).
    Fork {
        source: String,
    },
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
    pub name: String,
    pub op: Op,
    pub outcome: Outcome,
}

/// A name as the node serves it, or as the steps may have left it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    Absent,
    /// Deleted while forks read it (`410`): gone for everything but their reads, until the
    /// last of them is deleted.
    Gone,
    Present {
        closed: bool,
        /// The first offset it serves.
        start: u64,
        /// The offset its next append gets.
        next: u64,
        /// Its records from `start`, with their offsets (a fork's inherited ones included).
        records: Vec<(u64, Vec<u8>)>,
    },
}

/// The names of one plan as the node serves them, or as the steps may have left them.
pub type World = BTreeMap<String, State>;

/// A world the steps may have led to, with the forks that still read each source.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Branch {
    names: World,
    /// Each live fork's source.
    sources: BTreeMap<String, String>,
}

impl State {
    const EMPTY: State = State::Present {
        closed: false,
        start: 0,
        next: 0,
        records: Vec::new(),
    };
}

impl Branch {
    fn state(&self, name: &str) -> &State {
        self.names.get(name).unwrap_or(&State::Absent)
    }

    /// `name` deleted: gone while forks read it, absent otherwise, and a gone source whose
    /// last fork this was goes with it.
    fn delete(&mut self, name: &str) {
        if self.sources.values().any(|source| source == name) {
            self.names.insert(name.to_string(), State::Gone);
            return;
        }
        self.names.insert(name.to_string(), State::Absent);
        if let Some(source) = self.sources.remove(name) {
            if *self.state(&source) == State::Gone {
                self.delete(&source);
            }
        }
    }

    /// `op` done to `name`, as its outcome says it went (`acked`: the acknowledgement's
    /// value; `None` for an outcome not known); `None` when an acknowledgement cannot follow
    /// this branch (the branch did not happen).
    fn apply(&self, name: &str, op: &Op, acked: Option<Option<u64>>) -> Option<Branch> {
        let mut after = self.clone();
        let set = |after: &mut Branch, state: State| {
            after.names.insert(name.to_string(), state);
        };
        let State::Present {
            closed,
            start,
            next,
            records,
        } = self.state(name)
        else {
            // An absent name can be created or forked; nothing else is acknowledged on an
            // absent or gone one (a gone name refuses even a create).
            match (self.state(name), op) {
                (State::Absent, Op::Create) => set(&mut after, State::EMPTY),
                (State::Absent, Op::Fork { source }) => match self.state(source) {
                    // A fork starts open, with its source's records up to its tail.
                    State::Present {
                        start,
                        next,
                        records,
                        ..
                    } => {
                        let state = State::Present {
                            closed: false,
                            start: *start,
                            next: *next,
                            records: records.clone(),
                        };
                        set(&mut after, state);
                        after.sources.insert(name.to_string(), source.clone());
                    }
                    _ => return acked.is_none().then_some(after),
                },
                _ => return acked.is_none().then_some(after),
            }
            return Some(after);
        };
        let (closed, start, next) = (*closed, *start, *next);
        let present = |closed, start, next, records| State::Present {
            closed,
            start,
            next,
            records,
        };
        match op {
            // An existing name with the same settings: acknowledged, nothing changes.
            Op::Create | Op::Fork { .. } => {}
            // A closed stream refuses appends.
            Op::Append(_) if closed => return acked.is_none().then_some(after),
            Op::Append(_) if matches!(acked, Some(Some(offset)) if offset != next) => return None,
            Op::Append(body) => {
                let mut records = records.clone();
                records.push((next, body.clone()));
                set(&mut after, present(closed, start, next + 1, records));
            }
            Op::Close => set(&mut after, present(true, start, next, records.clone())),
            Op::Delete => after.delete(name),
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
                set(&mut after, present(closed, new_start, next, kept));
            }
        }
        Some(after)
    }
}

/// One operation of a plan: on which name, and the answers it should get besides the ones a
/// fault explains.
#[derive(Clone, Debug)]
pub struct Planned {
    pub name: String,
    pub op: Op,
    pub expected: &'static [u16],
}

/// The protocol a plan's requests use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Pico,
    DurableStreams,
}

/// The plans a lifecycle client works through; the `n`th works on names starting with
/// `prefix` and `n`. By `n`: a stream left open with two records, one closed (then an append
/// it must refuse), one deleted, one deleted and created again (its new incarnation must hold
/// only its own record), one trimmed (all over the Pico protocol); with `forks`, also a
/// source forked, both appended to and the source deleted (gone while its fork reads it), and
/// every other time the fork deleted too (the source then goes with it), over the Durable
/// Streams protocol. Each record's body names its stream.
pub fn plan(prefix: &str, n: u64, forks: bool) -> (Protocol, Vec<Planned>) {
    let kinds = if forks { 6 } else { 5 };
    let name = format!("{prefix}{n}");
    let step = |name: &str, op: Op, expected: &'static [u16]| Planned {
        name: name.to_string(),
        op,
        expected,
    };
    let record = |name: &str, tag: &str| {
        step(
            name,
            Op::Append(format!("{name}-{tag}").into_bytes()),
            &[200],
        )
    };
    let create = |name: &str| step(name, Op::Create, &[201]);
    let steps = match n % kinds {
        0 => vec![create(&name), record(&name, "a"), record(&name, "b")],
        1 => vec![
            create(&name),
            record(&name, "a"),
            step(&name, Op::Close, &[200]),
            step(
                &name,
                Op::Append(format!("{name}-late").into_bytes()),
                &[409],
            ),
        ],
        2 => vec![
            create(&name),
            record(&name, "a"),
            step(&name, Op::Delete, &[204]),
        ],
        3 => vec![
            create(&name),
            record(&name, "a"),
            step(&name, Op::Delete, &[204]),
            create(&name),
            record(&name, "b"),
        ],
        4 => vec![
            create(&name),
            record(&name, "a"),
            record(&name, "b"),
            step(&name, Op::Trim(1), &[200]),
        ],
        _ => {
            let (source, fork) = (format!("{name}-source"), format!("{name}-fork"));
            // Durable Streams answers an append `204`.
            let record = |name: &str, tag: &str| {
                step(
                    name,
                    Op::Append(format!("{name}-{tag}").into_bytes()),
                    &[204],
                )
            };
            let mut steps = vec![
                create(&source),
                record(&source, "a"),
                record(&source, "b"),
                step(
                    &fork,
                    Op::Fork {
                        source: source.clone(),
                    },
                    &[201],
                ),
                record(&fork, "c"),
                record(&source, "d"),
                step(&source, Op::Delete, &[204]),
            ];
            if (n / kinds).is_multiple_of(2) {
                steps.push(step(&fork, Op::Delete, &[204]));
            }
            return (Protocol::DurableStreams, steps);
        }
    };
    (Protocol::Pico, steps)
}

/// The content type of every plan's streams.
const CONTENT_TYPE: &str = "application/octet-stream";

impl Op {
    /// The request that does it over `protocol`: method, headers and body.
    pub fn request(
        &self,
        protocol: Protocol,
    ) -> (&'static str, Vec<(&'static str, String)>, &[u8]) {
        let typed = || vec![("content-type", CONTENT_TYPE.to_string())];
        match (self, protocol) {
            (Op::Create, _) => ("PUT", typed(), b""),
            (Op::Append(body), Protocol::Pico) => ("POST", vec![], body),
            (Op::Append(body), Protocol::DurableStreams) => ("POST", typed(), body),
            (Op::Close, Protocol::Pico) => ("POST", vec![("pico-closed", "true".into())], b""),
            (Op::Close, Protocol::DurableStreams) => {
                ("POST", vec![("stream-closed", "true".into())], b"")
            }
            (Op::Delete, _) => ("DELETE", vec![], b""),
            (Op::Trim(start), _) => ("POST", vec![("pico-trim-seq", start.to_string())], b""),
            (Op::Fork { source }, _) => {
                let mut headers = typed();
                headers.push(("stream-forked-from", source.clone()));
                ("PUT", headers, b"")
            }
        }
    }
}

/// What an answer (`None`: no answer) says of its operation: a `2xx` is acknowledged, a `4xx`
/// other than `429` a refusal, anything else unknown. `header` reads the answer's headers: an
/// acknowledged Pico append or trim names its offset or new start in `Pico-Start-Seq`, a
/// Durable Streams append the offset after it in `Stream-Next-Offset`.
pub fn outcome<'a>(
    protocol: Protocol,
    op: &Op,
    status: Option<u16>,
    header: impl Fn(&str) -> Option<&'a str>,
) -> Outcome {
    match status {
        Some(200..=299) => Outcome::Acked {
            value: match (protocol, op) {
                (Protocol::Pico, _) => header("pico-start-seq").and_then(|v| v.parse().ok()),
                (Protocol::DurableStreams, Op::Append(_)) => header("stream-next-offset")
                    .and_then(|v| v.split('_').next()?.parse::<u64>().ok()?.checked_sub(1)),
                (Protocol::DurableStreams, _) => None,
            },
        },
        Some(status @ 400..=499) if status != 429 => Outcome::Refused,
        _ => Outcome::Unknown,
    }
}

/// An answer as [`work_through`] reads it: status and headers (names in any case).
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

/// Works through the `n`th plan (`prefix`, `forks`: [`plan`]), each operation after the
/// previous one's answer, and ends it at its first operation whose outcome is unknown (what
/// comes after would build on a state not known). `send` makes one request of the plan's
/// protocol (method, name, headers, body) and returns its answer, `None` when there was none;
/// it also gets the operation, for the answers it should get. The steps done.
pub fn work_through(
    prefix: &str,
    n: u64,
    forks: bool,
    mut send: impl FnMut(Protocol, &Planned, &str, &[(&str, &str)], &[u8]) -> Option<Answer>,
) -> Vec<Step> {
    let (protocol, planned) = plan(prefix, n, forks);
    let mut steps = Vec::new();
    for planned in planned {
        let (method, headers, body) = planned.op.request(protocol);
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let answer = send(protocol, &planned, method, &headers, body);
        let outcome = outcome(
            protocol,
            &planned.op,
            answer.as_ref().map(|a| a.status),
            |name| {
                answer.as_ref().and_then(|a| {
                    a.headers
                        .iter()
                        .find(|(n, _)| n.eq_ignore_ascii_case(name))
                        .map(|(_, v)| v.as_str())
                })
            },
        );
        let unknown = outcome == Outcome::Unknown;
        steps.push(Step {
            name: planned.name,
            op: planned.op,
            outcome,
        });
        if unknown {
            break;
        }
    }
    steps
}

/// Every world `steps` (done in order, from no stream) may have left their names in (each
/// plan's names are its own: a name no step touched is absent).
pub fn allowed(steps: &[Step]) -> Vec<World> {
    let mut branches = vec![Branch {
        names: names(steps)
            .into_iter()
            .map(|n| (n, State::Absent))
            .collect(),
        sources: BTreeMap::new(),
    }];
    for step in steps {
        let mut after: Vec<Branch> = Vec::new();
        for branch in &branches {
            let outcomes = match &step.outcome {
                Outcome::Acked { value } => vec![branch.apply(&step.name, &step.op, Some(*value))],
                Outcome::Refused => vec![Some(branch.clone())],
                Outcome::Unknown => vec![
                    Some(branch.clone()),
                    branch.apply(&step.name, &step.op, None),
                ],
            };
            for next in outcomes.into_iter().flatten() {
                if !after.contains(&next) {
                    after.push(next);
                }
            }
        }
        branches = after;
    }
    let mut worlds: Vec<World> = Vec::new();
    for branch in branches {
        if !worlds.contains(&branch.names) {
            worlds.push(branch.names);
        }
    }
    worlds
}

/// The names `steps` work on, in order.
pub fn names(steps: &[Step]) -> Vec<String> {
    let mut names: Vec<String> = steps.iter().map(|s| s.name.clone()).collect();
    names.sort();
    names.dedup();
    names
}

/// `None` when `found` is a world `steps` may have left their names in; otherwise what is
/// wrong.
pub fn check(steps: &[Step], found: &World) -> Option<String> {
    let worlds = allowed(steps);
    if worlds.contains(found) {
        return None;
    }
    Some(format!(
        "found {}, but the steps {} allow only {}",
        describe(found),
        steps
            .iter()
            .map(|s| format!("{} {}→{:?}", s.name, short(&s.op), s.outcome))
            .collect::<Vec<_>>()
            .join(", "),
        if worlds.is_empty() {
            "none (the acknowledgements contradict each other)".to_string()
        } else {
            worlds.iter().map(describe).collect::<Vec<_>>().join(" or ")
        }
    ))
}

fn short(op: &Op) -> String {
    match op {
        Op::Append(body) => format!(
            "Append({})",
            String::from_utf8_lossy(&body[..body.len().min(32)])
        ),
        other => format!("{other:?}"),
    }
}

/// A world in words.
pub fn describe(world: &World) -> String {
    let one = |state: &State| match state {
        State::Absent => "absent".to_string(),
        State::Gone => "gone".to_string(),
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
                .map(|(o, b)| format!("{o}:{}", String::from_utf8_lossy(&b[..b.len().min(32)])))
                .collect::<Vec<_>>()
        ),
    };
    world
        .iter()
        .map(|(name, state)| format!("{name} {}", one(state)))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(name: &str, op: Op, outcome: Outcome) -> Step {
        Step {
            name: name.into(),
            op,
            outcome,
        }
    }

    fn acked(op: Op, value: Option<u64>) -> Step {
        on("s", op, Outcome::Acked { value })
    }

    fn unknown(op: Op) -> Step {
        on("s", op, Outcome::Unknown)
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

    /// The world of the one name "s".
    fn s(state: State) -> World {
        World::from([("s".to_string(), state)])
    }

    #[test]
    fn acknowledged_steps_leave_one_world() {
        let steps = [
            acked(Op::Create, None),
            acked(append("a"), Some(0)),
            acked(append("b"), Some(1)),
            acked(Op::Close, None),
            on("s", append("late"), Outcome::Refused),
        ];
        let kept = s(present(true, 0, 2, &[(0, "a"), (1, "b")]));
        assert_eq!(allowed(&steps), vec![kept.clone()]);
        assert!(check(&steps, &kept).is_none());
        // A close taken back, a record lost, the late append stored: each is reported.
        for wrong in [
            present(false, 0, 2, &[(0, "a"), (1, "b")]),
            present(true, 0, 1, &[(0, "a")]),
            present(true, 0, 3, &[(0, "a"), (1, "b"), (2, "late")]),
            State::Absent,
        ] {
            let message = check(&steps, &s(wrong)).expect("a violation");
            assert!(message.contains("allow only s closed [0, 2)"), "{message}");
        }
    }

    #[test]
    fn an_unknown_step_may_or_may_not_be_done() {
        let steps = [acked(Op::Create, None), unknown(append("a"))];
        assert_eq!(
            allowed(&steps),
            vec![
                s(present(false, 0, 0, &[])),
                s(present(false, 0, 1, &[(0, "a")]))
            ]
        );
        let steps = [unknown(Op::Create)];
        assert_eq!(
            allowed(&steps),
            vec![s(State::Absent), s(present(false, 0, 0, &[]))]
        );
        let steps = [
            acked(Op::Create, None),
            acked(append("a"), Some(0)),
            unknown(Op::Delete),
        ];
        assert_eq!(
            allowed(&steps),
            vec![s(present(false, 0, 1, &[(0, "a")])), s(State::Absent)]
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
        assert_eq!(
            allowed(&steps),
            vec![s(present(false, 0, 1, &[(0, "new")]))]
        );
        let message = check(&steps, &s(present(false, 0, 2, &[(0, "old"), (1, "new")])))
            .expect("the old incarnation's record is a violation");
        assert!(message.contains("found s open [0, 2)"), "{message}");
    }

    #[test]
    fn a_trim_sets_the_start_it_acknowledged() {
        let steps = [
            acked(Op::Create, None),
            acked(append("a"), Some(0)),
            acked(append("b"), Some(1)),
            acked(Op::Trim(1), Some(1)),
        ];
        assert_eq!(allowed(&steps), vec![s(present(false, 1, 2, &[(1, "b")]))]);
        assert!(check(&steps, &s(present(false, 0, 2, &[(0, "a"), (1, "b")]))).is_some());
        // A trim the node clamped to 0 (nothing stored yet) changed nothing.
        let clamped = [
            acked(Op::Create, None),
            acked(append("a"), Some(0)),
            acked(Op::Trim(1), Some(0)),
        ];
        assert_eq!(
            allowed(&clamped),
            vec![s(present(false, 0, 1, &[(0, "a")]))]
        );
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
        let message = check(&steps, &s(present(false, 0, 1, &[(0, "b")]))).unwrap();
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

    /// The fork plan: a source, its fork, both appended to, the source deleted.
    fn fork_steps(fork_deleted: Outcome) -> Vec<Step> {
        let fork = || Op::Fork {
            source: "src".into(),
        };
        let ok = |value| Outcome::Acked { value };
        let mut steps = vec![
            on("src", Op::Create, ok(None)),
            on("src", append("a"), ok(Some(0))),
            on("fork", fork(), ok(None)),
            on("fork", append("c"), ok(Some(1))),
            on("src", append("d"), ok(Some(1))),
            on("src", Op::Delete, ok(None)),
        ];
        steps.push(on("fork", Op::Delete, fork_deleted));
        steps
    }

    #[test]
    fn a_fork_keeps_its_sources_records_and_a_deleted_source_is_gone_until_its_last_fork_goes() {
        let fork = present(false, 0, 2, &[(0, "a"), (1, "c")]);
        let world = |src: State, fork: State| {
            World::from([("fork".to_string(), fork), ("src".to_string(), src)])
        };
        // The fork still there: the source is gone (410), the fork reads its record.
        let steps = &fork_steps(Outcome::Refused)[..];
        assert_eq!(allowed(steps), vec![world(State::Gone, fork.clone())]);
        // A source record lost from the fork, or a source that came back, are reported.
        assert!(check(
            steps,
            &world(State::Gone, present(false, 1, 2, &[(1, "c")]))
        )
        .is_some());
        let source_back = world(present(false, 0, 2, &[(0, "a"), (1, "d")]), fork.clone());
        assert!(check(steps, &source_back).is_some());
        // The fork deleted: the source goes with it.
        let steps = fork_steps(Outcome::Acked { value: None });
        assert_eq!(allowed(&steps), vec![world(State::Absent, State::Absent)]);
        assert!(check(&steps, &world(State::Gone, State::Absent)).is_some());
        let steps = fork_steps(Outcome::Unknown);
        assert_eq!(
            allowed(&steps),
            vec![
                world(State::Gone, fork),
                world(State::Absent, State::Absent)
            ]
        );
    }

    #[test]
    fn every_plan_is_possible_when_every_step_is_acknowledged() {
        for n in 0..12 {
            let (protocol, planned) = plan("/life-", n, true);
            let steps: Vec<Step> = planned
                .into_iter()
                .map(|p| {
                    let outcome = if p.expected.contains(&409) {
                        Outcome::Refused
                    } else {
                        Outcome::Acked { value: None }
                    };
                    on(&p.name, p.op, outcome)
                })
                .collect();
            assert_eq!(
                allowed(&steps).len(),
                1,
                "plan {n} ({protocol:?}): {steps:?}"
            );
        }
    }
}
