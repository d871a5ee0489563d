//! Engine CPU per message for send → receive → delete, no I/O (the budget: < 2 µs).
//!
//! `cargo bench -p sluice-broker --bench engine` prints ns/message for several shapes; it
//! asserts nothing about time. Figures include building the payload (MD5 of body and
//! attributes) and, where named, encoding the records and the receipt handles — the work the
//! shard would otherwise do around the engine.
//!
//! It also prints the engine's memory per waiting message (bytes allocated and still held per
//! message sent and not received, counted by a wrapping global allocator), for a few body
//! sizes: what a backlog costs in RAM.

// A test is the broker's outside world: it times the broker with its own clocks (deadlines,
// waits, latencies). broker/clippy.toml's clock seam governs the broker's code, not this.
#![allow(clippy::disallowed_methods)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use sluice_broker::engine::attributes::{QueueAttributes, QueueKind};
use sluice_broker::engine::{
    Command, Limits, Partition, PartitionConfig, ReceiptCodec, ReceiveRequest, Reply, SendRequest,
};

/// Counts the bytes currently allocated (the bench is single-threaded while it measures).
struct Counting;

static ALLOCATED_BYTES: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        ALLOCATED_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Bytes the engine holds per message waiting in a standard queue of `messages` messages of
/// `body_bytes` (sent, never received), with entries for the first `resident` of them (the
/// rest wait in the log, as the tail). The request bodies are freed or moved into the engine;
/// what stays allocated after the sends is the backlog's cost.
fn bytes_per_waiting_message(body_bytes: usize, messages: u64, resident: u32) -> f64 {
    let mut p = Partition::new(PartitionConfig {
        queue_id: 1,
        partition: 0,
        attributes: QueueAttributes::new(QueueKind::Standard),
        limits: Limits {
            resident_entries_target: resident,
            ..Limits::default()
        },
    })
    .expect("valid config");
    let body = "x".repeat(body_bytes);
    // Warm the tables up so that their first allocations are not counted per message.
    p.execute(1, send_of(&body)).expect("send");
    let before = ALLOCATED_BYTES.load(Ordering::Relaxed);
    for i in 0..messages {
        let fx = p.execute(2 + i, send_of(&body)).expect("send");
        drop(fx);
    }
    let after = ALLOCATED_BYTES.load(Ordering::Relaxed);
    black_box(&p);
    (after - before) as f64 / messages as f64
}

/// Memory of a FIFO queue's backlog spread over `groups` groups (sent in round robin at 100,000
/// a second, within the dedup window, never received).
struct FifoMemory {
    /// Heap bytes of the groups' wait lists per waiting message.
    wait_list: f64,
    /// Bytes allocated per group by its first message (its entry, name, dedup entry, indexes).
    per_group: f64,
    /// Bytes allocated per message after the first of each group (all-in: wait list and dedup).
    per_message: f64,
    /// Of those, what is not the wait lists: the dedup table's bytes per entry (its index
    /// included; every message has its own dedup id).
    per_dedup_entry: f64,
}

fn bytes_per_waiting_fifo_message(messages: u64, groups: u64) -> FifoMemory {
    let mut p = Partition::new(PartitionConfig {
        queue_id: 1,
        partition: 0,
        attributes: QueueAttributes::new(QueueKind::Fifo),
        limits: Limits {
            dedup_entries_max: u32::MAX,
            ..Limits::default()
        },
    })
    .expect("valid config");
    let send = |p: &mut Partition, i: u64| {
        let cmd = Command::Send(SendRequest {
            body: "x".to_string(),
            group_id: Some(format!("group-{:06}", i % groups)),
            dedup_id: Some(format!("d{i}")),
            ..SendRequest::default()
        });
        drop(p.execute(1 + i / 100, cmd).expect("send"));
    };
    let before = ALLOCATED_BYTES.load(Ordering::Relaxed);
    for i in 0..groups {
        send(&mut p, i);
    }
    let per_group = (ALLOCATED_BYTES.load(Ordering::Relaxed) - before) as f64 / groups as f64;
    let (before, waiting_before) = (ALLOCATED_BYTES.load(Ordering::Relaxed), p.waiting_bytes());
    for i in groups..groups + messages {
        send(&mut p, i);
    }
    black_box(&p);
    let all = (ALLOCATED_BYTES.load(Ordering::Relaxed) - before) as f64;
    let lists = (p.waiting_bytes() - waiting_before) as f64;
    FifoMemory {
        wait_list: p.waiting_bytes() as f64 / p.entries() as f64,
        per_group,
        per_message: all / messages as f64,
        per_dedup_entry: (all - lists) / messages as f64,
    }
}

fn send_of(body: &str) -> Command {
    Command::Send(SendRequest {
        body: body.to_string(),
        ..SendRequest::default()
    })
}

struct Shape {
    name: &'static str,
    kind: QueueKind,
    body_bytes: usize,
    groups: usize,
    batch: u32,
    encode: bool,
}

fn run(shape: &Shape, messages: u64) -> f64 {
    let mut attrs = QueueAttributes::new(shape.kind);
    attrs.content_based_dedup = shape.kind == QueueKind::Fifo;
    let mut p = Partition::new(PartitionConfig {
        queue_id: 1,
        partition: 0,
        attributes: attrs,
        limits: Limits::default(),
    })
    .expect("valid config");
    let codec = ReceiptCodec::new(&[3; 32]).expect("32-byte secret");
    let body = "x".repeat(shape.body_bytes.saturating_sub(12));
    let mut now = 1_000_000u64;
    let mut encoded = Vec::with_capacity(4096);
    let start = Instant::now();
    let mut done = 0u64;
    let mut i = 0u64;
    while done < messages {
        for _ in 0..shape.batch {
            i += 1;
            let req = SendRequest {
                // Distinct bodies: FIFO shapes deduplicate by content.
                body: format!("{body}{i:012}"),
                group_id: (shape.groups > 0).then(|| format!("g{}", i % shape.groups as u64)),
                ..SendRequest::default()
            };
            let fx = p.execute(now, Command::Send(req)).expect("send");
            if shape.encode {
                for r in &fx.records {
                    encoded.clear();
                    r.encode_into(&mut encoded);
                    black_box(&encoded);
                }
            }
        }
        let fx = p
            .execute(
                now,
                Command::Receive(ReceiveRequest {
                    max_messages: shape.batch,
                    visibility_timeout_s: None,
                    attempt_id: None,
                }),
            )
            .expect("receive");
        let Reply::Received(got) = fx.reply else {
            panic!("receive reply expected")
        };
        if shape.encode {
            for r in &fx.records {
                encoded.clear();
                r.encode_into(&mut encoded);
                black_box(&encoded);
            }
        }
        for d in got {
            let receipt = if shape.encode {
                let h = codec.encode(&d.receipt);
                codec.decode(&h, 1).expect("own handle")
            } else {
                d.receipt
            };
            let fx = p.execute(now, Command::Delete { receipt }).expect("delete");
            if shape.encode {
                for r in &fx.records {
                    encoded.clear();
                    r.encode_into(&mut encoded);
                    black_box(&encoded);
                }
            }
            done += 1;
        }
        now += 1;
    }
    start.elapsed().as_nanos() as f64 / done as f64
}

fn main() {
    let messages = std::env::var("SLUICE_BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300_000u64);
    let shapes = [
        Shape {
            name: "standard 100 B, 1 at a time",
            kind: QueueKind::Standard,
            body_bytes: 100,
            groups: 0,
            batch: 1,
            encode: false,
        },
        Shape {
            name: "standard 100 B, batches of 10",
            kind: QueueKind::Standard,
            body_bytes: 100,
            groups: 0,
            batch: 10,
            encode: false,
        },
        Shape {
            name: "standard 100 B, batches of 10, + encode records & handles",
            kind: QueueKind::Standard,
            body_bytes: 100,
            groups: 0,
            batch: 10,
            encode: true,
        },
        Shape {
            name: "standard 1 KiB, batches of 10",
            kind: QueueKind::Standard,
            body_bytes: 1024,
            groups: 0,
            batch: 10,
            encode: false,
        },
        Shape {
            name: "fair (100 groups) 100 B, batches of 10",
            kind: QueueKind::Standard,
            body_bytes: 100,
            groups: 100,
            batch: 10,
            encode: false,
        },
        Shape {
            name: "FIFO 100 groups, content dedup, 100 B, batches of 10",
            kind: QueueKind::Fifo,
            body_bytes: 100,
            groups: 100,
            batch: 10,
            encode: false,
        },
    ];
    println!("engine CPU per message, send → receive → delete ({messages} messages each)");
    for s in &shapes {
        run(s, messages / 10); // warm-up
        let ns = run(s, messages);
        println!("{:>8.0} ns/message  {}", ns, s.name);
    }
    println!("engine memory per waiting message (standard queue, 100,000 sent, none received)");
    for body_bytes in [100, 2048] {
        let b = bytes_per_waiting_message(body_bytes, 100_000, 200_000);
        println!("{b:>8.0} bytes/message  body {body_bytes} B, each with an entry");
        let b = bytes_per_waiting_message(body_bytes, 100_000, 0);
        println!("{b:>8.0} bytes/message  body {body_bytes} B, waiting in the log (the tail)");
    }
    println!("engine memory per waiting FIFO message (2,000,000 sent to 100,000 groups)");
    let m = bytes_per_waiting_fifo_message(1_900_000, 100_000);
    println!(
        "{:>8.1} bytes/message  its group's wait list (heap bytes / messages)",
        m.wait_list
    );
    println!(
        "{:>8.0} bytes/group    a group's first message (group, dedup entry)",
        m.per_group
    );
    println!(
        "{:>8.1} bytes/message  all-in, after each group's first (wait list, dedup entry)",
        m.per_message
    );
    println!(
        "{:>8.1} bytes/entry    of which the dedup table, per entry (index included)",
        m.per_dedup_entry
    );
}
