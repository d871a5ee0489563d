//! The load generator: producers and consumers over several connections to one [`Target`],
//! open loop (a fixed arrival rate, steady or bursty), closed loop (as fast as acks come back,
//! `in_flight` batches per producer), or round trips (each producer, on a fixed schedule, sends
//! a batch, receives it back with short polls and deletes it: one request of each kind at a
//! time, so each call's latency is its round trip on an otherwise idle connection).
//!
//! - **No coordinated omission.** In open loop every batch has an *intended* send time from the
//!   arrival schedule, fixed before anything is sent; sends do not wait for earlier acks, and every
//!   latency is measured from that intended time, so a stall of the target (or of the generator)
//!   shows as latency instead of silently lowering the offered load.
//! - **End to end.** Each body starts with a 40-byte ASCII header — producer id, sequence number,
//!   intended send time (ns since the run's epoch) — so consumers measure publish→receive latency
//!   per message and check delivery: per group, every acknowledged send must be received (lost),
//!   once (duplicates). The header is text because SQS bodies are strings.
//! - **Bounded.** Producers stop at the end of the measured window or at `messages_max`;
//!   consumers stop when their group has everything or `drain` after the producers stopped.
//! - **Warm-up excluded**: latencies of messages intended before the warm-up ended, and
//!   throughput of events outside the measured window, are not counted.
//!
//! Everything runs as local tasks on the caller's (single-threaded) tokio runtime. Open-loop
//! sends are woken by [`crate::clock::Clock`] (tokio's own timer is millisecond-grained); what
//! lag remains — the clock's slack and a busy runtime — is reported as `send_lag` and counts in
//! every latency (the floors are measured the same way).

use crate::cpu::{CpuSample, CpuSeconds};
use crate::target::{Conn, OutMsg, Shape, Target};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Producer id (8 hex), sequence (16 hex), intended send time in ns since the epoch (16 hex).
pub const HEADER_BYTES: usize = 40;
/// Batches in flight per open-loop producer before it waits (the wait shows as latency)...
const OPEN_IN_FLIGHT_MAX: usize = 4096;
/// ...and at most this many body bytes in flight per open-loop producer. Without it a stall
/// of the system under test made the generator build and hold up to 4,096 batches of 2 MiB
/// each: its thread went to clearing fresh pages and never caught up again.
const OPEN_IN_FLIGHT_BYTES_MAX: usize = 64 << 20;
/// Distinct topic keys (spread over the partitions).
const TOPIC_KEYS: u64 = 1024;
/// Longest latency a histogram holds, µs (longer values are clamped, not dropped).
const LATENCY_US_MAX: u64 = 3_600_000_000;
/// Points kept of each percentile curve.
const CURVE_POINTS_MAX: usize = 400;
/// Round-trip mode: how long a producer keeps short-polling for the messages it just sent.
const ROUND_TRIP_RECEIVE_CHASE: Duration = Duration::from_secs(2);
/// A producer held back by `backlog_max` looks again at least this often (a receive wakes it
/// sooner; this covers a wake-up that came between its look and its wait).
const BACKLOG_RECHECK: Duration = Duration::from_millis(5);
/// A consume-only run's backlog must be written within this (it is not measured).
const BACKLOG_FILL_MAX: Duration = Duration::from_secs(300);

#[derive(Debug, Clone)]
pub enum Mode {
    Open {
        rate_per_s: f64,
    },
    Closed {
        in_flight: usize,
        /// Producers wait while more messages than this are sent but not yet received by
        /// every group (`None`: no bound).
        backlog_max: Option<u64>,
    },
    /// Round trips: `rate_per_s` messages per second in all, each producer one
    /// send → receive → delete cycle at a time on its schedule; consumers only drain what is
    /// left once the producers stopped.
    RoundTrip {
        rate_per_s: f64,
    },
}

/// What a run measures: both sides at once, or one side alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    /// Producers and consumers together (the default).
    #[default]
    Mixed,
    /// Producers alone: nothing is received, no delivery check; CPU per produced record.
    ProduceOnly,
    /// A backlog first (`messages_max` records, closed loop, not measured), then consumers
    /// alone read it: the window starts when they start; CPU per consumed record.
    ConsumeOnly,
}

#[derive(Debug, Clone, Copy)]
pub enum Arrival {
    Uniform,
    Poisson,
}

/// How the arrival rate moves around its mean.
#[derive(Debug, Clone)]
pub enum Profile {
    Steady {
        arrival: Arrival,
    },
    /// A square wave whose mean is the scenario's rate: `peak_to_average` × mean for a share of
    /// each period, `low_to_average` × mean for the rest (the share follows from the mean).
    Bursty {
        peak_to_average: f64,
        low_to_average: f64,
        period: Duration,
        arrival: Arrival,
    },
}

impl Profile {
    /// The rate at `t` since the start, as a multiple of the mean rate.
    pub fn factor(&self, t: Duration) -> f64 {
        match self {
            Profile::Steady { .. } => 1.0,
            Profile::Bursty {
                peak_to_average,
                low_to_average,
                period,
                ..
            } => {
                let phase = (t.as_secs_f64() / period.as_secs_f64()).fract();
                if phase < self.peak_share() {
                    *peak_to_average
                } else {
                    *low_to_average
                }
            }
        }
    }

    /// The share of each period spent at the peak (so that the mean is 1).
    pub fn peak_share(&self) -> f64 {
        match self {
            Profile::Steady { .. } => 1.0,
            Profile::Bursty {
                peak_to_average: p,
                low_to_average: l,
                ..
            } => (1.0 - l) / (p - l),
        }
    }

    fn arrival(&self) -> Arrival {
        match self {
            Profile::Steady { arrival } | Profile::Bursty { arrival, .. } => *arrival,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Profile::Steady { arrival } => format!("steady ({arrival:?} arrivals)"),
            Profile::Bursty {
                peak_to_average,
                low_to_average,
                period,
                arrival,
            } => format!(
                "bursty: {peak_to_average}x the mean for {:.0}% of each {:.1} s, {low_to_average}x otherwise ({arrival:?} arrivals)",
                100.0 * self.peak_share(),
                period.as_secs_f64()
            ),
        }
    }
}

#[derive(Debug, Clone)]
pub enum SizeDist {
    Fixed(usize),
    /// Log-normal around `mean` (log-space deviation `sigma`), clamped to `[min, max]`.
    LogNormal {
        mean: usize,
        sigma: f64,
        min: usize,
        max: usize,
    },
}

impl SizeDist {
    pub fn max(&self) -> usize {
        match self {
            SizeDist::Fixed(n) => *n,
            SizeDist::LogNormal { max, .. } => *max,
        }
    }

    pub fn mean(&self) -> usize {
        match self {
            SizeDist::Fixed(n) => *n,
            SizeDist::LogNormal { mean, .. } => *mean,
        }
    }

    fn draw(&self, rng: &mut SmallRng) -> usize {
        match *self {
            SizeDist::Fixed(n) => n,
            SizeDist::LogNormal {
                mean,
                sigma,
                min,
                max,
            } => {
                // Box-Muller; mu chosen so that the unclamped mean is `mean`.
                let (u1, u2): (f64, f64) = (rng.gen_range(f64::EPSILON..1.0), rng.gen());
                let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                let mu = (mean as f64).ln() - sigma * sigma / 2.0;
                ((mu + sigma * z).exp() as usize).clamp(min, max)
            }
        }
    }

    pub fn describe(&self) -> String {
        match self {
            SizeDist::Fixed(n) => format!("{n} B"),
            SizeDist::LogNormal {
                mean,
                sigma,
                min,
                max,
            } => format!("log-normal, mean {mean} B, sigma {sigma}, clamped to [{min}, {max}] B"),
        }
    }
}

/// Everything one run of one case against one target needs.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub mode: Mode,
    pub phase: Phase,
    pub profile: Profile,
    pub producers: usize,
    pub consumers: usize,
    pub connections: usize,
    pub batch: usize,
    pub receive_max: usize,
    pub receive_wait: Duration,
    pub warmup: Duration,
    pub duration: Duration,
    pub messages_max: Option<u64>,
    pub drain: Duration,
    pub size: SizeDist,
    pub shape: Shape,
    pub seed: u64,
}

impl LoadSpec {
    /// Topic consumer groups, or 1 (queues have one set of competing consumers).
    pub fn groups_read(&self) -> u32 {
        if self.phase == Phase::ProduceOnly {
            return 0;
        }
        match self.shape {
            Shape::Topic { groups, .. } => groups,
            _ => 1,
        }
    }

    /// The longest a run may take: warm-up, measurement, drain, and slack for setup.
    pub fn deadline(&self) -> Duration {
        let fill = if self.phase == Phase::ConsumeOnly {
            BACKLOG_FILL_MAX
        } else {
            Duration::ZERO
        };
        fill + self.warmup + self.duration + self.drain + Duration::from_secs(30)
    }
}

/// Latency percentiles of one histogram, µs, with the curve for percentile plots.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Pcts {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub p9999_us: u64,
    pub max_us: u64,
    /// (percentile 0–100, µs) points, HdrHistogram-style.
    pub curve: Vec<(f64, u64)>,
}

impl Pcts {
    pub fn of(h: &Histogram<u64>) -> Pcts {
        if h.is_empty() {
            return Pcts::default();
        }
        let mut curve: Vec<(f64, u64)> = h
            .iter_quantiles(4)
            .map(|v| (100.0 * v.quantile_iterated_to(), v.value_iterated_to()))
            .collect();
        if curve.len() > CURVE_POINTS_MAX {
            let step = curve.len().div_ceil(CURVE_POINTS_MAX);
            let last = *curve.last().expect("non-empty");
            curve = curve.into_iter().step_by(step).collect();
            curve.push(last);
        }
        Pcts {
            count: h.len(),
            mean_us: h.mean(),
            p50_us: h.value_at_quantile(0.5),
            p90_us: h.value_at_quantile(0.9),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            p9999_us: h.value_at_quantile(0.9999),
            max_us: h.max(),
            curve,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Latencies {
    /// Publish→receive, from the intended send time to the consumer holding the message.
    pub end_to_end: Pcts,
    /// From the intended send time to the send's ack (per send call).
    pub send_ack: Pcts,
    /// From the actual start of a send call to its ack.
    pub send_call: Pcts,
    /// How late the generator started sends against their intended time.
    pub send_lag: Pcts,
    pub receive_call: Pcts,
    pub ack_call: Pcts,
}

#[derive(Debug, Clone, Serialize)]
pub struct GroupResult {
    pub group: u32,
    /// Distinct messages received.
    pub received: u64,
    /// Receipts of a message already received by this group.
    pub duplicates: u64,
    /// Acknowledged sends this group never received before its drain deadline.
    pub lost: u64,
    /// Received messages whose send was not acknowledged (the send failed or timed out).
    pub unacknowledged_received: u64,
    /// Bodies without this run's header.
    pub foreign: u64,
    pub receive_msgs_per_s: f64,
    pub receive_mb_per_s: f64,
    /// Messages acknowledged (deleted / committed) per second in the measured window.
    pub ack_msgs_per_s: f64,
}

/// The outcome of one case against one target.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub target: String,
    pub fsync_policy: String,
    pub case: String,
    pub shape: String,
    pub mode: String,
    pub offered_rate_per_s: Option<f64>,
    pub profile: String,
    pub size: String,
    pub seed: u64,
    pub producers: usize,
    pub consumers_per_group: usize,
    pub connections: usize,
    pub batch: usize,
    pub warmup_s: f64,
    pub measured_s: f64,
    /// Messages whose send was acknowledged (whole run, warm-up included).
    pub sent: u64,
    pub send_errors: u64,
    pub receive_errors: u64,
    pub ack_errors: u64,
    /// Receive calls that returned no message.
    pub receives_empty: u64,
    pub first_error: Option<String>,
    pub mean_body_bytes: f64,
    /// Acknowledged sends per second in the measured window.
    pub send_msgs_per_s: f64,
    /// CPU seconds the server used in the measured window (see `cpu.rs` for what is counted);
    /// `None` where this run cannot see the server (an external broker).
    pub server_cpu_s: Option<f64>,
    /// `server_cpu_s` per message sent in the window, in µs: what one message costs the
    /// server at this load (sent, received and acknowledged).
    pub server_cpu_us_per_msg: Option<f64>,
    /// CPU seconds the load generator used in the window: this process's threads but the
    /// in-process broker's (its QUIC or TCP client, its kernel work, its bookkeeping).
    pub generator_cpu_s: Option<f64>,
    pub generator_cpu_us_per_msg: Option<f64>,
    /// CPU seconds every task on the machine ran in the window, over all its cores (the sum
    /// of every thread's `schedstat`: server, generator, kernel workers, anything else
    /// running). Per message, it is what the machine's cores must cover for each message:
    /// `machine_cores × 10⁶ / machine_cpu_us_per_msg` is the most this machine could send at
    /// this cost per message.
    pub machine_cpu_s: Option<f64>,
    pub machine_cpu_us_per_msg: Option<f64>,
    /// What the run measured: "mixed", "produce-only" or "consume-only".
    pub phase: String,
    /// Records received in the window, summed over groups (every delivery, fan-out counted).
    pub received_window: u64,
    /// `server_cpu_s` per record received in the window, µs (a consume-only run's cost of a
    /// consumed record; in a mixed run it carries the produce side too).
    pub server_cpu_us_per_received: Option<f64>,
    pub generator_cpu_us_per_received: Option<f64>,
    pub machine_cpu_us_per_received: Option<f64>,
    pub send_mb_per_s: f64,
    pub groups: Vec<GroupResult>,
    pub latency: Latencies,
    /// Some group still missed messages when its drain deadline passed.
    pub drain_timed_out: bool,
    /// The measured window in [`TIMELINE_SLICE_MS`] slices: where in the run a tail was made.
    pub timeline: Vec<Slice>,
    /// When the measured window (the timeline's `t_ms` 0) began, ms since the Unix epoch: to
    /// line a run up with traces taken beside it (`perf trace`, block events).
    pub window_start_unix_ms: u64,
}

/// The width of a [`Slice`] of the timeline, ms.
pub const TIMELINE_SLICE_MS: u64 = 100;

/// One slice of a run's measured window. Calls count in the slice they started in; messages in
/// the slice of their intended send time.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Slice {
    /// Start of the slice, ms after the warm-up.
    pub t_ms: u64,
    pub send_calls: u64,
    pub send_call_max_us: u64,
    pub ack_calls: u64,
    pub ack_call_max_us: u64,
    /// Messages received (first receipt) whose intended send time is in the slice.
    pub received: u64,
    pub end_to_end_max_us: u64,
    /// Of `received`, those over 5 ms publish→receive.
    pub end_to_end_over_5ms: u64,
}

impl RunResult {
    pub fn lost(&self) -> u64 {
        self.groups.iter().map(|g| g.lost).sum()
    }
    pub fn duplicates(&self) -> u64 {
        self.groups.iter().map(|g| g.duplicates).sum()
    }
    /// Messages per second all the way through (sent, received and acknowledged by every
    /// group): the lowest of the send rate and each group's ack rate.
    pub fn through_msgs_per_s(&self) -> f64 {
        self.groups
            .iter()
            .map(|g| g.ack_msgs_per_s)
            .fold(self.send_msgs_per_s, f64::min)
    }
    /// Bytes out per second summed over groups (fan-out egress).
    pub fn egress_mb_per_s(&self) -> f64 {
        self.groups.iter().map(|g| g.receive_mb_per_s).sum()
    }
}

/// A growable bitset of sequence numbers.
#[derive(Default, Clone)]
struct Bits(Vec<u64>);

impl Bits {
    /// Sets bit `i`; returns whether it was already set.
    fn set(&mut self, i: u64) -> bool {
        let (w, b) = ((i / 64) as usize, i % 64);
        if self.0.len() <= w {
            self.0.resize(w + 1, 0);
        }
        let was = self.0[w] & (1 << b) != 0;
        self.0[w] |= 1 << b;
        was
    }
    fn word(&self, w: usize) -> u64 {
        self.0.get(w).copied().unwrap_or(0)
    }
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid histogram bounds")
}

fn us(d: Duration) -> u64 {
    d.as_micros().min(u128::from(LATENCY_US_MAX)) as u64
}

#[derive(Default)]
struct GroupState {
    /// Per producer: sequences received.
    seen: Vec<Bits>,
    unique: u64,
    duplicates: u64,
    foreign: u64,
    recv_window: u64,
    recv_bytes_window: u64,
    acked_window: u64,
}

struct Stats {
    e2e: Histogram<u64>,
    send_ack: Histogram<u64>,
    send_call: Histogram<u64>,
    send_lag: Histogram<u64>,
    receive_call: Histogram<u64>,
    ack_call: Histogram<u64>,
    /// Receive calls that returned nothing (round-trip mode: not in `receive_call`).
    receives_empty: u64,
    /// Per producer: sequences whose send was acknowledged.
    sent_ok: Vec<Bits>,
    sent: u64,
    sent_failed_msgs: u64,
    sent_bytes: u64,
    sent_window: u64,
    sent_bytes_window: u64,
    send_errors: u64,
    receive_errors: u64,
    ack_errors: u64,
    first_error: Option<String>,
    groups: Vec<GroupState>,
    timeline: Vec<Slice>,
}

impl Stats {
    /// The timeline's slice for `at_ns` (ns after the epoch), if inside the measured window.
    fn slice(&mut self, warm_ns: u64, at_ns: u64) -> Option<&mut Slice> {
        let i = at_ns.checked_sub(warm_ns)? / (TIMELINE_SLICE_MS * 1_000_000);
        self.timeline.get_mut(i as usize)
    }

    fn error(&mut self, what: &str, e: impl std::fmt::Display) {
        if self.first_error.is_none() {
            self.first_error = Some(format!("{what}: {e}"));
        }
    }
}

struct Shared {
    name: String,
    spec: LoadSpec,
    epoch: Instant,
    /// The measured window; a consume-only run sets it when its consumers start.
    warm_end: Cell<Instant>,
    measure_end: Cell<Instant>,
    /// Messages handed out to producers so far (bounded by `messages_max`).
    allotted: Cell<u64>,
    producers_running: Cell<usize>,
    producers_done_at: Cell<Option<Instant>>,
    stats: RefCell<Stats>,
    /// Filler the bodies are cut from.
    filler: String,
    /// The FIFO group ids (`g<i>`) or topic keys (`k<i>`), made once.
    keys: Vec<String>,
    /// Wakes open-loop producers at their intended instants (tokio's timer is ms-grained).
    clock: crate::clock::Clock,
    /// Notified when consumers received messages: producers held back by `backlog_max`.
    backlog_freed: tokio::sync::Notify,
    /// Consume-only: when every group had every record (the window ends there if sooner).
    all_received_at: Cell<Option<Instant>>,
    all_received: tokio::sync::Notify,
}

impl Shared {
    /// Messages handed to producers and not yet received by every group (a send in flight
    /// counts: the bound is on what the queue may hold, whatever the acks' timing).
    fn backlog(&self) -> u64 {
        let st = self.stats.borrow();
        let received = st.groups.iter().map(|g| g.unique).min().unwrap_or(0);
        self.allotted.get().saturating_sub(received)
    }

    /// Takes up to `n` messages from the run's budget.
    fn allot(&self, n: usize) -> usize {
        let max = self.spec.messages_max.unwrap_or(u64::MAX);
        let left = max.saturating_sub(self.allotted.get());
        let n = (n as u64).min(left);
        self.allotted.set(self.allotted.get() + n);
        n as usize
    }

    /// A body: the 40-byte header written in place, then filler (one allocation, no
    /// formatting: at 100k messages/s the generator's own CPU shows in every figure).
    fn body(&self, producer: u32, seq: u64, intended: Instant, size: usize) -> Vec<u8> {
        let ns = intended.saturating_duration_since(self.epoch).as_nanos() as u64;
        let fill = size.saturating_sub(HEADER_BYTES).min(self.filler.len());
        let mut b = Vec::with_capacity(HEADER_BYTES + fill);
        push_hex(&mut b, u64::from(producer), 8);
        push_hex(&mut b, seq, 16);
        push_hex(&mut b, ns, 16);
        b.extend_from_slice(&self.filler.as_bytes()[..fill]);
        b
    }

    /// A scheduled producer's next batch: waits until its intended time `t` and takes its
    /// size from the budget; `None` once the window or the budget is over.
    async fn slot(&self, t: Instant) -> Option<usize> {
        if t >= self.measure_end.get() {
            return None;
        }
        let n = self.allot(self.spec.batch);
        if n == 0 {
            return None;
        }
        self.clock.sleep_until(t).await;
        Some(n)
    }

    fn group_key(&self, producer: u32, seq: u64, rng: &mut SmallRng) -> Option<String> {
        let i = match self.spec.shape {
            Shape::Standard => return None,
            Shape::Fifo { groups } => {
                (seq.wrapping_mul(self.spec.producers as u64) + u64::from(producer))
                    % u64::from(groups)
            }
            Shape::Topic { .. } => rng.gen_range(0..TOPIC_KEYS),
        };
        self.keys.get(i as usize).cloned()
    }

    /// `t` in ns since the run's epoch (the timeline's and the message headers' clock).
    fn epoch_ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    fn in_window(&self, t: Instant) -> bool {
        t >= self.warm_end.get() && t < self.measure_end.get()
    }

    /// Sends one batch and records its outcome. `intended` is when the schedule wanted it sent.
    async fn send_batch(
        &self,
        conn: &dyn Conn,
        producer: u32,
        first_seq: u64,
        msgs: Vec<OutMsg>,
        intended: Instant,
    ) {
        let start = Instant::now();
        let r = conn.send(&self.name, &msgs).await;
        let done = Instant::now();
        let mut st = self.stats.borrow_mut();
        let measured = intended >= self.warm_end.get();
        if measured {
            st.send_lag
                .saturating_record(us(start - intended.min(start)));
        }
        match r {
            Ok(()) => {
                if measured {
                    st.send_ack.saturating_record(us(done - intended.min(done)));
                    st.send_call.saturating_record(us(done - start));
                }
                let warm_ns = self.epoch_ns(self.warm_end.get());
                if let Some(sl) = st.slice(warm_ns, self.epoch_ns(start)) {
                    sl.send_calls += 1;
                    sl.send_call_max_us = sl.send_call_max_us.max(us(done - start));
                }
                let bytes: u64 = msgs.iter().map(|m| m.body.len() as u64).sum();
                st.sent += msgs.len() as u64;
                st.sent_bytes += bytes;
                if self.in_window(done) {
                    st.sent_window += msgs.len() as u64;
                    st.sent_bytes_window += bytes;
                }
                let bits = &mut st.sent_ok[producer as usize];
                for i in 0..msgs.len() as u64 {
                    bits.set(first_seq + i);
                }
            }
            Err(e) => {
                st.send_errors += 1;
                st.sent_failed_msgs += msgs.len() as u64;
                st.error("send", e);
            }
        }
    }

    fn batch(
        &self,
        producer: u32,
        seq: u64,
        n: usize,
        intended: Instant,
        rng: &mut SmallRng,
    ) -> Vec<OutMsg> {
        (0..n as u64)
            .map(|i| {
                let size = self.spec.size.draw(rng);
                OutMsg {
                    body: self.body(producer, seq + i, intended, size),
                    group: self.group_key(producer, seq + i, rng),
                }
            })
            .collect()
    }

    fn producer_done(&self) {
        self.producers_running.set(self.producers_running.get() - 1);
        if self.producers_running.get() == 0 {
            self.producers_done_at.set(Some(Instant::now()));
        }
    }

    /// Whether a consumer of `group` should stop: it has every message, or its drain deadline
    /// passed.
    fn consumer_done(&self, group: u32) -> bool {
        let Some(done_at) = self.producers_done_at.get() else {
            return false;
        };
        // A consume-only run's consumers start after the producers: the drain follows the
        // window.
        let from = if self.spec.phase == Phase::ConsumeOnly {
            done_at.max(self.measure_end.get())
        } else {
            done_at
        };
        if Instant::now() >= from + self.spec.drain {
            return true;
        }
        let st = self.stats.borrow();
        st.groups[group as usize].unique >= st.sent + st.sent_failed_msgs
            || (st.sent_failed_msgs > 0 && {
                // Failed sends may or may not have landed: with everything acknowledged in
                // hand, give the rest a short grace only.
                Instant::now() >= done_at + self.spec.receive_wait * 2 && lost_in(&st, group) == 0
            })
    }
}

fn lost_in(st: &Stats, group: u32) -> u64 {
    let g = &st.groups[group as usize];
    let mut lost = 0;
    for (p, sent) in st.sent_ok.iter().enumerate() {
        let seen = g.seen.get(p);
        for w in 0..sent.0.len() {
            let s = seen.map_or(0, |b| b.word(w));
            lost += u64::from((sent.0[w] & !s).count_ones());
        }
    }
    lost
}

fn unacked_in(st: &Stats, group: u32) -> u64 {
    let g = &st.groups[group as usize];
    let mut n = 0;
    for (p, seen) in g.seen.iter().enumerate() {
        for w in 0..seen.0.len() {
            let s = st.sent_ok.get(p).map_or(0, |b| b.word(w));
            n += u64::from((seen.0[w] & !s).count_ones());
        }
    }
    n
}

/// Appends `v` as `digits` lowercase hex digits (the header's fixed-width fields).
fn push_hex(b: &mut Vec<u8>, v: u64, digits: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for i in (0..digits).rev() {
        b.push(HEX[((v >> (4 * i)) & 0xf) as usize]);
    }
}

fn parse_header(body: &[u8]) -> Option<(u32, u64, u64)> {
    let h = std::str::from_utf8(body.get(..HEADER_BYTES)?).ok()?;
    Some((
        u32::from_str_radix(&h[..8], 16).ok()?,
        u64::from_str_radix(&h[8..24], 16).ok()?,
        u64::from_str_radix(&h[24..40], 16).ok()?,
    ))
}

fn gap(rng: &mut SmallRng, arrival: Arrival, rate_per_s: f64) -> Duration {
    let mean = 1.0 / rate_per_s.max(1e-9);
    let g = match arrival {
        Arrival::Uniform => mean,
        Arrival::Poisson => -rng.gen_range(f64::EPSILON..1.0f64).ln() * mean,
    };
    Duration::from_secs_f64(g.min(3600.0))
}

/// A scheduled producer's start: its random source, its batches per second, the arrival
/// process, and its first intended send time — a random phase, so that producers do not send
/// in lockstep.
fn schedule(
    sh: &Shared,
    producer: u32,
    salt: u64,
    rate_per_s: f64,
) -> (SmallRng, f64, Arrival, Instant) {
    let spec = &sh.spec;
    let mut rng = SmallRng::seed_from_u64(spec.seed ^ (u64::from(producer) << 32 | salt));
    let batch_rate = rate_per_s / spec.producers as f64 / spec.batch as f64;
    let first = sh.epoch + gap(&mut rng, Arrival::Uniform, batch_rate).mul_f64(rng.gen());
    (rng, batch_rate, spec.profile.arrival(), first)
}

async fn open_producer(sh: Rc<Shared>, conn: Rc<dyn Conn>, producer: u32, rate_per_s: f64) {
    let spec = &sh.spec;
    let (mut rng, batch_rate, arrival, mut t) = schedule(&sh, producer, 0x9e37, rate_per_s);
    let batch_bytes = spec.batch.max(1) * spec.size.max().max(1);
    let in_flight = (OPEN_IN_FLIGHT_BYTES_MAX / batch_bytes).clamp(1, OPEN_IN_FLIGHT_MAX);
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(in_flight));
    let mut seq = 0u64;
    while let Some(n) = sh.slot(t).await {
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .expect("semaphore never closed");
        let msgs = sh.batch(producer, seq, n, t, &mut rng);
        let (sh2, conn2, first) = (sh.clone(), conn.clone(), seq);
        tokio::task::spawn_local(async move {
            sh2.send_batch(&*conn2, producer, first, msgs, t).await;
            drop(permit);
        });
        seq += n as u64;
        let factor = spec.profile.factor(t - sh.epoch);
        t += gap(&mut rng, arrival, batch_rate * factor);
    }
    let _all = permits
        .acquire_many(in_flight as u32)
        .await
        .expect("semaphore never closed");
    sh.producer_done();
}

async fn closed_producer(
    sh: Rc<Shared>,
    conn: Rc<dyn Conn>,
    producer: u32,
    in_flight: usize,
    backlog_max: Option<u64>,
) {
    let seq = Rc::new(Cell::new(0u64));
    let lanes = (0..in_flight).map(|lane| {
        let (sh, conn, seq) = (sh.clone(), conn.clone(), seq.clone());
        async move {
            let mut rng = SmallRng::seed_from_u64(
                sh.spec.seed ^ (u64::from(producer) << 32 | (lane as u64) << 8 | 0x51),
            );
            loop {
                let now = Instant::now();
                if now >= sh.measure_end.get() {
                    break;
                }
                if let Some(max) = backlog_max {
                    // Held back while the consumers are behind; a receive wakes it.
                    while sh.backlog() > max && Instant::now() < sh.measure_end.get() {
                        let freed = sh.backlog_freed.notified();
                        let _ = tokio::time::timeout(BACKLOG_RECHECK, freed).await;
                    }
                    if Instant::now() >= sh.measure_end.get() {
                        break;
                    }
                }
                let n = sh.allot(sh.spec.batch);
                if n == 0 {
                    break;
                }
                let first = seq.get();
                seq.set(first + n as u64);
                let msgs = sh.batch(producer, first, n, now, &mut rng);
                sh.send_batch(&*conn, producer, first, msgs, now).await;
            }
        }
    });
    futures::future::join_all(lanes).await;
    sh.producer_done();
}

async fn consumer(sh: Rc<Shared>, conn: Rc<dyn Conn>, group: u32) {
    if matches!(sh.spec.mode, Mode::RoundTrip { .. }) {
        // Round trips: the producers receive their own messages; consumers only drain.
        while sh.producers_done_at.get().is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    while !sh.consumer_done(group) {
        if sh
            .receive_and_ack(&*conn, group, sh.spec.receive_wait, true)
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// One send → receive → delete cycle at a time, on the schedule: the round trip of each call.
async fn round_trip_producer(sh: Rc<Shared>, conn: Rc<dyn Conn>, producer: u32, rate_per_s: f64) {
    let spec = &sh.spec;
    let (mut rng, batch_rate, arrival, mut t) = schedule(&sh, producer, 0x71, rate_per_s);
    let mut seq = 0u64;
    while let Some(n) = sh.slot(t).await {
        let msgs = sh.batch(producer, seq, n, t, &mut rng);
        sh.send_batch(&*conn, producer, seq, msgs, t).await;
        seq += n as u64;
        // Take back as many messages as were sent (any producer's: the queue is shared),
        // with short polls; bounded, so that a lost message ends the chase (the drain and the
        // checks then tell).
        let chase_end = Instant::now() + ROUND_TRIP_RECEIVE_CHASE;
        let mut got = 0;
        while got < n && Instant::now() < chase_end {
            match sh.receive_and_ack(&*conn, 0, Duration::ZERO, false).await {
                Ok(k) => got += k,
                // Counted already; a failing target is not hammered in a tight loop.
                Err(()) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        let factor = spec.profile.factor(t - sh.epoch);
        t += gap(&mut rng, arrival, batch_rate * factor)
            .max(Instant::now().saturating_duration_since(t));
    }
    sh.producer_done();
}

impl Shared {
    /// One receive call for `group` and the acknowledgement of what it returned; the number of
    /// messages received. Empty receives count in `receive_call` only if `record_empty` (a
    /// long poll's wait is part of its latency; a short poll that found nothing is not a
    /// round trip with a message).
    async fn receive_and_ack(
        &self,
        conn: &dyn Conn,
        group: u32,
        wait: Duration,
        record_empty: bool,
    ) -> Result<usize, ()> {
        let spec = &self.spec;
        let t0 = Instant::now();
        let r = conn
            .receive(&self.name, group, spec.receive_max, wait)
            .await;
        let now = Instant::now();
        let msgs = match r {
            Ok(m) => m,
            Err(e) => {
                let mut st = self.stats.borrow_mut();
                st.receive_errors += 1;
                st.error("receive", e);
                return Err(());
            }
        };
        let mut tokens = Vec::with_capacity(msgs.len());
        let mut freed = false;
        {
            let mut st = self.stats.borrow_mut();
            if msgs.is_empty() {
                st.receives_empty += 1;
            }
            if t0 >= self.warm_end.get() && (record_empty || !msgs.is_empty()) {
                st.receive_call.saturating_record(us(now - t0));
            }
            let warm_ns = self.epoch_ns(self.warm_end.get());
            let now_ns = self.epoch_ns(now);
            let in_window = self.in_window(now);
            for m in msgs {
                let len = m.body.len() as u64;
                // Every token goes back, `AckToken::None` included: a topic adapter commits
                // its offsets on `ack` whatever the tokens say.
                tokens.push(m.ack);
                let Some((p, seq, intended_ns)) = parse_header(&m.body) else {
                    st.groups[group as usize].foreign += 1;
                    continue;
                };
                if p as usize >= spec.producers {
                    st.groups[group as usize].foreign += 1;
                    continue;
                }
                let g = &mut st.groups[group as usize];
                if g.seen.len() <= p as usize {
                    g.seen.resize(p as usize + 1, Bits::default());
                }
                if g.seen[p as usize].set(seq) {
                    g.duplicates += 1;
                    continue;
                }
                g.unique += 1;
                freed = true;
                if in_window {
                    g.recv_window += 1;
                    g.recv_bytes_window += len;
                }
                if intended_ns >= warm_ns {
                    let e2e_us = now_ns.saturating_sub(intended_ns) / 1000;
                    st.e2e.saturating_record(e2e_us);
                    if let Some(sl) = st.slice(warm_ns, intended_ns) {
                        sl.received += 1;
                        sl.end_to_end_max_us = sl.end_to_end_max_us.max(e2e_us);
                        sl.end_to_end_over_5ms += u64::from(e2e_us > 5_000);
                    }
                }
            }
        }
        if freed {
            self.backlog_freed.notify_waiters();
            if self.spec.phase == Phase::ConsumeOnly && self.all_received_at.get().is_none() {
                let st = self.stats.borrow();
                if st.groups.iter().all(|g| g.unique >= st.sent) {
                    self.all_received_at.set(Some(Instant::now()));
                    self.all_received.notify_waiters();
                }
            }
        }
        let n = tokens.len();
        if n == 0 {
            return Ok(0);
        }
        let t1 = Instant::now();
        let r = conn.ack(&self.name, group, tokens).await;
        let done = Instant::now();
        let mut st = self.stats.borrow_mut();
        match r {
            Ok(()) => {
                if t1 >= self.warm_end.get() {
                    st.ack_call.saturating_record(us(done - t1));
                }
                let warm_ns = self.epoch_ns(self.warm_end.get());
                if let Some(sl) = st.slice(warm_ns, self.epoch_ns(t1)) {
                    sl.ack_calls += 1;
                    sl.ack_call_max_us = sl.ack_call_max_us.max(us(done - t1));
                }
                if self.in_window(done) {
                    st.groups[group as usize].acked_window += n as u64;
                }
            }
            Err(e) => {
                st.ack_errors += 1;
                st.error("ack", e);
            }
        }
        Ok(n)
    }
}

/// Runs one case against `target` on the queue or topic `name` (already set up).
pub async fn run(target: &dyn Target, name: &str, spec: &LoadSpec) -> Result<RunResult, String> {
    let mut conns: Vec<Rc<dyn Conn>> = Vec::with_capacity(spec.connections);
    for _ in 0..spec.connections {
        let c = target
            .connect()
            .await
            .map_err(|e| format!("{}: connect: {e}", target.name()))?;
        conns.push(Rc::from(c));
    }
    let groups = spec.groups_read();
    let epoch = Instant::now();
    // A consume-only run measures from when its consumers start (after the backlog).
    let warm_end = match spec.phase {
        Phase::ConsumeOnly => epoch + BACKLOG_FILL_MAX,
        _ => epoch + spec.warmup,
    };
    let sh = Rc::new(Shared {
        backlog_freed: tokio::sync::Notify::new(),
        all_received_at: Cell::new(None),
        all_received: tokio::sync::Notify::new(),
        clock: crate::clock::Clock::start(),
        name: name.to_string(),
        spec: spec.clone(),
        epoch,
        warm_end: Cell::new(warm_end),
        measure_end: Cell::new(warm_end + spec.duration),
        allotted: Cell::new(0),
        producers_running: Cell::new(spec.producers),
        producers_done_at: Cell::new(None),
        stats: RefCell::new(Stats {
            e2e: hist(),
            send_ack: hist(),
            send_call: hist(),
            send_lag: hist(),
            receive_call: hist(),
            ack_call: hist(),
            receives_empty: 0,
            sent_ok: vec![Bits::default(); spec.producers],
            sent: 0,
            sent_failed_msgs: 0,
            sent_bytes: 0,
            sent_window: 0,
            sent_bytes_window: 0,
            send_errors: 0,
            receive_errors: 0,
            ack_errors: 0,
            first_error: None,
            groups: (0..groups).map(|_| GroupState::default()).collect(),
            timeline: (0..spec.duration.as_millis() as u64 / TIMELINE_SLICE_MS)
                .map(|i| Slice {
                    t_ms: i * TIMELINE_SLICE_MS,
                    ..Slice::default()
                })
                .collect(),
        }),
        filler: "abcdefghijklmnopqrstuvwxyz012345".repeat(spec.size.max() / 32 + 1),
        keys: match spec.shape {
            Shape::Standard => Vec::new(),
            Shape::Fifo { groups } => (0..groups).map(|g| format!("g{g}")).collect(),
            Shape::Topic { .. } => (0..TOPIC_KEYS).map(|k| format!("k{k}")).collect(),
        },
    });
    let mut tasks = Vec::new();
    let mut next_conn = 0usize;
    let mut conn = || {
        next_conn += 1;
        conns[(next_conn - 1) % conns.len()].clone()
    };
    // Consumers first, so that they are polling (and topic members joined) when data comes;
    // a consume-only run starts them once the backlog is written.
    let consumer_conns: Vec<Rc<dyn Conn>> = (0..groups as usize * spec.consumers)
        .map(|_| conn())
        .collect();
    if spec.phase != Phase::ConsumeOnly {
        for (i, c) in consumer_conns.iter().enumerate() {
            let g = (i / spec.consumers) as u32;
            tasks.push(tokio::task::spawn_local(consumer(sh.clone(), c.clone(), g)));
        }
    }
    for p in 0..spec.producers as u32 {
        let task = match spec.mode {
            Mode::Open { rate_per_s } => {
                tokio::task::spawn_local(open_producer(sh.clone(), conn(), p, rate_per_s))
            }
            Mode::Closed {
                in_flight,
                backlog_max,
            } => tokio::task::spawn_local(closed_producer(
                sh.clone(),
                conn(),
                p,
                in_flight,
                backlog_max,
            )),
            Mode::RoundTrip { rate_per_s } => {
                tokio::task::spawn_local(round_trip_producer(sh.clone(), conn(), p, rate_per_s))
            }
        };
        tasks.push(task);
    }
    if spec.phase == Phase::ConsumeOnly {
        let (sh, conns, per_group) = (sh.clone(), consumer_conns, spec.consumers);
        tasks.push(tokio::task::spawn_local(async move {
            while sh.producers_done_at.get().is_none() {
                if Instant::now() >= sh.epoch + BACKLOG_FILL_MAX {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let warm_end = Instant::now() + sh.spec.warmup;
            sh.warm_end.set(warm_end);
            sh.measure_end.set(warm_end + sh.spec.duration);
            let consumers: Vec<_> = conns
                .into_iter()
                .enumerate()
                .map(|(i, c)| {
                    tokio::task::spawn_local(consumer(sh.clone(), c, (i / per_group) as u32))
                })
                .collect();
            futures::future::join_all(consumers).await;
        }));
    }
    // CPU over the measured window: the server's (where this run can see it), the
    // generator's, the machine's. A consume-only window ends early once every record is in.
    let meter = target.cpu_meter();
    let sh_cpu = sh.clone();
    let cpu = async move {
        let sh = sh_cpu;
        if spec.phase == Phase::ConsumeOnly {
            while sh.producers_done_at.get().is_none() {
                if Instant::now() >= sh.epoch + BACKLOG_FILL_MAX {
                    return (CpuSeconds::default(), spec.duration);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // The consumers' task sets the window right after; let it run first.
            tokio::task::yield_now().await;
            while sh.warm_end.get() > Instant::now() + spec.warmup + Duration::from_secs(1) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let (warm_end, measure_end) = (sh.warm_end.get(), sh.measure_end.get());
        tokio::time::sleep_until(warm_end.into()).await;
        let start = CpuSample::take_off_thread(meter.clone()).await;
        let all_in = sh.all_received.notified();
        if sh.all_received_at.get().is_none() {
            let _ = tokio::time::timeout_at(measure_end.into(), all_in).await;
        }
        let end_at = Instant::now().min(measure_end);
        let end = CpuSample::take_off_thread(meter).await;
        let cpu = match (start, end) {
            (Some(start), Some(end)) => end.since(&start),
            _ => CpuSeconds::default(),
        };
        (cpu, end_at.saturating_duration_since(warm_end))
    };
    let all = futures::future::join(futures::future::join_all(tasks), cpu);
    let Ok((_, (cpu, window))) = tokio::time::timeout(spec.deadline(), all).await else {
        return Err(format!(
            "{}: the run did not end within {:?} (a call hung?)",
            target.name(),
            spec.deadline()
        ));
    };
    let st = sh.stats.borrow();
    // The window: its planned length, or shorter when a consume-only run read everything.
    let secs = window.as_secs_f64().max(1e-3);
    let mean_body = if st.sent > 0 {
        st.sent_bytes as f64 / st.sent as f64
    } else {
        0.0
    };
    let group_results: Vec<GroupResult> = (0..groups)
        .map(|g| {
            let gs = &st.groups[g as usize];
            let acked = gs.acked_window;
            GroupResult {
                group: g,
                received: gs.unique,
                duplicates: gs.duplicates,
                lost: lost_in(&st, g),
                unacknowledged_received: unacked_in(&st, g),
                foreign: gs.foreign,
                receive_msgs_per_s: gs.recv_window as f64 / secs,
                receive_mb_per_s: gs.recv_bytes_window as f64 / secs / 1e6,
                ack_msgs_per_s: acked as f64 / secs,
            }
        })
        .collect();
    let drain_timed_out = group_results.iter().any(|g| g.lost > 0);
    // CPU seconds in the window per message sent in it, in µs (none if it saw no sends).
    let per_msg = |cpu: Option<f64>| {
        cpu.filter(|_| st.sent_window > 0)
            .map(|s| s * 1e6 / st.sent_window as f64)
    };
    let received_window: u64 = st.groups.iter().map(|g| g.recv_window).sum();
    let per_received = |cpu: Option<f64>| {
        cpu.filter(|_| received_window > 0)
            .map(|s| s * 1e6 / received_window as f64)
    };
    Ok(RunResult {
        phase: match spec.phase {
            Phase::Mixed => "mixed",
            Phase::ProduceOnly => "produce-only",
            Phase::ConsumeOnly => "consume-only",
        }
        .into(),
        received_window,
        server_cpu_us_per_received: per_received(cpu.server),
        generator_cpu_us_per_received: per_received(cpu.generator),
        machine_cpu_us_per_received: per_received(cpu.machine),
        target: target.name(),
        fsync_policy: target.fsync_policy(),
        case: name.to_string(),
        shape: describe_shape(&spec.shape),
        mode: match spec.mode {
            Mode::Open { .. } => "open loop".into(),
            Mode::Closed {
                in_flight,
                backlog_max: None,
            } => format!("closed loop, {in_flight} batches in flight per producer"),
            Mode::Closed {
                in_flight,
                backlog_max: Some(b),
            } => format!(
                "closed loop, {in_flight} batches in flight per producer, at most {b} messages sent and not yet received"
            ),
            Mode::RoundTrip { .. } => {
                "round trips (per producer: send, short-poll receive, delete; one at a time)".into()
            }
        },
        offered_rate_per_s: match spec.mode {
            Mode::Open { rate_per_s } | Mode::RoundTrip { rate_per_s } => Some(rate_per_s),
            Mode::Closed { .. } => None,
        },
        profile: spec.profile.describe(),
        size: spec.size.describe(),
        seed: spec.seed,
        producers: spec.producers,
        consumers_per_group: spec.consumers,
        connections: spec.connections,
        batch: spec.batch,
        warmup_s: spec.warmup.as_secs_f64(),
        measured_s: secs,
        sent: st.sent,
        send_errors: st.send_errors,
        receive_errors: st.receive_errors,
        ack_errors: st.ack_errors,
        receives_empty: st.receives_empty,
        first_error: st.first_error.clone(),
        mean_body_bytes: mean_body,
        send_msgs_per_s: st.sent_window as f64 / secs,
        server_cpu_s: cpu.server,
        server_cpu_us_per_msg: per_msg(cpu.server),
        generator_cpu_s: cpu.generator,
        generator_cpu_us_per_msg: per_msg(cpu.generator),
        machine_cpu_s: cpu.machine,
        machine_cpu_us_per_msg: per_msg(cpu.machine),
        send_mb_per_s: st.sent_bytes_window as f64 / secs / 1e6,
        groups: group_results,
        latency: Latencies {
            end_to_end: Pcts::of(&st.e2e),
            send_ack: Pcts::of(&st.send_ack),
            send_call: Pcts::of(&st.send_call),
            send_lag: Pcts::of(&st.send_lag),
            receive_call: Pcts::of(&st.receive_call),
            ack_call: Pcts::of(&st.ack_call),
        },
        drain_timed_out,
        timeline: st.timeline.clone(),
        window_start_unix_ms: {
            let ago = Instant::now().saturating_duration_since(sh.warm_end.get());
            (std::time::SystemTime::now() - ago)
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64)
        },
    })
}

pub fn describe_shape(s: &Shape) -> String {
    match s {
        Shape::Standard => "standard queue".into(),
        Shape::Fifo { groups } => format!("FIFO queue, {groups} message groups"),
        Shape::Topic { partitions, groups } => {
            format!("topic, {partitions} partitions, {groups} consumer groups")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bursty_profile_averages_to_the_mean_rate() {
        let p = Profile::Bursty {
            peak_to_average: 3.5,
            low_to_average: 0.5,
            period: Duration::from_secs(6),
            arrival: Arrival::Uniform,
        };
        let steps = 6000;
        let mean: f64 = (0..steps)
            .map(|i| p.factor(Duration::from_millis(i)))
            .sum::<f64>()
            / steps as f64;
        assert!((mean - 1.0).abs() < 0.01, "mean factor {mean}");
        assert_eq!(p.factor(Duration::ZERO), 3.5);
    }

    #[test]
    fn sizes_average_near_the_mean() {
        let seed = 7;
        let d = SizeDist::LogNormal {
            mean: 2048,
            sigma: 0.5,
            min: HEADER_BYTES,
            max: 16384,
        };
        let mut rng = SmallRng::seed_from_u64(seed);
        let n = 20_000;
        let mean = (0..n).map(|_| d.draw(&mut rng)).sum::<usize>() as f64 / n as f64;
        assert!((1900.0..2200.0).contains(&mean), "seed {seed}: mean {mean}");
    }

    #[test]
    fn headers_round_trip() {
        let h = format!("{:08x}{:016x}{:016x}xyz", 3u32, 99u64, 123_456_789u64);
        assert_eq!(parse_header(h.as_bytes()), Some((3, 99, 123_456_789)));
        assert_eq!(parse_header(b"short"), None);
    }
}
