//! The two wire protocols of the SQS API, reduced to one request and one response model.
//!
//! Requests: the AWS JSON 1.0 body is already the input structure; a Query protocol form
//! (`Attribute.1.Name=…`, `SendMessageBatchRequestEntry.2.MessageBody=…`) is rebuilt into the
//! same JSON structure from a per-action schema (the Smithy model's `xmlName`/`xmlFlattened`
//! names), so every action is written once against [`Params`]. Responses: an [`Out`] tree that
//! knows both its JSON member names and its XML element names, rendered by [`render_json`] or
//! [`render_xml`]. Errors: [`SqsError`], carrying the legacy Query code (what
//! `x-amzn-query-error` and the XML `Code` say) and the model's error shape name (the JSON
//! `__type`).
//!
//! Unknown parameters are ignored in both protocols, as AWS services do for members a newer SDK
//! may send; missing required ones are `MissingParameter`, wrong JSON types are
//! `InvalidParameterValue`, a body that is not JSON at all is `SerializationException`.

use crate::engine::attributes::{AttributeValue, MessageAttribute};
use crate::engine::record::Payload;
use crate::engine::EngineError;
use crate::error::ServiceError;
use base64::Engine as _;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The XML namespace of every Query protocol response.
pub const XML_NAMESPACE: &str = "https://queue.amazonaws.com/doc/2012-11-05/";
/// The JSON `__type` prefix of SQS error shapes.
pub const JSON_ERROR_PREFIX: &str = "com.amazonaws.sqs#";
/// At most this many form parameters in one Query request (a full SendMessageBatch with ten
/// attributes per entry is ~500); bounds the work of rebuilding the structure.
pub const QUERY_PARAMS_MAX: usize = 4_096;
/// Highest list index (`Entry.N`) accepted in a Query request.
pub const QUERY_LIST_INDEX_MAX: u32 = 1_000;

/// An SQS error as the client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqsError {
    /// The legacy Query code (`AWS.SimpleQueueService.NonExistentQueue`).
    pub code: &'static str,
    /// The model's error shape (`QueueDoesNotExist`), the JSON `__type` suffix.
    pub shape: &'static str,
    pub status: u16,
    pub sender_fault: bool,
    pub message: String,
    /// In a cluster: the node that leads what the request needed, when this node does not and
    /// nothing was done (the request may be forwarded there, `super::forward`).
    pub leader: Option<u64>,
}

impl SqsError {
    /// An error whose shape name equals its code (the common errors outside the model).
    pub fn new(code: &'static str, status: u16, message: impl Into<String>) -> Self {
        SqsError {
            code,
            shape: shape_of(code),
            status,
            sender_fault: status < 500,
            message: message.into(),
            leader: None,
        }
    }

    pub fn missing(param: &str) -> Self {
        SqsError::new(
            "MissingParameter",
            400,
            format!("The request must contain the parameter {param}."),
        )
    }

    pub fn invalid(param: &str, reason: impl std::fmt::Display) -> Self {
        SqsError::new(
            "InvalidParameterValue",
            400,
            format!("Value for parameter {param} is invalid. Reason: {reason}."),
        )
    }

    /// `InvalidParameterValue` naming the value, in SQS's words: "Value 11 for parameter
    /// MaxNumberOfMessages is invalid. Reason: Must be between 1 and 10, if provided."
    pub fn invalid_value(
        param: &str,
        value: impl std::fmt::Display,
        reason: impl std::fmt::Display,
    ) -> Self {
        SqsError::new(
            "InvalidParameterValue",
            400,
            format!("Value {value} for parameter {param} is invalid. Reason: {reason}"),
        )
    }

    pub fn unsupported(message: impl Into<String>) -> Self {
        SqsError::new("AWS.SimpleQueueService.UnsupportedOperation", 400, message)
    }

    pub fn non_existent_queue() -> Self {
        SqsError::from(ServiceError::NonExistentQueue)
    }
}

impl From<ServiceError> for SqsError {
    fn from(e: ServiceError) -> Self {
        let info = e.info();
        let message = match &e {
            ServiceError::NonExistentQueue => {
                "The specified queue does not exist for this wsdl version.".to_string()
            }
            ServiceError::Internal(_) => {
                // The detail goes to the log, not to the client.
                tracing::error!(error = %e, "internal error answering an SQS request");
                "We encountered an internal error. Please try again.".to_string()
            }
            // SQS's wording for these (the codes are the same either way).
            ServiceError::Engine(EngineError::InvalidAttributeName(name)) => {
                // The engine may add why ("X applies only to FIFO queues"); SQS names it only.
                let name = name.split(' ').next().unwrap_or(name);
                format!("Unknown Attribute {name}.")
            }
            ServiceError::Engine(EngineError::InvalidBatchEntryId(_)) => {
                "A batch entry id can only contain alphanumeric characters, hyphens and \
                 underscores. It can be at most 80 letters long."
                    .to_string()
            }
            ServiceError::Engine(EngineError::BatchEntryIdsNotDistinct(id)) => {
                format!("Id {id} repeated.")
            }
            ServiceError::Engine(EngineError::BatchRequestTooLong { size_bytes }) => format!(
                "Batch requests cannot be longer than {} bytes. You have sent {size_bytes} bytes.",
                sluice_wire::limits::BATCH_PAYLOAD_BYTES_MAX
            ),
            other => other.to_string(),
        };
        let leader = match e {
            ServiceError::NotLeader {
                leader_hint,
                outcome_unknown: false,
                ..
            } => leader_hint,
            _ => None,
        };
        SqsError {
            code: info.code,
            shape: shape_of(info.code),
            status: info.http_status,
            sender_fault: info.sender_fault,
            message,
            leader,
        }
    }
}

impl From<EngineError> for SqsError {
    fn from(e: EngineError) -> Self {
        SqsError::from(ServiceError::from(e))
    }
}

/// The model's error shape name for a legacy code (see the `awsQueryError` traits of
/// `sqs-api-model.json`): most shapes drop the `AWS.SimpleQueueService.` prefix; two are renamed.
/// The two common errors the model does not declare are named as SQS's JSON protocol names them
/// (`__type`), while `x-amzn-query-error` keeps their Query codes.
pub fn shape_of(code: &'static str) -> &'static str {
    match code {
        "AWS.SimpleQueueService.NonExistentQueue" => "QueueDoesNotExist",
        "QueueAlreadyExists" => "QueueNameExists",
        "InvalidParameterValue" => "InvalidParameterValueException",
        "MissingParameter" => "MissingRequiredParameterException",
        "KMS.AccessDeniedException" => "KmsAccessDenied",
        "KMS.DisabledException" => "KmsDisabled",
        "KMS.InvalidKeyUsageException" => "KmsInvalidKeyUsage",
        "KMS.InvalidStateException" => "KmsInvalidState",
        "KMS.NotFoundException" => "KmsNotFound",
        "KMS.OptInRequired" => "KmsOptInRequired",
        "KMS.ThrottlingException" => "KmsThrottled",
        c => c.strip_prefix("AWS.SimpleQueueService.").unwrap_or(c),
    }
}

// ------------------------------------------------------------------------------ input

/// One action's input: the JSON structure (from either protocol), consumed member by member so
/// that large strings (message bodies) move into the request instead of being copied.
pub struct Params {
    map: Map<String, Value>,
    /// Built from a Query form: scalars arrived as strings and are parsed here.
    from_query: bool,
}

impl Params {
    pub fn from_json(map: Map<String, Value>) -> Self {
        Params {
            map,
            from_query: false,
        }
    }

    pub fn from_query(map: Map<String, Value>) -> Self {
        Params {
            map,
            from_query: true,
        }
    }

    fn child(&self, map: Map<String, Value>) -> Params {
        Params {
            map,
            from_query: self.from_query,
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.map.get(name).is_some_and(|v| !v.is_null())
    }

    pub fn opt_str(&mut self, name: &str) -> Result<Option<String>, SqsError> {
        match self.map.remove(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(SqsError::invalid(name, "must be a string")),
        }
    }

    pub fn str(&mut self, name: &str) -> Result<String, SqsError> {
        self.opt_str(name)?.ok_or_else(|| SqsError::missing(name))
    }

    pub fn opt_int(&mut self, name: &str) -> Result<Option<i64>, SqsError> {
        match self.map.remove(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) if !self.from_query => n
                .as_i64()
                .map(Some)
                .ok_or_else(|| SqsError::invalid(name, "must be an integer")),
            Some(Value::String(s)) if self.from_query => s
                .trim()
                .parse::<i64>()
                .map(Some)
                .map_err(|_| SqsError::invalid(name, format!("{s:?} is not an integer"))),
            Some(_) => Err(SqsError::invalid(name, "must be an integer")),
        }
    }

    /// An integer in `min..=max`; outside, SQS's "Value 11 for parameter MaxNumberOfMessages
    /// is invalid. Reason: Must be between 1 and 10, if provided."
    pub fn opt_int_in(&mut self, name: &str, min: i64, max: i64) -> Result<Option<u32>, SqsError> {
        match self.opt_int(name)? {
            None => Ok(None),
            Some(v) if (min..=max).contains(&v) => Ok(Some(v as u32)),
            Some(v) => Err(SqsError::invalid_value(
                name,
                v,
                match name {
                    "WaitTimeSeconds" => format!("Must be >= {min} and <= {max}, if provided."),
                    _ => format!("Must be between {min} and {max}, if provided."),
                },
            )),
        }
    }

    pub fn str_list(&mut self, name: &str) -> Result<Vec<String>, SqsError> {
        match self.map.remove(name) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .into_iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s),
                    _ => Err(SqsError::invalid(name, "must be a list of strings")),
                })
                .collect(),
            Some(_) => Err(SqsError::invalid(name, "must be a list of strings")),
        }
    }

    pub fn str_map(&mut self, name: &str) -> Result<BTreeMap<String, String>, SqsError> {
        match self.map.remove(name) {
            None | Some(Value::Null) => Ok(BTreeMap::new()),
            Some(Value::Object(m)) => m
                .into_iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k, s)),
                    _ => Err(SqsError::invalid(name, "must map strings to strings")),
                })
                .collect(),
            Some(_) => Err(SqsError::invalid(name, "must map strings to strings")),
        }
    }

    /// A list of structures (batch entries).
    pub fn struct_list(&mut self, name: &str) -> Result<Option<Vec<Params>>, SqsError> {
        match self.map.remove(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(a)) => a
                .into_iter()
                .map(|v| match v {
                    Value::Object(m) => Ok(self.child(m)),
                    _ => Err(SqsError::invalid(name, "must be a list of structures")),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(SqsError::invalid(name, "must be a list of structures")),
        }
    }

    /// `MessageAttributes` / `MessageSystemAttributes`: name → {DataType, StringValue |
    /// BinaryValue (base64)}. The list values are reserved by SQS and rejected.
    pub fn message_attributes(&mut self, name: &str) -> Result<Vec<MessageAttribute>, SqsError> {
        let m = match self.map.remove(name) {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::Object(m)) => m,
            Some(_) => return Err(SqsError::invalid(name, "must be a map of attribute values")),
        };
        let mut out = Vec::with_capacity(m.len());
        for (attr, v) in m {
            let Value::Object(fields) = v else {
                return Err(SqsError::invalid(name, "must be a map of attribute values"));
            };
            let mut p = self.child(fields);
            let data_type = p.opt_str("DataType")?.ok_or_else(|| {
                SqsError::invalid(
                    name,
                    format!("the message attribute '{attr}' must contain a non-empty DataType"),
                )
            })?;
            if p.has("StringListValues") || p.has("BinaryListValues") {
                return Err(SqsError::invalid(
                    name,
                    "StringListValues and BinaryListValues are not supported",
                ));
            }
            let value = match (p.opt_str("StringValue")?, p.opt_str("BinaryValue")?) {
                (Some(s), None) => AttributeValue::String(s),
                (None, Some(b)) => AttributeValue::Binary(
                    base64::engine::general_purpose::STANDARD
                        .decode(b.as_bytes())
                        .map_err(|_| SqsError::invalid(name, format!("the BinaryValue of '{attr}' is not base64")))?,
                ),
                _ => {
                    return Err(SqsError::invalid(
                        name,
                        format!("the message attribute '{attr}' must contain exactly one of StringValue or BinaryValue"),
                    ))
                }
            };
            out.push(MessageAttribute {
                name: attr,
                data_type,
                value,
            });
        }
        Ok(out)
    }
}

/// How a member travels in a Query form, per the model's `xmlName` and `xmlFlattened` traits.
pub enum Shape {
    Scalar,
    /// A flattened list: `Name.1`, `Name.2`, … (items may be structures).
    List(&'static Shape),
    /// A flattened map: `Name.N.<key>` and `Name.N.<value>` (the value may be a structure).
    Map {
        key: &'static str,
        value: &'static str,
        of: &'static Shape,
    },
    Struct(&'static [Member]),
}

pub struct Member {
    /// The JSON member name.
    pub json: &'static str,
    /// The Query parameter name.
    pub query: &'static str,
    pub shape: Shape,
}

const fn scalar(name: &'static str) -> Member {
    Member {
        json: name,
        query: name,
        shape: Shape::Scalar,
    }
}

const ATTRIBUTE_MAP: Shape = Shape::Map {
    key: "Name",
    value: "Value",
    of: &Shape::Scalar,
};
const TAG_MAP: Shape = Shape::Map {
    key: "Key",
    value: "Value",
    of: &Shape::Scalar,
};
const MESSAGE_ATTRIBUTE_VALUE: Shape = Shape::Struct(&[
    scalar("DataType"),
    scalar("StringValue"),
    scalar("BinaryValue"),
    Member {
        json: "StringListValues",
        query: "StringListValue",
        shape: Shape::List(&Shape::Scalar),
    },
    Member {
        json: "BinaryListValues",
        query: "BinaryListValue",
        shape: Shape::List(&Shape::Scalar),
    },
]);
const MESSAGE_ATTRIBUTE_MAP: Shape = Shape::Map {
    key: "Name",
    value: "Value",
    of: &MESSAGE_ATTRIBUTE_VALUE,
};
const SEND_ENTRY: Shape = Shape::Struct(&[
    scalar("Id"),
    scalar("MessageBody"),
    scalar("DelaySeconds"),
    scalar("MessageDeduplicationId"),
    scalar("MessageGroupId"),
    Member {
        json: "MessageAttributes",
        query: "MessageAttribute",
        shape: MESSAGE_ATTRIBUTE_MAP,
    },
    Member {
        json: "MessageSystemAttributes",
        query: "MessageSystemAttribute",
        shape: MESSAGE_ATTRIBUTE_MAP,
    },
]);
const HANDLE_ENTRY: Shape = Shape::Struct(&[
    scalar("Id"),
    scalar("ReceiptHandle"),
    scalar("VisibilityTimeout"),
]);

/// The Query members of each action (scalars not listed here are taken by name).
pub fn query_schema(action: &str) -> &'static [Member] {
    match action {
        "CreateQueue" => &[
            Member {
                json: "Attributes",
                query: "Attribute",
                shape: ATTRIBUTE_MAP,
            },
            Member {
                json: "tags",
                query: "Tag",
                shape: TAG_MAP,
            },
        ],
        "SetQueueAttributes" => &[Member {
            json: "Attributes",
            query: "Attribute",
            shape: ATTRIBUTE_MAP,
        }],
        "GetQueueAttributes" => &[Member {
            json: "AttributeNames",
            query: "AttributeName",
            shape: Shape::List(&Shape::Scalar),
        }],
        "ReceiveMessage" => &[
            // Both lists travel as AttributeName.N in the Query protocol.
            Member {
                json: "AttributeNames",
                query: "AttributeName",
                shape: Shape::List(&Shape::Scalar),
            },
            Member {
                json: "MessageSystemAttributeNames",
                query: "MessageSystemAttributeName",
                shape: Shape::List(&Shape::Scalar),
            },
            Member {
                json: "MessageAttributeNames",
                query: "MessageAttributeName",
                shape: Shape::List(&Shape::Scalar),
            },
        ],
        "SendMessage" => match &SEND_ENTRY {
            Shape::Struct(m) => m,
            _ => &[],
        },
        "SendMessageBatch" => &[Member {
            json: "Entries",
            query: "SendMessageBatchRequestEntry",
            shape: Shape::List(&SEND_ENTRY),
        }],
        "DeleteMessageBatch" => &[Member {
            json: "Entries",
            query: "DeleteMessageBatchRequestEntry",
            shape: Shape::List(&HANDLE_ENTRY),
        }],
        "ChangeMessageVisibilityBatch" => &[Member {
            json: "Entries",
            query: "ChangeMessageVisibilityBatchRequestEntry",
            shape: Shape::List(&HANDLE_ENTRY),
        }],
        "TagQueue" => &[Member {
            json: "Tags",
            query: "Tag",
            shape: TAG_MAP,
        }],
        "UntagQueue" => &[Member {
            json: "TagKeys",
            query: "TagKey",
            shape: Shape::List(&Shape::Scalar),
        }],
        "AddPermission" => &[
            Member {
                json: "AWSAccountIds",
                query: "AWSAccountId",
                shape: Shape::List(&Shape::Scalar),
            },
            Member {
                json: "Actions",
                query: "ActionName",
                shape: Shape::List(&Shape::Scalar),
            },
        ],
        _ => &[],
    }
}

/// Rebuilds an action's JSON input from its Query form parameters.
pub fn query_to_json(
    action: &str,
    mut params: BTreeMap<String, String>,
) -> Result<Map<String, Value>, SqsError> {
    let schema = query_schema(action);
    let mut out = build_struct("", schema, &params)?;
    // Every remaining top-level scalar is taken by name (QueueUrl, MessageBody, …); the
    // structured members were consumed above and their dotted keys are skipped.
    let structured: Vec<&str> = schema.iter().map(|m| m.query).collect();
    for (k, v) in std::mem::take(&mut params) {
        let top = k.split('.').next().unwrap_or(&k);
        if k.contains('.') || structured.contains(&top) || out.contains_key(&k) {
            continue;
        }
        out.insert(k, Value::String(v));
    }
    Ok(out)
}

fn build_struct(
    prefix: &str,
    members: &[Member],
    params: &BTreeMap<String, String>,
) -> Result<Map<String, Value>, SqsError> {
    let mut m = Map::new();
    for member in members {
        let key = format!("{prefix}{}", member.query);
        if let Some(v) = build(&key, &member.shape, params)? {
            m.insert(member.json.to_string(), v);
        }
    }
    Ok(m)
}

fn build(
    key: &str,
    shape: &Shape,
    params: &BTreeMap<String, String>,
) -> Result<Option<Value>, SqsError> {
    match shape {
        Shape::Scalar => Ok(params.get(key).map(|v| Value::String(v.clone()))),
        Shape::Struct(members) => {
            let m = build_struct(&format!("{key}."), members, params)?;
            Ok((!m.is_empty()).then_some(Value::Object(m)))
        }
        Shape::List(of) => {
            let idx = indices(key, params)?;
            if idx.is_empty() {
                return Ok(None);
            }
            let mut items = Vec::with_capacity(idx.len());
            for i in idx {
                if let Some(v) = build(&format!("{key}.{i}"), of, params)? {
                    items.push(v);
                }
            }
            Ok(Some(Value::Array(items)))
        }
        Shape::Map { key: k, value, of } => {
            let idx = indices(key, params)?;
            if idx.is_empty() {
                return Ok(None);
            }
            let mut m = Map::new();
            for i in idx {
                let name = params
                    .get(&format!("{key}.{i}.{k}"))
                    .ok_or_else(|| SqsError::missing(&format!("{key}.{i}.{k}")))?;
                let v = build(&format!("{key}.{i}.{value}"), of, params)?
                    .ok_or_else(|| SqsError::missing(&format!("{key}.{i}.{value}")))?;
                m.insert(name.clone(), v);
            }
            Ok(Some(Value::Object(m)))
        }
    }
}

/// The list indices N present as `key.N` or `key.N.*`, in numeric order.
fn indices(key: &str, params: &BTreeMap<String, String>) -> Result<BTreeSet<u32>, SqsError> {
    let prefix = format!("{key}.");
    let mut out = BTreeSet::new();
    for k in params.range(prefix.clone()..).map(|(k, _)| k) {
        let Some(rest) = k.strip_prefix(&prefix) else {
            break;
        };
        let n = rest.split('.').next().unwrap_or(rest);
        match n.parse::<u32>() {
            Ok(i) if (1..=QUERY_LIST_INDEX_MAX).contains(&i) => {
                out.insert(i);
            }
            _ => return Err(SqsError::invalid(k, "list indices must be 1 to 1000")),
        }
    }
    Ok(out)
}

// ------------------------------------------------------------------------------ output

/// A response value that renders to both protocols.
pub enum Out {
    Str(String),
    /// A message body, shared with the partition's payload (not copied until rendered).
    Body(Arc<Payload>),
    Bool(bool),
    Int(i64),
    /// Members: (JSON name, XML name, value).
    Struct(Vec<(&'static str, &'static str, Out)>),
    /// A flattened list: in XML, each item is an element named by the member's XML name.
    List(Vec<Out>),
    /// A flattened map: in XML, each entry is an element named by the member's XML name,
    /// holding `<key_tag>` and `<value_tag>`.
    Map {
        key_tag: &'static str,
        value_tag: &'static str,
        entries: Vec<(String, Out)>,
    },
}

pub fn render_json(out: Option<&Out>, buf: &mut Vec<u8>) {
    match out {
        None => buf.extend_from_slice(b"{}"),
        Some(o) => json_value(o, buf),
    }
}

/// `s` as a JSON string, byte for byte what `serde_json` writes (`"` and `\\` escaped, the
/// control characters as `\b \f \n \r \t` or `\u00xx`, nothing else), 32 bytes a step where
/// none needs escaping. A ReceiveMessage answer is mostly message bodies, and `serde_json`'s
/// byte-at-a-time escape loop was 3.5% of a shard in the HTTP throughput scenario: a clean
/// 2 KiB body takes 0.23–0.34 µs here against its 1.0–1.6 µs (a body of quotes: about even).
fn json_str(s: &str, buf: &mut Vec<u8>) {
    const STEP: usize = 32;
    let bytes = s.as_bytes();
    buf.reserve(bytes.len() + 2);
    buf.push(b'"');
    let mut copied = 0; // bytes[..copied] are in `buf`
    let mut i = 0;
    while let Some(chunk) = bytes.get(i..i + STEP) {
        let flags: [u64; STEP / 8] = std::array::from_fn(|k| {
            escape_flags(u64::from_le_bytes(
                chunk[8 * k..8 * k + 8].try_into().expect("eight bytes"),
            ))
        });
        if flags.iter().any(|f| *f != 0) {
            // At most six bytes out for each in.
            buf.reserve(6 * STEP);
            for (k, mut f) in flags.into_iter().enumerate() {
                // Visit only the flagged bytes (a flag above a flagged byte may be a borrow's
                // ghost: `escape_at` looks at the byte itself).
                while f != 0 {
                    let at = i + 8 * k + (f.trailing_zeros() / 8) as usize;
                    escape_at(bytes, at, &mut copied, buf);
                    f &= f - 1;
                }
            }
        }
        i += STEP;
    }
    for at in i..bytes.len() {
        escape_at(bytes, at, &mut copied, buf);
    }
    buf.extend_from_slice(&bytes[copied..]);
    buf.push(b'"');
}

/// Escapes `bytes[at]` into `buf` if JSON needs it, first copying the clean bytes before it.
#[inline(always)]
fn escape_at(bytes: &[u8], at: usize, copied: &mut usize, buf: &mut Vec<u8>) {
    let b = bytes[at];
    let e = JSON_ESCAPE[usize::from(b)];
    if e == 0 {
        return;
    }
    if *copied < at {
        buf.extend_from_slice(&bytes[*copied..at]);
    }
    *copied = at + 1;
    if e == b'u' {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        buf.extend_from_slice(&[
            b'\\',
            b'u',
            b'0',
            b'0',
            HEX[usize::from(b >> 4)],
            HEX[usize::from(b & 15)],
        ]);
    } else {
        buf.extend_from_slice(&[b'\\', e]);
    }
}

/// How JSON escapes each byte: 0 not at all, `u` as `\u00xx`, else `\` and this byte.
static JSON_ESCAPE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = b'u';
        b += 1;
    }
    t[0x08] = b'b';
    t[0x0c] = b'f';
    t[b'\n' as usize] = b'n';
    t[b'\r' as usize] = b'r';
    t[b'\t' as usize] = b't';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
};

/// The high bit of each byte of `w` that is below 0x20, `"` or `\\`; zero if none is. Exact:
/// a byte's subtraction borrows only when that byte is below the bound, so a borrow can
/// mis-flag only the bytes above one that is flagged anyway, never a word that has none.
fn escape_flags(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below = |v: u64, n: u64| v.wrapping_sub(ONES * n) & !v;
    (below(w, 0x20)
        | below(w ^ (ONES * u64::from(b'"')), 1)
        | below(w ^ (ONES * u64::from(b'\\')), 1))
        & HIGH
}

fn json_value(o: &Out, buf: &mut Vec<u8>) {
    match o {
        Out::Str(s) => json_str(s, buf),
        Out::Body(p) => json_str(&p.body, buf),
        Out::Bool(b) => buf.extend_from_slice(if *b { b"true" } else { b"false" }),
        Out::Int(i) => buf.extend_from_slice(i.to_string().as_bytes()),
        Out::Struct(members) => {
            buf.push(b'{');
            for (i, (name, _, v)) in members.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                json_str(name, buf);
                buf.push(b':');
                json_value(v, buf);
            }
            buf.push(b'}');
        }
        Out::List(items) => {
            buf.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                json_value(v, buf);
            }
            buf.push(b']');
        }
        Out::Map { entries, .. } => {
            buf.push(b'{');
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                json_str(k, buf);
                buf.push(b':');
                json_value(v, buf);
            }
            buf.push(b'}');
        }
    }
}

/// `<Action>Response><Action>Result>…</…><ResponseMetadata>…` (no Result element for actions
/// without output, as SQS does).
pub fn render_xml(action: &str, out: Option<&Out>, request_id: &str, buf: &mut Vec<u8>) {
    buf.extend_from_slice(b"<?xml version=\"1.0\"?>");
    buf.extend_from_slice(format!("<{action}Response xmlns=\"{XML_NAMESPACE}\">").as_bytes());
    if let Some(o) = out {
        buf.extend_from_slice(format!("<{action}Result>").as_bytes());
        xml_content(o, buf);
        buf.extend_from_slice(format!("</{action}Result>").as_bytes());
    }
    buf.extend_from_slice(b"<ResponseMetadata><RequestId>");
    xml_escape(request_id, buf);
    buf.extend_from_slice(format!("</RequestId></ResponseMetadata></{action}Response>").as_bytes());
}

fn xml_element(tag: &str, o: &Out, buf: &mut Vec<u8>) {
    match o {
        Out::List(items) => {
            for item in items {
                xml_element(tag, item, buf);
            }
        }
        Out::Map {
            key_tag,
            value_tag,
            entries,
        } => {
            for (k, v) in entries {
                open(tag, buf);
                open(key_tag, buf);
                xml_escape(k, buf);
                close(key_tag, buf);
                xml_element(value_tag, v, buf);
                close(tag, buf);
            }
        }
        _ => {
            open(tag, buf);
            xml_content(o, buf);
            close(tag, buf);
        }
    }
}

fn xml_content(o: &Out, buf: &mut Vec<u8>) {
    match o {
        Out::Str(s) => xml_escape(s, buf),
        Out::Body(p) => xml_escape(&p.body, buf),
        Out::Bool(b) => buf.extend_from_slice(if *b { b"true" } else { b"false" }),
        Out::Int(i) => buf.extend_from_slice(i.to_string().as_bytes()),
        Out::Struct(members) => {
            for (_, tag, v) in members {
                xml_element(tag, v, buf);
            }
        }
        // A list or map is always a member of a structure (handled by `xml_element`).
        Out::List(_) | Out::Map { .. } => xml_element("member", o, buf),
    }
}

fn open(tag: &str, buf: &mut Vec<u8>) {
    buf.push(b'<');
    buf.extend_from_slice(tag.as_bytes());
    buf.push(b'>');
}

fn close(tag: &str, buf: &mut Vec<u8>) {
    buf.extend_from_slice(b"</");
    buf.extend_from_slice(tag.as_bytes());
    buf.push(b'>');
}

/// Escapes text for XML. `\r` becomes `&#xD;` so that it survives XML line-end normalisation
/// and the client's MD5 of the body still matches.
pub fn xml_escape(s: &str, buf: &mut Vec<u8>) {
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let rep: &[u8] = match b {
            b'&' => b"&amp;",
            b'<' => b"&lt;",
            b'>' => b"&gt;",
            b'"' => b"&quot;",
            b'\'' => b"&apos;",
            b'\r' => b"&#xD;",
            _ => continue,
        };
        buf.extend_from_slice(&bytes[start..i]);
        buf.extend_from_slice(rep);
        start = i + 1;
    }
    buf.extend_from_slice(&bytes[start..]);
}

pub fn render_json_error(e: &SqsError, buf: &mut Vec<u8>) {
    buf.extend_from_slice(b"{\"__type\":");
    json_str(&format!("{JSON_ERROR_PREFIX}{}", e.shape), buf);
    buf.extend_from_slice(b",\"message\":");
    // SQS words this one error differently per protocol: the Query protocol's message names
    // the "wsdl version", the JSON protocol's does not.
    let message = match e.code {
        "AWS.SimpleQueueService.NonExistentQueue" => "The specified queue does not exist.",
        _ => &e.message,
    };
    json_str(message, buf);
    buf.push(b'}');
}

pub fn render_xml_error(e: &SqsError, request_id: &str, buf: &mut Vec<u8>) {
    buf.extend_from_slice(b"<?xml version=\"1.0\"?>");
    buf.extend_from_slice(
        format!("<ErrorResponse xmlns=\"{XML_NAMESPACE}\"><Error><Type>").as_bytes(),
    );
    buf.extend_from_slice(if e.sender_fault {
        b"Sender"
    } else {
        b"Receiver"
    });
    buf.extend_from_slice(b"</Type><Code>");
    xml_escape(e.code, buf);
    buf.extend_from_slice(b"</Code><Message>");
    xml_escape(&e.message, buf);
    buf.extend_from_slice(b"</Message><Detail/></Error><RequestId>");
    xml_escape(request_id, buf);
    buf.extend_from_slice(b"</RequestId></ErrorResponse>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_written_as_serde_json_writes_them() {
        use rand::{Rng, SeedableRng};
        let seed: u64 = std::env::var("SLUICE_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        // Every byte the escape cares about, some it must leave alone, multi-byte UTF-8.
        let alphabet: Vec<char> = (0u8..0x20)
            .map(char::from)
            .chain("\"\\/ az\u{7f}\u{80}é€😀".chars())
            .collect();
        for case in 0..20_000 {
            let len = rng.gen_range(0..100);
            let s: String = (0..len)
                .map(|_| {
                    if rng.gen_bool(0.7) {
                        char::from(rng.gen_range(b' '..=b'~'))
                    } else {
                        alphabet[rng.gen_range(0..alphabet.len())]
                    }
                })
                .collect();
            let mut ours = Vec::new();
            json_str(&s, &mut ours);
            let theirs = serde_json::to_vec(&s).expect("string");
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&theirs),
                "seed {seed} (SLUICE_SEED), case {case}: {s:?}"
            );
        }
    }

    #[test]
    fn the_word_test_flags_exactly_the_bytes_to_escape() {
        for b in 0..=255u8 {
            let flagged = b < 0x20 || b == b'"' || b == b'\\';
            for at in 0..8 {
                let mut w = [b'a'; 8];
                w[at] = b;
                assert_eq!(
                    escape_flags(u64::from_le_bytes(w)) != 0,
                    flagged,
                    "byte {b:#x} at {at}"
                );
            }
        }
    }

    fn form(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn query_batch_with_attributes_becomes_the_json_structure() {
        let m = query_to_json(
            "SendMessageBatch",
            form(&[
                ("QueueUrl", "http://h/000000000000/q"),
                ("SendMessageBatchRequestEntry.1.Id", "a"),
                ("SendMessageBatchRequestEntry.1.MessageBody", "x"),
                (
                    "SendMessageBatchRequestEntry.1.MessageAttribute.1.Name",
                    "n",
                ),
                (
                    "SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType",
                    "String",
                ),
                (
                    "SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue",
                    "v",
                ),
                ("SendMessageBatchRequestEntry.10.Id", "b"),
                ("SendMessageBatchRequestEntry.2.Id", "c"),
            ]),
        )
        .expect("valid");
        let v = Value::Object(m);
        assert_eq!(v["QueueUrl"], "http://h/000000000000/q");
        let e = v["Entries"].as_array().expect("list");
        assert_eq!(e.len(), 3);
        assert_eq!(e[0]["Id"], "a");
        assert_eq!(e[1]["Id"], "c", "numeric order, not text order");
        assert_eq!(e[2]["Id"], "b");
        assert_eq!(e[0]["MessageAttributes"]["n"]["StringValue"], "v");
    }

    #[test]
    fn query_rejects_bad_indices_and_half_entries() {
        assert!(query_to_json("GetQueueAttributes", form(&[("AttributeName.x", "All")])).is_err());
        assert!(query_to_json("GetQueueAttributes", form(&[("AttributeName.0", "All")])).is_err());
        let e = query_to_json("CreateQueue", form(&[("Attribute.1.Name", "DelaySeconds")]))
            .expect_err("value missing");
        assert_eq!(e.code, "MissingParameter");
    }

    #[test]
    fn xml_escapes_and_keeps_carriage_returns() {
        let mut b = Vec::new();
        xml_escape("a<b>&\"'\r\n", &mut b);
        assert_eq!(b, b"a&lt;b&gt;&amp;&quot;&apos;&#xD;\n");
    }

    #[test]
    fn shapes_follow_the_model() {
        assert_eq!(
            shape_of("AWS.SimpleQueueService.NonExistentQueue"),
            "QueueDoesNotExist"
        );
        assert_eq!(shape_of("QueueAlreadyExists"), "QueueNameExists");
        assert_eq!(
            shape_of("AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
            "BatchEntryIdsNotDistinct"
        );
        assert_eq!(shape_of("ReceiptHandleIsInvalid"), "ReceiptHandleIsInvalid");
    }

    #[test]
    fn renders_both_protocols() {
        let o = Out::Struct(vec![
            (
                "QueueUrls",
                "QueueUrl",
                Out::List(vec![Out::Str("u1".into()), Out::Str("u2".into())]),
            ),
            (
                "Attributes",
                "Attribute",
                Out::Map {
                    key_tag: "Name",
                    value_tag: "Value",
                    entries: vec![("k".into(), Out::Str("v".into()))],
                },
            ),
        ]);
        let mut j = Vec::new();
        render_json(Some(&o), &mut j);
        assert_eq!(
            String::from_utf8(j).expect("utf8"),
            r#"{"QueueUrls":["u1","u2"],"Attributes":{"k":"v"}}"#
        );
        let mut x = Vec::new();
        render_xml("ListQueues", Some(&o), "rid", &mut x);
        let x = String::from_utf8(x).expect("utf8");
        assert!(x.contains("<ListQueuesResult><QueueUrl>u1</QueueUrl><QueueUrl>u2</QueueUrl><Attribute><Name>k</Name><Value>v</Value></Attribute></ListQueuesResult>"), "{x}");
        assert!(x.contains("<RequestId>rid</RequestId>"));
    }
}
