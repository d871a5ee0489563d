//! The commands that talk to a broker: queue admin, dead-letter queues, redrive tasks and the
//! data plane, all through the SDK (native protocol over QUIC). Operations the SDK has no
//! method for (DLQ sources, move tasks) go through `Client::call` with the wire's request types.

use crate::output::{exit, print, CliError, Format};
use crate::{
    Conn, DlqCmd, GroupCmd, QueueCmd, ReceiveArgs, RedriveCmd, SendArgs, TailArgs, TopicCmd,
};
use serde_json::{json, Value};
use sluice_sdk::types::{
    AttributeMap, AttributeValue, CancelMessageMoveTaskRequest, ListDeadLetterSourceQueuesRequest,
    ListMessageMoveTasksRequest, ListMessageMoveTasksResultEntry, ListQueueTagsRequest, Message,
    MessageAttributeValue, Request, Response, SendMessageBatchRequestEntry, SendMessageRequest,
    StartMessageMoveTaskRequest,
};
use sluice_sdk::{Client, ClientOptions, ReceiveOptions, Trust};
use sluice_wire::limits::BATCH_ENTRIES_MAX;
use std::collections::BTreeMap;
use std::io::Read;
use std::time::Duration;

/// Largest body read from a file or stdin (SQS's message size limit is 1 MiB; more is refused
/// by the broker anyway, this bounds what the CLI buffers).
pub const INPUT_BYTES_MAX: u64 = 16 * 1024 * 1024;
/// Body bytes per batch request, below the broker's 1 MiB batch limit with room for attributes.
pub const SEND_BATCH_BODY_BYTES_MAX: usize = 768 * 1024;
/// Default certificate of a local broker started with the embedded defaults.
pub const DEFAULT_CA_CERT: &str = "sluice-data/quic-selfsigned-cert.pem";

pub enum Op {
    Queue(QueueCmd),
    Topic(TopicCmd),
    Group(GroupCmd),
    Dlq(DlqCmd),
    Send(SendArgs),
    Receive(ReceiveArgs),
    Delete {
        queue: String,
        receipt_handles: Vec<String>,
    },
}

/// Runs one broker command on a current-thread tokio runtime.
pub fn run(conn: &Conn, format: Format, op: Op) -> Result<i32, CliError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::connection(format!("cannot start the I/O runtime: {e}")))?;
    let (v, code) = rt.block_on(async {
        let client = connect(conn).await?;
        let r = execute(&client, op).await;
        client.close().await;
        r
    })?;
    print(format, &v);
    Ok(code)
}

/// `sluice tail`: prints as it reads (no single result document).
pub fn run_tail(conn: &Conn, format: Format, args: TailArgs) -> Result<i32, CliError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::connection(format!("cannot start the I/O runtime: {e}")))?;
    rt.block_on(async {
        let client = connect(conn).await?;
        let r = crate::streams::tail(&client, format, args).await;
        client.close().await;
        r
    })
}

async fn connect(conn: &Conn) -> Result<Client, CliError> {
    let trust = if conn.insecure {
        Trust::DangerousSkipVerification
    } else {
        let path = conn
            .ca_cert
            .clone()
            .unwrap_or_else(|| DEFAULT_CA_CERT.into());
        if !path.exists() {
            return Err(CliError::usage(format!(
                "no certificate to trust at {}: pass --ca-cert <PEM> (a broker's self-signed \
                 certificate is <data dir>/quic-selfsigned-cert.pem) or --insecure",
                path.display()
            )));
        }
        Trust::PemFile(path)
    };
    let mut options = ClientOptions::new(trust);
    options.server_name = conn.server_name.clone();
    options.connect_timeout = Duration::from_millis(conn.timeout_ms);
    options.request_timeout = Duration::from_millis(conn.timeout_ms);
    options.retries = 1;
    options.client_name = format!("sluice-cli/{}", env!("CARGO_PKG_VERSION"));
    if let (Some(id), Some(secret)) = (&conn.access_key_id, &conn.secret_access_key) {
        options.credentials = Some(sluice_sdk::Credentials::new(id.clone(), secret.0.clone()));
    }
    Ok(Client::connect_cluster(&conn.endpoint, options).await?)
}

/// A queue argument: a URL as is, a name through GetQueueUrl.
async fn resolve(client: &Client, queue: &str) -> Result<String, CliError> {
    if queue.starts_with("http://") || queue.starts_with("https://") {
        return Ok(queue.to_string());
    }
    Ok(client.get_queue_url(queue).await?)
}

fn name_of(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

fn pairs(list: &[String], what: &str) -> Result<BTreeMap<String, String>, CliError> {
    list.iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| CliError::usage(format!("{what} `{kv}`: expected NAME=VALUE")))
        })
        .collect()
}

fn queue_urls(urls: Vec<String>) -> Value {
    Value::Array(
        urls.into_iter()
            .map(|u| json!({"name": name_of(&u), "url": u}))
            .collect(),
    )
}

/// A command's result and its exit code (a batch send can fail in part: results, then 1).
async fn execute(client: &Client, op: Op) -> Result<(Value, i32), CliError> {
    let whole = |v: Value| (v, exit::OK);
    match op {
        Op::Queue(c) => queue(client, c).await.map(whole),
        Op::Topic(c) => crate::streams::topic(client, c).await.map(whole),
        Op::Group(c) => crate::streams::group(client, c).await.map(whole),
        Op::Dlq(c) => dlq(client, c).await,
        Op::Send(a) => send(client, a).await,
        Op::Receive(a) => receive(client, a).await.map(whole),
        Op::Delete {
            queue,
            receipt_handles,
        } => {
            let url = resolve(client, &queue).await?;
            let mut out = Vec::new();
            for h in receipt_handles {
                client.delete(&url, &h).await?;
                out.push(json!({"receipt_handle": h, "result": "deleted"}));
            }
            Ok(whole(Value::Array(out)))
        }
    }
}

async fn queue(client: &Client, c: QueueCmd) -> Result<Value, CliError> {
    match c {
        QueueCmd::Create {
            mut name,
            fifo,
            attributes,
            tags,
        } => {
            let mut attrs: AttributeMap = pairs(&attributes, "attribute")?;
            if fifo && !name.ends_with(".fifo") {
                name.push_str(".fifo");
            }
            if name.ends_with(".fifo") {
                attrs
                    .entry("FifoQueue".into())
                    .or_insert_with(|| "true".into());
            }
            let url = client
                .create_queue_with(&name, attrs, pairs(&tags, "tag")?)
                .await?;
            Ok(json!({"name": name, "url": url}))
        }
        QueueCmd::List { prefix } => Ok(queue_urls(client.list_queues(&prefix).await?)),
        QueueCmd::Describe { queue } => {
            let url = resolve(client, &queue).await?;
            let attrs = client.get_queue_attributes(&url, &["All"]).await?;
            let mut m = serde_json::Map::new();
            m.insert("QueueUrl".into(), Value::String(url.clone()));
            for (k, v) in attrs {
                m.insert(k, Value::String(v));
            }
            let r = ListQueueTagsRequest { queue_url: url };
            if let Response::ListQueueTags(t) = client.call(Request::ListQueueTags(r)).await? {
                m.insert("Tags".into(), json!(t.tags));
            }
            Ok(Value::Object(m))
        }
        QueueCmd::Update { queue, attributes } => {
            let url = resolve(client, &queue).await?;
            let attrs = pairs(&attributes, "attribute")?;
            client.set_queue_attributes(&url, attrs.clone()).await?;
            Ok(json!({"url": url, "updated": attrs}))
        }
        QueueCmd::Purge { queue } => {
            let url = resolve(client, &queue).await?;
            client.purge_queue(&url).await?;
            Ok(json!({"url": url, "result": "purged"}))
        }
        QueueCmd::Delete { queue } => {
            let url = resolve(client, &queue).await?;
            client.delete_queue(&url).await?;
            Ok(json!({"url": url, "result": "deleted"}))
        }
    }
}

async fn arn(client: &Client, url: &str) -> Result<String, CliError> {
    client
        .get_queue_attributes(url, &["QueueArn"])
        .await?
        .remove("QueueArn")
        .ok_or_else(|| CliError::server(format!("{url}: the broker did not say its QueueArn")))
}

async fn dlq(client: &Client, c: DlqCmd) -> Result<(Value, i32), CliError> {
    match c {
        DlqCmd::Sources { queue } => {
            let url = resolve(client, &queue).await?;
            let mut urls = Vec::new();
            let mut next_token = None;
            loop {
                let r = ListDeadLetterSourceQueuesRequest {
                    queue_url: url.clone(),
                    next_token: next_token.take(),
                    max_results: Some(1000),
                };
                match client.call(Request::ListDeadLetterSourceQueues(r)).await? {
                    Response::ListDeadLetterSourceQueues(r) => {
                        urls.extend(r.queue_urls);
                        match r.next_token {
                            Some(t) => next_token = Some(t),
                            None => break,
                        }
                    }
                    other => return Err(CliError::server(format!("unexpected answer {other:?}"))),
                }
            }
            Ok((queue_urls(urls), exit::OK))
        }
        DlqCmd::Peek { queue, max } => {
            let url = resolve(client, &queue).await?;
            let options = ReceiveOptions {
                max_messages: Some(max),
                wait_time_seconds: Some(0),
                visibility_timeout: Some(0),
                system_attribute_names: vec!["All".into()],
                message_attribute_names: vec!["All".into()],
            };
            let got = client.receive(&url, options).await?;
            Ok((Value::Array(got.iter().map(message).collect()), exit::OK))
        }
        DlqCmd::Redrive(r) => redrive(client, r).await,
    }
}

/// How often `redrive start --wait` looks at the task.
pub const REDRIVE_POLL_MS: u64 = 200;

fn task_json(t: ListMessageMoveTasksResultEntry) -> Value {
    json!({
        "task_handle": t.task_handle,
        "status": format!("{:?}", t.status).to_uppercase(),
        "source_arn": t.source_arn,
        "destination_arn": t.destination_arn,
        "rate": t.max_number_of_messages_per_second,
        "moved": t.approximate_number_of_messages_moved,
        "to_move": t.approximate_number_of_messages_to_move,
        "failure_reason": t.failure_reason,
        "started_ms": t.started_timestamp,
    })
}

/// The most recent move tasks of a source queue, newest first.
async fn list_tasks(client: &Client, source_arn: &str, max: u32) -> Result<Vec<Value>, CliError> {
    let r = ListMessageMoveTasksRequest {
        source_arn: source_arn.to_string(),
        max_results: Some(max),
    };
    match client.call(Request::ListMessageMoveTasks(r)).await? {
        Response::ListMessageMoveTasks(r) => Ok(r.results.into_iter().map(task_json).collect()),
        other => Err(CliError::server(format!("unexpected answer {other:?}"))),
    }
}

/// `redrive start --wait`: polls the newest task of the source until it ends; progress on a
/// terminal's stderr. A task that failed or was cancelled exits 1.
async fn wait_for_task(client: &Client, source_arn: &str) -> Result<(Value, i32), CliError> {
    use std::io::IsTerminal;
    let progress = std::io::stderr().is_terminal();
    loop {
        let tasks = list_tasks(client, source_arn, 1).await?;
        let Some(t) = tasks.into_iter().next() else {
            return Err(CliError::server(
                "the task vanished from ListMessageMoveTasks",
            ));
        };
        let status = t["status"].as_str().unwrap_or("").to_string();
        if progress {
            eprint!(
                "\rredrive {status}: {} of {} moved",
                t["moved"], t["to_move"]
            );
        }
        if status != "RUNNING" && status != "CANCELLING" {
            if progress {
                eprintln!();
            }
            let code = if status == "COMPLETED" {
                exit::OK
            } else {
                exit::SERVER
            };
            return Ok((t, code));
        }
        tokio::time::sleep(Duration::from_millis(REDRIVE_POLL_MS)).await;
    }
}

async fn redrive(client: &Client, c: RedriveCmd) -> Result<(Value, i32), CliError> {
    let unexpected = |r: Response| CliError::server(format!("unexpected answer {r:?}"));
    match c {
        RedriveCmd::Start {
            queue,
            to,
            rate,
            wait,
        } => {
            let source_arn = arn(client, &resolve(client, &queue).await?).await?;
            let destination_arn = match to {
                Some(to) => Some(arn(client, &resolve(client, &to).await?).await?),
                None => None,
            };
            let r = StartMessageMoveTaskRequest {
                source_arn: source_arn.clone(),
                destination_arn,
                max_number_of_messages_per_second: rate,
            };
            let handle = match client.call(Request::StartMessageMoveTask(r)).await? {
                Response::StartMessageMoveTask(r) => r.task_handle,
                other => return Err(unexpected(other)),
            };
            if wait {
                let (mut t, code) = wait_for_task(client, &source_arn).await?;
                t["task_handle"] = Value::String(handle);
                return Ok((t, code));
            }
            Ok((
                json!({"source_arn": source_arn, "task_handle": handle}),
                exit::OK,
            ))
        }
        RedriveCmd::List { queue, max } => {
            let source_arn = arn(client, &resolve(client, &queue).await?).await?;
            Ok((
                Value::Array(list_tasks(client, &source_arn, max).await?),
                exit::OK,
            ))
        }
        RedriveCmd::Cancel { task_handle } => {
            let r = CancelMessageMoveTaskRequest {
                task_handle: task_handle.clone(),
            };
            match client.call(Request::CancelMessageMoveTask(r)).await? {
                Response::CancelMessageMoveTask(r) => Ok((
                    json!({
                        "task_handle": task_handle,
                        "messages_moved": r.approximate_number_of_messages_moved,
                    }),
                    exit::OK,
                )),
                other => Err(unexpected(other)),
            }
        }
    }
}

pub(crate) fn read_input(file: Option<&std::path::Path>) -> Result<String, CliError> {
    let mut buf = Vec::new();
    let what = match file {
        Some(p) if p.as_os_str() != "-" => {
            std::fs::File::open(p)
                .and_then(|f| f.take(INPUT_BYTES_MAX).read_to_end(&mut buf))
                .map_err(|e| CliError::usage(format!("{}: {e}", p.display())))?;
            p.display().to_string()
        }
        _ => {
            std::io::stdin()
                .take(INPUT_BYTES_MAX)
                .read_to_end(&mut buf)
                .map_err(|e| CliError::usage(format!("stdin: {e}")))?;
            "stdin".to_string()
        }
    };
    String::from_utf8(buf).map_err(|_| CliError::usage(format!("{what}: not UTF-8 text")))
}

async fn send(client: &Client, a: SendArgs) -> Result<(Value, i32), CliError> {
    let bodies: Vec<String> = if !a.bodies.is_empty() {
        a.bodies.clone()
    } else {
        let text = read_input(a.file.as_deref())?;
        if a.lines {
            text.lines()
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect()
        } else {
            // `echo body | sluice send q` means "body": one trailing newline is not content.
            let body = text.strip_suffix('\n').unwrap_or(&text);
            vec![body.strip_suffix('\r').unwrap_or(body).to_string()]
        }
    };
    let mut attributes = BTreeMap::new();
    for kv in &a.attributes {
        let (k, v) = kv.split_once('=').ok_or_else(|| {
            CliError::usage(format!("attribute `{kv}`: expected NAME[:TYPE]=VALUE"))
        })?;
        let (name, data_type) = k.split_once(':').unwrap_or((k, "String"));
        attributes.insert(
            name.to_string(),
            MessageAttributeValue {
                data_type: data_type.to_string(),
                value: AttributeValue::String(v.to_string()),
            },
        );
    }
    let url = resolve(client, &a.queue).await?;
    let attrs = |attributes: &BTreeMap<String, MessageAttributeValue>| {
        attributes
            .iter()
            .map(|(k, v)| {
                let value = match &v.value {
                    AttributeValue::String(s) => AttributeValue::String(s.clone()),
                    AttributeValue::Binary(b) => AttributeValue::Binary(b.clone()),
                };
                let data_type = v.data_type.clone();
                (k.clone(), MessageAttributeValue { data_type, value })
            })
            .collect::<BTreeMap<_, _>>()
    };
    if bodies.len() == 1 {
        let r = client
            .send_message(SendMessageRequest {
                queue_url: url.clone(),
                message_body: bodies.into_iter().next().expect("one body"),
                delay_seconds: a.delay,
                message_attributes: attrs(&attributes),
                message_system_attributes: BTreeMap::new(),
                message_deduplication_id: a.dedup_id.clone(),
                message_group_id: a.group.clone(),
            })
            .await?;
        let v = json!([{
            "message_id": r.message_id,
            "md5_of_body": r.md5_of_message_body,
            "sequence_number": r.sequence_number,
        }]);
        return Ok((v, exit::OK));
    }
    // Many messages: SendMessageBatch, up to 10 entries and SEND_BATCH_BODY_BYTES_MAX of
    // bodies per request; entries fail one by one and are reported in place.
    let total = bodies.len();
    let mut out: Vec<Value> = Vec::with_capacity(total);
    let mut failed = 0;
    let mut i = 0;
    while i < total {
        let mut end = i;
        let mut bytes = 0;
        while end < total
            && end - i < BATCH_ENTRIES_MAX
            && (end == i || bytes + bodies[end].len() <= SEND_BATCH_BODY_BYTES_MAX)
        {
            bytes += bodies[end].len();
            end += 1;
        }
        let entries = (i..end)
            .map(|n| SendMessageBatchRequestEntry {
                id: format!("m{n}"),
                message_body: bodies[n].clone(),
                delay_seconds: a.delay,
                message_attributes: attrs(&attributes),
                message_system_attributes: BTreeMap::new(),
                message_deduplication_id: a.dedup_id.clone(),
                message_group_id: a.group.clone(),
            })
            .collect();
        let r = client.send_batch(&url, entries).await?;
        for n in i..end {
            let id = format!("m{n}");
            if let Some(ok) = r.successful.iter().find(|e| e.id == id) {
                out.push(json!({
                    "message_id": ok.message_id,
                    "md5_of_body": ok.md5_of_message_body,
                    "sequence_number": ok.sequence_number,
                }));
            } else {
                failed += 1;
                let e = r.failed.iter().find(|e| e.id == id);
                out.push(json!({
                    "error": e.map(|e| format!(
                        "{}: {}",
                        sluice_sdk::ErrorCode::from_u16(e.code).as_sqs_code(),
                        e.message.as_deref().unwrap_or("")
                    )).unwrap_or_else(|| "no answer for this entry".into()),
                }));
            }
        }
        i = end;
    }
    if failed > 0 {
        eprintln!("sluice: {failed} of {total} messages were not sent");
    }
    Ok((
        Value::Array(out),
        if failed > 0 { exit::SERVER } else { exit::OK },
    ))
}

fn message(m: &Message) -> Value {
    let attrs: serde_json::Map<String, Value> = m
        .message_attributes
        .iter()
        .map(|(k, v)| {
            let value = match &v.value {
                AttributeValue::String(s) => Value::String(s.clone()),
                AttributeValue::Binary(b) => json!(b),
            };
            (k.clone(), value)
        })
        .collect();
    json!({
        "message_id": m.message_id,
        "body": m.body,
        "receive_count": m.attributes.get("ApproximateReceiveCount"),
        "sent_timestamp": m.attributes.get("SentTimestamp"),
        "group": m.attributes.get("MessageGroupId"),
        "attributes": attrs,
        "receipt_handle": m.receipt_handle,
    })
}

async fn receive(client: &Client, a: ReceiveArgs) -> Result<Value, CliError> {
    let url = resolve(client, &a.queue).await?;
    let options = ReceiveOptions {
        max_messages: Some(a.max),
        wait_time_seconds: Some(a.wait),
        visibility_timeout: a.visibility,
        system_attribute_names: vec!["All".into()],
        message_attribute_names: vec!["All".into()],
    };
    let got = client.receive(&url, options).await?;
    let mut out = Vec::new();
    for m in &got {
        let mut v = message(m);
        if a.delete {
            client.delete(&url, &m.receipt_handle).await?;
            v["deleted"] = Value::Bool(true);
        }
        out.push(v);
    }
    Ok(Value::Array(out))
}
