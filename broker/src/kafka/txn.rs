//! Kafka transactions on the wire: InitProducerId with a transactional id, AddPartitionsToTxn,
//! AddOffsetsToTxn, TxnOffsetCommit and EndTxn, answered by the transaction coordinator on
//! shard 0 (`stream/txn.rs`); transactional batches in Produce; commit and abort markers
//! served as Kafka control batches. This node coordinates every transactional id
//! (FindCoordinator key type 1).
//!
//! Versions: AddPartitionsToTxn 0–3 (4+ is Kafka's broker-to-broker verification),
//! AddOffsetsToTxn, TxnOffsetCommit and EndTxn 0–3 (their later versions belong to Kafka's
//! transactions v2, KIP-890, which Sluice does not advertise).

use super::dispatch::{code, decode, encode_response};
use super::handlers::{error_code, Reply};
use super::Conn;
use crate::stream::txn::{TxnAnswer, TxnRequest};
use crate::stream::{StreamError, TopicPartition};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::records::{
    Compression, Record as KRecord, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use sluice_storage::BatchView;

/// Kafka's code for the partitions of an AddPartitionsToTxn left out because another one
/// in it was refused (the coordinator's own codes are in `stream::txn::txn_code`).
const OPERATION_NOT_ATTEMPTED: i16 = 55;

/// A topic's partitions in a request, each with the code found before the coordinator was
/// asked (`None`: the coordinator's answer applies).
type PartitionCodes = Vec<(String, Vec<(i32, Option<i16>)>)>;

/// Byte offsets in a Kafka v2 batch header (`DefaultRecordBatch`).
const LENGTH_AT: usize = 8;
const ATTRIBUTES_AT: usize = 21;
const BATCH_HEADER_BYTES: usize = 61;
const ATTR_TRANSACTIONAL: i16 = 1 << 4;

/// Whether a produced partition's batches are transactional: all of them or none (a mix is
/// `INVALID_RECORD`). Framing errors are left to `records::from_kafka`.
pub fn transactional(bytes: &Bytes) -> Result<bool, i16> {
    let (mut yes, mut no) = (0usize, 0usize);
    let mut at = 0usize;
    while bytes.len().saturating_sub(at) >= BATCH_HEADER_BYTES {
        let a = i16::from_be_bytes([bytes[at + ATTRIBUTES_AT], bytes[at + ATTRIBUTES_AT + 1]]);
        if a & ATTR_TRANSACTIONAL != 0 {
            yes += 1;
        } else {
            no += 1;
        }
        let len = i32::from_be_bytes(
            bytes[at + LENGTH_AT..at + LENGTH_AT + 4]
                .try_into()
                .expect("4 bytes"),
        );
        let Some(next) = usize::try_from(len)
            .ok()
            .and_then(|l| at.checked_add(12 + l))
        else {
            break;
        };
        at = next;
    }
    if yes > 0 && no > 0 {
        return Err(code::INVALID_RECORD);
    }
    Ok(yes > 0)
}

/// A stored transaction marker as Kafka's control batch (one record: key = version 0 and
/// type, 0 abort / 1 commit; value = version 0 and the coordinator epoch). Returns false for
/// any other control batch (left out, as before).
pub fn marker_to_kafka(v: &BatchView<'_>, out: &mut BytesMut) -> Result<bool, StreamError> {
    let Some(crate::stream::txn_index::TxnControl::Marker {
        producer_id,
        epoch,
        commit,
    }) = crate::stream::txn_index::TxnControl::of_batch(v)?
    else {
        return Ok(false);
    };
    let mut key = Vec::with_capacity(4);
    key.extend_from_slice(&0i16.to_be_bytes());
    key.extend_from_slice(&i16::from(commit).to_be_bytes());
    let mut value = Vec::with_capacity(6);
    value.extend_from_slice(&0i16.to_be_bytes());
    value.extend_from_slice(&0i32.to_be_bytes());
    let record = KRecord {
        transactional: true,
        control: true,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id,
        producer_epoch: epoch,
        timestamp_type: TimestampType::Creation,
        offset: v.header.base_offset as i64,
        sequence: -1,
        timestamp: v.header.first_timestamp_ms,
        key: Some(Bytes::from(key)),
        value: Some(Bytes::from(value)),
        headers: Default::default(),
    };
    let options = RecordEncodeOptions {
        version: 2,
        compression: Compression::None,
    };
    RecordBatchEncoder::encode(out, std::iter::once(&record), &options)
        .map_err(|e| StreamError::Internal(format!("encoding a Kafka control batch: {e}")))?;
    Ok(true)
}

/// The coordinator's answer, its storage errors as Kafka's codes (retriable when it is not
/// available yet).
async fn call(conn: &Conn, req: TxnRequest) -> Result<TxnAnswer, i16> {
    match conn.shard.txn_request(conn.account(), req).await {
        Ok(r) => r,
        Err(StreamError::Unavailable(_)) => Err(code::COORDINATOR_NOT_AVAILABLE),
        Err(e) => Err(error_code(&e)),
    }
}

/// InitProducerId for a transactional id: its producer id and next epoch (fencing the
/// previous producer of the id, whose open transaction is aborted).
pub async fn init_producer_id(
    conn: &Conn,
    txn_id: &str,
    req: &InitProducerIdRequest,
) -> InitProducerIdResponse {
    let mut r = InitProducerIdResponse::default();
    r.producer_id = (-1).into();
    r.producer_epoch = -1;
    let answer = call(
        conn,
        TxnRequest::InitProducerId {
            txn_id: txn_id.to_string(),
            timeout_ms: i64::from(req.transaction_timeout_ms),
            producer_id: i64::from(req.producer_id),
            epoch: req.producer_epoch,
        },
    )
    .await;
    match answer {
        Ok(TxnAnswer::Producer { producer_id, epoch }) => {
            r.producer_id = producer_id.into();
            r.producer_epoch = epoch;
        }
        Ok(TxnAnswer::Done) => r.error_code = code::UNKNOWN_SERVER_ERROR,
        Err(c) => r.error_code = c,
    }
    r
}

pub async fn run(
    conn: &mut Conn,
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    mut body: Bytes,
) -> Result<Reply, i16> {
    macro_rules! call {
        ($req:ty, $f:ident) => {{
            let req: $req = decode(&mut body, version)?;
            let resp = $f(conn, req).await;
            Reply::Body(
                encode_response(api, version, correlation_id, &resp)
                    .map_err(|_| code::UNKNOWN_SERVER_ERROR)?,
            )
        }};
    }
    Ok(match api {
        ApiKey::AddPartitionsToTxn => call!(AddPartitionsToTxnRequest, add_partitions),
        ApiKey::AddOffsetsToTxn => call!(AddOffsetsToTxnRequest, add_offsets),
        ApiKey::TxnOffsetCommit => call!(TxnOffsetCommitRequest, txn_offset_commit),
        ApiKey::EndTxn => call!(EndTxnRequest, end_txn),
        _ => return Err(code::UNSUPPORTED_VERSION),
    })
}

fn done(r: Result<TxnAnswer, i16>) -> i16 {
    match r {
        Ok(_) => code::NONE,
        Err(c) => c,
    }
}

async fn add_partitions(
    conn: &mut Conn,
    req: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    // Every partition must exist; else none is added (Kafka: OPERATION_NOT_ATTEMPTED for the
    // good ones).
    let mut checked: PartitionCodes = Vec::new();
    let mut partitions = Vec::new();
    for t in &req.v3_and_below_topics {
        let name = t.name.0.to_string();
        let count = conn.topic(&name).map(|m| m.partitions());
        let codes = t
            .partitions
            .iter()
            .map(|p| {
                let bad = match (&count, u32::try_from(*p)) {
                    (Ok(n), Ok(i)) if i < *n => {
                        partitions.push((name.clone(), i));
                        None
                    }
                    _ => Some(code::UNKNOWN_TOPIC_OR_PARTITION),
                };
                (*p, bad)
            })
            .collect();
        checked.push((name, codes));
    }
    let any_bad = checked
        .iter()
        .any(|(_, ps)| ps.iter().any(|(_, c)| c.is_some()));
    let common = if any_bad {
        OPERATION_NOT_ATTEMPTED
    } else {
        done(
            call(
                conn,
                TxnRequest::AddPartitions {
                    txn_id: req.v3_and_below_transactional_id.0.to_string(),
                    producer_id: i64::from(req.v3_and_below_producer_id),
                    epoch: req.v3_and_below_producer_epoch,
                    partitions,
                },
            )
            .await,
        )
    };
    let mut resp = AddPartitionsToTxnResponse::default();
    for (name, codes) in checked {
        let mut tr = add_partitions_to_txn_response::AddPartitionsToTxnTopicResult::default();
        tr.name = TopicName(kafka_protocol::protocol::StrBytes::from_string(name));
        for (p, c) in codes {
            let mut pr =
                add_partitions_to_txn_response::AddPartitionsToTxnPartitionResult::default();
            pr.partition_index = p;
            pr.partition_error_code = c.unwrap_or(common);
            tr.results_by_partition.push(pr);
        }
        resp.results_by_topic_v3_and_below.push(tr);
    }
    resp
}

async fn add_offsets(conn: &mut Conn, req: AddOffsetsToTxnRequest) -> AddOffsetsToTxnResponse {
    let mut r = AddOffsetsToTxnResponse::default();
    r.error_code = done(
        call(
            conn,
            TxnRequest::AddOffsets {
                txn_id: req.transactional_id.0.to_string(),
                producer_id: i64::from(req.producer_id),
                epoch: req.producer_epoch,
                group: req.group_id.0.to_string(),
            },
        )
        .await,
    );
    r
}

async fn txn_offset_commit(
    conn: &mut Conn,
    req: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    let mut offsets: Vec<(TopicPartition, u64)> = Vec::new();
    let mut early: PartitionCodes = Vec::new();
    for t in &req.topics {
        let name = t.name.0.to_string();
        let count = conn.partitions_of(&name);
        let codes = t
            .partitions
            .iter()
            .map(|p| {
                let c = match (
                    &count,
                    u32::try_from(p.partition_index),
                    u64::try_from(p.committed_offset),
                ) {
                    (Err(c), _, _) => Some(*c),
                    (Ok(n), Ok(i), Ok(o)) if i < *n => {
                        offsets.push(((name.clone(), i), o));
                        None
                    }
                    (Ok(_), Ok(_), Err(_)) => Some(code::INVALID_COMMIT_OFFSET_SIZE),
                    _ => Some(code::UNKNOWN_TOPIC_OR_PARTITION),
                };
                (p.partition_index, c)
            })
            .collect();
        early.push((name, codes));
    }
    let common = if offsets.is_empty() {
        code::NONE
    } else {
        done(
            call(
                conn,
                TxnRequest::OffsetCommit {
                    txn_id: req.transactional_id.0.to_string(),
                    producer_id: i64::from(req.producer_id),
                    epoch: req.producer_epoch,
                    group: req.group_id.0.to_string(),
                    offsets,
                },
            )
            .await,
        )
    };
    let mut resp = TxnOffsetCommitResponse::default();
    for (name, codes) in early {
        let mut tr = txn_offset_commit_response::TxnOffsetCommitResponseTopic::default();
        tr.name = TopicName(kafka_protocol::protocol::StrBytes::from_string(name));
        for (p, c) in codes {
            let mut pr = txn_offset_commit_response::TxnOffsetCommitResponsePartition::default();
            pr.partition_index = p;
            pr.error_code = c.unwrap_or(common);
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    resp
}

async fn end_txn(conn: &mut Conn, req: EndTxnRequest) -> EndTxnResponse {
    let mut r = EndTxnResponse::default();
    r.producer_id = req.producer_id;
    r.producer_epoch = req.producer_epoch;
    r.error_code = done(
        call(
            conn,
            TxnRequest::End {
                txn_id: req.transactional_id.0.to_string(),
                producer_id: i64::from(req.producer_id),
                epoch: req.producer_epoch,
                commit: req.committed,
            },
        )
        .await,
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::records::RecordBatchDecoder;

    /// A stored marker comes out as a Kafka control batch a client reads as one: the control
    /// and transactional bits, the producer, and the commit type in the key.
    #[test]
    fn markers_are_served_as_kafka_control_batches() {
        for commit in [true, false] {
            let mut stored = crate::stream::txn_index::TxnControl::Marker {
                producer_id: 42,
                epoch: 3,
                commit,
            }
            .to_batch(1_000);
            sluice_storage::batch::set_base_offset(&mut stored, 9);
            let v = BatchView::parse(&stored).expect("batch");
            let mut out = BytesMut::new();
            assert!(marker_to_kafka(&v, &mut out).expect("encodes"));
            let mut bytes = out.freeze();
            let sets = RecordBatchDecoder::decode_all(&mut bytes).expect("decodes");
            let r = &sets[0].records[0];
            assert!(r.control && r.transactional);
            assert_eq!((r.producer_id, r.producer_epoch, r.offset), (42, 3, 9));
            let key = r.key.as_ref().expect("key");
            assert_eq!(&key[..], &[0, 0, 0, u8::from(commit)]);
        }
    }

    #[test]
    fn a_mix_of_transactional_and_plain_batches_is_refused() {
        let mut batch = vec![0u8; BATCH_HEADER_BYTES];
        batch[LENGTH_AT..LENGTH_AT + 4]
            .copy_from_slice(&((BATCH_HEADER_BYTES - 12) as i32).to_be_bytes());
        let plain = batch.clone();
        batch[ATTRIBUTES_AT + 1] = ATTR_TRANSACTIONAL as u8;
        let txn = batch;
        assert_eq!(transactional(&Bytes::from(txn.clone())), Ok(true));
        assert_eq!(transactional(&Bytes::from(plain.clone())), Ok(false));
        let mixed: Vec<u8> = txn.into_iter().chain(plain).collect();
        assert_eq!(
            transactional(&Bytes::from(mixed)),
            Err(code::INVALID_RECORD)
        );
    }
}
