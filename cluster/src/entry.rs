//! Raft entries as storage batches, one for one: the partition's segment log is the Raft log,
//! so a Raft entry is a record batch at the same offset, and the batch header carries its term.
//!
//! A data entry is the producer's batch itself. Raft's own entries — a new leader's no-op and
//! membership changes — take one offset each and are stored as **control batches** (attribute
//! bit 0) of one record, so offsets stay aligned with the Raft log on every replica:
//!
//! ```text
//! record key   = b"sluice.raft"          (names the writer: no other control record uses it)
//! record value = u8 format (1) | u8 kind (1 no-op, 2 membership) | payload (Membership::encode)
//! timestamp    = 0                       (deterministic: every replica builds identical bytes)
//! ```
//!
//! **Whoever replays a replicated log (queue engines, topic readers, Kafka fetches) must skip
//! control batches**: they are not messages. (Readers of topics and the Kafka path already skip
//! control batches; producers may not write them.)

use crate::error::ReplicaError;
use bytes::Bytes;
use sluice_raft::{Entry, EntryKind, Membership};
use sluice_storage::ReadBatch;
use sluice_wire::batch::{self, BatchBuilder, BatchView, Record};

/// The key of every Raft control record.
pub const RAFT_CONTROL_KEY: &[u8] = b"sluice.raft";
/// The layout version of a Raft control record's value.
pub const RAFT_CONTROL_FORMAT: u8 = 1;
const KIND_NOOP: u8 = 1;
const KIND_CONFIG: u8 = 2;

/// The batch a Raft entry is stored as: a data entry's bytes as they are (the log stamps
/// offset and term); a no-op or membership entry as a one-record control batch.
pub fn entry_to_batch(e: &Entry) -> Result<Vec<u8>, ReplicaError> {
    match e.kind {
        EntryKind::Data => {
            let view = BatchView::parse(&e.data).map_err(ReplicaError::BadEntry)?;
            if view.header.record_count != e.count {
                return Err(ReplicaError::EntryMismatch {
                    offset: e.offset,
                    why: "record count differs from the entry's",
                });
            }
            if view.header.is_control() {
                return Err(ReplicaError::EntryMismatch {
                    offset: e.offset,
                    why: "a data entry holds a control batch",
                });
            }
            Ok(e.data.to_vec())
        }
        EntryKind::Noop | EntryKind::Config => {
            if e.count != 1 {
                return Err(ReplicaError::EntryMismatch {
                    offset: e.offset,
                    why: "a no-op or membership entry covers one offset",
                });
            }
            Ok(control_batch(e.kind, &e.data))
        }
    }
}

/// Checks a replicated entry before the core takes it: a data entry's batch verifies
/// (checksum, records), covers `count` records and is not a control batch; a no-op or
/// membership entry covers one offset. (Staging verifies the checksum again: a later
/// `stage_replicated` variant for pre-verified bytes can save that hash.)
pub fn verify_entry(e: &Entry) -> Result<(), ReplicaError> {
    let mismatch = |why| ReplicaError::EntryMismatch {
        offset: e.offset,
        why,
    };
    match e.kind {
        EntryKind::Data => {
            let view = BatchView::parse(&e.data).map_err(ReplicaError::BadEntry)?;
            view.validate_records().map_err(ReplicaError::BadEntry)?;
            if view.bytes.len() != e.data.len() {
                return Err(mismatch("bytes after the batch"));
            }
            if view.header.record_count != e.count {
                return Err(mismatch("record count differs from the entry's"));
            }
            if view.header.is_control() {
                return Err(mismatch("a data entry holds a control batch"));
            }
        }
        EntryKind::Noop | EntryKind::Config => {
            if e.count != 1 {
                return Err(mismatch("a no-op or membership entry covers one offset"));
            }
        }
    }
    Ok(())
}

/// A one-record control batch for a no-op or a membership entry.
pub fn control_batch(kind: EntryKind, payload: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(2 + payload.len());
    value.push(RAFT_CONTROL_FORMAT);
    value.push(match kind {
        EntryKind::Config => KIND_CONFIG,
        _ => KIND_NOOP,
    });
    value.extend_from_slice(payload);
    let mut b = BatchBuilder::new().control();
    b.push(&Record {
        timestamp_ms: 0,
        key: Some(RAFT_CONTROL_KEY.to_vec()),
        value,
        headers: Vec::new(),
    });
    b.finish().expect("one record")
}

/// The Raft entry a stored batch is (read back to send a lagging follower, or at restore).
pub fn batch_to_entry(b: &ReadBatch) -> Result<Entry, ReplicaError> {
    let h = b.header;
    let (kind, data) = if h.is_control() {
        let (kind, payload) = parse_control(b)?;
        (kind, payload)
    } else {
        (EntryKind::Data, b.bytes.clone())
    };
    Ok(Entry {
        offset: h.base_offset,
        count: h.record_count,
        term: h.term,
        kind,
        data,
    })
}

/// The kind and payload of a Raft control batch.
fn parse_control(b: &ReadBatch) -> Result<(EntryKind, Bytes), ReplicaError> {
    let bad = |why| ReplicaError::EntryMismatch {
        offset: b.header.base_offset,
        why,
    };
    let view = b.view();
    let mut records = view.records();
    let r = records
        .next()
        .ok_or(bad("empty control batch"))?
        .map_err(ReplicaError::BadEntry)?;
    if records.next().is_some() {
        return Err(bad("a Raft control batch holds one record"));
    }
    if r.key != Some(RAFT_CONTROL_KEY) {
        return Err(bad("a control batch not written by Raft"));
    }
    let value = r.value;
    if value.len() < 2 || value[0] != RAFT_CONTROL_FORMAT {
        return Err(bad("unknown Raft control record format"));
    }
    let kind = match value[1] {
        KIND_NOOP => EntryKind::Noop,
        KIND_CONFIG => EntryKind::Config,
        _ => return Err(bad("unknown Raft control record kind")),
    };
    // The payload as a slice of the batch's bytes (no copy).
    let start = value.as_ptr() as usize - b.bytes.as_ptr() as usize + 2;
    let payload = b.bytes.slice(start..start + value.len() - 2);
    Ok((kind, payload))
}

/// The membership a stored batch holds, if it is a Raft membership entry.
pub fn batch_membership(b: &ReadBatch) -> Option<Membership> {
    if !b.header.is_control() {
        return None;
    }
    match parse_control(b) {
        Ok((EntryKind::Config, payload)) => Membership::decode(&payload).ok(),
        _ => None,
    }
}

/// A client's batch made ready to propose: verified (checksum, records), not a control batch,
/// in the current format (a v1 batch is rewritten as v2, as the log would).
pub fn normalize_proposal(bytes: Vec<u8>) -> Result<(Bytes, u32), ReplicaError> {
    let view = BatchView::parse(&bytes).map_err(ReplicaError::InvalidBatch)?;
    view.validate_records()
        .map_err(ReplicaError::InvalidBatch)?;
    if view.bytes.len() != bytes.len() {
        return Err(ReplicaError::InvalidBatch(batch::BatchError::BadLength(
            view.header.batch_len,
        )));
    }
    if view.header.is_control() {
        return Err(ReplicaError::ControlBatchRefused);
    }
    let count = view.header.record_count;
    let bytes = if view.header.version == batch::BATCH_FORMAT_VERSION {
        bytes
    } else {
        batch::upgraded(&view)
    };
    Ok((Bytes::from(bytes), count))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_raft::{DiskId, Replica};

    fn read_batch(mut bytes: Vec<u8>, offset: u64, term: u64) -> ReadBatch {
        batch::set_base_offset(&mut bytes, offset);
        batch::set_term(&mut bytes, term).expect("v2");
        let header = BatchView::parse(&bytes).expect("valid").header;
        ReadBatch {
            header,
            bytes: Bytes::from(bytes),
        }
    }

    #[test]
    fn raft_entries_round_trip_through_batches() {
        let m = Membership::voters(&[
            Replica {
                node: 1,
                disk: DiskId(11),
            },
            Replica {
                node: 2,
                disk: DiskId(22),
            },
        ]);
        let data = batch::encode(&[Record::new(5, b"hello".to_vec())]).expect("one");
        for (kind, payload, count) in [
            (EntryKind::Noop, Bytes::new(), 1),
            (EntryKind::Config, m.encode(), 1),
            (EntryKind::Data, Bytes::from(data.clone()), 1),
        ] {
            let e = Entry {
                offset: 7,
                count,
                term: 3,
                kind,
                data: payload,
            };
            let b = read_batch(entry_to_batch(&e).expect("batch"), 7, 3);
            assert_eq!(b.header.is_control(), kind != EntryKind::Data);
            let back = batch_to_entry(&b).expect("entry");
            assert_eq!(
                (back.offset, back.count, back.term, back.kind),
                (7, 1, 3, kind)
            );
            if kind == EntryKind::Data {
                // All but the stamps (base offset 0..8, term 56..64).
                assert_eq!(back.data[8..56], data[8..56]);
                assert_eq!(back.data[64..], data[64..]);
            } else {
                assert_eq!(back.data, e.data);
            }
            assert_eq!(
                batch_membership(&b),
                (kind == EntryKind::Config).then(|| m.clone())
            );
        }
        // Two replicas build the same bytes for the same control entry.
        let e = Entry {
            offset: 0,
            count: 1,
            term: 1,
            kind: EntryKind::Noop,
            data: Bytes::new(),
        };
        assert_eq!(
            entry_to_batch(&e).expect("a"),
            entry_to_batch(&e).expect("b")
        );
    }

    #[test]
    fn clients_may_not_propose_control_batches_and_counts_must_match() {
        let control = control_batch(EntryKind::Noop, &[]);
        assert!(matches!(
            normalize_proposal(control),
            Err(ReplicaError::ControlBatchRefused)
        ));
        let data = batch::encode(&[Record::new(5, b"x".to_vec())]).expect("one");
        let e = Entry {
            offset: 0,
            count: 2,
            term: 1,
            kind: EntryKind::Data,
            data: Bytes::from(data),
        };
        assert!(matches!(
            entry_to_batch(&e),
            Err(ReplicaError::EntryMismatch { .. })
        ));
    }
}
