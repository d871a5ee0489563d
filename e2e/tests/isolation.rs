//! Tenant isolation over the native QUIC protocol, tried as an attacker would: a client holding
//! a valid key of account 111111111111 names account 222222222222's queues, ARNs, receipt
//! handles and move tasks in every request the protocol has. Every attempt must read exactly as
//! "that does not exist", and the victim's queues, messages, tags, attributes, dead-letter
//! sources and move task must be untouched afterwards.

use std::time::Duration;

use sluice_broker::auth::{parse_keys, AuthConfig, AuthMode};
use sluice_broker::config::BrokerConfig;
use sluice_broker::server::BrokerHandle;
use sluice_sdk::types::*;
use sluice_sdk::{Client, ClientOptions, Credentials, ErrorCode, ReceiveOptions, Trust};

const ATTACKER: &str = "111111111111";
const VICTIM: &str = "222222222222";

fn run<F: std::future::Future<Output = ()>>(f: F) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(90), f)
                .await
                .expect("test finished in time")
        })
}

/// The answer an attacker must get: the request failed with one of `codes` (what SQS says of a
/// queue or task that does not exist), never success.
#[track_caller]
fn refused(what: &str, r: sluice_sdk::Result<Response>, codes: &[ErrorCode]) {
    match r {
        Ok(Response::Error(e)) if codes.contains(&e.error_code()) => {}
        Ok(other) => panic!("{what}: the attacker got an answer: {other:?}"),
        Err(e) => assert!(
            e.code().is_some_and(|c| codes.contains(&c)),
            "{what}: expected one of {codes:?}, got {e:?}"
        ),
    }
}

/// A one-shard broker with SigV4 on, `keys` (`AKID:SECRET:ACCOUNT,…`), data in `data`, on free
/// loopback ports; `tweak` sets the rest. Returns it with its QUIC address and the trust its
/// clients need.
fn start_broker(
    data: &std::path::Path,
    keys: &str,
    tweak: impl FnOnce(&mut BrokerConfig),
) -> (BrokerHandle, std::net::SocketAddr, Trust) {
    let mut c = BrokerConfig::ephemeral(data.to_path_buf()).expect("config");
    c.shards = 1;
    c.default_partitions = 1;
    c.http_addr = "127.0.0.1:0".parse().expect("addr");
    c.quic_addr = "127.0.0.1:0".parse().expect("addr");
    c.metrics_addr = "127.0.0.1:0".parse().expect("addr");
    c.kafka_addr = None;
    c.auth = AuthConfig {
        mode: AuthMode::SigV4,
        keys: parse_keys(keys).expect("keys"),
    };
    tweak(&mut c);
    let handle = sluice_broker::server::start(c).expect("start");
    handle.wait_ready().expect("ready");
    let addr = handle.quic_addr();
    (
        handle,
        addr,
        Trust::PemFile(data.join("quic-selfsigned-cert.pem")),
    )
}

fn two_accounts() -> String {
    format!("AKIDATTACKER:attacker-secret:{ATTACKER},AKIDVICTIM:victim-secret:{VICTIM}")
}

#[test]
fn an_account_reaches_nothing_of_another_over_quic() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (handle, addr, trust) = start_broker(dir.path(), &two_accounts(), |_| {});
    let region = handle.config.region.clone();
    run(async move {
        let connect = |akid: &str, secret: &str| {
            let options = ClientOptions {
                credentials: Some(Credentials::new(akid, secret)),
                retries: 0,
                ..ClientOptions::new(trust.clone())
            };
            Client::connect(addr, options)
        };
        let victim = connect("AKIDVICTIM", "victim-secret")
            .await
            .expect("victim");
        let attacker = connect("AKIDATTACKER", "attacker-secret")
            .await
            .expect("attacker");
        let arn = |account: &str, name: &str| format!("arn:aws:sqs:{region}:{account}:{name}");

        // The victim: a queue with messages and tags, a source with a DLQ, and a running move
        // task out of that DLQ.
        let vq = victim
            .create_queue_with(
                "jobs",
                Default::default(),
                [("team".to_string(), "victim".to_string())].into(),
            )
            .await
            .expect("create");
        for i in 0..3 {
            victim
                .send(&vq, &format!("secret {i}"))
                .await
                .expect("send");
        }
        let dlq = victim.create_queue("jobs-dlq").await.expect("create");
        let src = victim
            .create_queue_with(
                "jobs-src",
                sluice_sdk::attributes([(
                    "RedrivePolicy",
                    format!(
                        r#"{{"deadLetterTargetArn":"{}","maxReceiveCount":1}}"#,
                        arn(VICTIM, "jobs-dlq")
                    )
                    .as_str(),
                )]),
                Default::default(),
            )
            .await
            .expect("create");
        for i in 0..5 {
            victim.send(&src, &format!("dead {i}")).await.expect("send");
        }
        // Receive each once with no lease; the next receive moves them to the DLQ.
        let mut options = ReceiveOptions::long_poll(10, 1);
        options.visibility_timeout = Some(0);
        for _ in 0..3 {
            victim
                .receive(&src, options.clone())
                .await
                .expect("receive");
        }
        let mut in_dlq = 0;
        for _ in 0..100 {
            let a = victim
                .get_queue_attributes(&dlq, &["ApproximateNumberOfMessages"])
                .await
                .expect("attributes");
            in_dlq = a["ApproximateNumberOfMessages"]
                .parse::<u32>()
                .expect("count");
            if in_dlq == 5 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(in_dlq, 5, "the victim's DLQ filled");
        let task = match victim
            .call(Request::StartMessageMoveTask(StartMessageMoveTaskRequest {
                source_arn: arn(VICTIM, "jobs-dlq"),
                destination_arn: None,
                max_number_of_messages_per_second: Some(1),
            }))
            .await
            .expect("start")
        {
            Response::StartMessageMoveTask(r) => r.task_handle,
            other => panic!("start move task: {other:?}"),
        };
        // A message the victim holds, whose receipt handle the attacker has stolen.
        let held = victim
            .receive(&vq, ReceiveOptions::long_poll(1, 1))
            .await
            .expect("receive");
        assert_eq!(held.len(), 1);
        let stolen = held[0].receipt_handle.clone();

        // The attacker's own queue, to replay stolen handles against.
        let own = attacker.create_queue("jobs").await.expect("create");
        assert!(own.contains(ATTACKER), "{own}");
        attacker.send(&own, "mine").await.expect("send");

        use ErrorCode::{
            QueueDoesNotExist as Nx, ReceiptHandleIsInvalid,
            ResourceNotFoundException as ResourceNotFound,
        };
        let no_queue = &[Nx];
        let urls = [
            vq.clone(),
            format!("/{VICTIM}/jobs"),
            format!("https://sqs.{region}.amazonaws.com/{VICTIM}/jobs"),
        ];
        for url in &urls {
            let u = || url.clone();
            let tries: Vec<(&str, Request)> = vec![
                (
                    "DeleteQueue",
                    Request::DeleteQueue(DeleteQueueRequest { queue_url: u() }),
                ),
                (
                    "GetQueueAttributes",
                    Request::GetQueueAttributes(GetQueueAttributesRequest {
                        queue_url: u(),
                        attribute_names: vec!["All".into()],
                    }),
                ),
                (
                    "SetQueueAttributes",
                    Request::SetQueueAttributes(SetQueueAttributesRequest {
                        queue_url: u(),
                        attributes: [("VisibilityTimeout".into(), "0".into())].into(),
                    }),
                ),
                (
                    "PurgeQueue",
                    Request::PurgeQueue(PurgeQueueRequest { queue_url: u() }),
                ),
                (
                    "TagQueue",
                    Request::TagQueue(TagQueueRequest {
                        queue_url: u(),
                        tags: [("team".into(), "attacker".into())].into(),
                    }),
                ),
                (
                    "UntagQueue",
                    Request::UntagQueue(UntagQueueRequest {
                        queue_url: u(),
                        tag_keys: vec!["team".into()],
                    }),
                ),
                (
                    "ListQueueTags",
                    Request::ListQueueTags(ListQueueTagsRequest { queue_url: u() }),
                ),
                (
                    "ListDeadLetterSourceQueues",
                    Request::ListDeadLetterSourceQueues(ListDeadLetterSourceQueuesRequest {
                        queue_url: u(),
                        ..Default::default()
                    }),
                ),
                (
                    "SendMessage",
                    Request::SendMessage(SendMessageRequest {
                        queue_url: u(),
                        message_body: "injected".into(),
                        ..Default::default()
                    }),
                ),
                (
                    "SendMessageBatch",
                    Request::SendMessageBatch(SendMessageBatchRequest {
                        queue_url: u(),
                        entries: vec![SendMessageBatchRequestEntry {
                            id: "a".into(),
                            message_body: "injected".into(),
                            ..Default::default()
                        }],
                    }),
                ),
                (
                    "ReceiveMessage",
                    Request::ReceiveMessage(ReceiveMessageRequest {
                        queue_url: u(),
                        max_number_of_messages: Some(10),
                        ..Default::default()
                    }),
                ),
                (
                    "DeleteMessage",
                    Request::DeleteMessage(DeleteMessageRequest {
                        queue_url: u(),
                        receipt_handle: stolen.clone(),
                    }),
                ),
                (
                    "DeleteMessageBatch",
                    Request::DeleteMessageBatch(DeleteMessageBatchRequest {
                        queue_url: u(),
                        entries: vec![DeleteMessageBatchRequestEntry {
                            id: "a".into(),
                            receipt_handle: stolen.clone(),
                        }],
                    }),
                ),
                (
                    "ChangeMessageVisibility",
                    Request::ChangeMessageVisibility(ChangeMessageVisibilityRequest {
                        queue_url: u(),
                        receipt_handle: stolen.clone(),
                        visibility_timeout: 0,
                    }),
                ),
                (
                    "ChangeMessageVisibilityBatch",
                    Request::ChangeMessageVisibilityBatch(ChangeMessageVisibilityBatchRequest {
                        queue_url: u(),
                        entries: vec![ChangeMessageVisibilityBatchRequestEntry {
                            id: "a".into(),
                            receipt_handle: stolen.clone(),
                            visibility_timeout: Some(0),
                        }],
                    }),
                ),
            ];
            for (action, request) in tries {
                refused(
                    &format!("{action} {url}"),
                    attacker.call(request).await,
                    no_queue,
                );
            }
        }
        // By name with the victim as owner, and in listings.
        refused(
            "GetQueueUrl with QueueOwnerAWSAccountId",
            attacker
                .call(Request::GetQueueUrl(GetQueueUrlRequest {
                    queue_name: "jobs-dlq".into(),
                    queue_owner_aws_account_id: Some(VICTIM.into()),
                }))
                .await,
            no_queue,
        );
        let listed = attacker.list_queues("").await.expect("list");
        assert!(listed.iter().all(|u| !u.contains(VICTIM)), "{listed:?}");
        // Stolen handles on the attacker's own queue: not a handle of that queue.
        refused(
            "DeleteMessage of a stolen handle on an own queue",
            attacker
                .call(Request::DeleteMessage(DeleteMessageRequest {
                    queue_url: own.clone(),
                    receipt_handle: stolen.clone(),
                }))
                .await,
            &[ReceiptHandleIsInvalid],
        );
        refused(
            "ChangeMessageVisibility of a stolen handle on an own queue",
            attacker
                .call(Request::ChangeMessageVisibility(
                    ChangeMessageVisibilityRequest {
                        queue_url: own.clone(),
                        receipt_handle: stolen.clone(),
                        visibility_timeout: 0,
                    },
                ))
                .await,
            &[ReceiptHandleIsInvalid],
        );
        // Move tasks and ARNs of the victim.
        let not_found = &[ResourceNotFound, Nx];
        refused(
            "StartMessageMoveTask from the victim's DLQ",
            attacker
                .call(Request::StartMessageMoveTask(StartMessageMoveTaskRequest {
                    source_arn: arn(VICTIM, "jobs-dlq"),
                    destination_arn: None,
                    max_number_of_messages_per_second: None,
                }))
                .await,
            not_found,
        );
        refused(
            "ListMessageMoveTasks of the victim's DLQ",
            attacker
                .call(Request::ListMessageMoveTasks(ListMessageMoveTasksRequest {
                    source_arn: arn(VICTIM, "jobs-dlq"),
                    max_results: Some(10),
                }))
                .await,
            not_found,
        );
        refused(
            "CancelMessageMoveTask of the victim's task",
            attacker
                .call(Request::CancelMessageMoveTask(
                    CancelMessageMoveTaskRequest {
                        task_handle: task.clone(),
                    },
                ))
                .await,
            not_found,
        );
        // A redrive into the victim's queue: a source of the attacker's naming it as its DLQ.
        let redrive_into = |target: String| {
            sluice_sdk::attributes([(
                "RedrivePolicy",
                format!(r#"{{"deadLetterTargetArn":"{target}","maxReceiveCount":1}}"#).as_str(),
            )])
        };
        let e = attacker
            .set_queue_attributes(&own, redrive_into(arn(VICTIM, "jobs")))
            .await
            .expect_err("a DLQ in another account");
        assert_eq!(e.code(), Some(ErrorCode::InvalidAttributeValue), "{e:?}");
        let e = attacker
            .create_queue_with(
                "evil-src",
                redrive_into(arn(VICTIM, "jobs")),
                Default::default(),
            )
            .await
            .expect_err("a DLQ in another account");
        assert_eq!(e.code(), Some(ErrorCode::InvalidAttributeValue), "{e:?}");

        // The victim's world is as it was.
        let a = victim
            .get_queue_attributes(&vq, &["All"])
            .await
            .expect("the victim's queue still exists");
        assert_eq!(a["ApproximateNumberOfMessages"], "2");
        assert_eq!(a["ApproximateNumberOfMessagesNotVisible"], "1");
        assert_eq!(a["VisibilityTimeout"], "30");
        match victim
            .call(Request::ListQueueTags(ListQueueTagsRequest {
                queue_url: vq.clone(),
            }))
            .await
            .expect("tags")
        {
            Response::ListQueueTags(t) => assert_eq!(t.tags["team"], "victim"),
            other => panic!("{other:?}"),
        }
        victim
            .delete(&vq, &stolen)
            .await
            .expect("the stolen handle is still the victim's live lease");
        match victim
            .call(Request::ListDeadLetterSourceQueues(
                ListDeadLetterSourceQueuesRequest {
                    queue_url: dlq.clone(),
                    ..Default::default()
                },
            ))
            .await
            .expect("sources")
        {
            Response::ListDeadLetterSourceQueues(r) => assert_eq!(r.queue_urls, vec![src.clone()]),
            other => panic!("{other:?}"),
        }
        match victim
            .call(Request::ListMessageMoveTasks(ListMessageMoveTasksRequest {
                source_arn: arn(VICTIM, "jobs-dlq"),
                max_results: Some(10),
            }))
            .await
            .expect("tasks")
        {
            Response::ListMessageMoveTasks(r) => {
                assert_eq!(r.results.len(), 1);
                assert!(
                    matches!(
                        r.results[0].status,
                        MoveTaskStatus::Running | MoveTaskStatus::Completed
                    ),
                    "the attacker cancelled nothing: {:?}",
                    r.results[0].status
                );
            }
            other => panic!("{other:?}"),
        }
        // And the attacker's own queue holds only its own message.
        let mine = attacker
            .receive(&own, ReceiveOptions::long_poll(10, 1))
            .await
            .expect("receive");
        assert_eq!(
            mine.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(),
            vec!["mine"]
        );
    });
    handle.shutdown();
}

/// Quotas: one account past its request rate gets `RequestThrottled` (retryable), another
/// account on the same broker is served; a queue count quota gives `OverLimit`.
#[test]
fn one_account_past_its_rate_does_not_slow_another() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (handle, addr, trust) = start_broker(dir.path(), &two_accounts(), |c| {
        c.quotas.requests_per_s = Some(50);
        c.quotas.queues_per_account = 2;
    });
    run(async move {
        let connect = |akid: &str, secret: &str| {
            let options = ClientOptions {
                credentials: Some(Credentials::new(akid, secret)),
                retries: 0,
                ..ClientOptions::new(trust.clone())
            };
            Client::connect(addr, options)
        };
        let noisy = connect("AKIDATTACKER", "attacker-secret")
            .await
            .expect("noisy");
        let quiet = connect("AKIDVICTIM", "victim-secret").await.expect("quiet");
        let nq = noisy.create_queue("a").await.expect("create");
        noisy.create_queue("b").await.expect("create");
        let e = noisy.create_queue("c").await.expect_err("third queue");
        assert_eq!(e.code(), Some(ErrorCode::OverLimit), "{e:?}");
        let qq = quiet.create_queue("a").await.expect("create");
        // Far past 50 requests in well under a second.
        let mut throttled = 0;
        for i in 0..200 {
            match noisy.send(&nq, &format!("m{i}")).await {
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(e.code(), Some(ErrorCode::RequestThrottled), "{e:?}");
                    assert!(e.is_retryable(), "throttling is retryable");
                    throttled += 1;
                }
            }
        }
        assert!(
            throttled >= 100,
            "the noisy account was throttled ({throttled} of 200)"
        );
        for i in 0..20 {
            quiet
                .send(&qq, &format!("q{i}"))
                .await
                .expect("the quiet account is served");
        }
        // After a second the noisy account is served again.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        noisy.send(&nq, "later").await.expect("refilled");
    });
    handle.shutdown();
}

/// Mutual TLS: a client certificate named in `client_cert_accounts` is its account's identity
/// (no access key needed), and reaches only that account; a key of another account beside it
/// is refused.
#[test]
fn client_certificates_map_to_their_accounts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).expect("CA cert");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let ca_path = dir.path().join("clients-ca.pem");
    std::fs::write(&ca_path, ca_cert.pem()).expect("write");
    let client = |name: &str| {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params =
            rcgen::CertificateParams::new(vec![format!("{name}.example")]).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.signed_by(&key, &issuer).expect("cert");
        let (cert_path, key_path) = (
            dir.path().join(format!("{name}.pem")),
            dir.path().join(format!("{name}-key.pem")),
        );
        std::fs::write(&cert_path, cert.pem()).expect("write");
        std::fs::write(&key_path, key.serialize_pem()).expect("write");
        sluice_sdk::ClientIdentity {
            cert_path,
            key_path,
        }
    };
    let (svc_a, svc_b, unmapped) = (client("svc-a"), client("svc-b"), client("svc-x"));
    let data = dir.path().join("data");
    let keys = format!("AKIDVICTIM:victim-secret:{VICTIM}");
    let (handle, addr, trust) = start_broker(&data, &keys, |c| {
        c.quic_tls.client_ca_path = Some(ca_path);
        c.quic_tls.client_cert_accounts = [
            ("svc-a".to_string(), ATTACKER.to_string()),
            // Mapped by its DNS name rather than its common name.
            ("svc-b.example".to_string(), VICTIM.to_string()),
        ]
        .into();
    });
    run(async move {
        let connect = |identity: sluice_sdk::ClientIdentity, creds: Option<Credentials>| {
            let options = ClientOptions {
                identity: Some(identity),
                credentials: creds,
                retries: 0,
                ..ClientOptions::new(trust.clone())
            };
            Client::connect(addr, options)
        };
        let a = connect(svc_a.clone(), None)
            .await
            .expect("svc-a by certificate");
        let b = connect(svc_b.clone(), None)
            .await
            .expect("svc-b by DNS name");
        let qa = a.create_queue("jobs").await.expect("create");
        let qb = b.create_queue("jobs").await.expect("create");
        assert!(qa.contains(ATTACKER), "{qa}");
        assert!(qb.contains(VICTIM), "{qb}");
        let e = a
            .send(&qb, "x")
            .await
            .expect_err("the other account's queue");
        assert_eq!(e.code(), Some(ErrorCode::QueueDoesNotExist), "{e:?}");
        // The same account by key and certificate is fine; another account's key is not.
        connect(svc_b, Some(Credentials::new("AKIDVICTIM", "victim-secret")))
            .await
            .expect("agreeing key");
        let e = connect(svc_a, Some(Credentials::new("AKIDVICTIM", "victim-secret")))
            .await
            .err()
            .expect("disagreeing key");
        assert_eq!(e.code(), Some(ErrorCode::AccessDenied), "{e:?}");
        // A certificate the CA signed but no mapping names still needs an access key.
        let e = connect(unmapped.clone(), None)
            .await
            .err()
            .expect("unmapped certificate without a key");
        assert_eq!(e.code(), Some(ErrorCode::AccessDenied), "{e:?}");
        let v = connect(
            unmapped,
            Some(Credentials::new("AKIDVICTIM", "victim-secret")),
        )
        .await
        .expect("unmapped certificate with a key");
        v.send(&qb, "by key")
            .await
            .expect("served as the key's account");
    });
    handle.shutdown();
}
