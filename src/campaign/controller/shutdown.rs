//! Shutdown: cancel requests journaled, then the executor calls; `retry_failed` resets.

use std::time::Duration;

use super::classify::FailureClass;
use super::driver::CampaignController;
use super::error::ControllerError;
use super::event::ControllerEvent;
use super::journal::Entry;
use super::policy::Decision;
use super::state::{StageStatus, UnitStatus};
use crate::executor::{JobState, JobStatus};

impl CampaignController {
    pub(super) fn reset_failed(&mut self) -> Result<(), ControllerError> {
        let failed: Vec<String> = self
            .state
            .units
            .iter()
            .filter(|u| u.status == UnitStatus::Failed)
            .map(|u| u.key.clone())
            .collect();
        if failed.is_empty() {
            return Ok(());
        }
        let mut entries: Vec<Entry> = failed
            .iter()
            .map(|k| Entry::Decided {
                unit: k.clone(),
                decision: Decision::Retry {
                    delay: Duration::ZERO,
                    resume: false,
                    more_resources: false,
                },
                not_before_ms: 0,
            })
            .collect();
        let ev = ControllerEvent::RetryFailed {
            units: failed.clone(),
        };
        self.notify(&ev);
        entries.push(Self::event_entry(&ev));
        self.record(entries)?;
        for u in &mut self.state.units {
            if failed.contains(&u.key) {
                u.transient = 0;
                u.oom = 0;
                u.counted = 0;
            }
        }
        for s in &mut self.state.stages {
            if s.status == StageStatus::Failed {
                s.status = StageStatus::Open;
                s.reason = None;
            }
        }
        Ok(())
    }

    /// Journals a cancel request for every live attempt (the executor calls follow in
    /// [`cancel_live_now`](Self::cancel_live_now)). Returns how many.
    pub(super) fn cancel_all(&mut self, reason: &str) -> Result<usize, ControllerError> {
        let entries: Vec<Entry> = self
            .state
            .live_attempts()
            .into_iter()
            .filter(|&a| !self.state.attempts[a].cancel_requested)
            .map(|a| Entry::CancelRequested {
                attempt_id: self.state.attempts[a].id.clone(),
                reason: reason.into(),
            })
            .collect();
        let n = entries.len();
        self.record(entries)?;
        Ok(n)
    }

    pub(super) async fn cancel_live_now(&mut self) -> Result<(), ControllerError> {
        let live = self.state.live_attempts();
        for &a in &live {
            if let Some(h) = self.state.attempts[a].handle.clone() {
                match self.io.executor.cancel(&h).await {
                    Ok(()) => {}
                    Err(e) if e.is_retryable() => {
                        self.emit(ControllerEvent::CancelError {
                            attempt_id: h.attempt_id.clone(),
                            error: e.to_string(),
                        })?;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        // Record what the executor now says.
        let handles: Vec<_> = live
            .iter()
            .filter_map(|&a| self.state.attempts[a].handle.clone())
            .collect();
        if let Ok(sts) = self.io.executor.poll(&handles).await {
            let mut entries = Vec::new();
            for (&a, st) in live.iter().zip(sts.iter()) {
                if st.state.is_terminal() {
                    entries.extend(self.finish_entries(a, st, None));
                }
            }
            self.record(entries)?;
        }
        Ok(())
    }

    /// Cancels every live attempt, records them as cancelled by the controller (they run again
    /// on the next [`run`](Self::run)), and returns how many were cancelled.
    ///
    /// # Errors
    /// Journal I/O errors and executor errors that are not retryable.
    pub async fn shutdown(&mut self, reason: &str) -> Result<usize, ControllerError> {
        let n = self.cancel_all(reason)?;
        // Intents without a handle: find their job, adopt, and cancel it too.
        self.resolve_intents().await?;
        let extra = self.cancel_all(reason)?;
        self.cancel_live_now().await?;
        // Attempts still live after the cancel (not confirmed): record them as cancelled.
        let mut entries = Vec::new();
        for a in self.state.live_attempts() {
            let st = JobStatus::new(
                self.state.attempts[a].id.clone(),
                JobState::Cancelled { by_uid: None },
            );
            entries.extend(self.finish_entries(
                a,
                &st,
                Some((FailureClass::Cancelled, reason.to_string())),
            ));
        }
        self.record(entries)?;
        self.emit(ControllerEvent::ShutDown {
            reason: reason.to_string(),
            cancelled: n + extra,
        })?;
        Ok(n + extra)
    }
}
