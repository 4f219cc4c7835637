//! [`PendingRun`]: a run in a sweep's queue, its key computed when it was enqueued.

use std::sync::Arc;

use super::entry::Entry;
use super::job::JobResult;
use super::run::Run;
use crate::identity::{Hash, OwnedDigest};

/// The job function bound to its parameters.
pub(super) type Call = Arc<dyn Fn(&mut Run) -> JobResult + Send + Sync>;

/// A run in the queue: its key is computed when it is enqueued.
#[derive(Clone)]
pub struct PendingRun {
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
