//! `puzzletron campaign status` and `campaign report` on a campaign of 100k work items (issue
//! target: status < 1 s and < 200 MB, report < 5 s).
//!
//! The campaign is the simulated one of `controller_sim` (mock executor, virtual clock, 4% of
//! first attempts failing and retried), written to a folder under this build's target dir; then
//! the real `puzzletron` binary runs `campaign status DIR`, `campaign status DIR --json` and
//! `campaign report DIR --out FILE` as child processes, each timed (wall) with its peak RSS
//! taken from `wait4`'s rusage. Medians of `PUZZLETRON_STATUS_BENCH_SAMPLES` (default 3) runs.
//!
//! Then the report's sizes (the HTML, and the attempts CSV written beside it) and, when a
//! `chromium` is on PATH, the time headless Chromium takes to load and lay out the report
//! (`--dump-dom`, wall, median of the same samples; the target: < 5 s, HTML < 5 MB).
//!
//! `cargo bench --features cli --bench campaign_status` (items: `PUZZLETRON_SIM_ITEMS`, default
//! 100000). Not criterion: one sample is a whole process.

#[path = "support/process.rs"]
mod process;
#[path = "../tests/support/mod.rs"]
mod test_support;
use test_support::sim;

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
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0) as f64 / 1e6;
    let csv = root.join("report.html.attempts.csv");
    println!(
        "  report size {:.2} MB, attempts CSV {:.1} MB{}",
        size(&out),
        size(&csv),
        if csv.is_file() { "" } else { " (not written)" }
    );
    chromium_render(&out, samples);
}

/// Times headless Chromium loading the report (`--dump-dom`), or says why it is skipped.
fn chromium_render(report: &Path, samples: usize) {
    let Some(exe) = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| {
            Command::new("which")
                .arg(c)
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
    else {
        println!("  chromium render: skipped (no chromium on PATH)");
        return;
    };
    let profile = report.with_file_name("chromium-profile");
    let url = format!("file://{}", report.display());
    let mut runs = Vec::new();
    for _ in 0..samples {
        let t = Instant::now();
        let o = Command::new(exe)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--dump-dom",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(&url)
            .stderr(Stdio::null())
            .output()
            .expect("spawn chromium");
        let wall = t.elapsed();
        let dom = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && dom.contains("id=\"report-end\""),
            "chromium did not render the report to its end: {}",
            o.status
        );
        runs.push((wall, 0.0));
    }
    let (wall, _) = median(runs);
    println!(
        "  chromium render median {:7.3} s  ({exe} --headless --dump-dom, {samples} runs)",
        wall.as_secs_f64()
    );
}
