//! What a [`run`](super::CampaignController::run) reports.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::classify::FailureClass;

/// Progress of one stage.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StageProgress {
    /// Stage id.
    pub stage: String,
    /// `waiting`, `running`, `done`, `failed`, `blocked` (a parent failed), `decision` (a
    /// manual decision waits for a person) or `skipped` (a manual decision upstream chose
    /// none).
    pub status: String,
    /// The status in words, as `campaign status` and the report write it: `running`,
    /// `cancelled`, `backing off until 14:03:07 UTC (attempt 2, oom)`, `waiting for a
    /// decision`, `blocked by score`, ...
    #[serde(default)]
    pub state: String,
    /// Units (work items plus the aggregate step).
    pub total: usize,
    /// Units done.
    pub done: usize,
    /// Units with a live attempt.
    pub running: usize,
    /// Units waiting to be submitted (or submitted, not yet confirmed).
    pub queued: usize,
    /// Units failed for good.
    pub failed: usize,
    /// First submit (ms since the Unix epoch, controller clock).
    pub started_ms: Option<u64>,
    /// End (ms, controller clock).
    pub ended_ms: Option<u64>,
}

/// A failed stage.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StageFailure {
    /// Stage id.
    pub stage: String,
    /// Why, naming the unit and the evidence.
    pub reason: String,
    /// The failure class of the first failed unit.
    pub class: Option<FailureClass>,
    /// Logs of the failed units' last attempts.
    pub logs: Vec<PathBuf>,
}

/// The outcome of one run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CampaignReport {
    /// Stages done (this run or before).
    pub completed: Vec<String>,
    /// Stages failed, with log paths.
    pub failed: Vec<StageFailure>,
    /// Stages not started because a parent failed (`drain`).
    pub blocked: Vec<String>,
    /// Stages neither done, failed nor blocked (run detached or halted first).
    pub unfinished: Vec<String>,
    /// The halt policy `fail_fast` stopped the campaign.
    pub halted: bool,
    /// Attempts cancelled on request (menu, signal, [`shutdown`](super::CampaignController::shutdown)).
    pub cancelled: usize,
    /// The run stopped with jobs left running (`once`, `max_iterations`, detach).
    pub detached: bool,
    /// Loop iterations.
    pub iterations: u64,
    /// Attempts submitted in this run.
    pub submitted: u64,
    /// Jobs adopted through `find` (submitted before a crash, handle not recorded).
    pub adopted: u64,
    /// Live attempts re-attached at the start.
    pub reattached: usize,
    /// Attempts still live at the end.
    pub live: usize,
    /// Per-stage progress at the end.
    pub stages: Vec<StageProgress>,
    /// Stages skipped because a manual decision upstream chose no candidate.
    #[serde(default)]
    pub skipped: Vec<String>,
    /// Manual decisions the campaign waits for (their stages are also in `unfinished`).
    #[serde(default)]
    pub decisions: Vec<PendingDecision>,
}

/// A manual decision stage waiting for a person.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PendingDecision {
    /// The decision stage.
    pub stage: String,
    /// The decision file to write (`all`, `none`, candidate numbers from 1 or ids).
    pub file: PathBuf,
    /// The candidates, numbered from 1.
    pub candidates: Vec<String>,
}

impl CampaignReport {
    /// Whether every stage completed.
    pub fn is_complete(&self) -> bool {
        self.failed.is_empty()
            && self.blocked.is_empty()
            && self.unfinished.is_empty()
            && !self.detached
    }
}

impl fmt::Display for CampaignReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in super::view::progress_lines(&self.stages, None) {
            writeln!(f, "{line}")?;
        }
        for s in &self.failed {
            writeln!(f, "FAILED {}: {}", s.stage, s.reason)?;
            for l in &s.logs {
                writeln!(f, "  log: {}", l.display())?;
            }
        }
        if !self.blocked.is_empty() {
            writeln!(
                f,
                "not started (a parent failed): {}",
                self.blocked.join(", ")
            )?;
        }
        if !self.skipped.is_empty() {
            writeln!(
                f,
                "skipped (a manual decision chose none): {}",
                self.skipped.join(", ")
            )?;
        }
        for d in &self.decisions {
            writeln!(
                f,
                "DECISION NEEDED for {}: write {} (`all`, `none`, numbers 1-{} or ids)",
                d.stage,
                d.file.display(),
                d.candidates.len()
            )?;
        }
        write!(
            f,
            "{} of {} stages complete; {} submitted, {} adopted, {} re-attached, {} cancelled, {} iterations{}{}",
            self.completed.len(),
            self.stages.len(),
            self.submitted,
            self.adopted,
            self.reattached,
            self.cancelled,
            self.iterations,
            if self.halted {
                "; halted (fail_fast)"
            } else {
                ""
            },
            if self.detached {
                format!("; detached with {} jobs running", self.live)
            } else {
                String::new()
            },
        )
    }
}
