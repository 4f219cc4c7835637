//! Witnesses: the environment a result was made in. They are recorded with every result, not part
//! of the job key; a result whose witnesses no longer match is re-run in place, with the reason.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use super::{Hash, IdentityError};

/// The Cargo.lock a result was built with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LockWitness {
    /// Where it was found (absolute).
    pub path: PathBuf,
    /// SHA-256 of its bytes.
    pub digest: Hash,
}

/// The compiler that built the running binary (captured at compile time by puzzletron's build
/// script, which runs with the same `rustc` as the user's crate).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Toolchain {
    /// `rustc -vV`'s first line, e.g. `rustc 1.95.0 (59807616e 2026-04-14)`.
    pub rustc: String,
    /// The target triple, e.g. `x86_64-unknown-linux-gnu`.
    pub target: String,
    /// The build profile of the job's crate (e.g. `opt-level=3, debug_assertions=off`), captured
    /// at compile time by `job!`; `None` for records made before it was captured or for
    /// `Job::new` jobs. Recorded only: a profile change alone does not re-run (the `cfg`s it
    /// switches, like `debug_assertions`, are in the key when the job's code tests them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

impl Toolchain {
    /// The toolchain this binary was compiled with.
    pub fn current() -> Self {
        Self {
            rustc: env!("PUZZLETRON_RUSTC_VERSION").to_string(),
            target: env!("PUZZLETRON_TARGET").to_string(),
            profile: None,
        }
    }
}

/// The git state of a source checkout named with `Orchestrator`'s `source(path)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SourceWitness {
    /// The checkout (as given).
    pub path: PathBuf,
    /// `git rev-parse HEAD`, or `None` when it is not a git checkout or git is missing.
    pub commit: Option<String>,
    /// Whether tracked files differ from `HEAD` (`git status --porcelain --untracked-files=no`).
    pub dirty: bool,
}

/// Everything recorded about the environment of a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Witnesses {
    /// The lock file, when one was found or given.
    pub cargo_lock: Option<LockWitness>,
    /// The compiler.
    pub toolchain: Toolchain,
    /// The source checkout, when one was named.
    pub source: Option<SourceWitness>,
}

impl Witnesses {
    /// Why a result recorded with `old` witnesses must re-run now, one reason per difference
    /// (empty when they match). Reasons read like `environment changed: Cargo.lock`.
    ///
    /// The lock file is compared by digest only (its path may differ between machines).
    pub fn differences(&self, old: &Witnesses) -> Vec<String> {
        let mut out = Vec::new();
        let lock = |w: &Option<LockWitness>| w.as_ref().map(|l| l.digest);
        if lock(&self.cargo_lock) != lock(&old.cargo_lock) {
            out.push("environment changed: Cargo.lock".to_string());
        }
        if self.toolchain.rustc != old.toolchain.rustc {
            out.push(format!(
                "environment changed: toolchain ({} -> {})",
                old.toolchain.rustc, self.toolchain.rustc
            ));
        }
        if self.toolchain.target != old.toolchain.target {
            out.push(format!(
                "environment changed: target ({} -> {})",
                old.toolchain.target, self.toolchain.target
            ));
        }
        match (&self.source, &old.source) {
            (Some(new), Some(old)) => {
                if new.commit != old.commit {
                    out.push(format!(
                        "source changed: commit {} -> {}",
                        short(&old.commit),
                        short(&new.commit)
                    ));
                } else if new.dirty != old.dirty {
                    out.push(format!(
                        "source changed: working tree {}",
                        if new.dirty { "now dirty" } else { "now clean" }
                    ));
                }
            }
            (Some(_), None) => out.push("source changed: now witnessed".to_string()),
            (None, Some(_)) => out.push("source changed: no longer witnessed".to_string()),
            (None, None) => {}
        }
        out
    }
}

fn short(c: &Option<String>) -> String {
    c.as_deref()
        .map(|c| c.chars().take(12).collect())
        .unwrap_or_else(|| "none".into())
}

/// Finds `Cargo.lock` in `start` or the nearest ancestor.
pub(crate) fn find_lock_file(start: &Path) -> Option<PathBuf> {
    start
        .ancestors()
        .map(|d| d.join("Cargo.lock"))
        .find(|p| p.is_file())
}

/// Digest of a lock file.
///
/// # Errors
/// [`IdentityError::Io`] when it cannot be read.
pub(crate) fn lock_witness(path: &Path) -> Result<LockWitness, IdentityError> {
    let bytes = std::fs::read(path).map_err(|e| IdentityError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    Ok(LockWitness {
        path: abs,
        digest: Hash::of(bytes),
    })
}

/// Reads the git state of `path` with the `git` CLI (argv, no shell). A folder that is not a git
/// checkout, or a machine without git, gives `commit: None`.
pub fn source_witness(path: &Path) -> SourceWitness {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(path)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "HEAD"]);
    let dirty = commit.is_some()
        && git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    SourceWitness {
        path: path.to_path_buf(),
        commit,
        dirty,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(lock: Option<Hash>) -> Witnesses {
        Witnesses {
            cargo_lock: lock.map(|digest| LockWitness {
                path: "/x/Cargo.lock".into(),
                digest,
            }),
            toolchain: Toolchain::current(),
            source: None,
        }
    }

    #[test]
    fn lock_change_is_named() {
        let a = w(Some(Hash::of("a")));
        let b = w(Some(Hash::of("b")));
        assert_eq!(b.differences(&a), ["environment changed: Cargo.lock"]);
        assert!(a.differences(&a).is_empty());
        // Same digest at another path is the same environment.
        let mut moved = a.clone();
        moved.cargo_lock.as_mut().unwrap().path = "/elsewhere/Cargo.lock".into();
        assert!(moved.differences(&a).is_empty());
    }

    #[test]
    fn toolchain_and_source_changes_are_named() {
        let a = w(None);
        let mut b = a.clone();
        b.toolchain.rustc = "rustc 9.9.9".into();
        assert_eq!(
            b.differences(&a),
            [format!(
                "environment changed: toolchain ({} -> rustc 9.9.9)",
                a.toolchain.rustc
            )]
        );
        let mut s1 = a.clone();
        s1.source = Some(SourceWitness {
            path: ".".into(),
            commit: Some("a".repeat(40)),
            dirty: false,
        });
        let mut s2 = s1.clone();
        s2.source.as_mut().unwrap().dirty = true;
        assert_eq!(
            s2.differences(&s1),
            ["source changed: working tree now dirty"]
        );
        s2.source.as_mut().unwrap().commit = Some("b".repeat(40));
        assert_eq!(
            s2.differences(&s1),
            ["source changed: commit aaaaaaaaaaaa -> bbbbbbbbbbbb"]
        );
    }

    #[test]
    fn toolchain_is_captured_at_build_time() {
        let t = Toolchain::current();
        assert!(t.rustc.starts_with("rustc "), "{t:?}");
        assert!(t.target.contains('-'), "{t:?}");
    }

    #[test]
    fn lock_file_found_upward_and_git_state_read() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("Cargo.lock"), "# lock\n").unwrap();
        let deep = d.path().join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        assert_eq!(find_lock_file(&deep).unwrap(), d.path().join("Cargo.lock"));
        let lw = lock_witness(&d.path().join("Cargo.lock")).unwrap();
        assert_eq!(lw.digest, Hash::of("# lock\n"));
        // Not a git checkout: no commit, not dirty.
        let s = source_witness(&deep);
        assert_eq!(s.commit, None);
        assert!(!s.dirty);
    }
}
