//! The wire codec: every variant round-trips; a seeded random campaign round-trips random
//! envelopes and feeds the decoder truncated, bit-flipped and random bytes, which must come back
//! `Ok` (then re-encoding gives the same bytes: the format is canonical) or a typed error,
//! never a panic. `SLUICE_SEED=<seed>` replays a failure.

use bytes::{Bytes, BytesMut};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_raft::codec::{decode, decode_bytes, encode, encode_into, encoded_len};
use sluice_raft::{
    Body, CodecLimits, Config, DecodeError, DiskId, Entry, EntryKind, Envelope, Heartbeat,
    HeartbeatGroup, HeartbeatResp, HeartbeatRespGroup, Membership, Message, Replica, Role,
    Snapshot, SnapshotMeta, APPEND_ENTRIES_MAX, HEARTBEAT_GROUPS_MAX, MEMBERS_MAX,
};

fn seed_from_env() -> u64 {
    match std::env::var("SLUICE_SEED") {
        Ok(s) => s.parse().expect("SLUICE_SEED must be a u64"),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970");
            t.as_nanos() as u64 ^ u64::from(std::process::id())
        }
    }
}

fn group(body: Body) -> Envelope {
    Envelope::Group(Message {
        group: 7,
        from: 1,
        to: 2,
        term: 9,
        body,
    })
}

fn entry(offset: u64, kind: EntryKind, data: &'static [u8]) -> Entry {
    Entry {
        offset,
        count: 3,
        term: 9,
        kind,
        data: Bytes::from_static(data),
    }
}

fn membership() -> Membership {
    Membership {
        members: vec![
            (
                Replica {
                    node: 1,
                    disk: DiskId(u128::MAX),
                },
                Role::Voter,
            ),
            (
                Replica {
                    node: 2,
                    disk: DiskId(5),
                },
                Role::Learner {
                    auto_promote: false,
                },
            ),
            (
                Replica {
                    node: 3,
                    disk: DiskId(6),
                },
                Role::Learner { auto_promote: true },
            ),
        ],
    }
}

fn every_variant() -> Vec<Envelope> {
    let mut v = Vec::new();
    for (pre, transfer) in [(false, false), (true, false), (false, true), (true, true)] {
        v.push(group(Body::Vote {
            pre,
            transfer,
            disk: DiskId(1 << 100),
            last_offset: u64::MAX,
            last_term: 3,
        }));
        v.push(group(Body::VoteResp {
            pre,
            granted: transfer,
            disk: DiskId(42),
        }));
    }
    v.push(group(Body::Append {
        prev_offset: 10,
        prev_term: 8,
        entries: vec![],
        commit: 4,
    }));
    v.push(group(Body::Append {
        prev_offset: 10,
        prev_term: 8,
        entries: vec![
            entry(10, EntryKind::Data, b"batch one"),
            entry(13, EntryKind::Noop, b""),
            entry(16, EntryKind::Config, b"cfg"),
        ],
        commit: 10,
    }));
    for reject in [None, Some(0), Some(u64::MAX)] {
        v.push(group(Body::AppendResp {
            disk: DiskId(3),
            appended: 100,
            flushed: 90,
            reject,
        }));
    }
    for m in [Membership::default(), membership()] {
        v.push(group(Body::InstallSnapshot {
            snapshot: Snapshot {
                meta: SnapshotMeta {
                    offset: 1000,
                    term: 5,
                    membership: m,
                },
                data: Bytes::from_static(b"state"),
            },
        }));
    }
    v.push(group(Body::TimeoutNow));
    v.push(Envelope::Heartbeat(Heartbeat {
        from: 1,
        to: 3,
        sent_ms: 1_700_000_000_000,
        groups: vec![],
    }));
    v.push(Envelope::Heartbeat(Heartbeat {
        from: 1,
        to: 3,
        sent_ms: 1_700_000_000_000,
        groups: vec![
            HeartbeatGroup {
                group: 1,
                term: 2,
                commit: 3,
            },
            HeartbeatGroup {
                group: u64::MAX,
                term: 0,
                commit: 0,
            },
        ],
    }));
    v.push(Envelope::HeartbeatResp(HeartbeatResp {
        from: 3,
        to: 1,
        sent_ms: 1_700_000_000_000,
        groups: vec![HeartbeatRespGroup {
            group: 1,
            term: 2,
            disk: DiskId(77),
            appended: 30,
            flushed: 20,
        }],
    }));
    v
}

#[test]
fn every_variant_round_trips() {
    for env in every_variant() {
        let wire = encode(&env);
        assert_eq!(wire.len(), encoded_len(&env), "{env:?}");
        assert_eq!(wire[0], 1, "the first byte is the codec version");
        assert_eq!(decode(&wire), Ok(env.clone()));
        let mut into = BytesMut::from(&b"prefix"[..]);
        encode_into(&env, &mut into);
        assert_eq!(&into[6..], &wire[..]);
    }
}

#[test]
fn entry_data_is_sliced_from_the_input_not_copied() {
    let env = group(Body::Append {
        prev_offset: 0,
        prev_term: 0,
        entries: vec![entry(0, EntryKind::Data, b"zero-copy batch")],
        commit: 0,
    });
    let wire = encode(&env);
    let range = wire.as_ptr() as usize..wire.as_ptr() as usize + wire.len();
    let Ok(Envelope::Group(Message {
        body: Body::Append { entries, .. },
        ..
    })) = decode_bytes(wire.clone(), &CodecLimits::default())
    else {
        panic!("decodes");
    };
    assert!(range.contains(&(entries[0].data.as_ptr() as usize)));
}

/// The 1 MiB message and the 4 MiB batch the core now carries pass the default limits.
#[test]
fn production_sized_entries_decode_with_the_default_limits() {
    for len in [1 << 20, 4 << 20, Config::default().max_entry_bytes] {
        let env = group(Body::Append {
            prev_offset: 0,
            prev_term: 0,
            entries: vec![Entry {
                offset: 0,
                count: 1,
                term: 1,
                kind: EntryKind::Data,
                data: Bytes::from(vec![0xab; len]),
            }],
            commit: 0,
        });
        let wire = encode(&env);
        assert!(wire.len() <= CodecLimits::default().max_encoded_bytes());
        assert_eq!(decode(&wire), Ok(env));
    }
}

fn with_header(kind: u8, rest: &[u8]) -> Vec<u8> {
    let mut b = vec![1, kind];
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&2u64.to_le_bytes());
    b.extend_from_slice(rest);
    b
}

fn group_body(body: u8, rest: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&7u64.to_le_bytes());
    b.extend_from_slice(&9u64.to_le_bytes());
    b.push(body);
    b.extend_from_slice(rest);
    with_header(1, &b)
}

fn append_of(entries: &[(u64, u32, u32)]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&[0u8; 24]);
    b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for &(offset, count, len) in entries {
        b.extend_from_slice(&offset.to_le_bytes());
        b.extend_from_slice(&count.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(0);
        b.extend_from_slice(&len.to_le_bytes());
        b.extend(std::iter::repeat_n(0u8, len as usize));
    }
    group_body(3, &b)
}

#[test]
fn malformed_input_gets_typed_errors() {
    let limits = CodecLimits {
        max_append_bytes: 100,
        max_entry_bytes: 1000,
        max_append_entries: 4,
        max_heartbeat_groups: 2,
        max_snapshot_bytes: 10,
    };
    let dec = |b: Vec<u8>| decode_bytes(Bytes::from(b), &limits);
    assert_eq!(decode(&[]), Err(DecodeError::Truncated));
    assert_eq!(decode(&[2, 1]), Err(DecodeError::UnknownVersion(2)));
    assert_eq!(dec(with_header(9, &[])), Err(DecodeError::UnknownKind(9)));
    assert_eq!(dec(group_body(0, &[])), Err(DecodeError::UnknownBody(0)));
    assert_eq!(dec(group_body(1, &[4])), Err(DecodeError::BadFlags(4)));
    let mut resp = vec![0u8; 16 + 16];
    resp.push(2);
    assert_eq!(dec(group_body(4, &resp)), Err(DecodeError::BadFlags(2)));
    let mut trailing = encode(&group(Body::TimeoutNow)).to_vec();
    trailing.push(0);
    assert_eq!(decode(&trailing), Err(DecodeError::TrailingBytes(1)));
    // Counts and lengths are refused before anything is allocated or read.
    let mut many = vec![0u8; 24];
    many.extend_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        dec(group_body(3, &many)),
        Err(DecodeError::TooManyEntries {
            count: u64::from(u32::MAX),
            limit: 4
        })
    );
    many.truncate(24);
    many.extend_from_slice(&3u32.to_le_bytes());
    assert_eq!(dec(group_body(3, &many)), Err(DecodeError::Truncated));
    assert_eq!(
        dec(with_header(
            2,
            &[&[0u8; 8][..], &5u32.to_le_bytes()].concat()
        )),
        Err(DecodeError::TooManyHeartbeatGroups { count: 5, limit: 2 })
    );
    assert_eq!(
        dec(with_header(
            3,
            &[&[0u8; 8][..], &3u32.to_le_bytes()].concat()
        )),
        Err(DecodeError::TooManyHeartbeatGroups { count: 3, limit: 2 })
    );
    assert_eq!(
        dec(append_of(&[(0, 1, 1001)])),
        Err(DecodeError::EntryTooLarge {
            size_bytes: 1001,
            limit_bytes: 1000
        })
    );
    assert!(
        dec(append_of(&[(0, 1, 1000)])).is_ok(),
        "one large entry alone"
    );
    assert_eq!(
        dec(append_of(&[(0, 1, 60), (1, 1, 60)])),
        Err(DecodeError::AppendTooLarge {
            size_bytes: 120,
            limit_bytes: 100
        })
    );
    assert_eq!(
        dec(append_of(&[(u64::MAX, 1, 0)])),
        Err(DecodeError::OffsetOverflow {
            offset: u64::MAX,
            count: 1
        })
    );
    let mut snap = vec![0u8; 16];
    snap.extend_from_slice(&(MEMBERS_MAX as u16 + 1).to_le_bytes());
    assert_eq!(
        dec(group_body(5, &snap)),
        Err(DecodeError::TooManyMembers(MEMBERS_MAX + 1))
    );
    snap.truncate(16);
    snap.extend_from_slice(&0u16.to_le_bytes());
    snap.extend_from_slice(&11u64.to_le_bytes());
    assert_eq!(
        dec(group_body(5, &snap)),
        Err(DecodeError::SnapshotTooLarge {
            size_bytes: 11,
            limit_bytes: 10
        })
    );
    let limits = CodecLimits::default();
    assert_eq!(limits.max_append_entries, APPEND_ENTRIES_MAX);
    assert_eq!(limits.max_heartbeat_groups, HEARTBEAT_GROUPS_MAX);
}

// ---- The seeded random campaign -------------------------------------------------------------

fn random_bytes(rng: &mut SmallRng, max_len: usize) -> Bytes {
    let len = rng.gen_range(0..=max_len);
    Bytes::from((0..len).map(|_| rng.gen()).collect::<Vec<u8>>())
}

/// Mostly small numbers (which real messages carry), sometimes anything.
fn num(rng: &mut SmallRng) -> u64 {
    match rng.gen_range(0..4) {
        0 => rng.gen(),
        1 => u64::MAX - rng.gen_range(0..3),
        _ => rng.gen_range(0..1000),
    }
}

fn random_envelope(rng: &mut SmallRng) -> Envelope {
    let (from, to) = (num(rng), num(rng));
    match rng.gen_range(0..8) {
        0 => Envelope::Heartbeat(Heartbeat {
            from,
            to,
            sent_ms: num(rng),
            groups: (0..rng.gen_range(0..20))
                .map(|_| HeartbeatGroup {
                    group: num(rng),
                    term: num(rng),
                    commit: num(rng),
                })
                .collect(),
        }),
        1 => Envelope::HeartbeatResp(HeartbeatResp {
            from,
            to,
            sent_ms: num(rng),
            groups: (0..rng.gen_range(0..20))
                .map(|_| HeartbeatRespGroup {
                    group: num(rng),
                    term: num(rng),
                    disk: DiskId(rng.gen()),
                    appended: num(rng),
                    flushed: num(rng),
                })
                .collect(),
        }),
        _ => {
            let body = match rng.gen_range(0..6) {
                0 => Body::Vote {
                    pre: rng.gen(),
                    transfer: rng.gen(),
                    disk: DiskId(rng.gen()),
                    last_offset: num(rng),
                    last_term: num(rng),
                },
                1 => Body::VoteResp {
                    pre: rng.gen(),
                    granted: rng.gen(),
                    disk: DiskId(rng.gen()),
                },
                2 => {
                    let mut offset = rng.gen_range(0..1000);
                    let entries = (0..rng.gen_range(0..8))
                        .map(|_| {
                            let count = rng.gen_range(1..10);
                            let e = Entry {
                                offset,
                                count,
                                term: num(rng),
                                kind: match rng.gen_range(0..3) {
                                    0 => EntryKind::Data,
                                    1 => EntryKind::Noop,
                                    _ => EntryKind::Config,
                                },
                                data: random_bytes(rng, 64),
                            };
                            offset += u64::from(count);
                            e
                        })
                        .collect();
                    Body::Append {
                        prev_offset: num(rng),
                        prev_term: num(rng),
                        entries,
                        commit: num(rng),
                    }
                }
                3 => Body::AppendResp {
                    disk: DiskId(rng.gen()),
                    appended: num(rng),
                    flushed: num(rng),
                    reject: rng.gen::<bool>().then(|| num(rng)),
                },
                4 => {
                    let members = (0..rng.gen_range(0..6u64))
                        .map(|n| {
                            let role = match rng.gen_range(0..3) {
                                0 => Role::Voter,
                                1 => Role::Learner {
                                    auto_promote: false,
                                },
                                _ => Role::Learner { auto_promote: true },
                            };
                            (
                                Replica {
                                    node: n * 1000 + rng.gen_range(0..1000),
                                    disk: DiskId(rng.gen()),
                                },
                                role,
                            )
                        })
                        .collect();
                    Body::InstallSnapshot {
                        snapshot: Snapshot {
                            meta: SnapshotMeta {
                                offset: num(rng),
                                term: num(rng),
                                membership: Membership { members },
                            },
                            data: random_bytes(rng, 64),
                        },
                    }
                }
                _ => Body::TimeoutNow,
            };
            Envelope::Group(Message {
                group: num(rng),
                from,
                to,
                term: num(rng),
                body,
            })
        }
    }
}

/// Decodes `b` with `limits`: an error is fine (typed by construction), a success must
/// re-encode to exactly `b`. A panic fails the test with the seed printed.
fn decode_checked(seed: u64, b: &Bytes, limits: &CodecLimits) -> Result<Envelope, DecodeError> {
    let r = decode_bytes(b.clone(), limits);
    if let Ok(env) = &r {
        assert_eq!(
            &encode(env)[..],
            &b[..],
            "seed {seed}: decoded {env:?} but re-encodes differently (replay: SLUICE_SEED={seed})"
        );
    }
    r
}

#[test]
fn random_envelopes_round_trip_and_mutations_never_panic() {
    let seed = seed_from_env();
    eprintln!("codec campaign: SLUICE_SEED={seed}");
    let mut rng = SmallRng::seed_from_u64(seed);
    let roomy = CodecLimits::default();
    let tight = CodecLimits {
        max_append_bytes: 64,
        max_entry_bytes: 48,
        max_append_entries: 4,
        max_heartbeat_groups: 8,
        max_snapshot_bytes: 32,
    };
    let (mut ok, mut err) = (0u64, 0u64);
    for _ in 0..1_500 {
        let env = random_envelope(&mut rng);
        let wire = encode(&env);
        assert_eq!(
            decode_bytes(wire.clone(), &roomy),
            Ok(env.clone()),
            "seed {seed}: round trip (replay: SLUICE_SEED={seed})"
        );
        // Tight limits: the same or a typed refusal.
        if let Ok(back) = decode_checked(seed, &wire, &tight) {
            assert_eq!(back, env, "seed {seed}");
        }
        // Every strict prefix is incomplete.
        for k in 0..wire.len() {
            let r = decode_checked(seed, &wire.slice(..k), &roomy);
            assert!(
                r.is_err(),
                "seed {seed}: a prefix of {k} of {} bytes decoded: {r:?}",
                wire.len()
            );
        }
        // Flipped bytes.
        for _ in 0..20 {
            let mut b = wire.to_vec();
            for _ in 0..rng.gen_range(1..=3) {
                let at = rng.gen_range(0..b.len());
                b[at] ^= rng.gen_range(1..=255u8);
            }
            match decode_checked(seed, &Bytes::from(b), &roomy) {
                Ok(_) => ok += 1,
                Err(_) => err += 1,
            }
        }
        // Garbage, mostly behind a valid version and kind so it reaches the bodies.
        let mut g = random_bytes(&mut rng, 200).to_vec();
        if rng.gen_ratio(9, 10) {
            let mut head = vec![1, rng.gen_range(1..=3)];
            head.extend_from_slice(&[0u8; 16]);
            if head[1] == 1 {
                head.extend_from_slice(&[0u8; 16]);
                head.push(rng.gen_range(1..=6));
            }
            head.append(&mut g);
            g = head;
        }
        let _ = decode_checked(seed, &Bytes::from(g), &roomy);
    }
    eprintln!("codec campaign: flipped encodings {ok} decoded, {err} refused");
    assert!(
        ok > 0 && err > 0,
        "seed {seed}: mutations hit both outcomes"
    );
}
