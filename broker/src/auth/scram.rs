//! SASL/SCRAM (RFC 5802) with SHA-256 and SHA-512 (RFC 7677), server side, sans-I/O: the
//! credentials an operator stores, and the two steps of an exchange. The Kafka front end
//! (`crate::kafka::sasl`) carries the messages; randomness (the server nonce) and the account
//! check against a client certificate are the caller's.
//!
//! What is stored is what RFC 5802 lets a server keep: a per-user salt, the iteration count,
//! `StoredKey = H(HMAC(SaltedPassword, "Client Key"))` and
//! `ServerKey = HMAC(SaltedPassword, "Server Key")` — never the password, and nothing that lets
//! a reader of the configuration log in (a client proof needs `ClientKey`, which `StoredKey`
//! is a hash of). An operator makes an entry with `sluice scram-credential` (or any tool that
//! writes Kafka's SCRAM credentials: the format is the same numbers in base64).
//!
//! An unknown user gets a server-first message like a known one (a salt derived from a broker
//! secret and the name), and fails only at the proof: the exchange does not tell which users
//! exist.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};
use std::collections::HashMap;

/// Iterations a stored credential must have at least (Kafka's minimum, RFC 7677's example).
pub const SCRAM_ITERATIONS_MIN: u32 = 4096;
/// Iterations a stored credential may have at most (Kafka's maximum): each login costs the
/// client this many HMACs.
pub const SCRAM_ITERATIONS_MAX: u32 = 16_384;
/// What `sluice scram-credential` uses unless told.
pub const SCRAM_ITERATIONS_DEFAULT: u32 = 8192;
/// Salt of a new credential (RFC 5802 asks for a per-user random salt; 128 bits).
pub const SCRAM_SALT_BYTES: usize = 16;
/// Random bytes of the server's part of the nonce (base64 on the wire).
pub const SCRAM_SERVER_NONCE_BYTES: usize = 24;
/// The longest client message taken (a user name, a nonce and a proof fit many times over).
pub const SCRAM_MESSAGE_BYTES_MAX: usize = 2048;

/// The two mechanisms served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    Sha256,
    Sha512,
}

impl Mechanism {
    pub const ALL: [Mechanism; 2] = [Mechanism::Sha256, Mechanism::Sha512];

    /// The SASL name (`SCRAM-SHA-256`).
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha256 => "SCRAM-SHA-256",
            Mechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Bytes of the hash (and so of every key).
    pub fn key_bytes(self) -> usize {
        match self {
            Mechanism::Sha256 => 32,
            Mechanism::Sha512 => 64,
        }
    }

    fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        macro_rules! run {
            ($h:ty) => {{
                let mut mac =
                    <Hmac<$h> as Mac>::new_from_slice(key).expect("HMAC takes a key of any length");
                for p in parts {
                    mac.update(p);
                }
                mac.finalize().into_bytes().to_vec()
            }};
        }
        match self {
            Mechanism::Sha256 => run!(Sha256),
            Mechanism::Sha512 => run!(Sha512),
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => Sha256::digest(data).to_vec(),
            Mechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// `Hi(password, salt, i)` of RFC 5802 (PBKDF2 with this HMAC, one block).
    fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut u = self.hmac(password, &[salt, &1u32.to_be_bytes()]);
        let mut out = u.clone();
        for _ in 1..iterations {
            u = self.hmac(password, &[&u]);
            out.iter_mut().zip(&u).for_each(|(o, x)| *o ^= x);
        }
        out
    }
}

/// One user's stored credential for one mechanism.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredential {
    pub mechanism: Mechanism,
    /// The account (tenant) the user acts in once authenticated.
    pub account: String,
    pub salt: Vec<u8>,
    pub iterations: u32,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
}

/// The keys stay out of logs (the effective configuration is logged).
impl std::fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredential")
            .field("mechanism", &self.mechanism.name())
            .field("account", &self.account)
            .field("iterations", &self.iterations)
            .field("keys", &"<redacted>")
            .finish()
    }
}

/// A stored credential that cannot be used, as configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("unknown SCRAM mechanism {0:?} (SCRAM-SHA-256 or SCRAM-SHA-512)")]
    Mechanism(String),
    #[error("{field}: not base64")]
    Base64 { field: &'static str },
    #[error("{field}: {got} bytes, {mechanism} keys are {want}")]
    KeyLength {
        field: &'static str,
        mechanism: &'static str,
        got: usize,
        want: usize,
    },
    #[error("iterations {0}: must be {SCRAM_ITERATIONS_MIN}..={SCRAM_ITERATIONS_MAX}")]
    Iterations(u32),
    #[error("salt: empty")]
    Salt,
    #[error("user: empty")]
    User,
    #[error("the system's random source failed")]
    Random,
}

impl ScramCredential {
    /// Derives the stored form of `password` (the password itself is not kept).
    pub fn derive(
        mechanism: Mechanism,
        account: &str,
        password: &[u8],
        salt: &[u8],
        iterations: u32,
    ) -> ScramCredential {
        let salted = mechanism.salted_password(password, salt, iterations);
        let client_key = mechanism.hmac(&salted, &[b"Client Key"]);
        ScramCredential {
            mechanism,
            account: account.to_string(),
            salt: salt.to_vec(),
            iterations,
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(&salted, &[b"Server Key"]),
        }
    }

    /// A new credential for `password` with a random salt of [`SCRAM_SALT_BYTES`] (what an
    /// operator's tool calls; the broker itself only reads credentials).
    pub fn generate(
        mechanism: Mechanism,
        account: &str,
        password: &[u8],
        iterations: u32,
    ) -> Result<ScramCredential, CredentialError> {
        if !(SCRAM_ITERATIONS_MIN..=SCRAM_ITERATIONS_MAX).contains(&iterations) {
            return Err(CredentialError::Iterations(iterations));
        }
        let mut salt = [0u8; SCRAM_SALT_BYTES];
        rustls::crypto::ring::default_provider()
            .secure_random
            .fill(&mut salt)
            .map_err(|_| CredentialError::Random)?;
        Ok(Self::derive(
            mechanism, account, password, &salt, iterations,
        ))
    }

    /// The `[[auth.scram_credentials]]` entry of the configuration file for `user`.
    pub fn toml_entry(&self, user: &str) -> String {
        let (salt, stored_key, server_key) = self.encoded();
        let quote = |s: &str| serde_json::to_string(s).expect("a string encodes");
        format!(
            "[[auth.scram_credentials]]\nuser = {}\nmechanism = \"{}\"\naccount = {}\n\
             iterations = {}\nsalt = \"{salt}\"\nstored_key = \"{stored_key}\"\n\
             server_key = \"{server_key}\"\n",
            quote(user),
            self.mechanism.name(),
            quote(&self.account),
            self.iterations,
        )
    }

    /// A credential from its configured form (base64 salt and keys).
    pub fn from_encoded(
        mechanism: &str,
        account: &str,
        salt: &str,
        iterations: u32,
        stored_key: &str,
        server_key: &str,
    ) -> Result<ScramCredential, CredentialError> {
        let mechanism = Mechanism::from_name(mechanism)
            .ok_or_else(|| CredentialError::Mechanism(mechanism.to_string()))?;
        let decode = |field: &'static str, s: &str| {
            B64.decode(s.trim())
                .map_err(|_| CredentialError::Base64 { field })
        };
        let salt = decode("salt", salt)?;
        if salt.is_empty() {
            return Err(CredentialError::Salt);
        }
        if !(SCRAM_ITERATIONS_MIN..=SCRAM_ITERATIONS_MAX).contains(&iterations) {
            return Err(CredentialError::Iterations(iterations));
        }
        let stored_key = decode("stored_key", stored_key)?;
        let server_key = decode("server_key", server_key)?;
        for (field, k) in [("stored_key", &stored_key), ("server_key", &server_key)] {
            if k.len() != mechanism.key_bytes() {
                return Err(CredentialError::KeyLength {
                    field,
                    mechanism: mechanism.name(),
                    got: k.len(),
                    want: mechanism.key_bytes(),
                });
            }
        }
        Ok(ScramCredential {
            mechanism,
            account: account.to_string(),
            salt,
            iterations,
            stored_key,
            server_key,
        })
    }

    /// The base64 salt, stored key and server key (what the configuration holds).
    pub fn encoded(&self) -> (String, String, String) {
        (
            B64.encode(&self.salt),
            B64.encode(&self.stored_key),
            B64.encode(&self.server_key),
        )
    }
}

/// Every SCRAM credential, by user and mechanism.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScramStore {
    users: HashMap<(String, Mechanism), ScramCredential>,
}

impl ScramStore {
    pub fn insert(
        &mut self,
        user: &str,
        credential: ScramCredential,
    ) -> Result<(), CredentialError> {
        if user.is_empty() {
            return Err(CredentialError::User);
        }
        self.users
            .insert((user.to_string(), credential.mechanism), credential);
        Ok(())
    }

    pub fn get(&self, user: &str, mechanism: Mechanism) -> Option<&ScramCredential> {
        self.users.get(&(user.to_string(), mechanism))
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

/// Why an exchange failed. All end it; only the proof and the nonce are about who the client
/// is, the rest about what it sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    #[error("channel binding is not supported (no -PLUS mechanism is offered)")]
    ChannelBinding,
    #[error("authorization id {0:?} differs from the user")]
    Authzid(String),
    #[error("delegation tokens are not supported")]
    TokenAuth,
    #[error("the client-final nonce is not this exchange's")]
    Nonce,
    #[error("the channel binding does not repeat the client-first header")]
    BindingMismatch,
    /// An unknown user or a wrong password: not told apart.
    #[error("invalid credentials")]
    Proof,
}

/// The server's state between the client-first and the client-final message.
#[derive(Debug, Clone)]
pub struct Exchange {
    mechanism: Mechanism,
    /// `None`: an unknown user, carried on with a made-up salt so that it fails only here.
    credential: Option<ScramCredential>,
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

/// Takes the client-first message; returns the state and the server-first message.
/// `server_nonce` must be fresh and unpredictable for each exchange (printable, no comma);
/// `decoy_key` is a broker secret from which unknown users' salts are made.
pub fn client_first(
    mechanism: Mechanism,
    store: &ScramStore,
    decoy_key: &[u8],
    message: &[u8],
    server_nonce: &str,
) -> Result<(Exchange, String), ScramError> {
    let message = text(message)?;
    // gs2-header: cbind-flag "," [authzid] ","
    let (flag, rest) = message
        .split_once(',')
        .ok_or(ScramError::Malformed("no gs2 header"))?;
    match flag {
        // "y": the client could bind but thinks we cannot — true, we offer no -PLUS.
        "n" | "y" => {}
        f if f.starts_with("p=") => return Err(ScramError::ChannelBinding),
        _ => return Err(ScramError::Malformed("bad channel-binding flag")),
    }
    let (authzid, bare) = rest
        .split_once(',')
        .ok_or(ScramError::Malformed("no authzid field"))?;
    let gs2_header = format!("{flag},{authzid},");
    let mut fields = bare.split(',');
    let first = fields.next().unwrap_or_default();
    if first.starts_with("m=") {
        return Err(ScramError::Malformed("mandatory extension"));
    }
    let user = saslname(
        first
            .strip_prefix("n=")
            .ok_or(ScramError::Malformed("no user"))?,
    )?;
    let client_nonce = fields
        .next()
        .and_then(|r| r.strip_prefix("r="))
        .filter(|r| !r.is_empty())
        .ok_or(ScramError::Malformed("no client nonce"))?;
    if !client_nonce.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(ScramError::Malformed("nonce not printable"));
    }
    // Kafka's extensions (KIP-84, KIP-342) follow; only `tokenauth` changes the meaning.
    for ext in fields {
        if ext.eq_ignore_ascii_case("tokenauth=true") {
            return Err(ScramError::TokenAuth);
        }
    }
    if !authzid.is_empty() {
        let a = authzid
            .strip_prefix("a=")
            .ok_or(ScramError::Malformed("bad authzid"))?;
        let a = saslname(a)?;
        if a != user {
            return Err(ScramError::Authzid(a));
        }
    }
    let credential = store.get(&user, mechanism).cloned();
    let (salt, iterations) = match &credential {
        Some(c) => (c.salt.clone(), c.iterations),
        None => {
            let decoy = mechanism.hmac(
                decoy_key,
                &[mechanism.name().as_bytes(), b"\0", user.as_bytes()],
            );
            (decoy[..SCRAM_SALT_BYTES].to_vec(), SCRAM_ITERATIONS_DEFAULT)
        }
    };
    let nonce = format!("{client_nonce}{server_nonce}");
    let server_first = format!("r={nonce},s={},i={iterations}", B64.encode(&salt));
    let exchange = Exchange {
        mechanism,
        credential,
        gs2_header,
        client_first_bare: bare.to_string(),
        server_first: server_first.clone(),
        nonce,
    };
    Ok((exchange, server_first))
}

/// The outcome of a successful exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authenticated {
    pub account: String,
    /// The server-final message (`v=ServerSignature`), which proves the server knew the key.
    pub server_final: String,
}

impl Exchange {
    pub fn mechanism(&self) -> Mechanism {
        self.mechanism
    }

    /// Takes the client-final message: checks the binding, the nonce and the proof.
    pub fn client_final(self, message: &[u8]) -> Result<Authenticated, ScramError> {
        let message = text(message)?;
        let (without_proof, proof) = message
            .rsplit_once(",p=")
            .ok_or(ScramError::Malformed("no proof"))?;
        let mut fields = without_proof.split(',');
        let binding = fields
            .next()
            .and_then(|c| c.strip_prefix("c="))
            .ok_or(ScramError::Malformed("no channel binding"))?;
        let binding = B64
            .decode(binding)
            .map_err(|_| ScramError::Malformed("channel binding not base64"))?;
        let nonce = fields
            .next()
            .and_then(|r| r.strip_prefix("r="))
            .ok_or(ScramError::Malformed("no nonce"))?;
        // The nonce first: a message replayed from another exchange stops here, whatever
        // its proof.
        if !constant_time_eq(nonce.as_bytes(), self.nonce.as_bytes()) {
            return Err(ScramError::Nonce);
        }
        if binding != self.gs2_header.as_bytes() {
            return Err(ScramError::BindingMismatch);
        }
        let proof = B64
            .decode(proof)
            .map_err(|_| ScramError::Malformed("proof not base64"))?;
        let m = self.mechanism;
        let auth_message = format!(
            "{},{},{}",
            self.client_first_bare, self.server_first, without_proof
        );
        let Some(credential) = self.credential else {
            return Err(ScramError::Proof);
        };
        if proof.len() != m.key_bytes() {
            return Err(ScramError::Proof);
        }
        let client_signature = m.hmac(&credential.stored_key, &[auth_message.as_bytes()]);
        let client_key: Vec<u8> = proof
            .iter()
            .zip(&client_signature)
            .map(|(p, s)| p ^ s)
            .collect();
        if !constant_time_eq(&m.hash(&client_key), &credential.stored_key) {
            return Err(ScramError::Proof);
        }
        let server_signature = m.hmac(&credential.server_key, &[auth_message.as_bytes()]);
        Ok(Authenticated {
            account: credential.account,
            server_final: format!("v={}", B64.encode(server_signature)),
        })
    }
}

fn text(message: &[u8]) -> Result<&str, ScramError> {
    if message.len() > SCRAM_MESSAGE_BYTES_MAX {
        return Err(ScramError::Malformed("message too long"));
    }
    std::str::from_utf8(message).map_err(|_| ScramError::Malformed("not UTF-8"))
}

/// RFC 5802's `saslname`: `,` and `=` travel as `=2C` and `=3D`; any other `=` is an error.
fn saslname(s: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(ScramError::Malformed("bad escape in a name")),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    if out.is_empty() {
        return Err(ScramError::Malformed("empty user"));
    }
    Ok(out)
}

/// Equal in time that depends on the lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Failed logins per peer address, as a token bucket each: a peer may fail
/// `burst` times at once, then `per_s` times a second; past it, its logins are refused
/// before any check (a password guesser gets `per_s` guesses a second per shard). Time is an
/// argument.
#[derive(Debug)]
pub struct FailedLogins<K> {
    per_s: f64,
    burst: f64,
    peers_max: usize,
    peers: HashMap<K, (f64, u64)>,
}

impl<K: std::hash::Hash + Eq + Clone> FailedLogins<K> {
    pub fn new(per_s: f64, burst: u32, peers_max: usize) -> Self {
        FailedLogins {
            per_s,
            burst: f64::from(burst),
            peers_max,
            peers: HashMap::new(),
        }
    }

    fn tokens(&self, peer: &K, now_ms: u64) -> f64 {
        match self.peers.get(peer) {
            None => self.burst,
            Some(&(tokens, at_ms)) => {
                let elapsed_s = now_ms.saturating_sub(at_ms) as f64 / 1000.0;
                (tokens + elapsed_s * self.per_s).min(self.burst)
            }
        }
    }

    /// May `peer` try to log in now?
    pub fn allowed(&self, peer: &K, now_ms: u64) -> bool {
        self.tokens(peer, now_ms) >= 1.0
    }

    /// `peer` failed a login at `now_ms`.
    pub fn failed(&mut self, peer: &K, now_ms: u64) {
        let tokens = (self.tokens(peer, now_ms) - 1.0).max(0.0);
        if !self.peers.contains_key(peer) && self.peers.len() >= self.peers_max {
            // Forget the peers whose buckets have refilled; if every one is still draining,
            // forget them all (memory stays bounded; those peers start with a full burst).
            let (per_s, burst) = (self.per_s, self.burst);
            self.peers.retain(|_, (t, at)| {
                let elapsed_s = now_ms.saturating_sub(*at) as f64 / 1000.0;
                *t + elapsed_s * per_s < burst
            });
            if self.peers.len() >= self.peers_max {
                self.peers.clear();
            }
        }
        self.peers.insert(peer.clone(), (tokens, now_ms));
    }

    pub fn tracked(&self) -> usize {
        self.peers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 section 3's example: user "user", password "pencil".
    const RFC7677_CLIENT_FIRST: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
    const RFC7677_SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
    const RFC7677_SALT: &str = "W22ZaJ0SNY7soEsUEjb6gQ==";
    const RFC7677_SERVER_FIRST: &str =
        "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
    const RFC7677_CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    const RFC7677_SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";
    const DECOY: &[u8] = b"decoy key for tests";

    fn rfc_store() -> ScramStore {
        let salt = B64.decode(RFC7677_SALT).expect("salt");
        let mut store = ScramStore::default();
        let c = ScramCredential::derive(Mechanism::Sha256, "111111111111", b"pencil", &salt, 4096);
        store.insert("user", c).expect("insert");
        store
    }

    #[test]
    fn rfc7677_sha256_example() {
        let store = rfc_store();
        let (ex, server_first) = client_first(
            Mechanism::Sha256,
            &store,
            DECOY,
            RFC7677_CLIENT_FIRST.as_bytes(),
            RFC7677_SERVER_NONCE,
        )
        .expect("client-first");
        assert_eq!(server_first, RFC7677_SERVER_FIRST);
        let ok = ex
            .client_final(RFC7677_CLIENT_FINAL.as_bytes())
            .expect("client-final");
        assert_eq!(ok.server_final, RFC7677_SERVER_FINAL);
        assert_eq!(ok.account, "111111111111");
    }

    /// A client in the test's hands: computes a proof for a password the way RFC 5802 says.
    fn client_final_for(
        m: Mechanism,
        password: &[u8],
        client_first_bare: &str,
        server_first: &str,
    ) -> String {
        let mut salt = None;
        let mut iterations = 0;
        let mut nonce = "";
        for f in server_first.split(',') {
            if let Some(s) = f.strip_prefix("s=") {
                salt = Some(B64.decode(s).expect("salt"));
            } else if let Some(i) = f.strip_prefix("i=") {
                iterations = i.parse().expect("iterations");
            } else if let Some(r) = f.strip_prefix("r=") {
                nonce = r;
            }
        }
        let salted = m.salted_password(password, &salt.expect("salt"), iterations);
        let client_key = m.hmac(&salted, &[b"Client Key"]);
        let stored_key = m.hash(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth = format!("{client_first_bare},{server_first},{without_proof}");
        let sig = m.hmac(&stored_key, &[auth.as_bytes()]);
        let proof: Vec<u8> = client_key.iter().zip(&sig).map(|(a, b)| a ^ b).collect();
        format!("{without_proof},p={}", B64.encode(proof))
    }

    fn store_with(m: Mechanism, user: &str, password: &[u8]) -> ScramStore {
        let mut store = ScramStore::default();
        let c = ScramCredential::derive(m, "222222222222", password, b"0123456789abcdef", 4096);
        store.insert(user, c).expect("insert");
        store
    }

    #[test]
    fn both_mechanisms_accept_the_right_password_and_refuse_a_wrong_one() {
        for m in Mechanism::ALL {
            let store = store_with(m, "alice", b"s3cret");
            for (password, ok) in [(&b"s3cret"[..], true), (&b"s3cres"[..], false)] {
                let (ex, sf) =
                    client_first(m, &store, DECOY, b"n,,n=alice,r=abc", "XYZ").expect("first");
                let cf = client_final_for(m, password, "n=alice,r=abc", &sf);
                let got = ex.client_final(cf.as_bytes());
                if ok {
                    assert_eq!(got.expect("right password").account, "222222222222");
                } else {
                    assert_eq!(got, Err(ScramError::Proof), "{}", m.name());
                }
            }
        }
    }

    #[test]
    fn a_wrong_proof_is_refused() {
        let store = rfc_store();
        let (ex, _) = client_first(
            Mechanism::Sha256,
            &store,
            DECOY,
            RFC7677_CLIENT_FIRST.as_bytes(),
            RFC7677_SERVER_NONCE,
        )
        .expect("first");
        // The RFC's message with one bit of the proof flipped.
        let mut proof = B64
            .decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
            .expect("proof");
        proof[0] ^= 1;
        let bad = format!(
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p={}",
            B64.encode(proof)
        );
        assert_eq!(ex.client_final(bad.as_bytes()), Err(ScramError::Proof));
    }

    #[test]
    fn a_replayed_client_final_fails_on_the_fresh_nonce() {
        let store = rfc_store();
        // A recorded, valid exchange replayed: the server's nonce is new this time.
        let (ex, _) = client_first(
            Mechanism::Sha256,
            &store,
            DECOY,
            RFC7677_CLIENT_FIRST.as_bytes(),
            "aFreshServerNonce",
        )
        .expect("first");
        assert_eq!(
            ex.client_final(RFC7677_CLIENT_FINAL.as_bytes()),
            Err(ScramError::Nonce)
        );
    }

    #[test]
    fn unknown_users_look_like_known_ones_until_the_proof() {
        let store = rfc_store();
        let (ex, sf) = client_first(
            Mechanism::Sha256,
            &store,
            DECOY,
            b"n,,n=mallory,r=abc",
            "XYZ",
        )
        .expect("an unknown user still gets a server-first");
        let (_, sf_again) = client_first(
            Mechanism::Sha256,
            &store,
            DECOY,
            b"n,,n=mallory,r=abc",
            "XYZ",
        )
        .expect("first");
        assert_eq!(sf, sf_again, "the decoy salt is stable per user");
        let cf = client_final_for(Mechanism::Sha256, b"pencil", "n=mallory,r=abc", &sf);
        assert_eq!(ex.client_final(cf.as_bytes()), Err(ScramError::Proof));
        // A known user, with the other mechanism, is unknown there too.
        let (ex, sf) = client_first(Mechanism::Sha512, &store, DECOY, b"n,,n=user,r=abc", "XYZ")
            .expect("first");
        let cf = client_final_for(Mechanism::Sha512, b"pencil", "n=user,r=abc", &sf);
        assert_eq!(ex.client_final(cf.as_bytes()), Err(ScramError::Proof));
    }

    #[test]
    fn malformed_and_unsupported_messages_are_refused() {
        let store = rfc_store();
        let first = |m: &str| client_first(Mechanism::Sha256, &store, DECOY, m.as_bytes(), "S");
        assert_eq!(
            first("p=tls-unique,,n=user,r=a").err(),
            Some(ScramError::ChannelBinding)
        );
        assert_eq!(
            first("n,a=admin,n=user,r=a").err(),
            Some(ScramError::Authzid("admin".into()))
        );
        assert!(first("n,a=user,n=user,r=a").is_ok());
        assert_eq!(
            first("n,,n=user,r=a,tokenauth=true").err(),
            Some(ScramError::TokenAuth)
        );
        for bad in [
            "",
            "n",
            "n,,",
            "n,,n=user",
            "n,,r=a",
            "x,,n=user,r=a",
            "n,,n=u=ser,r=a",
            "n,,n=,r=a",
        ] {
            assert!(
                matches!(first(bad), Err(ScramError::Malformed(_))),
                "{bad:?}"
            );
        }
        let long = format!("n,,n=user,r={}", "a".repeat(SCRAM_MESSAGE_BYTES_MAX));
        assert!(matches!(first(&long), Err(ScramError::Malformed(_))));
        // Escaped names: `=2C` is a comma.
        assert_eq!(saslname("a=2Cb=3Dc"), Ok("a,b=c".to_string()));
        // The binding must repeat the client-first's header.
        let (ex, sf) = first("y,,n=user,r=a").expect("y flag");
        let nonce = sf.split(',').next().expect("r=").to_string();
        assert_eq!(
            ex.client_final(format!("c=biws,{nonce},p=AAAA").as_bytes()),
            Err(ScramError::BindingMismatch)
        );
    }

    #[test]
    fn credentials_round_trip_through_their_configured_form_and_are_checked() {
        let c = ScramCredential::derive(Mechanism::Sha512, "333", b"pw", b"salty", 4096);
        let (salt, stored, server) = c.encoded();
        let back =
            ScramCredential::from_encoded("SCRAM-SHA-512", "333", &salt, 4096, &stored, &server)
                .expect("round trip");
        assert_eq!(back, c);
        assert!(
            !format!("{c:?}").contains(&stored),
            "keys stay out of Debug"
        );
        assert_eq!(
            ScramCredential::from_encoded("SCRAM-SHA-1", "3", &salt, 4096, &stored, &server),
            Err(CredentialError::Mechanism("SCRAM-SHA-1".into()))
        );
        assert_eq!(
            ScramCredential::from_encoded("SCRAM-SHA-512", "3", &salt, 100, &stored, &server),
            Err(CredentialError::Iterations(100))
        );
        assert!(matches!(
            ScramCredential::from_encoded("SCRAM-SHA-256", "3", &salt, 4096, &stored, &server),
            Err(CredentialError::KeyLength { .. })
        ));
    }

    #[test]
    fn generated_credentials_have_fresh_salts_and_check_the_password() {
        let a = ScramCredential::generate(Mechanism::Sha256, "1", b"pw", 4096).expect("a");
        let b = ScramCredential::generate(Mechanism::Sha256, "1", b"pw", 4096).expect("b");
        assert_ne!(a.salt, b.salt, "a salt per credential");
        assert_ne!(a.stored_key, b.stored_key);
        assert_eq!(
            ScramCredential::generate(Mechanism::Sha256, "1", b"pw", 1),
            Err(CredentialError::Iterations(1))
        );
        let mut store = ScramStore::default();
        store.insert("u", a).expect("insert");
        let (ex, sf) =
            client_first(Mechanism::Sha256, &store, DECOY, b"n,,n=u,r=x", "y").expect("first");
        let cf = client_final_for(Mechanism::Sha256, b"pw", "n=u,r=x", &sf);
        assert!(ex.client_final(cf.as_bytes()).is_ok());
    }

    #[test]
    fn failed_logins_are_bounded_per_peer_and_refill() {
        let mut f = FailedLogins::new(1.0, 3, 2);
        for _ in 0..3 {
            assert!(f.allowed(&"a", 0));
            f.failed(&"a", 0);
        }
        assert!(!f.allowed(&"a", 0), "the burst is spent");
        assert!(f.allowed(&"b", 0), "another peer is not affected");
        assert!(!f.allowed(&"a", 999));
        assert!(f.allowed(&"a", 1000), "one more a second");
        f.failed(&"b", 0);
        f.failed(&"c", 0);
        assert!(f.tracked() <= 2, "memory stays bounded");
    }
}
