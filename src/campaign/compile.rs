//! `compile_campaign_plan`: experiment config + runner + execution + overrides -> [`CampaignPlan`].
//!
//! Pure and deterministic: the same inputs give the same plan, byte for byte, and the same
//! [`contract_hash`]. No clock, no randomness, no filesystem access other than reading the
//! config files.
//!
//! ```
//! use puzzletron::campaign::config::Value;
//! use puzzletron::campaign::{
//!     ExecutionConfig, RunnerEnvironment, StageCatalog, StageFilter, compile_resolved,
//! };
//!
//! // A user catalog in the config itself (a Puzzletron experiment uses the built-in one).
//! let config = Value::from_json(&serde_json::json!({"stages": [
//!     {"id": "prep", "command": ["python", "prep.py"]},
//!     {"id": "train", "needs": ["prep"], "strategy": "sharded", "instances": 4,
//!      "parallel": {"tp": 2}, "distributed": true,
//!      "command": ["python", "train.py", "--shard", "{shard_index}/{shard_count}"]},
//! ]}));
//! let catalog = StageCatalog::from_config("exp.yaml", &config)?;
//! let runner = RunnerEnvironment::local();
//! let plan = compile_resolved("exp.yaml", config.clone(), &[], &catalog, &runner,
//!                             &ExecutionConfig::default(), None)?;
//! assert_eq!(plan.stage_ids(), ["prep", "train"]);
//! let train = plan.stage("train").unwrap();
//! assert_eq!(train.work.items.len(), 4);
//! assert_eq!(train.spec.allocation.total_gpus, 8); // 4 shards x tp=2, on one 8-GPU node
//!
//! // Running `train` alone needs `prep` to be complete.
//! let only_train = StageFilter::only(["train"]);
//! assert!(compile_resolved("exp.yaml", config.clone(), &[], &catalog, &runner,
//!                          &ExecutionConfig::default(), Some(&only_train)).is_err());
//! let done = StageFilter::only(["train"]).with_completed(["prep"]);
//! let again = compile_resolved("exp.yaml", config, &[], &catalog, &runner,
//!                              &ExecutionConfig::default(), Some(&done))?;
//! assert_eq!(again.contract_hash, plan.contract_hash);
//! # Ok::<(), puzzletron::campaign::PlanError>(())
//! ```

use std::collections::HashSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::catalog::{ResolvedStage, StageCatalog};
use super::config::{ConfigLoader, Env, Override, Value};
use super::execution::{
    ExecutionConfig, ExecutionDefaults, Resource, StageExecutionSpec, Strategy,
};
use super::mesh::{GpuAllocation, InstancePlacement, pack_gpu_allocation};
use super::plan::{CampaignPlan, ManualDecision, StagePlan};
use super::plan_error::PlanError;
use super::runner::{RunnerEnvironment, RunnerKind};
use super::schema::{did_you_mean, get, get_path, write_canonical};
use super::work::{MasterAddr, Rendezvous, RendezvousAllocator, WorkPlanInput, build_work_plan};
use crate::identity::{Hash, Hasher};

/// Restricts a plan to some stages, e.g. to re-run `mip` after its inputs are done.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StageFilter {
    /// Stages to run.
    pub stages: Vec<String>,
    /// Stages outside `stages` whose results are complete (e.g. from the campaign journal).
    /// Every parent of a selected stage must be selected or listed here.
    pub completed: Vec<String>,
}

impl StageFilter {
    /// A filter selecting `stages`, none completed.
    pub fn only<I, S>(stages: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        StageFilter {
            stages: stages.into_iter().map(Into::into).collect(),
            completed: Vec::new(),
        }
    }

    /// Declares `stages` complete.
    pub fn with_completed<I, S>(mut self, stages: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.completed.extend(stages.into_iter().map(Into::into));
        self
    }
}

/// Compiles a campaign from an experiment config file.
///
/// The file is loaded with Hydra-style composition (its `defaults` list, relative to the
/// nearest ancestor folder holding `base.yaml`), then `overrides` (Hydra grammar: `a.b=1`,
/// `+a.c=2`, `~a.d`) are applied, then `${...}` interpolations resolve (`oc.env` reads the
/// process environment; use [`compile_campaign_plan_with`] to inject one). The stage catalog
/// is the config's own `stages:` list if present, else [`StageCatalog::puzzle`].
///
/// # Errors
/// [`PlanError::Config`] for loading/composition/override/interpolation errors, and every
/// error of [`compile_resolved`].
pub fn compile_campaign_plan(
    experiment_config_path: impl AsRef<Path>,
    runner: &RunnerEnvironment,
    execution: &ExecutionConfig,
    overrides: &[Override],
    stage_filter: Option<&StageFilter>,
) -> Result<CampaignPlan, PlanError> {
    let loader = ConfigLoader::new().env(Env::from_process());
    compile_campaign_plan_with(
        &loader,
        experiment_config_path,
        runner,
        execution,
        overrides,
        stage_filter,
    )
}

/// [`compile_campaign_plan`] with an explicit [`ConfigLoader`] (environment, resolvers, config
/// root), so compilation does not read the process environment.
///
/// # Errors
/// As [`compile_campaign_plan`].
pub fn compile_campaign_plan_with(
    loader: &ConfigLoader,
    experiment_config_path: impl AsRef<Path>,
    runner: &RunnerEnvironment,
    execution: &ExecutionConfig,
    overrides: &[Override],
    stage_filter: Option<&StageFilter>,
) -> Result<CampaignPlan, PlanError> {
    let path = experiment_config_path.as_ref();
    // The composed tree before the overrides, kept from the one composition for the type
    // check of unchecked overrides below.
    let (loaded, before) = loader.load_experiment_and_base(path, overrides, true)?;
    let (config, origins) = loaded.into_parts();
    let label = path.display().to_string();
    let locate = |e: PlanError| e.locate(&label, &origins);
    let catalog = StageCatalog::from_config(&label, &config).map_err(locate)?;
    let mut plan = compile_resolved(
        &label,
        config,
        overrides,
        &catalog,
        runner,
        execution,
        stage_filter,
    )
    .map_err(locate)?;
    if !plan.unchecked_overrides.is_empty() {
        // Say when an unchecked override changes a value's type (`seed=abc` over an int):
        // legal for the workers to decide, but worth a look in the dry run.
        if let Some(before) = &before {
            for (text, o) in plan.unchecked_overrides.iter_mut().zip(
                overrides
                    .iter()
                    .filter(|o| !reads(&catalog, &o.key.to_string())),
            ) {
                let old = before.get_path(&o.key);
                let new = o.value.as_ref();
                if let (Some(old), Some(new)) = (old, new)
                    && old.kind() != new.kind()
                    && !old.is_null()
                    && !matches!(
                        (old, new),
                        (Value::Int(_), Value::Float(_)) | (Value::Float(_), Value::Int(_))
                    )
                {
                    text.push_str(&format!(" (was {}, now {})", old.kind(), new.kind()));
                }
            }
        }
    }
    Ok(plan)
}

/// Whether the compiler reads `key` (dotted): it is, contains or lies inside a key of
/// [`StageCatalog::read_keys`], or one the compiler itself reads (`puzzle_dir`, `stages`,
/// `execution.gpus_per_node`).
fn reads(catalog: &StageCatalog, key: &str) -> bool {
    let within = |outer: &str, inner: &str| {
        inner == outer
            || inner
                .strip_prefix(outer)
                .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
    };
    catalog
        .read_keys()
        .iter()
        .map(String::as_str)
        .chain(COMPILER_KEYS)
        .any(|r| within(r, key) || within(key, r))
}

/// Whether a path has a `..` after a named folder (`runs/../../x`): it then is not the folder
/// it reads as. Leading `..`s (`../runs/x`, as the reference MoE experiment's default
/// `puzzle_dir`) name a root beside the working folder and are kept.
pub(crate) fn climbs_back(path: &str) -> bool {
    let mut named = false;
    for c in Path::new(path).components() {
        match c {
            std::path::Component::ParentDir if named => return true,
            std::path::Component::Normal(_) => named = true,
            _ => {}
        }
    }
    false
}

/// Keys the compiler reads besides the catalog's.
const COMPILER_KEYS: [&str; 3] = ["puzzle_dir", "stages", "execution.gpus_per_node"];

fn check_recognised(label: &str, config: &Value, catalog: &StageCatalog) -> Result<(), PlanError> {
    let read = catalog.read_keys();
    if read.is_empty() {
        // A catalog built in code that reads no config key needs none.
        return Ok(());
    }
    let mut roots: Vec<&str> = read
        .iter()
        .map(String::as_str)
        .chain(COMPILER_KEYS)
        .map(|k| k.split(['.', '[']).next().unwrap_or(k))
        .collect();
    let mut seen = HashSet::new();
    roots.retain(|r| seen.insert(*r));
    let present: Vec<String> = config
        .as_mapping()
        .map(|m| m.iter().map(|(k, _)| k.clone()).collect())
        .unwrap_or_default();
    if present.iter().any(|k| roots.contains(&k.as_str())) {
        return Ok(());
    }
    Err(PlanError::NothingToCompile {
        file: label.to_string(),
        catalog: catalog.name.clone(),
        found: present,
        expected: roots.iter().map(|r| r.to_string()).collect(),
    })
}

/// Compiles a campaign from an already loaded and resolved experiment config.
///
/// `label` names the experiment in the plan and in errors; `overrides` are recorded in the plan
/// as given (they must already be applied to `config`).
///
/// Steps: resolve the catalog (enabled stages, contracted parents, meshes); check every
/// `execution.stages` id is a stage of the catalog (or one it knows of); per stage merge
/// catalog defaults, execution defaults and the stage's execution settings into a
/// [`StageExecutionSpec`] and pack its GPUs; check runner limits (`max_nodes`,
/// `interactive_max_nodes`, bare-metal inventory); compute the [`contract_hash`]; build each
/// [`WorkPlan`](super::work::WorkPlan); apply the stage filter.
///
/// # Errors
/// Every [`PlanError`] variant about the graph (cycle, missing parent), stages
/// ([`PlanError::UnknownStage`] with a suggestion), meshes, packing, runner limits, work plans,
/// and [`PlanError::StageFilterIncomplete`].
pub fn compile_resolved(
    label: &str,
    config: Value,
    overrides: &[Override],
    catalog: &StageCatalog,
    runner: &RunnerEnvironment,
    execution: &ExecutionConfig,
    stage_filter: Option<&StageFilter>,
) -> Result<CampaignPlan, PlanError> {
    check_recognised(label, &config, catalog)?;
    let unchecked_keys =
        super::keys::check_experiment_keys(label, &config, catalog, &COMPILER_KEYS)?;
    let resolved = catalog.resolve(label, &config)?;
    check_execution_stage_ids(label, &config, catalog, execution, &resolved)?;

    let mut defaults = execution.defaults.clone();
    if !execution.gpus_per_node_given {
        defaults.gpus_per_node = default_gpus_per_node(label, &config, runner)?;
    }

    let mut specs: Vec<StageExecutionSpec> = Vec::with_capacity(resolved.len());
    let mut total_instances: u64 = 0;
    for stage in &resolved {
        let spec = stage_spec(stage, execution, &defaults)?;
        check_expressible(runner, execution, &stage.id, &spec)?;
        total_instances += u64::from(spec.instances);
        if total_instances > MAX_WORK_ITEMS_PER_PLAN {
            return Err(PlanError::WorkPlan {
                stage: stage.id.clone(),
                reason: format!(
                    "the plan would have more than {MAX_WORK_ITEMS_PER_PLAN} work items"
                ),
            });
        }
        specs.push(spec);
    }
    let hash = contract_hash(&config, runner, &resolved, &specs);

    let mut rdzv = PlanRendezvous::new(runner, &hash);
    let mut stages = Vec::with_capacity(resolved.len());
    for (stage, spec) in resolved.iter().zip(specs) {
        let work = build_work_plan(
            &WorkPlanInput {
                stage_id: &stage.id,
                strategy: spec.strategy,
                instances: spec.instances,
                shard_groups: &stage.shard_groups,
                shard_axis_name: stage.shard_axis_name.as_deref(),
                aggregate: stage.aggregate,
                distributed: spec.distributed,
                direct_launch: stage.direct_launch,
                allocation: &spec.allocation,
            },
            &mut rdzv,
        )?;
        stages.push(StagePlan {
            stage_id: stage.id.clone(),
            parents: stage.parents.clone(),
            spec,
            work,
            worker: stage.worker.clone(),
            decision: stage.decision.as_ref().map(|input| ManualDecision {
                input: input.clone(),
                candidates: stages
                    .iter()
                    .find(|s: &&StagePlan| s.stage_id == *input)
                    .map(|s| s.work.items.iter().map(|i| i.work_id.clone()).collect())
                    .unwrap_or_default(),
            }),
        });
    }
    let (stages, completed) = match stage_filter {
        None => (stages, Vec::new()),
        Some(f) => {
            // A catalog stage the experiment disables is not a typo: say which switch is off.
            for id in f.stages.iter().chain(&f.completed) {
                if stages.iter().any(|s| &s.stage_id == id) {
                    continue;
                }
                if let Some((key, reason)) = catalog.why_disabled(&config, id) {
                    let hint = match &key {
                        Some(k) => format!(
                            "enable it with the override `-o {k}=true` (or set `{k}: true` in the experiment)"
                        ),
                        None => "this catalog never runs it".to_string(),
                    };
                    return Err(PlanError::DisabledStage {
                        file: label.to_string(),
                        stage: id.clone(),
                        key,
                        detail: format!("{reason}; {hint}"),
                    });
                }
            }
            apply_filter(stages, f)?
        }
    };
    // Capacity is checked after every stage's shape, so shape errors (which say how to fix the
    // config) come first, and only for the stages that will run.
    for stage in &stages {
        check_limits(runner, stage)?;
    }
    let puzzle_dir = match get(&config, "puzzle_dir") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !climbs_back(s) && !s.is_empty() => Some(s.clone()),
        Some(other) => {
            return Err(super::schema::invalid(
                label,
                "puzzle_dir",
                other,
                "a folder path without `..` after a folder name (the root of the campaign's \
                 outputs, written as it is: `../runs/x` is fine, `runs/../../x` is not)",
            ));
        }
    };
    Ok(CampaignPlan {
        experiment_config_path: label.to_string(),
        puzzle_dir,
        contract_hash: hash,
        overrides: overrides.to_vec(),
        unchecked_overrides: overrides
            .iter()
            .filter(|o| !reads(catalog, &o.key.to_string()))
            .map(ToString::to_string)
            .collect(),
        unchecked_keys,
        runner: runner.clone(),
        execution_defaults: defaults,
        catalog: catalog.name.clone(),
        stages,
        stage_filter: stage_filter.map(|f| f.stages.clone()),
        completed_stages: completed,
        resolved_config: config,
    })
}

/// Stage ids that newer Puzzletron versions know but the Puzzle catalog here does not run
/// (`final_report` is added by the newest upstream compiler); execution entries for them are
/// accepted and ignored instead of being reported as typos.
pub(super) const PUZZLE_KNOWN_EXTERNAL_STAGES: [&str; 1] = ["final_report"];

fn check_execution_stage_ids(
    label: &str,
    config: &Value,
    catalog: &StageCatalog,
    execution: &ExecutionConfig,
    resolved: &[ResolvedStage],
) -> Result<(), PlanError> {
    if execution.stages.is_empty() {
        return Ok(());
    }
    let mut known: HashSet<String> = catalog.stages.iter().map(|s| s.id.clone()).collect();
    known.extend(resolved.iter().map(|s| s.id.clone()));
    if catalog.post_mip.is_some() {
        known.extend(PUZZLE_KNOWN_EXTERNAL_STAGES.iter().map(|s| s.to_string()));
        // Post nodes of flows that exist but whose stages are not in the plan (none today) are
        // still valid names: collect every `post.<flow>.<node>` of the config.
        if let Some(Value::Mapping(flows)) = get_path(config, "post_mip.flows") {
            for (flow, f) in flows {
                if let Some(Value::Mapping(nodes)) = get(f, "nodes") {
                    known.extend(nodes.iter().map(|(n, _)| format!("post.{flow}.{n}")));
                }
            }
        }
    }
    for (id, _) in &execution.stages {
        if !known.contains(id) {
            let mut valid: Vec<String> = known.iter().cloned().collect();
            valid.sort();
            // The id is at fault in the execution file: name it (and the line), not the
            // experiment.
            let at = execution
                .origin_of_stage(id)
                .map(|o| format!("{o}: "))
                .unwrap_or_default();
            return Err(PlanError::UnknownStage {
                context: format!("{at}execution.stages (for experiment {label})"),
                stage: id.clone(),
                suggestion: did_you_mean(id, valid.iter().map(String::as_str)),
                valid,
            });
        }
    }
    Ok(())
}

/// `execution.defaults.gpus_per_node`, else the experiment's `execution.gpus_per_node`, else
/// the runner's (bare metal: the smallest host; local: `runner.local.gpus`), else 8.
fn default_gpus_per_node(
    label: &str,
    config: &Value,
    runner: &RunnerEnvironment,
) -> Result<u32, PlanError> {
    if let Some(n) = get_path(config, "execution.gpus_per_node").filter(|n| !n.is_null()) {
        return super::schema::expect_u32(label, "execution.gpus_per_node", n, 1);
    }
    let from_runner = match runner.kind {
        RunnerKind::Baremetal => runner
            .inventory
            .as_ref()
            .and_then(|i| i.hosts.iter().map(|h| h.gpus).filter(|&g| g > 0).min()),
        RunnerKind::Local => runner.local.as_ref().and_then(|l| l.gpus),
        RunnerKind::Ray => runner.ray.as_ref().and_then(|r| r.gpus_per_node),
        RunnerKind::Slurm => None,
    };
    Ok(from_runner.unwrap_or(8))
}

/// Most instances one stage may have (2^20).
pub(super) const MAX_INSTANCES_PER_STAGE: u32 = 1 << 20;
/// Most work items one plan may have (2^22).
pub(super) const MAX_WORK_ITEMS_PER_PLAN: u64 = 1 << 22;

/// Refuses an execution value the runner's executor cannot express (never dropped in silence):
/// a partition on a runner without a scheduler (local, bare metal).
fn check_expressible(
    runner: &RunnerEnvironment,
    execution: &ExecutionConfig,
    stage: &str,
    spec: &StageExecutionSpec,
) -> Result<(), PlanError> {
    if runner.kind != RunnerKind::Slurm
        && let Some(p) = &spec.partition
    {
        return Err(PlanError::InvalidValue {
            file: execution
                .origin_of_stage(stage)
                .unwrap_or("<execution>")
                .to_string(),
            path: format!("execution.stages.{stage}.partition"),
            value: format!("{p:?}"),
            expected: format!(
                "no partition with a {} runner: its executor has no scheduler (a stage there \
                 takes strategy, instances, parallel, gpus_per_node, resource, time_limit, \
                 policies); partitions are for a slurm runner",
                runner.kind.as_str()
            ),
        });
    }
    Ok(())
}

fn stage_spec(
    stage: &ResolvedStage,
    execution: &ExecutionConfig,
    defaults: &ExecutionDefaults,
) -> Result<StageExecutionSpec, PlanError> {
    let mut ov = execution.stage(&stage.id).cloned().unwrap_or_default();
    if stage.decision.is_some() {
        // A manual decision runs no job: one item, no GPU, whatever the execution file says.
        ov.strategy = Some(Strategy::Single);
        ov.instances = Some(1);
        ov.resource = Some(Resource::Cpu);
    }
    let strategy = ov.strategy.unwrap_or(stage.strategy);
    let instances = ov.instances.unwrap_or(if strategy == Strategy::Single {
        1
    } else {
        stage.instances
    });
    if instances > MAX_INSTANCES_PER_STAGE {
        return Err(PlanError::WorkPlan {
            stage: stage.id.clone(),
            reason: format!(
                "instances={instances} is more than the {MAX_INSTANCES_PER_STAGE} supported per stage"
            ),
        });
    }
    let mesh = ov.parallel.apply(stage.mesh);
    mesh.validate(&format!("stage `{}`", stage.id))?;
    let resource = ov.resource.unwrap_or(Resource::Gpu);
    let gpus_per_node = ov.gpus_per_node.unwrap_or(defaults.gpus_per_node);
    let allocation = match resource {
        Resource::Cpu => GpuAllocation::cpu_only(instances),
        Resource::Gpu => {
            let gpi = u32::try_from(mesh.world_size()).map_err(|_| PlanError::BadMesh {
                context: format!("stage `{}`", stage.id),
                mesh: mesh.to_string(),
                reason: "more than 2^32 GPUs per instance".into(),
            })?;
            pack_gpu_allocation(
                &format!("stage `{}`", stage.id),
                instances,
                gpi,
                gpus_per_node,
            )?
        }
    };
    Ok(StageExecutionSpec {
        strategy,
        instances,
        failure_policy: ov
            .failure_policy
            .or(stage.failure_policy)
            .unwrap_or(defaults.failure_policy),
        max_attempts: ov.max_attempts.unwrap_or(defaults.max_attempts),
        mesh,
        allocation,
        partition: ov.partition.clone(),
        resource,
        distributed: stage.distributed,
        time_limit: ov.time_limit.clone(),
        heartbeat_timeout_s: ov.heartbeat_timeout_s,
        warning_signal: ov.warning_signal.clone(),
    })
}

/// Why `stage` takes the nodes it does, and how to make it fit under `limit_name`.
fn too_many_nodes_advice(
    runner: &RunnerEnvironment,
    stage: &StagePlan,
    limit_name: &str,
) -> (String, String) {
    let a = &stage.spec.allocation;
    let m = &stage.spec.mesh;
    let axes: Vec<String> = [
        ("tp", m.tp),
        ("cp", m.cp),
        ("pp", m.pp),
        ("ep", m.ep),
        ("dp_shard", m.dp_shard),
        ("dp_replicate", m.dp_replicate),
    ]
    .iter()
    .filter(|(_, v)| *v > 1)
    .map(|(k, v)| format!("{k}={v}"))
    .collect();
    let mesh = if axes.is_empty() {
        String::new()
    } else {
        format!(" (mesh {})", axes.join(", "))
    };
    let why = if a.nodes_per_instance > 1 {
        format!(
            "one instance needs {} GPU(s){mesh} but gpus_per_node is {}, so each of its {} instance(s) spans {} node(s)",
            a.gpus_per_instance, a.gpus_per_node, a.instances, a.nodes_per_instance
        )
    } else {
        format!(
            "{} instance(s) of {} GPU(s){mesh} at gpus_per_node={} ({} instance(s) per node) take {} node(s)",
            a.instances, a.gpus_per_instance, a.gpus_per_node, a.instances_per_node, a.nodes
        )
    };
    let id = &stage.stage_id;
    let gpn = format!(
        "raise gpus_per_node (`execution.defaults.gpus_per_node` or `execution.stages.{id}.gpus_per_node`) if the nodes have more GPUs"
    );
    let shrink = if a.nodes_per_instance > 1 {
        "or shrink the stage's mesh (e.g. a lower tp)"
    } else {
        "or lower the stage's instances (`execution.stages.{id}.instances`) or its mesh"
    };
    let shrink = shrink.replace("{id}", id);
    let fix = match runner.kind {
        RunnerKind::Slurm => format!(
            "raise `{limit_name}` to {} in the runner file, {gpn}, {shrink}",
            a.nodes
        ),
        RunnerKind::Baremetal => {
            format!("add hosts to `runner.inventory.hosts`, {gpn}, {shrink}")
        }
        RunnerKind::Local => format!(
            "a local runner has one machine: {gpn} (`runner.local.gpus`), {shrink}, or use a Slurm runner"
        ),
        RunnerKind::Ray => format!(
            "a ray runner runs each instance as one Ray job on one node: {gpn} \
             (`runner.ray.gpus_per_node`), {shrink}, or use a Slurm or baremetal runner for \
             multi-node instances"
        ),
    };
    (why, fix)
}

fn check_limits(runner: &RunnerEnvironment, stage: &StagePlan) -> Result<(), PlanError> {
    let nodes = stage.spec.allocation.nodes;
    let too_many = |limit_name: &str, limit: u64| {
        let (why, fix) = too_many_nodes_advice(runner, stage, limit_name);
        PlanError::TooManyNodes {
            stage: stage.stage_id.clone(),
            nodes: u64::from(nodes),
            limit_name: limit_name.to_string(),
            limit,
            limit_at: None,
            detail: format!("{why}; {fix}"),
        }
    };
    match runner.kind {
        RunnerKind::Slurm => {
            let Some(s) = &runner.slurm else {
                return Ok(());
            };
            if let Some(max) = s.max_nodes
                && nodes > max
            {
                return Err(too_many("runner.slurm.max_nodes", u64::from(max)));
            }
            if let Some(max) = s.interactive_max_nodes {
                let p = stage.spec.partition.as_deref();
                let interactive = p == Some("interactive")
                    || (p.is_some()
                        && s.partition_interactive
                            .as_ref()
                            .is_some_and(|pi| pi.to_slurm() == s.resolve_partition(p).to_slurm()));
                if interactive && nodes > max {
                    return Err(too_many(
                        "runner.slurm.interactive_max_nodes",
                        u64::from(max),
                    ));
                }
            }
        }
        RunnerKind::Baremetal => {
            // Allocation node i runs on inventory host i (inventory order).
            let Some(inv) = &runner.inventory else {
                return Ok(());
            };
            if nodes as usize > inv.hosts.len() {
                return Err(too_many(
                    "the number of hosts in runner.inventory.hosts",
                    inv.hosts.len() as u64,
                ));
            }
            let alloc = &stage.spec.allocation;
            for (i, host) in inv.hosts.iter().take(nodes as usize).enumerate() {
                let need = alloc.gpus_on_node(i as u32);
                if need > host.gpus {
                    return Err(PlanError::Packing {
                        context: format!("stage `{}`", stage.stage_id),
                        instances: u64::from(alloc.instances),
                        gpus_per_instance: u64::from(alloc.gpus_per_instance),
                        gpus_per_node: u64::from(alloc.gpus_per_node),
                        reason: format!(
                            "node {i} needs {need} GPU(s) but inventory host `{}` has {}",
                            host.hostname, host.gpus
                        ),
                    });
                }
            }
        }
        RunnerKind::Ray => {
            // One job per instance, each on one node (single-node torchrun at most).
            let a = &stage.spec.allocation;
            if a.nodes_per_instance > 1 {
                return Err(too_many("the nodes of one instance on a ray runner", 1));
            }
        }
        RunnerKind::Local => {
            if nodes > 1 {
                return Err(too_many("the node count of a local runner", 1));
            }
            if let Some(g) = runner.local.as_ref().and_then(|l| l.gpus)
                && stage.spec.allocation.max_gpus_on_a_node() > g
            {
                {
                    return Err(PlanError::Packing {
                        context: format!("stage `{}`", stage.stage_id),
                        instances: u64::from(stage.spec.instances),
                        gpus_per_instance: u64::from(stage.spec.allocation.gpus_per_instance),
                        gpus_per_node: u64::from(g),
                        reason: format!("runner.local.gpus is {g}"),
                    });
                }
            }
        }
    }
    Ok(())
}

fn apply_filter(
    stages: Vec<StagePlan>,
    f: &StageFilter,
) -> Result<(Vec<StagePlan>, Vec<String>), PlanError> {
    let ids: Vec<String> = stages.iter().map(|s| s.stage_id.clone()).collect();
    let unknown = |context: &str, id: &String| PlanError::UnknownStage {
        context: context.to_string(),
        stage: id.clone(),
        suggestion: did_you_mean(id, ids.iter().map(String::as_str)),
        valid: ids.clone(),
    };
    if f.stages.is_empty() {
        return Err(PlanError::UnknownStage {
            context: "stage filter".into(),
            stage: String::new(),
            suggestion: None,
            valid: ids.clone(),
        });
    }
    for id in &f.stages {
        if !ids.contains(id) {
            return Err(unknown("stage filter", id));
        }
    }
    for id in &f.completed {
        if !ids.contains(id) {
            return Err(unknown("stage filter (completed stages)", id));
        }
    }
    let selected: HashSet<&str> = f.stages.iter().map(String::as_str).collect();
    let completed: HashSet<&str> = f.completed.iter().map(String::as_str).collect();
    for s in &stages {
        if !selected.contains(s.stage_id.as_str()) {
            continue;
        }
        for p in &s.parents {
            if !selected.contains(p.as_str()) && !completed.contains(p.as_str()) {
                return Err(PlanError::StageFilterIncomplete {
                    stage: s.stage_id.clone(),
                    parent: p.clone(),
                });
            }
        }
    }
    let completed_list: Vec<String> = ids
        .iter()
        .filter(|id| completed.contains(id.as_str()))
        .cloned()
        .collect();
    let kept = stages
        .into_iter()
        .filter(|s| selected.contains(s.stage_id.as_str()))
        .collect();
    Ok((kept, completed_list))
}

/// The campaign's contract hash: SHA-256 (via [`Hasher`], domain
/// `puzzletron/campaign-contract/v1`) over everything that changes results:
///
/// 1. the resolved experiment config as canonical JSON (keys sorted, numbers in shortest form),
///    so YAML key order, formatting, anchors and comments do not matter;
/// 2. the runner's [`ExecutionContract`](crate::executor::ExecutionContract) (repository, venv,
///    container, mounts, setup and pre/post commands);
/// 3. per stage, sorted by id: parents (sorted), strategy, instances, mesh and resource (a
///    different mesh or sharding can change numerics).
///
/// Not included, because they do not change results: partitions, node packing, failure and
/// halt policies, attempt limits, time limits, heartbeat timeouts, account, log folders, the
/// stage filter.
pub fn contract_hash(
    config: &Value,
    runner: &RunnerEnvironment,
    stages: &[ResolvedStage],
    specs: &[StageExecutionSpec],
) -> Hash {
    let mut canonical = String::new();
    write_canonical(config, &mut canonical);
    let mut h = Hasher::new("puzzletron/campaign-contract/v1");
    h.field(canonical.as_bytes());
    h.field(runner.execution_contract.hash().to_hex().as_bytes());
    let mut order: Vec<usize> = (0..stages.len()).collect();
    order.sort_by(|&a, &b| stages[a].id.cmp(&stages[b].id));
    h.field(&(order.len() as u64).to_le_bytes());
    for i in order {
        let (s, spec) = (&stages[i], &specs[i]);
        h.field(s.id.as_bytes());
        let mut parents: Vec<&str> = s.parents.iter().map(String::as_str).collect();
        parents.sort_unstable();
        h.field(parents.join("\n").as_bytes());
        h.field(spec.strategy.as_str().as_bytes());
        h.field(&spec.instances.to_le_bytes());
        for (_, v) in spec.mesh.fields() {
            h.field(&v.to_le_bytes());
        }
        h.field(spec.resource.as_str().as_bytes());
    }
    h.finish()
}

/// Most reasons [`contract_changes`] lists (then `… and N more`).
const MAX_CONTRACT_REASONS: usize = 20;

/// Why `new`'s contract hash differs from `old`'s, one reason per changed input of
/// [`contract_hash`], naming it (N10): `config changed: stages[0].command[2] ("hello" ->
/// "hola")`, `environment changed: runner.execution_contract.prerun_commands[0] ("module load
/// cuda/12.4" -> "module load cuda/12.6")`, `stage mip: instances changed (4 -> 8)`, `stage x
/// added`. Empty when the hashes agree. What the hash leaves out (time limits, warning
/// signals, partitions, packing, attempt limits) is never a reason.
pub fn contract_changes(old: &CampaignPlan, new: &CampaignPlan) -> Vec<String> {
    let mut out = Vec::new();
    diff_nodes("", &old.resolved_config, &new.resolved_config, &mut out);
    let (a, b) = (
        &old.runner.execution_contract,
        &new.runner.execution_contract,
    );
    let env = "environment changed: runner.execution_contract";
    for (field, x, y) in [
        ("repository", &a.repository, &b.repository),
        ("venv", &a.venv, &b.venv),
        ("container", &a.container, &b.container),
        ("container_mounts", &a.container_mounts, &b.container_mounts),
        ("setup_env", &a.setup_env, &b.setup_env),
    ] {
        if x != y {
            out.push(format!(
                "{env}.{field} ({} -> {})",
                show_opt(x),
                show_opt(y)
            ));
        }
    }
    for (field, x, y) in [
        ("prerun_commands", &a.prerun_commands, &b.prerun_commands),
        ("postrun_commands", &a.postrun_commands, &b.postrun_commands),
    ] {
        for i in 0..x.len().max(y.len()) {
            let (p, q) = (x.get(i), y.get(i));
            if p != q {
                out.push(format!(
                    "{env}.{field}[{i}] ({} -> {})",
                    show_opt(&p.cloned()),
                    show_opt(&q.cloned())
                ));
            }
        }
    }
    let ids = |p: &CampaignPlan| -> std::collections::BTreeMap<String, usize> {
        p.stages
            .iter()
            .enumerate()
            .map(|(i, s)| (s.stage_id.clone(), i))
            .collect()
    };
    let (oi, ni) = (ids(old), ids(new));
    for (id, &i) in &oi {
        let Some(&j) = ni.get(id) else {
            out.push(format!("stage {id} removed"));
            continue;
        };
        let (s, t) = (&old.stages[i], &new.stages[j]);
        let mut pa = s.parents.clone();
        let mut pb = t.parents.clone();
        pa.sort_unstable();
        pb.sort_unstable();
        for (what, x, y) in [
            ("parents", pa.join(","), pb.join(",")),
            (
                "strategy",
                s.spec.strategy.as_str().to_string(),
                t.spec.strategy.as_str().to_string(),
            ),
            (
                "instances",
                s.spec.instances.to_string(),
                t.spec.instances.to_string(),
            ),
            ("mesh", s.spec.mesh.to_string(), t.spec.mesh.to_string()),
            (
                "resource",
                s.spec.resource.as_str().to_string(),
                t.spec.resource.as_str().to_string(),
            ),
        ] {
            if x != y {
                out.push(format!("stage {id}: {what} changed ({x} -> {y})"));
            }
        }
    }
    out.extend(
        ni.keys()
            .filter(|id| !oi.contains_key(*id))
            .map(|id| format!("stage {id} added")),
    );
    if out.len() > MAX_CONTRACT_REASONS {
        let more = out.len() - MAX_CONTRACT_REASONS;
        out.truncate(MAX_CONTRACT_REASONS);
        out.push(format!("… and {more} more"));
    }
    out
}

fn show_opt(v: &Option<String>) -> String {
    v.as_ref()
        .map_or_else(|| "none".to_string(), |s| show_text(s))
}

/// A value for a reason: quoted, cut to 80 characters.
fn show_text(s: &str) -> String {
    if s.chars().count() > 80 {
        format!(
            "{:?}",
            format!("{}…", s.chars().take(80).collect::<String>())
        )
    } else {
        format!("{s:?}")
    }
}

fn show_node(n: &Value) -> String {
    match n {
        Value::String(s) => show_text(s),
        other => {
            let mut c = String::new();
            write_canonical(other, &mut c);
            if c.chars().count() > 80 {
                format!("{}…", c.chars().take(80).collect::<String>())
            } else {
                c
            }
        }
    }
}

/// The config paths whose canonical values differ (maps by key, sequences by index).
fn diff_nodes(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    if out.len() > MAX_CONTRACT_REASONS {
        return;
    }
    let at = |p: &str| {
        if p.is_empty() {
            "(root)".to_string()
        } else {
            p.to_string()
        }
    };
    match (a, b) {
        (Value::Mapping(x), Value::Mapping(y)) => {
            let keys: std::collections::BTreeSet<&str> =
                x.keys().chain(y.keys()).map(String::as_str).collect();
            for k in keys {
                let p = if path.is_empty() {
                    k.to_string()
                } else {
                    format!("{path}.{k}")
                };
                match (x.get(k), y.get(k)) {
                    (Some(v), Some(w)) => diff_nodes(&p, v, w, out),
                    (Some(v), None) => out.push(format!(
                        "config changed: {p} removed (was {})",
                        show_node(v)
                    )),
                    (None, Some(w)) => {
                        out.push(format!("config changed: {p} added ({})", show_node(w)))
                    }
                    (None, None) => {}
                }
            }
        }
        (Value::List(x), Value::List(y)) => {
            for i in 0..x.len().max(y.len()) {
                let p = format!("{path}[{i}]");
                match (x.get(i), y.get(i)) {
                    (Some(v), Some(w)) => diff_nodes(&p, v, w, out),
                    (Some(v), None) => out.push(format!(
                        "config changed: {p} removed (was {})",
                        show_node(v)
                    )),
                    (None, Some(w)) => {
                        out.push(format!("config changed: {p} added ({})", show_node(w)))
                    }
                    (None, None) => {}
                }
            }
        }
        _ => {
            let (mut x, mut y) = (String::new(), String::new());
            write_canonical(a, &mut x);
            write_canonical(b, &mut y);
            if x != y {
                out.push(format!(
                    "config changed: {} ({} -> {})",
                    at(path),
                    show_node(a),
                    show_node(b)
                ));
            }
        }
    }
}

/// Hands out MASTER_PORTs (`base + k`, unique within the plan) and MASTER_ADDRs per runner kind.
struct PlanRendezvous<'a> {
    runner: &'a RunnerEnvironment,
    base: u32,
    next: u32,
    hash_short: String,
}

impl<'a> PlanRendezvous<'a> {
    fn new(runner: &'a RunnerEnvironment, hash: &Hash) -> Self {
        let base = runner
            .inventory
            .as_ref()
            .map(|i| u32::from(i.rendezvous_port_base))
            .unwrap_or(29500);
        PlanRendezvous {
            runner,
            base,
            next: 0,
            hash_short: hash.short(),
        }
    }
}

impl RendezvousAllocator for PlanRendezvous<'_> {
    fn next(
        &mut self,
        stage_id: &str,
        instance: u32,
        placement: &InstancePlacement,
    ) -> Result<Rendezvous, PlanError> {
        let port = self.base + self.next;
        if port > 65535 {
            return Err(PlanError::WorkPlan {
                stage: stage_id.into(),
                reason: format!(
                    "ran out of rendezvous ports: {} torchrun groups from port {}",
                    self.next + 1,
                    self.base
                ),
            });
        }
        self.next += 1;
        let master_addr = match self.runner.kind {
            RunnerKind::Slurm => MasterAddr::FirstNodeOfGroup,
            // One node per instance there: torchrun's rendezvous is on its own node.
            RunnerKind::Local | RunnerKind::Ray => MasterAddr::Host("127.0.0.1".into()),
            RunnerKind::Baremetal => {
                let inv = self.runner.inventory.as_ref();
                let hosts: Vec<&str> = inv
                    .map(|i| i.hosts.iter().map(|h| h.hostname.as_str()).collect())
                    .unwrap_or_default();
                let group_hosts: Vec<&str> = placement
                    .nodes()
                    .filter_map(|n| hosts.get(n as usize).copied())
                    .collect();
                let rendezvous_host = inv.map(|i| i.rendezvous_host.as_str());
                match rendezvous_host {
                    Some(r) if group_hosts.contains(&r) => MasterAddr::Host(r.to_string()),
                    _ => MasterAddr::Host(
                        group_hosts
                            .first()
                            .copied()
                            .unwrap_or("127.0.0.1")
                            .to_string(),
                    ),
                }
            }
        };
        Ok(Rendezvous {
            rdzv_id: format!("pz-{}-{}-{}", self.hash_short, stage_id, instance),
            master_addr,
            master_port: port as u16,
        })
    }
}
