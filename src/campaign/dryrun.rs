//! Dry run: what a compiled plan would submit, per stage and attempt, as text a user reads
//! before spending GPU hours.
//!
//! - Slurm: the full sbatch script of each stage attempt. Every value that comes from a config
//!   is single-quoted for the shell; values of `#SBATCH` directives must not contain control
//!   characters (a newline there would start a shell command), so they are refused. Commands
//!   reach the payload as separate, quoted argv words (`bash -c '...' bash ARGS...`), never
//!   spliced into a script string. `prerun_commands` / `postrun_commands` are the site's own
//!   shell and are written verbatim, as the runner file says.
//! - Local: argv, environment and working directory of each process (no shell).
//! - Bare metal: the `ssh` argv per host, whose remote command is built from quoted words.
//!
//! The GPU placement per node is listed for every kind.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::plan::{CampaignPlan, StagePlan};
use super::plan_error::PlanError;
use super::runner::RunnerKind;
use super::work::{MasterAddr, TaskGroup, TaskLauncher, WorkItem};

/// Options of [`dry_run`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DryRunOptions {
    /// Attempt number rendered (1 for the first submission).
    pub attempt: u32,
    /// Replace values of environment variables whose names contain TOKEN, KEY, SECRET or
    /// PASSWORD (in `export NAME=...` prerun lines and in process environments) by
    /// `<redacted>`. On for anything shown or logged; the executor renders with it off.
    pub redact_secrets: bool,
    /// Nodes the campaign excluded (its controller's `node_excluded` records, see
    /// [`CampaignHistory::excluded_nodes`](crate::report::CampaignHistory::excluded_nodes)):
    /// rendered as one `#SBATCH --exclude=` line, as the controller submits them.
    #[serde(default)]
    pub exclude_nodes: Vec<String>,
}

impl Default for DryRunOptions {
    fn default() -> Self {
        DryRunOptions {
            attempt: 1,
            redact_secrets: true,
            exclude_nodes: Vec::new(),
        }
    }
}

/// One process to start (local and bare metal).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessLaunch {
    /// Host it runs on (`None`: this machine).
    pub host: Option<String>,
    /// The argv (for bare metal: the `ssh` argv).
    pub argv: Vec<String>,
    /// Environment added to the process.
    pub env: Vec<(String, String)>,
    /// Working directory.
    pub cwd: Option<String>,
}

/// What one stage attempt would submit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageSubmission {
    /// Stage id.
    pub stage_id: String,
    /// Attempt number.
    pub attempt: u32,
    /// Job name (carries the campaign hash, stage and attempt).
    pub job_name: String,
    /// Work ids covered.
    pub work_ids: Vec<String>,
    /// The sbatch script (Slurm).
    pub sbatch_script: Option<String>,
    /// The processes (local, bare metal).
    pub processes: Vec<ProcessLaunch>,
    /// One line per node: which instances use which GPUs.
    pub placement: Vec<String>,
}

/// The dry run of a plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DryRun {
    /// One submission per stage that runs a job, in plan order.
    pub submissions: Vec<StageSubmission>,
    /// The manual decision stages (no job), in plan order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<DecisionPreview>,
}

/// What a manual decision stage will ask (it submits no job).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
pub fn decision_file_name(stage_id: &str) -> String {
    format!("decisions/{stage_id}.txt")
}

pub use crate::executor::shell::quote as shell_quote;
use crate::executor::shell::{is_secret_name, redact_line};

fn directive_value(stage: &str, what: &str, v: &str) -> Result<String, PlanError> {
    if v.chars().any(|c| c.is_control()) {
        return Err(PlanError::InvalidValue {
            file: "<plan>".into(),
            path: format!("stage `{stage}` sbatch {what}"),
            value: format!("{v:?}"),
            expected: "a value without control characters (newlines would end the #SBATCH line)"
                .into(),
        });
    }
    Ok(shell_quote(v))
}

fn no_nul(stage: &str, v: &str) -> Result<(), PlanError> {
    if v.contains('\0') {
        return Err(PlanError::InvalidValue {
            file: "<plan>".into(),
            path: format!("stage `{stage}` command"),
            value: format!("{v:?}"),
            expected: "arguments without NUL characters".into(),
        });
    }
    Ok(())
}

/// Where workers find the resolved config, relative to the campaign folder.
pub const RESOLVED_CONFIG_FILE: &str = ".puzzletron/resolved-config.json";

fn campaign_dir(plan: &CampaignPlan) -> String {
    plan.puzzle_dir.clone().unwrap_or_else(|| ".".to_string())
}

/// The payload argv of a work item: the stage command with its placeholders filled.
pub fn item_argv(
    plan: &CampaignPlan,
    stage: &StagePlan,
    item: &WorkItem,
) -> Result<Vec<String>, PlanError> {
    if stage.command.is_empty() {
        return Err(PlanError::WorkPlan {
            stage: stage.stage_id.clone(),
            reason: "the stage has no command (give `command: [...]` in its catalog entry)".into(),
        });
    }
    let config = format!("{}/{}", campaign_dir(plan), RESOLVED_CONFIG_FILE);
    stage
        .command
        .iter()
        .map(|a| {
            let v = a
                .replace("{stage_id}", &stage.stage_id)
                .replace("{work_id}", &item.work_id)
                .replace("{shard_index}", &item.shard_index.to_string())
                .replace("{shard_count}", &item.shard_count.to_string())
                .replace("{config}", &config);
            no_nul(&stage.stage_id, &v)?;
            Ok(v)
        })
        .collect()
}

fn group_items<'a>(stage: &'a StagePlan, group: &TaskGroup) -> impl Iterator<Item = &'a WorkItem> {
    let instance = group.instance;
    stage
        .work
        .items
        .iter()
        .filter(move |i| i.instance == instance)
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
            };
            format!(
                "node {n} ({name}, {}/{} GPUs): {text}",
                a.gpus_on_node(n as u32),
                a.gpus_per_node
            )
        })
        .collect()
}

fn torchrun_prefix(launcher: &TaskLauncher, group: &TaskGroup, endpoint_addr: &str) -> Vec<String> {
    match (launcher, &group.rendezvous) {
        (
            TaskLauncher::Torchrun {
                nnodes,
                nproc_per_node,
            },
            Some(r),
        ) => vec![
            "torchrun".into(),
            format!("--nnodes={nnodes}"),
            format!("--nproc_per_node={nproc_per_node}"),
            "--rdzv_backend=c10d".into(),
            format!("--rdzv_endpoint={endpoint_addr}:{}", r.master_port),
            format!("--rdzv_id={}", r.rdzv_id),
            "--no-python".into(),
        ],
        _ => Vec::new(),
    }
}

/// Renders what each stage attempt would submit.
///
/// # Errors
/// [`PlanError::WorkPlan`] for a stage without a command; [`PlanError::InvalidValue`] for a
/// value that cannot be written safely (control characters in an `#SBATCH` directive, NUL in
/// an argument).
pub fn dry_run(plan: &CampaignPlan, options: &DryRunOptions) -> Result<DryRun, PlanError> {
    let mut submissions = Vec::with_capacity(plan.stages.len());
    let mut decisions = Vec::new();
    for stage in &plan.stages {
        if let Some(d) = &stage.decision {
            decisions.push(DecisionPreview {
                stage_id: stage.stage_id.clone(),
                input: d.input.clone(),
                candidates: d.candidates.clone(),
                decision_file: decision_file_name(&stage.stage_id),
            });
            continue;
        }
        let job_name = format!(
            "pz-{}-{}-a{}",
            plan.contract_hash.short(),
            stage.stage_id,
            options.attempt
        );
        let work_ids = stage.work.items.iter().map(|i| i.work_id.clone()).collect();
        let placement = placement_lines(plan, stage);
        let (sbatch_script, processes) = match plan.runner.kind {
            RunnerKind::Slurm => (
                Some(sbatch_script(plan, stage, &job_name, options)?),
                Vec::new(),
            ),
            RunnerKind::Local | RunnerKind::Baremetal => (None, processes(plan, stage, options)?),
        };
        submissions.push(StageSubmission {
            stage_id: stage.stage_id.clone(),
            attempt: options.attempt,
            job_name,
            work_ids,
            sbatch_script,
            processes,
            placement,
        });
    }
    Ok(DryRun {
        submissions,
        decisions,
    })
}

fn sbatch_script(
    plan: &CampaignPlan,
    stage: &StagePlan,
    job_name: &str,
    options: &DryRunOptions,
) -> Result<String, PlanError> {
    let sid = &stage.stage_id;
    let slurm = plan.runner.slurm.clone().unwrap_or_default();
    let contract = &plan.runner.execution_contract;
    let t = &stage.work.topology;
    let mut s = String::new();
    let _ = writeln!(s, "#!/bin/bash");
    let _ = writeln!(
        s,
        "#SBATCH --job-name={}",
        directive_value(sid, "job-name", job_name)?
    );
    if let Some(a) = &slurm.account {
        let _ = writeln!(
            s,
            "#SBATCH --account={}",
            directive_value(sid, "account", a)?
        );
    }
    let partition = slurm.resolve_partition(stage.spec.partition.as_deref());
    if !partition.is_empty() {
        let _ = writeln!(
            s,
            "#SBATCH --partition={}",
            directive_value(sid, "partition", &partition.to_slurm())?
        );
    }
    if let Some(q) = &slurm.qos {
        let _ = writeln!(s, "#SBATCH --qos={}", directive_value(sid, "qos", q)?);
    }
    if let Some(c) = &slurm.constraint {
        let _ = writeln!(
            s,
            "#SBATCH --constraint={}",
            directive_value(sid, "constraint", c)?
        );
    }
    let _ = writeln!(s, "#SBATCH --nodes={}", t.nodes);
    let _ = writeln!(s, "#SBATCH --ntasks={}", t.task_count);
    if t.gpus_per_node > 0 {
        let _ = writeln!(s, "#SBATCH --gpus-per-node={}", t.gpus_per_node);
    }
    if t.exclusive {
        let _ = writeln!(s, "#SBATCH --exclusive");
    }
    if !options.exclude_nodes.is_empty() {
        let mut nodes = options.exclude_nodes.clone();
        nodes.sort();
        nodes.dedup();
        let _ = writeln!(
            s,
            "#SBATCH --exclude={}",
            directive_value(sid, "exclude", &nodes.join(","))?
        );
    }
    let time_limit = stage.spec.time_limit.as_ref().or(slurm.time_limit.as_ref());
    if let Some(tl) = time_limit {
        let _ = writeln!(
            s,
            "#SBATCH --time={}",
            directive_value(sid, "time", tl.as_str())?
        );
    }
    let warning = stage.spec.warning_signal.as_ref();
    if let Some(w) = warning {
        let _ = writeln!(
            s,
            "#SBATCH --signal={}",
            directive_value(sid, "signal", &format!("B:{w}"))?
        );
        for p in super::execution::warning_signal_problems(
            w,
            time_limit.map(|t| t.as_duration()),
            stage.resumable,
            stage.spec.distributed,
        ) {
            let _ = writeln!(s, "# WARNING: {p}");
        }
    }
    let log_dir = slurm.log_dir.clone().unwrap_or_else(|| "logs".into());
    let _ = writeln!(
        s,
        "#SBATCH --output={}",
        directive_value(sid, "output", &format!("{log_dir}/%x-%j.out"))?
    );
    let _ = writeln!(s, "set -euo pipefail");
    let _ = writeln!(
        s,
        "# stage {sid}: {} x {} ({}), mesh {}",
        stage.spec.instances,
        stage.spec.strategy,
        t.launcher.name(),
        stage.spec.mesh
    );
    for line in placement_lines(plan, stage) {
        let _ = writeln!(s, "# {line}");
    }
    if !contract.prerun_commands.is_empty() {
        let _ = writeln!(s, "# prerun_commands (runner.execution_contract, verbatim)");
        for c in &contract.prerun_commands {
            let _ = writeln!(
                s,
                "{}",
                if options.redact_secrets {
                    redact_line(c)
                } else {
                    c.clone()
                }
            );
        }
    }
    let _ = writeln!(
        s,
        "mapfile -t nodes < <(scontrol show hostnames \"$SLURM_JOB_NODELIST\")"
    );
    let _ = writeln!(s, "pids=()");
    if let Some(w) = warning {
        // N03: forward the warning signal (and Slurm's TERM at the limit) to every step.
        for sig in [w.signal.as_str(), "TERM"] {
            let _ = writeln!(s, "trap 'kill -s {sig} \"${{pids[@]}}\" 2>/dev/null' {sig}");
            if w.signal == "TERM" {
                break;
            }
        }
    }
    let repo = contract.repository.clone().unwrap_or_else(|| ".".into());
    let venv = contract.venv.clone().unwrap_or_default();
    for group in &stage.work.topology.groups {
        let p = &group.placement;
        let addr = match group.rendezvous.as_ref().map(|r| &r.master_addr) {
            Some(MasterAddr::Host(h)) => shell_quote(h),
            _ => format!("\"${{nodes[{}]}}\"", p.node),
        };
        for item in group_items(stage, group) {
            let mut argv = torchrun_prefix(&t.launcher, group, "__ADDR__");
            argv.extend(item_argv(plan, stage, item)?);
            let mut line = String::new();
            if let Some(r) = &group.rendezvous {
                let _ = write!(line, "MASTER_ADDR={addr} MASTER_PORT={} ", r.master_port);
            }
            let _ = write!(
                line,
                "PUZZLETRON_WORK_ID={} PUZZLETRON_ATTEMPT={} ",
                shell_quote(&item.work_id),
                options.attempt
            );
            let _ = write!(
                line,
                "srun --relative={} --nodes={} --ntasks={} --ntasks-per-node=1 --exact",
                p.node, p.node_count, p.node_count
            );
            if p.gpus_on_node > 0 {
                let _ = write!(line, " --gpus-per-task={}", p.gpus_on_node);
            }
            if let Some(img) = &contract.container {
                let _ = write!(line, " --container-image={}", shell_quote(img));
                if let Some(m) = contract.container_mounts.as_ref().filter(|m| !m.is_empty()) {
                    let _ = write!(line, " --container-mounts={}", shell_quote(m));
                }
            }
            // The payload: cd to the repository, activate the venv, exec the argv. Values are
            // positional parameters, never part of the -c script text.
            let _ = write!(
                line,
                " bash -c 'cd -- \"$1\" && if [ -n \"$2\" ]; then source \"$2/bin/activate\"; fi && shift 2 && exec \"$@\"' bash {} {}",
                shell_quote(&repo),
                shell_quote(&venv)
            );
            for a in &argv {
                if a.contains("__ADDR__") {
                    let (pre, post) = a.split_once("__ADDR__").unwrap_or((a, ""));
                    let _ = write!(line, " {}{addr}{}", shell_quote(pre), shell_quote(post));
                } else {
                    let _ = write!(line, " {}", shell_quote(a));
                }
            }
            let _ = writeln!(s, "{line} &");
            let _ = writeln!(s, "pids+=($!)");
        }
    }
    let _ = writeln!(s, "rc=0");
    if warning.is_some() {
        // A trapped signal interrupts `wait` while the step runs: wait again until it exits.
        let _ = writeln!(
            s,
            "for pid in \"${{pids[@]}}\"; do while :; do r=0; wait \"$pid\" || r=$?; kill -0 \"$pid\" 2>/dev/null || break; done; [ \"$r\" -eq 0 ] || rc=$r; done"
        );
    } else {
        let _ = writeln!(
            s,
            "for pid in \"${{pids[@]}}\"; do wait \"$pid\" || rc=$?; done"
        );
    }
    if !contract.postrun_commands.is_empty() {
        let _ = writeln!(
            s,
            "# postrun_commands (runner.execution_contract, verbatim)"
        );
        for c in &contract.postrun_commands {
            let _ = writeln!(
                s,
                "{}",
                if options.redact_secrets {
                    redact_line(c)
                } else {
                    c.clone()
                }
            );
        }
    }
    let _ = writeln!(s, "exit \"$rc\"");
    Ok(s)
}

fn processes(
    plan: &CampaignPlan,
    stage: &StagePlan,
    options: &DryRunOptions,
) -> Result<Vec<ProcessLaunch>, PlanError> {
    let contract = &plan.runner.execution_contract;
    let t = &stage.work.topology;
    let hosts: Vec<String> = plan
        .runner
        .inventory
        .as_ref()
        .map(|i| i.hosts.iter().map(|h| h.hostname.clone()).collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    for group in &t.groups {
        let p = &group.placement;
        let addr = match group.rendezvous.as_ref().map(|r| &r.master_addr) {
            Some(MasterAddr::Host(h)) => h.clone(),
            _ => "127.0.0.1".into(),
        };
        for item in group_items(stage, group) {
            for node in p.nodes() {
                let mut argv = torchrun_prefix(&t.launcher, group, &addr);
                argv.extend(item_argv(plan, stage, item)?);
                let mut env: Vec<(String, String)> = Vec::new();
                if p.gpus_on_node > 0 {
                    let ids: Vec<String> = p.local_gpu_ids().map(|g| g.to_string()).collect();
                    env.push(("CUDA_VISIBLE_DEVICES".into(), ids.join(",")));
                }
                if let Some(r) = &group.rendezvous {
                    env.push(("MASTER_ADDR".into(), addr.clone()));
                    env.push(("MASTER_PORT".into(), r.master_port.to_string()));
                }
                env.push(("PUZZLETRON_WORK_ID".into(), item.work_id.clone()));
                env.push(("PUZZLETRON_ATTEMPT".into(), options.attempt.to_string()));
                if plan.runner.kind == RunnerKind::Baremetal {
                    let host = hosts.get(node as usize).cloned().unwrap_or_default();
                    let mut remote: Vec<String> = vec![
                        "cd".into(),
                        "--".into(),
                        shell_quote(contract.repository.as_deref().unwrap_or(".")),
                    ];
                    if let Some(setup) = &contract.setup_env {
                        remote.extend(["&&".into(), ".".into(), shell_quote(setup)]);
                    }
                    if let Some(v) = &contract.venv {
                        remote.extend([
                            "&&".into(),
                            ".".into(),
                            shell_quote(&format!("{v}/bin/activate")),
                        ]);
                    }
                    remote.extend(["&&".into(), "exec".into(), "env".into()]);
                    for (k, v) in &env {
                        let v = if options.redact_secrets && is_secret_name(k) {
                            "<redacted>".to_string()
                        } else {
                            v.clone()
                        };
                        remote.push(format!("{k}={}", shell_quote(&v)));
                    }
                    remote.extend(argv.iter().map(|a| shell_quote(a)));
                    out.push(ProcessLaunch {
                        host: Some(host.clone()),
                        argv: vec![
                            "ssh".into(),
                            "-o".into(),
                            "BatchMode=yes".into(),
                            "--".into(),
                            host,
                            remote.join(" "),
                        ],
                        env: Vec::new(),
                        cwd: None,
                    });
                } else {
                    let env = env
                        .into_iter()
                        .map(|(k, v)| {
                            if options.redact_secrets && is_secret_name(&k) {
                                (k, "<redacted>".into())
                            } else {
                                (k, v)
                            }
                        })
                        .collect();
                    out.push(ProcessLaunch {
                        host: None,
                        argv,
                        env,
                        cwd: contract.repository.clone(),
                    });
                }
            }
        }
    }
    Ok(out)
}

/// The dry run as text: per stage, the job (script or processes) and the GPU placement; then
/// the [`PlanSummary`](super::PlanSummary) table (per stage, and the total node-hours).
///
/// # Errors
/// As [`dry_run`].
pub fn render_dry_run(plan: &CampaignPlan, options: &DryRunOptions) -> Result<String, PlanError> {
    let dr = dry_run(plan, options)?;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "campaign {} ({} runner), contract {}",
        plan.experiment_config_path,
        plan.runner.kind.as_str(),
        plan.contract_hash
    );
    for sub in &dr.submissions {
        let stage = plan.stage(&sub.stage_id);
        let _ = writeln!(
            s,
            "\n=== stage {} (attempt {}) job {} ===",
            sub.stage_id, sub.attempt, sub.job_name
        );
        if let Some(st) = stage {
            let a = &st.spec.allocation;
            let _ = writeln!(
                s,
                "{} x {} | mesh {} | {} GPU(s)/instance | {} node(s), {} GPU(s){} | parents: {}",
                st.spec.instances,
                st.spec.strategy,
                st.spec.mesh,
                a.gpus_per_instance,
                a.nodes,
                a.total_gpus,
                if a.exclusive { ", exclusive" } else { "" },
                if st.parents.is_empty() {
                    "-".to_string()
                } else {
                    st.parents.join(", ")
                }
            );
        }
        let _ = writeln!(s, "placement:");
        for line in &sub.placement {
            let _ = writeln!(s, "  {line}");
        }
        if let Some(script) = &sub.sbatch_script {
            let _ = writeln!(s, "sbatch script:");
            s.push_str(script);
        }
        for p in &sub.processes {
            let env: Vec<String> = p
                .env
                .iter()
                .map(|(k, v)| format!("{k}={}", shell_quote(v)))
                .collect();
            let argv: Vec<String> = p.argv.iter().map(|a| shell_quote(a)).collect();
            let _ = writeln!(
                s,
                "{}{}{}{}",
                p.cwd
                    .as_ref()
                    .map(|c| format!("(cd {}) ", shell_quote(c)))
                    .unwrap_or_default(),
                env.join(" "),
                if env.is_empty() { "" } else { " " },
                argv.join(" ")
            );
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
mod tests {
    use super::*;

    #[test]
    fn directive_values_refuse_newlines() {
        assert!(directive_value("s", "account", "a\nrm -rf ~").is_err());
        assert_eq!(directive_value("s", "account", "acct").unwrap(), "acct");
    }
}
