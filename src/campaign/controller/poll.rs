//! Polling live attempts: one executor call per batch; scheduler errors shown at once and
//! retried with backoff (never a job failure); stuck pending jobs cancelled.

use super::classify::{PendingVerdict, pending_verdict};
use super::driver::CampaignController;
use super::error::ControllerError;
use super::event::ControllerEvent;
use super::journal::Entry;
use crate::executor::{JobState, JobStatus};

impl CampaignController {
    /// Shows and journals (once per outage) that finished jobs wait for their accounting.
    fn note_accounting(
        &mut self,
        pending: usize,
        reason: Option<String>,
    ) -> Result<(), ControllerError> {
        let was = self.counters.accounting_pending;
        self.counters.accounting_pending = pending;
        if pending > 0 {
            let reason = reason.unwrap_or_default();
            self.io.view.scheduler_error(Some(format!(
                "{pending} attempts finished, accounting pending: {reason}"
            )));
            if was == 0 {
                self.emit(ControllerEvent::AccountingPending {
                    attempts: pending,
                    reason,
                })?;
            }
        } else if was > 0 {
            self.io.view.scheduler_error(None);
            self.emit(ControllerEvent::AccountingAvailable)?;
        }
        Ok(())
    }

    pub(super) async fn poll_live(&mut self) -> Result<bool, ControllerError> {
        let live = self.state.live_attempts();
        if live.is_empty() {
            return Ok(false);
        }
        let mut progressed = false;
        let (mut acct_pending, mut acct_reason) = (0, None);
        for chunk in live.chunks(self.settings.poll_batch) {
            let handles: Vec<_> = chunk
                .iter()
                .filter_map(|&a| self.state.attempts[a].handle.clone())
                .collect();
            let exec = self.io.executor.clone();
            let Some(polled) = self.guarded("poll", exec.poll(&handles)).await? else {
                return Ok(progressed);
            };
            let statuses = match polled {
                Ok(s) => s,
                Err(e) if e.is_retryable() => {
                    self.counters.poll_errors += 1;
                    self.counters.poll_errors_in_row += 1;
                    let n = self.counters.poll_errors_in_row;
                    let retry_in = self
                        .settings
                        .poll_min
                        .mul_f64(1.5f64.powi(n.min(64) as i32))
                        .min(self.settings.poll_max);
                    self.io.view.scheduler_error(Some(format!(
                        "scheduler unreachable ({n} in a row): {e}"
                    )));
                    // Shown at once (the first failed call), then rate-limited: every tenth.
                    if n % 10 == 1 {
                        self.emit(ControllerEvent::SchedulerUnreachable {
                            error: e.to_string(),
                            consecutive: n,
                            retry_in,
                        })?;
                    }
                    return Ok(false);
                }
                Err(e) => return Err(e.into()),
            };
            if self.counters.poll_errors_in_row > 0 {
                let after_errors = std::mem::take(&mut self.counters.poll_errors_in_row);
                self.io.view.scheduler_error(None);
                self.emit(ControllerEvent::SchedulerReachable { after_errors })?;
            }
            for s in statuses.iter().filter(|s| s.accounting_pending) {
                acct_pending += 1;
                acct_reason.get_or_insert_with(|| s.reason.clone().unwrap_or_default());
            }
            let mut entries = Vec::new();
            let mut cancels = Vec::new();
            let now = self.io.clock.now_ms();
            for (&a, st) in chunk.iter().zip(statuses.iter()) {
                if st.state.is_terminal() {
                    entries.extend(self.finish_entries(a, st, None));
                } else if matches!(st.state, JobState::Pending) {
                    let at = &mut self.state.attempts[a];
                    if let Some(PendingVerdict::Stuck(class)) =
                        st.reason.as_deref().map(pending_verdict)
                    {
                        let since = *at.pending_since_ms.get_or_insert(now);
                        if now.saturating_sub(since) >= self.settings.stuck_after.as_millis() as u64
                            && !at.cancel_requested
                        {
                            cancels.push((a, class, st.reason.clone().unwrap_or_default()));
                        }
                    } else {
                        at.pending_since_ms = None;
                    }
                }
            }
            for (a, class, reason) in cancels {
                let id = self.state.attempts[a].id.clone();
                let msg = format!(
                    "pending with reason {reason} for longer than {:?}",
                    self.settings.stuck_after
                );
                self.record(vec![Entry::CancelRequested {
                    attempt_id: id.clone(),
                    reason: msg.clone(),
                }])?;
                if let Some(h) = self.state.attempts[a].handle.clone() {
                    self.io.executor.cancel(&h).await?;
                }
                let st = JobStatus::new(id, JobState::Cancelled { by_uid: None })
                    .with_reason(msg.clone());
                entries.extend(self.finish_entries(a, &st, Some((class, msg))));
            }
            progressed |= !entries.is_empty();
            self.record(entries)?;
        }
        // Dead pool workers: return their items.
        self.note_accounting(acct_pending, acct_reason)?;
        Ok(progressed)
    }
}
