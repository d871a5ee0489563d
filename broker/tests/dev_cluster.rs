//! A local three-node cluster of real `sluiced` processes (`sluice dev cluster`'s library,
//! `sluice_broker::cluster::dev`): every node's peer transport connects, on every shard, to
//! the same shard of both others (`/metrics`: `sluice_peer_connected`), and a restart on the
//! same dir brings back the same nodes. And `sluiced` refusing cluster configurations it must
//! not run: a node missing from the members, data without a node identity.

// A test is the broker's outside world: it times the broker with its own clocks (deadlines,
// waits, latencies). broker/clippy.toml's clock seam governs the broker's code, not this.
#![allow(clippy::disallowed_methods)]

use sluice_broker::cluster::dev::{self, DevCluster, DevNode};
use sluice_broker::cluster::identity::NODE_ID_FILE;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Shards per node: two, so that shard 1's port (peer_addr + 1) is exercised too.
const SHARDS: usize = 2;
/// Bound on the peer connections coming up once every node is ready (loopback: milliseconds;
/// the reconnect back-off is at most 2 s).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on a `sluiced` that must refuse to start.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(30);

fn sluiced() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_sluiced"))
}

/// The value of the series `name{labels}` in a Prometheus text body.
fn series(body: &str, name_and_labels: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Waits until every node shows, on every shard, its connection to both others as up.
fn wait_connected(nodes: &[DevNode]) {
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    for n in nodes {
        let peers: Vec<u64> = nodes
            .iter()
            .filter(|o| o.index != n.index)
            .map(|o| o.identity.node)
            .collect();
        loop {
            let body = dev::http_get(n.metrics_addr, "/metrics")
                .map(|(_, b)| b)
                .unwrap_or_default();
            let up = (0..SHARDS).all(|shard| {
                series(
                    &body,
                    &format!("sluice_peer_connections{{shard=\"{shard}\"}}"),
                ) == Some(peers.len() as f64)
                    && peers.iter().all(|p| {
                        series(
                            &body,
                            &format!("sluice_peer_connected{{shard=\"{shard}\",peer=\"{p}\"}}"),
                        ) == Some(1.0)
                    })
            });
            if up {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node{} peers not all connected within {CONNECT_TIMEOUT:?}; metrics:\n{}\nlog:\n{}",
                n.index,
                body.lines()
                    .filter(|l| l.starts_with("sluice_peer"))
                    .collect::<Vec<_>>()
                    .join("\n"),
                std::fs::read_to_string(&n.log_path).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn three_nodes_connect_to_each_other_and_restart_as_themselves() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let nodes = dev::prepare(tmp.path(), 3, SHARDS).expect("prepare");
    let ids: Vec<_> = nodes.iter().map(|n| n.identity).collect();
    let cluster = DevCluster::start(nodes.clone(), sluiced(), dev::READY_TIMEOUT).expect("start");
    wait_connected(&cluster.nodes);
    for status in cluster.stop() {
        assert!(status.expect("stopped by us").success());
    }
    // Again on the same dir: the same nodes (their data dirs now hold data, and node.id).
    let again = dev::prepare(tmp.path(), 3, SHARDS).expect("prepare again");
    assert_eq!(again.iter().map(|n| n.identity).collect::<Vec<_>>(), ids);
    assert!(again[0].data_dir.join("meta").exists());
    let cluster = DevCluster::start(again, sluiced(), dev::READY_TIMEOUT).expect("restart");
    wait_connected(&cluster.nodes);
    let text = dev::describe(&cluster.nodes, tmp.path());
    for n in &cluster.nodes {
        assert!(text.contains(&n.http_addr.to_string()), "{text}");
    }
    for status in cluster.stop() {
        assert!(status.expect("stopped by us").success());
    }
}

/// Runs `sluiced --config <config>`, which must exit by itself; its exit code and stderr.
fn refused(config: &Path) -> (i32, String) {
    let mut child = Command::new(sluiced())
        .env_clear()
        .arg("--config")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluiced");
    let deadline = Instant::now() + REFUSAL_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sluiced started with a configuration it must refuse");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
        .expect("stderr");
    (status.code().unwrap_or(-1), err)
}

#[test]
fn sluiced_refuses_a_data_dir_with_data_but_no_identity() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let nodes = dev::prepare(tmp.path(), 1, 1).expect("prepare");
    let n = &nodes[0];
    std::fs::remove_file(n.data_dir.join(NODE_ID_FILE)).expect("remove node.id");
    std::fs::create_dir(n.data_dir.join("queues")).expect("data");
    let (code, err) = refused(&n.config_path);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("no node.id") && err.contains("queues"),
        "{err}"
    );
    assert!(
        !n.data_dir.join(NODE_ID_FILE).exists(),
        "a new identity was made"
    );
}

#[test]
fn sluiced_refuses_a_node_missing_from_the_members() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let nodes = dev::prepare(tmp.path(), 2, 1).expect("prepare");
    // A wiped data dir: node 1 comes back with a new identity, which no member entry lists.
    std::fs::remove_dir_all(&nodes[0].data_dir).expect("wipe");
    let (code, err) = refused(&nodes[0].config_path);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is not in cluster.members"), "{err}");
}
