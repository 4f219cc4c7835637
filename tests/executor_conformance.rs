//! The conformance suite against the built-in executors (feature `test-util`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use puzzletron::executor::{
    ATTEMPT_ID_ENV, AttemptId, AttemptSpec, Executor, ExecutorError, JobHandle, JobState,
    JobStatus, LocalExecutor, MockExecutor, conformance,
};

#[tokio::test]
async fn mock_executor_conforms() {
    let mock = MockExecutor::new()
        .with_default_script(conformance::mock_script)
        .with_auto_advance(Duration::from_secs(1));
    conformance::Conformance::new(move || Box::new(mock.clone()))
        .with_poll_interval(Duration::from_millis(1))
        // The mock's jobs live in memory by design: it cannot be re-attached from a process.
        .in_memory_only()
        .run_all()
        .await;
}

/// An executor that reports every job `Completed` without running it: the suite must catch it.
struct LiesCompleted;

#[async_trait::async_trait]
impl puzzletron::executor::Executor for LiesCompleted {
    fn kind(&self) -> &str {
        "lies"
    }
    async fn submit(
        &self,
        spec: &puzzletron::executor::AttemptSpec,
    ) -> Result<puzzletron::executor::JobHandle, puzzletron::executor::ExecutorError> {
        spec.validate()?;
        Ok(puzzletron::executor::JobHandle::new(
            "lies",
            spec.attempt_id.clone(),
            "1",
            0,
        ))
    }
    async fn poll(
        &self,
        handles: &[puzzletron::executor::JobHandle],
    ) -> Result<Vec<puzzletron::executor::JobStatus>, puzzletron::executor::ExecutorError> {
        Ok(handles
            .iter()
            .map(|h| {
                puzzletron::executor::JobStatus::new(
                    h.attempt_id.clone(),
                    puzzletron::executor::JobState::Completed,
                )
                .with_exit_code(0)
            })
            .collect())
    }
    async fn cancel(
        &self,
        _: &puzzletron::executor::JobHandle,
    ) -> Result<(), puzzletron::executor::ExecutorError> {
        Ok(())
    }
    async fn find(
        &self,
        _: &puzzletron::executor::AttemptId,
    ) -> Result<Option<puzzletron::executor::JobHandle>, puzzletron::executor::ExecutorError> {
        Ok(None)
    }
}

#[tokio::test]
#[should_panic(expected = "conformance `fails_with_exit_code`")]
async fn suite_catches_an_executor_that_never_runs_anything() {
    conformance::run_all(|| Box::new(LiesCompleted)).await;
}

fn local(root: &Path) -> LocalExecutor {
    LocalExecutor::builder(root)
        .max_concurrent(4)
        .kill_grace(Duration::from_secs(2))
        .build()
        .expect("local executor")
}

/// The attempt root a child process of `find_from_separate_process` opens.
const CHILD_ROOT_ENV: &str = "PUZZLETRON_CONFORMANCE_TEST_ROOT";

/// This test binary, re-executed to run only the entry point `test`, over `root`.
fn child(test: &'static str, root: PathBuf) -> impl Fn() -> std::process::Command {
    move || {
        let mut c = std::process::Command::new(std::env::current_exe().expect("test binary"));
        c.args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(CHILD_ROOT_ENV, &root);
        c
    }
}

/// Child entry point: a fresh `LocalExecutor` over the parent's root answers `find` (does
/// nothing in a normal run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_child_entry() {
    if let Ok(root) = std::env::var(CHILD_ROOT_ENV) {
        assert!(conformance::child_main(&local(Path::new(&root))).await);
    }
}

/// The suite as documented: no child entry point, no `--nocapture`. The restarted-process
/// checks re-execute this test, whose factory reaches the same attempt folder through
/// `conformance::scratch_dir()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_executor_conforms() {
    conformance::Conformance::new(|| Box::new(local(&conformance::scratch_dir().join("attempts"))))
        .with_poll_interval(Duration::from_millis(20))
        .with_timeout(Duration::from_secs(30))
        .with_scratch_dir(conformance::scratch_dir())
        .run_all()
        .await;
}

/// The same with a child command of one's own (`with_separate_process` + `child_main`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_executor_conforms_with_its_own_child() {
    let root = tempfile::tempdir().expect("tempdir");
    let path = root.path().to_path_buf();
    let suite = conformance::Conformance::new(move || Box::new(local(&path)))
        .with_poll_interval(Duration::from_millis(20))
        .with_timeout(Duration::from_secs(30))
        .with_separate_process(child("local_child_entry", root.path().to_path_buf()));
    suite.find_from_separate_process().await;
    suite.poll_from_separate_process().await;
}

/// One way an executor breaks a rule of the contract while doing everything else right.
#[derive(Clone, Copy, Debug)]
enum Lie {
    /// Drops the spec's walltime.
    IgnoresWalltime,
    /// Drops the spec's log path (output goes to the executor's default place).
    IgnoresLogPath,
    /// Runs the command without the attempt-id variable.
    HidesAttemptId,
    /// Reports a job it does not know as pending forever instead of Lost.
    UnknownIsPending,
    /// `find` knows only the jobs submitted by this process (state in memory).
    ForgetsOnRestart,
    /// `poll` knows the end of a job only in the process that submitted it; elsewhere a
    /// finished job is `Lost` (status in memory).
    StatusInMemory,
}

/// The environment variable naming the lie of a child of the lying suite.
const CHILD_LIE_ENV: &str = "PUZZLETRON_CONFORMANCE_TEST_LIE";

/// A real `LocalExecutor` with one lie.
struct Lying {
    inner: LocalExecutor,
    lie: Lie,
}

fn submitted_here() -> &'static Mutex<HashSet<AttemptId>> {
    static S: OnceLock<Mutex<HashSet<AttemptId>>> = OnceLock::new();
    S.get_or_init(Default::default)
}

#[async_trait::async_trait]
impl Executor for Lying {
    fn kind(&self) -> &str {
        self.inner.kind()
    }
    async fn submit(&self, spec: &AttemptSpec) -> Result<JobHandle, ExecutorError> {
        let mut spec = spec.clone();
        match self.lie {
            Lie::IgnoresWalltime => spec.walltime = None,
            Lie::IgnoresLogPath => spec.log_path = None,
            Lie::HidesAttemptId => {
                let argv = spec.command.effective_argv();
                spec.command.argv = ["env", "-u", ATTEMPT_ID_ENV]
                    .into_iter()
                    .map(String::from)
                    .chain(argv)
                    .collect();
            }
            Lie::UnknownIsPending | Lie::ForgetsOnRestart | Lie::StatusInMemory => {}
        }
        submitted_here()
            .lock()
            .unwrap()
            .insert(spec.attempt_id.clone());
        self.inner.submit(&spec).await
    }
    async fn poll(&self, handles: &[JobHandle]) -> Result<Vec<JobStatus>, ExecutorError> {
        let mut st = self.inner.poll(handles).await?;
        if let Lie::StatusInMemory = self.lie {
            let here = submitted_here().lock().unwrap();
            for s in &mut st {
                if s.state.is_terminal() && !here.contains(&s.attempt_id) {
                    *s = JobStatus::new(s.attempt_id.clone(), JobState::Lost);
                }
            }
        }
        if let Lie::UnknownIsPending = self.lie {
            for s in &mut st {
                if s.state == JobState::Lost {
                    *s = JobStatus::new(s.attempt_id.clone(), JobState::Pending);
                }
            }
        }
        Ok(st)
    }
    async fn cancel(&self, handle: &JobHandle) -> Result<(), ExecutorError> {
        self.inner.cancel(handle).await
    }
    async fn find(&self, id: &AttemptId) -> Result<Option<JobHandle>, ExecutorError> {
        if let Lie::ForgetsOnRestart = self.lie
            && !submitted_here().lock().unwrap().contains(id)
        {
            return Ok(None);
        }
        self.inner.find(id).await
    }
}

fn lying_suite(root: &Path, lie: Lie) -> conformance::Conformance {
    let path = root.to_path_buf();
    let root_path = root.to_path_buf();
    conformance::Conformance::new(move || {
        Box::new(Lying {
            inner: local(&path),
            lie,
        })
    })
    .with_poll_interval(Duration::from_millis(20))
    .with_timeout(Duration::from_secs(8))
    .with_scratch_dir(root)
    .with_separate_process(move || {
        let mut c = child("lying_child_entry", root_path.clone())();
        c.env(CHILD_LIE_ENV, format!("{lie:?}"));
        c
    })
}

/// Child entry point of the forgetful executor (does nothing in a normal run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lying_child_entry() {
    if let Ok(root) = std::env::var(CHILD_ROOT_ENV) {
        let lie = match std::env::var(CHILD_LIE_ENV).as_deref() {
            Ok("StatusInMemory") => Lie::StatusInMemory,
            _ => Lie::ForgetsOnRestart,
        };
        let e = Lying {
            inner: local(Path::new(&root)),
            lie,
        };
        assert!(conformance::child_main(&e).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "conformance `walltime_honoured`")]
async fn suite_catches_an_executor_that_ignores_walltime() {
    let root = tempfile::tempdir().unwrap();
    lying_suite(root.path(), Lie::IgnoresWalltime)
        .walltime_honoured()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "conformance `log_path_honoured`")]
async fn suite_catches_an_executor_that_ignores_log_path() {
    let root = tempfile::tempdir().unwrap();
    lying_suite(root.path(), Lie::IgnoresLogPath)
        .log_path_honoured()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "conformance `attempt_id_env_set`")]
async fn suite_catches_an_executor_that_hides_the_attempt_id() {
    let root = tempfile::tempdir().unwrap();
    lying_suite(root.path(), Lie::HidesAttemptId)
        .attempt_id_env_set()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "conformance `unknown_handle_is_lost`")]
async fn suite_catches_an_executor_that_keeps_unknown_jobs_pending() {
    let root = tempfile::tempdir().unwrap();
    lying_suite(root.path(), Lie::UnknownIsPending)
        .unknown_handle_is_lost()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(
    expected = "conformance `find_from_separate_process`: a separate process found no job"
)]
async fn suite_catches_an_executor_that_forgets_its_jobs_when_the_process_restarts() {
    let root = tempfile::tempdir().unwrap();
    let suite = lying_suite(root.path(), Lie::ForgetsOnRestart);
    // In one process it passes the old restart checks...
    suite.reattach_after_restart().await;
    suite.find_recovers_handle().await;
    // ...and a separate process finds nothing.
    suite.find_from_separate_process().await;
}

/// A factory over a folder the child cannot find (a new temporary folder in each process):
/// the restarted process sees no job, and the failure says where to look.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "does the factory reach the same backing state in the child")]
async fn a_factory_over_a_folder_of_its_own_fails_with_a_hint() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().to_path_buf();
    conformance::Conformance::new(move || Box::new(local(&path)))
        .with_poll_interval(Duration::from_millis(20))
        .find_from_separate_process()
        .await;
}

/// The executor that forgets the status of finished jobs when the process restarts (their
/// handles still point at real jobs) is caught by the poll from a separate process; `find`
/// alone did not catch it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(
    expected = "conformance `poll_from_separate_process`: a job that ended Failed (exit 5) polls as Lost"
)]
async fn suite_catches_an_executor_whose_job_status_lives_in_memory() {
    let root = tempfile::tempdir().unwrap();
    let suite = lying_suite(root.path(), Lie::StatusInMemory);
    suite.find_from_separate_process().await;
    suite.poll_from_separate_process().await;
}
