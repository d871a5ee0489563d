//! The load: client tasks on the native SDK sending to a standard and a FIFO queue (groups and
//! deduplication ids), receiving with a short visibility timeout and deleting — every call
//! recorded in the checker's history with its start, end and outcome — and the final drain.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_checker::{Call, Delivered, Outcome, Recorder, Reply};
use sluice_sdk::types::{AttributeMap, Message, SendMessageRequest, TagMap};
use sluice_sdk::{Client, ClientOptions, Error, ReceiveOptions, Trust};

pub const STANDARD_QUEUE: &str = "chaos-std";
pub const FIFO_QUEUE: &str = "chaos-fifo.fifo";
/// The load's leases: short, so that undeleted messages come back within a round.
pub const VISIBILITY_TIMEOUT_S: u32 = 2;
/// The drain's leases: long, so nothing it received comes back while it drains.
const DRAIN_VISIBILITY_TIMEOUT_S: u32 = 30;
/// A call with no answer by then is indeterminate. Shorter than most pauses, so a pause shows
/// up as timeouts.
pub const REQUEST_TIMEOUT_MS: u64 = 2_000;
const CONNECT_TIMEOUT_MS: u64 = 1_000;
/// Between attempts while the broker is down or a connect fails.
const RETRY_SLEEP_MS: u64 = 50;
const FIFO_GROUPS: u32 = 4;
const RECEIVE_MAX: u32 = 5;
const DRAIN_RECEIVE_MAX: u32 = 10;
const DRAIN_WAIT_S: u32 = 1;
/// The drain gives up after this long (the checker then says undecided, not pass).
pub const DRAIN_TIMEOUT_MS: u64 = 120_000;
/// A drain delete that keeps failing is given up (the message then shows as lost, a finding).
const DRAIN_DELETE_ATTEMPTS_MAX: u32 = 50;
/// Percent of received messages the load deletes; the rest expire and are delivered again.
const DELETE_PERCENT: u32 = 85;

/// One call as the report sees it.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub kind: &'static str,
    pub start_us: u64,
    pub end_us: u64,
    pub outcome: Outcome,
}

/// Where the broker is now (`None` while it is down).
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: SocketAddr,
    pub cert: PathBuf,
    pub standard_url: String,
    pub fifo_url: String,
}

/// What the client tasks share with the campaign.
pub struct Shared {
    start: Instant,
    recorder: Recorder<BufWriter<File>>,
    samples: Mutex<Vec<Sample>>,
    pub target: RwLock<Option<Target>>,
    pub stop: AtomicBool,
    next_payload: AtomicU64,
    error: Mutex<Option<String>>,
    /// Bumped whenever the broker goes down or comes back at a new address: calls in flight
    /// give up then (as `info`) instead of waiting out their timeout on a dead connection, so
    /// that the recovery time measures the broker, not the clients' timeouts.
    moved: tokio::sync::watch::Sender<u64>,
}

impl Shared {
    pub fn new(history: File) -> Shared {
        Shared {
            start: Instant::now(),
            recorder: Recorder::new(BufWriter::new(history), 1),
            samples: Mutex::new(Vec::new()),
            target: RwLock::new(None),
            stop: AtomicBool::new(false),
            next_payload: AtomicU64::new(1),
            error: Mutex::new(None),
            moved: tokio::sync::watch::Sender::new(0),
        }
    }

    /// The run's one monotonic clock, in microseconds since the campaign started.
    pub fn now_us(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn fail(&self, why: String) {
        self.stop.store(true, Ordering::SeqCst);
        if let Ok(mut e) = self.error.lock() {
            e.get_or_insert(why);
        }
    }

    /// The first recording error, if any: the history is then incomplete.
    pub fn error(&self) -> Option<String> {
        self.error.lock().ok().and_then(|e| e.clone())
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub fn target(&self) -> Option<Target> {
        self.target.read().ok().and_then(|t| t.clone())
    }

    pub fn set_target(&self, target: Option<Target>) {
        if let Ok(mut t) = self.target.write() {
            *t = target;
        }
        self.moved.send_modify(|g| *g += 1);
    }

    /// Runs an SDK call, giving up (an indeterminate outcome) if the broker moves meanwhile.
    async fn until_moved<T>(
        &self,
        call: impl std::future::Future<Output = sluice_sdk::Result<T>>,
    ) -> sluice_sdk::Result<T> {
        let mut moved = self.moved.subscribe();
        tokio::select! {
            r = call => r,
            _ = moved.changed() => Err(Error::ConnectionLost(
                "the broker was killed or restarted; the client gave up".into(),
            )),
        }
    }

    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn mark_drain(&self) {
        if let Err(e) = self.recorder.drain(self.now_us()) {
            self.fail(format!("recording the drain: {e}"));
        }
    }

    fn invoke(&self, process: &str, call: Call) -> Option<(u64, u64)> {
        let t = self.now_us();
        match self.recorder.invoke(process, call, t) {
            Ok(op) => Some((op, t)),
            Err(e) => {
                self.fail(format!("recording an invoke: {e}"));
                None
            }
        }
    }

    fn complete(
        &self,
        kind: &'static str,
        (op, start_us): (u64, u64),
        outcome: Outcome,
        result: Option<Reply>,
        error: Option<String>,
    ) {
        let end_us = self.now_us();
        if let Err(e) = self.recorder.complete(op, end_us, outcome, result, error) {
            self.fail(format!("recording a completion: {e}"));
        }
        if let Ok(mut s) = self.samples.lock() {
            s.push(Sample {
                kind,
                start_us,
                end_us,
                outcome,
            });
        }
    }
}

/// Takes the recorder's writer back and flushes it: the end of the history.
pub fn finish(shared: Shared) -> Result<(), crate::ChaosError> {
    shared
        .recorder
        .into_inner()
        .map_err(|e| crate::ChaosError::Record(e.to_string()))?;
    Ok(())
}

/// How a failed call is recorded: `fail` only when it certainly did not happen (never sent, or
/// refused by the broker with a non-retryable code); everything else may have happened.
pub fn outcome_of(e: &Error) -> Outcome {
    match e {
        Error::Connect(_) | Error::InvalidRequest(_) | Error::Tls(_) => Outcome::Fail,
        Error::UnsupportedVersion { .. } => Outcome::Fail,
        Error::Service { code, .. } if !code.is_retryable() => Outcome::Fail,
        _ => Outcome::Info,
    }
}

fn client_options(cert: &std::path::Path, name: &str) -> ClientOptions {
    ClientOptions {
        connect_timeout: Duration::from_millis(CONNECT_TIMEOUT_MS),
        request_timeout: Duration::from_millis(REQUEST_TIMEOUT_MS),
        // No hidden retries: every attempt is one recorded call.
        retries: 0,
        streams: 1,
        // One connection, no routing to a core's own endpoint (whose fallback re-sends).
        route_to_owner: false,
        client_name: name.to_string(),
        ..ClientOptions::new(Trust::PemFile(cert.to_path_buf()))
    }
}

/// Connects, re-reading the certificate (a power loss may make the broker write a new one).
pub async fn connect(addr: SocketAddr, cert: &std::path::Path, name: &str) -> Option<Client> {
    if !cert.exists() {
        return None;
    }
    Client::connect(addr, client_options(cert, name)).await.ok()
}

/// Creates the two queues (again: a no-op when they exist) and returns the target, retrying
/// until `timeout_ms`. Not recorded: the queues' attributes are the harness's, not load.
pub async fn setup(
    addr: SocketAddr,
    cert: PathBuf,
    timeout_ms: u64,
) -> Result<Target, crate::ChaosError> {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    let mut last = String::from("no certificate");
    while Instant::now() < deadline {
        if let Some(client) = connect(addr, &cert, "chaos-setup").await {
            let vt = VISIBILITY_TIMEOUT_S.to_string();
            let standard: AttributeMap = [("VisibilityTimeout".to_string(), vt.clone())]
                .into_iter()
                .collect();
            let fifo: AttributeMap = [
                ("VisibilityTimeout".to_string(), vt),
                ("FifoQueue".to_string(), "true".to_string()),
            ]
            .into_iter()
            .collect();
            let s = client
                .create_queue_with(STANDARD_QUEUE, standard, TagMap::new())
                .await;
            let f = client
                .create_queue_with(FIFO_QUEUE, fifo, TagMap::new())
                .await;
            client.close().await;
            match (s, f) {
                (Ok(standard_url), Ok(fifo_url)) => {
                    return Ok(Target {
                        addr,
                        cert,
                        standard_url,
                        fifo_url,
                    })
                }
                (Err(e), _) | (_, Err(e)) => last = e.to_string(),
            }
        }
        tokio::time::sleep(Duration::from_millis(RETRY_SLEEP_MS)).await;
    }
    Err(crate::ChaosError::Setup(last))
}

fn delivered(m: &Message) -> Delivered {
    Delivered {
        message_id: m.message_id.clone(),
        payload: m.body.clone(),
        receipt: m.receipt_handle.clone(),
        receive_count: m
            .attributes
            .get("ApproximateReceiveCount")
            .and_then(|c| c.parse().ok()),
        group: m.attributes.get("MessageGroupId").cloned(),
    }
}

/// One load client until `shared.stop`.
pub async fn client_task(shared: Arc<Shared>, index: usize, seed: u64) {
    let process = format!("client-{index}");
    let mut rng = SmallRng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9E37_79B9));
    let mut client: Option<(SocketAddr, Client)> = None;
    while !shared.stopped() {
        let Some(target) = shared.target() else {
            tokio::time::sleep(Duration::from_millis(RETRY_SLEEP_MS)).await;
            continue;
        };
        if client.as_ref().is_some_and(|(a, _)| *a != target.addr) {
            client = None;
        }
        let c = match &client {
            Some((_, c)) => c.clone(),
            None => match connect(target.addr, &target.cert, &process).await {
                Some(c) => {
                    client = Some((target.addr, c.clone()));
                    c
                }
                None => {
                    tokio::time::sleep(Duration::from_millis(RETRY_SLEEP_MS)).await;
                    continue;
                }
            },
        };
        let roll = rng.gen_range(0..100u32);
        if roll < 35 {
            send(&shared, &c, &process, &target, None).await;
        } else if roll < 60 {
            let group = format!("g{}", rng.gen_range(0..FIFO_GROUPS));
            send(&shared, &c, &process, &target, Some(group)).await;
        } else {
            let fifo = rng.gen_bool(0.5);
            let got = receive(
                &shared,
                &c,
                &process,
                &target,
                fifo,
                VISIBILITY_TIMEOUT_S,
                0,
            )
            .await;
            for m in got {
                if rng.gen_range(0..100u32) < DELETE_PERCENT {
                    delete(&shared, &c, &process, &target, fifo, &m).await;
                }
            }
        }
    }
    if let Some((_, c)) = client {
        c.close().await;
    }
}

fn queue_of(target: &Target, fifo: bool) -> (&'static str, &str) {
    match fifo {
        true => (FIFO_QUEUE, &target.fifo_url),
        false => (STANDARD_QUEUE, &target.standard_url),
    }
}

/// A send; a FIFO send whose outcome is unknown is retried once with the same payload and
/// deduplication id, as a client would (the broker must store it once).
async fn send(shared: &Shared, c: &Client, process: &str, target: &Target, group: Option<String>) {
    let n = shared.next_payload.fetch_add(1, Ordering::Relaxed);
    let payload = format!("p-{n}");
    let fifo = group.is_some();
    let (queue, url) = queue_of(target, fifo);
    let attempts = if fifo { 2 } else { 1 };
    for _ in 0..attempts {
        let call = Call::Send {
            queue: queue.to_string(),
            payload: payload.clone(),
            group: group.clone(),
            dedup: fifo.then(|| payload.clone()),
            content_dedup: false,
            dedup_per_group: false,
        };
        let Some(op) = shared.invoke(process, call) else {
            return;
        };
        let request = SendMessageRequest {
            queue_url: url.to_string(),
            message_body: payload.clone(),
            message_group_id: group.clone(),
            message_deduplication_id: fifo.then(|| payload.clone()),
            ..Default::default()
        };
        match shared.until_moved(c.send_message(request)).await {
            Ok(r) => {
                let reply = Reply::Send {
                    message_id: r.message_id,
                };
                shared.complete("send", op, Outcome::Ok, Some(reply), None);
                return;
            }
            Err(e) => {
                let outcome = outcome_of(&e);
                shared.complete("send", op, outcome, None, Some(e.to_string()));
                if outcome != Outcome::Info || shared.stopped() {
                    return;
                }
            }
        }
    }
}

async fn receive(
    shared: &Shared,
    c: &Client,
    process: &str,
    target: &Target,
    fifo: bool,
    visibility_timeout_s: u32,
    wait_s: u32,
) -> Vec<Message> {
    receive_recorded(
        shared,
        c,
        process,
        target,
        fifo,
        visibility_timeout_s,
        wait_s,
        None,
    )
    .await
    .unwrap_or_default()
}

/// The planted fault's choice: which of a receive's messages the history leaves out.
type Omit<'a> = dyn FnMut(&[Message]) -> Option<usize> + Send + 'a;

/// A recorded receive; `None` when it did not complete `ok`. `omit` (the planted fault) is
/// called on the messages and may remove one from what the history records.
#[allow(clippy::too_many_arguments)]
async fn receive_recorded(
    shared: &Shared,
    c: &Client,
    process: &str,
    target: &Target,
    fifo: bool,
    visibility_timeout_s: u32,
    wait_s: u32,
    omit: Option<&mut Omit<'_>>,
) -> Option<Vec<Message>> {
    let (queue, url) = queue_of(target, fifo);
    let call = Call::Receive {
        queue: queue.to_string(),
        visibility_timeout_ms: u64::from(visibility_timeout_s) * 1000,
    };
    let op = shared.invoke(process, call)?;
    let options = ReceiveOptions {
        max_messages: Some(if wait_s > 0 {
            DRAIN_RECEIVE_MAX
        } else {
            RECEIVE_MAX
        }),
        wait_time_seconds: Some(wait_s),
        visibility_timeout: Some(visibility_timeout_s),
        system_attribute_names: vec!["All".to_string()],
        ..Default::default()
    };
    match shared.until_moved(c.receive(url, options)).await {
        Ok(messages) => {
            let skip = omit.and_then(|f| f(&messages));
            let recorded = messages
                .iter()
                .enumerate()
                .filter(|(i, _)| Some(*i) != skip)
                .map(|(_, m)| delivered(m))
                .collect();
            let reply = Reply::Receive { messages: recorded };
            shared.complete("receive", op, Outcome::Ok, Some(reply), None);
            Some(messages)
        }
        Err(e) => {
            shared.complete("receive", op, outcome_of(&e), None, Some(e.to_string()));
            None
        }
    }
}

/// A recorded delete; true when it completed `ok`.
async fn delete(
    shared: &Shared,
    c: &Client,
    process: &str,
    target: &Target,
    fifo: bool,
    m: &Message,
) -> bool {
    let (queue, url) = queue_of(target, fifo);
    let call = Call::Delete {
        queue: queue.to_string(),
        message_id: m.message_id.clone(),
        receipt: Some(m.receipt_handle.clone()),
    };
    let Some(op) = shared.invoke(process, call) else {
        return false;
    };
    match shared.until_moved(c.delete(url, &m.receipt_handle)).await {
        Ok(()) => {
            shared.complete("delete", op, Outcome::Ok, Some(Reply::Delete {}), None);
            true
        }
        Err(e) => {
            shared.complete("delete", op, outcome_of(&e), None, Some(e.to_string()));
            false
        }
    }
}

/// The planted fault's message: an acknowledged send (recorded, from process `plant`) to the
/// standard queue after the load, so that only the drain receives it. `None` if no send was
/// acknowledged before `DRAIN_TIMEOUT_MS`.
pub async fn plant_send(shared: &Shared, target: &Target) -> Option<String> {
    let process = "plant";
    let deadline = Instant::now() + Duration::from_millis(DRAIN_TIMEOUT_MS);
    while Instant::now() < deadline {
        let Some(c) = connect(target.addr, &target.cert, process).await else {
            tokio::time::sleep(Duration::from_millis(RETRY_SLEEP_MS)).await;
            continue;
        };
        let n = shared.next_payload.fetch_add(1, Ordering::Relaxed);
        let payload = format!("p-{n}");
        let call = Call::Send {
            queue: STANDARD_QUEUE.to_string(),
            payload: payload.clone(),
            group: None,
            dedup: None,
            content_dedup: false,
            dedup_per_group: false,
        };
        let op = shared.invoke(process, call)?;
        let sent = c.send(&target.standard_url, &payload).await;
        c.close().await;
        match sent {
            Ok(r) => {
                let reply = Reply::Send {
                    message_id: r.message_id.clone(),
                };
                shared.complete("send", op, Outcome::Ok, Some(reply), None);
                return Some(r.message_id);
            }
            Err(e) => shared.complete("send", op, outcome_of(&e), None, Some(e.to_string())),
        }
        tokio::time::sleep(Duration::from_millis(RETRY_SLEEP_MS)).await;
    }
    None
}

/// What the drain did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Drained {
    /// Messages received (and deleted) per queue.
    pub received: BTreeMap<String, u64>,
    /// Whether each queue ended with an `ok` empty receive.
    pub finished: BTreeMap<String, bool>,
    /// The planted fault: the message the history does not show delivered.
    pub planted_lost: Option<String>,
}

/// The final drain: every queue received until a receive comes back empty, each message deleted
/// (retried until the delete is `ok`, so that its lease cannot hide another message).
/// `plant`: the id of a standard queue's message that the history is to not show delivered.
pub async fn drain(shared: &Shared, target: &Target, plant: Option<String>) -> Drained {
    let process = "drain";
    let deadline = Instant::now() + Duration::from_millis(DRAIN_TIMEOUT_MS);
    let mut out = Drained::default();
    let mut planted: Option<String> = None;
    for fifo in [false, true] {
        let (queue, _) = queue_of(target, fifo);
        out.finished.insert(queue.to_string(), false);
        let mut client: Option<Client> = None;
        while Instant::now() < deadline {
            let c = match &client {
                Some(c) => c.clone(),
                None => match connect(target.addr, &target.cert, process).await {
                    Some(c) => {
                        client = Some(c.clone());
                        c
                    }
                    None => {
                        tokio::time::sleep(Duration::from_millis(RETRY_SLEEP_MS)).await;
                        continue;
                    }
                },
            };
            let mut omit = |ms: &[Message]| -> Option<usize> {
                let id = plant.as_deref()?;
                if fifo || planted.is_some() {
                    return None;
                }
                let i = ms.iter().position(|m| m.message_id == id)?;
                planted = Some(ms[i].message_id.clone());
                Some(i)
            };
            let got = receive_recorded(
                shared,
                &c,
                process,
                target,
                fifo,
                DRAIN_VISIBILITY_TIMEOUT_S,
                DRAIN_WAIT_S,
                Some(&mut omit),
            )
            .await;
            let Some(got) = got else {
                tokio::time::sleep(Duration::from_millis(RETRY_SLEEP_MS)).await;
                continue;
            };
            if got.is_empty() {
                out.finished.insert(queue.to_string(), true);
                break;
            }
            *out.received.entry(queue.to_string()).or_default() += got.len() as u64;
            for m in &got {
                for _ in 0..DRAIN_DELETE_ATTEMPTS_MAX {
                    if delete(shared, &c, process, target, fifo, m).await {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(RETRY_SLEEP_MS)).await;
                }
            }
        }
        if let Some(c) = client {
            c.close().await;
        }
    }
    out.planted_lost = planted;
    out
}
