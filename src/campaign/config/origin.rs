//! Where each config value came from: a file position or a command-line override.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::path::KeyPath;

/// The source of one config value, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Origin {
    /// A position in a YAML file. `line` and `column` are 1-based (column in characters).
    File {
        /// The file, as given to the loader (joined with the config root for `defaults`).
        file: Arc<Path>,
        /// 1-based line.
        line: usize,
        /// 1-based column, in characters.
        column: usize,
    },
    /// A command-line override.
    Override {
        /// 0-based position in the override list.
        index: usize,
        /// The override as the user typed it.
        text: String,
    },
}

impl Origin {
    /// The file of a file origin.
    pub fn file(&self) -> Option<&Path> {
        match self {
            Origin::File { file, .. } => Some(file),
            Origin::Override { .. } => None,
        }
    }

    /// `(line, column)` of a file origin, 1-based.
    pub fn line_column(&self) -> Option<(usize, usize)> {
        match self {
            Origin::File { line, column, .. } => Some((*line, *column)),
            Origin::Override { .. } => None,
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { file, line, column } => {
                write!(f, "{}:{line}:{column}", file.display())
            }
            Origin::Override { index, text } => write!(f, "override #{} `{text}`", index + 1),
        }
    }
}

/// Origins of every node of a config tree, keyed by [`KeyPath`].
///
/// Kept beside the [`Value`](super::Value) tree rather than inside it so the tree stays a plain
/// data type. Merges and overrides keep it in step (a replaced subtree forgets its old origins).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Origins {
    map: BTreeMap<KeyPath, Origin>,
}

impl Origins {
    /// No origins.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the origin of the node at `path`.
    pub fn insert(&mut self, path: KeyPath, origin: Origin) {
        self.map.insert(path, origin);
    }

    /// The origin recorded for exactly `path`.
    pub fn get(&self, path: &KeyPath) -> Option<&Origin> {
        self.map.get(path)
    }

    /// The origin of `path` or of its nearest ancestor that has one.
    pub fn nearest(&self, path: &KeyPath) -> Option<&Origin> {
        let mut p = path.clone();
        loop {
            if let Some(o) = self.map.get(&p) {
                return Some(o);
            }
            p = p.parent()?;
        }
    }

    /// Forgets the origins of `path` and everything below it.
    pub fn remove_subtree(&mut self, path: &KeyPath) {
        let doomed: Vec<KeyPath> = self
            .map
            .range(path.clone()..)
            .take_while(|(k, _)| k.starts_with(path))
            .map(|(k, _)| k.clone())
            .collect();
        for k in doomed {
            self.map.remove(&k);
        }
    }

    /// Copies every origin of `other` with `prefix` prepended to its path (overwriting).
    pub fn extend_prefixed(&mut self, prefix: &KeyPath, other: &Origins) {
        for (k, o) in &other.map {
            self.map.insert(prefix.join(k), o.clone());
        }
    }

    /// The origins recorded at `from` and below, with paths relative to `from`.
    pub fn subtree(&self, from: &KeyPath) -> Vec<(KeyPath, Origin)> {
        self.map
            .range(from.clone()..)
            .take_while(|(k, _)| k.starts_with(from))
            .map(|(k, o)| (KeyPath(k.0[from.0.len()..].to_vec()), o.clone()))
            .collect()
    }

    /// Records `items` (paths relative to `to`, as returned by [`Origins::subtree`]) under `to`.
    pub fn insert_subtree(&mut self, to: &KeyPath, items: Vec<(KeyPath, Origin)>) {
        for (rel, o) in items {
            self.map.insert(to.join(&rel), o);
        }
    }

    /// The distinct files that contributed a value, in path order of first appearance.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = Vec::new();
        for o in self.map.values() {
            if let Some(f) = o.file()
                && !out.iter().any(|p| p == f)
            {
                out.push(f.to_path_buf());
            }
        }
        out
    }

    /// Number of recorded origins.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no origin is recorded.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}
