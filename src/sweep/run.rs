//! [`Run`]: the context a job logs its metrics into.

use std::path::{Path, PathBuf};

use crate::identity::Hash;
use crate::store::{MetricSink, StoreError};

/// The context of one running attempt: where metrics and artifacts go.
pub struct Run {
    key: Hash,
    attempt: u32,
    sink: Box<dyn MetricSink>,
    artifact_dir: Option<PathBuf>,
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
    ) -> Self {
        Self {
            key,
            attempt,
            sink,
            artifact_dir,
        }
    }

    /// Logs `value` of metric `name` at `step`. The row is durable when this returns: a crash of
    /// the process afterwards keeps it.
    ///
    /// # Errors
    /// [`StoreError::BadMetricName`] for an empty name or one with tabs/newlines;
    /// [`StoreError::Io`] when the row cannot be written.
    pub fn log(&mut self, name: &str, step: i64, value: f64) -> Result<(), StoreError> {
        self.sink.append(name, step, value)
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
    /// ([`FsStore`](crate::store::FsStore): `ROOT/jobs/KEY/artifacts`).
    pub fn artifact_dir(&self) -> Option<&Path> {
        self.artifact_dir.as_deref()
    }

    pub(crate) fn into_sink(self) -> Box<dyn MetricSink> {
        self.sink
    }
}
