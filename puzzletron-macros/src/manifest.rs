//! Which crates are owned: the user's package and, transitively, its path and workspace
//! dependencies (registry crates are covered by the Cargo.lock witness), except puzzletron's
//! own crates (see [`is_puzzletron`]).

use std::path::{Path, PathBuf};

/// One owned package.
#[derive(Debug, Clone)]
pub struct Package {
    /// Its library name (`-` replaced by `_`), the first segment of its items' paths.
    pub lib_name: String,
    /// The folder of its `Cargo.toml`.
    pub dir: PathBuf,
    /// Its library root (`src/lib.rs` or `[lib] path`), when it has one.
    pub roots: Vec<PathBuf>,
    /// The user's package only: its binary roots (`src/main.rs`, `src/bin/*.rs`), each its own
    /// crate that can name the library's items (the library cannot name theirs).
    pub bins: Vec<PathBuf>,
    /// The calling package (or one of its binary crates): paths shown without a prefix.
    pub user: bool,
    /// Its `Cargo.toml`.
    pub manifest: PathBuf,
    /// Folders of its direct owned dependencies.
    pub dep_dirs: Vec<PathBuf>,
    /// A proc-macro crate: its code runs in the compiler, for the host, not in the job.
    pub proc_macro: bool,
}

/// puzzletron's own packages. As a dependency (a path dependency before its first release, as
/// the README suggests, or a workspace member in its own repository) they are never owned: a
/// job's results do not depend on how puzzletron records them, its version is in Cargo.lock
/// whatever the dependency kind, and its compiler is every record's toolchain witness. Owned,
/// `Run::log` alone reached 2,218 of its items (a ~490 KB record per run), and its build id
/// changed with any Cargo.lock change of its dependencies (`cargo update -p itoa` re-ran
/// everything as a "build configuration" change). The calling package itself is always owned
/// (puzzletron's own tests call `job!`).
pub fn is_puzzletron(package_name: &str) -> bool {
    matches!(package_name, "puzzletron" | "puzzletron-macros")
}

fn read_table(path: &Path) -> Option<toml::Table> {
    std::fs::read_to_string(path)
        .ok()?
        .parse::<toml::Table>()
        .ok()
}

/// The workspace root manifest above `dir` (the nearest ancestor whose `Cargo.toml` has a
/// `[workspace]` table), if any.
pub fn workspace_manifest(dir: &Path) -> Option<(PathBuf, toml::Table)> {
    dir.ancestors().find_map(|d| {
        let m = d.join("Cargo.toml");
        let t = read_table(&m)?;
        t.contains_key("workspace").then_some((m, t))
    })
}

fn package_name(t: &toml::Table, dir: &Path) -> String {
    t.get("package")
        .and_then(|p| p.get("name"))
        .and_then(|n| n.as_str())
        .map(str::to_string)
        .unwrap_or_else(|| {
            dir.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
}

/// The user's package at `dir` and its owned dependencies, the user's first. `notes` gets a line
/// for each manifest that cannot be read (then that crate is not analysed: said once).
pub fn packages(dir: &Path, notes: &mut Vec<String>) -> Vec<Package> {
    let mut out: Vec<Package> = Vec::new();
    let ws = workspace_manifest(dir);
    let mut stack = vec![(dir.to_path_buf(), true)];
    while let Some((d, user)) = stack.pop() {
        let mut dep_dirs = Vec::new();
        let d = canon(&d);
        if out.iter().any(|p| p.dir == d) {
            continue;
        }
        let manifest = d.join("Cargo.toml");
        let Some(t) = read_table(&manifest) else {
            notes.push(format!(
                "cannot read {}: its crate is not analysed (covered by Cargo.lock only)",
                manifest.display()
            ));
            continue;
        };
        if !user && is_puzzletron(&package_name(&t, &d)) {
            continue;
        }
        let lib_name = t
            .get("lib")
            .and_then(|l| l.get("name"))
            .and_then(|n| n.as_str())
            .map(str::to_string)
            .unwrap_or_else(|| package_name(&t, &d))
            .replace('-', "_");
        let mut roots = Vec::new();
        let lib = t
            .get("lib")
            .and_then(|l| l.get("path"))
            .and_then(|p| p.as_str())
            .map(|p| d.join(p))
            .unwrap_or_else(|| d.join("src/lib.rs"));
        if lib.is_file() {
            roots.push(lib);
        }
        let mut bins = Vec::new();
        if user {
            if d.join("src/main.rs").is_file() {
                bins.push(d.join("src/main.rs"));
            }
            if let Ok(rd) = std::fs::read_dir(d.join("src/bin")) {
                let mut found: Vec<PathBuf> = rd
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "rs"))
                    .collect();
                found.sort();
                bins.extend(found);
            }
        }
        for table in ["dependencies", "dev-dependencies"] {
            let mut deps: Vec<&toml::Table> = Vec::new();
            if let Some(x) = t.get(table).and_then(|x| x.as_table()) {
                deps.push(x);
            }
            if let Some(targets) = t.get("target").and_then(|x| x.as_table()) {
                for cfg in targets.values() {
                    if let Some(x) = cfg.get(table).and_then(|x| x.as_table()) {
                        deps.push(x);
                    }
                }
            }
            for deps in deps {
                for (name, spec) in deps {
                    if let Some(p) = spec.get("path").and_then(|p| p.as_str()) {
                        dep_dirs.push(canon(&d.join(p)));
                        stack.push((d.join(p), false));
                    } else if spec.get("workspace").and_then(|w| w.as_bool()) == Some(true)
                        && let Some((wm, wt)) = &ws
                        && let Some(p) = wt
                            .get("workspace")
                            .and_then(|w| w.get("dependencies"))
                            .and_then(|w| w.get(name))
                            .and_then(|s| s.get("path"))
                            .and_then(|p| p.as_str())
                        && let Some(root) = wm.parent()
                    {
                        dep_dirs.push(canon(&root.join(p)));
                        stack.push((root.join(p), false));
                    }
                }
            }
        }
        out.push(Package {
            lib_name,
            dir: d,
            roots,
            bins,
            user,
            manifest,
            dep_dirs,
            proc_macro: t
                .get("lib")
                .and_then(|l| l.get("proc-macro"))
                .and_then(|v| v.as_bool())
                .unwrap_or(false),
        });
    }
    out
}

fn canon(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The path packages in the dependency graph of `packages[pkg]` (itself included, and
/// puzzletron's, which are not owned) whose folder is not under `root`, the workspace root:
/// cargo hashes a path package under the workspace root by its path relative to the root, any
/// other by its absolute path, into the build id of every crate that depends on it.
pub fn outside_root(packages: &[Package], pkg: usize, root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut seen: Vec<PathBuf> = Vec::new();
    let mut stack = vec![packages[pkg].dir.clone()];
    while let Some(d) = stack.pop() {
        if seen.contains(&d) {
            continue;
        }
        seen.push(d.clone());
        if !d.starts_with(root) {
            out.push(d.clone());
        }
        if let Some(p) = packages.iter().find(|p| p.dir == d) {
            stack.extend(p.dep_dirs.iter().cloned());
        }
    }
    out.sort();
    out
}

/// For each package, the packages it can name: itself and its transitive owned dependencies.
pub fn visibility(packages: &[Package]) -> Vec<Vec<bool>> {
    let n = packages.len();
    let direct: Vec<Vec<usize>> = packages
        .iter()
        .map(|p| {
            p.dep_dirs
                .iter()
                .filter_map(|d| packages.iter().position(|q| &q.dir == d))
                .collect()
        })
        .collect();
    (0..n)
        .map(|i| {
            let mut seen = vec![false; n];
            let mut stack = vec![i];
            while let Some(j) = stack.pop() {
                if !std::mem::replace(&mut seen[j], true) {
                    stack.extend(direct[j].iter().copied());
                }
            }
            seen
        })
        .collect()
}
