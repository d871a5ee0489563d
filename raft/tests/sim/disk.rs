//! The simulated disk of one replica of one group: a byte file of checksummed records, with the
//! written length and the flushed length apart. A crash keeps only the flushed bytes, optionally
//! plus a torn part of the unflushed tail with a flipped bit; recovery must stop at the first
//! record whose checksum fails and truncate there.

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::Rng;
use sluice_raft::{
    DiskId, Entry, EntryKind, HardState, Membership, NodeId, Offset, Restore, SnapshotMeta,
};
use xxhash_rust::xxh3::xxh3_64;

/// len u32 | checksum u64 (over the body) | body: offset u64, count u32, term u64, kind u8, data.
const LEN_BYTES: usize = 4;
const SUM_BYTES: usize = 8;
const BODY_FIXED_BYTES: usize = 8 + 4 + 8 + 1;

pub struct Disk {
    pub id: DiskId,
    file: Vec<u8>,
    flushed_len: usize,
    /// Written entries and where each starts in `file`.
    index: Vec<(usize, Entry)>,
    /// Persisted synchronously (as the core requires before messages are sent).
    pub hard: Option<HardState>,
    /// The snapshot below the log: meta and the state-machine hash at its offset.
    pub base: Option<(SnapshotMeta, u64)>,
    /// The core's log epoch of the last write.
    pub epoch: u64,
}

fn encode(e: &Entry, out: &mut Vec<u8>) {
    let mut body = Vec::with_capacity(BODY_FIXED_BYTES + e.data.len());
    body.extend_from_slice(&e.offset.to_le_bytes());
    body.extend_from_slice(&e.count.to_le_bytes());
    body.extend_from_slice(&e.term.to_le_bytes());
    body.push(match e.kind {
        EntryKind::Data => 0,
        EntryKind::Noop => 1,
        EntryKind::Config => 2,
    });
    body.extend_from_slice(&e.data);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&xxh3_64(&body).to_le_bytes());
    out.extend_from_slice(&body);
}

/// Parses one record at the start of `b`: the entry and its encoded length, or `None` if it is
/// truncated or its checksum fails.
fn decode(b: &[u8]) -> Option<(Entry, usize)> {
    if b.len() < LEN_BYTES + SUM_BYTES {
        return None;
    }
    let len = u32::from_le_bytes(b[0..4].try_into().ok()?) as usize;
    let sum = u64::from_le_bytes(b[4..12].try_into().ok()?);
    let body = b.get(12..12 + len)?;
    if len < BODY_FIXED_BYTES || xxh3_64(body) != sum {
        return None;
    }
    let offset = u64::from_le_bytes(body[0..8].try_into().ok()?);
    let count = u32::from_le_bytes(body[8..12].try_into().ok()?);
    let term = u64::from_le_bytes(body[12..20].try_into().ok()?);
    let kind = match body[20] {
        0 => EntryKind::Data,
        1 => EntryKind::Noop,
        2 => EntryKind::Config,
        _ => return None,
    };
    let data = Bytes::copy_from_slice(&body[21..]);
    Some((
        Entry {
            offset,
            count,
            term,
            kind,
            data,
        },
        12 + len,
    ))
}

/// What a crash did to a disk.
#[derive(Default, Debug)]
pub struct CrashReport {
    pub lost_bytes: usize,
    pub torn: bool,
    pub flipped: bool,
    /// Recovery found a bad record (torn or flipped) and truncated there.
    pub corrupt_detected: bool,
}

impl Disk {
    pub fn new(id: DiskId) -> Self {
        Disk {
            id,
            file: Vec::new(),
            flushed_len: 0,
            index: Vec::new(),
            hard: None,
            base: None,
            epoch: 0,
        }
    }

    pub fn start(&self) -> Offset {
        self.base.as_ref().map_or(0, |(m, _)| m.offset)
    }

    pub fn end(&self) -> Offset {
        self.index.last().map_or(self.start(), |(_, e)| e.end())
    }

    /// The end of the entries wholly within the flushed bytes.
    pub fn flushed_end(&self) -> Offset {
        let i = self
            .index
            .partition_point(|(pos, e)| pos + record_len(e) <= self.flushed_len);
        if i == 0 {
            self.start()
        } else {
            self.index[i - 1].1.end()
        }
    }

    pub fn is_dirty(&self) -> bool {
        self.flushed_len < self.file.len()
    }

    pub fn write(&mut self, e: &Entry) {
        assert_eq!(e.offset, self.end(), "disk write not contiguous");
        let pos = self.file.len();
        encode(e, &mut self.file);
        self.index.push((pos, e.clone()));
    }

    /// Truncation is modelled as durable at once (a metadata change synced with the next write).
    pub fn truncate(&mut self, to: Offset) {
        let i = self.index.partition_point(|(_, e)| e.offset < to);
        if i < self.index.len() {
            let pos = self.index[i].0;
            self.file.truncate(pos);
            self.index.truncate(i);
            self.flushed_len = self.flushed_len.min(pos);
        }
    }

    pub fn flush(&mut self) {
        self.flushed_len = self.file.len();
    }

    /// Installs a snapshot: the log is replaced, durably.
    pub fn install(&mut self, meta: SnapshotMeta, hash: u64) {
        self.file.clear();
        self.index.clear();
        self.flushed_len = 0;
        self.base = Some((meta, hash));
    }

    /// Drops the (flushed) log below `meta.offset`, which the snapshot now covers.
    pub fn compact(&mut self, meta: SnapshotMeta, hash: u64) {
        let i = self.index.partition_point(|(_, e)| e.end() <= meta.offset);
        let pos = self.index.get(i).map_or(self.file.len(), |(p, _)| *p);
        assert!(pos <= self.flushed_len, "compacting unflushed entries");
        self.file.drain(..pos);
        self.flushed_len -= pos;
        self.index.drain(..i);
        for (p, _) in &mut self.index {
            *p -= pos;
        }
        self.base = Some((meta, hash));
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.index.iter().map(|(_, e)| e)
    }

    /// The entry covering `offset`.
    pub fn entry_at(&self, offset: Offset) -> Option<&Entry> {
        let i = self.index.partition_point(|(_, e)| e.end() <= offset);
        self.index
            .get(i)
            .map(|(_, e)| e)
            .filter(|e| e.offset <= offset)
    }

    /// Whether the flushed part of this disk holds exactly this entry (or a snapshot past it).
    pub fn holds_flushed(&self, offset: Offset, term: u64, end: Offset) -> bool {
        if self.start() >= end {
            return true;
        }
        self.entry_at(offset)
            .is_some_and(|e| e.offset == offset && e.term == term && e.end() <= self.flushed_end())
    }

    /// Catch-up read: from the batch covering `from`, up to `max_bytes` (at least one batch).
    pub fn read(&self, from: Offset, max_bytes: usize) -> Vec<Entry> {
        if from < self.start() {
            return Vec::new();
        }
        let i = self.index.partition_point(|(_, e)| e.end() <= from);
        let mut out = Vec::new();
        let mut bytes = 0;
        for (_, e) in &self.index[i..] {
            if !out.is_empty() && bytes + e.data.len() > max_bytes {
                break;
            }
            bytes += e.data.len();
            out.push(e.clone());
        }
        out
    }

    /// Power loss: unflushed bytes are lost, except (`torn`) a random prefix of them, in which
    /// (`flip`) one bit may be flipped. Then recovery runs.
    pub fn crash(&mut self, rng: &mut SmallRng, torn: bool, flip: bool) -> CrashReport {
        let mut report = CrashReport::default();
        let unflushed = self.file.len() - self.flushed_len;
        let keep_extra = if torn && unflushed > 0 {
            report.torn = true;
            rng.gen_range(0..=unflushed)
        } else {
            0
        };
        report.lost_bytes = unflushed - keep_extra;
        self.file.truncate(self.flushed_len + keep_extra);
        if flip && keep_extra > 0 {
            let at = self.flushed_len + rng.gen_range(0..keep_extra);
            self.file[at] ^= 1 << rng.gen_range(0..8);
            report.flipped = true;
        }
        let flushed_end_before = self.flushed_end();
        report.corrupt_detected = self.recover();
        assert!(
            self.end() >= flushed_end_before,
            "recovery lost flushed entries"
        );
        report
    }

    /// Re-reads the file: keeps the longest valid prefix of records. Returns whether it cut one.
    fn recover(&mut self) -> bool {
        self.index.clear();
        let mut pos = 0;
        let mut expect = self.start();
        while pos < self.file.len() {
            match decode(&self.file[pos..]) {
                Some((e, len)) if e.offset == expect => {
                    expect = e.end();
                    self.index.push((pos, e));
                    pos += len;
                }
                _ => break,
            }
        }
        let cut = pos < self.file.len();
        self.file.truncate(pos);
        self.flushed_len = pos; // After a reboot, whatever is on the disk is durable.
        cut
    }

    /// What the core needs to reopen the group after a restart.
    pub fn restore(&mut self, node: NodeId) -> Restore {
        let hard = *self.hard.get_or_insert(HardState {
            term: 0,
            vote: None,
            disk: self.id,
        });
        let mut term_starts = Vec::new();
        let mut configs = Vec::new();
        let mut last_term = self.base.as_ref().map_or(0, |(m, _)| m.term);
        for e in self.entries() {
            if e.term != last_term {
                term_starts.push((e.term, e.offset));
                last_term = e.term;
            }
            if e.kind == EntryKind::Config {
                configs.push((e.offset, Membership::decode(&e.data).expect("valid config")));
            }
        }
        Restore {
            node,
            hard_state: hard,
            base: self.base.as_ref().map(|(m, _)| m.clone()),
            log_end: self.end(),
            term_starts,
            configs,
        }
    }
}

fn record_len(e: &Entry) -> usize {
    LEN_BYTES + SUM_BYTES + BODY_FIXED_BYTES + e.data.len()
}
