//! Dry runs: sbatch scripts (quoting checked by running them against stub `srun`/`scontrol`),
//! bare-metal ssh commands (run through a real shell), local argv/env, GPU placement, secret
//! redaction.

use std::path::{Path, PathBuf};
use std::process::Command;

use puzzletron::campaign::config::Value;
use puzzletron::campaign::config::{ConfigLoader, Env};
use puzzletron::campaign::{
    CampaignPlan, ExecutionConfig, RunnerEnvironment, StageCatalog, compile_campaign_plan_with,
    compile_resolved,
};
use puzzletron::campaign::{DryRunOptions, dry_run, render_dry_run};

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
            .with("PUZZLETRON_DATASET_PATH", "data/ds"),
    )
}

fn moe() -> CampaignPlan {
    let runner =
        RunnerEnvironment::load(fixtures().join("orchestration/qwen_moe/runner.slurm.yaml"))
            .unwrap();
    let execution =
        ExecutionConfig::load(fixtures().join("orchestration/qwen_moe/execution.production.yaml"))
            .unwrap();
    compile_campaign_plan_with(
        &loader(),
        fixtures().join("families/qwen3_5/qwen3p6_35b_a3b/runs/production.yaml"),
        &runner,
        &execution,
        &[],
        None,
    )
    .unwrap()
}

/// Arguments that would run commands if any layer spliced them into shell text.
const HOSTILE: [&str; 6] = [
    "$(touch pwned1)",
    "`touch pwned2`",
    "a'b\"c",
    "; touch pwned3",
    "x\ny",
    "{work_id}",
];

fn user_plan(runner_yaml: &str, workdir: &Path) -> CampaignPlan {
    let runner = RunnerEnvironment::from_value("runner.yaml", &node_yaml(runner_yaml)).unwrap();
    let mut argv = vec!["printf".to_string(), "%s\\n".to_string()];
    argv.extend(HOSTILE.iter().map(|s| s.to_string()));
    let argv_yaml: Vec<String> = argv
        .iter()
        .map(|a| serde_json::to_string(a).unwrap())
        .collect();
    let config = format!(
        "{{\"puzzle_dir\": {}, \"stages\": [{{\"id\": \"train\", \"strategy\": \"sharded\", \"instances\": 2, \"distributed\": true, \"parallel\": {{\"tp\": 2}}, \"command\": [{}]}}]}}",
        serde_json::to_string(&workdir.display().to_string()).unwrap(),
        argv_yaml.join(", ")
    );
    let node = node_yaml(&config);
    let catalog = StageCatalog::from_config("exp", &node).unwrap();
    compile_resolved(
        "exp",
        node,
        &[],
        &catalog,
        &runner,
        &ExecutionConfig::default(),
        None,
    )
    .unwrap()
}

fn node_yaml(text: &str) -> Value {
    let v = puzzletron::campaign::config::load_yaml_str(text, Path::new("mem.yaml"))
        .unwrap()
        .value;
    Value::from_json(&serde_json::to_value(&v).unwrap())
}

fn stub(dir: &Path, name: &str, body: &str) {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/bash\n{body}\n")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

#[test]
fn sbatch_script_passes_hostile_values_literally() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let bin = work.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let repo = work.join("repo dir");
    std::fs::create_dir(&repo).unwrap();
    // srun: drop its options, run the payload. scontrol: two nodes.
    stub(
        &bin,
        "srun",
        "while [[ \"$1\" == --* ]]; do shift; done\necho \"MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT\"\nexec \"$@\"",
    );
    stub(&bin, "scontrol", "printf 'node-a\\nnode-b\\n'");
    stub(
        &bin,
        "torchrun",
        "while [[ \"$1\" == --* ]]; do echo \"torchrun $1\"; [[ \"$1\" == --no-python ]] && { shift; break; }; shift; done\nexec \"$@\"",
    );
    let runner = format!(
        "runner:\n  kind: slurm\n  slurm: {{account: \"acct'; touch pwned4; '\", partition: \"batch\", time_limit: \"1:00:00\"}}\n  execution_contract: {{repository: {:?}, venv: \"\"}}\n",
        repo.display().to_string()
    );
    let plan = user_plan(&runner, work);
    let dr = dry_run(&plan, &DryRunOptions::default()).unwrap();
    let script = dr.submissions[0].sbatch_script.clone().unwrap();
    assert!(
        script.contains("#SBATCH --account='acct'\\''; touch pwned4; '\\'''"),
        "{script}"
    );
    assert!(script.contains("#SBATCH --partition='batch'"));
    assert!(script.contains("#SBATCH --nodes=1"));
    assert!(script.contains("#SBATCH --gpus-per-node=4"));
    assert!(script.contains("srun --relative=0 --nodes=1 --ntasks=1"));
    let path = work.join("job.sh");
    std::fs::write(&path, &script).unwrap();
    let out = Command::new("bash")
        .arg(&path)
        .current_dir(work)
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("SLURM_JOB_NODELIST", "node-[a-b]")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for i in 1..=4 {
        assert!(
            !work.join(format!("pwned{i}")).exists(),
            "a config value ran as a command"
        );
        assert!(
            !repo.join(format!("pwned{i}")).exists(),
            "a config value ran as a command"
        );
    }
    // Each hostile argument arrived as one literal argument (printf prints one per line; the
    // newline inside "x\ny" splits its output line only).
    for literal in [
        "$(touch pwned1)",
        "`touch pwned2`",
        "a'b\"c",
        "; touch pwned3",
        "x",
        "y",
    ] {
        assert!(
            stdout.lines().any(|l| l == literal),
            "missing {literal:?} in:\n{stdout}"
        );
    }
    assert!(
        stdout.lines().any(|l| l == "train:0") && stdout.lines().any(|l| l == "train:1"),
        "{stdout}"
    );
    assert!(
        stdout.contains("MASTER_ADDR=node-a MASTER_PORT=29500"),
        "{stdout}"
    );
    assert!(
        stdout.contains("torchrun --rdzv_endpoint=node-a:29501"),
        "{stdout}"
    );
    assert!(stdout.contains("torchrun --nproc_per_node=2"), "{stdout}");
}

#[test]
fn sbatch_directives_refuse_newlines() {
    let dir = tempfile::tempdir().unwrap();
    let plan = user_plan(
        "runner:\n  kind: slurm\n  slurm: {account: \"a\\nrm -rf ~\"}\n",
        dir.path(),
    );
    let e = dry_run(&plan, &DryRunOptions::default()).unwrap_err();
    assert!(e.to_string().contains("control characters"), "{e}");
}

#[test]
fn baremetal_remote_commands_are_quoted_words() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let repo = work.join("re po");
    std::fs::create_dir_all(repo.join("venv/bin")).unwrap();
    std::fs::write(repo.join("venv/bin/activate"), "export ACTIVATED=yes\n").unwrap();
    let runner = format!(
        "runner:\n  kind: baremetal\n  inventory:\n    rendezvous_host: h1\n    rendezvous_port_base: 31000\n    hosts: [{{hostname: h1, gpus: 4}}]\n  execution_contract: {{repository: {:?}, venv: {:?}}}\n",
        repo.display().to_string(),
        repo.join("venv").display().to_string()
    );
    let plan = user_plan(&runner, work);
    let dr = dry_run(&plan, &DryRunOptions::default()).unwrap();
    let procs = &dr.submissions[0].processes;
    assert_eq!(procs.len(), 2);
    let p = &procs[1];
    assert_eq!(&p.argv[..5], ["ssh", "-o", "BatchMode=yes", "--", "h1"]);
    let remote = &p.argv[5];
    assert!(remote.contains("CUDA_VISIBLE_DEVICES='2,3'"), "{remote}");
    assert!(
        remote.contains("MASTER_ADDR='h1'") && remote.contains("MASTER_PORT='31001'"),
        "{remote}"
    );
    // What ssh's remote shell would do: run it with bash (torchrun replaced by a stub).
    let bin = work.join("bin");
    std::fs::create_dir(&bin).unwrap();
    stub(
        &bin,
        "torchrun",
        "while [[ \"$1\" == --* ]]; do [[ \"$1\" == --no-python ]] && { shift; break; }; shift; done\necho \"ACTIVATED=$ACTIVATED CVD=$CUDA_VISIBLE_DEVICES\"\nexec \"$@\"",
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(remote)
        .current_dir(work)
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ACTIVATED=yes CVD=2,3"), "{stdout}");
    for literal in [
        "$(touch pwned1)",
        "`touch pwned2`",
        "a'b\"c",
        "; touch pwned3",
        "train:1",
    ] {
        assert!(
            stdout.lines().any(|l| l == literal),
            "missing {literal:?} in:\n{stdout}"
        );
    }
    for i in 1..=3 {
        assert!(
            !work.join(format!("pwned{i}")).exists() && !repo.join(format!("pwned{i}")).exists()
        );
    }
}

#[test]
fn local_processes_get_argv_env_and_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let plan = user_plan(
        "runner:\n  kind: local\n  execution_contract: {repository: /src}\n",
        dir.path(),
    );
    let dr = dry_run(&plan, &DryRunOptions::default()).unwrap();
    let procs = &dr.submissions[0].processes;
    assert_eq!(procs.len(), 2);
    let env = |i: usize, k: &str| {
        procs[i]
            .env
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(env(0, "CUDA_VISIBLE_DEVICES").as_deref(), Some("0,1"));
    assert_eq!(env(1, "CUDA_VISIBLE_DEVICES").as_deref(), Some("2,3"));
    assert_eq!(env(1, "MASTER_ADDR").as_deref(), Some("127.0.0.1"));
    assert_eq!(env(1, "PUZZLETRON_WORK_ID").as_deref(), Some("train:1"));
    assert_eq!(procs[0].argv[0], "torchrun");
    assert!(procs[0].argv.contains(&"$(touch pwned1)".to_string()));
    assert_eq!(procs[0].cwd.as_deref(), Some("/src"));
    assert_eq!(
        dr.submissions[0].placement,
        ["node 0 (localhost, 4/8 GPUs): instance 0 -> GPUs 0-1; instance 1 -> GPUs 2-3"]
    );
}

#[test]
fn moe_dry_run_renders_every_stage_with_placement() {
    let plan = moe();
    let text = render_dry_run(&plan, &DryRunOptions::default()).unwrap();
    assert_eq!(text.matches("=== stage ").count(), plan.stages.len());
    assert_eq!(text.matches("#!/bin/bash").count(), plan.stages.len());
    let dr = dry_run(&plan, &DryRunOptions::default()).unwrap();
    let vllm = dr
        .submissions
        .iter()
        .find(|s| s.stage_id == "vllm_stats")
        .unwrap();
    let script = vllm.sbatch_script.as_ref().unwrap();
    assert!(
        script.contains("#SBATCH --partition='interactive'"),
        "{script}"
    );
    assert!(script.contains("#SBATCH --exclusive"));
    assert!(script.contains("#SBATCH --time='4:00:00'"));
    assert!(
        script.contains("source REPLACE_WITH_SITE_SETUP_SCRIPT"),
        "prerun commands are written verbatim"
    );
    assert!(script.contains("--container-image='REPLACE_WITH_SLURM_CONTAINER_IMAGE'"));
    assert_eq!(
        vllm.placement,
        [
            "node 0 (allocation node 0, 8/8 GPUs): instance 0 -> GPU 0; instance 1 -> GPU 1; instance 2 -> GPU 2; instance 3 -> GPU 3; instance 4 -> GPU 4; instance 5 -> GPU 5; instance 6 -> GPU 6; instance 7 -> GPU 7"
        ]
    );
    let bypass = dr
        .submissions
        .iter()
        .find(|s| s.stage_id == "bypass")
        .unwrap();
    assert_eq!(bypass.placement.len(), 2);
    assert!(bypass.placement[1].ends_with("instance 0 -> GPUs 0-7"));
    let bs = bypass.sbatch_script.as_ref().unwrap();
    assert!(
        bs.contains("#SBATCH --nodes=2")
            && bs.contains("#SBATCH --exclusive")
            && bs.contains("'--nnodes=2'"),
        "{bs}"
    );
    // Default partition comes from the runner when the stage has none.
    assert!(bs.contains("#SBATCH --partition='batch'"));
    assert_eq!(
        bypass.job_name,
        format!("pz-{}-bypass-a1", plan.contract_hash.short())
    );
}

#[test]
fn secrets_are_redacted_in_dry_runs() {
    let dir = tempfile::tempdir().unwrap();
    let plan = user_plan(
        "runner:\n  kind: slurm\n  execution_contract: {prerun_commands: [\"export HF_TOKEN=hf_abc123\", \"export HF_HOME=/data\"]}\n",
        dir.path(),
    );
    let text = render_dry_run(&plan, &DryRunOptions::default()).unwrap();
    assert!(
        text.contains("export HF_TOKEN=<redacted>") && !text.contains("hf_abc123"),
        "{text}"
    );
    assert!(text.contains("export HF_HOME=/data"));
    let raw = render_dry_run(
        &plan,
        &DryRunOptions {
            redact_secrets: false,
            ..DryRunOptions::default()
        },
    )
    .unwrap();
    assert!(raw.contains("hf_abc123"));
}

/// The dry run ends with a summary: a row per stage (strategy, instances, nodes x GPUs,
/// partition, resource, launcher, parents) and the node-hours at the time limits, each
/// computed here from the plan independently.
#[test]
fn dry_run_ends_with_a_stage_table_and_node_hours() {
    use puzzletron::campaign::PlanSummary;
    let plan = moe();
    let summary = PlanSummary::of(&plan);
    assert_eq!(summary.stages.len(), plan.stages.len());
    let runner_limit = plan
        .runner
        .slurm
        .as_ref()
        .and_then(|s| s.time_limit.as_ref())
        .map(|t| t.as_duration().as_secs())
        .expect("the Qwen runner sets a time limit");
    assert_eq!(runner_limit, 4 * 3600);
    let mut expected_hours = 0.0;
    for (row, st) in summary.stages.iter().zip(&plan.stages) {
        assert_eq!(row.stage_id, st.stage_id);
        assert_eq!(row.instances, st.spec.instances);
        assert_eq!(row.nodes, st.spec.allocation.nodes);
        assert_eq!(row.parents, st.parents);
        let limit = st
            .spec
            .time_limit
            .as_ref()
            .map_or(runner_limit, |t| t.as_duration().as_secs());
        assert_eq!(row.time_limit_s, Some(limit));
        expected_hours += f64::from(st.spec.allocation.nodes) * limit as f64 / 3600.0;
    }
    assert!((summary.node_hours() - expected_hours).abs() < 1e-9);
    let zs = summary
        .stages
        .iter()
        .find(|r| r.stage_id == "zero_shot_evaluation")
        .unwrap();
    assert_eq!(
        (
            zs.strategy.as_str(),
            zs.instances,
            zs.nodes,
            zs.gpus_per_node
        ),
        ("sharded", 8, 8, 8)
    );
    assert_eq!(zs.partition.as_deref(), Some("batch"));
    assert_eq!(
        (zs.resource.as_str(), zs.launcher.as_str()),
        ("gpu", "direct") // lm-eval starts its own processes (as the reference)
    );
    assert_eq!(zs.parents, ["mip"]);

    let text = render_dry_run(&plan, &DryRunOptions::default()).unwrap();
    let table = text.split("\n=== summary ===\n").nth(1).expect("a summary");
    let mut lines = table.lines();
    let header = lines.next().unwrap();
    for col in [
        "stage",
        "strategy",
        "instances",
        "nodes x GPUs",
        "partition",
        "resource",
        "launcher",
        "parents",
    ] {
        assert!(header.contains(col), "{header}");
    }
    let zs_line = table
        .lines()
        .find(|l| l.starts_with("zero_shot_evaluation "))
        .unwrap();
    let cells: Vec<&str> = zs_line
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        cells,
        [
            "zero_shot_evaluation",
            "sharded",
            "8",
            "8 x 8",
            "batch",
            "gpu",
            "direct",
            "4:00:00",
            "32.0",
            "mip"
        ]
    );
    assert!(
        table.contains(&format!(
            "total: {} stage(s), {expected_hours:.1} node-hours at their time limits\n",
            plan.stages.len()
        )),
        "{table}"
    );
}

/// A runner without time limits (local) counts no node-hours and says which stages it left out.
#[test]
fn summary_without_time_limits_names_the_stages_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let plan = user_plan("runner: {kind: local}", dir.path());
    let text = render_dry_run(&plan, &DryRunOptions::default()).unwrap();
    let table = text.split("\n=== summary ===\n").nth(1).expect("a summary");
    assert!(
        table.contains("total: 1 stage(s), 0.0 node-hours at their time limits (no time limit, not counted: train)"),
        "{table}"
    );
    let row = table.lines().nth(1).unwrap();
    assert!(row.starts_with("train "), "{row}");
    assert!(row.contains(" sharded "), "{row}");
    assert!(row.contains(" 1 x 4 "), "{row}");
}

/// Issue 9 item 5: nodes the campaign excluded appear in every rendered sbatch script as one
/// sorted, quoted `--exclude` directive; without exclusions there is none.
#[test]
fn excluded_nodes_are_one_quoted_exclude_directive() {
    let plan = moe();
    let plain = dry_run(&plan, &DryRunOptions::default()).unwrap();
    assert!(
        plain.submissions.iter().all(|s| !s
            .sbatch_script
            .as_deref()
            .unwrap()
            .contains("--exclude")),
    );
    let opts = DryRunOptions {
        exclude_nodes: vec!["n3".into(), "n2".into(), "n2".into()],
        ..DryRunOptions::default()
    };
    let d = dry_run(&plan, &opts).unwrap();
    assert!(!d.submissions.is_empty());
    for s in &d.submissions {
        let script = s.sbatch_script.as_deref().unwrap();
        assert_eq!(
            script
                .lines()
                .filter(|l| l.starts_with("#SBATCH --exclude"))
                .collect::<Vec<_>>(),
            ["#SBATCH --exclude='n2,n3'"],
            "{script}"
        );
    }
    let bad = DryRunOptions {
        exclude_nodes: vec!["n2\nrm -rf ~".into()],
        ..DryRunOptions::default()
    };
    assert!(dry_run(&plan, &bad).is_err());
}

/// N03 in the dry run: the `--signal=B:SIG@lead` line, the forwarding traps, and a warning for
/// each problem (lead not shorter than the limit, lead short of checkpoint + KillWait +
/// margin, a stage that cannot resume, USR1 on an NCCL job, no time limit at all).
#[test]
fn n03_dry_run_shows_the_signal_line_and_warns() {
    // (time limit, warning signal, resumable, signal line, warnings expected)
    type Case<'a> = (Option<&'a str>, &'a str, bool, &'a str, &'a [&'a str]);
    let cases: [Case; 5] = [
        (
            Some("4:00:00"),
            "USR2@300",
            true,
            "#SBATCH --signal='B:USR2@300'",
            &[],
        ),
        (
            Some("2:00"),
            "USR2@180",
            true,
            "#SBATCH --signal='B:USR2@180'",
            &["lead 180 s >= time limit 120 s"],
        ),
        (
            Some("4:00:00"),
            "USR1@90",
            false,
            "#SBATCH --signal='B:USR1@90'",
            &[
                "lead 90 s is short",
                "not resumable",
                "NCCL uses SIGUSR1 itself",
            ],
        ),
        (
            None,
            "600",
            true,
            "#SBATCH --signal='B:USR2@600'",
            &["without a time_limit"],
        ),
        (
            Some("10:00"),
            "TERM@600",
            true,
            "#SBATCH --signal='B:TERM@600'",
            &["lead 600 s >= time limit 600 s"],
        ),
    ];
    for (limit, sig, resumable, line, warnings) in cases {
        let runner = RunnerEnvironment::from_value(
            "runner.yaml",
            &node_yaml("runner:\n  kind: slurm\n  slurm: {partition: batch}\n"),
        )
        .unwrap();
        let config = node_yaml(&format!(
            "{{\"stages\": [{{\"id\": \"train\", \"distributed\": true, \"resumable\": {resumable}, \"parallel\": {{\"tp\": 2}}, \"command\": [\"python\", \"train.py\"]}}]}}"
        ));
        let mut stage = format!("{{warning_signal: \"{sig}\"");
        if let Some(l) = limit {
            stage.push_str(&format!(", time_limit: \"{l}\""));
        }
        stage.push('}');
        let execution = ExecutionConfig::from_value(
            "execution.yaml",
            &node_yaml(&format!("execution:\n  stages:\n    train: {stage}\n")),
        )
        .unwrap();
        let catalog = StageCatalog::from_config("exp", &config).unwrap();
        let plan =
            compile_resolved("exp", config, &[], &catalog, &runner, &execution, None).unwrap();
        let script = dry_run(&plan, &DryRunOptions::default())
            .unwrap()
            .submissions[0]
            .sbatch_script
            .clone()
            .unwrap();
        let label = format!("{limit:?} {sig} resumable={resumable}");
        assert!(script.lines().any(|l| l == line), "{label}: {script}");
        let sig_name = line.split(':').nth(1).unwrap().split('@').next().unwrap();
        assert!(
            script.contains(&format!(
                "trap 'kill -s {sig_name} \"${{pids[@]}}\" 2>/dev/null' {sig_name}\n"
            )),
            "{label}: {script}"
        );
        let got: Vec<&str> = script
            .lines()
            .filter(|l| l.starts_with("# WARNING: "))
            .collect();
        assert_eq!(got.len(), warnings.len(), "{label}: {got:?}");
        for w in warnings {
            assert!(
                got.iter().any(|g| g.contains(w)),
                "{label}: {w:?} in {got:?}"
            );
        }
        // The rendered text of a dry run shows it too.
        let text = render_dry_run(&plan, &DryRunOptions::default()).unwrap();
        assert!(text.contains(line), "{label}");
    }
    // A bad signal is refused when the execution config is read, naming the key.
    let e = ExecutionConfig::from_value(
        "execution.yaml",
        &node_yaml("execution:\n  stages:\n    train: {warning_signal: \"KILL@10\"}\n"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("execution.stages.train.warning_signal"), "{e}");
}
