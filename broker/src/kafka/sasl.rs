//! SASL on the Kafka port: PLAIN (an access key id and its secret) and SCRAM-SHA-256/512
//! (`crate::auth::scram`, credentials stored salted and hashed), through SaslHandshake and
//! SaslAuthenticate (KIP-152). PLAIN also takes the bare frame that follows a SaslHandshake
//! v0; SCRAM is served from v1 only (every client since Kafka 1.0 sends v1).
//!
//! A failed authentication is answered `SASL_AUTHENTICATION_FAILED` after
//! [`KAFKA_AUTH_FAILURE_DELAY_MS`] (Kafka's `connection.failed.authentication.delay.ms`), and the
//! connection closes, as Kafka's does. Failures are counted per peer address on each shard
//! ([`FailedLogins`]): past [`KAFKA_AUTH_FAILURE_BURST`] at once and
//! [`KAFKA_AUTH_FAILURES_PER_S`] after, a peer's logins are refused unchecked until its bucket
//! refills, so a password guesser gets a bounded number of tries a second.

use super::dispatch::code;
use super::Conn;
use crate::auth::scram::{self, Exchange, FailedLogins, Mechanism};
use crate::runtime;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use std::cell::RefCell;
use std::net::IpAddr;

/// How long a failed authentication waits before its answer (Kafka's default delay): slows a
/// guesser on one connection, and a client that reconnects at once.
pub const KAFKA_AUTH_FAILURE_DELAY_MS: u64 = 100;
/// Failed logins a peer address may have at once, per shard.
pub const KAFKA_AUTH_FAILURE_BURST: u32 = 10;
/// Failed logins a peer address may have per second after its burst, per shard.
pub const KAFKA_AUTH_FAILURES_PER_S: f64 = 1.0;
/// Peer addresses whose failures one shard remembers (bounded memory; see `FailedLogins`).
pub const KAFKA_AUTH_PEERS_TRACKED_MAX: usize = 10_000;

thread_local! {
    /// This shard's failed logins (a shard is a thread: no lock, no cross-core traffic).
    static FAILED_LOGINS: RefCell<FailedLogins<IpAddr>> = RefCell::new(FailedLogins::new(
        KAFKA_AUTH_FAILURES_PER_S,
        KAFKA_AUTH_FAILURE_BURST,
        KAFKA_AUTH_PEERS_TRACKED_MAX,
    ));
}

/// Where a connection is in its SASL exchange.
#[derive(Debug, Default)]
pub enum Step {
    #[default]
    Idle,
    /// A SaslHandshake chose PLAIN; the next SaslAuthenticate carries the credentials.
    Plain,
    /// A SaslHandshake chose SCRAM; the next SaslAuthenticate is the client-first message.
    ScramFirst(Mechanism),
    /// The server-first message was sent; the next is the client-final message.
    ScramFinal(Box<Exchange>),
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// The mechanisms named to clients.
const MECHANISMS: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

pub async fn handshake(
    conn: &mut Conn,
    version: i16,
    req: SaslHandshakeRequest,
) -> Result<SaslHandshakeResponse, i16> {
    let mut r = SaslHandshakeResponse::default();
    r.mechanisms = MECHANISMS.iter().map(|m| s(m)).collect();
    let name = req.mechanism.as_str();
    match (name, Mechanism::from_name(name)) {
        ("PLAIN", _) => {
            conn.sasl = Step::Plain;
            conn.sasl_raw_next = version == 0;
        }
        // v0 would carry SCRAM's messages in bare frames; no client needs that.
        (_, Some(m)) if version >= 1 => conn.sasl = Step::ScramFirst(m),
        _ => r.error_code = code::UNSUPPORTED_SASL_MECHANISM,
    }
    Ok(r)
}

/// Why a login failed, as told to the client (Kafka's wording: which part was wrong is not
/// said).
fn failure_message(mechanism: &str) -> String {
    format!(
        "Authentication failed during authentication due to invalid credentials with SASL \
         mechanism {mechanism}"
    )
}

/// SASL/PLAIN (RFC 4616: `authzid NUL user NUL password`): the user is an access key id, the
/// password its secret; the key's account is the connection's from then on.
pub fn plain(conn: &mut Conn, message: &[u8]) -> Result<(), &'static str> {
    conn.sasl = Step::Idle;
    let mut parts = message.split(|b| *b == 0);
    let (_authzid, user, password) = (parts.next(), parts.next(), parts.next());
    let token = match (user, password, parts.next()) {
        (Some(u), Some(p), None) => std::str::from_utf8(u)
            .ok()
            .zip(std::str::from_utf8(p).ok())
            .map(|(u, p)| format!("{u}:{p}")),
        _ => None,
    };
    let token = token.ok_or("malformed PLAIN message")?;
    let account = conn
        .shard
        .config
        .auth
        .authenticate_token(Some(&token))
        .map_err(|_| "invalid access key or secret")?;
    settle(conn, account)
}

/// PLAIN in the bare frame after a SaslHandshake v0 (no Kafka header, no error message):
/// true if it authenticated. Counted against the peer's failed logins like the others.
pub fn plain_counted(conn: &mut Conn, message: &[u8]) -> bool {
    let now_ms = runtime::now_ms();
    let allowed = conn
        .peer
        .is_none_or(|p| FAILED_LOGINS.with(|f| f.borrow().allowed(&p, now_ms)));
    let ok = allowed && plain(conn, message).is_ok();
    if !ok {
        if let Some(p) = conn.peer {
            FAILED_LOGINS.with(|f| f.borrow_mut().failed(&p, now_ms));
        }
    }
    ok
}

/// The connection acts as `account` from now on, unless its client certificate already
/// names another (a certificate and a login must agree, as on QUIC).
fn settle(conn: &mut Conn, account: String) -> Result<(), &'static str> {
    if conn.cert_account.as_ref().is_some_and(|c| *c != account) {
        return Err("the login's account differs from the client certificate's");
    }
    conn.account = Some(account);
    Ok(())
}

/// A fresh server nonce: random bytes in base64 (printable, no comma).
fn server_nonce() -> Result<String, i16> {
    use base64::Engine;
    let mut bytes = [0u8; scram::SCRAM_SERVER_NONCE_BYTES];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| code::UNKNOWN_SERVER_ERROR)?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// One SaslAuthenticate: a PLAIN message, or a step of SCRAM. A response with an error code
/// closes the connection (`handlers::run`).
pub async fn authenticate(
    conn: &mut Conn,
    req: SaslAuthenticateRequest,
) -> SaslAuthenticateResponse {
    let mut r = SaslAuthenticateResponse::default();
    let step = std::mem::take(&mut conn.sasl);
    let mechanism = match &step {
        Step::Idle => {
            r.error_code = code::ILLEGAL_SASL_STATE;
            r.error_message = Some(s("SaslHandshake first"));
            return r;
        }
        Step::Plain => "PLAIN",
        Step::ScramFirst(m) => m.name(),
        Step::ScramFinal(exchange) => exchange.mechanism().name(),
    };
    let peer = conn.peer;
    let allowed =
        peer.is_none_or(|p| FAILED_LOGINS.with(|f| f.borrow().allowed(&p, runtime::now_ms())));
    if !allowed {
        glommio::timer::sleep(std::time::Duration::from_millis(
            KAFKA_AUTH_FAILURE_DELAY_MS,
        ))
        .await;
        r.error_code = code::SASL_AUTHENTICATION_FAILED;
        r.error_message = Some(s(
            "too many failed authentications from this address; retry later",
        ));
        return r;
    }
    let outcome: Result<Option<Vec<u8>>, String> = match step {
        Step::Idle => Err("no SaslHandshake".to_string()),
        Step::Plain => plain(conn, &req.auth_bytes)
            .map(|()| None)
            .map_err(str::to_string),
        Step::ScramFirst(m) => match server_nonce() {
            Err(code) => {
                r.error_code = code;
                return r;
            }
            Ok(nonce) => {
                let config = &conn.shard.config;
                match scram::client_first(
                    m,
                    &config.kafka_scram,
                    &config.receipt_secret,
                    &req.auth_bytes,
                    &nonce,
                ) {
                    Ok((exchange, server_first)) => {
                        conn.sasl = Step::ScramFinal(Box::new(exchange));
                        Ok(Some(server_first.into_bytes()))
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
        },
        Step::ScramFinal(exchange) => match exchange.client_final(&req.auth_bytes) {
            Ok(done) => settle(conn, done.account)
                .map(|()| Some(done.server_final.into_bytes()))
                .map_err(str::to_string),
            Err(e) => Err(e.to_string()),
        },
    };
    match outcome {
        Ok(token) => {
            r.auth_bytes = token.map(bytes::Bytes::from).unwrap_or_default();
        }
        Err(why) => {
            tracing::info!(?peer, mechanism, reason = %why, "Kafka SASL authentication failed");
            if let Some(p) = peer {
                FAILED_LOGINS.with(|f| f.borrow_mut().failed(&p, runtime::now_ms()));
            }
            glommio::timer::sleep(std::time::Duration::from_millis(
                KAFKA_AUTH_FAILURE_DELAY_MS,
            ))
            .await;
            r.error_code = code::SASL_AUTHENTICATION_FAILED;
            r.error_message = Some(s(&failure_message(mechanism)));
        }
    }
    r
}
