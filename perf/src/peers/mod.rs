//! The peers Sluice is measured against, each behind the same [`Target`] seam as Sluice itself:
//! NATS JetStream, RabbitMQ quorum queues and Redis Streams (twice: `appendfsync always` and
//! `everysec`). Each peer is the Debian package's server (`perf/scripts/install-peers.sh`),
//! started here as a child process on loopback with its own data directory and free ports, and
//! stopped when the guard [`start`] returns is dropped.
//!
//! Every adapter maps a shape the same way, so the generator needs no per-peer knowledge:
//! a queue or topic `name` is one stream / exchange / stream key, and consumer group `g` of it is
//! one durable consumer / queue / consumer group named `g<g>` (a standard queue is group 0).

mod nats;
mod process;
mod rabbitmq;
mod redis;

use crate::target::{Target, TargetError};
use std::any::Any;
use std::path::Path;

/// The peers [`start`] knows, in the order reports list them.
pub const NAMES: &[&str] = &[
    "nats-jetstream",
    "rabbitmq-quorum",
    "redis-always",
    "redis-everysec",
];

/// How many messages a push-style consumer (NATS pull stream, AMQP basic.qos) may hold
/// unacknowledged per connection and queue: enough to keep a consumer busy between round trips,
/// small enough that competing consumers share the work.
pub(crate) const PREFETCH_MESSAGES: u16 = 256;

/// A started peer: the guard that stops its server on Drop, and the Target that drives it.
pub type Started = (Box<dyn Any>, Box<dyn Target>);

/// Starts the named peer's server on loopback (own data dir under work_dir, free ports), waits
/// until it serves, and returns a guard that stops it (and removes nothing the user owns) on
/// Drop, plus the Target.
pub fn start(name: &str, work_dir: &Path) -> Result<Started, TargetError> {
    match name {
        "nats-jetstream" => nats::start(work_dir),
        "rabbitmq-quorum" => rabbitmq::start(work_dir),
        "redis-always" => redis::start(work_dir, redis::AppendFsync::Always),
        "redis-everysec" => redis::start(work_dir, redis::AppendFsync::EverySec),
        _ => Err(TargetError(format!(
            "unknown peer {name:?} (known: {})",
            NAMES.join(", ")
        ))),
    }
}

/// The name a queue or topic's consumer group `group` has inside a peer.
pub(crate) fn group_name(group: u32) -> String {
    format!("g{group}")
}

#[cfg(test)]
mod tests {
    //! Each peer, started for real, carries 1,000 messages through send → receive → ack, as a
    //! standard queue and as a topic with two groups. Peers are not in CI (they need
    //! `perf/scripts/install-peers.sh`), so these are ignored:
    //! `cargo test -p sluice-perf peers -- --ignored --nocapture`.

    use super::*;
    use crate::target::{AckToken, Conn, OutMsg, Shape};
    use std::cell::RefCell;
    use std::collections::HashSet;
    use std::rc::Rc;
    use std::time::{Duration, Instant};

    const MESSAGES: usize = 1_000;
    const BATCH: usize = 10;
    const BODY_BYTES: usize = 2048;
    /// Bounds each test's receive loop, however the peer behaves.
    const DEADLINE: Duration = Duration::from_secs(60);

    fn run(peer: &str) {
        let work = tempfile::tempdir().expect("temp dir");
        let started = Instant::now();
        let (guard, target) = match start(peer, work.path()) {
            Ok(started) => started,
            Err(e) => panic!("{peer}: {e}"),
        };
        eprintln!(
            "{peer}: started in {:?}; fsync policy: {}",
            started.elapsed(),
            target.fsync_policy()
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async {
            cycle(&*target, "perf-standard", &Shape::Standard).await;
            let topic = Shape::Topic {
                partitions: 2,
                groups: 2,
            };
            assert!(target.supports(&topic), "{peer} supports topics");
            cycle(&*target, "perf-topic", &topic).await;
            assert!(!target.supports(&Shape::Fifo { groups: 4 }));
            concurrent(&*target, "perf-concurrent").await;
            recreate(&*target, "perf-recreate").await;
        });
        drop(rt);
        let stopping = Instant::now();
        drop(guard);
        eprintln!("{peer}: stopped in {:?}", stopping.elapsed());
    }

    /// Sends MESSAGES numbered bodies in batches on one connection, receives them on another
    /// for every group, acks each, and checks each group saw every number exactly once and
    /// that nothing more arrives after the acks.
    async fn cycle(target: &dyn Target, name: &str, shape: &Shape) {
        let groups = match shape {
            Shape::Topic { groups, .. } => *groups,
            _ => 1,
        };
        target.setup(name, shape).await.expect("setup");
        let producer = target.connect().await.expect("connect producer");
        let consumer = target.connect().await.expect("connect consumer");
        let started = Instant::now();
        for batch in 0..MESSAGES / BATCH {
            let msgs: Vec<OutMsg> = (0..BATCH)
                .map(|i| {
                    let n = batch * BATCH + i;
                    let mut body = format!("{n:08}").into_bytes();
                    body.resize(BODY_BYTES, b'.');
                    OutMsg {
                        body,
                        group: Some(format!("k{}", n % 7)),
                    }
                })
                .collect();
            producer.send(name, &msgs).await.expect("send");
        }
        let sent = started.elapsed();
        for group in 0..groups {
            let seen = drain(&*consumer, name, group, MESSAGES).await;
            assert_eq!(seen.len(), MESSAGES, "group {group} saw every message once");
        }
        eprintln!(
            "  {name} ({shape:?}): sent {MESSAGES} in {sent:?}, all received and acked by \
             {groups} group(s) in {:?}",
            started.elapsed()
        );
        for group in 0..groups {
            let more = consumer
                .receive(name, group, 10, Duration::from_millis(300))
                .await
                .expect("receive after acks");
            assert!(more.is_empty(), "nothing left for group {group}");
        }
        drop((producer, consumer));
        target.teardown(name, shape).await.expect("teardown");
    }

    /// Closed loop through a standard queue: PRODUCERS and CONSUMERS tasks per connection on
    /// two connections (tasks share a connection, as the generator's do), 2 KiB bodies in
    /// batches of 10, each consumer acking what it receives. Checks every message arrived at
    /// least once and prints the end-to-end rate: a sanity figure, not a benchmark (debug
    /// client, shared cores).
    async fn concurrent(target: &dyn Target, name: &str) {
        const CONNS: usize = 2;
        const PRODUCERS: usize = 4;
        const CONSUMERS: usize = 4;
        const TOTAL: usize = 20_000;
        let shape = Shape::Standard;
        target.setup(name, &shape).await.expect("setup");
        let mut conns = Vec::new();
        for _ in 0..CONNS {
            conns.push(Rc::new(target.connect().await.expect("connect")));
        }
        let per_producer = TOTAL / (CONNS * PRODUCERS);
        let seen = Rc::new(RefCell::new(HashSet::new()));
        let started = Instant::now();
        let deadline = started + DEADLINE;
        let mut tasks = Vec::new();
        for (c, conn) in conns.iter().enumerate() {
            for p in 0..PRODUCERS {
                let conn = conn.clone();
                let name = name.to_string();
                tasks.push(tokio::task::spawn_local(async move {
                    let first = (c * PRODUCERS + p) * per_producer;
                    for batch in (0..per_producer).step_by(BATCH) {
                        let msgs: Vec<OutMsg> = (0..BATCH)
                            .map(|i| {
                                let mut body = format!("{:08}", first + batch + i).into_bytes();
                                body.resize(BODY_BYTES, b'.');
                                OutMsg { body, group: None }
                            })
                            .collect();
                        conn.send(&name, &msgs).await.expect("send");
                    }
                }));
            }
            for _ in 0..CONSUMERS {
                let conn = conn.clone();
                let name = name.to_string();
                let seen = seen.clone();
                tasks.push(tokio::task::spawn_local(async move {
                    while seen.borrow().len() < TOTAL && Instant::now() < deadline {
                        let got = conn
                            .receive(&name, 0, BATCH, Duration::from_millis(200))
                            .await
                            .expect("receive");
                        let mut acks = Vec::with_capacity(got.len());
                        for m in got {
                            let n = String::from_utf8_lossy(&m.body[..8]).into_owned();
                            seen.borrow_mut().insert(n);
                            acks.push(m.ack);
                        }
                        if !acks.is_empty() {
                            conn.ack(&name, 0, acks).await.expect("ack");
                        }
                    }
                }));
            }
        }
        for t in tasks {
            t.await.expect("task");
        }
        let took = started.elapsed();
        assert_eq!(seen.borrow().len(), TOTAL, "every message received");
        eprintln!(
            "  {name}: {TOTAL} x {BODY_BYTES} B, {CONNS} conns x ({PRODUCERS} producers + \
             {CONSUMERS} consumers), batch {BATCH}: send+receive+ack {:.0} msg/s",
            TOTAL as f64 / took.as_secs_f64()
        );
        drop(conns);
        target.teardown(name, &shape).await.expect("teardown");
    }

    /// A connection that consumed from a queue keeps working after the queue is torn down and
    /// set up again (the generator may reuse connections across cases): a receive may fail
    /// once while the adapter notices, then the new queue's messages arrive.
    async fn recreate(target: &dyn Target, name: &str) {
        let conn = target.connect().await.expect("connect");
        let msgs: Vec<OutMsg> = (0..BATCH)
            .map(|i| OutMsg {
                body: format!("{i:08}").into_bytes(),
                group: None,
            })
            .collect();
        for round in 0..2 {
            target.setup(name, &Shape::Standard).await.expect("setup");
            conn.send(name, &msgs).await.expect("send");
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut got = 0;
            let mut failures = 0;
            while got < BATCH {
                assert!(Instant::now() < deadline, "round {round}: {got} of {BATCH}");
                match conn
                    .receive(name, 0, BATCH, Duration::from_millis(500))
                    .await
                {
                    Ok(ms) => {
                        got += ms.len();
                        let acks = ms.into_iter().map(|m| m.ack).collect();
                        conn.ack(name, 0, acks).await.expect("ack");
                    }
                    Err(e) => {
                        failures += 1;
                        eprintln!("  {name} round {round}: receive failed once: {e}");
                        assert!(failures <= 2, "round {round}: keeps failing");
                    }
                }
            }
            target
                .teardown(name, &Shape::Standard)
                .await
                .expect("teardown");
        }
        eprintln!("  {name}: a connection outlives teardown + setup of its queue");
    }

    async fn drain(conn: &dyn Conn, name: &str, group: u32, want: usize) -> HashSet<String> {
        let deadline = Instant::now() + DEADLINE;
        let mut seen = HashSet::new();
        while seen.len() < want {
            assert!(
                Instant::now() < deadline,
                "group {group}: {} of {want}",
                seen.len()
            );
            let got = conn
                .receive(name, group, 10, Duration::from_millis(500))
                .await
                .expect("receive");
            let mut acks: Vec<AckToken> = Vec::with_capacity(got.len());
            for m in got {
                assert_eq!(m.body.len(), BODY_BYTES);
                let n = String::from_utf8_lossy(&m.body[..8]).into_owned();
                assert!(seen.insert(n.clone()), "group {group}: {n} twice");
                acks.push(m.ack);
            }
            if !acks.is_empty() {
                conn.ack(name, group, acks).await.expect("ack");
            }
        }
        seen
    }

    #[test]
    #[ignore = "needs perf/scripts/install-peers.sh"]
    fn nats_jetstream_carries_messages() {
        run("nats-jetstream");
    }

    #[test]
    #[ignore = "needs perf/scripts/install-peers.sh"]
    fn rabbitmq_quorum_carries_messages() {
        run("rabbitmq-quorum");
    }

    #[test]
    #[ignore = "needs perf/scripts/install-peers.sh"]
    fn redis_always_carries_messages() {
        run("redis-always");
    }

    #[test]
    #[ignore = "needs perf/scripts/install-peers.sh"]
    fn redis_everysec_carries_messages() {
        run("redis-everysec");
    }

    #[test]
    fn missing_server_binary_names_the_install_script() {
        let err = process::find_binary(&["sluice-perf-no-such-server"]).expect_err("missing");
        assert!(err.0.contains("perf/scripts/install-peers.sh"), "{err}");
    }

    #[test]
    fn unknown_peer_is_an_error_not_a_panic() {
        let work = tempfile::tempdir().expect("temp dir");
        let err = start("kafka", work.path()).err().expect("unknown peer");
        assert!(err.0.contains("nats-jetstream"), "{err}");
    }
}
