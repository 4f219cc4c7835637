//! [`Orchestrator`]: the sweep engine's state (the queue, the enqueued runs, the options) and
//! its public API. Deciding lives in `decision`, executing in `execute` (in process) and
//! `worker` (isolated); they return what happened and this file updates the queue.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::builder::OrchestratorBuilder;
use super::cancel::{Cancel, CancelOnDrop, CancellationToken};
use super::decision::{Decider, JobDecision, Plan};
use super::entry::Entry;
use super::execute::{Drained, Engine, EventFn, Stop, failure, summary_of};
use super::job::Job;
use super::key_index::{KeyIndex, MAX_RUNS};
use super::param_shape::Traced;
use super::params_check::ParamsCheck;
use super::pending::{PendingRun, RunShape, RunSpec};
use super::summary::{FailureCause, Outcome, RunFailed, RunSummary};
use crate::error::{Error, Result};
use crate::executor::{Executor, InProcess};
use crate::identity::{
    self, Hash, Modules, OwnedCode, OwnedDigest, ParamError, ParamType, Witnesses,
};
use crate::metrics::{JobMeta, JobRows, MetricTable, MetricsError, RESERVED_COLUMNS, build_table};
use crate::store::{FsStore, Owner, Store};

/// A run's top-level parameter names (in order) and their column types.
/// What a [`RunShape`] is found by: the job, its code, the parameters' type, and their names
/// and value types as `canonical_params` reports them.
struct ShapeEntry {
    ty: std::any::TypeId,
    job: Arc<str>,
    entry: Entry,
    owned: Arc<OwnedDigest>,
    fields: Vec<Cow<'static, str>>,
    types: Vec<(Cow<'static, str>, ParamType)>,
    shape: Arc<RunShape>,
}

/// What a built [`Orchestrator`] starts from (see [`OrchestratorBuilder::build`]).
pub(super) struct Parts<S, E> {
    pub(super) store: S,
    pub(super) executor: E,
    pub(super) modules: Modules,
    pub(super) force: bool,
    pub(super) witnesses: Witnesses,
    pub(super) on_event: Option<EventFn>,
    pub(super) wait_poll: Duration,
    /// Where isolated runs write task files; `None`: runs execute in process.
    pub(super) tasks_dir: Option<PathBuf>,
    /// Compiled identities, the per-job build witnesses and `trace(true)` re-checks.
    pub(super) identity: super::identity::JobIdentities,
    /// Cancels every drain of the sweep.
    pub(super) cancel: Option<CancellationToken>,
    /// Ctrl-C cancels a blocking drain.
    pub(super) ctrl_c: bool,
    /// Runs whose record is corrupt are repaired (moved aside and run), not left alone.
    pub(super) repair: bool,
    /// The most memory the queue and plan may take.
    pub(super) memory: MemoryBound,
}

/// The most memory a sweep's queue and plan may take, bytes, and where the figure comes from.
pub(super) struct MemoryBound {
    pub(super) limit: u64,
    pub(super) source: String,
}

impl MemoryBound {
    /// Half of what this process may use (`sys::memory_available`): the other half is for the
    /// drain, the jobs and the store's indexes.
    pub(super) fn default_for_this_process() -> Self {
        match crate::sys::memory_available() {
            Some((bytes, from)) => MemoryBound {
                limit: bytes / 2,
                source: format!("half of the {bytes} bytes of {from} when the sweep was built"),
            },
            None => MemoryBound {
                limit: u64::MAX,
                source: "no memory figure could be read".into(),
            },
        }
    }
}

/// The memory one enqueued run costs beside its parameters' text, bytes: its spec and handle,
/// its places in the queue, the enqueued list and the key index, and its plan decision
/// (measured: the `hot_paths` bench's 1M-run case).
const RUN_BYTES: u64 = (std::mem::size_of::<RunSpec>()
    + std::mem::size_of::<JobDecision>()
    + 16 // the spec's reference counts
    + 16 // the allocator's headers of the spec and the parameters
    + 32 // queue and enqueued list, at half their capacity after a growth
    + 12) as u64; // key index slot (4 bytes and a control byte), at its lowest load

/// Runs a sweep: enqueue runs with [`run`](Self::run), see what would happen with
/// [`plan`](Self::plan), execute what is not done with [`drain`](Self::drain), read metrics with
/// [`get`](Self::get).
///
/// A run's key is the hash of the job's name, its parameters (canonical JSON) and its owned
/// code (for [`job!`](crate::job) jobs, fixed at compile time: see
/// [`CompiledCode`](crate::identity::CompiledCode)). A run is executed when the store has no
/// result for its key, its last attempt failed or was interrupted, its recorded witnesses (Cargo.lock, toolchain, source commit) differ, or the
/// orchestrator is forced; otherwise it is skipped. Several processes may drain one store: each
/// run executes once.
pub struct Orchestrator<S: Store = FsStore, E: Executor = InProcess> {
    /// Shared with the thread of a [`drain_async`](Self::drain_async).
    store: Arc<S>,
    executor: Arc<E>,
    modules: Modules,
    force: bool,
    witnesses: Witnesses,
    owned_cache: Vec<(PathBuf, PathBuf, Modules, Arc<OwnedDigest>)>,
    params_check: ParamsCheck,
    job_names: HashMap<String, Arc<str>>,
    /// Parameter names and types shared by the runs that have them (most sweeps: one shape
    /// per job), so a run holds two pointers instead of its own copies; found without
    /// allocating from what `canonical_params` returns.
    shapes: Vec<ShapeEntry>,
    /// Per parameters type: its traced column types (`None`: it cannot be traced).
    traced: HashMap<std::any::TypeId, Option<Arc<BTreeMap<String, Traced>>>>,
    queue: Vec<PendingRun>,
    enqueued: Vec<PendingRun>,
    /// Per enqueued key: its index in `enqueued` and whether it is in `queue`.
    keys: KeyIndex,
    identity: super::identity::JobIdentities,
    on_event: Option<EventFn>,
    owner: Owner,
    wait_poll: Duration,
    tasks_dir: Option<PathBuf>,
    cancel: Option<CancellationToken>,
    ctrl_c: bool,
    repair: bool,
    memory: MemoryBound,
    /// Estimated bytes of the enqueued runs (see [`RUN_BYTES`]).
    memory_used: u64,
}

impl Orchestrator<FsStore, InProcess> {
    /// A builder with the defaults (see [`OrchestratorBuilder`]).
    pub fn builder() -> OrchestratorBuilder<FsStore, InProcess> {
        OrchestratorBuilder::new()
    }
}

impl<S: Store, E: Executor> Orchestrator<S, E> {
    pub(super) fn new(p: Parts<S, E>) -> Self {
        Orchestrator {
            store: Arc::new(p.store),
            executor: Arc::new(p.executor),
            modules: p.modules,
            force: p.force,
            witnesses: p.witnesses,
            owned_cache: Vec::new(),
            params_check: ParamsCheck::default(),
            job_names: HashMap::new(),
            shapes: Vec::new(),
            traced: HashMap::new(),
            queue: Vec::new(),
            enqueued: Vec::new(),
            keys: KeyIndex::default(),
            identity: p.identity,
            on_event: p.on_event,
            owner: Owner::current(),
            wait_poll: p.wait_poll,
            tasks_dir: p.tasks_dir,
            cancel: p.cancel,
            ctrl_c: p.ctrl_c,
            repair: p.repair,
            memory: p.memory,
            memory_used: 0,
        }
    }

    /// Enqueues a run of `job` with `params` and returns its key, computed now.
    ///
    /// Enqueuing the same key twice keeps one run.
    ///
    /// # Errors
    /// [`Error::Params`] when the parameters cannot be encoded (NaN, infinity, a reserved
    /// top-level name `step`/`value`/`job_key`, non-scalar map keys) or do not encode the same
    /// in every process ([`ParamError::Unordered`]: a `HashSet` at any depth; use a
    /// `BTreeSet`), naming the parameter's path; [`Error::Identity`] when the job's source files cannot be read.
    pub fn run<P>(&mut self, job: &Job<P>, params: P) -> Result<Hash>
    where
        P: Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        let bad = |source| Error::Params {
            job: job.name().to_string(),
            source,
        };
        let canon = identity::canonical_params(&params).map_err(bad)?;
        // The order check first: an unordered set also fails the round trip, and its error
        // names the set and the fix.
        self.params_check.check::<P>(&canon.json).map_err(bad)?;
        self.params_check
            .round_trip::<P>(&canon.json)
            .map_err(bad)?;
        if let Some(r) = canon
            .fields
            .iter()
            .find(|f| RESERVED_COLUMNS.contains(&f.as_ref()))
        {
            return Err(bad(ParamError::Reserved {
                name: r.to_string(),
            }));
        }
        let owned = self.owned_for(job)?;
        let key = identity::job_key(job.name(), &canon.json, &owned.digest);
        if let Some((i, queued)) = self.keys.get(&key, &self.enqueued) {
            if !queued {
                // Enqueued before and drained; enqueue again so a new drain re-checks it.
                self.keys.set_queued(&key, &self.enqueued, true);
                self.queue.push(self.enqueued[i].clone());
            }
            return Ok(key);
        }
        // The parameters are kept as their values only when they are an object.
        let text = match canon.values.len() {
            0 => canon.json.len(),
            n => canon.values.iter().map(|r| r.len()).sum::<usize>() + n - 1,
        };
        let bytes = self.memory_used + RUN_BYTES + text as u64;
        if bytes > self.memory.limit || self.enqueued.len() >= MAX_RUNS {
            let (limit, bound) = if bytes > self.memory.limit {
                (self.memory.limit, self.memory.source.clone())
            } else {
                (bytes, format!("at most {MAX_RUNS} runs per sweep"))
            };
            return Err(Error::TooLarge {
                runs: self.enqueued.len() + 1,
                bytes,
                limit,
                bound,
            });
        }
        let entry = Entry::of::<P>(job.func());
        let (shape, shared) = self.shape::<P>(job.name(), entry, owned, canon.fields, canon.types);
        // A shape no other run shares keeps its run's whole text (its names once per run).
        let values = if shared { &canon.values[..] } else { &[] };
        let lineage = identity::lineage_key(job.name(), &canon.json);
        let pending = PendingRun::new(RunSpec::new(key, lineage, &canon.json, values, &shape));
        if self.enqueued.is_empty() {
            // A plan or drain follows: let the store load its done index while we enqueue.
            self.store.preload();
        }
        self.memory_used = bytes;
        self.queue.push(pending.clone());
        self.enqueued.push(pending);
        self.keys
            .insert(key, self.enqueued.len() - 1, &self.enqueued);
        Ok(key)
    }

    /// The column type of each parameter of a run of `P`: from the type (see `param_shape`)
    /// where the values cannot say it (a `None`, an enum whose runs use only unit variants),
    /// else from the serializer's calls (`serialize_u64` is `UInt`), which `from_values` holds.
    fn column_types<P: DeserializeOwned + 'static>(
        &mut self,
        mut from_values: BTreeMap<String, ParamType>,
    ) -> BTreeMap<String, ParamType> {
        let traced = self
            .traced
            .entry(std::any::TypeId::of::<P>())
            .or_insert_with(|| super::param_shape::trace::<P>().map(Arc::new));
        for (name, t) in traced.iter().flat_map(|t| t.iter()) {
            match (t, from_values.get(name)) {
                (_, None) => {
                    from_values.insert(name.clone(), t.column());
                }
                // A unit variant serializes as a string, a data variant as JSON: the enum's
                // type says which every value is written as.
                (Traced::Enum { .. }, Some(ParamType::String | ParamType::Json)) => {
                    from_values.insert(name.clone(), t.column());
                }
                _ => {}
            }
        }
        from_values
    }

    /// The shape a run of `job` (its function `entry`, its owned code `owned`) with parameters
    /// of type `P` shares with the runs like it, from the names and value types
    /// `canonical_params` found (the types merged with those traced from `P`), and whether it
    /// is kept for later runs.
    fn shape<P: DeserializeOwned + 'static>(
        &mut self,
        job: &str,
        entry: Entry,
        owned: Arc<OwnedDigest>,
        fields: Vec<Cow<'static, str>>,
        types: Vec<(Cow<'static, str>, ParamType)>,
    ) -> (Arc<RunShape>, bool) {
        let ty = std::any::TypeId::of::<P>();
        if let Some(e) = self.shapes.iter().find(|e| {
            e.ty == ty
                && e.entry == entry
                && Arc::ptr_eq(&e.owned, &owned)
                && *e.job == *job
                && e.fields == fields
                && e.types == types
        }) {
            return (e.shape.clone(), true);
        }
        let name = match self.job_names.get(job) {
            Some(n) => n.clone(),
            None => {
                let n: Arc<str> = job.into();
                self.job_names.insert(job.to_string(), n.clone());
                n
            }
        };
        let merged =
            self.column_types::<P>(types.iter().map(|(k, t)| (k.to_string(), *t)).collect());
        let names: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
        let shape = Arc::new(RunShape::new(
            name.clone(),
            names.into(),
            Arc::new(merged),
            owned.clone(),
            entry,
        ));
        // Parameters whose names vary per run (maps, skipped fields) are not worth a long scan.
        let keep = self.shapes.len() < 64;
        if keep {
            self.shapes.push(ShapeEntry {
                ty,
                job: name,
                entry,
                owned,
                fields,
                types,
                shape: shape.clone(),
            });
        }
        (shape, keep)
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

    /// A decider for one plan, drain or decision (with its own budget of "nearest" hints).
    fn decider(&self) -> Decider<'_, S> {
        self.identity.reset_hints();
        Decider::new(&*self.store, &self.witnesses, self.force, &self.identity)
            .repairing(self.repair)
    }

    fn engine<'a>(&'a self, cancel: &'a Cancel) -> Engine<'a, S> {
        Engine {
            decider: self.decider(),
            owner: &self.owner,
            on_event: self.on_event.as_ref(),
            wait_poll: self.wait_poll,
            cancel,
        }
    }

    /// What a drain would do with `run`, and why. Executes nothing.
    ///
    /// # Errors
    /// [`Error::Store`] when the store cannot be read.
    pub fn decide(&self, run: &PendingRun) -> Result<JobDecision> {
        Ok(self.decider().decide(run)?)
    }

    /// The decision for every queued run, in enqueue order. Executes nothing.
    ///
    /// # Errors
    /// [`Error::Store`] when the store cannot be read.
    pub fn plan(&self) -> Result<Plan> {
        Ok(self.decider().plan(&self.queue)?)
    }

    /// Executes every queued run that is not done, in enqueue order, in this process; waits for
    /// runs other processes hold. Stops at the first failure.
    ///
    /// A run that finished well is committed (its metrics and done record made durable, see
    /// [`FsStore`]'s fsync budget) by a committer thread while the next runs execute, so its
    /// [`Event::Finished`](super::Event::Finished) may come after the next run's `Started`;
    /// the drain returns once every commit is durable; runs that finish while a commit is in
    /// flight are committed together (one flush for the batch). A run's start (its running
    /// record, [`Store::start`]) is written by a committer too, as the run begins: a run that
    /// ends before a committer gets to it (a trivial one) has no running record, only its
    /// done record and its lineage pointer. A crash of the process before a run's commit
    /// leaves it interrupted: the next drain runs it again.
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
        let queue = self.queue.clone();
        let cancel = Cancel::child_of(self.cancel.as_ref());
        let _ctrl_c = self
            .ctrl_c
            .then(|| super::interrupt::Guard::install(&[libc::SIGINT], &cancel));
        let engine = self.engine(&cancel);
        let drained = match &self.tasks_dir {
            Some(dir) => super::worker::drain_isolated(&engine, &*self.executor, dir, &queue),
            None => engine.drain(&queue),
        };
        self.conclude_drain(&queue, drained)
    }

    /// [`drain`](Self::drain) for async drivers. The drain runs on a thread of its own (jobs
    /// are plain blocking functions; isolated runs are polled there on a runtime of its own),
    /// so the caller's runtime is never blocked, whatever its flavour, and the future is
    /// `Send`: spawn it with the sweep moved in,
    /// `tokio::spawn(async move { let r = sweep.drain_async().await; (sweep, r) })`.
    ///
    /// **Dropping the future cancels the drain** (`tokio::time::timeout`, `tokio::select!`
    /// with `tokio::signal::ctrl_c()`, an aborted task): the job running in process is told
    /// through [`Run::is_cancelled`](super::Run::is_cancelled) and the errors of [`Run::log`](super::Run::log)/[`Run::flush`](super::Run::flush) and is
    /// recorded as interrupted once it returns; isolated workers are cancelled through the
    /// executor and recorded as interrupted; nothing is recorded as failed, and no run starts
    /// after the drop. The drain's thread ends as soon as the running job returns (a job that
    /// never logs nor asks runs to its end). The sweep's
    /// [`cancellation_token`](OrchestratorBuilder::cancellation_token) does the same and
    /// returns [`FailureCause::Cancelled`].
    ///
    /// ```
    /// # use puzzletron::{JobResult, Run};
    /// # use puzzletron::{store::MemoryStore, Orchestrator, job};
    /// # fn train(p: &u32, run: &mut Run) -> JobResult { run.log("x", 0, f64::from(*p))?; Ok(()) }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> puzzletron::Result<()> {
    /// let mut sweep = Orchestrator::builder().store(MemoryStore::new()).build()?;
    /// sweep.run(&job!(train), 7)?;
    /// let task = tokio::spawn(async move {
    ///     let summary = sweep.drain_async().await;
    ///     (sweep, summary)
    /// });
    /// let (sweep, summary) = task.await.expect("the drain task ran");
    /// assert_eq!(summary?.ran(), 1);
    /// # let _ = sweep;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`drain`](Self::drain).
    pub async fn drain_async(&mut self) -> std::result::Result<RunSummary, Box<RunFailed>>
    where
        S: 'static,
        E: 'static,
    {
        let queue = self.queue.clone();
        let cancel = Cancel::child_of(self.cancel.as_ref());
        let on_drop = CancelOnDrop::new(cancel.clone());
        let ctx = DrainContext {
            store: self.store.clone(),
            executor: self.executor.clone(),
            witnesses: self.witnesses.clone(),
            force: self.force,
            repair: self.repair,
            identity: self.identity.clone(),
            on_event: self.on_event.clone(),
            owner: self.owner.clone(),
            wait_poll: self.wait_poll,
            tasks_dir: self.tasks_dir.clone(),
            cancel,
            queue: queue.clone(),
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("puzzletron-drain".into())
            .spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ctx.drain()));
                let _ = tx.send(r);
            });
        let drained = match spawned {
            Ok(_) => match rx.await {
                Ok(Ok(d)) => d,
                Ok(Err(panic)) => std::panic::resume_unwind(panic),
                // The thread sends before it ends, panics included.
                Err(_) => unreachable!("the drain thread ended without an answer"),
            },
            Err(e) => Drained {
                outcomes: vec![None; queue.len()],
                stop: Some(Stop::Cause(FailureCause::Store(
                    crate::store::StoreError::Io {
                        path: PathBuf::from("(drain thread)"),
                        source: e,
                    },
                ))),
            },
        };
        on_drop.disarm();
        self.conclude_drain(&queue, drained)
    }

    /// Updates the queue from what a drain of `queue` did: empty when all went well; the failed
    /// run and everything not done when a job failed; unchanged when the store failed.
    fn conclude_drain(
        &mut self,
        queue: &[PendingRun],
        drained: Drained,
    ) -> std::result::Result<RunSummary, Box<RunFailed>> {
        let Drained { outcomes, stop } = drained;
        // The runs reused are the current code's: their lineages name them from now on (else
        // a revert leaves them reported as superseded, and `sweep gc` removes them).
        let reused: Vec<(Hash, Hash)> = queue
            .iter()
            .zip(&outcomes)
            .filter(|(_, o)| matches!(o, Some(Outcome::Skipped { .. })))
            .map(|(p, _)| (p.lineage, p.key))
            .collect();
        if !reused.is_empty()
            && let Err(e) = self.store.reuse(&reused)
        {
            // Bookkeeping for reports only: the results stand.
            tracing::warn!(
                runs = reused.len(),
                error = %e,
                "could not point the lineages of reused runs at them"
            );
        }
        let corrupt: Vec<Hash> = queue
            .iter()
            .zip(&outcomes)
            .filter(|(_, o)| matches!(o, Some(Outcome::Corrupt { .. })))
            .map(|(p, _)| p.key)
            .collect();
        match stop {
            // Every other run was drained: the corrupt ones stay queued, named in the error.
            None if !corrupt.is_empty() => {
                self.keep_unfinished(queue, &outcomes);
                Err(Box::new(RunFailed {
                    summary: summary_of(queue, &outcomes),
                    cause: FailureCause::Corrupt { keys: corrupt },
                }))
            }
            None => {
                self.queue.clear();
                self.keys.clear_queued();
                Ok(summary_of(queue, &outcomes))
            }
            Some(Stop::Cause(FailureCause::Cancelled)) => {
                self.keep_unfinished(queue, &outcomes);
                Err(Box::new(RunFailed {
                    summary: summary_of(queue, &outcomes),
                    cause: FailureCause::Cancelled,
                }))
            }
            Some(Stop::Cause(cause)) => Err(Box::new(RunFailed {
                summary: summary_of(queue, &outcomes),
                cause,
            })),
            Some(Stop::JobFailed(i)) => {
                self.keep_unfinished(queue, &outcomes);
                let p = &queue[i];
                let failure = match &outcomes[i] {
                    Some(Outcome::Failed { failure }) => failure.clone(),
                    _ => failure("error", "unknown failure".into(), None),
                };
                let error_file = self.store.job_files().and_then(|f| f.failure_file(&p.key));
                Err(Box::new(RunFailed {
                    summary: summary_of(queue, &outcomes),
                    cause: FailureCause::Job {
                        key: p.key,
                        job: p.job().to_string(),
                        failure,
                        error_file,
                    },
                }))
            }
        }
    }

    /// Keeps the runs of `queue` that did not run or skip queued (failed, interrupted, not
    /// reached), for a later drain.
    fn keep_unfinished(&mut self, queue: &[PendingRun], outcomes: &[Option<Outcome>]) {
        self.queue = queue
            .iter()
            .zip(outcomes)
            .filter(|(_, o)| !matches!(o, Some(Outcome::Ran { .. } | Outcome::Skipped { .. })))
            .map(|(p, _)| p.clone())
            .collect();
        self.keys.clear_queued();
        for p in &self.queue {
            self.keys.set_queued(&p.key, &self.enqueued, true);
        }
    }

    /// Drains, then returns metric `metric` of this sweep's runs as a table
    /// `[step, value, *params, job_key]`, runs in enqueue order.
    ///
    /// Because it drains first, a run whose last attempt failed is attempted again here (as in
    /// any drain); to read what is recorded without running anything, use
    /// [`recorded`](Self::recorded) (this sweep's runs) or
    /// [`MetricsExt::metric_table`](crate::metrics::MetricsExt::metric_table) (every run in a store).
    ///
    /// # Errors
    /// [`Error::RunFailed`] when the drain fails; [`Error::Metrics`] with
    /// [`MetricsError::UnknownMetric`] (naming the metrics that exist) when no run recorded it.
    pub fn get(&mut self, metric: &str) -> Result<MetricTable> {
        self.drain()?;
        self.recorded(metric)
    }

    /// [`get`](Self::get) for async drivers: [`drain_async`](Self::drain_async), then
    /// [`recorded`](Self::recorded).
    ///
    /// # Errors
    /// As [`get`](Self::get).
    pub async fn get_async(&mut self, metric: &str) -> Result<MetricTable>
    where
        S: 'static,
        E: 'static,
    {
        self.drain_async().await?;
        self.recorded(metric)
    }

    /// Metric `metric` of this sweep's enqueued runs as they are recorded now, as a table
    /// `[step, value, *params, job_key]`, runs in enqueue order; runs without a done record add
    /// no rows. Runs nothing: enqueue a finished sweep's grid with [`run`](Self::run) (which
    /// only computes keys) and call this to read its results.
    ///
    /// # Errors
    /// [`Error::Store`] when a record cannot be read; [`Error::Metrics`] with
    /// [`MetricsError::UnknownMetric`] (naming the metrics that exist) when no run recorded it.
    pub fn recorded(&self, metric: &str) -> Result<MetricTable> {
        let recs = self.enqueued_records()?;
        let done = self.done_with_metric(&recs, metric)?;
        let mut jobs = Vec::with_capacity(done.len());
        for &(p, rec) in &done {
            jobs.push(JobRows {
                meta: JobMeta {
                    key: p.key,
                    params: &rec.params,
                    param_order: p.param_order(),
                    param_types: param_types(p, rec),
                },
                series: self.store.record_metrics(rec, Some(metric))?,
            });
        }
        Ok(build_table(&jobs, false)?)
    }

    /// [`recorded`](Self::recorded)`(metric)` written to `path` as Parquet in bounded memory
    /// (a few runs' rows, read ahead, and one batch of at most 65,536 rows at a time; see
    /// [`MetricsExt::write_metric_parquet`](crate::metrics::MetricsExt::write_metric_parquet) for the file).
    /// Runs nothing: [`drain`](Self::drain) first to run what is pending. Returns the number of
    /// rows written.
    ///
    /// # Errors
    /// As [`recorded`](Self::recorded), and [`Error::Metrics`] with
    /// [`MetricsError::Io`]/[`MetricsError::Parquet`] naming `path`.
    #[cfg(feature = "parquet")]
    #[cfg_attr(docsrs, doc(cfg(feature = "parquet")))]
    pub fn write_metric_parquet(
        &self,
        metric: &str,
        path: impl AsRef<std::path::Path>,
    ) -> Result<u64> {
        use crate::metrics::stream::write_parquet;
        let recs = self.enqueued_records()?;
        let pairs = self.done_with_metric(&recs, metric)?;
        let jobs: Vec<JobMeta> = pairs
            .iter()
            .map(|&(p, rec)| JobMeta {
                key: p.key,
                params: &rec.params,
                param_order: p.param_order(),
                param_types: param_types(p, rec),
            })
            .collect();
        let done: Vec<&crate::store::JobRecord> = pairs.iter().map(|&(_, rec)| rec).collect();
        let store = &self.store;
        Ok(write_parquet(
            &jobs,
            |sink| {
                crate::metrics::for_each_series(
                    store,
                    &done,
                    Some(metric),
                    crate::metrics::reader_threads(true),
                    sink,
                )
            },
            path.as_ref(),
        )?)
    }

    /// The stored records of the enqueued runs, in enqueue order.
    /// The records of the enqueued runs; a corrupt one reads as none (no rows: the drain and
    /// the plan name it), with a warning.
    fn enqueued_records(&self) -> Result<Vec<Option<crate::store::JobRecord>>> {
        let keys: Vec<Hash> = self.enqueued.iter().map(|p| p.key).collect();
        Ok(crate::store::records_per_key(&*self.store, &keys)?
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "a run's record cannot be read: it adds no rows");
                    None
                })
            })
            .collect())
    }

    /// The finished runs among `recs` (enqueue order) with their pending runs, or
    /// `UnknownMetric` (naming the metrics that exist) when none of them recorded `metric`.
    fn done_with_metric<'a>(
        &'a self,
        recs: &'a [Option<crate::store::JobRecord>],
        metric: &str,
    ) -> Result<Vec<(&'a PendingRun, &'a crate::store::JobRecord)>> {
        let mut out = Vec::with_capacity(recs.len());
        let mut available = std::collections::BTreeSet::new();
        let mut any = false;
        for (p, rec) in self.enqueued.iter().zip(recs) {
            let Some(rec) = rec else { continue };
            if rec.status != crate::store::Status::Done {
                continue;
            }
            if let Some(m) = &rec.metrics {
                available.extend(m.names.iter().cloned());
                any |= m.names.iter().any(|n| n == metric);
            }
            out.push((p, rec));
        }
        if !any {
            return Err(MetricsError::UnknownMetric {
                metric: metric.to_string(),
                available: available.into_iter().collect(),
            }
            .into());
        }
        Ok(out)
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

    /// The folder of a job's artifacts, where the store has one ([`Store::job_files`]); created
    /// if missing.
    pub fn artifact_dir(&self, key: &Hash) -> Option<PathBuf> {
        self.store.job_files()?.artifact_dir(key)
    }
}

/// What the thread of a [`drain_async`](Orchestrator::drain_async) owns: the sweep's shared
/// parts and copies of the rest, so the drain outlives a dropped future safely.
struct DrainContext<S: Store, E: Executor> {
    store: Arc<S>,
    executor: Arc<E>,
    witnesses: Witnesses,
    force: bool,
    repair: bool,
    identity: super::identity::JobIdentities,
    on_event: Option<EventFn>,
    owner: Owner,
    wait_poll: Duration,
    tasks_dir: Option<PathBuf>,
    cancel: Cancel,
    queue: Vec<PendingRun>,
}

impl<S: Store, E: Executor> DrainContext<S, E> {
    fn drain(&self) -> Drained {
        let engine = Engine {
            decider: Decider::new(&*self.store, &self.witnesses, self.force, &self.identity)
                .repairing(self.repair),
            owner: &self.owner,
            on_event: self.on_event.as_ref(),
            wait_poll: self.wait_poll,
            cancel: &self.cancel,
        };
        match &self.tasks_dir {
            Some(dir) => super::worker::drain_isolated(&engine, &*self.executor, dir, &self.queue),
            None => engine.drain(&self.queue),
        }
    }
}

/// A run's parameter types: this sweep's (the run's key covers its parameters' type, so they
/// describe its record too, and they are this build's, which types what older builds did not,
/// e.g. `u64` apart from `i64`), or its record's.
fn param_types<'a>(
    p: &'a PendingRun,
    rec: &'a crate::store::JobRecord,
) -> &'a std::collections::BTreeMap<String, crate::identity::ParamType> {
    if p.param_types().is_empty() {
        &rec.param_types
    } else {
        p.param_types()
    }
}
