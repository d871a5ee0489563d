//! [`Slot`]: a queue partition as its owning shard holds it — its actor on a local log
//! (single node), or its supervisor in a cluster, which runs the actor only while this node
//! leads the partition's replicas (`crate::cluster::shard`).

use std::path::Path;
use std::rc::Rc;

use super::partition::PartitionActor;
use crate::cluster::shard::Supervisor;
use crate::engine::{Command, Counters, PartitionConfig, Reply};
use crate::error::ServiceResult;

#[derive(Clone)]
pub enum Slot {
    Local(Rc<PartitionActor>),
    Replicated(Rc<Supervisor>),
}

impl Slot {
    /// Runs `cmd` on the partition's actor; `NotLeader` in a cluster where another node leads.
    pub async fn execute(&self, cmd: Command) -> ServiceResult<Reply> {
        match self {
            Slot::Local(a) => a.execute(cmd).await,
            Slot::Replicated(s) => s.actor()?.execute(cmd).await,
        }
    }

    pub async fn wait_ready(&self, deadline_ms: u64) -> ServiceResult<bool> {
        match self {
            Slot::Local(a) => a.wait_ready(deadline_ms).await,
            Slot::Replicated(s) => s.actor()?.wait_ready(deadline_ms).await,
        }
    }

    pub fn counters(&self) -> ServiceResult<Counters> {
        match self {
            Slot::Local(a) => Ok(a.counters()),
            Slot::Replicated(s) => Ok(s.actor()?.counters()),
        }
    }

    /// The partition's metrics, where this node runs its actor (a follower reports none:
    /// the leader's scrape counts it once).
    pub fn metrics(&self) -> Option<crate::metrics::PartitionSnapshot> {
        match self {
            Slot::Local(a) => Some(a.metrics()),
            Slot::Replicated(s) => s.actor().ok().map(|a| a.metrics()),
        }
    }

    /// The bytes the partition's log holds on this node.
    pub fn size_bytes(&self) -> u64 {
        match self {
            Slot::Local(a) => {
                use crate::partition_log::PartitionLog;
                a.log().size_bytes()
            }
            Slot::Replicated(s) => s.log_size_bytes(),
        }
    }

    /// New queue attributes: the actor takes them (and its leader records a `Configured`
    /// record in the partition's log); a supervisor keeps them for the actors it opens later.
    pub async fn configure(&self, config: PartitionConfig) -> ServiceResult<()> {
        let attrs = Box::new(config.attributes.clone());
        match self {
            Slot::Local(a) => {
                a.set_config(config);
                a.execute(Command::SetAttributes(attrs)).await?;
            }
            Slot::Replicated(s) => {
                s.set_config(config.clone());
                if let Ok(a) = s.actor() {
                    a.set_config(config);
                    a.execute(Command::SetAttributes(attrs)).await?;
                }
            }
        }
        Ok(())
    }

    /// Stops serving: a local actor commits what is staged and closes its log; a supervisor
    /// halts its actor (the replica is the cluster host's to drop).
    pub async fn close(&self) -> ServiceResult<()> {
        match self {
            Slot::Local(a) => a.close().await,
            Slot::Replicated(s) => {
                s.stop();
                Ok(())
            }
        }
    }

    pub fn dir(&self) -> &Path {
        match self {
            Slot::Local(a) => a.dir(),
            Slot::Replicated(s) => s.dir(),
        }
    }

    /// The local actor, for reading a queue's log as a stream (`queue:<name>`); a replicated
    /// partition's view is not served yet.
    pub fn local(&self) -> Option<Rc<PartitionActor>> {
        match self {
            Slot::Local(a) => Some(a.clone()),
            Slot::Replicated(_) => None,
        }
    }
}
