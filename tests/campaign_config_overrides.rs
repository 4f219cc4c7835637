//! Hydra override grammar: parsing, typing, caret errors, and applying to a config.

use std::path::Path;

use puzzletron::campaign::config::{
    ConfigError, KeyPath, Mapping, Origin, Override, OverrideKind, Value, apply_overrides,
    load_yaml_str, parse_override,
};

fn value_of(text: &str) -> Value {
    parse_override(text)
        .unwrap_or_else(|e| panic!("{e}"))
        .value
        .expect("has a value")
}

fn syntax(text: &str) -> (usize, String, String) {
    match parse_override(text) {
        Err(e @ ConfigError::OverrideSyntax { .. }) => {
            let display = e.to_string();
            let ConfigError::OverrideSyntax {
                position, message, ..
            } = e
            else {
                unreachable!()
            };
            (position, message, display)
        }
        other => panic!("{text}: expected a syntax error, got {other:?}"),
    }
}

fn cfg(text: &str) -> Value {
    load_yaml_str(text, Path::new("t.yaml")).unwrap().value
}

fn apply(text: &str, overrides: &[&str]) -> Result<Value, ConfigError> {
    let mut v = cfg(text);
    let o: Vec<Override> = overrides
        .iter()
        .map(|t| parse_override(t).unwrap())
        .collect();
    apply_overrides(&mut v, &o)?;
    Ok(v)
}

#[test]
fn kinds_and_keys() {
    let o = parse_override("a.b-c.d_e=1").unwrap();
    assert_eq!(o.kind, OverrideKind::Set);
    assert_eq!(o.key, KeyPath::parse("a.b-c.d_e").unwrap());
    assert_eq!(parse_override("+a=1").unwrap().kind, OverrideKind::Add);
    assert_eq!(parse_override("++a=1").unwrap().kind, OverrideKind::Upsert);
    let d = parse_override("~a.b").unwrap();
    assert_eq!((d.kind, d.value), (OverrideKind::Delete, None));
    let d = parse_override("~a.b=3").unwrap();
    assert_eq!(
        (d.kind, d.value),
        (OverrideKind::Delete, Some(Value::Int(3)))
    );
    assert_eq!(parse_override("a.0=1").unwrap().key.to_string(), "a.0");
    assert_eq!("x=1".parse::<Override>().unwrap().text, "x=1");
}

#[test]
fn scalar_values_are_typed_as_hydra_does() {
    assert_eq!(value_of("a=1"), Value::Int(1));
    assert_eq!(value_of("a=-12"), Value::Int(-12));
    assert_eq!(value_of("a=1_000"), Value::Int(1000));
    assert_eq!(value_of("a=1.5"), Value::Float(1.5));
    assert_eq!(value_of("a=1e-4"), Value::Float(1e-4));
    assert_eq!(value_of("a=.5"), Value::Float(0.5));
    assert_eq!(value_of("a=inf"), Value::Float(f64::INFINITY));
    assert!(value_of("a=nan").as_f64().unwrap().is_nan());
    assert_eq!(value_of("a=true"), Value::Bool(true));
    assert_eq!(value_of("a=False"), Value::Bool(false));
    assert_eq!(value_of("a=null"), Value::Null);
    assert_eq!(value_of("a=NULL"), Value::Null);
    assert_eq!(value_of("a=abc"), Value::from("abc"));
    // Hydra: a leading-zero number is not an INT token, so it is a string; `yes` is a string.
    assert_eq!(value_of("a=010"), Value::from("010"));
    assert_eq!(value_of("a=yes"), Value::from("yes"));
    assert_eq!(value_of("a=hello world"), Value::from("hello world"));
    assert_eq!(value_of("a=  padded  "), Value::from("padded"));
    assert_eq!(value_of("a=/data/x:y@z"), Value::from("/data/x:y@z"));
    assert_eq!(
        value_of("a=runs/${puzzle_dir}/x"),
        Value::from("runs/${puzzle_dir}/x")
    );
    assert_eq!(value_of("a="), Value::from(""));
    assert_eq!(value_of(r"a=x\,y"), Value::from("x,y"));
}

#[test]
fn quoted_strings_stay_strings() {
    assert_eq!(value_of("a='010'"), Value::from("010"));
    assert_eq!(value_of("a=\"1,2\""), Value::from("1,2"));
    assert_eq!(value_of("a='null'"), Value::from("null"));
    assert_eq!(value_of(r"a='it\'s'"), Value::from("it's"));
    assert_eq!(value_of("a=\"[x]\""), Value::from("[x]"));
}

#[test]
fn lists_and_mappings() {
    assert_eq!(
        value_of("a=[1,2]"),
        Value::List(vec![Value::Int(1), Value::Int(2)])
    );
    assert_eq!(value_of("a=[]"), Value::List(vec![]));
    assert_eq!(
        value_of("a=[ a , 'b,c', [1], {x: 1} ]"),
        Value::List(vec![
            Value::from("a"),
            Value::from("b,c"),
            Value::List(vec![Value::Int(1)]),
            Value::Mapping(Mapping::from_iter([("x".to_string(), Value::Int(1))])),
        ])
    );
    let m = value_of("a={x: 1, y: [a, b], z: null, 'q k': 'v'}");
    assert_eq!(m.get("x"), Some(&Value::Int(1)));
    assert_eq!(m.get("y.1"), Some(&Value::from("b")));
    assert_eq!(m.get("z"), Some(&Value::Null));
    assert_eq!(m.as_mapping().unwrap().get("q k"), Some(&Value::from("v")));
    assert_eq!(value_of("a={}"), Value::Mapping(Mapping::new()));
}

#[test]
fn sweep_is_refused_with_a_caret_at_the_comma() {
    let (pos, msg, display) = syntax("a.b=1,2");
    assert_eq!(pos, 5);
    assert!(msg.contains("multirun sweep"), "{msg}");
    assert!(display.ends_with("\n  a.b=1,2\n       ^"), "{display}");
}

#[test]
fn syntax_errors_point_at_the_bad_character() {
    let cases: &[(&str, usize, &str)] = &[
        ("a.b=[1,2", 4, "unclosed `[`"),
        ("a.b={x 1}", 8, "expected `:`"),
        ("a..b=1", 2, "empty segment"),
        ("=1", 0, "unexpected character `=`"),
        ("a.b", 3, "expected `=`"),
        ("a b=1", 1, "whitespace"),
        ("a=choice(1,2)", 8, "functions"),
        ("a='x", 2, "unterminated"),
        ("db@pkg=x", 2, "config group"),
        ("group/opt=x", 5, "config groups"),
        ("a=x]", 3, "unmatched"),
        ("a=x=y", 3, "`=` is not allowed"),
        ("a='x' y", 6, "after a quoted string"),
        ("a=${b", 2, "unclosed interpolation"),
        ("a[0]=1", 1, "key.0"),
        ("a={x: 1, x: 2}", 9, "duplicate key"),
        ("", 0, "expected a key"),
        ("+", 1, "expected a key"),
    ];
    for (text, pos, needle) in cases {
        let (p, msg, display) = syntax(text);
        assert_eq!(p, *pos, "{text}: {msg}");
        assert!(msg.contains(needle), "{text}: {msg}");
        let caret_line = display.lines().last().unwrap();
        assert_eq!(caret_line.len(), 2 + pos + 1, "{text}: {display}");
        assert!(caret_line.ends_with('^'));
    }
}

#[test]
fn set_changes_an_existing_key_only() {
    let v = apply("a: {b: 1}\n", &["a.b=2"]).unwrap();
    assert_eq!(v.get("a.b"), Some(&Value::Int(2)));
    let e = apply("a: {b: 1}\n", &["a.c=2"]).unwrap_err();
    assert!(matches!(&e, ConfigError::OverrideApply { key, .. } if key.to_string() == "a.c"));
    assert!(e.to_string().contains("write `+a.c=2`"), "{e}");
    let e = apply("a: {b: 1}\n", &["x.y=2"]).unwrap_err();
    assert!(e.to_string().contains("`x` is not in the config"), "{e}");
}

#[test]
fn set_of_a_mapping_merges_like_hydra() {
    let v = apply("a: {b: 1, c: 2}\n", &["a={c: 20, d: 30}"]).unwrap();
    assert_eq!(v.get("a.b"), Some(&Value::Int(1)));
    assert_eq!(v.get("a.c"), Some(&Value::Int(20)));
    assert_eq!(v.get("a.d"), Some(&Value::Int(30)));
    // Lists replace.
    let v = apply("a: [1, 2, 3]\n", &["a=[9]"]).unwrap();
    assert_eq!(v.get("a"), Some(&Value::List(vec![Value::Int(9)])));
}

#[test]
fn add_creates_a_new_key_and_refuses_an_existing_one() {
    let v = apply("a: {b: 1}\n", &["+a.c=2", "+x.y.z=[1]"]).unwrap();
    assert_eq!(v.get("a.c"), Some(&Value::Int(2)));
    assert_eq!(v.get("x.y.z.0"), Some(&Value::Int(1)));
    let e = apply("a: {b: 1}\n", &["+a.b=2"]).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("`a.b` already exists (value: 1)"), "{msg}");
    assert!(msg.contains("`++a.b=2`"), "{msg}");
}

#[test]
fn upsert_sets_either_way() {
    let v = apply("a: {b: 1}\n", &["++a.b=2", "++a.c=3", "++n.m=4"]).unwrap();
    assert_eq!(v.get("a.b"), Some(&Value::Int(2)));
    assert_eq!(v.get("a.c"), Some(&Value::Int(3)));
    assert_eq!(v.get("n.m"), Some(&Value::Int(4)));
}

#[test]
fn delete_removes_and_checks_the_value_when_given() {
    let v = apply("a: {b: 1, c: 2}\nl: [x, y, z]\n", &["~a.b", "~l.1"]).unwrap();
    assert_eq!(v.get("a.b"), None);
    assert_eq!(v.get("a.c"), Some(&Value::Int(2)));
    assert_eq!(
        v.get("l"),
        Some(&Value::List(vec![Value::from("x"), Value::from("z")]))
    );
    assert!(
        apply("a: {b: 1}\n", &["~a.b=1"])
            .unwrap()
            .get("a.b")
            .is_none()
    );
    let e = apply("a: {b: 1}\n", &["~a.b=2"]).unwrap_err();
    assert!(e.to_string().contains("the value is `1`, not `2`"), "{e}");
    let e = apply("a: {b: 1}\n", &["~a.zz"]).unwrap_err();
    assert!(e.to_string().contains("`a.zz` is not in the config"), "{e}");
}

#[test]
fn list_items_by_index() {
    let v = apply("l: [1, 2]\n", &["l.1=5"]).unwrap();
    assert_eq!(v.get("l.1"), Some(&Value::Int(5)));
    let e = apply("l: [1, 2]\n", &["l.2=5"]).unwrap_err();
    assert!(e.to_string().contains("list of 2 items"), "{e}");
}

#[test]
fn a_scalar_parent_is_refused() {
    let e = apply("a: 5\n", &["++a.b=1"]).unwrap_err();
    assert!(e.to_string().contains("`a` is a int, not a mapping"), "{e}");
}

#[test]
fn overrides_apply_in_order() {
    let v = apply("a: 1\n", &["a=2", "a=3"]).unwrap();
    assert_eq!(v.get("a"), Some(&Value::Int(3)));
}

#[test]
fn origin_of_an_overridden_value_is_the_override() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("base.yaml"), "a: {b: 1}\n").unwrap();
    let o = vec![
        parse_override("a.b=2").unwrap(),
        parse_override("+a.c={d: 1}").unwrap(),
    ];
    let c = puzzletron::campaign::config::load_experiment(
        dir.path().join("base.yaml"),
        &o,
        &Default::default(),
    )
    .unwrap();
    assert_eq!(
        c.origin("a.b"),
        Some(&Origin::Override {
            index: 0,
            text: "a.b=2".into()
        })
    );
    assert!(matches!(
        c.origin("a.c.d"),
        Some(Origin::Override { index: 1, .. })
    ));
}

#[test]
fn delete_under_a_missing_parent_does_not_suggest_adding() {
    let e = apply("a: {b: 1}\n", &["~x.y"]).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("`x` is not in the config"), "{msg}");
    assert!(!msg.contains("to add it"), "{msg}");
}
