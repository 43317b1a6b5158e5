//! `--print-config`: the node's settings rendered back as a config file, each with its
//! origin, and the options reference of docs/configuration.md made from the same help text.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use argh::CommandInfoWithArgs;

use super::*;

/// A flag's value in the node's settings, for `--print-config`.
pub(super) enum Effective {
    /// As a TOML value.
    Value(String),
    /// An optional flag not given: the node decides at start (see its default).
    Unset,
}

/// A TOML basic string.
pub(super) fn toml_string(text: &str) -> String {
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
pub(super) fn toml_integer(n: u64) -> String {
    match i64::try_from(n) {
        Ok(n) => n.to_string(),
        Err(_) => toml_string(&n.to_string()),
    }
}

/// The value of `flag` in `args`, or `None` for a flag `args` does not hold.
pub(super) fn effective(args: &ServeArgs, flag: &str) -> Option<Effective> {
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
        "--backup-dir" => path(&args.backup_dir),
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
pub(super) fn meaning_and_default(description: &str) -> (String, Option<String>) {
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
pub(super) fn reference(root: &CommandInfoWithArgs) -> String {
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
