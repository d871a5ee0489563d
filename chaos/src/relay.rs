//! A user-space UDP relay (issue 43): it sits between a node and another node's peer port and
//! delays, duplicates, reorders and drops datagrams, because the kernel here has no netem. QUIC
//! runs over UDP, so Sluice's peer transport goes through it unchanged: node A dials the relay's
//! address instead of B's, and the relay forwards to B and B's answers back to A.
//!
//! Each client address the relay hears from gets its own upstream socket (so the target sees one
//! peer per client, as it would without the relay). Every datagram, either way, draws its fate
//! from one seeded generator ([`RelayFaults`]): lost, or sent after `delay + jitter` (plus
//! `reorder_extra` for the ones picked to be overtaken), maybe twice. Queues are bounded
//! ([`RelayFaults::queue_packets_max`]); a datagram that finds the queue full is dropped and
//! counted, as a router's would be. The seed fixes the sequence of fates; which datagram meets
//! which fate also depends on arrival order across the two directions, which no seed replays.

use std::collections::{BinaryHeap, HashMap};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The largest UDP payload (what a receive buffer must hold).
const DATAGRAM_SIZE_BYTES_MAX: usize = 65_536;
/// How often the receiving threads look at the stop flag.
const RECV_POLL_MS: u64 = 20;
/// Clients (distinct source addresses) one relay serves; each costs a socket and a thread.
pub const CLIENTS_MAX: usize = 64;
/// Probabilities are given in per mille.
pub const PER_MILLE: u32 = 1000;

/// What happens to each datagram. [`RelayFaults::none`] forwards everything at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayFaults {
    /// Every datagram waits this long…
    pub delay_ms: u64,
    /// …plus a uniform draw in `[0, jitter_ms]` (jitter alone already reorders).
    pub jitter_ms: u64,
    /// Per mille of datagrams dropped.
    pub loss_per_mille: u32,
    /// Per mille of datagrams sent twice (the copy with its own delay draw).
    pub duplicate_per_mille: u32,
    /// Per mille of datagrams held back `reorder_extra_ms` more, so later ones overtake them.
    pub reorder_per_mille: u32,
    pub reorder_extra_ms: u64,
    /// Datagrams waiting to be sent, both directions together; beyond it they are dropped.
    pub queue_packets_max: usize,
}

impl RelayFaults {
    /// The default queue bound: at the ~1 ms delays used, far more than a peer link keeps in
    /// flight, yet a stalled target cannot make the relay grow without end.
    pub const QUEUE_PACKETS_MAX_DEFAULT: usize = 4_096;

    pub fn none() -> RelayFaults {
        RelayFaults {
            delay_ms: 0,
            jitter_ms: 0,
            loss_per_mille: 0,
            duplicate_per_mille: 0,
            reorder_per_mille: 0,
            reorder_extra_ms: 0,
            queue_packets_max: Self::QUEUE_PACKETS_MAX_DEFAULT,
        }
    }

    fn validate(&self) -> Result<(), RelayError> {
        for (name, p) in [
            ("loss", self.loss_per_mille),
            ("duplicate", self.duplicate_per_mille),
            ("reorder", self.reorder_per_mille),
        ] {
            if p > PER_MILLE {
                return Err(RelayError::Invalid(format!(
                    "{name} {p} per mille (at most {PER_MILLE})"
                )));
            }
        }
        if self.queue_packets_max == 0 {
            return Err(RelayError::Invalid("queue_packets_max 0".into()));
        }
        Ok(())
    }
}

impl Default for RelayFaults {
    fn default() -> Self {
        RelayFaults::none()
    }
}

/// What the relay did, both directions together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Datagrams received (from clients and from the target).
    pub received: u64,
    /// Datagrams sent on (copies included).
    pub forwarded: u64,
    pub lost: u64,
    pub duplicated: u64,
    /// Datagrams held back to be overtaken.
    pub reordered: u64,
    /// Datagrams dropped because the queue was full.
    pub queue_full: u64,
    /// Datagrams from a new client once [`CLIENTS_MAX`] were served.
    pub clients_refused: u64,
    /// Sends that failed (e.g. the target's port closed: ICMP unreachable).
    pub send_errors: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid relay faults: {0}")]
    Invalid(String),
}

#[derive(Default)]
struct Counters {
    received: AtomicU64,
    forwarded: AtomicU64,
    lost: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
    queue_full: AtomicU64,
    clients_refused: AtomicU64,
    send_errors: AtomicU64,
}

/// A datagram waiting for its time.
struct Pending {
    due: Instant,
    /// Arrival order, so equal due times keep it.
    seq: u64,
    socket: Arc<UdpSocket>,
    to: SocketAddr,
    data: Vec<u8>,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    // Reversed: BinaryHeap is a max-heap and the earliest due must come out first.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.due, other.seq).cmp(&(self.due, self.seq))
    }
}

struct Shared {
    faults: Mutex<(RelayFaults, SmallRng)>,
    queue: Mutex<(BinaryHeap<Pending>, u64)>,
    wake: Condvar,
    stop: AtomicBool,
    counters: Counters,
}

impl Shared {
    /// Draws the datagram's fate and queues it (or its copies) for the sender.
    fn admit(&self, socket: &Arc<UdpSocket>, to: SocketAddr, data: &[u8]) {
        self.counters.received.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let (dues, queue_max) = {
            let mut guard = self.faults.lock().unwrap_or_else(|e| e.into_inner());
            let (f, rng) = &mut *guard;
            let f = *f;
            if rng.gen_range(0..PER_MILLE) < f.loss_per_mille {
                self.counters.lost.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let copies = if rng.gen_range(0..PER_MILLE) < f.duplicate_per_mille {
                self.counters.duplicated.fetch_add(1, Ordering::Relaxed);
                2
            } else {
                1
            };
            let mut dues = Vec::with_capacity(copies);
            for _ in 0..copies {
                let mut ms = f.delay_ms + rng.gen_range(0..=f.jitter_ms);
                if rng.gen_range(0..PER_MILLE) < f.reorder_per_mille {
                    self.counters.reordered.fetch_add(1, Ordering::Relaxed);
                    ms += f.reorder_extra_ms;
                }
                dues.push(now + Duration::from_millis(ms));
            }
            (dues, f.queue_packets_max)
        };
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        for due in dues {
            if q.0.len() >= queue_max {
                self.counters.queue_full.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            q.1 += 1;
            let seq = q.1;
            q.0.push(Pending {
                due,
                seq,
                socket: socket.clone(),
                to,
                data: data.to_vec(),
            });
        }
        drop(q);
        self.wake.notify_one();
    }
}

/// A running relay; dropping it stops its threads.
pub struct Relay {
    local: SocketAddr,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Relay {
    /// Listens on `listen` (port 0 for any) and relays to `target`, with `faults` drawn from
    /// `seed`. Upstream sockets bind to `listen`'s IP, port 0: the relay must run where both its
    /// clients and the target are reachable (e.g. a hub namespace; see [`crate::net`]).
    pub fn start(
        listen: SocketAddr,
        target: SocketAddr,
        faults: RelayFaults,
        seed: u64,
    ) -> Result<Relay, RelayError> {
        faults.validate()?;
        let front = Arc::new(UdpSocket::bind(listen)?);
        front.set_read_timeout(Some(Duration::from_millis(RECV_POLL_MS)))?;
        let local = front.local_addr()?;
        let shared = Arc::new(Shared {
            faults: Mutex::new((faults, SmallRng::seed_from_u64(seed))),
            queue: Mutex::new((BinaryHeap::new(), 0)),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            counters: Counters::default(),
        });
        let mut threads = Vec::new();
        {
            let shared = shared.clone();
            threads.push(std::thread::spawn(move || send_loop(&shared)));
        }
        {
            let shared = shared.clone();
            let upstream_ip = SocketAddr::new(local.ip(), 0);
            threads.push(std::thread::spawn(move || {
                front_loop(&shared, &front, upstream_ip, target)
            }));
        }
        Ok(Relay {
            local,
            shared,
            threads,
        })
    }

    /// Where clients send to (in place of the target).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Changes the faults from the next datagram on (what is queued keeps its time). Healing is
    /// `set_faults(RelayFaults::none())`.
    pub fn set_faults(&self, faults: RelayFaults) -> Result<(), RelayError> {
        faults.validate()?;
        self.shared
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0 = faults;
        Ok(())
    }

    pub fn stats(&self) -> RelayStats {
        let c = &self.shared.counters;
        RelayStats {
            received: c.received.load(Ordering::Relaxed),
            forwarded: c.forwarded.load(Ordering::Relaxed),
            lost: c.lost.load(Ordering::Relaxed),
            duplicated: c.duplicated.load(Ordering::Relaxed),
            reordered: c.reordered.load(Ordering::Relaxed),
            queue_full: c.queue_full.load(Ordering::Relaxed),
            clients_refused: c.clients_refused.load(Ordering::Relaxed),
            send_errors: c.send_errors.load(Ordering::Relaxed),
        }
    }

    /// Datagrams waiting now.
    pub fn queued(&self) -> usize {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .len()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.wake.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Client → target: new clients get an upstream socket and a thread relaying the answers back.
fn front_loop(
    shared: &Arc<Shared>,
    front: &Arc<UdpSocket>,
    upstream_ip: SocketAddr,
    target: SocketAddr,
) {
    let mut upstreams: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
    let mut answer_threads = Vec::new();
    let mut buf = vec![0u8; DATAGRAM_SIZE_BYTES_MAX];
    while !shared.stop.load(Ordering::Relaxed) {
        let (n, client) = match front.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            // An ICMP error from an earlier send to a client (connection refused): not ours to
            // end on.
            Err(_) => continue,
        };
        let upstream = match upstreams.get(&client) {
            Some(u) => u.clone(),
            None => {
                if upstreams.len() >= CLIENTS_MAX {
                    shared
                        .counters
                        .clients_refused
                        .fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let Ok(socket) = UdpSocket::bind(upstream_ip) else {
                    shared.counters.send_errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                if socket
                    .set_read_timeout(Some(Duration::from_millis(RECV_POLL_MS)))
                    .is_err()
                {
                    continue;
                }
                let socket = Arc::new(socket);
                upstreams.insert(client, socket.clone());
                let (shared, up, front) = (shared.clone(), socket.clone(), front.clone());
                answer_threads.push(std::thread::spawn(move || {
                    answer_loop(&shared, &up, &front, client)
                }));
                socket
            }
        };
        shared.admit(&upstream, target, &buf[..n]);
    }
    for t in answer_threads {
        let _ = t.join();
    }
}

/// Target → client, for one client.
fn answer_loop(shared: &Shared, upstream: &UdpSocket, front: &Arc<UdpSocket>, client: SocketAddr) {
    let mut buf = vec![0u8; DATAGRAM_SIZE_BYTES_MAX];
    while !shared.stop.load(Ordering::Relaxed) {
        match upstream.recv_from(&mut buf) {
            Ok((n, _)) => shared.admit(front, client, &buf[..n]),
            Err(_) => continue,
        }
    }
}

/// Sends each queued datagram when it is due.
fn send_loop(shared: &Shared) {
    let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let now = Instant::now();
        match q.0.peek() {
            Some(p) if p.due <= now => {
                let Some(p) = q.0.pop() else { continue };
                // Not holding the lock while sending: receivers keep admitting.
                drop(q);
                match p.socket.send_to(&p.data, p.to) {
                    Ok(_) => shared.counters.forwarded.fetch_add(1, Ordering::Relaxed),
                    Err(_) => shared.counters.send_errors.fetch_add(1, Ordering::Relaxed),
                };
                q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            }
            Some(p) => {
                let wait = p.due - now;
                q = shared
                    .wake
                    .wait_timeout(q, wait)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            None => {
                q = shared
                    .wake
                    .wait_timeout(q, Duration::from_millis(RECV_POLL_MS))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_out_of_range_are_refused() {
        let mut f = RelayFaults::none();
        f.loss_per_mille = PER_MILLE + 1;
        assert!(f.validate().is_err());
        let mut f = RelayFaults::none();
        f.queue_packets_max = 0;
        assert!(f.validate().is_err());
        assert!(RelayFaults::none().validate().is_ok());
    }

    #[test]
    fn the_earliest_due_leaves_first() {
        let s = Arc::new(UdpSocket::bind("127.0.0.1:0").expect("bind"));
        let to: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let t0 = Instant::now();
        let mut h = BinaryHeap::new();
        for (ms, seq) in [(5, 1), (1, 2), (1, 3), (3, 4)] {
            h.push(Pending {
                due: t0 + Duration::from_millis(ms),
                seq,
                socket: s.clone(),
                to,
                data: vec![],
            });
        }
        let order: Vec<u64> = std::iter::from_fn(|| h.pop().map(|p| p.seq)).collect();
        assert_eq!(order, vec![2, 3, 4, 1]);
    }
}
