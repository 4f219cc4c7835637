//! Failure classification: which [`FailureClass`] a finished attempt belongs to, from all the
//! evidence (scheduler state, exit code and signal, the log tail, whether the controller itself
//! cancelled it), and whether a pending job is waiting normally or stuck.
//!
//! The rules, in order (the first that matches wins; cases
//! C20–C25 of `docs/evidence.md`):
//! 1. `COMPLETED` is success only when every piece of evidence agrees (*success needs proof*):
//!    a. every step ([`JobStatus::steps`]) completed with exit 0 and no signal — otherwise the
//!    attempt is classified from the first bad step (a signal-killed step outranks the
//!    allocation row), with the detail `accounting inconsistent: allocation COMPLETED,
//!    step 0 CANCELLED by signal 10; ...`;
//!    b. no oom-kill event in the log (C21c, "Detected 1 oom_kill event"), unless the
//!    success marker is present — else [`FailureClass::Oom`];
//!    c. the success marker is present when it was checked ([`Evidence::success_marker`]) —
//!    else [`FailureClass::Unknown`];
//!    d. the stage's declared outputs exist and its validation command passed
//!    ([`Evidence::outputs_problem`]) — else [`FailureClass::Unknown`].
//!    A log that could not be read ([`Evidence::log_unavailable`]) is named in the detail:
//!    "unavailable", never "clean".
//! 2. The log says the job was cancelled `DUE TO TIME LIMIT`, or the state is `TIMEOUT` (C22):
//!    [`FailureClass::TimeoutResumable`] when the stage can resume and a checkpoint proves it
//!    (N03: [`Evidence::checkpoint`] found, or not checked), else
//!    [`FailureClass::TimeoutFatal`] (the detail says whether the stage cannot resume or left
//!    no checkpoint); decided from state/log, never from the exit code.
//! 3. `OUT_OF_MEMORY` (C20), "CUDA out of memory"/`OutOfMemoryError` in the log (C21a), Slurm's
//!    "Exceeded job/step memory limit", or an exit 137 / SIGKILL together with an oom-kill line
//!    in the log: [`FailureClass::Oom`].
//!    Then a missing program: exit 127 with no application evidence in the log, or a launch
//!    failure with `ENOENT`, after the start mark: [`FailureClass::Config`], naming
//!    [`Evidence::program`] and [`Evidence::lookup`] (issue 27).
//! 4. `NODE_FAIL`, `BOOT_FAIL`, `PREEMPTED`, launch failures, a log `DUE TO PREEMPTION` /
//!    `DUE TO NODE FAILURE`, and a cancel the controller did not ask for by the scheduler
//!    itself (the uid of Slurm's `SlurmUser`, [`Evidence::scheduler_uid`]) or by root when
//!    the jobs were submitted by another user ([`Evidence::own_uid`]) — a preemption, whoever
//!    runs the controller: [`FailureClass::Transient`] (C23).
//! 5. `DEADLINE`: [`FailureClass::Expired`] (C25: expired, not failed).
//! 6. Any other cancel: [`FailureClass::Cancelled`].
//!    Rule 6a: `FAILED` or killed by a signal, before the attempt's start mark
//!    ([`Evidence::start_mark`] `Some(false)`: the job's setup failed, its payload never
//!    started) within [`Evidence::fast_window`] of its start (default 60 s), with no
//!    application evidence in any log (application/configuration errors, OOM lines, a
//!    traceback, the GPU preflight): [`FailureClass::Transient`], an infrastructure failure
//!    charged to its node ([`nodes`](super::nodes)).
//! 7. The worker's GPU preflight line (`gpu preflight: 1 GPU(s) visible … needs 2 per node`,
//!    N04), exit code 2, or argparse/clap style argument errors in the log (`unrecognized arguments`,
//!    `error: the following arguments are required`, `invalid value ... for`, `Usage:` followed
//!    by `error:`): [`FailureClass::Config`].
//! 8. `FAILED` with another exit code: [`FailureClass::Application`].
//! 9. Everything else (`LOST`, SIGKILL without oom evidence — C21b "probable OOM" — unknown
//!    states): [`FailureClass::Unknown`], with the reason in [`Classification::detail`].
//!
//! A running attempt the controller cancels because its progress mark did not move for the
//! stage's heartbeat timeout is classified by [`classify_hung`] instead: `Application` when a
//! log shows an application error, else [`FailureClass::Hung`].
//!
//! What follows each class (retried or not, on which budget) is decided by the stage's
//! `failure_policy` in one table: [the retry table](super::RetryPolicy#retry-table) of
//! [`policy`](super::policy). In short: `Application` (NaN loss, `AssertionError`, any other
//! exit code) is fatal under `strict` and re-submitted up to `max_attempts` under `resume`; it
//! is never retried on the transient budget.

use serde::{Deserialize, Serialize};

use crate::executor::{JobState, JobStatus, StepStatus};

/// Why an attempt failed, as far as the evidence tells (`docs/evidence.md`, "Failure classes").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailureClass {
    /// Out of memory, host (`OUT_OF_MEMORY`, oom-kill) or GPU ("CUDA out of memory").
    Oom,
    /// The infrastructure failed, not the job: node/boot failure, preemption, launch failure.
    Transient,
    /// Hit its time limit, and the stage can resume from a checkpoint.
    TimeoutResumable,
    /// Hit its time limit, and the stage cannot resume.
    TimeoutFatal,
    /// Bad arguments or configuration (exit 2, argument-parser errors).
    Config,
    /// Cancelled by a user (or by this controller).
    Cancelled,
    /// Could not start before its deadline (Slurm `DEADLINE`): expired, not failed.
    Expired,
    /// The program failed on its own (non-zero exit without other evidence, or an application
    /// error such as a NaN loss or `AssertionError` in a log). Fatal under `strict`,
    /// re-submitted up to `max_attempts` under `resume` ([the retry
    /// table](super::RetryPolicy#retry-table)).
    Application,
    /// Not enough evidence (lost job, SIGKILL without an oom trace, unknown state).
    Unknown,
    /// Running, but its progress mark did not move for the stage's heartbeat timeout: the
    /// controller cancelled it (`classify_hung`). Retried like [`FailureClass::Transient`].
    Hung,
    /// Completed, but its success marker or a declared output stayed invisible (`stat`, then
    /// a `readdir` of its folder and an `open`, retried with backoff for the controller's
    /// visibility bound): a network filesystem that does not show the file is not a missing
    /// output until then; after it, a missing one. Retried like [`FailureClass::Unknown`]
    /// (counted attempts, `resume` policy); the detail names the path.
    OutputNotVisible,
}

impl FailureClass {
    /// Every class, in declaration order.
    pub const ALL: &'static [FailureClass] = &[
        FailureClass::Oom,
        FailureClass::Transient,
        FailureClass::TimeoutResumable,
        FailureClass::TimeoutFatal,
        FailureClass::Config,
        FailureClass::Cancelled,
        FailureClass::Expired,
        FailureClass::Application,
        FailureClass::Unknown,
        FailureClass::Hung,
        FailureClass::OutputNotVisible,
    ];

    /// The snake_case name (`oom`, `timeout_resumable`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            FailureClass::Oom => "oom",
            FailureClass::Transient => "transient",
            FailureClass::TimeoutResumable => "timeout_resumable",
            FailureClass::TimeoutFatal => "timeout_fatal",
            FailureClass::Config => "config",
            FailureClass::Cancelled => "cancelled",
            FailureClass::Expired => "expired",
            FailureClass::Application => "application",
            FailureClass::Unknown => "unknown",
            FailureClass::Hung => "hung",
            FailureClass::OutputNotVisible => "output_not_visible",
        }
    }
}

impl std::fmt::Display for FailureClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an out-of-memory happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OomKind {
    /// Host memory (cgroup / kernel oom-killer).
    Host,
    /// GPU memory (a CUDA allocation failed).
    Gpu,
}

/// Everything known about a finished attempt, besides its [`JobStatus`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Evidence {
    /// The last part of the attempt's log (stdout+stderr), if readable.
    pub log_tail: String,
    /// The stage declares it can resume from a checkpoint.
    pub resumable: bool,
    /// The controller itself asked for this attempt to be cancelled.
    pub cancel_requested: bool,
    /// The uid the controller runs as, which submitted the job (to tell a preemption by root
    /// from a user's cancel).
    pub own_uid: u32,
    /// The uid of the scheduler's own user (Slurm `SlurmUser`), when known: a cancel by it is
    /// the scheduler's (preemption), never a user's.
    pub scheduler_uid: Option<u32>,
    /// Whether the attempt left its success marker: `None` when not checked.
    pub success_marker: Option<bool>,
    /// Why the stage's declared outputs do not validate (a missing output, a failed
    /// validation command), `None` when they do or the stage declares none.
    pub outputs_problem: Option<String>,
    /// Why the log is not evidence, when it is not: it could not be read (then `log_tail` is
    /// empty and means nothing) or decoded (then `log_tail` is its lossy decoding). Named in
    /// every verdict's detail, which never calls such a log clean.
    pub log_unavailable: Option<String>,
    /// The last part of every per-rank log the attempt wrote (N05: `(name, tail)`, e.g.
    /// torchrun's `--log-dir` files under the unit's `logs/` folder), in name order. Every
    /// rank is read, not only the last: the rank that failed first is rarely the last.
    pub rank_logs: Vec<(String, String)>,
    /// What the attempt left to resume from (N03), for a resumable stage that hit its limit.
    pub checkpoint: CheckpointEvidence,
    /// Whether the attempt's start mark (`_STARTED` holding its id, written by the job just
    /// before its payload) was found: `None` when the executor writes none
    /// ([`Executor::writes_start_mark`](crate::executor::Executor::writes_start_mark)).
    pub start_mark: Option<bool>,
    /// How long it ran: the scheduler's end minus start, else the controller's time since
    /// its submit (an upper bound); `None` when unknown.
    pub ran_for: Option<std::time::Duration>,
    /// A failure before the start mark within this long of the start is the
    /// infrastructure's (rule 6a); `None` turns the rule off.
    pub fast_window: Option<std::time::Duration>,
    /// The program the payload runs (the first word of its command), to name it when it
    /// cannot be found (exit 127, launch `ENOENT`).
    pub program: Option<String>,
    /// Where the program was looked up: the `PATH` and working directory, as text.
    pub lookup: Option<String>,
    /// Where the job log is, to cite its lines as `file:line`; `None`: cited by name.
    pub log_path: Option<std::path::PathBuf>,
    /// Line number (from 1) of the first line of [`log_tail`](Self::log_tail) in its file
    /// (the tail is the end of a longer file); 0 when unknown (lines then cited from the tail).
    pub log_first_line: usize,
    /// The folder the [`rank_logs`](Self::rank_logs) names are relative to (after `rank log `),
    /// to cite their lines as `file:line`.
    pub rank_dir: Option<std::path::PathBuf>,
}

/// `file:line: text` of the first line of `text` (a tail whose first line is line `first` of
/// `file`, 0 when unknown) containing `needle` (lower case), the text cut to 200 characters.
fn cite_line(file: &str, first: usize, text: &str, needle: &str) -> Option<String> {
    let (i, line) = text
        .lines()
        .enumerate()
        .find(|(_, l)| l.to_ascii_lowercase().contains(needle))?;
    let line: String = line.trim().chars().take(200).collect();
    Some(if first > 0 {
        format!("{file}:{}: {line}", first + i)
    } else {
        format!("{file} (line {} of its tail): {line}", i + 1)
    })
}

impl Evidence {
    /// The first line of any log (the job log, then every rank log in name order) containing
    /// one of `needles`, cited as `file:line: text`, with the needle.
    pub fn cite(&self, needles: &[&'static str]) -> Option<(String, &'static str)> {
        let job = self
            .log_path
            .as_ref()
            .map_or_else(|| "the job log".to_string(), |p| p.display().to_string());
        let lower = self.log_tail.to_ascii_lowercase();
        if let Some(m) = contains_any(&lower, needles) {
            return cite_line(&job, self.log_first_line, &self.log_tail, m).map(|c| (c, m));
        }
        for (name, text) in &self.rank_logs {
            let lower = text.to_ascii_lowercase();
            if let Some(m) = contains_any(&lower, needles) {
                let file = match (&self.rank_dir, name.strip_prefix("rank log ")) {
                    (Some(d), Some(rel)) => d.join(rel).display().to_string(),
                    _ => name.clone(),
                };
                return cite_line(&file, 0, text, m).map(|c| (c, m));
            }
        }
        None
    }

    /// The out-of-memory evidence in any log: GPU lines first, then host lines.
    pub fn oom_cite(&self) -> Option<(OomKind, String)> {
        self.cite(GPU_OOM)
            .map(|(c, _)| (OomKind::Gpu, c))
            .or_else(|| self.cite(HOST_OOM).map(|(c, _)| (OomKind::Host, c)))
    }
}

/// Whether a timed-out attempt left something to resume from (N03).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckpointEvidence {
    /// Not looked at: a resumable stage's timeout counts as resumable (callers that do not
    /// track checkpoints).
    #[default]
    NotChecked,
    /// Looked at, nothing complete: a restart would start from zero, so the timeout is fatal.
    Missing,
    /// A complete checkpoint, described (`_CHECKPOINT: step 1200`, `ckpt/step_1200`).
    Found(String),
}

/// The verdict on one finished attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Classification {
    /// `None` when the attempt succeeded.
    pub class: Option<FailureClass>,
    /// For [`FailureClass::Oom`]: host or GPU memory.
    pub oom: Option<OomKind>,
    /// A short human explanation naming the evidence used, e.g. `state OUT_OF_MEMORY`.
    pub detail: String,
}

impl Classification {
    fn success(detail: impl Into<String>) -> Self {
        Self {
            class: None,
            oom: None,
            detail: detail.into(),
        }
    }
    fn failed(class: FailureClass, detail: impl Into<String>) -> Self {
        Self {
            class: Some(class),
            oom: None,
            detail: detail.into(),
        }
    }
    fn oom(kind: OomKind, detail: impl Into<String>) -> Self {
        Self {
            class: Some(FailureClass::Oom),
            oom: Some(kind),
            detail: detail.into(),
        }
    }
}

/// Application errors that make every other rank fail too (N05): they outrank the collective
/// timeouts they cause elsewhere, so the attempt is `Application` (never `Transient`: retried
/// only as the retry table in `policy` says, under `resume`, up to `max_attempts`).
const APP_ERR: &[&str] = &[
    "loss is nan",
    "nan loss",
    "loss: nan",
    "found nan",
    "nan detected",
    "nan or inf",
    "assertionerror",
    "assertion failed",
];

/// Collective and rendezvous failures (N05; NCCL watchdog, torch elastic rendezvous): the
/// infrastructure's, unless an application error explains them.
const COLLECTIVE_ERR: &[&str] = &[
    "watchdog caught collective operation timeout",
    "ncclremoteerror",
    "ncclsystemerror",
    "ncclinternalerror",
    "nccl communicator was aborted",
    "rendezvoustimeouterror",
    "rendezvousconnectionerror",
    "rendezvousclosederror",
    "distnetworkerror",
];

/// The highest training step a log mentions (`step 5300`, `step=5300`, `global_step: 12`,
/// `iteration 40`): the attempt's progress mark, `None` before the first.
pub(super) fn progress_step(log_lower: &str) -> Option<u64> {
    let mut best: Option<u64> = None;
    for key in ["step", "iteration"] {
        let mut rest = log_lower;
        while let Some(i) = rest.find(key) {
            rest = &rest[i + key.len()..];
            let digits: String = rest
                .trim_start_matches([' ', '=', ':', '_'])
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            // `steps 3` or `step size 5` have no number right after the word.
            let sep = rest.len() - rest.trim_start_matches([' ', '=', ':', '_']).len();
            if !digits.is_empty() && sep <= 2 {
                let n: u64 = digits.parse().unwrap_or(u64::MAX);
                best = Some(best.map_or(n, |b| b.max(n)));
            }
        }
    }
    best
}

/// Whether per-rank logs can decide the class of an attempt that ended in `state` (rule 6b:
/// failed or killed). Callers read them only then.
pub(super) fn uses_rank_logs(state: &JobState) -> bool {
    matches!(state, JobState::Failed | JobState::Killed { .. })
}

/// N05: an application error in any rank's log (NaN, assertion) outranks everything; a
/// collective or rendezvous failure alone is transient, before or after the first progress
/// mark (the detail says which: before it, the nodes are suspect; after it, the stage resumes).
fn rank_verdict(ev: &Evidence) -> Option<Classification> {
    let logs: Vec<(&str, String)> =
        std::iter::once(("the job log", ev.log_tail.to_ascii_lowercase()))
            .chain(
                ev.rank_logs
                    .iter()
                    .map(|(n, t)| (n.as_str(), t.to_ascii_lowercase())),
            )
            .collect();
    if let Some((name, m)) = logs
        .iter()
        .find_map(|(n, l)| contains_any(l, APP_ERR).map(|m| (*n, m)))
    {
        return Some(Classification::failed(
            FailureClass::Application,
            format!(
                "{name} shows `{m}` (an application error; collective failures in other ranks follow from it)"
            ),
        ));
    }
    let (name, m) = logs
        .iter()
        .find_map(|(n, l)| contains_any(l, COLLECTIVE_ERR).map(|m| (*n, m)))?;
    let progress = logs.iter().filter_map(|(_, l)| progress_step(l)).max();
    let phase = match progress {
        None => {
            "before the first progress mark: an infrastructure failure (retried on other nodes)"
                .to_string()
        }
        Some(s) => format!("after progress (step {s}): transient, resumes from its checkpoint"),
    };
    Some(Classification::failed(
        FailureClass::Transient,
        format!("{name} shows `{m}` {phase}"),
    ))
}

/// The verdict on a running attempt the controller cancelled because its progress mark did
/// not move for `silent` (the stage's heartbeat timeout; `last_step` is the last mark seen),
/// from its logs: an application error in any log (rule 6b) is
/// [`FailureClass::Application`] (never retried as a hang: fatal under `strict`, re-submitted up
/// to `max_attempts` under `resume`, see [the retry table](super::RetryPolicy#retry-table));
/// anything else is [`FailureClass::Hung`],
/// the detail naming the silence, the last mark and a collective failure if one shows.
pub(crate) fn classify_hung(
    ev: &Evidence,
    silent: std::time::Duration,
    last_step: Option<u64>,
) -> Classification {
    let mark = last_step.map_or_else(
        || "no progress mark yet".to_string(),
        |s| format!("last progress mark step {s}"),
    );
    let base = format!(
        "hung: no progress for {} s ({mark}), cancelled by the controller",
        silent.as_secs()
    );
    let mut c = match rank_verdict(ev) {
        // Log evidence outranks the mechanism that stopped it (issue 27): an OOM in any log.
        _ if ev.oom_cite().is_some() => {
            let (kind, cite) = ev.oom_cite().unwrap_or((OomKind::Host, String::new()));
            Classification::oom(
                kind,
                format!(
                    "out of memory ({}) behind the hang: {cite}; {base}",
                    kind_name(kind)
                ),
            )
        }
        Some(v) if v.class == Some(FailureClass::Application) => {
            Classification::failed(FailureClass::Application, format!("{}; {base}", v.detail))
        }
        Some(v) => Classification::failed(FailureClass::Hung, format!("{base}; {}", v.detail)),
        None => Classification::failed(FailureClass::Hung, base),
    };
    if let Some(why) = &ev.log_unavailable {
        c.detail = format!("{}; log unavailable ({why})", c.detail);
    }
    c
}

/// Slurm's `exit:signal` form of a status's exit (`0:125`).
fn exit_text(status: &JobStatus) -> String {
    format!(
        "{}:{}",
        status.exit_code.unwrap_or(0),
        status.signal.unwrap_or(0)
    )
}

/// `gpu` or `host`.
fn kind_name(kind: OomKind) -> &'static str {
    match kind {
        OomKind::Gpu => "gpu",
        OomKind::Host => "host",
    }
}

/// srun's own lines saying a task of a step failed or was terminated (issue 27): under a
/// `COMPLETED 0:0` accounting they prove a step failure the accounting does not show.
const SRUN_TASK_FAILED: &[&str] = &[
    ": exited with exit code",
    "srun: job step aborted",
    "srun: error: timed out waiting for job step to complete",
    "srun: terminating stepid=",
    "srun: terminating job step",
    ": killed",
    ": terminated",
];

/// The step a log's srun/slurmstepd lines name (`StepId=4711.0`, `STEP 4711.0`), if any.
fn step_named(log_lower: &str) -> Option<String> {
    for key in ["stepid=", "step "] {
        for (i, _) in log_lower.match_indices(key) {
            let rest = &log_lower[i + key.len()..];
            let id: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == '_')
                .collect();
            if id.contains('.') && id.starts_with(|c: char| c.is_ascii_digit()) {
                return Some(id);
            }
        }
    }
    None
}

const GPU_OOM: &[&str] = &[
    "cuda out of memory",
    "outofmemoryerror",
    "cuda error: out of memory",
    "cudaerrormemoryallocation",
];
const HOST_OOM: &[&str] = &[
    "oom_kill event",
    "oom-kill",
    "oom_kill",
    "out of memory: killed process",
    "exceeded job memory limit",
    "exceeded step memory limit",
];
const CONFIG_ERR: &[&str] = &[
    "unrecognized arguments",
    "error: the following arguments are required",
    "error: unexpected argument",
    "error: invalid value",
    "invalid choice:",
];

/// A line in any log that says the payload itself ran and failed (issue 27, rule 6a): an
/// application or configuration error, an out-of-memory, a Python traceback, the GPU
/// preflight; `None` when there is none.
fn app_evidence(ev: &Evidence) -> Option<&'static str> {
    const RAN: &[&str] = &[
        "traceback (most recent call last)",
        "gpu preflight:",
        "panicked at",
    ];
    std::iter::once(ev.log_tail.as_str())
        .chain(ev.rank_logs.iter().map(|(_, t)| t.as_str()))
        .map(str::to_ascii_lowercase)
        .find_map(|l| {
            [APP_ERR, CONFIG_ERR, GPU_OOM, HOST_OOM, RAN]
                .iter()
                .find_map(|set| contains_any(&l, set))
        })
}

fn contains_any(hay: &str, needles: &[&'static str]) -> Option<&'static str> {
    needles.iter().find(|n| hay.contains(**n)).copied()
}

/// Classifies a terminal [`JobStatus`] with its [`Evidence`]. Non-terminal states are
/// classified as [`FailureClass::Unknown`] with a detail saying so (callers only pass terminal
/// ones). See the [module docs](self) for the rules and their order.
pub(crate) fn classify(status: &JobStatus, ev: &Evidence) -> Classification {
    let mut c = classify_inner(status, ev);
    if let Some(why) = &ev.log_unavailable {
        c.detail = format!("{}; log unavailable ({why})", c.detail);
    }
    c
}

/// The state a bad step stands for (rule 1a): its own terminal state when it says more than
/// "failed" (OOM, timeout, node failure), else the signal that killed it, else its exit code.
fn step_as_status(status: &JobStatus, step: &StepStatus) -> JobStatus {
    let state = match (&step.state, step.signal.filter(|&s| s != 0)) {
        (
            s @ (JobState::OutOfMemory
            | JobState::Timeout
            | JobState::NodeFail
            | JobState::Preempted),
            _,
        ) => s.clone(),
        (_, Some(sig)) => JobState::Killed { signal: sig },
        (JobState::Completed, None) => JobState::Failed,
        (s, None) => s.clone(),
    };
    let mut s = JobStatus::new(status.attempt_id.clone(), state);
    s.exit_code = step.exit_code;
    s.signal = step.signal.filter(|&s| s != 0);
    s.nodes = status.nodes.clone();
    s
}

fn classify_inner(status: &JobStatus, ev: &Evidence) -> Classification {
    let log = ev.log_tail.to_ascii_lowercase();
    let state = &status.state;
    // Every log: the job log and every rank log (an OOM in any rank outranks the rest).
    let gpu_oom = ev.cite(GPU_OOM).map(|(_, m)| m);
    let host_oom = ev.cite(HOST_OOM).map(|(_, m)| m);
    // 1. completed: only when every piece of evidence agrees.
    if *state == JobState::Completed {
        // a. every step (a signal-killed step outranks the allocation row).
        if let Some(bad) = status.steps.iter().find(|s| !s.is_clean()) {
            let derived = step_as_status(status, bad);
            let inner = classify_inner(&derived, ev);
            let class = inner.class.unwrap_or(FailureClass::Unknown);
            return Classification {
                class: Some(class),
                oom: inner.oom,
                detail: format!(
                    "accounting inconsistent: allocation COMPLETED, {bad}; {}",
                    inner.detail
                ),
            };
        }
        // a'. srun's own task-failure lines under clean accounting (issue 27): a step failed
        // although every accounting row says COMPLETED 0:0.
        let srun_lines: Vec<&str> = log
            .lines()
            .filter(|l| {
                (l.starts_with("srun:") || l.contains("slurmstepd:"))
                    && SRUN_TASK_FAILED.iter().any(|m| l.contains(m))
                    && !l.contains("exited with exit code 0")
            })
            .collect();
        if !srun_lines.is_empty() && ev.success_marker != Some(true) {
            let cites: Vec<String> = SRUN_TASK_FAILED
                .iter()
                .filter_map(|m| ev.cite(&[m]).map(|(c, _)| c))
                .fold(Vec::new(), |mut v, c| {
                    if !v.contains(&c) {
                        v.push(c);
                    }
                    v
                });
            let step =
                step_named(&log).map_or_else(|| "a step".to_string(), |s| format!("step {s}"));
            let mut missing = Vec::new();
            if ev.success_marker == Some(false) {
                missing.push("the success marker (_SUCCESS)".to_string());
            }
            if let Some(p) = &ev.outputs_problem {
                missing.push(p.clone());
            }
            let exited = srun_lines
                .iter()
                .any(|l| l.contains(": exited with exit code"));
            return Classification::failed(
                if exited {
                    FailureClass::Application
                } else {
                    FailureClass::Unknown
                },
                format!(
                    "accounting inconsistent: every accounting row COMPLETED 0:0, but srun says {step} failed ({}){}",
                    cites.join("; "),
                    if missing.is_empty() {
                        String::new()
                    } else {
                        format!("; missing: {}", missing.join("; "))
                    }
                ),
            );
        }
        // b. an oom-kill event behind it (C21c).
        let oom = host_oom.or(gpu_oom);
        if let Some(m) = oom
            && ev.success_marker != Some(true)
        {
            return Classification::oom(
                OomKind::Host,
                format!(
                    "state COMPLETED but the log shows `{m}` and no success marker (suspect OOM)"
                ),
            );
        }
        // c. the worker's own success marker.
        if ev.success_marker == Some(false) {
            return Classification::failed(
                FailureClass::Unknown,
                "state COMPLETED (exit 0) but the worker wrote no success marker (_SUCCESS)",
            );
        }
        // d. the stage's declared outputs.
        if let Some(p) = &ev.outputs_problem {
            return Classification::failed(
                FailureClass::Unknown,
                format!("state COMPLETED (exit 0) but {p}"),
            );
        }
        let mut proof = vec!["completed".to_string()];
        if !status.steps.is_empty() {
            proof.push(format!("{} steps clean", status.steps.len()));
        }
        if ev.success_marker == Some(true) {
            proof.push("success marker present".into());
        }
        if oom.is_some() {
            proof.push("the log shows an oom-kill event but the success marker is present".into());
        }
        return Classification::success(proof.join("; "));
    }
    if !state.is_terminal() {
        return Classification::failed(
            FailureClass::Unknown,
            format!("state {state} is not terminal"),
        );
    }
    // 2. time limit, from the state or Slurm's log line (C22).
    if *state == JobState::Timeout || log.contains("due to time limit") {
        let how = if *state == JobState::Timeout {
            "state TIMEOUT".to_string()
        } else {
            format!("state {state}, log says DUE TO TIME LIMIT")
        };
        return if ev.resumable {
            match &ev.checkpoint {
                CheckpointEvidence::NotChecked => Classification::failed(
                    FailureClass::TimeoutResumable,
                    format!("{how}; the stage can resume"),
                ),
                CheckpointEvidence::Found(c) => Classification::failed(
                    FailureClass::TimeoutResumable,
                    format!("{how}; resumes from checkpoint {c}"),
                ),
                CheckpointEvidence::Missing => Classification::failed(
                    FailureClass::TimeoutFatal,
                    format!(
                        "{how}; the stage can resume but left no checkpoint (no _CHECKPOINT marker, no complete ckpt/step_N)"
                    ),
                ),
            }
        } else {
            Classification::failed(
                FailureClass::TimeoutFatal,
                format!("{how}; the stage cannot resume"),
            )
        };
    }
    // 3. out of memory (C20, C21a).
    let oom_cite = ev.oom_cite();
    if *state == JobState::OutOfMemory {
        let (kind, cite) = match &oom_cite {
            Some((k, c)) => (*k, format!("; {c}")),
            None => (OomKind::Host, String::new()),
        };
        let exit = match (status.exit_code, status.signal) {
            (Some(0), _) => format!(
                " (exit {}: the main process exited 0; a task or step was killed for memory)",
                exit_text(status)
            ),
            (Some(_), _) | (None, Some(_)) => format!(" (exit {})", exit_text(status)),
            (None, None) => String::new(),
        };
        return Classification::oom(
            kind,
            format!(
                "state OUT_OF_MEMORY{exit}, out of {} memory{cite}",
                kind_name(kind)
            ),
        );
    }
    if gpu_oom.is_some()
        && let Some((kind, cite)) = &oom_cite
    {
        return Classification::oom(
            *kind,
            format!("state {state}, out of {} memory: {cite}", kind_name(*kind)),
        );
    }
    let sigkill = status.signal == Some(9)
        || status.exit_code == Some(137)
        || matches!(state, JobState::Killed { signal: 9 });
    if let Some(m) = host_oom
        && (sigkill || matches!(state, JobState::Failed | JobState::Killed { .. }))
    {
        let cite = ev.cite(HOST_OOM).map(|(c, _)| c).unwrap_or_default();
        return Classification::oom(
            OomKind::Host,
            format!("state {state}, log shows `{m}`: out of host memory: {cite}"),
        );
    }
    // 3b. a missing program (issue 27): exit 127 (the shell's "command not found") with no
    // application evidence in the log, or a launch that failed with ENOENT, after the start
    // mark (before it, rule 6a: the site's setup is the suspect): a configuration error,
    // never retried, naming the program and where it was looked up.
    let launch_enoent = *state == JobState::LaunchFailed
        && status.reason.as_deref().is_some_and(|r| {
            let r = r.to_ascii_lowercase();
            r.contains("os error 2") || r.contains("no such file") || r.contains("not found")
        });
    let exit_127 = *state == JobState::Failed && status.exit_code == Some(127);
    if (launch_enoent || exit_127) && ev.start_mark != Some(false) && app_evidence(ev).is_none() {
        let how = if launch_enoent {
            format!(
                "the launch failed: {}",
                status.reason.as_deref().unwrap_or_default()
            )
        } else {
            "exit code 127 (command not found)".to_string()
        };
        let said = ev
            .cite(&["not found", "no such file or directory"])
            .map(|(c, _)| format!("; {c}"))
            .unwrap_or_default();
        return Classification::failed(
            FailureClass::Config,
            format!(
                "program `{}` not found: {how}{said}; looked up in {}",
                ev.program.as_deref().unwrap_or("(unknown)"),
                ev.lookup.as_deref().unwrap_or("the job's PATH")
            ),
        );
    }
    // 4. infrastructure (C23, C24) and preemption seen as a cancel by root.
    match state {
        JobState::NodeFail | JobState::BootFail | JobState::Preempted | JobState::LaunchFailed => {
            return Classification::failed(
                FailureClass::Transient,
                format!(
                    "state {state}{}",
                    status
                        .nodes
                        .as_ref()
                        .map(|n| format!(" on {n}"))
                        .unwrap_or_default()
                ),
            );
        }
        _ => {}
    }
    if log.contains("due to preemption") || log.contains("due to node failure") {
        return Classification::failed(
            FailureClass::Transient,
            format!("state {state}, log says the job was preempted or its node failed"),
        );
    }
    if let JobState::Cancelled { by_uid: Some(by) } = state
        && !ev.cancel_requested
    {
        if Some(*by) == ev.scheduler_uid {
            return Classification::failed(
                FailureClass::Transient,
                format!(
                    "cancelled by the scheduler's own user (uid {by}) without a request from \
                     this controller: a preemption"
                ),
            );
        }
        if *by == 0 && ev.own_uid != 0 {
            return Classification::failed(
                FailureClass::Transient,
                "cancelled by root (uid 0), not by the submitting user, without a request \
                 from this controller: a preemption",
            );
        }
    }
    // 5. deadline (C25).
    if *state == JobState::Deadline {
        return Classification::failed(
            FailureClass::Expired,
            "state DEADLINE: expired before it could run",
        );
    }
    // 6. cancels.
    if let JobState::Cancelled { by_uid } = state {
        let who = match (ev.cancel_requested, by_uid) {
            (true, _) => "by this controller".to_string(),
            (false, Some(u)) => format!("by uid {u}"),
            (false, None) => "by a user".to_string(),
        };
        return Classification::failed(FailureClass::Cancelled, format!("cancelled {who}"));
    }
    // 6a. a fast failure before the start mark, without application evidence in any log:
    // the payload never started (its node's or site's setup failed), so it is the
    // infrastructure's until proved otherwise (issue 27).
    if matches!(state, JobState::Failed | JobState::Killed { .. })
        && ev.start_mark == Some(false)
        && let (Some(ran), Some(window)) = (ev.ran_for, ev.fast_window)
        && ran <= window
        && app_evidence(ev).is_none()
    {
        let signal = match state {
            JobState::Killed { signal } => Some(*signal),
            _ => status.signal,
        };
        let how = match (status.exit_code, signal) {
            (_, Some(sig)) => format!("killed by signal {sig}"),
            (Some(c), None) => format!("exit code {c}"),
            (None, None) => "no exit code".to_string(),
        };
        return Classification::failed(
            FailureClass::Transient,
            format!(
                "state {state} ({how}) after {} s, before its start mark (the payload never started) \
                 and no application evidence in its log: an infrastructure failure{}",
                ran.as_secs(),
                status
                    .nodes
                    .as_ref()
                    .map(|n| format!(" on {n}"))
                    .unwrap_or_default()
            ),
        );
    }
    // 6b. every rank's log (N05).
    if uses_rank_logs(state)
        && let Some(c) = rank_verdict(ev)
    {
        return c;
    }
    // 7. configuration errors; the worker's GPU preflight line (N04, `executor::gpu`) names
    // the visible and the needed GPU counts, whatever the exit code.
    if let Some(line) = ev
        .log_tail
        .lines()
        .rev()
        .find(|l| l.contains("gpu preflight:"))
    {
        let line: String = line.trim().chars().take(300).collect();
        return Classification::failed(FailureClass::Config, format!("state {state}, {line}"));
    }
    if status.exit_code == Some(2) && *state == JobState::Failed {
        return Classification::failed(
            FailureClass::Config,
            "exit code 2 (bad arguments or configuration)",
        );
    }
    if let Some(m) = contains_any(&log, CONFIG_ERR) {
        return Classification::failed(
            FailureClass::Config,
            format!("state {state}, log shows `{m}`"),
        );
    }
    // 8/9.
    match state {
        JobState::Failed => Classification::failed(
            FailureClass::Application,
            match (status.exit_code, &status.reason) {
                (Some(c), _) => format!("exit code {c}"),
                // The executor says why (e.g. a malformed exit file, named with its path).
                (None, Some(r)) => format!("exit code unknown ({r})"),
                (None, None) => "exit code unknown".to_string(),
            },
        ),
        JobState::Killed { signal } if *signal == 9 => Classification::failed(
            FailureClass::Unknown,
            "killed by SIGKILL (signal 9) with no oom trace in the log: probable OOM",
        ),
        JobState::Killed { signal } => Classification::failed(
            FailureClass::Application,
            format!("killed by signal {signal}"),
        ),
        // The executor's reason says what is known (a bare-metal host's malformed pid file,
        // named with its path, issue 27).
        other => Classification::failed(
            FailureClass::Unknown,
            match &status.reason {
                Some(r) => format!("state {other} ({r})"),
                None => format!("state {other}"),
            },
        ),
    }
}

/// What a pending reason means for a job that has not started (C25).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PendingVerdict {
    /// A normal wait (priority, resources, limits that free up): keep waiting, never resubmit.
    Wait,
    /// It will not start without someone acting; reported after the controller's
    /// `stuck_after` time, then failed with the given class.
    Stuck(FailureClass),
}

/// Judges a pending reason (Slurm's `%r`, see "Job Reason Codes").
///
/// Stuck: `DependencyNeverSatisfied`, `JobHeldAdmin`, `JobHeldUser`, `QOSMaxGRESPerJob`,
/// `PartitionTimeLimit`, `InvalidQOS`, `InvalidAccount`, `ReqNodeNotAvail` with `Down` nodes,
/// (all [`FailureClass::Config`]) and `launch failed requeued held` ([`FailureClass::Transient`]).
/// Everything else (`Priority`, `Resources`, `Dependency`, `QOSMaxGRESPerUser`,
/// `AssocGrpGRES`, `JobArrayTaskLimit`, `BeginTime`, unknown reasons) is a wait.
pub(crate) fn pending_verdict(reason: &str) -> PendingVerdict {
    let r = reason.trim();
    let lower = r.to_ascii_lowercase();
    if lower.contains("launch failed requeued held") {
        return PendingVerdict::Stuck(FailureClass::Transient);
    }
    const STUCK: &[&str] = &[
        "DependencyNeverSatisfied",
        "JobHeldAdmin",
        "JobHeldUser",
        "QOSMaxGRESPerJob",
        "PartitionTimeLimit",
        "InvalidQOS",
        "InvalidAccount",
        "PartitionNodeLimit",
        "QOSMaxWallDurationPerJobLimit",
    ];
    if STUCK.iter().any(|s| r.starts_with(s)) {
        PendingVerdict::Stuck(FailureClass::Config)
    } else {
        PendingVerdict::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::AttemptId;

    fn st(state: JobState) -> JobStatus {
        JobStatus::new(AttemptId::new("c.s.0.a1").unwrap(), state)
    }
    fn ev(log: &str) -> Evidence {
        Evidence {
            log_tail: log.into(),
            own_uid: 1000,
            ..Evidence::default()
        }
    }
    fn class(s: &JobStatus, e: &Evidence) -> Option<FailureClass> {
        classify(s, e).class
    }

    #[test]
    fn completed_is_success() {
        let c = classify(&st(JobState::Completed).with_exit_code(0), &ev("done\n"));
        assert_eq!(c.class, None);
        assert_eq!(c.detail, "completed");
    }

    fn step(name: &str, state: JobState, exit: i32, sig: i32) -> StepStatus {
        StepStatus::new(name, state, Some(exit), (sig != 0).then_some(sig))
    }

    #[test]
    fn a_hung_attempt_is_classified_from_its_logs() {
        let silent = std::time::Duration::from_secs(600);
        let c = classify_hung(&ev("step 40 loss 1.2\n"), silent, Some(40));
        assert_eq!(c.class, Some(FailureClass::Hung));
        assert_eq!(
            c.detail,
            "hung: no progress for 600 s (last progress mark step 40), cancelled by the controller"
        );
        // A collective timeout in a rank log is named; an application error in any log
        // outranks the hang (never retried).
        let mut e = ev("step 40\n");
        e.rank_logs = vec![(
            "rank log 3/stdout.log".into(),
            "Watchdog caught collective operation timeout".into(),
        )];
        let c = classify_hung(&e, silent, Some(40));
        assert_eq!(c.class, Some(FailureClass::Hung));
        assert!(
            c.detail.contains(
                "rank log 3/stdout.log shows `watchdog caught collective operation timeout`"
            ),
            "{c:?}"
        );
        e.rank_logs.push((
            "rank log 5/stdout.log".into(),
            "AssertionError: bad shape".into(),
        ));
        assert_eq!(
            classify_hung(&e, silent, Some(40)).class,
            Some(FailureClass::Application)
        );
        let mut gone = ev("");
        gone.log_unavailable = Some("logs/x.log: No such file".into());
        let c = classify_hung(&gone, silent, None);
        assert!(
            c.detail.contains("no progress mark yet")
                && c.detail
                    .ends_with("log unavailable (logs/x.log: No such file)"),
            "{c:?}"
        );
    }

    #[test]
    fn success_needs_every_piece_of_evidence() {
        let ok = || {
            st(JobState::Completed).with_exit_code(0).with_steps(vec![
                step("batch", JobState::Completed, 0, 0),
                step("extern", JobState::Completed, 0, 0),
                step("0", JobState::Completed, 0, 0),
            ])
        };
        let mut e = ev("");
        e.success_marker = Some(true);
        let c = classify(&ok(), &e);
        assert_eq!(c.class, None, "{c:?}");
        assert_eq!(c.detail, "completed; 3 steps clean; success marker present");
        // The form: a failed srun step under a COMPLETED allocation.
        let s = ok().with_steps(vec![
            step("batch", JobState::Completed, 0, 0),
            step("0", JobState::Cancelled { by_uid: None }, 0, 10),
        ]);
        let c = classify(&s, &e);
        assert_eq!(c.class, Some(FailureClass::Application), "{c:?}");
        assert!(
            c.detail.starts_with(
                "accounting inconsistent: allocation COMPLETED, step 0 CANCELLED by signal 10;"
            ),
            "{c:?}"
        );
        // A step killed by SIGKILL with an oom trace is an OOM; a failed step's exit code
        // decides like a job's (exit 2: config).
        let s = ok().with_steps(vec![step("0", JobState::Failed, 0, 9)]);
        let mut oom = ev("slurmstepd: error: Detected 1 oom_kill event in StepId=4711.0");
        oom.success_marker = Some(true);
        assert_eq!(class(&s, &oom), Some(FailureClass::Oom));
        let s = ok().with_steps(vec![step("0", JobState::Failed, 2, 0)]);
        assert_eq!(class(&s, &e), Some(FailureClass::Config));
        let s = ok().with_steps(vec![step("0", JobState::OutOfMemory, 0, 125)]);
        assert_eq!(class(&s, &e), Some(FailureClass::Oom));
        // Slurm's extern step is cancelled when the allocation ends: not a disagreement.
        let s = ok().with_steps(vec![step(
            "extern",
            JobState::Cancelled { by_uid: None },
            0,
            15,
        )]);
        assert_eq!(class(&s, &e), None);
        // No success marker: not done.
        let mut no_marker = ev("");
        no_marker.success_marker = Some(false);
        let c = classify(&ok(), &no_marker);
        assert_eq!(c.class, Some(FailureClass::Unknown));
        assert!(c.detail.contains("no success marker"), "{c:?}");
        // Declared outputs missing or invalid: not done.
        let mut bad_out = e.clone();
        bad_out.outputs_problem = Some("declared output `scores.json` is missing".into());
        let c = classify(&ok(), &bad_out);
        assert_eq!(c.class, Some(FailureClass::Unknown));
        assert_eq!(
            c.detail,
            "state COMPLETED (exit 0) but declared output `scores.json` is missing"
        );
        // An unreadable log is named, never read as clean.
        let mut unread = ev("");
        unread.log_unavailable = Some("permission denied".into());
        let c = classify(&st(JobState::Failed).with_exit_code(1), &unread);
        assert_eq!(c.class, Some(FailureClass::Application));
        assert!(
            c.detail.ends_with("; log unavailable (permission denied)"),
            "{c:?}"
        );
    }

    #[test]
    fn c20_out_of_memory_state() {
        // 4711|OUT_OF_MEMORY|0:125
        let s = st(JobState::OutOfMemory).with_exit_code(0).with_signal(125);
        let c = classify(&s, &ev(""));
        assert_eq!(c.class, Some(FailureClass::Oom));
        assert_eq!(c.oom, Some(OomKind::Host));
    }

    #[test]
    fn c21a_cuda_oom_behind_failed() {
        let s = st(JobState::Failed).with_exit_code(1);
        let c = classify(
            &s,
            &ev(
                "Traceback...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
            ),
        );
        assert_eq!(c.class, Some(FailureClass::Oom));
        assert_eq!(c.oom, Some(OomKind::Gpu));
    }

    #[test]
    fn c21b_exit_137_without_hint_is_probable_oom_not_oom() {
        let s = st(JobState::Killed { signal: 9 }).with_exit_code(137);
        let c = classify(&s, &ev("step 100\n"));
        assert_eq!(c.class, Some(FailureClass::Unknown));
        assert!(c.detail.contains("probable OOM"), "{}", c.detail);
        // FAILED|137:0 as Slurm reports it.
        let s = st(JobState::Failed).with_exit_code(137);
        assert_eq!(class(&s, &ev("")), Some(FailureClass::Application));
    }

    #[test]
    fn exit_137_with_oom_kill_is_oom() {
        let s = st(JobState::Failed).with_exit_code(137);
        let c = classify(&s, &ev("Out of memory: Killed process 4242 (python)\n"));
        assert_eq!(c.class, Some(FailureClass::Oom));
        assert_eq!(c.oom, Some(OomKind::Host));
    }

    #[test]
    fn c21c_completed_with_oom_kill_event_needs_the_marker() {
        let log = "slurmstepd: error: Detected 1 oom_kill event in StepId=4711.batch. Some of your processes may have been killed by the cgroup out-of-memory handler.\n";
        let s = st(JobState::Completed).with_exit_code(0);
        let mut e = ev(log);
        assert_eq!(class(&s, &e), Some(FailureClass::Oom));
        e.success_marker = Some(false);
        assert_eq!(class(&s, &e), Some(FailureClass::Oom));
        e.success_marker = Some(true);
        assert_eq!(class(&s, &e), None);
    }

    #[test]
    fn c22_timeout_by_state_and_by_log_not_exit_code() {
        let mut e =
            ev("*** JOB 4711 ON node01 CANCELLED AT 2024-01-01T10:00:00 DUE TO TIME LIMIT ***\n");
        let s = st(JobState::Timeout).with_exit_code(0).with_signal(15);
        assert_eq!(class(&s, &e), Some(FailureClass::TimeoutFatal));
        e.resumable = true;
        assert_eq!(class(&s, &e), Some(FailureClass::TimeoutResumable));
        // Reported as a user cancel, but the log says time limit.
        let s = st(JobState::Cancelled { by_uid: Some(0) });
        assert_eq!(class(&s, &e), Some(FailureClass::TimeoutResumable));
        // Exit 143 alone is not a timeout.
        let s = st(JobState::Failed).with_exit_code(143);
        assert_eq!(class(&s, &ev("")), Some(FailureClass::Application));
    }

    /// N03: a resumable stage's timeout is resumable only with checkpoint evidence; the exit
    /// code and the signal (SIGTERM at the limit, then SIGKILL after KillWait) never decide.
    #[test]
    fn n03_timeout_needs_checkpoint_evidence_to_resume() {
        use CheckpointEvidence::*;
        let limit =
            "*** JOB 4711 ON node01 CANCELLED AT 2024-01-01T10:02:00 DUE TO TIME LIMIT ***\n";
        // (state, signal, log, resumable, checkpoint, class, detail part)
        type Case<'a> = (
            JobState,
            Option<i32>,
            &'a str,
            bool,
            CheckpointEvidence,
            FailureClass,
            &'a str,
        );
        let cases: Vec<Case> = vec![
            (
                JobState::Timeout,
                Some(15),
                "",
                true,
                Found("ckpt/step_1200".into()),
                FailureClass::TimeoutResumable,
                "resumes from checkpoint ckpt/step_1200",
            ),
            (
                JobState::Timeout,
                Some(9),
                "",
                true,
                Found("_CHECKPOINT: step 1200".into()),
                FailureClass::TimeoutResumable,
                "_CHECKPOINT: step 1200",
            ),
            (
                JobState::Cancelled { by_uid: Some(0) },
                None,
                limit,
                true,
                Found("ckpt/step_1200".into()),
                FailureClass::TimeoutResumable,
                "DUE TO TIME LIMIT",
            ),
            (
                JobState::Timeout,
                Some(15),
                "",
                true,
                Missing,
                FailureClass::TimeoutFatal,
                "left no checkpoint",
            ),
            (
                JobState::Timeout,
                Some(9),
                limit,
                true,
                Missing,
                FailureClass::TimeoutFatal,
                "left no checkpoint",
            ),
            (
                JobState::Timeout,
                Some(15),
                "",
                false,
                Found("ckpt/step_1200".into()),
                FailureClass::TimeoutFatal,
                "cannot resume",
            ),
            (
                JobState::Timeout,
                None,
                "",
                true,
                NotChecked,
                FailureClass::TimeoutResumable,
                "the stage can resume",
            ),
        ];
        for (i, (state, sig, log, resumable, ckpt, want, part)) in cases.into_iter().enumerate() {
            let mut s = st(state);
            s.signal = sig;
            let mut e = ev(log);
            e.resumable = resumable;
            e.checkpoint = ckpt;
            let c = classify(&s, &e);
            assert_eq!(c.class, Some(want), "case {i}: {}", c.detail);
            assert!(c.detail.contains(part), "case {i}: {}", c.detail);
        }
    }

    /// N04: the worker's GPU preflight line is a configuration failure naming both counts,
    /// whatever the exit code (a wrapper may turn 2 into 1).
    #[test]
    fn n04_gpu_preflight_line_is_config() {
        let line = "error: gpu preflight: 0 GPU(s) visible (SLURM_JOB_GPUS=\"NoDevFiles\") but the stage mesh needs 4 per node";
        for code in [2, 1] {
            let s = st(JobState::Failed).with_exit_code(code);
            let c = classify(&s, &ev(&format!("loading\n{line}\n")));
            assert_eq!(c.class, Some(FailureClass::Config), "{}", c.detail);
            assert!(
                c.detail.contains("0 GPU(s) visible") && c.detail.contains("needs 4 per node"),
                "{}",
                c.detail
            );
        }
    }

    #[test]
    fn c23_node_and_boot_fail_are_transient() {
        let s = st(JobState::NodeFail)
            .with_exit_code(1)
            .with_nodes("node07");
        let c = classify(&s, &ev(""));
        assert_eq!(c.class, Some(FailureClass::Transient));
        assert!(c.detail.contains("node07"), "{}", c.detail);
        let s = st(JobState::BootFail)
            .with_exit_code(0)
            .with_nodes("node08");
        assert_eq!(class(&s, &ev("")), Some(FailureClass::Transient));
    }

    #[test]
    fn c24_preempted_and_requeue() {
        assert_eq!(
            class(&st(JobState::Preempted), &ev("")),
            Some(FailureClass::Transient)
        );
        // A requeued job is not terminal: nothing to classify as failed for good.
        let c = classify(&st(JobState::Requeued).with_restarts(3), &ev(""));
        assert!(c.detail.contains("not terminal"));
        // A final COMPLETED after three requeues is a success.
        assert_eq!(
            class(&st(JobState::Completed).with_restarts(3), &ev("")),
            None
        );
    }

    #[test]
    fn c25_deadline_is_expired_and_pending_reasons() {
        assert_eq!(
            class(&st(JobState::Deadline), &ev("")),
            Some(FailureClass::Expired)
        );
        for r in [
            "Priority",
            "Resources",
            "Dependency",
            "QOSMaxGRESPerUser",
            "AssocGrpGRES",
            "JobArrayTaskLimit",
            "BeginTime",
        ] {
            assert_eq!(pending_verdict(r), PendingVerdict::Wait, "{r}");
        }
        for r in [
            "DependencyNeverSatisfied",
            "JobHeldAdmin",
            "QOSMaxGRESPerJob",
            "PartitionTimeLimit",
            "InvalidQOS",
        ] {
            assert_eq!(
                pending_verdict(r),
                PendingVerdict::Stuck(FailureClass::Config),
                "{r}"
            );
        }
        assert_eq!(
            pending_verdict("launch failed requeued held"),
            PendingVerdict::Stuck(FailureClass::Transient)
        );
    }

    #[test]
    fn launch_failure_is_transient_unless_the_program_is_missing() {
        let s = st(JobState::LaunchFailed)
            .with_reason("cannot start the command: Permission denied (os error 13)");
        assert_eq!(class(&s, &ev("")), Some(FailureClass::Transient));
    }

    /// Issue 27, item 4: a missing program is a configuration error naming the program and
    /// where it was looked up; before the start mark, or with application evidence, it is not.
    #[test]
    fn a_missing_program_is_config_naming_it() {
        let with = |log: &str, mark: Option<bool>| Evidence {
            program: Some("pythn".into()),
            lookup: Some("PATH=/usr/bin:/bin, working directory /repo".into()),
            start_mark: mark,
            ..ev(log)
        };
        let enoent = st(JobState::LaunchFailed)
            .with_exit_code(127)
            .with_reason("cannot start the command: No such file or directory (os error 2)");
        let c = classify(&enoent, &with("", None));
        assert_eq!(c.class, Some(FailureClass::Config), "{c:?}");
        assert_eq!(
            c.detail,
            "program `pythn` not found: the launch failed: cannot start the command: No such file or directory (os error 2); looked up in PATH=/usr/bin:/bin, working directory /repo"
        );
        let e127 = st(JobState::Failed).with_exit_code(127);
        for (log, mark, want, part) in [
            (
                "",
                Some(true),
                FailureClass::Config,
                "exit code 127 (command not found)",
            ),
            (
                "/bin/sh: 1: pythn: not found\n",
                None,
                FailureClass::Config,
                "the job log (line 1 of its tail): /bin/sh: 1: pythn: not found",
            ),
            (
                "Traceback (most recent call last):\n",
                None,
                FailureClass::Application,
                "exit code 127",
            ),
            ("", Some(false), FailureClass::Application, "exit code 127"),
        ] {
            let c = classify(&e127, &with(log, mark));
            assert_eq!(c.class, Some(want), "{log:?} {mark:?}: {c:?}");
            assert!(c.detail.contains(part), "{}", c.detail);
        }
    }

    #[test]
    fn cancel_by_root_unrequested_is_preemption_but_requested_is_cancel() {
        let s = st(JobState::Cancelled { by_uid: Some(0) });
        assert_eq!(class(&s, &ev("")), Some(FailureClass::Transient));
        let mut e = ev("");
        e.cancel_requested = true;
        assert_eq!(class(&s, &e), Some(FailureClass::Cancelled));
        // Run as root with SlurmUser=slurm(64030): root is the submitting user, so a cancel
        // by root is a user's; a cancel by SlurmUser is the scheduler's (a preemption).
        let mut e = ev("");
        e.own_uid = 0;
        e.scheduler_uid = Some(64030);
        assert_eq!(class(&s, &e), Some(FailureClass::Cancelled));
        let by_slurm = st(JobState::Cancelled {
            by_uid: Some(64030),
        });
        assert_eq!(class(&by_slurm, &e), Some(FailureClass::Transient));
        // Run as root with SlurmUser=root (the local cluster): the scheduler's own user.
        e.scheduler_uid = Some(0);
        let c = classify(&s, &e);
        assert_eq!(c.class, Some(FailureClass::Transient), "{c:?}");
        assert!(c.detail.contains("scheduler's own user (uid 0)"), "{c:?}");
        // Run as an ordinary user whose cancel is not a preemption, whoever runs.
        let mut e = ev("");
        e.own_uid = 12345;
        e.scheduler_uid = Some(64030);
        let by_me = st(JobState::Cancelled {
            by_uid: Some(12345),
        });
        assert_eq!(class(&by_me, &e), Some(FailureClass::Cancelled));
        let s = st(JobState::Cancelled {
            by_uid: Some(12345),
        });
        let c = classify(&s, &ev(""));
        assert_eq!(c.class, Some(FailureClass::Cancelled));
        assert_eq!(c.detail, "cancelled by uid 12345");
        // Slurm's log line for a preemption.
        let s = st(JobState::Cancelled { by_uid: None });
        let e = ev(
            "slurmstepd: error: *** JOB 4711 ON n1 CANCELLED AT 2024-01-01T10:00:00 DUE TO PREEMPTION ***",
        );
        assert_eq!(class(&s, &e), Some(FailureClass::Transient));
    }

    #[test]
    fn config_errors_by_exit_2_and_by_log() {
        let s = st(JobState::Failed).with_exit_code(2);
        assert_eq!(class(&s, &ev("")), Some(FailureClass::Config));
        let s = st(JobState::Failed).with_exit_code(1);
        let e = ev(
            "usage: train.py [-h] --lr LR\ntrain.py: error: unrecognized arguments: --lrr 0.1\n",
        );
        assert_eq!(class(&s, &e), Some(FailureClass::Config));
        let e = ev(
            "error: invalid value 'abc' for '--epochs <EPOCHS>': invalid digit found in string\n",
        );
        assert_eq!(class(&s, &e), Some(FailureClass::Config));
    }

    #[test]
    fn application_unknown_and_other_signals() {
        let s = st(JobState::Failed).with_exit_code(1);
        let c = classify(&s, &ev("ValueError: nan loss\n"));
        assert_eq!(c.class, Some(FailureClass::Application));
        assert!(
            c.detail.starts_with("the job log shows `nan loss`"),
            "{c:?}"
        );
        let c = classify(&s, &ev("ValueError: bad shape\n"));
        assert_eq!(
            (c.class, c.detail.as_str()),
            (Some(FailureClass::Application), "exit code 1")
        );
        assert_eq!(
            class(&st(JobState::Killed { signal: 11 }), &ev("")),
            Some(FailureClass::Application)
        );
        assert_eq!(
            class(&st(JobState::Lost), &ev("")),
            Some(FailureClass::Unknown)
        );
    }

    /// Issue 27, item 1: a failure before the start mark within the window, with no
    /// application evidence in any log, is the infrastructure's; each condition is needed.
    #[test]
    fn fast_failure_before_the_start_mark_is_infrastructure() {
        use std::time::Duration;
        let fast = |mark: Option<bool>, secs: u64, log: &str, rank: Option<&str>| Evidence {
            start_mark: mark,
            ran_for: Some(Duration::from_secs(secs)),
            fast_window: Some(Duration::from_secs(60)),
            rank_logs: rank
                .map(|r| vec![("rank log 0/stdout.log".to_string(), r.to_string())])
                .unwrap_or_default(),
            ..ev(log)
        };
        let failed = st(JobState::Failed).with_exit_code(1).with_nodes("n2");
        // (case, status, evidence, class, detail part)
        let table: Vec<(&str, JobStatus, Evidence, Option<FailureClass>, &str)> = vec![
            (
                "FAILED 1:0 after 2 s, no log, no start mark",
                failed.clone(),
                fast(Some(false), 2, "", None),
                Some(FailureClass::Transient),
                "state FAILED (exit code 1) after 2 s, before its start mark (the payload never started) and no application evidence in its log: an infrastructure failure on n2",
            ),
            (
                "the site's setup said why (not application evidence)",
                failed.clone(),
                fast(
                    Some(false),
                    3,
                    "bash: line 4: cd: /repo: No such file or directory\n",
                    None,
                ),
                Some(FailureClass::Transient),
                "before its start mark",
            ),
            (
                "killed by a signal before the start mark",
                st(JobState::Killed { signal: 9 }).with_nodes("n2"),
                fast(Some(false), 1, "", None),
                Some(FailureClass::Transient),
                "killed by signal 9",
            ),
            (
                "exactly at the window",
                failed.clone(),
                fast(Some(false), 60, "", None),
                Some(FailureClass::Transient),
                "after 60 s",
            ),
            (
                "after the window",
                failed.clone(),
                fast(Some(false), 61, "", None),
                Some(FailureClass::Application),
                "exit code 1",
            ),
            (
                "the start mark is there: the payload failed",
                failed.clone(),
                fast(Some(true), 2, "", None),
                Some(FailureClass::Application),
                "exit code 1",
            ),
            (
                "the executor writes no start mark",
                failed.clone(),
                fast(None, 2, "", None),
                Some(FailureClass::Application),
                "exit code 1",
            ),
            (
                "a traceback in the job log",
                failed.clone(),
                fast(
                    Some(false),
                    2,
                    "Traceback (most recent call last):\n  File \"x.py\"\nImportError: no module\n",
                    None,
                ),
                Some(FailureClass::Application),
                "exit code 1",
            ),
            (
                "an application error in a rank log",
                failed.clone(),
                fast(Some(false), 2, "", Some("AssertionError: loss is NaN")),
                Some(FailureClass::Application),
                "rank log 0/stdout.log shows `loss is nan`",
            ),
            (
                "an argument error",
                failed.clone(),
                fast(Some(false), 2, "error: unexpected argument '--lrr'", None),
                Some(FailureClass::Config),
                "unexpected argument",
            ),
            (
                "a CUDA OOM",
                failed.clone(),
                fast(
                    Some(false),
                    2,
                    "torch.OutOfMemoryError: CUDA out of memory.",
                    None,
                ),
                Some(FailureClass::Oom),
                "out of gpu memory",
            ),
            (
                "a cancel is never a fast failure",
                st(JobState::Cancelled {
                    by_uid: Some(12345),
                }),
                fast(Some(false), 2, "", None),
                Some(FailureClass::Cancelled),
                "cancelled by uid 12345",
            ),
        ];
        for (case, s, e, want, part) in &table {
            let c = classify(s, e);
            assert_eq!(c.class, *want, "{case}: {c:?}");
            assert!(c.detail.contains(part), "{case}: {}", c.detail);
        }
        // Charged to the node like any transient failure before the first progress mark.
        let c = classify(&failed, &fast(Some(false), 2, "", None));
        assert!(super::super::nodes::fails_fast(
            &JobState::Failed,
            c.class,
            &fast(Some(false), 2, "", None)
        ));
    }

    /// Issue 27, item 2: log evidence outranks the mechanism that stopped the job, and the
    /// verdict names the kind and the lines (file:line).
    #[test]
    fn all_evidence_one_verdict_with_the_lines_cited() {
        use std::path::PathBuf;
        let cuda = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB";
        let with = |log: &str, ranks: &[(&str, &str)]| Evidence {
            log_path: Some(PathBuf::from("/c/logs/a1.log")),
            log_first_line: 100,
            rank_dir: Some(PathBuf::from("/c/work/s/0/logs")),
            rank_logs: ranks
                .iter()
                .map(|(n, t)| (format!("rank log {n}"), t.to_string()))
                .collect(),
            ..ev(log)
        };
        // Hung, but every rank says CUDA out of memory: an OOM of the GPU, cited.
        let e = with(
            "step 3\n",
            &[
                ("0/stdout.log", &format!("step 3\n{cuda}\n")),
                ("1/stdout.log", &format!("step 3\nloading\n{cuda}\n")),
            ],
        );
        let c = classify_hung(&e, std::time::Duration::from_secs(600), Some(3));
        assert_eq!(
            (c.class, c.oom),
            (Some(FailureClass::Oom), Some(OomKind::Gpu)),
            "{c:?}"
        );
        assert!(
            c.detail.starts_with(&format!(
                "out of memory (gpu) behind the hang: /c/work/s/0/logs/0/stdout.log (line 2 of its tail): {cuda}; hung: no progress for 600 s"
            )),
            "{}",
            c.detail
        );
        // Killed (SIGKILL), a host oom-kill line in the job log: OOM of the host, file:line.
        let e = with(
            "step 1\nslurmstepd: error: Detected 1 oom_kill event in StepId=4711.0. Some of the step tasks have been OOM Killed.\n",
            &[],
        );
        let c = classify(&st(JobState::Killed { signal: 9 }), &e);
        assert_eq!(
            (c.class, c.oom),
            (Some(FailureClass::Oom), Some(OomKind::Host)),
            "{c:?}"
        );
        assert!(
            c.detail
                .contains("/c/logs/a1.log:101: slurmstepd: error: Detected 1 oom_kill event"),
            "{}",
            c.detail
        );
        // FAILED with the CUDA line in one rank only (the job log says nothing).
        let e = with("", &[("3/stdout.log", cuda)]);
        let c = classify(&st(JobState::Failed).with_exit_code(1), &e);
        assert_eq!(
            (c.class, c.oom),
            (Some(FailureClass::Oom), Some(OomKind::Gpu)),
            "{c:?}"
        );
        assert!(
            c.detail.contains("/c/work/s/0/logs/3/stdout.log"),
            "{}",
            c.detail
        );
        // Every accounting row COMPLETED 0:0, srun's own lines say a task failed, an output is
        // missing: a step failure, naming the step, srun's lines and the missing output.
        let srun = "epoch 1\nsrun: error: n1: task 1: Exited with exit code 1\nsrun: Terminating StepId=4711.0\nslurmstepd: error: *** STEP 4711.0 ON n1 CANCELLED AT 2024-01-01T10:00:00 ***\nsrun: error: n1: task 0: Terminated\n";
        let mut e = with(srun, &[]);
        e.success_marker = Some(false);
        e.outputs_problem = Some("declared output `model.bin` is missing in /c/work/s/0".into());
        let mut s = st(JobState::Completed).with_exit_code(0);
        s.steps = ["4711.batch", "4711.extern", "4711.0"]
            .iter()
            .map(|n| step(n, JobState::Completed, 0, 0))
            .collect();
        let c = classify(&s, &e);
        assert_eq!(c.class, Some(FailureClass::Application), "{c:?}");
        for part in [
            "accounting inconsistent: every accounting row COMPLETED 0:0, but srun says step 4711.0 failed",
            "/c/logs/a1.log:101: srun: error: n1: task 1: Exited with exit code 1",
            "/c/logs/a1.log:102: srun: Terminating StepId=4711.0",
            "/c/logs/a1.log:104: srun: error: n1: task 0: Terminated",
            "missing: the success marker (_SUCCESS); declared output `model.bin` is missing",
        ] {
            assert!(c.detail.contains(part), "{part}: {}", c.detail);
        }
        // Only terminated tasks, no exit code: a step failure of unknown cause.
        let mut e = with("srun: error: n1: task 0: Terminated\n", &[]);
        e.success_marker = Some(false);
        assert_eq!(classify(&s, &e).class, Some(FailureClass::Unknown));
        // srun lines but the success marker is there: a clean success stands.
        let mut e = with("srun: error: n1: task 0: Exited with exit code 0\n", &[]);
        e.success_marker = Some(true);
        assert_eq!(classify(&s, &e).class, None);
        // OUT_OF_MEMORY with exit 0:125: the main process exited 0; the kind is named.
        let oom = st(JobState::OutOfMemory).with_exit_code(0).with_signal(125);
        let c = classify(&oom, &with("", &[]));
        assert_eq!(
            (c.class, c.oom),
            (Some(FailureClass::Oom), Some(OomKind::Host))
        );
        assert_eq!(
            c.detail,
            "state OUT_OF_MEMORY (exit 0:125: the main process exited 0; a task or step was killed for memory), out of host memory"
        );
        let c = classify(&oom, &with(cuda, &[]));
        assert_eq!(c.oom, Some(OomKind::Gpu), "{c:?}");
        assert!(
            c.detail
                .contains("out of gpu memory; /c/logs/a1.log:100: torch.OutOfMemoryError"),
            "{}",
            c.detail
        );
    }

    #[test]
    fn exceeded_step_memory_limit_is_oom() {
        let s = st(JobState::Failed).with_exit_code(1);
        let e = ev("slurmstepd: error: Exceeded step memory limit at some point.\n");
        assert_eq!(class(&s, &e), Some(FailureClass::Oom));
    }

    #[test]
    fn class_names_roundtrip_serde() {
        for c in FailureClass::ALL {
            let j = serde_json::to_string(c).unwrap();
            assert_eq!(j, format!("\"{}\"", c.as_str()));
            let back: FailureClass = serde_json::from_str(&j).unwrap();
            assert_eq!(back, *c);
        }
    }

    /// N05 (`docs/evidence.md`): 16 rank logs; every one is read, the phase
    /// (before/after the first progress mark) decides how a collective failure is retried, and
    /// an application error in any rank outranks the timeouts it causes in the others.
    #[test]
    fn n05_every_rank_log_classified_by_phase() {
        let ranks = |special: &[(usize, &str)], others: &str| -> Vec<(String, String)> {
            (0..16)
                .map(|r| {
                    let text = special
                        .iter()
                        .find(|(i, _)| *i == r)
                        .map_or(others.to_string(), |(_, t)| t.to_string());
                    (format!("rank log {r:02}/stdout.log"), text)
                })
                .collect()
        };
        let watchdog = "[Rank 11] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600001 milliseconds before timing out.\nncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n";
        let failed = st(JobState::Failed).with_exit_code(1);
        let with = |logs: Vec<(String, String)>, main: &str| Evidence {
            rank_logs: logs,
            ..ev(main)
        };
        let table: Vec<(&str, Evidence, Option<FailureClass>, &str)> = vec![
            (
                "watchdog in rank 11 before step 0, the last log only `Terminated`",
                with(
                    ranks(&[(11, watchdog), (15, "Terminated\n")], "loading data\n"),
                    "",
                ),
                Some(FailureClass::Transient),
                "rank log 11/stdout.log shows `watchdog caught collective operation timeout` before the first progress mark",
            ),
            (
                "rendezvous timeout in every rank",
                with(
                    ranks(
                        &[],
                        "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n",
                    ),
                    "",
                ),
                Some(FailureClass::Transient),
                "rank log 00/stdout.log shows `rendezvoustimeouterror` before the first progress mark",
            ),
            (
                "the same watchdog after progress",
                with(ranks(&[(11, watchdog)], "step 1200 loss 2.31\n"), ""),
                Some(FailureClass::Transient),
                "after progress (step 1200)",
            ),
            (
                "NaN at step 5300 in rank 3, timeouts in the others",
                with(
                    ranks(
                        &[
                            (3, "step 5300: AssertionError: loss is NaN\n"),
                            (11, watchdog),
                        ],
                        "step 5300\n",
                    ),
                    "",
                ),
                Some(FailureClass::Application),
                "rank log 03/stdout.log shows `loss is nan`",
            ),
            (
                "no rank logs, collective failure in the job log",
                ev(watchdog),
                Some(FailureClass::Transient),
                "the job log shows `watchdog caught collective operation timeout`",
            ),
        ];
        for (case, e, want, detail) in &table {
            let c = classify(&failed, e);
            assert_eq!(c.class, *want, "{case}: {c:?}");
            assert!(c.detail.contains(detail), "{case}: {}", c.detail);
        }
        // A completed job is never failed for a warning line in a rank log.
        let ok = classify(
            &st(JobState::Completed).with_exit_code(0),
            &with(ranks(&[(2, "NCCL WARN retrying\n")], ""), ""),
        );
        assert_eq!(ok.class, None, "{ok:?}");
        assert_eq!(
            progress_step("global_step: 12\nstep=40 of 100\nsteps 3\n"),
            Some(40)
        );
        assert_eq!(progress_step("loading\nstep size 5\n"), None);
    }
}
