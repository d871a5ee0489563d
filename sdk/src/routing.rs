//! Routing to the owning core: the broker has one QUIC endpoint shared by all its cores (the
//! kernel spreads connections over them) and, per core, an endpoint of its own. A request that
//! reaches a core not owning its partition is forwarded over the broker's internal mesh — one
//! hop more. For requests that name a partition (produce to one, fetch from one, a FIFO send
//! whose message group picks one), the client asks once where each partition lives
//! (`GetRouting`), connects to that core's own endpoint and sends them there. Anything that
//! fails on the way falls back to the shared connection.

use std::collections::HashMap;
use std::net::SocketAddr;
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
}

impl Routes {
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
        let r = wire::GetRoutingRequest {
            topic: topic.into(),
        };
        let got = match self.call(Request::GetRouting(r)).await? {
            Response::GetRouting(g) => g,
            other => return crate::unexpected(other),
        };
        routes.shard_addrs = Some(
            got.shard_addrs
                .iter()
                .map(|a| a.parse::<SocketAddr>().ok())
                .collect(),
        );
        let p = Arc::new(got.partition_shards);
        routes.placements.insert(topic.to_string(), p.clone());
        Ok(p)
    }

    async fn route(&self, topic: &str, partition: u32) -> Result<Option<Client>> {
        let placement = self.placement(topic).await?;
        let Some(shard) = placement.get(partition as usize).map(|s| *s as usize) else {
            return Ok(None); // an unknown partition: the broker will say so
        };
        let mut routes = self.inner.routes.lock().await;
        if let Some(c) = routes.clients.get(&shard) {
            return Ok(Some(c.clone()));
        }
        let Some(Some(addr)) = routes.shard_addrs.as_ref().and_then(|a| a.get(shard)) else {
            return Ok(None);
        };
        let options = crate::ClientOptions {
            route_to_owner: false,
            ..self.inner.options.clone()
        };
        match Client::connect(*addr, options).await {
            Ok(c) => {
                routes.clients.insert(shard, c.clone());
                Ok(Some(c))
            }
            Err(e) => {
                // Its address is stale (the broker restarted?): learn everything anew later.
                *routes = Routes::default();
                Err(e)
            }
        }
    }

    /// Forgets what routing learnt (after the broker lost a topic, say).
    pub(crate) async fn forget_routes(&self) {
        *self.inner.routes.lock().await = Routes::default();
    }
}
