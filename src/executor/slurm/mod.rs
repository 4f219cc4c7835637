//! `SlurmExecutor`: attempts as Slurm batch jobs (feature `slurm`, on by default: it needs
//! no extra dependency, only Slurm's own `sbatch`/`squeue`/`sacct`/`scancel` at run time).
//!
//! A polite client:
//! - **Submit**: the spec is rendered as a batch script ([`script`]: every value quoted, job
//!   name = attempt id), written next to the logs, and passed to `sbatch --parsable`. Success
//!   is the exit code; the id is read from the last matching stdout line ([`parse`]); stderr of
//!   a successful submit is kept as a warning. Transient failures are retried with backoff and
//!   jitter, and **before every retry the job is looked up by name**, so an sbatch that failed
//!   after the controller had accepted the job never yields a second job (C04).
//! - **Poll**: one cycle asks `squeue` once (`-t all`, every live job id on the command line)
//!   and `sacct` at most once (only jobs squeue no longer shows as active), whatever the
//!   number of jobs; per cluster when jobs carry one. Cycles are rate-limited: a `poll` sooner
//!   than the current interval answers from the cache, and the interval doubles (up to a
//!   maximum) while nothing changes (not in the cycle right after a submit, nor while a job
//!   that squeue shows finished waits for its `sacct` record). Final states come from `sacct` (squeue forgets finished
//!   jobs within seconds); a job missing from both is `Pending` for a grace period after its
//!   submission, then [`JobState::Lost`].
//! - **Cancel**: `scancel`, then polled until a terminal state is confirmed.
//! - **Arrays**: [`Executor::submit_array`] is one `sbatch --array=0-N[%max]`.
//!
//! [`JobState::Lost`]: crate::executor::JobState::Lost

mod command;
pub(crate) mod parse;
#[cfg(test)]
mod parse_tests;
mod poll;
pub(crate) mod script;
#[cfg(test)]
mod script_tests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{
    ArraySpec, AttemptId, AttemptSpec, Executor, ExecutorError, JobHandle, JobStatus,
    RenderedCommand, RenderedFile, Rendering, check_kind, now_ms,
};
use command::{Counters, Runner};
pub use command::{SchedulerRetry, SlurmStats};
use parse::{ErrorClass, JobRef};
use poll::PollState;

/// How often the scheduler is asked: at least `min_interval` apart, doubling while nothing
/// changes up to `max_interval`, back to `min_interval` after a change or a submit. The cycle
/// right after a submit, and a cycle in which a job that squeue shows finished still has no
/// accounting record, do not double it: both change within seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PollPolicy {
    /// Shortest time between two scheduler queries (a site asking for >= 120 s sets it here).
    pub min_interval: Duration,
    /// Longest time between two scheduler queries while jobs are live.
    pub max_interval: Duration,
    /// How long a job may be missing from both squeue and sacct after its submission (or its
    /// last sighting) before it is reported lost (C14: at least 5 minutes by default).
    pub missing_grace: Duration,
}

impl Default for PollPolicy {
    /// 2 s .. 60 s, 5 minutes grace.
    fn default() -> Self {
        Self {
            min_interval: Duration::from_secs(2),
            max_interval: Duration::from_secs(60),
            missing_grace: Duration::from_secs(300),
        }
    }
}

impl PollPolicy {
    /// Sets the shortest and the longest time between two scheduler queries.
    pub fn with_intervals(mut self, min_interval: Duration, max_interval: Duration) -> Self {
        self.min_interval = min_interval;
        self.max_interval = max_interval;
        self
    }

    /// Sets how long a job may be missing before it is reported lost.
    pub fn with_missing_grace(mut self, missing_grace: Duration) -> Self {
        self.missing_grace = missing_grace;
        self
    }
}

/// Builder of a [`SlurmExecutor`].
#[derive(Debug, Clone)]
pub struct SlurmExecutorBuilder {
    log_dir: PathBuf,
    bin_dir: Option<PathBuf>,
    poll: PollPolicy,
    retry: SchedulerRetry,
    command_timeout: Duration,
    cancel_timeout: Duration,
    max_array_size: Option<u32>,
}

impl SlurmExecutorBuilder {
    /// The cluster's `MaxArraySize` (array indices stay below it; larger arrays are split into
    /// chunks, N01). Default: read once from `scontrol show config`, or Slurm's default 1001
    /// when the line is absent. Set it only to a value at most the cluster's.
    pub fn max_array_size(mut self, n: u32) -> Self {
        self.max_array_size = Some(n.max(1));
        self
    }

    /// Where Slurm binaries are (default: found in `PATH`).
    pub fn bin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.bin_dir = Some(dir.into());
        self
    }

    /// Polling intervals and grace (see [`PollPolicy`]).
    pub fn poll_policy(mut self, poll: PollPolicy) -> Self {
        self.poll = poll;
        self
    }

    /// Retry policy for transient command failures (see [`SchedulerRetry`]).
    pub fn retry_policy(mut self, retry: SchedulerRetry) -> Self {
        self.retry = retry;
        self
    }

    /// Time after which a Slurm command is killed and counted as a transient failure
    /// (default 60 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// How long [`Executor::cancel`] waits for Slurm to confirm the end (default 60 s).
    pub fn cancel_timeout(mut self, timeout: Duration) -> Self {
        self.cancel_timeout = timeout;
        self
    }

    /// Checks the settings and makes the executor (the log folder is created at the first
    /// submit).
    ///
    /// # Errors
    /// [`ExecutorError::Io`] when the log folder's path cannot be resolved;
    /// [`ExecutorError::InvalidSpec`] for a zero retry count or `min_interval > max_interval`.
    pub fn build(self) -> Result<SlurmExecutor, ExecutorError> {
        if self.retry.max_tries == 0 {
            return Err(ExecutorError::InvalidSpec {
                attempt_id: None,
                field: "slurm.retry.max_tries".into(),
                value: "0".into(),
                expected: "at least 1".into(),
            });
        }
        if self.poll.min_interval > self.poll.max_interval {
            return Err(ExecutorError::InvalidSpec {
                attempt_id: None,
                field: "slurm.poll.min_interval".into(),
                value: format!("{:?}", self.poll.min_interval),
                expected: format!("at most max_interval ({:?})", self.poll.max_interval),
            });
        }
        // Made at the first submit: building (for a dry run) creates nothing.
        let log_dir = super::resolve_dir(&self.log_dir)?;
        Ok(SlurmExecutor {
            inner: Arc::new(Inner {
                log_dir,
                poll_policy: self.poll,
                cancel_timeout: self.cancel_timeout,
                runner: Runner {
                    bin_dir: self.bin_dir,
                    timeout: self.command_timeout,
                    retry: self.retry,
                    counters: Counters::default(),
                },
                state: tokio::sync::Mutex::new(PollState::new(self.poll.min_interval)),
                warnings: std::sync::Mutex::new(Vec::new()),
                config: tokio::sync::OnceCell::new(),
                max_array_size: self.max_array_size,
            }),
        })
    }
}

/// Runs attempts as Slurm batch jobs. See the module docs.
///
/// Kind: `slurm`. Handles carry the job id, the array task and the cluster (`-M`).
#[derive(Clone)]
pub struct SlurmExecutor {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SlurmExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlurmExecutor")
            .field("log_dir", &self.inner.log_dir)
            .field("poll", &self.inner.poll_policy)
            .finish()
    }
}

pub(crate) struct Inner {
    log_dir: PathBuf,
    poll_policy: PollPolicy,
    cancel_timeout: Duration,
    runner: Runner,
    state: tokio::sync::Mutex<PollState>,
    warnings: std::sync::Mutex<Vec<String>>,
    /// `scontrol show config` output, asked once (SlurmUser, MaxArraySize).
    config: tokio::sync::OnceCell<String>,
    /// `MaxArraySize` set by the builder (else from the config).
    max_array_size: Option<u32>,
}

impl SlurmExecutor {
    /// A builder; batch scripts and default logs go to `log_dir` (created if missing; on a
    /// cluster it must be on a filesystem the compute nodes see).
    pub fn builder(log_dir: impl Into<PathBuf>) -> SlurmExecutorBuilder {
        SlurmExecutorBuilder {
            log_dir: log_dir.into(),
            bin_dir: None,
            poll: PollPolicy::default(),
            retry: SchedulerRetry::default(),
            command_timeout: Duration::from_secs(60),
            cancel_timeout: Duration::from_secs(60),
            max_array_size: None,
        }
    }

    /// Scheduler calls made so far.
    pub fn stats(&self) -> SlurmStats {
        self.inner.runner.counters.snapshot()
    }

    /// Warnings collected so far (e.g. stderr of successful `sbatch` calls, C03), oldest first.
    pub fn warnings(&self) -> Vec<String> {
        self.inner
            .warnings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The folder of batch scripts and default logs.
    pub fn log_dir(&self) -> &Path {
        &self.inner.log_dir
    }
}

impl Inner {
    /// `scontrol show config` output, asked once per executor.
    async fn config(&self) -> Result<&str, ExecutorError> {
        self.config
            .get_or_try_init(|| async {
                let args = vec!["show".to_string(), "config".into()];
                let out = self.runner.run_retrying("scontrol", &args).await?;
                if out.ok() {
                    Ok(out.stdout)
                } else {
                    Err(ExecutorError::CommandFailed {
                        command: "scontrol show config".into(),
                        exit_code: out.code,
                        stderr: out.message(),
                    })
                }
            })
            .await
            .map(String::as_str)
    }

    /// `MaxArraySize` (N01): the builder's, else from the config, else Slurm's default 1001
    /// when the line is absent. A failed `scontrol` is an error, never a guess: submit and
    /// `find` must split an array the same way.
    async fn max_array_size(&self) -> Result<u32, ExecutorError> {
        if let Some(n) = self.max_array_size {
            return Ok(n);
        }
        Ok(parse::parse_max_array_size(self.config().await?)?
            .unwrap_or(parse::DEFAULT_MAX_ARRAY_SIZE))
    }

    fn warn(&self, w: String) {
        let mut v = self.warnings.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() < 1000 {
            v.push(w);
        }
    }

    /// Where the batch script of job `name` is written.
    fn script_path(&self, name: &AttemptId) -> PathBuf {
        self.log_dir.join(format!("{name}.sbatch"))
    }

    /// `sbatch`'s arguments for the script at `path`.
    fn sbatch_args(path: &Path) -> Vec<String> {
        vec!["--parsable".to_string(), path.display().to_string()]
    }

    /// What [`submit`](Executor::submit) sends for `spec`: the batch script, written to
    /// `<log dir>/<attempt id>.sbatch`, and `sbatch --parsable <that file>`.
    fn render(&self, spec: &AttemptSpec) -> Result<Rendering, ExecutorError> {
        spec.validate()?;
        let template = self.log_template(spec, false);
        let script = script::render(spec, &template, None)?;
        let path = self.script_path(&spec.attempt_id);
        let mut r =
            Rendering::new(spec.attempt_id.clone(), "slurm").with_secrets_of(&spec.command.env);
        let mut argv = vec![self.runner.program("sbatch").display().to_string()];
        argv.extend(Self::sbatch_args(&path));
        r.files.push(RenderedFile {
            path,
            content: script,
        });
        r.commands.push(RenderedCommand {
            host: None,
            argv,
            env: Default::default(),
            cwd: None,
        });
        Ok(r)
    }

    /// Writes the script and submits it, adopting a job that an ambiguous failure left behind.
    async fn sbatch(
        &self,
        spec: &AttemptSpec,
        script: &str,
    ) -> Result<(JobRef, u64), ExecutorError> {
        let id = &spec.attempt_id;
        let path = self.script_path(id);
        // Slurm does not create the output's folder: a job whose log cannot be opened fails
        // without a word.
        for dir in std::iter::once(self.log_dir.as_path())
            .chain(spec.log_path.as_deref().and_then(Path::parent))
        {
            std::fs::create_dir_all(dir)
                .map_err(|e| ExecutorError::io("creating log folder", dir, e))?;
        }
        std::fs::write(&path, script)
            .map_err(|e| ExecutorError::io("writing batch script", &path, e))?;
        let submitted_at = now_ms();
        let args = Self::sbatch_args(&path);
        let mut last = String::new();
        for tries in 1..=self.runner.retry.max_tries {
            let out = self.runner.run_once("sbatch", &args).await?;
            if out.ok() {
                match parse::parse_sbatch(&out.stdout, &out.stderr) {
                    Ok(r) => {
                        if !out.stderr.trim().is_empty() {
                            self.warn(format!("sbatch for {id}: {}", out.stderr.trim()));
                        }
                        return Ok((r, submitted_at));
                    }
                    Err(e) => {
                        // Exit 0 means Slurm took it: find it rather than submit again.
                        return match self.lookup(id, submitted_at).await? {
                            Some(r) => Ok((r, submitted_at)),
                            None => Err(e),
                        };
                    }
                }
            }
            match out.class() {
                ErrorClass::Throttle => {
                    return Err(ExecutorError::SubmitThrottled {
                        attempt_id: id.clone(),
                        message: out.message(),
                    });
                }
                ErrorClass::Transient | ErrorClass::AccountingUnavailable => {
                    last = out.message();
                    // The job may exist although sbatch failed (C04): look before retrying.
                    match self.lookup(id, submitted_at).await {
                        Ok(Some(r)) => {
                            self.warn(format!(
                                "sbatch for {id} failed ({last}) but job {r} exists: adopted"
                            ));
                            return Ok((r, submitted_at));
                        }
                        Ok(None) => {}
                        Err(e) => {
                            return Err(ExecutorError::SubmitUnknown {
                                attempt_id: id.clone(),
                                tries,
                                message: format!("{last}; lookup by name failed: {e}"),
                            });
                        }
                    }
                    if tries < self.runner.retry.max_tries {
                        self.runner
                            .counters
                            .retries
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tokio::time::sleep(self.runner.retry.delay(tries)).await;
                    }
                }
                _ => {
                    return Err(ExecutorError::SubmitRejected {
                        attempt_id: id.clone(),
                        message: out.message(),
                    });
                }
            }
        }
        Err(ExecutorError::SubmitUnknown {
            attempt_id: id.clone(),
            tries: self.runner.retry.max_tries,
            message: last,
        })
    }

    fn log_template(&self, spec: &AttemptSpec, array: bool) -> String {
        match &spec.log_path {
            Some(p) => script::escape_filename_pattern(&p.to_string_lossy()),
            None => {
                let dir = script::escape_filename_pattern(&self.log_dir.to_string_lossy());
                if array {
                    format!("{dir}/{}-%A_%a.out", spec.attempt_id)
                } else {
                    format!("{dir}/{}-%j.out", spec.attempt_id)
                }
            }
        }
    }

    fn make_handle(
        &self,
        id: &AttemptId,
        r: &JobRef,
        task: Option<u32>,
        submitted_at: u64,
        log_template: &str,
    ) -> JobHandle {
        let mut h = JobHandle::new("slurm", id.clone(), r.id.to_string(), submitted_at)
            .with_data("log", script::expand_log_path(log_template, r.id, task));
        if let Some(t) = task {
            h = h.with_array_task(t);
        }
        if let Some(c) = &r.cluster {
            h = h.with_cluster(c);
        }
        h
    }
}

/// The key a handle is cached under.
fn job_key(h: &JobHandle) -> Result<poll::JobKey, ExecutorError> {
    let id = h.job_id.parse::<u64>().map_err(|_| ExecutorError::Parse {
        command: "job handle".into(),
        detail: format!("job_id of attempt {} is not a Slurm job id", h.attempt_id),
        output: h.job_id.clone(),
    })?;
    Ok(poll::JobKey {
        cluster: h.cluster.clone(),
        id,
        task: h.array_task,
    })
}

#[async_trait]
impl Executor for SlurmExecutor {
    fn kind(&self) -> &str {
        "slurm"
    }

    /// One `squeue --me` for the active jobs and their names (name last), one `scancel` for
    /// every matching job id (an array is cancelled whole).
    async fn cancel_matching(
        &self,
        matches: &(dyn for<'s> Fn(&'s str) -> bool + Send + Sync),
    ) -> Result<Vec<String>, ExecutorError> {
        let args: Vec<String> = ["-h", "--me", "-o", "%i|%T|%j"]
            .into_iter()
            .map(String::from)
            .collect();
        let out = self.inner.runner.run_retrying("squeue", &args).await?;
        if !out.ok() {
            return Err(ExecutorError::CommandFailed {
                command: "squeue --me".into(),
                exit_code: out.code,
                stderr: out.message(),
            });
        }
        let mut ids = std::collections::BTreeSet::new();
        let mut names = std::collections::BTreeSet::new();
        for (n, line) in out.stdout.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let f: Vec<&str> = line.splitn(3, '|').collect();
            if f.len() < 3 {
                return Err(ExecutorError::Parse {
                    command: "squeue --me".into(),
                    detail: format!("line {}: expected `id|state|name`", n + 1),
                    output: line.into(),
                });
            }
            if !parse::map_state(f[1]).is_active() || !matches(f[2].trim()) {
                continue;
            }
            let id = match parse::parse_id_field(f[0]).map_err(|e| match e {
                ExecutorError::Parse { detail, .. } => ExecutorError::Parse {
                    command: "squeue --me".into(),
                    detail: format!("line {}: {detail}", n + 1),
                    output: line.into(),
                },
                other => other,
            })? {
                parse::IdField::One { job, .. } => job.id,
                parse::IdField::PendingArray { id, .. } => id,
            };
            ids.insert(id);
            names.insert(f[2].trim().to_string());
        }
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let args: Vec<String> = ids.iter().map(u64::to_string).collect();
        let out = self.inner.runner.run_retrying("scancel", &args).await?;
        if !out.ok() && out.class() != parse::ErrorClass::InvalidJobId {
            return Err(ExecutorError::CommandFailed {
                command: "scancel".into(),
                exit_code: out.code,
                stderr: out.message(),
            });
        }
        Ok(names.into_iter().collect())
    }

    /// From `scontrol show config` (`SlurmUser = slurm(64030)`), asked once per executor.
    async fn scheduler_uid(&self) -> Result<Option<u32>, ExecutorError> {
        parse::parse_slurm_user(self.inner.config().await?)
    }

    /// The batch script writes the start mark after its setup, before the payload.
    fn writes_start_mark(&self) -> bool {
        true
    }

    fn render(&self, spec: &AttemptSpec) -> Result<Rendering, ExecutorError> {
        self.inner.render(spec)
    }

    async fn submit(&self, spec: &AttemptSpec) -> Result<JobHandle, ExecutorError> {
        let inner = &self.inner;
        let rendering = inner.render(spec)?;
        let template = inner.log_template(spec, false);
        let (r, at) = inner.sbatch(spec, &rendering.files[0].content).await?;
        let h = inner.make_handle(&spec.attempt_id, &r, None, at, &template);
        inner
            .state
            .lock()
            .await
            .submitted(&[job_key(&h)?], inner.poll_policy.min_interval);
        Ok(h)
    }

    async fn submit_array(&self, array: &ArraySpec) -> Result<Vec<JobHandle>, ExecutorError> {
        array.validate()?;
        let inner = &self.inner;
        let spec = &array.template;
        let template = inner.log_template(spec, true);
        let cap = inner.max_array_size().await?;
        let chunks = parse::array_chunks(array.size, array.max_concurrent, cap);
        if chunks.len() > 1 {
            inner.warn(format!(
                "array {} of {} tasks is above MaxArraySize={cap}: submitted as {} chunks (throttle {:?} each)",
                spec.attempt_id,
                array.size,
                chunks.len(),
                chunks[0].2
            ));
        }
        let mut handles = Vec::with_capacity(array.size as usize);
        let mut submitted: Vec<String> = Vec::new();
        for (c, &(offset, len, throttle)) in chunks.iter().enumerate() {
            let c = c as u32;
            let name = script::chunk_job_name(&spec.attempt_id, c)?;
            let script = script::render(
                spec,
                &template,
                Some(script::ArrayOpts {
                    size: len,
                    max_concurrent: throttle,
                    chunk: c,
                    offset,
                }),
            )?;
            // The chunk's job is found by its own name if sbatch's answer is lost.
            let mut chunk_spec = spec.clone();
            chunk_spec.attempt_id = name.clone();
            let (r, at) = match inner.sbatch(&chunk_spec, &script).await {
                Ok(x) => x,
                Err(e) if c > 0 => {
                    // Half an array is no array: cancel the chunks already in, say which.
                    for j in &submitted {
                        let _ = inner
                            .runner
                            .run_once("scancel", std::slice::from_ref(j))
                            .await;
                    }
                    return Err(ExecutorError::InvalidSpec {
                        attempt_id: Some(spec.attempt_id.clone()),
                        field: "array.size".into(),
                        value: array.size.to_string(),
                        expected: format!(
                            "chunks that Slurm accepts (MaxArraySize={cap}); chunk {c} (tasks {offset}-{}) was refused: {e}; chunks already submitted, now cancelled: {}",
                            offset + len - 1,
                            submitted.join(", ")
                        ),
                    });
                }
                Err(e) => return Err(e),
            };
            submitted.push(r.id.to_string());
            for i in 0..len {
                let tid = spec.attempt_id.array_task(offset + i)?;
                let mut h = inner.make_handle(&tid, &r, Some(i), at, &template);
                if c > 0 {
                    h = h.with_data("job_name", name.as_str());
                }
                handles.push(h);
            }
        }
        let keys = handles.iter().map(job_key).collect::<Result<Vec<_>, _>>()?;
        inner
            .state
            .lock()
            .await
            .submitted(&keys, inner.poll_policy.min_interval);
        Ok(handles)
    }

    async fn poll(&self, handles: &[JobHandle]) -> Result<Vec<JobStatus>, ExecutorError> {
        for h in handles {
            check_kind("slurm", h)?;
        }
        self.inner.poll_cycle(handles, false).await
    }

    async fn cancel(&self, handle: &JobHandle) -> Result<(), ExecutorError> {
        check_kind("slurm", handle)?;
        self.inner.cancel(handle).await
    }

    async fn find(&self, attempt_id: &AttemptId) -> Result<Option<JobHandle>, ExecutorError> {
        let inner = &self.inner;
        // Jobs older than a week are not looked for (sacct -S bound, C17).
        let since = now_ms().saturating_sub(7 * 24 * 3600 * 1000);
        if let Some(r) = inner.lookup(attempt_id, since).await? {
            let template = inner.log_template(
                &AttemptSpec::new(attempt_id.clone(), super::CommandSpec::new("true")),
                false,
            );
            return Ok(Some(
                inner.make_handle(attempt_id, &r, None, since, &template),
            ));
        }
        if let Some((base, task)) = attempt_id.split_array_task() {
            // The chunk the task was submitted in (N01), split as submit does.
            let cap = inner.max_array_size().await?;
            let (chunk, local) = (task / cap, task % cap);
            let name = script::chunk_job_name(&base, chunk)?;
            if let Some(r) = inner.lookup(&name, since).await? {
                let template = inner.log_template(
                    &AttemptSpec::new(base.clone(), super::CommandSpec::new("true")),
                    true,
                );
                let mut h = inner.make_handle(attempt_id, &r, Some(local), since, &template);
                if chunk > 0 {
                    h = h.with_data("job_name", name.as_str());
                }
                return Ok(Some(h));
            }
        }
        Ok(None)
    }
}

/// Groups keys by cluster, preserving first-seen order.
pub(crate) fn by_cluster<T>(
    items: impl IntoIterator<Item = (Option<String>, T)>,
) -> Vec<(Option<String>, Vec<T>)> {
    let mut order: Vec<Option<String>> = Vec::new();
    let mut map: HashMap<Option<String>, Vec<T>> = HashMap::new();
    for (c, t) in items {
        if !map.contains_key(&c) {
            order.push(c.clone());
        }
        map.entry(c).or_default().push(t);
    }
    order
        .into_iter()
        .map(|c| {
            let v = map.remove(&c).unwrap_or_default();
            (c, v)
        })
        .collect()
}
