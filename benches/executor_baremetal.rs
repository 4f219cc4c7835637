//! Bare-metal executor figures on the fake SSH hosts of `scripts/ssh-hosts.sh` (sshd on
//! loopback, 4 hosts x 4 fake GPUs): submit throughput (tasks/s) of N tasks (default 200,
//! `PUZZLETRON_BENCH_BM_TASKS`), then poll cycles over the N live tasks: SSH exchanges per cycle
//! and wall time per cycle (`PUZZLETRON_BENCH_BM_CYCLES`, default 20), then a cancel of all.
//!
//! ```text
//! bash scripts/ssh-hosts.sh start   # the bench starts them too (idempotent)
//! cargo bench --bench executor_baremetal
//! ```
//!
//! Printed, and written to `target/bench-results/executor_baremetal.json`. The machine's load
//! (`/proc/loadavg`) is printed with the figures.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use puzzletron::executor::{
    AttemptId, AttemptSpec, BareMetalExecutor, CommandSpec, Executor, JobState,
};

fn env_num(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn start_hosts() -> (PathBuf, Vec<String>) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/ssh-hosts.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("start")
        .output()
        .expect("ssh-hosts.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("export {k}=")))
            .map(|v| v.trim_matches('"').to_string())
            .expect("ssh-hosts.sh env")
    };
    let hosts = get("PUZZLETRON_SSH_HOSTS_LIST")
        .split(' ')
        .take(4)
        .map(str::to_string)
        .collect();
    (get("PUZZLETRON_SSH_CONFIG").into(), hosts)
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: run small then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let n = env_num("PUZZLETRON_BENCH_BM_TASKS", if quick { 8 } else { 200 });
    let cycles = env_num("PUZZLETRON_BENCH_BM_CYCLES", if quick { 2 } else { 20 });
    let (config, hosts) = start_hosts();
    let state = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut b = BareMetalExecutor::builder(state.path())
            .ssh_config(&config)
            .kill_grace(Duration::from_secs(2));
        for h in &hosts {
            b = b.host(h, 4);
        }
        let exec = b.build().unwrap();
        exec.preflight().await.unwrap();
        let tag = format!("bench{}", std::process::id());
        let ex0 = exec.ssh_exchanges();
        let t = Instant::now();
        let mut handles = Vec::with_capacity(n);
        for i in 0..n {
            let spec = AttemptSpec::new(
                AttemptId::new(format!("{tag}-{i}")).unwrap(),
                CommandSpec::new("sleep").arg("600"),
            );
            handles.push(exec.submit(&spec).await.unwrap());
        }
        let submit_s = t.elapsed().as_secs_f64();
        let submit_ex = exec.ssh_exchanges() - ex0;
        // Wait until all run, then time the cycles.
        loop {
            let st = exec.poll(&handles).await.unwrap();
            if st.iter().all(|s| s.state == JobState::Running) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut times = Vec::with_capacity(cycles);
        let ex1 = exec.ssh_exchanges();
        for _ in 0..cycles {
            let t = Instant::now();
            let st = exec.poll(&handles).await.unwrap();
            times.push(t.elapsed().as_secs_f64() * 1e3);
            assert!(st.iter().all(|s| s.state == JobState::Running));
        }
        let per_cycle = (exec.ssh_exchanges() - ex1) as f64 / cycles as f64;
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        // Cancel everything (concurrently), then check nothing is left.
        let t = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for h in handles.clone() {
            let e = exec.clone();
            set.spawn(async move { e.cancel(&h).await });
        }
        while let Some(r) = set.join_next().await {
            r.unwrap().unwrap();
        }
        let cancel_s = t.elapsed().as_secs_f64();
        let st = exec.poll(&handles).await.unwrap();
        assert!(
            st.iter()
                .all(|s| matches!(s.state, JobState::Cancelled { .. }))
        );
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let result = serde_json::json!({
            "tasks": n,
            "hosts": hosts.len(),
            "submit_tasks_per_s": n as f64 / submit_s,
            "submit_ssh_exchanges_per_task": submit_ex as f64 / n as f64,
            "poll_cycles": cycles,
            "poll_ssh_exchanges_per_cycle": per_cycle,
            "poll_cycle_ms_median": median,
            "poll_cycle_ms_mean": mean,
            "cancel_all_s": cancel_s,
            "loadavg": load.trim(),
        });
        println!(
            "executor_baremetal: {}",
            serde_json::to_string_pretty(&result).unwrap()
        );
        if !quick {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-results");
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::write(dir.join("executor_baremetal.json"), result.to_string());
        }
    });
}
