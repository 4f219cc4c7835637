//! `puzzletron campaign status` and `campaign report` on a campaign of 100k work items (issue
//! target: status < 1 s and < 200 MB, report < 5 s).
//!
//! The campaign is the simulated one of `controller_sim` (mock executor, virtual clock, 4% of
//! first attempts failing and retried), written to a folder under this build's target dir; then
//! the real `puzzletron` binary runs `campaign status DIR`, `campaign status DIR --json` and
//! `campaign report DIR --out FILE` as child processes, each timed (wall) with its peak RSS
//! taken from `wait4`'s rusage. Medians of `PUZZLETRON_STATUS_BENCH_SAMPLES` (default 3) runs.
//!
//! `cargo bench --features cli --bench campaign_status` (items: `PUZZLETRON_SIM_ITEMS`, default
//! 100000). Not criterion: one sample is a whole process.

#[path = "support/process.rs"]
mod process;
#[path = "../tests/controller_support/sim.rs"]
mod sim;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `bin args`, returns (wall time, peak RSS in MB, exit code). Stdout is discarded.
fn measure(bin: &str, args: &[&str]) -> (Duration, f64, i32) {
    let m = process::measure(
        Command::new(bin)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    );
    (m.wall, m.rss_mb, m.code)
}

fn median(mut v: Vec<(Duration, f64)>) -> (Duration, f64) {
    v.sort_by_key(|x| x.0);
    let t = v[v.len() / 2].0;
    let mut m: Vec<f64> = v.iter().map(|x| x.1).collect();
    m.sort_by(|a, b| a.total_cmp(b));
    (t, m[m.len() / 2])
}

fn journal_mb(dir: &Path) -> f64 {
    std::fs::metadata(dir.join("controller/journal.jsonl"))
        .map(|m| m.len() as f64 / 1e6)
        .unwrap_or(0.0)
}

fn main() {
    // The simulation runs in a child of its own: a child forked from a parent that had grown
    // to the simulation's size would count that copy in its peak RSS (until its exec).
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--simulate") {
        let items: u32 = args[2].parse().expect("items");
        let dir = Path::new(&args[3]);
        let t = Instant::now();
        let r = sim::run(items, dir);
        assert!(r.report.is_complete(), "{}", r.report);
        println!(
            "campaign_status: simulated {items} items, {} attempts, journal {:.1} MB, in {:.1} s",
            r.jobs,
            journal_mb(dir),
            t.elapsed().as_secs_f64()
        );
        return;
    }
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && !"campaign_status".contains(a.as_str()))
    {
        return;
    }
    let items: u32 = std::env::var("PUZZLETRON_SIM_ITEMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let samples: usize = std::env::var("PUZZLETRON_STATUS_BENCH_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let bin = env!("CARGO_BIN_EXE_puzzletron");
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("campaign_status_bench");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).expect("bench folder");
    let dir = root.join("campaign");
    let me = std::env::current_exe().expect("bench binary");
    let ok = Command::new(me)
        .arg("--simulate")
        .arg(items.to_string())
        .arg(&dir)
        .status()
        .expect("spawn the simulation");
    assert!(ok.success(), "the simulation failed: {ok}");
    let d = dir.to_str().expect("utf-8 target path");
    let out = root.join("report.html");
    let o = out.to_str().expect("utf-8 target path");
    let cases: [(&str, Vec<&str>); 3] = [
        ("status", vec!["campaign", "status", d]),
        ("status --json", vec!["campaign", "status", d, "--json"]),
        ("report", vec!["campaign", "report", d, "--out", o]),
    ];
    for (name, args) in cases {
        let mut runs = Vec::new();
        for _ in 0..samples {
            let (wall, rss, code) = measure(bin, &args);
            // A finished campaign: status exits 0; report writes the file.
            assert_eq!(code, 0, "puzzletron {args:?} exited {code}");
            runs.push((wall, rss));
        }
        let (wall, rss) = median(runs);
        println!(
            "  {name:<14} median {:7.3} s  peak RSS {:7.1} MB  ({samples} runs)",
            wall.as_secs_f64(),
            rss
        );
    }
    let html = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    println!("  report size {:.1} MB", html as f64 / 1e6);
}
