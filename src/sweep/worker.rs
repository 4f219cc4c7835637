//! Isolated sweep runs: each run in a fresh process of the user's own binary ("worker mode"),
//! started through the orchestrator's [`Executor`] (local processes, Slurm jobs, ...).
//!
//! The user puts one line first in `main`, like Python's `if __name__ == "__main__":` guard:
//!
//! ```no_run
//! fn main() {
//!     puzzletron::worker::main_guard(); // in a worker process: runs one job, then exits
//!     sweep();
//! }
//!
//! fn sweep() {
//!     // build the sweep with `.isolate(true)` and an executor; run, drain, get as usual
//! }
//! ```
//!
//! How it works:
//! 1. `drain()` decides as usual, then writes one *task* file per run to execute
//!    (`<store>/isolated/<batch>/<n>.json`, or under
//!    [`worker_dir`](crate::OrchestratorBuilder::worker_dir): how to reopen the store
//!    ([`StoreSpec`]), the record fields, where the job function is, which binary), one
//!    *shared* file per job of the batch (its owned digest and the parent's witnesses, which
//!    are the same for all its runs and can be hundreds of KiB) and a manifest listing the
//!    tasks, and
//!    submits **one array** through the executor: the command is this binary
//!    ([`std::env::current_exe`]) with `PUZZLETRON_WORKER_MANIFEST` and
//!    `PUZZLETRON_WORKER_TASK_DIR` set; task `i` runs manifest entry `i`, the file `<i>.json`
//!    of that folder (`PUZZLETRON_ARRAY_INDEX`). With `LocalExecutor` that is N processes
//!    at a time; with `SlurmExecutor` one `sbatch --array`.
//! 2. In the worker, [`main_guard`] sees the variable before any user code runs, checks that it
//!    is the very binary that wrote the task (size, modification time and a digest of its first
//!    and last 64 KiB), finds the job function by its offset from an anchor function in the
//!    same binary (position-independent code keeps offsets fixed between runs of one binary),
//!    deserializes the parameters, and executes the run exactly as an in-process drain does
//!    (claim, record, metrics, heartbeat, panics caught and recorded), then exits: 0 done,
//!    1 failed, 3 held or done by another process, 2 worker error. The rest of `main` never
//!    runs in a worker.
//! 3. The parent polls the executor, and between polls waits for a worker to end
//!    ([`Executor::wait_change`]: `LocalExecutor` wakes it as soon as one of its workers exits,
//!    other executors are polled every [`wait_poll`](crate::OrchestratorBuilder::wait_poll));
//!    when a worker ends it reads the run's record. A worker
//!    that died without recording (abort, SIGKILL, OOM, node failure) fails that run only: the
//!    parent takes over its stale claim and records the failure with the executor's state,
//!    exit code, signal and the end of the worker's log.
//!
//! A parent killed meanwhile loses nothing: workers run on (local ones in their own session)
//! and record their results; the next drain finds them done, or waits for live ones.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};

use super::cancel::Cancel;
use super::decision::{Action, Decider, JobDecision};
use super::entry::Entry;
use super::event::Event;
use super::execute::{Drained, Engine, Helpers, Stop, failure};
use super::pending::{PendingRun, RunShape, RunSpec};
use super::reasons::Reasons;
use super::summary::{FailureCause, Outcome};
use crate::error::{Error, Result};
use crate::executor::{
    ARRAY_INDEX_ENV, ArraySpec, AttemptId, AttemptSpec, CommandSpec, Executor, JobHandle, JobState,
    JobStatus,
};
use crate::identity::{Hash, OwnedDigest, Witnesses};
use crate::store::{ClaimOutcome, FsStore, Owner, Status, Store, StoreError, StoreSpec};
use crate::sys::unix_now;

/// Environment variable naming the manifest of an isolated batch (set by the parent).
pub const MANIFEST_ENV: &str = "PUZZLETRON_WORKER_MANIFEST";
/// Environment variable naming one task file directly (an alternative to the manifest).
pub const TASK_ENV: &str = "PUZZLETRON_WORKER_TASK";
/// Environment variable naming the folder of a batch's task files `<i>.json`, set by the
/// parent next to [`MANIFEST_ENV`]: a worker then opens its task without parsing the manifest
/// (which lists every task: reading it in each of N workers cost O(N²)).
pub const TASK_DIR_ENV: &str = "PUZZLETRON_WORKER_TASK_DIR";

/// Worker exit codes.
const EXIT_DONE: i32 = 0;
const EXIT_FAILED: i32 = 1;
const EXIT_WORKER_ERROR: i32 = 2;
const EXIT_ELSEWHERE: i32 = 3;
/// The run was interrupted (SIGTERM or SIGINT reached the worker: a cancelled drain, `scancel`)
/// and recorded so; it runs again at the next drain.
const EXIT_INTERRUPTED: i32 = 4;

/// Version 3: the owned digest and the witnesses are in a file shared by the batch's runs of
/// one job ([`Shared`]; version 2 copied them into every task). Version 2: the store is a
/// [`StoreSpec`] (version 1 had an `FsStore` root).
const TASK_VERSION: u32 = 3;

/// Opens a user store in a worker process from its [`StoreSpec::location`]; registered for a
/// [`StoreSpec::kind`] with [`main_guard_with`].
pub type StoreOpener = fn(&str) -> std::result::Result<Box<dyn Store>, StoreError>;

/// The openers [`main_guard_with`] registered in this process (the parent registers them too:
/// it runs the same `main`, so a sweep can check at build time that its workers will have one).
static OPENERS: Mutex<Vec<(String, StoreOpener)>> = Mutex::new(Vec::new());

fn opener(kind: &str) -> Option<StoreOpener> {
    OPENERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|(k, _)| k == kind)
        .map(|(_, f)| *f)
}

/// Whether a worker of this binary can reopen a store of `kind`: `fs` always, others once
/// registered with [`main_guard_with`].
pub fn can_open(kind: &str) -> bool {
    kind == "fs" || opener(kind).is_some()
}

/// Reopens the store `spec` describes: an [`FsStore`] for kind `fs`, else the registered
/// opener.
fn open_store(spec: &StoreSpec) -> std::result::Result<Box<dyn Store>, String> {
    if spec.kind == "fs" {
        // One job per process, started at once: its claim file is written with the claim.
        return FsStore::open(&spec.location)
            .map(|s| Box::new(s.with_claim_files_at_once()) as Box<dyn Store>)
            .map_err(|e| e.to_string());
    }
    let Some(open) = opener(&spec.kind) else {
        return Err(format!(
            "no opener for store kind {:?}: call `puzzletron::worker::main_guard_with(&[({:?}, \
             opener)])` first in main",
            spec.kind, spec.kind
        ));
    };
    open(&spec.location)
        .map_err(|e| format!("opening {:?} store {:?}: {e}", spec.kind, spec.location))
}

/// Runs the isolated job this process was started for, and exits; returns at once (doing
/// nothing) in a normal run. Call it first in `main`. Workers reopen an [`FsStore`] by
/// themselves; a sweep over your own [`Store`] needs [`main_guard_with`] instead.
///
/// Exit codes of a worker: 0 the run is done, 1 it failed (recorded in the store), 2 the
/// worker could not run it (message on stderr: bad task file, a different binary, store
/// error), 3 another process holds or finished the run, 4 the run was interrupted (SIGTERM or
/// SIGINT, as a cancelled drain or `scancel` sends: the job is told through
/// [`Run::is_cancelled`](crate::Run::is_cancelled) and the run recorded as interrupted). The
/// drain that cancelled a worker reports its run interrupted; a worker stopped by a signal
/// from elsewhere (a walltime, a preemption) fails its run, with the executor's evidence.
pub fn main_guard() {
    main_guard_with(&[]);
}

/// [`main_guard`] for sweeps over your own [`Store`]: `stores` pairs each store kind your
/// sweeps use (what your [`Store::spec`] returns) with a function that opens it from its
/// location. Call it first in `main`:
///
/// ```no_run
/// use puzzletron::store::Store;
/// use puzzletron::store::{FsStore, StoreError};
///
/// fn open_mine(location: &str) -> Result<Box<dyn Store>, StoreError> {
///     Ok(Box::new(FsStore::open(location)?)) // your store's own constructor
/// }
///
/// fn main() {
///     puzzletron::worker::main_guard_with(&[("mine", open_mine)]);
///     // ... build the sweep with `.store(MyStore::open(...)?).isolate(true)`
/// }
/// ```
pub fn main_guard_with(stores: &[(&str, StoreOpener)]) {
    {
        let mut openers = OPENERS.lock().unwrap_or_else(|p| p.into_inner());
        for (kind, f) in stores {
            openers.retain(|(k, _)| k != kind);
            openers.push((kind.to_string(), *f));
        }
    }
    let task = match task_path() {
        None => return,
        Some(Ok(p)) => p,
        Some(Err(msg)) => {
            worker_error(&msg);
            std::process::exit(EXIT_WORKER_ERROR);
        }
    };
    // SAFETY: main_guard runs first in `main` (its documented contract), before the program
    // starts threads that could read the environment concurrently. The job's own child
    // processes must not inherit worker mode.
    unsafe {
        std::env::remove_var(MANIFEST_ENV);
        std::env::remove_var(TASK_ENV);
    }
    let code = match run_task(&task) {
        Ok(Some(Outcome::Ran { .. })) => EXIT_DONE,
        Ok(Some(Outcome::Failed { .. })) => EXIT_FAILED,
        Ok(Some(Outcome::Interrupted)) => EXIT_INTERRUPTED,
        Ok(_) => EXIT_ELSEWHERE,
        Err(msg) => {
            worker_error(&format!("task {}: {msg}", task.display()));
            EXIT_WORKER_ERROR
        }
    };
    std::process::exit(code);
}

/// Why a worker could not run its task: a `tracing` error, and a line on the worker's stderr
/// whatever subscriber there is (none, usually: the process is the library's, from
/// `main_guard` to its exit), because that stream is the attempt's log, whose end the parent
/// quotes in the run's failure.
fn worker_error(msg: &str) {
    use std::io::Write;
    tracing::error!("puzzletron worker: {msg}");
    let _ = writeln!(std::io::stderr().lock(), "puzzletron worker: {msg}");
}

/// The task file of this worker, from the environment; `None` outside worker mode.
fn task_path() -> Option<std::result::Result<PathBuf, String>> {
    if let Some(t) = std::env::var_os(TASK_ENV) {
        return Some(Ok(PathBuf::from(t)));
    }
    let manifest = PathBuf::from(std::env::var_os(MANIFEST_ENV)?);
    Some((|| {
        let index: usize = std::env::var(ARRAY_INDEX_ENV)
            .map_err(|_| format!("{MANIFEST_ENV} is set but {ARRAY_INDEX_ENV} is not"))?
            .parse()
            .map_err(|_| format!("{ARRAY_INDEX_ENV} is not a task index"))?;
        if let Some(dir) = std::env::var_os(TASK_DIR_ENV) {
            return Ok(PathBuf::from(dir).join(format!("{index}.json")));
        }
        let text = std::fs::read_to_string(&manifest)
            .map_err(|e| format!("cannot read manifest {}: {e}", manifest.display()))?;
        let list: Vec<PathBuf> = serde_json::from_str(&text).map_err(|e| {
            format!(
                "manifest {} is not a JSON list of paths: {e}",
                manifest.display()
            )
        })?;
        list.get(index).cloned().ok_or_else(|| {
            format!(
                "{ARRAY_INDEX_ENV}={index} but manifest {} lists {} tasks",
                manifest.display(),
                list.len()
            )
        })
    })())
}

// ------------------------------------------------------------------------------------------
// Which binary this is
// ------------------------------------------------------------------------------------------

/// Identity of the executable file, cheap enough to check in every worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ExeId {
    size: u64,
    mtime_ns: i128,
    /// SHA-256 of the first and last 64 KiB.
    sample: Hash,
}

fn exe_id() -> std::result::Result<ExeId, String> {
    static ID: OnceLock<std::result::Result<ExeId, String>> = OnceLock::new();
    ID.get_or_init(|| {
        use std::io::{Read, Seek, SeekFrom};
        let path = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let err = |e: std::io::Error| format!("reading {}: {e}", path.display());
        let mut f = std::fs::File::open(&path).map_err(err)?;
        let meta = f.metadata().map_err(err)?;
        let size = meta.len();
        let mtime_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos() as i128)
            .unwrap_or(0);
        const CHUNK: u64 = 64 * 1024;
        let mut buf = vec![0u8; CHUNK.min(size) as usize];
        f.read_exact(&mut buf).map_err(err)?;
        let mut tail = vec![0u8; CHUNK.min(size) as usize];
        f.seek(SeekFrom::Start(size - tail.len() as u64))
            .map_err(err)?;
        f.read_exact(&mut tail).map_err(err)?;
        buf.extend_from_slice(&tail);
        Ok(ExeId {
            size,
            mtime_ns,
            sample: Hash::of(&buf),
        })
    })
    .clone()
}

// ------------------------------------------------------------------------------------------
// Task files
// ------------------------------------------------------------------------------------------

#[derive(Debug, Serialize, Deserialize)]
struct Task {
    version: u32,
    store: StoreSpec,
    exe: ExeId,
    entry: Entry,
    key: Hash,
    lineage: Hash,
    job: String,
    params: String,
    param_order: Vec<String>,
    #[serde(default)]
    param_types: std::collections::BTreeMap<String, crate::identity::ParamType>,
    /// The name of the [`Shared`] file, in the task's own folder.
    shared: String,
    reasons: Reasons,
    replaces: Option<u32>,
}

/// What the runs of one job in one batch share: written once per batch, not per task (an
/// owned digest in the item scheme lists every item of the closure, hundreds of KiB of JSON
/// for a large crate, which each task would otherwise carry and the parent serialize).
#[derive(Debug, Serialize, Deserialize)]
struct Shared {
    owned: OwnedDigest,
    witnesses: Witnesses,
}

/// The name of the `n`-th [`Shared`] file of a batch.
fn shared_name(n: usize) -> String {
    format!("shared-{n}.json")
}

/// Worker side: executes the task's run under the store's claim.
fn run_task(path: &Path) -> std::result::Result<Option<Outcome>, String> {
    let text = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    let task: Task =
        serde_json::from_slice(&text).map_err(|e| format!("not a worker task: {e}"))?;
    if task.version != TASK_VERSION {
        return Err(format!(
            "task format {} but this binary reads {TASK_VERSION}",
            task.version
        ));
    }
    let me = exe_id()?;
    if me != task.exe {
        return Err(format!(
            "this binary ({me:?}) is not the one that submitted the run ({:?}): it was rebuilt \
             or is another program; drain again to resubmit",
            task.exe
        ));
    }
    // A bare file name in the task's folder, never a path elsewhere.
    if task.shared.is_empty() || task.shared.contains(['/', '\\']) || task.shared.starts_with('.') {
        return Err(format!(
            "task names shared file {:?}, not a file name",
            task.shared
        ));
    }
    let shared_path = path
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join(&task.shared);
    let bytes = std::fs::read(&shared_path)
        .map_err(|e| format!("cannot read {}: {e}", shared_path.display()))?;
    let shared: Shared = serde_json::from_slice(&bytes).map_err(|e| {
        format!(
            "{} is not a worker's shared file: {e}",
            shared_path.display()
        )
    })?;
    let store = open_store(&task.store)?;
    let owner = Owner::current();
    // The parent decided with its own identities; a worker re-checks nothing (trace off).
    let identities = super::identity::JobIdentities::new(false, false);
    // A cancel (LocalExecutor: SIGTERM to the group; scancel: SIGTERM) tells the job, which
    // is then recorded as interrupted, not killed mid-write at the end of the grace period.
    let cancel = Cancel::default();
    let _signals = super::interrupt::Guard::install(&[libc::SIGTERM, libc::SIGINT], &cancel);
    let engine = Engine {
        decider: Decider::new(&*store, &shared.witnesses, false, &identities),
        owner: &owner,
        on_event: None,
        wait_poll: std::time::Duration::from_millis(100),
        cancel: &cancel,
    };
    let shape = Arc::new(RunShape::new(
        task.job.into(),
        task.param_order.into(),
        Arc::new(task.param_types),
        Arc::new(shared.owned),
        task.entry,
    ));
    // One run: its text is kept whole (no values to share names with).
    let pending = PendingRun::new(RunSpec::new(
        task.key,
        task.lineage,
        &task.params,
        &[],
        &shape,
    ));
    let decision = JobDecision {
        replaces: task.replaces,
        ..JobDecision::new(pending.clone(), Action::Run, task.reasons)
    };
    engine
        .try_execute(0, 1, &pending, decision, Helpers::default())
        .map_err(|e| format!("store error: {e}"))
}

/// `isolate(true)` needs an executor that starts processes, a store that a worker process can
/// reopen ([`Store::spec`], `fs` or a kind registered with [`main_guard_with`]) and a folder
/// for the task files (`tasks_dir`, else `isolated/` in the store's folder). Returns that
/// folder.
pub(super) fn check_isolatable<S: Store + ?Sized, E: Executor + ?Sized>(
    store: &S,
    executor: &E,
    tasks_dir: Option<&Path>,
) -> Result<PathBuf> {
    if matches!(executor.kind(), "mock" | crate::executor::InProcess::KIND) {
        return Err(Error::Unsupported {
            what: format!("isolate(true) with the {} executor", executor.kind()),
            why: "isolated runs need an executor that starts processes, e.g. \
                  .executor(LocalExecutor::builder(dir).build()?)"
                .into(),
        });
    }
    let Some(spec) = store.spec() else {
        return Err(Error::Unsupported {
            what: format!("isolate(true) with the store at {:?}", store.location()),
            why: "worker processes must reopen the store, and this one cannot be reopened \
                  (Store::spec is None): use store_root(...), or a store whose spec() says how \
                  to open it"
                .into(),
        });
    };
    if !can_open(&spec.kind) {
        return Err(Error::Unsupported {
            what: format!("isolate(true) with a store of kind {:?}", spec.kind),
            why: format!(
                "worker processes could not reopen it: call \
                 `puzzletron::worker::main_guard_with(&[({:?}, opener)])` as the first line of \
                 main",
                spec.kind
            ),
        });
    }
    match tasks_dir {
        Some(d) => Ok(d.to_path_buf()),
        None if spec.kind == "fs" => Ok(Path::new(&spec.location).join("isolated")),
        None => Err(Error::Unsupported {
            what: format!("isolate(true) with a store of kind {:?}", spec.kind),
            why: "its task files need a folder the workers can read: set \
                  OrchestratorBuilder::worker_dir(...)"
                .into(),
        }),
    }
}

// ------------------------------------------------------------------------------------------
// Parent side
// ------------------------------------------------------------------------------------------

/// The isolated drain (see the module docs): decides every run, submits those to execute as
/// one array through `executor`, waits for them, and repeats for runs other processes held.
/// Blocking; see [`drain_isolated_async`] for the async form.
pub(super) fn drain_isolated<S: Store + ?Sized, E: Executor + ?Sized>(
    engine: &Engine<'_, S>,
    executor: &E,
    tasks_dir: &Path,
    queue: &[PendingRun],
) -> Drained {
    // Inside a runtime (an async driver calling the blocking drain) a runtime cannot be
    // started on this thread: poll the workers from a thread of our own instead.
    if tokio::runtime::Handle::try_current().is_ok() {
        return std::thread::scope(|s| {
            s.spawn(|| drain_isolated(engine, executor, tasks_dir, queue))
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        });
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let err = StoreError::Io {
                path: PathBuf::from("tokio runtime"),
                source: e,
            };
            return Drained {
                outcomes: vec![None; queue.len()],
                stop: Some(Stop::Cause(FailureCause::Store(err))),
            };
        }
    };
    use tracing::Instrument;
    let span = tracing::info_span!("drain", runs = queue.len(), isolated = true);
    rt.block_on(drain_isolated_async(engine, executor, tasks_dir, queue).instrument(span))
}

/// [`drain_isolated`] as a future.
pub(super) async fn drain_isolated_async<S: Store + ?Sized, E: Executor + ?Sized>(
    engine: &Engine<'_, S>,
    executor: &E,
    tasks_dir: &Path,
    queue: &[PendingRun],
) -> Drained {
    let total = queue.len();
    let mut outcomes: Vec<Option<Outcome>> = vec![None; total];
    let mut todo: Vec<usize> = (0..total).collect();
    let mut first_failure: Option<usize> = None;
    let mut interrupted = false;
    while !todo.is_empty() && first_failure.is_none() && !interrupted {
        if engine.cancel.is_cancelled() {
            break;
        }
        let mut run_now = Vec::new();
        let mut waiting = Vec::new();
        for &i in &todo {
            let d = match engine.decider.decide(&queue[i]) {
                Ok(d) => d,
                Err(e) => {
                    return Drained {
                        outcomes,
                        stop: Some(Stop::Cause(FailureCause::Store(e))),
                    };
                }
            };
            tracing::debug!(
                key = %queue[i].key.short(),
                job = %queue[i].job(),
                action = %d.action,
                reasons = ?d.reasons,
                "decided"
            );
            match d.action {
                Action::Skip => {
                    outcomes[i] = Some(Outcome::Skipped {
                        reasons: d.reasons.clone(),
                    });
                    engine.emit(Event::Skipped {
                        index: i + 1,
                        total,
                        decision: d,
                    });
                }
                Action::Wait => waiting.push(i),
                Action::Run => run_now.push((i, d)),
                Action::Corrupt | Action::Repair => {
                    match engine.corrupt_or_repair(i, total, &queue[i], d) {
                        Ok(Ok(d)) => run_now.push((i, d)),
                        Ok(Err(o)) => outcomes[i] = Some(o),
                        Err(e) => {
                            return Drained {
                                outcomes,
                                stop: Some(Stop::Cause(FailureCause::Store(e))),
                            };
                        }
                    }
                }
            }
        }
        let mut again = waiting;
        if run_now.is_empty() {
            if !again.is_empty() {
                tokio::select! {
                    _ = tokio::time::sleep(engine.wait_poll) => {}
                    _ = engine.cancel.token().cancelled() => {}
                }
            }
        } else {
            match run_batch(engine, executor, tasks_dir, queue, total, &run_now).await {
                Ok(results) => {
                    for (i, r) in results {
                        match r {
                            Some(out) => {
                                if matches!(out, Outcome::Failed { .. }) && first_failure.is_none()
                                {
                                    first_failure = Some(i);
                                }
                                interrupted |= matches!(out, Outcome::Interrupted);
                                outcomes[i] = Some(out);
                            }
                            None => again.push(i), // held by another process: decide again
                        }
                    }
                }
                Err(cause) => {
                    return Drained {
                        outcomes,
                        stop: Some(Stop::Cause(cause)),
                    };
                }
            }
        }
        again.sort_unstable();
        todo = again;
    }
    let stop = match first_failure {
        Some(i) => Some(Stop::JobFailed(i)),
        None if interrupted || (!todo.is_empty() && engine.cancel.is_cancelled()) => {
            Some(Stop::Cause(FailureCause::Cancelled))
        }
        None => None,
    };
    Drained { outcomes, stop }
}

/// [`Shared`] by reference, for writing.
#[derive(Serialize)]
struct SharedRef<'a> {
    owned: &'a OwnedDigest,
    witnesses: &'a Witnesses,
}

/// Task files only matter while this parent and its workers live (results go to the store,
/// which is durable): written atomically, without fsync.
fn write_replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    crate::fsutil::replace_file(path, bytes)
}

/// Submits `runs` as one array, waits for all, and concludes each from the store.
/// `None` for a run another process holds.
async fn run_batch<S: Store + ?Sized, E: Executor + ?Sized>(
    o: &Engine<'_, S>,
    executor: &E,
    tasks_dir: &Path,
    queue: &[PendingRun],
    total: usize,
    runs: &[(usize, JobDecision)],
) -> std::result::Result<Vec<(usize, Option<Outcome>)>, FailureCause> {
    let io = |path: &Path, e: std::io::Error| {
        FailureCause::Store(StoreError::Io {
            path: path.to_path_buf(),
            source: e,
        })
    };
    let Some(store) = o.store().spec() else {
        return Err(FailureCause::Store(StoreError::NotAStore {
            path: PathBuf::from(o.store().location()),
            reason: "it cannot be reopened by a worker process (Store::spec is None)".into(),
        }));
    };
    let exe = std::env::current_exe().map_err(|e| io(Path::new("current_exe"), e))?;
    let exe_id = exe_id().map_err(|m| {
        FailureCause::Store(StoreError::Corrupt {
            path: exe.clone(),
            reason: m,
        })
    })?;
    let stamp = format!(
        "{}-{}",
        (unix_now() * 1000.0) as u64 % 10_000_000_000,
        std::process::id()
    );
    let dir = tasks_dir.join(&stamp);
    std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
    // One shared file per distinct owned digest (runs of one job share its `Arc`).
    let mut shared_files: Vec<(&Arc<OwnedDigest>, String)> = Vec::new();
    let mut manifest = Vec::with_capacity(runs.len());
    for (n, (i, d)) in runs.iter().enumerate() {
        let p = &queue[*i];
        let shared = match shared_files
            .iter()
            .find(|(q, _)| Arc::ptr_eq(q, p.owned_shared()))
        {
            Some((_, name)) => name.clone(),
            None => {
                let name = shared_name(shared_files.len());
                let path = dir.join(&name);
                let bytes = serde_json::to_vec(&SharedRef {
                    owned: p.owned(),
                    witnesses: o.witnesses(),
                })
                .expect("shared data serializes");
                write_replace(&path, &bytes).map_err(|e| io(&path, e))?;
                shared_files.push((p.owned_shared(), name.clone()));
                name
            }
        };
        let task = Task {
            version: TASK_VERSION,
            store: store.clone(),
            exe: exe_id.clone(),
            entry: p.entry(),
            key: p.key,
            lineage: p.lineage,
            job: p.job().to_string(),
            params: p.params().to_string(),
            param_order: p.param_order().to_vec(),
            param_types: p.param_types().clone(),
            shared,
            reasons: d.reasons.clone(),
            replaces: d.replaces,
        };
        let path = dir.join(format!("{n}.json"));
        let bytes = serde_json::to_vec(&task).expect("task serializes");
        write_replace(&path, &bytes).map_err(|e| io(&path, e))?;
        manifest.push(path);
    }
    let manifest_path = dir.join("manifest.json");
    let bytes = serde_json::to_vec(&manifest).expect("paths serialize");
    write_replace(&manifest_path, &bytes).map_err(|e| io(&manifest_path, e))?;
    let id = AttemptId::new(format!("sweep-{stamp}")).map_err(FailureCause::Executor)?;
    let mut cmd = CommandSpec::new(exe.to_string_lossy())
        .env(MANIFEST_ENV, manifest_path.to_string_lossy())
        .env(TASK_DIR_ENV, dir.to_string_lossy());
    if let Ok(cwd) = std::env::current_dir() {
        cmd = cmd.cwd(cwd);
    }
    let array = ArraySpec {
        template: AttemptSpec::new(id, cmd),
        size: runs.len() as u32,
        max_concurrent: None,
    };
    let handles = executor
        .submit_array(&array)
        .await
        .map_err(FailureCause::Executor)?;
    tracing::info!(runs = runs.len(), batch = %stamp, executor = executor.kind(), "submitted isolated workers");
    for (i, d) in runs {
        o.emit(Event::Started {
            index: i + 1,
            total,
            decision: d.clone(),
        });
    }
    // Poll until every worker ended, concluding each as it ends. A cancelled drain cancels
    // the workers still live (each is told, and records its run as interrupted) and waits
    // for them to end.
    let mut done: Vec<Option<Option<Outcome>>> = vec![None; runs.len()];
    let mut cancelled = false;
    loop {
        let live: Vec<usize> = (0..runs.len()).filter(|&n| done[n].is_none()).collect();
        if live.is_empty() {
            break;
        }
        let hs: Vec<JobHandle> = live.iter().map(|&n| handles[n].clone()).collect();
        if !cancelled && o.cancel.is_cancelled() {
            cancelled = true;
            tracing::info!(
                live = hs.len(),
                "drain cancelled: cancelling the live workers"
            );
            for h in &hs {
                // A worker that cannot be cancelled is waited for: its own result stands.
                if let Err(e) = executor.cancel(h).await {
                    tracing::warn!(attempt = %h.attempt_id, error = %e, "could not cancel an isolated worker");
                }
            }
        }
        // Read before the poll: an end after it makes `wait_change` return at once.
        let seen = executor.changes();
        let st = match executor.poll(&hs).await {
            Ok(st) => st,
            Err(e) if e.is_retryable() => {
                tracing::warn!(error = %e, "polling the isolated workers failed: retrying");
                tokio::time::sleep(o.wait_poll).await;
                continue;
            }
            Err(e) => return Err(FailureCause::Executor(e)),
        };
        for (&n, s) in live.iter().zip(&st) {
            if s.state.is_terminal() {
                let (i, _) = &runs[n];
                let (out, rows) =
                    conclude(o, &queue[*i], s, cancelled).map_err(FailureCause::Store)?;
                match &out {
                    Some(Outcome::Ran { seconds }) => {
                        o.emit(Event::Finished {
                            index: i + 1,
                            total,
                            key: queue[*i].key,
                            seconds: *seconds,
                            rows,
                        });
                    }
                    Some(Outcome::Failed { failure }) => o.emit(Event::Failed {
                        index: i + 1,
                        total,
                        key: queue[*i].key,
                        failure: failure.clone(),
                    }),
                    Some(Outcome::Interrupted) => o.emit(Event::Interrupted {
                        index: i + 1,
                        total,
                        key: queue[*i].key,
                    }),
                    _ => {}
                }
                done[n] = Some(out);
            }
        }
        if done.iter().any(Option::is_none) {
            // Wakes when a worker ends (LocalExecutor), at the latest after `wait_poll`, and
            // when the drain is cancelled.
            if cancelled {
                executor.wait_change(seen, o.wait_poll).await;
            } else {
                tokio::select! {
                    _ = executor.wait_change(seen, o.wait_poll) => {}
                    _ = o.cancel.token().cancelled() => {}
                }
            }
        }
    }
    Ok(runs
        .iter()
        .zip(done)
        .map(|((i, _), d)| (*i, d.flatten()))
        .collect())
}

/// What a finished worker left in the store, and the metric rows of a run that ran (read with
/// the record, once). A worker that died without a record fails its run: the stale claim is
/// taken over and the failure recorded with the executor's evidence; unless the drain
/// `cancelled` it, or it says it was interrupted: then the run is interrupted, never failed
/// (its record stays `running` with a dead holder, which the next drain runs again).
fn conclude<S: Store + ?Sized>(
    o: &Engine<'_, S>,
    p: &PendingRun,
    status: &JobStatus,
    cancelled: bool,
) -> std::result::Result<(Option<Outcome>, u64), StoreError> {
    let rec = o.store().record(&p.key)?;
    match rec {
        Some(r) if r.status == Status::Done => {
            if status.exit_code == Some(EXIT_ELSEWHERE) {
                let by = r.owner.map(|o| o.to_string()).unwrap_or_default();
                return Ok((
                    Some(Outcome::Skipped {
                        reasons: Reasons::one(format!("done by {by}")),
                    }),
                    0,
                ));
            }
            let seconds = r.finished_at.map(|f| f - r.started_at).unwrap_or(0.0);
            let rows = r.metrics.map(|m| m.rows).unwrap_or(0);
            return Ok((Some(Outcome::Ran { seconds }), rows));
        }
        Some(r) if r.status == Status::Failed && status.exit_code == Some(EXIT_FAILED) => {
            return Ok((
                Some(Outcome::Failed {
                    failure: r
                        .error
                        .unwrap_or_else(|| failure("error", "failed in a worker".into(), None)),
                }),
                0,
            ));
        }
        _ => {}
    }
    if status.exit_code == Some(EXIT_ELSEWHERE) {
        return Ok((None, 0)); // another process holds it: the next round decides again
    }
    if cancelled {
        // This drain stopped it (its worker recorded the run as interrupted, or was killed
        // before it could): interrupted, never failed.
        return Ok((Some(Outcome::Interrupted), 0));
    }
    // The worker ended without recording a result.
    let message = match &status.state {
        _ if status.exit_code == Some(EXIT_INTERRUPTED) => format!(
            "worker process ended {} after a SIGTERM or SIGINT from outside this drain (a \
             walltime, a preemption, a cancel by hand): the run stopped before its end{}",
            status.state,
            status
                .reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ),
        JobState::Completed => "worker exited 0 without recording a result (is \
                                `puzzletron::worker::main_guard()` the first line of main?)"
            .to_string(),
        state => format!(
            "worker process ended {state} (exit code {:?}, signal {:?}) without recording a result{}",
            status.exit_code,
            status.signal,
            status
                .reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ),
    };
    let log_tail = status.log_path.as_deref().and_then(|p| {
        let text = std::fs::read_to_string(p).ok()?;
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        Some(format!("log {}:\n{tail}", p.display()))
    });
    let kind = if status.state.is_success() {
        "error"
    } else {
        "crash"
    };
    tracing::warn!(key = %p.key.short(), state = %status.state, "{message}");
    let mut f = failure(kind, message, log_tail);
    f.chain = Vec::new();
    let claim = match o.store().claim(&p.key, o.owner, None)? {
        ClaimOutcome::Claimed(c) => c,
        ClaimOutcome::Busy(_) => return Ok((None, 0)),
        ClaimOutcome::Done(_) => {
            return Ok((
                Some(Outcome::Skipped {
                    reasons: Reasons::one("done by another process"),
                }),
                0,
            ));
        }
    };
    let mut record = p.running_record(o.witnesses(), o.owner, claim.attempt);
    o.store().start(&claim, &record)?;
    record.status = Status::Failed;
    record.finished_at = Some(unix_now());
    record.error = Some(f.clone());
    o.store().finish(&claim, &record)?;
    Ok((Some(Outcome::Failed { failure: f }), 0))
}

#[cfg(test)]
mod tests {
    use super::super::run::Run;
    use super::*;

    fn doubles(x: &u32, run: &mut Run) -> crate::sweep::JobResult {
        run.log("y", 0, f64::from(*x) * 2.0)?;
        Ok(())
    }

    fn task(dir: &Path, shared: &str) -> PathBuf {
        let t = Task {
            version: TASK_VERSION,
            store: StoreSpec::new("fs", dir.join("store").display().to_string()),
            exe: exe_id().unwrap(),
            entry: Entry::of(doubles),
            key: Hash::of(b"key"),
            lineage: Hash::of(b"lineage"),
            job: "doubles".into(),
            params: "2".into(),
            param_order: Vec::new(),
            param_types: Default::default(),
            shared: shared.into(),
            reasons: Reasons::one("new"),
            replaces: None,
        };
        let path = dir.join("0.json");
        std::fs::write(&path, serde_json::to_vec(&t).unwrap()).unwrap();
        path
    }

    #[test]
    fn a_task_reads_its_shared_file_only_from_its_own_folder() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["../shared-0.json", "/etc/passwd", "", ".hidden", "a\\b"] {
            let err = run_task(&task(dir.path(), bad)).unwrap_err();
            assert!(err.contains("not a file name"), "{bad:?}: {err}");
        }
        // A well-formed name that is missing is reported with its path.
        let err = run_task(&task(dir.path(), "shared-0.json")).unwrap_err();
        assert!(
            err.contains(&dir.path().join("shared-0.json").display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn a_task_runs_with_the_owned_digest_and_witnesses_of_its_shared_file() {
        let dir = tempfile::tempdir().unwrap();
        let witnesses = crate::identity::Witnesses {
            cargo_lock: None,
            toolchain: crate::identity::Toolchain::current(),
            source: None,
        };
        let mut owned = OwnedDigest::default();
        owned.files.insert("src/lib.rs".into(), Hash::of(b"lib"));
        let bytes = serde_json::to_vec(&SharedRef {
            owned: &owned,
            witnesses: &witnesses,
        })
        .unwrap();
        std::fs::write(dir.path().join(shared_name(0)), bytes).unwrap();
        // The parent made the store before its workers start (a worker only opens it).
        FsStore::create(dir.path().join("store")).unwrap();
        let out = run_task(&task(dir.path(), &shared_name(0))).unwrap();
        assert!(matches!(out, Some(Outcome::Ran { .. })), "{out:?}");
        let store = FsStore::open(dir.path().join("store")).unwrap();
        let rec = store.record(&Hash::of(b"key")).unwrap().unwrap();
        assert_eq!(rec.status, Status::Done);
        assert_eq!(rec.owned, owned);
        assert_eq!(rec.witnesses, witnesses);
        assert_eq!(rec.metrics.map(|m| m.rows), Some(1));
        // The job never asked for its artifact folder: none was made.
        assert!(!store.job_dir(&Hash::of(b"key")).join("artifacts").exists());
        assert_eq!(
            store.metrics(&Hash::of(b"key"), Some("y")).unwrap().value,
            vec![4.0]
        );
    }

    #[test]
    fn exe_id_is_stable_within_a_process() {
        let id = exe_id().unwrap();
        assert!(id.size > 0);
        assert_eq!(exe_id().unwrap(), id);
    }
}
