//! The topic catalog: every topic's definition, identical on every shard. Sans-I/O: shard 0
//! plans a change into a [`MetaRecord`], makes it durable in the metadata log, and every shard
//! applies it here in the same order.

use super::{StreamError, StreamResult};
use crate::metadata::{MetaRecord, META_FORMAT_VERSION};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Topics per tenant: bounds the catalog and the number of open logs.
pub const TOPICS_PER_TENANT_MAX: usize = 10_000;
/// Partitions per topic (each is a log with its own buffers).
pub const PARTITIONS_PER_TOPIC_MAX: u32 = 1024;
/// Topic names: 1–249 characters of `[A-Za-z0-9._-]` (Kafka's rule).
pub const TOPIC_NAME_BYTES_MAX: usize = 249;
/// The smallest segment a topic may ask for (the storage minimum is 16 KiB).
pub const TOPIC_SEGMENT_BYTES_MIN: u64 = 16 * 1024;

/// What a topic is created with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TopicConfig {
    pub partitions: u32,
    /// Delete sealed segments whose newest record is older than this.
    pub retention_ms: Option<u64>,
    /// Delete the oldest sealed segments while a partition is larger than this.
    pub retention_bytes: Option<u64>,
    /// Roll a partition's active segment at this size (default: the broker's log config).
    pub segment_bytes: Option<u64>,
}

/// One topic, as every shard sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMeta {
    pub id: u64,
    pub tenant: String,
    pub name: String,
    pub config: TopicConfig,
    pub created_ms: u64,
}

impl TopicMeta {
    pub fn partitions(&self) -> u32 {
        self.config.partitions
    }
}

#[derive(Debug, Default, Clone)]
pub struct TopicCatalog {
    topics: BTreeMap<u64, Arc<TopicMeta>>,
    by_name: HashMap<(String, String), u64>,
    next_id: u64,
}

pub fn validate_topic_name(name: &str) -> StreamResult<()> {
    let ok = !name.is_empty()
        && name.len() <= TOPIC_NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(StreamError::Invalid(format!(
            "topic names are 1-{TOPIC_NAME_BYTES_MAX} characters of [A-Za-z0-9._-]"
        )))
    }
}

fn validate_config(c: &TopicConfig) -> StreamResult<()> {
    if c.partitions == 0 || c.partitions > PARTITIONS_PER_TOPIC_MAX {
        return Err(StreamError::Invalid(format!(
            "partitions must be within 1..={PARTITIONS_PER_TOPIC_MAX}"
        )));
    }
    if c.retention_ms == Some(0) || c.retention_bytes == Some(0) {
        return Err(StreamError::Invalid("retention limits must be > 0".into()));
    }
    if let Some(s) = c.segment_bytes {
        if !(TOPIC_SEGMENT_BYTES_MIN..u64::from(u32::MAX)).contains(&s) {
            return Err(StreamError::Invalid(
                "segment_bytes must be within [16 KiB, 4 GiB)".into(),
            ));
        }
    }
    Ok(())
}

impl TopicCatalog {
    pub fn get(&self, id: u64) -> Option<Arc<TopicMeta>> {
        self.topics.get(&id).cloned()
    }

    pub fn lookup(&self, tenant: &str, name: &str) -> StreamResult<Arc<TopicMeta>> {
        self.by_name
            .get(&(tenant.to_string(), name.to_string()))
            .and_then(|id| self.get(*id))
            .ok_or_else(|| StreamError::UnknownTopic(name.to_string()))
    }

    pub fn list(&self, tenant: &str) -> Vec<Arc<TopicMeta>> {
        self.topics
            .values()
            .filter(|t| t.tenant == tenant)
            .cloned()
            .collect()
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<TopicMeta>> {
        self.topics.values()
    }

    /// Decides the record for a CreateTopic: a new topic, `None` if an identical one exists
    /// (idempotent), or an error.
    pub fn plan_create(
        &self,
        tenant: &str,
        name: &str,
        config: TopicConfig,
        now_ms: u64,
    ) -> StreamResult<Option<MetaRecord>> {
        validate_topic_name(name)?;
        validate_config(&config)?;
        if let Ok(t) = self.lookup(tenant, name) {
            return if t.config == config {
                Ok(None)
            } else {
                Err(StreamError::TopicExists(name.to_string()))
            };
        }
        if self.topics.values().filter(|t| t.tenant == tenant).count() >= TOPICS_PER_TENANT_MAX {
            return Err(StreamError::LimitExceeded("topics per tenant"));
        }
        Ok(Some(MetaRecord::TopicCreated {
            v: META_FORMAT_VERSION,
            id: self.next_id.max(1),
            tenant: tenant.to_string(),
            name: name.to_string(),
            partitions: config.partitions,
            retention_ms: config.retention_ms,
            retention_bytes: config.retention_bytes,
            segment_bytes: config.segment_bytes,
            at_ms: now_ms,
        }))
    }

    /// Decides the record for a change of a topic's partitions or retention: `None` when
    /// nothing changes. Partitions only grow (Kafka's rule: keyed records would move); the
    /// segment size is not changed here (open logs keep theirs).
    pub fn plan_alter(
        &self,
        id: u64,
        config: TopicConfig,
        now_ms: u64,
    ) -> StreamResult<Option<MetaRecord>> {
        let t = self
            .get(id)
            .ok_or_else(|| StreamError::UnknownTopic(format!("topic id {id}")))?;
        validate_config(&config)?;
        if config.partitions < t.partitions() {
            return Err(StreamError::Invalid(format!(
                "topic {} has {} partitions: partitions can be added, not removed",
                t.name,
                t.partitions()
            )));
        }
        if config.segment_bytes != t.config.segment_bytes {
            return Err(StreamError::Invalid(
                "segment.bytes is set when a topic is created".into(),
            ));
        }
        if config == t.config {
            return Ok(None);
        }
        Ok(Some(MetaRecord::TopicAltered {
            v: META_FORMAT_VERSION,
            id,
            partitions: config.partitions,
            retention_ms: config.retention_ms,
            retention_bytes: config.retention_bytes,
            at_ms: now_ms,
        }))
    }

    /// Applies a durable record (queue records are ignored: they are the queue catalog's).
    pub fn apply(&mut self, r: &MetaRecord) {
        match r {
            MetaRecord::TopicCreated {
                id,
                tenant,
                name,
                partitions,
                retention_ms,
                retention_bytes,
                segment_bytes,
                at_ms,
                ..
            } => {
                let t = TopicMeta {
                    id: *id,
                    tenant: tenant.clone(),
                    name: name.clone(),
                    config: TopicConfig {
                        partitions: (*partitions).clamp(1, PARTITIONS_PER_TOPIC_MAX),
                        retention_ms: *retention_ms,
                        retention_bytes: *retention_bytes,
                        segment_bytes: *segment_bytes,
                    },
                    created_ms: *at_ms,
                };
                self.by_name.insert((tenant.clone(), name.clone()), *id);
                self.topics.insert(*id, Arc::new(t));
                self.next_id = self.next_id.max(id + 1);
            }
            MetaRecord::TopicAltered {
                id,
                partitions,
                retention_ms,
                retention_bytes,
                ..
            } => {
                if let Some(t) = self.topics.get_mut(id) {
                    let mut m = (**t).clone();
                    // Never fewer: partitions hold data (`plan_alter` refuses it too).
                    m.config.partitions = (*partitions).clamp(
                        m.config.partitions,
                        PARTITIONS_PER_TOPIC_MAX.max(m.config.partitions),
                    );
                    m.config.retention_ms = *retention_ms;
                    m.config.retention_bytes = *retention_bytes;
                    *t = Arc::new(m);
                }
            }
            MetaRecord::TopicDeleted { id, .. } => {
                if let Some(t) = self.topics.remove(id) {
                    self.by_name.remove(&(t.tenant.clone(), t.name.clone()));
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(p: u32) -> TopicConfig {
        TopicConfig {
            partitions: p,
            ..TopicConfig::default()
        }
    }

    #[test]
    fn create_is_idempotent_conflicts_and_bad_input_are_typed_errors() {
        let mut c = TopicCatalog::default();
        let r = c.plan_create("t", "events", cfg(3), 1).unwrap().unwrap();
        c.apply(&r);
        assert!(c.plan_create("t", "events", cfg(3), 2).unwrap().is_none());
        assert!(matches!(
            c.plan_create("t", "events", cfg(4), 2),
            Err(StreamError::TopicExists(_))
        ));
        assert!(c.plan_create("t", "", cfg(1), 2).is_err());
        assert!(c.plan_create("t", "a/b", cfg(1), 2).is_err());
        assert!(c.plan_create("t", "x", cfg(0), 2).is_err());
        assert!(c.plan_create("t", "x", cfg(100_000), 2).is_err());
        let t = c.lookup("t", "events").unwrap();
        assert_eq!(t.partitions(), 3);
        // Records round-trip through the metadata encoding.
        assert_eq!(MetaRecord::decode(&r.encode()), Ok(r));
        // Partitions grow, never shrink; retention changes; the segment size stays.
        let id = t.id;
        let mut more = t.config.clone();
        more.partitions = 5;
        more.retention_ms = Some(60_000);
        let r = c.plan_alter(id, more.clone(), 3).unwrap().unwrap();
        assert_eq!(MetaRecord::decode(&r.encode()), Ok(r.clone()));
        c.apply(&r);
        assert_eq!(c.lookup("t", "events").unwrap().config, more);
        assert!(c.plan_alter(id, more.clone(), 3).unwrap().is_none());
        let fewer = TopicConfig {
            partitions: 4,
            ..more.clone()
        };
        assert!(matches!(
            c.plan_alter(id, fewer, 3),
            Err(StreamError::Invalid(_))
        ));
        let segment = TopicConfig {
            segment_bytes: Some(1 << 20),
            ..more
        };
        assert!(c.plan_alter(id, segment, 3).is_err());

        c.apply(&MetaRecord::TopicDeleted {
            v: 1,
            id: t.id,
            at_ms: 3,
        });
        assert!(matches!(
            c.lookup("t", "events"),
            Err(StreamError::UnknownTopic(_))
        ));
        // Ids are never reused.
        let r2 = c.plan_create("t", "events", cfg(1), 4).unwrap().unwrap();
        assert!(matches!(r2, MetaRecord::TopicCreated { id, .. } if id > t.id));
    }
}
