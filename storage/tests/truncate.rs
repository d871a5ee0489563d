//! `Log::truncate_from` on the in-memory file system: a suffix removed at every kind of batch
//! boundary (inside the active segment, inside a sealed one, at a segment's base), the next
//! append taking the cut offset, the result surviving a power loss; and a power loss at every
//! I/O step of a truncation, after which the log opens as a prefix of what it was, at least as
//! long as the cut.

mod common;

use common::*;
use rand::Rng;
use sluice_storage::batch::Record;
use sluice_storage::fs::{CrashMode, Fs, SimFs};
use sluice_storage::{Log, LogConfig, StorageError};
use std::path::PathBuf;
use std::rc::Rc;

fn dir() -> PathBuf {
    PathBuf::from("/data/p0")
}

fn open<F: Fs>(fs: &F, config: &LogConfig) -> Log<F> {
    block_on(Log::open(fs.clone(), dir(), config.clone())).expect("open")
}

/// Every record from the start to the end, with its offset.
fn read_all<F: Fs>(log: &Log<F>) -> Vec<(u64, Record)> {
    let mut out = Vec::new();
    let mut at = log.start_offset();
    while at < log.end_offset() {
        let batches = block_on(log.read(at, 64 * 1024)).expect("read");
        assert!(!batches.is_empty(), "no progress reading at {at}");
        for b in &batches {
            for r in b.view().records() {
                let r = r.expect("record");
                if r.offset >= at {
                    out.push((r.offset, r.to_owned_record()));
                }
            }
            at = b.header.next_offset();
        }
    }
    out
}

/// A log of `n` batches (1 to 4 records each) over several small segments, all durable:
/// returns the file system, every record, and the batches' base offsets.
fn build(seed: u64, n: usize) -> (SimFs, Vec<(u64, Record)>, Vec<u64>) {
    let mut rng = rng(seed);
    let fs = SimFs::new();
    let log = open(&fs, &small_config());
    let mut bases = Vec::new();
    let mut tag = 0;
    for i in 0..n {
        let recs: Vec<Record> = (0..rng.gen_range(1..5))
            .map(|_| {
                tag += 1;
                record(&mut rng, 1_000 + i as i64, tag, 1500)
            })
            .collect();
        let info = block_on(log.append_records(&recs)).expect("append");
        bases.push(info.base_offset);
    }
    let all = read_all(&log);
    block_on(log.close()).expect("close");
    assert!(log.segments().len() >= 3, "the test wants several segments");
    (fs, all, bases)
}

#[test]
fn truncate_from_removes_a_suffix_at_every_boundary() {
    with_seed("truncate_from_removes_a_suffix_at_every_boundary", |seed| {
        let (fs, all, bases) = build(seed, 120);
        let config = small_config();
        let segment_bases: Vec<u64> = open(&fs.crash(CrashMode::DropUnsynced), &config)
            .segments()
            .iter()
            .map(|s| s.base_offset)
            .collect();
        let end = all.last().expect("records").0 + 1;
        for &cut in bases.iter().chain([&end]) {
            let fs2 = fs.crash(CrashMode::DropUnsynced);
            let log = open(&fs2, &config);
            block_on(log.truncate_from(cut)).expect("truncate");
            assert_eq!(log.end_offset(), cut, "cut at {cut}");
            let want: Vec<_> = all.iter().filter(|(o, _)| *o < cut).cloned().collect();
            assert_eq!(read_all(&log), want, "cut at {cut}");
            assert!(
                log.segments().iter().all(|s| s.base_offset <= cut),
                "segments after the cut are gone (cut at {cut})"
            );
            // The next batch takes the cut offset, and everything survives a power loss.
            let extra = Record::new(7, vec![0xAB; 700]);
            let info = block_on(log.append_records(std::slice::from_ref(&extra))).expect("append");
            assert_eq!(info.base_offset, cut);
            let mut want = want;
            want.push((cut, extra));
            assert_eq!(read_all(&log), want);
            drop(log);
            let log = open(&fs2.crash(CrashMode::Random { seed }), &config);
            assert_eq!(read_all(&log), want, "after a power loss (cut at {cut})");
        }
        // Inside a batch, before the start, past the end: refused, nothing changed.
        let log = open(&fs.crash(CrashMode::DropUnsynced), &config);
        let inside = bases
            .windows(2)
            .find(|w| w[1] > w[0] + 1)
            .map(|w| w[0] + 1)
            .expect("a batch of several records");
        assert!(matches!(
            block_on(log.truncate_from(inside)),
            Err(StorageError::NotBatchBoundary { offset }) if offset == inside
        ));
        assert!(matches!(
            block_on(log.truncate_from(end + 1)),
            Err(StorageError::OffsetOutOfRange { .. })
        ));
        assert_eq!(read_all(&log), all);
        assert!(segment_bases.len() >= 3);
    });
}

/// A power loss at every I/O step of a truncation into a sealed segment: the log opens (never
/// as corruption), holds a prefix of what it held, at least up to the cut, and exactly the cut
/// once the truncation returned.
#[test]
fn a_power_loss_during_truncate_leaves_a_prefix() {
    with_seed("a_power_loss_during_truncate_leaves_a_prefix", |seed| {
        let mut rng = rng(seed);
        let (fs, all, bases) = build(seed, 90);
        let config = small_config();
        // A cut inside the first segment, so that segments are removed and a sealed one cut.
        let first_end = open(&fs.crash(CrashMode::DropUnsynced), &config).segments()[0].next_offset;
        let cands: Vec<u64> = bases.iter().copied().filter(|b| *b < first_end).collect();
        let cut = cands[rng.gen_range(1..cands.len())];
        let mut steps = 0;
        loop {
            let fs2 = fs.crash(CrashMode::DropUnsynced);
            let log = Rc::new(open(&fs2, &config));
            let done = Rc::new(std::cell::Cell::new(false));
            let mut s = Stepper::default();
            let (l, d) = (log.clone(), done.clone());
            s.spawn(async move {
                l.truncate_from(cut).await.expect("truncate");
                d.set(true);
            });
            for _ in 0..steps {
                if !s.step() {
                    break;
                }
            }
            let finished = done.get();
            drop(s);
            drop(log);
            let crash_seed = rng.gen();
            let after = open(&fs2.crash(CrashMode::Random { seed: crash_seed }), &config);
            let got = read_all(&after);
            let n = got.len();
            assert_eq!(
                got[..],
                all[..n],
                "a prefix after a crash at step {steps} (crash seed {crash_seed})"
            );
            assert!(
                after.end_offset() >= cut,
                "nothing below the cut lost (step {steps})"
            );
            if finished {
                assert_eq!(after.end_offset(), cut, "a finished truncation is durable");
                break;
            }
            steps += 1;
            assert!(steps < 10_000, "the truncation does not finish");
        }
    });
}
