//! TLS settings of a client: whom to trust, and the client's own certificate for mutual TLS.

use std::path::PathBuf;
use std::sync::Arc;

use quinn::crypto::rustls::QuicClientConfig;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::error::{Error, Result};

/// The ALPN id of Sluice's native protocol, version 1 (the broker insists on it).
pub const ALPN: &[u8] = b"sluice/1";

/// Whom the client trusts.
#[derive(Clone, Debug)]
pub enum Trust {
    /// Trust the certificates in this PEM file: a CA bundle, or the broker's own self-signed
    /// certificate (`<data dir>/quic-selfsigned-cert.pem` for a broker started without one).
    PemFile(PathBuf),
    /// Trust these DER certificates.
    Certificates(Vec<Vec<u8>>),
    /// **Do not verify the broker's certificate at all.** Anyone on the path can then read and
    /// change the traffic. For local development against a throw-away broker only.
    DangerousSkipVerification,
}

/// A client certificate for mutual TLS.
#[derive(Clone, Debug)]
pub struct ClientIdentity {
    /// PEM certificate chain, leaf first.
    pub cert_path: PathBuf,
    /// PEM private key.
    pub key_path: PathBuf,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub(crate) fn client_config(
    trust: &Trust,
    identity: Option<&ClientIdentity>,
) -> Result<quinn::ClientConfig> {
    let tls_err = |e: &dyn std::fmt::Display| Error::Tls(e.to_string());
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| tls_err(&e))?;
    let builder = match trust {
        Trust::DangerousSkipVerification => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(SkipServerVerification(provider()))),
        Trust::PemFile(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(Error::Tls(format!(
                    "{}: no certificate in it",
                    path.display()
                )));
            }
            builder.with_root_certificates(roots(certs)?)
        }
        Trust::Certificates(ders) => builder.with_root_certificates(roots(
            ders.iter()
                .map(|d| CertificateDer::from(d.clone()))
                .collect(),
        )?),
    };
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some(id) => {
            let chain = CertificateDer::pem_file_iter(&id.cert_path)
                .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| Error::Tls(format!("{}: {e}", id.cert_path.display())))?;
            let key = PrivateKeyDer::from_pem_file(&id.key_path)
                .map_err(|e| Error::Tls(format!("{}: {e}", id.key_path.display())))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| tls_err(&e))?
        }
    };
    config.alpn_protocols = vec![ALPN.to_vec()];
    let quic = QuicClientConfig::try_from(config).map_err(|e| tls_err(&e))?;
    Ok(quinn::ClientConfig::new(Arc::new(quic)))
}

fn roots(certs: Vec<CertificateDer<'static>>) -> Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs {
        roots.add(c).map_err(|e| Error::Tls(e.to_string()))?;
    }
    Ok(roots)
}

/// Accepts any certificate but still checks that the handshake is signed by the key of the
/// certificate presented (so the session keys are at least bound to *some* certificate).
#[derive(Debug)]
struct SkipServerVerification(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for SkipServerVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
