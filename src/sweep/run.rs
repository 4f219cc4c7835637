//! [`Run`]: the context a job logs its metrics into.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use super::cancel::Cancel;
use crate::identity::Hash;
use crate::store::{MetricSink, StoreError};

/// The context of one running attempt: where metrics and artifacts go, and whether the drain
/// was cancelled ([`Run::is_cancelled`]).
pub struct Run {
    key: Hash,
    attempt: u32,
    sink: Box<dyn MetricSink>,
    /// The store's artifact folder, made on the first [`Run::artifact_dir`] call (`made`).
    artifact_dir: Option<PathBuf>,
    made: OnceLock<bool>,
    cancel: Cancel,
    /// The job was told of the cancellation (so what it returns is not a whole result).
    told: AtomicBool,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("key", &self.key)
            .field("attempt", &self.attempt)
            .finish()
    }
}

impl Run {
    pub(crate) fn new(
        key: Hash,
        attempt: u32,
        sink: Box<dyn MetricSink>,
        artifact_dir: Option<PathBuf>,
        cancel: Cancel,
    ) -> Self {
        Self {
            key,
            attempt,
            sink,
            artifact_dir,
            made: OnceLock::new(),
            cancel,
            told: AtomicBool::new(false),
        }
    }

    /// Whether the drain running this job was cancelled (a dropped
    /// [`drain_async`](super::Orchestrator::drain_async) future, the sweep's
    /// [`CancellationToken`](super::CancellationToken), Ctrl-C in a blocking
    /// [`drain`](super::Orchestrator::drain), SIGTERM to an isolated worker). A job that
    /// checks it between steps should return (with `Ok` or an error: either way) soon after
    /// it turns `true`: once the job has been told, what it returns is not taken as a result,
    /// and the run is recorded as interrupted, to run again at the next drain. [`Run::log`]
    /// and [`Run::flush`] tell a job too (they return [`StoreError::Cancelled`]), so a job that
    /// propagates their errors with `?` stops at its next row without checking.
    ///
    /// A job that is never told (it logs nothing and never asks) runs to its end, and its
    /// result is recorded as usual; the drain stops before the next run.
    pub fn is_cancelled(&self) -> bool {
        let c = self.cancel.flagged();
        if c {
            self.told.store(true, Ordering::Relaxed);
        }
        c
    }

    /// Whether the job was told of a cancellation (see [`Run::is_cancelled`]).
    pub(crate) fn was_told(&self) -> bool {
        self.told.load(Ordering::Relaxed)
    }

    fn check_cancelled(&self) -> Result<(), StoreError> {
        if self.is_cancelled() {
            return Err(StoreError::Cancelled);
        }
        Ok(())
    }

    /// Logs `value` of metric `name` at `step`.
    ///
    /// Rows are buffered, not written one system call each. With [`FsStore`](crate::store::FsStore) a
    /// row reaches the OS (and survives a crash of the process) at the latest
    /// [`FLUSH_INTERVAL`](crate::store::FLUSH_INTERVAL) after it is logged, when
    /// [`FLUSH_ROWS`](crate::store::FLUSH_ROWS) rows are buffered, when the job calls
    /// [`Run::flush`], and when the job returns; when the job returns every row is also fsynced
    /// before the run is recorded done (a done run that never wrote a batch and logged at most
    /// [`INLINE_BYTES`](crate::store::INLINE_BYTES) has its rows written inside its done record
    /// instead), durable against a crash of the machine either way. A process
    /// killed mid-run loses at most the unflushed rows.
    ///
    /// # Errors
    /// [`StoreError::BadMetricName`] for an empty name or one with tabs/newlines;
    /// [`StoreError::Io`] when a batch of rows (this one or an earlier one) cannot be written;
    /// [`StoreError::Cancelled`] (the row is not logged) once the drain is cancelled: return
    /// it (`?`), see [`Run::is_cancelled`].
    pub fn log(&mut self, name: &str, step: i64, value: f64) -> Result<(), StoreError> {
        self.check_cancelled()?;
        self.sink.append(name, step, value)
    }

    /// Marks a step boundary (e.g. after saving a checkpoint): every row logged so far reaches
    /// the OS before this returns, so a crash of the process afterwards keeps them. One system
    /// call at most; not an fsync.
    ///
    /// # Errors
    /// [`StoreError::Io`] when the rows cannot be written; [`StoreError::Cancelled`] once the
    /// drain is cancelled (the rows logged so far are written all the same, when the run is
    /// recorded as interrupted).
    pub fn flush(&mut self) -> Result<(), StoreError> {
        self.check_cancelled()?;
        self.sink.flush()
    }

    /// The job key of this run.
    pub fn key(&self) -> Hash {
        self.key
    }

    /// The attempt number (1 for the first).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// A folder for this job's files (checkpoints, plots), where the store has one
    /// ([`FsStore`](crate::store::FsStore): `ROOT/jobs/KEY/artifacts`). The folder is created
    /// by the first call (`None` if it cannot be), so runs that never ask cost no folder.
    pub fn artifact_dir(&self) -> Option<&Path> {
        let d = self.artifact_dir.as_deref()?;
        self.made
            .get_or_init(|| std::fs::create_dir_all(d).is_ok())
            .then_some(d)
    }

    pub(crate) fn into_sink(self) -> Box<dyn MetricSink> {
        self.sink
    }
}
