//! CONTRIBUTING.md's "Modules" list is checked against `src/`: every file under `src/` has a
//! line there, and every `src/` path named there exists. A module added without its line, or a
//! line left behind by a removed module, fails here rather than leaving the layout stale.
//! Also: the code and tests cite the docs in the repository (`docs/`), never `../shared`'s
//! design document, and every `docs/` file they cite exists; and the layers point one way (no
//! area's code imports an area above it).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The text of CONTRIBUTING.md's `### Modules` section: from its heading to the next heading.
fn modules_section(contributing: &str) -> Result<String, String> {
    let start = contributing
        .find("\n### Modules\n")
        .ok_or("CONTRIBUTING.md has no `### Modules` section")?;
    let body = &contributing[start + "\n### Modules\n".len()..];
    let end = body
        .find("\n## ")
        .into_iter()
        .chain(body.find("\n### "))
        .min()
        .unwrap_or(body.len());
    Ok(body[..end].to_string())
}

/// Every path-like word of `text` that starts with `prefix` (`src/a/b.rs`, `src/a/`), with
/// the backticks and punctuation around it dropped.
fn paths_named(text: &str, prefix: &str) -> BTreeSet<String> {
    text.split(|c: char| c.is_whitespace() || matches!(c, '`' | '(' | ')' | ',' | ';' | ':'))
        .filter(|w| w.starts_with(prefix))
        .map(|w| w.trim_end_matches(['.', ',']).to_string())
        .collect()
}

/// Every file under `dir`, as a path relative to the repository root with `/` separators.
fn files_under(dir: &Path, out: &mut Vec<String>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            let rel = path.strip_prefix(root()).expect("under the root");
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

fn read(rel: &str) -> String {
    fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// The files of `src/` that the section does not name, and the `src/` paths it names that do
/// not exist.
fn layout_errors(section: &str, src_files: &[String]) -> (Vec<String>, Vec<String>) {
    let named = paths_named(section, "src/");
    let undocumented = src_files
        .iter()
        .filter(|f| !named.contains(*f))
        .cloned()
        .collect();
    let gone = named
        .iter()
        .filter(|p| !root().join(p).exists())
        .cloned()
        .collect();
    (undocumented, gone)
}

#[test]
fn every_module_under_src_is_in_the_layout_and_every_path_there_exists() {
    let section = modules_section(&read("CONTRIBUTING.md")).unwrap();
    let mut files = Vec::new();
    files_under(&root().join("src"), &mut files);
    files.sort();
    assert!(
        files.iter().any(|f| f == "src/lib.rs") && files.len() > 100,
        "the walk of src/ found {} files",
        files.len()
    );
    let (undocumented, gone) = layout_errors(&section, &files);
    assert!(
        undocumented.is_empty(),
        "files under src/ without a line in CONTRIBUTING.md's `### Modules`: {undocumented:?}"
    );
    assert!(
        gone.is_empty(),
        "CONTRIBUTING.md's `### Modules` names paths that do not exist: {gone:?}"
    );
}

#[test]
fn the_check_fails_for_an_undocumented_module_and_a_stale_line() {
    // The same check over a section that lacks a real file and names a removed one: both are
    // reported, so the test above cannot pass by accident.
    let section = "```\nsrc/lib.rs   crate docs\nsrc/gone/old.rs   removed\n```\n";
    let files = vec!["src/lib.rs".to_string(), "src/new_area/mod.rs".to_string()];
    let (undocumented, gone) = layout_errors(section, &files);
    assert_eq!(undocumented, vec!["src/new_area/mod.rs".to_string()]);
    assert_eq!(gone, vec!["src/gone/old.rs".to_string()]);
}

#[test]
fn the_modules_section_ends_at_the_next_heading() {
    let text = "intro\n### Modules\nsrc/a.rs\n### Areas\nsrc/b.rs\n";
    assert_eq!(modules_section(text).unwrap(), "src/a.rs");
    assert!(modules_section("no such section").is_err());
}

#[test]
fn code_cites_the_docs_in_the_repository() {
    let mut files = Vec::new();
    for dir in ["src", "tests", "examples", "benches"] {
        files_under(&root().join(dir), &mut files);
    }
    // This file names the citations it looks for.
    let skip = ["tests/docs_layout.rs"];
    let mut design_refs = Vec::new();
    let mut docs_cited = BTreeSet::new();
    for f in files.iter().filter(|f| f.ends_with(".rs")) {
        if skip.iter().any(|s| f.starts_with(s)) {
            continue;
        }
        let text = read(f);
        for (n, line) in text.lines().enumerate() {
            if line.contains("DESIGN.md") || line.contains("-cases.md") {
                design_refs.push(format!("{f}:{}: {}", n + 1, line.trim()));
            }
        }
        docs_cited.extend(paths_named(&text, "docs/"));
    }
    assert!(
        design_refs.is_empty(),
        "citations of ../shared's documents (cite docs/ instead): {design_refs:#?}"
    );
    assert!(
        docs_cited.contains("docs/design.md") && docs_cited.contains("docs/evidence.md"),
        "cited: {docs_cited:?}"
    );
    for d in &docs_cited {
        assert!(root().join(d).is_file(), "{d} is cited but does not exist");
    }
}

/// The case ids (`C01`, `N05`, `P07`; `c20_` in a test's name) cited in `text`.
fn case_ids(text: &str) -> BTreeSet<String> {
    let b = text.as_bytes();
    let mut ids = BTreeSet::new();
    for i in 0..b.len().saturating_sub(2) {
        let (c, d1, d2) = (b[i], b[i + 1], b[i + 2]);
        let before_ok = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let next = b.get(i + 3).copied();
        let id_char = matches!(c, b'C' | b'N' | b'P');
        let test_name = matches!(c, b'c' | b'n' | b'p') && next == Some(b'_');
        let after_ok = !next.is_some_and(|n| n.is_ascii_digit() || n.is_ascii_uppercase());
        if (id_char || test_name)
            && before_ok
            && after_ok
            && d1.is_ascii_digit()
            && d2.is_ascii_digit()
        {
            ids.insert(format!(
                "{}{}{}",
                c.to_ascii_uppercase() as char,
                d1 as char,
                d2 as char
            ));
        }
    }
    ids
}

#[test]
fn every_case_id_the_code_cites_is_described_in_docs_evidence() {
    let evidence = read("docs/evidence.md");
    let described: BTreeSet<String> = evidence
        .lines()
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|l| l.split(' ').next())
        .filter(|id| case_ids(id).len() == 1)
        .map(str::to_string)
        .collect();
    let mut files = Vec::new();
    for dir in ["src", "tests", "examples", "benches"] {
        files_under(&root().join(dir), &mut files);
    }
    let mut cited = BTreeSet::new();
    for f in files.iter().filter(|f| f.ends_with(".rs")) {
        cited.extend(case_ids(&read(f)));
    }
    assert!(
        cited.contains("C04") && cited.contains("N03") && cited.contains("P01"),
        "{cited:?}"
    );
    let missing: Vec<_> = cited.difference(&described).collect();
    assert!(
        missing.is_empty(),
        "case ids cited in the code without a row in docs/evidence.md: {missing:?}"
    );
}

#[test]
fn case_ids_are_found_in_their_cited_forms_only() {
    let ids = case_ids("C21a, N05 and (P01 (c)); fn n03_resume; node01 C123 xC04 C4 p01x");
    let ids: Vec<_> = ids.into_iter().collect();
    assert_eq!(ids, ["C21", "N03", "N05", "P01"]);
}

/// The areas of `src/`, lowest first, with the areas each may import (CONTRIBUTING.md's
/// "Modules": `identity` -> `store` -> `metrics` / `executor` -> `sweep` / `campaign` ->
/// `report` -> `cli`). `fsutil` and `sys` (`/proc`, clocks, host name) sit below everything; `error` (the crate's
/// `Error`, which wraps each area's error) is what the sweep half returns.
const LAYERS: &[(&str, &[&str])] = &[
    ("fsutil", &[]),
    ("sys", &[]),
    ("identity", &["fsutil", "sys"]),
    ("store", &["fsutil", "sys", "identity"]),
    ("metrics", &["fsutil", "sys", "identity", "store"]),
    ("executor", &["fsutil", "sys", "identity", "store"]),
    (
        "sweep",
        &[
            "fsutil", "sys", "identity", "store", "metrics", "executor", "error",
        ],
    ),
    (
        "campaign",
        &["fsutil", "sys", "identity", "store", "executor"],
    ),
    (
        "report",
        &[
            "fsutil", "sys", "identity", "store", "metrics", "executor", "sweep", "campaign",
        ],
    ),
    (
        "error",
        &[
            "identity", "store", "metrics", "executor", "sweep", "campaign",
        ],
    ),
];

/// Items of the crate root and the area that defines them (the sweep half lives at the root).
fn root_item_area(name: &str) -> &'static str {
    match name {
        "Error" | "Result" => "error",
        _ => "sweep",
    }
}

/// The areas a file's code (comments and `#[cfg(test)] mod` blocks left out) names through
/// `crate::`, with the line.
fn imported_areas(text: &str) -> Vec<(String, String)> {
    let areas: Vec<&str> = LAYERS.iter().map(|(a, _)| *a).chain(["cli"]).collect();
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        if t == "#[cfg(test)]"
            && lines
                .get(i + 1)
                .is_some_and(|n| n.trim_start().starts_with("mod ") && n.ends_with('{'))
        {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        let mut rest = *line;
        while let Some(at) = rest.find("crate::") {
            let before = &rest[..at];
            rest = &rest[at + "crate::".len()..];
            if before.ends_with('$') {
                continue; // a macro's `$crate::`: the user's path, not an import
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let area = if let Some(a) = areas.iter().find(|a| **a == name) {
                *a
            } else if name.starts_with(|c: char| c.is_ascii_uppercase()) {
                root_item_area(&name)
            } else {
                continue; // `arrow`, `worker`, `__private`
            };
            out.push((area.to_string(), line.trim().to_string()));
        }
    }
    out
}

/// Layers point one way: no code under an area names an area above it or beside it (see
/// [`LAYERS`]). A new import that breaks the layering fails here with its file and line.
#[test]
fn layers_point_one_way() {
    let mut found = Vec::new();
    for (area, allowed) in LAYERS {
        let mut files = Vec::new();
        let dir = root().join("src").join(area);
        if dir.is_dir() {
            files_under(&dir, &mut files);
        } else if root().join(format!("src/{area}.rs")).is_file() {
            files.push(format!("src/{area}.rs"));
        }
        // Unit-test files (`*_tests.rs`) may reach across layers to build their cases.
        for f in files
            .iter()
            .filter(|f| f.ends_with(".rs") && !f.ends_with("_tests.rs"))
        {
            for (to, line) in imported_areas(&read(f)) {
                if to != *area && !allowed.contains(&to.as_str()) {
                    found.push(format!("{f} ({area} -> {to}): {line}"));
                }
            }
        }
    }
    assert!(found.is_empty(), "imports against the layers: {found:#?}");
    // The check sees an import and a root item, and skips doc links, macros and test modules.
    let sample = "/// See [`MetricsExt`](crate::metrics::MetricsExt).\n\
                  use crate::metrics::table_of;\n\
                  fn f() -> crate::Result<()> { $crate::Job::new() }\n\
                  #[cfg(test)]\nmod tests {\nuse crate::cli::x;\n}\n";
    let got: Vec<String> = imported_areas(sample).into_iter().map(|(a, _)| a).collect();
    assert_eq!(got, ["metrics", "error"]);
}
