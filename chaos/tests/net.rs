//! The harness's network and process faults (issue 43), against real sockets: namespaces built
//! and removed, one-way blocks and partitions that really stop datagrams, heal, nftables loss,
//! and the UDP relay's delay, duplication, reordering, loss and bounded queue — on loopback and
//! between namespaces. Tests needing root, `ip` and `nft` print why and skip when those are
//! missing (ci/install-deps.sh installs them). Random parts take `SLUICE_SEED` (printed).

use std::collections::BTreeSet;
use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use sluice_chaos::net::Net;
use sluice_chaos::process;
use sluice_chaos::relay::{Relay, RelayFaults};

/// How long a receive waits before a datagram counts as not delivered. Loopback and veth deliver
/// in microseconds; this leaves room for a machine busy building.
const DELIVERY_WAIT_MS: u64 = 300;
/// A datagram sent after `heal` may meet a neighbour entry being re-learnt: try this many times.
const REACH_ATTEMPTS: u32 = 10;

fn seed() -> u64 {
    let seed = std::env::var("SLUICE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos() as u64)
                .unwrap_or(0)
        });
    println!("SLUICE_SEED={seed}");
    seed
}

/// Skips (with the reason printed) where namespaces and nftables cannot run.
fn net_or_skip(nodes: usize) -> Option<Net> {
    if let Some(why) = Net::unavailable() {
        println!("SKIPPED: {why}");
        return None;
    }
    Some(Net::new(nodes).expect("build the test network"))
}

fn namespaces() -> String {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A socket bound in node `i`'s namespace on its own address, port 0.
fn socket_in(net: &Net, i: usize) -> UdpSocket {
    let addr = SocketAddr::new(net.node(i).addr.into(), 0);
    let s = net
        .node(i)
        .enter(move || UdpSocket::bind(addr))
        .expect("enter")
        .expect("bind");
    s.set_read_timeout(Some(Duration::from_millis(DELIVERY_WAIT_MS)))
        .expect("timeout");
    s
}

/// Whether one datagram from `from` reaches `to` (the receive queue drained first).
fn delivered(from: &UdpSocket, to: &UdpSocket) -> bool {
    let mut buf = [0u8; 64];
    to.set_nonblocking(true).expect("nonblocking");
    while to.recv_from(&mut buf).is_ok() {}
    to.set_nonblocking(false).expect("blocking");
    let _ = from.send_to(b"ping", to.local_addr().expect("addr"));
    to.recv_from(&mut buf).is_ok()
}

fn reaches(from: &UdpSocket, to: &UdpSocket) -> bool {
    (0..REACH_ATTEMPTS).any(|_| delivered(from, to))
}

#[test]
fn namespaces_are_built_joined_and_removed_even_on_a_panic() {
    let Some(net) = net_or_skip(3) else { return };
    let names: Vec<String> = net.nodes().iter().map(|n| n.ns.clone()).collect();
    let hub = net.hub_ns().to_string();
    let listed = namespaces();
    for n in names.iter().chain([&hub]) {
        assert!(listed.contains(n.as_str()), "{n} missing in:\n{listed}");
    }
    let s: Vec<UdpSocket> = (0..3).map(|i| socket_in(&net, i)).collect();
    for a in 0..3 {
        for b in 0..3 {
            if a != b {
                assert!(reaches(&s[a], &s[b]), "node {a} cannot reach node {b}");
            }
        }
    }
    // The addresses live only in the namespaces: the host's own namespace has none of them
    // (checked without sending anything there: the host may route that subnet elsewhere).
    let host_addrs = Command::new("ip")
        .args(["-4", "addr"])
        .output()
        .expect("ip addr");
    let host_addrs = String::from_utf8_lossy(&host_addrs.stdout).into_owned();
    for node in net.nodes() {
        assert!(
            !host_addrs.contains(&format!("inet {}/", node.addr)),
            "{} is on the host:\n{host_addrs}",
            node.addr
        );
    }
    drop(net);
    let listed = namespaces();
    for n in names.iter().chain([&hub]) {
        assert!(!listed.contains(n.as_str()), "{n} left behind:\n{listed}");
    }

    // A test that panics with its network up still removes it (Drop runs while unwinding).
    let built = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = built.clone();
    let r = std::panic::catch_unwind(move || {
        let net = Net::new(2).expect("net");
        let mut names: Vec<String> = net.nodes().iter().map(|n| n.ns.clone()).collect();
        names.push(net.hub_ns().to_string());
        *seen.lock().expect("lock") = names;
        panic!("a test failing with its network up");
    });
    assert!(r.is_err());
    let listed = namespaces();
    let names = built.lock().expect("lock").clone();
    assert_eq!(names.len(), 3);
    for n in &names {
        assert!(!listed.contains(n.as_str()), "{n} left behind by a panic");
    }
}

#[test]
fn a_one_way_block_is_asymmetric_a_partition_cuts_both_and_heal_restores() {
    let Some(mut net) = net_or_skip(3) else {
        return;
    };
    let s: Vec<UdpSocket> = (0..3).map(|i| socket_in(&net, i)).collect();
    assert!(reaches(&s[0], &s[1]) && reaches(&s[1], &s[0]));

    net.block(0, 1).expect("block");
    assert!(
        !delivered(&s[0], &s[1]),
        "0 -> 1 passed a block; rules:\n{}",
        net.rules(0).unwrap_or_default()
    );
    assert!(reaches(&s[1], &s[0]), "the block cut the other way too");
    assert!(reaches(&s[0], &s[2]), "the block cut 0 -> 2");

    net.heal().expect("heal");
    assert!(reaches(&s[0], &s[1]), "heal did not restore 0 -> 1");

    // Node 2 alone on one side: cut both ways, while 0 and 1 still talk.
    net.partition(&[2], &[0, 1]).expect("partition");
    for (a, b) in [(2, 0), (0, 2), (2, 1), (1, 2)] {
        assert!(!delivered(&s[a], &s[b]), "{a} -> {b} crossed the partition");
    }
    assert!(reaches(&s[0], &s[1]) && reaches(&s[1], &s[0]));
    net.heal().expect("heal");
    for (a, b) in [(2, 0), (0, 2), (2, 1), (1, 2)] {
        assert!(reaches(&s[a], &s[b]), "{a} -> {b} still cut after heal");
    }
}

#[test]
fn a_link_down_silences_a_node_until_it_comes_up() {
    let Some(mut net) = net_or_skip(2) else {
        return;
    };
    let s: Vec<UdpSocket> = (0..2).map(|i| socket_in(&net, i)).collect();
    assert!(reaches(&s[0], &s[1]));
    net.link_down(1).expect("down");
    assert!(
        !delivered(&s[0], &s[1]),
        "a node with its link down was reached"
    );
    assert!(
        !delivered(&s[1], &s[0]),
        "a node with its link down got through"
    );
    net.heal().expect("heal brings links up");
    assert!(reaches(&s[0], &s[1]) && reaches(&s[1], &s[0]));
}

#[test]
fn tcp_connects_fail_across_a_partition() {
    let Some(mut net) = net_or_skip(2) else {
        return;
    };
    let listen = SocketAddr::new(net.node(1).addr.into(), 0);
    let listener = net
        .node(1)
        .enter(move || std::net::TcpListener::bind(listen))
        .expect("enter")
        .expect("listen");
    let target = listener.local_addr().expect("addr");
    let connect = |net: &Net| {
        net.node(0)
            .enter(move || {
                std::net::TcpStream::connect_timeout(
                    &target,
                    Duration::from_millis(DELIVERY_WAIT_MS),
                )
                .is_ok()
            })
            .expect("enter")
    };
    assert!(connect(&net), "no connection without a fault");
    net.isolate(1).expect("isolate");
    assert!(!connect(&net), "connected to an isolated node");
    net.heal().expect("heal");
    assert!(connect(&net), "no connection after heal");
}

#[test]
fn nftables_loss_drops_about_the_share_asked() {
    let Some(mut net) = net_or_skip(2) else {
        return;
    };
    let s: Vec<UdpSocket> = (0..2).map(|i| socket_in(&net, i)).collect();
    assert!(reaches(&s[0], &s[1]));
    const SENT: u32 = 400;
    const BATCH: u32 = 40;
    net.loss(0, 1, 500).expect("loss");
    let to = s[1].local_addr().expect("addr");
    s[1].set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    let mut got = 0u32;
    let mut buf = [0u8; 16];
    // In batches, each drained before the next: a burst of 400 would overflow the receive
    // buffer and lose datagrams that nftables let through.
    for batch in 0..SENT / BATCH {
        for i in 0..BATCH {
            // A datagram nftables drops on output fails its send (EPERM): that is the loss.
            let _ = s[0].send_to(&(batch * BATCH + i).to_be_bytes(), to);
        }
        while s[1].recv_from(&mut buf).is_ok() {
            got += 1;
        }
    }
    // Binomial(400, 0.5): mean 200, sd 10; these bounds are 8 sd out.
    assert!(
        (120..=280).contains(&got),
        "{got} of {SENT} arrived at 50 % loss"
    );
    net.loss(0, 1, 0).expect("no loss");
    assert!(reaches(&s[0], &s[1]));
}

/// An echo server on `socket` until it has been idle for a second.
fn echo(socket: UdpSocket) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        socket
            .set_read_timeout(Some(Duration::from_millis(1_000)))
            .expect("timeout");
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            let _ = socket.send_to(&buf[..n], from);
        }
    })
}

/// Round trips through `relay` from `client`; returns each one's time.
fn round_trips(client: &UdpSocket, relay: SocketAddr, count: u32) -> Vec<Duration> {
    client
        .set_read_timeout(Some(Duration::from_millis(2_000)))
        .expect("timeout");
    let mut buf = [0u8; 64];
    (0..count)
        .map(|i| {
            let t = Instant::now();
            client.send_to(&i.to_be_bytes(), relay).expect("send");
            let (n, _) = client.recv_from(&mut buf).expect("echo through the relay");
            assert_eq!(&buf[..n], &i.to_be_bytes());
            t.elapsed()
        })
        .collect()
}

const DELAY_MS: u64 = 20;
const JITTER_MS: u64 = 5;
/// What a busy machine may add to a round trip beyond the relay's delay.
const SCHEDULING_SLACK_MS: u64 = 60;

fn assert_delay_within_bounds(rtts: &[Duration]) {
    // Two crossings of the relay per round trip, each delayed by DELAY_MS..=DELAY_MS+JITTER_MS.
    let low = Duration::from_millis(2 * DELAY_MS);
    let high = Duration::from_millis(2 * (DELAY_MS + JITTER_MS) + SCHEDULING_SLACK_MS);
    for rtt in rtts {
        assert!(
            *rtt >= low,
            "a round trip of {rtt:?} beat the delay {low:?}"
        );
    }
    let mut sorted = rtts.to_vec();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    assert!(median <= high, "median round trip {median:?} over {high:?}");
}

fn delay_faults() -> RelayFaults {
    RelayFaults {
        delay_ms: DELAY_MS,
        jitter_ms: JITTER_MS,
        ..RelayFaults::none()
    }
}

#[test]
fn the_relay_delays_each_crossing_within_bounds_on_loopback() {
    let target = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let target_addr = target.local_addr().expect("addr");
    let server = echo(target);
    let relay = Relay::start(
        "127.0.0.1:0".parse().expect("addr"),
        target_addr,
        delay_faults(),
        seed(),
    )
    .expect("relay");
    let client = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let rtts = round_trips(&client, relay.local_addr(), 20);
    assert_delay_within_bounds(&rtts);
    // The last echo can reach the client before the relay counts its send.
    let deadline = Instant::now() + Duration::from_millis(DELIVERY_WAIT_MS);
    while relay.stats().forwarded < 40 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let stats = relay.stats();
    assert_eq!((stats.received, stats.forwarded), (40, 40), "{stats:?}");

    // Healed: straight through (well under the delay).
    relay.set_faults(RelayFaults::none()).expect("heal");
    let rtts = round_trips(&client, relay.local_addr(), 5);
    let fastest = rtts.iter().min().expect("some");
    assert!(*fastest < Duration::from_millis(DELAY_MS), "{rtts:?}");
    drop(relay);
    server.join().expect("echo");
}

/// Sends `count` numbered datagrams `gap` apart through a fresh relay with `faults`; returns the
/// numbers in the order the target got them, and the relay's counters.
fn through_relay(
    faults: RelayFaults,
    seed: u64,
    count: u32,
    gap: Duration,
) -> (Vec<u32>, sluice_chaos::relay::RelayStats) {
    let target = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let relay = Relay::start(
        "127.0.0.1:0".parse().expect("addr"),
        target.local_addr().expect("addr"),
        faults,
        seed,
    )
    .expect("relay");
    let client = UdpSocket::bind("127.0.0.1:0").expect("bind");
    for i in 0..count {
        client
            .send_to(&i.to_be_bytes(), relay.local_addr())
            .expect("send");
        if !gap.is_zero() {
            std::thread::sleep(gap);
        }
    }
    target
        .set_read_timeout(Some(Duration::from_millis(DELIVERY_WAIT_MS)))
        .expect("timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 16];
    while let Ok((n, _)) = target.recv_from(&mut buf) {
        let bytes: [u8; 4] = buf[..n].try_into().expect("4 bytes");
        got.push(u32::from_be_bytes(bytes));
    }
    (got, relay.stats())
}

#[test]
fn the_relay_duplicates_and_reorders() {
    let seed = seed();
    let dup = RelayFaults {
        duplicate_per_mille: 1000,
        ..RelayFaults::none()
    };
    let (got, stats) = through_relay(dup, seed, 50, Duration::ZERO);
    assert_eq!(got.len(), 100, "every datagram twice: {got:?}");
    for i in 0..50 {
        assert_eq!(got.iter().filter(|&&g| g == i).count(), 2, "{i}: {got:?}");
    }
    assert_eq!((stats.duplicated, stats.forwarded), (50, 100));

    let reorder = RelayFaults {
        reorder_per_mille: 300,
        reorder_extra_ms: 30,
        ..RelayFaults::none()
    };
    let (got, stats) = through_relay(reorder, seed, 100, Duration::from_millis(2));
    assert_eq!(got.len(), 100, "reordering lost datagrams: {got:?}");
    let overtaken = got.windows(2).filter(|w| w[0] > w[1]).count();
    assert!(
        stats.reordered > 0 && overtaken > 0,
        "no reordering seen: {stats:?} {got:?}"
    );
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(sorted, (0..100).collect::<Vec<_>>());
}

#[test]
fn the_relays_loss_is_counted_and_replayed_by_its_seed() {
    let seed = seed();
    let lossy = RelayFaults {
        loss_per_mille: 300,
        ..RelayFaults::none()
    };
    let gap = Duration::from_micros(200);
    let (first, stats) = through_relay(lossy, seed, 300, gap);
    assert_eq!(first.len() as u64, 300 - stats.lost, "{stats:?}");
    assert!(
        (30..=150).contains(&stats.lost),
        "30 % of 300 lost? {stats:?}"
    );
    // One client, one direction: the arrival order is the send order, so the seed replays
    // exactly which datagrams are lost.
    let (again, _) = through_relay(lossy, seed, 300, gap);
    assert_eq!(
        first.iter().collect::<BTreeSet<_>>(),
        again.iter().collect::<BTreeSet<_>>(),
        "the same seed lost other datagrams"
    );
    let (other, _) = through_relay(lossy, seed.wrapping_add(1), 300, gap);
    assert_ne!(first, other, "another seed lost the same datagrams");
}

#[test]
fn the_relays_queue_is_bounded() {
    const QUEUE_MAX: usize = 10;
    const SENT: u32 = 50;
    let slow = RelayFaults {
        delay_ms: 500,
        queue_packets_max: QUEUE_MAX,
        ..RelayFaults::none()
    };
    let target = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let relay = Relay::start(
        "127.0.0.1:0".parse().expect("addr"),
        target.local_addr().expect("addr"),
        slow,
        seed(),
    )
    .expect("relay");
    let client = UdpSocket::bind("127.0.0.1:0").expect("bind");
    for i in 0..SENT {
        client
            .send_to(&i.to_be_bytes(), relay.local_addr())
            .expect("send");
    }
    let deadline = Instant::now() + Duration::from_millis(400);
    while relay.stats().received < u64::from(SENT) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = relay.stats();
    assert!(relay.queued() <= QUEUE_MAX, "{} queued", relay.queued());
    assert_eq!(stats.received, u64::from(SENT), "{stats:?}");
    assert_eq!(
        stats.queue_full,
        u64::from(SENT) - QUEUE_MAX as u64,
        "{stats:?}"
    );
}

#[test]
fn the_relay_works_between_namespaces() {
    let Some(net) = net_or_skip(2) else { return };
    // The target in node 1, the relay in the hub, the client in node 0: as a node's peer
    // traffic will go in the three-node campaign.
    let target = socket_in(&net, 1);
    let target_addr = target.local_addr().expect("addr");
    let server = echo(target);
    let listen = SocketAddr::new(net.hub_addr().into(), 0);
    let seed = seed();
    let relay = net
        .enter_hub(move || Relay::start(listen, target_addr, delay_faults(), seed))
        .expect("enter")
        .expect("relay in the hub");
    let client = socket_in(&net, 0);
    let rtts = round_trips(&client, relay.local_addr(), 10);
    assert_delay_within_bounds(&rtts);
    drop(relay);
    server.join().expect("echo");
}

/// The process's state once it settles (a signal is delivered after kill(2) returns).
fn settled_state(pid: u32, want_stopped: bool) -> Option<char> {
    let deadline = Instant::now() + Duration::from_millis(DELIVERY_WAIT_MS);
    loop {
        let state = process::state(pid);
        if (state == Some('T')) == want_stopped || Instant::now() >= deadline {
            return state;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_paused_process_is_stopped_until_resumed_even_on_a_panic() {
    let mut child = Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    let pid = child.id();
    let paused = process::pause(&child).expect("pause");
    assert_eq!(settled_state(pid, true), Some('T'), "not stopped");
    drop(paused);
    assert_ne!(
        settled_state(pid, false),
        Some('T'),
        "still stopped after the guard"
    );

    let t = Instant::now();
    process::pause_for(&child, Duration::from_millis(100)).expect("pause_for");
    assert!(t.elapsed() >= Duration::from_millis(100));
    assert_ne!(
        settled_state(pid, false),
        Some('T'),
        "still stopped after pause_for"
    );

    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _paused = process::pause(&child).expect("pause");
        panic!("a test failing while its node is paused");
    }));
    assert!(r.is_err());
    assert_ne!(
        settled_state(pid, false),
        Some('T'),
        "a panic left the process stopped"
    );
    child.kill().expect("kill");
    child.wait().expect("wait");
}

/// The `sluiced` built next to this test's `sluice-chaos` (or `$SLUICED_BIN`), as the campaign
/// tests find it.
fn sluiced() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("SLUICED_BIN") {
        return p.into();
    }
    let p = std::path::Path::new(env!("CARGO_BIN_EXE_sluice-chaos"))
        .parent()
        .expect("bin dir")
        .join("sluiced");
    assert!(
        p.exists(),
        "no {}: cargo build -p sluice-broker --bin sluiced first",
        p.display()
    );
    p
}

/// Connects from the hub's namespace (a current-thread runtime on a thread inside it, so its
/// sockets are there) and sends one message; whether that was acknowledged.
fn send_from_hub(net: &Net, addr: SocketAddr, cert: std::path::PathBuf) -> bool {
    net.enter_hub(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let Some(c) = sluice_chaos::load::connect(addr, &cert, "netns-test").await else {
                return false;
            };
            let ok = match c.create_queue("netns").await {
                Ok(q) => c.send(&q, "across the bridge").await.is_ok(),
                Err(_) => false,
            };
            c.close().await;
            ok
        })
    })
    .expect("enter the hub")
}

/// The three-node campaign's layout with one node: a real broker in a node's namespace,
/// listening on the namespace's address, its client in the hub. The link going down cuts the
/// client off; heal brings it back.
#[test]
fn a_broker_in_a_namespace_serves_the_hub_until_its_link_goes_down() {
    let Some(mut net) = net_or_skip(1) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let (data, logs) = (dir.path().join("data"), dir.path().join("logs"));
    std::fs::create_dir_all(&data).expect("data dir");
    std::fs::create_dir_all(&logs).expect("log dir");
    // Declared after `net`, so it is killed before the namespaces go.
    let mut node = sluice_chaos::node::Node::new(0, &sluiced(), &data, &logs);
    node.set_netns(Some(net.node(0).clone()));
    let addr = node.start(0).expect("sluiced starts in its namespace");
    assert_eq!(addr.ip(), std::net::IpAddr::from(net.node(0).addr));
    assert!(
        send_from_hub(&net, addr, node.cert_path()),
        "no send across the bridge"
    );
    net.link_down(0).expect("down");
    assert!(
        !send_from_hub(&net, addr, node.cert_path()),
        "a send reached a broker whose link is down"
    );
    net.heal().expect("heal");
    // The link comes back within moments (carrier, the bridge port); the client's connect has
    // its own timeout, so a few tries.
    let healed = (0..REACH_ATTEMPTS).any(|_| send_from_hub(&net, addr, node.cert_path()));
    let log = std::fs::read_dir(&logs)
        .expect("logs")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .collect::<String>();
    assert!(healed, "no send after heal; the broker's log:\n{log}");
}
