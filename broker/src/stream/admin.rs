//! The stream service's admin calls (what Kafka's admin API needs): grow a topic's partitions
//! and change its retention (a `TopicAltered` metadata record, durable on shard 0, applied on
//! every shard), delete records below an offset (on the partition's owner), the size of a
//! partition on disk, and the groups of one tenant: list, describe, delete, delete offsets
//! (on the coordinator, shard 0). Names in and out are unqualified; the tenant is an argument,
//! so a caller only ever reaches its own account's topics and groups.

use super::coordinator::GroupSummary;
use super::{
    qualify, StreamError, StreamOp, StreamReply, StreamResult, TopicConfig, TopicMeta,
    TopicPartition,
};
use crate::runtime;
use crate::shard::Shard;
use std::sync::Arc;

/// What one shard asks another for the admin calls.
#[derive(Debug)]
pub enum AdminOp {
    /// On shard 0: the topic's new configuration (partitions and retention).
    AlterTopic {
        id: u64,
        config: TopicConfig,
    },
    /// On the partition's owner: delete below `offset` (`None`: the end).
    DeleteRecords {
        topic_id: u64,
        partition: u32,
        offset: Option<u64>,
    },
    /// On the partition's owner: its bytes on disk and its end offset.
    PartitionSize {
        topic_id: u64,
        partition: u32,
    },
    /// On shard 0: every group (qualified names; the caller filters by tenant).
    ListGroups,
    DescribeGroup {
        group: String,
    },
    DeleteGroup {
        group: String,
    },
    DeleteOffsets {
        group: String,
        partitions: Vec<TopicPartition>,
    },
}

#[derive(Debug)]
pub enum AdminReply {
    Done,
    /// DeleteRecords' new first offset.
    LowWatermark(u64),
    Size {
        bytes: u64,
        end_offset: u64,
    },
    Groups(Vec<GroupSummary>),
    Group(Option<GroupSummary>),
    /// A group call refused with Kafka's code.
    Refused(i16),
}

fn unexpected<T>(r: AdminReply) -> StreamResult<T> {
    Err(StreamError::Internal(format!(
        "unexpected admin reply {r:?}"
    )))
}

fn tenant_view(tenant: &str, g: GroupSummary) -> Option<GroupSummary> {
    let (t, name) = g.name.split_once('/')?;
    (t == tenant).then(|| GroupSummary {
        name: name.to_string(),
        ..g
    })
}

impl Shard {
    async fn admin_request(&self, to: usize, op: AdminOp) -> StreamResult<AdminReply> {
        match self.stream_request(to, StreamOp::Admin(op)).await? {
            StreamReply::Admin(r) => Ok(r),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }

    /// The tenant's topic with this catalog id (Kafka's topic ids carry it).
    pub fn topic_by_id(&self, tenant: &str, id: u64) -> StreamResult<Arc<TopicMeta>> {
        self.check_stream_ready()?;
        self.streams
            .catalog
            .borrow()
            .get(id)
            .filter(|t| t.tenant == tenant)
            .ok_or_else(|| StreamError::UnknownTopic(format!("topic id {id}")))
    }

    /// Grows the topic's partitions or changes its retention (durable before it returns;
    /// every shard has applied it). Returns the topic as it is now.
    pub async fn alter_topic(
        &self,
        t: &TopicMeta,
        config: TopicConfig,
    ) -> StreamResult<Arc<TopicMeta>> {
        self.check_stream_ready()?;
        match self
            .admin_request(0, AdminOp::AlterTopic { id: t.id, config })
            .await?
        {
            AdminReply::Done => self
                .streams
                .catalog
                .borrow()
                .get(t.id)
                .ok_or_else(|| StreamError::UnknownTopic(t.name.clone())),
            other => unexpected(other),
        }
    }

    /// Kafka's DeleteRecords on one partition: returns its new first offset.
    pub async fn delete_records(
        &self,
        t: &TopicMeta,
        partition: u32,
        offset: Option<u64>,
    ) -> StreamResult<u64> {
        self.check_stream_ready()?;
        Self::check_partition(t, partition)?;
        let op = AdminOp::DeleteRecords {
            topic_id: t.id,
            partition,
            offset,
        };
        match self.admin_request(self.owner(t.id, partition), op).await? {
            AdminReply::LowWatermark(o) => Ok(o),
            other => unexpected(other),
        }
    }

    /// A partition's bytes on disk and its end offset.
    pub async fn partition_size(&self, t: &TopicMeta, partition: u32) -> StreamResult<(u64, u64)> {
        self.check_stream_ready()?;
        Self::check_partition(t, partition)?;
        let op = AdminOp::PartitionSize {
            topic_id: t.id,
            partition,
        };
        match self.admin_request(self.owner(t.id, partition), op).await? {
            AdminReply::Size { bytes, end_offset } => Ok((bytes, end_offset)),
            other => unexpected(other),
        }
    }

    /// The tenant's groups, every kind (names unqualified, in order).
    pub async fn admin_groups(&self, tenant: &str) -> StreamResult<Vec<GroupSummary>> {
        self.check_stream_ready()?;
        match self.admin_request(0, AdminOp::ListGroups).await? {
            AdminReply::Groups(gs) => Ok(gs
                .into_iter()
                .filter_map(|g| tenant_view(tenant, g))
                .collect()),
            other => unexpected(other),
        }
    }

    /// One of the tenant's groups; `None` if it has none of that name.
    pub async fn admin_describe_group(
        &self,
        tenant: &str,
        group: &str,
    ) -> StreamResult<Option<GroupSummary>> {
        self.check_stream_ready()?;
        let op = AdminOp::DescribeGroup {
            group: Self::group_key(tenant, group)?,
        };
        match self.admin_request(0, op).await? {
            AdminReply::Group(g) => Ok(g.and_then(|g| tenant_view(tenant, g))),
            other => unexpected(other),
        }
    }

    /// Deletes an empty group of the tenant; `Err` inside is Kafka's code.
    pub async fn admin_delete_group(
        &self,
        tenant: &str,
        group: &str,
    ) -> StreamResult<Result<(), i16>> {
        self.check_stream_ready()?;
        let op = AdminOp::DeleteGroup {
            group: Self::group_key(tenant, group)?,
        };
        match self.admin_request(0, op).await? {
            AdminReply::Done => Ok(Ok(())),
            AdminReply::Refused(c) => Ok(Err(c)),
            other => unexpected(other),
        }
    }

    /// Deletes committed offsets of the tenant's group; `Err` inside is Kafka's code.
    pub async fn admin_delete_offsets(
        &self,
        tenant: &str,
        group: &str,
        partitions: Vec<TopicPartition>,
    ) -> StreamResult<Result<(), i16>> {
        self.check_stream_ready()?;
        let op = AdminOp::DeleteOffsets {
            group: Self::group_key(tenant, group)?,
            partitions: partitions
                .into_iter()
                .map(|(t, p)| (qualify(tenant, &t), p))
                .collect(),
        };
        match self.admin_request(0, op).await? {
            AdminReply::Done => Ok(Ok(())),
            AdminReply::Refused(c) => Ok(Err(c)),
            other => unexpected(other),
        }
    }

    /// Serves an admin call on this shard (`stream_handle`).
    pub(super) async fn admin_handle(&self, op: AdminOp) -> StreamResult<AdminReply> {
        match op {
            AdminOp::AlterTopic { id, config } => {
                let _serial = self.meta_serial().await;
                let planned =
                    self.streams
                        .catalog
                        .borrow()
                        .plan_alter(id, config, runtime::now_ms())?;
                if let Some(record) = planned {
                    self.persist_meta(record).await?;
                }
                Ok(AdminReply::Done)
            }
            AdminOp::DeleteRecords {
                topic_id,
                partition,
                offset,
            } => Ok(AdminReply::LowWatermark(
                self.local_partition(topic_id, partition)?
                    .delete_records(offset)
                    .await?,
            )),
            AdminOp::PartitionSize {
                topic_id,
                partition,
            } => {
                let tp = self.local_partition(topic_id, partition)?;
                Ok(AdminReply::Size {
                    bytes: tp.size_bytes(),
                    end_offset: tp.offsets().1,
                })
            }
            AdminOp::ListGroups => Ok(AdminReply::Groups(self.coordinator()?.admin_list())),
            AdminOp::DescribeGroup { group } => Ok(AdminReply::Group(
                self.coordinator()?.admin_describe(&group),
            )),
            AdminOp::DeleteGroup { group } => {
                Ok(match self.coordinator()?.admin_delete(&group).await? {
                    Ok(()) => AdminReply::Done,
                    Err(c) => AdminReply::Refused(c),
                })
            }
            AdminOp::DeleteOffsets { group, partitions } => Ok(
                match self
                    .coordinator()?
                    .admin_delete_offsets(&group, &partitions)
                    .await?
                {
                    Ok(()) => AdminReply::Done,
                    Err(c) => AdminReply::Refused(c),
                },
            ),
        }
    }
}
