//! Polling live attempts: one executor call per batch; scheduler errors shown at once and
//! retried with backoff (never a job failure); stuck pending jobs cancelled; running jobs
//! whose progress mark did not move for the stage's heartbeat timeout cancelled as hung.

use std::time::Duration;

use super::classify::{Evidence, FailureClass, PendingVerdict, classify_hung, pending_verdict};
use super::driver::CampaignController;
use super::error::ControllerError;
use super::event::ControllerEvent;
use super::journal::Entry;
use super::spec::{HEARTBEAT_FILE, output_dir};
use super::state::Beat;
use crate::executor::{JobState, JobStatus};

impl CampaignController {
    /// The heartbeat timeout of stage `si`: the builder's, else the plan's.
    fn heartbeat_timeout(&self, si: usize) -> Option<Duration> {
        let st = &self.plan.stages[si];
        self.settings
            .heartbeat
            .get(&st.stage_id)
            .copied()
            .or(st.spec.heartbeat_timeout_s.map(Duration::from_secs))
    }

    /// The evidence of a running attempt's logs: the tail of its job log and of the rank
    /// logs it wrote under its unit's `logs/` folder.
    fn running_evidence(&self, a: usize, st: &JobStatus) -> Evidence {
        let at = &self.state.attempts[a];
        let u = &self.state.units[at.unit];
        let stage = &self.plan.stages[u.stage];
        let out = output_dir(&self.dir, &stage.stage_id, u.item);
        let log_path = st
            .log_path
            .clone()
            .unwrap_or_else(|| self.dir.join("logs").join(format!("{}.log", at.id)));
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

    /// Heartbeat check of a running attempt: updates its progress mark and says whether it
    /// has not moved for the stage's timeout (`Some((silent for, last step))`).
    fn check_heartbeat(
        &mut self,
        a: usize,
        st: &JobStatus,
        now: u64,
    ) -> Option<(Duration, Option<u64>)> {
        let at = &self.state.attempts[a];
        if at.cancel_requested {
            return None;
        }
        let u = &self.state.units[at.unit];
        let timeout = self.heartbeat_timeout(u.stage)?;
        // The logs are read at most every 1/20 of the timeout (at least 1 s): many running
        // attempts with many rank logs must not turn each poll into a scan.
        let every = (timeout / 20).max(Duration::from_secs(1)).as_millis() as u64;
        if let Some(b) = at.beat
            && now.saturating_sub(b.checked_ms) < every
        {
            let silent = Duration::from_millis(now.saturating_sub(b.moved_ms));
            if silent < timeout {
                return None;
            }
        }
        let stage_id = &self.plan.stages[u.stage].stage_id;
        let hb = output_dir(&self.dir, stage_id, u.item).join(HEARTBEAT_FILE);
        let since = at.handle.as_ref().map_or(0, |h| h.submitted_at_ms);
        // A heartbeat file left by an earlier attempt is not this one's.
        let file_ms = crate::sys::mtime_ms(&hb).filter(|&t| t + 1000 >= since);
        let ev = self.running_evidence(a, st);
        let step = std::iter::once(ev.log_tail.as_str())
            .chain(ev.rank_logs.iter().map(|(_, t)| t.as_str()))
            .filter_map(|t| super::classify::progress_step(&t.to_ascii_lowercase()))
            .max();
        let at = &mut self.state.attempts[a];
        let beat = match at.beat {
            None => Beat {
                step,
                file_ms,
                moved_ms: now,
                checked_ms: now,
            },
            Some(b) if step > b.step || file_ms > b.file_ms => Beat {
                step: step.max(b.step),
                file_ms: file_ms.max(b.file_ms),
                moved_ms: now,
                checked_ms: now,
            },
            Some(b) => Beat {
                checked_ms: now,
                ..b
            },
        };
        at.beat = Some(beat);
        let silent = Duration::from_millis(now.saturating_sub(beat.moved_ms));
        (silent >= timeout).then_some((silent, beat.step))
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
        let id = self.state.attempts[a].id.clone();
        let last_heartbeat_ms = self.state.attempts[a].beat.map(|b| b.moved_ms);
        let reason = format!(
            "no progress mark for {} s (heartbeat timeout; last mark {})",
            silent.as_secs(),
            last_step.map_or_else(|| "none".to_string(), |s| format!("step {s}"))
        );
        self.record(vec![Entry::CancelRequested {
            attempt_id: id.clone(),
            reason: reason.clone(),
            last_heartbeat_ms,
        }])?;
        self.emit(ControllerEvent::AttemptStuck {
            attempt_id: id.clone(),
            reason: reason.clone(),
        })?;
        if let Some(h) = self.state.attempts[a].handle.clone() {
            // The executor's cancel is soft then hard (Slurm: scancel's SIGTERM, SIGKILL after
            // KillWait; local: SIGTERM, SIGKILL after its grace). If it fails, the attempt
            // stays live with its cancel requested and ends as cancelled by the controller.
            if let Err(e) = self.io.executor.cancel(&h).await {
                self.emit(ControllerEvent::CancelError {
                    attempt_id: id,
                    error: e.to_string(),
                })?;
                return Ok(Vec::new());
            }
        }
        let mut ev = self.running_evidence(a, st);
        if let Some(p) = &ev.log_path {
            ev.log_first_line = Self::tail_first_line(p);
        }
        let c = classify_hung(&ev, silent, last_step);
        let mut done = JobStatus::new(id, JobState::Cancelled { by_uid: None }).with_reason(reason);
        done.nodes = st.nodes.clone();
        Ok(self.finish_entries(
            a,
            &done,
            Some((c.class.unwrap_or(FailureClass::Hung), c.detail)),
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
            let mut hung = Vec::new();
            let mut refused_hosts = Vec::new();
            let now = self.io.clock.now_ms();
            for (&a, st) in chunk.iter().zip(statuses.iter()) {
                if st.state != JobState::Running {
                    // Suspended, requeued or pending again: the heartbeat counts from the
                    // next time it runs.
                    self.state.attempts[a].beat = None;
                }
                if st.state == JobState::NodeFail
                    && let Some(host) = st.refused_host_key.as_deref()
                {
                    // Its host's SSH key changed or is unknown (issue 27, P07): the host is
                    // excluded, the attempt ends as a node failure and is placed elsewhere.
                    let why = st.reason.clone().unwrap_or_default();
                    refused_hosts.push((host.to_string(), why));
                }
                if st.state.is_terminal() {
                    entries.extend(self.finish_entries(a, st, None));
                } else if st.state == JobState::Running {
                    if let Some((silent, step)) = self.check_heartbeat(a, st, now) {
                        hung.push((a, silent, step, st.clone()));
                    }
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
                    last_heartbeat_ms: None,
                }])?;
                if let Some(h) = self.state.attempts[a].handle.clone() {
                    self.io.executor.cancel(&h).await?;
                }
                let st = JobStatus::new(id, JobState::Cancelled { by_uid: None })
                    .with_reason(msg.clone());
                entries.extend(self.finish_entries(a, &st, Some((class, msg))));
            }
            for (a, silent, step, st) in hung {
                entries.extend(self.cancel_hung(a, silent, step, &st).await?);
            }
            progressed |= !entries.is_empty();
            self.record(entries)?;
            self.exclude_refused_hosts(refused_hosts)?;
            self.exclude_broken_nodes()?;
        }
        // Dead pool workers: return their items.
        self.note_accounting(acct_pending, acct_reason)?;
        Ok(progressed)
    }
}
