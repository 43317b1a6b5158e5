//! A history checker for fault tests (the Jepsen discipline): clients record every operation
//! they invoke on a stream with its invoke and completion times and what it returned, while
//! faults are injected; [`check`] then verifies the durability promises of
//! docs/durability.md against the whole history and a final read of the stream.
//!
//! The rules:
//! 1. every acknowledged append is in the final read exactly once, at its acknowledged offset
//!    when the answer named one;
//! 2. the final read's offsets are contiguous from its first;
//! 3. no read (live or final) returns a record that was never sent;
//! 4. a reader never sees offsets go backwards, nor skip (its reads continue where the last
//!    one ended);
//! 5. whatever a reader was served stays: the final read has the same body at that offset
//!    (nothing served before a crash is missing or different after it);
//! 6. an append that failed or timed out is absent or present exactly once, never twice:
//!    a producer's retries of one sequence number count once (exactly-once).
//!
//! Bodies identify appends, so every append in a history must send a body of its own (a
//! retry of the same producer sequence resends the same body).

use std::collections::{BTreeMap, HashMap};

/// What an append's client was told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A `2xx`: acknowledged, at this offset when the answer said.
    Acked { offset: Option<u64> },
    /// Anything else: an error status, a closed connection, a timeout. The append may or may
    /// not have been stored.
    NotAcked,
}

#[derive(Clone, Debug)]
pub struct Append {
    /// Who sent it (for messages).
    pub client: String,
    pub body: Vec<u8>,
    pub invoked_ms: u64,
    pub completed_ms: u64,
    pub outcome: Outcome,
}

/// One read answered to a reader: the records it returned, in order.
#[derive(Clone, Debug)]
pub struct Read {
    pub reader: String,
    /// Where the reader asked to start.
    pub from: u64,
    pub records: Vec<(u64, Vec<u8>)>,
    pub invoked_ms: u64,
    pub completed_ms: u64,
}

/// Everything clients did to one stream.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub appends: Vec<Append>,
    pub reads: Vec<Read>,
}

/// A broken promise, said in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub rule: u8,
    pub message: String,
}

/// Checks `history` against `last`, a complete read of the stream after the faults (from its
/// start, once the node was healthy again). Empty when every rule holds.
pub fn check(history: &History, last: &[(u64, Vec<u8>)]) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut violation = |rule: u8, message: String| violations.push(Violation { rule, message });
    let sent: HashMap<&[u8], &Append> = history
        .appends
        .iter()
        .map(|a| (a.body.as_slice(), a))
        .collect();
    let mut found: HashMap<&[u8], Vec<u64>> = HashMap::new();
    for (offset, body) in last {
        found.entry(body.as_slice()).or_default().push(*offset);
    }
    let at: BTreeMap<u64, &[u8]> = last.iter().map(|(o, b)| (*o, b.as_slice())).collect();

    // 1 and 6: every append's presence.
    let mut acked_twice = HashMap::new();
    for append in &history.appends {
        let offsets = found
            .get(append.body.as_slice())
            .cloned()
            .unwrap_or_default();
        match append.outcome {
            Outcome::Acked { offset } => {
                if acked_twice.insert(append.body.as_slice(), ()).is_some() {
                    // A producer retry acknowledged again (a duplicate answer): one append.
                    continue;
                }
                match (offsets.as_slice(), offset) {
                    ([], _) => violation(
                        1,
                        format!(
                            "{}: acknowledged append {:?} (completed at {} ms) is lost",
                            append.client,
                            text(&append.body),
                            append.completed_ms
                        ),
                    ),
                    ([got], Some(want)) if *got != want => violation(
                        1,
                        format!(
                            "{}: append {:?} acknowledged at offset {want} is at {got}",
                            append.client,
                            text(&append.body)
                        ),
                    ),
                    ([_], _) => {}
                    (many, _) => violation(
                        1,
                        format!(
                            "{}: acknowledged append {:?} is stored {} times, at {many:?}",
                            append.client,
                            text(&append.body),
                            many.len()
                        ),
                    ),
                }
            }
            Outcome::NotAcked => {
                if offsets.len() > 1 {
                    violation(
                        6,
                        format!(
                            "{}: unacknowledged append {:?} is stored {} times, at {offsets:?}",
                            append.client,
                            text(&append.body),
                            offsets.len()
                        ),
                    );
                }
            }
        }
    }
    // 2: contiguous offsets.
    for pair in last.windows(2) {
        if pair[1].0 != pair[0].0 + 1 {
            violation(
                2,
                format!(
                    "the stream skips from offset {} to {}",
                    pair[0].0, pair[1].0
                ),
            );
        }
    }
    // 3: nothing that was never sent.
    for (offset, body) in last {
        if !sent.contains_key(body.as_slice()) {
            violation(
                3,
                format!("offset {offset} holds {:?}, never sent", text(body)),
            );
        }
    }
    // 3, 4 and 5 for every live read.
    let mut next_of: HashMap<&str, u64> = HashMap::new();
    for read in &history.reads {
        let reader = read.reader.as_str();
        if let Some(&next) = next_of.get(reader) {
            if read.from < next {
                violation(
                    4,
                    format!(
                        "{reader} asked from {} after having read to {next}",
                        read.from
                    ),
                );
            }
        }
        let mut expected = read.from;
        for (offset, body) in &read.records {
            if *offset != expected {
                violation(
                    4,
                    format!(
                        "{reader}: a read from {} returned offset {offset} where {expected} was due",
                        read.from
                    ),
                );
            }
            expected = offset + 1;
            if !sent.contains_key(body.as_slice()) {
                violation(
                    3,
                    format!("{reader} read {:?} at {offset}, never sent", text(body)),
                );
            }
            match at.get(offset) {
                Some(kept) if kept == body => {}
                Some(kept) => violation(
                    5,
                    format!(
                        "{reader} read {:?} at {offset} (at {} ms); the stream now has {:?} there",
                        text(body),
                        read.completed_ms,
                        text(kept)
                    ),
                ),
                None => violation(
                    5,
                    format!(
                        "{reader} read {:?} at {offset} (at {} ms); the stream lost it",
                        text(body),
                        read.completed_ms
                    ),
                ),
            }
        }
        next_of.insert(reader, expected.max(read.from));
    }
    violations
}

fn text(body: &[u8]) -> String {
    String::from_utf8_lossy(body).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn append(body: &str, outcome: Outcome) -> Append {
        Append {
            client: "w".into(),
            body: body.as_bytes().to_vec(),
            invoked_ms: 0,
            completed_ms: 1,
            outcome,
        }
    }

    fn acked(body: &str, offset: u64) -> Append {
        append(
            body,
            Outcome::Acked {
                offset: Some(offset),
            },
        )
    }

    fn read(reader: &str, from: u64, records: &[(u64, &str)]) -> Read {
        Read {
            reader: reader.into(),
            from,
            records: records
                .iter()
                .map(|(o, b)| (*o, b.as_bytes().to_vec()))
                .collect(),
            invoked_ms: 0,
            completed_ms: 1,
        }
    }

    fn stream(records: &[(u64, &str)]) -> Vec<(u64, Vec<u8>)> {
        records
            .iter()
            .map(|(o, b)| (*o, b.as_bytes().to_vec()))
            .collect()
    }

    fn rules(history: &History, last: &[(u64, Vec<u8>)]) -> Vec<u8> {
        check(history, last).iter().map(|v| v.rule).collect()
    }

    fn good() -> History {
        History {
            appends: vec![
                acked("a", 0),
                append("b", Outcome::NotAcked),
                acked("c", 2),
                append("d", Outcome::NotAcked),
                append("p", Outcome::Acked { offset: None }),
            ],
            reads: vec![
                read("r", 0, &[(0, "a"), (1, "b")]),
                read("r", 2, &[(2, "c")]),
            ],
        }
    }

    #[test]
    fn a_history_that_keeps_every_promise_passes() {
        let last = stream(&[(0, "a"), (1, "b"), (2, "c"), (3, "p")]);
        assert_eq!(check(&good(), &last), vec![]);
    }

    #[test]
    fn each_broken_rule_is_found() {
        // 1: an acknowledged append lost, moved, or stored twice.
        assert_eq!(
            rules(&good(), &stream(&[(0, "a"), (1, "b"), (2, "p")])),
            [1, 5]
        );
        let moved = stream(&[(0, "a"), (1, "b"), (2, "p"), (3, "c")]);
        assert_eq!(rules(&good(), &moved), [1, 5]);
        let twice = stream(&[(0, "a"), (1, "b"), (2, "c"), (3, "p"), (4, "p")]);
        assert_eq!(rules(&good(), &twice), [1]);
        // 2: a gap.
        let gap = stream(&[(0, "a"), (1, "b"), (2, "c"), (4, "p")]);
        assert_eq!(rules(&good(), &gap), [2]);
        // 3: a record nobody sent, in the stream or in a read.
        let invented = stream(&[(0, "a"), (1, "b"), (2, "c"), (3, "p"), (4, "x")]);
        assert_eq!(rules(&good(), &invented), [3]);
        let mut bad_read = good();
        bad_read.reads.push(read("q", 0, &[(0, "y")]));
        let last = stream(&[(0, "a"), (1, "b"), (2, "c"), (3, "p")]);
        assert_eq!(rules(&bad_read, &last), [3, 5]);
        // 4: a reader going backwards, or a read that skips.
        let mut back = good();
        back.reads.push(read("r", 1, &[(1, "b")]));
        assert_eq!(rules(&back, &last), [4]);
        let mut skip = good();
        skip.reads.push(read("s", 0, &[(0, "a"), (2, "c")]));
        assert_eq!(rules(&skip, &last), [4]);
        // 5: a record served to a reader that the stream no longer has.
        let mut served = good();
        served.reads.push(read("t", 3, &[(3, "d")]));
        assert_eq!(rules(&served, &last), [5]);
        // 6: an unacknowledged append (a producer retry) stored twice.
        let dup = stream(&[(0, "a"), (1, "b"), (2, "c"), (3, "p"), (4, "b")]);
        assert_eq!(rules(&good(), &dup), [6]);
    }
}
