//! The broker's configuration file (TOML), and how it meets flags and environment variables.
//!
//! Precedence, setting by setting: command-line flag > environment variable > file > built-in
//! default. clap gives a flag or its environment variable (the [`Settings`] of the command
//! line); [`Settings::or`] lays them over the file's; [`Settings::resolve`] fills the rest with
//! the embedded defaults and checks the result. Unknown keys in the file are errors that name
//! the key (a typo must not silently leave a default in force).
//!
//! The same struct is the file's schema and the effective configuration printed at start and by
//! `sluiced --print-config`, with every secret replaced by [`REDACTED`] ([`Settings::redacted`]).
//! The example file `sluice.toml` at the repository root documents every field.

use crate::auth::{valid_account, AuthConfig, AuthMode, Credential};
use crate::config::{BrokerConfig, QUIC_IDLE_TIMEOUT_MS_DEFAULT};
use crate::http::{BODY_READ_TIMEOUT_MS_DEFAULT, HEADER_READ_TIMEOUT_MS_DEFAULT};
use crate::metadata::DEFAULT_TENANT;
use crate::quic::tls::ServerIdentity;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// What a secret is printed as.
pub const REDACTED: &str = "<redacted>";
/// A configuration file larger than this is refused (it is a few hundred bytes in practice).
pub const CONFIG_FILE_BYTES_MAX: u64 = 1024 * 1024;

/// A configuration error: the message names the file, key or variable at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Every setting, each optional: one layer (file, or command line and environment). Resolved,
/// every field is `Some` except the optional paths.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Where queues, logs, keys and certificates live.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Shards (one executor thread each).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<usize>,
    /// Pin shard i to CPU `cpus[i % len]`; empty: not pinned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<Vec<usize>>,
    /// µs an idle shard spins before parking; unset: 50 if pinned (`cpus`), else 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spin_us: Option<u64>,
    /// Partitions of each new queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partitions: Option<u32>,
    /// Region named in queue ARNs and URLs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Free bytes on the data disk under which sends are refused (retryable, "disk is full")
    /// while receives and deletes go on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_free_bytes_min: Option<u64>,
    #[serde(default, skip_serializing_if = "AuthSettings::is_empty")]
    pub auth: AuthSettings,
    #[serde(default, skip_serializing_if = "HttpSettings::is_empty")]
    pub http: HttpSettings,
    #[serde(default, skip_serializing_if = "QuicSettings::is_empty")]
    pub quic: QuicSettings,
    #[serde(default, skip_serializing_if = "MetricsSettings::is_empty")]
    pub metrics: MetricsSettings,
    #[serde(default, skip_serializing_if = "QuotaSettings::is_empty")]
    pub quotas: QuotaSettings,
    #[serde(default, skip_serializing_if = "KafkaSettings::is_empty")]
    pub kafka: KafkaSettings,
    /// Cluster mode (`crate::cluster`); absent: a single node, exactly as without it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterSettings>,
}

/// `[cluster]`: this node's place in a cluster (`crate::cluster::config`). Every field is
/// required once the section is there; the section is taken whole from one layer (file).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    /// This node's availability zone (its entry in `members` must say the same).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The UDP address peers dial (shard i: port + i); port 0 (tests): each shard picks one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_addr: Option<SocketAddr>,
    /// PEM certificate of this node, signed by the cluster CA, naming `sluice-node-<id>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// PEM cluster CA: every peer's certificate must chain to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// The bootstrap membership, this node included (1 to 7 members).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<MemberSettings>>,
}

/// One `[[cluster.members]]` entry: ids as `sluice cluster init-node` prints them, and the
/// member's addresses (peer, and the clients': for forwarding and Kafka metadata).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MemberSettings {
    pub id: u64,
    /// 32 hex digits.
    pub disk: String,
    pub zone: String,
    pub peer_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub quic_addr: SocketAddr,
    /// Absent: the member serves no Kafka.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka_addr: Option<SocketAddr>,
}

/// Why [`Settings::broker_config`] could not prepare a start.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("preparing the data dir: {0}")]
    DataDir(#[from] std::io::Error),
    #[error("cluster: {0}")]
    Cluster(#[from] crate::cluster::ClusterConfigError),
}

/// `[kafka]`: the Kafka protocol listener (`crate::kafka`) on Sluice's topics.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<SocketAddr>,
    /// The host clients are told to connect to; unset: the listener's IP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertised_host: Option<String>,
    /// TLS on the listener (clients: `security.protocol=SSL` or `SASL_SSL`). Default false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<bool>,
    /// PEM certificate chain (with `key`); absent: the QUIC listener's (its files, else the
    /// self-signed one in the data dir).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// PEM CA bundle client certificates are verified against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: `required` (default; Kafka's `ssl.client.auth=required`) or
    /// `requested` (a certificate is verified if presented; SASL clients need none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<ClientAuth>,
    /// Client certificate name (subject CN, else a DNS SAN) → account, as `quic.`'s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_cert_accounts: Option<std::collections::BTreeMap<String, String>>,
}

/// `kafka.client_auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    Required,
    Requested,
}

/// One SASL/SCRAM credential of the Kafka listener: what `sluice scram-credential` prints.
/// The password is not here, only what RFC 5802 lets a server keep.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScramCredentialSetting {
    pub user: String,
    /// `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub mechanism: String,
    /// The account the user acts in (default `000000000000`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    pub iterations: u32,
    /// Base64.
    pub salt: String,
    /// Base64 `H(HMAC(SaltedPassword, "Client Key"))`.
    pub stored_key: String,
    /// Base64 `HMAC(SaltedPassword, "Server Key")`.
    pub server_key: String,
}

impl ScramCredentialSetting {
    fn credential(&self) -> Result<crate::auth::scram::ScramCredential, String> {
        let account = self.account.as_deref().unwrap_or(DEFAULT_TENANT);
        if self.user.is_empty() || !valid_account(account) {
            return Err("an empty user or a bad account id (1-64 of A-Z a-z 0-9 - _)".into());
        }
        crate::auth::scram::ScramCredential::from_encoded(
            &self.mechanism,
            account,
            &self.salt,
            self.iterations,
            &self.stored_key,
            &self.server_key,
        )
        .map_err(|e| e.to_string())
    }
}

impl KafkaSettings {
    fn is_empty(&self) -> bool {
        *self == KafkaSettings::default()
    }
}

/// `[quotas]`: what each account may do, on both front ends (unset: unlimited rates).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaSettings {
    /// API calls per second per account; past it, `RequestThrottled` (retryable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_per_s: Option<u32>,
    /// Request bytes per second per account; past it, `RequestThrottled` (retryable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_per_s: Option<u64>,
    /// Queues one account may hold; past it, CreateQueue answers `OverLimit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queues_per_account: Option<usize>,
    /// Bytes one account's queue and topic logs may hold; past it, sends and produces answer
    /// `RequestThrottled` (retryable) until space is freed. Unset: unlimited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored_bytes_per_account: Option<u64>,
}

/// `[auth]`: who may call, both front ends (SigV4 on HTTP, `AKID:SECRET` tokens on QUIC).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    /// `none` (accept any request; local development) or `sigv4`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<AuthName>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_keys: Option<Vec<AccessKey>>,
    /// SASL/SCRAM-SHA-256/512 logins on the Kafka port (`sluice scram-credential` makes one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scram_credentials: Option<Vec<ScramCredentialSetting>>,
}

/// `[http]`: the SQS-compatible HTTP API.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header_timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_timeout_ms: Option<u64>,
    /// With auth off: Host names accepted besides localhost and IP literals; `"*"`: any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_hosts: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthName {
    None,
    Sigv4,
}

/// One SigV4 access key: the account id is the tenant.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AccessKey {
    pub id: String,
    pub secret: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
}

/// `[quic]`: the native protocol.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct QuicSettings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<SocketAddr>,
    /// PEM certificate chain (with `key`); absent: self-signed in the data dir.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// PEM CA bundle: require client certificates chaining to it (mutual TLS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
    /// Client certificate name (subject CN, else a DNS SAN) → account: such a certificate
    /// authenticates its connection as that account, with no access key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_cert_accounts: Option<std::collections::BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// Serve an endpoint per shard besides `addr`, for clients routing to the owning core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard_endpoints: Option<bool>,
    /// Shard i's endpoint listens on `shard_port_base + i`; 0: ports picked at start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard_port_base: Option<u16>,
}

/// `[metrics]`: Prometheus `/metrics`, `/health`, `/ready`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSettings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<SocketAddr>,
    /// Per-queue and per-group series, labelled with account and queue (group, topic) names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_labels: Option<bool>,
}

impl AuthSettings {
    fn is_empty(&self) -> bool {
        *self == AuthSettings::default()
    }
}

impl HttpSettings {
    fn is_empty(&self) -> bool {
        *self == HttpSettings::default()
    }
}

impl QuicSettings {
    fn is_empty(&self) -> bool {
        *self == QuicSettings::default()
    }
}

impl MetricsSettings {
    fn is_empty(&self) -> bool {
        *self == MetricsSettings::default()
    }
}

impl QuotaSettings {
    fn is_empty(&self) -> bool {
        *self == QuotaSettings::default()
    }
}

/// Parses `AKID:SECRET[:ACCOUNT],…` (the `SLUICE_ACCESS_KEYS` form).
pub fn parse_access_keys(s: &str) -> Result<Vec<AccessKey>, ConfigError> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let mut parts = item.splitn(3, ':');
        match (parts.next(), parts.next()) {
            (Some(id), Some(secret)) => out.push(AccessKey {
                id: id.to_string(),
                secret: secret.to_string(),
                account: parts.next().map(str::to_string),
            }),
            // Never echo the item: it may hold a secret.
            _ => {
                return Err(ConfigError(format!(
                    "access key #{}: expected AKID:SECRET[:ACCOUNT]",
                    out.len() + 1
                )))
            }
        }
    }
    Ok(out)
}

impl Settings {
    /// Parses a TOML document (`origin` names it in errors).
    pub fn parse(text: &str, origin: &str) -> Result<Settings, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError(format!("{origin}: {e}")))
    }

    /// Reads and parses a configuration file.
    pub fn load(path: &Path) -> Result<Settings, ConfigError> {
        let shown = path.display();
        let meta = std::fs::metadata(path)
            .map_err(|e| ConfigError(format!("config file {shown}: {e}")))?;
        if meta.len() > CONFIG_FILE_BYTES_MAX {
            return Err(ConfigError(format!(
                "config file {shown}: larger than {CONFIG_FILE_BYTES_MAX} bytes"
            )));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("config file {shown}: {e}")))?;
        Settings::parse(&text, &format!("config file {shown}"))
    }

    /// This layer over `below`: each setting from `self` if it has one, else from `below`.
    pub fn or(self, below: Settings) -> Settings {
        Settings {
            data_dir: self.data_dir.or(below.data_dir),
            shards: self.shards.or(below.shards),
            cpus: self.cpus.or(below.cpus),
            spin_us: self.spin_us.or(below.spin_us),
            partitions: self.partitions.or(below.partitions),
            region: self.region.or(below.region),
            disk_free_bytes_min: self.disk_free_bytes_min.or(below.disk_free_bytes_min),
            auth: AuthSettings {
                mode: self.auth.mode.or(below.auth.mode),
                access_keys: self.auth.access_keys.or(below.auth.access_keys),
                scram_credentials: self.auth.scram_credentials.or(below.auth.scram_credentials),
            },
            http: HttpSettings {
                addr: self.http.addr.or(below.http.addr),
                header_timeout_ms: self.http.header_timeout_ms.or(below.http.header_timeout_ms),
                body_timeout_ms: self.http.body_timeout_ms.or(below.http.body_timeout_ms),
                allowed_hosts: self.http.allowed_hosts.or(below.http.allowed_hosts),
            },
            quic: QuicSettings {
                enabled: self.quic.enabled.or(below.quic.enabled),
                addr: self.quic.addr.or(below.quic.addr),
                cert: self.quic.cert.or(below.quic.cert),
                key: self.quic.key.or(below.quic.key),
                client_ca: self.quic.client_ca.or(below.quic.client_ca),
                client_cert_accounts: self
                    .quic
                    .client_cert_accounts
                    .or(below.quic.client_cert_accounts),
                idle_timeout_ms: self.quic.idle_timeout_ms.or(below.quic.idle_timeout_ms),
                shard_endpoints: self.quic.shard_endpoints.or(below.quic.shard_endpoints),
                shard_port_base: self.quic.shard_port_base.or(below.quic.shard_port_base),
            },
            metrics: MetricsSettings {
                addr: self.metrics.addr.or(below.metrics.addr),
                queue_labels: self.metrics.queue_labels.or(below.metrics.queue_labels),
            },
            kafka: KafkaSettings {
                enabled: self.kafka.enabled.or(below.kafka.enabled),
                addr: self.kafka.addr.or(below.kafka.addr),
                advertised_host: self.kafka.advertised_host.or(below.kafka.advertised_host),
                tls: self.kafka.tls.or(below.kafka.tls),
                cert: self.kafka.cert.or(below.kafka.cert),
                key: self.kafka.key.or(below.kafka.key),
                client_ca: self.kafka.client_ca.or(below.kafka.client_ca),
                client_auth: self.kafka.client_auth.or(below.kafka.client_auth),
                client_cert_accounts: self
                    .kafka
                    .client_cert_accounts
                    .or(below.kafka.client_cert_accounts),
            },
            cluster: self.cluster.or(below.cluster),
            quotas: QuotaSettings {
                requests_per_s: self.quotas.requests_per_s.or(below.quotas.requests_per_s),
                bytes_per_s: self.quotas.bytes_per_s.or(below.quotas.bytes_per_s),
                queues_per_account: self
                    .quotas
                    .queues_per_account
                    .or(below.quotas.queues_per_account),
                stored_bytes_per_account: self
                    .quotas
                    .stored_bytes_per_account
                    .or(below.quotas.stored_bytes_per_account),
            },
        }
    }

    /// The built-in defaults: the embedded single node on loopback.
    pub fn defaults() -> Settings {
        let shards = std::thread::available_parallelism().map_or(1, |n| n.get());
        Settings {
            data_dir: Some(PathBuf::from("sluice-data")),
            shards: Some(shards),
            cpus: Some(Vec::new()),
            spin_us: None,    // by placement: see BrokerConfig::spin_before_park_us
            partitions: None, // the number of shards, once they are known
            region: Some("us-east-1".to_string()),
            disk_free_bytes_min: Some(crate::disk::DISK_FREE_BYTES_MIN_DEFAULT),
            auth: AuthSettings {
                mode: Some(AuthName::None),
                access_keys: Some(Vec::new()),
                scram_credentials: None,
            },
            http: HttpSettings {
                addr: Some("127.0.0.1:9324".parse().expect("literal")),
                header_timeout_ms: Some(HEADER_READ_TIMEOUT_MS_DEFAULT),
                body_timeout_ms: Some(BODY_READ_TIMEOUT_MS_DEFAULT),
                allowed_hosts: Some(Vec::new()),
            },
            quic: QuicSettings {
                enabled: Some(true),
                addr: Some("127.0.0.1:7400".parse().expect("literal")),
                cert: None,
                key: None,
                client_ca: None,
                client_cert_accounts: None,
                idle_timeout_ms: Some(QUIC_IDLE_TIMEOUT_MS_DEFAULT),
                shard_endpoints: Some(true),
                shard_port_base: Some(0),
            },
            metrics: MetricsSettings {
                addr: Some("127.0.0.1:9400".parse().expect("literal")),
                queue_labels: Some(true),
            },
            kafka: KafkaSettings {
                enabled: Some(true),
                addr: Some("127.0.0.1:9092".parse().expect("literal")),
                advertised_host: None,
                tls: Some(false),
                cert: None,
                key: None,
                client_ca: None,
                client_auth: None,
                client_cert_accounts: None,
            },
            quotas: QuotaSettings {
                requests_per_s: None,
                bytes_per_s: None,
                queues_per_account: Some(crate::auth::quota::QUEUES_PER_ACCOUNT_DEFAULT),
                stored_bytes_per_account: None,
            },
            cluster: None,
        }
    }

    /// Fills what is unset with the defaults and checks the whole.
    pub fn resolve(self) -> Result<Settings, ConfigError> {
        let mut s = self.or(Settings::defaults());
        let shards = s.shards.expect("default");
        if shards == 0 {
            return Err(ConfigError("shards: must be at least 1".into()));
        }
        // In a cluster one partition per queue unless set: a queue then has one leader, which
        // any node forwards to (`broker_config`).
        let default_partitions = if s.cluster.is_some() {
            1
        } else {
            shards as u32
        };
        let partitions = *s.partitions.get_or_insert(default_partitions);
        if partitions == 0 {
            return Err(ConfigError("partitions: must be at least 1".into()));
        }
        if s.region.as_deref().is_some_and(str::is_empty) {
            return Err(ConfigError("region: must not be empty".into()));
        }
        if s.quic.cert.is_some() != s.quic.key.is_some() {
            return Err(ConfigError(
                "quic.cert and quic.key: give both (or neither, for a self-signed certificate)"
                    .into(),
            ));
        }
        if let Some(map) = &s.quic.client_cert_accounts {
            if !map.is_empty() && s.quic.client_ca.is_none() {
                return Err(ConfigError(
                    "quic.client_cert_accounts: needs quic.client_ca (certificates are only \
                     trusted when they chain to it)"
                        .into(),
                ));
            }
            if let Some((name, _)) = map.iter().find(|(n, a)| n.is_empty() || !valid_account(a)) {
                return Err(ConfigError(format!(
                    "quic.client_cert_accounts[{name:?}]: an empty name or a bad account id \
                     (1-64 of A-Z a-z 0-9 - _)"
                )));
            }
        }
        s.check_kafka_security()?;
        if s.quic.idle_timeout_ms == Some(0) {
            return Err(ConfigError("quic.idle_timeout_ms: must be above 0".into()));
        }
        if s.http.header_timeout_ms == Some(0) || s.http.body_timeout_ms == Some(0) {
            return Err(ConfigError(
                "http.header_timeout_ms, http.body_timeout_ms: must be above 0".into(),
            ));
        }
        for (i, h) in s.http.allowed_hosts.iter().flatten().enumerate() {
            let name_ok = !h.is_empty()
                && h.len() <= 253
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
            if !(name_ok || h == crate::http::local::ANY_HOST) {
                return Err(ConfigError(format!(
                    "http.allowed_hosts[{i}]: {h:?} is not a host name (no port, no scheme) or \"*\""
                )));
            }
        }
        let keys = s.auth.access_keys.as_deref().unwrap_or_default();
        for (i, k) in keys.iter().enumerate() {
            let account = k.account.as_deref().unwrap_or(DEFAULT_TENANT);
            if k.id.is_empty() || k.secret.is_empty() || !valid_account(account) {
                return Err(ConfigError(format!(
                    "auth.access_keys[{i}]: empty id or secret, or a bad account id \
                     (1-64 of A-Z a-z 0-9 - _)"
                )));
            }
        }
        if s.quotas.requests_per_s == Some(0)
            || s.quotas.bytes_per_s == Some(0)
            || s.quotas.queues_per_account == Some(0)
            || s.quotas.stored_bytes_per_account == Some(0)
        {
            return Err(ConfigError(
                "quotas: requests_per_s, bytes_per_s, queues_per_account and \
                 stored_bytes_per_account must be above 0 \
                 (leave a rate unset for no limit)"
                    .into(),
            ));
        }
        if s.auth.mode == Some(AuthName::Sigv4) && keys.is_empty() {
            return Err(ConfigError(
                "auth.mode = \"sigv4\" needs auth.access_keys (or SLUICE_ACCESS_KEYS)".into(),
            ));
        }
        if let Some(cluster) = &s.cluster {
            crate::cluster::config::check_settings(cluster)
                .map_err(|e| ConfigError(e.to_string()))?;
        }
        Ok(s)
    }

    /// `[kafka]`'s TLS settings and `auth.scram_credentials`.
    fn check_kafka_security(&self) -> Result<(), ConfigError> {
        let k = &self.kafka;
        if k.cert.is_some() != k.key.is_some() {
            return Err(ConfigError(
                "kafka.cert and kafka.key: give both (or neither, for the QUIC listener's \
                 certificate)"
                    .into(),
            ));
        }
        let tls_only = k.cert.is_some()
            || k.client_ca.is_some()
            || k.client_auth.is_some()
            || k.client_cert_accounts.is_some();
        if tls_only && k.tls != Some(true) {
            return Err(ConfigError(
                "kafka.cert, key, client_ca, client_auth, client_cert_accounts: need \
                 kafka.tls = true (the listener is plaintext otherwise)"
                    .into(),
            ));
        }
        if k.client_ca.is_none() && (k.client_auth.is_some() || k.client_cert_accounts.is_some()) {
            return Err(ConfigError(
                "kafka.client_auth, kafka.client_cert_accounts: need kafka.client_ca \
                 (certificates are only trusted when they chain to it)"
                    .into(),
            ));
        }
        if let Some((name, _)) = k
            .client_cert_accounts
            .iter()
            .flatten()
            .find(|(n, a)| n.is_empty() || !valid_account(a))
        {
            return Err(ConfigError(format!(
                "kafka.client_cert_accounts[{name:?}]: an empty name or a bad account id \
                 (1-64 of A-Z a-z 0-9 - _)"
            )));
        }
        for (i, c) in self.auth.scram_credentials.iter().flatten().enumerate() {
            c.credential().map_err(|e| {
                ConfigError(format!("auth.scram_credentials[{i}] ({:?}): {e}", c.user))
            })?;
        }
        Ok(())
    }

    /// The same settings with every secret replaced by [`REDACTED`]: what may be printed.
    pub fn redacted(&self) -> Settings {
        let mut s = self.clone();
        for k in s.auth.access_keys.iter_mut().flatten() {
            k.secret = REDACTED.to_string();
        }
        // Not passwords, but with the salt they allow an offline dictionary attack.
        for c in s.auth.scram_credentials.iter_mut().flatten() {
            c.stored_key = REDACTED.to_string();
            c.server_key = REDACTED.to_string();
        }
        s
    }

    /// TOML text (print it only [`redacted`](Settings::redacted)).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("settings are plain TOML values")
    }

    /// One line (JSON), for the start-up log (print it only redacted).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("settings are plain JSON values")
    }

    /// Who may call, for both front ends.
    pub fn auth_config(&self) -> AuthConfig {
        let keys: HashMap<String, Credential> = self
            .auth
            .access_keys
            .iter()
            .flatten()
            .map(|k| {
                (
                    k.id.clone(),
                    Credential {
                        secret: k.secret.clone(),
                        account: k.account.clone().unwrap_or(DEFAULT_TENANT.to_string()),
                    },
                )
            })
            .collect();
        AuthConfig {
            mode: match self.auth.mode {
                Some(AuthName::Sigv4) => AuthMode::SigV4,
                _ => AuthMode::None,
            },
            keys,
        }
    }

    /// The broker configuration of resolved settings. Creates the data dir and its receipt key
    /// (and in cluster mode, on first start, the node's identity: `crate::cluster::identity`),
    /// so call it only to start.
    pub fn broker_config(&self) -> Result<BrokerConfig, PrepareError> {
        let data_dir = self.data_dir.clone().unwrap_or("sluice-data".into());
        let d = Settings::defaults();
        let shards = self.shards.or(d.shards).expect("default");
        // Before anything else is written to the data dir: the identity check looks for data.
        let cluster = match &self.cluster {
            Some(s) => Some(crate::cluster::ClusterConfig::prepare(
                s, &data_dir, shards,
            )?),
            None => None,
        };
        let mut c = BrokerConfig::embedded(data_dir)?;
        c.cluster = cluster;
        c.shards = shards;
        // In a cluster, one partition per queue unless the file says otherwise: a queue then
        // has one leader, which any node forwards to (partitions led on different nodes would
        // each need their own forwarding).
        c.default_partitions = self.partitions.unwrap_or(if c.cluster.is_some() {
            1
        } else {
            c.shards as u32
        });
        c.cpus = self.cpus.clone().unwrap_or_default();
        c.spin_before_park_us = self.spin_us;
        c.region = self.region.clone().or(d.region).expect("default");
        c.disk_free_bytes_min = self
            .disk_free_bytes_min
            .unwrap_or(crate::disk::DISK_FREE_BYTES_MIN_DEFAULT);
        c.http_addr = self.http.addr.or(d.http.addr).expect("default");
        c.auth = self.auth_config();
        c.http_header_timeout_ms = Some(
            self.http
                .header_timeout_ms
                .unwrap_or(HEADER_READ_TIMEOUT_MS_DEFAULT),
        );
        c.http_body_timeout_ms = Some(
            self.http
                .body_timeout_ms
                .unwrap_or(BODY_READ_TIMEOUT_MS_DEFAULT),
        );
        c.http_allowed_hosts = self.http.allowed_hosts.clone().unwrap_or_default();
        c.quic_enabled = self.quic.enabled.unwrap_or(true);
        c.quic_addr = self.quic.addr.or(d.quic.addr).expect("default");
        if let (Some(cert_path), Some(key_path)) = (&self.quic.cert, &self.quic.key) {
            c.quic_tls.identity = ServerIdentity::Files {
                cert_path: cert_path.clone(),
                key_path: key_path.clone(),
            };
        }
        c.quic_tls.client_ca_path = self.quic.client_ca.clone();
        c.quic_tls.client_cert_accounts =
            self.quic.client_cert_accounts.clone().unwrap_or_default();
        c.quic_idle_timeout_ms = self
            .quic
            .idle_timeout_ms
            .unwrap_or(QUIC_IDLE_TIMEOUT_MS_DEFAULT);
        c.quic_shard_port_base = match self.quic.shard_endpoints {
            Some(false) => None,
            _ => Some(self.quic.shard_port_base.unwrap_or(0)),
        };
        c.metrics_addr = self.metrics.addr.or(d.metrics.addr).expect("default");
        c.kafka_addr = match self.kafka.enabled {
            Some(false) => None,
            _ => Some(self.kafka.addr.or(d.kafka.addr).expect("default")),
        };
        c.kafka_advertised_host = self.kafka.advertised_host.clone();
        if self.kafka.tls == Some(true) {
            let mut server = c.quic_tls.clone();
            if let (Some(cert_path), Some(key_path)) = (&self.kafka.cert, &self.kafka.key) {
                server.identity = ServerIdentity::Files {
                    cert_path: cert_path.clone(),
                    key_path: key_path.clone(),
                };
            }
            server.client_ca_path = self.kafka.client_ca.clone();
            server.client_cert_accounts =
                self.kafka.client_cert_accounts.clone().unwrap_or_default();
            c.kafka_tls = Some(crate::kafka::tls::KafkaTlsOptions {
                server,
                client_cert_required: self.kafka.client_auth != Some(ClientAuth::Requested),
            });
        }
        for cred in self.auth.scram_credentials.iter().flatten() {
            // Checked by `resolve`; settings that skipped it are refused here too.
            let stored = cred
                .credential()
                .map_err(|e| std::io::Error::other(format!("auth.scram_credentials: {e}")))?;
            c.kafka_scram
                .insert(&cred.user, stored)
                .map_err(|e| std::io::Error::other(format!("auth.scram_credentials: {e}")))?;
        }
        c.quotas = crate::auth::quota::QuotaConfig {
            requests_per_s: self.quotas.requests_per_s,
            bytes_per_s: self.quotas.bytes_per_s,
            queues_per_account: self
                .quotas
                .queues_per_account
                .unwrap_or(crate::auth::quota::QUEUES_PER_ACCOUNT_DEFAULT),
            stored_bytes_per_account: self.quotas.stored_bytes_per_account,
        };
        c.metrics_queue_labels = self.metrics.queue_labels.unwrap_or(true);
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    impl Settings {
        /// The broker configuration of these settings with the data dir at `dir`.
        fn broker_config_in(mut self, dir: &Path) -> BrokerConfig {
            self.data_dir = Some(dir.to_path_buf());
            self.broker_config().expect("broker config")
        }
    }

    use super::*;

    const EXAMPLE: &str = include_str!("../../sluice.toml");

    #[test]
    fn the_example_file_loads_and_resolves() {
        let s = Settings::parse(EXAMPLE, "sluice.toml").expect("example parses");
        assert_eq!(s.data_dir.as_deref(), Some(Path::new("sluice-data")));
        assert_eq!(s.http.addr, Some("127.0.0.1:9324".parse().unwrap()));
        assert_eq!(s.quic.addr, Some("127.0.0.1:7400".parse().unwrap()));
        assert_eq!(s.metrics.addr, Some("127.0.0.1:9400".parse().unwrap()));
        let r = s.resolve().expect("example resolves");
        assert_eq!(r.quic.enabled, Some(true));
        // The example is the embedded default written out: same effective settings.
        let default = Settings::default().resolve().unwrap();
        assert_eq!(r.http, default.http);
        assert_eq!(r.auth, default.auth);
        assert_eq!(r.quic, default.quic);
        assert_eq!(r.metrics, default.metrics);
        assert_eq!(r.quotas, default.quotas);
        assert_eq!(r.kafka, default.kafka);
        assert_eq!(r.kafka.addr, Some("127.0.0.1:9092".parse().unwrap()));
    }

    #[test]
    fn no_cluster_section_is_a_single_node_with_no_identity() {
        let dir = tempfile::tempdir().unwrap();
        let c = Settings::parse("", "f")
            .unwrap()
            .resolve()
            .unwrap()
            .broker_config_in(dir.path());
        assert!(c.cluster.is_none());
        assert!(!dir
            .path()
            .join(crate::cluster::identity::NODE_ID_FILE)
            .exists());
        let printed = Settings::default().resolve().unwrap().to_toml();
        assert!(!printed.contains("cluster"), "{printed}");
    }

    #[test]
    fn a_cluster_section_reaches_the_broker_and_prints_back() {
        let tmp = tempfile::tempdir().unwrap();
        let nodes = crate::cluster::dev::prepare(tmp.path(), 3, 2).unwrap();
        let s = Settings::load(&nodes[1].config_path)
            .unwrap()
            .resolve()
            .unwrap();
        let c = s.broker_config().unwrap();
        let cluster = c.cluster.as_ref().expect("cluster mode");
        assert_eq!(cluster.identity, nodes[1].identity);
        assert_eq!(cluster.zone, "z2");
        assert_eq!(cluster.members.len(), 3);
        assert_eq!(cluster.peer_addr, nodes[1].peer_addr);
        // The effective configuration shows the section, and what is printed parses back.
        let printed = s.redacted().to_toml();
        assert!(printed.contains("[cluster]"), "{printed}");
        assert!(printed.contains("[[cluster.members]]"), "{printed}");
        assert!(printed.contains(&nodes[2].identity.disk_hex()), "{printed}");
        assert_eq!(Settings::parse(&printed, "printed").unwrap(), s.redacted());
        assert!(s.to_line().contains("\"members\""));
    }

    #[test]
    fn cluster_keys_are_checked_by_name() {
        let e = Settings::parse("[cluster]\nzones = \"z1\"\n", "f").unwrap_err();
        assert!(e.0.contains("zones"), "{e}");
        let e = Settings::parse(
            "[[cluster.members]]\nid = 1\ndisk = \"1\"\nzone = \"z\"\n\
             peer_addr = \"127.0.0.1:1\"\nhttp_addr = \"127.0.0.1:2\"\n\
             quic_addr = \"127.0.0.1:3\"\nkafka = \"x\"\n",
            "f",
        )
        .unwrap_err();
        assert!(e.0.contains("kafka"), "{e}");
        let e = Settings::parse("[cluster]\nzone = \"z1\"\n", "f")
            .unwrap()
            .resolve()
            .unwrap_err();
        assert!(e.0.contains("cluster.peer_addr"), "{e}");
    }

    #[test]
    fn kafka_can_be_moved_or_turned_off() {
        let dir = tempfile::tempdir().unwrap();
        let off = Settings::parse("[kafka]\nenabled = false\n", "f")
            .unwrap()
            .resolve()
            .unwrap()
            .broker_config_in(dir.path());
        assert_eq!(off.kafka_addr, None);
        let moved = Settings::parse("[kafka]\naddr = \"127.0.0.1:0\"\n", "f")
            .unwrap()
            .resolve()
            .unwrap()
            .broker_config_in(dir.path());
        assert_eq!(moved.kafka_addr, Some("127.0.0.1:0".parse().unwrap()));
        let default = Settings::default()
            .resolve()
            .unwrap()
            .broker_config_in(dir.path());
        assert_eq!(default.kafka_addr, Some("127.0.0.1:9092".parse().unwrap()));
    }

    #[test]
    fn kafka_tls_is_off_by_default_and_its_settings_need_it_on() {
        let dir = tempfile::tempdir().unwrap();
        let default = Settings::default()
            .resolve()
            .unwrap()
            .broker_config_in(dir.path());
        assert!(default.kafka_tls.is_none(), "plaintext unless asked");
        let on = "[kafka]\ntls = true\nclient_ca = \"ca.pem\"\nclient_auth = \"requested\"\n\
                  client_cert_accounts = { \"svc\" = \"111\" }\n";
        let c = Settings::parse(on, "f")
            .unwrap()
            .resolve()
            .unwrap()
            .broker_config_in(dir.path());
        let tls = c.kafka_tls.expect("on");
        assert!(!tls.client_cert_required);
        assert_eq!(tls.server.client_cert_accounts["svc"], "111");
        assert!(
            matches!(tls.server.identity, ServerIdentity::SelfSigned { .. }),
            "the broker's (QUIC's) certificate by default"
        );
        for bad in [
            "[kafka]\ncert = \"c.pem\"\nkey = \"k.pem\"\n",
            "[kafka]\ntls = true\ncert = \"c.pem\"\n",
            "[kafka]\ntls = true\nclient_auth = \"required\"\n",
            "[kafka]\ntls = true\nclient_cert_accounts = { \"svc\" = \"111\" }\n",
            "[kafka]\ntls = true\nclient_ca = \"ca.pem\"\nclient_cert_accounts = { \"svc\" = \"a/b\" }\n",
        ] {
            let e = Settings::parse(bad, "f").unwrap().resolve().unwrap_err();
            assert!(e.0.contains("kafka."), "{bad}: {e}");
        }
    }

    #[test]
    fn scram_credentials_load_from_what_the_cli_prints_and_are_checked() {
        use crate::auth::scram::{Mechanism, ScramCredential};
        let dir = tempfile::tempdir().unwrap();
        let cred = ScramCredential::generate(Mechanism::Sha512, "222", b"pw", 4096).unwrap();
        let text = cred.toml_entry("alice");
        let s = Settings::parse(&text, "f").unwrap().resolve().unwrap();
        assert!(
            !s.redacted().to_toml().contains(&cred.encoded().1),
            "stored keys are not printed"
        );
        let c = s.broker_config_in(dir.path());
        assert_eq!(c.kafka_scram.get("alice", Mechanism::Sha512), Some(&cred));
        let bad = text.replace("iterations = 4096", "iterations = 10");
        let e = Settings::parse(&bad, "f").unwrap().resolve().unwrap_err();
        assert!(e.0.contains("auth.scram_credentials[0]"), "{e}");
        let bad = text.replace("SCRAM-SHA-512", "SCRAM-SHA-256");
        let e = Settings::parse(&bad, "f").unwrap().resolve().unwrap_err();
        assert!(
            e.0.contains("bytes"),
            "a SHA-512 key is not a SHA-256 one: {e}"
        );
    }

    #[test]
    fn client_certificate_accounts_need_a_ca_and_valid_accounts() {
        let dir = tempfile::tempdir().unwrap();
        let ok = "[quic]\nclient_ca = \"ca.pem\"\nclient_cert_accounts = { \"svc\" = \"111\" }\n";
        let c = Settings::parse(ok, "f")
            .unwrap()
            .resolve()
            .unwrap()
            .broker_config_in(dir.path());
        assert_eq!(c.quic_tls.client_cert_accounts["svc"], "111");
        for bad in [
            "[quic]\nclient_cert_accounts = { \"svc\" = \"111\" }\n",
            "[quic]\nclient_ca = \"ca.pem\"\nclient_cert_accounts = { \"svc\" = \"a/b\" }\n",
            "[quic]\nclient_ca = \"ca.pem\"\nclient_cert_accounts = { \"\" = \"111\" }\n",
        ] {
            let e = Settings::parse(bad, "f").unwrap().resolve().unwrap_err();
            assert!(e.0.contains("client_cert_accounts"), "{e}");
        }
    }

    #[test]
    fn quotas_reach_the_broker_and_zero_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let c = Settings::parse(
            "[quotas]\nrequests_per_s = 50\nbytes_per_s = 4096\nqueues_per_account = 3\n",
            "f",
        )
        .unwrap()
        .resolve()
        .unwrap()
        .broker_config_in(dir.path());
        assert_eq!(c.quotas.requests_per_s, Some(50));
        assert_eq!(c.quotas.bytes_per_s, Some(4096));
        assert_eq!(c.quotas.queues_per_account, 3);
        let open = Settings::parse("", "f")
            .unwrap()
            .broker_config_in(dir.path());
        assert_eq!(open.quotas, crate::auth::quota::QuotaConfig::default());
        for zero in [
            "requests_per_s = 0",
            "bytes_per_s = 0",
            "queues_per_account = 0",
        ] {
            let e = Settings::parse(&format!("[quotas]\n{zero}\n"), "f")
                .unwrap()
                .resolve()
                .unwrap_err();
            assert!(e.0.contains("quotas"), "{e}");
        }
    }

    #[test]
    fn shards_spin_only_on_cores_of_their_own_unless_told() {
        let dir = tempfile::tempdir().unwrap();
        let unpinned = Settings::parse("", "f")
            .unwrap()
            .broker_config_in(dir.path());
        assert_eq!(unpinned.spin_before_park(), std::time::Duration::ZERO);
        let pinned = Settings::parse("cpus = [0, 1]\n", "f")
            .unwrap()
            .broker_config_in(dir.path());
        assert_eq!(
            pinned.spin_before_park(),
            std::time::Duration::from_micros(crate::config::SPIN_PINNED_US)
        );
        let told = Settings::parse("cpus = [0]\nspin_us = 7\n", "f")
            .unwrap()
            .broker_config_in(dir.path());
        assert_eq!(told.spin_before_park(), std::time::Duration::from_micros(7));
    }

    #[test]
    fn unknown_keys_are_rejected_by_name() {
        let e = Settings::parse("shardz = 2\n", "f").unwrap_err();
        assert!(e.0.contains("shardz"), "{e}");
        let e = Settings::parse("[quic]\nadress = \"127.0.0.1:1\"\n", "f").unwrap_err();
        assert!(e.0.contains("adress"), "{e}");
        let e = Settings::parse("[nope]\n", "f").unwrap_err();
        assert!(e.0.contains("nope"), "{e}");
    }

    #[test]
    fn bad_values_are_clear_errors() {
        let e = Settings::parse("[http]\naddr = \"nowhere\"\n", "f").unwrap_err();
        assert!(e.0.contains("addr") || e.0.contains("socket"), "{e}");
        assert!(Settings::parse("shards = \"two\"\n", "f").is_err());
        let e = Settings::parse("shards = 0\n", "f")
            .unwrap()
            .resolve()
            .unwrap_err();
        assert!(e.0.contains("shards"), "{e}");
        let e = Settings::parse("[auth]\nmode = \"sigv4\"\n", "f")
            .unwrap()
            .resolve()
            .unwrap_err();
        assert!(e.0.contains("access_keys"), "{e}");
        let e = Settings::parse("[quic]\ncert = \"c.pem\"\n", "f")
            .unwrap()
            .resolve()
            .unwrap_err();
        assert!(e.0.contains("quic.key"), "{e}");
    }

    #[test]
    fn layers_take_precedence_setting_by_setting() {
        let file = Settings::parse("shards = 3\nregion = \"eu-west-1\"\n", "f").unwrap();
        let cli = Settings {
            shards: Some(1),
            ..Settings::default()
        };
        let r = cli.or(file).resolve().unwrap();
        assert_eq!(r.shards, Some(1));
        assert_eq!(r.partitions, Some(1));
        assert_eq!(r.region.as_deref(), Some("eu-west-1"));
    }

    #[test]
    fn secrets_are_redacted_in_every_printed_form() {
        let s = Settings::parse(
            "[auth]\nmode = \"sigv4\"\naccess_keys = [{ id = \"AKID1\", secret = \"s3cr3t-v4lue\" }]\n",
            "f",
        )
        .unwrap()
        .resolve()
        .unwrap();
        let r = s.redacted();
        for text in [r.to_toml(), r.to_line()] {
            assert!(!text.contains("s3cr3t-v4lue"), "{text}");
            assert!(text.contains("AKID1") && text.contains(REDACTED), "{text}");
        }
        // What is printed parses back (the printed file can be edited and used).
        let back = Settings::parse(&r.to_toml(), "printed").unwrap();
        assert_eq!(back, r);
        assert_eq!(
            s.auth_config().keys["AKID1"].secret,
            "s3cr3t-v4lue".to_string()
        );
    }

    #[test]
    fn access_keys_parse_without_echoing_secrets() {
        let k = parse_access_keys("A:s1, B:s2:acct").unwrap();
        assert_eq!(k.len(), 2);
        assert_eq!(k[1].account.as_deref(), Some("acct"));
        let e = parse_access_keys("justonesecretword").unwrap_err();
        assert!(!e.0.contains("justonesecretword"), "{e}");
    }
}
