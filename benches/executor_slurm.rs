//! Slurm client cost: time and scheduler calls to submit and follow 200 trivial jobs on the
//! local cluster (`shared/slurm/start-local-cluster.sh`), as one job array, as 200 single
//! jobs, and mixed (4 arrays of 40 tasks and 40 single jobs): scheduler calls per poll cycle.
//!
//! ```text
//! cargo bench --bench executor_slurm       # PUZZLETRON_BENCH_JOBS=N to change 200
//! ```
//!
//! Prints a skip message when no cluster answers. Results also go to
//! `target/bench-results/executor_slurm.json`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

#[allow(
    dead_code,
    unused_imports,
    reason = "the shared bench support; this bench uses its Slurm wait"
)]
mod support;

use puzzletron::executor::{
    ArraySpec, AttemptId, AttemptSpec, CommandSpec, Executor, PollPolicy, SlurmExecutor, SlurmStats,
};

fn executor(dir: &std::path::Path) -> SlurmExecutor {
    SlurmExecutor::builder(dir)
        .poll_policy(
            PollPolicy::default()
                .with_intervals(Duration::from_millis(500), Duration::from_secs(5))
                .with_missing_grace(Duration::from_secs(300)),
        )
        .build()
        .unwrap()
}

/// How the jobs are submitted.
#[derive(Clone, Copy)]
enum Mode {
    /// One array of `n` tasks.
    Array,
    /// `n` single jobs.
    Single,
    /// Four arrays of `n/5` tasks and `n - 4*(n/5)` single jobs, all live together (the
    /// polling budget of issue "evidence": scheduler calls per cycle with arrays among jobs).
    Mixed,
}

async fn run(mode: Mode, n: u32, tag: &str) -> (f64, f64, SlurmStats) {
    let dir = tempfile::Builder::new()
        .prefix("pt-bench-")
        .tempdir()
        .unwrap();
    let e = executor(dir.path());
    let t = Instant::now();
    let array = matches!(mode, Mode::Array);
    let hs = if let Mode::Mixed = mode {
        let mut hs = Vec::new();
        for a in 0..4 {
            hs.extend(
                e.submit_array(&ArraySpec::new(
                    AttemptSpec::new(
                        AttemptId::new(format!("{tag}.arr{a}")).unwrap(),
                        CommandSpec::new("true"),
                    ),
                    n / 5,
                ))
                .await
                .unwrap(),
            );
        }
        for i in 0..n - 4 * (n / 5) {
            let spec = AttemptSpec::new(
                AttemptId::new(format!("{tag}.j{i}")).unwrap(),
                CommandSpec::new("true"),
            );
            hs.push(e.submit(&spec).await.unwrap());
        }
        hs
    } else if array {
        e.submit_array(&ArraySpec::new(
            AttemptSpec::new(
                AttemptId::new(format!("{tag}.arr")).unwrap(),
                CommandSpec::new("true"),
            ),
            n,
        ))
        .await
        .unwrap()
    } else {
        let mut hs = Vec::new();
        for i in 0..n {
            let spec = AttemptSpec::new(
                AttemptId::new(format!("{tag}.j{i}")).unwrap(),
                CommandSpec::new("true"),
            );
            hs.push(e.submit(&spec).await.unwrap());
        }
        hs
    };
    let submitted = t.elapsed().as_secs_f64();
    assert_eq!(hs.len(), n as usize);
    let total = support::slurm::wait_all_completed(&e, &hs, Duration::from_millis(50), t).await;
    (submitted, total, e.stats())
}

fn main() {
    let ok = std::process::Command::new("sinfo")
        .args(["-h", "-o", "%N"])
        .output()
        .is_ok_and(|o| o.status.success() && !o.stdout.is_empty());
    if !ok {
        println!("SKIP executor_slurm: no Slurm cluster answers `sinfo`");
        return;
    }
    let quick = !std::env::args().any(|a| a == "--bench");
    let n: u32 = std::env::var("PUZZLETRON_BENCH_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 10 } else { 200 });
    let tag = format!(
        "bench{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            % 1_000_000
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut json = serde_json::Map::new();
    for (mode, label) in [
        (Mode::Array, "array"),
        (Mode::Single, "single"),
        (Mode::Mixed, "mixed"),
    ] {
        let (sub, total, s) = rt.block_on(run(mode, n, &format!("{tag}{label}")));
        let per = |c: u64| c as f64 / s.poll_cycles.max(1) as f64;
        println!(
            "slurm, {n} trivial jobs as {label:6}: submitted in {sub:6.2} s, all COMPLETED after \
             {total:6.2} s; calls: {} sbatch, {} squeue, {} sacct ({} poll cycles: {:.2} squeue \
             and {:.2} sacct per cycle; {} retries)",
            s.sbatch_calls,
            s.squeue_calls,
            s.sacct_calls,
            s.poll_cycles,
            per(s.squeue_calls),
            per(s.sacct_calls),
            s.retries
        );
        json.insert(
            label.into(),
            serde_json::json!({
                "jobs": n, "submit_seconds": sub, "total_seconds": total,
                "sbatch": s.sbatch_calls, "squeue": s.squeue_calls, "sacct": s.sacct_calls,
                "poll_cycles": s.poll_cycles,
            }),
        );
    }
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-results");
    let _ = std::fs::create_dir_all(&out);
    let _ = std::fs::write(
        out.join("executor_slurm.json"),
        serde_json::Value::Object(json).to_string(),
    );
}
