//! The server's `log` backend: env_logger, one line per record on stderr with a UTC
//! timestamp, filtered by `RUST_LOG` (`info`, `debug`, `pico_net=trace,warn`; a bare target
//! means all its levels; a target covers every target it is a prefix of, as in env_logger).
//! The default is `info`. `--log-format json` prints each record as a JSON object instead.
//!
//! The `glommio` target is **off** unless `RUST_LOG` names it (`glommio=warn`, `glommio`,
//! `glommio::reactor=error`, ...): at every start glommio logs
//! `ERROR glommio::reactor: got unexpected error when probing iopoll support` when the
//! kernel or file system has no io_uring polled I/O, which is harmless (it falls back to
//! interrupt-driven I/O) but looks alarming at ERROR level. A bare level such as
//! `RUST_LOG=trace` does not re-enable it; `RUST_LOG=trace,glommio=trace` does.

use std::borrow::Cow;
use std::io::Write;
use std::num::NonZeroU8;
use std::time::SystemTime;

use log::{LevelFilter, Record};
use time::format_description::well_known::iso8601::{Config, EncodedConfig, TimePrecision};
use time::format_description::well_known::Iso8601;
use time::OffsetDateTime;

/// Targets silenced unless `RUST_LOG` names them (see the module documentation).
const QUIET_TARGETS: &[&str] = &["glommio"];

/// How each line looks (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `2026-05-01T12:34:56.789Z INFO  pico_net::server: message`
    Text,
    /// One object per line:
    /// `{"ts":"2026-05-01T12:34:56.789Z","level":"INFO","target":"pico_net::server","msg":"hi"}`
    Json,
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(value: &str) -> Result<Format, String> {
        match value.to_ascii_lowercase().as_str() {
            "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            _ => Err("expected text or json".into()),
        }
    }
}

/// Installs the logger from `RUST_LOG`. Calling it twice keeps the first logger.
pub fn init(format: Format) {
    let spec = std::env::var("RUST_LOG").unwrap_or_default();
    let (logger, problems) = build(&spec, format);
    let max = logger.filter();
    if log::set_boxed_logger(Box::new(logger)).is_ok() {
        log::set_max_level(max);
        // Which filter is in force, for whoever wonders why a line is missing.
        log::debug!("log filter: RUST_LOG={spec:?} (default info; glommio off unless named)");
        for (directive, why) in problems {
            log::warn!("ignoring RUST_LOG directive {directive:?}: {why}");
        }
    }
}

/// A directive of `RUST_LOG` that was ignored, and why.
type Problem = (String, &'static str);

/// The logger for `spec`, and the directives of it that were ignored.
fn build(spec: &str, format: Format) -> (env_logger::Logger, Vec<Problem>) {
    let (spec, problems) = checked_spec(spec);
    let mut builder = env_logger::Builder::new();
    // Before the spec: a bare level in it replaces this default.
    builder.filter_level(LevelFilter::Info);
    builder.parse_filters(&spec);
    for quiet in QUIET_TARGETS {
        if !names(&spec, quiet) {
            builder.filter_module(quiet, LevelFilter::Off);
        }
    }
    match format {
        Format::Text => builder.format(|out, record| {
            writeln!(
                out,
                "{} {:<5} {}: {}",
                utc_timestamp(SystemTime::now()),
                record.level(),
                record.target(),
                record.args()
            )
        }),
        Format::Json => builder.format(|out, record| {
            serde_json::to_writer(&mut *out, &JsonLine::new(record))?;
            out.write_all(b"\n")
        }),
    };
    (builder.build(), problems)
}

/// `spec` without the directives env_filter would reject (it would print its own warning
/// for them, outside the log's format), and those directives.
fn checked_spec(spec: &str) -> (String, Vec<Problem>) {
    let (directives, message_filter) = match spec.split_once('/') {
        Some((directives, filter)) => (directives, Some(filter)),
        None => (spec, None),
    };
    let mut problems = Vec::new();
    let mut kept: Vec<&str> = Vec::new();
    for directive in directives.split(',').map(str::trim) {
        if directive.is_empty() {
            continue;
        }
        if env_filter::Builder::new().try_parse(directive).is_ok() {
            kept.push(directive);
        } else {
            problems.push((directive.to_owned(), "unknown level"));
        }
    }
    let mut checked = kept.join(",");
    if let Some(filter) = message_filter {
        let with_filter = format!("{checked}/{filter}");
        if env_filter::Builder::new().try_parse(&with_filter).is_ok() {
            checked = with_filter;
        } else {
            problems.push((format!("/{filter}"), "more than one '/'"));
        }
    }
    (checked, problems)
}

/// Whether a directive of `spec` (already checked) is about `target` or a module in it.
fn names(spec: &str, target: &str) -> bool {
    let directives = spec
        .split_once('/')
        .map_or(spec, |(directives, _)| directives);
    directives.split(',').any(|directive| {
        let name = match directive.split_once('=') {
            Some((name, _)) => name.trim(),
            // A bare level names no target.
            None if directive.trim().parse::<LevelFilter>().is_ok() => return false,
            None => directive.trim(),
        };
        name == target
            || name
                .strip_prefix(target)
                .is_some_and(|rest| rest.starts_with("::"))
    })
}

/// One `--log-format json` line; serde_json escapes what the message holds.
#[derive(serde::Serialize)]
struct JsonLine<'a> {
    ts: String,
    level: &'static str,
    target: &'a str,
    msg: Cow<'a, str>,
}

impl<'a> JsonLine<'a> {
    fn new(record: &'a Record<'_>) -> JsonLine<'a> {
        JsonLine {
            ts: utc_timestamp(SystemTime::now()),
            level: record.level().as_str(),
            target: record.target(),
            msg: match record.args().as_str() {
                Some(text) => Cow::Borrowed(text),
                None => Cow::Owned(record.args().to_string()),
            },
        }
    }
}

/// RFC 3339 with exactly three decimals (truncated): time's `Rfc3339` drops trailing zeros
/// (`.12Z`, or no fraction at all), which makes the lines ragged.
const TIMESTAMP: EncodedConfig = Config::DEFAULT
    .set_time_precision(TimePrecision::Second {
        decimal_digits: NonZeroU8::new(3),
    })
    .encode();

/// `2026-05-01T12:34:56.789Z`.
pub fn utc_timestamp(time: SystemTime) -> String {
    let time = OffsetDateTime::from(time);
    // Fails only past the year 9999; the line is still worth printing.
    time.format(&Iso8601::<TIMESTAMP>)
        .unwrap_or_else(|_| time.to_string())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use log::{Level, Log, Metadata};

    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(utc_timestamp(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(951_782_400_123); // leap day 2000
        assert_eq!(utc_timestamp(t), "2000-02-29T00:00:00.123Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_767_225_599); // last second of 2025
        assert_eq!(utc_timestamp(t), "2025-12-31T23:59:59.000Z");
        // Truncated, not rounded: a rounded 59.9999 would print second 60.
        let t = UNIX_EPOCH + Duration::from_nanos(1_767_225_599_999_900_000);
        assert_eq!(utc_timestamp(t), "2025-12-31T23:59:59.999Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_767_225_599_120);
        assert_eq!(utc_timestamp(t), "2025-12-31T23:59:59.120Z");
    }

    /// The most verbose level `logger` lets through for `target`.
    fn level(logger: &env_logger::Logger, target: &str) -> LevelFilter {
        let enabled =
            |level| logger.enabled(&Metadata::builder().level(level).target(target).build());
        [
            Level::Trace,
            Level::Debug,
            Level::Info,
            Level::Warn,
            Level::Error,
        ]
        .into_iter()
        .find(|level| enabled(*level))
        .map_or(LevelFilter::Off, |level| level.to_level_filter())
    }

    fn parse(spec: &str) -> (env_logger::Logger, Vec<Problem>) {
        build(spec, Format::Text)
    }

    #[test]
    fn filters() {
        let (f, problems) = parse("");
        assert!(problems.is_empty());
        assert_eq!(level(&f, "pico_net"), LevelFilter::Info);
        assert_eq!(f.filter(), LevelFilter::Info);

        let (f, _) = parse("pico_net=debug");
        assert_eq!(level(&f, "pico_net::shard"), LevelFilter::Debug);
        assert_eq!(
            level(&f, "pico_engine"),
            LevelFilter::Info,
            "info stays the default"
        );

        let (f, _) = parse("warn,pico_net=debug,pico_net::http=trace,hyper=off");
        assert_eq!(level(&f, "pico_cli"), LevelFilter::Warn);
        assert_eq!(level(&f, "pico_net"), LevelFilter::Debug);
        assert_eq!(level(&f, "pico_net::shard"), LevelFilter::Debug);
        assert_eq!(level(&f, "pico_net::http::parse"), LevelFilter::Trace);
        assert_eq!(level(&f, "hyper"), LevelFilter::Off);
        assert_eq!(f.filter(), LevelFilter::Trace);

        let (f, problems) = parse("pico_engine, x=loud, y=a=b");
        assert_eq!(level(&f, "pico_engine::wal"), LevelFilter::Trace);
        assert_eq!(level(&f, "x"), LevelFilter::Info);
        let ignored: Vec<&str> = problems.iter().map(|(d, _)| d.as_str()).collect();
        assert_eq!(ignored, ["x=loud", "y=a=b"]);
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
            "glom=info",
        ] {
            let (f, _) = parse(spec);
            assert_eq!(level(&f, "glommio"), LevelFilter::Off, "{spec:?}");
            assert_eq!(level(&f, "glommio::reactor"), LevelFilter::Off, "{spec:?}");
        }
        // Named, at any depth: the user's level applies.
        let (f, _) = parse("glommio=warn");
        assert_eq!(level(&f, "glommio::reactor"), LevelFilter::Warn);
        let (f, _) = parse("info,glommio");
        assert_eq!(level(&f, "glommio::reactor"), LevelFilter::Trace);
        let (f, _) = parse("glommio::reactor=error");
        assert_eq!(level(&f, "glommio::reactor"), LevelFilter::Error);
        // Other glommio modules then follow the default level.
        assert_eq!(level(&f, "glommio::sys"), LevelFilter::Info);
        // Silencing glommio does not raise the maximum level.
        let (f, _) = parse("warn");
        assert_eq!(f.filter(), LevelFilter::Warn);
    }

    #[test]
    fn message_filters() {
        // env_logger's `/text` keeps records whose message contains the text.
        let (f, problems) = parse("info/needle");
        assert!(problems.is_empty());
        let record = |msg| {
            let args = format_args!("{msg}");
            f.matches(
                &Record::builder()
                    .args(args)
                    .level(Level::Info)
                    .target("t")
                    .build(),
            )
        };
        assert!(record("a needle here"));
        assert!(!record("hay"));
        let (_, problems) = parse("info/a/b");
        assert_eq!(problems, [("/a/b".to_owned(), "more than one '/'")]);
    }

    #[test]
    fn formats() {
        assert_eq!("text".parse(), Ok(Format::Text));
        assert_eq!("JSON".parse(), Ok(Format::Json));
        assert!("yaml".parse::<Format>().is_err());

        let args = format_args!("quote \" newline \n tab \t {}", 7);
        let record = Record::builder()
            .args(args)
            .level(Level::Warn)
            .target("pico_net::server")
            .build();
        let line = serde_json::to_string(&JsonLine::new(&record)).unwrap();
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["level"], "WARN");
        assert_eq!(value["target"], "pico_net::server");
        assert_eq!(value["msg"], "quote \" newline \n tab \t 7");
        let ts = value["ts"].as_str().unwrap();
        assert_eq!(ts.len(), "2026-05-01T12:34:56.789Z".len(), "{ts}");
        assert!(!line.contains('\n'), "one line: {line}");
    }
}
