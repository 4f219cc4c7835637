//! [`PendingRun`]: a run in a sweep's queue, its key computed when it was enqueued.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::entry::Entry;
use super::job::JobResult;
use super::run::Run;
use crate::identity::{Hash, OwnedDigest, ParamType, Witnesses};
use crate::store::{BASE_FORMAT, JobRecord, Owner, Status};
use crate::sys::unix_now;

/// The job function bound to its parameters.
pub(super) type Call = Arc<dyn Fn(&mut Run) -> JobResult + Send + Sync>;

/// A run in the queue: its key is computed when it is enqueued.
///
/// A handle: cloning it shares one allocation (a sweep holds each run in its enqueued list and,
/// until drained, in its queue; 100k runs cost about 0.9 KB each, see the `hot_paths` bench).
/// Its fields are those of [`RunSpec`], reached through `Deref` (`run.key`, `run.params`).
#[derive(Clone)]
pub struct PendingRun(Arc<RunSpec>);

impl PendingRun {
    pub(super) fn new(spec: RunSpec) -> Self {
        Self(Arc::new(spec))
    }
}

impl std::ops::Deref for PendingRun {
    type Target = RunSpec;

    fn deref(&self) -> &RunSpec {
        &self.0
    }
}

/// What a [`PendingRun`] is: its key, what the key covers and how to execute it.
#[non_exhaustive]
pub struct RunSpec {
    /// The job key.
    pub key: Hash,
    /// Job name + parameters, without code.
    pub lineage: Hash,
    /// The job's name.
    pub job: Arc<str>,
    /// Canonical JSON parameters.
    pub params: Arc<str>,
    /// Top-level parameter names in declaration order.
    pub param_order: Arc<[String]>,
    /// The metric-table column type of each top-level parameter, from its Rust type.
    pub param_types: Arc<BTreeMap<String, ParamType>>,
    /// The owned code the key covers.
    pub owned: Arc<OwnedDigest>,
    pub(super) call: Call,
    /// Where a worker process finds the job function (isolated runs, see `sweep::worker`).
    pub(super) entry: Entry,
}

impl RunSpec {
    /// The parameters as a JSON value, parsed from their canonical text (`Null` if it is not
    /// JSON, which canonical text always is).
    pub(super) fn params_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.params).unwrap_or(serde_json::Value::Null)
    }

    /// The record of attempt `attempt` of this run, started now by `owner` in the environment
    /// `witnesses`: the one place a running record is built, in this process (`execute`) or in
    /// a worker's parent for a worker that died (`worker`). The parameters are the canonical
    /// text computed at enqueue, parsed here once per attempt.
    pub(super) fn running_record(
        &self,
        witnesses: &Witnesses,
        owner: &Owner,
        attempt: u32,
    ) -> JobRecord {
        JobRecord {
            format: BASE_FORMAT,
            key: self.key,
            job: self.job.to_string(),
            params: self.params_value(),
            param_order: self.param_order.to_vec(),
            param_types: (*self.param_types).clone(),
            lineage: self.lineage,
            owned: (*self.owned).clone(),
            witnesses: witnesses.clone(),
            status: Status::Running,
            attempt,
            owner: Some(owner.clone()),
            started_at: unix_now(),
            finished_at: None,
            error: None,
            metrics: None,
        }
    }
}

impl std::fmt::Debug for PendingRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingRun")
            .field("key", &self.key)
            .field("job", &self.job)
            .field("params", &self.params)
            .finish()
    }
}
