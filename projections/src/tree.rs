//! An in-memory ZooKeeper node tree: apply operations with ZooKeeper's rules,
//! dump it as text, diff two trees, and materialize the tree the log implies
//! at any position or time.
//!
//! The tree is what the projector believes ZooKeeper holds, what tests compare
//! against, and what a live tree read back from ZooKeeper is turned into for a
//! diff. The root `/` always exists and carries no data.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::ops::{Op, OpKind};

/// An operation that ZooKeeper would refuse.
///
/// ### Handling
/// Against a tree the projector produced, any of these is a projector defect.
/// Against a live tree, it means the live tree drifted from the log: diff the
/// two and repair (or rebuild) before projecting further.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TreeError {
    /// `NodeExists`: a create of a node that exists.
    #[error("{op} {path}: the node already exists")]
    NodeExists {
        /// The operation.
        op: OpKind,
        /// The path.
        path: String,
    },
    /// `NoNode`: a set or delete of a missing node, or a create under a
    /// missing parent.
    #[error("{op} {path}: {}", match parent { Some(p) => format!("the parent {p} does not exist"), None => "the node does not exist".to_string() })]
    NoNode {
        /// The operation.
        op: OpKind,
        /// The path.
        path: String,
        /// The missing parent, for a create.
        parent: Option<String>,
    },
    /// `NotEmpty`: a delete of a node that has children.
    #[error("{op} {path}: the node has children (e.g. {child})")]
    NotEmpty {
        /// The operation.
        op: OpKind,
        /// The path.
        path: String,
        /// One of its children.
        child: String,
    },
    /// `BadArguments`: a path ZooKeeper does not accept.
    #[error("{op} {path:?}: invalid path: {reason}")]
    InvalidPath {
        /// The operation.
        op: OpKind,
        /// The path.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// A tree of nodes by absolute path, each with its data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tree {
    nodes: BTreeMap<String, Vec<u8>>,
}

impl From<BTreeMap<String, Vec<u8>>> for Tree {
    /// Takes nodes as they are (a tree read back from ZooKeeper), without
    /// checking ZooKeeper's rules; an entry for `/` is dropped.
    fn from(mut nodes: BTreeMap<String, Vec<u8>>) -> Tree {
        nodes.remove("/");
        Tree { nodes }
    }
}

impl Tree {
    /// An empty tree (only the root).
    pub fn new() -> Tree {
        Tree::default()
    }

    /// The data of a node (`Some(&[])` for the root).
    pub fn get(&self, path: &str) -> Option<&[u8]> {
        if path == "/" {
            return Some(&[]);
        }
        self.nodes.get(path).map(Vec::as_slice)
    }

    /// Whether a node exists.
    pub fn contains(&self, path: &str) -> bool {
        path == "/" || self.nodes.contains_key(path)
    }

    /// The number of nodes, without the root.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the tree has only its root.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Every node but the root, with its data, in path order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> + '_ {
        self.nodes.iter().map(|(p, d)| (p.as_str(), d.as_slice()))
    }

    /// The nodes as a map.
    pub fn as_map(&self) -> &BTreeMap<String, Vec<u8>> {
        &self.nodes
    }

    /// Every node strictly below `path`, in path order (parents before children).
    pub fn descendants<'a>(&'a self, path: &str) -> impl Iterator<Item = &'a str> + 'a {
        let prefix = if path == "/" {
            "/".to_string()
        } else {
            format!("{path}/")
        };
        self.nodes
            .range::<str, _>((
                std::ops::Bound::Included(prefix.as_str()),
                std::ops::Bound::Unbounded,
            ))
            .map(|(p, _)| p.as_str())
            .take_while(move |p| p.starts_with(&prefix))
    }

    /// The direct children of `path`, as full paths, in path order.
    pub fn children<'a>(&'a self, path: &str) -> impl Iterator<Item = &'a str> + 'a {
        let depth = if path == "/" { 0 } else { path.len() };
        self.descendants(path)
            .filter(move |p| !p[depth + 1..].contains('/'))
    }

    /// Whether `path` has at least one child.
    pub fn has_children(&self, path: &str) -> bool {
        self.descendants(path).next().is_some()
    }

    /// Applies one operation with ZooKeeper's rules.
    ///
    /// # Errors
    /// A [`TreeError`] naming the operation and the path; the tree is unchanged.
    pub fn apply(&mut self, op: &Op) -> Result<(), TreeError> {
        let path = op.path();
        validate_path(path).map_err(|reason| TreeError::InvalidPath {
            op: op.kind(),
            path: path.to_string(),
            reason: reason.to_string(),
        })?;
        if path == "/" {
            return Err(match op {
                Op::Create { .. } => TreeError::NodeExists {
                    op: op.kind(),
                    path: path.into(),
                },
                _ => TreeError::InvalidPath {
                    op: op.kind(),
                    path: path.into(),
                    reason: "the root is not written by the projection".into(),
                },
            });
        }
        match op {
            Op::Create { data, .. } => {
                if self.nodes.contains_key(path) {
                    return Err(TreeError::NodeExists {
                        op: op.kind(),
                        path: path.into(),
                    });
                }
                let parent = parent_of(path);
                if !self.contains(parent) {
                    return Err(TreeError::NoNode {
                        op: op.kind(),
                        path: path.into(),
                        parent: Some(parent.into()),
                    });
                }
                self.nodes.insert(path.to_string(), data.clone());
            }
            Op::SetData { data, .. } => match self.nodes.get_mut(path) {
                Some(d) => *d = data.clone(),
                None => {
                    return Err(TreeError::NoNode {
                        op: op.kind(),
                        path: path.into(),
                        parent: None,
                    })
                }
            },
            Op::Delete { .. } => {
                if !self.nodes.contains_key(path) {
                    return Err(TreeError::NoNode {
                        op: op.kind(),
                        path: path.into(),
                        parent: None,
                    });
                }
                if let Some(child) = self.children(path).next() {
                    return Err(TreeError::NotEmpty {
                        op: op.kind(),
                        path: path.into(),
                        child: child.to_string(),
                    });
                }
                self.nodes.remove(path);
            }
        }
        Ok(())
    }

    /// Applies operations in order, all or nothing, as a ZooKeeper `multi`
    /// does: each operation sees the effect of the ones before it.
    ///
    /// # Errors
    /// The first refused operation's [`TreeError`]; the tree is then unchanged.
    pub fn apply_all<'a>(
        &mut self,
        ops: impl IntoIterator<Item = &'a Op>,
    ) -> Result<(), TreeError> {
        let mut undo: Vec<(String, Option<Vec<u8>>)> = Vec::new();
        for op in ops {
            let previous = self.nodes.get(op.path()).cloned();
            if let Err(e) = self.apply(op) {
                for (path, previous) in undo.into_iter().rev() {
                    self.restore(path, previous);
                }
                return Err(e);
            }
            undo.push((op.path().to_string(), previous));
        }
        Ok(())
    }

    /// Puts a node back as it was (undo of an applied operation).
    pub(crate) fn restore(&mut self, path: String, previous: Option<Vec<u8>>) {
        match previous {
            Some(d) => {
                self.nodes.insert(path, d);
            }
            None => {
                self.nodes.remove(&path);
            }
        }
    }

    /// The nodes at and below `prefix` (every node for `None` or `/`) as
    /// YAML-like text, one node per entry in path order, in the form the seed
    /// documents use:
    ///
    /// ```text
    /// /jobs/jid0000000001/priority: 5
    /// /jobs/jid0000000001/status:
    ///   status: Pending
    ///   last_modified: 2024-05-16 10:11:12 +0000
    ///   message: ""
    ///   last_successful_status: null
    ///   retry_count: 0
    /// /jobs/states/pending/05-jid0000000001:
    /// ```
    ///
    /// A JSON object is shown as a mapping in its stored key order, other
    /// UTF-8 text as a scalar (quoted when YAML would misread it), empty data
    /// as an empty value, and bytes that are not UTF-8 as a double-quoted
    /// string of `\x` escapes.
    pub fn dump_yaml(&self, prefix: Option<&str>) -> String {
        let mut out = String::new();
        let prefix = prefix.filter(|p| *p != "/");
        let selected: Box<dyn Iterator<Item = (&str, &[u8])>> = match prefix {
            None => Box::new(self.iter()),
            Some(p) => Box::new(
                self.nodes
                    .get_key_value(p)
                    .map(|(k, v)| (k.as_str(), v.as_slice()))
                    .into_iter()
                    .chain(self.descendants(p).map(|d| (d, self.nodes[d].as_slice()))),
            ),
        };
        for (path, data) in selected {
            out.push_str(path);
            out.push(':');
            render_data(&mut out, data);
        }
        out
    }

    /// How `actual` differs from this tree, taken as the expected one.
    pub fn diff(&self, actual: &Tree) -> TreeDiff {
        self.diff_filtered(actual, |_| true)
    }

    /// [`Tree::diff`] without the workers' ephemeral locks (`…/lock` of a
    /// batch or job), which the projection never writes.
    pub fn diff_ignoring_locks(&self, actual: &Tree) -> TreeDiff {
        self.diff_filtered(actual, |p| !crate::layout::is_ephemeral_lock(p))
    }

    /// [`Tree::diff`] over the paths `keep` accepts only.
    pub fn diff_filtered(&self, actual: &Tree, keep: impl Fn(&str) -> bool) -> TreeDiff {
        let mut d = TreeDiff::default();
        for (path, data) in &self.nodes {
            if !keep(path) {
                continue;
            }
            match actual.nodes.get(path) {
                None => d.missing.push(path.clone()),
                Some(a) if a != data => d.differing.push(Differing {
                    path: path.clone(),
                    expected: data.clone(),
                    actual: a.clone(),
                }),
                Some(_) => {}
            }
        }
        for path in actual.nodes.keys() {
            if keep(path) && !self.nodes.contains_key(path) {
                d.unexpected.push(path.clone());
            }
        }
        d
    }
}

/// The differences between an expected and an actual tree.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TreeDiff {
    /// Expected nodes the actual tree lacks.
    pub missing: Vec<String>,
    /// Actual nodes that are not expected.
    pub unexpected: Vec<String>,
    /// Nodes in both with different data.
    pub differing: Vec<Differing>,
}

/// A node whose data differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Differing {
    /// The path.
    pub path: String,
    /// The expected data.
    pub expected: Vec<u8>,
    /// The actual data.
    pub actual: Vec<u8>,
}

impl TreeDiff {
    /// Whether the trees agree.
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty() && self.differing.is_empty()
    }
}

impl fmt::Display for TreeDiff {
    /// One line per difference: `- path` missing, `+ path` unexpected,
    /// `~ path` with the expected and actual data.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("no differences\n");
        }
        for p in &self.missing {
            writeln!(f, "- {p} (missing)")?;
        }
        for p in &self.unexpected {
            writeln!(f, "+ {p} (unexpected)")?;
        }
        for d in &self.differing {
            writeln!(f, "~ {}", d.path)?;
            writeln!(f, "    expected: {}", String::from_utf8_lossy(&d.expected))?;
            writeln!(f, "    actual:   {}", String::from_utf8_lossy(&d.actual))?;
        }
        Ok(())
    }
}

fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// A path ZooKeeper refuses, as its `PathUtils.validatePath` does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum BadPath {
    #[error("it must start with /")]
    NotAbsolute,
    #[error("it must not end with /")]
    TrailingSlash,
    #[error("it has an empty segment (//)")]
    EmptySegment,
    #[error("relative segment {0:?}")]
    Relative(&'static str),
    #[error("character {0:?} (U+{code:04X}) is not allowed", code = *.0 as u32)]
    Character(char),
}

/// ZooKeeper's `PathUtils.validatePath`, for paths as Rust strings.
fn validate_path(path: &str) -> Result<(), BadPath> {
    if !path.starts_with('/') {
        return Err(BadPath::NotAbsolute);
    }
    if path == "/" {
        return Ok(());
    }
    if path.ends_with('/') {
        return Err(BadPath::TrailingSlash);
    }
    for segment in path[1..].split('/') {
        match segment {
            "" => return Err(BadPath::EmptySegment),
            "." => return Err(BadPath::Relative(".")),
            ".." => return Err(BadPath::Relative("..")),
            _ => {}
        }
    }
    // ZooKeeper refuses NUL, C0/C1 controls, DEL, UTF-16 surrogates (every
    // character beyond U+FFFF is sent as a surrogate pair), the private-use
    // area and U+FFF0..U+FFFF.
    if let Some(c) = path.chars().find(|c| {
        let u = *c as u32;
        u == 0
            || (0x01..=0x1f).contains(&u)
            || (0x7f..=0x9f).contains(&u)
            || (0xd800..=0xf8ff).contains(&u)
            || (0xfff0..=0xffff).contains(&u)
            || u > 0xffff
    }) {
        return Err(BadPath::Character(c));
    }
    Ok(())
}

/// A JSON value that keeps the key order of the bytes it was read from.
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Number(String),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Json, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Number(v.to_string()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Number(v.to_string()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Json, E> {
        Ok(Json::Number(v.to_string()))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Json, E> {
        Ok(Json::String(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Json, E> {
        Ok(Json::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element()? {
            items.push(v);
        }
        Ok(Json::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut entries = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Json>()? {
            entries.push((k, v));
        }
        Ok(Json::Object(entries))
    }
}

impl Json {
    fn is_scalar(&self) -> bool {
        !matches!(self, Json::Array(_) | Json::Object(_))
    }

    /// Compact JSON text, which YAML reads as a flow collection.
    fn to_json(&self) -> String {
        match self {
            Json::Null => "null".into(),
            Json::Bool(b) => b.to_string(),
            Json::Number(n) => n.clone(),
            Json::String(s) => json_quote(s),
            Json::Array(items) => format!(
                "[{}]",
                items
                    .iter()
                    .map(Json::to_json)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Json::Object(entries) => format!(
                "{{{}}}",
                entries
                    .iter()
                    .map(|(k, v)| format!("{}:{}", json_quote(k), v.to_json()))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

fn json_quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Appends a node's data after `path:` and ends the line(s).
fn render_data(out: &mut String, data: &[u8]) {
    if data.is_empty() {
        out.push('\n');
        return;
    }
    let Ok(text) = std::str::from_utf8(data) else {
        out.push(' ');
        out.push('"');
        for b in data {
            out.push_str(&format!("\\x{b:02x}"));
        }
        out.push_str("\"\n");
        return;
    };
    match serde_json::from_str::<Json>(text) {
        Ok(Json::Object(entries)) if entries.is_empty() => out.push_str(" {}\n"),
        Ok(Json::Object(entries)) => {
            out.push('\n');
            render_map(out, &entries, 2);
        }
        _ => {
            out.push(' ');
            out.push_str(&scalar(text, Context::NodeText));
            out.push('\n');
        }
    }
}

fn render_map(out: &mut String, entries: &[(String, Json)], indent: usize) {
    let pad = " ".repeat(indent);
    for (key, value) in entries {
        out.push_str(&pad);
        out.push_str(&scalar(key, Context::Block));
        out.push(':');
        match value {
            Json::Object(e) if e.is_empty() => out.push_str(" {}\n"),
            Json::Object(e) => {
                out.push('\n');
                render_map(out, e, indent + 2);
            }
            Json::Array(items) if items.iter().all(Json::is_scalar) => {
                let items: Vec<String> = items
                    .iter()
                    .map(|i| render_scalar(i, Context::Flow))
                    .collect();
                out.push_str(&format!(" [{}]\n", items.join(", ")));
            }
            Json::Array(_) => {
                out.push(' ');
                out.push_str(&value.to_json());
                out.push('\n');
            }
            scalar_value => {
                out.push(' ');
                out.push_str(&render_scalar(scalar_value, Context::Block));
                out.push('\n');
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    /// A whole node's text: numbers stay bare (`priority: 5`).
    NodeText,
    /// A string inside a JSON object, block style.
    Block,
    /// A string inside a flow sequence.
    Flow,
}

fn render_scalar(v: &Json, ctx: Context) -> String {
    match v {
        Json::String(s) => scalar(s, ctx),
        other => other.to_json(),
    }
}

/// A string as a YAML scalar: bare when YAML reads it back as the same
/// string, double-quoted (JSON escapes, which YAML accepts) otherwise.
fn scalar(s: &str, ctx: Context) -> String {
    if plain_ok(s, ctx) {
        s.to_string()
    } else {
        json_quote(s)
    }
}

fn plain_ok(s: &str, ctx: Context) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    if "-?:,[]{}#&*!|>'\"%@`".contains(first)
        && !(first == '-' && s.len() > 1 && ctx == Context::NodeText)
    {
        return false;
    }
    if s.starts_with(' ') || s.ends_with(' ') || s.ends_with(':') {
        return false;
    }
    if s.contains(": ") || s.contains(" #") {
        return false;
    }
    if s.chars().any(|c| c.is_control()) {
        return false;
    }
    if ctx == Context::Flow && s.contains([',', '[', ']', '{', '}']) {
        return false;
    }
    if ctx != Context::NodeText {
        // A string that YAML would read as another type keeps its quotes.
        let lower = s.to_ascii_lowercase();
        if matches!(
            lower.as_str(),
            "true" | "false" | "null" | "~" | "yes" | "no" | "on" | "off" | "y" | "n"
        ) || s.parse::<f64>().is_ok()
            || s.parse::<i128>().is_ok()
        {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(ops: &[Op]) -> Tree {
        let mut t = Tree::new();
        t.apply_all(ops).expect("valid ops");
        t
    }

    #[test]
    fn zookeeper_rules_are_enforced() {
        let mut t = tree(&[Op::create("/a", ""), Op::create("/a/b", "x")]);
        assert!(matches!(
            t.apply(&Op::create("/a", "")),
            Err(TreeError::NodeExists { .. })
        ));
        assert!(matches!(
            t.apply(&Op::create("/x/y", "")),
            Err(TreeError::NoNode { parent: Some(p), .. }) if p == "/x"
        ));
        assert!(matches!(
            t.apply(&Op::delete("/a")),
            Err(TreeError::NotEmpty { child, .. }) if child == "/a/b"
        ));
        assert!(matches!(
            t.apply(&Op::set("/nope", "")),
            Err(TreeError::NoNode { parent: None, .. })
        ));
        assert!(matches!(
            t.apply(&Op::create("/a/", "")),
            Err(TreeError::InvalidPath { .. })
        ));
        assert!(matches!(
            t.apply(&Op::create("/a/\u{e000}", "")),
            Err(TreeError::InvalidPath { .. })
        ));
        let err = t.apply(&Op::delete("/a")).expect_err("not empty");
        assert_eq!(
            err.to_string(),
            "delete /a: the node has children (e.g. /a/b)"
        );
    }

    #[test]
    fn apply_all_is_all_or_nothing() {
        let mut t = tree(&[Op::create("/a", "1")]);
        let before = t.clone();
        let err = t
            .apply_all(&[
                Op::set("/a", "2"),
                Op::create("/b", ""),
                Op::create("/b", ""),
            ])
            .expect_err("duplicate create");
        assert!(matches!(err, TreeError::NodeExists { .. }));
        assert_eq!(t, before);
    }

    #[test]
    fn children_and_descendants() {
        let t = tree(&[
            Op::create("/a", ""),
            Op::create("/a/b", ""),
            Op::create("/a/b/c", ""),
            Op::create("/a/d", ""),
            Op::create("/ab", ""),
        ]);
        assert_eq!(t.children("/a").collect::<Vec<_>>(), ["/a/b", "/a/d"]);
        assert_eq!(
            t.descendants("/a").collect::<Vec<_>>(),
            ["/a/b", "/a/b/c", "/a/d"]
        );
        assert_eq!(t.children("/").collect::<Vec<_>>(), ["/a", "/ab"]);
    }

    #[test]
    fn dump_renders_json_text_and_empty_nodes() {
        let t = tree(&[
            Op::create("/j", ""),
            Op::create("/j/priority", "5"),
            Op::create(
                "/j/status",
                r#"{"status":"Pending","last_modified":"2024-05-16 10:11:12 +0000","message":"","last_successful_status":null,"retry_count":0}"#,
            ),
            Op::create(
                "/j/ids",
                r#"{"primary_id":"ark:/1/x","local_id":["a, b","c"],"n":"5"}"#,
            ),
            Op::create("/k", "not: plain"),
        ]);
        let expected = "\
/j:
/j/ids:
  primary_id: ark:/1/x
  local_id: [\"a, b\", c]
  \"n\": \"5\"
/j/priority: 5
/j/status:
  status: Pending
  last_modified: 2024-05-16 10:11:12 +0000
  message: \"\"
  last_successful_status: null
  retry_count: 0
/k: \"not: plain\"
";
        assert_eq!(t.dump_yaml(None), expected);
        assert_eq!(
            t.dump_yaml(Some("/j/ids")),
            "/j/ids:\n  primary_id: ark:/1/x\n  local_id: [\"a, b\", c]\n  \"n\": \"5\"\n"
        );
        // The dump is YAML that reads back as the same data.
        let parsed: BTreeMap<String, serde_json::Value> =
            serde_norway::from_str(expected).expect("the dump is YAML");
        assert_eq!(parsed["/j/status"]["retry_count"], 0);
        assert_eq!(parsed["/j/status"]["message"], "");
        assert_eq!(
            parsed["/j/status"]["last_successful_status"],
            serde_json::Value::Null
        );
        assert_eq!(parsed["/j/ids"]["n"], "5");
        assert_eq!(parsed["/j/ids"]["local_id"][0], "a, b");
        assert_eq!(parsed["/k"], "not: plain");
        assert_eq!(parsed["/j"], serde_json::Value::Null);
    }

    #[test]
    fn diff_reports_each_kind_and_can_ignore_locks() {
        let expected = tree(&[Op::create("/a", "1"), Op::create("/b", "")]);
        let actual = tree(&[
            Op::create("/a", "2"),
            Op::create("/c", ""),
            Op::create("/jobs", ""),
            Op::create("/jobs/jid0000000001", ""),
            Op::create("/jobs/jid0000000001/lock", ""),
        ]);
        let d = expected.diff(&actual);
        assert_eq!(d.missing, ["/b"]);
        assert_eq!(
            d.unexpected,
            [
                "/c",
                "/jobs",
                "/jobs/jid0000000001",
                "/jobs/jid0000000001/lock"
            ]
        );
        assert_eq!(d.differing.len(), 1);
        let d = expected.diff_ignoring_locks(&actual);
        assert!(!d.unexpected.iter().any(|p| p.ends_with("/lock")));
        assert!(expected.diff(&expected).is_empty());
    }
}
