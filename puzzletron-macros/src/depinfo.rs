//! What the build compiled each crate with, as reproducible values: for the calling package,
//! this process's environment (rustc compiles it with the macro's environment); for a
//! dependency, rustc's dep-info of that dependency (`<deps>/<crate>-<hash>.d`, next to the
//! `--extern` file), which records the value of every variable its code read through `env!` or
//! `option_env!` (`# env-dep:NAME=VALUE`, or `# env-dep:NAME` when unset: the lines cargo itself
//! reads to rebuild when one changes) and every file it read (sources, `include!`d and included
//! files, build-script output under its `OUT_DIR`).
//!
//! These are what a build reproduces. A dependency's compiled artifact is not: with incremental
//! compilation (cargo's default for dev builds) two builds of the same sources give different
//! bytes, so keying it made every rebuild rerun every run (issue 26).
//!
//! Location never counts: `OUT_DIR`, `CARGO_MANIFEST_DIR`, `CARGO_TARGET_DIR` and the other
//! paths cargo sets ([`is_location`]) are where a build is, not what it computes; a value that
//! contains one of them is keyed with a placeholder in its place ([`BuildEnv::normalize`]), and a
//! file under `OUT_DIR` is named relative to it (`$OUT_DIR/gen.rs`).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::manifest::Package;

/// Variables that say where a build is, not what it computes (see "Environment variables Cargo
/// sets for crates" in the Cargo book): their values are never keyed. What is read through them
/// (an `include!` of `concat!(env!("OUT_DIR"), "/gen.rs")`) is keyed by content.
pub fn is_location(name: &str) -> bool {
    const NAMES: &[&str] = &[
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "OUT_DIR",
        "CARGO_TARGET_DIR",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "CARGO",
    ];
    NAMES.contains(&name) || name.starts_with("CARGO_BIN_EXE_")
}

/// One dependency build's dep-info.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DepInfo {
    /// Each variable rustc read: its value, `None` when it was unset (`option_env!`).
    pub env: BTreeMap<String, Option<String>>,
    /// The files rustc read, absolute (relative ones are resolved from rustc's working folder).
    pub files: BTreeSet<PathBuf>,
}

impl DepInfo {
    /// Parses a dep-info file (Makefile rules whose file names escape spaces as `\ `, and
    /// `# env-dep:` comments whose values escape `\`, newline and carriage return as rustc's
    /// `escape_dep_env` does). Paths are resolved from `cwd`.
    pub fn parse(text: &str, cwd: &Path) -> Self {
        let mut info = DepInfo::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# env-dep:") {
                match rest.split_once('=') {
                    Some((name, value)) => {
                        info.env.insert(name.to_string(), Some(unescape_env(value)));
                    }
                    None => {
                        info.env.insert(rest.to_string(), None);
                    }
                }
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            // `target: dep dep ...`; a target's own name may hold an escaped space too.
            let Some(colon) = unescaped_colon(line) else {
                continue;
            };
            for f in split_escaped(&line[colon + 1..]) {
                info.files.insert(cwd.join(f));
            }
        }
        info
    }
}

/// The byte offset of the first `: ` (or a final `:`) that ends a rule's target.
fn unescaped_colon(line: &str) -> Option<usize> {
    let b = line.as_bytes();
    (0..b.len()).find(|&i| {
        b[i] == b':' && (i + 1 == b.len() || b[i + 1] == b' ') && (i == 0 || b[i - 1] != b'\\')
    })
}

/// Space-separated file names, `\ ` being a space inside a name.
fn split_escaped(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&' ') => {
                cur.push(' ');
                chars.next();
            }
            ' ' => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Undoes rustc's `escape_dep_env` (`\n`, `\r`, `\\`).
fn unescape_env(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// What a crate's build says about one variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Compiled in with this value (`None`: read while unset).
    Value(Option<String>),
    /// The dependency's dep-info is known and rustc did not read the variable: nothing of it is
    /// compiled into that crate (e.g. the code reading it is `cfg`'d out).
    NotRead,
    /// Nothing can be said: no dep-info was found, or the candidate builds disagree.
    Unknown,
}

/// The environment each owned crate was compiled with (see the module docs).
#[derive(Debug, Default)]
pub struct BuildEnv {
    /// This rustc's arguments (`--extern`, `-L dependency=`).
    args: Vec<String>,
    /// This rustc's working folder, which dep-info paths are relative to.
    cwd: PathBuf,
    /// Other places a value may name, replaced by their placeholder: the workspace root and,
    /// when set, `CARGO_TARGET_DIR`.
    roots: Vec<(&'static str, PathBuf)>,
    /// The dep-info of each dependency's candidate builds, by library name.
    deps: RefCell<HashMap<String, Rc<Vec<DepInfo>>>>,
}

impl BuildEnv {
    /// The build of this rustc process: `args` are its arguments, `workspace` the folder of the
    /// workspace root manifest (or of the calling package).
    pub fn for_rustc(args: &[String], workspace: Option<&Path>) -> Self {
        let mut roots = Vec::new();
        if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
            roots.push(("$CARGO_TARGET_DIR", PathBuf::from(t)));
        }
        if let Some(w) = workspace {
            roots.push(("$CARGO_WORKSPACE_DIR", w.to_path_buf()));
        }
        BuildEnv {
            args: args.to_vec(),
            cwd: std::env::current_dir().unwrap_or_default(),
            roots,
            deps: RefCell::default(),
        }
    }

    /// This rustc's arguments.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// The value `name` had when `pkg` was compiled.
    pub fn var(&self, pkg: &Package, name: &str) -> Lookup {
        if pkg.user {
            return Lookup::Value(std::env::var(name).ok());
        }
        let builds = self.dep_infos(&pkg.lib_name);
        let mut seen: Option<Lookup> = None;
        for b in builds.iter() {
            let l = match b.env.get(name) {
                Some(v) => Lookup::Value(v.clone()),
                None => Lookup::NotRead,
            };
            match &seen {
                None => seen = Some(l),
                Some(s) if *s == l => {}
                Some(_) => return Lookup::Unknown,
            }
        }
        seen.unwrap_or(Lookup::Unknown)
    }

    /// `pkg`'s `OUT_DIR`, when its build has one that its code reads.
    pub fn out_dir(&self, pkg: &Package) -> Option<PathBuf> {
        match self.var(pkg, "OUT_DIR") {
            Lookup::Value(Some(d)) => Some(PathBuf::from(d)),
            _ => None,
        }
    }

    /// The dep-info of every candidate build of dependency `lib` (empty when none is found).
    pub fn dep_infos(&self, lib: &str) -> Rc<Vec<DepInfo>> {
        if let Some(d) = self.deps.borrow().get(lib) {
            return d.clone();
        }
        let infos: Vec<DepInfo> = find_dep_info(&self.args, lib)
            .iter()
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .map(|t| DepInfo::parse(&t, &self.cwd))
            .collect();
        let infos = Rc::new(infos);
        self.deps
            .borrow_mut()
            .insert(lib.to_string(), infos.clone());
        infos
    }

    /// `value` with every place of the build in it replaced by its placeholder (`$OUT_DIR`,
    /// `$CARGO_MANIFEST_DIR`, `$CARGO_TARGET_DIR`, `$CARGO_WORKSPACE_DIR`), so that a value such
    /// as a generated file's absolute path is the same wherever the crate is built.
    pub fn normalize(&self, pkg: &Package, out_dir: Option<&Path>, value: &str) -> String {
        let mut roots: Vec<(&str, &Path)> = Vec::new();
        if let Some(o) = out_dir {
            roots.push(("$OUT_DIR", o));
        }
        roots.push(("$CARGO_MANIFEST_DIR", &pkg.dir));
        roots.extend(self.roots.iter().map(|(n, p)| (*n, p.as_path())));
        // The longest first: OUT_DIR is inside the target folder, often inside the package.
        roots.sort_by_key(|(_, p)| std::cmp::Reverse(p.as_os_str().len()));
        let mut out = value.to_string();
        for (name, root) in roots {
            if let Some(r) = root.to_str().filter(|r| r.len() > 1) {
                out = replace_path(&out, r.trim_end_matches('/'), name);
            }
        }
        out
    }
}

/// `text` with each occurrence of the path `root` that stands alone as a path (not a part of a
/// longer name: `/a/b` is not in `/a/bc` nor in `/x/a/b`) replaced by `name`.
fn replace_path(text: &str, root: &str, name: &str) -> String {
    let path_char = |c: char| c.is_alphanumeric() || "_-.~/".contains(c);
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(root) {
        let before = rest[..i].chars().next_back();
        let after = rest[i + root.len()..].chars().next();
        let alone =
            before.is_none_or(|c| !path_char(c)) && after.is_none_or(|c| c == '/' || !path_char(c));
        out.push_str(&rest[..i]);
        out.push_str(if alone { name } else { root });
        rest = &rest[i + root.len()..];
    }
    out.push_str(rest);
    out
}

/// The dep-info files of dependency `lib`'s builds: the one next to the file `--extern lib=`
/// names (a direct dependency: exactly its build); else, for a dependency of a dependency,
/// every `<lib>-<hash>.d` of the `-L dependency=` folders that has a library beside it (the
/// build rustc will load is among them; a stale build of other features may be too).
pub fn find_dep_info(args: &[String], lib: &str) -> Vec<PathBuf> {
    let prefix = format!("{lib}=");
    let mut dirs = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, v) = if a == "--extern" || a == "-L" {
            match it.next() {
                Some(v) => (a.as_str(), v.as_str()),
                None => break,
            }
        } else if let Some(v) = a.strip_prefix("--extern=") {
            ("--extern", v)
        } else if let Some(v) = a.strip_prefix("-L") {
            ("-L", v)
        } else {
            continue;
        };
        if flag == "--extern" {
            if let Some(p) = v.strip_prefix(&prefix) {
                let p = Path::new(p);
                let stem = p.file_stem().map(|s| s.to_string_lossy().into_owned());
                let d = stem
                    .as_deref()
                    .and_then(|s| s.strip_prefix("lib"))
                    .map(|s| p.with_file_name(format!("{s}.d")));
                return d.filter(|d| d.is_file()).into_iter().collect();
            }
        } else if let Some(d) = v.strip_prefix("dependency=") {
            dirs.push(PathBuf::from(d));
        }
    }
    let mut found = BTreeSet::new();
    let head = format!("{lib}-");
    for d in dirs {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(hash) = name
                .strip_prefix(&head)
                .and_then(|r| r.strip_suffix(".d"))
                .filter(|h| !h.contains('-'))
            else {
                continue;
            };
            let lib_file = |ext: &str| d.join(format!("lib{lib}-{hash}.{ext}")).is_file();
            if lib_file("rlib") || lib_file("rmeta") {
                found.insert(e.path());
            }
        }
    }
    found.into_iter().collect()
}

/// SHA-256 of the compiled artifact of dependency `lib`: the file `--extern lib=PATH` names,
/// else every `lib<lib>-*` file of rustc's `-L dependency=` folders (names and digests). Only a
/// last resort where no dep-info is found (a build not run by cargo): the artifact differs
/// between two incremental builds of the same sources, so it reruns more than needed, never less.
pub fn artifact_digest(args: &[String], lib: &str) -> Option<String> {
    use crate::index::sha256_hex;
    let prefix = format!("{lib}=");
    let mut dirs = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, v) = if a == "--extern" || a == "-L" {
            (a.as_str(), it.next()?.as_str())
        } else if let Some(v) = a.strip_prefix("--extern=") {
            ("--extern", v)
        } else if let Some(v) = a.strip_prefix("-L") {
            ("-L", v)
        } else {
            continue;
        };
        if flag == "--extern" {
            if let Some(p) = v.strip_prefix(&prefix) {
                return std::fs::read(p).ok().map(|b| sha256_hex(&b));
            }
        } else if let Some(d) = v.strip_prefix("dependency=") {
            dirs.push(PathBuf::from(d));
        }
    }
    let head = format!("lib{lib}-");
    let mut all: BTreeMap<String, String> = BTreeMap::new();
    for d in dirs {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with(&head)
                && let Ok(b) = std::fs::read(e.path())
            {
                all.insert(n, sha256_hex(&b));
            }
        }
    }
    (!all.is_empty()).then(|| {
        let joined: Vec<String> = all.into_iter().map(|(n, d)| format!("{n} {d}")).collect();
        sha256_hex(joined.join("\n").as_bytes())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dep_info_gives_values_and_files() {
        let text = "/t/deps/libx-1.rmeta: src/lib.rs /t/build/x-2/out/gen.rs a\\ b.txt\n\n\
                    src/lib.rs:\n/t/build/x-2/out/gen.rs:\n\n\
                    # env-dep:MODE=fast\\nline\\\\end\n# env-dep:FLAG\n# env-dep:OUT_DIR=/t/build/x-2/out\n\
                    # checksum:whatever\n";
        let d = DepInfo::parse(text, Path::new("/ws"));
        assert_eq!(d.env["MODE"].as_deref(), Some("fast\nline\\end"));
        assert_eq!(d.env["FLAG"], None);
        assert_eq!(d.env["OUT_DIR"].as_deref(), Some("/t/build/x-2/out"));
        let files: Vec<&Path> = d.files.iter().map(PathBuf::as_path).collect();
        assert_eq!(
            files,
            [
                Path::new("/t/build/x-2/out/gen.rs"),
                Path::new("/ws/a b.txt"),
                Path::new("/ws/src/lib.rs"),
            ]
        );
    }

    #[test]
    fn places_are_replaced_only_where_they_stand_alone() {
        assert_eq!(replace_path("/a/b/x", "/a/b", "$R"), "$R/x");
        assert_eq!(replace_path("/a/b", "/a/b", "$R"), "$R");
        assert_eq!(
            replace_path("/a/b:/a/b/c x=/a/b", "/a/b", "$R"),
            "$R:$R/c x=$R"
        );
        assert_eq!(replace_path("/a/bc /x/a/b", "/a/b", "$R"), "/a/bc /x/a/b");
    }

    fn write(p: &Path, text: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn a_dependencys_build_is_found_from_rustcs_arguments() {
        let d = std::env::temp_dir().join(format!("ptm-depinfo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let deps = d.join("deps");
        write(&deps.join("libdirect-aa.rmeta"), "");
        write(&deps.join("direct-aa.d"), "# env-dep:V=1\n");
        // A dependency of a dependency: two builds (features), and a binary's dep-info.
        for (h, v) in [("bb", "2"), ("cc", "2")] {
            write(&deps.join(format!("libinner-{h}.rlib")), "");
            write(
                &deps.join(format!("inner-{h}.d")),
                &format!("# env-dep:V={v}\n"),
            );
        }
        write(&deps.join("inner-dd.d"), "# env-dep:V=3\n");
        let args: Vec<String> = [
            "rustc",
            "--extern",
            &format!("direct={}", deps.join("libdirect-aa.rmeta").display()),
            "-L",
            &format!("dependency={}", deps.display()),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(find_dep_info(&args, "direct"), [deps.join("direct-aa.d")]);
        assert_eq!(
            find_dep_info(&args, "inner"),
            [deps.join("inner-bb.d"), deps.join("inner-cc.d")]
        );
        let env = BuildEnv::for_rustc(&args, None);
        let pkg = |name: &str| Package {
            lib_name: name.into(),
            dir: d.clone(),
            roots: Vec::new(),
            bins: Vec::new(),
            user: false,
            manifest: d.join("Cargo.toml"),
            dep_dirs: Vec::new(),
            proc_macro: false,
        };
        assert_eq!(
            env.var(&pkg("direct"), "V"),
            Lookup::Value(Some("1".into()))
        );
        assert_eq!(env.var(&pkg("direct"), "W"), Lookup::NotRead);
        // The two builds agree.
        assert_eq!(env.var(&pkg("inner"), "V"), Lookup::Value(Some("2".into())));
        write(&deps.join("inner-cc.d"), "# env-dep:V=4\n");
        let env = BuildEnv::for_rustc(&args, None);
        assert_eq!(env.var(&pkg("inner"), "V"), Lookup::Unknown);
        assert_eq!(env.var(&pkg("absent"), "V"), Lookup::Unknown);
        let _ = std::fs::remove_dir_all(&d);
    }
}
