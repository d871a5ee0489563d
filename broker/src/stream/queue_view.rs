//! The unified model: a queue partition read as a stream. A queue partition's log holds the
//! engine's records; its `Sent` records are the messages, in send order, at log offsets. This
//! reads the log directly — never through the engine — so no lease, receive count or
//! visibility changes: replay, audit and analytics beside the queue's consumers.
//!
//! What a reader sees is what the queue's log still keeps: the queue's compaction deletes
//! segments whose messages are all deleted, like retention does for topics
//! (`OffsetOutOfRange`, then resume at the earliest offset).

use super::{FetchedRecord, OffsetSpec, StreamError, StreamResult};
use crate::engine::{Record as EngineRecord, RecordKind};
use crate::partition_log::PartitionLog;
use crate::runtime;
use crate::shard::partition::PartitionActor;
use sluice_storage::Record;

/// Messages of a queue partition, read as a stream.
#[derive(Debug, Clone, Default)]
pub struct QueueFetch {
    pub records: Vec<FetchedRecord>,
    /// Where the next fetch starts (past engine records that are not messages).
    pub next_offset: u64,
    pub start_offset: u64,
    pub end_offset: u64,
}

/// Reads `Sent` records of a queue partition from `offset`, waiting until `deadline_ms` for a
/// new one (woken by the partition's readiness event, which a send notifies). The reply's
/// records are rebuilt from the engine records (key = message group id, value = body,
/// timestamp = the send's, a `message-id` header).
pub async fn fetch(
    actor: &PartitionActor,
    offset: u64,
    max_bytes: usize,
    max_records: u32,
    deadline_ms: u64,
) -> StreamResult<QueueFetch> {
    let mut at = offset;
    loop {
        let log = actor.log();
        let (start, end) = (log.start_offset(), log.end_offset());
        if at < start || at > end {
            return Err(StreamError::OffsetOutOfRange {
                offset: at,
                start,
                end,
            });
        }
        let mut out = Vec::new();
        let mut bytes = 0usize;
        while at < log.end_offset() && out.len() < max_records as usize && bytes < max_bytes {
            let batches = log.read(at, max_bytes.saturating_sub(bytes).max(1)).await?;
            if batches.is_empty() {
                break;
            }
            for b in &batches {
                for r in b.view().data_records() {
                    let r = r.map_err(|e| StreamError::Internal(e.to_string()))?;
                    if r.offset < at {
                        continue;
                    }
                    let rec = EngineRecord::decode(r.value).map_err(|e| {
                        StreamError::Internal(format!("engine record at {}: {e}", r.offset))
                    })?;
                    if let RecordKind::Sent(s) = rec.kind {
                        if out.len() < max_records as usize {
                            bytes += s.payload.body.len();
                            out.push(FetchedRecord {
                                offset: r.offset,
                                record: Record {
                                    timestamp_ms: rec.at_ms as i64,
                                    key: s.payload.group_id.as_ref().map(|g| g.as_bytes().to_vec()),
                                    value: s.payload.body.as_bytes().to_vec(),
                                    headers: vec![(
                                        b"message-id".to_vec(),
                                        s.message_id.to_string().into_bytes(),
                                    )],
                                },
                            });
                        }
                    }
                }
                at = b.header.next_offset();
                if out.len() >= max_records as usize {
                    // The next fetch starts after the last record handed out.
                    at = out.last().map_or(at, |r| r.offset + 1);
                    break;
                }
            }
        }
        if !out.is_empty() || runtime::now_ms() >= deadline_ms {
            return Ok(QueueFetch {
                records: out,
                next_offset: at,
                start_offset: log.start_offset(),
                end_offset: log.end_offset(),
            });
        }
        // Nothing new but engine records: park until the next send (or the deadline).
        actor.wait_notified(deadline_ms).await?;
    }
}

/// The first offset of what the partition's log keeps, its end, or the first offset whose
/// batch time is at or after a timestamp (the end if none is).
pub async fn list_offset(actor: &PartitionActor, spec: OffsetSpec) -> StreamResult<u64> {
    let log = actor.log();
    Ok(match spec {
        OffsetSpec::Earliest => log.start_offset(),
        OffsetSpec::Latest => log.end_offset(),
        OffsetSpec::Timestamp(ts) => log
            .offset_for_timestamp(ts)
            .await?
            .unwrap_or_else(|| log.end_offset()),
    })
}

/// A fetched queue stream as wire bytes: a queue partition's messages sit at sparse log
/// offsets (the engine's other records are between them) and a batch's offsets are dense, so
/// each message travels as a one-record batch at its own offset. When the reply stops past
/// the last message (engine records only), a control batch at `next_offset - 1` with one empty
/// record says where the next fetch starts; readers skip control records.
pub fn encode_for_wire(f: &QueueFetch, requested: u64) -> Vec<u8> {
    use sluice_storage::batch::{encode, set_base_offset, BatchBuilder};
    let mut out = Vec::new();
    for r in &f.records {
        let mut b = encode(std::slice::from_ref(&r.record)).expect("one record");
        set_base_offset(&mut b, r.offset);
        out.extend_from_slice(&b);
    }
    let covered = f.records.last().map_or(requested, |r| r.offset + 1);
    if f.next_offset > covered {
        let mut marker = BatchBuilder::new().control();
        let at_ms = f.records.last().map_or(0, |r| r.record.timestamp_ms);
        marker.push(&Record::new(at_ms, Vec::new()));
        let mut b = marker.finish().expect("one record");
        set_base_offset(&mut b, f.next_offset - 1);
        out.extend_from_slice(&b);
    }
    out
}
