//! Compile-time, item-level code identity: what [`job!`](crate::job) bakes into the binary.
//!
//! When a crate that calls `job!(train)` is compiled, the `puzzletron-macros` proc macro reads
//! the crate's sources and those of its path and workspace dependencies, computes the
//! conservative reachability closure of `train` (functions, methods, consts, statics, types,
//! `macro_rules!`, trait impls, `include_str!`/`include_bytes!`/`include!` files, `env!` values)
//! and bakes one digest per item into the binary as a [`CompiledCode`]. The job's owned-code digest is made from it with
//! [`CompiledCode::owned`]; no source file is read when the program runs, so a binary copied to
//! a cluster node computes the same keys.
//!
//! The formula (recomputable by anyone; `frame(x) = u64_le(len(x)) ++ x`, `H` = SHA-256):
//!
//! ```text
//! owned = H( frame("puzzletron/owned-items/v2")
//!            ++ for each item, sorted by path: frame(path) ++ frame(digest: 32 bytes)
//!            ++ frame("cfg") ++ for each predicate, sorted: frame(pred) ++ frame([value as u8])
//!            ++ frame("builds") ++ for each dependency, sorted: frame(name) ++ frame(build id) )
//! ```
//!
//! where an item's digest is SHA-256 of its canonical token text (one token per line, doc
//! attributes dropped), an included file's digest is SHA-256 of its bytes (its path is relative
//! to its package, or to its package's `OUT_DIR` as `$OUT_DIR/gen.rs`), an `env NAME` item's
//! (the calling package's variable) or `env DEP: NAME` item's (a dependency's, as rustc's
//! dep-info of that dependency records it) is SHA-256 of `"set\n" ++ value` (places of the
//! build in the value written `$OUT_DIR`, `$CARGO_MANIFEST_DIR`, `$CARGO_TARGET_DIR`,
//! `$CARGO_WORKSPACE_DIR`) or of `"unset"`, a `manifest DEP` item's is SHA-256 of that
//! dependency's `Cargo.toml`, and an `inputs DEP` item's is SHA-256 of the sorted lines naming
//! every variable and non-source file of that dependency's dep-info (when the macro cannot
//! evaluate what it compiles in). Nothing in `owned` depends on where the crate is built or on
//! the compiled bytes (which differ between two incremental builds of the same sources), except
//! a `compiled DEP` item (SHA-256 of the dependency's artifact), the last resort where no
//! dep-info of its build exists. The job key is then
//! [`job_key`](super::job_key)`(name, params, owned)` as before.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Hash, Hasher, OwnedDigest};

/// Domain tag of the compiled owned-code digest (see the module docs for the formula).
pub const ITEMS_SCHEME: &str = "puzzletron/owned-items/v2";

/// One item of a job's closure, as baked in by `job!`.
///
/// `#[non_exhaustive]`: an item may gain fields; `job!` builds it through
/// [`__new`](Self::__new), which its expansion in the user's crate calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompiledItem {
    /// Its path, e.g. `ccdemo::helpers::smooth`, `ccdemo::model::<Linear as Model>`,
    /// `ccdemo::square!` (a `macro_rules!`), `file src/prompt.txt` or `file $OUT_DIR/gen.rs`
    /// (an included file), `env NAME` (a compiled-in environment variable), `env DEP: NAME` (a
    /// dependency's), `manifest DEP` (a dependency's `Cargo.toml`, standing for its
    /// `CARGO_PKG_*` values), `inputs DEP` (everything a dependency's build read besides its
    /// sources, when the macro cannot evaluate what it compiles in) or, where no dep-info of that
    /// build exists (not built by cargo), `compiled DEP` (its compiled artifact).
    pub path: &'static str,
    /// Its file, relative to its package or to its package's `OUT_DIR` (`$OUT_DIR/gen.rs`);
    /// `ccdep: src/lib.rs` for a dependency's. Never an absolute path of the build.
    pub file: &'static str,
    /// SHA-256 of its canonical tokens (bytes, for a file), 64 hex characters.
    pub digest: &'static str,
}

/// A job's code identity, computed at compile time by `job!` (see the module docs).
///
/// All fields are `'static` data baked into the binary; build one only through `job!`
/// (`#[non_exhaustive]`: it may gain fields; `job!`'s expansion calls
/// [`__new`](Self::__new)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompiledCode {
    /// The library name of the package that called `job!`.
    pub package: &'static str,
    /// The closure's items.
    pub items: &'static [CompiledItem],
    /// Every `cfg` predicate in the calling package's part of the closure, with its truth value
    /// in this build (`("feature = \"wide\"", true)`).
    pub cfgs: &'static [(&'static str, bool)],
    /// For each owned dependency whose part of the closure has `cfg` predicates: the build id
    /// cargo gave it (its file-name hash, which changes with its features, target, profile and
    /// its dependencies' versions; for a path package outside the workspace root, cargo hashes
    /// its absolute path too, and `job!` says so in a note).
    pub builds: &'static [(&'static str, &'static str)],
    /// Every source file the analysis read, absolute, with the SHA-256 of its bytes at compile
    /// time (for [`stale_files`](Self::stale_files)).
    pub files: &'static [(&'static str, &'static str)],
    /// The Cargo.lock found from the package's manifest folder upward: (absolute path, SHA-256).
    pub lock: Option<(&'static str, &'static str)>,
    /// `-C opt-level` of the build.
    pub opt_level: &'static str,
    /// `cfg!(debug_assertions)` in the calling crate.
    pub debug_assertions: bool,
    /// What the analysis could not see and included conservatively instead.
    pub notes: &'static [&'static str],
}

/// One item's digest in a record: its file and its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ItemDigest {
    /// Its file (relative to its package).
    pub file: String,
    /// Its digest.
    pub digest: Hash,
}

impl CompiledItem {
    /// What `job!` expands to: not for direct use (the fields may change with the macro).
    #[doc(hidden)]
    pub const fn __new(path: &'static str, file: &'static str, digest: &'static str) -> Self {
        Self { path, file, digest }
    }
}

impl CompiledCode {
    /// What `job!` expands to: not for direct use (the fields may change with the macro).
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub const fn __new(
        package: &'static str,
        items: &'static [CompiledItem],
        cfgs: &'static [(&'static str, bool)],
        builds: &'static [(&'static str, &'static str)],
        files: &'static [(&'static str, &'static str)],
        lock: Option<(&'static str, &'static str)>,
        opt_level: &'static str,
        debug_assertions: bool,
        notes: &'static [&'static str],
    ) -> Self {
        Self {
            package,
            items,
            cfgs,
            builds,
            files,
            lock,
            opt_level,
            debug_assertions,
            notes,
        }
    }

    /// The owned-code digest (formula in the module docs) with its per-item digests, `cfg`
    /// values and dependency build ids, as recorded beside each result.
    pub fn owned(&self) -> OwnedDigest {
        let items: BTreeMap<String, ItemDigest> = self
            .items
            .iter()
            .map(|i| {
                let digest = i.digest.parse().unwrap_or_else(|_| Hash::of(i.digest));
                (
                    i.path.to_string(),
                    ItemDigest {
                        file: i.file.to_string(),
                        digest,
                    },
                )
            })
            .collect();
        let cfg: BTreeMap<String, bool> =
            self.cfgs.iter().map(|(p, v)| (p.to_string(), *v)).collect();
        let builds: BTreeMap<String, String> = self
            .builds
            .iter()
            .map(|(n, b)| (n.to_string(), b.to_string()))
            .collect();
        let mut h = Hasher::new(ITEMS_SCHEME);
        for (path, i) in &items {
            h.field(path.as_bytes()).field(i.digest.as_bytes());
        }
        h.field(b"cfg");
        for (p, v) in &cfg {
            h.field(p.as_bytes()).field(&[*v as u8]);
        }
        h.field(b"builds");
        for (n, b) in &builds {
            h.field(n.as_bytes()).field(b.as_bytes());
        }
        OwnedDigest {
            digest: h.finish(),
            files: BTreeMap::new(),
            scheme: Some(ITEMS_SCHEME.to_string()),
            items,
            cfg,
            builds,
        }
    }

    /// The build profile, e.g. `opt-level=3, debug_assertions=off`.
    pub fn profile(&self) -> String {
        format!(
            "opt-level={}, debug_assertions={}",
            self.opt_level,
            if self.debug_assertions { "on" } else { "off" }
        )
    }

    /// Source files that exist where the program runs and differ from what this binary was
    /// compiled from (absolute paths): the binary is stale for them. Files absent here (a binary
    /// copied to another machine) are not reported. Reads every covered file: for
    /// [`trace`](crate::OrchestratorBuilder::trace) and diagnostics, not for keys.
    pub fn stale_files(&self) -> Vec<&'static str> {
        self.files
            .iter()
            .filter(|(path, digest)| match std::fs::read(path) {
                Ok(bytes) => Hash::of(bytes).to_hex() != *digest,
                Err(_) => false,
            })
            .map(|(p, _)| *p)
            .collect()
    }
}

/// Why the code of `old` differs from `new`, as reason texts: `code changed: <item> (<file>)`
/// naming changed, added or removed items; `build configuration changed: feature "wide"` for a
/// `cfg` whose value changed; `build configuration changed: <dep> build` for a dependency built
/// differently; `code changed: identity scheme changed (...)` when `old` is a record of the
/// file-based scheme (records written before item-level identity).
pub(crate) fn code_differences(new: &OwnedDigest, old: &OwnedDigest) -> Vec<String> {
    if new.scheme != old.scheme {
        return vec![format!(
            "code changed: identity scheme changed ({} -> {})",
            old.scheme
                .as_deref()
                .unwrap_or("puzzletron/owned-tree/v1 (files)"),
            new.scheme
                .as_deref()
                .unwrap_or("puzzletron/owned-tree/v1 (files)")
        )];
    }
    if new.scheme.is_none() {
        let changed = new.changed_files(&old.files);
        return if changed.is_empty() {
            vec!["code changed".to_string()]
        } else {
            vec![format!("code changed: {}", changed.join(", "))]
        };
    }
    let mut out = Vec::new();
    let mut cfgs: Vec<String> = Vec::new();
    for (p, v) in &new.cfg {
        if old.cfg.get(p) != Some(v) && old.cfg.contains_key(p) {
            cfgs.push(describe_cfg(p));
        }
    }
    for (n, b) in &new.builds {
        if old.builds.get(n).is_some_and(|o| o != b) {
            cfgs.push(format!(
                "{n} build (features, target, profile or dependency versions)"
            ));
        }
    }
    if !cfgs.is_empty() {
        out.push(format!("build configuration changed: {}", cfgs.join(", ")));
    }
    let mut items: Vec<String> = Vec::new();
    for (path, i) in &new.items {
        match old.items.get(path) {
            Some(o) if o.digest == i.digest => {}
            Some(_) => items.push(describe_item(path, &i.file)),
            None => items.push(format!("{} added", describe_item(path, &i.file))),
        }
    }
    for (path, i) in &old.items {
        if !new.items.contains_key(path) {
            items.push(format!("{} removed", describe_item(path, &i.file)));
        }
    }
    if !items.is_empty() {
        const MAX: usize = 8;
        let more = items.len().saturating_sub(MAX);
        items.truncate(MAX);
        let mut s = format!("code changed: {}", items.join(", "));
        if more > 0 {
            s.push_str(&format!(" and {more} more"));
        }
        out.push(s);
    }
    if out.is_empty() {
        // Same items and cfgs but another digest: a new cfg predicate or build entry.
        out.push("build configuration changed".to_string());
    }
    out
}

fn describe_item(path: &str, file: &str) -> String {
    if path.starts_with("file ") || path.starts_with("inputs ") {
        path.to_string()
    } else {
        format!("{path} ({file})")
    }
}

/// `feature = "wide"` reads `feature "wide"`; other predicates as written.
fn describe_cfg(pred: &str) -> String {
    let p = pred.trim();
    if let Some(rest) = p.strip_prefix("feature") {
        let rest = rest.trim_start();
        if let Some(v) = rest.strip_prefix('=') {
            return format!("feature {}", v.trim());
        }
    }
    p.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ITEMS: &[CompiledItem] = &[CompiledItem {
        path: "c::f",
        file: "src/lib.rs",
        digest: "0000000000000000000000000000000000000000000000000000000000000001",
    }];

    fn code(cfgs: &'static [(&'static str, bool)]) -> CompiledCode {
        CompiledCode {
            package: "c",
            items: ITEMS,
            cfgs,
            builds: &[],
            files: &[],
            lock: None,
            opt_level: "0",
            debug_assertions: true,
            notes: &[],
        }
    }

    #[test]
    fn cfg_value_is_in_the_digest_and_named() {
        let a = code(&[("feature = \"wide\"", false)]).owned();
        let b = code(&[("feature = \"wide\"", true)]).owned();
        assert_ne!(a.digest, b.digest);
        assert_eq!(
            code_differences(&b, &a),
            ["build configuration changed: feature \"wide\""]
        );
    }

    #[test]
    fn old_file_scheme_records_say_the_scheme_changed() {
        let new = code(&[]).owned();
        let old = OwnedDigest {
            digest: Hash::of("x"),
            files: BTreeMap::from([("src/lib.rs".to_string(), Hash::of("f"))]),
            ..OwnedDigest::default()
        };
        assert_eq!(
            code_differences(&new, &old),
            [
                "code changed: identity scheme changed (puzzletron/owned-tree/v1 (files) -> puzzletron/owned-items/v2)"
            ]
        );
    }
}
