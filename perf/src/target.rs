//! What the load generator drives: one system under test (Sluice over QUIC, Sluice over HTTP,
//! or a peer broker), seen as queues and topics. The generator only ever talks to a [`Target`]
//! and its [`Conn`]s, so every scenario runs unchanged against Sluice and each peer, and every
//! figure carries the target's own statement of its durability.
//!
//! The futures are boxed and not `Send`: the generator runs its producers and consumers as
//! local tasks, and adapters may hold `Rc`s.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// A boxed, non-`Send` future returning a `Result` with a printable error.
pub type BoxFut<'a, T> = Pin<Box<dyn Future<Output = Result<T, TargetError>> + 'a>>;

/// An adapter's failure, as text (the generator counts and reports errors; it does not branch
/// on their kind).
#[derive(Debug, Clone)]
pub struct TargetError(pub String);

impl std::fmt::Display for TargetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TargetError {}

impl TargetError {
    pub fn new(e: impl std::fmt::Display) -> Self {
        TargetError(e.to_string())
    }
}

/// What a scenario reads and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// A standard queue: competing consumers, each message acknowledged (deleted) once.
    Standard,
    /// A FIFO queue whose messages spread over `groups` message groups.
    Fifo { groups: u32 },
    /// A topic (an append-only log) with `partitions` partitions, read by `groups` independent
    /// consumer groups (fan-out: each group sees every record).
    Topic { partitions: u32, groups: u32 },
}

/// One message to send. `group` is the FIFO message group or the topic key.
#[derive(Debug, Clone)]
pub struct OutMsg {
    pub body: Vec<u8>,
    pub group: Option<String>,
}

/// One message received, with whatever the target needs to acknowledge it.
#[derive(Debug, Clone)]
pub struct InMsg {
    pub body: bytes::Bytes,
    pub ack: AckToken,
}

/// How a received message is acknowledged (a receipt handle, a delivery tag, a stream id,
/// an offset...). Opaque to the generator.
#[derive(Debug, Clone)]
pub enum AckToken {
    Text(String),
    Number(u64),
    Bytes(Vec<u8>),
    /// Nothing to acknowledge per message (e.g. a topic consumer commits offsets itself).
    None,
}

/// A system under test. Created once per run; hands out connections.
pub trait Target {
    /// A short name for reports: "sluice-quic", "nats-jetstream", "rabbitmq-quorum", ...
    fn name(&self) -> String;
    /// The durability every acknowledged send had, in words, e.g. "fdatasync before every ack"
    /// or "no fsync (acks from memory)". Printed beside every figure.
    fn fsync_policy(&self) -> String;
    /// Whether this target can run the shape at all (peers that have no FIFO groups say no, and
    /// the scenario is reported as skipped for them).
    fn supports(&self, shape: &Shape) -> bool;
    /// Whether a `receive` is a request the broker answers (Sluice, Redis) rather than a read
    /// of messages the broker pushed to this client ahead of time (a prefetching consumer):
    /// only then does the round-trip mode time something, and only then can a message that
    /// one connection was sent be received on another.
    fn receive_is_a_request(&self) -> bool {
        true
    }
    /// Where the server's CPU time can be read, if this run can see its server (one it
    /// started: the in-process broker or a peer).
    fn cpu_meter(&self) -> Option<crate::cpu::CpuMeter> {
        None
    }
    /// Creates (or recreates empty) the queue or topic named `name` with this shape, and for
    /// topics its consumer groups `0..groups`.
    fn setup<'a>(&'a self, name: &'a str, shape: &'a Shape) -> BoxFut<'a, ()>;
    /// Deletes what `setup` created.
    fn teardown<'a>(&'a self, name: &'a str, shape: &'a Shape) -> BoxFut<'a, ()>;
    /// Opens one client connection. A scenario opens as many as it names.
    fn connect(&self) -> BoxFut<'_, Box<dyn Conn>>;
}

/// One client connection to a target. Producers call `send`; consumers call `receive` and
/// then `ack` with the tokens of what they received.
pub trait Conn {
    /// Sends a batch; returns once every message of it is acknowledged by the target under its
    /// stated durability.
    fn send<'a>(&'a self, name: &'a str, msgs: &'a [OutMsg]) -> BoxFut<'a, ()>;
    /// Receives up to `max` messages, waiting up to `wait` for the first. `group` is the
    /// consumer group index for topics (0 for queues).
    fn receive<'a>(
        &'a self,
        name: &'a str,
        group: u32,
        max: usize,
        wait: Duration,
    ) -> BoxFut<'a, Vec<InMsg>>;
    /// Acknowledges (deletes, acks, commits) what `receive` returned.
    fn ack<'a>(&'a self, name: &'a str, group: u32, acks: Vec<AckToken>) -> BoxFut<'a, ()>;
}
