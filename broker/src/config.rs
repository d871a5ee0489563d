//! Broker configuration. The embedded default (no flags) is a single node on loopback with its
//! data in `./sluice-data`.

use crate::auth::AuthConfig;
use crate::engine::Limits;
use crate::quic::tls::{ServerIdentity, ServerTlsOptions};
use sluice_storage::LogConfig;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub data_dir: PathBuf,
    /// Shards (one executor each).
    pub shards: usize,
    /// Pin shard i to CPU `cpus[i % cpus.len()]`; empty: do not pin.
    pub cpus: Vec<usize>,
    /// How long an idle shard spins before it parks, µs. `None`: [`SPIN_PINNED_US`] when the
    /// shards are pinned (`cpus`), else 0 — spinning cuts cross-core wake-up tails on cores of
    /// the broker's own, but on shared cores it takes CPU from whatever else runs there (the
    /// clients of an embedded broker; measured: 2 KiB batch-10 throughput on 2 shared cores went
    /// from 21.4k to 24.3k msg/s, mean of three runs each, with the spin off).
    pub spin_before_park_us: Option<u64>,
    /// Partitions of a new queue.
    pub default_partitions: u32,
    /// The region named in queue ARNs and URLs.
    pub region: String,
    /// Key of the receipt-handle MAC (32 bytes, kept in `<data>/receipt.key`).
    pub receipt_secret: Vec<u8>,
    /// Segment, buffer and cache sizes of each partition's log.
    pub log: LogConfig,
    /// Memory bounds of each queue partition (in-flight window, dedup table, checkpoints).
    pub limits: Limits,
    pub http_addr: SocketAddr,
    /// The native QUIC protocol (`crate::native`). Port 0: the broker picks a free port at
    /// start and writes it back here (read it from `BrokerHandle::config`).
    pub quic_addr: SocketAddr,
    /// Serve the native QUIC protocol at all.
    pub quic_enabled: bool,
    /// The QUIC front end's certificate (self-signed in the data dir by default), and the CA
    /// that client certificates must chain to for mutual TLS.
    pub quic_tls: ServerTlsOptions,
    /// Each shard's own QUIC endpoint, besides the shared `quic_addr`: clients that route
    /// requests to the core owning their partition connect there (`GetRouting`). `Some(0)`
    /// (the default): ports picked at start, on `quic_addr`'s IP; `Some(base)`: shard i on
    /// `base + i`; `None`: no per-shard endpoints (everything through `quic_addr`).
    pub quic_shard_port_base: Option<u16>,
    /// The per-shard addresses in use, filled in by `server::start` (read them from
    /// `BrokerHandle::config`).
    pub quic_shard_addrs: Vec<SocketAddr>,
    /// A QUIC connection with no traffic for this long is closed (the SDK sends keep-alives).
    pub quic_idle_timeout_ms: u64,
    pub metrics_addr: SocketAddr,
    /// The Kafka protocol listener (`crate::kafka`), on every shard; `None`: off. Port 0: a
    /// free port picked at start and written back here.
    pub kafka_addr: Option<SocketAddr>,
    /// The host Kafka clients are told to connect to (metadata, coordinator); `None`: the
    /// listener's IP (127.0.0.1 when it listens on every address).
    pub kafka_advertised_host: Option<String>,
    /// TLS on the Kafka listener (`SSL`/`SASL_SSL`); `None`: plaintext.
    pub kafka_tls: Option<crate::kafka::tls::KafkaTlsOptions>,
    /// SASL/SCRAM credentials of the Kafka listener (salted and hashed; `auth::scram`).
    pub kafka_scram: crate::auth::scram::ScramStore,
    /// Who may call: SigV4 for the HTTP API and `AKID:SECRET` tokens for the native protocol,
    /// from the same access keys. The embedded default accepts everyone (and says so loudly).
    pub auth: AuthConfig,
    /// Free bytes on the data disk under which sends are refused (`crate::disk`).
    pub disk_free_bytes_min: u64,
    /// Per-account quotas (rates, queues).
    pub quotas: crate::auth::quota::QuotaConfig,
    /// The HTTP API's read timeouts (request head and keep-alive idle; body), milliseconds.
    /// `None`: `SLUICE_HTTP_HEADER_TIMEOUT_MS` / `SLUICE_HTTP_BODY_TIMEOUT_MS` or the default,
    /// read when the front end starts; `sluiced` sets them from its settings
    /// (`crate::config_file`).
    pub http_header_timeout_ms: Option<u64>,
    pub http_body_timeout_ms: Option<u64>,
    /// Host names the HTTP API accepts while authentication is off, besides `localhost` and IP
    /// literals (`crate::http::local`); `"*"`: any.
    pub http_allowed_hosts: Vec<String>,
    /// HTTP connections each shard serves at once. `None`: sized by `server::start` to the
    /// descriptors available (`crate::config_fds`), and written back here.
    pub http_connections_per_shard_max: Option<usize>,
    /// Label per-queue metrics with the account and queue name (`crate::metrics`); off: the
    /// per-queue series are left out (the endpoint is unauthenticated).
    pub metrics_queue_labels: bool,
    /// Cluster mode: who this node is and who its peers are (`crate::cluster`); `None`: a
    /// single node, and nothing of the cluster runs.
    pub cluster: Option<crate::cluster::ClusterConfig>,
}

/// Default idle timeout of a native-protocol connection.
pub const QUIC_IDLE_TIMEOUT_MS_DEFAULT: u64 = 60_000;

pub const RECEIPT_KEY_BYTES: usize = 32;

/// The log configuration of a queue partition: smaller than the storage default, because a
/// broker holds many partitions and each one's buffers and zero-filled space add up.
pub fn partition_log_config() -> LogConfig {
    const MIB: u64 = 1024 * 1024;
    LogConfig {
        segment_bytes_max: 256 * MIB,
        prealloc_chunk_bytes: 4 * MIB,
        write_buffer_bytes_max: 4 * MIB as usize,
        batch_bytes_max: 4 * MIB as usize,
        read_cache_bytes_max: MIB as usize,
        // A sealed 256 MiB segment's indexes take ~1.25 MiB (8 B of offset index and 12 B of
        // time index per 4 KiB). At 1 MiB the cache held one segment, and a FIFO receive,
        // whose messages (one group's) sit in as many segments as the backlog spans, re-read
        // ~1.25 MiB of index files for each message it handed out. 16 MiB holds twelve
        // segments (3 GiB of log) and is spent only by a partition that reads sealed segments
        // (least recently used dropped first). Larger FIFO backlogs per partition need sparser
        // indexes of sealed segments in memory (ARCHITECTURE.md, not built yet).
        index_cache_bytes_max: 16 * MIB as usize,
        ..LogConfig::default()
    }
}

/// The metadata log's configuration: small, rare records.
pub fn meta_log_config() -> LogConfig {
    const MIB: u64 = 1024 * 1024;
    LogConfig {
        segment_bytes_max: 64 * MIB,
        prealloc_chunk_bytes: MIB,
        write_buffer_bytes_max: MIB as usize,
        batch_bytes_max: MIB as usize,
        read_cache_bytes_max: MIB as usize,
        index_cache_bytes_max: MIB as usize,
        ..LogConfig::default()
    }
}

/// The receipt key's file in the data dir. Every node of a cluster must hold the same one.
pub const RECEIPT_KEY_FILE: &str = "receipt.key";

/// Reads the receipt key from the data dir, creating it (mode 0600) on first start, and the
/// data dir (mode 0700) if it is missing.
pub fn load_or_create_receipt_key(data_dir: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    crate::config_perms::create_data_dir(data_dir)?;
    let path = data_dir.join(RECEIPT_KEY_FILE);
    match std::fs::read(&path) {
        Ok(k) if k.len() == RECEIPT_KEY_BYTES => return Ok(k),
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} is not a {RECEIPT_KEY_BYTES}-byte key", path.display()),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut key = vec![0u8; RECEIPT_KEY_BYTES];
    getrandom_fill(&mut key)?;
    let tmp = data_dir.join("receipt.key.tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&key)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(data_dir)?.sync_all()?;
    Ok(key)
}

fn getrandom_fill(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// The spin before parking of pinned shards, µs (cross-core wake-up p99 609 → 181 µs:
/// ARCHITECTURE.md (runtime facts)).
pub const SPIN_PINNED_US: u64 = 50;

impl BrokerConfig {
    /// The spin before parking in force: the setting, or the default for the placement.
    pub fn spin_before_park(&self) -> std::time::Duration {
        let us = self.spin_before_park_us.unwrap_or(if self.cpus.is_empty() {
            0
        } else {
            SPIN_PINNED_US
        });
        std::time::Duration::from_micros(us)
    }

    /// The embedded default, rooted at `data_dir`.
    pub fn embedded(data_dir: PathBuf) -> std::io::Result<BrokerConfig> {
        let shards = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(BrokerConfig {
            receipt_secret: load_or_create_receipt_key(&data_dir)?,
            data_dir: data_dir.clone(),
            shards,
            cpus: Vec::new(),
            spin_before_park_us: None,
            default_partitions: shards as u32,
            region: "us-east-1".to_string(),
            log: partition_log_config(),
            limits: Limits::default(),
            http_addr: "127.0.0.1:9324".parse().expect("literal"),
            quic_addr: "127.0.0.1:7400".parse().expect("literal"),
            quic_enabled: true,
            quic_tls: ServerTlsOptions {
                identity: ServerIdentity::SelfSigned {
                    data_dir: data_dir.clone(),
                },
                client_ca_path: None,
                client_cert_accounts: Default::default(),
            },
            quic_shard_port_base: Some(0),
            quic_shard_addrs: Vec::new(),
            quic_idle_timeout_ms: QUIC_IDLE_TIMEOUT_MS_DEFAULT,
            metrics_addr: "127.0.0.1:9400".parse().expect("literal"),
            kafka_addr: Some("127.0.0.1:9092".parse().expect("literal")),
            kafka_advertised_host: None,
            kafka_tls: None,
            kafka_scram: Default::default(),
            auth: AuthConfig::open(),
            quotas: Default::default(),
            disk_free_bytes_min: crate::disk::DISK_FREE_BYTES_MIN_DEFAULT,
            http_header_timeout_ms: None,
            http_body_timeout_ms: None,
            http_allowed_hosts: Vec::new(),
            http_connections_per_shard_max: None,
            metrics_queue_labels: true,
            cluster: None,
        })
    }

    /// The embedded default with every listener (HTTP, QUIC, metrics, Kafka) on an ephemeral
    /// loopback port (`127.0.0.1:0`, resolved at start; `BrokerHandle` reports the ports). For
    /// tests and tools that start brokers next to whatever runs on the default ports: a test
    /// that binds a fixed port fails while a broker runs on it, and collides with its
    /// neighbours when tests run in parallel.
    pub fn ephemeral(data_dir: PathBuf) -> std::io::Result<BrokerConfig> {
        let any: SocketAddr = "127.0.0.1:0".parse().expect("literal");
        let mut c = BrokerConfig::embedded(data_dir)?;
        c.http_addr = any;
        c.quic_addr = any;
        c.metrics_addr = any;
        c.kafka_addr = Some(any);
        Ok(c)
    }
}
