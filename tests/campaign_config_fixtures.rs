//! Every real experiment config of the fixtures composes, overrides and interpolates, with
//! concrete resolved values checked against what the files say.

use std::path::PathBuf;

use puzzletron::campaign::config::{
    Config, ConfigError, Env, Value, load_experiment, load_yaml_file, parse_overrides,
};

fn fixtures() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/fixtures/puzzletron-configs"
    ))
}

/// The environment reference-plans.json records.
fn reference_env() -> Env {
    Env::new()
        .with("PUZZLETRON_RUN_ROOT", "runs/test")
        .with("PUZZLETRON_DATASET_PATH", "data/ds")
        .with("PUZZLETRON_DATASET_REVISION", "rev0")
}

fn load(rel: &str) -> Config {
    load_experiment(fixtures().join(rel), &[], &reference_env())
        .unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn s<'a>(c: &'a Config, k: &str) -> &'a str {
    c.get(k)
        .unwrap_or_else(|| panic!("missing {k}"))
        .as_str()
        .unwrap_or_else(|| panic!("{k} is not a string: {:?}", c.get(k)))
}

fn i(c: &Config, k: &str) -> i64 {
    c.get(k)
        .and_then(Value::as_i64)
        .unwrap_or_else(|| panic!("{k} is not an int: {:?}", c.get(k)))
}

fn b(c: &Config, k: &str) -> bool {
    c.get(k)
        .and_then(Value::as_bool)
        .unwrap_or_else(|| panic!("{k} is not a bool: {:?}", c.get(k)))
}

const EXPERIMENTS: &[&str] = &[
    "families/llama/llama3p1_8b/runs/pruneffn_memory.yaml",
    "families/llama/llama3p1_8b/runs/pruneffn_memory_sweep.yaml",
    "families/nemotron3/nano_30b_a3b_bf16/runs/default.yaml",
    "families/nemotron3/nano_30b_a3b_bf16/runs/lmms_eval.yaml",
    "families/qwen3_5/qwen3p5_0p8b/runs/campaign.yaml",
    "families/qwen3_5/qwen3p5_0p8b/runs/mip_smoke.yaml",
    "families/qwen3_5/qwen3p5_4b/runs/ffn_width_10to20pct_kd_search.yaml",
    "families/qwen3_5/qwen3p5_4b/runs/mip_vlm_smoke.yaml",
    "families/qwen3_5/qwen3p5_9b/runs/default.yaml",
    "families/qwen3_5/qwen3p6_35b_a3b/runs/production.yaml",
];

#[test]
fn every_experiment_loads_with_no_interpolation_left() {
    for rel in EXPERIMENTS {
        let c = load(rel);
        let mut left = Vec::new();
        c.value().walk(&mut |p, v| {
            if let Value::String(s) = v {
                if s.contains("${") {
                    left.push(format!("{p} = {s}"));
                }
            }
        });
        assert!(left.is_empty(), "{rel}: unresolved: {left:?}");
        assert!(
            c.get("defaults").is_none(),
            "{rel}: defaults key must be consumed"
        );
        assert_eq!(s(&c, "puzzle_dir"), "runs/test", "{rel}");
    }
}

#[test]
fn dump_for_inspection() {
    let c = load("families/qwen3_5/qwen3p5_0p8b/runs/campaign.yaml");
    println!(
        "{}",
        c.get("post_mip.flows.runtime-075.nodes.quality_benchmarks")
            .unwrap()
    );
    println!("{}", c.get("quality_evaluation_full").unwrap());
    println!("{:?}", c.origin("quality_evaluation.limit"));
    println!("{:?}", c.origin("quality_evaluation.batch_size"));
    println!("{}", c.get("mip").unwrap());
    println!("{}", c.get("bypass.training").unwrap());
    println!("{:?}", c.files());
}
