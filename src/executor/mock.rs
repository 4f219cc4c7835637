//! [`MockExecutor`]: scripted outcomes over a virtual clock, recording every call.
//!
//! For testing controller logic fast and exactly: nothing runs, each attempt follows a
//! [`MockScript`] (states at offsets from its submission on a [`MockClock`], exit code, log
//! text, submit errors), and [`MockExecutor::calls`] lists every submit, poll, cancel and find.
//!
//! ```
//! use std::time::Duration;
//! use puzzletron::executor::*;
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let mock = MockExecutor::new();
//! let id = AttemptId::new("train.a1")?;
//! mock.script(&id, MockScript::fails_after(Duration::from_secs(60), 3).with_log("boom\n"));
//! let h = mock.submit(&AttemptSpec::new(id.clone(), CommandSpec::new("train"))).await?;
//! mock.clock().advance(Duration::from_secs(30));
//! assert_eq!(mock.poll(&[h.clone()]).await?[0].state, JobState::Running);
//! mock.clock().advance(Duration::from_secs(30));
//! let s = &mock.poll(&[h]).await?[0];
//! assert_eq!((s.state.clone(), s.exit_code), (JobState::Failed, Some(3)));
//! assert_eq!(mock.submit_count(&id), 1);
//! # Ok::<(), ExecutorError>(())
//! # }).unwrap();
//! ```

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use super::{
    AttemptId, AttemptSpec, Executor, ExecutorError, JobHandle, JobState, JobStatus, check_kind,
};

/// A virtual clock shared by a [`MockExecutor`] and the test driving it. Time only moves when
/// the test calls [`advance`](MockClock::advance) / [`set`](MockClock::set) (or through
/// [`MockExecutor::with_auto_advance`]). Cloning shares the clock.
#[derive(Debug, Clone, Default)]
pub struct MockClock(Arc<AtomicU64>);

impl MockClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Current virtual time since the clock's zero.
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::SeqCst))
    }

    /// Moves time forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }

    /// Sets the time (it may go backwards; tests own the clock).
    pub fn set(&self, to: Duration) {
        self.0.store(to.as_nanos() as u64, Ordering::SeqCst);
    }
}

/// A scripted submit failure (the `i`-th submit call of an attempt fails with the `i`-th entry).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MockSubmitError {
    /// The scheduler could not be reached; no job was created. Retryable.
    Unavailable(String),
    /// The call failed ambiguously **but the job was created** (C04 in `docs/evidence.md`): the
    /// error is [`ExecutorError::SubmitUnknown`], and [`Executor::find`] finds the job.
    Ambiguous(String),
    /// Submit limit reached; no job created ([`ExecutorError::SubmitThrottled`]).
    Throttled(String),
    /// Rejected for good; no job created ([`ExecutorError::SubmitRejected`]).
    Rejected(String),
    /// The SSH host key of this host changed or is unknown (issue 27, P07); no job created
    /// ([`ExecutorError::HostKeyRefused`] naming the host, as the bare-metal executor
    /// reports it).
    HostKeyRefused(String),
}

/// What one attempt does in a [`MockExecutor`]: a timeline of states at offsets from its
/// submission, its exit code/signal, log text, and submit failures.
///
/// Before the first timeline entry the job is `Pending`. A cancel makes it
/// `Cancelled { by_uid: None }` at the current virtual time unless it is already terminal.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct MockScript {
    /// `(offset from submit, state)`, sorted by offset.
    pub timeline: Vec<(Duration, JobState)>,
    /// Exit code reported once the state is terminal (`Completed` defaults to 0).
    pub exit_code: Option<i32>,
    /// Signal reported once the state is terminal (`Killed` defaults to its signal).
    pub signal: Option<i32>,
    /// Reason reported with every status.
    pub reason: Option<String>,
    /// Restart count reported.
    pub restarts: u32,
    /// Text written to the spec's `log_path` (if any) at submit, and readable through
    /// [`MockExecutor::log_text`].
    pub log_text: String,
    /// Failures of the first submit calls of this attempt, in order.
    pub submit_errors: Vec<MockSubmitError>,
    /// Nodes reported once it runs (Slurm notation, e.g. `n2`), if any.
    pub nodes: Option<String>,
    /// The job ends before its payload starts: no start mark is written even by a mock
    /// [`with_start_marks`](MockExecutor::with_start_marks).
    pub no_start_mark: bool,
}

impl MockScript {
    /// An empty script: pending forever (until cancelled).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `state` at `offset` after submission.
    pub fn at(mut self, offset: Duration, state: JobState) -> Self {
        self.timeline.push((offset, state));
        self.timeline.sort_by_key(|(d, _)| *d);
        self
    }

    /// Running at once, `Completed` with exit 0 after `d`.
    pub fn completes_after(d: Duration) -> Self {
        Self::new()
            .at(Duration::ZERO, JobState::Running)
            .at(d, JobState::Completed)
            .with_exit_code(0)
    }

    /// `Completed` with exit 0 at once.
    pub fn completes() -> Self {
        Self::completes_after(Duration::ZERO)
    }

    /// Running at once, `Failed` with `code` after `d`.
    pub fn fails_after(d: Duration, code: i32) -> Self {
        Self::new()
            .at(Duration::ZERO, JobState::Running)
            .at(d, JobState::Failed)
            .with_exit_code(code)
    }

    /// Running at once, then `state` (any terminal state) after `d`.
    pub fn ends_after(d: Duration, state: JobState) -> Self {
        Self::new()
            .at(Duration::ZERO, JobState::Running)
            .at(d, state)
    }

    /// Running at once and forever (until cancelled).
    pub fn runs_forever() -> Self {
        Self::new().at(Duration::ZERO, JobState::Running)
    }

    /// Sets the exit code.
    pub fn with_exit_code(mut self, code: i32) -> Self {
        self.exit_code = Some(code);
        self
    }

    /// Sets the signal.
    pub fn with_signal(mut self, signal: i32) -> Self {
        self.signal = Some(signal);
        self
    }

    /// Sets the reason.
    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// Sets the restart count.
    pub fn with_restarts(mut self, restarts: u32) -> Self {
        self.restarts = restarts;
        self
    }

    /// Sets the log text.
    pub fn with_log(mut self, text: impl Into<String>) -> Self {
        self.log_text = text.into();
        self
    }

    /// Sets the nodes reported once the job runs.
    pub fn with_nodes(mut self, nodes: impl Into<String>) -> Self {
        self.nodes = Some(nodes.into());
        self
    }

    /// The job never reaches its payload (a node whose setup fails): a mock
    /// [`with_start_marks`](MockExecutor::with_start_marks) writes no start mark for it.
    pub fn before_start(mut self) -> Self {
        self.no_start_mark = true;
        self
    }

    /// Appends a submit failure (the n-th call fails with the n-th added error).
    pub fn with_submit_error(mut self, err: MockSubmitError) -> Self {
        self.submit_errors.push(err);
        self
    }
}

/// One recorded call to a [`MockExecutor`], with the virtual time it happened at.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MockCall {
    /// A submit; `job_id` is `Some` when a job was created (also for an ambiguous error).
    Submit {
        /// Virtual time.
        at: Duration,
        /// The attempt.
        attempt_id: AttemptId,
        /// The job created, if any.
        job_id: Option<String>,
        /// The error returned, if any (its `Display`).
        error: Option<String>,
    },
    /// A poll of `handles` handles (ids are not recorded to keep 100k-job simulations lean).
    Poll {
        /// Virtual time.
        at: Duration,
        /// Number of handles polled.
        handles: usize,
        /// Whether the poll was failed on purpose ([`MockExecutor::fail_polls`]).
        failed: bool,
    },
    /// A cancel.
    Cancel {
        /// Virtual time.
        at: Duration,
        /// The attempt.
        attempt_id: AttemptId,
    },
    /// A find.
    Find {
        /// Virtual time.
        at: Duration,
        /// The attempt looked up.
        attempt_id: AttemptId,
        /// Whether a job was found.
        found: bool,
    },
}

type DefaultScript = Box<dyn Fn(&AttemptSpec) -> MockScript + Send + Sync>;

struct MockJob {
    handle: JobHandle,
    script: MockScript,
    submitted_at: Duration,
    cancelled_at: Option<Duration>,
    log_path: Option<PathBuf>,
}

#[derive(Default)]
struct Inner {
    scripts: HashMap<AttemptId, MockScript>,
    default_script: Option<DefaultScript>,
    jobs: HashMap<String, MockJob>,
    by_attempt: HashMap<AttemptId, String>,
    submit_calls: HashMap<AttemptId, u32>,
    calls: Vec<MockCall>,
    poll_failures: VecDeque<String>,
    next_id: u64,
}

/// An [`Executor`] that runs nothing: every attempt follows its [`MockScript`] on a virtual
/// [`MockClock`]. Cloning shares state (so a "restarted" controller can be handed a clone and
/// re-attach). Attempts without a script use the default script
/// ([`with_default_script`](MockExecutor::with_default_script); else [`MockScript::completes`]).
///
/// Kind: `mock`. Job ids: `mock-1`, `mock-2`, ... Submitting an attempt id that already has a
/// job is refused with [`ExecutorError::DuplicateAttempt`].
#[derive(Clone, Default)]
pub struct MockExecutor {
    inner: Arc<Mutex<Inner>>,
    clock: MockClock,
    auto_advance: Option<Duration>,
    start_marks: bool,
}

impl std::fmt::Debug for MockExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("MockExecutor")
            .field("now", &self.clock.now())
            .field("jobs", &inner.jobs.len())
            .field("calls", &inner.calls.len())
            .finish()
    }
}

impl MockExecutor {
    /// A mock with its own clock at zero, no scripts, every attempt completing at once.
    pub fn new() -> Self {
        Self::default()
    }

    /// A mock on the given (shared) clock.
    pub fn with_clock(clock: MockClock) -> Self {
        Self {
            clock,
            ..Self::default()
        }
    }

    /// Jobs write their start mark like the Slurm executor's do: at submit, the attempt id goes
    /// to the file named by the spec's [`START_FILE_ENV`](crate::executor::START_FILE_ENV)
    /// (if set), unless the script is [`before_start`](MockScript::before_start); and
    /// [`writes_start_mark`](Executor::writes_start_mark) is `true`.
    pub fn with_start_marks(mut self) -> Self {
        self.start_marks = true;
        self
    }

    /// Every poll first advances the clock by `step` (handy when the code under test sleeps in
    /// real time and polls until done).
    pub fn with_auto_advance(mut self, step: Duration) -> Self {
        self.auto_advance = Some(step);
        self
    }

    /// The script of attempts that have none of their own.
    pub fn with_default_script(
        self,
        f: impl Fn(&AttemptSpec) -> MockScript + Send + Sync + 'static,
    ) -> Self {
        self.lock().default_script = Some(Box::new(f));
        self
    }

    /// The virtual clock (a shared clone).
    pub fn clock(&self) -> MockClock {
        self.clock.clone()
    }

    /// Sets the script of `attempt_id` (before it is submitted).
    pub fn script(&self, attempt_id: &AttemptId, script: MockScript) {
        self.lock().scripts.insert(attempt_id.clone(), script);
    }

    /// The next `n` polls fail with [`ExecutorError::SchedulerUnavailable`] carrying `message`.
    pub fn fail_polls(&self, n: usize, message: &str) {
        let mut inner = self.lock();
        for _ in 0..n {
            inner.poll_failures.push_back(message.to_string());
        }
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<MockCall> {
        self.lock().calls.clone()
    }

    /// Forgets the recorded calls (not the jobs).
    pub fn clear_calls(&self) {
        self.lock().calls.clear();
    }

    /// How many times `submit` was called for `attempt_id` (failed calls included).
    pub fn submit_count(&self, attempt_id: &AttemptId) -> u32 {
        self.lock()
            .submit_calls
            .get(attempt_id)
            .copied()
            .unwrap_or(0)
    }

    /// How many jobs exist (successful or ambiguous submits).
    pub fn job_count(&self) -> usize {
        self.lock().jobs.len()
    }

    /// The attempts that were cancelled, in call order.
    pub fn cancelled(&self) -> Vec<AttemptId> {
        self.lock()
            .calls
            .iter()
            .filter_map(|c| match c {
                MockCall::Cancel { attempt_id, .. } => Some(attempt_id.clone()),
                _ => None,
            })
            .collect()
    }

    /// The scripted log text of the job of `attempt_id`, if it was submitted.
    pub fn log_text(&self, attempt_id: &AttemptId) -> Option<String> {
        let inner = self.lock();
        let job_id = inner.by_attempt.get(attempt_id)?;
        Some(inner.jobs.get(job_id)?.script.log_text.clone())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave Inner half-updated in a way that matters
        // to a test double; keep going rather than poisoning every later call.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn status_of(job: &MockJob, now: Duration) -> JobStatus {
        let age = now.saturating_sub(job.submitted_at);
        let mut state = job
            .script
            .timeline
            .iter()
            .take_while(|(d, _)| *d <= age)
            .last()
            .map(|(_, s)| s.clone())
            .unwrap_or(JobState::Pending);
        if let Some(c) = job.cancelled_at {
            // Cancelled unless the script had already finished by the cancel time.
            let at_cancel = c.saturating_sub(job.submitted_at);
            let done_before = job
                .script
                .timeline
                .iter()
                .take_while(|(d, _)| *d <= at_cancel)
                .last()
                .is_some_and(|(_, s)| s.is_terminal());
            if !done_before {
                state = JobState::Cancelled { by_uid: None };
            }
        }
        let mut st = JobStatus::new(job.handle.attempt_id.clone(), state.clone())
            .with_restarts(job.script.restarts);
        st.reason = job.script.reason.clone();
        st.log_path = job.log_path.clone();
        if state != JobState::Pending {
            st.nodes = job.script.nodes.clone();
        }
        if state.is_terminal() {
            st.exit_code = job
                .script
                .exit_code
                .or((state == JobState::Completed).then_some(0));
            st.signal = match state {
                JobState::Killed { signal } => Some(job.script.signal.unwrap_or(signal)),
                _ => job.script.signal,
            };
        }
        st
    }
}

#[async_trait]
impl Executor for MockExecutor {
    fn kind(&self) -> &str {
        "mock"
    }

    fn writes_start_mark(&self) -> bool {
        self.start_marks
    }

    async fn submit(&self, spec: &AttemptSpec) -> Result<JobHandle, ExecutorError> {
        spec.validate()?;
        let now = self.clock.now();
        let mut inner = self.lock();
        let inner = &mut *inner;
        let id = spec.attempt_id.clone();
        let n = {
            let c = inner.submit_calls.entry(id.clone()).or_insert(0);
            *c += 1;
            *c
        };
        if let Some(job_id) = inner.by_attempt.get(&id) {
            let err = ExecutorError::DuplicateAttempt {
                attempt_id: id.clone(),
                job_id: job_id.clone(),
            };
            inner.calls.push(MockCall::Submit {
                at: now,
                attempt_id: id,
                job_id: None,
                error: Some(err.to_string()),
            });
            return Err(err);
        }
        let script = match inner.scripts.get(&id) {
            Some(s) => s.clone(),
            None => match &inner.default_script {
                Some(f) => f(spec),
                None => MockScript::completes(),
            },
        };
        let scripted_err = script.submit_errors.get(n as usize - 1).cloned();
        let creates_job = matches!(scripted_err, None | Some(MockSubmitError::Ambiguous(_)));
        let mut job_id = None;
        if creates_job {
            inner.next_id += 1;
            let jid = format!("mock-{}", inner.next_id);
            if let Some(path) = &spec.log_path
                && let Err(e) = std::fs::write(path, &script.log_text)
            {
                return Err(ExecutorError::io("writing mock log", path, e));
            }
            if self.start_marks
                && !script.no_start_mark
                && let Some(path) = spec.command.env.get(super::START_FILE_ENV)
                && let Err(e) = std::fs::write(path, format!("{id}\n"))
            {
                return Err(ExecutorError::io("writing mock start mark", path, e));
            }
            let handle = JobHandle::new("mock", id.clone(), jid.clone(), super::now_ms());
            inner.jobs.insert(
                jid.clone(),
                MockJob {
                    handle,
                    script,
                    submitted_at: now,
                    cancelled_at: None,
                    log_path: spec.log_path.clone(),
                },
            );
            inner.by_attempt.insert(id.clone(), jid.clone());
            job_id = Some(jid);
        }
        let result = match scripted_err {
            None => Ok(inner.jobs[job_id.as_ref().expect("job created")]
                .handle
                .clone()),
            Some(MockSubmitError::Unavailable(m)) => Err(ExecutorError::SchedulerUnavailable {
                command: "mock submit".into(),
                tries: 1,
                message: m,
            }),
            Some(MockSubmitError::Ambiguous(m)) => Err(ExecutorError::SubmitUnknown {
                attempt_id: id.clone(),
                tries: 1,
                message: m,
            }),
            Some(MockSubmitError::Throttled(m)) => Err(ExecutorError::SubmitThrottled {
                attempt_id: id.clone(),
                message: m,
            }),
            Some(MockSubmitError::Rejected(m)) => Err(ExecutorError::SubmitRejected {
                attempt_id: id.clone(),
                message: m,
            }),
            Some(MockSubmitError::HostKeyRefused(host)) => Err(ExecutorError::HostKeyRefused {
                problem: format!(
                    "host key refused: the host key of {host} changed or is unknown (mock): it \
                     is never accepted automatically; check the host, then update known_hosts \
                     (ssh-keygen -R {host})"
                ),
                host,
            }),
        };
        inner.calls.push(MockCall::Submit {
            at: now,
            attempt_id: id,
            job_id,
            error: result.as_ref().err().map(|e| e.to_string()),
        });
        result
    }

    async fn poll(&self, handles: &[JobHandle]) -> Result<Vec<JobStatus>, ExecutorError> {
        for h in handles {
            check_kind("mock", h)?;
        }
        if let Some(step) = self.auto_advance {
            self.clock.advance(step);
        }
        let now = self.clock.now();
        let mut inner = self.lock();
        if let Some(message) = inner.poll_failures.pop_front() {
            inner.calls.push(MockCall::Poll {
                at: now,
                handles: handles.len(),
                failed: true,
            });
            return Err(ExecutorError::SchedulerUnavailable {
                command: "mock poll".into(),
                tries: 1,
                message,
            });
        }
        inner.calls.push(MockCall::Poll {
            at: now,
            handles: handles.len(),
            failed: false,
        });
        Ok(handles
            .iter()
            .map(|h| match inner.jobs.get(&h.job_id) {
                Some(job) => Self::status_of(job, now),
                None => JobStatus::new(h.attempt_id.clone(), JobState::Lost)
                    .with_reason(format!("mock has no job {}", h.job_id)),
            })
            .collect())
    }

    async fn cancel(&self, handle: &JobHandle) -> Result<(), ExecutorError> {
        check_kind("mock", handle)?;
        let now = self.clock.now();
        let mut inner = self.lock();
        inner.calls.push(MockCall::Cancel {
            at: now,
            attempt_id: handle.attempt_id.clone(),
        });
        if let Some(job) = inner.jobs.get_mut(&handle.job_id)
            && job.cancelled_at.is_none()
        {
            job.cancelled_at = Some(now);
        }
        Ok(())
    }

    async fn find(&self, attempt_id: &AttemptId) -> Result<Option<JobHandle>, ExecutorError> {
        let now = self.clock.now();
        let mut inner = self.lock();
        let found = inner
            .by_attempt
            .get(attempt_id)
            .and_then(|j| inner.jobs.get(j))
            .map(|j| j.handle.clone());
        inner.calls.push(MockCall::Find {
            at: now,
            attempt_id: attempt_id.clone(),
            found: found.is_some(),
        });
        Ok(found)
    }
}
