//! The requests of the native protocol against the shard's service API: the same checks, the
//! same service calls and the same SQS errors as the HTTP front end (`crate::http::actions`),
//! from typed wire messages instead of JSON/Query parameters.
//!
//! Differences from HTTP that come from the wire types, not from policy: a wire string is
//! always present, so an empty `QueueUrl`, `QueueName` or `ReceiptHandle` reads as missing
//! (`MissingParameter`); numbers are unsigned, so only upper bounds need checking.
//!
//! The attribute-name lists and the receive-side shaping below mirror `http/actions.rs`
//! (private there; the HTTP module is not ours to change). Keep the two in step.

use std::collections::{BTreeMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;

use base64::Engine as _;
use sluice_wire as wire;
use sluice_wire::{ErrorCode, Request, Response};

use crate::auth::{access, Caller};
use crate::engine::attributes::{
    AttributeValue, MessageAttribute, DELAY_S_MAX, QUEUE_ATTRIBUTE_NAMES, VISIBILITY_TIMEOUT_S_MAX,
    WAIT_TIME_S_MAX,
};
use crate::engine::md5::md5_of_attributes;
use crate::engine::{BatchEntry, Delivered, EngineError, ReceiveRequest, SendRequest, SentReply};
use crate::error::ServiceError;
use crate::metadata::QueueMeta;
use crate::shard::move_task::{MoveTaskInfo, MoveTaskStatus, MOVE_RATE_MAX};
use crate::shard::render::AttributeSelection;
use crate::shard::{run_parsed_entries, Shard};

pub use sluice_wire::limits::{BATCH_ENTRIES_MAX, BATCH_ENTRY_ID_LEN_MAX, LIST_QUEUES_DEFAULT_MAX};
/// ListQueues / ListDeadLetterSourceQueues MaxResults: 1–1000.
pub const LIST_RESULTS_MAX: u32 = 1_000;
/// MaxResults of a ListMessageMoveTasks: 1–10.
pub const MOVE_TASKS_LIST_MAX: u32 = 10;
pub use sluice_wire::limits::RECEIVE_MESSAGES_MAX;

/// An error answered as an `Error` frame (or a failed batch entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: ErrorCode,
    pub message: String,
    /// Set for `ServiceError::NotLeader`: answered as a `NotLeader` frame on a protocol v2
    /// connection ([`Ctx::error_response`]).
    pub not_leader: Option<NotLeaderHint>,
}

/// What a node that does not lead a request's partition knows of the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotLeaderHint {
    pub leader: Option<u64>,
    pub term: u64,
    pub outcome_unknown: bool,
}

impl Failure {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
            not_leader: None,
        }
    }

    fn missing(param: &str) -> Self {
        Failure::new(
            ErrorCode::MissingParameter,
            format!("The request must contain the parameter {param}."),
        )
    }

    fn invalid(param: &str, reason: impl std::fmt::Display) -> Self {
        Failure::new(
            ErrorCode::InvalidParameterValue,
            format!("Value for parameter {param} is invalid. Reason: {reason}."),
        )
    }

    pub fn to_response(&self) -> wire::ErrorResponse {
        wire::ErrorResponse::new(self.code, self.message.clone())
    }

    fn to_entry(&self, id: String) -> wire::BatchResultErrorEntry {
        wire::BatchResultErrorEntry::new(id, self.code, Some(self.message.clone()))
    }
}

/// The service layer's errors keep their SQS identity: `ServiceError::info().code` is an SQS
/// code, read back into the wire's stable number.
impl From<ServiceError> for Failure {
    fn from(e: ServiceError) -> Self {
        let info = e.info();
        let code = ErrorCode::from_sqs_code(info.code).unwrap_or(ErrorCode::InternalFailure);
        let not_leader = match &e {
            ServiceError::NotLeader {
                leader_hint,
                term,
                outcome_unknown,
            } => Some(NotLeaderHint {
                leader: *leader_hint,
                term: *term,
                outcome_unknown: *outcome_unknown,
            }),
            _ => None,
        };
        let message = match &e {
            ServiceError::NonExistentQueue => "The specified queue does not exist.".to_string(),
            ServiceError::Internal(_) => {
                // The detail goes to the log, not to the client.
                tracing::error!(error = %e, "internal error answering a native request");
                "We encountered an internal error. Please try again.".to_string()
            }
            other => other.to_string(),
        };
        Failure {
            code,
            message,
            not_leader,
        }
    }
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Self {
        Failure::from(ServiceError::from(e))
    }
}

type Result<T> = std::result::Result<T, Failure>;

/// Who asks, and how queue URLs are spelled in answers.
pub struct Ctx {
    pub shard: Rc<Shard>,
    /// The connection's account (from its `Hello` credentials; the default account when
    /// authentication is off and none were given), and whether credentials are checked: every
    /// queue, ARN and task is resolved within that account (`auth::access`).
    pub caller: Caller,
    /// `host:port` written into queue URLs: the HTTP API's address, so a URL works with both.
    pub url_host: String,
    /// The protocol version the connection negotiated (what its client can read).
    pub protocol_version: u16,
}

impl Ctx {
    /// The answer for a failed request: a `NotLeader` frame naming the leader's client (QUIC)
    /// address from the cluster configuration when the connection reads one (protocol v2),
    /// else an `Error` frame.
    pub fn error_response(&self, f: Failure) -> Response {
        let Some(hint) = f.not_leader else {
            return Response::Error(f.to_response());
        };
        let leader_addr = hint.leader.and_then(|id| {
            let node = crate::cluster::node::local()?;
            let member = node.cluster().member(id)?;
            Some(member.quic_addr.to_string())
        });
        wire::not_leader_response(
            self.protocol_version,
            wire::NotLeaderResponse {
                message: f.message,
                leader_addr,
                term: hint.term,
                outcome_unknown: hint.outcome_unknown,
            },
        )
    }
}

/// Runs one request. `Hello` never reaches here (the connection handles it).
/// (Counted for metrics by the connection, `native::dispatch`.)
/// `bytes`: the request frame's body, metered by the account's byte-rate quota.
pub async fn handle(ctx: &Ctx, request: Request, bytes: u64) -> Response {
    if let Err(e) = ctx.shard.admit(&ctx.caller.account, bytes) {
        return ctx.error_response(Failure::from(e));
    }
    match dispatch(ctx, request).await {
        Ok(r) => r,
        Err(f) => ctx.error_response(f),
    }
}

/// A topic's fetch, answered with its frame's pieces: the fetched batches as they are held,
/// between a header and a tail (`wire::encode_fetch_response`: no copy into an intermediate
/// vector or into one frame buffer). `Err` holds the response to encode instead (an error).
pub async fn handle_fetch(
    ctx: &Ctx,
    r: wire::FetchRequest,
    bytes: u64,
    request_id: u64,
) -> std::result::Result<Vec<bytes::Bytes>, Response> {
    if let Err(e) = ctx.shard.admit(&ctx.caller.account, bytes) {
        return Err(Response::Error(Failure::from(e).to_response()));
    }
    let fetched = super::streams::fetch_topic(ctx, r)
        .await
        .map_err(|f| Response::Error(f.to_response()))?;
    wire::encode_fetch_response(
        request_id,
        &fetched.batches,
        fetched.start_offset,
        fetched.end_offset,
    )
    .map_err(|e| Response::Error(Failure::new(e.error_code(), e.to_string()).to_response()))
}

async fn dispatch(ctx: &Ctx, request: Request) -> Result<Response> {
    let shard = &ctx.shard;
    Ok(match request {
        Request::Hello(_) => {
            return Err(Failure::new(
                ErrorCode::ProtocolViolation,
                "Hello is allowed only as the first frame of a connection",
            ))
        }
        r @ (Request::CreateTopic(_)
        | Request::DeleteTopic(_)
        | Request::DescribeTopic(_)
        | Request::Produce(_)
        | Request::Fetch(_)
        | Request::ListOffsets(_)
        | Request::JoinGroup(_)
        | Request::Heartbeat(_)
        | Request::LeaveGroup(_)
        | Request::CommitOffsets(_)
        | Request::FetchCommitted(_)
        | Request::GroupLag(_)
        | Request::GetRouting(_)
        | Request::ListTopics(_)
        | Request::ListGroups(_)
        | Request::DescribeGroup(_)) => return super::streams::dispatch(ctx, r).await,
        Request::CreateQueue(r) => {
            if r.queue_name.is_empty() {
                return Err(Failure::missing("QueueName"));
            }
            let q = shard
                .create_queue(&ctx.caller.account, &r.queue_name, r.attributes, r.tags)
                .await?;
            Response::CreateQueue(wire::CreateQueueResult {
                queue_url: ctx.queue_url(&q),
            })
        }
        Request::DeleteQueue(r) => {
            let q = ctx.resolve(&r.queue_url)?;
            shard.delete_queue(&q).await?;
            Response::DeleteQueue(wire::DeleteQueueResult {})
        }
        Request::GetQueueUrl(r) => {
            if r.queue_name.is_empty() {
                return Err(Failure::missing("QueueName"));
            }
            let q = access::queue_by_name(
                shard,
                &ctx.caller,
                &r.queue_name,
                r.queue_owner_aws_account_id.as_deref(),
            )?;
            Response::GetQueueUrl(wire::GetQueueUrlResult {
                queue_url: ctx.queue_url(&q),
            })
        }
        Request::ListQueues(r) => {
            let prefix = r.queue_name_prefix.unwrap_or_default();
            let all = shard.list_queues(&ctx.caller.account, &prefix);
            let (page, next_token) = paginate(all, r.max_results, r.next_token)?;
            Response::ListQueues(wire::ListQueuesResult {
                queue_urls: page.iter().map(|q| ctx.queue_url(q)).collect(),
                next_token,
            })
        }
        Request::GetQueueAttributes(r) => {
            let q = ctx.resolve(&r.queue_url)?;
            get_queue_attributes(ctx, &q, &r.attribute_names).await?
        }
        Request::SetQueueAttributes(r) => {
            let q = ctx.resolve(&r.queue_url)?;
            shard.set_queue_attributes(&q, r.attributes).await?;
            Response::SetQueueAttributes(wire::SetQueueAttributesResult {})
        }
        Request::PurgeQueue(r) => {
            let q = ctx.resolve(&r.queue_url)?;
            shard.purge(&q).await?;
            Response::PurgeQueue(wire::PurgeQueueResult {})
        }
        Request::TagQueue(r) => {
            let q = ctx.resolve(&r.queue_url)?;
            let mut tags = q.tags.clone();
            tags.extend(r.tags);
            shard.set_tags(&q, tags).await?;
            Response::TagQueue(wire::TagQueueResult {})
        }
        Request::UntagQueue(r) => {
            let q = ctx.resolve(&r.queue_url)?;
            let mut tags = q.tags.clone();
            for k in &r.tag_keys {
                tags.remove(k);
            }
            shard.set_tags(&q, tags).await?;
            Response::UntagQueue(wire::UntagQueueResult {})
        }
        Request::ListQueueTags(r) => {
            let q = ctx.resolve(&r.queue_url)?;
            Response::ListQueueTags(wire::ListQueueTagsResult {
                tags: q.tags.clone(),
            })
        }
        Request::ListDeadLetterSourceQueues(r) => {
            let q = ctx.resolve(&r.queue_url)?;
            let (page, next_token) =
                paginate(shard.dead_letter_sources(&q), r.max_results, r.next_token)?;
            Response::ListDeadLetterSourceQueues(wire::ListDeadLetterSourceQueuesResult {
                queue_urls: page.iter().map(|q| ctx.queue_url(q)).collect(),
                next_token,
            })
        }
        Request::StartMessageMoveTask(r) => {
            if r.source_arn.is_empty() {
                return Err(Failure::missing("SourceArn"));
            }
            if let Some(rate) = r.max_number_of_messages_per_second {
                if !(1..=MOVE_RATE_MAX).contains(&rate) {
                    return Err(Failure::invalid(
                        "MaxNumberOfMessagesPerSecond",
                        format!("must be 1 to {MOVE_RATE_MAX}"),
                    ));
                }
            }
            let task_handle = shard
                .start_move_task(
                    ctx.arn_tenant(&r.source_arn),
                    &r.source_arn,
                    r.destination_arn.as_deref(),
                    r.max_number_of_messages_per_second,
                )
                .await?;
            Response::StartMessageMoveTask(wire::StartMessageMoveTaskResult { task_handle })
        }
        Request::ListMessageMoveTasks(r) => {
            if r.source_arn.is_empty() {
                return Err(Failure::missing("SourceArn"));
            }
            let max = r.max_results.unwrap_or(1);
            if !(1..=MOVE_TASKS_LIST_MAX).contains(&max) {
                return Err(Failure::invalid(
                    "MaxResults",
                    format!("must be between 1 and {MOVE_TASKS_LIST_MAX}"),
                ));
            }
            let tasks = shard
                .list_move_tasks(ctx.arn_tenant(&r.source_arn), &r.source_arn, max)
                .await?;
            Response::ListMessageMoveTasks(wire::ListMessageMoveTasksResult {
                results: tasks.into_iter().map(move_task_entry).collect(),
            })
        }
        Request::CancelMessageMoveTask(r) => {
            if r.task_handle.is_empty() {
                return Err(Failure::missing("TaskHandle"));
            }
            let moved = shard
                .cancel_move_task(&ctx.caller.account, &r.task_handle)
                .await?;
            Response::CancelMessageMoveTask(wire::CancelMessageMoveTaskResult {
                approximate_number_of_messages_moved: moved,
            })
        }
        Request::SendMessage(r) => {
            let q = ctx.resolve(&r.queue_url)?;
            let (req, md5_system) = send_request(
                r.message_body,
                r.delay_seconds,
                r.message_attributes,
                r.message_system_attributes,
                r.message_group_id,
                r.message_deduplication_id,
            )?;
            let sent = shard.send(&q, req).await?;
            Response::SendMessage(wire::SendMessageResult {
                message_id: sent.message_id.to_string(),
                md5_of_message_body: sent.md5_body.to_string(),
                md5_of_message_attributes: sent.md5_attributes.map(|d| d.to_string()),
                md5_of_message_system_attributes: md5_system,
                sequence_number: sent.sequence_number.map(|n| format!("{n:020}")),
            })
        }
        Request::SendMessageBatch(r) => send_message_batch(ctx, r).await?,
        Request::ReceiveMessage(r) => receive_message(ctx, r).await?,
        Request::DeleteMessage(r) => {
            let q = ctx.resolve(&r.queue_url)?;
            if r.receipt_handle.is_empty() {
                return Err(Failure::missing("ReceiptHandle"));
            }
            shard.delete_message(&q, &r.receipt_handle).await?;
            Response::DeleteMessage(wire::DeleteMessageResult {})
        }
        Request::DeleteMessageBatch(r) => {
            let q = ctx.resolve(&r.queue_url)?;
            check_batch_ids(r.entries.iter().map(|e| e.id.as_str()))?;
            // One delete command per partition named (`Shard::delete_message_batch`); an
            // entry without a handle fails on its own.
            let parsed = r
                .entries
                .into_iter()
                .map(|e| (e.id, receipt_handle(e.receipt_handle)))
                .collect();
            let results = run_parsed_entries(parsed, |h| shard.delete_message_batch(&q, h)).await;
            let (successful, failed) = batch_outcome(results);
            Response::DeleteMessageBatch(wire::DeleteMessageBatchResult { successful, failed })
        }
        Request::ChangeMessageVisibility(r) => {
            let q = ctx.resolve(&r.queue_url)?;
            if r.receipt_handle.is_empty() {
                return Err(Failure::missing("ReceiptHandle"));
            }
            let timeout = visibility(Some(r.visibility_timeout))?.unwrap_or_default();
            shard
                .change_visibility(&q, &r.receipt_handle, timeout)
                .await?;
            Response::ChangeMessageVisibility(wire::ChangeMessageVisibilityResult {})
        }
        Request::ChangeMessageVisibilityBatch(r) => {
            let q = ctx.resolve(&r.queue_url)?;
            check_batch_ids(r.entries.iter().map(|e| e.id.as_str()))?;
            // One command per partition named (`Shard::change_visibility_batch`); an entry
            // that does not parse fails on its own.
            let parsed = r
                .entries
                .into_iter()
                .map(|e| {
                    let entry = receipt_handle(e.receipt_handle).and_then(|h| {
                        let t = visibility(e.visibility_timeout)?
                            .ok_or_else(|| Failure::missing("VisibilityTimeout"))?;
                        Ok((h, t))
                    });
                    (e.id, entry)
                })
                .collect();
            let results =
                run_parsed_entries(parsed, |e| shard.change_visibility_batch(&q, e)).await;
            let (successful, failed) = batch_outcome(results);
            Response::ChangeMessageVisibilityBatch(wire::ChangeMessageVisibilityBatchResult {
                successful,
                failed,
            })
        }
    })
}

impl Ctx {
    /// The account a queue ARN is looked up in (`auth::access::arn_account`).
    fn arn_tenant<'s>(&'s self, arn: &'s str) -> &'s str {
        access::arn_account(&self.caller, arn)
    }

    pub fn queue_url(&self, q: &QueueMeta) -> String {
        format!("http://{}/{}/{}", self.url_host, q.tenant, q.name)
    }

    /// Accepts `http(s)://<any host>/<account>/<name>` and `/<account>/<name>`, as HTTP does,
    /// within the caller's account.
    fn resolve(&self, url: &str) -> Result<Arc<QueueMeta>> {
        if url.is_empty() {
            return Err(Failure::missing("QueueUrl"));
        }
        Ok(access::queue_by_url(&self.shard, &self.caller, url)?)
    }
}

fn move_task_entry(t: MoveTaskInfo) -> wire::ListMessageMoveTasksResultEntry {
    wire::ListMessageMoveTasksResultEntry {
        task_handle: t.task_handle,
        status: match t.status {
            MoveTaskStatus::Running => wire::MoveTaskStatus::Running,
            MoveTaskStatus::Completed => wire::MoveTaskStatus::Completed,
            MoveTaskStatus::Cancelling => wire::MoveTaskStatus::Cancelling,
            MoveTaskStatus::Cancelled => wire::MoveTaskStatus::Cancelled,
            MoveTaskStatus::Failed => wire::MoveTaskStatus::Failed,
        },
        source_arn: t.source_arn,
        destination_arn: t.destination_arn,
        max_number_of_messages_per_second: t.max_messages_per_second,
        approximate_number_of_messages_moved: t.messages_moved,
        approximate_number_of_messages_to_move: Some(t.messages_to_move),
        failure_reason: t.failure_reason,
        started_timestamp: t.started_ms,
    }
}

/// Pagination over names: the token is the last name returned, base64url-encoded (the same
/// tokens as the HTTP API's).
fn paginate(
    mut queues: Vec<Arc<QueueMeta>>,
    max_results: Option<u32>,
    next_token: Option<String>,
) -> Result<(Vec<Arc<QueueMeta>>, Option<String>)> {
    queues.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(m) = max_results {
        if !(1..=LIST_RESULTS_MAX).contains(&m) {
            return Err(Failure::invalid(
                "MaxResults",
                format!("must be between 1 and {LIST_RESULTS_MAX}"),
            ));
        }
    }
    if let Some(token) = next_token {
        let after = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.as_bytes())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| Failure::invalid("NextToken", "not a token this endpoint issued"))?;
        queues.retain(|q| q.name > after);
    }
    let limit = max_results.map_or(LIST_QUEUES_DEFAULT_MAX, |m| m as usize);
    let more = queues.len() > limit;
    queues.truncate(limit);
    let token = match (more, max_results, queues.last()) {
        (true, Some(_), Some(last)) => {
            Some(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(last.name.as_bytes()))
        }
        _ => None,
    };
    Ok((queues, token))
}

async fn get_queue_attributes(ctx: &Ctx, q: &QueueMeta, names: &[String]) -> Result<Response> {
    for n in names {
        if !QUEUE_ATTRIBUTE_NAMES.contains(&n.as_str()) {
            return Err(Failure::new(
                ErrorCode::InvalidAttributeName,
                format!("Unknown Attribute {n}."),
            ));
        }
    }
    let all = names.iter().any(|n| n == "All");
    let wanted = |n: &str| all || names.iter().any(|w| w == n);
    let mut attrs = q.static_attributes(&ctx.shard.config.region);
    if wanted("ApproximateNumberOfMessages")
        || wanted("ApproximateNumberOfMessagesNotVisible")
        || wanted("ApproximateNumberOfMessagesDelayed")
    {
        let c = ctx.shard.queue_counters(q).await?;
        attrs.insert("ApproximateNumberOfMessages".into(), c.visible.to_string());
        attrs.insert(
            "ApproximateNumberOfMessagesNotVisible".into(),
            (c.in_flight + c.moving).to_string(),
        );
        attrs.insert(
            "ApproximateNumberOfMessagesDelayed".into(),
            c.delayed.to_string(),
        );
    }
    attrs.retain(|k, _| wanted(k));
    Ok(Response::GetQueueAttributes(
        wire::GetQueueAttributesResult { attributes: attrs },
    ))
}

fn engine_attributes(map: wire::MessageAttributeMap) -> Vec<MessageAttribute> {
    map.into_iter()
        .map(|(name, v)| MessageAttribute {
            name,
            data_type: v.data_type,
            value: match v.value {
                wire::AttributeValue::String(s) => AttributeValue::String(s),
                wire::AttributeValue::Binary(b) => AttributeValue::Binary(b),
            },
        })
        .collect()
}

/// A SendMessage's (or batch entry's) message, and the digest of its system attributes.
fn send_request(
    body: String,
    delay_seconds: Option<u32>,
    attributes: wire::MessageAttributeMap,
    system: wire::MessageAttributeMap,
    group_id: Option<String>,
    dedup_id: Option<String>,
) -> Result<(SendRequest, Option<String>)> {
    if let Some(d) = delay_seconds {
        if d > DELAY_S_MAX {
            return Err(Failure::invalid(
                "DelaySeconds",
                format!("must be between 0 and {DELAY_S_MAX}"),
            ));
        }
    }
    let system = engine_attributes(system);
    // SQS accepts only `AWSTraceHeader` (a String); its digest is returned, the header itself
    // is not stored yet (as in the HTTP API).
    for a in &system {
        let ok = a.name == "AWSTraceHeader"
            && a.data_type == "String"
            && matches!(&a.value, AttributeValue::String(v) if !v.is_empty());
        if !ok {
            return Err(Failure::invalid(
                "MessageSystemAttributes",
                format!(
                    "{} is not a supported message system attribute (only AWSTraceHeader, a String)",
                    a.name
                ),
            ));
        }
    }
    let md5_system = md5_of_attributes(&system).map(|d| d.to_string());
    Ok((
        SendRequest {
            body,
            attributes: engine_attributes(attributes),
            delay_s: delay_seconds,
            group_id,
            dedup_id,
        },
        md5_system,
    ))
}

/// The request-level rules every batch shares: 1–10 entries with distinct, well-formed ids.
fn check_batch_ids<'a>(ids: impl ExactSizeIterator<Item = &'a str>) -> Result<()> {
    if ids.len() == 0 {
        return Err(EngineError::EmptyBatchRequest.into());
    }
    if ids.len() > BATCH_ENTRIES_MAX {
        return Err(EngineError::TooManyEntriesInBatchRequest.into());
    }
    let mut seen = HashSet::new();
    for id in ids {
        if id.is_empty()
            || id.len() > BATCH_ENTRY_ID_LEN_MAX
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(EngineError::InvalidBatchEntryId(id.to_string()).into());
        }
        if !seen.insert(id) {
            return Err(EngineError::BatchEntryIdsNotDistinct(id.to_string()).into());
        }
    }
    Ok(())
}

fn batch_outcome(
    results: Vec<(String, Result<()>)>,
) -> (
    Vec<wire::BatchResultEntry>,
    Vec<wire::BatchResultErrorEntry>,
) {
    let (mut ok, mut failed) = (Vec::new(), Vec::new());
    for (id, r) in results {
        match r {
            Ok(()) => ok.push(wire::BatchResultEntry { id }),
            Err(f) => failed.push(f.to_entry(id)),
        }
    }
    (ok, failed)
}

/// A receipt handle that must be there.
fn receipt_handle(h: String) -> Result<String> {
    match h.is_empty() {
        true => Err(Failure::missing("ReceiptHandle")),
        false => Ok(h),
    }
}

fn visibility(v: Option<u32>) -> Result<Option<u32>> {
    match v {
        Some(t) if t > VISIBILITY_TIMEOUT_S_MAX => Err(Failure::invalid(
            "VisibilityTimeout",
            format!("must be between 0 and {VISIBILITY_TIMEOUT_S_MAX}"),
        )),
        other => Ok(other),
    }
}

async fn send_message_batch(ctx: &Ctx, r: wire::SendMessageBatchRequest) -> Result<Response> {
    let q = ctx.resolve(&r.queue_url)?;
    check_batch_ids(r.entries.iter().map(|e| e.id.as_str()))?;
    let n = r.entries.len();
    let mut good = Vec::with_capacity(n);
    let mut system_md5 = BTreeMap::new();
    // Entry-level problems become per-entry failures, in the request's order.
    let mut results: Vec<Option<std::result::Result<SentReply, Failure>>> = Vec::with_capacity(n);
    let mut ids = Vec::with_capacity(n);
    for e in r.entries {
        ids.push(e.id.clone());
        match send_request(
            e.message_body,
            e.delay_seconds,
            e.message_attributes,
            e.message_system_attributes,
            e.message_group_id,
            e.message_deduplication_id,
        ) {
            Ok((request, md5)) => {
                if let Some(m) = md5 {
                    system_md5.insert(e.id.clone(), m);
                }
                good.push(BatchEntry { id: e.id, request });
                results.push(None);
            }
            Err(f) => results.push(Some(Err(f))),
        }
    }
    if !good.is_empty() {
        let mut sent = ctx.shard.send_batch(&q, good).await?.into_iter();
        for slot in results.iter_mut().filter(|r| r.is_none()) {
            let (_, r) = sent.next().ok_or_else(|| {
                Failure::from(ServiceError::Internal("batch result missing".into()))
            })?;
            *slot = Some(r.map_err(Failure::from));
        }
    }
    let (mut successful, mut failed) = (Vec::new(), Vec::new());
    for (id, r) in ids.into_iter().zip(results) {
        match r {
            Some(Ok(s)) => successful.push(wire::SendMessageBatchResultEntry {
                md5_of_message_system_attributes: system_md5.remove(&id),
                id,
                message_id: s.message_id.to_string(),
                md5_of_message_body: s.md5_body.to_string(),
                md5_of_message_attributes: s.md5_attributes.map(|d| d.to_string()),
                sequence_number: s.sequence_number.map(|n| format!("{n:020}")),
            }),
            Some(Err(f)) => failed.push(f.to_entry(id)),
            None => failed.push(
                Failure::from(ServiceError::Internal("batch result missing".into())).to_entry(id),
            ),
        }
    }
    Ok(Response::SendMessageBatch(wire::SendMessageBatchResult {
        successful,
        failed,
    }))
}

async fn receive_message(ctx: &Ctx, r: wire::ReceiveMessageRequest) -> Result<Response> {
    let q = ctx.resolve(&r.queue_url)?;
    let max = r.max_number_of_messages.unwrap_or(1);
    if !(1..=RECEIVE_MESSAGES_MAX).contains(&max) {
        return Err(Failure::invalid(
            "MaxNumberOfMessages",
            format!("must be between 1 and {RECEIVE_MESSAGES_MAX}"),
        ));
    }
    let vis = visibility(r.visibility_timeout)?;
    let wait = match r.wait_time_seconds {
        Some(w) if w > WAIT_TIME_S_MAX => {
            return Err(Failure::invalid(
                "WaitTimeSeconds",
                format!("must be between 0 and {WAIT_TIME_S_MAX}"),
            ))
        }
        Some(w) => w,
        None => q.parsed.wait_time_s,
    };
    let sel = AttributeSelection::new(r.message_system_attribute_names, r.message_attribute_names)
        .map_err(|n| {
            Failure::new(
                ErrorCode::InvalidAttributeName,
                format!("Unknown Attribute {n}."),
            )
        })?;
    let got = ctx
        .shard
        .receive(
            &q,
            ReceiveRequest {
                max_messages: max,
                visibility_timeout_s: vis,
                attempt_id: r.receive_request_attempt_id,
            },
            wait,
        )
        .await?;
    let messages = got
        .into_iter()
        .map(|d| message_out(ctx, &q, d, &sel))
        .collect();
    Ok(Response::ReceiveMessage(wire::ReceiveMessageResult {
        messages,
    }))
}

fn message_out(ctx: &Ctx, q: &QueueMeta, d: Delivered, sel: &AttributeSelection) -> wire::Message {
    let shown = ctx.shard.render_attributes(q, &d, sel);
    let attributes: wire::AttributeMap = shown
        .system
        .into_iter()
        .map(|(name, v)| (name.to_string(), v))
        .collect();
    let message_attributes = shown
        .message_attributes
        .into_iter()
        .map(|a| {
            let value = match a.value {
                AttributeValue::String(s) => wire::AttributeValue::String(s),
                AttributeValue::Binary(b) => wire::AttributeValue::Binary(b),
            };
            (
                a.name,
                wire::MessageAttributeValue {
                    data_type: a.data_type,
                    value,
                },
            )
        })
        .collect();
    let payload = &d.payload;
    wire::Message {
        message_id: d.message_id.to_string(),
        receipt_handle: ctx.shard.receipt_handle(&d.receipt),
        md5_of_body: payload.md5_body().to_string(),
        body: payload.body.clone(),
        attributes,
        md5_of_message_attributes: shown.md5_of_message_attributes.map(|d| d.to_string()),
        message_attributes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every service error keeps a specific wire code (none falls back to InternalFailure
    /// unless it is one).
    #[test]
    fn service_errors_map_to_their_wire_codes() {
        let cases = [
            (ServiceError::NonExistentQueue, ErrorCode::QueueDoesNotExist),
            (ServiceError::QueueNameExists, ErrorCode::QueueNameExists),
            (
                ServiceError::QueueDeletedRecently,
                ErrorCode::QueueDeletedRecently,
            ),
            (ServiceError::TooManyQueues(1), ErrorCode::OverLimit),
            (
                ServiceError::Internal("x".into()),
                ErrorCode::InternalFailure,
            ),
            (
                ServiceError::Unavailable("x"),
                ErrorCode::ServiceUnavailable,
            ),
            (ServiceError::Throttled("x"), ErrorCode::RequestThrottled),
            (
                EngineError::ReceiptHandleIsInvalid("x").into(),
                ErrorCode::ReceiptHandleIsInvalid,
            ),
            (
                EngineError::MessageNotInflight.into(),
                ErrorCode::MessageNotInflight,
            ),
            (
                EngineError::EmptyBatchRequest.into(),
                ErrorCode::EmptyBatchRequest,
            ),
            (
                EngineError::TooManyEntriesInBatchRequest.into(),
                ErrorCode::TooManyEntriesInBatchRequest,
            ),
            (
                EngineError::BatchEntryIdsNotDistinct("a".into()).into(),
                ErrorCode::BatchEntryIdsNotDistinct,
            ),
            (
                EngineError::InvalidBatchEntryId("a".into()).into(),
                ErrorCode::InvalidBatchEntryId,
            ),
            (
                EngineError::PurgeQueueInProgress.into(),
                ErrorCode::PurgeQueueInProgress,
            ),
        ];
        for (e, want) in cases {
            let sqs = e.info().code;
            assert_eq!(Failure::from(e).code, want, "{sqs}");
        }
    }

    #[test]
    fn batch_id_rules() {
        assert_eq!(
            check_batch_ids(std::iter::empty()).unwrap_err().code,
            ErrorCode::EmptyBatchRequest
        );
        let eleven: Vec<String> = (0..11).map(|i| i.to_string()).collect();
        assert_eq!(
            check_batch_ids(eleven.iter().map(String::as_str))
                .unwrap_err()
                .code,
            ErrorCode::TooManyEntriesInBatchRequest
        );
        assert_eq!(
            check_batch_ids(["a", "a"].into_iter()).unwrap_err().code,
            ErrorCode::BatchEntryIdsNotDistinct
        );
        assert_eq!(
            check_batch_ids(["a b"].into_iter()).unwrap_err().code,
            ErrorCode::InvalidBatchEntryId
        );
        assert!(check_batch_ids(["a", "b-1", "c_2"].into_iter()).is_ok());
    }
}
