//! The stage catalog: a campaign's stage graph as data.
//!
//! A [`StageCatalog`] lists [`StageDef`]s (id, parents, whether and when it is enabled, default
//! strategy, where its mesh comes from, its command). [`StageCatalog::resolve`] reads an
//! experiment config and returns the enabled stages in a deterministic topological order, with
//! parents *contracted* through disabled stages (a disabled `tokenize_data` makes its children
//! depend on `convert`).
//!
//! Three ways to get a catalog:
//! - [`StageCatalog::puzzle`]: Puzzletron's pipeline (convert -> ... -> mip -> evaluation),
//!   including the expansion of `post_mip.flows.<flow>.nodes.<node>` into `post.<flow>.<node>`
//!   stages;
//! - [`StageCatalog::new`] with [`StageDef`]s built in Rust;
//! - a `stages:` list in the experiment YAML ([`StageCatalog::from_config`]):
//!   ```yaml
//!   stages:
//!     - {id: prepare, command: [python, prep.py]}
//!     - {id: train, needs: [prepare], strategy: sharded, command: [python, train.py]}
//!   ```

use std::collections::{BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::execution::{FailurePolicy, Strategy};
use super::mesh::{ParallelMesh, normalize_vllm_topology};
use super::plan_error::PlanError;
use super::tree::{
    Node, check_keys, did_you_mean, expect_map, expect_str_list, expect_u32, invalid, join,
};

/// What happens to a dependency edge when the parent stage is disabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum IfDisabled {
    /// Depend on the disabled parent's own (contracted) parents instead.
    Contract,
    /// Drop the edge (an optional input such as `build_library` reading `vllm_stats`).
    Drop,
}

/// One dependency edge.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Need {
    /// The parent stage id.
    pub stage: String,
    /// Behaviour when the parent is disabled.
    pub if_disabled: IfDisabled,
}

impl Need {
    /// A dependency contracted through a disabled parent.
    pub fn on(stage: &str) -> Self {
        Need {
            stage: stage.to_string(),
            if_disabled: IfDisabled::Contract,
        }
    }
    /// A dependency dropped when the parent is disabled.
    pub fn optional(stage: &str) -> Self {
        Need {
            stage: stage.to_string(),
            if_disabled: IfDisabled::Drop,
        }
    }
}

/// When a stage is part of the plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Enablement {
    /// Always.
    Always,
    /// When the boolean at a dotted config key is true; `default` when the key is absent/null.
    Key {
        /// Dotted key, e.g. `tokenize_data.enabled`.
        path: String,
        /// Value when absent.
        default: bool,
    },
    /// Never (a stage switched off in the catalog itself).
    Never,
    /// When every one of the inner conditions holds.
    All(Vec<Enablement>),
}

/// Where a stage's [`ParallelMesh`] comes from in the experiment config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum MeshSource {
    /// One GPU, no parallelism.
    Single,
    /// A fixed mesh.
    Fixed(ParallelMesh),
    /// The first present AutoModel `parallel:` mapping among these dotted keys.
    AutoModel(Vec<String>),
    /// A vLLM `topology:` mapping, normalized by [`normalize_vllm_topology`].
    Vllm(String),
}

/// Stages are sharded over the values of a config list (e.g. one group per embedding width).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardAxis {
    /// Dotted key of the list, e.g. `embedding_pruning.widths`.
    pub values_key: String,
    /// Dotted boolean key that switches the axis on; `None` = always.
    pub enabled_key: Option<String>,
    /// Human name for errors, e.g. `embedding widths`.
    pub name: String,
    /// Prefix of a group's label in work ids, e.g. `w` gives `w2048`.
    pub label_prefix: String,
}

/// One stage of a catalog.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageDef {
    /// Unique id.
    pub id: String,
    /// Parents.
    pub needs: Vec<Need>,
    /// When the stage runs.
    pub enabled: Enablement,
    /// Default strategy (the execution config may override it).
    pub strategy: Strategy,
    /// Default instances.
    pub instances: u32,
    /// Where its mesh comes from.
    pub mesh: MeshSource,
    /// Whether one instance is a torch.distributed job (launched with torchrun unless
    /// [`StageDef::direct_launch`]).
    pub distributed: bool,
    /// Whether the worker starts its own processes (vLLM servers, lm-eval, model export), so
    /// it is started directly even when distributed. Persistent-pool stages always are.
    #[serde(default)]
    pub direct_launch: bool,
    /// Whether shard / pool results must be merged by an aggregate step.
    pub aggregate: bool,
    /// Failure policy the stage asks for (the execution config still wins).
    pub failure_policy: Option<FailurePolicy>,
    /// The worker's argv. `{stage_id}`, `{work_id}`, `{shard_index}`, `{shard_count}` and
    /// `{config}` are replaced per work item; nothing is ever passed through a shell.
    pub command: Vec<String>,
    /// Optional shard axis.
    pub shard_axis: Option<ShardAxis>,
    /// Whether an interrupted attempt can resume from a checkpoint.
    pub resumable: bool,
    /// Files or folders, relative to the unit's output folder, that a successful attempt must
    /// leave (checked before the attempt counts as done; never outside the folder).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<String>,
    /// A validation command (argv, no shell) run in the unit's output folder after a
    /// successful attempt; a non-zero exit makes the attempt a failure. Empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validate: Vec<String>,
}

impl StageDef {
    /// A stage with defaults: always enabled, `single`, one instance, one GPU, not distributed,
    /// no command.
    pub fn new(id: &str) -> Self {
        StageDef {
            id: id.to_string(),
            needs: Vec::new(),
            enabled: Enablement::Always,
            strategy: Strategy::Single,
            instances: 1,
            mesh: MeshSource::Single,
            distributed: false,
            direct_launch: false,
            aggregate: false,
            failure_policy: None,
            command: Vec::new(),
            shard_axis: None,
            resumable: false,
            outputs: Vec::new(),
            validate: Vec::new(),
        }
    }
    /// Adds contracted parents.
    pub fn needs(mut self, parents: &[&str]) -> Self {
        self.needs.extend(parents.iter().map(|p| Need::on(p)));
        self
    }
    /// Adds an optional parent (dropped when disabled).
    pub fn optional_need(mut self, parent: &str) -> Self {
        self.needs.push(Need::optional(parent));
        self
    }
    /// Enabled by a boolean config key.
    pub fn enabled_by(mut self, path: &str, default: bool) -> Self {
        self.enabled = Enablement::Key {
            path: path.to_string(),
            default,
        };
        self
    }
    /// Sets the default strategy.
    pub fn strategy(mut self, s: Strategy) -> Self {
        self.strategy = s;
        self
    }
    /// Sets the mesh source.
    pub fn mesh(mut self, m: MeshSource) -> Self {
        self.mesh = m;
        self
    }
    /// Marks the stage distributed (torchrun).
    pub fn distributed(mut self, d: bool) -> Self {
        self.distributed = d;
        self
    }

    /// Marks the worker as starting its own processes (see [`StageDef::direct_launch`]).
    pub fn direct_launch(mut self, d: bool) -> Self {
        self.direct_launch = d;
        self
    }
    /// Marks shard/pool results as needing aggregation.
    pub fn aggregate(mut self, a: bool) -> Self {
        self.aggregate = a;
        self
    }
    /// Sets the argv.
    pub fn command(mut self, argv: Vec<String>) -> Self {
        self.command = argv;
        self
    }
}

/// A stage after resolution against a config: enabled, parents contracted, mesh read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResolvedStage {
    /// Stage id.
    pub id: String,
    /// Parents (enabled stages), in catalog order, without duplicates.
    pub parents: Vec<String>,
    /// Default strategy.
    pub strategy: Strategy,
    /// Default instances.
    pub instances: u32,
    /// Mesh from the config.
    pub mesh: ParallelMesh,
    /// Whether an instance is a torch.distributed job.
    pub distributed: bool,
    /// Whether the worker starts its own processes (no torchrun).
    pub direct_launch: bool,
    /// Whether results need aggregation.
    pub aggregate: bool,
    /// Failure policy the stage asks for.
    pub failure_policy: Option<FailurePolicy>,
    /// Argv template.
    pub command: Vec<String>,
    /// Shard groups: `(label, value)` pairs, e.g. `("w2048", "2048")`; empty when unsharded.
    pub shard_groups: Vec<(String, String)>,
    /// Name of the shard axis (for errors), if any.
    pub shard_axis_name: Option<String>,
    /// Whether an attempt can resume from a checkpoint.
    pub resumable: bool,
    /// Files or folders, relative to the unit's output folder, that a successful attempt must
    /// leave (checked before the attempt counts as done; never outside the folder).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<String>,
    /// A validation command (argv, no shell) run in the unit's output folder after a
    /// successful attempt; a non-zero exit makes the attempt a failure. Empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validate: Vec<String>,
}

/// Post-MIP flow expansion settings of the Puzzle catalog.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PostMipExpansion {
    /// Config key holding the flows (`post_mip.flows`).
    pub flows_key: String,
    /// The stage a flow's source nodes depend on (`mip`).
    pub source_stage: String,
    /// Stages a non-empty flow set replaces (the legacy post-MIP tail).
    pub replaces: Vec<String>,
    /// Worker argv prefix for post nodes.
    pub command: Vec<String>,
}

/// A stage graph as data. See the module docs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageCatalog {
    /// Catalog name (`puzzle`, `config`, or the user's).
    pub name: String,
    /// The stages, in declaration order (the tie-break of the topological order).
    pub stages: Vec<StageDef>,
    /// Post-MIP flow expansion, if the catalog has it.
    pub post_mip: Option<PostMipExpansion>,
}

/// The worker entry point of the Puzzle catalog: the Puzzletron v2 stage runner, given the
/// stage, the work item and the resolved config path.
pub const PUZZLE_WORKER: [&str; 3] = ["python", "-m", "modelopt.torch.puzzletron.v2.run_stage"];

fn puzzle_command() -> Vec<String> {
    let mut argv: Vec<String> = PUZZLE_WORKER.iter().map(|s| s.to_string()).collect();
    for a in [
        "--config",
        "{config}",
        "--stage",
        "{stage_id}",
        "--work-item",
        "{work_id}",
        "--shard",
        "{shard_index}/{shard_count}",
    ] {
        argv.push(a.to_string());
    }
    argv
}

fn embedding_widths() -> ShardAxis {
    ShardAxis {
        values_key: "embedding_pruning.widths".into(),
        enabled_key: Some("embedding_pruning.enabled".into()),
        name: "embedding widths".into(),
        label_prefix: "w".into(),
    }
}

fn automodel(paths: &[&str]) -> MeshSource {
    MeshSource::AutoModel(
        paths
            .iter()
            .map(|p| format!("{p}.automodel.parallel"))
            .collect(),
    )
}

impl StageCatalog {
    /// A catalog of user stages (no post-MIP expansion).
    pub fn new(name: &str, stages: Vec<StageDef>) -> Self {
        StageCatalog {
            name: name.to_string(),
            stages,
            post_mip: None,
        }
    }

    /// The Puzzletron pipeline: stage ids, parents (contracted through disabled stages), the
    /// config keys that enable them, default strategies, mesh sources, and `post_mip.flows`.
    ///
    /// The graph reproduces the Python reference orchestrator (snapshot 2026-08-21) on the
    /// fixture configs: e.g. `mip` needs `vllm_stats`, `depth_importance` and
    /// `replacement_scoring`; `build_library` needs `bypass` and (only if enabled) `vllm_stats`.
    pub fn puzzle() -> Self {
        use Strategy::*;
        let cmd = puzzle_command();
        let s = |id: &str| StageDef::new(id).command(cmd.clone());
        let stages = vec![
            s("convert"),
            s("tokenize_data")
                .needs(&["convert"])
                .enabled_by("tokenize_data.enabled", false),
            s("vllm_stats")
                .needs(&["convert"])
                .enabled_by("vllm_stats.enabled", false)
                .strategy(Sharded)
                .mesh(MeshSource::Vllm("vllm_stats.runtime_stats.topology".into()))
                .aggregate(true),
            s("depth_importance")
                .needs(&["tokenize_data"])
                .enabled_by("depth_importance.enabled", false)
                .strategy(PersistentPool)
                .mesh(automodel(&["depth_importance", "pruning"]))
                .distributed(true)
                .aggregate(true),
            s("width_importance")
                .needs(&["tokenize_data"])
                .mesh(automodel(&["pruning"]))
                .distributed(true),
            s("sort")
                .needs(&["width_importance"])
                .mesh(automodel(&["sort", "pruning"]))
                .distributed(true),
            s("sort_sanity")
                .needs(&["sort"])
                .enabled_by("sort_sanity.enabled", false)
                .mesh(automodel(&["sort_sanity", "pruning"]))
                .distributed(true),
            s("width_sanity")
                .needs(&["sort_sanity"])
                .enabled_by("width_sanity.enabled", false)
                .mesh(automodel(&["width_sanity", "pruning"]))
                .distributed(true),
            s("slicing_sanity")
                .needs(&["width_sanity"])
                .enabled_by("slicing_sanity.enabled", false)
                .mesh(automodel(&["slicing_sanity", "pruning"])),
            s("bypass_sanity")
                .needs(&["sort"])
                .enabled_by("bypass_sanity.enabled", false)
                .mesh(automodel(&["bypass"]))
                .distributed(true),
            {
                let mut d = s("bypass")
                    .needs(&["bypass_sanity"])
                    .enabled_by("bypass.enabled", false)
                    .mesh(automodel(&["bypass"]))
                    .distributed(true);
                d.resumable = true;
                d
            },
            s("build_library")
                .needs(&["bypass"])
                .optional_need("vllm_stats")
                .enabled_by("build_library.enabled", true)
                .mesh(automodel(&["replacement_scoring", "pruning"]))
                .distributed(true),
            {
                let mut d = s("replacement_scoring")
                    .needs(&["build_library"])
                    .enabled_by("replacement_scoring.enabled", true)
                    .strategy(PersistentPool)
                    .mesh(automodel(&["replacement_scoring"]))
                    .distributed(true)
                    .aggregate(true);
                // Scoring runs one pool per embedding width (the reference submits one gang per
                // width).
                d.shard_axis = Some(embedding_widths());
                d
            },
            s("mip")
                .needs(&["vllm_stats", "depth_importance", "replacement_scoring"])
                .enabled_by("mip.enabled", true),
            {
                let mut d = s("zero_shot_evaluation")
                    .needs(&["mip"])
                    .enabled_by("zero_shot_evaluation.enabled", false)
                    .strategy(Sharded)
                    .mesh(automodel(&["zero_shot_evaluation"]))
                    .distributed(true)
                    // lm-eval with its own model parallelism: no torchrun (as the reference).
                    .direct_launch(true)
                    .aggregate(true);
                d.shard_axis = Some(embedding_widths());
                d
            },
            s("aiperf")
                .needs(&["mip"])
                .enabled_by("aiperf.enabled", false)
                .strategy(Sharded)
                .mesh(MeshSource::Vllm("aiperf.topology".into()))
                .aggregate(true),
            s("global_distillation_sanity")
                .needs(&["mip"])
                .enabled_by("global_distillation_sanity.enabled", false)
                .mesh(automodel(&["global_distillation_sanity"]))
                .distributed(true),
            {
                let mut d = s("global_distillation")
                    .needs(&["global_distillation_sanity"])
                    .enabled_by("global_distillation.enabled", false)
                    .mesh(automodel(&["global_distillation"]))
                    .distributed(true);
                d.resumable = true;
                d
            },
            s("post_distillation_evaluation")
                .needs(&["global_distillation"])
                .enabled_by("post_distillation_evaluation.enabled", false)
                .mesh(automodel(&[
                    "post_distillation_evaluation",
                    "global_distillation",
                ]))
                .distributed(true),
        ];
        StageCatalog {
            name: "puzzle".into(),
            stages,
            post_mip: Some(PostMipExpansion {
                flows_key: "post_mip.flows".into(),
                source_stage: "mip".into(),
                replaces: [
                    "zero_shot_evaluation",
                    "aiperf",
                    "global_distillation_sanity",
                    "global_distillation",
                    "post_distillation_evaluation",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
                command: cmd,
            }),
        }
    }

    /// The dotted config keys this catalog reads: each stage's enable switch, mesh sources and
    /// shard axis, and the post-MIP flows key. Everything else in an experiment is passed to
    /// the workers unchecked.
    pub fn read_keys(&self) -> Vec<String> {
        fn enablement(e: &Enablement, out: &mut Vec<String>) {
            match e {
                Enablement::Key { path, .. } => out.push(path.clone()),
                Enablement::All(items) => items.iter().for_each(|i| enablement(i, out)),
                Enablement::Always | Enablement::Never => {}
            }
        }
        let mut out: Vec<String> = Vec::new();
        for d in &self.stages {
            enablement(&d.enabled, &mut out);
            match &d.mesh {
                MeshSource::AutoModel(paths) => out.extend(paths.iter().cloned()),
                MeshSource::Vllm(path) => out.push(path.clone()),
                MeshSource::Single | MeshSource::Fixed(_) => {}
            }
            if let Some(axis) = &d.shard_axis {
                out.push(axis.values_key.clone());
                out.extend(axis.enabled_key.iter().cloned());
            }
        }
        if let Some(pm) = &self.post_mip {
            out.push(pm.flows_key.clone());
        }
        let mut seen = HashSet::new();
        out.retain(|k| seen.insert(k.clone()));
        out
    }

    /// The catalog an experiment config asks for: its own `stages:` list if it has one (see
    /// the module docs), else [`StageCatalog::puzzle`].
    ///
    /// # Errors
    /// [`PlanError::UnknownField`] / [`PlanError::InvalidValue`] for a malformed `stages:` list.
    pub fn from_config(file: &str, config: &Node) -> Result<Self, PlanError> {
        match config.get("stages") {
            None | Some(Node::Null) => Ok(Self::puzzle()),
            Some(Node::Seq(items)) => {
                let mut stages = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    stages.push(parse_user_stage(file, &format!("stages[{i}]"), item)?);
                }
                Ok(StageCatalog::new("config", stages))
            }
            Some(other) => Err(invalid(
                file,
                "stages",
                other,
                "a list of stages ({id, needs, strategy, command})",
            )),
        }
    }

    /// Resolves the catalog against an experiment config: enabled stages in topological order
    /// (catalog order breaks ties), parents contracted through disabled stages, meshes read.
    ///
    /// # Errors
    /// [`PlanError::DuplicateStage`], [`PlanError::MissingParent`] (with a suggestion),
    /// [`PlanError::Cycle`] (listing it), and mesh/flow errors naming their key path.
    pub fn resolve(&self, file: &str, config: &Node) -> Result<Vec<ResolvedStage>, PlanError> {
        let mut defs: Vec<StageDef> = self.stages.clone();
        let mut post_nodes: Vec<(StageDef, ParallelMesh)> = Vec::new();
        let mut replaced: BTreeSet<String> = BTreeSet::new();
        if let Some(pm) = &self.post_mip {
            post_nodes = expand_post_mip(file, config, pm)?;
            if !post_nodes.is_empty() {
                replaced.extend(pm.replaces.iter().cloned());
            }
        }
        let n_catalog = defs.len();
        defs.extend(post_nodes.iter().map(|(d, _)| d.clone()));

        let mut index: HashMap<&str, usize> = HashMap::with_capacity(defs.len());
        for (i, d) in defs.iter().enumerate() {
            if index.insert(d.id.as_str(), i).is_some() {
                return Err(PlanError::DuplicateStage {
                    stage: d.id.clone(),
                });
            }
        }
        for d in &defs {
            for need in &d.needs {
                if !index.contains_key(need.stage.as_str()) {
                    return Err(PlanError::MissingParent {
                        stage: d.id.clone(),
                        parent: need.stage.clone(),
                        suggestion: did_you_mean(&need.stage, defs.iter().map(|d| d.id.as_str())),
                    });
                }
            }
        }
        // Cycles are checked on the full graph, so a cycle through a disabled stage is still
        // reported (contraction would otherwise loop).
        let order = topo_order(&defs, &index)?;

        let mut enabled = vec![false; defs.len()];
        for (i, d) in defs.iter().enumerate() {
            enabled[i] = !replaced.contains(&d.id) && is_enabled(file, config, &d.enabled)?;
        }
        // Contracted parents, computed in topological order so a parent's set is ready.
        let mut effective: Vec<Vec<usize>> = vec![Vec::new(); defs.len()];
        for &i in &order {
            let mut out: Vec<usize> = Vec::new();
            for need in &defs[i].needs {
                let p = index[need.stage.as_str()];
                if enabled[p] {
                    if !out.contains(&p) {
                        out.push(p);
                    }
                } else if need.if_disabled == IfDisabled::Contract {
                    for &q in &effective[p] {
                        if !out.contains(&q) {
                            out.push(q);
                        }
                    }
                }
            }
            effective[i] = out;
        }

        let mut resolved = Vec::new();
        for &i in &order {
            if !enabled[i] {
                continue;
            }
            let d = &defs[i];
            let mesh = if i >= n_catalog {
                post_nodes[i - n_catalog].1
            } else {
                read_mesh(file, config, &d.mesh, &d.id)?
            };
            let (shard_groups, shard_axis_name) = match &d.shard_axis {
                Some(axis) => (
                    read_shard_groups(file, config, axis)?,
                    Some(axis.name.clone()),
                ),
                None => (Vec::new(), None),
            };
            resolved.push(ResolvedStage {
                id: d.id.clone(),
                parents: effective[i].iter().map(|&p| defs[p].id.clone()).collect(),
                strategy: d.strategy,
                instances: d.instances,
                mesh,
                distributed: d.distributed,
                direct_launch: d.direct_launch,
                aggregate: d.aggregate,
                failure_policy: d.failure_policy,
                command: d.command.clone(),
                shard_groups,
                shard_axis_name,
                resumable: d.resumable,
                outputs: d.outputs.clone(),
                validate: d.validate.clone(),
            });
        }
        Ok(resolved)
    }
}

/// Kahn's algorithm with the declaration index as priority: deterministic, and equal to the
/// declaration order whenever that is already topological.
fn topo_order(defs: &[StageDef], index: &HashMap<&str, usize>) -> Result<Vec<usize>, PlanError> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let n = defs.len();
    let mut indeg = vec![0usize; n];
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, d) in defs.iter().enumerate() {
        let mut seen = BTreeSet::new();
        for need in &d.needs {
            let p = index[need.stage.as_str()];
            if seen.insert(p) {
                indeg[i] += 1;
                children[p].push(i);
            }
        }
    }
    let mut heap: BinaryHeap<Reverse<usize>> =
        (0..n).filter(|&i| indeg[i] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(i)) = heap.pop() {
        order.push(i);
        for &c in &children[i] {
            indeg[c] -= 1;
            if indeg[c] == 0 {
                heap.push(Reverse(c));
            }
        }
    }
    if order.len() == n {
        return Ok(order);
    }
    // Find one cycle among the remaining stages: walk parents until a stage repeats.
    let start = (0..n).find(|&i| indeg[i] > 0).unwrap_or(0);
    let mut path: Vec<usize> = vec![start];
    let mut cur = start;
    loop {
        let next = defs[cur]
            .needs
            .iter()
            .map(|need| index[need.stage.as_str()])
            .find(|&p| indeg[p] > 0)
            .unwrap_or(start);
        if let Some(pos) = path.iter().position(|&x| x == next) {
            let mut cycle: Vec<String> = path[pos..]
                .iter()
                .rev()
                .map(|&i| defs[i].id.clone())
                .collect();
            cycle.push(cycle[0].clone());
            return Err(PlanError::Cycle { cycle });
        }
        path.push(next);
        cur = next;
    }
}

fn is_enabled(file: &str, config: &Node, e: &Enablement) -> Result<bool, PlanError> {
    match e {
        Enablement::Always => Ok(true),
        Enablement::Never => Ok(false),
        Enablement::Key { path, default } => match config.get_path(path) {
            None | Some(Node::Null) => Ok(*default),
            Some(Node::Bool(b)) => Ok(*b),
            Some(other) => Err(invalid(file, path, other, "true or false")),
        },
        Enablement::All(items) => {
            for item in items {
                if !is_enabled(file, config, item)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
    }
}

fn read_mesh(
    file: &str,
    config: &Node,
    source: &MeshSource,
    stage: &str,
) -> Result<ParallelMesh, PlanError> {
    let mesh = match source {
        MeshSource::Single => ParallelMesh::SINGLE,
        MeshSource::Fixed(m) => *m,
        MeshSource::AutoModel(paths) => {
            match paths
                .iter()
                .find_map(|p| config.get_path(p).filter(|n| !n.is_null()).map(|n| (p, n)))
            {
                Some((p, n)) => ParallelMesh::from_mapping(file, p, n)?,
                None => ParallelMesh::SINGLE,
            }
        }
        MeshSource::Vllm(path) => match config.get_path(path) {
            None | Some(Node::Null) => ParallelMesh::SINGLE,
            Some(n) => normalize_vllm_topology(file, path, n)?.mesh(),
        },
    };
    mesh.validate(stage)?;
    Ok(mesh)
}

fn read_shard_groups(
    file: &str,
    config: &Node,
    axis: &ShardAxis,
) -> Result<Vec<(String, String)>, PlanError> {
    if let Some(k) = &axis.enabled_key {
        match config.get_path(k) {
            Some(Node::Bool(true)) => {}
            None | Some(Node::Null) | Some(Node::Bool(false)) => return Ok(Vec::new()),
            Some(other) => return Err(invalid(file, k, other, "true or false")),
        }
    }
    let items = match config.get_path(&axis.values_key) {
        None | Some(Node::Null) => return Ok(Vec::new()),
        Some(Node::Seq(items)) => items,
        Some(other) => return Err(invalid(file, &axis.values_key, other, "a list")),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let text = match v {
                Node::Int(x) => x.to_string(),
                Node::Str(s) => s.clone(),
                other => {
                    return Err(invalid(
                        file,
                        &format!("{}[{i}]", axis.values_key),
                        other,
                        "an integer or a string",
                    ));
                }
            };
            Ok((format!("{}{}", axis.label_prefix, text), text))
        })
        .collect()
}

/// Post-MIP node types, with (strategy, distributed, direct launch). As in the reference,
/// `materialize` (model export), `aiperf` (a vLLM server under load) and
/// `downstream_evaluation` (lm-eval / lmms-eval) start their own processes: no torchrun.
const NODE_TYPES: [(&str, Strategy, bool, bool); 6] = [
    ("filter", Strategy::Single, false, false),
    ("evaluation", Strategy::Sharded, true, false),
    ("materialize", Strategy::Sharded, true, true),
    ("aiperf", Strategy::Sharded, true, true),
    ("global_kd", Strategy::Sharded, true, false),
    ("downstream_evaluation", Strategy::Sharded, true, true),
];
const FLOW_KEYS: [&str; 2] = ["source", "nodes"];
const NODE_KEYS: [&str; 11] = [
    "type",
    "input",
    "config",
    "mode",
    "metric",
    "metrics",
    "direction",
    "top_k",
    "best_selection_mode",
    "failure_policy",
    "model_source",
];

/// Expands `post_mip.flows` into `post.<flow>.<node>` stages (flows and nodes in document
/// order). A node's parents: its `input` (or the source stage `mip` when it has none), its
/// `model_source`, then the nodes its filter metrics read (`final_eval.lm_loss` -> `final_eval`).
fn expand_post_mip(
    file: &str,
    config: &Node,
    pm: &PostMipExpansion,
) -> Result<Vec<(StageDef, ParallelMesh)>, PlanError> {
    let flows = match config.get_path(&pm.flows_key) {
        None | Some(Node::Null) => return Ok(Vec::new()),
        Some(n) => expect_map(file, &pm.flows_key, n)?,
    };
    let mut out = Vec::new();
    for (flow, fnode) in flows {
        let fpath = join(&pm.flows_key, flow);
        // `flow: false` switches a flow off, like `mip.runs.<run>: false`.
        if matches!(fnode, Node::Bool(false) | Node::Null) {
            continue;
        }
        check_flow_name(file, &fpath, flow)?;
        let fmap = expect_map(file, &fpath, fnode)?;
        check_keys(file, &fpath, fmap, &FLOW_KEYS)?;
        let nodes_path = join(&fpath, "nodes");
        let nodes = match fnode.get("nodes") {
            Some(n) => expect_map(file, &nodes_path, n)?,
            None => {
                return Err(PlanError::MissingField {
                    file: file.into(),
                    path: nodes_path,
                    expected: "the nodes of the flow".into(),
                });
            }
        };
        let names: Vec<&str> = nodes.iter().map(|(k, _)| k.as_str()).collect();
        let sid = |node: &str| format!("post.{flow}.{node}");
        for (name, node) in nodes {
            let npath = join(&nodes_path, name);
            check_flow_name(file, &npath, name)?;
            let nmap = expect_map(file, &npath, node)?;
            check_keys(file, &npath, nmap, &NODE_KEYS)?;
            let ty = match node.get("type") {
                Some(Node::Str(t)) => t.as_str(),
                Some(other) => {
                    return Err(invalid(file, &join(&npath, "type"), other, "a node type"));
                }
                None => {
                    return Err(PlanError::MissingField {
                        file: file.into(),
                        path: join(&npath, "type"),
                        expected: "the node type".into(),
                    });
                }
            };
            let Some(&(_, strategy, distributed, direct)) =
                NODE_TYPES.iter().find(|(t, _, _, _)| *t == ty)
            else {
                let valid: Vec<&str> = NODE_TYPES.iter().map(|(t, _, _, _)| *t).collect();
                return Err(PlanError::InvalidValue {
                    file: file.into(),
                    path: join(&npath, "type"),
                    value: format!("{ty:?}"),
                    expected: format!(
                        "one of {}{}",
                        valid.join(", "),
                        did_you_mean(ty, valid.iter().copied())
                            .map(|s| format!(" (did you mean `{s}`?)"))
                            .unwrap_or_default()
                    ),
                });
            };
            let node_ref = |key: &str, v: &Node| -> Result<String, PlanError> {
                match v {
                    Node::Str(s) if names.contains(&s.as_str()) => Ok(sid(s)),
                    Node::Str(s) => Err(PlanError::MissingParent {
                        stage: sid(name),
                        parent: format!("{} (from `{}`)", sid(s), join(&npath, key)),
                        suggestion: did_you_mean(s, names.iter().copied()).map(|x| sid(&x)),
                    }),
                    other => Err(invalid(
                        file,
                        &join(&npath, key),
                        other,
                        "the name of a node of this flow",
                    )),
                }
            };
            let mut parents: Vec<String> = Vec::new();
            match node.get("input") {
                None | Some(Node::Null) => parents.push(pm.source_stage.clone()),
                Some(v) => parents.push(node_ref("input", v)?),
            }
            if let Some(v) = node.get("model_source").filter(|v| !v.is_null()) {
                parents.push(node_ref("model_source", v)?);
            }
            let mut metric_names: Vec<String> = Vec::new();
            if let Some(Node::Str(m)) = node.get("metric") {
                metric_names.push(m.clone());
            }
            if let Some(Node::Seq(items)) = node.get("metrics") {
                for item in items {
                    if let Some(Node::Str(m)) = item.get("metric") {
                        metric_names.push(m.clone());
                    }
                }
            }
            for m in metric_names {
                if let Some((prefix, _)) = m.split_once('.')
                    && names.contains(&prefix)
                {
                    parents.push(sid(prefix));
                }
            }
            let mut dedup: Vec<String> = Vec::new();
            for p in parents {
                if !dedup.contains(&p) {
                    dedup.push(p);
                }
            }
            let failure_policy = match node.get("failure_policy") {
                None | Some(Node::Null) => None,
                Some(v) => Some(FailurePolicy::from_node(
                    file,
                    &join(&npath, "failure_policy"),
                    v,
                )?),
            };
            let cfg = node.get("config");
            let mesh = match cfg {
                Some(c)
                    if c.get_path("automodel.parallel")
                        .is_some_and(|n| !n.is_null()) =>
                {
                    let p = join(&npath, "config.automodel.parallel");
                    ParallelMesh::from_mapping(
                        file,
                        &p,
                        c.get_path("automodel.parallel").unwrap_or(&Node::Null),
                    )?
                }
                Some(c) if c.get("topology").is_some_and(|n| !n.is_null()) => {
                    let p = join(&npath, "config.topology");
                    normalize_vllm_topology(file, &p, c.get("topology").unwrap_or(&Node::Null))?
                        .mesh()
                }
                _ => ParallelMesh::SINGLE,
            };
            let mut def = StageDef::new(&sid(name))
                .strategy(strategy)
                .distributed(distributed)
                .direct_launch(direct)
                .command(pm.command.clone());
            def.needs = dedup.iter().map(|p| Need::on(p)).collect();
            def.failure_policy = failure_policy;
            def.aggregate = strategy == Strategy::Sharded;
            def.resumable = ty == "global_kd";
            out.push((def, mesh));
        }
    }
    Ok(out)
}

/// Flow and node names become stage ids, work ids, file names and Slurm job names: keep them to
/// a safe alphabet.
fn check_flow_name(file: &str, path: &str, name: &str) -> Result<(), PlanError> {
    if !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
    {
        Ok(())
    } else {
        Err(PlanError::InvalidValue {
            file: file.into(),
            path: path.into(),
            value: format!("{name:?}"),
            expected: "a name of letters, digits, '-' and '_' (at most 128)".into(),
        })
    }
}

const USER_STAGE_KEYS: [&str; 12] = [
    "id",
    "needs",
    "strategy",
    "instances",
    "command",
    "enabled",
    "parallel",
    "distributed",
    "aggregate",
    "resumable",
    "outputs",
    "validate",
];

fn parse_user_stage(file: &str, path: &str, node: &Node) -> Result<StageDef, PlanError> {
    let m = expect_map(file, path, node)?;
    check_keys(file, path, m, &USER_STAGE_KEYS)?;
    let id = match node.get("id") {
        Some(Node::Str(s)) => {
            check_stage_id(file, &join(path, "id"), s)?;
            s.clone()
        }
        Some(other) => return Err(invalid(file, &join(path, "id"), other, "a stage id")),
        None => {
            return Err(PlanError::MissingField {
                file: file.into(),
                path: join(path, "id"),
                expected: "the stage id".into(),
            });
        }
    };
    let mut def = StageDef::new(&id);
    let needs = match node.get("needs") {
        None => Vec::new(),
        Some(Node::Str(s)) => vec![s.clone()],
        Some(n) => expect_str_list(file, &join(path, "needs"), n)?,
    };
    def.needs = needs.iter().map(|p| Need::on(p)).collect();
    if let Some(v) = node.get("strategy").filter(|v| !v.is_null()) {
        def.strategy = Strategy::from_node(file, &join(path, "strategy"), v)?;
    }
    if let Some(v) = node.get("instances").filter(|v| !v.is_null()) {
        def.instances = expect_u32(file, &join(path, "instances"), v, 1)?;
    }
    match node.get("command") {
        None | Some(Node::Null) => {}
        Some(Node::Seq(_)) => {
            def.command = expect_str_list(
                file,
                &join(path, "command"),
                node.get("command").unwrap_or(&Node::Null),
            )?
        }
        Some(other) => {
            return Err(invalid(
                file,
                &join(path, "command"),
                other,
                "a list of arguments (argv), e.g. [python, train.py]; commands never go through a shell",
            ));
        }
    }
    match node.get("enabled") {
        None | Some(Node::Null) => {}
        Some(Node::Bool(true)) => def.enabled = Enablement::Always,
        Some(Node::Bool(false)) => def.enabled = Enablement::Never,
        Some(Node::Str(key)) => {
            def.enabled = Enablement::Key {
                path: key.clone(),
                default: false,
            }
        }
        Some(other) => {
            return Err(invalid(
                file,
                &join(path, "enabled"),
                other,
                "true, false or the dotted key of a boolean",
            ));
        }
    }
    if let Some(v) = node.get("parallel").filter(|v| !v.is_null()) {
        def.mesh = MeshSource::Fixed(super::mesh::ParallelMesh::from_mapping(
            file,
            &join(path, "parallel"),
            v,
        )?);
    }
    if let Some(n) = node.get("outputs").filter(|v| !v.is_null()) {
        let p = join(path, "outputs");
        def.outputs = expect_str_list(file, &p, n)?;
        for (i, o) in def.outputs.iter().enumerate() {
            let rel = std::path::Path::new(o);
            let inside = !o.is_empty()
                && rel.is_relative()
                && rel
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !inside {
                return Err(invalid(
                    file,
                    &format!("{p}[{i}]"),
                    &Node::Str(o.clone()),
                    "a path relative to the unit's output folder, without `..`",
                ));
            }
        }
    }
    if let Some(n) = node.get("validate").filter(|v| !v.is_null()) {
        let p = join(path, "validate");
        match n {
            Node::Seq(_) => def.validate = expect_str_list(file, &p, n)?,
            other => {
                return Err(invalid(
                    file,
                    &p,
                    other,
                    "a list of arguments (argv), e.g. [python, check.py]; commands never go through a shell",
                ));
            }
        }
    }
    for (key, slot) in [
        ("distributed", &mut def.distributed),
        ("aggregate", &mut def.aggregate),
        ("resumable", &mut def.resumable),
    ] {
        match node.get(key) {
            None | Some(Node::Null) => {}
            Some(Node::Bool(b)) => *slot = *b,
            Some(other) => return Err(invalid(file, &join(path, key), other, "true or false")),
        }
    }
    Ok(def)
}

fn check_stage_id(file: &str, path: &str, id: &str) -> Result<(), PlanError> {
    if !id.is_empty()
        && id.len() <= 200
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && !id.starts_with('.')
    {
        Ok(())
    } else {
        Err(PlanError::InvalidValue {
            file: file.into(),
            path: path.into(),
            value: format!("{id:?}"),
            expected: "a stage id of letters, digits, '-', '_' and '.'".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(v: serde_json::Value) -> Node {
        Node::from_json(&v)
    }

    fn ids(stages: &[ResolvedStage]) -> Vec<&str> {
        stages.iter().map(|s| s.id.as_str()).collect()
    }

    #[test]
    fn contraction_through_disabled_stages() {
        let c = cfg(json!({"tokenize_data": {"enabled": false}, "vllm_stats": {"enabled": false}}));
        let r = StageCatalog::puzzle().resolve("x", &c).unwrap();
        assert_eq!(
            ids(&r),
            [
                "convert",
                "width_importance",
                "sort",
                "build_library",
                "replacement_scoring",
                "mip"
            ]
        );
        let mip = r.iter().find(|s| s.id == "mip").unwrap();
        assert_eq!(mip.parents, ["convert", "replacement_scoring"]);
        let bl = r.iter().find(|s| s.id == "build_library").unwrap();
        assert_eq!(bl.parents, ["sort"]);
    }

    #[test]
    fn user_catalog_cycle_and_missing_parent() {
        let c = cfg(json!({"stages": [{"id": "a", "needs": ["b"]}, {"id": "b", "needs": ["a"]}]}));
        let e = StageCatalog::from_config("x", &c)
            .unwrap()
            .resolve("x", &c)
            .unwrap_err();
        match e {
            PlanError::Cycle { cycle } => assert_eq!(cycle.len(), 3),
            other => panic!("{other}"),
        }
        let c = cfg(json!({"stages": [{"id": "prep"}, {"id": "train", "needs": ["prepp"]}]}));
        let e = StageCatalog::from_config("x", &c)
            .unwrap()
            .resolve("x", &c)
            .unwrap_err();
        assert!(e.to_string().contains("did you mean `prep`"), "{e}");
        let c = cfg(json!({"stages": [{"id": "a", "command": "rm -rf /"}]}));
        assert!(StageCatalog::from_config("x", &c).is_err());
    }

    #[test]
    fn post_mip_flow_expansion() {
        let c = cfg(json!({"post_mip": {"flows": {"f": {"nodes": {
            "best_mip": {"type": "filter", "metric": "mip.score"},
            "mat": {"type": "materialize", "input": "best_mip"},
            "ev": {"type": "evaluation", "input": "mat", "config": {"automodel": {"parallel": {"tp": 2}}}},
            "best": {"type": "filter", "input": "ev", "metric": "ev.lm_loss"}
        }}}}}));
        let r = StageCatalog::puzzle().resolve("x", &c).unwrap();
        let post: Vec<&ResolvedStage> = r.iter().filter(|s| s.id.starts_with("post.")).collect();
        assert_eq!(post.len(), 4);
        assert_eq!(post[0].parents, ["mip"]);
        assert_eq!(post[2].mesh.tp, 2);
        assert_eq!(post[2].strategy, Strategy::Sharded);
        let bad = cfg(json!({"post_mip": {"flows": {"f": {"nodes": {"a": {"type": "filtr"}}}}}}));
        assert!(
            StageCatalog::puzzle()
                .resolve("x", &bad)
                .unwrap_err()
                .to_string()
                .contains("did you mean `filter`")
        );
    }
}
