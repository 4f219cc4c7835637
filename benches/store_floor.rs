//! The floor of `FsStore`'s per-run protocol (issue 32): the bare syscalls a run needs, with no
//! store code around them, on the file system of the target folder.
//!
//! ```text
//! cargo bench --bench store_floor        # N=10k, medians of 3; PUZZLETRON_BENCH_RUNS sets N
//! ```
//!
//! - a miss: `mkdir` of the run folder (the claim), the record written to a temp file and
//!   renamed into place, the lineage pointer as a symlink, and per batch of [`BATCH`] runs the
//!   group commit's `syncfs` (two: before and after the renames; the bare floor counts one);
//! - a hit: one `open` + `read` of the record, or one `stat` of it.
//!
//! `benches/hot_paths.rs` measures the same paths through the store; the difference is what
//! the store adds above this floor. Results go to `target/bench-results/store_floor.json`.

use std::fs;
use std::path::PathBuf;

mod floor;
use floor::{BATCH, hits, misses};

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
}

fn load() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = !args.iter().any(|a| a == "--bench");
    let n: usize = std::env::var("PUZZLETRON_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 200 } else { 10_000 });
    let reps = if quick { 1 } else { 3 };
    let base = target_dir().join(format!("bench-floor/{}", std::process::id()));
    let load_before = load();
    let mut miss = Vec::new();
    let mut hit = Vec::new();
    for r in 0..reps {
        let root = base.join(format!("store{r}"));
        // No case pays for the writeback of what another left dirty.
        // SAFETY: sync(2) takes no arguments and cannot fail.
        unsafe { libc::sync() };
        miss.push(misses(&root, n));
        hit.push(hits(&root, n));
    }
    let col = |v: &[[f64; 7]], k: usize| median(v.iter().map(|a| a[k] * 1e6).collect());
    let colh = |v: &[[f64; 2]], k: usize| median(v.iter().map(|a| a[k] * 1e6).collect());
    let m: Vec<f64> = (0..7).map(|k| col(&miss, k)).collect();
    let h: Vec<f64> = (0..2).map(|k| colh(&hit, k)).collect();
    println!(
        "store floor, {n} runs, medians of {reps}, load before {load_before}, after {}",
        load()
    );
    println!(
        "  miss floor: {:7.2} us/run (mkdir {:.2}, temp write {:.2}, symlink {:.2}, syncfs {:.2}, \
         rename {:.2}, second syncfs {:.2}; per {BATCH} runs)",
        m[6], m[0], m[1], m[2], m[3], m[4], m[5]
    );
    println!("  bare floor (one syncfs): {:7.2} us/run", m[6] - m[5]);
    println!(
        "  hit floor:  {:7.2} us/run open+read, {:.2} us/run stat",
        h[0], h[1]
    );
    let json = serde_json::json!({
        "runs": n, "reps": reps, "batch": BATCH, "load_before": load_before, "load_after": load(),
        "miss_us": m[6], "miss_one_syncfs_us": m[6] - m[5], "mkdir_us": m[0],
        "write_us": m[1], "symlink_us": m[2], "syncfs_us": m[3], "rename_us": m[4],
        "syncfs2_us": m[5], "hit_read_us": h[0], "hit_stat_us": h[1],
    });
    let out = target_dir().join("bench-results");
    let _ = fs::create_dir_all(&out);
    let _ = fs::write(out.join("store_floor.json"), json.to_string());
    let _ = fs::remove_dir_all(&base);
}
