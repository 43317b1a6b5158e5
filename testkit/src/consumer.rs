//! A checker for what a named consumer's operations promise across faults
//! (docs/consumers.md, "Guarantees"): an acknowledged registration, acquire or ack stays done,
//! as an acknowledged append stays stored ([`crate::history`]).
//!
//! One client drives one consumer of one stream through a [`Driver`] (the Pico protocol's
//! `/?consumer=NAME` routes): it registers it, acquires it (a new epoch and token), and
//! acknowledges the last record it processed, over and over; every few rounds it acquires
//! again and sends one ack with the token it held before, which must be refused. It records
//! every operation with what it was told ([`Step`]). After the faults, [`check`] holds the
//! steps against what the node serves for the consumer ([`Found`]) and the stream's tail:
//!
//! 1. an acknowledged registration stays: the consumer exists;
//! 2. the epoch is at least every epoch an acquire was given (or the node served before), and
//!    at most the acquires sent (each adds one, from 0);
//! 3. an acquire is given an epoch above every epoch before it: none is handed out twice;
//! 4. the committed offset is the highest acknowledged one (or one served before), or the
//!    offset of an ack whose outcome is unknown above it: an acknowledged ack stays, nothing
//!    never sent is found;
//! 5. no ack is acknowledged with the token of an epoch older than one given out before it was
//!    sent: the fencing holds;
//! 6. the committed offset is within the stream (below its next offset).
//!
//! What the node served once must also stay: the caller adds each observation as a
//! [`Step::Seen`] before the next check.

use serde_json::Value;

/// What an operation's client was told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Told {
    /// A `2xx`.
    Done,
    /// A definite refusal (a `4xx` other than `429`): nothing changed.
    Refused,
    /// No answer, or one that leaves it open (`5xx`, `429`, a cut connection): done or not.
    Unknown,
}

impl Told {
    /// What an answer's status (`None`: no answer) says.
    pub fn of(status: Option<u16>) -> Told {
        match status {
            Some(200..=299) => Told::Done,
            Some(status @ 400..=499) if status != 429 => Told::Refused,
            _ => Told::Unknown,
        }
    }
}

/// One operation on the consumer and what it was told, or one observation of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Register(Told),
    /// An acquire; `epoch`: the one it was given, when done.
    Acquire {
        told: Told,
        epoch: Option<u64>,
    },
    /// An ack of `offset` (the last record processed) with the token of `epoch`.
    Ack {
        epoch: u64,
        offset: i64,
        told: Told,
    },
    /// What the node served for the consumer at a check: it must stay.
    Seen(Found),
}

/// The consumer as the node serves it: its epoch and its committed offset in the stream
/// (the last record processed, `-1` for none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    pub epoch: u64,
    pub offset: i64,
}

/// What is wrong with `found` (`None`: no such consumer) after `steps`, the stream's next
/// offset being `tail`: one message per broken rule, empty when every rule holds.
pub fn check(steps: &[Step], found: Option<Found>, tail: u64) -> Vec<String> {
    let mut wrong = Vec::new();
    // Rules 3 and 5 hold among the steps themselves, in order.
    let mut newest_epoch: Option<u64> = None;
    let mut acquires_sent = 0u64;
    for (i, step) in steps.iter().enumerate() {
        match *step {
            Step::Acquire { told, epoch } => {
                acquires_sent += 1;
                if let (Told::Done, Some(epoch)) = (told, epoch) {
                    if newest_epoch.is_some_and(|newest| epoch <= newest) {
                        wrong.push(format!(
                            "rule 3: step {i}: an acquire was given epoch {epoch}, not above \
                             epoch {} given or served before",
                            newest_epoch.unwrap_or_default()
                        ));
                    }
                    if epoch > acquires_sent {
                        wrong.push(format!(
                            "rule 2: step {i}: an acquire was given epoch {epoch} after only \
                             {acquires_sent} acquires"
                        ));
                    }
                    newest_epoch = Some(newest_epoch.map_or(epoch, |n| n.max(epoch)));
                }
            }
            Step::Ack {
                epoch,
                offset,
                told: Told::Done,
            } => {
                if let Some(newest) = newest_epoch.filter(|&newest| newest > epoch) {
                    wrong.push(format!(
                        "rule 5: step {i}: an ack of {offset} with epoch {epoch}'s token was \
                         acknowledged after epoch {newest} was given out"
                    ));
                }
            }
            Step::Seen(seen) => {
                newest_epoch = Some(newest_epoch.map_or(seen.epoch, |n| n.max(seen.epoch)));
            }
            Step::Register(_) | Step::Ack { .. } => {}
        }
    }
    let registered = steps
        .iter()
        .any(|s| matches!(s, Step::Register(Told::Done) | Step::Seen(_)));
    let Some(found) = found else {
        if registered {
            wrong.push(
                "rule 1: the consumer's registration was acknowledged, yet it is gone".into(),
            );
        }
        return wrong;
    };
    // Rule 2: between what was given and what was asked for.
    let lowest_epoch = steps
        .iter()
        .filter_map(|s| match s {
            Step::Acquire {
                told: Told::Done,
                epoch,
            } => *epoch,
            Step::Seen(seen) => Some(seen.epoch),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    if found.epoch < lowest_epoch || found.epoch > acquires_sent {
        wrong.push(format!(
            "rule 2: the consumer's epoch is {}, not within {lowest_epoch}..={acquires_sent} \
             (the highest epoch given or served, the acquires sent)",
            found.epoch
        ));
    }
    // Rule 4: the highest acknowledged offset, or an unknown ack's above it.
    let committed = steps
        .iter()
        .filter_map(|s| match s {
            Step::Ack {
                offset,
                told: Told::Done,
                ..
            } => Some(*offset),
            Step::Seen(seen) => Some(seen.offset),
            _ => None,
        })
        .fold(-1, i64::max);
    let maybe = |offset: i64| {
        steps
            .iter()
            .any(|s| matches!(s, Step::Ack { offset: o, told: Told::Unknown, .. } if *o == offset))
    };
    if found.offset != committed && !(found.offset > committed && maybe(found.offset)) {
        wrong.push(format!(
            "rule 4: the committed offset is {}, but the highest acknowledged (or served) is \
             {committed} and no ack of unknown outcome named {}",
            found.offset, found.offset
        ));
    }
    // Rule 6.
    if found.offset >= 0 && found.offset as u64 >= tail {
        wrong.push(format!(
            "rule 6: the committed offset {} is past the stream, whose next offset is {tail}",
            found.offset
        ));
    }
    wrong
}

/// Acquires again after this many rounds holding the consumer.
const ROUNDS_PER_EPOCH: u32 = 8;

/// A request's answer as the driver reads it.
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Drives one consumer (`name`, a path) of one `stream` through the Pico protocol, one
/// operation at a time, and records what it was told. It outlives faults: a token it held
/// before one is what it sends with the next fencing probe.
pub struct Driver {
    name: String,
    stream: String,
    lease_ttl_ms: u64,
    registered: bool,
    /// The epoch and token it holds.
    held: Option<(u64, String)>,
    /// Rounds since the last acquire.
    rounds: u32,
    /// Every step so far.
    pub steps: Vec<Step>,
}

impl Driver {
    /// A consumer `name` of `stream`, whose holder's lease lasts `lease_ttl_ms` from each ack.
    pub fn new(name: &str, stream: &str, lease_ttl_ms: u64) -> Driver {
        Driver {
            name: name.to_string(),
            stream: stream.to_string(),
            lease_ttl_ms,
            registered: false,
            held: None,
            rounds: 0,
            steps: Vec::new(),
        }
    }

    /// One round: registers the consumer until that is acknowledged; acquires it when it holds
    /// no token, or has held one for [`ROUNDS_PER_EPOCH`] rounds, and then sends one ack with
    /// the token it held before (which must be refused); acknowledges `processed`, the last
    /// record of the stream it read. `send` makes one request (method, target, headers, body)
    /// and returns its answer, `None` when there was none.
    pub fn round(
        &mut self,
        processed: i64,
        mut send: impl FnMut(&str, &str, &[(&str, &str)], &[u8]) -> Option<Reply>,
    ) {
        let name = self.name.clone();
        let target = |action: &str| format!("/?consumer={name}{action}");
        if !self.registered {
            let body = format!(
                r#"{{"streams":["{}"],"lease_ttl_ms":{}}}"#,
                self.stream, self.lease_ttl_ms
            );
            let reply = send("PUT", &target(""), &[], body.as_bytes());
            let told = Told::of(reply.as_ref().map(|r| r.status));
            self.steps.push(Step::Register(told));
            self.registered = told == Told::Done;
            if !self.registered {
                return;
            }
        }
        if self.held.is_none() || self.rounds >= ROUNDS_PER_EPOCH {
            let before = self.held.take();
            let reply = send("POST", &target("&action=acquire"), &[], b"");
            let told = Told::of(reply.as_ref().map(|r| r.status));
            let given = reply
                .filter(|_| told == Told::Done)
                .and_then(|r| serde_json::from_slice::<Value>(&r.body).ok())
                .and_then(|v| Some((v["epoch"].as_u64()?, v["token"].as_str()?.to_string())));
            self.steps.push(Step::Acquire {
                told,
                epoch: given.as_ref().map(|(epoch, _)| *epoch),
            });
            self.rounds = 0;
            self.held = given;
            if self.held.is_none() {
                // Not known to hold it: the next round acquires again.
                return;
            }
            if let Some((epoch, token)) = before {
                self.ack(epoch, &token, processed, &mut send);
            }
        }
        let Some((epoch, token)) = self.held.clone() else {
            return;
        };
        self.rounds += 1;
        if let Told::Refused = self.ack(epoch, &token, processed, &mut send) {
            // The lease lapsed, or an acquire of unknown outcome took the consumer over: hold
            // it again next round.
            self.held = None;
        }
    }

    fn ack(
        &mut self,
        epoch: u64,
        token: &str,
        offset: i64,
        send: &mut impl FnMut(&str, &str, &[(&str, &str)], &[u8]) -> Option<Reply>,
    ) -> Told {
        let body = format!(
            r#"{{"offsets":[{{"stream":"{}","offset":{offset}}}]}}"#,
            self.stream
        );
        let target = format!("/?consumer={}&action=ack", self.name);
        let reply = send(
            "POST",
            &target,
            &[("pico-consumer-token", token)],
            body.as_bytes(),
        );
        let told = Told::of(reply.map(|r| r.status));
        self.steps.push(Step::Ack {
            epoch,
            offset,
            told,
        });
        told
    }

    /// The consumer as the node serves it now (`None`: `404`, no such consumer), from one
    /// answer to `GET /?consumer=NAME`; an error for any other answer.
    pub fn found(&self, reply: Option<Reply>) -> Result<Option<Found>, String> {
        let reply = reply.ok_or("GET of the consumer: no answer")?;
        if reply.status == 404 {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(&reply.body);
        if reply.status != 200 {
            return Err(format!("GET of the consumer: {} {text}", reply.status));
        }
        let view: Value = serde_json::from_slice(&reply.body)
            .map_err(|e| format!("GET of the consumer: {e}: {text}"))?;
        let cursor = view["streams"]
            .as_array()
            .and_then(|streams| streams.iter().find(|s| s["stream"] == self.stream.as_str()));
        match (
            view["epoch"].as_u64(),
            cursor.and_then(|c| c["offset"].as_i64()),
        ) {
            (Some(epoch), Some(offset)) => Ok(Some(Found { epoch, offset })),
            _ => Err(format!("GET of the consumer: no epoch or offset in {text}")),
        }
    }

    /// The target that reads the consumer.
    pub fn target(&self) -> String {
        format!("/?consumer={}", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acquired(epoch: u64) -> Step {
        Step::Acquire {
            told: Told::Done,
            epoch: Some(epoch),
        }
    }

    fn ack(epoch: u64, offset: i64, told: Told) -> Step {
        Step::Ack {
            epoch,
            offset,
            told,
        }
    }

    fn good() -> Vec<Step> {
        vec![
            Step::Register(Told::Done),
            acquired(1),
            ack(1, 4, Told::Done),
            ack(1, 9, Told::Done),
            acquired(2),
            ack(1, 9, Told::Refused),
            ack(2, 12, Told::Done),
        ]
    }

    fn rules(steps: &[Step], found: Option<Found>, tail: u64) -> Vec<String> {
        check(steps, found, tail)
            .iter()
            .map(|m| m.split(':').next().unwrap().to_string())
            .collect()
    }

    #[test]
    fn what_was_acknowledged_holds() {
        let found = Found {
            epoch: 2,
            offset: 12,
        };
        assert_eq!(check(&good(), Some(found), 13), Vec::<String>::new());
    }

    #[test]
    fn each_broken_rule_is_found() {
        let at = |epoch, offset| Some(Found { epoch, offset });
        assert_eq!(rules(&good(), None, 13), ["rule 1"]);
        assert_eq!(rules(&good(), at(1, 12), 13), ["rule 2"], "epoch went back");
        assert_eq!(
            rules(&good(), at(3, 12), 13),
            ["rule 2"],
            "an epoch never asked"
        );
        assert_eq!(rules(&good(), at(2, 9), 13), ["rule 4"], "an ack lost");
        assert_eq!(
            rules(&good(), at(2, 15), 16),
            ["rule 4"],
            "an ack never sent"
        );
        assert_eq!(rules(&good(), at(2, 12), 12), ["rule 6"], "past the tail");
        let mut reused = good();
        reused.push(acquired(2));
        assert_eq!(rules(&reused, at(2, 12), 13), ["rule 3"]);
        let mut zombie = good();
        zombie[5] = ack(1, 9, Told::Done);
        assert_eq!(rules(&zombie, at(2, 12), 13), ["rule 5"]);
    }

    #[test]
    fn an_unknown_step_may_or_may_not_be_done() {
        let mut steps = good();
        steps.push(Step::Acquire {
            told: Told::Unknown,
            epoch: None,
        });
        steps.push(ack(2, 20, Told::Unknown));
        for found in [(2, 12), (3, 12), (2, 20), (3, 20)] {
            let found = Found {
                epoch: found.0,
                offset: found.1,
            };
            assert_eq!(check(&steps, Some(found), 21), Vec::<String>::new());
        }
        // An unknown ack below the committed offset cannot be what is found.
        steps.push(ack(2, 10, Told::Unknown));
        let found = Found {
            epoch: 2,
            offset: 10,
        };
        assert_eq!(rules(&steps, Some(found), 21), ["rule 4"]);
        // A registration of unknown outcome may have left nothing.
        assert!(check(&[Step::Register(Told::Unknown)], None, 0).is_empty());
    }

    #[test]
    fn what_was_served_once_stays() {
        let mut steps = good();
        steps.push(ack(2, 20, Told::Unknown));
        steps.push(Step::Seen(Found {
            epoch: 2,
            offset: 20,
        }));
        let back = Found {
            epoch: 2,
            offset: 12,
        };
        assert_eq!(rules(&steps, Some(back), 21), ["rule 4"]);
        // An acquire after it must be given a newer epoch than the one served.
        steps.push(acquired(2));
        let found = Found {
            epoch: 2,
            offset: 20,
        };
        assert_eq!(rules(&steps, Some(found), 21), ["rule 3"]);
    }

    #[test]
    fn the_driver_registers_acquires_acks_and_probes_the_fencing() {
        let mut driver = Driver::new("/c", "/s", 60_000);
        let mut epoch = 0;
        let mut sent = Vec::new();
        for round in 0..(ROUNDS_PER_EPOCH as i64 + 2) {
            driver.round(round, |method, target, headers, body| {
                sent.push(format!(
                    "{method} {target} {:?} {}",
                    headers,
                    String::from_utf8_lossy(body)
                ));
                let stale = headers
                    .first()
                    .is_some_and(|(_, token)| *token != format!("t{epoch}"));
                let (status, body) = match target {
                    t if t.ends_with("acquire") => {
                        epoch += 1;
                        (200, format!(r#"{{"epoch":{epoch},"token":"t{epoch}"}}"#))
                    }
                    _ if stale => (409, String::new()),
                    _ => (200, String::new()),
                };
                Some(Reply {
                    status,
                    body: body.into_bytes(),
                })
            });
        }
        assert_eq!(
            sent[0],
            r#"PUT /?consumer=/c [] {"streams":["/s"],"lease_ttl_ms":60000}"#
        );
        assert_eq!(sent[1], "POST /?consumer=/c&action=acquire [] ");
        assert_eq!(
            sent[2],
            r#"POST /?consumer=/c&action=ack [("pico-consumer-token", "t1")] {"offsets":[{"stream":"/s","offset":0}]}"#
        );
        assert!(
            driver.steps.contains(&ack(1, 8, Told::Refused)),
            "the probe"
        );
        assert!(driver.steps.contains(&acquired(2)));
        let found = Found {
            epoch: 2,
            offset: ROUNDS_PER_EPOCH as i64 + 1,
        };
        assert_eq!(check(&driver.steps, Some(found), 100), Vec::<String>::new());
    }
}
