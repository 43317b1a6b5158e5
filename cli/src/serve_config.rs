//! `pico serve --config-file FILE`: the serve flags from a TOML file (docs/configuration.md).
//!
//! A key is a flag's long name without the dashes (`long-poll-timeout-sec = 25`), written at
//! the top level or in the table of its `serve --help` topic (`[listeners]`), never both.
//! The file is one more layer under the command line: each setting it holds becomes a flag of
//! the rewritten command line when neither the command line nor the flag's `PICO_*` variable
//! gave that flag, so the precedence is flag > variable > file > default (and, for
//! `--protocol`, the saved profile after the file), and every value goes through its flag's
//! own parser. Errors name the file, the line and the key; nothing starts after one.

use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};

use argh::{CommandInfoWithArgs, FromArgs};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use crate::args::{Cli, ServeArgs};
use crate::argv::{env_var_name, GivenFlag, Normalized, Origin};
use crate::serve_help::{HIDDEN, TOPICS};

/// The largest config file read. A settings file is a few KiB; a file near this size is a
/// mistake (a log, a binary, a device), refused before it is parsed.
pub const CONFIG_FILE_BYTES_MAX: u64 = 1 << 20;

/// Flags a file cannot set: which file to read, and whether to start.
const COMMAND_LINE_ONLY: &[&str] = &["--config-file", "--print-config"];

/// The global flag a file may set besides the serve flags: what `--listen` speaks.
const GLOBAL_KEYS: &[&str] = &["--protocol"];

/// What a key's TOML value may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    Text,
    Integer,
    /// An integer or a float.
    Seconds,
    /// An integer (bytes) or a string with a suffix (`"64MiB"`).
    Size,
    /// An integer (seconds) or a string with a unit (`"7d"`).
    Duration,
    /// A switch.
    Boolean,
}

impl ValueType {
    /// As docs/configuration.md and error messages say it.
    pub fn describe(self) -> &'static str {
        match self {
            ValueType::Text => "a string",
            ValueType::Integer => "an integer",
            ValueType::Seconds => "seconds: an integer or a float",
            ValueType::Size => "bytes: an integer, or a string with KiB/MiB/GiB",
            ValueType::Duration => "an integer (seconds), or a string with s/m/h/d",
            ValueType::Boolean => "true or false",
        }
    }
}

/// The value type of every key a file may hold (the serve flags but `COMMAND_LINE_ONLY` and
/// `--help`, and `GLOBAL_KEYS`); a test checks none is missing.
const VALUE_TYPES: &[(&str, ValueType)] = &[
    ("--protocol", ValueType::Text),
    ("--listen", ValueType::Text),
    ("--ds-listen", ValueType::Text),
    ("--admin-listen", ValueType::Text),
    ("--no-admin", ValueType::Boolean),
    ("--backlog", ValueType::Integer),
    ("--cors-origin", ValueType::Text),
    ("--shutdown-drain-sec", ValueType::Integer),
    ("--meta-url", ValueType::Text),
    ("--storage", ValueType::Text),
    ("--wal-dir", ValueType::Text),
    ("--segment-size", ValueType::Size),
    ("--segment-max-age-ms", ValueType::Integer),
    ("--block-cache-size", ValueType::Size),
    ("--gc-interval-ms", ValueType::Integer),
    ("--durability", ValueType::Text),
    ("--object-puts-per-second", ValueType::Integer),
    ("--wal-salvage", ValueType::Boolean),
    ("--node-id", ValueType::Integer),
    ("--node-epoch", ValueType::Integer),
    ("--http-address", ValueType::Text),
    ("--cluster-id", ValueType::Text),
    ("--routing", ValueType::Text),
    ("--slots", ValueType::Integer),
    ("--lease-ms", ValueType::Integer),
    ("--long-poll-timeout-sec", ValueType::Seconds),
    ("--sse-max-duration-sec", ValueType::Seconds),
    ("--max-chunk-size", ValueType::Size),
    ("--catch-up-read-size", ValueType::Size),
    ("--default-retention-age", ValueType::Duration),
    ("--default-retention-bytes", ValueType::Size),
    ("--default-delete-on-empty", ValueType::Duration),
    ("--max-body-size", ValueType::Size),
    ("--request-timeout-sec", ValueType::Seconds),
    ("--send-stall-timeout-sec", ValueType::Seconds),
    ("--max-in-flight-bytes", ValueType::Size),
    ("--max-unsent-bytes", ValueType::Size),
    ("--max-unuploaded-bytes", ValueType::Size),
    ("--producers-max", ValueType::Integer),
    ("--producer-idle-expiry-sec", ValueType::Integer),
    ("--auth", ValueType::Text),
    ("--auth-tokens", ValueType::Text),
    ("--insecure-allow-remote", ValueType::Boolean),
    ("--webhook-allow-loopback", ValueType::Boolean),
    ("--tls-cert", ValueType::Text),
    ("--tls-key", ValueType::Text),
    ("--cores", ValueType::Integer),
    ("--log-format", ValueType::Text),
    ("--wal", ValueType::Text),
    ("--wal-cache-size", ValueType::Size),
    ("--wal-upload-threshold", ValueType::Size),
    ("--wal-upload-interval-ms", ValueType::Integer),
    ("--object-flush-ms", ValueType::Integer),
];

/// A key a file may hold.
#[derive(Clone, Copy, Debug)]
struct Key {
    flag: &'static str,
    /// The table of its topic; `None` for the no-op flags of 0.1 scripts, top level only.
    table: Option<&'static str>,
    value_type: ValueType,
}

impl Key {
    fn name(&self) -> &'static str {
        self.flag.trim_start_matches('-')
    }
}

/// Every key a file may hold, from the serve command of `root` (argh's description of the
/// command line), in the order of `VALUE_TYPES`.
fn keys(root: &CommandInfoWithArgs) -> Vec<Key> {
    let serve_flags: Vec<&str> = serve_info(root)
        .map(|serve| serve.flags.iter().map(|f| f.long).collect())
        .unwrap_or_default();
    VALUE_TYPES
        .iter()
        .filter(|(flag, _)| GLOBAL_KEYS.contains(flag) || serve_flags.contains(flag))
        .map(|&(flag, value_type)| Key {
            flag,
            table: TOPICS
                .iter()
                .find(|topic| topic.flags.contains(&flag))
                .map(|topic| topic.table),
            value_type,
        })
        .collect()
}

fn serve_info(root: &CommandInfoWithArgs) -> Option<&CommandInfoWithArgs> {
    root.commands
        .iter()
        .find(|c| c.name == "serve")
        .map(|c| &c.command)
}

/// One key of a file, as the flag it stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    pub flag: &'static str,
    /// The flag's value as on a command line; `true` or `false` for a switch.
    pub value: String,
    pub switch: bool,
    /// 1-based line of the key.
    pub line: usize,
}

/// Where a flag's value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    CommandLine,
    Environment,
    File {
        line: usize,
    },
    /// The saved client profile (`--protocol` only).
    Profile(String),
    Default,
}

/// What the command line, the environment and the file gave, for `--print-config`, the
/// start-up log and the errors found after parsing.
#[derive(Clone, Debug, Default)]
pub struct Provenance {
    pub file: Option<PathBuf>,
    given: Vec<GivenFlag>,
    settings: Vec<Setting>,
}

impl Provenance {
    /// Where `flag` came from; a profile is `main`'s to tell, so `Default` here.
    pub fn source(&self, flag: &str) -> Source {
        if let Some(given) = self.given.iter().find(|g| g.long == flag) {
            return match given.origin {
                Origin::CommandLine => Source::CommandLine,
                Origin::Environment => Source::Environment,
            };
        }
        match self.settings.iter().find(|s| s.flag == flag) {
            Some(setting) => Source::File { line: setting.line },
            None => Source::Default,
        }
    }

    /// How many keys the file held, and how many of them flags or variables overrode.
    pub fn file_counts(&self) -> (usize, usize) {
        let overridden = self
            .settings
            .iter()
            .filter(|s| self.given.iter().any(|g| g.long == s.flag))
            .count();
        (self.settings.len(), overridden)
    }

    /// `message` (a check of the settings that names a flag), with the file line that set
    /// the first flag it names when the file did.
    pub fn locate(&self, message: &str) -> String {
        let named = message
            .split(|c: char| c.is_whitespace() || c == ',' || c == ':' || c == ';')
            .find(|word| word.starts_with("--") && word.len() > 2);
        if let (Some(flag), Some(file)) = (named, &self.file) {
            if let Source::File { line } = self.source(flag) {
                return format!(
                    "{message} ({} at {}:{line})",
                    flag.trim_start_matches('-'),
                    file.display()
                );
            }
        }
        message.to_string()
    }
}

/// Reads the `--config-file` of a `serve` command line (given as a flag or `PICO_CONFIG_FILE`)
/// and adds its settings to `normalized` where neither flag nor variable gave them. Without a
/// config file only the provenance of the flags is returned.
pub fn apply(
    root: &CommandInfoWithArgs,
    normalized: &mut Normalized,
) -> Result<Provenance, String> {
    let mut provenance = Provenance {
        file: None,
        given: normalized.given.clone(),
        settings: Vec::new(),
    };
    let Some(path) = normalized
        .given
        .iter()
        .find(|g| g.long == "--config-file")
        .map(|g| PathBuf::from(&g.value))
    else {
        return Ok(provenance);
    };
    if path.as_os_str().is_empty() {
        return Err("--config-file: the path is empty".into());
    }
    let text = read(&path)?;
    let settings = parse(&path, &text, &keys(root))?;
    for setting in &settings {
        check_value(&path, setting)?;
    }
    let mut serve_words = Vec::new();
    let mut root_words = Vec::new();
    for setting in &settings {
        if provenance.given.iter().any(|g| g.long == setting.flag) {
            continue;
        }
        let words = if GLOBAL_KEYS.contains(&setting.flag) {
            &mut root_words
        } else {
            &mut serve_words
        };
        match (setting.switch, setting.value.as_str()) {
            (true, "true") => words.push(setting.flag.to_owned()),
            (true, _) => {}
            (false, value) => {
                words.push(setting.flag.to_owned());
                words.push(value.to_owned());
            }
        }
    }
    // The serve flags go where the rewritten line's flags end (they are serve's, the innermost
    // command), the global one first, among the root's flags.
    let end = normalized.flags_end;
    normalized.args.splice(end..end, serve_words);
    normalized.flags_end += root_words.len();
    normalized.args.splice(0..0, root_words);
    provenance.file = Some(path);
    provenance.settings = settings;
    Ok(provenance)
}

/// The file as text: at most `CONFIG_FILE_BYTES_MAX` bytes of UTF-8.
fn read(path: &Path) -> Result<String, String> {
    let shown = path.display();
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot read config file {shown}: {e}"))?;
    let mut bytes = Vec::new();
    // One byte past the limit tells a file at the limit from a larger one, devices included.
    file.take(CONFIG_FILE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read config file {shown}: {e}"))?;
    if bytes.len() as u64 > CONFIG_FILE_BYTES_MAX {
        return Err(format!(
            "config file {shown} is larger than {CONFIG_FILE_BYTES_MAX} bytes ({} MiB), the most \
             a config file may be",
            CONFIG_FILE_BYTES_MAX >> 20
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = 1 + valid.iter().filter(|&&b| b == b'\n').count();
        format!("{shown}:{line}: the config file is not UTF-8 text")
    })
}

/// 1-based line and column of byte `offset` of `text`.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = 1 + before.matches('\n').count();
    let column = 1 + before
        .rsplit_once('\n')
        .map_or(before, |(_, last)| last)
        .chars()
        .count();
    (line, column)
}

/// The settings of a file's text, in the order of the file; `path` names it in errors.
fn parse(path: &Path, text: &str, keys: &[Key]) -> Result<Vec<Setting>, String> {
    let shown = path.display();
    let document = DeTable::parse(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        let (line, column) = line_and_column(text, span.start);
        let mut message = e.message().to_string();
        if message == "duplicate key" {
            if let Some(key) = text.get(span).filter(|k| !k.is_empty()) {
                message = format!("duplicate key {key}");
            }
        }
        format!("{shown}:{line}:{column}: {message}")
    })?;
    // (key span start, table, key, value), sorted by place so the first error is the first in
    // the file (the parser's tables are sorted by name).
    let mut entries: Vec<(usize, Option<&str>, &str, &Spanned<DeValue>)> = Vec::new();
    let at = |offset: usize| line_and_column(text, offset).0;
    for (key, value) in document.get_ref().iter() {
        let name = key.get_ref().as_ref();
        let shown_name = truncated(name);
        match value.get_ref() {
            DeValue::Table(table) => {
                let Some(topic) = TOPICS.iter().find(|t| t.table == name) else {
                    let line = at(key.span().start);
                    let keyed = keys.iter().find(|k| k.name() == name);
                    return Err(match keyed {
                        Some(k) => format!(
                            "{shown}:{line}: {name}: expected {}, got a table",
                            k.value_type.describe()
                        ),
                        None => format!(
                            "{shown}:{line}: unknown table [{shown_name}]{}",
                            suggestion(name, TOPICS.iter().map(|t| t.table), "[", "]")
                        ),
                    });
                };
                for (inner, value) in table.iter() {
                    entries.push((
                        inner.span().start,
                        Some(topic.table),
                        inner.get_ref().as_ref(),
                        value,
                    ));
                }
            }
            other
                if TOPICS.iter().any(|t| t.table == name)
                    && !keys.iter().any(|k| k.name() == name) =>
            {
                let line = at(key.span().start);
                return Err(format!(
                    "{shown}:{line}: {name}: expected a table of settings ([{name}]), got {}",
                    describe_value(other)
                ));
            }
            _ => entries.push((key.span().start, None, name, value)),
        }
    }
    entries.sort_by_key(|entry| entry.0);
    let mut settings: Vec<Setting> = Vec::new();
    for (offset, table, name, value) in entries {
        let line = at(offset);
        let shown_key = match table {
            Some(table) => format!("{table}.{}", truncated(name)),
            None => truncated(name),
        };
        let place = format!("{shown}:{line}: {shown_key}");
        let Some(key) = keys.iter().find(|k| k.name() == name) else {
            let flag = format!("--{name}");
            if COMMAND_LINE_ONLY.contains(&flag.as_str()) {
                return Err(format!("{place}: {flag} is given on the command line only"));
            }
            let kebab = name.replace('_', "-").to_ascii_lowercase();
            let hint = if keys.iter().any(|k| k.name() == kebab) {
                format!("; keys are the flag names in kebab-case: {kebab}")
            } else {
                suggestion(name, keys.iter().map(|k| k.name()), "", "")
            };
            return Err(format!("{place}: unknown key{hint}"));
        };
        match (table, key.table) {
            (Some(table), Some(home)) if table != home => {
                return Err(format!(
                    "{place}: {name} belongs in [{home}] (or at the top level), not [{table}]"
                ))
            }
            (Some(_), None) => {
                return Err(format!(
                    "{place}: {name} is accepted for PicoMQ 0.1 scripts at the top level only"
                ))
            }
            _ => {}
        }
        if let Some(first) = settings.iter().find(|s| s.flag == key.flag) {
            return Err(format!(
                "{place}: duplicate key: {name} is already set on line {}",
                first.line
            ));
        }
        let value = flag_value(value.get_ref(), key.value_type).ok_or_else(|| {
            format!(
                "{place}: expected {}, got {}",
                key.value_type.describe(),
                describe_value(value.get_ref())
            )
        })?;
        settings.push(Setting {
            flag: key.flag,
            value,
            switch: key.value_type == ValueType::Boolean,
            line,
        });
    }
    Ok(settings)
}

/// A TOML value as its flag's command-line word, if its type fits the key's.
fn flag_value(value: &DeValue, value_type: ValueType) -> Option<String> {
    let integer = || match value {
        DeValue::Integer(n) => i128::from_str_radix(n.as_str(), n.radix())
            .ok()
            .map(|n| n.to_string()),
        _ => None,
    };
    match (value_type, value) {
        (ValueType::Text | ValueType::Size | ValueType::Duration, DeValue::String(s)) => {
            Some(s.to_string())
        }
        (ValueType::Integer | ValueType::Size | ValueType::Duration, DeValue::Integer(_)) => {
            integer()
        }
        (ValueType::Seconds, DeValue::Integer(_)) => integer(),
        (ValueType::Seconds, DeValue::Float(f)) => Some(f.as_str().to_string()),
        (ValueType::Boolean, DeValue::Boolean(b)) => Some(b.to_string()),
        _ => None,
    }
}

fn describe_value(value: &DeValue) -> String {
    match value {
        DeValue::String(s) => format!("the string {:?}", truncated(s)),
        DeValue::Integer(n) => format!("the integer {n}"),
        DeValue::Float(f) => format!("the float {f}"),
        DeValue::Boolean(b) => format!("the boolean {b}"),
        DeValue::Datetime(_) => "a date-time".into(),
        DeValue::Array(_) => "an array".into(),
        DeValue::Table(_) => "a table".into(),
    }
}

/// At most 60 characters of `text` with its control characters escaped: a key or value of a
/// file quoted in a one-line message.
fn truncated(text: &str) -> String {
    let (kept, cut) = match text.char_indices().nth(60) {
        Some((at, _)) => (&text[..at], true),
        None => (text, false),
    };
    let mut out: String = kept
        .chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect();
    if cut {
        out.push_str("...");
    }
    out
}

/// Checks a setting with its flag's own parser (argh and the `from_str_fn` of `args.rs`).
fn check_value(path: &Path, setting: &Setting) -> Result<(), String> {
    let words: Vec<&str> = if GLOBAL_KEYS.contains(&setting.flag) {
        vec![setting.flag, &setting.value, "serve"]
    } else if setting.switch {
        // The type check was all there is: a switch takes no value word.
        return Ok(());
    } else {
        vec!["serve", setting.flag, &setting.value]
    };
    match Cli::from_args(&["pico"], &words) {
        Ok(_) => Ok(()),
        Err(early) => {
            let output = early.output.trim();
            // argh: "Error parsing option '--listen' with value '4437': expected HOST:PORT".
            let why = output.split_once("': ").map_or(output, |(_, why)| why);
            Err(format!(
                "{}:{}: {}: {why} (got {})",
                path.display(),
                setting.line,
                setting.flag.trim_start_matches('-'),
                truncated(&setting.value)
            ))
        }
    }
}

/// `; did you mean X?` for the candidate nearest to `word`, when it is near enough to be the
/// intended one (an edit distance of at most a third of the word, and at least 1).
fn suggestion<'a>(
    word: &str,
    candidates: impl Iterator<Item = &'a str>,
    before: &str,
    after: &str,
) -> String {
    let word_lower = word.to_ascii_lowercase();
    let limit = (word.chars().count() / 3).max(1);
    candidates
        .map(|c| (edit_distance(&word_lower, c), c))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, c)| format!("; did you mean {before}{c}{after}?"))
        .unwrap_or_default()
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// A flag's value in the node's settings, for `--print-config`.
enum Effective {
    /// As a TOML value.
    Value(String),
    /// An optional flag not given: the node decides at start (see its default).
    Unset,
}

/// A TOML basic string.
fn toml_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Bytes, seconds and counts as TOML integers; past `i64::MAX` (TOML's largest integer) as
/// the digit string every size and duration flag also takes.
fn toml_integer(n: u64) -> String {
    match i64::try_from(n) {
        Ok(n) => n.to_string(),
        Err(_) => toml_string(&n.to_string()),
    }
}

/// The value of `flag` in `args`, or `None` for a flag `args` does not hold.
fn effective(args: &ServeArgs, flag: &str) -> Option<Effective> {
    use Effective::{Unset, Value};
    let text = |s: &str| Value(toml_string(s));
    let path = |p: &Path| Value(toml_string(&p.display().to_string()));
    let int = |n: u64| Value(toml_integer(n));
    let secs = |s: f64| Value(format!("{s:?}"));
    let boolean = |b: bool| Value(b.to_string());
    let opt_int = |n: Option<u64>| n.map_or(Unset, int);
    let opt_text = |s: &Option<String>| s.as_deref().map_or(Unset, text);
    let opt_path = |p: &Option<PathBuf>| p.as_deref().map_or(Unset, path);
    Some(match flag {
        "--listen" => text(&args.listen),
        "--ds-listen" => opt_text(&args.ds_listen),
        "--admin-listen" => text(&args.admin_listen),
        "--no-admin" => boolean(args.no_admin),
        "--backlog" => int(args.backlog.into()),
        "--cors-origin" => text(&args.cors_origin),
        "--shutdown-drain-sec" => opt_int(args.shutdown_drain_sec),
        "--meta-url" => text(&args.meta_url),
        "--storage" => text(&args.storage),
        "--wal-dir" => path(&args.wal_dir),
        "--segment-size" => int(args.segment_size),
        "--segment-max-age-ms" => int(args.segment_max_age_ms),
        "--block-cache-size" => opt_int(args.block_cache_size),
        "--gc-interval-ms" => int(args.gc_interval_ms),
        "--durability" => args.durability.map_or(Unset, |d| {
            text(match d {
                pico_net::Durability::Local => "local",
                pico_net::Durability::Object => "object",
                pico_net::Durability::Memory => "memory",
            })
        }),
        "--object-puts-per-second" => opt_int(args.object_puts_per_second.map(u64::from)),
        "--wal-salvage" => boolean(args.wal_salvage),
        "--node-id" => args
            .node_id
            .map_or(Unset, |id| Value(i64::from(id).to_string())),
        "--node-epoch" => opt_int(args.node_epoch),
        "--http-address" => opt_text(&args.http_address),
        "--cluster-id" => opt_text(&args.cluster_id),
        "--routing" => opt_text(&args.routing),
        "--slots" => opt_int(args.slots.map(u64::from)),
        "--lease-ms" => int(args.lease_ms),
        "--long-poll-timeout-sec" => secs(args.long_poll_timeout_sec),
        "--sse-max-duration-sec" => secs(args.sse_max_duration_sec),
        "--max-chunk-size" => int(args.max_chunk_size),
        "--catch-up-read-size" => int(args.catch_up_read_size),
        "--default-retention-age" => int(args.default_retention_age),
        "--default-retention-bytes" => int(args.default_retention_bytes),
        "--default-delete-on-empty" => int(args.default_delete_on_empty),
        "--max-body-size" => int(args.max_body_size),
        "--request-timeout-sec" => secs(args.request_timeout_sec),
        "--send-stall-timeout-sec" => secs(args.send_stall_timeout_sec),
        "--max-in-flight-bytes" => opt_int(args.max_in_flight_bytes),
        "--max-unsent-bytes" => opt_int(args.max_unsent_bytes),
        "--max-unuploaded-bytes" => opt_int(args.max_unuploaded_bytes),
        "--producers-max" => opt_int(args.producers_max.map(|n| n as u64)),
        "--producer-idle-expiry-sec" => opt_int(args.producer_idle_expiry_sec),
        "--auth" => text(if args.auth { "required" } else { "off" }),
        "--auth-tokens" => opt_path(&args.auth_tokens),
        "--insecure-allow-remote" => boolean(args.insecure_allow_remote),
        "--webhook-allow-loopback" => boolean(args.webhook_allow_loopback),
        "--tls-cert" => opt_path(&args.tls_cert),
        "--tls-key" => opt_path(&args.tls_key),
        "--cores" => int(args.cores as u64),
        "--log-format" => text(match args.log_format {
            crate::logger::Format::Text => "text",
            crate::logger::Format::Json => "json",
        }),
        "--wal" => opt_text(&args.wal),
        "--wal-cache-size" => opt_int(args.wal_cache_size),
        "--wal-upload-threshold" => opt_int(args.wal_upload_threshold),
        "--wal-upload-interval-ms" => opt_int(args.wal_upload_interval_ms),
        "--object-flush-ms" => opt_int(args.object_flush_ms),
        _ => return None,
    })
}

/// A flag's help text split into its meaning and its default: `(default X)` and the
/// `[env: ...]` tag taken out.
pub fn meaning_and_default(description: &str) -> (String, Option<String>) {
    // argh keeps the doc comment's `{{` of a literal brace.
    let description = description.replace("{{", "{").replace("}}", "}");
    let text = match description.rfind(" [env: ") {
        Some(at) => &description[..at],
        None => description.as_str(),
    };
    let Some(open) = text.rfind("(default") else {
        return (text.trim().to_string(), None);
    };
    let mut depth = 0usize;
    let mut close = None;
    for (at, c) in text[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(open + at);
                    break;
                }
            }
            _ => {}
        }
    }
    let Some(close) = close else {
        return (text.trim().to_string(), None);
    };
    let default = text[open + "(default".len()..close]
        .trim_start_matches(':')
        .trim()
        .to_string();
    let meaning = format!("{}{}", text[..open].trim_end(), &text[close + 1..]);
    (meaning.trim().to_string(), Some(default))
}

/// The help text of `flag` (a serve flag, or a global one).
fn description<'r>(root: &'r CommandInfoWithArgs, flag: &str) -> Option<&'r str> {
    serve_info(root)
        .into_iter()
        .chain(std::iter::once(root))
        .flat_map(|info| info.flags.iter())
        .find(|f| f.long == flag)
        .map(|f| f.description)
}

/// `--print-config`: the node's settings as a config file, each with where it came from.
/// `protocol` is the one the node runs with and its source (the profile is `main`'s).
pub fn render(
    root: &CommandInfoWithArgs,
    args: &ServeArgs,
    protocol: (&str, Source),
    provenance: &Provenance,
) -> String {
    let file_name = provenance
        .file
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let origin = |source: &Source, flag: &str| match source {
        Source::CommandLine => flag.to_string(),
        Source::Environment => env_var_name(flag),
        Source::File { line } => format!("{file_name}:{line}"),
        Source::Profile(name) => format!("profile {name}"),
        Source::Default => "default".to_string(),
    };
    let mut out = String::from(
        "# The settings this `pico serve` would start with, as a config file (docs/configuration.md);\n\
         # after each, where it came from: a flag, a PICO_* variable, a line of the config\n\
         # file or the default. Commented out: optional settings left to the node.\n",
    );
    let _ = writeln!(
        out,
        "# Config file: {}",
        if file_name.is_empty() {
            "none"
        } else {
            &file_name
        }
    );
    let line = |out: &mut String, flag: &str| {
        let name = flag.trim_start_matches('-');
        let source = provenance.source(flag);
        let value = if flag == "--protocol" {
            let (name, source) = (&protocol.0, &protocol.1);
            Some((Effective::Value(toml_string(name)), source.clone()))
        } else {
            effective(args, flag).map(|value| (value, source))
        };
        match value {
            Some((Effective::Value(value), source)) => {
                let _ = writeln!(out, "{name} = {value}  # {}", origin(&source, flag));
            }
            Some((Effective::Unset, _)) => {
                match description(root, flag).and_then(|d| meaning_and_default(d).1) {
                    Some(default) => {
                        let _ = writeln!(out, "# {name}: not set; default: {default}");
                    }
                    None => {
                        let _ = writeln!(out, "# {name}: not set");
                    }
                }
            }
            None => {}
        }
    };
    // The no-op flags of 0.1 scripts have no table, and top-level keys come before tables.
    let hidden_given: Vec<&str> = HIDDEN
        .iter()
        .copied()
        .filter(|flag| provenance.source(flag) != Source::Default)
        .collect();
    if !hidden_given.is_empty() {
        out.push_str("\n# Accepted for PicoMQ 0.1 scripts; no effect (see the warnings).\n");
        for flag in hidden_given {
            line(&mut out, flag);
        }
    }
    for topic in TOPICS {
        let flags: Vec<&str> = topic
            .flags
            .iter()
            .copied()
            .filter(|f| *f != "--help" && !COMMAND_LINE_ONLY.contains(f))
            .collect();
        if flags.is_empty() {
            continue;
        }
        let _ = write!(out, "\n[{}]\n", topic.table);
        for flag in flags {
            line(&mut out, flag);
        }
    }
    out
}

/// The options reference of docs/configuration.md: one table per topic, from the help text
/// of every flag (what `serve --help` shows), its value type and its table; a test keeps the
/// doc equal to it.
#[cfg(test)]
fn reference(root: &CommandInfoWithArgs) -> String {
    let keys = keys(root);
    let cell = |text: &str| text.replace('|', "\\|");
    let mut out = String::new();
    for topic in TOPICS {
        let _ = write!(
            out,
            "### {} — `[{}]`\n\n| key | flag, variable | type | default | meaning |\n\
             | --- | --- | --- | --- | --- |\n",
            topic.heading, topic.table
        );
        for flag in topic.flags.iter().filter(|f| **f != "--help") {
            let Some(description) = description(root, flag) else {
                continue;
            };
            let (meaning, mut default) = meaning_and_default(description);
            let (key, value_type) = match keys.iter().find(|k| k.flag == *flag) {
                Some(k) => (format!("`{}`", k.name()), k.value_type.describe()),
                None => ("(command line only)".to_string(), "—"),
            };
            if value_type == ValueType::Boolean.describe() {
                default.get_or_insert_with(|| "false".into());
            }
            let _ = writeln!(
                out,
                "| {key} | `{flag}`, `{}` | {} | {} | {} |",
                env_var_name(flag),
                cell(value_type),
                cell(default.as_deref().unwrap_or("—")),
                cell(&meaning)
            );
        }
        out.push('\n');
    }
    out.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use argh::{ArgsInfo, FlagInfoKind};

    use super::*;

    fn root() -> CommandInfoWithArgs {
        Cli::get_args_info()
    }

    fn parse_text(text: &str) -> Result<Vec<Setting>, String> {
        parse(Path::new("pico.toml"), text, &keys(&root()))
    }

    /// Every serve flag but the command-line ones is a key with a type, and `--print-config`
    /// knows its value: a new flag cannot be forgotten here.
    #[test]
    fn every_serve_flag_is_a_key() {
        let root = root();
        let keys = keys(&root);
        let args = match Cli::from_args(&["pico"], &["serve"]).unwrap().command {
            crate::args::Command::Serve(args) => args,
            _ => unreachable!("serve"),
        };
        for flag in serve_info(&root).unwrap().flags {
            if flag.long == "--help" || COMMAND_LINE_ONLY.contains(&flag.long) {
                continue;
            }
            assert!(
                keys.iter().any(|k| k.flag == flag.long),
                "{} has no value type in VALUE_TYPES",
                flag.long
            );
            assert!(
                effective(&args, flag.long).is_some(),
                "{} is missing from `effective`",
                flag.long
            );
            let switch = matches!(flag.kind, FlagInfoKind::Switch);
            let boolean = VALUE_TYPES
                .iter()
                .any(|(f, t)| *f == flag.long && *t == ValueType::Boolean);
            assert_eq!(
                switch, boolean,
                "{}: switches and only they are booleans",
                flag.long
            );
        }
        assert_eq!(
            keys.len(),
            VALUE_TYPES.len(),
            "VALUE_TYPES names a flag serve lacks"
        );
    }

    #[test]
    fn keys_at_the_top_level_or_in_their_table() {
        let settings = parse_text(
            "listen = \"0.0.0.0:1\"\nno-admin = true\n\n[reads]\nlong-poll-timeout-sec = 0.5\n\
             default-retention-age = \"7d\"\n[limits]\nmax-body-size = 1024\n",
        )
        .unwrap();
        let pairs: Vec<(&str, &str, usize)> = settings
            .iter()
            .map(|s| (s.flag, s.value.as_str(), s.line))
            .collect();
        assert_eq!(
            pairs,
            [
                ("--listen", "0.0.0.0:1", 1),
                ("--no-admin", "true", 2),
                ("--long-poll-timeout-sec", "0.5", 5),
                ("--default-retention-age", "7d", 6),
                ("--max-body-size", "1024", 8),
            ]
        );
    }

    #[test]
    fn integers_in_every_radix_become_decimal() {
        let settings = parse_text("backlog = 0x10\nlease-ms = 1_000\n").unwrap();
        assert_eq!(settings[0].value, "16");
        assert_eq!(settings[1].value, "1000");
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_key() {
        for (text, expected) in [
            (
                "\n\nlisten = \"a:1\"\nlisten = \"b:1\"\n",
                "pico.toml:4:1: duplicate key listen",
            ),
            (
                "listen = \"a:1\"\n[listeners]\nlisten = \"b:1\"\n",
                "pico.toml:3: listeners.listen: duplicate key: listen is already set on line 1",
            ),
            ("lisen = \"a:1\"\n", "pico.toml:1: lisen: unknown key; did you mean listen?"),
            (
                "long_poll_timeout_sec = 1\n",
                "pico.toml:1: long_poll_timeout_sec: unknown key; keys are the flag names in \
                 kebab-case: long-poll-timeout-sec",
            ),
            ("zzz = 1\n", "pico.toml:1: zzz: unknown key"),
            ("\"a\\nb\" = 1\n", "pico.toml:1: a\\nb: unknown key"),
            ("[listener]\nlisten = \"a:1\"\n", "pico.toml:1: unknown table [listener]; did you mean [listeners]?"),
            (
                "[storage]\nlisten = \"a:1\"\n",
                "pico.toml:2: storage.listen: listen belongs in [listeners] (or at the top level), not [storage]",
            ),
            (
                "[storage]\nwal = \"x\"\n",
                "pico.toml:2: storage.wal: wal is accepted for PicoMQ 0.1 scripts at the top level only",
            ),
            ("listen = 4437\n", "pico.toml:1: listen: expected a string, got the integer 4437"),
            ("no-admin = \"yes\"\n", "pico.toml:1: no-admin: expected true or false, got the string \"yes\""),
            ("backlog = 1.5\n", "pico.toml:1: backlog: expected an integer, got the float 1.5"),
            ("cores = [1]\n", "pico.toml:1: cores: expected an integer, got an array"),
            (
                "[[limits]]\n",
                "pico.toml:1: limits: expected a table of settings ([limits]), got an array",
            ),
            ("listen = { a = 1 }\n", "pico.toml:1: listen: expected a string, got a table"),
            ("config-file = \"x\"\n", "pico.toml:1: config-file: --config-file is given on the command line only"),
        ] {
            assert_eq!(parse_text(text).unwrap_err(), expected, "{text:?}");
        }
    }

    #[test]
    fn a_syntax_error_names_line_and_column() {
        let err = parse_text("listen = \"a:1\"\nbacklog = \n").unwrap_err();
        assert!(err.starts_with("pico.toml:2:"), "{err}");
    }

    #[test]
    fn values_are_checked_by_their_flags_parser() {
        let setting = |flag, value: &str| Setting {
            flag,
            value: value.into(),
            switch: false,
            line: 7,
        };
        let path = Path::new("p.toml");
        assert_eq!(
            check_value(path, &setting("--listen", "nope")),
            Err("p.toml:7: listen: expected HOST:PORT, e.g. 127.0.0.1:4437 (got nope)".into())
        );
        assert!(check_value(path, &setting("--protocol", "ds")).is_ok());
        assert!(check_value(path, &setting("--protocol", "amqp"))
            .unwrap_err()
            .starts_with("p.toml:7: protocol: "));
        assert!(check_value(path, &setting("--max-body-size", "8MiB")).is_ok());
        assert!(check_value(path, &setting("--long-poll-timeout-sec", "nan")).is_err());
    }

    #[test]
    fn suggestions_only_for_near_misses() {
        assert_eq!(edit_distance("lisen", "listen"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        let keys = ["listen", "storage"];
        assert_eq!(
            suggestion("storag", keys.iter().copied(), "", ""),
            "; did you mean storage?"
        );
        assert_eq!(suggestion("x", keys.iter().copied(), "", ""), "");
    }

    #[test]
    fn the_default_is_taken_out_of_the_help_text() {
        assert_eq!(
            meaning_and_default("listen here (default 127.0.0.1:4437) [env: PICO_LISTEN]"),
            ("listen here".into(), Some("127.0.0.1:4437".into()))
        );
        assert_eq!(
            meaning_and_default("a (default: b (c), d); more [env: PICO_X]"),
            ("a; more".into(), Some("b (c), d".into()))
        );
        assert_eq!(
            meaning_and_default("no default [env: PICO_X]"),
            ("no default".into(), None)
        );
    }

    #[test]
    fn strings_are_escaped_for_toml() {
        assert_eq!(toml_string("a\"b\\c\n\u{7f}"), "\"a\\\"b\\\\c\\n\\u007F\"");
        assert_eq!(toml_integer(5), "5");
        assert_eq!(toml_integer(u64::MAX), "\"18446744073709551615\"");
    }

    /// docs/configuration.md holds `reference()` between its markers, so every flag is
    /// documented with its key, variable, type and default. `UPDATE_DOCS=1` writes it.
    #[test]
    fn the_configuration_doc_lists_every_option() {
        const BEGIN: &str =
            "<!-- options: generated from `pico serve --help`; see serve_config.rs -->\n";
        const END: &str = "\n<!-- end of options -->";
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
        let doc = std::fs::read_to_string(&path).expect("docs/configuration.md");
        let (start, end) = match (doc.find(BEGIN), doc.find(END)) {
            (Some(start), Some(end)) if start < end => (start + BEGIN.len(), end),
            _ => panic!("docs/configuration.md lacks the markers {BEGIN:?} ... {END:?}"),
        };
        let expected = format!("\n{}\n", reference(&root()));
        let mut doc = doc.clone();
        if doc[start..end] != expected {
            if std::env::var_os("UPDATE_DOCS").is_some() {
                doc = format!("{}{expected}{}", &doc[..start], &doc[end..]);
                std::fs::write(&path, &doc).expect("write docs/configuration.md");
            } else {
                panic!(
                    "docs/configuration.md is not what the flags say; regenerate it with \
                     UPDATE_DOCS=1 cargo test -p pico-cli --bin pico configuration_doc"
                );
            }
        }
        for flag in serve_info(&root()).unwrap().flags {
            let shown = flag.long != "--help" && !HIDDEN.contains(&flag.long);
            assert_eq!(
                doc.contains(&format!("`{}`", flag.long)),
                shown,
                "{} in docs/configuration.md",
                flag.long
            );
        }
    }
}
