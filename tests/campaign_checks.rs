//! What the compiler reads is checked, with the position of the value at fault in the file that
//! holds it; what it does not read passes through, and overrides of such keys are listed.
//! (Issue cases: an empty or unrelated experiment, mistyped and unknown keys the compiler reads,
//! directly and through overrides, a bad value from a `defaults` file, and errors of the runner
//! and execution files naming those files.)

mod support;
use support::plan::{compile_file, fixtures, write};

use puzzletron::campaign::config::{ConfigLoader, Env, Override};
use puzzletron::campaign::{
    CampaignPlan, ExecutionConfig, PlanError, RunnerEnvironment, compile_campaign_plan_with,
};
use puzzletron::campaign::{DryRunOptions, default_executor};

/// The dry run as text, with the executor `campaign run` would build.
fn render_dry_run(
    plan: &CampaignPlan,
    opts: &DryRunOptions,
) -> Result<String, puzzletron::campaign::PlanError> {
    let ex = default_executor(plan, &opts.campaign_dir, &[], None)?;
    puzzletron::campaign::render_dry_run(plan, opts, ex.as_ref())
}

fn overrides(texts: &[&str]) -> Vec<Override> {
    texts.iter().map(|t| t.parse().unwrap()).collect()
}

/// Compiles `exp.yaml` (with `text`) in a fresh config root, local runner, default execution.
fn compile_text(text: &str, ov: &[&str]) -> (tempfile::TempDir, Result<CampaignPlan, PlanError>) {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "base.yaml", "{}\n");
    let exp = write(dir.path(), "exp.yaml", text);
    let r = compile_campaign_plan_with(
        &ConfigLoader::new(),
        &exp,
        &RunnerEnvironment::local(),
        &ExecutionConfig::default(),
        &overrides(ov),
        None,
    );
    (dir, r)
}

fn moe(ov: &[&str]) -> Result<CampaignPlan, PlanError> {
    let runner =
        RunnerEnvironment::load(fixtures().join("orchestration/qwen_moe/runner.slurm.yaml"))?;
    let execution =
        ExecutionConfig::load(fixtures().join("orchestration/qwen_moe/execution.production.yaml"))?;
    compile_campaign_plan_with(
        &ConfigLoader::new().env(
            Env::new()
                .with("PUZZLETRON_RUN_ROOT", "runs/test")
                .with("PUZZLETRON_DATASET_PATH", "data/ds"),
        ),
        fixtures().join("families/qwen3_5/qwen3p6_35b_a3b/runs/production.yaml"),
        &runner,
        &execution,
        &overrides(ov),
        None,
    )
}

#[test]
fn an_empty_experiment_is_refused_naming_what_is_missing() {
    for text in ["", "{}\n", "# nothing\n"] {
        let (dir, r) = compile_text(text, &[]);
        let e = r.unwrap_err();
        assert!(matches!(e, PlanError::NothingToCompile { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.starts_with(&dir.path().join("exp.yaml").display().to_string()),
            "{msg}"
        );
        assert!(msg.contains("top-level keys: none"), "{msg}");
        for key in [
            "puzzle_dir",
            "post_mip",
            "tokenize_data",
            "pruning",
            "stages",
        ] {
            assert!(msg.contains(key), "{key} missing from: {msg}");
        }
    }
}

#[test]
fn an_experiment_of_unknown_keys_is_refused_listing_them() {
    let (_dir, r) = compile_text("foo: bar\nmodel_nmae: x\n", &[]);
    let msg = r.unwrap_err().to_string();
    assert!(msg.contains("top-level keys: foo, model_nmae"), "{msg}");
    assert!(msg.contains("`puzzle` stage catalog"), "{msg}");
    // One key the compiler reads is enough.
    let (_dir, r) = compile_text("puzzle_dir: runs/x\nfoo: bar\n", &[]);
    let plan = r.unwrap();
    assert_eq!(plan.puzzle_dir.as_deref(), Some("runs/x"));
}

#[test]
fn a_mistyped_key_the_compiler_reads_names_its_line_and_column() {
    let (dir, r) = compile_text(
        "puzzle_dir: runs/x\ntokenize_data:\n  enabled: maybe\n",
        &[],
    );
    let e = r.unwrap_err();
    let msg = e.to_string();
    let exp = dir.path().join("exp.yaml").display().to_string();
    assert!(msg.starts_with(&format!("{exp}:3:")), "{msg}");
    assert!(msg.contains("`tokenize_data.enabled` = \"maybe\""), "{msg}");
    assert!(msg.contains("true or false"), "{msg}");
}

#[test]
fn a_mistyped_override_of_a_key_the_compiler_reads_names_the_override() {
    for bad in [
        "tokenize_data.enabled=abc",
        "pruning.automodel.parallel.tp=two",
    ] {
        let e = moe(&[bad]).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("override #1 `{bad}`")),
            "{bad}: {msg}"
        );
    }
    // The same keys with values of the right type compile.
    moe(&["tokenize_data.enabled=true"]).unwrap();
}

#[test]
fn an_unknown_key_where_the_compiler_reads_gets_a_suggestion_and_position() {
    let (dir, r) = compile_text(
        "puzzle_dir: runs/x\npost_mip:\n  flows:\n    f1:\n      nodes:\n        ev:\n          type: evaluation\n          inptu: x\n",
        &[],
    );
    let msg = r.unwrap_err().to_string();
    let exp = dir.path().join("exp.yaml").display().to_string();
    assert!(msg.starts_with(&format!("{exp}:8:")), "{msg}");
    assert!(msg.contains("post_mip.flows.f1.nodes.ev.inptu"), "{msg}");
    assert!(msg.contains("did you mean `input`"), "{msg}");
}

#[test]
fn a_bad_value_from_a_defaults_file_names_that_file() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "base.yaml", "{}\n");
    let part = write(
        dir.path(),
        "parts/stages.yaml",
        "tokenize_data:\n  enabled: 3\n",
    );
    let exp = write(
        dir.path(),
        "exp.yaml",
        "defaults:\n  - /parts/stages@_global_\n  - _self_\npuzzle_dir: runs/x\n",
    );
    let msg = compile_file(&exp, &ExecutionConfig::default())
        .unwrap_err()
        .to_string();
    let part = std::fs::canonicalize(&part).unwrap();
    assert!(
        msg.starts_with(&format!("{}:2:", part.display())),
        "not the defaults file: {msg}"
    );
}

#[test]
fn overrides_the_compiler_does_not_read_pass_through_and_are_listed() {
    let plan = moe(&[
        "pruning.seed=notanumber",
        "data.max_sample_length=abc",
        "tokenize_data.enabled=true",
        "+notes=smoke",
    ])
    .unwrap();
    assert_eq!(
        plan.unchecked_overrides,
        [
            "pruning.seed=notanumber (was int, now string)",
            "data.max_sample_length=abc (was int, now string)",
            "+notes=smoke",
        ]
    );
    // Passed to the workers unchanged, in the resolved config.
    assert_eq!(
        plan.resolved_config
            .get("pruning.seed")
            .and_then(|n| n.as_str()),
        Some("notanumber")
    );
    let text = render_dry_run(&plan, &DryRunOptions::default()).unwrap();
    assert!(
        text.contains(
            "overrides passed to the workers unchecked (keys the compiler does not read): \
             pruning.seed=notanumber (was int, now string) data.max_sample_length=abc (was int, now string) +notes=smoke"
        ),
        "{}",
        text.split("=== summary ===").nth(1).unwrap_or(&text)
    );
    // Without unchecked overrides the dry run says nothing about them.
    let plain = moe(&["tokenize_data.enabled=true"]).unwrap();
    assert!(plain.unchecked_overrides.is_empty());
    let text = render_dry_run(&plain, &DryRunOptions::default()).unwrap();
    assert!(!text.contains("unchecked"), "{text}");
}

#[test]
fn an_unknown_stage_in_the_execution_file_names_the_execution_file() {
    let dir = tempfile::tempdir().unwrap();
    let exec = write(
        dir.path(),
        "execution.yaml",
        "execution:\n  stages:\n    mip:\n      instances: 1\n    zero_shot_evaluaton:\n      instances: 2\n",
    );
    let execution = ExecutionConfig::load(&exec).unwrap();
    let runner =
        RunnerEnvironment::load(fixtures().join("orchestration/qwen_moe/runner.slurm.yaml"))
            .unwrap();
    let msg = compile_campaign_plan_with(
        &ConfigLoader::new().env(
            Env::new()
                .with("PUZZLETRON_RUN_ROOT", "runs/test")
                .with("PUZZLETRON_DATASET_PATH", "data/ds"),
        ),
        fixtures().join("families/qwen3_5/qwen3p6_35b_a3b/runs/production.yaml"),
        &runner,
        &execution,
        &[],
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        // The position of the stage's settings (origins are recorded for values).
        msg.starts_with(&format!("{}:6:7: execution.stages", exec.display())),
        "{msg}"
    );
    assert!(msg.contains("unknown stage `zero_shot_evaluaton`"), "{msg}");
    assert!(msg.contains("did you mean `zero_shot_evaluation`"), "{msg}");
}

#[test]
fn runner_and_execution_file_errors_name_their_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let runner = write(
        dir.path(),
        "runner.yaml",
        "runner:\n  kind: slurm\n  slurm:\n    partiton: batch\n",
    );
    let msg = RunnerEnvironment::load(&runner).unwrap_err().to_string();
    assert!(
        msg.starts_with(&format!(
            "{}:4:15: unknown key `runner.slurm.partiton`",
            runner.display()
        )),
        "{msg}"
    );
    assert!(msg.contains("did you mean `partition`"), "{msg}");
    let exec = write(
        dir.path(),
        "execution.yaml",
        "execution:\n  stages:\n    mip:\n      time_limit: 4h\n",
    );
    let msg = ExecutionConfig::load(&exec).unwrap_err().to_string();
    assert!(
        msg.starts_with(&format!(
            "{}:4:19: `execution.stages.mip.time_limit`",
            exec.display()
        )),
        "{msg}"
    );
}

#[test]
fn zero_and_out_of_range_slurm_times_name_file_line_key_and_value() {
    let dir = tempfile::tempdir().unwrap();
    for (value, expected) in [
        ("\"0:0:0\"", "or a positive number of minutes below 1000000"),
        ("\"00:00\"", "or a positive number of minutes below 1000000"),
        ("0", "or a positive number of minutes below 1000000"),
        ("\"25:99\"", "minutes and seconds in 0..59"),
        ("\"1:61:00\"", "minutes and seconds in 0..59"),
        ("\"1-24:00:00\"", "hours in 0..23 after days"),
    ] {
        let runner = write(
            dir.path(),
            "runner.yaml",
            &format!("runner:\n  kind: slurm\n  slurm:\n    time_limit: {value}\n"),
        );
        let msg = RunnerEnvironment::load(&runner).unwrap_err().to_string();
        assert!(
            msg.starts_with(&format!(
                "{}:4:17: `runner.slurm.time_limit` = {value}: expected",
                runner.display()
            )),
            "{msg}"
        );
        assert!(msg.contains(expected), "{msg}");
        let exec = write(
            dir.path(),
            "execution.yaml",
            &format!("execution:\n  stages:\n    mip:\n      time_limit: {value}\n"),
        );
        let msg = ExecutionConfig::load(&exec).unwrap_err().to_string();
        assert!(
            msg.starts_with(&format!(
                "{}:4:19: `execution.stages.mip.time_limit` = {value}",
                exec.display()
            )),
            "{msg}"
        );
        assert!(msg.contains(expected), "{msg}");
    }
}

/// A campaign driver written as `fn main() -> puzzletron::Result<()>`: config, plan and
/// controller errors all convert with `?`, and keep their own variant and message.
fn driver(overrides: &[&str], runner_yaml: &str) -> puzzletron::Result<CampaignPlan> {
    let dir = tempfile::tempdir().expect("temp dir");
    let runner_path = write(dir.path(), "runner.yaml", runner_yaml);
    let overrides = overrides
        .iter()
        .map(|o| o.parse::<Override>())
        .collect::<Result<Vec<_>, _>>()?;
    let runner = RunnerEnvironment::load(&runner_path)?;
    let plan = compile_campaign_plan_with(
        &ConfigLoader::new().env(
            Env::new()
                .with("PUZZLETRON_RUN_ROOT", "runs/test")
                .with("PUZZLETRON_DATASET_PATH", "data/ds"),
        ),
        fixtures().join("families/qwen3_5/qwen3p6_35b_a3b/runs/production.yaml"),
        &runner,
        &ExecutionConfig::default(),
        &overrides,
        None,
    )?;
    Ok(plan)
}

#[test]
fn a_campaign_driver_returns_puzzletron_result() {
    // Controller errors convert too (checked at compile time).
    fn _controller(e: puzzletron::campaign::controller::ControllerError) -> puzzletron::Result<()> {
        Err(e)?
    }
    let slurm = "runner:\n  kind: slurm\n  slurm: {partition: batch}\n";
    let plan = driver(&["tokenize_data.enabled=true"], slurm).unwrap();
    assert!(
        plan.stage_ids().contains(&"tokenize_data"),
        "{:?}",
        plan.stage_ids()
    );

    let e = driver(&["tokenize_data.enabled"], slurm).unwrap_err();
    assert!(matches!(e, puzzletron::Error::Config(_)), "{e:?}");

    let e = driver(&[], "runner:\n  kind: slurm\n  slurm: {partiton: batch}\n").unwrap_err();
    assert!(
        matches!(e, puzzletron::Error::Plan(PlanError::UnknownField { .. })),
        "{e:?}"
    );
    assert!(e.to_string().contains("did you mean `partition`"), "{e}");
    assert!(!e.is_retryable());

    let e = driver(&["tokenize_data.enabled=maybe"], slurm).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, puzzletron::Error::Plan(PlanError::InvalidValue { .. })),
        "{e:?}"
    );
    assert!(
        msg.contains("override #1 `tokenize_data.enabled=maybe`"),
        "{msg}"
    );
}

/// Issue 25, bad input: a runner or execution value the chosen executor cannot express is
/// refused when it is read or compiled, with file:line:column, the key and what the executor
/// supports; never dropped in silence.
#[test]
fn values_the_executor_cannot_express_are_refused_with_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    // A QOS (any Slurm setting) on the local runner.
    let local = write(
        dir.path(),
        "local.yaml",
        "runner:\n  kind: local\n  slurm:\n    qos: long\n",
    );
    let m = RunnerEnvironment::load(&local).unwrap_err().to_string();
    assert!(
        // The section's first key: the `qos: long` line.
        m.starts_with(&format!("{}:4:5:", local.display()))
            && m.contains("`runner.slurm`")
            && m.contains("no `slurm` section in a `local` runner")
            && m.contains("qos"),
        "{m}"
    );
    // A container on bare metal, which has no container runtime.
    let bm = write(
        dir.path(),
        "bm.yaml",
        "runner:\n  kind: baremetal\n  inventory:\n    rendezvous_host: h1\n    hosts: [{hostname: h1, gpus: 8}]\n  execution_contract:\n    repository: /src\n    container: nvcr.io/x:1\n",
    );
    let m = RunnerEnvironment::load(&bm).unwrap_err().to_string();
    assert!(
        m.starts_with(&format!("{}:8:16:", bm.display()))
            && m.contains("`runner.execution_contract.container` = \"nvcr.io/x:1\"")
            && m.contains("the baremetal executor has no container runtime")
            && m.contains(
                "supports repository, venv, setup_env, prerun_commands and postrun_commands"
            ),
        "{m}"
    );
    // A partition for a stage of a local campaign.
    let exec = write(
        dir.path(),
        "execution.yaml",
        "execution:\n  stages:\n    convert:\n      partition: interactive\n",
    );
    let execution = ExecutionConfig::load(&exec).unwrap();
    let m = compile_campaign_plan_with(
        &ConfigLoader::new().env(
            Env::new()
                .with("PUZZLETRON_RUN_ROOT", "runs/test")
                .with("PUZZLETRON_DATASET_PATH", "data/ds"),
        ),
        fixtures().join("families/qwen3_5/qwen3p5_0p8b/runs/mip_smoke.yaml"),
        &RunnerEnvironment::local(),
        &execution,
        &[],
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        m.starts_with(&format!("{}:4:", exec.display()))
            && m.contains("`execution.stages.convert.partition` = \"interactive\"")
            && m.contains("no partition with a local runner"),
        "{m}"
    );
}

/// Issue 25: the placeholders of the shared runner files are listed, sorted by key path, and
/// refused (the first named with the line of the runner file, the others listed).
#[test]
fn placeholders_are_listed_and_refused_with_their_line() {
    let path = fixtures().join("orchestration/qwen3p5_0p8b/runner.slurm.yaml");
    let runner = RunnerEnvironment::load(&path).unwrap();
    assert_eq!(
        runner.placeholders(),
        [
            (
                "runner.execution_contract.container".to_string(),
                "REPLACE_WITH_PUZZLETRON_IMAGE".to_string()
            ),
            (
                "runner.execution_contract.container_mounts".into(),
                "REPLACE_WITH_REQUIRED_CONTAINER_MOUNTS".into()
            ),
            (
                "runner.slurm.account".into(),
                "REPLACE_WITH_SLURM_ACCOUNT".into()
            ),
            (
                "runner.slurm.partition[0]".into(),
                "REPLACE_WITH_SLURM_PARTITION".into()
            ),
        ]
    );
    let label = path.display().to_string();
    let m = runner
        .check_placeholders(&label)
        .unwrap_err()
        .locate_runner(&path)
        .to_string();
    assert!(
        m.starts_with(&format!(
            "{label}:16:16: `runner.execution_contract.container` = \"REPLACE_WITH_PUZZLETRON_IMAGE\" is still a placeholder"
        )) && m.contains(
            "(also: `runner.execution_contract.container_mounts`, `runner.slurm.account`, `runner.slurm.partition[0]`)"
        ),
        "{m}"
    );
    // A prerun command holding one is found too; a runner without any passes.
    let moe = RunnerEnvironment::load(fixtures().join("orchestration/qwen_moe/runner.slurm.yaml"))
        .unwrap();
    assert!(
        moe.placeholders()
            .iter()
            .any(|(k, v)| k == "runner.execution_contract.prerun_commands[0]"
                && v == "source REPLACE_WITH_SITE_SETUP_SCRIPT")
    );
    RunnerEnvironment::local()
        .check_placeholders("local")
        .unwrap();
}
