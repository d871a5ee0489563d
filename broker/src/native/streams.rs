//! Native handlers of the stream requests (`KIND_RANGE_STREAMS`): topics, produce, fetch,
//! offsets and consumer groups, over the `Shard` stream service API (`crate::stream`).

use super::handlers::{Ctx, Failure};
use crate::stream::{
    queue_view, FetchReply, FetchRequest, OffsetSpec, StreamError, TopicConfig, QUEUE_TOPIC_PREFIX,
};
use sluice_wire::{self as wire, ErrorCode, Request, Response};

impl From<StreamError> for Failure {
    fn from(e: StreamError) -> Self {
        let code = match &e {
            StreamError::UnknownTopic(_) => ErrorCode::UnknownTopic,
            StreamError::TopicExists(_) => ErrorCode::TopicExists,
            StreamError::UnknownPartition { .. } | StreamError::Invalid(_) => {
                ErrorCode::InvalidParameterValue
            }
            StreamError::InvalidBatch(_) => ErrorCode::InvalidBatch,
            StreamError::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
            StreamError::UnknownMember(_) => ErrorCode::UnknownMember,
            StreamError::StaleGeneration { .. } => ErrorCode::StaleGeneration,
            StreamError::NotAssigned(_) => ErrorCode::PartitionNotAssigned,
            StreamError::LimitExceeded(_) => ErrorCode::OverLimit,
            StreamError::Throttled(_) => ErrorCode::RequestThrottled,
            // Only the Kafka front end sends idempotent producers' batches.
            StreamError::OutOfOrderSequence(_) | StreamError::ProducerFenced(_) => {
                ErrorCode::InvalidParameterValue
            }
            StreamError::Unavailable(_) => ErrorCode::ServiceUnavailable,
            StreamError::Internal(_) => {
                tracing::error!(error = %e, "internal error answering a stream request");
                return Failure::new(
                    ErrorCode::InternalFailure,
                    "We encountered an internal error. Please try again.",
                );
            }
        };
        Failure::new(code, e.to_string())
    }
}

fn assignment(a: Vec<(String, u32)>) -> Vec<wire::TopicPartitionEntry> {
    a.into_iter()
        .map(|(topic, partition)| wire::TopicPartitionEntry { topic, partition })
        .collect()
}

/// A topic's fetch: whole batches in their stored bytes (the connection builds the answer's
/// frame from them, `handlers::handle_fetch`).
pub async fn fetch_topic(ctx: &Ctx, r: wire::FetchRequest) -> Result<FetchReply, Failure> {
    let s = &ctx.shard;
    // The answer must fit a frame: stay well below the wire's limit.
    let max_bytes = (r.max_bytes as usize).min(wire::frame::FRAME_BYTES_MAX / 2);
    let req = FetchRequest {
        offset: r.offset,
        max_bytes,
        max_records: r.max_records,
        wait_ms: u64::from(r.wait_ms),
    };
    let t = s.topic(ctx.caller.account.as_str(), &r.topic)?;
    let mut f = s.fetch(&t, r.partition, req).await?;
    // Native clients read Sluice records: Kafka-compressed batches are rewritten as such
    // (bounded decompression; the stored bytes stay compressed).
    for b in &mut f.batches {
        *b = crate::kafka::compression::sluice_records(b)
            .map_err(|e| StreamError::Internal(e.to_string()))?;
    }
    Ok(f)
}

/// Runs one stream request (the caller routes only stream kinds here).
pub async fn dispatch(ctx: &Ctx, request: Request) -> Result<Response, Failure> {
    let s = &ctx.shard;
    let account = ctx.caller.account.as_str();
    Ok(match request {
        Request::CreateTopic(r) => {
            let t = s
                .create_topic(
                    account,
                    &r.name,
                    TopicConfig {
                        partitions: r.partitions,
                        retention_ms: r.retention_ms,
                        retention_bytes: r.retention_bytes,
                        segment_bytes: r.segment_bytes,
                    },
                )
                .await?;
            Response::CreateTopic(wire::CreateTopicResult {
                name: t.name.clone(),
                partitions: t.partitions(),
            })
        }
        Request::DeleteTopic(r) => {
            let t = s.topic(account, &r.name)?;
            s.delete_topic(&t).await?;
            Response::DeleteTopic(wire::DeleteTopicResult {})
        }
        Request::DescribeTopic(r) => {
            let t = s.topic(account, &r.name)?;
            Response::DescribeTopic(wire::DescribeTopicResult {
                name: t.name.clone(),
                partitions: t.partitions(),
                retention_ms: t.config.retention_ms,
                retention_bytes: t.config.retention_bytes,
            })
        }
        Request::Produce(r) => {
            let t = s.topic(account, &r.topic)?;
            let p = s.produce(&t, r.partition, r.batch).await?;
            Response::Produce(wire::ProduceResult {
                partition: p.partition,
                base_offset: p.base_offset,
                last_offset: p.last_offset,
            })
        }
        Request::Fetch(r) => {
            // The answer must fit a frame: stay well below the wire's limit.
            let max_bytes = (r.max_bytes as usize).min(wire::frame::FRAME_BYTES_MAX / 2);
            let req = FetchRequest {
                offset: r.offset,
                max_bytes,
                max_records: r.max_records,
                wait_ms: u64::from(r.wait_ms),
            };
            if let Some(queue) = r.topic.strip_prefix(QUEUE_TOPIC_PREFIX) {
                // A queue read as a stream: read-only, leases untouched.
                let q = s.queue(account, queue)?;
                let f = s.fetch_queue_stream(&q, r.partition, req).await?;
                return Ok(Response::Fetch(wire::FetchResult {
                    batches: queue_view::encode_for_wire(&f, r.offset),
                    start_offset: f.start_offset,
                    end_offset: f.end_offset,
                }));
            }
            let f = fetch_topic(ctx, r).await?;
            let mut batches = Vec::with_capacity(f.batches.iter().map(|b| b.len()).sum());
            for b in &f.batches {
                batches.extend_from_slice(b);
            }
            Response::Fetch(wire::FetchResult {
                batches,
                start_offset: f.start_offset,
                end_offset: f.end_offset,
            })
        }
        Request::ListOffsets(r) => {
            let spec = match r.spec {
                0 => OffsetSpec::Earliest,
                1 => OffsetSpec::Latest,
                2 => OffsetSpec::Timestamp(r.timestamp_ms),
                _ => {
                    return Err(Failure::new(
                        ErrorCode::InvalidParameterValue,
                        "spec must be 0 (earliest), 1 (latest) or 2 (timestamp)",
                    ))
                }
            };
            let offset = match r.topic.strip_prefix(QUEUE_TOPIC_PREFIX) {
                Some(queue) => {
                    let q = s.queue(account, queue)?;
                    s.list_queue_offset(&q, r.partition, spec).await?
                }
                None => {
                    let t = s.topic(account, &r.topic)?;
                    s.list_offset(&t, r.partition, spec).await?
                }
            };
            Response::ListOffsets(wire::ListOffsetsResult { offset })
        }
        Request::JoinGroup(r) => {
            let a = s
                .join_group(
                    account,
                    &r.group,
                    r.member_id.as_deref(),
                    &r.topics,
                    r.session_timeout_ms,
                )
                .await?;
            Response::JoinGroup(wire::JoinGroupResult {
                member_id: a.member_id,
                generation: a.generation,
                assignment: assignment(a.partitions),
            })
        }
        Request::Heartbeat(r) => {
            let a = s.heartbeat_group(account, &r.group, &r.member_id).await?;
            Response::Heartbeat(wire::HeartbeatResult {
                generation: a.generation,
                assignment: assignment(a.partitions),
            })
        }
        Request::LeaveGroup(r) => {
            s.leave_group(account, &r.group, &r.member_id).await?;
            Response::LeaveGroup(wire::LeaveGroupResult {})
        }
        Request::CommitOffsets(r) => {
            let offsets: Vec<(String, u32, u64)> = r
                .offsets
                .into_iter()
                .map(|o| (o.topic, o.partition, o.offset))
                .collect();
            s.commit_offsets(account, &r.group, &r.member_id, r.generation, &offsets)
                .await?;
            Response::CommitOffsets(wire::CommitOffsetsResult {})
        }
        Request::FetchCommitted(r) => {
            let m = s.committed_offsets(account, &r.group).await?;
            Response::FetchCommitted(wire::FetchCommittedResult {
                offsets: m
                    .into_iter()
                    .map(|((topic, partition), offset)| wire::OffsetEntry {
                        topic,
                        partition,
                        offset,
                    })
                    .collect(),
            })
        }
        Request::GetRouting(r) => {
            let shard_addrs = s
                .config
                .quic_shard_addrs
                .iter()
                .map(ToString::to_string)
                .collect();
            let (id, partitions) = if r.topic.is_empty() {
                (0, 0)
            } else if let Some(queue) = r.topic.strip_prefix(QUEUE_TOPIC_PREFIX) {
                let q = s.queue(account, queue)?;
                (q.id, q.partitions)
            } else {
                let t = s.topic(account, &r.topic)?;
                (t.id, t.partitions())
            };
            Response::GetRouting(wire::GetRoutingResult {
                shard_addrs,
                partition_shards: (0..partitions).map(|p| s.owner(id, p) as u32).collect(),
            })
        }
        Request::GroupLag(r) => Response::GroupLag(wire::GroupLagResult {
            partitions: s
                .group_lag(account, &r.group)
                .await?
                .into_iter()
                .map(|l| wire::PartitionLagEntry {
                    topic: l.topic,
                    partition: l.partition,
                    committed: l.committed,
                    latest: l.latest,
                    lag: l.lag,
                })
                .collect(),
        }),
        Request::ListTopics(_) => {
            let mut topics = s.list_topics(account);
            topics.sort_by(|a, b| a.name.cmp(&b.name));
            Response::ListTopics(wire::ListTopicsResult {
                topics: topics
                    .iter()
                    .map(|t| wire::DescribeTopicResult {
                        name: t.name.clone(),
                        partitions: t.partitions(),
                        retention_ms: t.config.retention_ms,
                        retention_bytes: t.config.retention_bytes,
                    })
                    .collect(),
            })
        }
        Request::ListGroups(_) => Response::ListGroups(wire::ListGroupsResult {
            groups: s.list_groups(account).await?,
        }),
        Request::DescribeGroup(r) => {
            let d = s.describe_group(account, &r.group).await?;
            Response::DescribeGroup(match d {
                None => wire::DescribeGroupResult::default(),
                Some(d) => wire::DescribeGroupResult {
                    found: true,
                    generation: d.generation,
                    members: d
                        .members
                        .into_iter()
                        .map(|(member_id, parts)| wire::GroupMemberEntry {
                            member_id,
                            assignment: assignment(parts),
                        })
                        .collect(),
                },
            })
        }
        other => {
            return Err(Failure::new(
                ErrorCode::InternalFailure,
                format!("{:?} is not a stream request", other.kind()),
            ))
        }
    })
}
