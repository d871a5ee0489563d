//! Snapshots: the whole state at one log offset, so that a restart reads the snapshot and
//! replays only the records after it (time to ready does not grow with the backlog: the
//! backlog waits in the log as the tail and costs the snapshot a few bytes).
//!
//! A snapshot is not a record: the shard keeps the newest one in a file beside the log
//! (`engine.snapshot`), written only once every record below its offset is durable. Replay
//! from the log alone (checkpoints, `compaction_floor`) keeps working without one: a missing,
//! torn or stale snapshot only makes a restart slower, never wrong.
//!
//! Format, version 4, little-endian; strings are u16 length + UTF-8. Version 1 had no wait
//! lists; version 2 kept dedup keys as strings, sorted, and their order apart; version 3 kept
//! each dedup entry as a 128-bit key hash and three whole `u64`s (41 bytes an entry against
//! about 18 now), and is still read (its hashes cut to 96 bits). A snapshot of an older version
//! is ignored and the log replayed (once, after an upgrade):
//!
//! ```text
//! "SLQS" | u8 version | u64 queue_id | u32 partition | u64 next_offset
//! u64 now_ms | u64 next_id | u64 receive_seq | opt<u64> last_purge_ms | u64 retention_ms
//! u8 dedup_scope | opt<u64> replay_start | u64 records_since_checkpoint
//! opt<(u64 offset, u64 live_floor, u64 at_ms)> last_checkpoint | u32 n, n × u64 checkpoints
//! u32 n, n × (str name, u64 last_served, u64 k, k > 0: waiting)           groups
//! u64 n, n × message (below)                                             entries, by id
//! u32 n, n × ([12] key hash, varint Δseq, varint zigzag Δexpires, varint Δoffset,
//!   opt<[16]> message_id) dedup, oldest first (the key is the low 96 bits of xxh3-128 of the
//!   dedup key; each Δ is from the entry before, the first's from 0; the message id only when
//!   it is not the one derived from seq)
//! u32 n, n × (str key, u64 at, u64 first_seq, u64 offset, u32 k, k × (u64, u32)) attempts
//! u32 n, n × (u64 queue, u32 partition, u64 id, u64 expires)              move origins
//! u32 n, n × (u64 expires, u64 queue, u32 partition, u64 id, u64 offset)  origin order
//! opt<(u64 load_offset, u64 first_id, u64 count, u64 skip, u32 n, n × (u64 ms, u64 k))> tail
//! u64 xxh3-64 of every byte before it
//!
//! message: u64 id | [16] message_id | u64 sent_ms | u64 arrived_ms | u64 visible_at_ms
//!   | u32 receive_count | opt<u64> first_receive_ms | u8 state (0 delayed, 1 available,
//!   2 in flight + u64 deadline + u64 lease_start, 3 moving) | u32 group (index above)
//!   | u64 sent_offset | u8 flags (1 touched, 2 pinned) | opt<(u64, u32, u64, u64)> origin
//!   | u8 move_to (0 redrive target, 1 dead-letter source, 2 queue + u64 id)
//! waiting: (u64 id, u64 offset, u64 at_ms) first | the same, last | u32 b, b bytes: varint
//!   deltas (id, offset, at_ms) of the k - 1 after the first (see `WaitList`)
//! opt<T>: u8 0 | u8 1 + T
//! ```
//!
//! Derived state (group members and counts, readiness, counters, timers, the moving set) is
//! rebuilt on restore, so it cannot disagree with the entries.

use super::*;

const MAGIC: &[u8; 4] = b"SLQS";
/// The snapshot format written; restore reads it and [`SNAPSHOT_VERSION_MIN`] on (an unknown
/// one is ignored by the shard, which then replays the log).
pub const SNAPSHOT_VERSION: u8 = 4;
/// The oldest format restore reads.
pub const SNAPSHOT_VERSION_MIN: u8 = 3;

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Why a snapshot cannot be used (the shard then replays from the log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("engine snapshot: {0}")]
pub struct SnapshotError(pub &'static str);

impl Partition {
    /// Where a snapshot taken now would resume: the offset of the next record.
    pub fn snapshot_offset(&self) -> u64 {
        self.next_offset
    }

    /// The lowest log offset a restart from a snapshot taken now reads: where it resumes, or
    /// where its tail's loads resume if lower. The shard must not compact below it while this
    /// snapshot is its newest.
    pub fn snapshot_needs_from(&self) -> u64 {
        self.tail
            .as_ref()
            .map_or(self.next_offset, |t| t.load_offset.min(self.next_offset))
    }

    /// The whole state as bytes (see the module documentation), or `None` while a replay has
    /// not proven it knows every message (a snapshot then would be incomplete).
    pub fn snapshot(&self) -> Option<Vec<u8>> {
        self.encode(SNAPSHOT_VERSION)
    }

    /// [`Partition::snapshot`] in format `version` (the tests write the older ones it reads).
    fn encode(&self, version: u8) -> Option<Vec<u8>> {
        if self.skipping || !self.strict {
            return None;
        }
        // Sized for what it will hold (a dedup entry takes ~18 bytes) and the block it is
        // padded to when written, so that a large state is not copied as the buffer grows, nor
        // held twice while it does.
        let mut w = Vec::with_capacity(
            8192 + self.msgs.len() * 120 + self.waiting_bytes() + self.dedup.len() * 20,
        );
        w.extend_from_slice(MAGIC);
        w.push(version);
        put64(&mut w, self.cfg.queue_id);
        put32(&mut w, self.cfg.partition);
        put64(&mut w, self.next_offset);
        put64(&mut w, self.now_ms);
        put64(&mut w, self.next_id);
        put64(&mut w, self.receive_seq);
        put_opt64(&mut w, self.last_purge_ms);
        put64(&mut w, self.retention_ms);
        w.push(match self.dedup_scope {
            DedupScope::Queue => 0,
            DedupScope::MessageGroup => 1,
        });
        put_opt64(&mut w, self.replay_start);
        put64(&mut w, self.records_since_checkpoint);
        match self.last_checkpoint {
            None => w.push(0),
            Some(c) => {
                w.push(1);
                put64(&mut w, c.offset);
                put64(&mut w, c.live_floor);
                put64(&mut w, c.at_ms);
            }
        }
        put32(&mut w, self.checkpoints.len() as u32);
        for &c in &self.checkpoints {
            put64(&mut w, c);
        }
        // Groups by their slot, so that entries can name them by position.
        let mut slot_to_pos = vec![u32::MAX; self.groups.len()];
        let live: Vec<(usize, &Group)> = self
            .groups
            .iter()
            .enumerate()
            .filter_map(|(i, g)| g.as_ref().map(|g| (i, g)))
            .collect();
        put32(&mut w, live.len() as u32);
        for (pos, (slot, g)) in live.iter().enumerate() {
            slot_to_pos[*slot] = pos as u32;
            put_str(&mut w, &g.name);
            put64(&mut w, g.last_served);
            put64(&mut w, g.waiting.len);
            if let (Some(f), Some(b)) = (g.waiting.front, g.waiting.back) {
                for e in [f, b] {
                    put64(&mut w, e.id);
                    put64(&mut w, e.offset);
                    put64(&mut w, e.at_ms);
                }
                let deltas = g.waiting.deltas();
                put32(&mut w, deltas.len() as u32);
                w.extend_from_slice(deltas);
            }
        }
        put64(&mut w, self.msgs.len() as u64);
        for (&id, m) in &self.msgs {
            put64(&mut w, id);
            w.extend_from_slice(&m.message_id.0);
            put64(&mut w, m.sent_ms);
            put64(&mut w, m.arrived_ms);
            put64(&mut w, m.visible_at_ms);
            put32(&mut w, m.receive_count);
            put_opt64(&mut w, m.first_receive_ms);
            match m.state {
                State::Delayed => w.push(0),
                State::Available => w.push(1),
                State::InFlight {
                    deadline_ms,
                    lease_start_ms,
                } => {
                    w.push(2);
                    put64(&mut w, deadline_ms);
                    put64(&mut w, lease_start_ms);
                }
                State::Moving => w.push(3),
            }
            put32(&mut w, slot_to_pos[m.group as usize]);
            put64(&mut w, m.sent_offset);
            w.push(u8::from(m.touched) | (u8::from(m.pinned) << 1));
            match m.origin {
                None => w.push(0),
                Some(o) => {
                    w.push(1);
                    put64(&mut w, o.queue_id);
                    put32(&mut w, o.partition);
                    put64(&mut w, o.msg_id);
                    put64(&mut w, o.sent_ms);
                }
            }
            match m.move_to {
                MoveDestination::RedriveTarget => w.push(0),
                MoveDestination::DeadLetterSource => w.push(1),
                MoveDestination::Queue(q) => {
                    w.push(2);
                    put64(&mut w, q);
                }
            }
        }
        put32(&mut w, self.dedup.len() as u32);
        let mut prev = (0u64, 0u64, 0u64);
        for e in self.dedup.iter() {
            if version == 3 {
                w.extend_from_slice(&e.hash.to_le_bytes());
                put64(&mut w, e.seq);
                put64(&mut w, e.expires_ms);
                put64(&mut w, e.offset);
            } else {
                w.extend_from_slice(&e.hash.to_le_bytes()[..12]);
                put_varint(&mut w, e.seq.wrapping_sub(prev.0));
                put_varint(&mut w, zigzag(e.expires_ms.wrapping_sub(prev.1) as i64));
                put_varint(&mut w, e.offset.wrapping_sub(prev.2));
            }
            prev = (e.seq, e.expires_ms, e.offset);
            match e.message_id {
                None => w.push(0),
                Some(id) => {
                    w.push(1);
                    w.extend_from_slice(&id.0);
                }
            }
        }
        put32(&mut w, self.attempt_order.len() as u32);
        for k in self.attempt_order.values() {
            let e = &self.attempts[k];
            put_str(&mut w, k);
            put64(&mut w, e.at_ms);
            put64(&mut w, e.first_seq);
            put64(&mut w, e.offset);
            put32(&mut w, e.items.len() as u32);
            for &(id, rc) in &e.items {
                put64(&mut w, id);
                put32(&mut w, rc);
            }
        }
        let mut origins: Vec<_> = self.origins.iter().collect();
        origins.sort();
        put32(&mut w, origins.len() as u32);
        for (&(q, p, id), &expires) in origins {
            put64(&mut w, q);
            put32(&mut w, p);
            put64(&mut w, id);
            put64(&mut w, expires);
        }
        put32(&mut w, self.origin_order.len() as u32);
        for &(expires, (q, p, id), offset) in &self.origin_order {
            put64(&mut w, expires);
            put64(&mut w, q);
            put32(&mut w, p);
            put64(&mut w, id);
            put64(&mut w, offset);
        }
        match &self.tail {
            None => w.push(0),
            Some(t) => {
                w.push(1);
                put64(&mut w, t.load_offset);
                put64(&mut w, t.first_id);
                put64(&mut w, t.count);
                put64(&mut w, t.skip);
                put32(&mut w, t.times.len() as u32);
                for &(ms, n) in &t.times {
                    put64(&mut w, ms);
                    put64(&mut w, n);
                }
            }
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&w);
        put64(&mut w, sum);
        Some(w)
    }

    /// Rebuilds a partition from [`Partition::snapshot`]'s bytes; replay then goes on with the
    /// record at [`Partition::snapshot_offset`]. Checks the checksum, the version, the queue and
    /// partition, and that the entries fit together; never panics on bad bytes.
    pub fn restore(cfg: PartitionConfig, bytes: &[u8]) -> Result<Partition, SnapshotError> {
        let bad = SnapshotError;
        if bytes.len() < MAGIC.len() + 1 + 8 {
            return Err(bad("too short"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 8);
        if xxhash_rust::xxh3::xxh3_64(body).to_le_bytes() != sum {
            return Err(bad("checksum mismatch"));
        }
        let mut r = Rd(body);
        if r.take(4)? != MAGIC {
            return Err(bad("not a snapshot"));
        }
        let version = r.u8()?;
        if !(SNAPSHOT_VERSION_MIN..=SNAPSHOT_VERSION).contains(&version) {
            return Err(bad("unknown version"));
        }
        if (r.u64()?, r.u32()?) != (cfg.queue_id, cfg.partition) {
            return Err(bad("another partition's snapshot"));
        }
        let mut p = Partition::new(cfg).map_err(|_| bad("bad partition config"))?;
        p.next_offset = r.u64()?;
        p.now_ms = r.u64()?;
        p.next_id = r.u64()?;
        p.receive_seq = r.u64()?;
        p.last_purge_ms = r.opt64()?;
        p.retention_ms = r.u64()?;
        p.dedup_scope = match r.u8()? {
            0 => DedupScope::Queue,
            1 => DedupScope::MessageGroup,
            _ => return Err(bad("bad dedup scope")),
        };
        // Replay goes on from the snapshot: it has started (a partition built live has no
        // start of its own; 0 is what its compaction floor assumes).
        p.replay_start = Some(r.opt64()?.unwrap_or(0));
        p.records_since_checkpoint = r.u64()?;
        p.last_checkpoint = match r.u8()? {
            0 => None,
            1 => Some(LastCheckpoint {
                offset: r.u64()?,
                live_floor: r.u64()?,
                at_ms: r.u64()?,
            }),
            _ => return Err(bad("bad flag")),
        };
        for _ in 0..r.len32(8)? {
            p.checkpoints.push_back(r.u64()?);
        }
        let mut slots = Vec::new();
        for _ in 0..r.len32(18)? {
            let name = r.str()?;
            if p.group_by_name.contains_key(name.as_str()) {
                return Err(bad("a group listed twice"));
            }
            let g = p.group_for(&name);
            p.group_mut(g).last_served = r.u64()?;
            let k = r.u64()?;
            if k > 0 {
                if name.is_empty() && !p.fifo() {
                    return Err(bad("waiting messages without a group"));
                }
                let mut ends = [Waiting {
                    id: 0,
                    offset: 0,
                    at_ms: 0,
                }; 2];
                for e in &mut ends {
                    *e = Waiting {
                        id: r.u64()?,
                        offset: r.u64()?,
                        at_ms: r.u64()?,
                    };
                }
                let n = r.u32()? as usize;
                let list = WaitList::from_parts(ends[0], ends[1], k, r.take(n)?)
                    .ok_or(bad("a wait list does not decode"))?;
                if ends[1].id >= p.next_id || ends[1].offset >= p.next_offset {
                    return Err(bad("a waiting message beyond the log"));
                }
                let count = u32::try_from(k).map_err(|_| bad("wait list too long"))?;
                let grp = p.group_mut(g);
                grp.waiting = list;
                grp.msg_count = count;
                p.wait_fronts.insert((ends[0].id, g));
                p.waiting += k;
                p.grouped += k;
                p.count(State::Available, k as i64);
            }
            slots.push(g);
        }
        let n = r.u64()?;
        if n > (r.0.len() / 60) as u64 {
            return Err(bad("more entries than bytes"));
        }
        let fifo = p.fifo();
        let mut last_id = None;
        for _ in 0..n {
            let id = r.u64()?;
            if last_id.is_some_and(|l| id <= l) || id >= p.next_id {
                return Err(bad("entry ids out of order"));
            }
            last_id = Some(id);
            let message_id = MessageId(r.arr16()?);
            let sent_ms = r.u64()?;
            let arrived_ms = r.u64()?;
            let visible_at_ms = r.u64()?;
            let receive_count = r.u32()?;
            let first_receive_ms = r.opt64()?;
            let state = match r.u8()? {
                0 => State::Delayed,
                1 => State::Available,
                2 => State::InFlight {
                    deadline_ms: r.u64()?,
                    lease_start_ms: r.u64()?,
                },
                3 => State::Moving,
                _ => return Err(bad("bad message state")),
            };
            let group = *slots
                .get(r.u32()? as usize)
                .ok_or(bad("entry names no group"))?;
            let sent_offset = r.u64()?;
            let flags = r.u8()?;
            let origin = match r.u8()? {
                0 => None,
                1 => Some(MoveOrigin {
                    queue_id: r.u64()?,
                    partition: r.u32()?,
                    msg_id: r.u64()?,
                    sent_ms: r.u64()?,
                }),
                _ => return Err(bad("bad flag")),
            };
            let move_to = match r.u8()? {
                0 => MoveDestination::RedriveTarget,
                1 => MoveDestination::DeadLetterSource,
                2 => MoveDestination::Queue(r.u64()?),
                _ => return Err(bad("bad move destination")),
            };
            let pinned = flags & 2 != 0;
            if !pinned
                && !p.groups[group as usize]
                    .as_ref()
                    .is_some_and(|g| g.name.is_empty())
            {
                p.grouped += 1;
            }
            p.msgs.insert(
                id,
                Msg {
                    message_id,
                    sent_ms,
                    arrived_ms,
                    visible_at_ms,
                    receive_count,
                    first_receive_ms,
                    state,
                    group,
                    sent_offset,
                    touched: flags & 1 != 0,
                    origin,
                    move_to,
                    pinned,
                },
            );
            if pinned {
                p.pinned += 1;
            }
            p.count(state, 1);
            let grp = p.group_mut(group);
            grp.msg_count = grp.msg_count.checked_add(1).ok_or(bad("group too large"))?;
            match state {
                State::InFlight { .. } => grp.inflight += 1,
                State::Moving => grp.moving += 1,
                _ => {}
            }
            if (fifo && state != State::Moving) || (!fifo && state == State::Available) {
                grp.members.insert(id);
            }
            if state == State::Moving {
                p.moving.insert(id);
            }
        }
        let n = r.len32(if version == 3 { 41 } else { 16 })?;
        p.dedup.reserve(n as usize);
        let mut prev: Option<DedupEntry> = None;
        for _ in 0..n {
            let (hash, seq, expires_ms, offset) = if version == 3 {
                // 128-bit keys then; the table keeps the low 96 bits of the same hash.
                (
                    u128::from_le_bytes(r.arr16()?),
                    r.u64()?,
                    r.u64()?,
                    r.u64()?,
                )
            } else {
                let mut h = [0u8; 16];
                h[..12].copy_from_slice(r.take(12)?);
                let (s0, e0, o0) = prev.map_or((0, 0, 0), |e| (e.seq, e.expires_ms, e.offset));
                let seq = s0
                    .checked_add(r.varint()?)
                    .ok_or(bad("dedup seq overflows"))?;
                let expires = e0.wrapping_add(unzigzag(r.varint()?) as u64);
                let offset = o0
                    .checked_add(r.varint()?)
                    .ok_or(bad("dedup offset overflows"))?;
                (u128::from_le_bytes(h), seq, expires, offset)
            };
            let e = DedupEntry {
                hash: hash & ((1u128 << dedup::KEY_HASH_BITS) - 1),
                seq,
                expires_ms,
                offset,
                message_id: match r.u8()? {
                    0 => None,
                    1 => Some(MessageId(r.arr16()?)),
                    _ => return Err(bad("bad flag")),
                },
            };
            // In insertion order: sequence numbers grow (they are the `Sent` records' ids), and
            // so do the offsets of those records.
            if prev.is_some_and(|p| p.seq >= e.seq || p.offset >= e.offset) {
                return Err(bad("dedup entries out of order"));
            }
            prev = Some(e);
            if !p.dedup.insert_restored(e) {
                return Err(bad("more dedup entries than a table holds"));
            }
        }
        for _ in 0..r.len32(30)? {
            let key = r.str()?;
            let at_ms = r.u64()?;
            let first_seq = r.u64()?;
            let offset = r.u64()?;
            let mut items = Vec::new();
            for _ in 0..r.len32(12)? {
                items.push((r.u64()?, r.u32()?));
            }
            if p.attempt_order.insert(first_seq, key.clone()).is_some() {
                return Err(bad("two attempts with one sequence number"));
            }
            p.attempts.insert(
                key,
                AttemptEntry {
                    at_ms,
                    first_seq,
                    items,
                    offset,
                },
            );
        }
        for _ in 0..r.len32(28)? {
            let key = (r.u64()?, r.u32()?, r.u64()?);
            p.origins.insert(key, r.u64()?);
        }
        for _ in 0..r.len32(36)? {
            let expires = r.u64()?;
            let key = (r.u64()?, r.u32()?, r.u64()?);
            p.origin_order.push_back((expires, key, r.u64()?));
        }
        p.tail = match r.u8()? {
            0 => None,
            1 => {
                let mut t = Tail {
                    load_offset: r.u64()?,
                    first_id: r.u64()?,
                    count: r.u64()?,
                    skip: r.u64()?,
                    times: VecDeque::new(),
                };
                let mut sum = 0u64;
                for _ in 0..r.len32(16)? {
                    let (ms, k) = (r.u64()?, r.u64()?);
                    sum = sum.saturating_add(k);
                    t.times.push_back((ms, k));
                }
                if sum != t.count || t.load_offset > p.next_offset || t.first_id > p.next_id {
                    return Err(bad("tail does not add up"));
                }
                Some(t)
            }
            _ => return Err(bad("bad flag")),
        };
        if !r.0.is_empty() {
            return Err(bad("trailing bytes"));
        }
        if let Some(count) = p.tail.as_ref().map(|t| t.count).filter(|&c| c > 0) {
            let g = p.group_for("");
            let grp = p.group_mut(g);
            grp.msg_count = grp
                .msg_count
                .checked_add(u32::try_from(count).map_err(|_| bad("tail too large"))?)
                .ok_or(bad("tail too large"))?;
            p.count(State::Available, count as i64);
        }
        if p.groups.iter().flatten().any(|g| g.msg_count == 0) {
            return Err(bad("a group without messages"));
        }
        for g in 0..p.groups.len() as u32 {
            if p.groups[g as usize].is_some() {
                p.refresh_ready(g);
            }
        }
        p.rebuild_timers();
        Ok(p)
    }
}

fn put64(w: &mut Vec<u8>, v: u64) {
    w.extend_from_slice(&v.to_le_bytes());
}

fn put32(w: &mut Vec<u8>, v: u32) {
    w.extend_from_slice(&v.to_le_bytes());
}

fn put_opt64(w: &mut Vec<u8>, v: Option<u64>) {
    match v {
        None => w.push(0),
        Some(v) => {
            w.push(1);
            put64(w, v);
        }
    }
}

fn put_str(w: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    let n = u16::try_from(b.len()).expect("names and keys are short");
    w.extend_from_slice(&n.to_le_bytes());
    w.extend_from_slice(b);
}

struct Rd<'a>(&'a [u8]);

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        if self.0.len() < n {
            return Err(SnapshotError("truncated"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn varint(&mut self) -> Result<u64, SnapshotError> {
        let (v, used) = get_varint(self.0).ok_or(SnapshotError("bad varint"))?;
        self.0 = &self.0[used..];
        Ok(v)
    }
    fn arr16(&mut self) -> Result<[u8; 16], SnapshotError> {
        Ok(self.take(16)?.try_into().expect("16 bytes"))
    }
    fn opt64(&mut self) -> Result<Option<u64>, SnapshotError> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.u64()?)),
            _ => Err(SnapshotError("bad flag")),
        }
    }
    fn str(&mut self) -> Result<String, SnapshotError> {
        let n = u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")) as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| SnapshotError("bad UTF-8"))
    }
    /// A count of items at least `min_bytes` each: never more than the bytes left allow (so a
    /// corrupt count cannot make restore allocate or loop beyond the input).
    fn len32(&mut self, min_bytes: usize) -> Result<u32, SnapshotError> {
        let n = self.u32()?;
        if n as usize > self.0.len() / min_bytes.max(1) {
            return Err(SnapshotError("count larger than the bytes left"));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::attributes::{QueueAttributes, QueueKind};
    use super::super::super::types::{ReceiveRequest, SendRequest};
    use super::*;

    fn busy_partition() -> Partition {
        let mut a = QueueAttributes::new(QueueKind::Standard);
        a.visibility_timeout_s = 30;
        let mut p = Partition::new(PartitionConfig {
            queue_id: 3,
            partition: 1,
            attributes: a,
            limits: Limits {
                resident_entries_target: 4,
                ..Limits::default()
            },
        })
        .expect("config");
        for i in 0..12 {
            let group_id = (i % 3 == 0).then(|| format!("g{i}"));
            let delay_s = (i % 5 == 0).then_some(7);
            p.execute(
                1_000 + i,
                Command::Send(SendRequest {
                    body: format!("body {i}"),
                    group_id,
                    delay_s,
                    ..Default::default()
                }),
            )
            .expect("send");
        }
        p.execute(
            2_000,
            Command::Receive(ReceiveRequest {
                max_messages: 3,
                visibility_timeout_s: None,
                attempt_id: None,
            }),
        )
        .expect("receive");
        p
    }

    #[test]
    fn a_snapshot_restores_the_same_state() {
        let p = busy_partition();
        assert!(p.tail.is_some(), "the test needs a tail");
        let bytes = p.snapshot().expect("snapshot");
        let q = Partition::restore(p.cfg.clone(), &bytes).expect("restore");
        assert_eq!(p.dump(), q.dump());
        assert_eq!(p.counters(), q.counters());
        let again = q.snapshot().expect("snapshot of a restored partition");
        let r = Partition::restore(p.cfg.clone(), &again).expect("restore again");
        assert_eq!(p.dump(), r.dump());
    }

    #[test]
    fn damaged_snapshots_are_refused_and_never_panic() {
        let p = busy_partition();
        let bytes = p.snapshot().expect("snapshot");
        // Any flipped byte breaks the checksum.
        for i in (0..bytes.len()).step_by(7) {
            let mut b = bytes.clone();
            b[i] ^= 0x41;
            assert!(
                Partition::restore(p.cfg.clone(), &b).is_err(),
                "flip at {i}"
            );
        }
        for n in 0..bytes.len() {
            assert!(
                Partition::restore(p.cfg.clone(), &bytes[..n]).is_err(),
                "cut at {n}"
            );
        }
        // Past the checksum (a bug or a collision), the parser still checks what it reads.
        let body = &bytes[..bytes.len() - 8];
        for i in 0..body.len() {
            for x in [0x01u8, 0x80, 0xff] {
                let mut b = body.to_vec();
                b[i] ^= x;
                let sum = xxhash_rust::xxh3::xxh3_64(&b);
                b.extend_from_slice(&sum.to_le_bytes());
                let _ = Partition::restore(p.cfg.clone(), &b);
            }
        }
        // Another partition's snapshot is not this one's.
        let mut other = p.cfg.clone();
        other.partition = 2;
        assert_eq!(
            Partition::restore(other, &bytes).err(),
            Some(SnapshotError("another partition's snapshot"))
        );
    }

    fn fifo_partition() -> Partition {
        let mut p = Partition::new(PartitionConfig {
            queue_id: 4,
            partition: 0,
            attributes: QueueAttributes::new(QueueKind::Fifo),
            limits: Limits::default(),
        })
        .expect("config");
        for i in 0..3_000u64 {
            p.execute(
                10_000 + i / 7,
                Command::Send(SendRequest {
                    body: format!("body {i}"),
                    group_id: Some(format!("g{}", i % 13)),
                    dedup_id: Some(format!("d{i}")),
                    ..Default::default()
                }),
            )
            .expect("send");
        }
        p
    }

    #[test]
    fn a_fifo_snapshot_keeps_its_dedup_entries_in_both_formats() {
        let p = fifo_partition();
        assert_eq!(p.dedup.len(), 3_000);
        let v4 = p.snapshot().expect("snapshot");
        let v3 = p.encode(3).expect("snapshot");
        assert!(
            v4.len() + 20 * 3_000 < v3.len(),
            "{} vs {}",
            v4.len(),
            v3.len()
        );
        for bytes in [&v4, &v3] {
            let mut q = Partition::restore(p.cfg.clone(), bytes).expect("restore");
            assert_eq!(p.dump(), q.dump());
            assert_eq!(
                p.dedup.iter().collect::<Vec<_>>(),
                q.dedup.iter().collect::<Vec<_>>()
            );
            // A duplicate is still one after the restore.
            let r = q
                .execute(
                    20_000,
                    Command::Send(SendRequest {
                        body: "again".into(),
                        group_id: Some("g5".into()),
                        dedup_id: Some("d5".into()),
                        ..Default::default()
                    }),
                )
                .expect("send");
            let dump = format!("{r:?}");
            assert!(dump.contains("duplicate: true"), "{dump}");
        }
    }
}

/// How fast a large FIFO state restores (`cargo test --release -p sluice-broker --lib
/// restore_speed -- --ignored --nocapture`): what a restart of a big FIFO backlog costs per
/// message before the partition is ready.
#[cfg(test)]
mod speed {
    use super::super::super::attributes::{QueueAttributes, QueueKind};
    use super::super::super::types::SendRequest;
    use super::*;

    #[test]
    #[ignore]
    fn restore_speed() {
        let n = 2_000_000u64;
        let mut a = QueueAttributes::new(QueueKind::Fifo);
        a.dedup_scope = DedupScope::MessageGroup;
        let mut p = Partition::new(PartitionConfig {
            queue_id: 4,
            partition: 0,
            attributes: a,
            limits: Limits {
                dedup_entries_max: u32::MAX,
                ..Limits::default()
            },
        })
        .expect("config");
        for i in 0..n {
            p.execute(
                10_000 + i / 200,
                Command::Send(SendRequest {
                    body: "b".into(),
                    group_id: Some(format!("group-{}", i % 50_000)),
                    dedup_id: Some(format!("dedup-{i:016}")),
                    ..Default::default()
                }),
            )
            .expect("send");
        }
        let t = crate::runtime::monotonic_now();
        let bytes = p.snapshot().expect("snapshot");
        let encode = t.elapsed();
        let t = crate::runtime::monotonic_now();
        let q = Partition::restore(p.cfg.clone(), &bytes).expect("restore");
        let restore = t.elapsed();
        assert_eq!(q.dedup.len(), n as usize);
        println!(
            "{n} messages: snapshot {} B ({:.1} B/message), encode {:?} ({:.0} ns/message), \
             restore {:?} ({:.0} ns/message)",
            bytes.len(),
            bytes.len() as f64 / n as f64,
            encode,
            encode.as_nanos() as f64 / n as f64,
            restore,
            restore.as_nanos() as f64 / n as f64
        );
    }
}
