//! Entry points of the cargo-fuzz targets in `fuzz/`, kept in the library so the corpus replay
//! test (`tests/fuzz_corpus_replay.rs`) runs exactly the same checks without cargo-fuzz.
//!
//! Each function takes arbitrary bytes, never returns an error, and panics only when an
//! invariant is broken (a crash for the fuzzer): a parser panicking, a caret position outside
//! the text, an override that reports success but did not take effect, a non-deterministic
//! result.

use super::{
    ConfigError, ConfigLoader, Env, Mapping, Override, OverrideKind, Resolvers, Value,
    parse_override, resolve_string,
};

fn sample_config() -> Value {
    let mut b = Mapping::new();
    b.insert("c".into(), Value::from("x"));
    b.insert("d".into(), Value::List(vec![Value::Int(1), Value::Int(2)]));
    b.insert("e".into(), Value::Mapping(Mapping::new()));
    let mut m = Mapping::new();
    m.insert("a".into(), Value::Int(1));
    m.insert("b".into(), Value::Mapping(b));
    m.insert("s".into(), Value::from("${a}"));
    m.insert("n".into(), Value::Null);
    Value::Mapping(m)
}

fn env() -> Env {
    Env::new()
        .with("HOME", "/h")
        .with("N", "8")
        .with("L", "[1, 2]")
}

fn check_error_display(e: &ConfigError) {
    let shown = e.to_string();
    assert!(!shown.is_empty());
    let _ = e.is_retryable();
    if let ConfigError::OverrideSyntax { text, position, .. }
    | ConfigError::InterpolationSyntax { text, position, .. } = e
    {
        assert!(
            *position <= text.chars().count(),
            "caret {position} outside {text:?}"
        );
        assert!(shown.ends_with('^'), "caret line missing: {shown}");
    }
}

/// Renders for comparison (NaN-safe, unlike `==`).
fn render(v: &Value) -> String {
    format!("{v}")
}

/// Target `override_parser`: parse, check the result, apply it to a sample config.
pub fn override_parser(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let o = match parse_override(text) {
        Ok(o) => o,
        Err(e) => {
            assert!(
                matches!(e, ConfigError::OverrideSyntax { .. }),
                "parse_override returned {e:?}"
            );
            check_error_display(&e);
            return;
        }
    };
    assert_eq!(o.text, text);
    assert!(!o.key.is_root());
    assert_eq!(
        o.value.is_none(),
        o.kind == OverrideKind::Delete && !text.contains('=')
    );
    if let Some(v) = &o.value {
        let _ = render(v);
    }
    // Parsing is deterministic.
    let again = parse_override(text).expect("parsed once, parses again");
    assert_eq!(format!("{again:?}"), format!("{o:?}"));
    apply_and_check(&o);
}

fn apply_and_check(o: &Override) {
    let mut cfg = sample_config();
    match o.apply(&mut cfg) {
        Ok(()) => match (o.kind, &o.value) {
            (OverrideKind::Delete, _) => {}
            (_, Some(v)) => {
                let now = cfg
                    .get_path(&o.key)
                    .unwrap_or_else(|| panic!("`{}` applied but `{}` is absent", o.text, o.key));
                if !matches!(v, Value::Mapping(_)) {
                    assert_eq!(render(now), render(v), "`{}` did not take effect", o.text);
                }
            }
            (_, None) => panic!("a non-delete override without a value: {o:?}"),
        },
        Err(e) => {
            assert!(
                matches!(e, ConfigError::OverrideApply { .. }),
                "apply returned {e:?}"
            );
            check_error_display(&e);
        }
    }
}

/// Target `interpolation`: resolve the input as a string value, alone and as a node that
/// others refer to (so cycles through it are exercised).
pub fn interpolation(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut root = sample_config();
    if let Value::Mapping(m) = &mut root {
        m.insert("fz".into(), Value::from(text));
        m.insert("t".into(), Value::from("${fz}"));
        m.insert("u".into(), Value::from("pre-${fz}-post"));
    }
    let env = env();
    let resolvers = Resolvers::puzzletron();
    for expr in [text, "${t}", "${u}"] {
        let first = resolve_string(expr, &root, &env, &resolvers);
        let second = resolve_string(expr, &root, &env, &resolvers);
        match (&first, &second) {
            (Ok(a), Ok(b)) => assert_eq!(render(a), render(b)),
            (Err(a), Err(b)) => {
                assert_eq!(a.to_string(), b.to_string());
                check_error_display(a);
            }
            _ => panic!("non-deterministic: {first:?} vs {second:?}"),
        }
    }
}

/// Target `yaml_overrides`: bytes up to the first NUL are a YAML document, the rest are
/// overrides one per line; load with overrides and interpolation.
pub fn yaml_overrides(data: &[u8]) {
    let (yaml, rest) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(yaml) = std::str::from_utf8(yaml) else {
        return;
    };
    let overrides: Vec<Override> = std::str::from_utf8(rest)
        .unwrap_or("")
        .lines()
        .filter_map(|l| parse_override(l).ok())
        .collect();
    let loader = ConfigLoader::new().env(env());
    match loader.load_str(yaml, "fuzz.yaml", &overrides) {
        Ok(cfg) => {
            let _ = render(cfg.value());
            // Every recorded origin points inside the text (1-based line) or at an override.
            let lines = yaml.matches(['\n', '\r']).count() + 2;
            cfg.value().walk(&mut |p, _| {
                if let Some((line, col)) = cfg.origins().nearest(p).and_then(|o| o.line_column()) {
                    assert!(
                        line >= 1 && line <= lines && col >= 1,
                        "origin {line}:{col} of {p}"
                    );
                }
            });
            // Typed conversion of the whole tree to a Value is the identity.
            let back: Value = cfg.deserialize().expect("any tree converts to Value");
            assert_eq!(render(&back), render(cfg.value()));
        }
        Err(e) => check_error_display(&e),
    }
}
