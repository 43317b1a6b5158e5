//! Streaming scanners over a live response's payload: the `f<seq>:<µs>;` record tokens, and
//! one JSON string field (the Durable Streams SSE `streamNextOffset`). Both keep their state
//! across reads, so a token split between two reads (or two HTTP chunks) is still found.

use std::sync::atomic::Ordering;

use super::SubCounters;

/// Longest token: `f`, 20 digits, `:`, 20 digits, `;`.
pub(super) const TOKEN_BYTES_MAX: usize = 43;

#[derive(Default)]
pub(super) struct TokenScanner {
    /// 0: looking for `f`; 1: in the sequence digits; 2: in the microsecond digits.
    state: u8,
    digits: u8,
    seq: u64,
    micros: u64,
}

impl TokenScanner {
    /// Calls `on_token(seq, sent_us)` for every complete token in `bytes`.
    pub(super) fn feed(&mut self, bytes: &[u8], mut on_token: impl FnMut(u64, u64)) {
        let mut i = 0;
        while i < bytes.len() {
            if self.state == 0 {
                // Padding and framing are skipped in one pass.
                match bytes[i..].iter().position(|&b| b == b'f') {
                    Some(at) => i += at,
                    None => return,
                }
            }
            let b = bytes[i];
            i += 1;
            match (self.state, b) {
                (_, b'f') => {
                    self.state = 1;
                    self.digits = 0;
                    self.seq = 0;
                }
                (1 | 2, b'0'..=b'9') => {
                    let value = if self.state == 1 {
                        &mut self.seq
                    } else {
                        &mut self.micros
                    };
                    match value
                        .checked_mul(10)
                        .and_then(|v| v.checked_add(u64::from(b - b'0')))
                    {
                        Some(v) => {
                            *value = v;
                            self.digits += 1;
                        }
                        None => self.state = 0,
                    }
                }
                (1, b':') if self.digits > 0 => {
                    self.state = 2;
                    self.digits = 0;
                    self.micros = 0;
                }
                (2, b';') if self.digits > 0 => {
                    self.state = 0;
                    on_token(self.seq, self.micros);
                }
                _ => self.state = 0,
            }
        }
    }
}

/// One subscriber's view of the sequence: what it expects next and what it has seen.
#[derive(Default)]
pub(super) struct Delivery {
    pub next_seq: u64,
    delivered: u64,
    duplicates: u64,
    gaps: u64,
}

impl Delivery {
    /// Accounts for record `seq`; true when it is new (its latency counts).
    pub(super) fn deliver(&mut self, seq: u64) -> bool {
        if seq < self.next_seq {
            self.duplicates += 1;
            return false;
        }
        if seq > self.next_seq {
            self.gaps += seq - self.next_seq;
        }
        self.next_seq = seq + 1;
        self.delivered += 1;
        true
    }

    pub(super) fn publish(&self, counters: &SubCounters) {
        counters.next_seq.store(self.next_seq, Ordering::Relaxed);
        counters.delivered.store(self.delivered, Ordering::Relaxed);
        counters
            .duplicates
            .store(self.duplicates, Ordering::Relaxed);
        counters.gaps.store(self.gaps, Ordering::Relaxed);
    }
}

/// Captures the value of the last `"key":"value"` seen (keys include the quotes and colon).
pub(super) struct KeyCapture {
    key: &'static [u8],
    matched: usize,
    capturing: bool,
    value: Vec<u8>,
    last: Option<String>,
}

/// Longest value kept; a longer one is dropped (offsets are a few dozen bytes).
const CAPTURE_BYTES_MAX: usize = 256;

impl KeyCapture {
    pub(super) fn new(key: &'static [u8]) -> KeyCapture {
        KeyCapture {
            key,
            matched: 0,
            capturing: false,
            value: Vec::new(),
            last: None,
        }
    }

    pub(super) fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.capturing {
                if b == b'"' {
                    self.capturing = false;
                    self.last = String::from_utf8(std::mem::take(&mut self.value)).ok();
                } else if self.value.len() < CAPTURE_BYTES_MAX {
                    self.value.push(b);
                } else {
                    self.capturing = false;
                    self.value.clear();
                }
                continue;
            }
            if b == self.key[self.matched] {
                self.matched += 1;
            } else {
                self.matched = usize::from(b == self.key[0]);
            }
            if self.matched == self.key.len() {
                self.matched = 0;
                self.capturing = true;
                self.value.clear();
            }
        }
    }

    /// The last complete value, once.
    pub(super) fn take(&mut self) -> Option<String> {
        self.last.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_found_across_reads_and_framing() {
        let mut scanner = TokenScanner::default();
        let mut seen = Vec::new();
        let stream = b"event: data\ndata:[{\"seq\":0,\"body\":\"f0:15;xxfalse\"},{\"body\":\"f1:2";
        scanner.feed(stream, |s, t| seen.push((s, t)));
        scanner.feed(
            b"0;\"}]\n\nf:1; f1; f2:; fx3:4; f99999999999999999999999:1;",
            |s, t| seen.push((s, t)),
        );
        assert_eq!(seen, vec![(0, 15), (1, 20)]);
    }

    #[test]
    fn delivery_counts_order_gaps_and_duplicates() {
        let mut d = Delivery::default();
        assert!(d.deliver(0));
        assert!(d.deliver(1));
        assert!(!d.deliver(1));
        assert!(d.deliver(4));
        assert_eq!(
            (d.next_seq, d.delivered, d.duplicates, d.gaps),
            (5, 3, 1, 2)
        );
        let counters = SubCounters::default();
        d.publish(&counters);
        assert_eq!(counters.gaps.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn key_capture_keeps_the_last_value() {
        let mut c = KeyCapture::new(b"\"streamNextOffset\":\"");
        c.feed(b"data:{\"streamNextOffset\":\"0_1");
        assert_eq!(c.take(), None);
        c.feed(b"2\",\"x\":1}\n\ndata:{\"\"streamNextOffset\":\"0_20\"}");
        assert_eq!(c.take().as_deref(), Some("0_20"));
        assert_eq!(c.take(), None);
    }
}
