//! `sluiced`: the Sluice broker daemon. With no flags: a single node on loopback, data in
//! `./sluice-data`, one shard per core.

use clap::Parser;
use sluice_broker::config::BrokerConfig;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "sluiced", version, about = "The Sluice message-queue broker")]
struct Args {
    /// Where queues, logs, keys and certificates live.
    #[arg(long, env = "SLUICE_DATA_DIR", default_value = "sluice-data")]
    data_dir: PathBuf,
    /// Shards (one executor thread each); default: one per available core. `--cores` is the
    /// same flag.
    #[arg(long, visible_alias = "cores", env = "SLUICE_SHARDS")]
    shards: Option<usize>,
    /// Pin shards to these CPUs (comma-separated); default: not pinned.
    #[arg(long, env = "SLUICE_CPUS", value_delimiter = ',')]
    cpus: Vec<usize>,
    /// Partitions of each new queue; default: the number of shards.
    #[arg(long, env = "SLUICE_PARTITIONS")]
    partitions: Option<u32>,
    /// SQS-compatible HTTP API.
    #[arg(long, env = "SLUICE_HTTP_ADDR", default_value = "127.0.0.1:9324")]
    http_addr: SocketAddr,
    /// Native QUIC protocol.
    #[arg(long, env = "SLUICE_QUIC_ADDR", default_value = "127.0.0.1:7400")]
    quic_addr: SocketAddr,
    /// Do not serve the native QUIC protocol.
    #[arg(long, env = "SLUICE_NO_QUIC")]
    no_quic: bool,
    /// PEM certificate chain for QUIC (with --quic-key); default: a self-signed certificate
    /// generated in the data dir on first start.
    #[arg(long, env = "SLUICE_QUIC_CERT", requires = "quic_key")]
    quic_cert: Option<PathBuf>,
    /// PEM private key for --quic-cert.
    #[arg(long, env = "SLUICE_QUIC_KEY", requires = "quic_cert")]
    quic_key: Option<PathBuf>,
    /// PEM CA bundle: require QUIC clients to present a certificate chaining to it (mTLS).
    #[arg(long, env = "SLUICE_QUIC_CLIENT_CA")]
    quic_client_ca: Option<PathBuf>,
    /// Close QUIC connections idle for this long.
    #[arg(long, env = "SLUICE_QUIC_IDLE_TIMEOUT_MS", default_value_t = sluice_broker::config::QUIC_IDLE_TIMEOUT_MS_DEFAULT)]
    quic_idle_timeout_ms: u64,
    /// Metrics and health.
    #[arg(long, env = "SLUICE_METRICS_ADDR", default_value = "127.0.0.1:9400")]
    metrics_addr: SocketAddr,
    /// Region named in queue ARNs and URLs.
    #[arg(long, env = "SLUICE_REGION", default_value = "us-east-1")]
    region: String,
}

/// Blocks SIGINT and SIGTERM in this thread (and so in every thread started after), so that
/// `wait_for_signal` can take them synchronously.
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset/pthread_sigmask only touch the set we own; the mask change
    // applies to this thread and is inherited by threads it spawns, which is the intent.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn wait_for_signal(set: &libc::sigset_t) -> i32 {
    let mut sig: libc::c_int = 0;
    // SAFETY: `set` is a valid, initialized signal set; `sig` is a valid out-pointer.
    unsafe {
        libc::sigwait(set, &mut sig);
    }
    sig
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let mut config = match BrokerConfig::embedded(args.data_dir.clone()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "sluiced: cannot prepare data dir {}: {e}",
                args.data_dir.display()
            );
            std::process::exit(1);
        }
    };
    if let Some(s) = args.shards {
        config.shards = s.max(1);
    }
    config.default_partitions = args.partitions.unwrap_or(config.shards as u32).max(1);
    config.cpus = args.cpus;
    config.http_addr = args.http_addr;
    config.quic_addr = args.quic_addr;
    config.quic_enabled = !args.no_quic;
    if let (Some(cert_path), Some(key_path)) = (args.quic_cert, args.quic_key) {
        config.quic_tls.identity = sluice_broker::quic::tls::ServerIdentity::Files {
            cert_path,
            key_path,
        };
    }
    config.quic_tls.client_ca_path = args.quic_client_ca;
    config.quic_idle_timeout_ms = args.quic_idle_timeout_ms;
    config.metrics_addr = args.metrics_addr;
    config.region = args.region;
    config.auth = match sluice_broker::http::auth::AuthConfig::from_env() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sluiced: {e}");
            std::process::exit(2);
        }
    };
    tracing::info!(
        data_dir = %config.data_dir.display(),
        shards = config.shards,
        partitions = config.default_partitions,
        http = %config.http_addr,
        quic = %config.quic_addr,
        quic_enabled = config.quic_enabled,
        metrics = %config.metrics_addr,
        "starting sluiced {}",
        env!("CARGO_PKG_VERSION")
    );
    let signals = block_signals();
    let broker = match sluice_broker::server::start(config) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("sluiced: start failed: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = broker.wait_ready() {
        eprintln!("sluiced: start failed: {e}");
        std::process::exit(1);
    }
    tracing::info!("ready");
    let sig = wait_for_signal(&signals);
    tracing::info!(signal = sig, "shutting down");
    broker.shutdown();
    tracing::info!("stopped");
}
