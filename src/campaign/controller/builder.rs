//! [`CampaignControllerBuilder`]: the controller's options, checked by
//! [`build`](CampaignControllerBuilder::build), which takes the lease, replays the journal and
//! checks the contract.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::clock::{Clock, SystemClock};
use super::driver::{
    CampaignController, Collaborators, Control, Counters, EventSink, PoolSource, Settings,
};
use super::error::ControllerError;
use super::journal::Journal;
use super::lease::Lease;
use super::policy::RetryPolicy;
use super::pool::PoolItem;
use super::state::State;
use crate::campaign::CampaignPlan;
use crate::executor::Executor;

/// Builds a [`CampaignController`]. Required: [`plan`](Self::plan),
/// [`campaign_dir`](Self::campaign_dir) and an executor ([`executor`](Self::executor) or
/// [`local`](Self::local)).
pub struct CampaignControllerBuilder {
    plan: Option<CampaignPlan>,
    executor: Option<Arc<dyn Executor>>,
    local_gpus: Option<Vec<String>>,
    campaign_dir: Option<PathBuf>,
    clock: Arc<dyn Clock>,
    poll_min: Duration,
    poll_max: Duration,
    retry: RetryPolicy,
    lease_ttl: Duration,
    new_revision: bool,
    adopt_grace: Duration,
    stuck_after: Duration,
    max_live: Option<usize>,
    poll_batch: usize,
    submit_batch: usize,
    oom_retry: HashSet<String>,
    pools: HashMap<String, Arc<PoolSource>>,
    max_requeues: u32,
    on_event: Option<Arc<EventSink>>,
    subscribers: Vec<Arc<dyn super::EventSubscriber>>,
    controls: Option<mpsc::UnboundedReceiver<Control>>,
    view: super::view::ViewMode,
    abort_after_submits: Option<u64>,
    require_success_marker: bool,
    heartbeat: HashMap<String, Duration>,
    exclude_node_after: Option<u32>,
    fast_failure_window: Duration,
    visibility_wait: Duration,
    visibility_hook: Option<Arc<super::finalise::VisibilityHook>>,
    prompt: Option<Arc<dyn super::controls::DecisionPrompt>>,
}

impl Default for CampaignControllerBuilder {
    fn default() -> Self {
        Self {
            plan: None,
            executor: None,
            local_gpus: None,
            campaign_dir: None,
            clock: Arc::new(SystemClock),
            poll_min: Duration::from_millis(500),
            poll_max: Duration::from_secs(30),
            retry: RetryPolicy::default(),
            lease_ttl: Duration::from_secs(30),
            new_revision: false,
            adopt_grace: Duration::from_secs(30),
            stuck_after: Duration::from_secs(600),
            max_live: None,
            poll_batch: 10_000,
            submit_batch: 1000,
            oom_retry: HashSet::new(),
            pools: HashMap::new(),
            max_requeues: 3,
            on_event: None,
            subscribers: Vec::new(),
            controls: None,
            view: super::view::ViewMode::Off,
            abort_after_submits: None,
            require_success_marker: true,
            heartbeat: HashMap::new(),
            exclude_node_after: Some(2),
            fast_failure_window: Duration::from_secs(60),
            visibility_wait: Duration::from_secs(60),
            visibility_hook: None,
            prompt: None,
        }
    }
}

impl CampaignControllerBuilder {
    /// The compiled plan to run.
    pub fn plan(mut self, plan: CampaignPlan) -> Self {
        self.plan = Some(plan);
        self
    }
    /// Where attempts run.
    pub fn executor(mut self, executor: Arc<dyn Executor>) -> Self {
        self.executor = Some(executor);
        self
    }
    /// Local mode: a [`LocalExecutor`](crate::executor::LocalExecutor) with its attempt folders
    /// in `<campaign>/attempts` and these GPU ids (handed out through `CUDA_VISIBLE_DEVICES`).
    pub fn local<I: IntoIterator<Item = S>, S: Into<String>>(mut self, gpu_ids: I) -> Self {
        self.local_gpus = Some(gpu_ids.into_iter().map(Into::into).collect());
        self
    }
    /// The campaign folder (journal, lease, queues, outputs, logs).
    pub fn campaign_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.campaign_dir = Some(dir.into());
        self
    }
    /// The clock (default: the system clock; tests use a `VirtualClock`, feature
    /// `test-util`).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
    /// Poll interval: `min` after a change, growing by 1.5x per quiet iteration up to `max`.
    /// Defaults 0.5 s and 30 s.
    pub fn poll_interval(mut self, min: Duration, max: Duration) -> Self {
        self.poll_min = min;
        self.poll_max = max.max(min);
        self
    }
    /// Retry budgets and backoff.
    pub fn retry_policy(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }
    /// Lease time-to-live: its heartbeat is renewed every quarter of it, and a controller that
    /// cannot prove the holder dead (another host, boot or PID namespace) takes the lease over
    /// only after watching that heartbeat stand still for this long (see
    /// [`Lease::acquire`](super::Lease::acquire)). Default 30 s.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }
    /// Accept a changed contract hash: cancel the old revision's attempts and start over.
    pub fn new_revision(mut self, yes: bool) -> Self {
        self.new_revision = yes;
        self
    }
    /// How long after its intent a job that `find` does not see may still appear (a submit in
    /// flight when the controller died). Default 30 s.
    pub fn adopt_grace(mut self, grace: Duration) -> Self {
        self.adopt_grace = grace;
        self
    }
    /// How long a job may pend with a "stuck" reason (C25) before it is cancelled and failed.
    /// Default 10 min.
    pub fn stuck_after(mut self, d: Duration) -> Self {
        self.stuck_after = d;
        self
    }
    /// The heartbeat timeout of `stage` (over the execution config's `heartbeat_timeout_s`):
    /// a running attempt whose progress mark (the highest `step N` / `iteration N` in its job
    /// log and rank logs, or the mtime of the file `$PUZZLETRON_HEARTBEAT_FILE` it may touch)
    /// has not moved for `timeout` is cancelled through the executor (SIGTERM, then SIGKILL
    /// after the executor's grace: Slurm's `KillWait`, the local executor's `kill_grace`) and
    /// classified from its logs as [`FailureClass::Hung`](super::FailureClass::Hung) (an
    /// application error in its logs stays `Application`). The time is counted from the first
    /// poll that saw it running. Timeouts shorter than the poll interval act at the next poll.
    pub fn heartbeat_timeout(mut self, stage: impl Into<String>, timeout: Duration) -> Self {
        self.heartbeat.insert(stage.into(), timeout);
        self
    }
    /// After how many distinct units failed fast (see `nodes`) on one node it
    /// is excluded from every later submission (`--exclude`), with a
    /// [`ControllerEvent::NodeExcluded`](super::ControllerEvent::NodeExcluded); `None`
    /// never excludes. Default 2. (A unit's own retry avoids the nodes of its failed attempt
    /// whatever this says.)
    pub fn exclude_node_after(mut self, units: Option<u32>) -> Self {
        self.exclude_node_after = units.map(|n| n.max(1));
        self
    }
    /// How soon after it started an attempt that failed before its start mark (its payload
    /// never started: the job's setup failed on its node; only for executors whose jobs write
    /// one, [`Executor::writes_start_mark`]),
    /// without application evidence in its log, counts as an infrastructure failure (see
    /// `classify`, rule 6a). Default 60 s.
    pub fn fast_failure_window(mut self, window: Duration) -> Self {
        self.fast_failure_window = window;
        self
    }
    /// How long a completed attempt's success marker or declared output that is not visible
    /// (`stat`, then a `readdir` of its folder and an `open`, which clear a network
    /// filesystem's negative caches) is looked for again, on the following polls (with the
    /// poll interval's backoff), before the attempt fails as
    /// [`FailureClass::OutputNotVisible`](super::FailureClass::OutputNotVisible) naming the
    /// path. Default 60 s.
    pub fn output_visibility_wait(mut self, wait: Duration) -> Self {
        self.visibility_wait = wait;
        self
    }
    /// Test hook: `hook(path, probe)` returning `true` hides `path` from that probe, as a
    /// network filesystem's attribute or negative cache would (issue 27's tests).
    #[cfg(any(test, feature = "test-util"))]
    #[doc(hidden)]
    pub fn visibility_hook(mut self, hook: Arc<super::finalise::VisibilityHook>) -> Self {
        self.visibility_hook = Some(hook);
        self
    }
    /// Most attempts live at once (default: no limit).
    pub fn max_live(mut self, n: usize) -> Self {
        self.max_live = Some(n.max(1));
        self
    }
    /// Most handles per poll call (default 10 000).
    pub fn poll_batch(mut self, n: usize) -> Self {
        self.poll_batch = n.max(1);
        self
    }
    /// Most submits per iteration (default 1000): their intents are journaled in one batch
    /// before the first submit.
    pub fn submit_batch(mut self, n: usize) -> Self {
        self.submit_batch = n.max(1);
        self
    }
    /// Allow one retry with more resources after an out-of-memory in `stage`.
    pub fn allow_oom_retry(mut self, stage: impl Into<String>) -> Self {
        self.oom_retry.insert(stage.into());
        self
    }
    /// The items of persistent-pool stage `stage`, computed when the stage starts (its parents
    /// are done), from the campaign folder.
    pub fn pool_items(
        mut self,
        stage: impl Into<String>,
        f: impl Fn(&Path) -> Result<Vec<PoolItem>, String> + Send + Sync + 'static,
    ) -> Self {
        self.pools.insert(stage.into(), Arc::new(f));
        self
    }
    /// How often an item may be returned to its queue by dead workers before it fails.
    pub fn max_requeues(mut self, n: u32) -> Self {
        self.max_requeues = n;
        self
    }
    /// Observer: called with every [`ControllerEvent`](super::ControllerEvent) as it happens
    /// (on the controller's task; keep it quick). The journal records the same events as
    /// `(kind, message)` entries.
    pub fn on_event(mut self, f: impl Fn(&super::ControllerEvent) + Send + Sync + 'static) -> Self {
        self.on_event = Some(Arc::new(f));
        self
    }
    /// Tells `subscriber` of every [`ControllerEvent`](super::ControllerEvent) with the
    /// campaign's folder, besides any [`on_event`](Self::on_event) observer and any other
    /// subscriber (in the order given). The `report` module's `Notifier` is one: it runs a
    /// command with the event as JSON when a stage completes or fails or an attempt is declared
    /// hung, and a failing notifier never stops the campaign; the campaign's end is the
    /// caller's to announce after [`run`](super::CampaignController::run).
    pub fn subscribe(mut self, subscriber: Arc<dyn super::EventSubscriber>) -> Self {
        self.subscribers.push(subscriber);
        self
    }
    /// Who answers manual decisions (post-MIP filters with `mode: manual`): e.g.
    /// [`TerminalControls::prompter`](super::TerminalControls::prompter) on a terminal, a
    /// numbered prompt. Without one (the default, and off a terminal) the controller journals
    /// and notifies [`ControllerEvent::DecisionNeeded`](super::ControllerEvent::DecisionNeeded)
    /// and waits for the decision file (`<campaign>/decisions/<stage>.txt`), checked every
    /// iteration, while other stages go on. A decision file already present is used first,
    /// without asking. The prompt blocks the loop while it waits (jobs keep running; their
    /// ends are seen after the answer); an end of input falls back to the decision file.
    pub fn decision_prompt(mut self, prompt: Arc<dyn super::controls::DecisionPrompt>) -> Self {
        self.prompt = Some(prompt);
        self
    }
    /// Control requests (menu, signals). See [`TerminalControls`](super::TerminalControls).
    pub fn controls(mut self, rx: mpsc::UnboundedReceiver<Control>) -> Self {
        self.controls = Some(rx);
        self
    }
    /// Fault injection for crash tests: abort the process (as `kill -9` would) right after the
    /// `n`-th submit of this process, before its handle is journaled. Never use it otherwise.
    #[doc(hidden)]
    pub fn abort_after_submits(mut self, n: u64) -> Self {
        self.abort_after_submits = Some(n);
        self
    }
    /// Whether an attempt that exits 0 must also leave its success marker (`_SUCCESS` in
    /// its output folder) to count as done (default `true`: success needs proof). Turn it off
    /// only for executors that run nothing (tests of controller logic on the mock executor).
    pub fn require_success_marker(mut self, required: bool) -> Self {
        self.require_success_marker = required;
        self
    }
    /// The live view (default off).
    pub fn view(mut self, mode: super::view::ViewMode) -> Self {
        self.view = mode;
        self
    }

    /// Checks the options, takes the lease and replays the journal.
    ///
    /// # Errors
    /// [`ControllerError::BadOption`] for a missing plan/folder/executor;
    /// [`ControllerError::NotACampaign`] and [`ControllerError::Io`] from
    /// [`open_campaign_dir`];
    /// [`ControllerError::LeaseHeld`]; [`ControllerError::Corrupt`] for an unreadable journal;
    /// [`ControllerError::ContractChanged`] when the plan's contract differs from the journal's
    /// and no new revision was asked for; [`ControllerError::BadPlan`] for a pool stage without
    /// an item source.
    pub fn build(self) -> Result<CampaignController, ControllerError> {
        let plan = self.plan.ok_or(ControllerError::BadOption {
            option: "plan",
            reason: "no plan given".into(),
        })?;
        let dir = self.campaign_dir.ok_or(ControllerError::BadOption {
            option: "campaign_dir",
            reason: "no campaign folder given".into(),
        })?;
        let dir = open_campaign_dir(&dir)?;
        let ctl_dir = dir.join("controller");
        let executor: Arc<dyn Executor> = match (self.executor, self.local_gpus) {
            (Some(e), _) => e,
            (None, Some(gpus)) => Arc::new(
                crate::executor::LocalExecutor::builder(dir.join("attempts"))
                    .gpu_ids(gpus)
                    .build()?,
            ),
            (None, None) => {
                return Err(ControllerError::BadOption {
                    option: "executor",
                    reason: "give an executor or local mode".into(),
                });
            }
        };
        for st in &plan.stages {
            if st.work.strategy == crate::campaign::Strategy::PersistentPool
                && !self.pools.contains_key(&st.stage_id)
            {
                return Err(ControllerError::BadPlan {
                    stage: st.stage_id.clone(),
                    reason: "a persistent_pool stage needs an item source (`pool_items`)".into(),
                });
            }
        }
        let on_event: Option<Arc<EventSink>> = match (self.on_event, self.subscribers) {
            (f, subscribers) if subscribers.is_empty() => f,
            (f, subscribers) => {
                let campaign = dir.clone();
                Some(Arc::new(move |ev: &super::ControllerEvent| {
                    if let Some(f) = &f {
                        f(ev);
                    }
                    for s in &subscribers {
                        s.on_event(&campaign, ev);
                    }
                }))
            }
        };
        let lease = Lease::acquire(&dir, &ctl_dir, self.lease_ttl)?;
        let (journal, replay) = Journal::open(&ctl_dir)?;
        let mut state = State::new(&plan);
        for r in &replay.records {
            state
                .apply(&r.entry, &plan, r.at_ms)
                .map_err(|reason| ControllerError::Corrupt {
                    path: journal.path().to_path_buf(),
                    line: r.seq as usize,
                    reason,
                })?;
        }
        let mut c = CampaignController {
            plan,
            dir,
            settings: Settings {
                poll_min: self.poll_min,
                poll_max: self.poll_max,
                retry: self.retry,
                new_revision: self.new_revision,
                adopt_grace: self.adopt_grace,
                stuck_after: self.stuck_after,
                max_live: self.max_live,
                poll_batch: self.poll_batch,
                submit_batch: self.submit_batch,
                oom_retry: self.oom_retry,
                max_requeues: self.max_requeues,
                abort_after_submits: self.abort_after_submits,
                require_success_marker: self.require_success_marker,
                pools: self.pools,
                heartbeat: self.heartbeat,
                exclude_node_after: self.exclude_node_after,
                fast_failure_window: self.fast_failure_window,
                visibility_wait: self.visibility_wait,
                visibility_hook: self.visibility_hook,
                prompt: self.prompt,
            },
            io: Collaborators {
                executor,
                clock: self.clock,
                on_event,
                controls: self.controls,
                view: super::view::LiveView::new(self.view),
                journal,
                lease,
            },
            counters: Counters::default(),
            state,
            own_uid: unsafe_getuid(),
            halted: false,
            pending_revision: None,
            started: false,
            recovery_reported: false,
            interrupt: None,
            scheduler_uid: None,
            scheduler_uid_asked: false,
        };
        if replay.torn_tail > 0 {
            c.emit(super::ControllerEvent::JournalRepaired {
                torn_bytes: replay.torn_tail as u64,
            })?;
        }
        c.check_contract()?;
        Ok(c)
    }
}

/// Entries of a campaign folder that the library itself creates (see the layout in the
/// [module docs](super)); a folder holding only these is accepted as a campaign folder even
/// before its `controller/` folder exists (e.g. a local executor's `attempts/` root created
/// just before [`build`](CampaignControllerBuilder::build)).
const OWN_ENTRIES: [&str; 9] = [
    "controller",
    "decisions",
    "logs",
    "work",
    "queues",
    ".puzzletron",
    "attempts",
    "slurm-logs",
    "baremetal",
];

/// Checks and prepares a campaign folder: creates it (and its `controller/` and `logs/`
/// folders) and returns its canonical path. [`build`](CampaignControllerBuilder::build) calls
/// it; a driver that puts its own files into the campaign folder before `build` (e.g. an
/// executor root such as `<dir>/slurm-logs`) calls it first, so that the folder is already
/// marked as a campaign.
///
/// Accepted: a missing or empty folder, a folder with a `controller/` folder (a campaign
/// this library created), or one holding only folders the controller itself creates
/// (`logs`, `work`, `queues`, `.puzzletron`, `attempts`, `decisions`). Like a sweep's store, a campaign is
/// never scattered into an unrelated non-empty folder.
///
/// # Errors
/// [`ControllerError::NotACampaign`] when `dir` is not a folder, or is a non-empty folder
/// that holds something else and no `controller/`; [`ControllerError::Io`] (naming the path
/// and the action) when a folder cannot be read, created or resolved.
pub fn open_campaign_dir(dir: &Path) -> Result<PathBuf, ControllerError> {
    let ctl_dir = dir.join("controller");
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => {
            return Err(ControllerError::NotACampaign {
                path: dir.to_path_buf(),
                reason: "it is a file, expected a folder (new, empty or an existing campaign)"
                    .into(),
            });
        }
        Ok(_) if !ctl_dir.is_dir() => {
            let entries = std::fs::read_dir(dir)
                .map_err(|e| ControllerError::io("reading campaign folder", dir, e))?;
            for e in entries {
                let name = e
                    .map_err(|e| ControllerError::io("reading campaign folder", dir, e))?
                    .file_name();
                if !OWN_ENTRIES.contains(&name.to_string_lossy().as_ref()) {
                    return Err(ControllerError::NotACampaign {
                        path: dir.to_path_buf(),
                        reason: format!(
                            "the folder is not empty (it holds {name:?}) and has no controller/ \
                             folder: expected a new or empty folder, or a campaign folder this \
                             library created"
                        ),
                    });
                }
            }
        }
        // A folder with `controller/`, a missing folder (created below), or one we cannot
        // stat (create_dir_all names the path and the OS error).
        _ => {}
    }
    for d in [&ctl_dir, &dir.join("logs")] {
        std::fs::create_dir_all(d)
            .map_err(|e| ControllerError::io("creating campaign folder", d, e))?;
    }
    dir.canonicalize()
        .map_err(|e| ControllerError::io("resolving campaign folder", dir, e))
}

fn unsafe_getuid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

#[cfg(test)]
impl Settings {
    /// The builder's defaults, for tests of the pure steps.
    pub(super) fn defaults() -> Self {
        let b = CampaignControllerBuilder::default();
        Settings {
            poll_min: b.poll_min,
            poll_max: b.poll_max,
            retry: b.retry,
            new_revision: b.new_revision,
            adopt_grace: b.adopt_grace,
            stuck_after: b.stuck_after,
            max_live: b.max_live,
            poll_batch: b.poll_batch,
            submit_batch: b.submit_batch,
            oom_retry: b.oom_retry,
            max_requeues: b.max_requeues,
            abort_after_submits: b.abort_after_submits,
            require_success_marker: b.require_success_marker,
            pools: b.pools,
            heartbeat: b.heartbeat,
            exclude_node_after: b.exclude_node_after,
            fast_failure_window: b.fast_failure_window,
            visibility_wait: b.visibility_wait,
            visibility_hook: b.visibility_hook,
            prompt: b.prompt,
        }
    }
}
