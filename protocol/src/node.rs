//! The data of every JSON node the projection writes in Merritt's ZooKeeper
//! layout (mrt-zk 2.x), one type per node, and [`decode`] for readers.
//!
//! **Writing** (the projector): fields serialise in declaration order, which
//! is the key order mrt-zk writes, so the bytes are the same for the same
//! log. Absent strings are written as `""` (mrt-zk reads them with
//! `getString`), except `last_successful_status`, which mrt-zk writes as
//! `null` until a job's first move.
//!
//! **Reading** (workers, tools): nodes may have been written by others
//! (Merritt's own code, an admin, an attacker), so every reader is lenient
//! about shape and strict about size: unknown keys are ignored, missing keys
//! take their defaults, a `null`, number or boolean where text is expected
//! is read as text, and a node larger than [`MAX_NODE_BYTES`] is refused
//! with a [`NodeError`] that names the node and quotes none of it.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

/// The largest node data read: ZooKeeper's default `jute.maxbuffer`.
pub const MAX_NODE_BYTES: usize = 1024 * 1024;

/// Why a node's data could not be read.
///
/// ### Handling
/// The node is not the caller's to fix: skip the item (it is reported by
/// `ingest diff` and the consistency checks) and go on with the others.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The data is larger than [`MAX_NODE_BYTES`].
    #[error("the {node} node has {len} bytes, more than the {MAX_NODE_BYTES} a node may have")]
    TooLarge {
        /// Which node (`/jobs/JID/status`, …).
        node: &'static str,
        /// Its size.
        len: usize,
    },
    /// The data is not the JSON object the node holds.
    #[error("the {node} node is not valid: {message}")]
    Invalid {
        /// Which node.
        node: &'static str,
        /// The parser's message (bounded; it quotes none of the data).
        message: String,
    },
}

/// Reads the data of `node` (its path pattern, for messages) as `T`.
///
/// # Errors
/// [`NodeError::TooLarge`] or [`NodeError::Invalid`].
pub fn decode<T: DeserializeOwned>(node: &'static str, data: &[u8]) -> Result<T, NodeError> {
    if data.len() > MAX_NODE_BYTES {
        return Err(NodeError::TooLarge {
            node,
            len: data.len(),
        });
    }
    serde_json::from_slice(data).map_err(|e| NodeError::Invalid {
        node,
        // serde_json's messages name a line and column, never the data.
        message: crate::cut(&e.to_string(), 200).into_owned(),
    })
}

/// Text from any JSON scalar: `null` is `""`, numbers and booleans their
/// JSON text. Objects and arrays are refused.
fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    use serde::de::Error;
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Null => Ok(String::new()),
        serde_json::Value::String(s) => Ok(s),
        serde_json::Value::Bool(b) => Ok(b.to_string()),
        serde_json::Value::Number(n) => Ok(n.to_string()),
        _ => Err(D::Error::custom("expected text")),
    }
}

/// A list of texts, `null` being empty.
fn texts<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    use serde::de::Error;
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Null => Ok(Vec::new()),
        serde_json::Value::Array(items) => items
            .into_iter()
            .map(|v| match v {
                serde_json::Value::String(s) => Ok(s),
                serde_json::Value::Number(n) => Ok(n.to_string()),
                _ => Err(D::Error::custom("expected a list of texts")),
            })
            .collect(),
        // mrt-zk's older writers put a single local id as text.
        serde_json::Value::String(s) => Ok(vec![s]),
        _ => Err(D::Error::custom("expected a list of texts")),
    }
}

/// Text or `null`.
fn optional_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Some(text(d)?).filter(|s| !s.is_empty()))
}

/// A non-negative count from a number or its text (`0` when absent).
fn count<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    use serde::de::Error;
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Null => Ok(0),
        serde_json::Value::Number(n) => n
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| D::Error::custom("expected a count")),
        serde_json::Value::String(s) => s
            .trim()
            .parse()
            .map_err(|_| D::Error::custom("expected a count")),
        _ => Err(D::Error::custom("expected a count")),
    }
}

/// A non-negative number of bytes or an id from a number or its text (`0`
/// when absent).
fn number<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    use serde::de::Error;
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Null => Ok(0),
        serde_json::Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| D::Error::custom("expected a non-negative number")),
        serde_json::Value::String(s) => s
            .trim()
            .parse()
            .map_err(|_| D::Error::custom("expected a non-negative number")),
        _ => Err(D::Error::custom("expected a non-negative number")),
    }
}

/// `/access/{small,large}/QID/token`: an assembly request, as mrt-store
/// queues it (`QueueUtil.queueAccessRequest`) and mrt-zk's `Access` reads it
/// (`token`, `cloud-content-byte`, `delivery-node`, `status`), then the
/// object version `ingest` assembles (`ark`, `version`, `format`), which
/// Merritt's readers ignore.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AccessTokenNode {
    /// The HTTP status mrt-store answered the request with (201, queued).
    #[serde(deserialize_with = "number")]
    pub status: u64,
    /// The token the requester polls with.
    #[serde(deserialize_with = "text")]
    pub token: String,
    /// The bytes to assemble.
    #[serde(rename = "cloud-content-byte", deserialize_with = "number")]
    pub cloud_content_byte: u64,
    /// The storage node the object is read from.
    #[serde(rename = "delivery-node", deserialize_with = "number")]
    pub delivery_node: u64,
    /// The object's ark.
    #[serde(deserialize_with = "text")]
    pub ark: String,
    /// The version (0 for the latest).
    #[serde(deserialize_with = "number")]
    pub version: u64,
    /// The container format (`zip`, `tar`, `targz`).
    #[serde(deserialize_with = "text")]
    pub format: String,
    /// `producer` or `full` (mrt-store's `content`); empty when read from a
    /// node written before it was carried (producer).
    #[serde(deserialize_with = "text")]
    pub content: String,
    /// Whether the container holds a BagIt bag (absent when not).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub bag: bool,
    /// Where the finished container is downloaded (mrt-zk's `url`); absent
    /// until it is ready, as every key below.
    #[serde(skip_serializing_if = "String::is_empty", deserialize_with = "text")]
    pub url: String,
    /// The container's bytes.
    #[serde(
        rename = "delivery-size",
        skip_serializing_if = "is_zero",
        deserialize_with = "number"
    )]
    pub delivery_size: u64,
    /// The container's SHA-256 (hex).
    #[serde(
        rename = "delivery-digest",
        skip_serializing_if = "String::is_empty",
        deserialize_with = "text"
    )]
    pub delivery_digest: String,
    /// When it was ready (RFC 3339; mrt-zk's `anticipated-availability-time`,
    /// here the time it became available).
    #[serde(
        rename = "anticipated-availability-time",
        skip_serializing_if = "String::is_empty",
        deserialize_with = "text"
    )]
    pub available: String,
    /// When the URL stops answering (RFC 3339).
    #[serde(
        rename = "expiration-time",
        skip_serializing_if = "String::is_empty",
        deserialize_with = "text"
    )]
    pub expires: String,
}

/// `/access/{small,large}/QID/status`: the same three keys as a batch's
/// status (mrt-zk's `QueueItem.set_status`), with an access state's name.
pub type AccessStatusNode = BatchStatusNode;

/// `/batches/BID/submission`: the submission as given, with its uuid
/// (mrt-zk's `Batch` loader, the admin tool's batch columns).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SubmissionNode {
    /// The collection profile.
    #[serde(deserialize_with = "text")]
    pub profile_name: String,
    /// Who submitted.
    #[serde(deserialize_with = "text")]
    pub submitter: String,
    /// The payload URL.
    #[serde(deserialize_with = "text")]
    pub payload_url: String,
    /// The payload type (`file`, `container`, `object-manifest`, …).
    #[serde(rename = "type", deserialize_with = "text")]
    pub payload_type: String,
    /// The response type.
    #[serde(deserialize_with = "text")]
    pub response_type: String,
    /// `add` or `update`.
    #[serde(deserialize_with = "text")]
    pub submission_mode: String,
    /// ERC what (title).
    #[serde(deserialize_with = "text")]
    pub erc_what: String,
    /// ERC who (creator).
    #[serde(deserialize_with = "text")]
    pub erc_who: String,
    /// ERC when (date).
    #[serde(deserialize_with = "text")]
    pub erc_when: String,
    /// ERC where (local id).
    #[serde(deserialize_with = "text")]
    pub erc_where: String,
    /// The submission's uuid.
    #[serde(rename = "batchID", deserialize_with = "text")]
    pub batch_id: String,
    /// The keys Merritt's own readers use, beside the documented ones.
    #[serde(flatten)]
    pub merritt: MerrittKeys,
    /// Inline manifest lines (absent when there are none).
    #[serde(skip_serializing_if = "Vec::is_empty", deserialize_with = "texts")]
    pub manifest: Vec<String>,
    /// The depositor's digest algorithm, when given.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_text"
    )]
    pub digest_type: Option<String>,
    /// The depositor's digest value, when given.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_text"
    )]
    pub digest_value: Option<String>,
    /// Further fields, in key order (never one of the names above: the
    /// projector leaves those out).
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `/batches/BID/status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BatchStatusNode {
    /// The batch state's name (`Pending`, `Processing`, …).
    #[serde(deserialize_with = "text")]
    pub status: String,
    /// When it changed, as mrt-zk writes it (`2024-05-16 10:11:12 +0000`).
    #[serde(deserialize_with = "text")]
    pub last_modified: String,
    /// The message of the change.
    #[serde(deserialize_with = "text")]
    pub message: String,
}

/// `/batches/BID/status-report`: what reporting found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StatusReportNode {
    /// When the report was made.
    #[serde(deserialize_with = "text")]
    pub last_modified: String,
    /// Failed jobs.
    #[serde(deserialize_with = "texts")]
    pub failed_jobs: Vec<String>,
    /// Completed jobs.
    #[serde(deserialize_with = "texts")]
    pub successful_jobs: Vec<String>,
}

/// `/jobs/JID/status` (mrt-zk's `Job` loader; every worker reads it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct JobStatusNode {
    /// The job state's name (`Estimating`, `UpdateReporting`, …).
    #[serde(deserialize_with = "text")]
    pub status: String,
    /// When it changed.
    #[serde(deserialize_with = "text")]
    pub last_modified: String,
    /// The message of the change.
    #[serde(deserialize_with = "text")]
    pub message: String,
    /// The last state the job completed; `null` until its first move.
    #[serde(deserialize_with = "optional_text")]
    pub last_successful_status: Option<String>,
    /// How often the job was requeued.
    #[serde(deserialize_with = "count")]
    pub retry_count: u32,
    /// The kind of the job's failure when its step named one
    /// (`digest_mismatch`: unrecoverable, a new submission is required);
    /// written only then, so every other status node keeps mrt-zk's keys.
    #[serde(
        deserialize_with = "optional_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub failure: Option<String>,
}

/// `/jobs/JID/configuration`: what the job was submitted with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConfigurationNode {
    /// The collection profile.
    #[serde(deserialize_with = "text")]
    pub profile_name: String,
    /// Who submitted.
    #[serde(deserialize_with = "text")]
    pub submitter: String,
    /// The payload URL.
    #[serde(deserialize_with = "text")]
    pub payload_url: String,
    /// The payload type.
    #[serde(deserialize_with = "text")]
    pub payload_type: String,
    /// The response type.
    #[serde(deserialize_with = "text")]
    pub response_type: String,
    /// `add` or `update`.
    #[serde(deserialize_with = "text")]
    pub submission_mode: String,
    /// The depositor's digest algorithm, when given.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_text"
    )]
    pub digest_type: Option<String>,
    /// The depositor's digest value, when given.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_text"
    )]
    pub digest_value: Option<String>,
    /// The payload type under the key Merritt's readers use (`type`).
    #[serde(rename = "type", deserialize_with = "text")]
    pub merritt_type: String,
    /// The keys Merritt's own readers use, beside the documented ones.
    #[serde(flatten)]
    pub merritt: MerrittKeys,
}

/// The keys Merritt's running code reads from `/batches/BID/submission` and
/// `/jobs/JID/configuration` besides the documented ones: mrt-ingest's
/// `InitializeConsumer` checks collection holds on `configuration.profile`,
/// mrt-zk's Ruby getters and the admin tool read `profile`, `type`,
/// `responseForm`, `submissionDate`, `filename`, `title` and `creator`.
/// Written with the values mrt-ingest gives them (empty text when there is
/// nothing to say), after the documented keys, in this order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MerrittKeys {
    /// The collection profile (mrt-ingest's `profile`; the same value as
    /// `profile_name`).
    #[serde(deserialize_with = "text")]
    pub profile: String,
    /// When the batch was submitted, ISO 8601 (`2024-05-16T10:11:12+00:00`).
    #[serde(rename = "submissionDate", deserialize_with = "text")]
    pub submission_date: String,
    /// The payload's file name: the last segment of the payload URL's path.
    #[serde(deserialize_with = "text")]
    pub filename: String,
    /// The depositor's response form (`response_type`).
    #[serde(rename = "responseForm", deserialize_with = "text")]
    pub response_form: String,
    /// The object's title (ERC what).
    #[serde(deserialize_with = "text")]
    pub title: String,
    /// The object's creator (ERC who).
    #[serde(deserialize_with = "text")]
    pub creator: String,
}

impl MerrittKeys {
    /// Every key, in the order they are written (one list, shared with the
    /// submission's validation, which keeps extra fields off them).
    pub const KEYS: [&'static str; 6] = ingest_events::command::MERRITT_READER_KEYS;
}

/// The file name Merritt shows for a payload URL: the last non-empty
/// segment of its path, without query or fragment (`""` when there is
/// none).
pub fn payload_file_name(url: &str) -> String {
    let path = url.split(['?', '#']).next().unwrap_or_default();
    let path = path.split_once("://").map_or(path, |(_, rest)| {
        rest.split_once('/').map_or("", |(_, p)| p)
    });
    path.rsplit('/')
        .find(|s| !s.is_empty())
        .unwrap_or_default()
        .to_string()
}

/// `/jobs/JID/identifiers` (absent while the job has none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IdentifiersNode {
    /// The ark, `""` until known.
    #[serde(deserialize_with = "text")]
    pub primary_id: String,
    /// The local ids.
    #[serde(deserialize_with = "texts")]
    pub local_id: Vec<String>,
}

/// `/jobs/JID/metadata` (absent while every field is).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MetadataNode {
    /// ERC who.
    #[serde(deserialize_with = "text")]
    pub erc_who: String,
    /// ERC what.
    #[serde(deserialize_with = "text")]
    pub erc_what: String,
    /// ERC when.
    #[serde(deserialize_with = "text")]
    pub erc_when: String,
    /// ERC where.
    #[serde(deserialize_with = "text")]
    pub erc_where: String,
}

/// `/jobs/JID/store`: the storage hand-off.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StoreNode {
    /// The storage manifest.
    #[serde(deserialize_with = "text")]
    pub manifest_url: String,
    /// `add` or `update`.
    #[serde(deserialize_with = "text")]
    pub mode: String,
    /// `"true"`/`"false"` as mrt-zk's `Job.setStore` writes it.
    #[serde(deserialize_with = "text")]
    pub delete: String,
}

/// `/jobs/JID/inventory`: the inventory hand-off.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct InventoryNode {
    /// The storage manifest the inventory reads.
    #[serde(deserialize_with = "text")]
    pub manifest_url: String,
    /// `add` or `update`.
    #[serde(deserialize_with = "text")]
    pub mode: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_status_round_trips_with_null_last_successful_status() {
        let node = JobStatusNode {
            status: "Estimating".into(),
            last_modified: "2024-05-16 10:11:12 +0000".into(),
            message: String::new(),
            last_successful_status: None,
            retry_count: 0,
            failure: None,
        };
        let text = serde_json::to_string(&node).expect("encode");
        assert_eq!(
            text,
            r#"{"status":"Estimating","last_modified":"2024-05-16 10:11:12 +0000","message":"","last_successful_status":null,"retry_count":0}"#
        );
        assert_eq!(decode::<JobStatusNode>("status", text.as_bytes()), Ok(node));
    }

    #[test]
    fn readers_take_nodes_written_by_others() {
        // Unknown keys, missing keys, numbers as text, null as empty.
        let n: JobStatusNode = decode(
            "/jobs/JID/status",
            br#"{"status":"Failed","retry_count":"2","extra":{"x":1},"message":null}"#,
        )
        .expect("lenient");
        assert_eq!(n.status, "Failed");
        assert_eq!(n.retry_count, 2);
        assert_eq!(n.last_successful_status, None);
        let ids: IdentifiersNode =
            decode("/jobs/JID/identifiers", br#"{"local_id":"only-one"}"#).expect("lenient");
        assert_eq!(ids.local_id, ["only-one"]);
        let s: SubmissionNode = decode(
            "/batches/BID/submission",
            br#"{"type":"file","profile":"p","n":3}"#,
        )
        .expect("lenient");
        assert_eq!(s.payload_type, "file");
        assert_eq!(s.merritt.profile, "p", "Merritt's key is read as its own");
        assert_eq!(s.extra.get("n"), Some(&serde_json::json!(3)));
        assert!(!s.extra.contains_key("profile"));
    }

    #[test]
    fn hostile_nodes_are_refused_naming_the_node_not_quoting_it() {
        let big = vec![b' '; MAX_NODE_BYTES + 1];
        let e = decode::<JobStatusNode>("/jobs/JID/status", &big).expect_err("too large");
        assert!(matches!(e, NodeError::TooLarge { .. }), "{e}");
        let secret = br#"{"status":{"secret-value-1234":1}}"#;
        let e = decode::<JobStatusNode>("/jobs/JID/status", secret).expect_err("bad shape");
        let text = e.to_string();
        assert!(text.contains("/jobs/JID/status"), "{text}");
        assert!(!text.contains("secret-value-1234"), "{text}");
        assert!(decode::<JobStatusNode>("/jobs/JID/status", b"not json").is_err());
    }

    /// The token node keeps mrt-store's keys and order, and reads what
    /// Merritt's admin tool writes (`fake_access`).
    #[test]
    fn access_tokens_read_merritts_keys() {
        let node = AccessTokenNode {
            status: 201,
            token: "t".into(),
            cloud_content_byte: 17_079,
            delivery_node: 7777,
            ark: "ark:/1/2".into(),
            version: 0,
            format: "zip".into(),
            content: "producer".into(),
            ..AccessTokenNode::default()
        };
        let text = serde_json::to_string(&node).expect("encode");
        assert_eq!(
            text,
            r#"{"status":201,"token":"t","cloud-content-byte":17079,"delivery-node":7777,"ark":"ark:/1/2","version":0,"format":"zip","content":"producer"}"#
        );
        let merritt: AccessTokenNode = decode(
            "/access/small/QID/token",
            br#"{"cloud-content-byte":17079,"delivery-node":"7777","status":201,"token":"aaaa"}"#,
        )
        .expect("Merritt's own node");
        assert_eq!(
            (
                merritt.cloud_content_byte,
                merritt.delivery_node,
                merritt.token.as_str()
            ),
            (17_079, 7777, "aaaa")
        );
        assert!(decode::<AccessTokenNode>("t", br#"{"cloud-content-byte":-1}"#).is_err());
    }

    #[test]
    fn payload_file_names_are_the_last_path_segment() {
        for (url, name) in [
            ("https://example.org/a/b.zip?x=1#f", "b.zip"),
            ("https://example.org/dir/", "dir"),
            ("https://example.org", ""),
            ("file:///srv/in/c.checkm", "c.checkm"),
            ("", ""),
        ] {
            assert_eq!(payload_file_name(url), name, "{url}");
        }
    }

    /// mrt-ingest's `InitializeConsumer` reads `configuration.profile`; the
    /// admin tool reads `type`, `submissionDate`, `creator`, `title`,
    /// `filename` from the same node.
    #[test]
    fn configuration_carries_merritts_keys_after_the_documented_ones() {
        let node = ConfigurationNode {
            profile_name: "demo".into(),
            payload_type: "file".into(),
            merritt_type: "file".into(),
            merritt: MerrittKeys {
                profile: "demo".into(),
                title: "T".into(),
                ..MerrittKeys::default()
            },
            ..ConfigurationNode::default()
        };
        let text = serde_json::to_string(&node).expect("encode");
        assert!(
            text.ends_with(r#""submission_mode":"","type":"file","profile":"demo","submissionDate":"","filename":"","responseForm":"","title":"T","creator":""}"#),
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["profile"], "demo");
        assert_eq!(decode::<ConfigurationNode>("c", text.as_bytes()), Ok(node));
    }

    #[test]
    fn submission_keeps_key_order_and_leaves_out_empty_optionals() {
        let node = SubmissionNode {
            profile_name: "p".into(),
            batch_id: "u".into(),
            extra: [("zeta".to_string(), serde_json::json!("z"))].into(),
            ..SubmissionNode::default()
        };
        let text = serde_json::to_string(&node).expect("encode");
        assert_eq!(
            text,
            r#"{"profile_name":"p","submitter":"","payload_url":"","type":"","response_type":"","submission_mode":"","erc_what":"","erc_who":"","erc_when":"","erc_where":"","batchID":"u","profile":"","submissionDate":"","filename":"","responseForm":"","title":"","creator":"","zeta":"z"}"#
        );
    }
}
