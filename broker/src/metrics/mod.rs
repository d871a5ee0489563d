//! Metrics: cheap per-core counters, gathered over the shard mesh when scraped, and rendered
//! as Prometheus text (`/metrics` on `BrokerConfig::metrics_addr`, served by shard 0; see
//! [`serve`]).
//!
//! | where counted | what | how |
//! |---|---|---|
//! | front ends (`http`, `native`, `kafka`) | requests by action, errors by code, latency histogram | a thread-local [`Local`] per shard executor: plain `Cell`/`RefCell`, no atomics |
//! | `Shard::admit`, `Shard::check_stored_bytes` | quota refusals by account and quota | the thread-local [`Local`] |
//! | `shard::partition` | messages sent, received, deleted, dead-lettered, redriven | [`PartitionOps`] cells in each partition actor |
//! | `shard::partition` | durable wait (stage → fdatasync) and send → first receive histograms | the thread-local [`Local`] |
//! | on scrape | visible, in flight, delayed; log commits, fsyncs, segments, bytes; executor busy time | read from the engine, each partition's `Log`, glommio's executor stats |
//!
//! Nothing on the request path crosses cores: a scrape asks every shard for a
//! [`ShardSnapshot`] over the mesh (one message per shard) and renders on shard 0.
//!
//! Label cardinality is bounded: actions and error codes are closed sets (the SQS model's
//! actions, the wire's frame kinds and error codes); queues are bounded per tenant by the
//! catalog, so per-queue series are at most (queues × 10); shard labels at most the core count.
//! With `metrics.queue_labels = false` (brokers of many queues) the per-queue, per-group and
//! per-account series are left out, and the broker-wide ones (`sluice_messages_*_total`,
//! `sluice_oldest_message_age_seconds`, `sluice_quota_throttled_total`) still say what
//! dashboards and alerts need (dashboards/README.md).

pub mod serve;

use crate::engine::{Counters, Reply};
use sluice_storage::{FsyncHistogram, LogStats, FSYNC_BUCKETS_US};
use sluice_wire::{ErrorCode, FrameKind};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

/// Upper bounds of the request latency histogram's buckets, in microseconds (+Inf beyond).
pub const LATENCY_BUCKETS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// A scrape waits this long for each shard's snapshot (a stuck shard must not hang scrapes).
pub const SHARD_SNAPSHOT_TIMEOUT_MS: u64 = 2_000;

/// A request's front end and action: a closed set (the label values of `action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// SQS HTTP API: one of `http::actions::ACTIONS`, or `"unknown"` before decoding.
    Sqs(&'static str),
    /// Native protocol: the request's frame kind.
    Native(FrameKind),
    /// Kafka protocol: the request's API (`Produce`, `Fetch`, ...; the served set of
    /// `kafka::dispatch::SUPPORTED`).
    Kafka(kafka_protocol::messages::ApiKey),
}

impl Action {
    fn front_end(self) -> &'static str {
        match self {
            Action::Sqs(_) => "http",
            Action::Native(_) => "native",
            Action::Kafka(_) => "kafka",
        }
    }

    fn name(self) -> String {
        match self {
            Action::Sqs(a) => a.to_string(),
            Action::Native(k) => format!("{k:?}"),
            Action::Kafka(k) => format!("{k:?}"),
        }
    }
}

/// An error answered to a client: a closed set (the label values of `code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKey {
    /// The SQS error shape (`QueueDoesNotExist`).
    Sqs(&'static str),
    /// The wire's raw `ErrorCode` number.
    Native(u16),
    /// A Kafka error code answering a whole request (per-partition codes inside an answer
    /// are not counted here).
    Kafka(i16),
}

impl ErrorKey {
    fn front_end(self) -> &'static str {
        match self {
            ErrorKey::Sqs(_) => "http",
            ErrorKey::Native(_) => "native",
            ErrorKey::Kafka(_) => "kafka",
        }
    }

    fn name(self) -> String {
        match self {
            ErrorKey::Sqs(s) => s.to_string(),
            ErrorKey::Native(c) => format!("{:?}", ErrorCode::from_u16(c)),
            ErrorKey::Kafka(c) => c.to_string(),
        }
    }
}

/// Which per-account quota refused a request (the label values of `quota`: a closed set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuotaKind {
    /// `[quotas] requests_per_s`.
    Requests,
    /// `[quotas] bytes_per_s`.
    Bytes,
    /// `[quotas] stored_bytes_per_account`.
    StoredBytes,
}

impl QuotaKind {
    pub const ALL: [QuotaKind; 3] = [
        QuotaKind::Requests,
        QuotaKind::Bytes,
        QuotaKind::StoredBytes,
    ];

    fn name(self) -> &'static str {
        match self {
            QuotaKind::Requests => "requests_per_s",
            QuotaKind::Bytes => "bytes_per_s",
            QuotaKind::StoredBytes => "stored_bytes",
        }
    }

    fn index(self) -> usize {
        match self {
            QuotaKind::Requests => 0,
            QuotaKind::Bytes => 1,
            QuotaKind::StoredBytes => 2,
        }
    }
}

/// Accounts one shard counts quota refusals for by name; refusals of further accounts are
/// counted under [`QUOTA_OTHER_ACCOUNTS`], so the per-account series stay bounded however many
/// accounts a broker serves (the rate limiter itself tracks at most
/// `auth::quota::ACCOUNTS_TRACKED_MAX`).
pub const QUOTA_ACCOUNTS_COUNTED_MAX: usize = 1_000;
/// The `tenant` label of refusals past [`QUOTA_ACCOUNTS_COUNTED_MAX`] accounts (not an account
/// id: those are 12 digits or the default tenant's name).
pub const QUOTA_OTHER_ACCOUNTS: &str = "(other accounts)";

/// Upper bounds of the send-to-receive delay histogram's buckets, in microseconds (+Inf
/// beyond): from a consumer keeping up (milliseconds) to a backlog an hour deep.
pub const DELAY_BUCKETS_US: [u64; 16] = [
    1_000,
    5_000,
    10_000,
    50_000,
    100_000,
    500_000,
    1_000_000,
    5_000_000,
    10_000_000,
    30_000_000,
    60_000_000,
    300_000_000,
    900_000_000,
    1_800_000_000,
    3_600_000_000,
    21_600_000_000,
];

/// Requests of one action on one shard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestStats {
    pub count: u64,
    pub errors: u64,
    pub duration_us_sum: u64,
    /// Per bucket of [`LATENCY_BUCKETS_US`] (not cumulative); the last slot is +Inf.
    pub buckets: [u64; LATENCY_BUCKETS_US.len() + 1],
}

impl RequestStats {
    fn observe(&mut self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(LATENCY_BUCKETS_US.len());
        self.count += 1;
        self.duration_us_sum = self.duration_us_sum.saturating_add(us);
        self.buckets[bucket] += 1;
    }
}

/// One shard executor's counters. Thread-local: each shard's thread has its own.
#[derive(Default)]
pub struct Local {
    requests: RefCell<HashMap<Action, RequestStats>>,
    errors: RefCell<HashMap<ErrorKey, u64>>,
    /// From staging records in a partition log to their fdatasync (group-commit wait included).
    durable_wait: RefCell<RequestStats>,
    /// From a message's send to its first delivery (publish→receive latency, queue wait
    /// included), in buckets of [`DELAY_BUCKETS_US`].
    send_to_receive: RefCell<DelayStats>,
    /// Requests refused by a quota, per account (at most [`QUOTA_ACCOUNTS_COUNTED_MAX`]
    /// accounts by name, the rest under [`QUOTA_OTHER_ACCOUNTS`]).
    /// Counts indexed by `QuotaKind::index`.
    quota_throttled: RefCell<HashMap<String, [u64; 3]>>,
    /// glommio's executor run time, accumulated (its stats reset on every read).
    busy: Cell<Duration>,
    tasks: Cell<u64>,
}

/// A histogram over [`DELAY_BUCKETS_US`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DelayStats {
    pub count: u64,
    pub sum_us: u64,
    /// Per bucket (not cumulative); the last slot is +Inf.
    pub buckets: [u64; DELAY_BUCKETS_US.len() + 1],
}

impl DelayStats {
    fn observe_ms(&mut self, delay_ms: u64) {
        let us = delay_ms.saturating_mul(1_000);
        let bucket = DELAY_BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(DELAY_BUCKETS_US.len());
        self.count += 1;
        self.sum_us = self.sum_us.saturating_add(us);
        self.buckets[bucket] += 1;
    }
}

thread_local! {
    static LOCAL: Local = Local::default();
}

/// Counts one request answered by a front end on this shard.
pub fn record_request(action: Action, elapsed: Duration, error: Option<ErrorKey>) {
    LOCAL.with(|l| {
        let mut reqs = l.requests.borrow_mut();
        let s = reqs.entry(action).or_default();
        s.observe(elapsed);
        if let Some(e) = error {
            s.errors += 1;
            *l.errors.borrow_mut().entry(e).or_default() += 1;
        }
    });
}

/// Counts one wait for records to become durable (a partition command's commit).
pub fn record_durable_wait(elapsed: Duration) {
    LOCAL.with(|l| l.durable_wait.borrow_mut().observe(elapsed));
}

/// Counts a request of `account` refused by `quota` on this shard.
pub fn record_quota_throttled(account: &str, quota: QuotaKind) {
    LOCAL.with(|l| {
        let mut hits = l.quota_throttled.borrow_mut();
        let others = usize::from(hits.contains_key(QUOTA_OTHER_ACCOUNTS));
        let named = hits.contains_key(account) || hits.len() - others < QUOTA_ACCOUNTS_COUNTED_MAX;
        let key = if named { account } else { QUOTA_OTHER_ACCOUNTS };
        if !hits.contains_key(key) {
            hits.insert(key.to_string(), [0; 3]);
        }
        if let Some(counts) = hits.get_mut(key) {
            counts[quota.index()] += 1;
        }
    });
}

/// Message counts of one partition, kept by its actor (single-threaded: plain cells).
#[derive(Debug, Default)]
pub struct PartitionOps {
    sent: Cell<u64>,
    received: Cell<u64>,
    deleted: Cell<u64>,
    dead_lettered: Cell<u64>,
    redriven: Cell<u64>,
}

fn bump(c: &Cell<u64>, n: u64) {
    c.set(c.get().wrapping_add(n));
}

impl PartitionOps {
    /// Counts what one executed command did, from its reply and the moves it started, at
    /// `now_ms` (the partition's clock): a message's first delivery also counts its
    /// send-to-receive delay.
    pub fn count(&self, reply: &Reply, moves: usize, now_ms: u64) {
        if let Reply::Received(list) = reply {
            let firsts = list.iter().filter(|d| d.receive_count == 1);
            LOCAL.with(|l| {
                let mut h = l.send_to_receive.borrow_mut();
                for d in firsts {
                    h.observe_ms(now_ms.saturating_sub(d.sent_ms));
                }
            });
        }
        match reply {
            Reply::Sent(_) => bump(&self.sent, 1),
            Reply::SentBatch(list) => bump(
                &self.sent,
                list.iter().filter(|(_, r)| r.is_ok()).count() as u64,
            ),
            Reply::Received(list) => bump(&self.received, list.len() as u64),
            Reply::Deleted => bump(&self.deleted, 1),
            Reply::DeletedBatch(list) => bump(
                &self.deleted,
                list.iter().filter(|r| r.is_ok()).count() as u64,
            ),
            // A redrive task moves messages out of a dead-letter queue.
            Reply::MovesStarted(_) => bump(&self.redriven, moves as u64),
            _ => {}
        }
        // Moves started by anything else are maxReceiveCount moves into the DLQ.
        if !matches!(reply, Reply::MovesStarted(_)) {
            bump(&self.dead_lettered, moves as u64);
        }
    }

    pub fn snapshot(&self) -> OpCounts {
        OpCounts {
            sent: self.sent.get(),
            received: self.received.get(),
            deleted: self.deleted.get(),
            dead_lettered: self.dead_lettered.get(),
            redriven: self.redriven.get(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCounts {
    pub sent: u64,
    pub received: u64,
    pub deleted: u64,
    pub dead_lettered: u64,
    pub redriven: u64,
}

impl OpCounts {
    fn add(&mut self, o: &OpCounts) {
        self.sent += o.sent;
        self.received += o.received;
        self.deleted += o.deleted;
        self.dead_lettered += o.dead_lettered;
        self.redriven += o.redriven;
    }
}

/// One partition as a scrape sees it.
#[derive(Debug, Clone)]
pub struct PartitionSnapshot {
    pub queue_id: u64,
    pub partition: u32,
    pub counters: Counters,
    /// Age of the partition's oldest message not yet deleted (`None`: it holds none).
    pub oldest_age_ms: Option<u64>,
    pub ops: OpCounts,
    pub log: LogStats,
    pub segments: u64,
    pub size_bytes: u64,
}

/// One shard as a scrape sees it; travels over the mesh to shard 0.
#[derive(Debug, Clone, Default)]
pub struct ShardSnapshot {
    pub shard: usize,
    pub requests: Vec<(Action, RequestStats)>,
    pub errors: Vec<(ErrorKey, u64)>,
    pub durable_wait: RequestStats,
    pub send_to_receive: DelayStats,
    /// Quota refusals by kind, over every account (indexed by `QuotaKind::index`).
    pub quota_throttled: [u64; 3],
    /// Quota refusals per account: empty when per-queue labels are off
    /// (`metrics.queue_labels = false`), since they name accounts.
    pub quota_throttled_by_account: Vec<(String, QuotaKind, u64)>,
    /// Time the executor spent running tasks and polling I/O (not spinning or parked).
    pub busy: Duration,
    pub tasks_executed: u64,
    /// Consumers' reads ahead on this shard (`stream::readahead`), and the bytes they hold.
    pub readahead: crate::stream::readahead::ReadAheadStats,
    pub readahead_bytes: u64,
    pub partitions: Vec<PartitionSnapshot>,
    /// The shard's peer transport, in cluster mode (`crate::cluster::node`).
    pub peer: Option<crate::cluster::node::PeerSnapshot>,
}

/// This thread's counters plus the given partitions. On a glommio executor thread (a shard).
/// `account_labels`: the broker's `metrics_queue_labels` (per-account figures only with it).
pub fn local_snapshot(
    shard: usize,
    partitions: Vec<PartitionSnapshot>,
    account_labels: bool,
) -> ShardSnapshot {
    let stats = glommio::executor().executor_stats();
    LOCAL.with(|l| {
        l.busy.set(l.busy.get() + stats.total_runtime());
        l.tasks.set(l.tasks.get() + stats.tasks_executed());
    });
    thread_snapshot(shard, partitions, account_labels)
}

fn thread_snapshot(
    shard: usize,
    partitions: Vec<PartitionSnapshot>,
    account_labels: bool,
) -> ShardSnapshot {
    LOCAL.with(|l| ShardSnapshot {
        shard,
        requests: l
            .requests
            .borrow()
            .iter()
            .map(|(a, s)| (*a, s.clone()))
            .collect(),
        errors: l.errors.borrow().iter().map(|(e, n)| (*e, *n)).collect(),
        durable_wait: l.durable_wait.borrow().clone(),
        send_to_receive: l.send_to_receive.borrow().clone(),
        quota_throttled: {
            let mut by_kind = [0u64; 3];
            for counts in l.quota_throttled.borrow().values() {
                for (sum, n) in by_kind.iter_mut().zip(counts) {
                    *sum += n;
                }
            }
            by_kind
        },
        quota_throttled_by_account: if account_labels {
            l.quota_throttled
                .borrow()
                .iter()
                .flat_map(|(a, counts)| {
                    QuotaKind::ALL
                        .into_iter()
                        .filter(|q| counts[q.index()] > 0)
                        .map(|q| (a.clone(), q, counts[q.index()]))
                })
                .collect()
        } else {
            Vec::new()
        },
        busy: l.busy.get(),
        tasks_executed: l.tasks.get(),
        readahead: crate::stream::readahead::shard_stats(),
        readahead_bytes: crate::stream::readahead::reserved_bytes() as u64,
        partitions,
        peer: crate::cluster::node::local_snapshot(),
    })
}

/// A queue's labels: tenant and name.
pub struct QueueLabel {
    pub id: u64,
    pub tenant: String,
    pub name: String,
}

/// Escapes a label value (Prometheus text format: backslash, quote, newline).
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// The data disk's free space against the reserve under which sends stop (`crate::disk`).
pub fn render_disk(out: &mut String, free_bytes: u64, reserve_bytes: u64) {
    header(
        out,
        "sluice_disk_free_bytes",
        "gauge",
        "Free bytes on the data directory's file system.",
    );
    let _ = writeln!(out, "sluice_disk_free_bytes {free_bytes}");
    header(
        out,
        "sluice_disk_reserve_bytes",
        "gauge",
        "Free bytes under which sends are refused (disk_free_bytes_min).",
    );
    let _ = writeln!(out, "sluice_disk_reserve_bytes {reserve_bytes}");
    header(
        out,
        "sluice_disk_full",
        "gauge",
        "1 while free space is under the reserve: sends refused, receives and deletes go on.",
    );
    let _ = writeln!(
        out,
        "sluice_disk_full {}",
        u8::from(free_bytes < reserve_bytes)
    );
}

/// Renders the Prometheus text exposition (format 0.0.4).
pub fn render(
    snapshots: &[ShardSnapshot],
    queues: &[QueueLabel],
    uptime: Duration,
    ready: bool,
) -> String {
    let mut out = String::with_capacity(16 * 1024);
    header(
        &mut out,
        "sluice_uptime_seconds",
        "gauge",
        "Seconds since the broker started.",
    );
    let _ = writeln!(out, "sluice_uptime_seconds {:.3}", uptime.as_secs_f64());
    header(
        &mut out,
        "sluice_ready",
        "gauge",
        "1 when every shard has started.",
    );
    let _ = writeln!(out, "sluice_ready {}", u8::from(ready));
    header(
        &mut out,
        "sluice_shards",
        "gauge",
        "Shards (executors) answering this scrape.",
    );
    let _ = writeln!(out, "sluice_shards {}", snapshots.len());

    // ---- per queue (summed over partitions, wherever they live)
    let mut per_queue: HashMap<u64, (OpCounts, Counters)> = HashMap::new();
    let mut oldest_ms: HashMap<u64, u64> = HashMap::new();
    for s in snapshots {
        for p in &s.partitions {
            if let Some(age) = p.oldest_age_ms {
                let o = oldest_ms.entry(p.queue_id).or_default();
                *o = (*o).max(age);
            }
            let e = per_queue.entry(p.queue_id).or_default();
            e.0.add(&p.ops);
            e.1.visible += p.counters.visible;
            e.1.in_flight += p.counters.in_flight;
            e.1.delayed += p.counters.delayed;
            e.1.moving += p.counters.moving;
        }
    }
    type QueueFigure = (
        &'static str,
        &'static str,
        &'static str,
        fn(&(OpCounts, Counters)) -> u64,
    );
    let figures: [QueueFigure; 9] = [
        (
            "sluice_queue_messages_sent_total",
            "counter",
            "Messages accepted by SendMessage(Batch) since start.",
            |q| q.0.sent,
        ),
        (
            "sluice_queue_messages_received_total",
            "counter",
            "Messages delivered by ReceiveMessage since start.",
            |q| q.0.received,
        ),
        (
            "sluice_queue_messages_deleted_total",
            "counter",
            "Messages deleted by DeleteMessage(Batch) since start.",
            |q| q.0.deleted,
        ),
        (
            "sluice_queue_messages_dead_lettered_total",
            "counter",
            "Messages moved to the dead-letter queue (maxReceiveCount) since start.",
            |q| q.0.dead_lettered,
        ),
        (
            "sluice_queue_messages_redriven_total",
            "counter",
            "Messages moved out of this queue by redrive tasks since start.",
            |q| q.0.redriven,
        ),
        (
            "sluice_queue_messages_visible",
            "gauge",
            "Messages available for retrieval (ApproximateNumberOfMessages).",
            |q| q.1.visible,
        ),
        (
            "sluice_queue_messages_in_flight",
            "gauge",
            "Messages received and not yet deleted (ApproximateNumberOfMessagesNotVisible).",
            |q| q.1.in_flight,
        ),
        (
            "sluice_queue_messages_delayed",
            "gauge",
            "Messages delayed (ApproximateNumberOfMessagesDelayed).",
            |q| q.1.delayed,
        ),
        (
            "sluice_queue_messages_moving",
            "gauge",
            "Messages being moved to the dead-letter queue.",
            |q| q.1.moving,
        ),
    ];
    for (name, kind, help, get) in figures {
        header(&mut out, name, kind, help);
        for q in queues {
            let v = per_queue.get(&q.id).map_or(0, get);
            let _ = writeln!(
                out,
                "{name}{{tenant=\"{}\",queue=\"{}\"}} {v}",
                esc(&q.tenant),
                esc(&q.name)
            );
        }
    }

    let name = "sluice_queue_oldest_message_age_seconds";
    header(
        &mut out,
        name,
        "gauge",
        "Age of the oldest message not yet deleted, 0 when empty (ApproximateAgeOfOldestMessage; in a dead-letter queue, time since it arrived there).",
    );
    for q in queues {
        let age_ms = oldest_ms.get(&q.id).copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "{name}{{tenant=\"{}\",queue=\"{}\"}} {:.3}",
            esc(&q.tenant),
            esc(&q.name),
            age_ms as f64 / 1e3
        );
    }

    // ---- broker-wide message figures: one series each, whatever the queue count and whether
    // per-queue labels are on, so that dashboards and alerts work on a broker of 10,000 queues
    // scraped without them.
    let mut all = OpCounts::default();
    let mut oldest_all_ms = 0u64;
    for s in snapshots {
        for p in &s.partitions {
            all.add(&p.ops);
            oldest_all_ms = oldest_all_ms.max(p.oldest_age_ms.unwrap_or(0));
        }
    }
    type BrokerFigure = (&'static str, &'static str, u64);
    let broker_figures: [BrokerFigure; 5] = [
        (
            "sluice_messages_sent_total",
            "Messages accepted by sends, over every queue, since start.",
            all.sent,
        ),
        (
            "sluice_messages_received_total",
            "Messages delivered by receives, over every queue, since start.",
            all.received,
        ),
        (
            "sluice_messages_deleted_total",
            "Messages deleted, over every queue, since start.",
            all.deleted,
        ),
        (
            "sluice_messages_dead_lettered_total",
            "Messages moved to a dead-letter queue (maxReceiveCount), over every queue, since start.",
            all.dead_lettered,
        ),
        (
            "sluice_messages_redriven_total",
            "Messages moved out of dead-letter queues by redrive tasks since start.",
            all.redriven,
        ),
    ];
    for (name, help, v) in broker_figures {
        header(&mut out, name, "counter", help);
        let _ = writeln!(out, "{name} {v}");
    }
    let name = "sluice_oldest_message_age_seconds";
    header(
        &mut out,
        name,
        "gauge",
        "Age of the oldest message not yet deleted in any queue, 0 when all are empty (the largest sluice_queue_oldest_message_age_seconds).",
    );
    let _ = writeln!(out, "{name} {:.3}", oldest_all_ms as f64 / 1e3);

    // ---- per shard: requests
    header(
        &mut out,
        "sluice_requests_total",
        "counter",
        "Requests answered, by shard, front end and action.",
    );
    for s in snapshots {
        for (a, r) in &s.requests {
            let _ = writeln!(
                out,
                "sluice_requests_total{{shard=\"{}\",frontend=\"{}\",action=\"{}\"}} {}",
                s.shard,
                a.front_end(),
                a.name(),
                r.count
            );
        }
    }
    header(
        &mut out,
        "sluice_request_errors_total",
        "counter",
        "Requests answered with an error, by shard, front end and error code.",
    );
    for s in snapshots {
        for (e, n) in &s.errors {
            let _ = writeln!(
                out,
                "sluice_request_errors_total{{shard=\"{}\",frontend=\"{}\",code=\"{}\"}} {n}",
                s.shard,
                e.front_end(),
                e.name()
            );
        }
    }
    header(
        &mut out,
        "sluice_request_duration_seconds",
        "histogram",
        "Time from a request's decoding to its answer (long polls included).",
    );
    for s in snapshots {
        for (a, r) in &s.requests {
            let labels = format!(
                "shard=\"{}\",frontend=\"{}\",action=\"{}\"",
                s.shard,
                a.front_end(),
                a.name()
            );
            histogram(&mut out, "sluice_request_duration_seconds", &labels, r);
        }
    }
    header(
        &mut out,
        "sluice_log_durable_wait_seconds",
        "histogram",
        "Time from staging a partition command's records to their fdatasync (group-commit wait, write and fsync).",
    );
    for s in snapshots {
        let labels = format!("shard=\"{}\"", s.shard);
        histogram(
            &mut out,
            "sluice_log_durable_wait_seconds",
            &labels,
            &s.durable_wait,
        );
    }
    header(
        &mut out,
        "sluice_message_send_to_receive_seconds",
        "histogram",
        "Time from a message's send to its first delivery (publish→receive latency: the wait in the queue included; a delayed message's delay too).",
    );
    for s in snapshots {
        let labels = format!("shard=\"{}\"", s.shard);
        let d = &s.send_to_receive;
        histogram_of(
            &mut out,
            "sluice_message_send_to_receive_seconds",
            &labels,
            &DELAY_BUCKETS_US,
            &d.buckets,
            d.sum_us,
            d.count,
        );
    }
    let name = "sluice_quota_throttled_total";
    header(
        &mut out,
        name,
        "counter",
        "Requests refused by a per-account quota (RequestThrottled), over every account, by quota.",
    );
    for q in QuotaKind::ALL {
        let n: u64 = snapshots.iter().map(|s| s.quota_throttled[q.index()]).sum();
        let _ = writeln!(out, "{name}{{quota=\"{}\"}} {n}", q.name());
    }
    let mut by_account: std::collections::BTreeMap<(&str, QuotaKind), u64> =
        std::collections::BTreeMap::new();
    for s in snapshots {
        for (a, q, n) in &s.quota_throttled_by_account {
            *by_account.entry((a.as_str(), *q)).or_default() += n;
        }
    }
    let name = "sluice_account_quota_throttled_total";
    header(
        &mut out,
        name,
        "counter",
        "Requests refused by a quota, per account that was refused at least once (left out without per-queue labels).",
    );
    for ((a, q), n) in by_account {
        let _ = writeln!(
            out,
            "{name}{{tenant=\"{}\",quota=\"{}\"}} {n}",
            esc(a),
            q.name()
        );
    }
    header(
        &mut out,
        "sluice_log_fsync_duration_seconds",
        "histogram",
        "Time of each group commit's durable (O_DSYNC) write in the shard's queue partition logs (measured in storage around the write).",
    );
    for s in snapshots {
        let mut h = FsyncHistogram::default();
        for p in &s.partitions {
            h.add(&p.log.fsync);
        }
        let labels = format!("shard=\"{}\"", s.shard);
        histogram_of(
            &mut out,
            "sluice_log_fsync_duration_seconds",
            &labels,
            &FSYNC_BUCKETS_US,
            &h.buckets,
            h.sum_us,
            h.count,
        );
    }
    header(
        &mut out,
        "sluice_shard_busy_seconds_total",
        "counter",
        "Time the shard's executor ran tasks or polled I/O (rate() = core utilisation; spinning and parking excluded).",
    );
    for s in snapshots {
        let _ = writeln!(
            out,
            "sluice_shard_busy_seconds_total{{shard=\"{}\"}} {:.6}",
            s.shard,
            s.busy.as_secs_f64()
        );
    }
    header(
        &mut out,
        "sluice_shard_tasks_executed_total",
        "counter",
        "Tasks the shard's executor ran.",
    );
    for s in snapshots {
        let _ = writeln!(
            out,
            "sluice_shard_tasks_executed_total{{shard=\"{}\"}} {}",
            s.shard, s.tasks_executed
        );
    }

    type ReadAheadFigure = (
        &'static str,
        &'static str,
        &'static str,
        fn(&ShardSnapshot) -> u64,
    );
    let readahead: [ReadAheadFigure; 5] = [
        (
            "sluice_stream_readahead_reads_total",
            "counter",
            "Reads ahead started for consumers behind a partition's tail (a full fetch answer starts one).",
            |s| s.readahead.started,
        ),
        (
            "sluice_stream_readahead_hits_total",
            "counter",
            "Fetches answered from a read ahead.",
            |s| s.readahead.hits,
        ),
        (
            "sluice_stream_readahead_over_budget_total",
            "counter",
            "Reads ahead not started because the shard's read-ahead memory was spent.",
            |s| s.readahead.over_budget,
        ),
        (
            "sluice_stream_readahead_expired_total",
            "counter",
            "Completed reads ahead dropped untaken (the consumer stopped, sought elsewhere, or a newer one replaced them).",
            |s| s.readahead.expired,
        ),
        (
            "sluice_stream_readahead_bytes",
            "gauge",
            "Bytes the shard's reads ahead hold or have reserved.",
            |s| s.readahead_bytes,
        ),
    ];
    for (name, kind, help, f) in readahead {
        header(&mut out, name, kind, help);
        for s in snapshots {
            let _ = writeln!(out, "{name}{{shard=\"{}\"}} {}", s.shard, f(s));
        }
    }

    // ---- per shard: storage (summed over the shard's partitions)
    type LogFigure = (
        &'static str,
        &'static str,
        &'static str,
        fn(&PartitionSnapshot) -> u64,
    );
    let logs: [LogFigure; 10] = [
        (
            "sluice_partitions",
            "gauge",
            "Queue partitions open on the shard.",
            |_| 1,
        ),
        (
            "sluice_log_segments",
            "gauge",
            "Log segments of the shard's partitions.",
            |p| p.segments,
        ),
        (
            "sluice_log_size_bytes",
            "gauge",
            "Bytes in the log segments of the shard's partitions.",
            |p| p.size_bytes,
        ),
        (
            "sluice_log_bytes_appended_total",
            "counter",
            "Bytes appended to the shard's partition logs since they opened.",
            |p| p.log.bytes_appended,
        ),
        (
            "sluice_log_batches_appended_total",
            "counter",
            "Batches appended since the logs opened.",
            |p| p.log.batches_appended,
        ),
        (
            "sluice_log_commits_total",
            "counter",
            "Group commits (one write + one fdatasync each) since the logs opened.",
            |p| p.log.commits,
        ),
        (
            "sluice_log_commits_overlapped_total",
            "counter",
            "Group commits started while another was on its way to the disk.",
            |p| p.log.commits_overlapped,
        ),
        (
            "sluice_log_fsyncs_total",
            "counter",
            "Group-commit durable writes and fdatasync calls since the logs opened.",
            |p| p.log.fsyncs,
        ),
        (
            "sluice_log_commit_failures_total",
            "counter",
            "Failed commits (write or fdatasync errors).",
            |p| p.log.commit_failures,
        ),
        (
            "sluice_log_corruptions_detected_total",
            "counter",
            "Corrupt batches found on read.",
            |p| p.log.corruptions_detected,
        ),
    ];
    for (name, kind, help, get) in logs {
        header(&mut out, name, kind, help);
        for s in snapshots {
            let v: u64 = s.partitions.iter().map(get).sum();
            let _ = writeln!(out, "{name}{{shard=\"{}\"}} {v}", s.shard);
        }
    }
    let peers: Vec<_> = snapshots
        .iter()
        .filter_map(|s| s.peer.as_ref().map(|p| (s.shard, p)))
        .collect();
    crate::cluster::node::render(&mut out, &peers);
    out
}

/// One histogram's series: cumulative buckets, sum and count.
fn histogram(out: &mut String, name: &str, labels: &str, r: &RequestStats) {
    histogram_of(
        out,
        name,
        labels,
        &LATENCY_BUCKETS_US,
        &r.buckets,
        r.duration_us_sum,
        r.count,
    );
}

/// A histogram from per-bucket counts (`buckets` has one more slot than `bounds_us`: +Inf).
fn histogram_of(
    out: &mut String,
    name: &str,
    labels: &str,
    bounds_us: &[u64],
    buckets: &[u64],
    sum_us: u64,
    count: u64,
) {
    debug_assert_eq!(buckets.len(), bounds_us.len() + 1);
    let mut cumulative = 0;
    for (le, n) in bounds_us.iter().zip(buckets) {
        cumulative += n;
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels},le=\"{}\"}} {cumulative}",
            *le as f64 / 1e6
        );
    }
    cumulative += buckets.last().copied().unwrap_or(0);
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", sum_us as f64 / 1e6);
    let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
}

/// One consumer group's position on one partition, for the lag series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupLagFigure {
    pub tenant: String,
    pub group: String,
    /// A topic's name, or `queue:<name>` for a queue read as a stream.
    pub topic: String,
    pub partition: u32,
    pub lag: u64,
}

/// Lag series are bounded: at most this many (group, partition) pairs per scrape; the rest is
/// left out and `sluice_group_lag_truncated` says so.
pub const GROUP_LAG_SERIES_MAX: usize = 10_000;

/// Renders consumer-group lag: per (group, topic) summed, and per partition.
pub fn render_group_lag(out: &mut String, lags: &[GroupLagFigure], truncated: bool) {
    let mut per_topic: std::collections::BTreeMap<(&str, &str, &str), u64> =
        std::collections::BTreeMap::new();
    for l in lags {
        *per_topic
            .entry((l.tenant.as_str(), l.group.as_str(), l.topic.as_str()))
            .or_default() += l.lag;
    }
    let name = "sluice_group_lag";
    header(
        out,
        name,
        "gauge",
        "Records produced and not yet committed by a consumer group, per topic (latest offset minus committed, summed over partitions).",
    );
    for ((tenant, group, topic), lag) in per_topic {
        let _ = writeln!(
            out,
            "{name}{{tenant=\"{}\",group=\"{}\",topic=\"{}\"}} {lag}",
            esc(tenant),
            esc(group),
            esc(topic)
        );
    }
    let name = "sluice_group_partition_lag";
    header(
        out,
        name,
        "gauge",
        "Records produced and not yet committed by a consumer group, per partition.",
    );
    for l in lags {
        let _ = writeln!(
            out,
            "{name}{{tenant=\"{}\",group=\"{}\",topic=\"{}\",partition=\"{}\"}} {}",
            esc(&l.tenant),
            esc(&l.group),
            esc(&l.topic),
            l.partition,
            l.lag
        );
    }
    header(
        out,
        "sluice_group_lag_truncated",
        "gauge",
        "1 when the lag series were cut short (more group partitions than the scrape renders, or the coordinator did not answer in time).",
    );
    let _ = writeln!(out, "sluice_group_lag_truncated {}", u8::from(truncated));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_lands_in_its_bucket_and_renders_cumulatively() {
        record_request(Action::Sqs("SendMessage"), Duration::from_micros(300), None);
        record_request(
            Action::Sqs("SendMessage"),
            Duration::from_secs(60),
            Some(ErrorKey::Sqs("QueueDoesNotExist")),
        );
        let snap = thread_snapshot(3, Vec::new(), true);
        let text = render(&[snap], &[], Duration::from_secs(1), true);
        let labels = "shard=\"3\",frontend=\"http\",action=\"SendMessage\"";
        assert!(text.contains(&format!("sluice_requests_total{{{labels}}} 2")));
        assert!(text.contains(&format!(
            "sluice_request_duration_seconds_bucket{{{labels},le=\"0.00025\"}} 0"
        )));
        assert!(text.contains(&format!(
            "sluice_request_duration_seconds_bucket{{{labels},le=\"0.0005\"}} 1"
        )));
        assert!(text.contains(&format!(
            "sluice_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} 2"
        )));
        assert!(text.contains(
            "sluice_request_errors_total{shard=\"3\",frontend=\"http\",code=\"QueueDoesNotExist\"} 1"
        ));
    }

    #[test]
    fn quota_refusals_name_a_bounded_number_of_accounts() {
        std::thread::spawn(|| {
            let extra = 5;
            for i in 0..QUOTA_ACCOUNTS_COUNTED_MAX + extra {
                record_quota_throttled(&format!("{i:012}"), QuotaKind::Requests);
            }
            record_quota_throttled("000000000000", QuotaKind::Bytes);
            let snap = thread_snapshot(0, Vec::new(), true);
            assert_eq!(
                snap.quota_throttled,
                [(QUOTA_ACCOUNTS_COUNTED_MAX + extra) as u64, 1, 0]
            );
            let accounts: std::collections::HashSet<&str> = snap
                .quota_throttled_by_account
                .iter()
                .map(|(a, _, _)| a.as_str())
                .collect();
            assert_eq!(
                accounts.len(),
                QUOTA_ACCOUNTS_COUNTED_MAX + 1,
                "named + other"
            );
            let other: u64 = snap
                .quota_throttled_by_account
                .iter()
                .filter(|(a, _, _)| a == QUOTA_OTHER_ACCOUNTS)
                .map(|(_, _, n)| n)
                .sum();
            assert_eq!(other, extra as u64);
            let text = render(&[snap], &[], Duration::from_secs(1), true);
            assert!(text.contains("sluice_quota_throttled_total{quota=\"bytes_per_s\"} 1"));
            let unlabelled = thread_snapshot(0, Vec::new(), false);
            assert!(unlabelled.quota_throttled_by_account.is_empty());
        })
        .join()
        .expect("test thread");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
