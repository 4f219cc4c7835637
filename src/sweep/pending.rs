//! [`PendingRun`]: a run in a sweep's queue, its key computed when it was enqueued.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::entry::Entry;
use super::job::JobResult;
use super::run::Run;
use crate::identity::{Hash, OwnedDigest, ParamType};

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

impl std::fmt::Debug for PendingRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingRun")
            .field("key", &self.key)
            .field("job", &self.job)
            .field("params", &self.params)
            .finish()
    }
}
