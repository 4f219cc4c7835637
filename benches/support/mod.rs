//! Shared by the benches that run sweep jobs (`hot_paths`, `executor_local`): the target folder,
//! the machine load, and a small user crate for the jobs.
//!
//! A job's record holds its owned code, and `job!` in this package would cover all of
//! puzzletron (a ~330 KB owned digest per record), which no user job does: users depend on
//! puzzletron as a registry crate (covered by their `Cargo.lock` witness) and their jobs' code is
//! small. So the benches name their jobs with [`Job::new`] against [`user_crate`], whose one
//! source file is the jobs' owned code.

use std::path::{Path, PathBuf};
use std::process::Command;

use puzzletron::{Job, JobResult, Run};

#[path = "process.rs"]
mod process;
pub use process::load;
#[path = "params10.rs"]
#[allow(
    dead_code,
    reason = "each bench compiles this module; only the many-run cases use it"
)]
pub mod params10;
#[path = "scratch.rs"]
mod scratch;
#[path = "slurm.rs"]
#[allow(
    dead_code,
    reason = "each bench compiles this module; only the Slurm benches follow jobs"
)]
pub mod slurm;
pub use scratch::{Scratch, settle};

/// The Snakemake the benches compare with, pinned (its current release when pinned).
pub const SNAKEMAKE: &str = "snakemake==9.27.1";
/// The joblib the benches compare with, pinned (its current release when pinned).
#[allow(
    dead_code,
    reason = "each bench compiles this module; only hot_paths runs joblib"
)]
pub const JOBLIB: &str = "joblib==1.6.0";
/// The submitit the Slurm bench compares with, pinned (its current release when pinned).
#[allow(
    dead_code,
    reason = "each bench compiles this module; only slurm_vs_submitit runs submitit"
)]
pub const SUBMITIT: &str = "submitit==1.5.4";

/// The target folder (`CARGO_TARGET_DIR`, else `target/` of this package): everything a bench
/// writes goes under it.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// Writes the small user crate `bench` in `dir/crate` and returns its folder.
pub fn user_crate(dir: &Path) -> PathBuf {
    let c = dir.join("crate");
    std::fs::create_dir_all(c.join("src")).unwrap();
    std::fs::write(
        c.join("Cargo.toml"),
        "[package]\nname = \"bench\"\nversion = \"0.1.0\"\nedition = \"2024\"\n",
    )
    .unwrap();
    std::fs::write(c.join("Cargo.lock"), "version = 4\n").unwrap();
    std::fs::write(
        c.join("src/lib.rs"),
        "pub fn trivial(i: u32) -> f64 {\n    f64::from(i)\n}\n",
    )
    .unwrap();
    c
}

/// The job `bench::<name>` of the user crate at `krate` (made by [`user_crate`]), running `f`.
pub fn user_job<P>(krate: &Path, name: &str, f: fn(&P, &mut Run) -> JobResult) -> Job<P> {
    Job::new(&format!("bench::{name}"), "bench", krate, "src/lib.rs", f)
}

/// The venv `target/bench-venv` with the pinned `peers` (pip specs `name==version`), installed or
/// updated on first use; `None` when they cannot be had or `PUZZLETRON_BENCH_NO_PEERS` is set.
pub fn peer_venv(peers: &[&str]) -> Option<PathBuf> {
    if std::env::var_os("PUZZLETRON_BENCH_NO_PEERS").is_some() {
        return None;
    }
    let venv = target_dir().join("bench-venv");
    let py = venv.join("bin/python");
    let have = |spec: &str| {
        let (name, version) = spec.split_once("==").unwrap_or((spec, ""));
        Command::new(venv.join("bin/pip"))
            .args(["show", name])
            .output()
            .is_ok_and(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .any(|l| l == format!("Version: {version}"))
            })
    };
    if !py.exists() || !peers.iter().all(|p| have(p)) {
        eprintln!("installing {peers:?} into {} (pip) ...", venv.display());
        let ok = (py.exists()
            || Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv)
                .status()
                .is_ok_and(|s| s.success()))
            && Command::new(venv.join("bin/pip"))
                .args(["install", "-q"])
                .args(peers)
                .status()
                .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("could not install the peers; skipping them");
            return None;
        }
    }
    Some(venv)
}
