//! # puzzletron
//!
//! Run ML experiments the way build systems run builds: content-addressed, cached, resumable,
//! on a laptop or across a Slurm cluster.
//!
//! A **sweep** enqueues runs of a job (a plain Rust function) with parameter sets. Each run's
//! key is the hash of the job's name, its parameters (RFC 8785 canonical JSON) and its own
//! source code (token-wise, so comments do not count). A drain executes only the runs the store
//! has no current result for, and says why; metrics come back as one Arrow table.
//!
//! ```
//! use puzzletron::store::MemoryStore;
//! use puzzletron::{JobResult, Orchestrator, Run, job};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Params {
//!     lr: f64,
//!     epochs: u32,
//! }
//!
//! fn train(p: &Params, run: &mut Run) -> JobResult {
//!     let mut loss = 1.0;
//!     for epoch in 0..p.epochs {
//!         loss *= 1.0 - p.lr;
//!         run.log("loss", epoch.into(), loss)?;
//!     }
//!     Ok(())
//! }
//!
//! fn main() -> puzzletron::Result<()> {
//!     // `Orchestrator::builder().store_root(".puzzletron")` keeps results on disk instead.
//!     let mut sweep = Orchestrator::builder().store(MemoryStore::new()).build()?;
//!     let train = job!(train);
//!     for lr in [0.1, 0.2, 0.3] {
//!         sweep.run(&train, Params { lr, epochs: 5 })?; // the key is computed here
//!     }
//!     println!("{}", sweep.plan()?); // "run ... (no record)" for each
//!     let summary = sweep.drain()?;
//!     assert_eq!(summary.ran(), 3);
//!
//!     let loss = sweep.get("loss")?; // [step, value, lr, epochs, job_key]
//!     assert_eq!(loss.num_rows(), 15);
//!     assert_eq!(loss.column_names(), ["step", "value", "lr", "epochs", "job_key"]);
//!
//!     // Nothing is left to do: a second drain skips every run, with the reason.
//!     let again = sweep.run(&train, Params { lr: 0.1, epochs: 5 })?;
//!     assert_eq!(sweep.decide(&sweep.queued()[0])?.reasons, ["up to date, attempt 1"]);
//!     assert_eq!(sweep.drain()?.skipped(), 1);
//!     # let _ = again;
//!     Ok(())
//! }
//! ```
//!
//! ## Map
//! - The crate root: the sweep half, [`Orchestrator`], [`Job`] and the [`job!`] macro, [`Run`]
//!   (where a job logs), [`Plan`], [`RunSummary`], [`worker`] (the entry point of isolated
//!   runs). Every public item has exactly one path.
//! - [`identity`]: [`Hash`](struct@identity::Hash), canonical parameters, the owned-code digest, witnesses
//!   (Cargo.lock, toolchain, source commit).
//! - [`store`]: the [`Store`](store::Store) trait (forwarded through `Box`, `Arc` and `&`),
//!   [`StoreExt`](store::StoreExt) (conveniences: the done records),
//!   [`FsStore`](store::FsStore) (a folder, safe for many processes and hosts),
//!   [`MemoryStore`](store::MemoryStore).
//! - [`metrics`]: [`MetricTable`](metrics::MetricTable) (Arrow), Parquet and CSV output,
//!   [`metrics::collect`], [`MetricsExt`](metrics::MetricsExt) (a store's table of every done
//!   run in one call).
//! - [`executor`]: the [`executor::Executor`] trait that runs attempts (local processes,
//!   Slurm, bare-metal hosts over SSH, Ray, and a mock for tests);
//!   [`executor::InProcess`], the default: jobs run in the draining process.
//! - [`arrow`]: the Arrow types used in public signatures.
//! - [`campaign`]: multi-stage GPU campaigns compiled from experiment YAML (Hydra-style
//!   composition, overrides, interpolation), GPU packing and dry runs.
//!
//! ## Diagnostics, signals and the panic hook
//! - The library logs through [`tracing`](https://docs.rs/tracing) and prints nothing of its
//!   own: a span per drain (`drain`, with `runs` and `isolated`) and per run (`run`, with
//!   `key`, `job`, `attempt`), a span per campaign controller run (`campaign`), and events for
//!   decisions and claims (`DEBUG`), takeovers of interrupted runs, waits on other processes,
//!   submissions and every controller event (`INFO`), retries of transient scheduler errors and
//!   failed runs (`WARN`). Install a subscriber to see them (`tracing-subscriber`'s `fmt()`);
//!   the `puzzletron` command line installs one on stderr (`--log-level`, `PUZZLETRON_LOG`).
//!   What a caller asks to see is still shown: [`Event`]s through
//!   [`OrchestratorBuilder::on_event`], the campaign
//!   controller's live view (`ViewMode`) on stderr.
//! - The first run a drain executes installs a process-wide panic hook that records where a
//!   job panicked (message, `file:line`, backtrace) in the run's failure, and leaves every
//!   other panic to the hook installed before it: [`install_panic_hook`],
//!   [`remove_panic_hook`].
//! - A blocking [`Orchestrator::drain`] handles Ctrl-C (SIGINT) while it runs, when the
//!   program does not handle SIGINT itself: the drain is cancelled, runs it started are
//!   recorded as interrupted; the default action is back when the drain returns
//!   ([`OrchestratorBuilder::cancel_on_ctrl_c`](OrchestratorBuilder::cancel_on_ctrl_c)).
//!   An isolated worker handles SIGTERM and SIGINT the same way.
//!
//! ## Features
//! - `parquet` (default): Parquet output, [`MetricTable::write_parquet`](metrics::MetricTable::write_parquet) and
//!   [`MetricsExt::write_metric_parquet`](metrics::MetricsExt::write_metric_parquet) (adds the `parquet` crate; Arrow tables are always in).
//! - `slurm` (default): `executor::SlurmExecutor`, which runs attempts as Slurm batch jobs and
//!   arrays (no extra dependency: it calls `sbatch`, `squeue`, `sacct` and `scancel`).
//! - `test-util`: the conformance suites `store::conformance` and `executor::conformance`, to
//!   check your own [`Store`](store::Store) or [`executor::Executor`] against the rules ours keep.
//! - `progress`: progress bars (`indicatif`) in the campaign controller's live view on a
//!   terminal.
//! - `ray`: `executor::RayExecutor`, which runs attempts as jobs of a Ray cluster through its
//!   Jobs REST API (adds `ureq`, plain HTTP).
//! - `cli`: the `puzzletron` command line (`src/bin/puzzletron.rs`, the `cli` module; adds
//!   `clap` and `tracing-subscriber`, and turns on `ray` for Ray runners).
//! - `fuzzing`: the entry points of the fuzz targets (`campaign::fuzzing`,
//!   `campaign::config::fuzzing`) for `fuzz/` and the corpus replay tests; not part of the API.
//!
//! Items that need a feature say so in these docs (on docs.rs every feature is on).

#![warn(missing_docs)]
#![warn(unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod campaign;
mod error;
pub mod executor;
mod fsutil;
pub mod identity;
pub mod metrics;
pub mod report;
pub mod store;
mod sweep;
mod sys;

#[cfg(feature = "cli")]
#[cfg_attr(docsrs, doc(cfg(feature = "cli")))]
pub mod cli;

#[doc(hidden)]
pub mod __private {
    pub use puzzletron_macros::job_code;
}

pub use error::{Error, Result};

/// Compiles the README's example (`no_run`: it writes files), so the README cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
// The sweep half is the crate's front door: its items live at the root, one path each.
pub use sweep::worker;
pub use sweep::{
    Action, CancellationToken, Event, FailureCause, Job, JobDecision, JobOutcome, JobResult,
    Orchestrator, OrchestratorBuilder, Outcome, PendingRun, Plan, Reasons, Run, RunFailed, RunSpec,
    RunSummary, install_panic_hook, remove_panic_hook,
};

/// The Arrow crates whose types appear in this crate's public signatures
/// ([`MetricTable::batch`](metrics::MetricTable::batch) is an `arrow_array::RecordBatch`, [`MetricTable::column`](metrics::MetricTable::column) an
/// `arrow_array::ArrayRef`), re-exported so users name them without a version to match.
pub mod arrow {
    pub use arrow_array::{self as array, ArrayRef, RecordBatch};
    pub use arrow_schema::{self as schema, DataType, Field, Schema, SchemaRef};
}
