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

use std::collections::HashSet;

use super::choose_revisions;
use super::driver::CampaignController;
use super::error::ControllerError;
use super::event::ControllerEvent;
use super::journal::Entry;
use super::spec::{decision_file, selection_file};
use super::state::StageStatus;

impl CampaignController {
    /// Decides the manual decision stages that are ready; returns whether one was decided.
    pub(super) fn advance_decisions(&mut self) -> Result<bool, ControllerError> {
        if self.halted {
            return Ok(false);
        }
        let mut progressed = false;
        for si in 0..self.state.stages.len() {
            let s = &self.state.stages[si];
            if !self.awaits_decision(s) {
                continue;
            }
            let Some(d) = self.plan.stages[si].decision.clone() else {
                continue;
            };
            let stage = s.id.clone();
            let file = decision_file(&self.dir, &stage);
            let mut chosen = None;
            match std::fs::read_to_string(&file) {
                Ok(text) => match choose_revisions(&text, &d.candidates) {
                    Ok(c) => chosen = Some(c),
                    Err(e) => self.invalid_decision(&stage, &file, e)?,
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => self.invalid_decision(&stage, &file, format!("cannot be read: {e}"))?,
            }
            if chosen.is_none()
                && let Some(p) = self.settings.prompt.clone()
                && !self.counters.prompt_declined.contains(&stage)
            {
                chosen = self.io.view.suspend(|| p.ask(&stage, &d.candidates, &file));
                if chosen.is_none() {
                    self.counters.prompt_declined.insert(stage.clone());
                }
            }
            match chosen {
                Some(c) => {
                    self.decided(si, &d.input, &d.candidates, c)?;
                    progressed = true;
                }
                None if !self.state.stages[si].decision_announced => {
                    // The folder exists, so `echo all > FILE` is all a person has to do.
                    if let Some(parent) = file.parent() {
                        std::fs::create_dir_all(parent)
                            .map_err(|e| ControllerError::io("creating", parent, e))?;
                    }
                    let candidates = d.candidates.clone();
                    self.notify(&ControllerEvent::DecisionNeeded {
                        stage: stage.clone(),
                        file: file.clone(),
                        candidates: candidates.clone(),
                    });
                    self.record(vec![Entry::DecisionNeeded {
                        stage,
                        file,
                        candidates,
                    }])?;
                }
                None => {}
            }
        }
        Ok(progressed)
    }

    /// Reports a bad decision file once per message (the stage keeps waiting).
    fn invalid_decision(
        &mut self,
        stage: &str,
        file: &std::path::Path,
        error: String,
    ) -> Result<(), ControllerError> {
        if self.counters.decision_errors.get(stage) == Some(&error) {
            return Ok(());
        }
        self.counters
            .decision_errors
            .insert(stage.to_string(), error.clone());
        self.emit(ControllerEvent::DecisionInvalid {
            stage: stage.to_string(),
            file: file.to_path_buf(),
            error,
        })
    }

    /// Writes the selection, then journals the decision, the stage's end and (for `none`) the
    /// skipped descendants in one durable append.
    fn decided(
        &mut self,
        si: usize,
        input: &str,
        candidates: &[String],
        chosen: Vec<String>,
    ) -> Result<(), ControllerError> {
        let stage = self.state.stages[si].id.clone();
        let path = selection_file(&self.dir, &stage);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| ControllerError::io("creating", parent, e))?;
        }
        let body = serde_json::json!({
            "stage": stage,
            "input": input,
            "candidates": candidates,
            "chosen": chosen,
        });
        let mut bytes = serde_json::to_vec_pretty(&body).unwrap_or_default();
        bytes.push(b'\n');
        crate::fsutil::atomic_write(&path, &bytes)
            .map_err(|e| ControllerError::io("writing", &path, e))?;
        let skipped = if chosen.is_empty() {
            self.descendants(si)
        } else {
            Vec::new()
        };
        let mut entries = vec![
            Entry::DecisionMade {
                stage: stage.clone(),
                chosen: chosen.clone(),
            },
            Entry::StageDone {
                stage: stage.clone(),
            },
        ];
        entries.extend(skipped.iter().map(|s| Entry::StageSkipped {
            stage: s.clone(),
            reason: format!("the manual decision {stage} chose none"),
        }));
        self.notify(&ControllerEvent::DecisionMade {
            stage: stage.clone(),
            chosen,
            skipped: skipped.clone(),
        });
        self.notify(&ControllerEvent::StageDone {
            stage: stage.clone(),
        });
        self.record(entries)
    }

    /// Open stages that depend on stage `si`, directly or not, in plan order.
    fn descendants(&self, si: usize) -> Vec<String> {
        let mut below: HashSet<usize> = HashSet::from([si]);
        let mut out = Vec::new();
        // Plan order is topological: parents come before their children.
        for (i, s) in self.state.stages.iter().enumerate().skip(si + 1) {
            if s.parents.iter().any(|p| below.contains(p)) {
                below.insert(i);
                if s.status == StageStatus::Open {
                    out.push(s.id.clone());
                }
            }
        }
        out
    }
}
