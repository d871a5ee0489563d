//! The Sluice Rust SDK: a client for Sluice's native protocol (frames of [`sluice_wire`] over
//! QUIC), with the operations of the SQS API.
//!
//! ```no_run
//! use sluice_sdk::{Client, ClientOptions, ReceiveOptions, Trust};
//!
//! # async fn demo() -> Result<(), sluice_sdk::Error> {
//! // A local broker started without a certificate generates one in its data dir: trust it.
//! let options = ClientOptions::new(Trust::PemFile("sluice-data/quic-selfsigned-cert.pem".into()));
//! let client = Client::connect("127.0.0.1:7400".parse().unwrap(), options).await?;
//!
//! let queue = client.create_queue("orders").await?;
//! client.send(&queue, "order #1").await?;
//! for m in client.receive(&queue, ReceiveOptions::long_poll(10, 20)).await? {
//!     println!("{}", m.body);
//!     client.delete(&queue, &m.receipt_handle).await?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! - **Queues** are named by their URL, as in SQS (`create_queue` and `get_queue_url` return
//!   it), so code ports from the AWS SDK unchanged and a URL works with the broker's HTTP API too.
//! - **Pipelining**: a [`Client`] is cheap to clone and safe to share between tasks; every
//!   call is one request frame on one of a few QUIC streams ([`ClientOptions::streams`]),
//!   many in flight at once, answers matched by request id. Beyond the broker's limit of
//!   requests in flight per connection (`HelloOk::in_flight_requests_max`), calls wait.
//! - **Errors** are one enum, [`Error`]; errors the broker answered carry its [`ErrorCode`]
//!   (with the SQS code: [`Error::sqs_code`]).
//! - **Timeouts and retries**: each call is bounded by [`ClientOptions::request_timeout`] (plus
//!   the long-poll wait of a receive); retryable failures ([`Error::is_retryable`]) are retried
//!   [`ClientOptions::retries`] times with exponential backoff, on a new connection when the old
//!   one was lost.
//! - **Durability**: a send returns once the broker has the message fsync'd.
//!
//! Helpers: [`Client::producer`] batches single sends into SendMessageBatch requests (linger
//! and size); [`Client::consume`] runs a handler per message with lease heartbeats and deletes
//! on success.
//!
//! Every request and response type of the protocol is re-exported in [`types`]; [`Client::call`]
//! sends any of them as is.

#![forbid(unsafe_code)]

mod connection;
mod consumer;
mod error;
pub mod leader;
mod producer;
mod publisher;
mod routing;
pub mod stream;
mod tls;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use consumer::ConsumeOptions;
pub use error::{Error, Result};
pub use producer::{OutgoingMessage, Producer, ProducerOptions};
pub use publisher::{PublishAck, Published, TopicPublisher, TopicPublisherOptions};
pub use sluice_wire::ErrorCode;
pub use stream::{
    ConsumedRecord, Fetched, GroupConsumer, GroupConsumerOptions, Seek, TopicProducer,
};
pub use tls::{ClientIdentity, Trust, ALPN};

/// The protocol's message types (SQS member names), as the broker sends and receives them.
pub mod types {
    pub use sluice_wire::messages::*;
    pub use sluice_wire::{Request, Response};
}

use connection::Connection;
use types::*;

/// How to connect and how to behave.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Whom to trust (there is no default: say what you trust).
    pub trust: Trust,
    /// A client certificate, for brokers that require mutual TLS.
    pub identity: Option<ClientIdentity>,
    /// The name the broker's certificate must carry. Default `localhost`.
    pub server_name: String,
    /// Streams per connection that requests are spread over. Default 4.
    pub streams: usize,
    /// Time to connect and complete the handshake. Default 10 s.
    pub connect_timeout: Duration,
    /// Time to wait for an answer (a receive adds its long-poll wait). Default 30 s.
    pub request_timeout: Duration,
    /// How often a retryable failure is retried. Default 2.
    pub retries: u32,
    /// First backoff before a retry; doubled each time. Default 50 ms.
    pub retry_backoff: Duration,
    /// Keep-alive interval, so that idle connections are not closed by the broker. Default 10 s.
    pub keep_alive: Duration,
    /// Reported to the broker in `Hello`.
    pub client_name: String,
    /// Send requests that name a partition (produce, fetch, a FIFO group's sends) straight to
    /// the broker core that owns it, over a connection to that core's own endpoint (saves a
    /// hop inside the broker), and every other request to this client's *home core*: one
    /// core per client, handed out round-robin to the clients of a process, so that the
    /// clients' work spreads evenly over the broker's cores instead of where the kernel's
    /// hash of their connections puts it. Default true; falls back to the shared connection
    /// when not possible.
    pub route_to_owner: bool,
    /// An access key and its secret, for brokers that require authentication (the same keys
    /// that sign SQS HTTP requests). Sent once per connection, inside TLS.
    pub credentials: Option<Credentials>,
    /// Bytes the broker may send on one stream ahead of what this client has read (QUIC
    /// flow control). Default [`sluice_wire::FRAME_BYTES_MAX`]: the largest answer fits in
    /// one window, so none waits for a window update while the client's thread is busy.
    /// quinn's own default is 1.25 MB; `sluice-perf fetch-probe` measured no difference for
    /// a lone 2 MB fetch.
    pub stream_receive_window: u32,
    /// The UDP socket's kernel buffers (`SO_RCVBUF` and `SO_SNDBUF`), bytes; 0 keeps the
    /// kernel's default. Default 4 MiB: a 2 MB fetch arrives faster than a busy client thread
    /// reads it, and with Linux's default (208 KiB) the kernel dropped ~0.2% of its packets,
    /// each loss halving QUIC's congestion window (ARCHITECTURE.md, "UDP buffers"). The
    /// kernel caps the request at `net.core.rmem_max` / `wmem_max`: a smaller buffer than
    /// asked is logged once per client as a warning.
    pub udp_buffer_bytes: usize,
}

/// An access key id and its secret. `Debug` never prints the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl Credentials {
    pub fn new(access_key_id: impl Into<String>, secret_access_key: impl Into<String>) -> Self {
        Credentials {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
        }
    }

    fn token(&self) -> String {
        format!("{}:{}", self.access_key_id, self.secret_access_key)
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

impl ClientOptions {
    pub fn new(trust: Trust) -> Self {
        ClientOptions {
            trust,
            identity: None,
            server_name: "localhost".into(),
            streams: 4,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            retries: 2,
            retry_backoff: Duration::from_millis(50),
            keep_alive: Duration::from_secs(10),
            client_name: "sluice-sdk".into(),
            credentials: None,
            route_to_owner: true,
            stream_receive_window: sluice_wire::FRAME_BYTES_MAX as u32,
            udp_buffer_bytes: 4 * 1024 * 1024,
        }
    }
}

/// Receive parameters; see [`ReceiveOptions::long_poll`].
#[derive(Clone, Debug, Default)]
pub struct ReceiveOptions {
    /// 1–10 (default 1).
    pub max_messages: Option<u32>,
    /// Long-poll wait, 0–20 s (default: the queue's `ReceiveMessageWaitTimeSeconds`).
    pub wait_time_seconds: Option<u32>,
    /// Visibility timeout of the received messages (default: the queue's).
    pub visibility_timeout: Option<u32>,
    /// System attributes to return (`All`, `SentTimestamp`, `ApproximateReceiveCount`, …).
    pub system_attribute_names: Vec<String>,
    /// Message attributes to return (`All`, names, `prefix.*`).
    pub message_attribute_names: Vec<String>,
}

impl ReceiveOptions {
    /// Up to `max_messages` messages, waiting up to `wait_time_seconds` for the first.
    pub fn long_poll(max_messages: u32, wait_time_seconds: u32) -> Self {
        ReceiveOptions {
            max_messages: Some(max_messages),
            wait_time_seconds: Some(wait_time_seconds),
            ..Default::default()
        }
    }
}

/// A connection to a Sluice broker. Clone it freely: clones share the connection.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    addr: SocketAddr,
    /// Every node this client was given (`addr` first): asked in turn while no leader is
    /// known (`leader`).
    nodes: Arc<Vec<SocketAddr>>,
    leaders: leader::Leaders,
    options: ClientOptions,
    endpoint: quinn::Endpoint,
    config: quinn::ClientConfig,
    connection: tokio::sync::Mutex<Option<Arc<Connection>>>,
    routes: tokio::sync::Mutex<routing::Routes>,
}

/// The client's UDP socket, bound to `bind`, its kernel buffers asked to be `buffer_bytes`
/// each way (0: the kernel's default). A buffer the kernel caps lower is a warning, not an
/// error: the client works, with more loss under large answers.
fn bind_socket(bind: SocketAddr, buffer_bytes: usize) -> std::io::Result<std::net::UdpSocket> {
    let socket = std::net::UdpSocket::bind(bind)?;
    if buffer_bytes == 0 {
        return Ok(socket);
    }
    let state = quinn::udp::UdpSocketState::new((&socket).into())?;
    // Linux reports twice what it granted (its own bookkeeping): `got` is compared as is.
    let check = |which: &str, asked: std::io::Result<()>, got: std::io::Result<usize>| {
        let got = got.unwrap_or(0);
        if asked.is_err() || got < buffer_bytes {
            tracing::warn!(
                buffer = which,
                asked = buffer_bytes,
                got,
                "the kernel gave the client's UDP socket a smaller buffer than asked: large \
                 answers may lose packets (raise the sysctl named)"
            );
        }
    };
    check(
        "SO_RCVBUF (net.core.rmem_max)",
        state.set_recv_buffer_size((&socket).into(), buffer_bytes),
        state.recv_buffer_size((&socket).into()),
    );
    check(
        "SO_SNDBUF (net.core.wmem_max)",
        state.set_send_buffer_size((&socket).into(), buffer_bytes),
        state.send_buffer_size((&socket).into()),
    );
    Ok(socket)
}

impl Client {
    /// Connects to the broker's QUIC address and negotiates the protocol version. Must be
    /// called within a tokio runtime.
    pub async fn connect(addr: SocketAddr, options: ClientOptions) -> Result<Client> {
        Client::connect_one(addr, options, Arc::new(vec![addr])).await
    }

    /// Connects to a cluster: to the first of `nodes` that answers (in order), remembering
    /// all of them. Requests for a partition that node does not lead follow the leader it
    /// names (see [`leader`]); the leader is remembered per queue.
    pub async fn connect_cluster(nodes: &[SocketAddr], options: ClientOptions) -> Result<Client> {
        let list = Arc::new(nodes.to_vec());
        let mut last = Error::Connect("no node addresses given".into());
        for &addr in nodes {
            match Client::connect_one(addr, options.clone(), list.clone()).await {
                Ok(c) => return Ok(c),
                Err(e) => {
                    tracing::debug!(%addr, error = %e, "sluice: node unreachable, trying the next");
                    last = e;
                }
            }
        }
        Err(last)
    }

    /// Connects to `addr`, one of `nodes`.
    async fn connect_one(
        addr: SocketAddr,
        options: ClientOptions,
        nodes: Arc<Vec<SocketAddr>>,
    ) -> Result<Client> {
        let mut config = tls::client_config(&options.trust, options.identity.as_ref())?;
        let mut transport = quinn::TransportConfig::default();
        let mut mtu = quinn::MtuDiscoveryConfig::default();
        mtu.upper_bound(sluice_wire::handshake::QUIC_UDP_PAYLOAD_UPPER_BOUND);
        transport
            .keep_alive_interval(Some(options.keep_alive))
            .stream_receive_window(quinn::VarInt::from_u32(options.stream_receive_window))
            .mtu_discovery_config(Some(mtu));
        config.transport_config(Arc::new(transport));
        let bind: SocketAddr = if addr.is_ipv6() {
            "[::]:0".parse().expect("literal")
        } else {
            "0.0.0.0:0".parse().expect("literal")
        };
        let socket = bind_socket(bind, options.udp_buffer_bytes)
            .map_err(|e| Error::Connect(format!("UDP socket: {e}")))?;
        let endpoint = quinn::Endpoint::new(
            quinn::EndpointConfig::default(),
            None,
            socket,
            Arc::new(quinn::TokioRuntime),
        )
        .map_err(|e| Error::Connect(e.to_string()))?;
        let client = Client {
            inner: Arc::new(Inner {
                addr,
                nodes,
                leaders: Default::default(),
                options,
                endpoint,
                config,
                connection: tokio::sync::Mutex::new(None),
                routes: tokio::sync::Mutex::new(Default::default()),
            }),
        };
        client.connection().await?;
        Ok(client)
    }

    /// What the broker said about itself and its limits at the last handshake.
    pub async fn server_info(&self) -> Result<HelloOk> {
        Ok(self.connection().await?.hello.clone())
    }

    /// Closes the connection. In-flight calls fail with [`Error::ConnectionLost`] (and are
    /// retried on a new connection if retries are left); later calls reconnect.
    pub async fn close(&self) {
        if let Some(c) = self.inner.connection.lock().await.take() {
            c.close();
        }
        // The connections to the broker's cores (routing) close too; they have none of their own.
        let routed = std::mem::take(&mut *self.inner.routes.lock().await);
        for c in routed.into_clients() {
            Box::pin(c.close()).await;
        }
        let nodes = std::mem::take(&mut *self.inner.leaders_nodes().await);
        for c in nodes.into_values() {
            Box::pin(c.close()).await;
        }
        // Let the close frame reach the broker instead of leaving it to the idle timeout.
        let _ = tokio::time::timeout(Duration::from_secs(1), self.inner.endpoint.wait_idle()).await;
    }

    /// The current connection, or a new one if there is none or it broke.
    async fn connection(&self) -> Result<Arc<Connection>> {
        let mut slot = self.inner.connection.lock().await;
        if let Some(c) = slot.as_ref() {
            if !c.is_broken() {
                return Ok(c.clone());
            }
        }
        let o = &self.inner.options;
        let hello = Hello {
            versions: sluice_wire::supported_versions(),
            client_name: o.client_name.clone(),
            client_version: env!("CARGO_PKG_VERSION").into(),
            auth_token: o.credentials.as_ref().map(Credentials::token),
        };
        let c = tokio::time::timeout(
            o.connect_timeout,
            Connection::open(
                &self.inner.endpoint,
                self.inner.config.clone(),
                self.inner.addr,
                &o.server_name,
                hello,
                o.streams,
            ),
        )
        .await
        .map_err(|_| Error::Connect(format!("no handshake within {:?}", o.connect_timeout)))??;
        let c = Arc::new(c);
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Sends any request and returns the broker's answer (an `Error` answer becomes
    /// [`Error::Service`]). Retries retryable failures.
    ///
    /// Requests that name no partition go to this client's home core over a connection to
    /// that core's own endpoint (see [`ClientOptions::route_to_owner`]); when that connection
    /// cannot be made or breaks, the call is made again on the shared connection (a send whose
    /// answer was lost may then be stored twice, as with any retry: at-least-once).
    pub async fn call(&self, request: Request) -> Result<Response> {
        self.call_reply(request)
            .await
            .map(connection::Reply::into_response)
    }

    /// [`Client::call`], the answer as the reader decoded it (a fetch's batches still in their
    /// frame).
    pub(crate) async fn call_reply(&self, request: Request) -> Result<connection::Reply> {
        self.call_following(&request).await
    }

    /// [`Client::call_reply`] on this node, without following leaders.
    pub(crate) async fn call_routed(&self, request: &Request) -> Result<connection::Reply> {
        if routing::goes_home(request) {
            if let Some(home) = self.home().await {
                match home.call_reply_here(request).await {
                    Err(e @ (Error::Connect(_) | Error::ConnectionLost(_))) => {
                        tracing::debug!(error = %e, "sluice: home core lost, using the shared connection");
                        self.pause_routing().await;
                    }
                    other => return other,
                }
            }
        }
        self.call_reply_here(request).await
    }

    /// [`Client::call`] on this client's own connection (no routing).
    pub(crate) async fn call_reply_here(&self, request: &Request) -> Result<connection::Reply> {
        let timeout = self.inner.options.request_timeout
            + match &request {
                Request::ReceiveMessage(r) => {
                    Duration::from_secs(u64::from(r.wait_time_seconds.unwrap_or(20)))
                }
                Request::Fetch(r) => Duration::from_millis(u64::from(r.wait_ms)),
                _ => Duration::ZERO,
            };
        let mut backoff = self.inner.options.retry_backoff;
        let mut attempt = 0;
        loop {
            let result = match self.connection().await {
                Ok(c) => c.call(request, timeout).await,
                Err(e) => Err(e),
            };
            match result {
                // NotLeader is followed by the caller (`leader`), not resent here.
                Err(e)
                    if e.is_retryable()
                        && !matches!(e, Error::NotLeader { .. })
                        && attempt < self.inner.options.retries =>
                {
                    tracing::debug!(error = %e, attempt, "sluice: retrying");
                    attempt += 1;
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
                other => return other,
            }
        }
    }

    /// A batching producer for `queue_url` (see [`Producer`]).
    pub fn producer(&self, queue_url: &str, options: ProducerOptions) -> Producer {
        Producer::start(self.clone(), queue_url.to_string(), options)
    }

    // ---- Queues -------------------------------------------------------------------------

    /// Creates a queue (or returns the URL of an identical existing one). Names ending in
    /// `.fifo` need `FifoQueue=true` in [`Client::create_queue_with`].
    pub async fn create_queue(&self, name: &str) -> Result<String> {
        self.create_queue_with(name, AttributeMap::new(), TagMap::new())
            .await
    }

    /// Creates a queue with SQS attributes (`VisibilityTimeout`, `FifoQueue`, `RedrivePolicy`,
    /// …) and tags.
    pub async fn create_queue_with(
        &self,
        name: &str,
        attributes: AttributeMap,
        tags: TagMap,
    ) -> Result<String> {
        let r = CreateQueueRequest {
            queue_name: name.into(),
            attributes,
            tags,
        };
        match self.call(Request::CreateQueue(r)).await? {
            Response::CreateQueue(r) => Ok(r.queue_url),
            other => unexpected(other),
        }
    }

    pub async fn get_queue_url(&self, name: &str) -> Result<String> {
        let r = GetQueueUrlRequest {
            queue_name: name.into(),
            queue_owner_aws_account_id: None,
        };
        match self.call(Request::GetQueueUrl(r)).await? {
            Response::GetQueueUrl(r) => Ok(r.queue_url),
            other => unexpected(other),
        }
    }

    /// URLs of the queues whose names start with `prefix` (all pages).
    pub async fn list_queues(&self, prefix: &str) -> Result<Vec<String>> {
        let mut urls = Vec::new();
        let mut next_token = None;
        loop {
            let r = ListQueuesRequest {
                queue_name_prefix: (!prefix.is_empty()).then(|| prefix.to_string()),
                next_token: next_token.take(),
                max_results: Some(1000),
            };
            match self.call(Request::ListQueues(r)).await? {
                Response::ListQueues(r) => {
                    urls.extend(r.queue_urls);
                    match r.next_token {
                        Some(t) => next_token = Some(t),
                        None => return Ok(urls),
                    }
                }
                other => return unexpected(other),
            }
        }
    }

    pub async fn delete_queue(&self, queue_url: &str) -> Result<()> {
        let r = DeleteQueueRequest {
            queue_url: queue_url.into(),
        };
        match self.call(Request::DeleteQueue(r)).await? {
            Response::DeleteQueue(_) => Ok(()),
            other => unexpected(other),
        }
    }

    /// Queue attributes by SQS name; `names` may be `["All"]`.
    pub async fn get_queue_attributes(
        &self,
        queue_url: &str,
        names: &[&str],
    ) -> Result<AttributeMap> {
        let r = GetQueueAttributesRequest {
            queue_url: queue_url.into(),
            attribute_names: names.iter().map(|s| s.to_string()).collect(),
        };
        match self.call(Request::GetQueueAttributes(r)).await? {
            Response::GetQueueAttributes(r) => Ok(r.attributes),
            other => unexpected(other),
        }
    }

    pub async fn set_queue_attributes(
        &self,
        queue_url: &str,
        attributes: AttributeMap,
    ) -> Result<()> {
        let r = SetQueueAttributesRequest {
            queue_url: queue_url.into(),
            attributes,
        };
        match self.call(Request::SetQueueAttributes(r)).await? {
            Response::SetQueueAttributes(_) => Ok(()),
            other => unexpected(other),
        }
    }

    /// Deletes every message of the queue.
    pub async fn purge_queue(&self, queue_url: &str) -> Result<()> {
        let r = PurgeQueueRequest {
            queue_url: queue_url.into(),
        };
        match self.call(Request::PurgeQueue(r)).await? {
            Response::PurgeQueue(_) => Ok(()),
            other => unexpected(other),
        }
    }

    // ---- Messages -----------------------------------------------------------------------

    /// Sends one message with a body and nothing else; see [`Client::send_message`].
    pub async fn send(&self, queue_url: &str, body: &str) -> Result<SendMessageResult> {
        self.send_message(SendMessageRequest {
            queue_url: queue_url.into(),
            message_body: body.into(),
            ..Default::default()
        })
        .await
    }

    /// Sends one message (delay, attributes, FIFO group and deduplication ids). Returns once
    /// the broker has it durably.
    pub async fn send_message(&self, request: SendMessageRequest) -> Result<SendMessageResult> {
        let via = self
            .fifo_owner(&request.queue_url, request.message_group_id.as_deref())
            .await;
        match via.call(Request::SendMessage(request)).await? {
            Response::SendMessage(r) => Ok(r),
            other => unexpected(other),
        }
    }

    /// Sends up to 10 messages in one request. Entries fail one by one: check
    /// `result.failed` (each with its [`ErrorCode`]: `entry.error_code()`).
    pub async fn send_batch(
        &self,
        queue_url: &str,
        entries: Vec<SendMessageBatchRequestEntry>,
    ) -> Result<SendMessageBatchResult> {
        // A batch of one message group goes to the core owning the group's partition.
        let group = entries.first().and_then(|e| e.message_group_id.clone());
        let one_group = entries.iter().all(|e| e.message_group_id == group);
        let via = match one_group {
            true => self.fifo_owner(queue_url, group.as_deref()).await,
            false => self.clone(),
        };
        let r = SendMessageBatchRequest {
            queue_url: queue_url.into(),
            entries,
        };
        match via.call(Request::SendMessageBatch(r)).await? {
            Response::SendMessageBatch(r) => Ok(r),
            other => unexpected(other),
        }
    }

    /// Receives up to `options.max_messages` messages, long-polling up to
    /// `options.wait_time_seconds` for the first. Empty when none came in time.
    pub async fn receive(&self, queue_url: &str, options: ReceiveOptions) -> Result<Vec<Message>> {
        let r = ReceiveMessageRequest {
            queue_url: queue_url.into(),
            max_number_of_messages: options.max_messages,
            visibility_timeout: options.visibility_timeout,
            wait_time_seconds: options.wait_time_seconds,
            message_system_attribute_names: options.system_attribute_names,
            message_attribute_names: options.message_attribute_names,
            receive_request_attempt_id: None,
        };
        match self.call(Request::ReceiveMessage(r)).await? {
            Response::ReceiveMessage(r) => Ok(r.messages),
            other => unexpected(other),
        }
    }

    /// Deletes a received message by its receipt handle.
    pub async fn delete(&self, queue_url: &str, receipt_handle: &str) -> Result<()> {
        let r = DeleteMessageRequest {
            queue_url: queue_url.into(),
            receipt_handle: receipt_handle.into(),
        };
        match self.call(Request::DeleteMessage(r)).await? {
            Response::DeleteMessage(_) => Ok(()),
            other => unexpected(other),
        }
    }

    /// Deletes up to 10 messages; entry ids are `"0"`, `"1"`, … in the order of `receipt_handles`.
    pub async fn delete_batch(
        &self,
        queue_url: &str,
        receipt_handles: &[String],
    ) -> Result<DeleteMessageBatchResult> {
        let r = DeleteMessageBatchRequest {
            queue_url: queue_url.into(),
            entries: receipt_handles
                .iter()
                .enumerate()
                .map(|(i, h)| DeleteMessageBatchRequestEntry {
                    id: i.to_string(),
                    receipt_handle: h.clone(),
                })
                .collect(),
        };
        match self.call(Request::DeleteMessageBatch(r)).await? {
            Response::DeleteMessageBatch(r) => Ok(r),
            other => unexpected(other),
        }
    }

    /// Makes a received message visible again after `visibility_timeout` seconds from now (0:
    /// at once); a heartbeat for long work.
    pub async fn change_visibility(
        &self,
        queue_url: &str,
        receipt_handle: &str,
        visibility_timeout: u32,
    ) -> Result<()> {
        let r = ChangeMessageVisibilityRequest {
            queue_url: queue_url.into(),
            receipt_handle: receipt_handle.into(),
            visibility_timeout,
        };
        match self.call(Request::ChangeMessageVisibility(r)).await? {
            Response::ChangeMessageVisibility(_) => Ok(()),
            other => unexpected(other),
        }
    }

    /// Changes the visibility of up to 10 messages; entry ids as in [`Client::delete_batch`].
    pub async fn change_visibility_batch(
        &self,
        queue_url: &str,
        entries: &[(String, u32)],
    ) -> Result<ChangeMessageVisibilityBatchResult> {
        let r = ChangeMessageVisibilityBatchRequest {
            queue_url: queue_url.into(),
            entries: entries
                .iter()
                .enumerate()
                .map(|(i, (h, t))| ChangeMessageVisibilityBatchRequestEntry {
                    id: i.to_string(),
                    receipt_handle: h.clone(),
                    visibility_timeout: Some(*t),
                })
                .collect(),
        };
        match self.call(Request::ChangeMessageVisibilityBatch(r)).await? {
            Response::ChangeMessageVisibilityBatch(r) => Ok(r),
            other => unexpected(other),
        }
    }
}

pub(crate) fn unexpected<T>(r: Response) -> Result<T> {
    Err(Error::Protocol(format!("unexpected answer {:?}", r.kind())))
}

/// Attributes for [`Client::create_queue_with`] from `(name, value)` pairs.
///
/// ```
/// let attrs = sluice_sdk::attributes([("FifoQueue", "true"), ("VisibilityTimeout", "60")]);
/// assert_eq!(attrs["FifoQueue"], "true");
/// ```
pub fn attributes<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> AttributeMap {
    pairs
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect::<BTreeMap<_, _>>()
}

#[cfg(test)]
mod socket_tests {
    /// The client's socket gets the kernel buffers it asks for, up to the sysctl's cap (Linux
    /// reports twice what it grants).
    #[test]
    fn the_client_socket_asks_for_its_buffers() {
        let cap = |name: &str| -> usize {
            std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0)
        };
        let asked = 1024 * 1024;
        let socket =
            super::bind_socket("127.0.0.1:0".parse().expect("literal"), asked).expect("binds");
        let state = quinn::udp::UdpSocketState::new((&socket).into()).expect("state");
        let recv = state.recv_buffer_size((&socket).into()).expect("SO_RCVBUF");
        let send = state.send_buffer_size((&socket).into()).expect("SO_SNDBUF");
        assert!(recv >= asked.min(cap("rmem_max")), "SO_RCVBUF {recv}");
        assert!(send >= asked.min(cap("wmem_max")), "SO_SNDBUF {send}");
    }
}
