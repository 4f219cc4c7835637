//! The owned-code digest: which source a result depends on, hashed token-wise.
//!
//! Default scope: every `.rs` file under the job's crate's `src/`, plus the file the job is defined
//! in (which may be an example or a binary target outside `src/`). [`Modules`] narrows `src/` to
//! module prefixes and exclusions. Files are reduced to their token stream
//! ([`tokens`](super::tokens)), so comments, doc comments and formatting never change the digest.
//!
//! Per-file digests are cached process-wide by (path, size, mtime), so a sweep that enqueues 100k
//! runs reads and hashes each file once.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::{Hash, Hasher, IdentityError, tokens};

/// Which modules of the job's crate count as its owned code.
///
/// Module paths are written as in Rust, relative to the crate root (`model`, `data::loader`;
/// a leading `crate::` is ignored). A file belongs to module `a::b` when it is `src/a/b.rs`,
/// `src/a/b/mod.rs` or any file below `src/a/b/`; `src/lib.rs` and `src/main.rs` are the root
/// module, written `crate`.
///
/// ```
/// use puzzletron::identity::Modules;
/// // Only the model and data modules count, but not the plotting helpers inside `model`.
/// let m = Modules::only(["model", "data"]).exclude("model::plot");
/// assert!(m.contains("model::mlp"));
/// assert!(!m.contains("model::plot::svg"));
/// assert!(!m.contains("cli"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Modules {
    include: Vec<String>,
    exclude: Vec<String>,
    files: Vec<PathBuf>,
}

impl Modules {
    /// The whole `src/` tree of the crate (the default).
    pub fn all() -> Self {
        Self::default()
    }

    /// Only these module prefixes.
    pub fn only<I: IntoIterator<Item = S>, S: Into<String>>(prefixes: I) -> Self {
        Self {
            include: prefixes.into_iter().map(|s| normalize(&s.into())).collect(),
            exclude: Vec::new(),
            files: Vec::new(),
        }
    }

    /// Also own this file, relative to the crate root (e.g. a helper module of an example,
    /// `examples/common/model.rs`, which `src/` and the job's file do not cover).
    pub fn with_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.files.push(path.into());
        self
    }

    /// Also leave out this module prefix.
    pub fn exclude(mut self, prefix: impl Into<String>) -> Self {
        self.exclude.push(normalize(&prefix.into()));
        self
    }

    /// Whether the module at `module_path` (e.g. `model::mlp`) is owned.
    pub fn contains(&self, module_path: &str) -> bool {
        let m = normalize(module_path);
        let included = self.include.is_empty() || self.include.iter().any(|p| has_prefix(&m, p));
        included && !self.exclude.iter().any(|p| has_prefix(&m, p))
    }
}

fn normalize(p: &str) -> String {
    let p = p.trim().trim_start_matches("::");
    if p == "crate" {
        return String::new();
    }
    p.strip_prefix("crate::").unwrap_or(p).to_string()
}

fn has_prefix(module: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || module == prefix
        || (module.starts_with(prefix) && module[prefix.len()..].starts_with("::"))
}

/// Module path of a file below `src/`: `a/b.rs` and `a/b/mod.rs` -> `a::b`, `lib.rs` -> root.
fn module_of(rel_to_src: &Path) -> String {
    let mut parts: Vec<String> = rel_to_src
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.strip_suffix(".rs").unwrap_or(&last).to_string();
        let root = parts.is_empty() && (stem == "lib" || stem == "main");
        if stem != "mod" && !root {
            parts.push(stem);
        }
    }
    parts.join("::")
}

/// What to hash: the crate root, the job's file and the module selection.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OwnedCode {
    /// The crate root (the folder holding `Cargo.toml`).
    pub crate_dir: PathBuf,
    /// The file the job is defined in (absolute, or relative to `crate_dir` or an ancestor).
    pub job_file: PathBuf,
    /// Which modules of `src/` count.
    pub modules: Modules,
}

impl OwnedCode {
    /// The code of crate `crate_dir` owned by a job defined in `job_file`, counting `modules`.
    pub fn new(
        crate_dir: impl Into<PathBuf>,
        job_file: impl Into<PathBuf>,
        modules: Modules,
    ) -> Self {
        Self {
            crate_dir: crate_dir.into(),
            job_file: job_file.into(),
            modules,
        }
    }
}

/// The owned-code digest and the per-file digests it was made from (paths relative to the
/// crate root, `/`-separated), so a changed result can name the files that changed.
///
/// Jobs made with [`job!`](crate::job) fill the item-level fields instead of `files` (see
/// [`CompiledCode`](super::CompiledCode)); records written before item-level identity have only
/// `digest` and `files`, and still read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct OwnedDigest {
    /// The owned-code digest: over the sorted (path, file digest) pairs (file scheme), or as in
    /// [`CompiledCode::owned`](super::CompiledCode::owned) (item scheme).
    pub digest: Hash,
    /// Token-stream digest of each file (file scheme; empty in the item scheme).
    pub files: BTreeMap<String, Hash>,
    /// `None` for the file scheme; [`ITEMS_SCHEME`](super::ITEMS_SCHEME) for compiled identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Item scheme: each closure item's file and digest, by item path.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub items: BTreeMap<String, super::ItemDigest>,
    /// Item scheme: the truth value of every `cfg` predicate of the closure in this build.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cfg: BTreeMap<String, bool>,
    /// Item scheme: build ids of dependencies whose `cfg`s count.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub builds: BTreeMap<String, String>,
}

impl Default for OwnedDigest {
    fn default() -> Self {
        Self {
            digest: Hash::from_bytes([0; 32]),
            files: BTreeMap::new(),
            scheme: None,
            items: BTreeMap::new(),
            cfg: BTreeMap::new(),
            builds: BTreeMap::new(),
        }
    }
}

impl OwnedDigest {
    /// Files whose digest differs, appeared or disappeared between `old` and `self`, sorted.
    pub fn changed_files(&self, old: &BTreeMap<String, Hash>) -> Vec<String> {
        let mut out: Vec<String> = self
            .files
            .iter()
            .filter(|(p, h)| old.get(*p) != Some(h))
            .map(|(p, _)| p.clone())
            .collect();
        out.extend(old.keys().filter(|p| !self.files.contains_key(*p)).cloned());
        out.sort();
        out.dedup();
        out
    }
}

type FileCache = Mutex<HashMap<PathBuf, (u64, SystemTime, Hash)>>;

fn cache() -> &'static FileCache {
    static CACHE: OnceLock<FileCache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Token-stream digest of one file, from the process-wide (path, size, mtime) cache when fresh.
///
/// # Errors
/// [`IdentityError::Io`] when the file cannot be read.
pub(super) fn file_digest(path: &Path) -> Result<Hash, IdentityError> {
    let io = |e| IdentityError::Io {
        path: path.to_path_buf(),
        source: e,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    let mtime = meta.modified().map_err(io)?;
    let size = meta.len();
    if let Ok(c) = cache().lock()
        && let Some((s, m, h)) = c.get(path)
        && *s == size
        && *m == mtime
    {
        return Ok(*h);
    }
    let bytes = std::fs::read(path).map_err(io)?;
    let h = token_digest(&bytes);
    // "Racy git": a file modified within the filesystem's timestamp granularity of our read
    // could change again with the same (size, mtime); only cache files that have settled.
    let settled = SystemTime::now()
        .duration_since(mtime)
        .is_ok_and(|age| age.as_secs() >= 2);
    if settled && let Ok(mut c) = cache().lock() {
        c.insert(path.to_path_buf(), (size, mtime, h));
    }
    Ok(h)
}

/// Token-stream digest of Rust source bytes (comments and formatting excluded).
pub(super) fn token_digest(src: &[u8]) -> Hash {
    let mut buf = Vec::with_capacity(src.len());
    tokens::normalize_into(src, &mut buf);
    let mut h = Hasher::new("puzzletron/owned-file/v1");
    h.field(&buf);
    h.finish()
}

/// Resolves the job file: absolute as is; otherwise against the crate dir, then its ancestors
/// (`file!()` is relative to the workspace root, which may be above the crate).
fn resolve_job_file(code: &OwnedCode) -> Result<PathBuf, IdentityError> {
    if code.job_file.is_absolute() {
        return Ok(code.job_file.clone());
    }
    for dir in code.crate_dir.ancestors() {
        let p = dir.join(&code.job_file);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(IdentityError::JobFileNotFound {
        file: code.job_file.clone(),
        crate_dir: code.crate_dir.clone(),
    })
}

fn rel_string(root: &Path, p: &Path) -> String {
    let rel = p.strip_prefix(root).unwrap_or(p);
    rel.iter()
        .map(|c| c.to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// Computes the owned-code digest of `code`.
///
/// # Errors
/// [`IdentityError::JobFileNotFound`] when the job's file cannot be found,
/// [`IdentityError::Io`] when a source file or folder cannot be read.
pub fn owned_digest(code: &OwnedCode) -> Result<OwnedDigest, IdentityError> {
    digest_tree(code, true)
}

/// [`owned_digest`] without the per-file cache: reads and hashes every file (for benchmarks and
/// for verifying a cached digest).
///
/// # Errors
/// As [`owned_digest`].
pub fn owned_digest_uncached(code: &OwnedCode) -> Result<OwnedDigest, IdentityError> {
    digest_tree(code, false)
}

fn digest_tree(code: &OwnedCode, cached: bool) -> Result<OwnedDigest, IdentityError> {
    let file_digest = |p: &Path| -> Result<Hash, IdentityError> {
        if cached {
            file_digest(p)
        } else {
            let bytes = std::fs::read(p).map_err(|e| IdentityError::Io {
                path: p.to_path_buf(),
                source: e,
            })?;
            Ok(token_digest(&bytes))
        }
    };
    let root = &code.crate_dir;
    let src = root.join("src");
    let mut files = BTreeMap::new();
    if src.is_dir() {
        for entry in walkdir::WalkDir::new(&src).sort_by_file_name() {
            let entry = entry.map_err(|e| IdentityError::Io {
                path: e
                    .path()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| src.clone()),
                source: e.into(),
            })?;
            let p = entry.path();
            if !entry.file_type().is_file() || p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let module = module_of(p.strip_prefix(&src).unwrap_or(p));
            if code.modules.contains(&module) {
                files.insert(rel_string(root, p), file_digest(p)?);
            }
        }
    }
    for extra in &code.modules.files {
        let p = root.join(extra);
        if !p.is_file() {
            return Err(IdentityError::JobFileNotFound {
                file: extra.clone(),
                crate_dir: root.clone(),
            });
        }
        files.insert(rel_string(root, &p), file_digest(&p)?);
    }
    let job_file = resolve_job_file(code)?;
    files.insert(rel_string(root, &job_file), file_digest(&job_file)?);
    let mut h = Hasher::new("puzzletron/owned-tree/v1");
    for (path, digest) in &files {
        h.field(path.as_bytes()).field(digest.as_bytes());
    }
    Ok(OwnedDigest {
        digest: h.finish(),
        files,
        ..OwnedDigest::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(p: &Path, s: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, s).unwrap();
    }

    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        write(
            &d.path().join("src/lib.rs"),
            "pub mod model;\npub fn root() {}\n",
        );
        write(
            &d.path().join("src/model/mod.rs"),
            "pub mod plot;\npub fn fit() -> u32 { 1 }\n",
        );
        write(&d.path().join("src/model/plot.rs"), "pub fn draw() {}\n");
        write(&d.path().join("src/cli.rs"), "pub fn cli() {}\n");
        write(&d.path().join("examples/train.rs"), "fn main() {}\n");
        d
    }

    fn code(d: &Path, modules: Modules) -> OwnedCode {
        OwnedCode {
            crate_dir: d.to_path_buf(),
            job_file: "examples/train.rs".into(),
            modules,
        }
    }

    #[test]
    fn module_paths() {
        assert_eq!(module_of(Path::new("lib.rs")), "");
        assert_eq!(module_of(Path::new("main.rs")), "");
        assert_eq!(module_of(Path::new("a.rs")), "a");
        assert_eq!(module_of(Path::new("a/mod.rs")), "a");
        assert_eq!(module_of(Path::new("a/b.rs")), "a::b");
        assert!(Modules::only(["crate::model"]).contains("model::x"));
        assert!(!Modules::only(["model"]).contains("modeling"));
        assert!(Modules::only(["crate"]).contains(""));
    }

    #[test]
    fn default_scope_is_src_plus_job_file() {
        let d = tree();
        let dg = owned_digest(&code(d.path(), Modules::all())).unwrap();
        let names: Vec<_> = dg.files.keys().cloned().collect();
        assert_eq!(
            names,
            [
                "examples/train.rs",
                "src/cli.rs",
                "src/lib.rs",
                "src/model/mod.rs",
                "src/model/plot.rs"
            ]
        );
    }

    #[test]
    fn modules_narrow_the_scope() {
        let d = tree();
        let dg = owned_digest(&code(
            d.path(),
            Modules::only(["model"]).exclude("model::plot"),
        ))
        .unwrap();
        let names: Vec<_> = dg.files.keys().cloned().collect();
        assert_eq!(names, ["examples/train.rs", "src/model/mod.rs"]);
        write(
            &d.path().join("examples/common/data.rs"),
            "pub fn load() {}\n",
        );
        let m = Modules::only(["model"])
            .exclude("model::plot")
            .with_file("examples/common/data.rs");
        let with = owned_digest(&code(d.path(), m)).unwrap();
        assert!(with.files.contains_key("examples/common/data.rs"));
        assert_ne!(with.digest, dg.digest);
        // A change outside the owned modules does not change the digest.
        write(
            &d.path().join("src/cli.rs"),
            "pub fn cli() { println!(\"x\") }\n",
        );
        let again = owned_digest(&code(
            d.path(),
            Modules::only(["model"]).exclude("model::plot"),
        ))
        .unwrap();
        assert_eq!(again.digest, dg.digest);
    }

    #[test]
    fn comment_edit_keeps_code_edit_changes() {
        let d = tree();
        let c = code(d.path(), Modules::all());
        let before = owned_digest(&c).unwrap();
        write(
            &d.path().join("src/model/mod.rs"),
            "pub mod plot;\n/// Fits.\npub fn fit()->u32{\n  1 // one\n}\n",
        );
        let comment = owned_digest(&c).unwrap();
        assert_eq!(comment.digest, before.digest);
        write(
            &d.path().join("src/model/mod.rs"),
            "pub mod plot;\npub fn fit() -> u32 { 2 }\n",
        );
        let code_edit = owned_digest(&c).unwrap();
        assert_ne!(code_edit.digest, before.digest);
        assert_eq!(code_edit.changed_files(&before.files), ["src/model/mod.rs"]);
    }

    #[test]
    fn job_file_resolved_from_an_ancestor_and_missing_is_an_error() {
        let d = tree();
        // Workspace layout: file!() is relative to the workspace root above the crate.
        let ws = d.path();
        let member = ws.join("member");
        write(&member.join("src/lib.rs"), "pub fn m() {}\n");
        let c = OwnedCode {
            crate_dir: member.clone(),
            job_file: "examples/train.rs".into(),
            modules: Modules::all(),
        };
        let dg = owned_digest(&c).unwrap();
        assert!(dg.files.contains_key("src/lib.rs"));
        let c = OwnedCode {
            crate_dir: member,
            job_file: "nope.rs".into(),
            modules: Modules::all(),
        };
        let e = owned_digest(&c).unwrap_err();
        assert!(e.to_string().contains("nope.rs"), "{e}");
    }
}
