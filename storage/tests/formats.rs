//! On-disk format versions: segments written by older code still recover and read, new
//! appends are stored in the current batch format with the log's term.

mod common;

use common::*;
use sluice_storage::batch::{
    self, BatchError, BatchView, Record, BATCH_FORMAT_VERSION,
    BATCH_FORMAT_VERSION_KAFKA_COMPRESSED, BATCH_FORMAT_VERSION_MAX, BATCH_FORMAT_VERSION_V1,
    KAFKA_BATCH_HEADER_BYTES,
};
use sluice_storage::format::FORMAT_FILE_NAME;
use sluice_storage::fs::{CrashMode, Fs, SimFs, BLOCK_BYTES};
use sluice_storage::{Log, LogConfig, StorageError, SEGMENT_FORMAT_VERSION, SINGLE_NODE_TERM};
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    PathBuf::from("/data/p0")
}

fn open<F: Fs>(fs: &F, config: &LogConfig) -> Log<F> {
    block_on(Log::open(fs.clone(), dir(), config.clone())).expect("open")
}

/// Three batches (offsets 0-1, 2, 3) encoded by the v1 code (commit c2e83bd, before batch
/// format v2), each with the base offset its log stored.
fn v1_batches() -> Vec<Vec<u8>> {
    include_str!("fixtures/v1_batches.hex")
        .lines()
        .map(|l| {
            (0..l.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&l[i..i + 2], 16).expect("hex"))
                .collect()
        })
        .collect()
}

/// A segment file as the v1 log left it: batches end to end from position 0, then the zeros
/// it pre-filled, to a block boundary.
fn v1_segment(batches: &[Vec<u8>]) -> Vec<u8> {
    let mut seg = batches.concat();
    seg.resize((seg.len() as u64).next_multiple_of(BLOCK_BYTES) as usize, 0);
    seg
}

fn segment_path(base: u64) -> PathBuf {
    dir().join(format!("{base:020}.log"))
}

/// Every batch from `from` on: (base offset, version, term, values).
fn read_batches<F: Fs>(log: &Log<F>, from: u64) -> Vec<(u64, u8, u64, Vec<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut at = from;
    while at < log.end_offset() {
        let batches = block_on(log.read(at, 10_000)).expect("read");
        assert!(!batches.is_empty(), "no progress reading at {at}");
        for b in &batches {
            let values = b
                .view()
                .records()
                .map(|r| r.expect("record").value.to_vec())
                .collect();
            out.push((
                b.header.base_offset,
                b.header.version,
                b.header.term,
                values,
            ));
            at = b.header.next_offset();
        }
    }
    out
}

fn values(v: &[&str]) -> Vec<Vec<u8>> {
    v.iter().map(|s| s.as_bytes().to_vec()).collect()
}

fn create_dir(fs: &SimFs, dir: &Path) {
    block_on(sluice_storage::fs::create_dir_all_durable(fs, dir)).expect("mkdir");
}

/// A log whose only segment was written by the v1 code recovers to its end, reads its batches
/// as v1 with term 0, and takes new appends (v2) after them — across a power loss too.
#[test]
fn an_active_v1_segment_recovers_reads_and_takes_v2_appends() {
    let fs = SimFs::new();
    create_dir(&fs, &dir());
    fs.write_file_durably(&segment_path(0), v1_segment(&v1_batches()));
    assert_eq!(
        marker(&fs),
        None,
        "a log of v1 batches has no format marker"
    );
    let log = open(&fs, &small_config());
    assert_eq!(
        marker(&fs),
        Some(format!("sluice log format {SEGMENT_FORMAT_VERSION}\n"))
    );
    assert_eq!(log.end_offset(), 4);
    assert_eq!(log.stats().torn_tail_bytes_truncated, 0);
    assert_eq!(log.stats().corruptions_detected, 0);
    let old = vec![
        (0, BATCH_FORMAT_VERSION_V1, 0, values(&["first", "second"])),
        (2, BATCH_FORMAT_VERSION_V1, 0, values(&["third"])),
        (3, BATCH_FORMAT_VERSION_V1, 0, values(&["fourth"])),
    ];
    assert_eq!(read_batches(&log, 0), old);
    assert_eq!(
        block_on(log.offset_for_timestamp(1_700_000_000_002)).expect("lookup"),
        Some(2)
    );

    let info =
        block_on(log.append_records(&[Record::new(1_700_000_000_010, "fifth")])).expect("append");
    assert_eq!(info.base_offset, 4);
    drop(log);
    let fs = fs.crash(CrashMode::DropUnsynced);
    let log = open(&fs, &small_config());
    let mut all = old;
    all.push((
        4,
        BATCH_FORMAT_VERSION,
        SINGLE_NODE_TERM,
        values(&["fifth"]),
    ));
    assert_eq!(read_batches(&log, 0), all);
    assert_eq!(log.stats().corruptions_detected, 0);
}

/// A sealed v1 segment without its index files (rebuilt from the batches) and an active one
/// after it: both read.
#[test]
fn a_sealed_v1_segment_rebuilds_its_indexes_and_reads() {
    let fs = SimFs::new();
    create_dir(&fs, &dir());
    let b = v1_batches();
    let mut sealed = b[0].clone();
    sealed.extend_from_slice(&b[1]);
    fs.write_file_durably(&segment_path(0), sealed);
    fs.write_file_durably(&segment_path(3), v1_segment(&b[2..]));
    let log = open(&fs, &small_config());
    assert_eq!(log.segments().len(), 2);
    assert_eq!(log.end_offset(), 4);
    let got = read_batches(&log, 0);
    assert_eq!(
        got.iter()
            .map(|(o, v, t, _)| (*o, *v, *t))
            .collect::<Vec<_>>(),
        vec![(0, 1, 0), (2, 1, 0), (3, 1, 0)]
    );
    assert_eq!(read_batches(&log, 2)[0].3, values(&["third"]));
}

/// Appends are stored in the current format: a v1 batch from an older producer is rewritten
/// as v2; each batch carries the log's term, stamped at append outside the producer's
/// checksum, which stays valid on disk and after recovery.
#[test]
fn appends_are_stored_as_v2_stamped_with_the_log_term() {
    let fs = SimFs::new();
    let log = open(&fs, &small_config());
    assert_eq!(log.term(), SINGLE_NODE_TERM);
    let mut v1 = v1_batches()[1].clone();
    batch::set_base_offset(&mut v1, 0);
    let a = block_on(log.append(v1)).expect("a v1 batch is accepted");
    log.set_term(7).expect("a higher term");
    let b = block_on(log.append(encode(&[Record::new(5, "v2")]))).expect("append");
    assert_eq!((a.base_offset, b.base_offset), (0, 1));
    let want = vec![
        (
            0,
            BATCH_FORMAT_VERSION,
            SINGLE_NODE_TERM,
            values(&["third"]),
        ),
        (1, BATCH_FORMAT_VERSION, 7, values(&["v2"])),
    ];
    assert_eq!(read_batches(&log, 0), want);
    drop(log);
    let fs = fs.crash(CrashMode::DropUnsynced);
    let raw = fs.read_file(&segment_path(0)).expect("segment");
    let first = BatchView::parse(&raw).expect("stored bytes verify");
    assert_eq!(first.header.version, BATCH_FORMAT_VERSION);
    let log = open(&fs, &small_config());
    assert_eq!(read_batches(&log, 0), want);
    assert_eq!(log.stats().corruptions_detected, 0);
}

#[test]
fn a_term_never_goes_back() {
    let log = open(&SimFs::new(), &small_config());
    log.set_term(3).expect("a higher term");
    match log.set_term(2) {
        Err(StorageError::TermRegressed { term: 2, last: 3 }) => {}
        other => panic!("expected a regression refused, got {other:?}"),
    }
    assert_eq!(log.term(), 3);
    log.set_term(3).expect("the same term");
}

fn marker(fs: &SimFs) -> Option<String> {
    fs.read_file(&dir().join(FORMAT_FILE_NAME))
        .map(|b| String::from_utf8(b).expect("text"))
}

/// A new log is marked with the current layout version, durably (it survives a power loss
/// right after the open), and reopens.
#[test]
fn a_new_log_is_marked_with_the_current_format() {
    let fs = SimFs::new();
    drop(open(&fs, &small_config()));
    let fs = fs.crash(CrashMode::DropUnsynced);
    assert_eq!(
        marker(&fs),
        Some(format!("sluice log format {SEGMENT_FORMAT_VERSION}\n"))
    );
    let log = open(&fs, &small_config());
    assert_eq!(log.end_offset(), 0);
}

/// A log directory from a newer build is refused with a typed error, and nothing in it is
/// touched (not even the stray files an open would clean up).
#[test]
fn a_future_format_is_a_typed_error_and_nothing_is_touched() {
    let fs = SimFs::new();
    create_dir(&fs, &dir());
    let segment = v1_segment(&v1_batches());
    fs.write_file_durably(&segment_path(0), segment.clone());
    fs.write_file_durably(&dir().join("stray.tmp"), b"x".to_vec());
    let future = SEGMENT_FORMAT_VERSION + 1;
    let text = format!("sluice log format {future}\n");
    fs.write_file_durably(&dir().join(FORMAT_FILE_NAME), text.clone().into_bytes());
    match block_on(Log::open(fs.clone(), dir(), small_config())) {
        Err(StorageError::UnsupportedFormat {
            found, supported, ..
        }) => assert_eq!((found, supported), (future, SEGMENT_FORMAT_VERSION)),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a future format opened"),
    }
    assert_eq!(fs.read_file(&segment_path(0)), Some(segment));
    assert!(fs.read_file(&dir().join("stray.tmp")).is_some());
    assert_eq!(marker(&fs), Some(text));
}

/// A marker that names no version is corruption, reported as such, not a panic.
#[test]
fn a_garbled_format_marker_is_reported() {
    let fs = SimFs::new();
    create_dir(&fs, &dir());
    fs.write_file_durably(&dir().join(FORMAT_FILE_NAME), b"sluice log f\0\0".to_vec());
    assert!(matches!(
        block_on(Log::open(fs.clone(), dir(), small_config())),
        Err(StorageError::Corruption { .. })
    ));
}

/// Layout 4 came with batch format v3: a directory this build opened is marked 4, which a
/// layout-3 build refuses (`UnsupportedFormat`) rather than open a log that may hold v3
/// batches. A layout-3 directory is brought to 4.
#[test]
fn a_layout_3_log_is_marked_4() {
    assert_eq!(SEGMENT_FORMAT_VERSION, 4);
    let fs = SimFs::new();
    create_dir(&fs, &dir());
    fs.write_file_durably(&segment_path(0), v1_segment(&v1_batches()));
    fs.write_file_durably(
        &dir().join(FORMAT_FILE_NAME),
        b"sluice log format 3\n".to_vec(),
    );
    let log = open(&fs, &small_config());
    assert_eq!(log.end_offset(), 4);
    drop(log);
    let fs = fs.crash(CrashMode::DropUnsynced);
    assert_eq!(marker(&fs).as_deref(), Some("sluice log format 4\n"));
}

/// A Kafka v2 batch's framing (codec, count) around `payload`: what a Kafka producer sends,
/// as far as the storage engine looks.
fn kafka_frame(codec: u8, count: u32, payload: &[u8]) -> Vec<u8> {
    let mut k = Vec::new();
    k.extend_from_slice(&0i64.to_be_bytes()); // base offset
    let len = (KAFKA_BATCH_HEADER_BYTES - 12 + payload.len()) as i32;
    k.extend_from_slice(&len.to_be_bytes());
    k.extend_from_slice(&(-1i32).to_be_bytes()); // leader epoch
    k.push(2); // magic
    k.extend_from_slice(&0u32.to_be_bytes()); // crc (the broker's to check)
    k.extend_from_slice(&i16::from(codec).to_be_bytes());
    k.extend_from_slice(&(count as i32 - 1).to_be_bytes());
    k.extend_from_slice(&[0u8; 8 + 8 + 8 + 2 + 4]);
    k.extend_from_slice(&(count as i32).to_be_bytes());
    k.extend_from_slice(payload);
    k
}

/// A Kafka-compressed batch is stored as v3 (stamped like any batch) and reads back in the
/// bytes it came in, across a power loss; a batch of records after it is still v2.
#[test]
fn a_kafka_compressed_batch_is_stored_as_v3_and_recovers() {
    let fs = SimFs::new();
    let log = open(&fs, &small_config());
    log.set_term(5).expect("a higher term");
    let k = kafka_frame(2, 3, b"snappy bytes");
    let compressed = batch::encode_kafka_compressed(&k, 10, 12).expect("framing holds");
    let a = block_on(log.append(compressed)).expect("append compressed");
    let b = block_on(log.append(encode(&[Record::new(13, "plain")]))).expect("append");
    assert_eq!((a.base_offset, b.base_offset), (0, 3));
    drop(log);
    let fs = fs.crash(CrashMode::DropUnsynced);
    let log = open(&fs, &small_config());
    assert_eq!(log.end_offset(), 4);
    let batches = block_on(log.read(0, 1 << 20)).expect("read");
    assert_eq!(batches.len(), 2);
    let (v3, v2) = (batches[0].view(), batches[1].view());
    assert_eq!(v3.header.version, BATCH_FORMAT_VERSION_KAFKA_COMPRESSED);
    assert_eq!((v3.header.term, v3.header.kafka_codec()), (5, 2));
    assert_eq!(v3.kafka_batch(), Some(&k[..]));
    assert_eq!(v2.header.version, BATCH_FORMAT_VERSION);
    assert_eq!(log.stats().corruptions_detected, 0);
    assert_eq!(log.stats().torn_tail_bytes_truncated, 0);
}

/// `bytes` with its checksum made again for version `version`'s coverage (v2 and v3 share it).
fn rechecksummed(mut bytes: Vec<u8>) -> Vec<u8> {
    let header_bytes = batch::BATCH_HEADER_BYTES;
    let mut covered = bytes[24..56].to_vec();
    covered.extend_from_slice(&bytes[header_bytes..]);
    let sum = xxhash_rust::xxh3::xxh3_64(&covered);
    bytes[16..24].copy_from_slice(&sum.to_le_bytes());
    bytes
}

/// A compressed batch as the build before v3 wrote it (v2 with codec bits), and a batch of a
/// version newer than this build's, are refused with a typed error at append; found at the
/// end of the active segment they are reported as corruption, not cut off as a torn tail.
#[test]
fn batches_refused_by_version_are_not_stored_and_not_truncated() {
    let k = kafka_frame(1, 1, b"gzip bytes");
    let mut old = batch::encode_kafka_compressed(&k, 1, 1).expect("framing holds");
    old[24] = BATCH_FORMAT_VERSION;
    let old = rechecksummed(old);
    let mut future = encode(&[Record::new(1, "from a newer build")]);
    future[24] = BATCH_FORMAT_VERSION_MAX + 1;
    let future = rechecksummed(future);
    let log = open(&SimFs::new(), &small_config());
    match block_on(log.append(old.clone())) {
        Err(StorageError::InvalidBatch(BatchError::CodecVersionMismatch {
            version: 2,
            codec: 1,
        })) => {}
        other => panic!("a v2 batch with codec bits was not refused: {other:?}"),
    }
    match block_on(log.append(future.clone())) {
        Err(StorageError::InvalidBatch(BatchError::UnsupportedVersion(v))) => {
            assert_eq!(v, BATCH_FORMAT_VERSION_MAX + 1)
        }
        other => panic!("a future batch was not refused: {other:?}"),
    }
    assert_eq!(log.end_offset(), 0);

    for refused in [old, future] {
        let fs = SimFs::new();
        create_dir(&fs, &dir());
        let mut batches = v1_batches();
        let mut last = refused.clone();
        batch::set_base_offset(&mut last, 4);
        batches.push(last);
        let segment = v1_segment(&batches);
        fs.write_file_durably(&segment_path(0), segment.clone());
        match block_on(Log::open(fs.clone(), dir(), small_config())) {
            Err(StorageError::Corruption { position, .. }) => {
                let at: usize = v1_batches().iter().map(Vec::len).sum();
                assert_eq!(position, at as u64);
            }
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("a log with a refused batch opened"),
        }
        assert_eq!(fs.read_file(&segment_path(0)), Some(segment), "nothing cut");
    }
}
