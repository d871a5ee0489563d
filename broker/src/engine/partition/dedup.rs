//! The FIFO deduplication table (CONTRACT.md C4): one entry per deduplication key sent in the
//! last five minutes, answering a duplicate send with the original's MessageId and sequence
//! number. A FIFO backlog has one entry per message sent in the window, so its cost per entry is
//! what a burst of sends costs in RAM: 18 bytes of entry plus 5 to 11 bytes of index.
//!
//! - **Keys are 96-bit hashes** (the low 96 bits of xxh3-128, [`key_hash`]; stable across
//!   processes and versions: they go into snapshots) of the dedup key (`Partition::dedup_hash`),
//!   never the strings. Accidental collisions are negligible: with n keys live the chance that
//!   any two share a hash is about n² / 2⁹⁷, under 10⁻¹⁵ for a table of 10 million (a burst of
//!   35,000 sends a second held for the whole window). xxh3 is not a cryptographic hash, so a
//!   sender could craft two ids with one hash; the second message would then be refused as a
//!   duplicate of the first. A table belongs to one partition of one queue, so whoever crafts
//!   a collision can only make their own queue drop their own messages, as reusing an id would.
//! - **Entries are kept in insertion order**, which is expiry order (every entry lives
//!   `DEDUP_WINDOW_MS` from its `Sent`, and record times do not go back), in chunks of
//!   [`CHUNK`] entries: the oldest expires from the front, a new one goes to the back, and no
//!   more than one chunk's slack is ever allocated beyond the entries (a `VecDeque` that
//!   doubles could hold twice its entries).
//! - **Sequence numbers, expiry times and log offsets grow along the entries**, so a chunk keeps
//!   its first entry's three values and every entry its differences from them in 16 bits. An
//!   entry whose differences do not fit keeps its values whole in a side map instead (~50
//!   bytes more): a chunk spans 65.5 s only below 4 sends a second (a table of at most ~1,200
//!   entries), and 65,535 ids or records only with over 255 a dedup entry; or a time went back.
//! - **The index** is an open-addressing table of `u32` slots (linear probing, at most 3/4
//!   full, backward-shift deletion: no tombstones) naming entries by their insertion number.
//!   A slot's position comes from the key mixed with a per-process random seed, so a sender
//!   cannot pile keys into one probe run; the index is rebuilt on restore and never written.
//! - **The MessageId is not stored** when it is the one the partition derives from the
//!   sequence number (every message sent here); another one (a record written otherwise) is
//!   kept in a side map by sequence number.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;

use super::super::record::MessageId;

/// Entries per chunk of the store (4.5 KiB).
const CHUNK: usize = 256;
/// An index slot: 0 is empty, otherwise `OCCUPIED` | the entry's number mod 2³¹.
const OCCUPIED: u32 = 1 << 31;
const NUMBER_MASK: u32 = OCCUPIED - 1;
/// The most entries a table holds: numbers mod 2³¹ name them unambiguously (48 GiB of entries).
pub(crate) const DEDUP_TABLE_MAX: usize = NUMBER_MASK as usize;
/// The smallest index allocated.
const INDEX_MIN: usize = 16;
/// The bits of a key hash the table keeps and compares.
pub(crate) const KEY_HASH_BITS: u32 = 96;
const KEY_HASH_MASK: u128 = (1u128 << KEY_HASH_BITS) - 1;
/// A slot's `seq` when its values are in `DedupTable::wide`.
const WIDE: u16 = u16::MAX;

/// The hash of a dedup key's bytes (the table's key): the low [`KEY_HASH_BITS`] of xxh3-128.
pub(crate) fn key_hash(bytes: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(bytes) & KEY_HASH_MASK
}

/// One stored entry: 18 bytes.
#[derive(Clone, Copy)]
struct Slot {
    /// The key's hash, low part first.
    hash: [u16; 6],
    /// Differences from the chunk's first entry, or `seq == WIDE`.
    seq: u16,
    expires: u16,
    offset: u16,
}

/// Up to [`CHUNK`] entries and the values their differences are taken from.
struct Chunk {
    seq: u64,
    expires_ms: u64,
    offset: u64,
    slots: Vec<Slot>,
}

/// An entry as read or inserted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DedupEntry {
    /// The hash of the dedup key ([`key_hash`]; bits above [`KEY_HASH_BITS`] are ignored).
    pub hash: u128,
    /// The original message's sequence number (its id in this partition).
    pub seq: u64,
    pub expires_ms: u64,
    /// Log offset of the `Sent` record that made it (kept while the entry lives: C4).
    pub offset: u64,
    /// The original's MessageId when it is not the one derived from `seq`.
    pub message_id: Option<MessageId>,
}

/// See the module documentation.
pub(crate) struct DedupTable {
    /// Entries in insertion order; every chunk but the last holds exactly `CHUNK`. The first
    /// `head` entries of the first chunk have expired.
    chunks: VecDeque<Chunk>,
    head: usize,
    len: usize,
    /// The insertion number of the first live entry (of the next one when empty).
    first: u64,
    /// Open addressing, length a power of two (or empty when the table is).
    index: Vec<u32>,
    /// The per-process key a slot's position is mixed with.
    seed: [u64; 2],
    /// MessageIds not derived from their sequence number, by sequence number.
    other_ids: HashMap<u64, MessageId>,
    /// (seq, expires_ms, offset) of the entries whose differences do not fit a slot, by
    /// insertion number.
    wide: HashMap<u64, (u64, u64, u64)>,
}

impl Default for DedupTable {
    fn default() -> Self {
        Self::new()
    }
}

impl DedupTable {
    pub(crate) fn new() -> Self {
        DedupTable {
            chunks: VecDeque::new(),
            head: 0,
            len: 0,
            first: 0,
            index: Vec::new(),
            seed: {
                let s = RandomState::new();
                [s.hash_one(1u8) | 1, s.hash_one(2u8) | 1]
            },
            other_ids: HashMap::new(),
            wide: HashMap::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Sizes the index for `more` entries beyond those held, so that inserting them never
    /// rebuilds it (a restore knows how many it will insert).
    pub(crate) fn reserve(&mut self, more: usize) {
        let want = (self.len + more).min(DEDUP_TABLE_MAX);
        let mut slots = self.index.len().max(INDEX_MIN);
        while want * 4 > slots * 3 {
            slots *= 2;
        }
        if slots > self.index.len() {
            self.rebuild_index(slots);
        }
    }

    /// The entry for `hash`.
    pub(crate) fn get(&self, hash: u128) -> Option<DedupEntry> {
        match self.find(hash) {
            Ok((_, pos)) => Some(self.entry(pos)),
            Err(_) => None,
        }
    }

    /// Adds `e` at the back (the newest). False, and nothing changes, when its hash is already
    /// in the table or the table holds [`DEDUP_TABLE_MAX`] entries.
    pub(crate) fn insert(&mut self, e: DedupEntry) -> bool {
        if self.len >= DEDUP_TABLE_MAX {
            return false;
        }
        if (self.len + 1) * 4 > self.index.len() * 3 {
            self.rebuild_index((self.index.len() * 2).max(INDEX_MIN));
        }
        let i = match self.find(e.hash) {
            Ok(_) => return false,
            Err(i) => i,
        };
        self.place(i, e);
        true
    }

    /// Stores `e` as the newest entry and names it from index slot `i` (empty).
    fn place(&mut self, i: usize, e: DedupEntry) {
        let number = self.first + self.len as u64;
        self.index[i] = number_slot(number);
        if self.chunks.back().is_none_or(|c| c.slots.len() == CHUNK) {
            self.chunks.push_back(Chunk {
                seq: e.seq,
                expires_ms: e.expires_ms,
                offset: e.offset,
                slots: Vec::with_capacity(CHUNK),
            });
        }
        let c = self.chunks.back_mut().expect("a chunk");
        let narrow = |v: u64, base: u64| v.checked_sub(base).and_then(|d| u16::try_from(d).ok());
        let slot = match (
            narrow(e.seq, c.seq).filter(|&d| d != WIDE),
            narrow(e.expires_ms, c.expires_ms),
            narrow(e.offset, c.offset),
        ) {
            (Some(seq), Some(expires), Some(offset)) => Slot {
                hash: split(e.hash),
                seq,
                expires,
                offset,
            },
            _ => {
                self.wide.insert(number, (e.seq, e.expires_ms, e.offset));
                Slot {
                    hash: split(e.hash),
                    seq: WIDE,
                    expires: 0,
                    offset: 0,
                }
            }
        };
        c.slots.push(slot);
        self.len += 1;
        if let Some(id) = e.message_id {
            self.other_ids.insert(e.seq, id);
        }
    }

    /// Adds `e` at the back without looking for its hash first: for a restore, whose entries
    /// were unique when written (a checksummed snapshot). Were one there twice, lookups would
    /// find one of the two and expiry would still remove both. False when the table is full.
    pub(crate) fn insert_restored(&mut self, e: DedupEntry) -> bool {
        if self.len >= DEDUP_TABLE_MAX {
            return false;
        }
        if (self.len + 1) * 4 > self.index.len() * 3 {
            self.rebuild_index((self.index.len() * 2).max(INDEX_MIN));
        }
        let mask = self.index.len() - 1;
        let mut i = self.home(split(e.hash));
        while self.index[i] != 0 {
            i = (i + 1) & mask;
        }
        self.place(i, e);
        true
    }

    /// The oldest entry.
    pub(crate) fn front(&self) -> Option<DedupEntry> {
        (self.len > 0).then(|| self.entry(0))
    }

    /// When the oldest entry expires.
    pub(crate) fn front_expires_ms(&self) -> Option<u64> {
        (self.len > 0).then(|| self.values(0).1)
    }

    /// Removes and returns the oldest entry.
    pub(crate) fn pop_front(&mut self) -> Option<DedupEntry> {
        if self.len == 0 {
            return None;
        }
        let e = self.entry(0);
        self.unindex(number_slot(self.first), e.hash);
        if e.message_id.is_some() {
            self.other_ids.remove(&e.seq);
        }
        if !self.wide.is_empty() {
            self.wide.remove(&self.first);
        }
        self.head += 1;
        self.first += 1;
        self.len -= 1;
        if self.len == 0 {
            // Nothing left: give the memory back (an idle partition holds none).
            self.chunks = VecDeque::new();
            self.head = 0;
            self.index = Vec::new();
        } else {
            if self.head == CHUNK {
                self.chunks.pop_front();
                self.head = 0;
            }
            if self.index.len() > INDEX_MIN && self.len * 8 < self.index.len() {
                self.rebuild_index(self.index.len() / 2);
            }
        }
        Some(e)
    }

    /// The entries, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = DedupEntry> + '_ {
        (0..self.len).map(|pos| self.entry(pos))
    }

    /// The entry `pos` places after the oldest.
    fn entry(&self, pos: usize) -> DedupEntry {
        let (seq, expires_ms, offset) = self.values(pos);
        DedupEntry {
            hash: join(self.slot(pos).hash),
            seq,
            expires_ms,
            offset,
            message_id: if self.other_ids.is_empty() {
                None
            } else {
                self.other_ids.get(&seq).copied()
            },
        }
    }

    /// (seq, expires_ms, offset) of the entry `pos` places after the oldest.
    fn values(&self, pos: usize) -> (u64, u64, u64) {
        let p = self.head + pos;
        let c = &self.chunks[p / CHUNK];
        let s = &c.slots[p % CHUNK];
        if s.seq == WIDE {
            return self.wide[&(self.first + pos as u64)];
        }
        (
            c.seq + u64::from(s.seq),
            c.expires_ms + u64::from(s.expires),
            c.offset + u64::from(s.offset),
        )
    }

    /// The slot of the entry `pos` places after the oldest.
    fn slot(&self, pos: usize) -> &Slot {
        let p = self.head + pos;
        &self.chunks[p / CHUNK].slots[p % CHUNK]
    }

    /// Where an index slot's entry is, counted from the oldest.
    fn pos_of(&self, slot: u32) -> usize {
        ((slot & NUMBER_MASK).wrapping_sub(self.first as u32 & NUMBER_MASK) & NUMBER_MASK) as usize
    }

    /// The index slot where `hash`'s probe run starts: a folded multiply of the hash's two
    /// halves, each mixed with the per-process seed (as foldhash does), so that which keys
    /// share a run cannot be known from outside the process.
    fn home(&self, hash: [u16; 6]) -> usize {
        let h = join(hash);
        let lo = (h as u64) ^ self.seed[0];
        let hi = ((h >> 64) as u64) ^ self.seed[1];
        let m = u128::from(lo) * u128::from(hi);
        ((m as u64) ^ ((m >> 64) as u64)) as usize & (self.index.len() - 1)
    }

    /// `Ok((index slot, position))` of `hash`'s entry, or `Err(the empty slot where it would
    /// go)`. The index must not be empty unless the table is.
    fn find(&self, hash: u128) -> Result<(usize, usize), usize> {
        if self.index.is_empty() {
            return Err(0);
        }
        let mask = self.index.len() - 1;
        let want = split(hash);
        let mut i = self.home(want);
        loop {
            let v = self.index[i];
            if v == 0 {
                return Err(i);
            }
            let pos = self.pos_of(v);
            if self.slot(pos).hash == want {
                return Ok((i, pos));
            }
            i = (i + 1) & mask;
        }
    }

    /// Removes index slot value `v` (whose entry has `hash` and is still stored), shifting the
    /// probe run after it back so that no lookup stops early.
    fn unindex(&mut self, v: u32, hash: u128) {
        let mask = self.index.len() - 1;
        let mut i = self.home(split(hash));
        while self.index[i] != v {
            i = (i + 1) & mask;
        }
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let w = self.index[j];
            if w == 0 {
                self.index[i] = 0;
                return;
            }
            let k = self.home(self.slot(self.pos_of(w)).hash);
            // The entry at j stays if its home lies cyclically in (i, j].
            let stays = if i <= j {
                i < k && k <= j
            } else {
                i < k || k <= j
            };
            if !stays {
                self.index[i] = w;
                i = j;
            }
        }
    }

    fn rebuild_index(&mut self, slots: usize) {
        debug_assert!(slots.is_power_of_two() && self.len * 4 <= slots * 3);
        self.index = vec![0; slots];
        let mask = slots - 1;
        for pos in 0..self.len {
            let mut i = self.home(self.slot(pos).hash);
            while self.index[i] != 0 {
                i = (i + 1) & mask;
            }
            self.index[i] = number_slot(self.first + pos as u64);
        }
    }
}

fn number_slot(n: u64) -> u32 {
    OCCUPIED | (n as u32 & NUMBER_MASK)
}

fn split(h: u128) -> [u16; 6] {
    std::array::from_fn(|i| (h >> (16 * i)) as u16)
}

fn join(h: [u16; 6]) -> u128 {
    h.iter()
        .enumerate()
        .fold(0, |acc, (i, &p)| acc | (u128::from(p) << (16 * i)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(i: u64) -> DedupEntry {
        DedupEntry {
            hash: (u128::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835) ^ 7)
                & KEY_HASH_MASK,
            seq: 10 + 3 * i,
            expires_ms: 1_000 + i / 4,
            offset: 100 + 2 * i,
            message_id: (i % 97 == 5).then_some(MessageId([i as u8; 16])),
        }
    }

    /// Every live entry is found and every other is not, and iteration is insertion order.
    fn check(t: &DedupTable, live: std::ops::Range<u64>, gone: std::ops::Range<u64>) {
        assert_eq!(t.len(), live.clone().count());
        for i in live.clone() {
            assert_eq!(t.get(entry(i).hash), Some(entry(i)), "entry {i}");
        }
        for i in gone {
            assert_eq!(t.get(entry(i).hash), None, "expired entry {i}");
        }
        let all: Vec<DedupEntry> = t.iter().collect();
        let want: Vec<DedupEntry> = live.map(entry).collect();
        assert_eq!(all, want);
    }

    #[test]
    fn the_table_finds_its_entries_and_expires_them_oldest_first() {
        let mut t = DedupTable::new();
        assert_eq!(t.front(), None);
        // Across several chunks and index sizes; lookups after every growth and shrink.
        let n = 3 * CHUNK as u64 + 17;
        for i in 0..n {
            assert!(t.insert(entry(i)), "insert {i}");
            if i % 500 == 0 {
                check(&t, 0..i + 1, i + 1..i + 2);
            }
        }
        check(&t, 0..n, n..n + 100);
        // A key already there is refused and changes nothing.
        let mut again = entry(40);
        again.seq = 99_999;
        assert!(!t.insert(again));
        check(&t, 0..n, 0..0);
        // Expiry takes the oldest first, and the rest stay reachable (backward shifts).
        for i in 0..n - 5 {
            assert_eq!(t.front_expires_ms(), Some(entry(i).expires_ms));
            assert_eq!(t.pop_front(), Some(entry(i)), "pop {i}");
            if i % 300 == 0 {
                check(&t, i + 1..n, 0..i + 1);
            }
        }
        check(&t, n - 5..n, 0..n - 5);
        // New entries after old ones expired (insertion numbers keep counting).
        for i in n..n + 2000 {
            assert!(t.insert(entry(i)));
        }
        check(&t, n - 5..n + 2000, 0..n - 5);
        while t.pop_front().is_some() {}
        assert!(t.len() == 0 && t.index.is_empty() && t.chunks.is_empty());
        assert!(t.other_ids.is_empty(), "side ids leave with their entries");
        assert!(t.insert(entry(1)));
        check(&t, 1..2, 0..1);
    }

    #[test]
    fn insertion_numbers_wrap_around_the_index_width() {
        let mut t = DedupTable::new();
        t.first = u64::from(NUMBER_MASK) - 300;
        for i in 0..1000 {
            assert!(t.insert(entry(i)));
        }
        for i in 0..400 {
            assert_eq!(t.pop_front(), Some(entry(i)));
        }
        check(&t, 400..1000, 0..400);
    }

    #[test]
    fn a_colliding_probe_run_survives_deletions() {
        // Hashes that share their home slot whatever the index seed would be cannot be made;
        // a full-ish small index gives long runs instead.
        let mut t = DedupTable::new();
        for i in 0..12 {
            assert!(t.insert(entry(i)));
        }
        assert_eq!(t.index.len(), INDEX_MIN);
        for i in 0..6 {
            t.pop_front();
            for j in 12 + i..13 + i {
                assert!(t.insert(entry(j)));
            }
            check(&t, i + 1..13 + i, 0..i + 1);
        }
    }

    #[test]
    fn values_too_far_from_their_chunks_first_are_kept_whole() {
        let mut t = DedupTable::new();
        // Sequence numbers, times and offsets that jump by more than 32 bits within a chunk,
        // a time that goes back, and one difference equal to the marker itself.
        let mut live = Vec::new();
        for i in 0..(2 * CHUNK as u64 + 9) {
            let mut e = entry(i);
            match i % 7 {
                1 => e.seq += 1 << 33,
                2 => e.offset += 1 << 40,
                3 => e.expires_ms += 1 << 35,
                _ => {}
            }
            // Keep sequence numbers growing, as the partition's do.
            e.seq += (i / 7) << 34;
            if i == 5 {
                e.expires_ms = 0;
            }
            if i == CHUNK as u64 + 1 {
                e.seq = t.chunks.back().unwrap().seq + u64::from(WIDE);
            }
            assert!(t.insert(e));
            live.push(e);
        }
        assert!(!t.wide.is_empty());
        for e in &live {
            assert_eq!(t.get(e.hash), Some(*e));
        }
        assert_eq!(t.iter().collect::<Vec<_>>(), live);
        for e in &live {
            assert_eq!(t.front_expires_ms(), Some(e.expires_ms));
            assert_eq!(t.pop_front(), Some(*e));
        }
        assert!(t.wide.is_empty(), "wide values leave with their entries");
    }

    #[test]
    fn hash_bits_above_the_kept_ones_are_ignored() {
        let mut t = DedupTable::new();
        assert!(t.insert(entry(3)));
        let high = entry(3).hash | (0xdead_beef_u128 << KEY_HASH_BITS);
        assert_eq!(t.get(high), Some(entry(3)));
        assert_eq!(
            key_hash(b"id-1"),
            xxhash_rust::xxh3::xxh3_128(b"id-1") & KEY_HASH_MASK
        );
    }

    #[test]
    fn a_reserved_index_is_not_rebuilt_by_the_inserts_it_was_sized_for() {
        let mut t = DedupTable::new();
        t.reserve(5_000);
        let slots = t.index.len();
        assert!(5_000 * 4 <= slots * 3);
        for i in 0..2_500 {
            assert!(t.insert(entry(i)));
        }
        for i in 2_500..5_000 {
            assert!(t.insert_restored(entry(i)));
        }
        assert_eq!(t.index.len(), slots);
        check(&t, 0..5_000, 5_000..5_010);
        // Past what was reserved, restored entries still grow the index.
        for i in 5_000..20_000 {
            assert!(t.insert_restored(entry(i)));
        }
        check(&t, 0..20_000, 20_000..20_010);
    }

    #[test]
    fn a_slot_is_18_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 18);
    }
}
