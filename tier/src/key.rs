//! Object keys of tiered segments: derived from what identifies a sealed segment, so a
//! re-upload (a retry, a restart) writes the same key, and two terms never share one.
//!
//! `<prefix>/v1/<topic|queue>/<name>/<partition>/<base offset>-<term>.<seg|idx>`, numbers
//! zero-padded so keys list in offset order. Names are escaped (bytes outside
//! `[A-Za-z0-9._-]` as `=XX`) so a name can never add a path segment; `=` rather than `%`
//! because object_store would percent-encode a `%` a second time.

use std::fmt::Write;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogKind {
    Topic,
    Queue,
}

/// Identifies one sealed segment of one partition, as written in the term `term`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SegmentId {
    pub kind: LogKind,
    pub name: String,
    pub partition: u32,
    pub base_offset: u64,
    pub term: u64,
}

/// The two objects of a segment: its records and its index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Segment,
    Index,
}

impl SegmentId {
    /// Prefix under which all of this partition's objects live (for listings).
    pub fn partition_prefix(&self, prefix: &str) -> String {
        partition_prefix(prefix, self.kind, &self.name, self.partition)
    }

    pub fn key(&self, prefix: &str, part: Part) -> String {
        let ext = match part {
            Part::Segment => "seg",
            Part::Index => "idx",
        };
        format!(
            "{}{:020}-{:020}.{ext}",
            self.partition_prefix(prefix),
            self.base_offset,
            self.term
        )
    }
}

pub fn partition_prefix(prefix: &str, kind: LogKind, name: &str, partition: u32) -> String {
    let kind = match kind {
        LogKind::Topic => "topic",
        LogKind::Queue => "queue",
    };
    let mut escaped = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.' {
            escaped.push(b as char);
        } else {
            write!(escaped, "={b:02X}").expect("writing to a String");
        }
    }
    // "." and ".." are path segments a file-system backed store would resolve.
    if escaped == "." || escaped == ".." {
        escaped = escaped.replace('.', "=2E");
    }
    let prefix = prefix.trim_end_matches('/');
    if prefix.is_empty() {
        format!("v1/{kind}/{escaped}/{partition:010}/")
    } else {
        format!("{prefix}/v1/{kind}/{escaped}/{partition:010}/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_escaped_and_ordered() {
        let id = |base, term| SegmentId {
            kind: LogKind::Topic,
            name: "a/b c".into(),
            partition: 3,
            base_offset: base,
            term,
        };
        let k = id(42, 7).key("cluster1/", Part::Segment);
        assert_eq!(
            k,
            "cluster1/v1/topic/a=2Fb=20c/0000000003/00000000000000000042-00000000000000000007.seg"
        );
        assert!(id(9, 1).key("p", Part::Segment) < id(10, 1).key("p", Part::Segment));
        assert_ne!(
            id(9, 1).key("p", Part::Segment),
            id(9, 2).key("p", Part::Segment)
        );
        assert!(!partition_prefix("", LogKind::Queue, "..", 0).contains("/../"));
    }
}
