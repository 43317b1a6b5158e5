//! A network of a test's own, made of Linux network namespaces, in which links between nodes
//! and the services they use can be cut and healed: the partitions a single loopback cannot
//! show (a node that clients reach but Postgres does not, a cluster split in two, a flapping
//! link).
//!
//! ```text
//!                         hub namespace: bridge br0
//!          10.N.0.1 clients   10.N.0.2 service 0   10.N.0.3 service 1 ...
//!                |                    |                  |
//!   (the test's client threads     forwarders to the services' 127.0.0.1
//!    open their sockets here)      ports in the test's own namespace
//!                                  |
//!          +-------------veth------+-------veth----------+
//!   node 0 namespace: 10.N.0.11    node 1: 10.N.0.12       node 2: 10.N.0.13
//! ```
//!
//! Every node runs in its own namespace, with one veth into the hub's bridge. The services
//! (Postgres, Garage) keep running where the test started them; a forwarder gives each an
//! address in the hub. Clients are the test's threads: [`Network::connect`] opens a socket
//! from inside the hub.
//!
//! A cut between a node and an address of the hub is a pair of policy-routing rules in the
//! hub (`from node to address` and back, `blackhole`), so the node sees silence, as in a real
//! partition: its packets vanish and nothing answers, until [`Network::heal`]. A link taken
//! down ([`Network::set_link`]) cuts the node from everything at once.
//!
//! Needs root and `ip` (iproute2); [`Network::create`] returns `None` after a skip note (a
//! failure under `CI=true`) otherwise. Namespaces are named after the test process's pid, and
//! those of a test process that is gone are removed first, so a killed run leaves nothing
//! behind for long.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Where namespaces made by `ip netns add` are bound.
const NETNS_DIR: &str = "/var/run/netns";
/// Every namespace this module makes starts with it (then the pid, a counter and the role).
const NAME_PREFIX: &str = "pmq-";
/// The hub's addresses: clients at `.1`, services from `.2`, nodes from `.11`.
const CLIENT_HOST: u8 = 1;
const FIRST_SERVICE_HOST: u8 = 2;
const FIRST_NODE_HOST: u8 = 11;
/// At most this many nodes and services (the address plan above).
const NODES_MAX: usize = 200;
const SERVICES_MAX: usize = 9;
/// Rule priorities of the cuts: the local table's rule moves behind them.
const CUT_RULE_PREF_FIRST: u32 = 1000;
const LOCAL_RULE_PREF: u32 = 32765;

static NETWORKS: AtomicU32 = AtomicU32::new(0);

/// A network of namespaces; removed on drop.
pub struct Network {
    /// `pmq-<pid>-<n>`: every namespace's name starts with it.
    prefix: String,
    /// The second octet of every address (networks live apart; any value is fine).
    subnet: u8,
    nodes: usize,
    services: usize,
    /// The rules in place: (node, hub address, priority).
    cuts: std::sync::Mutex<Vec<(usize, Ipv4Addr, u32)>>,
    forwarders: Vec<Forwarder>,
}

impl Network {
    /// A hub and `nodes` node namespaces linked to it, or `None` after a skip note.
    pub fn create(test: &str, nodes: usize) -> Option<Network> {
        assert!(nodes <= NODES_MAX, "at most {NODES_MAX} nodes");
        // SAFETY: geteuid(2) only reads the process's credentials.
        if unsafe { libc::geteuid() } != 0 {
            crate::missing_service(test, "needs root to make network namespaces");
            return None;
        }
        if !crate::require_program(test, "ip", "Debian package iproute2") {
            return None;
        }
        remove_stale();
        let n = NETWORKS.fetch_add(1, Ordering::Relaxed);
        let network = Network {
            prefix: format!("{NAME_PREFIX}{}-{n}", std::process::id()),
            subnet: 64 + (n % 64) as u8,
            nodes,
            services: 0,
            cuts: std::sync::Mutex::new(Vec::new()),
            forwarders: Vec::new(),
        };
        network.build();
        Some(network)
    }

    fn build(&self) {
        let hub = self.hub();
        ip(&["netns", "add", &hub]);
        ip(&["-n", &hub, "link", "set", "lo", "up"]);
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &hub, "link", "set", "br0", "up"]);
        // The client address first: it is the bridge's primary address, the source of the
        // client threads' connections.
        let client = format!("{}/24", self.host(CLIENT_HOST));
        ip(&["-n", &hub, "addr", "add", &client, "dev", "br0"]);
        for i in 0..SERVICES_MAX as u8 {
            let service = format!("{}/24", self.host(FIRST_SERVICE_HOST + i));
            ip(&["-n", &hub, "addr", "add", &service, "dev", "br0"]);
        }
        // Incoming packets meet the cut rules before the local table would deliver them.
        let local_pref = LOCAL_RULE_PREF.to_string();
        ip(&[
            "-n",
            &hub,
            "rule",
            "add",
            "pref",
            &local_pref,
            "table",
            "local",
        ]);
        ip(&["-n", &hub, "rule", "del", "pref", "0"]);
        for node in 0..self.nodes {
            let ns = self.node_namespace(node);
            let port = self.hub_port(node);
            ip(&["netns", "add", &ns]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&[
                "-n", &hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ]);
            ip(&["-n", &hub, "link", "set", &port, "master", "br0", "up"]);
            let address = format!("{}/24", self.node_ip(node));
            ip(&["-n", &ns, "addr", "add", &address, "dev", "eth0"]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        }
    }

    fn host(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.subnet, 0, host)
    }

    fn hub(&self) -> String {
        format!("{}-hub", self.prefix)
    }

    fn hub_port(&self, node: usize) -> String {
        format!("n{node}")
    }

    /// The namespace node `node` runs in (see [`Network::enter`]).
    pub fn node_namespace(&self, node: usize) -> String {
        format!("{}-n{node}", self.prefix)
    }

    /// Node `node`'s address (its listeners bind it).
    pub fn node_ip(&self, node: usize) -> Ipv4Addr {
        assert!(node < self.nodes, "node {node} of {}", self.nodes);
        self.host(FIRST_NODE_HOST + node as u8)
    }

    /// The address the client threads' connections come from.
    pub fn client_ip(&self) -> Ipv4Addr {
        self.host(CLIENT_HOST)
    }

    /// Gives `upstream` (a service of the test's own namespace, e.g. `127.0.0.1:5432`) an
    /// address in the hub, which the nodes use instead; the address returned. Cut a node from
    /// it with [`Network::cut`].
    pub fn add_service(&mut self, upstream: SocketAddr) -> SocketAddr {
        assert!(
            self.services < SERVICES_MAX,
            "at most {SERVICES_MAX} services"
        );
        let ip = self.host(FIRST_SERVICE_HOST + self.services as u8);
        self.services += 1;
        let hub = self.hub();
        let listener = in_namespace(&hub, move || {
            TcpListener::bind(SocketAddr::new(IpAddr::V4(ip), upstream.port()))
        })
        .expect("bind a forwarder in the hub");
        let address = listener.local_addr().expect("forwarder address");
        self.forwarders.push(Forwarder::start(listener, upstream));
        address
    }

    /// A connection from the clients' address to `addr` (a node's listener).
    pub fn connect(&self, addr: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
        in_namespace(&self.hub(), move || {
            TcpStream::connect_timeout(&addr, timeout)
        })
    }

    /// Makes `command` run inside node `node`'s namespace.
    pub fn enter(&self, node: usize, command: &mut Command) {
        enter(&self.node_namespace(node), command);
    }

    /// Cuts node `node` off from `peer` (a service's or the clients' address): packets
    /// either way vanish.
    pub fn cut(&self, node: usize, peer: Ipv4Addr) {
        let mut cuts = self.cuts.lock().unwrap();
        if cuts.iter().any(|&(n, p, _)| n == node && p == peer) {
            return;
        }
        let pref = (CUT_RULE_PREF_FIRST..)
            .step_by(2)
            .find(|pref| cuts.iter().all(|&(_, _, p)| p != *pref))
            .expect("a free rule priority");
        let (hub, node_ip) = (self.hub(), self.node_ip(node).to_string());
        let peer_text = peer.to_string();
        for (pref, from, to) in [
            (pref, &node_ip, &peer_text),
            (pref + 1, &peer_text, &node_ip),
        ] {
            let pref = pref.to_string();
            ip(&[
                "-n",
                &hub,
                "rule",
                "add",
                "pref",
                &pref,
                "from",
                from,
                "to",
                to,
                "blackhole",
            ]);
        }
        cuts.push((node, peer, pref));
    }

    /// Heals the cut between `node` and `peer`, if there is one.
    pub fn heal(&self, node: usize, peer: Ipv4Addr) {
        let mut cuts = self.cuts.lock().unwrap();
        let hub = self.hub();
        cuts.retain(|&(n, p, pref)| {
            if (n, p) != (node, peer) {
                return true;
            }
            for pref in [pref, pref + 1] {
                ip(&["-n", &hub, "rule", "del", "pref", &pref.to_string()]);
            }
            false
        });
    }

    /// Heals every cut and brings every link up.
    pub fn heal_all(&self) {
        let cuts: Vec<(usize, Ipv4Addr)> = self
            .cuts
            .lock()
            .unwrap()
            .iter()
            .map(|&(n, p, _)| (n, p))
            .collect();
        for (node, peer) in cuts {
            self.heal(node, peer);
        }
        for node in 0..self.nodes {
            self.set_link(node, true);
        }
    }

    /// Takes node `node`'s only link down (it reaches nothing, nothing reaches it) or up.
    pub fn set_link(&self, node: usize, up: bool) {
        let port = self.hub_port(node);
        ip(&[
            "-n",
            &self.hub(),
            "link",
            "set",
            &port,
            if up { "up" } else { "down" },
        ]);
    }

    /// The cuts in place, as `node -> address` (for messages).
    pub fn describe_cuts(&self) -> Vec<String> {
        self.cuts
            .lock()
            .unwrap()
            .iter()
            .map(|(node, peer, _)| format!("node {node} -/- {peer}"))
            .collect()
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for forwarder in &self.forwarders {
            forwarder.stop();
        }
        for name in namespaces() {
            if name.starts_with(&format!("{}-", self.prefix)) {
                let _ = run_ip(&["netns", "del", &name]);
            }
        }
    }
}

/// Makes `command` run inside namespace `name` (made by `ip netns add`).
pub fn enter(name: &str, command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let path = format!("{NETNS_DIR}/{name}");
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    // SAFETY: between fork and exec the child only calls setns(2) on a descriptor it inherited
    // open (async-signal-safe, no allocation); the closure owns the File, so the descriptor
    // stays open until the command is dropped.
    unsafe {
        command.pre_exec(move || {
            use std::os::fd::AsRawFd;
            if libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Runs `f` on a thread inside namespace `name`: a socket it opens belongs to that namespace
/// for its whole life, whichever thread uses it later.
pub fn in_namespace<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let path = format!("{NETNS_DIR}/{name}");
    std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(&path)?;
        // SAFETY: setns(2) on an open namespace descriptor changes only this thread's network
        // namespace; the thread ends when `f` returns.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        f()
    })
    .join()
    .expect("a namespace thread")
}

/// Forwards every connection accepted in the hub to a service in the test's own namespace.
struct Forwarder {
    stopped: Arc<AtomicBool>,
    hub_listener: Arc<TcpListener>,
}

/// Bytes copied per read.
const FORWARD_BUFFER_BYTES: usize = 64 * 1024;

impl Forwarder {
    fn start(listener: TcpListener, upstream: SocketAddr) -> Forwarder {
        let stopped = Arc::new(AtomicBool::new(false));
        let listener = Arc::new(listener);
        let (accepting, stop) = (listener.clone(), stopped.clone());
        std::thread::spawn(move || {
            for client in accepting.incoming() {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else {
                    // Out of descriptors, say: try again soon, unless stopped.
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let Ok(server) = TcpStream::connect(upstream) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (Ok(client_reader), Ok(server_reader)) =
                    (client.try_clone(), server.try_clone())
                else {
                    continue;
                };
                std::thread::spawn(move || pipe(client_reader, server));
                std::thread::spawn(move || pipe(server_reader, client));
            }
        });
        Forwarder {
            stopped,
            hub_listener: listener,
        }
    }

    fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        // Shutting the listener down wakes its blocked accept, which then sees `stopped`.
        // SAFETY: shutdown(2) on a listening socket we own only wakes its blocked accept.
        unsafe {
            use std::os::fd::AsRawFd;
            libc::shutdown(self.hub_listener.as_raw_fd(), libc::SHUT_RDWR);
        }
    }
}

/// Copies `from` to `to` until either ends; then ends both directions.
fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; FORWARD_BUFFER_BYTES];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

fn namespaces() -> Vec<String> {
    std::fs::read_dir(NETNS_DIR)
        .map(|dir| {
            dir.filter_map(|entry| entry.ok()?.file_name().into_string().ok())
                .filter(|name| name.starts_with(NAME_PREFIX))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes the namespaces of test processes that are gone.
fn remove_stale() {
    for name in namespaces() {
        let pid = name[NAME_PREFIX.len()..]
            .split('-')
            .next()
            .unwrap_or_default();
        let alive = !pid.is_empty() && std::path::Path::new(&format!("/proc/{pid}")).exists();
        if !alive {
            let _ = run_ip(&["netns", "del", &name]);
        }
    }
}

fn run_ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) {
    if let Err(e) = run_ip(args) {
        panic!("{e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo_service() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming().take(64) {
                let Ok(mut stream) = stream else { continue };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = stream.read(&mut buf) {
                        if n == 0 || stream.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        address
    }

    /// From inside node `node`: does `service` echo within the timeout, in one of the tries of
    /// [`REACH_TRIES`]? A cut link fails every try; a working one can miss one try on a
    /// machine busy enough to stall a connect for 700 ms, never all of them.
    fn node_reaches(network: &Network, node: usize, service: SocketAddr) -> bool {
        (0..REACH_TRIES).any(|_| node_reaches_once(network, node, service))
    }

    const REACH_TRIES: usize = 4;

    fn node_reaches_once(network: &Network, node: usize, service: SocketAddr) -> bool {
        in_namespace(&network.node_namespace(node), move || {
            let mut stream = TcpStream::connect_timeout(&service, Duration::from_millis(700))?;
            stream.set_read_timeout(Some(Duration::from_millis(700)))?;
            stream.write_all(b"ping")?;
            let mut buf = [0u8; 4];
            stream.read_exact(&mut buf)?;
            Ok(&buf == b"ping")
        })
        .unwrap_or(false)
    }

    #[test]
    fn cuts_links_and_heals_them() {
        let Some(mut network) = Network::create("cuts_links_and_heals_them", 2) else {
            return;
        };
        let service = network.add_service(echo_service());
        let node_listener = in_namespace(&network.node_namespace(0), {
            let ip = network.node_ip(0);
            move || TcpListener::bind(SocketAddr::new(IpAddr::V4(ip), 0))
        })
        .unwrap();
        let node_address = node_listener.local_addr().unwrap();
        assert!(node_reaches(&network, 0, service));
        assert!(node_reaches(&network, 1, service));
        assert!(network
            .connect(node_address, Duration::from_secs(2))
            .is_ok());

        let service_ip = match service.ip() {
            IpAddr::V4(ip) => ip,
            IpAddr::V6(_) => unreachable!(),
        };
        network.cut(0, service_ip);
        assert!(!node_reaches(&network, 0, service), "node 0 is cut off");
        assert!(node_reaches(&network, 1, service), "node 1 is not");
        assert!(
            network
                .connect(node_address, Duration::from_secs(2))
                .is_ok(),
            "clients still reach node 0"
        );
        network.cut(0, network.client_ip());
        assert!(network
            .connect(node_address, Duration::from_millis(700))
            .is_err());
        network.heal_all();
        assert!(node_reaches(&network, 0, service), "healed");
        assert!(network
            .connect(node_address, Duration::from_secs(2))
            .is_ok());

        network.set_link(1, false);
        assert!(!node_reaches(&network, 1, service), "link down");
        network.set_link(1, true);
        assert!(node_reaches(&network, 1, service), "link up");

        let prefix = network.prefix.clone();
        drop(network);
        assert!(
            namespaces().iter().all(|name| !name.starts_with(&prefix)),
            "the namespaces are gone"
        );
    }
}
