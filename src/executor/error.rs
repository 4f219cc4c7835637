//! [`ExecutorError`]: everything that can go wrong talking to an executor.

use std::path::PathBuf;

use super::AttemptId;

/// An error from an [`Executor`](super::Executor) call.
///
/// Job outcomes are *not* errors: a job that failed, timed out or was killed is a
/// [`JobStatus`](super::JobStatus) with that [`JobState`](super::JobState). Errors are about the
/// call itself: a bad spec, a scheduler that did not answer, output that could not be parsed.
/// [`ExecutorError::is_retryable`] says whether the same call may succeed later.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecutorError {
    /// A spec field has a value the executor cannot accept.
    #[error("invalid attempt spec{}: {field} = {value:?}, expected {expected}",
        attempt_id.as_ref().map(|a| format!(" for attempt {a}")).unwrap_or_default())]
    InvalidSpec {
        /// The attempt, when known.
        attempt_id: Option<AttemptId>,
        /// Key path of the field, e.g. `topology.nodes`.
        field: String,
        /// The bad value.
        value: String,
        /// What would have been accepted.
        expected: String,
    },

    /// The spec asks for more than this executor can ever give (e.g. 8 GPUs from a local
    /// executor configured with 4). Never retryable.
    #[error("attempt {attempt_id} needs {needed} but this executor has at most {available}")]
    Unsatisfiable {
        /// The attempt.
        attempt_id: AttemptId,
        /// What it asked for, e.g. `8 GPUs`.
        needed: String,
        /// What the executor has, e.g. `4 GPUs (ids 0,1,2,3)`.
        available: String,
    },

    /// An attempt with this id was already submitted to this executor (it would run twice).
    #[error("attempt {attempt_id} was already submitted as job {job_id}")]
    DuplicateAttempt {
        /// The attempt.
        attempt_id: AttemptId,
        /// The job already running it.
        job_id: String,
    },

    /// A file or folder of the executor could not be read or written.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done, e.g. `creating attempt folder`.
        action: String,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A scheduler command could not be started at all (not installed, not in `PATH`).
    #[error("cannot run `{program}`: {source}")]
    Spawn {
        /// The program, e.g. `sbatch`.
        program: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// The scheduler rejected the submission for a reason retrying will not fix (bad partition,
    /// impossible resources, invalid account...). Fatal for this attempt only.
    #[error("submission of attempt {attempt_id} rejected: {message}")]
    SubmitRejected {
        /// The attempt.
        attempt_id: AttemptId,
        /// The scheduler's message (stderr).
        message: String,
    },

    /// The scheduler refused the submission because of a submit limit (Slurm
    /// `QOSMaxSubmitJobPerUserLimit`): pause submitting and retry later; not a task failure.
    #[error("submission of attempt {attempt_id} throttled by the scheduler: {message}")]
    SubmitThrottled {
        /// The attempt.
        attempt_id: AttemptId,
        /// The scheduler's message.
        message: String,
    },

    /// A submission failed ambiguously (e.g. a timeout) and a lookup by attempt id found no
    /// job, repeatedly. The job may still appear: call [`find`](super::Executor::find) before
    /// submitting this attempt again.
    #[error(
        "submission of attempt {attempt_id} has unknown outcome after {tries} tries: {message}"
    )]
    SubmitUnknown {
        /// The attempt.
        attempt_id: AttemptId,
        /// How many submit tries were made.
        tries: u32,
        /// The last error text.
        message: String,
    },

    /// The scheduler could not be reached or answered with a transient error, still after the
    /// executor's own retries (Slurm "Socket timed out", "Unable to contact slurm controller",
    /// "slurm_load_jobs error", connection refused). No job state was changed by it.
    #[error("scheduler unavailable: `{command}` failed {tries} times; last error: {message}")]
    SchedulerUnavailable {
        /// The command line (program and fixed arguments, no user data).
        command: String,
        /// How many times it was tried.
        tries: u32,
        /// The last error text.
        message: String,
    },

    /// A scheduler command failed with a non-transient error.
    #[error("`{command}` failed with exit code {exit_code:?}: {stderr}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit code (`None` if killed by a signal).
        exit_code: Option<i32>,
        /// Its stderr.
        stderr: String,
    },

    /// Scheduler output did not have the expected form (C02, C08 in `docs/evidence.md`).
    #[error("cannot parse output of `{command}`: {detail}; got {output:?}")]
    Parse {
        /// The command whose output it was.
        command: String,
        /// What was wrong and what was expected.
        detail: String,
        /// The offending output (whole stdout/stderr or the line).
        output: String,
    },

    /// The handle was made by a different executor kind.
    #[error(
        "job handle of executor `{found}` (attempt {attempt_id}) given to executor `{expected}`"
    )]
    ForeignHandle {
        /// The executor called.
        expected: String,
        /// The handle's executor kind.
        found: String,
        /// The handle's attempt.
        attempt_id: AttemptId,
    },

    /// A cancel was sent but the job was still not terminal after the executor's confirmation
    /// window.
    #[error("cancel of attempt {attempt_id} (job {job_id}) not confirmed: still {state}")]
    CancelUnconfirmed {
        /// The attempt.
        attempt_id: AttemptId,
        /// The job.
        job_id: String,
        /// The last state seen.
        state: String,
    },

    /// The executor does not offer this operation (e.g. `cancel_matching` on an executor that
    /// cannot list its jobs).
    #[error("executor `{executor}` does not support {operation}")]
    Unsupported {
        /// The executor kind.
        executor: String,
        /// The operation.
        operation: String,
    },

    /// A bare-metal host answered its preflight but lacks something the runner needs (the
    /// repository, the venv, GPUs the inventory lists): a configuration error, never retryable.
    #[error("preflight of host {host} failed: {problem}")]
    HostPreflight {
        /// The host (as in the inventory).
        host: String,
        /// What is missing or wrong.
        problem: String,
    },

    /// `host`'s SSH host key changed or is unknown (issue 27, P07): the host is at fault, not
    /// the attempt, and its key is never accepted automatically. Not retryable on that host;
    /// a campaign excludes the host and places the attempt on the others
    /// ([`refused_host_key`](Self::refused_host_key)).
    #[error("host {host}: {problem}")]
    HostKeyRefused {
        /// The host (as in the inventory).
        host: String,
        /// What ssh said and the operator's fix (the `ssh-keygen -R` line).
        problem: String,
    },

    /// The executor's configuration is wrong in a way no retry fixes (a Ray cluster that
    /// refuses the token, a token variable that is not set): `key` names the runner key to
    /// change.
    #[error("{key}: {problem}")]
    Misconfigured {
        /// The configuration key at fault, e.g. `runner.ray.token_env`, with what it held
        /// (never a secret's value).
        key: String,
        /// What went wrong and what was expected.
        problem: String,
    },

    /// An error scripted into a `MockExecutor` (feature `test-util`), or raised by a user's
    /// executor that has no better variant.
    #[error("{message}")]
    Other {
        /// The message.
        message: String,
        /// Whether retrying may help.
        retryable: bool,
    },
}

impl ExecutorError {
    /// The host whose SSH host key changed or is unknown, when this is that error: the host is
    /// at fault, not the attempt (a campaign excludes the host and places the attempt on the
    /// others).
    pub fn refused_host_key(&self) -> Option<&str> {
        match self {
            ExecutorError::HostKeyRefused { host, .. } => Some(host),
            _ => None,
        }
    }

    /// Whether repeating the same call later may succeed: scheduler unavailability, throttling,
    /// an unknown submit outcome (after a [`find`](super::Executor::find)), an unconfirmed
    /// cancel, transient I/O errors. Bad specs, rejections, parse errors and foreign handles are
    /// permanent.
    pub fn is_retryable(&self) -> bool {
        match self {
            ExecutorError::SchedulerUnavailable { .. }
            | ExecutorError::SubmitThrottled { .. }
            | ExecutorError::SubmitUnknown { .. }
            | ExecutorError::CancelUnconfirmed { .. } => true,
            ExecutorError::Io { source, .. } | ExecutorError::Spawn { source, .. } => {
                matches!(
                    source.kind(),
                    std::io::ErrorKind::Interrupted
                        | std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::ResourceBusy
                        | std::io::ErrorKind::OutOfMemory
                ) || source.raw_os_error() == Some(libc::EAGAIN)
                    || source.raw_os_error() == Some(libc::EMFILE)
                    || source.raw_os_error() == Some(libc::ENFILE)
            }
            ExecutorError::Other { retryable, .. } => *retryable,
            ExecutorError::InvalidSpec { .. }
            | ExecutorError::Unsatisfiable { .. }
            | ExecutorError::DuplicateAttempt { .. }
            | ExecutorError::SubmitRejected { .. }
            | ExecutorError::CommandFailed { .. }
            | ExecutorError::Parse { .. }
            | ExecutorError::ForeignHandle { .. }
            | ExecutorError::Unsupported { .. }
            | ExecutorError::HostPreflight { .. }
            | ExecutorError::HostKeyRefused { .. }
            | ExecutorError::Misconfigured { .. } => false,
        }
    }

    /// Shorthand for an [`ExecutorError::Io`].
    pub(crate) fn io(action: &str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ExecutorError::Io {
            action: action.into(),
            path: path.into(),
            source,
        }
    }
}
