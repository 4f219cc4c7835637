//! Campaigns: multi-stage GPU pipelines compiled from experiment configs (DESIGN.md §6).
//!
//! A campaign starts from three inputs: an experiment YAML (Hydra-style composition of
//! `defaults`, overrides and `${...}` interpolation, see [`config`]), a runner config and an
//! execution config. This module area turns them into a pure, deterministic plan.
//!
//! - [`config`]: loading YAML files, composing `defaults`, applying Hydra-style overrides and
//!   resolving interpolations into a [`config::Config`] tree with source locations.
//! - [`runner`], [`execution`]: the runner ([`RunnerEnvironment`]) and execution
//!   ([`ExecutionConfig`]) schemas.
//! - [`catalog`]: the stage graph as data ([`StageCatalog::puzzle`], user catalogs).
//! - [`mesh`]: [`ParallelMesh`], [`pack_gpu_allocation`], [`normalize_vllm_topology`].
//! - [`compile`]: [`compile_campaign_plan`] -> [`CampaignPlan`] ([`plan`], [`work`]).
//! - [`controller`]: [`CampaignController`](controller::CampaignController), the durable loop that
//!   runs a plan (journal, lease, recovery, failure classes, policies, pools).
//! - [`document`]: [`plan_to_dict`] and its loader; [`dryrun`]: what would be submitted.

pub mod catalog;
pub mod compile;
pub mod config;
pub mod controller;
pub mod document;
pub mod dryrun;
pub mod execution;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod mesh;
pub mod plan;
pub mod plan_error;
pub mod runner;
mod slurm_time;
mod summary;
pub mod tree;
pub mod work;

pub use catalog::{StageCatalog, StageDef};
pub use compile::{
    StageFilter, compile_campaign_plan, compile_campaign_plan_with, compile_resolved, contract_hash,
};
pub use document::{PlanDocument, load_plan_document, plan_to_dict};
pub use dryrun::{DryRun, DryRunOptions, dry_run, render_dry_run};
pub use execution::{
    ExecutionConfig, FailurePolicy, HaltPolicy, Resource, StageExecutionSpec, Strategy,
};
pub use mesh::{
    GpuAllocation, InstancePlacement, ParallelMesh, ParallelMeshOverride, VllmTopology,
    normalize_vllm_topology, pack_gpu_allocation,
};
pub use plan::{CampaignPlan, StagePlan};
pub use plan_error::PlanError;
pub use runner::{ExecutionContract, RunnerEnvironment, RunnerKind};
pub use slurm_time::{SlurmTime, SlurmTimeError};
pub use summary::{PlanSummary, StageSummary};
pub use work::{TaskLauncher, TaskTopology, WorkItem, WorkItemKind, WorkPlan};
