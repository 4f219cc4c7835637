//! [`JobDecision`] and [`Plan`]: what a drain would do with each run, and why.

use std::fmt;

use crate::identity::Hash;

/// What a drain does with a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Execute it.
    Run,
    /// Its result is recorded and current.
    Skip,
    /// Another live process is running it; the drain waits for that result.
    Wait,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Run => "run",
            Action::Skip => "skip",
            Action::Wait => "wait",
        })
    }
}

/// The decision for one run, with every reason (e.g. `no record`, `code changed: src/lib.rs`,
/// `environment changed: Cargo.lock`, `last attempt failed: ...`, `up to date`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobDecision {
    /// The job key.
    pub key: Hash,
    /// The job's name.
    pub job: String,
    /// Its parameters, as canonical JSON.
    pub params: String,
    /// What the drain does.
    pub action: Action,
    /// Why.
    pub reasons: Vec<String>,
    /// When the run replaces a done result (changed witnesses, or forced): that result's
    /// attempt number, so a drain re-runs it only if nobody replaced it meanwhile.
    pub replaces: Option<u32>,
}

impl fmt::Display for JobDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<4}  {}  {}  {}  ({})",
            self.action,
            self.key.short(),
            self.job,
            self.params,
            self.reasons.join("; ")
        )
    }
}

/// The decisions for a whole queue, in enqueue order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// One per distinct queued run.
    pub decisions: Vec<JobDecision>,
}

impl Plan {
    /// How many runs take `action`.
    pub fn count(&self, action: Action) -> usize {
        self.decisions.iter().filter(|d| d.action == action).count()
    }

    /// The decisions that execute.
    pub fn to_run(&self) -> impl Iterator<Item = &JobDecision> {
        self.decisions.iter().filter(|d| d.action == Action::Run)
    }
}

/// A line per run, then a count line.
impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.decisions {
            writeln!(f, "{d}")?;
        }
        write!(
            f,
            "plan: {} to run, {} up to date, {} running elsewhere",
            self.count(Action::Run),
            self.count(Action::Skip),
            self.count(Action::Wait)
        )
    }
}
