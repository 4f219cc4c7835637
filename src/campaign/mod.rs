//! Campaigns: multi-stage GPU pipelines compiled from experiment, runner and execution configs
//! (DESIGN.md §6).

pub mod catalog;
pub mod compile;
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
