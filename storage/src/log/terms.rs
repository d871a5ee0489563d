//! Terms along the log, for a Raft owner (the partition log is the Raft log; each batch header
//! carries the term of the leader that made it): the last batch's term, restored at open and
//! after a truncation, and the first offset of each term.
//!
//! Terms never decrease along a log (a leader stamps its own, higher term; a follower's
//! `stage_replicated` refuses a lower one), so the first offset of each term is found by binary
//! search over batch headers: a few batch reads per term, bounded by the number of terms times
//! the log of the number of offsets — not a scan of the log. Nothing is kept on disk beside the
//! segments, so nothing can disagree with them after a crash or a truncation.

use super::Log;
use crate::error::{Result, StorageError};
use crate::fs::Fs;
use crate::BatchHeader;

impl<F: Fs> Log<F> {
    /// Sets the log's last term (and raises its stamping term to it) from its last durable
    /// batch. An empty log has last term 0: it holds no batch a replicated one must follow.
    pub(super) async fn restore_last_term(&self) -> Result<()> {
        let (start, end) = (self.start_offset(), self.end_offset());
        if end == start {
            self.inner.borrow_mut().last_term = 0;
            return Ok(());
        }
        let h = self.header_at(end - 1).await?;
        let mut i = self.inner.borrow_mut();
        i.last_term = h.term;
        i.term = i.term.max(h.term);
        Ok(())
    }

    /// The header of the durable batch covering `offset` (which must lie in the log).
    pub async fn header_at(&self, offset: u64) -> Result<BatchHeader> {
        let batches = self.read(offset, 1).await?;
        batches
            .first()
            .filter(|b| b.header.base_offset <= offset && offset <= b.header.last_offset())
            .map(|b| b.header)
            .ok_or(StorageError::OffsetOutOfRange {
                offset,
                start: self.start_offset(),
                end: self.end_offset(),
            })
    }

    /// `(term, first offset)` of each term in the durable log, ascending: Raft's term starts
    /// (Kafka's leader-epoch checkpoint), derived from the batch headers. The first pair names
    /// the log's first batch. Costs about `log2(offsets)` batch reads per term. Call it when no
    /// truncation runs (at open, before the owner starts appending).
    pub async fn term_starts(&self) -> Result<Vec<(u64, u64)>> {
        let (start, end) = (self.start_offset(), self.end_offset());
        let mut out = Vec::new();
        if start == end {
            return Ok(out);
        }
        let last_term = self.header_at(end - 1).await?.term;
        let mut at = start;
        loop {
            let h = self.header_at(at).await?;
            let term = h.term;
            out.push((term, h.base_offset));
            if term >= last_term {
                return Ok(out);
            }
            // The first batch boundary in [lo, end) whose batch has a term above `term` (one
            // exists: the last batch's does). Invariant: `lo` is a batch boundary, the batch
            // before it has `term`, and every batch from `hi` on has a higher term.
            let (mut lo, mut hi) = (h.next_offset(), end);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                let m = self.header_at(mid).await?;
                if m.term < term {
                    return Err(self.corruption(
                        self.dir.clone(),
                        m.base_offset,
                        format!(
                            "batch at offset {} has term {} below the earlier term {term}",
                            m.base_offset, m.term
                        ),
                    ));
                }
                if m.term > term {
                    hi = m.base_offset;
                } else {
                    lo = m.next_offset();
                }
            }
            at = lo;
        }
    }
}
