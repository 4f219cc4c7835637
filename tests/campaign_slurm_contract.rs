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

mod support;
use support::plan::PlanBuilder;
use support::{slurm, watchdog};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use puzzletron::campaign::config::Value;
use puzzletron::campaign::controller::{CampaignController, RunOptions, ViewMode};
use puzzletron::campaign::{CampaignPlan, ExecutionConfig, RunnerEnvironment};
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
    let execution = ExecutionConfig::from_value("execution.yaml", &node_yaml(execution)).unwrap();
    PlanBuilder::config(node_yaml(&format!("{{\"stages\": [{stage}]}}")))
        .runner(runner)
        .execution_config(execution)
        .build()
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

/// Issue 27, item 1 on the real cluster: the node the first job reaches becomes a broken node
/// (the runner's prerun command, run by the batch script before the payload, fails there, as
/// a missing mount or module would): its jobs end `FAILED 1:0` within a second, before their
/// start mark. Once two distinct units failed that way it is excluded (journaled, named in the
/// report, `--exclude` in every later batch script), the units are retried on the other nodes
/// and the stage completes.
#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_failing_jobs_fast_is_excluded_after_two_units_and_the_stage_completes() {
    if !slurm::cluster_available("a_node_failing_jobs_fast") {
        return;
    }
    let _w = watchdog::Watchdog::start("node_failing_fast", Duration::from_secs(300));
    let tmp = scratch("contract-badnode-");
    let dir = tmp.path().join("c");
    let bad_file = tmp.path().join("bad-node");
    // The first job to get here names its node the bad one (created exclusively: one name).
    let prerun = format!(
        "(set -C; printf '%s\\n' \"$SLURMD_NODENAME\" > {bad}) 2>/dev/null; if [ \"$(cat {bad})\" = \"$SLURMD_NODENAME\" ]; then echo \"prerun: scratch mount missing on $SLURMD_NODENAME\" >&2; exit 1; fi",
        bad = bad_file.display()
    );
    let p = plan(
        &format!(
            "runner:\n  kind: slurm\n  slurm: {{partition: debug, time_limit: \"0:05:00\"}}\n  execution_contract:\n    prerun_commands: [{prerun:?}]\n"
        ),
        &format!(
            "{{\"id\": \"s\", \"strategy\": \"sharded\", \"instances\": 6, \"command\": [\"sh\", \"-c\", {:?}]}}",
            format!("sleep 2; {MARK}")
        ),
        "execution:\n  defaults: {gpus_per_node: 4, max_attempts: 3, failure_policy: resume}\n",
    );
    let (report, ids) = run(p, &dir).await;
    let bad = std::fs::read_to_string(&bad_file)
        .unwrap()
        .trim()
        .to_string();
    assert!(!bad.is_empty());
    assert!(report.is_complete(), "{report}");
    let journal: Vec<serde_json::Value> =
        std::fs::read_to_string(dir.join("controller/journal.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["entry"].clone())
            .collect();
    let fast: Vec<&serde_json::Value> = journal
        .iter()
        .filter(|e| e["t"] == "finished" && e["fail_fast"] == true)
        .collect();
    assert!(fast.len() >= 2, "{journal:?}");
    for f in &fast {
        assert_eq!(f["nodes"], bad.as_str(), "{f}");
        assert_eq!(f["class"], "transient", "{f}");
        assert!(
            f["detail"]
                .as_str()
                .unwrap()
                .contains("before its start mark"),
            "{f}"
        );
    }
    let excluded: Vec<&serde_json::Value> = journal
        .iter()
        .filter(|e| e["t"] == "node_excluded")
        .collect();
    assert_eq!(excluded.len(), 1, "{excluded:?}");
    assert_eq!(excluded[0]["node"], bad.as_str());
    let h = puzzletron::report::CampaignHistory::load(&dir, false).unwrap();
    assert_eq!(h.excluded_nodes.len(), 1);
    assert_eq!(h.excluded_nodes[0].1, bad);
    // Every job that succeeded ran elsewhere; every attempt after the exclusion carried it.
    let excluded_at = journal
        .iter()
        .position(|e| e["t"] == "node_excluded")
        .unwrap();
    let later: Vec<String> = journal[excluded_at..]
        .iter()
        .filter(|e| e["t"] == "intent")
        .map(|e| e["attempt_id"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !later.is_empty(),
        "retries after the exclusion: {journal:?}"
    );
    for id in &ids {
        let row = sacct_row(id, "State,NodeList");
        if row[0] == "COMPLETED" {
            assert_ne!(row[1], bad, "{id} completed on the bad node");
        }
    }
    for id in later {
        let script = std::process::Command::new("sacct")
            .args([
                "-n",
                "-X",
                "-P",
                "-S",
                "now-2hours",
                "--name",
                &id,
                "-o",
                "NodeList",
            ])
            .output()
            .unwrap();
        let nodes = String::from_utf8_lossy(&script.stdout).trim().to_string();
        assert_ne!(nodes, bad, "{id} ran on the excluded node");
    }
}
