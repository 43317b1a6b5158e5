//! The Docker harness stays in step with the command line: every `--flag` that the Dockerfile's
//! CMD/ENTRYPOINT and the compose files' `command:`/`entrypoint:` pass to `pico` must be a flag
//! of the real binary's `pico serve --help` (or a global flag of `pico --help`, which serve
//! takes too), and every `PICO_*` name anywhere in those files, in the `.env.example` files and
//! in the Debian package's unit and `/etc/default/picomq` (`packaging/`) must be the variable of
//! such a flag. Renaming a flag without updating the harness fails here.
//!
//! The files are read line by line (no YAML parser): enough for the shapes they use, a flow
//! list (`["a", "b"]`), a block list (`- "a"`) or a plain string after `command:`, and exec- or
//! shell-form `CMD`/`ENTRYPOINT` lines. The parser is tested below so that it cannot silently
//! find nothing.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ has a parent")
        .to_path_buf()
}

/// The long flags in the option list of `pico <args> --help` (argh prints each at an indent of
/// exactly two spaces; wrapped description lines are indented further and may mention flags).
fn help_flags(args: &[&str]) -> BTreeSet<String> {
    let output = common::cli::pico_without_pico_env()
        .args(args)
        .arg("--help")
        .output()
        .expect("run pico");
    assert!(output.status.success(), "pico {args:?} --help: {output:?}");
    let text = String::from_utf8(output.stdout).expect("help is UTF-8");
    let flags: BTreeSet<String> = text
        .lines()
        .filter(|line| line.starts_with("  --"))
        .filter_map(|line| {
            line.split(|c: char| c.is_whitespace() || c == ',')
                .find(|word| !word.is_empty())
                .map(str::to_owned)
        })
        .filter(|flag| flag != "--help")
        .collect();
    assert!(
        !flags.is_empty(),
        "no flags found in pico {args:?} --help:\n{text}"
    );
    flags
}

/// What the harness may use: serve's flags and the global ones.
fn known_flags() -> BTreeSet<String> {
    let mut flags = help_flags(&["serve"]);
    flags.extend(help_flags(&[]));
    assert!(
        flags.contains("--listen") && flags.contains("--meta-url") && flags.contains("--protocol"),
        "{flags:?}"
    );
    flags
}

/// `--admin-listen` → `PICO_ADMIN_LISTEN`, the rule of `argv::env_var_name`.
fn env_var_of(flag: &str) -> String {
    format!(
        "PICO_{}",
        flag.trim_start_matches('-')
            .to_ascii_uppercase()
            .replace('-', "_")
    )
}

/// A command line found in a harness file.
#[derive(Debug, PartialEq)]
struct Invocation {
    line: usize,
    /// Arguments after the entrypoint: for `pico`, starting with the subcommand.
    args: Vec<String>,
    /// `entrypoint:` / `ENTRYPOINT` rather than `command:` / `CMD`.
    entrypoint: bool,
}

/// Items of a flow sequence (`["a", 'b', c]`, also JSON), quotes removed.
fn parse_flow_list(text: &str) -> Vec<String> {
    let inner = text.trim();
    let inner = inner.strip_prefix('[').unwrap_or(inner);
    let inner = inner.strip_suffix(']').unwrap_or(inner);
    let mut items = Vec::new();
    let mut chars = inner.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
            chars.next();
        }
        let Some(&first) = chars.peek() else { break };
        let mut item = String::new();
        if first == '"' || first == '\'' {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' if first == '"' => {
                        if let Some(escaped) = chars.next() {
                            item.push(escaped);
                        }
                    }
                    '\'' if first == '\'' && chars.peek() == Some(&'\'') => {
                        chars.next();
                        item.push('\'');
                    }
                    c if c == first => break,
                    c => item.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ',' {
                    break;
                }
                item.push(c);
                chars.next();
            }
            item = item.trim().to_owned();
        }
        items.push(item);
    }
    items
}

/// One scalar of a block sequence item or a plain value, quotes (or a trailing comment) removed.
fn parse_scalar(text: &str) -> String {
    let text = text.trim();
    if text.starts_with('"') || text.starts_with('\'') {
        parse_flow_list(text).into_iter().next().unwrap_or_default()
    } else {
        match text.find(" #") {
            Some(at) => text[..at].trim_end().to_owned(),
            None => text.to_owned(),
        }
    }
}

/// `command:` text after the colon: a flow list, or a plain string that compose splits on
/// whitespace.
fn parse_inline_command(rest: &str) -> Vec<String> {
    let rest = rest.trim();
    if rest.starts_with('[') {
        parse_flow_list(rest)
    } else {
        parse_scalar(rest)
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

fn is_blank_or_comment(line: &str) -> bool {
    let trimmed = line.trim();
    trimmed.is_empty() || trimmed.starts_with('#')
}

/// A service (or a top-level `x-` extension) of a compose file.
#[derive(Debug, Default)]
struct Block {
    name: String,
    /// `&name` on its key line.
    anchor: Option<String>,
    /// `<<: *name` lines.
    merges: Vec<String>,
    image: Option<String>,
    invocations: Vec<Invocation>,
}

impl Block {
    fn runs_pico(&self, blocks: &[Block]) -> bool {
        let own = self
            .image
            .as_deref()
            .is_some_and(|image| image.to_ascii_lowercase().contains("picomq"));
        own || self.merges.iter().any(|anchor| {
            blocks
                .iter()
                .any(|b| b.anchor.as_deref() == Some(anchor.as_str()) && b.runs_pico(blocks))
        })
    }
}

/// The services and `x-` blocks of a compose file, with their `command:`/`entrypoint:` lists.
fn parse_compose(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks: Vec<Block> = Vec::new();
    // Indent of the current block's key line, while inside one.
    let mut current: Option<usize> = None;
    let mut in_services = false;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        if is_blank_or_comment(line) {
            continue;
        }
        let indent = indent_of(line);
        let trimmed = line.trim();
        if current.is_some_and(|block_indent| indent <= block_indent) {
            current = None;
        }
        if indent == 0 {
            in_services = trimmed.starts_with("services:");
        }
        let (key, rest) = match trimmed.split_once(':') {
            Some((key, rest)) => (key.trim(), rest.trim()),
            None => (trimmed, ""),
        };
        let opens_block = current.is_none()
            && ((indent == 0 && key.starts_with("x-")) || (indent == 2 && in_services));
        if opens_block {
            blocks.push(Block {
                name: key.to_owned(),
                anchor: rest.strip_prefix('&').map(|a| a.trim().to_owned()),
                ..Block::default()
            });
            current = Some(indent);
            continue;
        }
        let Some(block) = current.and(blocks.last_mut()) else {
            continue;
        };
        match key {
            "image" => block.image = Some(parse_scalar(rest)),
            "<<" => {
                if let Some(anchor) = rest.strip_prefix('*') {
                    block.merges.push(anchor.trim().to_owned());
                }
            }
            "command" | "entrypoint" => {
                let start = i;
                let args = if rest.is_empty() {
                    // A block sequence: `- item` lines, indented at least as much as the key.
                    let mut args = Vec::new();
                    while i < lines.len() {
                        let next = lines[i];
                        if is_blank_or_comment(next) {
                            i += 1;
                            continue;
                        }
                        match next.trim_start().strip_prefix("- ") {
                            Some(item) if indent_of(next) >= indent => {
                                args.push(parse_scalar(item));
                                i += 1;
                            }
                            _ => break,
                        }
                    }
                    args
                } else {
                    parse_inline_command(rest)
                };
                block.invocations.push(Invocation {
                    line: start,
                    args,
                    entrypoint: key == "entrypoint",
                });
            }
            _ => {}
        }
    }
    blocks
}

/// The `CMD` and `ENTRYPOINT` instructions of a Dockerfile (continuation lines joined;
/// `HEALTHCHECK ... CMD` is not one).
fn parse_dockerfile(text: &str) -> Vec<Invocation> {
    let mut found = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (index, line) in text.lines().enumerate() {
        let (start, mut joined) = match pending.take() {
            Some(open) => open,
            None if line.trim_start().starts_with('#') => continue,
            None => (index + 1, String::new()),
        };
        let piece = line.trim_end();
        if let Some(continued) = piece.strip_suffix('\\') {
            joined.push_str(continued);
            joined.push(' ');
            pending = Some((start, joined));
            continue;
        }
        joined.push_str(piece);
        let instruction = joined.trim_start();
        let (word, rest) = instruction
            .split_once(char::is_whitespace)
            .unwrap_or((instruction, ""));
        let entrypoint = match word.to_ascii_uppercase().as_str() {
            "CMD" => false,
            "ENTRYPOINT" => true,
            _ => continue,
        };
        found.push(Invocation {
            line: start,
            args: parse_inline_command(rest),
            entrypoint,
        });
    }
    found
}

/// Every `PICO_<NAME>` in `text`, with its line.
fn pico_variables(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let bytes = line.as_bytes();
        let mut from = 0;
        while let Some(at) = line[from..].find("PICO_").map(|at| at + from) {
            let preceded =
                at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
            let end = line[at..]
                .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                .map_or(line.len(), |len| at + len);
            // `PICO_*` in prose names the family, not a variable.
            if !preceded && end > at + "PICO_".len() {
                found.push((index + 1, line[at..end].to_owned()));
            }
            from = end.max(at + 1);
        }
    }
    found
}

/// What is wrong in one file: flags of its pico command lines that `flags` lacks, and
/// `PICO_*` names that are no flag's variable.
fn check_file(
    file: &str,
    text: &str,
    pico_args: &[(usize, Vec<String>)],
    flags: &BTreeSet<String>,
) -> Vec<String> {
    let variables: HashMap<String, &String> = flags.iter().map(|f| (env_var_of(f), f)).collect();
    let mut problems = Vec::new();
    for (line, args) in pico_args {
        for arg in args.iter().filter(|a| a.starts_with("--")) {
            let flag = arg.split('=').next().unwrap_or(arg);
            if !flags.contains(flag) {
                problems.push(format!(
                    "{file}:{line}: {flag} is not a flag of `pico serve --help`"
                ));
            }
        }
    }
    for (line, variable) in pico_variables(text) {
        if !variables.contains_key(&variable) {
            problems.push(format!(
                "{file}:{line}: {variable} is not the variable of any flag of `pico serve --help`"
            ));
        }
    }
    problems
}

/// The pico command lines of a compose file: the `command:` of every service (or `x-` block)
/// that runs the PicoMQ image, after the image's `pico` entrypoint.
fn compose_pico_args(file: &str, text: &str) -> Result<Vec<(usize, Vec<String>)>, String> {
    let blocks = parse_compose(text);
    let mut found = Vec::new();
    for block in blocks.iter().filter(|b| b.runs_pico(&blocks)) {
        for invocation in &block.invocations {
            if invocation.entrypoint {
                if invocation.args != ["pico"] {
                    return Err(format!(
                        "{file}:{}: {}: the entrypoint must stay the image's `pico`, not {:?}",
                        invocation.line, block.name, invocation.args
                    ));
                }
                continue;
            }
            if invocation.args.first().map(String::as_str) != Some("serve") {
                return Err(format!(
                    "{file}:{}: {}: the command must start with `serve`, not {:?}",
                    invocation.line, block.name, invocation.args
                ));
            }
            found.push((invocation.line, invocation.args.clone()));
        }
    }
    Ok(found)
}

/// Files below `dir` whose name passes `wanted`, sorted.
fn files_below(dir: &Path, wanted: &dyn Fn(&str) -> bool, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files_below(&path, wanted, out);
        } else if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(wanted)
        {
            out.push(path);
        }
    }
}

#[test]
fn harness_uses_only_real_flags_and_variables() {
    let root = repo_root();
    let flags = known_flags();
    let mut problems = Vec::new();
    let relative = |path: &Path| {
        path.strip_prefix(&root)
            .unwrap_or(path)
            .display()
            .to_string()
    };

    // The Dockerfile: ENTRYPOINT ["pico"], CMD ["serve", ...].
    let dockerfile = root.join("Dockerfile");
    let text = std::fs::read_to_string(&dockerfile).expect("read Dockerfile");
    let invocations = parse_dockerfile(&text);
    let entrypoints: Vec<_> = invocations.iter().filter(|i| i.entrypoint).collect();
    assert_eq!(entrypoints.len(), 1, "one ENTRYPOINT: {invocations:?}");
    assert_eq!(entrypoints[0].args, ["pico"], "ENTRYPOINT [\"pico\"]");
    let cmds: Vec<(usize, Vec<String>)> = invocations
        .iter()
        .filter(|i| !i.entrypoint)
        .map(|i| (i.line, i.args.clone()))
        .collect();
    assert_eq!(cmds.len(), 1, "one CMD: {invocations:?}");
    assert_eq!(cmds[0].1.first().map(String::as_str), Some("serve"));
    assert!(
        cmds[0].1.iter().any(|a| a == "--listen"),
        "the CMD sets --listen: {cmds:?}"
    );
    problems.extend(check_file("Dockerfile", &text, &cmds, &flags));

    // Every compose file and .env.example under harness/.
    let harness = root.join("harness");
    let mut compose_files = Vec::new();
    files_below(
        &harness,
        &|name| name.starts_with("compose") && (name.ends_with(".yml") || name.ends_with(".yaml")),
        &mut compose_files,
    );
    let names: BTreeSet<String> = compose_files.iter().map(|p| relative(p)).collect();
    for expected in [
        "harness/aio/compose.yml",
        "harness/aio/compose.cluster.yml",
        "harness/aio/compose.lite.yml",
        "harness/byo/compose.yml",
    ] {
        assert!(names.contains(expected), "{expected} missing: {names:?}");
    }
    for path in &compose_files {
        let file = relative(path);
        let text = std::fs::read_to_string(path).expect("read compose file");
        match compose_pico_args(&file, &text) {
            Ok(args) => {
                assert!(
                    !args.is_empty(),
                    "{file}: no pico service with a command found"
                );
                problems.extend(check_file(&file, &text, &args, &flags));
            }
            Err(problem) => problems.push(problem),
        }
    }
    let mut env_files = Vec::new();
    files_below(
        &harness,
        &|name| name.ends_with(".env.example"),
        &mut env_files,
    );
    assert!(env_files.len() >= 2, "{env_files:?}");
    for path in &env_files {
        let text = std::fs::read_to_string(path).expect("read .env.example");
        problems.extend(check_file(&relative(path), &text, &[], &flags));
    }

    // The Debian package's unit and its settings file (/etc/default/picomq).
    for file in [
        "packaging/systemd/picomq.service",
        "packaging/debian/picomq.default",
    ] {
        let text =
            std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("read {file}: {e}"));
        problems.extend(check_file(file, &text, &[], &flags));
    }

    assert!(
        problems.is_empty(),
        "the Docker harness is out of step with the flags:\n{}",
        problems.join("\n")
    );
}

/// The parsers find what the harness files use, and a renamed flag or variable is reported.
#[test]
fn parsers_find_commands_and_report_unknown_flags() {
    let compose = r#"
name: t
x-node: &node
  image: ${PICOMQ_IMAGE:-picomq:latest}
  environment:
    PICO_LISTN: "0.0.0.0:4437"
services:
  store:
    image: dxflrs/garage:v2.4.1
    command: ["/garage", "server", "--single-node"]
  a:
    <<: *node
    command:
      - "serve"
      # a comment
      - --listn
      - '0.0.0.0:4437'
    ports:
      - "4437:4437"
  b:
    image: picomq:latest
    entrypoint: ["pico"]
    command: serve --admin-listen 0.0.0.0:9090 --stoarge=x
  c:
    image: picomq:latest
    command:
    - serve
    - --listen
volumes:
  a:
"#;
    let blocks = parse_compose(compose);
    let names: Vec<&str> = blocks.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["x-node", "store", "a", "b", "c"]);
    let args = compose_pico_args("t.yml", compose).expect("pico commands");
    let lists: Vec<&Vec<String>> = args.iter().map(|(_, a)| a).collect();
    assert_eq!(
        lists,
        [
            &vec!["serve".to_owned(), "--listn".into(), "0.0.0.0:4437".into()],
            &vec![
                "serve".to_owned(),
                "--admin-listen".into(),
                "0.0.0.0:9090".into(),
                "--stoarge=x".into()
            ],
            &vec!["serve".to_owned(), "--listen".into()],
        ]
    );

    let flags: BTreeSet<String> = ["--listen", "--admin-listen", "--storage"]
        .map(String::from)
        .into();
    let problems = check_file("t.yml", compose, &args, &flags);
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(problems[0].contains("--listn"), "{problems:?}");
    assert!(problems[1].contains("--stoarge"), "{problems:?}");
    assert!(problems[2].contains("t.yml:6: PICO_LISTN"), "{problems:?}");

    let dockerfile = "FROM x\nHEALTHCHECK CMD [\"bash\", \"-c\", \"true\"]\n# CMD [\"no\"]\n\
                      ENTRYPOINT [\"pico\"]\nCMD [\"serve\", \\\n    \"--listen\", \"a\\\"b\"]\n";
    let invocations = parse_dockerfile(dockerfile);
    assert_eq!(
        invocations,
        [
            Invocation {
                line: 4,
                args: vec!["pico".into()],
                entrypoint: true
            },
            Invocation {
                line: 5,
                args: vec!["serve".into(), "--listen".into(), "a\"b".into()],
                entrypoint: false
            },
        ]
    );
    assert_eq!(
        pico_variables("X_PICO_A PICO_B=1 ${PICO_C:-} PICOMQ_D PICO_*"),
        [(1, "PICO_B".to_owned()), (1, "PICO_C".to_owned())]
    );
    assert_eq!(env_var_of("--admin-listen"), "PICO_ADMIN_LISTEN");
}
