//! AWS Signature Version 4: who sent a request, and is its signature right.
//!
//! Both forms real clients use: the `Authorization: AWS4-HMAC-SHA256 Credential=…` header and
//! the presigned query string (`X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=…`). The
//! canonical request follows what botocore (and the other SDKs) sign for non-S3 services: the
//! path URI-encoded once more, the raw query pairs sorted, the signed headers with collapsed
//! spaces, and the payload hash. The signature is compared in constant time
//! (`Mac::verify_slice`).
//!
//! **The payload hash is always the server's own.** The SHA-256 of the body *as received* goes
//! into the canonical request; a client's `x-amz-content-sha256` header is only compared with it
//! (a mismatch is refused), never trusted in its place — otherwise a captured request could be
//! replayed with another body for the 15 minutes its date is valid. `UNSIGNED-PAYLOAD` (what a
//! presigned URL may be signed with) binds no body, so such a request must carry none: with the
//! Query protocol, form fields in the body would otherwise override the signed query, `Action`
//! included.

use super::{AuthConfig, AuthMode, Caller};
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

/// Why a request's signature was refused: the SQS error code (also its JSON `__type`), the
/// HTTP status, and a message for the client. The HTTP front end renders it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthError {
    pub code: &'static str,
    pub status: u16,
    pub message: String,
}

fn auth_error(code: &'static str, status: u16, msg: impl Into<String>) -> AuthError {
    AuthError {
        code,
        status,
        message: msg.into(),
    }
}

fn incomplete(msg: impl Into<String>) -> AuthError {
    auth_error("IncompleteSignature", 400, msg)
}

fn mismatch(msg: impl Into<String>) -> AuthError {
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
    pub fn authenticate(&self, r: &SignedRequest<'_>) -> Result<Caller, AuthError> {
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

fn parse<'a>(r: &'a SignedRequest<'a>) -> Result<Option<Signature<'a>>, AuthError> {
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
) -> Result<Signature<'a>, AuthError> {
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

impl AuthConfig {
    /// What can be checked before the body is read (SigV4 mode; nothing otherwise): a
    /// signature is there and well formed, its access key is known, its date is within the
    /// allowed skew (a presigned URL: not expired). `r.body` is not looked at. A request that
    /// fails here is refused without a byte of its body buffered; one that passes is still
    /// unauthenticated until [`AuthConfig::authenticate`] has checked the signature over the
    /// body (the HTTP front end bounds what such requests may buffer meanwhile).
    pub fn precheck(&self, r: &SignedRequest<'_>) -> Result<(), AuthError> {
        if self.mode != AuthMode::SigV4 {
            return Ok(());
        }
        let sig = parse(r)?.ok_or_else(|| {
            auth_error(
                "MissingAuthenticationToken",
                403,
                "Request is missing Authentication Token",
            )
        })?;
        if !self.keys.contains_key(sig.access_key) {
            return Err(auth_error(
                "InvalidClientTokenId",
                403,
                "The security token included in the request is invalid.",
            ));
        }
        check_time(r, &sig)
    }
}

/// The signature's date: well formed, matching the credential scope, within the skew.
fn check_time(r: &SignedRequest<'_>, sig: &Signature<'_>) -> Result<(), AuthError> {
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
    Ok(())
}

fn verify(r: &SignedRequest<'_>, sig: &Signature<'_>, secret: &str) -> Result<(), AuthError> {
    check_time(r, sig)?;
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
    // The payload hash: the body's own SHA-256. A client's `x-amz-content-sha256` must agree
    // with it; `UNSIGNED-PAYLOAD` (there, or as the second try of a presigned URL) is accepted
    // only for a request without a body, so that nothing unsigned is ever read.
    let body_hash = hex(&Sha256::digest(r.body));
    let declared = match r.headers.get("x-amz-content-sha256") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| mismatch("the x-amz-content-sha256 header is not ASCII"))?,
        ),
    };
    let mut candidates = Vec::with_capacity(2);
    match declared {
        Some(UNSIGNED_PAYLOAD) => candidates.push(UNSIGNED_PAYLOAD),
        Some(h) if h.eq_ignore_ascii_case(&body_hash) => candidates.push(body_hash.as_str()),
        Some(_) => {
            return Err(mismatch(
                "The x-amz-content-sha256 header does not match the SHA-256 of the request body \
                 the server received.",
            ))
        }
        None => {
            candidates.push(body_hash.as_str());
            if sig.presigned.is_some() {
                candidates.push(UNSIGNED_PAYLOAD);
            }
        }
    }
    let scope = format!("{}/{}/{}/aws4_request", sig.date, sig.region, sig.service);
    let mut key = hmac(format!("AWS4{secret}").as_bytes(), sig.date.as_bytes());
    for part in [sig.region, sig.service, "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let given = unhex(sig.signature).ok_or_else(|| mismatch("the signature is not hex"))?;
    for payload_hash in candidates {
        if payload_hash == UNSIGNED_PAYLOAD && !r.body.is_empty() {
            // Checked before the signature, so a client learns why and nothing is compared
            // against a body no signature covers.
            return Err(mismatch(
                "A request signed with UNSIGNED-PAYLOAD must not carry a body: sign the body's \
                 SHA-256, or send every parameter in the signed query string.",
            ));
        }
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
    use crate::auth::parse_keys;

    #[test]
    fn dates() {
        assert_eq!(parse_amz_date("19700101T000000Z"), Some(0));
        assert_eq!(parse_amz_date("20150830T123600Z"), Some(1_440_938_160));
        assert_eq!(parse_amz_date("2015-08-30T12:36"), None);
    }

    /// The headers of the AWS SigV4 documentation's example (IAM ListUsers, GET, empty body)
    /// and a configuration that knows its key.
    fn documentation_example() -> (http::HeaderMap, AuthConfig) {
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
        (headers, cfg)
    }

    /// The example of the AWS SigV4 documentation (IAM ListUsers, GET with a query string).
    #[test]
    fn aws_documentation_example_verifies() {
        let (headers, cfg) = documentation_example();
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

    /// The example request signed over an empty body: a body added later, or a header that
    /// claims another payload hash, is refused.
    #[test]
    fn the_signature_binds_the_body_received() {
        let (headers, cfg) = documentation_example();
        let request = |headers: &http::HeaderMap, body: &'static [u8]| {
            let r = SignedRequest {
                method: "GET",
                raw_path: "/",
                raw_query: "Action=ListUsers&Version=2010-05-08",
                headers,
                body,
                now_s: 1_440_938_160,
            };
            cfg.authenticate(&r).map(|c| c.account)
        };
        assert_eq!(request(&headers, b"").as_deref(), Ok("123456789012"));
        let e = request(&headers, b"Action=DeleteUser").expect_err("another body");
        assert_eq!(e.code, "SignatureDoesNotMatch");
        // The empty body's hash, claimed for a non-empty body: the claim is checked.
        let mut claimed = headers.clone();
        claimed.insert(
            "x-amz-content-sha256",
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
                .parse()
                .expect("ascii"),
        );
        assert_eq!(request(&claimed, b"").as_deref(), Ok("123456789012"));
        let e = request(&claimed, b"Action=DeleteUser").expect_err("claimed hash");
        assert!(e.message.contains("x-amz-content-sha256"), "{e:?}");
        claimed.insert(
            "x-amz-content-sha256",
            "UNSIGNED-PAYLOAD".parse().expect("ascii"),
        );
        let e = request(&claimed, b"Action=DeleteUser").expect_err("unsigned body");
        assert!(e.message.contains("UNSIGNED-PAYLOAD"), "{e:?}");
    }
}
