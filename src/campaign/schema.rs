//! Reading the planner's schemas straight from the loaded [`Value`] tree: [`read`] converts a
//! node to a serde type (the runner, execution and user-stage files' `deny_unknown_fields`
//! shapes) and maps serde's errors to [`PlanError`]; small typed values shared by those shapes
//! ([`AtLeast`], [`StrList`], [`Argv`], [`Ordered`]); key checks with "did you mean" and typed
//! reads for the experiment's keys; and the canonical JSON the contract hash covers.
//!
//! Errors name the file label and the dotted key path; [`PlanError::locate`] then replaces the
//! label by the `file:line:column` (or override) that wrote the value, from the config's
//! [`Origins`](super::config::Origins). Mapping order is the document's (it decides the order
//! of `post_mip` nodes).

use std::fmt;
use std::sync::LazyLock;

use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};

use super::config::{
    DeError, DeErrorKind, KeyPath, Mapping, Value, deserialize_at, did_you_mean_in,
};
use super::plan_error::PlanError;

/// Reads `value` (found at `path` of the tree loaded from `file`) into the serde type `T` — the
/// file's shape, usually a `#[serde(deny_unknown_fields)]` struct — and turns a serde error
/// into the planner's: [`PlanError::UnknownField`] with the valid keys and a suggestion,
/// [`PlanError::MissingField`], or [`PlanError::InvalidValue`] naming the value and what was
/// expected; every one with the full key path.
pub(crate) fn read<T: DeserializeOwned>(
    file: &str,
    path: KeyPath,
    value: &Value,
) -> Result<T, PlanError> {
    deserialize_at(value, path).map_err(|e| plan_error(file, e))
}

/// The [`KeyPath`] of a dotted path as the planner's errors write it (`a.b[0].c`); a text that
/// does not parse (a key with a dot in it) is one key.
pub(crate) fn key_path(dotted: &str) -> KeyPath {
    KeyPath::parse(dotted)
        .unwrap_or_else(|| KeyPath(vec![super::config::PathSegment::Key(dotted.into())]))
}

/// A path as the planner's errors write it: dotted, list indices in brackets, the root empty.
pub(crate) fn path_text(path: &KeyPath) -> String {
    if path.is_root() {
        String::new()
    } else {
        path.to_string()
    }
}

fn plan_error(file: &str, e: DeError) -> PlanError {
    let path = e.path.as_ref().map(path_text).unwrap_or_default();
    match e.kind {
        DeErrorKind::UnknownField { valid, suggestion } => PlanError::UnknownField {
            file: file.to_string(),
            path,
            suggestion: suggestion.map(str::to_string),
            valid: valid.iter().map(|s| s.to_string()).collect(),
        },
        DeErrorKind::MissingField { field } => PlanError::MissingField {
            file: file.to_string(),
            path: join(&path, field),
            expected: "required here".into(),
        },
        DeErrorKind::Invalid { expected } => PlanError::InvalidValue {
            file: file.to_string(),
            path,
            value: e.value.unwrap_or_else(|| "?".into()),
            expected,
        },
        DeErrorKind::Custom => PlanError::InvalidValue {
            file: file.to_string(),
            path,
            value: e.value.unwrap_or_else(|| "?".into()),
            expected: e.message,
        },
    }
}

/// An integer of at least `MIN` that fits `u32`; floats like `2.7` and strings are refused
/// ("an integer >= MIN").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AtLeast<const MIN: u32>(pub u32);

impl<'de, const MIN: u32> serde::Deserialize<'de> for AtLeast<MIN> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<const MIN: u32>;
        impl<const MIN: u32> Visitor<'_> for V<MIN> {
            type Value = AtLeast<MIN>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "an integer >= {MIN}")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<AtLeast<MIN>, E> {
                match u32::try_from(n) {
                    Ok(n) if n >= MIN => Ok(AtLeast(n)),
                    _ => Err(E::invalid_value(de::Unexpected::Unsigned(n), &self)),
                }
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<AtLeast<MIN>, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::invalid_value(de::Unexpected::Signed(n), &self)),
                }
            }
        }
        d.deserialize_any(V::<MIN>)
    }
}

fn seq_of_strings<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Vec<String>, A::Error> {
    let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
    while let Some(s) = seq.next_element::<String>()? {
        out.push(s);
    }
    Ok(out)
}

/// A list of strings ("a list of strings").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct StrList(pub Vec<String>);

impl<'de> serde::Deserialize<'de> for StrList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StrList;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of strings")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<StrList, A::Error> {
                seq_of_strings(seq).map(StrList)
            }
        }
        d.deserialize_any(V)
    }
}

/// A command line: a list of arguments, never a shell string.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Argv(pub Vec<String>);

impl<'de> serde::Deserialize<'de> for Argv {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Argv;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a list of arguments (argv), e.g. [python, train.py]; commands never go through a shell",
                )
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Argv, A::Error> {
                seq_of_strings(seq).map(Argv)
            }
        }
        d.deserialize_any(V)
    }
}

/// A mapping read in document order (keys are the user's, e.g. stage ids).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ordered<T>(pub Vec<(String, T)>);

impl<T> Default for Ordered<T> {
    fn default() -> Self {
        Ordered(Vec::new())
    }
}

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Ordered<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Ordered<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered<T>, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some((k, v)) = map.next_entry::<String, T>()? {
                    out.push((k, v));
                }
                Ok(Ordered(out))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// The value under `key` if `v` is a mapping that has it (one key: dots are not split).
pub(crate) fn get<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.as_mapping().and_then(|m| m.get(key))
}

/// The value at a dotted path of mapping keys (`a.b.c`); `None` if a step is missing or not a
/// mapping.
pub(crate) fn get_path<'a>(v: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(v, |v, key| get(v, key))
}

/// A short rendering of a value for error messages (at most ~60 characters): strings quoted,
/// containers by size.
pub(crate) fn describe(v: &Value) -> String {
    let s = match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => format!("{f:?}"),
        Value::String(s) => format!("{s:?}"),
        Value::List(items) => format!("a list of {} item(s)", items.len()),
        Value::Mapping(entries) => format!("a mapping of {} key(s)", entries.len()),
    };
    if s.chars().count() > 60 {
        let cut: String = s.chars().take(57).collect();
        format!("{cut}...")
    } else {
        s
    }
}

/// Writes `v` as canonical JSON (RFC 8785 style: object keys sorted by UTF-16 code units,
/// shortest round-trip numbers, no whitespace) into `out`. Non-finite floats are written as
/// strings `"NaN"`, `"inf"`, `"-inf"` (the hash must be total).
pub(crate) fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) => out.push_str(&i.to_string()),
        Value::Float(f) => {
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
        Value::String(s) => write_json_string(s, out),
        Value::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Mapping(entries) => {
            let mut sorted: Vec<(&String, &Value)> = entries.iter().collect();
            sorted.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (k, v)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json_string(k, out);
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
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

/// The candidate most likely meant by `key` (see [`super::config::did_you_mean`]), owned.
pub(crate) fn did_you_mean<'a, I>(key: &str, candidates: I) -> Option<String>
where
    I: IntoIterator<Item = &'a str>,
{
    did_you_mean_in(key, candidates).map(str::to_string)
}

/// Checks that every key of `map` is in `valid`; the first unknown key becomes
/// [`PlanError::UnknownField`] with its full path and a suggestion.
pub(crate) fn check_keys(
    file: &str,
    path: &str,
    map: &Mapping,
    valid: &[&str],
) -> Result<(), PlanError> {
    for key in map.keys() {
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

/// Requires `v` to be a mapping (or null, read as empty).
pub(crate) fn expect_map<'a>(
    file: &str,
    path: &str,
    v: &'a Value,
) -> Result<&'a Mapping, PlanError> {
    static EMPTY: LazyLock<Mapping> = LazyLock::new(Mapping::new);
    match v {
        Value::Mapping(entries) => Ok(entries),
        Value::Null => Ok(&EMPTY),
        other => Err(invalid(file, path, other, "a mapping")),
    }
}

/// Builds a [`PlanError::InvalidValue`].
pub(crate) fn invalid(file: &str, path: &str, v: &Value, expected: &str) -> PlanError {
    PlanError::InvalidValue {
        file: file.to_string(),
        path: path.to_string(),
        value: describe(v),
        expected: expected.to_string(),
    }
}

/// Reads a positive integer (>= `min`) that fits `u32`; floats like `2.7` and strings are refused.
pub(crate) fn expect_u32(file: &str, path: &str, v: &Value, min: u32) -> Result<u32, PlanError> {
    match v {
        Value::Int(i) if *i >= i64::from(min) && *i <= i64::from(u32::MAX) => Ok(*i as u32),
        other => Err(invalid(file, path, other, &format!("an integer >= {min}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn did_you_mean_finds_typos_suffixes_and_prefixes() {
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
        assert_eq!(
            did_you_mean("instan", ["instances", "strategy"]),
            Some("instances".into())
        );
        assert_eq!(did_you_mean("zzzzzzzz", ["partition", "account"]), None);
    }

    #[test]
    fn canonical_json_sorts_keys_and_normalizes_numbers() {
        let a = Value::from_json(&serde_json::json!({
            "b": 1.0,
            "a": [0.1, "x\"y"],
        }));
        let mut out = String::new();
        write_canonical(&a, &mut out);
        assert_eq!(out, r#"{"a":[0.1,"x\"y"],"b":1}"#);
    }

    #[test]
    fn check_keys_reports_path_and_suggestion() {
        let map: Mapping = [("acount".to_string(), Value::Null)].into_iter().collect();
        let err =
            check_keys("r.yaml", "runner.slurm", &map, &["account", "partition"]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("runner.slurm.acount"), "{msg}");
        assert!(msg.contains("did you mean `account`"), "{msg}");
    }

    #[test]
    fn get_path_reads_mapping_keys_only() {
        let v = Value::from_json(&serde_json::json!({"a": {"b.c": 1, "d": {"e": true}}}));
        assert_eq!(get_path(&v, "a.d.e"), Some(&Value::Bool(true)));
        assert_eq!(get(get(&v, "a").unwrap(), "b.c"), Some(&Value::Int(1)));
        assert_eq!(get_path(&v, "a.x"), None);
        assert_eq!(describe(&Value::from("x".repeat(80))).chars().count(), 60);
    }
}
