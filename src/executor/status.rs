//! Where a job is: [`JobState`] and [`JobStatus`].

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::AttemptId;

/// The state of one job, in terms common to every executor (Slurm's names where they exist).
///
/// Terminal states ([`JobState::is_terminal`]) never change again for the same job, except that
/// a scheduler may requeue a job ([`JobState::Requeued`], then `Pending` again under the same id).
/// Non-terminal states: `Pending`, `Running`, `Completing`, `Suspended`, `Requeued`, `Unknown`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
#[non_exhaustive]
pub enum JobState {
    /// Accepted, waiting for resources (Slurm `PENDING`, `CONFIGURING`, `REQUEUE_HOLD`,
    /// `RESV_DEL_HOLD`; local: waiting for a concurrency or GPU slot). The reason, when known,
    /// is in [`JobStatus::reason`].
    Pending,
    /// Running.
    Running,
    /// Finished its work, being cleaned up (Slurm `COMPLETING`, `STAGE_OUT`, `SIGNALING`).
    /// Not terminal: outputs may not be complete yet.
    Completing,
    /// Suspended (Slurm `SUSPENDED`, `STOPPED`).
    Suspended,
    /// Put back in the queue by the scheduler (Slurm `REQUEUED`, `REQUEUE_FED`, `RESIZING`);
    /// it will run again under the same job id. Not terminal, never a reason to resubmit.
    Requeued,
    /// Exited 0 (Slurm `COMPLETED`).
    Completed,
    /// Exited with a non-zero code, in [`JobStatus::exit_code`] (Slurm `FAILED`, `SPECIAL_EXIT`).
    Failed,
    /// Killed by a signal it did not ask for, e.g. `signal: 9` (SIGKILL; shells report this as
    /// exit 137). Local: the wrapper saw the signal; Slurm: `FAILED` with ExitCode `0:S`.
    Killed {
        /// The signal number (Linux numbering).
        signal: i32,
    },
    /// Cancelled (Slurm `CANCELLED`, `CANCELLED by <uid>`; local: cancelled through
    /// [`Executor::cancel`](super::Executor::cancel)).
    Cancelled {
        /// The uid that cancelled it, when the scheduler says (`CANCELLED by 12345`).
        by_uid: Option<u32>,
    },
    /// Exceeded its wall-clock limit (Slurm `TIMEOUT`; local: walltime enforced).
    Timeout,
    /// Killed for exceeding its memory limit (Slurm `OUT_OF_MEMORY`).
    OutOfMemory,
    /// A node it ran on failed (Slurm `NODE_FAIL`).
    NodeFail,
    /// Preempted and not requeued (Slurm `PREEMPTED`).
    Preempted,
    /// A node failed to boot for it; it never ran (Slurm `BOOT_FAIL`).
    BootFail,
    /// Could not start before its deadline (Slurm `DEADLINE`): expired, not failed.
    Deadline,
    /// The executor could not start the process (local: program not found, not executable,
    /// bad working directory). The error text is in [`JobStatus::reason`].
    LaunchFailed,
    /// The scheduler no longer knows the job and left no final record (after the executor's
    /// grace period). Reported so the caller can apply its policy; never silently retried.
    Lost,
    /// A state this executor does not recognise (the raw text is kept); not terminal, re-polled.
    Unknown {
        /// The scheduler's text, e.g. `FOO`.
        raw: String,
    },
}

impl JobState {
    /// Whether the job is over (it will not change state again unless requeued).
    pub fn is_terminal(&self) -> bool {
        !matches!(
            self,
            JobState::Pending
                | JobState::Running
                | JobState::Completing
                | JobState::Suspended
                | JobState::Requeued
                | JobState::Unknown { .. }
        )
    }

    /// Whether the job succeeded (only [`JobState::Completed`]).
    pub fn is_success(&self) -> bool {
        matches!(self, JobState::Completed)
    }

    /// Whether the job is still queued or running (the negation of [`is_terminal`]).
    ///
    /// [`is_terminal`]: JobState::is_terminal
    pub fn is_active(&self) -> bool {
        !self.is_terminal()
    }

    /// Slurm-style upper-case name, e.g. `OUT_OF_MEMORY`, `CANCELLED`, `KILLED`.
    pub fn name(&self) -> &'static str {
        match self {
            JobState::Pending => "PENDING",
            JobState::Running => "RUNNING",
            JobState::Completing => "COMPLETING",
            JobState::Suspended => "SUSPENDED",
            JobState::Requeued => "REQUEUED",
            JobState::Completed => "COMPLETED",
            JobState::Failed => "FAILED",
            JobState::Killed { .. } => "KILLED",
            JobState::Cancelled { .. } => "CANCELLED",
            JobState::Timeout => "TIMEOUT",
            JobState::OutOfMemory => "OUT_OF_MEMORY",
            JobState::NodeFail => "NODE_FAIL",
            JobState::Preempted => "PREEMPTED",
            JobState::BootFail => "BOOT_FAIL",
            JobState::Deadline => "DEADLINE",
            JobState::LaunchFailed => "LAUNCH_FAILED",
            JobState::Lost => "LOST",
            JobState::Unknown { .. } => "UNKNOWN",
        }
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobState::Killed { signal } => write!(f, "KILLED(signal {signal})"),
            JobState::Cancelled { by_uid: Some(uid) } => write!(f, "CANCELLED by {uid}"),
            JobState::Unknown { raw } => write!(f, "UNKNOWN({raw})"),
            other => f.write_str(other.name()),
        }
    }
}

/// Everything an executor knows about one job at one poll: its state plus the evidence a
/// controller needs to classify a failure (exit code, signal, log path, restarts, reason).
///
/// Construct with [`JobStatus::new`] and the `with_*` methods (the struct is `#[non_exhaustive]`
/// so fields can be added without breaking user executors).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct JobStatus {
    /// The attempt this status is about.
    pub attempt_id: AttemptId,
    /// The state.
    pub state: JobState,
    /// The exit code (0-255) when the job exited; `None` while running or when killed by signal
    /// before it could exit.
    pub exit_code: Option<i32>,
    /// The terminating signal when one was reported (Slurm ExitCode `N:S` with `S != 0`;
    /// local: the signal that killed the process).
    pub signal: Option<i32>,
    /// Why it is pending or failed to launch (Slurm reason `Priority`, `Resources`, ...; local:
    /// `concurrency limit`, `waiting for 2 GPUs`), or a note such as "exit 137: likely SIGKILL".
    pub reason: Option<String>,
    /// Times the scheduler restarted it under the same job id (Slurm requeues).
    pub restarts: u32,
    /// Where stdout/stderr go, when known.
    pub log_path: Option<PathBuf>,
    /// Nodes it ran on, in the scheduler's notation (Slurm `n[1-4]`; local: `localhost`).
    pub nodes: Option<String>,
    /// Start time, milliseconds since the Unix epoch, when known.
    pub started_at_ms: Option<u64>,
    /// End time, milliseconds since the Unix epoch, when known.
    pub ended_at_ms: Option<u64>,
    /// The job's steps as the scheduler accounted them (Slurm `sacct` rows `ID.batch`,
    /// `ID.extern`, `ID.0`, ...), sorted by name; empty when the executor has no steps or the
    /// accounting is not available. A controller compares them with [`state`](Self::state):
    /// a step killed by a signal under a `COMPLETED` allocation is a failure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepStatus>,
    /// The job has left the scheduler's queue but its accounting record cannot be read yet
    /// (Slurm: slurmdbd unreachable, N02): [`state`](Self::state) is the last state seen, and
    /// the job is neither failed nor lost. A controller waits; it never resubmits for this.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub accounting_pending: bool,
    /// The host whose SSH host key was refused (changed or unknown, issue 27, P07), when that
    /// is why the job is [`JobState::NodeFail`]: the host is at fault, not the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_host_key: Option<String>,
}

/// One step of a job (Slurm: a `sacct` row with a dotted id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StepStatus {
    /// The step name: `batch`, `extern`, `0`, `1`, ...
    pub name: String,
    /// Its state.
    pub state: JobState,
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did (ExitCode `N:S`, `S != 0`).
    pub signal: Option<i32>,
}

impl StepStatus {
    /// A step.
    pub fn new(
        name: impl Into<String>,
        state: JobState,
        exit_code: Option<i32>,
        signal: Option<i32>,
    ) -> Self {
        Self {
            name: name.into(),
            state,
            exit_code,
            signal,
        }
    }

    /// Whether this step ended well: `COMPLETED` with exit 0 and no signal. The `extern`
    /// step (Slurm's own) only counts when it failed by signal or state other than
    /// `COMPLETED`/`CANCELLED` (Slurm cancels it when the allocation ends).
    pub fn is_clean(&self) -> bool {
        if self.name == "extern" {
            return self.signal.is_none_or(|s| s == 0 || s == 9 || s == 15)
                && matches!(self.state, JobState::Completed | JobState::Cancelled { .. });
        }
        self.state == JobState::Completed
            && self.exit_code.unwrap_or(0) == 0
            && self.signal.is_none_or(|s| s == 0)
    }
}

impl std::fmt::Display for StepStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "step {} {}", self.name, self.state)?;
        match (self.signal, self.exit_code) {
            (Some(s), _) if s != 0 => write!(f, " by signal {s}"),
            (_, Some(c)) if c != 0 => write!(f, " with exit code {c}"),
            _ => Ok(()),
        }
    }
}

impl JobStatus {
    /// A status with only attempt id and state set.
    pub fn new(attempt_id: AttemptId, state: JobState) -> Self {
        Self {
            attempt_id,
            state,
            exit_code: None,
            signal: None,
            reason: None,
            restarts: 0,
            log_path: None,
            nodes: None,
            started_at_ms: None,
            ended_at_ms: None,
            steps: Vec::new(),
            accounting_pending: false,
            refused_host_key: None,
        }
    }

    /// Sets [`refused_host_key`](Self::refused_host_key).
    pub fn with_refused_host_key(mut self, host: impl Into<String>) -> Self {
        self.refused_host_key = Some(host.into());
        self
    }

    /// Sets the steps.
    pub fn with_steps(mut self, steps: Vec<StepStatus>) -> Self {
        self.steps = steps;
        self
    }

    /// Sets the exit code.
    pub fn with_exit_code(mut self, code: i32) -> Self {
        self.exit_code = Some(code);
        self
    }

    /// Sets the terminating signal.
    pub fn with_signal(mut self, signal: i32) -> Self {
        self.signal = Some(signal);
        self
    }

    /// Sets the reason.
    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// Sets the restart count.
    pub fn with_restarts(mut self, restarts: u32) -> Self {
        self.restarts = restarts;
        self
    }

    /// Sets the log path.
    pub fn with_log_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.log_path = Some(path.into());
        self
    }

    /// Sets the node list.
    pub fn with_nodes(mut self, nodes: impl Into<String>) -> Self {
        self.nodes = Some(nodes.into());
        self
    }

    /// Sets start and end times (ms since the Unix epoch).
    pub fn with_times(mut self, started_at_ms: Option<u64>, ended_at_ms: Option<u64>) -> Self {
        self.started_at_ms = started_at_ms;
        self.ended_at_ms = ended_at_ms;
        self
    }
}
