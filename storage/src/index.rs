//! Sparse offset index and time index of a segment.
//!
//! ```text
//! .index      entries of 8 bytes:  u32 relative_offset | u32 position          (little-endian)
//! .timeindex  entries of 12 bytes: i64 max_timestamp_ms | u32 relative_offset
//! ```
//! Both are written in whole 4 KiB blocks (O_DIRECT), so a file may end in zero padding: parsing
//! stops at the first entry that does not strictly advance (the zero padding never does, except
//! as a first entry `(0, 0)`, which is valid). Indexes are hints derived from the log: every
//! position found through one is checked against the batch it points to before use, and a missing
//! or damaged index is rebuilt by scanning the segment.

pub const OFFSET_ENTRY_BYTES: usize = 8;
pub const TIME_ENTRY_BYTES: usize = 12;

/// An offset index entry: the batch holding `base + rel_offset` starts at `position`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetEntry {
    pub rel_offset: u32,
    pub position: u32,
}

/// A time index entry: every record up to and including the batch at `base + rel_offset` has a
/// timestamp <= `max_timestamp_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeEntry {
    pub max_timestamp_ms: i64,
    pub rel_offset: u32,
}

/// Entries kept in their on-disk encoding (searched in place, written as they are).
#[derive(Debug, Clone, Default)]
pub struct OffsetIndex {
    bytes: Vec<u8>,
}

impl OffsetIndex {
    /// Parses a file's bytes, keeping the longest valid prefix of strictly advancing entries.
    pub fn parse(file: &[u8]) -> OffsetIndex {
        let mut out = OffsetIndex::default();
        for c in file.chunks_exact(OFFSET_ENTRY_BYTES) {
            let e = OffsetEntry {
                rel_offset: u32::from_le_bytes(c[0..4].try_into().expect("4")),
                position: u32::from_le_bytes(c[4..8].try_into().expect("4")),
            };
            if let Some(last) = out.last() {
                if e.rel_offset <= last.rel_offset || e.position <= last.position {
                    break;
                }
            }
            out.bytes.extend_from_slice(c);
        }
        out
    }

    pub fn len(&self) -> usize {
        self.bytes.len() / OFFSET_ENTRY_BYTES
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn get(&self, i: usize) -> OffsetEntry {
        let c = &self.bytes[i * OFFSET_ENTRY_BYTES..(i + 1) * OFFSET_ENTRY_BYTES];
        OffsetEntry {
            rel_offset: u32::from_le_bytes(c[0..4].try_into().expect("4")),
            position: u32::from_le_bytes(c[4..8].try_into().expect("4")),
        }
    }

    pub fn last(&self) -> Option<OffsetEntry> {
        (!self.is_empty()).then(|| self.get(self.len() - 1))
    }

    /// Appends an entry; it must advance both fields (checked: a violation is a logic bug).
    pub fn push(&mut self, e: OffsetEntry) {
        if let Some(last) = self.last() {
            assert!(
                e.rel_offset > last.rel_offset && e.position > last.position,
                "offset index must advance: {last:?} then {e:?}"
            );
        }
        self.bytes.extend_from_slice(&e.rel_offset.to_le_bytes());
        self.bytes.extend_from_slice(&e.position.to_le_bytes());
    }

    /// Drops entries from index `n` on.
    pub fn truncate_entries(&mut self, n: usize) {
        self.bytes.truncate(n * OFFSET_ENTRY_BYTES);
    }

    /// The last entry with `rel_offset <= rel`, if any.
    pub fn floor(&self, rel: u32) -> Option<OffsetEntry> {
        let n = self.len();
        // partition point: first index whose rel_offset > rel
        let (mut lo, mut hi) = (0, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.get(mid).rel_offset <= rel {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.checked_sub(1).map(|i| self.get(i))
    }
}

#[derive(Debug, Clone, Default)]
pub struct TimeIndex {
    bytes: Vec<u8>,
}

impl TimeIndex {
    pub fn parse(file: &[u8]) -> TimeIndex {
        let mut out = TimeIndex::default();
        for c in file.chunks_exact(TIME_ENTRY_BYTES) {
            let e = decode_time(c);
            if let Some(last) = out.last() {
                if e.rel_offset <= last.rel_offset || e.max_timestamp_ms < last.max_timestamp_ms {
                    break;
                }
            } else if e.max_timestamp_ms == 0 && e.rel_offset == 0 && c.iter().all(|b| *b == 0) {
                // A zero first entry is padding, not a timestamp of 1970.
                break;
            }
            out.bytes.extend_from_slice(c);
        }
        out
    }

    pub fn len(&self) -> usize {
        self.bytes.len() / TIME_ENTRY_BYTES
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn get(&self, i: usize) -> TimeEntry {
        decode_time(&self.bytes[i * TIME_ENTRY_BYTES..(i + 1) * TIME_ENTRY_BYTES])
    }

    pub fn last(&self) -> Option<TimeEntry> {
        (!self.is_empty()).then(|| self.get(self.len() - 1))
    }

    /// Appends an entry if it advances the offset and does not go back in time.
    pub fn push(&mut self, e: TimeEntry) -> bool {
        if let Some(last) = self.last() {
            if e.rel_offset <= last.rel_offset || e.max_timestamp_ms <= last.max_timestamp_ms {
                return false;
            }
        }
        self.bytes
            .extend_from_slice(&e.max_timestamp_ms.to_le_bytes());
        self.bytes.extend_from_slice(&e.rel_offset.to_le_bytes());
        true
    }

    pub fn truncate_entries(&mut self, n: usize) {
        self.bytes.truncate(n * TIME_ENTRY_BYTES);
    }

    /// The last entry whose `max_timestamp_ms < ts`: every record up to it is older than `ts`.
    pub fn last_before(&self, ts: i64) -> Option<TimeEntry> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.get(mid).max_timestamp_ms < ts {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.checked_sub(1).map(|i| self.get(i))
    }
}

fn decode_time(c: &[u8]) -> TimeEntry {
    TimeEntry {
        max_timestamp_ms: i64::from_le_bytes(c[0..8].try_into().expect("8")),
        rel_offset: u32::from_le_bytes(c[8..12].try_into().expect("4")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_and_padding() {
        let mut ix = OffsetIndex::default();
        ix.push(OffsetEntry {
            rel_offset: 0,
            position: 0,
        });
        ix.push(OffsetEntry {
            rel_offset: 10,
            position: 4100,
        });
        ix.push(OffsetEntry {
            rel_offset: 20,
            position: 8200,
        });
        let mut file = ix.bytes().to_vec();
        file.resize(4096, 0);
        let back = OffsetIndex::parse(&file);
        assert_eq!(back.len(), 3);
        assert_eq!(back.floor(0).map(|e| e.position), Some(0));
        assert_eq!(back.floor(15).map(|e| e.position), Some(4100));
        assert_eq!(back.floor(99).map(|e| e.position), Some(8200));
    }

    #[test]
    fn damaged_entry_cuts_the_index() {
        let mut ix = OffsetIndex::default();
        for i in 1..10u32 {
            ix.push(OffsetEntry {
                rel_offset: i * 5,
                position: i * 5000,
            });
        }
        let mut file = ix.bytes().to_vec();
        file[5 * 8] = 0xFF; // entry 5 now jumps back in position order? no: rel offset huge
        file[5 * 8 + 1] = 0xFF;
        let back = OffsetIndex::parse(&file);
        assert!(back.len() <= 6);
    }

    #[test]
    fn time_lookup() {
        let mut t = TimeIndex::default();
        assert!(t.push(TimeEntry {
            max_timestamp_ms: 100,
            rel_offset: 0
        }));
        assert!(t.push(TimeEntry {
            max_timestamp_ms: 200,
            rel_offset: 10
        }));
        assert!(!t.push(TimeEntry {
            max_timestamp_ms: 150,
            rel_offset: 20
        }));
        assert!(t.push(TimeEntry {
            max_timestamp_ms: 300,
            rel_offset: 20
        }));
        assert_eq!(t.last_before(100), None);
        assert_eq!(t.last_before(201).map(|e| e.rel_offset), Some(10));
        let mut f = t.bytes().to_vec();
        f.resize(4096, 0);
        assert_eq!(TimeIndex::parse(&f).len(), 3);
        assert_eq!(TimeIndex::parse(&[0u8; 4096]).len(), 0);
    }
}
