//! Replication: the leader's appends (pipelined, bounded, from its cache or read through the log
//! owner), the follower's consistency check and responses, commit on flushed majorities,
//! snapshots for followers below the log start.
//!
//! What a follower reports is bounded by `leader_match`: how far its log is verified equal to
//! the current leader's. A follower may hold a flushed suffix from an older term that the leader
//! will overwrite; reporting it as "flushed" would let the leader count bytes it never sent.

use crate::group::{Fetch, Proposal, RaftGroup, RaftRole};
use crate::message::{Body, HeartbeatGroup, HeartbeatRespGroup, APPEND_ENTRIES_MAX};
use crate::progress::ProgressState;
use crate::types::{Entry, EntryKind, NodeId, Offset, Snapshot, SnapshotMeta, Term};
use crate::{Durability, StepError};
use bytes::Bytes;

impl RaftGroup {
    pub(crate) fn append_as_leader(
        &mut self,
        kind: EntryKind,
        data: Bytes,
        count: u32,
    ) -> Proposal {
        let e = Entry {
            offset: self.log.end,
            count,
            term: self.hs.term,
            kind,
            data,
        };
        let p = Proposal {
            term: e.term,
            offset: e.offset,
            end: e.end(),
            bytes: e.data.len(),
        };
        self.queue_append(e, true);
        if kind != EntryKind::Noop {
            self.pending.push_back(p);
            self.pending_bytes += p.bytes;
        }
        self.dirty = true;
        let peers: Vec<NodeId> = self.progress.keys().copied().collect();
        for peer in peers {
            self.send_append(peer);
        }
        p
    }

    /// Sends `peer` what it lacks, as far as its flow control allows.
    pub(crate) fn send_append(&mut self, peer: NodeId) {
        // Bounded: each round sends at least one batch or returns.
        loop {
            let Some(pr) = self.progress.get_mut(&peer) else {
                return;
            };
            if pr.fetch_pending || !pr.can_send(self.cfg.max_inflight_bytes) {
                return;
            }
            if pr.next < self.log.start {
                pr.state = ProgressState::Snapshot;
                pr.snapshot_at_ms = self.now_ms;
                self.out.snapshot_requests.push(peer);
                return;
            }
            if pr.next >= self.log.end {
                if pr.state == ProgressState::Probe {
                    // An empty append: establishes the match at our log end.
                    let end = self.log.end;
                    pr.waiting_since_ms = self.now_ms;
                    pr.sent(end, 0);
                    let body = Body::Append {
                        prev_offset: end,
                        prev_term: self.log.last_term(),
                        entries: Vec::new(),
                        commit: self.commit,
                    };
                    self.send(peer, self.hs.term, body);
                }
                return;
            }
            let cached =
                self.log
                    .read_cached(pr.next, self.cfg.max_append_bytes, APPEND_ENTRIES_MAX);
            match cached {
                Some(entries) => {
                    if !self.send_entries(peer, entries) {
                        return;
                    }
                }
                None => {
                    pr.fetch_pending = true;
                    self.out.fetches.push(Fetch {
                        peer,
                        from: pr.next,
                        max_bytes: self.cfg.max_append_bytes,
                    });
                    return;
                }
            }
        }
    }

    /// Sends a contiguous run of this leader's entries. Returns false if they do not fit the log.
    fn send_entries(&mut self, peer: NodeId, entries: Vec<Entry>) -> bool {
        let Some(first) = entries.first() else {
            return false;
        };
        let prev_offset = first.offset;
        let Some(prev_term) = self.log.term_before(prev_offset) else {
            return false;
        };
        let end = entries.last().expect("non-empty").end();
        let bytes: usize = entries.iter().map(|e| e.data.len()).sum();
        let Some(pr) = self.progress.get_mut(&peer) else {
            return false;
        };
        if pr.state == ProgressState::Probe || pr.inflight.is_empty() {
            pr.waiting_since_ms = self.now_ms;
        }
        pr.sent(end, bytes);
        let body = Body::Append {
            prev_offset,
            prev_term,
            entries,
            commit: self.commit,
        };
        self.send(peer, self.hs.term, body);
        true
    }

    /// The log owner's answer to a `Fetch`: entries of this leader's log from the batch covering
    /// `from`. Empty: the log no longer holds `from` (compacted), so a snapshot is needed.
    /// The first entry is sent whatever its size (a batch above `max_append_bytes` goes alone);
    /// entries past `max_append_bytes` or `APPEND_ENTRIES_MAX` are dropped here and read again
    /// later, so an owner that returns too much never makes an append the codec refuses.
    pub fn on_fetched(&mut self, peer: NodeId, from: Offset, mut entries: Vec<Entry>) {
        entries.truncate(pack_len(&entries, self.cfg.max_append_bytes));
        if self.role != RaftRole::Leader {
            return;
        }
        let Some(pr) = self.progress.get_mut(&peer) else {
            return;
        };
        pr.fetch_pending = false;
        self.dirty = true;
        // Only entries that are exactly ours, contiguous, covering what the follower needs next.
        let mut ok = entries
            .first()
            .is_some_and(|e| e.offset <= pr.next && e.end() > pr.next && from <= pr.next);
        let mut expect = entries.first().map_or(0, |e| e.offset);
        for e in &entries {
            ok &= e.offset == expect && e.count > 0 && self.log.term_at(e.offset) == Some(e.term);
            expect = e.end();
        }
        if ok && pr.can_send(self.cfg.max_inflight_bytes) {
            self.send_entries(peer, entries);
        }
        self.send_append(peer);
    }

    /// The meta a snapshot for `snapshot_requests` must carry: the state at the log start.
    pub fn snapshot_meta(&self) -> SnapshotMeta {
        SnapshotMeta {
            offset: self.log.start,
            term: self.log.start_term,
            membership: self.configs[0].1.clone(),
        }
    }

    /// The owner built the snapshot asked for by `snapshot_requests` (meta from `snapshot_meta`).
    pub fn on_snapshot_built(&mut self, peer: NodeId, snapshot: Snapshot) {
        if self.role != RaftRole::Leader || snapshot.meta != self.snapshot_meta() {
            return;
        }
        let Some(pr) = self.progress.get_mut(&peer) else {
            return;
        };
        if pr.state != ProgressState::Snapshot {
            return;
        }
        pr.snapshot_at_ms = self.now_ms;
        self.dirty = true;
        self.send(peer, self.hs.term, Body::InstallSnapshot { snapshot });
    }

    /// Follower side of an append from the leader of the current term.
    pub(crate) fn handle_append(
        &mut self,
        from: NodeId,
        prev_offset: Offset,
        prev_term: Term,
        mut entries: Vec<Entry>,
        commit: Offset,
    ) -> Result<(), StepError> {
        let mut expect = prev_offset;
        let mut last_term = prev_term;
        for e in &entries {
            if e.offset != expect || e.count == 0 {
                return Err(StepError::MalformedAppend("entries not contiguous"));
            }
            if e.term < last_term || e.term > self.hs.term {
                return Err(StepError::MalformedAppend("entry terms out of order"));
            }
            expect = e.end();
            last_term = e.term;
        }
        self.follow(from);
        let msg_end = expect;
        // Everything below our commit equals the leader's log: skip it.
        let (mut prev_offset, mut prev_term) = (prev_offset, prev_term);
        if prev_offset < self.commit {
            entries.retain(|e| e.end() > self.commit);
            if entries.first().is_some_and(|e| e.offset != self.commit) {
                return Err(StepError::MalformedAppend(
                    "batch straddles the commit offset",
                ));
            }
            prev_offset = self.commit;
            prev_term = self
                .log
                .term_before(prev_offset)
                .expect("commit is within the log");
        }
        match self.log.term_before(prev_offset) {
            None => {
                let hint = self.log.end;
                self.send_append_resp(from, Some(hint));
                return Ok(());
            }
            Some(t) if t != prev_term => {
                let hint = self.log.term_run_start(prev_offset).max(self.commit);
                self.send_append_resp(from, Some(hint));
                return Ok(());
            }
            Some(_) => {}
        }
        for e in entries {
            if e.offset < self.log.end {
                if self.log.term_at(e.offset) == Some(e.term) {
                    continue; // Already held (a duplicate or a re-sent batch).
                }
                self.truncate(e.offset);
            }
            self.queue_append(e, false);
        }
        self.leader_match = self.leader_match.max(msg_end).max(self.commit);
        self.set_commit(commit.min(self.leader_match));
        self.respond = true;
        Ok(())
    }

    /// Adopts `from` as this term's leader (it sent us an append, a snapshot or a heartbeat).
    fn follow(&mut self, from: NodeId) {
        if self.role != RaftRole::Follower || self.leader != Some(from) {
            let term = self.hs.term;
            self.become_follower(term, Some(from));
        }
        self.leader_contact_ms = Some(self.now_ms);
        self.reset_election_deadline();
    }

    /// (appended, flushed) as verified against the current leader's log.
    fn position(&self) -> (Offset, Offset) {
        let lm = self.leader_match;
        (self.appended.min(lm), self.flushed.min(lm))
    }

    pub(crate) fn send_append_resp(&mut self, to: NodeId, reject: Option<Offset>) {
        let (appended, flushed) = self.position();
        if reject.is_none() {
            self.reported = (appended, flushed);
            self.respond = false;
        }
        let body = Body::AppendResp {
            disk: self.hs.disk,
            appended,
            flushed,
            reject,
        };
        self.send(to, self.hs.term, body);
    }

    /// Follower: answers the leader when its position moved, or when an append asked for it.
    pub(crate) fn maybe_report(&mut self) {
        let Some(leader) = self.leader else {
            return;
        };
        let pos = self.position();
        // With entries still to write, wait: `on_appended` will move the position.
        let waiting = !self.out.entries.is_empty();
        if pos != self.reported || (self.respond && !waiting) {
            self.send_append_resp(leader, None);
        }
    }

    pub(crate) fn handle_append_resp(
        &mut self,
        from: NodeId,
        disk: crate::DiskId,
        appended: Offset,
        flushed: Offset,
        reject: Option<Offset>,
    ) {
        if self.role != RaftRole::Leader {
            return;
        }
        let Some(pr) = self.progress.get_mut(&from) else {
            return;
        };
        if disk != pr.disk {
            self.on_foreign_disk(from, disk);
            return;
        }
        pr.recent_active = true;
        if let Some(hint) = reject {
            pr.matched = pr.matched.min(hint);
            pr.become_probe(hint.min(self.log.end));
            self.send_append(from);
            return;
        }
        let (appended, flushed) = (appended.min(self.log.end), flushed.min(self.log.end));
        if appended > pr.matched {
            pr.acked_at_ms = self.now_ms;
            pr.waiting_since_ms = self.now_ms;
        }
        pr.matched = pr.matched.max(appended);
        pr.flushed = pr.flushed.max(flushed);
        pr.ack(appended);
        match pr.state {
            ProgressState::Probe => {
                pr.next = pr.matched;
                pr.become_replicate();
            }
            ProgressState::Snapshot if pr.matched >= self.log.start => {
                pr.next = pr.matched;
                pr.become_replicate();
            }
            _ => {}
        }
        self.maybe_commit();
        self.maybe_send_timeout_now(from);
        self.maybe_promote(from);
        self.send_append(from);
        self.release_cache();
    }

    /// Drops cached entries every follower has written.
    fn release_cache(&mut self) {
        let min = self
            .progress
            .values()
            .map(|p| p.matched)
            .min()
            .unwrap_or(self.log.end);
        self.log.release_cache(min);
    }

    /// Commit = the highest offset durable on a quorum of voters (the leader counting itself
    /// only once its own write is flushed), provided it ends an entry of this leader's term.
    pub(crate) fn maybe_commit(&mut self) {
        if self.role != RaftRole::Leader {
            return;
        }
        let relaxed = matches!(self.cfg.durability, Durability::RelaxedWritten { .. });
        let m = self.membership();
        let mut vals: Vec<Offset> = Vec::with_capacity(m.members.len());
        for (r, role) in &m.members {
            if *role != crate::Role::Voter {
                continue;
            }
            let v = if r.node == self.me {
                if r.disk == self.hs.disk {
                    self.durable()
                } else {
                    0
                }
            } else {
                self.progress
                    .get(&r.node)
                    .filter(|p| p.disk == r.disk)
                    .map_or(0, |p| if relaxed { p.matched } else { p.flushed })
            };
            vals.push(v);
        }
        if vals.is_empty() {
            return;
        }
        let quorum = m.quorum();
        vals.sort_unstable_by(|a, b| b.cmp(a));
        let q = vals[quorum - 1].min(self.log.end);
        if q > self.commit && self.log.term_before(q) == Some(self.hs.term) {
            self.set_commit(q);
        }
    }

    /// Follower side of a snapshot from the current leader.
    pub(crate) fn handle_snapshot(&mut self, from: NodeId, snapshot: Snapshot) {
        self.follow(from);
        let meta = &snapshot.meta;
        if meta.offset <= self.commit {
            self.leader_match = self.leader_match.max(self.commit);
            self.respond = true;
            return;
        }
        if self.log.term_before(meta.offset) == Some(meta.term) {
            // We hold the entry it ends at: keep our log, adopt the commit.
            self.leader_match = self.leader_match.max(meta.offset);
            self.set_commit(meta.offset);
            self.respond = true;
            return;
        }
        // Replace the log. The owner installs the snapshot durably before sending this Ready's
        // messages (as it persists the hard state), so it counts as written and flushed.
        self.log.reset(meta.offset, meta.term);
        self.configs = vec![(meta.offset, meta.membership.clone())];
        self.on_membership_changed();
        self.commit = meta.offset;
        self.appended = meta.offset;
        self.flushed = meta.offset;
        self.log_epoch += 1;
        self.leader_match = meta.offset;
        self.out.entries.clear();
        self.out.truncate_to = None;
        self.out.commit = None;
        self.out.snapshot = Some(snapshot);
        self.respond = true;
    }

    // ---- Coalesced heartbeats (see multi.rs) ------------------------------------------------

    /// Leader: this group's entry in the heartbeat to `peer`.
    pub(crate) fn heartbeat_for(&self, peer: NodeId) -> Option<HeartbeatGroup> {
        let pr = self.progress.get(&peer)?;
        Some(HeartbeatGroup {
            group: self.id,
            term: self.hs.term,
            commit: self.commit.min(pr.matched),
        })
    }

    /// Follower: a heartbeat from `from`; returns the answer.
    pub(crate) fn handle_heartbeat(
        &mut self,
        now_ms: u64,
        from: NodeId,
        hb: HeartbeatGroup,
    ) -> HeartbeatRespGroup {
        self.now_ms = self.now_ms.max(now_ms);
        if hb.term >= self.hs.term {
            if hb.term > self.hs.term {
                self.become_follower(hb.term, Some(from));
                self.dirty = true;
            }
            self.follow(from);
            self.set_commit(hb.commit.min(self.leader_match).min(self.log.end));
        }
        let (appended, flushed) = self.position();
        HeartbeatRespGroup {
            group: self.id,
            term: self.hs.term,
            disk: self.hs.disk,
            appended,
            flushed,
        }
    }

    /// Leader: a follower's heartbeat answer, to the heartbeat this leader sent at `sent_ms`
    /// (its own clock, echoed back). Also the retransmission path: an append that was lost
    /// shows up as an answer, to a heartbeat sent a full interval after the append, that does
    /// not include it.
    ///
    /// Answers are judged by when their heartbeat left, never by when they arrive: an answer
    /// reordered behind newer acknowledgements (late) reports an older position, and must
    /// neither move the follower back nor make the leader probe or re-send.
    pub(crate) fn handle_heartbeat_resp(
        &mut self,
        now_ms: u64,
        from: NodeId,
        sent_ms: u64,
        r: HeartbeatRespGroup,
    ) {
        self.now_ms = self.now_ms.max(now_ms);
        if r.term > self.hs.term {
            self.dirty = true;
            self.become_follower(r.term, None);
            return;
        }
        if self.role != RaftRole::Leader || r.term < self.hs.term {
            return;
        }
        let end = self.log.end;
        let now = self.now_ms;
        let interval_ms = self.cfg.heartbeat_interval_ms;
        let election_timeout_ms = self.cfg.election_timeout_ms;
        let Some(pr) = self.progress.get_mut(&from) else {
            return;
        };
        if r.disk != pr.disk {
            self.dirty = true;
            self.on_foreign_disk(from, r.disk);
            return;
        }
        pr.recent_active = true;
        // Flushed is durable on that disk: any report of it, late or not, only adds.
        pr.flushed = pr.flushed.max(r.flushed.min(end));
        let mut resend = false;
        let appended = r.appended.min(end);
        if appended < pr.matched {
            // Less than it acknowledged. If the heartbeat left after the latest acknowledgement
            // arrived, the follower really holds less (it restarted and lost unflushed writes):
            // probe again. Otherwise the answer is late and tells nothing new.
            if sent_ms > pr.acked_at_ms {
                pr.matched = appended;
                pr.become_probe(end);
                resend = true;
            }
        } else {
            if appended > pr.matched {
                pr.matched = appended;
                pr.acked_at_ms = now;
                pr.waiting_since_ms = now;
                pr.ack(appended);
            }
            // What was sent a full interval before this heartbeat left, and is still not in its
            // answer, was lost (or is hopelessly slow): send it again.
            let overdue = sent_ms >= pr.waiting_since_ms.saturating_add(interval_ms);
            if pr.matched < end {
                match pr.state {
                    ProgressState::Probe if !pr.paused || overdue => {
                        pr.paused = false;
                        resend = true;
                    }
                    ProgressState::Replicate if overdue => {
                        let m = pr.matched;
                        pr.become_probe(m);
                        resend = true;
                    }
                    ProgressState::Snapshot
                        if now >= pr.snapshot_at_ms.saturating_add(election_timeout_ms) =>
                    {
                        let m = pr.matched;
                        pr.become_probe(m);
                        resend = true;
                    }
                    _ => {}
                }
            }
        }
        pr.matched_at_last_heartbeat = pr.matched;
        if resend {
            self.dirty = true;
            self.send_append(from);
        }
        self.maybe_promote(from);
        let before = self.commit;
        self.maybe_commit();
        if self.commit != before {
            self.dirty = true;
        }
    }
}

/// How many of `entries` one append carries: at least one (however large), then as many as fit
/// `max_bytes` of data and `APPEND_ENTRIES_MAX` entries.
fn pack_len(entries: &[Entry], max_bytes: usize) -> usize {
    let mut bytes = 0usize;
    for (i, e) in entries.iter().enumerate() {
        if i > 0 && (bytes + e.data.len() > max_bytes || i >= APPEND_ENTRIES_MAX) {
            return i;
        }
        bytes += e.data.len();
    }
    entries.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(offset: Offset, len: usize) -> Entry {
        Entry {
            offset,
            count: 1,
            term: 1,
            kind: EntryKind::Data,
            data: Bytes::from(vec![0u8; len]),
        }
    }

    #[test]
    fn packing_keeps_at_least_one_entry_and_respects_both_limits() {
        assert_eq!(pack_len(&[], 10), 0);
        assert_eq!(
            pack_len(&[e(0, 50), e(1, 1)], 10),
            1,
            "a large first entry alone"
        );
        assert_eq!(pack_len(&[e(0, 4), e(1, 6), e(2, 1)], 10), 2);
        let many: Vec<Entry> = (0..APPEND_ENTRIES_MAX as u64 + 5)
            .map(|o| e(o, 0))
            .collect();
        assert_eq!(pack_len(&many, 10), APPEND_ENTRIES_MAX);
    }
}
