//! AWS Signature Version 4: who sent a request, and is its signature right.
//!
//! Both forms real clients use: the `Authorization: AWS4-HMAC-SHA256 Credential=…` header and
//! the presigned query string (`X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=…`). The
//! canonical request follows what botocore (and the other SDKs) sign for non-S3 services: the
//! path URI-encoded once more, the raw query pairs sorted, the signed headers with collapsed
//! spaces, and the body's SHA-256 (`UNSIGNED-PAYLOAD` for presigned URLs). The signature is
//! compared in constant time (`Mac::verify_slice`).
//!
//! The same access keys authenticate the native QUIC protocol ([`AuthConfig::authenticate_token`]:
//! the client's `Hello` carries `AKID:SECRET` inside TLS).
//!
//! Configuration is `BrokerConfig::auth`; `sluiced` fills it from the environment:
//! `SLUICE_AUTH=sigv4|none` (default `none`: any signature, or none, is accepted — for local
//! development, logged loudly at start-up) and `SLUICE_ACCESS_KEYS=AKID:SECRET[:ACCOUNT],…`
//! (the account id is the tenant; default `000000000000`).

use super::protocol::SqsError;
use crate::metadata::DEFAULT_TENANT;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::collections::HashMap;

type HmacSha256 = Hmac<Sha256>;

/// A signed request may be this far from the server's clock, either way (as AWS allows).
pub const CLOCK_SKEW_S_MAX: i64 = 15 * 60;
/// Longest validity of a presigned URL (7 days, as SigV4 allows).
pub const PRESIGN_EXPIRES_S_MAX: i64 = 7 * 24 * 3600;
const ALGORITHM: &str = "AWS4-HMAC-SHA256";
const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";

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

/// What the verifier needs of a request.
pub struct SignedRequest<'a> {
    pub method: &'a str,
    /// The path as received (still percent-encoded).
    pub raw_path: &'a str,
    /// The query string as received, without `?`.
    pub raw_query: &'a str,
    pub headers: &'a http::HeaderMap,
    pub body: &'a [u8],
    pub now_s: i64,
}

/// Who sent the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub account: String,
    /// The signature was checked (false in `none` mode).
    pub verified: bool,
}

fn auth_error(code: &'static str, status: u16, msg: impl Into<String>) -> SqsError {
    SqsError::new(code, status, msg)
}

fn incomplete(msg: impl Into<String>) -> SqsError {
    auth_error("IncompleteSignature", 400, msg)
}

fn mismatch(msg: impl Into<String>) -> SqsError {
    auth_error("SignatureDoesNotMatch", 403, msg)
}

/// The parts of a SigV4 signature, from either form.
struct Signature<'a> {
    access_key: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    signed_headers: Vec<&'a str>,
    signature: &'a str,
    amz_date: String,
    presigned: Option<i64>,
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

    pub fn authenticate(&self, r: &SignedRequest<'_>) -> Result<Caller, SqsError> {
        let sig = match parse(r) {
            Ok(Some(s)) => s,
            Ok(None) => {
                return match self.mode {
                    AuthMode::None => Ok(Caller {
                        account: DEFAULT_TENANT.to_string(),
                        verified: false,
                    }),
                    AuthMode::SigV4 => Err(auth_error(
                        "MissingAuthenticationToken",
                        403,
                        "Request is missing Authentication Token",
                    )),
                }
            }
            Err(e) if self.mode == AuthMode::None => {
                tracing::debug!(error = %e.message, "ignoring a malformed signature (auth off)");
                return Ok(Caller {
                    account: DEFAULT_TENANT.to_string(),
                    verified: false,
                });
            }
            Err(e) => return Err(e),
        };
        let cred = self.keys.get(sig.access_key);
        if self.mode == AuthMode::None {
            return Ok(Caller {
                account: cred.map_or_else(|| DEFAULT_TENANT.to_string(), |c| c.account.clone()),
                verified: false,
            });
        }
        let cred = cred.ok_or_else(|| {
            auth_error(
                "InvalidClientTokenId",
                403,
                "The security token included in the request is invalid.",
            )
        })?;
        verify(r, &sig, &cred.secret)?;
        Ok(Caller {
            account: cred.account.clone(),
            verified: true,
        })
    }
}

fn parse<'a>(r: &'a SignedRequest<'a>) -> Result<Option<Signature<'a>>, SqsError> {
    if let Some(h) = r.headers.get(http::header::AUTHORIZATION) {
        let h = h
            .to_str()
            .map_err(|_| incomplete("Authorization header is not ASCII"))?;
        let rest = h
            .strip_prefix(ALGORITHM)
            .ok_or_else(|| incomplete("Authorization header must use AWS4-HMAC-SHA256"))?;
        let (mut cred, mut signed, mut signature) = (None, None, None);
        for part in rest.split(',') {
            let part = part.trim();
            if let Some(v) = part.strip_prefix("Credential=") {
                cred = Some(v);
            } else if let Some(v) = part.strip_prefix("SignedHeaders=") {
                signed = Some(v);
            } else if let Some(v) = part.strip_prefix("Signature=") {
                signature = Some(v);
            }
        }
        let (Some(cred), Some(signed), Some(signature)) = (cred, signed, signature) else {
            return Err(incomplete(
                "Authorization header requires Credential, SignedHeaders and Signature",
            ));
        };
        let amz_date = r
            .headers
            .get("x-amz-date")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| incomplete("the X-Amz-Date header is required"))?
            .to_string();
        return signature_from(cred, signed, signature, amz_date, None).map(Some);
    }
    if r.raw_query.contains("X-Amz-Algorithm=") || r.raw_query.contains("X-Amz-Signature=") {
        let q: HashMap<String, String> = form_urlencoded::parse(r.raw_query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let get = |k: &str| {
            q.get(k)
                .cloned()
                .ok_or_else(|| incomplete(format!("the presigned URL lacks {k}")))
        };
        if get("X-Amz-Algorithm")? != ALGORITHM {
            return Err(incomplete("X-Amz-Algorithm must be AWS4-HMAC-SHA256"));
        }
        let expires: i64 = get("X-Amz-Expires")?
            .parse()
            .map_err(|_| incomplete("X-Amz-Expires must be a number of seconds"))?;
        if !(0..=PRESIGN_EXPIRES_S_MAX).contains(&expires) {
            return Err(incomplete("X-Amz-Expires must be 0 to 604800 seconds"));
        }
        // Borrow the raw (encoded) values from the query itself so the signature keeps `'a`.
        let cred = raw_param(r.raw_query, "X-Amz-Credential")
            .ok_or_else(|| incomplete("the presigned URL lacks X-Amz-Credential"))?;
        let signed = raw_param(r.raw_query, "X-Amz-SignedHeaders")
            .ok_or_else(|| incomplete("the presigned URL lacks X-Amz-SignedHeaders"))?;
        let signature = raw_param(r.raw_query, "X-Amz-Signature")
            .ok_or_else(|| incomplete("the presigned URL lacks X-Amz-Signature"))?;
        // The credential's slashes and the header list's semicolons arrive encoded.
        return signature_from(cred, signed, signature, get("X-Amz-Date")?, Some(expires))
            .map(Some);
    }
    Ok(None)
}

fn raw_param<'a>(raw_query: &'a str, name: &str) -> Option<&'a str> {
    raw_query.split('&').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        (k == name).then_some(v)
    })
}

fn signature_from<'a>(
    cred: &'a str,
    signed: &'a str,
    signature: &'a str,
    amz_date: String,
    presigned: Option<i64>,
) -> Result<Signature<'a>, SqsError> {
    let sep = if cred.contains("%2F") { "%2F" } else { "/" };
    let parts: Vec<&str> = cred.split(sep).collect();
    let [access_key, date, region, service, terminal] = parts[..] else {
        return Err(incomplete(
            "Credential must be AKID/yyyymmdd/region/service/aws4_request",
        ));
    };
    if terminal != "aws4_request" {
        return Err(incomplete("Credential must end with aws4_request"));
    }
    let hsep = if signed.contains("%3B") { "%3B" } else { ";" };
    Ok(Signature {
        access_key,
        date,
        region,
        service,
        signed_headers: signed.split(hsep).collect(),
        signature,
        amz_date,
        presigned,
    })
}

fn verify(r: &SignedRequest<'_>, sig: &Signature<'_>, secret: &str) -> Result<(), SqsError> {
    let t = parse_amz_date(&sig.amz_date).ok_or_else(|| {
        incomplete(format!(
            "X-Amz-Date {:?} is not yyyymmddThhmmssZ",
            sig.amz_date
        ))
    })?;
    if !sig.amz_date.starts_with(sig.date) {
        return Err(mismatch(
            "the credential scope date does not match X-Amz-Date",
        ));
    }
    match sig.presigned {
        None if (r.now_s - t).abs() > CLOCK_SKEW_S_MAX => {
            return Err(mismatch(format!(
                "Signature expired: {} is more than 15 minutes away from the server's time",
                sig.amz_date
            )))
        }
        Some(expires) if r.now_s > t + expires || t - r.now_s > CLOCK_SKEW_S_MAX => {
            return Err(mismatch(
                "the presigned URL has expired or is not valid yet",
            ))
        }
        _ => {}
    }
    if !sig.signed_headers.contains(&"host") {
        return Err(mismatch("the host header must be signed"));
    }
    let mut canonical = String::with_capacity(512);
    canonical.push_str(r.method);
    canonical.push('\n');
    uri_encode_path(r.raw_path, &mut canonical);
    canonical.push('\n');
    let mut pairs: Vec<(&str, &str)> = r
        .raw_query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .filter(|(k, _)| sig.presigned.is_none() || *k != "X-Amz-Signature")
        .collect();
    pairs.sort_unstable();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            canonical.push('&');
        }
        canonical.push_str(k);
        canonical.push('=');
        canonical.push_str(v);
    }
    canonical.push('\n');
    for h in &sig.signed_headers {
        let values: Vec<String> = r
            .headers
            .get_all(*h)
            .iter()
            .map(|v| {
                String::from_utf8_lossy(v.as_bytes())
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        if values.is_empty() {
            return Err(mismatch(format!("the signed header {h} is missing")));
        }
        canonical.push_str(h);
        canonical.push(':');
        canonical.push_str(&values.join(","));
        canonical.push('\n');
    }
    canonical.push('\n');
    canonical.push_str(&sig.signed_headers.join(";"));
    canonical.push('\n');
    // The payload hash: the client's `x-amz-content-sha256`, else the body's SHA-256; a
    // presigned URL may also have been signed with `UNSIGNED-PAYLOAD` (S3 style), so that is
    // tried second.
    let body_hash = match r
        .headers
        .get("x-amz-content-sha256")
        .and_then(|v| v.to_str().ok())
    {
        Some(h) => h.to_string(),
        None => hex(&Sha256::digest(r.body)),
    };
    let mut candidates = vec![body_hash];
    if sig.presigned.is_some() && r.headers.get("x-amz-content-sha256").is_none() {
        candidates.push(UNSIGNED_PAYLOAD.to_string());
    }
    let scope = format!("{}/{}/{}/aws4_request", sig.date, sig.region, sig.service);
    let mut key = hmac(format!("AWS4{secret}").as_bytes(), sig.date.as_bytes());
    for part in [sig.region, sig.service, "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let given = unhex(sig.signature).ok_or_else(|| mismatch("the signature is not hex"))?;
    for payload_hash in candidates {
        let full = format!("{canonical}{payload_hash}");
        let string_to_sign = format!(
            "{ALGORITHM}\n{}\n{scope}\n{}",
            sig.amz_date,
            hex(&Sha256::digest(full.as_bytes()))
        );
        let mut mac = HmacSha256::new_from_slice(&key).expect("HMAC takes keys of any length");
        mac.update(string_to_sign.as_bytes());
        if mac.verify_slice(&given).is_ok() {
            return Ok(());
        }
    }
    Err(mismatch(
        "The request signature we calculated does not match the signature you provided. \
         Check your AWS Secret Access Key and signing method.",
    ))
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

pub fn hex(b: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push(char::from(D[usize::from(x >> 4)]));
        s.push(char::from(D[usize::from(x & 0xf)]));
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 128 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// URI-encodes a path as SigV4 wants it for non-S3 services: every byte except unreserved
/// characters and `/` becomes `%XX`, including the `%` of an already encoded path.
pub fn uri_encode_path(path: &str, out: &mut String) {
    if path.is_empty() {
        out.push('/');
        return;
    }
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

/// `20240131T235959Z` → Unix seconds.
pub fn parse_amz_date(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (h, mi, se) = (num(9..11)?, num(11..13)?, num(13..15)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    Some(days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + se)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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

    #[test]
    fn dates() {
        assert_eq!(parse_amz_date("19700101T000000Z"), Some(0));
        assert_eq!(parse_amz_date("20150830T123600Z"), Some(1_440_938_160));
        assert_eq!(parse_amz_date("2015-08-30T12:36"), None);
    }

    /// The example of the AWS SigV4 documentation (IAM ListUsers, GET with a query string).
    #[test]
    fn aws_documentation_example_verifies() {
        let mut headers = http::HeaderMap::new();
        headers.insert("host", "iam.amazonaws.com".parse().expect("ascii"));
        headers.insert(
            "content-type",
            "application/x-www-form-urlencoded; charset=utf-8"
                .parse()
                .expect("ascii"),
        );
        headers.insert("x-amz-date", "20150830T123600Z".parse().expect("ascii"));
        headers.insert(
            http::header::AUTHORIZATION,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
                .parse()
                .expect("ascii"),
        );
        let cfg = AuthConfig {
            mode: AuthMode::SigV4,
            keys: parse_keys("AKIDEXAMPLE:wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY:123456789012")
                .expect("keys"),
        };
        let mut r = SignedRequest {
            method: "GET",
            raw_path: "/",
            raw_query: "Action=ListUsers&Version=2010-05-08",
            headers: &headers,
            body: b"",
            now_s: 1_440_938_160,
        };
        let c = cfg.authenticate(&r).expect("valid signature");
        assert_eq!(c.account, "123456789012");
        assert!(c.verified);
        r.raw_query = "Action=ListUsers&Version=2010-05-09";
        assert_eq!(
            cfg.authenticate(&r).expect_err("tampered").code,
            "SignatureDoesNotMatch"
        );
        r.raw_query = "Action=ListUsers&Version=2010-05-08";
        r.now_s += CLOCK_SKEW_S_MAX + 1;
        assert_eq!(
            cfg.authenticate(&r).expect_err("skewed").code,
            "SignatureDoesNotMatch"
        );
    }
}
