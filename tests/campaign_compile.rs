//! Compile behaviour beyond the reference fixtures: determinism, contract-hash stability,
//! clear errors (cycles, missing parents, bad meshes, bad stage filters, unknown keys), user
//! catalogs, runner limits and the fixtures' runner/execution files.

mod support;
use support::plan::PlanBuilder;
use support::plan::{compile_file, fixtures, write};

use std::path::Path;

use proptest::prelude::*;
use puzzletron::campaign::config::{ConfigLoader, Env, Override, OverrideKind, Value};
use puzzletron::campaign::{
    ExecutionConfig, PlanError, RunnerEnvironment, RunnerKind, StageCatalog, StageFilter, Strategy,
    compile_campaign_plan_with, plan_to_dict,
};

fn loader() -> ConfigLoader {
    ConfigLoader::new().env(
        Env::new()
            .with("PUZZLETRON_RUN_ROOT", "runs/test")
            .with("PUZZLETRON_DATASET_PATH", "data/ds")
            .with("PUZZLETRON_DATASET_REVISION", "rev0"),
    )
}

const MOE: (&str, &str, &str) = (
    "families/qwen3_5/qwen3p6_35b_a3b/runs/production.yaml",
    "orchestration/qwen_moe/runner.slurm.yaml",
    "orchestration/qwen_moe/execution.production.yaml",
);

fn compile_fixture(
    t: (&str, &str, &str),
    overrides: &[&str],
    filter: Option<&StageFilter>,
) -> Result<puzzletron::campaign::CampaignPlan, PlanError> {
    let runner = RunnerEnvironment::load(fixtures().join(t.1))?;
    let execution = ExecutionConfig::load(fixtures().join(t.2))?;
    let overrides: Vec<Override> = overrides.iter().map(|s| s.parse().unwrap()).collect();
    compile_campaign_plan_with(
        &loader(),
        fixtures().join(t.0),
        &runner,
        &execution,
        &overrides,
        filter,
    )
}

fn compile_text(
    text: &str,
    filter: Option<&StageFilter>,
) -> Result<puzzletron::campaign::CampaignPlan, PlanError> {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "base.yaml", "{}\n");
    let exp = write(dir.path(), "exp.yaml", text);
    compile_campaign_plan_with(
        &ConfigLoader::new(),
        &exp,
        &RunnerEnvironment::local(),
        &ExecutionConfig::default(),
        &[],
        filter,
    )
}

#[test]
fn compile_is_deterministic() {
    let a = compile_fixture(MOE, &[], None).unwrap();
    let b = compile_fixture(MOE, &[], None).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.contract_hash, b.contract_hash);
    assert_eq!(
        serde_json::to_string(&plan_to_dict(&a)).unwrap(),
        serde_json::to_string(&plan_to_dict(&b)).unwrap()
    );
    assert_eq!(a.work_item_count(), b.work_item_count());
}

#[test]
fn overrides_that_change_results_change_the_contract_hash() {
    let base = compile_fixture(MOE, &[], None).unwrap();
    let changed = compile_fixture(MOE, &["pruning.eval_samples=4"], None).unwrap();
    assert_ne!(base.contract_hash, changed.contract_hash);
    // The plan records the override typed: kind, key path and value.
    assert_eq!(changed.overrides.len(), 1);
    let o = &changed.overrides[0];
    assert_eq!(o.kind, OverrideKind::Set);
    assert_eq!(o.key.to_string(), "pruning.eval_samples");
    assert_eq!(o.value, Some(Value::Int(4)));
    assert_eq!(o.to_string(), "pruning.eval_samples=4");
    // A plan round-trips through serde with its overrides.
    let json = serde_json::to_string(&changed).unwrap();
    let back: puzzletron::campaign::CampaignPlan = serde_json::from_str(&json).unwrap();
    assert_eq!(back.overrides, changed.overrides);
    // A mesh change through an override reaches the stage and the hash.
    let mesh = compile_fixture(
        MOE,
        &[
            "global_distillation.automodel.parallel.pp=4",
            "global_distillation.automodel.parallel.ep=2",
            "global_distillation.automodel.parallel.dp_shard=2",
        ],
        None,
    )
    .unwrap();
    let gd = mesh.stage("global_distillation").unwrap();
    assert_eq!(
        (gd.spec.mesh.pp, gd.spec.mesh.ep, gd.spec.mesh.dp_shard),
        (4, 2, 2)
    );
    // Its alias twin in sort_sanity (the same `*model_parallel` anchor) is unchanged.
    assert_eq!(mesh.stage("sort_sanity").unwrap().spec.mesh.pp, 2);
    assert_ne!(mesh.contract_hash, base.contract_hash);
}

#[test]
fn partitions_and_policies_do_not_change_the_contract_hash() {
    let a = compile_fixture(MOE, &[], None).unwrap();
    let runner = RunnerEnvironment::load(fixtures().join(MOE.1)).unwrap();
    let mut execution = ExecutionConfig::load(fixtures().join(MOE.2)).unwrap();
    for (_, s) in &mut execution.stages {
        s.partition = Some("other".into());
    }
    let b = compile_campaign_plan_with(
        &loader(),
        fixtures().join(MOE.0),
        &runner,
        &execution,
        &[],
        None,
    )
    .unwrap();
    assert_eq!(a.contract_hash, b.contract_hash);
    // The execution contract does change it.
    let mut runner2 = runner.clone();
    runner2.execution_contract.container = Some("other-image".into());
    let c = compile_campaign_plan_with(
        &loader(),
        fixtures().join(MOE.0),
        &runner2,
        &ExecutionConfig::load(fixtures().join(MOE.2)).unwrap(),
        &[],
        None,
    )
    .unwrap();
    assert_ne!(a.contract_hash, c.contract_hash);
}

#[test]
fn key_order_and_formatting_do_not_change_the_contract_hash() {
    let one = "# block style\npuzzle_dir: runs/x\nstages:\n  - id: prep\n    command: [python, prep.py]\n  - id: train\n    needs: [prep]\n    strategy: sharded\n    instances: 4\n    command: [python, train.py, '{shard_index}']\nlr: 1.0e-4\nmodel: {tp: 1, layers: 4}\n";
    let two = "model:\n  layers: 4\n  tp: 1\nlr: 0.0001\nstages: [{command: [python, prep.py], id: prep}, {instances: 4, strategy: sharded, needs: [prep], id: train, command: [python, train.py, '{shard_index}']}]\npuzzle_dir: runs/x\n";
    let a = compile_text(one, None).unwrap();
    let b = compile_text(two, None).unwrap();
    assert_eq!(a.contract_hash, b.contract_hash);
    assert_eq!(a.stage_ids(), ["prep", "train"]);
    let c = compile_text(&two.replace("layers: 4", "layers: 5"), None).unwrap();
    assert_ne!(a.contract_hash, c.contract_hash);
}

fn shuffle_maps(node: &Value, seed: &mut u64) -> Value {
    match node {
        Value::Mapping(entries) => {
            let mut e: Vec<(String, Value)> = entries
                .iter()
                .map(|(k, v)| (k.clone(), shuffle_maps(v, seed)))
                .collect();
            // Fisher-Yates with a small LCG: deterministic per seed.
            for i in (1..e.len()).rev() {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let j = (*seed >> 33) as usize % (i + 1);
                e.swap(i, j);
            }
            Value::Mapping(e.into_iter().collect())
        }
        Value::List(items) => Value::List(items.iter().map(|v| shuffle_maps(v, seed)).collect()),
        other => other.clone(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any reordering of mapping keys of the largest fixture's resolved config gives the same
    /// contract hash and the same stages.
    #[test]
    fn reordered_keys_give_the_same_contract_hash(seed in any::<u64>()) {
        let plan = compile_fixture(MOE, &[], None).unwrap();
        let mut s = seed;
        let shuffled = shuffle_maps(&plan.resolved_config, &mut s);
        let runner = RunnerEnvironment::load(fixtures().join(MOE.1)).unwrap();
        let execution = ExecutionConfig::load(fixtures().join(MOE.2)).unwrap();
        let again = PlanBuilder::config(shuffled).label(&plan.experiment_config_path).catalog(StageCatalog::puzzle()).runner(runner).execution_config(execution).build();
        prop_assert_eq!(again.contract_hash, plan.contract_hash);
        let mut a: Vec<&str> = again.stage_ids();
        let mut b: Vec<&str> = plan.stage_ids();
        a.sort_unstable();
        b.sort_unstable();
        prop_assert_eq!(a, b);
    }
}

#[test]
fn cycles_are_refused_with_the_cycle() {
    let e = compile_text(
        "stages:\n  - {id: a, needs: [c]}\n  - {id: b, needs: [a]}\n  - {id: c, needs: [b]}\n",
        None,
    )
    .unwrap_err();
    match e {
        PlanError::Cycle { cycle } => {
            assert_eq!(cycle.len(), 4, "{cycle:?}");
            assert_eq!(cycle.first(), cycle.last());
            for id in ["a", "b", "c"] {
                assert!(cycle.iter().any(|s| s == id), "{cycle:?}");
            }
        }
        other => panic!("{other}"),
    }
}

#[test]
fn missing_parents_are_refused_with_a_suggestion() {
    let e = compile_text("stages:\n  - {id: prepare, command: [x]}\n  - {id: train, needs: [prepar], command: [x]}\n", None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "stage `train` needs `prepar`, which is not a stage of this catalog (did you mean `prepare`?)"
    );
    let e = compile_text("stages:\n  - {id: a}\n  - {id: a}\n", None).unwrap_err();
    assert!(
        matches!(e, PlanError::DuplicateStage { ref stage } if stage == "a"),
        "{e}"
    );
}

#[test]
fn bad_meshes_are_refused_with_the_key_path() {
    let e = compile_fixture(MOE, &["pruning.automodel.parallel.tp=2.7"], None).unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("pruning.automodel.parallel.tp") && m.contains("2.7") && m.contains("integer"),
        "{m}"
    );
    let e = compile_fixture(MOE, &["+pruning.automodel.parallel.tp_size=2"], None).unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("pruning.automodel.parallel.tp_size") && m.contains("did you mean `tp`"),
        "{m}"
    );
    // ep must divide the ranks of a pipeline stage.
    let e = compile_fixture(MOE, &["pruning.automodel.parallel.ep=3"], None).unwrap_err();
    assert!(matches!(e, PlanError::BadMesh { .. }), "{e}");
    // A mesh larger than a node that is not a multiple of it cannot be packed.
    let e = compile_fixture(MOE, &["bypass.automodel.parallel.pp=3"], None).unwrap_err();
    assert!(e.to_string().contains("12 is not a multiple of 8"), "{e}");
}

#[test]
fn stage_filter_refuses_stages_whose_parents_are_not_complete() {
    let e = compile_fixture(MOE, &[], Some(&StageFilter::only(["mip"]))).unwrap_err();
    match &e {
        PlanError::StageFilterIncomplete { stage, parent } => {
            assert_eq!((stage.as_str(), parent.as_str()), ("mip", "vllm_stats"))
        }
        other => panic!("{other}"),
    }
    let f = StageFilter::only(["mip"]).with_completed([
        "vllm_stats",
        "depth_importance",
        "replacement_scoring",
    ]);
    let plan = compile_fixture(MOE, &[], Some(&f)).unwrap();
    assert_eq!(plan.stage_ids(), ["mip"]);
    assert_eq!(
        plan.completed_stages,
        ["vllm_stats", "depth_importance", "replacement_scoring"]
    );
    let full = compile_fixture(MOE, &[], None).unwrap();
    assert_eq!(
        plan.contract_hash, full.contract_hash,
        "a filter does not change results"
    );
    let both = compile_fixture(
        MOE,
        &[],
        Some(&StageFilter::only(["convert", "tokenize_data"])),
    )
    .unwrap();
    assert_eq!(both.stage_ids(), ["convert", "tokenize_data"]);
    let e = compile_fixture(MOE, &[], Some(&StageFilter::only(["mipp"]))).unwrap_err();
    assert!(
        e.to_string().contains("unknown stage `mipp`")
            && e.to_string().contains("did you mean `mip`"),
        "{e}"
    );
}

#[test]
fn unknown_execution_stage_ids_are_refused_but_known_newer_ones_accepted() {
    let runner = RunnerEnvironment::load(fixtures().join(MOE.1)).unwrap();
    let mut execution = ExecutionConfig::load(fixtures().join(MOE.2)).unwrap();
    execution
        .stages
        .push(("replacement_scorng".into(), Default::default()));
    let e = compile_campaign_plan_with(
        &loader(),
        fixtures().join(MOE.0),
        &runner,
        &execution,
        &[],
        None,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("did you mean `replacement_scoring`"),
        "{e}"
    );
    // `final_report` (newest upstream compiler) is in the 4B fixture and accepted.
    let plan = compile_fixture(
        (
            "families/qwen3_5/qwen3p5_4b/runs/ffn_width_10to20pct_kd_search.yaml",
            "orchestration/qwen3p5_4b/runner.slurm.yaml",
            "orchestration/qwen3p5_4b/execution.ffn_width_10to20pct_kd_search.yaml",
        ),
        &[],
        None,
    )
    .unwrap();
    assert!(plan.stage("final_report").is_none());
}

#[test]
fn runner_limits_are_enforced() {
    let runner = RunnerEnvironment::load(fixtures().join(MOE.1)).unwrap();
    // (stage, its edit, the message's start, parts it contains)
    type Case = (
        &'static str,
        fn(&mut puzzletron::campaign::StageExecutionConfig),
        &'static str,
        &'static [&'static str],
    );
    let cases: [Case; 2] = [
        // max_nodes: 20; zero_shot_evaluation needs 8 nodes. Ask for 24 instances of 8 GPUs.
        (
            "zero_shot_evaluation",
            |s| s.instances = Some(24),
            "stage `zero_shot_evaluation` needs 24 node(s) but runner.slurm.max_nodes is 20: ",
            &["gpus_per_node=", "raise `runner.slurm.max_nodes` to 24"],
        ),
        // interactive_max_nodes: 2; depth_importance on the interactive partition needs 4.
        (
            "depth_importance",
            |s| s.partition = Some("interactive".into()),
            "stage `depth_importance` needs 4 node(s) but runner.slurm.interactive_max_nodes is 2: ",
            &[
                "4 instance(s) of 8 GPU(s) (mesh pp=2, ep=4, dp_shard=4) at gpus_per_node=8",
                "raise `runner.slurm.interactive_max_nodes` to 4",
            ],
        ),
    ];
    for (stage, edit, start, parts) in cases {
        let mut execution = ExecutionConfig::load(fixtures().join(MOE.2)).unwrap();
        for (id, s) in &mut execution.stages {
            if id == stage {
                edit(s);
            }
        }
        let e = compile_campaign_plan_with(
            &loader(),
            fixtures().join(MOE.0),
            &runner,
            &execution,
            &[],
            None,
        )
        .unwrap_err();
        let m = e.to_string();
        assert!(
            m.starts_with(start) && parts.iter().all(|p| m.contains(p)),
            "{m}"
        );
    }
}

#[test]
fn fixture_runners_and_executions_parse() {
    let r = RunnerEnvironment::load(fixtures().join("orchestration/runner.slurm.example.yaml"))
        .unwrap();
    assert_eq!(r.kind, RunnerKind::Slurm);
    let s = r.slurm.as_ref().unwrap();
    assert_eq!(
        s.partition.to_slurm(),
        "REPLACE_WITH_PRIMARY_SLURM_PARTITION,REPLACE_WITH_ALTERNATE_SLURM_PARTITION"
    );
    assert_eq!(s.time_limit.as_ref().map(|t| t.as_str()), Some("4:00:00"));
    assert_eq!(
        s.time_limit.as_ref().map(|t| t.as_duration().as_secs()),
        Some(4 * 3600)
    );
    assert_eq!(r.execution_contract.venv.as_deref(), Some("/venv"));
    let r = RunnerEnvironment::load(fixtures().join("orchestration/qwen_moe/runner.slurm.yaml"))
        .unwrap();
    let s = r.slurm.as_ref().unwrap();
    assert_eq!((s.max_nodes, s.interactive_max_nodes), (Some(20), Some(2)));
    assert_eq!(
        s.resolve_partition(Some("interactive")).to_slurm(),
        "interactive"
    );
    assert_eq!(r.execution_contract.prerun_commands.len(), 3);
    let r = RunnerEnvironment::load(fixtures().join("orchestration/runner.baremetal.example.yaml"))
        .unwrap();
    let inv = r.inventory.as_ref().unwrap();
    assert_eq!(
        (inv.hosts.len(), inv.rendezvous_port_base, inv.hosts[0].gpus),
        (2, 29500, 8)
    );
    // Anchors and aliases in the 4B execution config.
    let e = ExecutionConfig::load(
        fixtures().join("orchestration/qwen3p5_4b/execution.ffn_width_10to20pct_kd_search.yaml"),
    )
    .unwrap();
    assert_eq!(
        e.stage("post.candidate-evaluation.quality_screen")
            .unwrap()
            .instances,
        Some(4)
    );
    assert_eq!(
        e.stage("depth_importance").unwrap().strategy,
        Some(Strategy::Single)
    );
    assert_eq!(
        e.stage("final_report").unwrap().partition.as_deref(),
        Some("cpu")
    );
}

#[test]
fn unknown_runner_and_execution_keys_name_file_path_and_suggestion() {
    let dir = tempfile::tempdir().unwrap();
    let runner = |p: &Path| RunnerEnvironment::load(p).unwrap_err().to_string();
    let execution = |p: &Path| ExecutionConfig::load(p).unwrap_err().to_string();
    // (file, its text, how it is read, parts of the error)
    type Case<'a> = (&'a str, &'a str, &'a dyn Fn(&Path) -> String, &'a [&'a str]);
    let cases: [Case; 3] = [
        (
            "runner.yaml",
            "runner:\n  kind: slurm\n  slurm:\n    partiton: batch\n",
            &runner,
            &[
                "runner.yaml",
                "runner.slurm.partiton",
                "did you mean `partition`",
            ],
        ),
        (
            "exec.yaml",
            "execution:\n  stages:\n    mip: {stratgy: single}\n",
            &execution,
            &[
                "exec.yaml",
                "execution.stages.mip.stratgy",
                "did you mean `strategy`",
            ],
        ),
        (
            "exec2.yaml",
            "execution:\n  stages:\n    mip: {parallel: {tp: 2.7}}\n",
            &execution,
            &["execution.stages.mip.parallel.tp", "2.7"],
        ),
    ];
    for (file, text, read, parts) in cases {
        let m = read(&write(dir.path(), file, text));
        assert!(parts.iter().all(|p| m.contains(p)), "{m}");
    }
}

#[test]
fn user_catalog_in_yaml_compiles_with_work_items() {
    let plan = compile_text(
        "puzzle_dir: runs/u\nstages:\n  - {id: prep, command: [python, prep.py]}\n  - {id: train, needs: [prep], strategy: sharded, instances: 3, command: [python, train.py], aggregate: true}\n  - {id: serve, needs: [train], strategy: persistent_pool, instances: 2, command: [python, serve.py], parallel: {tp: 2}}\n",
        None,
    )
    .unwrap();
    assert_eq!(plan.catalog, "config");
    assert_eq!(plan.stage_ids(), ["prep", "train", "serve"]);
    let train = plan.stage("train").unwrap();
    assert_eq!(
        train
            .work
            .items
            .iter()
            .map(|i| i.work_id.as_str())
            .collect::<Vec<_>>(),
        ["train:0", "train:1", "train:2"]
    );
    assert!(train.work.aggregate_required);
    let serve = plan.stage("serve").unwrap();
    assert_eq!(serve.spec.allocation.gpus_per_instance, 2);
    assert!(serve.work.aggregate_required);
    assert_eq!(serve.work.items[1].work_id, "serve:worker:1");
}

#[test]
fn rust_catalogs_compile() {
    use puzzletron::campaign::StageDef;
    let catalog = StageCatalog::new(
        "mine",
        vec![
            StageDef::new("a").command(vec!["true".into()]),
            StageDef::new("b")
                .needs(&["a"])
                .strategy(Strategy::Sharded)
                .command(vec!["true".into()]),
        ],
    );
    let plan = PlanBuilder::config(Value::Mapping(vec![].into_iter().collect()))
        .label("mem")
        .catalog(catalog)
        .build();
    assert_eq!(plan.catalog, "mine");
    assert_eq!(plan.stage("b").unwrap().parents, ["a"]);
}

#[test]
fn torchrun_groups_get_unique_ports_and_rendezvous_ids() {
    let plan = compile_fixture(MOE, &[], None).unwrap();
    let mut ports = std::collections::HashSet::new();
    let mut ids = std::collections::HashSet::new();
    for s in &plan.stages {
        for g in &s.work.topology.groups {
            if let Some(r) = &g.rendezvous {
                assert!(ports.insert(r.master_port), "port {} reused", r.master_port);
                assert!(ids.insert(r.rdzv_id.clone()));
            }
        }
    }
    assert!(ports.contains(&29500));
    let bypass = plan.stage("bypass").unwrap();
    // One torchrun per node of the 2-node instance (the job's topology has the nodes),
    // 8 workers each, on the group's own rendezvous port.
    assert_eq!(bypass.work.topology.tasks_per_group, 2);
    assert_eq!(
        bypass.work.topology.launcher,
        puzzletron::executor::TaskLauncher::Torchrun {
            nproc_per_node: 8,
            rdzv_backend: "c10d".into(),
            rdzv_port: bypass.work.topology.groups[0]
                .rendezvous
                .as_ref()
                .unwrap()
                .master_port,
            max_restarts: 0,
            no_python: true,
        }
    );
    let zs = plan.stage("zero_shot_evaluation").unwrap();
    assert_eq!(zs.work.items[0].work_id, "zero_shot_evaluation:w2048:0");
    assert_eq!(zs.work.items[0].shard_count, 8);
}

#[test]
fn cpu_stages_request_no_gpus_and_local_runners_stay_on_one_node() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "base.yaml", "{}\n");
    let exp = write(
        dir.path(),
        "exp.yaml",
        "stages:\n  - {id: report, command: [python, report.py]}\n  - {id: big, needs: [report], parallel: {tp: 16}, command: [x]}\n",
    );
    let exec = write(
        dir.path(),
        "exec.yaml",
        "execution:\n  defaults: {gpus_per_node: 8}\n  stages:\n    report: {resource: cpu}\n",
    );
    let execution = ExecutionConfig::load(&exec).unwrap();
    let e = compile_file(&exp, &execution).unwrap_err();
    let m = e.to_string();
    assert!(
        m.starts_with("stage `big` needs 2 node(s) but the node count of a local runner is 1: ")
            && m.contains("a local runner has one machine"),
        "{m}"
    );
    let f = StageFilter::only(["report"]);
    // Capacity is only checked for the stages that will run.
    let plan = compile_campaign_plan_with(
        &ConfigLoader::new(),
        &exp,
        &RunnerEnvironment::local(),
        &execution,
        &[],
        Some(&f),
    )
    .unwrap();
    let r = plan.stage("report").unwrap();
    assert_eq!(r.spec.resource, puzzletron::campaign::Resource::Cpu);
    assert_eq!(
        (
            r.spec.allocation.total_gpus,
            r.spec.allocation.nodes,
            r.spec.allocation.gpus_per_instance
        ),
        (0, 1, 0)
    );
    assert_eq!(r.work.topology.gpus_per_node, 0);
}

fn generated_dag(spec: &[(Vec<usize>, u8, u32, u32)]) -> Value {
    let stages = spec
        .iter()
        .enumerate()
        .map(|(i, (needs, strategy, instances, tp))| {
            let strategy = ["single", "sharded", "persistent_pool"][usize::from(*strategy % 3)];
            let instances = if strategy == "single" { 1 } else { *instances };
            let needs: Vec<Value> = needs
                .iter()
                .filter(|&&p| p < i)
                .map(|p| Value::String(format!("s{p}")))
                .collect();
            Value::Mapping(
                vec![
                    ("id".into(), Value::String(format!("s{i}"))),
                    ("needs".into(), Value::List(needs)),
                    ("strategy".into(), Value::String(strategy.into())),
                    ("instances".into(), Value::Int(i64::from(instances))),
                    ("distributed".into(), Value::Bool(*tp > 1)),
                    (
                        "parallel".into(),
                        Value::Mapping(
                            vec![("tp".into(), Value::Int(i64::from(*tp)))]
                                .into_iter()
                                .collect(),
                        ),
                    ),
                    (
                        "command".into(),
                        Value::List(vec![
                            Value::String("run".into()),
                            Value::String("{work_id}".into()),
                        ]),
                    ),
                ]
                .into_iter()
                .collect(),
            )
        })
        .collect();
    Value::Mapping(
        vec![("stages".into(), Value::List(stages))]
            .into_iter()
            .collect(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Same inputs, same plan and hash; parents always come first; every instance has a work
    /// item and a task group.
    #[test]
    fn generated_plans_are_deterministic_and_well_formed(
        spec in proptest::collection::vec(
            (proptest::collection::vec(0usize..12, 0..3), any::<u8>(), 1u32..20, prop_oneof![Just(1u32), Just(2), Just(3), Just(8), Just(16)]),
            1..12,
        )
    ) {
        let config = generated_dag(&spec);
        let runner = || RunnerEnvironment::from_value("r", &Value::from_json(&serde_json::json!({"runner": {"kind": "slurm"}}))).unwrap();
        let a = PlanBuilder::config(config.clone()).label("gen").runner(runner()).build();
        let b = PlanBuilder::config(config).label("gen").runner(runner()).build();
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(a.contract_hash, b.contract_hash);
        let mut seen = std::collections::HashSet::new();
        for s in &a.stages {
            for p in &s.parents {
                prop_assert!(seen.contains(p.as_str()));
            }
            seen.insert(s.stage_id.as_str());
            prop_assert_eq!(s.work.items.len() as u32, s.spec.instances);
            prop_assert_eq!(s.work.topology.group_count, s.spec.instances);
            prop_assert_eq!(s.spec.allocation.gpus_per_instance, s.spec.mesh.world_size() as u32);
        }
        prop_assert_eq!(a.stages.len(), spec.len());
    }
}

const QWEN_CAMPAIGN: (&str, &str, &str) = (
    "families/qwen3_5/qwen3p5_0p8b/runs/campaign.yaml",
    "orchestration/qwen3p5_0p8b/runner.slurm.yaml",
    "orchestration/qwen3p5_0p8b/execution.campaign.yaml",
);

#[test]
fn a_manual_filter_becomes_a_decision_stage_without_a_job() {
    let top_k = compile_fixture(QWEN_CAMPAIGN, &[], None).unwrap();
    let best = "post.runtime-075.best_lm";
    assert!(top_k.stage(best).unwrap().decision.is_none());
    let json = serde_json::to_value(&top_k).unwrap();
    assert!(
        json["stages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s.get("decision").is_none()),
        "no decision field when no stage is manual"
    );

    let plan = compile_fixture(
        QWEN_CAMPAIGN,
        &["post_mip.flows.runtime-075.nodes.best_lm.mode=manual"],
        None,
    )
    .unwrap();
    let st = plan.stage(best).unwrap();
    let d = st.decision.as_ref().expect("a manual decision");
    assert_eq!(d.input, "post.runtime-075.online_eval");
    let eval = plan.stage("post.runtime-075.online_eval").unwrap();
    let ids: Vec<String> = eval.work.items.iter().map(|i| i.work_id.clone()).collect();
    assert!(!ids.is_empty());
    assert_eq!(d.candidates, ids);
    assert_eq!(st.parents, ["post.runtime-075.online_eval"]);
    // No GPU, one item, whatever the execution file says about the node.
    assert_eq!(st.spec.allocation.total_gpus, 0);
    assert_eq!(st.spec.instances, 1);
    assert_eq!(st.work.items.len(), 1);
    // The downstream node still depends on it.
    assert_eq!(
        plan.stage("post.runtime-075.materialized").unwrap().parents,
        [best]
    );

    // Plan JSON: the field is there for that stage only, and round-trips.
    let json = serde_json::to_value(&plan).unwrap();
    let with: Vec<&str> = json["stages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s.get("decision").is_some())
        .map(|s| s["stage_id"].as_str().unwrap())
        .collect();
    assert_eq!(with, [best]);
    let back: puzzletron::campaign::CampaignPlan = serde_json::from_value(json).unwrap();
    assert_eq!(back.stage(best).unwrap().decision, st.decision);

    // The plan document (`compile --json`): no node, no submission for it.
    let doc = plan_to_dict(&plan);
    let sd = doc["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage_id"] == best)
        .unwrap();
    assert_eq!(sd["nodes"], 0);
    assert_eq!(sd["total_gpus"], 0);
    assert_eq!(sd["decision"]["input"], "post.runtime-075.online_eval");
    assert!(
        doc["dry_run_submissions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["stage_id"] != best)
    );

    // The dry run names the decision and its file; it submits nothing for it.
    let opts = puzzletron::campaign::DryRunOptions::default();
    let ex = puzzletron::campaign::default_executor(&plan, &opts.campaign_dir, &[], None).unwrap();
    let dr = puzzletron::campaign::dry_run(&plan, &opts, ex.as_ref()).unwrap();
    assert!(dr.submissions.iter().all(|s| s.stage_id != best));
    assert_eq!(dr.decisions.len(), 1);
    assert_eq!(
        dr.decisions[0].decision_file,
        "decisions/post.runtime-075.best_lm.txt"
    );
    let text = puzzletron::campaign::render_dry_run(&plan, &opts, ex.as_ref()).unwrap();
    assert!(
        text.contains("=== stage post.runtime-075.best_lm (manual decision, no job) ===")
            && text.contains("<campaign dir>/decisions/post.runtime-075.best_lm.txt")
            && text.contains(&format!("1. {}", ids[0])),
        "{text}"
    );
    // The summary row asks for no node.
    let row = puzzletron::campaign::PlanSummary::of(&plan)
        .stages
        .into_iter()
        .find(|s| s.stage_id == best)
        .unwrap();
    assert_eq!((row.strategy.as_str(), row.nodes), ("manual", 0));
}

#[test]
fn a_filter_mode_that_is_not_a_string_is_refused_with_file_line_and_path() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "base.yaml", "{}\n");
    let exp = write(
        dir.path(),
        "exp.yaml",
        "mip:\n  enabled: true\npost_mip:\n  flows:\n    f:\n      nodes:\n        pick:\n          type: filter\n          mode: [manual]\n",
    );
    let err = compile_file(&exp, &ExecutionConfig::default()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("exp.yaml:9") && msg.contains("post_mip.flows.f.nodes.pick.mode"),
        "{msg}"
    );
    assert!(
        msg.contains("one of top_k, aggregate_rank, manual"),
        "{msg}"
    );
}
