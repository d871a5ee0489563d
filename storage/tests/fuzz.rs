//! The segment reader under fuzzing (`sluice-fuzz`): whatever bytes a segment file holds —
//! torn, truncated, bit-flipped or made up — recovery opens the log (truncating a torn tail) or
//! refuses it with an error, and what it then serves reads back without a panic. Corpus:
//! `fuzz/corpus/storage_batch/` plus segments written here by the log itself.

mod common;

use common::*;
use sluice_storage::fs::{Fs, SimFs};
use sluice_storage::{Log, LogConfig};
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    PathBuf::from("/data/p0")
}

fn segment_path() -> PathBuf {
    dir().join(sluice_storage::log::segment_file_name(0, "log"))
}

/// Segment files as the log writes them: a few batches of records of several sizes.
fn written_segments(config: &LogConfig) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for batches in [1usize, 3, 8] {
        let fs = SimFs::new();
        let log = block_on(Log::open(fs.clone(), dir(), config.clone())).expect("open");
        let mut r = rng(batches as u64);
        for b in 0..batches {
            let records: Vec<_> = (0..3)
                .map(|i| record(&mut r, (b * 10 + i) as i64, (b * 10 + i) as u64, 300))
                .collect();
            block_on(log.append_records(&records)).expect("append");
        }
        block_on(log.close()).expect("close");
        let bytes = fs.read_file(&segment_path()).expect("segment");
        // Segments are pre-sized and zero-filled: keep the written part and a little of the
        // zeros (recovery must stop there).
        let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 64);
        out.push(bytes[..end.min(bytes.len())].to_vec());
    }
    out
}

fn read_everything<F: Fs>(log: &Log<F>) {
    let mut at = log.start_offset();
    while at < log.end_offset() {
        let Ok(batches) = block_on(log.read(at, 64 * 1024)) else {
            return; // a typed error is fine
        };
        let Some(last) = batches.last() else { return };
        for b in &batches {
            for r in b.view().records() {
                if r.is_err() {
                    return;
                }
            }
        }
        at = last.header.next_offset();
    }
}

#[test]
fn fuzz_storage_batches() {
    let config = small_config();
    sluice_fuzz::Target::new(env!("CARGO_MANIFEST_DIR"), "storage_batch")
        .seeds(written_segments(&config))
        .input_bytes_max(64 * 1024)
        .run(|input| {
            let fs = SimFs::new();
            fs.write_file_durably(Path::new(&segment_path()), input.to_vec());
            if let Ok(log) = block_on(Log::open(fs.clone(), dir(), config.clone())) {
                read_everything(&log);
                // The recovered log takes new appends after whatever it kept.
                let mut r = rng(7);
                let rec = record(&mut r, 1, 1, 10);
                let _ = block_on(log.append_records(&[rec]));
                let _ = block_on(log.close());
            }
        });
}
