//! `${...}` interpolation: lookups, typing, env injection, nesting, errors and cycles.

use std::sync::Arc;

use puzzletron::campaign::config::{
    Config, ConfigError, ConfigLoader, Env, Origin, Resolvers, Value, parse_override,
    resolve_string,
};

fn load_with(text: &str, env: Env, overrides: &[&str]) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("base.yaml"), text).unwrap();
    let o: Vec<_> = overrides
        .iter()
        .map(|t| parse_override(t).unwrap())
        .collect();
    ConfigLoader::new()
        .env(env)
        .load_experiment(dir.path().join("base.yaml"), &o)
}

fn load(text: &str) -> Config {
    load_with(text, Env::new(), &[]).unwrap_or_else(|e| panic!("{e}"))
}

fn load_err(text: &str) -> ConfigError {
    match load_with(text, Env::new(), &[]) {
        Ok(c) => panic!("expected an error, got {:?}", c.value()),
        Err(e) => e,
    }
}

#[test]
fn dotted_absolute_lookup_and_list_index() {
    let c = load("a: {b: {c: deep}}\nl: [x, {y: why}]\nr1: ${a.b.c}\nr2: ${l.1.y}\nr3: ${l[0]}\n");
    assert_eq!(c.get("r1"), Some(&Value::from("deep")));
    assert_eq!(c.get("r2"), Some(&Value::from("why")));
    assert_eq!(c.get("r3"), Some(&Value::from("x")));
}

#[test]
fn a_whole_value_interpolation_keeps_the_type() {
    let c = load(
        "i: 4096\nf: 0.5\nb: true\nn: null\nm: {k: [1, 2]}\nl: [a, b]\nri: ${i}\nrf: ${f}\nrb: ${b}\nrn: ${n}\nrm: ${m}\nrl: ${l}\n",
    );
    assert_eq!(c.get("ri"), Some(&Value::Int(4096)));
    assert_eq!(c.get("rf"), Some(&Value::Float(0.5)));
    assert_eq!(c.get("rb"), Some(&Value::Bool(true)));
    assert_eq!(c.get("rn"), Some(&Value::Null));
    assert_eq!(c.get("rm.k.1"), Some(&Value::Int(2)));
    assert_eq!(c.get("rl"), c.get("l"));
}

#[test]
fn mixed_text_concatenates_into_a_string() {
    let c = load(
        "dir: runs\nn: 3\nlr: 0.0003\nsmall: 1e-05\nflag: false\nnothing: null\np: ${dir}/ckpt_${n}\nq: lr_${lr}_${small}\nr: ${flag}-${nothing}\n",
    );
    assert_eq!(c.get("p"), Some(&Value::from("runs/ckpt_3")));
    // Floats render like Python's repr, as the Python reference builds these strings.
    assert_eq!(c.get("q"), Some(&Value::from("lr_0.0003_1e-05")));
    assert_eq!(c.get("r"), Some(&Value::from("false-null")));
}

#[test]
fn a_container_inside_a_string_is_an_error() {
    let e = load_err("m: {a: 1}\ns: x${m}\n");
    assert!(e.to_string().contains("`${m}` is a mapping"), "{e}");
}

#[test]
fn nested_interpolation_in_a_key() {
    let c = load("which: b\nopts: {a: 1, b: 2}\nr: ${opts.${which}}\n");
    assert_eq!(c.get("r"), Some(&Value::Int(2)));
}

#[test]
fn chains_of_interpolations_resolve() {
    let c = load("a: ${b}\nb: ${c}/x\nc: ${d}\nd: root\n");
    assert_eq!(c.get("a"), Some(&Value::from("root/x")));
}

#[test]
fn lookups_go_through_an_interpolated_mapping() {
    let c = load("src: {k: {v: 7}}\nalias: ${src}\nr: ${alias.k.v}\n");
    assert_eq!(c.get("r"), Some(&Value::Int(7)));
}

#[test]
fn relative_lookups() {
    let c = load("a:\n  x: 1\n  b:\n    y: 2\n    r1: ${.y}\n    r2: ${..x}\n");
    assert_eq!(c.get("a.b.r1"), Some(&Value::Int(2)));
    assert_eq!(c.get("a.b.r2"), Some(&Value::Int(1)));
}

#[test]
fn env_from_the_injected_map_with_and_without_default() {
    let env = Env::new().with("RUN", "/scratch/r1");
    let c = load_with(
        "a: ${oc.env:RUN}\nb: ${oc.env:MISSING,../fallback/path}\nc: ${oc.env:RUN,unused}\nd: ${oc.env:MISSING,null}\ne: ${oc.env:MISSING,7}\nf: ${oc.env:MISSING,'a,b'}\n",
        env,
        &[],
    )
    .unwrap();
    assert_eq!(c.get("a"), Some(&Value::from("/scratch/r1")));
    assert_eq!(c.get("b"), Some(&Value::from("../fallback/path")));
    assert_eq!(c.get("c"), Some(&Value::from("/scratch/r1")));
    assert_eq!(c.get("d"), Some(&Value::Null));
    // Defaults are strings (as OmegaConf's oc.env).
    assert_eq!(c.get("e"), Some(&Value::from("7")));
    assert_eq!(c.get("f"), Some(&Value::from("a,b")));
}

#[test]
fn the_process_environment_is_not_read_unless_injected() {
    // PATH is set in any test process; the loader must not see it.
    let e = load_err("p: ${oc.env:PATH}\n");
    assert!(
        matches!(&e, ConfigError::MissingEnv { name, .. } if name == "PATH"),
        "{e:?}"
    );
}

#[test]
fn missing_env_names_the_variable_key_and_file_line() {
    let e = load_err("x: 1\ndataset: ${oc.env:DATASET_PATH}\n");
    match &e {
        ConfigError::MissingEnv { key, origin, name } => {
            assert_eq!(name, "DATASET_PATH");
            assert_eq!(key.to_string(), "dataset");
            let o = origin.as_ref().unwrap();
            assert!(o.file().unwrap().ends_with("base.yaml"));
            assert_eq!(o.line_column(), Some((2, 10)));
        }
        other => panic!("{other:?}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("base.yaml:2:10"), "{msg}");
    assert!(msg.contains("`DATASET_PATH` is not set"), "{msg}");
}

#[test]
fn unknown_key_is_an_error_naming_key_and_file() {
    let e = load_err("a: 1\nb:\n  c: ${nope.x}\n");
    match &e {
        ConfigError::UnknownKey {
            key,
            origin,
            expression,
            missing,
        } => {
            assert_eq!(key.to_string(), "b.c");
            assert_eq!(expression, "${nope.x}");
            assert_eq!(missing, "nope.x");
            assert_eq!(origin.as_ref().unwrap().line_column(), Some((3, 6)));
        }
        other => panic!("{other:?}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("key `nope.x` not found"), "{msg}");
    assert!(msg.contains("base.yaml:3:6"), "{msg}");
}

#[test]
fn cycles_are_refused_with_the_chain() {
    let e = load_err("a: ${b}\nb: x${c}\nc: ${a}\n");
    match &e {
        ConfigError::InterpolationCycle { chain, origin } => {
            let names: Vec<String> = chain.iter().map(|k| k.to_string()).collect();
            assert_eq!(names, ["a", "b", "c", "a"]);
            assert_eq!(origin.as_ref().unwrap().line_column(), Some((1, 4)));
        }
        other => panic!("{other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.starts_with("interpolation cycle: a -> b -> c -> a ("),
        "{msg}"
    );
    assert!(msg.ends_with("base.yaml:1:4)"), "{msg}");
    let e = load_err("a: ${a}\n");
    assert!(matches!(e, ConfigError::InterpolationCycle { .. }));
    // A value that refers to its own container.
    let e = load_err("m:\n  k: ${m}\n");
    assert!(matches!(e, ConfigError::InterpolationCycle { .. }), "{e:?}");
}

#[test]
fn escaped_dollar_is_literal() {
    let c = load("a: \\${not.a.ref}\nb: cost \\${x} and ${c}\nc: 1\n");
    assert_eq!(c.get("a"), Some(&Value::from("${not.a.ref}")));
    assert_eq!(c.get("b"), Some(&Value::from("cost ${x} and 1")));
}

#[test]
fn syntax_errors_show_a_caret() {
    let e = load_err("a: 1\nb: x${a\n");
    match &e {
        ConfigError::InterpolationSyntax { position, text, .. } => {
            assert_eq!(text, "x${a");
            assert_eq!(*position, 1);
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().ends_with("  x${a\n   ^"), "{e}");
    let e = load_err("b: ${a!b}\n");
    assert!(
        matches!(e, ConfigError::InterpolationSyntax { position: 3, .. }),
        "{e:?}"
    );
}

#[test]
fn puzzletron_resolvers_and_unknown_resolvers() {
    let c = load("d: runs\np: ${to_path:${d}/mip/solutions.json}\no: ${get_object:a.b.Hook}\n");
    assert_eq!(c.get("p"), Some(&Value::from("runs/mip/solutions.json")));
    assert_eq!(c.get("o"), Some(&Value::from("a.b.Hook")));
    let e = load_err("x: ${nope:1}\n");
    match &e {
        ConfigError::UnknownResolver { name, known, .. } => {
            assert_eq!(name, "nope");
            assert!(known.contains(&"oc.env".to_string()));
            assert!(known.contains(&"to_path".to_string()));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn custom_resolvers_get_typed_arguments() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("base.yaml"), "n: 3\nr: ${mul:${n},4}\n").unwrap();
    let mul = Arc::new(|args: &[Value]| match args {
        [Value::Int(a), Value::Int(b)] => Ok(Value::Int(a * b)),
        other => Err(format!("expected two ints, got {other:?}")),
    });
    let c = ConfigLoader::new()
        .resolvers(Resolvers::none().with("mul", mul))
        .load_experiment(dir.path().join("base.yaml"), &[])
        .unwrap();
    assert_eq!(c.get("r"), Some(&Value::Int(12)));
}

#[test]
fn oc_decode_and_oc_select() {
    let env = Env::new().with("N", "8").with("L", "[1, 2]");
    let c = load_with(
        "n: ${oc.decode:${oc.env:N}}\nl: ${oc.decode:${oc.env:L}}\ns: ${oc.select:missing.key,fallback}\nt: ${oc.select:n}\n",
        env,
        &[],
    )
    .unwrap();
    assert_eq!(c.get("n"), Some(&Value::Int(8)));
    assert_eq!(
        c.get("l"),
        Some(&Value::List(vec![Value::Int(1), Value::Int(2)]))
    );
    assert_eq!(c.get("s"), Some(&Value::from("fallback")));
    assert_eq!(c.get("t"), Some(&Value::Int(8)));
}

#[test]
fn overrides_apply_before_interpolation() {
    let c = load_with(
        "puzzle_dir: runs/a\nteacher: ${puzzle_dir}/teacher\n",
        Env::new(),
        &["puzzle_dir=/scratch/b"],
    )
    .unwrap();
    assert_eq!(c.get("teacher"), Some(&Value::from("/scratch/b/teacher")));
    // An override value may itself interpolate.
    let c = load_with("a: 1\nb: 2\n", Env::new(), &["b=${a}"]).unwrap();
    assert_eq!(c.get("b"), Some(&Value::Int(1)));
}

#[test]
fn interpolated_mapping_copies_keep_their_source_origins() {
    let c = load("src:\n  k: 1\ncopy: ${src}\n");
    assert_eq!(
        c.origin("copy.k").and_then(Origin::line_column),
        Some((2, 6))
    );
}

#[test]
fn resolve_string_evaluates_one_expression() {
    let root = Value::Mapping([("a".to_string(), Value::Int(2))].into_iter().collect());
    let env = Env::new().with("X", "y");
    let r = resolve_string("${a}", &root, &env, &Resolvers::puzzletron()).unwrap();
    assert_eq!(r, Value::Int(2));
    let r = resolve_string("v${a}-${oc.env:X}", &root, &env, &Resolvers::puzzletron()).unwrap();
    assert_eq!(r, Value::from("v2-y"));
}

#[test]
fn env_debug_redacts_secrets() {
    let env = Env::new()
        .with("HF_TOKEN", "hf_abc")
        .with("WANDB_API_KEY", "k")
        .with("RUN", "r");
    let shown = format!("{env:?}");
    assert!(!shown.contains("hf_abc"), "{shown}");
    assert!(!shown.contains("\"k\""), "{shown}");
    assert!(shown.contains("\"r\""), "{shown}");
}
