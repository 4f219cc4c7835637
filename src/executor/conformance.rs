//! The executor conformance suite (feature `test-util`): the contract of
//! [`Executor`] as executable checks, run against every built-in executor and
//! available to yours.
//!
//! Your executor, from a `#[test]` (here the local executor stands in for it):
//!
//! ```standalone_crate
//! use puzzletron::executor::{LocalExecutor, conformance};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! conformance::run_all(|| {
//!     // The same backing state in every executor the factory makes, in this process and in
//!     // the restarted one the suite starts (see below): here one attempt folder.
//!     let root = conformance::scratch_dir().join("attempts");
//!     Box::new(LocalExecutor::builder(root).build().expect("an executor"))
//! })
//! .await;
//! # }
//! ```
//!
//! A test double whose jobs live in memory by design (the mock, on a virtual clock that each
//! poll advances) opts out of the restarted process, with a reason:
//!
//! ```
//! use std::time::Duration;
//! use puzzletron::executor::{MockExecutor, conformance};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let mock = MockExecutor::new()
//!     .with_default_script(conformance::mock_script)
//!     .with_auto_advance(Duration::from_secs(1)); // else `sleep` and walltimes never end
//! conformance::Conformance::new(move || Box::new(mock.clone()))
//!     .with_poll_interval(Duration::from_millis(1))
//!     .in_memory_only()
//!     .run_all()
//!     .await;
//! # }
//! ```
//!
//! The factory is called several times; executors it returns must share their backing state
//! (same attempt root, same scheduler), because one check submits with one executor and
//! re-attaches with another, as a restarted controller would. Commands used: `true`,
//! `sh -c 'exit N'`, `sleep 300`, and `sh -c` checking `$PUZZLETRON_ARRAY_INDEX`; a mock
//! interprets them through [`mock_script`].
//!
//! Each check panics with `conformance `CHECK`:`, the rule it checks and what the executor did.
//!
//! # A restarted process
//!
//! A controller that crashed is restarted as a *new process*; an executor whose state lives
//! only in memory passes every in-process check and then loses every job, or reports a job
//! that completed as [`JobState::Lost`]. Two checks therefore run in a second process:
//! `find_from_separate_process` ([`Executor::find`] there finds the job submitted here) and
//! `poll_from_separate_process` (a handle of a job that ended here polls there as the same
//! terminal state, never `Lost`).
//!
//! By default the suite starts that process itself: it re-executes the running binary — a
//! test binary, with the name of the test that called [`Conformance::new`] (or [`run_all`]),
//! `--exact` and `--nocapture`; a program or doctest, with no arguments — and the same call
//! there, seeing [`CHILD_FIND_ENV`] or [`CHILD_POLL_ENV`], builds an executor with the same
//! factory, answers on stdout and ends the process. So the factory must reach the same
//! backing state in both processes: a scheduler does by itself; an executor over a folder uses
//! [`scratch_dir`], which is one folder for the suite and its child (a new temporary folder
//! made in the child would be empty). Nothing is needed besides: no `--nocapture`, no entry
//! point of your own.
//!
//! Where the suite cannot re-execute the caller (the suite's future moved to another thread,
//! so the test's name is unknown), or the child needs other arguments, give it the command:
//! [`Conformance::with_separate_process`], whose child calls [`child_main`] with its own
//! executor (see `tests/executor_conformance.rs`). Only test doubles whose state is in
//! memory by design (the mock) may skip the restarted process ([`Conformance::in_memory_only`]).

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
/// The environment variable carrying the handle (JSON) a child process of
/// `poll_from_separate_process` must poll to its end.
pub const CHILD_POLL_ENV: &str = "PUZZLETRON_CONFORMANCE_POLL";
/// The prefix of the line a child prints with the status it polled (JSON).
pub const CHILD_POLLED_PREFIX: &str = "PUZZLETRON_CONFORMANCE_POLLED: ";
/// The environment variable naming the [`scratch_dir`] of the suite, in its child process.
pub const SCRATCH_ENV: &str = "PUZZLETRON_CONFORMANCE_SCRATCH";

/// How long a child polls a handle for a terminal state.
const CHILD_POLL_TIMEOUT: Duration = Duration::from_secs(60);

/// A folder for the executor's backing state (attempt folders, logs) that is the same folder
/// in the suite's process and in the child process it starts (see the module docs): made
/// under the system temporary folder on the first call in the suite's process, named by
/// [`SCRATCH_ENV`] in the child. One folder per process, shared by every suite the process
/// runs (they may run at once, on the threads of a test harness), and not removed: it holds a
/// few small files per check.
///
/// # Panics
/// When the folder cannot be made.
pub fn scratch_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(SCRATCH_ENV) {
        return PathBuf::from(dir);
    }
    SCRATCH
        .get_or_init(|| {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let dir = std::env::temp_dir().join(format!(
                "puzzletron-conformance-{}-{:x}",
                std::process::id(),
                nanos % 0xffff_ffff
            ));
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| {
                panic!(
                    "conformance: cannot make the scratch folder {}: {e}",
                    dir.display()
                )
            });
            dir
        })
        .clone()
}

/// The [`scratch_dir`] made in this process, if any.
static SCRATCH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Whether this process is a child the suite started (it answers, then ends).
fn is_child() -> bool {
    std::env::var_os(CHILD_FIND_ENV).is_some() || std::env::var_os(CHILD_POLL_ENV).is_some()
}

/// The child side of the restarted-process checks: when [`CHILD_FIND_ENV`] is set, calls
/// `exec.find` on it and prints [`CHILD_FOUND_PREFIX`] followed by the handle as JSON (or
/// `null`); when [`CHILD_POLL_ENV`] is set, polls that handle until it is terminal (or a
/// minute passed) and prints [`CHILD_POLLED_PREFIX`] followed by the status as JSON. Both on
/// stdout, on lines of their own, past any capture of the test harness. Returns whether it
/// answered (`false`, doing nothing, in a normal run: an entry-point test then passes
/// trivially). Needed only with [`Conformance::with_separate_process`]; the suite's own child
/// calls it by itself.
///
/// # Panics
/// When a variable does not hold what it should or the executor fails (the parent reports
/// the child's output).
pub async fn child_main(exec: &dyn Executor) -> bool {
    let mut answered = false;
    if let Ok(id) = std::env::var(CHILD_FIND_ENV) {
        let id = AttemptId::new(id).unwrap_or_else(|e| panic!("child: bad attempt id: {e}"));
        let found = exec
            .find(&id)
            .await
            .unwrap_or_else(|e| panic!("child: find failed: {e}"));
        let json = serde_json::to_string(&found).unwrap_or_else(|e| panic!("child: {e}"));
        answer(CHILD_FOUND_PREFIX, &json);
        answered = true;
    }
    if let Ok(json) = std::env::var(CHILD_POLL_ENV) {
        let h: JobHandle = serde_json::from_str(&json)
            .unwrap_or_else(|e| panic!("child: {CHILD_POLL_ENV} is not a handle: {e}"));
        let st = exec
            .wait_terminal(
                std::slice::from_ref(&h),
                Duration::from_millis(100),
                CHILD_POLL_TIMEOUT,
            )
            .await
            .unwrap_or_else(|e| panic!("child: poll failed: {e}"));
        let json = serde_json::to_string(&st[0]).unwrap_or_else(|e| panic!("child: {e}"));
        answer(CHILD_POLLED_PREFIX, &json);
        answered = true;
    }
    answered
}

/// The former name of [`child_main`].
#[deprecated(note = "renamed `child_main`: it answers `poll` as well as `find` now")]
pub async fn child_find_main(exec: &dyn Executor) -> bool {
    child_main(exec).await
}

/// Writes `prefix` + `json` on a line of its own to the process's stdout (not through
/// `println!`, which a test harness captures).
fn answer(prefix: &str, json: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "\n{prefix}{json}\n");
    let _ = out.flush();
}

/// Builds the child command of the restarted-process checks (the suite adds the request's
/// variable and [`SCRATCH_ENV`]).
pub type ChildCommand = Box<dyn Fn() -> std::process::Command + Send + Sync>;

enum SeparateProcess {
    Child(ChildCommand),
    InMemoryOnly,
    /// Re-execute this binary (see the module docs).
    Rerun(Rerun),
}

/// How the suite re-executes the binary that runs it.
enum Rerun {
    /// A test binary: the test of this name, alone.
    Test(String),
    /// A program (or doctest) on its main thread: the program, without arguments.
    Program,
    /// Neither can be told: the suite runs on a thread that is not its test's.
    Unknown(Option<String>),
}

impl Rerun {
    /// From the name of the thread that built the suite: libtest names each test's thread
    /// after the test; a program's first thread is `main`.
    fn here() -> Self {
        match std::thread::current().name() {
            Some("main") => Rerun::Program,
            Some(n) if n.starts_with("tokio-") => Rerun::Unknown(Some(n.to_string())),
            Some(n) => Rerun::Test(n.to_string()),
            None => Rerun::Unknown(None),
        }
    }
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
            separate: SeparateProcess::Rerun(Rerun::here()),
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

    /// How to start the restarted process, instead of re-executing this binary: a child that
    /// builds the executor over the same backing state and calls [`child_main`] (see the
    /// module docs).
    pub fn with_separate_process(
        mut self,
        child: impl Fn() -> std::process::Command + Send + Sync + 'static,
    ) -> Self {
        self.separate = SeparateProcess::Child(Box::new(child));
        self
    }

    /// Skips the restarted-process checks, for test doubles whose state is in memory by design
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

    /// Runs every check, in order, the restarted-process ones last (see the module docs).
    ///
    /// In the child process the suite starts, it answers the parent's request instead and
    /// ends the process (exit status 0).
    ///
    /// # Panics
    /// When a check fails, naming it.
    pub async fn run_all(&self) {
        self.answer_if_child().await;
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
            SeparateProcess::Rerun(Rerun::Unknown(thread)) => {
                // Test tooling: the test's own output is where this must be seen.
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr().lock(),
                    "conformance: find_from_separate_process and poll_from_separate_process \
                     did not run: the suite was built on thread {thread:?}, not on its test's \
                     thread, so it cannot re-execute that test; build it in the test's body \
                     or give it Conformance::with_separate_process"
                );
            }
            _ => {
                self.find_from_separate_process().await;
                self.poll_from_separate_process().await;
            }
        }
    }

    /// In the restarted process the suite started (its request's variable is set), answers
    /// the request with an executor of the factory and ends the process: whichever check the
    /// re-executed test calls, it never starts a process of its own there.
    async fn answer_if_child(&self) {
        if is_child() {
            let exec = (self.factory)();
            child_main(&*exec).await;
            std::process::exit(0);
        }
    }

    /// Runs the restarted process with `var=value` and returns what it answered after
    /// `prefix`.
    async fn in_child(&self, check: &str, var: &str, value: &str, prefix: &str) -> String {
        let mut cmd = match &self.separate {
            SeparateProcess::Child(child) => child(),
            SeparateProcess::Rerun(Rerun::Test(name)) => {
                let mut c = std::process::Command::new(current_exe(check));
                c.args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"]);
                c
            }
            SeparateProcess::Rerun(Rerun::Program) => {
                std::process::Command::new(current_exe(check))
            }
            SeparateProcess::Rerun(Rerun::Unknown(thread)) => panic!(
                "conformance `{check}`: cannot start the restarted process: the suite was built \
                 on thread {thread:?}, not on its test's thread; build it in the test's body or \
                 give it Conformance::with_separate_process"
            ),
            SeparateProcess::InMemoryOnly => panic!(
                "conformance `{check}`: the suite was told the executor is in memory only \
                 (Conformance::in_memory_only): it has no restarted process"
            ),
        };
        cmd.env(var, value);
        if let Some(dir) = SCRATCH.get() {
            cmd.env(SCRATCH_ENV, dir);
        }
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap_or_else(|e| panic!("conformance `{check}`: {e}"))
            .unwrap_or_else(|e| panic!("conformance `{check}`: could not start the child: {e}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let Some(json) = stdout
            .lines()
            .find_map(|l| l.find(prefix).map(|i| l[i + prefix.len()..].to_string()))
        else {
            panic!(
                "conformance `{check}`: the restarted process must answer with a `{prefix}` \
                 line (from child_main); it printed none (exit {:?}); stdout: {stdout}; \
                 stderr: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        json
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
            "conformance `{check}`: the handle submit returns must carry the spec's attempt id"
        );
        assert_eq!(
            h.executor,
            exec.kind(),
            "conformance `{check}`: the handle's executor must be the executor's kind()"
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
            "conformance `{check}`: poll must return one status per handle; it returned {} for \
             {} handles",
            st.len(),
            handles.len()
        );
        for (s, h) in st.iter().zip(handles) {
            assert_eq!(
                s.attempt_id, h.attempt_id,
                "conformance `{check}`: poll must return the statuses in the order of the handles"
            );
            assert!(
                s.state.is_terminal(),
                "conformance `{check}`: attempt {} must reach a terminal state; still {} after \
                 {:?}",
                h.attempt_id,
                s.state,
                self.timeout
            );
        }
        st
    }

    /// `poll(&[])` returns no statuses.
    pub async fn empty_poll(&self) {
        self.answer_if_child().await;
        let exec = (self.factory)();
        let st = exec
            .poll(&[])
            .await
            .unwrap_or_else(|e| panic!("conformance `empty_poll`: {e}"));
        assert!(
            st.is_empty(),
            "conformance `empty_poll`: poll(&[]) must return no statuses; observed {st:?}"
        );
    }

    /// An empty argv is refused with a non-retryable `InvalidSpec`.
    pub async fn invalid_spec_rejected(&self) {
        self.answer_if_child().await;
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
        self.answer_if_child().await;
        let exec = (self.factory)();
        let spec = self.spec("true", CommandSpec::new("true"));
        let h = self.submit(&*exec, "completes", &spec).await;
        let st = self.wait(&*exec, "completes", &[h]).await;
        assert_eq!(
            (&st[0].state, st[0].exit_code),
            (&JobState::Completed, Some(0)),
            "conformance `completes`: `true` must end Completed with exit code 0; observed {:?}",
            st[0]
        );
    }

    /// `sh -c 'exit 3'` ends `Failed` with exit code 3.
    pub async fn fails_with_exit_code(&self) {
        self.answer_if_child().await;
        let exec = (self.factory)();
        let spec = self.spec("exit3", Self::exit(3));
        let h = self.submit(&*exec, "fails_with_exit_code", &spec).await;
        let st = self.wait(&*exec, "fails_with_exit_code", &[h]).await;
        assert_eq!(
            (&st[0].state, st[0].exit_code),
            (&JobState::Failed, Some(3)),
            "conformance `fails_with_exit_code`: `sh -c 'exit 3'` must end Failed with exit code \
             3; observed {:?}",
            st[0]
        );
    }

    /// Four jobs polled in one call come back in order with their own outcomes.
    pub async fn poll_many_in_order(&self) {
        self.answer_if_child().await;
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
                "conformance `poll_many_in_order`: `exit {c}` must end {want} with exit code \
                 {c}, in the order of the handles polled together; observed {s:?}"
            );
        }
    }

    /// A long job is cancelled: `cancel` returns, the job ends `Cancelled`, a second cancel is
    /// fine.
    pub async fn cancel_running(&self) {
        self.answer_if_child().await;
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
            "conformance `cancel_running`: a cancelled `sleep 300` must end Cancelled; observed \
             {:?}",
            st[0]
        );
        exec.cancel(&h)
            .await
            .unwrap_or_else(|e| panic!("conformance `cancel_running`: second cancel failed: {e}"));
    }

    /// Cancelling a finished job succeeds and leaves it `Completed`.
    pub async fn cancel_finished_is_noop(&self) {
        self.answer_if_child().await;
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
            "conformance `cancel_finished_is_noop`: cancelling a finished job must leave it \
             Completed; observed {:?}",
            st[0]
        );
    }

    /// A handle serialized to JSON and read back is polled to its end by a fresh executor.
    pub async fn reattach_after_restart(&self) {
        self.answer_if_child().await;
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
            "conformance `reattach_after_restart`: a fresh executor polling a handle read back \
             from JSON must see `exit 4` end Failed with exit code 4; observed {:?}",
            st[0]
        );
    }

    /// A fresh executor finds the job of a submitted attempt id; an unknown id finds nothing.
    pub async fn find_recovers_handle(&self) {
        self.answer_if_child().await;
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
            "conformance `find_recovers_handle`: a fresh executor's find must return the job \
             submitted (attempt id, job id, array task); it found another"
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
        self.answer_if_child().await;
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
        assert_eq!(
            handles.len(),
            3,
            "conformance `array_tasks`: an array of 3 must give 3 handles"
        );
        for (i, h) in handles.iter().enumerate() {
            let want = array
                .template
                .attempt_id
                .array_task(i as u32)
                .expect("short id");
            assert_eq!(
                h.attempt_id, want,
                "conformance `array_tasks`: handle {i} must carry the attempt id of task {i}"
            );
        }
        let st = self.wait(&*exec, "array_tasks", &handles).await;
        for s in &st {
            assert_eq!(
                (&s.state, s.exit_code),
                (&JobState::Completed, Some(0)),
                "conformance `array_tasks`: each task must see its index in {ARRAY_INDEX_ENV} \
                 (the command exits 0 only then); observed {s:?}"
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
            "conformance `array_tasks`: find of task 1's attempt id must return task 1"
        );
    }

    /// A handle of another executor kind is refused by `poll` with `ForeignHandle`.
    pub async fn foreign_handle_refused(&self) {
        self.answer_if_child().await;
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
        self.answer_if_child().await;
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
        self.answer_if_child().await;
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
        self.answer_if_child().await;
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
        self.answer_if_child().await;
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
        self.answer_if_child().await;
        let check = "find_from_separate_process";
        let exec = (self.factory)();
        let spec = self.spec("childfind", CommandSpec::new("true"));
        let submitted = self.submit(&*exec, check, &spec).await;
        let json = self
            .in_child(
                check,
                CHILD_FIND_ENV,
                spec.attempt_id.as_str(),
                CHILD_FOUND_PREFIX,
            )
            .await;
        let found: Option<JobHandle> = serde_json::from_str(&json)
            .unwrap_or_else(|e| panic!("conformance `{check}`: bad child output {json:?}: {e}"));
        let found = found.unwrap_or_else(|| {
            panic!(
                "conformance `{check}`: a separate process found no job for {} (is the \
                 executor's state only in memory? does the factory reach the same backing state \
                 in the child, e.g. through conformance::scratch_dir()?)",
                spec.attempt_id
            )
        });
        assert_eq!(
            (&found.attempt_id, &found.job_id),
            (&submitted.attempt_id, &submitted.job_id),
            "conformance `{check}`: find in a separate process must return the job submitted \
             here (attempt id, job id); it found another"
        );
        self.wait(&*exec, check, &[found]).await;
    }

    /// A job that ended here (`sh -c 'exit 5'`: `Failed`, exit code 5) polls as the same
    /// terminal state from a separate process (a restarted controller holding the handle it
    /// journaled): its status must outlive the process that submitted it, never `Lost`.
    pub async fn poll_from_separate_process(&self) {
        self.answer_if_child().await;
        let check = "poll_from_separate_process";
        let exec = (self.factory)();
        let spec = self.spec("childpoll", Self::exit(5));
        let h = self.submit(&*exec, check, &spec).await;
        let here = self.wait(&*exec, check, std::slice::from_ref(&h)).await;
        assert_eq!(
            (&here[0].state, here[0].exit_code),
            (&JobState::Failed, Some(5)),
            "conformance `{check}`: `sh -c 'exit 5'` must end Failed with exit code 5 here \
             first; observed {:?}",
            here[0]
        );
        let handle = serde_json::to_string(&h)
            .unwrap_or_else(|e| panic!("conformance `{check}`: the handle must serialize: {e}"));
        let json = self
            .in_child(check, CHILD_POLL_ENV, &handle, CHILD_POLLED_PREFIX)
            .await;
        let there: JobStatus = serde_json::from_str(&json)
            .unwrap_or_else(|e| panic!("conformance `{check}`: bad child output {json:?}: {e}"));
        assert!(
            there.state != JobState::Lost,
            "conformance `{check}`: a job that ended Failed (exit 5) polls as Lost from a \
             separate process: its status must outlive the process that submitted it (is it \
             kept only in memory?); observed {there:?}"
        );
        assert_eq!(
            (&there.state, there.exit_code),
            (&JobState::Failed, Some(5)),
            "conformance `{check}`: a separate process must poll the same terminal state and \
             exit code as this one; observed {there:?}"
        );
    }
}

/// This binary, for the restarted process.
fn current_exe(check: &str) -> PathBuf {
    std::env::current_exe()
        .unwrap_or_else(|e| panic!("conformance `{check}`: cannot find this binary to re-run: {e}"))
}
