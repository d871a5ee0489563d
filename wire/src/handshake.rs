//! Version negotiation: the first frame on a connection is `Hello`, answered by `HelloOk` or by
//! an `Error` frame with code `UnsupportedVersion` (and the server's range), never by a silent
//! close.
//!
//! The protocol version covers the message types and frame kinds; the frame layout has its own
//! version in the magic byte (`FRAME_FORMAT_VERSION`). A wire-format type changes only with a
//! version bump: add the new version to the server's range, keep serving the old one while
//! clients still speak it.

use crate::error_code::ErrorCode;
use crate::frame::{FRAME_BYTES_MAX, REQUEST_FRAME_BYTES_MAX};
use crate::messages::{ErrorResponse, Hello, HelloOk, VersionRange};

/// The protocol version this build speaks best.
pub const PROTOCOL_VERSION: u16 = 1;
/// The oldest protocol version this build still speaks.
pub const PROTOCOL_VERSION_MIN: u16 = 1;
/// Default bound on requests in flight per connection (server side). A bounded window is
/// CONTRACT.md C8; 1024 outstanding 1 MiB sends is already 1 GiB of client data in the air.
pub const IN_FLIGHT_REQUESTS_MAX_DEFAULT: u32 = 1024;

/// Upper bound of the UDP payload size that both ends' QUIC path-MTU discovery searches up to:
/// a 9001-byte jumbo frame (cloud networks inside a region) less the IPv6 and UDP headers.
/// Discovery probes before it uses a size, so a 1500-byte path stays at ~1452 and loses nothing;
/// where jumbo frames (or loopback) carry it, six times fewer packets are built, encrypted and
/// acknowledged for the same bytes.
pub const QUIC_UDP_PAYLOAD_UPPER_BOUND: u16 = 8952;

/// The versions this build speaks.
pub fn supported_versions() -> VersionRange {
    VersionRange {
        min: PROTOCOL_VERSION_MIN,
        max: PROTOCOL_VERSION,
    }
}

/// The highest version in both ranges, if any. Empty (min > max) ranges match nothing.
pub fn negotiate_version(client: VersionRange, server: VersionRange) -> Option<u16> {
    let low = client.min.max(server.min);
    let high = client.max.min(server.max);
    (low <= high).then_some(high)
}

/// What the server says about itself in `HelloOk`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    pub versions: VersionRange,
    pub server_name: String,
    pub server_version: String,
    pub request_frame_bytes_max: u32,
    pub response_frame_bytes_max: u32,
    pub in_flight_requests_max: u32,
}

impl ServerInfo {
    /// This build's versions and the protocol's maximum limits.
    pub fn new(server_name: impl Into<String>, server_version: impl Into<String>) -> Self {
        ServerInfo {
            versions: supported_versions(),
            server_name: server_name.into(),
            server_version: server_version.into(),
            // Both below u32::MAX (const-asserted in `frame`).
            request_frame_bytes_max: REQUEST_FRAME_BYTES_MAX as u32,
            response_frame_bytes_max: FRAME_BYTES_MAX as u32,
            in_flight_requests_max: IN_FLIGHT_REQUESTS_MAX_DEFAULT,
        }
    }
}

/// The server's answer to a `Hello` (authentication is the broker's, before or after this:
/// `account_id` is what the credential resolved to).
pub fn answer_hello(
    hello: &Hello,
    server: &ServerInfo,
    account_id: &str,
) -> Result<HelloOk, ErrorResponse> {
    match negotiate_version(hello.versions, server.versions) {
        Some(version) => Ok(HelloOk {
            version,
            server_name: server.server_name.clone(),
            server_version: server.server_version.clone(),
            account_id: account_id.to_string(),
            request_frame_bytes_max: server.request_frame_bytes_max,
            response_frame_bytes_max: server.response_frame_bytes_max,
            in_flight_requests_max: server.in_flight_requests_max,
        }),
        None => Err(ErrorResponse {
            code: ErrorCode::UnsupportedVersion.as_u16(),
            message: format!(
                "client speaks protocol versions {}..={}, server {}..={}",
                hello.versions.min, hello.versions.max, server.versions.min, server.versions.max
            ),
            supported_versions: Some(server.versions),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(min: u16, max: u16) -> VersionRange {
        VersionRange { min, max }
    }

    #[test]
    fn picks_the_highest_common_version() {
        assert_eq!(negotiate_version(range(1, 3), range(2, 5)), Some(3));
        assert_eq!(negotiate_version(range(1, 1), range(1, 1)), Some(1));
        assert_eq!(negotiate_version(range(4, 9), range(1, 3)), None);
        assert_eq!(negotiate_version(range(3, 1), range(1, 3)), None);
    }

    #[test]
    fn unsupported_version_is_a_clear_error() {
        let hello = Hello {
            versions: range(7, 9),
            client_name: "future-sdk".into(),
            client_version: "9.0".into(),
            auth_token: Some("secret".into()),
        };
        let err = answer_hello(&hello, &ServerInfo::new("sluiced", "0.1.0"), "000000000000")
            .expect_err("no common version");
        assert_eq!(err.error_code(), ErrorCode::UnsupportedVersion);
        assert_eq!(err.supported_versions, Some(supported_versions()));
        assert!(err.message.contains("7..=9"));
        // The token never shows in logs.
        assert!(!format!("{hello:?}").contains("secret"));
    }

    #[test]
    fn hello_ok_carries_limits() {
        let hello = Hello {
            versions: supported_versions(),
            ..Hello::default()
        };
        let ok = answer_hello(&hello, &ServerInfo::new("sluiced", "0.1.0"), "123")
            .expect("same versions");
        assert_eq!(ok.version, PROTOCOL_VERSION);
        assert_eq!(ok.request_frame_bytes_max as usize, REQUEST_FRAME_BYTES_MAX);
        assert_eq!(ok.account_id, "123");
    }
}
