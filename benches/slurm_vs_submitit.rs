//! Slurm side by side with submitit (issue 32): N trivial jobs on the local cluster
//! (`shared/slurm/start-local-cluster.sh`), in the same run, four ways:
//!
//! - puzzletron's `SlurmExecutor`, one job array (`submit_array`) of `true` tasks;
//! - submitit's `map_array` of a trivial Python function (its way to run many calls as one
//!   array);
//! - `SlurmExecutor`, N single jobs (`submit` each);
//! - submitit, N single `submit` calls.
//!
//! Each way: the wall time from the first submit until every job is known done (puzzletron:
//! terminal in its poll; submitit: every `result()` returned), and the scheduler commands run
//! (`sbatch`, `squeue`, `sacct`, `scontrol`, `scancel`), counted by wrappers: a folder of tiny
//! scripts that append their name to a count file and exec the real binary by absolute path.
//! submitit finds them first in `PATH` (checked with `which`, and by the Python side's
//! `shutil.which`); puzzletron is pointed at them with `SlurmExecutorBuilder::bin_dir`, and its
//! own counters are printed beside them as a cross-check. Both sides ask for one task, one CPU,
//! five minutes on the same partition; puzzletron uses its default `PollPolicy`.
//!
//! ```text
//! cargo bench --bench slurm_vs_submitit              # N = 50 and 1000, medians of 3
//! PUZZLETRON_BENCH_SLURM_N=50 PUZZLETRON_BENCH_SLURM_SAMPLES=1 cargo bench --bench slurm_vs_submitit
//! cargo bench --bench slurm_vs_submitit -- --quick   # N = 10, one sample
//! ```
//!
//! Knobs: `PUZZLETRON_BENCH_SLURM_N` (comma-separated, default `50,1000`),
//! `PUZZLETRON_BENCH_SLURM_SAMPLES` (default 3), `PUZZLETRON_BENCH_SLURM_PARTITION` (default
//! `debug`), `PUZZLETRON_BENCH_NO_SUBMITIT=1` or `PUZZLETRON_BENCH_NO_PEERS=1` (puzzletron
//! only). submitit is pinned in `support` and pip-installed into `target/bench-venv`. Prints a
//! skip message without a cluster, and skips submitit when pip fails. Everything is written
//! under the target folder; results go to `target/bench-results/slurm_vs_submitit.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use puzzletron::executor::{
    ArraySpec, AttemptId, AttemptSpec, CommandSpec, Executor, SchedulerOptions, SlurmExecutor,
    SlurmStats,
};

#[allow(
    dead_code,
    unused_imports,
    reason = "the shared bench support; this bench uses the venv, the load and the target folder"
)]
mod support;
use support::{SUBMITIT, load, peer_venv, target_dir};

/// The commands counted (every Slurm client command either side runs).
const COMMANDS: [&str; 5] = ["sbatch", "squeue", "sacct", "scontrol", "scancel"];

/// The four ways, in the order each sample runs them.
const WAYS: [&str; 4] = [
    "puzzletron array",
    "submitit map_array",
    "puzzletron single",
    "submitit single",
];

/// The counting wrappers and their count file.
struct Wrappers {
    bin: PathBuf,
    count_file: PathBuf,
    /// The real `squeue`, to watch the cluster between measurements without counting.
    real_squeue: PathBuf,
}

impl Wrappers {
    /// Writes one wrapper per command into `dir/bin`; `None` when a command is not in `PATH`.
    fn new(dir: &Path) -> Option<Self> {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let count_file = dir.join("calls");
        let mut real_squeue = None;
        for c in COMMANDS {
            let real = find_in_path(c)?;
            let script = format!(
                "#!/bin/sh\necho {c} >> '{}'\nexec '{}' \"$@\"\n",
                count_file.display(),
                real.display()
            );
            let w = bin.join(c);
            std::fs::write(&w, script).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o755)).unwrap();
            if c == "squeue" {
                real_squeue = Some(real);
            }
        }
        Some(Wrappers {
            bin,
            count_file,
            real_squeue: real_squeue?,
        })
    }

    /// `PATH` with the wrappers first.
    fn path(&self) -> String {
        let rest = std::env::var("PATH").unwrap_or_default();
        format!("{}:{rest}", self.bin.display())
    }

    fn reset(&self) {
        std::fs::write(&self.count_file, "").unwrap();
    }

    /// Calls per command since the last reset.
    fn counts(&self) -> BTreeMap<String, u64> {
        let mut m: BTreeMap<String, u64> = COMMANDS.iter().map(|c| (c.to_string(), 0)).collect();
        for l in std::fs::read_to_string(&self.count_file)
            .unwrap_or_default()
            .lines()
        {
            *m.entry(l.trim().to_string()).or_default() += 1;
        }
        m
    }

    /// Checks that `which` finds every command as its wrapper with [`Self::path`].
    fn check_which(&self) {
        for c in COMMANDS {
            let out = Command::new("which")
                .arg(c)
                .env("PATH", self.path())
                .output()
                .unwrap();
            let got = String::from_utf8_lossy(&out.stdout).trim().to_string();
            assert_eq!(
                Path::new(&got),
                self.bin.join(c),
                "`which {c}` must find the counting wrapper"
            );
        }
    }

    /// Waits (up to 2 minutes) until no job whose name starts with `prefix` is left in
    /// squeue (submitit's results are written before its jobs end), so that no way's tail
    /// overlaps the next one. Returns the number of other jobs in the queue then.
    fn wait_idle(&self, prefix: &str) -> usize {
        let t = Instant::now();
        loop {
            let out = Command::new(&self.real_squeue)
                .args(["-h", "-o", "%j"])
                .output()
                .unwrap();
            let s = String::from_utf8_lossy(&out.stdout);
            let ours = s.lines().filter(|l| l.starts_with(prefix)).count();
            if ours == 0 || t.elapsed() > Duration::from_secs(120) {
                return s.lines().count() - ours;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// The first executable `name` in `PATH`.
fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// One measurement of one way.
#[derive(Clone, serde::Serialize)]
struct Sample {
    submit_seconds: f64,
    total_seconds: f64,
    calls: BTreeMap<String, u64>,
    /// Other jobs in the queue when the way started (another user of the cluster).
    others_in_queue: usize,
}

impl Sample {
    fn total_calls(&self) -> u64 {
        self.calls.values().sum()
    }
}

/// puzzletron: `n` jobs running `true`, as one array or `n` single jobs, followed to the end.
async fn puzzletron(
    w: &Wrappers,
    dir: &Path,
    array: bool,
    n: u32,
    tag: &str,
    partition: &str,
) -> (f64, f64, SlurmStats) {
    let e = SlurmExecutor::builder(dir.join(tag))
        .bin_dir(&w.bin)
        .build()
        .unwrap();
    let spec = |id: String| {
        AttemptSpec::new(AttemptId::new(id).unwrap(), CommandSpec::new("true"))
            .with_walltime(Duration::from_secs(300))
            .with_scheduler(SchedulerOptions::default().with_partition(partition))
    };
    let t = Instant::now();
    let hs = if array {
        e.submit_array(&ArraySpec::new(spec(tag.to_string()), n))
            .await
            .unwrap()
    } else {
        let mut hs = Vec::with_capacity(n as usize);
        for i in 0..n {
            hs.push(e.submit(&spec(format!("{tag}.j{i}"))).await.unwrap());
        }
        hs
    };
    let submitted = t.elapsed().as_secs_f64();
    // `poll` answers from its cache until the policy's interval has passed: asking often
    // costs no scheduler call, and the figure is the policy's, not this loop's.
    assert_eq!(hs.len(), n as usize);
    let total = support::slurm::wait_all_completed(&e, &hs, Duration::from_millis(100), t).await;
    (submitted, total, e.stats())
}

/// What the Python side prints.
#[derive(serde::Deserialize)]
struct SubmititOut {
    submit_seconds: f64,
    total_seconds: f64,
    which: BTreeMap<String, Option<String>>,
    watcher_calls: u64,
}

/// submitit: `n` trivial function jobs, `map_array` or single `submit` calls, all results in.
fn submitit(
    w: &Wrappers,
    venv: &Path,
    dir: &Path,
    array: bool,
    n: u32,
    tag: &str,
    partition: &str,
) -> SubmititOut {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/support/submitit_jobs.py");
    let out = Command::new(venv.join("bin/python"))
        .arg(script)
        .arg(if array { "array" } else { "single" })
        .arg(n.to_string())
        .arg(dir.join(tag).join("%j"))
        .arg(partition)
        .arg(tag)
        .env("PATH", w.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "submitit side failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout);
    let r: SubmititOut = serde_json::from_str(line.trim().lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("submitit side printed {line:?}: {e}"));
    for c in COMMANDS {
        assert_eq!(
            r.which.get(c).cloned().flatten().map(PathBuf::from),
            Some(w.bin.join(c)),
            "submitit must resolve `{c}` to the counting wrapper"
        );
    }
    r
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let ok = Command::new("sinfo")
        .args(["-h", "-o", "%N"])
        .output()
        .is_ok_and(|o| o.status.success() && !o.stdout.is_empty());
    if !ok {
        println!("SKIP slurm_vs_submitit: no Slurm cluster answers `sinfo`");
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: run small then.
    let quick = args.iter().any(|a| a == "--quick") || !args.iter().any(|a| a == "--bench");
    let ns: Vec<u32> = match std::env::var("PUZZLETRON_BENCH_SLURM_N") {
        Ok(v) => v
            .split(',')
            .map(|x| {
                x.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("PUZZLETRON_BENCH_SLURM_N: bad count {x:?}"))
            })
            .collect(),
        Err(_) if quick => vec![10],
        Err(_) => vec![50, 1000],
    };
    let samples: usize = std::env::var("PUZZLETRON_BENCH_SLURM_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 1 } else { 3 })
        .max(1);
    let partition =
        std::env::var("PUZZLETRON_BENCH_SLURM_PARTITION").unwrap_or_else(|_| "debug".into());
    let venv = if std::env::var_os("PUZZLETRON_BENCH_NO_SUBMITIT").is_some() {
        println!("SKIP submitit side: PUZZLETRON_BENCH_NO_SUBMITIT is set");
        None
    } else {
        let v = peer_venv(&[SUBMITIT]);
        if v.is_none() {
            println!(
                "SKIP submitit side: {SUBMITIT} could not be pip-installed into target/bench-venv \
                 (or PUZZLETRON_BENCH_NO_PEERS is set)"
            );
        }
        v
    };
    let dir = target_dir().join("bench-scratch/slurm_vs_submitit");
    let Some(w) = Wrappers::new(&dir) else {
        println!("SKIP slurm_vs_submitit: a Slurm command ({COMMANDS:?}) is not in PATH");
        return;
    };
    w.check_which();
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % 1_000_000;
    let prefix = format!("svs{run_id}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let load_before = load();
    println!(
        "slurm_vs_submitit: N = {ns:?}, {samples} sample(s) each, partition {partition}, load \
         {load_before}"
    );
    let mut json = serde_json::Map::new();
    for &n in &ns {
        let mut got: BTreeMap<&str, Vec<Sample>> = BTreeMap::new();
        for s in 0..samples {
            for (k, way) in WAYS.iter().enumerate() {
                let is_submitit = way.starts_with("submitit");
                if is_submitit && venv.is_none() {
                    continue;
                }
                let tag = format!("{prefix}n{n}s{s}w{k}");
                let others = w.wait_idle(&prefix);
                w.reset();
                let array = way.ends_with("array");
                let sample = if is_submitit {
                    let venv = venv.as_deref().expect("checked above");
                    let r = submitit(&w, venv, &dir, array, n, &tag, &partition);
                    let calls = w.counts();
                    eprintln!(
                        "  N={n} sample {s} {way}: {:.2} s (submitted in {:.2} s), calls {calls:?}, \
                         submitit's own sacct count {}",
                        r.total_seconds, r.submit_seconds, r.watcher_calls
                    );
                    Sample {
                        submit_seconds: r.submit_seconds,
                        total_seconds: r.total_seconds,
                        calls,
                        others_in_queue: others,
                    }
                } else {
                    let (sub, total, st) =
                        rt.block_on(puzzletron(&w, &dir, array, n, &tag, &partition));
                    let calls = w.counts();
                    // Its own counters see the same calls (scontrol is not among them).
                    assert_eq!(calls["sbatch"], st.sbatch_calls, "sbatch count");
                    assert_eq!(calls["squeue"], st.squeue_calls, "squeue count");
                    assert_eq!(calls["sacct"], st.sacct_calls, "sacct count");
                    eprintln!(
                        "  N={n} sample {s} {way}: {total:.2} s (submitted in {sub:.2} s), calls \
                         {calls:?}, {} poll cycles",
                        st.poll_cycles
                    );
                    Sample {
                        submit_seconds: sub,
                        total_seconds: total,
                        calls,
                        others_in_queue: others,
                    }
                };
                got.entry(way).or_default().push(sample);
            }
        }
        w.wait_idle(&prefix);
        println!();
        println!(
            "N = {n} trivial jobs ({samples} sample(s); medians, [min-max] wall)\n{:<20} {:>22} {:>7} {:>7} {:>7} {:>8} {:>7} {:>7}",
            "way",
            "wall to all done, s",
            "sbatch",
            "squeue",
            "sacct",
            "scontrol",
            "scancel",
            "calls"
        );
        let mut by_way = serde_json::Map::new();
        let mut med: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
        for way in WAYS {
            let Some(v) = got.get(way) else { continue };
            let walls: Vec<f64> = v.iter().map(|s| s.total_seconds).collect();
            let mc = |c: &str| median(&v.iter().map(|s| s.calls[c] as f64).collect::<Vec<_>>());
            let total = median(&v.iter().map(|s| s.total_calls() as f64).collect::<Vec<_>>());
            let lo = walls.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = walls.iter().copied().fold(0.0, f64::max);
            println!(
                "{way:<20} {:>8.2} [{lo:6.2}-{hi:6.2}] {:>7} {:>7} {:>7} {:>8} {:>7} {:>7}",
                median(&walls),
                mc("sbatch"),
                mc("squeue"),
                mc("sacct"),
                mc("scontrol"),
                mc("scancel"),
                total
            );
            med.insert(way, (median(&walls), total));
            by_way.insert(
                way.into(),
                serde_json::json!({
                    "median_total_seconds": median(&walls),
                    "median_submit_seconds":
                        median(&v.iter().map(|s| s.submit_seconds).collect::<Vec<_>>()),
                    "median_calls": total,
                    "median_calls_by_command": COMMANDS.iter()
                        .map(|c| (c.to_string(), serde_json::json!(mc(c))))
                        .collect::<serde_json::Map<_, _>>(),
                    "samples": v,
                }),
            );
        }
        for (pt, sub) in [
            ("puzzletron array", "submitit map_array"),
            ("puzzletron single", "submitit single"),
            ("puzzletron array", "submitit single"),
        ] {
            if let (Some(a), Some(b)) = (med.get(pt), med.get(sub)) {
                println!(
                    "  {pt} vs {sub}: wall {:.2}x submitit's ({}), calls {:.3}x ({})",
                    a.0 / b.0,
                    if a.0 <= b.0 { "<= submitit" } else { "SLOWER" },
                    a.1 / b.1,
                    if a.1 * 10.0 <= b.1 {
                        "<= 1/10"
                    } else {
                        "above 1/10"
                    }
                );
            }
        }
        json.insert(n.to_string(), serde_json::Value::Object(by_way));
    }
    let load_after = load();
    println!("load before {load_before}, after {load_after}");
    json.insert("load_before".into(), load_before.into());
    json.insert("load_after".into(), load_after.into());
    json.insert("submitit".into(), SUBMITIT.into());
    json.insert("partition".into(), partition.into());
    let out = target_dir().join("bench-results");
    let _ = std::fs::create_dir_all(&out);
    let _ = std::fs::write(
        out.join("slurm_vs_submitit.json"),
        serde_json::to_string_pretty(&serde_json::Value::Object(json)).unwrap_or_default(),
    );
}
