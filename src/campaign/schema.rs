//! Reading the planner's schemas (runner, execution, user stages, meshes, the catalog's keys)
//! straight from the loaded [`Value`] tree: key checks with "did you mean", typed reads, and the
//! canonical JSON the contract hash covers.
//!
//! Errors name the file label and the dotted key path; [`PlanError::locate`] then replaces the
//! label by the `file:line:column` (or override) that wrote the value, from the config's
//! [`Origins`](super::config::Origins). Mapping order is the document's (it decides the order
//! of `post_mip` nodes).

use std::sync::LazyLock;

use super::config::{Mapping, Value, did_you_mean_in};
use super::plan_error::PlanError;

/// The value under `key` if `v` is a mapping that has it (one key: dots are not split).
pub(crate) fn get<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.as_mapping().and_then(|m| m.get(key))
}

/// The value at a dotted path of mapping keys (`a.b.c`); `None` if a step is missing or not a
/// mapping.
pub(crate) fn get_path<'a>(v: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(v, |v, key| get(v, key))
}

/// The value under `key` in `map`, `Null` when absent.
pub(crate) fn field<'a>(map: &'a Mapping, key: &str) -> &'a Value {
    static NULL: Value = Value::Null;
    map.get(key).unwrap_or(&NULL)
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

/// Reads an optional string: `Null` is `None`.
pub(crate) fn expect_opt_str(
    file: &str,
    path: &str,
    v: &Value,
) -> Result<Option<String>, PlanError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        other => Err(invalid(file, path, other, "a string or null")),
    }
}

/// Reads a list of strings (`Null` is empty).
pub(crate) fn expect_str_list(file: &str, path: &str, v: &Value) -> Result<Vec<String>, PlanError> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::List(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => Ok(s.clone()),
                other => Err(invalid(file, &format!("{path}[{i}]"), other, "a string")),
            })
            .collect(),
        other => Err(invalid(file, path, other, "a list of strings")),
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
