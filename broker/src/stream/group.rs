//! Consumer groups as a sans-I/O state machine: members, generations, assignment, committed
//! offsets. Time is an argument; the coordinator (`coordinator.rs`) owns the I/O.
//!
//! The protocol is a simplified Kafka one, with cooperative hand-over. A member joins (a new
//! member gets an id) with the topics it reads; every join, leave or session expiry starts a
//! new **generation** with a new **target** assignment (deterministic and sticky: each
//! partition stays with its previous member while that member is under its fair share; the
//! rest go, in (topic, partition) order, to the subscribed member with the fewest, ties by
//! member id). A member learns of a generation from its join or its next heartbeat.
//!
//! **Ownership.** A partition is *owned* by the member last told it has it, until that member
//! releases it. A member is told only the partitions of its target that nobody else owns: a
//! partition moving from Y to X is withheld from X while Y owns it. Y, told it lost the
//! partition, commits its position (accepted: Y still owns it) and so releases it; a heartbeat
//! in the generation Y was already told of releases it too, as do leaving and expiry. X then
//! gets it on its next heartbeat and resumes at Y's commit: when nothing fails, no record is
//! delivered twice across a rebalance. A commit is accepted from the partition's owner,
//! whatever its generation; from anyone else it is refused (`StaleGeneration` from an older
//! generation, else `NotAssigned`), so a member that lost a partition cannot move its offset.
//! After a failure (expiry), the next owner resumes from the last accepted commit
//! (at-least-once: records after it may be seen twice, none is skipped).
//!
//! **Joining together.** The coordinator answers a join that changed the group only once no
//! other member joined for [`JOIN_SETTLE_MS`] (at most [`JOIN_WAIT_MS_MAX`]): members that
//! start together get one generation and one assignment, with nothing to hand over.
//!
//! Members and ownership are soft state (after a restart every member rejoins); committed
//! offsets are durable (`GroupRecord::Commit`), and the generation counter resumes above the
//! highest one recorded, so a generation number is never reused.

use super::{StreamError, StreamResult};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Groups the coordinator keeps (with members or committed offsets).
pub const GROUPS_MAX: usize = 10_000;
pub const MEMBERS_PER_GROUP_MAX: usize = 1_000;
pub const TOPICS_PER_MEMBER_MAX: usize = 100;
/// Offsets in one commit request.
pub const COMMITS_PER_REQUEST_MAX: usize = 10_000;
pub const GROUP_NAME_BYTES_MAX: usize = 255;
pub const SESSION_TIMEOUT_MS_MIN: u64 = 100;
pub const SESSION_TIMEOUT_MS_MAX: u64 = 300_000;
pub const GROUP_RECORD_VERSION: u32 = 1;
/// A join that changed its group is answered once no other member joined for this long...
pub const JOIN_SETTLE_MS: u64 = 100;
/// ...but no later than this after it arrived (nor after half its session).
pub const JOIN_WAIT_MS_MAX: u64 = 1_000;

/// A topic partition, by topic name.
pub type TopicPartition = (String, u32);

/// The durable records of the groups log (`<data>/groups`), JSON with a version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum GroupRecord {
    Commit {
        v: u32,
        group: String,
        topic: String,
        partition: u32,
        /// The next offset to consume.
        offset: u64,
        generation: u64,
        at_ms: u64,
    },
    /// Every committed offset of the group is gone (Kafka's DeleteGroups on an empty group).
    GroupDeleted { v: u32, group: String, at_ms: u64 },
    /// One committed offset is gone (Kafka's OffsetDelete).
    OffsetDeleted {
        v: u32,
        group: String,
        topic: String,
        partition: u32,
        at_ms: u64,
    },
}

impl GroupRecord {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("group records always serialize")
    }

    pub fn decode(b: &[u8]) -> Result<GroupRecord, String> {
        let r: GroupRecord = serde_json::from_slice(b).map_err(|e| e.to_string())?;
        let (GroupRecord::Commit { v, .. }
        | GroupRecord::GroupDeleted { v, .. }
        | GroupRecord::OffsetDeleted { v, .. }) = &r;
        if *v != GROUP_RECORD_VERSION {
            return Err(format!("unsupported group record version {v}"));
        }
        Ok(r)
    }
}

/// What a member is told: its id, the generation and its partitions in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub member_id: String,
    pub generation: u64,
    pub partitions: Vec<TopicPartition>,
}

/// A group as operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    pub generation: u64,
    pub members: Vec<(String, Vec<TopicPartition>)>,
}

#[derive(Debug, Clone)]
struct Member {
    topics: Vec<String>,
    session_timeout_ms: u64,
    last_seen_ms: u64,
    /// The generation this member was last told of (0: none yet).
    told_generation: u64,
}

#[derive(Debug, Clone, Default)]
struct Group {
    generation: u64,
    members: BTreeMap<String, Member>,
    /// The target assignment of the current generation.
    assignment: BTreeMap<String, Vec<TopicPartition>>,
    /// Who holds each partition now (told it has it, not released yet); at most one member.
    owners: BTreeMap<TopicPartition, String>,
    /// When a join last changed the membership (the settle window's start).
    joined_ms: u64,
    committed: BTreeMap<TopicPartition, u64>,
}

/// Every group of the coordinator.
#[derive(Debug, Default)]
pub struct Groups {
    groups: BTreeMap<String, Group>,
    /// Makes member ids unique across coordinator restarts (the start time, in hex).
    epoch: String,
    next_member: u64,
}

fn validate_group(name: &str) -> StreamResult<()> {
    if name.is_empty() || name.len() > GROUP_NAME_BYTES_MAX || name.chars().any(char::is_control) {
        return Err(StreamError::Invalid(format!(
            "group names are 1-{GROUP_NAME_BYTES_MAX} bytes without control characters"
        )));
    }
    Ok(())
}

impl Groups {
    pub fn new(epoch_ms: u64) -> Groups {
        Groups {
            groups: BTreeMap::new(),
            epoch: format!("{epoch_ms:x}"),
            next_member: 1,
        }
    }

    /// Replays a durable record (at start-up).
    pub fn replay(&mut self, r: &GroupRecord) {
        match r {
            GroupRecord::Commit {
                group,
                topic,
                partition,
                offset,
                generation,
                ..
            } => {
                let g = self.groups.entry(group.clone()).or_default();
                g.generation = g.generation.max(*generation);
                g.committed.insert((topic.clone(), *partition), *offset);
            }
            GroupRecord::GroupDeleted { group, .. } => {
                if let Some(g) = self.groups.get_mut(group) {
                    g.committed.clear();
                    if g.members.is_empty() {
                        self.groups.remove(group);
                    }
                }
            }
            GroupRecord::OffsetDeleted {
                group,
                topic,
                partition,
                ..
            } => {
                if let Some(g) = self.groups.get_mut(group) {
                    g.committed.remove(&(topic.clone(), *partition));
                    if g.members.is_empty() && g.committed.is_empty() {
                        self.groups.remove(group);
                    }
                }
            }
        }
    }

    /// Whether the group is known (members or committed offsets), and whether it has members.
    pub fn presence(&self, group: &str) -> Option<bool> {
        self.groups.get(group).map(|g| !g.members.is_empty())
    }

    fn group_mut(&mut self, group: &str) -> StreamResult<&mut Group> {
        self.groups
            .get_mut(group)
            .ok_or_else(|| StreamError::UnknownMember(format!("group {group} has no members")))
    }

    /// Joins `group` (a new member when `member_id` is `None` or unknown) and tells it its
    /// assignment at once. `partitions` gives each topic's partition count (`None`: no such
    /// topic). The coordinator uses [`Groups::register`] and tells later (the settle window).
    pub fn join(
        &mut self,
        now_ms: u64,
        group: &str,
        member_id: Option<&str>,
        topics: Vec<String>,
        session_timeout_ms: u64,
        partitions: &dyn Fn(&str) -> Option<u32>,
    ) -> StreamResult<Assignment> {
        let (id, _) = self.register(
            now_ms,
            group,
            member_id,
            topics,
            session_timeout_ms,
            partitions,
        )?;
        self.heartbeat(now_ms, group, &id)
    }

    /// A join without its answer: the member is in the group (a new generation if that
    /// changed anything), not told yet. Returns its id and whether the group changed.
    pub fn register(
        &mut self,
        now_ms: u64,
        group: &str,
        member_id: Option<&str>,
        topics: Vec<String>,
        session_timeout_ms: u64,
        partitions: &dyn Fn(&str) -> Option<u32>,
    ) -> StreamResult<(String, bool)> {
        validate_group(group)?;
        if topics.is_empty() || topics.len() > TOPICS_PER_MEMBER_MAX {
            return Err(StreamError::Invalid(format!(
                "a member reads 1-{TOPICS_PER_MEMBER_MAX} topics"
            )));
        }
        if !(SESSION_TIMEOUT_MS_MIN..=SESSION_TIMEOUT_MS_MAX).contains(&session_timeout_ms) {
            return Err(StreamError::Invalid(format!(
                "session timeout must be within {SESSION_TIMEOUT_MS_MIN}..={SESSION_TIMEOUT_MS_MAX} ms"
            )));
        }
        for t in &topics {
            if partitions(t).is_none() {
                return Err(StreamError::UnknownTopic(t.clone()));
            }
        }
        let mut topics = topics;
        topics.sort();
        topics.dedup();
        if !self.groups.contains_key(group) && self.groups.len() >= GROUPS_MAX {
            return Err(StreamError::LimitExceeded("consumer groups"));
        }
        let fresh = format!("{}-{}", self.epoch, self.next_member);
        let g = self.groups.entry(group.to_string()).or_default();
        let (id, changed) = match member_id.filter(|m| g.members.contains_key(*m)) {
            Some(m) => {
                let member = g.members.get_mut(m).expect("checked");
                member.last_seen_ms = now_ms;
                member.session_timeout_ms = session_timeout_ms;
                let changed = member.topics != topics;
                member.topics = topics;
                (m.to_string(), changed)
            }
            None => {
                if g.members.len() >= MEMBERS_PER_GROUP_MAX {
                    return Err(StreamError::LimitExceeded("members per group"));
                }
                self.next_member += 1;
                g.members.insert(
                    fresh.clone(),
                    Member {
                        topics,
                        session_timeout_ms,
                        last_seen_ms: now_ms,
                        told_generation: 0,
                    },
                );
                (fresh, true)
            }
        };
        if changed {
            g.joined_ms = now_ms;
            rebalance(g, partitions);
        }
        Ok((id, changed))
    }

    /// When the settle window of `group`'s last membership change ends (see
    /// [`JOIN_SETTLE_MS`]); `None` for an unknown group.
    pub fn settles_at_ms(&self, group: &str) -> Option<u64> {
        self.groups
            .get(group)
            .map(|g| g.joined_ms.saturating_add(JOIN_SETTLE_MS))
    }

    /// A member's heartbeat: keeps it alive and tells it the current assignment.
    pub fn heartbeat(
        &mut self,
        now_ms: u64,
        group: &str,
        member_id: &str,
    ) -> StreamResult<Assignment> {
        let g = self.group_mut(group)?;
        let m = g
            .members
            .get_mut(member_id)
            .ok_or_else(|| StreamError::UnknownMember(member_id.to_string()))?;
        m.last_seen_ms = now_ms;
        if m.told_generation == g.generation {
            // It was told of this generation before: what it lost is released.
            release_revoked(g, member_id);
        }
        Ok(tell(g, member_id))
    }

    pub fn leave(
        &mut self,
        group: &str,
        member_id: &str,
        partitions: &dyn Fn(&str) -> Option<u32>,
    ) -> StreamResult<()> {
        let g = self.group_mut(group)?;
        if g.members.remove(member_id).is_none() {
            return Err(StreamError::UnknownMember(member_id.to_string()));
        }
        g.owners.retain(|_, o| o != member_id);
        rebalance(g, partitions);
        self.forget_empty();
        Ok(())
    }

    /// Expires members whose session ran out; returns how many.
    pub fn tick(&mut self, now_ms: u64, partitions: &dyn Fn(&str) -> Option<u32>) -> usize {
        let mut expired = 0;
        for g in self.groups.values_mut() {
            let before = g.members.len();
            g.members
                .retain(|_, m| now_ms < m.last_seen_ms.saturating_add(m.session_timeout_ms));
            if g.members.len() != before {
                let members = &g.members;
                g.owners.retain(|_, o| members.contains_key(o));
                expired += before - g.members.len();
                rebalance(g, partitions);
            }
        }
        if expired > 0 {
            self.forget_empty();
        }
        expired
    }

    fn forget_empty(&mut self) {
        self.groups
            .retain(|_, g| !g.members.is_empty() || !g.committed.is_empty());
    }

    /// Checks a commit and returns the records that make it durable. The caller stages them in
    /// the groups log and then calls [`Groups::replay`] on each (no await in between).
    pub fn plan_commit(
        &mut self,
        now_ms: u64,
        group: &str,
        member_id: &str,
        generation: u64,
        offsets: &[(TopicPartition, u64)],
    ) -> StreamResult<Vec<GroupRecord>> {
        if offsets.len() > COMMITS_PER_REQUEST_MAX {
            return Err(StreamError::LimitExceeded("offsets per commit"));
        }
        let g = self.group_mut(group)?;
        let m = g
            .members
            .get_mut(member_id)
            .ok_or_else(|| StreamError::UnknownMember(member_id.to_string()))?;
        m.last_seen_ms = now_ms;
        let current = generation == g.generation && m.told_generation == g.generation;
        let mut out = Vec::with_capacity(offsets.len());
        for (tp, offset) in offsets {
            let (topic, partition) = tp;
            // The owner's commit counts, whatever its generation: nobody else has the
            // partition until it is released.
            if g.owners.get(tp).map(String::as_str) != Some(member_id) {
                if generation != g.generation {
                    return Err(StreamError::StaleGeneration {
                        given: generation,
                        current: g.generation,
                    });
                }
                return Err(StreamError::NotAssigned(format!("{topic}/{partition}")));
            }
            out.push(GroupRecord::Commit {
                v: GROUP_RECORD_VERSION,
                group: group.to_string(),
                topic: topic.clone(),
                partition: *partition,
                offset: *offset,
                generation,
                at_ms: now_ms,
            });
        }
        if current {
            // A commit in the generation it was told of: what it lost is released (the
            // caller applies these records before anyone can read the offsets).
            release_revoked(g, member_id);
        }
        Ok(out)
    }

    /// The records of a commit whose membership was checked elsewhere (a Kafka group:
    /// `kafka_group.rs`). They carry generation 0, so they never raise the generation of a
    /// native group of the same name.
    pub fn plan_commit_checked(
        &self,
        now_ms: u64,
        group: &str,
        offsets: &[(TopicPartition, u64)],
    ) -> StreamResult<Vec<GroupRecord>> {
        if offsets.len() > COMMITS_PER_REQUEST_MAX {
            return Err(StreamError::LimitExceeded("offsets per commit"));
        }
        if !self.groups.contains_key(group) && self.groups.len() >= GROUPS_MAX {
            return Err(StreamError::LimitExceeded("consumer groups"));
        }
        Ok(offsets
            .iter()
            .map(|((topic, partition), offset)| GroupRecord::Commit {
                v: GROUP_RECORD_VERSION,
                group: group.to_string(),
                topic: topic.clone(),
                partition: *partition,
                offset: *offset,
                generation: 0,
                at_ms: now_ms,
            })
            .collect())
    }

    /// Every committed offset as commit records (with its group's generation): replaying them
    /// alone rebuilds the committed state.
    pub fn restatement(&self, now_ms: u64) -> Vec<GroupRecord> {
        self.groups
            .iter()
            .flat_map(|(name, g)| {
                g.committed
                    .iter()
                    .map(move |((topic, partition), offset)| GroupRecord::Commit {
                        v: GROUP_RECORD_VERSION,
                        group: name.clone(),
                        topic: topic.clone(),
                        partition: *partition,
                        offset: *offset,
                        generation: g.generation,
                        at_ms: now_ms,
                    })
            })
            .collect()
    }

    pub fn committed(&self, group: &str) -> BTreeMap<TopicPartition, u64> {
        self.groups
            .get(group)
            .map(|g| g.committed.clone())
            .unwrap_or_default()
    }

    /// Every group's name (qualified by tenant), in order (at most `GROUPS_MAX`).
    pub fn list(&self) -> Vec<String> {
        self.groups.keys().cloned().collect()
    }

    /// The group's generation and each member's partitions (for operators and tests).
    pub fn describe(&self, group: &str) -> Option<GroupDescription> {
        self.groups.get(group).map(|g| GroupDescription {
            generation: g.generation,
            members: g
                .members
                .keys()
                .map(|m| (m.clone(), g.assignment.get(m).cloned().unwrap_or_default()))
                .collect(),
        })
    }
}

/// Tells `member_id` its partitions: those of its target that nobody else owns, which it owns
/// from now on. A partition still owned by another member is withheld until released.
fn tell(g: &mut Group, member_id: &str) -> Assignment {
    let target = g.assignment.get(member_id).cloned().unwrap_or_default();
    let mut granted = Vec::with_capacity(target.len());
    for tp in target {
        match g.owners.get(&tp) {
            Some(o) if o != member_id => {}
            _ => {
                g.owners.insert(tp.clone(), member_id.to_string());
                granted.push(tp);
            }
        }
    }
    if let Some(m) = g.members.get_mut(member_id) {
        m.told_generation = g.generation;
    }
    Assignment {
        member_id: member_id.to_string(),
        generation: g.generation,
        partitions: granted,
    }
}

/// Releases what `member_id` owns outside its target (it was told it lost them).
fn release_revoked(g: &mut Group, member_id: &str) {
    let target = g.assignment.get(member_id);
    g.owners
        .retain(|tp, o| o != member_id || target.is_some_and(|t| t.contains(tp)));
}

/// A new generation and a new target assignment: balanced per topic (shares differ by at most
/// one) and sticky (a partition stays with its previous member while it is within its share),
/// so a join or a leave moves as few partitions as balance needs.
fn rebalance(g: &mut Group, partitions: &dyn Fn(&str) -> Option<u32>) {
    g.generation += 1;
    let previous: BTreeMap<TopicPartition, String> = g
        .assignment
        .iter()
        .flat_map(|(m, tps)| tps.iter().map(move |tp| (tp.clone(), m.clone())))
        .collect();
    g.assignment = g.members.keys().map(|m| (m.clone(), Vec::new())).collect();
    let topics: std::collections::BTreeSet<&String> =
        g.members.values().flat_map(|m| m.topics.iter()).collect();
    for t in topics {
        let subscribed: Vec<&String> = g
            .members
            .iter()
            .filter(|(_, m)| m.topics.contains(t))
            .map(|(id, _)| id)
            .collect();
        let n = partitions(t).unwrap_or(0);
        let base = n as usize / subscribed.len();
        let mut extra = n as usize % subscribed.len();
        let mut count: BTreeMap<&str, usize> = subscribed.iter().map(|m| (m.as_str(), 0)).collect();
        let mut chosen: Vec<Option<&str>> = vec![None; n as usize];
        // Sticky passes: first up to each member's base share, then the extra places.
        for extra_pass in [false, true] {
            for p in 0..n {
                if chosen[p as usize].is_some() {
                    continue;
                }
                let Some(prev) = previous.get(&(t.clone(), p)) else {
                    continue;
                };
                let Some(c) = count.get_mut(prev.as_str()) else {
                    continue;
                };
                let keep = if extra_pass {
                    *c == base && extra > 0
                } else {
                    *c < base
                };
                if keep {
                    if extra_pass {
                        extra -= 1;
                    }
                    *c += 1;
                    chosen[p as usize] = Some(
                        subscribed[subscribed
                            .iter()
                            .position(|m| *m == prev)
                            .expect("counted members are subscribed")],
                    );
                }
            }
        }
        for (p, who) in chosen.iter_mut().enumerate() {
            let who = match who {
                Some(w) => *w,
                None => {
                    let w = subscribed
                        .iter()
                        .map(|m| m.as_str())
                        .min_by_key(|m| (count[m], *m))
                        .expect("a topic in the set has a subscriber");
                    *count.get_mut(w).expect("subscribed") += 1;
                    w
                }
            };
            g.assignment
                .get_mut(who)
                .expect("every member has an entry")
                .push((t.clone(), p as u32));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(t: &str) -> Option<u32> {
        match t {
            "a" => Some(4),
            "b" => Some(1),
            _ => None,
        }
    }

    #[test]
    fn join_rebalances_fairly_and_deterministically() {
        let mut g = Groups::new(1);
        let a1 = g
            .join(0, "g", None, vec!["a".into()], 1000, &parts)
            .unwrap();
        assert_eq!(a1.partitions.len(), 4);
        assert_eq!(a1.generation, 1);
        let a2 = g
            .join(0, "g", None, vec!["a".into()], 1000, &parts)
            .unwrap();
        assert_eq!(a2.generation, 2);
        // Its share is still a1's: withheld until a1 releases it.
        assert!(a2.partitions.is_empty());
        let h1 = g.heartbeat(1, "g", &a1.member_id).unwrap();
        assert_eq!(h1.generation, 2);
        assert_eq!(h1.partitions.len(), 2);
        // A heartbeat in the generation it was told of releases what a1 lost.
        assert_eq!(g.heartbeat(1, "g", &a1.member_id).unwrap(), h1);
        let a2 = g.heartbeat(1, "g", &a2.member_id).unwrap();
        assert_eq!(a2.partitions.len(), 2);
        let mut all: Vec<_> = h1
            .partitions
            .iter()
            .chain(&a2.partitions)
            .cloned()
            .collect();
        all.sort();
        assert_eq!(
            all,
            (0..4).map(|p| ("a".to_string(), p)).collect::<Vec<_>>()
        );
        // Rejoining with the same topics changes nothing.
        let again = g
            .join(2, "g", Some(&a1.member_id), vec!["a".into()], 1000, &parts)
            .unwrap();
        assert_eq!(again.generation, 2);
        assert!(matches!(
            g.join(0, "g", None, vec!["zz".into()], 1000, &parts),
            Err(StreamError::UnknownTopic(_))
        ));
        assert!(g.join(0, "", None, vec!["a".into()], 1000, &parts).is_err());
        assert!(g.join(0, "g", None, vec!["a".into()], 1, &parts).is_err());
    }

    #[test]
    fn commits_need_the_current_generation_and_the_partition() {
        let mut g = Groups::new(1);
        let a = g
            .join(0, "g", None, vec!["a".into()], 1000, &parts)
            .unwrap();
        let tp = ("a".to_string(), 0);
        let recs = g
            .plan_commit(1, "g", &a.member_id, a.generation, &[(tp.clone(), 5)])
            .unwrap();
        for r in &recs {
            g.replay(r);
        }
        assert_eq!(g.committed("g").get(&tp), Some(&5));
        let b = g
            .join(2, "g", None, vec!["a".into()], 1000, &parts)
            .unwrap();
        // `a` still owns every partition (not told yet): its commits count, in any generation.
        let theirs = ("a".to_string(), 3);
        assert!(g
            .plan_commit(3, "g", &a.member_id, a.generation, &[(theirs.clone(), 9)])
            .is_ok());
        // Told, then committing in the new generation: what it lost is released...
        g.heartbeat(3, "g", &a.member_id).unwrap();
        assert!(g
            .plan_commit(3, "g", &a.member_id, b.generation, &[(tp.clone(), 6)])
            .is_ok());
        // ...and no longer its to commit.
        assert!(matches!(
            g.plan_commit(3, "g", &a.member_id, a.generation, &[(theirs.clone(), 9)]),
            Err(StreamError::StaleGeneration { .. })
        ));
        assert!(matches!(
            g.plan_commit(3, "g", &a.member_id, b.generation, &[(theirs, 9)]),
            Err(StreamError::NotAssigned(_))
        ));
        assert!(matches!(
            g.plan_commit(3, "g", "nobody", b.generation, &[(tp, 9)]),
            Err(StreamError::UnknownMember(_))
        ));
    }

    impl Groups {
        fn clone_plan(
            &mut self,
            now_ms: u64,
            member: &str,
            generation: u64,
            offsets: &[(TopicPartition, u64)],
        ) -> StreamResult<Vec<GroupRecord>> {
            self.plan_commit(now_ms, "g", member, generation, offsets)
        }
    }

    fn apply(g: &mut Groups, recs: StreamResult<Vec<GroupRecord>>) {
        for r in &recs.expect("commit accepted") {
            g.replay(r);
        }
    }

    /// Issue 29: a partition moves only at its owner's commit; the new member resumes there
    /// and nobody reads it in between. Sticky targets move as little as balance needs.
    #[test]
    fn a_rebalance_hands_partitions_over_at_the_owners_commit() {
        let mut g = Groups::new(1);
        let a = g
            .join(0, "g", None, vec!["a".into()], 1000, &parts)
            .unwrap();
        assert_eq!(a.partitions.len(), 4);
        let b = g
            .join(10, "g", None, vec!["a".into()], 1000, &parts)
            .unwrap();
        assert!(b.partitions.is_empty(), "withheld while a owns them");
        // a, not told yet, commits what it read (its old generation): accepted.
        let p3 = ("a".to_string(), 3);
        let r = g.clone_plan(20, &a.member_id, 1, &[(p3.clone(), 40)]);
        apply(&mut g, r);
        let told = g.heartbeat(30, "g", &a.member_id).unwrap();
        assert_eq!(told.generation, 2);
        assert_eq!(
            told.partitions,
            [("a".to_string(), 0), ("a".to_string(), 1)]
        );
        assert!(g
            .heartbeat(31, "g", &b.member_id)
            .unwrap()
            .partitions
            .is_empty());
        // a commits its lost partitions' positions in generation 2: released.
        let r = g.clone_plan(40, &a.member_id, 2, &[(p3.clone(), 42)]);
        apply(&mut g, r);
        let got = g.heartbeat(50, "g", &b.member_id).unwrap();
        assert_eq!(got.partitions, [("a".to_string(), 2), ("a".to_string(), 3)]);
        assert_eq!(
            g.committed("g").get(&p3),
            Some(&42),
            "b resumes at a's commit"
        );
        assert!(g
            .plan_commit(60, "g", &b.member_id, 2, &[(p3.clone(), 50)])
            .is_ok());
        // A third member takes one partition; the other three stay where they are.
        let c = g
            .join(70, "g", None, vec!["a".into()], 1000, &parts)
            .unwrap();
        let d = g.describe("g").unwrap();
        let of = |m: &str| d.members.iter().find(|(id, _)| id == m).unwrap().1.clone();
        assert_eq!(of(&a.member_id).len() + of(&b.member_id).len(), 3);
        assert_eq!(of(&c.member_id).len(), 1);
        assert!(of(&a.member_id).contains(&("a".to_string(), 0)));
        assert!(of(&b.member_id).contains(&("a".to_string(), 2)));
        // Expiry releases what a member owned (a failure: at-least-once from the last commit).
        g.heartbeat(900, "g", &b.member_id).unwrap();
        g.heartbeat(900, "g", &c.member_id).unwrap();
        assert_eq!(g.tick(1100, &parts), 1);
        let cb = g.heartbeat(1110, "g", &b.member_id).unwrap();
        let cc = g.heartbeat(1110, "g", &c.member_id).unwrap();
        assert_eq!(cb.generation, cc.generation);
        // Each releases what it lost on its next heartbeat; the one after grants the rest.
        for t in [1111, 1112] {
            g.heartbeat(t, "g", &b.member_id).unwrap();
            g.heartbeat(t, "g", &c.member_id).unwrap();
        }
        let b2 = g.heartbeat(1113, "g", &b.member_id).unwrap();
        let c2 = g.heartbeat(1113, "g", &c.member_id).unwrap();
        assert_eq!(
            b2.partitions.len() + c2.partitions.len(),
            4,
            "{b2:?} {c2:?}"
        );
    }

    #[test]
    fn a_join_settles_after_the_last_join() {
        let mut g = Groups::new(1);
        assert_eq!(g.settles_at_ms("g"), None);
        let (_, changed) = g
            .register(100, "g", None, vec!["a".into()], 1000, &parts)
            .unwrap();
        assert!(changed);
        assert_eq!(g.settles_at_ms("g"), Some(100 + JOIN_SETTLE_MS));
        let (id, _) = g
            .register(150, "g", None, vec!["a".into()], 1000, &parts)
            .unwrap();
        assert_eq!(g.settles_at_ms("g"), Some(150 + JOIN_SETTLE_MS));
        // Rejoining with the same topics changes nothing and does not wait.
        let (_, changed) = g
            .register(400, "g", Some(&id), vec!["a".into()], 1000, &parts)
            .unwrap();
        assert!(!changed);
        assert_eq!(g.settles_at_ms("g"), Some(150 + JOIN_SETTLE_MS));
    }

    #[test]
    fn expiry_moves_partitions_and_replay_keeps_generations_rising() {
        let mut g = Groups::new(1);
        let a = g
            .join(0, "g", None, vec!["a".into(), "b".into()], 1000, &parts)
            .unwrap();
        let b = g
            .join(0, "g", None, vec!["a".into()], 1000, &parts)
            .unwrap();
        assert_eq!(g.tick(500, &parts), 0);
        g.heartbeat(900, "g", &a.member_id).unwrap();
        assert_eq!(g.tick(1500, &parts), 1);
        let h = g.heartbeat(1500, "g", &a.member_id).unwrap();
        assert_eq!(h.partitions.len(), 5);
        assert!(g.heartbeat(1500, "g", &b.member_id).is_err());
        let recs = g
            .plan_commit(
                1600,
                "g",
                &a.member_id,
                h.generation,
                &[(("b".into(), 0), 7)],
            )
            .unwrap();
        let mut fresh = Groups::new(2);
        for r in &recs {
            assert_eq!(GroupRecord::decode(&r.encode()).as_ref(), Ok(r));
            fresh.replay(r);
        }
        let n = fresh
            .join(0, "g", None, vec!["b".into()], 1000, &parts)
            .unwrap();
        assert!(n.generation > h.generation);
        assert_eq!(fresh.committed("g").get(&("b".to_string(), 0)), Some(&7));
        assert!(GroupRecord::decode(br#"{"type":"Commit","v":9}"#).is_err());
    }
}
