//! Sweeps (`docs/design.md`, "Identity" to "Sweeps"): enqueue runs of jobs, plan, drain what is not
//! done, read metrics.
//!
//! See [`Orchestrator`] for the whole story and the crate docs for an example.

mod builder;
mod cancel;
mod commit;
mod decision;
mod entry;
mod event;
mod execute;
mod heart;
mod identity;
mod interrupt;
mod job;
mod key_index;
mod orchestrator;
mod panics;
mod param_shape;
mod params_check;
mod pending;
mod reasons;
mod run;
mod summary;
pub mod worker;

pub use builder::OrchestratorBuilder;
pub use cancel::CancellationToken;
pub use decision::{Action, JobDecision, Plan};
pub use event::Event;
pub use job::{Job, JobResult};
pub use orchestrator::Orchestrator;
pub use panics::{install_panic_hook, remove_panic_hook};
pub use pending::{PendingRun, RunSpec};
pub use reasons::Reasons;
pub use run::Run;
pub use summary::{FailureCause, JobOutcome, Outcome, RunFailed, RunSummary};
