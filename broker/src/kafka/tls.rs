//! TLS on the Kafka port (Kafka's `SSL` and `SASL_SSL` security protocols): the broker's
//! certificate — configured PEM files, else the one QUIC uses (configured, or self-signed in
//! the data dir; `crate::quic::tls`) — and optional client certificates, verified against a CA
//! bundle and mapped to accounts by name as on QUIC. A client whose verified certificate is
//! mapped acts in that account with no SASL; one that also logs in must name the same account.
//!
//! rustls (ring provider; TLS 1.2 and 1.3, since Kafka clients of every age connect) runs over
//! glommio's socket through `futures-rustls`: the connection's frame loop reads and writes the
//! TLS stream exactly as it does the plain one.

use crate::config::BrokerConfig;
use crate::quic::tls::{self as quic_tls, ServerTlsOptions, TlsError};
use futures_rustls::server::TlsStream;
use futures_rustls::TlsAcceptor;
use std::sync::Arc;
use std::time::Duration;

/// A client that has not finished its TLS handshake this long after connecting is dropped
/// (a connection slot is not held by a peer that never speaks).
pub const KAFKA_TLS_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;

/// TLS settings of the Kafka listener.
#[derive(Clone, Debug)]
pub struct KafkaTlsOptions {
    /// Identity, client CA bundle and certificate name → account map, as for QUIC.
    pub server: ServerTlsOptions,
    /// With a client CA: refuse clients without a certificate (Kafka's
    /// `ssl.client.auth=required`); false: verify one if presented (`requested`), so that
    /// clients that log in with SASL need none.
    pub client_cert_required: bool,
}

/// One shard's TLS acceptor and the certificate-name map.
pub struct KafkaTls {
    acceptor: TlsAcceptor,
    cert_accounts: std::collections::BTreeMap<String, String>,
}

/// The rustls server config for `options`: no ALPN (Kafka clients send none).
pub fn server_config(options: &KafkaTlsOptions) -> Result<rustls::ServerConfig, TlsError> {
    let identity = quic_tls::server_identity(&options.server)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match &options.server.client_ca_path {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in quic_tls::load_certs(path)? {
                roots.add(ca)?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            );
            let verifier = if options.client_cert_required {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            builder.with_client_cert_verifier(verifier.build()?)
        }
    };
    Ok(builder.with_single_cert(identity.cert_chain.clone(), identity.key.clone_key())?)
}

/// Checks the configuration and makes the identity exist before the shards start (a start
/// with a bad certificate fails here, naming it; two shards generating a self-signed
/// certificate at once would race).
pub fn prepare(config: &BrokerConfig) -> std::io::Result<()> {
    match (&config.kafka_addr, &config.kafka_tls) {
        (Some(_), Some(options)) => server_config(options)
            .map(|_| ())
            .map_err(|e| std::io::Error::other(format!("Kafka listener TLS: {e}"))),
        _ => Ok(()),
    }
}

impl KafkaTls {
    /// This shard's acceptor, if TLS is on.
    pub fn for_shard(config: &BrokerConfig) -> Result<Option<KafkaTls>, TlsError> {
        let Some(options) = &config.kafka_tls else {
            return Ok(None);
        };
        Ok(Some(KafkaTls {
            acceptor: TlsAcceptor::from(Arc::new(server_config(options)?)),
            cert_accounts: options.server.client_cert_accounts.clone(),
        }))
    }

    /// Runs the server side of the handshake (bounded by [`KAFKA_TLS_HANDSHAKE_TIMEOUT_MS`]);
    /// returns the stream and the account of the client's certificate, if it is mapped.
    pub async fn accept(
        &self,
        stream: glommio::net::TcpStream,
    ) -> std::io::Result<(TlsStream<glommio::net::TcpStream>, Option<String>)> {
        let handshake = self.acceptor.accept(stream);
        let timeout = glommio::timer::sleep(Duration::from_millis(KAFKA_TLS_HANDSHAKE_TIMEOUT_MS));
        futures::pin_mut!(handshake);
        futures::pin_mut!(timeout);
        let tls = match futures::future::select(handshake, timeout).await {
            futures::future::Either::Left((done, _)) => done?,
            futures::future::Either::Right(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "TLS handshake timed out",
                ))
            }
        };
        let account = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| {
                quic_tls::client_cert_names(leaf)
                    .into_iter()
                    .find_map(|name| self.cert_accounts.get(&name).cloned())
            });
        Ok((tls, account))
    }
}
