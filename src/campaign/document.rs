//! `plan_to_dict`: a compiled plan as JSON in the schema of Puzzletron's Python reference
//! (same field names), and [`load_plan_document`] to read such a document back.

use serde::{Deserialize, Serialize};

use super::execution::Strategy;
use super::mesh::{ParallelMesh, pack_gpu_allocation};
use super::plan::{CampaignPlan, ManualDecision};
use super::plan_error::PlanError;

/// `execution_defaults` of a plan document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct DefaultsDocument {
    /// `strict` / `resume`.
    pub failure_policy: String,
    /// `drain` / `fail_fast`.
    pub halt_policy: String,
    /// GPUs per node.
    pub gpus_per_node: u32,
}

/// One entry of `stages` in a plan document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct StageDocument {
    /// Stage id.
    pub stage_id: String,
    /// `single` / `sharded` / `persistent_pool`.
    pub strategy: String,
    /// Instances.
    pub instances: u32,
    /// Failure policy.
    pub failure_policy: String,
    /// Mesh of one instance.
    pub mesh: ParallelMesh,
    /// GPUs per instance.
    pub gpus_per_instance: u32,
    /// GPUs per node used for packing.
    pub gpus_per_node: u32,
    /// Nodes of the allocation.
    pub nodes: u32,
    /// GPUs in total.
    pub total_gpus: u64,
    /// Whether nodes are taken whole.
    pub exclusive: bool,
    /// Parent stage ids.
    pub parents: Vec<String>,
    /// Whether an instance is a torch.distributed job.
    pub distributed: bool,
    /// Partition or role, if set.
    pub partition: Option<String>,
    /// `gpu` / `cpu`.
    pub resource: String,
    /// Set for a manual decision stage (no job; see [`ManualDecision`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<ManualDecision>,
}

/// One entry of `dry_run_submissions`: the task layout of one stage submission.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SubmissionDocument {
    /// Stage id.
    pub stage_id: String,
    /// Submission id.
    pub work_id: String,
    /// Nodes.
    pub nodes: u32,
    /// GPUs in total.
    pub gpus: u64,
    /// GPUs requested per node.
    pub gpus_per_node: u32,
    /// Tasks.
    pub task_count: u32,
    /// GPUs per task.
    pub gpus_per_task: u32,
    /// Tasks per group.
    pub tasks_per_group: u32,
    /// Groups.
    pub group_count: u32,
    /// `direct` / `torchrun`.
    pub launcher: String,
    /// Whether nodes are taken whole.
    pub exclusive: bool,
}

/// A plan document: what [`plan_to_dict`] writes and [`load_plan_document`] reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PlanDocument {
    /// Experiment config path as given.
    pub experiment_config_path: String,
    /// Campaign folder.
    pub puzzle_dir: Option<String>,
    /// Contract hash (64 hex digits).
    pub contract_hash: String,
    /// Overrides as given.
    pub overrides: Vec<String>,
    /// `local` / `slurm` / `baremetal`.
    pub runner_kind: String,
    /// Execution defaults.
    pub execution_defaults: DefaultsDocument,
    /// Stages in plan order.
    pub stages: Vec<StageDocument>,
    /// One submission per stage.
    #[serde(default)]
    pub dry_run_submissions: Vec<SubmissionDocument>,
    /// A plan-time error of the reference's work planner (reference documents only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run_error: Option<String>,
}

impl PlanDocument {
    /// The document of a compiled plan.
    pub fn from_plan(plan: &CampaignPlan) -> Self {
        let stages = plan
            .stages
            .iter()
            .map(|s| {
                let a = &s.spec.allocation;
                StageDocument {
                    stage_id: s.stage_id.clone(),
                    strategy: s.spec.strategy.as_str().into(),
                    instances: s.spec.instances,
                    failure_policy: s.spec.failure_policy.as_str().into(),
                    mesh: s.spec.mesh,
                    gpus_per_instance: a.gpus_per_instance,
                    gpus_per_node: a.gpus_per_node,
                    // A manual decision submits no job: no node.
                    nodes: if s.decision.is_some() { 0 } else { a.nodes },
                    total_gpus: a.total_gpus,
                    exclusive: a.exclusive,
                    parents: s.parents.clone(),
                    distributed: s.spec.distributed,
                    partition: s.spec.partition.clone(),
                    resource: s.spec.resource.as_str().into(),
                    decision: s.decision.clone(),
                }
            })
            .collect();
        let mut dry_run_submissions = Vec::with_capacity(plan.stages.len());
        for s in &plan.stages {
            if s.decision.is_some() {
                continue; // no job
            }
            if s.work.strategy == Strategy::PersistentPool {
                let mut groups: Vec<(&str, u32)> = Vec::new();
                for item in &s.work.items {
                    match (item.group.as_deref(), groups.last_mut()) {
                        (Some(g), Some(last)) if last.0 == g => last.1 += 1,
                        (Some(g), _) => groups.push((g, 1)),
                        (None, _) => {}
                    }
                }
                if groups.len() > 1 {
                    // One pool (gang) per group.
                    let a = &s.spec.allocation;
                    for (label, count) in groups {
                        let Ok(g) = pack_gpu_allocation(
                            &s.stage_id,
                            count,
                            a.gpus_per_instance,
                            a.gpus_per_node,
                        ) else {
                            continue;
                        };
                        let (gpus_per_task, tasks_per_group) = if g.nodes_per_instance > 1 {
                            (g.gpus_per_node, g.nodes_per_instance)
                        } else {
                            (g.gpus_per_instance, 1)
                        };
                        dry_run_submissions.push(SubmissionDocument {
                            stage_id: s.stage_id.clone(),
                            work_id: format!("{}:{label}", s.stage_id),
                            nodes: g.nodes,
                            gpus: g.total_gpus,
                            gpus_per_node: g.max_gpus_on_a_node(),
                            task_count: count * tasks_per_group,
                            gpus_per_task,
                            tasks_per_group,
                            group_count: count,
                            launcher: super::work::launcher_kind(&s.work.topology.launcher).into(),
                            exclusive: g.exclusive,
                        });
                    }
                    continue;
                }
            }
            dry_run_submissions.push({
                let t = &s.work.topology;
                SubmissionDocument {
                    stage_id: s.stage_id.clone(),
                    work_id: if s.work.items.len() == 1 {
                        s.work.items[0].work_id.clone()
                    } else {
                        format!("{}:gang", s.stage_id)
                    },
                    nodes: t.nodes,
                    gpus: t.gpus,
                    gpus_per_node: t.gpus_per_node,
                    task_count: t.task_count,
                    gpus_per_task: t.gpus_per_task,
                    tasks_per_group: t.tasks_per_group,
                    group_count: t.group_count,
                    launcher: super::work::launcher_kind(&t.launcher).into(),
                    exclusive: t.exclusive,
                }
            });
        }
        PlanDocument {
            experiment_config_path: plan.experiment_config_path.clone(),
            puzzle_dir: plan.puzzle_dir.clone(),
            contract_hash: plan.contract_hash.to_hex(),
            overrides: plan.overrides.iter().map(ToString::to_string).collect(),
            runner_kind: plan.runner.kind.as_str().into(),
            execution_defaults: DefaultsDocument {
                failure_policy: plan.execution_defaults.failure_policy.as_str().into(),
                halt_policy: plan.execution_defaults.halt_policy.as_str().into(),
                gpus_per_node: plan.execution_defaults.gpus_per_node,
            },
            stages,
            dry_run_submissions,
            dry_run_error: None,
        }
    }
}

/// The plan as JSON in the reference's schema: `experiment_config_path`, `puzzle_dir`,
/// `contract_hash`, `overrides`, `runner_kind`, `execution_defaults`, `stages` (each with
/// `stage_id`, `strategy`, `instances`, `failure_policy`, `mesh`, `gpus_per_instance`,
/// `gpus_per_node`, `nodes`, `total_gpus`, `exclusive`, `parents`, `distributed`,
/// `partition`, `resource`) and `dry_run_submissions`.
pub fn plan_to_dict(plan: &CampaignPlan) -> serde_json::Value {
    // Serializing plain structs of strings and integers cannot fail.
    serde_json::to_value(PlanDocument::from_plan(plan)).unwrap_or(serde_json::Value::Null)
}

/// Reads a plan document (ours or the reference's).
///
/// # Errors
/// [`PlanError::PlanDocument`] naming the field that is missing, unknown or of the wrong type,
/// or a `contract_hash` that is not 64 hex digits.
pub fn load_plan_document(value: &serde_json::Value) -> Result<PlanDocument, PlanError> {
    let doc: PlanDocument =
        serde_json::from_value(value.clone()).map_err(|e| PlanError::PlanDocument {
            path: "$".into(),
            reason: e.to_string(),
        })?;
    if doc.contract_hash.len() != 64 || !doc.contract_hash.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(PlanError::PlanDocument {
            path: "$.contract_hash".into(),
            reason: format!("{:?} is not 64 hex digits", doc.contract_hash),
        });
    }
    for (i, s) in doc.stages.iter().enumerate() {
        if !matches!(
            s.strategy.as_str(),
            "single" | "sharded" | "persistent_pool"
        ) {
            return Err(PlanError::PlanDocument {
                path: format!("$.stages[{i}].strategy"),
                reason: format!("unknown strategy {:?}", s.strategy),
            });
        }
        if u64::from(s.gpus_per_instance) * u64::from(s.instances) != s.total_gpus {
            return Err(PlanError::PlanDocument {
                path: format!("$.stages[{i}].total_gpus"),
                reason: format!(
                    "{} != instances {} x gpus_per_instance {}",
                    s.total_gpus, s.instances, s.gpus_per_instance
                ),
            });
        }
    }
    Ok(doc)
}
