//! A queue partition on a simulated world: the real `PartitionActor` (its stage → commit →
//! reply, its timer loop, its log reads, its replay after a restart) over `LocalLog<SimFs>` and
//! a virtual clock, driven by a seeded mix of sends, receives, deletes, visibility changes, time
//! jumps (which fire the actor's own timers) and **power losses** (`SimFs::crash`: whatever was
//! not durable is dropped, kept or torn at random), checked after every step against the queue's
//! reference model (`engine/model.rs`).
//!
//! An acknowledged operation must survive a power loss whole (CONTRACT.md C1, C2): the model
//! holds exactly the acknowledged operations, so a reply given before its records were
//! committed shows up as a difference after the next power loss.
//!
//! `SLUICE_SEED=n` replays case seed `n` (printed on failure); `SLUICE_CASES=k` sets the number
//! of cases.

use super::partition::PartitionActor;
use crate::engine::attributes::{DedupScope, QueueAttributes, QueueKind};
use crate::engine::model::{Got, Model};
use crate::engine::{
    Command, Limits, PartitionConfig, Receipt, ReceiveRequest, Reply, SendRequest,
};
use crate::error::ServiceError;
use crate::partition_log::{LocalLog, PartitionLog};
use crate::runtime::{Clock, SimClock};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_storage::fs::{CrashMode, SimFs};
use sluice_storage::LogConfig;
use std::path::PathBuf;
use std::rc::Rc;

type SimActor = PartitionActor<LocalLog<SimFs>, SimClock>;

const QUEUE: u64 = 21;

/// Small segments, so that a case rolls segments, compacts and replays across several.
fn log_config() -> LogConfig {
    LogConfig {
        segment_bytes_max: 32 * 1024,
        prealloc_chunk_bytes: 16 * 1024,
        write_buffer_bytes_max: 64 * 1024,
        index_interval_bytes: 1024,
        batch_bytes_max: 16 * 1024,
        coalesce_batch_bytes_max: 2 * 1024,
        ..LogConfig::default()
    }
}

fn code(e: &ServiceError) -> &'static str {
    match e {
        ServiceError::Engine(e) => e.sqs_code().code,
        other => panic!("not an engine error: {other:?}"),
    }
}

/// Appends a one-record control batch (a Raft no-op's shape) to the partition's log, durably,
/// with the actor stopped; returns its offset.
async fn append_control_batch(fs: &SimFs, now_ms: u64) -> u64 {
    let log = LocalLog::open(fs, PathBuf::from(PARTITION_DIR), log_config())
        .await
        .expect("the log opens after a power loss");
    let mut b = sluice_storage::BatchBuilder::new().control();
    b.push_parts(now_ms as i64, None, b"noop", std::iter::empty());
    let info = log
        .append(b.finish().expect("one record"))
        .await
        .expect("append a control batch");
    log.close().await.expect("close");
    info.base_offset
}

const PARTITION_DIR: &str = "/data/queues/21/p00000";

/// Lets every task that can run, run: the actor's commits (each simulated I/O yields), its
/// timer loop, compaction. Nothing here waits on real time, so this is deterministic.
async fn settle() {
    for _ in 0..SETTLE_YIELDS {
        sluice_storage::fs::yield_now().await;
    }
}

/// Yields that let a commit (a handful of simulated I/Os, each one yield) and a timer tick run
/// to the end, with a wide margin.
const SETTLE_YIELDS: usize = 400;

struct World {
    rng: SmallRng,
    fs: SimFs,
    clock: SimClock,
    config: PartitionConfig,
    actor: Rc<SimActor>,
    model: Model,
    fifo: bool,
    content_dedup: bool,
    handles: Vec<Receipt>,
    power_losses: u32,
    trace: Vec<String>,
}

impl World {
    async fn new(seed: u64) -> World {
        let mut rng = SmallRng::seed_from_u64(seed);
        let fifo = rng.gen_bool(0.5);
        let mut a = QueueAttributes::new(if fifo {
            QueueKind::Fifo
        } else {
            QueueKind::Standard
        });
        a.visibility_timeout_s = rng.gen_range(1..=30);
        a.retention_s = rng.gen_range(60..=700);
        if !fifo && rng.gen_bool(0.3) {
            a.delay_s = rng.gen_range(0..=5);
        }
        if fifo {
            a.content_based_dedup = rng.gen_bool(0.5);
            if rng.gen_bool(0.5) {
                a.dedup_scope = DedupScope::MessageGroup;
            }
        }
        let limits = Limits {
            inflight_max: rng.gen_range(3..=12),
            message_entries_max: rng.gen_range(10..=40),
            dedup_entries_max: rng.gen_range(5..=30),
            checkpoint_interval_records: rng.gen_range(1..=30),
            ..Limits::default()
        };
        let config = PartitionConfig {
            queue_id: QUEUE,
            partition: 0,
            attributes: a.clone(),
            limits: limits.clone(),
        };
        let fs = SimFs::new();
        let clock = SimClock::new(rng.gen_range(1_000_000..1_000_000_000_000u64));
        let actor = Self::open(&fs, &clock, &config).await;
        World {
            model: Model::new(QUEUE, &a, &limits),
            rng,
            fs,
            clock,
            config,
            actor,
            fifo,
            content_dedup: a.content_based_dedup,
            handles: Vec::new(),
            power_losses: 0,
            trace: Vec::new(),
        }
    }

    async fn open(fs: &SimFs, clock: &SimClock, config: &PartitionConfig) -> Rc<SimActor> {
        let moves = Rc::new(|_| panic!("no redrive policy: nothing moves"));
        SimActor::open_on(
            fs.clone(),
            clock.clone(),
            PathBuf::from(PARTITION_DIR),
            config.clone(),
            log_config(),
            moves,
        )
        .await
        .expect("the partition opens after a power loss")
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    fn check<T: PartialEq + std::fmt::Debug>(
        &self,
        what: &str,
        got: T,
        want: T,
    ) -> Result<(), String> {
        if got == want {
            Ok(())
        } else {
            Err(format!("{what}: actor {got:?} != model {want:?}"))
        }
    }

    async fn step(&mut self) -> Result<(), String> {
        match self.rng.gen_range(0..100) {
            0..=34 => self.op_send().await?,
            35..=59 => self.op_receive().await?,
            60..=71 => self.op_delete().await?,
            72..=79 => self.op_change_visibility().await?,
            80..=92 => {
                let dt = match self.rng.gen_range(0..10) {
                    0..=5 => self.rng.gen_range(0..2_000),
                    6..=8 => self.rng.gen_range(0..40_000),
                    _ => self.rng.gen_range(0..400_000),
                };
                let now = self.now() + dt;
                self.trace.push(format!("advance {dt} -> {now}"));
                self.clock.advance_to(now);
                // The actor's own timer loop ticks the engine and commits what it decides.
                settle().await;
                self.model.tick(now);
            }
            93..=96 => self.power_loss_mid_send().await?,
            _ => self.power_loss().await,
        }
        settle().await;
        let c = self.actor.counters();
        self.model.tick(self.now());
        self.check(
            "counters (visible, in flight, delayed)",
            (c.visible, c.in_flight, c.delayed),
            self.model.counters(),
        )
    }

    /// The power goes: the actor stops where it is; the disk keeps what was durable (the rest
    /// dropped, kept or torn at random); the partition reopens on it and replays its log.
    async fn power_loss(&mut self) {
        let crash_seed = self.rng.gen();
        self.trace
            .push(format!("power loss (crash seed {crash_seed})"));
        self.actor.halt();
        self.fs = self.fs.crash(CrashMode::Random { seed: crash_seed });
        if self.rng.gen_bool(0.3) {
            // As a new Raft leader would: its no-op, a control batch, takes an offset in the
            // partition's log, and the engine steps over it on replay and after.
            let at = append_control_batch(&self.fs, self.now()).await;
            self.trace.push(format!("control batch at offset {at}"));
        }
        self.actor = Self::open(&self.fs, &self.clock, &self.config).await;
        self.power_losses += 1;
    }

    /// A send whose commit the power interrupts after a random number of scheduling points. If
    /// it was acknowledged, it must be there; if not, it may or may not be: after the restart
    /// the model takes whichever outcome the partition shows (the message count tells them
    /// apart; where it does not, both are the same state).
    async fn power_loss_mid_send(&mut self) -> Result<(), String> {
        let (req, group, body, delay_s, dedup_id) = self.send_request();
        let actor = self.actor.clone();
        let reply: Rc<std::cell::RefCell<Option<_>>> = Rc::default();
        let out = reply.clone();
        crate::runtime::spawn(async move {
            let r = actor.execute(Command::Send(req)).await;
            *out.borrow_mut() = Some(r.map(|_| ()));
        });
        let polls = self.rng.gen_range(0..12);
        for _ in 0..polls {
            sluice_storage::fs::yield_now().await;
        }
        let acked = matches!(*reply.borrow(), Some(Ok(())));
        let mut with = self.model.clone();
        let sent = with.send(self.now(), group, body.clone(), delay_s, dedup_id);
        self.trace.push(format!(
            "send {body} interrupted after {polls} polls (acknowledged: {acked}) -> {sent:?}"
        ));
        self.power_loss().await;
        settle().await;
        let c = self.actor.counters();
        let total = |m: &Model| {
            let (v, i, d) = m.counters();
            v + i + d
        };
        if acked || c.visible + c.in_flight + c.delayed == total(&with) {
            self.model = with;
        }
        Ok(())
    }

    fn send_request(
        &mut self,
    ) -> (
        SendRequest,
        Option<String>,
        String,
        Option<u32>,
        Option<String>,
    ) {
        let groups = if self.fifo { 3 } else { 1 };
        let group = self
            .fifo
            .then(|| format!("g{}", self.rng.gen_range(0..groups)));
        let body = format!("b{}", self.rng.gen_range(0..12));
        let delay_s = (!self.fifo && self.rng.gen_bool(0.3)).then(|| self.rng.gen_range(0..=20));
        let dedup_id = (self.fifo && (self.rng.gen_bool(0.6) || !self.content_dedup))
            .then(|| format!("d{}", self.rng.gen_range(0..10)));
        let req = SendRequest {
            body: body.clone(),
            attributes: Vec::new(),
            delay_s,
            group_id: group.clone(),
            dedup_id: dedup_id.clone(),
        };
        (req, group, body, delay_s, dedup_id)
    }

    async fn op_send(&mut self) -> Result<(), String> {
        let (req, group, body, delay_s, dedup_id) = self.send_request();
        let got = self
            .actor
            .execute(Command::Send(req))
            .await
            .map(|r| match r {
                Reply::Sent(s) => (s.message_id, s.sequence_number, s.duplicate),
                other => panic!("unexpected reply {other:?}"),
            });
        let want = self
            .model
            .send(self.now(), group, body.clone(), delay_s, dedup_id);
        self.trace.push(format!("send {body} -> {want:?}"));
        self.check("send", got.map_err(|e| code(&e)), want)
    }

    async fn op_receive(&mut self) -> Result<(), String> {
        let max = self.rng.gen_range(1..=10);
        let vt = self.rng.gen_bool(0.5).then(|| self.rng.gen_range(0..=40));
        let cmd = Command::Receive(ReceiveRequest {
            max_messages: max,
            visibility_timeout_s: vt,
            attempt_id: None,
        });
        let got = self.actor.execute(cmd).await;
        let want = self.model.receive(self.now(), max, vt, None);
        self.trace
            .push(format!("receive max={max} vt={vt:?} -> {want:?}"));
        let (got, (want, moved)) = match (got, want) {
            (Ok(g), Ok(w)) => (g, w),
            (g, w) => {
                return self.check(
                    "receive",
                    g.map(|_| ()).map_err(|e| code(&e)),
                    w.map(|_| ()),
                )
            }
        };
        assert!(moved.is_empty(), "no redrive policy");
        let Reply::Received(got) = got else {
            return Err(format!("unexpected reply {got:?}"));
        };
        let got_t: Vec<Got> = got
            .iter()
            .map(|d| {
                (
                    d.receipt.msg_id,
                    d.receive_count,
                    d.payload.body.clone(),
                    d.first_receive_ms,
                    d.sent_ms,
                    d.message_id,
                )
            })
            .collect();
        self.check("received", &got_t, &want)?;
        for d in got {
            self.handles.push(d.receipt);
            if self.handles.len() > 32 {
                self.handles.remove(0);
            }
        }
        Ok(())
    }

    fn pick_handle(&mut self) -> Option<Receipt> {
        let n = self.handles.len();
        (n > 0).then(|| self.handles[n - 1 - self.rng.gen_range(0..n.min(6))])
    }

    async fn op_delete(&mut self) -> Result<(), String> {
        let Some(r) = self.pick_handle() else {
            return Ok(());
        };
        let got = self
            .actor
            .execute(Command::Delete { receipt: r })
            .await
            .map(|_| ());
        let want = self.model.delete(self.now(), &r);
        self.trace.push(format!("delete {r:?} -> {want:?}"));
        self.check("delete", got.map_err(|e| code(&e)), want)
    }

    async fn op_change_visibility(&mut self) -> Result<(), String> {
        let Some(r) = self.pick_handle() else {
            return Ok(());
        };
        let t = self.rng.gen_range(0..=60);
        let want = self.model.change_visibility(self.now(), &r, t);
        let got = self
            .actor
            .execute(Command::ChangeVisibility {
                receipt: r,
                timeout_s: t,
            })
            .await
            .map(|_| ());
        self.trace
            .push(format!("change visibility {r:?} {t} -> {want:?}"));
        self.check("change visibility", got.map_err(|e| code(&e)), want)
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number"))
    })
}

/// Runs one case on a fresh executor; `Err` carries the last steps.
fn run_case(seed: u64, steps: usize) -> Result<u32, String> {
    sluice_storage::rt::run("sim-shard", move || async move {
        let mut w = World::new(seed).await;
        for i in 0..steps {
            if let Err(e) = w.step().await {
                let from = w.trace.len().saturating_sub(25);
                return Err(format!(
                    "step {i}: {e}\nlast steps:\n  {}",
                    w.trace[from..].join("\n  ")
                ));
            }
        }
        w.actor.close().await.map_err(|e| e.to_string())?;
        Ok(w.power_losses)
    })
    .expect("executor")
}

#[test]
fn a_partition_on_a_simulated_disk_keeps_every_acknowledged_operation_across_power_losses() {
    let cases = env_u64("SLUICE_CASES").unwrap_or(12);
    let first = env_u64("SLUICE_SEED").unwrap_or_else(rand::random);
    let mut power_losses = 0;
    for k in 0..cases {
        let seed = first.wrapping_add(k);
        match run_case(seed, 160) {
            Ok(n) => power_losses += n,
            Err(e) => panic!(
                "\n*** simulated partition failed with seed {seed}: rerun with SLUICE_SEED={seed} \
                 SLUICE_CASES=1 ***\n{e}"
            ),
        }
    }
    assert!(
        cases == 0 || power_losses > 0,
        "the cases lost power at least once"
    );
}
