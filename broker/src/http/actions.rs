//! The 23 actions of the SQS API, each written once against [`Params`] (either protocol's
//! input) and returning an [`Out`] tree (either protocol's output). The service layer
//! (`Shard`) does the work; this file checks parameters the service does not see (URLs, batch
//! ids, ranges of request parameters, attribute-name lists) and shapes the answers.

use super::protocol::{Out, Params, SqsError};
use crate::auth::{access, Caller};
use crate::engine::attributes::{
    AttributeValue, MessageAttribute, DELAY_S_MAX, QUEUE_ATTRIBUTE_NAMES, VISIBILITY_TIMEOUT_S_MAX,
    WAIT_TIME_S_MAX,
};
use crate::engine::md5::md5_of_attributes;
use crate::engine::{BatchEntry, Delivered, ReceiveRequest, SendRequest, SentReply};
use crate::metadata::QueueMeta;
use crate::shard::move_task::{MoveTaskInfo, MOVE_RATE_MAX};
use crate::shard::render::AttributeSelection;
use crate::shard::{run_parsed_entries, Shard};
use base64::Engine as _;
use std::collections::{BTreeMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;

pub use sluice_wire::limits::{BATCH_ENTRIES_MAX, BATCH_ENTRY_ID_LEN_MAX, LIST_QUEUES_DEFAULT_MAX};
/// MaxNumberOfMessages of a ReceiveMessage ([`sluice_wire::limits`]), as the Query parser's i64.
pub const RECEIVE_MESSAGES_MAX: i64 = sluice_wire::limits::RECEIVE_MESSAGES_MAX as i64;

/// Every action of the model, in the model's order.
pub const ACTIONS: [&str; 23] = [
    "AddPermission",
    "CancelMessageMoveTask",
    "ChangeMessageVisibility",
    "ChangeMessageVisibilityBatch",
    "CreateQueue",
    "DeleteMessage",
    "DeleteMessageBatch",
    "DeleteQueue",
    "GetQueueAttributes",
    "GetQueueUrl",
    "ListDeadLetterSourceQueues",
    "ListMessageMoveTasks",
    "ListQueueTags",
    "ListQueues",
    "PurgeQueue",
    "ReceiveMessage",
    "RemovePermission",
    "SendMessage",
    "SendMessageBatch",
    "SetQueueAttributes",
    "StartMessageMoveTask",
    "TagQueue",
    "UntagQueue",
];

/// Who asks, and how to answer with URLs.
pub struct Ctx<'a> {
    pub shard: &'a Rc<Shard>,
    /// Who asks; every queue, ARN and task is resolved within its account (`auth::access`).
    pub caller: &'a Caller,
    /// `host[:port]` for queue URLs.
    pub host: &'a str,
    /// The Query protocol's `POST /<account>/<queue>`: the queue when `QueueUrl` is absent.
    pub path_queue: Option<&'a str>,
}

type ActionResult = Result<Option<Out>, SqsError>;

fn s(v: impl Into<String>) -> Out {
    Out::Str(v.into())
}

fn one(json: &'static str, v: Out) -> Out {
    Out::Struct(vec![(json, json, v)])
}

pub async fn dispatch(ctx: &Ctx<'_>, action: &str, mut p: Params) -> ActionResult {
    match action {
        "CreateQueue" => create_queue(ctx, p).await,
        "DeleteQueue" => {
            let q = ctx.resolve(&mut p)?;
            ctx.shard.delete_queue(&q).await?;
            Ok(None)
        }
        "GetQueueUrl" => get_queue_url(ctx, p),
        "ListQueues" => list_queues(ctx, p),
        "GetQueueAttributes" => get_queue_attributes(ctx, p).await,
        "SetQueueAttributes" => {
            let q = ctx.resolve(&mut p)?;
            if !p.has("Attributes") {
                return Err(SqsError::missing("Attributes"));
            }
            let attrs = p.str_map("Attributes")?;
            ctx.shard.set_queue_attributes(&q, attrs).await?;
            Ok(None)
        }
        "PurgeQueue" => {
            let q = ctx.resolve(&mut p)?;
            ctx.shard.purge(&q).await.map_err(|e| {
                let mut e = SqsError::from(e);
                if e.code == "AWS.SimpleQueueService.PurgeQueueInProgress" {
                    e.message = format!(
                        "Only one PurgeQueue operation on {} is allowed every 60 seconds.",
                        q.name
                    );
                }
                e
            })?;
            Ok(None)
        }
        "TagQueue" => {
            let q = ctx.resolve(&mut p)?;
            if !p.has("Tags") {
                return Err(SqsError::missing("Tags"));
            }
            let mut tags = q.tags.clone();
            tags.extend(p.str_map("Tags")?);
            ctx.shard.set_tags(&q, tags).await?;
            Ok(None)
        }
        "UntagQueue" => {
            let q = ctx.resolve(&mut p)?;
            if !p.has("TagKeys") {
                return Err(SqsError::missing("TagKeys"));
            }
            let mut tags = q.tags.clone();
            for k in p.str_list("TagKeys")? {
                tags.remove(&k);
            }
            ctx.shard.set_tags(&q, tags).await?;
            Ok(None)
        }
        "ListQueueTags" => {
            let q = ctx.resolve(&mut p)?;
            Ok(Some(one_xml(
                "Tags",
                "Tag",
                Out::Map {
                    key_tag: "Key",
                    value_tag: "Value",
                    entries: q.tags.iter().map(|(k, v)| (k.clone(), s(v))).collect(),
                },
            )))
        }
        "SendMessage" => send_message(ctx, p).await,
        "SendMessageBatch" => send_message_batch(ctx, p).await,
        "ReceiveMessage" => receive_message(ctx, p).await,
        "DeleteMessage" => {
            let q = ctx.resolve(&mut p)?;
            let handle = p.str("ReceiptHandle")?;
            let r = ctx.shard.delete_message(&q, &handle).await;
            r.map_err(|e| stale_handle(ctx, &q, &handle, e.into(), HandleUse::Delete))?;
            Ok(None)
        }
        "DeleteMessageBatch" => handle_batch(ctx, p, false).await,
        "ChangeMessageVisibility" => {
            let q = ctx.resolve(&mut p)?;
            let handle = p.str("ReceiptHandle")?;
            let timeout =
                visibility(&mut p)?.ok_or_else(|| SqsError::missing("VisibilityTimeout"))?;
            let r = ctx.shard.change_visibility(&q, &handle, timeout).await;
            r.map_err(|e| stale_handle(ctx, &q, &handle, e.into(), HandleUse::ChangeVisibility))?;
            Ok(None)
        }
        "ChangeMessageVisibilityBatch" => handle_batch(ctx, p, true).await,
        "ListDeadLetterSourceQueues" => list_dead_letter_sources(ctx, p),
        "StartMessageMoveTask" => {
            let source =
                arn_param(&mut p, "SourceArn")?.ok_or_else(|| SqsError::missing("SourceArn"))?;
            let destination = arn_param(&mut p, "DestinationArn")?;
            let rate = p.opt_int_in("MaxNumberOfMessagesPerSecond", 1, i64::from(MOVE_RATE_MAX))?;
            let handle = ctx
                .shard
                .start_move_task(
                    ctx.arn_tenant(&source),
                    &source,
                    destination.as_deref(),
                    rate,
                )
                .await?;
            Ok(Some(one("TaskHandle", s(handle))))
        }
        "ListMessageMoveTasks" => {
            let source =
                arn_param(&mut p, "SourceArn")?.ok_or_else(|| SqsError::missing("SourceArn"))?;
            let max = p.opt_int_in("MaxResults", 1, 10)?.unwrap_or(1);
            let tasks = ctx
                .shard
                .list_move_tasks(ctx.arn_tenant(&source), &source, max)
                .await?;
            let entries = tasks.into_iter().map(move_task_entry).collect();
            Ok(Some(Out::Struct(vec![(
                "Results",
                "ListMessageMoveTasksResultEntry",
                Out::List(entries),
            )])))
        }
        "CancelMessageMoveTask" => {
            let handle = p.str("TaskHandle")?;
            let moved = ctx
                .shard
                .cancel_move_task(&ctx.caller.account, &handle)
                .await?;
            Ok(Some(one(
                "ApproximateNumberOfMessagesMoved",
                Out::Int(moved as i64),
            )))
        }
        "AddPermission" | "RemovePermission" => Err(SqsError::unsupported(format!(
            "{action} is not supported: Sluice has no queue policies; access is per account \
             (access keys map to accounts)"
        ))),
        other => Err(SqsError::new(
            "InvalidAction",
            400,
            format!("The action {other} is not valid for this endpoint."),
        )),
    }
}

/// An ARN parameter of the move-task actions: something that is not shaped as an ARN at all
/// is an invalid value (as SQS answers it), not a queue that does not exist.
fn arn_param(p: &mut Params, name: &str) -> Result<Option<String>, SqsError> {
    let Some(arn) = p.opt_str(name)? else {
        return Ok(None);
    };
    let parts: Vec<&str> = arn.split(':').collect();
    if parts.len() != 6 || parts[0] != "arn" || parts.iter().skip(1).any(|x| x.is_empty()) {
        return Err(SqsError::new(
            "InvalidParameterValue",
            400,
            format!(
                "You must use this format to specify the {name}: \
                 arn:<partition>:<service>:<region>:<account-id>:<resource-id>"
            ),
        ));
    }
    Ok(Some(arn))
}

fn move_task_entry(t: MoveTaskInfo) -> Out {
    let mut m = Vec::new();
    if let Some(h) = t.task_handle {
        m.push(("TaskHandle", "TaskHandle", s(h)));
    }
    m.push(("Status", "Status", s(t.status.as_str())));
    m.push(("SourceArn", "SourceArn", s(t.source_arn)));
    if let Some(d) = t.destination_arn {
        m.push(("DestinationArn", "DestinationArn", s(d)));
    }
    if let Some(r) = t.max_messages_per_second {
        m.push((
            "MaxNumberOfMessagesPerSecond",
            "MaxNumberOfMessagesPerSecond",
            Out::Int(i64::from(r)),
        ));
    }
    m.push((
        "ApproximateNumberOfMessagesMoved",
        "ApproximateNumberOfMessagesMoved",
        Out::Int(t.messages_moved as i64),
    ));
    m.push((
        "ApproximateNumberOfMessagesToMove",
        "ApproximateNumberOfMessagesToMove",
        Out::Int(t.messages_to_move as i64),
    ));
    if let Some(f) = t.failure_reason {
        m.push(("FailureReason", "FailureReason", s(f)));
    }
    m.push((
        "StartedTimestamp",
        "StartedTimestamp",
        Out::Int(t.started_ms as i64),
    ));
    Out::Struct(m)
}

fn one_xml(json: &'static str, xml: &'static str, v: Out) -> Out {
    Out::Struct(vec![(json, xml, v)])
}

impl Ctx<'_> {
    /// The account a queue ARN is looked up in (`auth::access::arn_account`).
    fn arn_tenant<'s>(&'s self, arn: &'s str) -> &'s str {
        access::arn_account(self.caller, arn)
    }

    pub fn queue_url(&self, q: &QueueMeta) -> String {
        format!("http://{}/{}/{}", self.host, q.tenant, q.name)
    }

    fn resolve(&self, p: &mut Params) -> Result<Arc<QueueMeta>, SqsError> {
        match p.opt_str("QueueUrl")? {
            Some(u) => self.resolve_url(&u),
            None => match self.path_queue {
                Some(path) => self.resolve_url(path),
                None => Err(SqsError::missing("QueueUrl")),
            },
        }
    }

    /// Accepts `http(s)://<any host>/<account>/<name>` and `/<account>/<name>`.
    fn resolve_url(&self, url: &str) -> Result<Arc<QueueMeta>, SqsError> {
        Ok(access::queue_by_url(self.shard, self.caller, url)?)
    }
}

async fn create_queue(ctx: &Ctx<'_>, mut p: Params) -> ActionResult {
    let name = p.str("QueueName")?;
    let attributes = p.str_map("Attributes")?;
    let tags = p.str_map("tags")?;
    let q = ctx
        .shard
        .create_queue(&ctx.caller.account, &name, attributes, tags)
        .await?;
    Ok(Some(one("QueueUrl", s(ctx.queue_url(&q)))))
}

fn get_queue_url(ctx: &Ctx<'_>, mut p: Params) -> ActionResult {
    let name = p.str("QueueName")?;
    let owner = p.opt_str("QueueOwnerAWSAccountId")?;
    let q = access::queue_by_name(ctx.shard, ctx.caller, &name, owner.as_deref())?;
    Ok(Some(one("QueueUrl", s(ctx.queue_url(&q)))))
}

/// Pagination over names: the token is the last name returned, base64url-encoded.
fn paginate(
    mut names: Vec<Arc<QueueMeta>>,
    p: &mut Params,
) -> Result<(Vec<Arc<QueueMeta>>, Option<String>), SqsError> {
    names.sort_by(|a, b| a.name.cmp(&b.name));
    let max = p.opt_int_in("MaxResults", 1, 1000)?;
    if let Some(token) = p.opt_str("NextToken")? {
        let after = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.as_bytes())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| SqsError::invalid("NextToken", "not a token this endpoint issued"))?;
        names.retain(|q| q.name > after);
    }
    let limit = max.map_or(LIST_QUEUES_DEFAULT_MAX, |m| m as usize);
    let more = names.len() > limit;
    names.truncate(limit);
    let token = match (more, max, names.last()) {
        (true, Some(_), Some(last)) => {
            Some(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(last.name.as_bytes()))
        }
        _ => None,
    };
    Ok((names, token))
}

fn list_queues(ctx: &Ctx<'_>, mut p: Params) -> ActionResult {
    let prefix = p.opt_str("QueueNamePrefix")?.unwrap_or_default();
    let all = ctx.shard.list_queues(&ctx.caller.account, &prefix);
    let (page, token) = paginate(all, &mut p)?;
    let mut members = Vec::new();
    if !page.is_empty() {
        members.push((
            "QueueUrls",
            "QueueUrl",
            Out::List(page.iter().map(|q| s(ctx.queue_url(q))).collect()),
        ));
    }
    if let Some(t) = token {
        members.push(("NextToken", "NextToken", s(t)));
    }
    Ok(Some(Out::Struct(members)))
}

fn list_dead_letter_sources(ctx: &Ctx<'_>, mut p: Params) -> ActionResult {
    let q = ctx.resolve(&mut p)?;
    let (page, token) = paginate(ctx.shard.dead_letter_sources(&q), &mut p)?;
    let mut members = vec![(
        "queueUrls",
        "QueueUrl",
        Out::List(page.iter().map(|q| s(ctx.queue_url(q))).collect()),
    )];
    if let Some(t) = token {
        members.push(("NextToken", "NextToken", s(t)));
    }
    Ok(Some(Out::Struct(members)))
}

async fn get_queue_attributes(ctx: &Ctx<'_>, mut p: Params) -> ActionResult {
    let q = ctx.resolve(&mut p)?;
    let names = p.str_list("AttributeNames")?;
    for n in &names {
        if !QUEUE_ATTRIBUTE_NAMES.contains(&n.as_str()) {
            return Err(SqsError::new(
                "InvalidAttributeName",
                400,
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
        let c = ctx.shard.queue_counters(&q).await?;
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
    let entries = attrs
        .into_iter()
        .filter(|(k, _)| wanted(k))
        .map(|(k, v)| (k, s(v)))
        .collect();
    Ok(Some(one_xml(
        "Attributes",
        "Attribute",
        Out::Map {
            key_tag: "Name",
            value_tag: "Value",
            entries,
        },
    )))
}

/// A SendMessage's (or batch entry's) message, moved out of the parameters (no body copy).
pub(crate) fn send_request(p: &mut Params) -> Result<(SendRequest, Option<String>), SqsError> {
    let body = p.str("MessageBody")?;
    if body.is_empty() {
        // As SQS: an empty body is a missing one.
        return Err(SqsError::missing("MessageBody"));
    }
    let delay_s = p.opt_int_in("DelaySeconds", 0, i64::from(DELAY_S_MAX))?;
    let attributes = p.message_attributes("MessageAttributes")?;
    let system = p.message_attributes("MessageSystemAttributes")?;
    let md5_system = system_attributes_md5(&system)?;
    Ok((
        SendRequest {
            body,
            attributes,
            delay_s,
            group_id: p.opt_str("MessageGroupId")?,
            dedup_id: p.opt_str("MessageDeduplicationId")?,
        },
        md5_system,
    ))
}

/// MessageSystemAttributes on send: SQS accepts only `AWSTraceHeader` (a String). Its digest
/// is returned; the header itself is not stored yet (see the module notes).
fn system_attributes_md5(system: &[MessageAttribute]) -> Result<Option<String>, SqsError> {
    for a in system {
        let ok = a.name == "AWSTraceHeader"
            && a.data_type == "String"
            && matches!(&a.value, AttributeValue::String(v) if !v.is_empty());
        if !ok {
            return Err(SqsError::invalid(
                "MessageSystemAttributes",
                format!("{} is not a supported message system attribute (only AWSTraceHeader, a String)", a.name),
            ));
        }
    }
    Ok(md5_of_attributes(system).map(|d| d.to_string()))
}

fn sent_members(
    r: &SentReply,
    md5_system: Option<String>,
) -> Vec<(&'static str, &'static str, Out)> {
    let mut m = vec![
        ("MessageId", "MessageId", s(r.message_id.to_string())),
        (
            "MD5OfMessageBody",
            "MD5OfMessageBody",
            s(r.md5_body.to_string()),
        ),
    ];
    if let Some(a) = r.md5_attributes {
        m.push((
            "MD5OfMessageAttributes",
            "MD5OfMessageAttributes",
            s(a.to_string()),
        ));
    }
    if let Some(d) = md5_system {
        m.push((
            "MD5OfMessageSystemAttributes",
            "MD5OfMessageSystemAttributes",
            s(d),
        ));
    }
    if let Some(n) = r.sequence_number {
        m.push(("SequenceNumber", "SequenceNumber", s(format!("{n:020}"))));
    }
    m
}

/// A FIFO queue's sends need a MessageGroupId, and a MessageDeduplicationId unless the queue
/// deduplicates by content. SQS words a missing group id of a SendMessage as a missing
/// parameter, and fails a whole SendMessageBatch (not the entry) on either.
fn fifo_send_rule(q: &QueueMeta, req: &SendRequest, batch: bool) -> Result<(), SqsError> {
    if q.kind != crate::engine::attributes::QueueKind::Fifo {
        return Ok(());
    }
    if req.group_id.is_none() {
        let message = "The request must contain the parameter MessageGroupId.";
        return Err(if batch {
            SqsError::new("InvalidParameterValue", 400, message)
        } else {
            SqsError::new("MissingParameter", 400, message)
        });
    }
    if req.dedup_id.is_none() && !q.parsed.content_based_dedup {
        return Err(SqsError::new(
            "InvalidParameterValue",
            400,
            "The queue should either have ContentBasedDeduplication enabled or \
             MessageDeduplicationId provided explicitly",
        ));
    }
    Ok(())
}

async fn send_message(ctx: &Ctx<'_>, mut p: Params) -> ActionResult {
    let q = ctx.resolve(&mut p)?;
    let (req, md5_system) = send_request(&mut p)?;
    fifo_send_rule(&q, &req, false)?;
    let r = ctx.shard.send(&q, req).await?;
    Ok(Some(Out::Struct(sent_members(&r, md5_system))))
}

/// The request-level rules every batch shares: 1–10 entries with distinct, well-formed ids.
/// `entry` names an entry as the Query protocol does (`SendMessageBatchRequestEntry`), which
/// SQS's message for an empty batch quotes.
pub(crate) fn batch_entries(
    p: &mut Params,
    entry: &str,
) -> Result<Vec<(String, Params)>, SqsError> {
    let entries = p.struct_list("Entries")?.unwrap_or_default();
    if entries.is_empty() {
        let mut e = SqsError::from(crate::engine::EngineError::EmptyBatchRequest);
        e.message = format!("There should be at least one {entry} in the request.");
        return Err(e);
    }
    if entries.len() > BATCH_ENTRIES_MAX {
        let mut e = SqsError::from(crate::engine::EngineError::TooManyEntriesInBatchRequest);
        e.message = format!(
            "Maximum number of entries per request are {BATCH_ENTRIES_MAX}. You have sent {}.",
            entries.len()
        );
        return Err(e);
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(entries.len());
    for mut e in entries {
        let id = e.str("Id")?;
        if id.is_empty()
            || id.len() > BATCH_ENTRY_ID_LEN_MAX
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(crate::engine::EngineError::InvalidBatchEntryId(id).into());
        }
        if !seen.insert(id.clone()) {
            return Err(crate::engine::EngineError::BatchEntryIdsNotDistinct(id).into());
        }
        out.push((id, e));
    }
    Ok(out)
}

fn failed_entry(id: String, e: &SqsError) -> Out {
    Out::Struct(vec![
        ("Id", "Id", s(id)),
        ("SenderFault", "SenderFault", Out::Bool(e.sender_fault)),
        ("Code", "Code", s(e.code)),
        ("Message", "Message", s(e.message.clone())),
    ])
}

fn batch_result(ok_xml: &'static str, ok: Vec<Out>, failed: Vec<Out>) -> Out {
    Out::Struct(vec![
        ("Successful", ok_xml, Out::List(ok)),
        ("Failed", "BatchResultErrorEntry", Out::List(failed)),
    ])
}

async fn send_message_batch(ctx: &Ctx<'_>, mut p: Params) -> ActionResult {
    let q = ctx.resolve(&mut p)?;
    let entries = batch_entries(&mut p, "SendMessageBatchRequestEntry")?;
    let n = entries.len();
    let mut good = Vec::with_capacity(n);
    let mut system_md5 = BTreeMap::new();
    // Entry-level problems become per-entry failures, in the request's order.
    let mut results: Vec<Option<Result<SentReply, SqsError>>> = Vec::with_capacity(n);
    let mut ids = Vec::with_capacity(n);
    for (id, mut e) in entries {
        ids.push(id.clone());
        match send_request(&mut e) {
            Ok((request, md5)) => {
                fifo_send_rule(&q, &request, true)?;
                if let Some(m) = md5 {
                    system_md5.insert(id.clone(), m);
                }
                good.push(BatchEntry { id, request });
                results.push(None);
            }
            Err(err) => results.push(Some(Err(err))),
        }
    }
    if !good.is_empty() {
        let sent = ctx.shard.send_batch(&q, good).await?;
        let mut sent = sent.into_iter();
        for slot in results.iter_mut().filter(|r| r.is_none()) {
            let (_, r) = sent.next().ok_or_else(|| {
                SqsError::from(crate::error::ServiceError::Internal(
                    "batch result missing".into(),
                ))
            })?;
            *slot = Some(r.map_err(SqsError::from));
        }
    }
    let (mut ok, mut failed) = (Vec::new(), Vec::new());
    for (id, r) in ids.into_iter().zip(results) {
        match r {
            Some(Ok(reply)) => {
                let mut m = vec![("Id", "Id", s(id.clone()))];
                m.extend(sent_members(&reply, system_md5.remove(&id)));
                ok.push(Out::Struct(m));
            }
            Some(Err(e)) => failed.push(failed_entry(id, &e)),
            None => failed.push(failed_entry(
                id,
                &SqsError::from(crate::error::ServiceError::Internal(
                    "batch result missing".into(),
                )),
            )),
        }
    }
    Ok(Some(batch_result(
        "SendMessageBatchResultEntry",
        ok,
        failed,
    )))
}

/// What a receipt handle was used for.
#[derive(Clone, Copy)]
enum HandleUse {
    Delete,
    ChangeVisibility,
}

/// A handle this endpoint issued for this queue (it decodes) that the partition refuses is
/// stale, not malformed: SQS reports that as `InvalidParameterValue` naming the handle —
/// "Message does not exist or is not available for visibility timeout change" for a
/// ChangeMessageVisibility (the message was deleted or received again since), "The receipt
/// handle has expired" for a FIFO queue's DeleteMessage — and keeps `ReceiptHandleIsInvalid`
/// for a handle that is not one at all. Other errors pass unchanged.
fn stale_handle(
    ctx: &Ctx<'_>,
    q: &QueueMeta,
    handle: &str,
    e: SqsError,
    how: HandleUse,
) -> SqsError {
    if e.code != "ReceiptHandleIsInvalid" || ctx.shard.decode_receipt(q, handle).is_err() {
        return e;
    }
    let reason = match how {
        HandleUse::ChangeVisibility => {
            "Message does not exist or is not available for visibility timeout change."
        }
        HandleUse::Delete if q.kind == crate::engine::attributes::QueueKind::Fifo => {
            "The receipt handle has expired."
        }
        HandleUse::Delete => return e,
    };
    SqsError::invalid_value("ReceiptHandle", handle, reason)
}

fn visibility(p: &mut Params) -> Result<Option<u32>, SqsError> {
    p.opt_int_in("VisibilityTimeout", 0, i64::from(VISIBILITY_TIMEOUT_S_MAX))
}

/// DeleteMessageBatch and ChangeMessageVisibilityBatch: one command per partition named
/// (`Shard::delete_message_batch`, `Shard::change_visibility_batch`). An entry that does not
/// parse fails on its own.
async fn handle_batch(ctx: &Ctx<'_>, mut p: Params, change_visibility: bool) -> ActionResult {
    let q = ctx.resolve(&mut p)?;
    let entry = if change_visibility {
        "ChangeMessageVisibilityBatchRequestEntry"
    } else {
        "DeleteMessageBatchRequestEntry"
    };
    let entries = batch_entries(&mut p, entry)?;
    let q = &q;
    // Each entry's handle, to word a stale one's failure as SQS does (`stale_handle`).
    let mut handles: BTreeMap<String, String> = BTreeMap::new();
    let results: Vec<(String, Result<(), SqsError>)> = if change_visibility {
        let parsed = entries
            .into_iter()
            .map(|(id, mut e)| {
                let entry = e.str("ReceiptHandle").and_then(|h| {
                    let t = visibility(&mut e)?
                        .ok_or_else(|| SqsError::missing("VisibilityTimeout"))?;
                    handles.insert(id.clone(), h.clone());
                    Ok((h, t))
                });
                (id, entry)
            })
            .collect();
        run_parsed_entries(parsed, |entries| {
            ctx.shard.change_visibility_batch(q, entries)
        })
        .await
    } else {
        let parsed = entries
            .into_iter()
            .map(|(id, mut e)| {
                let h = e.str("ReceiptHandle");
                if let Ok(h) = &h {
                    handles.insert(id.clone(), h.clone());
                }
                (id, h)
            })
            .collect();
        run_parsed_entries(parsed, |handles| ctx.shard.delete_message_batch(q, handles)).await
    };
    let how = if change_visibility {
        HandleUse::ChangeVisibility
    } else {
        HandleUse::Delete
    };
    let (mut ok, mut failed) = (Vec::new(), Vec::new());
    for (id, r) in results {
        let r = r.map_err(|e| match handles.get(&id) {
            Some(h) => stale_handle(ctx, q, h, e, how),
            None => e,
        });
        match r {
            Ok(()) => ok.push(Out::Struct(vec![("Id", "Id", s(id))])),
            Err(e) => failed.push(failed_entry(id, &e)),
        }
    }
    let xml = if change_visibility {
        "ChangeMessageVisibilityBatchResultEntry"
    } else {
        "DeleteMessageBatchResultEntry"
    };
    Ok(Some(batch_result(xml, ok, failed)))
}

async fn receive_message(ctx: &Ctx<'_>, mut p: Params) -> ActionResult {
    let q = ctx.resolve(&mut p)?;
    let max = p
        .opt_int_in("MaxNumberOfMessages", 1, RECEIVE_MESSAGES_MAX)?
        .unwrap_or(1);
    let vis = visibility(&mut p)?;
    let wait = p
        .opt_int_in("WaitTimeSeconds", 0, i64::from(WAIT_TIME_S_MAX))?
        .unwrap_or(q.parsed.wait_time_s);
    let mut system = p.str_list("AttributeNames")?;
    system.extend(p.str_list("MessageSystemAttributeNames")?);
    let sel =
        AttributeSelection::new(system, p.str_list("MessageAttributeNames")?).map_err(|n| {
            SqsError::new(
                "InvalidAttributeName",
                400,
                format!("Unknown Attribute {n}."),
            )
        })?;
    let attempt_id = p.opt_str("ReceiveRequestAttemptId")?;
    let got = ctx
        .shard
        .receive(
            &q,
            ReceiveRequest {
                max_messages: max,
                visibility_timeout_s: vis,
                attempt_id,
            },
            wait,
        )
        .await?;
    let mut messages = Vec::with_capacity(got.len());
    for d in got {
        messages.push(message_out(ctx, &q, d, &sel));
    }
    if messages.is_empty() {
        return Ok(Some(Out::Struct(Vec::new())));
    }
    Ok(Some(one_xml("Messages", "Message", Out::List(messages))))
}

fn message_out(ctx: &Ctx<'_>, q: &QueueMeta, d: Delivered, sel: &AttributeSelection) -> Out {
    let payload = &d.payload;
    let mut m = vec![
        ("MessageId", "MessageId", s(d.message_id.to_string())),
        (
            "ReceiptHandle",
            "ReceiptHandle",
            s(ctx.shard.receipt_handle(&d.receipt)),
        ),
        ("MD5OfBody", "MD5OfBody", s(payload.md5_body().to_string())),
        ("Body", "Body", Out::Body(payload.clone())),
    ];
    let shown = ctx.shard.render_attributes(q, &d, sel);
    let sys: Vec<(String, Out)> = shown
        .system
        .into_iter()
        .map(|(name, v)| (name.to_string(), s(v)))
        .collect();
    if !sys.is_empty() {
        m.push((
            "Attributes",
            "Attribute",
            Out::Map {
                key_tag: "Name",
                value_tag: "Value",
                entries: sys,
            },
        ));
    }
    let selected = shown.message_attributes;
    if !selected.is_empty() {
        if let Some(md5) = shown.md5_of_message_attributes {
            m.push((
                "MD5OfMessageAttributes",
                "MD5OfMessageAttributes",
                s(md5.to_string()),
            ));
        }
        let entries = selected
            .into_iter()
            .map(|a| {
                let value = match a.value {
                    AttributeValue::String(v) => ("StringValue", "StringValue", s(v)),
                    AttributeValue::Binary(b) => (
                        "BinaryValue",
                        "BinaryValue",
                        s(base64::engine::general_purpose::STANDARD.encode(b)),
                    ),
                };
                (
                    a.name,
                    Out::Struct(vec![value, ("DataType", "DataType", s(a.data_type))]),
                )
            })
            .collect();
        m.push((
            "MessageAttributes",
            "MessageAttribute",
            Out::Map {
                key_tag: "Name",
                value_tag: "Value",
                entries,
            },
        ));
    }
    Out::Struct(m)
}
