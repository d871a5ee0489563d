//! The broker's parsers under fuzzing (`sluice-fuzz`; corpora in `fuzz/corpus/<target>/`): the
//! SQS JSON and Query decoders, SigV4 parsing and verification, receipt handles and the queue
//! engine's log records. Each target must turn any input into a value or a typed error: a
//! panic or a hang fails the test, with the seed and the saved input to replay it.

use crate::auth::{parse_keys, AuthConfig, AuthMode, SignedRequest};
use crate::engine::attributes::{MessageAttribute, QueueAttributes, QueueKind};
use crate::engine::{
    Command, Limits, Partition, PartitionConfig, Receipt, ReceiptCodec, ReceiveRequest, Record,
    SendRequest,
};

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

/// What the actions read of a decoded request before they touch a queue: the message a send
/// carries (body, attributes, system attributes, group and dedup ids) and the common members.
fn read_params(action: &str, mut p: crate::http::protocol::Params) {
    use crate::http::actions::{batch_entries, send_request};
    match action {
        "SendMessage" => {
            let _ = send_request(&mut p);
        }
        "SendMessageBatch" => {
            if let Ok(entries) = batch_entries(&mut p, "SendMessageBatchRequestEntry") {
                for (_, mut e) in entries {
                    let _ = send_request(&mut e);
                }
            }
        }
        _ => {
            let _ = p.opt_str("QueueUrl");
            let _ = p.str_map("Attributes");
            let _ = p.str_list("AttributeNames");
            let _ = p.opt_int("MaxNumberOfMessages");
            let _ = p.struct_list("Entries");
        }
    }
}

/// Splits an input into `n` parts at its first `n - 1` newlines (the rest is the last part).
fn parts(input: &[u8], n: usize) -> Vec<&[u8]> {
    let mut out = Vec::with_capacity(n);
    let mut rest = input;
    for _ in 1..n {
        match rest.iter().position(|&b| b == b'\n') {
            Some(i) => {
                out.push(&rest[..i]);
                rest = &rest[i + 1..];
            }
            None => {
                out.push(rest);
                rest = &[];
            }
        }
    }
    out.push(rest);
    out
}

#[test]
fn fuzz_sqs_json() {
    sluice_fuzz::Target::new(MANIFEST_DIR, "sqs_json")
        .dictionary([
            "AmazonSQS.",
            "SendMessage",
            "SendMessageBatch",
            "ReceiveMessage",
            "\"QueueUrl\":",
            "\"MessageAttributes\":",
            "\"DataType\":\"Number\"",
            "\"StringValue\":",
            "\"BinaryValue\":",
            "\"Entries\":[",
            "{",
            "}",
            "[",
            "]",
            "\\u0000",
            "\\ud800",
            "1e999",
        ])
        .run(|input| {
            // Line 1: the X-Amz-Target; the rest: the body.
            let p = parts(input, 2);
            let target = String::from_utf8_lossy(p[0]);
            if let Ok((action, params)) = crate::http::decode_json(&target, p[1]) {
                read_params(&action, params);
            }
        });
}

#[test]
fn fuzz_sqs_query() {
    sluice_fuzz::Target::new(MANIFEST_DIR, "sqs_query")
        .dictionary([
            "Action=",
            "QueueUrl=",
            "MessageBody=",
            "MessageAttribute.1.Name=",
            "MessageAttribute.1.Value.DataType=",
            "MessageAttribute.1.Value.StringValue=",
            "SendMessageBatchRequestEntry.1.",
            "Attribute.1.Name=",
            "%",
            "%FF",
            "%C3%A9",
            "&",
            "=",
            "+",
        ])
        .run(|input| {
            // Line 1: the query string; the rest: a form body.
            let p = parts(input, 2);
            let query = String::from_utf8_lossy(p[0]);
            let mut headers = http::HeaderMap::new();
            headers.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/x-www-form-urlencoded"),
            );
            if let Ok((action, params)) = crate::http::decode_query(&query, &headers, p[1]) {
                read_params(&action, params);
            }
        });
}

#[test]
fn fuzz_sigv4() {
    let cfg = AuthConfig {
        mode: AuthMode::SigV4,
        keys: parse_keys("AKIDFUZZ:fuzz-secret:111111111111").expect("keys"),
    };
    sluice_fuzz::Target::new(MANIFEST_DIR, "sigv4")
        .dictionary([
            "AWS4-HMAC-SHA256 ",
            "Credential=AKIDFUZZ/20240101/us-east-1/sqs/aws4_request",
            ", SignedHeaders=host;x-amz-date",
            ", Signature=",
            "X-Amz-Algorithm=AWS4-HMAC-SHA256",
            "&X-Amz-Credential=AKIDFUZZ%2F20240101%2Fus-east-1%2Fsqs%2Faws4_request",
            "&X-Amz-Expires=",
            "&X-Amz-SignedHeaders=host",
            "&X-Amz-Signature=",
            "20240101T000000Z",
            "UNSIGNED-PAYLOAD",
        ])
        .run(|input| {
            // Lines: method, path, query, Authorization, X-Amz-Date, x-amz-content-sha256,
            // then the body.
            let p = parts(input, 7);
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            let mut headers = http::HeaderMap::new();
            headers.insert(
                http::header::HOST,
                http::HeaderValue::from_static("localhost"),
            );
            for (name, value) in [
                ("authorization", p[3]),
                ("x-amz-date", p[4]),
                ("x-amz-content-sha256", p[5]),
            ] {
                if let Ok(v) = http::HeaderValue::from_bytes(value) {
                    if !value.is_empty() {
                        headers.insert(name, v);
                    }
                }
            }
            let (method, path, query) = (text(p[0]), text(p[1]), text(p[2]));
            let r = SignedRequest {
                method: &method,
                raw_path: &path,
                raw_query: &query,
                headers: &headers,
                body: p[6],
                now_s: 1_704_067_200, // 2024-01-01T00:00:00Z
            };
            // Nothing a client makes up authenticates.
            assert!(
                cfg.authenticate(&r).is_err(),
                "a made-up signature was accepted"
            );
        });
}

#[test]
fn fuzz_receipt_handles() {
    let codec = ReceiptCodec::new(b"fuzz-receipt-secret-0123456789ab").expect("codec");
    let valid: Vec<Vec<u8>> = [
        (1, 0, 0, 1),
        (7, 3, 123_456, 9),
        (u64::MAX, u32::MAX, u64::MAX, u32::MAX),
    ]
    .into_iter()
    .map(|(queue_id, partition, msg_id, epoch)| {
        codec
            .encode(&Receipt {
                queue_id,
                partition,
                msg_id,
                epoch,
            })
            .into_bytes()
    })
    .collect();
    let genuine: Vec<String> = valid
        .iter()
        .map(|v| String::from_utf8(v.clone()).expect("ascii"))
        .collect();
    sluice_fuzz::Target::new(MANIFEST_DIR, "receipt_handle")
        .seeds(valid)
        .run(|input| {
            let handle = String::from_utf8_lossy(input);
            for queue_id in [1, 7] {
                if let Ok(r) = codec.decode(&handle, queue_id) {
                    // Only a handle this codec issued decodes: no forgery by mutation.
                    assert!(
                        genuine.iter().any(|g| *g == handle),
                        "a mutated handle decoded: {r:?}"
                    );
                }
            }
        });
}

/// Records of every kind a partition writes, from a short run of commands.
fn engine_records() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for kind in [QueueKind::Standard, QueueKind::Fifo] {
        let mut attributes = QueueAttributes::new(kind);
        if kind == QueueKind::Fifo {
            attributes
                .set("ContentBasedDeduplication", "true")
                .expect("fifo");
        }
        let mut p = Partition::new(PartitionConfig {
            queue_id: 1,
            partition: 0,
            attributes,
            limits: Limits::default(),
        })
        .expect("partition");
        let send = |body: &str| SendRequest {
            body: body.into(),
            attributes: vec![MessageAttribute {
                name: "n".into(),
                data_type: "Number".into(),
                value: crate::engine::attributes::AttributeValue::String("1.5".into()),
            }],
            delay_s: Some(1),
            group_id: (kind == QueueKind::Fifo).then(|| "g".to_string()),
            dedup_id: None,
        };
        let mut now = 1_000;
        let mut run = |p: &mut Partition, now: u64, cmd: Command| {
            if let Ok(e) = p.execute(now, cmd) {
                out.extend(e.records.iter().map(Record::encode));
            }
        };
        run(&mut p, now, Command::Send(send("first")));
        run(&mut p, now, Command::Send(send("second ✓")));
        now += 2_000;
        run(
            &mut p,
            now,
            Command::Receive(ReceiveRequest {
                max_messages: 10,
                visibility_timeout_s: Some(5),
                attempt_id: Some("a1".into()),
            }),
        );
        run(&mut p, now, Command::Purge);
        out.extend(p.tick(now + 100_000).records.iter().map(Record::encode));
    }
    out
}

#[test]
fn fuzz_engine_records() {
    sluice_fuzz::Target::new(MANIFEST_DIR, "engine_record")
        .seeds(engine_records())
        .run(|input| {
            if let Ok(r) = Record::decode(input) {
                // What decodes re-encodes to something that decodes to the same record.
                assert_eq!(Record::decode(&r.encode()).as_ref(), Ok(&r));
            }
        });
}
