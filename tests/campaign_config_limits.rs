//! Hostile input stays bounded: deep nesting and long interpolation chains give errors, not
//! stack overflows (tests run on 2 MiB test threads, which is the point).

use std::path::Path;

use puzzletron::campaign::config::{
    ConfigError, ConfigLoader, Env, Resolvers, Value, load_yaml_str, parse_override, resolve_string,
};

#[test]
fn deeply_nested_yaml_is_refused() {
    let text = format!("a: {}1{}\n", "[".repeat(200), "]".repeat(200));
    let e = load_yaml_str(&text, Path::new("t.yaml")).unwrap_err();
    assert!(
        e.to_string().contains("nesting deeper than 128 levels"),
        "{e}"
    );
    // 100 levels are fine.
    let text = format!("a: {}1{}\n", "[".repeat(100), "]".repeat(100));
    assert!(load_yaml_str(&text, Path::new("t.yaml")).is_ok());
}

#[test]
fn deeply_nested_override_value_is_refused() {
    let text = format!("a={}1{}", "[".repeat(300), "]".repeat(300));
    match parse_override(&text) {
        Err(ConfigError::OverrideSyntax {
            message, position, ..
        }) => {
            assert!(message.contains("nesting deeper"), "{message}");
            assert_eq!(position, 2 + 128);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn deeply_nested_interpolation_is_refused() {
    let text = format!("{}a{}", "${".repeat(100), "}".repeat(100));
    let e = resolve_string(&text, &Value::Null, &Env::new(), &Resolvers::none()).unwrap_err();
    assert!(e.to_string().contains("nested deeper than 64"), "{e}");
}

#[test]
fn long_interpolation_chain_is_refused_not_overflowed() {
    let mut text = String::new();
    for i in 0..1000 {
        text.push_str(&format!("k{i}: ${{k{}}}\n", i + 1));
    }
    text.push_str("k1000: end\n");
    let e = ConfigLoader::new()
        .load_str(&text, "chain.yaml", &[])
        .unwrap_err();
    assert!(e.to_string().contains("more than 200 levels deep"), "{e}");
    // A chain of 100 resolves.
    let mut text = String::new();
    for i in 0..100 {
        text.push_str(&format!("k{i}: ${{k{}}}\n", i + 1));
    }
    text.push_str("k100: end\n");
    let c = ConfigLoader::new()
        .load_str(&text, "chain.yaml", &[])
        .unwrap();
    assert_eq!(c.get("k0"), Some(&Value::from("end")));
}

#[test]
fn doubling_interpolations_are_refused() {
    // Each level doubles: 2^40 nodes if expanded.
    let mut text = String::from("l0: [x, x]\n");
    for i in 1..40 {
        text.push_str(&format!("l{i}: ['${{l{p}}}', '${{l{p}}}']\n", p = i - 1));
    }
    let e = ConfigLoader::new()
        .load_str(&text, "bomb.yaml", &[])
        .unwrap_err();
    assert!(e.to_string().contains("expand the config beyond"), "{e}");
    // The same with string concatenation.
    let mut text = String::from("s0: xxxxxxxx\n");
    for i in 1..40 {
        text.push_str(&format!("s{i}: ${{s{p}}}${{s{p}}}\n", p = i - 1));
    }
    let e = ConfigLoader::new()
        .load_str(&text, "bomb.yaml", &[])
        .unwrap_err();
    assert!(e.to_string().contains("expand the config beyond"), "{e}");
}
