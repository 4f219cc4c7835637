//! The whole execution contract reaches the jobs on the real local cluster (issue 25):
//!
//! - a runner naming account `vision`, partition `short`, QOS `long` and a time limit submits
//!   jobs whose `sacct` rows carry exactly those;
//! - a runner naming an account that does not exist is refused by `sbatch` (the cluster
//!   enforces associations), and the attempt fails once, as a configuration failure naming
//!   `runner.slurm.account`, never retried;
//! - a stage of one 2-node instance runs one torchrun per node (the stand-in of
//!   `tests/support/bin`, put in `PATH` by the runner's prerun command, as a site would load
//!   its modules), and the rank files name two distinct nodes with the right `RANK`,
//!   `WORLD_SIZE` and `MASTER_ADDR`.
//!
//! The cluster (`../shared/slurm/start-local-cluster.sh`) has accounts `research` (root's
//! default) and `vision`, QOS `normal` and `long`, and a partition `short` with `MaxTime=10`.
#![cfg(feature = "slurm")]

#[path = "support/slurm.rs"]
mod slurm;
#[path = "support/watchdog.rs"]
mod watchdog;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use puzzletron::campaign::config::Value;
use puzzletron::campaign::controller::{CampaignController, RunOptions, ViewMode};
use puzzletron::campaign::{
    CampaignPlan, ExecutionConfig, RunnerEnvironment, StageCatalog, compile_resolved,
};
use puzzletron::executor::SlurmExecutor;

fn node_yaml(text: &str) -> Value {
    let v = puzzletron::campaign::config::load_yaml_str(text, Path::new("mem.yaml"))
        .unwrap()
        .value;
    Value::from_json(&serde_json::to_value(&v).unwrap())
}

/// A one-stage campaign running `script` with `sh -c` (it must write the success marker).
fn plan(runner: &str, stage: &str, execution: &str) -> CampaignPlan {
    let runner = RunnerEnvironment::from_value("runner.yaml", &node_yaml(runner)).unwrap();
    let config = node_yaml(&format!("{{\"stages\": [{stage}]}}"));
    let catalog = StageCatalog::from_config("exp", &config).unwrap();
    let execution = ExecutionConfig::from_value("execution.yaml", &node_yaml(execution)).unwrap();
    compile_resolved("exp", config, &[], &catalog, &runner, &execution, None).unwrap()
}

fn scratch(name: &str) -> tempfile::TempDir {
    // On the shared target folder: the cluster's nodes (this machine) see it.
    tempfile::Builder::new()
        .prefix(name)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

/// Runs the campaign in `dir` to its end; returns the report and the attempt ids.
async fn run(
    plan: CampaignPlan,
    dir: &Path,
) -> (
    puzzletron::campaign::controller::CampaignReport,
    Vec<String>,
) {
    let exec = SlurmExecutor::builder(dir.join("slurm-logs"))
        .build()
        .unwrap();
    let mut ctl = CampaignController::builder()
        .plan(plan)
        .executor(Arc::new(exec))
        .campaign_dir(dir)
        .poll_interval(Duration::from_millis(500), Duration::from_secs(2))
        .view(ViewMode::Off)
        .build()
        .unwrap();
    let report = ctl.run(RunOptions::default()).await.unwrap();
    let ids = ctl.attempt_ids().iter().map(|a| a.to_string()).collect();
    (report, ids)
}

/// `sacct` fields of the job named `name` (the allocation's row), waiting for accounting.
fn sacct_row(name: &str, fields: &str) -> Vec<String> {
    let t = Instant::now();
    loop {
        let out = std::process::Command::new("sacct")
            .args([
                "-n",
                "-P",
                "-X",
                "-S",
                "now-2hours",
                "--name",
                name,
                "-o",
                fields,
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if let Some(line) = text.lines().find(|l| !l.trim().is_empty()) {
            return line.split('|').map(str::to_string).collect();
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no sacct row for {name}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

const MARK: &str = "touch \"$PUZZLETRON_OUTPUT_DIR/_SUCCESS\"";

#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn account_partition_qos_and_time_limit_reach_sacct() {
    if !slurm::cluster_available("account_partition_qos_and_time_limit_reach_sacct") {
        return;
    }
    let _w = watchdog::Watchdog::start("account_partition_qos", Duration::from_secs(240));
    let tmp = scratch("contract-acct-");
    let p = plan(
        "runner:\n  kind: slurm\n  slurm: {account: vision, partition: short, qos: long, time_limit: \"0:07:00\"}\n",
        &format!(
            "{{\"id\": \"s\", \"command\": [\"sh\", \"-c\", {:?}]}}",
            MARK
        ),
        "execution:\n  defaults: {gpus_per_node: 4}\n",
    );
    let (report, ids) = run(p, &tmp.path().join("c")).await;
    assert!(report.is_complete(), "{report}");
    assert_eq!(ids.len(), 1);
    let row = sacct_row(&ids[0], "Account,Partition,QOS,Timelimit,State");
    assert_eq!(
        row,
        ["vision", "short", "long", "00:07:00", "COMPLETED"],
        "sacct of {}",
        ids[0]
    );
}

#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_account_is_a_configuration_failure_naming_the_runner_key_never_retried() {
    if !slurm::cluster_available("an_unknown_account") {
        return;
    }
    let _w = watchdog::Watchdog::start("unknown_account", Duration::from_secs(240));
    let tmp = scratch("contract-noacct-");
    let dir = tmp.path().join("c");
    let p = plan(
        "runner:\n  kind: slurm\n  slurm: {account: no-such-account, partition: short, time_limit: \"0:05:00\"}\n",
        &format!(
            "{{\"id\": \"s\", \"command\": [\"sh\", \"-c\", {:?}]}}",
            MARK
        ),
        "execution:\n  defaults: {gpus_per_node: 4, max_attempts: 3}\n",
    );
    let (report, _) = run(p, &dir).await;
    assert!(!report.is_complete());
    let journal = std::fs::read_to_string(dir.join("controller/journal.jsonl")).unwrap();
    let intents = journal.matches("\"t\":\"intent\"").count();
    assert_eq!(intents, 1, "never retried:\n{journal}");
    let decided = journal
        .lines()
        .find(|l| l.contains("\"t\":\"decided\""))
        .unwrap_or_else(|| panic!("no decision:\n{journal}"));
    assert!(
        decided.contains("\"decision\":\"fail\"")
            && decided.contains("config: fatal:")
            && decided.contains("check runner.slurm.account = \\\"no-such-account\\\""),
        "{decided}"
    );
    assert!(
        decided.to_ascii_lowercase().contains("invalid account"),
        "sbatch's own words: {decided}"
    );
}

#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_node_instance_runs_one_torchrun_per_node() {
    if !slurm::cluster_available("a_two_node_instance_runs_one_torchrun_per_node") {
        return;
    }
    let _w = watchdog::Watchdog::start("two_node_torchrun", Duration::from_secs(240));
    let tmp = scratch("contract-2node-");
    let dir = tmp.path().join("c");
    let bin: PathBuf = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/bin"));
    // Each worker writes a rank file named by its RANK: node, ranks, world, rendezvous.
    let worker = "d=$PUZZLETRON_OUTPUT_DIR; echo \"$SLURMD_NODENAME $SLURM_NODEID $RANK $LOCAL_RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT\" > \"$d/rank.$RANK\"; touch \"$d/_SUCCESS\"";
    let p = plan(
        &format!(
            "runner:\n  kind: slurm\n  slurm: {{partition: gpu, time_limit: \"0:05:00\"}}\n  execution_contract:\n    prerun_commands: [{:?}]\n",
            format!("export PATH={}:$PATH", bin.display())
        ),
        &format!(
            "{{\"id\": \"train\", \"distributed\": true, \"parallel\": {{\"tp\": 8}}, \"command\": [\"sh\", \"-c\", {:?}]}}",
            worker
        ),
        "execution:\n  defaults: {gpus_per_node: 4}\n",
    );
    let st = &p.stages[0];
    assert_eq!(
        st.spec.allocation.nodes, 2,
        "tp=8 over 4-GPU nodes: one 2-node instance"
    );
    let port = st.work.topology.groups[0]
        .rendezvous
        .as_ref()
        .unwrap()
        .master_port;
    let (report, ids) = run(p, &dir).await;
    assert!(report.is_complete(), "{report}");
    let out = dir.join("work/train/0");
    let mut rows: Vec<Vec<String>> = (0..8)
        .map(|r| {
            let text = std::fs::read_to_string(out.join(format!("rank.{r}")))
                .unwrap_or_else(|e| panic!("rank {r}: {e}"));
            text.split_whitespace().map(str::to_string).collect()
        })
        .collect();
    rows.sort_by_key(|r| r[2].parse::<u32>().unwrap());
    let nodes: std::collections::BTreeSet<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(nodes.len(), 2, "two distinct nodes: {rows:?}");
    // The allocation's first node is the rendezvous host: the one of node rank 0.
    let head = &rows[0][0];
    for (rank, r) in rows.iter().enumerate() {
        let node_id: usize = r[1].parse().unwrap();
        assert_eq!(r[2], rank.to_string(), "{r:?}");
        assert_eq!(
            node_id,
            rank / 4,
            "ranks 0-3 on node 0, 4-7 on node 1: {r:?}"
        );
        assert_eq!(r[3], (rank % 4).to_string(), "LOCAL_RANK: {r:?}");
        assert_eq!(r[4], "8", "WORLD_SIZE: {r:?}");
        assert_eq!(&r[5], head, "MASTER_ADDR is the first node: {r:?}");
        assert_eq!(
            r[6],
            port.to_string(),
            "the group's own rendezvous port: {r:?}"
        );
    }
    let row = sacct_row(&ids[0], "NNodes,State");
    assert_eq!(row, ["2", "COMPLETED"]);
}
