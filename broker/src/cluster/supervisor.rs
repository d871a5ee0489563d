//! [`PartitionSupervisor`]: runs a queue partition's actor on the node whose replica leads, and
//! only while it leads.
//!
//! It watches its replica (every driver round notifies it) and:
//! - when the replica serves (leads, with an entry of its term committed) and no actor runs
//!   for this term, opens one: the engine replays exactly the committed log, on a
//!   [`LeaderClock`] starting at the log's last record time, with inherited leases pushed back
//!   by the clock-skew margin;
//! - when the replica stops serving, or serves in a newer term, halts the actor at once: its
//!   engine may hold effects that never committed (a deposed leader rebuilds from the
//!   committed prefix before it serves again).
//!
//! Requests go to [`PartitionSupervisor::actor`], which answers `NotLeader` (with the leader
//! this node knows) where no actor runs: a retryable 503 to SQS clients, a hint to the SDK.

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::{Rc, Weak};

use sluice_raft::GroupId;
use sluice_storage::fs::Fs;
use sluice_storage::LogConfig;

use super::clock::LeaderClock;
use super::replicated::{ReplicaHost, ReplicatedLog};
use crate::engine::PartitionConfig;
use crate::error::{ServiceError, ServiceResult};
use crate::runtime::Clock;
use crate::shard::partition::{MoveSink, PartitionActor};

/// The actor a supervisor runs.
pub type LeaderActor<F, C> = PartitionActor<ReplicatedLog<F>, LeaderClock<C>>;

/// A running actor and the term it was opened in.
type Running<F, C> = (u64, Rc<LeaderActor<F, C>>);

/// What a supervisor needs to open its partition.
pub struct PartitionSpec {
    pub group: GroupId,
    pub dir: PathBuf,
    pub config: PartitionConfig,
    pub log_config: LogConfig,
    pub moves: MoveSink,
}

/// Counters of a supervisor (tests show the paths taken).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SupervisorStats {
    /// Actors opened (one per term this node led and served in).
    pub opened: u64,
    /// Actors halted because the replica stopped serving or a newer term began.
    pub halted: u64,
    /// Opens that failed (leadership moved during the replay, a storage error).
    pub open_failed: u64,
}

/// One queue partition's supervisor on one node (see the module doc).
pub struct PartitionSupervisor<F: Fs, C: Clock> {
    host: Rc<ReplicaHost<F, C>>,
    clock: C,
    spec: PartitionSpec,
    /// The queue's attributes as the catalog has them now (actors opened later start here).
    config: RefCell<PartitionConfig>,
    /// The running actor and the term it was opened in.
    current: RefCell<Option<Running<F, C>>>,
    stopped: Cell<bool>,
    stats: Cell<SupervisorStats>,
}

impl<F: Fs, C: Clock> PartitionSupervisor<F, C> {
    /// Starts supervising `spec.group`'s replica, hosted on `host`.
    pub fn start(host: Rc<ReplicaHost<F, C>>, clock: C, spec: PartitionSpec) -> Rc<Self> {
        let s = Rc::new(PartitionSupervisor {
            host,
            clock,
            config: RefCell::new(spec.config.clone()),
            spec,
            current: RefCell::new(None),
            stopped: Cell::new(false),
            stats: Cell::new(SupervisorStats::default()),
        });
        glommio::spawn_local(watch(Rc::downgrade(&s))).detach();
        s
    }

    /// The actor to send requests to, or `NotLeader` with this node's hint.
    pub fn actor(&self) -> ServiceResult<Rc<LeaderActor<F, C>>> {
        if let Some((_, a)) = self.current.borrow().as_ref() {
            return Ok(a.clone());
        }
        let (leader_hint, term) = self
            .host
            .replica(self.spec.group)
            .map_or((None, 0), |r| (r.leader(), r.term()));
        Err(ServiceError::NotLeader {
            leader_hint,
            term,
            outcome_unknown: false,
        })
    }

    pub fn stats(&self) -> SupervisorStats {
        self.stats.get()
    }

    /// The queue's attributes changed: actors opened from now on start with `config`.
    pub fn set_config(&self, config: PartitionConfig) {
        *self.config.borrow_mut() = config;
    }

    /// The partition's directory (its replica's log).
    pub fn dir(&self) -> &std::path::Path {
        &self.spec.dir
    }

    /// The bytes the replica's log holds on this node.
    pub fn log_size_bytes(&self) -> u64 {
        self.host
            .replica(self.spec.group)
            .map_or(0, |r| r.log().size_bytes())
    }

    fn bump(&self, f: impl FnOnce(&mut SupervisorStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// Halts the actor (if any) and stops watching.
    pub fn stop(&self) {
        self.stopped.set(true);
        self.halt_current();
    }

    fn halt_current(&self) {
        if let Some((_, a)) = self.current.borrow_mut().take() {
            a.halt();
            self.bump(|s| s.halted += 1);
        }
    }

    /// One look at the replica: halt or open as the module doc says.
    async fn reconcile(&self) {
        let Some(replica) = self.host.replica(self.spec.group) else {
            self.halt_current();
            return;
        };
        let (serving, term) = (replica.is_serving(), replica.term());
        let current_term = self.current.borrow().as_ref().map(|(t, _)| *t);
        match current_term {
            Some(t) if serving && t == term => return,
            Some(_) => self.halt_current(),
            None => {}
        }
        if !serving {
            return;
        }
        let floor = match self.host.last_record_ms(self.spec.group).await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(group = self.spec.group, error = %e, "reading the log's time");
                self.bump(|s| s.open_failed += 1);
                return;
            }
        };
        let config = self.config.borrow().clone();
        let opened = PartitionActor::open_on(
            self.host.env(),
            LeaderClock::new(self.clock.clone(), floor),
            self.spec.dir.clone(),
            config,
            self.spec.log_config.clone(),
            self.spec.moves.clone(),
        )
        .await;
        match opened {
            // Still the same term's leader after the replay: serve.
            Ok(a) if replica.is_serving() && replica.term() == term && !self.stopped.get() => {
                *self.current.borrow_mut() = Some((term, a));
                self.bump(|s| s.opened += 1);
            }
            Ok(a) => a.halt(),
            Err(e) => {
                tracing::debug!(group = self.spec.group, error = %e, "opening the partition");
                self.bump(|s| s.open_failed += 1);
            }
        }
    }
}

async fn watch<F: Fs, C: Clock>(s: Weak<PartitionSupervisor<F, C>>) {
    loop {
        let Some(sup) = s.upgrade() else { return };
        if sup.stopped.get() {
            return;
        }
        let progressed = sup.host.progressed(sup.spec.group);
        let listen = progressed.as_ref().map(|e| e.listen());
        sup.reconcile().await;
        let clock = sup.clock.clone();
        drop(sup);
        // Re-check at least every election-tick, in case a change came between looks.
        let until = clock.now_ms() + super::replicated::TICK_INTERVAL_MS * 5;
        match listen {
            Some(l) => {
                let l = std::pin::pin!(l);
                let t = std::pin::pin!(clock.sleep_until_ms(until));
                futures::future::select(l, t).await;
            }
            None => clock.sleep_until_ms(until).await,
        }
    }
}
