//! The group coordinator on shard 0: the [`Groups`] state machine, its durable log of commits
//! (`<data>/groups/`, replayed at start) and the session-expiry timer.

use super::group::{Assignment, GroupRecord, Groups, TopicPartition, JOIN_WAIT_MS_MAX};
use super::kafka_group::{self, JoinRequest, JoinResult, KafkaGroups, Poll};
use super::{StreamError, StreamResult};
use crate::partition_log::{LocalLog, PartitionLog};
use crate::runtime::{self, Clock, Event, WallClock};
use bytes::Bytes;
use sluice_storage::fs::DmaFs;
use sluice_storage::BatchBuilder;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;

/// After this many commit records, the coordinator restates every committed offset (as commit
/// records) and deletes the log segments wholly below the restatement: the groups log stays
/// bounded by the state, not by the number of commits ever made.
pub const SNAPSHOT_EVERY_RECORDS: usize = 10_000;
/// Offsets per restatement batch (bounds one batch's size).
const SNAPSHOT_RECORDS_PER_BATCH: usize = 1_000;

/// Session expiry is checked this often.
pub const EXPIRY_CHECK_INTERVAL_MS: u64 = 50;
const REPLAY_READ_BYTES: usize = 1 << 20;

pub type PartitionsOf = dyn Fn(&str) -> Option<u32>;

/// Generic over its log (the seam: `LocalLog` on one node, a replicated log in a cluster) and
/// its clock (sessions, rebalance waits and commit timestamps read time there: the wall clock
/// in a broker, virtual time in a simulation).
pub struct Coordinator<L: PartitionLog = LocalLog<DmaFs>, C: Clock = WallClock> {
    log: Rc<L>,
    clock: C,
    groups: RefCell<Groups>,
    closed: Cell<bool>,
    records_since_snapshot: Cell<usize>,
    snapshot_every: usize,
    snapshotting: Cell<bool>,
    /// Kafka groups' membership (their offsets go to the same log).
    kafka: RefCell<KafkaGroups>,
    /// Notified whenever a Kafka group may have moved on: parked joins and syncs look again.
    kafka_changed: Event,
}

/// A group as the Kafka admin API lists and describes it (either kind: a Kafka group with
/// live members, a Sluice group, or committed offsets alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSummary {
    /// Qualified (`tenant/group`).
    pub name: String,
    /// Kafka's state name: `Stable`, `PreparingRebalance`, `CompletingRebalance`, `Empty`.
    pub state: &'static str,
    pub protocol_type: String,
    pub protocol: String,
    /// (member id, its protocol metadata, its assignment): opaque for Kafka members, empty
    /// for Sluice's own.
    pub members: Vec<(String, Bytes, Bytes)>,
}

/// Kafka's codes for the group admin calls.
pub mod admin_code {
    pub const NON_EMPTY_GROUP: i16 = 68;
    pub const GROUP_ID_NOT_FOUND: i16 = 69;
}

/// A Sluice group's members show this protocol type to Kafka tools.
pub const SLUICE_PROTOCOL_TYPE: &str = "sluice";
/// A group with committed offsets and no members is shown as a consumer group (what wrote
/// them, almost always).
const OFFSETS_ONLY_PROTOCOL_TYPE: &str = "consumer";

/// A parked Kafka join or sync looks at its group at least this often (the expiry timer and
/// every change also wake it).
const KAFKA_POLL_MS: u64 = 100;

/// The groups log: small segments, so that restated history can be deleted soon.
fn groups_log_config() -> sluice_storage::LogConfig {
    const MIB: u64 = 1024 * 1024;
    sluice_storage::LogConfig {
        segment_bytes_max: 4 * MIB,
        ..crate::config::meta_log_config()
    }
}

impl Coordinator {
    /// Opens the groups log, replays it, and starts the expiry timer (`partitions` resolves a
    /// topic's partition count at the time of a rebalance).
    pub async fn open(
        fs: DmaFs,
        dir: PathBuf,
        partitions: Rc<PartitionsOf>,
    ) -> StreamResult<Rc<Coordinator>> {
        Self::open_with(
            fs,
            dir,
            partitions,
            SNAPSHOT_EVERY_RECORDS,
            groups_log_config(),
        )
        .await
    }

    pub async fn open_with(
        fs: DmaFs,
        dir: PathBuf,
        partitions: Rc<PartitionsOf>,
        snapshot_every: usize,
        log_config: sluice_storage::LogConfig,
    ) -> StreamResult<Rc<Coordinator>> {
        Self::open_on(&fs, WallClock, dir, partitions, snapshot_every, log_config).await
    }
}

impl<L: PartitionLog, C: Clock> Coordinator<L, C> {
    /// Opens the groups log over any log and clock, replays it, and starts the expiry timer
    /// on `clock`'s time.
    pub async fn open_on(
        env: &L::Env,
        clock: C,
        dir: PathBuf,
        partitions: Rc<PartitionsOf>,
        snapshot_every: usize,
        log_config: sluice_storage::LogConfig,
    ) -> StreamResult<Rc<Coordinator<L, C>>> {
        let log = L::open(env, dir, log_config).await?;
        let mut groups = Groups::new(clock.now_ms());
        let mut at = log.start_offset();
        let mut n = 0usize;
        while at < log.end_offset() {
            for b in log.read(at, REPLAY_READ_BYTES).await? {
                for r in b.view().data_records() {
                    let r = r.map_err(|e| StreamError::Internal(e.to_string()))?;
                    groups.replay(&GroupRecord::decode(r.value).map_err(StreamError::Internal)?);
                    n += 1;
                }
                at = b.header.next_offset();
            }
        }
        tracing::info!(records = n, "consumer group commits loaded");
        let c = Rc::new(Coordinator {
            log: Rc::new(log),
            clock,
            groups: RefCell::new(groups),
            closed: Cell::new(false),
            records_since_snapshot: Cell::new(n),
            snapshot_every: snapshot_every.max(1),
            snapshotting: Cell::new(false),
            kafka: RefCell::new(KafkaGroups::default()),
            kafka_changed: Event::default(),
        });
        let weak = Rc::downgrade(&c);
        let clock = c.clock.clone();
        runtime::spawn(async move {
            loop {
                clock
                    .sleep_until_ms(clock.now_ms() + EXPIRY_CHECK_INTERVAL_MS)
                    .await;
                let Some(c) = weak.upgrade() else { break };
                if c.closed.get() {
                    break;
                }
                let now = c.clock.now_ms();
                let expired = c.groups.borrow_mut().tick(now, &*partitions);
                if c.kafka.borrow_mut().tick(now) {
                    c.kafka_changed.notify();
                }
                if expired > 0 {
                    tracing::info!(
                        expired,
                        "consumer group members expired; their groups rebalanced"
                    );
                }
            }
        });
        Ok(c)
    }

    /// Joins a member and answers once the group settled: no other member joined for
    /// `JOIN_SETTLE_MS` (at most `JOIN_WAIT_MS_MAX`, and half the session), so members that
    /// start together are told one assignment.
    pub async fn join(
        &self,
        group: &str,
        member_id: Option<&str>,
        topics: Vec<String>,
        session_timeout_ms: u64,
        partitions: &PartitionsOf,
    ) -> StreamResult<Assignment> {
        let started = self.clock.now_ms();
        let before = self.generation(group);
        let (id, changed) = self.groups.borrow_mut().register(
            started,
            group,
            member_id,
            topics,
            session_timeout_ms,
            partitions,
        )?;
        if changed {
            let latest = started + JOIN_WAIT_MS_MAX.min(session_timeout_ms / 2);
            loop {
                let now = self.clock.now_ms();
                let settles = self.groups.borrow().settles_at_ms(group).unwrap_or(now);
                let until = settles.min(latest);
                if now >= until || self.closed.get() {
                    break;
                }
                self.clock.sleep_until_ms(until).await;
            }
        }
        let a = self
            .groups
            .borrow_mut()
            .heartbeat(self.clock.now_ms(), group, &id)?;
        if Some(a.generation) != before && changed {
            tracing::info!(
                %group,
                member = %a.member_id,
                generation = a.generation,
                "consumer group rebalanced: a member joined"
            );
        }
        Ok(a)
    }

    fn generation(&self, group: &str) -> Option<u64> {
        self.groups.borrow().describe(group).map(|d| d.generation)
    }

    pub fn heartbeat(&self, group: &str, member_id: &str) -> StreamResult<Assignment> {
        self.groups
            .borrow_mut()
            .heartbeat(self.clock.now_ms(), group, member_id)
    }

    pub fn leave(
        &self,
        group: &str,
        member_id: &str,
        partitions: &PartitionsOf,
    ) -> StreamResult<()> {
        let before = self.generation(group);
        self.groups
            .borrow_mut()
            .leave(group, member_id, partitions)?;
        let after = self.generation(group);
        if after != before {
            tracing::info!(%group, member = %member_id, generation = ?after, "consumer group rebalanced: a member left");
        }
        Ok(())
    }

    /// Checks, stages and applies a commit with no await in between (so commits reach the log
    /// in the order they were accepted), then waits for its fdatasync before answering.
    pub async fn commit(
        &self,
        group: &str,
        member_id: &str,
        generation: u64,
        offsets: &[(TopicPartition, u64)],
    ) -> StreamResult<()> {
        if offsets.is_empty() {
            // Nothing to store; it still releases what the member lost (see `group.rs`).
            self.groups.borrow_mut().plan_commit(
                self.clock.now_ms(),
                group,
                member_id,
                generation,
                offsets,
            )?;
            return Ok(());
        }
        self.log.wait_for_space(offsets.len() * 256 + 4096).await?;
        let now = self.clock.now_ms();
        let records = self
            .groups
            .borrow_mut()
            .plan_commit(now, group, member_id, generation, offsets)?;
        self.stage_commit(now, records).await
    }

    /// Stages commit records, applies them (no await in between), waits for the fdatasync,
    /// and restates the log when it is due.
    async fn stage_commit(&self, now: u64, records: Vec<GroupRecord>) -> StreamResult<()> {
        let mut b = BatchBuilder::new();
        for r in &records {
            b.push_parts(now as i64, None, &r.encode(), std::iter::empty());
        }
        let staged = self.log.stage(b.finish().expect("a commit has records"))?;
        {
            let mut g = self.groups.borrow_mut();
            for r in &records {
                g.replay(r);
            }
        }
        self.log.committed(staged.ticket).await?;
        self.records_since_snapshot
            .set(self.records_since_snapshot.get() + records.len());
        if self.records_since_snapshot.get() >= self.snapshot_every && !self.snapshotting.get() {
            self.snapshotting.set(true);
            let r = self.snapshot().await;
            self.snapshotting.set(false);
            if let Err(e) = r {
                tracing::warn!(error = %e, "restating consumer group offsets");
            }
        }
        Ok(())
    }

    /// A Kafka JoinGroup: parks until the next generation is formed (every known member joined
    /// again, or the rebalance timeout passed). `Err` holds Kafka's error code.
    pub async fn kafka_join(&self, group: &str, r: JoinRequest) -> Result<JoinResult, i16> {
        let started = self.clock.now_ms();
        let before = self.kafka.borrow().state(group).map_or(0, |s| s.1);
        let member = self.kafka.borrow_mut().join(started, group, r)?;
        self.kafka_changed.notify();
        loop {
            let now = self.clock.now_ms();
            let polled = self
                .kafka
                .borrow_mut()
                .poll_join(now, group, &member, before);
            match polled {
                Poll::Ready(j) => {
                    self.kafka_changed.notify();
                    if j.leader == member {
                        tracing::info!(%group, generation = j.generation, members = j.members.len(), "Kafka consumer group rebalanced");
                    }
                    return Ok(j);
                }
                Poll::Failed(c) => return Err(c),
                Poll::Pending => {}
            }
            if self.closed.get()
                || now > started + kafka_group::KAFKA_REBALANCE_TIMEOUT_MS_MAX + KAFKA_POLL_MS
            {
                return Err(kafka_group::code::REBALANCE_IN_PROGRESS);
            }
            self.kafka_changed
                .listen_until_on(&self.clock, now + KAFKA_POLL_MS)
                .await;
        }
    }

    /// A Kafka SyncGroup: the leader's assignment is taken; every member parks until its own
    /// is there. Returns the protocol name and the member's assignment.
    pub async fn kafka_sync(
        &self,
        group: &str,
        member: &str,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    ) -> Result<(String, Bytes), i16> {
        let started = self.clock.now_ms();
        self.kafka
            .borrow_mut()
            .sync(started, group, member, generation, assignments)?;
        self.kafka_changed.notify();
        loop {
            let now = self.clock.now_ms();
            match self.kafka.borrow().poll_sync(group, member, generation) {
                Poll::Ready(a) => return Ok(a),
                Poll::Failed(c) => return Err(c),
                Poll::Pending => {}
            }
            if self.closed.get()
                || now > started + kafka_group::KAFKA_SESSION_TIMEOUT_MS_MAX + KAFKA_POLL_MS
            {
                return Err(kafka_group::code::REBALANCE_IN_PROGRESS);
            }
            self.kafka_changed
                .listen_until_on(&self.clock, now + KAFKA_POLL_MS)
                .await;
        }
    }

    pub fn kafka_heartbeat(&self, group: &str, member: &str, generation: i32) -> Result<(), i16> {
        self.kafka
            .borrow_mut()
            .heartbeat(self.clock.now_ms(), group, member, generation)
    }

    pub fn kafka_leave(&self, group: &str, member: &str) -> Result<(), i16> {
        let r = self
            .kafka
            .borrow_mut()
            .leave(self.clock.now_ms(), group, member);
        self.kafka_changed.notify();
        r
    }

    /// A Kafka OffsetCommit: membership checked by the Kafka group, then durable like any
    /// commit. The outer error is the log's, the inner Kafka's code.
    pub async fn kafka_commit(
        &self,
        group: &str,
        member: &str,
        generation: i32,
        offsets: &[(TopicPartition, u64)],
    ) -> StreamResult<Result<(), i16>> {
        if let Err(c) =
            self.kafka
                .borrow_mut()
                .commit_check(self.clock.now_ms(), group, member, generation)
        {
            return Ok(Err(c));
        }
        if offsets.is_empty() {
            return Ok(Ok(()));
        }
        self.log.wait_for_space(offsets.len() * 256 + 4096).await?;
        let now = self.clock.now_ms();
        let records = self
            .groups
            .borrow()
            .plan_commit_checked(now, group, offsets)?;
        self.stage_commit(now, records).await?;
        Ok(Ok(()))
    }

    /// A committed Kafka transaction's offsets (`txn.rs`): stored without a membership
    /// check, as Kafka applies a transaction's offsets at its commit marker.
    pub async fn txn_commit(
        &self,
        group: &str,
        offsets: &[(TopicPartition, u64)],
    ) -> StreamResult<()> {
        self.log.wait_for_space(offsets.len() * 256 + 4096).await?;
        let now = self.clock.now_ms();
        let records = self
            .groups
            .borrow()
            .plan_commit_checked(now, group, offsets)?;
        self.stage_commit(now, records).await
    }

    /// Restates every committed offset at the end of the log — staged with no await in
    /// between, so later commits land after it — and, once durable, deletes the segments that
    /// lie wholly below it (nothing there is needed to rebuild the state).
    async fn snapshot(&self) -> StreamResult<()> {
        let records = self.groups.borrow().restatement(self.clock.now_ms());
        let now = self.clock.now_ms() as i64;
        let mut tickets = Vec::new();
        for chunk in records.chunks(SNAPSHOT_RECORDS_PER_BATCH) {
            let mut b = BatchBuilder::new();
            for r in chunk {
                b.push_parts(now, None, &r.encode(), std::iter::empty());
            }
            if let Some(bytes) = b.finish() {
                tickets.push(self.log.stage(bytes)?);
            }
        }
        let Some(first) = tickets.first().map(|t| t.info.base_offset) else {
            return Ok(());
        };
        for t in tickets {
            self.log.committed(t.ticket).await?;
        }
        self.records_since_snapshot.set(0);
        let out = self.log.delete_segments_below(first).await?;
        tracing::info!(
            offsets = records.len(),
            segments_deleted = out.segments_deleted,
            "consumer group offsets restated"
        );
        Ok(())
    }

    /// Every group (qualified names, in order): live Kafka groups, Sluice groups, and groups
    /// that only have committed offsets.
    pub fn admin_list(&self) -> Vec<GroupSummary> {
        let mut names: std::collections::BTreeSet<String> =
            self.groups.borrow().list().into_iter().collect();
        names.extend(self.kafka.borrow().names());
        names
            .into_iter()
            .filter_map(|n| self.admin_describe(&n))
            .collect()
    }

    /// One group as DescribeGroups shows it; `None` if it is unknown.
    pub fn admin_describe(&self, group: &str) -> Option<GroupSummary> {
        // A Kafka group whose last member left is kept until the next expiry tick: it is shown
        // (and deleted) by its offsets alone, as the groups log has them.
        let kafka = self
            .kafka
            .borrow()
            .view(group)
            .filter(|v| !v.members.is_empty());
        if let Some(v) = kafka {
            return Some(GroupSummary {
                name: group.to_string(),
                state: v.state.kafka_name(),
                protocol_type: v.protocol_type,
                protocol: v.protocol,
                members: v.members,
            });
        }
        let groups = self.groups.borrow();
        let with_members = groups.presence(group)?;
        let members = if with_members {
            groups
                .describe(group)
                .map(|d| {
                    d.members
                        .into_iter()
                        .map(|(m, _)| (m, Bytes::new(), Bytes::new()))
                        .collect()
                })
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        Some(GroupSummary {
            name: group.to_string(),
            state: if with_members { "Stable" } else { "Empty" },
            protocol_type: if with_members {
                SLUICE_PROTOCOL_TYPE
            } else {
                OFFSETS_ONLY_PROTOCOL_TYPE
            }
            .to_string(),
            protocol: String::new(),
            members,
        })
    }

    /// Kafka's DeleteGroups: an empty group's committed offsets go, durably. The inner error
    /// is Kafka's code (a group with members, or none of that name).
    pub async fn admin_delete(&self, group: &str) -> StreamResult<Result<(), i16>> {
        match self.admin_describe(group) {
            None => return Ok(Err(admin_code::GROUP_ID_NOT_FOUND)),
            Some(g) if !g.members.is_empty() => return Ok(Err(admin_code::NON_EMPTY_GROUP)),
            Some(_) => {}
        }
        self.log.wait_for_space(4096).await?;
        let now = self.clock.now_ms();
        // Checked again after the await: a member may have joined meanwhile.
        if self
            .admin_describe(group)
            .is_some_and(|g| !g.members.is_empty())
        {
            return Ok(Err(admin_code::NON_EMPTY_GROUP));
        }
        let record = GroupRecord::GroupDeleted {
            v: super::group::GROUP_RECORD_VERSION,
            group: group.to_string(),
            at_ms: now,
        };
        self.stage_commit(now, vec![record]).await?;
        Ok(Ok(()))
    }

    /// Kafka's OffsetDelete: these committed offsets go, durably (partitions with none are
    /// not an error). The caller checked that no member reads them.
    pub async fn admin_delete_offsets(
        &self,
        group: &str,
        partitions: &[TopicPartition],
    ) -> StreamResult<Result<(), i16>> {
        if self.admin_describe(group).is_none() {
            return Ok(Err(admin_code::GROUP_ID_NOT_FOUND));
        }
        self.log
            .wait_for_space(partitions.len() * 256 + 4096)
            .await?;
        let now = self.clock.now_ms();
        let committed = self.groups.borrow().committed(group);
        let records: Vec<GroupRecord> = partitions
            .iter()
            .filter(|tp| committed.contains_key(*tp))
            .map(|(topic, partition)| GroupRecord::OffsetDeleted {
                v: super::group::GROUP_RECORD_VERSION,
                group: group.to_string(),
                topic: topic.clone(),
                partition: *partition,
                at_ms: now,
            })
            .collect();
        if !records.is_empty() {
            self.stage_commit(now, records).await?;
        }
        Ok(Ok(()))
    }

    /// Segments of the groups log (tests of its bound).
    pub fn log_segments(&self) -> usize {
        self.log.segments().len()
    }

    pub fn describe(&self, group: &str) -> Option<super::group::GroupDescription> {
        self.groups.borrow().describe(group)
    }

    /// Every group's qualified name.
    pub fn list(&self) -> Vec<String> {
        self.groups.borrow().list()
    }

    pub fn committed(&self, group: &str) -> BTreeMap<TopicPartition, u64> {
        self.groups.borrow().committed(group)
    }

    pub async fn close(&self) {
        self.closed.set(true);
        let _ = self.log.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restatements_keep_the_groups_log_bounded_and_replay_to_the_same_offsets() {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path().to_path_buf();
        sluice_storage::rt::run("groups-log-test", move || async move {
            let fs = DmaFs::new(&root).await.expect("fs");
            let config = sluice_storage::LogConfig {
                segment_bytes_max: 16 * 1024,
                prealloc_chunk_bytes: 16 * 1024,
                batch_bytes_max: 16 * 1024,
                write_buffer_bytes_max: 64 * 1024,
                ..groups_log_config()
            };
            let parts: Rc<PartitionsOf> = Rc::new(|t: &str| (t == "t/x").then_some(4));
            let dir = root.join("groups");
            let c =
                Coordinator::open_with(fs.clone(), dir.clone(), parts.clone(), 100, config.clone())
                    .await
                    .expect("open");
            let a = c
                .join("t/g", None, vec!["t/x".into()], 60_000, &*parts)
                .await
                .expect("join");
            let mut max_segments = 0;
            for i in 0..1500u64 {
                let p = (i % 4) as u32;
                c.commit("t/g", &a.member_id, a.generation, &[(("t/x".into(), p), i)])
                    .await
                    .expect("commit");
                max_segments = max_segments.max(c.log_segments());
            }
            // ~1500 commits of ~150 bytes would fill ~14 segments of 16 KiB.
            assert!(max_segments <= 5, "segments peaked at {max_segments}");
            let before = c.committed("t/g");
            c.close().await;
            let again = Coordinator::open_with(fs, dir, parts, 100, config)
                .await
                .expect("reopen");
            assert_eq!(again.committed("t/g"), before);
            assert_eq!(before.get(&("t/x".to_string(), 3)), Some(&1499));
            again.close().await;
        })
        .expect("executor");
    }

    /// The admin calls: a group with members is not deleted, an unknown one is not found,
    /// OffsetDelete and DeleteGroups are durable (a reopened coordinator replays them).
    #[test]
    fn deleted_groups_and_offsets_stay_deleted_after_a_reopen() {
        use crate::runtime::SimClock;
        use sluice_storage::fs::SimFs;
        sluice_storage::rt::run("groups-admin-test", || async {
            let fs = SimFs::new();
            let clock = SimClock::new(1_000_000);
            let parts: Rc<PartitionsOf> = Rc::new(|t: &str| (t == "t/x").then_some(4));
            let dir = PathBuf::from("/groups");
            let open = || {
                Coordinator::<LocalLog<SimFs>, SimClock>::open_on(
                    &fs,
                    clock.clone(),
                    dir.clone(),
                    parts.clone(),
                    SNAPSHOT_EVERY_RECORDS,
                    groups_log_config(),
                )
            };
            let c = open().await.expect("open");
            // A simple commit (no members: Kafka's generation -1), so nothing parks on the
            // virtual clock.
            let all: Vec<_> = (0..4u32).map(|p| (("t/x".to_string(), p), 7)).collect();
            c.kafka_commit("t/g", "", -1, &all)
                .await
                .expect("log")
                .expect("commit");
            assert_eq!(
                c.admin_delete("t/none").await.expect("log"),
                Err(admin_code::GROUP_ID_NOT_FOUND)
            );
            let listed = c.admin_list();
            assert_eq!(listed.len(), 1);
            assert_eq!((listed[0].name.as_str(), listed[0].state), ("t/g", "Empty"));
            c.admin_delete_offsets("t/g", &[("t/x".into(), 0), ("t/x".into(), 9)])
                .await
                .expect("log")
                .expect("deleted");
            assert_eq!(c.committed("t/g").len(), 3);
            c.close().await;
            let c = open().await.expect("reopen");
            assert_eq!(c.committed("t/g").len(), 3, "OffsetDelete was not durable");
            c.admin_delete("t/g").await.expect("log").expect("deleted");
            assert!(c.admin_list().is_empty());
            c.close().await;
            let c = open().await.expect("reopen");
            assert!(
                c.admin_describe("t/g").is_none(),
                "DeleteGroups was not durable"
            );
            c.close().await;
        })
        .expect("executor");
    }

    /// Sessions expire on the coordinator's clock (the seam), not the system's: on virtual time
    /// a member that stops heartbeating is gone once the clock passes its session timeout,
    /// and a member that heartbeats stays. Reading the wall clock, the silent member would
    /// outlive this test by minutes.
    #[test]
    fn sessions_expire_on_the_coordinators_clock() {
        use crate::runtime::SimClock;
        use sluice_storage::fs::SimFs;
        const SESSION_MS: u64 = 30_000;
        sluice_storage::rt::run("groups-clock-test", || async {
            let fs = SimFs::new();
            let clock = SimClock::new(1_000_000);
            // Virtual time runs 50x faster than real time while the test waits.
            let running = Rc::new(Cell::new(true));
            {
                let (clock, running) = (clock.clone(), running.clone());
                runtime::spawn(async move {
                    while running.get() {
                        runtime::sleep(std::time::Duration::from_millis(1)).await;
                        clock.advance_to(clock.now_ms() + 50);
                    }
                });
            }
            let parts: Rc<PartitionsOf> = Rc::new(|t: &str| (t == "t/x").then_some(2));
            let c: Rc<Coordinator<LocalLog<SimFs>, SimClock>> = Coordinator::open_on(
                &fs,
                clock.clone(),
                PathBuf::from("/groups"),
                parts.clone(),
                100,
                groups_log_config(),
            )
            .await
            .expect("open");
            let a = c
                .join("t/g", None, vec!["t/x".into()], SESSION_MS, &*parts)
                .await
                .expect("join a");
            let b = c
                .join("t/g", None, vec!["t/x".into()], SESSION_MS, &*parts)
                .await
                .expect("join b");
            assert_eq!(c.describe("t/g").expect("group").members.len(), 2);
            // `a` heartbeats through more than a session; `b` stays silent.
            let until = clock.now_ms() + SESSION_MS + 10 * EXPIRY_CHECK_INTERVAL_MS;
            while clock.now_ms() < until {
                let _ = c.heartbeat("t/g", &a.member_id);
                runtime::sleep(std::time::Duration::from_millis(2)).await;
            }
            let members: Vec<String> = c
                .describe("t/g")
                .expect("group")
                .members
                .into_iter()
                .map(|(m, _)| m)
                .collect();
            assert_eq!(
                members,
                vec![a.member_id.clone()],
                "b ({}) outlived its session",
                b.member_id
            );
            running.set(false);
            c.close().await;
        })
        .expect("executor");
    }
}
