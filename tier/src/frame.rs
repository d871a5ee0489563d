//! The layout of a tiered object (sans-I/O): the payload cut into fixed-size blocks, then a
//! table of each block's xxh3-64, then a fixed footer that checksums the table and itself.
//!
//! ```text
//! [block 0][block 1]…[block n-1]            payload (the last block may be short)
//! [xxh3_64(block i) as u64 LE] × n          the block table
//! [magic 8][block_size u32][block_count u32][payload_len u64][table_xxh3 u64][footer_xxh3 u64]
//! ```
//!
//! A range read fetches the footer, then the table, then only the blocks it covers, and checks
//! every block against the table before any byte leaves: a flipped byte anywhere in the object
//! (payload, table or footer) is a [`FrameError`], never data.

use bytes::{BufMut, Bytes, BytesMut};
use xxhash_rust::xxh3::xxh3_64;

const MAGIC: &[u8; 8] = b"SLTSEG01";
/// Footer: magic, block size, block count, payload length, table checksum, footer checksum.
pub const FOOTER_LEN_BYTES: u64 = 8 + 4 + 4 + 8 + 8 + 8;
/// Bytes per block-table entry.
const TABLE_ENTRY_LEN_BYTES: u64 = 8;
/// Largest block accepted when decoding a footer (guards the arithmetic and the cache).
pub const BLOCK_SIZE_BYTES_MAX: u32 = 64 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("footer: {0}")]
    BadFooter(&'static str),
    #[error("block table checksum mismatch")]
    BadTable,
    #[error("block {block} checksum mismatch")]
    BadBlock { block: u32 },
    #[error("range {start}..{end} outside the payload of {len} bytes")]
    OutOfRange { start: u64, end: u64, len: u64 },
}

/// What the footer and table say about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameMeta {
    pub block_size_bytes: u32,
    pub payload_len_bytes: u64,
    pub block_checksums: Vec<u64>,
}

impl FrameMeta {
    pub fn block_count(&self) -> u32 {
        u32::try_from(self.block_checksums.len()).expect("block count was decoded from a u32")
    }

    /// Byte range of block `i` within the object.
    pub fn block_range(&self, i: u32) -> std::ops::Range<u64> {
        let start = u64::from(i) * u64::from(self.block_size_bytes);
        let end = (start + u64::from(self.block_size_bytes)).min(self.payload_len_bytes);
        start..end
    }

    /// Blocks that cover payload `range` (non-empty, within the payload).
    pub fn blocks_for(
        &self,
        range: &std::ops::Range<u64>,
    ) -> Result<std::ops::Range<u32>, FrameError> {
        if range.start >= range.end || range.end > self.payload_len_bytes {
            return Err(FrameError::OutOfRange {
                start: range.start,
                end: range.end,
                len: self.payload_len_bytes,
            });
        }
        let bs = u64::from(self.block_size_bytes);
        let first = u32::try_from(range.start / bs).expect("within block_count");
        let last = u32::try_from((range.end - 1) / bs).expect("within block_count");
        Ok(first..last + 1)
    }

    /// Where the table lies in the object.
    pub fn table_range(&self) -> std::ops::Range<u64> {
        self.payload_len_bytes
            ..self.payload_len_bytes + self.block_checksums.len() as u64 * TABLE_ENTRY_LEN_BYTES
    }

    pub fn verify_block(&self, i: u32, bytes: &[u8]) -> Result<(), FrameError> {
        let want = self
            .block_checksums
            .get(i as usize)
            .ok_or(FrameError::BadBlock { block: i })?;
        let r = self.block_range(i);
        if bytes.len() as u64 != r.end - r.start || xxh3_64(bytes) != *want {
            return Err(FrameError::BadBlock { block: i });
        }
        Ok(())
    }

    pub fn object_len_bytes(&self) -> u64 {
        self.table_range().end + FOOTER_LEN_BYTES
    }
}

/// Encodes `payload` as a framed object with blocks of `block_size_bytes`.
pub fn encode(payload: &[u8], block_size_bytes: u32) -> Bytes {
    assert!(
        (1..=BLOCK_SIZE_BYTES_MAX).contains(&block_size_bytes),
        "block size out of range"
    );
    let blocks = payload.chunks(block_size_bytes as usize);
    let count = blocks.len();
    let mut out = BytesMut::with_capacity(
        payload.len() + count * TABLE_ENTRY_LEN_BYTES as usize + FOOTER_LEN_BYTES as usize,
    );
    out.put_slice(payload);
    let mut table = BytesMut::with_capacity(count * TABLE_ENTRY_LEN_BYTES as usize);
    for b in blocks {
        table.put_u64_le(xxh3_64(b));
    }
    out.put_slice(&table);
    let mut footer = BytesMut::with_capacity(FOOTER_LEN_BYTES as usize);
    footer.put_slice(MAGIC);
    footer.put_u32_le(block_size_bytes);
    footer.put_u32_le(u32::try_from(count).expect("fewer than 2^32 blocks"));
    footer.put_u64_le(payload.len() as u64);
    footer.put_u64_le(xxh3_64(&table));
    let footer_sum = xxh3_64(&footer);
    footer.put_u64_le(footer_sum);
    out.put_slice(&footer);
    out.freeze()
}

/// The parts of the footer needed to fetch and check the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footer {
    pub block_size_bytes: u32,
    pub block_count: u32,
    pub payload_len_bytes: u64,
    pub table_checksum: u64,
}

impl Footer {
    pub fn table_range(&self) -> std::ops::Range<u64> {
        self.payload_len_bytes
            ..self.payload_len_bytes + u64::from(self.block_count) * TABLE_ENTRY_LEN_BYTES
    }
}

pub fn decode_footer(bytes: &[u8]) -> Result<Footer, FrameError> {
    if bytes.len() as u64 != FOOTER_LEN_BYTES {
        return Err(FrameError::BadFooter("wrong length"));
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    let sum = u64::from_le_bytes(sum.try_into().expect("8 bytes"));
    if xxh3_64(body) != sum {
        return Err(FrameError::BadFooter("checksum mismatch"));
    }
    if &body[..8] != MAGIC {
        return Err(FrameError::BadFooter("bad magic"));
    }
    let u32_at = |o: usize| u32::from_le_bytes(body[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(body[o..o + 8].try_into().expect("8 bytes"));
    let footer = Footer {
        block_size_bytes: u32_at(8),
        block_count: u32_at(12),
        payload_len_bytes: u64_at(16),
        table_checksum: u64_at(24),
    };
    if !(1..=BLOCK_SIZE_BYTES_MAX).contains(&footer.block_size_bytes) {
        return Err(FrameError::BadFooter("block size out of range"));
    }
    let want_blocks = footer
        .payload_len_bytes
        .div_ceil(u64::from(footer.block_size_bytes));
    if want_blocks != u64::from(footer.block_count) {
        return Err(FrameError::BadFooter(
            "block count does not match the length",
        ));
    }
    Ok(footer)
}

pub fn decode_table(footer: &Footer, table: &[u8]) -> Result<FrameMeta, FrameError> {
    let r = footer.table_range();
    if table.len() as u64 != r.end - r.start || xxh3_64(table) != footer.table_checksum {
        return Err(FrameError::BadTable);
    }
    Ok(FrameMeta {
        block_size_bytes: footer.block_size_bytes,
        payload_len_bytes: footer.payload_len_bytes,
        block_checksums: table
            .chunks_exact(TABLE_ENTRY_LEN_BYTES as usize)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta_of(obj: &[u8]) -> Result<FrameMeta, FrameError> {
        let footer = decode_footer(&obj[obj.len() - FOOTER_LEN_BYTES as usize..])?;
        let t = footer.table_range();
        decode_table(&footer, &obj[t.start as usize..t.end as usize])
    }

    fn read(obj: &[u8], range: std::ops::Range<u64>) -> Result<Vec<u8>, FrameError> {
        let meta = meta_of(obj)?;
        let blocks = meta.blocks_for(&range)?;
        let mut out = Vec::new();
        for i in blocks.clone() {
            let r = meta.block_range(i);
            let b = &obj[r.start as usize..r.end as usize];
            meta.verify_block(i, b)?;
            out.extend_from_slice(b);
        }
        let base = meta.block_range(blocks.start).start;
        Ok(out[(range.start - base) as usize..(range.end - base) as usize].to_vec())
    }

    #[test]
    fn round_trips_every_range_of_a_small_payload() {
        let payload: Vec<u8> = (0..100u8).collect();
        let obj = encode(&payload, 7);
        for a in 0..100u64 {
            for b in a + 1..=100 {
                assert_eq!(read(&obj, a..b).unwrap(), &payload[a as usize..b as usize]);
            }
        }
        assert!(read(&obj, 5..5).is_err());
        assert!(read(&obj, 0..101).is_err());
    }

    #[test]
    fn every_flipped_byte_is_caught() {
        let payload: Vec<u8> = (0..50u8).collect();
        let obj = encode(&payload, 8);
        for i in 0..obj.len() {
            let mut bad = obj.to_vec();
            bad[i] ^= 0x01;
            assert!(
                read(&bad, 0..50).is_err(),
                "flipping byte {i} of {} went unnoticed",
                obj.len()
            );
        }
    }

    #[test]
    fn empty_payload_has_no_blocks() {
        let obj = encode(&[], 8);
        let meta = meta_of(&obj).unwrap();
        assert_eq!(meta.block_count(), 0);
        assert_eq!(meta.object_len_bytes(), obj.len() as u64);
    }
}
