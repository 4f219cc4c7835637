//! [`OrchestratorBuilder`]: the options of a sweep, checked once when it is built.

use std::path::PathBuf;
use std::time::Duration;

use super::cancel::CancellationToken;
use super::event::Event;
use super::execute::EventFn;
use super::orchestrator::{MemoryBound, Orchestrator};
use crate::error::{Error, Result};
use crate::executor::{Executor, InProcess};
use crate::identity::{self, Modules, Toolchain, Witnesses};
use crate::store::{FsStore, Store};

/// Builds an [`Orchestrator`]. Defaults: [`FsStore`] under `.puzzletron` in the current folder
/// (created when the sweep is built, [`FsStore::create`]),
/// in-process execution, the Cargo.lock of the jobs' build (found from their package upward),
/// no source checkout witnessed, `job!` jobs' compiled closures (the whole `src/` for
/// [`Job::new`](super::Job::new) jobs).
pub struct OrchestratorBuilder<S: Store = FsStore, E: Executor = InProcess> {
    store: StoreSource<S>,
    executor: E,
    modules: Modules,
    lock: Option<PathBuf>,
    source: Option<PathBuf>,
    force: bool,
    isolate: bool,
    trace: bool,
    on_event: Option<EventFn>,
    wait_poll: Duration,
    worker_dir: Option<PathBuf>,
    cancel: Option<CancellationToken>,
    ctrl_c: bool,
    repair: bool,
    memory_limit: Option<u64>,
}

/// Where a builder's store comes from: given, or an [`FsStore`] made at a root when the sweep
/// is built. A plain function, not a boxed closure, so that a store given by reference
/// (`&S`, not `'static`) needs no `'static` bound.
enum StoreSource<S> {
    Given(S),
    Root(PathBuf, fn(PathBuf) -> Result<S>),
}

/// Opens (creating when missing) the [`FsStore`] at `root`.
fn create_fs(root: PathBuf) -> Result<FsStore> {
    Ok(FsStore::create(root)?)
}

impl OrchestratorBuilder<FsStore, InProcess> {
    pub(super) fn new() -> Self {
        Self {
            store: StoreSource::Root(PathBuf::from(".puzzletron"), create_fs),
            executor: InProcess,
            modules: Modules::all(),
            lock: None,
            source: None,
            force: false,
            isolate: false,
            trace: false,
            on_event: None,
            wait_poll: Duration::from_millis(100),
            worker_dir: None,
            cancel: None,
            ctrl_c: true,
            repair: false,
            memory_limit: None,
        }
    }
}

impl<E: Executor> OrchestratorBuilder<FsStore, E> {
    /// Uses an [`FsStore`] at `root`, created when missing ([`FsStore::create`]) when the
    /// sweep is built.
    pub fn store_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.store = StoreSource::Root(root.into(), create_fs);
        self
    }
}

impl<S: Store, E: Executor> OrchestratorBuilder<S, E> {
    /// Uses `store`: any [`Store`], owned, or borrowed as `&store` (the sweep then borrows it:
    /// [`drain`](super::Orchestrator::drain) works, while
    /// [`drain_async`](super::Orchestrator::drain_async), which runs on a thread of its own,
    /// needs a `'static` store: owned, or an `Arc`), or shared as an `Arc`/`Box`.
    ///
    /// ```
    /// use puzzletron::{store::MemoryStore, Orchestrator, Run, JobResult, job};
    ///
    /// fn train(p: &u32, run: &mut Run) -> JobResult {
    ///     run.log("x", 0, f64::from(*p))?;
    ///     Ok(())
    /// }
    ///
    /// let store = MemoryStore::new();
    /// let mut sweep = Orchestrator::builder().store(&store).build()?;
    /// sweep.run(&job!(train), 7)?;
    /// assert_eq!(sweep.drain()?.ran(), 1);
    /// drop(sweep);
    /// // The store outlives the sweep that borrowed it.
    /// use puzzletron::metrics::MetricsExt;
    /// assert_eq!(store.metric_table("x")?.num_rows(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn store<S2: Store>(self, store: S2) -> OrchestratorBuilder<S2, E> {
        OrchestratorBuilder {
            store: StoreSource::Given(store),
            executor: self.executor,
            modules: self.modules,
            lock: self.lock,
            source: self.source,
            force: self.force,
            isolate: self.isolate,
            trace: self.trace,
            on_event: self.on_event,
            wait_poll: self.wait_poll,
            worker_dir: self.worker_dir,
            cancel: self.cancel,
            ctrl_c: self.ctrl_c,
            repair: self.repair,
            memory_limit: self.memory_limit,
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
            worker_dir: self.worker_dir,
            cancel: self.cancel,
            ctrl_c: self.ctrl_c,
            repair: self.repair,
            memory_limit: self.memory_limit,
        }
    }

    /// Which modules of each job's crate count as its code, for jobs made with
    /// [`Job::new`](super::Job::new) (default: all of `src/`; a job's own
    /// [`Job::with_modules`](super::Job::with_modules) wins; the job's file always counts).
    /// [`job!`](crate::job) jobs ignore it: their code is the compiled closure of the job
    /// function.
    pub fn owned(mut self, modules: Modules) -> Self {
        self.modules = modules;
        self
    }

    /// The Cargo.lock to witness (default: the one `job!` found at compile time from the job's
    /// package upward, or for [`Job::new`](super::Job::new) jobs the one found upward from the
    /// job's crate folder; never the current folder).
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
    ///
    /// A forced run replaces its result in place, as Snakemake's `--forcerun` deletes a rule's
    /// outputs first: when the new attempt starts, its `running` record takes the done one's
    /// place, so a forced drain that is killed leaves the run `interrupted` (it runs again at
    /// the next drain) rather than done with the old result.
    pub fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }

    /// Run each job in a fresh process of this binary through the executor (see
    /// [`worker`](crate::worker): the binary must call `puzzletron::worker::main_guard()` first
    /// in `main`). Needs a store that worker processes can reopen: an [`FsStore`], or your own
    /// [`Store`] whose [`spec`](Store::spec) names a kind registered with
    /// [`worker::main_guard_with`](crate::worker::main_guard_with).
    pub fn isolate(mut self, isolate: bool) -> Self {
        self.isolate = isolate;
        self
    }

    /// The folder for the task files of isolated runs, readable by the workers (on a cluster:
    /// a shared filesystem). Default: `isolated/` in an [`FsStore`]'s folder; required for
    /// isolated runs over a store that is not a folder.
    pub fn worker_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.worker_dir = Some(dir.into());
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
        self.on_event = Some(std::sync::Arc::new(f));
        self
    }

    /// How often a drain re-checks runs held by other processes (default 100 ms), and, with
    /// [`isolate(true)`](Self::isolate), how often it polls its workers at least (a
    /// `LocalExecutor` wakes it as soon as a worker ends).
    pub fn wait_poll(mut self, every: Duration) -> Self {
        self.wait_poll = every;
        self
    }

    /// A token that cancels this sweep's drains: once it is cancelled, a running drain stops
    /// (the job running in process is told through
    /// [`Run::is_cancelled`](super::Run::is_cancelled) and the errors of
    /// [`Run::log`](super::Run::log); isolated workers are cancelled through the executor; runs
    /// so stopped are recorded as interrupted, never as failed) and returns
    /// [`FailureCause::Cancelled`](super::FailureCause::Cancelled), and later drains start
    /// nothing. Pass a child of your program's shutdown token
    /// ([`CancellationToken::child_token`]). Dropping a
    /// [`drain_async`](super::Orchestrator::drain_async) future cancels its drain without a
    /// token.
    pub fn cancellation_token(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// Whether Ctrl-C (SIGINT) during a blocking [`drain`](super::Orchestrator::drain) cancels
    /// it as a [`cancellation_token`](Self::cancellation_token) would (default `true`): the
    /// handler is installed for the length of the drain only, and only when SIGINT has its
    /// default disposition then (a program that handles or ignores SIGINT itself keeps it, and
    /// cancels through a token); a second Ctrl-C ends the program at once. Not for
    /// [`drain_async`](super::Orchestrator::drain_async): there, drop the future (e.g. in
    /// `tokio::select!` with `tokio::signal::ctrl_c()`).
    pub fn cancel_on_ctrl_c(mut self, on: bool) -> Self {
        self.ctrl_c = on;
        self
    }

    /// Whether a drain repairs runs whose record cannot be read (default `false`).
    ///
    /// A record that cannot be parsed (truncated, emptied, not a record) makes its run
    /// *corrupt*: [`plan`](super::Orchestrator::plan) says `corrupt` with the file, what is
    /// wrong and the fix, and the other runs plan, drain and report as usual. Without repair a
    /// drain leaves a corrupt run alone (an [`Event::Corrupt`] and an
    /// [`Outcome::Corrupt`](super::Outcome::Corrupt) line), drains every other run, and then
    /// returns an error, [`FailureCause::Corrupt`](super::FailureCause::Corrupt), naming each
    /// corrupt run (they stay queued). With repair the drain moves each such record aside
    /// ([`Store::set_aside`]: an [`FsStore`] moves the job's folder to
    /// `ROOT/corrupt/KEY.UNIXSECS`, never deleting anything) and runs it again. Repair from
    /// one process at a time. `puzzletron sweep repair STORE` does the moving from a shell.
    pub fn repair(mut self, repair: bool) -> Self {
        self.repair = repair;
        self
    }

    /// Bounds the memory of the sweep's queue and plan to `bytes`: a [`run`](Orchestrator::run)
    /// that would pass it returns [`Error::TooLarge`] (naming the bound) before it allocates,
    /// so a sweep too large for the machine fails early and clearly, never by the OOM killer.
    /// A run costs about 250 bytes plus its canonical parameters' text (see the `hot_paths`
    /// bench). An orchestrator keeps every run it enqueued (for [`get`](Orchestrator::get)
    /// and [`enqueued`](Orchestrator::enqueued)) until it is dropped.
    ///
    /// Default: half the memory this process may use when the sweep is built, the smallest of
    /// its cgroup's limit (v2 `memory.max`, v1 `memory.limit_in_bytes`) and `MemAvailable`
    /// (`/proc/meminfo`); no bound where neither can be read.
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        self.memory_limit = Some(bytes);
        self
    }

    /// Opens the store and reads the witnesses.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for `isolate(true)` with an executor that
    /// starts no processes ([`InProcess`], `MockExecutor`), a store workers cannot reopen, or no
    /// folder for task files (see [`worker_dir`](Self::worker_dir));
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
        let store = match self.store {
            StoreSource::Given(s) => s,
            StoreSource::Root(root, open) => open(root)?,
        };
        let tasks_dir = if self.isolate {
            Some(super::worker::check_isolatable(
                &store,
                &self.executor,
                self.worker_dir.as_deref(),
            )?)
        } else {
            None
        };
        Ok(Orchestrator::new(super::orchestrator::Parts {
            store,
            executor: self.executor,
            modules: self.modules,
            force: self.force,
            witnesses,
            on_event: self.on_event,
            wait_poll: self.wait_poll,
            tasks_dir,
            identity: super::identity::JobIdentities::new(self.trace, self.lock.is_none()),
            cancel: self.cancel,
            ctrl_c: self.ctrl_c,
            repair: self.repair,
            memory: match self.memory_limit {
                Some(b) => MemoryBound {
                    limit: b,
                    source: "set with OrchestratorBuilder::memory_limit".into(),
                },
                None => MemoryBound::default_for_this_process(),
            },
        }))
    }
}
