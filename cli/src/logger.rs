//! A minimal `log` backend: lines on stderr with a UTC timestamp, filtered like `RUST_LOG`
//! (`info`, `debug`, `pico_net=trace,warn`, a bare target means all its levels). The
//! default is `info`. Kept tiny on purpose: the server's hot paths should log little.
//!
//! The `glommio` target is **off** unless `RUST_LOG` names it (`glommio=warn`, `glommio`,
//! `glommio::reactor=error`, ...): at every start glommio logs
//! `ERROR glommio::reactor: got unexpected error when probing iopoll support` when the
//! kernel or file system has no io_uring polled I/O, which is harmless (it falls back to
//! interrupt-driven I/O) but looks alarming at ERROR level. A bare level such as
//! `RUST_LOG=trace` does not re-enable it; `RUST_LOG=trace,glommio=trace` does.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use log::{LevelFilter, Log, Metadata, Record};

/// Targets silenced unless `RUST_LOG` names them (see the module documentation).
const QUIET_TARGETS: &[&str] = &["glommio"];

/// `RUST_LOG` directives: a default level and per-target (module prefix) levels.
#[derive(Debug, PartialEq, Eq)]
pub struct Filter {
    default: LevelFilter,
    /// Longest target first, so the most specific directive wins.
    targets: Vec<(String, LevelFilter)>,
}

impl Filter {
    /// Parses `spec`; unknown level names are reported in the second value and ignored.
    pub fn parse(spec: &str) -> (Filter, Vec<String>) {
        let mut filter = Filter {
            default: LevelFilter::Info,
            targets: Vec::new(),
        };
        let mut problems = Vec::new();
        for directive in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            match directive.split_once('=') {
                Some((target, level)) => match level.trim().parse() {
                    Ok(level) => filter.targets.push((target.trim().to_owned(), level)),
                    Err(_) => problems.push(directive.to_owned()),
                },
                None => match directive.parse() {
                    Ok(level) => filter.default = level,
                    // Not a level: a target name, enabled at every level.
                    Err(_) if is_target(directive) => filter
                        .targets
                        .push((directive.to_owned(), LevelFilter::Trace)),
                    Err(_) => problems.push(directive.to_owned()),
                },
            }
        }
        for quiet in QUIET_TARGETS {
            let named = filter
                .targets
                .iter()
                .any(|(target, _)| same_or_child(target, quiet) || same_or_child(quiet, target));
            if !named {
                filter.targets.push(((*quiet).to_owned(), LevelFilter::Off));
            }
        }
        filter
            .targets
            .sort_by_key(|(target, _)| std::cmp::Reverse(target.len()));
        (filter, problems)
    }

    pub fn level_for(&self, target: &str) -> LevelFilter {
        self.targets
            .iter()
            .find(|(prefix, _)| same_or_child(target, prefix))
            .map_or(self.default, |(_, level)| *level)
    }

    fn max_level(&self) -> LevelFilter {
        self.targets
            .iter()
            .map(|(_, l)| *l)
            .fold(self.default, std::cmp::max)
    }
}

/// `target` is `prefix` or a module below it (`glommio::reactor` under `glommio`).
fn same_or_child(target: &str, prefix: &str) -> bool {
    target == prefix
        || target
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with("::"))
}

fn is_target(s: &str) -> bool {
    s.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '-')
}

struct StderrLogger {
    filter: Filter,
}

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= self.filter.level_for(metadata.target())
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = format!(
            "{} {:<5} {}: {}\n",
            utc_timestamp(SystemTime::now()),
            record.level(),
            record.target(),
            record.args()
        );
        // One write per line so lines of different threads do not interleave; a closed
        // stderr is nothing we could report anywhere.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

/// Installs the logger from `RUST_LOG`. Calling it twice keeps the first logger.
pub fn init() {
    let spec = std::env::var("RUST_LOG").unwrap_or_default();
    let (filter, problems) = Filter::parse(&spec);
    let max = filter.max_level();
    // Leaked once: the logger lives as long as the process, as `log` requires.
    let logger: &'static StderrLogger = Box::leak(Box::new(StderrLogger { filter }));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(max);
        for problem in problems {
            log::warn!("ignoring RUST_LOG directive {problem:?}: unknown level");
        }
    }
}

/// `2026-05-01T12:34:56.789Z`.
pub fn utc_timestamp(time: SystemTime) -> String {
    let since_epoch = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let ms = i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX);
    let text = pico_net::time::format_rfc3339_ms(ms);
    // Always three digits of milliseconds in a log line, so that lines align.
    match text.strip_suffix('Z').filter(|t| !t.contains('.')) {
        Some(whole_seconds) => format!("{whole_seconds}.000Z"),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(utc_timestamp(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(951_782_400_123); // leap day 2000
        assert_eq!(utc_timestamp(t), "2000-02-29T00:00:00.123Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_767_225_599); // last second of 2025
        assert_eq!(utc_timestamp(t), "2025-12-31T23:59:59.000Z");
    }

    #[test]
    fn filters() {
        let (f, problems) = Filter::parse("");
        assert!(problems.is_empty());
        assert_eq!(f.level_for("pico_net"), LevelFilter::Info);

        let (f, _) = Filter::parse("warn,pico_net=debug,pico_net::http=trace,hyper=off");
        assert_eq!(f.level_for("pico_cli"), LevelFilter::Warn);
        assert_eq!(f.level_for("pico_net"), LevelFilter::Debug);
        assert_eq!(f.level_for("pico_net::shard"), LevelFilter::Debug);
        assert_eq!(f.level_for("pico_net::http::parse"), LevelFilter::Trace);
        assert_eq!(f.level_for("pico_network"), LevelFilter::Warn);
        assert_eq!(f.level_for("hyper"), LevelFilter::Off);
        assert_eq!(f.max_level(), LevelFilter::Trace);

        let (f, problems) = Filter::parse("pico_engine, x=loud");
        assert_eq!(f.level_for("pico_engine::wal"), LevelFilter::Trace);
        assert_eq!(problems, vec!["x=loud".to_owned()]);
    }

    #[test]
    fn glommio_is_off_unless_named() {
        for spec in [
            "",
            "info",
            "trace",
            "error",
            "pico_net=debug",
            "glommiox=info",
        ] {
            let (f, _) = Filter::parse(spec);
            assert_eq!(f.level_for("glommio"), LevelFilter::Off, "{spec:?}");
            assert_eq!(
                f.level_for("glommio::reactor"),
                LevelFilter::Off,
                "{spec:?}"
            );
        }
        // Named, at any depth: the user's level applies.
        let (f, _) = Filter::parse("glommio=warn");
        assert_eq!(f.level_for("glommio::reactor"), LevelFilter::Warn);
        let (f, _) = Filter::parse("info,glommio");
        assert_eq!(f.level_for("glommio::reactor"), LevelFilter::Trace);
        let (f, _) = Filter::parse("glommio::reactor=error");
        assert_eq!(f.level_for("glommio::reactor"), LevelFilter::Error);
        // Other glommio modules then follow the default level.
        assert_eq!(f.level_for("glommio::sys"), LevelFilter::Info);
        // Silencing glommio does not raise the maximum level.
        let (f, _) = Filter::parse("warn");
        assert_eq!(f.max_level(), LevelFilter::Warn);
    }
}
