//! From a work unit to the [`AttemptSpec`] an executor runs: argv, environment, GPUs, log.
//!
//! Every attempt gets, besides [`ATTEMPT_ID_ENV`](crate::executor::ATTEMPT_ID_ENV) from the
//! executor:
//!
//! | variable | value |
//! | --- | --- |
//! | `PUZZLETRON_CAMPAIGN_DIR` | the campaign folder (also the working directory when the execution contract names no repository) |
//! | `PUZZLETRON_STAGE` | stage id |
//! | `PUZZLETRON_UNIT` | unit key, e.g. `score/3`, `score/agg` |
//! | `PUZZLETRON_WORK_ID` | work item id (`score:3`) |
//! | `PUZZLETRON_SHARD_INDEX`, `PUZZLETRON_SHARD_COUNT` | the shard (0/1 for single) |
//! | `PUZZLETRON_PHASE` | `work`, `aggregate` or `pool_worker` |
//! | `PUZZLETRON_OUTPUT_DIR` | `<campaign>/work/<stage>/<index or agg>`, kept across attempts (checkpoints) |
//! | `PUZZLETRON_RESUME` | `1` when the attempt should resume from its checkpoint, else `0` |
//! | `PUZZLETRON_RESUME_FROM` | with `PUZZLETRON_RESUME=1`: the checkpoint found (N03), e.g. `ckpt/step_1200` |
//! | `PUZZLETRON_ATTEMPT` | attempt number of the unit, from 1 |
//! | `PUZZLETRON_MORE_RESOURCES` | `1` on the retry after an out-of-memory |
//! | `PUZZLETRON_QUEUE_DIR` | pool workers: the stage's queue |
//! | `PUZZLETRON_HEARTBEAT_FILE` | `<output dir>/_HEARTBEAT`: a worker may touch it to show progress (heartbeat timeout) |
//! | `PUZZLETRON_START_FILE` | `<output dir>/_STARTED`: the start mark, written by the job (Slurm: its batch script, after its setup) with the attempt id just before the payload starts |
//! | `PUZZLETRON_GPUS_PER_NODE` | GPU stages: the GPUs the mesh needs on each node, for the worker's preflight ([`gpu::preflight`](crate::executor::gpu::preflight), N04) |
//!
//! The retry after an out-of-memory asks for the node exclusively (`--exclusive`: no other
//! instance shares its memory or GPUs, i.e. fewer instances per node); the payload sees
//! `PUZZLETRON_MORE_RESOURCES=1` and may halve its batch size. (Compiled plans carry no
//! memory request, so there is no `--mem` to raise.)

use std::path::{Path, PathBuf};

use super::classify::CheckpointEvidence;
use super::error::ControllerError;
use super::pool::QUEUE_DIR_ENV;
use crate::campaign::item_argv;
use crate::campaign::{CampaignPlan, Resource, StagePlan, Strategy};
use crate::executor::gpu::GPUS_PER_NODE_ENV;
use crate::executor::{
    AttemptId, AttemptSpec, CommandSpec, GpuRequest, SchedulerOptions, TaskLauncher, TaskTopology,
};

/// Success marker a payload may write into its output folder when it finished (see
/// [`classify`](mod@super::classify) rule 1).
pub(crate) const SUCCESS_MARKER: &str = "_SUCCESS";

/// Heartbeat file a worker may touch in its output folder (`PUZZLETRON_HEARTBEAT_FILE`): its
/// modification time is a progress mark for the stage's heartbeat timeout, besides `step N`
/// lines in the logs.
pub(crate) const HEARTBEAT_FILE: &str = "_HEARTBEAT";
/// The start mark in the output folder ([`START_FILE_ENV`](crate::executor::START_FILE_ENV)):
/// holds the id of the attempt whose payload started last.
pub(crate) const START_MARKER: &str = "_STARTED";

/// Marker a resumable worker writes into its output folder after each complete checkpoint
/// (N03): a timed-out attempt with it resumes, one without it (and without a complete
/// [`CHECKPOINT_DIR`] step) is a fatal timeout. Its first line (`step 1200`) names it.
pub(crate) const CHECKPOINT_MARKER: &str = "_CHECKPOINT";

/// Folder of step checkpoints in the output folder, `ckpt/step_<N>/`; a `step_<N>.tmp` is
/// one still being written (partial).
pub(crate) const CHECKPOINT_DIR: &str = "ckpt";

/// What the output folder `out` holds to resume from (N03): the [`CHECKPOINT_MARKER`] (with
/// its first line), else the highest complete `ckpt/step_<N>` (names with a `.tmp` or other
/// suffix are partial and never count).
pub(crate) fn find_checkpoint(out: &Path) -> CheckpointEvidence {
    if let Ok(text) = std::fs::read_to_string(out.join(CHECKPOINT_MARKER)) {
        let first = text.lines().next().unwrap_or("").trim();
        let first: String = first.chars().take(200).collect();
        return CheckpointEvidence::Found(if first.is_empty() {
            CHECKPOINT_MARKER.to_string()
        } else {
            format!("{CHECKPOINT_MARKER}: {first}")
        });
    }
    let best = std::fs::read_dir(out.join(CHECKPOINT_DIR))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n: u64 = name.strip_prefix("step_")?.parse().ok()?;
            Some((n, name))
        })
        .max();
    match best {
        Some((_, name)) => CheckpointEvidence::Found(format!("{CHECKPOINT_DIR}/{name}")),
        None => CheckpointEvidence::Missing,
    }
}

/// Moves the partial checkpoints (`ckpt/*.tmp`) of a timed-out attempt aside, into
/// `ckpt_partial/<attempt id>/`, so the resumed attempt never loads one (N03). Returns what
/// was moved, and a line per entry that could not be (the caller reports them).
pub(crate) fn move_partial_checkpoints_aside(out: &Path, attempt_id: &AttemptId) -> Vec<String> {
    let aside = out.join("ckpt_partial").join(attempt_id.as_str());
    let mut moved = Vec::new();
    for e in std::fs::read_dir(out.join(CHECKPOINT_DIR))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".tmp") {
            continue;
        }
        let r = std::fs::create_dir_all(&aside)
            .and_then(|()| std::fs::rename(e.path(), aside.join(&name)));
        moved.push(match r {
            Ok(()) => {
                format!("partial {CHECKPOINT_DIR}/{name} moved to ckpt_partial/{attempt_id}/")
            }
            Err(why) => format!("partial {CHECKPOINT_DIR}/{name} could not be moved aside: {why}"),
        });
    }
    moved
}

/// The output folder of a unit.
pub(crate) fn output_dir(campaign: &Path, stage: &str, item: Option<usize>) -> PathBuf {
    let leaf = item.map_or_else(|| "agg".to_string(), |i| i.to_string());
    campaign.join("work").join(stage).join(leaf)
}

/// The decision file of manual decision stage `stage`: `<campaign>/decisions/<stage>.txt`.
/// Its content uses [`choose_revisions`](super::choose_revisions)' grammar: `all`, `none`, or
/// candidate numbers (from 1) and ids separated by spaces or commas.
pub(crate) fn decision_file(campaign: &Path, stage: &str) -> PathBuf {
    campaign.join(crate::campaign::decision_file_name(stage))
}

/// The file a manual decision stage writes its choice to:
/// `<campaign>/work/<stage>/0/selected.json`.
pub(crate) fn selection_file(campaign: &Path, stage: &str) -> PathBuf {
    output_dir(campaign, stage, Some(0)).join(SELECTION_FILE)
}

/// File name of a manual decision's choice in its output folder.
pub(crate) const SELECTION_FILE: &str = "selected.json";

/// The queue folder of a pool stage.
pub(crate) fn queue_dir(campaign: &Path, stage: &str) -> PathBuf {
    campaign.join("queues").join(stage)
}

/// The units of a stage, in the controller's order: one per work item (`<stage>/<index>`),
/// then the aggregate step (`<stage>/agg`) of a sharded stage whose shards are merged. A
/// manual decision has none.
pub(crate) fn stage_units(st: &StagePlan) -> Vec<(String, Option<usize>)> {
    if st.decision.is_some() {
        return Vec::new();
    }
    let mut units: Vec<(String, Option<usize>)> = (0..st.work.items.len())
        .map(|i| (format!("{}/{i}", st.stage_id), Some(i)))
        .collect();
    if st.work.strategy == Strategy::Sharded && st.work.aggregate_required {
        units.push((format!("{}/agg", st.stage_id), None));
    }
    units
}

/// The attempt id of attempt `n` of a unit: `<tag>[r<revision>].<stage>.<index|agg>.a<n>`
/// (sanitised to an [`AttemptId`]). The tag is the campaign folder's random nonce, so a job
/// is only ever adopted by the campaign that submitted it.
pub(crate) fn attempt_id(
    tag: &str,
    revision: u32,
    stage: &str,
    item: Option<usize>,
    n: u32,
) -> AttemptId {
    let leaf = item.map_or_else(|| "agg".to_string(), |i| i.to_string());
    let rev = if revision > 0 {
        format!("r{revision}")
    } else {
        String::new()
    };
    AttemptId::sanitize(&format!("{tag}{rev}.{stage}.{leaf}.a{n}"))
}

/// One unit's attempt, as [`attempt_spec`] builds it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub(crate) struct UnitSpec<'a> {
    /// The campaign folder (absolute): working directory without a repository, outputs, logs.
    pub campaign: &'a Path,
    /// The plan.
    pub plan: &'a CampaignPlan,
    /// The unit's stage.
    pub stage: &'a StagePlan,
    /// The unit key (`score/3`, `score/agg`).
    pub unit_key: &'a str,
    /// The work item index; `None` for the aggregate step.
    pub item: Option<usize>,
    /// The attempt id ([`attempt_id`]).
    pub attempt_id: &'a AttemptId,
    /// The attempt number, from 1.
    pub attempt: u32,
    /// Whether the attempt resumes from its checkpoint.
    pub resume: bool,
    /// Whether this is the retry after an out-of-memory (whole nodes).
    pub more_resources: bool,
}

/// The [`AttemptSpec`] of one unit's attempt: what the controller submits and what the dry
/// run renders (one function, so the two never differ). One job per instance: the instance's
/// nodes and GPUs, the stage's launcher with the instance's own rendezvous port, the runner's
/// execution contract (working directory = its repository, else the campaign folder), the
/// Slurm settings (account, partition of the stage's role, QOS, reservation, constraint, time
/// limit of the stage or the runner), the `PUZZLETRON_*` environment above, and the log under
/// the runner's `log_dir` (default `<campaign>/logs`).
///
/// # Errors
/// [`ControllerError::BadPlan`] for a stage without work items or command, or a command
/// argument with a NUL.
pub(crate) fn attempt_spec(u: &UnitSpec<'_>) -> Result<AttemptSpec, ControllerError> {
    let st = u.stage;
    let bad = |reason: String| ControllerError::BadPlan {
        stage: st.stage_id.clone(),
        reason,
    };
    let item = st
        .work
        .items
        .get(u.item.unwrap_or(0))
        .ok_or_else(|| bad("the stage has no work item".into()))?;
    let argv = item_argv(st, item, u.campaign).map_err(|e| bad(e.to_string()))?;
    let phase = match (u.item, st.work.strategy) {
        (None, _) => "aggregate",
        (Some(_), Strategy::PersistentPool) => "pool_worker",
        _ => "work",
    };
    let runner = &u.plan.runner;
    let contract = &runner.execution_contract;
    let out = output_dir(u.campaign, &st.stage_id, u.item);
    let cwd = contract
        .repository
        .as_ref()
        .map_or_else(|| u.campaign.to_path_buf(), PathBuf::from);
    let mut cmd = CommandSpec::new(argv[0].clone())
        .args(argv[1..].iter().cloned())
        .cwd(cwd)
        .env("PUZZLETRON_CAMPAIGN_DIR", u.campaign.display().to_string())
        .env("PUZZLETRON_STAGE", st.stage_id.clone())
        .env("PUZZLETRON_UNIT", u.unit_key)
        .env("PUZZLETRON_WORK_ID", item.work_id.clone())
        .env("PUZZLETRON_SHARD_INDEX", item.shard_index.to_string())
        .env("PUZZLETRON_SHARD_COUNT", item.shard_count.to_string())
        .env("PUZZLETRON_PHASE", phase)
        .env("PUZZLETRON_OUTPUT_DIR", out.display().to_string())
        .env(
            "PUZZLETRON_HEARTBEAT_FILE",
            out.join(HEARTBEAT_FILE).display().to_string(),
        )
        .env(
            crate::executor::START_FILE_ENV,
            out.join(START_MARKER).display().to_string(),
        )
        .env("PUZZLETRON_RESUME", if u.resume { "1" } else { "0" })
        .env("PUZZLETRON_ATTEMPT", u.attempt.to_string())
        .env(
            "PUZZLETRON_MORE_RESOURCES",
            if u.more_resources { "1" } else { "0" },
        );
    if u.resume
        && let CheckpointEvidence::Found(c) = find_checkpoint(&out)
    {
        cmd = cmd.env("PUZZLETRON_RESUME_FROM", c);
    }
    if st.work.strategy == Strategy::PersistentPool {
        cmd = cmd.env(
            QUEUE_DIR_ENV,
            queue_dir(u.campaign, &st.stage_id).display().to_string(),
        );
    }
    let layout = &st.work.topology;
    let mut topology = TaskTopology::single();
    let mut fills_its_nodes = false;
    if let Some(g) = layout.groups.get(item.instance as usize) {
        topology.nodes = g.placement.node_count.max(1);
        topology.launcher = match &layout.launcher {
            // Each group's own rendezvous port (unique in the campaign).
            TaskLauncher::Torchrun {
                nproc_per_node,
                rdzv_backend,
                max_restarts,
                no_python,
                ..
            } => TaskLauncher::Torchrun {
                nproc_per_node: *nproc_per_node,
                rdzv_backend: rdzv_backend.clone(),
                rdzv_port: g.rendezvous.as_ref().map_or(29500, |r| r.master_port),
                max_restarts: *max_restarts,
                no_python: *no_python,
            },
            other => other.clone(),
        };
        if st.spec.resource == Resource::Gpu && g.placement.gpus_on_node > 0 {
            topology.gpus = GpuRequest::PerNode(g.placement.gpus_on_node);
            // N04: what the worker's GPU preflight compares the visible GPUs with.
            cmd = cmd.env(GPUS_PER_NODE_ENV, g.placement.gpus_on_node.to_string());
            fills_its_nodes = g.placement.gpus_on_node >= st.spec.allocation.gpus_per_node;
        }
    }
    let log_dir = match runner.log_dir() {
        Some(d) => u.campaign.join(d),
        None => u.campaign.join("logs"),
    };
    let mut spec = AttemptSpec::new(u.attempt_id.clone(), cmd)
        .with_topology(topology)
        .with_log_path(log_dir.join(format!("{}.log", u.attempt_id)))
        .with_environment(contract.clone())
        // One job per instance (CONTRIBUTING, "One submission path"): an instance that fills
        // its nodes takes them whole, as the reference's packing does; smaller instances
        // share nodes (a whole node per 1-GPU job would waste the rest), except on the retry
        // after an out-of-memory, which asks for the node alone.
        .with_exclusive(u.more_resources || fills_its_nodes);
    let slurm = runner.slurm.as_ref();
    if let Some(t) = st
        .spec
        .time_limit
        .as_ref()
        .or(slurm.and_then(|s| s.time_limit.as_ref()))
    {
        spec = spec.with_walltime(t.as_duration());
    }
    if let Some(w) = &st.spec.warning_signal {
        spec = spec.with_warning_signal(w.clone());
    }
    if let Some(s) = slurm {
        let partition = s.resolve_partition(st.spec.partition.as_deref());
        spec = spec.with_scheduler(SchedulerOptions {
            partition: (!partition.is_empty()).then(|| partition.to_slurm()),
            account: s.account.clone(),
            qos: s.qos.clone(),
            reservation: s.reservation.clone(),
            constraint: s.constraint.clone(),
            extra_directives: Vec::new(),
        });
    }
    Ok(spec)
}
