//! The 100k-work-item simulated campaign (`docs/design.md`, "Targets"): mock executor, virtual
//! clock, injected faults (4% of first attempts fail: node failures, application errors, OOM, lost
//! jobs; failed polls), journal on disk (fsync per batch). Prints wall time and peak RSS.
//!
//! `cargo bench --bench controller_sim` (items: `PUZZLETRON_SIM_ITEMS`, default 100000).
//! One run, not criterion samples: a run takes seconds and its peak memory is the figure.

#[path = "../tests/support/mod.rs"]
mod test_support;
use test_support::sim;

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument that excludes us skips the run.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && !"controller_sim".contains(a.as_str()))
    {
        return;
    }
    let items: u32 = std::env::var("PUZZLETRON_SIM_ITEMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    if std::env::var("PUZZLETRON_SIM_PROBE").is_ok() {
        let p = sim::plan(items);
        eprintln!("after plan: peak {:.1} MB", peak_rss_mb());
        let j = serde_json::to_vec(&p).unwrap();
        eprintln!(
            "plan json {:.1} MB; peak {:.1} MB",
            j.len() as f64 / 1e6,
            peak_rss_mb()
        );
        drop(j);
        drop(p);
        // The mock executor alone: 104k jobs submitted and polled once.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let before = rss_mb();
        let mock = puzzletron::executor::MockExecutor::new();
        let handles: Vec<_> = (0..104_000)
            .map(|i| {
                let id =
                    puzzletron::executor::AttemptId::new(format!("abcdef.big.{i}.a1")).unwrap();
                let spec = puzzletron::executor::AttemptSpec::new(
                    id,
                    puzzletron::executor::CommandSpec::new("w"),
                );
                rt.block_on(puzzletron::executor::Executor::submit(&mock, &spec))
                    .unwrap()
            })
            .collect();
        let st = rt
            .block_on(puzzletron::executor::Executor::poll(&mock, &handles))
            .unwrap();
        eprintln!(
            "mock with 104k jobs (+ their handles and statuses): {:.1} MB",
            rss_mb() - before
        );
        drop((st, handles, mock));
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let t = std::time::Instant::now();
    let r = sim::run(items, dir.path());
    let wall = t.elapsed();
    let journal = std::fs::metadata(dir.path().join("controller/journal.jsonl"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(r.report.is_complete(), "{}", r.report);
    println!(
        "controller_sim: {items} items, {} jobs ({} retries of injected faults), {} poll failures injected, {} iterations, wall {:.2} s, peak RSS {:.1} MB, journal {:.1} MB",
        r.jobs,
        r.jobs - items as usize - 3,
        r.injected_poll_failures,
        r.iterations,
        wall.as_secs_f64(),
        peak_rss_mb(),
        journal as f64 / 1e6
    );
}
