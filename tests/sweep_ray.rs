//! An isolated sweep on a real Ray cluster (`.isolate(true).executor(RayExecutor ...)`): each
//! run is one Ray job running a worker process of this very binary, over a store on a
//! filesystem the Ray node shares (here: this machine's `/tmp`).
//!
//! `PUZZLETRON_RAY_SWEEP_RUNS` runs (default 200) of a trivial job: each runs exactly once
//! (its artifact file has one line; Ray's job list has one job per run), the results equal the
//! in-process ones, and the same sweep on the `LocalExecutor` gives the runs/s figure printed
//! beside Ray's.
//!
//! A `harness = false` test: `main` calls `puzzletron::worker::main_guard()` first, so the
//! same binary serves as parent and worker. Gated by `PUZZLETRON_RAY_TESTS=1`.

use std::path::Path;
use std::time::{Duration, Instant};

use puzzletron::executor::{LocalExecutor, RayExecutor};
use puzzletron::{JobResult, Run};
use puzzletron::{Orchestrator, job};
use serde::{Deserialize, Serialize};

mod support;
use support::watchdog;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct P {
    x: i64,
}

fn trivial(p: &P, run: &mut Run) -> JobResult {
    if let Some(dir) = run.artifact_dir() {
        std::fs::create_dir_all(dir)?;
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("runs"))?;
        writeln!(
            f,
            "pid {} gpus {}",
            std::process::id(),
            std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default()
        )?;
    }
    run.log("y", 0, (p.x * p.x) as f64)?;
    Ok(())
}

fn address() -> String {
    std::env::var("PUZZLETRON_RAY_ADDRESS").unwrap_or_else(|_| "http://127.0.0.1:8265".into())
}

type Table = Vec<(i64, f64, String)>;

fn table(
    o: &mut Orchestrator<puzzletron::store::FsStore, impl puzzletron::executor::Executor>,
) -> Table {
    let t = o.get("y").expect("get y");
    let keys = t.job_keys();
    let mut v: Table = t
        .steps()
        .into_iter()
        .zip(t.values())
        .zip(keys)
        .map(|((s, v), k)| (s, v, k.to_string()))
        .collect();
    v.sort_by(|a, b| a.2.cmp(&b.2));
    v
}

/// Runs the sweep of `n` runs isolated on `o`; returns the runs per second of the drain.
fn drain_all(
    o: &mut Orchestrator<puzzletron::store::FsStore, impl puzzletron::executor::Executor>,
    n: i64,
    what: &str,
) -> f64 {
    let j = job!(trivial);
    for x in 0..n {
        o.run(&j, P { x }).unwrap();
    }
    let t = Instant::now();
    let s = o
        .drain()
        .unwrap_or_else(|f| panic!("isolated {what} drain failed: {f}"));
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(s.ran(), n as usize, "{}", s.report());
    n as f64 / secs
}

fn isolated_sweep_on_ray(base: &Path, n: i64) {
    let mut inproc = Orchestrator::builder()
        .store_root(base.join("inproc"))
        .build()
        .unwrap();
    let j = job!(trivial);
    for x in 0..n {
        inproc.run(&j, P { x }).unwrap();
    }
    inproc
        .drain()
        .unwrap_or_else(|f| panic!("in-process drain: {f}"));

    let ray = RayExecutor::builder(address())
        .namespace("puzzletron-sweep-test")
        .build()
        .unwrap();
    let mut iso = Orchestrator::builder()
        .store_root(base.join("ray"))
        .executor(ray)
        .isolate(true)
        .build()
        .unwrap();
    let ray_rate = drain_all(&mut iso, n, "Ray");
    assert_eq!(table(&mut inproc), table(&mut iso), "Ray results differ");
    let me = format!("pid {} ", std::process::id());
    for p in iso.enqueued() {
        let runs = std::fs::read_to_string(iso.artifact_dir(&p.key).unwrap().join("runs")).unwrap();
        assert_eq!(runs.lines().count(), 1, "run {} ran {runs:?}", p.key);
        assert!(!runs.starts_with(&me), "ran in the parent");
    }

    let mut local = Orchestrator::builder()
        .store_root(base.join("local"))
        .executor(
            LocalExecutor::builder(base.join("attempts"))
                .max_concurrent(4)
                .build()
                .unwrap(),
        )
        .isolate(true)
        .build()
        .unwrap();
    let local_rate = drain_all(&mut local, n, "local");
    assert_eq!(table(&mut inproc), table(&mut local));
    println!(
        "figure - isolated sweep of {n} trivial runs: Ray {ray_rate:.2} runs/s, LocalExecutor \
         {local_rate:.2} runs/s (same binary, same machine)"
    );
    println!("ok - isolated_sweep_on_ray ({n} runs, each once)");
}

fn main() {
    puzzletron::worker::main_guard();
    if !cfg!(puzzletron_ray_tests) {
        println!(
            "ignored - isolated_sweep_on_ray (needs a Ray cluster, `ray start --head`: set \
             PUZZLETRON_RAY_TESTS=1)"
        );
        println!("0 passed, 0 failed, 1 skipped");
        return;
    }
    let n: i64 = std::env::var("PUZZLETRON_RAY_SWEEP_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let _w = watchdog::Watchdog::start("sweep_ray", Duration::from_secs(900));
    let tmp = tempfile::tempdir().unwrap();
    isolated_sweep_on_ray(tmp.path(), n);
    println!("1 passed, 0 failed");
}
