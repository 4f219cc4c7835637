//! The campaign controller (`docs/design.md`, "Campaigns": Controller): runs a compiled
//! [`CampaignPlan`] on an [`Executor`], durably.
//!
//! - `builder`: [`CampaignControllerBuilder`] (options, lease, replay, contract check).
//! - `driver`: [`CampaignController`], the small control loop; its parts, one job each:
//!   `submit` (intents, submits, adoption), `poll` (polling, scheduler errors, stuck jobs),
//!   `finalise` (evidence, decisions, stage transitions), `shutdown` (cancels).
//! - `event`: [`ControllerEvent`], what observers (logs, the CLI, reports) are told.
//! - `journal`: the append-only journal (intents before submits, handles after, events).
//! - `lease`: one controller per campaign.
//! - `state` (private): the in-memory state rebuilt from the journal.
//! - `classify`: [`FailureClass`] from scheduler state, exit code/signal and the log tail.
//! - `nodes`: broken nodes (fail-fast attempts charged to nodes, `--exclude`).
//! - `policy`: retry budgets, backoff with jitter, [`Decision`]s.
//! - `spec`: from a work unit to an [`AttemptSpec`](crate::executor::AttemptSpec)
//!   (environment contract of payloads).
//! - `pool`: the persistent-pool work queue and the worker-side [`PoolWorker`] API.
//! - `controls`: [`TerminalControls`], `choose_revisions`, [`DecisionPrompt`]; `view`:
//!   the live view; `report`: [`CampaignReport`].
//! - `decide` (private): manual decision stages (post-MIP filters with `mode: manual`): a
//!   prompt on a terminal, else `decision_needed` and the decision file
//!   `decisions/<stage>.txt`; the choice is journaled (`decision_made`) and written to
//!   `work/<stage>/0/selected.json`; choosing none skips the stage's descendants.
//!
//! - `step` (private): the controller's decisions as pure functions (state, plan, settings,
//!   now and an input in; actions or journal entries out), performed by the loop.
//!
//! Campaign folder layout: `controller/{journal.jsonl, lease.json, lease.lock, plan.json}`,
//! `logs/<attempt id>.log`, `work/<stage>/<index|agg>/` (outputs, checkpoints, `_SUCCESS`),
//! `queues/<stage>/{pending,claimed,done,failed}/`, `.puzzletron/resolved-config.json`,
//! `decisions/<stage>.txt` (manual decisions written by a person), and `attempts/` in local
//! mode.
//!
//! Attempt ids are `<nonce>[r<revision>].<stage>.<index|agg>.a<n>`: the nonce is random per
//! campaign folder, so a job is only ever adopted by the campaign that submitted it.
//!
//! [`CampaignPlan`]: crate::campaign::CampaignPlan
//! [`Executor`]: crate::executor::Executor

mod builder;
pub(crate) mod classify;
mod clock;
mod controls;
mod decide;
mod driver;
mod error;
mod event;
mod finalise;
mod journal;
pub(crate) mod lease;
pub(crate) mod nodes;
mod policy;
mod poll;
mod pool;
mod report;
mod shutdown;
pub(crate) mod spec;
mod state;
mod step;
mod submit;
mod view;

pub use builder::{CampaignControllerBuilder, open_campaign_dir};
pub use classify::{
    CheckpointEvidence, Classification, Evidence, FailureClass, OomKind, PendingVerdict,
};
#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub use clock::VirtualClock;
pub use clock::{Clock, SystemClock};
pub(crate) use controls::choose_revisions;
pub use controls::{DecisionPrompt, TerminalControls};
pub use driver::{CampaignController, Control, ControlSender, RunOptions};
pub use error::ControllerError;
pub use event::{ControllerEvent, EventSubscriber};
#[cfg(any(test, feature = "test-util"))]
#[doc(hidden)]
pub use finalise::VisibilityProbe;
pub use journal::{Entry, Journal, Record};
pub use lease::{Lease, LeaseInfo};
pub use policy::{Decision, RetryPolicy, UnitHistory};
pub use pool::{ClaimedItem, ItemOutcome, PoolItem, PoolWorker, QueueCounts, WorkQueue};
pub use report::{CampaignReport, PendingDecision, StageFailure, StageProgress};
pub use shutdown::cancel_campaign;
#[cfg(feature = "cli")] // the command line's `campaign cancel`
pub(crate) use shutdown::{CANCEL_REQUEST_FILE, who_am_i};
pub use view::ViewMode;
