//! Dry runs: the executors' renderings of the controller's own attempt-1 specs. Slurm batch
//! scripts (quoting checked by running them against stub `srun`/`scontrol`/`torchrun`),
//! bare-metal ssh remote commands (run through a real shell: the submit script starts the job),
//! local argv/env, GPU placement, secret redaction.

mod support;
use support::plan::PlanBuilder;
use support::plan::fixtures;

use std::path::Path;
use std::process::Command;

use puzzletron::campaign::config::Value;
use puzzletron::campaign::config::{ConfigLoader, Env};
use puzzletron::campaign::{
    CampaignPlan, ExecutionConfig, RunnerEnvironment, compile_campaign_plan_with,
};
use puzzletron::campaign::{DryRun, DryRunOptions, PlanError, StageSubmission, default_executor};

/// The dry run with the executor `campaign run` would build on `opts.campaign_dir`.
fn dry_run(plan: &CampaignPlan, opts: &DryRunOptions) -> Result<DryRun, PlanError> {
    let ex = default_executor(plan, &opts.campaign_dir, &[], None)?;
    puzzletron::campaign::dry_run(plan, opts, ex.as_ref())
}

/// The dry run as text, with that executor.
fn render_dry_run(plan: &CampaignPlan, opts: &DryRunOptions) -> Result<String, PlanError> {
    let ex = default_executor(plan, &opts.campaign_dir, &[], None)?;
    puzzletron::campaign::render_dry_run(plan, opts, ex.as_ref())
}

/// The batch script of job `i` of a Slurm stage submission.
fn script(s: &StageSubmission, i: usize) -> &str {
    &s.jobs[i].rendering.files[0].content
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
    PlanBuilder::config(node_yaml(&config))
        .runner(runner)
        .build()
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
        "while [[ \"$1\" == --* ]]; do echo \"srun $1\"; shift; done\nexec \"$@\"",
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
    let opts = DryRunOptions::default().with_campaign_dir(work.join("campaign"));
    let dr = dry_run(&plan, &opts).unwrap();
    // One job per instance: two 2-GPU instances, each its own job.
    assert_eq!(dr.submissions[0].jobs.len(), 2);
    let script = script(&dr.submissions[0], 1).to_string();
    assert!(
        script.contains("#SBATCH --account=\"acct'; touch pwned4; '\"\n"),
        "{script}"
    );
    for line in [
        "#SBATCH --job-name=TAG.train.1.a1",
        "#SBATCH --partition=batch",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=2",
        "#SBATCH --time=60",
        "export PUZZLETRON_WORK_ID=train:1",
    ] {
        assert!(script.lines().any(|l| l == line), "{line:?} in\n{script}");
    }
    assert!(
        !script.contains("--exclusive"),
        "2 of 8 GPUs share the node: {script}"
    );
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
        // `{work_id}` in an argument is filled in by the compiler's placeholder pass.
        "train:1",
    ] {
        assert!(
            stdout.lines().any(|l| l == literal),
            "missing {literal:?} in:\n{stdout}"
        );
    }
    // One torchrun on the one node, standalone, the stage command as an argv.
    for l in [
        "srun --ntasks-per-node=1",
        "torchrun --standalone",
        "torchrun --nnodes=1",
        "torchrun --nproc_per_node=2",
        "torchrun --no-python",
    ] {
        assert!(stdout.lines().any(|x| x == l), "{l:?} in {stdout}");
    }
}

#[test]
fn sbatch_directives_refuse_newlines() {
    let dir = tempfile::tempdir().unwrap();
    // The runner file is refused at load, naming the key (compile then names its line).
    let e = RunnerEnvironment::from_value(
        "runner.yaml",
        &node_yaml("runner:\n  kind: slurm\n  slurm: {account: \"a\\nrm -rf ~\"}\n"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`runner.slurm.account`") && e.contains("control characters"),
        "{e}"
    );
    // A runner built in code with such a value: the script renderer refuses it too.
    let mut plan = user_plan(
        "runner:\n  kind: slurm\n  slurm: {account: a}\n",
        dir.path(),
    );
    plan.runner.slurm.as_mut().unwrap().account = Some("a\nrm -rf ~".into());
    let e = dry_run(&plan, &DryRunOptions::default()).unwrap_err();
    assert!(e.to_string().contains("control characters"), "{e}");
}

/// The bare-metal rendering is the `ssh` command itself: run its remote command line with a
/// real shell (as sshd's login shell would), and the submit script starts the job, in the
/// checkout, with the venv, its GPUs and the hostile arguments intact.
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
    let opts = DryRunOptions::default().with_campaign_dir(work.join("campaign"));
    let dr = dry_run(&plan, &opts).unwrap();
    let jobs = &dr.submissions[0].jobs;
    assert_eq!(jobs.len(), 2);
    let cmd = &jobs[1].rendering.commands[0];
    assert_eq!(cmd.host.as_deref(), Some("h1"));
    assert_eq!(cmd.argv[0], "ssh");
    assert_eq!(&cmd.argv[1..3], ["-o", "BatchMode=yes"]);
    let n = cmd.argv.len();
    assert_eq!(&cmd.argv[n - 3..n - 1], ["--", "h1"]);
    let remote = &cmd.argv[n - 1];
    // On idle hosts each 2-GPU instance gets the first free GPUs: 0,1.
    assert!(remote.contains("CUDA_VISIBLE_DEVICES=0,1"), "{remote}");
    // What ssh's remote shell would do: run it (torchrun replaced by a stub).
    let bin = work.join("bin");
    std::fs::create_dir(&bin).unwrap();
    stub(
        &bin,
        "torchrun",
        "while [[ \"$1\" == --* ]]; do [[ \"$1\" == --no-python ]] && { shift; break; }; shift; done\necho \"ACTIVATED=$ACTIVATED CVD=$CUDA_VISIBLE_DEVICES PWD=$PWD\"\nexec \"$@\"",
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(remote)
        .current_dir(work)
        .env("PUZZLETRON_BAREMETAL_ROOT", work.join("remote"))
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
    assert!(
        out.status.success()
            && String::from_utf8_lossy(&out.stdout).trim()
                == format!("OK {}", jobs[1].attempt_id.as_str()),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The job runs detached; its exit record and log appear.
    let exit = work
        .join("remote")
        .join(jobs[1].attempt_id.as_str())
        .join("exit");
    let t = std::time::Instant::now();
    while !exit.exists() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "no exit record"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(std::fs::read_to_string(&exit).unwrap().contains("code=0"));
    let log = work
        .join("campaign/logs")
        .join(format!("{}.log", jobs[1].attempt_id));
    let stdout = std::fs::read_to_string(&log).unwrap();
    assert!(
        stdout.contains(&format!("ACTIVATED=yes CVD=0,1 PWD={}", repo.display())),
        "{stdout}"
    );
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
fn local_processes_get_argv_env_and_cwd() {
    let dir = tempfile::tempdir().unwrap();
    let plan = user_plan(
        "runner:\n  kind: local\n  execution_contract: {repository: /src}\n",
        dir.path(),
    );
    let opts = DryRunOptions::default().with_campaign_dir(dir.path().join("campaign"));
    let dr = dry_run(&plan, &opts).unwrap();
    let jobs = &dr.submissions[0].jobs;
    assert_eq!(jobs.len(), 2);
    let cmd = &jobs[1].rendering.commands[0];
    assert_eq!(cmd.host, None);
    assert_eq!(
        &cmd.argv[..6],
        [
            "torchrun",
            "--standalone",
            "--nnodes=1",
            "--nproc_per_node=2",
            "--max-restarts=0",
            "--no-python"
        ]
    );
    assert!(cmd.argv.contains(&"$(touch pwned1)".to_string()));
    assert_eq!(cmd.cwd.as_deref(), Some(Path::new("/src")));
    assert_eq!(cmd.env["PUZZLETRON_WORK_ID"], "train:1");
    assert_eq!(cmd.env["PUZZLETRON_ATTEMPT_ID"], "TAG.train.1.a1");
    assert_eq!(cmd.env["PUZZLETRON_GPUS_PER_NODE"], "2");
    // The GPUs are the executor's choice at start, and the rendering says so.
    assert!(
        jobs[1].rendering.notes[0]
            .starts_with("CUDA_VISIBLE_DEVICES: 2 of this executor's GPUs 0,1,2,3,4,5,6,7"),
        "{:?}",
        jobs[1].rendering.notes
    );
    assert_eq!(
        dr.submissions[0].placement,
        ["node 0 (localhost, 4/8 GPUs): instance 0 -> GPUs 0-1; instance 1 -> GPUs 2-3"]
    );
}

#[test]
fn moe_dry_run_renders_every_unit_with_placement() {
    let plan = moe();
    let dr = dry_run(&plan, &DryRunOptions::default()).unwrap();
    let jobs: usize = dr.submissions.iter().map(|s| s.jobs.len()).sum();
    let text = render_dry_run(&plan, &DryRunOptions::default()).unwrap();
    assert_eq!(text.matches("=== stage ").count(), plan.stages.len());
    assert_eq!(text.matches("#!/bin/bash").count(), jobs);
    // Every placeholder of the runner is named once at the top.
    assert!(text.contains(
        "WARNING: runner value `runner.slurm.account` = \"REPLACE_WITH_SLURM_ACCOUNT\" is a placeholder"
    ));
    let vllm = dr
        .submissions
        .iter()
        .find(|s| s.stage_id == "vllm_stats")
        .unwrap();
    assert_eq!(
        vllm.jobs.len(),
        9,
        "one job per instance, then the aggregate step"
    );
    assert_eq!(vllm.jobs[8].unit, "vllm_stats/agg");
    let s = script(vllm, 7);
    for line in [
        "#SBATCH --job-name=TAG.vllm_stats.7.a1",
        "#SBATCH --partition=interactive",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --time=240",
        "#SBATCH --account=REPLACE_WITH_SLURM_ACCOUNT",
        // Prerun commands are written verbatim.
        "source REPLACE_WITH_SITE_SETUP_SCRIPT",
    ] {
        assert!(s.lines().any(|l| l == line), "{line:?} in\n{s}");
    }
    // A 1-GPU instance shares its node (a whole node per job would waste 7 GPUs).
    assert!(!s.contains("--exclusive"), "{s}");
    assert!(
        s.contains("--container-image=REPLACE_WITH_SLURM_CONTAINER_IMAGE"),
        "{s}"
    );
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
    let bs = script(bypass, 0);
    for line in [
        "#SBATCH --nodes=2",
        "#SBATCH --exclusive",
        "#SBATCH --gpus-per-node=8",
        // Default partition comes from the runner when the stage has none.
        "#SBATCH --partition=batch",
    ] {
        assert!(bs.lines().any(|l| l == line), "{line:?} in\n{bs}");
    }
    assert!(bs.contains(" --nnodes=2 "), "{bs}");
    assert_eq!(bypass.jobs[0].attempt_id.as_str(), "TAG.bypass.0.a1");
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
        text.contains("\nexport HF_TOKEN=<redacted>\n") && !text.contains("hf_abc123"),
        "{text}"
    );
    assert!(text.contains("export HF_HOME=/data"));
    let raw = render_dry_run(&plan, &DryRunOptions::default().with_redact_secrets(false)).unwrap();
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
fn excluded_nodes_are_one_exclude_directive() {
    let plan = moe();
    let plain = dry_run(&plan, &DryRunOptions::default()).unwrap();
    let scripts = |d: &DryRun| -> Vec<String> {
        d.submissions
            .iter()
            .flat_map(|s| (0..s.jobs.len()).map(move |i| script(s, i).to_string()))
            .collect()
    };
    assert!(scripts(&plain).iter().all(|s| !s.contains("--exclude")));
    let opts =
        DryRunOptions::default().with_exclude_nodes(vec!["n3".into(), "n2".into(), "n2".into()]);
    let d = dry_run(&plan, &opts).unwrap();
    assert!(!d.submissions.is_empty());
    for script in scripts(&d) {
        assert_eq!(
            script
                .lines()
                .filter(|l| l.starts_with("#SBATCH --exclude"))
                .collect::<Vec<_>>(),
            ["#SBATCH --exclude=n2,n3"],
            "{script}"
        );
    }
    let bad = DryRunOptions::default().with_exclude_nodes(vec!["n2\nrm -rf ~".into()]);
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
            "#SBATCH --signal=B:USR2@300",
            &[],
        ),
        (
            Some("2:00"),
            "USR2@180",
            true,
            "#SBATCH --signal=B:USR2@180",
            &["lead 180 s >= time limit 120 s"],
        ),
        (
            Some("4:00:00"),
            "USR1@90",
            false,
            "#SBATCH --signal=B:USR1@90",
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
            "#SBATCH --signal=B:USR2@600",
            &["without a time_limit"],
        ),
        (
            Some("10:00"),
            "TERM@600",
            true,
            "#SBATCH --signal=B:TERM@600",
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
        let plan = PlanBuilder::config(config)
            .runner(runner)
            .execution_config(execution)
            .build();
        let dr = dry_run(&plan, &DryRunOptions::default()).unwrap();
        let script = script(&dr.submissions[0], 0).to_string();
        let label = format!("{limit:?} {sig} resumable={resumable}");
        assert!(script.lines().any(|l| l == line), "{label}: {script}");
        let sig_name = line.split(':').nth(1).unwrap().split('@').next().unwrap();
        assert!(
            script.contains(&format!(
                "trap 'kill -s {sig_name} \"$step\" 2>/dev/null' {sig_name}\n"
            )),
            "{label}: {script}"
        );
        let got: Vec<&String> = dr.submissions[0].warnings.iter().collect();
        assert_eq!(got.len(), warnings.len(), "{label}: {got:?}");
        for w in warnings {
            assert!(
                got.iter().any(|g| g.contains(w)),
                "{label}: {w:?} in {got:?}"
            );
        }
        // The rendered text of a dry run shows it too, and each warning.
        let text = render_dry_run(&plan, &DryRunOptions::default()).unwrap();
        assert!(text.contains(line), "{label}");
        for w in &got {
            assert!(text.contains(&format!("WARNING: {w}")), "{label}");
        }
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
