//! The broker daemon's command line and life cycle, shared by `sluiced` and `sluice serve`:
//! settings from flags, environment and a TOML file (`crate::config_file`), the effective
//! configuration logged (secrets redacted), start, wait for SIGINT/SIGTERM, shut down.
//!
//! Exit codes: 0 stopped cleanly (or `--print-config`), 1 the broker failed to start,
//! 2 bad flags or configuration.

use crate::config_file::{parse_access_keys, AuthName, ConfigError, Settings};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;

pub const EXIT_OK: i32 = 0;
pub const EXIT_START_FAILED: i32 = 1;
pub const EXIT_BAD_CONFIG: i32 = 2;

/// The help text's word on where settings come from.
pub const SETTINGS_HELP: &str = "\
Settings come from, highest precedence first: a flag, its environment variable, the config file
(--config FILE or SLUICE_CONFIG; TOML, unknown keys rejected; see sluice.toml in the repository
for every field), the built-in default. With none of them: the embedded single node on loopback,
data in ./sluice-data. The effective configuration is logged at start with secrets redacted;
--print-config prints it as TOML and exits.

Exit codes: 0 stopped cleanly, 1 start failed, 2 bad flags or configuration.";

/// Flags of the broker daemon. Each has an environment variable; neither given: the config
/// file's value, else the default shown.
#[derive(Args, Debug, Clone, Default)]
pub struct DaemonArgs {
    /// TOML configuration file (flags and environment variables override it).
    #[arg(long, env = "SLUICE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration (TOML, secrets redacted) and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Where queues, logs, keys and certificates live [default: sluice-data].
    #[arg(long, env = "SLUICE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Shards (one executor thread each) [default: one per available core]. `--cores` is the
    /// same flag.
    #[arg(long, visible_alias = "cores", env = "SLUICE_SHARDS")]
    pub shards: Option<usize>,
    /// Pin shards to these CPUs (comma-separated) [default: not pinned].
    #[arg(long, env = "SLUICE_CPUS", value_delimiter = ',')]
    pub cpus: Vec<usize>,
    /// µs an idle shard spins before it parks [default: 50 if pinned with --cpus, else 0].
    #[arg(long, env = "SLUICE_SPIN_US")]
    pub spin_us: Option<u64>,
    /// Partitions of each new queue [default: the number of shards].
    #[arg(long, env = "SLUICE_PARTITIONS")]
    pub partitions: Option<u32>,
    /// SQS-compatible HTTP API [default: 127.0.0.1:9324].
    #[arg(long, env = "SLUICE_HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,
    /// Authentication of both front ends: `none` (local development; logged loudly) or
    /// `sigv4` (SigV4 signatures on HTTP, `AKID:SECRET` tokens on QUIC) [default: none].
    #[arg(long, env = "SLUICE_AUTH", value_parser = ["none", "sigv4"])]
    pub auth: Option<String>,
    /// SigV4 access keys, AKID:SECRET[:ACCOUNT],… Prefer the environment variable or the
    /// config file: a flag's value is visible to other users in the process list.
    #[arg(long, env = "SLUICE_ACCESS_KEYS", hide_env_values = true)]
    pub access_keys: Option<String>,
    /// Time to receive an HTTP request head (and keep-alive idle time) [default: 30000].
    #[arg(long, env = "SLUICE_HTTP_HEADER_TIMEOUT_MS")]
    pub http_header_timeout_ms: Option<u64>,
    /// Time to receive an HTTP request body [default: 30000].
    #[arg(long, env = "SLUICE_HTTP_BODY_TIMEOUT_MS")]
    pub http_body_timeout_ms: Option<u64>,
    /// With auth off, Host names the HTTP API accepts besides localhost and IP addresses
    /// (comma-separated; `*`: any) [default: none].
    #[arg(long, env = "SLUICE_HTTP_ALLOWED_HOSTS", value_delimiter = ',')]
    pub http_allowed_hosts: Vec<String>,
    /// Native QUIC protocol [default: 127.0.0.1:7400].
    #[arg(long, env = "SLUICE_QUIC_ADDR")]
    pub quic_addr: Option<SocketAddr>,
    /// Do not serve the native QUIC protocol (overrides `quic.enabled` in the file).
    #[arg(long, env = "SLUICE_NO_QUIC")]
    pub no_quic: bool,
    /// PEM certificate chain for QUIC (with --quic-key) [default: a self-signed certificate
    /// generated in the data dir on first start].
    #[arg(long, env = "SLUICE_QUIC_CERT")]
    pub quic_cert: Option<PathBuf>,
    /// PEM private key for --quic-cert.
    #[arg(long, env = "SLUICE_QUIC_KEY")]
    pub quic_key: Option<PathBuf>,
    /// PEM CA bundle: require QUIC clients to present a certificate chaining to it (mTLS).
    #[arg(long, env = "SLUICE_QUIC_CLIENT_CA")]
    pub quic_client_ca: Option<PathBuf>,
    /// Close QUIC connections idle for this long [default: 60000].
    #[arg(long, env = "SLUICE_QUIC_IDLE_TIMEOUT_MS")]
    pub quic_idle_timeout_ms: Option<u64>,
    /// The Kafka protocol listener [default: 127.0.0.1:9092].
    #[arg(long, env = "SLUICE_KAFKA_ADDR")]
    pub kafka_addr: Option<SocketAddr>,
    /// Do not serve the Kafka protocol (overrides `kafka.enabled` in the file).
    #[arg(long, env = "SLUICE_NO_KAFKA")]
    pub no_kafka: bool,
    /// The host Kafka clients are told to connect to [default: the listener's IP].
    #[arg(long, env = "SLUICE_KAFKA_ADVERTISED_HOST")]
    pub kafka_advertised_host: Option<String>,
    /// Metrics and health [default: 127.0.0.1:9400].
    #[arg(long, env = "SLUICE_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// Leave per-queue and per-group series (labelled with account and queue names) out of
    /// /metrics [default: included].
    #[arg(long, env = "SLUICE_METRICS_NO_QUEUE_LABELS")]
    pub metrics_no_queue_labels: bool,
    /// Region named in queue ARNs and URLs [default: us-east-1].
    #[arg(long, env = "SLUICE_REGION")]
    pub region: Option<String>,
    /// API calls per second per account, past which requests get RequestThrottled [default:
    /// unlimited].
    #[arg(long, env = "SLUICE_QUOTA_REQUESTS_PER_S")]
    pub quota_requests_per_s: Option<u32>,
    /// Request bytes per second per account [default: unlimited].
    #[arg(long, env = "SLUICE_QUOTA_BYTES_PER_S")]
    pub quota_bytes_per_s: Option<u64>,
    /// Free bytes on the data disk under which sends are refused [default: 268435456].
    #[arg(long, env = "SLUICE_DISK_FREE_BYTES_MIN")]
    pub disk_free_bytes_min: Option<u64>,
    /// Queues one account may hold [default: 100000].
    #[arg(long, env = "SLUICE_QUOTA_QUEUES_PER_ACCOUNT")]
    pub quota_queues_per_account: Option<usize>,
    /// Bytes one account's queues and topics may hold on disk, past which sends get
    /// RequestThrottled [default: unlimited].
    #[arg(long, env = "SLUICE_QUOTA_STORED_BYTES_PER_ACCOUNT")]
    pub quota_stored_bytes_per_account: Option<u64>,
    /// Test only (the fault harness): add this many milliseconds (negative: subtract) to this
    /// process's clock, as a skewed node's would be. Never set in production.
    #[arg(long, hide = true, allow_negative_numbers = true)]
    pub test_clock_skew_ms: Option<i64>,
    /// UNSAFE, TESTS ONLY (hidden): queues and topics acknowledge sends before their data is
    /// durable (commits write without O_DSYNC), so a power loss loses acknowledged messages.
    /// The power-loss harness turns it on to show it catches such a broker (issue 43). No
    /// environment variable and no config-file key, so that it cannot be set by accident.
    #[arg(long, hide = true)]
    pub test_unsafe_no_fsync_before_ack: bool,
}

impl DaemonArgs {
    /// The command line and environment as one settings layer.
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        let mut s = Settings {
            data_dir: self.data_dir.clone(),
            shards: self.shards,
            cpus: (!self.cpus.is_empty()).then(|| self.cpus.clone()),
            spin_us: self.spin_us,
            partitions: self.partitions,
            region: self.region.clone(),
            disk_free_bytes_min: self.disk_free_bytes_min,
            ..Settings::default()
        };
        s.http.addr = self.http_addr;
        s.auth.mode = match self.auth.as_deref() {
            None => None,
            Some("sigv4") => Some(AuthName::Sigv4),
            Some(_) => Some(AuthName::None),
        };
        s.auth.access_keys = match &self.access_keys {
            Some(k) => Some(
                parse_access_keys(k)
                    .map_err(|e| ConfigError(format!("--access-keys/SLUICE_ACCESS_KEYS: {e}")))?,
            ),
            None => None,
        };
        s.http.header_timeout_ms = self.http_header_timeout_ms;
        s.http.body_timeout_ms = self.http_body_timeout_ms;
        s.http.allowed_hosts =
            (!self.http_allowed_hosts.is_empty()).then(|| self.http_allowed_hosts.clone());
        s.quic.enabled = self.no_quic.then_some(false);
        s.quic.addr = self.quic_addr;
        s.quic.cert = self.quic_cert.clone();
        s.quic.key = self.quic_key.clone();
        s.quic.client_ca = self.quic_client_ca.clone();
        s.quic.idle_timeout_ms = self.quic_idle_timeout_ms;
        s.metrics.addr = self.metrics_addr;
        s.kafka.enabled = self.no_kafka.then_some(false);
        s.kafka.addr = self.kafka_addr;
        s.kafka.advertised_host = self.kafka_advertised_host.clone();
        s.quotas.requests_per_s = self.quota_requests_per_s;
        s.quotas.bytes_per_s = self.quota_bytes_per_s;
        s.quotas.queues_per_account = self.quota_queues_per_account;
        s.quotas.stored_bytes_per_account = self.quota_stored_bytes_per_account;
        s.metrics.queue_labels = self.metrics_no_queue_labels.then_some(false);
        Ok(s)
    }

    /// Flags and environment over the config file over the defaults, checked.
    pub fn effective(&self) -> Result<Settings, ConfigError> {
        let file = match &self.config {
            Some(path) => Settings::load(path)?,
            None => Settings::default(),
        };
        self.settings()?.or(file).resolve()
    }
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

/// Logs to stderr, filtered by `RUST_LOG` (default `info`); colours only on a terminal, so
/// that captured logs stay plain `key=value` text. A second call does nothing.
pub fn init_logging() {
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
}

/// Runs the broker until SIGINT or SIGTERM; returns the process exit code. `program` names
/// the caller in error messages (`sluiced`, `sluice serve`).
pub fn run(program: &str, args: &DaemonArgs) -> i32 {
    let settings = match args.effective() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{program}: bad configuration: {e}");
            return EXIT_BAD_CONFIG;
        }
    };
    let shown = settings.redacted();
    if args.print_config {
        print!("{}", shown.to_toml());
        return EXIT_OK;
    }
    init_logging();
    if let Some(skew_ms) = args.test_clock_skew_ms.filter(|&ms| ms != 0) {
        tracing::warn!(
            skew_ms,
            "TEST ONLY: this broker's clock is skewed (--test-clock-skew-ms)"
        );
        crate::runtime::set_clock_skew_ms(skew_ms);
    }
    if let Err(e) = sluice_storage::rt::disable_transparent_huge_pages() {
        tracing::warn!(error = %e, "could not turn transparent huge pages off");
    }
    tracing::info!(
        config = %shown.to_line(),
        file = ?args.config,
        "starting sluiced {}",
        env!("CARGO_PKG_VERSION")
    );
    // Before any thread starts: the soft descriptor limit up to the hard one; the HTTP
    // connection caps are then sized to it (crate::config_fds, logged by server::start).
    match crate::config_fds::raise_nofile_limit() {
        Ok(l) if l.soft != l.soft_before => tracing::info!(
            from = l.soft_before,
            to = l.soft,
            hard = l.hard,
            "raised the soft file descriptor limit (RLIMIT_NOFILE) to the hard limit"
        ),
        Ok(l) => tracing::info!(soft = l.soft, hard = l.hard, "file descriptor limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the file descriptor limit"),
    }
    // Before the broker creates anything: files 0600, directories 0700 (crate::config_perms).
    crate::config_perms::restrict_umask();
    if let Some(path) = &args.config {
        let has_secrets = crate::config_file::Settings::load(path)
            .is_ok_and(|f| f.auth.access_keys.is_some_and(|k| !k.is_empty()));
        if let Some(mode) = has_secrets
            .then(|| crate::config_perms::secret_file_exposed(path))
            .flatten()
        {
            tracing::warn!(
                file = %path.display(),
                mode = format!("{mode:o}"),
                "the config file holds access-key secrets and is world-readable: \
                 chmod 600 it (readable by the broker's user only)"
            );
        }
    }
    let mut config = match settings.broker_config() {
        Ok(c) => c,
        Err(crate::config_file::PrepareError::Cluster(e)) => {
            tracing::error!(error = %e, "cluster configuration refused");
            eprintln!("{program}: cluster: {e}");
            return match e {
                // The data dir's state, not the file, is at fault.
                crate::cluster::ClusterConfigError::Identity(_) => EXIT_START_FAILED,
                _ => EXIT_BAD_CONFIG,
            };
        }
        Err(e) => {
            tracing::error!(data_dir = ?settings.data_dir, error = %e, "cannot prepare the data dir");
            eprintln!(
                "{program}: cannot prepare data dir {:?}: {e}",
                settings.data_dir
            );
            return EXIT_START_FAILED;
        }
    };
    if args.test_unsafe_no_fsync_before_ack {
        tracing::warn!(
            "UNSAFE TEST MODE (--test-unsafe-no-fsync-before-ack): sends are acknowledged \
             before they are durable; a power loss loses them. Never use it for real data."
        );
        config.log.unsafe_no_fsync_before_ack = true;
    }
    match crate::config_perms::tighten_data_dir(&config.data_dir) {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            data_dir = %config.data_dir.display(),
            entries = n,
            "removed group and other permissions in the data dir"
        ),
        Err(e) => tracing::warn!(
            data_dir = %config.data_dir.display(),
            error = %e,
            "could not tighten the data dir's permissions"
        ),
    }
    let signals = block_signals();
    let broker = match crate::server::start(config) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "start failed");
            eprintln!("{program}: start failed: {e}");
            return EXIT_START_FAILED;
        }
    };
    if let Err(e) = broker.wait_ready() {
        tracing::error!(error = %e, "start failed");
        eprintln!("{program}: start failed: {e}");
        return EXIT_START_FAILED;
    }
    tracing::info!(
        http = %broker.config.http_addr,
        quic = %broker.config.quic_addr,
        quic_enabled = broker.config.quic_enabled,
        metrics = %broker.config.metrics_addr,
        kafka = ?broker.config.kafka_addr,
        node = ?broker.config.cluster.as_ref().map(|c| c.identity.node),
        zone = ?broker.config.cluster.as_ref().map(|c| c.zone.as_str()),
        peer = ?broker.config.cluster.as_ref().map(|c| c.peer_addr),
        "ready"
    );
    let sig = wait_for_signal(&signals);
    tracing::info!(signal = sig, "shutting down");
    broker.shutdown();
    tracing::info!("stopped");
    EXIT_OK
}
