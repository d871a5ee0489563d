//! A follower's appends (`Log::stage_replicated`: the leader's offset and term, kept), the log's
//! term across restarts, power loss and truncation, and the term starts a Raft owner restores
//! from — on the in-memory file system.

mod common;

use common::*;
use rand::Rng;
use sluice_storage::batch::{BatchError, Record};
use sluice_storage::fs::{CrashMode, Fs, SimFs};
use sluice_storage::{Log, LogConfig, StorageError};
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from("/data/r0")
}

fn open<F: Fs>(fs: &F, config: &LogConfig) -> Log<F> {
    block_on(Log::open(fs.clone(), dir(), config.clone())).expect("open")
}

/// A batch of `n` records whose values say which batch they belong to.
fn batch(tag: u64, n: usize) -> Vec<u8> {
    let records: Vec<Record> = (0..n)
        .map(|i| {
            Record::new(
                1_000 + i as i64,
                format!("b{tag}-r{i}-{:064}", 0).into_bytes(),
            )
        })
        .collect();
    encode(&records)
}

/// Stages a replicated batch and waits until it is durable; returns its end offset.
fn replicate<F: Fs>(log: &Log<F>, bytes: Vec<u8>, base: u64, term: u64) -> u64 {
    let t = log.stage_replicated(bytes, base, term).expect("stage");
    let info = block_on(log.durable(t)).expect("durable");
    assert_eq!(info.base_offset, base);
    info.last_offset + 1
}

#[test]
fn a_follower_stores_the_leaders_offset_and_term() {
    let fs = SimFs::new();
    let log = open(&fs, &small_config());
    let b0 = batch(0, 3);
    let end = replicate(&log, b0.clone(), 0, 1);
    assert_eq!(end, 3);
    let end = replicate(&log, batch(1, 2), end, 4);
    assert_eq!((log.last_term(), log.term()), (4, 4));
    let read = block_on(log.read(0, 1 << 20)).expect("read");
    assert_eq!(read.len(), 2);
    assert_eq!((read[0].header.base_offset, read[0].header.term), (0, 1));
    assert_eq!((read[1].header.base_offset, read[1].header.term), (3, 4));
    // The stored bytes are the leader's but for the stamps outside the checksum (base offset
    // at 0..8, term at 56..64).
    assert_eq!(read[0].bytes[8..56], b0[8..56]);
    assert_eq!(read[0].bytes[64..], b0[64..]);
    assert_eq!(end, 5);
}

#[test]
fn a_misplaced_a_regressed_or_a_corrupt_batch_is_refused_and_changes_nothing() {
    let fs = SimFs::new();
    let log = open(&fs, &small_config());
    let end = replicate(&log, batch(0, 2), 0, 3);
    match log.stage_replicated(batch(1, 1), end + 1, 3) {
        Err(StorageError::ReplicaOffsetMismatch { offset, expected }) => {
            assert_eq!((offset, expected), (end + 1, end));
        }
        other => panic!(
            "expected an offset mismatch, got {:?}",
            other.map(|t| t.info)
        ),
    }
    match log.stage_replicated(batch(1, 1), end - 1, 3) {
        Err(StorageError::ReplicaOffsetMismatch { .. }) => {}
        other => panic!(
            "expected an offset mismatch, got {:?}",
            other.map(|t| t.info)
        ),
    }
    match log.stage_replicated(batch(1, 1), end, 2) {
        Err(StorageError::TermRegressed { term, last }) => assert_eq!((term, last), (2, 3)),
        other => panic!(
            "expected a term regression, got {:?}",
            other.map(|t| t.info)
        ),
    }
    let mut bad = batch(1, 1);
    let at = bad.len() - 1;
    bad[at] ^= 0x40;
    match log.stage_replicated(bad, end, 3) {
        Err(StorageError::InvalidBatch(BatchError::ChecksumMismatch { .. })) => {}
        other => panic!(
            "expected a checksum mismatch, got {:?}",
            other.map(|t| t.info)
        ),
    }
    assert_eq!((log.end_offset(), log.last_term()), (end, 3));
    // The right offset and an equal term go in.
    assert_eq!(replicate(&log, batch(1, 1), end, 3), end + 1);
}

#[test]
fn a_reopened_log_ends_in_its_last_batchs_term() {
    let fs = SimFs::new();
    let config = small_config();
    {
        // A leader's path: stamp its own term.
        let log = open(&fs, &config);
        log.set_term(7).expect("a higher term");
        block_on(log.append(batch(0, 2))).expect("append");
        block_on(log.close()).expect("close");
    }
    let log = open(&fs, &config);
    assert_eq!((log.term(), log.last_term()), (7, 7));
    let info = block_on(log.append(batch(1, 1))).expect("append");
    let read = block_on(log.read(info.base_offset, 1)).expect("read");
    assert_eq!(
        read[0].header.term, 7,
        "a restarted leader keeps stamping its term"
    );
    assert_eq!(
        block_on(log.term_starts()).expect("term starts"),
        vec![(7, 0)]
    );
}

#[test]
fn power_loss_keeps_the_durable_prefix_and_its_terms() {
    let fs = SimFs::new();
    let config = small_config();
    let log = open(&fs, &config);
    let mut end = 0;
    for (tag, term) in [(0, 1), (1, 1), (2, 2), (3, 2)] {
        end = replicate(&log, batch(tag, 2), end, term);
    }
    let durable_end = end;
    // Staged at a newer term, never made durable: lost with the power.
    let t = log.stage_replicated(batch(4, 3), end, 5).expect("stage");
    assert_eq!(log.last_term(), 5);
    drop(t);
    drop(log);
    let fs = fs.crash(CrashMode::DropUnsynced);
    let log = open(&fs, &config);
    assert_eq!(log.end_offset(), durable_end);
    assert_eq!((log.last_term(), log.term()), (2, 2));
    assert_eq!(
        block_on(log.term_starts()).expect("term starts"),
        vec![(1, 0), (2, 4)]
    );
    // The follower goes on from there, in the new leader's term.
    assert_eq!(
        replicate(&log, batch(5, 1), durable_end, 6),
        durable_end + 1
    );
}

#[test]
fn truncation_restores_the_cut_term_and_a_newer_term_follows() {
    let fs = SimFs::new();
    let config = small_config();
    let log = open(&fs, &config);
    let mut starts = Vec::new();
    let mut end = 0;
    for (tag, term) in [(0, 1), (1, 2), (2, 2), (3, 3)] {
        starts.push(end);
        end = replicate(&log, batch(tag, 2), end, term);
    }
    // Drop the second term-2 batch and the term-3 one: an overwritten suffix.
    block_on(log.truncate_from(starts[2])).expect("truncate");
    assert_eq!((log.end_offset(), log.last_term()), (starts[2], 2));
    match log.stage_replicated(batch(9, 1), starts[2], 1) {
        Err(StorageError::TermRegressed { term: 1, last: 2 }) => {}
        other => panic!(
            "expected a term regression, got {:?}",
            other.map(|t| t.info)
        ),
    }
    let end = replicate(&log, batch(4, 3), starts[2], 4);
    assert_eq!(
        block_on(log.term_starts()).expect("term starts"),
        vec![(1, 0), (2, starts[1]), (4, starts[2])]
    );
    drop(log);
    let fs = fs.crash(CrashMode::DropUnsynced);
    let log = open(&fs, &config);
    assert_eq!((log.end_offset(), log.last_term()), (end, 4));
    assert_eq!(
        block_on(log.term_starts()).expect("term starts"),
        vec![(1, 0), (2, starts[1]), (4, starts[2])]
    );
}

/// Many segments (batches of up to ~3 KiB, 16 KiB segments), random term runs, truncations at random batch boundaries and restarts: the
/// term starts found by binary search equal the model's, and the last term is the last batch's.
#[test]
fn term_starts_match_a_model_across_segments_truncations_and_restarts() {
    with_seed("term_starts_match_a_model", |seed| {
        let mut rng = rng(seed);
        // Segments of 16 KiB: a term's run often spans several, a term often starts mid-segment.
        let config = LogConfig {
            segment_bytes_max: 16 * 1024,
            ..small_config()
        };
        let mut most_segments = 0;
        for _case in 0..12 {
            let mut fs = SimFs::new();
            let mut log = open(&fs, &config);
            // (base offset, end, term) per batch.
            let mut model: Vec<(u64, u64, u64)> = Vec::new();
            let mut term = 1u64;
            for step in 0..rng.gen_range(40..160) {
                match rng.gen_range(0..100) {
                    0..=79 => {
                        if rng.gen_bool(0.1) {
                            term += rng.gen_range(1..3);
                        }
                        let base = model.last().map_or(0, |b| b.1);
                        let n = rng.gen_range(1..40);
                        let end = replicate(&log, batch(step, n), base, term);
                        model.push((base, end, term));
                    }
                    80..=89 if !model.is_empty() => {
                        let k = rng.gen_range(0..model.len());
                        block_on(log.truncate_from(model[k].0)).expect("truncate");
                        model.truncate(k);
                        // A new leader's term follows an overwritten suffix.
                        term = model.last().map_or(1, |b| b.2).max(term) + 1;
                    }
                    _ => {
                        drop(log);
                        fs = fs.crash(CrashMode::DropUnsynced);
                        log = open(&fs, &config);
                    }
                }
                let mut want: Vec<(u64, u64)> = Vec::new();
                for &(base, _, t) in &model {
                    if want.last().is_none_or(|w| w.0 != t) {
                        want.push((t, base));
                    }
                }
                assert_eq!(
                    block_on(log.term_starts()).expect("term starts"),
                    want,
                    "step {step}"
                );
                assert_eq!(log.last_term(), model.last().map_or(0, |b| b.2));
                assert_eq!(log.end_offset(), model.last().map_or(0, |b| b.1));
                most_segments = most_segments.max(log.segments().len());
            }
        }
        assert!(
            most_segments >= 3,
            "the logs never spanned segments: {most_segments}"
        );
    });
}
