//! The remote segment store against the real embedded server, with faults injected in front of
//! it: 5xx, hangs, dropped connections, lost responses, a restart mid-upload, a flipped byte in
//! a stored object, and reconciliation that never reads data. Random tests take `SLUICE_SEED`.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::executor::block_on;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_tier::embedded::{Fault, FaultRule};
use sluice_tier::{
    start_embedded, EmbeddedHandle, LogKind, RemoteConfig, RemoteStore, SegmentId, TierError,
};

fn loopback0() -> SocketAddr {
    "127.0.0.1:0".parse().expect("a valid address")
}

fn seed() -> u64 {
    match std::env::var("SLUICE_SEED") {
        Ok(s) => s.parse().expect("SLUICE_SEED must be a u64"),
        Err(_) => rand::random(),
    }
}

/// Prints the seed if the test fails (panics) while this is alive.
struct SeedGuard(u64);
impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("failed with SLUICE_SEED={}", self.0);
        }
    }
}

/// Small blocks and parts so a few hundred KiB exercise multipart and many blocks; short
/// timeouts so hangs cost little test time.
fn config(server: &EmbeddedHandle) -> RemoteConfig {
    let mut c = RemoteConfig::for_embedded(server);
    c.attempt_timeout_ms = 1_000;
    c.attempts_max = 8;
    c.backoff_initial_ms = 20;
    c.backoff_max_ms = 200;
    c.multipart_threshold_bytes = 64 * 1024;
    c.part_size_bytes = 32 * 1024;
    c.block_size_bytes = 4 * 1024;
    c.cache_capacity_bytes = 64 * 1024;
    c
}

fn seg_id(base: u64) -> SegmentId {
    SegmentId {
        kind: LogKind::Topic,
        name: "orders".into(),
        partition: 2,
        base_offset: base,
        term: 5,
    }
}

fn payload(len: usize, salt: u8) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
            .collect::<Vec<u8>>(),
    )
}

/// The stored file of `key` on the embedded server's disk.
fn stored_file(dir: &Path, key: &str) -> PathBuf {
    let mut p = dir.join("s3/buckets/sluice");
    let segs: Vec<&str> = key.split('/').collect();
    for (i, s) in segs.iter().enumerate() {
        let esc: String = s
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.' {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        if i + 1 == segs.len() {
            p.push(format!("{esc}@o"));
        } else {
            p.push(esc);
        }
    }
    p
}

#[test]
fn random_segments_round_trip_through_verified_range_reads() {
    let seed = seed();
    let _g = SeedGuard(seed);
    let mut rng = SmallRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_embedded(dir.path(), loopback0()).expect("server");
    let store = RemoteStore::start(config(&server)).expect("store");
    let h = store.handle();
    let mut uploaded = Vec::new();
    for i in 0..4u64 {
        let len = rng.gen_range(1..200_000);
        let seg = payload(len, i as u8);
        let idx = payload(rng.gen_range(0..3_000), 100 + i as u8);
        let up = block_on(h.upload(seg_id(i * 1000), seg.clone(), idx.clone())).expect("upload");
        assert_eq!(up.segment_payload_bytes, len as u64);
        uploaded.push((up, seg, idx));
    }
    for _ in 0..200 {
        let (up, seg, _) = &uploaded[rng.gen_range(0..uploaded.len())];
        let a = rng.gen_range(0..seg.len() as u64);
        let b = rng.gen_range(a + 1..=seg.len() as u64);
        let got = block_on(h.read(&up.segment_key, a..b)).expect("read");
        assert_eq!(&got[..], &seg[a as usize..b as usize], "range {a}..{b}");
    }
    for (up, _, idx) in &uploaded {
        if !idx.is_empty() {
            let got = block_on(h.read(&up.index_key, 0..idx.len() as u64)).expect("index");
            assert_eq!(got, *idx);
        }
    }
    let stats = h.stats();
    assert!(stats.cache_hits > 0, "{stats:?}");
    assert!(h.cache_used_bytes() <= 64 * 1024);
    let (up, seg, _) = &uploaded[0];
    assert!(matches!(
        block_on(h.read(&up.segment_key, 0..seg.len() as u64 + 1)),
        Err(TierError::OutOfRange { .. })
    ));
}

#[test]
fn injected_5xx_and_dropped_connections_are_retried() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_embedded(dir.path(), loopback0()).expect("server");
    let store = RemoteStore::start(config(&server)).expect("store");
    let h = store.handle();
    server
        .faults
        .arm(FaultRule::new(Fault::Status(503), 2).method("PUT"));
    server
        .faults
        .arm(FaultRule::new(Fault::Status(500), 1).method("PUT"));
    server
        .faults
        .arm(FaultRule::new(Fault::DropConnection, 2).method("PUT"));
    let seg = payload(20_000, 1);
    let up = block_on(h.upload(seg_id(0), seg.clone(), payload(100, 2))).expect("upload");
    assert_eq!(server.faults.fired(), 5);
    server
        .faults
        .arm(FaultRule::new(Fault::DropConnection, 2).method("GET"));
    server
        .faults
        .arm(FaultRule::new(Fault::Status(503), 1).method("GET"));
    let got = block_on(h.read(&up.segment_key, 0..seg.len() as u64)).expect("read");
    assert_eq!(got, seg);
    assert_eq!(server.faults.fired(), 8);
    assert!(h.stats().attempts_retried >= 8, "{:?}", h.stats());
}

#[test]
fn a_hung_request_times_out_and_is_retried() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_embedded(dir.path(), loopback0()).expect("server");
    let store = RemoteStore::start(config(&server)).expect("store");
    let h = store.handle();
    server
        .faults
        .arm(FaultRule::new(Fault::Hang, 1).method("PUT"));
    let started = std::time::Instant::now();
    let seg = payload(10_000, 3);
    let up = block_on(h.upload(seg_id(0), seg.clone(), Bytes::new())).expect("upload");
    assert!(started.elapsed() >= std::time::Duration::from_millis(1_000));
    server
        .faults
        .arm(FaultRule::new(Fault::Hang, 1).method("GET"));
    assert_eq!(
        block_on(h.read(&up.segment_key, 5..500)).expect("read"),
        seg.slice(5..500)
    );
}

#[test]
fn a_multipart_upload_that_fails_for_good_is_aborted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_embedded(dir.path(), loopback0()).expect("server");
    let store = RemoteStore::start(config(&server)).expect("store");
    let h = store.handle();
    // Every part upload fails: more faults than attempts.
    server.faults.arm(
        FaultRule::new(Fault::Status(503), 1_000)
            .method("PUT")
            .query("partNumber"),
    );
    let err = block_on(h.upload(seg_id(0), payload(200_000, 4), Bytes::new()))
        .expect_err("the upload cannot succeed");
    assert!(matches!(err, TierError::RetriesExhausted { .. }), "{err:?}");
    assert_eq!(h.stats().multipart_aborted, 1);
    assert_eq!(
        server.upload_count().expect("count"),
        0,
        "parts must not linger"
    );
    server.faults.clear();
    // Nothing half-visible: the segment object does not exist.
    let key = seg_id(0).key("", sluice_tier::Part::Segment);
    assert!(matches!(
        block_on(h.read(&key, 0..1)),
        Err(TierError::NotFound { .. })
    ));
}

/// The server stops while a part upload hangs and comes back on the same address: the upload
/// resumes (the upload's parts are durable on the server), and until Complete nothing of the
/// object is visible.
#[test]
fn an_upload_survives_a_server_restart_mid_upload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_embedded(dir.path(), loopback0()).expect("server");
    let addr = server.addr;
    let mut cfg = config(&server);
    cfg.attempts_max = 20;
    let store = RemoteStore::start(cfg).expect("store");
    let h = store.handle();
    server.faults.arm(
        FaultRule::new(Fault::Hang, 1)
            .method("PUT")
            .query("partNumber=3"),
    );
    let seg = payload(200_000, 5);
    let upload = {
        let h = h.clone();
        let seg = seg.clone();
        std::thread::spawn(move || block_on(h.upload(seg_id(7), seg, payload(50, 6))))
    };
    // Wait until the hang has fired: parts 1 and 2 are on the server, part 3 is stuck.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while server.faults.fired() == 0 {
        assert!(std::time::Instant::now() < deadline, "the hang never fired");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let seg_key = seg_id(7).key("", sluice_tier::Part::Segment);
    assert!(matches!(
        block_on(h.read(&seg_key, 0..1)),
        Err(TierError::NotFound { .. })
    ));
    assert_eq!(server.upload_count().expect("count"), 1);
    server.shutdown();
    let server = start_embedded(dir.path(), addr).expect("restart on the same address");
    let up = upload.join().expect("thread").expect("the upload resumes");
    assert_eq!(up.segment_key, seg_key);
    assert_eq!(
        block_on(h.read(&seg_key, 0..seg.len() as u64)).expect("read"),
        seg
    );
    assert_eq!(server.upload_count().expect("count"), 0);
}

/// CompleteMultipartUpload takes effect but its answer is lost: the retry finds the upload
/// gone, sees the object whole, and reports success (nothing uploaded twice).
#[test]
fn a_lost_complete_response_is_not_a_failure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_embedded(dir.path(), loopback0()).expect("server");
    let store = RemoteStore::start(config(&server)).expect("store");
    let h = store.handle();
    server.faults.arm(
        FaultRule::new(Fault::DropResponse, 1)
            .method("POST")
            .query("uploadId"),
    );
    let seg = payload(150_000, 7);
    let up = block_on(h.upload(seg_id(1), seg.clone(), Bytes::new())).expect("upload");
    assert_eq!(server.faults.fired(), 1);
    assert_eq!(
        block_on(h.read(&up.segment_key, 0..seg.len() as u64)).expect("read"),
        seg
    );
}

#[test]
fn a_flipped_byte_in_a_stored_object_is_never_served() {
    let seed = seed();
    let _g = SeedGuard(seed);
    let mut rng = SmallRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_embedded(dir.path(), loopback0()).expect("server");
    let seg = payload(30_000, 8);
    let up = {
        let store = RemoteStore::start(config(&server)).expect("store");
        block_on(store.handle().upload(seg_id(2), seg.clone(), Bytes::new())).expect("upload")
    };
    let file = stored_file(dir.path(), &up.segment_key);
    let original = std::fs::read(&file).expect("stored object");
    // The stored file starts with the server's 40-byte header; flip payload, table and footer
    // bytes in turn, each read by a fresh store (an empty cache).
    const HEADER_BYTES: usize = 40;
    let body_len = original.len() - HEADER_BYTES;
    let positions = [
        rng.gen_range(0..seg.len()),         // a payload byte
        seg.len() + rng.gen_range(0..8),     // the block table
        body_len - 1 - rng.gen_range(0..40), // the footer
    ];
    for pos in positions {
        let mut bad = original.clone();
        bad[HEADER_BYTES + pos] ^= 1 << rng.gen_range(0..8);
        std::fs::write(&file, &bad).expect("corrupt");
        let store = RemoteStore::start(config(&server)).expect("store");
        let got = block_on(store.handle().read(&up.segment_key, 0..seg.len() as u64));
        assert!(
            matches!(got, Err(TierError::Corrupt { .. })),
            "flipped byte {pos} of {body_len}: {got:?}"
        );
        assert_eq!(store.handle().stats().corrupt_reads, 1);
    }
    std::fs::write(&file, &original).expect("restore");
    let store = RemoteStore::start(config(&server)).expect("store");
    assert_eq!(
        block_on(store.handle().read(&up.segment_key, 0..seg.len() as u64)).expect("read"),
        seg
    );
}

/// Start-up reconciliation deletes what no commit record names, keeps what one does, leaves
/// young objects alone, and never reads an object (every GET fails while it runs).
#[test]
fn reconciliation_sweeps_orphans_without_reading_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_embedded(dir.path(), loopback0()).expect("server");
    let store = RemoteStore::start(config(&server)).expect("store");
    let h = store.handle();
    let mut ups = Vec::new();
    for i in 0..3 {
        ups.push(
            block_on(h.upload(seg_id(i * 10), payload(5_000, i as u8), payload(10, 0)))
                .expect("upload"),
        );
    }
    let keep: HashSet<String> = [ups[1].segment_key.clone(), ups[1].index_key.clone()].into();
    let prefix = seg_id(0).partition_prefix("");
    // Any object GET (no query string) fails; the listing (GET ?list-type=2) still works.
    server.faults.arm(
        FaultRule::new(Fault::Status(500), 10_000)
            .method("GET")
            .no_query(),
    );
    let young = block_on(h.reconcile(&prefix, keep.clone(), 3_600_000)).expect("reconcile");
    assert!(young.deleted.is_empty());
    assert_eq!(young.too_young.len(), 4);
    let report = block_on(h.reconcile(&prefix, keep.clone(), 0)).expect("reconcile");
    let mut deleted = report.deleted.clone();
    deleted.sort();
    let mut want = vec![
        ups[0].index_key.clone(),
        ups[0].segment_key.clone(),
        ups[2].index_key.clone(),
        ups[2].segment_key.clone(),
    ];
    want.sort();
    assert_eq!(deleted, want);
    assert_eq!(report.kept.len(), 2);
    server.faults.clear();
    assert!(matches!(
        block_on(h.read(&ups[0].segment_key, 0..1)),
        Err(TierError::NotFound { .. })
    ));
    assert_eq!(
        block_on(h.read(&ups[1].segment_key, 0..5)).expect("kept"),
        payload(5_000, 1).slice(0..5)
    );
}

#[test]
fn a_full_queue_is_an_error_at_once_not_a_wait() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_embedded(dir.path(), loopback0()).expect("server");
    let mut cfg = config(&server);
    cfg.queue_depth_max = 1;
    cfg.commands_in_flight_max = 1;
    cfg.attempts_max = 1;
    let store = RemoteStore::start(cfg).expect("store");
    let h = store.handle();
    server
        .faults
        .arm(FaultRule::new(Fault::Hang, 1).method("GET"));
    let running = h.read("a", 0..1); // runs, and hangs until its attempt times out
    while server.faults.fired() == 0 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let queued = h.read("b", 0..1); // fills the queue
                                    // Time for a dispatcher that wrongly drained the queue to do so.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let started = std::time::Instant::now();
    let refused = block_on(h.read("c", 0..1));
    assert!(
        matches!(refused, Err(TierError::Overloaded(1))),
        "{refused:?}"
    );
    assert!(started.elapsed() < std::time::Duration::from_millis(500));
    assert!(matches!(
        block_on(running),
        Err(TierError::RetriesExhausted { .. })
    ));
    assert!(matches!(block_on(queued), Err(TierError::NotFound { .. })));
    drop(store);
    assert!(matches!(
        block_on(h.read("k", 0..1)),
        Err(TierError::Stopped)
    ));
}
