//! One metric of a large sweep to Parquet. Goals: issue 13, 10M rows in < 500 MB RSS and at
//! least 8x pandas + pyarrow end to end; issue 32, at least 20x and < 100 MB, also for 100k
//! runs x 100 steps.
//!
//! Builds, once, an `FsStore` of `PUZZLETRON_METRICS_BENCH_RUNS` runs (default 10,000) that each
//! logged `PUZZLETRON_METRICS_BENCH_STEPS` rows (default 1,000) of `loss` (params: lr, hidden,
//! optimizer, seed), under this build's target folder (reused while its `complete` marker is
//! there). Issue 32's second shape is many small runs, where per-run overhead dominates:
//! `PUZZLETRON_METRICS_BENCH_RUNS=100000 PUZZLETRON_METRICS_BENCH_STEPS=100`. Then, each as a
//! child process timed (wall) with its peak RSS from `wait4`:
//! - `stream`: `MetricsExt::write_metric_parquet` (bounded memory);
//! - `table`: `MetricsExt::metric_table` then `MetricTable::write_parquet` (all rows in memory);
//! - `pandas`: the same records and metric files read with `pandas.read_csv` per run, params and
//!   `job_key` added, `pd.concat`, `DataFrame.to_parquet` (pyarrow, Snappy).
//!
//! pandas and pyarrow (pinned) are pip-installed into `target/metrics-bench-venv` on first use;
//! when that fails the comparison is skipped with a message. `PUZZLETRON_METRICS_BENCH_SAMPLES`
//! (default 3) samples each, medians shown (`PUZZLETRON_METRICS_BENCH_PEER_SAMPLES` for pandas
//! alone). `cargo bench --bench metrics_table`. Not criterion: one sample is a whole process.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/process.rs"]
mod process;
use process::load;

use puzzletron::{JobResult, Run};
use puzzletron::{Orchestrator, job, metrics::MetricsExt, store::FsStore};
use serde::{Deserialize, Serialize};

/// Rows of `loss` each run logs: `PUZZLETRON_METRICS_BENCH_STEPS`, default 1,000.
fn steps() -> i64 {
    std::env::var("PUZZLETRON_METRICS_BENCH_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}
const PANDAS: &str = "pandas==2.2.3";
const PYARROW: &str = "pyarrow==18.1.0";

#[derive(Clone, Serialize, Deserialize)]
struct Params {
    lr: f64,
    hidden: u32,
    optimizer: String,
    seed: u64,
}

fn train(p: &Params, run: &mut Run) -> JobResult {
    for step in 0..steps() {
        run.log(
            "loss",
            step,
            p.lr / (1.0 + step as f64) + p.seed as f64 * 1e-6,
        )?;
    }
    Ok(())
}

/// The pandas peer: what a Python user writes to get the same table.
const PANDAS_SCRIPT: &str = r#"
import json, os, sys
import pandas as pd
root, out, metric = sys.argv[1:4]
jobs = os.path.join(root, "jobs")
recs = []
for k in os.listdir(jobs):
    try:
        with open(os.path.join(jobs, k, "record.json")) as f:
            rec = json.load(f)
    except FileNotFoundError:
        continue
    m = rec.get("metrics")
    if rec.get("status") == "done" and m and metric in m["names"]:
        recs.append(rec)
recs.sort(key=lambda r: (r.get("finished_at") or 0.0, r["key"]))
frames = []
for rec in recs:
    m = rec["metrics"]
    df = pd.read_csv(os.path.join(jobs, rec["key"], m["file"]), sep="\t", header=None,
                     names=["metric", "step", "value"], nrows=m["rows"])
    df = df[df["metric"] == metric].drop(columns="metric")
    for k, v in rec["params"].items():
        df[k] = v
    df["job_key"] = rec["key"]
    frames.append(df)
t = pd.concat(frames, ignore_index=True)
t.to_parquet(out, engine="pyarrow", compression="snappy", index=False)
print(len(t))
"#;

/// Runs `bin args` with stdout to `stdout`; returns (wall time, CPU time (user + system, all
/// threads), peak RSS in MB, exit code).
fn measure(bin: &Path, args: &[&str], stdout: &Path) -> (Duration, Duration, f64, i32) {
    let out = File::create(stdout).expect("stdout file");
    let m = process::measure(
        Command::new(bin)
            .args(args)
            .stdout(Stdio::from(out))
            .stderr(Stdio::inherit()),
    );
    (m.wall, m.cpu, m.rss_mb, m.code)
}

/// Medians of (wall, CPU, RSS), each on its own.
fn median(v: &[(Duration, Duration, f64)]) -> (Duration, Duration, f64) {
    let mut w: Vec<Duration> = v.iter().map(|x| x.0).collect();
    let mut c: Vec<Duration> = v.iter().map(|x| x.1).collect();
    let mut m: Vec<f64> = v.iter().map(|x| x.2).collect();
    w.sort();
    c.sort();
    m.sort_by(|a, b| a.total_cmp(b));
    (w[w.len() / 2], c[c.len() / 2], m[m.len() / 2])
}

/// The child: one way of writing `loss` of the store at `root` to `out`; prints the row count.
fn child(mode: &str, root: &str, out: &str) {
    let store = FsStore::open(root).expect("open store");
    let rows = match mode {
        "stream" => store
            .write_metric_parquet("loss", Path::new(out))
            .expect("write_metric_parquet"),
        "table" => {
            let t = store.metric_table("loss").expect("metric_table");
            t.write_parquet(out).expect("write_parquet");
            t.num_rows() as u64
        }
        other => panic!("unknown mode {other}"),
    };
    println!("{rows}");
}

/// Drops `owned.items` from the records of `keys` in `store`: the bench job lives inside
/// puzzletron, so its owned code is the whole crate (about 1,900 items, 380 KB per record),
/// where a user's job in its own crate records a few. Neither table path reads the field.
fn slim_records(store: &Path, keys: &[puzzletron::identity::Hash]) {
    for key in keys {
        let rec = store.join("jobs").join(key.to_hex()).join("record.json");
        let Ok(text) = std::fs::read(&rec) else {
            continue;
        };
        let mut v: serde_json::Value = serde_json::from_slice(&text).expect("record JSON");
        let Some(items) = v.pointer_mut("/owned/items") else {
            continue;
        };
        if items.as_object().is_some_and(|m| m.is_empty()) {
            continue;
        }
        *items = serde_json::json!({});
        std::fs::write(&rec, serde_json::to_vec_pretty(&v).expect("JSON")).expect("record");
    }
}

fn build_store(root: &Path, runs: u64) {
    if root.join("complete").is_file() {
        return;
    }
    let _ = std::fs::remove_dir_all(root);
    std::fs::create_dir_all(root).expect("bench folder");
    let t = Instant::now();
    let j = job!(train);
    // In chunks, slimming each, so that the full records never pile up on disk.
    for chunk in (0..runs).collect::<Vec<_>>().chunks(500) {
        let mut o = Orchestrator::builder()
            .store_root(root.join("store"))
            .build()
            .expect("orchestrator");
        let mut keys = Vec::with_capacity(chunk.len());
        for &i in chunk {
            let p = Params {
                lr: 1e-3 * (1 + i % 7) as f64,
                hidden: 64 << (i % 4),
                optimizer: ["adamw", "sgd", "lion"][(i % 3) as usize].to_string(),
                seed: i,
            };
            keys.push(o.run(&j, p).expect("enqueue"));
        }
        o.drain().unwrap_or_else(|f| panic!("{f}"));
        slim_records(&root.join("store"), &keys);
    }
    std::fs::write(root.join("complete"), b"").expect("marker");
    println!(
        "metrics_table: built a store of {runs} runs x {} rows in {:.1} s",
        steps(),
        t.elapsed().as_secs_f64()
    );
}

/// The venv's python with pinned pandas and pyarrow, installed on first use; `None` (with a
/// message) when pip cannot install them.
fn python() -> Option<PathBuf> {
    if std::env::var_os("PUZZLETRON_BENCH_NO_PANDAS").is_some() {
        return None;
    }
    // The target folder, as `support::target_dir` finds it: `CARGO_TARGET_DIR` when set.
    let venv = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("metrics-bench-venv");
    let py = venv.join("bin/python");
    let ready = |py: &Path| {
        Command::new(py)
            .args(["-c", "import pandas, pyarrow"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if ready(&py) {
        return Some(py);
    }
    eprintln!(
        "installing {PANDAS} {PYARROW} into {} (pip) ...",
        venv.display()
    );
    let ok = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .is_ok_and(|s| s.success())
        && Command::new(venv.join("bin/pip"))
            .args(["install", "-q", PANDAS, PYARROW])
            .status()
            .is_ok_and(|s| s.success());
    if !ok || !ready(&py) {
        eprintln!("SKIP pandas: could not pip install {PANDAS} {PYARROW}");
        return None;
    }
    Some(py)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--child") => return child(&args[2], &args[3], &args[4]),
        Some("--build") => return build_store(Path::new(&args[2]), args[3].parse().expect("runs")),
        _ => {}
    }
    if args
        .iter()
        .skip(1)
        .any(|a| !a.starts_with('-') && !"metrics_table".contains(a.as_str()))
    {
        return;
    }
    let runs: u64 = std::env::var("PUZZLETRON_METRICS_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let samples: usize = std::env::var("PUZZLETRON_METRICS_BENCH_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    // The peer's samples: pandas reads 100k small files in minutes, not seconds.
    let peer_samples: usize = std::env::var("PUZZLETRON_METRICS_BENCH_PEER_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(samples)
        .max(1);
    let steps = steps();
    let folder = if steps == 1000 {
        runs.to_string()
    } else {
        format!("{runs}x{steps}")
    };
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("metrics_table_bench/{folder}"));
    let me = std::env::current_exe().expect("bench binary");
    // In a child: Linux counts a forked child's copy of the parent's pages in the child's peak
    // RSS (until exec), so the parent must stay small for wait4's figures to be the children's.
    let ok = Command::new(&me)
        .arg("--build")
        .arg(&root)
        .arg(runs.to_string())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "building the bench store in {} failed", root.display());
    let store = root.join("store");
    let s = store.to_str().expect("utf-8 target path");
    let rows = (runs as i64 * steps) as u64;
    println!(
        "metrics_table: {runs} runs x {steps} steps = {rows} rows, load {}",
        load()
    );
    let mut results: Vec<(&str, Duration, Duration, f64)> = Vec::new();
    let mut cases: Vec<(&str, PathBuf, Vec<String>)> = ["stream", "table"]
        .iter()
        .map(|m| {
            let out = root.join(format!("{m}.parquet"));
            let a = vec![
                "--child".to_string(),
                m.to_string(),
                s.to_string(),
                out.to_string_lossy().into_owned(),
            ];
            (*m, me.clone(), a)
        })
        .collect();
    if let Some(py) = python() {
        let out = root.join("pandas.parquet");
        cases.push((
            "pandas",
            py,
            vec![
                "-c".into(),
                PANDAS_SCRIPT.into(),
                s.into(),
                out.to_string_lossy().into_owned(),
                "loss".into(),
            ],
        ));
    }
    for (name, bin, a) in &cases {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let printed = root.join(format!("{name}.stdout"));
        let mut v = Vec::new();
        let n = if *name == "pandas" {
            peer_samples
        } else {
            samples
        };
        for _ in 0..n {
            let (wall, cpu, rss, code) = measure(bin, &a, &printed);
            assert_eq!(code, 0, "{name} exited {code}");
            let n = std::fs::read_to_string(&printed).unwrap_or_default();
            assert_eq!(n.trim(), rows.to_string(), "{name}: rows written");
            v.push((wall, cpu, rss));
        }
        let (wall, cpu, rss) = median(&v);
        println!(
            "  {name:<7} median {:7.3} s wall, {:7.3} s CPU, peak RSS {:7.1} MB  ({n} runs, load {})",
            wall.as_secs_f64(),
            cpu.as_secs_f64(),
            rss,
            load()
        );
        results.push((name, wall, cpu, rss));
    }
    let get = |n: &str| results.iter().find(|r| r.0 == n).map(|r| (r.1, r.2, r.3));
    if let Some((pw, pc, prss)) = get("pandas") {
        for m in ["stream", "table"] {
            if let Some((w, c, rss)) = get(m) {
                println!(
                    "  {m} vs pandas+pyarrow: {:.1}x faster (wall), {:.1}x less CPU, {:.1}x less memory (goals: stream >= 8x and < 500 MB at 10k x 1k (issue 13), >= 20x and < 100 MB (issue 32))",
                    pw.as_secs_f64() / w.as_secs_f64(),
                    pc.as_secs_f64() / c.as_secs_f64(),
                    prss / rss
                );
            }
        }
    }
}
