//! Following partition leaders in a cluster.
//!
//! A cluster node that does not lead the partition a request is for answers `NotLeader`
//! (protocol v2), naming the leader's client address when it knows one. The client then:
//!
//! - sends the request again to the hinted node, at most [`LEADER_HOPS_MAX`] times per call
//!   (two nodes that name each other during an election must not bounce a call forever);
//! - while no leader is known (an election), backs off ([`ClientOptions::retry_backoff`],
//!   doubled each time) and asks the next node of its list; when the hops run out the caller
//!   gets the retryable [`Error::NotLeader`];
//! - resends only what is safe: when the node lost the lead while the request ran
//!   (`outcome_unknown`), a send may still be stored under the next leader, so it is resent
//!   only on a FIFO queue with a deduplication id on every message (the queue drops the
//!   duplicate); other sends surface the error. Requests that are not sends are resent
//!   (receives, deletes, visibility changes and reads do not duplicate data);
//! - remembers the leader per queue (by URL, or topic) and sends the next call for it straight
//!   there.
//!
//! A client of one broker never meets `NotLeader`: it pays one empty check per call (an atomic
//! flag says whether any leader was learnt) and nothing else.
//!
//! [`ClientOptions::retry_backoff`]: crate::ClientOptions::retry_backoff

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use sluice_wire::Request;

use crate::connection::Reply;
use crate::error::{Error, Result};
use crate::Client;

/// Hops one call may make to another node on a `NotLeader` answer (hinted or not) before the
/// caller gets the error.
pub const LEADER_HOPS_MAX: u32 = 3;

/// What a client knows about the cluster: the nodes it was given and the leaders it learnt.
#[derive(Default)]
pub(crate) struct Leaders {
    /// Set once any leader is learnt: until then a call looks nothing up.
    any: AtomicBool,
    /// Queue URL or topic → the leader's client address.
    by_key: Mutex<HashMap<String, SocketAddr>>,
    /// Connections to the other nodes, by address (made on first use).
    nodes: tokio::sync::Mutex<HashMap<SocketAddr, Client>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Leaders {
    fn get(&self, key: &str) -> Option<SocketAddr> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        lock(&self.by_key).get(key).copied()
    }

    fn set(&self, key: &str, addr: SocketAddr) {
        lock(&self.by_key).insert(key.to_string(), addr);
        self.any.store(true, Ordering::Relaxed);
    }

    fn forget(&self, key: &str) {
        lock(&self.by_key).remove(key);
    }
}

impl crate::Inner {
    /// The connections to other nodes (to close them).
    pub(crate) async fn leaders_nodes(
        &self,
    ) -> tokio::sync::MutexGuard<'_, HashMap<SocketAddr, Client>> {
        self.leaders.nodes.lock().await
    }
}

/// The queue (URL) or topic a request is for: what a leader is remembered by. `None` for
/// requests about no one partition (list, create).
pub(crate) fn leader_key(request: &Request) -> Option<&str> {
    let key = match request {
        Request::SendMessage(r) => &r.queue_url,
        Request::SendMessageBatch(r) => &r.queue_url,
        Request::ReceiveMessage(r) => &r.queue_url,
        Request::DeleteMessage(r) => &r.queue_url,
        Request::DeleteMessageBatch(r) => &r.queue_url,
        Request::ChangeMessageVisibility(r) => &r.queue_url,
        Request::ChangeMessageVisibilityBatch(r) => &r.queue_url,
        Request::GetQueueAttributes(r) => &r.queue_url,
        Request::PurgeQueue(r) => &r.queue_url,
        Request::Produce(r) => &r.topic,
        Request::Fetch(r) => &r.topic,
        _ => return None,
    };
    Some(key.as_str())
}

/// Whether `request` may be sent again after an answer that says it may or may not have taken
/// effect (module docs): anything but a send, and a send only on a FIFO queue with a
/// deduplication id on every message.
pub(crate) fn safe_to_resend(request: &Request) -> bool {
    match request {
        Request::SendMessage(r) => r.message_deduplication_id.is_some(),
        Request::SendMessageBatch(r) => r
            .entries
            .iter()
            .all(|e| e.message_deduplication_id.is_some()),
        Request::Produce(_) => false,
        _ => true,
    }
}

impl Client {
    /// The client for node `addr`: this one, or a connection to that node made with this
    /// client's options.
    async fn node(&self, addr: SocketAddr) -> Result<Client> {
        if addr == self.inner.addr {
            return Ok(self.clone());
        }
        let mut nodes = self.inner.leaders.nodes.lock().await;
        if let Some(c) = nodes.get(&addr) {
            return Ok(c.clone());
        }
        let c = Box::pin(Client::connect_one(
            addr,
            self.inner.options.clone(),
            self.inner.nodes.clone(),
        ))
        .await?;
        nodes.insert(addr, c.clone());
        Ok(c)
    }

    /// [`Client::call_reply`] that follows `NotLeader` answers (module docs).
    pub(crate) async fn call_following(&self, request: &Request) -> Result<Reply> {
        let key = leader_key(request);
        let mut target = match key.and_then(|k| self.inner.leaders.get(k)) {
            Some(addr) => self.node(addr).await?,
            None => self.clone(),
        };
        let mut backoff = self.inner.options.retry_backoff;
        // Where to ask next while no leader is known: the nodes of the list in turn, from the
        // one after this client's.
        let nodes = &self.inner.nodes;
        let mut next_node = nodes
            .iter()
            .position(|a| *a == self.inner.addr)
            .map_or(0, |i| i + 1);
        let mut hops = 0u32;
        loop {
            let answer = target.call_routed(request).await;
            let Err(Error::NotLeader {
                leader_addr,
                outcome_unknown,
                ..
            }) = &answer
            else {
                // A leader learnt by following is remembered (this node is the default).
                if let (Some(k), Ok(_)) = (key, &answer) {
                    if target.inner.addr != self.inner.addr {
                        self.inner.leaders.set(k, target.inner.addr);
                    }
                }
                return answer;
            };
            if let Some(k) = key {
                self.inner.leaders.forget(k);
            }
            if (*outcome_unknown && !safe_to_resend(request)) || hops >= LEADER_HOPS_MAX {
                return answer;
            }
            hops += 1;
            let hinted = leader_addr
                .as_deref()
                .and_then(|a| a.parse::<SocketAddr>().ok());
            let addr = match hinted {
                Some(addr) => addr,
                None => {
                    // An election: wait, then ask another node (it may know the new leader).
                    tracing::debug!(?backoff, "sluice: no leader known, backing off");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                    let addr = nodes[next_node % nodes.len()];
                    next_node += 1;
                    addr
                }
            };
            tracing::debug!(%addr, hops, "sluice: following the partition's leader");
            target = match self.node(addr).await {
                Ok(c) => c,
                // An unreachable hint is not the caller's answer: the error it followed is.
                Err(e) => {
                    tracing::debug!(%addr, error = %e, "sluice: hinted leader unreachable");
                    return answer;
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_wire::{SendMessageBatchRequest, SendMessageBatchRequestEntry, SendMessageRequest};

    #[test]
    fn only_deduplicated_sends_are_resent_after_an_unknown_outcome() {
        let send = |dedup: Option<&str>| {
            Request::SendMessage(SendMessageRequest {
                queue_url: "q.fifo".into(),
                message_deduplication_id: dedup.map(str::to_string),
                ..Default::default()
            })
        };
        assert!(!safe_to_resend(&send(None)));
        assert!(safe_to_resend(&send(Some("d1"))));
        let entry = |dedup: Option<&str>| SendMessageBatchRequestEntry {
            id: "1".into(),
            message_deduplication_id: dedup.map(str::to_string),
            ..Default::default()
        };
        let batch = |entries| {
            Request::SendMessageBatch(SendMessageBatchRequest {
                queue_url: "q.fifo".into(),
                entries,
            })
        };
        assert!(safe_to_resend(&batch(vec![
            entry(Some("a")),
            entry(Some("b"))
        ])));
        assert!(!safe_to_resend(&batch(vec![entry(Some("a")), entry(None)])));
        assert_eq!(leader_key(&send(None)), Some("q.fifo"));
    }
}
