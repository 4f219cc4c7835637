//! [`CampaignController`]: the loop that turns a [`CampaignPlan`] into finished stages.
//!
//! One iteration: check the lease and control requests; resolve intents left by a crash;
//! start what is ready (intents journaled and synced *before* the submits, handles right
//! after); poll every live attempt in one call; classify what ended and decide by policy;
//! advance stages (aggregate steps, pool queues) and apply the halt policy; then wait, with the
//! poll interval growing while nothing changes.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::builder::CampaignControllerBuilder;
use super::clock::Clock;
use super::error::ControllerError;
use super::event::ControllerEvent;
use super::journal::{Entry, JOURNAL_FORMAT, Journal};
use super::lease::Lease;
use super::policy::{Decision, RetryPolicy};
use super::pool::{PoolItem, WorkQueue};
use super::report::{CampaignReport, StageFailure, StageProgress};
use super::spec::queue_dir;
use super::state::{Phase, StageStatus, State, UnitStatus};
use super::step::Action;
use crate::campaign::CampaignPlan;
use crate::executor::{AttemptId, Executor};
use crate::identity::Hash;

/// What a user (terminal menu, signal) asks the controller to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Control {
    /// Cancel every live job and stop.
    Cancel,
    /// Stop now and leave jobs running; the next `run` re-attaches.
    Detach,
    /// Nothing (the menu was dismissed).
    Continue,
}

/// A sender of [`Control`] requests to a running controller (from [`TerminalControls`],
/// signal handlers, or your own UI).
///
/// [`TerminalControls`]: super::TerminalControls
pub type ControlSender = mpsc::UnboundedSender<Control>;

pub(super) type PoolSource = dyn Fn(&Path) -> Result<Vec<PoolItem>, String> + Send + Sync;
pub(super) type EventSink = dyn Fn(&ControllerEvent) + Send + Sync;

/// Options of one [`CampaignController::run`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunOptions {
    /// One iteration, then return (jobs keep running; `detached` in the report).
    pub once: bool,
    /// Stop after this many iterations (jobs keep running).
    pub max_iterations: Option<u64>,
    /// Give units that failed in an earlier run fresh budgets and run them again (in place:
    /// finished units stay finished; stages blocked by them open again).
    pub retry_failed: bool,
    /// Who asks for [`retry_failed`](Self::retry_failed), journaled with it (e.g.
    /// `` `puzzletron campaign retry` (user ana on h1, pid 42) ``).
    pub retry_by: Option<String>,
}

impl RunOptions {
    /// Sets [`once`](Self::once).
    pub fn with_once(mut self, once: bool) -> Self {
        self.once = once;
        self
    }

    /// Sets [`max_iterations`](Self::max_iterations).
    pub fn with_max_iterations(mut self, max_iterations: Option<u64>) -> Self {
        self.max_iterations = max_iterations;
        self
    }

    /// Sets [`retry_failed`](Self::retry_failed).
    pub fn with_retry_failed(mut self, retry_failed: bool) -> Self {
        self.retry_failed = retry_failed;
        self
    }

    /// Sets [`retry_by`](Self::retry_by).
    pub fn with_retry_by(mut self, retry_by: Option<String>) -> Self {
        self.retry_by = retry_by;
        self
    }
}

/// The campaign controller (`docs/design.md`, "Campaigns": Controller). Build with
/// [`CampaignController::builder`].
pub struct CampaignController {
    pub(super) plan: CampaignPlan,
    pub(super) dir: PathBuf,
    pub(super) settings: Settings,
    pub(super) io: Collaborators,
    pub(super) counters: Counters,
    pub(super) state: State,
    pub(super) own_uid: u32,
    pub(super) halted: bool,
    pub(super) pending_revision: Option<Hash>,
    pub(super) started: bool,
    pub(super) recovery_reported: bool,
    /// A Detach or Cancel that arrived while an executor call was awaited (see `guarded`).
    pub(super) interrupt: Option<Control>,
    /// The uid of the scheduler's own user (SlurmUser), asked once per process.
    pub(super) scheduler_uid: Option<u32>,
    pub(super) scheduler_uid_asked: bool,
}

/// What ended a [`CampaignController::guarded`] wait.
enum Woke<T> {
    Done(T),
    Control(Option<Control>),
    Slow,
}

/// The options the builder fixed; never changed by a run.
pub(super) struct Settings {
    pub poll_min: Duration,
    pub poll_max: Duration,
    pub retry: RetryPolicy,
    pub new_revision: bool,
    pub adopt_grace: Duration,
    pub stuck_after: Duration,
    pub max_live: Option<usize>,
    pub poll_batch: usize,
    pub submit_batch: usize,
    pub oom_retry: HashSet<String>,
    pub max_requeues: u32,
    pub abort_after_submits: Option<u64>,
    pub require_success_marker: bool,
    pub pools: HashMap<String, Arc<PoolSource>>,
    /// Heartbeat timeouts set through the builder, by stage id (over the plan's).
    pub heartbeat: HashMap<String, Duration>,
    /// Distinct units that failed fast on a node before it is excluded; `None`: never.
    pub exclude_node_after: Option<u32>,
    /// A failure before the start mark this soon after the start is the infrastructure's.
    pub fast_failure_window: Duration,
    /// How long an output `stat` does not see is looked for again.
    pub visibility_wait: Duration,
    /// Test hook hiding outputs from the visibility probes.
    pub visibility_hook: Option<Arc<super::finalise::VisibilityHook>>,
    /// Asks a person for manual decisions (a terminal); `None`: the decision file only.
    pub prompt: Option<Arc<dyn super::controls::DecisionPrompt>>,
}

/// What the controller talks to: the executor, the clock, the journal and lease, observers.
pub(super) struct Collaborators {
    pub executor: Arc<dyn Executor>,
    pub clock: Arc<dyn Clock>,
    pub on_event: Option<Arc<EventSink>>,
    pub controls: Option<mpsc::UnboundedReceiver<Control>>,
    pub view: super::view::LiveView,
    pub journal: Journal,
    pub lease: Lease,
}

/// Counters of this controller process (for the report and the recovery message).
#[derive(Default)]
pub(super) struct Counters {
    pub reattached: usize,
    pub adopted: u64,
    pub submitted: u64,
    pub poll_errors: u64,
    pub poll_errors_in_row: u64,
    /// Attempts whose last poll said "accounting pending" (N02).
    pub accounting_pending: usize,
    pub pool_restarts: HashMap<usize, (u32, usize)>,
    pub submits_this_process: u64,
    /// Decision stages whose prompt got no answer (end of input): not asked again.
    pub prompt_declined: HashSet<String>,
    /// The last invalid-decision-file message reported per stage (reported once).
    pub decision_errors: HashMap<String, String>,
}

impl std::fmt::Debug for CampaignController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CampaignController")
            .field("campaign_dir", &self.dir)
            .field("executor", &self.io.executor.kind())
            .field("stages", &self.state.stages.len())
            .field("live", &self.state.live)
            .finish()
    }
}

enum Flow {
    Continue { progressed: bool },
    Finished,
    Detached,
    Cancelled(usize),
}

impl CampaignController {
    /// A builder.
    pub fn builder() -> CampaignControllerBuilder {
        CampaignControllerBuilder::default()
    }

    /// The campaign folder.
    pub fn campaign_dir(&self) -> &Path {
        &self.dir
    }

    /// The campaign's tag: the nonce that starts every attempt id (and Slurm job name) of
    /// this campaign folder, for [`cancel_campaign`](super::cancel_campaign).
    pub fn tag(&self) -> &str {
        &self.state.nonce
    }

    /// The journal file.
    pub fn journal_path(&self) -> &Path {
        self.io.journal.path()
    }

    /// The work queue of a persistent-pool stage.
    pub fn queue(&self, stage: &str) -> WorkQueue {
        WorkQueue::new(queue_dir(&self.dir, stage))
    }

    /// The attempt ids submitted so far (in order), for audits such as "no attempt id has two
    /// jobs".
    pub fn attempt_ids(&self) -> Vec<AttemptId> {
        self.state
            .attempts
            .iter()
            .filter(|a| matches!(a.phase, Phase::Live | Phase::Finished))
            .map(|a| a.id.clone())
            .collect()
    }

    /// The attempt ids live now (submitted, not finished).
    pub fn live_attempt_ids(&self) -> Vec<AttemptId> {
        self.state
            .live_attempts()
            .into_iter()
            .map(|a| self.state.attempts[a].id.clone())
            .collect()
    }

    pub(super) fn record(&mut self, entries: Vec<Entry>) -> Result<(), ControllerError> {
        let now = self.io.clock.now_ms();
        self.io.journal.append(entries.iter().cloned(), now)?;
        for e in &entries {
            self.state
                .apply(e, &self.plan, now)
                .map_err(|reason| ControllerError::Corrupt {
                    path: self.io.journal.path().to_path_buf(),
                    line: self.io.journal.len() as usize,
                    reason,
                })?;
        }
        Ok(())
    }

    /// Performs the actions of a pure step ([`super::step`]), in order.
    pub(super) fn perform(&mut self, actions: Vec<Action>) -> Result<(), ControllerError> {
        for a in actions {
            match a {
                Action::Notify(ev) => self.notify(&ev),
                Action::Emit(ev) => self.emit(ev)?,
                Action::Journal(entries) => self.record(entries)?,
                Action::MakeDecisionDir(dir) => std::fs::create_dir_all(&dir)
                    .map_err(|e| ControllerError::io("creating", &dir, e))?,
                Action::WriteSelection { stage, body } => {
                    let path = super::spec::selection_file(&self.dir, &stage);
                    if let Some(parent) = path.parent() {
                        std::fs::create_dir_all(parent)
                            .map_err(|e| ControllerError::io("creating", parent, e))?;
                    }
                    let mut bytes = serde_json::to_vec_pretty(&body).unwrap_or_default();
                    bytes.push(b'\n');
                    crate::fsutil::atomic_write(&path, &bytes)
                        .map_err(|e| ControllerError::io("writing", &path, e))?;
                }
            }
        }
        Ok(())
    }

    /// Tells the observer and journals the event.
    pub(super) fn emit(&mut self, ev: ControllerEvent) -> Result<(), ControllerError> {
        self.notify(&ev);
        self.record(vec![Entry::from_event(&ev)])
    }

    /// Tells the observer only (the caller journals the entry with others).
    pub(super) fn notify(&self, ev: &ControllerEvent) {
        // Every decision, submit, end and alert of the controller, for a tracing subscriber.
        tracing::info!(target: "puzzletron::campaign", kind = ev.kind(), "{ev}");
        if let Some(f) = &self.io.on_event {
            f(ev);
        }
    }

    pub(super) fn check_contract(&mut self) -> Result<(), ControllerError> {
        let new = self.plan.contract_hash;
        match self.state.contract {
            None => {
                let nonce = Hash::of(format!(
                    "{:?}/{}",
                    crate::store::Owner::current(),
                    self.io.clock.now_ms()
                ))
                .to_hex()[..6]
                    .to_string();
                self.write_plan()?;
                self.record(vec![Entry::Header {
                    format: JOURNAL_FORMAT,
                    nonce,
                    contract_hash: new,
                }])
            }
            Some(old) if old == new => Ok(()),
            Some(old) if self.settings.new_revision => {
                // Done at the start of `run` (cancelling needs the executor).
                self.pending_revision = Some(old);
                Ok(())
            }
            Some(old) => Err(ControllerError::ContractChanged {
                campaign: self.dir.clone(),
                // N10: name what changed, from the plan the campaign was started with.
                reasons: std::fs::read(self.dir.join("controller").join("plan.json"))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<CampaignPlan>(&b).ok())
                    .map(|p| crate::campaign::contract_changes(&p, &self.plan))
                    .unwrap_or_default(),
                old,
                new,
            }),
        }
    }

    fn write_plan(&self) -> Result<(), ControllerError> {
        let p = self.dir.join("controller").join("plan.json");
        write_json_streaming(&p, &self.plan)?;
        let cfg = self.dir.join(crate::campaign::dryrun::RESOLVED_CONFIG_FILE);
        if let Some(parent) = cfg.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| ControllerError::io("creating", parent, e))?;
        }
        write_json_streaming(&cfg, &self.plan.resolved_config)
    }

    /// Runs the campaign until every stage is done or failed (or until `options` say stop, a
    /// control request arrives, or the halt policy stops it), and reports.
    ///
    /// # Overrides
    /// `run` takes no config overrides, unlike the Python reference's `run(seed)`, on purpose:
    /// overrides are applied when the plan is compiled ([`compile_campaign_plan`]'s
    /// `&[Override]`, the CLI's `--override`), so the plan this controller holds, and its
    /// [`contract_hash`], already include them. Running again with other overrides means
    /// compiling another plan and building a controller on the same folder: its contract hash
    /// is compared with the journal's, and a difference is refused
    /// ([`ControllerError::ContractChanged`]) unless the builder set `new_revision(true)`, which
    /// cancels the old revision's live jobs and starts over. That is the reference's
    /// "re-compile with the seed's overrides and check the contract", done once at build time
    /// instead of inside `run`, so a plan can never change under a running controller.
    ///
    /// [`compile_campaign_plan`]: crate::campaign::compile_campaign_plan
    /// [`contract_hash`]: crate::campaign::contract_hash
    ///
    /// # Errors
    /// [`ControllerError::LeaseLost`], journal and queue I/O errors, executor errors that are
    /// not retryable. Job failures are in the report, not errors.
    pub async fn run(&mut self, options: RunOptions) -> Result<CampaignReport, ControllerError> {
        use tracing::Instrument;
        let span = tracing::info_span!(
            "campaign",
            journal = %self.io.journal.path().display()
        );
        self.run_inner(options).instrument(span).await
    }

    async fn run_inner(&mut self, options: RunOptions) -> Result<CampaignReport, ControllerError> {
        if let Some(old) = self.pending_revision.take() {
            // Cancel what the old revision still runs (adopting intents first), then start over.
            let new = self.plan.contract_hash;
            let n = self.shutdown("new revision: the contract changed").await?;
            let rev = self.state.revision + 1;
            self.write_plan()?;
            self.record(vec![Entry::Revision {
                revision: rev,
                contract_hash: new,
            }])?;
            self.emit(ControllerEvent::Revision {
                old,
                new,
                revision: rev,
                cancelled: n,
            })?;
        }
        if options.retry_failed {
            self.reset_failed(options.retry_by.as_deref().unwrap_or_default())?;
        }
        if !self.scheduler_uid_asked {
            // Asked once per process (a preemption is a cancel by this uid); an error only
            // loses that distinction for root's cancels, so it is not fatal.
            let exec = self.io.executor.clone();
            if let Some(Ok(u)) = self.guarded("scheduler_uid", exec.scheduler_uid()).await? {
                self.scheduler_uid = u;
                self.scheduler_uid_asked = true;
            }
        }
        // Recovery is reported once per controller (later runs continue the same session).
        if !self.started {
            self.started = true;
            self.counters.reattached = self.state.live;
        }
        if !self.recovery_reported
            && (self.counters.reattached > 0 || !self.state.unresolved_intents().is_empty())
        {
            self.recovery_reported = true;
            self.emit(ControllerEvent::Recovered {
                reattached: self.counters.reattached,
                unresolved_intents: self.state.unresolved_intents().len(),
            })?;
        }
        let mut iterations = 0u64;
        let mut interval = self.settings.poll_min;
        let outcome = loop {
            iterations += 1;
            let flow = self.iterate().await?;
            self.io
                .view
                .update(&self.progress(), self.io.clock.now_ms());
            match flow {
                Flow::Finished => break Flow::Finished,
                Flow::Detached | Flow::Cancelled(_) => break flow,
                Flow::Continue { progressed } => {
                    if options.once || options.max_iterations.is_some_and(|m| iterations >= m) {
                        break Flow::Detached;
                    }
                    interval = if progressed {
                        self.settings.poll_min
                    } else {
                        interval.mul_f64(1.5).min(self.settings.poll_max)
                    };
                    if let Some(c) = self.wait(interval).await {
                        match c {
                            Control::Cancel => {
                                let n = self.shutdown(&self.user_cancel_reason()).await?;
                                break Flow::Cancelled(n);
                            }
                            Control::Detach => break Flow::Detached,
                            Control::Continue => {}
                        }
                    }
                }
            }
        };
        let (detached, cancelled) = match outcome {
            Flow::Detached => {
                self.emit(ControllerEvent::Detached {
                    live: self.state.live,
                })?;
                (true, 0)
            }
            Flow::Cancelled(n) => (false, n),
            _ => (false, 0),
        };
        let mut report = self.report(iterations, detached, cancelled);
        if matches!(outcome, Flow::Cancelled(_)) {
            for p in &mut report.stages {
                if !matches!(p.status.as_str(), "done" | "failed" | "skipped") {
                    p.state = "cancelled".into();
                }
            }
        }
        self.io.view.finish(&report);
        Ok(report)
    }

    async fn wait(&mut self, d: Duration) -> Option<Control> {
        if let Some(rx) = &mut self.io.controls {
            if let Ok(c) = rx.try_recv() {
                return Some(c);
            }
            // Biased: a control that is already queued wins over a sleep that is ready at once
            // (a virtual clock's), so the outcome never depends on the clock's kind.
            let clock = self.io.clock.clone();
            return tokio::select! {
                biased;
                c = rx.recv() => c,
                _ = clock.sleep(d) => None,
            };
        }
        self.io.clock.sleep(d).await;
        None
    }

    async fn iterate(&mut self) -> Result<Flow, ControllerError> {
        self.io.lease.check()?;
        if let Some(rx) = &mut self.io.controls
            && let Ok(c) = rx.try_recv()
        {
            match c {
                Control::Cancel => {
                    let n = self.shutdown(&self.user_cancel_reason()).await?;
                    return Ok(Flow::Cancelled(n));
                }
                Control::Detach => return Ok(Flow::Detached),
                Control::Continue => {}
            }
        }
        let mut progressed = self.resolve_intents().await?;
        if let Some(flow) = self.take_interrupt().await? {
            return Ok(flow);
        }
        progressed |= self.advance_stages().await?;
        progressed |= self.start_ready().await?;
        if let Some(flow) = self.take_interrupt().await? {
            return Ok(flow);
        }
        progressed |= self.poll_live().await?;
        if let Some(flow) = self.take_interrupt().await? {
            return Ok(flow);
        }
        progressed |= self.advance_stages().await?;
        progressed |= self.advance_decisions()?;
        if super::step::finished(&self.state, self.halted) {
            return Ok(Flow::Finished);
        }
        Ok(Flow::Continue { progressed })
    }

    /// Acts on a control request that interrupted an executor call.
    async fn take_interrupt(&mut self) -> Result<Option<Flow>, ControllerError> {
        match self.interrupt.take() {
            Some(Control::Cancel) => {
                let n = self.shutdown(&self.user_cancel_reason()).await?;
                Ok(Some(Flow::Cancelled(n)))
            }
            Some(Control::Detach) => Ok(Some(Flow::Detached)),
            Some(Control::Continue) | None => Ok(None),
        }
    }

    /// Awaits an executor call (`call` names it, e.g. `poll`), while watching the control
    /// channel and the time: a Detach or Cancel stops the wait at once (the call is dropped;
    /// `None` is returned and the request is acted on by the loop — a submit cut off this way
    /// is resolved by its journaled intent), and a call that takes longer than one poll
    /// interval (at least 1 s) is shown in the live view and journaled once as
    /// [`ControllerEvent::SchedulerSlow`], so a scheduler that does not answer is never silent.
    pub(super) async fn guarded<T>(
        &mut self,
        call: &str,
        fut: impl std::future::Future<Output = T>,
    ) -> Result<Option<T>, ControllerError> {
        if self.interrupt.is_some() {
            return Ok(None);
        }
        tokio::pin!(fut);
        let slow_after = self.settings.poll_min.max(Duration::from_secs(1));
        let started = std::time::Instant::now();
        let mut slow = false;
        loop {
            let tick = tokio::time::sleep(if slow {
                Duration::from_secs(1)
            } else {
                slow_after
            });
            let woke = {
                let controls = self.io.controls.as_mut();
                tokio::select! {
                    biased;
                    r = &mut fut => Woke::Done(r),
                    c = async {
                        match controls {
                            Some(rx) => rx.recv().await,
                            None => std::future::pending().await,
                        }
                    } => Woke::Control(c),
                    _ = tick => Woke::Slow,
                }
            };
            match woke {
                Woke::Done(r) => {
                    if slow {
                        self.io.view.scheduler_error(None);
                    }
                    return Ok(Some(r));
                }
                Woke::Control(Some(Control::Continue)) => {}
                Woke::Control(Some(c)) => {
                    self.interrupt = Some(c);
                    return Ok(None);
                }
                // Every sender is gone: nobody can ask any more.
                Woke::Control(None) => self.io.controls = None,
                Woke::Slow => {
                    let waited = started.elapsed();
                    self.io.view.scheduler_error(Some(format!(
                        "waiting for the scheduler ({call}) for {:.0} s",
                        waited.as_secs_f64()
                    )));
                    self.io
                        .view
                        .update(&self.progress(), self.io.clock.now_ms());
                    if !slow {
                        slow = true;
                        self.emit(ControllerEvent::SchedulerSlow {
                            call: call.to_string(),
                            waited,
                        })?;
                    }
                }
            }
        }
    }

    pub(super) fn blocked(&self, s: &super::state::StageRt) -> bool {
        super::step::blocked(&self.state, s)
    }

    /// Whether `s` is a manual decision stage whose parents are done and that waits for a
    /// person.
    pub(super) fn awaits_decision(&self, s: &super::state::StageRt) -> bool {
        super::step::awaits_decision(&self.state, s)
    }

    /// Per-stage progress (for the live view and reports).
    pub fn progress(&self) -> Vec<StageProgress> {
        self.state
            .stages
            .iter()
            .map(|s| {
                let mut p = StageProgress {
                    stage: s.id.clone(),
                    status: match s.status {
                        StageStatus::Done => "done",
                        StageStatus::Failed => "failed",
                        StageStatus::Skipped => "skipped",
                        StageStatus::Open if self.blocked(s) => "blocked",
                        StageStatus::Open if self.awaits_decision(s) => "decision",
                        StageStatus::Open if s.started_ms.is_some() => "running",
                        StageStatus::Open => "waiting",
                    }
                    .to_string(),
                    state: String::new(),
                    total: s.units.len() + s.agg.iter().count(),
                    done: 0,
                    running: 0,
                    queued: 0,
                    failed: 0,
                    started_ms: s.started_ms,
                    ended_ms: s.ended_ms,
                };
                for &u in s.units.iter().chain(s.agg.iter()) {
                    let unit = &self.state.units[u];
                    match unit.status {
                        UnitStatus::Done => p.done += 1,
                        UnitStatus::Failed => p.failed += 1,
                        UnitStatus::Live => {
                            let pending = unit.attempts.last().is_some_and(|&a| {
                                matches!(self.state.attempts[a].phase, Phase::Intent { .. })
                            });
                            if pending {
                                p.queued += 1
                            } else {
                                p.running += 1
                            }
                        }
                        UnitStatus::Ready => p.queued += 1,
                    }
                }
                p.state = match p.status.as_str() {
                    "blocked" => match self.blocked_by(s) {
                        Some(b) => format!("blocked by {b}"),
                        None => "blocked".into(),
                    },
                    "decision" => "waiting for a decision".into(),
                    "running" if p.running == 0 => {
                        self.backoff_of(s).unwrap_or_else(|| "running".into())
                    }
                    other => other.to_string(),
                };
                p
            })
            .collect()
    }

    /// The failed stage upstream of a blocked stage `s`.
    fn blocked_by(&self, s: &super::state::StageRt) -> Option<String> {
        s.parents.iter().find_map(|&p| {
            let ps = &self.state.stages[p];
            if ps.status == StageStatus::Failed {
                Some(ps.id.clone())
            } else if ps.status == StageStatus::Open && self.blocked(ps) {
                self.blocked_by(ps)
            } else {
                None
            }
        })
    }

    /// `backing off until HH:MM:SS UTC (attempt n, class)` for the stage's unit whose retry
    /// comes first, when a unit waits for one.
    fn backoff_of(&self, s: &super::state::StageRt) -> Option<String> {
        let now = self.io.clock.now_ms();
        s.units
            .iter()
            .chain(s.agg.iter())
            .map(|&u| &self.state.units[u])
            .filter(|u| u.status == UnitStatus::Ready && u.not_before_ms > now)
            .min_by_key(|u| u.not_before_ms)
            .map(|u| {
                format!(
                    "backing off until {} (attempt {}, {})",
                    crate::sys::clock_text(u.not_before_ms),
                    u.attempts.len() + 1,
                    u.last_class.map_or("failed", |c| c.as_str())
                )
            })
    }

    fn report(&self, iterations: u64, detached: bool, cancelled: usize) -> CampaignReport {
        let mut r = CampaignReport {
            iterations,
            detached,
            cancelled,
            halted: self.halted,
            submitted: self.counters.submitted,
            adopted: self.counters.adopted,
            reattached: self.counters.reattached,
            live: self.state.live,
            stages: self.progress(),
            ..CampaignReport::default()
        };
        for s in &self.state.stages {
            match s.status {
                StageStatus::Done => r.completed.push(s.id.clone()),
                StageStatus::Failed => {
                    let mut logs = Vec::new();
                    let mut class = None;
                    for &u in s.units.iter().chain(s.agg.iter()) {
                        let unit = &self.state.units[u];
                        if unit.status == UnitStatus::Failed {
                            class = class.or(unit.last_class);
                            if let Some(&a) = unit.attempts.last()
                                && let Some(p) = &self.state.attempts[a].log_path
                            {
                                logs.push(p.clone());
                            }
                        }
                    }
                    r.failed.push(StageFailure {
                        stage: s.id.clone(),
                        reason: s.reason.clone().unwrap_or_default(),
                        class,
                        logs,
                    });
                }
                StageStatus::Skipped => r.skipped.push(s.id.clone()),
                StageStatus::Open if self.blocked(s) => r.blocked.push(s.id.clone()),
                StageStatus::Open => {
                    if self.awaits_decision(s) {
                        r.decisions.push(super::report::PendingDecision {
                            stage: s.id.clone(),
                            file: super::spec::decision_file(&self.dir, &s.id),
                            candidates: self
                                .plan
                                .stage(&s.id)
                                .and_then(|p| p.decision.as_ref())
                                .map(|d| d.candidates.clone())
                                .unwrap_or_default(),
                        });
                    }
                    r.unfinished.push(s.id.clone())
                }
            }
        }
        r
    }
}

/// Like [`atomic_write`](crate::fsutil::atomic_write) (temp file, fsync, rename, fsync of the
/// folder) but streams the JSON, so a plan of 100k work items is never held as one buffer.
fn write_json_streaming<T: serde::Serialize>(path: &Path, v: &T) -> Result<(), ControllerError> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        let mut w = std::io::BufWriter::with_capacity(1 << 16, f);
        serde_json::to_writer(&mut w, v).map_err(std::io::Error::other)?;
        w.flush()?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)?;
        crate::fsutil::sync_dir(dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(|e| ControllerError::io("writing", path, e))
}

pub(super) fn describe(d: &Decision) -> String {
    match d {
        Decision::Done => "done".into(),
        Decision::Retry {
            delay,
            resume,
            more_resources,
        } => format!(
            "retry in {:.1} s{}{}",
            delay.as_secs_f64(),
            if *resume { " with resume" } else { "" },
            if *more_resources {
                " with more resources"
            } else {
                ""
            }
        ),
        Decision::Fail { reason } => format!("failed ({reason})"),
    }
}
