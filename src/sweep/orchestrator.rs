//! [`Orchestrator`]: the sweep engine.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::decision::{Action, JobDecision, Plan};
use super::event::Event;
use super::job::{Job, JobResult};
use super::panics;
use super::run::Run;
use super::summary::{FailureCause, JobOutcome, Outcome, RunFailed, RunSummary};
use crate::error::{Error, Result};
use crate::executor::{Executor, MockExecutor};
use crate::identity::{
    self, Hash, Modules, OwnedCode, OwnedDigest, ParamError, Toolchain, Witnesses,
};
use crate::metrics::{JobRows, MetricTable, MetricsError, RESERVED_COLUMNS, build_table};
use crate::store::{
    ClaimOutcome, FORMAT_VERSION, Failure, FsStore, JobRecord, Owner, Status, Store, StoreError,
    unix_now,
};

type Call = Arc<dyn Fn(&mut Run) -> JobResult + Send + Sync>;

/// A run in the queue: its key is computed when it is enqueued.
#[derive(Clone)]
pub struct PendingRun {
    /// The job key.
    pub key: Hash,
    /// Job name + parameters, without code.
    pub lineage: Hash,
    /// The job's name.
    pub job: Arc<str>,
    /// Canonical JSON parameters.
    pub params: Arc<str>,
    /// Top-level parameter names in declaration order.
    pub param_order: Arc<[String]>,
    /// The owned code the key covers.
    pub owned: Arc<OwnedDigest>,
    pub(super) call: Call,
    /// Where a worker process finds the job function (isolated runs, see `sweep::worker`).
    pub(super) entry: super::worker::Entry,
}

impl std::fmt::Debug for PendingRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingRun")
            .field("key", &self.key)
            .field("job", &self.job)
            .field("params", &self.params)
            .finish()
    }
}

type EventFn = Box<dyn Fn(&Event) + Send + Sync>;

/// Builds an [`Orchestrator`]. Defaults: [`FsStore`] under `.puzzletron` in the current folder,
/// in-process execution, the Cargo.lock of the jobs' build (found from their package upward),
/// no source checkout witnessed, `job!` jobs' compiled closures (the whole `src/` for
/// [`Job::new`] jobs).
pub struct OrchestratorBuilder<S: Store = FsStore, E: Executor = MockExecutor> {
    store: Box<dyn FnOnce() -> Result<S>>,
    executor: E,
    modules: Modules,
    lock: Option<PathBuf>,
    source: Option<PathBuf>,
    force: bool,
    isolate: bool,
    trace: bool,
    on_event: Option<EventFn>,
    wait_poll: Duration,
}

impl OrchestratorBuilder<FsStore, MockExecutor> {
    fn new() -> Self {
        Self {
            store: Box::new(|| Ok(FsStore::open(".puzzletron")?)),
            executor: MockExecutor::new(),
            modules: Modules::all(),
            lock: None,
            source: None,
            force: false,
            isolate: false,
            trace: false,
            on_event: None,
            wait_poll: Duration::from_millis(100),
        }
    }
}

impl<E: Executor> OrchestratorBuilder<FsStore, E> {
    /// Uses an [`FsStore`] at `root` (created when missing).
    pub fn store_root(mut self, root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        self.store = Box::new(move || Ok(FsStore::open(root)?));
        self
    }
}

impl<S: Store + 'static, E: Executor> OrchestratorBuilder<S, E> {
    /// Uses `store` (any [`Store`]).
    pub fn store<S2: Store + 'static>(self, store: S2) -> OrchestratorBuilder<S2, E> {
        OrchestratorBuilder {
            store: Box::new(move || Ok(store)),
            executor: self.executor,
            modules: self.modules,
            lock: self.lock,
            source: self.source,
            force: self.force,
            isolate: self.isolate,
            trace: self.trace,
            on_event: self.on_event,
            wait_poll: self.wait_poll,
        }
    }

    /// Uses `executor` for isolated runs.
    pub fn executor<E2: Executor>(self, executor: E2) -> OrchestratorBuilder<S, E2> {
        OrchestratorBuilder {
            store: self.store,
            executor,
            modules: self.modules,
            lock: self.lock,
            source: self.source,
            force: self.force,
            isolate: self.isolate,
            trace: self.trace,
            on_event: self.on_event,
            wait_poll: self.wait_poll,
        }
    }

    /// Which modules of each job's crate count as its code, for jobs made with [`Job::new`]
    /// (default: all of `src/`; a job's own [`Job::with_modules`] wins; the job's file always
    /// counts). [`job!`](crate::job) jobs ignore it: their code is the compiled closure of the
    /// job function.
    pub fn owned(mut self, modules: Modules) -> Self {
        self.modules = modules;
        self
    }

    /// The Cargo.lock to witness (default: the one `job!` found at compile time from the job's
    /// package upward, or for [`Job::new`] jobs the one found upward from the job's crate
    /// folder; never the current folder).
    pub fn lock(mut self, path: impl Into<PathBuf>) -> Self {
        self.lock = Some(path.into());
        self
    }

    /// A git checkout whose commit and dirty flag are witnessed: results re-run when they change.
    pub fn source(mut self, path: impl Into<PathBuf>) -> Self {
        self.source = Some(path.into());
        self
    }

    /// Re-run every run even when its result is current.
    pub fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }

    /// Run each job in a fresh process of this binary through the executor (see
    /// [`worker`](crate::worker): the binary must call `puzzletron::worker::main_guard()` first
    /// in `main`). Needs a store that worker processes can open ([`FsStore`]).
    pub fn isolate(mut self, isolate: bool) -> Self {
        self.isolate = isolate;
        self
    }

    /// Re-check identities at decide time (default off): a done result is reused only if the
    /// per-item digests it recorded equal this binary's (else it re-runs, naming the items), and
    /// each decision of a `job!` job whose covered source files exist here and differ from what
    /// this binary was compiled from says `stale binary: <files>` (its results are still recorded
    /// under this binary's key, which describes the code that runs; rebuild to run the new
    /// code). It cannot see code that is not in the closure (registry crates: Cargo.lock) nor
    /// edits on another machine; it reads every covered file once per job per process.
    pub fn trace(mut self, trace: bool) -> Self {
        self.trace = trace;
        self
    }

    /// Calls `f` for every [`Event`] of a drain (e.g. `|e| eprintln!("{e}")`).
    pub fn on_event(mut self, f: impl Fn(&Event) + Send + Sync + 'static) -> Self {
        self.on_event = Some(Box::new(f));
        self
    }

    /// How often a drain re-checks runs held by other processes (default 100 ms).
    pub fn wait_poll(mut self, every: Duration) -> Self {
        self.wait_poll = every;
        self
    }

    /// Opens the store and reads the witnesses.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for `isolate(true)` with a store that is not a folder;
    /// [`Error::Store`] when the store cannot be opened; [`Error::Identity`] when a lock file
    /// given with [`lock`](Self::lock) is missing or unreadable.
    pub fn build(self) -> Result<Orchestrator<S, E>> {
        // A worker whose `main` did not start with `main_guard()` would run the whole sweep
        // again and submit workers of its own, without end: refuse before anything happens.
        for var in [super::worker::MANIFEST_ENV, super::worker::TASK_ENV] {
            if std::env::var_os(var).is_some() {
                return Err(Error::Usage {
                    message: format!(
                        "this process was started as an isolated worker ({var} is set) but \
                         `puzzletron::worker::main_guard();` did not run first in `main`: add it \
                         as the first line of `main` (a worker must not build its own sweep)"
                    ),
                });
            }
        }
        let lock = match &self.lock {
            Some(p) if !p.is_file() => {
                return Err(identity::IdentityError::LockNotFound { path: p.clone() }.into());
            }
            Some(p) => Some(p.clone()),
            // Found per job at `run()`: from the job's compile-time capture, or upward from
            // its crate folder (never the current folder).
            None => None,
        };
        let witnesses = Witnesses {
            cargo_lock: lock.as_deref().map(identity::lock_witness).transpose()?,
            toolchain: Toolchain::current(),
            source: self.source.as_deref().map(identity::source_witness),
        };
        let store = (self.store)()?;
        if self.isolate {
            super::worker::check_isolatable(&store, &self.executor)?;
        }
        Ok(Orchestrator {
            store,
            executor: self.executor,
            modules: self.modules,
            force: self.force,
            witnesses,
            owned_cache: Vec::new(),
            job_names: HashMap::new(),
            queue: Vec::new(),
            queued_keys: HashSet::new(),
            enqueued: Vec::new(),
            enqueued_keys: HashSet::new(),
            identity: super::identity::JobIdentities::new(self.trace, self.lock.is_none()),
            on_event: self.on_event,
            owner: Owner::current(),
            wait_poll: self.wait_poll,
            isolate: self.isolate,
        })
    }
}

/// Runs a sweep: enqueue runs with [`run`](Self::run), see what would happen with
/// [`plan`](Self::plan), execute what is not done with [`drain`](Self::drain), read metrics with
/// [`get`](Self::get).
///
/// A run's key is the hash of the job's name, its parameters (canonical JSON) and its owned
/// code (for [`job!`](crate::job) jobs, fixed at compile time: see
/// [`CompiledCode`](crate::identity::CompiledCode)). A run is executed when the store has no result for its key, its last attempt failed or
/// was interrupted, its recorded witnesses (Cargo.lock, toolchain, source commit) differ, or the
/// orchestrator is forced; otherwise it is skipped. Several processes may drain one store: each
/// run executes once.
pub struct Orchestrator<S: Store = FsStore, E: Executor = MockExecutor> {
    pub(super) store: S,
    pub(super) executor: E,
    modules: Modules,
    force: bool,
    pub(super) witnesses: Witnesses,
    owned_cache: Vec<(PathBuf, PathBuf, Modules, Arc<OwnedDigest>)>,
    job_names: HashMap<String, Arc<str>>,
    pub(super) queue: Vec<PendingRun>,
    pub(super) queued_keys: HashSet<Hash>,
    enqueued: Vec<PendingRun>,
    enqueued_keys: HashSet<Hash>,
    identity: super::identity::JobIdentities,
    on_event: Option<EventFn>,
    pub(super) owner: Owner,
    pub(super) wait_poll: Duration,
    pub(super) isolate: bool,
}

impl Orchestrator<FsStore, MockExecutor> {
    /// A builder with the defaults (see [`OrchestratorBuilder`]).
    pub fn builder() -> OrchestratorBuilder<FsStore, MockExecutor> {
        OrchestratorBuilder::new()
    }
}

impl<S: Store, E: Executor> Orchestrator<S, E> {
    /// The worker side of an isolated run (see `sweep::worker`): an orchestrator over `store`
    /// that records results with the parent's `witnesses`.
    pub(super) fn for_worker(store: S, executor: E, witnesses: Witnesses) -> Self {
        Orchestrator {
            store,
            executor,
            modules: Modules::all(),
            force: false,
            witnesses,
            owned_cache: Vec::new(),
            job_names: HashMap::new(),
            queue: Vec::new(),
            queued_keys: HashSet::new(),
            enqueued: Vec::new(),
            enqueued_keys: HashSet::new(),
            identity: super::identity::JobIdentities::new(false, false),
            on_event: None,
            owner: Owner::current(),
            wait_poll: Duration::from_millis(100),
            isolate: false,
        }
    }

    /// Enqueues a run of `job` with `params` and returns its key, computed now.
    ///
    /// Enqueuing the same key twice keeps one run.
    ///
    /// # Errors
    /// [`Error::Params`] when the parameters cannot be encoded (NaN, infinity, a reserved
    /// top-level name `step`/`value`/`job_key`, non-scalar map keys), naming the parameter's
    /// path; [`Error::Identity`] when the job's source files cannot be read.
    pub fn run<P>(&mut self, job: &Job<P>, params: P) -> Result<Hash>
    where
        P: Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        let bad = |source| Error::Params {
            job: job.name().to_string(),
            source,
        };
        let canon = identity::canonical_params(&params).map_err(bad)?;
        if let Some(r) = canon
            .fields
            .iter()
            .find(|f| RESERVED_COLUMNS.contains(&f.as_str()))
        {
            return Err(bad(ParamError::Reserved { name: r.clone() }));
        }
        let owned = self.owned_for(job)?;
        let key = identity::job_key(job.name(), &canon.json, &owned.digest);
        if !self.enqueued_keys.insert(key) {
            if self.queued_keys.insert(key) {
                // Enqueued before and drained; enqueue again so a new drain re-checks it.
                if let Some(p) = self.enqueued.iter().find(|p| p.key == key) {
                    self.queue.push(p.clone());
                }
            }
            return Ok(key);
        }
        let f = job.func();
        let name = match self.job_names.get(job.name()) {
            Some(n) => n.clone(),
            None => {
                let n: Arc<str> = job.name().into();
                self.job_names.insert(job.name().to_string(), n.clone());
                n
            }
        };
        let pending = PendingRun {
            key,
            lineage: identity::lineage_key(job.name(), &canon.json),
            job: name,
            params: canon.json.into(),
            param_order: canon.fields.into(),
            owned,
            call: Arc::new(move |run: &mut Run| f(&params, run)),
            entry: super::worker::Entry::of::<P>(f),
        };
        self.queued_keys.insert(key);
        self.queue.push(pending.clone());
        self.enqueued.push(pending);
        Ok(key)
    }

    fn owned_for<P>(&mut self, job: &Job<P>) -> Result<Arc<OwnedDigest>> {
        if let Some(code) = job.code() {
            return Ok(self
                .identity
                .compiled(job.name(), code, &mut self.witnesses));
        }
        self.identity
            .runtime_lock(job.crate_dir(), &mut self.witnesses)?;
        let modules = job.modules().unwrap_or(&self.modules);
        // A sweep has a handful of jobs: a scan without allocation beats hashing paths.
        if let Some((.., d)) = self
            .owned_cache
            .iter()
            .find(|(dir, file, m, _)| dir == job.crate_dir() && file == job.file() && m == modules)
        {
            return Ok(d.clone());
        }
        let code = OwnedCode {
            crate_dir: job.crate_dir().to_path_buf(),
            job_file: job.file().to_path_buf(),
            modules: modules.clone(),
        };
        let d = Arc::new(identity::owned_digest(&code)?);
        self.owned_cache
            .push((code.crate_dir, code.job_file, code.modules, d.clone()));
        Ok(d)
    }

    /// Every run enqueued in this sweep, in enqueue order (one per key).
    pub fn enqueued(&self) -> &[PendingRun] {
        &self.enqueued
    }

    /// The runs the next drain will consider, in enqueue order.
    pub fn queued(&self) -> &[PendingRun] {
        &self.queue
    }

    /// The environment recorded with results made now.
    pub fn witnesses(&self) -> &Witnesses {
        &self.witnesses
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// What a drain would do with `run`, and why. Executes nothing.
    ///
    /// # Errors
    /// [`Error::Store`] when the store cannot be read.
    pub fn decide(&self, run: &PendingRun) -> Result<JobDecision> {
        Ok(self.decide_in_store(run)?)
    }

    /// [`decide`](Self::decide), whose only failure is reading the store.
    fn decide_in_store(&self, run: &PendingRun) -> std::result::Result<JobDecision, StoreError> {
        let rec = self.store.record(&run.key)?;
        let lineage = match rec {
            None => self.store.lineage(&run.lineage)?,
            Some(_) => None,
        };
        self.decide_with(run, rec, lineage)
    }

    fn decide_with(
        &self,
        run: &PendingRun,
        rec: Option<JobRecord>,
        lineage: Option<Hash>,
    ) -> std::result::Result<JobDecision, StoreError> {
        let mut reasons = Vec::new();
        let mut action = Action::Run;
        let mut replaces = None;
        match &rec {
            None => match lineage {
                Some(prev) if prev != run.key => match self.store.record(&prev)? {
                    Some(old) => reasons.extend(identity::code_differences(&run.owned, &old.owned)),
                    None => reasons.push("code changed".to_string()),
                },
                _ => reasons.push(self.identity.no_record_reason(&self.store, run)?),
            },
            Some(r) => match r.status {
                Status::Done => {
                    let diffs = self.witnesses.differences(&r.witnesses);
                    if diffs.is_empty() {
                        action = Action::Skip;
                        reasons.push(format!("up to date, attempt {}", r.attempt));
                    } else {
                        reasons.extend(diffs);
                        replaces = Some(r.attempt);
                    }
                }
                Status::Failed => {
                    let msg = r
                        .error
                        .as_ref()
                        .map(|e| e.message.as_str())
                        .unwrap_or("unknown");
                    reasons.push(format!("last attempt failed: {msg}"));
                }
                Status::Running => match self.store.claim_info(&run.key)? {
                    Some(c) if c.live => {
                        action = Action::Wait;
                        reasons.push(format!("running in {}", c.owner));
                    }
                    _ => {
                        let by = r.owner.as_ref().map(|o| o.to_string()).unwrap_or_default();
                        reasons.push(format!(
                            "interrupted: attempt {} by {by} did not finish",
                            r.attempt
                        ));
                    }
                },
            },
        }
        self.identity
            .trace_check(run, rec.as_ref(), &mut action, &mut reasons, &mut replaces);
        if self.force && action == Action::Skip {
            action = Action::Run;
            reasons = vec!["forced".to_string()];
            replaces = rec.as_ref().map(|r| r.attempt);
        }
        Ok(JobDecision {
            key: run.key,
            job: run.job.to_string(),
            params: run.params.to_string(),
            action,
            reasons,
            replaces,
        })
    }

    /// The decision for every queued run, in enqueue order. Executes nothing.
    ///
    /// # Errors
    /// [`Error::Store`] when the store cannot be read.
    pub fn plan(&self) -> Result<Plan> {
        let keys: Vec<Hash> = self.queue.iter().map(|p| p.key).collect();
        let recs = self.store.records(&keys)?;
        // Lineages only matter for runs without a record ("code changed" vs "no record").
        let (missing, lineages): (Vec<usize>, Vec<Hash>) = recs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_none())
            .map(|(i, _)| (i, self.queue[i].lineage))
            .unzip();
        let mut prev = vec![None; recs.len()];
        for (i, l) in missing.into_iter().zip(self.store.lineages(&lineages)?) {
            prev[i] = l;
        }
        let decisions = self
            .queue
            .iter()
            .zip(recs)
            .zip(prev)
            .map(|((p, r), l)| self.decide_with(p, r, l))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Plan { decisions })
    }

    pub(super) fn emit(&self, e: Event) {
        if let Some(f) = &self.on_event {
            f(&e);
        }
    }

    /// Executes every queued run that is not done, in enqueue order, in this process; waits for
    /// runs other processes hold. Stops at the first failure.
    ///
    /// With [`isolate(true)`](OrchestratorBuilder::isolate) the runs go to worker processes
    /// through the executor, all at once (the executor bounds how many run together); a failed,
    /// panicking, aborted or killed run fails only itself, and the drain reports the first
    /// failure once the submitted runs have ended.
    ///
    /// # Errors
    /// [`RunFailed`] with the summary so far when a job fails (its error text and backtrace are
    /// recorded in the store; the job is marked failed; later runs stay queued) or when the
    /// store fails.
    pub fn drain(&mut self) -> std::result::Result<RunSummary, Box<RunFailed>> {
        if self.isolate {
            return super::worker::drain_isolated(self);
        }
        let queue = self.queue.clone();
        let total = queue.len();
        let mut outcomes: Vec<Option<Outcome>> = vec![None; total];
        let mut waiting: Vec<usize> = Vec::new();
        let fail = |outcomes: &[Option<Outcome>], cause| {
            Box::new(RunFailed {
                summary: summary_of(&queue, outcomes),
                cause,
            })
        };
        for (i, p) in queue.iter().enumerate() {
            let decision = match self.decide_in_store(p) {
                Ok(d) => d,
                Err(e) => return Err(fail(&outcomes, FailureCause::Store(e))),
            };
            match decision.action {
                Action::Skip => {
                    outcomes[i] = Some(Outcome::Skipped {
                        reasons: decision.reasons.clone(),
                    });
                    self.emit(Event::Skipped {
                        index: i + 1,
                        total,
                        decision,
                    });
                }
                Action::Wait => waiting.push(i),
                Action::Run => {
                    if self.execute_into(&queue, &mut outcomes, i, decision)? {
                        waiting.push(i);
                    }
                }
            }
        }
        // Runs held by other processes: wait for their result, or take them over if their
        // holder dies. Each wait is announced once per holder, not at every poll.
        let mut announced: HashMap<usize, String> = HashMap::new();
        while !waiting.is_empty() {
            let mut still = Vec::new();
            for &i in &waiting {
                let p = &queue[i];
                let rec = match self.store.record(&p.key) {
                    Ok(r) => r,
                    Err(e) => return Err(fail(&outcomes, FailureCause::Store(e))),
                };
                let live = match self.store.claim_info(&p.key) {
                    Ok(c) => c.filter(|c| c.live),
                    Err(e) => return Err(fail(&outcomes, FailureCause::Store(e))),
                };
                match (rec, live) {
                    (Some(r), _) if r.status == Status::Done => {
                        let by = r.owner.map(|o| o.to_string()).unwrap_or_default();
                        outcomes[i] = Some(Outcome::Skipped {
                            reasons: vec![format!("done by {by}")],
                        });
                    }
                    (Some(r), None) if r.status == Status::Failed => {
                        outcomes[i] = Some(Outcome::Failed {
                            failure: r.error.unwrap_or_else(|| {
                                failure("error", "failed in another process".into(), None)
                            }),
                        });
                        return Err(self.job_failed(&queue, &outcomes, i));
                    }
                    (_, Some(c)) => {
                        let holder = c.owner.to_string();
                        if announced.get(&i) != Some(&holder) {
                            announced.insert(i, holder.clone());
                            self.emit(Event::Waiting { key: p.key, holder });
                        }
                        still.push(i);
                    }
                    _ => {
                        let decision = match self.decide_in_store(p) {
                            Ok(d) => d,
                            Err(e) => return Err(fail(&outcomes, FailureCause::Store(e))),
                        };
                        if self.execute_into(&queue, &mut outcomes, i, decision)? {
                            still.push(i);
                        }
                    }
                }
            }
            waiting = still;
            if !waiting.is_empty() {
                std::thread::sleep(self.wait_poll);
            }
        }
        self.queue.clear();
        self.queued_keys.clear();
        Ok(summary_of(&queue, &outcomes))
    }

    /// Executes run `i` of `queue` in this process and records its outcome. `Ok(true)`: another
    /// process holds it (wait); `Err`: the run failed (the drain stops) or the store failed.
    fn execute_into(
        &mut self,
        queue: &[PendingRun],
        outcomes: &mut [Option<Outcome>],
        i: usize,
        decision: JobDecision,
    ) -> std::result::Result<bool, Box<RunFailed>> {
        match self.try_execute(i, queue.len(), &queue[i], decision) {
            Ok(Some(o)) => {
                let failed = matches!(o, Outcome::Failed { .. });
                outcomes[i] = Some(o);
                if failed {
                    return Err(self.job_failed(queue, outcomes, i));
                }
                Ok(false)
            }
            Ok(None) => Ok(true),
            Err(e) => Err(Box::new(RunFailed {
                summary: summary_of(queue, outcomes),
                cause: FailureCause::Store(e),
            })),
        }
    }

    pub(super) fn job_failed(
        &mut self,
        queue: &[PendingRun],
        outcomes: &[Option<Outcome>],
        i: usize,
    ) -> Box<RunFailed> {
        let p = &queue[i];
        // Keep the failed run and everything not yet done queued, for a later drain.
        self.queue = queue
            .iter()
            .zip(outcomes)
            .filter(|(_, o)| !matches!(o, Some(Outcome::Ran { .. } | Outcome::Skipped { .. })))
            .map(|(p, _)| p.clone())
            .collect();
        self.queued_keys = self.queue.iter().map(|p| p.key).collect();
        let failure = match &outcomes[i] {
            Some(Outcome::Failed { failure }) => failure.clone(),
            _ => failure("error", "unknown failure".into(), None),
        };
        let error_file = self.store.failure_file(&p.key);
        Box::new(RunFailed {
            summary: summary_of(queue, outcomes),
            cause: FailureCause::Job {
                key: p.key,
                job: p.job.to_string(),
                failure,
                error_file,
            },
        })
    }

    /// Claims and executes one run. `Ok(None)`: another process holds it.
    pub(super) fn try_execute(
        &self,
        index: usize,
        total: usize,
        p: &PendingRun,
        decision: JobDecision,
    ) -> std::result::Result<Option<Outcome>, StoreError> {
        match self.store.claim(&p.key, &self.owner, decision.replaces)? {
            ClaimOutcome::Claimed(c) => self.execute(index, total, p, decision, c).map(Some),
            ClaimOutcome::Busy(_) => Ok(None),
            ClaimOutcome::Done(r) => {
                let by = r.owner.map(|o| o.to_string()).unwrap_or_default();
                Ok(Some(Outcome::Skipped {
                    reasons: vec![format!("done by {by}")],
                }))
            }
        }
    }

    fn execute(
        &self,
        index: usize,
        total: usize,
        p: &PendingRun,
        decision: JobDecision,
        claim: crate::store::Claim,
    ) -> std::result::Result<Outcome, StoreError> {
        let params: serde_json::Value =
            serde_json::from_str(&p.params).unwrap_or(serde_json::Value::Null);
        let mut rec = JobRecord {
            format: FORMAT_VERSION,
            key: p.key,
            job: p.job.to_string(),
            params,
            param_order: p.param_order.to_vec(),
            lineage: p.lineage,
            owned: (*p.owned).clone(),
            witnesses: self.witnesses.clone(),
            status: Status::Running,
            attempt: claim.attempt,
            owner: Some(self.owner.clone()),
            started_at: unix_now(),
            finished_at: None,
            error: None,
            metrics: None,
        };
        self.store.start(&claim, &rec)?;
        self.emit(Event::Started {
            index: index + 1,
            total,
            decision,
        });
        let sink = self.store.metric_sink(&claim)?;
        let mut run = Run::new(p.key, claim.attempt, sink, self.store.artifact_dir(&p.key));
        let t0 = Instant::now();
        let result = self.with_heartbeat(&claim, || panics::catch(|| (p.call)(&mut run)));
        let seconds = t0.elapsed().as_secs_f64();
        let mut sink = run.into_sink();
        sink.sync()?;
        rec.metrics = Some(sink.summary());
        rec.finished_at = Some(unix_now());
        let outcome = match result {
            Ok(Ok(())) => {
                rec.status = Status::Done;
                Outcome::Ran { seconds }
            }
            Ok(Err(e)) => {
                let mut chain = Vec::new();
                let mut src = e.source();
                while let Some(s) = src {
                    chain.push(s.to_string());
                    src = s.source();
                }
                let debug = format!("{e:?}");
                let bt =
                    (debug.contains("backtrace") || debug.contains("Backtrace")).then_some(debug);
                let mut f = failure("error", e.to_string(), bt);
                f.chain = chain;
                rec.status = Status::Failed;
                rec.error = Some(f.clone());
                Outcome::Failed { failure: f }
            }
            Err((msg, bt)) => {
                let f = failure("panic", msg, Some(bt));
                rec.status = Status::Failed;
                rec.error = Some(f.clone());
                Outcome::Failed { failure: f }
            }
        };
        self.store.finish(&claim, &rec)?;
        match &outcome {
            Outcome::Ran { seconds } => self.emit(Event::Finished {
                index: index + 1,
                total,
                key: p.key,
                seconds: *seconds,
                rows: rec.metrics.as_ref().map(|m| m.rows).unwrap_or(0),
            }),
            Outcome::Failed { failure } => self.emit(Event::Failed {
                index: index + 1,
                total,
                key: p.key,
                failure: failure.clone(),
            }),
            _ => {}
        }
        Ok(outcome)
    }

    /// Runs `f` while a thread renews the claim's heartbeat every 10 s.
    fn with_heartbeat<T>(&self, claim: &crate::store::Claim, f: impl FnOnce() -> T) -> T {
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            s.spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) =
                    stop_rx.recv_timeout(Duration::from_secs(10))
                {
                    let _ = self.store.heartbeat(claim);
                }
            });
            let out = f();
            drop(stop_tx);
            out
        })
    }

    /// Drains, then returns metric `metric` of this sweep's runs as a table
    /// `[step, value, *params, job_key]`, runs in enqueue order.
    ///
    /// Because it drains first, a run whose last attempt failed is attempted again here (as in
    /// any drain); to read what is recorded without running anything, use
    /// [`metrics::collect`](crate::metrics::collect) on [`store`](Self::store).
    ///
    /// # Errors
    /// [`Error::RunFailed`] when the drain fails; [`Error::Metrics`] with
    /// [`MetricsError::UnknownMetric`] (naming the metrics that exist) when no run recorded it.
    pub fn get(&mut self, metric: &str) -> Result<MetricTable> {
        self.drain()?;
        let keys: Vec<Hash> = self.enqueued.iter().map(|p| p.key).collect();
        let recs = self.store.records(&keys)?;
        let mut jobs = Vec::with_capacity(keys.len());
        let mut available = std::collections::BTreeSet::new();
        let mut any = false;
        for (p, rec) in self.enqueued.iter().zip(&recs) {
            let Some(rec) = rec else { continue };
            if let Some(m) = &rec.metrics {
                available.extend(m.names.iter().cloned());
                any |= m.names.iter().any(|n| n == metric);
            }
            jobs.push(JobRows {
                key: p.key,
                params: &rec.params,
                param_order: &p.param_order,
                series: self.store.metrics(&p.key, Some(metric))?,
            });
        }
        if !any {
            return Err(MetricsError::UnknownMetric {
                metric: metric.to_string(),
                available: available.into_iter().collect(),
            }
            .into());
        }
        Ok(build_table(&jobs, false)?)
    }

    /// Names of the metrics this sweep's finished runs recorded, sorted.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub fn metrics(&self) -> Result<Vec<String>> {
        let keys: Vec<Hash> = self.enqueued.iter().map(|p| p.key).collect();
        let mut names = std::collections::BTreeSet::new();
        for rec in self.store.records(&keys)?.into_iter().flatten() {
            if let Some(m) = rec.metrics {
                names.extend(m.names);
            }
        }
        Ok(names.into_iter().collect())
    }

    /// The folder of a job's artifacts, where the store has one.
    pub fn artifact_dir(&self, key: &Hash) -> Option<PathBuf> {
        self.store.artifact_dir(key)
    }
}

pub(super) fn failure(kind: &str, message: String, backtrace: Option<String>) -> Failure {
    Failure {
        kind: kind.to_string(),
        message,
        chain: Vec::new(),
        backtrace,
    }
}

pub(super) fn summary_of(queue: &[PendingRun], outcomes: &[Option<Outcome>]) -> RunSummary {
    RunSummary {
        jobs: queue
            .iter()
            .zip(outcomes)
            .map(|(p, o)| JobOutcome {
                key: p.key,
                job: p.job.to_string(),
                params: p.params.to_string(),
                outcome: o.clone().unwrap_or(Outcome::Pending),
            })
            .collect(),
    }
}
