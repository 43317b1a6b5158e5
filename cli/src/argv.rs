//! Rewrites argv before argh sees it, driven only by argh's own `ArgsInfo` description of the
//! command tree, so every current and future flag gets the same treatment:
//!
//! * **Values are values.** After a flag that takes a value, the next word is its value
//!   even if it starts with `-` (`--storage -2@file://./objects`); `--flag=value` is split.
//!   Positionals are moved behind a `--` so argh never mistakes them for flags either.
//! * **Flags are global.** A flag of an enclosing command may appear after a subcommand
//!   (`pico read /s --endpoint URL`): it is moved back to the command that declares it.
//! * **Environment.** Each flag absent from the command line is taken from
//!   `PICO_<FLAG_NAME>` (`--admin-listen` → `PICO_ADMIN_LISTEN`) if that is set and non-empty,
//!   so the precedence is flag > environment > (serve's config file and the profile, applied
//!   later) > default. Switches accept `1/true/yes/on` and `0/false/no/off`. Every flag given
//!   either way is recorded with its origin (`Normalized::given`).
//!
//! The output is canonical: `[root flags] sub [sub flags] ... [-- positionals]`.

use std::collections::HashSet;

use argh::{CommandInfoWithArgs, FlagInfo, FlagInfoKind};

/// argv ready for argh, plus what a caller needs for messages.
#[derive(Debug, PartialEq, Eq)]
pub struct Normalized {
    pub args: Vec<String>,
    /// Subcommand names from the root, e.g. `["serve"]`.
    pub command_path: Vec<String>,
    pub help: bool,
    /// Every flag on the rewritten line and where it came from, in order.
    pub given: Vec<GivenFlag>,
    /// Where the flags of `args` end (before `--` and the positionals): a flag inserted here
    /// belongs to the innermost command.
    pub flags_end: usize,
}

/// A flag of the rewritten line: its long name, its value (`true` or `false` for a switch) and
/// whether the command line or its `PICO_*` variable gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GivenFlag {
    pub long: &'static str,
    pub value: String,
    pub origin: Origin,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    CommandLine,
    /// `PICO_<FLAG>` ([`env_var_name`]).
    Environment,
}

/// The variable that stands in for a flag: `--admin-listen` → `PICO_ADMIN_LISTEN`.
pub fn env_var_name(long_flag: &str) -> String {
    format!(
        "PICO_{}",
        long_flag
            .trim_start_matches('-')
            .to_ascii_uppercase()
            .replace('-', "_")
    )
}

/// One command on the path from the root to the chosen subcommand.
struct Level<'i> {
    info: &'i CommandInfoWithArgs,
    name: Option<&'i str>,
    /// Flags (and values) found on the command line for this command, in order.
    words: Vec<String>,
    /// Long names of the flags given, so the environment does not override them.
    given: HashSet<&'i str>,
    /// The same flags with their values and origins, command line first.
    origins: Vec<GivenFlag>,
    help: bool,
}

impl<'i> Level<'i> {
    fn new(info: &'i CommandInfoWithArgs, name: Option<&'i str>) -> Level<'i> {
        Level {
            info,
            name,
            words: Vec::new(),
            given: HashSet::new(),
            origins: Vec::new(),
            help: false,
        }
    }
}

/// A command line that cannot be rewritten: exit 2 with this command's usage.
#[derive(Debug, PartialEq, Eq)]
pub struct UsageError {
    pub message: String,
    /// The subcommands recognised before the error, for the usage text.
    pub command_path: Vec<String>,
}

/// Rewrites `args` (without the program name). `env` looks a variable up; it is a parameter
/// so tests do not touch the process environment.
pub fn normalize(
    root: &CommandInfoWithArgs,
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Normalized, UsageError> {
    let mut levels = vec![Level::new(root, None)];
    let mut positionals: Vec<String> = Vec::new();
    let sorted = sort_words(&mut levels, &mut positionals, args);
    let help = levels.iter().any(|l| l.help);
    // With --help the environment is irrelevant, and a bad variable must not block help.
    let injected = sorted.and_then(|()| {
        if !help {
            levels
                .iter_mut()
                .try_for_each(|level| inject_env(level, env))?;
        }
        Ok(())
    });
    if let Err(message) = injected {
        let command_path = levels
            .iter()
            .filter_map(|l| l.name.map(str::to_owned))
            .collect();
        return Err(UsageError {
            message,
            command_path,
        });
    }

    let mut out = Vec::new();
    let mut command_path = Vec::new();
    let mut given = Vec::new();
    for level in levels {
        given.extend(level.origins);
        if let Some(name) = level.name {
            out.push(name.to_owned());
            command_path.push(name.to_owned());
        }
        out.extend(level.words);
        if level.help {
            out.push("--help".into());
        }
    }
    let flags_end = out.len();
    if !help && !positionals.is_empty() {
        out.push("--".into());
        out.extend(positionals);
    }
    Ok(Normalized {
        args: out,
        command_path,
        help,
        given,
        flags_end,
    })
}

/// Assigns every word to the command that declares it (flags), opens subcommands, and
/// collects the positionals.
fn sort_words<'i>(
    levels: &mut Vec<Level<'i>>,
    positionals: &mut Vec<String>,
    args: &[String],
) -> Result<(), String> {
    let mut rest = args.iter();
    while let Some(word) = rest.next() {
        if word == "--" {
            positionals.extend(rest.by_ref().cloned());
            break;
        }
        if word == "--help" || word == "-h" || word == "help" {
            levels.last_mut().expect("root level").help = true;
            continue;
        }
        let (name, inline_value) = match word.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value)),
            _ => (word.as_str(), None),
        };
        if let Some((index, flag)) = find_flag(levels, name) {
            let level = &mut levels[index];
            level.given.insert(flag.long);
            level.words.push(flag.long.to_owned());
            let value = match flag.kind {
                FlagInfoKind::Switch if inline_value.is_some() => {
                    return Err(format!("{} is a switch and takes no value", flag.long));
                }
                FlagInfoKind::Switch => "true".to_owned(),
                FlagInfoKind::Option { .. } => {
                    let value = match inline_value {
                        Some(value) => value.to_owned(),
                        None => rest.next().cloned().ok_or_else(|| {
                            format!("No value provided for option '{}'.", flag.long)
                        })?,
                    };
                    level.words.push(value.clone());
                    value
                }
            };
            level.origins.push(GivenFlag {
                long: flag.long,
                value,
                origin: Origin::CommandLine,
            });
            continue;
        }
        let current = levels.last_mut().expect("root level");
        if word.len() > 1 && word.starts_with('-') {
            // Unknown flag: leave it where it is for argh to report.
            current.words.push(word.clone());
            continue;
        }
        let subcommand = current
            .info
            .commands
            .iter()
            .find(|c| c.name == word.as_str());
        match subcommand {
            Some(sub) if positionals.is_empty() => {
                levels.push(Level::new(&sub.command, Some(sub.name)))
            }
            _ => positionals.push(word.clone()),
        }
    }

    Ok(())
}

/// The innermost command on the path that declares `word` (long or short form).
fn find_flag<'i>(levels: &[Level<'i>], word: &str) -> Option<(usize, &'i FlagInfo<'static>)> {
    levels.iter().enumerate().rev().find_map(|(index, level)| {
        let info: &'i CommandInfoWithArgs = level.info;
        info.flags
            .iter()
            .filter(|f| f.long != "--help")
            .find(|f| {
                f.long == word
                    || f.short.is_some_and(|c| {
                        word.len() == 2 && word.ends_with(c) && word.starts_with('-')
                    })
            })
            .map(|f| (index, f))
    })
}

fn inject_env(level: &mut Level<'_>, env: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
    for flag in level.info.flags.iter().filter(|f| f.long != "--help") {
        if level.given.contains(flag.long) {
            continue;
        }
        let var = env_var_name(flag.long);
        let Some(value) = env(&var).filter(|v| !v.is_empty()) else {
            continue;
        };
        let value = match flag.kind {
            FlagInfoKind::Switch => {
                let on = parse_bool(&value).ok_or_else(|| {
                    format!("invalid {var}={value:?}: expected 1/true/yes or 0/false/no")
                })?;
                if on {
                    level.words.push(flag.long.to_owned());
                }
                // Recorded when off too: the variable was set, so nothing below it applies.
                on.to_string()
            }
            FlagInfoKind::Option { .. } => {
                level.words.push(flag.long.to_owned());
                level.words.push(value.clone());
                value
            }
        };
        level.origins.push(GivenFlag {
            long: flag.long,
            value,
            origin: Origin::Environment,
        });
    }
    Ok(())
}

fn parse_bool(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use argh::{ArgsInfo, FromArgs};

    use super::*;
    use crate::args::{Cli, Command};

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn run(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Cli {
        let normalized = normalize(&Cli::get_args_info(), args, env).unwrap();
        let strs: Vec<&str> = normalized.args.iter().map(String::as_str).collect();
        Cli::from_args(&["pico"], &strs)
            .unwrap_or_else(|e| panic!("{:?} -> {}", normalized.args, e.output))
    }

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn serve(cli: Cli) -> crate::args::ServeArgs {
        match cli.command {
            Command::Serve(s) => s,
            other => panic!("not serve: {other:?}"),
        }
    }

    #[test]
    fn env_names() {
        assert_eq!(env_var_name("--admin-listen"), "PICO_ADMIN_LISTEN");
        assert_eq!(env_var_name("--http2"), "PICO_HTTP2");
        assert_eq!(
            env_var_name("--long-poll-timeout-sec"),
            "PICO_LONG_POLL_TIMEOUT_SEC"
        );
    }

    #[test]
    fn values_starting_with_a_dash_are_values() {
        let args = words("serve --meta-url sqlite:./data/meta.db --storage -2@file://./objects");
        let normalized = normalize(&Cli::get_args_info(), &args, &no_env).unwrap();
        assert_eq!(normalized.args, args);
        let s = serve(run(&args, &no_env));
        assert_eq!(s.storage, "-2@file://./objects");
        assert_eq!(s.meta_url, "sqlite:./data/meta.db");
    }

    #[test]
    fn a_value_may_look_like_a_flag_or_a_subcommand() {
        let s = serve(run(
            &words("serve --storage --listen --listen 127.0.0.1:1"),
            &no_env,
        ));
        assert_eq!(s.storage, "--listen");
        assert_eq!(s.listen, "127.0.0.1:1");
        let cli = run(&words("--profile serve serve"), &no_env);
        assert_eq!(cli.profile.as_deref(), Some("serve"));
        assert!(matches!(cli.command, Command::Serve(_)));
    }

    #[test]
    fn equals_form_is_split() {
        let s = serve(run(
            &words("serve --storage=-3@file://x=y --no-admin"),
            &no_env,
        ));
        assert_eq!(s.storage, "-3@file://x=y");
        assert!(s.no_admin);
        assert!(normalize(&Cli::get_args_info(), &words("serve --no-admin=1"), &no_env).is_err());
    }

    #[test]
    fn global_flags_may_follow_the_subcommand() {
        let cli = run(
            &words("read /s --endpoint http://h:1 --from 5 --http2 --protocol ds"),
            &no_env,
        );
        assert_eq!(cli.endpoint.as_deref(), Some("http://h:1"));
        assert!(cli.http2);
        assert_eq!(cli.protocol, Some(pico_client::Protocol::DurableStreams));
        match cli.command {
            Command::Read(r) => {
                assert_eq!(r.stream, "/s");
                assert_eq!(r.from.as_deref(), Some("5"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn positionals_may_start_with_a_dash() {
        let normalized = normalize(&Cli::get_args_info(), &words("head -- -odd"), &no_env).unwrap();
        assert_eq!(normalized.args, words("head -- -odd"));
        match run(&normalized.args, &no_env).command {
            Command::Head(h) => assert_eq!(h.stream, "-odd"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn short_flags_work() {
        match run(&words("tail /s -f"), &no_env).command {
            Command::Tail(t) => assert!(t.follow),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn environment_fills_absent_flags() {
        let env = env_of(&[
            ("PICO_LISTEN", "0.0.0.0:5000"),
            ("PICO_ADMIN_LISTEN", "127.0.0.1:9999"),
            ("PICO_NO_ADMIN", "yes"),
            ("PICO_STORAGE", "-7@file://./o"),
            ("PICO_PROTOCOL", "ds"),
        ]);
        let cli = run(&words("serve"), &env);
        assert_eq!(cli.protocol, Some(pico_client::Protocol::DurableStreams));
        let s = serve(cli);
        assert_eq!(s.listen, "0.0.0.0:5000");
        assert_eq!(s.admin_listen, "127.0.0.1:9999");
        assert!(s.no_admin);
        assert_eq!(s.storage, "-7@file://./o");
    }

    #[test]
    fn flags_win_over_the_environment() {
        let env = env_of(&[
            ("PICO_LISTEN", "0.0.0.0:5000"),
            ("PICO_ENDPOINT", "http://env:1"),
        ]);
        let cli = run(
            &words("serve --listen 127.0.0.1:6000 --endpoint http://flag:1"),
            &env,
        );
        assert_eq!(cli.endpoint.as_deref(), Some("http://flag:1"));
        assert_eq!(serve(cli).listen, "127.0.0.1:6000");
    }

    #[test]
    fn defaults_apply_without_flag_or_environment() {
        let s = serve(run(&words("serve"), &no_env));
        assert_eq!(s.listen, "127.0.0.1:4437");
        assert_eq!(s.storage, "-2@file://./objects");
        assert_eq!(s.max_body_size, 8 << 20);
    }

    #[test]
    fn switch_values_from_the_environment() {
        for (value, expected) in [
            ("1", true),
            ("TRUE", true),
            ("yes", true),
            ("0", false),
            ("false", false),
            ("", false),
        ] {
            let env = env_of(&[("PICO_HTTP2", value), ("PICO_FOLLOW", value)]);
            let cli = run(&words("tail /s"), &env);
            assert_eq!(cli.http2, expected, "{value:?}");
            match cli.command {
                Command::Tail(t) => assert_eq!(t.follow, expected, "{value:?}"),
                other => panic!("{other:?}"),
            }
        }
        let env = env_of(&[("PICO_HTTP2", "maybe")]);
        let err = normalize(&Cli::get_args_info(), &words("head /s"), &env).unwrap_err();
        assert!(err.message.contains("PICO_HTTP2"), "{err:?}");
        assert_eq!(err.command_path, words("head"));
    }

    #[test]
    fn every_given_flag_is_recorded_with_its_origin() {
        let env = env_of(&[
            ("PICO_LISTEN", "0.0.0.0:5000"),
            ("PICO_BACKLOG", "7"),
            ("PICO_NO_ADMIN", "0"),
        ]);
        let normalized = normalize(
            &Cli::get_args_info(),
            &words("serve --listen 127.0.0.1:1 --wal-salvage"),
            &env,
        )
        .unwrap();
        let given: Vec<(&str, &str, Origin)> = normalized
            .given
            .iter()
            .map(|g| (g.long, g.value.as_str(), g.origin))
            .collect();
        assert_eq!(
            given,
            [
                ("--listen", "127.0.0.1:1", Origin::CommandLine),
                ("--wal-salvage", "true", Origin::CommandLine),
                ("--no-admin", "false", Origin::Environment),
                ("--backlog", "7", Origin::Environment),
            ]
        );
        assert_eq!(normalized.flags_end, normalized.args.len());
        let with_positional = normalize(&Cli::get_args_info(), &words("head /s"), &no_env).unwrap();
        assert_eq!(with_positional.args[with_positional.flags_end], "--");
    }

    #[test]
    fn only_the_chosen_commands_flags_come_from_the_environment() {
        let env = env_of(&[("PICO_BATCH", "7"), ("PICO_FROM", "3")]);
        let normalized = normalize(&Cli::get_args_info(), &words("append /s"), &env).unwrap();
        assert_eq!(normalized.args, words("append --batch 7 -- /s"));
    }

    #[test]
    fn help_skips_the_environment_and_positionals() {
        let env = env_of(&[("PICO_HTTP2", "maybe")]);
        let normalized = normalize(&Cli::get_args_info(), &words("serve --help"), &env).unwrap();
        assert!(normalized.help);
        assert_eq!(normalized.args, words("serve --help"));
        let err = Cli::from_args(&["pico"], &["serve", "--help"]).unwrap_err();
        assert!(err.status.is_ok());
        assert!(
            err.output.contains("[env: PICO_ADMIN_LISTEN]"),
            "{}",
            err.output
        );
    }

    #[test]
    fn a_missing_value_is_a_usage_error() {
        let err = normalize(&Cli::get_args_info(), &words("serve --listen"), &no_env).unwrap_err();
        assert_eq!(err.message, "No value provided for option '--listen'.");
        assert_eq!(err.command_path, words("serve"));
    }

    #[test]
    fn unknown_flags_reach_argh() {
        let normalized =
            normalize(&Cli::get_args_info(), &words("head /s --bogus"), &no_env).unwrap();
        assert_eq!(normalized.args, words("head --bogus -- /s"));
        let strs: Vec<&str> = normalized.args.iter().map(String::as_str).collect();
        assert!(Cli::from_args(&["pico"], &strs).is_err());
    }

    /// A nested tree, to show the rules do not depend on the shape of the real one.
    #[derive(FromArgs, ArgsInfo, Debug)]
    /// top
    struct Top {
        /// global [env: PICO_GLOBAL]
        #[argh(option)]
        global: Option<String>,
        #[argh(subcommand)]
        sub: MidCommand,
    }

    #[derive(FromArgs, ArgsInfo, Debug)]
    #[argh(subcommand)]
    enum MidCommand {
        Mid(Mid),
    }

    #[derive(FromArgs, ArgsInfo, Debug)]
    #[argh(subcommand)]
    enum LeafCommand {
        Leaf(Leaf),
    }

    #[derive(FromArgs, ArgsInfo, Debug)]
    #[argh(subcommand, name = "mid")]
    /// mid
    struct Mid {
        /// middle [env: PICO_MIDDLE]
        #[argh(option)]
        middle: Option<String>,
        #[argh(subcommand)]
        leaf: LeafCommand,
    }

    #[derive(FromArgs, ArgsInfo, Debug)]
    #[argh(subcommand, name = "leaf")]
    /// leaf
    struct Leaf {
        /// a switch [env: PICO_LOUD]
        #[argh(switch)]
        loud: bool,
        #[argh(positional)]
        /// name
        name: String,
    }

    #[test]
    fn nested_commands_get_their_own_flags_back() {
        let args = words("mid leaf x --middle -m --global -g --loud");
        let normalized = normalize(&Top::get_args_info(), &args, &no_env).unwrap();
        assert_eq!(
            normalized.args,
            words("--global -g mid --middle -m leaf --loud -- x")
        );
        assert_eq!(normalized.command_path, words("mid leaf"));
        let strs: Vec<&str> = normalized.args.iter().map(String::as_str).collect();
        let top = Top::from_args(&["t"], &strs).unwrap();
        assert_eq!(top.global.as_deref(), Some("-g"));
        let MidCommand::Mid(mid) = top.sub;
        assert_eq!(mid.middle.as_deref(), Some("-m"));
        let LeafCommand::Leaf(leaf) = mid.leaf;
        assert!(leaf.loud);
        assert_eq!(leaf.name, "x");

        let env = env_of(&[
            ("PICO_MIDDLE", "env"),
            ("PICO_LOUD", "1"),
            ("PICO_GLOBAL", "envg"),
        ]);
        let normalized = normalize(
            &Top::get_args_info(),
            &words("mid leaf x --global flag"),
            &env,
        )
        .unwrap();
        assert_eq!(
            normalized.args,
            words("--global flag mid --middle env leaf --loud -- x")
        );
    }

    /// `--help` names the variable of every flag, and the name is the one injected.
    #[test]
    fn every_flag_documents_its_variable() {
        fn check(info: &CommandInfoWithArgs, path: &str) {
            for flag in info.flags.iter().filter(|f| f.long != "--help") {
                let expected = format!("[env: {}]", env_var_name(flag.long));
                assert!(
                    flag.description.ends_with(&expected),
                    "{path} {}: description should end with {expected}: {:?}",
                    flag.long,
                    flag.description
                );
            }
            for sub in &info.commands {
                check(&sub.command, &format!("{path} {}", sub.name));
            }
        }
        check(&Cli::get_args_info(), "pico");
    }

    /// A subcommand flag named like a global one would make "global" ambiguous.
    #[test]
    fn no_subcommand_redeclares_a_global_flag() {
        let info = Cli::get_args_info();
        let globals: Vec<&str> = info
            .flags
            .iter()
            .map(|f| f.long)
            .filter(|l| *l != "--help")
            .collect();
        for sub in &info.commands {
            for flag in sub.command.flags {
                assert!(
                    !globals.contains(&flag.long),
                    "{} redeclares {}",
                    sub.name,
                    flag.long
                );
            }
        }
    }
}
