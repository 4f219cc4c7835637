//! The compiled campaign: [`CampaignPlan`] and one [`StagePlan`] per stage.

use serde::{Deserialize, Serialize};

use super::catalog::StageWorker;
use super::config::{Override, Value};
use super::execution::{ExecutionDefaults, StageExecutionSpec};
use super::runner::RunnerEnvironment;
use super::work::WorkPlan;
use crate::identity::Hash;

/// One stage of a compiled plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StagePlan {
    /// Stage id.
    pub stage_id: String,
    /// Parent stage ids (all in the plan, before this stage).
    pub parents: Vec<String>,
    /// How it runs.
    pub spec: StageExecutionSpec,
    /// Its work items and task layout.
    pub work: WorkPlan,
    /// The catalog stage's worker: its argv template (see
    /// [`StageWorker::command`]), whether it resumes, what it must leave and how it is
    /// validated. Flattened: the plan's JSON keeps these fields at the stage's top level.
    #[serde(flatten)]
    pub worker: StageWorker,
    /// Set for a manual decision stage (a post-MIP `type: filter` node with `mode: manual`):
    /// the controller submits no job for it but asks a person to choose among the candidates
    /// (see [`ManualDecision`]). Absent from the JSON when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<ManualDecision>,
}

/// A stage that a person decides instead of a worker: the post-MIP manual filter.
///
/// The controller waits until the stage's parents are done, then asks (a numbered prompt on a
/// terminal, else the decision file `<campaign>/decisions/<stage id>.txt`) which candidates to
/// keep, journals the choice and writes it to the stage's output folder
/// (`work/<stage>/0/selected.json`). It uses no GPU and no node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ManualDecision {
    /// The stage whose work items are the candidates (the node's `input`, else `mip`).
    pub input: String,
    /// The candidates: the work ids of `input`'s work items, in plan order (empty when the
    /// input stage is not part of the plan).
    pub candidates: Vec<String>,
}

impl ManualDecision {
    /// A choice among `candidates` (work ids of stage `input`'s work items, in plan order).
    pub fn new(input: impl Into<String>, candidates: Vec<String>) -> Self {
        Self {
            input: input.into(),
            candidates,
        }
    }
}

/// A compiled campaign: the stage DAG in topological order, each stage's execution spec and
/// work plan, and the contract hash. Produced by
/// [`compile_campaign_plan`](super::compile_campaign_plan); pure data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CampaignPlan {
    /// The experiment config path as given.
    pub experiment_config_path: String,
    /// The resolved `puzzle_dir` (campaign folder) of the experiment, if it has one.
    pub puzzle_dir: Option<String>,
    /// Hash of everything that changes results (see [`contract_hash`](super::compile::contract_hash)).
    pub contract_hash: Hash,
    /// The overrides applied, in order (serialized as the text typed).
    pub overrides: Vec<Override>,
    /// The overrides (as typed) whose keys the compiler does not read: passed to the workers
    /// unchanged in the resolved config, not checked.
    #[serde(default)]
    pub unchecked_overrides: Vec<String>,
    /// The top-level keys of the experiment that neither the compiler nor the stage catalog
    /// reads, in document order: passed to the workers in the resolved config, not checked
    /// (a key close to one the compiler reads is refused instead, as a likely typo).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unchecked_keys: Vec<String>,
    /// The runner.
    pub runner: RunnerEnvironment,
    /// Execution defaults.
    pub execution_defaults: ExecutionDefaults,
    /// The catalog the stages come from (`puzzle`, `config`, or a user name).
    pub catalog: String,
    /// Stages, in topological order.
    pub stages: Vec<StagePlan>,
    /// The stage filter, if the plan is restricted (`None`: all stages).
    pub stage_filter: Option<Vec<String>>,
    /// Stages outside the filter that the filter's stages depend on and that were declared
    /// complete.
    pub completed_stages: Vec<String>,
    /// The resolved experiment config (after composition, overrides and interpolation).
    pub resolved_config: Value,
}

impl CampaignPlan {
    /// The stage `id`, if the plan has it.
    pub fn stage(&self, id: &str) -> Option<&StagePlan> {
        self.stages.iter().find(|s| s.stage_id == id)
    }

    /// Stage ids in plan order.
    pub fn stage_ids(&self) -> Vec<&str> {
        self.stages.iter().map(|s| s.stage_id.as_str()).collect()
    }

    /// Total work items over all stages.
    pub fn work_item_count(&self) -> usize {
        self.stages.iter().map(|s| s.work.items.len()).sum()
    }
}
