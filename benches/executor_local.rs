//! Local executor overhead: 1000 trivial jobs, as raw `LocalExecutor` jobs and as isolated sweep
//! runs (each a worker process of this binary), against Snakemake's local executor running the
//! same 1000 trivial jobs in the same run. The sweep's job belongs to a small user crate (see
//! `support`), so its records are the size a user's are.
//!
//! ```text
//! cargo bench --bench executor_local            # N=1000; PUZZLETRON_BENCH_JOBS=200 for a quick look
//! ```
//!
//! Snakemake (pinned: `support::SNAKEMAKE`) is installed with pip into `target/bench-venv` on
//! first use (needs `python3 -m venv` and PyPI); set `PUZZLETRON_BENCH_NO_SNAKEMAKE=1` (or
//! `PUZZLETRON_BENCH_NO_PEERS=1`) to skip it. Both sides get the same
//! parallelism (the number of CPUs). The stores and attempt folders are under
//! `target/bench-scratch/executor_local` (removed at the end; on ext4 without a journal the
//! next bench waits until those deletions no longer slow file creation, see
//! `support/scratch.rs`); results are printed and written to
//! `target/bench-results/executor_local.json`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use puzzletron::Orchestrator;
use puzzletron::executor::{
    AttemptId, AttemptSpec, CommandSpec, Executor, ExecutorExt, JobState, LocalExecutor,
};
use puzzletron::{JobResult, Run};

mod support;
use support::{SNAKEMAKE, Scratch, load, peer_venv, settle, target_dir, user_crate, user_job};

#[derive(serde::Serialize, serde::Deserialize)]
struct Trivial {
    i: u32,
}

fn trivial(p: &Trivial, run: &mut Run) -> JobResult {
    run.log("i", 0, p.i as f64)?;
    Ok(())
}

/// Parallelism of both sides: `PUZZLETRON_BENCH_SLOTS`, default the number of CPUs.
fn cpus() -> usize {
    std::env::var("PUZZLETRON_BENCH_SLOTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
}

fn raw_local(dir: &Path, n: u32) -> f64 {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let e = LocalExecutor::builder(dir.join("raw"))
            .max_concurrent(cpus())
            .build()
            .unwrap();
        let t = Instant::now();
        let mut hs = Vec::with_capacity(n as usize);
        for i in 0..n {
            let spec = AttemptSpec::new(
                AttemptId::new(format!("t{i}")).unwrap(),
                CommandSpec::new("true"),
            );
            hs.push(e.submit(&spec).await.unwrap());
        }
        let st = e
            .wait_terminal(&hs, Duration::from_millis(5), Duration::from_secs(3600))
            .await
            .unwrap();
        assert!(st.iter().all(|s| s.state == JobState::Completed));
        t.elapsed().as_secs_f64()
    })
}

fn isolated_sweep(dir: &Path, n: u32) -> f64 {
    let exec = LocalExecutor::builder(dir.join("iso-attempts"))
        .max_concurrent(cpus())
        .build()
        .unwrap();
    let mut o = Orchestrator::builder()
        .store_root(dir.join("iso-store"))
        .executor(exec)
        .isolate(true)
        .wait_poll(Duration::from_millis(5))
        .build()
        .unwrap();
    let j = user_job(&user_crate(dir), "trivial", trivial);
    for i in 0..n {
        o.run(&j, Trivial { i }).unwrap();
    }
    let t = Instant::now();
    let s = o.drain().unwrap_or_else(|f| panic!("{f}"));
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(s.ran(), n as usize, "{}", s.report());
    secs
}

fn snakemake(dir: &Path, n: u32) -> Option<f64> {
    if std::env::var_os("PUZZLETRON_BENCH_NO_SNAKEMAKE").is_some() {
        return None;
    }
    let bin = peer_venv(&[SNAKEMAKE])?.join("bin/snakemake");
    let work = dir.join("snakemake");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(
        work.join("Snakefile"),
        format!(
            "rule all:\n    input: expand(\"out/{{i}}.txt\", i=range({n}))\n\n\
             rule trivial:\n    output: \"out/{{i}}.txt\"\n    shell: \"touch {{output}}\"\n"
        ),
    )
    .unwrap();
    let t = Instant::now();
    let out = Command::new(&bin)
        .args([
            "--cores",
            &cpus().to_string(),
            "--quiet",
            "all",
            "-s",
            "Snakefile",
        ])
        .current_dir(&work)
        .output()
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    if !out.status.success() {
        eprintln!("snakemake failed: {}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    let made = std::fs::read_dir(work.join("out"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(made, n as usize, "snakemake made {made} outputs");
    Some(secs)
}

fn main() {
    puzzletron::worker::main_guard();
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: run small then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let n: u32 = std::env::var("PUZZLETRON_BENCH_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 20 } else { 1000 });
    let scratch = Scratch::fresh("executor_local");
    let dir = scratch.dir.as_path();
    if !quick {
        settle(dir);
    }
    let load_before = load();
    let raw = raw_local(dir, n);
    let iso = isolated_sweep(dir, n);
    let snake = if quick { None } else { snakemake(dir, n) };
    let rate = |s: f64| n as f64 / s;
    println!(
        "local executor, {n} trivial jobs, {} slots, load {load_before}",
        cpus()
    );
    println!(
        "  LocalExecutor `true` jobs:   {raw:7.2} s  {:8.1} jobs/s",
        rate(raw)
    );
    println!(
        "  isolated sweep runs:         {iso:7.2} s  {:8.1} jobs/s",
        rate(iso)
    );
    if let Some(s) = snake {
        println!(
            "  snakemake local (--cores {}): {s:7.2} s  {:8.1} jobs/s",
            cpus(),
            rate(s)
        );
        println!(
            "  ratio isolated/snakemake: {:.1}x   raw/snakemake: {:.1}x",
            s / iso,
            s / raw
        );
    }
    let json = serde_json::json!({
        "jobs": n, "cpus": cpus(), "load_before": load_before,
        "raw_seconds": raw, "isolated_seconds": iso, "snakemake_seconds": snake,
    });
    let out = target_dir().join("bench-results");
    let _ = std::fs::create_dir_all(&out);
    let _ = std::fs::write(out.join("executor_local.json"), json.to_string());
    scratch.discard();
}
