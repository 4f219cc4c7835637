//! The sweep tests' helpers: a throwaway crate whose source is "owned" code, and jobs whose
//! behaviour the tests control.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use puzzletron::{Job, JobResult, Run};
use puzzletron::{Orchestrator, store::FsStore};
use serde::{Deserialize, Serialize};

/// A fake crate on disk: `Cargo.lock`, `src/lib.rs`, `examples/job.rs`.
pub struct FakeCrate {
    pub dir: tempfile::TempDir,
}

impl FakeCrate {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let c = Self { dir };
        c.write(
            "Cargo.lock",
            "# lock v1\n[[package]]\nname = \"a\"\nversion = \"1.0.0\"\n",
        );
        c.write(
            "src/lib.rs",
            "pub fn model(x: f64) -> f64 {\n    x * 2.0\n}\n",
        );
        c.write("examples/job.rs", "fn train() {}\n");
        c
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn write(&self, rel: &str, text: &str) {
        let p = self.dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    pub fn lock(&self) -> PathBuf {
        self.dir.path().join("Cargo.lock")
    }

    /// An orchestrator over `store/` in this crate, keyed by its `Cargo.lock`.
    pub fn orchestrator(&self) -> Orchestrator<FsStore> {
        Orchestrator::builder()
            .store_root(self.dir.path().join("store"))
            .lock(self.lock())
            .build()
            .unwrap()
    }

    /// A job named `fake::train` whose owned code is this crate.
    pub fn job<P>(&self, f: fn(&P, &mut Run) -> JobResult) -> Job<P> {
        Job::new("fake::train", "fake", self.dir.path(), "examples/job.rs", f)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct P {
    pub lr: f64,
    pub hidden: i64,
}

pub static EXECUTIONS: AtomicUsize = AtomicUsize::new(0);

/// Logs `loss` = lr * step for 3 steps and `acc` = hidden for step 0.
pub fn train(p: &P, run: &mut Run) -> JobResult {
    EXECUTIONS.fetch_add(1, Ordering::SeqCst);
    for step in 0..3 {
        run.log("loss", step, p.lr * step as f64)?;
    }
    run.log("acc", 0, p.hidden as f64)?;
    Ok(())
}

/// Parameters of the multi-process jobs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkParams {
    pub id: u32,
    pub rows: i64,
    pub sleep_us: u64,
}

/// Logs `rows` rows of metric `m` (value = id * 1000 + step), sleeping between rows, and
/// appends its key to the file named by `PUZZLETRON_SIDE_FILE` (one line per execution).
pub fn work(p: &WorkParams, run: &mut Run) -> JobResult {
    for step in 0..p.rows {
        run.log("m", step, expected_value(p.id, step))?;
        if p.sleep_us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(p.sleep_us));
        }
    }
    if let Ok(side) = std::env::var("PUZZLETRON_SIDE_FILE") {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(side)?;
        f.write_all(format!("{}\n", run.key()).as_bytes())?;
    }
    Ok(())
}

pub fn expected_value(id: u32, step: i64) -> f64 {
    id as f64 * 1000.0 + step as f64
}

/// The job of `work`, owned code = this repository's own crate (stable across processes).
pub fn work_job() -> Job<WorkParams> {
    Job::new(
        "tests::work",
        "puzzletron",
        env!("CARGO_MANIFEST_DIR"),
        "tests/support/sweep.rs",
        work,
    )
}
