//! One partition of a queue on its shard: the sans-I/O engine, its log, its timer and its
//! long-poll waiters.
//!
//! The order that makes replay exact: wait for log space, then — with no await in between —
//! let the engine decide and apply a command and stage its records in the log. Records reach
//! the log in the order the engine applied them. The reply waits until they are durable. If a
//! commit fails, the engine's state is ahead of the log: the partition rebuilds itself from the
//! log before serving again.

use crate::engine::{
    Command, Counters, Limits, MoveRequest, Partition, PartitionConfig, Record as EngineRecord,
    Reply,
};
use crate::error::{ServiceError, ServiceResult};
use crate::runtime::{self, Event};
use sluice_storage::batch::BatchBuilder;
use sluice_storage::fs::DmaFs;
use sluice_storage::{Log, LogConfig};
use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;

/// Long-poll waiters parked on one partition at once; more get `OverLimit`-style back-pressure.
pub const WAITERS_PER_PARTITION_MAX: usize = 10_000;
/// Bytes read per step when replaying the log at start-up.
const REPLAY_READ_BYTES: usize = 4 * 1024 * 1024;

/// Where DLQ moves go: the shard forwards them to the dead-letter queue's partition.
pub type MoveSink = Rc<dyn Fn(MoveRequest)>;

pub struct PartitionActor {
    pub queue_id: u64,
    pub partition: u32,
    dir: PathBuf,
    fs: DmaFs,
    log_config: LogConfig,
    config: RefCell<PartitionConfig>,
    engine: RefCell<Partition>,
    log: RefCell<Rc<Log<DmaFs>>>,
    /// Something may have become deliverable (a send, an expired lease, a released message).
    ready: Event,
    /// The next timer deadline may have moved earlier.
    rearm: Event,
    broken: Cell<bool>,
    closed: Cell<bool>,
    waiters: Cell<usize>,
    moves: MoveSink,
}

fn encode_records(records: &[EngineRecord], now_ms: u64) -> Vec<u8> {
    let mut b = BatchBuilder::new();
    let mut buf = Vec::new();
    for r in records {
        buf.clear();
        r.encode_into(&mut buf);
        b.push_parts(now_ms as i64, None, &buf, std::iter::empty());
    }
    b.finish().expect("effects with records are not empty")
}

impl PartitionActor {
    /// Opens the partition's log and rebuilds the engine by replaying it.
    pub async fn open(
        fs: DmaFs,
        dir: PathBuf,
        config: PartitionConfig,
        log_config: LogConfig,
        moves: MoveSink,
    ) -> ServiceResult<Rc<PartitionActor>> {
        let (log, engine) = Self::load(&fs, &dir, &config, &log_config).await?;
        let actor = Rc::new(PartitionActor {
            queue_id: config.queue_id,
            partition: config.partition,
            dir,
            fs,
            log_config,
            config: RefCell::new(config),
            engine: RefCell::new(engine),
            log: RefCell::new(Rc::new(log)),
            ready: Event::default(),
            rearm: Event::default(),
            broken: Cell::new(false),
            closed: Cell::new(false),
            waiters: Cell::new(0),
            moves,
        });
        // Moves that were started but not completed before a restart go out again.
        for mv in actor.engine.borrow().pending_moves() {
            (actor.moves)(mv);
        }
        runtime::spawn(Self::timer_loop(actor.clone()));
        Ok(actor)
    }

    async fn load(
        fs: &DmaFs,
        dir: &PathBuf,
        config: &PartitionConfig,
        log_config: &LogConfig,
    ) -> ServiceResult<(Log<DmaFs>, Partition)> {
        let log = Log::open(fs.clone(), dir.clone(), log_config.clone()).await?;
        let mut engine = Partition::new(config.clone())?;
        let mut at = log.start_offset();
        let end = log.end_offset();
        while at < end {
            let batches = log.read(at, REPLAY_READ_BYTES).await?;
            if batches.is_empty() {
                break;
            }
            for b in &batches {
                for r in b.view().records() {
                    let r = r.map_err(|e| ServiceError::Internal(format!("log record: {e}")))?;
                    if r.offset < at {
                        continue;
                    }
                    let rec = EngineRecord::decode(r.value).map_err(|e| {
                        ServiceError::Internal(format!("engine record at {}: {e}", r.offset))
                    })?;
                    engine.replay(&rec).map_err(|e| {
                        ServiceError::Internal(format!("replay at offset {}: {e}", r.offset))
                    })?;
                }
                at = b.header.next_offset();
            }
        }
        Ok((log, engine))
    }

    /// After a failed commit the engine is ahead of the log: reopen the log (recovery decides
    /// what is on disk) and replay it.
    async fn rebuild(&self) -> ServiceResult<()> {
        tracing::warn!(
            queue = self.queue_id,
            partition = self.partition,
            "rebuilding partition from its log after a failed commit"
        );
        let config = self.config.borrow().clone();
        let (log, engine) = Self::load(&self.fs, &self.dir, &config, &self.log_config).await?;
        *self.log.borrow_mut() = Rc::new(log);
        *self.engine.borrow_mut() = engine;
        self.broken.set(false);
        self.ready.notify();
        self.rearm.notify();
        Ok(())
    }

    fn log(&self) -> Rc<Log<DmaFs>> {
        self.log.borrow().clone()
    }

    /// Runs one command: decide and apply, stage, wait until durable, then reply.
    pub async fn execute(&self, cmd: Command) -> ServiceResult<Reply> {
        if self.closed.get() {
            return Err(ServiceError::Unavailable("partition closed"));
        }
        if self.broken.get() {
            self.rebuild().await?;
        }
        let log = self.log();
        let estimate = match &cmd {
            Command::Send(s) => s.body.len() + 1024,
            Command::SendBatch(e) => e.iter().map(|e| e.request.body.len() + 1024).sum(),
            _ => 4096,
        };
        log.wait_for_space(estimate).await?;
        if self.broken.get() {
            return Err(ServiceError::Unavailable("partition is rebuilding"));
        }
        let wakes = matches!(
            cmd,
            Command::Send(_)
                | Command::SendBatch(_)
                | Command::ChangeVisibility { .. }
                | Command::AcceptMove(_)
                | Command::SetAttributes(_)
        );
        let now = runtime::now_ms();
        let effects = self.engine.borrow_mut().execute(now, cmd)?;
        let ticket = if effects.records.is_empty() {
            None
        } else {
            match log.stage_batch(encode_records(&effects.records, now)) {
                Ok(t) => Some(t),
                Err(e) => {
                    self.broken.set(true);
                    return Err(e.into());
                }
            }
        };
        if let Some(t) = ticket {
            if let Err(e) = log.durable(t).await {
                self.broken.set(true);
                return Err(e.into());
            }
        }
        self.rearm.notify();
        if wakes {
            self.ready.notify();
        }
        for mv in effects.moves {
            (self.moves)(mv);
        }
        Ok(effects.reply)
    }

    /// Resolves true as soon as the partition may have a deliverable message, false at the
    /// deadline. Does not lease anything: the caller receives afterwards.
    pub async fn wait_ready(&self, deadline_ms: u64) -> ServiceResult<bool> {
        if self.waiters.get() >= WAITERS_PER_PARTITION_MAX {
            return Err(ServiceError::Throttled(
                "too many long polls parked on this partition",
            ));
        }
        self.waiters.set(self.waiters.get() + 1);
        let _guard = WaiterGuard(&self.waiters);
        loop {
            if self.closed.get() {
                return Ok(false);
            }
            if self.engine.borrow().has_deliverable() {
                return Ok(true);
            }
            if runtime::now_ms() >= deadline_ms {
                return Ok(false);
            }
            self.ready.listen_until(deadline_ms).await;
        }
    }

    pub fn counters(&self) -> Counters {
        self.engine.borrow().counters()
    }

    pub fn set_config(&self, config: PartitionConfig) {
        *self.config.borrow_mut() = config;
    }

    pub fn limits() -> Limits {
        Limits::default()
    }

    /// Stops serving and the timer; commits what is staged and closes the log.
    pub async fn close(&self) -> ServiceResult<()> {
        self.closed.set(true);
        self.rearm.notify();
        self.ready.notify();
        self.log().close().await?;
        Ok(())
    }

    pub fn dir(&self) -> &PathBuf {
        &self.dir
    }

    /// Fires the engine's timers (lease expiry, delay end, retention, dedup windows) when due.
    async fn timer_loop(this: Rc<PartitionActor>) {
        loop {
            if this.closed.get() {
                return;
            }
            let next = this.engine.borrow().next_deadline_ms();
            match next {
                Some(d) if d > runtime::now_ms() => {
                    this.rearm.listen_until(d).await;
                }
                Some(_) => {}
                None => {
                    this.rearm.listen().await;
                }
            }
            if this.closed.get() {
                return;
            }
            if this.broken.get() {
                // The next request rebuilds the partition; don't spin meanwhile.
                runtime::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
            let now = runtime::now_ms();
            if this
                .engine
                .borrow()
                .next_deadline_ms()
                .is_none_or(|d| d > now)
            {
                continue;
            }
            let log = this.log();
            if log.wait_for_space(4096).await.is_err() {
                this.broken.set(true);
                continue;
            }
            let effects = this.engine.borrow_mut().tick(now);
            if !effects.records.is_empty() {
                match log.stage_batch(encode_records(&effects.records, now)) {
                    Ok(t) => {
                        if log.durable(t).await.is_err() {
                            this.broken.set(true);
                        }
                    }
                    Err(_) => this.broken.set(true),
                }
            }
            for mv in effects.moves {
                (this.moves)(mv);
            }
            this.ready.notify();
            if this
                .engine
                .borrow()
                .next_deadline_ms()
                .is_some_and(|d| d <= now)
            {
                // A deadline the tick did not clear: never spin on it.
                runtime::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
    }
}

struct WaiterGuard<'a>(&'a Cell<usize>);

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}
