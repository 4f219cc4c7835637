//! A plain, ordered config tree that the planner reads, plus key checking with "did you mean".
//!
//! The YAML loader ([`super::config`]) produces its own value type; the planner converts it into
//! a [`Node`] once (`Node::from(&Value)`); errors are mapped back to file positions with
//! [`PlanError::locate`].
//! Mapping order is preserved (it decides the order of `post_mip` nodes).

use super::config::Value;
use super::plan_error::PlanError;

/// One value of a loaded config: YAML's data model after composition and interpolation.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    /// `null`, `~` or an empty value.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// A string.
    Str(String),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in document order (keys are unique).
    Map(Vec<(String, Node)>),
}

impl Node {
    /// The value under `key` if `self` is a mapping that has it.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The value at a dotted path (`a.b.c`); `None` if any step is missing or not a mapping.
    pub fn get_path(&self, dotted: &str) -> Option<&Node> {
        dotted.split('.').try_fold(self, |node, key| node.get(key))
    }

    /// The entries if `self` is a mapping.
    pub fn as_map(&self) -> Option<&[(String, Node)]> {
        match self {
            Node::Map(entries) => Some(entries),
            _ => None,
        }
    }

    /// The string if `self` is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Node::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The boolean if `self` is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Node::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// Whether `self` is `Null`.
    pub fn is_null(&self) -> bool {
        matches!(self, Node::Null)
    }

    /// A short rendering of the value for error messages (at most ~60 characters).
    pub fn describe(&self) -> String {
        let s = match self {
            Node::Null => "null".to_string(),
            Node::Bool(b) => b.to_string(),
            Node::Int(i) => i.to_string(),
            Node::Float(f) => format!("{f:?}"),
            Node::Str(s) => format!("{s:?}"),
            Node::Seq(items) => format!("a list of {} item(s)", items.len()),
            Node::Map(entries) => format!("a mapping of {} key(s)", entries.len()),
        };
        if s.chars().count() > 60 {
            let cut: String = s.chars().take(57).collect();
            format!("{cut}...")
        } else {
            s
        }
    }

    /// Converts a `serde_json::Value` (object keys come out sorted); for tests and callers who
    /// build configs in code.
    pub fn from_json(value: &serde_json::Value) -> Node {
        use serde_json::Value as J;
        match value {
            J::Null => Node::Null,
            J::Bool(b) => Node::Bool(*b),
            J::Number(n) => match n.as_i64() {
                Some(i) => Node::Int(i),
                None => Node::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            J::String(s) => Node::Str(s.clone()),
            J::Array(items) => Node::Seq(items.iter().map(Node::from_json).collect()),
            J::Object(map) => Node::Map(
                map.iter()
                    .map(|(k, v)| (k.clone(), Node::from_json(v)))
                    .collect(),
            ),
        }
    }

    /// Writes `self` as canonical JSON (RFC 8785 style: object keys sorted by UTF-16 code
    /// units, shortest round-trip numbers, no whitespace) into `out`. Non-finite floats are
    /// written as strings `"NaN"`, `"inf"`, `"-inf"` (they cannot come from YAML 1.2 numbers
    /// the planner accepts, but the hash must still be total).
    pub fn write_canonical(&self, out: &mut String) {
        match self {
            Node::Null => out.push_str("null"),
            Node::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Node::Int(i) => out.push_str(&i.to_string()),
            Node::Float(f) => {
                if f.is_finite() {
                    if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 {
                        // JCS writes integral doubles without a fraction; -0.0 becomes 0.
                        out.push_str(&format!("{}", *f as i64));
                    } else {
                        let mut buf = ryu_js::Buffer::new();
                        out.push_str(buf.format_finite(*f));
                    }
                } else if f.is_nan() {
                    out.push_str("\"NaN\"");
                } else if *f > 0.0 {
                    out.push_str("\"inf\"");
                } else {
                    out.push_str("\"-inf\"");
                }
            }
            Node::Str(s) => write_json_string(s, out),
            Node::Seq(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write_canonical(out);
                }
                out.push(']');
            }
            Node::Map(entries) => {
                let mut sorted: Vec<&(String, Node)> = entries.iter().collect();
                sorted.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
                out.push('{');
                for (i, (k, v)) in sorted.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_json_string(k, out);
                    out.push(':');
                    v.write_canonical(out);
                }
                out.push('}');
            }
        }
    }

    /// Converts to a `serde_json::Value` (mapping order is lost unless serde_json keeps it).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Node::Null => J::Null,
            Node::Bool(b) => J::Bool(*b),
            Node::Int(i) => J::from(*i),
            Node::Float(f) => serde_json::Number::from_f64(*f)
                .map(J::Number)
                .unwrap_or(J::Null),
            Node::Str(s) => J::String(s.clone()),
            Node::Seq(items) => J::Array(items.iter().map(Node::to_json).collect()),
            Node::Map(entries) => J::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }
}

impl From<&Value> for Node {
    /// The planner's view of a loaded config value (mapping order kept).
    fn from(v: &Value) -> Node {
        match v {
            Value::Null => Node::Null,
            Value::Bool(b) => Node::Bool(*b),
            Value::Int(i) => Node::Int(*i),
            Value::Float(f) => Node::Float(*f),
            Value::String(s) => Node::Str(s.clone()),
            Value::List(items) => Node::Seq(items.iter().map(Node::from).collect()),
            Value::Mapping(m) => {
                Node::Map(m.iter().map(|(k, v)| (k.clone(), Node::from(v))).collect())
            }
        }
    }
}

fn write_json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Joins a parent key path and a key: `join("a.b", "c") == "a.b.c"`, `join("", "c") == "c"`.
pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Levenshtein edit distance (insertions, deletions, substitutions), on chars.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The candidate most likely meant by `key`: a small edit distance (at most a third of the
/// length, at least 2), or `key` being `candidate` plus a `_suffix` (`tp_size` -> `tp`).
pub(crate) fn did_you_mean<'a, I>(key: &str, candidates: I) -> Option<String>
where
    I: IntoIterator<Item = &'a str>,
{
    let key_lower = key.to_ascii_lowercase();
    let mut best: Option<(usize, &str)> = None;
    for cand in candidates {
        let d = edit_distance(&key_lower, &cand.to_ascii_lowercase());
        let limit = (key.chars().count().max(cand.chars().count()) / 3).max(2);
        let score = if d <= limit {
            d
        } else if key_lower.starts_with(&format!("{cand}_"))
            || key_lower.starts_with(&format!("{cand}-"))
        {
            limit + 1
        } else {
            continue;
        };
        if best.is_none_or(|(s, _)| score < s) {
            best = Some((score, cand));
        }
    }
    best.map(|(_, c)| c.to_string())
}

/// Checks that every key of `map` is in `valid`; the first unknown key becomes
/// [`PlanError::UnknownField`] with its full path and a suggestion.
pub(crate) fn check_keys(
    file: &str,
    path: &str,
    map: &[(String, Node)],
    valid: &[&str],
) -> Result<(), PlanError> {
    for (key, _) in map {
        if !valid.contains(&key.as_str()) {
            return Err(PlanError::UnknownField {
                file: file.to_string(),
                path: join(path, key),
                suggestion: did_you_mean(key, valid.iter().copied()),
                valid: valid.iter().map(|s| s.to_string()).collect(),
            });
        }
    }
    Ok(())
}

/// Requires `node` to be a mapping (or null, read as empty).
pub(crate) fn expect_map<'a>(
    file: &str,
    path: &str,
    node: &'a Node,
) -> Result<&'a [(String, Node)], PlanError> {
    match node {
        Node::Map(entries) => Ok(entries),
        Node::Null => Ok(&[]),
        other => Err(invalid(file, path, other, "a mapping")),
    }
}

/// Builds an [`PlanError::InvalidValue`].
pub(crate) fn invalid(file: &str, path: &str, node: &Node, expected: &str) -> PlanError {
    PlanError::InvalidValue {
        file: file.to_string(),
        path: path.to_string(),
        value: node.describe(),
        expected: expected.to_string(),
    }
}

/// Reads a positive integer (>= `min`) that fits `u32`; floats like `2.7` and strings are refused.
pub(crate) fn expect_u32(file: &str, path: &str, node: &Node, min: u32) -> Result<u32, PlanError> {
    match node {
        Node::Int(i) if *i >= i64::from(min) && *i <= i64::from(u32::MAX) => Ok(*i as u32),
        other => Err(invalid(file, path, other, &format!("an integer >= {min}"))),
    }
}

/// Reads an optional string: `Null` is `None`.
pub(crate) fn expect_opt_str(
    file: &str,
    path: &str,
    node: &Node,
) -> Result<Option<String>, PlanError> {
    match node {
        Node::Null => Ok(None),
        Node::Str(s) => Ok(Some(s.clone())),
        other => Err(invalid(file, path, other, "a string or null")),
    }
}

/// Reads a list of strings (`Null` is empty).
pub(crate) fn expect_str_list(
    file: &str,
    path: &str,
    node: &Node,
) -> Result<Vec<String>, PlanError> {
    match node {
        Node::Null => Ok(Vec::new()),
        Node::Seq(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Node::Str(s) => Ok(s.clone()),
                other => Err(invalid(file, &format!("{path}[{i}]"), other, "a string")),
            })
            .collect(),
        other => Err(invalid(file, path, other, "a list of strings")),
    }
}

impl serde::Serialize for Node {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self {
            Node::Null => s.serialize_unit(),
            Node::Bool(b) => s.serialize_bool(*b),
            Node::Int(i) => s.serialize_i64(*i),
            Node::Float(f) => s.serialize_f64(*f),
            Node::Str(v) => s.serialize_str(v),
            Node::Seq(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Node::Map(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> serde::Deserialize<'de> for Node {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Node;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a config value")
            }
            fn visit_unit<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_none<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
                serde::Deserialize::deserialize(d)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Node, E> {
                Ok(Node::Bool(b))
            }
            fn visit_i64<E>(self, i: i64) -> Result<Node, E> {
                Ok(Node::Int(i))
            }
            fn visit_u64<E: serde::de::Error>(self, u: u64) -> Result<Node, E> {
                i64::try_from(u)
                    .map(Node::Int)
                    .or(Ok(Node::Float(u as f64)))
            }
            fn visit_f64<E>(self, f: f64) -> Result<Node, E> {
                Ok(Node::Float(f))
            }
            fn visit_str<E>(self, s: &str) -> Result<Node, E> {
                Ok(Node::Str(s.to_string()))
            }
            fn visit_string<E>(self, s: String) -> Result<Node, E> {
                Ok(Node::Str(s))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = a.next_element()? {
                    items.push(item);
                }
                Ok(Node::Seq(items))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
                let mut entries: Vec<(String, Node)> = Vec::new();
                while let Some((k, v)) = a.next_entry::<String, Node>()? {
                    if entries.iter().any(|(e, _)| *e == k) {
                        return Err(serde::de::Error::custom(format!("duplicate key `{k}`")));
                    }
                    entries.push((k, v));
                }
                Ok(Node::Map(entries))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn did_you_mean_finds_typos_and_suffixes() {
        let mesh = ["tp", "cp", "pp", "ep", "dp_shard", "dp_replicate"];
        assert_eq!(did_you_mean("tp_size", mesh), Some("tp".to_string()));
        assert_eq!(
            did_you_mean("dp_shards", mesh),
            Some("dp_shard".to_string())
        );
        assert_eq!(
            did_you_mean("partiton", ["partition", "account"]),
            Some("partition".into())
        );
        assert_eq!(did_you_mean("zzzzzzzz", ["partition", "account"]), None);
    }

    #[test]
    fn canonical_json_sorts_keys_and_normalizes_numbers() {
        let a = Node::Map(vec![
            ("b".into(), Node::Float(1.0)),
            (
                "a".into(),
                Node::Seq(vec![Node::Float(0.1), Node::Str("x\"y".into())]),
            ),
        ]);
        let mut out = String::new();
        a.write_canonical(&mut out);
        assert_eq!(out, r#"{"a":[0.1,"x\"y"],"b":1}"#);
    }

    #[test]
    fn check_keys_reports_path_and_suggestion() {
        let map = vec![("acount".to_string(), Node::Null)];
        let err =
            check_keys("r.yaml", "runner.slurm", &map, &["account", "partition"]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("runner.slurm.acount"), "{msg}");
        assert!(msg.contains("did you mean `account`"), "{msg}");
    }
}
