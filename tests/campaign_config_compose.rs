//! Hydra-style composition of `defaults`: paths, packages, `_self_` order, deep merge, cycles,
//! confinement to the config root.

use std::fs;
use std::path::{Path, PathBuf};

use puzzletron::campaign::config::{ConfigError, ConfigLoader, Env, Value, load_experiment};

struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    fn new(files: &[(&str, &str)]) -> Tree {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let p = dir.path().join(name);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
        Tree { dir }
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
    fn load(&self, rel: &str) -> Result<puzzletron::campaign::config::Config, ConfigError> {
        load_experiment(self.path(rel), &[], &Env::new())
    }
}

fn int(c: &puzzletron::campaign::config::Config, k: &str) -> i64 {
    c.get(k)
        .and_then(Value::as_i64)
        .unwrap_or_else(|| panic!("{k}: {:?}", c.get(k)))
}

#[test]
fn absolute_entry_resolves_from_the_folder_holding_base_yaml() {
    let t = Tree::new(&[
        ("base.yaml", "a: 1\nb: {x: 1, y: 2}\n"),
        ("shared/model.yaml", "# @package _global_\nmodel: m\n"),
        (
            "families/f/runs/exp.yaml",
            "defaults:\n  - /base@_global_\n  - /shared/model@_global_\n  - _self_\nb: {y: 20}\n",
        ),
    ]);
    let c = t.load("families/f/runs/exp.yaml").unwrap();
    assert_eq!(int(&c, "a"), 1);
    assert_eq!(int(&c, "b.x"), 1);
    assert_eq!(int(&c, "b.y"), 20);
    assert_eq!(c.get("model"), Some(&Value::from("m")));
    assert_eq!(
        c.config_root().unwrap(),
        t.dir.path().canonicalize().unwrap()
    );
}

#[test]
fn relative_entry_resolves_from_the_including_file() {
    let t = Tree::new(&[
        ("base.yaml", "a: 0\n"),
        (
            "runs/parent.yaml",
            "# @package _global_\ndefaults:\n  - /base@_global_\n  - _self_\na: 1\nb: 1\n",
        ),
        (
            "runs/child.yaml",
            "defaults:\n  - parent\n  - _self_\nb: 2\n",
        ),
        ("runs/no_header.yaml", "c: 3\n"),
        ("runs/child2.yaml", "defaults:\n  - no_header\n  - _self_\n"),
    ]);
    let c = t.load("runs/child.yaml").unwrap();
    assert_eq!(int(&c, "a"), 1);
    assert_eq!(int(&c, "b"), 2);
    // Without a header or `@package`, Hydra's default package is the config group (`runs`).
    let c = t.load("runs/child2.yaml").unwrap();
    assert_eq!(int(&c, "runs.c"), 3);
    assert_eq!(c.get("c"), None);
}

#[test]
fn self_first_lets_later_defaults_override_the_file() {
    let t = Tree::new(&[
        ("base.yaml", "a: from_base\n"),
        (
            "exp.yaml",
            "defaults:\n  - _self_\n  - /base@_global_\na: from_self\n",
        ),
    ]);
    let c = t.load("exp.yaml").unwrap();
    assert_eq!(c.get("a"), Some(&Value::from("from_base")));
}

#[test]
fn missing_self_means_self_last() {
    let t = Tree::new(&[
        ("base.yaml", "a: from_base\n"),
        ("exp.yaml", "defaults:\n  - /base@_global_\na: from_self\n"),
    ]);
    assert_eq!(
        t.load("exp.yaml").unwrap().get("a"),
        Some(&Value::from("from_self"))
    );
}

#[test]
fn deep_merge_mappings_merge_lists_and_scalars_replace() {
    let t = Tree::new(&[
        (
            "base.yaml",
            "m: {a: 1, b: {c: 2, d: 3}}\nl: [1, 2, 3]\ns: x\nto_null: {k: 1}\nto_map: 5\n",
        ),
        (
            "exp.yaml",
            "defaults: [/base@_global_, _self_]\nm: {b: {d: 30, e: 40}}\nl: [9]\ns: y\nto_null: null\nto_map: {k: 2}\n",
        ),
    ]);
    let c = t.load("exp.yaml").unwrap();
    assert_eq!(int(&c, "m.a"), 1);
    assert_eq!(int(&c, "m.b.c"), 2);
    assert_eq!(int(&c, "m.b.d"), 30);
    assert_eq!(int(&c, "m.b.e"), 40);
    assert_eq!(c.get("l"), Some(&Value::List(vec![Value::Int(9)])));
    assert_eq!(c.get("s"), Some(&Value::from("y")));
    assert_eq!(c.get("to_null"), Some(&Value::Null));
    assert_eq!(int(&c, "to_map.k"), 2);
    // Key order: base's order, new keys appended.
    let keys: Vec<&str> = c
        .get("m.b")
        .unwrap()
        .as_mapping()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["c", "d", "e"]);
}

#[test]
fn merge_order_is_depth_first_like_hydra() {
    // a: {x: {p: 1}} then b sets x: 5 then c sets x: {q: 2}. Sequential merging gives {q: 2};
    // merging b and c first would wrongly keep p.
    let t = Tree::new(&[
        ("base.yaml", "x: {p: 1}\n"),
        ("b.yaml", "# @package _global_\nx: 5\n"),
        ("c.yaml", "# @package _global_\nx: {q: 2}\n"),
        ("mid.yaml", "# @package _global_\ndefaults: [b, c]\n"),
        (
            "exp.yaml",
            "defaults: [/base@_global_, mid@_global_, _self_]\n",
        ),
    ]);
    let c = t.load("exp.yaml").unwrap();
    assert_eq!(c.get("x.q"), Some(&Value::Int(2)));
    assert_eq!(c.get("x.p"), None);
}

#[test]
fn packages_place_content() {
    let t = Tree::new(&[
        ("base.yaml", "root_key: 1\n"),
        ("db/mysql.yaml", "port: 3306\n"),
        ("opt/thing.yaml", "# @package things.one\nv: 1\n"),
        ("x.yaml", "v: 2\n"),
        (
            "exp.yaml",
            "defaults:\n  - /base@_global_\n  - db: mysql\n  - /opt/thing\n  - x@server.x\n  - optional cache: missing\n  - extra: null\n  - _self_\n",
        ),
    ]);
    let c = t.load("exp.yaml").unwrap();
    assert_eq!(int(&c, "root_key"), 1);
    // Config group default package: the group.
    assert_eq!(int(&c, "db.port"), 3306);
    // `# @package` header.
    assert_eq!(int(&c, "things.one.v"), 1);
    // `@pkg` relative to the including config (the root here).
    assert_eq!(int(&c, "server.x.v"), 2);
}

#[test]
fn cycles_are_refused_with_the_chain() {
    let t = Tree::new(&[
        ("base.yaml", "a: 1\n"),
        ("a.yaml", "defaults: [b, _self_]\n"),
        ("b.yaml", "defaults: [c]\n"),
        ("c.yaml", "defaults: [a]\n"),
    ]);
    let e = t.load("a.yaml").unwrap_err();
    match &e {
        ConfigError::DefaultsCycle { chain } => {
            let names: Vec<String> = chain
                .iter()
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect();
            assert_eq!(names, ["a.yaml", "b.yaml", "c.yaml", "a.yaml"]);
        }
        other => panic!("{other:?}"),
    }
    let msg = e.to_string();
    assert!(msg.starts_with("defaults cycle: "), "{msg}");
    assert!(
        msg.contains("a.yaml -> ") && msg.contains("b.yaml -> "),
        "{msg}"
    );
}

#[test]
fn self_include_is_a_cycle() {
    let t = Tree::new(&[("base.yaml", ""), ("a.yaml", "defaults: [a]\n")]);
    assert!(matches!(
        t.load("a.yaml"),
        Err(ConfigError::DefaultsCycle { .. })
    ));
}

#[test]
fn dot_dot_escape_is_refused() {
    let t = Tree::new(&[
        ("outside.yaml", "secret: 1\n"),
        ("root/base.yaml", "a: 1\n"),
        (
            "root/exp.yaml",
            "defaults:\n  - /base@_global_\n  - ../outside@_global_\n",
        ),
    ]);
    let e = t.load("root/exp.yaml").unwrap_err();
    match &e {
        ConfigError::PathEscape { entry, line, .. } => {
            assert_eq!(entry, "../outside@_global_");
            assert_eq!(*line, 3);
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("outside the config root"), "{e}");
}

#[test]
fn absolute_dot_dot_escape_is_refused_even_when_the_target_does_not_exist() {
    let t = Tree::new(&[
        ("root/base.yaml", "a: 1\n"),
        ("root/exp.yaml", "defaults:\n  - /../../../../etc/passwd\n"),
    ]);
    assert!(matches!(
        t.load("root/exp.yaml"),
        Err(ConfigError::PathEscape { .. })
    ));
}

#[cfg(unix)]
#[test]
fn symlink_pointing_outside_the_root_is_refused() {
    let t = Tree::new(&[
        ("outside/evil.yaml", "x: 1\n"),
        ("root/base.yaml", "a: 1\n"),
        ("root/exp.yaml", "defaults:\n  - link\n"),
    ]);
    std::os::unix::fs::symlink(t.path("outside/evil.yaml"), t.path("root/link.yaml")).unwrap();
    assert!(matches!(
        t.load("root/exp.yaml"),
        Err(ConfigError::PathEscape { .. })
    ));
}

#[test]
fn experiment_outside_an_explicit_root_is_refused() {
    let t = Tree::new(&[
        ("root/base.yaml", "a: 1\n"),
        ("elsewhere/exp.yaml", "b: 1\n"),
    ]);
    let e = ConfigLoader::new()
        .config_root(t.path("root"))
        .load_experiment(t.path("elsewhere/exp.yaml"), &[])
        .unwrap_err();
    assert!(matches!(e, ConfigError::PathEscape { .. }), "{e:?}");
}

#[test]
fn missing_entry_names_including_file_line_and_resolved_path() {
    let t = Tree::new(&[
        ("base.yaml", ""),
        ("exp.yaml", "# c\ndefaults:\n  - _self_\n  - nope\n"),
    ]);
    let e = t.load("exp.yaml").unwrap_err();
    match &e {
        ConfigError::DefaultsNotFound {
            file,
            line,
            entry,
            resolved,
        } => {
            assert!(file.ends_with("exp.yaml"));
            assert_eq!(*line, 4);
            assert_eq!(entry, "nope");
            assert!(resolved.ends_with("nope.yaml"));
        }
        other => panic!("{other:?}"),
    }
    assert!(
        e.to_string()
            .contains("exp.yaml:4: defaults entry `nope` not found"),
        "{e}"
    );
}

#[test]
fn malformed_defaults_are_refused_with_line() {
    let t = Tree::new(&[("base.yaml", ""), ("exp.yaml", "a: 1\ndefaults: {x: y}\n")]);
    let e = t.load("exp.yaml").unwrap_err();
    match &e {
        ConfigError::BadDefaults { line, message, .. } => {
            assert_eq!(*line, 2);
            assert!(message.contains("must be a list"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let t = Tree::new(&[
        ("base.yaml", ""),
        ("exp.yaml", "defaults:\n  - override db: x\n"),
    ]);
    assert!(matches!(
        t.load("exp.yaml"),
        Err(ConfigError::BadDefaults { line: 2, .. })
    ));
    let t = Tree::new(&[("base.yaml", ""), ("exp.yaml", "defaults:\n  - [1]\n")]);
    assert!(matches!(
        t.load("exp.yaml"),
        Err(ConfigError::BadDefaults { line: 2, .. })
    ));
    let t = Tree::new(&[
        ("base.yaml", ""),
        ("exp.yaml", "defaults: [_self_, _self_]\n"),
    ]);
    assert!(matches!(
        t.load("exp.yaml"),
        Err(ConfigError::BadDefaults { .. })
    ));
}

#[test]
fn top_level_list_file_is_refused() {
    let t = Tree::new(&[("base.yaml", ""), ("exp.yaml", "- 1\n- 2\n")]);
    let e = t.load("exp.yaml").unwrap_err();
    assert!(
        e.to_string().contains("must be a mapping at the top level"),
        "{e}"
    );
}

#[test]
fn missing_experiment_file_is_an_io_error_naming_it() {
    let t = Tree::new(&[("base.yaml", "")]);
    let e = t.load("nope.yaml").unwrap_err();
    assert!(
        matches!(&e, ConfigError::Io { path, .. } if path.ends_with("nope.yaml")),
        "{e:?}"
    );
    assert!(!e.is_retryable());
}

#[test]
fn origins_point_at_the_file_that_last_set_a_value() {
    let t = Tree::new(&[
        ("base.yaml", "a: 1\nb: 2\n"),
        ("exp.yaml", "defaults: [/base@_global_, _self_]\nb: 3\n"),
    ]);
    let c = t.load("exp.yaml").unwrap();
    let file_of = |k: &str| {
        c.origin(k)
            .and_then(|o| o.file())
            .map(Path::to_path_buf)
            .unwrap()
    };
    assert!(file_of("a").ends_with("base.yaml"));
    assert!(file_of("b").ends_with("exp.yaml"));
    assert_eq!(c.origin("b").unwrap().line_column(), Some((2, 4)));
    assert_eq!(c.files().len(), 2);
}

#[test]
fn empty_entry_names_the_including_file() {
    let t = Tree::new(&[
        ("base.yaml", ""),
        ("exp.yaml", "defaults:\n  - '@_global_'\n"),
    ]);
    match t.load("exp.yaml").unwrap_err() {
        ConfigError::BadDefaults {
            file,
            line,
            message,
        } => {
            assert!(file.ends_with("exp.yaml"), "{file:?}");
            assert_eq!(line, 2);
            assert!(message.contains("empty config path"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn exponential_defaults_tree_is_refused() {
    // Each level includes the next one ten times: 10^4 loads without a cycle.
    let mut files = vec![("base.yaml".to_string(), String::new())];
    for i in 0..4 {
        let next = format!("l{}", i + 1);
        let entries = [next.as_str(); 10].join(", ");
        files.push((
            format!("l{i}.yaml"),
            format!("defaults: [{entries}]\nk{i}: 1\n"),
        ));
    }
    files.push(("l4.yaml".into(), "leaf: 1\n".into()));
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let t = Tree::new(&refs);
    let e = t.load("l0.yaml").unwrap_err();
    assert!(e.to_string().contains("loads more than 1000 files"), "{e}");
}
