//! Placement: which shard owns a partition, and which partition a request goes to. Pure
//! functions of the queue and the shard count (plus a rotating start for standard queues), kept
//! apart from the shard so that it can become a replicated table (partition → replicas and
//! leader, changed by log records) without touching the service code that asks it.
//!
//! Today: partition `p` of queue (or topic) `q` lives on shard `(q + p) % shards`, so a queue's
//! partitions spread over the cores. A FIFO message group maps to one partition
//! (`xxh3(group) % partitions`), so log order is group order; standard sends and receives try
//! this shard's partitions first, from a rotating index so load spreads.

use crate::engine::attributes::QueueKind;
use crate::metadata::QueueMeta;
use std::cell::Cell;

/// The hash that places FIFO groups: stable across versions and processes (xxh3), since a
/// group's partition must not move while it holds messages.
pub fn stable_hash(s: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(s.as_bytes())
}

/// The partition of a FIFO group among `partitions`.
pub fn group_partition(group: &str, partitions: u32) -> u32 {
    (stable_hash(group) % u64::from(partitions)) as u32
}

/// Placement as one shard sees it.
pub struct Placement {
    shard: usize,
    shards: usize,
    /// Where the next standard-queue request starts among partitions.
    round_robin: Cell<u64>,
}

impl Placement {
    pub fn new(shard: usize, shards: usize) -> Placement {
        Placement {
            shard,
            shards,
            round_robin: Cell::new(shard as u64),
        }
    }

    /// The shard owning partition `partition` of queue or topic `id`.
    pub fn owner(&self, id: u64, partition: u32) -> usize {
        ((id + u64::from(partition)) % self.shards as u64) as usize
    }

    /// Partitions of `q` in the order a request should try them: those on this shard first
    /// (no cross-core hop), starting at a rotating index so load spreads.
    pub fn partition_order(&self, q: &QueueMeta) -> Vec<u32> {
        let n = q.partitions;
        let start = self.round_robin.get();
        self.round_robin.set(start.wrapping_add(1));
        let mut order: Vec<u32> = (0..n)
            .map(|i| ((start + u64::from(i)) % u64::from(n)) as u32)
            .collect();
        order.sort_by_key(|p| self.owner(q.id, *p) != self.shard);
        order
    }

    /// The partition a send goes to.
    pub fn send_partition(&self, q: &QueueMeta, group: Option<&str>) -> u32 {
        match (q.kind, group) {
            // FIFO: a group lives in one partition, so its order is one log's order.
            (QueueKind::Fifo, Some(g)) => group_partition(g, q.partitions),
            _ => self.partition_order(q)[0],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_spread_partitions_over_shards() {
        let p = Placement::new(0, 4);
        let owners: Vec<usize> = (0..4).map(|i| p.owner(6, i)).collect();
        assert_eq!(owners, vec![2, 3, 0, 1]);
    }

    #[test]
    fn a_group_always_maps_to_the_same_partition() {
        for g in ["a", "orders-17", ""] {
            let first = group_partition(g, 8);
            assert!(first < 8);
            assert_eq!(group_partition(g, 8), first);
        }
    }
}
