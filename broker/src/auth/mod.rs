//! Who a request comes from, and what it may reach — one module for every front end.
//!
//! | module   | what it holds                                                                    |
//! |----------|----------------------------------------------------------------------------------|
//! | (here)   | access keys → accounts, the auth mode, native `Hello` tokens                      |
//! | `sigv4`  | AWS Signature Version 4 (header and presigned forms) for the HTTP API             |
//! | `access` | queue URLs, ARNs and owner ids resolved *within the caller's account*             |
//! | `quota`  | per-account rates (requests/s, bytes/s: `RequestThrottled`) and queue counts      |
//! | `scram`  | SASL/SCRAM-SHA-256/512 credentials (salted, hashed) and exchanges (Kafka port)   |
//!
//! Configuration is `BrokerConfig::auth`; `sluiced` fills it from the environment:
//! `SLUICE_AUTH=sigv4|none` (default `none`: any signature, or none, is accepted — for local
//! development, logged loudly at start-up) and `SLUICE_ACCESS_KEYS=AKID:SECRET[:ACCOUNT],…`
//! (the account id is the tenant; default `000000000000`). The native QUIC protocol uses the
//! same keys ([`AuthConfig::authenticate_token`]: the client's `Hello` carries `AKID:SECRET`
//! inside TLS).

pub mod access;
pub mod quota;
pub mod scram;
pub mod sigv4;

use crate::metadata::DEFAULT_TENANT;
use std::collections::HashMap;

pub use sigv4::{AuthError, SignedRequest};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Verify every request's signature.
    SigV4,
    /// Accept any request (local development); known access keys still select their account.
    None,
}

#[derive(Clone)]
pub struct Credential {
    pub secret: String,
    pub account: String,
}

/// Never prints the secret (configurations are logged).
impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("secret", &"<redacted>")
            .field("account", &self.account)
            .finish()
    }
}

/// Why a native client's token was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenRefused {
    /// Authentication is on and the `Hello` carried no token.
    Missing,
    /// Not `AKID:SECRET`, an unknown key, or the wrong secret (not told apart, on purpose).
    Invalid,
}

#[derive(Debug, Clone)]
pub struct AuthConfig {
    pub mode: AuthMode,
    pub keys: HashMap<String, Credential>,
}

impl AuthConfig {
    /// Accepts everything: the embedded default.
    pub fn open() -> Self {
        AuthConfig {
            mode: AuthMode::None,
            keys: HashMap::new(),
        }
    }

    /// Reads `SLUICE_AUTH` and `SLUICE_ACCESS_KEYS`.
    pub fn from_env() -> Result<Self, String> {
        let mode = match std::env::var("SLUICE_AUTH").as_deref() {
            Err(_) | Ok("") | Ok("none") => AuthMode::None,
            Ok("sigv4") => AuthMode::SigV4,
            Ok(other) => return Err(format!("SLUICE_AUTH={other}: expected sigv4 or none")),
        };
        let keys = match std::env::var("SLUICE_ACCESS_KEYS") {
            Ok(s) => parse_keys(&s)?,
            Err(_) => HashMap::new(),
        };
        if mode == AuthMode::SigV4 && keys.is_empty() {
            return Err(
                "SLUICE_AUTH=sigv4 needs SLUICE_ACCESS_KEYS=AKID:SECRET[:ACCOUNT],…".into(),
            );
        }
        Ok(AuthConfig { mode, keys })
    }
}

pub fn parse_keys(s: &str) -> Result<HashMap<String, Credential>, String> {
    let mut keys = HashMap::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let mut parts = item.splitn(3, ':');
        let (Some(id), Some(secret)) = (parts.next(), parts.next()) else {
            return Err(format!(
                "access key {item:?}: expected AKID:SECRET[:ACCOUNT]"
            ));
        };
        let account = parts.next().unwrap_or(DEFAULT_TENANT);
        if id.is_empty() || secret.is_empty() || !valid_account(account) {
            return Err(format!(
                "access key {id:?}: empty id or secret, or a bad account id"
            ));
        }
        keys.insert(
            id.to_string(),
            Credential {
                secret: secret.to_string(),
                account: account.to_string(),
            },
        );
    }
    Ok(keys)
}

/// Equal in time that depends on the lengths only, not on where the first difference is.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Account ids name tenants and appear in queue URLs: 1–64 ASCII alphanumerics, `-`, `_`.
pub fn valid_account(a: &str) -> bool {
    !a.is_empty()
        && a.len() <= 64
        && a.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Who sent the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub account: String,
    /// The credentials were checked (false in `none` mode). Accounts are kept apart exactly
    /// when this is set (`access` resolves every name within `account`).
    pub verified: bool,
}

impl AuthConfig {
    /// The account of a native-protocol client from its `Hello` token (`AKID:SECRET`).
    /// In `sigv4` mode a valid token is required; in `none` mode a token with a known key and
    /// the right secret selects that key's account, anything else gets the default account.
    /// The secret is compared in constant time.
    pub fn authenticate_token(&self, token: Option<&str>) -> Result<String, TokenRefused> {
        let known = token.and_then(|t| {
            let (akid, secret) = t.split_once(':')?;
            let cred = self.keys.get(akid)?;
            constant_time_eq(cred.secret.as_bytes(), secret.as_bytes())
                .then(|| cred.account.clone())
        });
        match (self.mode, known, token) {
            (_, Some(account), _) => Ok(account),
            (AuthMode::None, None, _) => Ok(DEFAULT_TENANT.to_string()),
            (AuthMode::SigV4, None, None) => Err(TokenRefused::Missing),
            (AuthMode::SigV4, None, Some(_)) => Err(TokenRefused::Invalid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_tokens_follow_the_mode() {
        let keys = parse_keys("AKIDA:sa:111111111111").expect("keys");
        let on = AuthConfig {
            mode: AuthMode::SigV4,
            keys: keys.clone(),
        };
        assert_eq!(
            on.authenticate_token(Some("AKIDA:sa")).as_deref(),
            Ok("111111111111")
        );
        assert_eq!(on.authenticate_token(None), Err(TokenRefused::Missing));
        for bad in ["AKIDA:sb", "AKIDA:s", "AKIDA:saa", "AKIDB:sa", "AKIDA", ""] {
            assert_eq!(
                on.authenticate_token(Some(bad)),
                Err(TokenRefused::Invalid),
                "{bad}"
            );
        }
        let off = AuthConfig {
            mode: AuthMode::None,
            keys,
        };
        assert_eq!(
            off.authenticate_token(Some("AKIDA:sa")).as_deref(),
            Ok("111111111111")
        );
        assert_eq!(off.authenticate_token(None).as_deref(), Ok(DEFAULT_TENANT));
        assert_eq!(
            off.authenticate_token(Some("AKIDA:wrong")).as_deref(),
            Ok(DEFAULT_TENANT)
        );
        assert!(
            !format!("{off:?}").contains("sa\""),
            "secrets stay out of Debug"
        );
    }
}
