//! [`ControllerEvent`]: what the controller tells its observers (loggers, the CLI, reports),
//! as typed values instead of `(kind, message)` strings.
//!
//! Every event has a stable snake_case [`kind`](ControllerEvent::kind) (also the `kind` tag of
//! its serde form and of the journal's `event` entries) and a one-line human form
//! ([`Display`](std::fmt::Display)), which is what the journal records as the message. Register
//! an observer with
//! [`CampaignControllerBuilder::on_event`](super::CampaignControllerBuilder::on_event), or an
//! [`EventSubscriber`] (a notifier) with
//! [`CampaignControllerBuilder::subscribe`](super::CampaignControllerBuilder::subscribe).
//!
//! Stability: variants and fields are only ever added (`#[non_exhaustive]`); the kinds of
//! existing variants do not change.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::classify::FailureClass;
use crate::executor::AttemptId;
use crate::identity::Hash;

/// Something told of every [`ControllerEvent`] of a campaign as it happens, with the campaign's
/// folder: a notifier (the `report` module's `Notifier` is one), a log, a dashboard. It is how
/// layers above the controller hear of its events without the controller knowing them.
/// Called on the controller's task: keep it quick (a notifier hands its work to a thread of
/// its own).
pub trait EventSubscriber: Send + Sync {
    /// `event` happened in the campaign whose folder is `campaign`.
    fn on_event(&self, campaign: &Path, event: &ControllerEvent);
}

/// One thing that happened in a campaign controller.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ControllerEvent {
    /// The journal ended in a torn record (a crash during a write), which was cut off.
    JournalRepaired {
        /// Bytes cut.
        torn_bytes: u64,
    },
    /// A controller started on a campaign that had live attempts or unresolved intents.
    Recovered {
        /// Live attempts re-attached.
        reattached: usize,
        /// Intents journaled without a handle (looked up by attempt id).
        unresolved_intents: usize,
    },
    /// The contract changed and `new_revision` was set: a new revision started.
    Revision {
        /// The previous contract hash.
        old: Hash,
        /// The new contract hash.
        new: Hash,
        /// The new revision number.
        revision: u32,
        /// Attempts of the old revision that were cancelled.
        cancelled: usize,
    },
    /// A submit failed in a way that may still have created the job, and the lookup by
    /// attempt id could not tell: the intent stays open and the job is looked up again.
    SubmitUnknown {
        /// The attempt.
        attempt_id: AttemptId,
        /// The submit error.
        error: String,
    },
    /// An attempt ended. `class` is `None` for a success (every piece of evidence agreed).
    AttemptFinished {
        /// The attempt.
        attempt_id: AttemptId,
        /// The stage it belongs to.
        stage: String,
        /// The scheduler's final state, e.g. `COMPLETED`, `CANCELLED by 0`.
        state: String,
        /// The failure class, `None` on success.
        class: Option<FailureClass>,
        /// The evidence used (`completed; success marker present`, `accounting inconsistent:
        /// ...`).
        detail: String,
        /// What the policy decided (`retry in 2s`, `failed: ...`), `None` on success.
        decision: Option<String>,
    },
    /// An attempt this controller cancelled itself (shutdown, new revision) ended; it runs
    /// again on the next `run` and is not a failure.
    AttemptCancelled {
        /// The attempt.
        attempt_id: AttemptId,
        /// The stage it belongs to.
        stage: String,
        /// Why it was cancelled.
        detail: String,
    },
    /// A running attempt's progress mark did not move for the stage's heartbeat timeout, or
    /// it sat pending with a reason that never resolves: the controller cancels it.
    AttemptStuck {
        /// The attempt.
        attempt_id: AttemptId,
        /// What was seen.
        reason: String,
    },
    /// Every unit of a stage is done.
    StageDone {
        /// The stage.
        stage: String,
    },
    /// A stage failed.
    StageFailed {
        /// The stage.
        stage: String,
        /// Why (the failed unit and its evidence).
        reason: String,
    },
    /// `fail_fast`: the controller stopped after a stage failed.
    Halted {
        /// The stage that failed.
        stage: String,
        /// Live attempts cancelled.
        cancelled: usize,
    },
    /// The scheduler could not be asked (a poll, lookup or submit failed with a retryable
    /// error). Shown within one poll cycle; retried with backoff.
    SchedulerUnreachable {
        /// The last error.
        error: String,
        /// Consecutive failed calls so far.
        consecutive: u64,
        /// When the next try is due.
        retry_in: Duration,
    },
    /// An executor call (`poll`, `submit`, `find`) has not returned after one poll interval
    /// (at least 1 s): the scheduler is slow or retrying internally. Journaled once per call;
    /// the live view shows the wait as it grows.
    SchedulerSlow {
        /// The call.
        call: String,
        /// How long it had waited when this was reported.
        waited: Duration,
    },
    /// Jobs left the scheduler's queue but their accounting cannot be read (Slurm: slurmdbd
    /// down while slurmctld answers, N02). They wait as "finished, accounting pending": never
    /// failed, lost or resubmitted for it. Journaled when the count goes from 0 to more.
    AccountingPending {
        /// Attempts waiting for their accounting record.
        attempts: usize,
        /// The executor's reason for the first of them.
        reason: String,
    },
    /// Every attempt that waited for accounting has its record again.
    AccountingAvailable,
    /// The scheduler answered again after [`SchedulerUnreachable`](Self::SchedulerUnreachable).
    SchedulerReachable {
        /// How many calls had failed in a row.
        after_errors: u64,
    },
    /// An executor `cancel` failed with a retryable error.
    CancelError {
        /// The attempt.
        attempt_id: AttemptId,
        /// The error.
        error: String,
    },
    /// Pool workers ended holding items, which were returned to the queue (or failed after
    /// too many returns).
    Requeued {
        /// The worker attempt.
        worker: AttemptId,
        /// Items returned to `pending`.
        requeued: usize,
        /// Items moved to `failed`.
        failed: usize,
    },
    /// A persistent-pool stage had items left and no live worker: workers start again.
    PoolRestarted {
        /// The stage.
        stage: String,
        /// Items still pending or claimed.
        items_left: usize,
        /// Workers restarted.
        workers: usize,
    },
    /// A node is excluded from later submissions (attempts failed fast on it).
    NodeExcluded {
        /// The node name.
        node: String,
        /// Why.
        reason: String,
    },
    /// Before a unit's next attempt, the declared outputs its previous attempt (failed or
    /// killed) left in its output folder were moved aside, to `outputs_partial/<attempt id>/`
    /// (kept for inspection), so a new attempt that does not rewrite one is never promoted
    /// with the dead attempt's copy.
    OutputsMovedAside {
        /// The attempt that left them.
        attempt_id: AttemptId,
        /// One line per output: moved, or why it could not be.
        moved: Vec<String>,
    },
    /// Units that failed in an earlier run get fresh budgets (`retry_failed`).
    RetryFailed {
        /// The unit keys.
        units: Vec<String>,
        /// Who asked (`campaign retry` names its user, host and pid); empty when unknown.
        by: String,
        /// The units retried with more resources (out of memory, `--allow-oom-retry`).
        more_resources: Vec<String>,
    },
    /// Every live attempt was cancelled (user cancel, fail-fast, new revision).
    ShutDown {
        /// Why.
        reason: String,
        /// Attempts cancelled.
        cancelled: usize,
    },
    /// A manual decision stage (a post-MIP filter with `mode: manual`) is ready: a person
    /// must choose among the candidates, by writing the decision file (off a terminal) or at
    /// the prompt. The stage waits; other stages go on. Notified (`--notify`).
    DecisionNeeded {
        /// The decision stage.
        stage: String,
        /// The decision file to write: `all`, `none`, or candidate numbers (from 1) and ids,
        /// separated by spaces or commas.
        file: PathBuf,
        /// The candidates, numbered from 1.
        candidates: Vec<String>,
    },
    /// The decision file does not parse (or cannot be read): the stage keeps waiting.
    /// Reported once per content.
    DecisionInvalid {
        /// The decision stage.
        stage: String,
        /// The decision file.
        file: PathBuf,
        /// What is wrong: the bad token and the valid choices.
        error: String,
    },
    /// A manual decision was made: the stage is done and its choice written to
    /// `work/<stage>/0/selected.json`.
    DecisionMade {
        /// The decision stage.
        stage: String,
        /// The chosen candidates (empty: `none`).
        chosen: Vec<String>,
        /// Stages skipped because nothing was chosen (the stage's descendants).
        skipped: Vec<String>,
    },
    /// The controller stopped and left its attempts running (`run` again re-attaches).
    Detached {
        /// Attempts still live.
        live: usize,
    },
}

impl ControllerEvent {
    /// The stable snake_case kind, e.g. `attempt_finished`, `scheduler_unreachable`.
    pub fn kind(&self) -> &'static str {
        match self {
            ControllerEvent::JournalRepaired { .. } => "journal_repaired",
            ControllerEvent::Recovered { .. } => "recovered",
            ControllerEvent::Revision { .. } => "revision",
            ControllerEvent::SubmitUnknown { .. } => "submit_unknown",
            ControllerEvent::AttemptFinished { .. } => "attempt_finished",
            ControllerEvent::AttemptCancelled { .. } => "attempt_cancelled",
            ControllerEvent::AttemptStuck { .. } => "attempt_stuck",
            ControllerEvent::StageDone { .. } => "stage_done",
            ControllerEvent::StageFailed { .. } => "stage_failed",
            ControllerEvent::Halted { .. } => "halted",
            ControllerEvent::SchedulerUnreachable { .. } => "scheduler_unreachable",
            ControllerEvent::SchedulerSlow { .. } => "scheduler_slow",
            ControllerEvent::SchedulerReachable { .. } => "scheduler_reachable",
            ControllerEvent::AccountingPending { .. } => "accounting_pending",
            ControllerEvent::AccountingAvailable => "accounting_available",
            ControllerEvent::CancelError { .. } => "cancel_error",
            ControllerEvent::Requeued { .. } => "requeued",
            ControllerEvent::PoolRestarted { .. } => "pool_restarted",
            ControllerEvent::NodeExcluded { .. } => "node_excluded",
            ControllerEvent::OutputsMovedAside { .. } => "outputs_moved_aside",
            ControllerEvent::RetryFailed { .. } => "retry_failed",
            ControllerEvent::ShutDown { .. } => "shut_down",
            ControllerEvent::DecisionNeeded { .. } => "decision_needed",
            ControllerEvent::DecisionInvalid { .. } => "decision_invalid",
            ControllerEvent::DecisionMade { .. } => "decision_made",
            ControllerEvent::Detached { .. } => "detached",
        }
    }

    /// Whether this event reports a problem a person should look at (failures, an
    /// unreachable scheduler, cancel errors), as opposed to progress.
    pub fn is_problem(&self) -> bool {
        matches!(
            self,
            ControllerEvent::AttemptFinished { class: Some(_), .. }
                | ControllerEvent::AttemptStuck { .. }
                | ControllerEvent::StageFailed { .. }
                | ControllerEvent::Halted { .. }
                | ControllerEvent::SchedulerUnreachable { .. }
                | ControllerEvent::SchedulerSlow { .. }
                | ControllerEvent::AccountingPending { .. }
                | ControllerEvent::CancelError { .. }
                | ControllerEvent::NodeExcluded { .. }
                | ControllerEvent::DecisionInvalid { .. }
        )
    }
}

impl std::fmt::Display for ControllerEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControllerEvent::JournalRepaired { torn_bytes } => write!(
                f,
                "cut a torn last record of {torn_bytes} bytes (a crash during a write)"
            ),
            ControllerEvent::Recovered {
                reattached,
                unresolved_intents,
            } => write!(
                f,
                "re-attached to {reattached} live attempts; {unresolved_intents} intents without a handle"
            ),
            ControllerEvent::Revision {
                old,
                new,
                revision,
                cancelled,
            } => write!(
                f,
                "contract {old} -> {new}: revision {revision}, {cancelled} old attempts cancelled"
            ),
            ControllerEvent::SubmitUnknown { attempt_id, error } => {
                write!(f, "{attempt_id}: {error}; will look the job up again")
            }
            ControllerEvent::AttemptFinished {
                attempt_id,
                state,
                class: None,
                detail,
                ..
            } => write!(f, "{attempt_id} completed ({state}; {detail})"),
            ControllerEvent::AttemptFinished {
                attempt_id,
                state,
                class: Some(c),
                detail,
                decision,
                ..
            } => {
                write!(f, "{attempt_id} {state} ({c}: {detail})")?;
                if let Some(d) = decision {
                    write!(f, " -> {d}")?;
                }
                Ok(())
            }
            ControllerEvent::AttemptCancelled {
                attempt_id, detail, ..
            } => write!(
                f,
                "{attempt_id} cancelled by the controller ({detail}); runs again on the next run"
            ),
            ControllerEvent::AttemptStuck { attempt_id, reason } => {
                write!(f, "{attempt_id} stuck: {reason}; cancelling")
            }
            ControllerEvent::StageDone { stage } => write!(f, "stage {stage} done"),
            ControllerEvent::StageFailed { stage, reason } => {
                write!(f, "stage {stage} failed: {reason}")
            }
            ControllerEvent::Halted { stage, cancelled } => write!(
                f,
                "fail_fast after stage {stage} failed; {cancelled} live attempts cancelled"
            ),
            ControllerEvent::SchedulerUnreachable {
                error,
                consecutive,
                retry_in,
            } => write!(
                f,
                "scheduler unreachable ({consecutive} failed calls in a row): {error}; retrying in {:.1} s (not a job failure)",
                retry_in.as_secs_f64()
            ),
            ControllerEvent::SchedulerSlow { call, waited } => write!(
                f,
                "the scheduler has not answered `{call}` for {:.1} s (still waiting; Ctrl-C works)",
                waited.as_secs_f64()
            ),
            ControllerEvent::AccountingPending { attempts, reason } => write!(
                f,
                "{attempts} attempts finished but their accounting is pending (not failures; nothing is resubmitted): {reason}"
            ),
            ControllerEvent::AccountingAvailable => {
                write!(f, "accounting answers again: pending attempts are settled")
            }
            ControllerEvent::SchedulerReachable { after_errors } => write!(
                f,
                "scheduler reachable again after {after_errors} failed calls"
            ),
            ControllerEvent::CancelError { attempt_id, error } => {
                write!(f, "cancel of {attempt_id} failed: {error}")
            }
            ControllerEvent::Requeued {
                worker,
                requeued,
                failed,
            } => write!(
                f,
                "worker {worker} ended holding {} items: {requeued} requeued, {failed} failed",
                requeued + failed
            ),
            ControllerEvent::PoolRestarted {
                stage,
                items_left,
                workers,
            } => write!(
                f,
                "stage {stage}: {items_left} items left and no live worker: restarting {workers} workers"
            ),
            ControllerEvent::NodeExcluded { node, reason } => {
                write!(f, "node {node} excluded from later submissions: {reason}")
            }
            ControllerEvent::OutputsMovedAside { attempt_id, moved } => {
                write!(f, "outputs of {attempt_id}: {}", moved.join("; "))
            }
            ControllerEvent::RetryFailed {
                units,
                by,
                more_resources,
            } => write!(
                f,
                "running {} failed units again{}: {}{}",
                units.len(),
                if by.is_empty() {
                    String::new()
                } else {
                    format!(" (asked by {by})")
                },
                units.join(", "),
                if more_resources.is_empty() {
                    String::new()
                } else {
                    format!("; with more resources: {}", more_resources.join(", "))
                }
            ),
            ControllerEvent::ShutDown { reason, cancelled } => {
                write!(f, "{reason}: {cancelled} attempts cancelled")
            }
            ControllerEvent::DecisionNeeded {
                stage,
                file,
                candidates,
            } => write!(
                f,
                "stage {stage} needs a decision: write {} with `all`, `none`, or numbers/ids of: {}",
                file.display(),
                numbered(candidates)
            ),
            ControllerEvent::DecisionInvalid { stage, file, error } => write!(
                f,
                "decision file {} for stage {stage} is not valid: {error}; still waiting",
                file.display()
            ),
            ControllerEvent::DecisionMade {
                stage,
                chosen,
                skipped,
            } => {
                if chosen.is_empty() {
                    write!(f, "stage {stage} decided: none chosen")?;
                } else {
                    write!(f, "stage {stage} decided: {}", chosen.join(", "))?;
                }
                if !skipped.is_empty() {
                    write!(f, "; skipped: {}", skipped.join(", "))?;
                }
                Ok(())
            }
            ControllerEvent::Detached { live } => write!(
                f,
                "stopped with {live} attempts live; run again to re-attach"
            ),
        }
    }
}

/// `1. a, 2. b`, or `-` for none.
fn numbered(candidates: &[String]) -> String {
    if candidates.is_empty() {
        return "-".into();
    }
    candidates
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{}. {c}", i + 1))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_matches_the_serde_tag() {
        let id = AttemptId::new("n.s.0.a1").unwrap();
        let evs = [
            ControllerEvent::StageDone { stage: "s".into() },
            ControllerEvent::AttemptFinished {
                attempt_id: id.clone(),
                stage: "s".into(),
                state: "COMPLETED".into(),
                class: None,
                detail: "completed".into(),
                decision: None,
            },
            ControllerEvent::SchedulerUnreachable {
                error: "e".into(),
                consecutive: 1,
                retry_in: Duration::from_secs(2),
            },
            ControllerEvent::Detached { live: 3 },
            ControllerEvent::DecisionNeeded {
                stage: "post.f.pick".into(),
                file: PathBuf::from("/c/decisions/post.f.pick.txt"),
                candidates: vec!["post.f.eval:0".into()],
            },
            ControllerEvent::DecisionInvalid {
                stage: "post.f.pick".into(),
                file: PathBuf::from("/c/decisions/post.f.pick.txt"),
                error: "e".into(),
            },
            ControllerEvent::DecisionMade {
                stage: "post.f.pick".into(),
                chosen: vec![],
                skipped: vec!["post.f.mat".into()],
            },
        ];
        for e in evs {
            let v = serde_json::to_value(&e).unwrap();
            assert_eq!(v["kind"], e.kind(), "{e:?}");
        }
    }

    #[test]
    fn decision_events_name_the_file_and_the_choices() {
        let e = ControllerEvent::DecisionNeeded {
            stage: "post.f.pick".into(),
            file: PathBuf::from("/c/decisions/post.f.pick.txt"),
            candidates: vec!["post.f.eval:0".into(), "post.f.eval:1".into()],
        };
        assert_eq!(
            e.to_string(),
            "stage post.f.pick needs a decision: write /c/decisions/post.f.pick.txt with `all`, \
             `none`, or numbers/ids of: 1. post.f.eval:0, 2. post.f.eval:1"
        );
        assert!(!e.is_problem());
        let made = ControllerEvent::DecisionMade {
            stage: "post.f.pick".into(),
            chosen: vec![],
            skipped: vec!["post.f.mat".into()],
        };
        assert_eq!(
            made.to_string(),
            "stage post.f.pick decided: none chosen; skipped: post.f.mat"
        );
    }

    #[test]
    fn display_names_the_evidence_and_decision() {
        let e = ControllerEvent::AttemptFinished {
            attempt_id: AttemptId::new("n.s.0.a1").unwrap(),
            stage: "s".into(),
            state: "COMPLETED".into(),
            class: Some(FailureClass::Unknown),
            detail: "accounting inconsistent: allocation COMPLETED, step 0 CANCELLED by signal 10"
                .into(),
            decision: Some("failed".into()),
        };
        assert_eq!(
            e.to_string(),
            "n.s.0.a1 COMPLETED (unknown: accounting inconsistent: allocation COMPLETED, step 0 CANCELLED by signal 10) -> failed"
        );
        assert!(e.is_problem());
        assert!(!ControllerEvent::StageDone { stage: "s".into() }.is_problem());
    }
}
