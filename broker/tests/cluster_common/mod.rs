//! What the tests of the cluster's network share: one glommio executor at a time, and a
//! cluster CA that signs node certificates (`sluice-node-<id>`).

use std::sync::{Mutex, MutexGuard};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sluice_broker::cluster::node_cert_name;
use sluice_broker::quic::tls::Identity;
use sluice_raft::NodeId;

/// glommio locks memory per executor and memlock is small here: one executor at a time.
static EXECUTORS: Mutex<()> = Mutex::new(());

pub fn executor_lock() -> MutexGuard<'static, ()> {
    EXECUTORS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub fn run<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let _lock = executor_lock();
    glommio::LocalExecutorBuilder::default()
        .spawn(f)
        .expect("spawn executor")
        .join()
        .expect("executor thread");
}

/// A cluster CA that signs node certificates.
pub struct Ca {
    pub cert: CertificateDer<'static>,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate().expect("CA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} cluster CA"));
        let cert = params.self_signed(&key).expect("CA cert");
        Ca {
            cert: cert.der().clone(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A certificate for `node` (its id as the DNS name `sluice-node-<id>`).
    pub fn node(&self, node: NodeId) -> Identity {
        let key = rcgen::KeyPair::generate().expect("node key");
        let cert = rcgen::CertificateParams::new(vec![node_cert_name(node)])
            .expect("node params")
            .signed_by(&key, &self.issuer)
            .expect("node cert");
        Identity {
            cert_chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        }
    }
}
