//! One request frame to one answer: the header, the version check, the SASL gate, and the
//! answers for what cannot be served — an unknown API or version, a body that does not
//! decode, an oversized frame — each with Kafka's error code, never a silent close.

use super::{handlers, Conn};
use crate::auth::AuthMode;
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, Message};

/// Kafka's error codes (`org.apache.kafka.common.protocol.Errors`) that Sluice answers.
pub mod code {
    pub const UNKNOWN_SERVER_ERROR: i16 = -1;
    pub const NONE: i16 = 0;
    pub const OFFSET_OUT_OF_RANGE: i16 = 1;
    pub const CORRUPT_MESSAGE: i16 = 2;
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub const LEADER_NOT_AVAILABLE: i16 = 5;
    pub const MESSAGE_TOO_LARGE: i16 = 10;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
    pub const INVALID_REQUIRED_ACKS: i16 = 21;
    pub const INVALID_COMMIT_OFFSET_SIZE: i16 = 28;
    pub const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
    pub const ILLEGAL_SASL_STATE: i16 = 34;
    pub const UNSUPPORTED_VERSION: i16 = 35;
    pub const TOPIC_ALREADY_EXISTS: i16 = 36;
    pub const INVALID_PARTITIONS: i16 = 37;
    pub const INVALID_REPLICATION_FACTOR: i16 = 38;
    pub const INVALID_CONFIG: i16 = 40;
    pub const INVALID_REQUEST: i16 = 42;
    pub const UNSUPPORTED_FOR_MESSAGE_FORMAT: i16 = 43;
    pub const POLICY_VIOLATION: i16 = 44;
    pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
    pub const INVALID_PRODUCER_EPOCH: i16 = 47;
    pub const SASL_AUTHENTICATION_FAILED: i16 = 58;
    pub const UNSUPPORTED_COMPRESSION_TYPE: i16 = 76;
    pub const INVALID_RECORD: i16 = 87;
    pub const THROTTLING_QUOTA_EXCEEDED: i16 = 89;
}

/// The APIs served and their versions (intersected with the codec's at use): every version the
/// `kafka-protocol` crate's schemas (Kafka 4.x's) define, from where record batches v2 begin
/// (Produce 3, Fetch 4) or where the codec begins. Topic ids (Produce 13, Fetch 13+, Metadata
/// 10+, DeleteTopics 6) are Sluice's topic ids as UUIDs (`admin::topic_id`). Two ceilings sit
/// below the codec's ApiKey range because its request schemas stop there: OffsetCommit 9
/// and OffsetFetch 9 (v10 requests would name topics by id, but the crate's request has no
/// v10 encoding), InitProducerId 5 (its request schema ends at 5).
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 13),
    (ApiKey::Fetch, 4, 18),
    (ApiKey::ListOffsets, 1, 10),
    (ApiKey::Metadata, 0, 13),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::FindCoordinator, 0, 6),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::DescribeGroups, 0, 6),
    (ApiKey::ListGroups, 0, 5),
    // v0: the PLAIN message follows in a bare frame (librdkafka 2.0 needs v0 advertised).
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::InitProducerId, 0, 5),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::DescribeLogDirs, 1, 4),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::DescribeCluster, 0, 2),
    // Share groups on queues (`share.rs`): v1, the first version Kafka 4.x clients speak.
    (ApiKey::ShareGroupHeartbeat, 1, 1),
    (ApiKey::ShareGroupDescribe, 1, 1),
    (ApiKey::ShareFetch, 1, 1),
    (ApiKey::ShareAcknowledge, 1, 1),
    // Transactions (`txn.rs`, which says why these versions).
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
];

/// The served version range of `key`, if it is served.
pub fn served(key: i16) -> Option<(ApiKey, i16, i16)> {
    let api = ApiKey::try_from(key).ok()?;
    let &(_, min, max) = SUPPORTED.iter().find(|(k, _, _)| *k == api)?;
    let codec = api.valid_versions();
    Some((api, min.max(codec.min), max.min(codec.max)))
}

pub struct Outcome {
    /// A whole frame (size prefix included), as `encode_response` makes it.
    pub answer: Option<Vec<u8>>,
    pub close: bool,
}

impl Outcome {
    fn answer(a: Vec<u8>) -> Outcome {
        Outcome {
            answer: Some(a),
            close: false,
        }
    }
}

fn prefix(frame: &[u8]) -> (i16, i16, i32) {
    (
        i16::from_be_bytes([frame[0], frame[1]]),
        i16::from_be_bytes([frame[2], frame[3]]),
        i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]),
    )
}

/// The correlation id and an error code alone: what an unknown API or version gets (its
/// error code comes first in every response that has one, as in ApiVersions v0's layout).
fn minimal(correlation_id: i32, code: i16) -> Vec<u8> {
    let mut out = Vec::with_capacity(10);
    out.extend_from_slice(&6i32.to_be_bytes());
    out.extend_from_slice(&correlation_id.to_be_bytes());
    out.extend_from_slice(&code.to_be_bytes());
    out
}

/// A response as the frame that goes on the wire: its size, header and body, encoded at the
/// request's version into one buffer sized up front (a fetch's records are copied into it once,
/// and the buffer is neither grown nor copied again on its way to the socket).
pub fn encode_response<R: Encodable>(
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &R,
) -> Result<Vec<u8>, String> {
    let mut header = ResponseHeader::default();
    header.correlation_id = correlation_id;
    let header_version = api.response_header_version(version);
    let size = header
        .compute_size(header_version)
        .and_then(|h| Ok(h + body.compute_size(version)?))
        .map_err(|e| e.to_string())?;
    let size_field = i32::try_from(size).map_err(|_| format!("a response of {size} bytes"))?;
    let mut buf = BytesMut::with_capacity(4 + size);
    buf.extend_from_slice(&size_field.to_be_bytes());
    header
        .encode(&mut buf, header_version)
        .map_err(|e| e.to_string())?;
    body.encode(&mut buf, version).map_err(|e| e.to_string())?;
    if buf.len() != 4 + size {
        return Err(format!("encoded {} bytes, sized {size}", buf.len() - 4));
    }
    Ok(Vec::from(buf))
}

/// The response of `api` carrying only `code` (top level where the response has one there;
/// else an empty response, which clients read as "nothing was done").
pub fn error_answer(api: ApiKey, version: i16, correlation_id: i32, code: i16) -> Vec<u8> {
    macro_rules! coded {
        ($t:ty) => {{
            let mut r = <$t>::default();
            r.error_code = code;
            encode_response(api, version, correlation_id, &r)
                .or_else(|_| encode_response(api, version, correlation_id, &<$t>::default()))
        }};
    }
    macro_rules! plain {
        ($t:ty) => {{
            encode_response(api, version, correlation_id, &<$t>::default())
        }};
    }
    let r = match api {
        ApiKey::Produce => plain!(ProduceResponse),
        ApiKey::Fetch => coded!(FetchResponse),
        ApiKey::ListOffsets => plain!(ListOffsetsResponse),
        ApiKey::Metadata => plain!(MetadataResponse),
        ApiKey::OffsetCommit => plain!(OffsetCommitResponse),
        ApiKey::OffsetFetch => coded!(OffsetFetchResponse),
        ApiKey::FindCoordinator => coded!(FindCoordinatorResponse),
        ApiKey::JoinGroup => coded!(JoinGroupResponse),
        ApiKey::Heartbeat => coded!(HeartbeatResponse),
        ApiKey::LeaveGroup => coded!(LeaveGroupResponse),
        ApiKey::SyncGroup => coded!(SyncGroupResponse),
        ApiKey::SaslHandshake => coded!(SaslHandshakeResponse),
        ApiKey::ApiVersions => coded!(ApiVersionsResponse),
        ApiKey::CreateTopics => plain!(CreateTopicsResponse),
        ApiKey::DeleteTopics => plain!(DeleteTopicsResponse),
        ApiKey::DescribeConfigs => plain!(DescribeConfigsResponse),
        ApiKey::InitProducerId => coded!(InitProducerIdResponse),
        ApiKey::SaslAuthenticate => coded!(SaslAuthenticateResponse),
        ApiKey::ListGroups => coded!(ListGroupsResponse),
        ApiKey::DescribeGroups => plain!(DescribeGroupsResponse),
        ApiKey::DeleteGroups => plain!(DeleteGroupsResponse),
        ApiKey::OffsetDelete => coded!(OffsetDeleteResponse),
        ApiKey::DeleteRecords => plain!(DeleteRecordsResponse),
        ApiKey::DescribeCluster => coded!(DescribeClusterResponse),
        ApiKey::AlterConfigs => plain!(AlterConfigsResponse),
        ApiKey::IncrementalAlterConfigs => plain!(IncrementalAlterConfigsResponse),
        ApiKey::DescribeLogDirs => coded!(DescribeLogDirsResponse),
        ApiKey::CreatePartitions => plain!(CreatePartitionsResponse),
        ApiKey::ShareGroupHeartbeat => coded!(ShareGroupHeartbeatResponse),
        ApiKey::ShareGroupDescribe => plain!(ShareGroupDescribeResponse),
        ApiKey::ShareFetch => coded!(ShareFetchResponse),
        ApiKey::ShareAcknowledge => coded!(ShareAcknowledgeResponse),
        ApiKey::AddPartitionsToTxn => coded!(AddPartitionsToTxnResponse),
        ApiKey::AddOffsetsToTxn => coded!(AddOffsetsToTxnResponse),
        ApiKey::EndTxn => coded!(EndTxnResponse),
        ApiKey::TxnOffsetCommit => plain!(TxnOffsetCommitResponse),
        _ => Err(String::new()),
    };
    r.unwrap_or_else(|_| minimal(correlation_id, code))
}

/// ApiVersions' answer: every served API with its versions.
pub fn api_versions(code: i16) -> ApiVersionsResponse {
    let mut r = ApiVersionsResponse::default();
    r.error_code = code;
    r.api_keys = SUPPORTED
        .iter()
        .filter_map(|(k, _, _)| served(*k as i16))
        .map(|(k, min, max)| {
            let mut v = api_versions_response::ApiVersion::default();
            v.api_key = k as i16;
            v.min_version = min;
            v.max_version = max;
            v
        })
        .collect();
    r
}

/// The answer to a frame whose size is over the limit, from its first bytes.
pub fn too_large(prefix_bytes: &[u8]) -> Vec<u8> {
    let (key, version, correlation_id) = prefix(prefix_bytes);
    match served(key) {
        Some((api, min, max)) if (min..=max).contains(&version) => {
            error_answer(api, version, correlation_id, code::MESSAGE_TOO_LARGE)
        }
        _ => minimal(correlation_id, code::MESSAGE_TOO_LARGE),
    }
}

pub async fn handle(conn: &mut Conn, frame: Bytes) -> Outcome {
    let (key, version, correlation_id) = prefix(&frame);
    let frame_bytes = frame.len() as u64;
    let Some((api, min, max)) = served(key) else {
        return Outcome::answer(minimal(correlation_id, code::UNSUPPORTED_VERSION));
    };
    if !(min..=max).contains(&version) {
        if api == ApiKey::ApiVersions {
            // Kafka's rule (KIP-511): answer at v0 with the versions, so the client can pick.
            let body = api_versions(code::UNSUPPORTED_VERSION);
            return Outcome::answer(
                encode_response(api, 0, correlation_id, &body)
                    .unwrap_or_else(|_| minimal(correlation_id, code::UNSUPPORTED_VERSION)),
            );
        }
        return Outcome::answer(minimal(correlation_id, code::UNSUPPORTED_VERSION));
    }
    let mut body = frame;
    if RequestHeader::decode(&mut body, api.request_header_version(version)).is_err() {
        return Outcome::answer(error_answer(
            api,
            version,
            correlation_id,
            code::INVALID_REQUEST,
        ));
    }
    let auth_on = conn.shard.config.auth.mode == AuthMode::SigV4;
    let open_apis = matches!(
        api,
        ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
    );
    if auth_on && conn.account.is_none() && !open_apis {
        return Outcome {
            answer: Some(error_answer(
                api,
                version,
                correlation_id,
                code::SASL_AUTHENTICATION_FAILED,
            )),
            close: true,
        };
    }
    if !open_apis {
        if let Err(code) = super::quota::admit(conn, frame_bytes).await {
            return Outcome::answer(error_answer(api, version, correlation_id, code));
        }
    }
    let started = crate::runtime::monotonic_now();
    let ran = handlers::run(conn, api, version, correlation_id, body).await;
    crate::metrics::record_request(
        crate::metrics::Action::Kafka(api),
        started.elapsed(),
        ran.as_ref()
            .err()
            .map(|c| crate::metrics::ErrorKey::Kafka(*c)),
    );
    match ran {
        Ok(handlers::Reply::Body(r)) => Outcome::answer(r),
        Ok(handlers::Reply::None) => Outcome {
            answer: None,
            close: false,
        },
        Ok(handlers::Reply::Close(r)) => Outcome {
            answer: Some(r),
            close: true,
        },
        Err(code) => Outcome::answer(error_answer(api, version, correlation_id, code)),
    }
}

/// The largest bare PLAIN message taken after a SaslHandshake v0.
pub const SASL_PLAIN_BYTES_MAX: usize = 1024;

/// The bare PLAIN message after a SaslHandshake v0: true if it authenticated.
pub fn sasl_raw(conn: &mut Conn, token: &[u8]) -> bool {
    conn.sasl_raw_next = false;
    super::sasl::plain_counted(conn, token)
}

/// Decodes a request body at its version (the caller answers `INVALID_REQUEST` on failure).
pub fn decode<T: Decodable + Message>(body: &mut Bytes, version: i16) -> Result<T, i16> {
    T::decode(body, version).map_err(|_| code::INVALID_REQUEST)
}
