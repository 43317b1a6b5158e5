//! The node's listening sockets: shared by its cores, never with another server. Each core
//! binds each listener's port with `SO_REUSEPORT`, and the kernel grants that sharing to any
//! socket of the same user that asks for it: a second `pico serve` with a data directory of its
//! own, or another server that sets the option, would bind the same port without an error and
//! take a part of its connections, so a client would find its streams on one process and not
//! on the other. A start therefore looks whether anything already listens on each address
//! (before the engine boots, and again in core 0 right before the bind), and refuses instead;
//! core 0 looks once more right after its bind, for a server that bound in between; and two of
//! the node's own listeners may not share a port.
//!
//! The kernel's answer to a plain `bind` (no `SO_REUSEADDR`, no `SO_REUSEPORT`) says whether
//! the port is free; when it is not, the socket table tells a listener (refused) from a
//! connection of an earlier run waiting in `TIME_WAIT`, which the node's own bind passes.
//! After the bind, the table's inode column tells the node's own socket from another's.
//!
//! ```text
//! /proc/net/tcp (tcp6 alike, the address as four words)
//!   sl  local_address rem_address   st ...
//!    0: 0100007F:1155 00000000:0000 0A ...
//!       │        │                  └ state, hex: 0A = LISTEN; the 10th column: the inode
//!       │        └ port, hex, host order (0x1155 = 4437)
//!       └ address, hex of the network-order bytes read as a native u32 (127.0.0.1)
//! ```

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, RawFd};

use glommio::net::TcpListener;

/// The kernel's socket tables of this network namespace.
const SOCKET_TABLES: [&str; 2] = ["/proc/net/tcp", "/proc/net/tcp6"];

/// `TCP_LISTEN` in the tables' state column.
const STATE_LISTEN: u8 = 0x0A;

/// The inode column: `sl local rem st tx:rx tr:when retrnsmt uid timeout inode`.
const INODE_FIELD: usize = 9;

/// A socket already listening where `addr` would listen (its port, and its address or a
/// wildcard either side), or `None` when the port is free or only connections hold it. Port 0
/// asks the kernel for a free port: `None`. An error other than "in use" is left to the bind
/// that follows, which reports it.
pub(super) fn listener_on(addr: SocketAddr) -> Option<SocketAddr> {
    if addr.port() == 0 {
        return None;
    }
    match plain_bind(addr) {
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => listening_beside(addr, None),
        _ => None,
    }
}

/// Another socket listening where the socket `own` (just bound to `addr`) listens.
fn listener_beside(addr: SocketAddr, own: RawFd) -> Option<SocketAddr> {
    use std::os::unix::fs::MetadataExt;
    // A descriptor's entry in /proc stats as its socket, whose inode the tables name.
    let own_inode = std::fs::metadata(format!("/proc/self/fd/{own}"))
        .ok()?
        .ino();
    listening_beside(addr, Some(own_inode))
}

/// The first listening socket of the kernel's tables that overlaps `addr`, other than the
/// socket of inode `except`.
fn listening_beside(addr: SocketAddr, except: Option<u64>) -> Option<SocketAddr> {
    SOCKET_TABLES
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .find_map(|table| listening_overlap(&table, addr, except))
}

/// A listener on `addr` that this node's other cores can join (`SO_REUSEPORT`), its accept
/// queue `backlog` connections long (the kernel caps it at `net.core.somaxconn`). With
/// `look_beside` (core 0, which binds first), also another socket found listening beside it: a
/// server that bound the port between [`listener_on`]'s look and this bind (of two such
/// starts, each finds the other).
pub(super) fn listen_shared(
    addr: SocketAddr,
    backlog: u32,
    look_beside: bool,
) -> io::Result<(TcpListener, Option<SocketAddr>)> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    socket.listen(i32::try_from(backlog).unwrap_or(i32::MAX))?;
    let beside = match socket.local_addr()?.as_socket() {
        Some(bound) if look_beside => listener_beside(bound, socket.as_raw_fd()),
        _ => None,
    };
    // SAFETY: the descriptor is a bound, listening TCP socket that `into_raw_fd` gave up; the
    // listener takes sole ownership of it (and closes it when dropped).
    let listener = unsafe { TcpListener::from_raw_fd(socket.into_raw_fd()) };
    Ok((listener, beside))
}

/// Binds a socket without sharing options (never listening, closed at once).
fn plain_bind(addr: SocketAddr) -> io::Result<()> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.bind(&addr.into())
}

/// The first listening socket of `table` (a `/proc/net/tcp*` text) that overlaps `addr`.
/// With `except` (after this node's bind, the inode of its own socket, passed over), only
/// sockets of `addr`'s family count: a wildcard of the other family the kernel let the bind
/// go beside may be IPv6-only, and take none of its connections.
fn listening_overlap(table: &str, addr: SocketAddr, except: Option<u64>) -> Option<SocketAddr> {
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let local = parse_local(fields.get(1)?)?;
        let state = u8::from_str_radix(fields.get(3)?, 16).ok()?;
        let inode = fields.get(INODE_FIELD).and_then(|f| f.parse::<u64>().ok());
        let counts = match except {
            None => true,
            Some(own) => {
                inode != Some(own)
                    && local.ip().to_canonical().is_ipv4() == addr.ip().to_canonical().is_ipv4()
            }
        };
        (state == STATE_LISTEN && counts && overlaps(addr, local)).then_some(local)
    })
}

/// A `local_address` field: `ADDRESS:PORT` in hex, the address as 1 or 4 native words.
fn parse_local(field: &str) -> Option<SocketAddr> {
    let (ip, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = ip.get(i * 8..i * 8 + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_exact_mut(4).enumerate() {
                chunk.copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Whether connections to one of these addresses could reach a listener on the other: the
/// same port, and the same address or a wildcard either side (`[::]` takes IPv4 too, as a
/// socket without `IPV6_V6ONLY` does).
pub(super) fn overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    if a.port() != b.port() {
        return false;
    }
    match (a.ip().to_canonical(), b.ip().to_canonical()) {
        (IpAddr::V4(_), IpAddr::V6(v6)) | (IpAddr::V6(v6), IpAddr::V4(_)) => v6.is_unspecified(),
        (a, b) => a == b || a.is_unspecified() || b.is_unspecified(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::time::{Duration, Instant};

    fn at(addr: &str) -> SocketAddr {
        addr.parse().unwrap()
    }

    #[test]
    fn the_socket_tables_addresses_are_read_as_the_kernel_writes_them() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when \
                     retrnsmt   uid  timeout inode\n   \
             0: 0100007F:1155 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0  0 4101 1\n   \
             1: 0100007F:1155 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0  0 4102 1\n   \
             2: 0100007F:1156 0100007F:9C40 06 00000000:00000000 03:00000F6E 00000000  0  0 0 3\n";
        let own = at("127.0.0.1:4437");
        assert_eq!(listening_overlap(table, own, None), Some(own));
        // Past the first socket (this node's own), the second is another's.
        assert_eq!(listening_overlap(table, own, Some(4101)), Some(own));
        assert_eq!(
            listening_overlap(&table.replace(" 4102 ", " 9 "), own, Some(9)),
            Some(own)
        );
        let alone = table.lines().take(2).collect::<Vec<_>>().join("\n");
        assert_eq!(listening_overlap(&alone, own, Some(4101)), None);
        // The socket on 4438 is in TIME_WAIT (06), not listening.
        assert_eq!(listening_overlap(table, at("127.0.0.1:4438"), None), None);
        assert_eq!(
            listening_overlap(table, at("0.0.0.0:4437"), None),
            Some(own)
        );
        assert_eq!(listening_overlap(table, at("10.0.0.1:4437"), None), None);
        let v6 = "  sl  local_address                         remote_address  st\n\
             0: 00000000000000000000000001000000:1155 00000000000000000000000000000000:0000 0A\n\
             1: 00000000000000000000000000000000:1157 00000000000000000000000000000000:0000 0A\n";
        assert_eq!(
            listening_overlap(v6, at("[::1]:4437"), None),
            Some(at("[::1]:4437"))
        );
        assert_eq!(listening_overlap(v6, at("127.0.0.1:4437"), None), None);
        assert_eq!(
            listening_overlap(v6, at("127.0.0.1:4439"), None),
            Some(at("[::]:4439"))
        );
        // After a bind the kernel allowed beside it, `[::]` is IPv6-only: not counted.
        assert_eq!(listening_overlap(v6, at("127.0.0.1:4439"), Some(1)), None);
        assert_eq!(
            listening_overlap("garbage\n0: zz:1 x 0A\n", at("[::1]:1"), None),
            None
        );
    }

    /// Two servers that both looked before either bound: each finds the other beside it.
    #[test]
    fn a_listener_that_joined_the_port_is_found_beside_the_own() {
        // Made as `listen_shared` makes them (a glommio listener needs an executor).
        use socket2::{Domain, Socket, Type};
        let socket = |addr: SocketAddr| {
            let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
            socket.set_reuse_port(true).unwrap();
            socket.bind(&addr.into()).unwrap();
            socket.listen(16).unwrap();
            socket
        };
        let own = socket(at("127.0.0.1:0"));
        let addr = own.local_addr().unwrap().as_socket().unwrap();
        assert_eq!(listener_beside(addr, own.as_raw_fd()), None, "alone");
        let other = socket(addr);
        assert_eq!(listener_beside(addr, own.as_raw_fd()), Some(addr));
        assert_eq!(listener_beside(addr, other.as_raw_fd()), Some(addr));
        drop(other);
        assert_eq!(listener_beside(addr, own.as_raw_fd()), None);
    }

    #[test]
    fn addresses_overlap_on_one_port_when_equal_or_either_is_a_wildcard() {
        assert!(overlaps(at("127.0.0.1:80"), at("127.0.0.1:80")));
        assert!(overlaps(at("0.0.0.0:80"), at("127.0.0.1:80")));
        assert!(overlaps(at("127.0.0.1:80"), at("[::]:80")));
        assert!(overlaps(at("[::ffff:127.0.0.1]:80"), at("127.0.0.1:80")));
        assert!(!overlaps(at("127.0.0.1:80"), at("127.0.0.1:81")));
        assert!(!overlaps(at("127.0.0.1:80"), at("127.0.0.2:80")));
        assert!(!overlaps(at("0.0.0.0:80"), at("[::1]:80")));
    }

    /// A listener that shares its port (`SO_REUSEPORT`, as a node's own listeners do) is
    /// found; once it is gone, the port is free.
    #[test]
    fn a_listener_sharing_its_port_is_found_and_a_closed_one_is_not() {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        socket.set_reuse_port(true).unwrap();
        socket.bind(&at("127.0.0.1:0").into()).unwrap();
        socket.listen(16).unwrap();
        let addr = socket.local_addr().unwrap().as_socket().unwrap();
        assert_eq!(listener_on(addr), Some(addr));
        assert_eq!(
            listener_on(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), addr.port())),
            Some(addr)
        );
        drop(socket);
        assert_eq!(listener_on(addr), None);
    }

    /// A port whose listener is gone but whose connections wait in `TIME_WAIT` (a node
    /// restarted right after it closed its clients' connections) is in use to a plain bind,
    /// and free to a node.
    #[test]
    fn connections_in_time_wait_do_not_hold_the_port() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        let (server, _) = listener.accept().unwrap();
        // The server's side closes first, so its socket, bound to the port, ends in TIME_WAIT.
        drop(server);
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        assert_eq!(
            client.read(&mut [0u8; 1]).unwrap(),
            0,
            "the server's side closed"
        );
        drop(client);
        drop(listener);
        let deadline = Instant::now() + Duration::from_secs(10);
        while plain_bind(addr).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            plain_bind(addr).map_err(|e| e.kind()),
            Err(io::ErrorKind::AddrInUse),
            "the server's side of the connection holds the port"
        );
        assert_eq!(listener_on(addr), None);
    }
}
