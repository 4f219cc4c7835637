//! `puzzletron campaign ...`.

use std::collections::HashMap;

use crate::report::AttemptTimes;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{CampaignCmd, CliError, ControllerArgs, PlanArgs, RetryArgs, RunArgs, exit};
use crate::campaign::controller::{
    CampaignController, ControllerError, ControllerEvent, PoolItem, RetryPolicy, RunOptions,
    TerminalControls, ViewMode, open_campaign_dir,
};
use crate::campaign::dryrun::{DryRunOptions, dry_run, render_dry_run};
use crate::campaign::{
    CampaignPlan, ExecutionConfig, RunnerEnvironment, RunnerKind, StageFilter,
    compile_campaign_plan, plan_to_dict,
};
use crate::executor::Executor;
use crate::report::{
    CampaignHistory, LeaseStatus, Notifier, NotifyEvent, StageStatus, attempts_csv_name,
    render_campaign_report_files,
};

pub(super) fn run(cmd: CampaignCmd) -> Result<i32, CliError> {
    match cmd {
        CampaignCmd::Compile { plan, json } => compile_cmd(&plan, json),
        CampaignCmd::DryRun {
            plan,
            dir,
            gpus,
            command_prefix,
            json,
        } => dry_run_cmd(&plan, dir, &gpus, command_prefix.as_deref(), json),
        CampaignCmd::Run(args) => run_cmd(*args),
        CampaignCmd::Retry(args) => retry_cmd(*args),
        CampaignCmd::Status { dir, json, watch } => status_cmd(&dir, json, watch),
        CampaignCmd::Cancel { dir, tag, wait } => match (dir, tag) {
            (_, Some(tag)) => cancel_tag(&tag),
            (Some(dir), None) => cancel_dir(&dir, Duration::from_secs(wait)),
            (None, None) => Err(CliError {
                code: exit::USAGE,
                message: "cancel needs a campaign folder or --tag T".into(),
            }),
        },
        CampaignCmd::Report { dir, out, no_sacct } => report_cmd(&dir, out, !no_sacct),
        CampaignCmd::GpuPreflight => {
            match crate::executor::gpu::preflight(|k| std::env::var(k).ok()) {
                Ok(device) => {
                    println!("{device}");
                    Ok(exit::DONE)
                }
                Err(e) => Err(CliError {
                    code: crate::executor::gpu::PREFLIGHT_EXIT_CODE,
                    message: e.to_string(),
                }),
            }
        }
    }
}

/// Compiles the plan the arguments describe.
pub(crate) fn compile(args: &PlanArgs) -> Result<CampaignPlan, CliError> {
    let runner = if args.runner == "local" {
        RunnerEnvironment::local()
    } else {
        RunnerEnvironment::load(&args.runner)?
    };
    let execution = match &args.execution {
        Some(p) => ExecutionConfig::load(p)?,
        None => ExecutionConfig::default(),
    };
    let filter = (!args.stages.is_empty()).then(|| StageFilter::only(args.stages.clone()));
    let overrides = crate::campaign::config::parse_overrides(&args.overrides)?;
    compile_campaign_plan(
        &args.experiment,
        &runner,
        &execution,
        &overrides,
        filter.as_ref(),
    )
    .map_err(|e| {
        // A runner limit names the line of the runner file that sets it.
        let e = if args.runner == "local" {
            e
        } else {
            e.locate_runner(Path::new(&args.runner))
        };
        e.into()
    })
}

/// The plan as a table: one line per stage.
pub(crate) fn plan_table(plan: &CampaignPlan) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "campaign {} (runner {}, contract {}): {} stages, {} work items",
        plan.experiment_config_path,
        plan.runner.kind.as_str(),
        &plan.contract_hash.to_string()[..12],
        plan.stages.len(),
        plan.work_item_count()
    );
    let w = plan
        .stages
        .iter()
        .map(|s| s.stage_id.len())
        .max()
        .unwrap_or(5)
        .max(5);
    // The partition each job is submitted to (the runner's, or the stage's role or list), as
    // the sbatch scripts write it; `-` when not Slurm or the cluster's default.
    let summary = crate::campaign::PlanSummary::of(plan);
    let pw = summary
        .stages
        .iter()
        .filter_map(|s| s.partition.as_deref().map(str::len))
        .max()
        .unwrap_or(0)
        .max(10);
    let _ = writeln!(
        o,
        "{:<w$}  {:<15}  {:>9}  {:>11}  {:>5}  {:<8}  {:<pw$}  parents",
        "stage", "strategy", "instances", "nodes x gpu", "gpus", "resource", "partition"
    );
    for (s, row) in plan.stages.iter().zip(&summary.stages) {
        let a = &s.spec.allocation;
        if let Some(d) = &s.decision {
            // No job: a person chooses among the input's work items.
            let _ = writeln!(
                o,
                "{:<w$}  {:<15}  {:>9}  {:>11}  {:>5}  {:<8}  {:<pw$}  {}",
                s.stage_id,
                "manual decision",
                "-",
                "-",
                0,
                "-",
                "-",
                s.parents.join(",")
            );
            let _ = writeln!(
                o,
                "  chooses among {} work item(s) of {}; off a terminal, write <dir>/{}",
                d.candidates.len(),
                d.input,
                crate::campaign::dryrun::decision_file_name(&s.stage_id)
            );
            continue;
        }
        let _ = writeln!(
            o,
            "{:<w$}  {:<15}  {:>9}  {:>11}  {:>5}  {:<8}  {:<pw$}  {}",
            s.stage_id,
            s.spec.strategy.as_str(),
            s.spec.instances,
            format!("{} x {}", a.nodes, a.gpus_per_node),
            a.total_gpus,
            s.spec.resource.as_str(),
            row.partition.as_deref().unwrap_or("-"),
            if s.parents.is_empty() {
                "-".to_string()
            } else {
                s.parents.join(",")
            }
        );
    }
    o
}

/// The warnings of a compiled plan, one per line, as the text output prints them: each
/// override the compiler does not read (passed to the workers unchecked, with a type change
/// noted, e.g. `pruning.eval_samples=abc (was int, now string)`).
pub(crate) fn plan_warnings(plan: &CampaignPlan) -> Vec<String> {
    plan.unchecked_overrides
        .iter()
        .map(|o| {
            format!(
                "override passed to the workers unchecked (a key the compiler does not read): {o}"
            )
        })
        .collect()
}

/// `value` (a JSON object) with a `warnings` list ([`plan_warnings`]; empty when none), so
/// `--json` says what the text output warns about.
fn with_warnings(mut value: serde_json::Value, plan: &CampaignPlan) -> serde_json::Value {
    if let Some(o) = value.as_object_mut() {
        o.insert("warnings".into(), plan_warnings(plan).into());
        o.insert("unchecked_keys".into(), plan.unchecked_keys.clone().into());
    }
    value
}

/// The line listing the experiment's top-level keys the compiler does not read (passed to the
/// workers unchecked), or `None` when there are none.
pub(crate) fn unchecked_keys_line(plan: &CampaignPlan) -> Option<String> {
    (!plan.unchecked_keys.is_empty()).then(|| {
        format!(
            "keys passed to the workers unchecked (the compiler does not read them): {}",
            plan.unchecked_keys.join(", ")
        )
    })
}

fn compile_cmd(args: &PlanArgs, json: bool) -> Result<i32, CliError> {
    let plan = compile(args)?;
    if json {
        let v = with_warnings(plan_to_dict(&plan), &plan);
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", plan_table(&plan));
        if let Some(line) = unchecked_keys_line(&plan) {
            println!("{line}");
        }
        if !plan.unchecked_overrides.is_empty() {
            println!(
                "overrides passed to the workers unchecked (keys the compiler does not read): {}",
                plan.unchecked_overrides.join(" ")
            );
        }
    }
    Ok(exit::DONE)
}

fn dry_run_cmd(
    args: &PlanArgs,
    dir: Option<PathBuf>,
    gpus: &[String],
    command_prefix: Option<&str>,
    json: bool,
) -> Result<i32, CliError> {
    let mut plan = compile(args)?;
    if let Some(p) = command_prefix {
        prefix_commands(&mut plan, p)?;
    }
    // Without --dir, a temporary folder stands for the campaign folder (and is removed).
    let scratch = match &dir {
        Some(_) => None,
        None => Some(ScratchDir::new()?),
    };
    let dir = match (&dir, &scratch) {
        (Some(d), _) => {
            crate::executor::resolve_dir(d).map_err(|e| CliError::new(e.to_string()))?
        }
        (None, Some(s)) => s.0.join("campaign"),
        (None, None) => unreachable!("a scratch folder when no --dir"),
    };
    let mut opts = DryRunOptions {
        campaign_dir: dir.clone(),
        ..DryRunOptions::default()
    };
    // An existing campaign: the next run's attempt ids carry its tag and revision, and its
    // excluded nodes.
    if dir.join("controller").join("journal.jsonl").is_file()
        && let Ok(h) = CampaignHistory::load(&dir, false)
    {
        if let Some(n) = h.nonce {
            opts.tag = n;
        }
        opts.revision = h.revision;
        opts.exclude_nodes = h.excluded_nodes.into_iter().map(|(_, n, _)| n).collect();
    }
    let executor = executor_for(&plan, &dir, gpus, None)?;
    if json {
        let v = with_warnings(
            serde_json::to_value(dry_run(&plan, &opts, executor.as_ref())?)?,
            &plan,
        );
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", plan_table(&plan));
        if let Some(line) = unchecked_keys_line(&plan) {
            println!("{line}");
        }
        println!();
        print!("{}", render_dry_run(&plan, &opts, executor.as_ref())?);
    }
    Ok(exit::DONE)
}

/// A temporary folder removed when dropped.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new() -> Result<Self, CliError> {
        let p = std::env::temp_dir().join(format!(
            "puzzletron-dry-run-{}-{}",
            std::process::id(),
            crate::executor::now_ms()
        ));
        std::fs::create_dir_all(&p)
            .map_err(|e| CliError::new(format!("creating {}: {e}", p.display())))?;
        Ok(Self(p))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Puts `prefix` (split at spaces) before every stage command.
fn prefix_commands(plan: &mut CampaignPlan, prefix: &str) -> Result<(), CliError> {
    let prefix = split_cmd("--command-prefix", prefix)?;
    for s in &mut plan.stages {
        let mut c = prefix.clone();
        c.append(&mut s.worker.command);
        s.worker.command = c;
    }
    Ok(())
}

/// Splits a command given as one string at whitespace (no quoting: paths with spaces need a
/// wrapper script).
fn split_cmd(flag: &str, s: &str) -> Result<Vec<String>, CliError> {
    let v: Vec<String> = s.split_whitespace().map(str::to_string).collect();
    if v.is_empty() {
        return Err(CliError {
            code: exit::USAGE,
            message: format!("{flag} {s:?}: expected a program and its arguments"),
        });
    }
    Ok(v)
}

fn load_pool_items(spec: &str) -> Result<(String, Vec<PoolItem>), CliError> {
    let usage = |m: String| CliError {
        code: exit::USAGE,
        message: m,
    };
    let (stage, file) = spec.split_once('=').ok_or_else(|| {
        usage(format!(
            "--pool-items {spec:?}: expected STAGE=FILE (FILE a JSON array of {{\"id\", \"payload\"}})"
        ))
    })?;
    let text = std::fs::read_to_string(file)
        .map_err(|e| CliError::new(format!("reading --pool-items file {file}: {e}")))?;
    #[derive(serde::Deserialize)]
    struct Item {
        id: String,
        #[serde(default)]
        payload: serde_json::Value,
    }
    let items: Vec<Item> = serde_json::from_str(&text).map_err(|e| {
        CliError::new(format!(
            "{file} line {} column {}: {e}; expected a JSON array of {{\"id\": \"...\", \"payload\": ...}}",
            e.line(),
            e.column()
        ))
    })?;
    Ok((
        stage.to_string(),
        items
            .into_iter()
            .map(|i| PoolItem::new(i.id, i.payload))
            .collect(),
    ))
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::new(format!("cannot start the async runtime: {e}")))
}

/// The executor `campaign run` uses for the plan's runner, on the campaign folder `dir`
/// (the dry run renders with the same one).
fn executor_for(
    plan: &CampaignPlan,
    dir: &Path,
    gpus: &[String],
    max_concurrent: Option<usize>,
) -> Result<Arc<dyn Executor>, CliError> {
    Ok(Arc::from(crate::campaign::dryrun::default_executor(
        plan,
        dir,
        gpus,
        max_concurrent,
    )?))
}

/// What a controller run takes besides the plan (`campaign run` and `campaign retry`).
struct Launch<'a> {
    dir: &'a Path,
    /// The options `campaign run` and `campaign retry` share.
    opts: &'a ControllerArgs,
    new_revision: bool,
    once: bool,
    /// `campaign retry`: who asks (the failed units run again).
    retry_by: Option<String>,
}

fn run_cmd(a: RunArgs) -> Result<i32, CliError> {
    if a.detach {
        return detach(&a.dir);
    }
    let mut plan = compile(&a.plan)?;
    // A placeholder of the shared runner files never reaches a job (the dry run shows it).
    if a.plan.runner != "local" {
        plan.runner
            .check_placeholders(&a.plan.runner)
            .map_err(|e| CliError::from(e.locate_runner(Path::new(&a.plan.runner))))?;
    }
    if let Some(p) = &a.command_prefix {
        prefix_commands(&mut plan, p)?;
    }
    launch(
        plan,
        &Launch {
            dir: &a.dir,
            opts: &a.controller,
            new_revision: a.new_revision,
            once: a.once,
            retry_by: None,
        },
    )
}

/// `campaign retry D`: the campaign's own plan, its failed units run again in place.
fn retry_cmd(a: RetryArgs) -> Result<i32, CliError> {
    let h = CampaignHistory::load(&a.dir, false)?;
    if a.detach {
        return detach(&a.dir);
    }
    let plan_path = a.dir.join("controller").join("plan.json");
    let plan: CampaignPlan = serde_json::from_slice(
        &std::fs::read(&plan_path)
            .map_err(|e| CliError::new(format!("reading {}: {e}", plan_path.display())))?,
    )
    .map_err(|e| CliError::new(format!("{}: {e}", plan_path.display())))?;
    for s in &a.controller.allow_oom_retry {
        if plan.stage(s).is_none() {
            return Err(CliError {
                code: exit::USAGE,
                message: format!(
                    "--allow-oom-retry {s}: not a stage of the campaign ({})",
                    plan.stage_ids().join(", ")
                ),
            });
        }
    }
    let failed: Vec<&str> = h
        .stages
        .iter()
        .filter(|s| s.status == StageStatus::Failed)
        .map(|s| s.id.as_str())
        .collect();
    if failed.is_empty() {
        eprintln!("no failed stage to retry: resuming the campaign");
    } else {
        eprintln!("retrying in place: {}", failed.join(", "));
    }
    launch(
        plan,
        &Launch {
            dir: &a.dir,
            opts: &a.controller,
            new_revision: false,
            once: false,
            retry_by: Some(format!(
                "`puzzletron campaign retry` ({})",
                crate::campaign::controller::who_am_i()
            )),
        },
    )
}

fn launch(plan: CampaignPlan, a: &Launch<'_>) -> Result<i32, CliError> {
    let notifier = match a.opts.notify.as_deref() {
        Some(n) => Some(Arc::new(Notifier::new(split_cmd("--notify", n)?).map_err(
            |m| CliError {
                code: exit::USAGE,
                message: format!("--notify: {m}"),
            },
        )?)),
        None => None,
    };
    let pools = a
        .opts
        .pool_items
        .iter()
        .map(|p| load_pool_items(p))
        .collect::<Result<Vec<_>, _>>()?;
    let dir = open_campaign_dir(a.dir)?;
    let rt = runtime()?;
    let kind = plan.runner.kind;
    let code = rt.block_on(async {
        let executor = executor_for(&plan, &dir, &a.opts.gpus, a.opts.max_concurrent)?;
        let (controls, rx) = TerminalControls::start()
            .map_err(|e| CliError::new(format!("installing the signal handlers: {e}")))?;
        let poll = Duration::from_millis(a.opts.poll_ms.max(10));
        let mut retry = RetryPolicy::default();
        if let Some(ms) = a.opts.retry_delay_ms {
            retry.base_delay = Duration::from_millis(ms);
        }
        let mut b = CampaignController::builder()
            .plan(plan)
            .executor(executor)
            .campaign_dir(&dir)
            .poll_interval(poll, poll * 10)
            .retry_policy(retry)
            .adopt_grace(Duration::from_secs(if kind == RunnerKind::Slurm {
                30
            } else {
                5
            }))
            .new_revision(a.new_revision)
            .controls(rx)
            .view(if a.opts.quiet {
                ViewMode::Off
            } else {
                ViewMode::Auto
            });
        if let Some(s) = a.opts.output_visibility_wait {
            b = b.output_visibility_wait(Duration::from_secs(s));
        }
        if let Some(s) = a.opts.fast_failure_window {
            b = b.fast_failure_window(Duration::from_secs(s));
        }
        if let Some(p) = controls.prompter() {
            // On a terminal, manual decisions are asked; otherwise the decision file is read.
            b = b.decision_prompt(p);
        }
        for s in &a.opts.allow_oom_retry {
            b = b.allow_oom_retry(s.clone());
        }
        for (stage, items) in pools {
            b = b.pool_items(stage, move |_| Ok(items.clone()));
        }
        b = b.on_event(|ev| {
            // Progress is in the live view; print what a person should see in a log.
            if ev.is_problem()
                || matches!(
                    ev,
                    ControllerEvent::StageDone { .. }
                        | ControllerEvent::Recovered { .. }
                        | ControllerEvent::Revision { .. }
                        | ControllerEvent::ShutDown { .. }
                        | ControllerEvent::DecisionNeeded { .. }
                        | ControllerEvent::DecisionMade { .. }
                )
            {
                eprintln!("[{}] {ev}", ev.kind());
            }
        });
        if let Some(n) = &notifier {
            b = b.subscribe(n.clone());
        }
        let mut ctl = b.build().map_err(|e| {
            let mut m = e.to_string();
            if matches!(e, ControllerError::ContractChanged { .. }) {
                m.push_str(
                    "\nhint: run again with --new-revision to cancel the old attempts and start \
                     over with the new settings, or use the old settings",
                );
            }
            CliError::new(m)
        })?;
        let report = ctl
            .run(RunOptions {
                once: a.once,
                retry_failed: a.retry_by.is_some(),
                retry_by: a.retry_by.clone(),
                ..RunOptions::default()
            })
            .await?;
        drop(controls);
        if a.opts.quiet {
            eprintln!("{report}");
        }
        for d in &report.decisions {
            eprintln!(
                "decision needed: stage {} waits; write {} with `all`, `none`, or candidate \
                 numbers (1-{}) or ids, then run again (or let a running controller pick it up)",
                d.stage,
                d.file.display(),
                d.candidates.len()
            );
        }
        let code = if report.is_complete() {
            exit::DONE
        } else if !report.failed.is_empty() && report.live == 0 && !report.detached {
            exit::FAILED
        } else {
            exit::INCOMPLETE
        };
        if code != exit::INCOMPLETE {
            // The campaign ended: its report, and the notification.
            match write_report(&dir, None, kind == RunnerKind::Slurm) {
                Ok((p, csv)) => {
                    eprintln!("report: {}", p.display());
                    if let Some(c) = csv {
                        eprintln!("attempts table: {}", c.display());
                    }
                }
                Err(e) => eprintln!("warning: writing the report: {}", e.message),
            }
            if let Some(n) = &notifier {
                n.send(&NotifyEvent::campaign_end(&dir, &report));
            }
        }
        Ok::<i32, CliError>(code)
    });
    if let Some(n) = &notifier {
        n.flush();
    }
    code
}

/// Starts this same command without `--detach` in a new session, output to
/// `<dir>/controller/run.log`, and returns once it holds the lease (or has exited).
/// Whether `path` holds a complete first line (reads at most 4 KiB; a journal may be large).
fn first_line_written(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 4096];
    std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map(|n| head[..n].contains(&b'\n'))
        .unwrap_or(false)
}

fn detach(dir: &Path) -> Result<i32, CliError> {
    use std::os::unix::process::CommandExt;
    let dir = open_campaign_dir(dir)?;
    let ctl = dir.join("controller");
    std::fs::create_dir_all(&ctl)
        .map_err(|e| CliError::new(format!("creating {}: {e}", ctl.display())))?;
    let log_path = ctl.join("run.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| CliError::new(format!("opening {}: {e}", log_path.display())))?;
    let exe =
        std::env::current_exe().map_err(|e| CliError::new(format!("finding this program: {e}")))?;
    let mut args: Vec<std::ffi::OsString> = std::env::args_os()
        .skip(1)
        .filter(|x| x != "--detach")
        .collect();
    if !args.iter().any(|x| x == "--quiet") {
        args.push("--quiet".into());
    }
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().map_err(CliError::from)?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; the child leaves our session so a Ctrl-C in this
    // terminal does not reach it.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| CliError::new(format!("starting the background controller: {e}")))?;
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(st) = child.try_wait()? {
            return Err(CliError::new(format!(
                "the background controller exited at once ({st}); see {}",
                log_path.display()
            )));
        }
        let l = LeaseStatus::probe(&ctl)?;
        // The journal is created empty and its header (the campaign nonce, the tag of
        // `cancel --tag`) appended just after: wait for a complete first line, so that a
        // `status` right after the detach already names the campaign.
        let journal_started = first_line_written(&ctl.join("journal.jsonl"));
        if l.held && l.lock_pid == Some(pid as i32) && journal_started {
            break;
        }
        if Instant::now() > deadline {
            eprintln!(
                "warning: the background controller (pid {pid}) has not taken the lease after 120 s"
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "controller running in the background: pid {pid}, log {}\nfollow it with: puzzletron campaign status {}",
        log_path.display(),
        dir.display()
    );
    Ok(exit::INCOMPLETE)
}

/// What `status --json` prints.
#[derive(serde::Serialize)]
struct StatusJson<'a> {
    dir: &'a Path,
    nonce: Option<&'a str>,
    revision: u32,
    runner: Option<&'a str>,
    lease: &'a LeaseStatus,
    lease_text: String,
    finished: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    cancelled: Option<&'a crate::report::CampaignCancel>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    problems: &'a [String],
    records: u64,
    attempts: usize,
    live: Vec<&'a crate::report::AttemptHistory>,
    stages: &'a [crate::report::StageHistory],
    gpu_hours: f64,
    wasted_gpu_hours: f64,
    waste_by_class: std::collections::BTreeMap<String, f64>,
    last_events: &'a [(u64, String, String)],
    excluded_nodes: Vec<ExcludedJson<'a>>,
}

/// A node the controller excluded, in `status --json`.
#[derive(serde::Serialize)]
struct ExcludedJson<'a> {
    at_ms: u64,
    node: &'a str,
    reason: &'a str,
}

fn status_code(h: &CampaignHistory) -> i32 {
    if !h.finished {
        exit::INCOMPLETE
    } else if h.stages.iter().any(|s| s.status == StageStatus::Failed) {
        exit::FAILED
    } else {
        exit::DONE
    }
}

/// `status` text.
pub(crate) fn status_text(h: &CampaignHistory) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "campaign {} (revision {}, nonce {}, runner {})",
        h.dir.display(),
        h.revision,
        h.nonce.as_deref().unwrap_or("?"),
        h.runner.as_deref().unwrap_or("?")
    );
    let _ = writeln!(o, "lease: {}", h.lease.describe());
    for p in &h.problems {
        let _ = writeln!(o, "warning: {p}");
    }
    if let Some(c) = &h.cancelled {
        let _ = writeln!(
            o,
            "cancelled by {} at {}; {} attempt(s) cancelled{}",
            c.by,
            crate::report::clock_text(c.at_ms),
            c.attempts.len(),
            if c.attempts.is_empty() {
                String::new()
            } else {
                format!(": {}", c.attempts.join(", "))
            }
        );
    }
    let w = h
        .stages
        .iter()
        .map(|s| s.id.chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    let sw = h
        .stages
        .iter()
        .map(|s| s.state.chars().count())
        .max()
        .unwrap_or(6)
        .max(6);
    let _ = writeln!(
        o,
        "{:<w$}  {:<sw$}  {:>9}  {:>4}  {:>6}  {:>9}  {:>12}",
        "stage", "status", "done", "live", "failed", "GPU-h", "wasted GPU-h"
    );
    for s in &h.stages {
        let _ = writeln!(
            o,
            "{:<w$}  {:<sw$}  {:>9}  {:>4}  {:>6}  {:>9.3}  {:>12.3}",
            s.id,
            s.state,
            format!("{}/{}", s.done_units, s.units),
            s.live_units,
            s.failed_units,
            s.gpu_hours,
            s.wasted_gpu_hours
        );
        if let Some(r) = &s.reason {
            let what = if s.status == StageStatus::Skipped {
                "skipped"
            } else {
                "failed"
            };
            let _ = writeln!(o, "  {what}: {r}");
        }
        if let Some(f) = &s.decision_file
            && s.status == StageStatus::AwaitingDecision
        {
            let _ = writeln!(
                o,
                "  waiting for a decision: write {} (`all`, `none`, candidate numbers or ids)",
                f.display()
            );
        }
        if let Some(c) = &s.chosen {
            let _ = writeln!(
                o,
                "  decided: {}",
                if c.is_empty() {
                    "none".to_string()
                } else {
                    c.join(", ")
                }
            );
        }
    }
    let live: Vec<_> = h.live().collect();
    let _ = writeln!(
        o,
        "{} attempts, {} live{}; {:.3} GPU-hours, {:.3} wasted; {}",
        h.attempts.len(),
        live.len(),
        if live.is_empty() {
            String::new()
        } else {
            format!(
                " ({}{})",
                live.iter()
                    .take(5)
                    .map(|a| a.attempt_id.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                if live.len() > 5 { ", ..." } else { "" }
            )
        },
        h.gpu_hours(),
        h.wasted_gpu_hours(),
        if h.finished {
            "finished"
        } else {
            "not finished"
        }
    );
    for (_, node, why) in &h.excluded_nodes {
        let _ = writeln!(o, "excluded node {node}: {why}");
    }
    o
}

fn status_cmd(dir: &Path, json: bool, watch: Option<u64>) -> Result<i32, CliError> {
    loop {
        let h = CampaignHistory::load(dir, false)?;
        if json {
            let s = StatusJson {
                dir: &h.dir,
                nonce: h.nonce.as_deref(),
                revision: h.revision,
                runner: h.runner.as_deref(),
                lease: &h.lease,
                lease_text: h.lease.describe(),
                finished: h.finished,
                cancelled: h.cancelled.as_ref(),
                problems: &h.problems,
                records: h.records,
                attempts: h.attempts.len(),
                live: h.live().collect(),
                stages: &h.stages,
                gpu_hours: h.gpu_hours(),
                wasted_gpu_hours: h.wasted_gpu_hours(),
                waste_by_class: h.waste_by_class(),
                last_events: &h.events,
                excluded_nodes: h
                    .excluded_nodes
                    .iter()
                    .map(|(at_ms, node, reason)| ExcludedJson {
                        at_ms: *at_ms,
                        node,
                        reason,
                    })
                    .collect(),
            };
            println!("{}", serde_json::to_string_pretty(&s)?);
        } else {
            print!("{}", status_text(&h));
        }
        match watch {
            Some(secs) if !h.finished => {
                std::thread::sleep(Duration::from_secs(secs.max(1)));
                if !json {
                    println!();
                }
            }
            _ => return Ok(status_code(&h)),
        }
    }
}

fn cancel_dir(dir: &Path, wait: Duration) -> Result<i32, CliError> {
    let ctl = dir.join("controller");
    let h = CampaignHistory::load(dir, false)?;
    let lease = &h.lease;
    if lease.lock_elsewhere {
        return Err(CliError::new(format!(
            "the lease is {}: a process this one cannot signal; cancel it from its own PID \
             namespace (its container)",
            lease.describe()
        )));
    }
    if lease.held
        && let Some(pid) = lease.lock_pid
    {
        // Say who cancels: the controller reads this file when it shuts down on the signal.
        let _ = crate::fsutil::atomic_write(
            &ctl.join(crate::campaign::controller::CANCEL_REQUEST_FILE),
            canceller().as_bytes(),
        );
        // SIGTERM makes the controller cancel every live job and exit (TerminalControls).
        // SAFETY: kill(2) with a pid the kernel named as the lock holder.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            return Err(CliError::new(format!(
                "signalling the controller (pid {pid}): {}",
                std::io::Error::last_os_error()
            )));
        }
        eprintln!("asked the controller (pid {pid}) to cancel; waiting for it to stop");
        let deadline = Instant::now() + wait;
        while LeaseStatus::probe(&ctl)?.held {
            if Instant::now() > deadline {
                return Err(CliError::new(format!(
                    "the controller (pid {pid}) still holds the lease after {} s",
                    wait.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let after = CampaignHistory::load(dir, false)?;
        println!(
            "cancelled: the controller stopped; {} attempts live",
            after.live().count()
        );
        return Ok(exit::DONE);
    }
    // No controller here: take the lease ourselves and cancel what the journal says is live.
    // A holder that cannot be proved dead from here (another host, PID namespace or boot) is
    // watched first: a live one keeps the lease (the error names it), a dead one is taken over
    // once its heartbeat has stood still for the lease's ttl.
    if lease.held {
        eprintln!(
            "the lease is {}; watching its heartbeat before taking it",
            lease.describe()
        );
    }
    let plan_path = ctl.join("plan.json");
    let plan: CampaignPlan = serde_json::from_slice(
        &std::fs::read(&plan_path)
            .map_err(|e| CliError::new(format!("reading {}: {e}", plan_path.display())))?,
    )
    .map_err(|e| CliError::new(format!("{}: {e}", plan_path.display())))?;
    let dir = dir.to_path_buf();
    let rt = runtime()?;
    rt.block_on(async {
        let executor = executor_for(&plan, &dir, &[], None)?;
        let mut ctl = CampaignController::builder()
            .plan(plan)
            .executor(executor)
            .campaign_dir(&dir)
            .view(ViewMode::Off)
            .build()?;
        let n = ctl
            .shutdown(&format!("cancelled by {}", canceller()))
            .await?;
        println!("cancelled {n} attempts");
        Ok::<i32, CliError>(exit::DONE)
    })
}

/// Who cancels: `` `puzzletron campaign cancel` (user U on HOST, pid P) ``.
fn canceller() -> String {
    format!(
        "`puzzletron campaign cancel` ({})",
        crate::campaign::controller::who_am_i()
    )
}

/// Cancels the Slurm jobs of this user whose name starts with `tag` followed by `.` or `r`
/// (attempt ids are `<nonce>[r<revision>].<stage>...`).
fn cancel_tag(tag: &str) -> Result<i32, CliError> {
    if tag.is_empty()
        || !tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(CliError {
            code: exit::USAGE,
            message: format!("--tag {tag:?}: expected a campaign nonce (letters, digits, - and _)"),
        });
    }
    let out = std::process::Command::new("squeue")
        .args(["-h", "--me", "-o", "%i|%j"])
        .output()
        .map_err(|e| CliError::new(format!("running squeue: {e}")))?;
    if !out.status.success() {
        return Err(CliError::new(format!(
            "squeue failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut ids = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let Some((id, name)) = line.split_once('|') else {
            return Err(CliError::new(format!(
                "squeue output line {}: {line:?}: expected JOBID|NAME",
                n + 1
            )));
        };
        if let Some(rest) = name.strip_prefix(tag)
            && (rest.starts_with('.') || rest.starts_with('r'))
        {
            // An array task `123_4` is cancelled through its array job id.
            let job = id.split('_').next().unwrap_or(id).to_string();
            if !ids.contains(&job) {
                ids.push(job);
            }
        }
    }
    if ids.is_empty() {
        println!("no job of yours has a name starting with {tag}");
        return Ok(exit::DONE);
    }
    let st = std::process::Command::new("scancel")
        .args(&ids)
        .status()
        .map_err(|e| CliError::new(format!("running scancel: {e}")))?;
    if !st.success() {
        return Err(CliError::new(format!(
            "scancel {} failed ({st})",
            ids.join(" ")
        )));
    }
    println!("cancelled {} jobs: {}", ids.len(), ids.join(" "));
    Ok(exit::DONE)
}

/// Start, end and node of Slurm jobs by attempt id, from one `sacct` call per 500 job ids.
fn sacct_times(h: &CampaignHistory) -> HashMap<String, AttemptTimes> {
    let mut out = HashMap::new();
    let jobs: Vec<&str> = h
        .attempts
        .iter()
        .filter_map(|a| a.job_id.as_deref())
        .collect();
    for chunk in jobs.chunks(500) {
        let Ok(o) = std::process::Command::new("sacct")
            .env("SLURM_TIME_FORMAT", "%s")
            .args([
                "-n",
                "-P",
                "-X",
                "--format=JobName,Start,End,NodeList",
                "-j",
            ])
            .arg(chunk.join(","))
            .output()
        else {
            return out;
        };
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            let f: Vec<&str> = line.split('|').collect();
            if f.len() < 4 {
                continue;
            }
            let t = |s: &str| s.parse::<u64>().ok().map(|v| v * 1000);
            let node = (!f[3].is_empty() && f[3] != "None assigned").then(|| f[3].to_string());
            out.insert(f[0].to_string(), (t(f[1]), t(f[2]), node));
        }
    }
    out
}

/// Writes the report of `dir` to `out` (default `<dir>/report.html`) and, for a campaign of
/// more than [`crate::report::INLINE_ATTEMPTS`] attempts, the full attempts table beside it
/// (`<out>.attempts.csv`, written first so the page never links to a missing file); returns
/// both paths.
fn write_report(
    dir: &Path,
    out: Option<PathBuf>,
    sacct: bool,
) -> Result<(PathBuf, Option<PathBuf>), CliError> {
    let mut h = CampaignHistory::load(dir, true)?;
    if sacct && h.runner.as_deref() == Some("slurm") {
        let t = sacct_times(&h);
        h.apply_times(&t);
    }
    let out = super::report_path(out, dir)?;
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "report.html".into());
    let files = render_campaign_report_files(&h, &name);
    drop(h);
    let csv = match &files.attempts_csv {
        Some(text) => {
            let p = out.with_file_name(attempts_csv_name(&name));
            crate::fsutil::atomic_write(&p, text.as_bytes())
                .map_err(|e| CliError::new(format!("writing {}: {e}", p.display())))?;
            Some(p)
        }
        None => {
            // A smaller campaign's report must not sit beside an earlier, larger one's table.
            let p = out.with_file_name(attempts_csv_name(&name));
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(CliError::new(format!("removing {}: {e}", p.display()))),
            }
            None
        }
    };
    crate::fsutil::atomic_write(&out, files.html.as_bytes())
        .map_err(|e| CliError::new(format!("writing {}: {e}", out.display())))?;
    Ok((out, csv))
}

fn report_cmd(dir: &Path, out: Option<PathBuf>, sacct: bool) -> Result<i32, CliError> {
    let (p, csv) = write_report(dir, out, sacct)?;
    println!("{}", p.display());
    if let Some(c) = csv {
        // Second line: the attempts table, too large for the page.
        println!("{}", c.display());
        eprintln!(
            "the full attempts table is {} (linked from the report)",
            c.display()
        );
    }
    Ok(exit::DONE)
}
