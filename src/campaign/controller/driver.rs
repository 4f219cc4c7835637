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
use super::classify::{Evidence, FailureClass, PendingVerdict, classify, pending_verdict};
use super::clock::Clock;
use super::error::ControllerError;
use super::event::ControllerEvent;
use super::journal::{Entry, JOURNAL_FORMAT, Journal};
use super::lease::Lease;
use super::policy::{Decision, RetryPolicy, UnitHistory, decide};
use super::pool::{PoolItem, WorkQueue};
use super::report::{CampaignReport, StageFailure, StageProgress};
use super::spec::{self, SUCCESS_MARKER, UnitSpec, output_dir, queue_dir};
use super::state::{Phase, StageStatus, State, UnitStatus};
use crate::campaign::{CampaignPlan, HaltPolicy};
use crate::executor::{AttemptId, Executor, ExecutorError, JobState, JobStatus};
use crate::identity::Hash;

/// What a user (terminal menu, signal) asks the controller to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
pub struct RunOptions {
    /// One iteration, then return (jobs keep running; `detached` in the report).
    pub once: bool,
    /// Stop after this many iterations (jobs keep running).
    pub max_iterations: Option<u64>,
    /// Give units that failed in an earlier run fresh budgets and run them again.
    pub retry_failed: bool,
}

/// The campaign controller (DESIGN.md §6). Build with [`CampaignController::builder`].
pub struct CampaignController {
    pub(super) plan: CampaignPlan,
    pub(super) executor: Arc<dyn Executor>,
    pub(super) dir: PathBuf,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) poll_min: Duration,
    pub(super) poll_max: Duration,
    pub(super) retry: RetryPolicy,
    pub(super) new_revision: bool,
    pub(super) adopt_grace: Duration,
    pub(super) stuck_after: Duration,
    pub(super) max_live: Option<usize>,
    pub(super) poll_batch: usize,
    pub(super) submit_batch: usize,
    pub(super) oom_retry: HashSet<String>,
    pub(super) pools: HashMap<String, Arc<PoolSource>>,
    pub(super) max_requeues: u32,
    pub(super) on_event: Option<Arc<EventSink>>,
    pub(super) controls: Option<mpsc::UnboundedReceiver<Control>>,
    pub(super) view: super::view::LiveView,
    pub(super) journal: Journal,
    pub(super) state: State,
    pub(super) lease: Lease,
    pub(super) own_uid: u32,
    pub(super) halted: bool,
    pub(super) reattached: usize,
    pub(super) adopted: u64,
    pub(super) submitted: u64,
    pub(super) poll_errors: u64,
    pub(super) poll_errors_in_row: u64,
    pub(super) pool_restarts: HashMap<usize, (u32, usize)>,
    pub(super) pending_revision: Option<Hash>,
    pub(super) started: bool,
    pub(super) recovery_reported: bool,
    pub(super) submits_this_process: u64,
    pub(super) abort_after_submits: Option<u64>,
}

impl std::fmt::Debug for CampaignController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CampaignController")
            .field("campaign_dir", &self.dir)
            .field("executor", &self.executor.kind())
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

    /// The journal file.
    pub fn journal_path(&self) -> &Path {
        self.journal.path()
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

    fn record(&mut self, entries: Vec<Entry>) -> Result<(), ControllerError> {
        let now = self.clock.now_ms();
        self.journal.append(entries.iter().cloned(), now)?;
        for e in &entries {
            self.state
                .apply(e, &self.plan, now)
                .map_err(|reason| ControllerError::Corrupt {
                    path: self.journal.path().to_path_buf(),
                    line: self.journal.len() as usize,
                    reason,
                })?;
        }
        Ok(())
    }

    /// Tells the observer and journals the event.
    pub(super) fn emit(&mut self, ev: ControllerEvent) -> Result<(), ControllerError> {
        self.notify(&ev);
        self.record(vec![Self::event_entry(&ev)])
    }

    /// Tells the observer only (the caller journals the entry with others).
    pub(super) fn notify(&self, ev: &ControllerEvent) {
        if let Some(f) = &self.on_event {
            f(ev);
        }
    }

    pub(super) fn event_entry(ev: &ControllerEvent) -> Entry {
        Entry::Event {
            kind: ev.kind().into(),
            message: ev.to_string(),
        }
    }

    pub(super) fn check_contract(&mut self) -> Result<(), ControllerError> {
        let new = self.plan.contract_hash;
        match self.state.contract {
            None => {
                let nonce = Hash::of(format!(
                    "{:?}/{}",
                    crate::store::Owner::current(),
                    self.clock.now_ms()
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
            Some(old) if self.new_revision => {
                // Done at the start of `run` (cancelling needs the executor).
                self.pending_revision = Some(old);
                Ok(())
            }
            Some(old) => Err(ControllerError::ContractChanged {
                campaign: self.dir.clone(),
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
    /// # Errors
    /// [`ControllerError::LeaseLost`], journal and queue I/O errors, executor errors that are
    /// not retryable. Job failures are in the report, not errors.
    pub async fn run(&mut self, options: RunOptions) -> Result<CampaignReport, ControllerError> {
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
            self.reset_failed()?;
        }
        // Recovery is reported once per controller (later runs continue the same session).
        if !self.started {
            self.started = true;
            self.reattached = self.state.live;
        }
        if !self.recovery_reported
            && (self.reattached > 0 || !self.state.unresolved_intents().is_empty())
        {
            self.recovery_reported = true;
            self.emit(ControllerEvent::Recovered {
                reattached: self.reattached,
                unresolved_intents: self.state.unresolved_intents().len(),
            })?;
        }
        let mut iterations = 0u64;
        let mut interval = self.poll_min;
        let outcome = loop {
            iterations += 1;
            let flow = self.iterate().await?;
            self.view.update(&self.progress(), self.clock.now_ms());
            match flow {
                Flow::Finished => break Flow::Finished,
                Flow::Detached | Flow::Cancelled(_) => break flow,
                Flow::Continue { progressed } => {
                    if options.once || options.max_iterations.is_some_and(|m| iterations >= m) {
                        break Flow::Detached;
                    }
                    interval = if progressed {
                        self.poll_min
                    } else {
                        interval.mul_f64(1.5).min(self.poll_max)
                    };
                    if let Some(c) = self.wait(interval).await {
                        match c {
                            Control::Cancel => {
                                let n = self.shutdown("cancelled by the user").await?;
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
        let report = self.report(iterations, detached, cancelled);
        self.view.finish(&report);
        Ok(report)
    }

    async fn wait(&mut self, d: Duration) -> Option<Control> {
        if let Some(rx) = &mut self.controls {
            if let Ok(c) = rx.try_recv() {
                return Some(c);
            }
            if !self.clock.is_virtual() {
                let clock = self.clock.clone();
                return tokio::select! {
                    c = rx.recv() => c,
                    _ = clock.sleep(d) => None,
                };
            }
        }
        self.clock.sleep(d).await;
        None
    }

    fn reset_failed(&mut self) -> Result<(), ControllerError> {
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

    async fn iterate(&mut self) -> Result<Flow, ControllerError> {
        self.lease.check()?;
        if let Some(rx) = &mut self.controls
            && let Ok(c) = rx.try_recv()
        {
            match c {
                Control::Cancel => {
                    let n = self.shutdown("cancelled by the user").await?;
                    return Ok(Flow::Cancelled(n));
                }
                Control::Detach => return Ok(Flow::Detached),
                Control::Continue => {}
            }
        }
        let mut progressed = self.resolve_intents().await?;
        progressed |= self.advance_stages().await?;
        progressed |= self.start_ready().await?;
        progressed |= self.poll_live().await?;
        progressed |= self.advance_stages().await?;
        let open = self
            .state
            .stages
            .iter()
            .any(|s| s.status == StageStatus::Open && !self.blocked(s));
        if self.state.live == 0
            && self.state.unresolved_intents().is_empty()
            && (!open || self.halted)
        {
            return Ok(Flow::Finished);
        }
        Ok(Flow::Continue { progressed })
    }

    fn blocked(&self, s: &super::state::StageRt) -> bool {
        s.parents.iter().any(|&p| {
            let ps = &self.state.stages[p];
            ps.status == StageStatus::Failed || (ps.status == StageStatus::Open && self.blocked(ps))
        })
    }

    /// Intents without a handle (the controller died between intent and handle): adopt the
    /// job if the executor has it, else give up on the attempt once the grace has passed.
    async fn resolve_intents(&mut self) -> Result<bool, ControllerError> {
        let mut entries = Vec::new();
        let now = self.clock.now_ms();
        for a in self.state.unresolved_intents() {
            let Phase::Intent { at_ms } = self.state.attempts[a].phase else {
                continue;
            };
            let id = self.state.attempts[a].id.clone();
            match self.executor.find(&id).await {
                Ok(Some(handle)) => {
                    self.adopted += 1;
                    entries.push(Entry::Submitted {
                        attempt_id: id,
                        handle,
                        adopted: true,
                    });
                }
                Ok(None) if now.saturating_sub(at_ms) >= self.adopt_grace.as_millis() as u64 => {
                    entries.push(Entry::SubmitFailed {
                        attempt_id: id,
                        error: "no job found for the intent after the adoption grace (the submit never happened)".into(),
                    });
                }
                Ok(None) => {}
                Err(e) if e.is_retryable() => {}
                Err(e) => return Err(e.into()),
            }
        }
        let changed = !entries.is_empty();
        self.record(entries)?;
        Ok(changed)
    }

    fn history(&self, unit: usize) -> UnitHistory {
        let u = &self.state.units[unit];
        let st = &self.plan.stages[u.stage];
        UnitHistory {
            failure_policy: st.spec.failure_policy,
            resumable: st.resumable,
            oom_retry_allowed: self.oom_retry.contains(&st.stage_id),
            max_attempts: st.spec.max_attempts.max(1),
            counted_attempts: u.counted,
            transient_failures: u.transient,
            oom_failures: u.oom,
        }
    }

    fn attempt_id_for(&self, unit: usize, n: u32) -> AttemptId {
        let u = &self.state.units[unit];
        let stage = &self.state.stages[u.stage].id;
        let leaf = u.item.map_or_else(|| "agg".to_string(), |i| i.to_string());
        let rev = if self.state.revision > 0 {
            format!("r{}", self.state.revision)
        } else {
            String::new()
        };
        AttemptId::sanitize(&format!("{}{rev}.{stage}.{leaf}.a{n}", self.state.nonce))
    }

    async fn start_ready(&mut self) -> Result<bool, ControllerError> {
        if self.halted {
            return Ok(false);
        }
        let now = self.clock.now_ms();
        let mut budget = self
            .max_live
            .map_or(usize::MAX, |m| m.saturating_sub(self.state.live))
            .min(self.submit_batch);
        let mut picks = Vec::new();
        for si in 0..self.state.stages.len() {
            let s = &self.state.stages[si];
            if s.status != StageStatus::Open
                || !s
                    .parents
                    .iter()
                    .all(|&p| self.state.stages[p].status == StageStatus::Done)
            {
                continue;
            }
            if s.units
                .iter()
                .chain(s.agg.iter())
                .any(|&u| self.state.units[u].status == UnitStatus::Failed)
            {
                continue; // a failed stage starts nothing more (its live attempts drain)
            }
            let items_done = s
                .units
                .iter()
                .all(|&u| self.state.units[u].status == UnitStatus::Done);
            let mut cands: Vec<usize> = s.units.clone();
            if items_done && let Some(a) = s.agg {
                cands.push(a);
            }
            for u in cands {
                if budget == 0 {
                    break;
                }
                let unit = &self.state.units[u];
                if unit.status == UnitStatus::Ready && unit.not_before_ms <= now {
                    picks.push(u);
                    budget -= 1;
                }
            }
        }
        if picks.is_empty() {
            return Ok(false);
        }
        // Pool queues are filled before the first worker starts.
        let mut fills = Vec::new();
        for &u in &picks {
            let si = self.state.units[u].stage;
            if self.state.stages[si].pool
                && !self.state.stages[si].pool_filled
                && !fills.contains(&si)
            {
                fills.push(si);
            }
        }
        for si in fills {
            let id = self.state.stages[si].id.clone();
            let src = self
                .pools
                .get(&id)
                .cloned()
                .ok_or_else(|| ControllerError::BadPlan {
                    stage: id.clone(),
                    reason: "no pool item source".into(),
                })?;
            let items = src(&self.dir).map_err(|reason| ControllerError::BadPlan {
                stage: id.clone(),
                reason,
            })?;
            let n = WorkQueue::new(queue_dir(&self.dir, &id)).fill(&items)?;
            self.record(vec![Entry::PoolFilled {
                stage: id,
                items: n,
            }])?;
        }
        // Intents first, durable, then the submits.
        let mut intents = Vec::with_capacity(picks.len());
        let mut specs = Vec::with_capacity(picks.len());
        for &u in &picks {
            let unit = &self.state.units[u];
            let n = unit.attempts.len() as u32 + 1;
            let id = self.attempt_id_for(u, n);
            let st = &self.plan.stages[unit.stage];
            let spec = spec::build(&UnitSpec {
                campaign: &self.dir,
                plan: &self.plan,
                stage: st,
                unit_key: &unit.key,
                item: unit.item,
                attempt_id: &id,
                attempt: n,
                resume: unit.next_resume,
                more_resources: unit.next_more_resources,
            })?;
            let out = output_dir(&self.dir, &st.stage_id, unit.item);
            std::fs::create_dir_all(&out).map_err(|e| ControllerError::io("creating", &out, e))?;
            intents.push(Entry::Intent {
                unit: unit.key.clone(),
                attempt: n,
                attempt_id: id,
                resume: unit.next_resume,
                more_resources: unit.next_more_resources,
            });
            specs.push(spec);
        }
        self.record(intents)?;
        let mut results = Vec::with_capacity(specs.len());
        for spec in &specs {
            let r = match self.executor.submit(spec).await {
                Ok(h) => Entry::Submitted {
                    attempt_id: spec.attempt_id.clone(),
                    handle: h,
                    adopted: false,
                },
                Err(e) => self.after_submit_error(spec, e).await?,
            };
            results.push(r);
            self.submits_this_process += 1;
            if self.abort_after_submits == Some(self.submits_this_process) {
                // Fault injection for crash tests: die like `kill -9` between a submit and
                // the record of its handle (the worst moment for duplicates).
                std::process::abort();
            }
        }
        let mut follow = Vec::new();
        for r in &results {
            match r {
                Entry::Submitted { .. } => self.submitted += 1,
                Entry::SubmitFailed { attempt_id, error } => {
                    let a = self.state.attempt_index[attempt_id];
                    let u = self.state.attempts[a].unit;
                    let key = self.state.units[u].key.clone();
                    let fatal = error.starts_with("fatal: ");
                    let decision = if fatal {
                        Decision::Fail {
                            reason: format!("config: {error}"),
                        }
                    } else {
                        Decision::Retry {
                            delay: self.retry.delay(1, attempt_id.as_str()),
                            resume: self.state.units[u].next_resume,
                            more_resources: self.state.units[u].next_more_resources,
                        }
                    };
                    let not_before_ms = match &decision {
                        Decision::Retry { delay, .. } => now + delay.as_millis() as u64,
                        _ => 0,
                    };
                    follow.push(Entry::Decided {
                        unit: key,
                        decision,
                        not_before_ms,
                    });
                }
                _ => {}
            }
        }
        results.extend(follow);
        self.record(results)?;
        Ok(true)
    }

    /// After a failed submit: an ambiguous or retryable error may still have created the job,
    /// so ask `find` before deciding.
    async fn after_submit_error(
        &mut self,
        spec: &crate::executor::AttemptSpec,
        e: ExecutorError,
    ) -> Result<Entry, ControllerError> {
        let id = spec.attempt_id.clone();
        let maybe_created = e.is_retryable()
            || matches!(
                e,
                ExecutorError::DuplicateAttempt { .. } | ExecutorError::SubmitUnknown { .. }
            );
        if maybe_created {
            match self.executor.find(&id).await {
                Ok(Some(h)) => {
                    self.adopted += 1;
                    return Ok(Entry::Submitted {
                        attempt_id: id,
                        handle: h,
                        adopted: true,
                    });
                }
                Ok(None) => {}
                // Cannot tell: leave the intent unresolved; `resolve_intents` asks again.
                Err(_) => {
                    let ev = ControllerEvent::SubmitUnknown {
                        attempt_id: id,
                        error: e.to_string(),
                    };
                    self.notify(&ev);
                    return Ok(Self::event_entry(&ev));
                }
            }
        }
        let fatal = !e.is_retryable() && !matches!(e, ExecutorError::SubmitUnknown { .. });
        Ok(Entry::SubmitFailed {
            attempt_id: id,
            error: if fatal {
                format!("fatal: {e}")
            } else {
                e.to_string()
            },
        })
    }

    async fn poll_live(&mut self) -> Result<bool, ControllerError> {
        let live = self.state.live_attempts();
        if live.is_empty() {
            return Ok(false);
        }
        let mut progressed = false;
        for chunk in live.chunks(self.poll_batch) {
            let handles: Vec<_> = chunk
                .iter()
                .filter_map(|&a| self.state.attempts[a].handle.clone())
                .collect();
            let statuses = match self.executor.poll(&handles).await {
                Ok(s) => s,
                Err(e) if e.is_retryable() => {
                    self.poll_errors += 1;
                    self.poll_errors_in_row += 1;
                    let n = self.poll_errors_in_row;
                    let retry_in = self
                        .poll_min
                        .mul_f64(1.5f64.powi(n.min(64) as i32))
                        .min(self.poll_max);
                    self.view.scheduler_error(Some(format!(
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
            if self.poll_errors_in_row > 0 {
                let after_errors = std::mem::take(&mut self.poll_errors_in_row);
                self.view.scheduler_error(None);
                self.emit(ControllerEvent::SchedulerReachable { after_errors })?;
            }
            let mut entries = Vec::new();
            let mut cancels = Vec::new();
            let now = self.clock.now_ms();
            for (&a, st) in chunk.iter().zip(statuses.iter()) {
                if st.state.is_terminal() {
                    entries.extend(self.finish_entries(a, st, None));
                } else if matches!(st.state, JobState::Pending) {
                    let at = &mut self.state.attempts[a];
                    if let Some(PendingVerdict::Stuck(class)) =
                        st.reason.as_deref().map(pending_verdict)
                    {
                        let since = *at.pending_since_ms.get_or_insert(now);
                        if now.saturating_sub(since) >= self.stuck_after.as_millis() as u64
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
                    self.stuck_after
                );
                self.record(vec![Entry::CancelRequested {
                    attempt_id: id.clone(),
                    reason: msg.clone(),
                }])?;
                if let Some(h) = self.state.attempts[a].handle.clone() {
                    self.executor.cancel(&h).await?;
                }
                let st = JobStatus::new(id, JobState::Cancelled { by_uid: None })
                    .with_reason(msg.clone());
                entries.extend(self.finish_entries(a, &st, Some((class, msg))));
            }
            progressed |= !entries.is_empty();
            self.record(entries)?;
        }
        // Dead pool workers: return their items.
        Ok(progressed)
    }

    fn read_tail(path: &Path) -> String {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut f) = std::fs::File::open(path) else {
            return String::new();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(16 * 1024)));
        let mut buf = Vec::new();
        let _ = f.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// The Finished + Decided entries of an attempt that ended (only Finished for one this
    /// controller cancelled).
    fn finish_entries(
        &mut self,
        a: usize,
        st: &JobStatus,
        forced: Option<(FailureClass, String)>,
    ) -> Vec<Entry> {
        let at = &self.state.attempts[a];
        let unit = at.unit;
        let u = &self.state.units[unit];
        let stage = &self.plan.stages[u.stage];
        let log_path = st
            .log_path
            .clone()
            .unwrap_or_else(|| self.dir.join("logs").join(format!("{}.log", at.id)));
        let out = output_dir(&self.dir, &stage.stage_id, u.item);
        let (class, detail) = match forced {
            Some((c, d)) => (Some(c), d),
            None => {
                let ev = Evidence {
                    log_tail: Self::read_tail(&log_path),
                    resumable: stage.resumable,
                    cancel_requested: at.cancel_requested,
                    own_uid: self.own_uid,
                    success_marker: Some(out.join(SUCCESS_MARKER).exists()),
                };
                let c = classify(st, &ev);
                (c.class, c.detail)
            }
        };
        let id = at.id.clone();
        let by_us = at.cancel_requested && class == Some(FailureClass::Cancelled);
        let mut h = self.history(unit);
        match class {
            Some(FailureClass::Transient) => h.transient_failures += 1,
            Some(FailureClass::Oom) => {
                h.oom_failures += 1;
                h.counted_attempts += 1
            }
            _ => h.counted_attempts += 1,
        }
        let is_pool_worker = self.state.stages[u.stage].pool && u.item.is_some();
        let finished = |class, detail| Entry::Finished {
            attempt_id: id.clone(),
            state: st.state.clone(),
            exit_code: st.exit_code,
            class,
            detail,
            log_path: Some(log_path.clone()),
        };
        if by_us {
            // Cancelled by this controller (shutdown, new revision): not a failure and not a
            // retry. No decision is journaled: replaying the `Finished` entry puts the unit
            // back to ready (see `State::apply`), so it runs again on the next `run`.
            self.notify(&ControllerEvent::AttemptCancelled {
                attempt_id: id.clone(),
                stage: stage.stage_id.clone(),
                detail: format!("{}; {detail}", st.state),
            });
            return vec![finished(class, detail)];
        }
        let decision = if is_pool_worker && class.is_none() {
            Decision::Done
        } else {
            decide(&self.retry, class, &h, id.as_str())
        };
        let not_before_ms = match &decision {
            Decision::Retry { delay, .. } => self.clock.now_ms() + delay.as_millis() as u64,
            _ => 0,
        };
        let decision = match decision {
            Decision::Fail { reason } => Decision::Fail {
                reason: format!("{reason} ({detail})"),
            },
            d => d,
        };
        let key = u.key.clone();
        self.notify(&ControllerEvent::AttemptFinished {
            attempt_id: id.clone(),
            stage: stage.stage_id.clone(),
            state: st.state.to_string(),
            class,
            detail: detail.clone(),
            decision: class.map(|_| describe(&decision)),
        });
        vec![
            finished(class, detail),
            Entry::Decided {
                unit: key,
                decision,
                not_before_ms,
            },
        ]
    }

    /// Stage transitions: aggregate steps, pool queues, stage done/failed and the halt policy.
    async fn advance_stages(&mut self) -> Result<bool, ControllerError> {
        let mut progressed = false;
        for si in 0..self.state.stages.len() {
            let s = self.state.stages[si].clone();
            if s.status != StageStatus::Open {
                continue;
            }
            let failed_unit = s
                .units
                .iter()
                .chain(s.agg.iter())
                .find(|&&u| self.state.units[u].status == UnitStatus::Failed);
            if let Some(&u) = failed_unit {
                let still_live = s
                    .units
                    .iter()
                    .chain(s.agg.iter())
                    .any(|&x| self.state.units[x].status == UnitStatus::Live);
                let halt = self.plan.execution_defaults.halt_policy;
                if still_live && halt == HaltPolicy::Drain {
                    continue; // let the stage's own live attempts finish first
                }
                let reason = format!(
                    "unit {} failed: {}",
                    self.state.units[u].key,
                    self.state.units[u].fail_reason.clone().unwrap_or_default()
                );
                self.record(vec![Entry::StageFailed {
                    stage: s.id.clone(),
                    reason: reason.clone(),
                }])?;
                self.notify(&ControllerEvent::StageFailed {
                    stage: s.id.clone(),
                    reason: reason.clone(),
                });
                if halt == HaltPolicy::FailFast {
                    self.halted = true;
                    let n = self.cancel_all(&format!("fail_fast: stage {} failed", s.id))?;
                    self.cancel_live_now().await?;
                    self.emit(ControllerEvent::Halted {
                        stage: s.id.clone(),
                        cancelled: n,
                    })?;
                }
                progressed = true;
                continue;
            }
            let items_done = s
                .units
                .iter()
                .all(|&u| self.state.units[u].status == UnitStatus::Done);
            if s.pool {
                progressed |= self.advance_pool(si).await?;
                continue;
            }
            let agg_done = s
                .agg
                .is_none_or(|a| self.state.units[a].status == UnitStatus::Done);
            if items_done
                && agg_done
                && s.parents
                    .iter()
                    .all(|&p| self.state.stages[p].status == StageStatus::Done)
            {
                self.record(vec![Entry::StageDone {
                    stage: s.id.clone(),
                }])?;
                self.notify(&ControllerEvent::StageDone {
                    stage: s.id.clone(),
                });
                progressed = true;
            }
        }
        Ok(progressed)
    }

    async fn advance_pool(&mut self, si: usize) -> Result<bool, ControllerError> {
        let s = self.state.stages[si].clone();
        if !s.pool_filled {
            return Ok(false);
        }
        let q = WorkQueue::new(queue_dir(&self.dir, &s.id));
        let mut entries = Vec::new();
        // Workers whose attempt ended: return their items.
        for &u in &s.units {
            let unit = &self.state.units[u];
            if unit.status == UnitStatus::Live {
                continue;
            }
            for &a in &unit.attempts {
                let at = &self.state.attempts[a];
                if at.phase == Phase::Finished {
                    let (r, f) = q.requeue_worker(at.id.as_str(), self.max_requeues)?;
                    if r + f > 0 {
                        let ev = ControllerEvent::Requeued {
                            worker: at.id.clone(),
                            requeued: r,
                            failed: f,
                        };
                        self.notify(&ev);
                        entries.push(Self::event_entry(&ev));
                    }
                }
            }
        }
        self.record(entries)?;
        let c = q.counts()?;
        let any_live = s
            .units
            .iter()
            .any(|&u| self.state.units[u].status == UnitStatus::Live);
        if c.pending + c.claimed == 0 {
            if any_live {
                return Ok(false); // workers are exiting
            }
            let e = if c.failed > 0 {
                let reason = format!(
                    "{} of {} pool items failed (see {}/failed)",
                    c.failed,
                    c.failed + c.done,
                    q.dir().display()
                );
                self.notify(&ControllerEvent::StageFailed {
                    stage: s.id.clone(),
                    reason: reason.clone(),
                });
                Entry::StageFailed {
                    stage: s.id.clone(),
                    reason,
                }
            } else {
                self.notify(&ControllerEvent::StageDone {
                    stage: s.id.clone(),
                });
                Entry::StageDone {
                    stage: s.id.clone(),
                }
            };
            self.record(vec![e])?;
            return Ok(true);
        }
        if !any_live {
            // Items left and no worker: start workers again (not a failure of theirs).
            let reopen: Vec<Entry> = s
                .units
                .iter()
                .filter(|&&u| self.state.units[u].status == UnitStatus::Done)
                .map(|&u| Entry::Decided {
                    unit: self.state.units[u].key.clone(),
                    decision: Decision::Retry {
                        delay: Duration::ZERO,
                        resume: false,
                        more_resources: false,
                    },
                    not_before_ms: 0,
                })
                .collect();
            let n = reopen.len();
            let done_now = c.done;
            let guard = self.pool_restarts.entry(si).or_insert((0, usize::MAX));
            if guard.1 == done_now {
                guard.0 += 1;
            } else {
                *guard = (1, done_now);
            }
            let restarts = guard.0;
            if restarts > self.max_requeues + 1 {
                self.record(vec![Entry::StageFailed {
                    stage: s.id.clone(),
                    reason: format!(
                        "workers were restarted {} times and exited without finishing any of the {} items left",
                        restarts - 1,
                        c.pending + c.claimed
                    ),
                }])?;
                return Ok(true);
            }
            if n > 0 {
                self.record(reopen)?;
                self.emit(ControllerEvent::PoolRestarted {
                    stage: s.id.clone(),
                    items_left: c.pending + c.claimed,
                    workers: n,
                })?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Journals a cancel request for every live attempt (the executor calls follow in
    /// [`cancel_live_now`](Self::cancel_live_now)). Returns how many.
    fn cancel_all(&mut self, reason: &str) -> Result<usize, ControllerError> {
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

    async fn cancel_live_now(&mut self) -> Result<(), ControllerError> {
        let live = self.state.live_attempts();
        for &a in &live {
            if let Some(h) = self.state.attempts[a].handle.clone() {
                match self.executor.cancel(&h).await {
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
        if let Ok(sts) = self.executor.poll(&handles).await {
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
                        StageStatus::Open if self.blocked(s) => "blocked",
                        StageStatus::Open if s.started_ms.is_some() => "running",
                        StageStatus::Open => "waiting",
                    }
                    .to_string(),
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
                p
            })
            .collect()
    }

    fn report(&self, iterations: u64, detached: bool, cancelled: usize) -> CampaignReport {
        let mut r = CampaignReport {
            iterations,
            detached,
            cancelled,
            halted: self.halted,
            submitted: self.submitted,
            adopted: self.adopted,
            reattached: self.reattached,
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
                StageStatus::Open if self.blocked(s) => r.blocked.push(s.id.clone()),
                StageStatus::Open => r.unfinished.push(s.id.clone()),
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

fn describe(d: &Decision) -> String {
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
