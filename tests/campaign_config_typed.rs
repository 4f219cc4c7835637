//! Typed conversion of config values to serde structs: errors name the key path, the file
//! position, and suggest the closest field.

use std::collections::BTreeMap;

use puzzletron::campaign::config::{Config, ConfigError, Value, from_value, load_yaml_file};
use serde::Deserialize;

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Stage {
    strategy: Strategy,
    instances: u32,
    #[serde(default)]
    partition: Option<String>,
    #[serde(default)]
    mesh: Option<BTreeMap<String, u32>>,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
enum Strategy {
    Single,
    Sharded,
    PersistentPool,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Execution {
    stages: BTreeMap<String, Stage>,
}

fn file(text: &str) -> (tempfile::TempDir, Config) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("execution.yaml");
    std::fs::write(&p, text).unwrap();
    let c = load_yaml_file(&p).unwrap();
    (dir, c)
}

#[test]
fn converts_a_valid_tree() {
    let (_d, c) = file(
        "execution:\n  stages:\n    convert: {strategy: single, instances: 1}\n    vllm_stats: {strategy: persistent_pool, instances: 8, partition: batch, mesh: {tp: 2}}\n",
    );
    let e: Execution = c.get_as("execution").unwrap();
    assert_eq!(e.stages["convert"].strategy, Strategy::Single);
    assert_eq!(e.stages["vllm_stats"].instances, 8);
    assert_eq!(e.stages["vllm_stats"].partition.as_deref(), Some("batch"));
    assert_eq!(e.stages["vllm_stats"].mesh.as_ref().unwrap()["tp"], 2);
}

#[test]
fn unknown_field_names_key_path_file_line_and_suggests() {
    let (_d, c) =
        file("execution:\n  stages:\n    convert:\n      strategy: single\n      instanses: 1\n");
    let e = c.get_as::<Execution>("execution").unwrap_err();
    match &e {
        ConfigError::Type {
            key,
            origin,
            message,
        } => {
            assert_eq!(key.to_string(), "execution.stages.convert.instanses");
            assert_eq!(origin.as_ref().unwrap().line_column(), Some((5, 18)));
            assert!(message.contains("unknown field `instanses`"), "{message}");
            assert!(message.contains("(did you mean `instances`?)"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("execution.yaml:5:18"), "{e}");
}

#[test]
fn wrong_type_names_the_key_and_what_was_expected() {
    let (_d, c) = file("execution:\n  stages:\n    convert: {strategy: single, instances: many}\n");
    let e = c.get_as::<Execution>("execution").unwrap_err();
    match &e {
        ConfigError::Type { key, message, .. } => {
            assert_eq!(key.to_string(), "execution.stages.convert.instances");
            assert!(
                message.contains("invalid type: string \"many\""),
                "{message}"
            );
            assert!(message.contains("u32"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn negative_and_fractional_numbers_are_refused_for_unsigned_fields() {
    let (_d, c) = file("execution:\n  stages:\n    s: {strategy: single, instances: 2.7}\n");
    let e = c.get_as::<Execution>("execution").unwrap_err();
    assert!(
        e.to_string().contains("invalid type: floating point `2.7`"),
        "{e}"
    );
    let (_d, c) = file("execution:\n  stages:\n    s: {strategy: single, instances: -1}\n");
    let e = c.get_as::<Execution>("execution").unwrap_err();
    assert!(e.to_string().contains("invalid value: integer `-1`"), "{e}");
}

#[test]
fn missing_field_names_the_mapping() {
    let (_d, c) = file("execution:\n  stages:\n    convert: {strategy: single}\n");
    let e = c.get_as::<Execution>("execution").unwrap_err();
    match &e {
        ConfigError::Type { key, message, .. } => {
            assert_eq!(key.to_string(), "execution.stages.convert");
            assert!(message.contains("missing field `instances`"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_enum_variant_suggests_the_closest() {
    let (_d, c) =
        file("execution:\n  stages:\n    convert: {strategy: persistent-pool, instances: 1}\n");
    let e = c.get_as::<Execution>("execution").unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("execution.stages.convert.strategy"), "{msg}");
    assert!(msg.contains("did you mean `persistent_pool`"), "{msg}");
}

#[test]
fn list_index_appears_in_the_path() {
    let (_d, c) = file("xs: [1, 2, three]\n");
    let e = c.get_as::<Vec<u8>>("xs").unwrap_err();
    assert!(
        matches!(&e, ConfigError::Type { key, .. } if key.to_string() == "xs[2]"),
        "{e:?}"
    );
}

#[test]
fn missing_key_and_optional_lookups() {
    let (_d, c) = file("a: 1\n");
    assert!(matches!(
        c.get_as::<u32>("b"),
        Err(ConfigError::MissingKey { .. })
    ));
    assert_eq!(c.get_opt_as::<u32>("b").unwrap(), None);
    assert_eq!(c.get_opt_as::<u32>("a").unwrap(), Some(1));
    assert!(c.require("a.b").is_err());
}

#[test]
fn values_round_trip_through_serde() {
    let v: Value = from_value(&Value::from("x")).unwrap();
    assert_eq!(v, Value::from("x"));
    let (_d, c) = file("a: {b: [1, 2.5, null, true, s]}\n");
    let json = serde_json::to_string(c.value()).unwrap();
    assert_eq!(json, r#"{"a":{"b":[1,2.5,null,true,"s"]}}"#);
    let back: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(&back, c.value());
    // A Value field inside a typed struct keeps the subtree as data.
    #[derive(Deserialize)]
    struct Holder {
        a: Value,
    }
    let h: Holder = c.deserialize().unwrap();
    assert_eq!(h.a.get("b.4"), Some(&Value::from("s")));
}

#[test]
fn key_paths_parse_and_display() {
    use puzzletron::campaign::config::{KeyPath, PathSegment};
    let p = KeyPath::parse("a.b[0].c").unwrap();
    assert_eq!(
        p.segments(),
        &[
            PathSegment::Key("a".into()),
            PathSegment::Key("b".into()),
            PathSegment::Index(0),
            PathSegment::Key("c".into())
        ]
    );
    assert_eq!(p.to_string(), "a.b[0].c");
    assert_eq!(KeyPath::parse("m[1][2]").unwrap().to_string(), "m[1][2]");
    assert_eq!(KeyPath::parse("").unwrap().to_string(), "<root>");
    for bad in ["a..b", ".a", "a.", "a[x]", "a[1", "a[1]b"] {
        assert_eq!(KeyPath::parse(bad), None, "{bad}");
    }
    // `a.0` on a list and `a[0]` address the same item.
    let v: Value = from_value(&Value::List(vec![Value::from("x")])).unwrap();
    let root = Value::Mapping([("a".to_string(), v)].into_iter().collect());
    assert_eq!(root.get("a.0"), root.get("a[0]"));
    assert_eq!(root.get("a.0"), Some(&Value::from("x")));
}

#[test]
fn floats_render_like_python_repr() {
    for (x, s) in [
        (1.0, "1.0"),
        (0.0003, "0.0003"),
        (1e-5, "1e-05"),
        (1.5e-7, "1.5e-07"),
        (1e16, "1e+16"),
        (123456.5, "123456.5"),
        (-2.0, "-2.0"),
        (f64::INFINITY, ".inf"),
    ] {
        assert_eq!(Value::Float(x).to_string(), s);
    }
}
