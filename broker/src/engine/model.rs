//! A deliberately simple reference model of the partition's SQS semantics (vectors and linear
//! scans, state derived from time where it can be) and a seeded randomized test that drives the
//! engine and the model with the same operations and compares every observable result.
//!
//! Operations: sends (delays, groups, dedup ids, content-based dedup), receives (visibility
//! overrides, FIFO attempt ids), deletes and visibility changes with current, stale, forged and
//! other-queue handles, purges, time jumps across visibility/delay/retention/dedup windows,
//! restarts of the source and of the DLQ partition (rebuilt by replaying the records they
//! emitted, encoded and decoded, after checking the replayed state equals the live state), and
//! crashes in the middle of a DLQ move. Moves are atomic in the model; the harness plays the
//! shard's part of the two-step protocol and must make them look atomic.
//!
//! `SLUICE_SEED=n` replays from case seed `n`; `SLUICE_CASES=k` sets the number of cases.
//! Leases are in the records, so a restart keeps them: the model ignores restarts.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::attributes::{DedupScope, QueueAttributes, QueueKind, RedrivePolicy};
use super::error::EngineError;
use super::md5::md5_of_body;
use super::partition::{
    Command, Delivered, Delivery, Limits, MoveRequest, MoveStart, Partition, PartitionConfig,
    ReceiveRequest, Reply, SendRequest, ATTEMPT_WINDOW_MS, DEDUP_WINDOW_MS, LEASE_MS_MAX,
    PURGE_INTERVAL_MS,
};
use super::receipt::{Receipt, ReceiptCodec};
use super::record::{MessageId, Payload, Record, RecordKind};

#[derive(Debug, Clone)]
pub(crate) struct MMsg {
    id: u64,
    group: String,
    body: String,
    message_id: MessageId,
    sent_ms: u64,
    /// When it entered this queue (a dead letter keeps its original `sent_ms`).
    arrived: u64,
    visible_at: u64,
    count: u32,
    first: Option<u64>,
    inflight: bool,
    deadline: u64,
    lease_start: u64,
    touched: bool,
    /// Neither plain nor waiting (a delay, a dead letter or redriven): counted by
    /// `message_entries_max`.
    pinned: bool,
    /// FIFO or grouped, visible when sent, sent here: may wait in its group's list; counted by
    /// `waiting_messages_max`.
    grouped: bool,
}

#[derive(Debug, Clone)]
struct MAttempt {
    key: String,
    at: u64,
    items: Vec<(u64, u32)>,
}

/// Observable result of a receive: (msg id, receive count, body, first receive, sent, MessageId).
pub(crate) type Got = (u64, u32, String, u64, u64, MessageId);

#[derive(Debug, Clone)]
pub(crate) struct Model {
    queue_id: u64,
    fifo: bool,
    content_dedup: bool,
    scope: DedupScope,
    retention_ms: u64,
    vt_ms: u64,
    delay_ms: u64,
    max_rc: Option<u32>,
    limits: Limits,
    now: u64,
    next_id: u64,
    receive_seq: u64,
    msgs: Vec<MMsg>,
    last_served: Vec<(String, u64)>,
    dedup: Vec<(String, u64, MessageId, u64)>,
    attempts: Vec<MAttempt>,
    last_purge: Option<u64>,
}

fn code(e: &EngineError) -> &'static str {
    e.sqs_code().code
}

impl Model {
    pub(crate) fn new(queue_id: u64, a: &QueueAttributes, limits: &Limits) -> Self {
        Model {
            queue_id,
            fifo: a.kind == QueueKind::Fifo,
            content_dedup: a.content_based_dedup,
            scope: a.dedup_scope,
            retention_ms: a.retention_ms(),
            vt_ms: a.visibility_timeout_ms(),
            delay_ms: a.delay_ms(),
            max_rc: a.redrive_policy.as_ref().map(|p| p.max_receive_count),
            limits: limits.clone(),
            now: 0,
            next_id: 0,
            receive_seq: 0,
            msgs: Vec::new(),
            last_served: Vec::new(),
            dedup: Vec::new(),
            attempts: Vec::new(),
            last_purge: None,
        }
    }

    pub(crate) fn tick(&mut self, now: u64) -> u64 {
        let now = now.max(self.now);
        self.now = now;
        let retention = self.retention_ms;
        self.msgs.retain(|m| m.sent_ms + retention > now);
        for m in &mut self.msgs {
            if m.inflight && m.deadline <= now {
                m.inflight = false;
            }
        }
        self.dedup.retain(|d| d.1 > now);
        self.attempts.retain(|a| a.at + ATTEMPT_WINDOW_MS > now);
        self.gc_groups();
        now
    }

    fn gc_groups(&mut self) {
        let msgs = &self.msgs;
        self.last_served
            .retain(|(g, _)| msgs.iter().any(|m| &m.group == g));
    }

    fn visible(&self, m: &MMsg) -> bool {
        !m.inflight && m.visible_at <= self.now
    }

    fn served(&self, g: &str) -> u64 {
        self.last_served
            .iter()
            .find(|(n, _)| n == g)
            .map_or(0, |x| x.1)
    }

    pub(crate) fn counters(&self) -> (u64, u64, u64) {
        let inflight = self.msgs.iter().filter(|m| m.inflight).count() as u64;
        let visible = self.msgs.iter().filter(|m| self.visible(m)).count() as u64;
        let delayed = self
            .msgs
            .iter()
            .filter(|m| !m.inflight && m.visible_at > self.now)
            .count() as u64;
        (visible, inflight, delayed)
    }

    /// When the oldest message still here arrived (ApproximateAgeOfOldestMessage's origin).
    fn oldest_arrival(&self) -> Option<u64> {
        self.msgs.iter().map(|m| m.arrived).min()
    }

    fn insert(
        &mut self,
        group: String,
        body: String,
        message_id: MessageId,
        sent_ms: u64,
        visible_at: u64,
    ) -> u64 {
        let group_plain = group.is_empty();
        let id = self.next_id;
        let fresh = visible_at == sent_ms
            && sent_ms == self.now
            && message_id == MessageId::derive(self.queue_id, 0, id);
        let grouped = (self.fifo || !group_plain) && fresh;
        self.next_id += 1;
        self.msgs.push(MMsg {
            id,
            group,
            body,
            message_id,
            sent_ms,
            arrived: self.now,
            visible_at,
            count: 0,
            first: None,
            inflight: false,
            deadline: 0,
            lease_start: 0,
            touched: false,
            pinned: !grouped
                && (self.fifo || !group_plain || visible_at > sent_ms || sent_ms != self.now),
            grouped,
        });
        id
    }

    /// Returns (MessageId, sequence number, duplicate).
    pub(crate) fn send(
        &mut self,
        now: u64,
        group: Option<String>,
        body: String,
        delay_s: Option<u32>,
        dedup_id: Option<String>,
    ) -> Result<(MessageId, Option<u64>, bool), &'static str> {
        let now = self.tick(now);
        if self.fifo {
            if group.is_none() {
                return Err("InvalidParameterValue");
            }
            if delay_s.is_some_and(|d| d > 0) {
                return Err("InvalidParameterValue");
            }
            if dedup_id.is_none() && !self.content_dedup {
                return Err("InvalidParameterValue");
            }
        } else if dedup_id.is_some() {
            return Err("InvalidParameterValue");
        }
        let g = group.unwrap_or_default();
        if self.fifo {
            let d = dedup_id.unwrap_or_else(|| {
                use sha2::{Digest, Sha256};
                Sha256::digest(body.as_bytes())
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect()
            });
            let key = match self.scope {
                DedupScope::Queue => d,
                DedupScope::MessageGroup => format!("{g}\0{d}"),
            };
            if let Some(e) = self.dedup.iter().find(|e| e.0 == key) {
                return Ok((e.2, Some(e.3), true));
            }
            if self.dedup.len() >= self.limits.dedup_entries_max as usize {
                return Err("OverLimit");
            }
            self.check_entries(self.delay_ms > 0)?;
            let mid = MessageId::derive(self.queue_id, 0, self.next_id);
            let id = self.insert(g, body, mid, now, now + self.delay_ms);
            self.dedup.push((key, now + DEDUP_WINDOW_MS, mid, id));
            return Ok((mid, Some(id), false));
        }
        // Only the number of pinned messages is bounded: plain ones may wait in the log
        // only, and every message's bytes are in the log.
        let delay = delay_s.map_or(self.delay_ms, |d| u64::from(d) * 1000);
        if delay > 0 || !g.is_empty() {
            self.check_entries(delay > 0)?;
        }
        let mid = MessageId::derive(self.queue_id, 0, self.next_id);
        self.insert(g, body, mid, now, now + delay);
        Ok((mid, None, false))
    }

    /// Room for one more grouped (FIFO or fair) message, or pinned one if `delayed`.
    fn check_entries(&self, delayed: bool) -> Result<(), &'static str> {
        if !delayed {
            let grouped = self.msgs.iter().filter(|m| m.grouped).count();
            if grouped >= self.limits.waiting_messages_max as usize {
                return Err("OverLimit");
            }
            return Ok(());
        }
        let pinned = self.msgs.iter().filter(|m| m.pinned).count();
        if pinned >= self.limits.message_entries_max as usize {
            return Err("OverLimit");
        }
        Ok(())
    }

    fn at_limit(&self, m: &MMsg) -> bool {
        self.max_rc.is_some_and(|rc| m.count >= rc)
    }

    fn got(m: &MMsg) -> Got {
        (
            m.id,
            m.count,
            m.body.clone(),
            m.first.unwrap_or(0),
            m.sent_ms,
            m.message_id,
        )
    }

    fn deliver(
        &mut self,
        idx: usize,
        vt: u64,
        attempt: &Option<String>,
        first_of_batch: bool,
    ) -> Got {
        let now = self.now;
        self.receive_seq += 1;
        let seq = self.receive_seq;
        let m = &mut self.msgs[idx];
        m.count += 1;
        m.first.get_or_insert(now);
        m.inflight = true;
        m.deadline = now + vt;
        m.lease_start = now;
        m.touched = false;
        let (id, count, g) = (m.id, m.count, m.group.clone());
        let got = Self::got(m);
        match self.last_served.iter_mut().find(|(n, _)| *n == g) {
            Some(e) => e.1 = seq,
            None => self.last_served.push((g, seq)),
        }
        if let Some(a) = attempt {
            if first_of_batch {
                self.attempts.retain(|e| &e.key != a);
                self.attempts.push(MAttempt {
                    key: a.clone(),
                    at: now,
                    items: vec![(id, count)],
                });
                while self.attempts.len() > self.limits.attempt_ids_max as usize {
                    self.attempts.remove(0);
                }
            } else if let Some(e) = self.attempts.iter_mut().find(|e| &e.key == a) {
                e.items.push((id, count));
            }
        }
        got
    }

    /// Returns the delivered messages and the messages moved to the DLQ (in move order).
    pub(crate) fn receive(
        &mut self,
        now: u64,
        max: u32,
        vt_s: Option<u32>,
        attempt: Option<String>,
    ) -> Result<(Vec<Got>, Vec<MMsg>), &'static str> {
        self.tick(now);
        let vt = vt_s.map_or(self.vt_ms, |v| u64::from(v) * 1000);
        let attempt = if self.fifo { attempt } else { None };
        if let Some(a) = &attempt {
            if let Some(e) = self.attempts.iter().find(|e| &e.key == a) {
                let valid = e.items.iter().all(|&(id, ep)| {
                    self.msgs
                        .iter()
                        .any(|m| m.id == id && m.count == ep && m.inflight && !m.touched)
                });
                if valid {
                    let items = e.items.clone();
                    let mut out = Vec::new();
                    for (id, _) in items {
                        let m = self.msgs.iter_mut().find(|m| m.id == id).expect("valid");
                        m.deadline = (self.now + vt).min(m.lease_start + LEASE_MS_MAX);
                        out.push(Self::got(m));
                    }
                    return Ok((out, Vec::new()));
                }
            }
        }
        let inflight_max = u64::from(self.limits.inflight_max);
        let inflight = |s: &Self| s.msgs.iter().filter(|m| m.inflight).count() as u64;
        if inflight(self) >= inflight_max {
            return if self.fifo {
                Ok((Vec::new(), Vec::new()))
            } else {
                Err("OverLimit")
            };
        }
        let mut out = Vec::new();
        let mut moved = Vec::new();
        let mut moves = 0;
        'outer: while out.len() < max as usize && inflight(self) < inflight_max {
            // Candidate groups and their heads.
            let mut groups: Vec<String> = self.msgs.iter().map(|m| m.group.clone()).collect();
            groups.sort();
            groups.dedup();
            let mut best: Option<(u64, u64)> = None;
            for g in &groups {
                let of_g = || self.msgs.iter().filter(|m| &m.group == g);
                let head = if self.fifo {
                    if of_g().any(|m| m.inflight) {
                        continue;
                    }
                    let h = of_g().min_by_key(|m| m.id).expect("group has messages");
                    if !self.visible(h) {
                        continue;
                    }
                    h.id
                } else {
                    match of_g().filter(|m| self.visible(m)).map(|m| m.id).min() {
                        Some(h) => h,
                        None => continue,
                    }
                };
                let key = (self.served(g), head);
                if best.is_none_or(|b| key < b) {
                    best = Some(key);
                }
            }
            let Some((_, head)) = best else { break };
            let idx = self.msgs.iter().position(|m| m.id == head).expect("head");
            if self.at_limit(&self.msgs[idx]) {
                if moves >= self.limits.dlq_moves_per_receive_max {
                    break;
                }
                moves += 1;
                moved.push(self.msgs.remove(idx));
                continue;
            }
            let first = out.is_empty();
            out.push(self.deliver(idx, vt, &attempt, first));
            if !self.fifo {
                continue;
            }
            let g = self.msgs[idx].group.clone();
            let mut last = head;
            while out.len() < max as usize && inflight(self) < inflight_max {
                let next = self
                    .msgs
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| m.group == g && m.id > last)
                    .min_by_key(|(_, m)| m.id);
                match next {
                    Some((i, m)) if self.visible(m) && !self.at_limit(m) => {
                        last = m.id;
                        out.push(self.deliver(i, vt, &attempt, false));
                    }
                    _ => continue 'outer,
                }
            }
        }
        self.gc_groups();
        Ok((out, moved))
    }

    fn check_receipt(&self, r: &Receipt) -> Result<(), &'static str> {
        if r.queue_id != self.queue_id
            || r.partition != 0
            || r.msg_id >= self.next_id
            || r.epoch == 0
        {
            return Err("ReceiptHandleIsInvalid");
        }
        Ok(())
    }

    pub(crate) fn delete(&mut self, now: u64, r: &Receipt) -> Result<(), &'static str> {
        self.tick(now);
        self.check_receipt(r)?;
        let Some(i) = self.msgs.iter().position(|m| m.id == r.msg_id) else {
            return Ok(());
        };
        let m = &self.msgs[i];
        if r.epoch > m.count || (self.fifo && (r.epoch != m.count || !m.inflight)) {
            return Err("ReceiptHandleIsInvalid");
        }
        self.msgs.remove(i);
        self.gc_groups();
        Ok(())
    }

    pub(crate) fn change_visibility(
        &mut self,
        now: u64,
        r: &Receipt,
        t: u32,
    ) -> Result<(), &'static str> {
        let now = self.tick(now);
        if t > 43_200 {
            return Err("InvalidParameterValue");
        }
        self.check_receipt(r)?;
        let Some(m) = self.msgs.iter_mut().find(|m| m.id == r.msg_id) else {
            return Err("ReceiptHandleIsInvalid");
        };
        if r.epoch != m.count {
            return Err("ReceiptHandleIsInvalid");
        }
        if !m.inflight {
            return Err("AWS.SimpleQueueService.MessageNotInflight");
        }
        let deadline = now + u64::from(t) * 1000;
        if deadline > m.lease_start + LEASE_MS_MAX {
            return Err("InvalidParameterValue");
        }
        m.deadline = deadline;
        m.touched = true;
        Ok(())
    }

    fn purge(&mut self, now: u64) -> Result<(), &'static str> {
        let now = self.tick(now);
        if self.last_purge.is_some_and(|t| now < t + PURGE_INTERVAL_MS) {
            return Err("AWS.SimpleQueueService.PurgeQueueInProgress");
        }
        self.msgs.clear();
        self.gc_groups();
        self.last_purge = Some(now);
        Ok(())
    }
}

/// The engine side of the harness: a partition and the log it has emitted, from log offset
/// `base` on (what compaction left).
struct Node {
    cfg: PartitionConfig,
    p: Partition,
    log: Vec<Vec<u8>>,
    base: u64,
    /// Sizes and moments of the loads from the tail (what the shard's log reads would be).
    rng: SmallRng,
    /// Messages loaded from the tail so far (coverage).
    loaded: usize,
    /// A snapshot taken at a random moment: (its offset, the lowest offset it needs, its
    /// bytes). A restart sometimes
    /// starts from it and replays only the records after it, as the shard does.
    snap: Option<(u64, u64, Vec<u8>)>,
    /// Restarts that started from a snapshot (coverage).
    restored: usize,
}

/// What the shard does for [`Partition::load`]: the records at `from..from + n` of a log that
/// starts at `base`, decoded, handed to the partition.
fn load_from(
    p: &mut Partition,
    log: &[Vec<u8>],
    base: u64,
    from: u64,
    n: u64,
) -> Result<usize, String> {
    let end = from.saturating_add(n).min(base + log.len() as u64);
    let mut recs = Vec::new();
    for offset in from..end {
        let bytes = offset
            .checked_sub(base)
            .and_then(|i| log.get(i as usize))
            .ok_or_else(|| format!("load from {from}: offset {offset} is not in the log"))?;
        let rec = Record::decode(bytes).map_err(|e| format!("decode at {offset}: {e}"))?;
        recs.push((offset, rec));
    }
    Ok(p.load(from, &recs, end).len())
}

impl Node {
    fn new(cfg: PartitionConfig, seed: u64) -> Self {
        Node {
            p: Partition::new(cfg.clone()).expect("valid config"),
            cfg,
            log: Vec::new(),
            base: 0,
            rng: SmallRng::seed_from_u64(seed),
            loaded: 0,
            snap: None,
            restored: 0,
        }
    }

    /// Loads from the tail in chunks of random sizes while the partition wants it (before a
    /// receive or a redrive step, as the shard does), and now and then when it does not.
    fn load(&mut self) -> Result<(), String> {
        if self.rng.gen_bool(0.2) {
            if let Some(from) = self.p.tail_load_offset() {
                let n = self.rng.gen_range(1..=16);
                load_from(&mut self.p, &self.log, self.base, from, n)?;
            }
        }
        while let Some(from) = self.p.load_wanted() {
            let n = self.rng.gen_range(1..=8);
            self.loaded += load_from(&mut self.p, &self.log, self.base, from, n)?;
        }
        Ok(())
    }

    fn end(&self) -> u64 {
        self.base + self.log.len() as u64
    }

    fn append(&mut self, fx: &super::Effects) -> Result<(), String> {
        if !fx.records.is_empty() && fx.first_offset != self.end() {
            return Err(format!(
                "effects at offset {} but the log ends at {}",
                fx.first_offset,
                self.end()
            ));
        }
        for r in &fx.records {
            self.log.push(r.encode());
        }
        Ok(())
    }

    fn exec(&mut self, now: u64, cmd: Command) -> Result<super::Effects, EngineError> {
        if matches!(cmd, Command::Receive(_) | Command::StartMoves(_)) {
            if let Err(e) = self.load() {
                panic!("{e}");
            }
        }
        let fx = self.p.execute(now, cmd)?;
        if let Err(e) = self.append(&fx) {
            panic!("{e}");
        }
        if self.rng.gen_bool(0.1) {
            let bytes = self.p.snapshot().expect("a live partition can snapshot");
            self.snap = Some((
                self.p.snapshot_offset(),
                self.p.snapshot_needs_from(),
                bytes,
            ));
        }
        Ok(fx)
    }

    fn tick(&mut self, now: u64) -> Result<(), String> {
        let fx = self.p.tick(now);
        self.append(&fx)
    }

    /// What the shard does: the content of message `message_id` read back from its `Sent`
    /// record at `offset` in this node's (encoded, possibly compacted) log.
    fn content_at(&self, offset: u64, message_id: MessageId) -> Result<Arc<Payload>, String> {
        let bytes = offset
            .checked_sub(self.base)
            .and_then(|i| self.log.get(i as usize))
            .ok_or_else(|| {
                format!(
                    "content of {message_id} at {offset}: not in the log ({}..{})",
                    self.base,
                    self.end()
                )
            })?;
        match Record::decode(bytes)
            .map_err(|e| format!("decode at {offset}: {e}"))?
            .kind
        {
            // The digest read back (format 3) must be the body's.
            RecordKind::Sent(s)
                if s.message_id == message_id
                    && s.payload.md5_body() == md5_of_body(s.payload.body.as_bytes()) =>
            {
                Ok(s.payload)
            }
            other => Err(format!(
                "content of {message_id} at {offset}: the record there is {other:?}"
            )),
        }
    }

    fn delivered(&self, d: Delivery) -> Result<Delivered, String> {
        let p = self.content_at(d.sent_offset, d.message_id)?;
        Ok(d.with_payload(p))
    }

    fn move_request(&self, m: MoveStart) -> Result<MoveRequest, String> {
        let p = self.content_at(m.sent_offset, m.message_id)?;
        Ok(m.with_payload(p))
    }

    /// Deletes a random prefix of the log below the compaction floor, as the shard deletes
    /// whole segments below it. Returns (records dropped, floor).
    fn compact(&mut self, rng: &mut SmallRng) -> (u64, u64) {
        // As the shard does: not below what its newest snapshot needs, if it keeps one (else
        // a restart reads the log from its first checkpoint on).
        let mut floor = self.p.compaction_floor();
        if let Some((_, need, _)) = &self.snap {
            if rng.gen_bool(0.8) {
                floor = floor.min(*need);
            }
        }
        if floor <= self.base {
            return (0, floor);
        }
        let cut = if rng.gen_bool(0.5) {
            floor
        } else {
            rng.gen_range(self.base..=floor)
        };
        let n = cut - self.base;
        self.log.drain(..n as usize);
        self.base = cut;
        (n, floor)
    }

    /// Rebuilds from the log; checks the rebuilt state equals the live one at `now`.
    fn restart(&mut self, now: u64) -> Result<(), String> {
        self.tick(now)?;
        let mut fresh = Partition::new(self.cfg.clone()).expect("valid config");
        let mut from = 0;
        if let Some((offset, need, bytes)) = &self.snap {
            if *need >= self.base && self.rng.gen_bool(0.5) {
                fresh = Partition::restore(self.cfg.clone(), bytes)
                    .map_err(|e| format!("restore: {e}"))?;
                from = (*offset - self.base) as usize;
                self.restored += 1;
            }
        }
        for (i, bytes) in self.log.iter().enumerate().skip(from) {
            let rec = Record::decode(bytes).map_err(|e| format!("decode: {e}"))?;
            // Records about messages the live partition had loaded from its tail: load them
            // here too first, in chunks of random sizes.
            while let Some(from) = fresh.load_needed_for(&rec) {
                let n = self.rng.gen_range(1..=8);
                if load_from(&mut fresh, &self.log, self.base, from, n)? == 0
                    && fresh.load_needed_for(&rec) == Some(from)
                {
                    return Err(format!(
                        "replay at {}: a load made no progress",
                        self.base + i as u64
                    ));
                }
            }
            fresh
                .replay_at(self.base + i as u64, &rec)
                .map_err(|e| format!("replay at {}: {e}", self.base + i as u64))?;
        }
        fresh
            .finish_replay(self.end())
            .map_err(|e| format!("finish replay: {e}"))?;
        if !fresh.tick(now).records.is_empty() {
            return Err("a replayed partition wrote records on its first tick".into());
        }
        // Loaded or not is invisible; to compare the states byte for byte, load everything.
        while let Some(from) = self.p.tail_load_offset() {
            load_from(&mut self.p, &self.log, self.base, from, u64::MAX)?;
        }
        while let Some(from) = fresh.tail_load_offset() {
            load_from(&mut fresh, &self.log, self.base, from, u64::MAX)?;
        }
        let (a, b) = (self.p.dump(), fresh.dump());
        if a != b {
            return Err(format!(
                "replayed state differs\nlive:\n{a}\nreplayed:\n{b}"
            ));
        }
        self.p = fresh;
        Ok(())
    }
}

struct Case {
    rng: SmallRng,
    codec: ReceiptCodec,
    src: Node,
    dlq: Node,
    m_src: Model,
    m_dlq: Model,
    /// Handles seen, per queue (0 source, 1 DLQ), most recent last.
    handles: Vec<(usize, Receipt)>,
    now: u64,
    fifo: bool,
    groups: u32,
    log: Vec<String>,
}

const SRC_QUEUE: u64 = 11;
const DLQ_QUEUE: u64 = 12;
const HANDLES_KEPT_MAX: usize = 48;

impl Case {
    fn new(seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let fifo = rng.gen_bool(0.5);
        let kind = if fifo {
            QueueKind::Fifo
        } else {
            QueueKind::Standard
        };
        let mut a = QueueAttributes::new(kind);
        a.visibility_timeout_s = rng.gen_range(1..=30);
        a.retention_s = rng.gen_range(60..=700);
        if rng.gen_bool(0.3) {
            a.delay_s = rng.gen_range(0..=5);
        }
        if fifo {
            a.content_based_dedup = rng.gen_bool(0.5);
            if rng.gen_bool(0.5) {
                a.dedup_scope = DedupScope::MessageGroup;
            }
        }
        if rng.gen_bool(0.6) {
            a.redrive_policy = Some(RedrivePolicy {
                dead_letter_target_arn: "arn:aws:sqs:local:0:dlq".into(),
                max_receive_count: rng.gen_range(1..=3),
            });
        }
        let limits = Limits {
            inflight_max: rng.gen_range(3..=12),
            message_entries_max: rng.gen_range(10..=40),
            waiting_messages_max: rng.gen_range(10..=60),
            // Small, so that plain messages often wait in the log only (the tail).
            resident_entries_target: rng.gen_range(1..=24),
            dedup_entries_max: rng.gen_range(5..=30),
            attempt_ids_max: rng.gen_range(1..=3),
            move_origins_max: 10_000,
            dlq_moves_per_receive_max: rng.gen_range(1..=4),
            checkpoint_interval_records: rng.gen_range(1..=30),
        };
        let mut da = QueueAttributes::new(kind);
        da.visibility_timeout_s = rng.gen_range(1..=30);
        // Sometimes short enough (with the rare long time jumps) for DLQ messages to expire,
        // so that the DLQ's log can be compacted too.
        da.retention_s = if rng.gen_bool(0.5) {
            rng.gen_range(3_600..=7_200)
        } else {
            1_209_600
        };
        let dlimits = Limits {
            message_entries_max: 100_000,
            checkpoint_interval_records: rng.gen_range(1..=30),
            ..Limits::default()
        };
        let groups = if rng.gen_bool(0.5) {
            1
        } else {
            rng.gen_range(2..=4)
        };
        let now = rng.gen_range(0..1_000_000_000_000u64);
        Case {
            codec: ReceiptCodec::new(&[7; 32]).expect("32-byte secret"),
            m_src: Model::new(SRC_QUEUE, &a, &limits),
            m_dlq: Model::new(DLQ_QUEUE, &da, &dlimits),
            src: Node::new(
                PartitionConfig {
                    queue_id: SRC_QUEUE,
                    partition: 0,
                    attributes: a,
                    limits,
                },
                seed ^ 0x5eed_0001,
            ),
            dlq: Node::new(
                PartitionConfig {
                    queue_id: DLQ_QUEUE,
                    partition: 0,
                    attributes: da,
                    limits: dlimits,
                },
                seed ^ 0x5eed_0002,
            ),
            rng,
            handles: Vec::new(),
            now,
            fifo,
            groups,
            log: Vec::new(),
        }
    }

    fn check<T: PartialEq + std::fmt::Debug>(
        &self,
        what: &str,
        engine: T,
        model: T,
    ) -> Result<(), String> {
        if engine == model {
            Ok(())
        } else {
            Err(format!("{what}: engine {engine:?} != model {model:?}"))
        }
    }

    fn counters(&self) -> Result<(), String> {
        let c = self.src.p.counters();
        self.check(
            "source counters",
            (c.visible, c.in_flight, c.delayed, c.moving),
            {
                let (v, i, d) = self.m_src.counters();
                (v, i, d, 0)
            },
        )?;
        let c = self.dlq.p.counters();
        self.check(
            "dlq counters",
            (c.visible, c.in_flight, c.delayed),
            self.m_dlq.counters(),
        )?;
        self.check(
            "source oldest arrival",
            self.src.p.oldest_arrival_ms(),
            self.m_src.oldest_arrival(),
        )?;
        self.check(
            "dlq oldest arrival",
            self.dlq.p.oldest_arrival_ms(),
            self.m_dlq.oldest_arrival(),
        )
    }

    fn remember(&mut self, q: usize, r: Receipt) {
        self.handles.push((q, r));
        if self.handles.len() > HANDLES_KEPT_MAX {
            self.handles.remove(0);
        }
    }

    /// A restart ticks the rebuilt engine at `now`; the model ticks alongside.
    fn restart_src(&mut self) -> Result<(), String> {
        self.m_src.tick(self.now);
        self.src.restart(self.now)
    }

    fn restart_dlq(&mut self) -> Result<(), String> {
        self.m_dlq.tick(self.now);
        self.dlq.restart(self.now)
    }

    /// Forwards DLQ moves the way a shard does, with crashes injected between the steps.
    fn forward_moves(&mut self, moves: Vec<MoveStart>) -> Result<(), String> {
        for mv in moves {
            let mv = self.src.move_request(mv)?;
            let now = self.now;
            if self.rng.gen_bool(0.1) {
                // Crash before forwarding: the source must list the move as pending.
                self.log.push("crash source before move".into());
                self.restart_src()?;
                let pending = self.src.p.pending_moves();
                self.check(
                    "pending move listed",
                    pending.iter().any(|m| m.origin == mv.origin),
                    true,
                )?;
            }
            self.dlq
                .exec(now, Command::AcceptMove(mv.clone()))
                .map_err(|e| format!("accept move: {e}"))?;
            if self.rng.gen_bool(0.1) {
                // Crash after the DLQ has it, before the source recorded completion: the
                // re-drive must not duplicate it.
                self.log.push("crash both mid-move".into());
                self.restart_dlq()?;
                self.restart_src()?;
                let fx = self
                    .dlq
                    .exec(now, Command::AcceptMove(mv.clone()))
                    .map_err(|e| format!("re-accept move: {e}"))?;
                self.check("re-drive is idempotent", fx.records.len(), 0)?;
            }
            self.src
                .exec(
                    now,
                    Command::CompleteMove {
                        msg_id: mv.origin.msg_id,
                    },
                )
                .map_err(|e| format!("complete move: {e}"))?;
            // Each execute above advanced the engines to `now`; so does the model.
            self.m_src.tick(now);
            self.m_dlq.tick(now);
        }
        self.check("moves done", self.src.p.pending_moves().len(), 0)
    }

    fn step(&mut self) -> Result<(), String> {
        let r = self.rng.gen_range(0..108);
        match r {
            0..=29 => self.op_send(),
            30..=54 => self.op_receive(0),
            55..=59 => self.op_receive(1),
            60..=68 => self.op_delete(),
            69..=72 => self.op_batch(false),
            73..=80 => self.op_change_visibility(),
            81..=94 => {
                let dt = match self.rng.gen_range(0..10) {
                    0..=4 => self.rng.gen_range(0..2_000),
                    5..=8 => self.rng.gen_range(0..40_000),
                    // Now and then past the DLQ's move-origin window (1 h), so that its log
                    // can be compacted too.
                    _ if self.rng.gen_bool(0.3) => self.rng.gen_range(3_600_000..5_000_000),
                    _ => self.rng.gen_range(0..400_000),
                };
                self.now += dt;
                self.log.push(format!("advance {dt} -> {}", self.now));
                self.src.tick(self.now)?;
                self.dlq.tick(self.now)?;
                self.m_src.tick(self.now);
                self.m_dlq.tick(self.now);
                Ok(())
            }
            95 => {
                let e = self.src.exec(self.now, Command::Purge).map(|_| ());
                let m = self.m_src.purge(self.now);
                self.log.push(format!("purge {m:?}"));
                self.check("purge", e.map_err(|e| code(&e)), m)
            }
            96..=97 => {
                self.log.push("restart source".into());
                self.restart_src()
            }
            98..=99 => {
                self.log.push("restart dlq".into());
                self.restart_dlq()
            }
            100..=102 => {
                let (n, floor) = self.src.compact(&mut self.rng);
                self.log.push(format!(
                    "compact source: dropped {n} below floor {floor}{}",
                    if n > 0 { " [compacted source]" } else { "" }
                ));
                self.restart_src()
            }
            105..=107 => self.op_batch(true),
            _ => {
                let (n, floor) = self.dlq.compact(&mut self.rng);
                self.log.push(format!(
                    "compact dlq: dropped {n} below floor {floor}{}",
                    if n > 0 { " [compacted dlq]" } else { "" }
                ));
                self.restart_dlq()
            }
        }?;
        self.counters()
    }

    fn op_send(&mut self) -> Result<(), String> {
        let g = self.rng.gen_range(0..self.groups);
        let group = if self.fifo || self.groups > 1 || self.rng.gen_bool(0.3) {
            Some(format!("g{g}"))
        } else {
            None
        };
        let body = format!("b{}", self.rng.gen_range(0..12));
        let delay_s = if !self.fifo && self.rng.gen_bool(0.3) {
            Some(self.rng.gen_range(0..=20))
        } else {
            None
        };
        let dedup_id = if self.fifo && (self.rng.gen_bool(0.6) || !self.m_src.content_dedup) {
            Some(format!("d{}", self.rng.gen_range(0..10)))
        } else {
            None
        };
        let req = SendRequest {
            body: body.clone(),
            attributes: Vec::new(),
            delay_s,
            group_id: group.clone(),
            dedup_id: dedup_id.clone(),
        };
        let e = self
            .src
            .exec(self.now, Command::Send(req))
            .map(|fx| match fx.reply {
                Reply::Sent(s) => (s.message_id, s.sequence_number, s.duplicate),
                other => panic!("unexpected reply {other:?}"),
            });
        let m = self.m_src.send(
            self.now,
            group.clone(),
            body.clone(),
            delay_s,
            dedup_id.clone(),
        );
        self.log.push(format!(
            "send {group:?} {body} delay={delay_s:?} dedup={dedup_id:?} -> {m:?}"
        ));
        self.check("send", e.map_err(|e| code(&e)), m)
    }

    fn op_receive(&mut self, q: usize) -> Result<(), String> {
        let max = self.rng.gen_range(1..=10);
        let vt = if self.rng.gen_bool(0.5) {
            Some(self.rng.gen_range(0..=40))
        } else {
            None
        };
        let attempt = if self.fifo && self.rng.gen_bool(0.3) {
            Some(format!("a{}", self.rng.gen_range(0..3)))
        } else {
            None
        };
        let cmd = Command::Receive(ReceiveRequest {
            max_messages: max,
            visibility_timeout_s: vt,
            attempt_id: attempt.clone(),
        });
        let now = self.now;
        let (node, model) = if q == 0 {
            (&mut self.src, &mut self.m_src)
        } else {
            (&mut self.dlq, &mut self.m_dlq)
        };
        let e = node.exec(now, cmd);
        let m = model.receive(now, max, vt, attempt.clone());
        self.log.push(format!(
            "receive q{q} max={max} vt={vt:?} attempt={attempt:?} -> {m:?}"
        ));
        let (fx, (m_got, m_moved)) = match (e, m) {
            (Ok(fx), Ok(m)) => (fx, m),
            (e, m) => {
                return self.check(
                    "receive",
                    e.map(|_| ()).map_err(|e| code(&e)),
                    m.map(|_| ()),
                )
            }
        };
        let Reply::Received(got) = &fx.reply else {
            return Err(format!("unexpected reply {:?}", fx.reply));
        };
        // Every body handed out is read back from the log, as the shard does: the model's
        // bodies (the ones sent) must come out.
        let node = if q == 0 { &self.src } else { &self.dlq };
        let got = got
            .iter()
            .map(|d| node.delivered(d.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        let e_got: Vec<Got> = got
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
        self.check("received", &e_got, &m_got)?;
        if fx.records.iter().any(|r| {
            matches!(
                r.kind,
                super::record::RecordKind::VisibilityChanged {
                    attempt_retry: true,
                    ..
                }
            )
        }) {
            self.log.push("attempt retry".into());
        }
        if !fx.moves.is_empty() {
            self.log.push("moved to dlq".into());
        }
        let e_moved: Vec<u64> = fx.moves.iter().map(|m| m.origin.msg_id).collect();
        let m_moved_ids: Vec<u64> = m_moved.iter().map(|m| m.id).collect();
        self.check("moved", e_moved, m_moved_ids)?;
        for d in &got {
            self.remember(q, d.receipt);
        }
        for m in m_moved {
            self.m_dlq.tick(now);
            self.m_dlq
                .insert(m.group, m.body, m.message_id, m.sent_ms, now);
        }
        self.forward_moves(fx.moves)
    }

    fn pick_handle(&mut self) -> (usize, Receipt, String) {
        let n = self.handles.len();
        match self.rng.gen_range(0..10) {
            _ if n == 0 => {
                let r = Receipt {
                    queue_id: SRC_QUEUE,
                    partition: 0,
                    msg_id: self.rng.gen_range(0..50),
                    epoch: self.rng.gen_range(1..4),
                };
                // Forged: a well-formed handle under another secret.
                let h = ReceiptCodec::new(&[9; 32]).expect("secret").encode(&r);
                (0, r, h)
            }
            0 => {
                let (q, r) = self.handles[self.rng.gen_range(0..n)];
                let mut h = self.codec.encode(&r).into_bytes();
                let i = self.rng.gen_range(0..h.len());
                h[i] = if h[i] == b'A' { b'B' } else { b'A' };
                (q, r, String::from_utf8(h).expect("ascii"))
            }
            1 => {
                // A handle of the other queue.
                let (q, r) = self.handles[self.rng.gen_range(0..n)];
                (1 - q, r, self.codec.encode(&r))
            }
            2..=4 => {
                let (q, r) = self.handles[self.rng.gen_range(0..n)];
                (q, r, self.codec.encode(&r))
            }
            _ => {
                let (q, r) = self.handles[n - 1 - self.rng.gen_range(0..n.min(4))];
                (q, r, self.codec.encode(&r))
            }
        }
    }

    fn op_delete(&mut self) -> Result<(), String> {
        let (q, _, h) = self.pick_handle();
        let now = self.now;
        let qid = if q == 0 { SRC_QUEUE } else { DLQ_QUEUE };
        let (node, model) = if q == 0 {
            (&mut self.src, &mut self.m_src)
        } else {
            (&mut self.dlq, &mut self.m_dlq)
        };
        let (e, m) = match self.codec.decode(&h, qid) {
            Err(err) => (Err(EngineError::from(err)), Err("ReceiptHandleIsInvalid")),
            Ok(r) => (
                node.exec(now, Command::Delete { receipt: r }).map(|_| ()),
                model.delete(now, &r),
            ),
        };
        self.log.push(format!("delete q{q} {h} -> {m:?}"));
        self.check("delete", e.map_err(|e| code(&e)), m)
    }

    /// DeleteMessageBatch (`change_visibility` false) or ChangeMessageVisibilityBatch as the
    /// shard runs it: up to 10 handles for one queue (some forged, some repeated, some of the
    /// other queue); those that decode go to the partition in one `DeleteBatch` or
    /// `ChangeVisibilityBatch`, and each entry's result must be what the model's deletes or
    /// visibility changes, one after another, give.
    fn op_batch(&mut self, change_visibility: bool) -> Result<(), String> {
        let what = match change_visibility {
            true => "change visibility batch",
            false => "delete batch",
        };
        let k = self.rng.gen_range(1..=10);
        let (q, _, first) = self.pick_handle();
        let mut handles = vec![first];
        while handles.len() < k {
            let (q2, _, h) = self.pick_handle();
            if q2 == q {
                handles.push(h);
            } else if self.rng.gen_bool(0.2) {
                let again = handles[self.rng.gen_range(0..handles.len())].clone();
                handles.push(again);
            }
        }
        let timeouts: Vec<u32> = handles.iter().map(|_| self.pick_timeout()).collect();
        let now = self.now;
        let qid = if q == 0 { SRC_QUEUE } else { DLQ_QUEUE };
        let decoded: Vec<Result<Receipt, EngineError>> = handles
            .iter()
            .map(|h| self.codec.decode(h, qid).map_err(EngineError::from))
            .collect();
        let entries: Vec<(Receipt, u32)> = decoded
            .iter()
            .zip(&timeouts)
            .filter_map(|(r, t)| r.clone().ok().map(|r| (r, *t)))
            .collect();
        let (node, model) = if q == 0 {
            (&mut self.src, &mut self.m_src)
        } else {
            (&mut self.dlq, &mut self.m_dlq)
        };
        let command = match change_visibility {
            true => Command::ChangeVisibilityBatch(entries.clone()),
            false => Command::DeleteBatch(entries.iter().map(|(r, _)| *r).collect()),
        };
        let mut from_engine = match entries.is_empty() {
            true => Vec::new(),
            false => match node.exec(now, command) {
                Ok(fx) => match (change_visibility, fx.reply) {
                    (false, Reply::DeletedBatch(list))
                    | (true, Reply::VisibilityChangedBatch(list)) => list,
                    (_, other) => return Err(format!("{what}: unexpected {other:?}")),
                },
                Err(e) => return Err(format!("{what}: refused as a whole: {e}")),
            },
        }
        .into_iter();
        let mut got = Vec::new();
        let mut want = Vec::new();
        for (d, t) in decoded.iter().zip(&timeouts) {
            match d {
                Err(e) => {
                    got.push(Err(code(e)));
                    want.push(Err("ReceiptHandleIsInvalid"));
                }
                Ok(r) => {
                    let e = from_engine
                        .next()
                        .ok_or_else(|| format!("{what}: fewer results than entries"))?;
                    got.push(e.map_err(|e| code(&e)));
                    want.push(match change_visibility {
                        true => model.change_visibility(now, r, *t),
                        false => model.delete(now, r),
                    });
                }
            }
        }
        self.log
            .push(format!("{what} q{q} {handles:?} {timeouts:?} -> {want:?}"));
        self.check(what, got, want)
    }

    /// A visibility timeout for ChangeMessageVisibility: mostly short, sometimes the limits
    /// and one past the upper one.
    fn pick_timeout(&mut self) -> u32 {
        match self.rng.gen_range(0..10) {
            0 => 0,
            1 => 43_200,
            2 => 43_201,
            _ => self.rng.gen_range(0..60),
        }
    }

    fn op_change_visibility(&mut self) -> Result<(), String> {
        let (q, _, h) = self.pick_handle();
        let t = self.pick_timeout();
        let now = self.now;
        let qid = if q == 0 { SRC_QUEUE } else { DLQ_QUEUE };
        let (node, model) = if q == 0 {
            (&mut self.src, &mut self.m_src)
        } else {
            (&mut self.dlq, &mut self.m_dlq)
        };
        let (e, m) = match self.codec.decode(&h, qid) {
            Err(err) => (Err(EngineError::from(err)), Err("ReceiptHandleIsInvalid")),
            Ok(r) => {
                let m = model.change_visibility(now, &r, t);
                let e = node
                    .exec(
                        now,
                        Command::ChangeVisibility {
                            receipt: r,
                            timeout_s: t,
                        },
                    )
                    .map(|_| ());
                (e, m)
            }
        };
        self.log
            .push(format!("change visibility q{q} {h} {t} -> {m:?}"));
        self.check("change visibility", e.map_err(|e| code(&e)), m)
    }
}

fn run_case(seed: u64, steps: usize) -> Result<Vec<String>, String> {
    let mut c = Case::new(seed);
    for _ in 0..steps {
        if let Err(e) = c.step() {
            let tail: Vec<&String> = c.log.iter().rev().take(30).rev().collect();
            return Err(format!("{e}\nlast operations:\n{tail:#?}"));
        }
    }
    // Final check: both partitions replay to the state they have.
    let now = c.now;
    c.src.restart(now)?;
    c.dlq.restart(now)?;
    if c.src.loaded > 0 {
        c.log.push("[loaded from the tail]".into());
    }
    if c.src.restored + c.dlq.restored > 0 {
        c.log.push("[restored from a snapshot]".into());
    }
    Ok(c.log)
}

/// Paths the random operations must reach over a full run, found in the operation logs.
const COVERAGE: &[(&str, &str)] = &[
    ("duplicate send", "), true))"),
    ("OverLimit", "OverLimit"),
    ("invalid handle", "ReceiptHandleIsInvalid"),
    ("not in flight", "MessageNotInflight"),
    ("visibility range", "43201 -> Err(\"InvalidParameterValue"),
    ("12 h cap", "43200 -> Err(\"InvalidParameterValue"),
    ("attempt-id retry", "attempt retry"),
    ("DLQ move", "moved to dlq"),
    ("crash before forwarding a move", "crash source before move"),
    ("crash mid-move", "crash both mid-move"),
    ("purge", "purge Ok"),
    ("purge too soon", "PurgeQueueInProgress"),
    ("restart", "restart source"),
    ("load from the tail", "[loaded from the tail]"),
    ("restart from a snapshot", "[restored from a snapshot]"),
    ("receive from the DLQ", "receive q1"),
    ("compaction of the source", "[compacted source]"),
    ("compaction of the DLQ", "[compacted dlq]"),
];

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn engine_matches_model_on_random_operations() {
    let base = env_u64("SLUICE_SEED").unwrap_or_else(rand::random);
    let cases = env_u64("SLUICE_CASES").unwrap_or(10_000);
    let steps = env_u64("SLUICE_STEPS").unwrap_or(120) as usize;
    let mut reached = vec![0u64; COVERAGE.len()];
    for i in 0..cases {
        let seed = base.wrapping_add(i);
        let result = catch_unwind(AssertUnwindSafe(|| run_case(seed, steps)));
        match result {
            Ok(Ok(log)) => {
                for (i, (_, needle)) in COVERAGE.iter().enumerate() {
                    if log.iter().any(|l| l.contains(needle)) {
                        reached[i] += 1;
                    }
                }
            }
            Ok(Err(e)) => {
                panic!("engine/model mismatch; replay with SLUICE_SEED={seed} SLUICE_CASES=1\n{e}")
            }
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!("engine panicked; replay with SLUICE_SEED={seed} SLUICE_CASES=1: {msg}")
            }
        }
    }
    // A full run must reach every interesting path (a short replay of one seed need not).
    if cases >= 500 {
        for ((what, _), n) in COVERAGE.iter().zip(&reached) {
            assert!(*n > 0, "no case reached: {what} (base seed {base})");
        }
    }
    eprintln!(
        "engine model test: {cases} cases x {steps} steps from SLUICE_SEED={base}; cases reaching: {}",
        COVERAGE
            .iter()
            .zip(&reached)
            .map(|((w, _), n)| format!("{w} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

#[test]
fn records_round_trip_through_the_harness() {
    // The harness stores encoded records; make sure a payload with attributes survives too.
    let p = super::record::Payload::new("x".into(), Vec::new(), Some("g".into()), None);
    let r = Record {
        at_ms: 1,
        kind: super::record::RecordKind::Sent(super::record::Sent {
            id: 0,
            message_id: MessageId::derive(1, 0, 0),
            visible_at_ms: 1,
            payload: Arc::new(p),
            origin: None,
            redriven: false,
        }),
    };
    assert_eq!(Record::decode(&r.encode()), Ok(r));
}
