//! Manual decision stages (post-MIP filters with `mode: manual`; see
//! [`ManualDecision`](crate::campaign::ManualDecision)).
//!
//! Once the stage's parents are done, the controller looks for an answer, every iteration:
//! 1. the decision file `<campaign>/decisions/<stage>.txt` (written ahead, or off a terminal),
//!    parsed by [`choose_revisions`]: `all`, `none`, candidate numbers (from 1) and ids; a bad
//!    content is reported once ([`ControllerEvent::DecisionInvalid`]) and the stage keeps
//!    waiting;
//! 2. the builder's [`DecisionPrompt`](super::DecisionPrompt) (a numbered prompt on a terminal),
//!    asked once per process;
//! 3. otherwise it journals and notifies [`ControllerEvent::DecisionNeeded`] (once per stage)
//!    and waits, while other stages go on.
//!
//! The answer is written to `work/<stage>/0/selected.json` (temp file and rename), then
//! journaled as `decision_made` with the stage's `stage_done` in one durable append, so a
//! restart never asks again. The stage has no attempt and no GPU-hours. Choosing none ends the
//! flow: every descendant of the stage is journaled `stage_skipped` and never runs (the
//! campaign still completes; the report lists them as skipped).
//!
//! A new revision (`new_revision`, the contract changed) starts over: its decisions are asked
//! again, and a decision file left from before is read again (delete it to be asked).

use super::driver::CampaignController;
use super::error::ControllerError;
use super::spec::decision_file;
use super::step::{self, DecisionFile};

impl CampaignController {
    /// Decides the manual decision stages that are ready; returns whether one was decided.
    /// Reads each stage's decision file (and asks the prompt) here; what to do with the
    /// answer is [`step::decision_actions`]'s.
    pub(super) fn advance_decisions(&mut self) -> Result<bool, ControllerError> {
        if self.halted {
            return Ok(false);
        }
        let mut progressed = false;
        for si in 0..self.state.stages.len() {
            // Checked again for each stage: a decision made above may open or skip this one.
            if !step::awaits_decision(&self.state, &self.state.stages[si]) {
                continue;
            }
            let Some(d) = self.plan.stages[si].decision.clone() else {
                continue;
            };
            let stage = self.state.stages[si].id.clone();
            let file = decision_file(&self.dir, &stage);
            let read = match std::fs::read_to_string(&file) {
                Ok(text) => DecisionFile::Text(text),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => DecisionFile::Absent,
                Err(e) => DecisionFile::Unreadable(e.to_string()),
            };
            let mut chosen = match step::file_choice(&read, &d.candidates) {
                Ok(c) => c,
                Err(error) => {
                    let last = self
                        .counters
                        .decision_errors
                        .get(&stage)
                        .map(String::as_str);
                    if let Some(ev) = step::invalid_decision(last, &stage, &file, error.clone()) {
                        self.counters.decision_errors.insert(stage.clone(), error);
                        self.emit(ev)?;
                    }
                    None
                }
            };
            if chosen.is_none()
                && let Some(p) = self.settings.prompt.clone()
                && !self.counters.prompt_declined.contains(&stage)
            {
                chosen = self.io.view.suspend(|| p.ask(&stage, &d.candidates, &file));
                if chosen.is_none() {
                    self.counters.prompt_declined.insert(stage.clone());
                }
            }
            progressed |= chosen.is_some();
            let actions = step::decision_actions(&self.state, &self.plan, &self.dir, si, chosen);
            self.perform(actions)?;
        }
        Ok(progressed)
    }
}
