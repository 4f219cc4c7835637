//! Parallel meshes, GPU packing and vLLM topology normalization (`docs/design.md`, "Campaigns":
//! Packing).
//!
//! An instance of a model needs `tp * cp * pp * dp_shard * dp_replicate` GPUs; `ep` lives inside
//! that world (expert parallelism reuses the data/tensor-parallel ranks, as in Megatron and vLLM),
//! so it does not add GPUs.

use std::fmt;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::config::Value;
use super::plan_error::PlanError;
use super::schema::{AtLeast, check_keys, expect_map, expect_u32, invalid, join, key_path, read};

/// The parallel layout of one model instance (one process group).
///
/// Field names follow Megatron/NeMo AutoModel: `tp` tensor, `cp` context, `pp` pipeline, `ep`
/// expert, `dp_shard` sharded (FSDP) data, `dp_replicate` replicated data parallelism. Every
/// size is >= 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ParallelMesh {
    /// Tensor parallel size.
    pub tp: u32,
    /// Context (sequence) parallel size.
    pub cp: u32,
    /// Pipeline parallel size.
    pub pp: u32,
    /// Expert parallel size (inside the world; adds no GPUs).
    pub ep: u32,
    /// Sharded data parallel size (FSDP).
    pub dp_shard: u32,
    /// Replicated data parallel size.
    pub dp_replicate: u32,
}

impl Default for ParallelMesh {
    fn default() -> Self {
        Self::SINGLE
    }
}

impl fmt::Display for ParallelMesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tp={} cp={} pp={} ep={} dp_shard={} dp_replicate={}",
            self.tp, self.cp, self.pp, self.ep, self.dp_shard, self.dp_replicate
        )
    }
}

/// Largest instance (GPUs) a mesh may describe: 2^20, far beyond any cluster a plan targets,
/// so absurd sizes are refused instead of overflowing.
pub(super) const MAX_GPUS_PER_INSTANCE: u32 = 1 << 20;

impl ParallelMesh {
    /// One GPU, no parallelism.
    pub const SINGLE: ParallelMesh = ParallelMesh {
        tp: 1,
        cp: 1,
        pp: 1,
        ep: 1,
        dp_shard: 1,
        dp_replicate: 1,
    };

    /// GPUs one instance needs: `tp * cp * pp * dp_shard * dp_replicate` (`ep` excluded).
    /// Saturates at `u64::MAX` for absurd sizes (which [`validate`](Self::validate) refuses).
    pub fn world_size(&self) -> u64 {
        [self.tp, self.cp, self.pp, self.dp_shard, self.dp_replicate]
            .iter()
            .fold(1u64, |acc, &x| acc.saturating_mul(u64::from(x)))
    }

    /// Checks the mesh can be laid out: every size >= 1, and `ep` divides the ranks of one
    /// pipeline stage (`world_size / pp`), where experts are distributed.
    ///
    /// # Errors
    /// [`PlanError::BadMesh`] naming `context` and the reason.
    pub fn validate(&self, context: &str) -> Result<(), PlanError> {
        let bad = |reason: String| PlanError::BadMesh {
            context: context.to_string(),
            mesh: self.to_string(),
            reason,
        };
        for (name, v) in self.fields() {
            if v == 0 {
                return Err(bad(format!("{name} must be >= 1")));
            }
        }
        if self.world_size() > u64::from(MAX_GPUS_PER_INSTANCE) {
            return Err(bad(format!(
                "{} GPUs per instance is more than the {MAX_GPUS_PER_INSTANCE} supported",
                self.world_size()
            )));
        }
        let per_stage = self.world_size() / u64::from(self.pp);
        if !per_stage.is_multiple_of(u64::from(self.ep)) {
            return Err(bad(format!(
                "ep={} must divide the {} rank(s) of one pipeline stage (tp*cp*dp_shard*dp_replicate)",
                self.ep, per_stage
            )));
        }
        Ok(())
    }

    /// The six sizes with their names, in the order `tp, cp, pp, ep, dp_shard, dp_replicate`.
    pub fn fields(&self) -> [(&'static str, u32); 6] {
        [
            ("tp", self.tp),
            ("cp", self.cp),
            ("pp", self.pp),
            ("ep", self.ep),
            ("dp_shard", self.dp_shard),
            ("dp_replicate", self.dp_replicate),
        ]
    }

    /// Reads a complete mesh from a mapping such as an AutoModel `parallel:` block. Missing
    /// sizes default to 1; `sequence_parallel` and `pipeline_schedule` are allowed and ignored.
    ///
    /// # Errors
    /// - [`PlanError::UnknownField`] for any other key, with a suggestion (`tp_size` -> `tp`);
    /// - [`PlanError::InvalidValue`] for a size that is not an integer >= 1 (`2.7`, `"2"`, `0`),
    ///   instead of truncating or ignoring it;
    /// - [`PlanError::BadMesh`] if the result does not [`validate`](Self::validate).
    pub fn from_mapping(file: &str, path: &str, node: &Value) -> Result<Self, PlanError> {
        let ov = ParallelMeshOverride::from_mapping(file, path, node)?;
        let mesh = ov.apply(ParallelMesh::SINGLE);
        mesh.validate(path)?;
        Ok(mesh)
    }
}

/// A partial mesh: the sizes it names replace those of a base mesh (an execution config's
/// per-stage `parallel:`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ParallelMeshOverride {
    /// Tensor parallel size, if overridden.
    pub tp: Option<u32>,
    /// Context parallel size, if overridden.
    pub cp: Option<u32>,
    /// Pipeline parallel size, if overridden.
    pub pp: Option<u32>,
    /// Expert parallel size, if overridden.
    pub ep: Option<u32>,
    /// Sharded data parallel size, if overridden.
    pub dp_shard: Option<u32>,
    /// Replicated data parallel size, if overridden.
    pub dp_replicate: Option<u32>,
}

impl ParallelMeshOverride {
    /// Whether it overrides nothing.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `base` with the named sizes replaced.
    pub fn apply(&self, base: ParallelMesh) -> ParallelMesh {
        ParallelMesh {
            tp: self.tp.unwrap_or(base.tp),
            cp: self.cp.unwrap_or(base.cp),
            pp: self.pp.unwrap_or(base.pp),
            ep: self.ep.unwrap_or(base.ep),
            dp_shard: self.dp_shard.unwrap_or(base.dp_shard),
            dp_replicate: self.dp_replicate.unwrap_or(base.dp_replicate),
        }
    }

    /// Reads a partial mesh; same key and value rules as [`ParallelMesh::from_mapping`].
    ///
    /// # Errors
    /// [`PlanError::UnknownField`] / [`PlanError::InvalidValue`] with the key path.
    pub fn from_mapping(file: &str, path: &str, node: &Value) -> Result<Self, PlanError> {
        if node.is_null() {
            return Ok(ParallelMeshOverride::default());
        }
        read::<RawMesh>(file, key_path(path), node).map(ParallelMeshOverride::from)
    }
}

/// A `parallel:` mapping as written: the six sizes (integers >= 1) and the AutoModel keys the
/// planner ignores; any other key is refused with a suggestion (`tp_size` -> `tp`).
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of mesh sizes (tp, cp, pp, ep, dp_shard, dp_replicate)"
)]
pub(crate) struct RawMesh {
    tp: Option<AtLeast<1>>,
    cp: Option<AtLeast<1>>,
    pp: Option<AtLeast<1>>,
    ep: Option<AtLeast<1>>,
    dp_shard: Option<AtLeast<1>>,
    dp_replicate: Option<AtLeast<1>>,
    #[allow(dead_code)]
    sequence_parallel: Option<serde::de::IgnoredAny>,
    #[allow(dead_code)]
    pipeline_schedule: Option<serde::de::IgnoredAny>,
}

impl From<RawMesh> for ParallelMeshOverride {
    fn from(m: RawMesh) -> Self {
        let n = |x: Option<AtLeast<1>>| x.map(|a| a.0);
        ParallelMeshOverride {
            tp: n(m.tp),
            cp: n(m.cp),
            pp: n(m.pp),
            ep: n(m.ep),
            dp_shard: n(m.dp_shard),
            dp_replicate: n(m.dp_replicate),
        }
    }
}

/// Where one instance runs: a contiguous range of GPUs on one node, or (for an instance larger
/// than a node) all GPUs of a contiguous range of nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct InstancePlacement {
    /// Index of the first node (0-based within the allocation).
    pub node: u32,
    /// How many nodes the instance spans (1 unless it is larger than a node).
    pub node_count: u32,
    /// First local GPU id on each of its nodes.
    pub first_gpu: u32,
    /// GPUs it uses on each of its nodes.
    pub gpus_on_node: u32,
}

impl InstancePlacement {
    /// The local GPU ids (CUDA_VISIBLE_DEVICES values) the instance uses on each of its nodes.
    pub fn local_gpu_ids(&self) -> Range<u32> {
        self.first_gpu..self.first_gpu + self.gpus_on_node
    }

    /// The node indices the instance spans.
    pub fn nodes(&self) -> Range<u32> {
        self.node..self.node + self.node_count
    }
}

/// The result of [`pack_gpu_allocation`]: how many nodes a stage needs and where each instance
/// runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GpuAllocation {
    /// Number of instances.
    pub instances: u32,
    /// GPUs one instance needs.
    pub gpus_per_instance: u32,
    /// GPUs per node of the target machines.
    pub gpus_per_node: u32,
    /// Nodes the allocation needs (minimal for the no-split rule).
    pub nodes: u32,
    /// GPUs used in total (`instances * gpus_per_instance`).
    pub total_gpus: u64,
    /// Instances placed on one node (0 when one instance spans several nodes).
    pub instances_per_node: u32,
    /// Nodes one instance spans (1 when instances fit in a node).
    pub nodes_per_instance: u32,
    /// Whether the allocation takes whole nodes: every node's GPUs are all used, or instances
    /// span several nodes (those nodes are then never shared).
    pub exclusive: bool,
    placements: Vec<InstancePlacement>,
}

impl GpuAllocation {
    /// The placement of every instance, in instance order.
    pub fn placements(&self) -> &[InstancePlacement] {
        &self.placements
    }

    /// The largest number of GPUs used on any node (what to request per node from Slurm).
    pub fn max_gpus_on_a_node(&self) -> u32 {
        if self.nodes_per_instance > 1 {
            self.gpus_per_node
        } else {
            self.instances.min(self.instances_per_node) * self.gpus_per_instance
        }
    }

    /// GPUs used on node `node`.
    pub fn gpus_on_node(&self, node: u32) -> u32 {
        if node >= self.nodes {
            return 0;
        }
        if self.nodes_per_instance > 1 {
            return self.gpus_per_node;
        }
        let first = u64::from(node) * u64::from(self.instances_per_node);
        let here = (u64::from(self.instances) - first).min(u64::from(self.instances_per_node));
        here as u32 * self.gpus_per_instance
    }
}

/// Packs `instances` identical instances of `gpus_per_instance` GPUs onto nodes of
/// `gpus_per_node` GPUs.
///
/// Rules: an instance that fits in a node is never split across nodes; as many as fit
/// (`gpus_per_node / gpus_per_instance`) share a node, filled in order, so the node count is
/// `ceil(instances / per_node)` — e.g. 5 instances of tp=3 on 8-GPU nodes need 3 nodes, not
/// `ceil(15 / 8) = 2`. An instance larger than a node takes `gpus_per_instance / gpus_per_node`
/// whole nodes exclusively, and must be a multiple of `gpus_per_node`. Linear in `instances`
/// (one placement per instance, one allocation).
///
/// # Errors
/// [`PlanError::Packing`] (with `context`) for zero sizes, an instance larger than a node that
/// is not a multiple of it, or a node count beyond `u32`.
pub fn pack_gpu_allocation(
    context: &str,
    instances: u32,
    gpus_per_instance: u32,
    gpus_per_node: u32,
) -> Result<GpuAllocation, PlanError> {
    let err = |reason: &str| PlanError::Packing {
        context: context.to_string(),
        instances: u64::from(instances),
        gpus_per_instance: u64::from(gpus_per_instance),
        gpus_per_node: u64::from(gpus_per_node),
        reason: reason.to_string(),
    };
    if instances == 0 {
        return Err(err("instances must be >= 1"));
    }
    if gpus_per_instance == 0 {
        return Err(err("an instance needs at least one GPU"));
    }
    if gpus_per_node == 0 {
        return Err(err("gpus_per_node must be >= 1"));
    }
    let total_gpus = u64::from(instances) * u64::from(gpus_per_instance);
    if gpus_per_instance > gpus_per_node {
        if !gpus_per_instance.is_multiple_of(gpus_per_node) {
            return Err(err(&format!(
                "an instance larger than a node must take whole nodes: {gpus_per_instance} is not a multiple of {gpus_per_node}"
            )));
        }
        let per = gpus_per_instance / gpus_per_node;
        let nodes = u64::from(instances) * u64::from(per);
        let nodes = u32::try_from(nodes).map_err(|_| err("more than 2^32 nodes"))?;
        let placements = (0..instances)
            .map(|i| InstancePlacement {
                node: i * per,
                node_count: per,
                first_gpu: 0,
                gpus_on_node: gpus_per_node,
            })
            .collect();
        return Ok(GpuAllocation {
            instances,
            gpus_per_instance,
            gpus_per_node,
            nodes,
            total_gpus,
            instances_per_node: 0,
            nodes_per_instance: per,
            exclusive: true,
            placements,
        });
    }
    let per_node = gpus_per_node / gpus_per_instance;
    let nodes = instances.div_ceil(per_node);
    let mut placements = Vec::with_capacity(instances as usize);
    let mut node = 0u32;
    let mut slot = 0u32;
    for _ in 0..instances {
        placements.push(InstancePlacement {
            node,
            node_count: 1,
            first_gpu: slot * gpus_per_instance,
            gpus_on_node: gpus_per_instance,
        });
        slot += 1;
        if slot == per_node {
            slot = 0;
            node += 1;
        }
    }
    Ok(GpuAllocation {
        instances,
        gpus_per_instance,
        gpus_per_node,
        nodes,
        total_gpus,
        instances_per_node: per_node,
        nodes_per_instance: 1,
        exclusive: total_gpus == u64::from(nodes) * u64::from(gpus_per_node),
        placements,
    })
}

/// A vLLM serving topology after normalization: explicit sizes, and vLLM's boolean
/// `enable_expert_parallel` turned into an explicit `expert_parallel_size`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct VllmTopology {
    /// `tensor_parallel_size` (alias `tp`).
    pub tensor_parallel_size: u32,
    /// `pipeline_parallel_size` (alias `pp`).
    pub pipeline_parallel_size: u32,
    /// `data_parallel_size` (alias `dp`): independent engine replicas.
    pub data_parallel_size: u32,
    /// `prefill_context_parallel_size` (alias `pcp`): multiplies the GPUs of one replica.
    pub prefill_context_parallel_size: u32,
    /// `decode_context_parallel_size` (alias `dcp`): reuses the tensor-parallel GPUs; must divide `tp`.
    pub decode_context_parallel_size: u32,
    /// Expert parallel size: `tp * dp` when expert parallelism is enabled, else 1 (vLLM's rule).
    pub expert_parallel_size: u32,
    /// `distributed_executor_backend` (`mp`, `ray`, ...), if given.
    pub distributed_executor_backend: Option<String>,
}

impl VllmTopology {
    /// GPUs one serving instance needs: `tp * pp * pcp * dp` (saturating).
    pub fn gpus(&self) -> u64 {
        [
            self.tensor_parallel_size,
            self.pipeline_parallel_size,
            self.prefill_context_parallel_size,
            self.data_parallel_size,
        ]
        .iter()
        .fold(1u64, |acc, &x| acc.saturating_mul(u64::from(x)))
    }

    /// The equivalent [`ParallelMesh`]: tp, pp, cp = pcp, dp_replicate = dp, ep.
    pub fn mesh(&self) -> ParallelMesh {
        ParallelMesh {
            tp: self.tensor_parallel_size,
            cp: self.prefill_context_parallel_size,
            pp: self.pipeline_parallel_size,
            ep: self.expert_parallel_size,
            dp_shard: 1,
            dp_replicate: self.data_parallel_size,
        }
    }
}

/// Keys of a vLLM topology mapping, with their aliases.
const VLLM_KEYS: [&str; 17] = [
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "prefill_context_parallel_size",
    "decode_context_parallel_size",
    "expert_parallel_size",
    "enable_expert_parallel",
    "distributed_executor_backend",
    "gpu_group_size",
    "server_context_overhead_tokens",
    "extra_vllm_args",
    "tp",
    "pp",
    "dp",
    "ep",
    "pcp",
    "dcp",
];

/// Normalizes a vLLM `topology:` mapping (as in `aiperf.topology`, a post-MIP node's
/// `config.topology`, `vllm_stats.runtime_stats.topology`).
///
/// Aliases `tp`, `pp`, `dp`, `ep`, `pcp`, `dcp` name the long vLLM keys (giving both is an
/// error). `enable_expert_parallel: true` sets `ep = tp * dp` (vLLM's expert-parallel group);
/// an explicit `expert_parallel_size` must then equal that, and must be 1 when expert
/// parallelism is disabled. `gpu_group_size`, if present, must equal the GPUs of one instance.
///
/// # Errors
/// [`PlanError::UnknownField`], [`PlanError::InvalidValue`] or [`PlanError::BadMesh`] naming the
/// key path.
pub(super) fn normalize_vllm_topology(
    file: &str,
    path: &str,
    node: &Value,
) -> Result<VllmTopology, PlanError> {
    let map = expect_map(file, path, node)
        .map_err(|_| invalid(file, path, node, "a vLLM topology mapping"))?;
    check_keys(file, path, map, &VLLM_KEYS)?;
    let size = |long: &str, short: &str| -> Result<Option<u32>, PlanError> {
        let a = map.get_key_value(long);
        let b = map.get_key_value(short);
        match (a, b) {
            (Some(_), Some(_)) => Err(PlanError::InvalidValue {
                file: file.to_string(),
                path: join(path, short),
                value: "given twice".to_string(),
                expected: format!("either `{long}` or its alias `{short}`, not both"),
            }),
            (Some((k, v)), None) | (None, Some((k, v))) => {
                if v.is_null() {
                    Ok(None)
                } else {
                    expect_u32(file, &join(path, k), v, 1).map(Some)
                }
            }
            (None, None) => Ok(None),
        }
    };
    let tp = size("tensor_parallel_size", "tp")?.unwrap_or(1);
    let pp = size("pipeline_parallel_size", "pp")?.unwrap_or(1);
    let dp = size("data_parallel_size", "dp")?.unwrap_or(1);
    let pcp = size("prefill_context_parallel_size", "pcp")?.unwrap_or(1);
    let dcp = size("decode_context_parallel_size", "dcp")?.unwrap_or(1);
    let ep_explicit = size("expert_parallel_size", "ep")?;
    let enable = match map.get_key_value("enable_expert_parallel") {
        None => None,
        Some((_, Value::Null)) => None,
        Some((_, Value::Bool(b))) => Some(*b),
        Some((k, other)) => return Err(invalid(file, &join(path, k), other, "true or false")),
    };
    let bad = |reason: String| PlanError::BadMesh {
        context: path.to_string(),
        mesh: format!(
            "tensor_parallel_size={tp} pipeline_parallel_size={pp} data_parallel_size={dp}"
        ),
        reason,
    };
    let Some(tp_dp) = tp.checked_mul(dp) else {
        return Err(bad(format!(
            "tensor_parallel_size * data_parallel_size overflows ({tp} * {dp})"
        )));
    };
    let ep = match (enable, ep_explicit) {
        (Some(true), Some(ep)) if ep != tp_dp => {
            return Err(bad(format!(
                "expert_parallel_size={ep} but vLLM's expert-parallel group is tp*dp = {}",
                tp_dp
            )));
        }
        (Some(true), _) => tp_dp,
        (Some(false), Some(ep)) if ep > 1 => {
            return Err(bad(format!(
                "expert_parallel_size={ep} with enable_expert_parallel: false"
            )));
        }
        (Some(false), _) => 1,
        // Without the switch, an explicit size > 1 turns expert parallelism on; it must then be
        // vLLM's group size.
        (None, Some(ep)) if ep > 1 && ep != tp_dp => {
            return Err(bad(format!(
                "expert_parallel_size={ep} but vLLM's expert-parallel group is tp*dp = {}",
                tp_dp
            )));
        }
        (None, Some(ep)) => ep,
        (None, None) => 1,
    };
    if !tp.is_multiple_of(dcp) {
        return Err(bad(format!(
            "decode_context_parallel_size={dcp} must divide tensor_parallel_size={tp}"
        )));
    }
    let backend = match map.get_key_value("distributed_executor_backend") {
        None | Some((_, Value::Null)) => None,
        Some((_, Value::String(s))) => Some(s.clone()),
        Some((k, other)) => {
            return Err(invalid(
                file,
                &join(path, k),
                other,
                "a backend name such as mp or ray",
            ));
        }
    };
    let topo = VllmTopology {
        tensor_parallel_size: tp,
        pipeline_parallel_size: pp,
        data_parallel_size: dp,
        prefill_context_parallel_size: pcp,
        decode_context_parallel_size: dcp,
        expert_parallel_size: ep,
        distributed_executor_backend: backend,
    };
    if let Some((k, v)) = map.get_key_value("gpu_group_size")
        && !v.is_null()
    {
        {
            let g = expect_u32(file, &join(path, k), v, 1)?;
            if u64::from(g) != topo.gpus() {
                return Err(bad(format!(
                    "gpu_group_size={g} but the topology needs tp*pp*pcp*dp = {} GPU(s)",
                    topo.gpus()
                )));
            }
        }
    }
    Ok(topo)
}

impl GpuAllocation {
    /// The allocation of a CPU-only stage: all instances on one node, no GPU.
    pub fn cpu_only(instances: u32) -> GpuAllocation {
        GpuAllocation {
            instances,
            gpus_per_instance: 0,
            gpus_per_node: 0,
            nodes: 1,
            total_gpus: 0,
            instances_per_node: instances,
            nodes_per_instance: 1,
            exclusive: false,
            placements: (0..instances)
                .map(|_| InstancePlacement {
                    node: 0,
                    node_count: 1,
                    first_gpu: 0,
                    gpus_on_node: 0,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(v: serde_json::Value) -> Value {
        Value::from_json(&v)
    }

    #[test]
    fn five_tp3_instances_need_three_nodes() {
        let a = pack_gpu_allocation("t", 5, 3, 8).unwrap();
        assert_eq!(a.nodes, 3);
        assert_eq!(a.total_gpus, 15);
        assert!(!a.exclusive);
        let p: Vec<(u32, Range<u32>)> = a
            .placements()
            .iter()
            .map(|p| (p.node, p.local_gpu_ids()))
            .collect();
        assert_eq!(
            p,
            vec![(0, 0..3), (0, 3..6), (1, 0..3), (1, 3..6), (2, 0..3)]
        );
        assert_eq!(a.gpus_on_node(2), 3);
        assert_eq!(a.max_gpus_on_a_node(), 6);
    }

    #[test]
    fn multi_node_instances_take_whole_nodes() {
        let a = pack_gpu_allocation("t", 2, 16, 8).unwrap();
        assert_eq!(a.nodes, 4);
        assert!(a.exclusive);
        assert_eq!(
            a.placements()[1],
            InstancePlacement {
                node: 2,
                node_count: 2,
                first_gpu: 0,
                gpus_on_node: 8
            }
        );
        let e = pack_gpu_allocation("bypass", 1, 12, 8).unwrap_err();
        assert!(e.to_string().contains("12 is not a multiple of 8"), "{e}");
    }

    #[test]
    fn tiling_allocations_are_exclusive() {
        let a = pack_gpu_allocation("t", 8, 2, 8).unwrap();
        assert_eq!((a.nodes, a.total_gpus, a.exclusive), (2, 16, true));
        let b = pack_gpu_allocation("t", 4, 1, 8).unwrap();
        assert_eq!((b.nodes, b.total_gpus, b.exclusive), (1, 4, false));
    }

    #[test]
    fn from_mapping_refuses_typos_and_non_integers() {
        let e = ParallelMesh::from_mapping(
            "x.yaml",
            "pruning.automodel.parallel",
            &node(json!({"tp_size": 2})),
        )
        .unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("pruning.automodel.parallel.tp_size") && m.contains("did you mean `tp`"),
            "{m}"
        );
        let e = ParallelMesh::from_mapping("x.yaml", "p", &node(json!({"tp": 2.7}))).unwrap_err();
        assert!(
            e.to_string().contains("p.tp") && e.to_string().contains("2.7"),
            "{e}"
        );
        let e = ParallelMesh::from_mapping("x.yaml", "p", &node(json!({"pp": 0}))).unwrap_err();
        assert!(matches!(e, PlanError::InvalidValue { .. }));
        let m = ParallelMesh::from_mapping(
            "x.yaml",
            "p",
            &node(json!({"pp": 2, "ep": 4, "dp_shard": 4, "sequence_parallel": false})),
        )
        .unwrap();
        assert_eq!(
            m,
            ParallelMesh {
                pp: 2,
                ep: 4,
                dp_shard: 4,
                ..ParallelMesh::SINGLE
            }
        );
        assert_eq!(m.world_size(), 8);
        let e = ParallelMesh::from_mapping("x.yaml", "p", &node(json!({"ep": 3, "dp_shard": 4})))
            .unwrap_err();
        assert!(matches!(e, PlanError::BadMesh { .. }), "{e}");
    }

    #[test]
    fn vllm_topology_aliases_and_expert_switch() {
        let t = normalize_vllm_topology(
            "f",
            "t",
            &node(json!({"tp": 2, "dp": 2, "enable_expert_parallel": true})),
        )
        .unwrap();
        assert_eq!(t.expert_parallel_size, 4);
        assert_eq!(t.gpus(), 4);
        assert_eq!(t.mesh().world_size(), 4);
        let t = normalize_vllm_topology("f", "t", &node(json!({"tensor_parallel_size": 1, "pipeline_parallel_size": 2, "gpu_group_size": 2}))).unwrap();
        assert_eq!(
            t.mesh(),
            ParallelMesh {
                pp: 2,
                ..ParallelMesh::SINGLE
            }
        );
        assert!(
            normalize_vllm_topology("f", "t", &node(json!({"tp": 2, "tensor_parallel_size": 2})))
                .is_err()
        );
        assert!(
            normalize_vllm_topology("f", "t", &node(json!({"tp": 8, "gpu_group_size": 4})))
                .is_err()
        );
        assert!(
            normalize_vllm_topology(
                "f",
                "t",
                &node(json!({"tp": 2, "expert_parallel_size": 2, "enable_expert_parallel": false}))
            )
            .is_err()
        );
        let e = normalize_vllm_topology("f", "t", &node(json!({"tensor_paralel_size": 2})))
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("did you mean `tensor_parallel_size`"),
            "{e}"
        );
    }
}
