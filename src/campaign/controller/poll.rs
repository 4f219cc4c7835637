//! Polling live attempts: one executor call per batch; scheduler errors shown at once and
//! retried with backoff (never a job failure); stuck pending jobs cancelled; running jobs
//! whose progress mark did not move for the stage's heartbeat timeout cancelled as hung.

use std::time::Duration;

use super::classify::{Evidence, FailureClass};
use super::driver::CampaignController;
use super::error::ControllerError;
use super::event::ControllerEvent;
use super::journal::Entry;
use super::spec::{HEARTBEAT_FILE, output_dir};
use super::step::{self, Mark};
use crate::executor::JobStatus;

impl CampaignController {
    /// The evidence of a running attempt's logs: the tail of its job log and of the rank
    /// logs it wrote under its unit's `logs/` folder.
    fn running_evidence(&self, a: usize, st: &JobStatus) -> Evidence {
        let at = &self.state.attempts[a];
        let u = &self.state.units[at.unit];
        let stage = &self.plan.stages[u.stage];
        let out = output_dir(&self.dir, &stage.stage_id, u.item);
        let log_path = step::log_path(&self.dir, st, &at.id);
        let (log_tail, log_unavailable) = match Self::read_tail(&log_path) {
            Ok(t) => (t, None),
            Err(why) => (String::new(), Some(why)),
        };
        let since = at.handle.as_ref().map_or(0, |h| h.submitted_at_ms);
        Evidence {
            log_tail,
            log_unavailable,
            rank_logs: Self::rank_logs(&out.join("logs"), since),
            rank_dir: Some(out.join("logs")),
            log_path: Some(log_path),
            resumable: stage.worker.resumable,
            ..Evidence::default()
        }
    }

    /// Heartbeat check of a running attempt whose mark is due (see [`step::beat_due`]): reads
    /// its heartbeat file's time and the highest `step N` of its logs, updates its progress
    /// mark and says whether it has not moved for `timeout` (`Some((silent for, last step))`).
    fn check_heartbeat(
        &mut self,
        a: usize,
        st: &JobStatus,
        now: u64,
        timeout: Duration,
    ) -> Option<(Duration, Option<u64>)> {
        let at = &self.state.attempts[a];
        let u = &self.state.units[at.unit];
        let stage_id = &self.plan.stages[u.stage].stage_id;
        let hb = output_dir(&self.dir, stage_id, u.item).join(HEARTBEAT_FILE);
        let since = at.handle.as_ref().map_or(0, |h| h.submitted_at_ms);
        // A heartbeat file left by an earlier attempt is not this one's.
        let file_ms = crate::sys::mtime_ms(&hb).filter(|&t| t + 1000 >= since);
        let ev = self.running_evidence(a, st);
        let last = std::iter::once(ev.log_tail.as_str())
            .chain(ev.rank_logs.iter().map(|(_, t)| t.as_str()))
            .filter_map(|t| super::classify::progress_step(&t.to_ascii_lowercase()))
            .max();
        let (beat, hung) = step::heartbeat(at.beat, last, file_ms, now, timeout);
        self.state.attempts[a].beat = Some(beat);
        hung
    }

    /// Cancels a hung attempt (its last heartbeat journaled with the cancel request) and
    /// returns its Finished + Decided entries, classified from its logs as they are once it
    /// ended (what it printed on SIGTERM, e.g. a stack dump, included).
    async fn cancel_hung(
        &mut self,
        a: usize,
        silent: Duration,
        last_step: Option<u64>,
        st: &JobStatus,
    ) -> Result<Vec<Entry>, ControllerError> {
        let cancel = step::hung_cancel(&self.state, a, silent, last_step, st);
        self.perform(cancel.before)?;
        if let Some(h) = self.state.attempts[a].handle.clone() {
            // The executor's cancel is soft then hard (Slurm: scancel's SIGTERM, SIGKILL after
            // KillWait; local: SIGTERM, SIGKILL after its grace). If it fails, the attempt
            // stays live with its cancel requested and ends as cancelled by the controller.
            if let Err(e) = self.io.executor.cancel(&h).await {
                self.emit(ControllerEvent::CancelError {
                    attempt_id: self.state.attempts[a].id.clone(),
                    error: e.to_string(),
                })?;
                return Ok(Vec::new());
            }
        }
        let mut ev = self.running_evidence(a, st);
        if let Some(p) = &ev.log_path {
            ev.log_first_line = Self::tail_first_line(p);
        }
        let v = step::hung_verdict(&ev, silent, last_step);
        Ok(self.finish_entries(
            a,
            &cancel.ended,
            Some((v.class.unwrap_or(FailureClass::Hung), v.detail)),
        ))
    }

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
                    self.io.view.scheduler_error(Some(format!(
                        "scheduler unreachable ({n} in a row): {e}"
                    )));
                    // Shown at once (the first failed call), then rate-limited: every tenth.
                    if let (_, Some(ev)) = step::poll_failed(&self.settings, n, e.to_string()) {
                        self.emit(ev)?;
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
            let now = self.io.clock.now_ms();
            let plan = step::poll_plan(
                &self.state,
                &self.plan,
                &self.settings,
                now,
                chunk,
                &statuses,
            );
            for m in plan.marks {
                match m {
                    Mark::ClearBeat(a) => self.state.attempts[a].beat = None,
                    Mark::PendingSince(a, since) => self.state.attempts[a].pending_since_ms = since,
                }
            }
            let mut entries = Vec::new();
            for (a, i) in plan.ended {
                entries.extend(self.finish_entries(a, &statuses[i], None));
            }
            let mut hung = Vec::new();
            for (a, i, timeout) in plan.beat_due {
                if let Some((silent, last)) = self.check_heartbeat(a, &statuses[i], now, timeout) {
                    hung.push((a, silent, last, i));
                }
            }
            for (a, class, reason) in plan.stuck {
                let (cancel, msg) = step::stuck_cancel(&self.state, &self.settings, a, &reason);
                self.perform(cancel.before)?;
                if let Some(h) = self.state.attempts[a].handle.clone() {
                    self.io.executor.cancel(&h).await?;
                }
                entries.extend(self.finish_entries(a, &cancel.ended, Some((class, msg))));
            }
            for (a, silent, last, i) in hung {
                entries.extend(self.cancel_hung(a, silent, last, &statuses[i]).await?);
            }
            progressed |= !entries.is_empty();
            self.record(entries)?;
            self.exclude_refused_hosts(plan.refused_hosts)?;
            self.exclude_broken_nodes()?;
        }
        // Dead pool workers: return their items.
        self.note_accounting(acct_pending, acct_reason)?;
        Ok(progressed)
    }
}
