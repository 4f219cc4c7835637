//! Identity and planning speed (issue: sweeps end to end).
//!
//! - `job_key/10_field_struct`: canonical JSON + SHA-256 of a 10-field params struct, with the
//!   owned digest baked in by `job!` (target < 2 us);
//! - `compiled_owned/this_bench`: `CompiledCode::owned()`, the once-per-job cost of turning the
//!   baked item digests into the owned digest;
//! - `owned_digest/50k_lines` vs `sha256sum/50k_lines`: token-wise digest of a generated 50k-line
//!   source tree and coreutils' sha256sum over the same files, in the same run (target ratio >= 0.8);
//! - `enqueue_plan_100k/{memory,memory_vec_params,fs_empty}`: enqueue 100k runs and plan them
//!   (target < 1 s); `memory_vec_params` has Vec fields, which `run()`'s determinism check
//!   inspects;
//! - `cache_hits_10k/{fs_enqueue_drain,fs_enqueue_plan}`: a sweep of 10k done runs on `FsStore`,
//!   enqueued and drained (all hits), or planned.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use puzzletron::identity::{self, Modules, OwnedCode};
use puzzletron::{Job, JobResult, Run};
use puzzletron::{Orchestrator, job, store::MemoryStore};
use serde::{Deserialize, Serialize};

#[allow(
    dead_code,
    unused_imports,
    reason = "the shared bench support; this bench uses the ten-field parameters"
)]
mod support;
use support::params10::{Params10, p10};

/// Params with sequences, which the determinism check of `run()` must look at (a HashSet there
/// would be refused): 2 Vec fields of 2+ elements.
#[derive(Clone, Serialize, Deserialize)]
struct ParamsSeq {
    lr: f64,
    betas: Vec<f64>,
    layers: Vec<u32>,
    seed: u64,
}

fn pseq(i: u64) -> ParamsSeq {
    ParamsSeq {
        lr: 1e-3 * (1 + i % 7) as f64,
        betas: vec![0.9, 0.999],
        layers: vec![256, 256, 128],
        seed: i,
    }
}

fn noop_seq(_: &ParamsSeq, _: &mut Run) -> JobResult {
    Ok(())
}

fn noop(_: &Params10, _: &mut Run) -> JobResult {
    Ok(())
}

fn job_key(c: &mut Criterion) {
    let j: Job<Params10> = job!(noop);
    let code = j.code().unwrap();
    let owned = code.owned().digest;
    let p = p10(3);
    c.bench_function("job_key/10_field_struct", |b| {
        b.iter(|| {
            let json = identity::canonical_json(std::hint::black_box(&p)).unwrap();
            identity::job_key("bench::train", &json, &owned)
        })
    });
    eprintln!("compiled closure of noop: {} items", code.items.len());
    c.bench_function("compiled_owned/this_bench", |b| {
        b.iter(|| std::hint::black_box(code).owned())
    });
}

/// A generated crate of ~50k lines of Rust-like code with comments, in `dir`.
fn generate_tree(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for m in 0..50 {
        let mut s = String::new();
        for f in 0..100 {
            s.push_str(&format!(
                "/// Computes step {f} of module {m}.\n/// It is documented at length.\npub fn f_{m}_{f}(x: &[f64], lr: f64) -> Vec<f64> {{\n    // scale, then shift\n    let mut out = Vec::with_capacity(x.len());\n    for (i, v) in x.iter().enumerate() {{\n        out.push(v * lr + i as f64 * {f}.5 - \"s{m}\".len() as f64);\n    }}\n    out\n}}\n\n"
            ));
        }
        let p = dir.join("src").join(format!("m{m}.rs"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, s).unwrap();
        files.push(p);
    }
    std::fs::write(dir.join("src/lib.rs"), "pub mod m0;\n").unwrap();
    files.push(dir.join("src/lib.rs"));
    files
}

fn owned_digest(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let files = generate_tree(dir.path());
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    let lines: usize = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap().lines().count())
        .sum();
    eprintln!(
        "generated tree: {} files, {lines} lines, {bytes} bytes",
        files.len()
    );
    let code = OwnedCode::new(dir.path(), "src/lib.rs", Modules::all());
    let mut g = c.benchmark_group("tree_50k_lines");
    g.throughput(Throughput::Bytes(bytes));
    g.sample_size(20);
    g.bench_function("owned_digest", |b| {
        b.iter(|| identity::owned_digest_uncached(&code).unwrap())
    });
    g.bench_function("sha256sum", |b| {
        b.iter(|| {
            let out = Command::new("sha256sum").args(&files).output().unwrap();
            assert!(out.status.success());
            out
        })
    });
    g.finish();
}

fn enqueue_plan(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let job: Job<Params10> = job!(noop);
    let mut g = c.benchmark_group("enqueue_plan_100k");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(15));
    g.bench_function("memory", |b| {
        b.iter_batched(
            || {
                Orchestrator::builder()
                    .store(MemoryStore::new())
                    .build()
                    .unwrap()
            },
            |mut o| {
                for i in 0..100_000 {
                    o.run(&job, p10(i)).unwrap();
                }
                let plan = o.plan().unwrap();
                assert_eq!(plan.decisions.len(), 100_000);
                plan
            },
            BatchSize::PerIteration,
        )
    });
    // Sequences in the params: the determinism check proves each sequence path once (20 round
    // trips on the first run), then only parses each run's JSON to find its paths.
    let job_seq: Job<ParamsSeq> = job!(noop_seq);
    g.bench_function("memory_vec_params", |b| {
        b.iter_batched(
            || {
                Orchestrator::builder()
                    .store(MemoryStore::new())
                    .build()
                    .unwrap()
            },
            |mut o| {
                for i in 0..100_000 {
                    o.run(&job_seq, pseq(i)).unwrap();
                }
                let plan = o.plan().unwrap();
                assert_eq!(plan.decisions.len(), 100_000);
                plan
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("fs_empty", |b| {
        b.iter_batched(
            || {
                let root = dir.path().join(format!("store-{}", std::process::id()));
                let _ = std::fs::remove_dir_all(&root);
                Orchestrator::builder().store_root(root).build().unwrap()
            },
            |mut o| {
                for i in 0..100_000 {
                    o.run(&job, p10(i)).unwrap();
                }
                let plan = o.plan().unwrap();
                assert_eq!(plan.decisions.len(), 100_000);
                plan
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

#[derive(Serialize, Deserialize)]
struct One {
    i: u32,
}

fn one(p: &One, run: &mut Run) -> JobResult {
    run.log("x", 0, f64::from(p.i))?;
    Ok(())
}

/// Cache hits on `FsStore`, in process: enqueue + drain, and enqueue + plan, of 10k done runs
/// (issue 13: < 10 us per hit, a plan < 100 ms). `benches/hot_paths.rs` has the same figures
/// per process, against joblib and Snakemake.
fn cache_hits(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("done");
    // A small user crate (see benches/hot_paths.rs): `job!` here would cover all of
    // puzzletron, a 375 KB record per run.
    let krate = dir.path().join("crate");
    std::fs::create_dir_all(krate.join("src")).unwrap();
    std::fs::write(krate.join("Cargo.lock"), "version = 4\n").unwrap();
    std::fs::write(krate.join("src/lib.rs"), "pub fn one() {}\n").unwrap();
    let job: Job<One> = Job::new("bench::one", "bench", &krate, "src/lib.rs", one);
    let n = 10_000;
    let sweep = || {
        let mut o = Orchestrator::builder().store_root(&root).build().unwrap();
        for i in 0..n {
            o.run(&job, One { i }).unwrap();
        }
        o
    };
    assert_eq!(sweep().drain().unwrap().ran(), n as usize);
    let mut g = c.benchmark_group("cache_hits_10k");
    g.sample_size(10);
    g.throughput(Throughput::Elements(u64::from(n)));
    g.bench_function("fs_enqueue_drain", |b| {
        b.iter(|| {
            let s = sweep().drain().unwrap();
            assert_eq!(s.skipped(), n as usize);
            s
        })
    });
    g.bench_function("fs_enqueue_plan", |b| {
        b.iter(|| {
            let plan = sweep().plan().unwrap();
            assert_eq!(plan.count(puzzletron::Action::Skip), n as usize);
            plan
        })
    });
    g.finish();
}

criterion_group!(benches, job_key, owned_digest, enqueue_plan, cache_hits);
criterion_main!(benches);
