//! Messages between nodes: per-group messages and the coalesced per-node heartbeat.

use crate::types::{DiskId, Entry, GroupId, NodeId, Offset, Snapshot, Term};

/// Most entries in one `Append`. The leader packs at most this many (and at most
/// `max_append_bytes` of data, or a single larger entry), and the codec refuses more, so a
/// decoded append allocates a bounded entry list. 4096: a full 512 KiB append of batches of
/// 128 bytes or more (a batch header plus one small record) fits; smaller batches just take
/// more appends.
pub const APPEND_ENTRIES_MAX: usize = 4096;

/// Most groups in one `Heartbeat` or `HeartbeatResp`. `MultiRaft` splits a larger round into
/// several messages, and the codec refuses more. 16,384: sixteen times the design's ~1,000
/// groups per core, with a response of 48 bytes per group staying under 1 MiB.
pub const HEARTBEAT_GROUPS_MAX: usize = 16_384;

/// Everything one node sends another. Heartbeats of all groups a node leads for a peer travel in
/// one `Heartbeat`, so 1,000 idle groups cost one message per peer per interval, not 1,000.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Envelope {
    Group(Message),
    Heartbeat(Heartbeat),
    HeartbeatResp(HeartbeatResp),
}

impl Envelope {
    pub fn from(&self) -> NodeId {
        match self {
            Envelope::Group(m) => m.from,
            Envelope::Heartbeat(h) => h.from,
            Envelope::HeartbeatResp(h) => h.from,
        }
    }
    pub fn to(&self) -> NodeId {
        match self {
            Envelope::Group(m) => m.to,
            Envelope::Heartbeat(h) => h.to,
            Envelope::HeartbeatResp(h) => h.to,
        }
    }
}

/// A message of one group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub group: GroupId,
    pub from: NodeId,
    pub to: NodeId,
    /// The sender's term (for `Vote { pre: true }`, the term it would campaign in).
    pub term: Term,
    pub body: Body,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// A (pre-)vote request. `transfer`: sent after TimeoutNow, so voters ignore their lease.
    Vote {
        pre: bool,
        transfer: bool,
        disk: DiskId,
        last_offset: Offset,
        last_term: Term,
    },
    VoteResp {
        pre: bool,
        granted: bool,
        disk: DiskId,
    },
    /// Entries after `prev_offset`, whose preceding entry has `prev_term`.
    Append {
        prev_offset: Offset,
        prev_term: Term,
        entries: Vec<Entry>,
        commit: Offset,
    },
    /// A follower's position, relative to what it verified against this leader's log:
    /// `appended` written (dirty), `flushed` durable. On reject, `hint` is where to retry from.
    AppendResp {
        disk: DiskId,
        appended: Offset,
        flushed: Offset,
        reject: Option<Offset>,
    },
    InstallSnapshot {
        snapshot: Snapshot,
    },
    /// Leadership transfer: campaign now, skipping pre-vote.
    TimeoutNow,
}

/// One coalesced heartbeat: per group the leader's term and the commit the follower may adopt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    pub from: NodeId,
    pub to: NodeId,
    /// The sender's clock when it sent this round, echoed in the answer: the leader orders an
    /// answer against the acknowledgements it holds by when its heartbeat left, so a late
    /// answer (reordered behind newer acknowledgements) is recognised as such.
    pub sent_ms: u64,
    pub groups: Vec<HeartbeatGroup>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeartbeatGroup {
    pub group: GroupId,
    pub term: Term,
    /// min(leader commit, what this follower verified): safe to adopt.
    pub commit: Offset,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatResp {
    pub from: NodeId,
    pub to: NodeId,
    /// `Heartbeat::sent_ms` of the heartbeat this answers.
    pub sent_ms: u64,
    pub groups: Vec<HeartbeatRespGroup>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeartbeatRespGroup {
    pub group: GroupId,
    /// The follower's term; above the leader's, the leader steps down.
    pub term: Term,
    pub disk: DiskId,
    pub appended: Offset,
    pub flushed: Offset,
}
