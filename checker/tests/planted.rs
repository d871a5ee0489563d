//! Each check against a small hand-written clean history, and the same history with exactly that
//! check's anomaly planted; indeterminate calls that must pass; histories that cannot be decided;
//! malformed input; and the `sluice-check` binary's output and exit status.

use sluice_checker::{
    check, AnomalyKind, Call, Config, Delivered, Event, FifoReason, History, HistoryError, Op,
    Outcome, Record, Reply, Verdict,
};

const US_PER_MS: u64 = 1_000;
const LONG_VISIBILITY_MS: u64 = 30_000;

/// A small margin: the hand-written timelines are milliseconds apart.
fn cfg() -> Config {
    Config {
        margin_us: US_PER_MS,
        ..Config::default()
    }
}

/// Builds histories with times in milliseconds.
#[derive(Default, Clone)]
struct H {
    h: History,
}

fn delivered(id: &str, payload: &str, receipt: &str, group: Option<&str>) -> Delivered {
    Delivered {
        message_id: id.into(),
        payload: payload.into(),
        receipt: receipt.into(),
        receive_count: None,
        group: group.map(Into::into),
    }
}

impl H {
    fn op(
        &mut self,
        process: &str,
        start_ms: u64,
        end_ms: Option<u64>,
        outcome: Outcome,
        call: Call,
        reply: Option<Reply>,
    ) -> u64 {
        let id = self.h.ops.len() as u64 + 1;
        self.h.ops.push(Op {
            id,
            process: process.into(),
            start_us: start_ms * US_PER_MS,
            end_us: end_ms.map(|e| e * US_PER_MS),
            outcome,
            call,
            reply,
            error: None,
        });
        id
    }

    fn send(&mut self, p: &str, t: (u64, u64), queue: &str, payload: &str, id: &str) {
        self.send_full(p, t, queue, payload, None, None, Outcome::Ok, Some(id));
    }

    #[allow(clippy::too_many_arguments)]
    fn send_full(
        &mut self,
        p: &str,
        (s, e): (u64, u64),
        queue: &str,
        payload: &str,
        group: Option<&str>,
        dedup: Option<&str>,
        outcome: Outcome,
        id: Option<&str>,
    ) {
        let call = Call::Send {
            queue: queue.into(),
            payload: payload.into(),
            group: group.map(Into::into),
            dedup: dedup.map(Into::into),
            content_dedup: false,
            dedup_per_group: false,
        };
        let reply = id.map(|m| Reply::Send {
            message_id: m.into(),
        });
        self.op(p, s, Some(e), outcome, call, reply);
    }

    fn receive(
        &mut self,
        p: &str,
        (s, e): (u64, u64),
        queue: &str,
        vis_ms: u64,
        msgs: Vec<Delivered>,
    ) {
        let call = Call::Receive {
            queue: queue.into(),
            visibility_timeout_ms: vis_ms,
        };
        self.op(
            p,
            s,
            Some(e),
            Outcome::Ok,
            call,
            Some(Reply::Receive { messages: msgs }),
        );
    }

    fn delete(&mut self, p: &str, (s, e): (u64, u64), queue: &str, id: &str, receipt: &str) {
        let call = Call::Delete {
            queue: queue.into(),
            message_id: id.into(),
            receipt: Some(receipt.into()),
        };
        self.op(p, s, Some(e), Outcome::Ok, call, Some(Reply::Delete {}));
    }

    fn produce(&mut self, p: &str, (s, e): (u64, u64), partition: u32, payload: &str, offset: u64) {
        let call = Call::Produce {
            topic: "t".into(),
            partition,
            payload: payload.into(),
        };
        self.op(
            p,
            s,
            Some(e),
            Outcome::Ok,
            call,
            Some(Reply::Produce { offset }),
        );
    }

    fn fetch(&mut self, p: &str, (s, e): (u64, u64), from: u64, records: &[(u64, &str)]) {
        let call = Call::Fetch {
            topic: "t".into(),
            partition: 0,
            from_offset: from,
        };
        let records = records
            .iter()
            .map(|(o, p)| Record {
                offset: *o,
                payload: (*p).into(),
            })
            .collect();
        self.op(
            p,
            s,
            Some(e),
            Outcome::Ok,
            call,
            Some(Reply::Fetch { records }),
        );
    }

    fn commit(&mut self, p: &str, (s, e): (u64, u64), offset: u64, outcome: Outcome) {
        let call = Call::CommitOffset {
            group: "cg".into(),
            topic: "t".into(),
            partition: 0,
            offset,
        };
        let reply = (outcome == Outcome::Ok).then_some(Reply::CommitOffset {});
        self.op(p, s, Some(e), outcome, call, reply);
    }

    fn read_committed(&mut self, p: &str, (s, e): (u64, u64), offset: Option<u64>) {
        let call = Call::FetchCommitted {
            group: "cg".into(),
            topic: "t".into(),
            partition: 0,
        };
        self.op(
            p,
            s,
            Some(e),
            Outcome::Ok,
            call,
            Some(Reply::FetchCommitted { offset }),
        );
    }

    fn drain(&mut self, at_ms: u64) {
        self.h.drain_us = Some(at_ms * US_PER_MS);
    }

    fn kinds(&self, cfg: &Config) -> Vec<AnomalyKind> {
        check(&self.h, cfg).kinds()
    }
}

/// A clean history on a standard queue `q`, a FIFO queue `f` and a partition `t/0`, before the
/// drain (which `finish` adds: the planted tests put their own drain deliveries in between).
fn base() -> H {
    let mut h = H::default();
    h.send("c1", (0, 5), "q", "a", "m1");
    h.send("c1", (10, 15), "q", "b", "m2");
    h.receive(
        "c2",
        (20, 25),
        "q",
        LONG_VISIBILITY_MS,
        vec![delivered("m1", "a", "r1", None)],
    );
    h.delete("c2", (30, 35), "q", "m1", "r1");
    h.receive(
        "c3",
        (40, 45),
        "q",
        LONG_VISIBILITY_MS,
        vec![delivered("m2", "b", "r2", None)],
    );
    h.delete("c3", (50, 55), "q", "m2", "r2");
    h.send_full(
        "c1",
        (60, 65),
        "f",
        "f1",
        Some("g"),
        Some("d1"),
        Outcome::Ok,
        Some("mf1"),
    );
    h.send_full(
        "c1",
        (70, 75),
        "f",
        "f2",
        Some("g"),
        Some("d2"),
        Outcome::Ok,
        Some("mf2"),
    );
    h.receive(
        "c2",
        (80, 85),
        "f",
        LONG_VISIBILITY_MS,
        vec![
            delivered("mf1", "f1", "rf1", Some("g")),
            delivered("mf2", "f2", "rf2", Some("g")),
        ],
    );
    h.delete("c2", (90, 95), "f", "mf1", "rf1");
    h.delete("c2", (100, 105), "f", "mf2", "rf2");
    h.produce("c4", (110, 115), 0, "s1", 0);
    h.produce("c4", (120, 125), 0, "s2", 1);
    h.fetch("c5", (130, 135), 0, &[(0, "s1"), (1, "s2")]);
    h.commit("c5", (140, 145), 2, Outcome::Ok);
    h.read_committed("c5", (150, 155), Some(2));
    h.drain(200);
    h
}

/// The drain's last calls: empty receives and the whole partition.
fn finish(mut h: H) -> H {
    h.receive("drain", (250, 251), "q", LONG_VISIBILITY_MS, vec![]);
    h.receive("drain", (252, 253), "f", LONG_VISIBILITY_MS, vec![]);
    h.fetch("drain", (254, 255), 0, &[(0, "s1"), (1, "s2")]);
    h.fetch("drain", (255, 256), 2, &[]);
    h.read_committed("drain", (256, 257), Some(2));
    h
}

#[test]
fn the_clean_history_passes() {
    let h = finish(base());
    let report = check(&h.h, &cfg());
    assert_eq!(report.verdict, Verdict::Pass, "{}", report.to_text());
    assert!(report.to_text().contains("margin: 1000 us"));
    // The default margin too.
    assert_eq!(check(&h.h, &Config::default()).verdict, Verdict::Pass);
}

#[test]
fn a_lost_write_is_caught() {
    let mut h = base();
    h.send("c1", (16, 18), "q", "c", "m3");
    let report = check(&finish(h).h, &cfg());
    assert_eq!(
        report.kinds(),
        vec![AnomalyKind::LostWrite],
        "{}",
        report.to_text()
    );
    assert!(report.to_text().contains("m3"));
}

#[test]
fn a_double_lease_is_caught() {
    let mut h = base();
    // m1 is leased by c2 from 20 ms for 30 s (cut to 30 ms by c2's delete); c4 gets it too.
    h.receive(
        "c4",
        (21, 23),
        "q",
        LONG_VISIBILITY_MS,
        vec![delivered("m1", "a", "r1b", None)],
    );
    let report = check(&finish(h.clone()).h, &cfg());
    assert_eq!(
        report.kinds(),
        vec![AnomalyKind::DoubleLease],
        "{}",
        report.to_text()
    );
}

#[test]
fn the_margin_decides_a_close_double_lease() {
    let mut h = H::default();
    h.send("c1", (0, 1), "q", "a", "m1");
    // Leased from 2 ms for 20 ms: until 22 ms at least. The second receive ends at 15 ms.
    h.receive(
        "c2",
        (2, 3),
        "q",
        20,
        vec![delivered("m1", "a", "r1", None)],
    );
    h.receive(
        "c3",
        (5, 15),
        "q",
        LONG_VISIBILITY_MS,
        vec![delivered("m1", "a", "r2", None)],
    );
    h.delete("c3", (16, 17), "q", "m1", "r2");
    h.drain(100);
    h.receive("drain", (101, 102), "q", LONG_VISIBILITY_MS, vec![]);
    let margin = |ms| Config {
        margin_us: ms * US_PER_MS,
        ..cfg()
    };
    assert_eq!(h.kinds(&margin(6)), vec![AnomalyKind::DoubleLease]);
    // 22 ms less 7 ms is not after 15 ms: within the margin, not judged.
    assert_eq!(h.kinds(&margin(7)), vec![]);
    let report = check(&h.h, &margin(6));
    assert!(
        report.to_text().contains("margin 6000 us"),
        "{}",
        report.to_text()
    );

    // The same the other way round: the receive that started first completed last, inside the
    // lease of the one that started second (from 5 ms for 20 ms: until 25 ms).
    let mut h = H::default();
    h.send("c1", (0, 1), "q", "a", "m1");
    h.receive(
        "c2",
        (2, 15),
        "q",
        LONG_VISIBILITY_MS,
        vec![delivered("m1", "a", "r1", None)],
    );
    h.receive(
        "c3",
        (5, 6),
        "q",
        20,
        vec![delivered("m1", "a", "r2", None)],
    );
    h.delete("c3", (16, 17), "q", "m1", "r2");
    h.drain(100);
    h.receive("drain", (101, 102), "q", LONG_VISIBILITY_MS, vec![]);
    assert_eq!(h.kinds(&margin(9)), vec![AnomalyKind::DoubleLease]);
    assert_eq!(h.kinds(&margin(10)), vec![]);
}

#[test]
fn a_retried_receive_attempt_returning_the_same_lease_is_not_a_double_lease() {
    let mut h = base();
    // The same receipt as c2's receive of 20..25 ms: a retry with the same attempt id.
    h.receive(
        "c2",
        (26, 27),
        "q",
        LONG_VISIBILITY_MS,
        vec![delivered("m1", "a", "r1", None)],
    );
    assert_eq!(finish(h).kinds(&cfg()), vec![]);
}

/// `m1` leased by `c2` (receipt `r1`, from 2 ms) and then delivered to `c3` at 5..6 ms, with a
/// change of visibility on `r1` as given.
fn leased_then_changed(vis_ms: u64, change: (u64, Option<u64>), outcome: Outcome, to_ms: u64) -> H {
    let mut h = H::default();
    h.send("c1", (0, 1), "q", "a", "m1");
    h.receive(
        "c2",
        (2, 3),
        "q",
        vis_ms,
        vec![delivered("m1", "a", "r1", None)],
    );
    let cv = Call::ChangeVisibility {
        queue: "q".into(),
        message_id: "m1".into(),
        receipt: "r1".into(),
        visibility_timeout_ms: to_ms,
    };
    let reply = (outcome == Outcome::Ok).then_some(Reply::ChangeVisibility {});
    h.op("c2", change.0, change.1, outcome, cv, reply);
    h.receive(
        "c3",
        (25, 26),
        "q",
        LONG_VISIBILITY_MS,
        vec![delivered("m1", "a", "r2", None)],
    );
    h.delete("c3", (27, 28), "q", "m1", "r2");
    h.drain(100);
    h.receive("drain", (101, 102), "q", LONG_VISIBILITY_MS, vec![]);
    h
}

#[test]
fn changes_of_visibility_count_only_when_they_can_have_applied() {
    // A release that started as the second receive completed did not free the message for it.
    let h = leased_then_changed(LONG_VISIBILITY_MS, (26, Some(27)), Outcome::Ok, 0);
    assert_eq!(h.kinds(&cfg()), vec![AnomalyKind::DoubleLease]);
    // One that started before may have.
    let h = leased_then_changed(LONG_VISIBILITY_MS, (10, Some(11)), Outcome::Ok, 0);
    assert_eq!(h.kinds(&cfg()), vec![]);
    // An extension that timed out may never have applied: the 20 ms lease may have run out.
    let h = leased_then_changed(20, (4, Some(50)), Outcome::Info, 30_000);
    assert_eq!(h.kinds(&cfg()), vec![]);
    // One acknowledged inside the lease certainly applied.
    let h = leased_then_changed(20, (4, Some(5)), Outcome::Ok, 30_000);
    assert_eq!(h.kinds(&cfg()), vec![AnomalyKind::DoubleLease]);
}

#[test]
fn redelivery_after_the_lease_or_a_release_is_not_a_double_lease() {
    let mut h = H::default();
    h.send("c1", (0, 5), "q", "a", "m1");
    h.receive(
        "c2",
        (10, 11),
        "q",
        20,
        vec![delivered("m1", "a", "r1", None)],
    );
    // Expired: 10 ms + 20 ms = 30 ms before this receive ends.
    h.receive(
        "c3",
        (29, 32),
        "q",
        20,
        vec![delivered("m1", "a", "r2", None)],
    );
    // Released by an acknowledged change of visibility to 0 at 40 ms.
    let cv = Call::ChangeVisibility {
        queue: "q".into(),
        message_id: "m1".into(),
        receipt: "r2".into(),
        visibility_timeout_ms: 0,
    };
    h.op(
        "c3",
        40,
        Some(41),
        Outcome::Ok,
        cv,
        Some(Reply::ChangeVisibility {}),
    );
    h.receive(
        "c4",
        (40, 42),
        "q",
        LONG_VISIBILITY_MS,
        vec![delivered("m1", "a", "r3", None)],
    );
    h.delete("c4", (43, 44), "q", "m1", "r3");
    h.drain(100);
    h.receive("drain", (101, 102), "q", LONG_VISIBILITY_MS, vec![]);
    let report = check(
        &h.h,
        &Config {
            margin_us: 0,
            ..cfg()
        },
    );
    assert_eq!(report.verdict, Verdict::Pass, "{}", report.to_text());
}

#[test]
fn a_deleted_message_delivered_again_is_caught() {
    let mut h = base();
    h.receive(
        "c4",
        (60, 62),
        "q",
        LONG_VISIBILITY_MS,
        vec![delivered("m1", "a", "r1c", None)],
    );
    let report = check(&finish(h).h, &cfg());
    assert_eq!(
        report.kinds(),
        vec![AnomalyKind::DeletedRedelivered],
        "{}",
        report.to_text()
    );
}

#[test]
fn a_receive_overlapping_the_delete_is_not_judged() {
    let mut h = base();
    // Started before the delete (30..35 ms) was acknowledged, after the lease was cut: the
    // delete may have taken effect after it.
    h.receive(
        "c4",
        (34, 36),
        "q",
        LONG_VISIBILITY_MS,
        vec![delivered("m1", "a", "r1c", None)],
    );
    assert_eq!(finish(h).kinds(&cfg()), vec![]);
}

#[test]
fn a_fifo_group_listed_out_of_order_is_caught() {
    let mut h = base();
    let receive =
        h.h.ops
            .iter_mut()
            .find(|o| o.start_us == 80 * US_PER_MS)
            .unwrap();
    if let Some(Reply::Receive { messages }) = &mut receive.reply {
        messages.reverse();
    }
    let report = check(&finish(h).h, &cfg());
    assert_eq!(
        report.kinds(),
        vec![AnomalyKind::FifoOrder],
        "{}",
        report.to_text()
    );
    assert!(matches!(
        report.anomalies[0],
        sluice_checker::Anomaly::FifoOrder {
            reason: FifoReason::ListedBeforeEarlier,
            ..
        }
    ));
}

#[test]
fn a_fifo_message_delivered_while_an_earlier_one_waits_is_caught() {
    let mut h = base();
    h.send_full(
        "c1",
        (160, 161),
        "f",
        "h1",
        Some("h"),
        Some("e1"),
        Outcome::Ok,
        Some("mh1"),
    );
    h.send_full(
        "c1",
        (162, 163),
        "f",
        "h2",
        Some("h"),
        Some("e2"),
        Outcome::Ok,
        Some("mh2"),
    );
    // mh2 goes out while mh1, sent first, was never delivered.
    h.receive(
        "c4",
        (164, 165),
        "f",
        10,
        vec![delivered("mh2", "h2", "rh2", Some("h"))],
    );
    h.receive(
        "drain",
        (212, 213),
        "f",
        LONG_VISIBILITY_MS,
        vec![
            delivered("mh1", "h1", "rh1b", Some("h")),
            delivered("mh2", "h2", "rh2b", Some("h")),
        ],
    );
    h.delete("drain", (214, 215), "f", "mh1", "rh1b");
    h.delete("drain", (216, 217), "f", "mh2", "rh2b");
    let report = check(&finish(h).h, &cfg());
    assert_eq!(
        report.kinds(),
        vec![AnomalyKind::FifoOrder],
        "{}",
        report.to_text()
    );
    assert!(matches!(
        report.anomalies[0],
        sluice_checker::Anomaly::FifoOrder {
            reason: FifoReason::EarlierUndeleted,
            ..
        }
    ));
}

#[test]
fn a_dead_lettered_fifo_message_does_not_hold_its_group_back() {
    let mut h = H::default();
    h.send_full(
        "c1",
        (0, 1),
        "f",
        "a",
        Some("g"),
        Some("da"),
        Outcome::Ok,
        Some("ma"),
    );
    h.send_full(
        "c1",
        (2, 3),
        "f",
        "b",
        Some("g"),
        Some("db"),
        Outcome::Ok,
        Some("mb"),
    );
    // `ma` is received once and never deleted; with maxReceiveCount 1 the next receive moves it
    // to the dead-letter queue and may deliver `mb` at once.
    h.receive(
        "c2",
        (4, 5),
        "f",
        10,
        vec![delivered("ma", "a", "ra", Some("g"))],
    );
    h.receive(
        "c2",
        (20, 21),
        "f",
        10,
        vec![delivered("mb", "b", "rb", Some("g"))],
    );
    h.delete("c2", (22, 23), "f", "mb", "rb");
    h.drain(100);
    h.receive(
        "drain",
        (101, 102),
        "f-dlq",
        LONG_VISIBILITY_MS,
        vec![delivered("ma", "a", "ra2", Some("g"))],
    );
    h.delete("drain", (103, 104), "f-dlq", "ma", "ra2");
    h.receive("drain", (105, 106), "f", LONG_VISIBILITY_MS, vec![]);
    h.receive("drain", (107, 108), "f-dlq", LONG_VISIBILITY_MS, vec![]);
    let report = check(&h.h, &cfg());
    assert_eq!(report.verdict, Verdict::Pass, "{}", report.to_text());
}

#[test]
fn a_payload_nobody_sent_is_caught() {
    // A flipped bit in a delivered body.
    let mut h = base();
    let receive =
        h.h.ops
            .iter_mut()
            .find(|o| o.start_us == 40 * US_PER_MS)
            .unwrap();
    if let Some(Reply::Receive { messages }) = &mut receive.reply {
        messages[0].payload = "b-flipped".into();
    }
    let report = check(&finish(h).h, &cfg());
    assert_eq!(
        report.kinds(),
        vec![AnomalyKind::UnsentPayload],
        "{}",
        report.to_text()
    );
    // A send refused as certainly failed, delivered all the same.
    let mut h = base();
    h.send_full("c1", (16, 18), "q", "x", None, None, Outcome::Fail, None);
    h.receive(
        "drain",
        (210, 211),
        "q",
        LONG_VISIBILITY_MS,
        vec![delivered("mx", "x", "rx", None)],
    );
    h.delete("drain", (212, 213), "q", "mx", "rx");
    assert_eq!(finish(h).kinds(&cfg()), vec![AnomalyKind::UnsentPayload]);
    // A record nobody produced.
    let mut h = base();
    h.fetch("c6", (136, 137), 2, &[(2, "s9")]);
    let h = finish(h);
    assert_eq!(h.kinds(&cfg()), vec![AnomalyKind::UnsentPayload]);
}

/// A third message on `f` with dedup id `d1` (as `mf1`'s), delivered by the drain.
fn with_second_d1(message_id: &str) -> H {
    let mut h = base();
    h.send_full(
        "c1",
        (76, 77),
        "f",
        "f3",
        Some("g"),
        Some("d1"),
        Outcome::Ok,
        Some(message_id),
    );
    if message_id != "mf1" {
        h.receive(
            "drain",
            (212, 213),
            "f",
            LONG_VISIBILITY_MS,
            vec![delivered(message_id, "f3", "rf3", Some("g"))],
        );
        h.delete("drain", (214, 215), "f", message_id, "rf3");
    }
    finish(h)
}

#[test]
fn a_duplicate_inside_the_dedup_window_is_caught() {
    // The correct answer: the original's id, nothing stored.
    assert_eq!(with_second_d1("mf1").kinds(&cfg()), vec![]);
    let report = check(&with_second_d1("mf3").h, &cfg());
    assert_eq!(
        report.kinds(),
        vec![AnomalyKind::DuplicateInWindow],
        "{}",
        report.to_text()
    );
    // Outside the window (here shrunk to 10 ms; the sends are 17 ms apart) a new message is right.
    let short = Config {
        dedup_window_us: 10 * US_PER_MS,
        ..cfg()
    };
    assert_eq!(with_second_d1("mf3").kinds(&short), vec![]);
}

#[test]
fn a_content_duplicate_inside_the_window_is_caught() {
    // The same body twice in group g, stored as two messages 10 ms apart.
    assert_eq!(
        same_body_twice(["g", "g"], false).kinds(&cfg()),
        vec![AnomalyKind::DuplicateInWindow]
    );
    assert_eq!(
        same_body_twice(["g", "g"], true).kinds(&cfg()),
        vec![AnomalyKind::DuplicateInWindow]
    );
    // In two groups: a duplicate only if the queue deduplicates across groups.
    assert_eq!(
        same_body_twice(["g", "h"], false).kinds(&cfg()),
        vec![AnomalyKind::DuplicateInWindow]
    );
    assert_eq!(same_body_twice(["g", "h"], true).kinds(&cfg()), vec![]);
}

fn same_body_twice(groups: [&str; 2], dedup_per_group: bool) -> H {
    let mut h = H::default();
    for (i, (s, id)) in [(0, "m1"), (10, "m2")].into_iter().enumerate() {
        let group = groups[i];
        let call = Call::Send {
            queue: "f".into(),
            payload: "same body".into(),
            group: Some(group.into()),
            dedup: None,
            content_dedup: true,
            dedup_per_group,
        };
        let reply = Reply::Send {
            message_id: id.into(),
        };
        h.op("c1", s, Some(s + 5), Outcome::Ok, call, Some(reply));
        let t = 100 + i as u64 * 10;
        let d = vec![delivered(id, "same body", id, Some(group))];
        h.receive("c2", (t, t + 1), "f", LONG_VISIBILITY_MS, d);
        h.delete("c2", (t + 2, t + 3), "f", id, id);
    }
    h.drain(200);
    h.receive("drain", (201, 202), "f", LONG_VISIBILITY_MS, vec![]);
    h
}

#[test]
fn two_fetches_disagreeing_about_an_offset_are_caught() {
    let mut h = base();
    // `s1` is a record of this partition, but at offset 0.
    h.fetch("c6", (136, 137), 1, &[(1, "s1")]);
    let report = check(&finish(h).h, &cfg());
    assert_eq!(
        report.kinds(),
        vec![AnomalyKind::OffsetConflict],
        "{}",
        report.to_text()
    );
}

#[test]
fn a_produce_acknowledged_at_a_taken_offset_is_caught() {
    let mut h = base();
    h.produce("c4", (126, 127), 0, "s3", 1);
    let report = check(&finish(h).h, &cfg());
    assert_eq!(
        report.kinds(),
        vec![AnomalyKind::OffsetConflict, AnomalyKind::LostProduce],
        "{}",
        report.to_text()
    );
}

#[test]
fn a_lost_produce_is_caught() {
    let mut h = base();
    h.produce("c4", (126, 127), 0, "s3", 2);
    let report = check(&finish(h).h, &cfg());
    assert_eq!(
        report.kinds(),
        vec![AnomalyKind::LostProduce],
        "{}",
        report.to_text()
    );
}

#[test]
fn a_committed_offset_going_back_is_caught() {
    let mut h = base();
    h.read_committed("c6", (160, 161), Some(1));
    let report = check(&finish(h.clone()).h, &cfg());
    assert_eq!(
        report.kinds(),
        vec![AnomalyKind::CommittedOffsetBack],
        "{}",
        report.to_text()
    );
    // Going back to nothing at all, too.
    let mut none = base();
    none.read_committed("c6", (160, 161), None);
    assert_eq!(
        finish(none).kinds(&cfg()),
        vec![AnomalyKind::CommittedOffsetBack]
    );
    // A commit of 1 that may have landed after the commit of 2 explains the read.
    h.commit("c7", (146, 170), 1, Outcome::Info);
    let report = check(&finish(h).h, &cfg());
    assert_eq!(report.verdict, Verdict::Pass, "{}", report.to_text());
}

#[test]
fn indeterminate_calls_pass_either_way_and_are_counted() {
    let mut h = base();
    // Timed out and never stored.
    h.send_full("c1", (16, 18), "q", "x", None, None, Outcome::Info, None);
    // Timed out but stored: the drain finds it.
    h.send_full("c1", (19, 21), "q", "y", None, None, Outcome::Info, None);
    // Refused.
    h.send_full("c1", (22, 23), "q", "z", None, None, Outcome::Fail, None);
    // Never completed (the client died).
    let call = Call::Send {
        queue: "q".into(),
        payload: "w".into(),
        group: None,
        dedup: None,
        content_dedup: false,
        dedup_per_group: false,
    };
    h.op("c8", 24, None, Outcome::Info, call, None);
    // A receive that timed out: whatever it leased is not seen.
    let call = Call::Receive {
        queue: "q".into(),
        visibility_timeout_ms: LONG_VISIBILITY_MS,
    };
    h.op("c9", 26, Some(90), Outcome::Info, call, None);
    h.commit("c5", (146, 148), 3, Outcome::Info);
    h.produce("c4", (116, 117), 0, "lost-ack", 99);
    h.h.ops.last_mut().unwrap().outcome = Outcome::Info;
    h.h.ops.last_mut().unwrap().reply = None;
    h.receive(
        "drain",
        (210, 211),
        "q",
        LONG_VISIBILITY_MS,
        vec![delivered("my", "y", "ry", None)],
    );
    h.delete("drain", (212, 213), "q", "my", "ry");
    let report = check(&finish(h).h, &cfg());
    assert_eq!(report.verdict, Verdict::Pass, "{}", report.to_text());
    assert_eq!(report.indeterminate.sends, 3);
    assert_eq!(report.indeterminate.sends_seen_delivered, 1);
    assert_eq!(report.indeterminate.produces, 1);
    assert_eq!(report.indeterminate.never_completed, 1);
    assert_eq!(report.operations["send"].fail, 1);
    assert_eq!(report.operations["send"].info, 3);
    assert_eq!(report.operations["send"].ok, 4);
}

#[test]
fn without_a_drain_the_checker_says_it_cannot_decide() {
    let mut h = finish(base());
    h.h.drain_us = None;
    let report = check(&h.h, &cfg());
    assert_eq!(report.verdict, Verdict::Undecided, "{}", report.to_text());
    for check in [
        "lost writes: no drain marker",
        "lost produces: no drain marker",
    ] {
        assert!(
            report.undecided.iter().any(|u| u.contains(check)),
            "{check}"
        );
    }
    assert!(report.to_text().contains("UNDECIDED"));
    // A drain that never received from `q` cannot judge `q` either.
    let mut h = base();
    h.receive("drain", (252, 253), "f", LONG_VISIBILITY_MS, vec![]);
    h.fetch("drain", (254, 255), 0, &[(0, "s1"), (1, "s2")]);
    let report = check(&h.h, &cfg());
    assert_eq!(report.verdict, Verdict::Undecided, "{}", report.to_text());
    assert!(report.undecided.iter().any(|u| u.contains("queue q")));
    // Nor a drain that never fetched the partition.
    let mut h = base();
    h.receive("drain", (250, 251), "q", LONG_VISIBILITY_MS, vec![]);
    h.receive("drain", (252, 253), "f", LONG_VISIBILITY_MS, vec![]);
    let report = check(&h.h, &cfg());
    assert_eq!(report.verdict, Verdict::Undecided, "{}", report.to_text());
    assert!(report.undecided.iter().any(|u| u.contains("t/0")));
    // Nor a drain that stopped before a receive came back empty: what it left is not lost.
    let mut h = base();
    h.send("c1", (16, 18), "q", "c", "m3");
    h.send("c1", (19, 20), "q", "d", "m4");
    h.receive(
        "drain",
        (250, 251),
        "q",
        LONG_VISIBILITY_MS,
        vec![delivered("m3", "c", "r", None)],
    );
    h.receive("drain", (252, 253), "f", LONG_VISIBILITY_MS, vec![]);
    h.fetch("drain", (254, 255), 0, &[(0, "s1"), (1, "s2")]);
    h.fetch("drain", (255, 256), 2, &[]);
    let report = check(&h.h, &cfg());
    assert_eq!(report.verdict, Verdict::Undecided, "{}", report.to_text());
    assert!(report
        .undecided
        .iter()
        .any(|u| u.contains("did not finish")));
    // Nor fetches that stopped before an acknowledged offset.
    let mut h = base();
    h.produce("c4", (126, 127), 0, "s3", 2);
    h.receive("drain", (250, 251), "q", LONG_VISIBILITY_MS, vec![]);
    h.receive("drain", (252, 253), "f", LONG_VISIBILITY_MS, vec![]);
    h.fetch("drain", (254, 255), 0, &[(0, "s1"), (1, "s2")]);
    let report = check(&h.h, &cfg());
    assert_eq!(report.verdict, Verdict::Undecided, "{}", report.to_text());
    assert!(report.undecided.iter().any(|u| u.contains("t/0")));
}

#[test]
fn the_json_lines_schema_reads_what_python_writes() {
    let text = r#"
{"event":"invoke","op":1,"process":"py-1","time_us":1000,"call":{"type":"send","queue":"q","payload":"p1"}}
{"event":"complete","op":1,"time_us":2000,"outcome":"ok","result":{"type":"send","message_id":"m1"}}
{"event":"invoke","op":2,"process":"py-2","time_us":3000,"call":{"type":"send","queue":"q","payload":"p2"}}
{"event":"complete","op":2,"time_us":9000,"outcome":"info","error":"timeout"}
{"event":"drain","time_us":10000}
{"event":"invoke","op":3,"process":"py-1","time_us":11000,"call":{"type":"receive","queue":"q","visibility_timeout_ms":30000}}
{"event":"complete","op":3,"time_us":12000,"outcome":"ok","result":{"type":"receive","messages":[{"message_id":"m1","payload":"p1","receipt":"r1","receive_count":1}]}}
{"event":"invoke","op":4,"process":"py-1","time_us":13000,"call":{"type":"delete","queue":"q","message_id":"m1","receipt":"r1"}}
{"event":"complete","op":4,"time_us":14000,"outcome":"ok"}
{"event":"invoke","op":5,"process":"py-1","time_us":15000,"call":{"type":"receive","queue":"q","visibility_timeout_ms":30000}}
{"event":"complete","op":5,"time_us":16000,"outcome":"ok","result":{"type":"receive","messages":[]}}
"#;
    let h = History::from_jsonl(text.as_bytes()).expect("parses");
    assert_eq!(h.ops.len(), 5);
    let report = check(&h, &cfg());
    assert_eq!(report.verdict, Verdict::Pass, "{}", report.to_text());
    assert_eq!(report.indeterminate.sends, 1);
}

#[test]
fn malformed_histories_get_typed_errors() {
    let parse = |t: &str| History::from_jsonl(t.as_bytes());
    let invoke = r#"{"event":"invoke","op":1,"process":"p","time_us":5,"call":{"type":"produce","topic":"t","partition":0,"payload":"x"}}"#;
    assert!(matches!(
        parse(r#"{"event":"complete","op":9,"time_us":1,"outcome":"ok"}"#),
        Err(HistoryError::CompleteWithoutInvoke { line: 1, op: 9 })
    ));
    assert!(matches!(
        parse(&format!("{invoke}\n{invoke}")),
        Err(HistoryError::DuplicateInvoke { line: 2, op: 1 })
    ));
    assert!(matches!(
        parse(&format!(
            "{invoke}\n{}",
            r#"{"event":"complete","op":1,"time_us":6,"outcome":"ok","result":{"type":"send","message_id":"m"}}"#
        )),
        Err(HistoryError::ReplyMismatch { line: 2, .. })
    ));
    assert!(matches!(
        parse(&format!(
            "{invoke}\n{}",
            r#"{"event":"complete","op":1,"time_us":6,"outcome":"ok"}"#
        )),
        Err(HistoryError::MissingReply { line: 2, .. })
    ));
    assert!(matches!(
        parse(&format!(
            "{invoke}\n{}",
            r#"{"event":"complete","op":1,"time_us":4,"outcome":"fail"}"#
        )),
        Err(HistoryError::EndBeforeStart { line: 2, .. })
    ));
    assert!(matches!(
        parse(
            r#"{"event":"invoke","op":1,"process":"p","time_us":5,"call":{"type":"send","queue":"q","payload":"x","colour":"red"}}"#
        ),
        Err(HistoryError::Parse { line: 1, .. })
    ));
    assert!(matches!(
        parse("{\"event\":\"drain\",\"time_us\":1}\n{\"event\":\"drain\",\"time_us\":2}"),
        Err(HistoryError::DuplicateDrain { line: 2, .. })
    ));
}

fn run_cli(history: &H, args: &[&str]) -> (i32, String) {
    let dir = std::env::temp_dir().join(format!("sluice-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("{}.jsonl", args.join("_").replace('-', "")));
    let text: String = history
        .h
        .to_events()
        .iter()
        .map(|e: &Event| serde_json::to_string(e).expect("serializes") + "\n")
        .collect();
    std::fs::write(&path, text).expect("write history");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-check"))
        .arg(&path)
        .args(args)
        .output()
        .expect("runs sluice-check");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_binary_prints_the_report_and_exits_by_verdict() {
    let (code, text) = run_cli(&finish(base()), &["--margin-ms", "1"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("verdict: PASS") && text.contains("margin: 1000 us"),
        "{text}"
    );

    let mut lost = base();
    lost.send("c1", (16, 18), "q", "c", "m3");
    let (code, json) = run_cli(&finish(lost), &["--json"]);
    assert_eq!(code, 1, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("--json prints JSON");
    assert_eq!(v["verdict"], "fail");
    assert_eq!(v["anomalies"][0]["kind"], "lost_write");
    assert_eq!(v["margin_us"], 100_000);

    let mut undrained = finish(base());
    undrained.h.drain_us = None;
    assert_eq!(run_cli(&undrained, &[]).0, 2);
    assert_eq!(run_cli(&undrained, &["--margin-ms", "soon"]).0, 3);
}
