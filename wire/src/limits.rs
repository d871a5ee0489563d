//! SQS's limits, one home each: the broker's front ends and queue engine, the SDK and the CLI
//! all import them from here (every one of them depends on `wire`), so a limit changes once.
//! Values are SQS's (the API model's ranges and the service's documented quotas).

/// One message (body and attributes), 1 MiB.
pub const MESSAGE_BYTES_MAX: usize = 1_048_576;
/// A whole SendMessageBatch (the bodies and attributes of all its entries): also 1 MiB.
pub const BATCH_PAYLOAD_BYTES_MAX: usize = MESSAGE_BYTES_MAX;
/// Entries in one batch request (SendMessageBatch, DeleteMessageBatch,
/// ChangeMessageVisibilityBatch).
pub const BATCH_ENTRIES_MAX: usize = 10;
/// A batch entry id: 1-80 characters.
pub const BATCH_ENTRY_ID_LEN_MAX: usize = 80;
/// MaxNumberOfMessages of a ReceiveMessage: 1-10.
pub const RECEIVE_MESSAGES_MAX: u32 = 10;
/// ListQueues without MaxResults returns at most this many queues.
pub const LIST_QUEUES_DEFAULT_MAX: usize = 1_000;
