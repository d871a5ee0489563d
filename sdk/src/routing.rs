//! Routing to the owning core: the broker has one QUIC endpoint shared by all its cores (the
//! kernel spreads connections over them) and, per core, an endpoint of its own. A request that
//! reaches a core not owning its partition is forwarded over the broker's internal mesh — one
//! hop more. For requests that name a partition (produce to one, fetch from one, a FIFO send
//! whose message group picks one), the client asks once where each partition lives
//! (`GetRouting`), connects to that core's own endpoint and sends them there.
//!
//! Every other request (standard-queue sends, receives, deletes, admin) goes to the client's
//! *home core*: handed out round-robin to the clients of a process (from an offset taken from
//! the process id, so that processes with one client each spread too). The kernel's hash of a
//! handful of connections over the shared endpoint is luck — with 4 connections and 2 cores,
//! all 4 land on one core one time in 8, and 3 on one core one time in 2 — and a standard
//! queue's work stays on the core that took the request (its partitions there are tried
//! first), so one core did all the work while the other idled. A client keeps its home core
//! for its life, so a receive and the delete that follows meet the same partitions.
//!
//! Anything that fails on the way falls back to the shared connection.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sluice_wire::{self as wire, Request, Response};

use crate::{Client, Result};

/// What a client knows of the broker's cores.
#[derive(Default)]
pub(crate) struct Routes {
    /// Per core, its own address (`None`: learnt nothing yet, or the broker has none).
    shard_addrs: Option<Vec<Option<SocketAddr>>>,
    /// Per core, a client connected to its own address (made on first use).
    clients: HashMap<usize, Client>,
    /// Per topic (or `queue:<name>`), the core of each partition.
    placements: HashMap<String, Arc<Vec<u32>>>,
    /// This client's home core (see the module documentation), once picked.
    home: Option<usize>,
    /// A core's own endpoint could not be reached: no routing before then (each try would
    /// cost the caller a connect timeout).
    retry_after: Option<std::time::Instant>,
}

/// The longest wait for a handshake with a core's own endpoint.
const CORE_CONNECT_TIMEOUT_MAX: std::time::Duration = std::time::Duration::from_secs(3);

/// How long routing stays off after a core's own endpoint could not be reached.
const ROUTING_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// The next home core to hand out, counted over the clients of this process.
static NEXT_HOME: AtomicUsize = AtomicUsize::new(0);

/// A home core for a new client of a broker with `cores` cores.
fn pick_home(cores: usize) -> usize {
    let n = NEXT_HOME.fetch_add(1, Ordering::Relaxed);
    (n.wrapping_add(std::process::id() as usize)) % cores.max(1)
}

/// Where to reach a core that advertised `advertised`: a core bound to the unspecified
/// address (0.0.0.0 or ::) is reached at the IP this client reached the broker at (`broker`);
/// anything that does not parse is no address (that core is not routed to).
fn core_addr(advertised: &str, broker: IpAddr) -> Option<SocketAddr> {
    let mut a = advertised.parse::<SocketAddr>().ok()?;
    if a.ip().is_unspecified() {
        a.set_ip(broker);
    }
    Some(a)
}

/// Whether `request` goes to the client's home core (rather than the shared connection):
/// everything except the handshake-like requests that the routing itself makes.
pub(crate) fn goes_home(request: &Request) -> bool {
    !matches!(request, Request::GetRouting(_))
}

impl Routes {
    /// Nothing learnt, and no routing for [`ROUTING_RETRY_AFTER`] from now.
    fn paused_from_now() -> Routes {
        Routes {
            retry_after: Some(std::time::Instant::now() + ROUTING_RETRY_AFTER),
            ..Routes::default()
        }
    }

    fn paused(&self) -> bool {
        self.retry_after
            .is_some_and(|t| std::time::Instant::now() < t)
    }

    pub(crate) fn into_clients(self) -> impl Iterator<Item = Client> {
        self.clients.into_values()
    }
}

impl Client {
    /// The client to send a request for `partition` of `topic` with: one connected to the core
    /// owning it, or this one (routing off, the broker has no per-core endpoints, or anything
    /// failed).
    pub(crate) async fn owner_of(&self, topic: &str, partition: u32) -> Client {
        if !self.inner.options.route_to_owner {
            return self.clone();
        }
        match self.route(topic, partition).await {
            Ok(Some(c)) => c,
            Ok(None) => self.clone(),
            Err(e) => {
                tracing::debug!(error = %e, topic, partition, "sluice: routing failed, using the shared connection");
                self.clone()
            }
        }
    }

    /// The client for a FIFO queue's message group: the broker keeps a group in partition
    /// `xxh3(group) % partitions`, so a send of that group goes to the core owning it.
    pub(crate) async fn fifo_owner(&self, queue_url: &str, group: Option<&str>) -> Client {
        let (Some(group), true) = (group, queue_url.ends_with(".fifo")) else {
            return self.clone();
        };
        if !self.inner.options.route_to_owner {
            return self.clone();
        }
        let Some(name) = queue_url.rsplit('/').next().filter(|n| !n.is_empty()) else {
            return self.clone();
        };
        let topic = format!("queue:{name}");
        let partitions = match self.placement(&topic).await {
            Ok(p) => p.len() as u64,
            Err(_) => return self.clone(),
        };
        if partitions == 0 {
            return self.clone();
        }
        let partition = (xxhash_rust::xxh3::xxh3_64(group.as_bytes()) % partitions) as u32;
        self.owner_of(&topic, partition).await
    }

    /// Where each partition of `topic` lives (asked once, then cached).
    async fn placement(&self, topic: &str) -> Result<Arc<Vec<u32>>> {
        let mut routes = self.inner.routes.lock().await;
        if let Some(p) = routes.placements.get(topic) {
            return Ok(p.clone());
        }
        let got = self.ask_routing(topic).await?;
        routes.shard_addrs = Some(got.shard_addrs);
        let p = Arc::new(got.partition_shards);
        routes.placements.insert(topic.to_string(), p.clone());
        Ok(p)
    }

    /// `GetRouting` for `topic` (empty: the cores' addresses only), over the shared connection.
    async fn ask_routing(&self, topic: &str) -> Result<Learnt> {
        let r = wire::GetRoutingRequest {
            topic: topic.into(),
        };
        match self
            .call_reply_here(&Request::GetRouting(r))
            .await?
            .into_response()
        {
            Response::GetRouting(g) => Ok(Learnt {
                shard_addrs: g
                    .shard_addrs
                    .iter()
                    .map(|a| core_addr(a, self.inner.addr.ip()))
                    .collect(),
                partition_shards: g.partition_shards,
            }),
            other => crate::unexpected(other),
        }
    }

    /// The client connected to this client's home core, or `None` (routing off, a broker of
    /// one core or without per-core endpoints, or anything failed: use the shared connection).
    pub(crate) async fn home(&self) -> Option<Client> {
        if !self.inner.options.route_to_owner {
            return None;
        }
        let known = {
            let routes = self.inner.routes.lock().await;
            if let Some(c) = routes.home.and_then(|h| routes.clients.get(&h)) {
                return Some(c.clone()); // the common case: one lock
            }
            if routes.paused() {
                return None;
            }
            routes.shard_addrs.is_some()
        };
        if !known {
            let learnt = self.ask_routing("").await;
            let mut routes = self.inner.routes.lock().await;
            match learnt {
                Ok(l) => routes.shard_addrs = Some(l.shard_addrs),
                Err(e) => {
                    // Not again until the routes are forgotten: the shared connection serves.
                    tracing::debug!(error = %e, "sluice: no routing, using the shared connection");
                    routes.shard_addrs = Some(Vec::new());
                }
            }
        }
        let home = {
            let mut routes = self.inner.routes.lock().await;
            let cores = routes.shard_addrs.as_ref().map_or(0, Vec::len);
            if cores < 2 {
                return None;
            }
            *routes.home.get_or_insert_with(|| pick_home(cores))
        };
        match self.client_of(home).await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, home, "sluice: home core unreachable, using the shared connection");
                None
            }
        }
    }

    async fn route(&self, topic: &str, partition: u32) -> Result<Option<Client>> {
        if self.routing_paused().await {
            return Ok(None);
        }
        let placement = self.placement(topic).await?;
        let Some(shard) = placement.get(partition as usize).map(|s| *s as usize) else {
            return Ok(None); // an unknown partition: the broker will say so
        };
        self.client_of(shard).await
    }

    /// A core's own endpoint was unreachable a moment ago: use the shared connection.
    async fn routing_paused(&self) -> bool {
        self.inner.routes.lock().await.paused()
    }

    /// The client connected to core `shard`'s own endpoint (connected on first use), or `None`
    /// when the broker gave no address for it.
    async fn client_of(&self, shard: usize) -> Result<Option<Client>> {
        let mut routes = self.inner.routes.lock().await;
        if let Some(c) = routes.clients.get(&shard) {
            return Ok(Some(c.clone()));
        }
        let Some(Some(addr)) = routes.shard_addrs.as_ref().and_then(|a| a.get(shard)) else {
            return Ok(None);
        };
        let o = &self.inner.options;
        let options = crate::ClientOptions {
            route_to_owner: false,
            // The shared connection is the fallback: a core that does not answer soon is
            // given up on (and its failures are not retried on it).
            connect_timeout: o.connect_timeout.min(CORE_CONNECT_TIMEOUT_MAX),
            retries: 0,
            ..o.clone()
        };
        match Client::connect(*addr, options).await {
            Ok(c) => {
                routes.clients.insert(shard, c.clone());
                Ok(Some(c))
            }
            Err(e) => {
                // Its address is stale (the broker restarted?) or not reachable from here:
                // learn everything anew, and not before a while.
                *routes = Routes::paused_from_now();
                Err(e)
            }
        }
    }

    /// Forgets what routing learnt (after the broker lost a topic, or a core's own endpoint
    /// stopped answering: the broker restarted, say).
    pub(crate) async fn forget_routes(&self) {
        *self.inner.routes.lock().await = Routes::default();
    }

    /// Forgets what routing learnt and sends everything over the shared connection for a
    /// while (a core's own endpoint stopped answering).
    pub(crate) async fn pause_routing(&self) {
        let old = std::mem::replace(
            &mut *self.inner.routes.lock().await,
            Routes::paused_from_now(),
        );
        for c in old.into_clients() {
            Box::pin(c.close()).await;
        }
    }
}

/// What `GetRouting` said.
struct Learnt {
    shard_addrs: Vec<Option<SocketAddr>>,
    partition_shards: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::core_addr;

    #[test]
    fn a_core_on_the_unspecified_address_is_reached_where_the_broker_was() {
        let v4 = "10.1.2.3".parse().expect("ip");
        let v6 = "fd00::7".parse().expect("ip");
        assert_eq!(core_addr("0.0.0.0:7401", v4), "10.1.2.3:7401".parse().ok());
        assert_eq!(core_addr("[::]:7402", v6), "[fd00::7]:7402".parse().ok());
        // A core with an address of its own keeps it.
        assert_eq!(core_addr("10.9.9.9:7401", v4), "10.9.9.9:7401".parse().ok());
        assert_eq!(
            core_addr("[fd00::9]:7401", v6),
            "[fd00::9]:7401".parse().ok()
        );
        // Garbage from the broker is no address, not a panic.
        assert_eq!(core_addr("", v4), None);
        assert_eq!(core_addr("0.0.0.0", v4), None);
        assert_eq!(core_addr("not an address:1", v4), None);
    }
}
