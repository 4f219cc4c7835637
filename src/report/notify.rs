//! [`Notifier`]: runs a command with an event as JSON on its stdin when a stage completes or
//! fails, the campaign ends, an attempt is declared hung, or a manual decision waits for a
//! person.
//!
//! The command is an argv (no shell): `["notify-send", "puzzletron"]`,
//! `["curl", "-sS", "--data-binary", "@-", "https://chat.example/hook"]`. Each event runs it
//! once, in order, on the notifier's own thread, so a slow notifier never holds up the
//! controller; each run gets
//! [`Notifier::timeout`] (default 30 s) before it is killed. A notifier that cannot start,
//! exits non-zero or times out is reported as a `tracing` warning (on stderr in the
//! `puzzletron` command line) and counted in [`Notifier::failures`], and otherwise ignored:
//! notifications never stop a campaign.
//!
//! The JSON object ([`NotifyEvent`]): `{"event": "stage_done" | "stage_failed" |
//! "campaign_end" | "attempt_hung" | "decision_needed", "campaign": "<dir>", "stage": "<id>" |
//! null, "message": "...", "at_ms": <ms since epoch>, "detail": {...}}` (`detail` of
//! `campaign_end`: `complete`, `detached`, stage counts; of `decision_needed`: `file`, the
//! decision file to write, and `candidates`).

use crate::executor::now_ms;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::campaign::controller::{CampaignReport, ControllerEvent, EventSubscriber};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One notification.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NotifyEvent {
    /// `stage_done`, `stage_failed`, `campaign_end`, `attempt_hung` or `decision_needed`.
    pub event: String,
    /// The campaign folder.
    pub campaign: PathBuf,
    /// The stage, for stage events.
    pub stage: Option<String>,
    /// Human text.
    pub message: String,
    /// When (ms since the Unix epoch).
    pub at_ms: u64,
    /// Event-specific data.
    pub detail: serde_json::Value,
}

impl NotifyEvent {
    /// Notification `event` about `campaign` saying `message`, sent now: no stage, no detail
    /// (`null`). Set the others with the `with_*` methods.
    pub fn new(
        event: impl Into<String>,
        campaign: impl Into<PathBuf>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            event: event.into(),
            campaign: campaign.into(),
            stage: None,
            message: message.into(),
            at_ms: now_ms(),
            detail: serde_json::Value::Null,
        }
    }

    /// Sets the stage.
    pub fn with_stage(mut self, stage: impl Into<String>) -> Self {
        self.stage = Some(stage.into());
        self
    }

    /// Sets the time (ms since the Unix epoch).
    pub fn with_at_ms(mut self, at_ms: u64) -> Self {
        self.at_ms = at_ms;
        self
    }

    /// Sets the event-specific data.
    pub fn with_detail(mut self, detail: serde_json::Value) -> Self {
        self.detail = detail;
        self
    }

    /// The notification for a controller event: [`StageDone`](ControllerEvent::StageDone) ->
    /// `stage_done`, [`StageFailed`](ControllerEvent::StageFailed) -> `stage_failed`,
    /// [`AttemptStuck`](ControllerEvent::AttemptStuck) -> `attempt_hung`,
    /// [`DecisionNeeded`](ControllerEvent::DecisionNeeded) -> `decision_needed` (a person must
    /// choose; `detail.file` is the decision file); `None` for the others. `detail` is the event's own JSON form.
    pub fn from_event(campaign: &Path, ev: &ControllerEvent) -> Option<Self> {
        let (event, stage) = match ev {
            ControllerEvent::StageDone { stage } => ("stage_done", Some(stage.clone())),
            ControllerEvent::StageFailed { stage, .. } => ("stage_failed", Some(stage.clone())),
            ControllerEvent::AttemptStuck { .. } => ("attempt_hung", None),
            ControllerEvent::DecisionNeeded { stage, .. } => {
                ("decision_needed", Some(stage.clone()))
            }
            _ => return None,
        };
        Some(NotifyEvent {
            event: event.to_string(),
            campaign: campaign.to_path_buf(),
            stage,
            message: ev.to_string(),
            at_ms: now_ms(),
            detail: serde_json::to_value(ev).unwrap_or(serde_json::Value::Null),
        })
    }

    /// The `campaign_end` notification for the report of a finished
    /// [`run`](crate::campaign::controller::CampaignController::run).
    pub fn campaign_end(campaign: &Path, report: &CampaignReport) -> Self {
        let complete = report.is_complete();
        NotifyEvent {
            event: "campaign_end".into(),
            campaign: campaign.to_path_buf(),
            stage: None,
            message: if complete {
                format!("campaign complete: {} stages", report.completed.len())
            } else {
                format!(
                    "campaign ended: {} stages done, {} failed, {} not started",
                    report.completed.len(),
                    report.failed.len(),
                    report.blocked.len()
                )
            },
            at_ms: now_ms(),
            detail: serde_json::json!({
                "complete": complete,
                "completed": report.completed,
                "failed": report.failed.iter().map(|f| &f.stage).collect::<Vec<_>>(),
                "blocked": report.blocked,
                "submitted": report.submitted,
            }),
        }
    }
}

/// Runs a command per event; see the module docs.
#[derive(Debug)]
pub struct Notifier {
    argv: Vec<String>,
    timeout: Duration,
    worker: Mutex<Option<(mpsc::Sender<Job>, JoinHandle<()>)>>,
    failures: Arc<AtomicU64>,
    sent: Arc<AtomicU64>,
}

/// Work for the notifier's thread: events run one at a time, in the order sent.
enum Job {
    Event(String, Vec<u8>),
    Flush(mpsc::Sender<()>),
}

impl Notifier {
    /// A notifier running `argv` (program and arguments; no shell).
    ///
    /// # Errors
    /// A message when `argv` is empty or its program is an empty string.
    pub fn new(argv: Vec<String>) -> Result<Self, String> {
        if argv.first().is_none_or(|p| p.is_empty()) {
            return Err(
                "the notify command is empty: expected a program and its arguments, \
                        e.g. --notify 'notify-send puzzletron'"
                    .into(),
            );
        }
        Ok(Notifier {
            argv,
            timeout: Duration::from_secs(30),
            worker: Mutex::new(None),
            failures: Arc::new(AtomicU64::new(0)),
            sent: Arc::new(AtomicU64::new(0)),
        })
    }

    /// How long one run may take before it is killed (default 30 s).
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// The command.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// Queues `event` for the notifier's thread (started on first use) and returns at once.
    /// Events are delivered one at a time, in the order sent.
    pub fn send(&self, event: &NotifyEvent) {
        let json = match serde_json::to_vec(event) {
            Ok(j) => j,
            Err(e) => {
                tracing::warn!(error = %e, "notify: the event could not be encoded");
                return;
            }
        };
        let mut w = self.worker.lock().unwrap_or_else(|p| p.into_inner());
        let (tx, _) = w.get_or_insert_with(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            let argv = self.argv.clone();
            let timeout = self.timeout;
            let (failures, sent) = (self.failures.clone(), self.sent.clone());
            let t = std::thread::spawn(move || {
                block_sigpipe();
                for job in rx {
                    match job {
                        Job::Flush(ack) => {
                            let _ = ack.send(());
                        }
                        Job::Event(name, json) => match run_once(&argv, &json, timeout) {
                            Ok(()) => {
                                sent.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => {
                                failures.fetch_add(1, Ordering::Relaxed);
                                tracing::warn!(
                                    command = ?argv[0],
                                    event = %name,
                                    error = %e,
                                    "notify command failed (the campaign goes on)"
                                );
                            }
                        },
                    }
                }
            });
            (tx, t)
        });
        let _ = tx.send(Job::Event(event.event.clone(), json));
    }

    /// Waits until every notification sent so far was delivered (each bounded by the timeout).
    pub fn flush(&self) {
        let (ack_tx, ack_rx) = mpsc::channel();
        {
            let w = self.worker.lock().unwrap_or_else(|p| p.into_inner());
            match w.as_ref() {
                Some((tx, _)) => {
                    if tx.send(Job::Flush(ack_tx)).is_err() {
                        return;
                    }
                }
                None => return,
            }
        }
        let _ = ack_rx.recv();
    }

    /// Runs that failed (could not start, non-zero exit, timeout).
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Runs that succeeded.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

/// Subscribed to a controller ([`CampaignControllerBuilder::subscribe`]), a notifier sends
/// the events [`NotifyEvent::from_event`] maps (stage done or failed, attempt hung, decision
/// needed) and ignores the others.
///
/// [`CampaignControllerBuilder::subscribe`]: crate::campaign::controller::CampaignControllerBuilder::subscribe
impl EventSubscriber for Notifier {
    fn on_event(&self, campaign: &Path, event: &ControllerEvent) {
        if let Some(e) = NotifyEvent::from_event(campaign, event) {
            self.send(&e);
        }
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        // Deliver what is queued before the process moves on.
        let w = self
            .worker
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some((tx, t)) = w {
            drop(tx);
            let _ = t.join();
        }
    }
}

/// Blocks SIGPIPE for the calling thread. The `puzzletron` binary restores SIGPIPE's default
/// action (so that `puzzletron ... | head` ends quietly), and a notifier that exits without
/// reading all of its stdin would then kill the whole process, campaign controller included, on
/// the next write to it. SIGPIPE goes to the thread that wrote (signal(7)): blocked here, it
/// stays pending on this thread and the write fails with `EPIPE`, which `run_once` ignores. The
/// children this thread starts get the default mask back (`Command` resets it).
fn block_sigpipe() {
    // SAFETY: `set` is a local signal set initialised by `sigemptyset` before use; the calls
    // change only this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

fn run_once(argv: &[String], json: &[u8], timeout: Duration) -> Result<(), String> {
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start it: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A notifier that does not read its stdin is fine: ignore EPIPE.
        let _ = stdin.write_all(json).and_then(|_| stdin.write_all(b"\n"));
    }
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(st)) if st.success() => return Ok(()),
            Ok(Some(st)) => return Err(format!("it ended with {st}")),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("killed after {} s", timeout.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("waiting for it: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_events_notify_with_their_file() {
        let c = Path::new("/c");
        let needed = ControllerEvent::DecisionNeeded {
            stage: "post.f.pick".into(),
            file: PathBuf::from("/c/decisions/post.f.pick.txt"),
            candidates: vec!["post.f.eval:0".into(), "post.f.eval:1".into()],
        };
        let n = NotifyEvent::from_event(c, &needed).unwrap();
        assert_eq!(n.event, "decision_needed");
        assert_eq!(n.stage.as_deref(), Some("post.f.pick"));
        assert_eq!(n.detail["file"], "/c/decisions/post.f.pick.txt");
        let made = ControllerEvent::DecisionMade {
            stage: "post.f.pick".into(),
            chosen: vec![],
            skipped: vec!["post.f.mat".into()],
        };
        assert!(NotifyEvent::from_event(c, &made).is_none());
    }

    #[test]
    fn controller_events_map_to_notifications() {
        let c = Path::new("/c");
        let e = NotifyEvent::from_event(
            c,
            &ControllerEvent::StageFailed {
                stage: "score".into(),
                reason: "oom".into(),
            },
        )
        .unwrap();
        assert_eq!(
            (e.event.as_str(), e.stage.as_deref()),
            ("stage_failed", Some("score"))
        );
        assert_eq!(e.detail["kind"], "stage_failed");
        let e = NotifyEvent::from_event(c, &ControllerEvent::StageDone { stage: "p".into() });
        assert_eq!(e.unwrap().event, "stage_done");
        let hung = ControllerEvent::AttemptStuck {
            attempt_id: crate::executor::AttemptId::new("n.a.0.a1").unwrap(),
            reason: "no progress for 600 s".into(),
        };
        assert_eq!(
            NotifyEvent::from_event(c, &hung).unwrap().event,
            "attempt_hung"
        );
        let detached = ControllerEvent::Detached { live: 1 };
        assert!(NotifyEvent::from_event(c, &detached).is_none());
    }

    #[test]
    fn the_command_gets_the_json_and_failures_are_counted_not_raised() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("got.json");
        let n = Notifier::new(vec![
            "sh".into(),
            "-c".into(),
            "cat > \"$0\"".into(),
            out.display().to_string(),
        ])
        .unwrap();
        let ev = NotifyEvent::from_event(
            dir.path(),
            &ControllerEvent::StageDone {
                stage: "prepare".into(),
            },
        )
        .unwrap();
        n.send(&ev);
        n.flush();
        let got: NotifyEvent =
            serde_json::from_str(std::fs::read_to_string(&out).unwrap().trim()).unwrap();
        assert_eq!(got, ev);
        assert_eq!((n.sent(), n.failures()), (1, 0));

        let bad = Notifier::new(vec!["false".into()]).unwrap();
        bad.send(&ev);
        let missing = Notifier::new(vec!["/nonexistent/notifier".into()]).unwrap();
        missing.send(&ev);
        let slow = Notifier::new(vec!["sleep".into(), "30".into()])
            .unwrap()
            .timeout(Duration::from_millis(200));
        let t = Instant::now();
        slow.send(&ev);
        bad.flush();
        missing.flush();
        slow.flush();
        assert!(t.elapsed() < Duration::from_secs(10));
        assert_eq!(
            (bad.failures(), missing.failures(), slow.failures()),
            (1, 1, 1)
        );
        assert!(Notifier::new(vec![]).is_err());
    }
}
