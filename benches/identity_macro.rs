//! The compile time `job!` adds: a generated 50k-line crate with 10 jobs, built by cargo with
//! `job!` (compile-time closure analysis) and with `Job::new` (no analysis), each after touching
//! its `main.rs`, in the same run; reports the medians and their difference (target < 2 s),
//! twice: with the default dev profile, where proc macros are compiled unoptimised, and with
//! `[profile.dev.build-override] opt-level = 3`, the setting the README recommends. A rebuild
//! finds every file's index in the macro's per-file cache (`target/debug/puzzletron-macros-cache`,
//! keyed by the file's bytes); the build with that cache emptied first (a first build, or one
//! after `cargo clean` or a Cargo.lock change) is reported too.
//!
//! Not criterion (one sample is a whole rustc run of several seconds): `cargo bench --bench
//! identity_macro` prints the figures. `PUZZLETRON_MACRO_BENCH_SAMPLES` (default 3) sets the
//! samples per variant. The first run builds puzzletron's dependencies into a persistent target
//! folder under this build's target dir.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const MODULES: usize = 50;
const FNS: usize = 100;
const JOBS: usize = 10;

/// Writes the generated crate into `dir`. It depends on puzzletron as a user does, by version
/// (a registry crate, which `job!` does not analyse: Cargo.lock witnesses it); a
/// `[patch.crates-io]` points that version at this checkout, so no network is needed. Each variant has its own package name, so that
/// building one does not overwrite the other's artifacts in the shared target folder.
/// `optimized_macros` adds `[profile.dev.build-override] opt-level = 3` (the README's advice:
/// proc macros and build scripts compiled optimised).
fn generate(dir: &Path, with_macro: bool, optimized_macros: bool) {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let name = format!(
        "gen_{}_{}",
        if with_macro { "with" } else { "without" },
        if optimized_macros { "opt" } else { "dev" }
    );
    let profile = if optimized_macros {
        "\n[profile.dev.build-override]\nopt-level = 3\n"
    } else {
        ""
    };
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n[dependencies]\n\
             puzzletron = {{ version = \"{}\", default-features = false }}\n\
             serde = {{ version = \"1\", features = [\"derive\"] }}\n\n[workspace]\n{profile}\n\
             [patch.crates-io]\npuzzletron = {{ path = \"{}\" }}\n",
            env!("CARGO_PKG_VERSION"),
            env!("CARGO_MANIFEST_DIR")
        ),
    )
    .unwrap();
    let mut main = String::from("#![allow(dead_code)]\nuse puzzletron::{Job, JobResult, Run};\n");
    for m in 0..MODULES {
        main.push_str(&format!("mod m{m};\n"));
        let mut s = String::new();
        for f in 0..FNS {
            // ~10 lines per function, each calling the next one of its module.
            let next = if f + 1 < FNS {
                format!("f_{m}_{}(&out, lr)", f + 1)
            } else {
                "out".to_string()
            };
            s.push_str(&format!(
                "/// Computes step {f} of module {m}.\npub fn f_{m}_{f}(x: &[f64], lr: f64) -> Vec<f64> {{\n    // scale, then shift\n    let mut out = Vec::with_capacity(x.len());\n    for (i, v) in x.iter().enumerate() {{\n        out.push(v * lr + i as f64 * {f}.5);\n    }}\n    if out.len() > 1_000_000 {{ return {next}; }}\n    out\n}}\n\n"
            ));
        }
        std::fs::write(src.join(format!("m{m}.rs")), s).unwrap();
    }
    main.push_str("#[derive(serde::Serialize, serde::Deserialize)]\npub struct P { lr: f64 }\n");
    for j in 0..JOBS {
        main.push_str(&format!(
            "fn job{j}(p: &P, run: &mut Run) -> JobResult {{\n    let v = m{}::f_{}_0(&[1.0, 2.0], p.lr);\n    run.log(\"v\", 0, v[0])?;\n    Ok(())\n}}\n",
            j * (MODULES / JOBS),
            j * (MODULES / JOBS)
        ));
    }
    main.push_str("fn main() {\n    let jobs: Vec<Job<P>> = vec![\n");
    for j in 0..JOBS {
        if with_macro {
            main.push_str(&format!("        puzzletron::job!(job{j}),\n"));
        } else {
            main.push_str(&format!(
                "        Job::new(\"gen::job{j}\", \"gen\", env!(\"CARGO_MANIFEST_DIR\"), file!(), job{j}),\n"
            ));
        }
    }
    main.push_str("    ];\n    println!(\"{}\", jobs.len());\n}\n");
    std::fs::write(src.join("main.rs"), main).unwrap();
}

/// User + system CPU time of this process's waited-for children so far.
fn children_cpu() -> Duration {
    // SAFETY: getrusage only writes the zeroed struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// One build: (wall time, CPU time of cargo and the rustc it ran). The CPU time is what to
/// compare on a loaded machine, where wall times mostly measure the other users.
fn build(dir: &Path, target: &Path) -> (Duration, Duration) {
    // Touch main.rs so only this crate recompiles.
    let main = dir.join("src/main.rs");
    let text = std::fs::read(&main).unwrap();
    std::fs::write(&main, text).unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let cpu = children_cpu();
    let t = Instant::now();
    let out = Command::new(cargo)
        .args(["build", "--offline", "--quiet"])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target)
        .output()
        .unwrap();
    let d = t.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (d, children_cpu() - cpu)
}

/// Medians of the wall and CPU times, in seconds.
fn median(v: Vec<(Duration, Duration)>) -> (f64, f64) {
    let mid = |mut x: Vec<Duration>| {
        x.sort();
        x[x.len() / 2].as_secs_f64()
    };
    (
        mid(v.iter().map(|p| p.0).collect()),
        mid(v.iter().map(|p| p.1).collect()),
    )
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let samples: usize = std::env::var("PUZZLETRON_MACRO_BENCH_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("identity-macro-bench");
    let target = base.join("target");
    for optimized in [false, true] {
        let tag = if optimized { "opt" } else { "dev" };
        let with = base.join(format!("with_macro_{tag}"));
        let without = base.join(format!("without_macro_{tag}"));
        generate(&with, true, optimized);
        generate(&without, false, optimized);
        for d in [&with, &without] {
            std::fs::copy(
                concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"),
                d.join("Cargo.lock"),
            )
            .unwrap();
        }
        let lines: usize = std::fs::read_dir(with.join("src"))
            .unwrap()
            .map(|e| {
                std::fs::read_to_string(e.unwrap().path())
                    .unwrap()
                    .lines()
                    .count()
            })
            .sum();
        // Warm-up: dependencies, and each variant once.
        build(&without, &target);
        build(&with, &target);
        let mut a = Vec::new();
        let mut b = Vec::new();
        let mut cold = Vec::new();
        let cache = target.join("debug/puzzletron-macros-cache");
        for _ in 0..samples {
            a.push(build(&without, &target));
            b.push(build(&with, &target));
            // Every entry of the index cache gone: each file parsed again. (A macro without the
            // cache, e.g. an older one measured for comparison, has none.)
            let _ = std::fs::remove_dir_all(&cache);
            cold.push(build(&with, &target));
        }
        let (a, b, cold) = (median(a), median(b), median(cold));
        let how = if optimized {
            "proc macros built with opt-level 3 (build-override)"
        } else {
            "default dev profile (proc macros unoptimised)"
        };
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!(
            "identity_macro [{how}]: generated crate {lines} lines, {JOBS} jobs (median of \
             {samples}; target < 2 s added)\n  wall: Job::new {:.2} s, job! {:.2} s, added {:.2} \
             s; job! with an empty index cache {:.2} s, added {:.2} s\n  CPU:  Job::new {:.2} s, \
             job! {:.2} s, added {:.2} s; job! with an empty index cache {:.2} s, added {:.2} s\n  \
             load average {}",
            a.0,
            b.0,
            b.0 - a.0,
            cold.0,
            cold.0 - a.0,
            a.1,
            b.1,
            b.1 - a.1,
            cold.1,
            cold.1 - a.1,
            load.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
}
