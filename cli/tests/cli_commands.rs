//! `pico ls`, `pico trim`, `pico config ...`, `--token`, `--ca-cert` and the progress
//! line: outputs, exit codes and config file round trips (README.md, "Use it"),
//! against a real `pico serve` where the command talks to one.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::cli::{check_outcome, pico_without_pico_env, run_with_stdin};
use common::Server;

const FLAGS: &[&str] = &["--cores", "1"];

/// `pico` with a clean environment: no `PICO_*` from the test run, the config file at
/// `config` (which need not exist).
fn pico(config: &Path, args: &[&str]) -> Command {
    let mut command = pico_without_pico_env();
    command.env("PICO_CONFIG", config).args(args);
    command
}

fn run_with(mut command: Command, stdin: &[u8]) -> Output {
    run_with_stdin(&mut command, stdin)
}

#[track_caller]
fn check(out: Output, what: &str, code: i32, stdout: &str, stderr: &str) {
    check_outcome(&out, what, code, stdout, stderr);
}

/// Client commands against `server`, endpoint given as a flag.
struct Cli<'s> {
    server: &'s Server,
    config: PathBuf,
}

impl Cli<'_> {
    fn new(server: &Server) -> Cli<'_> {
        let config = server.dir().join("no-such-config.toml");
        Cli { server, config }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = pico(&self.config, args);
        command.args(["--endpoint", &format!("http://{}", self.server.addr)]);
        command
    }

    fn run(&self, args: &[&str], stdin: &[u8]) -> Output {
        run_with(self.command(args), stdin)
    }

    #[track_caller]
    fn expect(&self, args: &[&str], stdin: &[u8], code: i32, stdout: &str, stderr: &str) {
        check(
            self.run(args, stdin),
            &format!("pico {args:?}"),
            code,
            stdout,
            stderr,
        );
    }
}

#[test]
fn ls_lists_streams_with_their_positions() {
    let server = Server::start(FLAGS);
    let cli = Cli::new(&server);
    for name in ["/ls/b", "/ls/a", "/ls/c", "/other/x"] {
        cli.expect(&["create", name], b"", 0, "", "created=true\n");
    }
    cli.expect(
        &["append", "/ls/a", "--batch", "3"],
        b"1\n2\n3\n",
        0,
        "",
        "start=0 next=3\n",
    );
    cli.expect(&["close", "/ls/c"], b"", 0, "", "closed next=0\n");

    let all = "/ls/a start=0 next=3 closed=false\n\
               /ls/b start=0 next=0 closed=false\n\
               /ls/c start=0 next=0 closed=true\n";
    cli.expect(&["ls", "--prefix", "/ls/"], b"", 0, all, "");
    cli.expect(
        &["ls", "--prefix", "/ls/", "--limit", "2"],
        b"",
        0,
        "/ls/a start=0 next=3 closed=false\n/ls/b start=0 next=0 closed=false\n",
        "more streams available, raise --limit\n",
    );
    // Default prefix `/`: everything; the environment works like the flag.
    let out = cli.run(&["ls"], b"");
    check(
        out,
        "ls",
        0,
        &format!("{all}/other/x start=0 next=0 closed=false\n"),
        "",
    );
    let mut command = cli.command(&["ls"]);
    command.env("PICO_PREFIX", "/other");
    check(
        run_with(command, b""),
        "PICO_PREFIX",
        0,
        "/other/x start=0 next=0 closed=false\n",
        "",
    );
    // A single node's streams have no owner node to name.
    cli.expect(
        &["ls", "--prefix", "/other", "--owners"],
        b"",
        0,
        "/other/x start=0 next=0 closed=false owner=-\n",
        "",
    );
    cli.expect(&["ls", "--prefix", "/none/"], b"", 0, "", "");
    cli.expect(
        &["ls", "--protocol", "ds"],
        b"",
        1,
        "",
        "pico: the Durable Streams protocol has no stream listing; use --protocol pico\n",
    );
    let out = cli.run(&["ls", "--limit", "many"], b"");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// Every command fails the same way (README.md, "Use it"): exit 1, nothing on stdout and
/// one line on stderr, `pico: <code> (<status>): <message>` for what the server refused,
/// whether the command learnt it from an error body (`read`), a bodiless `HEAD` (`head`) or the
/// admin listener (`admin stream`).
#[test]
fn every_command_reports_errors_in_one_form() {
    let server = Server::start(FLAGS);
    let cli = Cli::new(&server);
    let missing = "pico: not_found (404): no such stream\n";
    for (args, stdin) in [
        (&["head", "/nope"][..], &b""[..]),
        (&["read", "/nope"], b""),
        (&["tail", "/nope"], b""),
        (&["append", "/nope"], b"x\n"),
        (&["trim", "/nope", "--seq", "1"], b""),
        (&["close", "/nope"], b""),
    ] {
        cli.expect(args, stdin, 1, "", missing);
    }

    cli.expect(
        &["create", "/typed", "--content-type", "text/plain"],
        b"",
        0,
        "",
        "created=true\n",
    );
    cli.expect(
        &["append", "/typed", "--batch", "3"],
        b"a\nb\nc\n",
        0,
        "",
        "start=0 next=3\n",
    );
    cli.expect(
        &["trim", "/typed", "--seq", "2"],
        b"",
        0,
        "",
        "trimmed start=2\n",
    );
    let admin = format!("http://{}", server.admin);
    let refused = [
        (
            cli.run(
                &["create", "/typed", "--content-type", "application/json"],
                b"",
            ),
            "pico: conflict (409): ",
        ),
        (
            cli.run(&["read", "/typed", "--from", "0"], b""),
            "pico: offset_gone (410): ",
        ),
        (
            run_with(
                pico(
                    &cli.config,
                    &["admin", "--admin-endpoint", &admin, "stream", "/nope"],
                ),
                b"",
            ),
            "pico: not_found (404): stream /nope not found\n",
        ),
    ];
    for (out, prefix) in refused {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(out.stdout.is_empty(), "{out:?}");
        assert!(
            stderr.starts_with(prefix),
            "want {prefix:?}, got {stderr:?}"
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr:?}");
    }

    // No server at all: still `pico: <message>`, exit 1.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let out = run_with(
        pico(&cli.config, &["--endpoint", &endpoint, "head", "/s"]),
        b"",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("pico: "), "{stderr:?}");
    assert_eq!(stderr.lines().count(), 1, "{stderr:?}");
}

#[test]
fn trim_moves_the_start() {
    let server = Server::start(FLAGS);
    let cli = Cli::new(&server);
    cli.expect(&["create", "/t"], b"", 0, "", "created=true\n");
    let input: String = (0..10).map(|i| format!("r{i}\n")).collect();
    cli.expect(
        &["append", "/t", "--batch", "10"],
        input.as_bytes(),
        0,
        "",
        "start=0 next=10\n",
    );
    cli.expect(
        &["trim", "/t", "--seq", "4"],
        b"",
        0,
        "",
        "trimmed start=4\n",
    );
    cli.expect(
        &["head", "/t"],
        b"",
        0,
        "start=4 next=10 closed=false type=application/octet-stream\n",
        "",
    );
    let expected: String = (4..10).map(|i| format!("{i}\tr{i}\n")).collect();
    cli.expect(&["read", "/t", "--from", "4"], b"", 0, &expected, "");
    // Below the start: 410 offset_gone.
    let out = cli.run(&["read", "/t", "--from", "1"], b"");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("pico: offset_gone (410)"), "{stderr}");
    // Past the tail: clamped. Below the start: unchanged.
    cli.expect(
        &["trim", "/t", "--seq", "99"],
        b"",
        0,
        "",
        "trimmed start=10\n",
    );
    cli.expect(
        &["trim", "/t", "--seq", "2"],
        b"",
        0,
        "",
        "trimmed start=10\n",
    );
    cli.expect(
        &["ls", "--prefix", "/t"],
        b"",
        0,
        "/t start=10 next=10 closed=false\n",
        "",
    );
    let out = cli.run(&["trim", "/missing", "--seq", "1"], b"");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).starts_with("pico: not_found (404)"),
        "{out:?}"
    );
    cli.expect(
        &["trim", "/t", "--seq", "1", "--protocol", "ds"],
        b"",
        1,
        "",
        "pico: trim is a Pico protocol operation; use --protocol pico\n",
    );
    let out = cli.run(&["trim", "/t"], b"");
    assert_eq!(out.status.code(), Some(2), "--seq is required: {out:?}");
}

/// `config` commands in a temporary directory; no server involved.
struct Config {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Config {
    fn new() -> Config {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("conf/pico.toml");
        Config { _dir: dir, path }
    }

    #[track_caller]
    fn expect(&self, args: &[&str], code: i32, stdout: &str, stderr: &str) {
        check(
            run_with(pico(&self.path, args), b""),
            &format!("pico {args:?}"),
            code,
            stdout,
            stderr,
        );
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.path).unwrap()
    }
}

#[test]
fn config_commands_round_trip_the_file() {
    let c = Config::new();
    let path = c.path.display().to_string();
    c.expect(&["config", "path"], 0, &format!("{path}\n"), "");
    c.expect(
        &["config", "ls"],
        0,
        "",
        &format!("no profiles in {path}; save one with pico --endpoint <url> config set <name>\n"),
    );
    c.expect(
        &["config", "set", "prod"],
        2,
        "",
        "pico: nothing to save; pass --endpoint, --protocol, --http2, --no-http2, --token or --ca-cert\n",
    );
    assert!(!c.path.exists(), "nothing saved");

    c.expect(
        &[
            "--endpoint",
            "http://node2.internal:4437",
            "config",
            "set",
            "prod",
        ],
        0,
        "",
        "saved profile prod; use it with --profile prod, or make it the default with pico config use prod\n",
    );
    // Saving a profile never makes it the default by itself: `--default` does.
    assert_eq!(
        c.text(),
        "[profiles.prod]\nendpoint = \"http://node2.internal:4437\"\n"
    );
    c.expect(
        &["config", "set", "prod", "--default"],
        0,
        "",
        "saved profile prod (default)\n",
    );
    assert_eq!(
        c.text(),
        "default_profile = \"prod\"\n\n[profiles.prod]\nendpoint = \"http://node2.internal:4437\"\n"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&c.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the file is private");
    }
    // Global flags may follow the subcommand; only the given ones are saved, merged.
    c.expect(
        &["config", "set", "prod", "--protocol", "ds", "--http2"],
        0,
        "",
        "saved profile prod (default)\n",
    );
    c.expect(
        &["config", "set", "local", "--protocol", "pico", "--no-http2"],
        0,
        "",
        "saved profile local; use it with --profile local, or make it the default with pico config use local\n",
    );
    assert_eq!(
        c.text(),
        "default_profile = \"prod\"\n\n\
         [profiles.local]\nprotocol = \"pico\"\nhttp2 = false\n\n\
         [profiles.prod]\nendpoint = \"http://node2.internal:4437\"\nprotocol = \"ds\"\nhttp2 = true\n"
    );
    c.expect(
        &["config", "get"],
        0,
        "prod\thttp://node2.internal:4437 ds true\n",
        "",
    );
    c.expect(&["config", "get", "local"], 0, "local\t- pico false\n", "");
    c.expect(&["config", "ls"], 0, "local\nprod (default)\n", "");
    c.expect(
        &["config", "use", "local"],
        0,
        "",
        "default profile local\n",
    );
    c.expect(&["config", "ls"], 0, "local (default)\nprod\n", "");
    c.expect(&["config", "rm", "local"], 0, "", "removed profile local\n");
    c.expect(&["config", "ls"], 0, "prod\n", "");
    c.expect(
        &["config", "get"],
        1,
        "",
        "pico: no default profile; name one, or set one with pico config use <name>\n",
    );
    // A missing default is not an error for other commands: the built-in defaults apply.
    c.expect(&["config", "use", "prod"], 0, "", "default profile prod\n");

    let missing = format!("pico: profile \"nope\" not found in {path}\n");
    c.expect(&["config", "rm", "nope"], 1, "", &missing);
    c.expect(&["config", "use", "nope"], 1, "", &missing);
    c.expect(&["config", "get", "nope"], 1, "", &missing);
    c.expect(&["--profile", "nope", "head", "/s"], 1, "", &missing);

    // Bad input is refused without touching the file.
    let before = c.text();
    c.expect(
        &["--http2", "config", "set", "x", "--no-http2"],
        2,
        "",
        "pico: --http2 and --no-http2 contradict each other\n",
    );
    let out = run_with(
        pico(&c.path, &["--endpoint", "ftp://h", "config", "set", "x"]),
        b"",
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid endpoint"));
    assert_eq!(c.text(), before);

    // The environment counts like the flags.
    let mut command = pico(&c.path, &["config", "set", "envy"]);
    command.env("PICO_ENDPOINT", "http://env:1");
    check(
        run_with(command, b""),
        "env",
        0,
        "",
        "saved profile envy; use it with --profile envy, or make it the default with pico config use envy\n",
    );
    c.expect(
        &["config", "get", "envy"],
        0,
        "envy\thttp://env:1 - -\n",
        "",
    );

    // Names that are not bare TOML keys survive the round trip.
    c.expect(
        &[
            "--endpoint",
            "http://q:1",
            "config",
            "set",
            "odd name.\"q\"",
        ],
        0,
        "",
        "saved profile odd name.\"q\"; use it with --profile odd name.\"q\", or make it the default with pico config use odd name.\"q\"\n",
    );
    c.expect(
        &["config", "get", "odd name.\"q\""],
        0,
        "odd name.\"q\"\thttp://q:1 - -\n",
        "",
    );
}

#[test]
fn a_broken_config_file_is_reported() {
    let c = Config::new();
    std::fs::create_dir_all(c.path.parent().unwrap()).unwrap();
    std::fs::write(&c.path, "colour = \"red\"\n").unwrap();
    let path = c.path.display().to_string();
    let message = format!("pico: {path}: line 1: unknown or mistyped key \"colour\"\n");
    c.expect(&["config", "ls"], 1, "", &message);
    c.expect(&["head", "/s"], 1, "", &message);
    c.expect(
        &["--endpoint", "http://h:1", "config", "set", "a"],
        1,
        "",
        &message,
    );
    // `config path` still works, so the file can be found and fixed.
    c.expect(&["config", "path"], 0, &format!("{path}\n"), "");
}

#[test]
fn saved_profiles_drive_client_commands() {
    let server = Server::start(FLAGS);
    let c = Config::new();
    let endpoint = format!("http://{}", server.addr);
    c.expect(
        &["--endpoint", &endpoint, "config", "set", "srv", "--default"],
        0,
        "",
        "saved profile srv (default)\n",
    );
    c.expect(&["create", "/p"], 0, "", "created=true\n");
    c.expect(
        &["ls", "--prefix", "/p"],
        0,
        "/p start=0 next=0 closed=false\n",
        "",
    );
    // A profile selected by name; the flag still wins over it.
    c.expect(
        &["--endpoint", "http://127.0.0.1:1", "config", "set", "dead"],
        0,
        "",
        "saved profile dead; use it with --profile dead, or make it the default with pico config use dead\n",
    );
    let out = run_with(pico(&c.path, &["--profile", "dead", "head", "/p"]), b"");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    // The failure says what to check and which profile the endpoint came from.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("pico: cannot reach http://127.0.0.1:1: ")
            && stderr.contains("is `pico serve` running at http://127.0.0.1:1?")
            && stderr.ends_with("[endpoint from profile \"dead\"; another with --profile NAME or --endpoint URL, the list with pico config ls]\n"),
        "{stderr}"
    );
    c.expect(
        &["--profile", "dead", "--endpoint", &endpoint, "head", "/p"],
        0,
        "start=0 next=0 closed=false type=application/octet-stream\n",
        "",
    );
    // A ds profile makes ls refuse.
    c.expect(
        &["--protocol", "ds", "config", "set", "srv"],
        0,
        "",
        "saved profile srv (default)\n",
    );
    c.expect(
        &["ls"],
        1,
        "",
        "pico: the Durable Streams protocol has no stream listing; use --protocol pico\n",
    );
}

/// A one-shot HTTP server that records the request head and answers `response`.
fn capture_one(response: &'static str) -> (String, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut socket, _)) = listener.accept() else {
            return;
        };
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match socket.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => break,
            }
        }
        let _ = socket.write_all(response.as_bytes());
        let _ = tx.send(String::from_utf8_lossy(&head).into_owned());
    });
    (endpoint, rx)
}

#[test]
fn the_token_is_sent_as_a_bearer_and_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("none.toml");
    let found =
        "HTTP/1.1 200 OK\r\ncontent-length: 0\r\npico-start-seq: 0\r\npico-next-seq: 2\r\n\r\n";
    for via_env in [false, true] {
        let (endpoint, seen) = capture_one(found);
        let mut command = pico(&config, &["head", "/s", "--endpoint", &endpoint]);
        if via_env {
            command.env("PICO_TOKEN", "tok-123");
        } else {
            command.args(["--token", "tok-123"]);
        }
        check(
            run_with(command, b""),
            "head with a token",
            0,
            "start=0 next=2 closed=false type=-\n",
            "",
        );
        let head = seen.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(
            head.to_ascii_lowercase()
                .contains("\r\nauthorization: bearer tok-123\r\n"),
            "{head}"
        );
    }
    // An error answer: the message does not reveal the token.
    let (endpoint, _seen) = capture_one(
        "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: 24\r\n\r\n{\"error\":\"unauthorized\"}",
    );
    let out = run_with(
        pico(
            &config,
            &[
                "--token",
                "tok-123",
                "--endpoint",
                &endpoint,
                "append",
                "/s",
            ],
        ),
        b"x\n",
    );
    assert_eq!(out.status.code(), Some(1));
    let all = format!("{out:?}");
    assert!(!all.contains("tok-123"), "{all}");
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("pico: unauthorized (401)"));

    // Against the real server (no auth configured): the header is simply accepted.
    let server = Server::start(FLAGS);
    let cli = Cli::new(&server);
    cli.expect(
        &["create", "/tok", "--token", "abc"],
        b"",
        0,
        "",
        "created=true\n",
    );
}

#[test]
fn ca_cert_files_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("none.toml");
    let missing = dir.path().join("missing.pem");
    let out = run_with(
        pico(
            &config,
            &[
                "--ca-cert",
                missing.to_str().unwrap(),
                "--endpoint",
                "https://127.0.0.1:1",
                "head",
                "/s",
            ],
        ),
        b"",
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("pico: cannot read --ca-cert"),
        "{stderr}"
    );
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").unwrap();
    let out = run_with(
        pico(
            &config,
            &[
                "--ca-cert",
                garbage.to_str().unwrap(),
                "--endpoint",
                "https://127.0.0.1:1",
                "head",
                "/s",
            ],
        ),
        b"",
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("invalid CA certificate"), "{stderr}");
}

#[test]
fn no_progress_line_when_stderr_is_not_a_terminal() {
    let server = Server::start(FLAGS);
    let cli = Cli::new(&server);
    cli.expect(&["create", "/big"], b"", 0, "", "created=true\n");
    let input: String = (0..20_000).map(|i| format!("line-{i}\n")).collect();
    let out = cli.run(&["append", "/big", "--batch", "1000"], input.as_bytes());
    let expected: String = (0..20)
        .map(|i| format!("start={} next={}\n", i * 1000, (i + 1) * 1000))
        .collect();
    check(out, "append", 0, "", &expected);
    let out = cli.run(&["read", "/big"], b"");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stderr, b"", "no progress on a pipe");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 20_000);
}

/// The progress line on a real terminal: `script` gives `pico` a pseudo-terminal as stderr. The
/// line only appears once an operation has run for 500 ms, so it is required only of runs that
/// took clearly longer than that.
#[test]
fn progress_line_on_a_terminal() {
    if !pico_testkit::require_program(
        "progress_line_on_a_terminal",
        "script",
        "util-linux; it gives pico a terminal",
    ) {
        return;
    }
    let server = Server::start(FLAGS);
    let cli = Cli::new(&server);
    cli.expect(&["create", "/tty"], b"", 0, "", "created=true\n");
    let input: String = (0..600_000).map(|i| format!("{i:08}\n")).collect();
    let input_file = server.dir().join("input.txt");
    std::fs::write(&input_file, input).unwrap();
    let bin = env!("CARGO_BIN_EXE_pico");
    let endpoint = format!("http://{}", server.addr);
    let on_a_terminal = |shell: String| {
        let started = std::time::Instant::now();
        let mut command = Command::new("script");
        command.args(["-qec", &shell, "/dev/null"]);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("PICO_") {
                command.env_remove(key);
            }
        }
        let out = command
            .env("PICO_ENDPOINT", &endpoint)
            .env("PICO_CONFIG", &cli.config)
            .stdin(Stdio::null())
            .output()
            .expect("run script");
        (
            started.elapsed(),
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (took, code, tty) = on_a_terminal(format!(
        "{bin} append /tty --batch 5000 < {} > /dev/null",
        input_file.display()
    ));
    assert_eq!(code, Some(0), "{tty}");
    assert!(tty.contains("start=595000 next=600000"), "{tty}");
    if took > Duration::from_millis(1000) {
        assert!(tty.contains("\r\x1b[2Kappended "), "{took:?}: {tty:?}");
    }
    let (took, code, tty) = on_a_terminal(format!("{bin} read /tty > /dev/null"));
    assert_eq!(code, Some(0), "{tty}");
    if took > Duration::from_millis(1000) {
        assert!(tty.contains("\r\x1b[2Kread "), "{took:?}: {tty:?}");
        assert!(tty.contains(" records, "), "{tty:?}");
        assert!(
            tty.contains("\r\x1b[2Kread 600000 records, "),
            "the line is erased before the summary: {tty:?}"
        );
    } else {
        eprintln!("read took only {took:?}: the progress line was not required");
    }
    // However short the read, a terminal gets the summary: what was read and where to resume.
    let summary = tty.lines().last().unwrap_or_default().trim_end();
    assert!(
        summary.contains("read 600000 records, 4.6 MiB, ")
            && summary.ends_with("/s: next=600000 (resume with --from 600000)"),
        "{tty:?}"
    );
    let (_, code, tty) = on_a_terminal(format!("{bin} read /tty --from 599998"));
    assert_eq!(code, Some(0), "{tty}");
    assert!(tty.contains("599999\t00599999"), "{tty:?}");
    assert!(tty.contains("read 2 records, 16 B, "), "{tty:?}");
    assert!(
        tty.trim_end()
            .ends_with("next=600000 (resume with --from 600000)"),
        "{tty:?}"
    );
}

/// `pico --endpoint URL config set prod` leaves the default profile alone (were `prod` made
/// the default on the spot, every plain command would fail with a DNS error that never names
/// it), and a failure to reach the endpoint names the profile.
#[test]
fn a_saved_profile_is_the_default_only_when_asked_and_failures_name_it() {
    let c = Config::new();
    let host = "http://pico-no-such-host.invalid:4437";
    c.expect(
        &["--endpoint", host, "config", "set", "prod"],
        0,
        "",
        "saved profile prod; use it with --profile prod, or make it the default with pico config use prod\n",
    );
    c.expect(&["config", "ls"], 0, "prod\n", "");
    c.expect(&["config", "use", "prod"], 0, "", "default profile prod\n");
    let out = run_with(pico(&c.path, &["head", "/s"]), b"");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!("pico: cannot reach {host}: "))
            && stderr.contains("the host of http://pico-no-such-host.invalid:4437 does not resolve")
            && stderr.ends_with(
                "[endpoint from profile \"prod\", the default profile; another with --profile NAME or --endpoint URL, the list with pico config ls]\n"
            ),
        "{stderr}"
    );
}

/// Profiles keep `--token` and `--ca-cert` too (the CA file as an absolute path, so the profile
/// works from any directory), and `config get` never prints the token: a profile alone reaches
/// a TLS node that requires a token.
#[test]
fn profiles_keep_the_token_and_the_ca_certificate() {
    let certs = tempfile::tempdir().unwrap();
    let out = common::pico(certs.path(), &["cert", "--dir", "."]);
    assert!(out.status.success(), "{out:?}");
    let (server, _tokens) = common::start_with_tokens(
        "s3cret-token / read,append\n",
        &[
            "--cores",
            "1",
            "--tls-cert",
            &certs.path().join("cert.pem").display().to_string(),
            "--tls-key",
            &certs.path().join("key.pem").display().to_string(),
        ],
    );
    let c = Config::new();
    let endpoint = format!("https://{}", server.addr);
    let mut set = pico(
        &c.path,
        &[
            "--endpoint",
            &endpoint,
            "--token",
            "s3cret-token",
            "--ca-cert",
            "ca.pem",
            "config",
            "set",
            "secure",
            "--default",
        ],
    );
    set.current_dir(certs.path());
    check(
        run_with(set, b""),
        "set",
        0,
        "",
        "saved profile secure (default)\n",
    );
    let ca = certs.path().join("ca.pem").display().to_string();
    assert!(
        c.text().contains("token = \"s3cret-token\"")
            && c.text().contains(&format!("ca_cert = \"{ca}\"")),
        "{}",
        c.text()
    );
    c.expect(
        &["config", "get"],
        0,
        &format!("secure\t{endpoint} - - token=(saved) ca_cert={ca}\n"),
        "",
    );
    // From another directory, with nothing but the profile.
    c.expect(&["create", "/t"], 0, "", "created=true\n");
    c.expect(
        &["head", "/t"],
        0,
        "start=0 next=0 closed=false type=application/octet-stream\n",
        "",
    );
    // The flag still wins over the profile's token.
    let out = run_with(pico(&c.path, &["--token", "wrong", "create", "/u"]), b"");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unauthorized (401)"), "{stderr}");
}

/// `(records, requests, rest)` of `pico append`'s summary line
/// (`appended N records, SIZE in R requests, TIME...: start=S next=N`).
fn append_summary(stderr: &str) -> (u64, u64, String) {
    let line = stderr.strip_suffix('\n').unwrap_or(stderr);
    assert_eq!(line.lines().count(), 1, "one summary line: {stderr:?}");
    let words: Vec<&str> = line.split(' ').collect();
    assert_eq!(words[0], "appended", "{line}");
    let records = words[1].parse().expect("record count");
    let at = words
        .iter()
        .position(|w| *w == "in")
        .expect("in R requests");
    let requests = words[at + 1].parse().expect("request count");
    let positions = line.rsplit_once(": ").map_or("", |(_, p)| p).to_owned();
    (records, requests, positions)
}

/// `pico append` batches by default, by count, bytes and linger, and ends with one
/// summary line; `--no-batch` sends a request per record.
#[test]
fn append_batches_by_default_and_prints_one_summary_line() {
    let server = Server::start(FLAGS);
    let cli = Cli::new(&server);
    cli.expect(&["create", "/batched"], b"", 0, "", "created=true\n");
    let input: String = (0..2500).map(|i| format!("line-{i}\n")).collect();

    // Defaults: the whole input is there at once, so batches fill up long before the 5 ms
    // linger; however slow the machine, far fewer requests than records.
    let out = cli.run(&["append", "/batched"], input.as_bytes());
    let (code, stdout, stderr) = common::cli::outcome(&out);
    assert_eq!((code, stdout.as_str()), (Some(0), ""), "{stderr}");
    let (records, requests, positions) = append_summary(&stderr);
    assert_eq!(records, 2500);
    assert!((3..=250).contains(&requests), "{stderr}");
    assert_eq!(positions, "start=0 next=2500");
    assert!(stderr.contains(" records/s, "), "{stderr}");

    // By count, the linger out of the way: exactly 1000 + 1000 + 500.
    let out = cli.run(
        &["append", "/batched", "--linger-ms", "60000"],
        input.as_bytes(),
    );
    let (records, requests, positions) = append_summary(&String::from_utf8_lossy(&out.stderr));
    assert_eq!((records, requests), (2500, 3));
    assert_eq!(positions, "start=2500 next=5000");

    // By bytes: 100-byte lines are 108 bytes in a batch (5 bytes of its own): 9 fit in 1 KiB.
    let line = "x".repeat(100);
    let input: String = (0..100).map(|_| format!("{line}\n")).collect();
    let out = cli.run(
        &[
            "append",
            "/batched",
            "--batch-bytes",
            "1KiB",
            "--linger-ms",
            "60000",
        ],
        input.as_bytes(),
    );
    let (records, requests, _) = append_summary(&String::from_utf8_lossy(&out.stderr));
    assert_eq!((records, requests), (100, 12));

    let out = cli.run(&["append", "/batched", "--no-batch"], b"a\nb\nc\nd\ne\n");
    let (records, requests, positions) = append_summary(&String::from_utf8_lossy(&out.stderr));
    assert_eq!((records, requests), (5, 5));
    assert_eq!(positions, "start=5100 next=5105");

    // Every record once, in input order.
    let out = cli.run(&["read", "/batched"], b"");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5105);
    assert_eq!(lines[0], "0\tline-0");
    assert_eq!(lines[4999], "4999\tline-2499");
    assert_eq!(lines[5104], "5104\te");

    // Flags out of range, or mixed with PicoMQ 0.1's --batch: usage errors.
    for args in [
        &["append", "/batched", "--batch-records", "0"][..],
        &["append", "/batched", "--batch-records", "100001"],
        &["append", "/batched", "--batch-bytes", "9MiB"],
        &["append", "/batched", "--linger-ms", "60001"],
        &["append", "/batched", "--batch", "2", "--linger-ms", "1"],
        &["append", "/batched", "--no-batch", "--batch-records", "2"],
    ] {
        let out = cli.run(args, b"z\n");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
    cli.expect(
        &["head", "/batched"],
        b"",
        0,
        "start=0 next=5105 closed=false type=application/octet-stream\n",
        "",
    );
}

/// A line waits at most the linger for company: with the input still open, it is appended.
#[test]
fn append_sends_a_lingering_batch_while_the_input_stays_open() {
    let server = Server::start(FLAGS);
    let cli = Cli::new(&server);
    cli.expect(&["create", "/slow"], b"", 0, "", "created=true\n");
    let mut child = cli
        .command(&["append", "/slow", "--linger-ms", "20"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"first\n").unwrap();
    stdin.flush().unwrap();
    let appended = (0..200).any(|_| {
        let out = cli.run(&["head", "/slow"], b"");
        if String::from_utf8_lossy(&out.stdout).contains(" next=1 ") {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
        false
    });
    assert!(
        appended,
        "the first line was not sent while the input stayed open"
    );
    stdin.write_all(b"second\n").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let (records, requests, positions) = append_summary(&String::from_utf8_lossy(&out.stderr));
    assert_eq!((records, requests), (2, 2));
    assert_eq!(positions, "start=0 next=2");
}

/// `pico append STREAM` in requests of three lines: `first` (three lines) sent and
/// acknowledged, then `between`, then `second` and the end of the input; its output.
fn append_in_two_batches(
    cli: &Cli,
    stream: &str,
    first: &[u8],
    between: impl FnOnce(),
    second: &[u8],
) -> std::process::Output {
    let mut child = cli
        .command(&[
            "append",
            stream,
            "--batch-records",
            "3",
            "--linger-ms",
            "60000",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(first).unwrap();
    stdin.flush().unwrap();
    let appended = (0..200).any(|_| {
        let out = cli.run(&["head", stream], b"");
        if String::from_utf8_lossy(&out.stdout).contains(" next=3 ") {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
        false
    });
    assert!(appended, "the first batch of three was not sent");
    between();
    stdin.write_all(second).unwrap();
    drop(stdin);
    child.wait_with_output().unwrap()
}

/// A failure half-way says which input lines are appended and where to resume.
#[test]
fn a_failed_append_says_where_to_resume() {
    let server = Server::start(FLAGS);
    let cli = Cli::new(&server);
    cli.expect(&["create", "/cut"], b"", 0, "", "created=true\n");
    let out = append_in_two_batches(
        &cli,
        "/cut",
        b"1\n2\n3\n",
        || cli.expect(&["close", "/cut"], b"", 0, "", "closed next=3\n"),
        b"4\n5\n",
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    assert!(
        lines[0].starts_with("appended 3 records, 3 B in 1 request, ")
            && lines[0].ends_with(": start=0 next=3"),
        "{stderr}"
    );
    assert_eq!(
        lines[1],
        "input lines 1-3 are appended; lines 4-5, the failed request, were not appended; \
         nothing after line 5 was sent. Resume from line 4: tail -n +4 INPUT | pico append ..."
    );
    assert!(lines[2].starts_with("pico: closed (409): "), "{stderr}");
}

/// A record the server refuses by its place in the request (`record 1: ...`, a JSON stream's
/// record that is not JSON) is named by its input line.
#[test]
fn a_refused_record_is_named_by_its_input_line() {
    let server = Server::start(FLAGS);
    let cli = Cli::new(&server);
    cli.expect(
        &["create", "/json", "--content-type", "application/json"],
        b"",
        0,
        "",
        "created=true\n",
    );
    let out = append_in_two_batches(
        &cli,
        "/json",
        b"{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n",
        || {},
        b"{\"a\":4}\nnot json\n",
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "lines 4-5, the failed request, were not appended (the server refused input line 5);"
        ),
        "{stderr}"
    );
}
