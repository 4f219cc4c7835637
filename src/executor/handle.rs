//! [`JobHandle`]: the durable reference to a submitted job.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::AttemptId;

/// What a controller persists about a submitted job so that it can poll or cancel it again
/// after its own restart, possibly from another process.
///
/// It is plain serde data (JSON-friendly): the executor kind, the attempt id, the scheduler's
/// job id, and executor-specific details. Built-in executors fill it as follows:
///
/// | executor | `job_id` | `cluster` | `array_task` | `data` keys |
/// | --- | --- | --- | --- | --- |
/// | `local` | the attempt id (pids live in the attempt folder) | – | – | `attempt_dir` |
/// | `slurm` | Slurm job id, e.g. `4711` | from `sbatch --parsable` `ID;cluster` | array index | – |
/// | `mock`  | `mock-<n>` | – | array index | – |
/// | `ray`   | the Ray `submission_id` (= the attempt id) | – | – | `address`, `log_path` |
///
/// A handle is only meaningful to an executor of the same [`kind`](JobHandle::executor); the
/// built-in executors refuse others with [`ExecutorError::ForeignHandle`](super::ExecutorError).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct JobHandle {
    /// The executor kind that made it (`local`, `slurm`, `mock`, or a user executor's name).
    pub executor: String,
    /// The attempt it runs.
    pub attempt_id: AttemptId,
    /// The scheduler's id for the job (for an array task: the array's job id).
    pub job_id: String,
    /// The array task index, for a task of a job array.
    pub array_task: Option<u32>,
    /// The Slurm cluster (federation / multi-cluster), passed as `-M` on later calls.
    pub cluster: Option<String>,
    /// Submission time, milliseconds since the Unix epoch (bounds `sacct -S`, C17 in
    /// `docs/evidence.md`).
    pub submitted_at_ms: u64,
    /// Executor-specific details needed to re-attach (string keys and values).
    pub data: BTreeMap<String, String>,
}

impl JobHandle {
    /// A handle with no array task, no cluster and no extra data.
    pub fn new(
        executor: impl Into<String>,
        attempt_id: AttemptId,
        job_id: impl Into<String>,
        submitted_at_ms: u64,
    ) -> Self {
        Self {
            executor: executor.into(),
            attempt_id,
            job_id: job_id.into(),
            array_task: None,
            cluster: None,
            submitted_at_ms,
            data: BTreeMap::new(),
        }
    }

    /// Sets the array task index.
    pub fn with_array_task(mut self, index: u32) -> Self {
        self.array_task = Some(index);
        self
    }

    /// Sets the cluster.
    pub fn with_cluster(mut self, cluster: impl Into<String>) -> Self {
        self.cluster = Some(cluster.into());
        self
    }

    /// Adds one executor-specific detail.
    pub fn with_data(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.data.insert(key.into(), value.into());
        self
    }

    /// The scheduler's full job reference: `job_id`, or `job_id_task` for an array task (the
    /// form `squeue`/`sacct`/`scancel` accept).
    pub fn scheduler_ref(&self) -> String {
        match self.array_task {
            Some(t) => format!("{}_{t}", self.job_id),
            None => self.job_id.clone(),
        }
    }
}
