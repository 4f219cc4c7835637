//! Dry run: what `campaign run` would submit for the first attempt of every unit, rendered by
//! the executor that would submit it, before any GPU hour is spent.
//!
//! There is one submission path. The specs come from
//! [`attempt_spec`](super::controller::spec::attempt_spec), the function the controller calls
//! (same attempt ids, job names, environment, log paths, execution contract), and each is
//! rendered by [`Executor::render`], the method the executor's own `submit` calls (Slurm: the
//! batch script and the `sbatch` command; local: argv, environment, working directory; bare
//! metal: one `ssh` per host with its remote command). So what the dry run prints is, byte
//! for byte, what runs (`tests/submission_equality.rs` checks it against what the executors
//! actually submit). Secrets are redacted in what is shown ([`Rendering::redacted`]), never in
//! what is submitted.
//!
//! One job per instance (see CONTRIBUTING.md, "One submission path"): the placement table
//! shows the plan's packing of instances onto nodes and GPUs; the executor places each
//! instance's job (Slurm, the local GPU slots, the bare-metal leases).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::controller::spec::{UnitSpec, attempt_id, attempt_spec, stage_units};
use super::plan::{CampaignPlan, StagePlan};
use super::plan_error::PlanError;
use super::runner::RunnerKind;
use super::work::WorkItem;
use crate::executor::{AttemptId, AttemptSpec, Executor, Rendering};

/// Options of [`dry_run`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DryRunOptions {
    /// Attempt number rendered (1 for the first submission).
    pub attempt: u32,
    /// Show secrets as `<redacted>` ([`Rendering::redacted`]). On for anything shown or
    /// logged; what an executor submits is never redacted.
    pub redact_secrets: bool,
    /// Nodes the campaign excluded (its controller's `node_excluded` records, see the
    /// `report` module's `CampaignHistory::excluded_nodes`):
    /// rendered as one `#SBATCH --exclude=` line, as the controller submits them.
    #[serde(default)]
    pub exclude_nodes: Vec<String>,
    /// The campaign folder (absolute): working directory, outputs, logs, as the controller
    /// puts them.
    #[serde(default = "default_dir")]
    pub campaign_dir: PathBuf,
    /// The campaign's tag (the nonce that starts every attempt id): the journal's for an
    /// existing campaign folder; a new folder draws a random one, shown here as `TAG`.
    #[serde(default = "default_tag")]
    pub tag: String,
    /// The campaign's revision (0 until `--new-revision`).
    #[serde(default)]
    pub revision: u32,
}

fn default_dir() -> PathBuf {
    PathBuf::from("/CAMPAIGN_DIR")
}

fn default_tag() -> String {
    "TAG".into()
}

impl Default for DryRunOptions {
    fn default() -> Self {
        DryRunOptions {
            attempt: 1,
            redact_secrets: true,
            exclude_nodes: Vec::new(),
            campaign_dir: default_dir(),
            tag: default_tag(),
            revision: 0,
        }
    }
}

impl DryRunOptions {
    /// Sets [`attempt`](Self::attempt).
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// Sets [`redact_secrets`](Self::redact_secrets).
    pub fn with_redact_secrets(mut self, redact_secrets: bool) -> Self {
        self.redact_secrets = redact_secrets;
        self
    }

    /// Sets [`exclude_nodes`](Self::exclude_nodes).
    pub fn with_exclude_nodes(mut self, exclude_nodes: Vec<String>) -> Self {
        self.exclude_nodes = exclude_nodes;
        self
    }

    /// Sets [`campaign_dir`](Self::campaign_dir).
    pub fn with_campaign_dir(mut self, campaign_dir: impl Into<PathBuf>) -> Self {
        self.campaign_dir = campaign_dir.into();
        self
    }

    /// Sets [`tag`](Self::tag).
    pub fn with_tag(mut self, tag: impl Into<String>) -> Self {
        self.tag = tag.into();
        self
    }

    /// Sets [`revision`](Self::revision).
    pub fn with_revision(mut self, revision: u32) -> Self {
        self.revision = revision;
        self
    }
}

/// One unit's job: its spec's identity and the executor's rendering of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct JobSubmission {
    /// The unit (`score/3`, `score/agg`).
    pub unit: String,
    /// The work item it runs (the aggregate step: the stage's first item).
    pub work_id: String,
    /// The attempt id, which is also the job name.
    pub attempt_id: AttemptId,
    /// What the executor submits for it (redacted when the options say so).
    pub rendering: Rendering,
}

/// What one stage's attempts would submit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StageSubmission {
    /// Stage id.
    pub stage_id: String,
    /// Attempt number.
    pub attempt: u32,
    /// One job per unit (instance, then the aggregate step), in the controller's order.
    pub jobs: Vec<JobSubmission>,
    /// One line per node of the plan's packing: which instances use which GPUs.
    pub placement: Vec<String>,
    /// Problems worth a look before submitting (a warning signal that cannot work).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// The dry run of a plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DryRun {
    /// The executor kind that rendered the jobs.
    pub executor: String,
    /// Runner values that are still placeholders (`REPLACE_WITH_...`): shown here, refused
    /// by `campaign run` before any job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placeholders: Vec<String>,
    /// One submission per stage that runs a job, in plan order.
    pub submissions: Vec<StageSubmission>,
    /// The manual decision stages (no job), in plan order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<DecisionPreview>,
}

/// What a manual decision stage will ask (it submits no job).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DecisionPreview {
    /// Stage id.
    pub stage_id: String,
    /// The stage whose work items are the candidates.
    pub input: String,
    /// The candidates (work ids), numbered from 1 in the prompt.
    pub candidates: Vec<String>,
    /// The decision file the controller reads off a terminal, relative to the campaign
    /// folder (`decisions/<stage id>.txt`).
    pub decision_file: String,
}

/// The decision file of a manual decision stage, relative to the campaign folder.
pub(crate) fn decision_file_name(stage_id: &str) -> String {
    format!("decisions/{stage_id}.txt")
}

/// Where workers find the resolved config, relative to the campaign folder.
pub(crate) const RESOLVED_CONFIG_FILE: &str = ".puzzletron/resolved-config.json";

/// The payload argv of a work item: the stage command with its placeholders filled
/// (`{stage_id}`, `{work_id}`, `{shard_index}`, `{shard_count}`, and `{config}`, the resolved
/// config the controller writes into the campaign folder `campaign_dir`).
///
/// # Errors
/// [`PlanError::WorkPlan`] for a stage without a command; [`PlanError::InvalidValue`] for an
/// argument with a NUL (no process argument can hold one).
pub(crate) fn item_argv(
    stage: &StagePlan,
    item: &WorkItem,
    campaign_dir: &Path,
) -> Result<Vec<String>, PlanError> {
    if stage.worker.command.is_empty() {
        return Err(PlanError::WorkPlan {
            stage: stage.stage_id.clone(),
            reason: "the stage has no command (give `command: [...]` in its catalog entry)".into(),
        });
    }
    let config = campaign_dir
        .join(RESOLVED_CONFIG_FILE)
        .display()
        .to_string();
    stage
        .worker
        .command
        .iter()
        .map(|a| {
            let v = a
                .replace("{stage_id}", &stage.stage_id)
                .replace("{work_id}", &item.work_id)
                .replace("{shard_index}", &item.shard_index.to_string())
                .replace("{shard_count}", &item.shard_count.to_string())
                .replace("{config}", &config);
            if v.contains('\0') {
                return Err(PlanError::InvalidValue {
                    file: "<plan>".into(),
                    path: format!("stage `{}` command", stage.stage_id),
                    value: format!("{v:?}"),
                    expected: "arguments without NUL characters".into(),
                });
            }
            Ok(v)
        })
        .collect()
}

/// The attempt specs of one stage, as the controller builds them.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StageSpecs {
    /// Stage id.
    pub stage_id: String,
    /// `(unit key, work id, spec)` per unit, in the controller's order.
    pub units: Vec<(String, String, AttemptSpec)>,
}

/// The specs of attempt `options.attempt` of every unit of every stage that runs a job, built
/// by the controller's own `attempt_spec` (with the excluded nodes the controller adds).
///
/// # Errors
/// [`PlanError::WorkPlan`] for a stage the controller could not submit (no command, no item).
pub fn attempt_specs(
    plan: &CampaignPlan,
    options: &DryRunOptions,
) -> Result<Vec<StageSpecs>, PlanError> {
    let mut out = Vec::with_capacity(plan.stages.len());
    for stage in plan.stages.iter().filter(|s| s.decision.is_none()) {
        let mut units = Vec::new();
        for (key, item) in stage_units(stage) {
            let id = attempt_id(
                &options.tag,
                options.revision,
                &stage.stage_id,
                item,
                options.attempt,
            );
            let mut spec = attempt_spec(&UnitSpec {
                campaign: &options.campaign_dir,
                plan,
                stage,
                unit_key: &key,
                item,
                attempt_id: &id,
                attempt: options.attempt,
                resume: false,
                more_resources: false,
            })
            .map_err(|e| PlanError::WorkPlan {
                stage: stage.stage_id.clone(),
                reason: e.to_string(),
            })?;
            super::controller::nodes::add_exclude(
                &mut spec.scheduler.extra_directives,
                &options.exclude_nodes.iter().cloned().collect(),
            );
            let work_id = stage.work.items[item.unwrap_or(0)].work_id.clone();
            units.push((key, work_id, spec));
        }
        out.push(StageSpecs {
            stage_id: stage.stage_id.clone(),
            units,
        });
    }
    Ok(out)
}

/// The executor `campaign run` builds by default for the plan's runner on the campaign folder
/// `dir`: Slurm with its scripts and logs in `<dir>/slurm-logs`, local with its attempt
/// folders in `<dir>/attempts` and `gpu_ids` (empty: `0..=7`), bare metal from the runner's
/// inventory and contract with its leases in `<dir>/baremetal`. Building it creates none of
/// these folders (they are made at the first submit), so a dry run can use it.
///
/// # Errors
/// [`PlanError::WorkPlan`] naming the executor when it cannot be built (a bad GPU id, a
/// bare-metal runner without an inventory).
pub fn default_executor(
    plan: &CampaignPlan,
    dir: &Path,
    gpu_ids: &[String],
    max_concurrent: Option<usize>,
) -> Result<Box<dyn Executor>, PlanError> {
    let bad = |e: crate::executor::ExecutorError| PlanError::WorkPlan {
        stage: "*".into(),
        reason: format!(
            "cannot build the {} executor: {e}",
            plan.runner.kind.as_str()
        ),
    };
    Ok(match plan.runner.kind {
        RunnerKind::Local => {
            let ids: Vec<String> = if gpu_ids.is_empty() {
                (0..8).map(|i| i.to_string()).collect()
            } else {
                gpu_ids.to_vec()
            };
            let n = max_concurrent.unwrap_or(ids.len().max(1));
            Box::new(
                crate::executor::LocalExecutor::builder(dir.join("attempts"))
                    .gpu_ids(ids)
                    .max_concurrent(n)
                    .build()
                    .map_err(bad)?,
            )
        }
        #[cfg(feature = "slurm")]
        RunnerKind::Slurm => Box::new(
            crate::executor::SlurmExecutor::builder(dir.join("slurm-logs"))
                .build()
                .map_err(bad)?,
        ),
        #[cfg(not(feature = "slurm"))]
        RunnerKind::Slurm => {
            return Err(PlanError::WorkPlan {
                stage: "*".into(),
                reason: "the slurm runner needs puzzletron's `slurm` feature".into(),
            });
        }
        RunnerKind::Baremetal => Box::new(
            plan.runner
                .baremetal_executor(dir.join("baremetal"))?
                .build()
                .map_err(bad)?,
        ),
        // Every job's metadata names the campaign folder (the same in a restarted controller).
        #[cfg(feature = "ray")]
        RunnerKind::Ray => Box::new(
            plan.runner
                .ray_executor(
                    &crate::executor::resolve_dir(dir)
                        .map_err(bad)?
                        .display()
                        .to_string(),
                )?
                .build()
                .map_err(bad)?,
        ),
        #[cfg(not(feature = "ray"))]
        RunnerKind::Ray => {
            return Err(PlanError::WorkPlan {
                stage: "*".into(),
                reason: "the ray runner needs puzzletron's `ray` feature".into(),
            });
        }
    })
}

/// Why `program` would not start from `cwd` with `path` (the `PATH` value), if it would not:
/// a word with a `/` must name an executable file (relative to `cwd`), a bare word must be
/// an executable file in one of `path`'s folders. `None` when it resolves.
pub(crate) fn program_problem(
    program: &str,
    cwd: Option<&std::path::Path>,
    path: Option<&std::ffi::OsStr>,
) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let here = cwd.map_or_else(|| ".".to_string(), |c| c.display().to_string());
    if program.contains('/') {
        let p = std::path::Path::new(program);
        let full = match cwd {
            Some(c) if p.is_relative() => c.join(p),
            _ => p.to_path_buf(),
        };
        return (!runnable(&full)).then(|| {
            format!(
                "program `{program}` is not an executable file ({}; working directory {here})",
                full.display()
            )
        });
    }
    let dirs: Vec<std::path::PathBuf> = path
        .map(|p| std::env::split_paths(p).collect())
        .unwrap_or_default();
    if dirs.iter().any(|d| runnable(&d.join(program))) {
        return None;
    }
    Some(format!(
        "program `{program}` not found in PATH={} (working directory {here}): `campaign run` would fail it as a configuration error",
        path.map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    ))
}

/// Renders what each stage's first attempts would submit, through `executor`'s
/// [`render`](Executor::render) (build it as `campaign run` does, on the same folder).
///
/// # Errors
/// As [`attempt_specs`]; [`PlanError::WorkPlan`] naming the attempt when the executor cannot
/// take its spec (the reason is the executor's: a value it cannot express, a directive value
/// that cannot be quoted).
pub fn dry_run(
    plan: &CampaignPlan,
    options: &DryRunOptions,
    executor: &dyn Executor,
) -> Result<DryRun, PlanError> {
    let mut submissions = Vec::with_capacity(plan.stages.len());
    for specs in attempt_specs(plan, options)? {
        let Some(stage) = plan.stage(&specs.stage_id) else {
            continue;
        };
        let mut jobs = Vec::with_capacity(specs.units.len());
        // Issue 27: the first word of a local command resolves (a missing program is a
        // configuration error; better seen here than after a submit).
        let mut missing_program = None;
        if plan.runner.kind == super::runner::RunnerKind::Local
            && let Some((_, _, spec)) = specs.units.first()
        {
            missing_program = program_problem(
                spec.command.argv.first().map_or("", String::as_str),
                spec.command.cwd.as_deref(),
                std::env::var_os("PATH").as_deref(),
            )
            .map(|p| format!("stage {}: {p}", stage.stage_id));
        }
        for (unit, work_id, spec) in specs.units {
            let r = executor.render(&spec).map_err(|e| PlanError::WorkPlan {
                stage: stage.stage_id.clone(),
                reason: format!(
                    "attempt {} cannot be submitted to the {} executor: {e}",
                    spec.attempt_id,
                    executor.kind()
                ),
            })?;
            jobs.push(JobSubmission {
                unit,
                work_id,
                attempt_id: spec.attempt_id.clone(),
                rendering: if options.redact_secrets {
                    r.redacted()
                } else {
                    r
                },
            });
        }
        let warnings = match &stage.spec.warning_signal {
            Some(w) => super::execution::warning_signal_problems(
                w,
                stage
                    .spec
                    .time_limit
                    .as_ref()
                    .or(plan
                        .runner
                        .slurm
                        .as_ref()
                        .and_then(|s| s.time_limit.as_ref()))
                    .map(|t| t.as_duration()),
                stage.worker.resumable,
                stage.spec.distributed,
            ),
            None => Vec::new(),
        };
        let mut warnings = warnings;
        warnings.extend(missing_program);
        submissions.push(StageSubmission {
            stage_id: stage.stage_id.clone(),
            attempt: options.attempt,
            jobs,
            placement: placement_lines(plan, stage),
            warnings,
        });
    }
    let decisions = plan
        .stages
        .iter()
        .filter_map(|stage| {
            stage.decision.as_ref().map(|d| DecisionPreview {
                stage_id: stage.stage_id.clone(),
                input: d.input.clone(),
                candidates: d.candidates.clone(),
                decision_file: decision_file_name(&stage.stage_id),
            })
        })
        .collect();
    Ok(DryRun {
        executor: executor.kind().to_string(),
        placeholders: plan
            .runner
            .placeholders()
            .into_iter()
            .map(|(key, value)| format!("`{key}` = {value:?}"))
            .collect(),
        submissions,
        decisions,
    })
}

fn placement_lines(plan: &CampaignPlan, stage: &StagePlan) -> Vec<String> {
    let a = &stage.spec.allocation;
    let hosts: Vec<String> = match (&plan.runner.kind, &plan.runner.inventory) {
        (RunnerKind::Baremetal, Some(inv)) => {
            inv.hosts.iter().map(|h| h.hostname.clone()).collect()
        }
        _ => Vec::new(),
    };
    let mut per_node: Vec<String> = vec![String::new(); a.nodes as usize];
    for (i, p) in a.placements().iter().enumerate() {
        for n in p.nodes() {
            let ids = p.local_gpu_ids();
            let text = if ids.is_empty() {
                format!("instance {i} (cpu)")
            } else if ids.len() == 1 {
                format!("instance {i} -> GPU {}", ids.start)
            } else {
                format!("instance {i} -> GPUs {}-{}", ids.start, ids.end - 1)
            };
            let slot = &mut per_node[n as usize];
            if !slot.is_empty() {
                slot.push_str("; ");
            }
            slot.push_str(&text);
        }
    }
    per_node
        .into_iter()
        .enumerate()
        .map(|(n, text)| {
            let name = match plan.runner.kind {
                RunnerKind::Baremetal => hosts
                    .get(n)
                    .cloned()
                    .unwrap_or_else(|| format!("<no host {n}>")),
                RunnerKind::Slurm => format!("allocation node {n}"),
                RunnerKind::Local => "localhost".into(),
                RunnerKind::Ray => format!("ray node {n} (Ray picks it)"),
            };
            format!(
                "node {n} ({name}, {}/{} GPUs): {text}",
                a.gpus_on_node(n as u32),
                a.gpus_per_node
            )
        })
        .collect()
}

/// The dry run as text: the placeholders left in the runner, then per stage its shape, the
/// plan's placement and each job's rendering (files, then commands, every word quoted); then
/// the manual decisions and the [`PlanSummary`](super::PlanSummary) table.
///
/// # Errors
/// As [`dry_run`].
pub fn render_dry_run(
    plan: &CampaignPlan,
    options: &DryRunOptions,
    executor: &dyn Executor,
) -> Result<String, PlanError> {
    let dr = dry_run(plan, options, executor)?;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "campaign {} ({} runner, {} executor), contract {}\ncampaign folder {}, tag {}{}",
        plan.experiment_config_path,
        plan.runner.kind.as_str(),
        dr.executor,
        plan.contract_hash,
        options.campaign_dir.display(),
        options.tag,
        if options.revision > 0 {
            format!(", revision {}", options.revision)
        } else {
            String::new()
        }
    );
    for p in &dr.placeholders {
        let _ = writeln!(
            s,
            "WARNING: runner value {p} is a placeholder: `campaign run` refuses it; replace it \
             with the site's value"
        );
    }
    for sub in &dr.submissions {
        let _ = writeln!(
            s,
            "\n=== stage {} (attempt {}): {} job(s) ===",
            sub.stage_id,
            sub.attempt,
            sub.jobs.len()
        );
        if let Some(st) = plan.stage(&sub.stage_id) {
            let a = &st.spec.allocation;
            let _ = writeln!(
                s,
                "{} x {} | mesh {} | {} GPU(s)/instance | {} node(s), {} GPU(s){} | launcher {} | parents: {}",
                st.spec.instances,
                st.spec.strategy,
                st.spec.mesh,
                a.gpus_per_instance,
                a.nodes,
                a.total_gpus,
                if a.exclusive { ", exclusive" } else { "" },
                st.work.topology.launcher.name(),
                if st.parents.is_empty() {
                    "-".to_string()
                } else {
                    st.parents.join(", ")
                }
            );
        }
        for w in &sub.warnings {
            let _ = writeln!(s, "WARNING: {w}");
        }
        let _ = writeln!(
            s,
            "placement (the plan's packing; the executor places each instance's job):"
        );
        for line in &sub.placement {
            let _ = writeln!(s, "  {line}");
        }
        for job in &sub.jobs {
            let _ = writeln!(
                s,
                "--- job {} (unit {}, work item {}) ---",
                job.attempt_id, job.unit, job.work_id
            );
            s.push_str(&job.rendering.to_text());
        }
    }
    for d in &dr.decisions {
        let _ = writeln!(
            s,
            "\n=== stage {} (manual decision, no job) ===\nparents: {}\ncandidates (work items of {}): {}\n\
             asks on a terminal; otherwise waits for <campaign dir>/{} (`all`, `none`, numbers or ids)",
            d.stage_id,
            plan.stage(&d.stage_id)
                .map(|st| st.parents.join(", "))
                .unwrap_or_default(),
            d.input,
            if d.candidates.is_empty() {
                "-".to_string()
            } else {
                d.candidates
                    .iter()
                    .enumerate()
                    .map(|(i, c)| format!("{}. {c}", i + 1))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            d.decision_file
        );
    }
    let _ = write!(
        s,
        "\n=== summary ===\n{}",
        super::summary::PlanSummary::of(plan)
    );
    Ok(s)
}

#[cfg(test)]
mod program_tests {
    use super::program_problem;

    /// Issue 27, item 4: the dry run checks that a local command's first word resolves.
    #[test]
    fn the_first_word_of_a_command_must_resolve() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let tool = bin.join("tool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(bin.join("data"), "x").unwrap();
        let path = std::ffi::OsString::from(format!("/nonexistent:{}", bin.display()));
        let check = |p: &str| program_problem(p, Some(dir.path()), Some(&path));
        assert_eq!(check("tool"), None);
        assert_eq!(check("bin/tool"), None, "relative to the working directory");
        assert_eq!(check(&tool.display().to_string()), None);
        let e = check("pythn").unwrap();
        assert!(
            e.starts_with("program `pythn` not found in PATH=/nonexistent:")
                && e.contains(&format!("working directory {}", dir.path().display())),
            "{e}"
        );
        let e = check("data").unwrap();
        assert!(
            e.contains("program `data` not found"),
            "not executable: {e}"
        );
        let e = check("./missing.sh").unwrap();
        assert!(e.contains("is not an executable file"), "{e}");
    }
}
