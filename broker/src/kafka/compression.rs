//! Compressed Kafka batches (gzip, snappy, lz4, zstd): taken, stored and served as the
//! producer compressed them, decompressed only where Sluice must read the records.
//!
//! - **Produce.** A partition's data that is one compressed Kafka v2 batch is checked — its
//!   CRC32C, then its records, decompressed under a byte bound and walked (count, offset
//!   deltas, lengths, what Sluice's record format can hold) — and stored as it came, behind a
//!   Sluice header (`wire/src/batch.rs`, "Kafka-compressed batches"): users compress for disk
//!   and replication, so the log and its replicas keep the compressed bytes. Several batches
//!   in one partition's data (rare: clients send one per partition) become one batch of Sluice
//!   records, decompressed.
//! - **Fetch from Kafka.** The stored Kafka batch goes out as it is, its base offset set to the
//!   log's (the base offset and leader epoch lie outside Kafka's CRC, so the producer's CRC
//!   still holds: no decompression, no checksum work).
//! - **Everything else that reads records** (the native protocol's fetch, `FetchReply::records`)
//!   gets the batch rewritten as Sluice records ([`sluice_records`]), with the same bound.
//!
//! Bombs: decompressed bytes of one partition's data stop at [`DECOMPRESSED_BATCH_BYTES_MAX`]
//! (more is `INVALID_RECORD`, nothing stored, the connection goes on), decompressors are
//! read through that bound and never asked for more (no size a header claims is believed),
//! zstd's window is capped ([`ZSTD_WINDOW_LOG_MAX`]), and the memory held by decompressions at
//! once on a shard is a budget ([`DECOMPRESSION_SHARD_BYTES_MAX`], see [`Permit`]).
//!
//! Codecs: the `kafka-protocol` crate's compression features decompress without a bound
//! (`read_to_end`) and its lz4 is a C build, so this file has its own decompressors: flate2 on
//! miniz_oxide (pure Rust), snap (pure Rust; xerial's framing, which Kafka's Java client and
//! librdkafka write, or a raw block), lz4_flex (pure Rust; the LZ4 frame format of v2
//! batches) and the `zstd` crate (libzstd via cc: no maintained pure-Rust zstd decoder caps
//! its window as libzstd does).

use super::dispatch::code;
use crate::stream::ProducerBatch;
use bytes::Bytes;
use sluice_storage::batch::{self, BatchError, KAFKA_BATCH_HEADER_BYTES};
use sluice_storage::{BatchBuilder, BatchView};
use std::cell::Cell;
use std::io::Read;

/// Decompressed bytes one produced partition's data (or one stored batch, when read) may
/// reach: what an uncompressed produce request may carry at most
/// (`KAFKA_REQUEST_BYTES_MAX`), so compression never lets more through than plain bytes would.
pub const DECOMPRESSED_BATCH_BYTES_MAX: usize = super::KAFKA_REQUEST_BYTES_MAX;
/// zstd's window (2^23 bytes = 8 MiB), beyond the output: a frame that asks for more is refused.
/// Producers' zstd (librdkafka, zstd-jni at level 3) use 2^21 at most for Kafka-sized batches.
pub const ZSTD_WINDOW_LOG_MAX: u32 = 23;
/// A decompressor's own state at most: zstd's window (the largest; an LZ4 frame's blocks
/// stop at 4 MiB, deflate's window is 32 KiB).
const DECODER_STATE_BYTES_MAX: usize = 1 << ZSTD_WINDOW_LOG_MAX;
/// What one decompression holds at most: its output (whose buffer, grown by doubling, holds
/// half the bound beside the whole while its last growth copies) and its decoder's state.
pub const DECOMPRESSION_BYTES_MAX: usize =
    DECOMPRESSED_BATCH_BYTES_MAX + DECOMPRESSED_BATCH_BYTES_MAX / 2 + DECODER_STATE_BYTES_MAX;
/// Memory all decompressions on one shard may hold at once: two of them. A shard decompresses
/// without yielding (no `.await` while a [`Permit`] is held), so one runs at a time today;
/// the budget keeps that a checked bound, not an accident of the code's shape.
pub const DECOMPRESSION_SHARD_BYTES_MAX: usize = 2 * DECOMPRESSION_BYTES_MAX;
/// Kafka's retriable code for "try again": the shard's budget is held by other batches.
const REQUEST_TIMED_OUT: i16 = 7;
/// The first read's buffer when decompressing (grown by doubling up to the bound).
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// xerial's snappy framing (`SnappyOutputStream`): magic, version 1, compatible version 1.
const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";
const XERIAL_HEADER_BYTES: usize = 16;
/// Headers per record and header name bytes Sluice's record format holds (u16 fields there).
const RECORD_HEADERS_MAX: usize = u16::MAX as usize;
const HEADER_NAME_BYTES_MAX: usize = u16::MAX as usize;

/// Kafka v2 batch fields (big-endian, Kafka's `DefaultRecordBatch`).
const LEADER_EPOCH_AT: usize = 12;
const CRC_AT: usize = 17;
const ATTRIBUTES_AT: usize = 21;
const BASE_TIMESTAMP_AT: usize = 27;
const PRODUCER_ID_AT: usize = 43;
const PRODUCER_EPOCH_AT: usize = 51;
const BASE_SEQUENCE_AT: usize = 53;
const RECORD_COUNT_AT: usize = 57;

/// Why compressed records could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecompressError {
    #[error("decompressed records exceed {limit_bytes} bytes")]
    TooLarge { limit_bytes: usize },
    #[error("corrupt {codec} data: {why}")]
    Corrupt { codec: &'static str, why: String },
    #[error("unknown compression codec {0}")]
    UnknownCodec(u8),
    #[error("decompression memory of this shard is in use ({held_bytes} of {limit_bytes} bytes)")]
    Busy {
        held_bytes: usize,
        limit_bytes: usize,
    },
    #[error("malformed Kafka batch: {0}")]
    Malformed(&'static str),
}

impl DecompressError {
    /// Kafka's code: a bomb is `INVALID_RECORD` (not retriable: the same bytes fail again),
    /// bad bytes `CORRUPT_MESSAGE` (Kafka's answer to a bad CRC), a busy shard a retriable
    /// timeout.
    pub fn kafka_code(&self) -> i16 {
        match self {
            DecompressError::TooLarge { .. } => code::INVALID_RECORD,
            DecompressError::Corrupt { .. } | DecompressError::Malformed(_) => {
                code::CORRUPT_MESSAGE
            }
            DecompressError::UnknownCodec(_) => code::UNSUPPORTED_COMPRESSION_TYPE,
            DecompressError::Busy { .. } => REQUEST_TIMED_OUT,
        }
    }
}

thread_local! {
    /// Bytes held by this shard's live [`Permit`]s (a shard is one thread).
    static HELD_BYTES: Cell<usize> = const { Cell::new(0) };
}

/// A share of the shard's decompression budget, returned when dropped.
#[derive(Debug)]
pub struct Permit {
    bytes: usize,
}

impl Permit {
    /// `bytes` of the shard's budget, or `Busy` if they are not free.
    pub fn take(bytes: usize) -> Result<Permit, DecompressError> {
        HELD_BYTES.with(|held| {
            let now = held.get();
            if now + bytes > DECOMPRESSION_SHARD_BYTES_MAX {
                return Err(DecompressError::Busy {
                    held_bytes: now,
                    limit_bytes: DECOMPRESSION_SHARD_BYTES_MAX,
                });
            }
            held.set(now + bytes);
            Ok(Permit { bytes })
        })
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        HELD_BYTES.with(|held| held.set(held.get() - self.bytes));
    }
}

/// Bytes held by this shard's decompressions now.
#[cfg(test)]
pub fn held_bytes() -> usize {
    HELD_BYTES.with(Cell::get)
}

fn codec_name(codec: u8) -> &'static str {
    match codec {
        1 => "gzip",
        2 => "snappy",
        3 => "lz4",
        4 => "zstd",
        _ => "unknown",
    }
}

fn corrupt(codec: u8, why: impl ToString) -> DecompressError {
    DecompressError::Corrupt {
        codec: codec_name(codec),
        why: why.to_string(),
    }
}

/// Reads `r` to its end into `out`, never holding more than `limit` bytes plus one: the
/// buffer grows by doubling up to `limit + 1`, and a byte past `limit` is a bomb.
fn read_bounded(
    mut r: impl Read,
    codec: u8,
    limit: usize,
    out: &mut Vec<u8>,
) -> Result<(), DecompressError> {
    let cap = limit.saturating_add(1);
    loop {
        if out.len() == out.capacity() {
            let want = (out.capacity() * 2).clamp(READ_CHUNK_BYTES, cap);
            if want <= out.len() {
                return Err(DecompressError::TooLarge { limit_bytes: limit });
            }
            out.reserve_exact(want - out.len());
        }
        let start = out.len();
        let end = out.capacity().min(cap);
        out.resize(end, 0);
        let n = match r.read(&mut out[start..end]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
            Err(e) => {
                out.truncate(start);
                return Err(corrupt(codec, e));
            }
        };
        out.truncate(start + n);
        if out.len() > limit {
            return Err(DecompressError::TooLarge { limit_bytes: limit });
        }
        if n == 0 && end > start {
            return Ok(());
        }
    }
}

/// xerial-framed snappy (blocks of `u32` length + raw snappy), or one raw snappy block when
/// the magic is absent (as Kafka's Java client reads both). Each block's stated length is
/// checked against what is left of `limit` before any byte is allocated for it.
fn snappy(input: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<(), DecompressError> {
    let mut decoder = snap::raw::Decoder::new();
    let mut block = |b: &[u8], out: &mut Vec<u8>| -> Result<(), DecompressError> {
        let n = snap::raw::decompress_len(b).map_err(|e| corrupt(2, e))?;
        if out.len() + n > limit {
            return Err(DecompressError::TooLarge { limit_bytes: limit });
        }
        let start = out.len();
        out.resize(start + n, 0);
        let got = decoder
            .decompress(b, &mut out[start..])
            .map_err(|e| corrupt(2, e))?;
        out.truncate(start + got);
        Ok(())
    };
    if !input.starts_with(XERIAL_MAGIC) {
        return block(input, out);
    }
    let mut rest = input
        .get(XERIAL_HEADER_BYTES..)
        .ok_or_else(|| corrupt(2, "truncated xerial header"))?;
    while !rest.is_empty() {
        let len = rest
            .get(..4)
            .map(|l| u32::from_be_bytes([l[0], l[1], l[2], l[3]]) as usize)
            .ok_or_else(|| corrupt(2, "truncated block length"))?;
        let b = rest
            .get(4..4 + len)
            .ok_or_else(|| corrupt(2, "truncated block"))?;
        block(b, out)?;
        rest = &rest[4 + len..];
    }
    Ok(())
}

/// `input`, compressed with Kafka codec `codec`, decompressed into at most `limit` bytes.
pub fn decompress(codec: u8, input: &[u8], limit: usize) -> Result<Vec<u8>, DecompressError> {
    let mut out = Vec::new();
    match codec {
        1 => read_bounded(
            flate2::read::MultiGzDecoder::new(input),
            codec,
            limit,
            &mut out,
        )?,
        2 => snappy(input, limit, &mut out)?,
        3 => read_bounded(
            lz4_flex::frame::FrameDecoder::new(input),
            codec,
            limit,
            &mut out,
        )?,
        4 => {
            let mut d =
                zstd::stream::read::Decoder::with_buffer(input).map_err(|e| corrupt(4, e))?;
            d.window_log_max(ZSTD_WINDOW_LOG_MAX)
                .map_err(|e| corrupt(4, e))?;
            read_bounded(d, codec, limit, &mut out)?
        }
        c => return Err(DecompressError::UnknownCodec(c)),
    }
    Ok(out)
}

/// One record of a Kafka batch, borrowed from its (decompressed) records.
pub struct KafkaRecord<'a> {
    pub timestamp_ms: i64,
    pub key: Option<&'a [u8]>,
    pub value: &'a [u8],
    /// `(name, value)`; a null value is empty.
    headers: Vec<(&'a [u8], &'a [u8])>,
}

/// A cursor over Kafka's varint-framed record fields.
struct Cursor<'a> {
    b: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn varlong(&mut self) -> Result<i64, DecompressError> {
        let mut v = 0u64;
        for i in 0..10 {
            let (&byte, rest) = self
                .b
                .split_first()
                .ok_or(DecompressError::Malformed("truncated varint"))?;
            self.b = rest;
            v |= u64::from(byte & 0x7F) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(((v >> 1) as i64) ^ -((v & 1) as i64));
            }
        }
        Err(DecompressError::Malformed("varint longer than 10 bytes"))
    }

    fn varint(&mut self) -> Result<i32, DecompressError> {
        i32::try_from(self.varlong()?)
            .map_err(|_| DecompressError::Malformed("varint out of range"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecompressError> {
        if n > self.b.len() {
            return Err(DecompressError::Malformed("field past the record's end"));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    /// Bytes of a length-prefixed field; `None` for length -1 (null).
    fn nullable(&mut self) -> Result<Option<&'a [u8]>, DecompressError> {
        match self.varint()? {
            -1 => Ok(None),
            n => {
                let n = usize::try_from(n)
                    .map_err(|_| DecompressError::Malformed("negative length"))?;
                self.take(n).map(Some)
            }
        }
    }
}

/// Walks `count` Kafka v2 records in `records` (Kafka's `DefaultRecord`), calling `f` with
/// each: lengths in bounds, offset deltas 0, 1, 2…, nothing left over, and only what Sluice's
/// record format can hold. Timestamps are `base_timestamp` plus the record's delta; a
/// negative one becomes `now_ms` (as for uncompressed batches).
pub fn walk_records<'a>(
    records: &'a [u8],
    count: u32,
    base_timestamp: i64,
    now_ms: i64,
    mut f: impl FnMut(KafkaRecord<'a>),
) -> Result<(), DecompressError> {
    let mut c = Cursor { b: records };
    for index in 0..count {
        let len = usize::try_from(c.varint()?)
            .map_err(|_| DecompressError::Malformed("negative record length"))?;
        let mut r = Cursor { b: c.take(len)? };
        r.take(1)?; // attributes: unused in v2
        let delta = r.varlong()?;
        if r.varint()? != index as i32 {
            return Err(DecompressError::Malformed("offset delta out of sequence"));
        }
        let key = r.nullable()?;
        let value = r.nullable()?.unwrap_or_default();
        let header_count = usize::try_from(r.varint()?)
            .map_err(|_| DecompressError::Malformed("negative header count"))?;
        if header_count > RECORD_HEADERS_MAX {
            return Err(DecompressError::Malformed(
                "more headers than a Sluice record holds",
            ));
        }
        // Each header takes two bytes at least: a count past the record's bytes is a lie, and
        // no vector is sized from it.
        let mut headers = Vec::with_capacity(header_count.min(r.b.len() / 2));
        for _ in 0..header_count {
            let name = r
                .nullable()?
                .ok_or(DecompressError::Malformed("null header name"))?;
            if name.len() > HEADER_NAME_BYTES_MAX {
                return Err(DecompressError::Malformed(
                    "header name longer than Sluice holds",
                ));
            }
            headers.push((name, r.nullable()?.unwrap_or_default()));
        }
        if !r.b.is_empty() {
            return Err(DecompressError::Malformed("trailing bytes in a record"));
        }
        let ts = base_timestamp.saturating_add(delta);
        f(KafkaRecord {
            timestamp_ms: if base_timestamp >= 0 && ts >= 0 {
                ts
            } else {
                now_ms
            },
            key,
            value,
            headers,
        });
    }
    if !c.b.is_empty() {
        return Err(DecompressError::Malformed(
            "bytes after the batch's last record",
        ));
    }
    Ok(())
}

fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// A Kafka batch's records, decompressed (under `permit`'s bound) or in place, walked with
/// `f`. `budget` is what is left of the bound for this batch's decompressed bytes.
fn with_records(
    k: &[u8],
    budget: &mut usize,
    now_ms: i64,
    f: impl FnMut(KafkaRecord<'_>),
) -> Result<(), DecompressError> {
    let codec = (u16::from_be_bytes([k[ATTRIBUTES_AT], k[ATTRIBUTES_AT + 1]]) & 0x7) as u8;
    let count = u32::try_from(be_i32(k, RECORD_COUNT_AT))
        .map_err(|_| DecompressError::Malformed("negative record count"))?;
    let base_ts = be_i64(k, BASE_TIMESTAMP_AT);
    let body = &k[KAFKA_BATCH_HEADER_BYTES..];
    if codec == 0 {
        return walk_records(body, count, base_ts, now_ms, f);
    }
    let data = decompress(codec, body, *budget)?;
    *budget -= data.len();
    walk_records(&data, count, base_ts, now_ms, f)
}

/// Checks a Kafka batch's CRC32C (over its attributes to its end, Kafka's coverage).
fn check_crc(k: &[u8]) -> Result<(), DecompressError> {
    let stored = u32::from_be_bytes(k[CRC_AT..CRC_AT + 4].try_into().expect("4 bytes"));
    if crc32c::crc32c(&k[ATTRIBUTES_AT..]) != stored {
        return Err(DecompressError::Malformed("CRC32C mismatch"));
    }
    Ok(())
}

/// The idempotent producer's sequence range of a batch, if it has one.
fn producer_of(k: &[u8], count: u32) -> Option<ProducerBatch> {
    let producer_id = be_i64(k, PRODUCER_ID_AT);
    let first_sequence = be_i32(k, BASE_SEQUENCE_AT);
    (producer_id >= 0 && first_sequence >= 0).then(|| ProducerBatch {
        producer_id,
        epoch: i16::from_be_bytes([k[PRODUCER_EPOCH_AT], k[PRODUCER_EPOCH_AT + 1]]),
        first_sequence,
        // Kafka's sequences wrap at i32::MAX.
        last_sequence: (i64::from(first_sequence) + i64::from(count) - 1) as i32,
    })
}

/// One compressed Kafka batch (framing checked by the caller: `records::from_kafka`) as the
/// batch Sluice stores: the producer's bytes behind a Sluice header, once its CRC32C and
/// records check. `Err` is Kafka's code.
pub fn take_compressed(k: &[u8], now_ms: i64) -> Result<(Vec<u8>, Option<ProducerBatch>), i16> {
    let (_, count) = batch::kafka_framing(k).map_err(|_| code::CORRUPT_MESSAGE)?;
    check_crc(k).map_err(|e| e.kafka_code())?;
    let _permit = Permit::take(DECOMPRESSION_BYTES_MAX).map_err(|e| e.kafka_code())?;
    let mut budget = DECOMPRESSED_BATCH_BYTES_MAX;
    let (mut first, mut max) = (None, i64::MIN);
    with_records(k, &mut budget, now_ms, |r| {
        first.get_or_insert(r.timestamp_ms);
        max = max.max(r.timestamp_ms);
    })
    .map_err(|e| {
        tracing::debug!(error = %e, "compressed Kafka batch refused");
        e.kafka_code()
    })?;
    let first = first.ok_or(code::CORRUPT_MESSAGE)?;
    let stored =
        batch::encode_kafka_compressed(k, first, max).map_err(|_| code::CORRUPT_MESSAGE)?;
    Ok((stored, producer_of(k, count)))
}

/// Several Kafka batches (some compressed; framing checked by the caller) as one batch of
/// Sluice records, decompressed: the bound covers all of them together.
pub fn to_sluice_records(
    bytes: &[u8],
    now_ms: i64,
) -> Result<(Vec<u8>, Option<ProducerBatch>), i16> {
    let _permit = Permit::take(DECOMPRESSION_BYTES_MAX).map_err(|e| e.kafka_code())?;
    let mut budget = DECOMPRESSED_BATCH_BYTES_MAX;
    let mut out = BatchBuilder::with_capacity(bytes.len());
    let mut producer: Option<ProducerBatch> = None;
    let mut at = 0;
    while at < bytes.len() {
        let len = usize::try_from(be_i32(bytes, at + 8)).map_err(|_| code::CORRUPT_MESSAGE)?;
        let k = &bytes[at..at + 12 + len];
        at += 12 + len;
        check_crc(k).map_err(|e| e.kafka_code())?;
        let count = u32::try_from(be_i32(k, RECORD_COUNT_AT)).map_err(|_| code::CORRUPT_MESSAGE)?;
        if out.record_count().saturating_add(count) > batch::BATCH_RECORDS_MAX {
            return Err(code::MESSAGE_TOO_LARGE);
        }
        with_records(k, &mut budget, now_ms, |r| {
            out.push_parts(r.timestamp_ms, r.key, r.value, r.headers.iter().copied())
        })
        .map_err(|e| e.kafka_code())?;
        if let Some(p) = producer_of(k, count) {
            match &mut producer {
                None => producer = Some(p),
                Some(q) => q.last_sequence = p.last_sequence,
            }
        }
    }
    let stored = out.finish().ok_or(code::INVALID_RECORD)?;
    Ok((stored, producer))
}

/// A stored batch as a Kafka consumer gets it: a Kafka-compressed batch's Kafka bytes with
/// the log's base offset (and leader epoch 0, as Sluice's other batches say), appended to
/// `out`. `false` for a batch of Sluice records (the caller encodes those).
pub fn serve_compressed(view: &BatchView<'_>, out: &mut bytes::BytesMut) -> bool {
    let Some(k) = view.kafka_batch() else {
        return false;
    };
    let start = out.len();
    out.extend_from_slice(k);
    let base = i64::try_from(view.header.base_offset).unwrap_or(i64::MAX);
    out[start..start + 8].copy_from_slice(&base.to_be_bytes());
    out[start + LEADER_EPOCH_AT..start + LEADER_EPOCH_AT + 4].copy_from_slice(&0i32.to_be_bytes());
    true
}

/// A stored batch with its records readable by Sluice: a Kafka-compressed one rewritten as
/// Sluice records (same base offset, term and count; a record's negative Kafka timestamp reads
/// as the batch's first), any other as it is. For the native protocol and every reader of
/// records; decompression is bounded as at produce.
pub fn sluice_records(stored: &Bytes) -> Result<Bytes, BatchError> {
    let view = BatchView::parse_verified_before(stored)?;
    let Some(k) = view.kafka_batch() else {
        return Ok(stored.clone());
    };
    let fail = |e: DecompressError| {
        tracing::warn!(error = %e, offset = view.header.base_offset, "a stored compressed batch could not be read");
        BatchError::MalformedKafkaBatch(
            "stored compressed records do not decompress within the bound",
        )
    };
    let _permit = Permit::take(DECOMPRESSION_BYTES_MAX).map_err(fail)?;
    let mut budget = DECOMPRESSED_BATCH_BYTES_MAX;
    let mut out = BatchBuilder::with_capacity(k.len());
    let first = view.header.first_timestamp_ms;
    with_records(k, &mut budget, first, |r| {
        out.push_parts(r.timestamp_ms, r.key, r.value, r.headers.iter().copied())
    })
    .map_err(fail)?;
    if out.record_count() != view.header.record_count {
        return Err(BatchError::MalformedKafkaBatch(
            "record count differs from the header's",
        ));
    }
    let mut plain = out.finish().ok_or(BatchError::Empty)?;
    batch::set_base_offset(&mut plain, view.header.base_offset);
    batch::set_term(&mut plain, view.header.term)?;
    Ok(Bytes::from(plain))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::records::from_kafka;
    use bytes::BytesMut;
    use kafka_protocol::indexmap::IndexMap;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{
        Compression, Record as KRecord, RecordBatchDecoder, RecordBatchEncoder,
        RecordEncodeOptions, TimestampType,
    };
    use rand::{Rng, SeedableRng};
    use std::io::Write;

    const CODECS: [u8; 4] = [1, 2, 3, 4];

    fn compress(codec: u8, data: &[u8]) -> Vec<u8> {
        match codec {
            1 => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(data).expect("gzip");
                e.finish().expect("gzip")
            }
            2 => {
                // xerial framing, as Kafka's Java client and librdkafka write it.
                let mut out = Vec::from(XERIAL_MAGIC);
                out.extend_from_slice(&1i32.to_be_bytes());
                out.extend_from_slice(&1i32.to_be_bytes());
                for block in data.chunks(32 * 1024) {
                    let c = snap::raw::Encoder::new()
                        .compress_vec(block)
                        .expect("snappy");
                    out.extend_from_slice(&(c.len() as u32).to_be_bytes());
                    out.extend_from_slice(&c);
                }
                out
            }
            3 => {
                let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
                e.write_all(data).expect("lz4");
                e.finish().expect("lz4")
            }
            4 => zstd::encode_all(data, 3).expect("zstd"),
            _ => unreachable!("codec {codec}"),
        }
    }

    fn record(i: i64, value: Vec<u8>) -> KRecord {
        let mut headers = IndexMap::new();
        headers.insert(
            StrBytes::from_static_str("h"),
            Some(Bytes::from(format!("hv{i}"))),
        );
        headers.insert(StrBytes::from_static_str("null"), None);
        KRecord {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: 9,
            producer_epoch: 1,
            timestamp_type: TimestampType::Creation,
            offset: i,
            sequence: 20 + i as i32,
            timestamp: 1_000 + i,
            key: (i % 2 == 0).then(|| Bytes::from(format!("k{i}"))),
            value: Some(Bytes::from(value)),
            headers,
        }
    }

    /// A Kafka batch of `records` as a client compresses it with `codec`: the plain batch's
    /// records section compressed, its attributes, length and CRC32C set again.
    fn kafka_batch(codec: u8, records: &[KRecord]) -> Vec<u8> {
        let mut plain = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        RecordBatchEncoder::encode(&mut plain, records.iter(), &options).expect("encode");
        with_payload(
            &plain,
            codec,
            &compress(codec, &plain[KAFKA_BATCH_HEADER_BYTES..]),
        )
    }

    /// `batch`'s header with `payload` as its records, codec `codec`, length and CRC fixed.
    fn with_payload(batch: &[u8], codec: u8, payload: &[u8]) -> Vec<u8> {
        let mut k = batch[..KAFKA_BATCH_HEADER_BYTES].to_vec();
        k.extend_from_slice(payload);
        let len = (k.len() - 12) as i32;
        k[8..12].copy_from_slice(&len.to_be_bytes());
        k[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&i16::from(codec).to_be_bytes());
        let crc = crc32c::crc32c(&k[ATTRIBUTES_AT..]);
        k[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        k
    }

    /// What a Kafka client reads from served bytes (kafka-protocol's decoder, with this
    /// file's decompressors).
    fn decode_served(served: &[u8]) -> Vec<KRecord> {
        let mut buf = Bytes::copy_from_slice(served);
        let f = |b: &mut Bytes, c: Compression| -> anyhow::Result<Bytes> {
            if let Compression::None = c {
                return Ok(b.split_to(b.len()));
            }
            decompress(c as u8, b, DECOMPRESSED_BATCH_BYTES_MAX)
                .map(Bytes::from)
                .map_err(|e| anyhow::anyhow!("{e}"))
        };
        RecordBatchDecoder::decode_with_custom_compression(&mut buf, Some(f))
            .expect("a Kafka client reads it")
            .records
    }

    fn seed() -> u64 {
        std::env::var("SLUICE_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random)
    }

    fn three() -> Vec<KRecord> {
        (0..3)
            .map(|i| record(i, format!("value {i} ").repeat(50).into_bytes()))
            .collect()
    }

    #[test]
    fn each_codec_is_stored_as_produced_served_as_stored_and_read_as_records() {
        for codec in CODECS {
            let k = kafka_batch(codec, &three());
            let (mut stored, producer) = from_kafka(&Bytes::from(k.clone()), 5).expect("taken");
            let view = BatchView::parse(&stored).expect("a Sluice batch");
            view.validate_records().expect("framing");
            assert_eq!(view.header.kafka_codec(), codec);
            assert_eq!(
                view.kafka_batch(),
                Some(&k[..]),
                "codec {codec}: stored as produced"
            );
            assert_eq!(
                (view.header.first_timestamp_ms, view.header.max_timestamp_ms),
                (1_000, 1_002)
            );
            let p = producer.expect("idempotent");
            assert_eq!(
                (p.producer_id, p.epoch, p.first_sequence, p.last_sequence),
                (9, 1, 20, 22)
            );
            batch::set_base_offset(&mut stored, 100);
            let stored = Bytes::from(stored);

            // Served to Kafka: the producer's bytes, with the log's offset.
            let served = crate::kafka::records::to_kafka(std::slice::from_ref(&stored), 101)
                .expect("served");
            assert_eq!(served.len(), k.len());
            assert_eq!(
                &served[KAFKA_BATCH_HEADER_BYTES..],
                &k[KAFKA_BATCH_HEADER_BYTES..]
            );
            let got = decode_served(&served);
            assert_eq!(got.len(), 3);
            for (i, r) in got.iter().enumerate() {
                let want = record(i as i64, format!("value {i} ").repeat(50).into_bytes());
                assert_eq!(r.offset, 100 + i as i64);
                assert_eq!(
                    (&r.key, &r.value, r.timestamp),
                    (&want.key, &want.value, want.timestamp)
                );
            }

            // Read by Sluice (native protocol, streams): Sluice records, same offsets.
            let plain = sluice_records(&stored).expect("decompressed");
            let pv = BatchView::parse(&plain).expect("a Sluice batch of records");
            pv.validate_records().expect("records");
            assert_eq!(pv.header.kafka_codec(), 0);
            let recs: Vec<_> = pv.records().map(|r| r.expect("record")).collect();
            assert_eq!(recs.len(), 3);
            assert_eq!(recs[2].offset, 102);
            assert_eq!(recs[0].key, Some(&b"k0"[..]));
            assert_eq!(recs[1].key, None);
            assert_eq!(recs[1].timestamp_ms, 1_001);
            assert_eq!(recs[2].value, "value 2 ".repeat(50).as_bytes());
            let headers: Vec<_> = recs[1].headers().collect();
            assert_eq!(
                headers,
                vec![(&b"h"[..], &b"hv1"[..]), (&b"null"[..], &b""[..])]
            );
            assert_eq!(held_bytes(), 0, "permits returned");
        }
    }

    #[test]
    fn a_bomb_is_an_invalid_record_and_holds_no_more_than_the_bound() {
        // One record whose value decompresses past the bound (a few KiB compressed).
        let huge = vec![b'a'; DECOMPRESSED_BATCH_BYTES_MAX + 1];
        for codec in CODECS {
            let k = kafka_batch(codec, &[record(0, huge.clone())]);
            // Snappy's best ratio is about 21:1; the others reach hundreds.
            assert!(
                k.len() < DECOMPRESSED_BATCH_BYTES_MAX / 16,
                "codec {codec}: {} bytes",
                k.len()
            );
            assert_eq!(
                from_kafka(&Bytes::from(k.clone()), 0).err(),
                Some(code::INVALID_RECORD),
                "codec {codec}"
            );
            assert_eq!(
                decompress(
                    codec,
                    &k[KAFKA_BATCH_HEADER_BYTES..],
                    DECOMPRESSED_BATCH_BYTES_MAX
                ),
                Err(DecompressError::TooLarge {
                    limit_bytes: DECOMPRESSED_BATCH_BYTES_MAX
                })
            );
            assert_eq!(held_bytes(), 0);
        }
        // Just under the bound is taken: the bound is where it says.
        let fits = vec![b'a'; DECOMPRESSED_BATCH_BYTES_MAX - 64];
        let k = kafka_batch(4, &[record(0, fits)]);
        assert!(from_kafka(&Bytes::from(k), 0).is_ok());
    }

    #[test]
    fn a_snappy_block_claiming_more_than_the_bound_is_refused_before_allocating() {
        // A raw snappy block whose length varint says 4 GiB: refused from the varint alone.
        let lie = [0xFF, 0xFF, 0xFF, 0xFF, 0x0F, 0x00];
        assert_eq!(
            decompress(2, &lie, DECOMPRESSED_BATCH_BYTES_MAX),
            Err(DecompressError::TooLarge {
                limit_bytes: DECOMPRESSED_BATCH_BYTES_MAX
            })
        );
    }

    #[test]
    fn corrupt_and_truncated_compressed_batches_are_corrupt_messages() {
        let seed = seed();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        for codec in CODECS {
            let k = kafka_batch(codec, &three());
            let payload = &k[KAFKA_BATCH_HEADER_BYTES..];
            // A flipped byte without a new CRC: the CRC catches it before any decompression.
            let mut flipped = k.clone();
            let at = KAFKA_BATCH_HEADER_BYTES + payload.len() / 2;
            flipped[at] ^= 0x40;
            assert_eq!(
                from_kafka(&Bytes::from(flipped), 0).err(),
                Some(code::CORRUPT_MESSAGE)
            );
            // A flipped header byte that decompression never reads (the max timestamp): only
            // the CRC tells.
            let mut stamp = k.clone();
            stamp[40] ^= 0x01;
            assert_eq!(
                from_kafka(&Bytes::from(stamp), 0).err(),
                Some(code::CORRUPT_MESSAGE),
                "codec {codec}: the CRC covers the header"
            );
            // Cut in half, with a CRC that matches: the decompressor (or the record walk)
            // catches it.
            let half = with_payload(&k, codec, &payload[..payload.len() / 2]);
            assert_eq!(
                from_kafka(&Bytes::from(half), 0).err(),
                Some(code::CORRUPT_MESSAGE),
                "codec {codec} truncated"
            );
            // Garbage with a valid CRC: refused with a typed code, never a panic.
            for _ in 0..50 {
                let n = rng.gen_range(0..200);
                let junk: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
                let bad = with_payload(&k, codec, &junk);
                let got = from_kafka(&Bytes::from(bad), 0).err();
                assert!(
                    matches!(got, Some(code::CORRUPT_MESSAGE | code::INVALID_RECORD)),
                    "codec {codec}: {got:?}; replay with SLUICE_SEED={seed}"
                );
            }
            // The header's record count one more than the records: the walk runs short.
            let mut more = k.clone();
            more[RECORD_COUNT_AT..RECORD_COUNT_AT + 4].copy_from_slice(&4i32.to_be_bytes());
            more[23..27].copy_from_slice(&3i32.to_be_bytes());
            let more = with_payload(&more, codec, payload);
            assert_eq!(
                from_kafka(&Bytes::from(more), 0).err(),
                Some(code::CORRUPT_MESSAGE)
            );
            // One fewer: records left over.
            let mut fewer = k.clone();
            fewer[RECORD_COUNT_AT..RECORD_COUNT_AT + 4].copy_from_slice(&2i32.to_be_bytes());
            fewer[23..27].copy_from_slice(&1i32.to_be_bytes());
            let fewer = with_payload(&fewer, codec, payload);
            assert_eq!(
                from_kafka(&Bytes::from(fewer), 0).err(),
                Some(code::CORRUPT_MESSAGE)
            );
            assert_eq!(held_bytes(), 0);
        }
    }

    #[test]
    fn a_shard_whose_budget_is_held_answers_retriably_then_takes_the_batch() {
        let k = Bytes::from(kafka_batch(1, &three()));
        let held = Permit::take(DECOMPRESSION_SHARD_BYTES_MAX).expect("the whole budget");
        assert_eq!(from_kafka(&k, 0).err(), Some(REQUEST_TIMED_OUT));
        drop(held);
        assert!(from_kafka(&k, 0).is_ok());
        // Two decompressions fit at once, a third does not.
        let a = Permit::take(DECOMPRESSION_BYTES_MAX).expect("first");
        let b = Permit::take(DECOMPRESSION_BYTES_MAX).expect("second");
        assert!(Permit::take(DECOMPRESSION_BYTES_MAX).is_err());
        drop((a, b));
        assert_eq!(held_bytes(), 0);
    }

    #[test]
    fn several_batches_with_compression_become_one_batch_of_sluice_records() {
        let mut bytes = kafka_batch(1, &three());
        let mut plain = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        let mut later = record(0, b"plain".to_vec());
        later.sequence = 23;
        RecordBatchEncoder::encode(&mut plain, [later].iter(), &options).expect("encode");
        bytes.extend_from_slice(&plain);
        let mut z = record(0, b"zstd".to_vec());
        z.sequence = 24;
        bytes.extend_from_slice(&kafka_batch(4, &[z]));
        let (stored, producer) = from_kafka(&Bytes::from(bytes), 0).expect("taken");
        let view = BatchView::parse(&stored).expect("Sluice batch");
        view.validate_records().expect("records");
        assert_eq!(view.header.kafka_codec(), 0);
        let values: Vec<Vec<u8>> = view
            .records()
            .map(|r| r.expect("record").value.to_vec())
            .collect();
        assert_eq!(values.len(), 5);
        assert_eq!(values[3], b"plain");
        assert_eq!(values[4], b"zstd");
        let p = producer.expect("idempotent");
        assert_eq!((p.first_sequence, p.last_sequence), (20, 24));
    }

    #[test]
    fn a_zstd_frame_asking_for_a_window_past_the_cap_is_refused() {
        // Level 22 with a long-distance window of 2^27 declares a window past the cap.
        let data = vec![7u8; 1 << 20];
        let mut e = zstd::stream::write::Encoder::new(Vec::new(), 1).expect("encoder");
        e.window_log(27).expect("window");
        e.long_distance_matching(true).expect("ldm");
        e.write_all(&data).expect("write");
        let frame = e.finish().expect("finish");
        assert!(matches!(
            decompress(4, &frame, DECOMPRESSED_BATCH_BYTES_MAX),
            Err(DecompressError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_stream_reader_gets_the_records_of_a_compressed_batch() {
        let k = kafka_batch(3, &three());
        let (mut stored, _) = from_kafka(&Bytes::from(k), 0).expect("taken");
        batch::set_base_offset(&mut stored, 7);
        let reply = crate::stream::FetchReply {
            batches: vec![Bytes::from(stored)],
            start_offset: 0,
            end_offset: 10,
            ..Default::default()
        };
        let got = reply.records(8).expect("decompressed");
        let offsets: Vec<u64> = got.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, vec![8, 9]);
        assert_eq!(got[1].record.key.as_deref(), Some(&b"k2"[..]));
    }
}
