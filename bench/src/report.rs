//! Latency histograms, the progress line and the final summary (text and JSON) of `pico bench`.

use hdrhistogram::Histogram;

use crate::Protocol;

const MIB: f64 = 1024.0 * 1024.0;

/// Lowest and highest trackable latency in microseconds (1 µs – 60 s), 3 significant digits.
pub(crate) const HIST_LOW_US: u64 = 1;
pub(crate) const HIST_HIGH_US: u64 = 60_000_000;
pub(crate) const HIST_SIGFIG: u8 = 3;

/// A fresh latency histogram (microseconds).
pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(HIST_LOW_US, HIST_HIGH_US, HIST_SIGFIG)
        .expect("valid histogram bounds")
}

/// Records one latency, clamped into the trackable range.
pub(crate) fn record_us(hist: &mut Histogram<u64>, micros: u64) {
    hist.saturating_record(micros.clamp(HIST_LOW_US, HIST_HIGH_US));
}

/// Percentiles of a latency histogram, in milliseconds (all 0 when it is empty).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Latency {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    /// Samples in the histogram.
    pub count: u64,
}

impl Latency {
    pub(crate) fn of(hist: &Histogram<u64>) -> Latency {
        if hist.is_empty() {
            return Latency::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            p50_ms: ms(hist.value_at_quantile(0.50)),
            p90_ms: ms(hist.value_at_quantile(0.90)),
            p99_ms: ms(hist.value_at_quantile(0.99)),
            p999_ms: ms(hist.value_at_quantile(0.999)),
            max_ms: ms(hist.max()),
            count: hist.len(),
        }
    }

    /// `p50 A.AAms p90 B.BBms p99 C.CCms p99.9 D.DDms max E.EEms`
    pub fn text(&self) -> String {
        format!(
            "p50 {:.2}ms p90 {:.2}ms p99 {:.2}ms p99.9 {:.2}ms max {:.2}ms",
            self.p50_ms, self.p90_ms, self.p99_ms, self.p999_ms, self.max_ms
        )
    }
}

/// Bytes and records moved in the measured window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Throughput {
    /// Record payload bytes (the batch framing is not counted).
    pub bytes: u64,
    pub records: u64,
}

impl Throughput {
    pub fn mib_per_sec(&self, elapsed_sec: f64) -> f64 {
        per_sec(self.bytes as f64 / MIB, elapsed_sec)
    }

    pub fn records_per_sec(&self, elapsed_sec: f64) -> f64 {
        per_sec(self.records as f64, elapsed_sec)
    }

    /// `X.XX MiB/s, Y records/s (B bytes, R records in S.SSs)`
    fn text(&self, elapsed_sec: f64) -> String {
        format!(
            "{:.2} MiB/s, {:.0} records/s ({} bytes, {} records in {:.2}s)",
            self.mib_per_sec(elapsed_sec),
            self.records_per_sec(elapsed_sec),
            self.bytes,
            self.records,
            elapsed_sec
        )
    }
}

fn per_sec(amount: f64, secs: f64) -> f64 {
    if secs > 0.0 {
        amount / secs
    } else {
        0.0
    }
}

/// Result of `--live-latency`.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveSummary {
    /// `sse` or `long-poll`.
    pub mode: &'static str,
    /// Records delivered in the measured window.
    pub records: u64,
    /// From just before the append is sent to the moment its record reaches the reader: the
    /// append's own round trip and `fdatasync` included.
    pub latency: Latency,
    /// From the moment the writer has the append's acknowledgement to the moment the reader
    /// has the record; 0 when the reader had it first.
    pub after_ack: Latency,
}

/// Result of `--fan-out`.
#[derive(Clone, Debug, PartialEq)]
pub struct FanOutSummary {
    /// `sse` or `long-poll`.
    pub mode: &'static str,
    pub subscribers: usize,
    /// Subscribers whose first live read was in (long-poll) or answered (SSE) before writing.
    pub connected: usize,
    pub connect_sec: f64,
    /// Records the writer appended (each subscriber expects every one).
    pub records: u64,
    /// Subscribers that got every record, in order, exactly once.
    pub complete: usize,
    pub delivered_min: u64,
    pub delivered_max: u64,
    /// Records not delivered, summed over subscribers.
    pub missed: u64,
    pub duplicates: u64,
    /// Failed live reads (each retried), and the first one's text.
    pub errors: u64,
    pub first_error: Option<String>,
    /// From just before an append is sent to its record reaching a subscriber, over all.
    pub latency: Latency,
    /// CPU of this process over the writing and draining, percent of one core.
    pub client_cpu_percent: f64,
    /// With `--server-pid`: the server's RSS after connecting minus before.
    pub server_rss_growth_bytes: Option<i64>,
}

impl FanOutSummary {
    fn text_lines(&self) -> Vec<String> {
        let mut lines = vec![
            format!(
                "Fan-out ({}): {} of {} subscribers connected in {:.1}s; {} records each expected",
                self.mode, self.connected, self.subscribers, self.connect_sec, self.records
            ),
            format!(
                "Delivered: {} subscribers complete, per subscriber min {} max {}, missed {}, duplicates {}, errors {}",
                self.complete,
                self.delivered_min,
                self.delivered_max,
                self.missed,
                self.duplicates,
                self.errors
            ),
            format!("Append-to-delivery: {}", self.latency.text()),
            format!("Client CPU: {:.0}% of one core", self.client_cpu_percent),
        ];
        if let Some(error) = &self.first_error {
            lines.push(format!("First error: {error}"));
        }
        if let Some(growth) = self.server_rss_growth_bytes {
            lines.push(format!(
                "Server RSS growth: {:.1} MiB ({:.2} KiB per subscriber)",
                growth as f64 / MIB,
                growth as f64 / 1024.0 / self.subscribers.max(1) as f64
            ));
        }
        lines
    }

    fn json(&self) -> String {
        let l = &self.latency;
        format!(
            concat!(
                ",\"fan_out\":{{\"mode\":\"{}\",\"subscribers\":{},\"connected\":{},",
                "\"connect_sec\":{},\"records\":{},\"complete\":{},\"delivered_min\":{},",
                "\"delivered_max\":{},\"missed\":{},\"duplicates\":{},\"errors\":{},",
                "\"p50_ms\":{},\"p90_ms\":{},\"p99_ms\":{},\"p999_ms\":{},\"max_ms\":{},",
                "\"client_cpu_percent\":{},\"server_rss_growth_bytes\":{}}}"
            ),
            self.mode,
            self.subscribers,
            self.connected,
            num(self.connect_sec),
            self.records,
            self.complete,
            self.delivered_min,
            self.delivered_max,
            self.missed,
            self.duplicates,
            self.errors,
            num(l.p50_ms),
            num(l.p90_ms),
            num(l.p99_ms),
            num(l.p999_ms),
            num(l.max_ms),
            num(self.client_cpu_percent),
            self.server_rss_growth_bytes
                .map_or("null".to_string(), |g| g.to_string()),
        )
    }
}

/// What a bench run measured; print it with [`Summary::print_text`] or [`Summary::to_json`].
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub protocol: Protocol,
    pub record_size: usize,
    pub batch: usize,
    pub in_flight: usize,
    pub streams: usize,
    pub connections: usize,
    /// Length of the measured window in seconds.
    pub elapsed_sec: f64,
    /// Acknowledged appends.
    pub write: Throughput,
    /// Per append request (per record in producer mode), send to acknowledgement.
    pub append_latency: Latency,
    /// `None` with `--no-read`.
    pub read: Option<Throughput>,
    /// Only with `--live-latency`.
    pub live: Option<LiveSummary>,
    /// Only with `--fan-out`.
    pub fan_out: Option<FanOutSummary>,
}

impl Summary {
    /// The summary lines of text mode (without a trailing newline).
    pub fn text_lines(&self) -> Vec<String> {
        let mut lines = vec![
            format!("Write: {}", self.write.text(self.elapsed_sec)),
            format!("Append latency: {}", self.append_latency.text()),
        ];
        if let Some(read) = &self.read {
            lines.push(format!("Read: {}", read.text(self.elapsed_sec)));
        }
        if let Some(live) = &self.live {
            lines.push(format!(
                "Live latency ({}): {} ({} records)",
                live.mode,
                live.latency.text(),
                live.records
            ));
            lines.push(format!(
                "Acknowledged to delivered ({}): {}",
                live.mode,
                live.after_ack.text()
            ));
        }
        if let Some(fan_out) = &self.fan_out {
            lines.extend(fan_out.text_lines());
        }
        lines
    }

    /// Text mode: the summary lines on stderr.
    pub fn print_text(&self) {
        for line in self.text_lines() {
            eprintln!("{line}");
        }
    }

    /// JSON mode: one object (print it on stdout). The `read` object is all zeros with
    /// `--no-read`; `live` is present only with `--live-latency`.
    pub fn to_json(&self) -> String {
        let e = self.elapsed_sec;
        let w = &self.write;
        let l = &self.append_latency;
        let r = self.read.unwrap_or_default();
        let mut json = format!(
            concat!(
                "{{\"protocol\":\"{}\",\"record_size\":{},\"batch\":{},\"in_flight\":{},",
                "\"streams\":{},\"connections\":{},\"elapsed_sec\":{},",
                "\"write\":{{\"mib_per_sec\":{},\"records_per_sec\":{},\"bytes\":{},\"records\":{},",
                "\"p50_ms\":{},\"p90_ms\":{},\"p99_ms\":{},\"p999_ms\":{},\"max_ms\":{}}},",
                "\"read\":{{\"mib_per_sec\":{},\"records_per_sec\":{},\"bytes\":{},\"records\":{}}}"
            ),
            self.protocol.name(),
            self.record_size,
            self.batch,
            self.in_flight,
            self.streams,
            self.connections,
            num(e),
            num(w.mib_per_sec(e)),
            num(w.records_per_sec(e)),
            w.bytes,
            w.records,
            num(l.p50_ms),
            num(l.p90_ms),
            num(l.p99_ms),
            num(l.p999_ms),
            num(l.max_ms),
            num(r.mib_per_sec(e)),
            num(r.records_per_sec(e)),
            r.bytes,
            r.records,
        );
        if let Some(live) = &self.live {
            let l = &live.latency;
            let a = &live.after_ack;
            json.push_str(&format!(
                concat!(
                    ",\"live\":{{\"mode\":\"{}\",\"records\":{},\"p50_ms\":{},\"p90_ms\":{},",
                    "\"p99_ms\":{},\"p999_ms\":{},\"max_ms\":{},\"after_ack\":{{\"p50_ms\":{},",
                    "\"p90_ms\":{},\"p99_ms\":{},\"p999_ms\":{},\"max_ms\":{}}}}}"
                ),
                live.mode,
                live.records,
                num(l.p50_ms),
                num(l.p90_ms),
                num(l.p99_ms),
                num(l.p999_ms),
                num(l.max_ms),
                num(a.p50_ms),
                num(a.p90_ms),
                num(a.p99_ms),
                num(a.p999_ms),
                num(a.max_ms),
            ));
        }
        if let Some(fan_out) = &self.fan_out {
            json.push_str(&fan_out.json());
        }
        json.push('}');
        json
    }
}

/// A JSON number with at most 3 decimals (never NaN or infinite).
fn num(value: f64) -> String {
    if !value.is_finite() {
        return "0".into();
    }
    let text = format!("{value:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text.is_empty() || text == "-" || text == "-0" {
        "0".into()
    } else {
        text.to_owned()
    }
}

/// One progress line (rates per interval, percentiles cumulative):
/// `[  1.0s] write    X.XX MiB/s      Y rec/s | read    X.XX MiB/s      Y rec/s | p50 N.NNms p99 N.NNms`
pub(crate) fn progress_line(
    at_sec: f64,
    write: Throughput,
    read: Throughput,
    interval_sec: f64,
    latency: &Latency,
) -> String {
    format!(
        "[{:5.1}s] write {:7.2} MiB/s {:6.0} rec/s | read {:7.2} MiB/s {:6.0} rec/s | p50 {:.2}ms p99 {:.2}ms",
        at_sec,
        write.mib_per_sec(interval_sec),
        write.records_per_sec(interval_sec),
        read.mib_per_sec(interval_sec),
        read.records_per_sec(interval_sec),
        latency.p50_ms,
        latency.p99_ms,
    )
}

/// `created <n> stream[s] for <protocol> bench`
pub(crate) fn created_line(streams: usize, protocol: Protocol) -> String {
    let plural = if streams == 1 { "" } else { "s" };
    format!(
        "created {streams} stream{plural} for {} bench",
        protocol.name()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_summary() -> Summary {
        let mut hist = new_histogram();
        for us in [1_000u64, 2_000, 3_000, 4_000, 100_000] {
            record_us(&mut hist, us);
        }
        Summary {
            protocol: Protocol::Pico,
            record_size: 1024,
            batch: 1,
            in_flight: 32,
            streams: 1,
            connections: 1,
            elapsed_sec: 2.0,
            write: Throughput {
                bytes: 4 * 1024 * 1024,
                records: 4096,
            },
            append_latency: Latency::of(&hist),
            read: Some(Throughput {
                bytes: 2 * 1024 * 1024,
                records: 2048,
            }),
            live: None,
            fan_out: None,
        }
    }

    #[test]
    fn histogram_percentiles_in_ms() {
        let mut hist = new_histogram();
        for us in 1..=1000u64 {
            record_us(&mut hist, us * 10);
        }
        let lat = Latency::of(&hist);
        assert_eq!(lat.count, 1000);
        assert!((lat.p50_ms - 5.0).abs() < 0.01, "{lat:?}");
        assert!((lat.p90_ms - 9.0).abs() < 0.01, "{lat:?}");
        assert!((lat.p99_ms - 9.9).abs() < 0.01, "{lat:?}");
        assert!((lat.max_ms - 10.0).abs() < 0.01, "{lat:?}");
        assert_eq!(
            lat.text(),
            format!(
                "p50 {:.2}ms p90 {:.2}ms p99 {:.2}ms p99.9 {:.2}ms max {:.2}ms",
                lat.p50_ms, lat.p90_ms, lat.p99_ms, lat.p999_ms, lat.max_ms
            )
        );
    }

    #[test]
    fn histogram_clamps_out_of_range_values() {
        let mut hist = new_histogram();
        record_us(&mut hist, 0);
        record_us(&mut hist, 3_600_000_000);
        assert_eq!(hist.len(), 2);
        assert_eq!(hist.min(), 1);
        assert!(hist.max() >= HIST_HIGH_US);
        assert_eq!(Latency::of(&new_histogram()), Latency::default());
        assert_eq!(
            Latency::default().text(),
            "p50 0.00ms p90 0.00ms p99 0.00ms p99.9 0.00ms max 0.00ms"
        );
    }

    #[test]
    fn progress_line_layout() {
        let line = progress_line(
            1.0,
            Throughput {
                bytes: 1024 * 1024 + 512 * 1024,
                records: 1536,
            },
            Throughput {
                bytes: 0,
                records: 0,
            },
            1.0,
            &Latency {
                p50_ms: 0.123,
                p99_ms: 4.5,
                ..Latency::default()
            },
        );
        assert_eq!(
            line,
            "[  1.0s] write    1.50 MiB/s   1536 rec/s | read    0.00 MiB/s      0 rec/s | p50 0.12ms p99 4.50ms"
        );
        // The line's template, with one-character placeholders, has the same columns.
        let template = "[  1.0s] write    X.XX MiB/s      Y rec/s | read    X.XX MiB/s      Y rec/s | p50 N.NNms p99 N.NNms";
        let shape =
            |s: &str| -> Vec<usize> { s.match_indices(['|', '[', ']']).map(|(i, _)| i).collect() };
        let slow = progress_line(
            12.0,
            Throughput {
                bytes: 1024 * 1024,
                records: 1,
            },
            Throughput {
                bytes: 1024 * 1024,
                records: 1,
            },
            1.0,
            &Latency::default(),
        );
        assert_eq!(shape(&slow)[..4], shape(template)[..4], "{slow}");
    }

    #[test]
    fn summary_text_lines() {
        let summary = sample_summary();
        let lines = summary.text_lines();
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[0],
            "Write: 2.00 MiB/s, 2048 records/s (4194304 bytes, 4096 records in 2.00s)"
        );
        assert!(
            lines[1].starts_with("Append latency: p50 3.00ms p90 "),
            "{}",
            lines[1]
        );
        assert!(lines[1].ends_with("max 100.03ms"), "{}", lines[1]);
        assert_eq!(
            lines[2],
            "Read: 1.00 MiB/s, 1024 records/s (2097152 bytes, 2048 records in 2.00s)"
        );
        let no_read = Summary {
            read: None,
            ..summary
        };
        assert_eq!(no_read.text_lines().len(), 2);
    }

    #[test]
    fn summary_json_shape() {
        let summary = sample_summary();
        let value: serde_json::Value = serde_json::from_str(&summary.to_json()).unwrap();
        let keys = |v: &serde_json::Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        let mut top = vec![
            "protocol",
            "record_size",
            "batch",
            "in_flight",
            "streams",
            "connections",
            "elapsed_sec",
            "write",
            "read",
        ];
        top.sort();
        assert_eq!(keys(&value), top);
        let mut write = vec![
            "mib_per_sec",
            "records_per_sec",
            "bytes",
            "records",
            "p50_ms",
            "p90_ms",
            "p99_ms",
            "p999_ms",
            "max_ms",
        ];
        write.sort();
        assert_eq!(keys(&value["write"]), write);
        let mut read = vec!["mib_per_sec", "records_per_sec", "bytes", "records"];
        read.sort();
        assert_eq!(keys(&value["read"]), read);
        assert_eq!(value["protocol"], "pico");
        assert_eq!(value["record_size"], 1024);
        assert_eq!(value["elapsed_sec"], 2.0);
        assert_eq!(value["write"]["mib_per_sec"], 2.0);
        assert_eq!(value["write"]["records"], 4096);
        assert_eq!(value["write"]["p50_ms"], 3.001);
        assert_eq!(value["read"]["records_per_sec"], 1024.0);

        let live = Summary {
            read: None,
            live: Some(LiveSummary {
                mode: "sse",
                records: 10,
                latency: Latency {
                    p50_ms: 1.5,
                    ..Latency::default()
                },
                after_ack: Latency {
                    p99_ms: 0.25,
                    ..Latency::default()
                },
            }),
            ..summary
        };
        let value: serde_json::Value = serde_json::from_str(&live.to_json()).unwrap();
        assert_eq!(value["read"]["records"], 0);
        assert_eq!(value["live"]["mode"], "sse");
        assert_eq!(value["live"]["p50_ms"], 1.5);
        assert_eq!(value["live"]["after_ack"]["p99_ms"], 0.25);
        assert!(live.text_lines()[2].starts_with("Live latency (sse): p50 1.50ms"));
        assert!(live.text_lines()[3].starts_with("Acknowledged to delivered (sse): p50 0.00ms"));
    }

    #[test]
    fn json_numbers() {
        assert_eq!(num(0.0), "0");
        assert_eq!(num(2.0), "2");
        assert_eq!(num(1.23456), "1.235");
        assert_eq!(num(f64::NAN), "0");
        assert_eq!(num(-0.0001), "0");
    }

    #[test]
    fn created_line_plural() {
        assert_eq!(
            created_line(1, Protocol::Pico),
            "created 1 stream for pico bench"
        );
        assert_eq!(
            created_line(4, Protocol::Pico),
            "created 4 streams for pico bench"
        );
    }
}
