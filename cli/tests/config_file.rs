//! `pico serve --config-file` (docs/configuration.md) with real `pico serve` processes: the
//! file's values take effect, flags beat `PICO_*` variables beat the file, every kind of bad
//! file stops the node before it starts with the file, line and key named, `--print-config`
//! tells where each value came from, and examples/pico.toml starts a node.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::cli::{outcome, pico_without_pico_env};
use common::{exit_within, Conn};

/// How long a node may take to print its `serving on` line, or a refused one to exit.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A port nothing listens on now (bound, then released), for a file that names its port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind a free port")
        .local_addr()
        .expect("its address")
        .port()
}

/// A temporary directory the node runs in (its default ./data and ./objects go there).
fn workdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("pico-config-")
        .tempdir()
        .expect("a temporary directory")
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write the config file");
    path
}

/// `pico serve` in `dir` with `args` and `env` (and no `PICO_*` of the test run).
fn serve(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = pico_without_pico_env();
    command
        .arg("serve")
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir)
        .stdin(Stdio::null());
    command
}

/// A running node, killed on drop.
struct Node {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Node {
    fn start(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Node {
        let log = dir.join("server.log");
        let mut child = serve(dir, args, env)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("server.log"))
            .spawn()
            .expect("spawn pico serve");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix("serving on http://") {
                        let addr = rest.split_whitespace().next().unwrap_or_default();
                        let addr = addr.parse().expect("the serving address");
                        return Node { child, addr, log };
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "pico serve did not start; log:\n{}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    );
                }
            }
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> common::Resp {
        Conn::connect(self.addr)
            .expect("connect to the node")
            .request(method, path, headers, b"")
            .unwrap_or_else(|e| panic!("{method} {path}: {e}\nlog:\n{}", self.log()))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `pico serve` to its exit (bounded).
fn run(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut child = serve(dir, args, env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pico serve");
    // Output a refused start or --print-config makes fits the pipes; read after the exit.
    let Some(_) = exit_within(&mut child, START_TIMEOUT) else {
        panic!("pico serve {args:?} did not exit within {START_TIMEOUT:?}");
    };
    child.wait_with_output().expect("its output")
}

/// The value line of `key` in `--print-config` output: `key = value  # source`.
fn printed<'o>(output: &'o str, key: &str) -> &'o str {
    output
        .lines()
        .find(|line| line.starts_with(&format!("{key} = ")))
        .unwrap_or_else(|| panic!("no {key} in\n{output}"))
}

/// Flags that keep a node's other listeners on free ports and its data in memory.
const QUIET: &[&str] = &[
    "--admin-listen",
    "127.0.0.1:0",
    "--ds-listen",
    "off",
    "--meta-url",
    "sqlite::memory:",
    "--durability",
    "memory",
    "--cores",
    "1",
];

#[test]
fn the_files_values_take_effect() {
    let dir = workdir();
    let port = free_port();
    let file = write(
        dir.path(),
        "pico.toml",
        &format!(
            "[listeners]\nlisten = \"127.0.0.1:{port}\"\nadmin-listen = \"127.0.0.1:0\"\n\
             ds-listen = \"off\"\n\n[storage]\nmeta-url = \"sqlite::memory:\"\n\n\
             [durability]\ndurability = \"memory\"\n\n[reads]\nlong-poll-timeout-sec = 1\n\n\
             [process]\ncores = 1\n"
        ),
    );
    let node = Node::start(dir.path(), &["--config-file", file.to_str().unwrap()], &[]);
    assert_eq!(node.addr.port(), port, "the file's listen");
    node.request("PUT", "/lp", &[("content-type", "text/plain")])
        .expect(201);
    // The default timeout (25 s) is past the test client's read timeout (15 s): a 204 proves
    // the file's 1 s, and it never comes before it.
    let started = Instant::now();
    let r = node.request("GET", "/lp?seq=0&live=long-poll", &[]);
    let waited = started.elapsed();
    r.expect(204);
    assert!(
        waited >= Duration::from_millis(900),
        "answered after {waited:?}"
    );
    let log = node.log();
    assert!(
        log.contains(&format!(
            "config file {}: 7 settings, 0 of them overridden",
            file.display()
        )),
        "the start-up log names the file:\n{log}"
    );
}

#[test]
fn flags_beat_variables_beat_the_file() {
    let dir = workdir();
    let [from_file, from_env, from_flag] = [free_port(), free_port(), free_port()];
    let file = write(
        dir.path(),
        "pico.toml",
        &format!("listen = \"127.0.0.1:{from_file}\"\nbacklog = 16\n"),
    );
    let file = file.to_str().unwrap();
    let env_listen = format!("127.0.0.1:{from_env}");
    let flag_listen = format!("127.0.0.1:{from_flag}");
    let mut args = vec!["--config-file", file];
    args.extend_from_slice(QUIET);

    let node = Node::start(dir.path(), &args, &[]);
    assert_eq!(node.addr.port(), from_file);
    drop(node);

    let env = [("PICO_LISTEN", env_listen.as_str())];
    let node = Node::start(dir.path(), &args, &env);
    assert_eq!(node.addr.port(), from_env, "PICO_LISTEN beats the file");
    assert!(
        node.log().contains("2 settings, 1 of them overridden"),
        "{}",
        node.log()
    );
    drop(node);

    let mut with_flag = args.clone();
    with_flag.extend_from_slice(&["--listen", &flag_listen]);
    let node = Node::start(dir.path(), &with_flag, &env);
    assert_eq!(node.addr.port(), from_flag, "--listen beats PICO_LISTEN");
    drop(node);

    // The file given by its variable; --print-config names each value's source, and starts
    // nothing (a directory of its own shows that).
    let empty = workdir();
    let out = run(
        empty.path(),
        &["--print-config", "--backlog", "32"],
        &[("PICO_CONFIG_FILE", file), ("PICO_LISTEN", &env_listen)],
    );
    let (code, stdout, stderr) = outcome(&out);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        printed(&stdout, "listen"),
        format!("listen = \"{env_listen}\"  # PICO_LISTEN")
    );
    assert_eq!(printed(&stdout, "backlog"), "backlog = 32  # --backlog");
    assert_eq!(
        printed(&stdout, "long-poll-timeout-sec"),
        "long-poll-timeout-sec = 25.0  # default"
    );
    let out = run(
        empty.path(),
        &["--print-config", "--config-file", file],
        &[],
    );
    let stdout = outcome(&out).1;
    assert_eq!(
        printed(&stdout, "backlog"),
        format!("backlog = 16  # {file}:2")
    );
    assert!(
        !empty.path().join("data").exists(),
        "--print-config started a node"
    );
}

#[test]
fn the_global_protocol_flag_is_a_key_too() {
    let dir = workdir();
    let file = write(dir.path(), "pico.toml", "[listeners]\nprotocol = \"ds\"\n");
    let file = file.to_str().unwrap();
    let out = run(dir.path(), &["--print-config", "--config-file", file], &[]);
    let (code, stdout, stderr) = outcome(&out);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        printed(&stdout, "protocol"),
        format!("protocol = \"ds\"  # {file}:2")
    );
    let out = run(
        dir.path(),
        &["--print-config", "--config-file", file],
        &[("PICO_PROTOCOL", "pico")],
    );
    assert_eq!(
        printed(&outcome(&out).1, "protocol"),
        "protocol = \"pico\"  # PICO_PROTOCOL"
    );
}

/// A bad file: exit 2, one message naming the file, the line and the key, and nothing started.
#[track_caller]
fn refused(text: &[u8], expected: &str) {
    let dir = workdir();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, text).expect("write the config file");
    refused_at(dir.path(), &path, expected);
}

#[track_caller]
fn refused_at(dir: &Path, path: &Path, expected: &str) {
    let out = run(dir, &["--config-file", path.to_str().unwrap()], &[]);
    let (code, stdout, stderr) = outcome(&out);
    let expected = expected.replace("FILE", &path.display().to_string());
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stderr, format!("pico: {expected}\n"));
    assert_eq!(stdout, "");
    assert!(
        !dir.join("data").exists(),
        "the node started: ./data exists"
    );
}

#[test]
fn every_kind_of_bad_file_is_refused_before_the_start() {
    refused(
        b"# a node\n\nlisen = \"127.0.0.1:1\"\n",
        "FILE:3: lisen: unknown key; did you mean listen?",
    );
    refused(
        b"[listeners]\nbacklog = \"1024\"\n",
        "FILE:2: listeners.backlog: expected an integer, got the string \"1024\"",
    );
    refused(
        b"no-admin = 1\n",
        "FILE:1: no-admin: expected true or false, got the integer 1",
    );
    refused(
        b"listen = \"127.0.0.1:1\"\nlisten = \"127.0.0.1:2\"\n",
        "FILE:2:1: duplicate key listen",
    );
    refused(
        b"listen = \"127.0.0.1:1\"\n[listeners]\nlisten = \"127.0.0.1:2\"\n",
        "FILE:3: listeners.listen: duplicate key: listen is already set on line 1",
    );
    refused(
        b"[storage]\nlisten = \"127.0.0.1:1\"\n",
        "FILE:2: storage.listen: listen belongs in [listeners] (or at the top level), not [storage]",
    );
    refused(
        b"listen = \"localhost\"\n",
        "FILE:1: listen: expected HOST:PORT, e.g. 127.0.0.1:4437 (got localhost)",
    );
    refused(
        b"[limits]\nproducers-max = -5\n",
        "FILE:2: producers-max: invalid digit found in string (got -5)",
    );
    refused(
        b"backlog = \n",
        "FILE:1:11: string values must be quoted, expected literal string",
    );
    refused(
        b"listen = \"127.0.0.1:1\"\n# caf\xe9\n",
        "FILE:2: the config file is not UTF-8 text",
    );
    refused(
        b"config-file = \"other.toml\"\n",
        "FILE:1: config-file: --config-file is given on the command line only",
    );
    // A value each parser accepts, refused by the check of the settings together.
    refused(
        b"\n[reads]\nsse-max-duration-sec = 0\n",
        "--sse-max-duration-sec must be greater than 0 (sse-max-duration-sec at FILE:3)",
    );
    // One byte over the limit, all of it comments.
    let mut big = b"listen = \"127.0.0.1:1\"\n".to_vec();
    while big.len() <= 1 << 20 {
        big.extend_from_slice(b"# padding padding padding padding padding padding padding\n");
    }
    big.truncate((1 << 20) + 1);
    refused(
        &big,
        "config file FILE is larger than 1048576 bytes (1 MiB), the most a config file may be",
    );
    let dir = workdir();
    refused_at(
        dir.path(),
        &dir.path().join("missing.toml"),
        "cannot read config file FILE: No such file or directory (os error 2)",
    );
    refused_at(
        dir.path(),
        dir.path(),
        "cannot read config file FILE: Is a directory (os error 21)",
    );
}

#[test]
fn a_file_at_the_size_limit_is_read() {
    let dir = workdir();
    // A key, then one comment line up to exactly 1 MiB.
    let mut text = b"backlog = 99\n#".to_vec();
    text.resize((1 << 20) - 1, b' ');
    text.push(b'\n');
    let path = write(dir.path(), "big.toml", std::str::from_utf8(&text).unwrap());
    let path = path.to_str().unwrap();
    let out = run(dir.path(), &["--print-config", "--config-file", path], &[]);
    let (code, stdout, stderr) = outcome(&out);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        printed(&stdout, "backlog"),
        format!("backlog = 99  # {path}:1")
    );
}

#[test]
fn the_printed_settings_are_a_config_file() {
    let dir = workdir();
    let out = run(
        dir.path(),
        &[
            "--print-config",
            "--listen",
            "127.0.0.1:7001",
            "--long-poll-timeout-sec",
            "0.5",
            "--max-body-size",
            "1MiB",
            "--default-retention-age",
            "7d",
            "--wal-cache-size",
            "5MiB",
            "--insecure-allow-remote",
        ],
        &[("PICO_NODE_ID", "3")],
    );
    let (code, first, stderr) = outcome(&out);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        printed(&first, "max-body-size"),
        "max-body-size = 1048576  # --max-body-size"
    );
    assert_eq!(printed(&first, "node-id"), "node-id = 3  # PICO_NODE_ID");
    assert_eq!(
        printed(&first, "wal-cache-size"),
        "wal-cache-size = 5242880  # --wal-cache-size"
    );
    let path = write(dir.path(), "printed.toml", &first);
    let path = path.to_str().unwrap();
    let out = run(dir.path(), &["--print-config", "--config-file", path], &[]);
    let (code, second, stderr) = outcome(&out);
    assert_eq!(code, Some(0), "{stderr}");
    // The same values; each now from the file, except what was the default.
    let values = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split("  # ").next().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(values(&first), values(&second));
    let from_file = format!("  # {path}:");
    for line in second
        .lines()
        .filter(|l| l.contains(" = ") && !l.starts_with('#'))
    {
        assert!(line.contains(&from_file), "{line}");
    }
}

#[test]
fn the_example_file_starts_a_node() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/pico.toml");
    let example = example.to_str().unwrap();
    let dir = workdir();
    let data = dir.path().display().to_string();
    // Its listeners and /var/lib/picomq paths give way to the test's; the rest is the file's.
    let storage = format!("-2@file://{data}/objects");
    let meta = format!("sqlite:{data}/meta.db");
    let wal = format!("{data}/wal");
    let args = [
        "--config-file",
        example,
        "--listen",
        "127.0.0.1:0",
        "--ds-listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--storage",
        &storage,
        "--meta-url",
        &meta,
        "--wal-dir",
        &wal,
        "--cores",
        "1",
    ];
    let out = run(dir.path(), &[&args[..], &["--print-config"]].concat(), &[]);
    let (code, stdout, stderr) = outcome(&out);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        printed(&stdout, "default-retention-age").starts_with("default-retention-age = 604800  # "),
        "{stdout}"
    );
    assert!(printed(&stdout, "shutdown-drain-sec").contains(example));

    let node = Node::start(dir.path(), &args, &[]);
    node.request("PUT", "/example", &[("content-type", "text/plain")])
        .expect(201);
    assert!(
        node.log().contains(&format!("config file {example}: ")),
        "{}",
        node.log()
    );
    assert!(Path::new(&wal).exists(), "the node's WAL directory");
}

/// `--print-config` runs the checks a start runs before it binds anything: settings that only
/// go together, or a certificate it cannot load, are refused as a start refuses them.
#[test]
fn print_config_refuses_what_a_start_refuses() {
    let dir = workdir();
    let file = write(dir.path(), "half.toml", "[tls]\ntls-cert = \"cert.pem\"\n");
    for args in [
        vec!["--print-config", "--tls-cert", "cert.pem"],
        vec!["--print-config", "--config-file", file.to_str().unwrap()],
        vec![
            "--print-config",
            "--tls-cert",
            "none.pem",
            "--tls-key",
            "none.pem",
        ],
    ] {
        let out = run(dir.path(), &args, &[]);
        let (code, stdout, stderr) = outcome(&out);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert_eq!(stdout, "", "{args:?}");
        assert!(stderr.contains("tls"), "{args:?}: {stderr}");
    }
}
