//! A seeded generator of valid histories: a tiny, correct simulated queue service (a standard
//! queue and a FIFO queue with deduplication) and stream (one topic, two partitions, one
//! consumer group), driven by concurrent clients whose calls overlap, time out (`info`: applied or
//! not), are refused (`fail`) or never complete (the client dies), then a final drain.
//!
//! With a [`AnomalyKind`] to plant, the simulated service misbehaves exactly once in that way, at
//! a moment the checker can see it (e.g. a double lease while the first lease has long to run);
//! the history must then be caught by that check. Without one, it must pass.

use std::collections::HashMap;

use crate::anomaly::AnomalyKind;
use crate::check::MARGIN_MS_DEFAULT;
use crate::history::{Call, Delivered, History, Op, Outcome, Record, Reply};

/// A small, fast, seedable generator (SplitMix64): the histories must be reproducible from
/// `SLUICE_SEED` alone, and the crate takes no dependency for it.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0; the bias of the modulo is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    pub fn range(&mut self, lo: u64, hi_inclusive: u64) -> u64 {
        lo + self.below(hi_inclusive - lo + 1)
    }

    pub fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

/// The generator's shape.
#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    pub clients: usize,
    /// Calls in the faulty phase (more if a planted fault has not found its moment yet).
    pub steps: usize,
    /// The margin the planted faults keep clear of (the checker's margin must not exceed it).
    pub margin_us: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            clients: 5,
            steps: 800,
            margin_us: MARGIN_MS_DEFAULT * 1_000,
        }
    }
}

const STEP_US_MIN: u64 = 100;
const STEP_US_MAX: u64 = 4_000;
/// A call's latency on either side of its effect.
const LATENCY_US_MAX: u64 = 3_000;
const VISIBILITY_MS_MIN: u64 = 200;
const VISIBILITY_MS_MAX: u64 = 400;
const CHANGED_VISIBILITY_MS_MAX: u64 = 400;
/// The drain's receives hold their leases for longer than the drain lasts.
const DRAIN_VISIBILITY_MS: u64 = 30_000;
const DEDUP_WINDOW_US: u64 = crate::check::DEDUP_WINDOW_US;
/// Halfway, the clock jumps past the dedup window, so that retries after it legitimately store a
/// second message with the same key.
const WINDOW_JUMP_US: u64 = DEDUP_WINDOW_US + 1_000_000;
const STD: usize = 0;
const FIFO: usize = 1;
const TOPIC: &str = "t";
const PARTITIONS: u32 = 2;
const CONSUMER_GROUP: &str = "cg";

#[derive(Clone, Debug)]
struct Msg {
    id: String,
    payload: String,
    group: Option<String>,
    deleted: bool,
    epoch: u32,
    lease_until_us: u64,
    /// The start of the receive that took the current lease, and its visibility.
    lease_receive_start_us: u64,
    lease_visibility_us: u64,
    /// The current lease's receive was ok (the client saw it), and no delete or visibility
    /// change of the message has been attempted since: planted double leases need both.
    lease_clean: bool,
    /// A delete was ever attempted (any outcome).
    delete_attempted: bool,
    /// Earliest end of an ok send that returned this message.
    ok_send_end_us: Option<u64>,
    /// A planted fault: deleted, but deliverable again to a receive starting after this.
    zombie_after_us: Option<u64>,
}

#[derive(Default)]
struct Queue {
    msgs: Vec<Msg>,
    /// Dedup key -> (message index, stored at).
    dedup: HashMap<String, (usize, u64)>,
}

#[derive(Clone, Debug)]
struct Held {
    queue: usize,
    message_id: String,
    receipt: String,
}

struct Client {
    name: String,
    free_at_us: u64,
    /// Incarnations so far: a client that dies mid-call comes back as a new process, as in
    /// Jepsen, and its old call stays open for ever.
    incarnation: u32,
    held: Vec<Held>,
    /// The last FIFO send, for retries: (payload, dedup id, content-based).
    last_fifo: Option<(String, Option<String>, bool)>,
}

/// How the network treats a call.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fate {
    Ok,
    /// Refused before anything happened.
    Refused,
    /// Timed out; `applied` says whether it happened.
    Timeout {
        applied: bool,
    },
    /// The client died mid-call; the call may have happened.
    Died {
        applied: bool,
    },
}

impl Fate {
    fn applied(self) -> bool {
        match self {
            Fate::Ok => true,
            Fate::Refused => false,
            Fate::Timeout { applied } | Fate::Died { applied } => applied,
        }
    }
}

/// A generated history and what was planted in it.
#[derive(Clone, Debug)]
pub struct Generated {
    pub history: History,
    pub fault: Option<AnomalyKind>,
    /// The planted fault found its moment (always, unless the run was too short).
    pub planted: bool,
}

struct Sim {
    rng: Rng,
    cfg: SimConfig,
    now_us: u64,
    queues: [Queue; 2],
    partitions: Vec<Vec<String>>,
    committed: Vec<Option<u64>>,
    last_ok_commit_end_us: Vec<Option<u64>>,
    /// The earliest start of any non-refused send of each (queue, payload).
    first_send_start_us: HashMap<(usize, String), u64>,
    clients: Vec<Client>,
    ops: Vec<Op>,
    next_op: u64,
    next_id: u64,
    fault: Option<AnomalyKind>,
    planted: bool,
}

/// Generates a history from `seed`, planting `fault` once if given.
pub fn generate(seed: u64, fault: Option<AnomalyKind>, cfg: SimConfig) -> Generated {
    let mut sim = Sim {
        rng: Rng::new(seed),
        cfg,
        now_us: 1_000_000,
        queues: [Queue::default(), Queue::default()],
        partitions: vec![Vec::new(); PARTITIONS as usize],
        committed: vec![None; PARTITIONS as usize],
        last_ok_commit_end_us: vec![None; PARTITIONS as usize],
        first_send_start_us: HashMap::new(),
        clients: (0..cfg.clients)
            .map(|i| Client {
                name: format!("c{i}"),
                free_at_us: 0,
                incarnation: 0,
                held: Vec::new(),
                last_fifo: None,
            })
            .collect(),
        ops: Vec::new(),
        next_op: 1,
        next_id: 1,
        fault,
        planted: false,
    };
    let drain_us = sim.run();
    Generated {
        history: History {
            ops: sim.ops,
            drain_us: Some(drain_us),
        },
        fault,
        planted: sim.planted,
    }
}

fn queue_name(q: usize) -> String {
    if q == FIFO { "fifo" } else { "std" }.to_string()
}

impl Sim {
    fn armed(&self, kind: AnomalyKind) -> bool {
        self.fault == Some(kind) && !self.planted
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}{}", self.next_id)
    }

    fn fate(&mut self) -> Fate {
        match self.rng.below(1000) {
            0..=4 => Fate::Died {
                applied: self.rng.percent(50),
            },
            5..=49 => Fate::Timeout {
                applied: self.rng.percent(50),
            },
            50..=79 => Fate::Refused,
            _ => Fate::Ok,
        }
    }

    /// Records a call of `client` that took effect now: it started after the client's previous
    /// call ended and no later than now, and ends a little after now.
    fn record(&mut self, c: usize, fate: Fate, call: Call, reply: Result<Reply, String>) -> u64 {
        let idle_us = self.now_us - self.clients[c].free_at_us - 1;
        let start_us = self.now_us - self.rng.below(idle_us.min(LATENCY_US_MAX) + 1);
        let end_us = self.now_us + self.rng.range(1, LATENCY_US_MAX);
        self.push(c, start_us, end_us, fate, call, reply);
        end_us
    }

    fn push(
        &mut self,
        c: usize,
        start_us: u64,
        end_us: u64,
        fate: Fate,
        call: Call,
        reply: Result<Reply, String>,
    ) {
        if let Call::Send { queue, payload, .. } = &call {
            if fate != Fate::Refused {
                let q = if queue == "fifo" { FIFO } else { STD };
                let e = self
                    .first_send_start_us
                    .entry((q, payload.clone()))
                    .or_insert(start_us);
                *e = (*e).min(start_us);
            }
        }
        let client = &mut self.clients[c];
        client.free_at_us = end_us;
        let (outcome, end, reply, error) = match (fate, reply) {
            (Fate::Ok, Ok(r)) => (Outcome::Ok, Some(end_us), Some(r), None),
            (Fate::Ok, Err(e)) => (Outcome::Fail, Some(end_us), None, Some(e)),
            (Fate::Refused, _) => (Outcome::Fail, Some(end_us), None, Some("refused".into())),
            (Fate::Timeout { .. }, _) => {
                (Outcome::Info, Some(end_us), None, Some("timeout".into()))
            }
            (Fate::Died { .. }, _) => {
                client.incarnation += 1;
                client.held.clear();
                let slot = client
                    .name
                    .split('.')
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let process =
                    std::mem::replace(&mut client.name, format!("{slot}.{}", client.incarnation));
                self.ops.push(Op {
                    id: self.next_op,
                    process,
                    start_us,
                    end_us: None,
                    outcome: Outcome::Info,
                    call,
                    reply: None,
                    error: None,
                });
                self.next_op += 1;
                // The new process may start at once.
                client.free_at_us = start_us;
                return;
            }
        };
        self.ops.push(Op {
            id: self.next_op,
            process: client.name.clone(),
            start_us,
            end_us: end,
            outcome,
            call,
            reply,
            error,
        });
        self.next_op += 1;
    }

    fn run(&mut self) -> u64 {
        let mut step = 0;
        let steps = self.cfg.steps;
        while step < steps || (self.fault.is_some() && !self.planted && step < steps * 4) {
            if step == steps / 2 {
                self.now_us += WINDOW_JUMP_US;
            }
            step += 1;
            self.now_us += self.rng.range(STEP_US_MIN, STEP_US_MAX);
            let c = self.rng.below(self.clients.len() as u64) as usize;
            let client = &self.clients[c];
            if client.free_at_us >= self.now_us {
                continue;
            }
            match self.rng.below(100) {
                0..=17 => self.send(c, STD),
                18..=33 => self.send(c, FIFO),
                34..=47 => self.receive(c, STD),
                48..=59 => self.receive(c, FIFO),
                60..=71 => self.delete(c),
                72..=75 => self.change_visibility(c),
                76..=85 => self.produce(c),
                86..=91 => self.fetch(c),
                92..=95 => self.commit(c),
                _ => self.fetch_committed(c),
            }
        }
        self.drain()
    }

    fn send(&mut self, c: usize, q: usize) {
        let fate = self.fate();
        let (payload, group, dedup, content) = if q == FIFO {
            // A planted duplicate needs a retry inside the window: retry more often then.
            let retry_percent = if self.armed(AnomalyKind::DuplicateInWindow) {
                50
            } else {
                15
            };
            let retry = self.clients[c]
                .last_fifo
                .clone()
                .filter(|_| self.rng.percent(retry_percent));
            let (payload, dedup, content) = match retry {
                Some(r) => r,
                None => {
                    let payload = self.fresh("p");
                    if self.rng.percent(30) {
                        (payload, None, true)
                    } else {
                        let d = self.fresh("d");
                        (payload, Some(d), false)
                    }
                }
            };
            self.clients[c].last_fifo = Some((payload.clone(), dedup.clone(), content));
            (payload, Some(format!("g{c}")), dedup, content)
        } else {
            (self.fresh("p"), None, None, false)
        };
        let call = Call::Send {
            queue: queue_name(q),
            payload: payload.clone(),
            group: group.clone(),
            dedup: dedup.clone(),
            content_dedup: content,
            dedup_per_group: false,
        };
        let key = dedup
            .clone()
            .or(if content { Some(payload.clone()) } else { None });
        let now = self.now_us;
        let mut reply_id = None;
        if fate.applied() {
            let live = key.as_ref().and_then(|k| {
                self.queues[q]
                    .dedup
                    .get(k)
                    .filter(|(_, at)| now < at + DEDUP_WINDOW_US)
                    .map(|(i, _)| *i)
            });
            let plant_dup =
                live.is_some() && fate == Fate::Ok && self.armed(AnomalyKind::DuplicateInWindow);
            let plant_lost = q == STD && fate == Fate::Ok && self.armed(AnomalyKind::LostWrite);
            match live {
                Some(i) if !plant_dup => reply_id = Some(i),
                _ => {
                    let id = self.fresh("m");
                    if plant_lost {
                        self.planted = true;
                        self.record(c, fate, call, Ok(Reply::Send { message_id: id }));
                        return;
                    }
                    if plant_dup {
                        self.planted = true;
                    }
                    self.queues[q].msgs.push(Msg {
                        id,
                        payload,
                        group,
                        deleted: false,
                        epoch: 0,
                        lease_until_us: 0,
                        lease_receive_start_us: 0,
                        lease_visibility_us: 0,
                        lease_clean: false,
                        delete_attempted: false,
                        ok_send_end_us: None,
                        zombie_after_us: None,
                    });
                    let i = self.queues[q].msgs.len() - 1;
                    // A planted duplicate keeps the original's dedup entry.
                    if let (Some(k), false) = (key, plant_dup) {
                        self.queues[q].dedup.insert(k, (i, now));
                    }
                    reply_id = Some(i);
                }
            }
        }
        let reply = match reply_id {
            Some(i) => Ok(Reply::Send {
                message_id: self.queues[q].msgs[i].id.clone(),
            }),
            None => Err("not applied".to_string()),
        };
        let end = self.record(c, fate, call, reply);
        if let (Fate::Ok, Some(i)) = (fate, reply_id) {
            let m = &mut self.queues[q].msgs[i];
            m.ok_send_end_us = Some(m.ok_send_end_us.map_or(end, |e| e.min(end)));
        }
    }

    /// Whether a receive may deliver `m`; a planted zombie only to a receive the client sees
    /// (`seen`), or the fault would vanish unobserved.
    fn visible(m: &Msg, now: u64, receive_start: u64, seen: bool) -> bool {
        match m.zombie_after_us {
            Some(after) if m.deleted => seen && receive_start > after,
            _ => !m.deleted && m.lease_until_us <= now,
        }
    }

    fn receive(&mut self, c: usize, q: usize) {
        let fate = self.fate();
        let visibility_ms = self.rng.range(VISIBILITY_MS_MIN, VISIBILITY_MS_MAX);
        let max = self.rng.range(1, 5) as usize;
        // The start is drawn first: zombies are only for receives that start late enough.
        let idle_us = self.now_us - self.clients[c].free_at_us - 1;
        let start_us = self.now_us - self.rng.below(idle_us.min(LATENCY_US_MAX) + 1);
        let end_us = self.now_us + self.rng.range(1, LATENCY_US_MAX);
        let now = self.now_us;
        let mut picked: Vec<usize> = Vec::new();
        // A planted double lease: the message stays with neither receiver, so that no delete or
        // visibility change cuts the first lease short.
        let mut plant_double = false;
        if fate.applied() {
            let msgs = &self.queues[q].msgs;
            if q == STD {
                let mut visible: Vec<usize> = (0..msgs.len())
                    .filter(|&i| Self::visible(&msgs[i], now, start_us, fate == Fate::Ok))
                    .collect();
                while picked.len() < max && !visible.is_empty() {
                    let k = self.rng.below(visible.len() as u64) as usize;
                    picked.push(visible.swap_remove(k));
                }
                if fate == Fate::Ok && self.armed(AnomalyKind::DoubleLease) {
                    let margin = self.cfg.margin_us;
                    let leased = (0..msgs.len()).find(|&i| {
                        let m = &msgs[i];
                        !m.deleted
                            && m.lease_clean
                            && m.lease_until_us > now
                            && m.lease_receive_start_us + m.lease_visibility_us
                                > end_us + margin + LATENCY_US_MAX
                    });
                    if let Some(i) = leased {
                        self.planted = true;
                        plant_double = true;
                        picked = vec![i];
                        let id = msgs[i].id.clone();
                        for cl in &mut self.clients {
                            cl.held.retain(|h| h.message_id != id);
                        }
                    }
                }
            } else {
                picked = self.fifo_pick(max, now, fate);
            }
        }
        let mut delivered = Vec::new();
        for &i in &picked {
            let m = &mut self.queues[q].msgs[i];
            if m.deleted {
                // A planted zombie comes back once.
                m.zombie_after_us = None;
            }
            m.epoch += 1;
            m.lease_until_us = now + visibility_ms * 1_000;
            m.lease_receive_start_us = start_us;
            m.lease_visibility_us = visibility_ms * 1_000;
            m.lease_clean = fate == Fate::Ok && !plant_double;
            let receipt = format!("{}/{}", m.id, m.epoch);
            delivered.push(Delivered {
                message_id: m.id.clone(),
                payload: m.payload.clone(),
                receipt: receipt.clone(),
                receive_count: Some(m.epoch),
                group: m.group.clone(),
            });
            if fate == Fate::Ok && !plant_double {
                self.clients[c].held.push(Held {
                    queue: q,
                    message_id: m.id.clone(),
                    receipt,
                });
            }
        }
        if fate == Fate::Ok && !delivered.is_empty() && self.armed(AnomalyKind::UnsentPayload) {
            // A bit flipped on the way out.
            self.planted = true;
            delivered[0].payload.push_str("-flipped");
        }
        let call = Call::Receive {
            queue: queue_name(q),
            visibility_timeout_ms: visibility_ms,
        };
        self.push(
            c,
            start_us,
            end_us,
            fate,
            call,
            Ok(Reply::Receive {
                messages: delivered,
            }),
        );
    }

    /// A correct FIFO receive: the heads of unlocked groups, in order — or, planted, a group's
    /// second message while its never-delivered head waits.
    fn fifo_pick(&mut self, max: usize, now: u64, fate: Fate) -> Vec<usize> {
        let msgs = &self.queues[FIFO].msgs;
        let mut groups: Vec<&str> = Vec::new();
        for m in msgs {
            if let Some(g) = m.group.as_deref() {
                if !groups.contains(&g) {
                    groups.push(g);
                }
            }
        }
        if fate == Fate::Ok && self.armed(AnomalyKind::FifoOrder) {
            for g in &groups {
                let live: Vec<usize> = (0..msgs.len())
                    .filter(|&i| msgs[i].group.as_deref() == Some(g) && !msgs[i].deleted)
                    .collect();
                let [head, second, ..] = live[..] else {
                    continue;
                };
                let (h, s) = (&msgs[head], &msgs[second]);
                let head_first = match (
                    h.ok_send_end_us,
                    self.first_send_start_us.get(&(FIFO, s.payload.clone())),
                ) {
                    (Some(end), Some(&start)) => end < start,
                    _ => false,
                };
                // The head must be certainly undeleted: no delete of it ever tried, and none
                // from now on (its holders forget it) until the drain.
                if !h.delete_attempted
                    && h.lease_until_us <= now
                    && s.lease_until_us <= now
                    && head_first
                {
                    self.planted = true;
                    let id = h.id.clone();
                    for cl in &mut self.clients {
                        cl.held.retain(|held| held.message_id != id);
                    }
                    return vec![second];
                }
            }
        }
        let mut picked = Vec::new();
        for g in groups {
            let of_group: Vec<usize> = (0..msgs.len())
                .filter(|&i| msgs[i].group.as_deref() == Some(g) && !msgs[i].deleted)
                .collect();
            if of_group.iter().any(|&i| msgs[i].lease_until_us > now) {
                continue;
            }
            for i in of_group {
                if picked.len() == max {
                    return picked;
                }
                picked.push(i);
            }
        }
        picked
    }

    fn find(&mut self, q: usize, id: &str) -> Option<&mut Msg> {
        self.queues[q].msgs.iter_mut().find(|m| m.id == id)
    }

    fn delete(&mut self, c: usize) {
        let held = &mut self.clients[c].held;
        if held.is_empty() {
            return;
        }
        // FIFO consumers delete in order; the others pick any.
        let k = if self.rng.percent(70) {
            0
        } else {
            self.rng.below(held.len() as u64) as usize
        };
        let h = held.remove(k);
        let fate = self.fate();
        let now = self.now_us;
        let mut reply = Ok(Reply::Delete {});
        let Some(m) = self.find(h.queue, &h.message_id) else {
            return;
        };
        m.delete_attempted = true;
        m.lease_clean = false;
        if fate.applied() {
            let epoch: u32 = h
                .receipt
                .rsplit('/')
                .next()
                .and_then(|e| e.parse().ok())
                .unwrap_or(0);
            let current = epoch == m.epoch && m.lease_until_us > now;
            if h.queue == FIFO && !current {
                reply = Err("ReceiptHandleIsInvalid".to_string());
            } else {
                m.deleted = true;
            }
        }
        let call = Call::Delete {
            queue: queue_name(h.queue),
            message_id: h.message_id.clone(),
            receipt: Some(h.receipt.clone()),
        };
        let ok = fate == Fate::Ok && reply.is_ok();
        let end = self.record(c, fate, call, reply);
        if ok && h.queue == STD && self.armed(AnomalyKind::DeletedRedelivered) {
            self.planted = true;
            let after = end + self.cfg.margin_us + 1;
            if let Some(m) = self.find(STD, &h.message_id) {
                m.zombie_after_us = Some(after);
            }
        }
    }

    fn change_visibility(&mut self, c: usize) {
        let held = &mut self.clients[c].held;
        if held.is_empty() {
            return;
        }
        let k = self.rng.below(held.len() as u64) as usize;
        let release = self.rng.percent(50);
        let h = if release {
            held.remove(k)
        } else {
            held[k].clone()
        };
        let timeout_ms = if release {
            0
        } else {
            self.rng.range(1, CHANGED_VISIBILITY_MS_MAX)
        };
        let fate = self.fate();
        let now = self.now_us;
        let Some(m) = self.find(h.queue, &h.message_id) else {
            return;
        };
        m.lease_clean = false;
        let mut reply = Ok(Reply::ChangeVisibility {});
        if fate.applied() {
            let epoch: u32 = h
                .receipt
                .rsplit('/')
                .next()
                .and_then(|e| e.parse().ok())
                .unwrap_or(0);
            if m.deleted || epoch != m.epoch {
                reply = Err("ReceiptHandleIsInvalid".to_string());
            } else if m.lease_until_us <= now {
                reply = Err("MessageNotInflight".to_string());
            } else {
                m.lease_until_us = now + timeout_ms * 1_000;
            }
        }
        let call = Call::ChangeVisibility {
            queue: queue_name(h.queue),
            message_id: h.message_id,
            receipt: h.receipt,
            visibility_timeout_ms: timeout_ms,
        };
        self.record(c, fate, call, reply);
    }

    fn produce(&mut self, c: usize) {
        let fate = self.fate();
        let partition = self.rng.below(u64::from(PARTITIONS)) as u32;
        let payload = self.fresh("r");
        let log = &mut self.partitions[partition as usize];
        let offset = log.len() as u64;
        let mut reply = Err("not applied".to_string());
        if fate.applied() {
            if fate == Fate::Ok && self.fault == Some(AnomalyKind::LostProduce) && !self.planted {
                // Acknowledged, never stored.
                self.planted = true;
            } else {
                log.push(payload.clone());
            }
            reply = Ok(Reply::Produce { offset });
        }
        let call = Call::Produce {
            topic: TOPIC.into(),
            partition,
            payload,
        };
        self.record(c, fate, call, reply);
    }

    fn fetch(&mut self, c: usize) {
        let fate = self.fate();
        let partition = self.rng.below(u64::from(PARTITIONS)) as u32;
        let log = &self.partitions[partition as usize];
        let from_offset = self.rng.below(log.len() as u64 + 1);
        let max = self.rng.range(1, 8) as usize;
        let mut records: Vec<Record> = log
            .iter()
            .enumerate()
            .skip(from_offset as usize)
            .take(max)
            .map(|(o, p)| Record {
                offset: o as u64,
                payload: p.clone(),
            })
            .collect();
        if fate == Fate::Ok && !records.is_empty() && self.armed(AnomalyKind::OffsetConflict) {
            self.planted = true;
            records[0].payload = format!("{}-corrupt", records[0].payload);
        }
        let call = Call::Fetch {
            topic: TOPIC.into(),
            partition,
            from_offset,
        };
        self.record(c, fate, call, Ok(Reply::Fetch { records }));
    }

    fn commit(&mut self, c: usize) {
        let fate = self.fate();
        let partition = self.rng.below(u64::from(PARTITIONS)) as u32;
        let p = partition as usize;
        let offset = self.committed[p].unwrap_or(0) + self.rng.below(4);
        if fate.applied() {
            self.committed[p] = Some(offset);
        }
        let call = Call::CommitOffset {
            group: CONSUMER_GROUP.into(),
            topic: TOPIC.into(),
            partition,
            offset,
        };
        let end = self.record(c, fate, call, Ok(Reply::CommitOffset {}));
        if fate == Fate::Ok {
            self.last_ok_commit_end_us[p] = Some(end);
        }
    }

    fn fetch_committed(&mut self, c: usize) {
        let fate = self.fate();
        let partition = self.rng.below(u64::from(PARTITIONS)) as u32;
        let p = partition as usize;
        let mut offset = self.committed[p];
        let long_acked = self.last_ok_commit_end_us[p]
            .is_some_and(|end| end + self.cfg.margin_us + LATENCY_US_MAX < self.now_us);
        if fate == Fate::Ok && long_acked && self.armed(AnomalyKind::CommittedOffsetBack) {
            // Forgets the committed offset.
            self.planted = true;
            offset = None;
        }
        let call = Call::FetchCommitted {
            group: CONSUMER_GROUP.into(),
            topic: TOPIC.into(),
            partition,
        };
        self.record(c, fate, call, Ok(Reply::FetchCommitted { offset }));
    }

    /// The final drain: after every client's last call, and after every lease has run out, one
    /// client receives (and deletes) each queue until a receive comes back empty, and fetches
    /// each partition from 0.
    fn drain(&mut self) -> u64 {
        let last = self.clients.iter().map(|c| c.free_at_us).max().unwrap_or(0);
        let drain_us = last.max(self.now_us) + 1;
        self.now_us =
            drain_us + (VISIBILITY_MS_MAX + CHANGED_VISIBILITY_MS_MAX) * 1_000 + self.cfg.margin_us;
        self.clients.push(Client {
            name: "drain".into(),
            free_at_us: drain_us,
            incarnation: 0,
            held: Vec::new(),
            last_fifo: None,
        });
        let d = self.clients.len() - 1;
        for q in [STD, FIFO] {
            loop {
                self.now_us += 10;
                let start = self.now_us;
                self.now_us += 10;
                let now = self.now_us;
                let picked: Vec<usize> = if q == STD {
                    (0..self.queues[q].msgs.len())
                        .filter(|&i| Self::visible(&self.queues[q].msgs[i], now, start, true))
                        .take(10)
                        .collect()
                } else {
                    self.fifo_pick(10, now, Fate::Refused)
                };
                let mut delivered = Vec::new();
                for &i in &picked {
                    let m = &mut self.queues[q].msgs[i];
                    m.zombie_after_us = None;
                    m.epoch += 1;
                    m.lease_until_us = now + DRAIN_VISIBILITY_MS * 1_000;
                    delivered.push(Delivered {
                        message_id: m.id.clone(),
                        payload: m.payload.clone(),
                        receipt: format!("{}/{}", m.id, m.epoch),
                        receive_count: Some(m.epoch),
                        group: m.group.clone(),
                    });
                }
                self.now_us += 10;
                let call = Call::Receive {
                    queue: queue_name(q),
                    visibility_timeout_ms: DRAIN_VISIBILITY_MS,
                };
                let empty = delivered.is_empty();
                self.push(
                    d,
                    start,
                    self.now_us,
                    Fate::Ok,
                    call,
                    Ok(Reply::Receive {
                        messages: delivered.clone(),
                    }),
                );
                if empty {
                    break;
                }
                for m in delivered {
                    self.now_us += 10;
                    let start = self.now_us;
                    self.now_us += 10;
                    if let Some(msg) = self.find(q, &m.message_id) {
                        msg.deleted = true;
                    }
                    let call = Call::Delete {
                        queue: queue_name(q),
                        message_id: m.message_id,
                        receipt: Some(m.receipt),
                    };
                    self.push(d, start, self.now_us, Fate::Ok, call, Ok(Reply::Delete {}));
                }
            }
        }
        for partition in 0..PARTITIONS {
            self.now_us += 10;
            let start = self.now_us;
            self.now_us += 10;
            let records = self.partitions[partition as usize]
                .iter()
                .enumerate()
                .map(|(o, p)| Record {
                    offset: o as u64,
                    payload: p.clone(),
                })
                .collect();
            let call = Call::Fetch {
                topic: TOPIC.into(),
                partition,
                from_offset: 0,
            };
            self.push(
                d,
                start,
                self.now_us,
                Fate::Ok,
                call,
                Ok(Reply::Fetch { records }),
            );
            // ...until a fetch comes back empty.
            self.now_us += 10;
            let start = self.now_us;
            self.now_us += 10;
            let call = Call::Fetch {
                topic: TOPIC.into(),
                partition,
                from_offset: self.partitions[partition as usize].len() as u64,
            };
            let end = Ok(Reply::Fetch {
                records: Vec::new(),
            });
            self.push(d, start, self.now_us, Fate::Ok, call, end);
            self.now_us += 10;
            let start = self.now_us;
            self.now_us += 10;
            let call = Call::FetchCommitted {
                group: CONSUMER_GROUP.into(),
                topic: TOPIC.into(),
                partition,
            };
            let mut offset = self.committed[partition as usize];
            if self.armed(AnomalyKind::CommittedOffsetBack)
                && self.last_ok_commit_end_us[partition as usize].is_some()
            {
                // The faulty phase offered no moment: the drain's read forgets instead.
                self.planted = true;
                offset = None;
            }
            self.push(
                d,
                start,
                self.now_us,
                Fate::Ok,
                call,
                Ok(Reply::FetchCommitted { offset }),
            );
        }
        drain_us
    }
}
