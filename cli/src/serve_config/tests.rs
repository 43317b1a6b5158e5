//! Tests of the config file: keys, parsing, precedence, `--print-config` and the reference.

use argh::{ArgsInfo, FlagInfoKind};

use super::render::{effective, meaning_and_default, reference, toml_integer, toml_string};
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
        "<!-- options: generated from `pico serve --help`; see cli/src/serve_config/render.rs -->\n";
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
