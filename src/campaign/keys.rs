//! Every key of an experiment accounted for.
//!
//! The compiler reads a few dotted keys of an experiment (a catalog's
//! [`read_keys`](super::StageCatalog::read_keys): stage switches, mesh sources, shard axes,
//! `post_mip.flows`; and its own: `puzzle_dir`, `stages`, `execution.gpus_per_node`), and the
//! stage sections are named after the catalog's stages. Everything else goes to the workers
//! unchecked. A typo of a key the compiler reads would silently change what runs (a
//! misspelt `replacement_scoring.enable: false` leaves the stage on), so [`check_experiment_keys`]
//! walks the tree along the read keys and refuses:
//!
//! - a key next to a read one that is within a small edit distance of it
//!   ([`PlanError::NearKnownKey`], naming the key it is close to);
//! - a scalar where the compiler reads a mapping (`-o pruning.automodel=3` would make the
//!   mesh fall back to its default: [`PlanError::InvalidValue`]).
//!
//! The other top-level keys are returned, to be listed as passed to the workers unchecked.

use std::collections::BTreeMap;

use super::catalog::StageCatalog;
use super::config::Value;
use super::plan_error::PlanError;
use super::schema::{describe, join};

/// A tree of the dotted keys the compiler reads.
#[derive(Default)]
struct Tree(BTreeMap<String, Tree>);

impl Tree {
    fn insert(&mut self, dotted: &str) {
        let mut node = self;
        for part in dotted.split('.') {
            // `a[0]`-style paths name a list: the compiler reads the key before the bracket.
            let key = part.split('[').next().unwrap_or(part);
            node = node.0.entry(key.to_string()).or_default();
        }
    }

    /// The read paths under this node, dotted, for error messages.
    fn leaves(&self, prefix: &str, out: &mut Vec<String>) {
        if self.0.is_empty() {
            out.push(prefix.to_string());
        }
        for (k, t) in &self.0 {
            t.leaves(&join(prefix, k), out);
        }
    }
}

/// Checks the keys of `config` against the keys `catalog` and the compiler read (see the module
/// docs) and returns the top-level keys nothing reads, in document order: passed to the workers
/// unchecked. `compiler_keys` are the dotted keys the compiler itself reads.
///
/// A catalog that reads no config key (built in code) checks nothing and lists nothing.
///
/// # Errors
/// [`PlanError::NearKnownKey`] for a key within a small edit distance of a key the compiler
/// reads at the same place; [`PlanError::InvalidValue`] for a scalar or list where the compiler
/// reads a mapping.
pub(crate) fn check_experiment_keys(
    file: &str,
    config: &Value,
    catalog: &StageCatalog,
    compiler_keys: &[&str],
) -> Result<Vec<String>, PlanError> {
    let read = catalog.read_keys();
    if read.is_empty() {
        return Ok(Vec::new());
    }
    let mut tree = Tree::default();
    for k in read
        .iter()
        .map(String::as_str)
        .chain(compiler_keys.iter().copied())
    {
        tree.insert(k);
    }
    // A section named after a stage configures it (`sort: {...}`), even when the compiler reads
    // nothing in it.
    for s in &catalog.stages {
        if !s.id.contains(['.', '[']) {
            tree.0.entry(s.id.clone()).or_default();
        }
    }
    let Some(map) = config.as_mapping() else {
        return Ok(Vec::new());
    };
    let mut unchecked = Vec::new();
    walk(file, "", map, &tree, &mut unchecked)?;
    Ok(unchecked)
}

fn walk(
    file: &str,
    path: &str,
    map: &super::config::Mapping,
    tree: &Tree,
    unchecked: &mut Vec<String>,
) -> Result<(), PlanError> {
    for (key, value) in map {
        let kpath = join(path, key);
        if let Some(sub) = tree.0.get(key) {
            if sub.0.is_empty() {
                continue;
            }
            match value {
                Value::Mapping(m) => walk(file, &kpath, m, sub, unchecked)?,
                Value::Null => {}
                other => {
                    let mut reads = Vec::new();
                    sub.leaves(&kpath, &mut reads);
                    return Err(PlanError::InvalidValue {
                        file: file.to_string(),
                        path: kpath.clone(),
                        value: describe(other),
                        expected: format!(
                            "a mapping: the compiler reads {} (the {} here would leave {} at its default)",
                            reads
                                .iter()
                                .map(|r| format!("`{r}`"))
                                .collect::<Vec<_>>()
                                .join(", "),
                            other.kind(),
                            if reads.len() == 1 { "it" } else { "them" },
                        ),
                    });
                }
            }
            continue;
        }
        if let Some(near) = tree.0.keys().find(|k| is_near(key, k)) {
            return Err(PlanError::NearKnownKey {
                file: file.to_string(),
                path: kpath,
                value: describe(value),
                known: join(path, near),
            });
        }
        if path.is_empty() {
            unchecked.push(key.clone());
        }
    }
    Ok(())
}

/// Whether `key` (not read by the compiler) is so close to `known` (read by it) that it is
/// most likely a typo of it: the same but for case or `-`/`_`, or within 1 edit (keys of 4 to 7
/// characters) or 2 edits (8 or more) counting a swap of two neighbours as one edit.
pub(crate) fn is_near(key: &str, known: &str) -> bool {
    if key == known {
        return false;
    }
    let norm = |s: &str| -> Vec<char> {
        s.chars()
            .map(|c| {
                if c == '-' {
                    '_'
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect()
    };
    let (a, b) = (norm(key), norm(known));
    if a == b {
        return true;
    }
    let n = a.len().min(b.len());
    let limit = match n {
        0..=3 => 0,
        4..=7 => 1,
        _ => 2,
    };
    limit > 0 && a.len().abs_diff(b.len()) <= limit && osa_distance(&a, &b) <= limit
}

/// Optimal string alignment distance: insertions, deletions, substitutions and swaps of
/// neighbours each count 1.
fn osa_distance(a: &[char], b: &[char]) -> usize {
    let (n, m) = (a.len(), b.len());
    let mut d = vec![vec![0usize; m + 1]; n + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=n {
        for j in 1..=m {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[n][m]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nearness_is_small_edits_only() {
        assert!(is_near("pruningg", "pruning"));
        assert!(is_near("replacement_scorin", "replacement_scoring"));
        assert!(is_near("enable", "enabled"));
        assert!(is_near("Enabled", "enabled"));
        assert!(is_near("embedding-pruning", "embedding_pruning"));
        assert!(is_near("prunign", "pruning"));
        assert!(!is_near("pruning", "pruning"));
        assert!(!is_near("mip", "map"));
        assert!(!is_near("sort_sanity", "sort"));
        assert!(!is_near("data", "mip"));
        assert!(!is_near("enable_expert_parallel", "enabled"));
    }

    fn check(v: serde_json::Value) -> Result<Vec<String>, PlanError> {
        check_experiment_keys(
            "exp.yaml",
            &Value::from_json(&v),
            &StageCatalog::puzzle(),
            &["puzzle_dir", "stages", "execution.gpus_per_node"],
        )
    }

    #[test]
    fn typos_of_read_keys_are_refused_and_new_keys_listed() {
        let m = check(json!({"pruningg": {"x": 1}}))
            .unwrap_err()
            .to_string();
        assert!(m.contains("`pruningg`") && m.contains("`pruning`"), "{m}");
        let m = check(json!({"replacement_scoring": {"enable": false}}))
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("`replacement_scoring.enable`")
                && m.contains("`replacement_scoring.enabled`"),
            "{m}"
        );
        let m = check(json!({"pruning": {"automodel": 3}}))
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("`pruning.automodel` = 3: expected a mapping")
                && m.contains("`pruning.automodel.parallel`"),
            "{m}"
        );
        assert_eq!(
            check(json!({"pruning": {"eval_samples": 3}, "my_notes": "x", "data": {}})).unwrap(),
            ["my_notes", "data"]
        );
    }
}
