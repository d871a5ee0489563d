//! Unit tests of the core against hand-made messages: bad input, identity checks, coalescing.

use crate::*;
use bytes::Bytes;

const DISKS: [DiskId; 3] = [DiskId(11), DiskId(22), DiskId(33)];

fn cfg() -> Config {
    Config {
        heartbeat_interval_ms: 50,
        election_timeout_ms: 300,
        ..Config::default()
    }
}

fn membership() -> Membership {
    let replicas: Vec<Replica> = (0..3)
        .map(|i| Replica {
            node: i as u64 + 1,
            disk: DISKS[i],
        })
        .collect();
    Membership::voters(&replicas)
}

fn restore(node: NodeId) -> Restore {
    Restore {
        node,
        hard_state: HardState {
            term: 0,
            vote: None,
            disk: DISKS[(node - 1) as usize],
        },
        base: Some(SnapshotMeta {
            offset: 0,
            term: 0,
            membership: membership(),
        }),
        log_end: 0,
        term_starts: vec![],
        configs: vec![],
    }
}

fn msg(from: NodeId, to: NodeId, term: Term, body: Body) -> Message {
    Message {
        group: 0,
        from,
        to,
        term,
        body,
    }
}

/// Node 1 as the serving leader of term 2 (its no-op committed on node 2).
fn leader() -> RaftGroup {
    let mut g = RaftGroup::new(0, cfg(), restore(1), 0, 1).unwrap();
    assert!(g.campaign_now());
    let vote = |pre| Body::VoteResp {
        pre,
        granted: true,
        disk: DISKS[1],
    };
    g.step(1, msg(2, 1, 1, vote(true))).unwrap();
    g.step(1, msg(2, 1, 1, vote(false))).unwrap();
    assert_eq!(g.role(), RaftRole::Leader);
    let r = g.ready();
    g.on_flushed(r.log_epoch, 1);
    let ack = Body::AppendResp {
        disk: DISKS[1],
        appended: 1,
        flushed: 1,
        reject: None,
    };
    g.step(2, msg(2, 1, 1, ack)).unwrap();
    assert!(g.is_serving());
    g.ready();
    g
}

fn follower(node: NodeId) -> RaftGroup {
    RaftGroup::new(0, cfg(), restore(node), 0, node).unwrap()
}

fn entry(offset: Offset, count: u32, term: Term) -> Entry {
    Entry {
        offset,
        count,
        term,
        kind: EntryKind::Data,
        data: Bytes::from_static(b"batch"),
    }
}

#[test]
fn malformed_appends_are_errors_and_change_nothing() {
    let mut f = follower(2);
    let bad = [
        // Not contiguous.
        vec![entry(0, 2, 1), entry(3, 1, 1)],
        // Empty batch.
        vec![entry(0, 0, 1)],
        // Entry from a term above the message's.
        vec![entry(0, 1, 5)],
        // Terms going backwards.
        vec![entry(0, 1, 1), entry(1, 1, 0)],
    ];
    for entries in bad {
        let body = Body::Append {
            prev_offset: 0,
            prev_term: 0,
            entries,
            commit: 0,
        };
        let r = f.step(1, msg(1, 2, 1, body));
        assert!(matches!(r, Err(StepError::MalformedAppend(_))), "{r:?}");
        assert_eq!(f.log_end(), 0);
        assert_eq!(f.commit(), 0);
    }
}

#[test]
fn a_deposed_leader_learns_the_newer_term_from_its_follower() {
    let mut f = follower(2);
    f.step(
        0,
        msg(
            3,
            2,
            5,
            Body::Append {
                prev_offset: 0,
                prev_term: 0,
                entries: vec![],
                commit: 0,
            },
        ),
    )
    .unwrap();
    f.ready();
    let old = Body::Append {
        prev_offset: 0,
        prev_term: 0,
        entries: vec![entry(0, 1, 3)],
        commit: 1,
    };
    f.step(1, msg(1, 2, 3, old)).unwrap();
    let r = f.ready();
    assert_eq!(f.log_end(), 0, "nothing appended from a stale term");
    assert!(r
        .messages
        .iter()
        .any(|m| m.to == 1 && m.term == 5 && matches!(m.body, Body::AppendResp { .. })));
    let mut l = leader();
    let resp = Body::AppendResp {
        disk: DISKS[1],
        appended: 0,
        flushed: 0,
        reject: Some(0),
    };
    l.step(3, msg(2, 1, 9, resp)).unwrap();
    assert_eq!(l.role(), RaftRole::Follower);
    assert_eq!(l.term(), 9);
}

#[test]
fn a_replica_with_an_empty_disk_never_campaigns_and_its_vote_is_not_counted() {
    let mut r = restore(2);
    r.base = None;
    r.hard_state.disk = DiskId(999);
    let mut f = RaftGroup::new(0, cfg(), r, 0, 3).unwrap();
    assert!(!f.campaign_now());
    f.tick(100_000);
    assert_eq!(
        f.role(),
        RaftRole::Follower,
        "no campaign with an empty disk"
    );

    // Node 1 campaigns; node 2 answers from a replacement disk: not counted.
    let mut c = follower(1);
    assert!(c.campaign_now());
    let granted = |disk| Body::VoteResp {
        pre: true,
        granted: true,
        disk,
    };
    c.step(1, msg(2, 1, 1, granted(DiskId(999)))).unwrap();
    assert_eq!(c.role(), RaftRole::PreCandidate);
    c.step(1, msg(2, 1, 1, granted(DISKS[1]))).unwrap();
    assert_eq!(c.role(), RaftRole::Candidate);
}

#[test]
fn a_replica_that_knows_it_was_replaced_does_not_vote() {
    let mut r = restore(2);
    r.hard_state.disk = DiskId(999); // the membership lists node 2 on DISKS[1]
    let mut f = RaftGroup::new(0, cfg(), r, 0, 3).unwrap();
    let vote = Body::Vote {
        pre: false,
        transfer: false,
        disk: DISKS[0],
        last_offset: 0,
        last_term: 0,
    };
    f.step(1, msg(1, 2, 1, vote)).unwrap();
    let r = f.ready();
    assert!(r
        .messages
        .iter()
        .all(|m| !matches!(m.body, Body::VoteResp { granted: true, .. })));
    assert_eq!(f.hard_state().vote, None);
}

#[test]
fn a_candidate_on_a_replaced_disk_gets_no_vote() {
    let mut f = follower(2);
    let vote = Body::Vote {
        pre: true,
        transfer: false,
        disk: DiskId(12345), // node 3, but not the disk the membership lists
        last_offset: 100,
        last_term: 1,
    };
    f.step(1_000, msg(3, 2, 1, vote)).unwrap();
    let r = f.ready();
    assert!(r
        .messages
        .iter()
        .any(|m| matches!(m.body, Body::VoteResp { granted: false, .. })));
}

#[test]
fn proposals_need_a_confirmed_term_and_respect_limits() {
    let mut f = follower(2);
    assert!(matches!(
        f.propose(Bytes::from_static(b"x"), 1),
        Err(ProposeError::NotLeader { .. })
    ));
    let mut l = leader();
    assert_eq!(
        l.propose(Bytes::from_static(b"x"), 0),
        Err(ProposeError::EmptyBatch)
    );
    let too_big = Bytes::from(vec![0u8; cfg().max_entry_bytes + 1]);
    assert_eq!(
        l.propose(too_big, 1),
        Err(ProposeError::BatchTooLarge {
            size_bytes: cfg().max_entry_bytes + 1,
            limit_bytes: cfg().max_entry_bytes
        })
    );
    assert_eq!(l.log_end(), 1, "a refused batch is not appended");
    let p = l.propose(Bytes::from_static(b"ok"), 3).unwrap();
    assert_eq!((p.offset, p.end), (1, 4));
    let r = l.ready();
    assert_eq!(r.entries.len(), 1);
    assert!(
        r.entries[0].data == Bytes::from_static(b"ok"),
        "bytes passed through"
    );
    l.on_appended(r.log_epoch, 4);
    let ack = Body::AppendResp {
        disk: DISKS[2],
        appended: 4,
        flushed: 4,
        reject: None,
    };
    l.step(5, msg(3, 1, 1, ack)).unwrap();
    assert_eq!(l.commit(), 1, "the leader counts itself only once flushed");
    l.on_flushed(r.log_epoch, 4);
    let r = l.ready();
    assert_eq!(l.commit(), 4);
    assert_eq!(r.committed, vec![p]);
}

#[test]
fn restore_rejects_inconsistent_state() {
    let mut r = restore(1);
    r.log_end = 10;
    r.term_starts = vec![(3, 5), (2, 7)];
    r.hard_state.term = 5;
    assert!(RaftGroup::new(0, cfg(), r.clone(), 0, 1).is_err());
    r.term_starts = vec![(3, 5)];
    r.hard_state.term = 2;
    assert!(RaftGroup::new(0, cfg(), r.clone(), 0, 1).is_err());
    r.hard_state.term = 3;
    assert!(RaftGroup::new(0, cfg(), r, 0, 1).is_ok());
}

#[test]
fn membership_decoding_is_bounded_and_checked() {
    let m = membership();
    assert_eq!(Membership::decode(&m.encode()).unwrap(), m);
    let b = m.encode();
    assert_eq!(
        Membership::decode(&b[..b.len() - 1]),
        Err(DecodeError::Truncated)
    );
    let mut bad = b.to_vec();
    bad[2 + 24] = 7;
    assert_eq!(Membership::decode(&bad), Err(DecodeError::BadRole(7)));
    assert_eq!(
        Membership::decode(&[0xff, 0xff]),
        Err(DecodeError::TooManyMembers(0xffff))
    );
    let dup = Membership {
        members: vec![m.members[0], m.members[0]],
    };
    assert_eq!(
        Membership::decode(&dup.encode()),
        Err(DecodeError::DuplicateNode(1))
    );
}

#[test]
fn registry_rejects_unknown_groups_and_misaddressed_messages() {
    let mut mr = MultiRaft::new(2, cfg());
    mr.add_group(0, restore(2), 0, 1).unwrap();
    assert_eq!(
        mr.add_group(0, restore(2), 0, 1),
        Err(StepError::GroupExists(0))
    );
    let m = |group, to| {
        Envelope::Group(Message {
            group,
            from: 1,
            to,
            term: 1,
            body: Body::TimeoutNow,
        })
    };
    assert_eq!(mr.step(0, m(7, 2)), Err(StepError::UnknownGroup(7)));
    assert_eq!(
        mr.step(0, m(0, 3)),
        Err(StepError::WrongNode { to: 3, me: 2 })
    );
}

/// 1,000 groups led here produce one heartbeat per peer per interval, not 1,000.
#[test]
fn heartbeats_are_coalesced_per_peer() {
    let mut mr = MultiRaft::new(1, cfg());
    for gid in 0..1_000 {
        mr.add_group(gid, restore(1), 0, gid).unwrap();
        let g = mr.group_mut(gid).unwrap();
        *g = leader_with_id(gid);
    }
    mr.ready();
    mr.tick(100);
    let r = mr.ready();
    let hbs: Vec<&Heartbeat> = r
        .messages
        .iter()
        .filter_map(|m| match m {
            Envelope::Heartbeat(h) => Some(h),
            _ => None,
        })
        .collect();
    assert_eq!(hbs.len(), 2);
    assert!(hbs.iter().all(|h| h.groups.len() == 1_000));
    // Until the interval passes, no more.
    mr.tick(120);
    assert!(mr.ready().messages.is_empty());

    // The follower side answers all of them in one message.
    let mut f = MultiRaft::new(2, cfg());
    for gid in 0..1_000 {
        f.add_group(gid, restore(2), 0, gid).unwrap();
    }
    f.step(100, Envelope::Heartbeat(hbs[0].clone())).unwrap();
    let r = f.ready();
    let resps: Vec<&HeartbeatResp> = r
        .messages
        .iter()
        .filter_map(|m| match m {
            Envelope::HeartbeatResp(h) => Some(h),
            _ => None,
        })
        .collect();
    assert_eq!(resps.len(), 1);
    assert_eq!(resps[0].groups.len(), 1_000);
    assert!(f.groups().all(|g| g.leader() == Some(1)));
}

fn leader_with_id(gid: GroupId) -> RaftGroup {
    let mut g = RaftGroup::new(gid, cfg(), restore(1), 0, gid).unwrap();
    assert!(g.campaign_now());
    let vote = |pre| Body::VoteResp {
        pre,
        granted: true,
        disk: DISKS[1],
    };
    let m = |body| Message {
        group: gid,
        from: 2,
        to: 1,
        term: 1,
        body,
    };
    g.step(1, m(vote(true))).unwrap();
    g.step(1, m(vote(false))).unwrap();
    assert_eq!(g.role(), RaftRole::Leader);
    g
}

/// `max_append_bytes` is a packing limit, not a size limit: a batch above it is accepted and
/// travels alone in its own append; smaller ones around it are packed together.
#[test]
fn a_batch_above_max_append_bytes_travels_alone() {
    let mut l = leader();
    let max = cfg().max_append_bytes;
    // Node 2 stops answering (probe paused), so several batches queue up for it.
    let sizes = [100, max + 1, 100, 100];
    for (i, &len) in sizes.iter().enumerate() {
        l.propose(Bytes::from(vec![i as u8; len]), 1).unwrap();
    }
    let r = l.ready();
    l.on_flushed(r.log_epoch, 5);
    let appends = |r: &Ready, to: NodeId| -> Vec<Vec<usize>> {
        r.messages
            .iter()
            .filter(|m| m.to == to)
            .filter_map(|m| match &m.body {
                Body::Append { entries, .. } if !entries.is_empty() => {
                    Some(entries.iter().map(|e| e.data.len()).collect())
                }
                _ => None,
            })
            .collect()
    };
    // Node 3 never answered: probe it now from the start, as after a reject.
    let reject = Body::AppendResp {
        disk: DISKS[2],
        appended: 0,
        flushed: 0,
        reject: Some(1),
    };
    l.step(3, msg(3, 1, 1, reject)).unwrap();
    let r = l.ready();
    assert_eq!(appends(&r, 3), vec![vec![100]], "probe: one append");
    let ack = |appended| Body::AppendResp {
        disk: DISKS[2],
        appended,
        flushed: appended,
        reject: None,
    };
    l.step(4, msg(3, 1, 1, ack(2))).unwrap();
    let r = l.ready();
    assert_eq!(
        appends(&r, 3),
        vec![vec![max + 1], vec![100, 100]],
        "the large batch alone, then the small ones packed"
    );
}

/// A round with more groups than one message may carry (the codec's bound) is split.
#[test]
fn heartbeats_split_at_the_codec_bound() {
    let mut mr = MultiRaft::new(1, cfg());
    let n = HEARTBEAT_GROUPS_MAX as u64 + 1;
    for gid in 0..n {
        mr.add_group(gid, restore(1), 0, gid).unwrap();
        *mr.group_mut(gid).unwrap() = leader_with_id(gid);
    }
    mr.ready();
    mr.tick(100);
    let mut sizes: Vec<(NodeId, usize)> = mr
        .ready()
        .messages
        .iter()
        .filter_map(|m| match m {
            Envelope::Heartbeat(h) => Some((h.to, h.groups.len())),
            _ => None,
        })
        .collect();
    sizes.sort();
    assert_eq!(
        sizes,
        vec![
            (2, 1),
            (2, HEARTBEAT_GROUPS_MAX),
            (3, 1),
            (3, HEARTBEAT_GROUPS_MAX)
        ]
    );
}

// ---- Heartbeat answers: late ones change nothing, fresh ones still repair -------------------

/// Node 1 leading group 0 in a registry, node 2 acknowledged up to the no-op (offset 1).
fn registry_leader() -> MultiRaft {
    let mut mr = MultiRaft::new(1, cfg());
    mr.add_group(0, restore(1), 0, 0).unwrap();
    *mr.group_mut(0).unwrap() = leader();
    mr.ready();
    mr
}

/// One heartbeat round at `now_ms`: the heartbeat sent to `to`.
fn heartbeat_round(mr: &mut MultiRaft, now_ms: u64, to: NodeId) -> Heartbeat {
    mr.tick(now_ms);
    mr.ready()
        .messages
        .into_iter()
        .find_map(|m| match m {
            Envelope::Heartbeat(h) if h.to == to => Some(h),
            _ => None,
        })
        .expect("a heartbeat round")
}

/// Node 2's answer to `hb`, reporting `appended` (and as much flushed).
fn answer(hb: &Heartbeat, appended: Offset) -> Envelope {
    Envelope::HeartbeatResp(HeartbeatResp {
        from: 2,
        to: 1,
        sent_ms: hb.sent_ms,
        groups: vec![HeartbeatRespGroup {
            group: 0,
            term: 1,
            disk: DISKS[1],
            appended,
            flushed: appended,
        }],
    })
}

fn ack_from_2(appended: Offset) -> Envelope {
    Envelope::Group(msg(
        2,
        1,
        1,
        Body::AppendResp {
            disk: DISKS[1],
            appended,
            flushed: appended,
            reject: None,
        },
    ))
}

/// (first offset of each append with entries, whether any empty probe) sent to node 2.
fn appends_to_2(r: &MultiReady) -> (Vec<Offset>, bool) {
    let mut firsts = Vec::new();
    let mut probe = false;
    for m in &r.messages {
        if let Envelope::Group(Message {
            to: 2,
            body: Body::Append { entries, .. },
            ..
        }) = m
        {
            match entries.first() {
                Some(e) => firsts.push(e.offset),
                None => probe = true,
            }
        }
    }
    (firsts, probe)
}

/// A heartbeat answer that arrives late — after acknowledgements of appends sent after it was
/// written — reports an older position than the leader knows. It must not move the follower's
/// progress back, make the leader probe, or re-send from an older offset; nor may a duplicate
/// of it (two answers in a row without progress look like a lost append).
#[test]
fn a_late_heartbeat_answer_forces_no_reprobe_or_resend() {
    let mut mr = registry_leader();
    let hb = heartbeat_round(&mut mr, 10, 2);
    let late = answer(&hb, 1); // written by node 2 now, delivered below

    mr.propose(0, Bytes::from_static(b"first"), 2).unwrap(); // [1, 3)
    let r = mr.ready();
    let (epoch, _) = (r.groups[0].1.log_epoch, ());
    mr.on_flushed(0, epoch, 3).unwrap();
    mr.step(12, ack_from_2(3)).unwrap();
    mr.propose(0, Bytes::from_static(b"second"), 2).unwrap(); // [3, 5), in flight
    let r = mr.ready();
    assert_eq!(appends_to_2(&r).0, vec![3]);

    // The late answer, a duplicate of it, then answers to the same heartbeat that include the
    // first batch (node 2 acknowledged it before the heartbeat reached it) but, of course, not
    // the second, sent after the heartbeat left: twice, as "no progress between two answers".
    let caught_up = answer(&hb, 3);
    for (now_ms, env) in [(14, &late), (16, &late), (18, &caught_up), (20, &caught_up)] {
        mr.step(now_ms, env.clone()).unwrap();
        let r = mr.ready();
        assert_eq!(
            appends_to_2(&r),
            (vec![], false),
            "no probe, no re-send at {now_ms} ms"
        );
        let pr = mr
            .group(0)
            .unwrap()
            .progress()
            .find(|(n, _)| *n == 2)
            .unwrap()
            .1
            .clone();
        assert_eq!(pr.state, ProgressState::Replicate, "at {now_ms} ms");
        assert_eq!((pr.matched, pr.next), (3, 5), "at {now_ms} ms");
        assert_eq!(pr.inflight_bytes, b"second".len(), "at {now_ms} ms");
    }
}

/// Still, an append that was lost is re-sent once answers to heartbeats sent well after it
/// show the follower never got it.
#[test]
fn a_lost_append_is_resent_after_heartbeat_answers_show_it_missing() {
    let mut mr = registry_leader();
    mr.propose(0, Bytes::from_static(b"lost"), 2).unwrap(); // [1, 3), never arrives
    let r = mr.ready();
    assert_eq!(appends_to_2(&r).0, vec![1]);
    let mut resent = false;
    for now_ms in [100, 150, 200] {
        let hb = heartbeat_round(&mut mr, now_ms, 2);
        mr.step(now_ms + 1, answer(&hb, 1)).unwrap();
        let (firsts, _) = appends_to_2(&mr.ready());
        resent |= firsts == vec![1];
    }
    assert!(resent, "the lost append was re-sent from offset 1");
}

/// A follower that restarted and lost its unflushed writes answers a heartbeat sent after its
/// last acknowledgement with less than the leader knows: that answer is not late, so the
/// leader probes it again.
#[test]
fn a_restarted_follower_is_probed_again() {
    let mut mr = registry_leader();
    mr.propose(0, Bytes::from_static(b"unflushed"), 2).unwrap(); // [1, 3)
    mr.ready();
    mr.step(12, ack_from_2(3)).unwrap();
    mr.ready();
    // Node 2 restarts: it has verified nothing against this leader yet, so it reports 0.
    let hb = heartbeat_round(&mut mr, 100, 2);
    mr.step(101, answer(&hb, 0)).unwrap();
    let (firsts, probe) = appends_to_2(&mr.ready());
    assert!(
        probe || !firsts.is_empty(),
        "the leader probes node 2 again"
    );
    let pr = mr
        .group(0)
        .unwrap()
        .progress()
        .find(|(n, _)| *n == 2)
        .unwrap()
        .1
        .clone();
    assert_eq!(pr.state, ProgressState::Probe);
}
