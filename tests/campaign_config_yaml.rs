//! YAML layer: anchors, aliases, `<<` merge keys, duplicate keys, scalar typing, errors with
//! file:line:column.

use std::path::Path;

use puzzletron::campaign::config::{ConfigError, Origin, Value, load_yaml_str};

fn load(text: &str) -> Value {
    load_yaml_str(text, Path::new("t.yaml"))
        .unwrap_or_else(|e| panic!("{e}"))
        .value
}

fn err(text: &str) -> ConfigError {
    match load_yaml_str(text, Path::new("t.yaml")) {
        Ok(d) => panic!("expected an error, got {:?}", d.value),
        Err(e) => e,
    }
}

#[test]
fn anchors_and_aliases_copy_the_anchored_node() {
    let v = load("a: &x {p: 1, q: [1, 2]}\nb: *x\nc: &s hello\nd: *s\n");
    assert_eq!(v.get("b.p"), Some(&Value::Int(1)));
    assert_eq!(v.get("b.q.1"), Some(&Value::Int(2)));
    assert_eq!(v.get("d"), Some(&Value::from("hello")));
}

#[test]
fn merge_key_pulls_entries_and_explicit_keys_win() {
    let v = load("base: &b\n  x: 1\n  y: 2\nderived:\n  <<: *b\n  y: 20\n  z: 30\n");
    assert_eq!(v.get("derived.x"), Some(&Value::Int(1)));
    assert_eq!(v.get("derived.y"), Some(&Value::Int(20)));
    assert_eq!(v.get("derived.z"), Some(&Value::Int(30)));
    // Merged keys first, in source order; explicit override stays in place.
    let keys: Vec<&str> = v
        .get("derived")
        .unwrap()
        .as_mapping()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["x", "y", "z"]);
}

#[test]
fn merge_key_list_earlier_mapping_wins() {
    let v =
        load("a: &a {k: from_a, only_a: 1}\nb: &b {k: from_b, only_b: 2}\nc:\n  <<: [*a, *b]\n");
    assert_eq!(v.get("c.k"), Some(&Value::from("from_a")));
    assert_eq!(v.get("c.only_a"), Some(&Value::Int(1)));
    assert_eq!(v.get("c.only_b"), Some(&Value::Int(2)));
}

#[test]
fn merge_key_of_a_scalar_is_refused_with_position() {
    let e = err("a: &s 5\nb:\n  <<: *s\n");
    match &e {
        ConfigError::Yaml { line, message, .. } => {
            assert_eq!(*line, 3);
            assert!(
                message.contains("`<<` merge value must be a mapping"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn quoted_merge_key_is_an_ordinary_key() {
    let v = load("a:\n  '<<': 1\n");
    assert_eq!(
        v.get("a").unwrap().as_mapping().unwrap().get("<<"),
        Some(&Value::Int(1))
    );
}

#[test]
fn duplicate_keys_are_refused_with_file_and_both_lines() {
    let e = err("a: 1\nb:\n  c: 1\n  c: 2\n");
    match &e {
        ConfigError::DuplicateKey {
            file,
            key,
            line,
            column,
            first_line,
        } => {
            assert_eq!(file, Path::new("t.yaml"));
            assert_eq!(key, "c");
            assert_eq!((*line, *column, *first_line), (4, 3, 3));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        e.to_string(),
        "t.yaml:4:3: duplicate key `c` (first defined at line 3)"
    );
}

#[test]
fn one_e_minus_four_is_a_float() {
    let v = load("a: 1e-4\nb: 1.0e-06\nc: 1e+9\nd: 3E2\ne: .5\nf: 1.\n");
    assert_eq!(v.get("a"), Some(&Value::Float(1e-4)));
    assert_eq!(v.get("b"), Some(&Value::Float(1e-6)));
    assert_eq!(v.get("c"), Some(&Value::Float(1e9)));
    assert_eq!(v.get("d"), Some(&Value::Float(300.0)));
    assert_eq!(v.get("e"), Some(&Value::Float(0.5)));
    assert_eq!(v.get("f"), Some(&Value::Float(1.0)));
}

#[test]
fn yes_is_refused_as_ambiguous_and_quoted_yes_is_a_string() {
    for word in ["yes", "No", "ON", "off"] {
        let e = err(&format!("flag: {word}\n"));
        match &e {
            ConfigError::AmbiguousScalar {
                text,
                line,
                column,
                yaml11,
                yaml12,
                ..
            } => {
                assert_eq!(text, word);
                assert_eq!((*line, *column), (1, 7));
                assert!(yaml11.starts_with("bool"), "{yaml11}");
                assert_eq!(yaml12, "a string");
            }
            other => panic!("{word}: {other:?}"),
        }
        assert!(e.to_string().contains("write true/false"), "{e}");
    }
    let v = load("a: 'yes'\nb: \"on\"\nc: y\nd: n\n");
    assert_eq!(v.get("a"), Some(&Value::from("yes")));
    assert_eq!(v.get("b"), Some(&Value::from("on")));
    // PyYAML does not treat y/n as booleans, so both readings agree: strings.
    assert_eq!(v.get("c"), Some(&Value::from("y")));
    assert_eq!(v.get("d"), Some(&Value::from("n")));
}

#[test]
fn leading_zero_integer_is_refused_as_ambiguous() {
    let e = err("mode: 010\n");
    match &e {
        ConfigError::AmbiguousScalar { yaml11, yaml12, .. } => {
            assert_eq!(yaml11, "int 8");
            assert_eq!(yaml12, "int 10");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        e.to_string()
            .starts_with("t.yaml:1:7: ambiguous plain scalar `010`"),
        "{e}"
    );
    assert_eq!(load("mode: '010'\n").get("mode"), Some(&Value::from("010")));
    assert_eq!(
        load("mode: !!str 010\n").get("mode"),
        Some(&Value::from("010"))
    );
}

#[test]
fn other_yaml11_only_forms_are_refused() {
    for text in [
        "1_000", "09", "0b101", "0o17", "1:30", "-.5", "-0x1F", "1_000.5",
    ] {
        let e = err(&format!("v: {text}\n"));
        assert!(
            matches!(e, ConfigError::AmbiguousScalar { .. }),
            "{text}: {e:?}"
        );
    }
}

#[test]
fn core_schema_scalars() {
    let v = load(
        "i: 42\nneg: -7\nplus: +12\nhex: 0x1F\nzero: 0\nt: true\nT: True\nf: FALSE\nn1: null\nn2: ~\nn3:\ninf: .inf\nninf: -.inf\nnan: .nan\ns: hello world\ndate: 2024-01-01\nbig: 123456789012345678901234567890\n",
    );
    assert_eq!(v.get("i"), Some(&Value::Int(42)));
    assert_eq!(v.get("neg"), Some(&Value::Int(-7)));
    assert_eq!(v.get("plus"), Some(&Value::Int(12)));
    assert_eq!(v.get("hex"), Some(&Value::Int(31)));
    assert_eq!(v.get("zero"), Some(&Value::Int(0)));
    assert_eq!(v.get("t"), Some(&Value::Bool(true)));
    assert_eq!(v.get("T"), Some(&Value::Bool(true)));
    assert_eq!(v.get("f"), Some(&Value::Bool(false)));
    assert_eq!(v.get("n1"), Some(&Value::Null));
    assert_eq!(v.get("n2"), Some(&Value::Null));
    assert_eq!(v.get("n3"), Some(&Value::Null));
    assert_eq!(v.get("inf"), Some(&Value::Float(f64::INFINITY)));
    assert_eq!(v.get("ninf"), Some(&Value::Float(f64::NEG_INFINITY)));
    assert!(v.get("nan").and_then(Value::as_f64).unwrap().is_nan());
    assert_eq!(v.get("s"), Some(&Value::from("hello world")));
    // OmegaConf drops the timestamp resolver; both readings give a string.
    assert_eq!(v.get("date"), Some(&Value::from("2024-01-01")));
    // Too large for i64: kept as the string written rather than rounded.
    assert_eq!(
        v.get("big"),
        Some(&Value::from("123456789012345678901234567890"))
    );
}

#[test]
fn core_tags_are_applied_and_unknown_tags_refused() {
    let v = load("a: !!int \"5\"\nb: !!float 1\nc: !!str true\nd: !!null ''\n");
    assert_eq!(v.get("a"), Some(&Value::Int(5)));
    assert_eq!(v.get("b"), Some(&Value::Float(1.0)));
    assert_eq!(v.get("c"), Some(&Value::from("true")));
    assert_eq!(v.get("d"), Some(&Value::Null));
    let e = err("a: !python/object foo\n");
    assert!(e.to_string().contains("unsupported tag"), "{e}");
    let e = err("a: !!int abc\n");
    assert!(e.to_string().contains("`abc` is not a valid int"), "{e}");
}

#[test]
fn syntax_errors_name_file_line_and_column() {
    let e = err("a: 1\nb: [1, 2\nc: 3\n");
    match &e {
        ConfigError::Yaml { file, line, .. } => {
            assert_eq!(file, Path::new("t.yaml"));
            assert!(*line >= 2, "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().starts_with("t.yaml:"), "{e}");
}

#[test]
fn several_documents_are_refused() {
    let e = err("a: 1\n---\nb: 2\n");
    assert!(e.to_string().contains("exactly one YAML document"), "{e}");
}

#[test]
fn non_scalar_keys_are_refused() {
    let e = err("? [1, 2]\n: x\n");
    assert!(
        e.to_string().contains("mapping keys must be scalars"),
        "{e}"
    );
}

#[test]
fn alias_bombs_are_refused() {
    let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        let prev = format!("*a{}", i - 1);
        let items = [prev.as_str(); 10].join(", ");
        text.push_str(&format!("a{i}: &a{i} [{items}]\n"));
    }
    let e = err(&text);
    assert!(e.to_string().contains("through aliases"), "{e}");
}

#[test]
fn empty_file_is_an_empty_mapping() {
    assert_eq!(load(""), Value::Mapping(Default::default()));
    assert_eq!(
        load("# only a comment\n"),
        Value::Mapping(Default::default())
    );
}

#[test]
fn key_order_is_preserved() {
    let v = load("z: 1\na: 2\nm: 3\n");
    let keys: Vec<&str> = v.as_mapping().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["z", "a", "m"]);
}

#[test]
fn package_header_is_read_from_leading_comments() {
    let d = load_yaml_str(
        "# SPDX: x\n# @package _global_\n\na: 1\n",
        Path::new("t.yaml"),
    )
    .unwrap();
    assert_eq!(d.package.as_deref(), Some("_global_"));
    let d = load_yaml_str("a: 1\n# @package foo\n", Path::new("t.yaml")).unwrap();
    assert_eq!(d.package, None);
}

#[test]
fn origins_give_line_and_column_of_each_node_and_of_aliased_copies() {
    let d = load_yaml_str("a:\n  b: &x\n    c: 1\nd: *x\n", Path::new("t.yaml")).unwrap();
    let at = |p: &str| {
        d.origins
            .get(&puzzletron::campaign::config::KeyPath::parse(p).unwrap())
            .and_then(Origin::line_column)
    };
    assert_eq!(at("a.b.c"), Some((3, 8)));
    // The alias copy points at where the values were written.
    assert_eq!(at("d.c"), Some((3, 8)));
}
