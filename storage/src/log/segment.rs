//! Segment files and their in-memory state: names, creation (pre-zeroed), the roll that seals
//! the active segment, the `.index`/`.timeindex` files, and the indexes of sealed segments
//! (loaded through a bounded cache, rebuilt from the log if missing or damaged).

use super::commit::{write_all, zero_fill};
use super::{Inner, Log};
use crate::error::{Result, StorageError};
use crate::fs::{align_down, align_up, File, Fs};
use crate::index::{OffsetEntry, OffsetIndex, TimeEntry, TimeIndex};
use std::rc::Rc;

pub fn segment_file_name(base: u64, ext: &str) -> String {
    format!("{base:020}.{ext}")
}

pub(super) fn parse_segment_name(name: &str) -> Option<(u64, &str)> {
    let (stem, ext) = name.split_once('.')?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stem.parse().ok()?, ext))
}

/// One segment: what every segment has, and — for the active one, the last, which commits
/// write to — the state of writing it. Sealing a segment drops that state: a sealed segment
/// is read-only, its indexes live in their files and the index cache.
pub(super) struct Segment<F: Fs> {
    pub(super) base: u64,
    pub(super) file: Rc<F::File>,
    /// Bytes of durable, verified batches.
    pub(super) size: u64,
    pub(super) next_offset: u64,
    pub(super) first_ts: Option<i64>,
    pub(super) max_ts: Option<i64>,
    /// `Some` while this is the active segment; `None` once sealed.
    pub(super) active: Option<ActiveSegment>,
}

/// The state of the segment commits write to.
pub(super) struct ActiveSegment {
    /// In-memory indexes (a sealed segment's are loaded through the cache).
    pub(super) index: OffsetIndex,
    pub(super) timeindex: TimeIndex,
    pub(super) bytes_since_index: u64,
    pub(super) index_persisted_entries: usize,
    /// Bytes `[align_down(size), size)`, rewritten with each commit.
    pub(super) tail: Vec<u8>,
    /// Zeroed (pre-allocated) space ends here.
    pub(super) zeroed_until: u64,
    /// Where the last commit started writes to (`size` when none is in flight); a commit
    /// started beside others writes from the next block boundary after it.
    pub(super) write_end: u64,
    /// Where a zero-ahead write in flight starts (`u64::MAX` if none). No commit may write
    /// data there until it lands.
    pub(super) zeroing_from: u64,
}

impl<F: Fs> Segment<F> {
    pub(super) fn is_sealed(&self) -> bool {
        self.active.is_none()
    }

    /// The writing state of the active segment (callers hold the active one).
    pub(super) fn active(&self) -> &ActiveSegment {
        self.active.as_ref().expect("the active segment")
    }

    pub(super) fn active_mut(&mut self) -> &mut ActiveSegment {
        self.active.as_mut().expect("the active segment")
    }
}

pub(super) struct SealedIndexes {
    pub(super) index: OffsetIndex,
    pub(super) timeindex: TimeIndex,
}

pub(super) fn insert_index_cache<F: Fs>(
    i: &mut Inner<F>,
    base: u64,
    ix: Rc<SealedIndexes>,
    max: usize,
) {
    i.index_cache.retain(|(b, _)| *b != base);
    i.index_cache.push_back((base, ix));
    i.index_cache_bytes = i
        .index_cache
        .iter()
        .map(|(_, x)| x.index.bytes().len() + x.timeindex.bytes().len())
        .sum();
    while i.index_cache_bytes > max && i.index_cache.len() > 1 {
        if let Some((_, x)) = i.index_cache.pop_front() {
            i.index_cache_bytes -= x.index.bytes().len() + x.timeindex.bytes().len();
        }
    }
}

/// Whether `bytes` (read from `pos` on, no batch parsed there) start with the zeros a commit
/// started beside another left before the next block boundary: a gap that readers skip.
pub(super) fn is_gap(bytes: &[u8], pos: u64) -> bool {
    let gap = (align_up(pos) - pos) as usize;
    gap > 0 && bytes.len() >= gap && bytes[..gap].iter().all(|b| *b == 0)
}

impl<F: Fs> Log<F> {
    /// Creates an empty segment durably: file, zero-filled first space (small:
    /// [`crate::LogConfig::segment_initial_bytes`]; commits zero further ahead as data comes), directory
    /// entry.
    pub(super) async fn create_segment(&self, base: u64) -> Result<()> {
        let path = self.path(base, "log");
        let file = self
            .fs
            .open(&path, true)
            .await
            .map_err(|e| StorageError::io("create", &path, e))?;
        let zeroed = self.config.segment_initial_bytes();
        zero_fill(&file, 0, zeroed)
            .await
            .map_err(|e| StorageError::io("zero_fill", &path, e))?;
        file.truncate(zeroed)
            .await
            .map_err(|e| StorageError::io("truncate", &path, e))?;
        file.sync_data()
            .await
            .map_err(|e| StorageError::io("fdatasync", &path, e))?;
        self.fs
            .sync_dir(&self.dir)
            .await
            .map_err(|e| StorageError::io("sync_dir", &self.dir, e))?;
        let mut inner = self.inner.borrow_mut();
        inner.stats.fsyncs += 2;
        inner.segments.insert(
            base,
            Segment {
                base,
                file: Rc::new(file),
                size: 0,
                next_offset: base,
                first_ts: None,
                max_ts: None,
                active: Some(ActiveSegment {
                    index: OffsetIndex::default(),
                    timeindex: TimeIndex::default(),
                    bytes_since_index: 0,
                    index_persisted_entries: 0,
                    tail: Vec::new(),
                    zeroed_until: zeroed,
                    write_end: 0,
                    zeroing_from: u64::MAX,
                }),
            },
        );
        Ok(())
    }

    /// Seals the active segment (exact size, index files, all durable) and creates the next.
    pub(super) async fn roll(&self, new_base: u64) -> Result<()> {
        let (old_base, file, size, index_bytes, timeindex) = {
            let mut i = self.inner.borrow_mut();
            let (&b, s) = i.segments.iter_mut().next_back().expect("active segment");
            let (max_ts, first_ts, next_offset) = (s.max_ts, s.first_ts, s.next_offset);
            let a = s.active_mut();
            if let (Some(m), Some(_)) = (max_ts, first_ts) {
                let rel = u32::try_from(next_offset - 1 - b).expect("segment offsets fit u32");
                a.timeindex.push(TimeEntry {
                    max_timestamp_ms: m,
                    rel_offset: rel,
                });
            }
            let (index_bytes, timeindex) = (a.index.bytes().to_vec(), a.timeindex.clone());
            (b, s.file.clone(), s.size, index_bytes, timeindex)
        };
        let path = self.path(old_base, "log");
        file.truncate(size)
            .await
            .map_err(|e| StorageError::io("truncate", &path, e))?;
        file.sync_data()
            .await
            .map_err(|e| StorageError::io("fdatasync", &path, e))?;
        if let Some(a) = self
            .inner
            .borrow_mut()
            .segments
            .get_mut(&old_base)
            .and_then(|s| s.active.as_mut())
        {
            a.zeroed_until = size;
        }
        self.write_index_file(old_base, "index", &index_bytes, 0, true)
            .await?;
        self.write_index_file(old_base, "timeindex", timeindex.bytes(), 0, true)
            .await?;
        if let Err(e) = self.create_segment(new_base).await {
            // The old segment stays active; a half-created successor must not survive a crash,
            // or recovery would end the old segment at `new_base`.
            let p = self.path(new_base, "log");
            if self.fs.exists(&p).await {
                let cleaned = async {
                    self.fs.remove(&p).await?;
                    self.fs.sync_dir(&self.dir).await
                }
                .await;
                if cleaned.is_err() {
                    self.inner.borrow_mut().poisoned = true;
                }
            }
            return Err(e);
        }
        let mut i = self.inner.borrow_mut();
        let s = i.segments.get_mut(&old_base).expect("old segment");
        // Sealed: the writing state goes, its indexes to the cache.
        let ActiveSegment {
            index, timeindex, ..
        } = s.active.take().expect("the old segment was the active one");
        i.stats.fsyncs += 3;
        insert_index_cache(
            &mut i,
            old_base,
            Rc::new(SealedIndexes { index, timeindex }),
            self.config.index_cache_bytes_max,
        );
        Ok(())
    }

    /// Writes `bytes[from..]` of an index file (whole blocks from `align_down(from)`).
    pub(super) async fn write_index_file(
        &self,
        base: u64,
        ext: &str,
        bytes: &[u8],
        from: usize,
        sync: bool,
    ) -> Result<()> {
        let path = self.path(base, ext);
        let f = self
            .fs
            .open(&path, true)
            .await
            .map_err(|e| StorageError::io("open", &path, e))?;
        let start = align_down(from as u64) as usize;
        let mut buf = bytes[start..].to_vec();
        buf.resize(align_up(buf.len() as u64) as usize, 0);
        if !buf.is_empty() {
            write_all(&f, start as u64, &buf)
                .await
                .map_err(|e| StorageError::io("write", &path, e))?;
        }
        if sync {
            f.sync_data()
                .await
                .map_err(|e| StorageError::io("fdatasync", &path, e))?;
        }
        Ok(())
    }

    pub(super) async fn read_whole(&self, base: u64, ext: &str) -> Vec<u8> {
        // Indexes are hints: an unreadable one is treated as missing and rebuilt.
        let Ok(f) = self.fs.open(&self.path(base, ext), false).await else {
            return Vec::new();
        };
        let Ok(size) = f.size().await else {
            return Vec::new();
        };
        f.read_at(0, size as usize)
            .await
            .map(|b| b.to_vec())
            .unwrap_or_default()
    }

    /// The indexes of a sealed segment, from the cache or its files (rebuilt if missing).
    pub(super) async fn sealed_indexes(&self, base: u64) -> Result<Rc<SealedIndexes>> {
        {
            let mut i = self.inner.borrow_mut();
            if let Some(at) = i.index_cache.iter().position(|(b, _)| *b == base) {
                let e = i.index_cache.remove(at).expect("found");
                let ix = e.1.clone();
                i.index_cache.push_back(e);
                return Ok(ix);
            }
        }
        let size = self
            .inner
            .borrow()
            .segments
            .get(&base)
            .map_or(0, |s| s.size);
        let index = OffsetIndex::parse(&self.read_whole(base, "index").await);
        let timeindex = TimeIndex::parse(&self.read_whole(base, "timeindex").await);
        let usable = index.last().is_none_or(|e| u64::from(e.position) < size)
            && (size == 0 || !timeindex.is_empty());
        let ix = if usable {
            SealedIndexes { index, timeindex }
        } else {
            tracing::warn!(
                segment = base,
                "rebuilding a missing or damaged segment index"
            );
            let ix = self.rebuild_indexes(base).await?;
            self.write_index_file(base, "index", ix.index.bytes(), 0, true)
                .await?;
            self.write_index_file(base, "timeindex", ix.timeindex.bytes(), 0, true)
                .await?;
            ix
        };
        let ix = Rc::new(ix);
        insert_index_cache(
            &mut self.inner.borrow_mut(),
            base,
            ix.clone(),
            self.config.index_cache_bytes_max,
        );
        Ok(ix)
    }

    pub(super) async fn rebuild_indexes(&self, base: u64) -> Result<SealedIndexes> {
        let mut index = OffsetIndex::default();
        let mut timeindex = TimeIndex::default();
        let mut since = 0u64;
        let mut max_ts: Option<i64> = None;
        let mut last_rel = 0u32;
        let interval = self.config.index_interval_bytes;
        self.scan(base, 0, base, |pos, b| {
            let h = b.header;
            let rel = (h.base_offset - base) as u32;
            let m = max_ts.map_or(h.max_timestamp_ms, |m| m.max(h.max_timestamp_ms));
            if since >= interval {
                index.push(OffsetEntry {
                    rel_offset: rel,
                    position: pos as u32,
                });
                timeindex.push(TimeEntry {
                    max_timestamp_ms: m,
                    rel_offset: rel,
                });
                since = 0;
            }
            max_ts = Some(m);
            since += u64::from(h.batch_len);
            last_rel = (h.last_offset() - base) as u32;
            true
        })
        .await?;
        if let Some(m) = max_ts {
            timeindex.push(TimeEntry {
                max_timestamp_ms: m,
                rel_offset: last_rel,
            });
        }
        Ok(SealedIndexes { index, timeindex })
    }
}
