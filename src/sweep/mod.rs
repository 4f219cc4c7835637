//! Sweeps (DESIGN.md §3-4): enqueue runs of jobs, plan, drain what is not done, read metrics.
//!
//! See [`Orchestrator`] for the whole story and the crate docs for an example.

mod decision;
mod event;
mod identity;
mod job;
mod orchestrator;
mod panics;
mod run;
mod summary;
pub mod worker;

pub use decision::{Action, JobDecision, Plan};
pub use event::Event;
pub use job::{Job, JobResult};
pub use orchestrator::{Orchestrator, OrchestratorBuilder, PendingRun};
pub use run::Run;
pub use summary::{FailureCause, JobOutcome, Outcome, RunFailed, RunSummary};
