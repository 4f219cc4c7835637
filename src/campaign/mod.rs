//! Campaigns: multi-stage GPU pipelines compiled from experiment configs (`docs/design.md`,
//! "Campaigns").
//!
//! A campaign starts from three inputs: an experiment YAML (Hydra-style composition of
//! `defaults`, overrides and `${...}` interpolation, see [`config`]), a runner config and an
//! execution config. This module area turns them into a pure, deterministic plan.
//! The planner reads the loaded [`config::Value`] tree itself (there is no second tree), so
//! an error about a value names the `file:line:column` (or the override) that wrote it.
//!
//! Two sub-areas are modules of their own; everything else is re-exported here, one path each:
//!
//! - [`config`]: loading YAML files, composing `defaults`, applying Hydra-style overrides and
//!   resolving interpolations into a [`config::Config`] tree with source locations.
//! - [`controller`]: [`CampaignController`](controller::CampaignController), the durable loop that
//!   runs a plan (journal, lease, recovery, failure classes, policies, pools).
//! - The runner ([`RunnerEnvironment`], with [`SlurmTime`] limits) and execution
//!   ([`ExecutionConfig`]) schemas.
//! - The stage graph as data ([`StageCatalog::puzzle`], user catalogs: the `stages:` YAML
//!   grammar is documented on [`StageCatalog::from_config`]).
//! - [`ParallelMesh`], [`pack_gpu_allocation`], `normalize_vllm_topology`.
//! - [`compile_campaign_plan`] (overrides as [`config::Override`]s) -> [`CampaignPlan`]
//!   ([`StagePlan`], [`WorkPlan`]).
//! - [`plan_to_dict`] and its loader; [`dry_run`] / [`render_dry_run`]: what would be
//!   submitted, ending with the [`PlanSummary`] table.

mod catalog;
mod compile;
pub mod config;
pub mod controller;
mod document;
pub(crate) mod dryrun;
pub(crate) mod execution;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod keys;
mod mesh;
mod plan;
mod plan_error;
pub(crate) mod runner;
mod schema;
mod slurm_time;
mod summary;
mod work;

pub use catalog::{
    Enablement, IfDisabled, MeshSource, Need, PostMipExpansion, ResolvedStage, ShardAxis,
    StageCatalog, StageDef, StageWorker,
};
pub use compile::{
    StageFilter, compile_campaign_plan, compile_campaign_plan_with, compile_resolved,
    contract_changes, contract_hash,
};
pub use document::{
    DefaultsDocument, PlanDocument, StageDocument, SubmissionDocument, load_plan_document,
    plan_to_dict,
};
pub use dryrun::{
    DecisionPreview, DryRun, DryRunOptions, JobSubmission, StageSpecs, StageSubmission,
    attempt_specs, default_executor, dry_run, render_dry_run,
};
pub(crate) use dryrun::{decision_file_name, item_argv};
pub use execution::{
    ExecutionConfig, ExecutionDefaults, FailurePolicy, HaltPolicy, Resource, StageExecutionConfig,
    StageExecutionSpec, Strategy,
};
pub use mesh::{
    GpuAllocation, InstancePlacement, ParallelMesh, ParallelMeshOverride, VllmTopology,
    pack_gpu_allocation,
};
pub use plan::{CampaignPlan, ManualDecision, StagePlan};
pub use plan_error::PlanError;
pub use runner::{
    LocalSettings, Partitions, RayAmount, RaySettings, RunnerEnvironment, RunnerKind, SlurmSettings,
};
pub use slurm_time::{SlurmTime, SlurmTimeError, SlurmTimeReason};
pub use summary::{PlanSummary, StageSummary};
pub use work::{
    MasterAddr, Rendezvous, RendezvousAllocator, StageLayout, TaskGroup, WorkItem, WorkItemKind,
    WorkPlan,
};
