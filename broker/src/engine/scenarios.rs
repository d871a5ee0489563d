//! One test per queue rule, written as a user would notice it. The randomized comparison with
//! the reference model lives in `model.rs`.

use super::attributes::{
    AttributeValue, DedupScope, MessageAttribute, QueueAttributes, QueueKind, RedrivePolicy,
};
use super::partition::*;
use super::receipt::Receipt;
use super::record::{MessageId, MoveDestination, Payload, Record, RecordKind, Sent};
use super::EngineError;
use super::ReplayError;

const T0: u64 = 1_700_000_000_000;

struct Q {
    p: Partition,
    cfg: PartitionConfig,
    log: Vec<Record>,
}

impl Q {
    fn new(kind: QueueKind, tweak: impl FnOnce(&mut QueueAttributes, &mut Limits)) -> Q {
        let mut a = QueueAttributes::new(kind);
        let mut l = Limits::default();
        tweak(&mut a, &mut l);
        let cfg = PartitionConfig {
            queue_id: 5,
            partition: 1,
            attributes: a,
            limits: l,
        };
        Q {
            p: Partition::new(cfg.clone()).expect("valid config"),
            cfg,
            log: Vec::new(),
        }
    }

    fn std() -> Q {
        Q::new(QueueKind::Standard, |_, _| {})
    }

    fn fifo() -> Q {
        Q::new(QueueKind::Fifo, |_, _| {})
    }

    fn tick(&mut self, now: u64) {
        let fx = self.p.tick(now);
        self.log.extend(fx.records);
    }

    fn exec(&mut self, now: u64, cmd: Command) -> Result<Effects, EngineError> {
        let fx = self.p.execute(now, cmd)?;
        self.log.extend(fx.records.iter().cloned());
        Ok(fx)
    }

    fn send(&mut self, now: u64, req: SendRequest) -> Result<SentReply, EngineError> {
        match self.exec(now, Command::Send(req))?.reply {
            Reply::Sent(s) => Ok(s),
            r => panic!("unexpected reply {r:?}"),
        }
    }

    fn body(&mut self, now: u64, body: &str) -> SentReply {
        self.send(
            now,
            SendRequest {
                body: body.into(),
                ..Default::default()
            },
        )
        .expect("send")
    }

    fn fifo_send(&mut self, now: u64, group: &str, body: &str, dedup: &str) -> SentReply {
        self.send(
            now,
            SendRequest {
                body: body.into(),
                group_id: Some(group.into()),
                dedup_id: Some(dedup.into()),
                ..Default::default()
            },
        )
        .expect("send")
    }

    fn recv_with(
        &mut self,
        now: u64,
        max: u32,
        vt: Option<u32>,
        attempt: Option<&str>,
    ) -> Vec<Delivered> {
        let fx = self
            .exec(
                now,
                Command::Receive(ReceiveRequest {
                    max_messages: max,
                    visibility_timeout_s: vt,
                    attempt_id: attempt.map(str::to_string),
                }),
            )
            .expect("receive");
        match fx.reply {
            Reply::Received(d) => d.into_iter().map(|d| self.delivered(d)).collect(),
            r => panic!("unexpected reply {r:?}"),
        }
    }

    /// A delivery with its content read back from its `Sent` record, as the shard does.
    fn delivered(&self, d: Delivery) -> Delivered {
        let p = self.content(d.sent_offset, d.message_id);
        d.with_payload(p)
    }

    fn move_request(&self, m: MoveStart) -> MoveRequest {
        let p = self.content(m.sent_offset, m.message_id);
        m.with_payload(p)
    }

    fn content(&self, offset: u64, message_id: MessageId) -> std::sync::Arc<Payload> {
        match &self.log[offset as usize].kind {
            RecordKind::Sent(s) if s.message_id == message_id => s.payload.clone(),
            other => panic!("no Sent of {message_id} at {offset}: {other:?}"),
        }
    }

    fn recv(&mut self, now: u64, max: u32) -> Vec<Delivered> {
        self.recv_with(now, max, None, None)
    }

    fn bodies(&mut self, now: u64, max: u32) -> Vec<String> {
        self.recv(now, max)
            .iter()
            .map(|d| d.payload.body.clone())
            .collect()
    }

    fn delete(&mut self, now: u64, r: Receipt) -> Result<(), EngineError> {
        self.exec(now, Command::Delete { receipt: r }).map(|_| ())
    }

    fn change(&mut self, now: u64, r: Receipt, t: u32) -> Result<(), EngineError> {
        self.exec(
            now,
            Command::ChangeVisibility {
                receipt: r,
                timeout_s: t,
            },
        )
        .map(|_| ())
    }

    /// Rebuilds from the records, checking the replayed state equals the live one.
    fn restart(&mut self, now: u64) {
        let fx = self.p.tick(now);
        self.log.extend(fx.records);
        let mut fresh = Partition::new(self.cfg.clone()).expect("valid config");
        for r in &self.log {
            let r = Record::decode(&r.encode()).expect("own record decodes");
            fresh.replay(&r).expect("own record replays");
        }
        fresh
            .finish_replay(self.log.len() as u64)
            .expect("whole log");
        assert!(fresh.tick(now).records.is_empty());
        assert_eq!(self.p.dump(), fresh.dump());
        self.p = fresh;
    }
}

#[test]
fn send_receive_delete() {
    let mut q = Q::std();
    let s = q
        .send(
            T0,
            SendRequest {
                body: "hello".into(),
                attributes: vec![MessageAttribute {
                    name: "timestamp".into(),
                    data_type: "Number".into(),
                    value: AttributeValue::String("1493147359900".into()),
                }],
                ..Default::default()
            },
        )
        .expect("send");
    assert_eq!(s.md5_body.to_string(), "5d41402abc4b2a76b9719d911017c592");
    assert_eq!(
        s.md5_attributes.map(|d| d.to_string()).as_deref(),
        Some("235c5c510d26fb653d073faed50ae77c")
    );
    assert_eq!(s.sequence_number, None);
    assert_eq!(q.p.counters().visible, 1);
    let got = q.recv(T0 + 1, 10);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message_id, s.message_id);
    assert_eq!(
        (
            got[0].receive_count,
            got[0].first_receive_ms,
            got[0].sent_ms
        ),
        (1, T0 + 1, T0)
    );
    assert_eq!(q.p.counters().in_flight, 1);
    q.delete(T0 + 2, got[0].receipt).expect("delete");
    assert_eq!(q.p.counters(), Counters::default());
    // Deleting again is fine (SQS is idempotent), and nothing comes back.
    q.delete(T0 + 3, got[0].receipt).expect("repeated delete");
    assert!(q.recv(T0 + 60_000, 10).is_empty());
}

#[test]
fn per_message_and_queue_delays() {
    let mut q = Q::new(QueueKind::Standard, |a, _| a.delay_s = 5);
    q.body(T0, "queue-delay");
    q.send(
        T0,
        SendRequest {
            body: "own".into(),
            delay_s: Some(2),
            ..Default::default()
        },
    )
    .expect("send");
    q.send(
        T0,
        SendRequest {
            body: "none".into(),
            delay_s: Some(0),
            ..Default::default()
        },
    )
    .expect("send");
    assert_eq!(q.p.counters().delayed, 2);
    assert_eq!(q.bodies(T0, 10), ["none"]);
    assert_eq!(q.p.next_deadline_ms(), Some(T0 + 2_000));
    assert_eq!(q.bodies(T0 + 2_000, 10), ["own"]);
    assert_eq!(q.bodies(T0 + 4_999, 10), Vec::<String>::new());
    assert_eq!(q.bodies(T0 + 5_000, 10), ["queue-delay"]);
    assert!(matches!(
        q.send(
            T0,
            SendRequest {
                body: "x".into(),
                delay_s: Some(901),
                ..Default::default()
            }
        ),
        Err(EngineError::InvalidParameterValue { .. })
    ));
}

#[test]
fn lease_expiry_redelivers_with_counts() {
    let mut q = Q::std();
    q.body(T0, "m");
    let first = q.recv_with(T0, 1, Some(10), None).remove(0);
    assert!(q.recv(T0 + 9_999, 1).is_empty());
    let second = q.recv(T0 + 10_000, 1).remove(0);
    assert_eq!(second.receive_count, 2);
    assert_eq!(second.first_receive_ms, T0);
    assert_ne!(first.receipt, second.receipt);
    // CONTRACT.md C6: the stale handle cannot touch the current lease...
    assert!(matches!(
        q.change(T0 + 10_001, first.receipt, 0),
        Err(EngineError::ReceiptHandleIsInvalid(_))
    ));
    // ...and leases survive a restart (they are in the Received record).
    q.restart(T0 + 10_002);
    assert!(q.recv(T0 + 10_003, 1).is_empty());
    // On a standard queue any authentic handle deletes, as in SQS.
    q.delete(T0 + 10_004, first.receipt)
        .expect("stale delete on standard");
    assert_eq!(q.p.counters(), Counters::default());
}

/// A new leader inherits leases another node's clock granted: after its replay it pushes them
/// back by the cluster's clock-skew bound (`Partition::extend_leases`), on standard and FIFO
/// queues (where the lease is the group's lock). The holder's handle keeps working meanwhile.
#[test]
fn inherited_leases_end_later_by_the_margin_and_keep_their_handles() {
    for fifo in [false, true] {
        let mut q = if fifo { Q::fifo() } else { Q::std() };
        if fifo {
            q.fifo_send(T0, "g", "m", "d1");
            q.fifo_send(T0, "g", "n", "d2");
        } else {
            q.body(T0, "m");
        }
        let held = q.recv_with(T0, 1, Some(10), None).remove(0);
        q.restart(T0 + 1);
        assert_eq!(q.p.extend_leases(500), 1, "fifo {fifo}: one lease held");
        // Recorded to end at T0 + 10 s: still held there, and until the margin passed.
        assert!(
            q.recv(T0 + 10_000, 10).is_empty(),
            "fifo {fifo}: exposed at the recorded deadline"
        );
        assert!(
            q.recv(T0 + 10_499, 10).is_empty(),
            "fifo {fifo}: exposed inside the margin"
        );
        q.change(T0 + 10_100, held.receipt, 30)
            .expect("the holder's handle still changes its lease");
        let mut q2 = if fifo { Q::fifo() } else { Q::std() };
        if fifo {
            q2.fifo_send(T0, "g", "m", "d1");
        } else {
            q2.body(T0, "m");
        }
        q2.recv_with(T0, 1, Some(10), None);
        q2.p.extend_leases(500);
        assert_eq!(
            q2.bodies(T0 + 10_500, 10),
            vec!["m".to_string()],
            "fifo {fifo}: then exposed"
        );
        assert_eq!(q2.p.extend_leases(0), 0, "no margin, nothing changes");
    }
}

#[test]
fn change_visibility_rules() {
    let mut q = Q::std();
    q.body(T0, "m");
    let d = q.recv(T0, 1).remove(0);
    q.change(T0 + 1_000, d.receipt, 0).expect("release");
    let again = q.recv(T0 + 1_000, 1).remove(0);
    assert_eq!(again.receive_count, 2);
    // 12 h from the receive that started the lease, not from now.
    assert!(matches!(
        q.change(T0 + 2_000, again.receipt, 43_200),
        Err(EngineError::InvalidParameterValue { .. })
    ));
    q.change(T0 + 2_000, again.receipt, 43_199)
        .expect("within 12 h");
    assert!(matches!(
        q.change(T0 + 2_000, again.receipt, 43_201),
        Err(EngineError::InvalidParameterValue { .. })
    ));
    // After the lease ends the handle is not in flight.
    q.tick(T0 + 2_000 + 43_199_000);
    assert_eq!(
        q.change(T0 + 2_000 + 43_199_000, again.receipt, 5),
        Err(EngineError::MessageNotInflight)
    );
    // A handle of another partition or queue is refused.
    let other = Receipt {
        partition: 2,
        ..again.receipt
    };
    assert!(matches!(
        q.delete(T0, other),
        Err(EngineError::ReceiptHandleIsInvalid(_))
    ));
}

#[test]
fn fifo_order_and_group_lock() {
    let mut q = Q::fifo();
    q.fifo_send(T0, "A", "a1", "1");
    q.fifo_send(T0, "A", "a2", "2");
    q.fifo_send(T0, "B", "b1", "3");
    let a1 = q.recv(T0, 1).remove(0);
    assert_eq!(a1.payload.body, "a1");
    // A is locked while a1 is in flight; B goes on.
    assert_eq!(q.bodies(T0, 10), ["b1"]);
    assert!(q.recv(T0, 10).is_empty());
    q.delete(T0, a1.receipt).expect("delete a1");
    assert_eq!(q.bodies(T0, 10), ["a2"]);
}

#[test]
fn a_fifo_backlog_waits_in_its_groups_lists_and_keeps_its_order() {
    let mut q = Q::new(QueueKind::Fifo, |a, _| a.retention_s = 3_600);
    for i in 0..300 {
        q.fifo_send(
            T0 + i,
            &format!("g{}", i % 3),
            &format!("m{i}"),
            &i.to_string(),
        );
    }
    // Nothing received yet: no message has an entry, each waits as a few bytes.
    assert_eq!(q.p.waiting(), 300);
    assert!(q.p.waiting_bytes() < 300 * 16, "{}", q.p.waiting_bytes());
    assert_eq!(q.p.counters().visible, 300);
    // A receive takes a run of the first group (by its head), in order; the messages it takes
    // get entries, the others still wait.
    let got = q.recv(T0 + 1_000, 10);
    let bodies: Vec<&str> = got.iter().map(|d| d.payload.body.as_str()).collect();
    let want: Vec<String> = (0..10).map(|k| format!("m{}", k * 3)).collect();
    assert_eq!(bodies, want);
    assert_eq!(q.p.waiting(), 290);
    assert!(got
        .windows(2)
        .all(|w| w[0].sequence_number < w[1].sequence_number));
    // Its group is locked; the next receive serves g1 from its head.
    assert_eq!(q.bodies(T0 + 1_000, 1), ["m1"]);
    for d in got {
        q.delete(T0 + 1_000, d.receipt).expect("delete");
    }
    q.restart(T0 + 1_000);
    // A delayed message (queue delay set meanwhile) joins g2 behind its waiting messages, with
    // an entry: order holds.
    q.cfg.attributes.delay_s = 5;
    q.exec(
        T0 + 2_000,
        Command::SetAttributes(Box::new(q.cfg.attributes.clone())),
    )
    .expect("set attributes");
    q.fifo_send(T0 + 2_000, "g2", "late", "late");
    assert_eq!(q.p.waiting(), 289);
    let g2: Vec<String> = q.bodies(T0 + 10_000, 10);
    assert_eq!(
        g2,
        (0..10)
            .map(|k| format!("m{}", 2 + k * 3))
            .collect::<Vec<_>>()
    );
    q.restart(T0 + 10_000);
    // Retention: waiting messages expire oldest first, and their groups go with them.
    q.tick(T0 + 3_600_000 + 150);
    let c = q.p.counters();
    assert!(c.visible < 289 && c.visible > 0, "{c:?}");
    q.restart(T0 + 3_600_000 + 150);
    q.tick(T0 + 3_700_000);
    assert_eq!(q.p.waiting(), 0);
    assert_eq!(q.p.counters().visible, 0);
    q.restart(T0 + 3_700_000);
}

#[test]
fn a_purge_drops_waiting_messages_and_a_redrive_scan_sees_them() {
    let mut q = Q::new(QueueKind::Standard, |_, _| {});
    for i in 0..50 {
        q.send(
            T0,
            SendRequest {
                body: format!("m{i}"),
                group_id: Some(format!("t{}", i % 5)),
                ..Default::default()
            },
        )
        .expect("send");
    }
    assert_eq!(q.p.waiting(), 50);
    // A fair queue serves the heads of its groups in turn.
    let mut first = q.bodies(T0, 5);
    first.sort();
    assert_eq!(first, ["m0", "m1", "m2", "m3", "m4"]);
    q.restart(T0);
    q.exec(T0 + 1, Command::Purge).expect("purge");
    assert_eq!(q.p.waiting(), 0);
    assert_eq!(q.p.counters().visible, 0);
    q.restart(T0 + 1);
}

#[test]
fn fifo_receive_takes_a_run_of_one_group_and_sequence_numbers_increase() {
    let mut q = Q::fifo();
    let seqs: Vec<u64> = (0..4)
        .map(|i| {
            q.fifo_send(T0, "A", &format!("a{i}"), &i.to_string())
                .sequence_number
                .expect("FIFO seq")
        })
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(q.bodies(T0, 3), ["a0", "a1", "a2"]);
    assert!(
        q.recv(T0, 3).is_empty(),
        "group locked while its run is in flight"
    );
}

#[test]
fn fifo_stale_or_expired_handles_cannot_delete() {
    let mut q = Q::fifo();
    q.fifo_send(T0, "A", "a1", "1");
    let d = q.recv_with(T0, 1, Some(5), None).remove(0);
    q.tick(T0 + 5_000);
    assert!(matches!(
        q.delete(T0 + 5_000, d.receipt),
        Err(EngineError::ReceiptHandleIsInvalid(_))
    ));
    let d2 = q.recv(T0 + 5_000, 1).remove(0);
    assert!(matches!(
        q.delete(T0 + 5_001, d.receipt),
        Err(EngineError::ReceiptHandleIsInvalid(_))
    ));
    q.delete(T0 + 5_001, d2.receipt)
        .expect("current lease deletes");
}

#[test]
fn fifo_dedup_window_and_restart() {
    let mut q = Q::fifo();
    let first = q.fifo_send(T0, "A", "x", "d");
    let dup = q.fifo_send(T0 + 1_000, "B", "other body", "d");
    assert!(dup.duplicate);
    assert_eq!(
        (dup.message_id, dup.sequence_number),
        (first.message_id, first.sequence_number)
    );
    assert_eq!(q.p.counters().visible, 1, "a duplicate stores nothing");
    // Dedup survives deletion and restart...
    let d = q.recv(T0 + 2_000, 1).remove(0);
    q.delete(T0 + 2_000, d.receipt).expect("delete");
    q.restart(T0 + 3_000);
    assert!(
        q.fifo_send(T0 + DEDUP_WINDOW_MS - 1, "A", "x", "d")
            .duplicate
    );
    // ...and ends after 5 minutes.
    assert!(!q.fifo_send(T0 + DEDUP_WINDOW_MS, "A", "x", "d").duplicate);
}

#[test]
fn content_based_and_group_scoped_dedup() {
    let mut q = Q::new(QueueKind::Fifo, |a, _| {
        a.content_based_dedup = true;
        a.dedup_scope = DedupScope::MessageGroup;
    });
    let req = |g: &str, body: &str| SendRequest {
        body: body.into(),
        group_id: Some(g.into()),
        ..Default::default()
    };
    let a = q.send(T0, req("A", "same")).expect("send");
    assert!(q.send(T0, req("A", "same")).expect("send").duplicate);
    assert!(
        !q.send(T0, req("B", "same")).expect("send").duplicate,
        "scope is the group"
    );
    assert!(!q.send(T0, req("A", "different")).expect("send").duplicate);
    assert!(!a.duplicate);
    let mut plain = Q::fifo();
    assert!(matches!(
        plain.send(T0, req("A", "no dedup id")),
        Err(EngineError::InvalidParameterValue { .. })
    ));
    assert!(matches!(
        plain.send(
            T0,
            SendRequest {
                body: "x".into(),
                dedup_id: Some("d".into()),
                ..Default::default()
            }
        ),
        Err(EngineError::InvalidParameterValue { .. })
    ));
}

#[test]
fn attempt_id_retries_return_the_same_messages() {
    let mut q = Q::fifo();
    for i in 0..3 {
        q.fifo_send(T0, "A", &format!("a{i}"), &i.to_string());
    }
    let first = q.recv_with(T0, 2, Some(30), Some("try-1"));
    let retry = q.recv_with(T0 + 20_000, 2, Some(30), Some("try-1"));
    let handles = |v: &[Delivered]| v.iter().map(|d| d.receipt).collect::<Vec<_>>();
    assert_eq!(handles(&first), handles(&retry));
    // The retry reset the visibility timeout: still invisible at T0 + 45 s.
    assert!(q.recv(T0 + 45_000, 10).is_empty());
    // The retry survives a restart (the attempt id is in the records).
    q.restart(T0 + 46_000);
    assert_eq!(
        handles(&q.recv_with(T0 + 46_000, 2, None, Some("try-1"))),
        handles(&first)
    );
    // Once a message was deleted, the attempt id no longer replays.
    q.delete(T0 + 47_000, first[0].receipt).expect("delete");
    assert!(
        q.recv_with(T0 + 47_000, 2, None, Some("try-1")).is_empty(),
        "group still locked"
    );
}

#[test]
fn fair_queue_does_not_starve_a_small_tenant() {
    let mut q = Q::std();
    for i in 0..100 {
        q.send(
            T0,
            SendRequest {
                body: format!("big{i}"),
                group_id: Some("big".into()),
                ..Default::default()
            },
        )
        .expect("send");
    }
    q.send(
        T0 + 1,
        SendRequest {
            body: "small".into(),
            group_id: Some("small".into()),
            ..Default::default()
        },
    )
    .expect("send");
    let got = q.bodies(T0 + 2, 3);
    assert_eq!(got, ["big0", "small", "big1"]);
}

#[test]
fn dead_letter_move_is_two_step_and_idempotent() {
    let mut src = Q::new(QueueKind::Standard, |a, _| {
        a.redrive_policy = Some(RedrivePolicy {
            dead_letter_target_arn: "arn:dlq".into(),
            max_receive_count: 1,
        });
    });
    let mut dlq = Q::std();
    let sent = src.body(T0, "poison");
    src.recv_with(T0, 1, Some(1), None);
    // The second receive would exceed maxReceiveCount: the message moves instead.
    let fx = src
        .exec(
            T0 + 1_000,
            Command::Receive(ReceiveRequest {
                max_messages: 1,
                visibility_timeout_s: None,
                attempt_id: None,
            }),
        )
        .expect("receive");
    assert_eq!(fx.reply, Reply::Received(Vec::new()));
    assert!(matches!(
        fx.records[..],
        [Record {
            kind: RecordKind::DlqMoveStarted { .. },
            ..
        }]
    ));
    let mv = fx.moves[0].clone();
    // Crash before forwarding: the move is still pending after recovery, never delivered.
    src.restart(T0 + 2_000);
    assert_eq!(src.p.pending_moves(), vec![mv.clone()]);
    let mv = src.move_request(mv);
    assert!(src.recv(T0 + 2_000, 10).is_empty());
    dlq.exec(T0 + 2_000, Command::AcceptMove(mv.clone()))
        .expect("accept");
    // Crash after the DLQ accepted: re-driving does not duplicate.
    dlq.restart(T0 + 2_500);
    let again = dlq
        .exec(T0 + 2_500, Command::AcceptMove(mv.clone()))
        .expect("re-accept");
    assert!(again.records.is_empty());
    src.exec(
        T0 + 3_000,
        Command::CompleteMove {
            msg_id: mv.origin.msg_id,
        },
    )
    .expect("complete");
    assert!(src.p.pending_moves().is_empty());
    assert_eq!(src.p.counters(), Counters::default());
    let got = dlq.recv(T0 + 3_000, 10);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].message_id, got[0].sent_ms), (sent.message_id, T0));
    assert_eq!(got[0].dead_letter_source.map(|o| o.queue_id), Some(5));
}

#[test]
fn purge_and_its_interval() {
    let mut q = Q::std();
    q.body(T0, "a");
    q.body(T0, "b");
    q.exec(T0, Command::Purge).expect("purge");
    assert_eq!(q.p.counters(), Counters::default());
    assert_eq!(
        q.exec(T0 + 59_999, Command::Purge).map(|_| ()),
        Err(EngineError::PurgeQueueInProgress)
    );
    q.restart(T0 + 59_999);
    assert_eq!(
        q.exec(T0 + 59_999, Command::Purge).map(|_| ()),
        Err(EngineError::PurgeQueueInProgress)
    );
    q.exec(T0 + 60_000, Command::Purge)
        .expect("purge after 60 s");
}

#[test]
fn retention_expiry() {
    let mut q = Q::new(QueueKind::Standard, |a, _| a.retention_s = 60);
    q.body(T0, "old");
    q.body(T0 + 30_000, "new");
    assert_eq!(q.p.next_deadline_ms(), Some(T0 + 60_000));
    q.tick(T0 + 60_000);
    assert_eq!(q.p.counters().visible, 1);
    assert_eq!(q.bodies(T0 + 60_000, 10), ["new"]);
    // Shortening retention applies to messages already stored.
    let mut a = q.cfg.attributes.clone();
    a.retention_s = 61;
    q.exec(T0 + 60_000, Command::SetAttributes(Box::new(a)))
        .expect("set");
    q.restart(T0 + 60_001);
}

#[test]
fn a_quiet_partition_checkpoints_when_its_messages_expire() {
    // Messages expire with no record written after them: the next tick past the checkpoint
    // interval writes a checkpoint whose floor is past them, so compaction gets their space.
    let mut q = Q::new(QueueKind::Standard, |a, l| {
        a.retention_s = 60;
        l.checkpoint_interval_records = 1;
    });
    for i in 0..5 {
        q.body(T0, &format!("m{i}"));
    }
    q.tick(T0 + 1);
    let before = q.p.compaction_floor();
    q.tick(T0 + 60_000);
    assert_eq!(q.p.counters().visible, 0);
    q.tick(T0 + 60_000 + CHECKPOINT_INTERVAL_MS);
    let after = q.p.compaction_floor();
    assert!(after > before, "floor {before} → {after}");
    assert!(after >= 5, "every Sent is below the floor: {after}");
    // Once written, no further checkpoint is due until something changes.
    let n = q.log.len();
    q.tick(T0 + 60_000 + 3 * CHECKPOINT_INTERVAL_MS);
    assert_eq!(q.log.len(), n);
    q.restart(T0 + 60_000 + 3 * CHECKPOINT_INTERVAL_MS);
}

#[test]
fn limits_give_typed_errors() {
    let mut q = Q::new(QueueKind::Standard, |_, l| {
        l.message_entries_max = 2;
        l.waiting_messages_max = 3;
        l.inflight_max = 1;
    });
    // Entries of pinned messages (here: delayed ones) are bounded...
    let delayed = |body: &str| SendRequest {
        body: body.into(),
        delay_s: Some(5),
        ..Default::default()
    };
    q.send(T0, delayed("a")).expect("room for a");
    q.send(T0, delayed("b")).expect("room for b");
    assert!(matches!(
        q.send(T0, delayed("c")),
        Err(EngineError::OverLimit(_))
    ));
    // ...and so are the few bytes of messages waiting in their groups' lists...
    let grouped = |body: &str| SendRequest {
        body: body.into(),
        group_id: Some("g".into()),
        ..Default::default()
    };
    for b in ["d", "e", "f"] {
        q.send(T0, grouped(b)).expect("room for a grouped one");
    }
    assert!(matches!(
        q.send(T0, grouped("g")),
        Err(EngineError::OverLimit(_))
    ));
    q.tick(T0 + 5_000);
    assert_eq!(q.bodies(T0 + 5_000, 10), ["a"], "one in flight at most");
    assert_eq!(q.p.counters().visible, 4);
    q = Q::new(QueueKind::Standard, |_, l| {
        l.message_entries_max = 2;
        l.inflight_max = 1;
    });
    // ...plain ones never are: they may wait in the log only.
    for i in 0..5 {
        q.body(T0, &format!("plain {i}"));
    }
    assert_eq!(
        q.recv(T0, 10).len(),
        1,
        "the in-flight window caps the receive"
    );
    assert!(matches!(
        q.exec(
            T0,
            Command::Receive(ReceiveRequest {
                max_messages: 1,
                visibility_timeout_s: None,
                attempt_id: None
            })
        ),
        Err(EngineError::OverLimit(_))
    ));
    let mut f = Q::new(QueueKind::Fifo, |_, l| {
        l.inflight_max = 1;
        l.dedup_entries_max = 2;
    });
    f.fifo_send(T0, "A", "a", "1");
    f.fifo_send(T0, "B", "b", "2");
    assert!(matches!(
        f.send(
            T0,
            SendRequest {
                body: "c".into(),
                group_id: Some("C".into()),
                dedup_id: Some("3".into()),
                ..Default::default()
            }
        ),
        Err(EngineError::OverLimit(_))
    ));
    assert_eq!(f.recv(T0, 10).len(), 1);
    assert!(
        f.recv(T0, 10).is_empty(),
        "FIFO at its in-flight limit returns nothing, as SQS"
    );
}

#[test]
fn send_batch_rules_and_partial_failure() {
    let mut q = Q::std();
    let entry = |id: &str, body: &str| BatchEntry {
        id: id.into(),
        request: SendRequest {
            body: body.into(),
            ..Default::default()
        },
    };
    let run = |q: &mut Q, v: Vec<BatchEntry>| q.exec(T0, Command::SendBatch(v)).map(|fx| fx.reply);
    assert_eq!(run(&mut q, vec![]), Err(EngineError::EmptyBatchRequest));
    assert_eq!(
        run(
            &mut q,
            (0..11).map(|i| entry(&i.to_string(), "x")).collect()
        ),
        Err(EngineError::TooManyEntriesInBatchRequest)
    );
    assert!(matches!(
        run(&mut q, vec![entry("a b", "x")]),
        Err(EngineError::InvalidBatchEntryId(_))
    ));
    assert!(matches!(
        run(&mut q, vec![entry(&"a".repeat(81), "x")]),
        Err(EngineError::InvalidBatchEntryId(_))
    ));
    assert!(matches!(
        run(&mut q, vec![entry("a", "x"), entry("a", "y")]),
        Err(EngineError::BatchEntryIdsNotDistinct(_))
    ));
    let big = "x".repeat(600_000);
    assert!(matches!(
        run(&mut q, vec![entry("a", &big), entry("b", &big)]),
        Err(EngineError::BatchRequestTooLong { .. })
    ));
    let Ok(Reply::SentBatch(results)) = run(
        &mut q,
        vec![
            entry("ok-1", "fine"),
            entry("bad_2", "nul\u{0}"),
            entry("ok_3", "fine"),
        ],
    ) else {
        panic!("batch reply expected")
    };
    assert!(results[0].1.is_ok() && results[2].1.is_ok());
    assert!(matches!(
        results[1].1,
        Err(EngineError::InvalidMessageContents(_))
    ));
    assert_eq!(q.p.counters().visible, 2);
}

#[test]
fn replay_rejects_records_that_do_not_fit() {
    let mut q = Q::std();
    let bad = Record {
        at_ms: T0,
        kind: RecordKind::Received {
            id: 3,
            receive_count: 1,
            deadline_ms: T0,
            attempt_id: None,
            batch_start: true,
        },
    };
    assert!(q.p.replay(&bad).is_err());
    let bad = Record {
        at_ms: T0,
        kind: RecordKind::Deleted { id: 0 },
    };
    assert!(q.p.replay(&bad).is_err());
}

#[test]
fn message_size_limit_counts_attributes() {
    let mut q = Q::new(QueueKind::Standard, |a, _| a.message_size_bytes_max = 1024);
    let ok = SendRequest {
        body: "x".repeat(1024),
        ..Default::default()
    };
    q.send(T0, ok).expect("exactly the limit");
    let over = SendRequest {
        body: "x".repeat(1000),
        attributes: vec![MessageAttribute {
            name: "n".repeat(10),
            data_type: "String".into(),
            value: AttributeValue::String("v".repeat(10)),
        }],
        ..Default::default()
    };
    assert!(matches!(
        q.send(T0, over),
        Err(EngineError::InvalidParameterValue { .. })
    ));
}

fn start_moves(
    q: &mut Q,
    now: u64,
    max_messages: u32,
    destination: MoveDestination,
    from_id: u64,
) -> (MovesStarted, Vec<MoveRequest>) {
    let fx = q
        .exec(
            now,
            Command::StartMoves(StartMoves {
                max_messages,
                destination,
                from_id,
            }),
        )
        .expect("start moves");
    match fx.reply {
        Reply::MovesStarted(r) => (r, fx.moves.into_iter().map(|m| q.move_request(m)).collect()),
        r => panic!("unexpected reply {r:?}"),
    }
}

/// A queue with another id (the scenarios' default queue is 5).
fn other_queue(kind: QueueKind, queue_id: u64) -> Q {
    let mut q = Q::new(kind, |_, _| {});
    q.cfg.queue_id = queue_id;
    q.p = Partition::new(q.cfg.clone()).expect("valid config");
    q
}

#[test]
fn redrive_moves_dead_letters_back_as_fresh_messages() {
    let mut src = Q::new(QueueKind::Standard, |a, _| {
        a.redrive_policy = Some(RedrivePolicy {
            dead_letter_target_arn: "arn:dlq".into(),
            max_receive_count: 1,
        });
    });
    let mut dlq = other_queue(QueueKind::Standard, 6);
    let sent = src.body(T0, "poison");
    src.recv(T0, 1);
    assert!(src.recv(T0 + 40_000, 1).is_empty());
    let mv = src.move_request(src.p.pending_moves().remove(0));
    assert_eq!(mv.destination, MoveDestination::RedriveTarget);
    assert_eq!(mv.destination_queue(), None);
    dlq.exec(T0 + 40_000, Command::AcceptMove(mv.clone()))
        .expect("accept");
    src.exec(
        T0 + 40_000,
        Command::CompleteMove {
            msg_id: mv.origin.msg_id,
        },
    )
    .expect("complete");
    dlq.body(T0 + 41_000, "sent to the DLQ directly");

    // Back to the source: the dead letter moves, the message sent directly stays and is counted.
    let (r, moves) = start_moves(
        &mut dlq,
        T0 + 50_000,
        10,
        MoveDestination::DeadLetterSource,
        0,
    );
    assert_eq!(
        r,
        MovesStarted {
            started: 1,
            skipped_no_destination: 1,
            next_from_id: None
        }
    );
    let back = moves[0].clone();
    assert_eq!(back.destination, MoveDestination::DeadLetterSource);
    assert_eq!(back.destination_queue(), Some(5));
    assert_eq!(back.origin.queue_id, 6);
    assert_eq!(back.message_id, sent.message_id);
    // The destination is durable: a restart lists the move with it.
    dlq.restart(T0 + 50_000);
    assert_eq!(
        dlq.p
            .pending_moves()
            .into_iter()
            .map(|m| dlq.move_request(m))
            .collect::<Vec<_>>(),
        vec![back.clone()]
    );
    assert_eq!(dlq.p.counters().moving, 1);
    src.exec(T0 + 51_000, Command::AcceptMove(back.clone()))
        .expect("accept redrive");
    src.restart(T0 + 51_000);
    let again = src
        .exec(T0 + 51_500, Command::AcceptMove(back.clone()))
        .expect("re-accept redrive");
    assert!(
        again.records.is_empty(),
        "a redrive is idempotent by origin"
    );
    dlq.exec(
        T0 + 52_000,
        Command::CompleteMove {
            msg_id: back.origin.msg_id,
        },
    )
    .expect("complete redrive");
    assert!(dlq.p.pending_moves().is_empty());
    // A fresh message: receive count from 0, retention from its arrival, no dead-letter source.
    let got = src.recv(T0 + 53_000, 10);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].message_id, got[0].receive_count, got[0].sent_ms),
        (sent.message_id, 1, T0 + 51_000)
    );
    assert_eq!(got[0].dead_letter_source, None);
    src.restart(T0 + 53_000);
    // The direct message is still there, and still skipped; an explicit queue takes it.
    let (r, _) = start_moves(
        &mut dlq,
        T0 + 60_000,
        10,
        MoveDestination::DeadLetterSource,
        0,
    );
    assert_eq!((r.started, r.skipped_no_destination), (0, 1));
    let (r, moves) = start_moves(&mut dlq, T0 + 60_000, 10, MoveDestination::Queue(9), 0);
    assert_eq!((r.started, r.skipped_no_destination), (1, 0));
    assert_eq!(moves[0].destination_queue(), Some(9));
    assert_eq!(dlq.p.counters().visible, 0);
    dlq.restart(T0 + 60_000);
}

#[test]
fn redrive_steps_are_bounded_and_resume_from_a_cursor() {
    let mut dlq = other_queue(QueueKind::Standard, 6);
    for i in 0..5 {
        dlq.body(T0, &format!("m{i}"));
    }
    let leased = dlq.recv(T0, 1);
    assert_eq!(leased.len(), 1);
    let (r, moves) = start_moves(&mut dlq, T0, 2, MoveDestination::Queue(7), 0);
    assert_eq!(r.started, 2);
    let from = r.next_from_id.expect("more to look at");
    let (r2, moves2) = start_moves(&mut dlq, T0, 2, MoveDestination::Queue(7), from);
    assert_eq!((r2.started, r2.next_from_id), (2, None));
    let ids: Vec<u64> = moves
        .iter()
        .chain(&moves2)
        .map(|m| m.origin.msg_id)
        .collect();
    assert!(
        !ids.contains(&leased[0].receipt.msg_id),
        "in flight: not moved"
    );
    assert_eq!(ids.len(), 4);
    for bad in [0, MOVES_PER_COMMAND_MAX + 1] {
        let e = dlq.exec(
            T0,
            Command::StartMoves(StartMoves {
                max_messages: bad,
                destination: MoveDestination::Queue(7),
                from_id: 0,
            }),
        );
        assert!(
            matches!(e, Err(EngineError::InvalidParameterValue { .. })),
            "{e:?}"
        );
    }
    for dest in [MoveDestination::RedriveTarget, MoveDestination::Queue(6)] {
        let e = dlq.exec(
            T0,
            Command::StartMoves(StartMoves {
                max_messages: 1,
                destination: dest,
                from_id: 0,
            }),
        );
        assert!(e.is_err(), "{dest:?}");
    }
    dlq.restart(T0);
}

#[test]
fn fifo_redrive_moves_group_heads_in_order() {
    let mut dlq = other_queue(QueueKind::Fifo, 6);
    dlq.fifo_send(T0, "g", "g1", "1");
    dlq.fifo_send(T0, "g", "g2", "2");
    dlq.fifo_send(T0, "h", "h1", "3");
    dlq.fifo_send(T0, "g", "g3", "4");
    // g's head is in flight: only h moves.
    let got = dlq.recv(T0, 1);
    assert_eq!(got[0].payload.body, "g1");
    let (r, moves) = start_moves(&mut dlq, T0, 10, MoveDestination::Queue(9), 0);
    assert_eq!(r.started, 1);
    assert_eq!(moves[0].payload.body, "h1");
    // Once g1 is visible again, g leaves in order.
    dlq.change(T0, got[0].receipt, 0).expect("release");
    let (r, moves) = start_moves(&mut dlq, T0, 10, MoveDestination::Queue(9), 0);
    assert_eq!(r.started, 3);
    let bodies: Vec<&str> = moves.iter().map(|m| m.payload.body.as_str()).collect();
    assert_eq!(bodies, ["g1", "g2", "g3"]);
    dlq.restart(T0);
}

/// Replays `q`'s log from offset `cut` (as after deleting the segments below it).
fn replay_from(q: &Q, cut: u64) -> Result<Partition, ReplayError> {
    let mut fresh = Partition::new(q.cfg.clone()).expect("valid config");
    for (i, r) in q.log.iter().enumerate().skip(cut as usize) {
        fresh.replay_at(i as u64, r)?;
    }
    fresh.finish_replay(q.log.len() as u64)?;
    Ok(fresh)
}

#[test]
fn dedup_survives_compaction_and_restart() {
    let mut q = Q::new(QueueKind::Fifo, |_, l| l.checkpoint_interval_records = 4);
    let first = q.fifo_send(T0, "g", "a", "d-a");
    let got = q.recv(T0, 1);
    q.delete(T0, got[0].receipt).expect("delete");
    for i in 0..20 {
        let s = q.fifo_send(T0 + 1_000, "h", &format!("m{i}"), &format!("d{i}"));
        let got = q.recv(T0 + 1_000, 1);
        assert_eq!(got[0].message_id, s.message_id);
        q.delete(T0 + 1_000, got[0].receipt).expect("delete");
    }
    // The dedup entry of the deleted first message pins the floor at or below its Sent.
    let floor = q.p.compaction_floor();
    assert_eq!(floor, 0, "the dedup window holds the first Sent");
    // Past its window the floor moves on, and a replay from there rebuilds the same state.
    q.tick(T0 + DEDUP_WINDOW_MS + 1);
    let floor = q.p.compaction_floor();
    assert!(floor > 0);
    let fresh = replay_from(&q, floor).expect("replay from the floor");
    assert_eq!(fresh.dump(), q.p.dump());
    // Ids are never reused after compaction.
    let mut q2 = Q {
        p: fresh,
        cfg: q.cfg.clone(),
        log: q.log.clone(),
    };
    let next = q2.fifo_send(T0 + DEDUP_WINDOW_MS + 2, "g", "a", "d-a");
    assert!(!next.duplicate);
    assert!(next.sequence_number > first.sequence_number);
    assert!(next.message_id > first.message_id);
}

#[test]
fn the_dedup_table_is_bounded_keeps_other_message_ids_and_snapshots_in_order() {
    let mut q = Q::new(QueueKind::Fifo, |_, l| l.dedup_entries_max = 3);
    let sent: Vec<SentReply> = (0..3)
        .map(|i| q.fifo_send(T0 + i, "g", &format!("m{i}"), &format!("d{i}")))
        .collect();
    let dup = q.fifo_send(T0 + 10, "other", "other", "d0");
    assert!(dup.duplicate);
    assert_eq!(
        (dup.message_id, dup.sequence_number),
        (sent[0].message_id, sent[0].sequence_number)
    );
    // The bound counts entries, not messages: a fourth key is refused, a duplicate is not.
    assert!(matches!(
        q.send(
            T0 + 10,
            SendRequest {
                body: "x".into(),
                group_id: Some("g".into()),
                dedup_id: Some("d3".into()),
                ..Default::default()
            }
        ),
        Err(EngineError::OverLimit("deduplication table is full"))
    ));
    // A Sent whose MessageId is not the derived one (a record written otherwise) keeps its own.
    let foreign = MessageId([0xab; 16]);
    q.log.push(Record {
        at_ms: T0 + 20,
        kind: RecordKind::Sent(Sent {
            id: 3,
            message_id: foreign,
            visible_at_ms: T0 + 20,
            payload: std::sync::Arc::new(Payload::new(
                "f".into(),
                Vec::new(),
                Some("g".into()),
                Some("d-foreign".into()),
            )),
            origin: None,
            redriven: false,
        }),
    });
    let p = replay_from(&q, 0).expect("replay");
    // A snapshot keeps the entries in order, with the foreign id, and restores the same state.
    let bytes = p.snapshot().expect("snapshot");
    let restored = Partition::restore(q.cfg.clone(), &bytes).expect("restore");
    assert_eq!(restored.dump(), p.dump());
    let dump = p.dump();
    let lines: Vec<&str> = dump.lines().filter(|l| l.starts_with("dedup ")).collect();
    assert_eq!(lines.len(), 4, "{dump}");
    for (i, l) in lines.iter().enumerate() {
        let at = if i < 3 { T0 + i as u64 } else { T0 + 20 };
        assert!(
            l.contains(&format!(" {i} {} @", at + DEDUP_WINDOW_MS)),
            "{l}"
        );
    }
    assert!(lines[3].contains(&foreign.to_string()), "{}", lines[3]);
    for p in [p, restored] {
        let mut q = Q {
            p,
            cfg: q.cfg.clone(),
            log: q.log.clone(),
        };
        let again = q.fifo_send(T0 + 30, "g", "y", "d-foreign");
        assert!(again.duplicate);
        assert_eq!(again.message_id, foreign);
        assert_eq!(again.sequence_number, Some(3));
        // Entries expire oldest first, each five minutes after its Sent.
        q.tick(T0 + 1 + DEDUP_WINDOW_MS);
        assert!(
            !q.fifo_send(T0 + 1 + DEDUP_WINDOW_MS, "g", "z", "d0")
                .duplicate
        );
        let d2 = q.fifo_send(T0 + 1 + DEDUP_WINDOW_MS, "g", "z", "d2");
        assert_eq!(
            (d2.duplicate, d2.sequence_number),
            (true, sent[2].sequence_number)
        );
        assert!(
            q.fifo_send(T0 + 1 + DEDUP_WINDOW_MS, "g", "z", "d-foreign")
                .duplicate
        );
    }
}

#[test]
fn a_log_compacted_past_the_floor_does_not_replay() {
    let mut q = Q::new(QueueKind::Standard, |_, l| {
        l.checkpoint_interval_records = 2
    });
    let keep = q.body(T0, "kept");
    for i in 0..10 {
        q.body(T0, &format!("m{i}"));
    }
    // The first message is live: its Sent (offset 0) is needed.
    assert_eq!(q.p.compaction_floor(), 0);
    assert!(replay_from(&q, 3).is_err(), "compacted past a live message");
    assert_eq!(replay_from(&q, 0).expect("whole log").dump(), q.p.dump());
    let got = q.recv(T0, 10);
    assert!(got.iter().any(|d| d.message_id == keep.message_id));
    for d in &got {
        q.delete(T0, d.receipt).expect("delete");
    }
    q.body(T0 + 1, "late");
    let floor = q.p.compaction_floor();
    assert!(floor > 0, "{}", q.p.dump());
    for cut in 0..=floor {
        let fresh = replay_from(&q, cut).expect("any cut at or below the floor");
        assert_eq!(fresh.dump(), q.p.dump(), "cut {cut}");
    }
}
