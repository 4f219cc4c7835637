//! Shutdown: cancel requests journaled, then the executor calls; `retry_failed` resets;
//! [`cancel_campaign`] by tag, without the campaign folder.

use std::time::Duration;

use super::classify::FailureClass;
use super::driver::CampaignController;
use super::error::ControllerError;
use super::event::ControllerEvent;
use super::journal::Entry;
use super::state::StageStatus;
use super::step;
use crate::executor::{JobState, JobStatus};

/// Time all of a shutdown's executor cancels may take together.
pub(super) const SHUTDOWN_CANCEL_BUDGET: Duration = Duration::from_secs(30);
/// Time a shutdown's final status poll may take.
pub(super) const SHUTDOWN_POLL_BUDGET: Duration = Duration::from_millis(500);

impl CampaignController {
    /// Puts every failed unit back to pending ([`step::retry_failed`] decides): tells and
    /// journals the retries, then resets the units' budgets and reopens failed stages.
    pub(super) fn reset_failed(&mut self, by: &str) -> Result<(), ControllerError> {
        let Some(step::Retry {
            mut entries,
            event: ev,
            units: failed,
        }) = step::retry_failed(&self.state, &self.settings, by)
        else {
            return Ok(());
        };
        self.notify(&ev);
        entries.push(Entry::from_event(&ev));
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
    /// [`cancel_live_now`](Self::cancel_live_now)); [`step::cancel_requests`] picks them.
    /// Returns how many.
    pub(super) fn cancel_all(&mut self, reason: &str) -> Result<usize, ControllerError> {
        let entries = step::cancel_requests(&self.state, reason);
        let n = entries.len();
        self.record(entries)?;
        Ok(n)
    }

    /// The executor's cancels, then one status poll to record how the attempts ended. A
    /// scheduler that does not answer cannot hold a shutdown: the cancels share
    /// [`SHUTDOWN_CANCEL_BUDGET`] and the poll gets [`SHUTDOWN_POLL_BUDGET`]; attempts left
    /// unconfirmed keep their journaled cancel request and are recorded as cancelled by the
    /// caller (they run again on the next `run`).
    pub(super) async fn cancel_live_now(&mut self) -> Result<(), ControllerError> {
        let live = self.state.live_attempts();
        let deadline = tokio::time::Instant::now() + SHUTDOWN_CANCEL_BUDGET;
        for &a in &live {
            if let Some(h) = self.state.attempts[a].handle.clone() {
                let exec = self.io.executor.clone();
                let r = tokio::time::timeout_at(deadline, exec.cancel(&h))
                    .await
                    .unwrap_or_else(|_| {
                        Err(crate::executor::ExecutorError::CancelUnconfirmed {
                            attempt_id: h.attempt_id.clone(),
                            job_id: h.job_id.clone(),
                            state: "unknown (the scheduler did not answer in time)".into(),
                        })
                    });
                match r {
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
        let exec = self.io.executor.clone();
        if let Ok(Ok(sts)) = tokio::time::timeout(SHUTDOWN_POLL_BUDGET, exec.poll(&handles)).await {
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

/// The file (in `<campaign>/controller/`) where `campaign cancel` says who cancels before it
/// signals the controller; the controller reads and removes it when it shuts down.
pub(crate) const CANCEL_REQUEST_FILE: &str = "cancel_request";

/// `user U on HOST, pid P` for this process (the user from `$USER`/`$LOGNAME`, else the uid).
pub(crate) fn who_am_i() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|u| !u.is_empty() && !u.chars().any(char::is_control))
        // SAFETY: getuid(2) cannot fail.
        .unwrap_or_else(|| format!("uid {}", unsafe { libc::getuid() }));
    format!(
        "user {user} on {}, pid {}",
        crate::store::Owner::current().host,
        std::process::id()
    )
}

impl CampaignController {
    /// The reason of a cancel by a control (Ctrl-C, SIGTERM, `campaign cancel`): who asked,
    /// from the request file `campaign cancel` wrote (removed here), else this process's user
    /// (a signal or Ctrl-C to the controller).
    pub(super) fn user_cancel_reason(&self) -> String {
        let file = self.dir.join("controller").join(CANCEL_REQUEST_FILE);
        let by = std::fs::read_to_string(&file)
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty() && t.len() < 1000 && !t.chars().any(char::is_control));
        let _ = std::fs::remove_file(&file);
        match by {
            Some(by) => format!("cancelled by {by}"),
            None => format!(
                "cancelled by the user ({}: Ctrl-C or a signal to the controller)",
                who_am_i()
            ),
        }
    }
}

/// Whether `attempt_id` belongs to the campaign tagged `tag`: attempt ids are
/// `<tag>[r<revision>].<stage>.<index|agg>.a<n>` (see the [module docs](super)).
pub(super) fn has_campaign_tag(attempt_id: &str, tag: &str) -> bool {
    let Some(rest) = attempt_id.strip_prefix(tag) else {
        return false;
    };
    if let Some(r) = rest.strip_prefix('r') {
        let digits = r.bytes().take_while(u8::is_ascii_digit).count();
        return digits > 0 && r[digits..].starts_with('.');
    }
    rest.starts_with('.')
}

/// Finds and cancels every live job of the campaign tagged `tag` (its attempt-id nonce, see
/// [`CampaignController::tag`]), through the executor alone: no campaign folder or journal
/// is needed, so jobs orphaned by a lost folder can still be stopped. Returns the attempt
/// ids (Slurm: job names) cancelled.
///
/// # Errors
/// [`ControllerError::BadOption`] for a tag that is not 1–32 ASCII letters and digits (an
/// empty or short-circuiting pattern would cancel other campaigns' jobs);
/// [`ControllerError::Executor`] when the executor cannot list its jobs
/// ([`ExecutorError::Unsupported`](crate::executor::ExecutorError::Unsupported)) or the
/// scheduler fails.
pub async fn cancel_campaign(
    executor: &dyn crate::executor::Executor,
    tag: &str,
) -> Result<Vec<String>, ControllerError> {
    if tag.is_empty() || tag.len() > 32 || !tag.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(ControllerError::BadOption {
            option: "tag",
            reason: format!(
                "{tag:?} is not a campaign tag (1-32 ASCII letters and digits, the nonce that \
                 starts every attempt id of the campaign)"
            ),
        });
    }
    let tag = tag.to_string();
    let matches = move |id: &str| has_campaign_tag(id, &tag);
    Ok(executor.cancel_matching(&matches).await?)
}

#[cfg(test)]
mod tests {
    use super::has_campaign_tag;

    #[test]
    fn campaign_tag_matches_revisions_but_not_longer_tags() {
        assert!(has_campaign_tag("abc123.score.0.a1", "abc123"));
        assert!(has_campaign_tag("abc123r2.score.agg.a3", "abc123"));
        assert!(!has_campaign_tag("abc1234.score.0.a1", "abc123"));
        assert!(!has_campaign_tag("abc123rx.score.0.a1", "abc123"));
        assert!(!has_campaign_tag("abc123r.score.0.a1", "abc123"));
        assert!(!has_campaign_tag("zzz999.score.0.a1", "abc123"));
        assert!(!has_campaign_tag("abc123", "abc123"));
    }
}
