//! Hot paths of a sweep on `FsStore`, each side by side with its peer in the same run
//! (issue 13): cache hits against `joblib.Memory` hits, a first pass of trivial misses against
//! joblib's, the plan of a finished 10k-run sweep against `snakemake -n` on the same finished
//! workflow, and the peak RSS of enqueue + plan of 100k runs. Beside the cache hits and the
//! first pass, the floor of each (`floor`, also `benches/store_floor.rs`): the bare syscalls of
//! the store's protocol, so the figures say how far above it the store is.
//!
//! ```text
//! cargo bench --bench hot_paths        # N=10k, medians of 3; PUZZLETRON_BENCH_RUNS=2000 for a quick look
//! ```
//!
//! Every figure comes from a fresh process (this binary re-run with `--case`), so each peak RSS
//! (`getrusage`) is that case's alone; times are taken inside the process around the measured
//! work (no process start-up on either side). The peers (joblib, snakemake; pinned in `support`) are
//! pip-installed into `target/bench-venv` on first use; `PUZZLETRON_BENCH_NO_PEERS=1` skips them.
//! The finished Snakemake workflow is a fixture built once, in chunks of real `snakemake` runs,
//! under `target/bench-fixtures/`. Everything is written under the target folder; results go
//! to `target/bench-results/hot_paths.json`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use puzzletron::Orchestrator;
use puzzletron::{JobResult, Run};

mod floor;
mod support;
use support::params10::{Params10, p10};
use support::{
    JOBLIB, SNAKEMAKE, Scratch, load, peer_venv, settle, target_dir, user_crate, user_job,
};

/// The peers, pinned (their current releases when pinned).
const PEERS: &[&str] = &[SNAKEMAKE, JOBLIB];
/// Targets per `snakemake` run while building the finished-workflow fixture.
const SNAKE_CHUNK: usize = 500;

#[derive(serde::Serialize, serde::Deserialize)]
struct Trivial {
    i: u32,
}

fn noop10(_: &Params10, _: &mut Run) -> JobResult {
    Ok(())
}

fn trivial(p: &Trivial, run: &mut Run) -> JobResult {
    run.log("x", 0, f64::from(p.i))?;
    Ok(())
}

/// Rows each run of the logging case logs.
const LOG_ROWS: i64 = 1000;

fn log_rows(p: &Trivial, run: &mut Run) -> JobResult {
    for step in 0..LOG_ROWS {
        run.log("loss", step, f64::from(p.i) + step as f64 * 1e-3)?;
    }
    Ok(())
}

/// CPU seconds of this process so far: (user, system).
fn cpu_times() -> (f64, f64) {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    (secs(ru.ru_utime), secs(ru.ru_stime))
}

/// Peak resident set of this process, bytes.
fn peak_rss() -> u64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    u64::try_from(ru.ru_maxrss).unwrap_or(0) * 1024
}

/// One measured case in this process: prints `seconds rss_bytes user_seconds system_seconds`
/// (CPU times of the measured work only).
fn child(case: &str, n: u32, store: &Path) {
    let krate = store.parent().unwrap().join("crate");
    let j = user_job(&krate, "trivial", trivial);
    let mut o = Orchestrator::builder().store_root(store).build().unwrap();
    let cpu0 = cpu_times();
    let t = Instant::now();
    if case == "drain-log" {
        let jl = user_job(&krate, "log_rows", log_rows);
        for i in 0..n {
            o.run(&jl, Trivial { i }).unwrap();
        }
    } else if case == "plan10" {
        let j10 = user_job(&krate, "noop10", noop10);
        for i in 0..n {
            o.run(&j10, p10(u64::from(i))).unwrap();
        }
    } else {
        for i in 0..n {
            o.run(&j, Trivial { i }).unwrap();
        }
    }
    match case {
        "plan10" => {
            let plan = o.plan().unwrap();
            assert_eq!(plan.decisions.len(), n as usize);
            std::hint::black_box(&plan);
        }
        "plan" => {
            let plan = o.plan().unwrap();
            assert_eq!(plan.decisions.len(), n as usize);
            std::hint::black_box(&plan);
        }
        "plan-done" => {
            let plan = o.plan().unwrap();
            assert_eq!(
                plan.count(puzzletron::Action::Skip),
                n as usize,
                "not all done"
            );
        }
        "drain-miss" => {
            let s = o.drain().unwrap_or_else(|f| panic!("{f}"));
            assert_eq!(s.ran(), n as usize, "{}", s.report());
        }
        "drain-log" => {
            let s = o.drain().unwrap_or_else(|f| panic!("{f}"));
            assert_eq!(s.ran(), n as usize, "{}", s.report());
        }
        "drain-hit" => {
            let s = o.drain().unwrap_or_else(|f| panic!("{f}"));
            assert_eq!(s.skipped(), n as usize, "{}", s.report());
        }
        other => panic!("unknown case {other}"),
    }
    let secs = t.elapsed().as_secs_f64();
    let cpu1 = cpu_times();
    println!(
        "{secs} {} {} {}",
        peak_rss(),
        cpu1.0 - cpu0.0,
        cpu1.1 - cpu0.1
    );
}

/// Runs `case` in a fresh process of this binary: the numbers of its last line (seconds, peak
/// RSS bytes, user seconds, system seconds).
fn run_child(case: &str, n: u32, store: &Path) -> Vec<f64> {
    flush_earlier_cases();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--case", case, &n.to_string()])
        .arg(store)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "case {case} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let f = last_numbers(&stdout);
    assert!(
        f.len() == 4 && f.iter().all(|v| v.is_finite()),
        "case {case}: expected `seconds rss user system` as its last line, got {stdout:?}"
    );
    f
}

/// Writes back what earlier cases left dirty (`sync(2)`), so that no case pays for another's
/// writeback: a first pass's group commit (`syncfs`) would otherwise flush the files joblib's
/// case before it wrote and never synced, and joblib's case would run under the writeback of
/// ours.
fn flush_earlier_cases() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// Runs `case` in a fresh process: (seconds, user seconds, system seconds).
fn run_case_cpu(case: &str, n: u32, store: &Path) -> (f64, f64, f64) {
    let f = run_child(case, n, store);
    (f[0], f[2], f[3])
}

/// Runs `case` in a fresh process: (seconds, peak RSS bytes).
fn run_case(case: &str, n: u32, store: &Path) -> (f64, u64) {
    let f = run_child(case, n, store);
    (f[0], f[1] as u64)
}

/// The whitespace-separated numbers of the last line of `s` (NaN where one does not parse).
fn last_numbers(s: &str) -> Vec<f64> {
    s.lines()
        .last()
        .unwrap_or_default()
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(f64::NAN))
        .collect()
}

/// joblib.Memory over `n` calls of a trivial function in `dir` (a fresh python process):
/// (seconds of the calls, peak RSS bytes).
fn joblib(venv: &Path, dir: &Path, n: u32) -> (f64, u64) {
    let script = format!(
        "import time, resource\n\
         from joblib import Memory\n\
         mem = Memory({dir:?}, verbose=0)\n\
         @mem.cache\n\
         def trivial(i):\n    return float(i)\n\
         t = time.perf_counter()\n\
         for i in range({n}):\n    trivial(i)\n\
         s = time.perf_counter() - t\n\
         print(s, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)\n",
        dir = dir.display().to_string()
    );
    flush_earlier_cases();
    let out = Command::new(venv.join("bin/python"))
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "joblib failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f = last_numbers(&String::from_utf8_lossy(&out.stdout));
    (f[0], f.get(1).map_or(0, |&r| r as u64))
}

fn snakefile(n: u32) -> String {
    format!(
        "rule all:\n    input: expand(\"out/{{i}}.txt\", i=range({n}))\n\n\
         rule trivial:\n    output: \"out/{{i}}.txt\"\n    shell: \"touch {{output}}\"\n"
    )
}

/// The finished `n`-output Snakemake workflow, built once by real `snakemake` runs of
/// [`SNAKE_CHUNK`] targets each (each run bounded, the build resumable).
fn snake_fixture(venv: &Path, n: u32) -> Option<PathBuf> {
    // Per Snakemake version: a workflow finished by another version is not this one's fixture.
    let version = SNAKEMAKE.split_once("==").map_or("", |v| v.1);
    let dir = target_dir().join(format!("bench-fixtures/snakemake-{version}-done-{n}"));
    let marker = dir.join("COMPLETE");
    if marker.exists() {
        return Some(dir);
    }
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("Snakefile"), snakefile(n)).unwrap();
    let ids: Vec<u32> = (0..n).collect();
    for chunk in ids.chunks(SNAKE_CHUNK) {
        eprintln!(
            "building the finished snakemake fixture: outputs {}..{} of {n}",
            chunk[0],
            chunk[chunk.len() - 1] + 1
        );
        let st = Command::new(venv.join("bin/snakemake"))
            .args(["--cores", "2", "--quiet", "-s", "Snakefile"])
            .args(chunk.iter().map(|i| format!("out/{i}.txt")))
            .current_dir(&dir)
            .output()
            .unwrap();
        if !st.status.success() {
            eprintln!(
                "snakemake fixture failed: {}",
                String::from_utf8_lossy(&st.stderr)
            );
            return None;
        }
    }
    std::fs::write(&marker, "").unwrap();
    Some(dir)
}

/// `snakemake -n` in `dir` (a fresh process, timed from outside: it is the whole command):
/// (seconds, whether it had nothing to do).
fn snake_dry(venv: &Path, dir: &Path) -> (f64, bool) {
    let t = Instant::now();
    let out = Command::new(venv.join("bin/snakemake"))
        .args(["-n", "--cores", "2", "-s", "Snakefile"])
        .current_dir(dir)
        .output()
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "snakemake -n failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (secs, text.contains("Nothing to be done"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--case") {
        let n = args[i + 2].parse().unwrap();
        child(&args[i + 1], n, Path::new(&args[i + 3]));
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: run small then.
    let quick = !args.iter().any(|a| a == "--bench");
    let n: u32 = std::env::var("PUZZLETRON_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 200 } else { 10_000 });
    // Issue 32's goal: a million runs of 10-field params enqueued and planned in < 5 s and
    // < 300 MB (`PUZZLETRON_BENCH_BIG` to change it).
    let big: u32 = std::env::var("PUZZLETRON_BENCH_BIG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 2000 } else { 1_000_000 });
    let reps = if quick { 1 } else { 3 };
    let venv = if quick { None } else { peer_venv(PEERS) };
    // Nothing is deleted before or between the measurements, only at the end, and a run waits
    // for the last bench's deletions to age out first (see `support/scratch.rs`).
    let scratch_dirs = Scratch::fresh("hot_paths");
    let scratch = scratch_dirs.dir.clone();
    if !quick {
        settle(&scratch);
    }
    user_crate(&scratch);
    let load_before = load();

    let mut first = Vec::new();
    let mut hit = Vec::new();
    let mut plan_done = Vec::new();
    let mut plan_fresh = Vec::new();
    let mut big_rss = 0u64;
    let mut big_secs = Vec::new();
    let mut jl_first = Vec::new();
    let mut jl_hit = Vec::new();
    let mut logging = Vec::new();
    // The floor of the same two paths: the bare syscalls of the store's protocol (`floor`),
    // beside the store's figures in the same run.
    let mut floor_miss = Vec::new();
    let mut floor_hit = Vec::new();
    let log_runs: u32 = if quick { 20 } else { 1000 };
    for r in 0..reps {
        let store = scratch.join(format!("store{r}"));
        first.push(run_case("drain-miss", n, &store).0 / f64::from(n));
        hit.push(run_case("drain-hit", n, &store).0 / f64::from(n));
        flush_earlier_cases();
        let fl = scratch.join(format!("floor{r}"));
        floor_miss.push(floor::misses(&fl, n as usize)[6]);
        floor_hit.push(floor::hits(&fl, n as usize)[0]);
        plan_done.push(run_case("plan-done", n, &store).0);
        plan_fresh.push(run_case("plan", n, &scratch.join(format!("empty{r}"))).0);
        logging.push(run_case_cpu(
            "drain-log",
            log_runs,
            &scratch.join(format!("log{r}")),
        ));
        let (s, rss) = run_case("plan10", big, &scratch.join(format!("big{r}")));
        big_secs.push(s);
        big_rss = big_rss.max(rss);
        if let Some(v) = &venv {
            let jd = scratch.join(format!("joblib{r}"));
            jl_first.push(joblib(v, &jd, n).0 / f64::from(n));
            jl_hit.push(joblib(v, &jd, n).0 / f64::from(n));
        }
    }
    let mut snake_done = None;
    if let Some(v) = &venv
        && let Some(fx) = snake_fixture(v, n)
    {
        let runs: Vec<(f64, bool)> = (0..reps).map(|_| snake_dry(v, &fx)).collect();
        assert!(
            runs.iter().all(|r| r.1),
            "the snakemake fixture is not finished"
        );
        snake_done = Some(median(runs.iter().map(|r| r.0).collect()));
    }
    // The same workflow with nothing done (one run: it is the slow side).
    let snake_fresh = venv.as_ref().map(|v| {
        let fresh = scratch.join("snakemake-fresh");
        std::fs::create_dir_all(&fresh).unwrap();
        std::fs::write(fresh.join("Snakefile"), snakefile(n)).unwrap();
        snake_dry(v, &fresh).0
    });
    let (first, hit, plan_done, plan_fresh) = (
        median(first),
        median(hit),
        median(plan_done),
        median(plan_fresh),
    );
    let big_secs = median(big_secs);
    let (floor_miss, floor_hit) = (median(floor_miss), median(floor_hit));
    logging.sort_by(|a, b| a.0.total_cmp(&b.0));
    let log_mid = logging[logging.len() / 2];
    let jl = (!jl_first.is_empty()).then(|| (median(jl_first), median(jl_hit)));
    let us = |s: f64| s * 1e6;
    println!(
        "hot paths, {n} runs (FsStore), medians of {reps}, load before {load_before}, after {}",
        load()
    );
    let ratio = |peer: Option<f64>, ours: f64| {
        peer.map(|p| format!("{:.1}x", p / ours))
            .unwrap_or_else(|| "-".into())
    };
    println!(
        "  cache hit (enqueue + drain):   {:8.2} us/run   joblib hit   {:8.1} us/run   ratio {}",
        us(hit),
        jl.map(|j| us(j.1)).unwrap_or(f64::NAN),
        ratio(jl.map(|j| j.1), hit)
    );
    println!(
        "  first pass (trivial misses):   {:8.1} us/run   joblib miss  {:8.1} us/run   ratio {}",
        us(first),
        jl.map(|j| us(j.0)).unwrap_or(f64::NAN),
        ratio(jl.map(|j| j.0), first)
    );
    println!(
        "  floor (bare syscalls):         {:8.2} us/hit   {:8.1} us/miss; store above it: hit {:.1}x, miss {:.2}x",
        us(floor_hit),
        us(floor_miss),
        hit / floor_hit,
        first / floor_miss
    );
    println!(
        "  plan, {n} done:             {:8.4} s        snakemake -n {:8.2} s        ratio {}",
        plan_done,
        snake_done.unwrap_or(f64::NAN),
        ratio(snake_done, plan_done)
    );
    println!(
        "  enqueue + plan, {n} new:      {plan_fresh:8.4} s        snakemake -n {:8.2} s        ratio {}",
        snake_fresh.unwrap_or(f64::NAN),
        ratio(snake_fresh, plan_fresh)
    );
    println!(
        "  enqueue + plan, {big} new (10-field params): {big_secs:8.3} s, peak RSS {:.1} MB, max of the runs ({} bytes/run)",
        big_rss as f64 / 1e6,
        big_rss / u64::from(big)
    );
    println!(
        "  logging, {log_runs} runs x {LOG_ROWS} rows:     {:8.3} s (user {:.2} s, system {:.2} s)",
        log_mid.0, log_mid.1, log_mid.2
    );
    let json = serde_json::json!({
        "log_runs": log_runs, "log_rows": LOG_ROWS, "log_s": log_mid.0,
        "log_user_s": log_mid.1, "log_sys_s": log_mid.2,
        "runs": n, "reps": reps, "load_before": load_before, "load_after": load(),
        "hit_us": us(hit), "first_pass_us": us(first),
        "floor_hit_us": us(floor_hit), "floor_miss_us": us(floor_miss), "plan_done_s": plan_done,
        "plan_fresh_s": plan_fresh, "big_runs": big, "big_plan_s": big_secs, "big_rss": big_rss,
        "joblib_hit_us": jl.map(|j| us(j.1)), "joblib_miss_us": jl.map(|j| us(j.0)),
        "snakemake_dry_done_s": snake_done, "snakemake_dry_fresh_s": snake_fresh,
    });
    let out = target_dir().join("bench-results");
    let _ = std::fs::create_dir_all(&out);
    let _ = std::fs::write(out.join("hot_paths.json"), json.to_string());
    scratch_dirs.discard();
}
