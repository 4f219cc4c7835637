//! [`RunSummary`] and [`RunFailed`]: what a drain did.

use super::pending::PendingRun;
use super::reasons::Reasons;
use std::fmt;
use std::path::PathBuf;

use crate::identity::Hash;
use crate::store::{Failure, StoreError};

/// What happened to one run in a drain.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Outcome {
    /// Executed successfully, taking `seconds`.
    Ran {
        /// Wall time of the job function, seconds.
        seconds: f64,
    },
    /// Not executed: its recorded result is current (or another process produced it).
    Skipped {
        /// Why.
        reasons: Reasons,
    },
    /// Executed and failed.
    Failed {
        /// The failure as recorded.
        failure: Failure,
    },
    /// Started, then stopped by a cancelled drain (see
    /// [`Run::is_cancelled`](super::Run::is_cancelled)): recorded as interrupted, never as
    /// failed; the next drain runs it again.
    Interrupted,
    /// Not attempted: the drain stopped at an earlier failure or was cancelled.
    Pending,
    /// Left alone: its record cannot be read (see
    /// [`Action::Corrupt`](super::Action::Corrupt)); `reason` names the file, what is wrong
    /// with it and the fix. The drain goes on with the other runs and ends with
    /// [`FailureCause::Corrupt`].
    Corrupt {
        /// The store's error and the fix.
        reason: String,
    },
}

/// One run's line in a [`RunSummary`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct JobOutcome {
    /// The run (shared with the queue): `run.key`, `run.job()`, `run.params()`.
    pub run: PendingRun,
    /// What happened.
    pub outcome: Outcome,
}

/// What a drain did, one entry per distinct queued run in enqueue order.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct RunSummary {
    /// The runs.
    pub jobs: Vec<JobOutcome>,
}

impl RunSummary {
    /// Runs executed successfully.
    pub fn ran(&self) -> usize {
        self.jobs
            .iter()
            .filter(|j| matches!(j.outcome, Outcome::Ran { .. }))
            .count()
    }

    /// Runs skipped.
    pub fn skipped(&self) -> usize {
        self.jobs
            .iter()
            .filter(|j| matches!(j.outcome, Outcome::Skipped { .. }))
            .count()
    }

    /// Runs that failed (0 or 1: a drain stops at the first failure).
    pub fn failed(&self) -> usize {
        self.jobs
            .iter()
            .filter(|j| matches!(j.outcome, Outcome::Failed { .. }))
            .count()
    }

    /// Runs started and then interrupted by a cancelled drain.
    pub fn interrupted(&self) -> usize {
        self.jobs
            .iter()
            .filter(|j| matches!(j.outcome, Outcome::Interrupted))
            .count()
    }

    /// Runs left alone because their record cannot be read ([`Outcome::Corrupt`]).
    pub fn corrupt(&self) -> usize {
        self.jobs
            .iter()
            .filter(|j| matches!(j.outcome, Outcome::Corrupt { .. }))
            .count()
    }

    /// Runs not attempted because the drain stopped.
    pub fn pending(&self) -> usize {
        self.jobs
            .iter()
            .filter(|j| matches!(j.outcome, Outcome::Pending))
            .count()
    }

    /// A line per run (`ran`/`skip`/`FAIL`/`pending`, key, job, params, detail), then totals.
    pub fn report(&self) -> String {
        let mut out = String::new();
        for j in &self.jobs {
            let (tag, detail) = match &j.outcome {
                Outcome::Ran { seconds } => ("ran ", format!("{seconds:.2}s")),
                Outcome::Skipped { reasons } => ("skip", reasons.join("; ")),
                Outcome::Failed { failure } => {
                    ("FAIL", format!("{}: {}", failure.kind, failure.message))
                }
                Outcome::Interrupted => (
                    "intr",
                    "interrupted (drain cancelled): runs again at the next drain".to_string(),
                ),
                Outcome::Pending => ("pend", "not attempted (drain stopped)".to_string()),
                Outcome::Corrupt { reason } => ("CORR", reason.clone()),
            };
            out.push_str(&format!(
                "{tag}  {}  {}  {}  {detail}\n",
                j.run.key.short(),
                j.run.job(),
                j.run.params()
            ));
        }
        out.push_str(&self.totals());
        out
    }

    /// `N ran, N skipped, N failed, N pending`, with `, N interrupted` when a cancelled drain
    /// interrupted runs and `, N corrupt` when runs were left alone for their records.
    pub fn totals(&self) -> String {
        let mut interrupted = match self.interrupted() {
            0 => String::new(),
            n => format!(", {n} interrupted"),
        };
        if self.corrupt() > 0 {
            interrupted.push_str(&format!(", {} corrupt", self.corrupt()));
        }
        format!(
            "{} ran, {} skipped, {} failed, {} pending{interrupted}",
            self.ran(),
            self.skipped(),
            self.failed(),
            self.pending()
        )
    }
}

impl fmt::Display for RunSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.report())
    }
}

/// Why a drain stopped.
#[derive(Debug)]
#[non_exhaustive]
pub enum FailureCause {
    /// A job failed (returned an error or panicked), here or in another process.
    Job {
        /// The failing job.
        key: Hash,
        /// Its name.
        job: String,
        /// The recorded failure.
        failure: Failure,
        /// Where the failure text is saved, when the store has files.
        error_file: Option<PathBuf>,
    },
    /// The store failed; no job result was lost.
    Store(StoreError),
    /// The executor of isolated runs failed (could not submit or poll); no job result was lost.
    Executor(crate::executor::ExecutorError),
    /// The drain was cancelled (its [`CancellationToken`](super::CancellationToken), Ctrl-C in
    /// a blocking drain): runs it started are [`Outcome::Interrupted`] and recorded so; the
    /// runs not done stay queued for the next drain.
    Cancelled,
    /// Every run was drained except these, whose records cannot be read
    /// ([`Outcome::Corrupt`], each with its file and the fix): they stay queued and were left
    /// alone. Not retryable as it is: build the sweep with
    /// [`repair(true)`](super::OrchestratorBuilder::repair) (or run `puzzletron sweep repair
    /// STORE`) to move their records aside and run them again.
    Corrupt {
        /// Their keys, in queue order.
        keys: Vec<Hash>,
    },
}

/// A drain that stopped: at the first failing job, or on a store error. Carries the summary so
/// far; later runs are [`Outcome::Pending`].
#[derive(Debug)]
#[non_exhaustive]
pub struct RunFailed {
    /// What the drain did up to the failure.
    pub summary: RunSummary,
    /// What stopped it.
    pub cause: FailureCause,
}

impl RunFailed {
    /// Whether draining again may succeed without changing anything: store I/O errors, a
    /// cancelled drain.
    /// A failed job is retried by the next drain ("last attempt failed"), but it is likely to
    /// fail again until its code or parameters change.
    pub fn is_retryable(&self) -> bool {
        match &self.cause {
            FailureCause::Store(e) => e.is_retryable(),
            FailureCause::Executor(e) => e.is_retryable(),
            FailureCause::Cancelled => true,
            FailureCause::Job { .. } | FailureCause::Corrupt { .. } => false,
        }
    }
}

impl fmt::Display for RunFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cause {
            FailureCause::Job {
                key,
                job,
                failure,
                error_file,
            } => {
                write!(
                    f,
                    "job {job} ({}) failed: {}: {}",
                    key.short(),
                    failure.kind,
                    failure.message
                )?;
                for c in &failure.chain {
                    write!(f, "\n  caused by: {c}")?;
                }
                if let Some(p) = error_file {
                    write!(f, "\n  details: {}", p.display())?;
                }
            }
            FailureCause::Store(e) => write!(f, "drain stopped by a store error: {e}")?,
            FailureCause::Executor(e) => write!(f, "drain stopped by an executor error: {e}")?,
            FailureCause::Cancelled => write!(
                f,
                "drain cancelled: runs it started are recorded as interrupted and run again at \
                 the next drain"
            )?,
            FailureCause::Corrupt { keys } => {
                write!(
                    f,
                    "{} run(s) left alone because their records cannot be read (every other \
                     run was drained):",
                    keys.len()
                )?;
                for j in &self.summary.jobs {
                    if let Outcome::Corrupt { reason } = &j.outcome {
                        write!(
                            f,
                            "\n  {} {} {}: {reason}",
                            j.run.key.short(),
                            j.run.job(),
                            j.run.params()
                        )?;
                    }
                }
            }
        }
        write!(f, "\n  {}", self.summary.totals())
    }
}

impl std::error::Error for RunFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.cause {
            FailureCause::Store(e) => Some(e),
            FailureCause::Executor(e) => Some(e),
            FailureCause::Job { .. } | FailureCause::Cancelled | FailureCause::Corrupt { .. } => {
                None
            }
        }
    }
}
