//! The `puzzletron` command line (feature `cli`; the crate is not published: from a checkout,
//! `cargo install --locked --path . --features cli`).
//!
//! ```text
//! puzzletron campaign compile|dry-run EXPERIMENT --runner R [--execution E] [--override K=V]... [--stage S]... [--json]
//! puzzletron campaign run EXPERIMENT --runner R [--execution E] --dir D [--once|--detach] [--new-revision] ...
//! puzzletron campaign retry D [--allow-oom-retry S]... [--detach]
//! puzzletron campaign status D [--json] [--watch]
//! puzzletron campaign cancel D | --tag T
//! puzzletron campaign report D [--out report.html]
//! puzzletron sweep status|ls|metrics|plot|report|gc STORE ...
//! ```
//!
//! Exit status ([`exit`]): 0 done, 1 error, 2 usage error, 3 detached or incomplete (jobs
//! still running, or a stage not finished), 4 the campaign ended with a failed stage.
//!
//! `status` and `report` never take the campaign's lease: they read the journal, the plan,
//! the lease record and the attempt folders read-only, so they run beside a live controller.

mod campaign;
mod sweep;

use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};

/// Exit codes of the `puzzletron` binary.
pub mod exit {
    /// Done: the command did what it was asked and the campaign (if any) is complete.
    pub const DONE: i32 = 0;
    /// An error: bad config, unreadable folder, a scheduler failure... (the message says which).
    pub const ERROR: i32 = 1;
    /// A usage error: unknown option, missing argument, bad value (clap's convention).
    pub const USAGE: i32 = 2;
    /// Detached or incomplete: the controller stopped with jobs running (`--once`,
    /// `--detach`, a detach from the menu) or a manual decision waiting for its file, or
    /// `status` found the campaign not finished.
    pub const INCOMPLETE: i32 = 3;
    /// The campaign ended with a failed stage (see its report).
    pub const FAILED: i32 = 4;
}

const TOP_HELP: &str = "\
Examples (from the fixtures folder, ../shared/fixtures/puzzletron-configs):
  $ puzzletron campaign compile families/qwen3_5/qwen3p5_0p8b/runs/mip_smoke.yaml --runner orchestration/qwen3p5_0p8b/runner.slurm.yaml --execution orchestration/qwen3p5_0p8b/execution.smoke.yaml --override pruning.eval_samples=4
  $ puzzletron campaign run EXPERIMENT --runner local --execution EXECUTION --dir /tmp/c --detach
  $ puzzletron campaign status /tmp/c
  $ puzzletron campaign report /tmp/c --out report.html
  $ puzzletron sweep status .puzzletron

Exit status: 0 done, 1 error, 2 usage error, 3 detached or incomplete (jobs still running),
4 the campaign ended with a failed stage.";

/// Operate puzzletron campaigns and sweeps.
#[derive(Debug, Parser)]
#[command(name = "puzzletron", version, after_help = TOP_HELP)]
#[non_exhaustive]
pub struct Cli {
    /// The least severe library diagnostics printed on stderr: off, error, warn, info
    /// (decisions, submissions, controller events), debug (every run's decision and claim),
    /// trace.
    #[arg(
        long,
        global = true,
        env = "PUZZLETRON_LOG",
        default_value = "warn",
        value_name = "LEVEL",
        value_parser = ["off", "error", "warn", "info", "debug", "trace"]
    )]
    pub log_level: String,
    /// What to operate on.
    #[command(subcommand)]
    pub command: Top,
}

/// Prints the library's `tracing` events of `level` and above on stderr: `LEVEL message
/// field=value ...`, inside their spans. Once per process (a second call keeps the first).
fn init_logging(level: &str) {
    let level: tracing::level_filters::LevelFilter = level
        .parse()
        .unwrap_or(tracing::level_filters::LevelFilter::WARN);
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .without_time()
        .with_target(false)
        .try_init();
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
#[non_exhaustive]
pub enum Top {
    /// Multi-stage GPU campaigns: compile, dry-run, run, retry, status, cancel, report,
    /// gpu-preflight.
    #[command(subcommand)]
    Campaign(CampaignCmd),
    /// Sweep stores: status, ls, metrics, plot, report, gc, repair.
    #[command(subcommand)]
    Sweep(SweepCmd),
}

/// The three config inputs of a campaign, and the overrides.
#[derive(Debug, Args, Clone)]
#[non_exhaustive]
pub struct PlanArgs {
    /// The experiment YAML (Hydra-style `defaults`, `${...}` interpolation).
    pub experiment: PathBuf,
    /// The runner: a runner YAML, or `local` (this machine, the local executor).
    #[arg(long, value_name = "RUNNER.yaml|local")]
    pub runner: String,
    /// The execution YAML (strategies, instances, policies); default: built-in defaults.
    #[arg(long, value_name = "EXECUTION.yaml")]
    pub execution: Option<PathBuf>,
    /// A Hydra override of the experiment config (`a.b=1`, `+a.c=2`, `~a.d`); repeatable.
    #[arg(long = "override", short = 'o', value_name = "K=V")]
    pub overrides: Vec<String>,
    /// Only these stages (repeatable); their parents must be selected too.
    #[arg(long = "stage", value_name = "STAGE")]
    pub stages: Vec<String>,
}

const COMPILE_HELP: &str = "\
Examples (from ../shared/fixtures/puzzletron-configs):
  $ puzzletron campaign compile families/qwen3_5/qwen3p5_0p8b/runs/mip_smoke.yaml --runner orchestration/qwen3p5_0p8b/runner.slurm.yaml --execution orchestration/qwen3p5_0p8b/execution.smoke.yaml --override pruning.eval_samples=4
  $ puzzletron campaign compile families/qwen3_5/qwen3p6_35b_a3b/runs/production.yaml --runner orchestration/qwen_moe/runner.slurm.yaml --execution orchestration/qwen_moe/execution.production.yaml --json

Exit status: 0 done, 1 error, 2 usage error.";

const DRY_RUN_HELP: &str = "\
Examples (from ../shared/fixtures/puzzletron-configs):
  $ puzzletron campaign dry-run families/qwen3_5/qwen3p5_0p8b/runs/mip_smoke.yaml --runner orchestration/qwen3p5_0p8b/runner.slurm.yaml --execution orchestration/qwen3p5_0p8b/execution.smoke.yaml --override pruning.eval_samples=4 --stage convert
  $ PUZZLETRON_DATASET_PATH=/data/llama-ds puzzletron campaign dry-run families/llama/llama3p1_8b/runs/pruneffn_memory.yaml --runner local --execution orchestration/execution.single_gpu.yaml
(pruneffn_memory.yaml reads its dataset path from ${oc.env:PUZZLETRON_DATASET_PATH}, which has no
default: set it, or the compile stops naming the variable.)

Exit status: 0 done, 1 error, 2 usage error.";

const RUN_HELP: &str = "\
Runs the campaign durably in --dir: run the same command again after a crash, Ctrl-C or a
detach and it re-attaches to the jobs still running. The stage commands are the catalog's
(Puzzletron's worker entry points); --command-prefix (or PUZZLETRON_COMMAND_PREFIX) puts a
program before each of them, e.g. a stub worker in tests or `srun --container-image=...`.

Manual decisions (a post_mip filter node with `mode: manual`) submit no job: on a terminal
the controller lists the candidates numbered from 1 and reads a choice; otherwise it notifies
`decision_needed` and waits for DIR/decisions/<stage>.txt (`all`, `none`, numbers or ids,
separated by spaces or commas), which a running controller picks up (other stages go on; with
--once the exit status is 3 until it exists). The choice goes to
DIR/work/<stage>/0/selected.json; `none` skips the stages below the decision.

Examples:
  $ puzzletron campaign run EXPERIMENT --runner local --execution EXECUTION --dir /tmp/c --gpus 0,1
  $ puzzletron campaign run EXPERIMENT --runner runner.yaml --execution EXECUTION --dir /tmp/c --detach
  $ puzzletron campaign run EXPERIMENT --runner local --dir /tmp/c --notify 'notify-send puzzletron'

Exit status: 0 done, 1 error, 2 usage error, 3 detached with jobs running or waiting for a
decision, 4 a stage failed.";

const RETRY_HELP: &str = "\
Re-opens the failed stages of the campaign in DIR in place and resumes its controller: the
failed units get fresh retry budgets and run again, stages they blocked open again, finished
stages stay finished (nothing of them is submitted again). The plan is DIR's own
(DIR/controller/plan.json, as `campaign run` wrote it): no experiment or runner to repeat. A
stage that failed out of memory runs with more resources with --allow-oom-retry STAGE. The
journal records who retried which units and when (`retry_failed`).

Examples:
  $ puzzletron campaign retry /tmp/c --allow-oom-retry sort
  $ puzzletron campaign retry /tmp/c --detach

Exit status: 0 done, 1 error, 2 usage error, 3 detached with jobs running or waiting for a
decision, 4 a stage failed.";

const STATUS_HELP: &str = "\
Reads the journal and attempt records read-only: safe beside a running controller (it never
takes the lease, never blocks the controller). Says whether a controller holds the lease, who,
and since when, and which manual decision waits for which decision file.

Examples:
  $ puzzletron campaign status /tmp/c
  $ puzzletron campaign status /tmp/c --json
  $ puzzletron campaign status /tmp/c --watch 5

Exit status: 0 complete, 1 error, 2 usage error, 3 not finished, 4 finished with a failed stage.";

const CANCEL_HELP: &str = "\
With a folder: asks the controller holding the lease to cancel (SIGTERM: it cancels every live
job and exits), or, with no controller running, cancels the campaign's live jobs itself.
With --tag: cancels the Slurm jobs whose name starts with the tag (the campaign nonce that
prefixes every attempt id; `status` prints it), for orphans whose folder is gone.

Examples:
  $ puzzletron campaign cancel /tmp/c
  $ puzzletron campaign cancel --tag 3f2a9c1e

Exit status: 0 done, 1 error, 2 usage error.";

const REPORT_HELP: &str = "\
Writes one self-contained HTML file (no script, no network): stage DAG, timeline of every
attempt on its node/GPU rows with queue waits and retries, GPU-hours per stage and attempt,
wasted GPU-hours by failure class, failures with evidence and log paths. Read-only.
From 10,000 attempts on, the timeline is aggregated (one lane per stage, stacked bars by
outcome); above 2,000 attempts the page shows part of the attempts table and the full table
is written beside it as FILE.attempts.csv (its path printed on a second line).

Examples:
  $ puzzletron campaign report /tmp/c
  $ puzzletron campaign report /tmp/c --out /tmp/c-report.html

Exit status: 0 done, 1 error, 2 usage error.";

/// Campaign commands.
#[derive(Debug, Subcommand)]
#[non_exhaustive]
pub enum CampaignCmd {
    /// Compile a campaign and print its plan table (--json: the plan document).
    #[command(after_help = COMPILE_HELP)]
    Compile {
        /// Config inputs.
        #[command(flatten)]
        plan: PlanArgs,
        /// Print `plan_to_dict` as JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Print what would be submitted (sbatch scripts, processes, GPU placement).
    #[command(name = "dry-run", after_help = DRY_RUN_HELP)]
    DryRun {
        /// Config inputs.
        #[command(flatten)]
        plan: PlanArgs,
        /// The campaign folder `campaign run --dir` would use: its paths, and for an existing
        /// campaign its tag, revision and excluded nodes (default: a temporary folder, removed
        /// afterwards; nothing is created in D).
        #[arg(long, value_name = "D")]
        dir: Option<PathBuf>,
        /// Local runner: the GPU ids `campaign run --gpus` would get (default 0..=7).
        #[arg(long, value_name = "IDS", value_delimiter = ',')]
        gpus: Vec<String>,
        /// As `campaign run --command-prefix`: a program put before every stage command.
        #[arg(long, value_name = "CMD", env = "PUZZLETRON_COMMAND_PREFIX")]
        command_prefix: Option<String>,
        /// Print the dry run as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run (or resume) a campaign with the runner's executor.
    #[command(after_help = RUN_HELP)]
    Run(Box<RunArgs>),
    /// Re-open the failed stages of a campaign in place and resume it.
    #[command(after_help = RETRY_HELP)]
    Retry(Box<RetryArgs>),
    /// Show a campaign's state without taking its lease.
    #[command(after_help = STATUS_HELP)]
    Status {
        /// The campaign folder.
        dir: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Print again every SECS seconds (default 2) until the campaign finishes.
        #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2")]
        watch: Option<u64>,
    },
    /// Cancel a campaign's jobs (or orphans by tag).
    #[command(after_help = CANCEL_HELP)]
    Cancel {
        /// The campaign folder.
        #[arg(required_unless_present = "tag", conflicts_with = "tag")]
        dir: Option<PathBuf>,
        /// Cancel the Slurm jobs of the campaign with this nonce (orphans).
        #[arg(long, value_name = "T")]
        tag: Option<String>,
        /// How long to wait for the controller to stop, in seconds.
        #[arg(long, default_value_t = 60)]
        wait: u64,
    },
    /// Write the campaign's HTML report.
    #[command(after_help = REPORT_HELP)]
    Report {
        /// The campaign folder.
        dir: PathBuf,
        /// Output file (default: DIR/report.html); an existing folder gets its report.html.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Do not ask `sacct` for the start times and nodes of Slurm attempts.
        #[arg(long)]
        no_sacct: bool,
    },
    /// Worker-side GPU preflight: checks the visible GPUs (CUDA_VISIBLE_DEVICES,
    /// SLURM_STEP_GPUS, SLURM_JOB_GPUS) against PUZZLETRON_GPUS_PER_NODE and prints this
    /// rank's device (its position in its visible list). Exit 2 on a mismatch: the controller
    /// classifies it as a configuration failure, never retried.
    GpuPreflight,
}

/// Options of `campaign run`.
#[derive(Debug, Args)]
#[non_exhaustive]
pub struct RunArgs {
    /// Config inputs.
    #[command(flatten)]
    pub plan: PlanArgs,
    /// The campaign folder (new, empty, or one a controller created).
    #[arg(long, value_name = "D")]
    pub dir: PathBuf,
    /// One controller iteration, then detach (jobs keep running; run again to re-attach).
    #[arg(long)]
    pub once: bool,
    /// Run the controller in the background and return at once (its output goes to
    /// DIR/controller/run.log); `status` follows it, `run` again re-attaches after it stops.
    #[arg(long, conflicts_with = "once")]
    pub detach: bool,
    /// Accept a changed plan: cancel the old attempts and start over.
    #[arg(long)]
    pub new_revision: bool,
    /// A program (and arguments, split at spaces) put before every stage command.
    #[arg(long, value_name = "CMD", env = "PUZZLETRON_COMMAND_PREFIX")]
    pub command_prefix: Option<String>,
    /// How the controller runs.
    #[command(flatten)]
    pub controller: ControllerArgs,
}

/// How a campaign controller runs: the options `campaign run` and `campaign retry` share.
#[derive(Debug, Args)]
#[non_exhaustive]
pub struct ControllerArgs {
    /// Local runner: distinct GPU ids handed out through CUDA_VISIBLE_DEVICES (default 0..=7).
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    pub gpus: Vec<String>,
    /// Local runner: most jobs at a time (default: the number of GPU ids).
    #[arg(long, value_name = "N")]
    pub max_concurrent: Option<usize>,
    /// Run CMD (split at spaces; no shell) with an event as JSON on stdin when a stage
    /// completes or fails, the campaign ends, an attempt is declared hung, or a manual
    /// decision waits for a person (`decision_needed`).
    #[arg(long, value_name = "CMD")]
    pub notify: Option<String>,
    /// Allow retrying STAGE with more resources after an out-of-memory, now and later
    /// (repeatable).
    #[arg(long, value_name = "STAGE")]
    pub allow_oom_retry: Vec<String>,
    /// Items of a persistent-pool stage: STAGE=FILE, FILE a JSON array of {"id", "payload"}.
    #[arg(long, value_name = "STAGE=FILE")]
    pub pool_items: Vec<String>,
    /// Delay before the first retry, in ms (default 5000; doubles per retry).
    #[arg(long, value_name = "MS")]
    pub retry_delay_ms: Option<u64>,
    /// Least milliseconds between two polls of the jobs.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub poll_ms: u64,
    /// Seconds a finished attempt's success marker or declared output that is not visible
    /// (a network filesystem's attribute or negative cache) is looked for again before the
    /// attempt fails as `output_not_visible` (default 60).
    #[arg(
        long,
        value_name = "SECONDS",
        env = "PUZZLETRON_OUTPUT_VISIBILITY_WAIT"
    )]
    pub output_visibility_wait: Option<u64>,
    /// Seconds after its start within which an attempt that failed before its start mark,
    /// with no application evidence in its log, is an infrastructure failure charged to its
    /// node (default 60; Slurm and bare-metal runners, whose jobs write the start mark).
    #[arg(long, value_name = "SECONDS")]
    pub fast_failure_window: Option<u64>,
    /// No live progress view.
    #[arg(long)]
    pub quiet: bool,
}

/// Options of `campaign retry` (built by clap from the command line, as the other `*Args`).
#[derive(Debug, Args)]
#[non_exhaustive]
pub struct RetryArgs {
    /// The campaign folder (one `campaign run` created).
    pub dir: PathBuf,
    /// Run the controller in the background and return once it holds the lease (its output
    /// goes to DIR/controller/run.log).
    #[arg(long)]
    pub detach: bool,
    /// How the controller runs (as for `campaign run`).
    #[command(flatten)]
    pub controller: ControllerArgs,
}

const SWEEP_HELP: &str = "\
Examples:
  $ puzzletron sweep status .puzzletron
  $ puzzletron sweep ls .puzzletron --state failed
  $ puzzletron sweep metrics .puzzletron --metric loss --out loss.parquet
  $ puzzletron sweep plot .puzzletron --metric loss --out loss.svg
  $ puzzletron sweep gc .puzzletron --dry-run
  $ puzzletron sweep repair .puzzletron

Exit status: 0 done, 1 error, 2 usage error.";

/// Sweep commands.
#[derive(Debug, Subcommand)]
#[non_exhaustive]
pub enum SweepCmd {
    /// Runs per state (done, failed, running, interrupted, corrupt), and each corrupt run
    /// with its file and the fix.
    #[command(after_help = SWEEP_HELP)]
    Status {
        /// The store folder.
        store: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// One line per run: key, state, job, parameters.
    #[command(after_help = SWEEP_HELP)]
    Ls {
        /// The store folder.
        store: PathBuf,
        /// Only runs in this state.
        #[arg(long, value_parser = ["done", "failed", "running", "interrupted", "corrupt"])]
        state: Option<String>,
    },
    /// The metric table `[metric, step, value, *params, job_key]` as CSV (stdout) or a file.
    #[command(after_help = SWEEP_HELP)]
    Metrics {
        /// The store folder.
        store: PathBuf,
        /// Only this metric.
        #[arg(long)]
        metric: Option<String>,
        /// Write to FILE.csv or FILE.parquet instead of CSV on stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// An SVG line plot of one metric, one line per run.
    #[command(after_help = SWEEP_HELP)]
    Plot {
        /// The store folder.
        store: PathBuf,
        /// The metric.
        #[arg(long)]
        metric: String,
        /// Output file (default: METRIC.svg).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// The sweep's HTML report: runs, their timeline and state, metric plots.
    #[command(after_help = SWEEP_HELP)]
    Report {
        /// The store folder.
        store: PathBuf,
        /// Output file (default: STORE/report.html); an existing folder gets its report.html.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Remove records of runs no longer enqueued: runs superseded by a newer run of the same
    /// job and parameters (the code changed), or, with --keep, every run not listed. A run is
    /// current when it was the last one started, or reused by a drain, for its job and
    /// parameters: after switching code (a revert, another branch), drain once before gc.
    #[command(after_help = SWEEP_HELP)]
    Gc {
        /// The store folder.
        store: PathBuf,
        /// Only say what would be removed.
        #[arg(long)]
        dry_run: bool,
        /// A file of run keys (hex, one a line) to keep; every other finished run is removed.
        #[arg(long, value_name = "FILE")]
        keep: Option<PathBuf>,
    },
    /// Move the folders of runs whose record cannot be read (corrupt: truncated, emptied, not
    /// a record) aside to STORE/corrupt/KEY.UNIXSECS, never deleting them: the next drain of
    /// the sweep runs them again (as `repair(true)` on the sweep does). Safe beside drains and
    /// other repairs: each run is moved once (a lock in STORE/corrupt/), and a run another
    /// process repaired first is left alone.
    #[command(after_help = SWEEP_HELP)]
    Repair {
        /// The store folder.
        store: PathBuf,
        /// Only say what would be moved.
        #[arg(long)]
        dry_run: bool,
    },
}

/// An error of a command: its message and exit code.
#[derive(Debug)]
#[non_exhaustive]
pub struct CliError {
    /// Exit code ([`exit`]).
    pub code: i32,
    /// Message for stderr.
    pub message: String,
}

impl CliError {
    pub(crate) fn new(message: impl std::fmt::Display) -> Self {
        CliError {
            code: exit::ERROR,
            message: message.to_string(),
        }
    }
}

/// Where a report goes: `--out` as given, `report.html` inside it when it is an existing
/// folder, `default_dir/report.html` without it. A path ending in `/` that is not a folder is
/// refused (it names a folder, not a file).
pub(crate) fn report_path(out: Option<PathBuf>, default_dir: &Path) -> Result<PathBuf, CliError> {
    let Some(out) = out else {
        return Ok(default_dir.join("report.html"));
    };
    if out.is_dir() {
        return Ok(out.join("report.html"));
    }
    let text = out.as_os_str().as_encoded_bytes();
    if text.ends_with(b"/") {
        return Err(CliError {
            code: exit::USAGE,
            message: format!(
                "--out {} names a folder that does not exist; create it (the report is then written to report.html inside it) or give a file name, e.g. {}report.html",
                out.display(),
                out.display()
            ),
        });
    }
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty())
        && !parent.is_dir()
    {
        return Err(CliError {
            code: exit::USAGE,
            message: format!(
                "--out {}: the folder {} does not exist; create it or choose another --out",
                out.display(),
                parent.display()
            ),
        });
    }
    // A report replaces only an earlier report: `--out` naming a journal, a record or any
    // other file would destroy it.
    if out.is_file() {
        use std::io::Read;
        let mut head = [0u8; 15];
        let n = std::fs::File::open(&out)
            .and_then(|mut f| f.read(&mut head))
            .map_err(|e| CliError::new(format!("--out {}: {e}", out.display())))?;
        if n > 0 && !head[..n].starts_with(b"<!DOCTYPE html") {
            return Err(CliError {
                code: exit::USAGE,
                message: format!(
                    "--out {} is an existing file that is not a report (it does not start with <!DOCTYPE html>); refusing to overwrite it: choose another --out",
                    out.display()
                ),
            });
        }
    }
    Ok(out)
}

impl<E: std::error::Error> From<E> for CliError {
    fn from(e: E) -> Self {
        CliError::new(e)
    }
}

/// Runs the command line in `args` (program name first); returns the exit code.
pub fn run_args<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp
                | clap::error::ErrorKind::DisplayVersion
                | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                    {
                        exit::USAGE
                    } else {
                        exit::DONE
                    }
                }
                _ => exit::USAGE,
            };
        }
    };
    init_logging(&cli.log_level);
    let r = match cli.command {
        Top::Campaign(c) => campaign::run(c),
        Top::Sweep(c) => sweep::run(c),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", e.message);
            e.code
        }
    }
}

/// The binary's entry point: [`run_args`] on the process arguments.
pub fn main() -> i32 {
    run_args(std::env::args_os())
}
