//! The cluster's configuration: the `[cluster]` section of the config file
//! (`crate::config_file::ClusterSettings`) checked against this node's identity
//! (`super::identity`) and certificate, as [`ClusterConfig`] in `BrokerConfig::cluster`.
//!
//! Two stages:
//!
//! 1. [`check_settings`], with the file alone (`Settings::resolve`): every field present, 1 to
//!    [`MEMBERS_MAX`] members, distinct ids, disks and peer addresses, every zone named.
//! 2. [`ClusterConfig::prepare`], at start, with the data dir: this node's identity loaded or
//!    created, this node listed among the members *with the same disk id* (a wiped disk has a
//!    new one, so it is refused until the cluster replaces it), its zone and peer port those of
//!    its entry, its certificate loaded and naming its node id, the cluster CA loaded.
//!
//! Shard `i` of every node listens for peers at `peer_addr`'s port + `i` and talks to shard
//! `i` of the others (a partition's replicas live on the same core index on every node), so
//! every member runs the same number of shards.

use super::identity::{self, IdentityError, NodeIdentity, Provenance};
use crate::config_file::{ClusterSettings, MemberSettings};
use crate::quic::tls::{self, Identity, TlsError};
use rustls::pki_types::CertificateDer;
use sluice_raft::{DiskId, NodeId};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// At most this many members: a quorum of 4 of 7 is the largest that still commits quickly
/// across zones; larger clusters shard their groups over subsets (not built).
pub const MEMBERS_MAX: usize = 7;
/// A cluster of one is allowed (a first node, or a test).
pub const MEMBERS_MIN: usize = 1;

/// One member of the bootstrap membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: NodeId,
    pub disk: DiskId,
    pub zone: String,
    /// Where shard 0 of the member listens for peers (shard `i`: port + `i`).
    pub peer_addr: SocketAddr,
    /// The member's client addresses: for forwarding (HTTP) and for Kafka metadata.
    pub http_addr: SocketAddr,
    pub quic_addr: SocketAddr,
    pub kafka_addr: Option<SocketAddr>,
}

impl Member {
    /// Where shard `shard` of this member listens for peers.
    pub fn peer_addr_of_shard(&self, shard: usize) -> Option<SocketAddr> {
        shard_addr(self.peer_addr, shard)
    }
}

/// `base`'s port + `shard` (port 0 stays 0: each shard picks its own); `None` past 65535.
pub fn shard_addr(base: SocketAddr, shard: usize) -> Option<SocketAddr> {
    if base.port() == 0 {
        return Some(base);
    }
    let port = u16::try_from(usize::from(base.port()) + shard).ok()?;
    Some(SocketAddr::new(base.ip(), port))
}

/// A checked cluster configuration: who this node is and who the others are.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// This node, from `<data>/node.id`.
    pub identity: NodeIdentity,
    pub zone: String,
    /// Where shard 0 listens for peers (shard `i`: port + `i`; port 0: each picks one).
    pub peer_addr: SocketAddr,
    /// This node's certificate (naming `sluice-node-<id>`) and key, signed by the cluster CA.
    pub tls: Identity,
    /// The cluster CA: peers' certificates must chain to it.
    pub ca: Vec<CertificateDer<'static>>,
    /// Every member, this node included, in the file's order.
    pub members: Vec<Member>,
}

impl ClusterConfig {
    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.identity.node
    }

    /// The members other than this node.
    pub fn peers(&self) -> impl Iterator<Item = &Member> {
        let me = self.identity.node;
        self.members.iter().filter(move |m| m.id != me)
    }

    /// The member named `id`.
    pub fn member(&self, id: NodeId) -> Option<&Member> {
        self.members.iter().find(|m| m.id == id)
    }

    /// Checks `settings` (already through [`check_settings`]) against this node: loads or
    /// creates its identity in `data_dir`, loads its certificate and the CA. `shards`: this
    /// node's shard count (its peer ports run from `peer_addr` to `peer_addr + shards - 1`).
    pub fn prepare(
        settings: &ClusterSettings,
        data_dir: &Path,
        shards: usize,
    ) -> Result<ClusterConfig, ClusterConfigError> {
        let members = check_settings(settings)?;
        fn required<T: Clone>(v: &Option<T>, field: &'static str) -> Result<T, ClusterConfigError> {
            v.clone().ok_or(ClusterConfigError::Missing(field))
        }
        let zone = required(&settings.zone, "zone")?;
        let peer_addr = required(&settings.peer_addr, "peer_addr")?;
        let cert = required(&settings.cert, "cert")?;
        let key = required(&settings.key, "key")?;
        let ca_path = required(&settings.ca, "ca")?;
        if shard_addr(peer_addr, shards.max(1) - 1).is_none() {
            return Err(ClusterConfigError::PeerPortRange {
                peer_addr,
                shards: shards.max(1),
            });
        }
        let (identity, provenance) = identity::load_or_create(data_dir)?;
        if provenance == Provenance::Created {
            tracing::info!(
                node = identity.node,
                disk = %identity.disk_hex(),
                data_dir = %data_dir.display(),
                "created this node's identity ({})", identity::NODE_ID_FILE
            );
        }
        let me = match members.iter().find(|m| m.id == identity.node) {
            None => {
                return Err(ClusterConfigError::NotAMember {
                    node: identity.node,
                    disk: identity.disk_hex(),
                    data_dir: data_dir.to_path_buf(),
                })
            }
            Some(m) if m.disk != identity.disk => {
                return Err(ClusterConfigError::DiskMismatch {
                    node: identity.node,
                    listed: identity::format_disk(m.disk),
                    actual: identity.disk_hex(),
                })
            }
            Some(m) => m,
        };
        if me.zone != zone {
            return Err(ClusterConfigError::ZoneMismatch {
                zone,
                listed: me.zone.clone(),
            });
        }
        if peer_addr.port() != 0 && peer_addr.port() != me.peer_addr.port() {
            return Err(ClusterConfigError::PeerPortMismatch {
                peer_addr,
                listed: me.peer_addr,
            });
        }
        let tls = tls::load_identity(&cert, &key).map_err(ClusterConfigError::Tls)?;
        match super::node_id_from_cert(tls.leaf()) {
            Some(n) if n == identity.node => {}
            named => {
                return Err(ClusterConfigError::CertificateNode {
                    path: cert,
                    node: identity.node,
                    named,
                })
            }
        }
        let ca = tls::load_certs(&ca_path).map_err(ClusterConfigError::Tls)?;
        Ok(ClusterConfig {
            identity,
            zone,
            peer_addr,
            tls,
            ca,
            members,
        })
    }
}

/// What is wrong with the cluster configuration. Each message names the setting and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ClusterConfigError {
    #[error("cluster.{0}: required in cluster mode")]
    Missing(&'static str),
    #[error("cluster.members: {count} members; a cluster has {MEMBERS_MIN} to {MEMBERS_MAX}")]
    MemberCount { count: usize },
    #[error("cluster.members[{index}]: id 0 is not a node id (ids come from `sluice cluster init-node`)")]
    ZeroId { index: usize },
    #[error("cluster.members[{index}]: node id {id} is listed twice")]
    DuplicateId { index: usize, id: NodeId },
    #[error(
        "cluster.members[{index}].disk: {value:?} is not a disk id (1-32 hex digits, non-zero, \
         as `sluice cluster init-node` prints it)"
    )]
    BadDisk { index: usize, value: String },
    #[error("cluster.members[{index}].disk: disk {disk} is listed twice")]
    DuplicateDisk { index: usize, disk: String },
    #[error("cluster.members[{index}].peer_addr: {addr} is listed twice")]
    DuplicatePeerAddr { index: usize, addr: SocketAddr },
    #[error("cluster.members[{index}].peer_addr: port 0 (a member's peers must know its port)")]
    PeerPortZero { index: usize },
    #[error("cluster.zone: must not be empty")]
    EmptyZone,
    #[error("cluster.members[{index}].zone: must not be empty")]
    EmptyMemberZone { index: usize },
    #[error(
        "cluster.peer_addr: {peer_addr} with {shards} shards needs ports up to port + {} \
         (above 65535)",
        shards - 1
    )]
    PeerPortRange {
        peer_addr: SocketAddr,
        shards: usize,
    },
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(
        "this node (id {node}, disk {disk}, from {}/{}) is not in cluster.members: add it \
         (`sluice cluster init-node --data-dir {}` prints the entry's id and disk)",
        data_dir.display(), identity::NODE_ID_FILE, data_dir.display()
    )]
    NotAMember {
        node: NodeId,
        disk: String,
        data_dir: PathBuf,
    },
    #[error(
        "cluster.members lists node {node} with disk {listed}, but this data dir is disk \
         {actual}: the data dir was wiped or replaced, and a new disk must not pass as the old \
         node's (it would vote without its log). The node must be replaced as a new member"
    )]
    DiskMismatch {
        node: NodeId,
        listed: String,
        actual: String,
    },
    #[error("cluster.zone: {zone:?}, but this node's entry in cluster.members says {listed:?}")]
    ZoneMismatch { zone: String, listed: String },
    #[error(
        "cluster.peer_addr: {peer_addr}, but this node's entry in cluster.members says {listed} \
         (the ports must agree: peers dial the listed one)"
    )]
    PeerPortMismatch {
        peer_addr: SocketAddr,
        listed: SocketAddr,
    },
    #[error("cluster TLS: {0}")]
    Tls(TlsError),
    #[error(
        "cluster.cert: {path} names {} but this node is {node}: make one with `sluice cluster \
         certs --node-id {node}`",
        match named { Some(n) => format!("node {n}"), None => "no node (no DNS name sluice-node-<id>)".to_string() }
    )]
    CertificateNode {
        path: PathBuf,
        node: NodeId,
        named: Option<NodeId>,
    },
}

/// Checks what can be checked without the data dir; returns the parsed members.
pub fn check_settings(s: &ClusterSettings) -> Result<Vec<Member>, ClusterConfigError> {
    for (field, present) in [
        ("zone", s.zone.is_some()),
        ("peer_addr", s.peer_addr.is_some()),
        ("cert", s.cert.is_some()),
        ("key", s.key.is_some()),
        ("ca", s.ca.is_some()),
        ("members", s.members.is_some()),
    ] {
        if !present {
            return Err(ClusterConfigError::Missing(field));
        }
    }
    if s.zone.as_deref().is_some_and(|z| z.trim().is_empty()) {
        return Err(ClusterConfigError::EmptyZone);
    }
    let listed: &[MemberSettings] = s.members.as_deref().unwrap_or_default();
    if !(MEMBERS_MIN..=MEMBERS_MAX).contains(&listed.len()) {
        return Err(ClusterConfigError::MemberCount {
            count: listed.len(),
        });
    }
    let mut ids = HashSet::new();
    let mut disks = HashSet::new();
    let mut peers = HashSet::new();
    let mut members = Vec::with_capacity(listed.len());
    for (index, m) in listed.iter().enumerate() {
        if m.id == 0 {
            return Err(ClusterConfigError::ZeroId { index });
        }
        if !ids.insert(m.id) {
            return Err(ClusterConfigError::DuplicateId { index, id: m.id });
        }
        let disk = identity::parse_disk(&m.disk).ok_or_else(|| ClusterConfigError::BadDisk {
            index,
            value: m.disk.clone(),
        })?;
        if !disks.insert(disk) {
            return Err(ClusterConfigError::DuplicateDisk {
                index,
                disk: identity::format_disk(disk),
            });
        }
        if m.zone.trim().is_empty() {
            return Err(ClusterConfigError::EmptyMemberZone { index });
        }
        // A cluster of one is never dialed; any other member must have a known port.
        if m.peer_addr.port() == 0 && listed.len() > 1 {
            return Err(ClusterConfigError::PeerPortZero { index });
        }
        if !peers.insert(m.peer_addr) {
            return Err(ClusterConfigError::DuplicatePeerAddr {
                index,
                addr: m.peer_addr,
            });
        }
        members.push(Member {
            id: m.id,
            disk,
            zone: m.zone.clone(),
            peer_addr: m.peer_addr,
            http_addr: m.http_addr,
            quic_addr: m.quic_addr,
            kafka_addr: m.kafka_addr,
        });
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::dev::Ca;
    use crate::config_file::Settings;

    /// A one-node-of-three cluster laid out in a temporary dir: this node's data dir, its
    /// certificate, the CA, and the `[cluster]` text with two other members.
    struct Fixture {
        _tmp: tempfile::TempDir,
        data_dir: PathBuf,
        ca: Ca,
        node_dir: PathBuf,
        me: NodeIdentity,
    }

    impl Fixture {
        fn new() -> Fixture {
            let tmp = tempfile::tempdir().unwrap();
            let data_dir = tmp.path().join("data");
            let (me, _) = identity::load_or_create(&data_dir).unwrap();
            let ca = Ca::load_or_create(&tmp.path().join("ca")).unwrap();
            let node_dir = tmp.path().join("node");
            ca.issue_node_cert(me.node, &node_dir).unwrap();
            Fixture {
                _tmp: tmp,
                data_dir,
                ca,
                node_dir,
                me,
            }
        }

        fn member(id: u64, disk: &str, zone: &str, port: u16) -> String {
            format!(
                "[[cluster.members]]\nid = {id}\ndisk = \"{disk}\"\nzone = \"{zone}\"\n\
                 peer_addr = \"127.0.0.1:{port}\"\nhttp_addr = \"127.0.0.1:{}\"\n\
                 quic_addr = \"127.0.0.1:{}\"\nkafka_addr = \"127.0.0.1:{}\"\n",
                port + 1,
                port + 2,
                port + 3
            )
        }

        /// The config text: `[cluster]` with `zone`, and these members (this node first).
        fn text(&self, zone: &str, members: &[String]) -> String {
            let d = self.node_dir.display();
            format!(
                "[cluster]\nzone = \"{zone}\"\npeer_addr = \"127.0.0.1:7500\"\n\
                 cert = \"{d}/node-cert.pem\"\nkey = \"{d}/node-key.pem\"\nca = \"{}\"\n{}",
                self.ca.cert_path.display(),
                members.concat()
            )
        }

        fn standard(&self) -> String {
            self.text(
                "z1",
                &[
                    Self::member(self.me.node, &self.me.disk_hex(), "z1", 7500),
                    Self::member(2, "2", "z2", 7600),
                    Self::member(3, "3", "z3", 7700),
                ],
            )
        }

        fn prepare(&self, text: &str) -> Result<ClusterConfig, ClusterConfigError> {
            let s = Settings::parse(text, "f").unwrap();
            ClusterConfig::prepare(s.cluster.as_ref().unwrap(), &self.data_dir, 2)
        }
    }

    #[test]
    fn a_listed_node_with_its_certificate_is_accepted() {
        let f = Fixture::new();
        let c = f.prepare(&f.standard()).unwrap();
        assert_eq!(c.identity, f.me);
        assert_eq!(c.node_id(), f.me.node);
        assert_eq!(c.zone, "z1");
        assert_eq!(c.peers().map(|m| m.id).collect::<Vec<_>>(), [2, 3]);
        let m2 = c.member(2).unwrap();
        assert_eq!(m2.kafka_addr, Some("127.0.0.1:7603".parse().unwrap()));
        assert_eq!(
            m2.peer_addr_of_shard(1),
            Some("127.0.0.1:7601".parse().unwrap())
        );
        assert_eq!(c.ca.len(), 1);
    }

    #[test]
    fn a_node_missing_from_the_members_is_refused_with_its_ids() {
        let f = Fixture::new();
        let text = f.text(
            "z1",
            &[
                Fixture::member(2, "2", "z2", 7600),
                Fixture::member(3, "3", "z3", 7700),
            ],
        );
        let e = f.prepare(&text).unwrap_err();
        assert!(matches!(e, ClusterConfigError::NotAMember { node, .. } if node == f.me.node));
        let msg = e.to_string();
        assert!(
            msg.contains(&f.me.disk_hex()) && msg.contains("init-node"),
            "{msg}"
        );
    }

    #[test]
    fn a_wiped_disk_under_a_listed_id_is_refused() {
        let f = Fixture::new();
        let text = f.standard();
        f.prepare(&text).unwrap();
        // The disk is wiped: the node comes back with a new identity that the list does not
        // know; listing the old id with the new disk's data dir is the mismatch case.
        std::fs::remove_dir_all(&f.data_dir).unwrap();
        let e = f.prepare(&text).unwrap_err();
        assert!(matches!(e, ClusterConfigError::NotAMember { .. }), "{e}");
        let new = identity::load(&f.data_dir)
            .unwrap()
            .expect("a new identity");
        let wrong_disk = f.text(
            "z1",
            &[
                Fixture::member(new.node, &f.me.disk_hex(), "z1", 7500),
                Fixture::member(2, "2", "z2", 7600),
            ],
        );
        let e = f.prepare(&wrong_disk).unwrap_err();
        assert!(matches!(e, ClusterConfigError::DiskMismatch { .. }), "{e}");
    }

    #[test]
    fn a_certificate_of_another_node_is_refused() {
        let f = Fixture::new();
        f.ca.issue_node_cert(f.me.node + 1, &f.node_dir).unwrap();
        let e = f.prepare(&f.standard()).unwrap_err();
        assert!(
            matches!(e, ClusterConfigError::CertificateNode { named: Some(n), .. } if n == f.me.node + 1),
            "{e}"
        );
        assert!(e.to_string().contains("sluice cluster certs"), "{e}");
    }

    #[test]
    fn zone_and_peer_port_must_match_this_nodes_entry() {
        let f = Fixture::new();
        let zone = f.text(
            "z9",
            &[Fixture::member(f.me.node, &f.me.disk_hex(), "z1", 7500)],
        );
        assert!(matches!(
            f.prepare(&zone).unwrap_err(),
            ClusterConfigError::ZoneMismatch { .. }
        ));
        let port = f.text(
            "z1",
            &[Fixture::member(f.me.node, &f.me.disk_hex(), "z1", 7900)],
        );
        assert!(matches!(
            f.prepare(&port).unwrap_err(),
            ClusterConfigError::PeerPortMismatch { .. }
        ));
    }

    #[test]
    fn data_without_identity_stops_cluster_mode() {
        let f = Fixture::new();
        std::fs::remove_file(f.data_dir.join(identity::NODE_ID_FILE)).unwrap();
        std::fs::create_dir(f.data_dir.join("meta")).unwrap();
        let e = f.prepare(&f.standard()).unwrap_err();
        assert!(
            matches!(
                e,
                ClusterConfigError::Identity(IdentityError::DataWithoutIdentity { .. })
            ),
            "{e}"
        );
    }

    fn checked(text: &str) -> Result<Vec<Member>, ClusterConfigError> {
        check_settings(
            Settings::parse(text, "f")
                .unwrap()
                .cluster
                .as_ref()
                .unwrap(),
        )
    }

    /// Whether a refusal is the expected one.
    type Expect = fn(&ClusterConfigError) -> bool;

    const HEAD: &str = "[cluster]\nzone = \"z1\"\npeer_addr = \"127.0.0.1:7500\"\n\
                        cert = \"c\"\nkey = \"k\"\nca = \"a\"\n";

    #[test]
    fn the_member_list_is_checked_before_start() {
        let m = Fixture::member;
        let ok = format!("{HEAD}{}{}", m(1, "a1", "z1", 7500), m(2, "a2", "z2", 7600));
        assert_eq!(checked(&ok).unwrap().len(), 2);
        let cases: Vec<(String, Expect)> = vec![
            (format!("{HEAD}members = []\n"), |e| {
                matches!(e, ClusterConfigError::MemberCount { count: 0 })
            }),
            (
                format!(
                    "{HEAD}{}",
                    (1..=8u64)
                        .map(|i| m(i, &format!("{i:x}"), "z", 7000 + 10 * i as u16))
                        .collect::<String>()
                ),
                |e| matches!(e, ClusterConfigError::MemberCount { count: 8 }),
            ),
            (
                format!("{HEAD}{}{}", m(1, "a1", "z1", 7500), m(1, "a2", "z2", 7600)),
                |e| matches!(e, ClusterConfigError::DuplicateId { index: 1, id: 1 }),
            ),
            (
                format!("{HEAD}{}{}", m(1, "a1", "z1", 7500), m(2, "a1", "z2", 7600)),
                |e| matches!(e, ClusterConfigError::DuplicateDisk { index: 1, .. }),
            ),
            (format!("{HEAD}{}", m(0, "a1", "z1", 7500)), |e| {
                matches!(e, ClusterConfigError::ZeroId { index: 0 })
            }),
            (format!("{HEAD}{}", m(1, "not-hex", "z1", 7500)), |e| {
                matches!(e, ClusterConfigError::BadDisk { index: 0, .. })
            }),
            (format!("{HEAD}{}", m(1, "a1", " ", 7500)), |e| {
                matches!(e, ClusterConfigError::EmptyMemberZone { index: 0 })
            }),
            (
                format!("{HEAD}{}{}", m(1, "a1", "z1", 7500), m(2, "a2", "z2", 0)),
                |e| matches!(e, ClusterConfigError::PeerPortZero { index: 1 }),
            ),
            (
                format!("{HEAD}{}{}", m(1, "a1", "z1", 7500), m(2, "a2", "z2", 7500)),
                |e| matches!(e, ClusterConfigError::DuplicatePeerAddr { index: 1, .. }),
            ),
            ("[cluster]\nzone = \"z1\"\n".to_string(), |e| {
                matches!(e, ClusterConfigError::Missing("peer_addr"))
            }),
            (
                format!(
                    "{}{}",
                    HEAD.replace("\"z1\"", "\"\""),
                    m(1, "a1", "z1", 7500)
                ),
                |e| matches!(e, ClusterConfigError::EmptyZone),
            ),
        ];
        for (text, want) in cases {
            let e = checked(&text).unwrap_err();
            assert!(want(&e), "{e} for\n{text}");
            // The same refusal stops the file at resolve, by the setting's name.
            let r = Settings::parse(&text, "f").unwrap().resolve().unwrap_err();
            assert!(r.0.starts_with("cluster."), "{r}");
        }
    }

    #[test]
    fn peer_ports_of_shards_stay_below_65536() {
        assert_eq!(shard_addr("127.0.0.1:65535".parse().unwrap(), 1), None);
        assert_eq!(
            shard_addr("127.0.0.1:0".parse().unwrap(), 3),
            Some("127.0.0.1:0".parse().unwrap())
        );
        let f = Fixture::new();
        let text = f.standard().replace(
            "peer_addr = \"127.0.0.1:7500\"\ncert",
            "peer_addr = \"127.0.0.1:65535\"\ncert",
        );
        let e = f.prepare(&text).unwrap_err();
        assert!(matches!(e, ClusterConfigError::PeerPortRange { .. }), "{e}");
    }
}
