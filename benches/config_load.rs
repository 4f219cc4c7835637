//! Config loading speed: YAML parse of the largest fixture file, and the full
//! compose + override + interpolate pipeline of the deepest fixture experiment.

use std::hint::black_box;
use std::path::{Path, PathBuf};

use criterion::{Criterion, criterion_group, criterion_main};
use puzzletron::campaign::config::{ConfigLoader, Env, load_yaml_str, parse_overrides};

fn fixtures() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/fixtures/puzzletron-configs"
    ))
}

fn bench(c: &mut Criterion) {
    let base = std::fs::read_to_string(fixtures().join("base.yaml")).expect("fixture");
    c.bench_function("yaml_parse_base_yaml", |b| {
        b.iter(|| load_yaml_str(black_box(&base), Path::new("base.yaml")).expect("parses"))
    });
    let loader = ConfigLoader::new().env(
        Env::new()
            .with("PUZZLETRON_RUN_ROOT", "runs/test")
            .with("PUZZLETRON_DATASET_PATH", "data/ds"),
    );
    let exp = fixtures().join("families/qwen3_5/qwen3p5_0p8b/runs/campaign.yaml");
    let overrides = parse_overrides(["pruning.eval_samples=16", "+execution.partition=batch"])
        .expect("valid overrides");
    c.bench_function("load_experiment_qwen0p8b_campaign_7_files", |b| {
        b.iter(|| {
            loader
                .load_experiment(black_box(&exp), &overrides)
                .expect("loads")
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
