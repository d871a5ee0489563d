//! The SQS HTTP API over real sockets, with a tiny std `TcpStream` client: both protocols, every
//! kind of malformed request (each gets its SQS error and status, never a 500 or a hang),
//! keep-alive and pipelining, size and time limits, and SigV4 rejections.

// A test is the broker's outside world: it times the broker with its own clocks (deadlines,
// waits, latencies). broker/clippy.toml's clock seam governs the broker's code, not this.
#![allow(clippy::disallowed_methods)]

use sluice_broker::config::BrokerConfig;
use sluice_broker::server::{self, BrokerHandle};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// glommio registers locked memory per executor: one broker at a time in this binary.
static ONE_BROKER: Mutex<()> = Mutex::new(());
/// Every socket read in these tests gives up after this: a hang is a failure, not a stall.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

fn start(dir: &Path, env: &[(&str, &str)]) -> (BrokerHandle, u16) {
    start_with(dir, env, |_| {})
}

fn start_with(
    dir: &Path,
    env: &[(&str, &str)],
    tune: impl FnOnce(&mut BrokerConfig),
) -> (BrokerHandle, u16) {
    for (k, v) in env {
        std::env::set_var(k, v);
    }
    let mut c = BrokerConfig::ephemeral(dir.to_path_buf()).expect("config");
    c.shards = 2;
    c.default_partitions = 2;
    c.http_addr = "127.0.0.1:0".parse().expect("addr");
    c.quic_addr = "127.0.0.1:0".parse().expect("addr");
    // As sluiced does: authentication from SLUICE_AUTH / SLUICE_ACCESS_KEYS.
    c.auth = sluice_broker::auth::AuthConfig::from_env().expect("auth settings");
    tune(&mut c);
    let b = server::start(c).expect("start");
    b.wait_ready().expect("ready");
    let port = b.http_addr().port();
    assert_ne!(port, 0, "port 0 is resolved at start");
    // Every shard binds its listener as it starts serving: wait until connections are accepted.
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "HTTP API did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    (b, port)
}

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(READ_TIMEOUT)).expect("timeout");
    s
}

/// Reads one response (Content-Length framed, as the server always sends).
fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> Resp {
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).expect("read (a timeout here is a hang)");
        assert!(
            n > 0,
            "connection closed before a response: {:?}",
            String::from_utf8_lossy(buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).expect("ascii head");
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse().expect("length"))
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let mut chunk = [0u8; 65536];
        let n = s.read(&mut chunk).expect("read body");
        assert!(n > 0, "connection closed mid-body");
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8(buf[head_end..head_end + len].to_vec()).expect("utf8 body");
    buf.drain(..head_end + len);
    Resp {
        status,
        headers,
        body,
    }
}

fn raw(port: u16, bytes: &[u8]) -> Resp {
    let mut s = connect(port);
    s.write_all(bytes).expect("write");
    read_response(&mut s, &mut Vec::new())
}

fn json_req(action: &str, body: &str) -> Vec<u8> {
    format!(
        "POST / HTTP/1.1\r\nHost: localhost\r\nX-Amz-Target: AmazonSQS.{action}\r\n\
         Content-Type: application/x-amz-json-1.0\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn json(port: u16, action: &str, body: &str) -> Resp {
    raw(port, &json_req(action, body))
}

fn query(port: u16, form: &str) -> Resp {
    raw(
        port,
        format!(
            "POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-www-form-urlencoded\r\n\
             Content-Length: {}\r\n\r\n{form}",
            form.len()
        )
        .as_bytes(),
    )
}

/// Asserts an AWS JSON error: status, legacy code in `x-amzn-query-error`, shape in `__type`.
fn assert_json_error(r: &Resp, status: u16, code: &str, shape: &str) {
    assert_eq!(r.status, status, "{code}: {}", r.body);
    assert_eq!(
        r.header("x-amzn-query-error"),
        Some(format!("{code};Sender").as_str()),
        "{}",
        r.body
    );
    let v = r.json();
    assert_eq!(
        v["__type"],
        format!("com.amazonaws.sqs#{shape}"),
        "{}",
        r.body
    );
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
}

fn assert_xml_error(r: &Resp, status: u16, code: &str) {
    assert_eq!(r.status, status, "{}", r.body);
    assert!(r.body.contains("<ErrorResponse"), "{}", r.body);
    assert!(
        r.body.contains(&format!("<Code>{code}</Code>")),
        "{}",
        r.body
    );
    assert!(r.body.contains("<RequestId>"), "{}", r.body);
}

const Q: &str = "http://localhost/000000000000/errs";

#[test]
fn json_protocol_errors_have_their_sqs_codes_and_statuses() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let (b, port) = start(tmp.path(), &[("SLUICE_AUTH", "none")]);
    let r = json(port, "CreateQueue", r#"{"QueueName":"errs"}"#);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["QueueUrl"], "http://localhost/000000000000/errs");

    let cases: Vec<(&str, String, u16, &str, &str)> = vec![
        (
            "Frobnicate",
            "{}".into(),
            400,
            "UnknownOperationException",
            "UnknownOperationException",
        ),
        (
            "CreateQueue",
            "{not json".into(),
            400,
            "SerializationException",
            "SerializationException",
        ),
        (
            "CreateQueue",
            "[1,2]".into(),
            400,
            "SerializationException",
            "SerializationException",
        ),
        (
            "CreateQueue",
            "{}".into(),
            400,
            "MissingParameter",
            "MissingRequiredParameterException",
        ),
        (
            "CreateQueue",
            r#"{"QueueName":5}"#.into(),
            400,
            "InvalidParameterValue",
            "InvalidParameterValueException",
        ),
        (
            "CreateQueue",
            r#"{"QueueName":"bad name"}"#.into(),
            400,
            "InvalidParameterValue",
            "InvalidParameterValueException",
        ),
        (
            "CreateQueue",
            r#"{"QueueName":"errs2","Attributes":{"Bogus":"1"}}"#.into(),
            400,
            "InvalidAttributeName",
            "InvalidAttributeName",
        ),
        (
            "CreateQueue",
            r#"{"QueueName":"errs3","Attributes":{"VisibilityTimeout":"99999"}}"#.into(),
            400,
            "InvalidAttributeValue",
            "InvalidAttributeValue",
        ),
        (
            "CreateQueue",
            r#"{"QueueName":"errs","Attributes":{"VisibilityTimeout":"5"}}"#.into(),
            400,
            "QueueAlreadyExists",
            "QueueNameExists",
        ),
        (
            "GetQueueUrl",
            r#"{"QueueName":"nope"}"#.into(),
            400,
            "AWS.SimpleQueueService.NonExistentQueue",
            "QueueDoesNotExist",
        ),
        (
            "SendMessage",
            r#"{"QueueUrl":"http://localhost/000000000000/nope","MessageBody":"x"}"#.into(),
            400,
            "AWS.SimpleQueueService.NonExistentQueue",
            "QueueDoesNotExist",
        ),
        (
            "SendMessage",
            r#"{"QueueUrl":"garbage","MessageBody":"x"}"#.into(),
            404,
            "InvalidAddress",
            "InvalidAddress",
        ),
        (
            "SendMessage",
            r#"{"QueueUrl":"http://h/a/b/c","MessageBody":"x"}"#.into(),
            404,
            "InvalidAddress",
            "InvalidAddress",
        ),
        (
            "SendMessage",
            format!(r#"{{"QueueUrl":"{Q}"}}"#),
            400,
            "MissingParameter",
            "MissingRequiredParameterException",
        ),
        (
            "SendMessage",
            r#"{"MessageBody":"x"}"#.into(),
            400,
            "MissingParameter",
            "MissingRequiredParameterException",
        ),
        (
            "SendMessage",
            format!(r#"{{"QueueUrl":"{Q}","MessageBody":"a\u0001b"}}"#),
            400,
            "InvalidMessageContents",
            "InvalidMessageContents",
        ),
        (
            "SendMessage",
            format!(r#"{{"QueueUrl":"{Q}","MessageBody":"x","DelaySeconds":901}}"#),
            400,
            "InvalidParameterValue",
            "InvalidParameterValueException",
        ),
        (
            "SendMessage",
            format!(r#"{{"QueueUrl":"{Q}","MessageBody":"x","DelaySeconds":"5"}}"#),
            400,
            "InvalidParameterValue",
            "InvalidParameterValueException",
        ),
        (
            "SendMessage",
            format!(
                r#"{{"QueueUrl":"{Q}","MessageBody":"x","MessageAttributes":{{"a":{{"DataType":"Number","StringValue":"abc"}}}}}}"#
            ),
            400,
            "InvalidParameterValue",
            "InvalidParameterValueException",
        ),
        (
            "SendMessage",
            format!(
                r#"{{"QueueUrl":"{Q}","MessageBody":"x","MessageAttributes":{{"a":{{"StringValue":"v"}}}}}}"#
            ),
            400,
            "InvalidParameterValue",
            "InvalidParameterValueException",
        ),
        (
            "SendMessageBatch",
            format!(r#"{{"QueueUrl":"{Q}","Entries":[]}}"#),
            400,
            "AWS.SimpleQueueService.EmptyBatchRequest",
            "EmptyBatchRequest",
        ),
        (
            "SendMessageBatch",
            format!(
                r#"{{"QueueUrl":"{Q}","Entries":[{}]}}"#,
                (0..11)
                    .map(|i| format!(r#"{{"Id":"m{i}","MessageBody":"x"}}"#))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            400,
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
            "TooManyEntriesInBatchRequest",
        ),
        (
            "SendMessageBatch",
            format!(
                r#"{{"QueueUrl":"{Q}","Entries":[{{"Id":"a","MessageBody":"x"}},{{"Id":"a","MessageBody":"y"}}]}}"#
            ),
            400,
            "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
            "BatchEntryIdsNotDistinct",
        ),
        (
            "DeleteMessageBatch",
            format!(r#"{{"QueueUrl":"{Q}","Entries":[{{"Id":"no spaces","ReceiptHandle":"x"}}]}}"#),
            400,
            "AWS.SimpleQueueService.InvalidBatchEntryId",
            "InvalidBatchEntryId",
        ),
        (
            "DeleteMessage",
            format!(r#"{{"QueueUrl":"{Q}","ReceiptHandle":"forged"}}"#),
            404,
            "ReceiptHandleIsInvalid",
            "ReceiptHandleIsInvalid",
        ),
        (
            "ChangeMessageVisibility",
            format!(r#"{{"QueueUrl":"{Q}","ReceiptHandle":"forged","VisibilityTimeout":50000}}"#),
            400,
            "InvalidParameterValue",
            "InvalidParameterValueException",
        ),
        (
            "ReceiveMessage",
            format!(r#"{{"QueueUrl":"{Q}","MaxNumberOfMessages":11}}"#),
            400,
            "InvalidParameterValue",
            "InvalidParameterValueException",
        ),
        (
            "ReceiveMessage",
            format!(r#"{{"QueueUrl":"{Q}","WaitTimeSeconds":21}}"#),
            400,
            "InvalidParameterValue",
            "InvalidParameterValueException",
        ),
        (
            "GetQueueAttributes",
            format!(r#"{{"QueueUrl":"{Q}","AttributeNames":["Nope"]}}"#),
            400,
            "InvalidAttributeName",
            "InvalidAttributeName",
        ),
        (
            "AddPermission",
            format!(r#"{{"QueueUrl":"{Q}","Label":"l","AWSAccountIds":["1"],"Actions":["*"]}}"#),
            400,
            "AWS.SimpleQueueService.UnsupportedOperation",
            "UnsupportedOperation",
        ),
        (
            "RemovePermission",
            format!(r#"{{"QueueUrl":"{Q}","Label":"l"}}"#),
            400,
            "AWS.SimpleQueueService.UnsupportedOperation",
            "UnsupportedOperation",
        ),
        (
            // A queue that is nobody's dead-letter queue is no move source.
            "StartMessageMoveTask",
            r#"{"SourceArn":"arn:aws:sqs:us-east-1:000000000000:errs"}"#.into(),
            400,
            "InvalidParameterValue",
            "InvalidParameterValueException",
        ),
        (
            "CancelMessageMoveTask",
            r#"{"TaskHandle":"not-a-handle"}"#.into(),
            404,
            "ResourceNotFoundException",
            "ResourceNotFoundException",
        ),
        (
            "ListMessageMoveTasks",
            r#"{"SourceArn":"arn:aws:sqs:us-east-1:000000000000:missing"}"#.into(),
            404,
            "ResourceNotFoundException",
            "ResourceNotFoundException",
        ),
    ];
    for (action, body, status, code, shape) in &cases {
        let r = json(port, action, body);
        assert_json_error(&r, *status, code, shape);
    }
    // Unknown members are ignored, as AWS JSON services do for newer SDKs' fields.
    let r = json(
        port,
        "GetQueueUrl",
        r#"{"QueueName":"errs","SomethingNew":1}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // No 500 anywhere above; and the broker still answers.
    let r = json(port, "ListQueues", "{}");
    assert_eq!(r.status, 200);
    b.shutdown();
}

#[test]
fn query_protocol_round_trip_and_errors() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let (b, port) = start(tmp.path(), &[("SLUICE_AUTH", "none")]);
    let r = query(port, "Action=CreateQueue&QueueName=qq&Attribute.1.Name=VisibilityTimeout&Attribute.1.Value=40&Version=2012-11-05");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r
        .body
        .contains("<CreateQueueResponse xmlns=\"https://queue.amazonaws.com/doc/2012-11-05/\">"));
    assert!(
        r.body
            .contains("<QueueUrl>http://localhost/000000000000/qq</QueueUrl>"),
        "{}",
        r.body
    );
    assert_eq!(r.header("content-type"), Some("text/xml"));
    // A body with CR LF and markup, and an attribute: MD5s are the well-known SQS values.
    let r = query(
        port,
        "Action=SendMessage&QueueUrl=http%3A%2F%2Flocalhost%2F000000000000%2Fqq&MessageBody=a%3Cb%3E%0D%0A&\
         MessageAttribute.1.Name=k&MessageAttribute.1.Value.DataType=String&MessageAttribute.1.Value.StringValue=v",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("<MD5OfMessageBody>"), "{}", r.body);
    // POST /<account>/<queue> names the queue without QueueUrl.
    let form = "Action=ReceiveMessage&MessageAttributeName.1=All&AttributeName.1=All&MaxNumberOfMessages=10";
    let r = raw(
        port,
        format!(
            "POST /000000000000/qq HTTP/1.1\r\nHost: localhost\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
            form.len()
        )
        .as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.body.contains("<Body>a&lt;b&gt;&#xD;\n</Body>"),
        "{}",
        r.body
    );
    assert!(r.body.contains("<MessageAttribute><Name>k</Name><Value><StringValue>v</StringValue><DataType>String</DataType></Value></MessageAttribute>"), "{}", r.body);
    assert!(
        r.body.contains(
            "<Attribute><Name>ApproximateReceiveCount</Name><Value>1</Value></Attribute>"
        ),
        "{}",
        r.body
    );
    // GET with the parameters in the URL works too.
    let r = raw(
        port,
        b"GET /?Action=ListQueues&QueueNamePrefix=q HTTP/1.1\r\nHost: localhost\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.body
            .contains("<QueueUrl>http://localhost/000000000000/qq</QueueUrl>"),
        "{}",
        r.body
    );

    assert_xml_error(&query(port, "QueueName=x"), 400, "MissingAction");
    assert_xml_error(&query(port, "Action=Frobnicate"), 400, "InvalidAction");
    assert_xml_error(
        &query(port, "Action=GetQueueUrl&QueueName=none"),
        400,
        "AWS.SimpleQueueService.NonExistentQueue",
    );
    assert_xml_error(
        &query(
            port,
            "Action=GetQueueAttributes&QueueUrl=/000000000000/qq&AttributeName.x=All",
        ),
        400,
        "InvalidParameterValue",
    );
    assert_xml_error(
        &query(
            port,
            "Action=ReceiveMessage&QueueUrl=/000000000000/qq&MaxNumberOfMessages=ten",
        ),
        400,
        "InvalidParameterValue",
    );
    assert_xml_error(
        &query(
            port,
            "Action=CreateQueue&QueueName=z&Attribute.1.Name=DelaySeconds",
        ),
        400,
        "MissingParameter",
    );
    assert_xml_error(
        &query(port, "Action=DeleteMessageBatch&QueueUrl=/000000000000/qq"),
        400,
        "AWS.SimpleQueueService.EmptyBatchRequest",
    );
    let r = query(port, "Action=ListQueues&%ZZ=%");
    assert!(r.status < 500, "{}", r.body);
    // A JSON body without a target is neither protocol.
    let r = raw(port, b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}");
    assert_xml_error(&r, 400, "InvalidAction");
    b.shutdown();
}

#[test]
fn limits_keep_alive_pipelining_and_no_hangs() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let (b, port) = start(
        tmp.path(),
        &[
            ("SLUICE_AUTH", "none"),
            ("SLUICE_HTTP_HEADER_TIMEOUT_MS", "1000"),
            ("SLUICE_HTTP_BODY_TIMEOUT_MS", "1000"),
        ],
    );
    assert_eq!(
        json(port, "CreateQueue", r#"{"QueueName":"lim"}"#).status,
        200
    );

    // Keep-alive and pipelining: three requests in one write, three answers in order.
    let mut s = connect(port);
    let mut batch = Vec::new();
    batch.extend(json_req("GetQueueUrl", r#"{"QueueName":"lim"}"#));
    batch.extend(json_req("GetQueueUrl", r#"{"QueueName":"missing"}"#));
    batch.extend(json_req("ListQueues", "{}"));
    s.write_all(&batch).expect("write");
    let mut buf = Vec::new();
    assert_eq!(read_response(&mut s, &mut buf).status, 200);
    assert_eq!(read_response(&mut s, &mut buf).status, 400);
    let third = read_response(&mut s, &mut buf);
    assert_eq!(third.status, 200);
    assert!(third.body.contains("lim"));

    // A declared body over the limit is refused before it is sent.
    let r = raw(
        port,
        b"POST / HTTP/1.1\r\nHost: localhost\r\nX-Amz-Target: AmazonSQS.SendMessageBatch\r\nContent-Length: 3145728\r\n\r\n",
    );
    assert_json_error(
        &r,
        400,
        "AWS.SimpleQueueService.BatchRequestTooLong",
        "BatchRequestTooLong",
    );
    assert_eq!(r.header("connection"), Some("close"));
    let r = raw(
        port,
        b"POST / HTTP/1.1\r\nHost: localhost\r\nX-Amz-Target: AmazonSQS.SendMessage\r\nContent-Length: 3145728\r\n\r\n",
    );
    assert_json_error(
        &r,
        400,
        "InvalidParameterValue",
        "InvalidParameterValueException",
    );
    // A chunked body that grows past the limit is cut off while it streams.
    let mut s = connect(port);
    s.write_all(b"POST / HTTP/1.1\r\nHost: localhost\r\nX-Amz-Target: AmazonSQS.SendMessage\r\nTransfer-Encoding: chunked\r\n\r\n")
        .expect("write");
    let chunk = vec![b'a'; 256 * 1024];
    let mut sent = 0;
    while sent <= 3 * 1024 * 1024 {
        if s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .is_err()
            || s.write_all(&chunk).is_err()
            || s.write_all(b"\r\n").is_err()
        {
            break; // the server answered and closed
        }
        sent += chunk.len();
    }
    let r = read_response(&mut s, &mut Vec::new());
    assert_json_error(
        &r,
        400,
        "InvalidParameterValue",
        "InvalidParameterValueException",
    );

    // A body in several chunks (the frames are joined) and one in a single read (taken as it
    // came) are the same request.
    let body = r#"{"QueueUrl":"http://h/000000000000/lim","MessageBody":"in three chunks"}"#;
    let mut s = connect(port);
    s.write_all(b"POST / HTTP/1.1\r\nHost: localhost\r\nX-Amz-Target: AmazonSQS.SendMessage\r\nTransfer-Encoding: chunked\r\n\r\n")
        .expect("write");
    let thirds = [&body[..20], &body[20..40], &body[40..]];
    for part in thirds {
        s.write_all(format!("{:x}\r\n{part}\r\n", part.len()).as_bytes())
            .expect("write");
        s.flush().expect("flush");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    s.write_all(b"0\r\n\r\n").expect("write");
    let r = read_response(&mut s, &mut Vec::new());
    assert_eq!(r.status, 200, "{}", r.body);
    let r = json(
        port,
        "ReceiveMessage",
        r#"{"QueueUrl":"http://h/000000000000/lim","MaxNumberOfMessages":10}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("in three chunks"), "{}", r.body);

    // A message over 1 MiB inside a body under the limit: the SQS message-size error.
    let big = "x".repeat(1_048_577);
    let r = json(
        port,
        "SendMessage",
        &format!(r#"{{"QueueUrl":"http://h/000000000000/lim","MessageBody":"{big}"}}"#),
    );
    assert_json_error(
        &r,
        400,
        "InvalidParameterValue",
        "InvalidParameterValueException",
    );
    // Exactly 1 MiB is accepted.
    let ok = "y".repeat(1_048_576);
    let r = json(
        port,
        "SendMessage",
        &format!(r#"{{"QueueUrl":"http://h/000000000000/lim","MessageBody":"{ok}"}}"#),
    );
    assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(300)]);

    // A body that stops arriving: RequestTimeout after the body timeout, not a hang.
    let t = Instant::now();
    let r = raw(
        port,
        b"POST / HTTP/1.1\r\nHost: localhost\r\nX-Amz-Target: AmazonSQS.ListQueues\r\nContent-Length: 100\r\n\r\n{\"a",
    );
    assert_json_error(&r, 400, "RequestTimeout", "RequestTimeout");
    assert!(t.elapsed() < Duration::from_secs(5));

    // A head that stops arriving (and an idle keep-alive connection): closed after the header
    // timeout.
    for partial in [&b"POST / HTTP/1.1\r\nHost: localhost\r\n"[..], &b""[..]] {
        let mut s = connect(port);
        s.write_all(partial).expect("write");
        let t = Instant::now();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest); // EOF (or a 408) once the server gives up
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "slow head not cut off"
        );
    }

    // Garbage is a 4xx from the HTTP layer, never a 500.
    let mut s = connect(port);
    s.write_all(b"\x16\x03\x01\x02\x00 not http at all\r\n\r\n")
        .expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    assert!(text.is_empty() || text.starts_with("HTTP/1.1 4"), "{text}");
    // Oversized head.
    let mut s = connect(port);
    let long = format!(
        "GET / HTTP/1.1\r\nHost: localhost\r\nX-Long: {}\r\n\r\n",
        "a".repeat(100_000)
    );
    let _ = s.write_all(long.as_bytes());
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    assert!(text.is_empty() || text.starts_with("HTTP/1.1 4"), "{text}");

    // A receive with a wait returns at once when messages are there.
    let t = Instant::now();
    let r = json(
        port,
        "ReceiveMessage",
        r#"{"QueueUrl":"http://h/000000000000/lim","WaitTimeSeconds":1,"MaxNumberOfMessages":10}"#,
    );
    assert_eq!(r.status, 200);
    assert!(
        r.json()["Messages"]
            .as_array()
            .is_some_and(|m| !m.is_empty()),
        "{}",
        &r.body[..200.min(r.body.len())]
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    // Still healthy.
    assert_eq!(json(port, "ListQueues", "{}").status, 200);
    b.shutdown();
}

#[test]
fn sigv4_rejections_have_their_codes() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let (b, port) = start(
        tmp.path(),
        &[
            ("SLUICE_AUTH", "sigv4"),
            ("SLUICE_ACCESS_KEYS", "AKIDTEST:secret:111122223333"),
        ],
    );
    let r = json(port, "ListQueues", "{}");
    assert_eq!(r.status, 403);
    assert_eq!(
        r.header("x-amzn-query-error"),
        Some("MissingAuthenticationToken;Sender")
    );
    #[allow(clippy::disallowed_methods)] // the client's clock (a SigV4 date), not the broker's
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let date = amz_date(now);
    let signed = |key: &str, sig: &str| {
        format!(
            "POST / HTTP/1.1\r\nHost: localhost\r\nX-Amz-Target: AmazonSQS.ListQueues\r\nX-Amz-Date: {date}\r\n\
             Authorization: AWS4-HMAC-SHA256 Credential={key}/{}/us-east-1/sqs/aws4_request, \
             SignedHeaders=host;x-amz-date;x-amz-target, Signature={sig}\r\nContent-Length: 2\r\n\r\n{{}}",
            &date[..8]
        )
    };
    let r = raw(port, signed("AKIDNOPE", &"0".repeat(64)).as_bytes());
    assert_json_error(&r, 403, "InvalidClientTokenId", "InvalidClientTokenId");
    let r = raw(port, signed("AKIDTEST", &"0".repeat(64)).as_bytes());
    assert_json_error(&r, 403, "SignatureDoesNotMatch", "SignatureDoesNotMatch");
    let r = raw(port, signed("AKIDTEST", "nothex").as_bytes());
    assert_json_error(&r, 403, "SignatureDoesNotMatch", "SignatureDoesNotMatch");
    let r = raw(
        port,
        b"POST / HTTP/1.1\r\nHost: localhost\r\nX-Amz-Target: AmazonSQS.ListQueues\r\nAuthorization: AWS4-HMAC-SHA256 garbage\r\nContent-Length: 0\r\n\r\n",
    );
    assert_json_error(&r, 400, "IncompleteSignature", "IncompleteSignature");
    b.shutdown();
    std::env::set_var("SLUICE_AUTH", "none");
    std::env::remove_var("SLUICE_ACCESS_KEYS");
}

fn amz_date(unix_s: u64) -> String {
    // Civil date from days (Howard Hinnant's algorithm).
    let days = (unix_s / 86_400) as i64;
    let secs = unix_s % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[test]
fn a_taken_http_port_fails_the_start_instead_of_serving_without_the_api() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    // Another program's listener (no SO_REUSEPORT) holds the port.
    let other = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken = other.local_addr().expect("addr");
    let mut c = BrokerConfig::ephemeral(tmp.path().to_path_buf()).expect("config");
    c.shards = 2;
    c.http_addr = taken;
    c.quic_addr = "127.0.0.1:0".parse().expect("addr");
    c.metrics_addr = "127.0.0.1:0".parse().expect("addr");
    c.kafka_addr = None;
    let e = match server::start(c) {
        Ok(b) => {
            b.shutdown();
            panic!("the broker started on a port another program listens on");
        }
        Err(e) => e,
    };
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    assert!(e.to_string().contains("SQS HTTP API on"), "{e}");
    // The other program still has its port.
    drop(other);
}

/// A second broker on the ports of a running one fails to start, HTTP and QUIC alike: with
/// SO_REUSEPORT it would otherwise join the first one's groups and the kernel would spread
/// connections and datagrams over both (clients then see the other broker's answers at random).
#[test]
fn a_second_broker_on_the_same_ports_fails_the_start() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let free_tcp = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
    };
    let free_udp = || {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
    };
    let config = |dir: &std::path::Path, http, quic| {
        let mut c = BrokerConfig::ephemeral(dir.to_path_buf()).expect("config");
        c.shards = 1;
        c.default_partitions = 1;
        c.http_addr = http;
        c.quic_addr = quic;
        c.quic_shard_port_base = None;
        c.metrics_addr = "127.0.0.1:0".parse().expect("addr");
        c.kafka_addr = None;
        c
    };
    let (http, quic) = (free_tcp(), free_udp());
    let (a_dir, b_dir) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    let first = server::start(config(a_dir.path(), http, quic)).expect("first broker");
    first.wait_ready().expect("ready");
    // The same HTTP port.
    let e = server::start(config(
        b_dir.path(),
        http,
        "127.0.0.1:0".parse().expect("addr"),
    ))
    .err()
    .expect("a second broker on the HTTP port");
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    assert!(e.to_string().contains("SQS HTTP API on"), "{e}");
    // The same QUIC port.
    let e = server::start(config(b_dir.path(), free_tcp(), quic))
        .err()
        .expect("a second broker on the QUIC port");
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    assert!(e.to_string().contains("QUIC on"), "{e}");
    first.shutdown();
    // Once the first is gone, the ports are free again.
    let again = server::start(config(b_dir.path(), http, quic)).expect("after the first stopped");
    again.wait_ready().expect("ready");
    again.shutdown();
}

/// A starting broker holds its ports from its reservation until its shards listen, which
/// recovery can make minutes: a second broker started in that window must fail as well. (The
/// probe alone let it through for TCP: a bound socket that does not listen yet admits a probe
/// with SO_REUSEADDR, and the second broker joined the first one's SO_REUSEPORT group.)
#[test]
fn a_port_held_by_a_starting_broker_is_refused_to_a_second() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    let first = sluice_broker::http::reserve_port(free).expect("the first broker's reservation");
    let e = sluice_broker::http::reserve_port(free)
        .expect_err("a second broker on a port a starting broker holds");
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    assert!(e.to_string().contains("SQS HTTP API on"), "{e}");
    let udp = std::net::UdpSocket::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    let quic = sluice_broker::native::reserve_port(udp).expect("the first broker's QUIC port");
    let e = sluice_broker::native::reserve_port(udp).expect_err("a second broker on the QUIC port");
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    // Released with the first broker: the ports can be taken again.
    drop((first, quic));
    sluice_broker::http::reserve_port(free).expect("released");
    sluice_broker::native::reserve_port(udp).expect("released");
}

/// With auth off (the local default), a web page must not drive the API: a DNS-rebinding page
/// sends its own name as Host, a cross-site form POST carries a foreign Origin. Both are refused
/// with AccessDenied before anything happens; local clients and configured names pass.
#[test]
fn auth_off_refuses_rebinding_hosts_and_foreign_origins() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    std::env::set_var("SLUICE_AUTH", "none");
    std::env::remove_var("SLUICE_ACCESS_KEYS");
    let (b, port) = start(tmp.path(), &[]);
    let create = |host: &str, origin: Option<&str>, name: &str| {
        let form = format!("Action=CreateQueue&QueueName={name}");
        let origin = origin.map_or(String::new(), |o| format!("Origin: {o}\r\n"));
        raw(
            port,
            format!(
                "POST / HTTP/1.1\r\nHost: {host}\r\n{origin}Content-Type: application/x-www-form-urlencoded\r\n\
                 Content-Length: {}\r\n\r\n{form}",
                form.len()
            )
            .as_bytes(),
        )
    };
    // DNS rebinding: the page's name, whatever the port.
    let r = create(&format!("rebind.attacker.example:{port}"), None, "rebound");
    assert_xml_error(&r, 403, "AccessDenied");
    assert!(r.body.contains("rebind.attacker.example"), "{}", r.body);
    assert!(
        r.body.contains("allowed_hosts"),
        "the error says how to allow it: {}",
        r.body
    );
    let r = raw(
        port,
        b"POST / HTTP/1.1\r\nHost: localhost.attacker.example\r\nX-Amz-Target: AmazonSQS.ListQueues\r\n\
          Content-Type: application/x-amz-json-1.0\r\nContent-Length: 2\r\n\r\n{}",
    );
    assert_json_error(&r, 403, "AccessDenied", "AccessDenied");
    // A cross-site form POST from a page elsewhere: a local Host, a foreign Origin.
    let r = create(
        &format!("127.0.0.1:{port}"),
        Some("https://attacker.example"),
        "csrf",
    );
    assert_xml_error(&r, 403, "AccessDenied");
    assert!(r.body.contains("Origin"), "{}", r.body);
    let r = create("localhost", Some("null"), "csrf2");
    assert_xml_error(&r, 403, "AccessDenied");
    // Nothing was created.
    let listed = json(port, "ListQueues", "{}");
    assert_eq!(listed.status, 200);
    assert!(
        !listed.body.contains("rebound") && !listed.body.contains("csrf"),
        "{}",
        listed.body
    );
    // Local clients: localhost, loopback literals, a page on localhost.
    for (host, origin) in [
        (format!("localhost:{port}"), None),
        (format!("127.0.0.1:{port}"), None),
        (format!("[::1]:{port}"), None),
        ("localhost".to_string(), Some("http://localhost:3000")),
    ] {
        let r = create(&host, origin, "local-ok");
        assert_eq!(r.status, 200, "{host} {origin:?}: {}", r.body);
    }
    b.shutdown();

    // A configured name passes (a docker-compose service, say); still not a foreign page.
    let tmp = tempfile::tempdir().expect("tmp");
    let (b, port) = start_with(tmp.path(), &[], |c| {
        c.http_allowed_hosts = vec!["sluice".to_string()];
    });
    let ok = raw(
        port,
        b"POST / HTTP/1.1\r\nHost: sluice:9324\r\nX-Amz-Target: AmazonSQS.ListQueues\r\n\
          Content-Type: application/x-amz-json-1.0\r\nContent-Length: 2\r\n\r\n{}",
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
    let r = raw(
        port,
        b"POST / HTTP/1.1\r\nHost: other\r\nX-Amz-Target: AmazonSQS.ListQueues\r\n\
          Content-Type: application/x-amz-json-1.0\r\nContent-Length: 2\r\n\r\n{}",
    );
    assert_json_error(&r, 403, "AccessDenied", "AccessDenied");
    b.shutdown();
}
