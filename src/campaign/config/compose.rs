//! Hydra-style composition of a `defaults` list.
//!
//! Supported, as the Puzzletron configs use it:
//! - `- /abs/path@pkg`: a config file under the config root (`.yaml` appended);
//! - `- rel/path@pkg`: a config file relative to the including file's folder;
//! - `- group: option` (also `/group: option`, `optional group: option`, `group: null` to skip,
//!   `group: [a, b]` for several), loading `group/option.yaml`;
//! - `- _self_`: where the including file's own content is merged (at the end when absent).
//!
//! Packages: `@_global_` (or a `# @package _global_` header) is the root; `@_global_.a.b` is
//! `a.b`; any other `@p` is relative to the including config's package; without either, a
//! `# @package p` header places the file at `p`, and otherwise at its config group (its folder
//! relative to the root, dotted), as Hydra's `_group_` default does.
//!
//! Merge order is Hydra's: the defaults tree is flattened depth-first and merged in that order,
//! so a later file overrides an earlier one (deep merge, see [`merge`](super::merge)).
//! Every file must stay inside the config root (symlinks included); cycles are refused with the
//! include chain.

use std::path::{Component, Path, PathBuf};

use super::error::ConfigError;
use super::merge::merge_at;
use super::origin::Origins;
use super::path::{KeyPath, PathSegment};
use super::value::{Mapping, Value};
use super::yaml::load_yaml_str;

/// Reads and parses one YAML file.
pub(crate) fn read_yaml(path: &Path) -> Result<super::yaml::YamlDocument, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    load_yaml_str(&text, path)
}

/// The nearest folder at or above `file`'s folder that holds `base.yaml`, else `file`'s folder.
pub(crate) fn find_config_root(file: &Path) -> PathBuf {
    let start = file.parent().unwrap_or(Path::new("."));
    let mut dir = Some(start);
    while let Some(d) = dir {
        if d.join("base.yaml").is_file() {
            return d.to_path_buf();
        }
        dir = d.parent();
    }
    start.to_path_buf()
}

/// Composition state: the accumulated tree and the include stack.
pub(crate) struct Composer {
    root: PathBuf,
    stack: Vec<PathBuf>,
    pub(crate) value: Value,
    pub(crate) origins: Origins,
    pub(crate) files: Vec<PathBuf>,
    /// Files loaded so far, repeats included (see [`MAX_LOADS`]).
    loads: usize,
}

/// Upper bound on file loads for one composition: a diamond-shaped `defaults` tree may load a
/// file several times, and a hostile one exponentially many (real ones load about ten).
const MAX_LOADS: usize = 1000;

enum Entry {
    SelfContent,
    Include {
        file: PathBuf,
        written: String,
        package: Option<String>,
        optional: bool,
        line: usize,
    },
}

impl Composer {
    /// `root` must be canonical.
    pub(crate) fn new(root: PathBuf) -> Self {
        Composer {
            root,
            stack: Vec::new(),
            value: Value::Mapping(Mapping::new()),
            origins: Origins::new(),
            files: Vec::new(),
            loads: 0,
        }
    }

    /// Composes the primary config `file` (canonical, inside the root) at the root package.
    pub(crate) fn compose_primary(&mut self, file: &Path) -> Result<(), ConfigError> {
        self.compose(file, None)
    }

    /// Composes `file` (canonical, inside the root). `placement` is `None` for the primary
    /// config (always the root package), else the including config's package and the entry's
    /// `@package`, if any.
    fn compose(
        &mut self,
        file: &Path,
        placement: Option<(&KeyPath, Option<&str>)>,
    ) -> Result<(), ConfigError> {
        if let Some(i) = self.stack.iter().position(|f| f == file) {
            let mut chain = self.stack[i..].to_vec();
            chain.push(file.to_path_buf());
            return Err(ConfigError::DefaultsCycle { chain });
        }
        self.loads += 1;
        if self.loads > MAX_LOADS {
            return Err(ConfigError::BadDefaults {
                file: file.to_path_buf(),
                line: 0,
                message: format!(
                    "the defaults tree loads more than {MAX_LOADS} files (the same files included over and over?)"
                ),
            });
        }
        let doc = read_yaml(file)?;
        if !self.files.iter().any(|f| f == file) {
            self.files.push(file.to_path_buf());
        }
        let mut content = match doc.value {
            Value::Mapping(m) => m,
            other => {
                let (line, column) = doc
                    .origins
                    .get(&KeyPath::root())
                    .and_then(|o| o.line_column())
                    .unwrap_or((1, 1));
                return Err(ConfigError::Yaml {
                    file: file.to_path_buf(),
                    line,
                    column,
                    message: format!(
                        "a config file must be a mapping at the top level, found a {}",
                        other.kind()
                    ),
                });
            }
        };
        let package = match placement {
            None => KeyPath::root(),
            Some((parent, at)) => self.package_of(parent, at, doc.package.clone(), file),
        };
        let package = &package;
        let defaults = content.shift_remove("defaults");
        let mut origins = doc.origins;
        let entries = match defaults {
            None => vec![Entry::SelfContent],
            Some(d) => self.entries(file, d, &origins)?,
        };
        origins.remove_subtree(&KeyPath::root().child_key("defaults"));
        let mut content = Some(Value::Mapping(content));
        self.stack.push(file.to_path_buf());
        for entry in entries {
            match entry {
                Entry::SelfContent => {
                    if let Some(c) = content.take() {
                        merge_at(&mut self.value, &mut self.origins, package, c, &origins);
                    }
                }
                Entry::Include {
                    file: target,
                    written,
                    package: pkg,
                    optional,
                    line,
                } => {
                    let Some(target) = self.confine(file, line, &written, &target, optional)?
                    else {
                        continue;
                    };
                    self.compose(&target, Some((package, pkg.as_deref())))?;
                }
            }
        }
        self.stack.pop();
        Ok(())
    }

    /// Checks that `target` exists and is inside the root; returns its canonical path, or
    /// `None` for a missing optional entry.
    fn confine(
        &self,
        including: &Path,
        line: usize,
        written: &str,
        target: &Path,
        optional: bool,
    ) -> Result<Option<PathBuf>, ConfigError> {
        let escape = |resolved: PathBuf| ConfigError::PathEscape {
            file: including.to_path_buf(),
            line,
            entry: written.to_string(),
            resolved,
            root: self.root.clone(),
        };
        // Lexical check first, so `../../etc/passwd` is refused even if it does not exist.
        let normal = normalize(target);
        if !normal.starts_with(&self.root) {
            return Err(escape(normal));
        }
        match normal.canonicalize() {
            Ok(c) if c.starts_with(&self.root) => Ok(Some(c)),
            // A symlink inside the root that points outside it.
            Ok(c) => Err(escape(c)),
            Err(_) if optional => Ok(None),
            Err(_) => Err(ConfigError::DefaultsNotFound {
                file: including.to_path_buf(),
                line,
                entry: written.to_string(),
                resolved: normal,
            }),
        }
    }

    fn package_of(
        &self,
        parent: &KeyPath,
        at: Option<&str>,
        header: Option<String>,
        target: &Path,
    ) -> KeyPath {
        let dotted = |s: &str| -> KeyPath {
            KeyPath(
                s.split('.')
                    .filter(|p| !p.is_empty())
                    .map(|p| PathSegment::Key(p.to_string()))
                    .collect(),
            )
        };
        let group = || -> KeyPath {
            let rel = target
                .parent()
                .and_then(|p| p.strip_prefix(&self.root).ok())
                .unwrap_or(Path::new(""));
            KeyPath(
                rel.components()
                    .filter_map(|c| match c {
                        Component::Normal(s) => {
                            Some(PathSegment::Key(s.to_string_lossy().into_owned()))
                        }
                        _ => None,
                    })
                    .collect(),
            )
        };
        let absolute = |p: &str| -> Option<KeyPath> {
            if p == "_global_" {
                Some(KeyPath::root())
            } else {
                p.strip_prefix("_global_.").map(dotted)
            }
        };
        match (at, header) {
            (Some(p), _) => match absolute(p) {
                Some(k) => k,
                None if p == "_group_" => group(),
                None if p == "_here_" => parent.clone(),
                None => parent.join(&dotted(p)),
            },
            (None, Some(h)) => match absolute(&h) {
                Some(k) => k,
                None if h == "_group_" => group(),
                None => dotted(&h),
            },
            (None, None) => group(),
        }
    }

    fn entries(
        &self,
        file: &Path,
        defaults: Value,
        origins: &Origins,
    ) -> Result<Vec<Entry>, ConfigError> {
        let list_path = KeyPath::root().child_key("defaults");
        let line_of = |p: &KeyPath| {
            origins
                .nearest(p)
                .and_then(|o| o.line_column())
                .map_or(0, |(l, _)| l)
        };
        let bad = |line: usize, message: String| ConfigError::BadDefaults {
            file: file.to_path_buf(),
            line,
            message,
        };
        let items = match defaults {
            Value::List(items) => items,
            Value::Null => Vec::new(),
            other => {
                return Err(bad(
                    line_of(&list_path),
                    format!("`defaults` must be a list, found a {}", other.kind()),
                ));
            }
        };
        let mut out = Vec::new();
        let mut has_self = false;
        for (i, item) in items.into_iter().enumerate() {
            let line = line_of(&list_path.child_index(i));
            match item {
                Value::String(s) if s == "_self_" => {
                    if has_self {
                        return Err(bad(line, "`_self_` appears twice".into()));
                    }
                    has_self = true;
                    out.push(Entry::SelfContent);
                }
                Value::String(s) => {
                    let (path, pkg) = split_package(&s);
                    out.push(self.include(file, &s, path, pkg, false, line)?);
                }
                Value::Mapping(m) if m.len() == 1 => {
                    let (k, v) = m.into_iter().next().expect("one entry");
                    let (optional, group) = match k.split_once(' ') {
                        Some(("optional", g)) => (true, g.trim()),
                        Some(("override", _)) => {
                            return Err(bad(
                                line,
                                format!(
                                    "`{k}`: `override` entries re-select an option of a config group chosen elsewhere; this loader composes files directly and does not support them"
                                ),
                            ));
                        }
                        Some(_) => {
                            return Err(bad(line, format!("unexpected keyword in `{k}`")));
                        }
                        None => (false, k.as_str()),
                    };
                    let (group, pkg) = split_package(group);
                    let options = match v {
                        Value::Null => Vec::new(),
                        Value::String(o) => vec![o],
                        Value::List(l) => l
                            .into_iter()
                            .map(|o| match o {
                                Value::String(s) => Ok(s),
                                other => Err(bad(
                                    line,
                                    format!(
                                        "options of group `{group}` must be strings, found a {}",
                                        other.kind()
                                    ),
                                )),
                            })
                            .collect::<Result<_, _>>()?,
                        other => {
                            return Err(bad(
                                line,
                                format!(
                                    "option of group `{group}` must be a string, a list or null, found a {}",
                                    other.kind()
                                ),
                            ));
                        }
                    };
                    for o in options {
                        let written = format!("{k}: {o}");
                        let path = format!("{group}/{o}");
                        out.push(self.include(file, &written, &path, pkg, optional, line)?);
                    }
                }
                other => {
                    return Err(bad(
                        line,
                        format!(
                            "entries must be `path[@package]`, `_self_` or `group: option`, found {} `{other}`",
                            other.kind()
                        ),
                    ));
                }
            }
        }
        if !has_self {
            out.push(Entry::SelfContent);
        }
        Ok(out)
    }

    fn include(
        &self,
        including: &Path,
        written: &str,
        path: &str,
        pkg: Option<&str>,
        optional: bool,
        line: usize,
    ) -> Result<Entry, ConfigError> {
        if path.is_empty() || path == "/" {
            return Err(ConfigError::BadDefaults {
                file: including.to_path_buf(),
                line,
                message: format!("`{written}`: empty config path"),
            });
        }
        let mut rel = path.to_string();
        if !(rel.ends_with(".yaml") || rel.ends_with(".yml")) {
            rel.push_str(".yaml");
        }
        let dir = including.parent().unwrap_or(Path::new("/"));
        let file = match rel.strip_prefix('/') {
            Some(abs) => self.root.join(abs),
            None => dir.join(&rel),
        };
        Ok(Entry::Include {
            file,
            written: written.to_string(),
            package: pkg.map(str::to_string),
            optional,
            line,
        })
    }
}

fn split_package(s: &str) -> (&str, Option<&str>) {
    match s.split_once('@') {
        Some((p, pkg)) => (p.trim(), Some(pkg.trim())),
        None => (s.trim(), None),
    }
}

/// Lexical normalization: resolves `.` and `..` without touching the file system.
pub(crate) fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}
