//! What a received message shows its consumer: the system attributes it asked for and the
//! message attributes its filter selects, with the digest over exactly those. One function for
//! both front ends (SQS HTTP and native QUIC), so the two cannot drift apart; each only encodes
//! the result in its own format.

use crate::engine::attributes::{
    MessageAttribute, QueueKind, MESSAGE_SYSTEM_ATTRIBUTE_NAMES, QUEUE_ATTRIBUTE_NAMES,
};
use crate::engine::md5::{md5_of_attributes, Md5Digest};
use crate::engine::Delivered;
use crate::metadata::QueueMeta;

use super::Shard;

/// The attributes a ReceiveMessage asked for: system attribute names (or "All") and message
/// attribute names (exact names, "All"/".*", or "prefix.*").
#[derive(Debug, Clone)]
pub struct AttributeSelection {
    all_system: bool,
    system: Vec<String>,
    messages: MessageAttributeFilter,
}

#[derive(Debug, Clone)]
enum MessageAttributeFilter {
    All,
    Some {
        names: Vec<String>,
        prefixes: Vec<String>,
    },
}

impl AttributeSelection {
    /// Checks the system attribute names (SQS accepts message system attribute names and, for
    /// the legacy `AttributeNames` parameter, queue attribute names). `Err` carries the first
    /// unknown name.
    pub fn new(system: Vec<String>, message_attribute_names: Vec<String>) -> Result<Self, String> {
        if let Some(bad) = system.iter().find(|n| {
            !MESSAGE_SYSTEM_ATTRIBUTE_NAMES.contains(&n.as_str())
                && !QUEUE_ATTRIBUTE_NAMES.contains(&n.as_str())
        }) {
            return Err(bad.clone());
        }
        let all_system = system.iter().any(|n| n == "All");
        Ok(AttributeSelection {
            all_system,
            system,
            messages: MessageAttributeFilter::new(message_attribute_names),
        })
    }

    fn wants_system(&self, name: &str) -> bool {
        self.all_system || self.system.iter().any(|w| w == name)
    }
}

impl MessageAttributeFilter {
    fn new(list: Vec<String>) -> Self {
        if list.iter().any(|n| n == "All" || n == ".*") {
            return MessageAttributeFilter::All;
        }
        let mut names = Vec::new();
        let mut prefixes = Vec::new();
        for n in list {
            match n.strip_suffix(".*") {
                Some(pre) => prefixes.push(format!("{pre}.")),
                None => names.push(n),
            }
        }
        MessageAttributeFilter::Some { names, prefixes }
    }

    fn matches(&self, name: &str) -> bool {
        match self {
            MessageAttributeFilter::All => true,
            MessageAttributeFilter::Some { names, prefixes } => {
                names.iter().any(|n| n == name)
                    || prefixes.iter().any(|p| name.starts_with(p.as_str()))
            }
        }
    }
}

/// A received message's selected attributes, ready for a front end to encode.
#[derive(Debug, Clone, Default)]
pub struct RenderedAttributes {
    /// System attributes in SQS's order, only those asked for.
    pub system: Vec<(&'static str, String)>,
    /// The selected message attributes.
    pub message_attributes: Vec<MessageAttribute>,
    /// MD5OfMessageAttributes over `message_attributes` (what the SDKs check), if any.
    pub md5_of_message_attributes: Option<Md5Digest>,
}

impl Shard {
    /// The attributes of delivered message `d` of queue `q` that `sel` asks for.
    pub fn render_attributes(
        &self,
        q: &QueueMeta,
        d: &Delivered,
        sel: &AttributeSelection,
    ) -> RenderedAttributes {
        let payload = &d.payload;
        let mut system = Vec::new();
        let mut put = |name: &'static str, v: String| {
            if sel.wants_system(name) {
                system.push((name, v));
            }
        };
        put("SenderId", q.tenant.clone());
        put("SentTimestamp", d.sent_ms.to_string());
        put("ApproximateReceiveCount", d.receive_count.to_string());
        put(
            "ApproximateFirstReceiveTimestamp",
            d.first_receive_ms.to_string(),
        );
        if let Some(n) = d.sequence_number {
            put("SequenceNumber", format!("{n:020}"));
        }
        if q.kind == QueueKind::Fifo {
            if let Some(id) = &payload.dedup_id {
                put("MessageDeduplicationId", id.clone());
            }
        }
        if let Some(g) = &payload.group_id {
            put("MessageGroupId", g.clone());
        }
        if let Some(origin) = &d.dead_letter_source {
            if sel.wants_system("DeadLetterQueueSourceArn") {
                if let Some(src) = self
                    .dead_letter_sources(q)
                    .into_iter()
                    .find(|s| s.id == origin.queue_id)
                {
                    put("DeadLetterQueueSourceArn", src.arn(&self.config.region));
                }
            }
        }
        let selected: Vec<MessageAttribute> = payload
            .attributes
            .iter()
            .filter(|a| sel.messages.matches(&a.name))
            .cloned()
            .collect();
        // The digest covers the attributes returned, as the SDKs check it.
        let md5_of_message_attributes = if selected.is_empty() {
            None
        } else if selected.len() == payload.attributes.len() {
            payload.md5_attributes
        } else {
            md5_of_attributes(&selected)
        };
        RenderedAttributes {
            system,
            message_attributes: selected,
            md5_of_message_attributes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_rejects_unknown_system_names_and_filters_message_names() {
        assert_eq!(
            AttributeSelection::new(vec!["Bogus".into()], vec![]).unwrap_err(),
            "Bogus"
        );
        let sel = AttributeSelection::new(
            vec!["SentTimestamp".into(), "VisibilityTimeout".into()],
            vec!["a".into(), "trace.*".into()],
        )
        .unwrap();
        assert!(sel.wants_system("SentTimestamp"));
        assert!(!sel.wants_system("SenderId"));
        assert!(sel.messages.matches("a"));
        assert!(sel.messages.matches("trace.id"));
        assert!(!sel.messages.matches("trace"));
        assert!(!sel.messages.matches("b"));
        let all = AttributeSelection::new(vec!["All".into()], vec![".*".into()]).unwrap();
        assert!(all.wants_system("MessageGroupId"));
        assert!(all.messages.matches("anything"));
    }
}
