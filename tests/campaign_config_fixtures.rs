//! Every real experiment config of the fixtures composes, overrides and interpolates, with
//! concrete resolved values checked against what the files say.

mod support;
use support::plan::fixtures;

use puzzletron::campaign::config::{
    Config, ConfigError, Env, Value, load_experiment, load_yaml_file, parse_overrides,
};

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
            if let Value::String(s) = v
                && s.contains("${")
            {
                left.push(format!("{p} = {s}"));
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
fn qwen_0p8b_campaign_four_level_chain_merge_keys_and_whole_value_interpolation() {
    let c = load("families/qwen3_5/qwen3p5_0p8b/runs/campaign.yaml");
    // campaign -> mip_smoke -> base/family/model, then advanced -> model, quality_evaluation.
    assert_eq!(s(&c, "display_name"), "Qwen3p5 0.8B text pruning campaign");
    assert_eq!(s(&c, "input_hf_model_path"), "Qwen/Qwen3.5-0.8B");
    assert_eq!(
        s(&c, "model.revision"),
        "2fc06364715b967f1860aea9cf38778875588b17"
    );
    assert_eq!(s(&c, "teacher_dir"), "runs/test/ckpts/teacher");
    assert_eq!(
        s(&c, "train_token_cache_path"),
        "runs/test/dataset_cache/train_4096x4096.tokens"
    );
    assert_eq!(
        s(&c, "tokenize_data.caches.1.output"),
        "runs/test/dataset_cache/validation_128x4096.tokens"
    );
    // advanced.yaml (after model.yaml) wins for the axis values; campaign.yaml for widths.
    assert_eq!(
        c.get("search_space.axes.ffn_intermediate.values")
            .unwrap()
            .as_list()
            .unwrap()
            .len(),
        5
    );
    assert_eq!(i(&c, "embedding_pruning.widths.1"), 768);
    assert_eq!(i(&c, "pruning.eval_samples"), 4096);
    // base.yaml value that mip_smoke/campaign never touch.
    assert_eq!(i(&c, "pruning.shuffle_seed"), 444);
    // `<<: *quality_evaluation_common` plus explicit keys.
    assert_eq!(i(&c, "quality_evaluation.limit"), 256);
    assert_eq!(s(&c, "quality_evaluation.model"), "vllm");
    assert!(c.get("quality_evaluation_full.limit").unwrap().is_null());
    assert_eq!(
        s(&c, "quality_evaluation_full.reference_checkpoint"),
        "runs/test/ckpts/teacher"
    );
    // `config: ${quality_evaluation}` keeps the mapping.
    let qb = c
        .get("post_mip.flows.runtime-075.nodes.quality_benchmarks.config")
        .unwrap();
    assert_eq!(qb, c.get("quality_evaluation").unwrap());
    assert_eq!(qb.get("topology.gpu_group_size"), Some(&Value::Int(1)));
    // Anchors inside one file.
    assert_eq!(i(&c, "mip.runs.memory-075.solver.num_solutions"), 8);
    assert_eq!(c.get("mip.runs.params-90"), Some(&Value::Bool(false)));
    // `${to_path:...}` and nested interpolation.
    assert_eq!(
        s(&c, "mip.canonical_solutions_path"),
        "runs/test/single_subblock_replacement_solutions.json"
    );
    assert_eq!(i(&c, "data.calibration.num_samples"), 4096);
    assert_eq!(
        c.get("bypass.training.learning_rate"),
        Some(&Value::Float(0.0003))
    );
    assert_eq!(
        c.get("bypass.training.min_lr_factor"),
        Some(&Value::Float(1e-5))
    );
    assert_eq!(c.get("bypass.best_val_loss"), Some(&Value::Float(1e9)));
    assert!(
        c.get("data.packing").unwrap().is_null(),
        "mip_smoke sets packing to null"
    );
    assert_eq!(i(&c, "execution.gpus_per_node"), 1);
    assert_eq!(c.files().len(), 7);
}

#[test]
fn qwen_0p8b_mip_smoke() {
    let c = load("families/qwen3_5/qwen3p5_0p8b/runs/mip_smoke.yaml");
    assert_eq!(s(&c, "dataset_path"), "data/ds");
    assert_eq!(s(&c, "pruning.dataset_path"), "data/ds");
    assert_eq!(i(&c, "pruning.block_size"), 512);
    assert_eq!(i(&c, "data.calibration.seq_len"), 512);
    assert_eq!(s(&c, "family.name"), "qwen3_5");
    assert_eq!(
        s(&c, "pruning.activation_passes.0.hook_class"),
        "modelopt.torch.prune.importance_hooks.base_hooks.IterativeChannelContributionHook"
    );
    assert!(!b(&c, "bypass.enabled"));
    assert_eq!(s(&c, "mip.runs.params-90.constraints.params.max"), "90%");
    assert!(
        c.get("post_mip.flows")
            .unwrap()
            .as_mapping()
            .unwrap()
            .is_empty()
    );
}

#[test]
fn qwen_4b_kd_search_anchors_merges_and_required_env() {
    let c = load("families/qwen3_5/qwen3p5_4b/runs/ffn_width_10to20pct_kd_search.yaml");
    assert_eq!(s(&c, "data.revision"), "rev0");
    assert_eq!(
        s(&c, "data.processor_identity"),
        "Qwen/Qwen3.5-4B@851bf6e806efd8d0a36b00ddf55e13ccb7b8cd0a"
    );
    let nodes = "post_mip.flows.candidate-evaluation.nodes";
    assert_eq!(
        i(
            &c,
            &format!("{nodes}.screening_kd.config.automodel.parallel.tp")
        ),
        2
    );
    // `<<: *screening_kd_config` with overrides of two keys.
    assert_eq!(i(&c, &format!("{nodes}.global_kd.config.max_steps")), 256);
    assert_eq!(i(&c, &format!("{nodes}.global_kd.config.seed")), 1111);
    assert_eq!(
        i(
            &c,
            &format!("{nodes}.global_kd.config.automodel.parallel.tp")
        ),
        2
    );
    assert_eq!(
        s(&c, &format!("{nodes}.global_kd.model_source")),
        "materialized"
    );
    assert_eq!(
        s(
            &c,
            &format!("{nodes}.quality_benchmarks.config.reference_checkpoint")
        ),
        "runs/test/ckpts/teacher"
    );
    assert_eq!(
        i(
            &c,
            &format!("{nodes}.quality_benchmarks.config.limit_mm_per_prompt.image")
        ),
        12
    );
    assert_eq!(
        s(
            &c,
            &format!("{nodes}.serving.config.topology.extra_vllm_args.3")
        ),
        "0.7"
    );
    assert_eq!(
        s(
            &c,
            &format!("{nodes}.serving.config.topology.extra_vllm_args.7")
        ),
        r#"{"enable_thinking": false}"#
    );
    // Alias of an anchor defined in the same file.
    assert_eq!(
        c.get("global_distillation.objective.main_kd.chunk_size"),
        Some(&Value::Int(64))
    );
    assert_eq!(c.get("mip.runs.params-80"), Some(&Value::Bool(false)));
    assert_eq!(i(&c, "pruning.intermediate_size_list.2"), 5120);

    // Without the env vars the file requires, the error names the variable and the file.
    let e = load_experiment(
        fixtures().join("families/qwen3_5/qwen3p5_4b/runs/ffn_width_10to20pct_kd_search.yaml"),
        &[],
        &Env::new(),
    )
    .unwrap_err();
    match &e {
        ConfigError::MissingEnv { name, origin, .. } => {
            assert!(name.starts_with("PUZZLETRON_"), "{name}");
            assert!(origin.as_ref().unwrap().file().is_some());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn qwen_9b_default_meshes() {
    let c = load("families/qwen3_5/qwen3p5_9b/runs/default.yaml");
    assert_eq!(i(&c, "pruning.automodel.parallel.cp"), 4);
    assert_eq!(i(&c, "pruning.automodel.parallel.pp"), 2);
    // base.yaml keys the run file does not repeat survive the deep merge.
    assert_eq!(i(&c, "pruning.automodel.parallel.tp"), 1);
    assert_eq!(
        i(&c, "global_distillation.automodel.parallel.dp_replicate"),
        8
    );
    assert_eq!(i(&c, "mip.workloads.serving-default.isl"), 16384);
    assert_eq!(
        c.get("global_distillation.objective.main_ce"),
        Some(&Value::Float(0.25))
    );
    assert_eq!(s(&c, "model.revision"), "main");
}

#[test]
fn qwen_moe_production() {
    let c = load("families/qwen3_5/qwen3p6_35b_a3b/runs/production.yaml");
    assert_eq!(s(&c, "puzzle_dir"), "runs/test");
    assert!(c.get("pruning.automodel.parallel").is_some());
    assert_eq!(s(&c, "family.name"), "qwen3_5");
}

#[test]
fn nemotron_default_and_lmms_eval_relative_default() {
    let c = load("families/nemotron3/nano_30b_a3b_bf16/runs/default.yaml");
    assert_eq!(i(&c, "pruning.automodel.parallel.ep"), 4);
    assert_eq!(i(&c, "pruning.automodel.parallel.dp_shard"), 4);
    assert_eq!(
        s(&c, "pruning.automodel.parallel.pipeline_schedule"),
        "1f1b"
    );
    assert_eq!(
        c.get("bypass.training.learning_rate"),
        Some(&Value::Float(1e-6))
    );
    assert_eq!(
        s(&c, "build_library.source_checkpoint_dir"),
        "runs/test/ckpts/sorted_teacher"
    );
    assert_eq!(
        s(
            &c,
            "vllm_stats.runtime_stats.vllm_env.VLLM_USE_FUSED_MOE_GROUPED_TOPK"
        ),
        "1"
    );
    assert_eq!(i(&c, "zero_shot_evaluation.num_best_to_eval"), -1);
    assert_eq!(i(&c, "aiperf.topology_matrix.5.expert_parallel_size"), 8);
    assert!(b(&c, "skip_realize_model"));

    let l = load("families/nemotron3/nano_30b_a3b_bf16/runs/lmms_eval.yaml");
    // Inherited through `- default`, then changed.
    assert_eq!(i(&l, "pruning.automodel.parallel.ep"), 4);
    assert!(!b(&l, "zero_shot_evaluation.enabled"));
    assert_eq!(
        i(
            &l,
            "post_mip.flows.runtime-075-lmms-eval.nodes.lmms_eval.config.topology.tensor_parallel_size"
        ),
        8
    );
    // `${model.trust_remote_code}` keeps the bool.
    assert_eq!(
        l.get("post_mip.flows.runtime-075-lmms-eval.nodes.lmms_eval.config.model_args.trust_remote_code"),
        Some(&Value::Bool(true))
    );
}

#[test]
fn llama_pruneffn_memory_and_sweep() {
    let c = load("families/llama/llama3p1_8b/runs/pruneffn_memory.yaml");
    assert_eq!(s(&c, "dataset_path"), "data/ds");
    assert!(c.get("train_token_cache_path").unwrap().is_null());
    assert_eq!(
        i(
            &c,
            "mip.runs.pruneffn-memory.constraints.memory.at.legacy-batch96.max"
        ),
        78000
    );
    assert_eq!(
        i(&c, "mip.runs.pruneffn-memory.constraints.params.max"),
        7_000_000_000
    );
    assert_eq!(
        i(
            &c,
            "post_mip.flows.legacy-pruneffn-memory.nodes.best_mip.top_k"
        ),
        1
    );
    assert_eq!(
        s(
            &c,
            "post_mip.flows.legacy-pruneffn-memory.nodes.final_eval.config.dataset_path"
        ),
        "data/ds"
    );
    // The family sets trust_remote_code false; base.yaml had true.
    assert!(!b(&c, "model.trust_remote_code"));
    assert_eq!(
        c.get("mip.subblock_stats_args.batch_sizes"),
        Some(&Value::List(vec![Value::Int(96)]))
    );
    assert_eq!(c.get("pruning.bos_rate"), Some(&Value::Float(0.5)));

    let w = load("families/llama/llama3p1_8b/runs/pruneffn_memory_sweep.yaml");
    assert_eq!(
        s(
            &w,
            "mip.runs.pruneffn-memory.constraints.memory.at.legacy-batch96.max"
        ),
        "90%"
    );
    assert_eq!(
        s(
            &w,
            "mip.runs.pruneffn-memory.variants.memory-050.constraints.memory.at.legacy-batch96.max"
        ),
        "50%"
    );
    // Partial override of a post_mip node keeps its other keys.
    assert_eq!(
        i(
            &w,
            "post_mip.flows.legacy-pruneffn-memory.nodes.best_mip.top_k"
        ),
        5
    );
    assert_eq!(
        s(
            &w,
            "post_mip.flows.legacy-pruneffn-memory.nodes.best_mip.metric"
        ),
        "mip.score"
    );
    assert_eq!(
        i(&w, "mip.runs.pruneffn-memory.constraints.params.max"),
        7_000_000_000
    );
}

#[test]
fn overrides_on_a_real_config() {
    let o = parse_overrides([
        "puzzle_dir=/scratch/x",
        "pruning.eval_samples=16",
        "+execution.partition=batch",
        "~mip.runs.params-90",
        "embedding_pruning.widths=[1024]",
    ])
    .unwrap();
    let c = load_experiment(
        fixtures().join("families/qwen3_5/qwen3p5_0p8b/runs/mip_smoke.yaml"),
        &o,
        &reference_env(),
    )
    .unwrap();
    assert_eq!(s(&c, "teacher_dir"), "/scratch/x/ckpts/teacher");
    assert_eq!(i(&c, "pruning.eval_samples"), 16);
    assert_eq!(i(&c, "data.calibration.num_samples"), 16);
    assert_eq!(s(&c, "execution.partition"), "batch");
    assert!(c.get("mip.runs.params-90").is_none());
    let e = load_experiment(
        fixtures().join("families/qwen3_5/qwen3p5_0p8b/runs/mip_smoke.yaml"),
        &parse_overrides(["pruning.not_a_key=1"]).unwrap(),
        &reference_env(),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("write `+pruning.not_a_key=1`"),
        "{e}"
    );
}

#[test]
fn every_orchestration_file_loads_as_plain_yaml() {
    let dir = fixtures().join("orchestration");
    let mut n = 0;
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "yaml") {
                let c = load_yaml_file(&p).unwrap_or_else(|e| panic!("{e}"));
                assert!(
                    c.get("runner").is_some() || c.get("execution").is_some(),
                    "{p:?}"
                );
                n += 1;
            }
        }
    }
    assert_eq!(n, 11);
    let c =
        load_yaml_file(fixtures().join("orchestration/qwen3p5_0p8b/runner.slurm.yaml")).unwrap();
    assert_eq!(s(&c, "runner.slurm.time_limit"), "1:00:00");
    assert_eq!(i(&c, "runner.slurm.max_nodes"), 1);
    let c = load_yaml_file(
        fixtures().join("orchestration/qwen3p5_4b/execution.ffn_width_10to20pct_kd_search.yaml"),
    )
    .unwrap();
    // Anchor `&candidate_instances` and a key containing dots.
    let stages = c.get("execution.stages").unwrap().as_mapping().unwrap();
    assert_eq!(
        stages["post.candidate-evaluation.online_eval"].get("instances"),
        Some(&Value::Int(4))
    );
}
