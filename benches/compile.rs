//! Compile benchmarks: the largest fixtures (from files, and from an already resolved config),
//! and a generated plan with 10k work items (target < 50 ms).

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, criterion_group, criterion_main};
use puzzletron::campaign::config::Value;
use puzzletron::campaign::config::{ConfigLoader, Env};
use puzzletron::campaign::{
    ExecutionConfig, RunnerEnvironment, StageCatalog, compile_campaign_plan_with, compile_resolved,
};

fn fixtures() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/fixtures/puzzletron-configs"
    ))
}

fn loader() -> ConfigLoader {
    ConfigLoader::new().env(
        Env::new()
            .with("PUZZLETRON_RUN_ROOT", "runs/test")
            .with("PUZZLETRON_DATASET_PATH", "data/ds")
            .with("PUZZLETRON_DATASET_REVISION", "rev0"),
    )
}

const TRIPLES: [(&str, &str, &str, &str); 2] = [
    (
        "qwen3p6_35b_production",
        "families/qwen3_5/qwen3p6_35b_a3b/runs/production.yaml",
        "orchestration/qwen_moe/runner.slurm.yaml",
        "orchestration/qwen_moe/execution.production.yaml",
    ),
    (
        "qwen3p5_4b_kd_search",
        "families/qwen3_5/qwen3p5_4b/runs/ffn_width_10to20pct_kd_search.yaml",
        "orchestration/qwen3p5_4b/runner.slurm.yaml",
        "orchestration/qwen3p5_4b/execution.ffn_width_10to20pct_kd_search.yaml",
    ),
];

fn fixtures_bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("compile_fixture");
    for (name, exp, runner, execution) in TRIPLES {
        let runner = RunnerEnvironment::load(fixtures().join(runner)).unwrap();
        let execution = ExecutionConfig::load(fixtures().join(execution)).unwrap();
        let path = fixtures().join(exp);
        let loader = loader();
        g.bench_function(format!("{name}/from_files"), |b| {
            b.iter(|| {
                compile_campaign_plan_with(
                    &loader,
                    black_box(&path),
                    &runner,
                    &execution,
                    &[],
                    None,
                )
                .unwrap()
            })
        });
        let plan =
            compile_campaign_plan_with(&loader, &path, &runner, &execution, &[], None).unwrap();
        let catalog = StageCatalog::puzzle();
        g.bench_function(format!("{name}/resolved"), |b| {
            b.iter(|| {
                compile_resolved(
                    "bench",
                    black_box(plan.resolved_config.clone()),
                    &[],
                    &catalog,
                    &runner,
                    &execution,
                    None,
                )
                .unwrap()
            })
        });
    }
    g.finish();
}

/// 100 stages (a layered DAG: each stage needs the two previous ones), each sharded 100 ways,
/// distributed with tp=2: 10,000 work items and 10,000 torchrun groups.
fn generated_config(stages: usize, shards: u32) -> Value {
    let list = (0..stages)
        .map(|i| {
            let mut entries = vec![
                ("id".to_string(), Value::String(format!("s{i:03}"))),
                ("strategy".to_string(), Value::String("sharded".into())),
                ("instances".to_string(), Value::Int(i64::from(shards))),
                ("distributed".to_string(), Value::Bool(true)),
                ("aggregate".to_string(), Value::Bool(true)),
                (
                    "parallel".to_string(),
                    Value::Mapping(
                        vec![("tp".to_string(), Value::Int(2))]
                            .into_iter()
                            .collect(),
                    ),
                ),
                (
                    "command".to_string(),
                    Value::List(vec![
                        Value::String("python".into()),
                        Value::String("work.py".into()),
                        Value::String("{work_id}".into()),
                    ]),
                ),
            ];
            let needs: Vec<Value> = (i.saturating_sub(2)..i)
                .map(|p| Value::String(format!("s{p:03}")))
                .collect();
            entries.push(("needs".to_string(), Value::List(needs)));
            Value::Mapping(entries.into_iter().collect())
        })
        .collect();
    Value::Mapping(
        vec![
            ("puzzle_dir".into(), Value::String("runs/gen".into())),
            ("stages".into(), Value::List(list)),
        ]
        .into_iter()
        .collect(),
    )
}

fn generated_bench(c: &mut Criterion) {
    let config = generated_config(100, 100);
    let catalog = StageCatalog::from_config("gen", &config).unwrap();
    let runner = RunnerEnvironment::from_value(
        "runner",
        &Value::from_json(
            &serde_json::json!({"runner": {"kind": "slurm", "slurm": {"partition": "batch"}}}),
        ),
    )
    .unwrap();
    let execution = ExecutionConfig::default();
    let plan = compile_resolved(
        "gen",
        config.clone(),
        &[],
        &catalog,
        &runner,
        &execution,
        None,
    )
    .unwrap();
    assert_eq!(plan.work_item_count(), 10_000);
    c.bench_function("compile_generated/10k_work_items", |b| {
        b.iter(|| {
            compile_resolved(
                "gen",
                black_box(config.clone()),
                &[],
                &catalog,
                &runner,
                &execution,
                None,
            )
            .unwrap()
        })
    });
}

criterion_group!(benches, fixtures_bench, generated_bench);
criterion_main!(benches);
