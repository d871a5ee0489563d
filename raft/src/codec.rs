//! The wire codec of Raft messages: one [`Envelope`] to bytes and back, versioned, bounded,
//! never panicking on input. Entry and snapshot data decoded from a [`Bytes`] are slices of it
//! (no copy), so a batch travels from the socket to the log owner's write unchanged.
//!
//! All integers are little-endian. Every message starts with the codec version, so a node can
//! refuse a format it does not know instead of misreading it:
//!
//! | field | bytes | |
//! |---|---|---|
//! | version | 1 | `CODEC_VERSION` (1); any other is `UnknownVersion` |
//! | kind | 1 | 1 group message, 2 heartbeat, 3 heartbeat response |
//! | from, to | 8 + 8 | node ids |
//!
//! **Group message** (kind 1): `group` 8, `term` 8, `body` 1, then by body:
//!
//! | body | fields (bytes) |
//! |---|---|
//! | 1 Vote | flags 1 (bit 0 pre, bit 1 transfer), disk 16, last_offset 8, last_term 8 |
//! | 2 VoteResp | flags 1 (bit 0 pre, bit 1 granted), disk 16 |
//! | 3 Append | prev_offset 8, prev_term 8, commit 8, entry count 4, then per entry: offset 8, count 4, term 8, kind 1 (0 data, 1 no-op, 2 config), data length 4, data |
//! | 4 AppendResp | disk 16, appended 8, flushed 8, has_reject 1 (0 or 1), reject hint 8 (only if 1) |
//! | 5 InstallSnapshot | offset 8, term 8, member count 2, per member: node 8, disk 16, role 1 (0 voter, 1 learner, 2 auto-promoting learner), data length 8, data |
//! | 6 TimeoutNow | nothing |
//!
//! **Heartbeat** (kind 2): sent_ms 8, group count 4, per group: group 8, term 8, commit 8
//! (24 bytes). **Heartbeat response** (kind 3): sent_ms 8 (echoed), group count 4, per group:
//! group 8, term 8, disk 16, appended 8, flushed 8 (48 bytes).
//!
//! Limits ([`CodecLimits`], from the `Config` every node shares): at most
//! `APPEND_ENTRIES_MAX` entries per append, each at most `max_entry_bytes`, several together at
//! most `max_append_bytes` (a larger entry travels alone: the leader packs appends this way);
//! at most `HEARTBEAT_GROUPS_MAX` groups per heartbeat (`MultiRaft` splits larger rounds);
//! at most `MEMBERS_MAX` members and `SNAPSHOT_BYTES_MAX` bytes per snapshot. Every count and
//! length is checked against its limit and against the bytes left before anything is
//! allocated. Flags with reserved bits, unknown kinds and bytes after the message are errors,
//! so the encoding is canonical: whatever decodes re-encodes to the same bytes.
//!
//! The decoder checks form, not meaning: an append whose entries are not contiguous decodes,
//! and `step` refuses it (`StepError::MalformedAppend`). It does refuse an entry whose offset
//! range overflows, which no log can hold.

use crate::config::Config;
use crate::error::DecodeError;
use crate::message::{
    Body, Envelope, Heartbeat, HeartbeatGroup, HeartbeatResp, HeartbeatRespGroup, Message,
    APPEND_ENTRIES_MAX, HEARTBEAT_GROUPS_MAX,
};
use crate::types::{DiskId, Entry, EntryKind, Membership, Snapshot, SnapshotMeta, MEMBERS_MAX};
use bytes::{BufMut, Bytes, BytesMut};

/// The version this codec writes and the only one it reads.
pub const CODEC_VERSION: u8 = 1;

/// Largest snapshot carried in one `InstallSnapshot`. Sluice's Raft snapshots are state
/// summaries (a queue's leases and dedup table, a group's offsets), not the data itself, which
/// stays in the log; 64 MiB bounds one message with room to spare. A larger state would need a
/// chunked transfer (not yet).
pub const SNAPSHOT_BYTES_MAX: usize = 64 * 1024 * 1024;

const KIND_GROUP: u8 = 1;
const KIND_HEARTBEAT: u8 = 2;
const KIND_HEARTBEAT_RESP: u8 = 3;

const BODY_VOTE: u8 = 1;
const BODY_VOTE_RESP: u8 = 2;
const BODY_APPEND: u8 = 3;
const BODY_APPEND_RESP: u8 = 4;
const BODY_INSTALL_SNAPSHOT: u8 = 5;
const BODY_TIMEOUT_NOW: u8 = 6;

const FLAG_PRE: u8 = 1;
/// `transfer` in a Vote, `granted` in a VoteResp.
const FLAG_SECOND: u8 = 2;

/// version, kind, from, to.
const ENVELOPE_HEADER_BYTES: usize = 1 + 1 + 8 + 8;
/// group, term, body.
const GROUP_HEADER_BYTES: usize = 8 + 8 + 1;
/// prev_offset, prev_term, commit, entry count.
const APPEND_HEADER_BYTES: usize = 8 + 8 + 8 + 4;
/// offset, count, term, kind, data length.
const ENTRY_HEADER_BYTES: usize = 8 + 4 + 8 + 1 + 4;
const HEARTBEAT_GROUP_BYTES: usize = 8 + 8 + 8;
const HEARTBEAT_RESP_GROUP_BYTES: usize = 8 + 8 + 16 + 8 + 8;
const MEMBER_BYTES: usize = 8 + 16 + 1;

/// What the decoder accepts. Every node must decode with limits at least as large as those its
/// peers send with; [`CodecLimits::from_config`] derives them from the shared `Config`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CodecLimits {
    /// Several entries of one append together carry at most this many bytes of data.
    pub max_append_bytes: usize,
    /// One entry carries at most this many bytes of data.
    pub max_entry_bytes: usize,
    pub max_append_entries: usize,
    pub max_heartbeat_groups: usize,
    pub max_snapshot_bytes: usize,
}

impl CodecLimits {
    pub fn from_config(cfg: &Config) -> Self {
        CodecLimits {
            max_append_bytes: cfg.max_append_bytes,
            max_entry_bytes: cfg.max_entry_bytes,
            max_append_entries: APPEND_ENTRIES_MAX,
            max_heartbeat_groups: HEARTBEAT_GROUPS_MAX,
            max_snapshot_bytes: SNAPSHOT_BYTES_MAX,
        }
    }

    /// The largest encoding these limits accept: a transport can refuse a longer frame before
    /// reading it.
    pub fn max_encoded_bytes(&self) -> usize {
        let append = ENVELOPE_HEADER_BYTES
            + GROUP_HEADER_BYTES
            + APPEND_HEADER_BYTES
            + self
                .max_append_entries
                .saturating_mul(ENTRY_HEADER_BYTES)
                .saturating_add(self.max_append_bytes.max(self.max_entry_bytes));
        let snapshot = (ENVELOPE_HEADER_BYTES + GROUP_HEADER_BYTES + 8 + 8 + 2 + 8)
            .saturating_add(MEMBERS_MAX * MEMBER_BYTES)
            .saturating_add(self.max_snapshot_bytes);
        let heartbeat = (ENVELOPE_HEADER_BYTES + 8 + 4).saturating_add(
            self.max_heartbeat_groups
                .saturating_mul(HEARTBEAT_RESP_GROUP_BYTES),
        );
        append.max(snapshot).max(heartbeat)
    }
}

impl Default for CodecLimits {
    fn default() -> Self {
        CodecLimits::from_config(&Config::default())
    }
}

// ---- Encoding -------------------------------------------------------------------------------

/// Encodes `env` (version 1).
pub fn encode(env: &Envelope) -> Bytes {
    let mut out = BytesMut::with_capacity(encoded_len(env));
    encode_into(env, &mut out);
    out.freeze()
}

/// The exact length of `env`'s encoding.
pub fn encoded_len(env: &Envelope) -> usize {
    ENVELOPE_HEADER_BYTES
        + match env {
            Envelope::Group(m) => {
                GROUP_HEADER_BYTES
                    + match &m.body {
                        Body::Vote { .. } => 1 + 16 + 8 + 8,
                        Body::VoteResp { .. } => 1 + 16,
                        Body::Append { entries, .. } => {
                            APPEND_HEADER_BYTES
                                + entries
                                    .iter()
                                    .map(|e| ENTRY_HEADER_BYTES + e.data.len())
                                    .sum::<usize>()
                        }
                        Body::AppendResp { reject, .. } => {
                            16 + 8 + 8 + 1 + if reject.is_some() { 8 } else { 0 }
                        }
                        Body::InstallSnapshot { snapshot } => {
                            8 + 8
                                + 2
                                + snapshot.meta.membership.members.len() * MEMBER_BYTES
                                + 8
                                + snapshot.data.len()
                        }
                        Body::TimeoutNow => 0,
                    }
            }
            Envelope::Heartbeat(h) => 8 + 4 + h.groups.len() * HEARTBEAT_GROUP_BYTES,
            Envelope::HeartbeatResp(h) => 8 + 4 + h.groups.len() * HEARTBEAT_RESP_GROUP_BYTES,
        }
}

/// Appends `env`'s encoding to `out`. Entry and snapshot data are copied once, into `out`.
///
/// What the core produces always fits the format; a count or length beyond its field (more
/// than 4 Gi entries, an entry over 4 GiB, a membership over 65,535) is a caller's bug and
/// panics rather than writing a misleading frame.
pub fn encode_into(env: &Envelope, out: &mut BytesMut) {
    out.reserve(encoded_len(env));
    out.put_u8(CODEC_VERSION);
    match env {
        Envelope::Group(m) => {
            out.put_u8(KIND_GROUP);
            out.put_u64_le(m.from);
            out.put_u64_le(m.to);
            out.put_u64_le(m.group);
            out.put_u64_le(m.term);
            encode_body(&m.body, out);
        }
        Envelope::Heartbeat(h) => {
            out.put_u8(KIND_HEARTBEAT);
            out.put_u64_le(h.from);
            out.put_u64_le(h.to);
            out.put_u64_le(h.sent_ms);
            out.put_u32_le(u32_len(h.groups.len()));
            for g in &h.groups {
                out.put_u64_le(g.group);
                out.put_u64_le(g.term);
                out.put_u64_le(g.commit);
            }
        }
        Envelope::HeartbeatResp(h) => {
            out.put_u8(KIND_HEARTBEAT_RESP);
            out.put_u64_le(h.from);
            out.put_u64_le(h.to);
            out.put_u64_le(h.sent_ms);
            out.put_u32_le(u32_len(h.groups.len()));
            for g in &h.groups {
                out.put_u64_le(g.group);
                out.put_u64_le(g.term);
                out.put_u128_le(g.disk.0);
                out.put_u64_le(g.appended);
                out.put_u64_le(g.flushed);
            }
        }
    }
}

fn u32_len(n: usize) -> u32 {
    u32::try_from(n).expect("a count or length over 4 Gi: the core's limits never produce it")
}

fn flags(first: bool, second: bool) -> u8 {
    (if first { FLAG_PRE } else { 0 }) | (if second { FLAG_SECOND } else { 0 })
}

fn encode_body(body: &Body, out: &mut BytesMut) {
    match body {
        Body::Vote {
            pre,
            transfer,
            disk,
            last_offset,
            last_term,
        } => {
            out.put_u8(BODY_VOTE);
            out.put_u8(flags(*pre, *transfer));
            out.put_u128_le(disk.0);
            out.put_u64_le(*last_offset);
            out.put_u64_le(*last_term);
        }
        Body::VoteResp { pre, granted, disk } => {
            out.put_u8(BODY_VOTE_RESP);
            out.put_u8(flags(*pre, *granted));
            out.put_u128_le(disk.0);
        }
        Body::Append {
            prev_offset,
            prev_term,
            entries,
            commit,
        } => {
            out.put_u8(BODY_APPEND);
            out.put_u64_le(*prev_offset);
            out.put_u64_le(*prev_term);
            out.put_u64_le(*commit);
            out.put_u32_le(u32_len(entries.len()));
            for e in entries {
                out.put_u64_le(e.offset);
                out.put_u32_le(e.count);
                out.put_u64_le(e.term);
                out.put_u8(match e.kind {
                    EntryKind::Data => 0,
                    EntryKind::Noop => 1,
                    EntryKind::Config => 2,
                });
                out.put_u32_le(u32_len(e.data.len()));
                out.put_slice(&e.data);
            }
        }
        Body::AppendResp {
            disk,
            appended,
            flushed,
            reject,
        } => {
            out.put_u8(BODY_APPEND_RESP);
            out.put_u128_le(disk.0);
            out.put_u64_le(*appended);
            out.put_u64_le(*flushed);
            match reject {
                Some(hint) => {
                    out.put_u8(1);
                    out.put_u64_le(*hint);
                }
                None => out.put_u8(0),
            }
        }
        Body::InstallSnapshot { snapshot } => {
            out.put_u8(BODY_INSTALL_SNAPSHOT);
            out.put_u64_le(snapshot.meta.offset);
            out.put_u64_le(snapshot.meta.term);
            // Membership's own encoding: member count (2), then 25 bytes per member.
            let members = &snapshot.meta.membership.members;
            assert!(
                members.len() <= usize::from(u16::MAX),
                "a membership over 65,535: the core caps it at MEMBERS_MAX"
            );
            out.put_slice(&snapshot.meta.membership.encode());
            out.put_u64_le(snapshot.data.len() as u64);
            out.put_slice(&snapshot.data);
        }
        Body::TimeoutNow => out.put_u8(BODY_TIMEOUT_NOW),
    }
}

// ---- Decoding -------------------------------------------------------------------------------

/// Decodes one message with the default limits. Copies `buf` once; entry data then share that
/// copy. Use [`decode_bytes`] to decode a received buffer without any copy.
pub fn decode(buf: &[u8]) -> Result<Envelope, DecodeError> {
    decode_bytes(Bytes::copy_from_slice(buf), &CodecLimits::default())
}

/// Decodes one message that is all of `buf`. Entry and snapshot data are slices of `buf`.
pub fn decode_bytes(buf: Bytes, limits: &CodecLimits) -> Result<Envelope, DecodeError> {
    let mut r = Reader { buf, pos: 0 };
    let version = r.u8()?;
    if version != CODEC_VERSION {
        return Err(DecodeError::UnknownVersion(version));
    }
    let kind = r.u8()?;
    let from = r.u64()?;
    let to = r.u64()?;
    let env = match kind {
        KIND_GROUP => {
            let group = r.u64()?;
            let term = r.u64()?;
            let body = decode_body(&mut r, limits)?;
            Envelope::Group(Message {
                group,
                from,
                to,
                term,
                body,
            })
        }
        KIND_HEARTBEAT => {
            let sent_ms = r.u64()?;
            let n = r.count(
                HEARTBEAT_GROUP_BYTES,
                limits.max_heartbeat_groups,
                |count, limit| DecodeError::TooManyHeartbeatGroups { count, limit },
            )?;
            let mut groups = Vec::with_capacity(n);
            for _ in 0..n {
                groups.push(HeartbeatGroup {
                    group: r.u64()?,
                    term: r.u64()?,
                    commit: r.u64()?,
                });
            }
            Envelope::Heartbeat(Heartbeat {
                from,
                to,
                sent_ms,
                groups,
            })
        }
        KIND_HEARTBEAT_RESP => {
            let sent_ms = r.u64()?;
            let n = r.count(
                HEARTBEAT_RESP_GROUP_BYTES,
                limits.max_heartbeat_groups,
                |count, limit| DecodeError::TooManyHeartbeatGroups { count, limit },
            )?;
            let mut groups = Vec::with_capacity(n);
            for _ in 0..n {
                groups.push(HeartbeatRespGroup {
                    group: r.u64()?,
                    term: r.u64()?,
                    disk: DiskId(r.u128()?),
                    appended: r.u64()?,
                    flushed: r.u64()?,
                });
            }
            Envelope::HeartbeatResp(HeartbeatResp {
                from,
                to,
                sent_ms,
                groups,
            })
        }
        k => return Err(DecodeError::UnknownKind(k)),
    };
    let left = r.remaining();
    if left != 0 {
        return Err(DecodeError::TrailingBytes(left));
    }
    Ok(env)
}

fn decode_flags(b: u8) -> Result<(bool, bool), DecodeError> {
    if b & !(FLAG_PRE | FLAG_SECOND) != 0 {
        return Err(DecodeError::BadFlags(b));
    }
    Ok((b & FLAG_PRE != 0, b & FLAG_SECOND != 0))
}

fn decode_body(r: &mut Reader, limits: &CodecLimits) -> Result<Body, DecodeError> {
    Ok(match r.u8()? {
        BODY_VOTE => {
            let (pre, transfer) = decode_flags(r.u8()?)?;
            Body::Vote {
                pre,
                transfer,
                disk: DiskId(r.u128()?),
                last_offset: r.u64()?,
                last_term: r.u64()?,
            }
        }
        BODY_VOTE_RESP => {
            let (pre, granted) = decode_flags(r.u8()?)?;
            Body::VoteResp {
                pre,
                granted,
                disk: DiskId(r.u128()?),
            }
        }
        BODY_APPEND => {
            let prev_offset = r.u64()?;
            let prev_term = r.u64()?;
            let commit = r.u64()?;
            let n = r.count(
                ENTRY_HEADER_BYTES,
                limits.max_append_entries,
                |count, limit| DecodeError::TooManyEntries { count, limit },
            )?;
            let mut entries = Vec::with_capacity(n);
            let mut total_bytes: u64 = 0;
            for _ in 0..n {
                let offset = r.u64()?;
                let count = r.u32()?;
                let term = r.u64()?;
                let kind = match r.u8()? {
                    0 => EntryKind::Data,
                    1 => EntryKind::Noop,
                    2 => EntryKind::Config,
                    k => return Err(DecodeError::UnknownEntryKind(k)),
                };
                if offset.checked_add(u64::from(count)).is_none() {
                    return Err(DecodeError::OffsetOverflow { offset, count });
                }
                let len = u64::from(r.u32()?);
                if len > limits.max_entry_bytes as u64 {
                    return Err(DecodeError::EntryTooLarge {
                        size_bytes: len,
                        limit_bytes: limits.max_entry_bytes,
                    });
                }
                total_bytes += len;
                if n > 1 && total_bytes > limits.max_append_bytes as u64 {
                    return Err(DecodeError::AppendTooLarge {
                        size_bytes: total_bytes,
                        limit_bytes: limits.max_append_bytes,
                    });
                }
                let data = r.take(len)?;
                entries.push(Entry {
                    offset,
                    count,
                    term,
                    kind,
                    data,
                });
            }
            Body::Append {
                prev_offset,
                prev_term,
                entries,
                commit,
            }
        }
        BODY_APPEND_RESP => {
            let disk = DiskId(r.u128()?);
            let appended = r.u64()?;
            let flushed = r.u64()?;
            let reject = match r.u8()? {
                0 => None,
                1 => Some(r.u64()?),
                b => return Err(DecodeError::BadFlags(b)),
            };
            Body::AppendResp {
                disk,
                appended,
                flushed,
                reject,
            }
        }
        BODY_INSTALL_SNAPSHOT => {
            let offset = r.u64()?;
            let term = r.u64()?;
            let members = usize::from(r.peek_u16()?);
            if members > MEMBERS_MAX {
                return Err(DecodeError::TooManyMembers(members));
            }
            let m = r.take((2 + members * MEMBER_BYTES) as u64)?;
            let membership = Membership::decode(&m)?;
            let len = r.u64()?;
            if len > limits.max_snapshot_bytes as u64 {
                return Err(DecodeError::SnapshotTooLarge {
                    size_bytes: len,
                    limit_bytes: limits.max_snapshot_bytes,
                });
            }
            let data = r.take(len)?;
            Body::InstallSnapshot {
                snapshot: Snapshot {
                    meta: SnapshotMeta {
                        offset,
                        term,
                        membership,
                    },
                    data,
                },
            }
        }
        BODY_TIMEOUT_NOW => Body::TimeoutNow,
        b => return Err(DecodeError::UnknownBody(b)),
    })
}

/// A bounds-checked cursor over the input: every read checks what is left first.
struct Reader {
    buf: Bytes,
    pos: usize,
}

impl Reader {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let end = self.pos.checked_add(N).ok_or(DecodeError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        self.pos = end;
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn u128(&mut self) -> Result<u128, DecodeError> {
        Ok(u128::from_le_bytes(self.array()?))
    }

    fn peek_u16(&self) -> Result<u16, DecodeError> {
        let s = self
            .buf
            .get(self.pos..self.pos.saturating_add(2))
            .ok_or(DecodeError::Truncated)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    /// The next `len` bytes, as a slice of the input (no copy).
    fn take(&mut self, len: u64) -> Result<Bytes, DecodeError> {
        let len = usize::try_from(len).map_err(|_| DecodeError::Truncated)?;
        if len > self.remaining() {
            return Err(DecodeError::Truncated);
        }
        let b = self.buf.slice(self.pos..self.pos + len);
        self.pos += len;
        Ok(b)
    }

    /// A 4-byte count of items of at least `item_bytes` each: refused above `limit`, and
    /// `Truncated` if the bytes left cannot hold that many, so the caller may allocate it.
    fn count(
        &mut self,
        item_bytes: usize,
        limit: usize,
        too_many: impl FnOnce(u64, usize) -> DecodeError,
    ) -> Result<usize, DecodeError> {
        let n = u64::from(self.u32()?);
        if n > limit as u64 {
            return Err(too_many(n, limit));
        }
        let n = n as usize;
        if n.saturating_mul(item_bytes) > self.remaining() {
            return Err(DecodeError::Truncated);
        }
        Ok(n)
    }
}
