//! [`Event`]: progress of a drain, for a progress line per job.

use std::fmt;

use super::JobDecision;
use crate::identity::Hash;
use crate::store::Failure;

/// Something a drain did; hand a callback to
/// [`OrchestratorBuilder::on_event`](super::OrchestratorBuilder::on_event) to show progress.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Event {
    /// A run starts (`index` is 1-based among `total` distinct runs).
    Started {
        /// Position in the queue.
        index: usize,
        /// Distinct runs in the queue.
        total: usize,
        /// Its decision (reasons included).
        decision: JobDecision,
    },
    /// A run finished successfully.
    Finished {
        /// Position in the queue.
        index: usize,
        /// Distinct runs in the queue.
        total: usize,
        /// The job key.
        key: Hash,
        /// Wall time, seconds.
        seconds: f64,
        /// Metric rows logged.
        rows: u64,
    },
    /// A run failed.
    Failed {
        /// Position in the queue.
        index: usize,
        /// Distinct runs in the queue.
        total: usize,
        /// The job key.
        key: Hash,
        /// What failed.
        failure: Failure,
    },
    /// A run stopped because the drain was cancelled; recorded as interrupted.
    Interrupted {
        /// Position in the queue.
        index: usize,
        /// Distinct runs in the queue.
        total: usize,
        /// The job key.
        key: Hash,
    },
    /// A run was skipped.
    Skipped {
        /// Position in the queue.
        index: usize,
        /// Distinct runs in the queue.
        total: usize,
        /// Its decision.
        decision: JobDecision,
    },
    /// A run was left alone: its record cannot be read (the decision's reasons name the file
    /// and the fix).
    Corrupt {
        /// Position in the queue.
        index: usize,
        /// Distinct runs in the queue.
        total: usize,
        /// Its decision ([`Action::Corrupt`](super::Action::Corrupt)).
        decision: JobDecision,
    },
    /// A run is held by another live process; the drain waits for it.
    Waiting {
        /// The job key.
        key: Hash,
        /// Who holds it.
        holder: String,
    },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Started {
                index,
                total,
                decision,
            } => write!(
                f,
                "[{index}/{total}] run   {} {} {} ({})",
                decision.run.key.short(),
                decision.run.job(),
                decision.run.params(),
                decision.reasons.join("; ")
            ),
            Event::Finished {
                index,
                total,
                key,
                seconds,
                rows,
            } => {
                write!(
                    f,
                    "[{index}/{total}] done  {} in {seconds:.2}s, {rows} metric rows",
                    key.short()
                )
            }
            Event::Failed {
                index,
                total,
                key,
                failure,
            } => {
                write!(
                    f,
                    "[{index}/{total}] FAIL  {} {}: {}",
                    key.short(),
                    failure.kind,
                    failure.message
                )
            }
            Event::Interrupted { index, total, key } => write!(
                f,
                "[{index}/{total}] intr  {} interrupted (drain cancelled): runs again at the next drain",
                key.short()
            ),
            Event::Skipped {
                index,
                total,
                decision,
            } => write!(
                f,
                "[{index}/{total}] skip  {} {} ({})",
                decision.run.key.short(),
                decision.run.params(),
                decision.reasons.join("; ")
            ),
            Event::Corrupt {
                index,
                total,
                decision,
            } => write!(
                f,
                "[{index}/{total}] CORR  {} {} {} ({})",
                decision.run.key.short(),
                decision.run.job(),
                decision.run.params(),
                decision.reasons.join("; ")
            ),
            Event::Waiting { key, holder } => {
                write!(f, "        wait  {} held by {holder}", key.short())
            }
        }
    }
}
