//! The built-in Puzzletron pipeline ([`StageCatalog::puzzle`]) and the expansion of its
//! `post_mip.flows` into `post.<flow>.<node>` stages.

use serde::{Deserialize, Serialize};

use super::graph::{MeshSource, Need, ShardAxis, StageCatalog, StageDef};
use crate::campaign::config::Value;
use crate::campaign::execution::{FailurePolicy, Strategy};
use crate::campaign::mesh::{ParallelMesh, normalize_vllm_topology};
use crate::campaign::plan_error::PlanError;
use crate::campaign::schema::{
    check_keys, did_you_mean, expect_map, get, get_path, invalid, join, key_path, read,
};

/// Post-MIP flow expansion settings of the Puzzle catalog.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
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

/// The worker entry point of the Puzzle catalog: the Puzzletron v2 stage runner, given the
/// stage, the work item and the resolved config path.
pub(super) const PUZZLE_WORKER: [&str; 3] =
    ["python", "-m", "modelopt.torch.puzzletron.v2.run_stage"];

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
                d.worker.resumable = true;
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
                d.worker.resumable = true;
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
/// The keys of a flow's `source` (which MIP run's solutions enter the flow).
const SOURCE_KEYS: [&str; 3] = ["run", "variants", "objectives"];
/// The keys of one item of a filter's `metrics` list.
const METRIC_ITEM_KEYS: [&str; 2] = ["metric", "direction"];
/// The modes of a `type: filter` node: keep the `top_k` best by one metric, rank by several
/// (`aggregate_rank`), or let a person choose (`manual`: a decision stage, no job).
pub(crate) const FILTER_MODES: [&str; 3] = ["top_k", "aggregate_rank", "manual"];
/// The directions of a filter metric.
pub(crate) const DIRECTIONS: [&str; 2] = ["minimize", "maximize"];
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
/// A `type: filter` node with `mode: manual` becomes a manual decision stage
/// ([`StageDef::decision`]: a person chooses among its input's work items; no job).
pub(super) fn expand_post_mip(
    file: &str,
    config: &Value,
    pm: &PostMipExpansion,
) -> Result<Vec<(StageDef, ParallelMesh)>, PlanError> {
    let flows = match get_path(config, &pm.flows_key) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(n) => expect_map(file, &pm.flows_key, n)?,
    };
    let mut out = Vec::new();
    for (flow, fnode) in flows {
        let fpath = join(&pm.flows_key, flow);
        // `flow: false` switches a flow off, like `mip.runs.<run>: false`.
        if matches!(fnode, Value::Bool(false) | Value::Null) {
            continue;
        }
        check_flow_name(file, &fpath, flow)?;
        let fmap = expect_map(file, &fpath, fnode)?;
        check_keys(file, &fpath, fmap, &FLOW_KEYS)?;
        if let Some(src) = get(fnode, "source") {
            check_source(file, &join(&fpath, "source"), src, config, pm)?;
        }
        let nodes_path = join(&fpath, "nodes");
        let nodes = match get(fnode, "nodes") {
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
            let ty = match get(node, "type") {
                Some(Value::String(t)) => t.as_str(),
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
            let node_ref = |key: &str, v: &Value| -> Result<String, PlanError> {
                match v {
                    Value::String(s) if names.contains(&s.as_str()) => Ok(sid(s)),
                    Value::String(s) => Err(PlanError::MissingParent {
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
            match get(node, "input") {
                None | Some(Value::Null) => parents.push(pm.source_stage.clone()),
                Some(v) => parents.push(node_ref("input", v)?),
            }
            if let Some(v) = get(node, "model_source").filter(|v| !v.is_null()) {
                parents.push(node_ref("model_source", v)?);
            }
            let mut metric_names: Vec<String> = Vec::new();
            if let Some(Value::String(m)) = get(node, "metric") {
                metric_names.push(m.clone());
            }
            if let Some(Value::List(items)) = get(node, "metrics") {
                for item in items {
                    if let Some(Value::String(m)) = get(item, "metric") {
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
            if ty == "filter" {
                check_filter(file, &npath, node, &names, &pm.source_stage)?;
            }
            // `mode: manual` on a filter: a person chooses (a decision stage, no job).
            let manual = match get(node, "mode") {
                None | Some(Value::Null) => false,
                Some(Value::String(m)) => ty == "filter" && m == "manual",
                Some(other) => {
                    return Err(invalid(
                        file,
                        &join(&npath, "mode"),
                        other,
                        "a mode name (a string such as `top_k` or, for a filter, `manual`)",
                    ));
                }
            };
            let decision_input = manual.then(|| parents[0].clone());
            let mut dedup: Vec<String> = Vec::new();
            for p in parents {
                if !dedup.contains(&p) {
                    dedup.push(p);
                }
            }
            let failure_policy = match get(node, "failure_policy") {
                None | Some(Value::Null) => None,
                Some(v) => Some(read::<FailurePolicy>(
                    file,
                    key_path(&join(&npath, "failure_policy")),
                    v,
                )?),
            };
            let cfg = get(node, "config");
            let mesh = match cfg {
                Some(c) if get_path(c, "automodel.parallel").is_some_and(|n| !n.is_null()) => {
                    let p = join(&npath, "config.automodel.parallel");
                    ParallelMesh::from_mapping(
                        file,
                        &p,
                        get_path(c, "automodel.parallel").unwrap_or(&Value::Null),
                    )?
                }
                Some(c) if get(c, "topology").is_some_and(|n| !n.is_null()) => {
                    let p = join(&npath, "config.topology");
                    normalize_vllm_topology(file, &p, get(c, "topology").unwrap_or(&Value::Null))?
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
            def.worker.resumable = ty == "global_kd";
            def.decision = decision_input;
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

/// `one of a, b (did you mean `x`?)` for an enumeration error.
fn one_of(value: &str, valid: &[&str]) -> String {
    format!(
        "one of {}{}",
        valid.join(", "),
        did_you_mean(value, valid.iter().copied())
            .map(|s| format!(" (did you mean `{s}`?)"))
            .unwrap_or_default()
    )
}

/// Checks a string value against an enumeration.
fn check_enum(file: &str, path: &str, v: &Value, valid: &[&str]) -> Result<(), PlanError> {
    match v {
        Value::String(s) if valid.contains(&s.as_str()) => Ok(()),
        Value::String(s) => Err(PlanError::InvalidValue {
            file: file.into(),
            path: path.into(),
            value: format!("{s:?}"),
            expected: one_of(s, valid),
        }),
        other => Err(invalid(file, path, other, &one_of("", valid))),
    }
}

/// A flow's `source`: `{run, variants, objectives}`, `run` naming a MIP run of the plan
/// (`<source stage>.runs.<run>`, not switched off).
fn check_source(
    file: &str,
    path: &str,
    src: &Value,
    config: &Value,
    pm: &PostMipExpansion,
) -> Result<(), PlanError> {
    let map = expect_map(file, path, src)?;
    check_keys(file, path, map, &SOURCE_KEYS)?;
    let runs_key = format!("{}.runs", pm.source_stage);
    let rpath = join(path, "run");
    let run = match get(src, "run") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(r)) => r,
        Some(other) => return Err(invalid(file, &rpath, other, "the name of a MIP run")),
    };
    let runs: Vec<(&str, bool)> = match get_path(config, &runs_key) {
        Some(Value::Mapping(m)) => m
            .iter()
            .map(|(k, v)| (k.as_str(), !matches!(v, Value::Bool(false) | Value::Null)))
            .collect(),
        _ => Vec::new(),
    };
    let on: Vec<&str> = runs.iter().filter(|r| r.1).map(|r| r.0).collect();
    if on.contains(&run.as_str()) {
        return Ok(());
    }
    let expected = if runs.iter().any(|r| r.0 == run) {
        format!(
            "a MIP run that is on: `{runs_key}.{run}` is switched off, so the flow would get no \
             solutions; switch it on or name one of: {}",
            if on.is_empty() {
                "none".to_string()
            } else {
                on.join(", ")
            }
        )
    } else {
        format!(
            "the name of a MIP run of the plan (a key of `{runs_key}`): {}{}",
            if on.is_empty() {
                "there are none".to_string()
            } else {
                on.join(", ")
            },
            did_you_mean(run, on.iter().copied())
                .map(|s| format!(" (did you mean `{s}`?)"))
                .unwrap_or_default()
        )
    };
    Err(PlanError::InvalidValue {
        file: file.into(),
        path: rpath,
        value: format!("{run:?}"),
        expected,
    })
}

/// A filter metric: `<node>.<metric>` naming a node of the flow, or `<source stage>.<metric>`
/// (`mip.score`).
fn check_metric(
    file: &str,
    path: &str,
    v: &Value,
    names: &[&str],
    source_stage: &str,
) -> Result<(), PlanError> {
    let mut sources: Vec<&str> = vec![source_stage];
    sources.extend(names.iter().copied());
    let expected = |fix: String| {
        format!(
            "`<node>.<metric>` naming a node of this flow or `{source_stage}`: one of {}{fix}",
            sources.join(", ")
        )
    };
    match v {
        Value::String(m) => match m.split_once('.') {
            Some((prefix, name)) if sources.contains(&prefix) && !name.is_empty() => Ok(()),
            Some((prefix, name)) => Err(PlanError::InvalidValue {
                file: file.into(),
                path: path.into(),
                value: format!("{m:?}"),
                expected: expected(
                    did_you_mean(prefix, sources.iter().copied())
                        .map(|s| format!(" (did you mean `{s}.{name}`?)"))
                        .unwrap_or_default(),
                ),
            }),
            None => Err(PlanError::InvalidValue {
                file: file.into(),
                path: path.into(),
                value: format!("{m:?}"),
                expected: expected(String::new()),
            }),
        },
        other => Err(invalid(file, path, other, &expected(String::new()))),
    }
}

/// The fields of a `type: filter` node: `mode`, `direction`, `metric`, `metrics` and `top_k`.
fn check_filter(
    file: &str,
    npath: &str,
    node: &Value,
    names: &[&str],
    source_stage: &str,
) -> Result<(), PlanError> {
    let field = |k: &str| get(node, k).filter(|v| !v.is_null());
    if let Some(v) = field("mode") {
        check_enum(file, &join(npath, "mode"), v, &FILTER_MODES)?;
    }
    if let Some(v) = field("direction") {
        check_enum(file, &join(npath, "direction"), v, &DIRECTIONS)?;
    }
    if let Some(v) = field("top_k") {
        match v {
            Value::Int(k) if *k >= 1 => {}
            other => {
                return Err(invalid(
                    file,
                    &join(npath, "top_k"),
                    other,
                    "an integer >= 1 (how many of the input's work items the filter keeps)",
                ));
            }
        }
    }
    if let Some(v) = field("metric") {
        check_metric(file, &join(npath, "metric"), v, names, source_stage)?;
    }
    if let Some(v) = field("metrics") {
        let mpath = join(npath, "metrics");
        let Value::List(items) = v else {
            return Err(invalid(
                file,
                &mpath,
                v,
                "a list of {metric, direction} mappings",
            ));
        };
        for (i, item) in items.iter().enumerate() {
            let ipath = format!("{mpath}[{i}]");
            let map = expect_map(file, &ipath, item)?;
            check_keys(file, &ipath, map, &METRIC_ITEM_KEYS)?;
            match get(item, "metric") {
                Some(m) => check_metric(file, &join(&ipath, "metric"), m, names, source_stage)?,
                None => {
                    return Err(PlanError::MissingField {
                        file: file.into(),
                        path: join(&ipath, "metric"),
                        expected: "the metric, `<node>.<metric>`".into(),
                    });
                }
            }
            if let Some(d) = get(item, "direction").filter(|v| !v.is_null()) {
                check_enum(file, &join(&ipath, "direction"), d, &DIRECTIONS)?;
            }
        }
    }
    Ok(())
}
