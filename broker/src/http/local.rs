//! The local default's guard: with authentication off, only local clients may drive the API.
//!
//! With `auth = none` any request is accepted, so the only thing between a web page in a
//! developer's browser and the broker on `127.0.0.1:9324` is the browser's same-origin policy —
//! and that does not stop a form POST (a "simple" request: the Query protocol's
//! `application/x-www-form-urlencoded` body) nor DNS rebinding (a page on `evil.example` whose
//! name then resolves to 127.0.0.1 is, to the browser, same-origin with itself). Two checks close
//! both, before a byte of the body is read:
//!
//! - **Host**: a rebinding page's requests carry its own name in `Host`. Accepted: `localhost`
//!   (and `*.localhost`, which resolvers keep on loopback), any IP literal (`127.0.0.1`,
//!   `[::1]`, the bound address, a container's bridge address — an IP cannot be rebound), and
//!   the names of `http.allowed_hosts`. Any port. A request without `Host` (HTTP/1.0 tools) is
//!   not a browser's and passes.
//! - **Origin**: browsers send it on cross-site POSTs; non-browser SDKs never do. Accepted only
//!   when its host passes the same test (a page served from localhost may call the API).
//!
//! `allowed_hosts = ["*"]` turns the Host check off (the Origin check stays). With SigV4 on, a
//! browser cannot sign requests, so neither check applies.

use super::protocol::SqsError;

/// The entry of `http.allowed_hosts` that accepts any Host.
pub const ANY_HOST: &str = "*";

/// Why a request was refused by the local guard (rendered as `AccessDenied`, 403).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocalGuardError {
    #[error(
        "Host {0:?} is not allowed while authentication is off (a web page could reach the \
         broker through DNS rebinding). Use localhost or an IP address, add the name to \
         http.allowed_hosts (SLUICE_HTTP_ALLOWED_HOSTS), or turn on SigV4 authentication."
    )]
    Host(String),
    #[error(
        "cross-site request refused: Origin {0:?} is not local and authentication is off (a web \
         page may not drive the API from a browser). Add its host to http.allowed_hosts, or turn \
         on SigV4 authentication."
    )]
    Origin(String),
}

impl From<LocalGuardError> for SqsError {
    fn from(e: LocalGuardError) -> Self {
        SqsError::new("AccessDenied", 403, e.to_string())
    }
}

/// Checks a request's `Host` and `Origin` headers (auth off only; see the module doc).
pub fn check(headers: &http::HeaderMap, allowed: &[String]) -> Result<(), LocalGuardError> {
    if let Some(host) = headers.get(http::header::HOST) {
        let shown = || String::from_utf8_lossy(host.as_bytes()).into_owned();
        let ok = allowed.iter().any(|a| a == ANY_HOST)
            || host
                .to_str()
                .ok()
                .and_then(host_name)
                .is_some_and(|h| local_or_allowed(h, allowed));
        if !ok {
            return Err(LocalGuardError::Host(shown()));
        }
    }
    for origin in headers.get_all(http::header::ORIGIN) {
        let shown = || String::from_utf8_lossy(origin.as_bytes()).into_owned();
        let host = origin
            .to_str()
            .ok()
            .and_then(|o| {
                o.strip_prefix("http://")
                    .or_else(|| o.strip_prefix("https://"))
            })
            .and_then(host_name);
        if !host.is_some_and(|h| local_or_allowed(h, allowed)) {
            return Err(LocalGuardError::Origin(shown()));
        }
    }
    Ok(())
}

/// The host of `host[:port]` (IPv6 literals in brackets), lower-cased; `None` if malformed.
fn host_name(authority: &str) -> Option<String> {
    let authority = authority.trim().trim_end_matches('/');
    let host = if let Some(rest) = authority.strip_prefix('[') {
        let end = rest.find(']')?;
        let after = &rest[end + 1..];
        if !(after.is_empty() || after.starts_with(':')) {
            return None;
        }
        &authority[..end + 2]
    } else {
        authority.split(':').next()?
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

fn local_or_allowed(host: String, allowed: &[String]) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let name = host.trim_end_matches('.');
    name == "localhost"
        || name.ends_with(".localhost")
        || bare.parse::<std::net::IpAddr>().is_ok()
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().expect("header value"));
        }
        h
    }

    #[test]
    fn local_hosts_pass_and_rebinding_names_do_not() {
        let none: Vec<String> = Vec::new();
        for ok in [
            "localhost",
            "localhost:9324",
            "LOCALHOST:1",
            "127.0.0.1:9324",
            "[::1]:9324",
            "[::1]",
            "10.1.2.3:9324",
            "sqs.localhost:9324",
        ] {
            assert_eq!(check(&headers(&[("host", ok)]), &none), Ok(()), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:9324",
            "localhost.evil.example",
            "127.0.0.1.nip.io:9324",
            "[::1]evil",
            "",
        ] {
            assert!(
                matches!(
                    check(&headers(&[("host", bad)]), &none),
                    Err(LocalGuardError::Host(_))
                ),
                "{bad}"
            );
        }
        assert_eq!(check(&http::HeaderMap::new(), &none), Ok(()));
        let allowed = vec!["sluice".to_string()];
        assert_eq!(
            check(&headers(&[("host", "sluice:9324")]), &allowed),
            Ok(())
        );
        let any = vec![ANY_HOST.to_string()];
        assert_eq!(check(&headers(&[("host", "evil.example")]), &any), Ok(()));
    }

    #[test]
    fn foreign_origins_are_refused_even_with_a_local_host() {
        let none: Vec<String> = Vec::new();
        let local = ("host", "127.0.0.1:9324");
        for ok in [
            "http://localhost:3000",
            "http://127.0.0.1:8080",
            "https://[::1]",
        ] {
            assert_eq!(
                check(&headers(&[local, ("origin", ok)]), &none),
                Ok(()),
                "{ok}"
            );
        }
        for bad in [
            "https://evil.example",
            "null",
            "file://",
            "http://evil.example:9324",
        ] {
            assert!(
                matches!(
                    check(&headers(&[local, ("origin", bad)]), &none),
                    Err(LocalGuardError::Origin(_))
                ),
                "{bad}"
            );
        }
        // `*` opens Host only: a foreign page is still refused.
        let any = vec![ANY_HOST.to_string()];
        assert!(check(&headers(&[local, ("origin", "https://evil.example")]), &any).is_err());
    }
}
