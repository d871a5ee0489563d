//! Consumer groups as a sans-I/O state machine: members, generations, assignment, committed
//! offsets. Time is an argument; the coordinator (`coordinator.rs`) owns the I/O.
//!
//! The protocol is a simplified Kafka one. A member joins (a new member gets an id) with the
//! topics it reads; every join, leave or session expiry starts a new **generation** and
//! recomputes the assignment of all partitions at once (deterministic: each partition, in
//! (topic, partition) order, goes to the subscribed member with the fewest so far, ties by member
//! id). A member learns of a new generation from its next heartbeat, which returns the current
//! assignment. A commit is accepted only from a current member, in the current generation, for a
//! partition assigned to it: so a member that lost a partition cannot move its offset, and the
//! partition's next owner resumes from the last accepted commit (at-least-once: records after
//! the last commit may be seen twice, none is skipped).
//!
//! Members are soft state (after a restart every member rejoins); committed offsets are
//! durable (`GroupRecord::Commit`), and the generation counter resumes above the highest one
//! recorded, so a generation number is never reused.

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
}

impl GroupRecord {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("group records always serialize")
    }

    pub fn decode(b: &[u8]) -> Result<GroupRecord, String> {
        let r: GroupRecord = serde_json::from_slice(b).map_err(|e| e.to_string())?;
        let GroupRecord::Commit { v, .. } = &r;
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
}

#[derive(Debug, Clone, Default)]
struct Group {
    generation: u64,
    members: BTreeMap<String, Member>,
    assignment: BTreeMap<String, Vec<TopicPartition>>,
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
        let GroupRecord::Commit {
            group,
            topic,
            partition,
            offset,
            generation,
            ..
        } = r;
        let g = self.groups.entry(group.clone()).or_default();
        g.generation = g.generation.max(*generation);
        g.committed.insert((topic.clone(), *partition), *offset);
    }

    fn group_mut(&mut self, group: &str) -> StreamResult<&mut Group> {
        self.groups
            .get_mut(group)
            .ok_or_else(|| StreamError::UnknownMember(format!("group {group} has no members")))
    }

    /// Joins `group` (a new member when `member_id` is `None` or unknown). `partitions` gives
    /// each topic's partition count (`None`: no such topic).
    pub fn join(
        &mut self,
        now_ms: u64,
        group: &str,
        member_id: Option<&str>,
        topics: Vec<String>,
        session_timeout_ms: u64,
        partitions: &dyn Fn(&str) -> Option<u32>,
    ) -> StreamResult<Assignment> {
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
                    },
                );
                (fresh, true)
            }
        };
        if changed {
            rebalance(g, partitions);
        }
        Ok(assignment_of(g, &id))
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
        Ok(assignment_of(g, member_id))
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
        if generation != g.generation {
            return Err(StreamError::StaleGeneration {
                given: generation,
                current: g.generation,
            });
        }
        let mine = g.assignment.get(member_id).cloned().unwrap_or_default();
        let mut out = Vec::with_capacity(offsets.len());
        for ((topic, partition), offset) in offsets {
            if !mine.iter().any(|(t, p)| t == topic && p == partition) {
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

fn assignment_of(g: &Group, member_id: &str) -> Assignment {
    Assignment {
        member_id: member_id.to_string(),
        generation: g.generation,
        partitions: g.assignment.get(member_id).cloned().unwrap_or_default(),
    }
}

/// A new generation and a fresh, deterministic assignment.
fn rebalance(g: &mut Group, partitions: &dyn Fn(&str) -> Option<u32>) {
    g.generation += 1;
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
        for p in 0..partitions(t).unwrap_or(0) {
            let who = subscribed
                .iter()
                .min_by_key(|id| (g.assignment[id.as_str()].len(), id.as_str()))
                .expect("a topic in the set has a subscriber");
            g.assignment
                .get_mut(who.as_str())
                .expect("every member has an entry")
                .push((t.clone(), p));
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
        assert_eq!(a2.partitions.len(), 2);
        let h1 = g.heartbeat(1, "g", &a1.member_id).unwrap();
        assert_eq!(h1.generation, 2);
        assert_eq!(h1.partitions.len(), 2);
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
        assert!(matches!(
            g.plan_commit(3, "g", &a.member_id, a.generation, &[(tp.clone(), 9)]),
            Err(StreamError::StaleGeneration { .. })
        ));
        let theirs = b.partitions[0].clone();
        assert!(matches!(
            g.plan_commit(3, "g", &a.member_id, b.generation, &[(theirs, 9)]),
            Err(StreamError::NotAssigned(_))
        ));
        assert!(matches!(
            g.plan_commit(3, "g", "nobody", b.generation, &[(tp, 9)]),
            Err(StreamError::UnknownMember(_))
        ));
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
