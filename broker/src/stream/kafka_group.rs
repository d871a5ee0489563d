//! Consumer groups as Kafka clients run them, as a sans-I/O state machine on shard 0: members
//! join with opaque protocol metadata, the coordinator elects a leader, the leader computes the
//! assignment on the client side and hands it back in SyncGroup. Time is an argument; the
//! shard's stream service (`mod.rs`) parks waiting joins and syncs and re-asks after each change.
//!
//! Sluice's own groups (`group.rs`) assign on the server; Kafka's clients insist on assigning
//! themselves (range, round robin, cooperative sticky are client code), so a Kafka group keeps
//! its own membership here. Committed offsets are shared: both kinds go to the groups log
//! (`coordinator.rs`), so `sluice group lag` sees a Kafka group's offsets. Members are soft
//! state, as in `group.rs`: after a restart every member joins again and resumes from its
//! committed offsets.
//!
//! States, as Kafka's group coordinator has them: `Empty` (no members), `PreparingRebalance`
//! (joins are collected until every known member has joined again or the rebalance timeout
//! passes), `CompletingRebalance` (a new generation is chosen; waiting for the leader's
//! SyncGroup), `Stable`.

use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};

/// Kafka groups kept at once (with members); a join of a new group beyond it is refused.
pub const KAFKA_GROUPS_MAX: usize = 10_000;
pub const KAFKA_MEMBERS_PER_GROUP_MAX: usize = 1_000;
/// Protocols (assignment strategies) one member may offer, and their metadata's size.
pub const KAFKA_PROTOCOLS_PER_MEMBER_MAX: usize = 16;
pub const KAFKA_PROTOCOL_METADATA_BYTES_MAX: usize = 64 * 1024;
pub const KAFKA_SESSION_TIMEOUT_MS_MIN: u64 = 1_000;
pub const KAFKA_SESSION_TIMEOUT_MS_MAX: u64 = 300_000;
/// The longest a rebalance waits for known members to join again.
pub const KAFKA_REBALANCE_TIMEOUT_MS_MAX: u64 = 300_000;

/// Kafka's error codes for group requests (the front end writes them as they are).
pub mod code {
    pub const NONE: i16 = 0;
    pub const ILLEGAL_GENERATION: i16 = 22;
    pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    pub const INVALID_SESSION_TIMEOUT: i16 = 26;
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    pub const GROUP_MAX_SIZE_REACHED: i16 = 81;
    pub const INVALID_REQUEST: i16 = 42;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

#[derive(Debug, Clone)]
struct Member {
    protocols: Vec<(String, Bytes)>,
    session_timeout_ms: u64,
    rebalance_timeout_ms: u64,
    last_heard_ms: u64,
    /// Joined in the rebalance now being prepared.
    joined: bool,
    assignment: Bytes,
}

#[derive(Debug, Clone)]
struct Group {
    state: GroupState,
    generation: i32,
    protocol_type: String,
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    rebalance_deadline_ms: u64,
}

/// What a member learns when its generation is formed (JoinGroup's answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinResult {
    pub generation: i32,
    pub protocol_type: String,
    pub protocol: String,
    pub leader: String,
    pub member_id: String,
    /// For the leader only: every member with its metadata for the chosen protocol.
    pub members: Vec<(String, Bytes)>,
}

/// One join, as the client sent it.
#[derive(Debug, Clone)]
pub struct JoinRequest {
    pub member_id: String,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    pub session_timeout_ms: u64,
    pub rebalance_timeout_ms: u64,
}

/// Where a waiting join or sync stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Poll<T> {
    Ready(T),
    Pending,
    Failed(i16),
}

/// A Kafka group as DescribeGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaGroupView {
    pub state: GroupState,
    pub protocol_type: String,
    /// The chosen protocol (assignor), empty while none is.
    pub protocol: String,
    /// (member id, its metadata for the chosen protocol, its assignment).
    pub members: Vec<(String, Bytes, Bytes)>,
}

impl GroupState {
    /// Kafka's name of the state (ListGroups, DescribeGroups).
    pub fn kafka_name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

#[derive(Default)]
pub struct KafkaGroups {
    groups: HashMap<String, Group>,
    next_member: u64,
}

impl KafkaGroups {
    pub fn state(&self, group: &str) -> Option<(GroupState, i32, usize)> {
        self.groups
            .get(group)
            .map(|g| (g.state, g.generation, g.members.len()))
    }

    /// The group's state, protocol and members (`None`: no live Kafka group of that name).
    pub fn view(&self, group: &str) -> Option<KafkaGroupView> {
        let g = self.groups.get(group)?;
        let protocol = g.protocol.clone().unwrap_or_default();
        Some(KafkaGroupView {
            state: g.state,
            protocol_type: g.protocol_type.clone(),
            members: g
                .members
                .iter()
                .map(|(id, m)| {
                    let meta = m
                        .protocols
                        .iter()
                        .find(|(p, _)| *p == protocol)
                        .map(|(_, b)| b.clone())
                        .unwrap_or_default();
                    (id.clone(), meta, m.assignment.clone())
                })
                .collect(),
            protocol,
        })
    }

    /// Every live Kafka group's name.
    pub fn names(&self) -> Vec<String> {
        self.groups.keys().cloned().collect()
    }

    /// A member joins (a new one when `member_id` is empty or unknown): the group starts
    /// preparing a rebalance unless it already is. Returns the member id to wait with.
    pub fn join(&mut self, now_ms: u64, group: &str, r: JoinRequest) -> Result<String, i16> {
        if !(KAFKA_SESSION_TIMEOUT_MS_MIN..=KAFKA_SESSION_TIMEOUT_MS_MAX)
            .contains(&r.session_timeout_ms)
        {
            return Err(code::INVALID_SESSION_TIMEOUT);
        }
        if r.protocols.is_empty()
            || r.protocols.len() > KAFKA_PROTOCOLS_PER_MEMBER_MAX
            || r.protocols
                .iter()
                .any(|(_, m)| m.len() > KAFKA_PROTOCOL_METADATA_BYTES_MAX)
        {
            return Err(code::INCONSISTENT_GROUP_PROTOCOL);
        }
        if !self.groups.contains_key(group) && self.groups.len() >= KAFKA_GROUPS_MAX {
            return Err(code::GROUP_MAX_SIZE_REACHED);
        }
        let g = self
            .groups
            .entry(group.to_string())
            .or_insert_with(|| Group {
                state: GroupState::Empty,
                generation: 0,
                protocol_type: r.protocol_type.clone(),
                protocol: None,
                leader: None,
                members: BTreeMap::new(),
                rebalance_deadline_ms: 0,
            });
        if !g.members.is_empty() && g.protocol_type != r.protocol_type {
            return Err(code::INCONSISTENT_GROUP_PROTOCOL);
        }
        // Every member must share at least one protocol with the others.
        let shared = g.members.values().all(|m| {
            m.protocols
                .iter()
                .any(|(n, _)| r.protocols.iter().any(|(o, _)| o == n))
        });
        if !shared {
            return Err(code::INCONSISTENT_GROUP_PROTOCOL);
        }
        g.protocol_type = r.protocol_type;
        let member_id = if r.member_id.is_empty() || !g.members.contains_key(&r.member_id) {
            if g.members.len() >= KAFKA_MEMBERS_PER_GROUP_MAX {
                return Err(code::GROUP_MAX_SIZE_REACHED);
            }
            self.next_member += 1;
            format!("sluice-{}-{}", now_ms, self.next_member)
        } else {
            r.member_id
        };
        // JoinGroup v0 has no rebalance timeout: the session timeout stands for it.
        let rebalance_timeout_ms = match r.rebalance_timeout_ms {
            0 => r.session_timeout_ms,
            t => t.min(KAFKA_REBALANCE_TIMEOUT_MS_MAX),
        };
        g.members.insert(
            member_id.clone(),
            Member {
                protocols: r.protocols,
                session_timeout_ms: r.session_timeout_ms,
                rebalance_timeout_ms,
                last_heard_ms: now_ms,
                joined: true,
                assignment: Bytes::new(),
            },
        );
        if g.state != GroupState::PreparingRebalance {
            Self::prepare_rebalance(g, now_ms);
        }
        Ok(member_id)
    }

    fn prepare_rebalance(g: &mut Group, now_ms: u64) {
        g.state = GroupState::PreparingRebalance;
        let wait = g
            .members
            .values()
            .map(|m| m.rebalance_timeout_ms)
            .max()
            .unwrap_or(0);
        g.rebalance_deadline_ms = now_ms + wait;
        for m in g.members.values_mut() {
            m.assignment = Bytes::new();
        }
    }

    /// Forms the next generation once every member has joined again or the rebalance timeout
    /// passed (members that did not join are dropped). True if something changed.
    fn try_complete(g: &mut Group, now_ms: u64) -> bool {
        if g.state != GroupState::PreparingRebalance {
            return false;
        }
        let all = g.members.values().all(|m| m.joined);
        if !all && now_ms < g.rebalance_deadline_ms {
            return false;
        }
        g.members.retain(|_, m| m.joined);
        if g.members.is_empty() {
            g.state = GroupState::Empty;
            g.leader = None;
            g.protocol = None;
            return true;
        }
        g.generation = g.generation.wrapping_add(1).max(1);
        if g.leader.as_ref().is_none_or(|l| !g.members.contains_key(l)) {
            g.leader = g.members.keys().next().cloned();
        }
        // The leader's first protocol that every member offers.
        let leader = &g.members[g.leader.as_ref().expect("a leader was chosen")];
        g.protocol = leader
            .protocols
            .iter()
            .map(|(n, _)| n)
            .find(|n| {
                g.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(o, _)| o == *n))
            })
            .cloned();
        for m in g.members.values_mut() {
            m.joined = false;
            m.last_heard_ms = now_ms;
        }
        g.state = GroupState::CompletingRebalance;
        true
    }

    /// Asked by a parked join: is the generation it joined for formed? `joined_at_generation`
    /// is the generation when the join was accepted.
    pub fn poll_join(
        &mut self,
        now_ms: u64,
        group: &str,
        member_id: &str,
        joined_at_generation: i32,
    ) -> Poll<JoinResult> {
        let Some(g) = self.groups.get_mut(group) else {
            return Poll::Failed(code::UNKNOWN_MEMBER_ID);
        };
        Self::try_complete(g, now_ms);
        let Some(m) = g.members.get(member_id) else {
            return Poll::Failed(code::UNKNOWN_MEMBER_ID);
        };
        if g.state == GroupState::PreparingRebalance || g.generation == joined_at_generation {
            return Poll::Pending;
        }
        let protocol = g.protocol.clone().unwrap_or_default();
        let leader = g.leader.clone().unwrap_or_default();
        let members = if leader == member_id {
            g.members
                .iter()
                .map(|(id, m)| {
                    let meta = m
                        .protocols
                        .iter()
                        .find(|(n, _)| *n == protocol)
                        .map(|(_, b)| b.clone())
                        .unwrap_or_default();
                    (id.clone(), meta)
                })
                .collect()
        } else {
            Vec::new()
        };
        let _ = m;
        Poll::Ready(JoinResult {
            generation: g.generation,
            protocol_type: g.protocol_type.clone(),
            protocol,
            leader,
            member_id: member_id.to_string(),
            members,
        })
    }

    fn member_check(g: &Group, member_id: &str, generation: i32) -> Result<(), i16> {
        if !g.members.contains_key(member_id) {
            return Err(code::UNKNOWN_MEMBER_ID);
        }
        if g.state == GroupState::PreparingRebalance {
            return Err(code::REBALANCE_IN_PROGRESS);
        }
        if generation != g.generation {
            return Err(code::ILLEGAL_GENERATION);
        }
        Ok(())
    }

    /// SyncGroup: the leader hands in the assignment (the group becomes stable); every member
    /// polls until its assignment is there.
    pub fn sync(
        &mut self,
        now_ms: u64,
        group: &str,
        member_id: &str,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    ) -> Result<(), i16> {
        let g = self.groups.get_mut(group).ok_or(code::UNKNOWN_MEMBER_ID)?;
        Self::member_check(g, member_id, generation)?;
        if let Some(m) = g.members.get_mut(member_id) {
            m.last_heard_ms = now_ms;
        }
        if g.state == GroupState::CompletingRebalance && g.leader.as_deref() == Some(member_id) {
            for (id, a) in assignments {
                if let Some(m) = g.members.get_mut(&id) {
                    m.assignment = a;
                }
            }
            g.state = GroupState::Stable;
        }
        Ok(())
    }

    pub fn poll_sync(
        &self,
        group: &str,
        member_id: &str,
        generation: i32,
    ) -> Poll<(String, Bytes)> {
        let Some(g) = self.groups.get(group) else {
            return Poll::Failed(code::UNKNOWN_MEMBER_ID);
        };
        if let Err(c) = Self::member_check(g, member_id, generation) {
            return Poll::Failed(c);
        }
        match g.state {
            GroupState::Stable => Poll::Ready((
                g.protocol.clone().unwrap_or_default(),
                g.members[member_id].assignment.clone(),
            )),
            _ => Poll::Pending,
        }
    }

    pub fn heartbeat(
        &mut self,
        now_ms: u64,
        group: &str,
        member_id: &str,
        generation: i32,
    ) -> Result<(), i16> {
        let g = self.groups.get_mut(group).ok_or(code::UNKNOWN_MEMBER_ID)?;
        Self::try_complete(g, now_ms);
        if let Some(m) = g.members.get_mut(member_id) {
            m.last_heard_ms = now_ms;
        }
        Self::member_check(g, member_id, generation)
    }

    pub fn leave(&mut self, now_ms: u64, group: &str, member_id: &str) -> Result<(), i16> {
        let g = self.groups.get_mut(group).ok_or(code::UNKNOWN_MEMBER_ID)?;
        if g.members.remove(member_id).is_none() {
            return Err(code::UNKNOWN_MEMBER_ID);
        }
        if g.members.is_empty() {
            g.state = GroupState::Empty;
            g.leader = None;
        } else if g.state != GroupState::PreparingRebalance {
            Self::prepare_rebalance(g, now_ms);
        }
        Ok(())
    }

    /// A commit is taken from a current member in the current generation, or (generation
    /// < 0, Kafka's "simple" commit) for a group with no members.
    pub fn commit_check(
        &mut self,
        now_ms: u64,
        group: &str,
        member_id: &str,
        generation: i32,
    ) -> Result<(), i16> {
        match self.groups.get_mut(group) {
            None if generation < 0 => Ok(()),
            None => Err(code::UNKNOWN_MEMBER_ID),
            Some(g) if generation < 0 => {
                if g.members.is_empty() {
                    Ok(())
                } else {
                    Err(code::ILLEGAL_GENERATION)
                }
            }
            Some(g) => {
                if !g.members.contains_key(member_id) {
                    return Err(code::UNKNOWN_MEMBER_ID);
                }
                if generation != g.generation {
                    return Err(code::ILLEGAL_GENERATION);
                }
                if let Some(m) = g.members.get_mut(member_id) {
                    m.last_heard_ms = now_ms;
                }
                Ok(())
            }
        }
    }

    /// Session expiry and rebalance deadlines; true if any group changed.
    pub fn tick(&mut self, now_ms: u64) -> bool {
        let mut changed = false;
        for g in self.groups.values_mut() {
            if g.state != GroupState::PreparingRebalance {
                let before = g.members.len();
                g.members
                    .retain(|_, m| now_ms <= m.last_heard_ms + m.session_timeout_ms);
                if g.members.len() != before {
                    changed = true;
                    if g.members.is_empty() {
                        g.state = GroupState::Empty;
                        g.leader = None;
                    } else {
                        Self::prepare_rebalance(g, now_ms);
                    }
                }
            }
            changed |= Self::try_complete(g, now_ms);
        }
        // Empty groups hold nothing (their offsets live in the groups log).
        self.groups.retain(|_, g| g.state != GroupState::Empty);
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(member: &str) -> JoinRequest {
        JoinRequest {
            member_id: member.to_string(),
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"meta"))],
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 5_000,
        }
    }

    #[test]
    fn two_members_form_a_generation_and_a_leave_rebalances_the_other() {
        let mut k = KafkaGroups::default();
        let a = k.join(0, "g", req("")).expect("join a");
        let Poll::Ready(ja) = k.poll_join(0, "g", &a, 0) else {
            panic!("a alone forms generation 1")
        };
        assert_eq!((ja.generation, ja.leader.as_str()), (1, a.as_str()));
        assert_eq!(ja.members.len(), 1);
        k.sync(1, "g", &a, 1, vec![(a.clone(), Bytes::from_static(b"all"))])
            .expect("sync");
        assert_eq!(
            k.poll_sync("g", &a, 1),
            Poll::Ready(("range".into(), Bytes::from_static(b"all")))
        );
        // b joins: a learns of the rebalance from its heartbeat and joins again.
        let b = k.join(2, "g", req("")).expect("join b");
        assert_eq!(k.poll_join(2, "g", &b, 1), Poll::Pending);
        assert_eq!(k.heartbeat(3, "g", &a, 1), Err(code::REBALANCE_IN_PROGRESS));
        k.join(4, "g", req(&a)).expect("rejoin a");
        let Poll::Ready(jb) = k.poll_join(4, "g", &b, 1) else {
            panic!("formed")
        };
        let Poll::Ready(ja) = k.poll_join(4, "g", &a, 1) else {
            panic!("formed")
        };
        assert_eq!(jb.generation, 2);
        assert_eq!(ja.members.len(), 2, "a stays leader and sees both");
        assert!(jb.members.is_empty());
        assert_eq!(
            k.poll_sync("g", &b, 2),
            Poll::Pending,
            "waits for the leader"
        );
        k.sync(
            5,
            "g",
            &a,
            2,
            vec![(a.clone(), "x".into()), (b.clone(), "y".into())],
        )
        .expect("sync");
        assert_eq!(
            k.poll_sync("g", &b, 2),
            Poll::Ready(("range".into(), "y".into()))
        );
        assert_eq!(k.commit_check(6, "g", &a, 1), Err(code::ILLEGAL_GENERATION));
        k.commit_check(6, "g", &a, 2).expect("current");
        // b leaves: a's next heartbeat says rebalance; a alone forms generation 3.
        k.leave(7, "g", &b).expect("leave");
        assert_eq!(k.heartbeat(8, "g", &a, 2), Err(code::REBALANCE_IN_PROGRESS));
        k.join(9, "g", req(&a)).expect("rejoin");
        let Poll::Ready(j) = k.poll_join(9, "g", &a, 2) else {
            panic!("formed")
        };
        assert_eq!((j.generation, j.members.len()), (3, 1));
    }

    #[test]
    fn a_silent_member_expires_and_one_that_does_not_rejoin_is_dropped() {
        let mut k = KafkaGroups::default();
        let a = k.join(0, "g", req("")).expect("a");
        assert!(matches!(k.poll_join(0, "g", &a, 0), Poll::Ready(_)));
        k.sync(0, "g", &a, 1, vec![]).expect("sync");
        let b = k.join(1, "g", req("")).expect("b");
        // a never rejoins: after the rebalance timeout b forms generation 2 alone.
        assert_eq!(k.poll_join(1_000, "g", &b, 1), Poll::Pending);
        let Poll::Ready(j) = k.poll_join(5_001, "g", &b, 1) else {
            panic!("formed after the timeout")
        };
        assert_eq!((j.generation, j.leader.as_str()), (2, b.as_str()));
        k.sync(5_002, "g", &b, 2, vec![]).expect("sync");
        assert_eq!(k.heartbeat(5_003, "g", &a, 2), Err(code::UNKNOWN_MEMBER_ID));
        // b goes silent past its session timeout: the group empties.
        assert!(k.tick(5_002 + 10_001));
        assert_eq!(k.state("g"), None);
        assert_eq!(k.commit_check(20_000, "g", "", -1), Ok(()));
    }
}
