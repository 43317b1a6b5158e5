//! `pico serve --config-file FILE`: the serve flags from a TOML file (docs/configuration.md).
//!
//! A key is a flag's long name without the dashes (`long-poll-timeout-sec = 25`), written at
//! the top level or in the table of its `serve --help` topic (`[listeners]`), never both.
//! The file is one more layer under the command line: each setting it holds becomes a flag of
//! the rewritten command line when neither the command line nor the flag's `PICO_*` variable
//! gave that flag, so the precedence is flag > variable > file > default (and, for
//! `--protocol`, the saved profile after the file), and every value goes through its flag's
//! own parser. Errors name the file, the line and the key; nothing starts after one.

use std::io::Read;
use std::path::{Path, PathBuf};

use argh::{CommandInfoWithArgs, FromArgs};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use crate::args::{Cli, ServeArgs};
use crate::argv::{env_var_name, GivenFlag, Normalized, Origin};
use crate::serve_help::{HIDDEN, TOPICS};

mod render;
#[cfg(test)]
mod tests;

pub use self::render::render;

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
    ("--backup-dir", ValueType::Text),
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
