//! Is a port free for this broker? Every shard binds the same HTTP and QUIC addresses with
//! SO_REUSEPORT, and the kernel lets any process of the same user join such a group: a second
//! broker started on a running one's ports would not fail, it would share its connections and
//! datagrams at random (each broker then answers some of the other's clients). So before
//! binding, a probe socket *without* SO_REUSEPORT must be able to bind the port.
//!
//! A broker that was just killed holds its sockets a little longer (io_uring tears down after
//! the process is gone), and a supervisor restarts it at once: the probe retries for up to
//! [`PORT_RELEASE_WAIT_MS`] before it calls the port taken.
//!
//! The probe alone leaves a window: from its reservation until its shards listen (recovery of a
//! large log can take minutes), a starting broker holds its TCP ports with a bound socket that
//! does not listen yet, and a probe with SO_REUSEADDR binds beside such a socket without error
//! — a second broker started then would join the first one's SO_REUSEPORT group. So each
//! broker also holds a [`PortLock`] per address for as long as it runs: an abstract unix
//! socket named after the address, which only one process can bind, released by the kernel
//! when the process exits (kill -9 included).

use socket2::{Domain, Protocol, Socket, Type};
use std::net::SocketAddr;

/// How long a start waits for a port to be released, ms.
pub const PORT_RELEASE_WAIT_MS: u64 = 3_000;
const PROBE_STEP_MS: u64 = 20;
/// How many ports a start with port 0 tries before it gives up (see [`reserve`]).
pub const PORT_ZERO_ATTEMPTS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Udp,
}

/// `Ok` when nothing else holds `addr` (port 0 always is), else `AddrInUse` once
/// [`PORT_RELEASE_WAIT_MS`] has passed.
pub fn probe(addr: SocketAddr, transport: Transport) -> std::io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    let deadline =
        crate::runtime::monotonic_now() + std::time::Duration::from_millis(PORT_RELEASE_WAIT_MS);
    loop {
        match try_bind(addr, transport) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                if crate::runtime::monotonic_now() >= deadline {
                    return Err(std::io::Error::new(
                        e.kind(),
                        "the port is in use (another broker or program holds it)",
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(PROBE_STEP_MS));
            }
            other => return other,
        }
    }
}

/// An exclusive claim on one address for one transport, held while the broker runs.
#[derive(Debug)]
pub struct PortLock {
    _socket: std::os::unix::net::UnixDatagram,
}

/// Claims `addr` for `transport` in this network namespace: `AddrInUse` if another process
/// (another broker) holds it. Port 0 is never claimed (the kernel resolves it to a free port;
/// claim the resolved address instead).
pub fn lock(addr: SocketAddr, transport: Transport) -> std::io::Result<Option<PortLock>> {
    use std::os::linux::net::SocketAddrExt;
    if addr.port() == 0 {
        return Ok(None);
    }
    let kind = match transport {
        Transport::Tcp => "tcp",
        Transport::Udp => "udp",
    };
    let name = format!("sluice-port/{kind}/{addr}");
    let unix = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    match std::os::unix::net::UnixDatagram::bind_addr(&unix) {
        Ok(socket) => Ok(Some(PortLock { _socket: socket })),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(std::io::Error::new(
            e.kind(),
            "the port is in use (another Sluice broker is starting or running on it)",
        )),
        Err(e) => Err(e),
    }
}

/// Binds `addr` with `bind` (which sets SO_REUSEPORT) and claims the bound address: the
/// socket, the address it is bound to, and the claim (`None` only if `bind` resolved nothing).
///
/// A fixed port is claimed and probed first ([`lock`], [`probe`]). Port 0 is resolved by the
/// kernel, and for UDP the kernel counts every SO_REUSEPORT socket of the same user as
/// compatible: it hands out ports that another broker's shards already serve (one in 20 binds
/// did, among 3,000 such sockets). Joining that group would split the other broker's datagrams
/// with ours, so a port whose claim fails is dropped and another one asked for, up to
/// [`PORT_ZERO_ATTEMPTS`] times.
pub fn reserve<S>(
    addr: SocketAddr,
    transport: Transport,
    bind: impl Fn(SocketAddr) -> std::io::Result<(S, SocketAddr)>,
) -> std::io::Result<(S, SocketAddr, Option<PortLock>)> {
    if addr.port() != 0 {
        let claimed = lock(addr, transport)?;
        probe(addr, transport)?;
        let (socket, bound) = bind(addr)?;
        return Ok((socket, bound, claimed));
    }
    for _ in 0..PORT_ZERO_ATTEMPTS {
        let (socket, bound) = bind(addr)?;
        match lock(bound, transport) {
            Ok(claimed) => return Ok((socket, bound, claimed)),
            // Another broker's port: this socket is dropped, out of its group at once.
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!(
            "port 0: each of {PORT_ZERO_ATTEMPTS} ports the system handed out is another broker's"
        ),
    ))
}

fn try_bind(addr: SocketAddr, transport: Transport) -> std::io::Result<()> {
    let socket = match transport {
        Transport::Tcp => {
            let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
            // Connections of an earlier run in TIME_WAIT do not count; a listener does.
            s.set_reuse_address(true)?;
            s
        }
        // No option at all: any socket bound there makes this fail.
        Transport::Udp => Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?,
    };
    socket.bind(&addr.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_port_is_refused_after_the_wait_and_a_released_one_passes() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = held.local_addr().expect("addr");
        let started = crate::runtime::monotonic_now();
        let e = probe(addr, Transport::Tcp).expect_err("held");
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
        assert!(started.elapsed().as_millis() as u64 >= PORT_RELEASE_WAIT_MS);
        // Released while the probe waits: it passes.
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let uaddr = udp.local_addr().expect("addr");
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(udp);
        });
        probe(uaddr, Transport::Udp).expect("released in time");
        release.join().expect("thread");
        probe("127.0.0.1:0".parse().expect("addr"), Transport::Udp).expect("port 0");
    }

    /// Many brokers' QUIC reservations with port 0 in one process (as the e2e tests start
    /// them): every one gets a port of its own. Without the retry in [`reserve`] the kernel
    /// hands some of them a port already held, and those starts fail.
    #[test]
    fn port_zero_reservations_never_share_a_port() {
        let udp = |addr: SocketAddr| {
            let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
            s.set_reuse_port(true)?;
            s.bind(&addr.into())?;
            let bound = s.local_addr()?.as_socket().expect("an IP address");
            Ok((s, bound))
        };
        let mut held = Vec::new();
        let mut ports = std::collections::HashSet::new();
        for i in 0..1_000 {
            let (socket, bound, claimed) =
                reserve("127.0.0.1:0".parse().expect("addr"), Transport::Udp, udp)
                    .unwrap_or_else(|e| panic!("reservation {i}: {e}"));
            assert!(claimed.is_some(), "port 0 resolves to a claimed port");
            assert!(
                ports.insert(bound.port()),
                "port {} handed out twice",
                bound.port()
            );
            held.push((socket, claimed));
        }
    }

    #[test]
    fn a_port_lock_is_exclusive_per_address_and_transport_until_dropped() {
        // A port no other test uses at the same time: one the kernel just handed out, held.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let a = listener.local_addr().expect("addr");
        let held = lock(a, Transport::Tcp).expect("free").expect("a lock");
        let e = lock(a, Transport::Tcp).expect_err("held");
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
        // Another transport or address is another claim.
        let _udp = lock(a, Transport::Udp).expect("udp is separate");
        let _other = lock(
            SocketAddr::new([127, 0, 0, 2].into(), a.port()),
            Transport::Tcp,
        )
        .expect("another address");
        drop(held);
        lock(a, Transport::Tcp).expect("released").expect("a lock");
        assert!(lock("127.0.0.1:0".parse().expect("addr"), Transport::Tcp)
            .expect("port 0")
            .is_none());
    }
}
