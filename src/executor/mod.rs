//! Executors: where attempts run (`docs/design.md`, "Executors").
//!
//! An [`Executor`] takes an [`AttemptSpec`] (a [`CommandSpec`] argv, a [`TaskTopology`], limits)
//! and runs it somewhere: `MockExecutor` (feature `test-util`: scripted, virtual clock, for
//! tests of controller logic), [`LocalExecutor`] (processes on this machine), `SlurmExecutor` (batch jobs, feature
//! `slurm`, on by default), `BareMetalExecutor` (SSH hosts), `RayExecutor` (Ray jobs, feature
//! `ray`), or your own. The trait is object-safe, so `Box<dyn Executor>` works and controllers
//! can be written once for all of them.
//!
//! The contract every executor keeps (checked by the `conformance` suite, feature
//! `test-util`):
//! - [`submit`](Executor::submit) returns a [`JobHandle`] that serializes to JSON and, after a
//!   restart, lets a fresh executor of the same kind and configuration poll and cancel the job.
//! - [`poll`](Executor::poll) answers many handles in one call, one [`JobStatus`] per handle, in
//!   order. Job outcomes (failed, killed, timed out) are states, never errors; an `Err` means the
//!   *call* failed and no state changed.
//! - [`cancel`](Executor::cancel) returns once the job is terminal (or is confirmed to be
//!   ending); cancelling a finished job is a no-op.
//! - [`find`](Executor::find) finds the job of an attempt id, so a job submitted just before a
//!   crash, whose handle was never recorded, is adopted instead of submitted twice. It works
//!   from a **fresh process** (a restarted controller): an executor's state may not live only
//!   in memory.
//! - A handle of this executor's kind for a job it does not know (never submitted, purged,
//!   from a lost attempt folder) is polled as [`JobState::Lost`] (with a reason), never an
//!   error and never a state that stays pending: the caller's policy decides what to do.
//! - The spec is honoured: [`AttemptSpec::walltime`] ends an overrunning job as
//!   [`JobState::Timeout`]; [`AttemptSpec::log_path`], when set, receives the job's
//!   stdout/stderr and is the [`JobStatus::log_path`] reported; the job sees its attempt id in
//!   [`ATTEMPT_ID_ENV`] (and its array index in [`ARRAY_INDEX_ENV`]).
//!
//! The conformance suite checks each rule (re-attach and `find` both in-process and from a
//! separate process) and is tested against one "lying" executor per rule
//! (`tests/executor_conformance.rs`).
//!
//! # Implementing an executor
//!
//! A complete (if useless) executor that "runs" every command instantly, in a few lines:
//!
//! ```
//! use std::{collections::HashMap, sync::Mutex};
//! use puzzletron::executor::*;
//!
//! #[derive(Default)]
//! struct Instant { jobs: Mutex<HashMap<AttemptId, JobHandle>> }
//!
//! #[async_trait::async_trait]
//! impl Executor for Instant {
//!     fn kind(&self) -> &str { "instant" }
//!     async fn submit(&self, spec: &AttemptSpec) -> Result<JobHandle, ExecutorError> {
//!         spec.validate()?;
//!         let h = JobHandle::new("instant", spec.attempt_id.clone(), spec.attempt_id.as_str(), 0);
//!         self.jobs.lock().unwrap().insert(spec.attempt_id.clone(), h.clone());
//!         Ok(h)
//!     }
//!     async fn poll(&self, handles: &[JobHandle]) -> Result<Vec<JobStatus>, ExecutorError> {
//!         Ok(handles.iter()
//!             .map(|h| JobStatus::new(h.attempt_id.clone(), JobState::Completed).with_exit_code(0))
//!             .collect())
//!     }
//!     async fn cancel(&self, _handle: &JobHandle) -> Result<(), ExecutorError> { Ok(()) }
//!     async fn find(&self, id: &AttemptId) -> Result<Option<JobHandle>, ExecutorError> {
//!         Ok(self.jobs.lock().unwrap().get(id).cloned())
//!     }
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let exec: Box<dyn Executor> = Box::new(Instant::default());
//! let spec = AttemptSpec::new(AttemptId::new("demo.a1")?, CommandSpec::new("true"));
//! let handle = exec.submit(&spec).await?;
//! let status = exec.poll(&[handle]).await?;
//! assert_eq!(status[0].state, JobState::Completed);
//! # Ok::<(), ExecutorError>(())
//! # }).unwrap();
//! ```
//!
//! With the `test-util` feature, `puzzletron::executor::conformance::run_all(|| ...)` checks
//! such an implementation against the same suite the built-in executors pass (this one would
//! fail it: it never runs anything).

pub(crate) mod baremetal;
mod contract;
mod error;
pub mod gpu;
mod handle;
mod hostlist;
mod inprocess;
mod local;
#[cfg(any(test, feature = "test-util"))]
mod mock;
pub(crate) mod oom;
#[cfg(feature = "ray")]
mod ray;
mod render;
pub(crate) mod shell;
#[cfg(feature = "slurm")]
mod slurm;
mod spec;
mod status;

#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod conformance;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

pub(crate) use crate::sys::now_ms;
pub use baremetal::{BareMetalExecutor, BareMetalExecutorBuilder, BaremetalInventory, Host};
pub use contract::ExecutionContract;
pub use error::ExecutorError;
pub use handle::JobHandle;
pub(crate) use hostlist::expand_hostlist;
pub use inprocess::InProcess;
pub use local::{ATTEMPT_DIR_ENV, FORK_SERVER_ENV, LocalExecutor, LocalExecutorBuilder};
#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub use mock::{MockCall, MockClock, MockExecutor, MockScript, MockSubmitError};
#[cfg(feature = "ray")]
#[cfg_attr(docsrs, doc(cfg(feature = "ray")))]
pub use ray::{RayCluster, RayExecutor, RayExecutorBuilder};
pub use render::{RenderedCommand, RenderedFile, Rendering};
#[cfg(feature = "slurm")]
#[cfg_attr(docsrs, doc(cfg(feature = "slurm")))]
pub use slurm::{PollPolicy, SchedulerRetry, SlurmExecutor, SlurmExecutorBuilder, SlurmStats};
pub use spec::{
    ARRAY_INDEX_ENV, ATTEMPT_ID_ENV, ArraySpec, AttemptId, AttemptSpec, CommandSpec, GpuRequest,
    MAX_ATTEMPT_ID_LEN, START_FILE_ENV, SchedulerOptions, TaskLauncher, TaskTopology,
    WARNING_SIGNALS, WarningSignal,
};
pub use status::{JobState, JobStatus, StepStatus};

/// Runs attempts somewhere and reports on them. See the [module docs](self) for the contract.
///
/// All methods take `&self`: executors are shared (`Arc<dyn Executor>`) between the tasks of a
/// controller and synchronise internally.
#[async_trait]
pub trait Executor: Send + Sync {
    /// A short name of the executor kind (`local`, `slurm`, `mock`, ...), stored in every
    /// [`JobHandle`] it makes.
    fn kind(&self) -> &str;

    /// Submits one attempt and returns its handle once the executor has accepted it (for Slurm:
    /// `sbatch` returned a job id; locally: the attempt folder exists and the job is queued or
    /// started).
    ///
    /// # Errors
    /// [`ExecutorError::InvalidSpec`] / [`ExecutorError::Unsatisfiable`] for specs that can never
    /// run here; [`ExecutorError::DuplicateAttempt`] where the executor can tell cheaply that the
    /// attempt id is taken; [`ExecutorError::SubmitRejected`], [`ExecutorError::SubmitThrottled`],
    /// [`ExecutorError::SubmitUnknown`] or [`ExecutorError::SchedulerUnavailable`] from a
    /// scheduler. After a retryable error call [`find`](Executor::find) before submitting again.
    async fn submit(&self, spec: &AttemptSpec) -> Result<JobHandle, ExecutorError>;

    /// Exactly what [`submit`](Executor::submit) would send for `spec` (files and commands,
    /// see [`Rendering`]), without submitting anything. The built-in executors' `submit` calls
    /// it, so a dry run that prints it shows, byte for byte, what runs. Where the executor
    /// decides something only when the job starts (a local job's GPUs, a bare-metal lease),
    /// the rendering assumes idle resources and says so in its notes.
    ///
    /// # Errors
    /// As [`submit`](Executor::submit) for specs that cannot run here;
    /// [`ExecutorError::Unsupported`] (the default) for an executor that cannot show it.
    fn render(&self, spec: &AttemptSpec) -> Result<Rendering, ExecutorError> {
        let _ = spec;
        Err(ExecutorError::Unsupported {
            executor: self.kind().to_string(),
            operation: "render (show what a submit sends)".into(),
        })
    }

    /// Submits `array.size` tasks of one template, returning one handle per task in index order.
    ///
    /// The default submits each [`ArraySpec::task_spec`] on its own; schedulers with native
    /// arrays (Slurm `--array`) override it with one submission.
    ///
    /// # Errors
    /// As [`submit`](Executor::submit). With the default implementation tasks before the failing
    /// one stay submitted; recover them with [`find`](Executor::find) on their task ids.
    async fn submit_array(&self, array: &ArraySpec) -> Result<Vec<JobHandle>, ExecutorError> {
        array.validate()?;
        let mut handles = Vec::with_capacity(array.size as usize);
        for i in 0..array.size {
            handles.push(self.submit(&array.task_spec(i)?).await?);
        }
        Ok(handles)
    }

    /// Reports the status of every handle, in the same order, in as few scheduler calls as
    /// possible (Slurm: one `squeue` and at most one `sacct` for the whole slice). A handle of
    /// this kind whose job the executor does not know is [`JobState::Lost`].
    ///
    /// # Errors
    /// [`ExecutorError::SchedulerUnavailable`] when the scheduler could not be asked (no state
    /// changed; poll again later); [`ExecutorError::ForeignHandle`] for a handle of another
    /// executor kind.
    async fn poll(&self, handles: &[JobHandle]) -> Result<Vec<JobStatus>, ExecutorError>;

    /// Cancels a job and returns when it is terminal or confirmed ending. Cancelling a terminal
    /// job does nothing and succeeds.
    ///
    /// # Errors
    /// [`ExecutorError::CancelUnconfirmed`] when the job did not end within the executor's
    /// confirmation window; scheduler errors as for [`poll`](Executor::poll).
    async fn cancel(&self, handle: &JobHandle) -> Result<(), ExecutorError>;

    /// Finds the job running (or that ran) `attempt_id`, for recovery after a crash between
    /// submit and recording the handle. `Ok(None)` when there is none. Must work from a
    /// process other than the one that submitted.
    ///
    /// # Errors
    /// Scheduler errors as for [`poll`](Executor::poll).
    async fn find(&self, attempt_id: &AttemptId) -> Result<Option<JobHandle>, ExecutorError>;

    /// The uid of the scheduler's own user (Slurm's `SlurmUser`), when the executor has one:
    /// a job `CANCELLED by` that uid was cancelled by the scheduler (a preemption), not by a
    /// person. The default is `Ok(None)` (no scheduler user).
    ///
    /// # Errors
    /// Scheduler errors as for [`poll`](Executor::poll); malformed answers as
    /// [`ExecutorError::Parse`].
    async fn scheduler_uid(&self) -> Result<Option<u32>, ExecutorError> {
        Ok(None)
    }

    /// Whether this executor's jobs write the start mark named by [`START_FILE_ENV`] just
    /// before their payload starts (after the job's own setup). A controller treats a missing
    /// start mark as evidence only when this is `true`. The default is `false`.
    fn writes_start_mark(&self) -> bool {
        false
    }

    /// A counter of the job ends this executor has seen by itself, for
    /// [`wait_change`](Executor::wait_change): read it before a [`poll`](Executor::poll), then
    /// wait with it. The default (an executor that learns of ends only when polled) is always 0.
    fn changes(&self) -> u64 {
        0
    }

    /// Waits until [`changes`](Executor::changes) differs from `seen` (a job ended since it was
    /// read), or `max` passed. Drivers that follow many jobs call it between polls instead of
    /// sleeping, so that they wake when a job ends, not at the next tick. The default sleeps
    /// `max`; [`LocalExecutor`] wakes as soon as one of the jobs it started ends.
    async fn wait_change(&self, seen: u64, max: Duration) {
        let _ = seen;
        tokio::time::sleep(max).await;
    }

    /// Cancels every live job of this user whose attempt id `matches`, without any handle
    /// (the campaign folder, with its journal, may be gone), and returns the attempt ids
    /// cancelled. Used by
    /// [`cancel_campaign`](crate::campaign::controller::cancel_campaign).
    ///
    /// # Errors
    /// [`ExecutorError::Unsupported`] (the default) when the executor cannot list its jobs;
    /// scheduler errors as for [`poll`](Executor::poll).
    async fn cancel_matching(
        &self,
        matches: &(dyn for<'s> Fn(&'s str) -> bool + Send + Sync),
    ) -> Result<Vec<String>, ExecutorError> {
        let _ = matches;
        Err(ExecutorError::Unsupported {
            executor: self.kind().to_string(),
            operation: "cancel_matching (cancel by attempt-id pattern)".into(),
        })
    }
}

macro_rules! forward_executor {
    ($ty:ty) => {
        // A provided method left out would silently skip the inner executor's override.
        #[deny(clippy::missing_trait_methods)]
        #[async_trait]
        impl<E: Executor + ?Sized> Executor for $ty {
            fn kind(&self) -> &str {
                (**self).kind()
            }
            async fn submit(&self, spec: &AttemptSpec) -> Result<JobHandle, ExecutorError> {
                (**self).submit(spec).await
            }
            fn render(&self, spec: &AttemptSpec) -> Result<Rendering, ExecutorError> {
                (**self).render(spec)
            }
            async fn submit_array(
                &self,
                array: &ArraySpec,
            ) -> Result<Vec<JobHandle>, ExecutorError> {
                (**self).submit_array(array).await
            }
            async fn poll(&self, handles: &[JobHandle]) -> Result<Vec<JobStatus>, ExecutorError> {
                (**self).poll(handles).await
            }
            async fn cancel(&self, handle: &JobHandle) -> Result<(), ExecutorError> {
                (**self).cancel(handle).await
            }
            async fn find(
                &self,
                attempt_id: &AttemptId,
            ) -> Result<Option<JobHandle>, ExecutorError> {
                (**self).find(attempt_id).await
            }
            async fn scheduler_uid(&self) -> Result<Option<u32>, ExecutorError> {
                (**self).scheduler_uid().await
            }
            fn writes_start_mark(&self) -> bool {
                (**self).writes_start_mark()
            }
            fn changes(&self) -> u64 {
                (**self).changes()
            }
            async fn wait_change(&self, seen: u64, max: Duration) {
                (**self).wait_change(seen, max).await
            }
            async fn cancel_matching(
                &self,
                matches: &(dyn for<'s> Fn(&'s str) -> bool + Send + Sync),
            ) -> Result<Vec<String>, ExecutorError> {
                (**self).cancel_matching(matches).await
            }
        }
    };
}

forward_executor!(Box<E>);
forward_executor!(Arc<E>);
forward_executor!(&E);

/// Conveniences on top of [`Executor`], implemented for every executor.
#[async_trait]
pub trait ExecutorExt: Executor {
    /// Polls `handles` every `interval` until all are terminal, or `timeout` passes; returns the
    /// last statuses (in order) either way, so the caller can see which were still active.
    ///
    /// # Errors
    /// The first error of [`Executor::poll`] that is not retryable; retryable ones are retried
    /// until the timeout, after which the last one is returned.
    async fn wait_terminal(
        &self,
        handles: &[JobHandle],
        interval: Duration,
        timeout: Duration,
    ) -> Result<Vec<JobStatus>, ExecutorError> {
        let start = Instant::now();
        loop {
            match self.poll(handles).await {
                Ok(statuses) => {
                    if statuses.iter().all(|s| s.state.is_terminal()) || start.elapsed() >= timeout
                    {
                        return Ok(statuses);
                    }
                }
                Err(e) if e.is_retryable() && start.elapsed() < timeout => {}
                Err(e) => return Err(e),
            }
            tokio::time::sleep(interval).await;
        }
    }
}

impl<E: Executor + ?Sized> ExecutorExt for E {}

/// `dir` as an absolute path without creating it: canonical when it exists (symlinks
/// resolved, as a restarted process resolves it), else joined to the working folder. Builders
/// use it so that building an executor (for a dry run's [`Executor::render`]) creates nothing;
/// the folders are made at the first submit.
pub(crate) fn resolve_dir(dir: &std::path::Path) -> Result<std::path::PathBuf, ExecutorError> {
    match std::fs::canonicalize(dir) {
        Ok(p) => Ok(p),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::path::absolute(dir).map_err(|e| ExecutorError::io("resolving folder", dir, e))
        }
        Err(e) => Err(ExecutorError::io("resolving folder", dir, e)),
    }
}

/// Checks that `handle` belongs to executor kind `kind`.
pub(crate) fn check_kind(kind: &str, handle: &JobHandle) -> Result<(), ExecutorError> {
    if handle.executor == kind {
        Ok(())
    } else {
        Err(ExecutorError::ForeignHandle {
            expected: kind.to_string(),
            found: handle.executor.clone(),
            attempt_id: handle.attempt_id.clone(),
        })
    }
}
