//! Ray executor figures on a Ray cluster (`ray start --head --num-cpus=4 --num-gpus=4`,
//! dashboard at `$PUZZLETRON_RAY_ADDRESS`, default `http://127.0.0.1:8265`):
//! - an isolated sweep of N trivial runs (`PUZZLETRON_BENCH_RAY_RUNS`, default 200) on Ray and
//!   the same sweep on the `LocalExecutor` (4 slots) in the same run: runs/s of each drain;
//! - raw submits: N `sleep 0` jobs posted one after another (submits/s), then the cost of one
//!   poll of all N (one `GET /api/jobs/`, ms).
//!
//! ```text
//! ray start --head --num-cpus=4 --num-gpus=4 --disable-usage-stats
//! cargo bench --features ray --bench executor_ray
//! ```
//!
//! Printed, and written to `target/bench-results/executor_ray.json`, with the machine's load.

use std::time::{Duration, Instant};

use puzzletron::executor::{
    AttemptId, AttemptSpec, CommandSpec, Executor, ExecutorExt, LocalExecutor, RayExecutor,
};
use puzzletron::{JobResult, Run};
use puzzletron::{Orchestrator, job};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct P {
    x: i64,
}

fn trivial(p: &P, run: &mut Run) -> JobResult {
    run.log("y", 0, (p.x * p.x) as f64)?;
    Ok(())
}

fn rate<E: Executor>(mut o: Orchestrator<puzzletron::store::FsStore, E>, n: i64) -> f64 {
    let j = job!(trivial);
    for x in 0..n {
        o.run(&j, P { x }).unwrap();
    }
    let t = Instant::now();
    let s = o.drain().unwrap_or_else(|f| panic!("drain failed: {f}"));
    assert_eq!(s.ran(), n as usize, "{}", s.report());
    n as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    puzzletron::worker::main_guard();
    let address =
        std::env::var("PUZZLETRON_RAY_ADDRESS").unwrap_or_else(|_| "http://127.0.0.1:8265".into());
    let n: i64 = std::env::var("PUZZLETRON_BENCH_RAY_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ray = RayExecutor::builder(&address)
        .namespace("puzzletron-bench")
        .build()
        .unwrap();
    if let Err(e) = rt.block_on(ray.preflight()) {
        println!("executor_ray: no Ray cluster at {address} ({e}); start one (see the header)");
        return;
    }
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let tmp = tempfile::tempdir().unwrap();

    let ray_rate = rate(
        Orchestrator::builder()
            .store_root(tmp.path().join("ray"))
            .executor(ray.clone())
            .isolate(true)
            .build()
            .unwrap(),
        n,
    );
    let local_rate = rate(
        Orchestrator::builder()
            .store_root(tmp.path().join("local"))
            .executor(
                LocalExecutor::builder(tmp.path().join("attempts"))
                    .max_concurrent(4)
                    .build()
                    .unwrap(),
            )
            .isolate(true)
            .build()
            .unwrap(),
        n,
    );

    // Raw submits and one poll of them all.
    let tag = format!(
        "bench{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            % 1_000_000
    );
    let (submit_rate, poll_ms) = rt.block_on(async {
        let t = Instant::now();
        let mut hs = Vec::new();
        for i in 0..n {
            let spec = AttemptSpec::new(
                AttemptId::new(format!("{tag}.{i}")).unwrap(),
                CommandSpec::new("true"),
            );
            hs.push(ray.submit(&spec).await.unwrap());
        }
        let submit_rate = n as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        ray.poll(&hs).await.unwrap();
        let poll_ms = t.elapsed().as_secs_f64() * 1000.0;
        ray.wait_terminal(&hs, Duration::from_millis(500), Duration::from_secs(900))
            .await
            .unwrap();
        (submit_rate, poll_ms)
    });
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let figures = serde_json::json!({
        "runs": n,
        "isolated_sweep_runs_per_s": {"ray": ray_rate, "local": local_rate},
        "ray_raw_submits_per_s": submit_rate,
        "ray_poll_of_all_ms": poll_ms,
        "load_before": load_before.trim(),
        "load_after": load_after.trim(),
    });
    println!(
        "executor_ray: isolated sweep of {n} trivial runs: Ray {ray_rate:.2} runs/s, \
         LocalExecutor {local_rate:.2} runs/s; Ray raw submits {submit_rate:.1}/s, one poll of \
         {n} jobs {poll_ms:.0} ms (load {} -> {})",
        load_before.trim(),
        load_after.trim()
    );
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-results");
    let _ = std::fs::create_dir_all(&out);
    let _ = std::fs::write(
        out.join("executor_ray.json"),
        serde_json::to_string_pretty(&figures).unwrap(),
    );
}
