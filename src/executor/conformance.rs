//! The executor conformance suite (feature `test-util`): the contract of
//! [`Executor`] as executable checks, run against every built-in executor and
//! available to yours.
//!
//! ```no_run
//! # async fn demo() {
//! use puzzletron::executor::{conformance, MockExecutor};
//! let mock = MockExecutor::new().with_default_script(conformance::mock_script);
//! conformance::run_all(move || Box::new(mock.clone())).await;
//! # }
//! ```
//!
//! The factory is called several times; executors it returns must share their backing state
//! (same attempt root, same scheduler), because one check submits with one executor and
//! re-attaches with another, as a restarted controller would. Commands used: `true`,
//! `sh -c 'exit N'`, `sleep 300`, and `sh -c` checking `$PUZZLETRON_ARRAY_INDEX`; a mock
//! interprets them through [`mock_script`].
//!
//! Each check panics with a message naming the check and what differed.
//!
//! # Re-attach from a separate process
//!
//! A controller that crashed is restarted as a *new process*; an executor whose state lives
//! only in memory passes every in-process check and then loses every job. The
//! `find_from_separate_process` check therefore runs [`Executor::find`] in a child process you
//! provide ([`Conformance::with_separate_process`]): the child builds the executor over the
//! same backing state and calls [`child_find_main`], which prints the handle it found. The
//! usual child is your own test binary re-executed with `--exact <an entry-point test>`
//! (see `tests/executor_conformance.rs`). Only test doubles whose state is in memory by design
//! (the mock) may opt out, with a reason ([`Conformance::in_memory_only`]).

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{
    ARRAY_INDEX_ENV, ATTEMPT_ID_ENV, ArraySpec, AttemptId, AttemptSpec, CommandSpec, Executor,
    ExecutorError, ExecutorExt, JobHandle, JobState, JobStatus, MockScript,
};

/// The environment variable carrying the attempt id a child process of
/// `find_from_separate_process` must look up.
pub const CHILD_FIND_ENV: &str = "PUZZLETRON_CONFORMANCE_FIND";
/// The prefix of the line a child prints with what it found (JSON: a handle or `null`).
pub const CHILD_FOUND_PREFIX: &str = "PUZZLETRON_CONFORMANCE_FOUND: ";

/// The child side of `find_from_separate_process`: when [`CHILD_FIND_ENV`] is set, calls
/// `exec.find` on it and prints [`CHILD_FOUND_PREFIX`] followed by the handle as JSON (or
/// `null`) on stdout, and returns `true`. Returns `false` (doing nothing) when the variable is
/// not set, so the entry-point test passes trivially in a normal run.
///
/// # Panics
/// When the id is not a valid attempt id or `find` fails (the parent reports the child's
/// output).
pub async fn child_find_main(exec: &dyn Executor) -> bool {
    let Ok(id) = std::env::var(CHILD_FIND_ENV) else {
        return false;
    };
    let id = AttemptId::new(id).unwrap_or_else(|e| panic!("child: bad attempt id: {e}"));
    let found = exec
        .find(&id)
        .await
        .unwrap_or_else(|e| panic!("child: find failed: {e}"));
    let json = serde_json::to_string(&found).unwrap_or_else(|e| panic!("child: {e}"));
    // On a line of its own (a test harness may have printed the test's name before it).
    println!("\n{CHILD_FOUND_PREFIX}{json}");
    true
}

/// Builds the child command of `find_from_separate_process` (the attempt id is passed in
/// [`CHILD_FIND_ENV`] by the suite).
pub type ChildCommand = Box<dyn Fn() -> std::process::Command + Send + Sync>;

enum SeparateProcess {
    Child(ChildCommand),
    InMemoryOnly,
    Unset,
}

/// Makes a fresh executor over the same backing state.
pub type Factory = Box<dyn Fn() -> Box<dyn Executor> + Send + Sync>;
/// Adjusts every spec the suite submits (e.g. set a partition or a shared log folder).
pub type SpecHook = Box<dyn Fn(&mut AttemptSpec) + Send + Sync>;

/// The suite with its settings; [`run_all`] is the one-line form.
pub struct Conformance {
    factory: Factory,
    hook: SpecHook,
    timeout: Duration,
    interval: Duration,
    prefix: String,
    separate: SeparateProcess,
    scratch: PathBuf,
    walltime_timeout: Option<Duration>,
}

/// Runs every check with default settings (60 s per wait, 100 ms between polls).
///
/// # Panics
/// When a check fails, naming it.
pub async fn run_all<F>(factory: F)
where
    F: Fn() -> Box<dyn Executor> + Send + Sync + 'static,
{
    Conformance::new(factory).run_all().await
}

/// The [`MockScript`] matching the suite's commands: `true` completes, `sh -c 'exit N'` fails
/// with N (N = 0 completes), `sleep` runs until cancelled (or times out at the spec's
/// walltime), `sh -c 'echo X'` completes and logs `X`, the array check completes when its
/// index is below 3. Pass it to [`MockExecutor::with_default_script`](super::MockExecutor).
pub fn mock_script(spec: &AttemptSpec) -> MockScript {
    let argv = spec.command.effective_argv();
    let strs: Vec<&str> = argv.iter().map(String::as_str).collect();
    match strs.as_slice() {
        ["sleep", ..] => match spec.walltime {
            Some(w) => MockScript::new()
                .at(Duration::ZERO, JobState::Running)
                .at(w, JobState::Timeout),
            None => MockScript::runs_forever(),
        },
        [_, "-c", script] if script.starts_with("echo ") => {
            let mut s = MockScript::completes();
            s.log_text = format!("{}\n", &script["echo ".len()..]);
            s
        }
        [_, "-c", script] if script.starts_with("exit ") => {
            match script["exit ".len()..].trim().parse::<i32>() {
                Ok(0) => MockScript::completes(),
                Ok(n) => MockScript::fails_after(Duration::ZERO, n),
                Err(_) => MockScript::fails_after(Duration::ZERO, 2),
            }
        }
        [_, "-c", script] if script.contains(ARRAY_INDEX_ENV) => {
            match spec
                .command
                .env
                .get(ARRAY_INDEX_ENV)
                .and_then(|i| i.parse::<u32>().ok())
            {
                Some(i) if i < 3 => MockScript::completes(),
                _ => MockScript::fails_after(Duration::ZERO, 1),
            }
        }
        _ => MockScript::completes(),
    }
}

impl Conformance {
    /// The suite over executors from `factory`.
    pub fn new<F>(factory: F) -> Self
    where
        F: Fn() -> Box<dyn Executor> + Send + Sync + 'static,
    {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Self {
            factory: Box::new(factory),
            hook: Box::new(|_| {}),
            timeout: Duration::from_secs(60),
            interval: Duration::from_millis(100),
            prefix: format!("conf{}-{:x}", std::process::id(), nanos % 0xffff_ffff),
            separate: SeparateProcess::Unset,
            scratch: std::env::temp_dir(),
            walltime_timeout: None,
        }
    }

    /// Longest wait for a 1 s walltime to end a job (default: the [`with_timeout`] value).
    /// Schedulers with minute resolution and a periodic limit check (Slurm) need minutes.
    ///
    /// [`with_timeout`]: Self::with_timeout
    pub fn with_walltime_timeout(mut self, timeout: Duration) -> Self {
        self.walltime_timeout = Some(timeout);
        self
    }

    /// How to start a child process that builds the executor over the same backing state and
    /// calls [`child_find_main`] (required by `run_all` unless [`in_memory_only`]).
    ///
    /// [`in_memory_only`]: Self::in_memory_only
    pub fn with_separate_process(
        mut self,
        child: impl Fn() -> std::process::Command + Send + Sync + 'static,
    ) -> Self {
        self.separate = SeparateProcess::Child(Box::new(child));
        self
    }

    /// Skips `find_from_separate_process`, for test doubles whose state is in memory by design
    /// (the mock). A real executor must not use this: its jobs would be lost when a
    /// controller restarts.
    pub fn in_memory_only(mut self) -> Self {
        self.separate = SeparateProcess::InMemoryOnly;
        self
    }

    /// A folder every place the jobs run can write to, for the `log_path_honoured` check's
    /// log (default: the system temporary folder; on a cluster, a shared filesystem).
    pub fn with_scratch_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.scratch = dir.into();
        self
    }

    /// Adjusts every spec before submission.
    pub fn with_spec_hook(
        mut self,
        hook: impl Fn(&mut AttemptSpec) + Send + Sync + 'static,
    ) -> Self {
        self.hook = Box::new(hook);
        self
    }

    /// Longest wait for a job to reach a state (default 60 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Pause between polls (default 100 ms).
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Runs every check, in order.
    ///
    /// # Panics
    /// When a check fails, naming it.
    pub async fn run_all(&self) {
        self.empty_poll().await;
        self.invalid_spec_rejected().await;
        self.completes().await;
        self.fails_with_exit_code().await;
        self.poll_many_in_order().await;
        self.cancel_running().await;
        self.cancel_finished_is_noop().await;
        self.reattach_after_restart().await;
        self.find_recovers_handle().await;
        self.array_tasks().await;
        self.foreign_handle_refused().await;
        self.unknown_handle_is_lost().await;
        self.attempt_id_env_set().await;
        self.log_path_honoured().await;
        self.walltime_honoured().await;
        match &self.separate {
            SeparateProcess::InMemoryOnly => {}
            _ => self.find_from_separate_process().await,
        }
    }

    fn id(&self, name: &str) -> AttemptId {
        AttemptId::new(format!("{}.{name}", self.prefix))
            .unwrap_or_else(|e| panic!("conformance: bad generated attempt id: {e}"))
    }

    fn spec(&self, name: &str, command: CommandSpec) -> AttemptSpec {
        let mut spec = AttemptSpec::new(self.id(name), command);
        (self.hook)(&mut spec);
        spec
    }

    fn exit(code: i32) -> CommandSpec {
        CommandSpec::new("sh").args(["-c".to_string(), format!("exit {code}")])
    }

    async fn submit(&self, exec: &dyn Executor, check: &str, spec: &AttemptSpec) -> JobHandle {
        let h = exec
            .submit(spec)
            .await
            .unwrap_or_else(|e| panic!("conformance `{check}`: submit failed: {e}"));
        assert_eq!(
            h.attempt_id, spec.attempt_id,
            "conformance `{check}`: handle carries a different attempt id"
        );
        assert_eq!(
            h.executor,
            exec.kind(),
            "conformance `{check}`: handle.executor differs from kind()"
        );
        h
    }

    async fn wait(
        &self,
        exec: &dyn Executor,
        check: &str,
        handles: &[JobHandle],
    ) -> Vec<JobStatus> {
        let st = exec
            .wait_terminal(handles, self.interval, self.timeout)
            .await
            .unwrap_or_else(|e| panic!("conformance `{check}`: poll failed: {e}"));
        assert_eq!(
            st.len(),
            handles.len(),
            "conformance `{check}`: poll returned {} statuses for {} handles",
            st.len(),
            handles.len()
        );
        for (s, h) in st.iter().zip(handles) {
            assert_eq!(
                s.attempt_id, h.attempt_id,
                "conformance `{check}`: statuses not in handle order"
            );
            assert!(
                s.state.is_terminal(),
                "conformance `{check}`: attempt {} still {} after {:?}",
                h.attempt_id,
                s.state,
                self.timeout
            );
        }
        st
    }

    /// `poll(&[])` returns no statuses.
    pub async fn empty_poll(&self) {
        let exec = (self.factory)();
        let st = exec
            .poll(&[])
            .await
            .unwrap_or_else(|e| panic!("conformance `empty_poll`: {e}"));
        assert!(st.is_empty(), "conformance `empty_poll`: got {st:?}");
    }

    /// An empty argv is refused with a non-retryable `InvalidSpec`.
    pub async fn invalid_spec_rejected(&self) {
        let exec = (self.factory)();
        let mut spec = self.spec("invalid", CommandSpec::new("true"));
        spec.command.argv.clear();
        match exec.submit(&spec).await {
            Err(e @ ExecutorError::InvalidSpec { .. }) => assert!(
                !e.is_retryable(),
                "conformance `invalid_spec_rejected`: InvalidSpec must not be retryable"
            ),
            other => panic!(
                "conformance `invalid_spec_rejected`: expected InvalidSpec for empty argv, got {other:?}"
            ),
        }
    }

    /// `true` ends `Completed` with exit code 0.
    pub async fn completes(&self) {
        let exec = (self.factory)();
        let spec = self.spec("true", CommandSpec::new("true"));
        let h = self.submit(&*exec, "completes", &spec).await;
        let st = self.wait(&*exec, "completes", &[h]).await;
        assert_eq!(
            (&st[0].state, st[0].exit_code),
            (&JobState::Completed, Some(0)),
            "conformance `completes`: {:?}",
            st[0]
        );
    }

    /// `sh -c 'exit 3'` ends `Failed` with exit code 3.
    pub async fn fails_with_exit_code(&self) {
        let exec = (self.factory)();
        let spec = self.spec("exit3", Self::exit(3));
        let h = self.submit(&*exec, "fails_with_exit_code", &spec).await;
        let st = self.wait(&*exec, "fails_with_exit_code", &[h]).await;
        assert_eq!(
            (&st[0].state, st[0].exit_code),
            (&JobState::Failed, Some(3)),
            "conformance `fails_with_exit_code`: {:?}",
            st[0]
        );
    }

    /// Four jobs polled in one call come back in order with their own outcomes.
    pub async fn poll_many_in_order(&self) {
        let exec = (self.factory)();
        let codes = [0, 1, 2, 0];
        let mut handles = Vec::new();
        for (i, c) in codes.iter().enumerate() {
            let spec = self.spec(&format!("many{i}"), Self::exit(*c));
            handles.push(self.submit(&*exec, "poll_many_in_order", &spec).await);
        }
        let st = self.wait(&*exec, "poll_many_in_order", &handles).await;
        for (s, c) in st.iter().zip(codes) {
            let want = if c == 0 {
                JobState::Completed
            } else {
                JobState::Failed
            };
            assert_eq!(
                (&s.state, s.exit_code),
                (&want, Some(c)),
                "conformance `poll_many_in_order`: {s:?}"
            );
        }
    }

    /// A long job is cancelled: `cancel` returns, the job ends `Cancelled`, a second cancel is
    /// fine.
    pub async fn cancel_running(&self) {
        let exec = (self.factory)();
        let spec = self.spec("sleep", CommandSpec::new("sleep").arg("300"));
        let h = self.submit(&*exec, "cancel_running", &spec).await;
        exec.cancel(&h)
            .await
            .unwrap_or_else(|e| panic!("conformance `cancel_running`: cancel failed: {e}"));
        let st = self
            .wait(&*exec, "cancel_running", std::slice::from_ref(&h))
            .await;
        assert!(
            matches!(st[0].state, JobState::Cancelled { .. }),
            "conformance `cancel_running`: expected Cancelled, got {:?}",
            st[0]
        );
        exec.cancel(&h)
            .await
            .unwrap_or_else(|e| panic!("conformance `cancel_running`: second cancel failed: {e}"));
    }

    /// Cancelling a finished job succeeds and leaves it `Completed`.
    pub async fn cancel_finished_is_noop(&self) {
        let exec = (self.factory)();
        let spec = self.spec("done", CommandSpec::new("true"));
        let h = self.submit(&*exec, "cancel_finished_is_noop", &spec).await;
        self.wait(&*exec, "cancel_finished_is_noop", std::slice::from_ref(&h))
            .await;
        exec.cancel(&h)
            .await
            .unwrap_or_else(|e| panic!("conformance `cancel_finished_is_noop`: {e}"));
        let st = exec
            .poll(std::slice::from_ref(&h))
            .await
            .unwrap_or_else(|e| panic!("conformance `cancel_finished_is_noop`: {e}"));
        assert_eq!(
            st[0].state,
            JobState::Completed,
            "conformance `cancel_finished_is_noop`: cancel changed a finished job"
        );
    }

    /// A handle serialized to JSON and read back is polled to its end by a fresh executor.
    pub async fn reattach_after_restart(&self) {
        let json = {
            let exec = (self.factory)();
            let spec = self.spec("reattach", Self::exit(4));
            let h = self.submit(&*exec, "reattach_after_restart", &spec).await;
            serde_json::to_string(&h)
                .unwrap_or_else(|e| panic!("conformance `reattach_after_restart`: {e}"))
        };
        let h: JobHandle = serde_json::from_str(&json).unwrap_or_else(|e| {
            panic!("conformance `reattach_after_restart`: handle JSON does not read back: {e}")
        });
        let exec = (self.factory)();
        let st = self.wait(&*exec, "reattach_after_restart", &[h]).await;
        assert_eq!(
            (&st[0].state, st[0].exit_code),
            (&JobState::Failed, Some(4)),
            "conformance `reattach_after_restart`: {:?}",
            st[0]
        );
    }

    /// A fresh executor finds the job of a submitted attempt id; an unknown id finds nothing.
    pub async fn find_recovers_handle(&self) {
        let spec = self.spec("findme", CommandSpec::new("true"));
        let submitted = {
            let exec = (self.factory)();
            self.submit(&*exec, "find_recovers_handle", &spec).await
        };
        let exec = (self.factory)();
        let found = exec
            .find(&spec.attempt_id)
            .await
            .unwrap_or_else(|e| panic!("conformance `find_recovers_handle`: {e}"));
        let found = found.unwrap_or_else(|| {
            panic!(
                "conformance `find_recovers_handle`: no job found for {}",
                spec.attempt_id
            )
        });
        assert_eq!(
            (&found.attempt_id, &found.job_id, found.array_task),
            (
                &submitted.attempt_id,
                &submitted.job_id,
                submitted.array_task
            ),
            "conformance `find_recovers_handle`: found a different job"
        );
        self.wait(&*exec, "find_recovers_handle", &[found]).await;
        let none = exec
            .find(&self.id("never-submitted"))
            .await
            .unwrap_or_else(|e| panic!("conformance `find_recovers_handle`: {e}"));
        assert!(
            none.is_none(),
            "conformance `find_recovers_handle`: found {none:?} for an unknown attempt"
        );
    }

    /// An array of 3 gives 3 handles (ids `<base>_0..2`), each task sees its index, all
    /// complete; a task is found by its task id.
    pub async fn array_tasks(&self) {
        let exec = (self.factory)();
        let template = self.spec(
            "arr",
            CommandSpec::new("sh").args([
                "-c".to_string(),
                format!("test \"${ARRAY_INDEX_ENV}\" -lt 3"),
            ]),
        );
        let array = ArraySpec {
            template,
            size: 3,
            max_concurrent: None,
        };
        let handles = exec
            .submit_array(&array)
            .await
            .unwrap_or_else(|e| panic!("conformance `array_tasks`: submit_array failed: {e}"));
        assert_eq!(handles.len(), 3, "conformance `array_tasks`: handle count");
        for (i, h) in handles.iter().enumerate() {
            let want = array
                .template
                .attempt_id
                .array_task(i as u32)
                .expect("short id");
            assert_eq!(h.attempt_id, want, "conformance `array_tasks`: task id");
        }
        let st = self.wait(&*exec, "array_tasks", &handles).await;
        for s in &st {
            assert_eq!(
                (&s.state, s.exit_code),
                (&JobState::Completed, Some(0)),
                "conformance `array_tasks`: {s:?} (is {ARRAY_INDEX_ENV} set per task?)"
            );
        }
        let found = exec
            .find(&handles[1].attempt_id)
            .await
            .unwrap_or_else(|e| panic!("conformance `array_tasks`: find failed: {e}"))
            .unwrap_or_else(|| panic!("conformance `array_tasks`: task 1 not found"));
        assert_eq!(
            (&found.job_id, found.array_task),
            (&handles[1].job_id, handles[1].array_task),
            "conformance `array_tasks`: find returned a different task"
        );
    }

    /// A handle of another executor kind is refused by `poll` with `ForeignHandle`.
    pub async fn foreign_handle_refused(&self) {
        let exec = (self.factory)();
        let other = if exec.kind() == "conformance-other" {
            "conformance-other2"
        } else {
            "conformance-other"
        };
        let h = JobHandle::new(other, self.id("foreign"), "1", 0);
        match exec.poll(&[h]).await {
            Err(ExecutorError::ForeignHandle { .. }) => {}
            other => panic!(
                "conformance `foreign_handle_refused`: expected ForeignHandle, got {other:?}"
            ),
        }
    }

    /// A handle of this executor's kind for a job it never ran (an attempt id never
    /// submitted, a job id no scheduler has, submitted long ago) is reported
    /// [`JobState::Lost`], not an error and not a state that waits forever: a controller that
    /// restarts with a stale journal must be able to apply its policy.
    pub async fn unknown_handle_is_lost(&self) {
        let check = "unknown_handle_is_lost";
        let exec = (self.factory)();
        let spec = self.spec("shape", CommandSpec::new("true"));
        let real = self.submit(&*exec, check, &spec).await;
        self.wait(&*exec, check, std::slice::from_ref(&real)).await;
        let mut h = real.clone();
        h.attempt_id = self.id("never-submitted-handle");
        h.job_id = if !real.job_id.is_empty() && real.job_id.bytes().all(|b| b.is_ascii_digit()) {
            // Above Slurm's largest job id (0x03FF0000) and most schedulers' ranges.
            "4000000000".into()
        } else {
            h.attempt_id.as_str().to_string()
        };
        h.array_task = None;
        h.submitted_at_ms = 1; // long ago: no grace for "not visible yet"
        // Executor details (log paths, folders) name the never-submitted attempt instead.
        for v in h.data.values_mut() {
            *v = v.replace(real.attempt_id.as_str(), h.attempt_id.as_str());
        }
        let st = self.wait(&*exec, check, &[h]).await;
        assert_eq!(
            st[0].state,
            JobState::Lost,
            "conformance `{check}`: an unknown job must be Lost, got {:?}",
            st[0]
        );
    }

    /// The job sees its attempt id in [`ATTEMPT_ID_ENV`] (payloads use it to name their
    /// outputs and claim pool items).
    pub async fn attempt_id_env_set(&self) {
        let check = "attempt_id_env_set";
        let exec = (self.factory)();
        let id = self.id("envid");
        let spec = self.spec(
            "envid",
            CommandSpec::new("sh").args([
                "-c".to_string(),
                format!("test \"${ATTEMPT_ID_ENV}\" = '{id}'"),
            ]),
        );
        let h = self.submit(&*exec, check, &spec).await;
        let st = self.wait(&*exec, check, &[h]).await;
        assert_eq!(
            (&st[0].state, st[0].exit_code),
            (&JobState::Completed, Some(0)),
            "conformance `{check}`: the job did not see {ATTEMPT_ID_ENV}={id}: {:?}",
            st[0]
        );
    }

    /// A spec's `log_path` receives the job's output, and the status names that path.
    pub async fn log_path_honoured(&self) {
        let check = "log_path_honoured";
        let exec = (self.factory)();
        let log = self.scratch.join(format!("{}.log-check.log", self.prefix));
        let _ = std::fs::remove_file(&log);
        let marker = format!("conformance-log-{}", self.prefix);
        let mut spec = self.spec(
            "logpath",
            CommandSpec::new("sh").args(["-c".to_string(), format!("echo {marker}")]),
        );
        spec.log_path = Some(log.clone());
        let h = self.submit(&*exec, check, &spec).await;
        let st = self.wait(&*exec, check, &[h]).await;
        assert_eq!(
            st[0].state,
            JobState::Completed,
            "conformance `{check}`: {:?}",
            st[0]
        );
        let text = std::fs::read_to_string(&log).unwrap_or_else(|e| {
            panic!(
                "conformance `{check}`: the spec's log_path {} was not written: {e}",
                log.display()
            )
        });
        let _ = std::fs::remove_file(&log);
        assert!(
            text.contains(&marker),
            "conformance `{check}`: {} lacks the job's output `{marker}`: {text:?}",
            log.display()
        );
        assert_eq!(
            st[0].log_path.as_deref(),
            Some(log.as_path()),
            "conformance `{check}`: the status names another log"
        );
    }

    /// A job running past its `walltime` is stopped and reported [`JobState::Timeout`]
    /// (schedulers with minute resolution round up: see [`with_walltime_timeout`]).
    ///
    /// [`with_walltime_timeout`]: Self::with_walltime_timeout
    pub async fn walltime_honoured(&self) {
        let check = "walltime_honoured";
        let exec = (self.factory)();
        let spec = self
            .spec("walltime", CommandSpec::new("sleep").arg("600"))
            .with_walltime(Duration::from_secs(1));
        let h = self.submit(&*exec, check, &spec).await;
        let st = exec
            .wait_terminal(
                std::slice::from_ref(&h),
                self.interval,
                self.walltime_timeout.unwrap_or(self.timeout),
            )
            .await
            .unwrap_or_else(|e| panic!("conformance `{check}`: poll failed: {e}"));
        if st[0].state.is_active() {
            let _ = exec.cancel(&h).await;
        }
        assert_eq!(
            st[0].state,
            JobState::Timeout,
            "conformance `{check}`: a 1 s walltime on `sleep 600` must end Timeout: {:?}",
            st[0]
        );
    }

    /// A job submitted here is found by `find` in a separate process (a restarted
    /// controller), with the same job id.
    pub async fn find_from_separate_process(&self) {
        let check = "find_from_separate_process";
        let SeparateProcess::Child(child) = &self.separate else {
            panic!(
                "conformance `{check}`: no child process configured; call \
                 Conformance::with_separate_process (or in_memory_only for a test double)"
            );
        };
        let exec = (self.factory)();
        let spec = self.spec("childfind", CommandSpec::new("true"));
        let submitted = self.submit(&*exec, check, &spec).await;
        let mut cmd = child();
        cmd.env(CHILD_FIND_ENV, spec.attempt_id.as_str());
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap_or_else(|e| panic!("conformance `{check}`: {e}"))
            .unwrap_or_else(|e| panic!("conformance `{check}`: could not start the child: {e}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let Some(json) = stdout.lines().find_map(|l| {
            l.find(CHILD_FOUND_PREFIX)
                .map(|i| &l[i + CHILD_FOUND_PREFIX.len()..])
        }) else {
            panic!(
                "conformance `{check}`: the child printed no `{CHILD_FOUND_PREFIX}` line \
                 (exit {:?}); stdout: {stdout}; stderr: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let found: Option<JobHandle> = serde_json::from_str(json)
            .unwrap_or_else(|e| panic!("conformance `{check}`: bad child output {json:?}: {e}"));
        let found = found.unwrap_or_else(|| {
            panic!(
                "conformance `{check}`: a separate process found no job for {} (is the \
                 executor's state only in memory?)",
                spec.attempt_id
            )
        });
        assert_eq!(
            (&found.attempt_id, &found.job_id),
            (&submitted.attempt_id, &submitted.job_id),
            "conformance `{check}`: the child found a different job"
        );
        self.wait(&*exec, check, &[found]).await;
    }
}
