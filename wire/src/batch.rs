//! The record-batch format: the unit of append, replication, checksum and transfer.
//!
//! A batch is written once by a producer, checksummed once, and then travels unchanged — to
//! disk, to replicas, to consumers. The log assigns two fields when it appends a batch, the
//! base offset and (from version 2) the term, the leader epoch that appended it; both lie
//! outside the checksum (as Kafka's CRC starts after the fields the broker assigns), so the
//! producer's checksum stays valid however they are stamped.
//!
//! All integers are little-endian. Version 2 (written by this code for batches of Sluice
//! records) is version 1 with the term after the fixed header; version 3 (written for
//! Kafka-compressed batches, below) is version 2's layout whose records section is a Kafka
//! batch:
//!
//! ```text
//! batch header (v2 and v3: 64 bytes; v1: 56 bytes, no term)
//!   0  u64  base_offset          assigned by the log; not covered by the checksum
//!   8  u32  batch_len            whole batch in bytes, header included
//!  12  u32  magic                "SLB1" (0x53 0x4C 0x42 0x31) in every version
//!  16  u64  checksum             xxh3-64, coverage below
//!  24  u8   format version       2 (or 1); 3 for a Kafka-compressed batch
//!  25  u8   reserved (0)
//!  26  u16  attributes           bit 0: control batch; bits 1-3: Kafka codec (below), not 0
//!                                in v3 and 0 in v1 and v2; other bits reserved (0)
//!  28  u32  record_count         >= 1
//!  32  i64  first_timestamp_ms
//!  40  i64  max_timestamp_ms
//!  48  u32  last_offset_delta    record_count - 1
//!  52  u32  reserved (0)
//!  56  u64  term                 v2 and v3: assigned by the log (0: no election, and every
//!                                v1 batch); not covered by the checksum
//! records (from byte 64; v1: 56), each:
//!   u32 record_len (bytes after this field) | u32 offset_delta | i64 timestamp_ms
//!   u32 key_len (0xFFFF_FFFF = no key) | key | u32 value_len | value
//!   u16 header_count | per header: u16 name_len | name | u32 value_len | value
//! ```
//!
//! The checksum covers every byte a producer decides, from the version byte to the end:
//! v1 bytes `[24, batch_len)`; v2 and v3 bytes `[24, 56)` then `[64, batch_len)` — all of it
//! but the term. Not covered: base offset and term (the log's), the checksum itself, and `batch_len`
//! and the magic, which are checked by structure instead (the length bounds the bytes hashed,
//! the magic is compared). A flipped version byte changes the bytes hashed (and the ranges),
//! so it fails the checksum as well.
//!
//! Readers take all three versions (a v1 batch reads with term 0); the log stores v2 and v3
//! only, and rewrites a v1 batch from an older producer as v2 at append ([`upgraded`]).
//!
//! **Kafka-compressed batches (v3).** When attribute bits 1-3 hold a codec number (Kafka's:
//! 1 gzip, 2 snappy, 3 lz4, 4 zstd), the records section is not Sluice records but one Kafka v2 record
//! batch exactly as a Kafka producer sent it (its 61-byte header, CRC32C and compressed
//! records): users compress for disk and replication, so the log keeps the compressed bytes
//! and the Kafka front end serves them as they are. The header's count and timestamps are
//! those of the Kafka records. This crate does not decompress: [`BatchView::records`] yields
//! [`BatchError::Compressed`], and [`BatchView::validate_records`] checks the Kafka batch's
//! framing (length, magic, codec, count), not its records, which the broker checked when it
//! took the batch (`broker/src/kafka/compression.rs` decompresses, with a byte bound).
//!
//! Such a batch is format version 3, so that a build that predates compressed batches refuses
//! it as a version it does not know instead of reading a Kafka batch as Sluice records (the
//! codec bits came first without a version bump). The version and the bits must agree: codec
//! bits on a v1 or v2 batch, or none on a v3 one, are refused
//! ([`BatchError::CodecVersionMismatch`]) — a reader never guesses which of the two it holds.
//! Batches of Sluice records stay v2, byte for byte as before.

use xxhash_rust::xxh3::{xxh3_64, Xxh3Default};

/// Why a batch failed to decode or verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("batch truncated: need {needed} bytes, have {available}")]
    Truncated { needed: usize, available: usize },
    #[error("bad batch magic {found:#010x}")]
    BadMagic { found: u32 },
    #[error("unsupported batch format version {0}")]
    UnsupportedVersion(u8),
    #[error("batch length {0} out of range")]
    BadLength(u32),
    #[error("batch checksum mismatch: stored {stored:#018x}, computed {computed:#018x}")]
    ChecksumMismatch { stored: u64, computed: u64 },
    #[error("malformed record {index} in batch: {why}")]
    MalformedRecord { index: u32, why: &'static str },
    #[error("batch has no records")]
    Empty,
    #[error("batch too large: {size_bytes} bytes, limit {limit_bytes}")]
    TooLarge {
        size_bytes: usize,
        limit_bytes: usize,
    },
    /// The records are a compressed Kafka batch: the broker decompresses them
    /// (`broker/src/kafka/compression.rs`), this crate does not.
    #[error("records compressed with Kafka codec {codec}: decompress the batch first")]
    Compressed { codec: u8 },
    #[error("malformed compressed Kafka batch: {0}")]
    MalformedKafkaBatch(&'static str),
    /// The version byte and the codec bits disagree (module docs): Kafka codec bits on a v1 or
    /// v2 batch, or none on a v3 batch.
    #[error(
        "batch format version {version} with Kafka codec {codec}: v3 holds a codec, v1 and v2 none"
    )]
    CodecVersionMismatch { version: u8, codec: u8 },
}

pub const BATCH_MAGIC: u32 = u32::from_le_bytes(*b"SLB1");
/// The version new batches of Sluice records are written in.
pub const BATCH_FORMAT_VERSION: u8 = 2;
/// The version of a Kafka-compressed batch (module docs): v2's layout, a Kafka batch for
/// records, the codec in attribute bits 1-3.
pub const BATCH_FORMAT_VERSION_KAFKA_COMPRESSED: u8 = 3;
/// The newest version this code reads.
pub const BATCH_FORMAT_VERSION_MAX: u8 = BATCH_FORMAT_VERSION_KAFKA_COMPRESSED;
/// The first version: no term; still read (segments written before v2 hold it).
pub const BATCH_FORMAT_VERSION_V1: u8 = 1;
/// Header bytes of the current versions (v2 and v3).
pub const BATCH_HEADER_BYTES: usize = 64;
/// Header bytes of a v1 batch.
pub const BATCH_HEADER_BYTES_V1: usize = 56;
/// The fewest bytes that hold the part of a header every version shares (through the version
/// byte and record count): what a reader needs before it knows the version.
pub const BATCH_HEADER_BYTES_MIN: usize = BATCH_HEADER_BYTES_V1;
/// Where a v2 or v3 batch's term lies (8 bytes, outside the checksum).
const TERM_AT: usize = 56;
/// Bytes of a record that precede its key.
const RECORD_FIXED_BYTES: usize = 4 + 4 + 8 + 4;
const NO_KEY: u32 = u32::MAX;
const CHECKSUM_START: usize = 24;
pub const ATTR_CONTROL: u16 = 1;
/// Attribute bits 1-3: the Kafka codec of a Kafka-compressed batch (module docs), 0 for none.
pub const ATTR_KAFKA_CODEC_MASK: u16 = 0b1110;
const ATTR_KAFKA_CODEC_SHIFT: u16 = 1;
/// The largest Kafka codec number (zstd).
pub const KAFKA_CODEC_MAX: u8 = 4;
/// Kafka v2 batch layout (big-endian; Kafka's `DefaultRecordBatch`): the fields
/// [`BatchView::validate_records`] checks in a Kafka-compressed batch.
pub const KAFKA_BATCH_HEADER_BYTES: usize = 61;
const KAFKA_LENGTH_AT: usize = 8;
const KAFKA_MAGIC_AT: usize = 16;
const KAFKA_ATTRIBUTES_AT: usize = 21;
const KAFKA_LAST_OFFSET_DELTA_AT: usize = 23;
const KAFKA_RECORD_COUNT_AT: usize = 57;
/// A batch may not hold more records than this (bounds per-batch work and allocation).
pub const BATCH_RECORDS_MAX: u32 = 1 << 20;

/// One record as a producer hands it over.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    pub timestamp_ms: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Record {
    pub fn new(timestamp_ms: i64, value: impl Into<Vec<u8>>) -> Self {
        Record {
            timestamp_ms,
            key: None,
            value: value.into(),
            headers: Vec::new(),
        }
    }

    fn encoded_len(&self) -> usize {
        RECORD_FIXED_BYTES
            + self.key.as_ref().map_or(0, Vec::len)
            + 4
            + self.value.len()
            + 2
            + self
                .headers
                .iter()
                .map(|(k, v)| 2 + k.len() + 4 + v.len())
                .sum::<usize>()
    }
}

/// Encodes records into one batch.
#[derive(Debug)]
pub struct BatchBuilder {
    buf: Vec<u8>,
    count: u32,
    first_ts: i64,
    max_ts: i64,
    attributes: u16,
}

impl Default for BatchBuilder {
    /// The same as [`BatchBuilder::new`] (room for the header included).
    fn default() -> Self {
        BatchBuilder::new()
    }
}

impl BatchBuilder {
    pub fn new() -> Self {
        let mut buf = Vec::with_capacity(BATCH_HEADER_BYTES + 256);
        buf.resize(BATCH_HEADER_BYTES, 0);
        BatchBuilder {
            buf,
            count: 0,
            first_ts: 0,
            max_ts: i64::MIN,
            attributes: 0,
        }
    }

    /// An empty batch with room for `bytes` of records (the header's room comes on top), so
    /// that a batch of known size is encoded without growing (and copying) its buffer.
    pub fn with_capacity(bytes: usize) -> Self {
        let mut b = BatchBuilder::new();
        b.buf.reserve(bytes);
        b
    }

    /// Appends a record without key or headers whose value `encode` writes straight into the
    /// batch (it must only append to the buffer it is given): the same bytes as
    /// [`push_parts`](Self::push_parts) with that value, without encoding it elsewhere first.
    pub fn push_value_with(&mut self, timestamp_ms: i64, encode: impl FnOnce(&mut Vec<u8>)) {
        let b = &mut self.buf;
        let start = b.len();
        // The record's length and the value's are written once the value is there.
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&self.count.to_le_bytes());
        b.extend_from_slice(&timestamp_ms.to_le_bytes());
        b.extend_from_slice(&NO_KEY.to_le_bytes());
        let value_len_at = b.len();
        b.extend_from_slice(&0u32.to_le_bytes());
        encode(b);
        assert!(
            b.len() >= value_len_at + 4,
            "a record's encoder appends to the batch"
        );
        let value_len = b.len() - value_len_at - 4;
        b.extend_from_slice(&0u16.to_le_bytes());
        let body_len = b.len() - start - 4;
        b[start..start + 4].copy_from_slice(
            &u32::try_from(body_len)
                .expect("record < 4 GiB")
                .to_le_bytes(),
        );
        b[value_len_at..value_len_at + 4].copy_from_slice(
            &u32::try_from(value_len)
                .expect("value < 4 GiB")
                .to_le_bytes(),
        );
        self.counted(timestamp_ms);
    }

    /// Counts a record just appended, at `timestamp_ms`.
    fn counted(&mut self, timestamp_ms: i64) {
        if self.count == 0 {
            self.first_ts = timestamp_ms;
        }
        self.max_ts = self.max_ts.max(timestamp_ms);
        self.count += 1;
    }

    /// Marks the batch as a control batch (log-internal records, e.g. queue state changes).
    pub fn control(mut self) -> Self {
        self.attributes |= ATTR_CONTROL;
        self
    }

    pub fn len_bytes(&self) -> usize {
        self.buf.len()
    }

    pub fn record_count(&self) -> u32 {
        self.count
    }

    /// Appends a record. Panics only if a field exceeds the format's u32/u16 ranges, which
    /// callers bound long before (message size limits are far below 4 GiB).
    pub fn push(&mut self, r: &Record) {
        self.push_parts(
            r.timestamp_ms,
            r.key.as_deref(),
            &r.value,
            r.headers.iter().map(|(k, v)| (k.as_slice(), v.as_slice())),
        );
    }

    pub fn push_parts<'a>(
        &mut self,
        timestamp_ms: i64,
        key: Option<&[u8]>,
        value: &[u8],
        headers: impl Iterator<Item = (&'a [u8], &'a [u8])> + Clone,
    ) {
        let headers_len: usize = headers
            .clone()
            .map(|(k, v)| 2 + k.len() + 4 + v.len())
            .sum();
        let header_count = headers.clone().count();
        let body_len =
            RECORD_FIXED_BYTES - 4 + key.map_or(0, <[u8]>::len) + 4 + value.len() + 2 + headers_len;
        let b = &mut self.buf;
        b.reserve(body_len + 4);
        b.extend_from_slice(
            &u32::try_from(body_len)
                .expect("record < 4 GiB")
                .to_le_bytes(),
        );
        b.extend_from_slice(&self.count.to_le_bytes());
        b.extend_from_slice(&timestamp_ms.to_le_bytes());
        match key {
            Some(k) => {
                b.extend_from_slice(&u32::try_from(k.len()).expect("key < 4 GiB").to_le_bytes());
                b.extend_from_slice(k);
            }
            None => b.extend_from_slice(&NO_KEY.to_le_bytes()),
        }
        b.extend_from_slice(
            &u32::try_from(value.len())
                .expect("value < 4 GiB")
                .to_le_bytes(),
        );
        b.extend_from_slice(value);
        b.extend_from_slice(
            &u16::try_from(header_count)
                .expect("header count < 65536")
                .to_le_bytes(),
        );
        for (k, v) in headers {
            b.extend_from_slice(
                &u16::try_from(k.len())
                    .expect("header name < 64 KiB")
                    .to_le_bytes(),
            );
            b.extend_from_slice(k);
            b.extend_from_slice(
                &u32::try_from(v.len())
                    .expect("header value < 4 GiB")
                    .to_le_bytes(),
            );
            b.extend_from_slice(v);
        }
        self.counted(timestamp_ms);
    }

    /// Seals the batch: fills the header and computes the checksum. `None` if it is empty.
    pub fn finish(mut self) -> Option<Vec<u8>> {
        if self.count == 0 {
            return None;
        }
        let len = u32::try_from(self.buf.len()).expect("batch < 4 GiB");
        let h = &mut self.buf[..BATCH_HEADER_BYTES];
        h[0..8].copy_from_slice(&0u64.to_le_bytes());
        h[8..12].copy_from_slice(&len.to_le_bytes());
        h[12..16].copy_from_slice(&BATCH_MAGIC.to_le_bytes());
        h[24] = BATCH_FORMAT_VERSION;
        h[25] = 0;
        h[26..28].copy_from_slice(&self.attributes.to_le_bytes());
        h[28..32].copy_from_slice(&self.count.to_le_bytes());
        h[32..40].copy_from_slice(&self.first_ts.to_le_bytes());
        h[40..48].copy_from_slice(&self.max_ts.to_le_bytes());
        h[48..52].copy_from_slice(&(self.count - 1).to_le_bytes());
        h[52..56].copy_from_slice(&0u32.to_le_bytes());
        h[TERM_AT..TERM_AT + 8].copy_from_slice(&0u64.to_le_bytes());
        let sum = checksum(&self.buf, BATCH_FORMAT_VERSION);
        self.buf[16..24].copy_from_slice(&sum.to_le_bytes());
        Some(self.buf)
    }
}

/// A Kafka-compressed batch (module docs): `kafka_batch`, one Kafka v2 batch as a producer
/// sent it, behind a Sluice header with its codec, record count and timestamps. The caller
/// has checked the Kafka batch (CRC32C, records, count); this checks its framing again.
pub fn encode_kafka_compressed(
    kafka_batch: &[u8],
    first_timestamp_ms: i64,
    max_timestamp_ms: i64,
) -> Result<Vec<u8>, BatchError> {
    let (codec, count) = kafka_framing(kafka_batch)?;
    if count == 0 || count > BATCH_RECORDS_MAX {
        return Err(BatchError::MalformedKafkaBatch("record count out of range"));
    }
    let len = BATCH_HEADER_BYTES + kafka_batch.len();
    let len32 = u32::try_from(len).map_err(|_| BatchError::TooLarge {
        size_bytes: len,
        limit_bytes: u32::MAX as usize,
    })?;
    let mut buf = Vec::with_capacity(len);
    buf.resize(BATCH_HEADER_BYTES, 0);
    buf.extend_from_slice(kafka_batch);
    let h = &mut buf[..BATCH_HEADER_BYTES];
    h[8..12].copy_from_slice(&len32.to_le_bytes());
    h[12..16].copy_from_slice(&BATCH_MAGIC.to_le_bytes());
    h[24] = BATCH_FORMAT_VERSION_KAFKA_COMPRESSED;
    let attributes = u16::from(codec) << ATTR_KAFKA_CODEC_SHIFT;
    h[26..28].copy_from_slice(&attributes.to_le_bytes());
    h[28..32].copy_from_slice(&count.to_le_bytes());
    h[32..40].copy_from_slice(&first_timestamp_ms.to_le_bytes());
    h[40..48].copy_from_slice(&max_timestamp_ms.to_le_bytes());
    h[48..52].copy_from_slice(&(count - 1).to_le_bytes());
    let sum = checksum(&buf, BATCH_FORMAT_VERSION_KAFKA_COMPRESSED);
    buf[16..24].copy_from_slice(&sum.to_le_bytes());
    Ok(buf)
}

/// A Kafka v2 batch's codec and record count, once its framing holds: length field equal to
/// its bytes, magic 2, a codec Sluice knows (not 0: uncompressed batches are stored as Sluice
/// records), last offset delta = count - 1. Nothing is decompressed.
pub fn kafka_framing(k: &[u8]) -> Result<(u8, u32), BatchError> {
    let bad = BatchError::MalformedKafkaBatch;
    if k.len() < KAFKA_BATCH_HEADER_BYTES {
        return Err(bad("shorter than a Kafka batch header"));
    }
    let be32 = |at: usize| u32::from_be_bytes(k[at..at + 4].try_into().expect("4 bytes"));
    if be32(KAFKA_LENGTH_AT) as usize != k.len() - 12 {
        return Err(bad("Kafka batch length differs from its bytes"));
    }
    if k[KAFKA_MAGIC_AT] != 2 {
        return Err(bad("Kafka batch magic is not 2"));
    }
    let attributes = u16::from_be_bytes([k[KAFKA_ATTRIBUTES_AT], k[KAFKA_ATTRIBUTES_AT + 1]]);
    let codec = (attributes & 0x7) as u8;
    if codec == 0 || codec > KAFKA_CODEC_MAX {
        return Err(bad("Kafka batch codec unknown or none"));
    }
    let count = be32(KAFKA_RECORD_COUNT_AT);
    if count == 0 || be32(KAFKA_LAST_OFFSET_DELTA_AT) != count - 1 {
        return Err(bad(
            "Kafka batch record count and last offset delta disagree",
        ));
    }
    Ok((codec, count))
}

/// Encodes records into a finished batch (`None` if `records` is empty).
pub fn encode(records: &[Record]) -> Option<Vec<u8>> {
    let mut b = BatchBuilder::new();
    b.buf
        .reserve(records.iter().map(Record::encoded_len).sum::<usize>());
    for r in records {
        b.push(r);
    }
    b.finish()
}

/// The checksum of a whole batch (`batch` is exactly `batch_len` bytes) in format `version`:
/// see the module's table for the bytes each version covers.
fn checksum(batch: &[u8], version: u8) -> u64 {
    if version == BATCH_FORMAT_VERSION_V1 {
        xxh3_64(&batch[CHECKSUM_START..])
    } else {
        // One pass over two ranges: the same hash as one over the bytes laid end to end.
        // The streaming state costs ~13-15 ns a batch more than one range at 120 B-1 KiB and
        // nothing measurable from 64 KiB (release build, this machine, under load): noise
        // beside a message's microseconds.
        let mut h = Xxh3Default::new();
        h.update(&batch[CHECKSUM_START..TERM_AT]);
        h.update(&batch[TERM_AT + 8..]);
        h.digest()
    }
}

/// Whether `batch` (at least its `batch_len` bytes) holds the checksum its header states, over
/// the bytes its version byte says are covered, whatever else in the header is refused. A torn
/// write does not leave a matching checksum: recovery tells a batch refused by its version
/// (written whole, by another build) from a torn tail this way.
pub fn checksum_holds(batch: &[u8]) -> bool {
    if batch.len() < BATCH_HEADER_BYTES_MIN {
        return false;
    }
    let version = batch[24];
    let len = u32_at(batch, 8) as usize;
    match header_bytes_of(version) {
        Some(header_bytes) if len >= header_bytes && len <= batch.len() => {
            checksum(&batch[..len], version) == u64_at(batch, 16)
        }
        _ => false,
    }
}

/// The header bytes of format `version`, or `None` for a version this code does not know.
fn header_bytes_of(version: u8) -> Option<usize> {
    match version {
        BATCH_FORMAT_VERSION_V1 => Some(BATCH_HEADER_BYTES_V1),
        BATCH_FORMAT_VERSION | BATCH_FORMAT_VERSION_KAFKA_COMPRESSED => Some(BATCH_HEADER_BYTES),
        _ => None,
    }
}

/// The fixed header of a batch, parsed but not yet verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: u64,
    pub batch_len: u32,
    pub checksum: u64,
    /// The format version (1, 2, or 3 for a Kafka-compressed batch).
    pub version: u8,
    /// The leader epoch that appended the batch (0 for a v1 batch, and for a log with no
    /// elections: the single-node log).
    pub term: u64,
    pub attributes: u16,
    pub record_count: u32,
    pub first_timestamp_ms: i64,
    pub max_timestamp_ms: i64,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl BatchHeader {
    /// Parses the header at the start of `b` (either version), checking magic, version, length
    /// and count.
    pub fn parse(b: &[u8]) -> Result<BatchHeader, BatchError> {
        if b.len() < BATCH_HEADER_BYTES_MIN {
            return Err(BatchError::Truncated {
                needed: BATCH_HEADER_BYTES_MIN,
                available: b.len(),
            });
        }
        let magic = u32_at(b, 12);
        if magic != BATCH_MAGIC {
            return Err(BatchError::BadMagic { found: magic });
        }
        let version = b[24];
        let header_bytes =
            header_bytes_of(version).ok_or(BatchError::UnsupportedVersion(version))?;
        if b.len() < header_bytes {
            return Err(BatchError::Truncated {
                needed: header_bytes,
                available: b.len(),
            });
        }
        let h = BatchHeader {
            base_offset: u64_at(b, 0),
            batch_len: u32_at(b, 8),
            checksum: u64_at(b, 16),
            version,
            term: if version == BATCH_FORMAT_VERSION_V1 {
                0
            } else {
                u64_at(b, TERM_AT)
            },
            attributes: u16_at(b, 26),
            record_count: u32_at(b, 28),
            first_timestamp_ms: u64_at(b, 32) as i64,
            max_timestamp_ms: u64_at(b, 40) as i64,
        };
        if (h.batch_len as usize) < header_bytes {
            return Err(BatchError::BadLength(h.batch_len));
        }
        if h.record_count == 0 {
            return Err(BatchError::Empty);
        }
        if h.record_count > BATCH_RECORDS_MAX || u32_at(b, 48) != h.record_count - 1 {
            return Err(BatchError::BadLength(h.batch_len));
        }
        // Codec bits only in v3, and always there: a batch from before v3 with codec bits
        // (the build that added them without the bump) is not read by guessing.
        let codec = h.kafka_codec();
        if (codec != 0) != (version == BATCH_FORMAT_VERSION_KAFKA_COMPRESSED) {
            return Err(BatchError::CodecVersionMismatch { version, codec });
        }
        Ok(h)
    }

    /// Bytes of this batch's header (where its records begin).
    pub fn header_bytes(&self) -> usize {
        header_bytes_of(self.version).expect("a parsed header has a known version")
    }

    /// Whether the log rewrites this batch before storing it ([`upgraded`]): only v1 does.
    pub fn needs_upgrade(&self) -> bool {
        self.version == BATCH_FORMAT_VERSION_V1
    }

    pub fn last_offset(&self) -> u64 {
        self.base_offset + u64::from(self.record_count) - 1
    }

    pub fn next_offset(&self) -> u64 {
        self.base_offset + u64::from(self.record_count)
    }

    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }

    /// The Kafka codec of a Kafka-compressed batch (1 gzip, 2 snappy, 3 lz4, 4 zstd), 0 for a
    /// batch of Sluice records.
    pub fn kafka_codec(&self) -> u8 {
        ((self.attributes & ATTR_KAFKA_CODEC_MASK) >> ATTR_KAFKA_CODEC_SHIFT) as u8
    }
}

/// A verified batch borrowed from a buffer.
#[derive(Debug, Clone, Copy)]
pub struct BatchView<'a> {
    pub header: BatchHeader,
    pub bytes: &'a [u8],
}

impl<'a> BatchView<'a> {
    /// Parses and verifies the batch at the start of `b` (header, length, checksum).
    /// Record structure is checked by [`BatchView::validate_records`], which untrusted input
    /// from producers must pass before it is appended.
    pub fn parse(b: &'a [u8]) -> Result<BatchView<'a>, BatchError> {
        let view = Self::parse_verified_before(b)?;
        let computed = checksum(view.bytes, view.header.version);
        if computed != view.header.checksum {
            return Err(BatchError::ChecksumMismatch {
                stored: view.header.checksum,
                computed,
            });
        }
        Ok(view)
    }

    /// [`BatchView::parse`] without the checksum, for bytes this process verified (or built)
    /// before and kept in memory since: a log's cache of what it appended. Header and length are
    /// still checked, so a caller's bug surfaces as an error, not as a wrong read. Bytes from a
    /// disk or a peer go through [`BatchView::parse`].
    pub fn parse_verified_before(b: &'a [u8]) -> Result<BatchView<'a>, BatchError> {
        let header = BatchHeader::parse(b)?;
        let len = header.batch_len as usize;
        if b.len() < len {
            return Err(BatchError::Truncated {
                needed: len,
                available: b.len(),
            });
        }
        Ok(BatchView {
            header,
            bytes: &b[..len],
        })
    }

    /// Checks that the records fill the batch exactly, with consecutive offset deltas and
    /// in-bounds lengths, and that the header's timestamps match them.
    pub fn validate_records(&self) -> Result<(), BatchError> {
        if self.header.kafka_codec() != 0 {
            return self.validate_kafka_compressed();
        }
        let mut n = 0u32;
        let mut first = None;
        let mut max = i64::MIN;
        for r in self.records() {
            let r = r?;
            first.get_or_insert(r.timestamp_ms);
            max = max.max(r.timestamp_ms);
            n += 1;
        }
        if n != self.header.record_count {
            return Err(BatchError::MalformedRecord {
                index: n,
                why: "record count does not match header",
            });
        }
        if first != Some(self.header.first_timestamp_ms) || max != self.header.max_timestamp_ms {
            return Err(BatchError::MalformedRecord {
                index: 0,
                why: "header timestamps do not match records",
            });
        }
        Ok(())
    }

    /// A Kafka-compressed batch's framing: a codec Sluice knows on a data batch, and one
    /// Kafka v2 batch filling the records section with that codec and the header's count.
    fn validate_kafka_compressed(&self) -> Result<(), BatchError> {
        let bad = BatchError::MalformedKafkaBatch;
        let codec = self.header.kafka_codec();
        if codec > KAFKA_CODEC_MAX || self.header.is_control() {
            return Err(bad("codec unknown, or on a control batch"));
        }
        let (kafka_codec, count) = kafka_framing(self.kafka_batch().unwrap_or_default())?;
        if kafka_codec != codec || count != self.header.record_count {
            return Err(bad("Kafka batch codec or count differs from the header's"));
        }
        Ok(())
    }

    /// The Kafka v2 batch a Kafka-compressed batch holds (module docs), `None` for a batch
    /// of Sluice records.
    pub fn kafka_batch(&self) -> Option<&'a [u8]> {
        (self.header.kafka_codec() != 0).then(|| &self.bytes[self.header.header_bytes()..])
    }

    /// The records, in order; a Kafka-compressed batch yields [`BatchError::Compressed`]
    /// (the broker decompresses those).
    pub fn records(&self) -> RecordIter<'a> {
        let codec = self.header.kafka_codec();
        RecordIter {
            rest: &self.bytes[self.header.header_bytes()..],
            index: 0,
            base_offset: self.header.base_offset,
            failed: false,
            compressed: codec,
        }
    }

    /// The records a state machine applies: those of a data batch, none of a control batch.
    /// A control batch takes offsets in the log but carries no user or engine record: a Raft
    /// no-op or membership entry (one per new leader term or membership change, stored in the
    /// partition's log, which is the Raft log), or a transaction marker. Every replay of a log
    /// (queue engine, catalog, groups, a queue read as a stream) reads through this.
    pub fn data_records(&self) -> RecordIter<'a> {
        if self.header.is_control() {
            RecordIter {
                rest: &[],
                index: 0,
                base_offset: self.header.base_offset,
                failed: false,
                compressed: 0,
            }
        } else {
            self.records()
        }
    }
}

/// A record borrowed from a verified batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordView<'a> {
    pub offset: u64,
    pub timestamp_ms: i64,
    pub key: Option<&'a [u8]>,
    pub value: &'a [u8],
    headers: &'a [u8],
    header_count: u16,
}

impl<'a> RecordView<'a> {
    pub fn headers(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        let mut rest = self.headers;
        (0..self.header_count).map(move |_| {
            // Bounds were checked when the record was parsed.
            let kl = u16_at(rest, 0) as usize;
            let k = &rest[2..2 + kl];
            let vl = u32_at(rest, 2 + kl) as usize;
            let v = &rest[6 + kl..6 + kl + vl];
            rest = &rest[6 + kl + vl..];
            (k, v)
        })
    }

    pub fn to_owned_record(&self) -> Record {
        Record {
            timestamp_ms: self.timestamp_ms,
            key: self.key.map(<[u8]>::to_vec),
            value: self.value.to_vec(),
            headers: self
                .headers()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect(),
        }
    }
}

pub struct RecordIter<'a> {
    rest: &'a [u8],
    index: u32,
    base_offset: u64,
    failed: bool,
    /// The Kafka codec of a compressed batch: one [`BatchError::Compressed`], then nothing.
    compressed: u8,
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = Result<RecordView<'a>, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.rest.is_empty() {
            return None;
        }
        if self.compressed != 0 {
            self.failed = true;
            return Some(Err(BatchError::Compressed {
                codec: self.compressed,
            }));
        }
        let r = parse_record(self.rest, self.index);
        match r {
            Ok((mut view, used)) => {
                let Some(offset) = self.base_offset.checked_add(u64::from(self.index)) else {
                    self.failed = true;
                    return Some(Err(BatchError::MalformedRecord {
                        index: self.index,
                        why: "offset past the largest u64",
                    }));
                };
                view.offset = offset;
                self.rest = &self.rest[used..];
                self.index += 1;
                Some(Ok(view))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

fn parse_record(b: &[u8], index: u32) -> Result<(RecordView<'_>, usize), BatchError> {
    let bad = |why| BatchError::MalformedRecord { index, why };
    if b.len() < 4 {
        return Err(bad("truncated record length"));
    }
    let body_len = u32_at(b, 0) as usize;
    let total = 4usize.checked_add(body_len).ok_or(bad("length overflow"))?;
    if total > b.len() || body_len < RECORD_FIXED_BYTES - 4 + 4 + 2 {
        return Err(bad("record length out of bounds"));
    }
    let r = &b[4..total];
    if u32_at(r, 0) != index {
        return Err(bad("offset delta out of sequence"));
    }
    let timestamp_ms = u64_at(r, 4) as i64;
    let mut at = 12;
    let key_len = u32_at(r, at);
    at += 4;
    let key = if key_len == NO_KEY {
        None
    } else {
        let end = at
            .checked_add(key_len as usize)
            .filter(|e| *e + 4 <= r.len())
            .ok_or(bad("key length out of bounds"))?;
        let k = &r[at..end];
        at = end;
        Some(k)
    };
    if at + 4 > r.len() {
        return Err(bad("value length out of bounds"));
    }
    let value_len = u32_at(r, at) as usize;
    at += 4;
    let vend = at
        .checked_add(value_len)
        .filter(|e| *e + 2 <= r.len())
        .ok_or(bad("value length out of bounds"))?;
    let value = &r[at..vend];
    at = vend;
    let header_count = u16_at(r, at);
    at += 2;
    let headers_start = at;
    for _ in 0..header_count {
        if at + 2 > r.len() {
            return Err(bad("header name length out of bounds"));
        }
        let kl = u16_at(r, at) as usize;
        at += 2 + kl;
        if at + 4 > r.len() {
            return Err(bad("header value length out of bounds"));
        }
        let vl = u32_at(r, at) as usize;
        at = (at + 4)
            .checked_add(vl)
            .filter(|e| *e <= r.len())
            .ok_or(bad("header value out of bounds"))?;
    }
    if at != r.len() {
        return Err(bad("trailing bytes in record"));
    }
    Ok((
        RecordView {
            offset: 0,
            timestamp_ms,
            key,
            value,
            headers: &r[headers_start..at],
            header_count,
        },
        total,
    ))
}

/// Overwrites the base offset of an encoded batch (either version; the log assigns it).
pub fn set_base_offset(batch: &mut [u8], base_offset: u64) {
    batch[0..8].copy_from_slice(&base_offset.to_le_bytes());
}

/// Overwrites the term of an encoded v2 or v3 batch (the log stamps it at append, beside the
/// base offset; the checksum does not cover it). A v1 batch has no room for one: bring it to
/// the current format with [`upgraded`] first.
pub fn set_term(batch: &mut [u8], term: u64) -> Result<(), BatchError> {
    if batch.len() < BATCH_HEADER_BYTES {
        return Err(BatchError::Truncated {
            needed: BATCH_HEADER_BYTES,
            available: batch.len(),
        });
    }
    if !matches!(
        batch[24],
        BATCH_FORMAT_VERSION | BATCH_FORMAT_VERSION_KAFKA_COMPRESSED
    ) {
        return Err(BatchError::UnsupportedVersion(batch[24]));
    }
    batch[TERM_AT..TERM_AT + 8].copy_from_slice(&term.to_le_bytes());
    Ok(())
}

/// A verified batch in a format the log stores: a copy of a v2 or v3 batch, or a v1 batch
/// rewritten as v2 (term 0, the same records, its checksum computed over the new layout: the one time the
/// log recomputes a checksum, for a producer that predates v2, after verifying the old one).
pub fn upgraded(view: &BatchView<'_>) -> Vec<u8> {
    if !view.header.needs_upgrade() {
        return view.bytes.to_vec();
    }
    debug_assert_eq!(view.header.version, BATCH_FORMAT_VERSION_V1);
    let b = view.bytes;
    let mut out = Vec::with_capacity(b.len() + BATCH_HEADER_BYTES - BATCH_HEADER_BYTES_V1);
    out.extend_from_slice(&b[..BATCH_HEADER_BYTES_V1]);
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&b[BATCH_HEADER_BYTES_V1..]);
    let len = u32::try_from(out.len()).expect("a parsed batch grows by 8 bytes within u32");
    out[8..12].copy_from_slice(&len.to_le_bytes());
    out[24] = BATCH_FORMAT_VERSION;
    let sum = checksum(&out, BATCH_FORMAT_VERSION);
    out[16..24].copy_from_slice(&sum.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record_strategy() -> impl Strategy<Value = Record> {
        (
            any::<i64>(),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..16)),
            proptest::collection::vec(any::<u8>(), 0..64),
            proptest::collection::vec(
                (
                    proptest::collection::vec(any::<u8>(), 0..8),
                    proptest::collection::vec(any::<u8>(), 0..8),
                ),
                0..3,
            ),
        )
            .prop_map(|(timestamp_ms, key, value, headers)| Record {
                timestamp_ms,
                key,
                value,
                headers,
            })
    }

    proptest! {
        #[test]
        fn round_trip(records in proptest::collection::vec(record_strategy(), 1..8), base in any::<u32>(), term in any::<u64>()) {
            let mut bytes = encode(&records).expect("non-empty");
            // The log's stamps, after the producer's checksum: it stays valid.
            set_base_offset(&mut bytes, u64::from(base));
            set_term(&mut bytes, term).expect("a v2 batch");
            let view = BatchView::parse(&bytes).expect("valid");
            view.validate_records().expect("valid records");
            prop_assert_eq!(view.header.version, BATCH_FORMAT_VERSION);
            prop_assert_eq!(view.header.term, term);
            prop_assert_eq!(view.header.base_offset, u64::from(base));
            prop_assert_eq!(view.header.record_count as usize, records.len());
            let back: Vec<Record> = view.records().map(|r| r.expect("ok").to_owned_record()).collect();
            prop_assert_eq!(back, records.clone());
            let offsets: Vec<u64> = view.records().map(|r| r.expect("ok").offset).collect();
            let want: Vec<u64> = (0..records.len() as u64).map(|i| u64::from(base) + i).collect();
            prop_assert_eq!(offsets, want);
        }

        #[test]
        fn any_flipped_byte_is_detected(records in proptest::collection::vec(record_strategy(), 1..4), at in any::<usize>(), bit in 0u8..8) {
            let bytes = encode(&records).expect("non-empty");
            // Neither base offset nor term is covered, by design.
            let covered: Vec<usize> = (8..bytes.len()).filter(|i| !(TERM_AT..TERM_AT + 8).contains(i)).collect();
            let at = covered[at % covered.len()];
            let mut bad = bytes.clone();
            bad[at] ^= 1 << bit;
            prop_assert!(BatchView::parse(&bad).is_err());
        }

        /// Values written in place make the same batch, byte for byte, as values pushed whole
        /// (mixed in one batch with keyed, headed records), whatever the capacity reserved.
        #[test]
        fn values_written_in_place_make_the_same_batch(
            records in proptest::collection::vec((record_strategy(), any::<bool>()), 1..8),
            reserve in 0usize..512,
        ) {
            let mut whole = BatchBuilder::new();
            let mut in_place = BatchBuilder::with_capacity(reserve);
            for (r, place) in &records {
                if *place {
                    whole.push_parts(r.timestamp_ms, None, &r.value, std::iter::empty());
                    in_place.push_value_with(r.timestamp_ms, |out| out.extend_from_slice(&r.value));
                } else {
                    whole.push(r);
                    in_place.push(r);
                }
            }
            let (a, b) = (whole.finish().expect("non-empty"), in_place.finish().expect("non-empty"));
            prop_assert_eq!(&a, &b);
            let view = BatchView::parse(&b).expect("valid");
            view.validate_records().expect("valid records");
        }

        /// A v1 batch (as producers and logs wrote before v2) reads as the same records with
        /// term 0, and its upgrade to v2 too.
        #[test]
        fn v1_batches_read_and_upgrade(records in proptest::collection::vec(record_strategy(), 1..8), base in any::<u32>()) {
            let mut v1 = as_v1(&encode(&records).expect("non-empty"));
            set_base_offset(&mut v1, u64::from(base));
            let view = BatchView::parse(&v1).expect("valid v1");
            view.validate_records().expect("valid records");
            prop_assert_eq!(view.header.version, BATCH_FORMAT_VERSION_V1);
            prop_assert_eq!(view.header.term, 0);
            prop_assert!(set_term(&mut v1.clone(), 1).is_err(), "a v1 batch has no term");
            let back: Vec<Record> = view.records().map(|r| r.expect("ok").to_owned_record()).collect();
            prop_assert_eq!(&back, &records);
            let up = upgraded(&view);
            let v2 = BatchView::parse(&up).expect("valid v2");
            v2.validate_records().expect("valid records");
            prop_assert_eq!(v2.header.version, BATCH_FORMAT_VERSION);
            prop_assert_eq!(v2.header.base_offset, u64::from(base));
            prop_assert_eq!(v2.header.term, 0);
            let back: Vec<Record> = v2.records().map(|r| r.expect("ok").to_owned_record()).collect();
            prop_assert_eq!(&back, &records);
            // The upgrade makes the bytes a v2 producer would have sent.
            let mut fresh = encode(&records).expect("non-empty");
            set_base_offset(&mut fresh, u64::from(base));
            prop_assert_eq!(up, fresh);
        }

        #[test]
        fn garbage_never_panics(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(v) = BatchView::parse(&data) {
                let _ = v.validate_records();
                for r in v.records() { let _ = r.map(|r| r.headers().count()); }
            }
        }
    }

    #[test]
    fn a_default_builder_builds_the_same_valid_batch_as_new() {
        let r = Record::new(3, b"x".to_vec());
        let mut a = BatchBuilder::default();
        a.push(&r);
        let mut b = BatchBuilder::new();
        b.push(&r);
        let (a, b) = (a.finish().expect("one"), b.finish().expect("one"));
        assert_eq!(a, b);
        let view = BatchView::parse(&a).expect("valid");
        view.validate_records().expect("valid records");
    }

    #[test]
    fn truncation_is_detected_at_every_length() {
        let bytes = encode(&[
            Record::new(1, b"hello".to_vec()),
            Record::new(2, vec![7; 100]),
        ])
        .expect("non-empty");
        for len in 0..bytes.len() {
            assert!(BatchView::parse(&bytes[..len]).is_err(), "len {len}");
        }
        assert!(BatchView::parse(&bytes).is_ok());
    }

    #[test]
    fn parse_verified_before_checks_all_but_the_checksum() {
        let bytes = encode(&[Record::new(1, b"kept".to_vec())]).expect("non-empty");
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(BatchView::parse(&flipped).is_err());
        let view = BatchView::parse_verified_before(&flipped).expect("header and length hold");
        assert_eq!(view.bytes.len(), bytes.len());
        for len in 0..bytes.len() {
            assert!(
                BatchView::parse_verified_before(&bytes[..len]).is_err(),
                "len {len}"
            );
        }
    }

    #[test]
    fn forged_structure_with_valid_checksum_is_rejected_by_validation() {
        let mut bytes = encode(&[Record::new(5, b"abc".to_vec())]).expect("non-empty");
        // Break the record's value length, then re-seal the checksum as a hostile producer would.
        let at = BATCH_HEADER_BYTES + 4 + 4 + 8 + 4;
        bytes[at..at + 4].copy_from_slice(&1000u32.to_le_bytes());
        let sum = checksum(&bytes, BATCH_FORMAT_VERSION);
        bytes[16..24].copy_from_slice(&sum.to_le_bytes());
        let view = BatchView::parse(&bytes).expect("checksum is valid");
        assert!(view.validate_records().is_err());
    }

    /// A v2 batch rewritten as v1 the way the v1 encoder laid it out: the term dropped,
    /// version 1, the length and the checksum over `[24, batch_len)` made again.
    fn as_v1(v2: &[u8]) -> Vec<u8> {
        let mut b = v2[..TERM_AT].to_vec();
        b.extend_from_slice(&v2[BATCH_HEADER_BYTES..]);
        let len = u32::try_from(b.len()).expect("small");
        b[8..12].copy_from_slice(&len.to_le_bytes());
        b[24] = BATCH_FORMAT_VERSION_V1;
        let sum = xxh3_64(&b[CHECKSUM_START..]);
        b[16..24].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Three batches encoded by the v1 code (storage/src/batch.rs before v2, commit c2e83bd),
    /// base offsets 0, 2 and 3 as its log stored them; the third is a control batch.
    const V1_FIXTURE_HEX: [&str; 3] = [
        "000000000000000081000000534c42313b858a089cfccdeb01000000020000000068e5cf8b010000\
         0168e5cf8b010000010000000000000025000000000000000068e5cf8b010000020000006b310500\
         00006669727374010001006801000000761c000000010000000168e5cf8b010000ffffffff060000\
         007365636f6e640000",
        "020000000000000057000000534c42312fd7b40bc96684ba01000000010000000268e5cf8b010000\
         0268e5cf8b01000000000000000000001b000000000000000268e5cf8b010000ffffffff05000000\
         74686972640000",
        "030000000000000058000000534c42317e3b293b26e304bf01000100010000000368e5cf8b010000\
         0368e5cf8b01000000000000000000001c000000000000000368e5cf8b010000ffffffff06000000\
         666f757274680000",
    ];

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    #[test]
    fn batches_written_by_the_v1_code_still_read() {
        let batches: Vec<Vec<u8>> = V1_FIXTURE_HEX.iter().map(|h| unhex(h)).collect();
        let mut values = Vec::new();
        for (b, base) in batches.iter().zip([0u64, 2, 3]) {
            let view = BatchView::parse(b).expect("a v1 batch verifies");
            view.validate_records().expect("valid records");
            assert_eq!(view.header.version, BATCH_FORMAT_VERSION_V1);
            assert_eq!(view.header.term, 0);
            assert_eq!(view.header.base_offset, base);
            assert_eq!(view.header.header_bytes(), BATCH_HEADER_BYTES_V1);
            for r in view.records() {
                let r = r.expect("record");
                values.push((r.offset, r.value.to_vec()));
            }
        }
        let first = BatchView::parse(&batches[0]).expect("valid");
        let r = first.records().next().expect("one").expect("ok");
        assert_eq!(r.key, Some(&b"k1"[..]));
        assert_eq!(
            r.headers().collect::<Vec<_>>(),
            vec![(&b"h"[..], &b"v"[..])]
        );
        assert!(BatchView::parse(&batches[2])
            .expect("valid")
            .header
            .is_control());
        assert_eq!(
            values,
            vec![
                (0, b"first".to_vec()),
                (1, b"second".to_vec()),
                (2, b"third".to_vec()),
                (3, b"fourth".to_vec())
            ]
        );
    }

    /// Every bit of a v2 header that the checksum or the structure guards is checked: a flip
    /// anywhere but in the base offset or the term is rejected.
    #[test]
    fn a_corrupted_v2_header_is_rejected() {
        let mut bytes = encode(&[
            Record::new(7, b"abc".to_vec()),
            Record::new(8, b"de".to_vec()),
        ])
        .expect("non-empty");
        set_term(&mut bytes, 9).expect("v2");
        for at in (8..BATCH_HEADER_BYTES).filter(|i| !(TERM_AT..TERM_AT + 8).contains(i)) {
            for bit in 0..8 {
                let mut bad = bytes.clone();
                bad[at] ^= 1 << bit;
                assert!(BatchView::parse(&bad).is_err(), "byte {at} bit {bit}");
            }
        }
        // The stamped fields are the log's to change, and change nothing else.
        let mut restamped = bytes.clone();
        set_base_offset(&mut restamped, 1 << 40);
        set_term(&mut restamped, u64::MAX).expect("v2");
        let h = BatchView::parse(&restamped).expect("still valid").header;
        assert_eq!((h.base_offset, h.term), (1 << 40, u64::MAX));
    }

    #[test]
    fn an_unknown_version_is_a_typed_error() {
        let future = BATCH_FORMAT_VERSION_MAX + 1;
        for version in [0, future, u8::MAX] {
            let mut bytes = encode(&[Record::new(1, b"x".to_vec())]).expect("non-empty");
            bytes[24] = version;
            // Checksummed as a v2 batch would be: only the version can be what is refused.
            let sum = checksum(&bytes, BATCH_FORMAT_VERSION);
            bytes[16..24].copy_from_slice(&sum.to_le_bytes());
            let refused = Err(BatchError::UnsupportedVersion(version));
            assert_eq!(BatchHeader::parse(&bytes), refused);
            assert_eq!(BatchView::parse(&bytes).map(|v| v.header), refused);
            assert_eq!(set_term(&mut bytes, 1), refused.map(|_| ()));
        }
        // A future version of a compressed batch too (the codec bits do not make it read).
        let k = kafka_frame(1, 1, b"gzip");
        let mut bytes = encode_kafka_compressed(&k, 0, 0).expect("framing holds");
        bytes[24] = future;
        assert_eq!(
            BatchHeader::parse(&bytes),
            Err(BatchError::UnsupportedVersion(future))
        );
    }

    /// A Kafka-compressed batch is v3 and reads back as it was written, with the fields the
    /// log stamps; a batch of Sluice records stays v2.
    #[test]
    fn a_kafka_compressed_batch_is_v3_and_round_trips() {
        let k = kafka_frame(3, 5, b"lz4 bytes");
        let mut bytes = encode_kafka_compressed(&k, 100, 200).expect("framing holds");
        assert_eq!(bytes[24], BATCH_FORMAT_VERSION_KAFKA_COMPRESSED);
        set_base_offset(&mut bytes, 1 << 33);
        set_term(&mut bytes, 17).expect("v3 has a term");
        let view = BatchView::parse(&bytes).expect("checksum holds");
        view.validate_records().expect("framing holds");
        let h = view.header;
        assert_eq!(h.version, BATCH_FORMAT_VERSION_KAFKA_COMPRESSED);
        assert_eq!((h.base_offset, h.term, h.kafka_codec()), (1 << 33, 17, 3));
        assert_eq!((h.record_count, h.header_bytes()), (5, BATCH_HEADER_BYTES));
        assert_eq!(view.kafka_batch(), Some(&k[..]));
        assert!(!h.needs_upgrade());
        assert_eq!(upgraded(&view), bytes, "stored as it came");
        let plain = encode(&[Record::new(1, b"x".to_vec())]).expect("non-empty");
        assert_eq!(plain[24], BATCH_FORMAT_VERSION);
    }

    /// The version and the codec bits must agree: a batch as the build before v3 wrote it (v2
    /// with codec bits) and a v3 batch without a codec are refused with a typed error, checksum
    /// valid or not.
    #[test]
    fn codec_bits_and_version_must_agree() {
        let k = kafka_frame(4, 2, b"zstd");
        let v3 = encode_kafka_compressed(&k, 0, 0).expect("framing holds");
        let mut old = v3.clone();
        old[24] = BATCH_FORMAT_VERSION;
        let sum = checksum(&old, BATCH_FORMAT_VERSION);
        old[16..24].copy_from_slice(&sum.to_le_bytes());
        let mismatch = |version, codec| Err(BatchError::CodecVersionMismatch { version, codec });
        assert_eq!(BatchHeader::parse(&old), mismatch(2, 4));
        assert_eq!(BatchView::parse(&old).map(|v| v.header), mismatch(2, 4));
        // The same as v1 (the codec bits at the same place).
        let mut old_v1 = old.clone();
        old_v1[24] = BATCH_FORMAT_VERSION_V1;
        assert_eq!(BatchHeader::parse(&old_v1), mismatch(1, 4));
        // v3 with the codec bits cleared: a v3 batch of what, is not guessed either.
        let mut bare = v3.clone();
        bare[26..28].copy_from_slice(&0u16.to_le_bytes());
        let sum = checksum(&bare, BATCH_FORMAT_VERSION_KAFKA_COMPRESSED);
        bare[16..24].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(BatchHeader::parse(&bare), mismatch(3, 0));
        // Sluice records marked v3: refused the same way.
        let mut plain = encode(&[Record::new(1, b"x".to_vec())]).expect("non-empty");
        plain[24] = BATCH_FORMAT_VERSION_KAFKA_COMPRESSED;
        assert_eq!(BatchHeader::parse(&plain), mismatch(3, 0));
    }

    /// A Kafka v2 batch's framing around `payload` (no real records: this crate does not
    /// look inside; the CRC is not this crate's to check either).
    fn kafka_frame(codec: u8, count: u32, payload: &[u8]) -> Vec<u8> {
        let mut k = Vec::new();
        k.extend_from_slice(&7i64.to_be_bytes()); // base offset (the producer's)
        let len = (KAFKA_BATCH_HEADER_BYTES - 12 + payload.len()) as i32;
        k.extend_from_slice(&len.to_be_bytes());
        k.extend_from_slice(&(-1i32).to_be_bytes()); // leader epoch
        k.push(2); // magic
        k.extend_from_slice(&0u32.to_be_bytes()); // crc
        k.extend_from_slice(&i16::from(codec).to_be_bytes());
        k.extend_from_slice(&(count as i32 - 1).to_be_bytes());
        k.extend_from_slice(&[0u8; 8 + 8 + 8 + 2 + 4]); // timestamps, producer, sequence
        k.extend_from_slice(&(count as i32).to_be_bytes());
        assert_eq!(k.len(), KAFKA_BATCH_HEADER_BYTES);
        k.extend_from_slice(payload);
        k
    }

    #[test]
    fn a_kafka_compressed_batch_keeps_its_bytes_and_refuses_a_record_read() {
        let k = kafka_frame(4, 3, b"zstd bytes");
        let bytes = encode_kafka_compressed(&k, 10, 30).expect("framing holds");
        let view = BatchView::parse(&bytes).expect("checksum holds");
        view.validate_records().expect("framing holds");
        assert_eq!(view.header.kafka_codec(), 4);
        assert_eq!(view.header.record_count, 3);
        assert_eq!(
            (view.header.first_timestamp_ms, view.header.max_timestamp_ms),
            (10, 30)
        );
        assert_eq!(view.kafka_batch(), Some(&k[..]));
        let mut records = view.records();
        assert_eq!(
            records.next(),
            Some(Err(BatchError::Compressed { codec: 4 }))
        );
        assert_eq!(records.next(), None);
        // A batch of Sluice records has no Kafka batch.
        let plain = encode(&[Record::new(1, b"x".to_vec())]).expect("non-empty");
        assert_eq!(BatchView::parse(&plain).expect("valid").kafka_batch(), None);
    }

    #[test]
    fn a_kafka_compressed_batch_with_bad_framing_is_refused() {
        assert!(encode_kafka_compressed(&kafka_frame(0, 1, b"x"), 0, 0).is_err());
        assert!(encode_kafka_compressed(&kafka_frame(5, 1, b"x"), 0, 0).is_err());
        assert!(encode_kafka_compressed(&kafka_frame(1, 0, b"x"), 0, 0).is_err());
        let mut short = kafka_frame(1, 1, b"xyz");
        short.pop();
        assert!(encode_kafka_compressed(&short, 0, 0).is_err());
        assert!(encode_kafka_compressed(&short[..40], 0, 0).is_err());
        // A header whose count or codec differs from the Kafka batch's: validate refuses it,
        // checksum or not (the checksum is recomputed here to reach the check).
        let good = encode_kafka_compressed(&kafka_frame(2, 2, b"snappy"), 0, 0).expect("ok");
        for (at, value) in [(28usize, 3u8), (26, 3 << 1)] {
            let mut bad = good.clone();
            bad[at] = value;
            if at == 28 {
                bad[48] = 2; // last offset delta consistent with the header's count
            }
            let sum = checksum(&bad, BATCH_FORMAT_VERSION_KAFKA_COMPRESSED);
            bad[16..24].copy_from_slice(&sum.to_le_bytes());
            let view = BatchView::parse(&bad).expect("checksum recomputed");
            assert!(view.validate_records().is_err(), "byte {at}");
        }
        // The control bit with a codec: refused.
        let mut control = good.clone();
        control[26] |= ATTR_CONTROL as u8;
        let sum = checksum(&control, BATCH_FORMAT_VERSION_KAFKA_COMPRESSED);
        control[16..24].copy_from_slice(&sum.to_le_bytes());
        let view = BatchView::parse(&control).expect("checksum recomputed");
        assert!(view.validate_records().is_err());
    }
}
