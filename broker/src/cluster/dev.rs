//! A cluster on one machine, for development: what `sluice dev cluster`, `sluice cluster
//! init-node` and `sluice cluster certs` do.
//!
//! [`prepare`] lays out a directory (re-run on it, it keeps every node's identity and, when
//! they are still free, its ports):
//!
//! ```text
//! <dir>/ca/ca-cert.pem, ca-key.pem      the cluster CA (made once)
//! <dir>/node<i>/data/                   node i's data dir (node.id in it)
//! <dir>/node<i>/node-cert.pem, -key.pem its certificate, naming sluice-node-<id>
//! <dir>/node<i>/sluiced.toml            its config: every listener on loopback, zone z<i>
//! <dir>/node<i>/sluiced.log             its log (stderr), appended to
//! ```
//!
//! [`DevCluster::start`] runs one `sluiced --config <dir>/node<i>/sluiced.toml` per node
//! (the binary: `SLUICED_BIN`, else next to the running executable: [`find_sluiced`]) and
//! waits until each answers `/ready`; [`DevCluster::stop`] (or drop) stops them with SIGTERM,
//! then SIGKILL after [`STOP_TIMEOUT`].

use super::identity::{self, NodeIdentity, Provenance};
use crate::config_file::{ClusterSettings, MemberSettings, Settings};
use crate::quic::tls::{self, TlsError};
use sluice_raft::NodeId;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// File names of the CA in its directory.
pub const CA_CERT_FILE: &str = "ca-cert.pem";
pub const CA_KEY_FILE: &str = "ca-key.pem";
/// File names of a node's certificate and key in its directory.
pub const NODE_CERT_FILE: &str = "node-cert.pem";
pub const NODE_KEY_FILE: &str = "node-key.pem";
/// A node's config and log in its directory.
pub const NODE_CONFIG_FILE: &str = "sluiced.toml";
pub const NODE_LOG_FILE: &str = "sluiced.log";
/// The environment variable naming the `sluiced` binary.
pub const SLUICED_BIN_ENV: &str = "SLUICED_BIN";
/// At most this many nodes (a cluster's member limit).
pub const DEV_NODES_MAX: usize = super::MEMBERS_MAX;
/// How long [`DevCluster::start`] waits for every node's `/ready`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a node has to stop after SIGTERM before it is killed.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// Attempts at finding `shards` consecutive free UDP ports for a node's peer endpoints.
const PEER_PORT_ATTEMPTS: usize = 64;
/// Poll step while waiting for a node.
const POLL_STEP: Duration = Duration::from_millis(50);
/// Bound on one HTTP exchange with a node's metrics endpoint.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);
/// Lines of a node's log shown when it fails to start.
const LOG_TAIL_LINES: usize = 20;

/// What went wrong preparing or running a local cluster.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Identity(#[from] identity::IdentityError),
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(
        "only one of {cert} and {key} exists: restore the other, or remove both to make a new \
         CA (every node certificate must then be made again)"
    )]
    HalfCa { cert: PathBuf, key: PathBuf },
    #[error("{0}")]
    Config(#[from] crate::config_file::ConfigError),
    #[error("--nodes {0}: a local cluster has 1 to {DEV_NODES_MAX} nodes")]
    Nodes(usize),
    #[error("--shards {0}: must be at least 1")]
    Shards(usize),
    #[error("no {shards} consecutive free UDP ports found on 127.0.0.1 for the peer endpoints")]
    NoPeerPorts { shards: usize },
    #[error(
        "sluiced not found: set {SLUICED_BIN_ENV}, or build it next to this binary \
         (cargo build --release --bin sluiced); looked for {0}"
    )]
    NoSluiced(PathBuf),
    #[error("node {node} exited ({status}) during start; log {log}:\n{tail}")]
    Exited {
        node: usize,
        status: ExitStatus,
        log: PathBuf,
        tail: String,
    },
    #[error("node {node} not ready within {timeout:?}; log {log}:\n{tail}")]
    NotReady {
        node: usize,
        timeout: Duration,
        log: PathBuf,
        tail: String,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> DevError + 'a {
    move |source| DevError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `bytes` to `path` atomically and durably (tmp with `mode`, fsync, rename, dir fsync).
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), DevError> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io_err("creating", &tmp))?;
    f.write_all(bytes).map_err(io_err("writing", &tmp))?;
    f.sync_all().map_err(io_err("syncing", &tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io_err("renaming into", path))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err("syncing", dir))?;
    }
    Ok(())
}

fn create_dir(dir: &Path) -> Result<(), DevError> {
    crate::config_perms::create_data_dir(dir).map_err(io_err("creating", dir))
}

/// The cluster CA: signs node certificates.
pub struct Ca {
    pub cert_path: PathBuf,
    /// Whether [`Ca::load_or_create`] made it now.
    pub provenance: identity::Provenance,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Ca {
    /// Loads the CA in `dir` ([`CA_CERT_FILE`], [`CA_KEY_FILE`]), creating it if neither file
    /// is there; one without the other is refused.
    pub fn load_or_create(dir: &Path) -> Result<Ca, DevError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        match (cert_path.exists(), key_path.exists()) {
            (true, true) => {
                let read = |p: &Path| std::fs::read_to_string(p).map_err(io_err("reading", p));
                let key = rcgen::KeyPair::from_pem(&read(&key_path)?)?;
                let issuer = rcgen::Issuer::from_ca_cert_pem(&read(&cert_path)?, key)?;
                Ok(Ca {
                    cert_path,
                    provenance: Provenance::Loaded,
                    issuer,
                })
            }
            (false, false) => {
                create_dir(dir)?;
                let key = rcgen::KeyPair::generate()?;
                let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
                params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
                params
                    .distinguished_name
                    .push(rcgen::DnType::CommonName, "Sluice cluster CA");
                params.key_usages = vec![
                    rcgen::KeyUsagePurpose::KeyCertSign,
                    rcgen::KeyUsagePurpose::CrlSign,
                ];
                let cert = params.self_signed(&key)?;
                // Key first: a crash between the two leaves a key alone, refused (HalfCa)
                // rather than silently replaced.
                write_file(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
                write_file(&cert_path, cert.pem().as_bytes(), 0o644)?;
                Ok(Ca {
                    cert_path,
                    provenance: Provenance::Created,
                    issuer: rcgen::Issuer::new(params, key),
                })
            }
            _ => Err(DevError::HalfCa {
                cert: cert_path,
                key: key_path,
            }),
        }
    }

    /// Makes a certificate for `node` (DNS name `sluice-node-<node>`, for server and client
    /// authentication) and writes it and its key to `out` ([`NODE_CERT_FILE`],
    /// [`NODE_KEY_FILE`]), replacing what is there.
    pub fn issue_node_cert(&self, node: NodeId, out: &Path) -> Result<NodeCert, DevError> {
        create_dir(out)?;
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(vec![super::node_cert_name(node)])?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, super::node_cert_name(node));
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.issuer)?;
        let paths = NodeCert {
            cert: out.join(NODE_CERT_FILE),
            key: out.join(NODE_KEY_FILE),
        };
        write_file(&paths.key, key.serialize_pem().as_bytes(), 0o600)?;
        write_file(&paths.cert, cert.pem().as_bytes(), 0o644)?;
        Ok(paths)
    }
}

/// Where a node's certificate and key are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl NodeCert {
    /// The node id the certificate at `self.cert` names, if it is there and names one.
    pub fn names(&self) -> Option<NodeId> {
        if !self.key.exists() {
            return None;
        }
        let certs = tls::load_certs(&self.cert).ok()?;
        super::node_id_from_cert(certs.first()?)
    }
}

/// One node of a local cluster, as [`prepare`] laid it out.
#[derive(Clone, Debug)]
pub struct DevNode {
    /// 1-based, as in its directory's name (`node<index>`).
    pub index: usize,
    pub identity: NodeIdentity,
    pub zone: String,
    pub dir: PathBuf,
    pub data_dir: PathBuf,
    pub config_path: PathBuf,
    pub log_path: PathBuf,
    pub http_addr: SocketAddr,
    pub quic_addr: SocketAddr,
    pub kafka_addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    /// Shard 0's peer endpoint (shard i: port + i).
    pub peer_addr: SocketAddr,
}

impl DevNode {
    /// The self-signed certificate the node's QUIC listener presents (made at its first start).
    pub fn quic_cert(&self) -> PathBuf {
        self.data_dir.join(tls::SELF_SIGNED_CERT_FILE)
    }
}

/// Ports held while they are picked, so that no two listeners get the same one.
#[derive(Default)]
struct PortPicker {
    tcp: Vec<TcpListener>,
    udp: Vec<UdpSocket>,
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

impl PortPicker {
    /// `want` if it can be bound now, else a free port; held until the picker is dropped.
    fn tcp(&mut self, want: Option<SocketAddr>) -> Result<SocketAddr, DevError> {
        let try_bind = |a: SocketAddr| TcpListener::bind(a).and_then(|l| Ok((l.local_addr()?, l)));
        let (addr, l) = match want.map(try_bind) {
            Some(Ok(ok)) => ok,
            _ => try_bind(loopback(0)).map_err(io_err("binding", Path::new("127.0.0.1:0")))?,
        };
        self.tcp.push(l);
        Ok(addr)
    }

    fn udp_one(&mut self, want: Option<SocketAddr>) -> Result<SocketAddr, DevError> {
        let (addr, s) = self.udp_bind(want)?;
        self.udp.push(s);
        Ok(addr)
    }

    fn udp_bind(&self, want: Option<SocketAddr>) -> Result<(SocketAddr, UdpSocket), DevError> {
        let try_bind = |a: SocketAddr| UdpSocket::bind(a).and_then(|s| Ok((s.local_addr()?, s)));
        match want.map(try_bind) {
            Some(Ok(ok)) => Ok(ok),
            _ => try_bind(loopback(0)).map_err(io_err("binding", Path::new("127.0.0.1:0"))),
        }
    }

    /// `shards` consecutive free UDP ports (shard i's peer endpoint on port + i); `want`'s
    /// first if they are all free.
    fn udp_run(&mut self, want: Option<SocketAddr>, shards: usize) -> Result<SocketAddr, DevError> {
        let mut want = want;
        for _ in 0..PEER_PORT_ATTEMPTS {
            let (base, first) = self.udp_bind(want.take())?;
            let mut held = vec![first];
            for i in 1..shards {
                let Some(addr) = super::config::shard_addr(base, i) else {
                    break;
                };
                match UdpSocket::bind(addr) {
                    Ok(s) => held.push(s),
                    Err(_) => break,
                }
            }
            if held.len() == shards {
                self.udp.extend(held);
                return Ok(base);
            }
        }
        Err(DevError::NoPeerPorts { shards })
    }
}

/// The addresses a node's existing config gives, to keep them across re-runs.
#[derive(Default)]
struct Previous {
    http: Option<SocketAddr>,
    quic: Option<SocketAddr>,
    kafka: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
    peer: Option<SocketAddr>,
}

impl Previous {
    fn of(config_path: &Path) -> Previous {
        let Ok(s) = Settings::load(config_path) else {
            return Previous::default();
        };
        Previous {
            http: s.http.addr,
            quic: s.quic.addr,
            kafka: s.kafka.addr,
            metrics: s.metrics.addr,
            peer: s.cluster.and_then(|c| c.peer_addr),
        }
    }
}

/// Lays out (or refreshes) a local cluster of `nodes` nodes with `shards` shards each in
/// `dir`: identities, CA, certificates, one config file per node. Nothing is started.
pub fn prepare(dir: &Path, nodes: usize, shards: usize) -> Result<Vec<DevNode>, DevError> {
    if !(1..=DEV_NODES_MAX).contains(&nodes) {
        return Err(DevError::Nodes(nodes));
    }
    if shards == 0 {
        return Err(DevError::Shards(shards));
    }
    create_dir(dir)?;
    // Absolute paths in the configs: the nodes may be started from anywhere.
    let dir = std::fs::canonicalize(dir).map_err(io_err("resolving", dir))?;
    let ca = Ca::load_or_create(&dir.join("ca"))?;
    let mut picker = PortPicker::default();
    let mut laid_out = Vec::with_capacity(nodes);
    for index in 1..=nodes {
        let node_dir = dir.join(format!("node{index}"));
        let data_dir = node_dir.join("data");
        let (identity, _) = identity::load_or_create(&data_dir)?;
        let cert = NodeCert {
            cert: node_dir.join(NODE_CERT_FILE),
            key: node_dir.join(NODE_KEY_FILE),
        };
        // A new CA (the old one was removed) or a certificate of another node: make it again.
        if ca.provenance == Provenance::Created || cert.names() != Some(identity.node) {
            ca.issue_node_cert(identity.node, &node_dir)?;
        }
        let config_path = node_dir.join(NODE_CONFIG_FILE);
        let prev = Previous::of(&config_path);
        laid_out.push(DevNode {
            index,
            identity,
            zone: format!("z{index}"),
            log_path: node_dir.join(NODE_LOG_FILE),
            http_addr: picker.tcp(prev.http)?,
            quic_addr: picker.udp_one(prev.quic)?,
            kafka_addr: picker.tcp(prev.kafka)?,
            metrics_addr: picker.tcp(prev.metrics)?,
            peer_addr: picker.udp_run(prev.peer, shards)?,
            dir: node_dir,
            data_dir,
            config_path,
        });
    }
    // One receipt key for the cluster: a handle a leader signed must verify on the next one.
    share_receipt_key(&laid_out)?;
    let members: Vec<MemberSettings> = laid_out
        .iter()
        .map(|n| MemberSettings {
            id: n.identity.node,
            disk: n.identity.disk_hex(),
            zone: n.zone.clone(),
            peer_addr: n.peer_addr,
            http_addr: n.http_addr,
            quic_addr: n.quic_addr,
            kafka_addr: Some(n.kafka_addr),
        })
        .collect();
    for n in &laid_out {
        let settings = node_settings(n, shards, &ca.cert_path, &members);
        // What the node will refuse, refused here with the file's name.
        settings.clone().resolve()?;
        let text = format!(
            "# A node of the local cluster made by `sluice dev cluster` (re-made on every \
             run).\n{}",
            settings.to_toml()
        );
        write_file(&n.config_path, text.as_bytes(), 0o600)?;
    }
    Ok(laid_out)
}

/// Gives every node the first node's receipt key (made there if it has none).
fn share_receipt_key(nodes: &[DevNode]) -> Result<(), DevError> {
    let Some(first) = nodes.first() else {
        return Ok(());
    };
    let key = crate::config::load_or_create_receipt_key(&first.data_dir)
        .map_err(io_err("reading the receipt key in", &first.data_dir))?;
    for n in &nodes[1..] {
        let path = n.data_dir.join(crate::config::RECEIPT_KEY_FILE);
        if std::fs::read(&path).ok().as_deref() != Some(key.as_slice()) {
            write_file(&path, &key, 0o600)?;
        }
    }
    Ok(())
}

fn node_settings(
    n: &DevNode,
    shards: usize,
    ca_cert: &Path,
    members: &[MemberSettings],
) -> Settings {
    let mut s = Settings {
        data_dir: Some(n.data_dir.clone()),
        shards: Some(shards),
        ..Settings::default()
    };
    s.http.addr = Some(n.http_addr);
    s.quic.addr = Some(n.quic_addr);
    s.kafka.addr = Some(n.kafka_addr);
    s.metrics.addr = Some(n.metrics_addr);
    s.cluster = Some(ClusterSettings {
        zone: Some(n.zone.clone()),
        peer_addr: Some(n.peer_addr),
        cert: Some(n.dir.join(NODE_CERT_FILE)),
        key: Some(n.dir.join(NODE_KEY_FILE)),
        ca: Some(ca_cert.to_path_buf()),
        members: Some(members.to_vec()),
    });
    s
}

/// The `sluiced` binary: `$SLUICED_BIN`, else `sluiced` next to the running executable.
pub fn find_sluiced() -> Result<PathBuf, DevError> {
    if let Some(p) = std::env::var_os(SLUICED_BIN_ENV) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(io_err("locating", Path::new("current exe")))?;
    let candidate = exe.with_file_name("sluiced");
    if candidate.is_file() {
        Ok(candidate)
    } else {
        Err(DevError::NoSluiced(candidate))
    }
}

/// The last [`LOG_TAIL_LINES`] lines of a log.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

/// A bounded `GET path` on `addr`; the status code and body.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect_timeout(&addr, HTTP_TIMEOUT)?;
    s.set_read_timeout(Some(HTTP_TIMEOUT))?;
    s.set_write_timeout(Some(HTTP_TIMEOUT))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no HTTP status line"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Running `sluiced` processes, one per node. Dropping it stops them.
pub struct DevCluster {
    pub nodes: Vec<DevNode>,
    children: Vec<Option<Child>>,
}

impl DevCluster {
    /// Starts one `sluiced` per node and waits (up to `ready_timeout`) until each answers
    /// `/ready`. A node that exits or stays unready stops them all and is reported with the
    /// end of its log.
    pub fn start(
        nodes: Vec<DevNode>,
        sluiced: &Path,
        ready_timeout: Duration,
    ) -> Result<DevCluster, DevError> {
        let mut cluster = DevCluster {
            children: Vec::with_capacity(nodes.len()),
            nodes: Vec::new(),
        };
        for n in &nodes {
            cluster.children.push(Some(spawn_node(n, sluiced)?));
            cluster.nodes.push(n.clone());
        }
        cluster.wait_ready(0..nodes.len(), ready_timeout)?;
        Ok(cluster)
    }

    /// Kills node `index` (1-based) with SIGKILL, as a crash would, and reaps it.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = index
            .checked_sub(1)
            .and_then(|i| self.children.get_mut(i))
            .and_then(Option::take)
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops node `index` (1-based) as an operator would: SIGTERM, then SIGKILL after
    /// [`STOP_TIMEOUT`]; its exit status (`None` if it was not running).
    pub fn terminate(&mut self, index: usize) -> Option<ExitStatus> {
        let mut child = index
            .checked_sub(1)
            .and_then(|i| self.children.get_mut(i))
            .and_then(Option::take)?;
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: kill(2) takes no pointers; `pid` is our own child, not yet reaped.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = crate::runtime::monotonic_now() + STOP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(s)) => return Some(s),
                Ok(None) if crate::runtime::monotonic_now() < deadline => {
                    std::thread::sleep(POLL_STEP)
                }
                _ => {
                    let _ = child.kill();
                    return child.wait().ok();
                }
            }
        }
    }

    /// Starts node `index` (1-based) again on its data dir (after [`DevCluster::kill`]) and
    /// waits until it is ready.
    pub fn restart(
        &mut self,
        index: usize,
        sluiced: &Path,
        ready_timeout: Duration,
    ) -> Result<(), DevError> {
        let i = index.checked_sub(1).filter(|&i| i < self.nodes.len());
        let i = i.ok_or(DevError::Nodes(index))?;
        self.kill(index);
        self.children[i] = Some(spawn_node(&self.nodes[i], sluiced)?);
        self.wait_ready(i..i + 1, ready_timeout)
    }

    fn wait_ready(
        &mut self,
        which: std::ops::Range<usize>,
        timeout: Duration,
    ) -> Result<(), DevError> {
        let deadline = crate::runtime::monotonic_now() + timeout;
        for i in which {
            loop {
                if let Some((node, status)) = self.exited().into_iter().next() {
                    let n = &self.nodes[node - 1];
                    return Err(DevError::Exited {
                        node,
                        status,
                        log: n.log_path.clone(),
                        tail: log_tail(&n.log_path),
                    });
                }
                let n = &self.nodes[i];
                if matches!(http_get(n.metrics_addr, "/ready"), Ok((200, _))) {
                    break;
                }
                if crate::runtime::monotonic_now() >= deadline {
                    return Err(DevError::NotReady {
                        node: n.index,
                        timeout,
                        log: n.log_path.clone(),
                        tail: log_tail(&n.log_path),
                    });
                }
                std::thread::sleep(POLL_STEP);
            }
        }
        Ok(())
    }

    /// Nodes (1-based index) whose process has exited since the last call, with its status.
    pub fn exited(&mut self) -> Vec<(usize, ExitStatus)> {
        let mut out = Vec::new();
        for (i, slot) in self.children.iter_mut().enumerate() {
            if let Some(child) = slot {
                if let Ok(Some(status)) = child.try_wait() {
                    out.push((i + 1, status));
                    *slot = None;
                }
            }
        }
        out
    }

    /// The process id of node `index` (1-based), while it runs.
    pub fn pid(&self, index: usize) -> Option<u32> {
        self.children
            .get(index.checked_sub(1)?)?
            .as_ref()
            .map(Child::id)
    }

    /// Stops every node: SIGTERM, then SIGKILL after [`STOP_TIMEOUT`]. Returns each node's
    /// exit status (`None`: it had already exited and was reported by [`DevCluster::exited`]).
    pub fn stop(mut self) -> Vec<Option<ExitStatus>> {
        self.stop_all()
    }

    fn stop_all(&mut self) -> Vec<Option<ExitStatus>> {
        for child in self.children.iter().flatten() {
            if let Ok(pid) = libc::pid_t::try_from(child.id()) {
                // SAFETY: kill(2) takes no pointers; `pid` is our own child, not yet reaped
                // (its id cannot have been reused).
                unsafe {
                    libc::kill(pid, libc::SIGTERM);
                }
            }
        }
        let deadline = crate::runtime::monotonic_now() + STOP_TIMEOUT;
        let mut statuses = Vec::with_capacity(self.children.len());
        for slot in &mut self.children {
            let Some(mut child) = slot.take() else {
                statuses.push(None);
                continue;
            };
            let status = loop {
                match child.try_wait() {
                    Ok(Some(s)) => break Some(s),
                    Ok(None) if crate::runtime::monotonic_now() < deadline => {
                        std::thread::sleep(POLL_STEP)
                    }
                    _ => {
                        let _ = child.kill();
                        break child.wait().ok();
                    }
                }
            };
            statuses.push(status);
        }
        statuses
    }
}

/// Starts `sluiced` for node `n`, its output appended to the node's log.
fn spawn_node(n: &DevNode, sluiced: &Path) -> Result<Child, DevError> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&n.log_path)
        .map_err(io_err("opening", &n.log_path))?;
    let log2 = log.try_clone().map_err(io_err("opening", &n.log_path))?;
    let mut cmd = Command::new(sluiced);
    // The caller's SLUICE_* variables would override every node's file (flags and
    // environment come first), e.g. one SLUICE_DATA_DIR for all of them.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SLUICE_") {
            cmd.env_remove(k);
        }
    }
    cmd.arg("--config")
        .arg(&n.config_path)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .spawn()
        .map_err(io_err("starting", sluiced))
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// How to reach the cluster, for people: every node's addresses and client commands.
pub fn describe(nodes: &[DevNode], cluster_dir: &Path) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for n in nodes {
        let _ = writeln!(
            out,
            "node{} id {} zone {}\n  sqs http://{}  quic {}  kafka {}  metrics http://{}/metrics  \
             peer {}\n  config {}  log {}",
            n.index,
            n.identity.node,
            n.zone,
            n.http_addr,
            n.quic_addr,
            n.kafka_addr,
            n.metrics_addr,
            n.peer_addr,
            n.config_path.display(),
            n.log_path.display(),
        );
    }
    if let Some(first) = nodes.first() {
        let kafka: Vec<String> = nodes.iter().map(|n| n.kafka_addr.to_string()).collect();
        let _ = writeln!(
            out,
            "\nPoint clients at any node (or at all of them):\n  \
             aws --endpoint-url http://{} sqs list-queues\n  \
             sluice --endpoint {} --ca-cert {} queue list\n  \
             kafka bootstrap.servers={}\n\
             Cluster files (CA, certificates, data, logs): {}",
            first.http_addr,
            first.quic_addr,
            first.quic_cert().display(),
            kafka.join(","),
            cluster_dir.display(),
        );
    }
    out
}

/// Blocks SIGINT and SIGTERM in this thread and in every thread and child process started
/// after (children: `sluiced` waits for them with sigwait itself), so that
/// [`wait_for_signal`] takes them. Call it before [`DevCluster::start`].
pub fn block_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset/pthread_sigmask only touch the set we own; the mask change
    // applies to this thread and is inherited by what it starts, which is the intent.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Waits up to `timeout` for one of `set`'s signals; the signal, or `None` on timeout.
pub fn wait_for_signal(set: &libc::sigset_t, timeout: Duration) -> Option<i32> {
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `set` is an initialized signal set, `ts` a valid timespec; a null siginfo
    // pointer is allowed.
    let sig = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
    (sig > 0).then_some(sig)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_certificate_names_its_node_and_a_half_ca_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = Ca::load_or_create(&tmp.path().join("ca")).unwrap();
        assert_eq!(ca.provenance, Provenance::Created);
        let cert = ca.issue_node_cert(42, &tmp.path().join("n")).unwrap();
        assert_eq!(cert.names(), Some(42));
        // The same CA loads back and signs for another node.
        let again = Ca::load_or_create(&tmp.path().join("ca")).unwrap();
        assert_eq!(again.provenance, Provenance::Loaded);
        assert_eq!(
            again
                .issue_node_cert(43, &tmp.path().join("m"))
                .unwrap()
                .names(),
            Some(43)
        );
        std::fs::remove_file(tmp.path().join("ca").join(CA_CERT_FILE)).unwrap();
        let e = Ca::load_or_create(&tmp.path().join("ca")).err().unwrap();
        assert!(matches!(e, DevError::HalfCa { .. }), "{e}");
    }

    #[test]
    fn prepare_keeps_identities_and_certificates_across_runs() {
        let tmp = tempfile::tempdir().unwrap();
        let first = prepare(tmp.path(), 3, 2).unwrap();
        let ids: Vec<_> = first.iter().map(|n| n.identity).collect();
        let zones: Vec<_> = first.iter().map(|n| n.zone.as_str()).collect();
        assert_eq!(zones, ["z1", "z2", "z3"]);
        let cert = std::fs::read(first[0].dir.join(NODE_CERT_FILE)).unwrap();
        for n in &first {
            // Every config resolves and is this node's.
            let s = Settings::load(&n.config_path).unwrap().resolve().unwrap();
            let c = s.cluster.unwrap();
            assert_eq!(c.members.as_ref().unwrap().len(), 3);
            assert_eq!(c.zone.as_deref(), Some(n.zone.as_str()));
            let peer = n.peer_addr;
            assert!(peer.ip().is_loopback() && peer.port() != 0);
        }
        let second = prepare(tmp.path(), 3, 2).unwrap();
        assert_eq!(second.iter().map(|n| n.identity).collect::<Vec<_>>(), ids);
        assert_eq!(
            std::fs::read(second[0].dir.join(NODE_CERT_FILE)).unwrap(),
            cert
        );
        // Ports still free are kept.
        assert_eq!(second[1].http_addr, first[1].http_addr);
        assert_eq!(second[2].peer_addr, first[2].peer_addr);
    }

    #[test]
    fn node_counts_outside_the_member_limits_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(matches!(prepare(tmp.path(), 0, 1), Err(DevError::Nodes(0))));
        assert!(matches!(
            prepare(tmp.path(), DEV_NODES_MAX + 1, 1),
            Err(DevError::Nodes(_))
        ));
        assert!(matches!(
            prepare(tmp.path(), 3, 0),
            Err(DevError::Shards(0))
        ));
    }
}
