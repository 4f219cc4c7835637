//! `ShellExecutor`: a user's own [`Executor`], small but real. Each attempt runs under a `sh`
//! wrapper started in the background (re-parented to init, so it outlives this process), in a
//! folder of its own under the executor's root: `pid` (the wrapper), `exit` (the job's exit
//! code, written when it ends), `walltime` and `cancelled` (markers). Everything a poll needs
//! is in those files, so a restarted process re-attaches to its jobs: it passes puzzletron's
//! conformance suite (`tests/example_executor.rs`), restarted-process checks included.
//!
//! Simplifications a production executor would not make: the walltime is coreutils `timeout`
//! (a job that itself exits 124 reads as timed out), and a wrapper killed with SIGKILL leaves
//! its attempt `Running` (the local executor checks the pid and its start time).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use puzzletron::executor::{
    ATTEMPT_ID_ENV, AttemptId, AttemptSpec, Executor, ExecutorError, JobHandle, JobState, JobStatus,
};

/// The executor's kind, in every handle it makes.
pub const KIND: &str = "shell";

/// Records the wrapper's pid, runs the job (`"$@"`), forwards a TERM to it, and records its
/// exit code; each file written whole (temporary name, then `mv`).
const WRAPPER: &str = r#"D="$1"; shift
unset PT_WRAPPER PT_LOG
echo $$ > "$D/pid.tmp" && mv "$D/pid.tmp" "$D/pid"
"$@" &
job=$!
trap 'kill -TERM $job 2>/dev/null' TERM
wait $job; code=$?
while kill -0 $job 2>/dev/null; do wait $job; code=$?; done
echo $code > "$D/exit.tmp" && mv "$D/exit.tmp" "$D/exit""#;

/// Runs attempts as background `sh` wrappers, one folder per attempt under `root`.
pub struct ShellExecutor {
    root: PathBuf,
}

impl ShellExecutor {
    /// An executor keeping its attempt folders under `root` (made when missing).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn dir(&self, id: &AttemptId) -> PathBuf {
        self.root.join(id.as_str())
    }

    fn check(&self, h: &JobHandle) -> Result<(), ExecutorError> {
        if h.executor == KIND {
            return Ok(());
        }
        Err(ExecutorError::ForeignHandle {
            expected: KIND.into(),
            found: h.executor.clone(),
            attempt_id: h.attempt_id.clone(),
        })
    }

    fn status(&self, h: &JobHandle) -> JobStatus {
        let dir = self.dir(&h.attempt_id);
        let id = h.attempt_id.clone();
        let log = read(&dir.join("log")).map(PathBuf::from);
        let with_log = |s: JobStatus| match &log {
            Some(l) => s.with_log_path(l),
            None => s,
        };
        if !dir.is_dir() {
            return JobStatus::new(id, JobState::Lost).with_reason("no attempt folder");
        }
        let Some(code) = read(&dir.join("exit")).and_then(|c| c.parse::<i32>().ok()) else {
            let state = if dir.join("pid").exists() {
                JobState::Running
            } else {
                JobState::Pending
            };
            return with_log(JobStatus::new(id, state));
        };
        let state = if dir.join("cancelled").exists() {
            JobState::Cancelled { by_uid: None }
        } else if code == 124 && dir.join("walltime").exists() {
            JobState::Timeout
        } else if code == 0 {
            JobState::Completed
        } else {
            JobState::Failed
        };
        with_log(JobStatus::new(id, state).with_exit_code(code))
    }
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

fn io(action: &str, path: &Path, source: std::io::Error) -> ExecutorError {
    ExecutorError::Io {
        action: action.into(),
        path: path.to_path_buf(),
        source,
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[async_trait::async_trait]
impl Executor for ShellExecutor {
    fn kind(&self) -> &str {
        KIND
    }

    async fn submit(&self, spec: &AttemptSpec) -> Result<JobHandle, ExecutorError> {
        spec.validate()?;
        let dir = self.dir(&spec.attempt_id);
        std::fs::create_dir_all(&self.root).map_err(|e| io("making", &self.root, e))?;
        std::fs::create_dir(&dir).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => ExecutorError::DuplicateAttempt {
                attempt_id: spec.attempt_id.clone(),
                job_id: spec.attempt_id.to_string(),
            },
            _ => io("making attempt folder", &dir, e),
        })?;
        let log = spec.log_path.clone().unwrap_or_else(|| dir.join("output"));
        std::fs::write(dir.join("log"), log.display().to_string())
            .map_err(|e| io("writing", &dir.join("log"), e))?;
        let mut argv = spec.command.effective_argv();
        if let Some(w) = spec.walltime {
            std::fs::write(dir.join("walltime"), w.as_secs().to_string())
                .map_err(|e| io("writing", &dir.join("walltime"), e))?;
            let secs = w.as_secs().max(1).to_string();
            argv.splice(0..0, ["timeout".into(), "-s".into(), "TERM".into(), secs]);
        }
        // The launcher starts the wrapper in the background and returns: the wrapper is then
        // init's child, not ours, so it outlives this process and nobody needs to reap it.
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c")
            .arg(r#"sh -c "$PT_WRAPPER" wrapper "$@" > "$PT_LOG" 2>&1 < /dev/null &"#)
            .arg("launch")
            .arg(&dir)
            .args(&argv)
            .envs(&spec.command.env)
            .env(ATTEMPT_ID_ENV, spec.attempt_id.as_str())
            .env("PT_WRAPPER", WRAPPER)
            .env("PT_LOG", &log);
        if let Some(cwd) = &spec.command.cwd {
            cmd.current_dir(cwd);
        }
        let status = cmd.status().map_err(|e| ExecutorError::Spawn {
            program: "sh".into(),
            source: e,
        })?;
        if !status.success() {
            return Err(ExecutorError::SubmitRejected {
                attempt_id: spec.attempt_id.clone(),
                message: format!("the launcher exited {status}"),
            });
        }
        Ok(JobHandle::new(
            KIND,
            spec.attempt_id.clone(),
            spec.attempt_id.as_str(),
            now_ms(),
        ))
    }

    async fn poll(&self, handles: &[JobHandle]) -> Result<Vec<JobStatus>, ExecutorError> {
        handles
            .iter()
            .map(|h| {
                self.check(h)?;
                Ok(self.status(h))
            })
            .collect()
    }

    async fn cancel(&self, h: &JobHandle) -> Result<(), ExecutorError> {
        self.check(h)?;
        let dir = self.dir(&h.attempt_id);
        if self.status(h).state.is_terminal() {
            return Ok(());
        }
        std::fs::write(dir.join("cancelled"), b"")
            .map_err(|e| io("writing", &dir.join("cancelled"), e))?;
        // The wrapper may not have written its pid yet.
        for _ in 0..1000 {
            let state = self.status(h).state;
            if state.is_terminal() {
                return Ok(());
            }
            if let Some(pid) = read(&dir.join("pid")) {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &pid])
                    .status();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(ExecutorError::CancelUnconfirmed {
            attempt_id: h.attempt_id.clone(),
            job_id: h.job_id.clone(),
            state: self.status(h).state.to_string(),
        })
    }

    async fn find(&self, id: &AttemptId) -> Result<Option<JobHandle>, ExecutorError> {
        Ok(self
            .dir(id)
            .is_dir()
            .then(|| JobHandle::new(KIND, id.clone(), id.as_str(), now_ms())))
    }
}
