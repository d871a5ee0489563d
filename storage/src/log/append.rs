//! The append API: a batch is verified, brought to the current format, stamped with its base
//! offset and the log's term, and staged; it resolves once its group commit is durable.

use super::commit::{Chunk, Slot, StagedBatch, COMMITS_IN_FLIGHT_MAX};
use super::{AppendInfo, AppendTicket, Log};
use crate::batch::{self, BatchHeader, BatchView, Record};
use crate::error::{Result, StorageError};
use crate::fs::Fs;
use std::cell::RefCell;
use std::rc::Rc;

/// The term a log stamps on the batches it appends until told another ([`Log::set_term`]):
/// 0, no election held. The single-node broker never changes it; a replicated log stamps the
/// term of the leader that appends (from 1 on). Batches of format v1 read as term 0 too.
pub const SINGLE_NODE_TERM: u64 = 0;

impl<F: Fs> Log<F> {
    /// Appends records as one batch; resolves once it is durable.
    pub async fn append_records(&self, records: &[Record]) -> Result<AppendInfo> {
        let bytes = batch::encode(records)
            .ok_or(StorageError::InvalidBatch(crate::error::BatchError::Empty))?;
        self.append(bytes).await
    }

    /// Appends an encoded batch (as a producer sent it: verified here, then stored unchanged but
    /// for its base offset); resolves once it is durable.
    pub async fn append(&self, bytes: Vec<u8>) -> Result<AppendInfo> {
        self.wait_for_space(bytes.len()).await?;
        let ticket = self.stage_batch(bytes)?;
        self.durable(ticket).await
    }

    /// Waits until a batch of `len_bytes` fits in the write buffer (back-pressure). Callers that
    /// must keep an order between their own state and the log's (the queue engine) wait here
    /// first, then change their state and [`Log::stage_batch`] with no await in between.
    pub async fn wait_for_space(&self, len_bytes: usize) -> Result<()> {
        loop {
            self.check_writable()?;
            let (full, in_flight) = {
                let i = self.inner.borrow();
                (
                    i.staged_bytes > 0
                        && i.staged_bytes + len_bytes > self.config.write_buffer_bytes_max,
                    i.in_flight > 0,
                )
            };
            if !full {
                return Ok(());
            }
            if in_flight || !self.commit().await {
                self.wait_flush_gen().await;
            }
        }
    }

    /// The term stamped on the batches staged from now on.
    pub fn term(&self) -> u64 {
        self.inner.borrow().term
    }

    /// Sets the term stamped on the batches staged from now on (a leader's epoch). It never
    /// goes back: a smaller one than the log's is refused with
    /// [`StorageError::TermRegressed`] (a deposed leader's late call), and changes nothing.
    pub fn set_term(&self, term: u64) -> Result<()> {
        let mut i = self.inner.borrow_mut();
        if term < i.term {
            return Err(StorageError::TermRegressed { term, last: i.term });
        }
        i.term = term;
        Ok(())
    }

    /// Verifies a batch and stages it at the end of the log, synchronously: batches are
    /// committed in the order they were staged. The batch is not durable until
    /// [`Log::durable`] resolves for the returned ticket. May exceed the write buffer by one
    /// batch if the caller skipped [`Log::wait_for_space`].
    ///
    /// The log stores the current batch formats (v2, v3 for a Kafka-compressed batch): a v1
    /// batch from an older producer is rewritten as v2 once verified ([`batch::upgraded`]); a
    /// v2 or v3 batch is stored in the bytes it came in, but for the base offset and term the
    /// log stamps.
    pub fn stage_batch(&self, bytes: Vec<u8>) -> Result<AppendTicket> {
        let bytes = self.verified(bytes)?;
        self.check_writable()?;
        let (info, slot) = self.stage(bytes, None);
        Ok(AppendTicket { info, slot })
    }

    /// Stages a batch a leader made, as a follower stores it: at the leader's `base_offset` and
    /// with the leader's `term`, verified by its checksum like any batch. The partition's log is
    /// the Raft log, so offsets and terms must agree on every replica; what would break that is
    /// refused with a typed error, never stored: `base_offset` other than the end of the log
    /// (staged batches included) is [`StorageError::ReplicaOffsetMismatch`] (the caller
    /// truncates first when it must overwrite), a `term` below the last batch's is
    /// [`StorageError::TermRegressed`] (terms never go back along a log). The log's own term
    /// ([`Log::term`]) rises to `term` if below. Durable once [`Log::durable`] resolves.
    pub fn stage_replicated(
        &self,
        bytes: Vec<u8>,
        base_offset: u64,
        term: u64,
    ) -> Result<AppendTicket> {
        let bytes = self.verified(bytes)?;
        self.check_writable()?;
        {
            let i = self.inner.borrow();
            if base_offset != i.next_offset {
                return Err(StorageError::ReplicaOffsetMismatch {
                    offset: base_offset,
                    expected: i.next_offset,
                });
            }
            if term < i.last_term {
                return Err(StorageError::TermRegressed {
                    term,
                    last: i.last_term,
                });
            }
        }
        let (info, slot) = self.stage(bytes, Some(term));
        Ok(AppendTicket { info, slot })
    }

    /// The term of the last batch in the log, staged ones included (0 for an empty log, or a
    /// log written by the single-node broker).
    pub fn last_term(&self) -> u64 {
        self.inner.borrow().last_term
    }

    /// A batch as the log stores it: within the size limit, verified (checksum, records), in
    /// the current format.
    fn verified(&self, bytes: Vec<u8>) -> Result<Vec<u8>> {
        if bytes.len() > self.config.batch_bytes_max {
            return Err(crate::error::BatchError::TooLarge {
                size_bytes: bytes.len(),
                limit_bytes: self.config.batch_bytes_max,
            }
            .into());
        }
        let view = BatchView::parse(&bytes)?;
        view.validate_records()?;
        if view.bytes.len() != bytes.len() {
            return Err(crate::error::BatchError::BadLength(view.header.batch_len).into());
        }
        Ok(if view.header.needs_upgrade() {
            batch::upgraded(&view)
        } else {
            bytes
        })
    }

    /// Resolves when the staged batch is durable (driving a group commit if one may start).
    pub async fn durable(&self, ticket: AppendTicket) -> Result<AppendInfo> {
        loop {
            if let Some(r) = ticket.slot.borrow_mut().take() {
                return r.map(|()| ticket.info);
            }
            let may_start = {
                let i = self.inner.borrow();
                i.failure.is_none()
                    && !i.staged.is_empty()
                    && (i.in_flight == 0 || (i.in_flight < COMMITS_IN_FLIGHT_MAX && !i.rolling))
            };
            if may_start {
                // Gather first: every task that is ready to run now (requests just decoded,
                // long polls just woken) gets to stage before the commit takes what is staged,
                // instead of waiting a whole commit for the next one.
                crate::fs::yield_now().await;
                if self.commit().await || ticket.slot.borrow().is_some() {
                    continue;
                }
            }
            // Every reason a commit could not start ends when one in flight finishes (and the
            // flush generation is read now, with no await since the checks above).
            self.wait_flush_gen().await;
        }
    }

    pub(super) fn check_writable(&self) -> Result<()> {
        let i = self.inner.borrow();
        if i.closed {
            Err(StorageError::Closed)
        } else if i.poisoned {
            Err(StorageError::Poisoned)
        } else if i.truncating {
            Err(StorageError::Truncating)
        } else {
            Ok(())
        }
    }

    /// Stamps and stages a verified batch at the end of the log, with the log's term or, for a
    /// replicated batch, `term` (checked by the caller not to go below the last batch's).
    pub(super) fn stage(&self, mut bytes: Vec<u8>, term: Option<u64>) -> (AppendInfo, Slot) {
        let mut guard = self.inner.borrow_mut();
        let i = &mut *guard;
        let mut header = BatchHeader::parse(&bytes).expect("verified by the caller");
        if let Some(t) = term {
            i.term = i.term.max(t);
        }
        header.base_offset = i.next_offset;
        header.term = term.unwrap_or(i.term);
        i.last_term = header.term;
        batch::set_base_offset(&mut bytes, header.base_offset);
        batch::set_term(&mut bytes, header.term).expect("staged batches are in the current format");
        let len = bytes.len() as u64;
        let too_big = i.proj_size > 0 && i.proj_size + len > self.config.segment_bytes_max;
        let too_old = match (i.proj_first_ts, self.config.segment_age_ms_max) {
            (Some(first), Some(age)) if i.proj_size > 0 => {
                header.max_timestamp_ms.saturating_sub(first) >= age as i64
            }
            _ => false,
        };
        let roll = too_big || too_old;
        if roll {
            i.proj_segment = header.base_offset;
            i.proj_size = 0;
            i.proj_first_ts = None;
        }
        let needs_new_chunk = roll || i.staged.last().is_none_or(|c| c.segment != i.proj_segment);
        if needs_new_chunk {
            i.staged.push(Chunk {
                segment: i.proj_segment,
                roll,
                parts: Vec::new(),
                len: 0,
                batches: Vec::new(),
            });
        }
        let chunk = i.staged.last_mut().expect("pushed above");
        let slot: Slot = Rc::new(RefCell::new(None));
        chunk.batches.push(StagedBatch {
            header,
            at: chunk.len,
            slot: slot.clone(),
        });
        i.staged_bytes += bytes.len();
        // A large batch moves in: it is never copied to be staged.
        chunk.push_bytes(bytes, self.config.coalesce_batch_bytes_max);
        i.proj_size += len;
        i.proj_first_ts.get_or_insert(header.first_timestamp_ms);
        i.next_offset = header.next_offset();
        (
            AppendInfo {
                base_offset: header.base_offset,
                last_offset: header.last_offset(),
            },
            slot,
        )
    }
}
