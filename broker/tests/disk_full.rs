//! A full disk, for real: the broker's data dir on a small ext4 file system this test mounts
//! (a loop device; needs root — without it the test says so and passes vacuously). Sends fill
//! it until the reserve refuses them with the retryable disk-full error; receives and deletes go
//! on; freeing space lets sends resume without a restart; and after a restart every
//! acknowledged message is there.

use sluice_broker::config::BrokerConfig;
use sluice_broker::engine::attributes::MessageAttribute;
use sluice_broker::engine::{ReceiveRequest, SendRequest};
use sluice_broker::error::ServiceError;
use sluice_broker::metadata::DEFAULT_TENANT as T;
use sluice_broker::server;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The file system's size: small enough to fill in seconds.
const FS_BYTES: u64 = 96 * 1024 * 1024;
/// The reserve under which sends stop.
const RESERVE_BYTES: u64 = 24 * 1024 * 1024;
/// Bytes of one message body.
const BODY_BYTES: usize = 64 * 1024;

/// A mounted loop file system, unmounted on drop.
struct LoopFs {
    mount: PathBuf,
}

impl LoopFs {
    fn mount(dir: &Path) -> Result<LoopFs, String> {
        let image = dir.join("disk.img");
        let mount = dir.join("mnt");
        std::fs::create_dir_all(&mount).map_err(|e| e.to_string())?;
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(FS_BYTES))
            .map_err(|e| e.to_string())?;
        let run = |cmd: &str, args: &[&str]| -> Result<(), String> {
            let out = Command::new(cmd)
                .args(args)
                .output()
                .map_err(|e| format!("{cmd}: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{cmd} {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        let img = image.to_str().ok_or("path")?;
        let mnt = mount.to_str().ok_or("path")?;
        run("mkfs.ext4", &["-q", "-F", img])?;
        run("mount", &["-o", "loop", img, mnt])?;
        Ok(LoopFs { mount })
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
    }
}

fn send(body: String) -> SendRequest {
    SendRequest {
        body,
        attributes: Vec::<MessageAttribute>::new(),
        delay_s: None,
        group_id: None,
        dedup_id: None,
    }
}

/// `GET path` on the metrics listener: (status, body).
fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

fn config(data: &Path) -> BrokerConfig {
    let mut c = BrokerConfig::ephemeral(data.to_path_buf()).expect("config");
    c.shards = 1;
    c.default_partitions = 1;
    c.http_addr = "127.0.0.1:0".parse().expect("addr");
    c.quic_addr = "127.0.0.1:0".parse().expect("addr");
    c.metrics_addr = "127.0.0.1:0".parse().expect("addr");
    c.kafka_addr = None;
    c.disk_free_bytes_min = RESERVE_BYTES;
    c
}

#[test]
fn a_full_disk_refuses_sends_keeps_draining_and_recovers_by_itself() {
    let tmp = tempfile::tempdir().expect("tmp");
    let fs = match LoopFs::mount(tmp.path()) {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("SKIPPED: cannot mount a small file system here ({why}); run as root");
            return;
        }
    };
    let data = fs.mount.join("data");
    // Room the test gives back later, as an operator would by removing a file.
    let filler = fs.mount.join("filler");
    std::fs::write(&filler, vec![7u8; 16 * 1024 * 1024]).expect("filler");
    let b = server::start(config(&data)).expect("start");
    b.wait_ready().expect("ready");
    let (acked, refused) = b.run_on(0, |s| async move {
        let q = s
            .create_queue(T, "fill", BTreeMap::new(), BTreeMap::new())
            .await
            .expect("create");
        let mut acked = BTreeSet::new();
        let mut refused = None;
        // Bounded: the file system cannot hold more than this many bodies.
        for i in 0..(FS_BYTES as usize / BODY_BYTES + 10) {
            let body = format!("{i:08}{}", "x".repeat(BODY_BYTES - 8));
            match s.send(&q, send(body)).await {
                Ok(_) => {
                    acked.insert(i);
                }
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        (acked, refused)
    });
    let e = refused.expect("the disk filled up before the loop ended");
    assert!(matches!(e, ServiceError::DiskFull { .. }), "{e:?}");
    let info = e.info();
    assert_eq!(
        (info.code, info.http_status, info.retryable),
        ("ServiceUnavailable", 503, true)
    );
    assert!(e.to_string().contains("disk is full"), "{e}");
    assert!(
        acked.len() > 100,
        "some messages went in first: {}",
        acked.len()
    );
    // Reported where operators look.
    let metrics = b.config.metrics_addr;
    let (status, body) = get(metrics, "/ready");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("disk full"), "{body}");
    assert_eq!(get(metrics, "/health").0, 200, "alive all the same");
    let (_, scrape) = get(metrics, "/metrics");
    assert!(scrape.contains("\nsluice_disk_full 1\n"), "{scrape}");
    // Receives and deletes go on while sends are refused.
    let drained = b.run_on(0, |s| async move {
        let q = s.queue(T, "fill").expect("queue");
        assert!(matches!(
            s.send(&q, send("more".into())).await,
            Err(ServiceError::DiskFull { .. })
        ));
        let mut drained = BTreeSet::new();
        for _ in 0..3 {
            let got = s
                .receive(
                    &q,
                    ReceiveRequest {
                        max_messages: 10,
                        visibility_timeout_s: Some(600),
                        attempt_id: None,
                    },
                    0,
                )
                .await
                .expect("receive on a full disk");
            for d in got {
                let handle = s.receipt_handle(&d.receipt);
                s.delete_message(&q, &handle)
                    .await
                    .expect("delete on a full disk");
                drained.insert(d.payload.body[..8].parse::<usize>().expect("index"));
            }
        }
        let c = s.queue_counters(&q).await.expect("counters");
        (drained, c.visible)
    });
    let (drained, visible) = drained;
    assert_eq!(drained.len(), 30, "receives and deletes worked");
    assert_eq!(visible as usize, acked.len() - 30, "counts stay right");
    // Space comes back: sends resume without a restart.
    std::fs::remove_file(&filler).expect("free space");
    std::thread::sleep(std::time::Duration::from_millis(
        2 * sluice_broker::disk::DISK_CHECK_INTERVAL_MS,
    ));
    let late = b.run_on(0, |s| async move {
        let q = s.queue(T, "fill").expect("queue");
        s.send(&q, send(format!("{:08}late", 999_999)))
            .await
            .expect("sends resume once there is room")
    });
    assert!(!late.duplicate);
    assert_eq!(get(metrics, "/ready").0, 200, "ready again");
    assert!(get(metrics, "/metrics")
        .1
        .contains("\nsluice_disk_full 0\n"));
    b.shutdown();
    // After a restart: every acknowledged message not deleted is there, exactly once.
    let b = server::start(config(&data)).expect("restart");
    b.wait_ready().expect("ready");
    let expected: BTreeSet<usize> = acked
        .difference(&drained)
        .copied()
        .chain([999_999])
        .collect();
    let got = b.run_on(0, |s| async move {
        let q = s.queue(T, "fill").expect("queue");
        let mut got = Vec::new();
        loop {
            let batch = s
                .receive(
                    &q,
                    ReceiveRequest {
                        max_messages: 10,
                        visibility_timeout_s: Some(600),
                        attempt_id: None,
                    },
                    0,
                )
                .await
                .expect("receive");
            if batch.is_empty() {
                break;
            }
            got.extend(
                batch
                    .iter()
                    .map(|d| d.payload.body[..8].parse::<usize>().expect("index")),
            );
        }
        got
    });
    let got_set: BTreeSet<usize> = got.iter().copied().collect();
    assert_eq!(got.len(), got_set.len(), "no duplicates");
    assert_eq!(got_set, expected, "nothing acknowledged was lost");
    b.shutdown();
}
