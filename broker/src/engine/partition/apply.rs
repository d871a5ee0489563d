//! Apply: records to state — what every replica runs, live right after a decision and on replay
//! (`apply`), and the timer effects that need no record (`advance`: delay ends, lease expiry,
//! retention, dedup/attempt/origin windows). Depends only on the state (`super`).

use super::*;

impl Partition {
    pub(super) fn apply_live(&mut self, rec: &Record) {
        if let Err(e) = self.apply_at(self.next_offset, rec) {
            // A live decision produced a record its own state rejects: a bug, never input.
            panic!("engine produced a record it cannot apply: {e} ({rec:?})");
        }
    }

    /// Runs every timer due at or before `now_ms` and returns the engine's clock, which never
    /// goes back (a clock step backwards is treated as no time passing).
    pub(super) fn advance(&mut self, now_ms: u64) -> u64 {
        let now = now_ms.max(self.now_ms);
        self.now_ms = now;
        while let Some(&Reverse((due, kind, id, epoch))) = self.timers.peek() {
            if due > now {
                break;
            }
            self.timers.pop();
            let Some(m) = self.msgs.get(&id) else {
                continue;
            };
            match kind {
                TIMER_LEASE => {
                    if matches!(m.state, State::InFlight { deadline_ms, .. } if deadline_ms == due)
                        && m.receive_count == epoch
                    {
                        self.transition(id, State::Available);
                    }
                }
                TIMER_DELAY => {
                    if m.state == State::Delayed && m.visible_at_ms == due {
                        self.transition(id, State::Available);
                    }
                }
                _ => {
                    if m.state != State::Moving {
                        let expires = m.sent_ms.saturating_add(self.retention_ms);
                        if expires <= now {
                            self.remove(id);
                        } else if expires != due {
                            // Retention grew since this timer was set.
                            self.timers.push(Reverse((expires, TIMER_RETENTION, id, 0)));
                        }
                    }
                }
            }
        }
        self.expire_tail(now);
        self.expire_waiting(now);
        while self.dedup.front_expires_ms().is_some_and(|e| e <= now) {
            self.dedup.pop_front();
        }
        while let Some((&seq, key)) = self.attempt_order.first_key_value() {
            let at = self.attempts.get(key).map_or(0, |e| e.at_ms);
            if at + ATTEMPT_WINDOW_MS > now {
                break;
            }
            let key = key.clone();
            self.attempt_order.remove(&seq);
            self.attempts.remove(&key);
        }
        while let Some((expires, _, _)) = self.origin_order.front() {
            if *expires > now {
                break;
            }
            let (_, key, _) = self.origin_order.pop_front().expect("front exists");
            self.origins.remove(&key);
        }
        // Superseded timers are dropped lazily; rebuild when they outnumber live ones so the
        // heap stays O(messages).
        if self.timers.len() > 3 * self.msgs.len() + 64 {
            self.rebuild_timers();
        }
        now
    }

    pub(super) fn rebuild_timers(&mut self) {
        let mut v = Vec::with_capacity(2 * self.msgs.len());
        for (&id, m) in &self.msgs {
            v.push(Reverse((
                m.sent_ms.saturating_add(self.retention_ms),
                TIMER_RETENTION,
                id,
                0,
            )));
            match m.state {
                State::Delayed => v.push(Reverse((m.visible_at_ms, TIMER_DELAY, id, 0))),
                State::InFlight { deadline_ms, .. } => {
                    v.push(Reverse((deadline_ms, TIMER_LEASE, id, m.receive_count)))
                }
                _ => {}
            }
        }
        self.timers = BinaryHeap::from(v);
    }

    /// Applies the record at log `offset`, and counts it.
    pub(super) fn apply_at(&mut self, offset: u64, rec: &Record) -> Result<(), ReplayError> {
        self.apply(rec, offset)?;
        self.next_offset = offset + 1;
        if matches!(rec.kind, RecordKind::Checkpoint(_)) {
            self.records_since_checkpoint = 0;
        } else {
            self.records_since_checkpoint += 1;
        }
        Ok(())
    }

    /// A record about message `id`, which is not here: skipped if its `Sent` may have been
    /// compacted away, else the log is inconsistent.
    pub(super) fn unknown(
        &self,
        id: u64,
        at_ms: u64,
        reason: &'static str,
    ) -> Result<(), ReplayError> {
        if !self.strict && id < self.ignore_below_id {
            Ok(())
        } else {
            Err(ReplayError { at_ms, reason })
        }
    }

    pub(super) fn note_attempt(
        &mut self,
        attempt: &str,
        batch_start: bool,
        item: (u64, u32),
        at: u64,
        offset: u64,
    ) {
        let seq = self.receive_seq;
        if batch_start {
            if let Some(old) = self.attempts.remove(attempt) {
                self.attempt_order.remove(&old.first_seq);
            }
            self.attempts.insert(
                attempt.to_string(),
                AttemptEntry {
                    at_ms: at,
                    first_seq: seq,
                    items: vec![item],
                    offset,
                },
            );
            self.attempt_order.insert(seq, attempt.to_string());
            while self.attempts.len() > self.cfg.limits.attempt_ids_max as usize {
                let Some((_, k)) = self.attempt_order.pop_first() else {
                    break;
                };
                self.attempts.remove(&k);
            }
        } else if let Some(e) = self.attempts.get_mut(attempt) {
            e.items.push(item);
        }
    }

    pub(super) fn set_retention(&mut self, retention_ms: u64) {
        let shorter = retention_ms < self.retention_ms;
        self.retention_ms = retention_ms;
        if shorter {
            // Existing retention timers would fire late; add earlier ones (the old ones then
            // find the message gone).
            for (&id, m) in &self.msgs {
                self.timers.push(Reverse((
                    m.sent_ms.saturating_add(retention_ms),
                    TIMER_RETENTION,
                    id,
                    0,
                )));
            }
        }
    }

    pub(super) fn apply_checkpoint(
        &mut self,
        cp: &Checkpoint,
        at: u64,
        offset: u64,
    ) -> Result<(), ReplayError> {
        let bad = |reason| Err(ReplayError { at_ms: at, reason });
        if self.skipping {
            // The start of a compacted log: the state so far is empty; start from here.
            self.skipping = false;
            self.replay_start = Some(offset);
            self.ignore_below_id = cp.next_id;
        } else if self.strict {
            // Pair assertion: what the writer saw is what replay rebuilt.
            if (cp.next_id, cp.receive_seq, cp.last_purge_ms)
                != (self.next_id, self.receive_seq, self.last_purge_ms)
            {
                return bad("checkpoint disagrees with the replayed counters");
            }
        } else if cp.next_id < self.next_id {
            return bad("checkpoint behind the message ids");
        }
        self.next_id = cp.next_id;
        self.receive_seq = cp.receive_seq;
        self.last_purge_ms = cp.last_purge_ms;
        self.dedup_scope = cp.dedup_scope;
        self.set_retention(cp.retention_ms);
        if !self.strict {
            for (name, last_served) in &cp.groups {
                if let Some(&g) = self.group_by_name.get(name.as_str()) {
                    self.group_mut(g).last_served = *last_served;
                    self.refresh_ready(g);
                }
            }
            // Every message live here was sent at or above `live_floor`: if replay saw that
            // far back, it knows them all from now on.
            if cp.live_floor >= self.replay_start.unwrap_or(0) {
                self.strict = true;
            }
        }
        if self.strict {
            if cp.live_count != self.live_count() {
                return bad("checkpoint disagrees with the replayed messages");
            }
            if cp.groups != self.group_list() {
                return bad("checkpoint disagrees with the replayed groups");
            }
        }
        self.last_checkpoint = Some(LastCheckpoint {
            offset,
            live_floor: cp.live_floor,
            at_ms: at,
        });
        self.checkpoints.push_back(offset);
        if self.strict {
            let floor = self.compaction_floor();
            while self.checkpoints.len() > 1 && self.checkpoints[1] <= floor {
                self.checkpoints.pop_front();
            }
            if self.checkpoints.len() > CHECKPOINTS_KEPT_MAX {
                // Thin out the oldest above the floor: the floor stays valid, only coarser.
                self.checkpoints.remove(1);
            }
        }
        Ok(())
    }

    pub(super) fn apply(&mut self, rec: &Record, offset: u64) -> Result<(), ReplayError> {
        let at = rec.at_ms;
        let bad = |reason| Err(ReplayError { at_ms: at, reason });
        if let Some(id) = rec.message() {
            let scan = matches!(rec.kind, RecordKind::DlqMoveStarted { .. });
            self.give_entry(id, scan);
        }
        if self.load_needed_for(rec).is_some() {
            return bad("record about a message waiting in the log, not loaded");
        }
        match &rec.kind {
            RecordKind::Sent(s) => {
                if s.id < self.next_id || s.id >= MSG_ID_MAX {
                    return bad("message ids must increase");
                }
                if self.fifo() && s.payload.group_id.is_none() {
                    return bad("FIFO message without a group");
                }
                self.next_id = s.id + 1;
                if s.redriven && s.origin.is_none() {
                    return bad("redriven message without an origin");
                }
                let plain = self.plain(s, at);
                if plain
                    && (self.tail.is_some()
                        || self.msgs.len() >= self.cfg.limits.resident_entries_target as usize)
                {
                    self.join_tail(s.id, at, offset);
                    return Ok(());
                }
                let gname = s.payload.group_id.as_deref().unwrap_or("");
                let g = self.group_for(gname);
                let fifo = self.fifo();
                if self.waits(s, at) {
                    self.join_waiting(
                        g,
                        Waiting {
                            id: s.id,
                            offset,
                            at_ms: at,
                        },
                    );
                    if let Some(d) = &s.payload.dedup_id {
                        if fifo {
                            self.note_dedup(s, d, at, offset);
                        }
                    }
                    self.refresh_ready(g);
                    return Ok(());
                }
                // A dead letter keeps its original send time (retention counts from it, as in
                // SQS); a redriven message starts afresh.
                let sent_ms = match s.origin {
                    Some(o) if !s.redriven => o.sent_ms,
                    _ => at,
                };
                let state = if s.visible_at_ms > at {
                    State::Delayed
                } else {
                    State::Available
                };
                self.msgs.insert(
                    s.id,
                    Msg {
                        message_id: s.message_id,
                        sent_ms,
                        arrived_ms: at,
                        visible_at_ms: s.visible_at_ms,
                        receive_count: 0,
                        first_receive_ms: None,
                        state,
                        group: g,
                        sent_offset: offset,
                        touched: false,
                        origin: if s.redriven { None } else { s.origin },
                        move_to: MoveDestination::RedriveTarget,
                        pinned: !plain,
                    },
                );
                if !plain {
                    self.pinned += 1;
                }
                let grp = self.group_mut(g);
                grp.msg_count += 1;
                if fifo || state == State::Available {
                    grp.members.insert(s.id);
                }
                self.count(state, 1);
                self.timers.push(Reverse((
                    sent_ms.saturating_add(self.retention_ms),
                    TIMER_RETENTION,
                    s.id,
                    0,
                )));
                if state == State::Delayed {
                    self.timers
                        .push(Reverse((s.visible_at_ms, TIMER_DELAY, s.id, 0)));
                }
                match (&s.origin, &s.payload.dedup_id) {
                    (Some(o), _) => {
                        let key = (o.queue_id, o.partition, o.msg_id);
                        let expires = at + MOVE_ORIGIN_WINDOW_MS;
                        self.origins.insert(key, expires);
                        self.origin_order.push_back((expires, key, offset));
                    }
                    (None, Some(d)) if fifo => self.note_dedup(s, d, at, offset),
                    _ => {}
                }
                self.refresh_ready(g);
            }
            RecordKind::Received {
                id,
                receive_count,
                deadline_ms,
                attempt_id,
                batch_start,
            } => {
                let Some(m) = self.msgs.get_mut(id) else {
                    self.unknown(*id, at, "receive of an unknown message")?;
                    // Sent before a compacted start: the counters and the attempt cache
                    // still count it (the fairness key comes from the next checkpoint).
                    self.receive_seq += 1;
                    if let Some(a) = attempt_id {
                        self.note_attempt(a, *batch_start, (*id, *receive_count), at, offset);
                    }
                    return Ok(());
                };
                if m.state != State::Available || *receive_count != m.receive_count + 1 {
                    return bad("receive of a message that is not available");
                }
                m.receive_count = *receive_count;
                if m.first_receive_ms.is_none() {
                    m.first_receive_ms = Some(at);
                }
                m.touched = false;
                let g = m.group;
                self.receive_seq += 1;
                let seq = self.receive_seq;
                self.group_mut(g).last_served = seq;
                self.transition(
                    *id,
                    State::InFlight {
                        deadline_ms: *deadline_ms,
                        lease_start_ms: at,
                    },
                );
                self.timers
                    .push(Reverse((*deadline_ms, TIMER_LEASE, *id, *receive_count)));
                if let Some(a) = attempt_id {
                    self.note_attempt(a, *batch_start, (*id, *receive_count), at, offset);
                }
            }
            RecordKind::VisibilityChanged {
                id,
                epoch,
                deadline_ms,
                attempt_retry,
            } => {
                let Some(m) = self.msgs.get_mut(id) else {
                    return self.unknown(*id, at, "visibility change of an unknown message");
                };
                let State::InFlight { lease_start_ms, .. } = m.state else {
                    return bad("visibility change of a message not in flight");
                };
                if m.receive_count != *epoch {
                    return bad("visibility change of a stale lease");
                }
                m.state = State::InFlight {
                    deadline_ms: *deadline_ms,
                    lease_start_ms,
                };
                if !attempt_retry {
                    m.touched = true;
                }
                self.timers
                    .push(Reverse((*deadline_ms, TIMER_LEASE, *id, *epoch)));
            }
            RecordKind::Deleted { id } => {
                if !self.msgs.contains_key(id) {
                    return self.unknown(*id, at, "delete of an unknown message");
                }
                self.remove(*id);
            }
            RecordKind::Purged { before_id } => {
                // Every waiting message was sent before the purge (`before_id` is the next id
                // when it was decided); dropped first, so that no removal below gives one an
                // entry.
                let groups: Vec<u32> = self.wait_fronts.iter().map(|&(_, g)| g).collect();
                for g in groups {
                    let grp = self.group_mut(g);
                    let n = grp.waiting.len;
                    grp.waiting = WaitList::default();
                    grp.msg_count -= u32::try_from(n).expect("a group's count fits u32");
                    self.waiting -= n;
                    self.grouped -= n;
                    self.count(State::Available, -(n as i64));
                    self.refresh_ready(g);
                    self.drop_group_if_empty(g);
                }
                self.wait_fronts.clear();
                let ids: Vec<u64> = self
                    .msgs
                    .range(..*before_id)
                    .filter(|(_, m)| m.state != State::Moving)
                    .map(|(id, _)| *id)
                    .collect();
                for id in ids {
                    self.remove(id);
                }
                if let Some(t) = self.tail.take() {
                    // Every tail message was sent before the purge.
                    self.drop_from_tail(t.count);
                }
                self.last_purge_ms = Some(at);
            }
            RecordKind::DlqMoveStarted { id, destination } => {
                let Some(m) = self.msgs.get_mut(id) else {
                    return self.unknown(*id, at, "move of an unknown message");
                };
                if m.state != State::Available {
                    return bad("move of a message that is not available");
                }
                if *destination == MoveDestination::DeadLetterSource && m.origin.is_none() {
                    return bad("redrive to the dead-letter source of a message without one");
                }
                m.move_to = *destination;
                self.transition(*id, State::Moving);
            }
            RecordKind::DlqMoveDone { id } => {
                let Some(m) = self.msgs.get(id) else {
                    return self.unknown(*id, at, "move completion of an unknown message");
                };
                if m.state != State::Moving {
                    return bad("move completion of a message not being moved");
                }
                self.remove(*id);
            }
            RecordKind::Checkpoint(cp) => self.apply_checkpoint(cp, at, offset)?,
            RecordKind::Configured {
                retention_s,
                dedup_scope,
            } => {
                self.set_retention(u64::from(*retention_s) * 1000);
                self.dedup_scope = *dedup_scope;
            }
        }
        Ok(())
    }

    pub(super) fn count(&mut self, s: State, delta: i64) {
        let c = match s {
            State::Delayed => &mut self.counters.delayed,
            State::Available => &mut self.counters.visible,
            State::InFlight { .. } => &mut self.counters.in_flight,
            State::Moving => &mut self.counters.moving,
        };
        *c = c.checked_add_signed(delta).expect("counter stays in range");
    }

    pub(super) fn group_for(&mut self, name: &str) -> u32 {
        if let Some(&g) = self.group_by_name.get(name) {
            return g;
        }
        let name: Arc<str> = Arc::from(name);
        let group = Group {
            name: name.clone(),
            members: BTreeSet::new(),
            waiting: WaitList::default(),
            msg_count: 0,
            inflight: 0,
            moving: 0,
            last_served: 0,
            ready_key: None,
        };
        let g = match self.free_groups.pop() {
            Some(g) => {
                self.groups[g as usize] = Some(group);
                g
            }
            None => {
                self.groups.push(Some(group));
                u32::try_from(self.groups.len() - 1).expect("groups are bounded by messages")
            }
        };
        self.group_by_name.insert(name, g);
        g
    }

    pub(super) fn group_mut(&mut self, g: u32) -> &mut Group {
        self.groups[g as usize]
            .as_mut()
            .expect("group of a live message exists")
    }

    /// Moves a present message to `new`, keeping counters, group membership and readiness.
    pub(super) fn transition(&mut self, id: u64, new: State) {
        let fifo = self.fifo();
        let m = self
            .msgs
            .get_mut(&id)
            .expect("transition of a present message");
        let old = m.state;
        m.state = new;
        let g = m.group;
        self.count(old, -1);
        self.count(new, 1);
        let grp = self.group_mut(g);
        if !fifo {
            if old == State::Available {
                grp.members.remove(&id);
            }
            if new == State::Available {
                grp.members.insert(id);
            }
        } else if new == State::Moving {
            // Once `DlqMoveStarted` is durable the message has left the group's order (it is
            // never delivered from here again), so the group's next message may go out.
            grp.members.remove(&id);
        }
        match old {
            State::InFlight { .. } => grp.inflight -= 1,
            State::Moving => grp.moving -= 1,
            _ => {}
        }
        match new {
            State::InFlight { .. } => grp.inflight += 1,
            State::Moving => grp.moving += 1,
            _ => {}
        }
        if new == State::Moving {
            self.moving.insert(id);
        }
        self.refresh_ready(g);
    }

    pub(super) fn remove(&mut self, id: u64) {
        let Some(m) = self.msgs.remove(&id) else {
            return;
        };
        if m.pinned {
            self.pinned -= 1;
        } else if self.groups[m.group as usize]
            .as_ref()
            .is_some_and(|g| !g.name.is_empty())
        {
            // Unpinned with a group: it waited in its group's list (see `waits`).
            self.grouped -= 1;
        }
        self.count(m.state, -1);
        if m.state == State::Moving {
            self.moving.remove(&id);
        }
        let grp = self.group_mut(m.group);
        grp.members.remove(&id);
        grp.msg_count -= 1;
        match m.state {
            State::InFlight { .. } => grp.inflight -= 1,
            State::Moving => grp.moving -= 1,
            _ => {}
        }
        self.refresh_ready(m.group);
        self.drop_group_if_empty(m.group);
    }

    /// Forgets a group that holds no message any more (its fairness key with it).
    fn drop_group_if_empty(&mut self, g: u32) {
        if self.groups[g as usize]
            .as_ref()
            .is_some_and(|grp| grp.msg_count == 0)
        {
            let grp = self.groups[g as usize]
                .take()
                .expect("group of a live message exists");
            debug_assert!(
                grp.ready_key.is_none() && grp.members.is_empty() && grp.waiting.len == 0
            );
            self.group_by_name.remove(&grp.name);
            self.free_groups.push(g);
        }
    }

    // ----- the tail: plain messages that wait in the log only (see `Tail`) -----

    /// A plain message joins the tail: it is counted (visible, in the no-group group) but gets
    /// no entry.
    fn join_tail(&mut self, id: u64, at: u64, offset: u64) {
        let t = self.tail.get_or_insert_with(|| Tail {
            load_offset: offset,
            first_id: id,
            count: 0,
            skip: 0,
            times: VecDeque::new(),
        });
        t.count += 1;
        match t.times.back_mut() {
            Some((ms, n)) if *ms == at => *n += 1,
            _ => t.times.push_back((at, 1)),
        }
        let g = self.group_for("");
        self.group_mut(g).msg_count += 1;
        self.count(State::Available, 1);
    }

    /// `n` tail messages leave (expired or purged): uncounted, and their group may go.
    fn drop_from_tail(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        let g = *self
            .group_by_name
            .get("")
            .expect("tail messages are counted in the no-group group");
        let grp = self.group_mut(g);
        grp.msg_count -= u32::try_from(n).expect("a group's count fits u32");
        self.count(State::Available, -(n as i64));
        self.drop_group_if_empty(g);
    }

    /// Tail messages past their retention leave; a load skips them.
    fn expire_tail(&mut self, now: u64) {
        let retention = self.retention_ms;
        let Some(t) = self.tail.as_mut() else {
            return;
        };
        let mut gone = 0;
        while let Some(&(sent_ms, n)) = t.times.front() {
            if sent_ms.saturating_add(retention) > now {
                break;
            }
            t.times.pop_front();
            t.count -= n;
            t.skip += n;
            gone += n;
        }
        self.drop_from_tail(gone);
    }

    /// When the tail's next message expires.
    pub(super) fn tail_deadline_ms(&self) -> Option<u64> {
        let t = self.tail.as_ref()?;
        t.times
            .front()
            .map(|&(sent_ms, _)| sent_ms.saturating_add(self.retention_ms))
    }

    /// Plain available entries a receive of standard queue must find below the tail for its
    /// order to be exact (lowest id first): one receive takes at most this many heads.
    fn load_low(&self) -> usize {
        RECEIVE_MESSAGES_MAX as usize + self.cfg.limits.dlq_moves_per_receive_max as usize
    }

    /// Where the log should be read (and the records handed to [`Partition::load`]) before a
    /// receive or a redrive step: `Some(offset)` while the tail holds messages and fewer than
    /// a receive's worth of available no-group entries precede it.
    pub fn load_wanted(&self) -> Option<u64> {
        self.load_wanted_below(self.load_low())
    }

    /// [`Partition::load_wanted`] with another low-water mark: the shard reads ahead (in the
    /// background) while fewer than `low` available no-group entries precede the tail, so that
    /// receives seldom wait for a read.
    pub fn load_wanted_below(&self, low: usize) -> Option<u64> {
        let t = self.tail.as_ref()?;
        if t.load_offset >= self.next_offset {
            return None;
        }
        let below = self
            .group_by_name
            .get("")
            .and_then(|&g| self.groups[g as usize].as_ref())
            .map_or(0, |grp| grp.members.range(..t.first_id).take(low).count());
        (below < low).then_some(t.load_offset)
    }

    /// Tail messages that expired before being loaded: a load passes them without an entry,
    /// and until one does they hold the log's compaction floor where they are.
    pub fn tail_expired(&self) -> u64 {
        self.tail.as_ref().map_or(0, |t| t.skip)
    }

    /// Where the next load from the tail reads, whether or not one is wanted now.
    pub fn tail_load_offset(&self) -> Option<u64> {
        self.tail
            .as_ref()
            .map(|t| t.load_offset)
            .filter(|&o| o < self.next_offset)
    }

    /// Whether `rec` names a message still waiting in the tail (replay after a restart meets
    /// records about messages that were loaded after the state it started from): then the log
    /// must be read from the offset returned and loaded before the record is replayed.
    pub fn load_needed_for(&self, rec: &Record) -> Option<u64> {
        let t = self.tail.as_ref()?;
        if self.skipping {
            return None;
        }
        let id = rec.message()?;
        (id >= t.first_id && id < self.next_id && !self.msgs.contains_key(&id))
            .then_some(t.load_offset)
    }

    /// Loads tail messages from the log: `records` are the records at offsets `from..end`, in
    /// order and all of them (as read from the log; only what is below the partition's own
    /// records counts). Each plain `Sent` there gets its entry, in id order, unless it expired
    /// meanwhile. A `from` other than where the tail's loads stand (a load raced with another,
    /// or a purge) is ignored. Returns the offsets of the `Sent` records loaded.
    pub fn load(&mut self, from: u64, records: &[(u64, Record)], end: u64) -> Vec<u64> {
        let Some(t) = self.tail.as_ref() else {
            return Vec::new();
        };
        if from != t.load_offset {
            return Vec::new();
        }
        let end = end.min(self.next_offset);
        let mut loaded = Vec::new();
        let mut g = None;
        for (offset, rec) in records {
            if *offset < from || *offset >= end {
                continue;
            }
            let RecordKind::Sent(s) = &rec.kind else {
                continue;
            };
            if !self.plain(s, rec.at_ms) {
                continue;
            }
            let t = self.tail.as_mut().expect("checked above");
            t.first_id = s.id + 1;
            if t.skip > 0 {
                t.skip -= 1;
                continue;
            }
            let front = t
                .times
                .front_mut()
                .expect("a live tail message has its arrival time");
            front.1 -= 1;
            if front.1 == 0 {
                t.times.pop_front();
            }
            t.count -= 1;
            let gid = *g.get_or_insert_with(|| {
                *self
                    .group_by_name
                    .get("")
                    .expect("tail messages are counted in the no-group group")
            });
            self.msgs.insert(
                s.id,
                Msg {
                    message_id: s.message_id,
                    sent_ms: rec.at_ms,
                    arrived_ms: rec.at_ms,
                    visible_at_ms: s.visible_at_ms,
                    receive_count: 0,
                    first_receive_ms: None,
                    state: State::Available,
                    group: gid,
                    sent_offset: *offset,
                    touched: false,
                    origin: None,
                    move_to: MoveDestination::RedriveTarget,
                    pinned: false,
                },
            );
            self.group_mut(gid).members.insert(s.id);
            self.timers.push(Reverse((
                rec.at_ms.saturating_add(self.retention_ms),
                TIMER_RETENTION,
                s.id,
                0,
            )));
            loaded.push(*offset);
        }
        let next_offset = self.next_offset;
        let t = self.tail.as_mut().expect("checked above");
        t.load_offset = t.load_offset.max(end);
        if t.load_offset >= next_offset {
            debug_assert!(t.count == 0 && t.skip == 0, "tail left over: {t:?}");
            self.tail = None;
        }
        if let Some(g) = g {
            self.refresh_ready(g);
        }
        loaded
    }

    /// Puts the group in `ready` under its current key, or takes it out. Its head is its
    /// lowest member or waiting message; a waiting one is visible.
    pub(super) fn refresh_ready(&mut self, g: u32) {
        let fifo = self.fifo();
        let grp = self.groups[g as usize]
            .as_ref()
            .expect("group of a live message exists");
        let head = grp.head();
        let want = match head {
            Some(h) if !fifo => Some((grp.last_served, h)),
            Some(h)
                if grp.inflight == 0
                    && self.msgs.get(&h).map_or(State::Available, |m| m.state)
                        == State::Available =>
            {
                Some((grp.last_served, h))
            }
            _ => None,
        };
        if want == grp.ready_key {
            return;
        }
        if let Some((ls, h)) = grp.ready_key {
            self.ready.remove(&(ls, h, g));
        }
        if let Some((ls, h)) = want {
            self.ready.insert((ls, h, g));
        }
        self.group_mut(g).ready_key = want;
    }

    // ----- groups' wait lists: messages that wait in the log only (see `WaitList`) -----

    /// A FIFO message sent here (no origin) gets its dedup entry, unless its key has one.
    fn note_dedup(&mut self, s: &Sent, d: &str, at: u64, offset: u64) {
        let hash = self.dedup_hash(s.payload.group_id.as_deref(), d);
        // Most MessageIds are the one derived from the id; a record written otherwise keeps its
        // own (`DedupEntry::message_id`). A table at `DEDUP_TABLE_MAX` (beyond any limit a
        // decision allows) keeps no more.
        let derived = MessageId::derive(self.cfg.queue_id, self.cfg.partition, s.id);
        self.dedup.insert(DedupEntry {
            hash,
            seq: s.id,
            expires_ms: at + DEDUP_WINDOW_MS,
            offset,
            message_id: (s.message_id != derived).then_some(s.message_id),
        });
    }

    /// A message joins its group's wait list: counted (visible, in its group), no entry.
    fn join_waiting(&mut self, g: u32, w: Waiting) {
        let grp = self.group_mut(g);
        if grp.waiting.len == 0 {
            self.wait_fronts.insert((w.id, g));
        }
        let grp = self.group_mut(g);
        grp.waiting.push(w);
        grp.msg_count += 1;
        self.waiting += 1;
        self.grouped += 1;
        self.count(State::Available, 1);
    }

    /// Takes the first waiting message of group `g` off its list (the caller counts it out or
    /// gives it an entry).
    fn pop_waiting(&mut self, g: u32) -> Waiting {
        let grp = self.group_mut(g);
        let w = grp
            .waiting
            .pop()
            .expect("a group in wait_fronts has waiting messages");
        let next = grp.waiting.front;
        self.wait_fronts.remove(&(w.id, g));
        if let Some(n) = next {
            self.wait_fronts.insert((n.id, g));
        }
        self.waiting -= 1;
        w
    }

    /// The entry a waiting message gets: a fresh visible message, as if it had had one since
    /// it was sent.
    pub(super) fn waiting_entry(&self, w: Waiting, g: u32) -> Msg {
        Msg {
            message_id: MessageId::derive(self.cfg.queue_id, self.cfg.partition, w.id),
            sent_ms: w.at_ms,
            arrived_ms: w.at_ms,
            visible_at_ms: w.at_ms,
            receive_count: 0,
            first_receive_ms: None,
            state: State::Available,
            group: g,
            sent_offset: w.offset,
            touched: false,
            origin: None,
            move_to: MoveDestination::RedriveTarget,
            pinned: false,
        }
    }

    /// Gives the first waiting message of group `g` its entry; returns its id.
    fn promote_front(&mut self, g: u32) -> u64 {
        let w = self.pop_waiting(g);
        let m = self.waiting_entry(w, g);
        self.msgs.insert(w.id, m);
        self.group_mut(g).members.insert(w.id);
        self.timers.push(Reverse((
            w.at_ms.saturating_add(self.retention_ms),
            TIMER_RETENTION,
            w.id,
            0,
        )));
        self.refresh_ready(g);
        w.id
    }

    /// Makes sure message `id` has its entry if it is waiting: a record about it is being
    /// applied. Receives name the head of a group (its first waiting message, if it has no
    /// member before it). Only a redrive step (`scan`: its `DlqMoveStarted`) names others: it
    /// gave every waiting message its entry when it was decided, and replay does the same the
    /// first time it meets one. Ids below every waiting one cost nothing.
    pub(super) fn give_entry(&mut self, id: u64, scan: bool) {
        if self.waiting == 0 || self.msgs.contains_key(&id) || id >= self.next_id {
            return;
        }
        if let Some(&(_, g)) = self.wait_fronts.range((id, 0)..=(id, u32::MAX)).next() {
            self.promote_front(g);
        } else if scan
            && self
                .wait_fronts
                .first()
                .is_some_and(|&(first, _)| first < id)
        {
            self.promote_all();
        }
    }

    /// Gives every waiting message its entry (a redrive step scans entries in id order).
    pub(super) fn promote_all(&mut self) {
        while let Some(&(_, g)) = self.wait_fronts.first() {
            self.promote_front(g);
        }
    }

    /// Waiting messages past their retention leave, oldest first (the first group in
    /// `wait_fronts` holds the oldest).
    fn expire_waiting(&mut self, now: u64) {
        while let Some(&(_, g)) = self.wait_fronts.first() {
            let front = self.groups[g as usize]
                .as_ref()
                .and_then(|grp| grp.waiting.front)
                .expect("a group in wait_fronts has waiting messages");
            if front.at_ms.saturating_add(self.retention_ms) > now {
                break;
            }
            self.pop_waiting(g);
            self.grouped -= 1;
            self.group_mut(g).msg_count -= 1;
            self.count(State::Available, -1);
            self.refresh_ready(g);
            self.drop_group_if_empty(g);
        }
    }

    /// When the oldest waiting message expires.
    pub(super) fn waiting_deadline_ms(&self) -> Option<u64> {
        let &(_, g) = self.wait_fronts.first()?;
        let front = self.groups[g as usize].as_ref()?.waiting.front?;
        Some(front.at_ms.saturating_add(self.retention_ms))
    }
}
