//! The message types frame bodies carry, one rkyv-archived struct per frame kind.
//!
//! Field names follow the SQS members (`QueueUrl` → `queue_url`, `MaxNumberOfMessages` →
//! `max_number_of_messages`), so that the SDK, the HTTP front end and the SQS documentation read
//! alike. The wire carries what the client sent; range and content checks (1-10 messages,
//! visibility 0-43 200 s, attribute names) are the broker's, so that both front ends report the
//! same SQS errors for the same input.
//!
//! **Queue identification**: by queue URL, as in SQS (`QueueUrl`, `http://host:9324/<account
//! id>/<queue name>`), obtained from CreateQueue or GetQueueUrl. One string works for both the
//! native and the HTTP API, SDK code ports from the AWS SDK unchanged, and the broker resolves it
//! with one map lookup; a binary (account, name) pair would save a few bytes a request and
//! nothing measurable.
//!
//! Maps are `BTreeMap`s: SQS maps have unique keys, and sorted archives make the encoding of a
//! message deterministic (golden tests, checksums of identical requests).

use std::collections::BTreeMap;

use crate::error_code::ErrorCode;

/// Arbitrary batches in tests hold up to this many entries: a little over SQS's 10, since the
/// wire does not judge counts (the broker does), and small enough that message-sized values keep
/// the properties fast.
#[cfg(test)]
const BATCH_ENTRIES_TEST_MAX: usize = crate::frame::BATCH_ENTRIES_MAX + 2;

/// Derives every wire type needs: rkyv (with bytecheck validation), plain value semantics, and in
/// tests proptest's `Arbitrary` for round-trip properties.
macro_rules! wire_types {
    ($($(#[$meta:meta])* pub $item:ident $name:ident $body:tt)*) => {
        $(
            #[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Clone, PartialEq, Eq)]
            #[cfg_attr(test, derive(proptest_derive::Arbitrary))]
            $(#[$meta])*
            pub $item $name $body
        )*
    };
}

/// Queue attributes by SQS name (`VisibilityTimeout` → `"30"`), values as SQS strings.
pub type AttributeMap = BTreeMap<String, String>;
/// Queue tags, key → value.
pub type TagMap = BTreeMap<String, String>;
/// Message attributes by name.
pub type MessageAttributeMap = BTreeMap<String, MessageAttributeValue>;

wire_types! {
    // ---- Connection -------------------------------------------------------------------------

    /// An inclusive range of protocol versions.
    #[derive(Debug, Copy, Default)]
    pub struct VersionRange {
        pub min: u16,
        pub max: u16,
    }

    /// The first frame on every connection (request id 0). `Debug` hides the token.
    #[derive(Default)]
    pub struct Hello {
        pub versions: VersionRange,
        pub client_name: String,
        pub client_version: String,
        /// Opaque credential the server checks (signed token, API key); `None` on open servers.
        pub auth_token: Option<String>,
    }

    /// The server's answer to `Hello`: the version both speak and the limits it enforces.
    #[derive(Debug, Default)]
    pub struct HelloOk {
        pub version: u16,
        pub server_name: String,
        pub server_version: String,
        /// The account the credential belongs to (the `<account id>` of queue URLs).
        pub account_id: String,
        /// The largest request frame the server accepts, header and trailer included.
        pub request_frame_bytes_max: u32,
        /// The largest response frame the server sends (size the client's decoder with it).
        pub response_frame_bytes_max: u32,
        /// Requests in flight per connection beyond which the server answers
        /// `TooManyInFlightRequests` (or stops reading, which is QUIC flow control's job).
        pub in_flight_requests_max: u32,
    }

    /// Where to send requests so that they run on the core that owns their partition: every
    /// shard's own address, and, for `topic` (a topic name, or `queue:<name>`; empty for none),
    /// the shard that owns each partition.
    #[derive(Debug, Default)]
    pub struct GetRoutingRequest {
        pub topic: String,
    }

    #[derive(Debug, Default)]
    pub struct GetRoutingResult {
        /// Per shard, `ip:port` of its own endpoint (empty when it has none: send everything
        /// to the address you connected to).
        pub shard_addrs: Vec<String>,
        /// Per partition of the topic asked about, the index of its shard in `shard_addrs`.
        pub partition_shards: Vec<u32>,
    }

    /// The generic error response: answers any request, or request id 0 for errors that are
    /// about the connection (bad `Hello`, a frame that could not be delimited).
    #[derive(Debug, Default)]
    pub struct ErrorResponse {
        /// Raw [`ErrorCode`] number, kept raw so codes from newer servers survive the trip.
        pub code: u16,
        pub message: String,
        /// Set with `UnsupportedVersion`: what the server speaks.
        pub supported_versions: Option<VersionRange>,
    }

    /// Protocol v2: the answer of a cluster node that does not lead the partition a request is
    /// for (frame kind `NotLeader`, error code [`ErrorCode::NotLeader`]). Sent only on
    /// connections that negotiated v2 or later ([`crate::not_leader_response`]).
    #[derive(Debug, Default)]
    pub struct NotLeaderResponse {
        pub message: String,
        /// The leader's client (QUIC) address, `host:port`, as this node knows it from the
        /// cluster configuration; `None` while it knows no leader (an election).
        pub leader_addr: Option<String>,
        /// The Raft term the node answered in.
        pub term: u64,
        /// The node lost the lead while the request ran: it may still take effect under the
        /// next leader (as after a timeout). `false`: nothing was done.
        pub outcome_unknown: bool,
    }

    // ---- Queue administration ---------------------------------------------------------------

    #[derive(Debug, Default)]
    pub struct CreateQueueRequest {
        pub queue_name: String,
        pub attributes: AttributeMap,
        pub tags: TagMap,
    }

    #[derive(Debug, Default)]
    pub struct CreateQueueResult {
        pub queue_url: String,
    }

    #[derive(Debug, Default)]
    pub struct DeleteQueueRequest {
        pub queue_url: String,
    }

    #[derive(Debug, Default)]
    pub struct DeleteQueueResult {}

    #[derive(Debug, Default)]
    pub struct GetQueueUrlRequest {
        pub queue_name: String,
        pub queue_owner_aws_account_id: Option<String>,
    }

    #[derive(Debug, Default)]
    pub struct GetQueueUrlResult {
        pub queue_url: String,
    }

    #[derive(Debug, Default)]
    pub struct ListQueuesRequest {
        pub queue_name_prefix: Option<String>,
        pub next_token: Option<String>,
        /// 1-1000; `None` lists up to 1000 without pagination, as SQS does.
        pub max_results: Option<u32>,
    }

    #[derive(Debug, Default)]
    pub struct ListQueuesResult {
        pub queue_urls: Vec<String>,
        pub next_token: Option<String>,
    }

    #[derive(Debug, Default)]
    pub struct GetQueueAttributesRequest {
        pub queue_url: String,
        /// SQS names, or `All`.
        pub attribute_names: Vec<String>,
    }

    #[derive(Debug, Default)]
    pub struct GetQueueAttributesResult {
        pub attributes: AttributeMap,
    }

    #[derive(Debug, Default)]
    pub struct SetQueueAttributesRequest {
        pub queue_url: String,
        pub attributes: AttributeMap,
    }

    #[derive(Debug, Default)]
    pub struct SetQueueAttributesResult {}

    #[derive(Debug, Default)]
    pub struct PurgeQueueRequest {
        pub queue_url: String,
    }

    #[derive(Debug, Default)]
    pub struct PurgeQueueResult {}

    #[derive(Debug, Default)]
    pub struct TagQueueRequest {
        pub queue_url: String,
        pub tags: TagMap,
    }

    #[derive(Debug, Default)]
    pub struct TagQueueResult {}

    #[derive(Debug, Default)]
    pub struct UntagQueueRequest {
        pub queue_url: String,
        pub tag_keys: Vec<String>,
    }

    #[derive(Debug, Default)]
    pub struct UntagQueueResult {}

    #[derive(Debug, Default)]
    pub struct ListQueueTagsRequest {
        pub queue_url: String,
    }

    #[derive(Debug, Default)]
    pub struct ListQueueTagsResult {
        pub tags: TagMap,
    }

    #[derive(Debug, Default)]
    pub struct ListDeadLetterSourceQueuesRequest {
        pub queue_url: String,
        pub next_token: Option<String>,
        pub max_results: Option<u32>,
    }

    #[derive(Debug, Default)]
    pub struct ListDeadLetterSourceQueuesResult {
        pub queue_urls: Vec<String>,
        pub next_token: Option<String>,
    }

    #[derive(Debug, Default)]
    pub struct StartMessageMoveTaskRequest {
        /// ARN of the dead-letter queue to move messages out of.
        pub source_arn: String,
        /// `None`: back to each message's original source queue.
        pub destination_arn: Option<String>,
        pub max_number_of_messages_per_second: Option<u32>,
    }

    #[derive(Debug, Default)]
    pub struct StartMessageMoveTaskResult {
        pub task_handle: String,
    }

    #[derive(Debug, Default)]
    pub struct ListMessageMoveTasksRequest {
        pub source_arn: String,
        /// 1-10.
        pub max_results: Option<u32>,
    }

    #[derive(Debug, Default)]
    pub struct ListMessageMoveTasksResult {
        #[cfg_attr(test, proptest(strategy = "proptest::collection::vec(proptest::prelude::any::<ListMessageMoveTasksResultEntry>(), 0..=BATCH_ENTRIES_TEST_MAX)"))]
        pub results: Vec<ListMessageMoveTasksResultEntry>,
    }

    #[derive(Debug, Default)]
    pub struct ListMessageMoveTasksResultEntry {
        /// Only for the running task.
        pub task_handle: Option<String>,
        pub status: MoveTaskStatus,
        pub source_arn: String,
        pub destination_arn: Option<String>,
        pub max_number_of_messages_per_second: Option<u32>,
        pub approximate_number_of_messages_moved: u64,
        pub approximate_number_of_messages_to_move: Option<u64>,
        pub failure_reason: Option<String>,
        /// Epoch milliseconds.
        pub started_timestamp: u64,
    }

    /// SQS's `Status` strings of a message move task.
    #[derive(Debug, Copy, Default)]
    pub enum MoveTaskStatus {
        #[default]
        Running,
        Completed,
        Cancelling,
        Cancelled,
        Failed,
    }

    #[derive(Debug, Default)]
    pub struct CancelMessageMoveTaskRequest {
        pub task_handle: String,
    }

    #[derive(Debug, Default)]
    pub struct CancelMessageMoveTaskResult {
        pub approximate_number_of_messages_moved: u64,
    }

    // ---- Messages ---------------------------------------------------------------------------

    /// A message attribute as SQS has it: a data type (`String`, `Number`, `Binary`, optionally
    /// `.label`) and a value.
    #[derive(Debug, Default)]
    pub struct MessageAttributeValue {
        pub data_type: String,
        pub value: AttributeValue,
    }

    /// `String` and `Number` attributes travel as SQS's `StringValue`, `Binary` ones as
    /// `BinaryValue`. (SQS's `StringListValues`/`BinaryListValues` are reserved and unimplemented
    /// there; they are left out here.)
    #[derive(Debug)]
    pub enum AttributeValue {
        String(String),
        Binary(Vec<u8>),
    }

    #[derive(Debug, Default)]
    pub struct SendMessageRequest {
        pub queue_url: String,
        pub message_body: String,
        pub delay_seconds: Option<u32>,
        pub message_attributes: MessageAttributeMap,
        /// Only `AWSTraceHeader` is defined by SQS.
        pub message_system_attributes: MessageAttributeMap,
        pub message_deduplication_id: Option<String>,
        pub message_group_id: Option<String>,
    }

    #[derive(Debug, Default)]
    pub struct SendMessageResult {
        pub message_id: String,
        /// Lower-case hex, as SQS.
        pub md5_of_message_body: String,
        pub md5_of_message_attributes: Option<String>,
        pub md5_of_message_system_attributes: Option<String>,
        /// FIFO queues only, decimal as SQS.
        pub sequence_number: Option<String>,
    }

    #[derive(Debug, Default)]
    pub struct SendMessageBatchRequest {
        pub queue_url: String,
        #[cfg_attr(test, proptest(strategy = "proptest::collection::vec(proptest::prelude::any::<SendMessageBatchRequestEntry>(), 0..=BATCH_ENTRIES_TEST_MAX)"))]
        pub entries: Vec<SendMessageBatchRequestEntry>,
    }

    #[derive(Debug, Default)]
    pub struct SendMessageBatchRequestEntry {
        /// Distinct within the batch; 1-80 alphanumerics, `-`, `_`.
        pub id: String,
        pub message_body: String,
        pub delay_seconds: Option<u32>,
        pub message_attributes: MessageAttributeMap,
        pub message_system_attributes: MessageAttributeMap,
        pub message_deduplication_id: Option<String>,
        pub message_group_id: Option<String>,
    }

    #[derive(Debug, Default)]
    pub struct SendMessageBatchResult {
        #[cfg_attr(test, proptest(strategy = "proptest::collection::vec(proptest::prelude::any::<SendMessageBatchResultEntry>(), 0..=BATCH_ENTRIES_TEST_MAX)"))]
        pub successful: Vec<SendMessageBatchResultEntry>,
        #[cfg_attr(test, proptest(strategy = "proptest::collection::vec(proptest::prelude::any::<BatchResultErrorEntry>(), 0..=BATCH_ENTRIES_TEST_MAX)"))]
        pub failed: Vec<BatchResultErrorEntry>,
    }

    #[derive(Debug, Default)]
    pub struct SendMessageBatchResultEntry {
        pub id: String,
        pub message_id: String,
        pub md5_of_message_body: String,
        pub md5_of_message_attributes: Option<String>,
        pub md5_of_message_system_attributes: Option<String>,
        pub sequence_number: Option<String>,
    }

    /// A failed batch entry. `code` is an [`ErrorCode`] number (SQS sends the code string; the
    /// SDK renders it with [`ErrorCode::as_sqs_code`]).
    #[derive(Debug, Default)]
    pub struct BatchResultErrorEntry {
        pub id: String,
        pub sender_fault: bool,
        pub code: u16,
        pub message: Option<String>,
    }

    #[derive(Debug, Default)]
    pub struct ReceiveMessageRequest {
        pub queue_url: String,
        /// 1-10; `None` = 1.
        pub max_number_of_messages: Option<u32>,
        /// 0-43 200 s; `None` = the queue's VisibilityTimeout.
        pub visibility_timeout: Option<u32>,
        /// 0-20 s of long polling; `None` = the queue's ReceiveMessageWaitTimeSeconds.
        pub wait_time_seconds: Option<u32>,
        /// System attributes to return (`SentTimestamp`, `ApproximateReceiveCount`, …, `All`).
        /// SQS's deprecated `AttributeNames` is folded into this.
        pub message_system_attribute_names: Vec<String>,
        /// Message attributes to return: names, `prefix.*`, or `All`/`.*`.
        pub message_attribute_names: Vec<String>,
        /// FIFO: retry token, ≤ 128 characters.
        pub receive_request_attempt_id: Option<String>,
    }

    #[derive(Debug, Default)]
    pub struct ReceiveMessageResult {
        #[cfg_attr(test, proptest(strategy = "proptest::collection::vec(proptest::prelude::any::<Message>(), 0..=BATCH_ENTRIES_TEST_MAX)"))]
        pub messages: Vec<Message>,
    }

    /// One received message, as SQS's `Message`.
    #[derive(Debug, Default)]
    pub struct Message {
        pub message_id: String,
        pub receipt_handle: String,
        pub md5_of_body: String,
        pub body: String,
        /// Requested system attributes by SQS name, values as SQS strings (epoch ms, counts).
        pub attributes: AttributeMap,
        pub md5_of_message_attributes: Option<String>,
        pub message_attributes: MessageAttributeMap,
    }

    #[derive(Debug, Default)]
    pub struct DeleteMessageRequest {
        pub queue_url: String,
        pub receipt_handle: String,
    }

    #[derive(Debug, Default)]
    pub struct DeleteMessageResult {}

    #[derive(Debug, Default)]
    pub struct DeleteMessageBatchRequest {
        pub queue_url: String,
        #[cfg_attr(test, proptest(strategy = "proptest::collection::vec(proptest::prelude::any::<DeleteMessageBatchRequestEntry>(), 0..=BATCH_ENTRIES_TEST_MAX)"))]
        pub entries: Vec<DeleteMessageBatchRequestEntry>,
    }

    #[derive(Debug, Default)]
    pub struct DeleteMessageBatchRequestEntry {
        pub id: String,
        pub receipt_handle: String,
    }

    #[derive(Debug, Default)]
    pub struct DeleteMessageBatchResult {
        /// Ids of the entries that succeeded.
        #[cfg_attr(test, proptest(strategy = "proptest::collection::vec(proptest::prelude::any::<BatchResultEntry>(), 0..=BATCH_ENTRIES_TEST_MAX)"))]
        pub successful: Vec<BatchResultEntry>,
        #[cfg_attr(test, proptest(strategy = "proptest::collection::vec(proptest::prelude::any::<BatchResultErrorEntry>(), 0..=BATCH_ENTRIES_TEST_MAX)"))]
        pub failed: Vec<BatchResultErrorEntry>,
    }

    /// A succeeded batch entry that returns nothing but its id (Delete/ChangeVisibility batches).
    #[derive(Debug, Default)]
    pub struct BatchResultEntry {
        pub id: String,
    }

    #[derive(Debug, Default)]
    pub struct ChangeMessageVisibilityRequest {
        pub queue_url: String,
        pub receipt_handle: String,
        /// 0-43 200 s from now.
        pub visibility_timeout: u32,
    }

    #[derive(Debug, Default)]
    pub struct ChangeMessageVisibilityResult {}

    #[derive(Debug, Default)]
    pub struct ChangeMessageVisibilityBatchRequest {
        pub queue_url: String,
        #[cfg_attr(test, proptest(strategy = "proptest::collection::vec(proptest::prelude::any::<ChangeMessageVisibilityBatchRequestEntry>(), 0..=BATCH_ENTRIES_TEST_MAX)"))]
        pub entries: Vec<ChangeMessageVisibilityBatchRequestEntry>,
    }

    #[derive(Debug, Default)]
    pub struct ChangeMessageVisibilityBatchRequestEntry {
        pub id: String,
        pub receipt_handle: String,
        /// SQS makes this optional per entry; `None` is InvalidParameterValue at the broker, as
        /// in SQS.
        pub visibility_timeout: Option<u32>,
    }

    #[derive(Debug, Default)]
    pub struct ChangeMessageVisibilityBatchResult {
        #[cfg_attr(test, proptest(strategy = "proptest::collection::vec(proptest::prelude::any::<BatchResultEntry>(), 0..=BATCH_ENTRIES_TEST_MAX)"))]
        pub successful: Vec<BatchResultEntry>,
        #[cfg_attr(test, proptest(strategy = "proptest::collection::vec(proptest::prelude::any::<BatchResultErrorEntry>(), 0..=BATCH_ENTRIES_TEST_MAX)"))]
        pub failed: Vec<BatchResultErrorEntry>,
    }
}

impl Default for AttributeValue {
    fn default() -> Self {
        AttributeValue::String(String::new())
    }
}

impl std::fmt::Debug for Hello {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hello")
            .field("versions", &self.versions)
            .field("client_name", &self.client_name)
            .field("client_version", &self.client_version)
            // Credentials never reach logs.
            .field(
                "auth_token",
                &self.auth_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl VersionRange {
    pub fn contains(&self, version: u16) -> bool {
        self.min <= version && version <= self.max
    }
}

impl ErrorResponse {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorResponse {
            code: code.as_u16(),
            message: message.into(),
            supported_versions: None,
        }
    }

    /// The code, `Unknown` if this build does not know it.
    pub fn error_code(&self) -> ErrorCode {
        ErrorCode::from_u16(self.code)
    }
}

impl BatchResultErrorEntry {
    pub fn new(id: impl Into<String>, code: ErrorCode, message: Option<String>) -> Self {
        BatchResultErrorEntry {
            id: id.into(),
            sender_fault: code.is_sender_fault(),
            code: code.as_u16(),
            message,
        }
    }

    pub fn error_code(&self) -> ErrorCode {
        ErrorCode::from_u16(self.code)
    }
}

impl MoveTaskStatus {
    /// SQS's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            MoveTaskStatus::Running => "RUNNING",
            MoveTaskStatus::Completed => "COMPLETED",
            MoveTaskStatus::Cancelling => "CANCELLING",
            MoveTaskStatus::Cancelled => "CANCELLED",
            MoveTaskStatus::Failed => "FAILED",
        }
    }
}

wire_types! {
    // ---- Streams ----------------------------------------------------------------------------
    //
    // Topics are named per account like queues, by name (no URL: they have no SQS face).
    // Records travel in the record-batch format (`crate::batch`): the
    // producer encodes and checksums a batch once, the broker verifies and stores those bytes,
    // and fetch returns whole stored batches, concatenated.

    #[derive(Debug, Default)]
    pub struct CreateTopicRequest {
        pub name: String,
        pub partitions: u32,
        pub retention_ms: Option<u64>,
        pub retention_bytes: Option<u64>,
        pub segment_bytes: Option<u64>,
    }

    #[derive(Debug, Default)]
    pub struct CreateTopicResult {
        pub name: String,
        pub partitions: u32,
    }

    #[derive(Debug, Default)]
    pub struct DeleteTopicRequest {
        pub name: String,
    }

    #[derive(Debug, Default)]
    pub struct DeleteTopicResult {}

    #[derive(Debug, Default)]
    pub struct DescribeTopicRequest {
        pub name: String,
    }

    #[derive(Debug, Default)]
    pub struct DescribeTopicResult {
        pub name: String,
        pub partitions: u32,
        pub retention_ms: Option<u64>,
        pub retention_bytes: Option<u64>,
    }

    /// One record batch. `partition: None`: the first record's key's partition
    /// (`xxh3(key) % partitions`), or round robin for a keyless batch.
    #[derive(Debug, Default)]
    pub struct ProduceRequest {
        pub topic: String,
        pub partition: Option<u32>,
        pub batch: Vec<u8>,
    }

    /// Answered after the batch's fdatasync.
    #[derive(Debug, Default)]
    pub struct ProduceResult {
        pub partition: u32,
        pub base_offset: u64,
        pub last_offset: u64,
    }

    #[derive(Debug, Default)]
    pub struct FetchRequest {
        pub topic: String,
        pub partition: u32,
        pub offset: u64,
        pub max_bytes: u32,
        pub max_records: u32,
        /// Wait up to this long for data if there is none at `offset`.
        pub wait_ms: u32,
    }

    /// Whole stored batches, concatenated; the first may start before the requested offset.
    #[derive(Debug, Default)]
    pub struct FetchResult {
        pub batches: Vec<u8>,
        pub start_offset: u64,
        pub end_offset: u64,
    }

    /// `spec`: 0 earliest, 1 latest, 2 the first offset with a timestamp >= `timestamp_ms`.
    #[derive(Debug, Default)]
    pub struct ListOffsetsRequest {
        pub topic: String,
        pub partition: u32,
        pub spec: u8,
        pub timestamp_ms: i64,
    }

    #[derive(Debug, Default)]
    pub struct ListOffsetsResult {
        pub offset: u64,
    }

    #[derive(Debug, Default)]
    pub struct TopicPartitionEntry {
        pub topic: String,
        pub partition: u32,
    }

    #[derive(Debug, Default)]
    pub struct JoinGroupRequest {
        pub group: String,
        pub member_id: Option<String>,
        pub topics: Vec<String>,
        pub session_timeout_ms: u64,
    }

    #[derive(Debug, Default)]
    pub struct JoinGroupResult {
        pub member_id: String,
        pub generation: u64,
        pub assignment: Vec<TopicPartitionEntry>,
    }

    #[derive(Debug, Default)]
    pub struct HeartbeatRequest {
        pub group: String,
        pub member_id: String,
    }

    /// The current generation and the member's partitions in it.
    #[derive(Debug, Default)]
    pub struct HeartbeatResult {
        pub generation: u64,
        pub assignment: Vec<TopicPartitionEntry>,
    }

    #[derive(Debug, Default)]
    pub struct LeaveGroupRequest {
        pub group: String,
        pub member_id: String,
    }

    #[derive(Debug, Default)]
    pub struct LeaveGroupResult {}

    /// `offset` is the next offset to read.
    #[derive(Debug, Default)]
    pub struct OffsetEntry {
        pub topic: String,
        pub partition: u32,
        pub offset: u64,
    }

    #[derive(Debug, Default)]
    pub struct CommitOffsetsRequest {
        pub group: String,
        pub member_id: String,
        pub generation: u64,
        pub offsets: Vec<OffsetEntry>,
    }

    #[derive(Debug, Default)]
    pub struct CommitOffsetsResult {}

    #[derive(Debug, Default)]
    pub struct FetchCommittedRequest {
        pub group: String,
    }

    #[derive(Debug, Default)]
    pub struct FetchCommittedResult {
        pub offsets: Vec<OffsetEntry>,
    }

    /// Per partition a group committed on: latest offset minus committed (for operators).
    #[derive(Debug, Default)]
    pub struct GroupLagRequest {
        pub group: String,
    }

    #[derive(Debug, Default)]
    pub struct PartitionLagEntry {
        pub topic: String,
        pub partition: u32,
        pub committed: u64,
        pub latest: u64,
        pub lag: u64,
    }

    #[derive(Debug, Default)]
    pub struct GroupLagResult {
        pub partitions: Vec<PartitionLagEntry>,
    }

    // Operators' listings (the `sluice topic` and `sluice group` commands).

    /// The account's topics, in name order.
    #[derive(Debug, Default)]
    pub struct ListTopicsRequest {}

    #[derive(Debug, Default)]
    pub struct ListTopicsResult {
        pub topics: Vec<DescribeTopicResult>,
    }

    /// The account's consumer groups, in name order.
    #[derive(Debug, Default)]
    pub struct ListGroupsRequest {}

    #[derive(Debug, Default)]
    pub struct ListGroupsResult {
        pub groups: Vec<String>,
    }

    /// A group's generation and members with their assigned partitions (`UnknownGroup`-style
    /// answers are `found: false`, so that a group with commits but no members still shows).
    #[derive(Debug, Default)]
    pub struct DescribeGroupRequest {
        pub group: String,
    }

    #[derive(Debug, Default)]
    pub struct GroupMemberEntry {
        pub member_id: String,
        pub assignment: Vec<TopicPartitionEntry>,
    }

    #[derive(Debug, Default)]
    pub struct DescribeGroupResult {
        pub found: bool,
        pub generation: u64,
        pub members: Vec<GroupMemberEntry>,
    }
}
