//! Campaigns: multi-stage GPU pipelines compiled from experiment, runner and execution configs
//! (DESIGN.md §6).

mod adapter;
pub mod catalog;
pub mod compile;
pub mod document;
pub mod dryrun;
pub mod execution;
pub mod mesh;
pub mod plan;
pub mod plan_error;
pub mod runner;
pub mod tree;
pub mod work;

pub use mesh::{
    GpuAllocation, InstancePlacement, ParallelMesh, ParallelMeshOverride, VllmTopology,
    normalize_vllm_topology, pack_gpu_allocation,
};
pub use plan_error::PlanError;
pub use catalog::{StageCatalog, StageDef};
pub use compile::{StageFilter, compile_campaign_plan, compile_resolved, contract_hash};
pub use document::{PlanDocument, load_plan_document, plan_to_dict};
pub use execution::{ExecutionConfig, FailurePolicy, HaltPolicy, Resource, StageExecutionSpec, Strategy};
pub use plan::{CampaignPlan, StagePlan};
pub use runner::{ExecutionContract, RunnerEnvironment, RunnerKind};
pub use work::{TaskLauncher, TaskTopology, WorkItem, WorkItemKind, WorkPlan};
