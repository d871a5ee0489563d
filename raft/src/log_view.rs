//! `LogView`: what the core knows of a log it does not store — its bounds, the first offset of
//! each term (enough to answer "term at offset" for the consistency check and elections), and a
//! bounded cache of recent entries the leader can send without asking the log owner to read.

use crate::types::{Entry, Offset, Term};
use std::collections::VecDeque;

#[derive(Debug)]
pub(crate) struct LogView {
    /// First offset held in the log; below it lies a snapshot.
    pub start: Offset,
    /// Term of the entry that ends at `start` (the snapshot's term).
    pub start_term: Term,
    /// The offset after the last entry the core has asked to append.
    pub end: Offset,
    /// (term, first offset) of each term in `[start, end)`, ascending in both.
    terms: Vec<(Term, Offset)>,
    cache: VecDeque<Entry>,
    cache_bytes: usize,
}

impl LogView {
    pub fn new(start: Offset, start_term: Term) -> Self {
        LogView {
            start,
            start_term,
            end: start,
            terms: Vec::new(),
            cache: VecDeque::new(),
            cache_bytes: 0,
        }
    }

    /// Rebuilds from recovery's term checkpoint. Terms must ascend and lie in `[start, end)`.
    pub fn restore(
        start: Offset,
        start_term: Term,
        end: Offset,
        term_starts: &[(Term, Offset)],
    ) -> Option<Self> {
        let mut v = LogView::new(start, start_term);
        let mut last = (start_term, start);
        for &(t, o) in term_starts {
            if t < last.0 || o < last.1 || o >= end || o < start {
                return None;
            }
            if t > last.0 {
                v.terms.push((t, o));
                last = (t, o);
            }
        }
        v.end = end;
        Some(v)
    }

    /// Term of the entry covering `offset`, if the log holds it.
    pub fn term_at(&self, offset: Offset) -> Option<Term> {
        if offset < self.start || offset >= self.end {
            return None;
        }
        // The last term starting at or before `offset`; the start term if none.
        let i = self.terms.partition_point(|&(_, o)| o <= offset);
        Some(if i == 0 {
            self.start_term
        } else {
            self.terms[i - 1].0
        })
    }

    /// Term of the entry that ends at (or covers) `offset - 1`: the "prev term" of a position.
    /// `start_term` at `start`; `None` outside `[start, end]`.
    pub fn term_before(&self, offset: Offset) -> Option<Term> {
        if offset == self.start {
            return Some(self.start_term);
        }
        self.term_at(offset.checked_sub(1)?)
    }

    pub fn last_term(&self) -> Term {
        self.terms.last().map_or(self.start_term, |&(t, _)| t)
    }

    /// First offset of the run of `term` that covers `offset - 1` (where a follower that rejected
    /// a prev at `offset` asks the leader to retry from, skipping a whole conflicting term).
    pub fn term_run_start(&self, offset: Offset) -> Offset {
        let i = self.terms.partition_point(|&(_, o)| o < offset);
        if i == 0 {
            self.start
        } else {
            self.terms[i - 1].1
        }
    }

    /// Records an entry the core has asked the owner to append. `cache`: keep its bytes to send.
    pub fn append(&mut self, e: &Entry, cache: bool, max_cache_bytes: usize) {
        debug_assert_eq!(e.offset, self.end, "append must be contiguous");
        if e.term != self.last_term() {
            debug_assert!(e.term > self.last_term(), "terms only grow along the log");
            self.terms.push((e.term, e.offset));
        }
        self.end = e.end();
        if cache {
            if self.cache.back().is_some_and(|b| b.end() != e.offset) {
                self.clear_cache();
            }
            self.cache_bytes += e.data.len();
            self.cache.push_back(e.clone());
            while self.cache_bytes > max_cache_bytes && self.cache.len() > 1 {
                self.pop_cache_front();
            }
        }
    }

    /// Drops every entry at or after `to`.
    pub fn truncate(&mut self, to: Offset) {
        debug_assert!(to >= self.start && to <= self.end);
        while self.terms.last().is_some_and(|&(_, o)| o >= to) {
            self.terms.pop();
        }
        while self.cache.back().is_some_and(|e| e.end() > to) {
            let e = self.cache.pop_back().expect("checked non-empty");
            self.cache_bytes -= e.data.len();
        }
        self.end = to;
    }

    /// Forgets everything below `to` (a snapshot now stands there). `to <= end`.
    pub fn compact(&mut self, to: Offset) {
        debug_assert!(to >= self.start && to <= self.end);
        let term = self.term_before(to).expect("to within the log");
        self.terms.retain(|&(_, o)| o >= to);
        self.start = to;
        self.start_term = term;
        while self.cache.front().is_some_and(|e| e.offset < to) {
            self.pop_cache_front();
        }
    }

    /// Replaces the whole log by a snapshot at `offset`.
    pub fn reset(&mut self, offset: Offset, term: Term) {
        *self = LogView::new(offset, term);
    }

    pub fn clear_cache(&mut self) {
        self.cache.clear();
        self.cache_bytes = 0;
    }

    /// Drops cached entries that end at or below `offset` (every follower has them).
    pub fn release_cache(&mut self, offset: Offset) {
        while self.cache.front().is_some_and(|e| e.end() <= offset) {
            self.pop_cache_front();
        }
    }

    fn pop_cache_front(&mut self) {
        if let Some(e) = self.cache.pop_front() {
            self.cache_bytes -= e.data.len();
        }
    }

    #[cfg(test)]
    pub fn cache_bytes(&self) -> usize {
        self.cache_bytes
    }

    /// Cached entries from the batch covering `from`, up to `max_bytes` and `max_entries` (at
    /// least one entry, however large: a batch above `max_bytes` goes alone).
    /// `None` when the cache does not reach back to `from`: the owner must read the log.
    pub fn read_cached(
        &self,
        from: Offset,
        max_bytes: usize,
        max_entries: usize,
    ) -> Option<Vec<Entry>> {
        let first = self.cache.front()?;
        if from < first.offset || from >= self.end {
            return None;
        }
        let i = self.cache.partition_point(|e| e.end() <= from);
        let mut out = Vec::new();
        let mut bytes = 0;
        for e in self.cache.iter().skip(i) {
            if !out.is_empty() && (bytes + e.data.len() > max_bytes || out.len() >= max_entries) {
                break;
            }
            bytes += e.data.len();
            out.push(e.clone());
        }
        (!out.is_empty()).then_some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::EntryKind;
    use bytes::Bytes;

    fn e(offset: Offset, count: u32, term: Term) -> Entry {
        Entry {
            offset,
            count,
            term,
            kind: EntryKind::Data,
            data: Bytes::from(vec![0u8; 10]),
        }
    }

    #[test]
    fn terms_by_offset() {
        let mut v = LogView::new(0, 0);
        v.append(&e(0, 3, 1), true, 1000);
        v.append(&e(3, 2, 1), true, 1000);
        v.append(&e(5, 1, 3), true, 1000);
        assert_eq!(v.term_at(0), Some(1));
        assert_eq!(v.term_at(4), Some(1));
        assert_eq!(v.term_at(5), Some(3));
        assert_eq!(v.term_at(6), None);
        assert_eq!(v.term_before(0), Some(0));
        assert_eq!(v.term_before(5), Some(1));
        assert_eq!(v.term_before(6), Some(3));
        assert_eq!(v.term_run_start(5), 0);
        assert_eq!(v.term_run_start(6), 5);
        assert_eq!(v.read_cached(4, 1, 10).unwrap()[0].offset, 3);
        v.truncate(3);
        assert_eq!(v.last_term(), 1);
        assert_eq!(v.end, 3);
        v.compact(3);
        assert_eq!((v.start, v.start_term), (3, 1));
        assert_eq!(v.term_before(3), Some(1));
        assert_eq!(v.term_before(2), None);
        assert!(v.read_cached(0, 100, 10).is_none());
    }

    #[test]
    fn cache_is_bounded() {
        let mut v = LogView::new(0, 0);
        for i in 0..10 {
            v.append(&e(i, 1, 1), true, 35);
        }
        assert!(v.cache_bytes() <= 35);
        assert!(v.read_cached(0, 100, 10).is_none());
        assert_eq!(v.read_cached(9, 100, 10).unwrap().len(), 1);
    }
}
