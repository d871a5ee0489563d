//! Kafka share groups (KIP-932): membership, share sessions and the records each member has
//! acquired, on shard 0 beside the classic groups (`coordinator.rs`). The records' locks are
//! not here: a share group reads `queue:<name>` through the queue engine, so a record's lock
//! is the engine's lease on the message (durable, shared with SQS receivers, ended by its
//! deadline). What this keeps is which member holds which lease — the receipt each
//! acknowledgement needs and the proof that the member acknowledging is the one that acquired
//! the record — in memory: after a restart the leases simply run out and are delivered again.
//!
//! Requests reach shard 0 over the mesh (`StreamOp::Share`); the engine calls (receive,
//! delete, change visibility) run on the connection's shard (`crate::kafka::share`).

use super::{qualify, StreamError, StreamOp, StreamReply, StreamResult};
use crate::engine::{Payload, Receipt};
use crate::shard::Shard;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// Kafka's error codes the share coordinator answers (`org.apache.kafka.common.protocol.Errors`).
pub mod share_code {
    pub const INVALID_REQUEST: i16 = 42;
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    pub const GROUP_ID_NOT_FOUND: i16 = 69;
    pub const GROUP_MAX_SIZE_REACHED: i16 = 81;
    pub const FENCED_MEMBER_EPOCH: i16 = 110;
    pub const INVALID_RECORD_STATE: i16 = 121;
    pub const SHARE_SESSION_NOT_FOUND: i16 = 122;
    pub const INVALID_SHARE_SESSION_EPOCH: i16 = 123;
    pub const NON_EMPTY_GROUP: i16 = 68;
}
use share_code::*;

/// A member not heard from for this long leaves its group (Kafka's
/// `group.share.session.timeout.ms` default).
pub const SHARE_SESSION_TIMEOUT_MS: u64 = 45_000;
/// How often members are told to heartbeat (Kafka's `group.share.heartbeat.interval.ms`).
pub const SHARE_HEARTBEAT_INTERVAL_MS: i32 = 5_000;
/// A record is delivered at most this many times to a share group unless the group sets
/// `share.delivery.count.limit` (Kafka's `group.share.delivery.count.limit` default).
pub const SHARE_DELIVERY_COUNT_LIMIT_DEFAULT: u32 = 5;
/// Bounds of the delivery count limit a group may set (Kafka's: 2..=10).
pub const SHARE_DELIVERY_COUNT_LIMIT_MIN: u32 = 2;
pub const SHARE_DELIVERY_COUNT_LIMIT_MAX: u32 = 10;
/// Bounds of `share.record.lock.duration.ms` (Kafka's 1 s .. 1 h); the queue engine's leases
/// count whole seconds, so a lock is rounded up to the next second.
pub const SHARE_LOCK_DURATION_MS_MIN: u64 = 1_000;
pub const SHARE_LOCK_DURATION_MS_MAX: u64 = 3_600_000;
/// Members per share group (Kafka's `group.share.max.size` default).
pub const SHARE_GROUP_MEMBERS_MAX: usize = 200;
/// Records one group may hold acquired at once: the map is bounded even if members never
/// acknowledge (the leases end on their own; the oldest entries are the first to go).
pub const SHARE_ACQUIRED_RECORDS_MAX: usize = 100_000;
/// The config names a group may set (IncrementalAlterConfigs on a GROUP resource).
pub const CONFIG_LOCK_DURATION_MS: &str = "share.record.lock.duration.ms";
pub const CONFIG_DELIVERY_COUNT_LIMIT: &str = "share.delivery.count.limit";

/// One acquired record: which queue partition and message (the Kafka offset is the message's
/// id within its partition), the lease's receipt and what a REJECT needs to copy it to the
/// dead-letter queue.
#[derive(Debug, Clone)]
pub struct Acquired {
    /// The queue's name (its id below tells a queue re-created under the name apart).
    pub queue: String,
    pub queue_id: u64,
    pub partition: u32,
    pub receipt: Receipt,
    pub payload: Arc<Payload>,
    /// The lock's end as this member was told (the engine's lease ends then too).
    pub lock_until_ms: u64,
}

impl Acquired {
    pub fn key(&self) -> RecordKey {
        (self.queue_id, self.partition, self.receipt.msg_id)
    }
}

/// (queue id, partition, message id).
pub type RecordKey = (u64, u32, u64);

/// A group's settings (`share.*` group configs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareConfig {
    /// `None`: the queue's visibility timeout.
    pub lock_duration_ms: Option<u64>,
    pub delivery_count_limit: u32,
}

impl Default for ShareConfig {
    fn default() -> Self {
        ShareConfig {
            lock_duration_ms: None,
            delivery_count_limit: SHARE_DELIVERY_COUNT_LIMIT_DEFAULT,
        }
    }
}

/// A member's share session: the partitions it fetches (topic name, partition) and the epoch
/// its next request must carry.
#[derive(Debug, Clone, Default)]
struct Session {
    next_epoch: i32,
    partitions: BTreeSet<(String, u32)>,
}

#[derive(Debug, Clone)]
struct Member {
    epoch: i32,
    topics: Vec<String>,
    last_seen_ms: u64,
    session: Option<Session>,
}

#[derive(Debug, Clone, Default)]
struct ShareGroup {
    epoch: i32,
    members: BTreeMap<String, Member>,
    config: ShareConfig,
    acquired: HashMap<RecordKey, (String, Acquired)>,
}

/// What a share group looks like from outside (ShareGroupDescribe, ListGroups).
#[derive(Debug, Clone)]
pub struct ShareGroupInfo {
    /// Unqualified.
    pub name: String,
    pub epoch: i32,
    /// "Empty" or "Stable".
    pub state: &'static str,
    /// (member id, member epoch, subscribed topic names).
    pub members: Vec<(String, i32, Vec<String>)>,
    pub config: ShareConfig,
}

/// A share group request to shard 0. Group names are qualified (`tenant/group`) by
/// [`Shard::share_request`].
#[derive(Debug)]
pub enum ShareOp {
    /// ShareGroupHeartbeat: `epoch` 0 joins, -1 leaves, else keeps the member alive.
    Heartbeat {
        group: String,
        member: String,
        epoch: i32,
        topics: Option<Vec<String>>,
    },
    /// A ShareFetch or ShareAcknowledge's session step: checks the member and the epoch,
    /// opens (0), continues (n, adding `add` and dropping `forget`) or closes (-1) it.
    Session {
        group: String,
        member: String,
        epoch: i32,
        add: Vec<(String, u32)>,
        forget: Vec<(String, u32)>,
        /// ShareAcknowledge cannot open a session.
        may_open: bool,
    },
    /// Takes the member's acquired records out, per partition, all or none of each list: a
    /// record the member does not hold fails its whole list with INVALID_RECORD_STATE and
    /// nothing of that list is taken.
    Take {
        group: String,
        member: String,
        lists: Vec<Vec<RecordKey>>,
    },
    /// Records a share fetch acquired for a member: refused (and to be released by the caller)
    /// if the member left meanwhile.
    Acquire {
        group: String,
        member: String,
        records: Vec<Acquired>,
    },
    Describe {
        groups: Vec<String>,
    },
    /// Every share group's qualified name and state.
    List,
    /// DeleteGroups of a share group: only an empty one.
    Delete {
        group: String,
    },
    Configure {
        group: String,
        lock_duration_ms: Option<Option<u64>>,
        delivery_count_limit: Option<Option<u32>>,
        validate_only: bool,
    },
}

/// A refusal: Kafka's code and a message for the client.
pub type ShareRefusal = (i16, String);

#[derive(Debug)]
pub enum ShareReply {
    /// The member's epoch and subscribed topics (heartbeat); on leaving, the records it held
    /// (to be released).
    Member {
        epoch: i32,
        topics: Vec<String>,
        released: Vec<Acquired>,
    },
    /// The session's partitions and the group's config; on close, the records the member held.
    Session {
        partitions: Vec<(String, u32)>,
        config: ShareConfig,
        released: Vec<Acquired>,
    },
    /// Per list, and the group's config (which the acknowledgements act under).
    Taken(Vec<Result<Vec<Acquired>, ShareRefusal>>, ShareConfig),
    Described(Vec<Option<ShareGroupInfo>>),
    Listed(Vec<(String, &'static str)>),
    Done,
}

/// Every share group of the broker (shard 0).
#[derive(Debug, Default)]
pub struct ShareGroups {
    groups: HashMap<String, ShareGroup>,
}

fn refuse<T>(code: i16, msg: impl Into<String>) -> Result<T, ShareRefusal> {
    Err((code, msg.into()))
}

/// The epoch after `e`: positive, wrapping past i32::MAX to 1 (0 opens, -1 closes).
fn next_epoch(e: i32) -> i32 {
    if e == i32::MAX {
        1
    } else {
        e + 1
    }
}

impl ShareGroups {
    /// Members silent longer than the session timeout leave (their records' leases end on
    /// their own); entries whose lock has ended are dropped.
    fn expire(&mut self, now_ms: u64) {
        for g in self.groups.values_mut() {
            let before = g.members.len();
            g.members
                .retain(|_, m| m.last_seen_ms + SHARE_SESSION_TIMEOUT_MS > now_ms);
            if g.members.len() != before {
                g.epoch = next_epoch(g.epoch);
            }
            let members = &g.members;
            g.acquired
                .retain(|_, (m, a)| a.lock_until_ms > now_ms && members.contains_key(m));
        }
    }

    /// The group of a known member, its last-seen time refreshed.
    fn member_group(
        &mut self,
        group: &str,
        member: &str,
        now_ms: u64,
    ) -> Result<&mut ShareGroup, ShareRefusal> {
        let Some(g) = self.groups.get_mut(group) else {
            return refuse(UNKNOWN_MEMBER_ID, "no such share group member");
        };
        let Some(m) = g.members.get_mut(member) else {
            return refuse(UNKNOWN_MEMBER_ID, "no such share group member");
        };
        m.last_seen_ms = now_ms;
        Ok(g)
    }

    /// Serves one request. `classic` says whether a classic group of that name exists (a
    /// share request on it is refused: a group has one type).
    pub fn handle(
        &mut self,
        op: ShareOp,
        now_ms: u64,
        classic: bool,
    ) -> Result<ShareReply, ShareRefusal> {
        self.expire(now_ms);
        let group_name = match &op {
            ShareOp::Heartbeat { group, .. }
            | ShareOp::Session { group, .. }
            | ShareOp::Take { group, .. }
            | ShareOp::Acquire { group, .. }
            | ShareOp::Delete { group }
            | ShareOp::Configure { group, .. } => Some(group.clone()),
            ShareOp::Describe { .. } | ShareOp::List => None,
        };
        if classic && group_name.is_some_and(|g| !self.groups.contains_key(&g)) {
            return refuse(GROUP_ID_NOT_FOUND, "the group is not a share group");
        }
        match op {
            ShareOp::Heartbeat {
                group,
                member,
                epoch,
                topics,
            } => self.heartbeat(group, member, epoch, topics, now_ms),
            ShareOp::Session {
                group,
                member,
                epoch,
                add,
                forget,
                may_open,
            } => {
                let g = self.member_group(&group, &member, now_ms)?;
                let config = g.config;
                let ShareGroup {
                    members, acquired, ..
                } = g;
                let Some(m) = members.get_mut(&member) else {
                    return refuse(UNKNOWN_MEMBER_ID, "no such share group member");
                };
                let mut released = Vec::new();
                match epoch {
                    -1 => {
                        if m.session.take().is_none() {
                            return refuse(SHARE_SESSION_NOT_FOUND, "no share session to close");
                        }
                        released = take_all(acquired, &member);
                    }
                    0 if !may_open => {
                        return refuse(
                            INVALID_SHARE_SESSION_EPOCH,
                            "a share session is opened by ShareFetch",
                        )
                    }
                    0 => {
                        m.session = Some(Session {
                            next_epoch: 1,
                            partitions: add.into_iter().collect(),
                        });
                    }
                    e if e < -1 => return refuse(INVALID_SHARE_SESSION_EPOCH, "negative epoch"),
                    e => {
                        let Some(s) = m.session.as_mut() else {
                            return refuse(SHARE_SESSION_NOT_FOUND, "no open share session");
                        };
                        if s.next_epoch != e {
                            return refuse(
                                INVALID_SHARE_SESSION_EPOCH,
                                format!("share session epoch {e}, expected {}", s.next_epoch),
                            );
                        }
                        s.next_epoch = next_epoch(e);
                        s.partitions.extend(add);
                        for f in &forget {
                            s.partitions.remove(f);
                        }
                    }
                }
                let partitions = m
                    .session
                    .as_ref()
                    .map(|s| s.partitions.iter().cloned().collect())
                    .unwrap_or_default();
                Ok(ShareReply::Session {
                    partitions,
                    config,
                    released,
                })
            }
            ShareOp::Take {
                group,
                member,
                lists,
            } => {
                let g = self.member_group(&group, &member, now_ms)?;
                let out = lists
                    .into_iter()
                    .map(|keys| {
                        for k in &keys {
                            match g.acquired.get(k) {
                                Some((holder, _)) if *holder == member => {}
                                Some(_) => {
                                    return refuse(
                                        INVALID_RECORD_STATE,
                                        format!("offset {} is acquired by another member", k.2),
                                    )
                                }
                                None => {
                                    return refuse(
                                        INVALID_RECORD_STATE,
                                        format!("offset {} is not acquired by this member", k.2),
                                    )
                                }
                            }
                        }
                        let mut seen = BTreeSet::new();
                        Ok(keys
                            .iter()
                            .filter(|k| seen.insert(**k))
                            .filter_map(|k| g.acquired.remove(k).map(|(_, a)| a))
                            .collect())
                    })
                    .collect();
                Ok(ShareReply::Taken(out, g.config))
            }
            ShareOp::Acquire {
                group,
                member,
                records,
            } => {
                let g = self.member_group(&group, &member, now_ms)?;
                for a in records {
                    // A record acquired again (its lock ended) now belongs to this member: an
                    // acknowledgement from the one before is refused.
                    g.acquired.insert(a.key(), (member.clone(), a));
                }
                if g.acquired.len() > SHARE_ACQUIRED_RECORDS_MAX {
                    let mut by_age: Vec<(u64, RecordKey)> = g
                        .acquired
                        .iter()
                        .map(|(k, (_, a))| (a.lock_until_ms, *k))
                        .collect();
                    by_age.sort_unstable();
                    let excess = g.acquired.len() - SHARE_ACQUIRED_RECORDS_MAX;
                    for (_, k) in by_age.into_iter().take(excess) {
                        g.acquired.remove(&k);
                    }
                }
                Ok(ShareReply::Done)
            }
            ShareOp::Describe { groups } => Ok(ShareReply::Described(
                groups.iter().map(|n| self.info(n)).collect(),
            )),
            ShareOp::List => Ok(ShareReply::Listed(
                self.groups
                    .iter()
                    .map(|(n, g)| (n.clone(), state(g)))
                    .collect(),
            )),
            ShareOp::Delete { group } => {
                let members = self.groups.get(&group).map(|g| g.members.len());
                match members {
                    None => refuse(GROUP_ID_NOT_FOUND, "no such share group"),
                    Some(n) if n > 0 => refuse(NON_EMPTY_GROUP, "the share group has members"),
                    Some(_) => {
                        self.groups.remove(&group);
                        Ok(ShareReply::Done)
                    }
                }
            }
            ShareOp::Configure {
                group,
                lock_duration_ms,
                delivery_count_limit,
                validate_only,
            } => {
                let mut config = self
                    .groups
                    .get(&group)
                    .map(|g| g.config)
                    .unwrap_or_default();
                if let Some(l) = lock_duration_ms {
                    if l.is_some_and(|l| {
                        !(SHARE_LOCK_DURATION_MS_MIN..=SHARE_LOCK_DURATION_MS_MAX).contains(&l)
                    }) {
                        return refuse(
                            INVALID_REQUEST,
                            format!(
                                "{CONFIG_LOCK_DURATION_MS} must be within \
                                 {SHARE_LOCK_DURATION_MS_MIN}..={SHARE_LOCK_DURATION_MS_MAX}"
                            ),
                        );
                    }
                    config.lock_duration_ms = l;
                }
                if let Some(d) = delivery_count_limit {
                    let d = d.unwrap_or(SHARE_DELIVERY_COUNT_LIMIT_DEFAULT);
                    if !(SHARE_DELIVERY_COUNT_LIMIT_MIN..=SHARE_DELIVERY_COUNT_LIMIT_MAX)
                        .contains(&d)
                    {
                        return refuse(
                            INVALID_REQUEST,
                            format!(
                                "{CONFIG_DELIVERY_COUNT_LIMIT} must be within \
                                 {SHARE_DELIVERY_COUNT_LIMIT_MIN}..={SHARE_DELIVERY_COUNT_LIMIT_MAX}"
                            ),
                        );
                    }
                    config.delivery_count_limit = d;
                }
                if !validate_only {
                    // Kafka keeps a group's configs before it has members: so does this.
                    self.groups.entry(group).or_default().config = config;
                }
                Ok(ShareReply::Done)
            }
        }
    }

    fn heartbeat(
        &mut self,
        group: String,
        member: String,
        epoch: i32,
        topics: Option<Vec<String>>,
        now_ms: u64,
    ) -> Result<ShareReply, ShareRefusal> {
        if member.is_empty() {
            return refuse(
                INVALID_REQUEST,
                "a share group member names itself (KIP-1082)",
            );
        }
        match epoch {
            0 => {
                let Some(topics) = topics else {
                    return refuse(INVALID_REQUEST, "joining needs the subscribed topics");
                };
                let g = self.groups.entry(group).or_default();
                if !g.members.contains_key(&member) && g.members.len() >= SHARE_GROUP_MEMBERS_MAX {
                    return refuse(GROUP_MAX_SIZE_REACHED, "the share group is full");
                }
                g.epoch = next_epoch(g.epoch);
                let epoch = g.epoch;
                // Rejoining (epoch 0 again): what it held before is released.
                let released = take_all(&mut g.acquired, &member);
                g.members.insert(
                    member,
                    Member {
                        epoch,
                        topics: topics.clone(),
                        last_seen_ms: now_ms,
                        session: None,
                    },
                );
                Ok(ShareReply::Member {
                    epoch,
                    topics,
                    released,
                })
            }
            -1 => {
                let Some(g) = self.groups.get_mut(&group) else {
                    return refuse(UNKNOWN_MEMBER_ID, "no such share group member");
                };
                if g.members.remove(&member).is_none() {
                    return refuse(UNKNOWN_MEMBER_ID, "no such share group member");
                }
                g.epoch = next_epoch(g.epoch);
                let released = take_all(&mut g.acquired, &member);
                Ok(ShareReply::Member {
                    epoch: -1,
                    topics: Vec::new(),
                    released,
                })
            }
            e => {
                let g = self.member_group(&group, &member, now_ms)?;
                let group_epoch = g.epoch;
                let Some(m) = g.members.get_mut(&member) else {
                    return refuse(UNKNOWN_MEMBER_ID, "no such share group member");
                };
                if e != m.epoch {
                    return refuse(
                        FENCED_MEMBER_EPOCH,
                        format!("member epoch {e}, expected {}", m.epoch),
                    );
                }
                let mut new_epoch = group_epoch;
                if let Some(t) = topics {
                    if t != m.topics {
                        m.topics = t;
                        new_epoch = next_epoch(group_epoch);
                    }
                }
                m.epoch = new_epoch;
                let reply = ShareReply::Member {
                    epoch: m.epoch,
                    topics: m.topics.clone(),
                    released: Vec::new(),
                };
                g.epoch = new_epoch;
                Ok(reply)
            }
        }
    }

    fn info(&self, name: &str) -> Option<ShareGroupInfo> {
        let g = self.groups.get(name)?;
        Some(ShareGroupInfo {
            name: super::unqualify(name).to_string(),
            epoch: g.epoch,
            state: state(g),
            members: g
                .members
                .iter()
                .map(|(id, m)| (id.clone(), m.epoch, m.topics.clone()))
                .collect(),
            config: g.config,
        })
    }
}

fn state(g: &ShareGroup) -> &'static str {
    if g.members.is_empty() {
        "Empty"
    } else {
        "Stable"
    }
}

/// Takes every record `member` holds out of a group's map.
fn take_all(acquired: &mut HashMap<RecordKey, (String, Acquired)>, member: &str) -> Vec<Acquired> {
    let keys: Vec<RecordKey> = acquired
        .iter()
        .filter(|(_, (m, _))| m == member)
        .map(|(k, _)| *k)
        .collect();
    keys.into_iter()
        .filter_map(|k| acquired.remove(&k).map(|(_, a)| a))
        .collect()
}

impl Shard {
    /// Sends a share group request to shard 0, its group names qualified with `tenant`.
    pub(crate) async fn share_request(
        &self,
        tenant: &str,
        mut op: ShareOp,
    ) -> StreamResult<Result<ShareReply, ShareRefusal>> {
        match &mut op {
            ShareOp::Heartbeat { group, .. }
            | ShareOp::Session { group, .. }
            | ShareOp::Take { group, .. }
            | ShareOp::Acquire { group, .. }
            | ShareOp::Delete { group }
            | ShareOp::Configure { group, .. } => *group = qualify(tenant, group),
            ShareOp::Describe { groups } => {
                for g in groups {
                    *g = qualify(tenant, g);
                }
            }
            ShareOp::List => {}
        }
        let tenant_prefix = qualify(tenant, "");
        self.check_stream_ready()?;
        match self.stream_request(0, StreamOp::Share(op)).await? {
            StreamReply::Share(Ok(ShareReply::Listed(all))) => Ok(Ok(ShareReply::Listed(
                all.into_iter()
                    .filter_map(|(n, s)| n.strip_prefix(&tenant_prefix).map(|n| (n.to_string(), s)))
                    .collect(),
            ))),
            StreamReply::Share(r) => Ok(r),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }

    /// Shard 0's side of [`Self::share_request`].
    pub(crate) fn share_handle(
        &self,
        op: ShareOp,
    ) -> StreamResult<Result<ShareReply, ShareRefusal>> {
        let group = match &op {
            ShareOp::Heartbeat { group, .. }
            | ShareOp::Session { group, .. }
            | ShareOp::Take { group, .. }
            | ShareOp::Acquire { group, .. }
            | ShareOp::Delete { group }
            | ShareOp::Configure { group, .. } => Some(group.clone()),
            _ => None,
        };
        let classic = match group {
            Some(g) => self.coordinator()?.describe(&g).is_some(),
            None => false,
        };
        Ok(self
            .streams
            .share
            .borrow_mut()
            .handle(op, crate::runtime::now_ms(), classic))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acquired(msg_id: u64, until: u64) -> Acquired {
        Acquired {
            queue: "q".into(),
            queue_id: 7,
            partition: 0,
            receipt: Receipt {
                queue_id: 7,
                partition: 0,
                msg_id,
                epoch: 1,
            },
            payload: Arc::new(Payload::new("body".into(), Vec::new(), None, None)),
            lock_until_ms: until,
        }
    }

    fn join(g: &mut ShareGroups, member: &str, now: u64) -> i32 {
        match g.handle(
            ShareOp::Heartbeat {
                group: "t/g".into(),
                member: member.into(),
                epoch: 0,
                topics: Some(vec!["queue:q".into()]),
            },
            now,
            false,
        ) {
            Ok(ShareReply::Member { epoch, .. }) => epoch,
            other => panic!("join: {other:?}"),
        }
    }

    #[test]
    fn a_record_is_acknowledged_only_by_the_member_that_acquired_it() {
        let mut g = ShareGroups::default();
        join(&mut g, "a", 0);
        join(&mut g, "b", 0);
        g.handle(
            ShareOp::Acquire {
                group: "t/g".into(),
                member: "a".into(),
                records: vec![acquired(1, 10_000), acquired(2, 10_000)],
            },
            1,
            false,
        )
        .expect("acquire");
        let take = |g: &mut ShareGroups, member: &str, ids: Vec<u64>| match g.handle(
            ShareOp::Take {
                group: "t/g".into(),
                member: member.into(),
                lists: vec![ids.into_iter().map(|i| (7, 0, i)).collect()],
            },
            2,
            false,
        ) {
            Ok(ShareReply::Taken(mut l, _)) => l.remove(0),
            other => panic!("take: {other:?}"),
        };
        // Another member's record, and one never acquired: refused, nothing taken.
        assert_eq!(
            take(&mut g, "b", vec![1]).map(|_| ()).unwrap_err().0,
            INVALID_RECORD_STATE
        );
        assert_eq!(
            take(&mut g, "a", vec![1, 3]).map(|_| ()).unwrap_err().0,
            INVALID_RECORD_STATE
        );
        let got = take(&mut g, "a", vec![1, 2]).expect("a holds both");
        assert_eq!(got.len(), 2);
        // Taken once: a second acknowledgement finds nothing.
        assert!(take(&mut g, "a", vec![1]).is_err());
    }

    #[test]
    fn a_share_request_on_a_classic_group_is_refused() {
        let mut g = ShareGroups::default();
        let r = g.handle(
            ShareOp::Heartbeat {
                group: "t/classic".into(),
                member: "m".into(),
                epoch: 0,
                topics: Some(vec![]),
            },
            0,
            true,
        );
        assert_eq!(r.unwrap_err().0, GROUP_ID_NOT_FOUND);
        assert!(g.groups.is_empty(), "nothing created");
    }

    #[test]
    fn session_epochs_must_follow_each_other() {
        let mut g = ShareGroups::default();
        join(&mut g, "a", 0);
        let session = |g: &mut ShareGroups, epoch: i32| {
            g.handle(
                ShareOp::Session {
                    group: "t/g".into(),
                    member: "a".into(),
                    epoch,
                    add: vec![("queue:q".into(), 0)],
                    forget: vec![],
                    may_open: true,
                },
                1,
                false,
            )
            .map(|_| ())
            .map_err(|e| e.0)
        };
        assert_eq!(session(&mut g, 1), Err(SHARE_SESSION_NOT_FOUND));
        assert_eq!(session(&mut g, 0), Ok(()));
        assert_eq!(session(&mut g, 2), Err(INVALID_SHARE_SESSION_EPOCH));
        assert_eq!(session(&mut g, 1), Ok(()));
        assert_eq!(session(&mut g, 2), Ok(()));
        assert_eq!(session(&mut g, -1), Ok(()));
        assert_eq!(session(&mut g, 3), Err(SHARE_SESSION_NOT_FOUND));
    }

    #[test]
    fn a_silent_member_expires_and_its_records_go() {
        let mut g = ShareGroups::default();
        join(&mut g, "a", 0);
        g.handle(
            ShareOp::Acquire {
                group: "t/g".into(),
                member: "a".into(),
                records: vec![acquired(1, u64::MAX)],
            },
            1,
            false,
        )
        .expect("acquire");
        g.expire(SHARE_SESSION_TIMEOUT_MS + 1);
        assert!(g.groups["t/g"].members.is_empty());
        assert!(g.groups["t/g"].acquired.is_empty());
    }
}
