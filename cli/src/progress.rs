//! The progress line of long client operations: `read` of a large stream and `append`
//! of a large input show `read 120000 records, 11.4 MiB, 2.1s` on stderr, redrawn in place,
//! **only when stderr is a terminal** (never in pipes, files or tests). It appears once the
//! operation has run for a while, so short commands print nothing extra, and it is erased
//! before any other stderr line and at the end. `read` and `tail` then end the display with a
//! summary line (also on a terminal only: their stderr is otherwise silent, as in PicoMQ 0.1);
//! `append` prints its summary always, in place of 0.1's acknowledgement per request.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// How long an operation runs before the line first appears.
const FIRST_DRAW: Duration = Duration::from_millis(500);
/// Redraw interval.
const REDRAW: Duration = Duration::from_millis(200);
/// Return to the line start and erase it (ANSI).
const ERASE: &str = "\r\x1b[2K";

pub struct Progress {
    enabled: bool,
    verb: &'static str,
    started: Instant,
    next_draw: Instant,
    drawn: bool,
}

impl Progress {
    /// Enabled if stderr is a terminal.
    pub fn new(verb: &'static str) -> Progress {
        Progress::with(std::io::stderr().is_terminal(), verb, Instant::now())
    }

    fn with(enabled: bool, verb: &'static str, now: Instant) -> Progress {
        Progress {
            enabled,
            verb,
            started: now,
            next_draw: now + FIRST_DRAW,
            drawn: false,
        }
    }

    /// Redraws the line if it is due.
    pub fn update(&mut self, records: u64, bytes: u64) {
        if let Some(text) = self.tick(Instant::now(), records, bytes) {
            write_stderr(&text);
        }
    }

    /// Prints a normal stderr line (an acknowledgement) without mixing it into the progress
    /// line; the progress line comes back at the next update.
    pub fn note(&mut self, line: &str) {
        let erase = self.erase().unwrap_or_default();
        write_stderr(&format!("{erase}{line}\n"));
    }

    /// Whether the display is on (stderr is a terminal).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Time since the operation started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Erases the line (at the end of the operation, or before an error message).
    pub fn finish(&mut self) {
        if let Some(text) = self.erase() {
            write_stderr(&text);
        }
    }

    fn tick(&mut self, now: Instant, records: u64, bytes: u64) -> Option<String> {
        if !self.enabled || now < self.next_draw {
            return None;
        }
        self.next_draw = now + REDRAW;
        self.drawn = true;
        let elapsed = now.duration_since(self.started).as_secs_f64();
        Some(format!(
            "{ERASE}{} {records} records, {:.1} MiB, {elapsed:.1}s",
            self.verb,
            bytes as f64 / (1024.0 * 1024.0)
        ))
    }

    fn erase(&mut self) -> Option<String> {
        std::mem::take(&mut self.drawn).then(|| ERASE.to_owned())
    }
}

/// `1200 records, 34.5 KiB`.
pub fn amount(records: u64, bytes: u64) -> String {
    let noun = if records == 1 { "record" } else { "records" };
    format!("{records} {noun}, {}", size(bytes))
}

/// `0.05s, 24000 records/s, 0.7 MiB/s`: the elapsed time and the average rates over it.
pub fn pace(records: u64, bytes: u64, elapsed: Duration) -> String {
    // A run too short to time says so rather than dividing by (nearly) zero.
    let secs = elapsed.as_secs_f64();
    if secs < 0.001 {
        return format!("{secs:.2}s");
    }
    format!(
        "{secs:.2}s, {:.0} records/s, {}/s",
        records as f64 / secs,
        size((bytes as f64 / secs) as u64)
    )
}

/// Bytes with a binary unit: `512 B`, `34.5 KiB`, `3.0 MiB`, `1.2 GiB`.
pub fn size(bytes: u64) -> String {
    const UNITS: [(&str, u32); 3] = [("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (unit, shift) in UNITS {
        if bytes >= 1 << shift {
            return format!("{:.1} {unit}", bytes as f64 / (1u64 << shift) as f64);
        }
    }
    format!("{bytes} B")
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

fn write_stderr(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_sizes_and_rates() {
        assert_eq!(amount(1, 5), "1 record, 5 B");
        assert_eq!(amount(1200, 35_328), "1200 records, 34.5 KiB");
        assert_eq!(size(3 << 20), "3.0 MiB");
        assert_eq!(size((5 << 30) / 4), "1.2 GiB");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(
            pace(1000, 2 << 20, Duration::from_millis(500)),
            "0.50s, 2000 records/s, 4.0 MiB/s"
        );
        assert_eq!(pace(5, 5, Duration::from_micros(10)), "0.00s");
    }

    #[test]
    fn disabled_progress_prints_nothing() {
        let now = Instant::now();
        let mut p = Progress::with(false, "read", now);
        assert_eq!(p.tick(now + Duration::from_secs(10), 1, 1), None);
        assert_eq!(p.erase(), None);
    }

    #[test]
    fn the_line_appears_late_and_is_throttled() {
        let now = Instant::now();
        let mut p = Progress::with(true, "read", now);
        assert_eq!(p.erase(), None, "nothing drawn, nothing to erase");
        assert_eq!(p.tick(now + Duration::from_millis(100), 5, 10), None);
        let line = p
            .tick(now + Duration::from_millis(600), 1000, 3 << 20)
            .unwrap();
        assert_eq!(line, "\r\x1b[2Kread 1000 records, 3.0 MiB, 0.6s");
        assert_eq!(p.tick(now + Duration::from_millis(700), 1001, 1), None);
        assert!(p.tick(now + Duration::from_millis(800), 1002, 1).is_some());
        assert_eq!(p.erase().as_deref(), Some(ERASE));
        assert_eq!(p.erase(), None);
    }
}
