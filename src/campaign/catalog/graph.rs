//! The generic stage graph: stage definitions, their resolution against an experiment config
//! (enable switches, meshes, shard axes), contraction of parents through disabled stages, and a
//! deterministic topological order.

use std::collections::{BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::puzzle::{PostMipExpansion, expand_post_mip};
use crate::campaign::config::Value;
use crate::campaign::execution::{FailurePolicy, Strategy};
use crate::campaign::mesh::{ParallelMesh, normalize_vllm_topology};
use crate::campaign::plan_error::PlanError;
use crate::campaign::schema::{did_you_mean, get_path, invalid};

/// What happens to a dependency edge when the parent stage is disabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum IfDisabled {
    /// Depend on the disabled parent's own (contracted) parents instead.
    Contract,
    /// Drop the edge (an optional input such as `build_library` reading `vllm_stats`).
    Drop,
}

/// One dependency edge.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
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
    /// A vLLM `topology:` mapping, normalized by `normalize_vllm_topology`.
    Vllm(String),
}

/// Stages are sharded over the values of a config list (e.g. one group per embedding width).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
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

/// What a stage's worker runs and what a successful attempt must leave: carried unchanged from
/// the catalog ([`StageDef`]) through resolution ([`ResolvedStage`]) into the compiled plan
/// ([`StagePlan`](crate::campaign::StagePlan)). Flattened into each, so their JSON has these
/// fields at the top level.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StageWorker {
    /// The worker's argv. `{stage_id}`, `{work_id}`, `{shard_index}`, `{shard_count}` and
    /// `{config}` are replaced per work item; nothing is ever passed through a shell.
    pub command: Vec<String>,
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

/// One stage of a catalog.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
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
    /// Optional shard axis.
    pub shard_axis: Option<ShardAxis>,
    /// What the worker runs and what a successful attempt must leave.
    #[serde(flatten)]
    pub worker: StageWorker,
    /// `Some(input stage)`: a manual decision stage (a post-MIP filter node with
    /// `mode: manual`): it submits no job; a person chooses among the work items of the input
    /// stage (see [`ManualDecision`](crate::campaign::ManualDecision)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<String>,
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
            shard_axis: None,
            worker: StageWorker::default(),
            decision: None,
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
        self.worker.command = argv;
        self
    }
}

/// A stage after resolution against a config: enabled, parents contracted, mesh read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
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
    /// Shard groups: `(label, value)` pairs, e.g. `("w2048", "2048")`; empty when unsharded.
    pub shard_groups: Vec<(String, String)>,
    /// Name of the shard axis (for errors), if any.
    pub shard_axis_name: Option<String>,
    /// The catalog stage's worker (see [`StageDef::worker`]).
    #[serde(flatten)]
    pub worker: StageWorker,
    /// `Some(input stage)`: a manual decision stage (see [`StageDef::decision`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<String>,
}

/// A stage graph as data. See the module docs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StageCatalog {
    /// Catalog name (`puzzle`, `config`, or the user's).
    pub name: String,
    /// The stages, in declaration order (the tie-break of the topological order).
    pub stages: Vec<StageDef>,
    /// Post-MIP flow expansion, if the catalog has it.
    pub post_mip: Option<PostMipExpansion>,
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

    /// Why the catalog stage `id` is not in the plan of `config`: the first enable switch that
    /// is off, as `(Some(dotted key), its value or "unset, default false")`, or `(None, why)`
    /// for a stage the catalog itself switches off. `None`: `id` is not a stage of this
    /// catalog, or it is enabled (then it was replaced by post-MIP nodes).
    pub fn why_disabled(&self, config: &Value, id: &str) -> Option<(Option<String>, String)> {
        fn off(config: &Value, e: &Enablement) -> Option<(Option<String>, String)> {
            match e {
                Enablement::Always => None,
                Enablement::Never => Some((None, "the catalog switches it off".into())),
                Enablement::Key { path, default } => match get_path(config, path) {
                    None | Some(Value::Null) if !*default => Some((
                        Some(path.clone()),
                        format!("`{path}` is not set and defaults to false"),
                    )),
                    Some(Value::Bool(false)) => {
                        Some((Some(path.clone()), format!("`{path}` is false")))
                    }
                    _ => None,
                },
                Enablement::All(items) => items.iter().find_map(|i| off(config, i)),
            }
        }
        let d = self.stages.iter().find(|d| d.id == id)?;
        off(config, &d.enabled)
    }

    /// (catalog order breaks ties), parents contracted through disabled stages, meshes read.
    ///
    /// # Errors
    /// [`PlanError::DuplicateStage`], [`PlanError::MissingParent`] (with a suggestion),
    /// [`PlanError::Cycle`] (listing it), and mesh/flow errors naming their key path.
    pub fn resolve(&self, file: &str, config: &Value) -> Result<Vec<ResolvedStage>, PlanError> {
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
                shard_groups,
                shard_axis_name,
                worker: d.worker.clone(),
                decision: d.decision.clone(),
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

fn is_enabled(file: &str, config: &Value, e: &Enablement) -> Result<bool, PlanError> {
    match e {
        Enablement::Always => Ok(true),
        Enablement::Never => Ok(false),
        Enablement::Key { path, default } => match get_path(config, path) {
            None | Some(Value::Null) => Ok(*default),
            Some(Value::Bool(b)) => Ok(*b),
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
    config: &Value,
    source: &MeshSource,
    stage: &str,
) -> Result<ParallelMesh, PlanError> {
    let mesh = match source {
        MeshSource::Single => ParallelMesh::SINGLE,
        MeshSource::Fixed(m) => *m,
        MeshSource::AutoModel(paths) => {
            match paths
                .iter()
                .find_map(|p| get_path(config, p).filter(|n| !n.is_null()).map(|n| (p, n)))
            {
                Some((p, n)) => ParallelMesh::from_mapping(file, p, n)?,
                None => ParallelMesh::SINGLE,
            }
        }
        MeshSource::Vllm(path) => match get_path(config, path) {
            None | Some(Value::Null) => ParallelMesh::SINGLE,
            Some(n) => normalize_vllm_topology(file, path, n)?.mesh(),
        },
    };
    mesh.validate(stage)?;
    Ok(mesh)
}

fn read_shard_groups(
    file: &str,
    config: &Value,
    axis: &ShardAxis,
) -> Result<Vec<(String, String)>, PlanError> {
    if let Some(k) = &axis.enabled_key {
        match get_path(config, k) {
            Some(Value::Bool(true)) => {}
            None | Some(Value::Null) | Some(Value::Bool(false)) => return Ok(Vec::new()),
            Some(other) => return Err(invalid(file, k, other, "true or false")),
        }
    }
    let items = match get_path(config, &axis.values_key) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::List(items)) => items,
        Some(other) => return Err(invalid(file, &axis.values_key, other, "a list")),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let text = match v {
                Value::Int(x) => x.to_string(),
                Value::String(s) => s.clone(),
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
