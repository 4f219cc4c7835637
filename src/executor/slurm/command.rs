//! Running Slurm's commands: argv only, a timeout, call counters, and retry with exponential
//! backoff and jitter for transient failures.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::AsyncReadExt;

use crate::executor::ExecutorError;

use super::parse::{ErrorClass, classify_error};

/// How transient failures of Slurm commands are retried: try `max_tries` times in all,
/// sleeping `base_delay * 2^(n-1)` (capped at `max_delay`) times a random factor in
/// `[0.5, 1.5)` between tries ("full jitter" variant after AWS's "Exponential Backoff And
/// Jitter", so that many controllers do not retry in lockstep).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchedulerRetry {
    /// Tries in all, at least 1.
    pub max_tries: u32,
    /// Delay after the first failure.
    pub base_delay: Duration,
    /// Upper bound of one delay.
    pub max_delay: Duration,
}

impl Default for SchedulerRetry {
    /// 6 tries, 0.5 s doubling to at most 30 s (about 45 s in all before giving up).
    fn default() -> Self {
        Self {
            max_tries: 6,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl SchedulerRetry {
    /// Sets [`max_tries`](Self::max_tries).
    pub fn with_max_tries(mut self, max_tries: u32) -> Self {
        self.max_tries = max_tries;
        self
    }

    /// Sets [`base_delay`](Self::base_delay).
    pub fn with_base_delay(mut self, base_delay: Duration) -> Self {
        self.base_delay = base_delay;
        self
    }

    /// Sets [`max_delay`](Self::max_delay).
    pub fn with_max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self
    }

    /// The delay before try `n + 1` after `n` failures (n >= 1), jitter included.
    pub fn delay(&self, n: u32) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32 << (n.saturating_sub(1)).min(20));
        exp.min(self.max_delay).mul_f64(0.5 + jitter_unit())
    }
}

/// A uniform random number in [0, 1) from std's randomly keyed hasher (no RNG dependency;
/// jitter needs spread, not cryptographic quality).
fn jitter_unit() -> f64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let h = RandomState::new().hash_one(n);
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Counts of scheduler calls made by one executor (all clones share them).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub sbatch: AtomicU64,
    pub squeue: AtomicU64,
    pub sacct: AtomicU64,
    pub scancel: AtomicU64,
    pub poll_cycles: AtomicU64,
    pub retries: AtomicU64,
}

/// A snapshot of an executor's scheduler calls, for budgets and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SlurmStats {
    /// `sbatch` processes started.
    pub sbatch_calls: u64,
    /// `squeue` processes started.
    pub squeue_calls: u64,
    /// `sacct` processes started.
    pub sacct_calls: u64,
    /// `scancel` processes started.
    pub scancel_calls: u64,
    /// Poll cycles that queried the scheduler (answers from the cache not counted).
    pub poll_cycles: u64,
    /// Calls repeated after a transient failure.
    pub retries: u64,
}

impl Counters {
    pub(super) fn snapshot(&self) -> SlurmStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SlurmStats {
            sbatch_calls: g(&self.sbatch),
            squeue_calls: g(&self.squeue),
            sacct_calls: g(&self.sacct),
            scancel_calls: g(&self.scancel),
            poll_cycles: g(&self.poll_cycles),
            retries: g(&self.retries),
        }
    }
}

/// What a finished command printed.
#[derive(Debug, Clone)]
pub(crate) struct Output {
    /// Exit code; `None` when killed (e.g. by our timeout).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// We killed it after the timeout.
    pub timed_out: bool,
}

impl Output {
    pub(super) fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// The error class of a failed run (a timeout is transient).
    pub(super) fn class(&self) -> ErrorClass {
        if self.timed_out {
            ErrorClass::Transient
        } else {
            classify_error(&self.stderr)
        }
    }

    pub(super) fn message(&self) -> String {
        if self.timed_out {
            format!("timed out; stderr: {}", self.stderr.trim())
        } else {
            let s = self.stderr.trim();
            if s.is_empty() {
                format!("exit code {:?}, no stderr", self.code)
            } else {
                s.to_string()
            }
        }
    }
}

/// Runs Slurm commands.
#[derive(Debug)]
pub(crate) struct Runner {
    pub bin_dir: Option<PathBuf>,
    pub timeout: Duration,
    pub retry: SchedulerRetry,
    pub counters: Counters,
}

impl Runner {
    /// The program run for Slurm command `name`: `<bin dir>/name`, else `name` (from `PATH`).
    pub(super) fn program(&self, name: &str) -> PathBuf {
        match &self.bin_dir {
            Some(d) => d.join(name),
            None => PathBuf::from(name),
        }
    }

    fn count(&self, name: &str) {
        let c = match name {
            "sbatch" => &self.counters.sbatch,
            "squeue" => &self.counters.squeue,
            "sacct" => &self.counters.sacct,
            "scancel" => &self.counters.scancel,
            _ => return,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs `name args...` once, killing it after the timeout.
    ///
    /// # Errors
    /// [`ExecutorError::Spawn`] when the program cannot be started.
    pub(super) async fn run_once(
        &self,
        name: &str,
        args: &[String],
    ) -> Result<Output, ExecutorError> {
        self.count(name);
        let program = self.program(name);
        let mut child = tokio::process::Command::new(&program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| ExecutorError::Spawn {
                program: program.display().to_string(),
                source,
            })?;
        let mut out = child.stdout.take().expect("piped");
        let mut err = child.stderr.take().expect("piped");
        let io = async {
            let (mut o, mut e) = (Vec::new(), Vec::new());
            let _ = tokio::join!(out.read_to_end(&mut o), err.read_to_end(&mut e));
            let status = child.wait().await;
            (o, e, status)
        };
        match tokio::time::timeout(self.timeout, io).await {
            Ok((o, e, status)) => Ok(Output {
                code: status.ok().and_then(|s| s.code()),
                stdout: String::from_utf8_lossy(&o).into_owned(),
                stderr: String::from_utf8_lossy(&e).into_owned(),
                timed_out: false,
            }),
            // Dropping the future drops the child, which kill_on_drop kills.
            Err(_) => Ok(Output {
                code: None,
                stdout: String::new(),
                stderr: String::new(),
                timed_out: true,
            }),
        }
    }

    /// Runs a query (`squeue`, `sacct`, `scancel`), retrying transient failures. Returns the
    /// last output, successful or not, when it is not transient; a transient failure that
    /// outlasts the retries is [`ExecutorError::SchedulerUnavailable`].
    pub(super) async fn run_retrying(
        &self,
        name: &str,
        args: &[String],
    ) -> Result<Output, ExecutorError> {
        let mut tries = 0;
        loop {
            tries += 1;
            let out = self.run_once(name, args).await?;
            // An unreachable slurmdbd is retried like a busy controller, except for sacct, the
            // accounting client itself: its callers go on from squeue alone (N02) rather than
            // wait here.
            let retry = match out.class() {
                ErrorClass::Transient => true,
                ErrorClass::AccountingUnavailable => name != "sacct",
                _ => false,
            };
            if out.ok() || !retry {
                return Ok(out);
            }
            if tries >= self.retry.max_tries {
                return Err(ExecutorError::SchedulerUnavailable {
                    command: format!("{name} {}", args.first().map(String::as_str).unwrap_or("")),
                    tries,
                    message: out.message(),
                });
            }
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
            let delay = self.retry.delay(tries);
            tracing::warn!(
                command = name,
                tries,
                delay_ms = delay.as_millis() as u64,
                error = %out.message(),
                "transient scheduler error: retrying"
            );
            tokio::time::sleep(delay).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_cap() {
        let p = SchedulerRetry {
            max_tries: 10,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        };
        for n in 1..12 {
            let d = p.delay(n);
            let nominal =
                Duration::from_millis(100 * (1 << (n - 1).min(20))).min(Duration::from_secs(1));
            assert!(
                d >= nominal.mul_f64(0.5) && d < nominal.mul_f64(1.5),
                "{n}: {d:?}"
            );
        }
        let ds: std::collections::BTreeSet<_> = (0..20).map(|_| p.delay(3)).collect();
        assert!(ds.len() > 10, "jitter must spread delays: {ds:?}");
    }
}
