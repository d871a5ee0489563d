//! `sluice cluster init-node`, `sluice cluster certs` and `sluice dev cluster`: the CLI over
//! `sluice_broker::cluster::{identity, dev}`.

use crate::output::{self, exit, CliError, Format};
use clap::Subcommand;
use serde_json::{json, Value};
use sluice_broker::cluster::dev::{self, DevCluster, DevError};
use sluice_broker::cluster::identity::{self, Provenance, NODE_ID_MAX};
use std::path::PathBuf;
use std::time::Duration;

/// How often `dev cluster` looks at its nodes while it waits for Ctrl-C.
const WATCH_STEP: Duration = Duration::from_millis(250);

#[derive(Subcommand, Debug)]
pub enum ClusterCmd {
    /// Make (at the first call) or show a data dir's node identity: the node id and disk id
    /// its `[[cluster.members]]` entry lists. `sluiced` in cluster mode makes the same one at
    /// its first start; a data dir holding data but no identity is refused.
    InitNode {
        /// The node's data dir (created if missing).
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// Make a node certificate (DNS name `sluice-node-<id>`, for mutual TLS between nodes),
    /// signed by the cluster CA in --ca-dir, which is made there if it has none. Writes
    /// node-cert.pem and node-key.pem in --out, replacing them.
    Certs {
        /// The cluster CA's directory (ca-cert.pem, ca-key.pem).
        #[arg(long)]
        ca_dir: PathBuf,
        /// The node's id (from `sluice cluster init-node`).
        #[arg(long)]
        node_id: u64,
        /// Where to write the node's certificate and key.
        #[arg(long)]
        out: PathBuf,
    },
    /// Show each node of a cluster: id, zone, whether it answers, peers connected, replicas,
    /// leaders, replication lag, leader changes, commits and their mean latency. Reads each
    /// node's `/metrics`: give the metrics listeners (--metrics, comma-separated host:port), or
    /// a `sluice dev cluster` directory (--dir).
    Status {
        #[arg(long, value_delimiter = ',')]
        metrics: Vec<std::net::SocketAddr>,
        #[arg(long, conflicts_with = "metrics")]
        dir: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub enum DevCmd {
    /// Run a local cluster of `sluiced` processes on loopback until Ctrl-C: data dirs, node
    /// identities, a CA and certificates, one config file per node (zones z1, z2, ...) in
    /// --dir, every listener on a free loopback port. Run it again on the same dir to restart
    /// the same nodes. `sluiced` is $SLUICED_BIN, else the one next to this binary.
    Cluster {
        /// Nodes, 1-7.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Where the cluster's files live.
        #[arg(long, default_value = "sluice-cluster")]
        dir: PathBuf,
        /// Shards (cores) per node.
        #[arg(long, default_value_t = 1)]
        shards: usize,
        /// Lay out the files, print the nodes and exit without starting them (run each node
        /// with `sluiced --config <node>/sluiced.toml`: scripts and tests that kill nodes).
        #[arg(long)]
        prepare_only: bool,
    },
}

fn dev_error(e: DevError) -> CliError {
    match e {
        DevError::Nodes(_) | DevError::Shards(_) | DevError::NoSluiced(_) => {
            CliError::usage(e.to_string())
        }
        _ => CliError {
            code: exit::SERVER,
            kind: "cluster",
            message: e.to_string(),
        },
    }
}

/// The metrics listener of every node of a `sluice dev cluster` directory.
fn dev_metrics_addrs(dir: &std::path::Path) -> Result<Vec<std::net::SocketAddr>, CliError> {
    let mut addrs = Vec::new();
    for index in 1..=dev::DEV_NODES_MAX {
        let config = dir.join(format!("node{index}")).join(dev::NODE_CONFIG_FILE);
        let Ok(text) = std::fs::read_to_string(&config) else {
            break;
        };
        let settings: toml::Table = toml::from_str(&text).map_err(|e| {
            CliError::usage(format!("{}: not a node config: {e}", config.display()))
        })?;
        let addr = settings
            .get("metrics")
            .and_then(|m| m.get("addr"))
            .and_then(|a| a.as_str())
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| CliError::usage(format!("{}: no [metrics] addr", config.display())))?;
        addrs.push(addr);
    }
    if addrs.is_empty() {
        return Err(CliError::usage(format!(
            "{}: no node*/{} (not a `sluice dev cluster` directory)",
            dir.display(),
            dev::NODE_CONFIG_FILE
        )));
    }
    Ok(addrs)
}

/// One node's row of `sluice cluster status`, from its `/metrics` (or a row saying it does
/// not answer).
fn node_status(addr: std::net::SocketAddr) -> serde_json::Value {
    let Ok((200, body)) = dev::http_get(addr, "/metrics") else {
        return json!({"metrics": addr.to_string(), "up": false});
    };
    let sum = |name: &str| -> f64 {
        body.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let max = |name: &str| -> f64 {
        body.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .fold(0.0, f64::max)
    };
    let label = |key: &str| -> String {
        body.lines()
            .find(|l| l.starts_with("sluice_cluster_node_info{"))
            .and_then(|l| l.split(&format!("{key}=\"")).nth(1))
            .and_then(|v| v.split('"').next())
            .unwrap_or("")
            .to_string()
    };
    let commits = sum("sluice_raft_commit_seconds_count");
    let mean_ms = if commits > 0.0 {
        sum("sluice_raft_commit_seconds_sum") / commits * 1e3
    } else {
        0.0
    };
    json!({
        "node": label("node"),
        "zone": label("zone"),
        "metrics": addr.to_string(),
        "up": true,
        "peer_connections": sum("sluice_peer_connections") as u64,
        "replicas": sum("sluice_raft_replicas") as u64,
        "leaders": sum("sluice_raft_leaders") as u64,
        "serving": sum("sluice_raft_serving") as u64,
        "lag_offsets_max": max("sluice_raft_replication_lag_offsets") as u64,
        "leader_changes": sum("sluice_raft_leader_changes_total") as u64,
        "commits": commits as u64,
        "commit_ms_mean": (mean_ms * 1000.0).round() / 1000.0,
    })
}

pub fn run(format: Format, cmd: ClusterCmd) -> Result<i32, CliError> {
    match cmd {
        ClusterCmd::Status { metrics, dir } => {
            let addrs = match dir {
                Some(d) => dev_metrics_addrs(&d)?,
                None if metrics.is_empty() => {
                    return Err(CliError::usage(
                        "give the nodes' metrics listeners (--metrics a:p,b:p) or --dir",
                    ))
                }
                None => metrics,
            };
            let rows: Vec<serde_json::Value> = addrs.into_iter().map(node_status).collect();
            let down = rows.iter().filter(|r| r["up"] == json!(false)).count();
            output::print(format, &serde_json::Value::Array(rows));
            Ok(if down == 0 { exit::OK } else { exit::SERVER })
        }
        ClusterCmd::InitNode { data_dir } => {
            let (id, how) = identity::load_or_create(&data_dir).map_err(|e| CliError {
                code: exit::SERVER,
                kind: "identity",
                message: e.to_string(),
            })?;
            output::print(
                format,
                &json!({
                    "node_id": id.node,
                    "disk": id.disk_hex(),
                    "created": how == Provenance::Created,
                    "data_dir": data_dir.display().to_string(),
                }),
            );
            Ok(exit::OK)
        }
        ClusterCmd::Certs {
            ca_dir,
            node_id,
            out,
        } => {
            if node_id == 0 || node_id > NODE_ID_MAX {
                return Err(CliError::usage(format!(
                    "--node-id {node_id}: a node id is 1 to {NODE_ID_MAX} (from `sluice cluster \
                     init-node`)"
                )));
            }
            let ca = dev::Ca::load_or_create(&ca_dir).map_err(dev_error)?;
            let cert = ca.issue_node_cert(node_id, &out).map_err(dev_error)?;
            output::print(
                format,
                &json!({
                    "node_id": node_id,
                    "ca": ca.cert_path.display().to_string(),
                    "ca_created": ca.provenance == Provenance::Created,
                    "cert": cert.cert.display().to_string(),
                    "key": cert.key.display().to_string(),
                }),
            );
            Ok(exit::OK)
        }
    }
}

pub fn run_dev(format: Format, cmd: DevCmd) -> Result<i32, CliError> {
    let DevCmd::Cluster {
        nodes,
        dir,
        shards,
        prepare_only,
    } = cmd;
    if prepare_only {
        let laid_out = dev::prepare(&dir, nodes, shards).map_err(dev_error)?;
        let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
        match format {
            Format::Json => output::print(format, &describe_json(&laid_out)),
            Format::Table => print!("{}", dev::describe(&laid_out, &dir)),
        }
        return Ok(0);
    }
    let sluiced = dev::find_sluiced().map_err(dev_error)?;
    let laid_out = dev::prepare(&dir, nodes, shards).map_err(dev_error)?;
    // Before the nodes start: they inherit the mask and wait for the signals themselves.
    let signals = dev::block_signals();
    eprintln!(
        "starting {} nodes ({} shard(s) each) with {}",
        laid_out.len(),
        shards,
        sluiced.display()
    );
    let mut cluster =
        DevCluster::start(laid_out, &sluiced, dev::READY_TIMEOUT).map_err(dev_error)?;
    let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
    match format {
        Format::Json => output::print(format, &describe_json(&cluster.nodes)),
        Format::Table => print!("{}", dev::describe(&cluster.nodes, &dir)),
    }
    eprintln!(
        "the cluster runs; Ctrl-C stops it. SQS queues are replicated on all three nodes and \
         any node answers (forwarding to the queue's leader); topics are not replicated yet."
    );
    let mut running = cluster.nodes.len();
    loop {
        if let Some(sig) = dev::wait_for_signal(&signals, WATCH_STEP) {
            eprintln!("signal {sig}: stopping the nodes");
            break;
        }
        for (node, status) in cluster.exited() {
            running -= 1;
            eprintln!(
                "node{node} exited ({status}); its log: {}",
                cluster.nodes[node - 1].log_path.display()
            );
        }
        if running == 0 {
            return Err(CliError {
                code: exit::SERVER,
                kind: "cluster",
                message: "every node exited".into(),
            });
        }
    }
    cluster.stop();
    eprintln!("stopped; run the same command again to restart the same nodes");
    Ok(exit::OK)
}

fn describe_json(nodes: &[dev::DevNode]) -> Value {
    Value::Array(
        nodes
            .iter()
            .map(|n| {
                json!({
                    "node": n.index,
                    "node_id": n.identity.node,
                    "disk": n.identity.disk_hex(),
                    "zone": n.zone,
                    "http_addr": n.http_addr.to_string(),
                    "quic_addr": n.quic_addr.to_string(),
                    "kafka_addr": n.kafka_addr.to_string(),
                    "metrics_addr": n.metrics_addr.to_string(),
                    "peer_addr": n.peer_addr.to_string(),
                    "quic_cert": n.quic_cert().display().to_string(),
                    "config": n.config_path.display().to_string(),
                    "log": n.log_path.display().to_string(),
                })
            })
            .collect(),
    )
}
