//! [`LocalExecutor`]: attempts as process trees on this machine.
//!
//! - Commands run from their argv (no shell unless [`CommandSpec::shell`](crate::executor::CommandSpec)).
//! - At most `max_concurrent` jobs run at once; the rest wait in submission order (a job that
//!   needs more GPUs than are free lets later, smaller jobs start first).
//! - GPU slots: each job gets `topology.gpus_per_node()` ids from the configured list, exported
//!   as `CUDA_VISIBLE_DEVICES`; an id is never given to two running jobs. Jobs that ask for no
//!   GPU get `CUDA_VISIBLE_DEVICES=` (empty: no GPU visible) when a list is configured.
//! - stdout and stderr go to one log file per attempt (`<attempt folder>/output.log` unless the
//!   spec names one).
//! - Walltime: SIGTERM to the job's process group at the limit, SIGKILL after `kill_grace`;
//!   state [`JobState::Timeout`].
//! - Detachable: every job runs under a small wrapper in its own session (a forked process
//!   that makes only async-signal-safe system calls and never returns to Rust code: unlike
//!   `sh -c`, it learns from `waitpid` whether the job exited 137 or was killed by signal 9,
//!   and it needs no helper binary or guard in the user's `main`). The wrappers are forked by
//!   a small single-threaded *fork server* the first executor of the process starts, so the
//!   controller does not fork once per job (which cost page-table copies and copy-on-write
//!   faults in every controller thread); when the server is gone or cannot take a launch, the
//!   controller forks the wrapper itself, and [`FORK_SERVER_ENV`]`=0` makes it always do so.
//!   The wrapper writes the exit code or killing signal and the end time into the attempt folder
//!   (layout below). A controller that restarts (a new `LocalExecutor` on the
//!   same root) reads the results of jobs that ended meanwhile, sees running ones (pid checked
//!   with its start time), and starts jobs that were queued but never started. Nothing is run
//!   twice: starting a job is claimed with an exclusive file create.
//!
//! The concurrency limit and the GPU list are per executor instance: two controllers on one
//! root do not share them.
//!
//! Layout of `<root>/<attempt id>/`: `attempt.json` (spec and submit time), `launching` (the
//! start claim, created exclusively), `started` (created exclusively by the one wrapper that
//! runs the job), `wrapper` and `job` (`<pid> <start ticks>`, ticks from
//! field 22 of `/proc/<pid>/stat` so a recycled pid is never mistaken for the job), `cancel`
//! (cancel requested, ms), `exit` (`status=exited|signaled|launch_failed|cancelled_before_start`,
//! `code`/`signal`/`errno`, `timeout`, `start_ms`, `end_ms`; written with temp file, fsync,
//! rename, fsync of the folder), `output.log` (stdout and stderr).

mod folder;
mod forkserver;
mod wrapper;

pub use forkserver::FORK_SERVER_ENV;

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use std::collections::BTreeMap;

use super::{
    ATTEMPT_ID_ENV, AttemptId, AttemptSpec, Executor, ExecutorError, JobHandle, JobState,
    JobStatus, RenderedCommand, Rendering, TaskLauncher, check_kind, now_ms, oom,
};
use folder::{AttemptRecord, ExitKind, ExitRecord};
use wrapper::{Launch, Prepared};

/// Environment variable holding the attempt folder, set for every local job.
pub const ATTEMPT_DIR_ENV: &str = "PUZZLETRON_ATTEMPT_DIR";

/// How long a `launching` claim without a wrapper file is taken to be a launch in progress
/// before the attempt is reported [`JobState::Lost`].
const LAUNCH_GRACE: Duration = Duration::from_secs(30);

/// Builder of a [`LocalExecutor`].
#[derive(Debug, Clone)]
pub struct LocalExecutorBuilder {
    root: PathBuf,
    max_concurrent: Option<usize>,
    gpu_ids: Vec<String>,
    kill_grace: Duration,
    cancel_timeout: Duration,
    inherit_env: bool,
}

impl LocalExecutorBuilder {
    /// At most `n` jobs run at once (default: the number of CPUs).
    pub fn max_concurrent(mut self, n: usize) -> Self {
        self.max_concurrent = Some(n);
        self
    }

    /// The GPU ids to hand out (e.g. `["0", "1", "2", "3"]` or UUIDs); default none.
    pub fn gpu_ids<I, S>(mut self, ids: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.gpu_ids = ids.into_iter().map(Into::into).collect();
        self
    }

    /// Time between SIGTERM and SIGKILL on walltime and cancel (default 10 s).
    pub fn kill_grace(mut self, grace: Duration) -> Self {
        self.kill_grace = grace;
        self
    }

    /// How long [`Executor::cancel`] waits, after SIGKILL, for the wrapper's record before
    /// answering [`ExecutorError::CancelUnconfirmed`] (default 10 s).
    pub fn cancel_timeout(mut self, timeout: Duration) -> Self {
        self.cancel_timeout = timeout;
        self
    }

    /// Whether jobs inherit the controller's environment (default true); the spec's `env` and
    /// the executor's variables are added on top either way.
    pub fn inherit_env(mut self, inherit: bool) -> Self {
        self.inherit_env = inherit;
        self
    }

    /// Creates the root folder and the executor. The first executor of a process also starts
    /// the fork server that forks the job wrappers (see the module docs): it shares,
    /// copy-on-write, the memory the process has now, so build it before loading large data.
    ///
    /// # Errors
    /// [`ExecutorError::InvalidSpec`] when `max_concurrent` is 0, a GPU id is empty, holds a
    /// `,` or whitespace, or appears twice; [`ExecutorError::Io`] when the root cannot be created.
    pub fn build(self) -> Result<LocalExecutor, ExecutorError> {
        let max = self.max_concurrent.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
        let bad = |field: &str, value: String, expected: &str| ExecutorError::InvalidSpec {
            attempt_id: None,
            field: field.into(),
            value,
            expected: expected.into(),
        };
        if max == 0 {
            return Err(bad("local.max_concurrent", "0".into(), "at least 1"));
        }
        for (i, g) in self.gpu_ids.iter().enumerate() {
            if g.is_empty() || g.contains(',') || g.contains(char::is_whitespace) {
                return Err(bad(
                    &format!("local.gpu_ids[{i}]"),
                    g.clone(),
                    "a GPU index or UUID without ',' or spaces",
                ));
            }
            // The same GPU twice would be handed to two jobs at once.
            if let Some(j) = self.gpu_ids[..i].iter().position(|h| h == g) {
                return Err(bad(
                    &format!("local.gpu_ids[{i}]"),
                    g.clone(),
                    &format!("distinct GPU ids ({g:?} is also local.gpu_ids[{j}])"),
                ));
            }
        }
        // Made at the first submit: building (for a dry run) creates nothing.
        let root = super::resolve_dir(&self.root)?;
        let ngpu = self.gpu_ids.len();
        // Now, while the process is usually small: each wrapper is a fork of the server.
        forkserver::ensure();
        Ok(LocalExecutor {
            inner: Arc::new(Inner {
                root,
                max_concurrent: max,
                gpu_ids: self.gpu_ids,
                kill_grace: self.kill_grace,
                cancel_timeout: self.cancel_timeout,
                inherit_env: self.inherit_env,
                oom_counters: oom::own_counter_file(),
                runtime: Mutex::new(None),
                ends: AtomicU64::new(0),
                ended: tokio::sync::Notify::new(),
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    running: 0,
                    gpu_free: vec![true; ngpu],
                    jobs: HashMap::new(),
                }),
            }),
        })
    }
}

/// Runs attempts as local process trees. See the module docs.
///
/// ```
/// use puzzletron::executor::*;
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let root = tempfile::tempdir().unwrap();
/// let exec = LocalExecutor::builder(root.path()).max_concurrent(2).gpu_ids(["0", "1"]).build()?;
/// let spec = AttemptSpec::new(AttemptId::new("hello.a1")?, CommandSpec::new("echo").arg("hi"));
/// let h = exec.submit(&spec).await?;
/// let st = exec.wait_terminal(&[h], std::time::Duration::from_millis(10),
///                             std::time::Duration::from_secs(30)).await?;
/// assert_eq!(st[0].state, JobState::Completed);
/// assert_eq!(std::fs::read_to_string(st[0].log_path.as_ref().unwrap()).unwrap(), "hi\n");
/// # Ok::<(), ExecutorError>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct LocalExecutor {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LocalExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalExecutor")
            .field("root", &self.inner.root)
            .field("max_concurrent", &self.inner.max_concurrent)
            .field("gpu_ids", &self.inner.gpu_ids)
            .finish()
    }
}

struct Inner {
    root: PathBuf,
    max_concurrent: usize,
    gpu_ids: Vec<String>,
    kill_grace: Duration,
    cancel_timeout: Duration,
    inherit_env: bool,
    /// The OOM counter file of this process's memory cgroup, which its jobs inherit (N09),
    /// resolved once when the executor is built.
    oom_counters: Option<PathBuf>,
    /// The runtime of the latest async call: queued jobs start on it (a controller may use
    /// a new runtime per drain).
    runtime: Mutex<Option<tokio::runtime::Handle>>,
    state: Mutex<State>,
    /// Job ends seen by this instance ([`Executor::changes`]), and the wake-up of
    /// [`Executor::wait_change`].
    ends: AtomicU64,
    ended: tokio::sync::Notify,
}

struct State {
    queue: VecDeque<AttemptId>,
    running: usize,
    gpu_free: Vec<bool>,
    jobs: HashMap<AttemptId, Entry>,
}

enum Entry {
    /// Waiting for a slot in this executor.
    Queued(Box<AttemptRecord>),
    /// Started (or being started) by this executor.
    Running {
        job_pid: Option<i32>,
        log_path: PathBuf,
        started_ms: u64,
    },
    /// Known only through its folder (another controller started it).
    External,
    /// Finished; the status is final.
    Done(JobStatus),
}

impl LocalExecutor {
    /// A builder for an executor keeping attempt folders under `root` (created if missing).
    pub fn builder(root: impl Into<PathBuf>) -> LocalExecutorBuilder {
        LocalExecutorBuilder {
            root: root.into(),
            max_concurrent: None,
            gpu_ids: Vec::new(),
            kill_grace: Duration::from_secs(10),
            cancel_timeout: Duration::from_secs(10),
            inherit_env: true,
        }
    }

    /// The attempt folder of `attempt_id`.
    pub fn attempt_dir(&self, attempt_id: &AttemptId) -> PathBuf {
        self.inner.root.join(attempt_id.as_str())
    }

    /// The root folder (canonical).
    pub fn root(&self) -> &Path {
        &self.inner.root
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // State stays consistent between statements; a panic elsewhere must not wedge polls.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn dir(&self, id: &AttemptId) -> PathBuf {
        self.root.join(id.as_str())
    }

    fn log_path(&self, spec: &AttemptSpec) -> PathBuf {
        spec.log_path
            .clone()
            .unwrap_or_else(|| self.dir(&spec.attempt_id).join(folder::LOG_FILE))
    }

    fn handle(&self, id: &AttemptId, submitted_at_ms: u64) -> JobHandle {
        JobHandle::new("local", id.clone(), id.as_str(), submitted_at_ms)
            .with_data("attempt_dir", self.dir(id).to_string_lossy())
    }

    fn check_handle(&self, h: &JobHandle) -> Result<(), ExecutorError> {
        check_kind("local", h)?;
        let ours = self.dir(&h.attempt_id);
        match h.data.get("attempt_dir") {
            Some(d) if Path::new(d) != ours => Err(ExecutorError::ForeignHandle {
                expected: format!("local at {}", self.root.display()),
                found: format!("local at {d}"),
                attempt_id: h.attempt_id.clone(),
            }),
            _ => Ok(()),
        }
    }

    fn runtime(&self) -> Result<tokio::runtime::Handle, ExecutorError> {
        let h = tokio::runtime::Handle::try_current().map_err(|_| ExecutorError::Other {
            message: "LocalExecutor must be called from within a tokio runtime".into(),
            retryable: false,
        })?;
        *self.runtime.lock().unwrap_or_else(|p| p.into_inner()) = Some(h.clone());
        Ok(h)
    }

    /// Starts queued jobs while slots and GPUs allow. Called with the state lock held.
    fn dispatch(self: &Arc<Self>, st: &mut State) {
        let Some(rt) = self
            .runtime
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        else {
            return;
        };
        let mut i = 0;
        while i < st.queue.len() && st.running < self.max_concurrent {
            let id = st.queue[i].clone();
            let need = match st.jobs.get(&id) {
                Some(Entry::Queued(rec)) => rec.spec.topology.gpus_per_node() as usize,
                _ => {
                    // cancelled or adopted elsewhere meanwhile
                    st.queue.remove(i);
                    continue;
                }
            };
            let free: Vec<usize> = (0..st.gpu_free.len())
                .filter(|&g| st.gpu_free[g])
                .take(need)
                .collect();
            if free.len() < need {
                i += 1;
                continue;
            }
            st.queue.remove(i);
            for &g in &free {
                st.gpu_free[g] = false;
            }
            st.running += 1;
            let Some(Entry::Queued(rec)) = st.jobs.remove(&id) else {
                unreachable!("checked above")
            };
            st.jobs.insert(
                id.clone(),
                Entry::Running {
                    job_pid: None,
                    log_path: self.log_path(&rec.spec),
                    started_ms: now_ms(),
                },
            );
            let me = Arc::clone(self);
            rt.spawn_blocking(move || me.run_job(*rec, free));
        }
    }

    /// Runs one job to its end (blocking thread), then frees its slot and dispatches more.
    fn run_job(self: Arc<Self>, rec: AttemptRecord, gpus: Vec<usize>) {
        let id = rec.spec.attempt_id.clone();
        let entry = match self.launch_and_wait(&rec, &gpus) {
            Ok(Some(status)) => Entry::Done(status),
            Ok(None) => Entry::External,
            Err(e) => Entry::Done(
                JobStatus::new(id.clone(), JobState::LaunchFailed)
                    .with_reason(e.to_string())
                    .with_log_path(self.log_path(&rec.spec)),
            ),
        };
        let mut st = self.lock();
        st.jobs.insert(id, entry);
        st.running -= 1;
        for g in gpus {
            st.gpu_free[g] = true;
        }
        self.dispatch(&mut st);
        drop(st);
        // After the state holds the end: a waiter woken now polls it as ended.
        self.ends.fetch_add(1, Ordering::SeqCst);
        self.ended.notify_waiters();
    }

    /// Takes a queued job's launch so that it never starts: the launch claim (fresh, or
    /// retaken from a dead controller), then `started`, which no wrapper can create after us.
    /// `false`: a launch is under way or done.
    fn claim_to_cancel(dir: &Path) -> Result<bool, ExecutorError> {
        Ok(folder::claim_launch(dir, now_ms())?
            && folder::create_exclusive(dir, folder::STARTED_FILE, "cancelled\n")?)
    }

    /// Claims, launches and waits for the job. `Ok(None)`: another controller claimed it.
    fn launch_and_wait(
        &self,
        rec: &AttemptRecord,
        gpus: &[usize],
    ) -> Result<Option<JobStatus>, ExecutorError> {
        let spec = &rec.spec;
        let dir = self.dir(&spec.attempt_id);
        if !folder::claim_launch(&dir, now_ms())? {
            return Ok(None);
        }
        let log = self.log_path(spec);
        // What runs is the rendering (the dry run shows the same), plus the GPUs chosen now;
        // both are kept in the attempt folder as the launch record.
        let rendering = self.render(spec)?;
        let cmd = &rendering.commands[0];
        let argv = cmd.argv.clone();
        let env = self.env(&cmd.env, gpus);
        let record = LaunchRecord {
            rendering: rendering.clone(),
            gpus: gpus.iter().map(|&g| self.gpu_ids[g].clone()).collect(),
        };
        let json = serde_json::to_vec_pretty(&record).map_err(|e| ExecutorError::Other {
            message: format!(
                "cannot serialize the launch record of {}: {e}",
                spec.attempt_id
            ),
            retryable: false,
        })?;
        folder::write_replace(&dir, folder::LAUNCH_FILE, &json)?;
        let path_var = env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone());
        let here = std::env::current_dir().ok();
        let cwd = cmd.cwd.clone();
        let program =
            resolve_program(&argv[0], path_var.as_ref(), cwd.as_deref()).map(|p| match &here {
                Some(h) if p.is_relative() => h.join(p),
                _ => p,
            });
        let program = match program {
            Some(p) => p,
            None => {
                let rec = format!(
                    "status=launch_failed\nerrno={}\nstart_ms={}\nend_ms={}\n",
                    libc::ENOENT,
                    now_ms(),
                    now_ms()
                );
                folder::write_atomic(&dir, folder::EXIT_FILE, rec.as_bytes())?;
                return self.status_from_folder(&spec.attempt_id).map(Some);
            }
        };
        let prepared = Prepared::new(
            &dir,
            &program,
            &argv,
            &env,
            cwd.as_deref(),
            spec.walltime,
            self.kill_grace,
        )?;
        // N09: the job inherits this process's memory cgroup; its OOM counters now are the
        // baseline that tells an OOM kill from any other SIGKILL.
        let oom_before = match &self.oom_counters {
            Some(p) => format!(
                "file={}\n{}",
                p.display(),
                std::fs::read_to_string(p).unwrap_or_default()
            ),
            None => "unknown\n".to_string(),
        };
        folder::write_replace(&dir, folder::OOM_BEFORE_FILE, oom_before.as_bytes())?;
        let wrapper = forkserver::launch(&prepared, &log)?;
        match wrapper.launch {
            Launch::Started { job_pid } => {
                if let Some(Entry::Running { job_pid: p, .. }) =
                    self.lock().jobs.get_mut(&spec.attempt_id)
                {
                    *p = Some(job_pid);
                }
            }
            Launch::Failed { .. } | Launch::WrapperDied => {}
            Launch::AlreadyStarted => {
                wrapper.wait();
                return Ok(None);
            }
        }
        wrapper.wait();
        self.status_from_folder(&spec.attempt_id).map(Some)
    }

    /// The argv to exec: the launcher applied, then the execution contract's prologue.
    fn argv(&self, spec: &AttemptSpec) -> Vec<String> {
        let argv = spec.command.effective_argv();
        let argv = match &spec.topology.launcher {
            TaskLauncher::Direct | TaskLauncher::Srun { .. } => argv,
            launcher @ TaskLauncher::Torchrun { .. } => {
                // One node: a standalone rendezvous.
                let mut v = launcher
                    .torchrun_args(1, None, spec.attempt_id.as_str(), None)
                    .unwrap_or_default();
                v.extend(argv);
                v
            }
        };
        super::shell::with_contract(argv, &spec.environment)
    }

    /// What [`submit`](Executor::submit) runs for `spec` once it starts (see
    /// [`Executor::render`]).
    fn render(&self, spec: &AttemptSpec) -> Result<Rendering, ExecutorError> {
        check_local(spec, &self.gpu_ids)?;
        let id = &spec.attempt_id;
        let mut env: BTreeMap<String, String> = spec.command.env.clone();
        env.insert(ATTEMPT_ID_ENV.into(), id.to_string());
        env.insert(ATTEMPT_DIR_ENV.into(), self.dir(id).display().to_string());
        // Absolute, against this process's working folder: the wrapper may be forked by the
        // fork server, whose working folder is the one the process had when it started.
        let here = std::env::current_dir().ok();
        let cwd = match (&spec.command.cwd, &here) {
            (Some(c), Some(h)) => Some(h.join(c)),
            (Some(c), None) => Some(c.clone()),
            (None, h) => h.clone(),
        };
        let mut r = Rendering::new(id.clone(), "local").with_secrets_of(&spec.command.env);
        r.commands.push(RenderedCommand {
            host: None,
            argv: self.argv(spec),
            env,
            cwd,
        });
        if !self.gpu_ids.is_empty() {
            let n = spec.topology.gpus_per_node();
            r.notes.push(if n == 0 {
                "CUDA_VISIBLE_DEVICES= (empty: no GPU visible)".to_string()
            } else {
                format!(
                    "CUDA_VISIBLE_DEVICES: {n} of this executor's GPUs {}, the first free ones when \
                     the job starts (recorded in its attempt folder's {})",
                    self.gpu_ids.join(","),
                    folder::LAUNCH_FILE
                )
            });
        }
        Ok(r)
    }

    /// The job's complete environment: inherited (unless turned off), the rendering's, and
    /// the GPUs chosen at start.
    fn env(&self, set_env: &BTreeMap<String, String>, gpus: &[usize]) -> Vec<(OsString, OsString)> {
        let mut env: Vec<(OsString, OsString)> = if self.inherit_env {
            std::env::vars_os().collect()
        } else {
            Vec::new()
        };
        let mut set = |k: &str, v: OsString| {
            env.retain(|(ek, _)| ek != k);
            env.push((k.into(), v));
        };
        for (k, v) in set_env {
            set(k, v.into());
        }
        if !self.gpu_ids.is_empty() {
            let ids: Vec<&str> = gpus.iter().map(|&g| self.gpu_ids[g].as_str()).collect();
            set("CUDA_VISIBLE_DEVICES", ids.join(",").into());
        }
        env
    }

    /// The state an attempt folder shows, for a job not (or no longer) run by this instance.
    fn status_from_folder(&self, id: &AttemptId) -> Result<JobStatus, ExecutorError> {
        Ok(match self.folder_view(id)? {
            FolderView::Status(s) => *s,
            FolderView::Queued(_) => {
                JobStatus::new(id.clone(), JobState::Pending).with_reason("queued, not started")
            }
        })
    }

    fn folder_view(&self, id: &AttemptId) -> Result<FolderView, ExecutorError> {
        let dir = self.dir(id);
        let rec = folder::read_attempt(&dir)?;
        let log = rec
            .as_ref()
            .map(|r| self.log_path(&r.spec))
            .unwrap_or_else(|| dir.join(folder::LOG_FILE));
        let status = |state| JobStatus::new(id.clone(), state).with_log_path(&log);
        if let Some(exit) = folder::read_exit(&dir)? {
            let cancel_ms = folder::read_opt(&dir.join(folder::CANCEL_FILE))?
                .and_then(|s| s.trim().parse::<u64>().ok());
            return Ok(FolderView::Status(Box::new(with_oom_evidence(
                &dir,
                status_from_exit(status(JobState::Completed), &exit, cancel_ms),
            ))));
        }
        if let Some((pid, ticks)) = folder::read_pid_file(&dir.join(folder::WRAPPER_FILE))? {
            if folder::is_same_process_alive(pid, ticks) {
                return Ok(FolderView::Status(Box::new(
                    status(JobState::Running).with_nodes("localhost"),
                )));
            }
            // The wrapper is gone without a record (killed, machine rebooted). The job may
            // outlive it, but nobody will record its end.
            if let Some((jpid, jticks)) = folder::read_pid_file(&dir.join(folder::JOB_FILE))?
                && folder::is_same_process_alive(jpid, jticks)
            {
                return Ok(FolderView::Status(Box::new(
                    status(JobState::Running)
                        .with_reason("wrapper gone: the job's end will not be recorded"),
                )));
            }
            // The record may have landed between our two reads.
            if let Some(exit) = folder::read_exit(&dir)? {
                return Ok(FolderView::Status(Box::new(with_oom_evidence(
                    &dir,
                    status_from_exit(status(JobState::Completed), &exit, None),
                ))));
            }
            return Ok(FolderView::Status(Box::new(
                status(JobState::Lost).with_reason(format!(
                    "wrapper pid {pid} ended without recording an exit status in {}",
                    dir.display()
                )),
            )));
        }
        if let Some(claim) = folder::LaunchClaim::read(&dir)? {
            // A controller that died between its launch claim and the wrapper's start: the job
            // never ran, so it is queued again (see `launch_and_wait`).
            if let Some(r) = &rec
                && claim.abandoned(&dir)
            {
                return Ok(FolderView::Queued(Box::new(r.clone())));
            }
            let t = claim.at_ms;
            return Ok(FolderView::Status(Box::new(
                if now_ms().saturating_sub(t) < LAUNCH_GRACE.as_millis() as u64 {
                    status(JobState::Pending).with_reason("launching")
                } else {
                    status(JobState::Lost).with_reason(format!(
                        "launch claimed at {t} ms but no wrapper started (killed while \
                         launching?) in {}",
                        dir.display()
                    ))
                },
            )));
        }
        match rec {
            Some(r) => Ok(FolderView::Queued(Box::new(r))),
            None => Ok(FolderView::Status(Box::new(
                status(JobState::Lost)
                    .with_reason(format!("no attempt record in {}", dir.display())),
            ))),
        }
    }

    fn pending_reason(&self, st: &State, rec: &AttemptRecord) -> String {
        let need = rec.spec.topology.gpus_per_node() as usize;
        if st.running >= self.max_concurrent {
            format!("concurrency limit ({} running)", st.running)
        } else if need > 0 {
            format!("waiting for {need} free GPUs")
        } else {
            "queued".into()
        }
    }

    /// Signals a running job's process group, escalating, until its record exists.
    async fn cancel_running(&self, id: &AttemptId) -> Result<(), ExecutorError> {
        let dir = self.dir(id);
        if folder::read_exit(&dir)?.is_some() {
            return Ok(());
        }
        folder::write_replace(&dir, folder::CANCEL_FILE, now_ms().to_string().as_bytes())?;
        // The job pid may not be written yet if the launch is in progress.
        let mut job = None;
        for _ in 0..200 {
            job = folder::read_pid_file(&dir.join(folder::JOB_FILE))?;
            if job.is_some() || folder::read_exit(&dir)?.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let live =
            |job: Option<(i32, u64)>| job.filter(|&(p, t)| folder::is_same_process_alive(p, t));
        if let Some((pid, _)) = live(job) {
            wrapper::signal_group(pid, libc::SIGTERM);
        }
        let phases = [
            (self.kill_grace, Some(libc::SIGKILL)),
            (self.cancel_timeout, None),
        ];
        for (wait, then) in phases {
            let deadline = tokio::time::Instant::now() + wait;
            while tokio::time::Instant::now() < deadline {
                if folder::read_exit(&dir)?.is_some() {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if let (Some(sig), Some((pid, _))) = (then, live(job)) {
                wrapper::signal_group(pid, sig);
            }
        }
        let state = self.status_from_folder(id)?.state;
        if state.is_terminal() {
            return Ok(());
        }
        Err(ExecutorError::CancelUnconfirmed {
            attempt_id: id.clone(),
            job_id: id.to_string(),
            state: state.to_string(),
        })
    }
}

enum FolderView {
    Status(Box<JobStatus>),
    Queued(Box<AttemptRecord>),
}

/// Turns an exit record into a status: walltime beats cancel beats the raw outcome.
fn status_from_exit(base: JobStatus, exit: &ExitRecord, cancel_ms: Option<u64>) -> JobStatus {
    let cancelled = cancel_ms.is_some_and(|c| exit.end_ms.is_none_or(|e| e >= c));
    let mut s = base.with_times(exit.start_ms, exit.end_ms);
    match exit.kind {
        ExitKind::CancelledBeforeStart => {
            s.state = JobState::Cancelled { by_uid: None };
            s.reason = Some("cancelled before it started".into());
        }
        ExitKind::LaunchFailed(errno) => {
            s.state = JobState::LaunchFailed;
            s.exit_code = Some(127);
            s.reason = Some(format!(
                "cannot start the command: {}",
                std::io::Error::from_raw_os_error(errno)
            ));
        }
        ExitKind::Exited(code) => {
            s.exit_code = Some(code);
            s.state = if exit.timed_out {
                JobState::Timeout
            } else if cancelled {
                JobState::Cancelled { by_uid: None }
            } else if code == 0 {
                JobState::Completed
            } else {
                JobState::Failed
            };
            s.nodes = Some("localhost".into());
        }
        ExitKind::Signaled(sig) => {
            // Shells report death by signal N as exit 128+N; keep that convention for the code
            // and the real signal alongside.
            s.exit_code = Some(128 + sig);
            s.signal = Some(sig);
            s.state = if exit.timed_out {
                JobState::Timeout
            } else if cancelled {
                JobState::Cancelled { by_uid: None }
            } else {
                JobState::Killed { signal: sig }
            };
            s.nodes = Some("localhost".into());
        }
    }
    s
}

/// A job killed by SIGKILL (not by our walltime or a cancel) is an OOM kill only if the
/// `oom_kill` counter of its memory cgroup rose while it ran (N09); where no counter can be
/// read, the reason says "OOM unknown". The counters after the end are read once and kept in
/// the attempt folder, so a later OOM elsewhere in a shared cgroup never changes the verdict.
///
/// The cgroup is the one the controller ran in when it launched the job: the job's own when
/// the controller runs in a per-job cgroup (a container, `systemd-run --scope`), otherwise one
/// it shares with the controller's other jobs, where an OOM kill of a sibling that died in the
/// same window is attributed to both (a retry with more memory, never a wrong success).
fn with_oom_evidence(dir: &Path, mut s: JobStatus) -> JobStatus {
    if s.state
        != (JobState::Killed {
            signal: libc::SIGKILL,
        })
    {
        return s;
    }
    let before = std::fs::read_to_string(dir.join(folder::OOM_BEFORE_FILE)).unwrap_or_default();
    let file = before
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("file="))
        .map(PathBuf::from);
    let after = match std::fs::read_to_string(dir.join(folder::OOM_AFTER_FILE)) {
        Ok(t) => t,
        Err(_) => {
            let t = file
                .as_deref()
                .and_then(|f| std::fs::read_to_string(f).ok())
                .unwrap_or_default();
            // Best effort: without the record the verdict is recomputed next time.
            let _ = folder::write_atomic(dir, folder::OOM_AFTER_FILE, t.as_bytes());
            t
        }
    };
    let shown = file
        .as_deref()
        .map_or_else(|| "none".into(), |f| f.display().to_string());
    match oom::oom_verdict(
        &oom::parse_memory_events(&before),
        &oom::parse_memory_events(&after),
    ) {
        oom::OomEvidence::OomKilled { before, after } => {
            s.state = JobState::OutOfMemory;
            s.reason = Some(format!(
                "killed by the OOM killer: oom_kill of {shown} went from {before} to {after} while it ran"
            ));
        }
        oom::OomEvidence::NotOom => {}
        oom::OomEvidence::Unknown => {
            s.reason = Some(format!(
                "killed by signal 9; OOM unknown (no cgroup oom_kill counter: {shown})"
            ));
        }
    }
    s
}

/// What `launch.json` in an attempt folder holds: the rendering the job was started from and
/// the GPU ids it got (the local executor's launch record).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct LaunchRecord {
    /// What ran (as [`Executor::render`] shows it).
    pub rendering: Rendering,
    /// The GPU ids exported as `CUDA_VISIBLE_DEVICES`, chosen when the job started.
    pub gpus: Vec<String>,
}

impl LocalExecutor {
    /// The launch record of a started attempt (`<attempt folder>/launch.json`); `None` before
    /// it started.
    ///
    /// # Errors
    /// [`ExecutorError::Io`] or [`ExecutorError::Parse`] for an unreadable record.
    pub fn launch_record(&self, id: &AttemptId) -> Result<Option<LaunchRecord>, ExecutorError> {
        let p = self.inner.dir(id).join(folder::LAUNCH_FILE);
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| ExecutorError::Parse {
                    command: "launch record".into(),
                    detail: format!("{}: {e}", p.display()),
                    output: String::new(),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ExecutorError::io("reading", &p, e)),
        }
    }
}

/// What this machine cannot run: several nodes, several tasks without torchrun, a shell
/// script under torchrun, more GPUs than configured, a container or scheduler options (refused,
/// never dropped).
fn check_local(spec: &AttemptSpec, gpu_ids: &[String]) -> Result<(), ExecutorError> {
    spec.validate()?;
    let id = &spec.attempt_id;
    if spec.topology.nodes != 1 {
        return Err(ExecutorError::Unsatisfiable {
            attempt_id: id.clone(),
            needed: format!("{} nodes", spec.topology.nodes),
            available: "1 node (this machine)".into(),
        });
    }
    if spec.topology.ntasks_per_node != 1
        && !matches!(spec.topology.launcher, TaskLauncher::Torchrun { .. })
    {
        return Err(ExecutorError::InvalidSpec {
            attempt_id: Some(id.clone()),
            field: "topology.ntasks_per_node".into(),
            value: spec.topology.ntasks_per_node.to_string(),
            expected: "1 for the local executor (use the Torchrun launcher for several \
                       processes)"
                .into(),
        });
    }
    if spec.command.shell && matches!(spec.topology.launcher, TaskLauncher::Torchrun { .. }) {
        return Err(ExecutorError::InvalidSpec {
            attempt_id: Some(id.clone()),
            field: "command.shell".into(),
            value: "true".into(),
            expected: "false with the Torchrun launcher (torchrun runs a script file)".into(),
        });
    }
    let need = spec.topology.gpus_per_node() as usize;
    if need > gpu_ids.len() {
        return Err(ExecutorError::Unsatisfiable {
            attempt_id: id.clone(),
            needed: format!("{need} GPUs"),
            available: format!("{} GPUs (ids {})", gpu_ids.len(), gpu_ids.join(",")),
        });
    }
    spec.refuse_scheduler_options("local")
}

/// Finds `program` like `execvp` would: as given when it holds a `/` (relative to `cwd`),
/// else the first executable regular file in `PATH`.
fn resolve_program(program: &str, path: Option<&OsString>, cwd: Option<&Path>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let is_exec = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = match cwd {
            Some(c) if !program.starts_with('/') => c.join(program),
            _ => PathBuf::from(program),
        };
        // Leave a missing program to execve, which reports the precise errno.
        return Some(p);
    }
    let default = OsString::from("/usr/local/bin:/usr/bin:/bin");
    std::env::split_paths(path.unwrap_or(&default))
        .map(|d| d.join(program))
        .find(|p| is_exec(p))
}

#[async_trait]
impl Executor for LocalExecutor {
    fn kind(&self) -> &str {
        "local"
    }

    fn render(&self, spec: &AttemptSpec) -> Result<Rendering, ExecutorError> {
        self.inner.render(spec)
    }

    async fn submit(&self, spec: &AttemptSpec) -> Result<JobHandle, ExecutorError> {
        let inner = &self.inner;
        let id = &spec.attempt_id;
        inner.render(spec)?;
        inner.runtime()?;
        std::fs::create_dir_all(&inner.root)
            .map_err(|e| ExecutorError::io("creating executor root", &inner.root, e))?;
        let dir = inner.dir(id);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // A folder without a record is the remains of a submit that crashed: reuse it.
                if folder::read_attempt(&dir)?.is_some() {
                    return Err(ExecutorError::DuplicateAttempt {
                        attempt_id: id.clone(),
                        job_id: id.to_string(),
                    });
                }
            }
            Err(e) => return Err(ExecutorError::io("creating attempt folder", &dir, e)),
        }
        let rec = AttemptRecord {
            version: 1,
            submitted_at_ms: now_ms(),
            spec: spec.clone(),
        };
        let json = serde_json::to_vec_pretty(&rec).map_err(|e| ExecutorError::Other {
            message: format!("cannot serialize attempt {id}: {e}"),
            retryable: false,
        })?;
        folder::write_replace(&dir, folder::ATTEMPT_FILE, &json)?;
        let handle = inner.handle(id, rec.submitted_at_ms);
        let mut st = inner.lock();
        st.jobs.insert(id.clone(), Entry::Queued(Box::new(rec)));
        st.queue.push_back(id.clone());
        inner.dispatch(&mut st);
        Ok(handle)
    }

    async fn poll(&self, handles: &[JobHandle]) -> Result<Vec<JobStatus>, ExecutorError> {
        let inner = &self.inner;
        for h in handles {
            inner.check_handle(h)?;
        }
        if inner.runtime().is_ok() {
            // Queued jobs left by an earlier runtime start on this one.
            let mut st = inner.lock();
            if !st.queue.is_empty() {
                inner.dispatch(&mut st);
            }
        }
        let mut out = Vec::with_capacity(handles.len());
        let mut to_read = Vec::new();
        {
            let st = inner.lock();
            for (i, h) in handles.iter().enumerate() {
                let id = &h.attempt_id;
                out.push(match st.jobs.get(id) {
                    Some(Entry::Done(s)) => Some(s.clone()),
                    Some(Entry::Queued(rec)) => Some(
                        JobStatus::new(id.clone(), JobState::Pending)
                            .with_reason(inner.pending_reason(&st, rec))
                            .with_log_path(inner.log_path(&rec.spec)),
                    ),
                    Some(Entry::Running {
                        log_path,
                        started_ms,
                        ..
                    }) => Some(
                        JobStatus::new(id.clone(), JobState::Running)
                            .with_log_path(log_path)
                            .with_nodes("localhost")
                            .with_times(Some(*started_ms), None),
                    ),
                    Some(Entry::External) | None => {
                        to_read.push(i);
                        None
                    }
                });
            }
        }
        for i in to_read {
            let id = &handles[i].attempt_id;
            let status = match inner.folder_view(id)? {
                FolderView::Status(s) => *s,
                FolderView::Queued(rec) => {
                    // Queued by a controller that is gone: adopt it (the launch claim keeps it
                    // from running twice if that controller comes back).
                    inner.runtime()?;
                    let log = inner.log_path(&rec.spec);
                    let mut st = inner.lock();
                    if !st.jobs.contains_key(id) {
                        st.jobs.insert(id.clone(), Entry::Queued(rec));
                        st.queue.push_back(id.clone());
                        inner.dispatch(&mut st);
                    }
                    JobStatus::new(id.clone(), JobState::Pending)
                        .with_reason("adopted from an earlier controller")
                        .with_log_path(log)
                }
            };
            if status.state.is_terminal() {
                inner
                    .lock()
                    .jobs
                    .insert(id.clone(), Entry::Done(status.clone()));
            } else {
                inner
                    .lock()
                    .jobs
                    .entry(id.clone())
                    .or_insert(Entry::External);
            }
            out[i] = Some(status);
        }
        Ok(out.into_iter().map(|s| s.expect("filled above")).collect())
    }

    async fn cancel(&self, handle: &JobHandle) -> Result<(), ExecutorError> {
        let inner = &self.inner;
        inner.check_handle(handle)?;
        let id = &handle.attempt_id;
        let dir = inner.dir(id);
        let queued = {
            let mut st = inner.lock();
            match st.jobs.get(id) {
                Some(Entry::Done(_)) => return Ok(()),
                Some(Entry::Queued(_)) => {
                    st.jobs.remove(id);
                    st.queue.retain(|q| q != id);
                    true
                }
                Some(Entry::Running { .. }) | Some(Entry::External) => false,
                None => matches!(inner.folder_view(id)?, FolderView::Queued(_)),
            }
        };
        // If someone started it meanwhile, the claim fails: cancel it as a running job.
        if queued && Inner::claim_to_cancel(&dir)? {
            let t = now_ms();
            let rec = format!("status=cancelled_before_start\nstart_ms={t}\nend_ms={t}\n");
            folder::write_atomic(&dir, folder::EXIT_FILE, rec.as_bytes())?;
            let status = inner.status_from_folder(id)?;
            inner.lock().jobs.insert(id.clone(), Entry::Done(status));
            return Ok(());
        }
        inner.cancel_running(id).await?;
        // The exit record is written; the thread that waits on the wrapper may not have seen it
        // yet. Record the end now, so that a poll right after the cancel says Cancelled (that
        // thread later stores the same record and frees the slot).
        let status = inner.status_from_folder(id)?;
        if status.state.is_terminal() {
            let mut st = inner.lock();
            if matches!(st.jobs.get(id), Some(Entry::Running { .. })) {
                st.jobs.insert(id.clone(), Entry::Done(status));
            }
        }
        Ok(())
    }

    fn changes(&self) -> u64 {
        self.inner.ends.load(Ordering::SeqCst)
    }

    /// Wakes when a job this instance started ends (jobs it only follows through their folder,
    /// started by another controller, are seen at the end of `max`).
    async fn wait_change(&self, seen: u64, max: Duration) {
        let notified = self.inner.ended.notified();
        tokio::pin!(notified);
        // Registered before the check: an end between the check and the wait still wakes us.
        notified.as_mut().enable();
        if self.changes() != seen {
            return;
        }
        let _ = tokio::time::timeout(max, notified).await;
    }

    async fn find(&self, attempt_id: &AttemptId) -> Result<Option<JobHandle>, ExecutorError> {
        let dir = self.inner.dir(attempt_id);
        Ok(folder::read_attempt(&dir)?
            .map(|rec| self.inner.handle(attempt_id, rec.submitted_at_ms)))
    }

    /// Every attempt folder under the root whose name matches and whose job is still queued
    /// or running is cancelled (as by [`cancel`](Executor::cancel)).
    async fn cancel_matching(
        &self,
        matches: &(dyn for<'s> Fn(&'s str) -> bool + Send + Sync),
    ) -> Result<Vec<String>, ExecutorError> {
        let root = &self.inner.root;
        let entries = match std::fs::read_dir(root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(ExecutorError::io("listing", root, e)),
        };
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| ExecutorError::io("listing", root, e))?;
            let Some(name) = entry.file_name().to_str().map(String::from) else {
                continue;
            };
            if matches(&name)
                && let Ok(id) = AttemptId::new(&name)
            {
                ids.push(id);
            }
        }
        ids.sort();
        let mut cancelled = Vec::new();
        for id in ids {
            let Some(h) = self.find(&id).await? else {
                continue;
            };
            let st = self.poll(std::slice::from_ref(&h)).await?;
            if st[0].state.is_active() {
                self.cancel(&h).await?;
                cancelled.push(id.as_str().to_string());
            }
        }
        Ok(cancelled)
    }
}
