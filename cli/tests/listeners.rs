//! One port, one server: a node's cores share each listener's port through `SO_REUSEPORT`,
//! which the kernel grants to any other socket of the same user that asks for it. A second
//! `pico serve` with a data directory of its own, a foreign server sharing the port, or two of
//! one node's listeners on one port are refused at start, never left to split the port's
//! connections (clients would find a stream on one process and not on the other). A restart
//! whose old connections wait in `TIME_WAIT` still takes its port. Every listener's accept
//! queue is `--backlog` long.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{cli, Conn, Server};

const REFUSAL_WAIT: Duration = Duration::from_secs(60);

/// A `pico serve` process, killed (SIGKILL) when dropped, so a failed assertion leaves none
/// running.
struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `pico serve` with its own catalog, WAL and bucket in `dir` and these listeners; stderr
/// to `dir/stderr`.
fn serve_in(dir: &Path, listen: &str, ds_listen: &str, admin_listen: &str, more: &[&str]) -> Node {
    let child = cli::pico_without_pico_env()
        .args(["serve", "--listen", listen, "--ds-listen", ds_listen])
        .args(["--admin-listen", admin_listen])
        .args(common::data_in(dir))
        .args(more)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr")).expect("create the stderr file"))
        .spawn()
        .expect("spawn pico serve");
    Node(child)
}

/// Runs a second server with these listeners, expecting it to refuse to start: whether it
/// exited with a failure within [`REFUSAL_WAIT`] (one still running is killed) and its stderr.
fn refused(listen: &str, ds_listen: &str, admin_listen: &str, more: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let mut node = serve_in(dir.path(), listen, ds_listen, admin_listen, more);
    let status = common::exit_within(&mut node.0, REFUSAL_WAIT);
    let stderr = std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default();
    (status.is_some_and(|s| !s.success()), stderr)
}

/// A loopback port no socket holds now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

fn get(addr: SocketAddr, path: &str) -> common::Resp {
    Conn::connect(addr)
        .and_then(|mut conn| conn.request("GET", path, &[], b""))
        .unwrap_or_else(|e| panic!("GET {path} from {addr}: {e}"))
}

#[test]
fn a_second_server_on_a_nodes_port_is_refused_and_the_node_keeps_every_connection() {
    let node = Server::start(&[]);
    let ds = node.second.expect("the Durable Streams listener");
    node.put("/shared/s", "text/plain").expect(201);
    node.post("/shared/s", b"kept").expect(200);
    for (what, listen, ds_listen, admin_listen) in [
        (
            "--listen",
            node.addr.to_string(),
            "off".to_string(),
            "127.0.0.1:0".to_string(),
        ),
        (
            "--ds-listen",
            "127.0.0.1:0".to_string(),
            ds.to_string(),
            "127.0.0.1:0".to_string(),
        ),
        (
            "--admin-listen",
            "127.0.0.1:0".to_string(),
            "off".to_string(),
            node.admin.to_string(),
        ),
    ] {
        let (was_refused, stderr) = refused(&listen, &ds_listen, &admin_listen, &[]);
        let taken = [&listen, &ds_listen, &admin_listen]
            .into_iter()
            .find(|addr| !addr.ends_with(":0") && *addr != "off")
            .unwrap();
        assert!(
            was_refused,
            "a second server with {what} on the node's port must not start: {stderr}"
        );
        assert!(
            stderr.contains(&format!(
                "cannot listen on {taken}: another socket already listens"
            )),
            "{what}: the refusal names the address: {stderr}"
        );
    }
    // Every new connection still reaches this node: with the port shared, some reached the
    // other process, which has no such stream.
    for _ in 0..64 {
        let read = get(node.addr, "/shared/s?seq=0&format=raw");
        assert_eq!(read.status, 200, "{}", read.describe());
        assert_eq!(read.body, b"kept");
        assert_eq!(get(ds, "/shared/s?offset=-1").status, 200);
        assert_eq!(get(node.admin, "/health").status, 200);
    }
}

#[test]
fn a_foreign_listener_on_the_port_is_refused_whether_or_not_it_shares() {
    use socket2::{Domain, Socket, Type};
    // A server that sets SO_REUSEPORT, as the node's own listeners do: the kernel lets a
    // node bind beside it.
    let sharing = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    sharing.set_reuse_port(true).unwrap();
    sharing
        .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    sharing.listen(16).unwrap();
    let sharing_addr = sharing
        .local_addr()
        .unwrap()
        .as_socket()
        .unwrap()
        .to_string();
    // One that does not (the kernel refuses the node's bind by itself).
    let plain = TcpListener::bind("127.0.0.1:0").unwrap();
    let plain_addr = plain.local_addr().unwrap().to_string();
    for addr in [&sharing_addr, &plain_addr] {
        let (was_refused, stderr) = refused(addr, "off", "127.0.0.1:0", &[]);
        assert!(was_refused, "a node on {addr} must not start: {stderr}");
        assert!(
            stderr.contains(&format!("another socket already listens on {addr}")),
            "{stderr}"
        );
    }
    // Every port free: the same node starts.
    let dir = tempfile::tempdir().unwrap();
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut node = serve_in(dir.path(), "127.0.0.1:0", "off", &admin.to_string(), &[]);
    let ready = wait_for_health(admin, &mut node.0);
    drop(node);
    assert!(
        ready,
        "{}",
        std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default()
    );
}

#[test]
fn two_listeners_of_one_node_on_one_port_are_refused() {
    let port = free_port();
    let on_port = format!("127.0.0.1:{port}");
    let (was_refused, stderr) = refused(&on_port, "off", &on_port, &[]);
    assert!(
        was_refused,
        "the admin port must not share the data port: {stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "--listen {on_port} and --admin-listen {on_port} are one port"
        )),
        "{stderr}"
    );
    // A wildcard overlaps every address of its port.
    let (was_refused, stderr) = refused(
        &format!("0.0.0.0:{port}"),
        &on_port,
        "127.0.0.1:0",
        &["--insecure-allow-remote"],
    );
    assert!(was_refused, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--listen 0.0.0.0:{port} and --ds-listen {on_port} are one port"
        )),
        "{stderr}"
    );
}

/// Waits (bounded) for `GET /health` on the admin listener `addr` to answer 200 while `child`
/// runs.
fn wait_for_health(addr: SocketAddr, child: &mut Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            return false;
        }
        let answered = Conn::connect(addr)
            .and_then(|mut conn| conn.request("GET", "/health", &[], b""))
            .map(|r| r.status == 200)
            .unwrap_or(false);
        if answered {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Connections of this machine on loopback `port` in `TIME_WAIT` (state 06 of
/// `/proc/net/tcp`).
fn time_wait_on(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"06")
        })
        .count()
}

#[test]
fn a_restart_right_after_a_stop_takes_its_port_while_old_connections_wait() {
    let dir = tempfile::tempdir().unwrap();
    let (port, admin_port) = (free_port(), free_port());
    let (listen, admin) = (
        format!("127.0.0.1:{port}"),
        format!("127.0.0.1:{admin_port}"),
    );
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let admin_addr = SocketAddr::from(([127, 0, 0, 1], admin_port));
    let mut first = serve_in(dir.path(), &listen, "off", &admin, &[]);
    assert!(wait_for_health(admin_addr, &mut first.0), "the first start");
    let mut conn = Conn::connect(addr).unwrap();
    assert_eq!(
        conn.request("PUT", "/restart/s", &[("content-type", "text/plain")], b"")
            .unwrap()
            .status,
        201
    );
    assert_eq!(
        conn.request("POST", "/restart/s", &[], b"kept")
            .unwrap()
            .status,
        200
    );
    let mut idle: Vec<Conn> = (0..16).map(|_| Conn::connect(addr).unwrap()).collect();
    for c in &mut idle {
        let read = c.request("GET", "/restart/s?seq=0&format=raw", &[], b"");
        assert_eq!(read.unwrap().status, 200);
    }
    // SIGTERM: the node closes its connections first, so their sockets on its port wait in
    // TIME_WAIT once the clients close theirs.
    // SAFETY: a plain kill(2) of the child's pid.
    assert_eq!(unsafe { libc::kill(first.0.id() as i32, libc::SIGTERM) }, 0);
    let stopped = common::exit_within(&mut first.0, Duration::from_secs(40));
    assert!(
        stopped.is_some_and(|s| s.success()),
        "a clean stop: {stopped:?}"
    );
    for c in idle.iter_mut().chain(std::iter::once(&mut conn)) {
        assert!(c.at_eof(), "the node closed the connection");
    }
    drop(idle);
    drop(conn);
    let deadline = Instant::now() + Duration::from_secs(10);
    while time_wait_on(port) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        time_wait_on(port) > 0,
        "the node's side of its connections waits in TIME_WAIT"
    );
    let mut second = serve_in(dir.path(), &listen, "off", &admin, &[]);
    let ready = wait_for_health(admin_addr, &mut second.0);
    let read = ready.then(|| get(addr, "/restart/s?seq=0&format=raw"));
    drop(second);
    assert!(
        ready,
        "the restart takes its port: {}",
        std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default()
    );
    assert_eq!(read.unwrap().body, b"kept");
}

/// The accept queue of each listening socket: `ss -ltn` shows it as the Send-Q of a listener.
fn accept_queues(port: u16) -> Option<Vec<u32>> {
    let out = std::process::Command::new("ss")
        .args(["-Hltn", &format!("sport = :{port}")])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    Some(
        text.lines()
            .filter_map(|line| line.split_whitespace().nth(2)?.parse().ok())
            .collect(),
    )
}

#[test]
fn every_listener_takes_the_backlog_it_is_given() {
    let server = Server::start(&["--cores", "2", "--backlog", "77"]);
    let Some(data) = accept_queues(server.addr.port()) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "`ss` (iproute2) is needed under CI"
        );
        eprintln!("skipped: no `ss` (iproute2) on this machine");
        return;
    };
    // One listening socket a core, each with the queue asked for (it was 1,024 whatever
    // --backlog said).
    assert_eq!(data, vec![77, 77], "the Pico listener's sockets");
    let ds = server.second.expect("the Durable Streams listener").port();
    assert_eq!(accept_queues(ds), Some(vec![77, 77]));
    assert_eq!(accept_queues(server.admin.port()), Some(vec![77]));
}
