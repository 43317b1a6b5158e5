//! `pico serve --help` by topic. argh prints one flat option list in declaration order; this
//! regroups its entries under headings (listeners, storage, durability, ...), leaves out the
//! no-op flags kept for PicoMQ 0.1 scripts (still accepted, with a warning), lists the global
//! `--protocol` with the listeners, and says what the `-2@` of `--storage` is.

/// Flags accepted for PicoMQ 0.1 scripts that do nothing here (`serve::ignored_flag_warnings`
/// warns when one is given): not shown.
pub const HIDDEN: &[&str] = &[
    "--wal",
    "--wal-cache-size",
    "--wal-upload-threshold",
    "--wal-upload-interval-ms",
    "--object-flush-ms",
];

/// A topic of `pico serve --help`: its heading, the table of a config file that holds its
/// settings (docs/configuration.md), and its flags in the order shown.
pub struct Topic {
    pub heading: &'static str,
    pub table: &'static str,
    pub flags: &'static [&'static str],
}

/// The topics in the order shown.
pub const TOPICS: &[Topic] = &[
    Topic {
        heading: "Listeners",
        table: "listeners",
        flags: &[
            "--protocol",
            "--listen",
            "--ds-listen",
            "--admin-listen",
            "--no-admin",
            "--backlog",
            "--cors-origin",
            "--shutdown-drain-sec",
        ],
    },
    Topic {
        heading: "Storage",
        table: "storage",
        flags: &[
            "--meta-url",
            "--storage",
            "--wal-dir",
            "--segment-size",
            "--segment-max-age-ms",
            "--block-cache-size",
            "--gc-interval-ms",
        ],
    },
    Topic {
        heading: "Durability",
        table: "durability",
        flags: &["--durability", "--object-puts-per-second", "--wal-salvage"],
    },
    Topic {
        heading: "Cluster (a postgres:// --meta-url)",
        table: "cluster",
        flags: &[
            "--node-id",
            "--node-epoch",
            "--http-address",
            "--cluster-id",
            "--routing",
            "--slots",
            "--lease-ms",
        ],
    },
    Topic {
        heading: "Reads and retention",
        table: "reads",
        flags: &[
            "--long-poll-timeout-sec",
            "--sse-max-duration-sec",
            "--max-chunk-size",
            "--catch-up-read-size",
            "--default-retention-age",
            "--default-retention-bytes",
            "--default-delete-on-empty",
        ],
    },
    Topic {
        heading: "Limits",
        table: "limits",
        flags: &[
            "--max-body-size",
            "--request-timeout-sec",
            "--send-stall-timeout-sec",
            "--max-in-flight-bytes",
            "--max-unsent-bytes",
            "--max-unuploaded-bytes",
            "--producers-max",
            "--producer-idle-expiry-sec",
        ],
    },
    Topic {
        heading: "Auth",
        table: "auth",
        flags: &[
            "--auth",
            "--auth-tokens",
            "--insecure-allow-remote",
            "--webhook-allow-loopback",
        ],
    },
    Topic {
        heading: "TLS",
        table: "tls",
        flags: &["--tls-cert", "--tls-key"],
    },
    Topic {
        heading: "Process",
        table: "process",
        flags: &[
            "--cores",
            "--log-format",
            "--config-file",
            "--print-config",
            "--help",
        ],
    },
];

/// The `--protocol` entry: a global flag (`pico --protocol ds serve`), which argh lists only
/// under `pico --help`.
const PROTOCOL_ENTRY: &str =
    "  --protocol        what --listen speaks: pico or ds (default pico); a global flag,
                    also before serve: pico --protocol ds serve [env:
                    PICO_PROTOCOL]";

/// Said under the storage heading.
const STORAGE_NOTE: &str =
    "  (the -2@ of --storage is a bucket id, a signed 16-bit number the engine
  tags its objects with: keep the one a bucket was first used with)";

/// argh's `pico serve --help` text, regrouped. Text it does not recognise is returned as it
/// is, and an option no group names is kept under "Other", so nothing is ever lost.
pub fn regroup(help: &str) -> String {
    let Some((head, options)) = help.split_once("\nOptions:\n") else {
        return help.to_string();
    };
    let head = hide_in_usage(head.trim_end());
    let mut entries: Vec<(String, String)> = Vec::new();
    let mut tail = String::new();
    for line in options.lines() {
        if line.starts_with("  -") {
            let flag = line
                .split(|c: char| c.is_whitespace() || c == ',')
                .find(|w| !w.is_empty())
                .unwrap_or_default()
                .to_string();
            entries.push((flag, line.to_string()));
        } else if line.starts_with("    ") && !entries.is_empty() {
            let entry = &mut entries.last_mut().expect("checked").1;
            entry.push('\n');
            entry.push_str(line);
        } else {
            tail.push_str(line);
            tail.push('\n');
        }
    }
    let mut out = format!("{head}\n");
    let mut shown: Vec<&str> = Vec::new();
    for topic in TOPICS {
        out.push_str(&format!("\n{}:\n", topic.heading));
        if topic.heading == "Storage" {
            out.push_str(STORAGE_NOTE);
            out.push('\n');
        }
        for flag in topic.flags {
            if *flag == "--protocol" {
                out.push_str(PROTOCOL_ENTRY);
                out.push('\n');
                continue;
            }
            if let Some((_, text)) = entries.iter().find(|(f, _)| f == flag) {
                out.push_str(text);
                out.push('\n');
                shown.push(flag);
            }
        }
    }
    let rest: Vec<&(String, String)> = entries
        .iter()
        .filter(|(flag, _)| !shown.contains(&flag.as_str()) && !HIDDEN.contains(&flag.as_str()))
        .collect();
    if !rest.is_empty() {
        out.push_str("\nOther:\n");
        for (_, text) in rest {
            out.push_str(text);
            out.push('\n');
        }
    }
    out.push_str(
        "\nNot shown, accepted for PicoMQ 0.1 scripts with a warning: --wal, --wal-cache-size,\n\
         --wal-upload-threshold and --wal-upload-interval-ms (no effect), --object-flush-ms\n\
         (superseded by --object-puts-per-second).\n",
    );
    if !tail.trim().is_empty() {
        out.push('\n');
        out.push_str(tail.trim_end());
        out.push('\n');
    }
    out.trim_end().to_string()
}

/// The usage line without the hidden flags (`[--wal <uri>]`).
fn hide_in_usage(head: &str) -> String {
    let mut text = head.to_string();
    for flag in HIDDEN {
        for ending in [" ", "]"] {
            let opening = format!(" [{flag}{ending}");
            while let Some(at) = text.find(&opening) {
                let Some(close) = text[at..].find(']') else {
                    break;
                };
                text.replace_range(at..at + close + 1, "");
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use argh::{ArgsInfo, FromArgs};

    use super::*;
    use crate::args::Cli;

    fn serve_help() -> String {
        match Cli::from_args(&["pico"], &["serve", "--help"]) {
            Err(early) => early.output,
            Ok(_) => unreachable!("--help exits early"),
        }
    }

    /// Every flag of `serve` has a group or is hidden, so none falls into "Other".
    #[test]
    fn every_serve_flag_has_a_topic() {
        let info = Cli::get_args_info();
        let serve = info
            .commands
            .iter()
            .find(|c| c.name == "serve")
            .expect("serve");
        for flag in serve.command.flags.iter() {
            let grouped = TOPICS.iter().any(|topic| topic.flags.contains(&flag.long));
            assert!(
                grouped || HIDDEN.contains(&flag.long),
                "{} has no topic",
                flag.long
            );
        }
    }

    #[test]
    fn the_help_is_grouped_without_the_no_op_flags() {
        let text = regroup(&serve_help());
        assert!(!text.contains("\nOther:"), "{text}");
        let listeners = text.find("\nListeners:\n").expect("a Listeners heading");
        let tls = text.find("\nTLS:\n").expect("a TLS heading");
        assert!(listeners < tls);
        assert!(text.contains("\n  --protocol        what --listen speaks"));
        assert!(text.contains("the -2@ of --storage is a bucket id"));
        for flag in HIDDEN {
            assert!(!text.contains(&format!("\n  {flag} ")), "{flag} shown");
            assert!(!text.contains(&format!("[{flag} ")), "{flag} in the usage");
        }
        assert!(text.contains("--wal-dir"));
        assert!(text.contains("[--wal-dir <dir>]"));
    }
}
