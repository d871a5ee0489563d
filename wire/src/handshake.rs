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
///
/// | version | adds                                                                        |
/// |---------|-----------------------------------------------------------------------------|
/// | 1       | everything before the cluster's leader hints                                |
/// | 2       | the `NotLeader` response frame (kind 0x80FF): the leader's client address   |
pub const PROTOCOL_VERSION: u16 = 2;
/// The first version with the `NotLeader` frame.
pub const PROTOCOL_VERSION_NOT_LEADER: u16 = 2;
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

/// The answer of a node that does not lead a request's partition, in the form a connection of
/// protocol `version` reads: the `NotLeader` frame from v2 on; on v1 an `Error` frame with
/// `ServiceUnavailable`, which v1 clients already retry, its message naming the leader — a v1
/// client does not know the `NotLeader` frame and would take it for a protocol error.
pub fn not_leader_response(
    version: u16,
    not_leader: crate::messages::NotLeaderResponse,
) -> crate::codec::Response {
    if version >= PROTOCOL_VERSION_NOT_LEADER {
        return crate::codec::Response::NotLeader(not_leader);
    }
    let leader = match &not_leader.leader_addr {
        Some(addr) => format!("the leader is at {addr}"),
        None => "no leader is known yet".to_string(),
    };
    crate::codec::Response::Error(ErrorResponse::new(
        ErrorCode::ServiceUnavailable,
        format!("{} ({leader}); retry", not_leader.message),
    ))
}

#[cfg(test)]
mod not_leader_tests {
    use super::*;
    use crate::codec::{decode_response, encode_response, Response};
    use crate::decoder::decode_one;
    use crate::messages::NotLeaderResponse;

    fn hint() -> NotLeaderResponse {
        NotLeaderResponse {
            message: "not the partition's leader".into(),
            leader_addr: Some("127.0.0.1:7001".into()),
            term: 4,
            outcome_unknown: true,
        }
    }

    /// A v2 connection gets the frame with the leader's address, through the codec unchanged.
    #[test]
    fn v2_gets_the_not_leader_frame() {
        let response = not_leader_response(PROTOCOL_VERSION_NOT_LEADER, hint());
        assert_eq!(response, Response::NotLeader(hint()));
        let bytes = encode_response(5, &response).expect("encodes");
        let frame = decode_one(&bytes, crate::FRAME_BYTES_MAX).expect("decodes");
        assert_eq!(frame.kind(), Some(crate::FrameKind::NotLeader));
        assert_eq!(decode_response(&frame), Ok(response));
    }

    /// A v1 client (which knows neither the frame nor the code) gets an error it knows and
    /// retries, whose message names the leader.
    #[test]
    fn v1_gets_a_retryable_error_naming_the_leader() {
        for (addr, says) in [
            (
                Some("127.0.0.1:7001".to_string()),
                "the leader is at 127.0.0.1:7001",
            ),
            (None, "no leader is known yet"),
        ] {
            let response = not_leader_response(
                1,
                NotLeaderResponse {
                    leader_addr: addr,
                    ..hint()
                },
            );
            let Response::Error(e) = response else {
                panic!("v1 got {response:?}");
            };
            assert_eq!(e.error_code(), ErrorCode::ServiceUnavailable);
            assert!(e.error_code().is_retryable());
            assert!(e.message.contains(says), "{}", e.message);
        }
    }

    /// A client that predates the code reads it as `Unknown` with the message kept (the raw
    /// number travels): what an old client would show for a `NotLeader` code in a batch entry.
    #[test]
    fn an_old_client_reads_the_code_as_unknown_with_its_message() {
        let e = ErrorResponse::new(ErrorCode::NotLeader, "not the leader; retry");
        assert_eq!(e.code, 52);
        // An old build's table is this one without NotLeader: from_u16 finds no match.
        let old_table: Vec<ErrorCode> = ErrorCode::ALL
            .into_iter()
            .filter(|c| *c != ErrorCode::NotLeader)
            .collect();
        let old_read = old_table
            .into_iter()
            .find(|c| c.as_u16() == e.code)
            .unwrap_or(ErrorCode::Unknown);
        assert_eq!(old_read, ErrorCode::Unknown);
        assert_eq!(e.message, "not the leader; retry");
        assert!(ErrorCode::NotLeader.is_retryable());
    }
}
