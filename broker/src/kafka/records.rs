//! Kafka v2 record batches to and from Sluice's records. Produced batches are decoded (the
//! codec checks their CRC32C) and their records written straight into one Sluice batch;
//! fetched batches are encoded from the stored records (checksum verified) with the log's
//! offsets and timestamps, their keys and values borrowed from the stored bytes, not copied.
//! Compressed batches are stored and served as they came (`compression.rs`).

use super::compression;
use super::dispatch::code;
use crate::stream::{ProducerBatch, StreamError};
use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record as KRecord, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
    TimestampType,
};
use sluice_storage::{BatchBuilder, BatchView, Record, RecordView};

/// Records in one produced partition's data (Sluice's batches stop at 2^20 records).
pub const PRODUCE_RECORDS_MAX: usize = 1 << 20;

/// Byte offsets in a v2 batch header (Kafka's `DefaultRecordBatch`).
const MAGIC_AT: usize = 16;
const ATTRIBUTES_AT: usize = 21;
const BATCH_HEADER_BYTES: usize = 61;
/// Headers per record and header name bytes that Sluice's record format holds (u16 fields).
const RECORD_HEADERS_MAX: usize = u16::MAX as usize;
const HEADER_NAME_BYTES_MAX: usize = u16::MAX as usize;
/// A Sluice record's framing beyond its key, value and headers, at most (sizes the batch's
/// buffer up front, so that it is not grown and copied while records are written).
const SLUICE_RECORD_OVERHEAD_BYTES: usize = 32;

/// A produced partition's batches as one Sluice batch (unsealed offsets: the log assigns
/// them), and the idempotent producer's sequence range if the batches carry one. Records go
/// from the decoded Kafka batch into the Sluice batch without another copy. `Err` is Kafka's
/// error code.
pub fn from_kafka(bytes: &Bytes, now_ms: i64) -> Result<(Vec<u8>, Option<ProducerBatch>), i16> {
    // Framing checked before decoding; compressed batches go to `compression.rs`.
    let mut at = 0usize;
    let (mut batches, mut compressed) = (0usize, 0usize);
    while at < bytes.len() {
        if bytes.len() - at < BATCH_HEADER_BYTES {
            return Err(code::CORRUPT_MESSAGE);
        }
        if bytes[at + MAGIC_AT] != 2 {
            return Err(code::UNSUPPORTED_FOR_MESSAGE_FORMAT);
        }
        let attributes =
            i16::from_be_bytes([bytes[at + ATTRIBUTES_AT], bytes[at + ATTRIBUTES_AT + 1]]);
        match attributes & 0x7 {
            0 => {}
            1..=4 => compressed += 1,
            _ => return Err(code::UNSUPPORTED_COMPRESSION_TYPE),
        }
        batches += 1;
        if attributes & 0x20 != 0 {
            // Control batches come from the transaction coordinator, never from a producer
            // (transactional ones, 0x10, are taken: `txn.rs`).
            return Err(code::INVALID_RECORD);
        }
        let len = i32::from_be_bytes(bytes[at + 8..at + 12].try_into().expect("4 bytes"));
        let len = usize::try_from(len).map_err(|_| code::CORRUPT_MESSAGE)?;
        at = at
            .checked_add(12 + len)
            .filter(|end| *end <= bytes.len())
            .ok_or(code::CORRUPT_MESSAGE)?;
    }
    if compressed > 0 {
        return if batches == 1 {
            compression::take_compressed(bytes, now_ms)
        } else {
            compression::to_sluice_records(bytes, now_ms)
        };
    }
    let mut buf = bytes.clone();
    let sets = RecordBatchDecoder::decode_all(&mut buf).map_err(|_| code::CORRUPT_MESSAGE)?;
    let count: usize = sets.iter().map(|s| s.records.len()).sum();
    if count > PRODUCE_RECORDS_MAX {
        return Err(code::MESSAGE_TOO_LARGE);
    }
    let mut batch = BatchBuilder::with_capacity(bytes.len() + count * SLUICE_RECORD_OVERHEAD_BYTES);
    let mut producer: Option<ProducerBatch> = None;
    for set in &sets {
        for r in &set.records {
            if r.producer_id >= 0 && r.sequence >= 0 {
                match &mut producer {
                    None => {
                        producer = Some(ProducerBatch {
                            producer_id: r.producer_id,
                            epoch: r.producer_epoch,
                            first_sequence: r.sequence,
                            last_sequence: r.sequence,
                        })
                    }
                    Some(p) => p.last_sequence = r.sequence,
                }
            }
            // Sluice's format holds what Kafka's can say but for these (u16 fields there).
            if r.headers.len() > RECORD_HEADERS_MAX
                || r.headers.keys().any(|k| k.len() > HEADER_NAME_BYTES_MAX)
            {
                return Err(code::INVALID_RECORD);
            }
            let headers = r
                .headers
                .iter()
                .map(|(k, v)| (k.as_bytes(), v.as_deref().unwrap_or_default()));
            batch.push_parts(
                if r.timestamp >= 0 {
                    r.timestamp
                } else {
                    now_ms
                },
                r.key.as_deref(),
                r.value.as_deref().unwrap_or_default(),
                headers,
            );
        }
    }
    let batch = batch.finish().ok_or(code::INVALID_RECORD)?;
    Ok((batch, producer))
}

/// A stored record as a Kafka record whose key, value and header values are slices of
/// `batch`, the stored batch it was read from (no copy; the encoder writes them once).
fn kafka_record_in(batch: &Bytes, r: &RecordView<'_>) -> KRecord {
    let mut headers = IndexMap::new();
    for (k, v) in r.headers() {
        let name = String::from_utf8_lossy(k).into_owned();
        headers.insert(StrBytes::from_string(name), Some(batch.slice_ref(v)));
    }
    KRecord {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: r.offset as i64,
        sequence: -1,
        timestamp: r.timestamp_ms,
        key: r.key.map(|k| batch.slice_ref(k)),
        value: Some(batch.slice_ref(r.value)),
        headers,
    }
}

fn kafka_record(offset: u64, record: Record) -> KRecord {
    let mut headers = IndexMap::new();
    for (k, v) in record.headers {
        let name = String::from_utf8_lossy(&k).into_owned();
        headers.insert(StrBytes::from_string(name), Some(Bytes::from(v)));
    }
    KRecord {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: offset as i64,
        sequence: -1,
        timestamp: record.timestamp_ms,
        key: record.key.map(Bytes::from),
        value: Some(Bytes::from(record.value)),
        headers,
    }
}

fn encode_set(out: &mut BytesMut, records: &[KRecord]) -> Result<(), StreamError> {
    if records.is_empty() {
        return Ok(());
    }
    let options = RecordEncodeOptions {
        version: 2,
        compression: Compression::None,
    };
    RecordBatchEncoder::encode(out, records.iter(), &options)
        .map_err(|e| StreamError::Internal(format!("encoding a Kafka batch: {e}")))
}

/// Stored Sluice batches as Kafka v2 batches, one for one, leaving out records before
/// `from` (a stored batch may start before the fetch offset).
pub fn to_kafka(batches: &[Bytes], from: u64) -> Result<Bytes, StreamError> {
    let mut out = BytesMut::new();
    for b in batches {
        let v = BatchView::parse(b).map_err(|e| StreamError::Internal(e.to_string()))?;
        if v.header.is_control() {
            // Transaction markers go out as Kafka control batches; other control batches
            // (Raft's, a transactional batch's `data` record) are left out.
            if v.header.base_offset >= from {
                super::txn::marker_to_kafka(&v, &mut out)?;
            }
            continue;
        }
        if compression::serve_compressed(&v, &mut out) {
            continue;
        }
        let mut records = Vec::new();
        for r in v.records() {
            let r = r.map_err(|e| StreamError::Internal(e.to_string()))?;
            if r.offset >= from {
                records.push(kafka_record_in(b, &r));
            }
        }
        encode_set(&mut out, &records)?;
    }
    Ok(out.freeze())
}

/// A queue read as a stream: each message in a batch of its own (queue offsets have gaps
/// where engine records lie), and, when the stream moves on past non-message records, an
/// empty batch up to `next_offset - 1` so that the client's position moves past them.
pub fn queue_to_kafka(
    f: &crate::stream::queue_view::QueueFetch,
    from: u64,
) -> Result<Bytes, StreamError> {
    let mut out = BytesMut::new();
    for r in &f.records {
        if r.offset >= from {
            encode_set(&mut out, &[kafka_record(r.offset, r.record.clone())])?;
        }
    }
    let covered = f.records.last().map_or(from, |r| r.offset + 1);
    if f.next_offset > covered {
        out.extend_from_slice(&empty_batch(covered, f.next_offset - 1));
    }
    Ok(out.freeze())
}

/// Queue messages a share fetch acquired, each a one-record batch at its own offset (the
/// message ids of a partition have gaps where other consumers' messages are).
pub fn messages_to_kafka(messages: &[(u64, Record)]) -> Result<Bytes, StreamError> {
    let mut out = BytesMut::new();
    for (offset, r) in messages {
        encode_set(&mut out, &[kafka_record(*offset, r.clone())])?;
    }
    Ok(out.freeze())
}

/// A v2 batch with no records spanning `[base, last]`: clients move their position to
/// `last + 1` (Kafka writes these when compaction empties a batch).
pub fn empty_batch(base: u64, last: u64) -> Vec<u8> {
    let mut body = Vec::with_capacity(BATCH_HEADER_BYTES);
    // From attributes on: what the CRC covers.
    body.extend_from_slice(&0i16.to_be_bytes()); // attributes
    body.extend_from_slice(&((last - base) as i32).to_be_bytes()); // last offset delta
    body.extend_from_slice(&(-1i64).to_be_bytes()); // base timestamp
    body.extend_from_slice(&(-1i64).to_be_bytes()); // max timestamp
    body.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
    body.extend_from_slice(&(-1i16).to_be_bytes()); // producer epoch
    body.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    body.extend_from_slice(&0i32.to_be_bytes()); // record count
    let crc = crc32c::crc32c(&body);
    let mut out = Vec::with_capacity(BATCH_HEADER_BYTES);
    out.extend_from_slice(&(base as i64).to_be_bytes());
    out.extend_from_slice(&((4 + 1 + 4 + body.len()) as i32).to_be_bytes()); // batch length
    out.extend_from_slice(&0i32.to_be_bytes()); // partition leader epoch
    out.push(2); // magic
    out.extend_from_slice(&crc.to_be_bytes());
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn produced(records: &[KRecord]) -> Bytes {
        let mut out = BytesMut::new();
        encode_set(&mut out, records).expect("encode");
        out.freeze()
    }

    #[test]
    fn a_batch_round_trips_through_sluice_records_with_the_logs_offsets() {
        let mut r = kafka_record(0, Record::new(1_000, b"v0".to_vec()));
        r.key = Some(Bytes::from_static(b"k"));
        r.producer_id = 7;
        r.producer_epoch = 0;
        r.sequence = 3;
        let mut r2 = kafka_record(1, Record::new(1_001, b"v1".to_vec()));
        r2.producer_id = 7;
        r2.producer_epoch = 0;
        r2.sequence = 4;
        let bytes = produced(&[r, r2]);
        let (mut stored, p) = from_kafka(&bytes, 5).expect("decode");
        let view = BatchView::parse(&stored).expect("a valid Sluice batch");
        view.validate_records().expect("records");
        let records: Vec<Record> = view
            .records()
            .map(|r| r.expect("record").to_owned_record())
            .collect();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(records[1].value, b"v1");
        let p = p.expect("idempotent");
        assert_eq!(
            (p.producer_id, p.first_sequence, p.last_sequence),
            (7, 3, 4)
        );
        sluice_storage::batch::set_base_offset(&mut stored, 40);
        let fetched = to_kafka(&[Bytes::from(stored)], 41).expect("encode");
        let mut buf = fetched.clone();
        let sets = RecordBatchDecoder::decode_all(&mut buf).expect("a valid Kafka batch");
        assert_eq!(sets[0].records.len(), 1);
        assert_eq!(sets[0].records[0].offset, 41);
        assert_eq!(sets[0].records[0].value.as_deref(), Some(&b"v1"[..]));
    }

    #[test]
    fn bad_batches_get_kafkas_codes() {
        let good = produced(&[kafka_record(0, Record::new(1, b"v".to_vec()))]);
        let mut crc = good.to_vec();
        let last = crc.len() - 1;
        crc[last] ^= 1;
        assert_eq!(
            from_kafka(&Bytes::from(crc), 0).err(),
            Some(code::CORRUPT_MESSAGE)
        );
        // A codec Kafka does not have: Kafka's code for it.
        let mut unknown = good.to_vec();
        unknown[ATTRIBUTES_AT + 1] |= 5;
        assert_eq!(
            from_kafka(&Bytes::from(unknown), 0).err(),
            Some(code::UNSUPPORTED_COMPRESSION_TYPE)
        );
        // The gzip bit on plain records: its CRC no longer holds (and they do not inflate).
        let mut gz = good.to_vec();
        gz[ATTRIBUTES_AT + 1] |= 1;
        assert_eq!(
            from_kafka(&Bytes::from(gz), 0).err(),
            Some(code::CORRUPT_MESSAGE)
        );
        assert_eq!(
            from_kafka(&good.slice(..good.len() - 3), 0).err(),
            Some(code::CORRUPT_MESSAGE)
        );
        // More headers than Sluice's record holds: refused, not a panic.
        let mut many = kafka_record(0, Record::new(1, b"v".to_vec()));
        for i in 0..=RECORD_HEADERS_MAX {
            many.headers
                .insert(StrBytes::from_string(i.to_string()), None);
        }
        assert_eq!(
            from_kafka(&produced(&[many]), 0).err(),
            Some(code::INVALID_RECORD)
        );
        let mut empty = Bytes::from(empty_batch(5, 9));
        let sets = RecordBatchDecoder::decode_all(&mut empty).expect("empty batch parses");
        assert!(sets.iter().all(|s| s.records.is_empty()));
    }
}
