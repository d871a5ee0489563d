//! TLS for the QUIC front end: the server's identity, optional client certificates (mutual
//! TLS), and client configs that trust a given certificate.
//!
//! - **Local development**: with no certificate configured, the broker generates a self-signed
//!   one on first start and keeps it in the data dir ([`SELF_SIGNED_CERT_FILE`],
//!   [`SELF_SIGNED_KEY_FILE`], key mode 0600), so that clients which pinned it keep working
//!   across restarts.
//! - **Production**: configured PEM certificate chain and private key files.
//! - **Mutual TLS**: with a client CA bundle configured, a client must present a certificate
//!   that chains to it, or the handshake fails.
//!
//! Everything uses the ring crypto provider (quinn 0.11's default) and TLS 1.3 (QUIC's only
//! version), with ALPN [`ALPN`].

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The ALPN protocol id of Sluice's native protocol, version 1.
pub const ALPN: &[u8] = b"sluice/1";
/// File name of the generated self-signed certificate (PEM) in the data dir.
pub const SELF_SIGNED_CERT_FILE: &str = "quic-selfsigned-cert.pem";
/// File name of the generated self-signed certificate's private key (PEM, mode 0600).
pub const SELF_SIGNED_KEY_FILE: &str = "quic-selfsigned-key.pem";
/// Names a generated certificate is valid for: the loopback names local clients dial.
pub const SELF_SIGNED_NAMES: &[&str] = &["localhost", "127.0.0.1", "::1"];

/// What went wrong setting up TLS.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{what} {path}: {message}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("{path} contains no certificate")]
    NoCertificate { path: PathBuf },
    #[error(
        "only one of {cert} and {key} exists; remove the other or restore it (refusing to \
         replace a certificate that clients may have pinned)"
    )]
    HalfIdentity { cert: PathBuf, key: PathBuf },
    #[error("generating a self-signed certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("TLS configuration is not usable for QUIC: {0}")]
    Quic(String),
}

/// A certificate chain (leaf first) and its private key.
#[derive(Debug)]
pub struct Identity {
    pub cert_chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self {
            cert_chain: self.cert_chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl Identity {
    /// The leaf certificate (what a client pins in local-dev mode).
    pub fn leaf(&self) -> &CertificateDer<'static> {
        &self.cert_chain[0]
    }
}

/// Where the server's identity comes from.
#[derive(Clone, Debug)]
pub enum ServerIdentity {
    /// Generate a self-signed certificate in this directory on first start; reuse it later.
    SelfSigned { data_dir: PathBuf },
    /// PEM files configured by the operator.
    Files {
        cert_path: PathBuf,
        key_path: PathBuf,
    },
}

/// The server side of TLS.
#[derive(Clone, Debug)]
pub struct ServerTlsOptions {
    pub identity: ServerIdentity,
    /// PEM bundle of CAs that client certificates must chain to; `None`: no client auth.
    pub client_ca_path: Option<PathBuf>,
    /// A verified client certificate's name (its subject's common name, else a DNS name of
    /// its subject alternative names) → the account it acts for. A certificate named here
    /// authenticates its connection without an access key.
    pub client_cert_accounts: std::collections::BTreeMap<String, String>,
}

/// The names a client certificate goes by, in the order [`ServerTlsOptions::client_cert_accounts`]
/// tries them: subject common names, then DNS subject alternative names. A certificate that
/// does not parse has none (the TLS layer verified it; it just maps to no account).
pub fn client_cert_names(der: &[u8]) -> Vec<String> {
    use x509_parser::prelude::*;
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return Vec::new();
    };
    let mut names: Vec<String> = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_string))
        .collect();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let GeneralName::DNSName(d) = n {
                names.push((*d).to_string());
            }
        }
    }
    names
}

/// Whether [`load_or_create_self_signed`] generated new files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provenance {
    Generated,
    Reused,
}

/// Loads the self-signed identity from `data_dir`, generating and storing it if absent.
pub fn load_or_create_self_signed(data_dir: &Path) -> Result<(Identity, Provenance), TlsError> {
    let cert_path = data_dir.join(SELF_SIGNED_CERT_FILE);
    let key_path = data_dir.join(SELF_SIGNED_KEY_FILE);
    match (cert_path.exists(), key_path.exists()) {
        (true, true) => {
            warn_if_key_is_readable_by_others(&key_path);
            Ok((load_identity(&cert_path, &key_path)?, Provenance::Reused))
        }
        (false, false) => {
            let names: Vec<String> = SELF_SIGNED_NAMES.iter().map(|s| s.to_string()).collect();
            let generated = rcgen::generate_simple_self_signed(names)?;
            // Durably, like the key and certificate written into it.
            sluice_storage::fs::create_dir_all_durable_blocking(data_dir, |d| {
                fs::create_dir_all(d)
            })
            .map_err(|source| TlsError::Io {
                what: "creating data dir",
                path: data_dir.to_owned(),
                source,
            })?;
            // Key first: a crash between the two leaves only a key, which we report rather
            // than silently replace (see HalfIdentity); both are written atomically.
            write_atomically(
                &key_path,
                generated.signing_key.serialize_pem().as_bytes(),
                0o600,
            )?;
            write_atomically(&cert_path, generated.cert.pem().as_bytes(), 0o644)?;
            tracing::info!(cert = %cert_path.display(), "generated a self-signed QUIC certificate");
            let identity = Identity {
                cert_chain: vec![generated.cert.der().clone()],
                key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
                    generated.signing_key.serialize_der(),
                )),
            };
            Ok((identity, Provenance::Generated))
        }
        _ => Err(TlsError::HalfIdentity {
            cert: cert_path,
            key: key_path,
        }),
    }
}

/// Loads a PEM certificate chain and a PEM private key (PKCS#8, PKCS#1 or SEC1).
pub fn load_identity(cert_path: &Path, key_path: &Path) -> Result<Identity, TlsError> {
    let cert_chain = load_certs(cert_path)?;
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| TlsError::Pem {
        what: "reading private key",
        path: key_path.to_owned(),
        message: e.to_string(),
    })?;
    Ok(Identity { cert_chain, key })
}

/// Loads every certificate of a PEM file; at least one must be there.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_err = |e: rustls::pki_types::pem::Error| TlsError::Pem {
        what: "reading certificates",
        path: path.to_owned(),
        message: e.to_string(),
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem_err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_err)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// Resolves the configured identity (generating the self-signed one if needed).
pub fn server_identity(options: &ServerTlsOptions) -> Result<Identity, TlsError> {
    match &options.identity {
        ServerIdentity::SelfSigned { data_dir } => Ok(load_or_create_self_signed(data_dir)?.0),
        ServerIdentity::Files {
            cert_path,
            key_path,
        } => load_identity(cert_path, key_path),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls server config: TLS 1.3, ALPN `sluice/1`, client certificates required and
/// verified against `client_ca` when given.
pub fn rustls_server_config(
    identity: &Identity,
    client_ca: Option<&[CertificateDer<'static>]>,
) -> Result<rustls::ServerConfig, TlsError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(cas) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in cas {
                roots.add(ca.clone())?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .build()?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config =
        builder.with_single_cert(identity.cert_chain.clone(), identity.key.clone_key())?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    Ok(config)
}

/// The quinn server config for `options` (transport parameters are quinn's defaults; the
/// caller may adjust `transport_config`).
pub fn server_config(options: &ServerTlsOptions) -> Result<quinn::ServerConfig, TlsError> {
    let identity = server_identity(options)?;
    let client_ca = options
        .client_ca_path
        .as_deref()
        .map(load_certs)
        .transpose()?;
    quinn_server_config(&identity, client_ca.as_deref())
}

/// A quinn server config from an identity and optional client CAs.
pub fn quinn_server_config(
    identity: &Identity,
    client_ca: Option<&[CertificateDer<'static>]>,
) -> Result<quinn::ServerConfig, TlsError> {
    let tls = rustls_server_config(identity, client_ca)?;
    let quic = QuicServerConfig::try_from(tls).map_err(|e| TlsError::Quic(e.to_string()))?;
    Ok(quinn::ServerConfig::with_crypto(Arc::new(quic)))
}

/// A rustls client config that trusts exactly `trusted` (e.g. the broker's self-signed
/// certificate) and, for mutual TLS, presents `client_identity`.
pub fn rustls_client_config(
    trusted: &[CertificateDer<'static>],
    client_identity: Option<&Identity>,
) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in trusted {
        roots.add(cert.clone())?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots);
    let mut config = match client_identity {
        None => builder.with_no_client_auth(),
        Some(id) => builder.with_client_auth_cert(id.cert_chain.clone(), id.key.clone_key())?,
    };
    config.alpn_protocols = vec![ALPN.to_vec()];
    Ok(config)
}

/// A quinn client config trusting `trusted` (tests, and the SDK's local-dev mode).
pub fn client_config_trusting(
    trusted: &[CertificateDer<'static>],
    client_identity: Option<&Identity>,
) -> Result<quinn::ClientConfig, TlsError> {
    let tls = rustls_client_config(trusted, client_identity)?;
    let quic = QuicClientConfig::try_from(tls).map_err(|e| TlsError::Quic(e.to_string()))?;
    Ok(quinn::ClientConfig::new(Arc::new(quic)))
}

/// Writes `bytes` to `path` via a temporary file, fsync and rename, with `mode`.
fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TlsError> {
    let io_err = |what, source| TlsError::Io {
        what,
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        // The mode applies at creation, so the key is never readable by others, even briefly.
        .mode(mode)
        .open(&tmp)
        .map_err(|e| io_err("creating", e))?;
    file.write_all(bytes).map_err(|e| io_err("writing", e))?;
    file.sync_all().map_err(|e| io_err("syncing", e))?;
    drop(file);
    fs::rename(&tmp, path).map_err(|e| io_err("renaming into", e))?;
    if let Some(dir) = path.parent() {
        // Make the rename durable; failure here only risks regenerating after a crash.
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

fn warn_if_key_is_readable_by_others(key_path: &Path) {
    if let Ok(meta) = fs::metadata(key_path) {
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                path = %key_path.display(),
                mode = format!("{mode:o}"),
                "QUIC private key is readable by group or others; expected 0600"
            );
        }
    }
}
