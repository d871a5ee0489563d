//! Queue definitions: the catalog of tenants' queues, kept durably in a metadata log.
//!
//! Shard 0 owns the metadata log (`<data>/meta/`) and decides every change; each change is a
//! [`MetaRecord`], made durable, then applied by every shard to its own replica of the
//! [`Catalog`] (the same deterministic `apply` everywhere), so that any shard can resolve a
//! queue name without a cross-core hop. Records are JSON with a version field: metadata is
//! small, rare and worth being readable with `sluice log dump`.
//!
//! Record versions (every one from [`META_FORMAT_VERSION_MIN`] on is still read; records are
//! written in [`META_FORMAT_VERSION`]):
//!
//! | v | records                                                                            |
//! |---|------------------------------------------------------------------------------------|
//! | 1 | queue records (`QueueCreated`, `AttributesSet`, `TagsSet`, `QueueDeleted`); later, |
//! |   | without a bump, topic records (`TopicCreated`, whose retention and segment fields  |
//! |   | may be absent, and `TopicDeleted`)                                                 |
//! | 2 | the same records: the bump tells a reader that topic records may follow, so a      |
//! |   | build that knows only version 1 refuses the log instead of misreading it; later,   |
//! |   | without a bump, `TopicAltered` (Kafka's CreatePartitions and AlterConfigs), which  |
//! |   | a build that does not know it refuses as malformed, never skips                    |

use crate::engine::attributes::{validate_queue_name, QueueAttributes, QueueKind};
use crate::engine::EngineError;
use crate::error::{ServiceError, ServiceResult};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The version of the records this build writes (see the table above).
pub const META_FORMAT_VERSION: u32 = 2;
/// The oldest record version this build reads.
pub const META_FORMAT_VERSION_MIN: u32 = 1;
/// Queues per tenant (SQS has no hard limit on queues; this bounds the catalog's memory).
/// Tags per queue (SQS: 50).
pub const TAGS_PER_QUEUE_MAX: usize = 50;
/// SQS: a deleted queue's name cannot be reused for 60 s.
pub const NAME_REUSE_DELAY_MS: u64 = 60_000;
/// The account id of the embedded single-tenant default.
pub const DEFAULT_TENANT: &str = "000000000000";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum MetaRecord {
    QueueCreated {
        v: u32,
        id: u64,
        tenant: String,
        name: String,
        /// Attributes as given (defaults are implied).
        attributes: BTreeMap<String, String>,
        tags: BTreeMap<String, String>,
        partitions: u32,
        at_ms: u64,
    },
    AttributesSet {
        v: u32,
        id: u64,
        attributes: BTreeMap<String, String>,
        at_ms: u64,
    },
    TagsSet {
        v: u32,
        id: u64,
        tags: BTreeMap<String, String>,
        at_ms: u64,
    },
    QueueDeleted {
        v: u32,
        id: u64,
        at_ms: u64,
    },
    /// A stream topic (`crate::stream`); ids are the topic catalog's own.
    TopicCreated {
        v: u32,
        id: u64,
        tenant: String,
        name: String,
        partitions: u32,
        #[serde(default)]
        retention_ms: Option<u64>,
        #[serde(default)]
        retention_bytes: Option<u64>,
        #[serde(default)]
        segment_bytes: Option<u64>,
        at_ms: u64,
    },
    TopicDeleted {
        v: u32,
        id: u64,
        at_ms: u64,
    },
    /// A topic's new configuration, whole: more partitions (never fewer) or new retention
    /// limits. Its segment size stays what the topic was created with.
    TopicAltered {
        v: u32,
        id: u64,
        partitions: u32,
        retention_ms: Option<u64>,
        retention_bytes: Option<u64>,
        at_ms: u64,
    },
}

impl MetaRecord {
    /// One log line for a catalog change made durable on shard 0 (names and ids only: never
    /// attribute values or tags, which are the operator's data).
    pub fn log_durable(&self) {
        match self {
            MetaRecord::QueueCreated {
                id,
                tenant,
                name,
                partitions,
                ..
            } => tracing::info!(id, %tenant, %name, partitions, "queue created"),
            MetaRecord::AttributesSet { id, .. } => tracing::info!(id, "queue attributes set"),
            MetaRecord::TagsSet { id, .. } => tracing::debug!(id, "queue tags set"),
            MetaRecord::QueueDeleted { id, .. } => tracing::info!(id, "queue deleted"),
            MetaRecord::TopicCreated {
                id,
                tenant,
                name,
                partitions,
                ..
            } => tracing::info!(id, %tenant, %name, partitions, "topic created"),
            MetaRecord::TopicDeleted { id, .. } => tracing::info!(id, "topic deleted"),
            MetaRecord::TopicAltered { id, partitions, .. } => {
                tracing::info!(id, partitions, "topic altered")
            }
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("metadata records always serialize")
    }

    /// [`MetaRecord::parse`], its error as text (for the replay loop's internal error).
    pub fn decode(b: &[u8]) -> Result<MetaRecord, String> {
        MetaRecord::parse(b).map_err(|e| e.to_string())
    }

    /// A record of any version this build reads; a version outside them is its own error, so
    /// a log written by a newer build is refused, never misread.
    pub fn parse(b: &[u8]) -> Result<MetaRecord, MetaDecodeError> {
        let r: MetaRecord =
            serde_json::from_slice(b).map_err(|e| MetaDecodeError::Malformed(e.to_string()))?;
        let v = match &r {
            MetaRecord::QueueCreated { v, .. }
            | MetaRecord::AttributesSet { v, .. }
            | MetaRecord::TagsSet { v, .. }
            | MetaRecord::QueueDeleted { v, .. }
            | MetaRecord::TopicCreated { v, .. }
            | MetaRecord::TopicDeleted { v, .. }
            | MetaRecord::TopicAltered { v, .. } => *v,
        };
        if !(META_FORMAT_VERSION_MIN..=META_FORMAT_VERSION).contains(&v) {
            return Err(MetaDecodeError::UnsupportedVersion {
                found: v,
                min: META_FORMAT_VERSION_MIN,
                max: META_FORMAT_VERSION,
            });
        }
        Ok(r)
    }
}

/// Why a metadata record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaDecodeError {
    #[error("malformed metadata record: {0}")]
    Malformed(String),
    #[error("unsupported metadata record version {found} (this build reads {min} to {max})")]
    UnsupportedVersion { found: u32, min: u32, max: u32 },
}

/// One queue's definition, as every shard sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueMeta {
    pub id: u64,
    pub tenant: String,
    pub name: String,
    pub kind: QueueKind,
    pub attributes: BTreeMap<String, String>,
    pub parsed: QueueAttributes,
    pub tags: BTreeMap<String, String>,
    pub partitions: u32,
    pub created_ms: u64,
    pub modified_ms: u64,
}

impl QueueMeta {
    pub fn arn(&self, region: &str) -> String {
        format!("arn:aws:sqs:{region}:{}:{}", self.tenant, self.name)
    }

    /// The value of every static attribute (defaults included), as GetQueueAttributes shows it.
    pub fn static_attributes(&self, region: &str) -> BTreeMap<String, String> {
        let a = &self.parsed;
        let mut m = BTreeMap::new();
        m.insert("QueueArn".into(), self.arn(region));
        m.insert(
            "VisibilityTimeout".into(),
            a.visibility_timeout_s.to_string(),
        );
        m.insert("MessageRetentionPeriod".into(), a.retention_s.to_string());
        m.insert("DelaySeconds".into(), a.delay_s.to_string());
        m.insert(
            "ReceiveMessageWaitTimeSeconds".into(),
            a.wait_time_s.to_string(),
        );
        m.insert(
            "MaximumMessageSize".into(),
            a.message_size_bytes_max.to_string(),
        );
        m.insert(
            "CreatedTimestamp".into(),
            (self.created_ms / 1000).to_string(),
        );
        m.insert(
            "LastModifiedTimestamp".into(),
            (self.modified_ms / 1000).to_string(),
        );
        m.insert("SqsManagedSseEnabled".into(), "false".into());
        if a.stream_retention_s > 0 {
            // Sluice's own attribute: shown once set, so a plain SQS queue looks like one.
            m.insert(
                "StreamRetentionPeriod".into(),
                a.stream_retention_s.to_string(),
            );
        }
        if self.kind == QueueKind::Fifo {
            m.insert("FifoQueue".into(), "true".into());
            m.insert(
                "ContentBasedDeduplication".into(),
                a.content_based_dedup.to_string(),
            );
            m.insert(
                "DeduplicationScope".into(),
                match a.dedup_scope {
                    crate::engine::attributes::DedupScope::Queue => "queue",
                    crate::engine::attributes::DedupScope::MessageGroup => "messageGroup",
                }
                .into(),
            );
            m.insert(
                "FifoThroughputLimit".into(),
                match a.fifo_throughput_limit {
                    crate::engine::attributes::FifoThroughputLimit::PerQueue => "perQueue",
                    crate::engine::attributes::FifoThroughputLimit::PerMessageGroupId => {
                        "perMessageGroupId"
                    }
                }
                .into(),
            );
        }
        // Attributes set explicitly and not derived above (RedrivePolicy, Policy, …) are shown
        // as they were given.
        for (k, v) in &self.attributes {
            if !v.is_empty() {
                m.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        m
    }
}

/// Every queue, by id and by (tenant, name). Identical on every shard.
#[derive(Debug, Clone)]
pub struct Catalog {
    queues: BTreeMap<u64, Arc<QueueMeta>>,
    by_name: HashMap<(String, String), u64>,
    /// Recently deleted names and when, for the 60 s reuse rule.
    deleted: HashMap<(String, String), u64>,
    next_id: u64,
    /// Queues one account may hold (`[quotas] queues_per_account`).
    queues_per_account: usize,
}

impl Default for Catalog {
    fn default() -> Self {
        Catalog::new(crate::auth::quota::QUEUES_PER_ACCOUNT_DEFAULT)
    }
}

impl Catalog {
    pub fn new(queues_per_account: usize) -> Self {
        Catalog {
            queues: BTreeMap::new(),
            by_name: HashMap::new(),
            deleted: HashMap::new(),
            next_id: 0,
            queues_per_account,
        }
    }

    pub fn get(&self, id: u64) -> Option<Arc<QueueMeta>> {
        self.queues.get(&id).cloned()
    }

    pub fn lookup(&self, tenant: &str, name: &str) -> ServiceResult<Arc<QueueMeta>> {
        self.by_name
            .get(&(tenant.to_string(), name.to_string()))
            .and_then(|id| self.get(*id))
            .ok_or(ServiceError::NonExistentQueue)
    }

    /// Finds a queue by its ARN (redrive targets name queues by ARN).
    pub fn lookup_arn(&self, arn: &str) -> Option<Arc<QueueMeta>> {
        let mut parts = arn.splitn(6, ':');
        let (_, _, _, _region, tenant, name) = (
            parts.next()?,
            parts.next()?,
            parts.next()?,
            parts.next()?,
            parts.next()?,
            parts.next()?,
        );
        self.lookup(tenant, name).ok()
    }

    pub fn list(&self, tenant: &str, prefix: &str) -> Vec<Arc<QueueMeta>> {
        self.queues
            .values()
            .filter(|q| q.tenant == tenant && q.name.starts_with(prefix))
            .cloned()
            .collect()
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<QueueMeta>> {
        self.queues.values()
    }

    pub fn next_id(&self) -> u64 {
        self.next_id.max(1)
    }

    /// Decides the record for a CreateQueue (on shard 0): a new queue, or `None` if an
    /// identical one exists (CreateQueue is idempotent), or an error.
    pub fn plan_create(
        &self,
        tenant: &str,
        name: &str,
        attributes: BTreeMap<String, String>,
        tags: BTreeMap<String, String>,
        partitions: u32,
        now_ms: u64,
    ) -> ServiceResult<Option<MetaRecord>> {
        let kind = validate_queue_name(name)?;
        // As SQS: a name ending in .fifo is a FIFO queue only when asked for, never by accident
        // (a standard queue's name cannot contain a dot).
        if kind == QueueKind::Fifo
            && !attributes
                .get("FifoQueue")
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        {
            return Err(EngineError::param(
                "QueueName",
                "a name ending in .fifo needs the attribute FifoQueue=true; a standard queue's \
                 name can only include alphanumeric characters, hyphens and underscores",
            )
            .into());
        }
        QueueAttributes::from_pairs(
            kind,
            attributes.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        )?;
        validate_tags(&tags)?;
        if let Ok(q) = self.lookup(tenant, name) {
            return if q.attributes == attributes {
                Ok(None)
            } else {
                Err(ServiceError::QueueNameExists)
            };
        }
        if let Some(at) = self.deleted.get(&(tenant.to_string(), name.to_string())) {
            if now_ms < at + NAME_REUSE_DELAY_MS {
                return Err(ServiceError::QueueDeletedRecently);
            }
        }
        if self.queues.values().filter(|q| q.tenant == tenant).count() >= self.queues_per_account {
            return Err(ServiceError::TooManyQueues(self.queues_per_account));
        }
        Ok(Some(MetaRecord::QueueCreated {
            v: META_FORMAT_VERSION,
            id: self.next_id(),
            tenant: tenant.to_string(),
            name: name.to_string(),
            attributes,
            tags,
            partitions,
            at_ms: now_ms,
        }))
    }

    /// A RedrivePolicy's dead-letter target must be an existing queue of the same account,
    /// region and type, and not the queue itself (as SQS requires). A target in another
    /// account is reported exactly as one that does not exist, so a policy cannot probe other
    /// tenants. Checked when a policy is set; a DLQ deleted later makes dead-letter moves wait
    /// for it (`Shard::try_forward_move`), and moves look the target up in the source's account
    /// only, whatever an older record says.
    pub fn check_redrive_target(
        &self,
        tenant: &str,
        name: &str,
        kind: QueueKind,
        policy: &str,
        region: &str,
    ) -> ServiceResult<()> {
        let parsed = QueueAttributes::from_pairs(kind, [("RedrivePolicy", policy)])?;
        let Some(p) = parsed.redrive_policy else {
            return Ok(()); // an empty policy removes the redrive
        };
        let invalid =
            |why: &str| -> ServiceError { EngineError::attr("RedrivePolicy", why).into() };
        let target = self
            .lookup_arn(&p.dead_letter_target_arn)
            .filter(|t| t.tenant == tenant && t.arn(region) == p.dead_letter_target_arn)
            .ok_or_else(|| invalid("the dead-letter target does not exist"))?;
        if target.name == name {
            return Err(invalid("a queue cannot be its own dead-letter queue"));
        }
        if target.kind != kind {
            return Err(invalid(match kind {
                QueueKind::Fifo => "the dead-letter queue of a FIFO queue must be a FIFO queue",
                QueueKind::Standard => {
                    "the dead-letter queue of a standard queue must be a standard queue"
                }
            }));
        }
        Ok(())
    }

    /// The dead-letter queue a source's RedrivePolicy names, looked up in the source's own
    /// account only.
    pub fn dead_letter_target(&self, source: &QueueMeta, region: &str) -> Option<Arc<QueueMeta>> {
        let arn = &source
            .parsed
            .redrive_policy
            .as_ref()?
            .dead_letter_target_arn;
        self.lookup_arn(arn)
            .filter(|t| t.tenant == source.tenant && t.arn(region) == *arn)
    }

    /// Decides the record for SetQueueAttributes: the merged explicit attributes, validated.
    pub fn plan_set_attributes(
        &self,
        q: &QueueMeta,
        changes: &BTreeMap<String, String>,
        now_ms: u64,
    ) -> ServiceResult<MetaRecord> {
        let mut merged = q.attributes.clone();
        for (k, v) in changes {
            if k == "FifoQueue" {
                // Settable only at creation. As SQS: a standard queue has no such attribute; a
                // FIFO queue accepts its own value and refuses a change of type.
                if q.kind != QueueKind::Fifo {
                    return Err(EngineError::InvalidAttributeName(k.clone()).into());
                }
                if !v.eq_ignore_ascii_case("true") {
                    return Err(
                        EngineError::attr(k, "Modifying queue type is not supported").into(),
                    );
                }
                continue;
            }
            merged.insert(k.clone(), v.clone());
        }
        QueueAttributes::from_pairs(q.kind, merged.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
        Ok(MetaRecord::AttributesSet {
            v: META_FORMAT_VERSION,
            id: q.id,
            attributes: merged,
            at_ms: now_ms,
        })
    }

    /// Applies a durable record. Deterministic: every shard applies the same records in the same
    /// order and holds the same catalog.
    pub fn apply(&mut self, r: &MetaRecord) -> Result<(), String> {
        match r {
            MetaRecord::QueueCreated {
                id,
                tenant,
                name,
                attributes,
                tags,
                partitions,
                at_ms,
                ..
            } => {
                let kind = validate_queue_name(name).map_err(|e| e.to_string())?;
                let parsed = QueueAttributes::from_pairs(
                    kind,
                    attributes.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                )
                .map_err(|e| e.to_string())?;
                let q = QueueMeta {
                    id: *id,
                    tenant: tenant.clone(),
                    name: name.clone(),
                    kind,
                    attributes: attributes.clone(),
                    parsed,
                    tags: tags.clone(),
                    partitions: (*partitions).max(1),
                    created_ms: *at_ms,
                    modified_ms: *at_ms,
                };
                self.by_name.insert((tenant.clone(), name.clone()), *id);
                self.deleted.remove(&(tenant.clone(), name.clone()));
                self.queues.insert(*id, Arc::new(q));
                self.next_id = self.next_id.max(id + 1);
            }
            MetaRecord::AttributesSet {
                id,
                attributes,
                at_ms,
                ..
            } => {
                let q = self
                    .queues
                    .get_mut(id)
                    .ok_or("attributes for unknown queue")?;
                let mut m = (**q).clone();
                m.parsed = QueueAttributes::from_pairs(
                    m.kind,
                    attributes.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                )
                .map_err(|e| e.to_string())?;
                m.attributes = attributes.clone();
                m.modified_ms = *at_ms;
                *q = Arc::new(m);
            }
            MetaRecord::TagsSet { id, tags, .. } => {
                let q = self.queues.get_mut(id).ok_or("tags for unknown queue")?;
                let mut m = (**q).clone();
                m.tags = tags.clone();
                *q = Arc::new(m);
            }
            MetaRecord::QueueDeleted { id, at_ms, .. } => {
                if let Some(q) = self.queues.remove(id) {
                    let key = (q.tenant.clone(), q.name.clone());
                    self.by_name.remove(&key);
                    self.deleted.insert(key, *at_ms);
                }
            }
            // Topics are the stream catalog's (`crate::stream::catalog`).
            MetaRecord::TopicCreated { .. }
            | MetaRecord::TopicDeleted { .. }
            | MetaRecord::TopicAltered { .. } => {}
        }
        Ok(())
    }
}

pub fn validate_tags(tags: &BTreeMap<String, String>) -> ServiceResult<()> {
    if tags.len() > TAGS_PER_QUEUE_MAX {
        return Err(EngineError::param("Tags", "at most 50 tags per queue").into());
    }
    for (k, v) in tags {
        if k.is_empty() || k.len() > 128 || v.len() > 256 {
            return Err(EngineError::param(
                "Tags",
                "tag keys must be 1-128 characters and values at most 256",
            )
            .into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_is_idempotent_and_conflicts_are_errors() {
        let mut c = Catalog::default();
        let attrs: BTreeMap<_, _> = [("VisibilityTimeout".to_string(), "10".to_string())].into();
        let r = c
            .plan_create("1", "q", attrs.clone(), BTreeMap::new(), 2, 5)
            .expect("plan")
            .expect("new");
        c.apply(&r).expect("apply");
        assert!(c
            .plan_create("1", "q", attrs, BTreeMap::new(), 2, 6)
            .expect("plan")
            .is_none());
        assert!(matches!(
            c.plan_create("1", "q", BTreeMap::new(), BTreeMap::new(), 2, 6),
            Err(ServiceError::QueueNameExists)
        ));
        // Another tenant may use the name.
        assert!(c
            .plan_create("2", "q", BTreeMap::new(), BTreeMap::new(), 2, 6)
            .expect("plan")
            .is_some());
        let q = c.lookup("1", "q").expect("exists");
        assert_eq!(q.parsed.visibility_timeout_s, 10);
        assert_eq!(c.lookup_arn(&q.arn("us-east-1")).map(|q| q.id), Some(q.id));
        let del = MetaRecord::QueueDeleted {
            v: 1,
            id: q.id,
            at_ms: 100,
        };
        c.apply(&del).expect("apply");
        assert!(matches!(
            c.lookup("1", "q"),
            Err(ServiceError::NonExistentQueue)
        ));
        assert!(matches!(
            c.plan_create("1", "q", BTreeMap::new(), BTreeMap::new(), 2, 200),
            Err(ServiceError::QueueDeletedRecently)
        ));
        assert!(c
            .plan_create(
                "1",
                "q",
                BTreeMap::new(),
                BTreeMap::new(),
                2,
                100 + NAME_REUSE_DELAY_MS
            )
            .expect("plan")
            .is_some());
    }

    fn create(c: &mut Catalog, tenant: &str, name: &str, attrs: &[(&str, &str)]) {
        let attrs = attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let r = c
            .plan_create(tenant, name, attrs, BTreeMap::new(), 1, 1)
            .expect("plan")
            .expect("new");
        c.apply(&r).expect("apply");
    }

    #[test]
    fn redrive_targets_stay_in_their_account_region_and_type() {
        const R: &str = "us-east-1";
        let mut c = Catalog::default();
        create(&mut c, "111111111111", "dlq", &[]);
        create(&mut c, "111111111111", "src", &[]);
        create(&mut c, "111111111111", "f.fifo", &[("FifoQueue", "true")]);
        create(&mut c, "222222222222", "theirs", &[]);
        let policy =
            |arn: &str| format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":3}}"#);
        let check = |name: &str, kind: QueueKind, arn: &str| {
            c.check_redrive_target("111111111111", name, kind, &policy(arn), R)
        };
        check(
            "src",
            QueueKind::Standard,
            "arn:aws:sqs:us-east-1:111111111111:dlq",
        )
        .expect("ok");
        check("src", QueueKind::Standard, "").expect_err("no arn");
        for (name, kind, arn) in [
            // Another account's queue: refused as if it did not exist.
            (
                "src",
                QueueKind::Standard,
                "arn:aws:sqs:us-east-1:222222222222:theirs",
            ),
            (
                "src",
                QueueKind::Standard,
                "arn:aws:sqs:us-east-1:111111111111:nope",
            ),
            (
                "src",
                QueueKind::Standard,
                "arn:aws:sqs:eu-west-1:111111111111:dlq",
            ),
            (
                "src",
                QueueKind::Standard,
                "arn:aws:sqs:us-east-1:111111111111:src",
            ),
            (
                "src",
                QueueKind::Standard,
                "arn:aws:sqs:us-east-1:111111111111:f.fifo",
            ),
            (
                "g.fifo",
                QueueKind::Fifo,
                "arn:aws:sqs:us-east-1:111111111111:dlq",
            ),
        ] {
            let e = check(name, kind, arn).expect_err(arn);
            assert_eq!(e.info().code, "InvalidAttributeValue", "{arn}: {e}");
        }
        let cross = policy("arn:aws:sqs:us-east-1:222222222222:theirs");
        let missing = policy("arn:aws:sqs:us-east-1:111111111111:nope");
        assert_eq!(
            c.check_redrive_target("111111111111", "src", QueueKind::Standard, &cross, R)
                .expect_err("cross")
                .to_string()
                .replace("222222222222:theirs", "X"),
            c.check_redrive_target("111111111111", "src", QueueKind::Standard, &missing, R)
                .expect_err("missing")
                .to_string()
                .replace("111111111111:nope", "X"),
            "another account's queue reads as a missing one"
        );
        // A source whose (older) record names another account's queue finds no target.
        create(&mut c, "111111111111", "old", &[("RedrivePolicy", &cross)]);
        let old = c.lookup("111111111111", "old").expect("exists");
        assert!(c.dead_letter_target(&old, R).is_none());
        create(
            &mut c,
            "111111111111",
            "good",
            &[(
                "RedrivePolicy",
                &policy("arn:aws:sqs:us-east-1:111111111111:dlq"),
            )],
        );
        let good = c.lookup("111111111111", "good").expect("exists");
        assert_eq!(
            c.dead_letter_target(&good, R).map(|q| q.name.clone()),
            Some("dlq".to_string())
        );
    }

    #[test]
    fn records_round_trip_and_reject_other_versions() {
        let r = MetaRecord::TagsSet {
            v: 1,
            id: 3,
            tags: [("a".to_string(), "b".to_string())].into(),
            at_ms: 9,
        };
        assert_eq!(MetaRecord::decode(&r.encode()), Ok(r));
        assert!(MetaRecord::decode(br#"{"type":"QueueDeleted","v":3,"id":1,"at_ms":1}"#).is_err());
        assert!(MetaRecord::decode(b"garbage").is_err());
    }

    /// Records as version 1 wrote them (JSON bytes of the code before the bump): queue and
    /// topic records, a topic with and without the optional fields.
    const V1_RECORDS: [&str; 7] = [
        r#"{"type":"QueueCreated","v":1,"id":1,"tenant":"000000000000","name":"q","attributes":{"VisibilityTimeout":"10"},"tags":{},"partitions":2,"at_ms":5}"#,
        r#"{"type":"AttributesSet","v":1,"id":1,"attributes":{"VisibilityTimeout":"20"},"at_ms":6}"#,
        r#"{"type":"TagsSet","v":1,"id":1,"tags":{"team":"a"},"at_ms":7}"#,
        r#"{"type":"TopicCreated","v":1,"id":1,"tenant":"000000000000","name":"t","partitions":3,"at_ms":8}"#,
        r#"{"type":"TopicCreated","v":1,"id":2,"tenant":"000000000000","name":"u","partitions":1,"retention_ms":60000,"retention_bytes":null,"segment_bytes":1048576,"at_ms":9}"#,
        r#"{"type":"TopicDeleted","v":1,"id":2,"at_ms":10}"#,
        r#"{"type":"QueueCreated","v":1,"id":2,"tenant":"000000000000","name":"gone","attributes":{},"tags":{},"partitions":1,"at_ms":11}"#,
    ];

    /// A metadata log written by version 1 (its records in a log on the simulated disk, read
    /// back the way shard 0 loads it at start-up) still loads into the catalog.
    #[test]
    fn a_metadata_log_of_version_1_records_still_loads() {
        use futures::executor::block_on;
        use sluice_storage::batch::Record;
        use sluice_storage::fs::SimFs;
        use sluice_storage::Log;
        let fs = SimFs::new();
        let dir = std::path::PathBuf::from("/data/meta");
        let config = crate::config::meta_log_config();
        let log = block_on(Log::open(fs.clone(), dir.clone(), config.clone())).expect("open");
        for r in V1_RECORDS {
            block_on(log.append_records(&[Record::new(0, r.as_bytes().to_vec())])).expect("append");
        }
        drop(log);
        let log = block_on(Log::open(fs, dir, config)).expect("reopen");
        let mut records = Vec::new();
        let mut at = log.start_offset();
        while at < log.end_offset() {
            for b in block_on(log.read(at, 1 << 20)).expect("read") {
                for r in b.view().records() {
                    records.push(MetaRecord::parse(r.expect("record").value).expect("a v1 record"));
                }
                at = b.header.next_offset();
            }
        }
        assert_eq!(records.len(), V1_RECORDS.len());
        let mut c = Catalog::default();
        for r in &records {
            c.apply(r).expect("apply");
        }
        let q = c.lookup(DEFAULT_TENANT, "q").expect("queue");
        assert_eq!(q.parsed.visibility_timeout_s, 20);
        assert_eq!(q.tags.get("team").map(String::as_str), Some("a"));
        assert!(c.lookup(DEFAULT_TENANT, "gone").is_ok());
        assert!(matches!(
            &records[3],
            MetaRecord::TopicCreated {
                v: 1,
                retention_ms: None,
                segment_bytes: None,
                ..
            }
        ));
        assert!(matches!(
            &records[4],
            MetaRecord::TopicCreated {
                retention_ms: Some(60_000),
                segment_bytes: Some(1_048_576),
                ..
            }
        ));
        // What this build writes reads back too.
        let now = c
            .plan_create(
                DEFAULT_TENANT,
                "new",
                BTreeMap::new(),
                BTreeMap::new(),
                1,
                20,
            )
            .expect("plan")
            .expect("new queue");
        assert_eq!(MetaRecord::parse(&now.encode()), Ok(now));
    }

    /// A record of a version this build does not know is a typed error, not a panic and not
    /// a misread.
    #[test]
    fn an_unknown_record_version_is_a_typed_error() {
        for v in [0, META_FORMAT_VERSION + 1, u32::MAX] {
            let r = format!(r#"{{"type":"QueueDeleted","v":{v},"id":1,"at_ms":1}}"#);
            assert_eq!(
                MetaRecord::parse(r.as_bytes()),
                Err(MetaDecodeError::UnsupportedVersion {
                    found: v,
                    min: META_FORMAT_VERSION_MIN,
                    max: META_FORMAT_VERSION,
                })
            );
        }
        assert!(matches!(
            MetaRecord::parse(br#"{"type":"QueueRenamed","v":2}"#),
            Err(MetaDecodeError::Malformed(_))
        ));
    }
}
