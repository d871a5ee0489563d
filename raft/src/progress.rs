//! What a leader knows of one follower: how far its log verifiably matches, how far that is
//! written and flushed, and the flow-control state of the appends sent to it.

use crate::types::{DiskId, Offset};
use std::collections::VecDeque;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ProgressState {
    /// Unknown match: one append in flight at a time, until one succeeds.
    Probe,
    /// Known match: appends pipelined up to `max_inflight_bytes`.
    Replicate,
    /// Needs a snapshot (its next offset is below the leader's log start); waiting for it.
    Snapshot,
}

#[derive(Clone, Debug)]
pub struct Progress {
    /// The disk the membership lists for this node: answers from any other disk are not counted.
    pub disk: DiskId,
    /// Written on the follower AND verified equal to this leader's log.
    pub matched: Offset,
    /// Flushed on the follower AND verified equal to this leader's log.
    pub flushed: Offset,
    /// Next offset to send.
    pub next: Offset,
    pub state: ProgressState,
    /// Probe: an append is in flight, wait for its answer (or the next heartbeat answer).
    pub paused: bool,
    /// (end offset, bytes) of each append in flight, for the pipelining window.
    pub inflight: VecDeque<(Offset, usize)>,
    pub inflight_bytes: usize,
    /// Heard from in this check-quorum window.
    pub recent_active: bool,
    /// A read of the log owner is pending for this follower.
    pub fetch_pending: bool,
    /// `matched` at the previous heartbeat answer (informational: lost appends are now found
    /// by `waiting_since_ms`, which a late answer cannot fool).
    pub matched_at_last_heartbeat: Offset,
    /// Leader's clock when `matched` last moved forward. A heartbeat answer reflects every
    /// acknowledgement only if its heartbeat left after this; an earlier one may be late.
    pub acked_at_ms: u64,
    /// Leader's clock when the oldest unanswered append (or probe) went out, or when the
    /// follower last made progress with appends still in flight: the start of the wait that
    /// decides whether an append was lost.
    pub waiting_since_ms: u64,
    /// When the snapshot was asked for, to retry a lost one.
    pub snapshot_at_ms: u64,
}

impl Progress {
    pub fn new(disk: DiskId, next: Offset) -> Self {
        Progress {
            disk,
            matched: 0,
            flushed: 0,
            next,
            state: ProgressState::Probe,
            paused: false,
            inflight: VecDeque::new(),
            inflight_bytes: 0,
            recent_active: false,
            fetch_pending: false,
            matched_at_last_heartbeat: 0,
            acked_at_ms: 0,
            waiting_since_ms: 0,
            snapshot_at_ms: 0,
        }
    }

    pub fn become_probe(&mut self, next: Offset) {
        self.state = ProgressState::Probe;
        self.next = next;
        self.paused = false;
        self.inflight.clear();
        self.inflight_bytes = 0;
    }

    pub fn become_replicate(&mut self) {
        self.state = ProgressState::Replicate;
        self.next = self.next.max(self.matched);
        self.paused = false;
    }

    /// Frees the window up to `offset` (acknowledged as written).
    pub fn ack(&mut self, offset: Offset) {
        while let Some(&(end, bytes)) = self.inflight.front() {
            if end > offset {
                break;
            }
            self.inflight.pop_front();
            self.inflight_bytes -= bytes;
        }
    }

    /// Whether another append may be sent now. In `Replicate`, while the window is not full: an
    /// append may overshoot it by its own size, so an entry larger than the room left (or than
    /// the whole window, up to `max_entry_bytes`) is delayed until acknowledgements free the
    /// window, never blocked for good.
    pub fn can_send(&self, max_inflight_bytes: usize) -> bool {
        match self.state {
            ProgressState::Probe => !self.paused,
            ProgressState::Replicate => self.inflight_bytes < max_inflight_bytes,
            ProgressState::Snapshot => false,
        }
    }

    pub fn sent(&mut self, end: Offset, bytes: usize) {
        match self.state {
            ProgressState::Probe => self.paused = true,
            ProgressState::Replicate => {
                self.next = end;
                self.inflight.push_back((end, bytes));
                self.inflight_bytes += bytes;
            }
            ProgressState::Snapshot => {}
        }
    }
}
